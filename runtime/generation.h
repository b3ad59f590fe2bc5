/*
 * A config generation: everything a worker needs to route and proxy a
 * request, compiled from one snapshot, immutable once published.
 *
 * Life cycle (DESIGN.md "Runtime internals"):
 *  - the main thread builds it off the request path (sl_generation_build);
 *  - sl_generation_publish swaps it in with rcu_assign_pointer and hands the
 *    previous one to call_rcu, which drops the "published" reference after a
 *    grace period;
 *  - a worker reads sl_generation_current() inside an RCU read-side section
 *    (workers are QSBR threads, online only inside callbacks) and takes a
 *    reference (sl_generation_ref) for a request that outlives the callback;
 *  - the last reference frees it, through call_rcu so that a worker never
 *    pays for a big free on the request path.
 *
 * What survives a swap is not here but keyed by stable identity elsewhere:
 * endpoint health (endpoint.h), route/cluster counters (metrics.h), upstream
 * connection pools (upstream.h).
 */
#ifndef SL_GENERATION_H
#define SL_GENERATION_H

#include "endpoint.h"
#include "http1.h"
#include "lb.h"
#include "metrics.h"
#include "path.h"
#include "router.h"
#include "sluice/v1/snapshot.pb-c.h"

#include <stdatomic.h>
#include <urcu-qsbr.h>

typedef struct {
    uint32_t request_ms;
    uint32_t connect_ms;
    uint32_t response_ms;
} sl_gen_timeouts_t;

typedef struct {
    uint32_t attempts;
    uint8_t on_connect_failure;
    uint8_t on_reset;
    uint8_t non_idempotent;
    uint32_t status_mask[2]; /* bit (status - 500) for 500..563 */
    uint32_t budget_percent;
    uint32_t min_retry_concurrency;
    uint32_t per_try_timeout_ms;
} sl_gen_retry_t;

typedef struct sl_gen_cluster {
    const Sluice__V1__Cluster *pb;
    uint32_t index;                 /* in generation->clusters */
    size_t num_endpoints;
    sl_endpoint_state_t **endpoints; /* shared, refcounted */
    uint32_t *weights;
    sl_lb_ring_t *ring;             /* CONSISTENT_HASH only */
    sl_cluster_stats_t *stats;
    /* Per-worker load-balancer state, written only by that worker:
     * swrr_current[worker * num_endpoints + i]. */
    int64_t *swrr_current;
    uint32_t max_ejection_percent;
    uint32_t outlier_failures;
    uint32_t outlier_base_ejection_ms;
    uint32_t pool_max_connections;
    uint32_t pool_max_idle;
    uint32_t pool_idle_timeout_ms;
    uint32_t connect_timeout_ms;
    sl_str_t host_rewrite;
} sl_gen_cluster_t;

typedef struct sl_gen_route {
    const Sluice__V1__RouteTable *table;
    const Sluice__V1__Route *pb;
    sl_str_t api;                   /* table name */
    sl_str_t operation;             /* route name */
    uint8_t strip_base_path;
    size_t num_backends;
    sl_gen_cluster_t **backends;
    uint32_t *backend_weights;
    uint32_t backend_weight_total;
    sl_gen_timeouts_t timeouts;
    sl_gen_retry_t retry;
    uint64_t max_request_body_bytes; /* 0 = unlimited */
    sl_route_stats_t *stats;
} sl_gen_route_t;

typedef struct sl_generation {
    struct rcu_head rcu;
    atomic_long refs;
    uint64_t version;
    char *source;                   /* where it came from: file list or controller */
    uint64_t built_unix_ms;
    Sluice__V1__Snapshot *snap;     /* owned */
    sl_router_t *router;
    sl_gen_route_t **routes;        /* routes[table][route] */
    size_t num_clusters;
    sl_gen_cluster_t *clusters;
    sl_http1_limits_t limits;
    uint64_t max_request_body_bytes;
    uint32_t max_connections;
    uint32_t request_header_timeout_ms;
    uint32_t idle_timeout_ms;
    uint8_t add_via;
    sl_path_opts_t path_opts; /* Gateway pathNormalization, for sl_path_normalize */
    unsigned nworkers;
} sl_generation_t;

/* Compiles `snap` (taking ownership of it on success and on failure) into a
 * generation. Returns NULL with a message in err (e.g. a regex PCRE2 rejects). */
sl_generation_t *sl_generation_build(Sluice__V1__Snapshot *snap, const char *source,
                                     unsigned nworkers, char *err, size_t errlen);

/* Frees a generation that was never published. */
void sl_generation_discard(sl_generation_t *gen);

/* Main thread (registered RCU reader): publishes `gen`, retires the previous
 * one. Returns the previous generation pointer (for logging only; it must not
 * be dereferenced after the call). */
sl_generation_t *sl_generation_publish(sl_generation_t *gen);

/* Drops the "published" reference of a generation that was unpublished
 * (rcu_xchg_pointer) after a grace period. Caller online. */
void sl_generation_retire(sl_generation_t *gen);

/* The published generation; only inside an RCU read-side section. */
extern sl_generation_t *sl_generation_published;
static inline sl_generation_t *sl_generation_current(void)
{
    return rcu_dereference(sl_generation_published);
}

static inline void sl_generation_ref(sl_generation_t *gen)
{
    atomic_fetch_add_explicit(&gen->refs, 1, memory_order_relaxed);
}

/* Drops a reference; the last one schedules the free through call_rcu. The
 * caller must be a registered QSBR thread that is offline (workers and the
 * main thread outside their read-side sections). */
void sl_generation_unref(sl_generation_t *gen);

#endif
