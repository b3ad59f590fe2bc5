/*
 * The response cache's zones, entries and fills (cache_store.h).
 */
#include "cache_store.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

const char *const sl_cache_result_names[SL_CACHE_RESULTS] = {
    "hit", "miss", "expired", "coalesced", "pass", "bypass",
};

#define INITIAL_BUCKETS 64

struct sl_cache_fill {
    struct sl_cache_fill *next;
    uint64_t hash;
    char *key;
    size_t key_len;
    sl_cache_waiter_t *waiters;
    size_t num_waiters, cap_waiters;
};

typedef struct {
    pthread_mutex_t lock;
    sl_cache_entry_t **buckets;
    size_t nbuckets, count;
    sl_cache_entry_t *lru_head, *lru_tail; /* head = most recently used */
    sl_cache_fill_t *fills;
} shard_t;

typedef struct {
    const void *holder;
    uint64_t max_bytes;
} holder_t;

struct sl_cache_zone {
    struct sl_cache_zone *next; /* registry */
    char *name;
    holder_t *holders;
    size_t num_holders, cap_holders;
    atomic_uint_fast64_t max_bytes;
    atomic_uint_fast64_t bytes;
    atomic_uint_fast64_t entries;
    atomic_uint_fast64_t evictions;
    atomic_uint_fast64_t stores;
    atomic_uint_fast64_t lookups[SL_CACHE_RESULTS];
    atomic_uint evict_cursor; /* the next other shard to evict from */
    shard_t shards[SL_CACHE_SHARDS];
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static sl_cache_zone_t *registry;

uint64_t sl_cache_hash(const char *key, size_t len)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)key[i];
        h *= 1099511628211ULL;
    }
    /* FNV's low bits are weak: mix (splitmix64's finaliser). */
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebULL;
    h ^= h >> 31;
    return h;
}

static shard_t *shard_of(sl_cache_zone_t *z, uint64_t hash)
{
    return &z->shards[hash >> 60]; /* SL_CACHE_SHARDS == 16 */
}
_Static_assert(SL_CACHE_SHARDS == 16, "shard_of takes the hash's top 4 bits");

/* ---- entries -------------------------------------------------------------------- */

sl_cache_entry_t *sl_cache_entry_new(const char *key, size_t key_len, uint64_t hash, int status,
                                     const char *head, size_t head_len, const char *body,
                                     size_t body_len, uint64_t now_ms, uint64_t lifetime_ms,
                                     uint32_t initial_age_s, int auth_ok)
{
    size_t size = sizeof(sl_cache_entry_t) + key_len + head_len + body_len;
    sl_cache_entry_t *e = malloc(size);
    if (!e)
        return NULL;
    memset(e, 0, sizeof(*e));
    atomic_init(&e->refs, 1);
    e->hash = hash;
    e->stored_ms = now_ms;
    uint64_t age_ms = (uint64_t)initial_age_s * 1000;
    e->expires_ms = lifetime_ms > age_ms ? now_ms + (lifetime_ms - age_ms) : now_ms;
    e->initial_age_s = initial_age_s;
    e->status = status;
    e->auth_ok = (uint8_t)(auth_ok != 0);
    e->size = size;
    char *p = e->data;
    memcpy(p, key, key_len);
    e->key = p;
    e->key_len = key_len;
    p += key_len;
    if (head_len)
        memcpy(p, head, head_len);
    e->head = p;
    e->head_len = head_len;
    p += head_len;
    if (body_len)
        memcpy(p, body, body_len);
    e->body = p;
    e->body_len = body_len;
    return e;
}

void sl_cache_entry_release(sl_cache_entry_t *e)
{
    if (e && atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) == 1)
        free(e);
}

/* ---- a shard's table and LRU (its lock held) ------------------------------------ */

static void lru_unlink(shard_t *s, sl_cache_entry_t *e)
{
    if (e->lru_prev)
        e->lru_prev->lru_next = e->lru_next;
    else
        s->lru_head = e->lru_next;
    if (e->lru_next)
        e->lru_next->lru_prev = e->lru_prev;
    else
        s->lru_tail = e->lru_prev;
    e->lru_prev = e->lru_next = NULL;
}

static void lru_push_head(shard_t *s, sl_cache_entry_t *e)
{
    e->lru_prev = NULL;
    e->lru_next = s->lru_head;
    if (s->lru_head)
        s->lru_head->lru_prev = e;
    s->lru_head = e;
    if (!s->lru_tail)
        s->lru_tail = e;
}

static sl_cache_entry_t **find_slot(shard_t *s, const char *key, size_t len, uint64_t hash)
{
    if (!s->nbuckets)
        return NULL;
    sl_cache_entry_t **pp = &s->buckets[hash & (s->nbuckets - 1)];
    for (; *pp; pp = &(*pp)->hnext)
        if ((*pp)->hash == hash && (*pp)->key_len == len && memcmp((*pp)->key, key, len) == 0)
            return pp;
    return NULL;
}

/* Unlinks the entry at *pp; the table's reference goes to the caller. */
static sl_cache_entry_t *unlink_at(sl_cache_zone_t *z, shard_t *s, sl_cache_entry_t **pp)
{
    sl_cache_entry_t *e = *pp;
    *pp = e->hnext;
    e->hnext = NULL;
    lru_unlink(s, e);
    s->count--;
    atomic_fetch_sub_explicit(&z->bytes, e->size, memory_order_relaxed);
    atomic_fetch_sub_explicit(&z->entries, 1, memory_order_relaxed);
    return e;
}

static void grow(shard_t *s)
{
    size_t n = s->nbuckets ? s->nbuckets * 2 : INITIAL_BUCKETS;
    sl_cache_entry_t **b = calloc(n, sizeof(*b));
    if (!b)
        return; /* longer chains, still correct */
    for (size_t i = 0; i < s->nbuckets; i++) {
        sl_cache_entry_t *e = s->buckets[i];
        while (e) {
            sl_cache_entry_t *next = e->hnext;
            e->hnext = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
            e = next;
        }
    }
    free(s->buckets);
    s->buckets = b;
    s->nbuckets = n;
}

/* Links e (the table takes its reference), replacing the key's previous
 * entry, which is returned (its reference now the caller's) or NULL. */
static sl_cache_entry_t *link_entry(sl_cache_zone_t *z, shard_t *s, sl_cache_entry_t *e)
{
    sl_cache_entry_t *old = NULL;
    sl_cache_entry_t **pp = find_slot(s, e->key, e->key_len, e->hash);
    if (pp)
        old = unlink_at(z, s, pp);
    if (s->count >= s->nbuckets)
        grow(s);
    if (!s->nbuckets) {
        /* No table at all (out of memory): the entry is simply not kept. */
        sl_cache_entry_release(e);
        return old;
    }
    sl_cache_entry_t **b = &s->buckets[e->hash & (s->nbuckets - 1)];
    e->hnext = *b;
    *b = e;
    lru_push_head(s, e);
    s->count++;
    atomic_fetch_add_explicit(&z->bytes, e->size, memory_order_relaxed);
    atomic_fetch_add_explicit(&z->entries, 1, memory_order_relaxed);
    return old;
}

/* Evicts s's least recently used entries (never `keep`) while the zone is
 * over its bound. Victims are chained on *victims (through hnext) for the
 * caller to release once the lock is dropped. */
static void evict_locked(sl_cache_zone_t *z, shard_t *s, const sl_cache_entry_t *keep,
                         sl_cache_entry_t **victims)
{
    while (atomic_load_explicit(&z->bytes, memory_order_relaxed) >
           atomic_load_explicit(&z->max_bytes, memory_order_relaxed)) {
        sl_cache_entry_t *v = s->lru_tail;
        if (v == keep)
            v = v ? v->lru_prev : NULL;
        if (!v)
            return;
        sl_cache_entry_t **pp = find_slot(s, v->key, v->key_len, v->hash);
        if (!pp)
            return; /* cannot happen: every LRU member is in the table */
        unlink_at(z, s, pp);
        atomic_fetch_add_explicit(&z->evictions, 1, memory_order_relaxed);
        v->hnext = *victims;
        *victims = v;
    }
}

static void release_chain(sl_cache_entry_t *v)
{
    while (v) {
        sl_cache_entry_t *next = v->hnext;
        v->hnext = NULL;
        sl_cache_entry_release(v);
        v = next;
    }
}

/* Over the bound after an insert into `from`: the other shards give up
 * their least recently used entries, round robin, one lock at a time. */
static void evict_others(sl_cache_zone_t *z, const shard_t *from)
{
    for (unsigned tries = 0; tries < 2 * SL_CACHE_SHARDS; tries++) {
        if (atomic_load_explicit(&z->bytes, memory_order_relaxed) <=
            atomic_load_explicit(&z->max_bytes, memory_order_relaxed))
            return;
        unsigned i =
            atomic_fetch_add_explicit(&z->evict_cursor, 1, memory_order_relaxed) % SL_CACHE_SHARDS;
        shard_t *s = &z->shards[i];
        if (s == from)
            continue;
        sl_cache_entry_t *victims = NULL;
        pthread_mutex_lock(&s->lock);
        evict_locked(z, s, NULL, &victims);
        pthread_mutex_unlock(&s->lock);
        release_chain(victims);
    }
}

/* ---- zones ---------------------------------------------------------------------- */

static void zone_free(sl_cache_zone_t *z)
{
    for (size_t i = 0; i < SL_CACHE_SHARDS; i++) {
        shard_t *s = &z->shards[i];
        for (size_t b = 0; b < s->nbuckets; b++) {
            sl_cache_entry_t *e = s->buckets[b];
            while (e) {
                sl_cache_entry_t *next = e->hnext;
                sl_cache_entry_release(e);
                e = next;
            }
        }
        free(s->buckets);
        /* Fills outlive no request, and requests hold the generation that
         * holds the zone: none is left here. Free them anyway. */
        sl_cache_fill_t *f = s->fills;
        while (f) {
            sl_cache_fill_t *next = f->next;
            free(f->key);
            free(f->waiters);
            free(f);
            f = next;
        }
        pthread_mutex_destroy(&s->lock);
    }
    free(z->holders);
    free(z->name);
    free(z);
}

static void recompute_bound(sl_cache_zone_t *z)
{
    uint64_t max = 0;
    for (size_t i = 0; i < z->num_holders; i++)
        if (z->holders[i].max_bytes > max)
            max = z->holders[i].max_bytes;
    atomic_store_explicit(&z->max_bytes, max, memory_order_relaxed);
}

sl_cache_zone_t *sl_cache_zone_acquire(const char *name, uint64_t max_bytes, const void *holder)
{
    if (!name)
        name = "";
    pthread_mutex_lock(&registry_lock);
    sl_cache_zone_t *z = registry;
    while (z && strcmp(z->name, name) != 0)
        z = z->next;
    if (!z) {
        z = calloc(1, sizeof(*z));
        if (!z || !(z->name = strdup(name))) {
            free(z);
            pthread_mutex_unlock(&registry_lock);
            return NULL;
        }
        for (size_t i = 0; i < SL_CACHE_SHARDS; i++)
            pthread_mutex_init(&z->shards[i].lock, NULL);
        z->next = registry;
        registry = z;
    }
    if (z->num_holders == z->cap_holders) {
        size_t cap = z->cap_holders ? z->cap_holders * 2 : 8;
        holder_t *h = realloc(z->holders, cap * sizeof(*h));
        if (!h) {
            if (!z->num_holders) { /* just made: unlink it again */
                registry = z->next;
                zone_free(z);
            }
            pthread_mutex_unlock(&registry_lock);
            return NULL;
        }
        z->holders = h;
        z->cap_holders = cap;
    }
    z->holders[z->num_holders++] = (holder_t){holder, max_bytes};
    recompute_bound(z);
    pthread_mutex_unlock(&registry_lock);
    return z;
}

void sl_cache_zone_release(sl_cache_zone_t *z, const void *holder)
{
    if (!z)
        return;
    pthread_mutex_lock(&registry_lock);
    for (size_t i = 0; i < z->num_holders; i++) {
        if (z->holders[i].holder == holder) {
            z->holders[i] = z->holders[--z->num_holders];
            break;
        }
    }
    if (z->num_holders == 0) {
        sl_cache_zone_t **pp = &registry;
        while (*pp && *pp != z)
            pp = &(*pp)->next;
        if (*pp)
            *pp = z->next;
        pthread_mutex_unlock(&registry_lock);
        zone_free(z);
        return;
    }
    recompute_bound(z);
    pthread_mutex_unlock(&registry_lock);
    /* A smaller bound takes effect now, not at the next insert. */
    evict_others(z, NULL);
}

void sl_cache_zone_count(sl_cache_zone_t *z, enum sl_cache_result r)
{
    if (z && r < SL_CACHE_RESULTS)
        atomic_fetch_add_explicit(&z->lookups[r], 1, memory_order_relaxed);
}

void sl_cache_zones_foreach(void (*fn)(const sl_cache_zone_stats_t *s, void *arg), void *arg)
{
    pthread_mutex_lock(&registry_lock);
    for (sl_cache_zone_t *z = registry; z; z = z->next) {
        sl_cache_zone_stats_t st = {
            .name = z->name,
            .max_bytes = atomic_load_explicit(&z->max_bytes, memory_order_relaxed),
            .bytes = atomic_load_explicit(&z->bytes, memory_order_relaxed),
            .entries = atomic_load_explicit(&z->entries, memory_order_relaxed),
            .evictions = atomic_load_explicit(&z->evictions, memory_order_relaxed),
            .stores = atomic_load_explicit(&z->stores, memory_order_relaxed),
        };
        for (int i = 0; i < SL_CACHE_RESULTS; i++)
            st.lookups[i] = atomic_load_explicit(&z->lookups[i], memory_order_relaxed);
        fn(&st, arg);
    }
    pthread_mutex_unlock(&registry_lock);
}

/* ---- lookups, inserts, fills ---------------------------------------------------- */

static sl_cache_fill_t *find_fill(shard_t *s, const char *key, size_t len, uint64_t hash)
{
    for (sl_cache_fill_t *f = s->fills; f; f = f->next)
        if (f->hash == hash && f->key_len == len && memcmp(f->key, key, len) == 0)
            return f;
    return NULL;
}

static int add_waiter(sl_cache_fill_t *f, const sl_cache_waiter_t *w)
{
    if (f->num_waiters == f->cap_waiters) {
        size_t cap = f->cap_waiters ? f->cap_waiters * 2 : 8;
        sl_cache_waiter_t *n = realloc(f->waiters, cap * sizeof(*n));
        if (!n)
            return -1;
        f->waiters = n;
        f->cap_waiters = cap;
    }
    f->waiters[f->num_waiters++] = *w;
    return 0;
}

enum sl_cache_result sl_cache_lookup(sl_cache_zone_t *z, const char *key, size_t key_len,
                                     uint64_t hash, uint64_t now_ms, int authorized,
                                     const sl_cache_waiter_t *waiter, sl_cache_entry_t **hit,
                                     sl_cache_fill_t **fill)
{
    shard_t *s = shard_of(z, hash);
    enum sl_cache_result res = SL_CACHE_MISS;
    sl_cache_entry_t *stale = NULL;
    *hit = NULL;
    *fill = NULL;
    pthread_mutex_lock(&s->lock);
    sl_cache_entry_t **pp = find_slot(s, key, key_len, hash);
    if (pp) {
        sl_cache_entry_t *e = *pp;
        if (now_ms >= e->expires_ms) {
            stale = unlink_at(z, s, pp);
            res = SL_CACHE_EXPIRED;
        } else if (e->pass) {
            res = SL_CACHE_PASS;
            goto out;
        } else if (authorized && !e->auth_ok) {
            /* RFC 9111 3.5: not for a request with credentials; the
             * response it gets is not stored over this one either, unless
             * it allows it (then it replaces this entry). */
            res = SL_CACHE_PASS;
            goto out;
        } else {
            atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
            lru_unlink(s, e);
            lru_push_head(s, e);
            *hit = e;
            res = SL_CACHE_HIT;
            goto out;
        }
    }
    if (!waiter)
        goto out;
    sl_cache_fill_t *f = find_fill(s, key, key_len, hash);
    if (f) {
        if (add_waiter(f, waiter) == 0)
            res = SL_CACHE_WAIT;
        goto out; /* out of memory: go on alone */
    }
    f = calloc(1, sizeof(*f));
    if (f && (f->key = malloc(key_len ? key_len : 1))) {
        memcpy(f->key, key, key_len);
        f->key_len = key_len;
        f->hash = hash;
        f->next = s->fills;
        s->fills = f;
        *fill = f;
    } else {
        free(f); /* out of memory: a miss that coalesces nothing */
    }
out:
    pthread_mutex_unlock(&s->lock);
    sl_cache_entry_release(stale);
    atomic_fetch_add_explicit(&z->lookups[res], 1, memory_order_relaxed);
    return res;
}

/* Stores e in its shard (lock held), collecting what it displaces. */
static void insert_locked(sl_cache_zone_t *z, shard_t *s, sl_cache_entry_t *e,
                          sl_cache_entry_t **victims)
{
    sl_cache_entry_t *old = link_entry(z, s, e);
    if (old) {
        old->hnext = *victims;
        *victims = old;
    }
    atomic_fetch_add_explicit(&z->stores, 1, memory_order_relaxed);
    evict_locked(z, s, e, victims);
}

void sl_cache_insert(sl_cache_zone_t *z, sl_cache_entry_t *e)
{
    if (e->size > atomic_load_explicit(&z->max_bytes, memory_order_relaxed)) {
        sl_cache_entry_release(e);
        return;
    }
    shard_t *s = shard_of(z, e->hash);
    sl_cache_entry_t *victims = NULL;
    pthread_mutex_lock(&s->lock);
    insert_locked(z, s, e, &victims);
    pthread_mutex_unlock(&s->lock);
    release_chain(victims);
    evict_others(z, s);
}

size_t sl_cache_fill_end(sl_cache_zone_t *z, sl_cache_fill_t *f, sl_cache_entry_t *e,
                         uint64_t now_ms, uint64_t pass_ms, sl_cache_waiter_t **waiters)
{
    *waiters = NULL;
    if (!f) {
        if (e)
            sl_cache_insert(z, e);
        return 0;
    }
    if (e && e->size > atomic_load_explicit(&z->max_bytes, memory_order_relaxed)) {
        sl_cache_entry_release(e);
        e = NULL;
    }
    sl_cache_entry_t *marker = NULL;
    if (!e && pass_ms)
        marker = sl_cache_entry_new(f->key, f->key_len, f->hash, 0, NULL, 0, NULL, 0, now_ms,
                                    pass_ms, 0, 0);
    shard_t *s = shard_of(z, f->hash);
    sl_cache_entry_t *victims = NULL;
    pthread_mutex_lock(&s->lock);
    sl_cache_fill_t **pp = &s->fills;
    while (*pp && *pp != f)
        pp = &(*pp)->next;
    if (*pp)
        *pp = f->next;
    if (e) {
        insert_locked(z, s, e, &victims);
    } else if (marker) {
        /* Never over a fresh entry some other request stored meanwhile. */
        sl_cache_entry_t **cur = find_slot(s, f->key, f->key_len, f->hash);
        if (cur && now_ms < (*cur)->expires_ms && !(*cur)->pass) {
            marker->hnext = victims;
            victims = marker;
        } else {
            marker->pass = 1;
            insert_locked(z, s, marker, &victims);
        }
    }
    pthread_mutex_unlock(&s->lock);
    release_chain(victims);
    if (e || marker)
        evict_others(z, s);
    size_t n = f->num_waiters;
    *waiters = f->waiters;
    free(f->key);
    free(f);
    return n;
}
