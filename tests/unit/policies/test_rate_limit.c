/*
 * Unit tests of the rate-limit policy (policies/rate-limit/): GCRA's
 * arithmetic, the bucket table's reuse and eviction, the config's
 * validation with field paths, and the hook's replies and headers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "model.h"
#include "policy.h"
#include "rate-limit/rl_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEC 1000000000ull
#define MS 1000000ull

static void test_gcra_burst_then_rate(void **st)
{
    (void)st;
    sl_rl_gcra_t g = sl_rl_gcra_make(5, SEC);
    assert_int_equal(g.emission_ns, 200 * MS);
    assert_int_equal(g.capacity_ns, SEC);
    uint64_t tat = 0, now = 1000 * SEC;
    sl_rl_verdict_t v;
    for (uint64_t i = 0; i < 5; i++) {
        assert_int_equal(sl_rl_gcra_step(&g, tat, now, &tat, &v), 1);
        assert_int_equal(v.remaining, 4 - i);
        assert_int_equal(v.reset_ns, (i + 1) * 200 * MS);
    }
    uint64_t before = tat;
    assert_int_equal(sl_rl_gcra_step(&g, tat, now, &tat, &v), 0);
    assert_int_equal(tat, before); /* a rejection costs nothing */
    assert_int_equal(v.remaining, 0);
    assert_int_equal(v.retry_after_ns, 200 * MS);
    assert_int_equal(v.reset_ns, SEC);
    /* 199 ms later: still no; 200 ms: one more. */
    assert_int_equal(sl_rl_gcra_step(&g, tat, now + 199 * MS, &tat, &v), 0);
    assert_int_equal(v.retry_after_ns, 1 * MS);
    assert_int_equal(sl_rl_gcra_step(&g, tat, now + 200 * MS, &tat, &v), 1);
    assert_int_equal(v.remaining, 0);
    /* A long pause fills the bucket, never more than full. */
    assert_int_equal(sl_rl_gcra_step(&g, tat, now + 3600 * SEC, &tat, &v), 1);
    assert_int_equal(v.remaining, 4);
}

static void test_gcra_uneven_period_keeps_the_burst_exact(void **st)
{
    (void)st;
    sl_rl_gcra_t g = sl_rl_gcra_make(3, SEC);
    assert_int_equal(g.emission_ns, 333333333ull);
    uint64_t tat = 0, now = 5 * SEC;
    sl_rl_verdict_t v;
    int admitted = 0;
    while (sl_rl_gcra_step(&g, tat, now, &tat, &v))
        admitted++;
    assert_int_equal(admitted, 3);
    /* requests >= period in ns is refused by validation; the math still
     * holds with T = 1. */
    g = sl_rl_gcra_make(1000000, SEC);
    assert_int_equal(g.emission_ns, 1000);
    assert_int_equal(g.capacity_ns, SEC);
}

static void test_table_keys_are_independent_and_refund(void **st)
{
    (void)st;
    sl_rl_table_t *t = sl_rl_table_new(1024);
    assert_non_null(t);
    assert_int_equal(t->mask, 1023);
    sl_rl_gcra_t g = sl_rl_gcra_make(2, 60 * SEC);
    sl_rl_verdict_t v;
    uint64_t now = 10 * SEC;
    assert_true(sl_rl_table_take(t, 11, &g, now, &v));
    assert_true(sl_rl_table_take(t, 11, &g, now, &v));
    assert_false(sl_rl_table_take(t, 11, &g, now, &v));
    assert_true(sl_rl_table_take(t, 12, &g, now, &v));
    sl_rl_table_refund(t, 11, &g);
    assert_true(sl_rl_table_take(t, 11, &g, now, &v));
    assert_false(sl_rl_table_take(t, 11, &g, now, &v));
    /* key 0 is the empty marker: it is counted as key 1 */
    assert_true(sl_rl_table_take(t, 0, &g, now, &v));
    assert_int_equal(t->evictions, 0);
    sl_rl_table_free(t);
}

static void test_table_reuses_full_buckets_and_evicts_the_fullest(void **st)
{
    (void)st;
    sl_rl_table_t *t = sl_rl_table_new(1); /* one group of 4 slots */
    assert_int_equal(t->mask, 3);
    sl_rl_gcra_t g = sl_rl_gcra_make(1, 10 * SEC);
    sl_rl_verdict_t v;
    uint64_t now = 100 * SEC;
    /* four live buckets, TATs 1 s apart */
    for (uint64_t k = 1; k <= 4; k++)
        assert_true(sl_rl_table_take(t, k * 4, &g, now + k * SEC, &v));
    assert_int_equal(t->evictions, 0);
    /* a fifth key evicts the one closest to full (key 4, TAT oldest) */
    assert_true(sl_rl_table_take(t, 5 * 4, &g, now + 5 * SEC, &v));
    assert_int_equal(t->evictions, 1);
    assert_true(sl_rl_table_take(t, 4, &g, now + 5 * SEC, &v)); /* key 4 starts over */
    assert_int_equal(t->evictions, 2);
    /* every bucket full again (TATs passed): reuse without eviction */
    uint64_t later = now + 100 * SEC;
    for (uint64_t k = 6; k <= 9; k++)
        assert_true(sl_rl_table_take(t, k * 4, &g, later, &v));
    assert_int_equal(t->evictions, 2);
    /* the still-live keys keep their state */
    assert_false(sl_rl_table_take(t, 9 * 4, &g, later, &v));
    sl_rl_table_free(t);
}

/* --- config validation ------------------------------------------------------ */

static char *errors_of(const char *config)
{
    char text[2048];
    snprintf(text, sizeof(text),
             "apiVersion: gateway.sluice.dev/v1alpha1\nkind: Api\nmetadata: {name: a}\n"
             "spec:\n  backendRefs: [{name: b}]\n  operations: [{method: GET, path: /x}]\n"
             "  policies:\n  - name: rate-limit\n    config: %s\n",
             config);
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    sl_model_parse(&set, text, strlen(text), "t.yaml", &errs);
    char *s = sl_errors_format(&errs);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
    return s;
}

static void expect(const char *config, const char *want)
{
    char *s = errors_of(config);
    if (want[0] ? !strstr(s, want) : s[0] != '\0')
        fail_msg("config %s\n got: %s\nwant: %s", config, s, want[0] ? want : "(valid)");
    free(s);
}

#define P "spec.policies[0].config."

static void test_config_validation(void **st)
{
    (void)st;
    expect("{limits: [{requests: 5, period: 1s, by: consumer}]}", "");
    expect("{limits: [{requests: 5, period: 1s, by: header, header: X-Tenant}, "
           "{requests: 100, period: 1h, by: group}], headers: false, maxKeys: 100000}",
           "");
    expect("{limits: [{requests: 5, period: 1s, by: ip}], mode: fleet, failOpen: true, "
           "redis: {address: \"10.0.0.5:6379\", database: 2, keyPrefix: rl}}",
           "");
    expect("{limits: [{requests: 0, period: 1s, by: ip}]}", P "limits[0].requests");
    expect("{limits: [{requests: 5, period: 999ms, by: ip}]}", P "limits[0].period");
    expect("{limits: [{requests: 5, period: 25h, by: ip}]}", P "limits[0].period");
    expect("{limits: [{requests: 5, period: 1s}]}", P "limits[0].by");
    expect("{limits: [{requests: 5, period: 1s, by: header}]}",
           P "limits[0].header: required when by is header");
    expect("{limits: [{requests: 5, period: 1s, by: ip, header: X}]}",
           P "limits[0].header: only used with by: header");
    expect("{limits: [{requests: 5, period: 1s, by: ip, perod: 1s}]}",
           P "limits[0].perod: unknown field (did you mean 'period'?)");
    expect("{limits: []}", P "limits");
    expect("{mode: local}", P "limits");
    expect("{limits: [{requests: 5, period: 1s, by: ip}], mode: fleet}", P "redis: required");
    expect("{limits: [{requests: 5, period: 1s, by: ip}], redis: {address: \"a:1\"}}",
           P "redis: only used with mode: fleet");
    expect("{limits: [{requests: 5, period: 1s, by: ip}], failOpen: false}",
           P "failOpen: only used with mode: fleet");
    expect("{limits: [{requests: 5, period: 1s, by: ip}], mode: fleet, "
           "redis: {address: \"redis:0\"}}",
           P "redis.address");
    expect("{limits: [{requests: 5, period: 1s, by: ip}], maxKeys: 10}", P "maxKeys");
}

/* --- the hook ------------------------------------------------------------------ */

typedef struct {
    sl_policy_req_t r;
    sl_hdr_edit_t edits[2][16];
    char arena[1024];
} fake_req_t;

static void fake_init(fake_req_t *f, const char *consumer)
{
    memset(f, 0, sizeof(*f));
    f->r.client_ip = "192.0.2.7";
    f->r.api = "default/petstore";
    f->r.operation = "pets";
    f->r.consumer.name = consumer;
    f->r.req_edits = f->edits[0];
    f->r.resp_edits = f->edits[1];
    f->r.max_edits = 16;
    f->r.arena = f->arena;
    f->r.arena_cap = sizeof(f->arena);
}

static const char *resp_header(const fake_req_t *f, const char *name)
{
    static char buf[64];
    for (unsigned i = 0; i < f->r.num_resp_edits; i++)
        if (strcmp(f->r.resp_edits[i].name, name) == 0) {
            snprintf(buf, sizeof(buf), "%.*s", (int)f->r.resp_edits[i].value_len,
                     f->r.resp_edits[i].value);
            return buf;
        }
    return NULL;
}

static const char *reply_header(const sl_policy_reply_t *rep, const char *name)
{
    for (unsigned i = 0; i < rep->num_headers; i++)
        if (strcmp(rep->headers[i].name, name) == 0)
            return rep->headers[i].value;
    return NULL;
}

static void test_hook_headers_and_429(void **st)
{
    (void)st;
    const sl_policy_def_t *def = sl_policy_find("rate-limit");
    assert_non_null(def);
    json_t *cfg = json_loads("{\"limits\":[{\"requests\":3,\"period\":\"1h\",\"by\":\"consumer\"},"
                             "{\"requests\":100,\"period\":\"1h\",\"by\":\"ip\"}]}",
                             0, NULL);
    char err[256] = "";
    sl_policy_env_t env = {NULL, 2, NULL};
    void *state = def->compile(cfg, &env, err, sizeof(err));
    assert_non_null(state);
    /* The same config compiled again (a reload) shares the budget. */
    void *again = def->compile(cfg, &env, err, sizeof(err));
    assert_non_null(again);
    sl_policy_reply_t rep;
    fake_req_t f;
    for (int i = 0; i < 3; i++) {
        fake_init(&f, "alice");
        memset(&rep, 0, sizeof(rep));
        assert_int_equal(def->on_request(i == 1 ? again : state, &f.r, &rep), SL_POLICY_CONTINUE);
        assert_string_equal(resp_header(&f, "RateLimit-Limit"), "3");
        char want[8];
        snprintf(want, sizeof(want), "%d", 2 - i);
        assert_string_equal(resp_header(&f, "RateLimit-Remaining"), want);
        assert_int_equal(f.r.resp_edits[0].op, SL_HDR_SET);
    }
    fake_init(&f, "alice");
    memset(&rep, 0, sizeof(rep));
    assert_int_equal(def->on_request(state, &f.r, &rep), SL_POLICY_REPLY);
    assert_int_equal(rep.status, 429);
    assert_string_equal(rep.code, "rate_limited");
    assert_string_equal(reply_header(&rep, "RateLimit-Limit"), "3");
    assert_string_equal(reply_header(&rep, "RateLimit-Remaining"), "0");
    assert_string_equal(reply_header(&rep, "Retry-After"), "1200"); /* one per 20 min */
    assert_non_null(strstr(rep.message, "3 requests per 1h by consumer"));
    assert_int_equal(f.r.num_resp_edits, 0);
    /* An anonymous request from the same IP counts by IP, not as alice;
     * the IP limit was not charged for the rejected request. */
    fake_init(&f, NULL);
    memset(&rep, 0, sizeof(rep));
    assert_int_equal(def->on_request(state, &f.r, &rep), SL_POLICY_CONTINUE);
    assert_string_equal(resp_header(&f, "RateLimit-Remaining"), "2");
    def->free(again);
    def->free(state);
    /* Freed by both: a new compile starts afresh. */
    state = def->compile(cfg, &env, err, sizeof(err));
    fake_init(&f, "alice");
    assert_int_equal(def->on_request(state, &f.r, &rep), SL_POLICY_CONTINUE);
    def->free(state);
    json_decref(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gcra_burst_then_rate),
        cmocka_unit_test(test_gcra_uneven_period_keeps_the_burst_exact),
        cmocka_unit_test(test_table_keys_are_independent_and_refund),
        cmocka_unit_test(test_table_reuses_full_buckets_and_evicts_the_fullest),
        cmocka_unit_test(test_config_validation),
        cmocka_unit_test(test_hook_headers_and_429),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
