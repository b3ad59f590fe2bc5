/*
 * Load-balancing algorithms (lb.h): smooth weighted round-robin, weighted
 * random, least request by power of two choices, and a consistent-hashing
 * ring, plus the PRNG and the key hash they use.
 *
 * Responsible for: picking an index among n endpoints given their weights and
 * a `usable` mask, deterministically for a given state/seed, in bounded time.
 *
 * Not responsible for: knowing why an endpoint is unusable (health, ejection,
 * pool limits: the caller folds them into `usable`), keeping per-worker state
 * (the caller owns the SWRR `current` array and the RNG), or extracting the
 * hash key from a request (upstream.c hashes the header/cookie/IP with
 * sl_lb_hash).
 *
 * Every function here is pure over its arguments: no globals, no locks, safe
 * to call from any worker concurrently with distinct state. A ring is
 * immutable after sl_lb_ring_build and may be shared by all workers.
 *
 * Conventions shared by all picks:
 *   - `usable == NULL` means every endpoint is usable;
 *   - a weight of 0 counts as 1: proto3's 0 means "not set, default 1", and
 *     an endpoint must never become unpickable through its weight alone;
 *   - the result is an index in [0, n), or -1 when nothing is usable.
 */
#include "lb.h"
#include "fmt.h"

#include <stdlib.h>
#include <string.h>

static inline uint64_t eff_weight(const uint32_t *weights, size_t i)
{
    return (weights == NULL || weights[i] == 0) ? 1 : weights[i];
}

static inline int is_usable(const uint8_t *usable, size_t i)
{
    return usable == NULL || usable[i] != 0;
}

/* ---- PRNG: splitmix64 (Steele, Lea, Flood 2014; public domain reference).
 * Any seed including 0 gives a full-period sequence, the state is one word,
 * and a step is a handful of multiplies: cheap enough per request. */

void sl_lb_rng_seed(sl_lb_rng_t *rng, uint64_t seed)
{
    rng->s = seed;
}

static inline uint64_t mix64(uint64_t z)
{
    /* The splitmix64 / MurmurHash3-style finalizer: full avalanche. */
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

uint64_t sl_lb_rng_next(sl_lb_rng_t *rng)
{
    rng->s += UINT64_C(0x9e3779b97f4a7c15);
    return mix64(rng->s);
}

/* Uniform in [0, bound), bound > 0, without modulo bias: draws below
 * 2^64 mod bound are rejected (at most a 50% chance per draw in the worst
 * case, in practice ~bound/2^64, i.e. never). */
static uint64_t rng_below(sl_lb_rng_t *rng, uint64_t bound)
{
    uint64_t threshold = (0 - bound) % bound;
    for (;;) {
        uint64_t r = sl_lb_rng_next(rng);
        if (r >= threshold)
            return r % bound;
    }
}

/* ---- Key hash: FNV-1a 64 (Fowler/Noll/Vo, public domain) over the bytes,
 * then the splitmix64 finalizer. FNV-1a alone mixes its last bytes poorly
 * into the high bits, which is what a ring lookup compares first; the
 * finalizer fixes that. Byte-at-a-time, so the value does not depend on the
 * host's endianness or word size: every runtime of a fleet agrees. */

#define FNV64_OFFSET UINT64_C(0xcbf29ce484222325)
#define FNV64_PRIME UINT64_C(0x100000001b3)

static inline uint64_t fnv1a_update(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= FNV64_PRIME;
    }
    return h;
}

uint64_t sl_lb_hash(const void *data, size_t len)
{
    if (data == NULL)
        len = 0;
    return mix64(fnv1a_update(FNV64_OFFSET, data, len));
}

/* ---- Smooth weighted round-robin, as nginx's ngx_http_upstream_get_peer:
 * every usable peer gains its weight, the one with the largest `current`
 * wins and pays back the total. Over sum(weights) picks each peer is chosen
 * exactly weight times, interleaved (5,1,1 gives a a b a c a a).
 * Unusable peers keep their `current` untouched, like nginx's down peers.
 * The sum of all `current` values stays 0, so they stay within
 * +-n*max(weight): no overflow in int64 for any n that fits in memory. */

int sl_lb_swrr_pick(int64_t *current, const uint32_t *weights, const uint8_t *usable, size_t n)
{
    if (current == NULL || n == 0)
        return -1;
    int64_t total = 0;
    size_t best = n;
    for (size_t i = 0; i < n; i++) {
        if (!is_usable(usable, i))
            continue;
        int64_t w = (int64_t)eff_weight(weights, i);
        current[i] += w;
        total += w;
        /* Strictly greater: ties go to the lowest index, as in nginx. */
        if (best == n || current[i] > current[best])
            best = i;
    }
    if (best == n)
        return -1;
    current[best] -= total;
    return (int)best;
}

/* ---- Weighted random. */

static uint64_t usable_total(const uint32_t *weights, const uint8_t *usable, size_t n,
                             size_t *count)
{
    uint64_t total = 0;
    size_t c = 0;
    for (size_t i = 0; i < n; i++) {
        if (is_usable(usable, i)) {
            total += eff_weight(weights, i);
            c++;
        }
    }
    if (count != NULL)
        *count = c;
    return total;
}

/* The usable endpoint (other than `skip`, n = none) whose cumulative weight
 * range contains `point`, point < sum of those weights. */
static size_t weighted_index(const uint32_t *weights, const uint8_t *usable, size_t n, size_t skip,
                             uint64_t point)
{
    size_t last = n;
    for (size_t i = 0; i < n; i++) {
        if (i == skip || !is_usable(usable, i))
            continue;
        uint64_t w = eff_weight(weights, i);
        if (point < w)
            return i;
        point -= w;
        last = i;
    }
    /* Unreachable when point < total; returning the last usable one keeps
     * the function total even if a caller breaks that. */
    return last;
}

int sl_lb_random_pick(sl_lb_rng_t *rng, const uint32_t *weights, const uint8_t *usable, size_t n)
{
    if (rng == NULL || n == 0)
        return -1;
    uint64_t total = usable_total(weights, usable, n, NULL);
    if (total == 0)
        return -1;
    size_t i = weighted_index(weights, usable, n, n, rng_below(rng, total));
    return i == n ? -1 : (int)i;
}

/* ---- Least request, power of two choices (Mitzenmacher). The two
 * candidates are distinct whenever two endpoints are usable: drawing the
 * same one twice would waste the second choice, which is the whole point.
 * The second is drawn by weight among the others. Load is active/weight,
 * compared by cross-multiplication (exact, no division, no overflow: both
 * factors are < 2^32). On a tie the first candidate wins; it was itself
 * drawn by weight, so ties still spread by weight. */

int sl_lb_p2c_pick(sl_lb_rng_t *rng, const uint32_t *weights, const uint32_t *active,
                   const uint8_t *usable, size_t n)
{
    if (rng == NULL || n == 0)
        return -1;
    size_t count;
    uint64_t total = usable_total(weights, usable, n, &count);
    if (count == 0)
        return -1;
    size_t a = weighted_index(weights, usable, n, n, rng_below(rng, total));
    if (count == 1 || active == NULL)
        return (int)a;
    uint64_t wa = eff_weight(weights, a);
    size_t b = weighted_index(weights, usable, n, a, rng_below(rng, total - wa));
    uint64_t wb = eff_weight(weights, b);
    /* active[a]/wa <= active[b]/wb  <=>  active[a]*wb <= active[b]*wa */
    if ((uint64_t)active[b] * wa < (uint64_t)active[a] * wb)
        return (int)b;
    return (int)a;
}

/* ---- Consistent hashing ring, ketama style.
 *
 * Each endpoint owns points = weight * SL_LB_RING_POINTS_PER_WEIGHT on a
 * 64-bit circle; a key belongs to the first point at or after its hash.
 * 160 points per unit of weight is ketama's figure: with 3 equal endpoints
 * the shares stay within a few percent of 1/3.
 *
 * Bound: when sum(weights) * 160 would exceed SL_LB_RING_MAX_POINTS (65,536),
 * every endpoint gets floor(weight * 65,536 / sum(weights)) points instead,
 * at least 1, so a ring has at most 65,536 + n points (12 bytes each, under
 * 1.6 MB) and a lookup is at most 17 comparisons. The proportions between
 * weights are kept to within one point. More than 65,536 endpoints in one
 * cluster is refused (NULL).
 *
 * Point positions: the point j of an endpoint is sl_lb_hash("<id>-<j>"),
 * where id is the caller's stable identity of the endpoint (address:port)
 * with sl_lb_ring_build_keyed, or its decimal index with sl_lb_ring_build.
 * With identities, adding or removing an endpoint in the config moves only
 * the keys of that endpoint; with indices that holds for `usable` changes
 * but not for changes of the endpoint list itself.
 */

#define SL_LB_RING_POINTS_PER_WEIGHT 160
#define SL_LB_RING_MAX_POINTS 65536

struct sl_lb_ring {
    size_t n_endpoints;
    size_t n_points;
    uint64_t *hashes; /* sorted ascending */
    uint32_t *owners; /* owners[k] is the endpoint of hashes[k] */
};

typedef struct {
    uint64_t hash;
    uint32_t owner;
} ring_point_t;

static int ring_point_cmp(const void *a, const void *b)
{
    const ring_point_t *pa = a, *pb = b;
    if (pa->hash != pb->hash)
        return pa->hash < pb->hash ? -1 : 1;
    /* Equal hashes (2^-64 odds): order by index so every runtime agrees. */
    return pa->owner < pb->owner ? -1 : (pa->owner > pb->owner ? 1 : 0);
}

/*
 * Builds the ring. `ids` may be NULL (positions from indices). Returns NULL
 * on allocation failure or more than SL_LB_RING_MAX_POINTS endpoints; an
 * empty ring (n == 0) is valid and every pick on it returns -1. The caller
 * owns the ring and frees it with sl_lb_ring_free; weights and ids are not
 * kept.
 */
sl_lb_ring_t *sl_lb_ring_build_keyed(const uint32_t *weights, const char *const *ids, size_t n)
{
    if (n > SL_LB_RING_MAX_POINTS)
        return NULL;

    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += eff_weight(weights, i);
    int scaled = sum * SL_LB_RING_POINTS_PER_WEIGHT > SL_LB_RING_MAX_POINTS;

    size_t n_points = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t w = eff_weight(weights, i);
        uint64_t pts = scaled ? w * SL_LB_RING_MAX_POINTS / sum : w * SL_LB_RING_POINTS_PER_WEIGHT;
        n_points += pts == 0 ? 1 : (size_t)pts;
    }

    sl_lb_ring_t *ring = calloc(1, sizeof(*ring));
    ring_point_t *tmp = NULL;
    if (ring == NULL)
        goto fail;
    ring->n_endpoints = n;
    ring->n_points = n_points;
    if (n_points == 0)
        return ring;

    tmp = malloc(n_points * sizeof(*tmp));
    ring->hashes = malloc(n_points * sizeof(*ring->hashes));
    ring->owners = malloc(n_points * sizeof(*ring->owners));
    if (tmp == NULL || ring->hashes == NULL || ring->owners == NULL)
        goto fail;

    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t w = eff_weight(weights, i);
        uint64_t pts = scaled ? w * SL_LB_RING_MAX_POINTS / sum : w * SL_LB_RING_POINTS_PER_WEIGHT;
        if (pts == 0)
            pts = 1;
        uint64_t base;
        if (ids != NULL && ids[i] != NULL) {
            base = fnv1a_update(FNV64_OFFSET, ids[i], strlen(ids[i]));
        } else {
            char digits[24];
            base = fnv1a_update(FNV64_OFFSET, digits, sl_fmt_u64(digits, i));
        }
        for (uint64_t j = 0; j < pts; j++) {
            /* Same value as sl_lb_hash("<id>-<j>"), without building it. */
            char suffix[24];
            suffix[0] = '-';
            size_t slen = 1 + sl_fmt_u64(suffix + 1, j);
            tmp[k].hash = mix64(fnv1a_update(base, suffix, slen));
            tmp[k].owner = (uint32_t)i;
            k++;
        }
    }
    qsort(tmp, n_points, sizeof(*tmp), ring_point_cmp);
    for (size_t p = 0; p < n_points; p++) {
        ring->hashes[p] = tmp[p].hash;
        ring->owners[p] = tmp[p].owner;
    }
    free(tmp);
    return ring;

fail:
    free(tmp);
    sl_lb_ring_free(ring);
    return NULL;
}

sl_lb_ring_t *sl_lb_ring_build(const uint32_t *weights, size_t n)
{
    return sl_lb_ring_build_keyed(weights, NULL, n);
}

void sl_lb_ring_free(sl_lb_ring_t *ring)
{
    if (ring == NULL)
        return;
    free(ring->hashes);
    free(ring->owners);
    free(ring);
}

int sl_lb_ring_pick(const sl_lb_ring_t *ring, uint64_t hash, const uint8_t *usable)
{
    if (ring == NULL || ring->n_points == 0)
        return -1;

    /* Refuse up front when nothing is usable, so the walk below always
     * ends at a usable point and never loops around the ring for nothing. */
    if (usable != NULL) {
        size_t i = 0;
        while (i < ring->n_endpoints && !usable[i])
            i++;
        if (i == ring->n_endpoints)
            return -1;
    }

    /* First point with hashes[p] >= hash; past the end wraps to 0. */
    size_t lo = 0, hi = ring->n_points;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ring->hashes[mid] < hash)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t p = lo == ring->n_points ? 0 : lo;

    /* Clockwise to the next point owned by a usable endpoint: the keys of an
     * unusable endpoint spread over its neighbours instead of all landing
     * on one, and nobody else's keys move. */
    for (size_t step = 0; step < ring->n_points; step++) {
        uint32_t owner = ring->owners[p];
        if (is_usable(usable, owner))
            return (int)owner;
        if (++p == ring->n_points)
            p = 0;
    }
    return -1;
}
