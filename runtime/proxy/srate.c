/*
 * Success-rate routing: windows, picks, the registry that keeps them across
 * config swaps, and their admin views (srate.h has the model and the
 * threading rules).
 *
 * Memory, per scope: an index of 2 x maxKeys buckets (4 bytes each) and a
 * pointer per key slot, allocated with the group; a key's entry (~700
 * bytes) when the key is first seen; a window (5 bytes per outcome plus 48)
 * per (key, backend) when its first outcome is recorded. So 1,024 keys x 3
 * backends x 125 outcomes take about 2.6 MB at most.
 */
#include "srate.h"

#include "endpoint.h"
#include "prom.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>
#include <string.h>

#define Q24_ONE (1u << 24)
#define EVICT_SAMPLES 16
#define MAX_CHAIN_HOPS 64

/* The last `window` outcomes of (key, backend). head counts records;
 * slot head % window is the next to overwrite. `successes` is the number of
 * successful slots (cold slots are successes: optimistic start). */
typedef struct {
    _Atomic uint32_t head;
    _Atomic uint32_t successes;
    _Atomic uint32_t elim_q24;
    _Atomic uint64_t total_ok;
    _Atomic uint64_t total_fail;
    /* sharing: redis: outcomes recorded here and not yet sent */
    _Atomic uint32_t pending_ok;
    _Atomic uint32_t pending_fail;
    /* Exploration probes in a row that succeeded (recoveryProbes). */
    _Atomic uint32_t probe_streak;
    _Atomic uint8_t *slots;   /* [window], 1 success, 0 failure */
    _Atomic uint32_t ts_ms[]; /* [window], ms since the group's epoch; 0 = cold */
} window_t;

typedef struct {
    _Atomic uint64_t hash; /* 0 = none yet */
    _Atomic uint64_t last_used_ms;
    _Atomic uint32_t tag;  /* bumped when the slot is given to another key */
    _Atomic uint32_t next; /* bucket chain: slot + 1, 0 = end */
    char name[SL_SRATE_KEY_NAME_MAX];
    window_t *_Atomic win[SL_SRATE_MAX_BACKENDS];
} srkey_t;

struct sl_srate_group {
    char *scope;
    uint32_t window;
    uint32_t max_keys;
    char *redis_addr; /* sharing: redis, else NULL */
    /* The share thread's, under registry_lock: the stream's last id read
     * and whether an XREAD is outstanding. */
    char last_id[64];
    int reading;
    uint64_t epoch_ms;
    unsigned refs; /* under registry_lock */
    struct sl_srate_group *next;
    /* The latest config's settings, for the admin views (routes keep
     * their own copy for the request path). */
    _Atomic uint32_t elimination_q24;
    _Atomic uint32_t max_outcome_age_ms;
    pthread_mutex_t lock; /* key inserts and evictions, backend names, admin reads */
    size_t nbackends;
    char *backend_names[SL_SRATE_MAX_BACKENDS];
    uint32_t mask; /* buckets - 1 */
    _Atomic uint32_t *buckets;
    srkey_t *_Atomic *keys; /* [max_keys] */
    _Atomic uint32_t used;
    _Atomic uint64_t evictions;
    sl_lb_rng_t rng; /* eviction samples, under lock */
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static sl_srate_group_t *registry;

/* ---- windows ----------------------------------------------------------------- */

static window_t *window_new(uint32_t n)
{
    window_t *w = calloc(1, sizeof(*w) + n * sizeof(w->ts_ms[0]) + n);
    if (!w)
        return NULL;
    w->slots = (_Atomic uint8_t *)((char *)(w + 1) + n * sizeof(w->ts_ms[0]));
    for (uint32_t i = 0; i < n; i++)
        atomic_init(&w->slots[i], 1);
    atomic_init(&w->successes, n);
    atomic_init(&w->elim_q24, Q24_ONE);
    return w;
}

static void window_reset(window_t *w, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        atomic_store_explicit(&w->slots[i], 1, memory_order_relaxed);
        atomic_store_explicit(&w->ts_ms[i], 0, memory_order_relaxed);
    }
    atomic_store_explicit(&w->successes, n, memory_order_relaxed);
    atomic_store_explicit(&w->head, 0, memory_order_relaxed);
    atomic_store_explicit(&w->elim_q24, Q24_ONE, memory_order_relaxed);
    atomic_store_explicit(&w->total_ok, 0, memory_order_relaxed);
    atomic_store_explicit(&w->total_fail, 0, memory_order_relaxed);
}

static uint32_t now_rel(const sl_srate_group_t *g, uint64_t now_ms)
{
    /* 0 marks a cold slot: a real outcome is at least 1. */
    uint64_t d = now_ms > g->epoch_ms ? now_ms - g->epoch_ms : 0;
    return (uint32_t)d ? (uint32_t)d : 1;
}

/* Lock-free: concurrent records each move head and exchange one slot, so
 * `successes` always equals the successful slots once they are done. */
/* A backend out of the best choice whose exploration probes succeeded
 * `recovery_probes` times in a row has recovered: the failures still in its
 * window (all older than those probes) no longer count, and its elimination
 * score starts over. Lock-free like a record: each slot turned from failure
 * to success adds one to `successes`, once. */
static void window_forgive(window_t *w, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if (atomic_load_explicit(&w->slots[i], memory_order_relaxed))
            continue;
        if (atomic_exchange_explicit(&w->slots[i], 1, memory_order_relaxed) == 0)
            atomic_fetch_add_explicit(&w->successes, 1, memory_order_relaxed);
    }
    atomic_store_explicit(&w->elim_q24, Q24_ONE, memory_order_relaxed);
}

static void window_record(window_t *w, uint32_t n, int ok, uint32_t now_rel_ms,
                          uint32_t elim_floor_q24, int share, int probe, uint32_t recovery_probes)
{
    if (!ok) {
        if (atomic_load_explicit(&w->probe_streak, memory_order_relaxed))
            atomic_store_explicit(&w->probe_streak, 0, memory_order_relaxed);
    } else if (probe && recovery_probes) {
        uint32_t streak = atomic_fetch_add_explicit(&w->probe_streak, 1, memory_order_relaxed) + 1;
        if (streak >= recovery_probes) {
            atomic_store_explicit(&w->probe_streak, 0, memory_order_relaxed);
            window_forgive(w, n);
        }
    }
    if (share)
        atomic_fetch_add_explicit(ok ? &w->pending_ok : &w->pending_fail, 1, memory_order_relaxed);
    uint32_t pos = atomic_fetch_add_explicit(&w->head, 1, memory_order_relaxed) % n;
    uint8_t old =
        atomic_exchange_explicit(&w->slots[pos], (uint8_t)(ok != 0), memory_order_relaxed);
    atomic_store_explicit(&w->ts_ms[pos], now_rel_ms, memory_order_relaxed);
    if (old && !ok)
        atomic_fetch_sub_explicit(&w->successes, 1, memory_order_relaxed);
    else if (!old && ok)
        atomic_fetch_add_explicit(&w->successes, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(ok ? &w->total_ok : &w->total_fail, 1, memory_order_relaxed);
    uint32_t e = atomic_load_explicit(&w->elim_q24, memory_order_relaxed), ne;
    do {
        uint64_t v = ok ? (uint64_t)e * 10526 / 10000 : (uint64_t)e * 95 / 100;
        if (v > Q24_ONE)
            v = Q24_ONE;
        if (v < elim_floor_q24)
            v = elim_floor_q24;
        ne = (uint32_t)v;
    } while (ne != e && !atomic_compare_exchange_weak_explicit(
                            &w->elim_q24, &e, ne, memory_order_relaxed, memory_order_relaxed));
}

/* Success ratio per million. Without an age limit: successes / window.
 * With one, failures older than it no longer count (the slot reverts to
 * the optimistic prior), which needs a scan of the window. */
static uint32_t window_score(const window_t *w, uint32_t n, uint32_t max_age_ms,
                             uint32_t now_rel_ms, uint32_t elimination_q24, sl_srate_score_t *s)
{
    if (!w) {
        s->score_ppm = SL_SRATE_PPM;
        s->elimination_ppm = SL_SRATE_PPM;
        s->outcomes = 0;
        s->eliminated = 0;
        return n;
    }
    uint32_t ok;
    if (!max_age_ms) {
        ok = atomic_load_explicit(&w->successes, memory_order_relaxed);
    } else {
        uint32_t failures = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (atomic_load_explicit(&w->slots[i], memory_order_relaxed))
                continue;
            uint32_t ts = atomic_load_explicit(&w->ts_ms[i], memory_order_relaxed);
            failures += ts && now_rel_ms - ts <= max_age_ms;
        }
        ok = n - failures;
    }
    if (ok > n)
        ok = n; /* a transient of concurrent records */
    s->score_ppm = (uint32_t)((uint64_t)ok * SL_SRATE_PPM / n);
    uint32_t e = atomic_load_explicit(&w->elim_q24, memory_order_relaxed);
    s->elimination_ppm = (uint32_t)((uint64_t)e * SL_SRATE_PPM / Q24_ONE);
    uint32_t head = atomic_load_explicit(&w->head, memory_order_relaxed);
    s->outcomes = head < n ? head : n;
    s->eliminated = elimination_q24 && e < elimination_q24;
    return ok;
}

/* ---- keys ------------------------------------------------------------------- */

static uint32_t find_key(sl_srate_group_t *g, uint64_t hash)
{
    uint32_t i = atomic_load_explicit(&g->buckets[hash & g->mask], memory_order_acquire);
    for (int hops = 0; i && hops < MAX_CHAIN_HOPS; hops++) {
        srkey_t *k = atomic_load_explicit(&g->keys[i - 1], memory_order_acquire);
        if (!k)
            return 0;
        if (atomic_load_explicit(&k->hash, memory_order_acquire) == hash)
            return i;
        i = atomic_load_explicit(&k->next, memory_order_acquire);
    }
    /* Not found, or a chain changed under us: the caller looks again under
     * the lock. */
    return 0;
}

static void unlink_key(sl_srate_group_t *g, uint32_t slot1, uint64_t hash)
{
    _Atomic uint32_t *link = &g->buckets[hash & g->mask];
    for (;;) {
        uint32_t i = atomic_load_explicit(link, memory_order_relaxed);
        if (!i)
            return;
        srkey_t *k = atomic_load_explicit(&g->keys[i - 1], memory_order_relaxed);
        if (i == slot1) {
            atomic_store_explicit(link, atomic_load_explicit(&k->next, memory_order_relaxed),
                                  memory_order_release);
            return;
        }
        link = &k->next;
    }
}

/* Under g->lock: the slot (+1) of a key, made if new; 0 when out of memory. */
static uint32_t insert_key(sl_srate_group_t *g, uint64_t hash, const char *name, uint64_t now_ms)
{
    uint32_t i = find_key(g, hash);
    if (i)
        return i;
    uint32_t used = atomic_load_explicit(&g->used, memory_order_relaxed);
    srkey_t *k;
    uint32_t slot;
    if (used < g->max_keys) {
        k = calloc(1, sizeof(*k));
        if (!k)
            return 0;
        slot = used;
        atomic_store_explicit(&g->keys[slot], k, memory_order_release);
        atomic_store_explicit(&g->used, used + 1, memory_order_relaxed);
    } else {
        /* Approximate LRU: the oldest of a few random slots. */
        slot = (uint32_t)(sl_lb_rng_next(&g->rng) % g->max_keys);
        uint64_t oldest = UINT64_MAX;
        for (int s = 0; s < EVICT_SAMPLES; s++) {
            uint32_t c = (uint32_t)(sl_lb_rng_next(&g->rng) % g->max_keys);
            srkey_t *ck = atomic_load_explicit(&g->keys[c], memory_order_relaxed);
            uint64_t lu = atomic_load_explicit(&ck->last_used_ms, memory_order_relaxed);
            if (lu < oldest) {
                oldest = lu;
                slot = c;
            }
        }
        k = atomic_load_explicit(&g->keys[slot], memory_order_relaxed);
        unlink_key(g, slot + 1, atomic_load_explicit(&k->hash, memory_order_relaxed));
        atomic_fetch_add_explicit(&k->tag, 1, memory_order_release);
        for (size_t b = 0; b < SL_SRATE_MAX_BACKENDS; b++) {
            window_t *w = atomic_load_explicit(&k->win[b], memory_order_relaxed);
            if (w)
                window_reset(w, g->window);
        }
        atomic_fetch_add_explicit(&g->evictions, 1, memory_order_relaxed);
    }
    snprintf(k->name, sizeof(k->name), "%s", name);
    atomic_store_explicit(&k->last_used_ms, now_ms, memory_order_relaxed);
    atomic_store_explicit(&k->hash, hash, memory_order_release);
    atomic_store_explicit(&k->next,
                          atomic_load_explicit(&g->buckets[hash & g->mask], memory_order_relaxed),
                          memory_order_relaxed);
    atomic_store_explicit(&g->buckets[hash & g->mask], slot + 1, memory_order_release);
    return slot + 1;
}

static uint32_t lookup_key(sl_srate_group_t *g, uint64_t hash, const char *name, uint64_t now_ms)
{
    uint32_t i = find_key(g, hash);
    if (i)
        return i;
    pthread_mutex_lock(&g->lock);
    i = insert_key(g, hash, name, now_ms);
    pthread_mutex_unlock(&g->lock);
    return i;
}

static window_t *key_window(sl_srate_group_t *g, srkey_t *k, uint8_t gb)
{
    window_t *w = atomic_load_explicit(&k->win[gb], memory_order_acquire);
    if (w)
        return w;
    window_t *nw = window_new(g->window);
    if (!nw)
        return NULL;
    if (atomic_compare_exchange_strong_explicit(&k->win[gb], &w, nw, memory_order_acq_rel,
                                                memory_order_acquire))
        return nw;
    free(nw); /* another worker was first */
    return w;
}

/* ---- groups ----------------------------------------------------------------- */

static void group_free(sl_srate_group_t *g)
{
    uint32_t used = atomic_load(&g->used);
    for (uint32_t i = 0; i < used; i++) {
        srkey_t *k = atomic_load(&g->keys[i]);
        if (!k)
            continue;
        for (size_t b = 0; b < SL_SRATE_MAX_BACKENDS; b++)
            free(atomic_load(&k->win[b]));
        free(k);
    }
    for (size_t b = 0; b < g->nbackends; b++)
        free(g->backend_names[b]);
    free((void *)g->keys);
    free((void *)g->buckets);
    pthread_mutex_destroy(&g->lock);
    free(g->scope);
    free(g->redis_addr);
    free(g);
}

static sl_srate_group_t *group_new(const char *scope, uint32_t window, uint32_t max_keys,
                                   const char *redis)
{
    sl_srate_group_t *g = calloc(1, sizeof(*g));
    if (!g)
        return NULL;
    strcpy(g->last_id, "0");
    if (redis && *redis && !(g->redis_addr = strdup(redis))) {
        free(g);
        return NULL;
    }
    uint32_t nb = 2;
    while (nb < 2 * max_keys)
        nb <<= 1;
    g->scope = strdup(scope);
    g->window = window ? window : 1;
    g->max_keys = max_keys ? max_keys : 1;
    g->mask = nb - 1;
    g->buckets = calloc(nb, sizeof(*g->buckets));
    g->keys = calloc(g->max_keys, sizeof(*g->keys));
    g->epoch_ms = sl_endpoint_now_ms();
    sl_lb_rng_seed(&g->rng, sl_lb_hash(scope, strlen(scope)) ^ g->epoch_ms);
    pthread_mutex_init(&g->lock, NULL);
    if (!g->scope || !g->buckets || !g->keys) {
        group_free(g);
        return NULL;
    }
    return g;
}

/* Under registry_lock: the group for scope with this shape, shared or new. */
static int same_redis(const char *a, const char *b)
{
    return strcmp(a ? a : "", b ? b : "") == 0;
}

static sl_srate_group_t *group_acquire(const char *scope, uint32_t window, uint32_t max_keys,
                                       const char *redis)
{
    for (sl_srate_group_t *g = registry; g; g = g->next) {
        if (strcmp(g->scope, scope) == 0 && g->window == window && g->max_keys == max_keys &&
            same_redis(g->redis_addr, redis)) {
            g->refs++;
            return g;
        }
    }
    sl_srate_group_t *g = group_new(scope, window, max_keys, redis);
    if (!g)
        return NULL;
    g->refs = 1;
    g->next = registry;
    registry = g;
    return g;
}

static void group_release(sl_srate_group_t *g)
{
    pthread_mutex_lock(&registry_lock);
    if (--g->refs) {
        pthread_mutex_unlock(&registry_lock);
        return;
    }
    for (sl_srate_group_t **p = &registry; *p; p = &(*p)->next) {
        if (*p == g) {
            *p = g->next;
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    group_free(g);
}

/* Under g->lock: the group's index of a backend, added if new; -1 when the
 * group has no room left. */
static int group_backend(sl_srate_group_t *g, const char *name)
{
    for (size_t b = 0; b < g->nbackends; b++)
        if (strcmp(g->backend_names[b], name) == 0)
            return (int)b;
    if (g->nbackends == SL_SRATE_MAX_BACKENDS)
        return -1;
    char *d = strdup(name);
    if (!d)
        return -1;
    g->backend_names[g->nbackends] = d;
    return (int)g->nbackends++;
}

/* ---- sharing: redis ----------------------------------------------------------
 *
 * One thread of its own (never a worker, never the main thread) every
 * SHARE_TICK_MS: for each group with sharing, the outcomes recorded since
 * the last tick (the windows' pending counters) go to the group's Redis
 * stream, one XADD per (key, backend) with counts, and the entries other
 * runtimes added since the last read are applied to the local windows (an
 * entry of this runtime's own is skipped by its id). The stream is capped
 * (MAXLEN ~ SHARE_STREAM_MAX) and a new runtime reads it from the start, so
 * it begins with the fleet's recent outcomes. Redis down: the pending
 * counts wait (the windows themselves go on locally), the thread reconnects
 * every second. Nothing here runs on the request path.
 */
#include <event2/event.h>
#include <hiredis/adapters/libevent.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#define SHARE_TICK_MS 100
#define SHARE_RECONNECT_MS 1000
#define SHARE_STREAM_MAX "100000"
#define SHARE_MAX_CONNS 8

typedef struct {
    char addr[160];
    redisAsyncContext *ac;
    int ready;
    uint64_t connect_at_ms;
} share_conn_t;

static struct {
    pthread_once_t once;
    pthread_t thread;
    struct event_base *base;
    struct event *tick;
    share_conn_t conns[SHARE_MAX_CONNS];
    size_t nconns;
    char id[40];
} share = {.once = PTHREAD_ONCE_INIT};

static void share_on_ping(redisAsyncContext *ac, void *r, void *priv)
{
    (void)priv;
    share_conn_t *c = ac->data;
    redisReply *reply = r;
    if (reply && reply->type != REDIS_REPLY_ERROR)
        c->ready = 1;
}

static void share_on_connect(const redisAsyncContext *ac, int status)
{
    share_conn_t *c = ac->data;
    if (status != REDIS_OK) {
        c->ac = NULL; /* hiredis frees it */
        c->ready = 0;
    }
}

static void share_on_disconnect(const redisAsyncContext *ac, int status)
{
    (void)status;
    share_conn_t *c = ac->data;
    c->ac = NULL;
    c->ready = 0;
    c->connect_at_ms = sl_endpoint_now_ms();
}

static share_conn_t *share_conn(const char *addr)
{
    share_conn_t *c = NULL;
    for (size_t i = 0; i < share.nconns && !c; i++)
        if (strcmp(share.conns[i].addr, addr) == 0)
            c = &share.conns[i];
    if (!c) {
        if (share.nconns == SHARE_MAX_CONNS)
            return NULL;
        c = &share.conns[share.nconns++];
        snprintf(c->addr, sizeof(c->addr), "%s", addr);
    }
    uint64_t now = sl_endpoint_now_ms();
    if (c->ac || (c->connect_at_ms && now - c->connect_at_ms < SHARE_RECONNECT_MS))
        return c;
    c->connect_at_ms = now;
    char host[160];
    snprintf(host, sizeof(host), "%s", addr);
    char *colon = strrchr(host, ':');
    int port = 6379;
    if (colon) {
        *colon = '\0';
        port = atoi(colon + 1);
    }
    if (host[0] == '[') { /* [v6]:port */
        memmove(host, host + 1, strlen(host));
        host[strcspn(host, "]")] = '\0';
    }
    redisAsyncContext *ac = redisAsyncConnect(host, port);
    if (!ac || ac->err) {
        if (ac)
            redisAsyncFree(ac);
        return c;
    }
    ac->data = c;
    if (redisLibeventAttach(ac, share.base) != REDIS_OK) {
        redisAsyncFree(ac);
        return c;
    }
    c->ac = ac;
    redisAsyncSetConnectCallback(ac, share_on_connect);
    redisAsyncSetDisconnectCallback(ac, share_on_disconnect);
    redisAsyncCommand(ac, share_on_ping, NULL, "PING");
    return c;
}

static const char *reply_str(const redisReply *r)
{
    return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) ? r->str : NULL;
}

/* Applies one stream entry [id, [field, value, ...]] of another runtime. */
static void share_apply(sl_srate_group_t *g, const redisReply *e, uint64_t now_ms)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 || !reply_str(e->element[0]))
        return;
    snprintf(g->last_id, sizeof(g->last_id), "%s", e->element[0]->str);
    const redisReply *f = e->element[1];
    const char *rt = NULL, *key = NULL, *backend = NULL;
    unsigned ok = 0, fail = 0;
    for (size_t i = 0; f->type == REDIS_REPLY_ARRAY && i + 1 < f->elements; i += 2) {
        const char *name = reply_str(f->element[i]), *v = reply_str(f->element[i + 1]);
        if (!name || !v)
            continue;
        if (strcmp(name, "rt") == 0)
            rt = v;
        else if (strcmp(name, "k") == 0)
            key = v;
        else if (strcmp(name, "b") == 0)
            backend = v;
        else if (strcmp(name, "ok") == 0)
            ok = (unsigned)strtoul(v, NULL, 10);
        else if (strcmp(name, "f") == 0)
            fail = (unsigned)strtoul(v, NULL, 10);
    }
    if (!rt || !key || !backend || strcmp(rt, share.id) == 0)
        return;
    if (ok > g->window)
        ok = g->window;
    if (fail > g->window)
        fail = g->window;
    uint64_t h = sl_lb_hash(key, strlen(key));
    pthread_mutex_lock(&g->lock);
    uint32_t slot = insert_key(g, h ? h : 1, key, now_ms);
    int gb = group_backend(g, backend);
    pthread_mutex_unlock(&g->lock);
    if (!slot || gb < 0)
        return;
    srkey_t *k = atomic_load_explicit(&g->keys[slot - 1], memory_order_acquire);
    window_t *w = key_window(g, k, (uint8_t)gb);
    if (!w)
        return;
    uint32_t e_q24 = atomic_load(&g->elimination_q24);
    uint32_t floor = e_q24 ? e_q24 / 2 : Q24_ONE / 1000;
    for (unsigned i = 0; i < ok || i < fail; i++) {
        if (i < ok)
            window_record(w, g->window, 1, now_rel(g, now_ms), floor, 0, 0, 0);
        if (i < fail)
            window_record(w, g->window, 0, now_rel(g, now_ms), floor, 0, 0, 0);
    }
}

static void share_on_read(redisAsyncContext *ac, void *r, void *priv)
{
    (void)ac;
    char *scope = priv;
    redisReply *reply = r;
    uint64_t now = sl_endpoint_now_ms();
    pthread_mutex_lock(&registry_lock);
    for (sl_srate_group_t *g = registry; g; g = g->next) {
        if (!g->redis_addr || strcmp(g->scope, scope) != 0 || !g->reading)
            continue;
        g->reading = 0;
        /* [[stream, [entry, ...]]], or nil when nothing is new */
        if (reply && reply->type == REDIS_REPLY_ARRAY && reply->elements == 1 &&
            reply->element[0]->type == REDIS_REPLY_ARRAY && reply->element[0]->elements == 2) {
            const redisReply *entries = reply->element[0]->element[1];
            for (size_t i = 0; entries->type == REDIS_REPLY_ARRAY && i < entries->elements; i++)
                share_apply(g, entries->element[i], now);
        }
        break;
    }
    pthread_mutex_unlock(&registry_lock);
    free(scope);
}

static void share_group(sl_srate_group_t *g, share_conn_t *c)
{
    char stream[600];
    snprintf(stream, sizeof(stream), "sluice:sr:%s", g->scope);
    pthread_mutex_lock(&g->lock);
    uint32_t used = atomic_load(&g->used);
    for (uint32_t i = 0; i < used; i++) {
        srkey_t *k = atomic_load(&g->keys[i]);
        if (!k || !atomic_load(&k->hash))
            continue;
        for (size_t b = 0; b < g->nbackends; b++) {
            window_t *w = atomic_load(&k->win[b]);
            if (!w)
                continue;
            uint32_t ok = atomic_exchange(&w->pending_ok, 0);
            uint32_t fail = atomic_exchange(&w->pending_fail, 0);
            if (!ok && !fail)
                continue;
            char okb[16], fb[16];
            snprintf(okb, sizeof(okb), "%u", ok);
            snprintf(fb, sizeof(fb), "%u", fail);
            const char *argv[] = {"XADD",   stream, "MAXLEN", "~", SHARE_STREAM_MAX,    "*",  "rt",
                                  share.id, "k",    k->name,  "b", g->backend_names[b], "ok", okb,
                                  "f",      fb};
            redisAsyncCommandArgv(c->ac, NULL, NULL, 16, argv, NULL);
        }
    }
    pthread_mutex_unlock(&g->lock);
    if (!g->reading) {
        char *scope = strdup(g->scope);
        if (scope &&
            redisAsyncCommand(c->ac, share_on_read, scope, "XREAD COUNT 10000 STREAMS %s %s",
                              stream, g->last_id) == REDIS_OK)
            g->reading = 1;
        else
            free(scope);
    }
}

static void share_on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    pthread_mutex_lock(&registry_lock);
    for (sl_srate_group_t *g = registry; g; g = g->next) {
        if (!g->redis_addr)
            continue;
        share_conn_t *c = share_conn(g->redis_addr);
        if (!c || !c->ac || !c->ready) {
            g->reading = 0; /* an XREAD of a dropped connection never answers */
            continue;
        }
        share_group(g, c);
    }
    pthread_mutex_unlock(&registry_lock);
}

static void *share_main(void *arg)
{
    (void)arg;
    event_base_dispatch(share.base);
    return NULL;
}

static void share_init(void)
{
    snprintf(share.id, sizeof(share.id), "%ld-%llx", (long)getpid(),
             (unsigned long long)sl_lb_hash(&share, sizeof(&share)) ^ sl_endpoint_now_ms());
    share.base = event_base_new();
    if (!share.base)
        return;
    share.tick = event_new(share.base, -1, EV_PERSIST, share_on_tick, NULL);
    struct timeval tv = {0, SHARE_TICK_MS * 1000};
    if (!share.tick || event_add(share.tick, &tv) != 0 ||
        pthread_create(&share.thread, NULL, share_main, NULL) != 0)
        return;
    pthread_setname_np(share.thread, "srate-share");
}

/* Starts the share thread once, on the first group with sharing. */
static void share_start(void)
{
    pthread_once(&share.once, share_init);
}

sl_srate_route_t *sl_srate_route_build(const Sluice__V1__SuccessRate *pb, const char *rule,
                                       const char *const *backend_names, size_t n, int in_order,
                                       char *err, size_t errlen)
{
    char scope_buf[512];
    const char *scope = pb->scope;
    if (rule) {
        snprintf(scope_buf, sizeof(scope_buf), "%s rule:%s", pb->scope, rule);
        scope = scope_buf;
    }
    sl_srate_route_t *sr = calloc(1, sizeof(*sr));
    if (!sr || !(sr->gidx = calloc(n ? n : 1, 1)))
        goto nomem;
    sr->pb = pb;
    sr->num_backends = n;
    sr->in_order = (uint8_t)(in_order != 0);
    sr->fixed_hash = sl_lb_hash("*", 1);
    if (!sr->fixed_hash)
        sr->fixed_hash = 1;
    sr->explore_ppm = pb->explore_ppm;
    sr->elimination_q24 = (uint32_t)((uint64_t)pb->elimination_ppm * Q24_ONE / SL_SRATE_PPM);
    sr->max_outcome_age_ms = pb->max_outcome_age_ms;
    sr->tolerance_ppm = pb->tolerance_ppm;
    sr->recovery_probes = pb->recovery_probes;
    sr->fail_connect = pb->fail_connect;
    sr->fail_reset = pb->fail_reset;
    sr->fail_timeout = pb->fail_timeout;
    sr->fail_5xx = pb->fail_5xx;
    for (size_t i = 0; i < pb->n_fail_statuses; i++) {
        uint32_t s = pb->fail_statuses[i];
        if (s >= 400 && s < 656)
            sr->fail_status_mask[(s - 400) / 64] |= UINT64_C(1) << ((s - 400) % 64);
    }
    sr->fail_header_len = pb->fail_header ? strlen(pb->fail_header) : 0;
    /* A group whose backend table is full of names of the past starts over
     * (a second try with a fresh group). */
    for (int attempt = 0; attempt < 2; attempt++) {
        pthread_mutex_lock(&registry_lock);
        sl_srate_group_t *g = NULL;
        if (attempt == 0) {
            g = group_acquire(scope, pb->window, pb->max_keys, pb->redis_address);
        } else if ((g = group_new(scope, pb->window, pb->max_keys, pb->redis_address))) {
            g->refs = 1;
            g->next = registry;
            registry = g;
        }
        pthread_mutex_unlock(&registry_lock);
        if (!g)
            goto nomem;
        int ok = 1;
        pthread_mutex_lock(&g->lock);
        for (size_t b = 0; b < n && ok; b++) {
            int gi = group_backend(g, backend_names[b]);
            if (gi < 0)
                ok = 0;
            else
                sr->gidx[b] = (uint8_t)gi;
        }
        pthread_mutex_unlock(&g->lock);
        if (ok) {
            if (g->redis_addr)
                share_start();
            atomic_store(&g->elimination_q24, sr->elimination_q24);
            atomic_store(&g->max_outcome_age_ms, sr->max_outcome_age_ms);
            sr->group = g;
            return sr;
        }
        group_release(g);
    }
nomem:
    snprintf(err, errlen, "success-rate routing %s: out of memory", scope);
    if (sr)
        free(sr->gidx);
    free(sr);
    return NULL;
}

const char *sl_srate_route_scope(const sl_srate_route_t *sr)
{
    return sr->group->scope;
}

void sl_srate_route_free(sl_srate_route_t *sr)
{
    if (!sr)
        return;
    if (sr->group)
        group_release(sr->group);
    free(sr->gidx);
    free(sr);
}

/* ---- the request path ------------------------------------------------------- */

uint64_t sl_srate_key(const sl_srate_route_t *sr, sl_srate_attr_fn get, void *ctx,
                      char buf[SL_SRATE_KEY_NAME_MAX])
{
    const Sluice__V1__SuccessRate *pb = sr->pb;
    size_t len = 0;
    if (pb->n_keys == 0) {
        /* One key for every request: its hash was computed once. */
        buf[0] = '*';
        buf[1] = '\0';
        return sr->fixed_hash;
    } else {
        for (size_t i = 0; i < pb->n_keys; i++) {
            const char *v;
            size_t vl;
            if (i && len < SL_SRATE_KEY_NAME_MAX - 1)
                buf[len++] = ',';
            if (!get(ctx, pb->keys[i], &v, &vl))
                continue;
            if (vl > SL_SRATE_KEY_NAME_MAX - 1 - len)
                vl = SL_SRATE_KEY_NAME_MAX - 1 - len;
            memcpy(buf + len, v, vl);
            len += vl;
        }
    }
    buf[len] = '\0';
    uint64_t h = sl_lb_hash(buf, len);
    return h ? h : 1;
}

/* Ranks the others after the pick: not eliminated first, then the most
 * successes in the window (all of a scope's windows have one length), then
 * the higher weight (or the earlier position for a list in order). n is
 * small (at most SL_ROUTE_CHOICES_MAX in practice): an insertion sort. */
static int ranks_before(const uint32_t *ok, const uint8_t *el, const uint32_t *weights,
                        int in_order, uint8_t a, uint8_t b)
{
    if (el[a] != el[b])
        return el[a] < el[b];
    if (ok[a] != ok[b])
        return ok[a] > ok[b];
    if (!in_order && weights && weights[a] != weights[b])
        return weights[a] > weights[b];
    return a < b;
}

static void rank(const uint32_t *ok, const uint8_t *el, const uint32_t *weights, int in_order,
                 size_t n, size_t pick, uint8_t *order)
{
    order[0] = (uint8_t)pick;
    size_t m = 1;
    for (size_t b = 0; b < n; b++) {
        if (b == pick)
            continue;
        size_t i = m++;
        while (i > 1 && ranks_before(ok, el, weights, in_order, (uint8_t)b, order[i - 1])) {
            order[i] = order[i - 1];
            i--;
        }
        order[i] = (uint8_t)b;
    }
}

/*
 * The request path's cost is here: one key lookup (a hash probe), one read
 * of each backend's success count and elimination score, one random draw,
 * comparisons in counts (no division). The scan of a window happens only
 * with maxOutcomeAge, and the per-million scores only for a caller that
 * wants them (the decision API).
 */
int sl_srate_pick(sl_srate_route_t *sr, const uint32_t *weights, size_t n, uint64_t hash,
                  const char *name, uint64_t now_ms, sl_lb_rng_t *rng, sl_srate_pick_t *out,
                  sl_srate_score_t *scores, uint8_t *order)
{
    out->slot = 0;
    out->tag = 0;
    out->explored = 0;
    out->probe = 0;
    out->win = NULL;
    if (n == 0)
        return -1;
    sl_srate_group_t *g = sr->group;
    uint32_t slot = lookup_key(g, hash, name, now_ms);
    srkey_t *k = slot ? atomic_load_explicit(&g->keys[slot - 1], memory_order_acquire) : NULL;
    if (k) {
        out->slot = slot;
        out->tag = atomic_load_explicit(&k->tag, memory_order_acquire);
        /* A key's recency is written at most once a second: every request
         * writing it would bounce its cache line between workers. */
        if (atomic_load_explicit(&k->last_used_ms, memory_order_relaxed) + 1000 <= now_ms)
            atomic_store_explicit(&k->last_used_ms, now_ms, memory_order_relaxed);
    }
    if (n > SL_SRATE_MAX_BACKENDS)
        n = SL_SRATE_MAX_BACKENDS;
    uint32_t win = g->window;
    uint32_t ok[SL_SRATE_MAX_BACKENDS];
    uint8_t el[SL_SRATE_MAX_BACKENDS];
    int any_standing = 0;
    if (scores || sr->max_outcome_age_ms) {
        uint32_t rel = now_rel(g, now_ms);
        sl_srate_score_t one;
        for (size_t b = 0; b < n; b++) {
            window_t *w =
                k ? atomic_load_explicit(&k->win[sr->gidx[b]], memory_order_acquire) : NULL;
            sl_srate_score_t *s = scores ? &scores[b] : &one;
            ok[b] = window_score(w, win, sr->max_outcome_age_ms, rel, sr->elimination_q24, s);
            el[b] = s->eliminated;
            any_standing |= !el[b];
        }
    } else {
        for (size_t b = 0; b < n; b++) {
            window_t *w =
                k ? atomic_load_explicit(&k->win[sr->gidx[b]], memory_order_acquire) : NULL;
            if (!w) {
                ok[b] = win;
                el[b] = 0;
            } else {
                uint32_t o = atomic_load_explicit(&w->successes, memory_order_relaxed);
                ok[b] = o < win ? o : win;
                el[b] =
                    sr->elimination_q24 &&
                    atomic_load_explicit(&w->elim_q24, memory_order_relaxed) < sr->elimination_q24;
            }
            any_standing |= !el[b];
        }
    }
    /* One draw: its low half decides exploration, its high half the pick. */
    uint64_t draw = sl_lb_rng_next(rng);
    int explore = sr->explore_ppm && (uint32_t)draw % SL_SRATE_PPM < sr->explore_ppm;
    /* The best choice: the backends not eliminated (all of them when every
     * one is) whose score is within the tolerance of the best, in counts:
     * (best - ok) / win <= tolerance. */
    uint32_t best = 0;
    for (size_t b = 0; b < n; b++)
        if ((!any_standing || !el[b]) && ok[b] > best)
            best = ok[b];
    uint64_t tol = (uint64_t)sr->tolerance_ppm * win;
    uint8_t cand[SL_SRATE_MAX_BACKENDS];
    size_t nbest = 0;
    for (size_t b = 0; b < n; b++) {
        cand[b] = (!any_standing || !el[b]) && (uint64_t)(best - ok[b]) * SL_SRATE_PPM <= tol;
        nbest += cand[b];
    }
    /* Exploration probes the others, so that a backend out of the best
     * choice is seen to recover (all of them when every one is best). */
    int probe = 0;
    if (explore && nbest < n) {
        for (size_t b = 0; b < n; b++)
            cand[b] = !cand[b];
        probe = 1;
    }
    int by_weight = !sr->in_order && weights;
    size_t pick = n;
    if (sr->in_order && !explore) {
        for (pick = 0; !cand[pick]; pick++)
            ; /* ties go to the first listed */
    } else {
        /* Ties by weight (uniformly for a list in order while exploring). */
        uint64_t total = 0;
        for (size_t b = 0; b < n; b++)
            if (cand[b])
                total += by_weight && weights[b] ? weights[b] : 1;
        uint64_t x = (draw >> 32) % total;
        for (size_t b = 0; b < n; b++) {
            if (!cand[b])
                continue;
            uint64_t wt = by_weight && weights[b] ? weights[b] : 1;
            pick = b;
            if (x < wt)
                break;
            x -= wt;
        }
    }
    out->probe = (uint8_t)probe;
    out->gbackend = sr->gidx[pick];
    out->explored = (uint8_t)explore;
    out->win = k ? atomic_load_explicit(&k->win[out->gbackend], memory_order_relaxed) : NULL;
    if (order)
        rank(ok, el, weights, sr->in_order, n, pick, order);
    return (int)pick;
}

static void record_in(sl_srate_group_t *g, srkey_t *k, uint8_t gb, window_t *w, int success,
                      uint64_t now_ms, uint32_t elimination_q24, int probe,
                      uint32_t recovery_probes)
{
    if (!w && !(w = key_window(g, k, gb)))
        return;
    uint32_t floor = elimination_q24 ? elimination_q24 / 2 : Q24_ONE / 1000;
    window_record(w, g->window, success, now_rel(g, now_ms), floor, g->redis_addr != NULL, probe,
                  recovery_probes);
}

void sl_srate_record(const sl_srate_route_t *sr, const sl_srate_pick_t *p, int success,
                     uint64_t now_ms)
{
    if (!p->slot)
        return;
    sl_srate_group_t *g = sr->group;
    srkey_t *k = atomic_load_explicit(&g->keys[p->slot - 1], memory_order_acquire);
    if (!k || atomic_load_explicit(&k->tag, memory_order_acquire) != p->tag)
        return; /* the key was evicted meanwhile */
    /* A window once made stays its (key slot, backend)'s until the group
     * goes (an eviction resets it, and the tag above tells): the pick's
     * pointer is good. */
    record_in(g, k, p->gbackend, p->win, success, now_ms, sr->elimination_q24, p->probe,
              sr->recovery_probes);
}

int sl_srate_feedback(sl_srate_route_t *sr, uint64_t hash, const char *name, const char *backend,
                      int success, uint64_t now_ms)
{
    sl_srate_group_t *g = sr->group;
    int gb = -1;
    pthread_mutex_lock(&g->lock);
    for (size_t b = 0; b < sr->num_backends; b++) {
        if (strcmp(g->backend_names[sr->gidx[b]], backend) == 0) {
            gb = sr->gidx[b];
            break;
        }
    }
    pthread_mutex_unlock(&g->lock);
    if (gb < 0)
        return -1;
    uint32_t slot = lookup_key(g, hash, name, now_ms);
    srkey_t *k = slot ? atomic_load_explicit(&g->keys[slot - 1], memory_order_acquire) : NULL;
    if (k)
        record_in(g, k, (uint8_t)gb, NULL, success, now_ms, sr->elimination_q24, 0, 0);
    return 0;
}

int sl_srate_classify_status(const sl_srate_route_t *sr, int status, const char *outcome_header,
                             size_t outcome_header_len)
{
    if (status >= 400 && status < 656 &&
        (sr->fail_status_mask[(status - 400) / 64] >> ((status - 400) % 64) & 1))
        return 0;
    if (outcome_header && sr->pb->fail_header_value &&
        outcome_header_len == strlen(sr->pb->fail_header_value) &&
        strncasecmp(outcome_header, sr->pb->fail_header_value, outcome_header_len) == 0)
        return 0;
    if (status >= 500)
        return sr->fail_5xx ? 0 : -1;
    if (status >= 400)
        return -1; /* the client's fault, not the backend's */
    return 1;
}

/* ---- admin ------------------------------------------------------------------ */

typedef struct {
    uint32_t slot;
    uint64_t last_used;
} recent_t;

static int cmp_recent(const void *a, const void *b)
{
    const recent_t *x = a, *y = b;
    return x->last_used < y->last_used ? 1 : x->last_used > y->last_used ? -1 : 0;
}

/* Under g->lock: up to limit key slots, most recently used first; *n set. */
static recent_t *recent_keys(sl_srate_group_t *g, size_t limit, size_t *n)
{
    uint32_t used = atomic_load_explicit(&g->used, memory_order_relaxed);
    recent_t *r = calloc(used ? used : 1, sizeof(*r));
    *n = 0;
    if (!r)
        return NULL;
    for (uint32_t i = 0; i < used; i++) {
        srkey_t *k = atomic_load_explicit(&g->keys[i], memory_order_acquire);
        if (!k || !atomic_load_explicit(&k->hash, memory_order_acquire))
            continue;
        r[(*n)++] = (recent_t){i, atomic_load_explicit(&k->last_used_ms, memory_order_relaxed)};
    }
    qsort(r, *n, sizeof(*r), cmp_recent);
    if (*n > limit)
        *n = limit;
    return r;
}

static void group_scores(sl_srate_group_t *g, srkey_t *k, uint64_t now_ms, size_t b,
                         sl_srate_score_t *s)
{
    window_t *w = atomic_load_explicit(&k->win[b], memory_order_acquire);
    window_score(w, g->window, atomic_load(&g->max_outcome_age_ms), now_rel(g, now_ms),
                 atomic_load(&g->elimination_q24), s);
}

json_t *sl_srate_scores_json(size_t limit, int eliminated_only)
{
    json_t *out = json_array();
    if (!out)
        return NULL;
    uint64_t now = sl_endpoint_now_ms();
    pthread_mutex_lock(&registry_lock);
    for (sl_srate_group_t *g = registry; g; g = g->next) {
        pthread_mutex_lock(&g->lock);
        size_t n;
        recent_t *r = recent_keys(g, eliminated_only ? SIZE_MAX : limit, &n);
        json_t *keys = json_array();
        for (size_t i = 0; r && keys && i < n; i++) {
            srkey_t *k = atomic_load(&g->keys[r[i].slot]);
            json_t *backends = json_array();
            for (size_t b = 0; backends && b < g->nbackends; b++) {
                sl_srate_score_t s;
                group_scores(g, k, now, b, &s);
                if (eliminated_only && !s.eliminated)
                    continue;
                window_t *w = atomic_load(&k->win[b]);
                json_array_append_new(
                    backends,
                    json_pack("{s:s, s:f, s:b, s:f, s:i, s:I, s:I}", "backend", g->backend_names[b],
                              "score", s.score_ppm / 1e6, "eliminated", s.eliminated,
                              "eliminationScore", s.elimination_ppm / 1e6, "outcomes",
                              (int)s.outcomes, "successes",
                              (json_int_t)(w ? atomic_load(&w->total_ok) : 0), "failures",
                              (json_int_t)(w ? atomic_load(&w->total_fail) : 0)));
            }
            if (eliminated_only && json_array_size(backends) == 0) {
                json_decref(backends);
                continue;
            }
            json_array_append_new(keys, json_pack("{s:s, s:o}", "key", k->name, "backends",
                                                  backends ? backends : json_array()));
        }
        free(r);
        json_array_append_new(
            out, json_pack("{s:s, s:i, s:i, s:i, s:I, s:o}", "scope", g->scope, "window",
                           (int)g->window, "keys", (int)atomic_load(&g->used), "maxKeys",
                           (int)g->max_keys, "evictions", (json_int_t)atomic_load(&g->evictions),
                           "entries", keys ? keys : json_array()));
        pthread_mutex_unlock(&g->lock);
    }
    pthread_mutex_unlock(&registry_lock);
    return out;
}

static void label_triple(struct evbuffer *out, const char *family, const sl_srate_group_t *g,
                         const char *key, const char *backend)
{
    evbuffer_add_printf(out, "%s{api=\"", family);
    sl_prom_label_value(out, g->scope);
    evbuffer_add(out, "\",key=\"", 7);
    sl_prom_label_value(out, key);
    evbuffer_add(out, "\",backend=\"", 11);
    sl_prom_label_value(out, backend);
    evbuffer_add(out, "\"}", 2);
}

void sl_srate_render_metrics(struct evbuffer *out)
{
    pthread_mutex_lock(&registry_lock);
    if (!registry) {
        pthread_mutex_unlock(&registry_lock);
        return;
    }
    uint64_t now = sl_endpoint_now_ms();
    static const struct {
        const char *name, *type, *help;
    } fam[] = {
        {"sluice_srate_keys", "gauge", "Scoring keys held for success-rate routing, by scope."},
        {"sluice_srate_keys_max", "gauge", "The bound on scoring keys (maxKeys), by scope."},
        {"sluice_srate_key_evictions_total", "counter",
         "Scoring keys evicted (least recently used) to stay within maxKeys."},
        {"sluice_backend_score", "gauge",
         "Success ratio of a backend over its window for a scoring key (the 64 most recently "
         "used keys of each scope)."},
        {"sluice_backend_eliminated", "gauge",
         "1 while the backend is out of the best-score choice for the key (elimination)."},
    };
    for (size_t f = 0; f < 3; f++) {
        sl_prom_header(out, fam[f].name, fam[f].type, fam[f].help);
        for (sl_srate_group_t *g = registry; g; g = g->next) {
            uint64_t v = f == 0   ? atomic_load(&g->used)
                         : f == 1 ? g->max_keys
                                  : atomic_load(&g->evictions);
            evbuffer_add_printf(out, "%s{api=\"", fam[f].name);
            sl_prom_label_value(out, g->scope);
            evbuffer_add_printf(out, "\"} %llu\n", (unsigned long long)v);
        }
    }
    for (size_t f = 3; f < 5; f++) {
        sl_prom_header(out, fam[f].name, fam[f].type, fam[f].help);
        for (sl_srate_group_t *g = registry; g; g = g->next) {
            pthread_mutex_lock(&g->lock);
            size_t n;
            recent_t *r = recent_keys(g, SL_SRATE_METRIC_KEYS, &n);
            for (size_t i = 0; r && i < n; i++) {
                srkey_t *k = atomic_load(&g->keys[r[i].slot]);
                for (size_t b = 0; b < g->nbackends; b++) {
                    sl_srate_score_t s;
                    group_scores(g, k, now, b, &s);
                    label_triple(out, fam[f].name, g, k->name, g->backend_names[b]);
                    if (f == 3)
                        evbuffer_add_printf(out, " %.6f\n", s.score_ppm / 1e6);
                    else
                        evbuffer_add_printf(out, " %d\n", s.eliminated);
                }
            }
            free(r);
            pthread_mutex_unlock(&g->lock);
        }
    }
    pthread_mutex_unlock(&registry_lock);
}
