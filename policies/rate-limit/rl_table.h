/*
 * The rate-limit policy's local budget: GCRA (the generic cell rate
 * algorithm, a token bucket kept as one number) over a fixed-size table of
 * buckets shared by the workers of a runtime, without a lock.
 *
 * GCRA: a limit of `requests` per `period` has an emission interval
 * T = period / requests and a capacity of requests * T (a full bucket is a
 * burst of `requests`). A bucket is its theoretical arrival time (TAT): a
 * request at `now` is admitted when max(TAT, now) + T - now <= capacity,
 * and then TAT becomes max(TAT, now) + T. A TAT in the past is a full
 * bucket, which is what makes slots reusable: nothing is lost by forgetting
 * a bucket whose TAT has passed.
 *
 * The table: `slots` (a power of two) of {key, TAT}, two 64-bit words;
 * a key (a 64-bit hash of the Api, the limit and the caller's key) lives in
 * one group of 4 consecutive slots (one cache line). A request finds its
 * key's slot in the group, or claims one: an empty slot, else one whose TAT
 * has passed (a full bucket: reused, nothing lost), else, when all four
 * hold live buckets, the one closest to full (evicted: that key starts
 * again with a full bucket, the only case where the table admits more than
 * a limit). Updates are compare-and-swap on the TAT; racing claimers at
 * worst charge one request to the wrong key of the same slot, which only
 * ever admits less.
 *
 * Times are nanoseconds on CLOCK_MONOTONIC; nothing here reads a clock, so
 * the unit tests drive it with their own.
 */
#ifndef SL_RL_TABLE_H
#define SL_RL_TABLE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t emission_ns; /* T */
    uint64_t capacity_ns; /* requests * T */
} sl_rl_gcra_t;

/* What a decision says, for the RateLimit-* headers and Retry-After. */
typedef struct {
    int admitted;
    uint64_t remaining;      /* requests admitted right now without waiting */
    uint64_t reset_ns;       /* until the bucket is full again */
    uint64_t retry_after_ns; /* rejected: until the next request is admitted */
} sl_rl_verdict_t;

/* T and the capacity for `requests` per `period_ns` (requests >= 1,
 * period_ns >= requests). */
sl_rl_gcra_t sl_rl_gcra_make(uint64_t requests, uint64_t period_ns);

/* One GCRA step on a bucket whose TAT is `tat`. Returns 1 (admitted, the
 * new TAT in *new_tat) or 0 (rejected, the TAT unchanged). */
int sl_rl_gcra_step(const sl_rl_gcra_t *g, uint64_t tat, uint64_t now, uint64_t *new_tat,
                    sl_rl_verdict_t *v);

typedef struct {
    _Atomic uint64_t key; /* 0 = empty */
    _Atomic uint64_t tat;
} sl_rl_slot_t;

typedef struct {
    size_t mask; /* slots - 1 */
    sl_rl_slot_t *slots;
    _Atomic uint64_t evictions; /* live buckets dropped for lack of room */
} sl_rl_table_t;

/* A table of `slots` (rounded up to a power of two, at least 4). NULL when
 * out of memory. */
sl_rl_table_t *sl_rl_table_new(size_t slots);
void sl_rl_table_free(sl_rl_table_t *t);

/* Takes one request from key's bucket. Returns v->admitted. */
int sl_rl_table_take(sl_rl_table_t *t, uint64_t key, const sl_rl_gcra_t *g, uint64_t now,
                     sl_rl_verdict_t *v);
/* Gives back a request taken by sl_rl_table_take (when a later limit of the
 * same policy rejected the request). */
void sl_rl_table_refund(sl_rl_table_t *t, uint64_t key, const sl_rl_gcra_t *g);

/* 64-bit hash of bytes, continued from h (start with a seed). */
uint64_t sl_rl_hash(uint64_t h, const void *p, size_t n);

#endif
