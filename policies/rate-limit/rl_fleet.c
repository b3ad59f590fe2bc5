/* The fleet mode's leases and its Redis thread (rl_fleet.h). */
#include "rl_fleet.h"

#include <errno.h>
#include <event2/event.h>
#include <hiredis/adapters/libevent.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_LIMITS 8
#define RECONNECT_MS 500
#define STALL_MS 1000

/* A slot's lease word: [window:31][exhausted:1][tokens:int32]. The window
 * is the low 31 bits of the window index: only equality matters. One word,
 * so a lease can never land in the wrong window. */
#define WIN_MASK 0x7fffffffu
static inline uint64_t pack(uint64_t w, int exh, int32_t tok)
{
    return ((w & WIN_MASK) << 33) | ((uint64_t)(exh ? 1 : 0) << 32) | (uint32_t)tok;
}
static inline uint32_t p_win(uint64_t v)
{
    return (uint32_t)(v >> 33);
}
static inline int p_exh(uint64_t v)
{
    return (int)((v >> 32) & 1);
}
static inline int32_t p_tok(uint64_t v)
{
    return (int32_t)(uint32_t)v;
}

typedef struct {
    _Atomic uint64_t key;      /* 0 = empty */
    _Atomic uint64_t wt;       /* the lease word */
    _Atomic uint64_t want;     /* window index + 1 a lease is wanted for; 0 = none */
    _Atomic uint32_t inflight; /* a lease request is out (set and cleared by the thread) */
    _Atomic uint32_t used;     /* Redis's count for the window after the last lease */
    _Atomic uint32_t limit;
    /* thread only: the lease size grows from 1 by doubling within a window
     * (slow start), so a runtime that sees few requests leases few tokens */
    int32_t lease_next;
    uint64_t lease_window;
} slot_t;

struct sl_rl_fleet {
    char host[256], password[256], prefix[128];
    int port, database;
    uint64_t scope;
    sl_rl_fleet_limit_t limits[MAX_LIMITS];
    int32_t lease[MAX_LIMITS];
    size_t nlimits;
    slot_t *slots;
    size_t mask;
    _Atomic int down;
    _Atomic int up_once; /* Redis has answered PING at least once */
    int fail_open;
    _Atomic int stop;
    _Atomic int started; /* the thread runs from the first request on */
    _Atomic int thread_ok;
    int efd;
    pthread_t thread;
    /* thread only */
    struct event_base *base;
    struct event *wake_ev, *tick_ev;
    redisAsyncContext *ac;
    int ready; /* connected and PING answered: leases can be asked for */
    unsigned outstanding;
    uint64_t stall_since_ms, connect_at_ms;
};

typedef struct {
    sl_rl_fleet_t *f;
    size_t idx;
    uint64_t window;
    int32_t n;
} lease_req_t;

static const char script[] =
    "local v = redis.call('INCRBY', KEYS[1], ARGV[1]) "
    "if v == tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end "
    "return v";

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- the Redis thread ------------------------------------------------------ */

static void send_lease(sl_rl_fleet_t *f, size_t idx, uint64_t window);

static void on_lease(redisAsyncContext *ac, void *r, void *priv)
{
    (void)ac;
    lease_req_t *q = priv;
    sl_rl_fleet_t *f = q->f;
    slot_t *s = &f->slots[q->idx];
    redisReply *reply = r;
    f->outstanding--;
    f->stall_since_ms = mono_ms();
    atomic_store_explicit(&s->inflight, 0, memory_order_release);
    if (!reply) { /* the connection went: the slot asks again */
        free(q);
        return;
    }
    if (reply->type != REDIS_REPLY_INTEGER) {
        /* NOAUTH, a read-only replica, ...: no budget can be had. */
        atomic_store(&f->down, 1);
        free(q);
        return;
    }
    unsigned l = atomic_load_explicit(&s->limit, memory_order_relaxed);
    long long lim = (long long)f->limits[l < f->nlimits ? l : 0].requests;
    long long count = reply->integer, prev = count - q->n;
    int32_t granted = count <= lim ? q->n : (prev < lim ? (int32_t)(lim - prev) : 0);
    int exh = count >= lim;
    uint64_t v = atomic_load_explicit(&s->wt, memory_order_acquire);
    while (p_win(v) == (q->window & WIN_MASK)) {
        uint64_t nv = pack(q->window, exh || p_exh(v), p_tok(v) + granted);
        if (atomic_compare_exchange_weak_explicit(&s->wt, &v, nv, memory_order_acq_rel,
                                                  memory_order_acquire))
            break;
    }
    atomic_store_explicit(&s->used, (uint32_t)(count < lim ? count : lim), memory_order_relaxed);
    free(q);
    /* Asked again while this one was out. */
    uint64_t w = atomic_exchange_explicit(&s->want, 0, memory_order_acq_rel);
    if (w)
        send_lease(f, (size_t)(s - f->slots), w - 1);
}

static void send_lease(sl_rl_fleet_t *f, size_t idx, uint64_t window)
{
    slot_t *s = &f->slots[idx];
    if (!f->ac || !f->ready)
        return;
    unsigned l = atomic_load_explicit(&s->limit, memory_order_relaxed);
    if (l >= f->nlimits)
        return;
    uint64_t v = atomic_load_explicit(&s->wt, memory_order_acquire);
    if (p_win(v) == (window & WIN_MASK) && p_exh(v))
        return; /* the window is used up fleet-wide */
    if (s->lease_window != window + 1) {
        s->lease_window = window + 1;
        s->lease_next = 1;
    }
    int32_t n = s->lease_next;
    s->lease_next = n >= f->lease[l] / 2 ? f->lease[l] : 2 * n;
    if (p_win(v) == (window & WIN_MASK) && p_tok(v) < 0)
        n += -p_tok(v); /* pay the credit back */
    lease_req_t *q = malloc(sizeof(*q));
    if (!q)
        return;
    *q = (lease_req_t){f, idx, window, n};
    char key[256], nbuf[24], ttl[24];
    uint64_t k = atomic_load_explicit(&s->key, memory_order_relaxed);
    snprintf(key, sizeof(key), "%s:%016llx:%016llx:%llu", f->prefix, (unsigned long long)f->scope,
             (unsigned long long)k, (unsigned long long)window);
    snprintf(nbuf, sizeof(nbuf), "%d", n);
    /* The key outlives its window by one period: clocks of the fleet
     * disagree a little. */
    snprintf(ttl, sizeof(ttl), "%llu", (unsigned long long)(2 * f->limits[l].period_ms));
    atomic_store_explicit(&s->inflight, 1, memory_order_release);
    if (redisAsyncCommand(f->ac, on_lease, q, "EVAL %s 1 %s %s %s", script, key, nbuf, ttl) !=
        REDIS_OK) {
        atomic_store_explicit(&s->inflight, 0, memory_order_release);
        free(q);
        return;
    }
    if (f->outstanding++ == 0)
        f->stall_since_ms = mono_ms();
}

/* Sends a lease request for every slot that wants one. */
static void scan(sl_rl_fleet_t *f)
{
    if (!f->ac || !f->ready)
        return;
    for (size_t i = 0; i <= f->mask; i++) {
        slot_t *s = &f->slots[i];
        if (!atomic_load_explicit(&s->want, memory_order_relaxed) ||
            atomic_load_explicit(&s->inflight, memory_order_acquire))
            continue;
        uint64_t w = atomic_exchange_explicit(&s->want, 0, memory_order_acq_rel);
        if (w)
            send_lease(f, i, w - 1);
    }
}

/* Redis is up once it answers, not once TCP connects (a hung server
 * accepts connections too). */
static void on_ping(redisAsyncContext *ac, void *r, void *priv)
{
    (void)priv;
    sl_rl_fleet_t *f = ac->data;
    redisReply *reply = r;
    if (!reply)
        return;
    if (reply->type == REDIS_REPLY_ERROR) { /* NOAUTH, ...: on_tick drops it */
        atomic_store(&f->down, 1);
        return;
    }
    f->ready = 1;
    atomic_store(&f->down, 0);
    atomic_store(&f->up_once, 1);
    scan(f);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    sl_rl_fleet_t *f = ac->data;
    if (status != REDIS_OK) {
        f->ac = NULL; /* hiredis frees it */
        f->ready = 0;
        atomic_store(&f->down, 1);
    }
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    (void)status;
    sl_rl_fleet_t *f = ac->data;
    f->ac = NULL;
    f->ready = 0;
    f->outstanding = 0;
    f->connect_at_ms = mono_ms(); /* the next attempt in RECONNECT_MS */
    atomic_store(&f->down, 1);
}

static void connect_redis(sl_rl_fleet_t *f)
{
    f->connect_at_ms = mono_ms();
    f->outstanding = 0;
    redisAsyncContext *ac = redisAsyncConnect(f->host, f->port);
    if (!ac || ac->err) {
        if (ac)
            redisAsyncFree(ac);
        atomic_store(&f->down, 1);
        return;
    }
    ac->data = f;
    if (redisLibeventAttach(ac, f->base) != REDIS_OK) {
        redisAsyncFree(ac);
        atomic_store(&f->down, 1);
        return;
    }
    f->ac = ac;
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    if (f->password[0])
        redisAsyncCommand(ac, NULL, NULL, "AUTH %s", f->password);
    if (f->database)
        redisAsyncCommand(ac, NULL, NULL, "SELECT %d", f->database);
    redisAsyncCommand(ac, on_ping, NULL, "PING");
}

/* Drops a connection that stopped answering (or never connected). */
static void drop(sl_rl_fleet_t *f)
{
    redisAsyncContext *ac = f->ac;
    f->ac = NULL;
    f->ready = 0;
    atomic_store(&f->down, 1);
    if (ac)
        redisAsyncFree(ac);
    f->outstanding = 0;
    f->connect_at_ms = mono_ms(); /* the next attempt in RECONNECT_MS */
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sl_rl_fleet_t *f = arg;
    uint64_t now = mono_ms();
    if (f->ac && !f->ready && now - f->connect_at_ms > STALL_MS)
        drop(f); /* no answer to PING (or an error) within the deadline */
    else if (f->ac && f->outstanding && now - f->stall_since_ms > STALL_MS)
        drop(f);
    else if (f->ac && f->ready && atomic_load(&f->down))
        drop(f); /* an error reply: start over */
    if (!f->ac && now - f->connect_at_ms >= RECONNECT_MS)
        connect_redis(f);
    else
        scan(f); /* wants set while the eventfd was being read */
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    sl_rl_fleet_t *f = arg;
    uint64_t n;
    while (read(fd, &n, sizeof(n)) == sizeof(n))
        ;
    if (atomic_load(&f->stop)) {
        drop(f);
        event_base_loopbreak(f->base);
        return;
    }
    scan(f);
}

static void *thread_main(void *arg)
{
    sl_rl_fleet_t *f = arg;
    connect_redis(f);
    event_base_dispatch(f->base);
    drop(f);
    return NULL;
}

/* ---- workers ----------------------------------------------------------------- */

static slot_t *find_or_claim(sl_rl_fleet_t *f, uint64_t key, unsigned limit, uint64_t w)
{
    slot_t *g = &f->slots[key & f->mask & ~(size_t)3];
    for (int i = 0; i < 4; i++)
        if (atomic_load_explicit(&g[i].key, memory_order_acquire) == key)
            return &g[i];
    for (int i = 0; i < 4; i++) {
        slot_t *s = &g[i];
        uint64_t k = atomic_load_explicit(&s->key, memory_order_acquire);
        /* Free, or a bucket of a past window with nothing in flight. */
        if (k != 0 &&
            (p_win(atomic_load_explicit(&s->wt, memory_order_relaxed)) == (w & WIN_MASK) ||
             atomic_load_explicit(&s->want, memory_order_relaxed) ||
             atomic_load_explicit(&s->inflight, memory_order_relaxed)))
            continue;
        if (!atomic_compare_exchange_strong_explicit(&s->key, &k, key, memory_order_acq_rel,
                                                     memory_order_acquire)) {
            if (k == key)
                return s;
            continue;
        }
        atomic_store_explicit(&s->limit, limit, memory_order_relaxed);
        atomic_store_explicit(&s->used, 0, memory_order_relaxed);
        return s;
    }
    return NULL;
}

static void want(sl_rl_fleet_t *f, slot_t *s, uint64_t w)
{
    if (atomic_exchange_explicit(&s->want, w + 1, memory_order_acq_rel) == 0) {
        uint64_t one = 1;
        ssize_t rc = write(f->efd, &one, sizeof(one));
        (void)rc; /* EAGAIN: the counter is full, the thread is awake anyway */
    }
}

/* The Redis thread starts with the first request, not at compile: a
 * `--check`, or a generation that never serves a request, connects to
 * nothing. */
static void start_thread(sl_rl_fleet_t *f)
{
    if (atomic_exchange(&f->started, 1))
        return;
    if (pthread_create(&f->thread, NULL, thread_main, f) == 0)
        f->thread_ok = 1;
    else
        atomic_store(&f->down, 1); /* no client: the limit is unavailable */
}

int sl_rl_fleet_take(sl_rl_fleet_t *f, unsigned limit, uint64_t key, uint64_t now_ms,
                     sl_rl_verdict_t *v)
{
    if (key == 0)
        key = 1;
    if (!atomic_load_explicit(&f->started, memory_order_relaxed))
        start_thread(f);
    if (atomic_load_explicit(&f->down, memory_order_relaxed))
        return SL_RL_FLEET_UNAVAILABLE;
    /* Fail open: until Redis has answered once (the thread starts with the
     * first request) the fleet cannot answer either, and the config says to
     * admit then, not to refuse past the credit while a first connection
     * that may never succeed is attempted. Fail closed keeps the credit. */
    if (f->fail_open && !atomic_load_explicit(&f->up_once, memory_order_acquire))
        return SL_RL_FLEET_UNAVAILABLE;
    const sl_rl_fleet_limit_t *lim = &f->limits[limit];
    uint64_t w = now_ms / lim->period_ms;
    uint64_t until_end_ns = ((w + 1) * lim->period_ms - now_ms) * 1000000ull;
    slot_t *s = find_or_claim(f, key, limit, w);
    if (!s)
        return SL_RL_FLEET_UNAVAILABLE; /* four live keys in one group of the table */
    int32_t lease = f->lease[limit];
    uint64_t cur = atomic_load_explicit(&s->wt, memory_order_acquire);
    for (;;) {
        if (p_win(cur) != (w & WIN_MASK)) {
            uint64_t nv = pack(w, 0, 0);
            if (!atomic_compare_exchange_weak_explicit(&s->wt, &cur, nv, memory_order_acq_rel,
                                                       memory_order_acquire))
                continue;
            atomic_store_explicit(&s->used, 0, memory_order_relaxed);
            cur = nv;
        }
        int32_t tok = p_tok(cur);
        int exh = p_exh(cur);
        if (tok > 0 || (!exh && tok > -lease)) {
            if (!atomic_compare_exchange_weak_explicit(&s->wt, &cur, pack(w, exh, tok - 1),
                                                       memory_order_acq_rel, memory_order_acquire))
                continue;
            if (!exh && tok - 1 <= lease / 2)
                want(f, s, w);
            uint64_t used = atomic_load_explicit(&s->used, memory_order_relaxed);
            uint64_t left = tok - 1 > 0 ? (uint64_t)(tok - 1) : 0;
            v->admitted = 1;
            v->remaining = (exh || used >= lim->requests ? 0 : lim->requests - used) + left;
            if (v->remaining > lim->requests)
                v->remaining = lim->requests;
            v->reset_ns = until_end_ns;
            v->retry_after_ns = 0;
            return SL_RL_FLEET_ADMIT;
        }
        v->admitted = 0;
        v->remaining = 0;
        v->reset_ns = until_end_ns;
        if (exh) {
            v->retry_after_ns = until_end_ns;
        } else {
            /* Credit used up and the lease not back yet. */
            want(f, s, w);
            v->retry_after_ns = 1000000000ull;
        }
        return SL_RL_FLEET_REJECT;
    }
}

void sl_rl_fleet_refund(sl_rl_fleet_t *f, uint64_t key, uint64_t now_ms, unsigned limit)
{
    if (key == 0)
        key = 1;
    uint64_t w = now_ms / f->limits[limit].period_ms;
    slot_t *g = &f->slots[key & f->mask & ~(size_t)3];
    for (int i = 0; i < 4; i++) {
        if (atomic_load_explicit(&g[i].key, memory_order_acquire) != key)
            continue;
        uint64_t cur = atomic_load_explicit(&g[i].wt, memory_order_acquire);
        while (p_win(cur) == (w & WIN_MASK) &&
               !atomic_compare_exchange_weak_explicit(&g[i].wt, &cur,
                                                      pack(w, p_exh(cur), p_tok(cur) + 1),
                                                      memory_order_acq_rel, memory_order_acquire))
            ;
        return;
    }
}

/* ---- life -------------------------------------------------------------------- */

sl_rl_fleet_t *sl_rl_fleet_new(const sl_rl_fleet_conf_t *conf, const sl_rl_fleet_limit_t *limits,
                               size_t nlimits, char *err, size_t errlen)
{
    if (nlimits > MAX_LIMITS || nlimits == 0) {
        snprintf(err, errlen, "between 1 and %d limits", MAX_LIMITS);
        return NULL;
    }
    sl_rl_fleet_t *f = calloc(1, sizeof(*f));
    if (!f) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    f->efd = -1;
    snprintf(f->host, sizeof(f->host), "%s", conf->host);
    snprintf(f->password, sizeof(f->password), "%s", conf->password ? conf->password : "");
    snprintf(f->prefix, sizeof(f->prefix), "%s", conf->prefix);
    f->port = conf->port;
    f->database = conf->database;
    f->scope = conf->scope;
    f->fail_open = conf->fail_open;
    f->nlimits = nlimits;
    for (size_t i = 0; i < nlimits; i++) {
        f->limits[i] = limits[i];
        uint64_t l = limits[i].requests / 50;
        f->lease[i] = l < 1 ? 1 : l > 100000 ? 100000 : (int32_t)l;
    }
    size_t n = 4;
    while (n < conf->slots && n < ((size_t)1 << 24))
        n <<= 1;
    f->slots = calloc(n, sizeof(slot_t));
    f->mask = n - 1;
    f->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    f->base = event_base_new();
    if (!f->slots || f->efd < 0 || !f->base)
        goto fail;
    f->wake_ev = event_new(f->base, f->efd, EV_READ | EV_PERSIST, on_wake, f);
    f->tick_ev = event_new(f->base, -1, EV_PERSIST, on_tick, f);
    struct timeval tick = {0, 100 * 1000};
    if (!f->wake_ev || !f->tick_ev || event_add(f->wake_ev, NULL) != 0 ||
        event_add(f->tick_ev, &tick) != 0)
        goto fail;
    return f;
fail:
    snprintf(err, errlen, "cannot start the Redis client: %s", strerror(errno ? errno : ENOMEM));
    if (f->wake_ev)
        event_free(f->wake_ev);
    if (f->tick_ev)
        event_free(f->tick_ev);
    if (f->base)
        event_base_free(f->base);
    if (f->efd >= 0)
        close(f->efd);
    free(f->slots);
    free(f);
    return NULL;
}

void sl_rl_fleet_free(sl_rl_fleet_t *f)
{
    if (!f)
        return;
    /* The last reference goes after every worker left the generation:
     * nobody can start the thread any more. */
    atomic_store(&f->started, 1);
    atomic_store(&f->stop, 1);
    uint64_t one = 1;
    ssize_t rc = write(f->efd, &one, sizeof(one));
    (void)rc;
    if (f->thread_ok)
        pthread_join(f->thread, NULL);
    event_free(f->wake_ev);
    event_free(f->tick_ev);
    event_base_free(f->base);
    close(f->efd);
    free(f->slots);
    free(f);
}
