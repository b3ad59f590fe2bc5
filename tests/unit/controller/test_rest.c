/*
 * Unit tests of the REST admin API (controller/rest.c): a real evhttp server
 * on 127.0.0.1:0 on a real event_base, a real store in a temporary directory,
 * and real HTTP/1.1 requests over a socket, driving the event loop while the
 * client sends and reads. Covers every status code the API answers, JSON and
 * YAML bodies, multi-document apply, If-Match and body resourceVersion,
 * bearer auth, read-only mode, and the non-loopback refusal.
 *
 * The controller core is replaced here (and only here) by a test double that
 * records calls, so that the tests can assert that sl_controller_changed is
 * called once per successful write and never on a failed one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "rest.h"
#include "bearer.h"
#include "prom.h"
#include "ctrl_metrics.h"

#include <event2/buffer.h>

#include "common/tls_testcerts.h"

#include <errno.h>
#include <event2/event.h>
#include <poll.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- controller test double ---------------------------------------------- */

struct sl_controller {
    int changed;
    int status_calls;
    int admits;
    int forgets;
    int refuse_admission; /* set by a test: admission answers "limit" */
};

sl_ctrl_metrics_t sl_ctrl_metrics;

void sl_controller_changed(sl_controller_t *ctl)
{
    ctl->changed++;
}

json_t *sl_controller_object_status(sl_controller_t *ctl, enum sl_kind kind, const char *ns,
                                    const char *name)
{
    ctl->status_calls++;
    if (kind == SL_KIND_API && strcmp(ns, "default") == 0 && strcmp(name, "petstore") == 0)
        return json_pack("{s:[{s:s, s:s, s:s}], s:i}", "conditions", "type", "Accepted", "status",
                         "False", "reason", "BackendNotFound", "observedGeneration", 1);
    return NULL;
}

int sl_controller_admit(sl_controller_t *ctl, json_t *objs, char *err, size_t errlen)
{
    ctl->admits++;
    if (ctl->refuse_admission) {
        snprintf(err, errlen, "config would have %zu routes, more than --max-routes 0",
                 json_array_size(objs));
        return -1;
    }
    return 0;
}

void sl_controller_forget(sl_controller_t *ctl, enum sl_kind kind, const char *ns, const char *name)
{
    (void)kind;
    (void)ns;
    (void)name;
    ctl->forgets++;
}

json_t *sl_controller_runtimes_json(sl_controller_t *ctl)
{
    (void)ctl;
    return json_pack("[{s:s, s:s, s:b, s:i}]", "node_id", "rt-1", "fleet", "default", "connected",
                     1, "acked_version", 3);
}

/* A single controller: no replica view. */
json_t *sl_controller_runtimes_view(sl_controller_t *ctl)
{
    (void)ctl;
    return NULL;
}

json_t *sl_controller_status_json(sl_controller_t *ctl)
{
    (void)ctl;
    return json_pack("{s:i, s:{}}", "config_version", 3, "fleets");
}

/* The core's families: a fleet whose name needs escaping, through the
 * label helper the core uses. */
void sl_controller_render_metrics(sl_controller_t *ctl, struct evbuffer *b)
{
    (void)ctl;
    evbuffer_add_printf(b, "# HELP sluice_controller_fleet_runtimes_connected x\n"
                           "# TYPE sluice_controller_fleet_runtimes_connected gauge\n"
                           "sluice_controller_fleet_runtimes_connected{fleet=\"");
    sl_prom_label_value(b, "a\"b\\c\nd");
    evbuffer_add_printf(b, "\"} 2\n");
}

/* ---- fixture -------------------------------------------------------------- */

/* Host header the test client sends. */
static const char *client_host = "127.0.0.1";

typedef struct {
    char dir[256];
    struct event_base *base;
    sl_store_t *st;
    struct sl_controller ctl;
    sl_rest_t *rest;
    int port;
} fixture_t;

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    if (!f)
        return -1;
    snprintf(f->dir, sizeof(f->dir), "/tmp/sl-test-rest-XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    char err[512];
    f->st = sl_store_open(f->dir, err, sizeof(err));
    f->base = event_base_new();
    if (!f->st || !f->base) {
        fprintf(stderr, "setup: %s\n", err);
        return -1;
    }
    f->rest = sl_rest_start(f->base, "127.0.0.1:0", f->st, &f->ctl, NULL, err, sizeof(err));
    if (!f->rest) {
        fprintf(stderr, "setup: %s\n", err);
        return -1;
    }
    f->port = sl_rest_port(f->rest);
    memset(&sl_ctrl_metrics, 0, sizeof(sl_ctrl_metrics));
    client_host = "127.0.0.1";
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    sl_rest_free(f->rest);
    sl_store_close(f->st);
    event_base_free(f->base);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", f->dir);
    free(f);
    return 0;
}

/* ---- a small HTTP/1.1 client driving the loop ---------------------------- */

typedef struct {
    int status;
    char *raw;        /* whole response, NUL-terminated */
    const char *body; /* into raw */
    json_t *json;     /* parsed body, or NULL */
} resp_t;

static void resp_free(resp_t *r)
{
    free(r->raw);
    json_decref(r->json);
    memset(r, 0, sizeof(*r));
}

/* Sends one request with Connection: close and reads the response to EOF,
 * running the server's event loop in between. extra: header lines, each
 * ending in \r\n, or NULL. body NULL = no body. */
static resp_t request_to(struct event_base *base, int port, const char *method, const char *path,
                         const char *extra, const char *body, size_t body_len)
{
    resp_t r;
    memset(&r, 0, sizeof(r));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);

    char head[4096];
    int hl;
    if (body)
        hl = snprintf(head, sizeof(head),
                      "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n%s"
                      "Content-Length: %zu\r\n\r\n",
                      method, path, client_host, extra ? extra : "", body_len);
    else
        hl = snprintf(head, sizeof(head),
                      "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n%s\r\n", method, path,
                      client_host, extra ? extra : "");
    assert_true(hl > 0 && (size_t)hl < sizeof(head));
    size_t total = (size_t)hl + (body ? body_len : 0);
    char *out = malloc(total + 1);
    assert_non_null(out);
    memcpy(out, head, (size_t)hl);
    if (body && body_len)
        memcpy(out + hl, body, body_len);

    size_t sent = 0, got = 0, cap = 8192;
    char *in = malloc(cap);
    assert_non_null(in);
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (sent < total) {
            ssize_t n = send(fd, out + sent, total - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0)
                sent += (size_t)n;
            else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
                sent = total; /* the server stopped reading: read its answer */
        }
        event_base_loop(base, EVLOOP_NONBLOCK);
        if (cap - got < 4096) {
            cap *= 2;
            in = realloc(in, cap);
            assert_non_null(in);
        }
        ssize_t n = recv(fd, in + got, cap - got - 1, MSG_DONTWAIT);
        if (n > 0) {
            got += (size_t)n;
            continue;
        }
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
            break;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        poll(&p, 1, 1);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > 10)
            fail_msg("%s %s: no complete response within 10 s", method, path);
    }
    close(fd);
    free(out);
    /* Let the server finish with the closed connection. */
    event_base_loop(base, EVLOOP_NONBLOCK);
    in[got] = '\0';
    r.raw = in;
    if (sscanf(in, "HTTP/1.1 %d", &r.status) != 1)
        fail_msg("%s %s: no status line in '%.200s'", method, path, in);
    char *sep = strstr(in, "\r\n\r\n");
    assert_non_null(sep);
    r.body = sep + 4;
    json_error_t jerr;
    r.json = json_loads(r.body, JSON_DECODE_ANY, &jerr);
    return r;
}

static resp_t req(fixture_t *f, const char *method, const char *path, const char *extra,
                  const char *body)
{
    return request_to(f->base, f->port, method, path, extra, body, body ? strlen(body) : 0);
}

/* Header value (first match, case-insensitive name) into out; false if absent. */
static bool header(const resp_t *r, const char *name, char *out, size_t outlen)
{
    size_t nl = strlen(name);
    const char *p = strstr(r->raw, "\r\n");
    while (p && p < r->body - 2) {
        p += 2;
        if (strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (*v == ' ')
                v++;
            size_t vl = strcspn(v, "\r");
            snprintf(out, outlen, "%.*s", (int)vl, v);
            return true;
        }
        p = strstr(p, "\r\n");
    }
    return false;
}

static const char *err_code(const resp_t *r)
{
    const char *s = json_string_value(json_object_get(json_object_get(r->json, "error"), "code"));
    if (!s)
        fail_msg("not a JSON error: %.300s", r->raw);
    return s;
}

static const char *err_msg(const resp_t *r)
{
    const char *s =
        json_string_value(json_object_get(json_object_get(r->json, "error"), "message"));
    assert_non_null(s);
    return s;
}

static const char *rv_of(json_t *obj)
{
    const char *s =
        json_string_value(json_object_get(json_object_get(obj, "metadata"), "resourceVersion"));
    assert_non_null(s);
    return s;
}

static void expect_status(const resp_t *r, int status)
{
    if (r->status != status)
        fail_msg("expected %d, got %d: %.600s", status, r->status, r->raw);
}

#define BACKEND_JSON(name, port)                                                                   \
    "{\"apiVersion\":\"gateway.sluice.dev/v1alpha1\",\"kind\":\"Backend\",\"metadata\":{"          \
    "\"name\":\"" name "\"},\"spec\":{\"endpoints\":[{\"address\":\"127.0.0.1\",\"port\":" port    \
    "}]}}"

static const char *const api_yaml = "apiVersion: gateway.sluice.dev/v1alpha1\n"
                                    "kind: Api\n"
                                    "metadata: {name: petstore}\n"
                                    "spec:\n"
                                    "  basePath: /petstore/v1\n"
                                    "  backendRefs: [{name: echo}]\n"
                                    "  operations:\n"
                                    "  - {method: GET, path: /pets}\n"
                                    "  - {method: GET, path: '/pets/{id}'}\n";

#define JSON_CT "Content-Type: application/json\r\n"
#define YAML_CT "Content-Type: application/yaml\r\n"

/* ---- health, readiness, metrics ------------------------------------------ */

static int ready_flag;
static int is_ready(void *ctx, char *why, size_t whylen)
{
    snprintf(why, whylen, "the hook says why");
    return *(int *)ctx;
}

/* Regression for --max-routes: a write the core refuses is answered 400
 * limit_exceeded, nothing is stored and nothing recompiles. */
static void test_admission_refusal(void **state)
{
    fixture_t *f = *state;
    f->ctl.refuse_admission = 1;
    resp_t r = req(f, "POST", "/api/v1/apis", YAML_CT, api_yaml);
    expect_status(&r, 400);
    assert_string_equal(err_code(&r), "limit_exceeded");
    assert_non_null(strstr(err_msg(&r), "--max-routes"));
    resp_free(&r);
    r = req(f, "PUT", "/api/v1/resources", YAML_CT, api_yaml);
    expect_status(&r, 400);
    assert_string_equal(err_code(&r), "limit_exceeded");
    resp_free(&r);
    r = req(f, "GET", "/api/v1/apis/petstore", NULL, NULL);
    expect_status(&r, 404);
    resp_free(&r);
    assert_int_equal(f->ctl.changed, 0);
    assert_int_equal(f->ctl.admits, 2);

    f->ctl.refuse_admission = 0;
    r = req(f, "POST", "/api/v1/apis", YAML_CT, api_yaml);
    expect_status(&r, 201);
    resp_free(&r);
    r = req(f, "DELETE", "/api/v1/apis/petstore", NULL, NULL);
    expect_status(&r, 200);
    resp_free(&r);
    assert_int_equal(f->ctl.forgets, 1);
    assert_int_equal(f->ctl.changed, 2);
}

/* The value of the sample line that starts with `prefix` (name, labels and
 * the space), -1 when there is none. */
static double metric_value(const char *body, const char *prefix)
{
    for (const char *p = body; (p = strstr(p, prefix)) != NULL; p++)
        if (p == body || p[-1] == '\n')
            return strtod(p + strlen(prefix), NULL);
    return -1;
}

static void test_health_ready_metrics(void **state)
{
    fixture_t *f = *state;
    resp_t r = req(f, "GET", "/healthz", NULL, NULL);
    expect_status(&r, 200);
    assert_string_equal(json_string_value(json_object_get(r.json, "status")), "ok");
    resp_free(&r);

    r = req(f, "GET", "/readyz", NULL, NULL);
    expect_status(&r, 200);
    resp_free(&r);

    r = req(f, "POST", "/healthz", NULL, "");
    expect_status(&r, 405);
    char allow[64];
    assert_true(header(&r, "Allow", allow, sizeof(allow)));
    assert_string_equal(allow, "GET, HEAD");
    resp_free(&r);

    /* Readiness from the hook. */
    char err[256];
    sl_rest_options_t opt = {.is_ready = is_ready, .ready_ctx = &ready_flag};
    ready_flag = 0;
    sl_rest_t *r2 = sl_rest_start(f->base, "127.0.0.1:0", f->st, &f->ctl, &opt, err, sizeof(err));
    assert_non_null(r2);
    r = request_to(f->base, sl_rest_port(r2), "GET", "/readyz", NULL, NULL, 0);
    expect_status(&r, 503);
    assert_string_equal(err_code(&r), "not_ready");
    assert_string_equal(err_msg(&r), "the hook says why");
    resp_free(&r);
    ready_flag = 1;
    r = request_to(f->base, sl_rest_port(r2), "GET", "/readyz", NULL, NULL, 0);
    expect_status(&r, 200);
    resp_free(&r);
    sl_rest_free(r2);

    /* Metrics: the core's counters and the store latency of our writes. */
    atomic_store(&sl_ctrl_metrics.pushes, 7);
    atomic_store(&sl_ctrl_metrics.nacks, 2);
    atomic_store(&sl_ctrl_metrics.runtimes_connected, 3);
    atomic_store(&sl_ctrl_metrics.config_version, 12);
    r = req(f, "POST", "/api/v1/backends", JSON_CT, BACKEND_JSON("echo", "9001"));
    expect_status(&r, 201);
    resp_free(&r);
    r = req(f, "GET", "/metrics", NULL, NULL);
    expect_status(&r, 200);
    char ct[128];
    assert_true(header(&r, "Content-Type", ct, sizeof(ct)));
    assert_non_null(strstr(ct, "text/plain"));
    assert_non_null(strstr(r.body, "\nsluice_controller_pushes_total 7\n"));
    assert_non_null(strstr(r.body, "\nsluice_controller_nacks_total 2\n"));
    assert_non_null(strstr(r.body, "\nsluice_controller_acks_total 0\n"));
    assert_non_null(strstr(r.body, "\nsluice_controller_runtimes_connected 3\n"));
    assert_non_null(strstr(r.body, "\nsluice_controller_config_version 12\n"));
    assert_non_null(strstr(r.body, "\nsluice_controller_store_writes_total 1\n"));
    assert_non_null(strstr(r.body, "# TYPE sluice_controller_compiles_total counter\n"));
    assert_non_null(strstr(r.body, "\nsluice_controller_compile_errors_total 0\n"));
    /* Store latency: histograms of every write and read of the store
     * (this process's earlier tests included), cumulative up to +Inf. */
    assert_non_null(strstr(r.body, "# TYPE sluice_controller_store_write_seconds histogram\n"));
    assert_non_null(strstr(r.body, "# TYPE sluice_controller_store_read_seconds histogram\n"));
    double writes = metric_value(r.body, "sluice_controller_store_write_seconds_count ");
    assert_true(writes >= 1);
    assert_true(
        metric_value(r.body, "sluice_controller_store_write_seconds_bucket{le=\"+Inf\"} ") ==
        writes);
    assert_true(metric_value(r.body, "sluice_controller_store_write_seconds_sum ") > 0);
    assert_true(metric_value(r.body, "sluice_controller_store_read_seconds_count ") >= 1);
    assert_non_null(strstr(r.body, "# TYPE sluice_controller_push_duration_seconds histogram\n"));
    assert_non_null(
        strstr(r.body, "\nsluice_controller_push_duration_seconds_count{result=\"nack\"} "));
    assert_non_null(strstr(
        r.body, "\nsluice_controller_fleet_runtimes_connected{fleet=\"a\\\"b\\\\c\\nd\"} 2\n"));
    /* Watches (watch.c counts them; none in this process). */
    assert_non_null(strstr(r.body, "# TYPE sluice_controller_watches gauge\n"
                                   "sluice_controller_watches 0\n"));
    assert_non_null(strstr(r.body, "# TYPE sluice_controller_watch_events_total counter\n"));
    assert_non_null(
        strstr(r.body, "\nsluice_controller_watch_events_total{type=\"BOOKMARK\"} 0\n"));
    /* REST responses by method and code: the POST above and the 503 of
     * /readyz. */
    assert_true(metric_value(r.body, "sluice_controller_http_requests_total{method=\"POST\","
                                     "code=\"201\"} ") >= 1);
    assert_true(metric_value(r.body, "sluice_controller_http_requests_total{method=\"GET\","
                                     "code=\"503\"} ") >= 1);
    double posts = metric_value(r.body, "sluice_controller_http_requests_total{method=\"POST\","
                                        "code=\"201\"} ");
    resp_free(&r);
    r = req(f, "POST", "/api/v1/backends", JSON_CT, BACKEND_JSON("echo", "9001"));
    expect_status(&r, 409);
    resp_free(&r);
    r = req(f, "GET", "/metrics", NULL, NULL);
    assert_true(metric_value(r.body, "sluice_controller_http_requests_total{method=\"POST\","
                                     "code=\"201\"} ") == posts);
    assert_true(metric_value(r.body, "sluice_controller_http_requests_total{method=\"POST\","
                                     "code=\"409\"} ") >= 1);
    assert_true(metric_value(r.body, "sluice_controller_store_write_seconds_count ") == writes);
    resp_free(&r);

    /* HEAD: headers of the GET, no body. */
    r = req(f, "HEAD", "/healthz", NULL, NULL);
    expect_status(&r, 200);
    assert_string_equal(r.body, "");
    char len[32];
    assert_true(header(&r, "Content-Length", len, sizeof(len)));
    assert_true(atoi(len) > 0);
    resp_free(&r);
}

/* ---- create / read / replace / delete ------------------------------------ */

static void test_post_create_conflict_and_changed_calls(void **state)
{
    fixture_t *f = *state;
    resp_t r = req(f, "POST", "/api/v1/backends", JSON_CT, BACKEND_JSON("echo", "9001"));
    expect_status(&r, 201);
    assert_string_equal(rv_of(r.json), "1");
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(r.json, "metadata"), "generation")), 1);
    char h[256];
    assert_true(header(&r, "Location", h, sizeof(h)));
    assert_string_equal(h, "/api/v1/namespaces/default/backends/echo");
    assert_true(header(&r, "ETag", h, sizeof(h)));
    assert_string_equal(h, "\"1\"");
    assert_true(header(&r, "Content-Type", h, sizeof(h)));
    assert_string_equal(h, "application/json");
    assert_int_equal(f->ctl.changed, 1);
    resp_free(&r);

    /* Exists: 409, not written, the core not told. */
    r = req(f, "POST", "/api/v1/backends", JSON_CT, BACKEND_JSON("echo", "9002"));
    expect_status(&r, 409);
    assert_string_equal(err_code(&r), "already_exists");
    assert_non_null(strstr(err_msg(&r), "already exists"));
    assert_int_equal(f->ctl.changed, 1);
    resp_free(&r);

    /* YAML with its Content-Type. */
    r = req(f, "POST", "/api/v1/apis", YAML_CT, api_yaml);
    expect_status(&r, 201);
    assert_string_equal(rv_of(r.json), "2");
    assert_int_equal(f->ctl.changed, 2);
    resp_free(&r);

    /* No Content-Type: sniffed (YAML here), with charset parameters fine. */
    r = req(f, "POST", "/api/v1/consumers", NULL,
            "apiVersion: gateway.sluice.dev/v1alpha1\nkind: Consumer\nmetadata: {name: alice}\n"
            "spec: {}\n");
    expect_status(&r, 201);
    resp_free(&r);
    r = req(f, "POST", "/api/v1/namespaces/team-a/backends",
            "Content-Type: application/json; charset=utf-8\r\n", BACKEND_JSON("echo", "9003"));
    expect_status(&r, 201);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(r.json, "metadata"), "namespace")),
        "team-a");
    resp_free(&r);
    assert_int_equal(f->ctl.changed, 4);
    assert_int_equal(atomic_load(&sl_ctrl_metrics.store_writes), 4);
}

static void test_validation_errors_name_fields(void **state)
{
    fixture_t *f = *state;
    const char *bad = "apiVersion: gateway.sluice.dev/v1alpha1\n"
                      "kind: Api\n"
                      "metadata: {name: petstore}\n"
                      "spec:\n"
                      "  basePath: /petstore/v1\n"
                      "  backendRefs: [{name: echo}]\n"
                      "  operations:\n"
                      "  - {method: GET, path: /pets}\n"
                      "  - {method: GET, path: '/pets/{id'}\n";
    resp_t r = req(f, "POST", "/api/v1/apis", YAML_CT, bad);
    expect_status(&r, 400);
    assert_string_equal(err_code(&r), "invalid");
    assert_string_equal(err_msg(&r), "Api default/petstore is invalid");
    json_t *e = json_object_get(r.json, "error");
    assert_int_equal(json_integer_value(json_object_get(e, "status")), 400);
    json_t *d = json_array_get(json_object_get(e, "details"), 0);
    assert_string_equal(json_string_value(json_object_get(d, "field")), "spec.operations[1].path");
    assert_string_equal(json_string_value(json_object_get(d, "message")), "unbalanced '{'");
    resp_free(&r);

    /* Unknown field with a suggestion, in JSON. */
    r = req(f, "POST", "/api/v1/backends", JSON_CT,
            "{\"apiVersion\":\"gateway.sluice.dev/v1alpha1\",\"kind\":\"Backend\","
            "\"metadata\":{\"name\":\"echo\"},\"spec\":{\"endpoints\":[{\"address\":\"127.0.0.1\","
            "\"port\":1}]},\"sepc\":1}");
    expect_status(&r, 400);
    d = json_array_get(json_object_get(json_object_get(r.json, "error"), "details"), 0);
    assert_string_equal(json_string_value(json_object_get(d, "field")), "sepc");
    resp_free(&r);

    /* Syntax errors. */
    r = req(f, "POST", "/api/v1/backends", JSON_CT, "{\"kind\": ");
    expect_status(&r, 400);
    assert_string_equal(err_code(&r), "invalid");
    resp_free(&r);
    r = req(f, "POST", "/api/v1/backends", YAML_CT, "kind: [unclosed\n");
    expect_status(&r, 400);
    resp_free(&r);
    r = req(f, "POST", "/api/v1/backends", JSON_CT, "kind: Backend\n");
    expect_status(&r, 400);
    assert_string_equal(err_code(&r), "invalid_json");
    resp_free(&r);

    /* Kind of the body vs the path. */
    r = req(f, "POST", "/api/v1/apis", JSON_CT, BACKEND_JSON("echo", "9001"));
    expect_status(&r, 400);
    assert_string_equal(err_code(&r), "kind_mismatch");
    assert_non_null(strstr(err_msg(&r), "/api/v1/backends"));
    d = json_array_get(json_object_get(json_object_get(r.json, "error"), "details"), 0);
    assert_string_equal(json_string_value(json_object_get(d, "field")), "kind");
    resp_free(&r);

    /* Empty and multi-document bodies on a single-object endpoint. */
    r = req(f, "POST", "/api/v1/backends", YAML_CT, "");
    expect_status(&r, 400);
    assert_string_equal(err_code(&r), "empty_body");
    resp_free(&r);
    char two[1024];
    snprintf(two, sizeof(two), "---\n%s\n---\n%s", BACKEND_JSON("a", "1"), BACKEND_JSON("b", "2"));
    r = req(f, "POST", "/api/v1/backends", YAML_CT, two);
    expect_status(&r, 400);
    assert_string_equal(err_code(&r), "too_many_documents");
    assert_non_null(strstr(err_msg(&r), "/api/v1/resources"));
    resp_free(&r);

    /* Unsupported media type. */
    r = req(f, "POST", "/api/v1/backends", "Content-Type: text/plain\r\n",
            BACKEND_JSON("echo", "9001"));
    expect_status(&r, 415);
    assert_string_equal(err_code(&r), "unsupported_media_type");
    resp_free(&r);

    /* Body namespace vs path namespace. */
    r = req(f, "POST", "/api/v1/namespaces/prod/backends", YAML_CT,
            "apiVersion: gateway.sluice.dev/v1alpha1\nkind: Backend\n"
            "metadata: {name: echo, namespace: dev}\nspec: {endpoints: [{address: 127.0.0.1, port: "
            "1}]}\n");
    expect_status(&r, 400);
    assert_string_equal(err_code(&r), "namespace_mismatch");
    resp_free(&r);

    assert_int_equal(f->ctl.changed, 0);
    json_t *all = NULL;
    assert_int_equal(sl_store_list(f->st, SL_KIND_BACKEND, NULL, &all), SL_STORE_OK);
    assert_int_equal(json_array_size(all), 0);
    json_decref(all);
}

static void test_put_get_delete_and_preconditions(void **state)
{
    fixture_t *f = *state;
    /* PUT creates: 201. */
    resp_t r = req(f, "PUT", "/api/v1/backends/echo", JSON_CT, BACKEND_JSON("echo", "9001"));
    expect_status(&r, 201);
    assert_string_equal(rv_of(r.json), "1");
    resp_free(&r);

    /* PUT replaces: 200, new version, generation +1. */
    r = req(f, "PUT", "/api/v1/backends/echo", JSON_CT, BACKEND_JSON("echo", "9002"));
    expect_status(&r, 200);
    assert_string_equal(rv_of(r.json), "2");
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(r.json, "metadata"), "generation")), 2);
    resp_free(&r);
    assert_int_equal(f->ctl.changed, 2);

    /* The same document again: a no-op (same version, no recompile). */
    r = req(f, "PUT", "/api/v1/backends/echo", JSON_CT, BACKEND_JSON("echo", "9002"));
    expect_status(&r, 200);
    assert_string_equal(rv_of(r.json), "2");
    resp_free(&r);
    assert_int_equal(f->ctl.changed, 2);

    /* Name in the path vs the body. */
    r = req(f, "PUT", "/api/v1/backends/other", JSON_CT, BACKEND_JSON("echo", "9002"));
    expect_status(&r, 400);
    assert_string_equal(err_code(&r), "name_mismatch");
    resp_free(&r);

    /* If-Match: stale -> 412, current -> 200, garbage -> 400. */
    r = req(f, "PUT", "/api/v1/backends/echo", JSON_CT "If-Match: \"1\"\r\n",
            BACKEND_JSON("echo", "9003"));
    expect_status(&r, 412);
    assert_string_equal(err_code(&r), "precondition_failed");
    assert_non_null(strstr(err_msg(&r), "resourceVersion is 2, not 1"));
    resp_free(&r);
    r = req(f, "PUT", "/api/v1/backends/echo", JSON_CT "If-Match: \"2\"\r\n",
            BACKEND_JSON("echo", "9003"));
    expect_status(&r, 200);
    assert_string_equal(rv_of(r.json), "3");
    resp_free(&r);
    r = req(f, "PUT", "/api/v1/backends/echo", JSON_CT "If-Match: \"abc\"\r\n",
            BACKEND_JSON("echo", "9003"));
    expect_status(&r, 400);
    assert_string_equal(err_code(&r), "invalid_header");
    resp_free(&r);
    r = req(f, "PUT", "/api/v1/backends/nobody", JSON_CT "If-Match: \"3\"\r\n",
            BACKEND_JSON("nobody", "9003"));
    expect_status(&r, 412);
    resp_free(&r);
    r = req(f, "PUT", "/api/v1/backends/nobody", JSON_CT "If-Match: *\r\n",
            BACKEND_JSON("nobody", "9003"));
    expect_status(&r, 412);
    resp_free(&r);
    assert_int_equal(f->ctl.changed, 3);

    /* A stale metadata.resourceVersion in the body: 409. */
    const char *stale = "{\"apiVersion\":\"gateway.sluice.dev/v1alpha1\",\"kind\":\"Backend\","
                        "\"metadata\":{\"name\":\"echo\",\"resourceVersion\":\"2\"},"
                        "\"spec\":{\"endpoints\":[{\"address\":\"127.0.0.1\",\"port\":1}]}}";
    r = req(f, "PUT", "/api/v1/backends/echo", JSON_CT, stale);
    expect_status(&r, 409);
    assert_string_equal(err_code(&r), "conflict");
    resp_free(&r);
    r = req(f, "PUT", "/api/v1/backends/echo", JSON_CT "If-Match: \"3\"\r\n", stale);
    expect_status(&r, 400);
    assert_string_equal(err_code(&r), "conflicting_preconditions");
    resp_free(&r);
    assert_int_equal(f->ctl.changed, 3);

    /* GET: ETag, no status known for this one. */
    r = req(f, "GET", "/api/v1/backends/echo", NULL, NULL);
    expect_status(&r, 200);
    char etag[64];
    assert_true(header(&r, "ETag", etag, sizeof(etag)));
    assert_string_equal(etag, "\"3\"");
    assert_null(json_object_get(r.json, "status"));
    resp_free(&r);
    r = req(f, "GET", "/api/v1/namespaces/default/backends/echo", NULL, NULL);
    expect_status(&r, 200);
    resp_free(&r);
    r = req(f, "GET", "/api/v1/backends/echo?namespace=other", NULL, NULL);
    expect_status(&r, 404);
    assert_string_equal(err_code(&r), "not_found");
    resp_free(&r);
    r = req(f, "HEAD", "/api/v1/backends/echo", NULL, NULL);
    expect_status(&r, 200);
    assert_string_equal(r.body, "");
    resp_free(&r);

    /* DELETE: If-Match stale 412, then 200 with the object, then 404. */
    r = req(f, "DELETE", "/api/v1/backends/echo", "If-Match: \"1\"\r\n", NULL);
    expect_status(&r, 412);
    resp_free(&r);
    r = req(f, "DELETE", "/api/v1/backends/echo", "If-Match: \"3\"\r\n", NULL);
    expect_status(&r, 200);
    assert_string_equal(rv_of(r.json), "3");
    resp_free(&r);
    assert_int_equal(f->ctl.changed, 4);
    r = req(f, "GET", "/api/v1/backends/echo", NULL, NULL);
    expect_status(&r, 404);
    resp_free(&r);
    r = req(f, "DELETE", "/api/v1/backends/echo", NULL, NULL);
    expect_status(&r, 404);
    assert_non_null(strstr(err_msg(&r), "not found"));
    resp_free(&r);
    assert_int_equal(f->ctl.changed, 4);
    assert_int_equal(sl_store_resource_version(f->st), 4);
}

static void test_get_merges_status_and_lists(void **state)
{
    fixture_t *f = *state;
    resp_t r = req(f, "PUT", "/api/v1/apis/petstore", YAML_CT, api_yaml);
    expect_status(&r, 201);
    /* Write answers carry no status (it is computed after the write). */
    assert_null(json_object_get(r.json, "status"));
    resp_free(&r);
    r = req(f, "GET", "/api/v1/apis/petstore", NULL, NULL);
    expect_status(&r, 200);
    json_t *cond =
        json_array_get(json_object_get(json_object_get(r.json, "status"), "conditions"), 0);
    assert_string_equal(json_string_value(json_object_get(cond, "reason")), "BackendNotFound");
    resp_free(&r);

    const char *names[][2] = {{"zeta", "b"}, {"alpha", "z"}, {"zeta", "a"}, {"default", "m"}};
    for (size_t i = 0; i < 4; i++) {
        char path[128], body[512];
        snprintf(path, sizeof(path), "/api/v1/namespaces/%s/backends", names[i][0]);
        snprintf(body, sizeof(body),
                 "{\"apiVersion\":\"gateway.sluice.dev/v1alpha1\",\"kind\":\"Backend\","
                 "\"metadata\":{\"name\":\"%s\"},\"spec\":{\"endpoints\":[{\"address\":\"127.0.0."
                 "1\",\"port\":1}]}}",
                 names[i][1]);
        r = req(f, "POST", path, JSON_CT, body);
        expect_status(&r, 201);
        resp_free(&r);
    }
    r = req(f, "GET", "/api/v1/backends", NULL, NULL);
    expect_status(&r, 200);
    assert_string_equal(json_string_value(json_object_get(r.json, "kind")), "BackendList");
    assert_string_equal(json_string_value(json_object_get(r.json, "resourceVersion")), "5");
    json_t *items = json_object_get(r.json, "items");
    assert_int_equal(json_array_size(items), 4);
    const char *order[][2] = {{"alpha", "z"}, {"default", "m"}, {"zeta", "a"}, {"zeta", "b"}};
    for (size_t i = 0; i < 4; i++) {
        json_t *m = json_object_get(json_array_get(items, i), "metadata");
        assert_string_equal(json_string_value(json_object_get(m, "namespace")), order[i][0]);
        assert_string_equal(json_string_value(json_object_get(m, "name")), order[i][1]);
    }
    resp_free(&r);
    r = req(f, "GET", "/api/v1/backends?namespace=zeta", NULL, NULL);
    expect_status(&r, 200);
    assert_int_equal(json_array_size(json_object_get(r.json, "items")), 2);
    resp_free(&r);
    r = req(f, "GET", "/api/v1/namespaces/zeta/backends/", NULL, NULL);
    expect_status(&r, 200);
    assert_int_equal(json_array_size(json_object_get(r.json, "items")), 2);
    resp_free(&r);
    r = req(f, "GET", "/api/v1/apis", NULL, NULL);
    expect_status(&r, 200);
    items = json_object_get(r.json, "items");
    assert_int_equal(json_array_size(items), 1);
    assert_non_null(json_object_get(json_array_get(items, 0), "status"));
    resp_free(&r);
    r = req(f, "GET", "/api/v1/gateways", NULL, NULL);
    expect_status(&r, 200);
    assert_int_equal(json_array_size(json_object_get(r.json, "items")), 0);
    resp_free(&r);

    /* Namespace contradictions and invalid names. */
    r = req(f, "GET", "/api/v1/namespaces/a/backends?namespace=b", NULL, NULL);
    expect_status(&r, 400);
    assert_string_equal(err_code(&r), "namespace_mismatch");
    resp_free(&r);
    r = req(f, "GET", "/api/v1/backends?namespace=Bad_NS", NULL, NULL);
    expect_status(&r, 400);
    assert_string_equal(err_code(&r), "invalid_namespace");
    resp_free(&r);
    r = req(f, "GET", "/api/v1/backends/Not_Valid", NULL, NULL);
    expect_status(&r, 400);
    assert_string_equal(err_code(&r), "invalid_name");
    resp_free(&r);
    char longpath[600];
    memset(longpath, 0, sizeof(longpath));
    strcpy(longpath, "/api/v1/backends/");
    memset(longpath + strlen(longpath), 'a', 300);
    r = req(f, "GET", longpath, NULL, NULL);
    expect_status(&r, 400);
    assert_string_equal(err_code(&r), "invalid_name");
    resp_free(&r);
}

static void test_paths_and_methods(void **state)
{
    fixture_t *f = *state;
    resp_t r = req(f, "GET", "/api/v1/widgets", NULL, NULL);
    expect_status(&r, 404);
    assert_non_null(strstr(err_msg(&r), "gateways, apis, backends, consumers, certificates"));
    resp_free(&r);
    r = req(f, "GET", "/nope", NULL, NULL);
    expect_status(&r, 404);
    assert_string_equal(err_code(&r), "not_found");
    resp_free(&r);
    r = req(f, "GET", "/api/v2/apis", NULL, NULL);
    expect_status(&r, 404);
    resp_free(&r);
    r = req(f, "GET", "/api/v1/apis/a/b", NULL, NULL);
    expect_status(&r, 404);
    resp_free(&r);
    r = req(f, "GET", "/api/v1//apis", NULL, NULL);
    expect_status(&r, 404);
    resp_free(&r);
    r = req(f, "GET", "/api/v1/namespaces/x", NULL, NULL);
    expect_status(&r, 404);
    resp_free(&r);

    char allow[64];
    r = req(f, "PATCH", "/api/v1/apis/x", JSON_CT, "{}");
    expect_status(&r, 405);
    assert_true(header(&r, "Allow", allow, sizeof(allow)));
    assert_string_equal(allow, "GET, HEAD, PUT, DELETE");
    assert_string_equal(err_code(&r), "method_not_allowed");
    resp_free(&r);
    r = req(f, "DELETE", "/api/v1/apis", NULL, NULL);
    expect_status(&r, 405);
    assert_true(header(&r, "Allow", allow, sizeof(allow)));
    assert_string_equal(allow, "GET, HEAD, POST");
    resp_free(&r);
    r = req(f, "GET", "/api/v1/resources", NULL, NULL);
    expect_status(&r, 405);
    assert_true(header(&r, "Allow", allow, sizeof(allow)));
    assert_string_equal(allow, "POST, PUT");
    resp_free(&r);
    r = req(f, "POST", "/api/v1/runtimes", JSON_CT, "{}");
    expect_status(&r, 405);
    resp_free(&r);

    /* Discovery, runtimes and status come from the core. */
    r = req(f, "GET", "/api/v1", NULL, NULL);
    expect_status(&r, 200);
    assert_int_equal(json_array_size(json_object_get(r.json, "resources")), 5);
    resp_free(&r);
    r = req(f, "GET", "/api/v1/runtimes", NULL, NULL);
    expect_status(&r, 200);
    json_t *rt = json_array_get(json_object_get(r.json, "items"), 0);
    assert_string_equal(json_string_value(json_object_get(rt, "node_id")), "rt-1");
    resp_free(&r);
    r = req(f, "GET", "/api/v1/status", NULL, NULL);
    expect_status(&r, 200);
    assert_int_equal(json_integer_value(json_object_get(r.json, "config_version")), 3);
    resp_free(&r);

    /* Without a core: 503, and writes still work. */
    char err[256];
    sl_rest_t *r2 = sl_rest_start(f->base, "127.0.0.1:0", f->st, NULL, NULL, err, sizeof(err));
    assert_non_null(r2);
    r = request_to(f->base, sl_rest_port(r2), "GET", "/api/v1/runtimes", NULL, NULL, 0);
    expect_status(&r, 503);
    resp_free(&r);
    const char *b = BACKEND_JSON("x", "1");
    r = request_to(f->base, sl_rest_port(r2), "POST", "/api/v1/backends", JSON_CT, b, strlen(b));
    expect_status(&r, 201);
    resp_free(&r);
    sl_rest_free(r2);
    assert_int_equal(f->ctl.changed, 0);
}

/* ---- multi-document apply ------------------------------------------------ */

static void test_resources_apply_whole_file(void **state)
{
    fixture_t *f = *state;
    char file[4096];
    snprintf(file, sizeof(file),
             "apiVersion: gateway.sluice.dev/v1alpha1\n"
             "kind: Gateway\n"
             "metadata: {name: default}\n"
             "spec:\n"
             "  fleet: default\n"
             "  listeners:\n"
             "  - {name: http, port: 8080, protocol: http}\n"
             "---\n"
             "apiVersion: gateway.sluice.dev/v1alpha1\n"
             "kind: Backend\n"
             "metadata: {name: echo}\n"
             "spec:\n"
             "  endpoints:\n"
             "  - {address: 127.0.0.1, port: 9001}\n"
             "---\n%s",
             api_yaml);
    resp_t r = req(f, "POST", "/api/v1/resources", YAML_CT, file);
    expect_status(&r, 200);
    assert_int_equal(json_integer_value(json_object_get(r.json, "count")), 3);
    assert_int_equal(json_integer_value(json_object_get(r.json, "changed")), 3);
    json_t *items = json_object_get(r.json, "items");
    assert_int_equal(json_array_size(items), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(items, 2), "kind")),
                        "Api");
    assert_string_equal(rv_of(json_array_get(items, 2)), "3");
    resp_free(&r);
    /* One transaction, one notification. */
    assert_int_equal(f->ctl.changed, 1);

    /* The same file again changes nothing. */
    r = req(f, "PUT", "/api/v1/resources", YAML_CT, file);
    expect_status(&r, 200);
    assert_int_equal(json_integer_value(json_object_get(r.json, "changed")), 0);
    assert_string_equal(rv_of(json_array_get(json_object_get(r.json, "items"), 2)), "3");
    resp_free(&r);
    assert_int_equal(f->ctl.changed, 1);

    /* A JSON array with one change. */
    char arr[2048];
    snprintf(arr, sizeof(arr), "[%s, %s]", BACKEND_JSON("echo", "9009"), BACKEND_JSON("new", "1"));
    r = req(f, "POST", "/api/v1/resources?namespace=default", JSON_CT, arr);
    expect_status(&r, 200);
    assert_int_equal(json_integer_value(json_object_get(r.json, "changed")), 2);
    resp_free(&r);
    assert_int_equal(f->ctl.changed, 2);

    /* Every error of the file at once, with document numbers; nothing
     * stored, not even the valid documents. */
    const char *bad = "apiVersion: gateway.sluice.dev/v1alpha1\n"
                      "kind: Backend\n"
                      "metadata: {name: fresh}\n"
                      "spec: {endpoints: [{address: 127.0.0.1, port: 1}]}\n"
                      "---\n"
                      "apiVersion: gateway.sluice.dev/v1alpha1\n"
                      "kind: Api\n"
                      "metadata: {name: broken}\n"
                      "spec:\n"
                      "  operations:\n"
                      "  - {method: GET, path: '/x/{id'}\n"
                      "---\n"
                      "apiVersion: gateway.sluice.dev/v1alpha1\n"
                      "kind: Widget\n"
                      "metadata: {name: w}\n"
                      "spec: {}\n";
    r = req(f, "POST", "/api/v1/resources", YAML_CT, bad);
    expect_status(&r, 400);
    assert_string_equal(err_code(&r), "invalid");
    assert_non_null(strstr(err_msg(&r), "nothing was stored"));
    json_t *details = json_object_get(json_object_get(r.json, "error"), "details");
    assert_true(json_array_size(details) >= 2);
    bool doc2 = false, doc3 = false;
    size_t i;
    json_t *d;
    json_array_foreach(details, i, d)
    {
        json_int_t doc = json_integer_value(json_object_get(d, "document"));
        const char *field = json_string_value(json_object_get(d, "field"));
        if (doc == 2 && strcmp(field, "spec.operations[0].path") == 0)
            doc2 = true;
        if (doc == 3 && strcmp(field, "kind") == 0)
            doc3 = true;
    }
    assert_true(doc2);
    assert_true(doc3);
    resp_free(&r);
    r = req(f, "GET", "/api/v1/backends/fresh", NULL, NULL);
    expect_status(&r, 404);
    resp_free(&r);

    /* A namespace query that contradicts a document. */
    r = req(f, "POST", "/api/v1/resources?namespace=prod", YAML_CT,
            "apiVersion: gateway.sluice.dev/v1alpha1\nkind: Backend\n"
            "metadata: {name: x, namespace: dev}\nspec: {endpoints: [{address: 127.0.0.1, port: "
            "1}]}\n");
    expect_status(&r, 400);
    resp_free(&r);
    r = req(f, "POST", "/api/v1/resources", YAML_CT, "# nothing\n");
    expect_status(&r, 400);
    assert_string_equal(err_code(&r), "empty_body");
    resp_free(&r);
    assert_int_equal(f->ctl.changed, 2);
}

static void test_body_limit(void **state)
{
    fixture_t *f = *state;
    char err[256];
    sl_rest_options_t opt = {.max_body_bytes = 1024};
    sl_rest_t *small =
        sl_rest_start(f->base, "127.0.0.1:0", f->st, &f->ctl, &opt, err, sizeof(err));
    assert_non_null(small);
    size_t n = 4000;
    char *big = malloc(n + 1);
    assert_non_null(big);
    memset(big, ' ', n);
    memcpy(big, "{\"a\":1}", 7);
    big[n] = '\0';
    resp_t r =
        request_to(f->base, sl_rest_port(small), "POST", "/api/v1/backends", JSON_CT, big, n);
    expect_status(&r, 413);
    resp_free(&r);
    /* Under the limit still works on the same server. */
    const char *b = BACKEND_JSON("echo", "1");
    r = request_to(f->base, sl_rest_port(small), "POST", "/api/v1/backends", JSON_CT, b, strlen(b));
    expect_status(&r, 201);
    resp_free(&r);
    free(big);
    sl_rest_free(small);
}

/* ---- auth, read-only, listen address ------------------------------------- */

static void test_bearer_token(void **state)
{
    fixture_t *f = *state;
    char err[256];
    sl_rest_options_t opt = {.admin_token = "s3cr3t-token"};
    sl_rest_t *a = sl_rest_start(f->base, "127.0.0.1:0", f->st, &f->ctl, &opt, err, sizeof(err));
    assert_non_null(a);
    int port = sl_rest_port(a);
    char www[128];

    resp_t r = request_to(f->base, port, "GET", "/api/v1/backends", NULL, NULL, 0);
    expect_status(&r, 401);
    assert_string_equal(err_code(&r), "unauthorized");
    assert_true(header(&r, "WWW-Authenticate", www, sizeof(www)));
    assert_non_null(strstr(www, "Bearer"));
    resp_free(&r);

    r = request_to(f->base, port, "GET", "/api/v1/backends",
                   "Authorization: Bearer wrong-token\r\n", NULL, 0);
    expect_status(&r, 401);
    assert_true(header(&r, "WWW-Authenticate", www, sizeof(www)));
    assert_non_null(strstr(www, "invalid_token"));
    resp_free(&r);
    /* A prefix of the token is not the token. */
    r = request_to(f->base, port, "GET", "/api/v1/backends", "Authorization: Bearer s3cr3t\r\n",
                   NULL, 0);
    expect_status(&r, 401);
    resp_free(&r);
    r = request_to(f->base, port, "GET", "/api/v1/backends", "Authorization: Basic czNjcjN0\r\n",
                   NULL, 0);
    expect_status(&r, 401);
    resp_free(&r);
    /* Unknown paths under /api/ are not revealed without the token. */
    r = request_to(f->base, port, "GET", "/api/v1/widgets", NULL, NULL, 0);
    expect_status(&r, 401);
    resp_free(&r);
    /* Writes are refused before touching the store. */
    const char *b = BACKEND_JSON("echo", "1");
    r = request_to(f->base, port, "POST", "/api/v1/backends", JSON_CT, b, strlen(b));
    expect_status(&r, 401);
    resp_free(&r);
    assert_int_equal(f->ctl.changed, 0);

    r = request_to(f->base, port, "GET", "/api/v1/backends",
                   "Authorization: Bearer s3cr3t-token\r\n", NULL, 0);
    expect_status(&r, 200);
    resp_free(&r);
    r = request_to(f->base, port, "POST", "/api/v1/backends",
                   JSON_CT "Authorization: bearer s3cr3t-token\r\n", b, strlen(b));
    expect_status(&r, 201);
    resp_free(&r);

    /* Health and metrics stay open. */
    r = request_to(f->base, port, "GET", "/healthz", NULL, NULL, 0);
    expect_status(&r, 200);
    resp_free(&r);
    r = request_to(f->base, port, "GET", "/readyz", NULL, NULL, 0);
    expect_status(&r, 200);
    resp_free(&r);
    r = request_to(f->base, port, "GET", "/metrics", NULL, NULL, 0);
    expect_status(&r, 200);
    resp_free(&r);
    sl_rest_free(a);
}

static void test_read_only_mode(void **state)
{
    fixture_t *f = *state;
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    char file[2048];
    snprintf(file, sizeof(file), "%s---\n%s", api_yaml,
             "apiVersion: gateway.sluice.dev/v1alpha1\nkind: Api\n"
             "metadata: {name: alpha, namespace: default}\n"
             "spec: {backendRefs: [{name: echo}], operations: [{method: GET, path: /a}]}\n");
    if (sl_model_parse(&set, file, strlen(file), "files.yaml", &errs) != 0)
        fail_msg("%s", sl_errors_format(&errs));

    char err[256];
    sl_rest_options_t opt = {.read_only = true, .static_set = &set};
    sl_rest_t *ro = sl_rest_start(f->base, "127.0.0.1:0", NULL, &f->ctl, &opt, err, sizeof(err));
    if (!ro)
        fail_msg("%s", err);
    int port = sl_rest_port(ro);

    const char *b = BACKEND_JSON("echo", "1");
    struct {
        const char *method, *path;
    } writes[] = {{"POST", "/api/v1/backends"},
                  {"PUT", "/api/v1/backends/echo"},
                  {"DELETE", "/api/v1/apis/petstore"},
                  {"POST", "/api/v1/resources"}};
    for (size_t i = 0; i < sizeof(writes) / sizeof(writes[0]); i++) {
        resp_t r =
            request_to(f->base, port, writes[i].method, writes[i].path, JSON_CT, b, strlen(b));
        expect_status(&r, 405);
        assert_string_equal(err_code(&r), "read_only");
        assert_non_null(strstr(err_msg(&r), "--resources"));
        char allow[64];
        assert_true(header(&r, "Allow", allow, sizeof(allow)));
        assert_string_equal(allow, "GET, HEAD");
        resp_free(&r);
    }
    assert_int_equal(f->ctl.changed, 0);

    /* GETs answer from the files, in (namespace, name) order, with status. */
    resp_t r = request_to(f->base, port, "GET", "/api/v1/apis", NULL, NULL, 0);
    expect_status(&r, 200);
    json_t *items = json_object_get(r.json, "items");
    assert_int_equal(json_array_size(items), 2);
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_array_get(items, 0), "metadata"), "name")),
                        "alpha");
    assert_non_null(json_object_get(json_array_get(items, 1), "status"));
    resp_free(&r);
    r = request_to(f->base, port, "GET", "/api/v1/apis/petstore", NULL, NULL, 0);
    expect_status(&r, 200);
    resp_free(&r);
    r = request_to(f->base, port, "GET", "/api/v1/apis/missing", NULL, NULL, 0);
    expect_status(&r, 404);
    resp_free(&r);
    sl_rest_free(ro);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
}

static void test_listen_address_rules(void **state)
{
    fixture_t *f = *state;
    char err[512];
    sl_rest_t *r = sl_rest_start(f->base, "0.0.0.0:0", f->st, &f->ctl, NULL, err, sizeof(err));
    assert_null(r);
    assert_string_equal(err, "--rest 0.0.0.0:0: refusing to serve the admin API on a "
                             "non-loopback address without --admin-token-file (or pass "
                             "--insecure-admin)");
    r = sl_rest_start(f->base, "[::]:0", f->st, &f->ctl, NULL, err, sizeof(err));
    assert_null(r);
    assert_non_null(strstr(err, "refusing"));

    sl_rest_options_t tok = {.admin_token = "t"};
    r = sl_rest_start(f->base, "0.0.0.0:0", f->st, &f->ctl, &tok, err, sizeof(err));
    assert_non_null(r);
    sl_rest_free(r);
    sl_rest_options_t insecure = {.insecure = true};
    r = sl_rest_start(f->base, "0.0.0.0:0", f->st, &f->ctl, &insecure, err, sizeof(err));
    assert_non_null(r);
    sl_rest_free(r);
    r = sl_rest_start(f->base, "localhost:0", f->st, &f->ctl, NULL, err, sizeof(err));
    assert_non_null(r);
    sl_rest_free(r);
    r = sl_rest_start(f->base, "127.0.0.2:0", f->st, &f->ctl, NULL, err, sizeof(err));
    assert_non_null(r);
    sl_rest_free(r);

    const char *bad[] = {"9090",     "127.0.0.1:", "127.0.0.1:99999",
                         "::1:9090", "[::1]9090",  "bad host:1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        r = sl_rest_start(f->base, bad[i], f->st, &f->ctl, NULL, err, sizeof(err));
        assert_null(r);
        assert_non_null(strstr(err, "--rest"));
    }
    /* Address in use. */
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", f->port);
    r = sl_rest_start(f->base, addr, f->st, &f->ctl, NULL, err, sizeof(err));
    assert_null(r);
    assert_non_null(strstr(err, "in use"));
    /* No store outside read-only mode. */
    r = sl_rest_start(f->base, "127.0.0.1:0", NULL, &f->ctl, NULL, err, sizeof(err));
    assert_null(r);
    assert_non_null(strstr(err, "no store"));
}

static void test_browser_requests_refused(void **state)
{
    fixture_t *f = *state;
    /* A cross-site form post (no preflight) carries Origin. */
    resp_t r = req(f, "POST", "/api/v1/resources",
                   "Origin: https://evil.example\r\nContent-Type: text/plain\r\n",
                   BACKEND_JSON("echo", "1"));
    expect_status(&r, 403);
    assert_string_equal(err_code(&r), "cross_origin");
    resp_free(&r);
    r = req(f, "GET", "/api/v1/backends", "Origin: null\r\n", NULL);
    expect_status(&r, 403);
    resp_free(&r);

    /* DNS rebinding: a foreign name pointing at 127.0.0.1. */
    client_host = "rebind.evil.example:9090";
    r = req(f, "GET", "/api/v1/backends", NULL, NULL);
    expect_status(&r, 403);
    assert_string_equal(err_code(&r), "host_not_allowed");
    resp_free(&r);
    /* Health stays reachable for probes whatever the Host. */
    r = req(f, "GET", "/healthz", NULL, NULL);
    expect_status(&r, 200);
    resp_free(&r);
    const char *ok_hosts[] = {"localhost:9090", "LOCALHOST", "127.0.0.1:1", "[::1]:9090"};
    for (size_t i = 0; i < sizeof(ok_hosts) / sizeof(ok_hosts[0]); i++) {
        client_host = ok_hosts[i];
        r = req(f, "GET", "/api/v1/backends", NULL, NULL);
        expect_status(&r, 200);
        resp_free(&r);
    }

    /* With a token, the token decides, not the Host. */
    char err[256];
    sl_rest_options_t opt = {.admin_token = "tok"};
    sl_rest_t *a = sl_rest_start(f->base, "127.0.0.1:0", f->st, &f->ctl, &opt, err, sizeof(err));
    assert_non_null(a);
    client_host = "controller.internal:9090";
    r = request_to(f->base, sl_rest_port(a), "GET", "/api/v1/backends",
                   "Authorization: Bearer tok\r\n", NULL, 0);
    expect_status(&r, 200);
    resp_free(&r);
    client_host = "127.0.0.1";
    sl_rest_free(a);
    assert_int_equal(f->ctl.changed, 0);
}

static void write_file(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static void test_load_token(void **state)
{
    fixture_t *f = *state;
    char path[400], err[512];
    snprintf(path, sizeof(path), "%s/token", f->dir);
    write_file(path, "abc123-XYZ\n");
    chmod(path, 0600);
    char *t = sl_bearer_load("--admin-token-file", path, err, sizeof(err));
    assert_non_null(t);
    assert_string_equal(t, "abc123-XYZ");
    free(t);

    write_file(path, "\n  \n");
    assert_null(sl_bearer_load("--admin-token-file", path, err, sizeof(err)));
    assert_non_null(strstr(err, "empty"));
    write_file(path, "two words\n");
    assert_null(sl_bearer_load("--admin-token-file", path, err, sizeof(err)));
    assert_non_null(strstr(err, "spaces or control characters"));
    char big[5000];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    write_file(path, big);
    assert_null(sl_bearer_load("--admin-token-file", path, err, sizeof(err)));
    assert_non_null(strstr(err, "larger than"));
    snprintf(path, sizeof(path), "%s/missing", f->dir);
    assert_null(sl_bearer_load("--admin-token-file", path, err, sizeof(err)));
    assert_non_null(strstr(err, "No such file"));
}

/* ---- Certificates: the key goes in, never out ---------------------------- */

/* True when any line of the key's base64 body appears in text. */
static bool leaks_key(const char *text, const char *key_pem)
{
    const char *p = strchr(key_pem, '\n');
    while (p && p[1] && strncmp(p + 1, "-----", 5) != 0) {
        char line[80];
        size_t n = strcspn(p + 1, "\n");
        snprintf(line, sizeof(line), "%.*s", (int)(n < 40 ? n : 40), p + 1);
        if (n >= 16 && strstr(text, line))
            return true;
        p = strchr(p + 1, '\n');
    }
    return false;
}

static json_t *cond_of(json_t *obj, const char *type)
{
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(json_object_get(obj, "status"), "conditions"), i, c)
    {
        if (strcmp(json_string_value(json_object_get(c, "type")), type) == 0)
            return c;
    }
    return NULL;
}

static void test_certificate_private_key_never_returned(void **state)
{
    fixture_t *f = *state;
    tc_pair_t ok, soon, other;
    tc_make(&ok, TC_EC256, "a.example", "a.example,*.a.example", -3600, 90 * 86400, NULL, false);
    tc_make(&soon, TC_EC256, "s.example", "s.example", -3600, 10 * 86400, NULL, false);
    tc_make(&other, TC_EC256, "a.example", "a.example", -3600, 86400, NULL, false);
    char *doc = tc_certificate_doc("a-example", ok.cert_pem, ok.key_pem);
    resp_t r = req(f, "POST", "/api/v1/certificates", YAML_CT, doc);
    expect_status(&r, 201);
    assert_false(leaks_key(r.raw, ok.key_pem));
    assert_null(json_object_get(json_object_get(r.json, "spec"), "privateKey"));
    assert_non_null(json_object_get(json_object_get(r.json, "spec"), "certificate"));
    resp_free(&r);

    r = req(f, "GET", "/api/v1/certificates/a-example", NULL, NULL);
    expect_status(&r, 200);
    assert_false(leaks_key(r.raw, ok.key_pem));
    assert_null(strstr(r.raw, "privateKey"));
    json_t *facts = json_object_get(json_object_get(r.json, "status"), "certificate");
    assert_string_equal(json_string_value(json_object_get(facts, "subject")), "CN=a.example");
    assert_string_equal(json_string_value(json_object_get(facts, "issuer")), "CN=a.example");
    json_t *dns = json_object_get(facts, "dnsNames");
    assert_int_equal(json_array_size(dns), 2);
    assert_string_equal(json_string_value(json_array_get(dns, 1)), "*.a.example");
    assert_int_equal(strlen(json_string_value(json_object_get(facts, "sha256Fingerprint"))), 64);
    assert_string_equal(json_string_value(json_object_get(facts, "keyType")), "ECDSA P-256");
    assert_non_null(json_string_value(json_object_get(facts, "notAfter")));
    assert_non_null(json_string_value(json_object_get(facts, "notBefore")));
    assert_string_equal(json_string_value(json_object_get(cond_of(r.json, "Expiring"), "status")),
                        "False");
    resp_free(&r);

    /* Ten days left: the warning condition, still accepted. */
    char *doc2 = tc_certificate_doc("soon", soon.cert_pem, soon.key_pem);
    r = req(f, "POST", "/api/v1/certificates", YAML_CT, doc2);
    expect_status(&r, 201);
    resp_free(&r);
    r = req(f, "GET", "/api/v1/certificates/soon", NULL, NULL);
    json_t *exp = cond_of(r.json, "Expiring");
    assert_string_equal(json_string_value(json_object_get(exp, "status")), "True");
    assert_string_equal(json_string_value(json_object_get(exp, "reason")), "ExpiresSoon");
    const char *m = json_string_value(json_object_get(exp, "message"));
    assert_true(strstr(m, ", in 9 days") || strstr(m, ", in 10 days"));
    resp_free(&r);

    /* Lists, across namespaces and in one. */
    r = req(f, "GET", "/api/v1/certificates", NULL, NULL);
    expect_status(&r, 200);
    assert_int_equal(json_array_size(json_object_get(r.json, "items")), 2);
    assert_null(strstr(r.raw, "privateKey"));
    assert_false(leaks_key(r.raw, ok.key_pem) || leaks_key(r.raw, soon.key_pem));
    resp_free(&r);
    r = req(f, "GET", "/api/v1/namespaces/default/certificates", NULL, NULL);
    expect_status(&r, 200);
    assert_null(strstr(r.raw, "privateKey"));
    resp_free(&r);

    /* A key that does not match: 400 with the field, without the key. */
    char *bad = tc_certificate_doc("bad", ok.cert_pem, other.key_pem);
    r = req(f, "POST", "/api/v1/certificates", YAML_CT, bad);
    expect_status(&r, 400);
    assert_non_null(strstr(r.raw, "spec.privateKey"));
    assert_non_null(strstr(r.raw, "does not match the certificate"));
    assert_false(leaks_key(r.raw, other.key_pem));
    resp_free(&r);

    /* The store that holds the key is private to the controller's user. */
    struct stat sb;
    assert_int_equal(stat(f->dir, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0700);
    char db[300];
    snprintf(db, sizeof(db), "%s/sluice.db", f->dir);
    assert_int_equal(stat(db, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    snprintf(db, sizeof(db), "%s/sluice.db-wal", f->dir);
    if (stat(db, &sb) == 0)
        assert_int_equal(sb.st_mode & 0777, 0600);

    free(doc);
    free(doc2);
    free(bad);
    tc_free(&ok);
    tc_free(&soon);
    tc_free(&other);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_health_ready_metrics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_post_create_conflict_and_changed_calls, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_validation_errors_name_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_get_delete_and_preconditions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_merges_status_and_lists, setup, teardown),
        cmocka_unit_test_setup_teardown(test_paths_and_methods, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resources_apply_whole_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_body_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bearer_token, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_only_mode, setup, teardown),
        cmocka_unit_test_setup_teardown(test_listen_address_rules, setup, teardown),
        cmocka_unit_test_setup_teardown(test_browser_requests_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_token, setup, teardown),
        cmocka_unit_test_setup_teardown(test_admission_refusal, setup, teardown),
        cmocka_unit_test_setup_teardown(test_certificate_private_key_never_returned, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
