/*
 * controller/ksource.c: the pure parts (backoff, resourceVersions, the
 * watch event parser, the cache and the resource set built from it, the
 * version derived from the input), then the whole source against a fake
 * API server run by this test: LIST, WATCH with events, a BOOKMARK, an
 * ERROR 410 that makes it list again, a dropped watch resumed from the last
 * resourceVersion, an invalid object left out with Accepted=False, and the
 * statuses PATCHed back; the Secrets that Certificates name (decoding,
 * the reasons a Secret cannot be used, rotation, deletion, the version).
 * The real server (controller/kapi.c) is exercised
 * by tests/integration/test_kube_source.py.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "../../../controller/ksource.c"

#include "common/tls_testcerts.h"
#include "store.h"

#include <arpa/inet.h>
#include <grpc/grpc.h>
#include <netinet/in.h>
#include <sys/socket.h>

static void test_backoff_and_jitter(void **state)
{
    (void)state;
    uint64_t d = 0, seen[16];
    for (int i = 0; i < 10; i++)
        seen[i] = d = backoff_next(d);
    assert_int_equal(seen[0], 500);
    assert_int_equal(seen[1], 1000);
    assert_int_equal(seen[5], 16000);
    assert_int_equal(seen[6], 30000);
    assert_int_equal(seen[9], 30000);
    unsigned seed = 7;
    int low = 0, high = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t j = jitter(1000, &seed);
        assert_true(j >= 500 && j <= 1000);
        low += j < 600;
        high += j > 900;
    }
    assert_true(low > 50 && high > 50); /* spread, not constant */
}

static void test_rv_number(void **state)
{
    (void)state;
    assert_int_equal(rv_number("12345"), 12345);
    assert_int_equal(rv_number(""), 0);
    assert_int_equal(rv_number(NULL), 0);
    assert_int_equal(rv_number("12a"), 0);
    assert_int_equal(rv_number("99999999999999999999"), 0);
}

static void test_parse_event(void **state)
{
    (void)state;
    kevent_t ev;
    char err[300];
    const char *added = "{\"type\":\"ADDED\",\"object\":{\"kind\":\"Api\",\"metadata\":{\"name\":"
                        "\"a\",\"resourceVersion\":\"17\"}}}";
    assert_int_equal(parse_event(added, strlen(added), &ev, err, sizeof(err)), 0);
    assert_int_equal(ev.type, EV_ADDED);
    assert_string_equal(ev.rv, "17");
    json_decref(ev.object);
    const char *bm =
        "{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{\"resourceVersion\":\"40\"}}}";
    assert_int_equal(parse_event(bm, strlen(bm), &ev, err, sizeof(err)), 0);
    assert_int_equal(ev.type, EV_BOOKMARK);
    assert_string_equal(ev.rv, "40");
    json_decref(ev.object);
    const char *gone = "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"code\":410,"
                       "\"reason\":\"Expired\"}}";
    assert_int_equal(parse_event(gone, strlen(gone), &ev, err, sizeof(err)), 0);
    assert_int_equal(ev.type, EV_ERROR);
    assert_int_equal(ev.code, 410);
    json_decref(ev.object);
    assert_int_equal(parse_event("{nope", 5, &ev, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "not JSON"));
    const char *odd = "{\"type\":\"RENAMED\",\"object\":{}}";
    assert_int_equal(parse_event(odd, strlen(odd), &ev, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "no known type"));
    const char *norv = "{\"type\":\"MODIFIED\",\"object\":{\"metadata\":{\"name\":\"a\"}}}";
    assert_int_equal(parse_event(norv, strlen(norv), &ev, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "resourceVersion"));
}

static json_t *backend(const char *name, const char *rv, int port)
{
    return json_pack("{s:s, s:s, s:{s:s, s:s, s:s, s:[s]}, s:{s:[{s:s, s:i}]}, s:{s:s}}",
                     "apiVersion", SL_API_VERSION, "kind", "Backend", "metadata", "name", name,
                     "namespace", "default", "resourceVersion", rv, "managedFields", "x", "spec",
                     "endpoints", "address", "127.0.0.1", "port", port, "status", "phase", "x");
}

static void test_cache_and_build(void **state)
{
    (void)state;
    kcache_t c;
    cache_init(&c);
    json_t *items = json_pack("[o, o]", backend("a", "5", 80), backend("b", "9", 81));
    assert_int_equal(cache_apply(&c, SL_KIND_BACKEND, EV_SYNC, items), 1);
    assert_false(all_synced(&c));
    /* The same list again: nothing changed. */
    assert_int_equal(cache_apply(&c, SL_KIND_BACKEND, EV_SYNC, items), 0);
    json_decref(items);
    /* Only the resourceVersion and the status move (a status write): no change. */
    json_t *b2 = backend("b", "12", 81);
    json_object_set_new(json_object_get(b2, "status"), "phase", json_string("y"));
    assert_int_equal(cache_apply(&c, SL_KIND_BACKEND, EV_MODIFIED, b2), 0);
    json_decref(b2);
    json_t *b3 = backend("b", "14", 82);
    assert_int_equal(cache_apply(&c, SL_KIND_BACKEND, EV_MODIFIED, b3), 1);
    json_decref(b3);
    /* An invalid one (port out of range) and a deletion at 20. */
    json_t *bad = backend("c", "15", 70000);
    assert_int_equal(cache_apply(&c, SL_KIND_BACKEND, EV_ADDED, bad), 1);
    json_decref(bad);
    json_t *gone = backend("a", "20", 80);
    assert_int_equal(cache_apply(&c, SL_KIND_BACKEND, EV_DELETED, gone), 1);
    assert_int_equal(cache_apply(&c, SL_KIND_BACKEND, EV_DELETED, gone), 0);
    json_decref(gone);
    for (int k = 0; k < SL_KIND__COUNT; k++)
        if (!c.synced[k]) {
            json_t *none = json_array();
            cache_apply(&c, (enum sl_kind)k, EV_SYNC, none);
            json_decref(none);
        }
    assert_true(all_synced(&c));
    /* Listed with a status of its generation written by a controller: the
     * config RV is the one recorded there, not the status write's. */
    json_t *listed = backend("d", "30", 83);
    json_object_set_new(json_object_get(listed, "metadata"), "generation", json_integer(2));
    json_object_set_new(
        listed, "status",
        json_pack("{s:i, s:s}", "observedGeneration", 2, "configResourceVersion", "17"));
    json_t *stale = backend("e", "19", 84); /* status of an older generation: its RV */
    json_object_set_new(json_object_get(stale, "metadata"), "generation", json_integer(3));
    json_object_set_new(
        stale, "status",
        json_pack("{s:i, s:s}", "observedGeneration", 2, "configResourceVersion", "4"));
    assert_int_equal(listed_config_rv(listed), 17);
    assert_int_equal(listed_config_rv(stale), 19);
    json_decref(listed);
    json_decref(stale);
    sl_resource_set_t set;
    sl_resource_set_init(&set);
    json_t *invalid = json_object();
    /* The deletion is the newest input. */
    assert_int_equal(cache_build(&c, &set, NULL, invalid), 20);
    assert_int_equal(set.count, 1);
    assert_string_equal(set.items[0].name, "b");
    assert_string_equal(set.items[0].source, "backends/default/b");
    /* What the server adds is not in the model's document. */
    json_t *meta = json_object_get(set.items[0].obj, "metadata");
    assert_null(json_object_get(meta, "managedFields"));
    assert_null(json_object_get(set.items[0].obj, "status"));
    assert_string_equal(json_string_value(json_object_get(meta, "resourceVersion")), "14");
    json_t *st = json_object_get(invalid, "backends/default/c");
    assert_non_null(st);
    json_t *cond = json_array_get(json_object_get(st, "conditions"), 0);
    assert_string_equal(json_string_value(json_object_get(cond, "status")), "False");
    assert_non_null(strstr(json_string_value(json_object_get(cond, "message")), "port"));
    sl_resource_set_free(&set);
    json_decref(invalid);
    cache_free(&c);
}

/* ---- Secrets named by Certificates ------------------------------------------ */

static char *b64(const char *s)
{
    size_t n = strlen(s);
    char *out = malloc(4 * ((n + 2) / 3) + 1);
    EVP_EncodeBlock((unsigned char *)out, (const unsigned char *)s, (int)n);
    return out;
}

/* A Secret as the API server sends it (cert/key NULL: no such data). */
static json_t *secret(const char *name, const char *rv, const char *type, const char *cert,
                      const char *key)
{
    json_t *data = json_object();
    if (cert) {
        char *c = b64(cert);
        json_object_set_new(data, "tls.crt", json_string(c));
        free(c);
    }
    if (key) {
        char *k = b64(key);
        json_object_set_new(data, "tls.key", json_string(k));
        free(k);
    }
    json_object_set_new(data, "ca.crt", json_string("aWdub3JlZA=="));
    return json_pack("{s:s, s:s, s:{s:s, s:s, s:s}, s:s, s:o}", "apiVersion", "v1", "kind",
                     "Secret", "metadata", "name", name, "namespace", "default", "resourceVersion",
                     rv, "type", type, "data", data);
}

static json_t *cert_doc(const char *name, const char *rv, const char *secret_name)
{
    return json_pack("{s:s, s:s, s:{s:s, s:s, s:s}, s:{s:{s:s}}}", "apiVersion", SL_API_VERSION,
                     "kind", "Certificate", "metadata", "name", name, "namespace", "default",
                     "resourceVersion", rv, "spec", "secretRef", "name", secret_name);
}

/* secret_pem on a Secret object (through secret_slim): 0, or -1 with the
 * reason and message. */
static int pem_of(json_t *sec, char *msg, size_t msglen, const char **reason)
{
    json_t *slim = secret_slim(sec);
    char *chain = NULL, *key = NULL;
    size_t cl, kl;
    int rc = secret_pem(slim, "default/web", &chain, &cl, &key, &kl, reason, msg, msglen);
    if (rc == 0) {
        assert_int_equal(strlen(chain), cl);
        assert_non_null(strstr(chain, "BEGIN CERTIFICATE"));
        assert_non_null(strstr(key, "PRIVATE KEY"));
    }
    free(chain);
    free(key);
    json_decref(slim);
    json_decref(sec);
    return rc;
}

static void test_secret_pem(void **state)
{
    (void)state;
    tc_pair_t a, b;
    tc_make(&a, TC_EC256, "a.example", "a.example", -3600, 86400, NULL, false);
    tc_make(&b, TC_EC256, "b.example", "b.example", -3600, 86400, NULL, false);
    char msg[1024];
    const char *reason;
    assert_int_equal(pem_of(secret("web", "5", "kubernetes.io/tls", a.cert_pem, a.key_pem), msg,
                            sizeof(msg), &reason),
                     0);
    /* Only tls.crt, tls.key, the type and the resourceVersion are kept. */
    json_t *s = secret("web", "5", "kubernetes.io/tls", a.cert_pem, a.key_pem);
    json_t *slim = secret_slim(s);
    assert_int_equal(json_object_size(json_object_get(slim, "data")), 2);
    assert_string_equal(json_string_value(json_object_get(slim, "resourceVersion")), "5");
    json_decref(slim);
    json_decref(s);

    struct {
        json_t *sec;
        const char *want[3];
    } bad[] = {
        {secret("web", "5", "Opaque", a.cert_pem, a.key_pem),
         {"Secret default/web has type Opaque", "kubernetes.io/tls", NULL}},
        {secret("web", "5", "kubernetes.io/tls", a.cert_pem, NULL),
         {"Secret default/web has no data tls.key", NULL, NULL}},
        {secret("web", "5", "kubernetes.io/tls", NULL, a.key_pem), {"no data tls.crt", NULL, NULL}},
        /* The key of another certificate: tls_pem.c's check, at tls.key. */
        {secret("web", "5", "kubernetes.io/tls", a.cert_pem, b.key_pem),
         {"Secret default/web: data tls.key: ", NULL, NULL}},
        /* A key where the chain belongs. */
        {secret("web", "5", "kubernetes.io/tls", a.key_pem, a.key_pem),
         {"data tls.crt: ", NULL, NULL}},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        msg[0] = '\0';
        assert_int_equal(pem_of(bad[i].sec, msg, sizeof(msg), &reason), -1);
        assert_string_equal(reason, "InvalidSecret");
        for (int w = 0; w < 3 && bad[i].want[w]; w++)
            if (!strstr(msg, bad[i].want[w]))
                fail_msg("case %zu: \"%s\" not in \"%s\"", i, bad[i].want[w], msg);
        /* Never a byte of the key. */
        assert_null(strstr(msg, "PRIVATE KEY"));
        assert_null(strstr(msg, a.key_pem + 28));
    }
    /* Bad base64, and an empty value. */
    json_t *s64 = secret("web", "5", "kubernetes.io/tls", a.cert_pem, a.key_pem);
    json_object_set_new(json_object_get(s64, "data"), "tls.key", json_string("no*base64"));
    assert_int_equal(pem_of(s64, msg, sizeof(msg), &reason), -1);
    assert_string_equal(msg, "Secret default/web: data tls.key is not valid base64");
    s64 = secret("web", "5", "kubernetes.io/tls", a.cert_pem, a.key_pem);
    json_object_set_new(json_object_get(s64, "data"), "tls.crt", json_string(""));
    assert_int_equal(pem_of(s64, msg, sizeof(msg), &reason), -1);
    assert_non_null(strstr(msg, "has empty data tls.crt"));
    /* A NUL inside. */
    s64 = secret("web", "5", "kubernetes.io/tls", a.cert_pem, a.key_pem);
    json_object_set_new(json_object_get(s64, "data"), "tls.crt", json_string("AAAA"));
    assert_int_equal(pem_of(s64, msg, sizeof(msg), &reason), -1);
    assert_non_null(strstr(msg, "data tls.crt is not PEM text"));
    tc_free(&a);
    tc_free(&b);
}

static void test_secrets_in_the_cache(void **state)
{
    (void)state;
    tc_pair_t a, a2;
    tc_make(&a, TC_EC256, "a.example", "a.example", -3600, 86400, NULL, false);
    tc_make(&a2, TC_EC256, "a.example", "a.example", -3600, 86400, NULL, false);
    kcache_t c;
    cache_init(&c);
    for (int k = 0; k < SL_KIND__COUNT; k++) {
        json_t *none = json_array();
        cache_apply(&c, (enum sl_kind)k, EV_SYNC, none);
        json_decref(none);
    }
    json_t *cert = cert_doc("web", "10", "web-tls");
    assert_int_equal(cache_apply(&c, SL_KIND_CERTIFICATE, EV_ADDED, cert), 1);
    json_decref(cert);
    /* Named: wanted, not settled until listed (or failing). */
    json_t *wanted = secrets_wanted(&c);
    assert_non_null(json_object_get(wanted, "default/web-tls"));
    assert_int_equal(json_object_size(wanted), 1);
    json_decref(wanted);
    json_object_set_new(c.secrets, "default/web-tls",
                        json_pack("{s:i, s:s, s:n}", "wid", 7, "state", "listing", "obj"));
    assert_false(secrets_settled(&c));

    sl_resource_set_t set, view;
    json_t *invalid = json_object();
    /* Listed, not there: SecretNotFound, the Certificate left out. */
    json_t *none = json_array();
    assert_int_equal(secret_apply(&c, "default/web-tls", 6, EV_SYNC, none), 0); /* old watcher */
    assert_int_equal(secret_apply(&c, "default/web-tls", 7, EV_SYNC, none), 1);
    json_decref(none);
    assert_true(secrets_settled(&c));
    sl_resource_set_init(&set);
    assert_int_equal(cache_build(&c, &set, NULL, invalid), 10);
    assert_int_equal(set.count, 0);
    json_t *cond = json_array_get(
        json_object_get(json_object_get(invalid, "certificates/default/web"), "conditions"), 0);
    assert_string_equal(json_string_value(json_object_get(cond, "reason")), "SecretNotFound");
    assert_non_null(strstr(json_string_value(json_object_get(cond, "message")),
                           "Secret default/web-tls not found"));
    sl_resource_set_free(&set);

    /* Created at 12: the compiled Certificate holds its PEM inline, the view
     * the Certificate as written; the version is the Secret's. */
    json_t *s = secret("web-tls", "12", "kubernetes.io/tls", a.cert_pem, a.key_pem);
    assert_int_equal(secret_apply(&c, "default/web-tls", 7, EV_ADDED, s), 1);
    assert_int_equal(secret_apply(&c, "default/web-tls", 7, EV_MODIFIED, s), 0); /* same */
    json_decref(s);
    /* Another Secret's event (never sent by a fieldSelector watch): ignored. */
    json_t *other = secret("other", "13", "kubernetes.io/tls", a2.cert_pem, a2.key_pem);
    assert_int_equal(secret_apply(&c, "default/web-tls", 7, EV_MODIFIED, other), 0);
    json_decref(other);
    sl_resource_set_init(&set);
    sl_resource_set_init(&view);
    assert_int_equal(cache_build(&c, &set, &view, invalid), 12);
    assert_int_equal(json_object_size(invalid), 0);
    assert_int_equal(set.count, 1);
    json_t *spec = json_object_get(set.items[0].obj, "spec");
    assert_string_equal(json_string_value(json_object_get(spec, "certificate")), a.cert_pem);
    assert_string_equal(json_string_value(json_object_get(spec, "privateKey")), a.key_pem);
    assert_null(json_object_get(spec, "secretRef"));
    assert_int_equal(view.count, 1);
    assert_non_null(json_object_get(json_object_get(view.items[0].obj, "spec"), "secretRef"));
    assert_null(json_object_get(json_object_get(view.items[0].obj, "spec"), "privateKey"));
    sl_resource_set_free(&set);
    sl_resource_set_free(&view);

    /* Rotated at 15: the new PEM, version 15. */
    s = secret("web-tls", "15", "kubernetes.io/tls", a2.cert_pem, a2.key_pem);
    assert_int_equal(secret_apply(&c, "default/web-tls", 7, EV_MODIFIED, s), 1);
    json_decref(s);
    sl_resource_set_init(&set);
    assert_int_equal(cache_build(&c, &set, NULL, invalid), 15);
    assert_string_equal(json_string_value(json_object_get(json_object_get(set.items[0].obj, "spec"),
                                                          "certificate")),
                        a2.cert_pem);
    sl_resource_set_free(&set);

    /* Deleted at 20: not found again, the deletion is the version. */
    s = secret("web-tls", "20", "kubernetes.io/tls", a2.cert_pem, a2.key_pem);
    assert_int_equal(secret_apply(&c, "default/web-tls", 7, EV_DELETED, s), 1);
    json_decref(s);
    sl_resource_set_init(&set);
    assert_int_equal(cache_build(&c, &set, NULL, invalid), 20);
    assert_int_equal(set.count, 0);
    assert_non_null(json_object_get(invalid, "certificates/default/web"));
    sl_resource_set_free(&set);

    /* A list failure (RBAC) of a Secret never listed: SecretUnreadable. */
    json_object_set_new(c.secrets, "default/web-tls",
                        json_pack("{s:i, s:s, s:n}", "wid", 8, "state", "listing", "obj"));
    json_t *why = json_string("list ...: HTTP 403: forbidden");
    assert_int_equal(secret_apply(&c, "default/web-tls", 8, EV_ERROR, why), 1);
    assert_int_equal(secret_apply(&c, "default/web-tls", 8, EV_ERROR, why), 0);
    json_decref(why);
    assert_true(secrets_settled(&c));
    sl_resource_set_init(&set);
    cache_build(&c, &set, NULL, invalid);
    cond = json_array_get(
        json_object_get(json_object_get(invalid, "certificates/default/web"), "conditions"), 0);
    assert_string_equal(json_string_value(json_object_get(cond, "reason")), "SecretUnreadable");
    assert_non_null(strstr(json_string_value(json_object_get(cond, "message")), "HTTP 403"));
    sl_resource_set_free(&set);

    /* --namespace edge: a Secret elsewhere is neither watched nor used. */
    c.only_ns = "edge";
    wanted = secrets_wanted(&c);
    assert_int_equal(json_object_size(wanted), 0);
    json_decref(wanted);
    sl_resource_set_init(&set);
    cache_build(&c, &set, NULL, invalid);
    cond = json_array_get(
        json_object_get(json_object_get(invalid, "certificates/default/web"), "conditions"), 0);
    assert_string_equal(json_string_value(json_object_get(cond, "reason")), "RefNotPermitted");
    sl_resource_set_free(&set);

    json_decref(invalid);
    cache_free(&c);
    tc_free(&a);
    tc_free(&a2);
}

/* ---- a fake API server ---------------------------------------------------- */

static struct {
    int listen_fd, port;
    pthread_t thread;
    pthread_mutex_t lock;
    char log[32768]; /* request lines, then "PATCH ... body" */
    int api_lists, api_watches, backend_watches;
    atomic_int quit;
} fk;

static void fk_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&fk.lock);
    size_t l = strlen(fk.log);
    vsnprintf(fk.log + l, sizeof(fk.log) - l, fmt, ap);
    pthread_mutex_unlock(&fk.lock);
    va_end(ap);
}

static void send_str(int fd, const char *s)
{
    ssize_t w = write(fd, s, strlen(s));
    (void)w;
}

static void send_chunk(int fd, const char *s)
{
    char head[32];
    snprintf(head, sizeof(head), "%zx\r\n", strlen(s));
    send_str(fd, head);
    send_str(fd, s);
    send_str(fd, "\r\n");
}

static void reply_json(int fd, int status, const char *body)
{
    char head[256];
    snprintf(head, sizeof(head),
             "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
             status, strlen(body));
    send_str(fd, head);
    send_str(fd, body);
}

#define BACKEND_ECHO                                                                               \
    "{\"apiVersion\":\"gateway.sluice.dev/v1alpha1\",\"kind\":\"Backend\",\"metadata\":{"          \
    "\"name\":\"echo\",\"namespace\":\"default\",\"resourceVersion\":\"3\"},\"spec\":{"            \
    "\"endpoints\":[{\"address\":\"127.0.0.1\",\"port\":9001}]}}"
#define API_PET                                                                                    \
    "{\"apiVersion\":\"gateway.sluice.dev/v1alpha1\",\"kind\":\"Api\",\"metadata\":{\"name\":"     \
    "\"pet\",\"namespace\":\"default\",\"resourceVersion\":\"5\",\"generation\":1},\"spec\":{"     \
    "\"basePath\":\"/pet\",\"backendRefs\":[{\"name\":\"echo\"}],\"operations\":[{\"method\":"     \
    "\"GET\",\"path\":\"/p\"}]}}"
#define API_BAD                                                                                    \
    "{\"apiVersion\":\"gateway.sluice.dev/v1alpha1\",\"kind\":\"Api\",\"metadata\":{\"name\":"     \
    "\"bad\",\"namespace\":\"default\",\"resourceVersion\":\"11\",\"generation\":2},\"spec\":{"    \
    "\"basePath\":\"/bad\",\"bogus\":1}}"

/* Waits until the client closes (a watch kept open). */
static void hold(int fd)
{
    char b[256];
    while (!atomic_load(&fk.quit)) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) > 0 && read(fd, b, sizeof(b)) <= 0)
            return;
    }
}

static void *fk_conn(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char buf[8192];
    size_t have = 0;
    for (;;) {
        char *end = have ? memmem(buf, have, "\r\n\r\n", 4) : NULL;
        if (!end) {
            ssize_t r = read(fd, buf + have, sizeof(buf) - have - 1);
            if (r <= 0)
                break;
            have += (size_t)r;
            buf[have] = '\0';
            continue;
        }
        size_t hl = (size_t)(end - buf) + 4, clen = 0;
        char *cl = strcasestr(buf, "content-length:");
        if (cl && cl < end)
            clen = strtoul(cl + 15, NULL, 10);
        while (have < hl + clen) {
            ssize_t r = read(fd, buf + have, sizeof(buf) - have - 1);
            if (r <= 0)
                goto out;
            have += (size_t)r;
        }
        buf[have] = '\0';
        char method[16], target[1024];
        sscanf(buf, "%15s %1023s", method, target);
        int auth = strstr(buf, "Authorization: Bearer t0k\r\n") != NULL;
        fk_log("%s %s%s\n", method, target, auth ? "" : " NOAUTH");
        if (strcmp(method, "PATCH") == 0) {
            fk_log("  %.*s\n", (int)clen, buf + hl);
            reply_json(fd, 200, "{}");
        } else if (strstr(target, "watch=true") == NULL) {
            /* LIST */
            char body[4096];
            if (strstr(target, "v1alpha1/backends"))
                snprintf(body, sizeof(body),
                         "{\"kind\":\"BackendList\",\"metadata\":{\"resourceVersion\":\"10\"},"
                         "\"items\":[" BACKEND_ECHO "]}");
            else if (strstr(target, "v1alpha1/apis")) {
                int n = ++fk.api_lists;
                if (n == 1)
                    snprintf(body, sizeof(body),
                             "{\"kind\":\"ApiList\",\"metadata\":{\"resourceVersion\":\"10\"},"
                             "\"items\":[" API_PET "]}");
                else
                    snprintf(body, sizeof(body),
                             "{\"kind\":\"ApiList\",\"metadata\":{\"resourceVersion\":\"30\"},"
                             "\"items\":[" API_PET "," API_BAD "]}");
            } else
                snprintf(body, sizeof(body),
                         "{\"kind\":\"List\",\"metadata\":{\"resourceVersion\":\"10\"},"
                         "\"items\":[]}");
            reply_json(fd, 200, body);
        } else {
            send_str(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n");
            if (strstr(target, "v1alpha1/apis?") && ++fk.api_watches == 1) {
                send_chunk(fd, "{\"type\":\"ADDED\",\"object\":" API_BAD "}\n");
                send_chunk(fd, "{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"Api\",\"metadata\":"
                               "{\"resourceVersion\":\"15\"}}}\n");
                send_chunk(fd, "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"code\":410,"
                               "\"reason\":\"Expired\",\"message\":\"too old\"}}\n");
                send_str(fd, "0\r\n\r\n");
                have = 0;
                continue;
            }
            if (strstr(target, "v1alpha1/backends?") && ++fk.backend_watches == 1) {
                /* An event split over two chunks, then the connection drops. */
                send_chunk(fd, "{\"type\":\"MODIFIED\",\"object\":{\"apiVersion\":"
                               "\"gateway.sluice.dev/v1alpha1\",\"kind\":\"Backend\",");
                send_chunk(fd, "\"metadata\":{\"name\":\"echo\",\"namespace\":\"default\","
                               "\"resourceVersion\":\"12\"},\"spec\":{\"endpoints\":[{"
                               "\"address\":\"127.0.0.1\",\"port\":9002}]}}}\n");
                break;
            }
            hold(fd);
            break;
        }
        memmove(buf, buf + hl + clen, have - hl - clen);
        have -= hl + clen;
    }
out:
    close(fd);
    return NULL;
}

static void *fk_main(void *arg)
{
    (void)arg;
    for (;;) {
        int fd = accept(fk.listen_fd, NULL, NULL);
        if (fd < 0)
            return NULL;
        pthread_t t;
        pthread_create(&t, NULL, fk_conn, (void *)(intptr_t)fd);
        pthread_detach(t);
    }
}

static void fk_start(void)
{
    memset(&fk, 0, sizeof(fk));
    pthread_mutex_init(&fk.lock, NULL);
    fk.listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fk.listen_fd, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t al = sizeof(a);
    getsockname(fk.listen_fd, (struct sockaddr *)&a, &al);
    fk.port = ntohs(a.sin_port);
    assert_int_equal(listen(fk.listen_fd, 16), 0);
    pthread_create(&fk.thread, NULL, fk_main, NULL);
}

static void fk_stop(void)
{
    atomic_store(&fk.quit, 1);
    shutdown(fk.listen_fd, SHUT_RDWR);
    close(fk.listen_fd);
    pthread_join(fk.thread, NULL);
    usleep(200000); /* connection threads see quit */
}

static int log_has(const char *s)
{
    pthread_mutex_lock(&fk.lock);
    int r = strstr(fk.log, s) != NULL;
    pthread_mutex_unlock(&fk.lock);
    return r;
}

static void run_until(struct event_base *base, int (*cond)(void *), void *arg, int max_ms)
{
    for (int waited = 0; waited < max_ms && !cond(arg); waited += 20) {
        struct timeval tv = {0, 20000};
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
    }
}

static int settled(void *arg)
{
    sl_ksource_t *ks = arg;
    return ks->set.count == 2 && log_has("resourceVersion=30") &&
           log_has("backends?watch=true&resourceVersion=12") && log_has("/apis/bad/status") &&
           log_has("/apis/pet/status") && log_has("/backends/echo/status");
}

static void test_source_against_a_fake_server(void **state)
{
    (void)state;
    fk_start();
    char dir[] = "/tmp/sl-ksource-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char err[512];
    sl_store_t *st = sl_store_open(dir, err, sizeof(err));
    assert_non_null(st);
    struct event_base *base = event_base_new();
    sl_controller_t *ctl = sl_controller_new(base, st, NULL);
    sl_kubeconfig_t kc;
    memset(&kc, 0, sizeof(kc));
    pthread_mutex_init(&kc.lock, NULL);
    assert_int_equal(asprintf(&kc.server, "http://127.0.0.1:%d", fk.port) > 0, 1);
    kc.token = strdup("t0k");
    sl_ksource_t *ks = sl_ksource_start(base, ctl, &kc, NULL, err, sizeof(err));
    assert_non_null(ks);
    char why[256];
    assert_int_equal(sl_ksource_ready(ks, why, sizeof(why)), 0);
    assert_non_null(strstr(why, "not listed yet"));
    run_until(base, settled, ks, 8000);
    if (!settled(ks))
        fail_msg("not settled; requests:\n%s", fk.log);
    assert_int_equal(sl_ksource_ready(ks, why, sizeof(why)), 1);
    /* Every request carried the token; the 410 made a second list; the
     * dropped watch resumed from the event it had delivered. */
    assert_false(log_has("NOAUTH"));
    assert_int_equal(fk.api_lists, 2);
    assert_true(log_has("/apis?watch=true&resourceVersion=10&allowWatchBookmarks=true"));
    assert_false(log_has("/apis?watch=true&resourceVersion=15")); /* 410: listed, not resumed */
    /* The set: echo (modified to port 9002 by the watch) and pet; bad is out. */
    json_t *echo = NULL;
    for (size_t i = 0; i < ks->set.count; i++)
        if (strcmp(ks->set.items[i].name, "echo") == 0)
            echo = ks->set.items[i].obj;
    assert_non_null(echo);
    assert_int_equal(
        json_integer_value(json_object_get(
            json_array_get(json_object_get(json_object_get(echo, "spec"), "endpoints"), 0),
            "port")),
        9002);
    /* The status of each, PATCHed as a merge patch. */
    assert_true(log_has("\"reason\":\"Invalid\""));
    assert_true(log_has("spec.bogus"));
    assert_true(log_has("\"reason\":\"Accepted\""));
    /* The version is the input's newest resourceVersion (bad's 11; echo's 12). */
    json_t *status = sl_controller_status_json(ctl);
    assert_int_equal(json_integer_value(json_object_get(status, "config_version")), 12);
    json_decref(status);
    sl_ksource_stop(ks);
    sl_controller_free(ctl);
    event_base_free(base);
    sl_store_close(st);
    fk_stop();
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    grpc_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backoff_and_jitter),
        cmocka_unit_test(test_rv_number),
        cmocka_unit_test(test_parse_event),
        cmocka_unit_test(test_cache_and_build),
        cmocka_unit_test(test_secret_pem),
        cmocka_unit_test(test_secrets_in_the_cache),
        cmocka_unit_test(test_source_against_a_fake_server),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    grpc_shutdown();
    return rc;
}
