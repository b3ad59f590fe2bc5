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
 *    (workers are QSBR threads, online only inside callbacks) and holds it
 *    for a request that outlives the callback (sl_generation_acquire, below);
 *  - the last reference frees it, through call_rcu so that a worker never
 *    pays for a big free on the request path.
 *
 * Worker holds (h2o/Envoy thread-local slots): a request's hold writes no
 * memory shared between workers. `refs` counts holders, not requests: the
 * "published" reference, ONE reference per worker that has requests on the
 * generation (or had, while it is still the current one), and any
 * sl_generation_ref of other threads. Each worker counts its own requests in
 * its slot of `worker_slots` (one cache line per worker):
 *  - written only by the owning worker; single-writer relaxed atomics, so an
 *    increment is a plain load and store (no lock prefix) and another thread
 *    may read a slot without a data race (tests, dumps), never write it;
 *  - the worker's first request takes the worker's reference (atomic, once)
 *    and lists the generation in w->gens_held; later requests on that worker
 *    bump the slot's count only;
 *  - `retired` is stored once by the main thread when the generation is
 *    unpublished (release) and loaded by workers (acquire); a worker drops its
 *    reference when its count is 0 and the generation is retired: at the end
 *    of a request (sl_generation_release scans w->gens_held, usually 1-2
 *    entries) or, when idle, at its once-a-second tick (sl_generation_tick);
 *  - bounded: a worker lists at most SL_WORKER_GENS_HELD generations; when the
 *    list is full (requests spanning many reloads), a request on an unlisted
 *    generation takes its own shared reference, as every request did before.
 *    The slot tells release which case it is: listed (held) or not.
 * So a generation is freed after it is unpublished, a grace period has
 * passed (the "published" reference) and every worker has released its last
 * request on it (the worker references).
 *
 * What survives a swap is not here but keyed by stable identity elsewhere:
 * endpoint health (endpoint.h), route/cluster counters (metrics.h), upstream
 * connection pools (upstream.h), success-rate windows (srate.h).
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
#include "tlog.h"

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

/* A cluster is shared by every generation whose snapshot holds the same
 * Cluster message (and the same gateway settings, certificates and worker
 * count: see "Sharing" in generation.c); `refs` counts those generations and
 * the route tables that point at it. */
typedef struct sl_gen_cluster {
    atomic_long refs;
    const Sluice__V1__Cluster *pb;
    uint32_t index; /* in the clusters of the generation that built it */
    size_t num_endpoints;
    sl_endpoint_state_t **endpoints; /* shared, refcounted */
    uint32_t *weights;
    sl_lb_ring_t *ring; /* CONSISTENT_HASH only */
    sl_cluster_stats_t *stats;
    /* Per-worker load-balancer state, written only by that worker:
     * swrr_current[worker * num_endpoints + i]. */
    int64_t *swrr_current;
    uint32_t max_ejection_percent;
    uint32_t outlier_failures;
    uint32_t outlier_base_ejection_ms;
    uint32_t pool_max_connections;
    /* circuitBreaker limits (0 = none), indexed by SL_CB_*; cb_any: one is set */
    uint32_t cb_max[SL_CB__COUNT];
    uint8_t cb_any;
    uint32_t pool_max_idle;
    uint32_t pool_idle_timeout_ms;
    uint32_t connect_timeout_ms;
    sl_str_t host_rewrite;
    /* TLS to the endpoints (Backend `tls`), NULL for plaintext; owned. The
     * name verified and sent as SNI: tls_name, else the endpoint's address. */
    struct ssl_ctx_st *tls;
    const char *tls_name;
} sl_gen_cluster_t;

typedef struct sl_gen_route {
    const Sluice__V1__RouteTable *table;
    const Sluice__V1__Route *pb;
    sl_str_t api;       /* table name */
    sl_str_t operation; /* route name */
    uint8_t strip_base_path;
    size_t num_backends;
    sl_gen_cluster_t **backends;
    uint32_t *backend_weights;
    uint32_t backend_weight_total;
    /* Success-rate routing among the backends (srate.h), NULL = weighted. */
    struct sl_srate_route *srate;
    sl_gen_timeouts_t timeouts;
    sl_gen_retry_t retry;
    uint64_t max_request_body_bytes; /* 0 = unlimited */
    sl_route_stats_t *stats;
    /* The policy chain (policies/chain.h), NULL for none; or, when a policy
     * cannot be compiled, policy_error says why and the route answers 503
     * policy_unavailable (fail closed: never served without its chain). */
    struct sl_policy_chain *chain;
    char *policy_error;
    struct sl_policy_stats **policy_stats; /* [chain length], in chain order */
    /* [chain length]: for entries with a metric scope (rate-limit), the
     * counters of (api, scope); NULL elsewhere (and the array NULL when
     * the chain has none). */
    struct sl_policy_stats **scope_stats;
    const sl_tlog_policy_t *tlog; /* what its records hold: the Api's, or gen->tlog */
    /* The `routing` rules (route_rules.h), NULL for none: then the backend
     * is chosen from `backends` by weight, as before. */
    struct sl_route_rules *rules;
    /* Fault injection (docs/configuration.md), NULL for none: the snapshot's. */
    const Sluice__V1__Faults *faults;
    /* Traffic mirroring (mirror.h), NULL for none: the shadow cluster. */
    struct sl_gen_cluster *mirror;
    uint32_t mirror_ppm;
} sl_gen_route_t;

/* The compiled form of one RouteTable (an Api): its routes with their
 * policy chains, rules, success-rate state and counters. Shared, like
 * clusters, by every generation whose snapshot holds the same RouteTable
 * message with the same clusters, consumers and gateway settings; built
 * again only when one of those changed. */
struct sl_gen_consumers;
typedef struct sl_gen_table {
    atomic_long refs; /* generations holding it */
    const Sluice__V1__RouteTable *pb;
    size_t num_routes;
    sl_gen_route_t *routes;
    sl_tlog_policy_t tlog; /* the Gateway's record settings with the Api's override */
    /* The clusters its routes point at (backends, rules, mirror), one
     * reference each: it is shared only while every one of them is. */
    size_t num_used;
    sl_gen_cluster_t **used;
    struct sl_gen_consumers *consumers; /* what its policy chains point at; referenced */
    uint64_t build_id; /* sl_metrics_gauges.gen_tables_built counting it */
} sl_gen_table_t;


/* One worker's requests on a generation (see "Worker holds" above). Its own
 * cache line so that workers never write a line another worker reads. */
typedef struct sl_gen_worker_slot {
    atomic_ulong requests; /* this worker's requests using the generation */
    atomic_uchar held;     /* this worker owns one of refs, listed in w->gens_held */
} __attribute__((aligned(64))) sl_gen_worker_slot_t;

typedef struct sl_generation {
    struct rcu_head rcu;
    atomic_long refs;                   /* holders, not requests (see "Worker holds") */
    atomic_int retired;                 /* unpublished: main thread stores 1, once */
    sl_gen_worker_slot_t *worker_slots; /* [nworkers], one per worker */
    uint64_t version;
    char *source; /* where it came from: file list or controller */
    uint64_t built_unix_ms;
    Sluice__V1__Snapshot *snap; /* owned */
    sl_router_t *router;
    sl_gen_route_t **routes; /* routes[table][route]: tables[table]->routes */
    sl_gen_table_t **tables; /* [snap->n_route_tables], referenced */
    size_t num_clusters;
    sl_gen_cluster_t **clusters; /* [num_clusters], snapshot order, referenced */
    sl_http1_limits_t limits;
    uint64_t max_request_body_bytes;
    uint32_t max_connections;
    uint32_t request_header_timeout_ms;
    uint32_t idle_timeout_ms;
    uint8_t add_via;
    sl_path_opts_t path_opts; /* Gateway pathNormalization, for sl_path_normalize */
    unsigned nworkers;
    /* The TLS servers of the https listeners, [snap->n_listeners] (NULL for
     * the others): built with the generation, so a certificate that cannot
     * be loaded refuses the whole config (fail closed), and new handshakes
     * take the new certificates as soon as it is published while
     * established connections keep theirs (net/tls.h, "Life cycle"). */
    struct sl_tls_server **tls;
    /* The HTTP/2 codec settings of the listeners with an http2 block,
     * [snap->n_listeners] (zeroes, the codec's defaults, for the others), or
     * NULL when no listener has one. Like tls: new connections take the
     * current generation's, established ones keep what they started with. */
    struct sl_h2_settings *h2;
    struct sl_consumers *consumers; /* the snapshot's Consumers, indexed for policies */
    struct sl_gen_consumers *consumers_box; /* its shared holder, referenced */
    /* The traffic log's record settings: the Gateway's (each table holds
     * them with its Api's override, sl_gen_table_t.tlog). */
    sl_tlog_policy_t tlog;
    /* Some record of this generation holds the request's (bit 0) or the
     * response's (bit 1) headers: only then are they captured. */
    uint8_t tlog_headers_wanted;
    /* Same for the bodies (request bit 0, response bit 1): only then is a
     * request's body capture set up (request.c, tlog_body.h). */
    uint8_t tlog_bodies_wanted;
    /* The Gateway's spec.tracing (docs/configuration.md "Tracing"). */
    struct {
        uint8_t enabled;       /* the gateway takes part: its own spans, traceparent rewritten */
        uint8_t generate;      /* start a trace for a request without one */
        uint8_t server_timing; /* Server-Timing on responses */
        uint32_t sample_ppm;   /* traces started here that are sampled */
    } tracing;
} sl_generation_t;

/* Copies into *out the HTTP/2 settings of listener `key` ("address:port")
 * and returns 1, or zeroes *out (the codec's defaults) and returns 0 when the
 * listener has no http2 block or gen is NULL. Inside an RCU read-side
 * section; *out is the caller's and outlives it. */
struct sl_h2_settings;
int sl_generation_h2_settings(const sl_generation_t *gen, const char *key,
                              struct sl_h2_settings *out);

/* The TLS server of the https listener `key` ("address:port"), or NULL.
 * Inside an RCU read-side section, like the generation itself. */
struct sl_tls_server *sl_generation_tls(const sl_generation_t *gen, const char *key);

/* Compiles `snap` (taking ownership of it on success and on failure) into a
 * generation. Returns NULL with a message in err (e.g. a regex PCRE2 rejects).
 * Main thread: shares what it can with the published generation (see
 * sl_generation_build_from). */
sl_generation_t *sl_generation_build(Sluice__V1__Snapshot *snap, const char *source,
                                     unsigned nworkers, char *err, size_t errlen);

/* The same, sharing unchanged compiled parts with `prev` (NULL: none), which
 * must stay alive during the call: clusters and route tables whose messages
 * are the very ones of prev's snapshot (pbshare.h) are referenced, not built.
 * Snapshots decoded on their own (files, tests) share nothing. */
sl_generation_t *sl_generation_build_from(Sluice__V1__Snapshot *snap, const char *source,
                                          unsigned nworkers, const sl_generation_t *prev,
                                          char *err, size_t errlen);

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

/* A shared reference, for threads that are not workers (admin, tests): an
 * atomic on the generation's one counter. Workers use acquire/release. */
static inline void sl_generation_ref(sl_generation_t *gen)
{
    atomic_fetch_add_explicit(&gen->refs, 1, memory_order_relaxed);
}

/* Drops a reference; the last one schedules the free through call_rcu. The
 * caller must be a registered QSBR thread, online or offline. */
void sl_generation_unref(sl_generation_t *gen);

struct sl_worker;

/* Worker thread: the current generation for a new request (NULL when none
 * is published), held until sl_generation_release(w, gen) on the same
 * worker. The caller may be offline (it then goes online around the read
 * itself, as workers do by default) or online; either way the pointer stays
 * valid across quiescent states until the release. Writes only w's own slot,
 * except on w's first request on a generation (one atomic for the worker). */
sl_generation_t *sl_generation_acquire(struct sl_worker *w);

/* Worker thread: ends a request's hold taken by sl_generation_acquire(w).
 * Then drops the worker's reference on every listed generation that is
 * retired and has no request of w left (gen included). Online or offline. */
void sl_generation_release(struct sl_worker *w, sl_generation_t *gen);

/* Worker thread, from its periodic sweep: an idle worker drops its
 * reference on retired generations it no longer uses, so that it never
 * keeps an old generation alive. */
void sl_generation_tick(struct sl_worker *w);

/* Worker thread, when it exits (after its requests ended): drops every
 * reference the worker holds, the current generation's included. */
void sl_generation_release_all(struct sl_worker *w);

#endif
