/* GCRA and the lock-free bucket table of the local mode (rl_table.h). */
#include "rl_table.h"

#include <stdlib.h>
#include <string.h>

sl_rl_gcra_t sl_rl_gcra_make(uint64_t requests, uint64_t period_ns)
{
    sl_rl_gcra_t g;
    g.emission_ns = period_ns / requests;
    if (g.emission_ns == 0)
        g.emission_ns = 1;
    /* requests * T, not the period: the burst is exactly `requests` even
     * when the period does not divide evenly (the rate is then faster by
     * less than `requests` nanoseconds per period). */
    g.capacity_ns = g.emission_ns * requests;
    return g;
}

int sl_rl_gcra_step(const sl_rl_gcra_t *g, uint64_t tat, uint64_t now, uint64_t *new_tat,
                    sl_rl_verdict_t *v)
{
    uint64_t base = tat > now ? tat : now;
    uint64_t next = base + g->emission_ns;
    if (next - now > g->capacity_ns) {
        v->admitted = 0;
        v->remaining = 0;
        v->retry_after_ns = next - now - g->capacity_ns;
        v->reset_ns = base - now;
        return 0;
    }
    *new_tat = next;
    v->admitted = 1;
    v->remaining = (g->capacity_ns - (next - now)) / g->emission_ns;
    v->reset_ns = next - now;
    v->retry_after_ns = 0;
    return 1;
}

sl_rl_table_t *sl_rl_table_new(size_t slots)
{
    size_t n = 4;
    while (n < slots && n < ((size_t)1 << 30))
        n <<= 1;
    sl_rl_table_t *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    /* One group of 4 slots per 64-byte cache line. */
    t->slots = aligned_alloc(64, n * sizeof(sl_rl_slot_t));
    if (!t->slots) {
        free(t);
        return NULL;
    }
    memset(t->slots, 0, n * sizeof(sl_rl_slot_t));
    t->mask = n - 1;
    return t;
}

void sl_rl_table_free(sl_rl_table_t *t)
{
    if (!t)
        return;
    free(t->slots);
    free(t);
}

static sl_rl_slot_t *find(sl_rl_table_t *t, uint64_t key)
{
    sl_rl_slot_t *g = &t->slots[key & t->mask & ~(size_t)3];
    for (int i = 0; i < 4; i++)
        if (atomic_load_explicit(&g[i].key, memory_order_acquire) == key)
            return &g[i];
    return NULL;
}

/* key's slot, claimed when it has none (see rl_table.h). */
static sl_rl_slot_t *find_or_claim(sl_rl_table_t *t, uint64_t key, uint64_t now)
{
    for (int attempt = 0; attempt < 4; attempt++) {
        sl_rl_slot_t *s = find(t, key);
        if (s)
            return s;
        sl_rl_slot_t *g = &t->slots[key & t->mask & ~(size_t)3];
        sl_rl_slot_t *victim = NULL;
        uint64_t victim_tat = UINT64_MAX;
        int live = 1;
        for (int i = 0; i < 4; i++) {
            uint64_t k = atomic_load_explicit(&g[i].key, memory_order_acquire);
            uint64_t tat = atomic_load_explicit(&g[i].tat, memory_order_relaxed);
            if (k == 0 || tat <= now) {
                victim = &g[i];
                live = 0;
                break;
            }
            if (tat < victim_tat) {
                victim_tat = tat;
                victim = &g[i];
            }
        }
        uint64_t old = atomic_load_explicit(&victim->key, memory_order_relaxed);
        if (old == key)
            return victim;
        if (!atomic_compare_exchange_strong_explicit(&victim->key, &old, key, memory_order_acq_rel,
                                                     memory_order_relaxed))
            continue; /* someone else claimed it: look again */
        if (live) {
            /* An evicted live bucket: ours starts full. */
            atomic_store_explicit(&victim->tat, 0, memory_order_relaxed);
            atomic_fetch_add_explicit(&t->evictions, 1, memory_order_relaxed);
        }
        return victim;
    }
    /* Four lost races in a row: take the group's first slot outright. */
    sl_rl_slot_t *g = &t->slots[key & t->mask & ~(size_t)3];
    atomic_store_explicit(&g->key, key, memory_order_release);
    return g;
}

int sl_rl_table_take(sl_rl_table_t *t, uint64_t key, const sl_rl_gcra_t *g, uint64_t now,
                     sl_rl_verdict_t *v)
{
    if (key == 0)
        key = 1; /* 0 marks an empty slot */
    sl_rl_slot_t *s = find_or_claim(t, key, now);
    uint64_t tat = atomic_load_explicit(&s->tat, memory_order_relaxed);
    for (;;) {
        uint64_t next;
        if (!sl_rl_gcra_step(g, tat, now, &next, v))
            return 0;
        if (atomic_compare_exchange_weak_explicit(&s->tat, &tat, next, memory_order_relaxed,
                                                  memory_order_relaxed))
            return 1;
    }
}

void sl_rl_table_refund(sl_rl_table_t *t, uint64_t key, const sl_rl_gcra_t *g)
{
    if (key == 0)
        key = 1;
    sl_rl_slot_t *s = find(t, key);
    if (!s)
        return;
    uint64_t tat = atomic_load_explicit(&s->tat, memory_order_relaxed);
    while (tat >= g->emission_ns &&
           !atomic_compare_exchange_weak_explicit(&s->tat, &tat, tat - g->emission_ns,
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

static inline uint64_t mix(uint64_t h)
{
    /* splitmix64's finalizer: every output bit depends on every input bit */
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h;
}

uint64_t sl_rl_hash(uint64_t h, const void *p, size_t n)
{
    /* Eight bytes at a time, each word folded in through a multiply and a
     * rotation, the length and a finalizer at the end: cheap for the short
     * keys of a request (IPs, names), and the low bits the table indexes
     * with depend on every byte. */
    const unsigned char *b = p;
    h ^= 0x9e3779b97f4a7c15ull * (n + 1);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, b, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h = (h << 31) | (h >> 33);
        b += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, b, n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    return mix(h);
}
