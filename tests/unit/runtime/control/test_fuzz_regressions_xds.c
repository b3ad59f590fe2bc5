/*
 * Regression tests for what fuzzing (tests/fuzz/fuzz_snapshot_apply.c) and
 * an independent gRPC peer (issue 7) found in the runtime's handling of
 * config-stream pushes (runtime/control/xds.c, included to reach handle_response and
 * the back-off). One test per finding, named after what broke.
 *
 * Leaks are checked two ways: LeakSanitizer reports them at exit in the
 * sanitized build, and in every build the strings xds.c strdup()s are
 * tracked (strdup/free are renamed for the included xds.c only) and must all
 * be freed once the state is torn down.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* Pointers returned by xds.c's strdup and not yet passed to free. */
#define MAX_TRACKED 4096
static void *tracked[MAX_TRACKED];
static size_t n_tracked;

static char *tracking_strdup(const char *s)
{
    char *p = strdup(s);
    if (p && n_tracked < MAX_TRACKED)
        tracked[n_tracked++] = p;
    return p;
}

static void tracking_free(void *p)
{
    for (size_t i = 0; i < n_tracked; i++) {
        if (tracked[i] == p) {
            tracked[i] = tracked[--n_tracked];
            break;
        }
    }
    free(p);
}

#define strdup tracking_strdup
#define free tracking_free
#include "../../../../runtime/control/xds.c"
#undef strdup
#undef free

static sl_xds_t *new_state(void)
{
    sl_xds_t *x = calloc(1, sizeof(*x));
    assert_non_null(x);
    x->opt.controller = "test:0";
    x->opt.node_id = "node";
    x->opt.fleet = "default";
    x->cfg = sl_config_new(NULL, 1);
    assert_non_null(x->cfg);
    pthread_mutex_init(&x->lock, NULL);
    return x;
}

static void free_state(sl_xds_t *x)
{
    for (int t = 0; t < SL_XDS__COUNT; t++) {
        type_state_free(&x->types[t]);
        tracking_free(x->types[t].version);
    }
    for (size_t i = 0; i < x->cds_n; i++)
        tracking_free(x->cds_names[i]);
    tracking_free(x->cds_names);
    tracking_free(x->last_error);
    sl_config_free(x->cfg);
    pthread_mutex_destroy(&x->lock);
    free(x);
}

/* A cluster push whose second resource does not decode as a Cluster. */
static void push_undecodable_second_cluster(sl_xds_t *x)
{
    Sluice__V1__Cluster c = SLUICE__V1__CLUSTER__INIT;
    c.name = "default/echo";
    uint8_t good[64];
    size_t good_len = protobuf_c_message_pack(&c.base, good);
    /* field 1, length-delimited, claims 100 bytes but has 1 */
    static uint8_t bad[] = {0x0a, 0x64, 0x41};

    Sluice__V1__Resource r0 = SLUICE__V1__RESOURCE__INIT, r1 = SLUICE__V1__RESOURCE__INIT;
    r0.name = "default/echo";
    r0.value.data = good;
    r0.value.len = good_len;
    r1.name = "default/a-name-that-leaked-on-every-bad-push";
    r1.value.data = bad;
    r1.value.len = sizeof(bad);
    Sluice__V1__Resource *rs[] = {&r0, &r1};

    Sluice__V1__DiscoveryResponse resp = SLUICE__V1__DISCOVERY_RESPONSE__INIT;
    resp.version_info = "7";
    resp.type_url = (char *)SL_TYPE_CLUSTER;
    resp.nonce = "n";
    resp.n_resources = 2;
    resp.resources = rs;
    handle_response(x, 1, &resp);
}

/*
 * fuzz_snapshot_apply, tests/fuzz/regressions/fuzz_snapshot_apply/
 * undecodable_resource_leak: when resource i of a push did not decode,
 * handle_response set next.n = i, so the name strdup'ed for resource i was
 * never freed. Every such push (NACKed, as it should be) leaked the name: a
 * controller repeating a bad push grows the runtime without bound.
 */
static void test_undecodable_resource_does_not_leak_its_name(void **state)
{
    (void)state;
    sl_log_set_level(SL_LOG_ALERT);
    sl_xds_t *x = new_state();
    n_tracked = 0;
    push_undecodable_second_cluster(x);
    assert_int_equal(x->updates_nacked, 1);
    assert_int_equal(x->updates_acked, 0);
    assert_int_equal(x->types[SL_XDS_CLUSTER].n, 0);
    free_state(x);
    if (n_tracked != 0)
        fail_msg("a NACKed push left %zu string(s) allocated, first \"%s\"", n_tracked,
                 (const char *)tracked[0]);
}

static void push_empty_clusters(sl_xds_t *x, const char *version)
{
    Sluice__V1__DiscoveryResponse resp = SLUICE__V1__DISCOVERY_RESPONSE__INIT;
    resp.version_info = (char *)version;
    resp.type_url = (char *)SL_TYPE_CLUSTER;
    resp.nonce = "n";
    handle_response(x, 1, &resp);
}

/*
 * Issue 7.8: a pushed version_info that is not a number was read as 0 and
 * applied (then "abc" was the running version, and any later version
 * compared against 0). It is NACKed, naming the version.
 */
static void test_non_numeric_version_is_nacked(void **state)
{
    (void)state;
    sl_log_set_level(SL_LOG_ALERT);
    static const char *const bad[] = {
        "abc", "-1", "1e3", "0x10", "007", " 7", "9007199254740992", "18446744073709551616", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        sl_xds_t *x = new_state();
        push_empty_clusters(x, bad[i]);
        if (x->updates_nacked != 1 || x->updates_acked != 0)
            fail_msg("version \"%s\": %llu ACKed, %llu NACKed", bad[i],
                     (unsigned long long)x->updates_acked, (unsigned long long)x->updates_nacked);
        assert_non_null(strstr(x->last_error, "is not a version"));
        assert_null(x->types[SL_XDS_CLUSTER].version);
        free_state(x);
    }
    sl_xds_t *x = new_state();
    push_empty_clusters(x, "9007199254740991");
    assert_int_equal(x->updates_acked, 1);
    assert_string_equal(x->types[SL_XDS_CLUSTER].version, "9007199254740991");
    free_state(x);
}

/*
 * Issue 7.7: the reconnect wait was drawn from [cap/2, cap] ("equal
 * jitter"), while the docs promise full jitter, [0, cap]: a fleet that
 * lost its controller came back in a tighter wave, and never sooner than
 * half the cap. The cap doubles from 250 ms to 10 s.
 */
static void test_backoff_is_full_jitter(void **state)
{
    (void)state;
    unsigned cap = BACKOFF_BASE_MS;
    assert_int_equal(backoff_wait_ms(&cap, 0), 0); /* the low end is reachable */
    assert_int_equal(cap, 500);
    assert_int_equal(backoff_wait_ms(&cap, 500), 500); /* and the high end */
    assert_int_equal(cap, 1000);
    assert_int_equal(backoff_wait_ms(&cap, 1001), 0); /* uniform modulo cap + 1 */
    assert_int_equal(cap, 2000);
    unsigned caps[] = {4000, 8000, 10000, 10000};
    for (size_t i = 0; i < sizeof(caps) / sizeof(caps[0]); i++) {
        unsigned before = cap;
        unsigned w = backoff_wait_ms(&cap, 123456789u);
        assert_true(w <= before);
        assert_int_equal(cap, caps[i]);
    }
    /* Over many draws the waits cover [0, cap], not only its upper half. */
    unsigned seed = 7, below_half = 0;
    for (int i = 0; i < 1000; i++) {
        cap = BACKOFF_BASE_MS;
        below_half += backoff_wait_ms(&cap, (unsigned)rand_r(&seed)) < BACKOFF_BASE_MS / 2;
    }
    assert_true(below_half > 400 && below_half < 600);
}

/* ---- delta sets: the store's order, kept by one merge pass ---- */

/* The order as first written (segment by segment at '/'), the reference
 * for the byte-wise name_cmp. */
static int ref_name_cmp(const char *a, const char *b)
{
    for (;;) {
        size_t la = strcspn(a, "/"), lb = strcspn(b, "/");
        int c = strncmp(a, b, la < lb ? la : lb);
        if (c || la != lb)
            return c ? (c < 0 ? -1 : 1) : la < lb ? -1 : 1;
        a += la;
        b += lb;
        if (!*a || !*b)
            return *a ? 1 : *b ? -1 : 0;
        a++;
        b++;
    }
}

static uint64_t xrng = 0x9e3779b97f4a7c15ull;
static unsigned xrnd(unsigned n)
{
    xrng ^= xrng << 13;
    xrng ^= xrng >> 7;
    xrng ^= xrng << 17;
    return (unsigned)(xrng % n);
}

/* Names from an alphabet with bytes on both sides of '/' ('-' and '.'
 * sort before it, letters after). */
static void random_name(char *out)
{
    static const char alpha[] = "a-.b/z0";
    unsigned len = 1 + xrnd(6);
    for (unsigned i = 0; i < len; i++)
        out[i] = alpha[xrnd(sizeof alpha - 1)];
    out[len] = '\0';
}

static void test_name_order_is_segment_order(void **state)
{
    (void)state;
    char a[8], b[8];
    for (int i = 0; i < 200000; i++) {
        random_name(a);
        random_name(b);
        int want = ref_name_cmp(a, b), got = name_cmp(a, b);
        got = got < 0 ? -1 : got > 0;
        if (got != want)
            fail_msg("name_cmp(\"%s\", \"%s\") = %d, segment order says %d", a, b, got, want);
    }
}

static int ref_slot_cmp(const void *a, const void *b)
{
    return ref_name_cmp(((const slot_t *)a)->name, ((const slot_t *)b)->name);
}

/* delta_merge against the definition: the held set without the names
 * the accepted changes carry, plus the accepted changes with a message,
 * sorted. Held sets sorted (as delta_merge leaves them) and not. */
static void test_delta_merge_is_filter_then_sort(void **state)
{
    (void)state;
    enum { MAXN = 40 };
    static char names[MAXN * 2][8];
    static int dummy[MAXN * 2];
    for (int round = 0; round < 3000; round++) {
        type_state_t held = {0};
        size_t nh = xrnd(MAXN);
        held.names = calloc(nh + 1, sizeof(char *));
        held.msgs = calloc(nh + 1, sizeof(void *));
        held.versions = calloc(nh + 1, sizeof(char *));
        assert_true(held.names && held.msgs && held.versions);
        slot_t tmp[MAXN];
        size_t u = 0;
        for (size_t i = 0; i < nh; i++) {
            random_name(names[i]);
            int dup = 0;
            for (size_t j = 0; j < u; j++)
                dup |= strcmp(tmp[j].name, names[i]) == 0;
            if (!dup)
                tmp[u++] = (slot_t){names[i], "1", (ProtobufCMessage *)&dummy[i], 0};
        }
        if (round % 4) /* mostly sorted, as delta_merge keeps them */
            qsort(tmp, u, sizeof *tmp, ref_slot_cmp);
        held.n = u;
        for (size_t i = 0; i < u; i++) {
            held.names[i] = (char *)tmp[i].name;
            held.msgs[i] = tmp[i].msg;
            held.versions[i] = "1";
        }
        change_t chg[MAXN];
        size_t nc = xrnd(6);
        for (size_t k = 0; k < nc; k++) {
            char *nm = names[MAXN + k];
            if (u && xrnd(2))
                snprintf(nm, 8, "%s", held.names[xrnd((unsigned)u)]); /* a held one */
            else
                random_name(nm);
            chg[k] = (change_t){.name = nm, .version = "2",
                                .msg = xrnd(3) ? (ProtobufCMessage *)&dummy[MAXN + k] : NULL,
                                .accepted = xrnd(5) != 0};
        }
        /* the definition */
        slot_t want[MAXN * 2];
        size_t nw = 0;
        for (size_t i = 0; i < u; i++) {
            int gone = 0;
            for (size_t k = 0; k < nc; k++)
                gone |= chg[k].accepted && strcmp(chg[k].name, held.names[i]) == 0;
            if (!gone)
                want[nw++] = (slot_t){held.names[i], "1", held.msgs[i], (ssize_t)i};
        }
        for (size_t k = 0; k < nc; k++)
            if (chg[k].accepted && chg[k].msg)
                want[nw++] = (slot_t){chg[k].name, "2", chg[k].msg, -1};
        qsort(want, nw, sizeof *want, ref_slot_cmp);

        type_state_t out;
        slot_t *slots = NULL;
        assert_int_equal(delta_merge(&held, chg, nc, &out, &slots), 0);
        if (out.n != nw)
            fail_msg("round %d: %zu names merged, %zu expected", round, out.n, nw);
        for (size_t i = 0; i < nw; i++) {
            /* equal names may come in either order (duplicates in one
             * response); compare names, and messages where names differ */
            if (strcmp(out.names[i], want[i].name) != 0)
                fail_msg("round %d: name %zu is %s, %s expected", round, i, out.names[i],
                         want[i].name);
            if (slots[i].held >= 0 && held.msgs[slots[i].held] != out.msgs[i])
                fail_msg("round %d: slot %zu points at the wrong held resource", round, i);
        }
        merged_free(&out);
        tracking_free(slots);
        free(held.names);
        free(held.msgs);
        free(held.versions);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_undecodable_resource_does_not_leak_its_name),
        cmocka_unit_test(test_non_numeric_version_is_nacked),
        cmocka_unit_test(test_backoff_is_full_jitter),
        cmocka_unit_test(test_name_order_is_segment_order),
        cmocka_unit_test(test_delta_merge_is_filter_then_sort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
