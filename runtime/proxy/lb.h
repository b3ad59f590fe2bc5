/*
 * Load-balancing algorithms as pure functions over endpoint arrays, so the
 * upstream module can run them per worker with no locks and tests can check
 * their distributions exactly. `usable[i]` is 0 for an endpoint that must not
 * be picked (unhealthy, ejected, pool full); weights are >= 1.
 * Every pick returns an index, or -1 when no endpoint is usable.
 */
#ifndef SL_LB_H
#define SL_LB_H

#include <stddef.h>
#include <stdint.h>

/* Small fast PRNG (xorshift/wyrand style), one state per worker. */
typedef struct {
    uint64_t s;
} sl_lb_rng_t;
void sl_lb_rng_seed(sl_lb_rng_t *rng, uint64_t seed);
uint64_t sl_lb_rng_next(sl_lb_rng_t *rng);

/* 64-bit hash of bytes for consistent hashing (stable across processes and
 * builds: every runtime of a fleet must map a key to the same endpoint). */
uint64_t sl_lb_hash(const void *data, size_t len);

/* Smooth weighted round-robin (nginx's algorithm): `current` is per-worker
 * state, n entries, zero-initialised. */
int sl_lb_swrr_pick(int64_t *current, const uint32_t *weights, const uint8_t *usable, size_t n);

/* Weighted random. */
int sl_lb_random_pick(sl_lb_rng_t *rng, const uint32_t *weights, const uint8_t *usable, size_t n);

/* Least request, power of two choices: two weighted-random usable candidates,
 * the one with fewer active requests (scaled by weight) wins. */
int sl_lb_p2c_pick(sl_lb_rng_t *rng, const uint32_t *weights, const uint32_t *active,
                   const uint8_t *usable, size_t n);

/* Consistent hashing ring (ketama-style, weighted virtual nodes), immutable
 * once built; a key maps to the first usable endpoint clockwise, so removing
 * one endpoint only moves that endpoint's keys. */
typedef struct sl_lb_ring sl_lb_ring_t;
sl_lb_ring_t *sl_lb_ring_build(const uint32_t *weights, size_t n);
/* Same, with the points of endpoint i placed by ids[i], its stable identity
 * (e.g. "10.0.0.1:8080"), instead of by its index: then adding or removing an
 * endpoint in the config also moves only that endpoint's keys. ids may be
 * NULL (= sl_lb_ring_build). At most 65,536 endpoints (else NULL). */
sl_lb_ring_t *sl_lb_ring_build_keyed(const uint32_t *weights, const char *const *ids, size_t n);
void sl_lb_ring_free(sl_lb_ring_t *ring);
int sl_lb_ring_pick(const sl_lb_ring_t *ring, uint64_t hash, const uint8_t *usable);

#endif
