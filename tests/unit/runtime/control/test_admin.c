/*
 * Unit tests of runtime/admin.c: a real admin listener on 127.0.0.1:0 whose
 * event_base runs in a thread, queried over real TCP sockets; plus address
 * parsing and bind errors.
 */
#include "admin.c"

#include <ctype.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <sys/time.h>
#include <unistd.h>
#include <cmocka.h>

static atomic_int ready_flag;
static atomic_int dump_calls;
static json_t *dump_doc; /* returned (with a new reference) by the hook */

static int hook_is_ready(void *ctx)
{
    /* Runs on the loop thread: no cmocka assert here; a wrong ctx simply
     * never reports ready and test_ready_follows_hook fails. */
    return ctx == &ready_flag && atomic_load(&ready_flag);
}

static atomic_int note_flag; /* 1: the note hook says something */

static void hook_ready_note(void *ctx, char *buf, size_t len)
{
    (void)ctx;
    if (atomic_load(&note_flag))
        snprintf(buf, len, "serving the cached config version 7");
}

static json_t *hook_config_dump(void *ctx)
{
    (void)ctx;
    atomic_fetch_add(&dump_calls, 1);
    return dump_doc ? json_incref(dump_doc) : NULL;
}

typedef struct {
    struct event_base *base;
    sl_admin_t *admin;
    pthread_t loop;
    int port;
} fixture_t;

static void *run_loop(void *p)
{
    fixture_t *f = p;
    event_base_loop(f->base, EVLOOP_NO_EXIT_ON_EMPTY);
    return NULL;
}

static int setup(void **state)
{
    static int threads_on;
    if (!threads_on) {
        assert_int_equal(evthread_use_pthreads(), 0);
        threads_on = 1;
    }
    fixture_t *f = calloc(1, sizeof(*f));
    f->base = event_base_new();
    assert_non_null(f->base);
    sl_admin_hooks_t hooks = {.is_ready = hook_is_ready,
                              .ready_note = hook_ready_note,
                              .config_dump = hook_config_dump,
                              .ctx = &ready_flag};
    char err[256];
    f->admin = sl_admin_start(f->base, "127.0.0.1:0", &hooks, err, sizeof(err));
    if (!f->admin)
        fail_msg("sl_admin_start: %s", err);
    f->port = sl_admin_port(f->admin);
    assert_true(f->port > 0 && f->port < 65536);
    atomic_store(&ready_flag, 0);
    atomic_store(&dump_calls, 0);
    dump_doc = NULL;
    assert_int_equal(pthread_create(&f->loop, NULL, run_loop, f), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    event_base_loopexit(f->base, NULL);
    pthread_join(f->loop, NULL);
    sl_admin_free(f->admin);
    event_base_free(f->base);
    free(f);
    if (dump_doc)
        json_decref(dump_doc);
    dump_doc = NULL;
    return 0;
}

typedef struct {
    int status;
    char headers[4096]; /* lower-cased header block */
    char *body;
    size_t body_len;
} response_t;

/* Sends `request` verbatim, reads until the server closes, splits the reply.
 * Receive timeout so a broken server fails the test instead of hanging it. */
static void http_exchange(int port, const char *request, response_t *r)
{
    memset(r, 0, sizeof(*r));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    size_t len = strlen(request);
    assert_int_equal(write(fd, request, len), (ssize_t)len);

    size_t cap = 1 << 16, used = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (used == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
        ssize_t n = read(fd, buf + used, cap - used);
        if (n < 0)
            fail_msg("read from admin: %s", strerror(errno));
        if (n == 0)
            break;
        used += (size_t)n;
    }
    close(fd);
    buf[used] = '\0';
    char *head_end = strstr(buf, "\r\n\r\n");
    assert_non_null(head_end);
    assert_int_equal(sscanf(buf, "HTTP/1.%*d %d", &r->status), 1);
    size_t hlen = (size_t)(head_end - buf);
    if (hlen >= sizeof(r->headers))
        hlen = sizeof(r->headers) - 1;
    for (size_t i = 0; i < hlen; i++)
        r->headers[i] = (char)tolower((unsigned char)buf[i]);
    r->body_len = used - (size_t)(head_end + 4 - buf);
    r->body = malloc(r->body_len + 1);
    memcpy(r->body, head_end + 4, r->body_len);
    r->body[r->body_len] = '\0';
    free(buf);
}

static void get(int port, const char *method, const char *target, response_t *r)
{
    char req[512];
    snprintf(req, sizeof(req), "%s %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
             method, target);
    http_exchange(port, req, r);
}

static void assert_json_error(const response_t *r, int status, const char *code)
{
    assert_int_equal(r->status, status);
    assert_non_null(strstr(r->headers, "content-type: application/json"));
    json_error_t jerr;
    json_t *doc = json_loadb(r->body, r->body_len, 0, &jerr);
    if (!doc)
        fail_msg("error body is not JSON: %s (%s)", jerr.text, r->body);
    json_t *e = json_object_get(doc, "error");
    assert_true(json_is_object(e));
    assert_int_equal(json_integer_value(json_object_get(e, "status")), status);
    assert_string_equal(json_string_value(json_object_get(e, "code")), code);
    assert_true(json_is_string(json_object_get(e, "message")));
    json_decref(doc);
}

static void test_live(void **state)
{
    fixture_t *f = *state;
    response_t r;
    get(f->port, "GET", "/live", &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "ok\n");
    assert_non_null(strstr(r.headers, "content-type: text/plain"));
    free(r.body);
}

static void test_ready_follows_hook(void **state)
{
    fixture_t *f = *state;
    response_t r;
    get(f->port, "GET", "/ready", &r);
    assert_int_equal(r.status, 503);
    assert_string_equal(r.body, "not ready\n");
    free(r.body);
    atomic_store(&ready_flag, 1);
    get(f->port, "GET", "/ready", &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "ready\n");
    free(r.body);
    /* The note (a cached config) is added to the line, the status is the
     * readiness alone. */
    atomic_store(&note_flag, 1);
    get(f->port, "GET", "/ready", &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "ready: serving the cached config version 7\n");
    free(r.body);
    atomic_store(&note_flag, 0);
}

static void test_metrics_page(void **state)
{
    fixture_t *f = *state;
    sl_route_stats_t *s = sl_metrics_route_acquire("petstore", "listPets");
    sl_metrics_observe(s, 0, 200, 1200);
    response_t r;
    get(f->port, "GET", "/metrics?debug=1", &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.headers, "content-type: text/plain; version=0.0.4"));
    assert_non_null(strstr(r.body, "# TYPE sluice_requests_total counter\n"));
    assert_non_null(strstr(
        r.body,
        "sluice_requests_total{api=\"petstore\",operation=\"listPets\",code_class=\"2xx\"} 1\n"));
    assert_non_null(strstr(r.body, "sluice_connections_active "));
    free(r.body);
    sl_metrics_route_release(s);
}

static void test_config_dump_without_config_is_503_json(void **state)
{
    fixture_t *f = *state;
    response_t r;
    get(f->port, "GET", "/config_dump", &r);
    assert_json_error(&r, 503, "no_config");
    assert_int_equal(atomic_load(&dump_calls), 1);
    free(r.body);
}

static void test_config_dump_returns_hook_document(void **state)
{
    fixture_t *f = *state;
    dump_doc = json_pack("{s:I,s:s,s:[{s:s}]}", "version", (json_int_t)7, "state", "active",
                         "route_tables", "name", "default/petstore");
    response_t r;
    get(f->port, "GET", "/config_dump", &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.headers, "content-type: application/json"));
    json_t *got = json_loadb(r.body, r.body_len, 0, NULL);
    assert_non_null(got);
    assert_true(json_equal(got, dump_doc));
    json_decref(got);
    free(r.body);
    /* The admin dropped its reference: only ours is left. */
    assert_int_equal(dump_doc->refcount, 1);
}

static void test_unknown_path_is_404_json(void **state)
{
    fixture_t *f = *state;
    response_t r;
    get(f->port, "GET", "/nope", &r);
    assert_json_error(&r, 404, "not_found");
    free(r.body);
    /* A hostile path is not reflected into the body. */
    get(f->port, "GET", "/%22%3Cscript%3E", &r);
    assert_json_error(&r, 404, "not_found");
    assert_null(strstr(r.body, "script"));
    free(r.body);
    get(f->port, "GET", "/live/extra", &r);
    assert_json_error(&r, 404, "not_found");
    free(r.body);
}

static void test_non_get_is_405_with_allow(void **state)
{
    fixture_t *f = *state;
    static const char *const methods[] = {"POST", "PUT", "DELETE", "PATCH", "OPTIONS"};
    for (size_t i = 0; i < SL_ARRAY_LEN(methods); i++) {
        response_t r;
        char req[256];
        snprintf(
            req, sizeof(req),
            "%s /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
            methods[i]);
        http_exchange(f->port, req, &r);
        assert_json_error(&r, 405, "method_not_allowed");
        assert_non_null(strstr(r.headers, "allow: get, head"));
        free(r.body);
    }
}

static void test_head_has_no_body(void **state)
{
    fixture_t *f = *state;
    response_t r;
    get(f->port, "HEAD", "/live", &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.body_len, 0);
    assert_non_null(strstr(r.headers, "content-length: 3\r\n"));
    free(r.body);
}

/* Oversized head: answered with an error, the listener keeps serving. */
static void test_oversized_request_rejected(void **state)
{
    fixture_t *f = *state;
    size_t big = ADMIN_MAX_HEADER_BYTES * 2;
    char *req = malloc(big + 128);
    int n = snprintf(req, big + 128, "GET /live HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(req + n, 'a', big);
    strcpy(req + n + big, "\r\nConnection: close\r\n\r\n");
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((unsigned short)f->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ssize_t w = send(fd, req, strlen(req), MSG_NOSIGNAL);
    (void)w; /* the server may close before reading everything */
    char buf[256] = {0};
    ssize_t got = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    free(req);
    if (got > 0) /* evhttp answers 431 or closes; it must never be 200 */
        assert_null(strstr(buf, " 200 "));
    response_t r;
    get(f->port, "GET", "/live", &r);
    assert_int_equal(r.status, 200);
    free(r.body);
}

static void test_address_in_use_names_address_and_fix(void **state)
{
    fixture_t *f = *state;
    char addr[64], err[256];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", f->port);
    struct event_base *base = event_base_new();
    sl_admin_t *second = sl_admin_start(base, addr, NULL, err, sizeof(err));
    assert_null(second);
    assert_non_null(strstr(err, addr));
    assert_non_null(strstr(err, "Address already in use"));
    assert_non_null(strstr(err, "--admin"));
    event_base_free(base);
}

static void test_bad_addresses_rejected(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",
        "127.0.0.1",
        "127.0.0.1:",
        "127.0.0.1:99999",
        "127.0.0.1:80a",
        ":9901",
        "::1:9901",
        "[::1]9901",
        "[::1",
        "[nothost]:9901",
        "a b:9901",
        "127.0.0.1:-1",
        "127.0.0.1:123456",
    };
    struct event_base *base = event_base_new();
    for (size_t i = 0; i < SL_ARRAY_LEN(bad); i++) {
        char err[256] = "";
        sl_admin_t *a = sl_admin_start(base, bad[i], NULL, err, sizeof(err));
        if (a)
            fail_msg("accepted bad admin address '%s'", bad[i]);
        assert_true(strncmp(err, "admin ", 6) == 0);
        if (bad[i][0])
            assert_non_null(strstr(err, bad[i]));
    }
    assert_null(sl_admin_start(base, NULL, NULL, NULL, 0));
    event_base_free(base);
}

static void test_off_serves_nothing(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    char err[128];
    sl_admin_t *a = sl_admin_start(base, "off", NULL, err, sizeof(err));
    assert_non_null(a);
    assert_int_equal(sl_admin_port(a), -1);
    sl_admin_free(a);
    sl_admin_free(NULL);
    assert_int_equal(sl_admin_port(NULL), -1);
    event_base_free(base);
}

/* Without hooks the runtime is never ready and has nothing to dump. */
static void test_no_hooks_means_not_ready(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    char err[128];
    fixture_t f = {.base = base};
    f.admin = sl_admin_start(base, "localhost:0", NULL, err, sizeof(err));
    assert_non_null(f.admin);
    f.port = sl_admin_port(f.admin);
    assert_int_equal(pthread_create(&f.loop, NULL, run_loop, &f), 0);
    response_t r;
    get(f.port, "GET", "/ready", &r);
    assert_int_equal(r.status, 503);
    free(r.body);
    get(f.port, "GET", "/config_dump", &r);
    assert_json_error(&r, 503, "no_config");
    free(r.body);
    event_base_loopexit(base, NULL);
    pthread_join(f.loop, NULL);
    sl_admin_free(f.admin);
    event_base_free(base);
}

static void test_ipv6_loopback(void **state)
{
    (void)state;
    int probe = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 sa6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    int have_v6 = probe >= 0 && bind(probe, (struct sockaddr *)&sa6, sizeof(sa6)) == 0;
    if (probe >= 0)
        close(probe);
    struct event_base *base = event_base_new();
    char err[256];
    sl_admin_t *a = sl_admin_start(base, "[::1]:0", NULL, err, sizeof(err));
    if (have_v6) {
        if (!a)
            fail_msg("[::1]:0 should bind: %s", err);
        assert_true(sl_admin_port(a) > 0);
        sl_admin_free(a);
    } else {
        assert_null(a);
        assert_non_null(strstr(err, "[::1]:0"));
    }
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_live, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ready_follows_hook, setup, teardown),
        cmocka_unit_test_setup_teardown(test_metrics_page, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_dump_without_config_is_503_json, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_config_dump_returns_hook_document, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_path_is_404_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_non_get_is_405_with_allow, setup, teardown),
        cmocka_unit_test_setup_teardown(test_head_has_no_body, setup, teardown),
        cmocka_unit_test_setup_teardown(test_oversized_request_rejected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_address_in_use_names_address_and_fix, setup, teardown),
        cmocka_unit_test(test_bad_addresses_rejected),
        cmocka_unit_test(test_off_serves_nothing),
        cmocka_unit_test(test_no_hooks_means_not_ready),
        cmocka_unit_test(test_ipv6_loopback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
