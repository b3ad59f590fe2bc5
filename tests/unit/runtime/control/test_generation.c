/*
 * Unit tests of runtime/generation.c's worker holds (generation.h, "Worker
 * holds") with real liburcu QSBR and real threads: each simulated worker is
 * a pthread registered as a QSBR reader, offline by default like the
 * runtime's workers, that runs acquire/release/tick on command from the test
 * thread (which plays the main thread: it publishes, waits for grace periods
 * and watches frees). cmocka asserts only on the test thread.
 *
 * Frees are observed exactly: SL_GENERATION_TEST_ON_FREE records the version
 * of every generation free_rcu frees; rcu_barrier() waits for the call_rcu
 * callbacks queued so far, so "not freed after a barrier" is a real check.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

struct sl_generation;
static void on_free(struct sl_generation *gen);
#define SL_GENERATION_TEST_ON_FREE(gen) on_free(gen)

#include "../../../../runtime/control/generation.c"

/* ---- free accounting ---- */

#define MAX_VERSION 1024
static atomic_uchar freed[MAX_VERSION];
static atomic_int frees_total;

static void on_free(struct sl_generation *gen)
{
    /* call_rcu thread */
    if (gen->version < MAX_VERSION)
        atomic_fetch_add(&freed[gen->version], 1);
    atomic_fetch_add(&frees_total, 1);
}

/* Waits until every call_rcu callback queued so far has run. Offline, as a
 * registered QSBR thread must be while it blocks. */
static void flush_rcu(void)
{
    rcu_barrier();
}

/* A full grace period, then the callbacks it released. */
static void grace_period(void)
{
    synchronize_rcu();
    flush_rcu();
}

static int is_freed(uint64_t version)
{
    return atomic_load(&freed[version]);
}

static long refs_of(sl_generation_t *gen)
{
    return atomic_load(&gen->refs);
}

/* ---- the main thread's side ---- */

static uint64_t next_version = 1;

static sl_generation_t *gen_new(unsigned nworkers)
{
    Sluice__V1__Snapshot *snap = calloc(1, sizeof(*snap));
    assert_non_null(snap);
    sluice__v1__snapshot__init(snap);
    snap->version = next_version++;
    assert_true(snap->version < MAX_VERSION);
    char err[256];
    sl_generation_t *gen = sl_generation_build(snap, "test", nworkers, err, sizeof(err));
    assert_non_null(gen);
    return gen;
}

static void publish(sl_generation_t *gen)
{
    rcu_thread_online();
    sl_generation_publish(gen);
    rcu_thread_offline();
}

/* What sl_config_free does: nothing published any more. */
static void unpublish(void)
{
    rcu_thread_online();
    sl_generation_t *old = rcu_xchg_pointer(&sl_generation_published, NULL);
    if (old)
        sl_generation_retire(old);
    rcu_thread_offline();
}

/* ---- a worker thread driven by commands ---- */

enum cmd { CMD_NONE, CMD_ACQUIRE, CMD_RELEASE, CMD_TICK, CMD_LOOP, CMD_EXIT };

#define MAX_REQUESTS 32

typedef struct {
    sl_worker_t w; /* only id and the held list are used */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    enum cmd cmd;
    int done;
    unsigned arg;
    /* the worker's requests in flight: the generation each one holds */
    sl_generation_t *requests[MAX_REQUESTS];
    unsigned num_requests;
    /* CMD_LOOP's observations */
    long refs_min, refs_max;
} tworker_t;

static void do_cmd(tworker_t *t)
{
    switch (t->cmd) {
    case CMD_ACQUIRE:
        t->requests[t->num_requests++] = sl_generation_acquire(&t->w);
        break;
    case CMD_RELEASE: {
        /* arg = index of the request that ends */
        sl_generation_t *gen = t->requests[t->arg];
        memmove(&t->requests[t->arg], &t->requests[t->arg + 1],
                (t->num_requests - t->arg - 1) * sizeof(t->requests[0]));
        t->num_requests--;
        sl_generation_release(&t->w, gen);
        break;
    }
    case CMD_TICK:
        sl_generation_tick(&t->w);
        break;
    case CMD_LOOP: {
        /* arg sequential requests, as a keep-alive connection makes them,
         * with the shared count read around each */
        t->refs_min = LONG_MAX;
        t->refs_max = LONG_MIN;
        for (unsigned i = 0; i < t->arg; i++) {
            sl_generation_t *gen = sl_generation_acquire(&t->w);
            long r = atomic_load(&gen->refs);
            sl_generation_release(&t->w, gen);
            long r2 = atomic_load(&gen->refs);
            t->refs_min = r < t->refs_min ? r : t->refs_min;
            t->refs_min = r2 < t->refs_min ? r2 : t->refs_min;
            t->refs_max = r > t->refs_max ? r : t->refs_max;
            t->refs_max = r2 > t->refs_max ? r2 : t->refs_max;
        }
        break;
    }
    case CMD_EXIT:
        while (t->num_requests)
            sl_generation_release(&t->w, t->requests[--t->num_requests]);
        sl_generation_release_all(&t->w);
        break;
    case CMD_NONE:
        break;
    }
}

static void *tworker_main(void *arg)
{
    tworker_t *t = arg;
    rcu_register_thread();
    rcu_thread_offline();
    pthread_mutex_lock(&t->lock);
    for (;;) {
        while (t->cmd == CMD_NONE)
            pthread_cond_wait(&t->cond, &t->lock);
        enum cmd c = t->cmd;
        do_cmd(t);
        t->cmd = CMD_NONE;
        t->done = 1;
        pthread_cond_broadcast(&t->cond);
        if (c == CMD_EXIT)
            break;
    }
    pthread_mutex_unlock(&t->lock);
    rcu_thread_online();
    rcu_unregister_thread();
    return NULL;
}

static tworker_t *tworker_start(unsigned id)
{
    tworker_t *t = calloc(1, sizeof(*t));
    assert_non_null(t);
    t->w.id = id;
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->cond, NULL);
    assert_int_equal(pthread_create(&t->thread, NULL, tworker_main, t), 0);
    return t;
}

/* Starts one command on the worker's thread. */
static void post(tworker_t *t, enum cmd c, unsigned arg)
{
    pthread_mutex_lock(&t->lock);
    t->cmd = c;
    t->arg = arg;
    t->done = 0;
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
}

static void wait_done(tworker_t *t)
{
    pthread_mutex_lock(&t->lock);
    while (!t->done)
        pthread_cond_wait(&t->cond, &t->lock);
    pthread_mutex_unlock(&t->lock);
}

static void run(tworker_t *t, enum cmd c, unsigned arg)
{
    post(t, c, arg);
    wait_done(t);
}

static sl_generation_t *acquire(tworker_t *t)
{
    run(t, CMD_ACQUIRE, 0);
    return t->requests[t->num_requests - 1];
}

/* Ends the worker's request that holds `gen` (the oldest such). */
static void release(tworker_t *t, sl_generation_t *gen)
{
    for (unsigned i = 0; i < t->num_requests; i++) {
        if (t->requests[i] == gen) {
            run(t, CMD_RELEASE, i);
            return;
        }
    }
    fail_msg("worker %u has no request on generation %llu", t->w.id,
             (unsigned long long)gen->version);
}

static void tworker_stop(tworker_t *t)
{
    run(t, CMD_EXIT, 0);
    pthread_join(t->thread, NULL);
    assert_int_equal(t->w.num_gens_held, 0);
    pthread_mutex_destroy(&t->lock);
    pthread_cond_destroy(&t->cond);
    free(t);
}

/* Ends a test: workers exit, the last generation is unpublished, all freed. */
static void finish(tworker_t **ts, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        tworker_stop(ts[i]);
    unpublish();
    grace_period();
    for (uint64_t v = 1; v < next_version; v++)
        assert_int_equal(is_freed(v), 1); /* each exactly once */
}

/* ---- (a) a request keeps its replaced generation alive ---- */

static void test_request_keeps_replaced_generation(void **state)
{
    (void)state;
    tworker_t *w0 = tworker_start(0);
    sl_generation_t *g1 = gen_new(2);
    uint64_t v1 = g1->version;
    publish(g1);
    assert_ptr_equal(acquire(w0), g1);
    /* holders: published + worker 0 */
    assert_int_equal(refs_of(g1), 2);

    sl_generation_t *g2 = gen_new(2);
    publish(g2);
    grace_period();
    grace_period();
    assert_false(is_freed(v1));
    assert_int_equal(refs_of(g1), 1); /* the published reference is gone */

    release(w0, g1);
    flush_rcu();
    assert_true(is_freed(v1));
    assert_int_equal(w0->w.num_gens_held, 0);
    assert_false(is_freed(g2->version));
    tworker_t *ws[] = {w0};
    finish(ws, 1);
}

/* ---- (b) two workers, overlapping requests ---- */

static void two_workers(int worker0_last)
{
    tworker_t *ws[] = {tworker_start(0), tworker_start(1)};
    sl_generation_t *g1 = gen_new(2);
    uint64_t v1 = g1->version;
    publish(g1);
    assert_ptr_equal(acquire(ws[0]), g1);
    assert_ptr_equal(acquire(ws[1]), g1);
    assert_ptr_equal(acquire(ws[0]), g1);
    assert_ptr_equal(acquire(ws[1]), g1);
    /* holders, not requests: published + one per worker */
    assert_int_equal(refs_of(g1), 3);

    sl_generation_t *g2 = gen_new(2);
    publish(g2);
    grace_period();
    assert_false(is_freed(v1));

    /* new requests go to g2 while the old ones still run on g1 */
    tworker_t *first = ws[worker0_last ? 1 : 0], *last = ws[worker0_last ? 0 : 1];
    assert_ptr_equal(acquire(last), g2);
    assert_int_equal(last->w.num_gens_held, 2);

    release(first, g1);
    release(last, g1);
    release(first, g1);
    flush_rcu();
    assert_false(is_freed(v1)); /* `first` is done with it, `last` is not */
    assert_int_equal(first->w.num_gens_held, 0);
    assert_int_equal(refs_of(g1), 1);

    release(last, g1);
    flush_rcu();
    assert_true(is_freed(v1));
    assert_int_equal(last->w.num_gens_held, 1); /* g2, still current */
    release(last, g2);
    assert_false(is_freed(g2->version));
    finish(ws, 2);
}

static void test_two_workers_freed_after_last_request(void **state)
{
    (void)state;
    two_workers(0);
    two_workers(1);
}

/* ---- (c) an idle worker releases a retired generation at its tick ---- */

static void test_idle_worker_releases_at_tick(void **state)
{
    (void)state;
    tworker_t *w0 = tworker_start(0);
    sl_generation_t *g1 = gen_new(2);
    uint64_t v1 = g1->version;
    publish(g1);
    acquire(w0);
    release(w0, g1);
    /* idle, but the worker keeps its reference on the current generation */
    assert_int_equal(w0->w.num_gens_held, 1);
    assert_int_equal(refs_of(g1), 2);

    publish(gen_new(2));
    grace_period();
    assert_false(is_freed(v1)); /* only the idle worker's reference is left */
    assert_int_equal(refs_of(g1), 1);

    run(w0, CMD_TICK, 0);
    assert_int_equal(w0->w.num_gens_held, 0);
    flush_rcu();
    assert_true(is_freed(v1));
    tworker_t *ws[] = {w0};
    finish(ws, 1);
}

/* The end of any later request drops it too, without waiting for the tick. */
static void test_next_request_releases_idle_retired(void **state)
{
    (void)state;
    tworker_t *w0 = tworker_start(0);
    sl_generation_t *g1 = gen_new(2);
    uint64_t v1 = g1->version;
    publish(g1);
    acquire(w0);
    release(w0, g1);
    sl_generation_t *g2 = gen_new(2);
    publish(g2);
    grace_period();
    assert_false(is_freed(v1));

    assert_ptr_equal(acquire(w0), g2);
    release(w0, g2);
    flush_rcu();
    assert_true(is_freed(v1));
    assert_int_equal(w0->w.num_gens_held, 1);
    assert_ptr_equal(w0->w.gens_held[0], g2);
    tworker_t *ws[] = {w0};
    finish(ws, 1);
}

/* ---- (d) sequential requests do not write the shared count ---- */

static void test_sequential_requests_leave_shared_count_alone(void **state)
{
    (void)state;
    tworker_t *ws[] = {tworker_start(0), tworker_start(1)};
    sl_generation_t *g1 = gen_new(2);
    publish(g1);
    /* first request of each worker: its one shared reference */
    acquire(ws[0]);
    release(ws[0], g1);
    acquire(ws[1]);
    release(ws[1], g1);
    long before = refs_of(g1);
    assert_int_equal(before, 3);

    run(ws[0], CMD_LOOP, 1000);
    assert_int_equal(refs_of(g1), before);
    assert_int_equal(ws[0]->refs_min, before);
    assert_int_equal(ws[0]->refs_max, before);
    /* both workers at once, with a request left running on worker 1 */
    acquire(ws[1]);
    post(ws[0], CMD_LOOP, 1000);
    post(ws[1], CMD_LOOP, 1000);
    wait_done(ws[0]);
    wait_done(ws[1]);
    assert_int_equal(ws[0]->refs_min, before);
    assert_int_equal(ws[0]->refs_max, before);
    assert_int_equal(ws[1]->refs_min, before);
    assert_int_equal(ws[1]->refs_max, before);
    assert_int_equal(atomic_load(&g1->worker_slots[1].requests), 1);
    release(ws[1], g1);
    assert_int_equal(atomic_load(&g1->worker_slots[0].requests), 0);
    assert_int_equal(atomic_load(&g1->worker_slots[1].requests), 0);
    assert_int_equal(refs_of(g1), before);
    finish(ws, 2);
}

/* ---- bounds and fallbacks ---- */

/* Requests spanning more reloads than a worker lists: the extra ones take
 * their own shared reference, and every generation is still freed right
 * after its last request, in any order. */
static void test_full_list_falls_back_to_shared_refs(void **state)
{
    (void)state;
    enum { N = SL_WORKER_GENS_HELD + 3 };
    tworker_t *w0 = tworker_start(0);
    sl_generation_t *gens[N];
    uint64_t versions[N];
    for (int i = 0; i < N; i++) {
        gens[i] = gen_new(1);
        versions[i] = gens[i]->version;
        publish(gens[i]);
        acquire(w0);
        acquire(w0);
    }
    assert_int_equal(w0->w.num_gens_held, SL_WORKER_GENS_HELD);
    /* an unlisted generation: published + one per request */
    assert_int_equal(refs_of(gens[N - 1]), 3);
    grace_period();
    assert_int_equal(refs_of(gens[0]), 1);     /* listed, retired: the worker's */
    assert_int_equal(refs_of(gens[N - 2]), 2); /* unlisted, retired: its requests' */
    for (int i = 0; i < N; i++)
        assert_false(is_freed(versions[i]));

    /* end them out of order: odd generations first, then even ones */
    for (int pass = 1; pass >= 0; pass--) {
        for (int i = pass; i < N; i += 2) {
            release(w0, gens[i]);
            flush_rcu();
            assert_false(is_freed(versions[i]));
            release(w0, gens[i]);
            flush_rcu();
            /* the last generation is still the published one */
            if (i == N - 1)
                assert_false(is_freed(versions[i]));
            else
                assert_true(is_freed(versions[i]));
        }
    }
    tworker_t *ws[] = {w0};
    finish(ws, 1);
}

/* A generation built for fewer workers than there are (none today): that
 * worker's requests take shared references, counted and freed exactly. */
static void test_worker_beyond_slots_uses_shared_refs(void **state)
{
    (void)state;
    tworker_t *w1 = tworker_start(1);
    sl_generation_t *g1 = gen_new(1);
    uint64_t v1 = g1->version;
    publish(g1);
    acquire(w1);
    acquire(w1);
    assert_int_equal(refs_of(g1), 3);
    assert_int_equal(w1->w.num_gens_held, 0);
    publish(gen_new(1));
    release(w1, g1);
    grace_period();
    assert_false(is_freed(v1));
    release(w1, g1);
    flush_rcu();
    assert_true(is_freed(v1));
    tworker_t *ws[] = {w1};
    finish(ws, 1);
}

/* A worker that exits gives back the current generation's reference, or the
 * runtime's final retire would leak it. */
static void test_worker_exit_releases_current(void **state)
{
    (void)state;
    tworker_t *w0 = tworker_start(0);
    sl_generation_t *g1 = gen_new(2);
    publish(g1);
    acquire(w0);
    release(w0, g1);
    assert_int_equal(refs_of(g1), 2);
    tworker_stop(w0);
    assert_int_equal(refs_of(g1), 1);
    finish(NULL, 0);
}

/* ---- races: publishes while workers take and drop holds ---- */

#define STRESS_WORKERS 3
#define STRESS_RELOADS 300

static atomic_int stress_stop;

typedef struct {
    sl_worker_t w;
    atomic_ulong requests; /* written by the worker, read by the test thread */
} stress_worker_t;

static void *stress_main(void *arg)
{
    stress_worker_t *s = arg;
    rcu_register_thread();
    rcu_thread_offline();
    sl_generation_t *inflight[4] = {0};
    uint64_t rng = 0x9e3779b97f4a7c15ULL * (s->w.id + 1);
    while (!atomic_load(&stress_stop)) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        unsigned slot = rng % 4;
        if (inflight[slot]) {
            /* the generation must still be whole: read something in it */
            if (inflight[slot]->nworkers != STRESS_WORKERS)
                abort();
            sl_generation_release(&s->w, inflight[slot]);
            inflight[slot] = NULL;
        } else if (rng & 16) {
            /* callers already online are fine too */
            rcu_thread_online();
            inflight[slot] = sl_generation_acquire(&s->w);
            rcu_thread_offline();
        } else {
            inflight[slot] = sl_generation_acquire(&s->w);
        }
        atomic_fetch_add_explicit(&s->requests, 1, memory_order_relaxed);
        if ((rng & 0xff) == 0)
            sl_generation_tick(&s->w);
    }
    for (int i = 0; i < 4; i++)
        if (inflight[i])
            sl_generation_release(&s->w, inflight[i]);
    sl_generation_release_all(&s->w);
    rcu_thread_online();
    rcu_unregister_thread();
    return NULL;
}

static void test_concurrent_reloads(void **state)
{
    (void)state;
    stress_worker_t *sw = calloc(STRESS_WORKERS, sizeof(*sw));
    assert_non_null(sw);
    pthread_t th[STRESS_WORKERS];
    int frees_before = atomic_load(&frees_total);
    uint64_t first = next_version;
    publish(gen_new(STRESS_WORKERS));
    atomic_store(&stress_stop, 0);
    for (unsigned i = 0; i < STRESS_WORKERS; i++) {
        sw[i].w.id = i;
        assert_int_equal(pthread_create(&th[i], NULL, stress_main, &sw[i]), 0);
    }
    unsigned long seen[STRESS_WORKERS] = {0};
    for (int r = 0; r < STRESS_RELOADS; r++) {
        publish(gen_new(STRESS_WORKERS));
        if (r % 50 == 0)
            synchronize_rcu();
        /* Every 10 reloads, each worker made requests since the last check,
         * so that all of them overlap the reloads even on a busy machine. */
        for (unsigned i = 0; r % 10 == 0 && i < STRESS_WORKERS; i++) {
            while (atomic_load(&sw[i].requests) <= seen[i] + 16)
                sched_yield();
            seen[i] = atomic_load(&sw[i].requests);
        }
    }
    atomic_store(&stress_stop, 1);
    for (unsigned i = 0; i < STRESS_WORKERS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(sw[i].w.num_gens_held, 0);
        assert_true(atomic_load(&sw[i].requests) > 16 * STRESS_RELOADS / 10);
    }
    grace_period();
    /* every generation but the published one is gone, each once */
    assert_int_equal(atomic_load(&frees_total) - frees_before, STRESS_RELOADS);
    for (uint64_t v = first; v < next_version - 1; v++)
        assert_int_equal(is_freed(v), 1);
    free(sw);
    finish(NULL, 0);
}

/* ---- set-up ---- */

static int group_setup(void **state)
{
    (void)state;
    /* The test thread plays the runtime's main thread: registered, offline
     * except around publishes. */
    rcu_register_thread();
    rcu_thread_offline();
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    flush_rcu();
    rcu_thread_online();
    rcu_unregister_thread();
    return 0;
}

/* ---- listener http2 settings ---- */

static Sluice__V1__Snapshot *snap_with_listener(Sluice__V1__Listener__Protocol proto,
                                                Sluice__V1__ListenerHttp2 **h2)
{
    Sluice__V1__Snapshot *snap = calloc(1, sizeof(*snap));
    Sluice__V1__Listener *l = calloc(1, sizeof(*l));
    *h2 = calloc(1, sizeof(**h2));
    assert_true(snap && l && *h2);
    sluice__v1__snapshot__init(snap);
    sluice__v1__listener__init(l);
    sluice__v1__listener_http2__init(*h2);
    snap->version = next_version++;
    snap->listeners = calloc(1, sizeof(*snap->listeners));
    assert_non_null(snap->listeners);
    snap->listeners[0] = l;
    snap->n_listeners = 1;
    l->name = strdup("a");
    l->address = strdup("127.0.0.1");
    l->port = 1000;
    l->protocol = proto;
    l->http2 = *h2;
    return snap;
}

static void test_listener_http2_settings(void **state)
{
    (void)state;
    char err[512] = "";
    Sluice__V1__ListenerHttp2 *h2;
    Sluice__V1__Snapshot *snap = snap_with_listener(SLUICE__V1__LISTENER__PROTOCOL__H2C, &h2);
    h2->max_concurrent_streams = 5;
    h2->max_reset_streams_per_window = 7;
    h2->reset_window_ms = 2000;
    h2->max_header_list_bytes = 4096;
    h2->connection_send_buffer_bytes = 131072;
    sl_generation_t *gen = sl_generation_build(snap, "test", 1, err, sizeof(err));
    if (!gen)
        fail_msg("%s", err);
    sl_h2_settings_t set;
    memset(&set, 0xff, sizeof(set));
    assert_int_equal(sl_generation_h2_settings(gen, "127.0.0.1:1000", &set), 1);
    assert_int_equal(set.max_concurrent_streams, 5);
    assert_int_equal(set.aborted_streams_max, 7);
    assert_int_equal(set.aborted_window_ms, 2000);
    assert_int_equal(set.max_header_list_bytes, 4096);
    assert_int_equal(set.conn_send_buffer_bytes, 131072);
    assert_int_equal(set.stream_window_bytes, 0); /* unset: the codec's default */
    assert_int_equal(set.enable_connect_protocol, 0);
    memset(&set, 0xff, sizeof(set));
    assert_int_equal(sl_generation_h2_settings(gen, "127.0.0.1:1001", &set), 0);
    assert_int_equal(set.max_concurrent_streams, 0);
    assert_int_equal(sl_generation_h2_settings(NULL, "127.0.0.1:1000", &set), 0);
    sl_generation_discard(gen);

    /* What a controller of another build may push: refused (a NACK), with
     * the listener and the field named. */
    snap = snap_with_listener(SLUICE__V1__LISTENER__PROTOCOL__H2C, &h2);
    h2->max_concurrent_streams = 20000;
    assert_null(sl_generation_build(snap, "test", 1, err, sizeof(err)));
    assert_string_equal(err, "listener 'a': http2.max_concurrent_streams: 20000 is out of range "
                             "1..10000 (0 = default 100)");
    snap = snap_with_listener(SLUICE__V1__LISTENER__PROTOCOL__H2C, &h2);
    h2->control_window_ms = 10;
    assert_null(sl_generation_build(snap, "test", 1, err, sizeof(err)));
    assert_string_equal(err, "listener 'a': http2.control_window_ms: 10 is out of range "
                             "1000..600000 (0 = default 10000)");
    snap = snap_with_listener(SLUICE__V1__LISTENER__PROTOCOL__H2C, &h2);
    h2->initial_stream_window_bytes = 2097152;
    assert_null(sl_generation_build(snap, "test", 1, err, sizeof(err)));
    assert_string_equal(err, "listener 'a': http2.initial_connection_window_bytes: 1048576 is "
                             "less than initial_stream_window_bytes (2097152)");
    snap = snap_with_listener(SLUICE__V1__LISTENER__PROTOCOL__HTTP, &h2);
    assert_null(sl_generation_build(snap, "test", 1, err, sizeof(err)));
    assert_string_equal(err, "listener 'a': http2 is set but the listener's protocol is http "
                             "(HTTP/1.1 only; use h2c or https)");
}

/* The defaults the validator and the docs state (common/listener_http2.c)
 * are the codec's (runtime/http/h2.c, settings_fill). */
static void test_listener_http2_defaults_are_the_codecs(void **state)
{
    (void)state;
    sl_h2_conn_t *c = sl_h2_conn_new(NULL, NULL, NULL);
    assert_non_null(c);
    const sl_h2_settings_t *d = sl_h2_conn_settings(c);
    const uint32_t codec[SL_LH2__COUNT] = {
        [SL_LH2_MAX_CONCURRENT_STREAMS] = d->max_concurrent_streams,
        [SL_LH2_STREAM_WINDOW] = d->stream_window_bytes,
        [SL_LH2_CONN_WINDOW] = d->conn_window_bytes,
        [SL_LH2_MAX_HEADER_LIST] = d->max_header_list_bytes,
        [SL_LH2_MAX_HEADER_FIELDS] = d->max_header_fields,
        [SL_LH2_MAX_CONTINUATIONS] = d->max_continuations,
        [SL_LH2_HEADER_TABLE] = d->header_table_bytes,
        [SL_LH2_CTRL_FRAMES_MAX] = d->ctrl_frames_max,
        [SL_LH2_CTRL_WINDOW] = d->ctrl_window_ms,
        [SL_LH2_RESETS_MAX] = d->aborted_streams_max,
        [SL_LH2_RESET_WINDOW] = d->aborted_window_ms,
        [SL_LH2_EMPTY_DATA_MAX] = d->empty_data_max,
        [SL_LH2_STREAM_SEND_BUFFER] = d->stream_send_buffer_bytes,
        [SL_LH2_CONN_SEND_BUFFER] = d->conn_send_buffer_bytes,
    };
    for (int i = 0; i < SL_LH2__COUNT; i++)
        if (sl_listener_http2_fields[i].def != codec[i])
            fail_msg("%s: table default %u, codec default %u", sl_listener_http2_fields[i].name,
                     sl_listener_http2_fields[i].def, codec[i]);
    sl_h2_conn_free(c);
}


/* ---- sharing unchanged parts between generations (generation.c, "Sharing") ---- */

/* A heap copy of a message built on the stack, owned as the config stream
 * owns what it decodes. */
static void *owned(const void *msg)
{
    const ProtobufCMessage *m = msg;
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    assert_non_null(buf);
    protobuf_c_message_pack(m, buf);
    void *o = protobuf_c_message_unpack(m->descriptor, NULL, n, buf);
    free(buf);
    assert_non_null(o);
    return o;
}

static Sluice__V1__Cluster *mk_cluster(const char *name, uint32_t port)
{
    Sluice__V1__Endpoint ep = SLUICE__V1__ENDPOINT__INIT;
    ep.address = "127.0.0.1";
    ep.port = port;
    Sluice__V1__Endpoint *eps[1] = {&ep};
    Sluice__V1__Cluster c = SLUICE__V1__CLUSTER__INIT;
    c.name = (char *)name;
    c.n_endpoints = 1;
    c.endpoints = eps;
    return owned(&c);
}

/* An Api under base path /NAME with one exact route PATH to CLUSTER. */
static Sluice__V1__RouteTable *mk_table(const char *name, const char *path, const char *cluster)
{
    char base[64];
    snprintf(base, sizeof(base), "/%s", name);
    Sluice__V1__BackendRef ref = SLUICE__V1__BACKEND_REF__INIT;
    ref.cluster = (char *)cluster;
    Sluice__V1__BackendRef *refs[1] = {&ref};
    Sluice__V1__Route r = SLUICE__V1__ROUTE__INIT;
    r.name = "op";
    r.path = (char *)path;
    r.path_kind = SLUICE__V1__ROUTE__PATH_KIND__EXACT;
    r.n_backends = 1;
    r.backends = refs;
    Sluice__V1__Route *routes[1] = {&r};
    Sluice__V1__RouteTable t = SLUICE__V1__ROUTE_TABLE__INIT;
    t.name = (char *)name;
    t.base_path = base;
    t.n_routes = 1;
    t.routes = routes;
    return owned(&t);
}

typedef struct {
    Sluice__V1__Cluster *clusters[2];
    Sluice__V1__RouteTable *tables[2];
    Sluice__V1__Consumer *consumers[1];
    size_t n_consumers;
    Sluice__V1__GatewaySettings *settings;
} held_t;

/* What xds.c does: a shell over the held messages, built sharing with prev. */
static sl_generation_t *build_held(const held_t *h, const sl_generation_t *prev)
{
    Sluice__V1__Snapshot view = SLUICE__V1__SNAPSHOT__INIT;
    view.version = next_version++;
    view.n_clusters = 2;
    view.clusters = (Sluice__V1__Cluster **)h->clusters;
    view.n_route_tables = 2;
    view.route_tables = (Sluice__V1__RouteTable **)h->tables;
    view.n_consumers = h->n_consumers;
    view.consumers = (Sluice__V1__Consumer **)h->consumers;
    view.settings = h->settings;
    Sluice__V1__Snapshot *shell = sl_pbshare_snapshot(&view);
    assert_non_null(shell);
    char err[512] = "";
    sl_generation_t *gen = sl_generation_build_from(shell, "test", 1, prev, err, sizeof(err));
    if (!gen)
        fail_msg("build: %s", err);
    return gen;
}

static uint64_t gauge(_Atomic uint64_t *g)
{
    return atomic_load(g);
}

static void release_msg(void *m)
{
    assert_int_equal(sl_pbshare_refs(m), 0); /* no generation holds it any more */
    sl_pbshare_unref(m);
}

static void release_held(held_t *h)
{
    for (int i = 0; i < 2; i++) {
        release_msg(h->clusters[i]);
        release_msg(h->tables[i]);
    }
    for (size_t i = 0; i < h->n_consumers; i++)
        release_msg(h->consumers[i]);
    if (h->settings)
        release_msg(h->settings);
}

static int route_of(const sl_generation_t *gen, const char *path, sl_router_result_t *res)
{
    sl_router_request_t req = {
        .host = {"example.com", 11},
        .path = {path, strlen(path)},
        .method_bit = SL_METHOD_GET,
    };
    return sl_router_match(gen->router, &req, res);
}

static void test_change_rebuilds_only_the_changed_table(void **state)
{
    (void)state;
    held_t h = {.clusters = {mk_cluster("a", 9001), mk_cluster("b", 9002)},
                .tables = {mk_table("t1", "/x", "a"), mk_table("t2", "/y", "b")}};
    uint64_t tb0 = gauge(&sl_metrics_gauges.gen_tables_built);
    uint64_t cb0 = gauge(&sl_metrics_gauges.gen_clusters_built);
    sl_generation_t *g1 = build_held(&h, NULL);
    assert_int_equal(gauge(&sl_metrics_gauges.gen_tables_built) - tb0, 2);
    assert_int_equal(gauge(&sl_metrics_gauges.gen_clusters_built) - cb0, 2);
    /* The messages are owned by the held set and referenced by g1's shell. */
    assert_int_equal(sl_pbshare_refs(h.tables[0]), 2);

    /* t2 changes (a new message, as a delta push decodes it). */
    Sluice__V1__RouteTable *t2_old = h.tables[1];
    h.tables[1] = mk_table("t2", "/z", "b");
    uint64_t tb1 = gauge(&sl_metrics_gauges.gen_tables_built);
    uint64_t ts1 = gauge(&sl_metrics_gauges.gen_tables_shared);
    uint64_t cb1 = gauge(&sl_metrics_gauges.gen_clusters_built);
    uint64_t cs1 = gauge(&sl_metrics_gauges.gen_clusters_shared);
    sl_generation_t *g2 = build_held(&h, g1);
    assert_int_equal(gauge(&sl_metrics_gauges.gen_tables_built) - tb1, 1);
    assert_int_equal(gauge(&sl_metrics_gauges.gen_tables_shared) - ts1, 1);
    assert_int_equal(gauge(&sl_metrics_gauges.gen_clusters_built) - cb1, 0);
    assert_int_equal(gauge(&sl_metrics_gauges.gen_clusters_shared) - cs1, 2);

    /* t1: the same compiled table, routes and counters; t2: built anew. */
    assert_ptr_equal(g2->tables[0], g1->tables[0]);
    assert_ptr_equal(g2->routes[0], g1->routes[0]);
    assert_ptr_equal(g2->routes[0][0].stats, g1->routes[0][0].stats);
    assert_int_equal(atomic_load(&g2->tables[0]->refs), 2);
    assert_ptr_not_equal(g2->tables[1], g1->tables[1]);
    assert_true(g2->tables[1]->build_id > g1->tables[1]->build_id);
    assert_ptr_equal(g2->clusters[0], g1->clusters[0]);
    assert_ptr_equal(g2->clusters[1], g1->clusters[1]);
    assert_ptr_equal(g2->routes[1][0].backends[0], g2->clusters[1]);

    /* The first generation goes: what g2 shares stays whole. */
    sl_generation_discard(g1);
    assert_int_equal(atomic_load(&g2->tables[0]->refs), 1);
    assert_ptr_equal(g2->routes[0][0].backends[0], g2->clusters[0]);
    assert_string_equal(g2->routes[0][0].backends[0]->pb->name, "a");
    sl_router_result_t res;
    assert_int_equal(route_of(g2, "/t1/x", &res), SL_OK);
    assert_int_equal(res.table_index, 0);
    assert_int_equal(route_of(g2, "/t2/z", &res), SL_OK);
    assert_int_equal(res.table_index, 1);
    assert_int_equal(route_of(g2, "/t2/y", &res), 404);
    /* t2's old message was only g1's (and the held set's) */
    release_msg(t2_old);
    sl_generation_discard(g2);
    release_held(&h);
}

static void test_changed_cluster_rebuilds_the_tables_that_use_it(void **state)
{
    (void)state;
    held_t h = {.clusters = {mk_cluster("a", 9001), mk_cluster("b", 9002)},
                .tables = {mk_table("t1", "/x", "a"), mk_table("t2", "/y", "b")}};
    sl_generation_t *g1 = build_held(&h, NULL);
    Sluice__V1__Cluster *b_old = h.clusters[1];
    h.clusters[1] = mk_cluster("b", 9003); /* another endpoint */
    sl_generation_t *g2 = build_held(&h, g1);
    assert_ptr_equal(g2->clusters[0], g1->clusters[0]);
    assert_ptr_not_equal(g2->clusters[1], g1->clusters[1]);
    assert_int_equal(g2->clusters[1]->pb->endpoints[0]->port, 9003);
    assert_ptr_equal(g2->tables[0], g1->tables[0]);
    assert_ptr_not_equal(g2->tables[1], g1->tables[1]);
    /* t2's routes point at the new cluster, never at g1's */
    assert_ptr_equal(g2->routes[1][0].backends[0], g2->clusters[1]);
    /* per-route counters are kept by name, rebuilt table or not */
    assert_ptr_equal(g2->routes[1][0].stats, g1->routes[1][0].stats);
    sl_generation_discard(g1);
    release_msg(b_old);
    sl_generation_discard(g2);
    release_held(&h);
}

static void test_changed_consumers_or_settings_rebuild_every_table(void **state)
{
    (void)state;
    held_t h = {.clusters = {mk_cluster("a", 9001), mk_cluster("b", 9002)},
                .tables = {mk_table("t1", "/x", "a"), mk_table("t2", "/y", "b")}};
    sl_generation_t *g1 = build_held(&h, NULL);

    /* A Consumer appears: policy chains point at the consumers index, so no
     * table is shared; clusters are. */
    Sluice__V1__Consumer c = SLUICE__V1__CONSUMER__INIT;
    c.name = "default/alice";
    h.consumers[0] = owned(&c);
    h.n_consumers = 1;
    sl_generation_t *g2 = build_held(&h, g1);
    assert_ptr_not_equal(g2->consumers_box, g1->consumers_box);
    assert_ptr_not_equal(g2->tables[0], g1->tables[0]);
    assert_ptr_not_equal(g2->tables[1], g1->tables[1]);
    assert_ptr_equal(g2->clusters[0], g1->clusters[0]);

    /* Nothing changes: everything shared, the consumers index included. */
    sl_generation_t *g3 = build_held(&h, g2);
    assert_ptr_equal(g3->consumers_box, g2->consumers_box);
    assert_ptr_equal(g3->consumers, g2->consumers);
    assert_ptr_equal(g3->tables[0], g2->tables[0]);
    assert_ptr_equal(g3->tables[1], g2->tables[1]);

    /* New gateway settings (timeouts, limits, traffic log): nothing shared. */
    Sluice__V1__GatewaySettings gs = SLUICE__V1__GATEWAY_SETTINGS__INIT;
    h.settings = owned(&gs);
    sl_generation_t *g4 = build_held(&h, g3);
    assert_ptr_not_equal(g4->tables[0], g3->tables[0]);
    assert_ptr_not_equal(g4->clusters[0], g3->clusters[0]);
    assert_ptr_not_equal(g4->clusters[1], g3->clusters[1]);

    sl_generation_discard(g1);
    sl_generation_discard(g2);
    sl_generation_discard(g3);
    sl_generation_discard(g4);
    release_held(&h);
}

/* Snapshots decoded on their own (files, state-of-the-world copies) have no
 * message in common: equal content is built again, never confused. */
static void test_separately_decoded_snapshots_share_nothing(void **state)
{
    (void)state;
    held_t h1 = {.clusters = {mk_cluster("a", 9001), mk_cluster("b", 9002)},
                 .tables = {mk_table("t1", "/x", "a"), mk_table("t2", "/y", "b")}};
    held_t h2 = {.clusters = {mk_cluster("a", 9001), mk_cluster("b", 9002)},
                 .tables = {mk_table("t1", "/x", "a"), mk_table("t2", "/y", "b")}};
    sl_generation_t *g1 = build_held(&h1, NULL);
    sl_generation_t *g2 = build_held(&h2, g1);
    for (int i = 0; i < 2; i++) {
        assert_ptr_not_equal(g2->tables[i], g1->tables[i]);
        assert_ptr_not_equal(g2->clusters[i], g1->clusters[i]);
    }
    sl_generation_discard(g1);
    sl_generation_discard(g2);
    release_held(&h1);
    release_held(&h2);
}

/* Published and retired through RCU as the runtime does: the shared table
 * outlives the generation that built it and is freed with the last one. */
static void test_shared_parts_follow_the_last_generation_through_rcu(void **state)
{
    (void)state;
    held_t h = {.clusters = {mk_cluster("a", 9001), mk_cluster("b", 9002)},
                .tables = {mk_table("t1", "/x", "a"), mk_table("t2", "/y", "b")}};
    sl_generation_t *g1 = build_held(&h, NULL);
    uint64_t v1 = g1->version;
    publish(g1);
    Sluice__V1__RouteTable *t2_old = h.tables[1];
    h.tables[1] = mk_table("t2", "/z", "b");
    sl_generation_t *g2 = build_held(&h, sl_generation_published);
    sl_gen_table_t *shared = g2->tables[0];
    assert_ptr_equal(shared, g1->tables[0]);
    publish(g2);
    grace_period();
    assert_true(is_freed(v1));
    assert_int_equal(atomic_load(&shared->refs), 1);
    sl_router_result_t res;
    assert_int_equal(route_of(g2, "/t1/x", &res), SL_OK);
    assert_ptr_equal(g2->routes[res.table_index][res.route_index].backends[0], g2->clusters[0]);
    release_msg(t2_old);
    unpublish();
    grace_period();
    release_held(&h);
}


/* Many tables: 100 new ones inserted before 100 kept ones (every index
 * shifts), then a snapshot with nothing in common; built with the held
 * clusters a and b. */
static sl_generation_t *build_tables(Sluice__V1__Cluster **clusters,
                                     Sluice__V1__RouteTable **tables, size_t n,
                                     const sl_generation_t *prev)
{
    Sluice__V1__Snapshot view = SLUICE__V1__SNAPSHOT__INIT;
    view.version = next_version++;
    view.n_clusters = 2;
    view.clusters = clusters;
    view.n_route_tables = n;
    view.route_tables = tables;
    Sluice__V1__Snapshot *shell = sl_pbshare_snapshot(&view);
    assert_non_null(shell);
    char err[512] = "";
    sl_generation_t *gen = sl_generation_build_from(shell, "test", 1, prev, err, sizeof(err));
    if (!gen)
        fail_msg("build: %s", err);
    return gen;
}

static void test_shifted_tables_are_found_and_strangers_not_searched_long(void **state)
{
    (void)state;
    enum { N = 100 };
    Sluice__V1__Cluster *cl[2] = {mk_cluster("a", 9001), mk_cluster("b", 9002)};
    Sluice__V1__RouteTable *t[3 * N];
    char name[32];
    for (int i = 0; i < 3 * N; i++) {
        snprintf(name, sizeof(name), "t%03d", i);
        t[i] = mk_table(name, "/x", i % 2 ? "a" : "b");
    }
    /* g1: tables N..2N-1; g2: 0..2N-1 (N new ones first) */
    sl_generation_t *g1 = build_tables(cl, t + N, N, NULL);
    uint64_t built = gauge(&sl_metrics_gauges.gen_tables_built);
    sl_generation_t *g2 = build_tables(cl, t, 2 * N, g1);
    assert_int_equal(gauge(&sl_metrics_gauges.gen_tables_built) - built, N);
    for (int i = 0; i < N; i++)
        assert_ptr_equal(g2->tables[N + i], g1->tables[i]);
    sl_router_result_t res;
    assert_int_equal(route_of(g2, "/t150/x", &res), SL_OK);
    assert_int_equal(res.table_index, 150);
    assert_int_equal(route_of(g2, "/t010/x", &res), SL_OK);
    assert_int_equal(res.table_index, 10);
    /* g3: tables 2N..3N-1, nothing in common: all built, same answers */
    built = gauge(&sl_metrics_gauges.gen_tables_built);
    sl_generation_t *g3 = build_tables(cl, t + 2 * N, N, g2);
    assert_int_equal(gauge(&sl_metrics_gauges.gen_tables_built) - built, N);
    assert_int_equal(route_of(g3, "/t250/x", &res), SL_OK);
    assert_int_equal(res.table_index, 50);
    assert_int_equal(route_of(g3, "/t150/x", &res), 404);
    sl_generation_discard(g1);
    sl_generation_discard(g2);
    sl_generation_discard(g3);
    for (int i = 0; i < 3 * N; i++)
        release_msg(t[i]);
    release_msg(cl[0]);
    release_msg(cl[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_keeps_replaced_generation),
        cmocka_unit_test(test_two_workers_freed_after_last_request),
        cmocka_unit_test(test_idle_worker_releases_at_tick),
        cmocka_unit_test(test_next_request_releases_idle_retired),
        cmocka_unit_test(test_sequential_requests_leave_shared_count_alone),
        cmocka_unit_test(test_full_list_falls_back_to_shared_refs),
        cmocka_unit_test(test_worker_beyond_slots_uses_shared_refs),
        cmocka_unit_test(test_worker_exit_releases_current),
        cmocka_unit_test(test_concurrent_reloads),
        cmocka_unit_test(test_listener_http2_settings),
        cmocka_unit_test(test_listener_http2_defaults_are_the_codecs),
        cmocka_unit_test(test_change_rebuilds_only_the_changed_table),
        cmocka_unit_test(test_changed_cluster_rebuilds_the_tables_that_use_it),
        cmocka_unit_test(test_changed_consumers_or_settings_rebuild_every_table),
        cmocka_unit_test(test_separately_decoded_snapshots_share_nothing),
        cmocka_unit_test(test_shared_parts_follow_the_last_generation_through_rcu),
        cmocka_unit_test(test_shifted_tables_are_found_and_strangers_not_searched_long),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
