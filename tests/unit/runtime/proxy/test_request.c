/*
 * Unit tests of runtime/request.c, the protocol-independent request: what
 * any codec gets from sl_request_route for a head (normalised and stripped
 * path, the route, the backend, the hash key, the deadline, or the error to
 * answer), retry decisions, error bodies and the Date line. The generation
 * is built from YAML by the real compiler, as the runtime builds it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "../../../../runtime/proxy/request.c"

#include "compiler.h"
#include "model.h"

#include <jansson.h>

static const char *const config =
    "apiVersion: gateway.sluice.dev/v1alpha1\n"
    "kind: Gateway\n"
    "metadata: {name: g}\n"
    "spec:\n"
    "  listeners: [{name: web, port: 8080}]\n"
    "---\n"
    "apiVersion: gateway.sluice.dev/v1alpha1\n"
    "kind: Backend\n"
    "metadata: {name: b}\n"
    "spec:\n"
    "  endpoints: [{address: 127.0.0.1, port: 9001}, {address: 127.0.0.1, port: 9002}]\n"
    "  loadBalancing: {policy: consistent-hash, hashOn: {header: x-user}}\n"
    "---\n"
    "apiVersion: gateway.sluice.dev/v1alpha1\n"
    "kind: Api\n"
    "metadata: {name: pets}\n"
    "spec:\n"
    "  basePath: /pets\n"
    "  backendRefs: [{name: b}]\n"
    "  maxRequestBodyBytes: 100\n"
    "  timeouts: {request: 2s}\n"
    "  operations:\n"
    "  - {name: get, method: GET, path: \"/{id}\"}\n"
    "  - {name: add, method: POST, path: /}\n";

static sl_generation_t *gen;
static sl_worker_t worker;

static int setup(void **state)
{
    (void)state;
    assert_int_equal(sl_metrics_init(1), 0);
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    if (sl_model_parse(&set, config, strlen(config), "t.yaml", &errs) != 0)
        fail_msg("%s", sl_errors_format(&errs));
    Sluice__V1__Snapshot *snap = sl_compile_snapshot(&set, "default", 1, &errs);
    if (!snap)
        fail_msg("%s", sl_errors_format(&errs));
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
    char err[256] = "";
    gen = sl_generation_build(snap, "test", 1, err, sizeof(err));
    if (!gen)
        fail_msg("sl_generation_build: %s", err);
    memset(&worker, 0, sizeof(worker));
    sl_lb_rng_seed(&worker.rng, 42);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    sl_generation_discard(gen);
    return 0;
}

/* A request on the test generation, without the worker hold (white box: the
 * hold itself is test_generation.c's subject). */
static void begin(sl_request_t *r)
{
    sl_request_init(r, &worker, "192.0.2.7");
    r->gen = gen;
}

static void end(sl_request_t *r)
{
    r->gen = NULL;
    sl_request_reset(r);
}

static sl_req_head_t head(const char *method, const char *path, const sl_header_t *h, size_t n)
{
    sl_req_head_t hd = {
        .method = {method, strlen(method)},
        .method_bit = sl_http1_method_bit(method, strlen(method)),
        .host = {"api.example", 11},
        .authority = {"api.example", 11},
        .path = {path, strlen(path)},
        .target = {path, strlen(path)},
        .headers = h,
        .num_headers = n,
        .version = 11,
        .has_length = 1,
    };
    return hd;
}

static void assert_slice(sl_str_t s, const char *want)
{
    if (s.len != strlen(want) || memcmp(s.ptr, want, s.len) != 0)
        fail_msg("got '%.*s', want '%s'", (int)s.len, s.ptr, want);
}

static void test_route_normalises_strips_and_picks(void **state)
{
    (void)state;
    sl_request_t r;
    begin(&r);
    sl_header_t h[] = {{{"X-User", 6}, {"alice", 5}}};
    sl_req_head_t hd = head("GET", "/pets/a/../7", h, 1);
    sl_request_set_head(&r, &hd);
    sl_str_t path;
    sl_request_error_t err;
    assert_int_equal(sl_request_route(&r, &hd, &path, &err), SL_OK);
    assert_slice(path, "/7"); /* normalised, then the base path stripped */
    assert_non_null(r.route);
    assert_slice(r.route->operation, "get");
    assert_non_null(r.cluster);
    assert_int_equal(r.hash, sl_lb_hash("alice", 5)); /* hashOn: header x-user */
    assert_true(r.deadline_ms > sl_endpoint_now_ms() + 1000);
    assert_int_equal(r.m_reqid.len, 36); /* a new UUID */
    end(&r);
}

static void test_route_errors(void **state)
{
    (void)state;
    struct {
        const char *method, *path;
        int status;
        const char *code;
    } cases[] = {
        {"GET", "/nothing/here", 404, "no_route"},
        {"DELETE", "/pets/7", 405, "method_not_allowed"},
        {"GET", "/pets/%zz", 400, "bad_path"},
        {"GET", "/pets/a%2Fb", 400, "bad_path"}, /* encoded slashes: reject by default */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        sl_request_t r;
        begin(&r);
        sl_req_head_t hd = head(cases[i].method, cases[i].path, NULL, 0);
        sl_request_set_head(&r, &hd);
        sl_str_t path;
        sl_request_error_t err;
        assert_int_equal(sl_request_route(&r, &hd, &path, &err), SL_ERROR);
        if (err.status != cases[i].status || strcmp(err.code, cases[i].code) != 0)
            fail_msg("%s %s: %d %s", cases[i].method, cases[i].path, err.status, err.code);
        if (err.status == 405)
            assert_int_equal(err.allow, SL_METHOD_GET); /* POST is on /pets/ only */
        end(&r);
    }
}

static void test_body_limit_by_announced_length(void **state)
{
    (void)state;
    sl_request_t r;
    begin(&r);
    sl_req_head_t hd = head("POST", "/pets/", NULL, 0);
    hd.content_length = 101;
    sl_str_t path;
    sl_request_error_t err;
    assert_int_equal(sl_request_route(&r, &hd, &path, &err), SL_ERROR);
    assert_int_equal(err.status, 413);
    assert_true(err.close); /* the body is still on the wire */
    end(&r);
    begin(&r);
    hd.content_length = 100;
    assert_int_equal(sl_request_route(&r, &hd, &path, &err), SL_OK);
    /* An unknown length (chunked, or HTTP/2 without content-length) is
     * checked while it streams, not here. */
    end(&r);
    begin(&r);
    hd.has_length = 0;
    hd.content_length = 0;
    assert_int_equal(sl_request_route(&r, &hd, &path, &err), SL_OK);
    end(&r);
}

/* Regression: the Gateway's head limits were applied by the HTTP/1.1 parser
 * only, so an HTTP/2 request with 40 fields passed maxHeaderCount: 20. They
 * hold for an HTTP/2 head here, measured as its HTTP/1.1 head would be. */
static void test_gateway_head_limits_apply_to_http2_heads(void **state)
{
    (void)state;
    sl_http1_limits_t saved = gen->limits;
    gen->limits = (sl_http1_limits_t){
        .max_request_line_bytes = 64, .max_header_bytes = 200, .max_header_count = 3};
    sl_header_t two[] = {{{"x-a", 3}, {"1", 1}}, {{"x-b", 3}, {"2", 1}}};
    sl_header_t three[] = {{{"x-a", 3}, {"1", 1}}, {{"x-b", 3}, {"2", 1}}, {{"x-c", 3}, {"3", 1}}};
    char big[200];
    memset(big, 'b', sizeof(big));
    sl_header_t large[] = {{{"x-big", 5}, {big, sizeof(big)}}};
    struct {
        const char *path;
        const sl_header_t *h;
        size_t n;
        int status; /* 0: routed */
    } cases[] = {
        {"/pets/7", two, 2, 0},     /* 2 fields + Host from :authority */
        {"/pets/7", three, 3, 431}, /* 3 + Host: over maxHeaderCount */
        {"/pets/7", large, 1, 431}, /* over maxHeaderBytes */
        {"/pets/7?q=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", NULL, 0, 414},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (int version = 11; version <= 20; version += 9) {
            sl_request_t r;
            begin(&r);
            sl_req_head_t hd = head("GET", cases[i].path, cases[i].h, cases[i].n);
            hd.version = version;
            if (strchr(cases[i].path, '?'))
                hd.path.len = (size_t)(strchr(cases[i].path, '?') - cases[i].path);
            sl_str_t path;
            sl_request_error_t err;
            int rc = sl_request_route(&r, &hd, &path, &err);
            /* HTTP/1.1 heads were bounded by the parser already. */
            int want = version == 20 ? cases[i].status : 0;
            if (want == 0 && rc != SL_OK)
                fail_msg("case %zu HTTP/%d: %d %s", i, version, err.status, err.code);
            if (want && (rc != SL_ERROR || err.status != want || err.close))
                fail_msg("case %zu HTTP/%d: rc %d status %d", i, version, rc, err.status);
            end(&r);
        }
    }
    gen->limits = saved;
}

static void test_no_generation_is_not_ready(void **state)
{
    (void)state;
    sl_request_t r;
    sl_request_init(&r, &worker, "192.0.2.7");
    sl_req_head_t hd = head("GET", "/pets/1", NULL, 0);
    sl_str_t path;
    sl_request_error_t err;
    assert_int_equal(sl_request_route(&r, &hd, &path, &err), SL_ERROR);
    assert_int_equal(err.status, 503);
    assert_string_equal(err.code, "not_ready");
}

static void test_request_id_kept_only_when_safe(void **state)
{
    (void)state;
    sl_request_t r;
    begin(&r);
    sl_header_t ok[] = {{{"x-request-id", 12}, {"abc-123", 7}}};
    sl_req_head_t hd = head("GET", "/pets/1", ok, 1);
    sl_request_set_head(&r, &hd);
    assert_slice(r.m_reqid, "abc-123");
    end(&r);
    begin(&r);
    sl_header_t bad[] = {{{"x-request-id", 12}, {"a\"b", 3}}};
    hd = head("GET", "/pets/1", bad, 1);
    sl_request_set_head(&r, &hd);
    assert_int_equal(r.m_reqid.len, 36);
    end(&r);
}

static void test_retry_decisions(void **state)
{
    (void)state;
    sl_request_t r;
    begin(&r);
    sl_req_head_t hd = head("GET", "/pets/1", NULL, 0);
    sl_request_set_head(&r, &hd);
    sl_str_t path;
    sl_request_error_t err;
    assert_int_equal(sl_request_route(&r, &hd, &path, &err), SL_OK);
    r.attempts = 1;
    assert_true(sl_request_retry_allowed(&r, SL_UPSTREAM_ERR_RESET, 0, 0));
    assert_true(sl_request_retry_allowed(&r, SL_UPSTREAM_ERR_CONNECT, 0, 0));
    assert_true(sl_request_retry_allowed(&r, SL_UPSTREAM_ERR__COUNT, 502, 0));
    assert_false(sl_request_retry_allowed(&r, SL_UPSTREAM_ERR__COUNT, 503, 0)); /* not default */
    assert_false(sl_request_retry_allowed(&r, SL_UPSTREAM_ERR_RESET, 0, 1));    /* response began */
    assert_true(sl_request_retried_on_reset(&r));
    r.attempts = 2; /* the default allows one retry */
    assert_false(sl_request_retry_allowed(&r, SL_UPSTREAM_ERR_RESET, 0, 0));
    end(&r);

    begin(&r);
    hd = head("POST", "/pets/", NULL, 0);
    sl_request_set_head(&r, &hd);
    assert_int_equal(sl_request_route(&r, &hd, &path, &err), SL_OK);
    r.attempts = 1;
    /* A POST may have reached the origin unless the connection failed. */
    assert_false(sl_request_retry_allowed(&r, SL_UPSTREAM_ERR_RESET, 0, 0));
    assert_true(sl_request_retry_allowed(&r, SL_UPSTREAM_ERR_CONNECT, 0, 0));
    assert_false(sl_request_retried_on_reset(&r));
    end(&r);
}

static void test_error_body_is_json_with_the_id(void **state)
{
    (void)state;
    sl_request_t r;
    begin(&r);
    char buf[900];
    size_t n = sl_request_error_body(&r, 404, "no_route", "no \"route\"\n", buf, sizeof(buf));
    assert_int_equal(n, strlen(buf));
    json_error_t jerr;
    json_t *j = json_loadb(buf, n, 0, &jerr);
    assert_non_null(j);
    json_t *e = json_object_get(j, "error");
    assert_int_equal(json_integer_value(json_object_get(e, "status")), 404);
    assert_string_equal(json_string_value(json_object_get(e, "code")), "no_route");
    assert_string_equal(json_string_value(json_object_get(e, "message")), "no \"route\"\n");
    assert_int_equal(strlen(json_string_value(json_object_get(e, "request_id"))), 36);
    json_decref(j);
    end(&r);
}

static void test_date_line(void **state)
{
    (void)state;
    size_t n;
    const char *d = sl_request_date_line(&n);
    /* "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n" */
    assert_int_equal(n, 37);
    assert_memory_equal(d, "Date: ", 6);
    assert_memory_equal(d + n - 6, " GMT\r\n", 6);
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    char copy[64];
    memcpy(copy, d + 6, n - 8);
    copy[n - 8] = '\0';
    assert_non_null(strptime(copy, "%a, %d %b %Y %H:%M:%S GMT", &tm));
    time_t t = timegm(&tm);
    time_t now = time(NULL);
    assert_true(t <= now && now - t <= 2);
}

static void test_grpc_status_and_timeout(void **state)
{
    (void)state;
    assert_int_equal(sl_request_grpc_status(404, "no_route"), 12);
    assert_int_equal(sl_request_grpc_status(405, "method_not_allowed"), 12);
    assert_int_equal(sl_request_grpc_status(502, "upstream_connect_failed"), 14);
    assert_int_equal(sl_request_grpc_status(503, "no_healthy_upstream"), 14);
    assert_int_equal(sl_request_grpc_status(503, "upstream_pool_full"), 8);
    assert_int_equal(sl_request_grpc_status(413, "payload_too_large"), 8);
    assert_int_equal(sl_request_grpc_status(504, "request_timeout"), 4);
    assert_int_equal(sl_request_grpc_status(504, "upstream_timeout"), 4);
    assert_int_equal(sl_request_grpc_status(400, "bad_path"), 13);
    struct {
        const char *v;
        uint32_t ms;
    } cases[] = {{"1S", 1000},      {"250m", 250}, {"2M", 120000}, {"1H", 3600000},
                 {"1500u", 2},      {"1n", 1},     {"0m", 1},      {"99999999m", 99999999},
                 {"123456789m", 0}, {"m", 0},      {"10x", 0},     {"-1S", 0},
                 {"1.5S", 0}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        sl_str_t v = {cases[i].v, strlen(cases[i].v)};
        if (parse_grpc_timeout(v) != cases[i].ms)
            fail_msg("grpc-timeout %s: %u, want %u", cases[i].v, parse_grpc_timeout(v),
                     cases[i].ms);
    }
    /* The shorter of the route's deadline and the client's wins. */
    sl_request_t r;
    begin(&r);
    sl_header_t h[] = {{{"content-type", 12}, {"application/grpc+proto", 22}},
                       {{"grpc-timeout", 12}, {"100m", 4}}};
    sl_req_head_t hd = head("GET", "/pets/1", h, 2);
    sl_request_set_head(&r, &hd);
    assert_true(r.grpc);
    sl_str_t path;
    sl_request_error_t err;
    assert_int_equal(sl_request_route(&r, &hd, &path, &err), SL_OK);
    assert_true(r.deadline_ms <= sl_endpoint_now_ms() + 100);
    end(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route_normalises_strips_and_picks),
        cmocka_unit_test(test_route_errors),
        cmocka_unit_test(test_body_limit_by_announced_length),
        cmocka_unit_test(test_gateway_head_limits_apply_to_http2_heads),
        cmocka_unit_test(test_no_generation_is_not_ready),
        cmocka_unit_test(test_request_id_kept_only_when_safe),
        cmocka_unit_test(test_retry_decisions),
        cmocka_unit_test(test_error_body_is_json_with_the_id),
        cmocka_unit_test(test_date_line),
        cmocka_unit_test(test_grpc_status_and_timeout),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
