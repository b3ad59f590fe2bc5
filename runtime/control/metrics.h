/*
 * Counters for the admin /metrics page (Prometheus text format).
 *
 * Each worker writes only its own slot (single writer, relaxed atomics, no
 * locked instructions on the request path); the admin thread sums the slots
 * when scraped. Per-route and per-cluster stats objects are keyed by name and
 * refcounted, so they survive config swaps: a route that stays keeps
 * counting (DESIGN.md: state keyed by stable identity).
 */
#ifndef SL_METRICS_H
#define SL_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define SL_MAX_WORKERS 64
/* Upper bounds of the latency histogram buckets, in microseconds; +Inf last. */
#define SL_METRICS_LATENCY_BUCKETS 14
extern const uint64_t sl_metrics_latency_bounds_us[SL_METRICS_LATENCY_BUCKETS - 1];

enum sl_upstream_error {
    SL_UPSTREAM_ERR_CONNECT = 0, /* refused, unreachable (counted; see CONNECT_TIMEOUT) */
    SL_UPSTREAM_ERR_TIMEOUT,     /* response timeout */
    SL_UPSTREAM_ERR_RESET,       /* closed or reset mid-exchange */
    SL_UPSTREAM_ERR_BAD_RESPONSE,
    SL_UPSTREAM_ERR_NO_HEALTHY, /* no usable endpoint */
    SL_UPSTREAM_ERR_POOL_FULL,
    /* The connection (TCP, TLS handshake included) did not complete within
     * connectTimeout. Counted apart; handled as a connect failure (same
     * retry rule, same 502). */
    SL_UPSTREAM_ERR_CONNECT_TIMEOUT,
    SL_UPSTREAM_ERR__COUNT
};

typedef struct {
    _Atomic uint64_t responses_by_class[6]; /* [1..5] = 1xx..5xx */
    _Atomic uint64_t latency_buckets[SL_METRICS_LATENCY_BUCKETS];
    _Atomic uint64_t latency_sum_us;
    _Atomic uint64_t faults[2]; /* injected: [0] delays, [1] aborts (in the slot's padding) */
} __attribute__((aligned(64))) sl_route_stats_slot_t;

typedef struct sl_route_stats {
    char *api;
    char *operation;
    unsigned refs;               /* private, under the registry mutex */
    unsigned nslots;             /* slots allocated */
    struct sl_route_stats *next; /* private */
    /* One slot per worker of sl_metrics_init (not SL_MAX_WORKERS): with
     * 100k routes the difference is 38 MB against 1.2 GB. */
    sl_route_stats_slot_t slots[];
} sl_route_stats_t;

/* Requests one policy of an Api's chains answered itself (401, 403, 429,
 * ...): sluice_policy_rejections_total{api, policy}. Per worker, as the
 * route stats. */
typedef struct {
    _Atomic uint64_t rejections;
    _Atomic uint64_t unavailable; /* scope stats only: 503s of an unreachable Redis */
} __attribute__((aligned(64))) sl_policy_stats_slot_t;

typedef struct sl_policy_stats {
    char *api;
    char *policy;
    unsigned refs; /* private, under the registry mutex */
    unsigned nslots;
    struct sl_policy_stats *next; /* private */
    sl_policy_stats_slot_t slots[];
} sl_policy_stats_t;

typedef struct {
    _Atomic uint64_t requests;
    _Atomic uint64_t retries;
    _Atomic uint64_t reuse_failures; /* a pooled connection failed before the response */
    _Atomic uint64_t errors[SL_UPSTREAM_ERR__COUNT];
    /* Requests that went to the cluster, by the status class the client
     * got (index status / 100; 0 = none sent): the per-backend view of
     * sluice_requests_total. */
    _Atomic uint64_t by_class[6];
} __attribute__((aligned(64))) sl_cluster_stats_slot_t;

enum { SL_CB_CONNECTIONS = 0, SL_CB_PENDING, SL_CB_REQUESTS, SL_CB_RETRIES, SL_CB__COUNT };

typedef struct sl_cluster_stats {
    char *cluster;
    unsigned refs;
    unsigned nslots; /* slots allocated */
    struct sl_cluster_stats *next;
    /* The circuit breaker's gauges (Backend circuitBreaker): the Backend's
     * across workers, so shared atomics, kept by name across config swaps
     * like the counters; indexed by SL_CB_* (connections are counted on
     * the endpoints instead). And the requests each limit refused. */
    _Atomic int64_t cb_active[SL_CB__COUNT];
    _Atomic uint64_t cb_open[SL_CB__COUNT];
    sl_cluster_stats_slot_t slots[]; /* one per worker, as above */
} sl_cluster_stats_t;

/* Process-wide, per-worker counters. */
typedef struct {
    _Atomic uint64_t connections_accepted;
    _Atomic int64_t connections_active;
    _Atomic uint64_t requests_total;
    _Atomic uint64_t unrouted_by_status[6]; /* 404/405/400/... answered before routing */
} __attribute__((aligned(64))) sl_worker_stats_t;

/* Sets the number of worker slots of every stats object; call once before
 * the first acquire (objects made before keep the default of SL_MAX_WORKERS). */
int sl_metrics_init(unsigned nworkers);

/* Registry, any thread (mutex): get-or-create by name, refcounted. */
sl_route_stats_t *sl_metrics_route_acquire(const char *api, const char *operation);
void sl_metrics_route_release(sl_route_stats_t *s);
sl_cluster_stats_t *sl_metrics_cluster_acquire(const char *cluster);
/* The counters of (api, policy), shared by every generation that has them
 * (refcounted like route stats). */
sl_policy_stats_t *sl_metrics_policy_acquire(const char *api, const char *policy);
void sl_metrics_policy_release(sl_policy_stats_t *s);
/* The rate-limit counters of (api, scope "local"/"fleet"), the same type in
 * a table of their own: sluice_rate_limit_rejections_total{api, scope,
 * reason}; slot.rejections counts 429s, slot.unavailable 503s. */
sl_policy_stats_t *sl_metrics_scope_acquire(const char *api, const char *scope);
void sl_metrics_scope_release(sl_policy_stats_t *s);
void sl_metrics_cluster_release(sl_cluster_stats_t *s);

sl_worker_stats_t *sl_metrics_worker(unsigned worker);
/* The worker slots of stats objects made now (sl_metrics_init's count, or
 * SL_MAX_WORKERS before it). */
unsigned sl_metrics_nworkers(void);

/* Single-writer increment: a relaxed load and store, not a locked add. */
#define SL_STAT_ADD(field, n)                                                                      \
    atomic_store_explicit(&(field), atomic_load_explicit(&(field), memory_order_relaxed) + (n),    \
                          memory_order_relaxed)

/* The certificates of the active generation, rendered as
 * sluice_certificate_expiry_seconds{certificate} (seconds until notAfter,
 * negative once expired). Replaces the previous set; copies the names.
 * Main thread, at publish (runtime/net/tls.h: sl_tls_publish_expiry).
 * 0, or -1 on allocation failure (the previous set stays). */
int sl_metrics_set_certificates(const char *const *names, const int64_t *not_after_unix, size_t n);

/* Records one response of a route (worker's own slot). */
void sl_metrics_observe(sl_route_stats_t *s, unsigned worker, int status, uint64_t latency_us);

/* Gauges the runtime sets and /metrics prints. */
typedef struct {
    _Atomic uint64_t generation_version;
    _Atomic uint64_t generation_swaps;
    /* Compiled parts of the generations built: made anew, or shared with
     * the previous generation (generation.c, "Sharing"). */
    _Atomic uint64_t gen_tables_built, gen_tables_shared;
    _Atomic uint64_t gen_clusters_built, gen_clusters_shared;
    _Atomic uint64_t config_errors;
    _Atomic int64_t generations_alive;    /* published but not yet freed */
    _Atomic int64_t controller_mode;      /* 1 when configured by a controller */
    _Atomic int64_t controller_connected; /* stream to the controller is up */
    _Atomic uint64_t controller_updates_acked;
    _Atomic uint64_t controller_updates_nacked;
    _Atomic int64_t controller_synced;           /* every resource type applied once */
    _Atomic uint64_t controller_connects;        /* stream came up (first time and reconnects) */
    _Atomic uint64_t controller_stream_failures; /* stream ended, or a connect failed */
    _Atomic int64_t config_from_cache;           /* serving the --cache-dir snapshot */
} sl_metrics_gauges_t;
extern sl_metrics_gauges_t sl_metrics_gauges;

struct evbuffer;
/* Appends every metric in Prometheus text exposition format 0.0.4. */
void sl_metrics_render(struct evbuffer *out);

#endif
