/*
 * Metrics registry and the Prometheus text renderer behind admin /metrics.
 *
 * Responsible for: the per-route and per-cluster stats objects (get-or-create
 * by name, refcounted, kept in a hash table under one mutex), the per-worker
 * process counters, and rendering everything in text format 0.0.4.
 *
 * Not responsible for: deciding when to count (the workers call
 * sl_metrics_observe / SL_STAT_ADD), keeping a stats object alive while a
 * worker can still reach it (the generation that holds the reference releases
 * it only after its RCU grace period), or serving HTTP (admin.c).
 *
 * Threading: workers only ever write their own slot with relaxed loads and
 * stores (SL_STAT_ADD), so the request path has no locked instruction. The
 * registry mutex is taken by the main thread when a generation is compiled or
 * freed and when /metrics is rendered, never by a worker per request. A
 * scrape sums the slots with relaxed loads: each counter is monotonic on its
 * own, the sum across counters is not a snapshot, which Prometheus accepts.
 */
#include "mirror.h"
#include "cache/cache_store.h"
#include "metrics.h"
#include "srate.h"
#include "prom.h"

#include "tlog.h"
#include "endpoint.h"
#include "sl_types.h"

#include <event2/buffer.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const uint64_t sl_metrics_latency_bounds_us[SL_METRICS_LATENCY_BUCKETS - 1] = {
    500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000, 2500000, 5000000,
};

sl_metrics_gauges_t sl_metrics_gauges;

/* Indexed by worker; each element is cache-line aligned by its type, so two
 * workers never share a line. */
static sl_worker_stats_t worker_stats[SL_MAX_WORKERS];

/* How many slots a scrape sums. Until sl_metrics_init is called every slot is
 * summed, so counting before init is never lost. */
static unsigned metrics_nworkers = SL_MAX_WORKERS;

/* Hash tables of the registry: chains through the objects' `next`. The bucket
 * arrays grow (x2) when the load passes 1, so a 10,000-route config costs
 * O(routes) per compile, not O(routes^2). */
typedef struct {
    void **buckets;
    size_t nbuckets; /* power of two, or 0 before the first insert */
    size_t count;
} registry_table_t;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static registry_table_t route_table;
static registry_table_t cluster_table;
static registry_table_t policy_table;
static registry_table_t scope_table; /* rate-limit (api, scope) */

#define REGISTRY_INITIAL_BUCKETS 64

int sl_metrics_init(unsigned nworkers)
{
    if (nworkers == 0 || nworkers > SL_MAX_WORKERS)
        return -1;
    metrics_nworkers = nworkers;
    return 0;
}

unsigned sl_metrics_nworkers(void)
{
    return metrics_nworkers;
}

sl_worker_stats_t *sl_metrics_worker(unsigned worker)
{
    if (worker >= SL_MAX_WORKERS)
        return NULL;
    return &worker_stats[worker];
}

/* FNV-1a over the strings, each followed by a 0xff byte (never part of
 * valid UTF-8) so ("ab","c") and ("a","bc") hash apart. */
static uint64_t fnv1a_add(uint64_t h, const char *s)
{
    for (const unsigned char *c = (const unsigned char *)s; *c; c++)
        h = (h ^ *c) * 1099511628211ULL;
    return (h ^ 0xff) * 1099511628211ULL;
}

static uint64_t hash_names(const char *a, const char *b)
{
    return fnv1a_add(fnv1a_add(14695981039346656037ULL, a), b);
}

/* Makes room for one more object. Returns -1 only on the very first
 * allocation failing; a failed growth keeps the old (longer-chained) table. */
static int table_reserve(registry_table_t *t, void *(*next_of)(void *),
                         void (*set_next)(void *, void *), uint64_t (*hash_of)(void *))
{
    if (t->nbuckets != 0 && t->count < t->nbuckets)
        return 0;
    size_t n = t->nbuckets ? t->nbuckets * 2 : REGISTRY_INITIAL_BUCKETS;
    void **nb = calloc(n, sizeof(*nb));
    if (!nb)
        return t->nbuckets ? 0 : -1;
    for (size_t i = 0; i < t->nbuckets; i++) {
        void *o = t->buckets[i];
        while (o) {
            void *next = next_of(o);
            size_t idx = (size_t)(hash_of(o) & (n - 1));
            set_next(o, nb[idx]);
            nb[idx] = o;
            o = next;
        }
    }
    free(t->buckets);
    t->buckets = nb;
    t->nbuckets = n;
    return 0;
}

static void *route_next(void *o)
{
    return ((sl_route_stats_t *)o)->next;
}
static void route_set_next(void *o, void *n)
{
    ((sl_route_stats_t *)o)->next = n;
}
static uint64_t route_hash(void *o)
{
    sl_route_stats_t *s = o;
    return hash_names(s->api, s->operation);
}
static void *cluster_next(void *o)
{
    return ((sl_cluster_stats_t *)o)->next;
}
static void cluster_set_next(void *o, void *n)
{
    ((sl_cluster_stats_t *)o)->next = n;
}
static uint64_t cluster_hash(void *o)
{
    sl_cluster_stats_t *s = o;
    return hash_names(s->cluster, "");
}

static void *policy_next(void *o)
{
    return ((sl_policy_stats_t *)o)->next;
}
static void policy_set_next(void *o, void *n)
{
    ((sl_policy_stats_t *)o)->next = n;
}
static uint64_t policy_hash(void *o)
{
    sl_policy_stats_t *s = o;
    return hash_names(s->api, s->policy);
}

/* Objects end with one cache-line-aligned slot per worker; aligned_alloc
 * needs a size that is a multiple of the alignment. */
static void *alloc_aligned_zeroed(size_t size)
{
    size_t rounded = (size + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded);
    if (p)
        memset(p, 0, rounded);
    return p;
}

/* Returns a new reference (refs + 1), or NULL on a NULL name or out of
 * memory; the caller owns the reference and gives it back with
 * sl_metrics_route_release. */
sl_route_stats_t *sl_metrics_route_acquire(const char *api, const char *operation)
{
    if (!api || !operation)
        return NULL;
    uint64_t h = hash_names(api, operation);
    sl_route_stats_t *s = NULL;

    pthread_mutex_lock(&registry_lock);
    if (route_table.nbuckets) {
        for (s = route_table.buckets[h & (route_table.nbuckets - 1)]; s; s = s->next) {
            if (strcmp(s->api, api) == 0 && strcmp(s->operation, operation) == 0) {
                s->refs++;
                goto done;
            }
        }
    }
    if (table_reserve(&route_table, route_next, route_set_next, route_hash) != 0)
        goto done;
    s = alloc_aligned_zeroed(sizeof(*s) + metrics_nworkers * sizeof(s->slots[0]));
    if (!s)
        goto done;
    s->nslots = metrics_nworkers;
    s->api = strdup(api);
    s->operation = strdup(operation);
    if (!s->api || !s->operation)
        goto fail_names;
    s->refs = 1;
    size_t idx = (size_t)(h & (route_table.nbuckets - 1));
    s->next = route_table.buckets[idx];
    route_table.buckets[idx] = s;
    route_table.count++;
    goto done;

fail_names:
    free(s->api);
    free(s->operation);
    free(s);
    s = NULL;
done:
    pthread_mutex_unlock(&registry_lock);
    return s;
}

/* Drops one reference; the last one unlinks and frees the object, so its
 * counters restart from zero if the route comes back later (Prometheus
 * handles a counter reset). */
void sl_metrics_route_release(sl_route_stats_t *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&registry_lock);
    if (--s->refs > 0) {
        pthread_mutex_unlock(&registry_lock);
        return;
    }
    size_t idx = (size_t)(hash_names(s->api, s->operation) & (route_table.nbuckets - 1));
    for (sl_route_stats_t **pp = (sl_route_stats_t **)&route_table.buckets[idx]; *pp;
         pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            route_table.count--;
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    free(s->api);
    free(s->operation);
    free(s);
}

static sl_policy_stats_t *policy_acquire_in(registry_table_t *table, const char *api,
                                            const char *policy)
{
    if (!api || !policy)
        return NULL;
    uint64_t h = hash_names(api, policy);
    sl_policy_stats_t *s = NULL;
    pthread_mutex_lock(&registry_lock);
    if (table->nbuckets) {
        for (s = table->buckets[h & (table->nbuckets - 1)]; s; s = s->next) {
            if (strcmp(s->api, api) == 0 && strcmp(s->policy, policy) == 0) {
                s->refs++;
                goto done;
            }
        }
    }
    if (table_reserve(table, policy_next, policy_set_next, policy_hash) != 0)
        goto done;
    s = alloc_aligned_zeroed(sizeof(*s) + metrics_nworkers * sizeof(s->slots[0]));
    if (!s)
        goto done;
    s->nslots = metrics_nworkers;
    s->api = strdup(api);
    s->policy = strdup(policy);
    if (!s->api || !s->policy) {
        free(s->api);
        free(s->policy);
        free(s);
        s = NULL;
        goto done;
    }
    s->refs = 1;
    size_t idx = (size_t)(h & (table->nbuckets - 1));
    s->next = table->buckets[idx];
    table->buckets[idx] = s;
    table->count++;
done:
    pthread_mutex_unlock(&registry_lock);
    return s;
}

static void policy_release_in(registry_table_t *table, sl_policy_stats_t *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&registry_lock);
    if (--s->refs > 0) {
        pthread_mutex_unlock(&registry_lock);
        return;
    }
    size_t idx = (size_t)(hash_names(s->api, s->policy) & (table->nbuckets - 1));
    for (sl_policy_stats_t **pp = (sl_policy_stats_t **)&table->buckets[idx]; *pp;
         pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            table->count--;
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    free(s->api);
    free(s->policy);
    free(s);
}

sl_policy_stats_t *sl_metrics_policy_acquire(const char *api, const char *policy)
{
    return policy_acquire_in(&policy_table, api, policy);
}

void sl_metrics_policy_release(sl_policy_stats_t *s)
{
    policy_release_in(&policy_table, s);
}

sl_policy_stats_t *sl_metrics_scope_acquire(const char *api, const char *scope)
{
    return policy_acquire_in(&scope_table, api, scope);
}

void sl_metrics_scope_release(sl_policy_stats_t *s)
{
    policy_release_in(&scope_table, s);
}

/* ---- traffic log ------------------------------------------------------------ */

typedef struct {
    struct evbuffer *out;
    int family;
} tlog_render_t;

static void tlog_series(const sl_tlog_sink_stats_t *st, void *arg)
{
    tlog_render_t *t = arg;
    static const char *const names[] = {
        "sluice_traffic_log_records_total", "sluice_traffic_log_dropped_total",
        "sluice_traffic_log_queue_bytes", "sluice_traffic_log_queue_records",
        "sluice_traffic_log_failed_batches_total"};
    uint64_t v = t->family == 0   ? st->records_written
                 : t->family == 1 ? st->dropped
                 : t->family == 2 ? st->queue_bytes
                 : t->family == 3 ? st->queue_records
                                  : st->batches_failed;
    /* Sink names are DNS labels (validated): nothing to escape. */
    evbuffer_add_printf(t->out, "%s{sink=\"%s\",type=\"%s\"} %" PRIu64 "\n", names[t->family],
                        st->name, st->type, v);
}

/* Per sink: delivered, dropped (for any reason: a full worker ring, a queue
 * at its budget, a failed write, a collector's refusal), what waits, and
 * failed deliveries; and the workers' rings. */
static void render_tlog(struct evbuffer *out)
{
    static const struct {
        const char *name, *type, *help;
    } fam[] = {
        {"sluice_traffic_log_records_total", "counter",
         "Traffic log records delivered by each sink (written to its file, accepted by its "
         "collector)."},
        {"sluice_traffic_log_dropped_total", "counter",
         "Traffic log records a sink did not deliver: a worker's ring was full, its queue was "
         "at its memory budget, a write failed, or the collector refused them."},
        {"sluice_traffic_log_queue_bytes", "gauge",
         "Bytes waiting in a sink's queue, its batch in flight included."},
        {"sluice_traffic_log_queue_records", "gauge", "Records waiting in a sink's queue."},
        {"sluice_traffic_log_failed_batches_total", "counter",
         "Deliveries of a batch that failed (then retried with backoff, or dropped)."},
    };
    for (int f = 0; f < 5; f++) {
        sl_prom_header(out, fam[f].name, fam[f].type, fam[f].help);
        tlog_render_t t = {out, f};
        sl_tlog_foreach_sink(tlog_series, &t);
    }
    sl_prom_header(out, "sluice_traffic_log_ring_dropped_total", "counter",
                   "Traffic log records dropped because a worker's ring was full (also counted in "
                   "every sink's dropped total).");
    evbuffer_add_printf(out, "sluice_traffic_log_ring_dropped_total %" PRIu64 "\n",
                        sl_tlog_ring_dropped());
    sl_prom_header(out, "sluice_traffic_log_ring_bytes", "gauge",
                   "Bytes of records waiting in the workers' rings for the logger thread.");
    evbuffer_add_printf(out, "sluice_traffic_log_ring_bytes %" PRIu64 "\n", sl_tlog_ring_bytes());
}

/* Series for every (api, policy) of the active chains, zeros included:
 * a rejection rate is only meaningful next to its zero. */
static void render_policies(struct evbuffer *out)
{
    if (!policy_table.count)
        return;
    sl_prom_header(out, "sluice_policy_rejections_total", "counter",
                   "Requests a policy answered itself (401, 403, 429, ...), by Api and policy.");
    for (size_t i = 0; i < policy_table.nbuckets; i++) {
        for (const sl_policy_stats_t *s = policy_table.buckets[i]; s; s = s->next) {
            uint64_t n = 0;
            for (unsigned w = 0; w < s->nslots; w++)
                n += atomic_load_explicit(&s->slots[w].rejections, memory_order_relaxed);
            evbuffer_add(out, "sluice_policy_rejections_total{api=\"", 36);
            sl_prom_label_value(out, s->api);
            evbuffer_add(out, "\",policy=\"", 10);
            sl_prom_label_value(out, s->policy);
            evbuffer_add_printf(out, "\"} %" PRIu64 "\n", n);
        }
    }
}

/* Rate limits by Api and scope: a series per reason for every (api, scope)
 * of the active chains, zeros included. */
static void render_rate_limits(struct evbuffer *out)
{
    sl_prom_header(out, "sluice_rate_limit_rejections_total", "counter",
                   "Requests a rate-limit policy refused, by Api, scope (local: this runtime's "
                   "buckets, fleet: shared in Redis) and reason (limited: 429 over the limit; "
                   "unavailable: 503, its Redis unreachable and failOpen false).");
    for (size_t i = 0; i < scope_table.nbuckets; i++) {
        for (const sl_policy_stats_t *s = scope_table.buckets[i]; s; s = s->next) {
            uint64_t n[2] = {0, 0};
            for (unsigned w = 0; w < s->nslots; w++) {
                n[0] += atomic_load_explicit(&s->slots[w].rejections, memory_order_relaxed);
                n[1] += atomic_load_explicit(&s->slots[w].unavailable, memory_order_relaxed);
            }
            static const char *const reasons[2] = {"limited", "unavailable"};
            for (int r = 0; r < 2; r++) {
                evbuffer_add(out, "sluice_rate_limit_rejections_total{api=\"", 40);
                sl_prom_label_value(out, s->api);
                evbuffer_add(out, "\",scope=\"", 9);
                sl_prom_label_value(out, s->policy);
                evbuffer_add_printf(out, "\",reason=\"%s\"} %" PRIu64 "\n", reasons[r], n[r]);
            }
        }
    }
}

sl_cluster_stats_t *sl_metrics_cluster_acquire(const char *cluster)
{
    if (!cluster)
        return NULL;
    uint64_t h = hash_names(cluster, "");
    sl_cluster_stats_t *s = NULL;

    pthread_mutex_lock(&registry_lock);
    if (cluster_table.nbuckets) {
        for (s = cluster_table.buckets[h & (cluster_table.nbuckets - 1)]; s; s = s->next) {
            if (strcmp(s->cluster, cluster) == 0) {
                s->refs++;
                goto done;
            }
        }
    }
    if (table_reserve(&cluster_table, cluster_next, cluster_set_next, cluster_hash) != 0)
        goto done;
    s = alloc_aligned_zeroed(sizeof(*s) + metrics_nworkers * sizeof(s->slots[0]));
    if (!s)
        goto done;
    s->nslots = metrics_nworkers;
    s->cluster = strdup(cluster);
    if (!s->cluster) {
        free(s);
        s = NULL;
        goto done;
    }
    s->refs = 1;
    size_t idx = (size_t)(h & (cluster_table.nbuckets - 1));
    s->next = cluster_table.buckets[idx];
    cluster_table.buckets[idx] = s;
    cluster_table.count++;
done:
    pthread_mutex_unlock(&registry_lock);
    return s;
}

void sl_metrics_cluster_release(sl_cluster_stats_t *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&registry_lock);
    if (--s->refs > 0) {
        pthread_mutex_unlock(&registry_lock);
        return;
    }
    size_t idx = (size_t)(hash_names(s->cluster, "") & (cluster_table.nbuckets - 1));
    for (sl_cluster_stats_t **pp = (sl_cluster_stats_t **)&cluster_table.buckets[idx]; *pp;
         pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            cluster_table.count--;
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    free(s->cluster);
    free(s);
}

/* Status class index: 1..5 for 1xx..5xx; 0 for anything outside 100..599,
 * which a correct peer never sends but a worker may still record. */
static unsigned status_class(int status)
{
    return (status >= 100 && status <= 599) ? (unsigned)(status / 100) : 0;
}

void sl_metrics_observe(sl_route_stats_t *s, unsigned worker, int status, uint64_t latency_us)
{
    if (sl_unlikely(!s || worker >= s->nslots))
        return;
    sl_route_stats_slot_t *slot = &s->slots[worker];
    unsigned b = 0;
    while (b < SL_METRICS_LATENCY_BUCKETS - 1 && latency_us > sl_metrics_latency_bounds_us[b])
        b++;
    SL_STAT_ADD(slot->responses_by_class[status_class(status)], 1);
    SL_STAT_ADD(slot->latency_buckets[b], 1);
    SL_STAT_ADD(slot->latency_sum_us, latency_us);
}

/* ---- rendering --------------------------------------------------------- */

#define LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)

/* Label value escaping of the text format: backslash, double quote and line
 * feed; every other byte goes through as is (the format is UTF-8 and names
 * come from validated config). */
static void add_route_labels(struct evbuffer *out, const sl_route_stats_t *s)
{
    evbuffer_add(out, "api=\"", 5);
    sl_prom_label_value(out, s->api);
    evbuffer_add(out, "\",operation=\"", 13);
    sl_prom_label_value(out, s->operation);
    evbuffer_add(out, "\"", 1);
}

static const char *const class_names[6] = {"other", "1xx", "2xx", "3xx", "4xx", "5xx"};
static const char *const upstream_error_names[SL_UPSTREAM_ERR__COUNT] = {
    [SL_UPSTREAM_ERR_CONNECT] = "connect",
    [SL_UPSTREAM_ERR_TIMEOUT] = "timeout",
    [SL_UPSTREAM_ERR_RESET] = "reset",
    [SL_UPSTREAM_ERR_BAD_RESPONSE] = "bad_response",
    [SL_UPSTREAM_ERR_NO_HEALTHY] = "no_healthy",
    [SL_UPSTREAM_ERR_POOL_FULL] = "pool_full",
    [SL_UPSTREAM_ERR_CONNECT_TIMEOUT] = "connect_timeout",
};

typedef struct {
    uint64_t by_class[6];
    uint64_t buckets[SL_METRICS_LATENCY_BUCKETS];
    uint64_t sum_us;
    uint64_t count;
} route_totals_t;

static void sum_route(const sl_route_stats_t *s, unsigned nworkers, route_totals_t *t)
{
    memset(t, 0, sizeof(*t));
    for (unsigned w = 0; w < nworkers && w < s->nslots; w++) {
        const sl_route_stats_slot_t *slot = &s->slots[w];
        for (unsigned c = 0; c < 6; c++)
            t->by_class[c] += LOAD(slot->responses_by_class[c]);
        for (unsigned b = 0; b < SL_METRICS_LATENCY_BUCKETS; b++)
            t->buckets[b] += LOAD(slot->latency_buckets[b]);
        t->sum_us += LOAD(slot->latency_sum_us);
    }
    for (unsigned b = 0; b < SL_METRICS_LATENCY_BUCKETS; b++)
        t->count += t->buckets[b];
}

/* Route series appear once the route has answered a request: a config with
 * 10,000 mostly idle routes would otherwise put ~200,000 zero lines on every
 * scrape. */
static void render_faults(struct evbuffer *out, unsigned nworkers)
{
    static const char *const kinds[2] = {"delay", "abort"};
    sl_prom_header(out, "sluice_faults_injected_total", "counter",
                   "Faults injected by an Api's or operation's `faults`, by kind.");
    for (size_t i = 0; i < route_table.nbuckets; i++)
        for (const sl_route_stats_t *s = route_table.buckets[i]; s; s = s->next)
            for (unsigned k = 0; k < 2; k++) {
                uint64_t v = 0;
                for (unsigned w = 0; w < nworkers && w < s->nslots; w++)
                    v += LOAD(s->slots[w].faults[k]);
                if (!v)
                    continue;
                evbuffer_add(out, "sluice_faults_injected_total{", 29);
                add_route_labels(out, s);
                evbuffer_add_printf(out, ",kind=\"%s\"} %" PRIu64 "\n", kinds[k], v);
            }
}

static void render_mirror(struct evbuffer *out)
{
    sl_prom_header(out, "sluice_mirror_requests_total", "counter",
                   "Mirrored copies of requests (Api/operation mirror), by result: sent (any "
                   "answer), failed (no answer), dropped (the queue was full), skipped (a "
                   "streamed body, too large, a TLS or endpoint-less shadow).");
    for (int k = 0; k < SL_MIRROR__N; k++)
        evbuffer_add_printf(out, "sluice_mirror_requests_total{result=\"%s\"} %" PRIu64 "\n",
                            sl_mirror_result_names[k], sl_mirror_count(k));
}

static void render_routes(struct evbuffer *out, unsigned nworkers)
{
    sl_prom_header(out, "sluice_requests_total", "counter",
                   "Responses to routed requests, by Api, operation and status class.");
    for (size_t i = 0; i < route_table.nbuckets; i++) {
        for (const sl_route_stats_t *s = route_table.buckets[i]; s; s = s->next) {
            route_totals_t t;
            sum_route(s, nworkers, &t);
            if (t.count == 0)
                continue;
            for (unsigned c = 0; c < 6; c++) {
                if (c == 0 && t.by_class[0] == 0)
                    continue;
                evbuffer_add(out, "sluice_requests_total{", 22);
                add_route_labels(out, s);
                evbuffer_add_printf(out, ",code_class=\"%s\"} %" PRIu64 "\n", class_names[c],
                                    t.by_class[c]);
            }
        }
    }

    sl_prom_header(
        out, "sluice_request_duration_seconds", "histogram",
        "Time from the first byte of a routed request to the last byte of its response.");
    for (size_t i = 0; i < route_table.nbuckets; i++) {
        for (const sl_route_stats_t *s = route_table.buckets[i]; s; s = s->next) {
            route_totals_t t;
            sum_route(s, nworkers, &t);
            if (t.count == 0)
                continue;
            uint64_t cumulative = 0;
            for (unsigned b = 0; b < SL_METRICS_LATENCY_BUCKETS; b++) {
                char le[32];
                cumulative += t.buckets[b];
                if (b < SL_METRICS_LATENCY_BUCKETS - 1)
                    sl_prom_seconds(le, sizeof(le), sl_metrics_latency_bounds_us[b]);
                else
                    strcpy(le, "+Inf");
                evbuffer_add(out, "sluice_request_duration_seconds_bucket{", 39);
                add_route_labels(out, s);
                evbuffer_add_printf(out, ",le=\"%s\"} %" PRIu64 "\n", le, cumulative);
            }
            evbuffer_add(out, "sluice_request_duration_seconds_sum{", 36);
            add_route_labels(out, s);
            evbuffer_add_printf(out, "} %" PRIu64 ".%06" PRIu64 "\n", t.sum_us / 1000000,
                                t.sum_us % 1000000);
            evbuffer_add(out, "sluice_request_duration_seconds_count{", 38);
            add_route_labels(out, s);
            evbuffer_add_printf(out, "} %" PRIu64 "\n", t.count);
        }
    }
}

static void render_clusters(struct evbuffer *out, unsigned nworkers)
{
    static const struct {
        const char *name, *help;
    } families[4] = {
        {"sluice_upstream_requests_total",
         "Requests sent to an upstream cluster, retries included."},
        {"sluice_upstream_retries_total", "Retries sent to an upstream cluster."},
        {"sluice_upstream_errors_total", "Failed upstream attempts, by cluster and kind."},
        {"sluice_upstream_reuse_failures_total",
         "Attempts on a pooled keep-alive connection that the upstream had closed (reset "
         "before any response byte); also counted in errors_total{kind=\"reset\"}."},
    };
    for (unsigned f = 0; f < 4; f++) {
        sl_prom_header(out, families[f].name, "counter", families[f].help);
        for (size_t i = 0; i < cluster_table.nbuckets; i++) {
            for (const sl_cluster_stats_t *s = cluster_table.buckets[i]; s; s = s->next) {
                uint64_t v[SL_UPSTREAM_ERR__COUNT] = {0};
                for (unsigned w = 0; w < nworkers && w < s->nslots; w++) {
                    const sl_cluster_stats_slot_t *slot = &s->slots[w];
                    if (f == 0)
                        v[0] += LOAD(slot->requests);
                    else if (f == 1)
                        v[0] += LOAD(slot->retries);
                    else if (f == 3)
                        v[0] += LOAD(slot->reuse_failures);
                    else
                        for (unsigned k = 0; k < SL_UPSTREAM_ERR__COUNT; k++)
                            v[k] += LOAD(slot->errors[k]);
                }
                unsigned nseries = (f == 2) ? SL_UPSTREAM_ERR__COUNT : 1;
                for (unsigned k = 0; k < nseries; k++) {
                    evbuffer_add_printf(out, "%s{cluster=\"", families[f].name);
                    sl_prom_label_value(out, s->cluster);
                    if (f == 2)
                        evbuffer_add_printf(out, "\",kind=\"%s", upstream_error_names[k]);
                    evbuffer_add_printf(out, "\"} %" PRIu64 "\n", v[k]);
                }
            }
        }
    }

    static const char *const cb_names[SL_CB__COUNT] = {"max_connections", "max_pending_requests",
                                                       "max_requests", "max_retries"};
    sl_prom_header(out, "sluice_circuit_open_total", "counter",
                   "Requests (or retries) a Backend's circuit breaker refused, by the limit: "
                   "answered 503 circuit_open (a retry is not made).");
    for (size_t i = 0; i < cluster_table.nbuckets; i++)
        for (const sl_cluster_stats_t *s = cluster_table.buckets[i]; s; s = s->next)
            for (unsigned k = 0; k < SL_CB__COUNT; k++) {
                uint64_t v = atomic_load_explicit(&s->cb_open[k], memory_order_relaxed);
                if (!v)
                    continue;
                evbuffer_add_printf(out, "sluice_circuit_open_total{cluster=\"");
                sl_prom_label_value(out, s->cluster);
                evbuffer_add_printf(out, "\",limit=\"%s\"} %" PRIu64 "\n", cb_names[k], v);
            }
    sl_prom_header(out, "sluice_circuit_active", "gauge",
                   "What a Backend's circuit breaker counts now: requests in flight, waiting for "
                   "a connection, retries (only for the limits it has).");
    for (size_t i = 0; i < cluster_table.nbuckets; i++)
        for (const sl_cluster_stats_t *s = cluster_table.buckets[i]; s; s = s->next)
            for (unsigned k = SL_CB_PENDING; k < SL_CB__COUNT; k++) {
                int64_t v = atomic_load_explicit(&s->cb_active[k], memory_order_relaxed);
                if (!v)
                    continue;
                evbuffer_add_printf(out, "sluice_circuit_active{cluster=\"");
                sl_prom_label_value(out, s->cluster);
                evbuffer_add_printf(out, "\",limit=\"%s\"} %" PRId64 "\n", cb_names[k], v);
            }

    sl_prom_header(out, "sluice_backend_responses_total", "counter",
                   "Requests a cluster was chosen for, by the status class the client got (a "
                   "gateway error after a failed attempt included).");
    for (size_t i = 0; i < cluster_table.nbuckets; i++) {
        for (const sl_cluster_stats_t *s = cluster_table.buckets[i]; s; s = s->next) {
            uint64_t v[6] = {0}, total = 0;
            for (unsigned w = 0; w < nworkers && w < s->nslots; w++)
                for (unsigned c = 0; c < 6; c++)
                    v[c] += LOAD(s->slots[w].by_class[c]);
            for (unsigned c = 0; c < 6; c++)
                total += v[c];
            if (!total)
                continue; /* idle clusters add no lines */
            for (unsigned c = 0; c < 6; c++) {
                if (c == 0 && v[0] == 0)
                    continue;
                static const char head[] = "sluice_backend_responses_total{cluster=\"";
                evbuffer_add(out, head, sizeof(head) - 1);
                sl_prom_label_value(out, s->cluster);
                evbuffer_add_printf(out, "\",code_class=\"%s\"} %" PRIu64 "\n", class_names[c],
                                    v[c]);
            }
        }
    }
}

static void render_process(struct evbuffer *out, unsigned nworkers)
{
    uint64_t accepted = 0, requests = 0, unrouted[6] = {0};
    int64_t active = 0;
    for (unsigned w = 0; w < nworkers; w++) {
        const sl_worker_stats_t *ws = &worker_stats[w];
        accepted += LOAD(ws->connections_accepted);
        active += LOAD(ws->connections_active);
        requests += LOAD(ws->requests_total);
        for (unsigned c = 0; c < 6; c++)
            unrouted[c] += LOAD(ws->unrouted_by_status[c]);
    }
    /* A connection accepted on one worker is always closed on the same one,
     * but a scrape racing the two stores may see a transient negative sum. */
    if (active < 0)
        active = 0;

    sl_prom_header(out, "sluice_downstream_requests_total", "counter",
                   "Requests received from clients, routed or not.");
    evbuffer_add_printf(out, "sluice_downstream_requests_total %" PRIu64 "\n", requests);
    sl_prom_header(
        out, "sluice_unrouted_responses_total", "counter",
        "Responses the gateway answered before a route was chosen (400, 404, 405, 413, ...), "
        "by status class.");
    for (unsigned c = 1; c < 6; c++)
        evbuffer_add_printf(out, "sluice_unrouted_responses_total{code_class=\"%s\"} %" PRIu64 "\n",
                            class_names[c], unrouted[c]);
    if (unrouted[0])
        evbuffer_add_printf(out,
                            "sluice_unrouted_responses_total{code_class=\"other\"} %" PRIu64 "\n",
                            unrouted[0]);
    sl_prom_header(out, "sluice_connections_active", "gauge", "Open downstream connections.");
    evbuffer_add_printf(out, "sluice_connections_active %" PRId64 "\n", active);
    sl_prom_header(out, "sluice_connections_accepted_total", "counter",
                   "Accepted downstream connections.");
    evbuffer_add_printf(out, "sluice_connections_accepted_total %" PRIu64 "\n", accepted);

    int64_t alive =
        atomic_load_explicit(&sl_metrics_gauges.generations_alive, memory_order_relaxed);
    sl_prom_header(out, "sluice_generation_version", "gauge",
                   "Snapshot version of the active config generation (0 = none yet).");
    evbuffer_add_printf(
        out, "sluice_generation_version %" PRIu64 "\n",
        atomic_load_explicit(&sl_metrics_gauges.generation_version, memory_order_relaxed));
    sl_prom_header(out, "sluice_generation_swaps_total", "counter",
                   "Config generations published.");
    evbuffer_add_printf(
        out, "sluice_generation_swaps_total %" PRIu64 "\n",
        atomic_load_explicit(&sl_metrics_gauges.generation_swaps, memory_order_relaxed));
    sl_prom_header(out, "sluice_generation_parts_built_total", "counter",
                   "Compiled parts (route tables, clusters) built for new config generations.");
    evbuffer_add_printf(
        out,
        "sluice_generation_parts_built_total{part=\"route_table\"} %" PRIu64 "\n"
        "sluice_generation_parts_built_total{part=\"cluster\"} %" PRIu64 "\n",
        atomic_load_explicit(&sl_metrics_gauges.gen_tables_built, memory_order_relaxed),
        atomic_load_explicit(&sl_metrics_gauges.gen_clusters_built, memory_order_relaxed));
    sl_prom_header(out, "sluice_generation_parts_shared_total", "counter",
                   "Compiled parts (route tables, clusters) a new config generation shared with "
                   "the previous one, unchanged.");
    evbuffer_add_printf(
        out,
        "sluice_generation_parts_shared_total{part=\"route_table\"} %" PRIu64 "\n"
        "sluice_generation_parts_shared_total{part=\"cluster\"} %" PRIu64 "\n",
        atomic_load_explicit(&sl_metrics_gauges.gen_tables_shared, memory_order_relaxed),
        atomic_load_explicit(&sl_metrics_gauges.gen_clusters_shared, memory_order_relaxed));
    sl_prom_header(out, "sluice_config_errors_total", "counter",
                   "Configs rejected (invalid file on reload, snapshot that failed to compile).");
    evbuffer_add_printf(
        out, "sluice_config_errors_total %" PRIu64 "\n",
        atomic_load_explicit(&sl_metrics_gauges.config_errors, memory_order_relaxed));
    sl_prom_header(
        out, "sluice_generations_alive", "gauge",
        "Config generations published and not yet freed (the active one plus those still "
        "held by in-flight requests).");
    evbuffer_add_printf(out, "sluice_generations_alive %" PRId64 "\n", alive < 0 ? 0 : alive);
    if (atomic_load_explicit(&sl_metrics_gauges.controller_mode, memory_order_relaxed)) {
        sl_prom_header(out, "sluice_controller_connected", "gauge",
                       "1 while the config stream to the controller is up.");
        evbuffer_add_printf(
            out, "sluice_controller_connected %" PRId64 "\n",
            atomic_load_explicit(&sl_metrics_gauges.controller_connected, memory_order_relaxed));
        sl_prom_header(out, "sluice_controller_synced", "gauge",
                       "1 once every resource type has been received from the controller and "
                       "applied (the runtime serves the controller's config).");
        evbuffer_add_printf(out, "sluice_controller_synced %" PRId64 "\n",
                            LOAD(sl_metrics_gauges.controller_synced));
        sl_prom_header(out, "sluice_controller_connects_total", "counter",
                       "Times the config stream to the controller came up: the first connect and "
                       "every reconnect.");
        evbuffer_add_printf(out, "sluice_controller_connects_total %" PRIu64 "\n",
                            LOAD(sl_metrics_gauges.controller_connects));
        sl_prom_header(out, "sluice_controller_stream_failures_total", "counter",
                       "Config stream attempts that failed to connect or streams that ended "
                       "(controller down, restarted, refused this runtime).");
        evbuffer_add_printf(out, "sluice_controller_stream_failures_total %" PRIu64 "\n",
                            LOAD(sl_metrics_gauges.controller_stream_failures));
        sl_prom_header(out, "sluice_config_from_cache", "gauge",
                       "1 while the runtime serves the --cache-dir snapshot because the "
                       "controller has not answered since start-up.");
        evbuffer_add_printf(out, "sluice_config_from_cache %" PRId64 "\n",
                            LOAD(sl_metrics_gauges.config_from_cache));
        sl_prom_header(out, "sluice_controller_updates_total", "counter",
                       "Pushes from the controller, by result (ack = applied, nack = rejected).");
        evbuffer_add_printf(out, "sluice_controller_updates_total{result=\"ack\"} %" PRIu64 "\n",
                            atomic_load_explicit(&sl_metrics_gauges.controller_updates_acked,
                                                 memory_order_relaxed));
        evbuffer_add_printf(out, "sluice_controller_updates_total{result=\"nack\"} %" PRIu64 "\n",
                            atomic_load_explicit(&sl_metrics_gauges.controller_updates_nacked,
                                                 memory_order_relaxed));
    }
    render_tlog(out);
}

/* ---- active health checks -------------------------------------------------- */

/* Series exist only for endpoints that are health-checked now: an endpoint
 * without a healthCheck has no verdict to report (it counts as healthy). */
typedef struct {
    struct evbuffer *out;
    int family; /* 0: checks_total, 1: endpoint_healthy, 2..4: render_endpoints */
    const char *name;
    uint64_t now_ms;
} health_render_t;

static void add_endpoint_labels(struct evbuffer *out, const sl_endpoint_state_t *ep)
{
    char hp[300];
    sl_endpoint_format(ep, hp, sizeof(hp));
    evbuffer_add(out, "cluster=\"", 9);
    sl_prom_label_value(out, ep->cluster);
    evbuffer_add(out, "\",endpoint=\"", 12);
    sl_prom_label_value(out, hp);
    evbuffer_add(out, "\"", 1);
}

static void render_endpoint(sl_endpoint_state_t *ep, void *arg)
{
    health_render_t *r = arg;
    if (r->family >= 2) {
        /* Every endpoint of the configs alive, checked or not. */
        int64_t v = 0;
        if (r->family == 2) {
            for (unsigned w = 0; w < ep->nslots; w++)
                v += LOAD(ep->upconns[w]);
            if (v < 0) /* a scrape between a worker's two stores */
                v = 0;
        } else if (r->family == 3) {
            v = LOAD(ep->ejected_until_ms) > r->now_ms;
        } else {
            v = (int64_t)LOAD(ep->ejections);
        }
        evbuffer_add_printf(r->out, "%s{", r->name);
        add_endpoint_labels(r->out, ep);
        evbuffer_add_printf(r->out, "} %" PRId64 "\n", v);
        return;
    }
    if (!LOAD(ep->hc_checked))
        return;
    if (r->family == 0) {
        static const char *const results[2] = {"success", "failure"};
        uint64_t v[2] = {LOAD(ep->hc_checks_succeeded), LOAD(ep->hc_checks_failed)};
        for (unsigned i = 0; i < 2; i++) {
            evbuffer_add(r->out, "sluice_health_checks_total{", 27);
            add_endpoint_labels(r->out, ep);
            evbuffer_add_printf(r->out, ",result=\"%s\"} %" PRIu64 "\n", results[i], v[i]);
        }
    } else {
        evbuffer_add(r->out, "sluice_endpoint_healthy{", 24);
        add_endpoint_labels(r->out, ep);
        evbuffer_add_printf(r->out, "} %d\n", LOAD(ep->hc_healthy) ? 1 : 0);
    }
}

static void render_health(struct evbuffer *out)
{
    health_render_t r = {out, 0, NULL, 0};
    sl_prom_header(out, "sluice_health_checks_total", "counter",
                   "Active health checks of an endpoint, by result.");
    sl_endpoint_foreach(render_endpoint, &r);
    r.family = 1;
    sl_prom_header(out, "sluice_endpoint_healthy", "gauge",
                   "1 when the endpoint passes its active health checks, 0 when they marked it "
                   "unhealthy; only health-checked endpoints.");
    sl_endpoint_foreach(render_endpoint, &r);

    static const struct {
        const char *name, *type, *help;
    } fam[] = {
        {"sluice_upstream_connections_active", "gauge",
         "Open connections to an upstream endpoint (HTTP/1.1 and HTTP/2, connecting, busy and "
         "idle in the pool), all workers."},
        {"sluice_endpoint_ejected", "gauge",
         "1 while passive outlier detection keeps the endpoint out of the rotation."},
        {"sluice_endpoint_ejections_total", "counter",
         "Times passive outlier detection ejected the endpoint (consecutive failures)."},
    };
    r.now_ms = sl_endpoint_now_ms();
    for (int f = 0; f < 3; f++) {
        sl_prom_header(out, fam[f].name, fam[f].type, fam[f].help);
        r.family = 2 + f;
        r.name = fam[f].name;
        sl_endpoint_foreach(render_endpoint, &r);
    }
}

/* ---- certificate expiry ---------------------------------------------------- */

static pthread_mutex_t cert_lock = PTHREAD_MUTEX_INITIALIZER;
static char **cert_names;
static int64_t *cert_not_after;
static size_t cert_count;

int sl_metrics_set_certificates(const char *const *names, const int64_t *not_after_unix, size_t n)
{
    char **nn = calloc(n ? n : 1, sizeof(*nn));
    int64_t *na = calloc(n ? n : 1, sizeof(*na));
    bool ok = nn && na;
    for (size_t i = 0; ok && i < n; i++) {
        ok = (nn[i] = strdup(names[i])) != NULL;
        na[i] = not_after_unix[i];
    }
    if (!ok) {
        for (size_t i = 0; nn && i < n; i++)
            free(nn[i]);
        free(nn);
        free(na);
        return -1;
    }
    pthread_mutex_lock(&cert_lock);
    char **old = cert_names;
    int64_t *old_na = cert_not_after;
    size_t old_n = cert_count;
    cert_names = nn;
    cert_not_after = na;
    cert_count = n;
    pthread_mutex_unlock(&cert_lock);
    for (size_t i = 0; i < old_n; i++)
        free(old[i]);
    free(old);
    free(old_na);
    return 0;
}

static void render_certificates(struct evbuffer *out)
{
    pthread_mutex_lock(&cert_lock);
    if (cert_count) {
        int64_t now = (int64_t)time(NULL);
        sl_prom_header(out, "sluice_certificate_expiry_seconds", "gauge",
                       "Seconds until the certificate's notAfter (negative once expired), for the "
                       "certificates of the active configuration.");
        for (size_t i = 0; i < cert_count; i++) {
            evbuffer_add_printf(out, "sluice_certificate_expiry_seconds{certificate=\"");
            sl_prom_label_value(out, cert_names[i]);
            evbuffer_add_printf(out, "\"} %" PRId64 "\n", cert_not_after[i] - now);
        }
    }
    pthread_mutex_unlock(&cert_lock);
}

/* The response cache's zones (policies/cache/cache_store.h), one per Api
 * with a cache policy: a pass over the zones per family, so each family's
 * samples stay together as the text format asks. */
typedef struct {
    struct evbuffer *out;
    int family; /* -1: lookups; else an index of cache_families */
    size_t zones;
} cache_render_t;

static const struct {
    const char *name, *type, *help;
} cache_families[] = {
    {"sluice_cache_bytes", "gauge", "Bytes the Api's cache entries take."},
    {"sluice_cache_max_bytes", "gauge", "The Api's cache bound (maxBytes)."},
    {"sluice_cache_entries", "gauge", "Entries in the Api's cache."},
    {"sluice_cache_stores_total", "counter", "Responses stored in the Api's cache."},
    {"sluice_cache_evictions_total", "counter",
     "Entries evicted to keep the Api's cache under maxBytes."},
};

static void render_cache_zone(const sl_cache_zone_stats_t *s, void *arg)
{
    cache_render_t *c = arg;
    c->zones++;
    if (!c->out)
        return;
    if (c->family < 0) {
        for (int r = 0; r < SL_CACHE_RESULTS; r++) {
            evbuffer_add(c->out, "sluice_cache_lookups_total{api=\"", 32);
            sl_prom_label_value(c->out, s->name);
            evbuffer_add_printf(c->out, "\",result=\"%s\"} %" PRIu64 "\n", sl_cache_result_names[r],
                                s->lookups[r]);
        }
        return;
    }
    const uint64_t values[] = {s->bytes, s->max_bytes, s->entries, s->stores, s->evictions};
    evbuffer_add_printf(c->out, "%s{api=\"", cache_families[c->family].name);
    sl_prom_label_value(c->out, s->name);
    evbuffer_add_printf(c->out, "\"} %" PRIu64 "\n", values[c->family]);
}

static void render_cache(struct evbuffer *out)
{
    cache_render_t c = {NULL, -1, 0};
    sl_cache_zones_foreach(render_cache_zone, &c);
    if (!c.zones)
        return;
    c.out = out;
    sl_prom_header(out, "sluice_cache_lookups_total", "counter",
                   "Response cache lookups by Api and result: hit, miss, expired (a stale entry "
                   "was dropped), coalesced (waited for another request's response), pass (the "
                   "key's last response was not storable), bypass (the request is not cacheable).");
    sl_cache_zones_foreach(render_cache_zone, &c);
    for (size_t f = 0; f < SL_ARRAY_LEN(cache_families); f++) {
        sl_prom_header(out, cache_families[f].name, cache_families[f].type, cache_families[f].help);
        c.family = (int)f;
        sl_cache_zones_foreach(render_cache_zone, &c);
    }
}

void sl_metrics_render(struct evbuffer *out)
{
    unsigned nworkers = metrics_nworkers;
    pthread_mutex_lock(&registry_lock);
    render_routes(out, nworkers);
    render_faults(out, nworkers);
    render_mirror(out);
    render_clusters(out, nworkers);
    render_policies(out);
    render_rate_limits(out);
    pthread_mutex_unlock(&registry_lock);
    render_cache(out);
    render_process(out, nworkers);
    render_health(out);
    render_certificates(out);
    sl_srate_render_metrics(out);
}
