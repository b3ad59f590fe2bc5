/*
 * Unit tests of runtime/proxy/srate.c: the window's arithmetic (scores,
 * wrap-around, outcomes that age out), the pick (best score, ties by
 * weight, exploration, elimination), the classification of responses, the
 * bounded key table (eviction, stale picks dropped) and the registry that
 * keeps windows across generations.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "../../../../runtime/proxy/srate.c"

static const char *const NAMES[] = {"default/a", "default/b", "default/c"};
static const uint32_t EQUAL[] = {1, 1, 1};

static sl_srate_route_t *route(Sluice__V1__SuccessRate *pb, const char *scope, uint32_t window,
                               uint32_t explore_ppm, size_t n)
{
    sluice__v1__success_rate__init(pb);
    pb->scope = (char *)scope;
    pb->window = window;
    pb->explore_ppm = explore_ppm;
    pb->elimination_ppm = 50000;
    pb->max_keys = 16;
    pb->fail_connect = pb->fail_reset = pb->fail_timeout = pb->fail_5xx = 1;
    char err[128];
    sl_srate_route_t *sr = sl_srate_route_build(pb, NULL, NAMES, n, 0, err, sizeof(err));
    assert_non_null(sr);
    return sr;
}

/* Records `fails` failures then `oks` successes for backend b of key "*". */
static void outcomes(sl_srate_route_t *sr, size_t b, int fails, int oks)
{
    sl_lb_rng_t rng;
    sl_lb_rng_seed(&rng, 1);
    char key[SL_SRATE_KEY_NAME_MAX] = "*";
    uint64_t h = sl_lb_hash(key, 1);
    sl_srate_pick_t p;
    sl_srate_pick(sr, EQUAL, sr->num_backends, h, key, 1000, &rng, &p, NULL, NULL);
    p.gbackend = sr->gidx[b];
    p.win = NULL;
    for (int i = 0; i < fails; i++)
        sl_srate_record(sr, &p, 0, 1000);
    for (int i = 0; i < oks; i++)
        sl_srate_record(sr, &p, 1, 1000);
}

static void scores_of(sl_srate_route_t *sr, sl_srate_score_t *s)
{
    sl_lb_rng_t rng;
    sl_lb_rng_seed(&rng, 2);
    sl_srate_pick_t p;
    uint64_t h = sl_lb_hash("*", 1);
    sl_srate_pick(sr, EQUAL, sr->num_backends, h, "*", 1000, &rng, &p, s, NULL);
}

static void test_window_scores_and_wraps(void **state)
{
    (void)state;
    Sluice__V1__SuccessRate pb;
    sl_srate_route_t *sr = route(&pb, "t/window", 10, 0, 2);
    sl_srate_score_t s[2];
    scores_of(sr, s);
    assert_int_equal(s[0].score_ppm, 1000000); /* cold: optimistic */
    assert_int_equal(s[0].outcomes, 0);
    outcomes(sr, 1, 3, 0);
    scores_of(sr, s);
    assert_int_equal(s[1].score_ppm, 700000);
    assert_int_equal(s[1].outcomes, 3);
    outcomes(sr, 1, 0, 7); /* the 3 failures are still in the last 10 */
    scores_of(sr, s);
    assert_int_equal(s[1].score_ppm, 700000);
    outcomes(sr, 1, 0, 3); /* now they are pushed out */
    scores_of(sr, s);
    assert_int_equal(s[1].score_ppm, 1000000);
    assert_int_equal(s[1].outcomes, 10);
    sl_srate_route_free(sr);
}

static void test_best_score_wins_ties_by_weight(void **state)
{
    (void)state;
    Sluice__V1__SuccessRate pb;
    sl_srate_route_t *sr = route(&pb, "t/pick", 20, 0, 3);
    sl_lb_rng_t rng;
    sl_lb_rng_seed(&rng, 7);
    const uint32_t w[] = {3, 1, 1};
    int count[3] = {0};
    sl_srate_pick_t p;
    uint64_t h = sl_lb_hash("*", 1);
    for (int i = 0; i < 40000; i++)
        count[sl_srate_pick(sr, w, 3, h, "*", 1000, &rng, &p, NULL, NULL)]++;
    /* All cold: split by weight 3:1:1. */
    assert_true(count[0] > 22000 && count[0] < 26000);
    assert_true(count[1] > 7000 && count[1] < 9000);
    outcomes(sr, 0, 1, 0); /* a (the heaviest) fails once: b and c tie */
    memset(count, 0, sizeof(count));
    for (int i = 0; i < 10000; i++)
        count[sl_srate_pick(sr, w, 3, h, "*", 1000, &rng, &p, NULL, NULL)]++;
    assert_int_equal(count[0], 0);
    assert_true(count[1] > 4500 && count[2] > 4500);
    sl_srate_route_free(sr);
}

static void test_exploration_ignores_scores(void **state)
{
    (void)state;
    Sluice__V1__SuccessRate pb;
    sl_srate_route_t *sr = route(&pb, "t/explore", 20, 100000 /* 10% */, 2);
    outcomes(sr, 1, 10, 0);
    sl_lb_rng_t rng;
    sl_lb_rng_seed(&rng, 9);
    int to_b = 0, explored = 0;
    sl_srate_pick_t p;
    uint64_t h = sl_lb_hash("*", 1);
    for (int i = 0; i < 20000; i++) {
        to_b += sl_srate_pick(sr, EQUAL, 2, h, "*", 1000, &rng, &p, NULL, NULL) == 1;
        explored += p.explored;
    }
    assert_true(explored > 1700 && explored < 2300);
    assert_int_equal(to_b, explored); /* the probes go to the one out of the best choice */
    sl_srate_route_free(sr);
}

static void test_elimination_and_recovery(void **state)
{
    (void)state;
    Sluice__V1__SuccessRate pb;
    sl_srate_route_t *sr = route(&pb, "t/elim", 200, 0, 2);
    sl_srate_score_t s[2];
    outcomes(sr, 1, 58, 0); /* 0.95^58 = 0.051 */
    scores_of(sr, s);
    assert_false(s[1].eliminated);
    outcomes(sr, 1, 1, 0);
    scores_of(sr, s);
    assert_true(s[1].eliminated);
    outcomes(sr, 1, 100, 0); /* floored at half the threshold */
    scores_of(sr, s);
    assert_true(s[1].elimination_ppm >= 24999 && s[1].elimination_ppm <= 25000);
    outcomes(sr, 1, 0, 15); /* 0.025 * 1.0526^15 > 0.05, with integer rounding */
    scores_of(sr, s);
    assert_false(s[1].eliminated);
    sl_srate_route_free(sr);
}

static void test_failures_age_out(void **state)
{
    (void)state;
    uint32_t n = 10;
    window_t *w = window_new(n);
    sl_srate_score_t s;
    window_record(w, n, 0, 1000, 0, 0, 0, 0);
    window_record(w, n, 0, 5000, 0, 0, 0, 0);
    window_score(w, n, 0, 6000, 0, &s);
    assert_int_equal(s.score_ppm, 800000);
    window_score(w, n, 2000 /* max age */, 6000, 0, &s);
    assert_int_equal(s.score_ppm, 900000); /* the failure at 1000 is too old */
    window_score(w, n, 2000, 9000, 0, &s);
    assert_int_equal(s.score_ppm, 1000000);
    free(w);
}

static void test_classify_status(void **state)
{
    (void)state;
    Sluice__V1__SuccessRate pb;
    sl_srate_route_t *sr = route(&pb, "t/classify", 10, 0, 1);
    assert_int_equal(sl_srate_classify_status(sr, 200, NULL, 0), 1);
    assert_int_equal(sl_srate_classify_status(sr, 304, NULL, 0), 1);
    assert_int_equal(sl_srate_classify_status(sr, 404, NULL, 0), -1);
    assert_int_equal(sl_srate_classify_status(sr, 503, NULL, 0), 0);
    sr->fail_5xx = 0;
    assert_int_equal(sl_srate_classify_status(sr, 503, NULL, 0), -1);
    sr->fail_status_mask[(429 - 400) / 64] |= UINT64_C(1) << ((429 - 400) % 64);
    assert_int_equal(sl_srate_classify_status(sr, 429, NULL, 0), 0);
    pb.fail_header_value = "failure";
    assert_int_equal(sl_srate_classify_status(sr, 200, "FAILURE", 7), 0);
    assert_int_equal(sl_srate_classify_status(sr, 200, "success", 7), 1);
    sl_srate_route_free(sr);
}

static void test_keys_are_bounded_and_stale_picks_dropped(void **state)
{
    (void)state;
    Sluice__V1__SuccessRate pb;
    sl_srate_route_t *sr = route(&pb, "t/keys", 10, 0, 2);
    sl_lb_rng_t rng;
    sl_lb_rng_seed(&rng, 3);
    sl_srate_pick_t first, p;
    char key[8];
    for (int i = 0; i < 40; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        sl_srate_pick(sr, EQUAL, 2, sl_lb_hash(key, strlen(key)), key, 1000 + (uint64_t)i * 2000,
                      &rng, i == 0 ? &first : &p, NULL, NULL);
    }
    assert_int_equal(atomic_load(&sr->group->used), 16);
    assert_int_equal(atomic_load(&sr->group->evictions), 24);
    /* k0, the least recently used, was evicted: its pick no longer counts. */
    srkey_t *k = atomic_load(&sr->group->keys[first.slot - 1]);
    assert_int_not_equal(atomic_load(&k->tag), first.tag);
    sl_srate_record(sr, &first, 0, 100000);
    assert_null(atomic_load(&k->win[first.gbackend]));
    sl_srate_route_free(sr);
}

static void test_windows_survive_a_new_generation(void **state)
{
    (void)state;
    Sluice__V1__SuccessRate pb1, pb2, pb3;
    sl_srate_route_t *old = route(&pb1, "t/swap", 10, 0, 2);
    outcomes(old, 1, 4, 0);
    /* The next generation builds before the old one goes. */
    sl_srate_route_t *next = route(&pb2, "t/swap", 10, 0, 2);
    sl_srate_route_free(old);
    assert_ptr_equal(next->group, next->group);
    sl_srate_score_t s[2];
    scores_of(next, s);
    assert_int_equal(s[1].score_ppm, 600000);
    /* Another window length starts over. */
    sl_srate_route_t *other = route(&pb3, "t/swap", 20, 0, 2);
    assert_ptr_not_equal(other->group, next->group);
    scores_of(other, s);
    assert_int_equal(s[1].score_ppm, 1000000);
    sl_srate_route_free(next);
    sl_srate_route_free(other);
}

/* A priority list scored by success rate: ties go to the first listed, the
 * ranking is the fallback order, and a rule's list has windows of its own. */
static void test_in_order_ranking_and_rule_scopes(void **state)
{
    (void)state;
    Sluice__V1__SuccessRate pb;
    sluice__v1__success_rate__init(&pb);
    pb.scope = "t/rank";
    pb.window = 10;
    pb.elimination_ppm = 50000;
    pb.max_keys = 4;
    char err[128];
    sl_srate_route_t *sr = sl_srate_route_build(&pb, "eu", NAMES, 3, 1, err, sizeof(err));
    assert_non_null(sr);
    assert_string_equal(sl_srate_route_scope(sr), "t/rank rule:eu");
    sl_srate_route_t *plain = sl_srate_route_build(&pb, NULL, NAMES, 3, 0, err, sizeof(err));
    assert_ptr_not_equal(plain->group, sr->group);
    sl_lb_rng_t rng;
    sl_lb_rng_seed(&rng, 3);
    uint64_t h = sl_lb_hash("*", 1);
    sl_srate_pick_t p;
    uint8_t order[3];
    for (int i = 0; i < 100; i++) /* cold: always the first listed */
        assert_int_equal(sl_srate_pick(sr, NULL, 3, h, "*", 1000, &rng, &p, NULL, order), 0);
    assert_int_equal(order[1], 1);
    assert_int_equal(order[2], 2);
    outcomes(sr, 0, 2, 0); /* a: 0.8 */
    outcomes(sr, 1, 1, 0); /* b: 0.9; c stays 1.0 */
    assert_int_equal(sl_srate_pick(sr, NULL, 3, h, "*", 1000, &rng, &p, NULL, order), 2);
    assert_int_equal(p.gbackend, sr->gidx[2]);
    assert_int_equal(order[0], 2);
    assert_int_equal(order[1], 1);
    assert_int_equal(order[2], 0);
    /* The plain scope saw none of it. */
    sl_srate_score_t s[3];
    sl_srate_pick(plain, EQUAL, 3, h, "*", 1000, &rng, &p, s, NULL);
    assert_int_equal(s[0].score_ppm, 1000000);
    /* Weights order the equals after the pick. */
    const uint32_t w[] = {1, 5, 9};
    sl_srate_pick(plain, w, 3, h, "*", 1000, &rng, &p, NULL, order);
    assert_true(order[0] == 0 || order[0] == 1 || order[0] == 2);
    for (int i = 1; i < 2; i++)
        assert_true(w[order[i]] >= w[order[i + 1]]);
    sl_srate_route_free(sr);
    sl_srate_route_free(plain);
}

/* Scores within the tolerance tie (noise does not take all the traffic to
 * one backend); successful probes in a row clear a recovered backend's old
 * failures, a failure among them starts the count over. */
static void test_tolerance_and_recovery_probes(void **state)
{
    (void)state;
    Sluice__V1__SuccessRate pb;
    sl_srate_route_t *sr = route(&pb, "t/recover", 100, 100000, 2);
    sr->tolerance_ppm = 20000;
    sr->recovery_probes = 8;
    sl_lb_rng_t rng;
    sl_lb_rng_seed(&rng, 5);
    uint64_t h = sl_lb_hash("*", 1);
    sl_srate_pick_t p;
    outcomes(sr, 0, 2, 0); /* a: 0.98, within 0.02 of b's 1.0 */
    int to_a = 0;
    for (int i = 0; i < 10000; i++)
        to_a += sl_srate_pick(sr, EQUAL, 2, h, "*", 1000, &rng, &p, NULL, NULL) == 0;
    assert_true(to_a > 4500 && to_a < 5500);
    outcomes(sr, 0, 40, 0); /* a: 0.58, out of the best choice */
    sl_srate_score_t s[2];
    /* Probes: 7 successes, a failure, then 8 successes. */
    int probes = 0, fails_left = 1, oks = 0;
    while (oks < 15) {
        if (sl_srate_pick(sr, EQUAL, 2, h, "*", 1000, &rng, &p, NULL, NULL) != 0)
            continue;
        assert_true(p.probe);
        probes++;
        int ok = !(oks == 7 && fails_left);
        if (!ok)
            fails_left = 0;
        else
            oks++;
        sl_srate_record(sr, &p, ok, 1000);
        scores_of(sr, s);
        if (oks < 15)
            assert_true(s[0].score_ppm < 700000);
    }
    scores_of(sr, s);
    assert_int_equal(s[0].score_ppm, 1000000); /* the 8th success in a row forgave */
    assert_int_equal(s[0].elimination_ppm, 1000000);
    assert_int_equal(probes, 16);
    sl_srate_route_free(sr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_scores_and_wraps),
        cmocka_unit_test(test_best_score_wins_ties_by_weight),
        cmocka_unit_test(test_exploration_ignores_scores),
        cmocka_unit_test(test_elimination_and_recovery),
        cmocka_unit_test(test_failures_age_out),
        cmocka_unit_test(test_classify_status),
        cmocka_unit_test(test_keys_are_bounded_and_stale_picks_dropped),
        cmocka_unit_test(test_windows_survive_a_new_generation),
        cmocka_unit_test(test_in_order_ranking_and_rule_scopes),
        cmocka_unit_test(test_tolerance_and_recovery_probes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
