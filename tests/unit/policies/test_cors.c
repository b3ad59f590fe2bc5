/* cors: origin matching (exact, "*", anchored patterns), preflight checks
 * and the headers it adds, validation of credentials with "*". */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../../../policies/cors/cors.c"
#include "model.h"

static cors_t *make(const char *json)
{
    json_error_t je;
    json_t *cfg = json_loads(json, 0, &je);
    assert_non_null(cfg);
    char err[128];
    cors_t *c = compile(cfg, NULL, err, sizeof(err));
    json_decref(cfg);
    assert_non_null(c);
    return c;
}

static int allowed(const cors_t *c, const char *origin)
{
    pcre2_match_data *md = worker_new(c);
    int a = origin_allowed(c, (sl_str_t){origin, strlen(origin)}, md);
    worker_free(md);
    return a;
}

static void test_origin_matching(void **st)
{
    (void)st;
    cors_t *c = make("{\"allowOrigins\": [\"https://App.example.com\"],"
                     " \"allowOriginPatterns\": [\"https://[a-z]+\\\\.example\\\\.org\"]}");
    assert_true(allowed(c, "https://app.example.com"));
    assert_true(allowed(c, "HTTPS://APP.EXAMPLE.COM"));
    assert_false(allowed(c, "https://app.example.com:8443"));
    assert_false(allowed(c, "http://app.example.com"));
    assert_true(allowed(c, "https://shop.example.org"));
    assert_false(allowed(c, "https://shop.example.org.evil.net")); /* end anchored */
    assert_false(allowed(c, "xhttps://shop.example.org"));         /* start anchored */
    assert_false(allowed(c, ""));
    cfree(c);
    c = make("{\"allowOrigins\": [\"*\"]}");
    assert_true(allowed(c, "https://anything.example"));
    assert_false(c->origin_dependent);
    cfree(c);
}

typedef struct {
    sl_policy_req_t r;
    sl_policy_header_t h[4];
    sl_hdr_edit_t edits[2][16];
    char arena[1024];
} req_t;

static void req_init(req_t *q, const char *method, const char *const *hdrs, size_t n)
{
    memset(q, 0, sizeof(*q));
    q->r.method = (sl_str_t){method, strlen(method)};
    q->r.path = (sl_str_t){"/t/items", 8};
    for (size_t i = 0; i < n; i++)
        q->h[i] = (sl_policy_header_t){{hdrs[2 * i], strlen(hdrs[2 * i])},
                                       {hdrs[2 * i + 1], strlen(hdrs[2 * i + 1])}};
    q->r.headers = q->h;
    q->r.num_headers = n;
    q->r.req_edits = q->edits[0];
    q->r.resp_edits = q->edits[1];
    q->r.max_edits = 16;
    q->r.arena = q->arena;
    q->r.arena_cap = sizeof(q->arena);
}

static const char *resp_header(const req_t *q, const char *name)
{
    static char buf[256];
    for (unsigned i = 0; i < q->r.num_resp_edits; i++)
        if (strcasecmp(q->edits[1][i].name, name) == 0 && q->edits[1][i].op != SL_HDR_REMOVE) {
            snprintf(buf, sizeof(buf), "%.*s", (int)q->edits[1][i].value_len,
                     q->edits[1][i].value);
            return buf;
        }
    return NULL;
}

static void test_preflight(void **st)
{
    (void)st;
    cors_t *c = make("{\"allowOrigins\": [\"https://a.example\"], \"allowCredentials\": true,"
                     " \"allowHeaders\": [\"X-Trace\"], \"maxAgeSeconds\": 60}");
    static const char *const route_methods[] = {"GET", "PUT"};
    pcre2_match_data *md = worker_new(c);
    req_t q;
    sl_policy_reply_t reply;
    const char *ok[] = {"Origin", "https://a.example", "Access-Control-Request-Method", "PUT",
                        "Access-Control-Request-Headers", "x-trace"};
    req_init(&q, "OPTIONS", ok, 3);
    q.r.route_methods = route_methods;
    q.r.num_route_methods = 2;
    q.r.worker_state = md;
    memset(&reply, 0, sizeof(reply));
    assert_int_equal(on_request(c, &q.r, &reply), SL_POLICY_REPLY);
    assert_int_equal(reply.status, 204);
    assert_string_equal(resp_header(&q, "Access-Control-Allow-Origin"), "https://a.example");
    assert_string_equal(resp_header(&q, "Access-Control-Allow-Credentials"), "true");
    assert_string_equal(resp_header(&q, "Access-Control-Allow-Methods"), "GET, PUT");
    assert_string_equal(resp_header(&q, "Access-Control-Allow-Headers"), "x-trace");
    assert_string_equal(resp_header(&q, "Access-Control-Max-Age"), "60");

    const char *bad_method[] = {"Origin", "https://a.example", "Access-Control-Request-Method",
                                "DELETE"};
    req_init(&q, "OPTIONS", bad_method, 2);
    q.r.route_methods = route_methods;
    q.r.num_route_methods = 2;
    q.r.worker_state = md;
    memset(&reply, 0, sizeof(reply));
    assert_int_equal(on_request(c, &q.r, &reply), SL_POLICY_REPLY);
    assert_int_equal(reply.status, 403);
    assert_string_equal(reply.code, "cors_rejected");

    /* An actual request from an allowed origin: headers, no reply. */
    const char *actual[] = {"Origin", "https://a.example"};
    req_init(&q, "GET", actual, 1);
    q.r.worker_state = md;
    assert_int_equal(on_request(c, &q.r, &reply), SL_POLICY_CONTINUE);
    assert_string_equal(resp_header(&q, "Access-Control-Allow-Origin"), "https://a.example");
    assert_string_equal(resp_header(&q, "Vary"), "Origin");
    worker_free(md);
    cfree(c);
}

static int errors_for(const char *json, const char *want)
{
    json_error_t je;
    json_t *cfg = json_loads(json, 0, &je);
    sl_errors_t errs;
    memset(&errs, 0, sizeof(errs));
    sl_vctx_t ctx = {.errs = &errs, .source = "t"};
    sl_vcheck_object(&ctx, cfg, &schema);
    json_decref(cfg);
    int found = 0;
    for (size_t i = 0; i < errs.count; i++)
        found |= strstr(errs.items[i].message, want) != NULL ||
                 strstr(errs.items[i].field, want) != NULL;
    sl_errors_free(&errs);
    return found;
}

static void test_validation(void **st)
{
    (void)st;
    assert_true(errors_for("{\"allowOrigins\": [\"*\"], \"allowCredentials\": true}",
                           "allowOrigins[0]"));
    assert_true(errors_for("{\"allowOrigins\": [\"https://a/\"]}", "not an origin"));
    assert_true(errors_for("{}", "allowOrigins or allowOriginPatterns"));
    assert_false(errors_for("{\"allowOrigins\": [\"https://a.example:8443\"], "
                            "\"allowCredentials\": true}", "allowOrigins"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_origin_matching),
        cmocka_unit_test(test_preflight),
        cmocka_unit_test(test_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
