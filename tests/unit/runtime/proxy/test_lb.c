/*
 * Unit tests of runtime/lb.c: exact smooth-weighted round-robin sequences,
 * distributions of the randomized pickers over 100k draws with fixed seeds
 * (statistical in nature, deterministic in practice), unusable endpoints,
 * and the consistency properties of the hash ring.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "../../../../runtime/proxy/lb.c"

#define DRAWS 100000

/* ---- PRNG and hash: known answers, so a change of algorithm (which would
 * remap every consistent-hash key in a fleet mid-upgrade) cannot go
 * unnoticed. Reference values computed independently from the published
 * algorithms (splitmix64's reference output for seed 1234567; FNV-1a 64's
 * test vectors before the finalizer). */

static void test_rng_known_sequence(void **state)
{
    (void)state;
    sl_lb_rng_t rng;
    sl_lb_rng_seed(&rng, 1234567);
    assert_true(sl_lb_rng_next(&rng) == UINT64_C(6457827717110365317));
    assert_true(sl_lb_rng_next(&rng) == UINT64_C(3203168211198807973));
    assert_true(sl_lb_rng_next(&rng) == UINT64_C(0x883ebce5a3f27c77));

    sl_lb_rng_t a, b;
    sl_lb_rng_seed(&a, 42);
    sl_lb_rng_seed(&b, 42);
    for (int i = 0; i < 1000; i++)
        assert_true(sl_lb_rng_next(&a) == sl_lb_rng_next(&b));
}

static void test_rng_below_is_uniform(void **state)
{
    (void)state;
    sl_lb_rng_t rng;
    sl_lb_rng_seed(&rng, 7);
    unsigned counts[7] = {0};
    for (int i = 0; i < 70000; i++) {
        uint64_t v = rng_below(&rng, 7);
        assert_true(v < 7);
        counts[v]++;
    }
    for (int i = 0; i < 7; i++)
        assert_in_range(counts[i], 9500, 10500);
    /* bound 1 is always 0; a bound near 2^64 still terminates */
    assert_true(rng_below(&rng, 1) == 0);
    assert_true(rng_below(&rng, UINT64_MAX) < UINT64_MAX);
}

static void test_hash_known_answers(void **state)
{
    (void)state;
    /* FNV-1a 64 itself, against its published vectors */
    assert_true(fnv1a_update(FNV64_OFFSET, "", 0) == UINT64_C(0xcbf29ce484222325));
    assert_true(fnv1a_update(FNV64_OFFSET, "a", 1) == UINT64_C(0xaf63dc4c8601ec8c));
    assert_true(fnv1a_update(FNV64_OFFSET, "foobar", 6) == UINT64_C(0x85944171f73967e8));
    /* and the finalized values this fleet depends on */
    assert_true(sl_lb_hash("", 0) == UINT64_C(0xf52a15e9a9b5e89b));
    assert_true(sl_lb_hash(NULL, 0) == UINT64_C(0xf52a15e9a9b5e89b));
    assert_true(sl_lb_hash("a", 1) == UINT64_C(0x02c0bdbf481420f8));
    assert_true(sl_lb_hash("foobar", 6) == UINT64_C(0x404da9e3b74078c2));
    assert_true(sl_lb_hash("user-42", 7) == UINT64_C(0x7a1596f0e94b5793));
    /* one bit of input flips about half the output bits */
    uint64_t x = sl_lb_hash("user-42", 7) ^ sl_lb_hash("user-43", 7);
    assert_in_range(__builtin_popcountll(x), 16, 48);
}

/* ---- Smooth weighted round-robin */

static void test_swrr_nginx_sequence_5_1_1(void **state)
{
    (void)state;
    const uint32_t weights[] = {5, 1, 1};
    int64_t current[3] = {0};
    const char *expect = "aabacaa";
    /* the sequence repeats exactly every sum(weights) picks */
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 7; i++) {
            int got = sl_lb_swrr_pick(current, weights, NULL, 3);
            assert_int_equal(got, expect[i] - 'a');
        }
        for (int i = 0; i < 3; i++)
            assert_true(current[i] == 0);
    }
}

static void test_swrr_equal_weights_round_robin(void **state)
{
    (void)state;
    const uint32_t weights[] = {1, 1, 1, 1};
    int64_t current[4] = {0};
    for (int i = 0; i < 40; i++)
        assert_int_equal(sl_lb_swrr_pick(current, weights, NULL, 4), i % 4);
    /* NULL weights and 0 weights both mean 1 */
    int64_t cur2[3] = {0};
    const uint32_t zeros[] = {0, 0, 0};
    for (int i = 0; i < 9; i++)
        assert_int_equal(sl_lb_swrr_pick(cur2, zeros, NULL, 3), i % 3);
    int64_t cur3[3] = {0};
    for (int i = 0; i < 9; i++)
        assert_int_equal(sl_lb_swrr_pick(cur3, NULL, NULL, 3), i % 3);
}

static void test_swrr_exact_share_per_cycle(void **state)
{
    (void)state;
    const uint32_t weights[] = {3, 7, 2, 9, 1, 4};
    int64_t current[6] = {0};
    const int total = 26;
    for (int cycle = 0; cycle < 50; cycle++) {
        int counts[6] = {0};
        int prev = -1, longest = 0, run = 0;
        for (int i = 0; i < total; i++) {
            int got = sl_lb_swrr_pick(current, weights, NULL, 6);
            assert_in_range(got, 0, 5);
            counts[got]++;
            run = got == prev ? run + 1 : 1;
            if (run > longest)
                longest = run;
            prev = got;
        }
        for (int i = 0; i < 6; i++)
            assert_int_equal(counts[i], (int)weights[i]);
        /* "smooth": the heaviest (9 of 26) is never picked 3 times in a row */
        assert_true(longest <= 2);
    }
}

static void test_swrr_skips_unusable(void **state)
{
    (void)state;
    const uint32_t weights[] = {5, 1, 1};
    uint8_t usable[] = {1, 0, 1};
    int64_t current[3] = {0};
    int counts[3] = {0};
    for (int i = 0; i < 60; i++)
        counts[sl_lb_swrr_pick(current, weights, usable, 3)]++;
    assert_int_equal(counts[1], 0);
    assert_int_equal(counts[0], 50);
    assert_int_equal(counts[2], 10);
    /* the unusable one's state was left alone */
    assert_true(current[1] == 0);

    /* back in service: it gets its share again */
    usable[1] = 1;
    memset(counts, 0, sizeof(counts));
    for (int i = 0; i < 70; i++)
        counts[sl_lb_swrr_pick(current, weights, usable, 3)]++;
    assert_int_equal(counts[0], 50);
    assert_int_equal(counts[1], 10);
    assert_int_equal(counts[2], 10);
}

static void test_swrr_none_usable(void **state)
{
    (void)state;
    const uint32_t weights[] = {2, 3};
    const uint8_t none[] = {0, 0};
    int64_t current[2] = {4, -4};
    assert_int_equal(sl_lb_swrr_pick(current, weights, none, 2), -1);
    assert_true(current[0] == 4 && current[1] == -4);
    assert_int_equal(sl_lb_swrr_pick(current, weights, NULL, 0), -1);
    assert_int_equal(sl_lb_swrr_pick(NULL, weights, NULL, 2), -1);
}

static void test_swrr_huge_weights_no_overflow(void **state)
{
    (void)state;
    const uint32_t weights[] = {UINT32_MAX, UINT32_MAX, 1};
    int64_t current[3] = {0};
    int counts[3] = {0};
    for (int i = 0; i < 100000; i++)
        counts[sl_lb_swrr_pick(current, weights, NULL, 3)]++;
    assert_int_equal(counts[2], 0);
    assert_int_equal(counts[0], 50000);
    assert_int_equal(counts[1], 50000);
    int64_t sum = current[0] + current[1] + current[2];
    assert_true(sum == 0);
}

/* ---- Weighted random */

static void assert_shares(const unsigned *counts, const uint32_t *weights, const uint8_t *usable,
                          size_t n, unsigned draws, double tolerance)
{
    double total = 0;
    for (size_t i = 0; i < n; i++)
        if (usable == NULL || usable[i])
            total += weights[i];
    for (size_t i = 0; i < n; i++) {
        if (usable != NULL && !usable[i]) {
            assert_int_equal(counts[i], 0);
            continue;
        }
        double share = (double)counts[i] / draws;
        double expect = weights[i] / total;
        if (share < expect - tolerance || share > expect + tolerance)
            fail_msg("endpoint %zu: share %.4f, expected %.4f +- %.4f", i, share, expect,
                     tolerance);
    }
}

static void test_random_distribution(void **state)
{
    (void)state;
    const uint32_t weights[] = {1, 2, 3, 4};
    sl_lb_rng_t rng;
    sl_lb_rng_seed(&rng, 2024);
    unsigned counts[4] = {0};
    for (int i = 0; i < DRAWS; i++) {
        int got = sl_lb_random_pick(&rng, weights, NULL, 4);
        assert_in_range(got, 0, 3);
        counts[got]++;
    }
    assert_shares(counts, weights, NULL, 4, DRAWS, 0.01);
}

static void test_random_skips_unusable(void **state)
{
    (void)state;
    const uint32_t weights[] = {1, 2, 3, 4};
    const uint8_t usable[] = {1, 0, 1, 0};
    sl_lb_rng_t rng;
    sl_lb_rng_seed(&rng, 99);
    unsigned counts[4] = {0};
    for (int i = 0; i < DRAWS; i++)
        counts[sl_lb_random_pick(&rng, weights, usable, 4)]++;
    assert_shares(counts, weights, usable, 4, DRAWS, 0.01);

    const uint8_t one[] = {0, 0, 1, 0};
    for (int i = 0; i < 1000; i++)
        assert_int_equal(sl_lb_random_pick(&rng, weights, one, 4), 2);
    const uint8_t none[] = {0, 0, 0, 0};
    assert_int_equal(sl_lb_random_pick(&rng, weights, none, 4), -1);
    assert_int_equal(sl_lb_random_pick(&rng, weights, NULL, 0), -1);
}

/* ---- P2C least request */

static void test_p2c_two_endpoints_is_least_loaded(void **state)
{
    (void)state;
    /* with two usable endpoints both are always the candidates, so the pick
     * is the less loaded one per unit of weight: 3/4 < 1/1 */
    const uint32_t weights[] = {1, 4};
    uint32_t active[] = {1, 3};
    sl_lb_rng_t rng;
    sl_lb_rng_seed(&rng, 1);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(sl_lb_p2c_pick(&rng, weights, active, NULL, 2), 1);
    active[1] = 5; /* 5/4 > 1/1 */
    for (int i = 0; i < 1000; i++)
        assert_int_equal(sl_lb_p2c_pick(&rng, weights, active, NULL, 2), 0);
}

static void test_p2c_busiest_never_picked(void **state)
{
    (void)state;
    const uint32_t weights[] = {1, 1, 1, 1, 1};
    const uint32_t active[] = {0, 3, 100, 2, 1};
    sl_lb_rng_t rng;
    sl_lb_rng_seed(&rng, 5);
    unsigned counts[5] = {0};
    for (int i = 0; i < DRAWS; i++)
        counts[sl_lb_p2c_pick(&rng, weights, active, NULL, 5)]++;
    assert_int_equal(counts[2], 0);
    /* the idle one wins every pair it is in: 4 of the 10 pairs */
    double share0 = (double)counts[0] / DRAWS;
    assert_true(share0 > 0.38 && share0 < 0.42);
    /* the load order is the pick-rate order */
    assert_true(counts[0] > counts[4] && counts[4] > counts[3] && counts[3] > counts[1]);
}

static void test_p2c_equal_load_follows_weights(void **state)
{
    (void)state;
    const uint32_t weights[] = {1, 1, 2};
    const uint32_t active[] = {0, 0, 0};
    sl_lb_rng_t rng;
    sl_lb_rng_seed(&rng, 11);
    unsigned counts[3] = {0};
    for (int i = 0; i < DRAWS; i++)
        counts[sl_lb_p2c_pick(&rng, weights, active, NULL, 3)]++;
    assert_shares(counts, weights, NULL, 3, DRAWS, 0.01);

    /* active NULL: plain weighted random */
    memset(counts, 0, sizeof(counts));
    for (int i = 0; i < DRAWS; i++)
        counts[sl_lb_p2c_pick(&rng, weights, NULL, NULL, 3)]++;
    assert_shares(counts, weights, NULL, 3, DRAWS, 0.01);
}

static void test_p2c_unusable(void **state)
{
    (void)state;
    const uint32_t weights[] = {1, 1, 1};
    const uint32_t active[] = {5, 0, 9};
    sl_lb_rng_t rng;
    sl_lb_rng_seed(&rng, 3);
    const uint8_t skip_idle[] = {1, 0, 1};
    for (int i = 0; i < 1000; i++)
        assert_int_equal(sl_lb_p2c_pick(&rng, weights, active, skip_idle, 3), 0);
    const uint8_t only_busy[] = {0, 0, 1};
    for (int i = 0; i < 1000; i++)
        assert_int_equal(sl_lb_p2c_pick(&rng, weights, active, only_busy, 3), 2);
    const uint8_t none[] = {0, 0, 0};
    assert_int_equal(sl_lb_p2c_pick(&rng, weights, active, none, 3), -1);
    assert_int_equal(sl_lb_p2c_pick(&rng, weights, active, NULL, 0), -1);
}

/* ---- Ring */

static uint64_t key_hash(unsigned k)
{
    char key[32];
    int len = snprintf(key, sizeof(key), "session-%u", k);
    return sl_lb_hash(key, (size_t)len);
}

static void test_ring_same_key_same_endpoint(void **state)
{
    (void)state;
    const uint32_t weights[] = {1, 1, 1, 1};
    sl_lb_ring_t *a = sl_lb_ring_build(weights, 4);
    sl_lb_ring_t *b = sl_lb_ring_build(weights, 4);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_equal(a->n_points, 4 * 160);
    for (size_t p = 1; p < a->n_points; p++)
        assert_true(a->hashes[p - 1] <= a->hashes[p]);
    for (unsigned k = 0; k < 10000; k++) {
        int x = sl_lb_ring_pick(a, key_hash(k), NULL);
        assert_in_range(x, 0, 3);
        assert_int_equal(sl_lb_ring_pick(a, key_hash(k), NULL), x);
        assert_int_equal(sl_lb_ring_pick(b, key_hash(k), NULL), x);
    }
    /* extremes of the circle wrap correctly */
    assert_in_range(sl_lb_ring_pick(a, 0, NULL), 0, 3);
    assert_int_equal(sl_lb_ring_pick(a, UINT64_MAX, NULL), (int)a->owners[0]);
    sl_lb_ring_free(a);
    sl_lb_ring_free(b);
}

static void test_ring_weights_respected(void **state)
{
    (void)state;
    const uint32_t weights[] = {1, 2, 3, 4};
    sl_lb_ring_t *ring = sl_lb_ring_build(weights, 4);
    assert_non_null(ring);
    unsigned counts[4] = {0};
    for (unsigned k = 0; k < DRAWS; k++)
        counts[sl_lb_ring_pick(ring, key_hash(k), NULL)]++;
    /* 160 points per unit of weight: shares within a few percent */
    assert_shares(counts, weights, NULL, 4, DRAWS, 0.03);
    sl_lb_ring_free(ring);
}

static void test_ring_unusable_moves_only_its_keys(void **state)
{
    (void)state;
    enum { N = 5, KEYS = 10000 };
    const uint32_t weights[N] = {1, 1, 1, 1, 1};
    sl_lb_ring_t *ring = sl_lb_ring_build(weights, N);
    assert_non_null(ring);
    uint8_t usable[N] = {1, 1, 1, 1, 1};
    static int before[KEYS];
    for (unsigned k = 0; k < KEYS; k++)
        before[k] = sl_lb_ring_pick(ring, key_hash(k), usable);

    usable[2] = 0;
    unsigned moved = 0, receivers[N] = {0};
    for (unsigned k = 0; k < KEYS; k++) {
        int now = sl_lb_ring_pick(ring, key_hash(k), usable);
        assert_int_not_equal(now, 2);
        if (before[k] != 2) {
            assert_int_equal(now, before[k]);
        } else {
            moved++;
            receivers[now]++;
        }
    }
    /* about 1/N of the keys moved, spread over the other endpoints */
    assert_in_range(moved, KEYS / N * 7 / 10, KEYS / N * 13 / 10);
    for (int i = 0; i < N; i++)
        if (i != 2)
            assert_true(receivers[i] > moved / 10);

    /* usable again: every key is back where it was */
    usable[2] = 1;
    for (unsigned k = 0; k < KEYS; k++)
        assert_int_equal(sl_lb_ring_pick(ring, key_hash(k), usable), before[k]);

    const uint8_t none[N] = {0};
    assert_int_equal(sl_lb_ring_pick(ring, key_hash(1), none), -1);
    const uint8_t only4[N] = {0, 0, 0, 0, 1};
    for (unsigned k = 0; k < 1000; k++)
        assert_int_equal(sl_lb_ring_pick(ring, key_hash(k), only4), 4);
    sl_lb_ring_free(ring);
}

static void test_ring_keyed_config_removal_moves_1_over_n(void **state)
{
    (void)state;
    enum { KEYS = 10000 };
    const char *ids5[] = {"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80",
                          "10.0.0.5:80"};
    /* 10.0.0.3 leaves the config: the others shift down one index */
    const char *ids4[] = {"10.0.0.1:80", "10.0.0.2:80", "10.0.0.4:80", "10.0.0.5:80"};
    const uint32_t weights[] = {1, 1, 1, 1, 1};
    sl_lb_ring_t *r5 = sl_lb_ring_build_keyed(weights, ids5, 5);
    sl_lb_ring_t *r4 = sl_lb_ring_build_keyed(weights, ids4, 4);
    assert_non_null(r5);
    assert_non_null(r4);
    unsigned moved = 0;
    for (unsigned k = 0; k < KEYS; k++) {
        const char *was = ids5[sl_lb_ring_pick(r5, key_hash(k), NULL)];
        const char *now = ids4[sl_lb_ring_pick(r4, key_hash(k), NULL)];
        if (strcmp(was, now) != 0) {
            /* only the removed endpoint's keys move */
            assert_string_equal(was, "10.0.0.3:80");
            moved++;
        } else {
            assert_string_not_equal(was, "10.0.0.3:80");
        }
    }
    assert_in_range(moved, KEYS / 5 * 7 / 10, KEYS / 5 * 13 / 10);

    /* adding a sixth endpoint moves ~1/6 of the keys, all to it */
    const char *ids6[] = {"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80",
                          "10.0.0.4:80", "10.0.0.5:80", "10.0.0.6:80"};
    const uint32_t weights6[] = {1, 1, 1, 1, 1, 1};
    sl_lb_ring_t *r6 = sl_lb_ring_build_keyed(weights6, ids6, 6);
    assert_non_null(r6);
    moved = 0;
    for (unsigned k = 0; k < KEYS; k++) {
        int was = sl_lb_ring_pick(r5, key_hash(k), NULL);
        int now = sl_lb_ring_pick(r6, key_hash(k), NULL);
        if (was != now) {
            assert_int_equal(now, 5);
            moved++;
        }
    }
    assert_in_range(moved, KEYS / 6 * 7 / 10, KEYS / 6 * 13 / 10);
    sl_lb_ring_free(r4);
    sl_lb_ring_free(r5);
    sl_lb_ring_free(r6);
}

static void test_ring_point_positions_are_stable(void **state)
{
    (void)state;
    /* the point j of endpoint "id" sits at sl_lb_hash("id-j"): any runtime,
     * any build, places it at the same spot */
    const char *ids[] = {"10.0.0.1:8080"};
    const uint32_t w[] = {1};
    sl_lb_ring_t *ring = sl_lb_ring_build_keyed(w, ids, 1);
    assert_non_null(ring);
    int found0 = 0, found159 = 0;
    for (size_t p = 0; p < ring->n_points; p++) {
        found0 |= ring->hashes[p] == UINT64_C(0xe627275204f67c59);
        found159 |= ring->hashes[p] == sl_lb_hash("10.0.0.1:8080-159", 17);
    }
    assert_true(found0 && found159);
    sl_lb_ring_free(ring);

    /* unkeyed: the identity is the decimal index */
    sl_lb_ring_t *idx = sl_lb_ring_build(w, 1);
    assert_non_null(idx);
    int found = 0;
    for (size_t p = 0; p < idx->n_points; p++)
        found |= idx->hashes[p] == sl_lb_hash("0-7", 3);
    assert_true(found);
    sl_lb_ring_free(idx);
}

static void test_ring_size_is_bounded(void **state)
{
    (void)state;
    enum { N = 1000 };
    static uint32_t weights[N];
    for (int i = 0; i < N; i++)
        weights[i] = i < 500 ? 100 : 300; /* sum 200k units, 32M unscaled points */
    sl_lb_ring_t *ring = sl_lb_ring_build(weights, N);
    assert_non_null(ring);
    assert_true(ring->n_points <= SL_LB_RING_MAX_POINTS + N);
    assert_true(ring->n_points >= SL_LB_RING_MAX_POINTS - N);
    /* proportions survive the scaling: the heavy half gets ~3/4 */
    unsigned heavy = 0;
    for (unsigned k = 0; k < DRAWS; k++)
        heavy += sl_lb_ring_pick(ring, key_hash(k), NULL) >= 500;
    assert_in_range(heavy, DRAWS * 72 / 100, DRAWS * 78 / 100);
    sl_lb_ring_free(ring);

    /* a tiny weight next to a huge one still owns a point */
    const uint32_t skew[] = {UINT32_MAX, 1};
    sl_lb_ring_t *s = sl_lb_ring_build(skew, 2);
    assert_non_null(s);
    assert_true(s->n_points <= SL_LB_RING_MAX_POINTS + 2);
    int owns1 = 0;
    for (size_t p = 0; p < s->n_points; p++)
        owns1 += s->owners[p] == 1;
    assert_int_equal(owns1, 1);
    const uint8_t only1[] = {0, 1};
    assert_int_equal(sl_lb_ring_pick(s, 12345, only1), 1);
    sl_lb_ring_free(s);

    /* more endpoints than the ring can hold is refused, not truncated */
    assert_null(sl_lb_ring_build(NULL, SL_LB_RING_MAX_POINTS + 1));
}

static void test_ring_empty(void **state)
{
    (void)state;
    sl_lb_ring_t *ring = sl_lb_ring_build(NULL, 0);
    assert_non_null(ring);
    assert_int_equal(sl_lb_ring_pick(ring, 42, NULL), -1);
    sl_lb_ring_free(ring);
    assert_int_equal(sl_lb_ring_pick(NULL, 42, NULL), -1);
    sl_lb_ring_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rng_known_sequence),
        cmocka_unit_test(test_rng_below_is_uniform),
        cmocka_unit_test(test_hash_known_answers),
        cmocka_unit_test(test_swrr_nginx_sequence_5_1_1),
        cmocka_unit_test(test_swrr_equal_weights_round_robin),
        cmocka_unit_test(test_swrr_exact_share_per_cycle),
        cmocka_unit_test(test_swrr_skips_unusable),
        cmocka_unit_test(test_swrr_none_usable),
        cmocka_unit_test(test_swrr_huge_weights_no_overflow),
        cmocka_unit_test(test_random_distribution),
        cmocka_unit_test(test_random_skips_unusable),
        cmocka_unit_test(test_p2c_two_endpoints_is_least_loaded),
        cmocka_unit_test(test_p2c_busiest_never_picked),
        cmocka_unit_test(test_p2c_equal_load_follows_weights),
        cmocka_unit_test(test_p2c_unusable),
        cmocka_unit_test(test_ring_same_key_same_endpoint),
        cmocka_unit_test(test_ring_weights_respected),
        cmocka_unit_test(test_ring_unusable_moves_only_its_keys),
        cmocka_unit_test(test_ring_keyed_config_removal_moves_1_over_n),
        cmocka_unit_test(test_ring_point_positions_are_stable),
        cmocka_unit_test(test_ring_size_is_bounded),
        cmocka_unit_test(test_ring_empty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
