/*
 * Unit tests of runtime/endpoint.c: the shared registry (identity, refcounts,
 * resolution and its errors), the passive ejection rules, and their behaviour
 * under concurrent workers (real pthreads).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sched.h>
#include <string.h>

#include <cmocka.h>

#include "../../../../runtime/proxy/endpoint.c"

static size_t registry_count(void)
{
    pthread_mutex_lock(&registry.lock);
    size_t n = registry.count;
    pthread_mutex_unlock(&registry.lock);
    return n;
}

static void test_acquire_same_key_shares_state(void **state)
{
    (void)state;
    char err[256];
    sl_endpoint_state_t *a =
        sl_endpoint_acquire("default/echo", "127.0.0.1", 9001, err, sizeof(err));
    assert_non_null(a);
    sl_endpoint_state_t *b =
        sl_endpoint_acquire("default/echo", "127.0.0.1", 9001, err, sizeof(err));
    assert_ptr_equal(a, b);
    assert_int_equal(atomic_load(&a->refs), 2);

    /* any part of the key differing gives a distinct state */
    sl_endpoint_state_t *other_port =
        sl_endpoint_acquire("default/echo", "127.0.0.1", 9002, err, sizeof(err));
    sl_endpoint_state_t *other_cluster =
        sl_endpoint_acquire("default/echo2", "127.0.0.1", 9001, err, sizeof(err));
    sl_endpoint_state_t *other_addr =
        sl_endpoint_acquire("default/echo", "127.0.0.2", 9001, err, sizeof(err));
    assert_non_null(other_port);
    assert_non_null(other_cluster);
    assert_non_null(other_addr);
    assert_ptr_not_equal(other_port, a);
    assert_ptr_not_equal(other_cluster, a);
    assert_ptr_not_equal(other_addr, a);
    assert_int_equal(registry_count(), 4);

    /* state survives while referenced: a "generation swap" keeps it */
    atomic_store(&a->hc_healthy, 0);
    atomic_store(&a->ejections, 3);
    sl_endpoint_release(b);
    sl_endpoint_state_t *c =
        sl_endpoint_acquire("default/echo", "127.0.0.1", 9001, err, sizeof(err));
    assert_ptr_equal(c, a);
    assert_int_equal(atomic_load(&c->hc_healthy), 0);
    assert_int_equal(atomic_load(&c->ejections), 3);

    sl_endpoint_release(a);
    sl_endpoint_release(c);
    sl_endpoint_release(other_port);
    sl_endpoint_release(other_cluster);
    sl_endpoint_release(other_addr);
    assert_int_equal(registry_count(), 0);

    /* after the last release it starts fresh: healthy, not ejected */
    sl_endpoint_state_t *d =
        sl_endpoint_acquire("default/echo", "127.0.0.1", 9001, err, sizeof(err));
    assert_non_null(d);
    assert_int_equal(atomic_load(&d->hc_healthy), 1);
    assert_int_equal(atomic_load(&d->ejections), 0);
    assert_true(atomic_load(&d->ejected_until_ms) == 0);
    assert_int_equal(atomic_load(&d->refs), 1);
    sl_endpoint_release(d);
    assert_int_equal(registry_count(), 0);
}

static void test_acquire_resolves_literals(void **state)
{
    (void)state;
    char err[256];
    sl_endpoint_state_t *v4 = sl_endpoint_acquire("c", "10.1.2.3", 8080, err, sizeof(err));
    assert_non_null(v4);
    assert_int_equal(v4->addr.ss_family, AF_INET);
    assert_int_equal(v4->addr_len, sizeof(struct sockaddr_in));
    struct sockaddr_in *sin = (struct sockaddr_in *)&v4->addr;
    assert_int_equal(ntohs(sin->sin_port), 8080);
    assert_int_equal(ntohl(sin->sin_addr.s_addr), 0x0a010203);
    assert_string_equal(v4->cluster, "c");
    assert_string_equal(v4->address, "10.1.2.3");
    assert_int_equal(v4->port, 8080);

    sl_endpoint_state_t *v6 = sl_endpoint_acquire("c", "::1", 443, err, sizeof(err));
    assert_non_null(v6);
    assert_int_equal(v6->addr.ss_family, AF_INET6);
    assert_int_equal(v6->addr_len, sizeof(struct sockaddr_in6));
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&v6->addr;
    assert_int_equal(ntohs(sin6->sin6_port), 443);
    assert_memory_equal(&sin6->sin6_addr, &in6addr_loopback, sizeof(in6addr_loopback));

    /* the bracketed form resolves the same address (a distinct key) */
    sl_endpoint_state_t *v6b = sl_endpoint_acquire("c", "[::1]", 443, err, sizeof(err));
    assert_non_null(v6b);
    assert_int_equal(v6b->addr.ss_family, AF_INET6);
    assert_memory_equal(&((struct sockaddr_in6 *)&v6b->addr)->sin6_addr, &in6addr_loopback,
                        sizeof(in6addr_loopback));

    /* a host name from /etc/hosts */
    sl_endpoint_state_t *lh = sl_endpoint_acquire("c", "localhost", 80, err, sizeof(err));
    assert_non_null(lh);
    assert_true(lh->addr.ss_family == AF_INET || lh->addr.ss_family == AF_INET6);

    sl_endpoint_release(v4);
    sl_endpoint_release(v6);
    sl_endpoint_release(v6b);
    sl_endpoint_release(lh);
    assert_int_equal(registry_count(), 0);
}

static void test_acquire_errors_name_the_endpoint(void **state)
{
    (void)state;
    char err[256];
    assert_null(sl_endpoint_acquire("default/echo", "db.local.invalid", 5432, err, sizeof(err)));
    assert_non_null(strstr(err, "backend default/echo endpoint db.local.invalid:5432: name does "
                                "not resolve ("));
    assert_int_equal(registry_count(), 0);

    assert_null(sl_endpoint_acquire("default/echo", "1.2.3.4.5", 80, err, sizeof(err)));
    assert_non_null(strstr(err, "endpoint 1.2.3.4.5:80: name does not resolve"));

    assert_null(sl_endpoint_acquire("default/echo", "127.0.0.1", 0, err, sizeof(err)));
    assert_non_null(strstr(err, "port 0 is not valid"));

    assert_null(sl_endpoint_acquire("default/echo", "", 80, err, sizeof(err)));
    assert_non_null(strstr(err, "address must be"));

    char longname[400];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    assert_null(sl_endpoint_acquire("default/echo", longname, 80, err, sizeof(err)));
    assert_non_null(strstr(err, "address must be"));

    assert_null(sl_endpoint_acquire(NULL, "127.0.0.1", 80, err, sizeof(err)));
    assert_null(sl_endpoint_acquire("x", NULL, 80, err, sizeof(err)));
    /* no error buffer: still a clean NULL */
    assert_null(sl_endpoint_acquire("x", "", 80, NULL, 0));
    /* a tiny error buffer is truncated, not overrun (ASan watches) */
    char tiny[8];
    assert_null(sl_endpoint_acquire("default/echo", "db.local.invalid", 5432, tiny, sizeof(tiny)));
    assert_int_equal(strlen(tiny), sizeof(tiny) - 1);
    assert_int_equal(registry_count(), 0);
    sl_endpoint_release(NULL);
}

static void test_registry_grows(void **state)
{
    (void)state;
    enum { N = 1000 };
    static sl_endpoint_state_t *eps[N];
    char err[256];
    for (int i = 0; i < N; i++) {
        eps[i] = sl_endpoint_acquire("big", "127.0.0.1", (uint16_t)(1000 + i), err, sizeof(err));
        assert_non_null(eps[i]);
    }
    assert_int_equal(registry_count(), N);
    assert_true(registry.n_buckets >= N);
    for (int i = 0; i < N; i++)
        assert_ptr_equal(
            sl_endpoint_acquire("big", "127.0.0.1", (uint16_t)(1000 + i), err, sizeof(err)),
            eps[i]);
    for (int i = 0; i < N; i++) {
        sl_endpoint_release(eps[i]);
        sl_endpoint_release(eps[i]);
    }
    assert_int_equal(registry_count(), 0);
}

static void test_now_ms_is_monotonic(void **state)
{
    (void)state;
    uint64_t a = sl_endpoint_now_ms();
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    uint64_t b = sl_endpoint_now_ms();
    assert_true(b >= a + 19);
    assert_true(b < a + 2000);
}

static void test_report_ejects_after_consecutive_failures(void **state)
{
    (void)state;
    char err[256];
    sl_endpoint_state_t *ep = sl_endpoint_acquire("c", "127.0.0.1", 1, err, sizeof(err));
    assert_non_null(ep);
    uint64_t now = 1000000;
    assert_true(sl_endpoint_usable(ep, now));

    /* a success in between resets the run */
    assert_int_equal(sl_endpoint_report(ep, 0, 3, 1000, now), 0);
    assert_int_equal(sl_endpoint_report(ep, 0, 3, 1000, now), 0);
    assert_int_equal(sl_endpoint_report(ep, 1, 3, 1000, now), 0);
    assert_int_equal(atomic_load(&ep->consecutive_failures), 0);
    assert_int_equal(sl_endpoint_report(ep, 0, 3, 1000, now), 0);
    assert_int_equal(sl_endpoint_report(ep, 0, 3, 1000, now), 0);
    assert_true(sl_endpoint_usable(ep, now));
    assert_int_equal(sl_endpoint_report(ep, 0, 3, 1000, now), 1);
    assert_false(sl_endpoint_usable(ep, now));
    assert_false(sl_endpoint_usable(ep, now + 999));
    assert_true(sl_endpoint_usable(ep, now + 1000));
    assert_int_equal(atomic_load(&ep->ejections), 1);

    /* failures while ejected (in-flight stragglers) neither count nor
     * re-eject */
    for (int i = 0; i < 10; i++)
        assert_int_equal(sl_endpoint_report(ep, 0, 3, 1000, now + 10), 0);
    assert_int_equal(atomic_load(&ep->consecutive_failures), 0);

    /* second ejection lasts twice the base */
    now += 1000;
    assert_int_equal(sl_endpoint_report(ep, 0, 3, 1000, now), 0);
    assert_int_equal(sl_endpoint_report(ep, 0, 3, 1000, now), 0);
    assert_int_equal(sl_endpoint_report(ep, 0, 3, 1000, now), 1);
    assert_true(atomic_load(&ep->ejected_until_ms) == now + 2000);

    /* back-off is capped at 300 s */
    atomic_store(&ep->ejections, 1000);
    now += 5000;
    for (int i = 0; i < 2; i++)
        assert_int_equal(sl_endpoint_report(ep, 0, 3, 1000, now), 0);
    assert_int_equal(sl_endpoint_report(ep, 0, 3, 1000, now), 1);
    assert_true(atomic_load(&ep->ejected_until_ms) == now + 300000);

    /* base 0 means the 30 s default; threshold 1 ejects on the first */
    now += 400000;
    atomic_store(&ep->ejections, 0);
    assert_int_equal(sl_endpoint_report(ep, 0, 1, 0, now), 1);
    assert_true(atomic_load(&ep->ejected_until_ms) == now + 30000);

    /* threshold 0: outlier detection off */
    now += 400000;
    for (int i = 0; i < 100; i++)
        assert_int_equal(sl_endpoint_report(ep, 0, 0, 1000, now), 0);
    assert_true(sl_endpoint_usable(ep, now));

    /* health checks and ejection combine */
    atomic_store(&ep->hc_healthy, 0);
    assert_false(sl_endpoint_usable(ep, now));
    assert_int_equal(sl_endpoint_report(NULL, 0, 1, 1, now), 0);
    sl_endpoint_release(ep);
}

/* ---- Concurrency */

struct reporter_arg {
    sl_endpoint_state_t *ep;
    uint64_t now; /* fixed clock, or 0 to advance */
    int iterations;
    int ejected; /* how many reports returned 1 */
    pthread_barrier_t *start;
};

static void *reporter(void *p)
{
    struct reporter_arg *a = p;
    pthread_barrier_wait(a->start);
    for (int i = 0; i < a->iterations; i++) {
        uint64_t now = a->now != 0 ? a->now : (uint64_t)i * 5 + 1000;
        /* mostly failures, a success now and then */
        int success = (i % 97) == 96;
        a->ejected += sl_endpoint_report(a->ep, success, 4, 100, now);
    }
    return NULL;
}

static void test_report_ejects_exactly_once_concurrently(void **state)
{
    (void)state;
    enum { THREADS = 8 };
    char err[256];
    for (int round = 0; round < 20; round++) {
        sl_endpoint_state_t *ep = sl_endpoint_acquire("c", "127.0.0.1", 2, err, sizeof(err));
        assert_non_null(ep);
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, THREADS);
        pthread_t th[THREADS];
        struct reporter_arg args[THREADS];
        for (int i = 0; i < THREADS; i++) {
            args[i] = (struct reporter_arg){ep, 5000, 20000, 0, &start};
            assert_int_equal(pthread_create(&th[i], NULL, reporter, &args[i]), 0);
        }
        int total = 0;
        for (int i = 0; i < THREADS; i++) {
            pthread_join(th[i], NULL);
            total += args[i].ejected;
        }
        pthread_barrier_destroy(&start);
        /* the clock never moved: one ejection, reported by one thread */
        assert_int_equal(total, 1);
        assert_int_equal(atomic_load(&ep->ejections), 1);
        assert_true(atomic_load(&ep->ejected_until_ms) == 5000 + 100);
        sl_endpoint_release(ep);
    }
}

static void test_report_ejections_match_winners_with_moving_clock(void **state)
{
    (void)state;
    enum { THREADS = 8 };
    char err[256];
    sl_endpoint_state_t *ep = sl_endpoint_acquire("c", "127.0.0.1", 3, err, sizeof(err));
    assert_non_null(ep);
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, THREADS);
    pthread_t th[THREADS];
    struct reporter_arg args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (struct reporter_arg){ep, 0, 50000, 0, &start};
        assert_int_equal(pthread_create(&th[i], NULL, reporter, &args[i]), 0);
    }
    int total = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        total += args[i].ejected;
    }
    pthread_barrier_destroy(&start);
    /* every ejection was announced exactly once */
    assert_true(total >= 1);
    assert_int_equal(total, (int)atomic_load(&ep->ejections));
    sl_endpoint_release(ep);
}

/* Many short rounds in which every thread reports the ejecting failure at
 * the same instant (released together by a spinning start line): without a
 * compare-exchange two reporters regularly both see "not ejected yet". The
 * last reporter of a round checks it, resets the endpoint and opens the next
 * round, so no third thread competes for the CPUs. */
enum { RACE_THREADS = 2, RACE_ROUNDS = 30000 };
static struct {
    sl_endpoint_state_t *ep;
    atomic_int go;      /* round number that may start */
    atomic_int done;    /* reports finished, all rounds */
    atomic_int winners; /* reports that returned 1, this round */
    int bad_rounds;     /* written by the last reporter of a round only */
} race;

static void *race_reporter(void *p)
{
    (void)p;
    for (int r = 1; r <= RACE_ROUNDS; r++) {
        /* spin briefly for a simultaneous start, then yield: on a loaded
         * machine a pure spin would burn whole time slices */
        for (unsigned spins = 0; atomic_load_explicit(&race.go, memory_order_acquire) < r;)
            if (++spins % 1024 == 0)
                sched_yield();
        if (sl_endpoint_report(race.ep, 0, 1, 100, 1000))
            atomic_fetch_add(&race.winners, 1);
        if (atomic_fetch_add(&race.done, 1) + 1 == r * RACE_THREADS) {
            if (atomic_load(&race.winners) != 1)
                race.bad_rounds++;
            atomic_store(&race.ep->ejected_until_ms, 0);
            atomic_store(&race.ep->consecutive_failures, 0);
            atomic_store(&race.winners, 0);
            atomic_store_explicit(&race.go, r + 1, memory_order_release);
        }
    }
    return NULL;
}

static void test_report_race_rounds(void **state)
{
    (void)state;
    char err[256];
    race.ep = sl_endpoint_acquire("c", "127.0.0.1", 4, err, sizeof(err));
    assert_non_null(race.ep);
    race.bad_rounds = 0;
    atomic_store(&race.done, 0);
    atomic_store(&race.winners, 0);
    atomic_store(&race.go, 1);
    pthread_t th[RACE_THREADS];
    for (int i = 0; i < RACE_THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, race_reporter, NULL), 0);
    for (int i = 0; i < RACE_THREADS; i++)
        pthread_join(th[i], NULL);
    sl_endpoint_release(race.ep);
    assert_int_equal(race.bad_rounds, 0);
}

struct churn_arg {
    int iterations;
    int failures;
    pthread_barrier_t *start;
};

static void *churner(void *p)
{
    struct churn_arg *a = p;
    char err[256];
    pthread_barrier_wait(a->start);
    for (int i = 0; i < a->iterations; i++) {
        /* a few shared keys, acquired and released in overlapping pairs */
        uint16_t port = (uint16_t)(7000 + i % 5);
        sl_endpoint_state_t *x = sl_endpoint_acquire("churn", "127.0.0.1", port, err, sizeof(err));
        sl_endpoint_state_t *y = sl_endpoint_acquire("churn", "127.0.0.1", port, err, sizeof(err));
        if (x == NULL || y == NULL || x != y || x->port != port)
            a->failures++;
        sl_endpoint_release(x);
        sl_endpoint_release(y);
    }
    return NULL;
}

static void test_concurrent_acquire_release(void **state)
{
    (void)state;
    enum { THREADS = 8 };
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, THREADS);
    pthread_t th[THREADS];
    struct churn_arg args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (struct churn_arg){20000, 0, &start};
        assert_int_equal(pthread_create(&th[i], NULL, churner, &args[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].failures, 0);
    }
    pthread_barrier_destroy(&start);
    assert_int_equal(registry_count(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_acquire_same_key_shares_state),
        cmocka_unit_test(test_acquire_resolves_literals),
        cmocka_unit_test(test_acquire_errors_name_the_endpoint),
        cmocka_unit_test(test_registry_grows),
        cmocka_unit_test(test_now_ms_is_monotonic),
        cmocka_unit_test(test_report_ejects_after_consecutive_failures),
        cmocka_unit_test(test_report_ejects_exactly_once_concurrently),
        cmocka_unit_test(test_report_ejections_match_winners_with_moving_clock),
        cmocka_unit_test(test_report_race_rounds),
        cmocka_unit_test(test_concurrent_acquire_release),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
