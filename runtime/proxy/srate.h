/*
 * Success-rate routing (docs/routing.md "Success-rate routing"): per
 * (scope, scoring key, backend) a sliding window of the last N outcomes;
 * a request goes to the backend with the best success ratio for its key,
 * ties broken by weight, except that a configured share of requests
 * (exploration) ignores the scores so that a weaker backend keeps getting
 * some traffic and is seen to recover. A separate elimination score
 * (x1.0526 per success, x0.95 per failure, as the Hyperswitch decision
 * engine does) takes a backend out of the best-score choice while it is
 * below a threshold; exploration still reaches it.
 *
 * State and its life:
 *  - a group holds the windows of one scope (an Api, or one operation with
 *    its own routing block); groups live in a registry keyed by scope and
 *    are refcounted by the generations whose routes use them, so a config
 *    swap that keeps the scope keeps every window (DESIGN.md: state
 *    survives a swap). A changed window length or maxKeys starts a fresh
 *    group. Backends are identified in a group by their cluster name.
 *  - scoring keys are bounded (maxKeys): a new key beyond the bound takes
 *    the slot of an old one, chosen as the least recently used of 16
 *    sampled slots (Redis's approximate LRU), and the eviction is counted.
 *
 * Threading: workers pick and record with atomics only, no lock; a
 * request path takes the group mutex only to add a key it has never seen
 * (then, at most once per key until it is evicted). The registry and the
 * backend names are changed by the main thread while it builds a
 * generation; the admin thread reads them under the same mutexes. A slot
 * reused for another key bumps its tag, and an outcome recorded with a
 * stale tag is dropped, so an evicted key's in-flight requests never
 * score the new key.
 *
 * Not here: reading request attributes (request.c hands in the key), how an
 * outcome is classified into success/failure (sl_srate_classify_*, below,
 * are pure), the decision API's JSON (request.c).
 */
#ifndef SL_SRATE_H
#define SL_SRATE_H

#include "lb.h"
#include "sluice/v1/snapshot.pb-c.h"

#include <event2/buffer.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define SL_SRATE_MAX_BACKENDS 64  /* per scope, over its lifetime */
#define SL_SRATE_KEY_NAME_MAX 128 /* key values joined by ',', longer ones cut */
#define SL_SRATE_METRIC_KEYS 64   /* most recently used keys per scope in /metrics */
#define SL_SRATE_PPM 1000000u

typedef struct sl_srate_group sl_srate_group_t;

/* A route's compiled success-rate block; immutable, owned by its route. */
typedef struct sl_srate_route {
    sl_srate_group_t *group; /* one reference */
    const Sluice__V1__SuccessRate *pb;
    uint32_t explore_ppm;
    uint32_t elimination_q24; /* threshold, 1.0 = 1 << 24; 0 = off */
    uint32_t max_outcome_age_ms;
    uint32_t tolerance_ppm;   /* scores within this of the best tie */
    uint32_t recovery_probes; /* successful probes in a row that clear old failures; 0 = off */
    uint8_t fail_connect, fail_reset, fail_timeout, fail_5xx;
    uint64_t fail_status_mask[4]; /* bit (status - 400) for 400..655 */
    size_t fail_header_len;
    size_t num_backends;
    uint8_t *gidx;       /* [num_backends]: the route's backend b is the group's gidx[b] */
    uint8_t in_order;    /* ties go to the first listed (a priority list), not by weight */
    uint64_t fixed_hash; /* no keys configured: the hash of "*", computed once */
} sl_srate_route_t;

/* What a pick leaves for the outcome of its request. slot 0 = nothing to
 * record (the key could not be stored). */
typedef struct {
    uint32_t slot; /* key slot + 1 */
    uint32_t tag;
    uint8_t gbackend;
    uint8_t explored;
    uint8_t probe; /* explored, and the backend was out of the best choice */
    void *win;     /* gbackend's window as the pick saw it; NULL: look it up */
} sl_srate_pick_t;

/* A backend's standing for one key, as the decision saw it. */
typedef struct {
    uint32_t score_ppm;       /* success ratio over the window, per million */
    uint32_t elimination_ppm; /* the elimination score, per million */
    uint32_t outcomes;        /* recorded in the window (up to its length) */
    uint8_t eliminated;
} sl_srate_score_t;

/* Main thread, while building a generation: the state of the scope (made or
 * shared) and the indexes of the n backends the list chooses from. The
 * scope is pb->scope for the route's backendRefs or the block's default,
 * and pb->scope + " rule:" + rule for a rule's output (rule != NULL), so
 * every rule scores its backends apart. in_order: ties (cold start, all
 * healthy) go to the first listed backend, as a priority list says;
 * otherwise they are broken by weight. NULL with err set on failure (out of
 * memory). */
sl_srate_route_t *sl_srate_route_build(const Sluice__V1__SuccessRate *pb, const char *rule,
                                       const char *const *backend_names, size_t n, int in_order,
                                       char *err, size_t errlen);
/* The scope's name (for /scores, the decision API). */
const char *sl_srate_route_scope(const sl_srate_route_t *sr);
void sl_srate_route_free(sl_srate_route_t *sr);

/* The scoring key of a request: its values joined by ',' into buf (a
 * missing attribute is empty; no keys configured: "*"), NUL-terminated and
 * cut at SL_SRATE_KEY_NAME_MAX - 1 bytes. `get` answers the value of key i
 * or returns 0 when the request has none. Returns the key's hash. */
typedef int (*sl_srate_attr_fn)(void *ctx, const Sluice__V1__SuccessRate__Key *key,
                                const char **value, size_t *len);
uint64_t sl_srate_key(const sl_srate_route_t *sr, sl_srate_attr_fn get, void *ctx,
                      char buf[SL_SRATE_KEY_NAME_MAX]);

/*
 * Worker: picks among the route's n backends for the key (hash, name) and
 * returns the index, or -1 when n == 0. weights (NULL: all equal) break
 * ties unless the route is in_order. scores[n], when not NULL, receives what
 * the decision saw. order[n], when not NULL, receives the ranking: the pick
 * first, then the others by (not eliminated, best score, then weight or
 * position), the fallback a retry moves down.
 */
int sl_srate_pick(sl_srate_route_t *sr, const uint32_t *weights, size_t n, uint64_t hash,
                  const char *name, uint64_t now_ms, sl_lb_rng_t *rng, sl_srate_pick_t *out,
                  sl_srate_score_t *scores, uint8_t *order);

/* Records an outcome (1 success, 0 failure) of a pick. Worker or main. */
void sl_srate_record(const sl_srate_route_t *sr, const sl_srate_pick_t *p, int success,
                     uint64_t now_ms);

/* Records an outcome for (key, backend name) without a pick: the decision
 * API's feedback. Returns 0, or -1 when the backend is not one of the
 * route's. */
int sl_srate_feedback(sl_srate_route_t *sr, uint64_t hash, const char *name, const char *backend,
                      int success, uint64_t now_ms);

/* Classifies an upstream response: 1 success, 0 failure, -1 not counted
 * (4xx not listed in failure.statuses, 5xx when 5xx is not a failure).
 * `outcome_header` is the value of failure.header's field, or NULL. */
int sl_srate_classify_status(const sl_srate_route_t *sr, int status, const char *outcome_header,
                             size_t outcome_header_len);

/* Admin thread: /scores (limit keys per scope) and /config_dump's
 * eliminations, and the Prometheus families. */
json_t *sl_srate_scores_json(size_t limit, int eliminated_only);
void sl_srate_render_metrics(struct evbuffer *out);

#endif
