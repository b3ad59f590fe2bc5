/*
 * Unit tests of the ip-filter policy (policies/ip-filter/ip_filter.c):
 * CIDR parsing and its error messages, the compiled ranges (sorted,
 * merged, binary search), IPv4-mapped clients, X-Forwarded-For selection
 * and the allow/deny decision.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../../../policies/ip-filter/ip_filter.c"

static addr_t A(const char *s)
{
    addr_t a = 0;
    assert_int_equal(parse_addr(s, strlen(s), &a), 0);
    return a;
}

static void test_parse_cidr(void **st)
{
    (void)st;
    range_t r;
    char why[256];
    assert_int_equal(parse_cidr("10.0.0.0/8", &r, why, sizeof(why)), 0);
    assert_true(r.first == A("10.0.0.0") && r.last == A("10.255.255.255"));
    assert_int_equal(parse_cidr("192.0.2.7", &r, why, sizeof(why)), 0);
    assert_true(r.first == r.last && r.first == A("192.0.2.7"));
    assert_int_equal(parse_cidr("0.0.0.0/0", &r, why, sizeof(why)), 0);
    assert_true(r.first == A("0.0.0.0") && r.last == A("255.255.255.255"));
    assert_int_equal(parse_cidr("2001:db8::/32", &r, why, sizeof(why)), 0);
    assert_true(r.first == A("2001:db8::") &&
                r.last == A("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"));
    assert_int_equal(parse_cidr("::/0", &r, why, sizeof(why)), 0);
    assert_true(r.first == 0 && r.last == ~(addr_t)0);
    assert_int_equal(parse_cidr("::1", &r, why, sizeof(why)), 0);
    assert_true(r.first == 1 && r.last == 1);

    assert_int_equal(parse_cidr("10.0.0.1/8", &r, why, sizeof(why)), -1);
    assert_string_equal(why,
                        "'10.0.0.1/8' has bits set after the prefix (did you mean 10.0.0.0/8?)");
    assert_int_equal(parse_cidr("2001:db8::1/32", &r, why, sizeof(why)), -1);
    assert_string_equal(why, "'2001:db8::1/32' has bits set after the prefix (did you mean "
                             "2001:db8::/32?)");
    assert_int_equal(parse_cidr("10.0.0.0/33", &r, why, sizeof(why)), -1);
    assert_string_equal(why, "'10.0.0.0/33': the prefix length must be 0 to 32");
    assert_int_equal(parse_cidr("::/129", &r, why, sizeof(why)), -1);
    assert_int_equal(parse_cidr("10.0.0.0/", &r, why, sizeof(why)), -1);
    assert_int_equal(parse_cidr("10.0.0.0/08", &r, why, sizeof(why)), -1);
    assert_int_equal(parse_cidr("10.0.0.0/8x", &r, why, sizeof(why)), -1);
    assert_int_equal(parse_cidr("10.0.0/8", &r, why, sizeof(why)), -1);
    assert_int_equal(parse_cidr("example.com", &r, why, sizeof(why)), -1);
    assert_string_equal(why, "'example.com' is not an IPv4 or IPv6 address or CIDR (10.0.0.0/8, "
                             "2001:db8::/32, 192.0.2.7)");
    assert_int_equal(parse_cidr("", &r, why, sizeof(why)), -1);
}

static ip_filter_t *make(const char *json)
{
    json_error_t je;
    json_t *cfg = json_loads(json, 0, &je);
    assert_non_null(cfg);
    char err[256];
    sl_policy_env_t env = {NULL, 1, NULL};
    ip_filter_t *f = compile(cfg, &env, err, sizeof(err));
    json_decref(cfg);
    assert_non_null(f);
    return f;
}

static void test_ranges_merge_and_match(void **st)
{
    (void)st;
    ip_filter_t *f = make("{\"allow\": [\"10.1.0.0/16\", \"10.0.0.0/16\", \"10.0.5.0/24\","
                          "\"192.0.2.9\", \"192.0.2.8\", \"2001:db8::/32\", \"::1\"]}");
    /* 10.0/16 + 10.1/16 adjacent -> one; 10.0.5/24 inside; .8 + .9 adjacent */
    assert_int_equal(f->allow.n, 4);
    for (size_t i = 1; i < f->allow.n; i++)
        assert_true(f->allow.r[i - 1].last < f->allow.r[i].first);
    assert_true(ranges_match(&f->allow, A("10.0.0.0")));
    assert_true(ranges_match(&f->allow, A("10.1.255.255")));
    assert_false(ranges_match(&f->allow, A("10.2.0.0")));
    assert_false(ranges_match(&f->allow, A("9.255.255.255")));
    assert_true(ranges_match(&f->allow, A("192.0.2.8")));
    assert_true(ranges_match(&f->allow, A("192.0.2.9")));
    assert_false(ranges_match(&f->allow, A("192.0.2.10")));
    assert_true(ranges_match(&f->allow, A("2001:db8:1::5")));
    assert_false(ranges_match(&f->allow, A("2001:db9::")));
    assert_true(ranges_match(&f->allow, A("::1")));
    assert_false(ranges_match(&f->allow, A("::2")));
    assert_false(ranges_match(&f->allow, A("::")));
    /* a dual-stack listener's IPv4-mapped client matches the IPv4 rule */
    assert_true(ranges_match(&f->allow, A("::ffff:10.0.3.4")));
    assert_false(ranges_match(&f->deny, A("10.0.0.0"))); /* empty list */
    filter_free(f);
}

static int decide(ip_filter_t *f, const char *client, const sl_policy_header_t *h, size_t nh)
{
    sl_policy_req_t req;
    memset(&req, 0, sizeof(req));
    req.client_ip = client;
    req.headers = h;
    req.num_headers = nh;
    sl_policy_reply_t reply;
    memset(&reply, 0, sizeof(reply));
    int rc = on_request(f, &req, &reply);
    if (rc == SL_POLICY_REPLY) {
        assert_int_equal(reply.status, 403);
        assert_string_equal(reply.code, "forbidden");
    }
    return rc == SL_POLICY_CONTINUE;
}

static void test_decision(void **st)
{
    (void)st;
    ip_filter_t *f = make("{\"allow\": [\"127.0.0.0/8\"], \"deny\": [\"127.0.0.2\"]}");
    assert_true(decide(f, "127.0.0.1", NULL, 0));
    assert_false(decide(f, "127.0.0.2", NULL, 0)); /* deny wins */
    assert_false(decide(f, "10.0.0.1", NULL, 0));  /* not in allow */
    assert_false(decide(f, "::1", NULL, 0));
    assert_false(decide(f, "garbage", NULL, 0)); /* closed */
    assert_false(decide(f, NULL, NULL, 0));
    filter_free(f);
    f = make("{\"deny\": [\"10.0.0.0/8\"]}");
    assert_true(decide(f, "127.0.0.1", NULL, 0)); /* deny only: the rest passes */
    assert_false(decide(f, "10.9.9.9", NULL, 0));
    assert_false(decide(f, "::ffff:10.9.9.9", NULL, 0));
    filter_free(f);
}

static int xff(const char *v1, const char *v2, unsigned n, addr_t *out)
{
    sl_policy_header_t h[3] = {{{"X-Forwarded-For", 15}, {v1, strlen(v1)}},
                               {{"Via", 3}, {"1.1 x", 5}},
                               {{"x-forwarded-for", 15}, {v2 ? v2 : "", v2 ? strlen(v2) : 0}}};
    return client_from_xff(h, v2 ? 3 : 2, n, out);
}

static void test_xff(void **st)
{
    (void)st;
    addr_t a;
    assert_int_equal(xff("1.1.1.1, 2.2.2.2, 3.3.3.3", NULL, 1, &a), 0);
    assert_true(a == A("3.3.3.3"));
    assert_int_equal(xff("1.1.1.1, 2.2.2.2, 3.3.3.3", NULL, 2, &a), 0);
    assert_true(a == A("2.2.2.2"));
    assert_int_equal(xff("1.1.1.1, 2.2.2.2, 3.3.3.3", NULL, 3, &a), 0);
    assert_true(a == A("1.1.1.1"));
    assert_int_equal(xff("1.1.1.1, 2.2.2.2, 3.3.3.3", NULL, 4, &a), -1); /* too few */
    /* two header lines are one list, in order */
    assert_int_equal(xff("1.1.1.1, 2.2.2.2", "3.3.3.3,4.4.4.4", 3, &a), 0);
    assert_true(a == A("2.2.2.2"));
    /* ports and brackets */
    assert_int_equal(xff("[2001:db8::7]:443", NULL, 1, &a), 0);
    assert_true(a == A("2001:db8::7"));
    assert_int_equal(xff("[2001:db8::7]", NULL, 1, &a), 0);
    assert_int_equal(xff("  192.0.2.1:8080 ", NULL, 1, &a), 0);
    assert_true(a == A("192.0.2.1"));
    assert_int_equal(xff("2001:db8::8", NULL, 1, &a), 0);
    assert_true(a == A("2001:db8::8"));
    /* malformed: the caller falls back to the connection */
    assert_int_equal(xff("unknown", NULL, 1, &a), -1);
    assert_int_equal(xff("1.1.1.1, ", NULL, 1, &a), -1);
    assert_int_equal(xff("192.0.2.1:", NULL, 1, &a), -1);
    assert_int_equal(xff("[192.0.2.1]", NULL, 1, &a), -1);
    assert_int_equal(xff("[2001:db8::7]x", NULL, 1, &a), -1);
    assert_int_equal(xff("300.1.1.1", NULL, 1, &a), -1);
    /* only the chosen entry matters: junk to its left is the client's */
    assert_int_equal(xff("junk, 5.5.5.5", NULL, 1, &a), 0);
}

static void test_xff_decision(void **st)
{
    (void)st;
    ip_filter_t *f = make("{\"allow\": [\"203.0.113.0/24\"], \"trustedProxies\": 1}");
    sl_policy_header_t h[] = {{{"X-Forwarded-For", 15}, {"10.0.0.1, 203.0.113.5", 21}}};
    assert_true(decide(f, "127.0.0.1", h, 1));
    sl_policy_header_t spoof[] = {{{"X-Forwarded-For", 15}, {"203.0.113.5, 10.0.0.1", 21}}};
    assert_false(decide(f, "127.0.0.1", spoof, 1)); /* the left entry is the client's */
    sl_policy_header_t bad[] = {{{"X-Forwarded-For", 15}, {"nope", 4}}};
    assert_false(decide(f, "127.0.0.1", bad, 1));   /* falls back to 127.0.0.1 */
    assert_true(decide(f, "203.0.113.9", bad, 1));  /* ... which the list decides on */
    assert_true(decide(f, "203.0.113.9", NULL, 0)); /* no XFF: the connection */
    filter_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_cidr),   cmocka_unit_test(test_ranges_merge_and_match),
        cmocka_unit_test(test_decision),     cmocka_unit_test(test_xff),
        cmocka_unit_test(test_xff_decision),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
