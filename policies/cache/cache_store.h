/*
 * The response cache's memory (docs/policies/cache.md): zones of immutable,
 * refcounted entries, shared by every worker of the runtime, bounded in
 * bytes with LRU eviction, and the in-flight fills that coalesce
 * concurrent misses of one key.
 *
 * Zones: one per Api (its namespace/name), made by the first compiled cache
 * policy of that Api and kept in a process-wide registry while any
 * compiled policy holds it. A generation swap compiles the new chains
 * before the old generation lets go, so a zone and its entries survive
 * reloads (DESIGN.md: state keyed by stable identity, carried over); an Api
 * that loses its cache policy (or is deleted) frees its zone with its last
 * generation. The zone's bound is the largest maxBytes of the policies
 * holding it.
 *
 * Entries: one allocation (key, response head, body), immutable once made,
 * with an atomic reference count: the zone's table holds one, every
 * request serving it another, so a hit is written to its client without
 * any lock and an entry evicted meanwhile lives until its last reader is
 * done.
 *
 * Shards: a key's hash picks one of SL_CACHE_SHARDS shards, each with its
 * own mutex, hash table, LRU list and in-flight fills. A lock is held for a
 * table probe and a few pointer moves, never for I/O or a copy of a body.
 * Bytes are counted per zone (atomic); an insert that takes the zone over
 * its bound evicts its own shard's least recently used entries first, then
 * other shards' (one lock at a time), so LRU is exact within a shard and
 * approximate across them.
 *
 * Fills: the first miss of a key (the leader) opens a fill; later misses of
 * that key register as waiters (a worker index and a token, never a
 * pointer) and the leader ends the fill with or without an entry, getting
 * the waiters to wake back. The store never calls anyone: waking (and
 * timing out) is the runtime's (runtime/proxy/cache.c).
 *
 * Any thread. No libevent, no runtime types: unit-testable alone.
 */
#ifndef SL_CACHE_STORE_H
#define SL_CACHE_STORE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define SL_CACHE_SHARDS 16

typedef struct sl_cache_entry {
    atomic_uint refs;
    /* The shard's table and LRU list (its lock): */
    struct sl_cache_entry *hnext, *lru_prev, *lru_next;
    uint64_t hash;
    uint64_t stored_ms;     /* monotonic ms when stored */
    uint64_t expires_ms;    /* monotonic ms; fresh while now < expires_ms */
    uint32_t initial_age_s; /* the origin's Age when stored */
    int status;
    uint8_t pass;    /* a marker: this key's last response could not be stored */
    uint8_t auth_ok; /* may answer a request with Authorization (public, s-maxage) */
    size_t size;     /* bytes accounted to the zone */
    const char *key;
    size_t key_len;
    const char *head; /* "HTTP/1.1 200 OK\r\n...Content-Length: N\r\n\r\n" */
    size_t head_len;
    const char *body;
    size_t body_len;
    char data[];
} sl_cache_entry_t;

/* Who waits for a fill: resolved by the runtime, stale ones ignored. */
typedef struct {
    uint32_t worker;
    uint64_t token;
} sl_cache_waiter_t;

typedef struct sl_cache_fill sl_cache_fill_t;
typedef struct sl_cache_zone sl_cache_zone_t;

enum sl_cache_result {
    SL_CACHE_HIT = 0, /* *hit holds a reference */
    SL_CACHE_MISS,    /* nothing stored (with a waiter: *fill is the caller's to end) */
    SL_CACHE_EXPIRED, /* like MISS; a stale entry was dropped */
    SL_CACHE_WAIT,    /* another request fills this key: the waiter is registered */
    SL_CACHE_PASS,    /* this key's last response was not storable: go on alone */
    SL_CACHE_BYPASS,  /* not looked up (counted by sl_cache_zone_count) */
    SL_CACHE_RESULTS
};
extern const char *const sl_cache_result_names[SL_CACHE_RESULTS]; /* "hit", "miss", ... */

/* 64-bit hash of a key (FNV-1a, then mixed). */
uint64_t sl_cache_hash(const char *key, size_t len);

/*
 * The zone of `name`, made if needed, with `holder` (a compiled policy)
 * counted as holding it with its max_bytes. NULL when out of memory.
 * sl_cache_zone_release drops that holder; the last one frees the zone.
 * Main thread (compile / free), or any thread: the registry has a lock.
 */
sl_cache_zone_t *sl_cache_zone_acquire(const char *name, uint64_t max_bytes, const void *holder);
void sl_cache_zone_release(sl_cache_zone_t *z, const void *holder);

/*
 * Looks `key` up at now_ms. A fresh entry is a HIT (*hit referenced,
 * moved to the LRU head); a stale one is dropped (EXPIRED). When nothing
 * fresh is stored and `waiter` is given: if a fill for the key is under
 * way the waiter joins it (WAIT), else a fill is opened for the caller
 * (MISS or EXPIRED with *fill set). Without a waiter nothing waits and no
 * fill is opened. `authorized`: the request carries credentials the
 * cache does not key on; only entries marked auth_ok answer it.
 */
enum sl_cache_result sl_cache_lookup(sl_cache_zone_t *z, const char *key, size_t key_len,
                                     uint64_t hash, uint64_t now_ms, int authorized,
                                     const sl_cache_waiter_t *waiter, sl_cache_entry_t **hit,
                                     sl_cache_fill_t **fill);

/*
 * A new entry (reference count 1, the caller's) holding copies of key,
 * head and body. NULL when out of memory.
 */
sl_cache_entry_t *sl_cache_entry_new(const char *key, size_t key_len, uint64_t hash, int status,
                                     const char *head, size_t head_len, const char *body,
                                     size_t body_len, uint64_t now_ms, uint64_t lifetime_ms,
                                     uint32_t initial_age_s, int auth_ok);
void sl_cache_entry_release(sl_cache_entry_t *e);

/*
 * Stores e under its key (the zone takes the caller's reference; a
 * previous entry of the key is replaced) and evicts down to the bound. An
 * entry larger than the bound is not stored (its reference is dropped).
 */
void sl_cache_insert(sl_cache_zone_t *z, sl_cache_entry_t *e);

/*
 * Ends a fill opened by sl_cache_lookup: stores e as sl_cache_insert does
 * (NULL: nothing), or, with e NULL and pass_ms > 0, leaves a pass marker
 * for pass_ms so the next requests for the key do not queue behind one
 * another for a response that is not stored anyway (Varnish's
 * hit-for-miss). Returns the waiters to wake (*waiters, malloc'd, the
 * caller frees) and their number.
 */
size_t sl_cache_fill_end(sl_cache_zone_t *z, sl_cache_fill_t *f, sl_cache_entry_t *e,
                         uint64_t now_ms, uint64_t pass_ms, sl_cache_waiter_t **waiters);

/* Counts a lookup result the store did not see (BYPASS). */
void sl_cache_zone_count(sl_cache_zone_t *z, enum sl_cache_result r);

typedef struct {
    const char *name;
    uint64_t max_bytes, bytes, entries, evictions, stores;
    uint64_t lookups[SL_CACHE_RESULTS];
} sl_cache_zone_stats_t;

/* Calls fn for every zone (registry lock held: fn must not call back). */
void sl_cache_zones_foreach(void (*fn)(const sl_cache_zone_stats_t *s, void *arg), void *arg);

#endif
