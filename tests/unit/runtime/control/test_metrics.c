/*
 * Unit tests of runtime/metrics.c: registry identity and refcounts, histogram
 * bucketing, summing over workers, and the Prometheus text it renders (every
 * line checked against the 0.0.4 grammar, label escaping, cumulative buckets).
 */
#include "metrics.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

static char *render_to_string(void)
{
    struct evbuffer *b = evbuffer_new();
    assert_non_null(b);
    sl_metrics_render(b);
    size_t len = evbuffer_get_length(b);
    char *s = malloc(len + 1);
    assert_non_null(s);
    evbuffer_remove(b, s, len);
    s[len] = '\0';
    evbuffer_free(b);
    return s;
}

/* Value of the sample whose name+labels are exactly `series`, or -1. */
static double sample(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *line = text; *line;) {
        const char *eol = strchr(line, '\n');
        if (!eol)
            break;
        if ((size_t)(eol - line) > n && strncmp(line, series, n) == 0 && line[n] == ' ')
            return strtod(line + n + 1, NULL);
        line = eol + 1;
    }
    return -1;
}

static int count_occurrences(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* Checks one sample line against the text format: name, optional {labels}
 * with quoted values using only \\ \" \n escapes, a space, a number. */
static int valid_sample_line(const char *line, size_t len)
{
    size_t i = 0;
    if (i >= len || !(line[i] == '_' || line[i] == ':' || (line[i] >= 'a' && line[i] <= 'z')))
        return 0;
    while (i < len && (line[i] == '_' || line[i] == ':' || (line[i] >= 'a' && line[i] <= 'z') ||
                       (line[i] >= '0' && line[i] <= '9')))
        i++;
    if (i < len && line[i] == '{') {
        i++;
        for (;;) {
            size_t name_start = i;
            while (i < len && (line[i] == '_' || (line[i] >= 'a' && line[i] <= 'z')))
                i++;
            if (i == name_start || i + 1 >= len || line[i] != '=' || line[i + 1] != '"')
                return 0;
            i += 2;
            while (i < len && line[i] != '"') {
                if (line[i] == '\\') {
                    if (i + 1 >= len ||
                        !(line[i + 1] == '\\' || line[i + 1] == '"' || line[i + 1] == 'n'))
                        return 0;
                    i++;
                } else if (line[i] == '\n') {
                    return 0;
                }
                i++;
            }
            if (i >= len)
                return 0;
            i++;
            if (i < len && line[i] == ',') {
                i++;
                continue;
            }
            if (i < len && line[i] == '}') {
                i++;
                break;
            }
            return 0;
        }
    }
    if (i >= len || line[i] != ' ')
        return 0;
    i++;
    char num[64];
    size_t nlen = len - i;
    if (nlen == 0 || nlen >= sizeof(num))
        return 0;
    memcpy(num, line + i, nlen);
    num[nlen] = '\0';
    char *end;
    strtod(num, &end);
    return *end == '\0';
}

static void assert_valid_exposition(const char *text)
{
    for (const char *line = text; *line;) {
        const char *eol = strchr(line, '\n');
        assert_non_null(eol); /* every line is terminated */
        size_t len = (size_t)(eol - line);
        if (line[0] == '#') {
            if (!(strncmp(line, "# HELP sluice_", 14) == 0 ||
                  strncmp(line, "# TYPE sluice_", 14) == 0)) {
                fprintf(stderr, "bad comment line: %.*s\n", (int)len, line);
                fail();
            }
        } else if (!valid_sample_line(line, len)) {
            fprintf(stderr, "bad sample line: %.*s\n", (int)len, line);
            fail();
        }
        line = eol + 1;
    }
}

static void test_acquire_same_name_returns_same_object(void **state)
{
    (void)state;
    sl_route_stats_t *a = sl_metrics_route_acquire("petstore", "GET /pets");
    sl_route_stats_t *b = sl_metrics_route_acquire("petstore", "GET /pets");
    sl_route_stats_t *c = sl_metrics_route_acquire("petstore", "GET /pets/{id}");
    /* ("ab","c") and ("a","bc") must not collide into one object. */
    sl_route_stats_t *d = sl_metrics_route_acquire("ab", "c");
    sl_route_stats_t *e = sl_metrics_route_acquire("a", "bc");
    assert_non_null(a);
    assert_ptr_equal(a, b);
    assert_ptr_not_equal(a, c);
    assert_ptr_not_equal(d, e);
    assert_int_equal(a->refs, 2);
    assert_string_equal(a->operation, "GET /pets");
    assert_int_equal((uintptr_t)a % 64, 0);
    sl_metrics_route_release(b);
    assert_int_equal(a->refs, 1);
    sl_metrics_route_release(a);
    sl_metrics_route_release(c);
    sl_metrics_route_release(d);
    sl_metrics_route_release(e);
    assert_int_equal(route_table.count, 0);
    assert_null(sl_metrics_route_acquire(NULL, "x"));
    sl_metrics_route_release(NULL);
}

/* The counters of a route survive as long as one generation holds it, and
 * restart at zero once the last reference is gone. */
static void test_counts_survive_reacquire_and_reset_after_last_release(void **state)
{
    (void)state;
    sl_route_stats_t *gen1 = sl_metrics_route_acquire("api", "op");
    sl_metrics_observe(gen1, 0, 200, 100);
    sl_route_stats_t *gen2 = sl_metrics_route_acquire("api", "op");
    sl_metrics_route_release(gen1);
    sl_metrics_observe(gen2, 0, 200, 100);
    char *text = render_to_string();
    assert_true(
        sample(text, "sluice_requests_total{api=\"api\",operation=\"op\",code_class=\"2xx\"}") ==
        2);
    free(text);
    sl_metrics_route_release(gen2);

    sl_route_stats_t *again = sl_metrics_route_acquire("api", "op");
    text = render_to_string();
    assert_null(strstr(text, "operation=\"op\""));
    free(text);
    sl_metrics_route_release(again);
}

static void test_latency_buckets_and_status_classes(void **state)
{
    (void)state;
    assert_int_equal(sl_metrics_init(4), 0);
    sl_route_stats_t *s = sl_metrics_route_acquire("hist", "op");
    sl_metrics_observe(s, 0, 200, 0);              /* le 0.0005 */
    sl_metrics_observe(s, 0, 204, 500);            /* le 0.0005, bound inclusive */
    sl_metrics_observe(s, 1, 301, 501);            /* le 0.001 */
    sl_metrics_observe(s, 2, 404, 30000);          /* le 0.05 */
    sl_metrics_observe(s, 3, 503, 5000000);        /* le 5 */
    sl_metrics_observe(s, 3, 502, 5000001);        /* +Inf only */
    sl_metrics_observe(s, 3, 999, 1);              /* nonsense status: class "other" */
    sl_metrics_observe(s, SL_MAX_WORKERS, 200, 1); /* out of range: ignored */
    sl_metrics_observe(NULL, 0, 200, 1);

    char *t = render_to_string();
#define L "{api=\"hist\",operation=\"op\""
    assert_true(sample(t, "sluice_requests_total" L ",code_class=\"2xx\"}") == 2);
    assert_true(sample(t, "sluice_requests_total" L ",code_class=\"3xx\"}") == 1);
    assert_true(sample(t, "sluice_requests_total" L ",code_class=\"4xx\"}") == 1);
    assert_true(sample(t, "sluice_requests_total" L ",code_class=\"5xx\"}") == 2);
    assert_true(sample(t, "sluice_requests_total" L ",code_class=\"1xx\"}") == 0);
    assert_true(sample(t, "sluice_requests_total" L ",code_class=\"other\"}") == 1);
    assert_true(sample(t, "sluice_request_duration_seconds_bucket" L ",le=\"0.0005\"}") == 3);
    assert_true(sample(t, "sluice_request_duration_seconds_bucket" L ",le=\"0.001\"}") == 4);
    assert_true(sample(t, "sluice_request_duration_seconds_bucket" L ",le=\"0.025\"}") == 4);
    assert_true(sample(t, "sluice_request_duration_seconds_bucket" L ",le=\"0.05\"}") == 5);
    assert_true(sample(t, "sluice_request_duration_seconds_bucket" L ",le=\"2.5\"}") == 5);
    assert_true(sample(t, "sluice_request_duration_seconds_bucket" L ",le=\"5\"}") == 6);
    assert_true(sample(t, "sluice_request_duration_seconds_bucket" L ",le=\"+Inf\"}") == 7);
    assert_true(sample(t, "sluice_request_duration_seconds_count" L "}") == 7);
    /* 0 + 500 + 501 + 30000 + 5000000 + 5000001 + 1 us */
    assert_non_null(strstr(t, "sluice_request_duration_seconds_sum" L "} 10.031003\n"));
#undef L
    assert_int_equal(count_occurrences(t, "sluice_request_duration_seconds_bucket{api=\"hist\""),
                     SL_METRICS_LATENCY_BUCKETS);
    assert_valid_exposition(t);
    free(t);
    sl_metrics_route_release(s);
}

/* Objects get one slot per worker of sl_metrics_init (memory: 100k routes
 * with 64 slots each took 1.2 GB); init rejects 0 and > max. */
static void test_init_bounds_the_workers_summed(void **state)
{
    (void)state;
    assert_int_equal(sl_metrics_init(0), -1);
    assert_int_equal(sl_metrics_init(SL_MAX_WORKERS + 1), -1);
    assert_int_equal(sl_metrics_init(2), 0);
    sl_route_stats_t *s = sl_metrics_route_acquire("sum", "op");
    sl_metrics_observe(s, 0, 200, 1);
    sl_metrics_observe(s, 1, 200, 1);
    sl_metrics_observe(s, 5, 200, 1); /* beyond nworkers: the object has no such slot */
    assert_int_equal(s->nslots, 2);
    char *t = render_to_string();
    assert_true(
        sample(t, "sluice_requests_total{api=\"sum\",operation=\"op\",code_class=\"2xx\"}") == 2);
    free(t);
    /* Raising the count later never reads past an object's own slots. */
    assert_int_equal(sl_metrics_init(SL_MAX_WORKERS), 0);
    t = render_to_string();
    assert_true(
        sample(t, "sluice_requests_total{api=\"sum\",operation=\"op\",code_class=\"2xx\"}") == 2);
    free(t);
    sl_metrics_route_release(s);
}

static void test_label_values_are_escaped(void **state)
{
    (void)state;
    sl_route_stats_t *s = sl_metrics_route_acquire("we\"ird\\api", "line\nbreak");
    sl_cluster_stats_t *c = sl_metrics_cluster_acquire("c\"1");
    sl_metrics_observe(s, 0, 200, 1);
    char *t = render_to_string();
    assert_true(sample(t,
                       "sluice_requests_total{api=\"we\\\"ird\\\\api\",operation=\"line\\nbreak\","
                       "code_class=\"2xx\"}") == 1);
    assert_true(sample(t, "sluice_upstream_requests_total{cluster=\"c\\\"1\"}") == 0);
    assert_valid_exposition(t);
    free(t);
    sl_metrics_route_release(s);
    sl_metrics_cluster_release(c);
}

/* Rate-limit counters by (api, scope): their own table (not the policy
 * table, whose series would otherwise repeat), summed over workers,
 * escaped, and gone with the last reference. */
static void test_rate_limit_scopes(void **state)
{
    (void)state;
    sl_policy_stats_t *l = sl_metrics_scope_acquire("ns/a\"pi", "local");
    sl_policy_stats_t *f = sl_metrics_scope_acquire("ns/a\"pi", "fleet");
    sl_policy_stats_t *again = sl_metrics_scope_acquire("ns/a\"pi", "local");
    sl_policy_stats_t *p = sl_metrics_policy_acquire("ns/a\"pi", "rate-limit");
    assert_ptr_equal(l, again);
    assert_ptr_not_equal(l, f);
    assert_ptr_not_equal(l, p);
    SL_STAT_ADD(l->slots[0].rejections, 2);
    SL_STAT_ADD(l->slots[1].rejections, 3);
    SL_STAT_ADD(f->slots[1].unavailable, 4);
    char *t = render_to_string();
    const char *pre = "sluice_rate_limit_rejections_total{api=\"ns/a\\\"pi\",";
    char series[200];
    snprintf(series, sizeof(series), "%sscope=\"local\",reason=\"limited\"}", pre);
    assert_true(sample(t, series) == 5);
    snprintf(series, sizeof(series), "%sscope=\"local\",reason=\"unavailable\"}", pre);
    assert_true(sample(t, series) == 0);
    snprintf(series, sizeof(series), "%sscope=\"fleet\",reason=\"unavailable\"}", pre);
    assert_true(sample(t, series) == 4);
    assert_true(sample(t, "sluice_policy_rejections_total{api=\"ns/a\\\"pi\","
                          "policy=\"rate-limit\"}") == 0);
    assert_int_equal(count_occurrences(t, "# TYPE sluice_rate_limit_rejections_total counter\n"),
                     1);
    assert_valid_exposition(t);
    free(t);
    sl_metrics_scope_release(again);
    sl_metrics_scope_release(l);
    sl_metrics_scope_release(f);
    sl_metrics_policy_release(p);
    t = render_to_string();
    assert_null(strstr(t, "sluice_rate_limit_rejections_total{"));
    free(t);
}

static void test_cluster_counters_and_error_kinds(void **state)
{
    (void)state;
    sl_cluster_stats_t *c = sl_metrics_cluster_acquire("echo");
    sl_cluster_stats_t *same = sl_metrics_cluster_acquire("echo");
    assert_ptr_equal(c, same);
    sl_metrics_cluster_release(same);
    SL_STAT_ADD(c->slots[0].requests, 10);
    SL_STAT_ADD(c->slots[1].requests, 5);
    SL_STAT_ADD(c->slots[1].retries, 2);
    SL_STAT_ADD(c->slots[0].errors[SL_UPSTREAM_ERR_CONNECT], 3);
    SL_STAT_ADD(c->slots[1].errors[SL_UPSTREAM_ERR_POOL_FULL], 1);
    SL_STAT_ADD(c->slots[1].errors[SL_UPSTREAM_ERR_CONNECT_TIMEOUT], 2);
    char *t = render_to_string();
    assert_true(
        sample(t, "sluice_upstream_errors_total{cluster=\"echo\",kind=\"connect_timeout\"}") == 2);
    assert_true(sample(t, "sluice_upstream_requests_total{cluster=\"echo\"}") == 15);
    assert_true(sample(t, "sluice_upstream_retries_total{cluster=\"echo\"}") == 2);
    assert_true(sample(t, "sluice_upstream_errors_total{cluster=\"echo\",kind=\"connect\"}") == 3);
    assert_true(sample(t, "sluice_upstream_errors_total{cluster=\"echo\",kind=\"pool_full\"}") ==
                1);
    assert_true(sample(t, "sluice_upstream_errors_total{cluster=\"echo\",kind=\"timeout\"}") == 0);
    assert_true(sample(t, "sluice_upstream_errors_total{cluster=\"echo\",kind=\"reset\"}") == 0);
    assert_true(sample(t, "sluice_upstream_errors_total{cluster=\"echo\",kind=\"bad_response\"}") ==
                0);
    assert_true(sample(t, "sluice_upstream_errors_total{cluster=\"echo\",kind=\"no_healthy\"}") ==
                0);
    assert_non_null(strstr(t, "# TYPE sluice_upstream_errors_total counter\n"));
    free(t);
    sl_metrics_cluster_release(c);
    t = render_to_string();
    assert_null(strstr(t, "cluster=\"echo\""));
    free(t);
}

static void test_process_counters_and_gauges(void **state)
{
    (void)state;
    assert_null(sl_metrics_worker(SL_MAX_WORKERS));
    sl_worker_stats_t *w0 = sl_metrics_worker(0), *w1 = sl_metrics_worker(1);
    SL_STAT_ADD(w0->connections_accepted, 7);
    SL_STAT_ADD(w1->connections_accepted, 3);
    SL_STAT_ADD(w0->connections_active, 4);
    SL_STAT_ADD(w1->connections_active, 1);
    SL_STAT_ADD(w1->connections_active, -1);
    SL_STAT_ADD(w0->requests_total, 9);
    SL_STAT_ADD(w0->unrouted_by_status[4], 2);
    SL_STAT_ADD(w1->unrouted_by_status[4], 1);
    SL_STAT_ADD(w1->unrouted_by_status[5], 1);
    atomic_store(&sl_metrics_gauges.generation_version, 42);
    atomic_store(&sl_metrics_gauges.generation_swaps, 3);
    atomic_store(&sl_metrics_gauges.config_errors, 1);
    atomic_store(&sl_metrics_gauges.generations_alive, 2);

    char *t = render_to_string();
    assert_true(sample(t, "sluice_connections_accepted_total") == 10);
    assert_true(sample(t, "sluice_connections_active") == 4);
    assert_true(sample(t, "sluice_downstream_requests_total") == 9);
    assert_true(sample(t, "sluice_unrouted_responses_total{code_class=\"4xx\"}") == 3);
    assert_true(sample(t, "sluice_unrouted_responses_total{code_class=\"5xx\"}") == 1);
    assert_true(sample(t, "sluice_unrouted_responses_total{code_class=\"2xx\"}") == 0);
    assert_true(sample(t, "sluice_generation_version") == 42);
    assert_true(sample(t, "sluice_generation_swaps_total") == 3);
    assert_true(sample(t, "sluice_config_errors_total") == 1);
    assert_true(sample(t, "sluice_generations_alive") == 2);
    assert_true(sample(t, "sluice_traffic_log_ring_dropped_total") == 0);
    assert_non_null(strstr(t, "# TYPE sluice_traffic_log_dropped_total counter\n"));
    assert_non_null(strstr(t, "# TYPE sluice_connections_active gauge\n"));
    assert_non_null(strstr(t, "# TYPE sluice_generation_version gauge\n"));
    assert_non_null(strstr(t, "# TYPE sluice_request_duration_seconds histogram\n"));
    assert_non_null(strstr(t, "# HELP sluice_requests_total "));
    assert_valid_exposition(t);
    free(t);
}

/* A large config: every name gets its own object, lookups stay correct
 * through table growth, and everything is freed at the end (ASan). */
static void test_ten_thousand_routes(void **state)
{
    (void)state;
    enum { N = 10000 };
    sl_route_stats_t **all = calloc(N, sizeof(*all));
    assert_non_null(all);
    char op[32];
    for (int i = 0; i < N; i++) {
        snprintf(op, sizeof(op), "op-%d", i);
        all[i] = sl_metrics_route_acquire("big", op);
        assert_non_null(all[i]);
    }
    assert_int_equal(route_table.count, N);
    assert_true(route_table.nbuckets >= N);
    for (int i = 0; i < N; i++) {
        snprintf(op, sizeof(op), "op-%d", i);
        sl_route_stats_t *again = sl_metrics_route_acquire("big", op);
        assert_ptr_equal(again, all[i]);
        sl_metrics_route_release(again);
    }
    sl_metrics_observe(all[1234], 0, 200, 1);
    char *t = render_to_string();
    assert_true(
        sample(t, "sluice_requests_total{api=\"big\",operation=\"op-1234\",code_class=\"2xx\"}") ==
        1);
    /* Idle routes are not rendered. */
    assert_null(strstr(t, "operation=\"op-1235\""));
    free(t);
    for (int i = 0; i < N; i++)
        sl_metrics_route_release(all[i]);
    assert_int_equal(route_table.count, 0);
    free(all);
}

/* Workers increment while the main thread scrapes and churns the registry:
 * no torn values, and (under TSan/ASan) no race on the registry itself. */
typedef struct {
    sl_route_stats_t *s;
    unsigned worker;
    int n;
} observer_arg_t;

static void *observer(void *p)
{
    observer_arg_t *a = p;
    for (int i = 0; i < a->n; i++)
        sl_metrics_observe(a->s, a->worker, 200, 700);
    return NULL;
}

static void test_concurrent_observe_and_render(void **state)
{
    (void)state;
    assert_int_equal(sl_metrics_init(4), 0);
    sl_route_stats_t *s = sl_metrics_route_acquire("conc", "op");
    pthread_t th[4];
    observer_arg_t args[4];
    for (unsigned i = 0; i < 4; i++) {
        args[i] = (observer_arg_t){s, i, 200000};
        assert_int_equal(pthread_create(&th[i], NULL, observer, &args[i]), 0);
    }
    for (int i = 0; i < 20; i++) {
        sl_route_stats_t *other = sl_metrics_route_acquire("churn", "op");
        char *t = render_to_string();
        free(t);
        sl_metrics_route_release(other);
    }
    for (unsigned i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    char *t = render_to_string();
    assert_true(
        sample(t, "sluice_requests_total{api=\"conc\",operation=\"op\",code_class=\"2xx\"}") ==
        800000);
    assert_true(
        sample(
            t,
            "sluice_request_duration_seconds_bucket{api=\"conc\",operation=\"op\",le=\"0.001\"}") ==
        800000);
    free(t);
    sl_metrics_route_release(s);
    assert_int_equal(sl_metrics_init(SL_MAX_WORKERS), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_acquire_same_name_returns_same_object),
        cmocka_unit_test(test_counts_survive_reacquire_and_reset_after_last_release),
        cmocka_unit_test(test_latency_buckets_and_status_classes),
        cmocka_unit_test(test_init_bounds_the_workers_summed),
        cmocka_unit_test(test_label_values_are_escaped),
        cmocka_unit_test(test_rate_limit_scopes),
        cmocka_unit_test(test_cluster_counters_and_error_kinds),
        cmocka_unit_test(test_process_counters_and_gauges),
        cmocka_unit_test(test_ten_thousand_routes),
        cmocka_unit_test(test_concurrent_observe_and_render),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
