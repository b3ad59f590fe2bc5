/*
 * Building, publishing and freeing config generations (see generation.h for
 * the life cycle). Runs on the main thread, except the workers' holds
 * (sl_generation_acquire/release/tick, on each worker's own thread, touching
 * that worker's slot and list) and the final free, which runs on liburcu's
 * call_rcu thread.
 */
#include "generation.h"
#include "srate.h"

#include "chain.h"
#include "consumers.h"

#include "compiler.h"
#include "h2.h"
#include "listener_http2.h"
#include "log.h"
#include "mirror.h"
#include "pbshare.h"
#include "route_rules.h"
#include "tls.h"
#include "tls_client.h"
#include "worker.h"

#include <inttypes.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

sl_generation_t *sl_generation_published;

static void merge_timeouts(sl_gen_timeouts_t *t, const Sluice__V1__Timeouts *pb)
{
    if (!pb)
        return;
    if (pb->request_ms)
        t->request_ms = pb->request_ms;
    if (pb->upstream_connect_ms)
        t->connect_ms = pb->upstream_connect_ms;
    if (pb->upstream_response_ms)
        t->response_ms = pb->upstream_response_ms;
}

static void compile_retry(sl_gen_retry_t *r, const Sluice__V1__RetryPolicy *pb)
{
    memset(r, 0, sizeof(*r));
    r->attempts = pb->attempts;
    r->on_connect_failure = pb->on_connect_failure;
    r->on_reset = pb->on_reset;
    r->non_idempotent = pb->non_idempotent;
    for (size_t i = 0; i < pb->n_on_status; i++) {
        uint32_t s = pb->on_status[i];
        if (s >= 500 && s < 564)
            r->status_mask[(s - 500) / 32] |= 1u << ((s - 500) % 32);
    }
    /* The compiler always fills these; 0 is the user's choice (no budget
     * beyond min_retry_concurrency). */
    r->budget_percent = pb->budget_percent;
    r->min_retry_concurrency = pb->min_retry_concurrency;
    r->per_try_timeout_ms = pb->per_try_timeout_ms;
}

/*
 * Sharing (issue 14, "the runtime rebuilds only what changed"). A config
 * stream's generation snapshot points at the decoded resources the stream
 * holds (pbshare.h), so a resource the change did not touch is the same
 * message in the new snapshot as in the published one. Then:
 *  - a cluster whose Cluster message is the published generation's, with the
 *    same gateway settings, worker count and (for a Backend with tls) the
 *    same certificates, is that generation's compiled cluster, referenced;
 *  - a route table whose RouteTable message is the published one's, with the
 *    same settings, the same consumers object and every cluster its routes
 *    point at shared as above, is that generation's compiled table;
 *  - the consumers index is shared when the Consumer messages are the same.
 * Everything else is built. A shared part is freed with the last generation
 * (or table) that references it, after the grace periods of generation.h.
 * What is kept by name across every generation (endpoint health, counters,
 * pools, success-rate windows) is unchanged by this.
 */
typedef struct sl_gen_consumers {
    atomic_long refs;
    struct sl_consumers *c;
} sl_gen_consumers_t;

static void consumers_unref(sl_gen_consumers_t *b)
{
    if (b && atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1) {
        sl_consumers_free(b->c);
        free(b);
    }
}

static void cluster_ref(sl_gen_cluster_t *c)
{
    atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
}

static void cluster_unref(sl_gen_cluster_t *c)
{
    if (!c || atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1)
        return;
    SSL_CTX_free(c->tls);
    for (size_t e = 0; c->endpoints && e < c->num_endpoints; e++)
        if (c->endpoints[e])
            sl_endpoint_release(c->endpoints[e]);
    free(c->endpoints);
    free(c->weights);
    free(c->swrr_current);
    if (c->ring)
        sl_lb_ring_free(c->ring);
    if (c->stats)
        sl_metrics_cluster_release(c->stats);
    free(c);
}

static void table_unref(sl_gen_table_t *tb)
{
    if (!tb || atomic_fetch_sub_explicit(&tb->refs, 1, memory_order_acq_rel) != 1)
        return;
    sl_gen_route_t *routes = tb->routes;
    for (size_t r = 0; routes && r < tb->num_routes; r++) {
        free(routes[r].backends);
        free(routes[r].backend_weights);
        sl_srate_route_free(routes[r].srate);
        for (size_t k = 0; routes[r].policy_stats && k < sl_policy_chain_len(routes[r].chain); k++)
            sl_metrics_policy_release(routes[r].policy_stats[k]);
        for (size_t k = 0; routes[r].scope_stats && k < sl_policy_chain_len(routes[r].chain); k++)
            sl_metrics_scope_release(routes[r].scope_stats[k]);
        free(routes[r].policy_stats);
        free(routes[r].scope_stats);
        sl_policy_chain_free(routes[r].chain);
        sl_route_rules_free(routes[r].rules);
        free(routes[r].policy_error);
        if (routes[r].stats)
            sl_metrics_route_release(routes[r].stats);
    }
    free(routes);
    for (size_t i = 0; i < tb->num_used; i++)
        cluster_unref(tb->used[i]);
    free(tb->used);
    consumers_unref(tb->consumers);
    free(tb);
}

static sl_gen_cluster_t *find_cluster(sl_generation_t *gen, const char *name)
{
    for (size_t i = 0; i < gen->num_clusters; i++)
        if (gen->clusters[i] && strcmp(gen->clusters[i]->pb->name, name) == 0)
            return gen->clusters[i];
    return NULL;
}

static void free_generation(sl_generation_t *gen)
{
    if (gen->tls) {
        for (size_t i = 0; i < gen->snap->n_listeners; i++)
            sl_tls_server_free(gen->tls[i]);
        free(gen->tls);
    }
    free(gen->h2);
    if (gen->tables)
        for (size_t t = 0; t < gen->snap->n_route_tables; t++)
            table_unref(gen->tables[t]);
    free(gen->tables);
    free(gen->routes);
    consumers_unref(gen->consumers_box);
    for (size_t i = 0; gen->clusters && i < gen->num_clusters; i++)
        cluster_unref(gen->clusters[i]);
    free(gen->clusters);
    if (gen->router)
        sl_router_free(gen->router);
    if (gen->snap)
        sl_pbshare_snapshot_free(gen->snap);
    free(gen->source);
    free(gen->worker_slots);
    free(gen);
}

/* Same pointers, in the same order (an unchanged set of resources). */
static int same_msgs(void *const *a, size_t na, void *const *b, size_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof(*a)) == 0);
}

/* The part of prev whose message is pb: at index `hint` or just after it
 * (the usual case: the sets are sorted by name and a change adds or removes
 * a few), else anywhere; but after `*misses` reaches 64 scans, not at all:
 * a snapshot with nothing in common (state of the world) would cost a scan
 * per part. */
static size_t find_same(void *const *msgs, size_t n, const void *pb, size_t hint, size_t *misses)
{
    for (size_t i = hint; i < n && i < hint + 4; i++)
        if (msgs[i] == pb)
            return i;
    for (size_t i = hint > 4 ? hint - 4 : 0; i < hint && i < n; i++)
        if (msgs[i] == pb)
            return i;
    if (++*misses > 64)
        return SIZE_MAX;
    for (size_t i = 0; i < n; i++)
        if (msgs[i] == pb)
            return i;
    return SIZE_MAX;
}

/* share: prev's clusters may be shared (settings and workers the same);
 * certs_same: so may those with tls. */
static int build_clusters(sl_generation_t *gen, const sl_generation_t *prev, int share,
                          int certs_same, uint32_t gw_connect_ms, char *err, size_t errlen)
{
    const Sluice__V1__Snapshot *snap = gen->snap;
    gen->num_clusters = snap->n_clusters;
    gen->clusters = calloc(snap->n_clusters ? snap->n_clusters : 1, sizeof(*gen->clusters));
    if (!gen->clusters)
        goto nomem;
    size_t misses = 0, next = 0; /* where prev's next cluster probably is */
    for (size_t i = 0; i < snap->n_clusters; i++) {
        const Sluice__V1__Cluster *pb = snap->clusters[i];
        if (share && (!pb->tls || certs_same)) {
            size_t j = find_same((void *const *)prev->snap->clusters, prev->snap->n_clusters, pb,
                                 next, &misses);
            if (j != SIZE_MAX) {
                next = j + 1;
                gen->clusters[i] = prev->clusters[j];
                cluster_ref(gen->clusters[i]);
                atomic_fetch_add_explicit(&sl_metrics_gauges.gen_clusters_shared, 1,
                                          memory_order_relaxed);
                continue;
            }
        }
        sl_gen_cluster_t *c = calloc(1, sizeof(*c));
        if (!c)
            goto nomem;
        atomic_init(&c->refs, 1);
        gen->clusters[i] = c;
        atomic_fetch_add_explicit(&sl_metrics_gauges.gen_clusters_built, 1, memory_order_relaxed);
        c->pb = pb;
        c->index = (uint32_t)i;
        c->num_endpoints = pb->n_endpoints;
        size_t n = pb->n_endpoints ? pb->n_endpoints : 1;
        c->endpoints = calloc(n, sizeof(*c->endpoints));
        c->weights = calloc(n, sizeof(*c->weights));
        c->swrr_current = calloc(n * gen->nworkers, sizeof(*c->swrr_current));
        c->stats = sl_metrics_cluster_acquire(pb->name);
        if (!c->endpoints || !c->weights || !c->swrr_current || !c->stats)
            goto nomem;
        for (size_t e = 0; e < pb->n_endpoints; e++) {
            const Sluice__V1__Endpoint *ep = pb->endpoints[e];
            char eperr[256];
            c->endpoints[e] = sl_endpoint_acquire(pb->name, ep->address, (uint16_t)ep->port, eperr,
                                                  sizeof(eperr));
            if (!c->endpoints[e]) {
                snprintf(err, errlen, "backend %s endpoint %s:%u: %s", pb->name, ep->address,
                         ep->port, eperr);
                return -1;
            }
            c->weights[e] = ep->weight ? ep->weight : 1;
        }
        if (pb->lb_policy == SLUICE__V1__CLUSTER__LB_POLICY__CONSISTENT_HASH && pb->n_endpoints) {
            /* Ring points keyed by address:port, not list position, so a
             * removed endpoint moves only its own keys. */
            char **ids = calloc(pb->n_endpoints, sizeof(char *));
            int ok = ids != NULL;
            for (size_t e = 0; ok && e < pb->n_endpoints; e++) {
                ids[e] = malloc(300);
                ok = ids[e] != NULL;
                if (ok)
                    snprintf(ids[e], 300, "%s:%u", pb->endpoints[e]->address,
                             pb->endpoints[e]->port);
            }
            if (ok)
                c->ring =
                    sl_lb_ring_build_keyed(c->weights, (const char *const *)ids, pb->n_endpoints);
            for (size_t e = 0; ids && e < pb->n_endpoints; e++)
                free(ids[e]);
            free(ids);
            if (!c->ring)
                goto nomem;
        }
        if (pb->outlier) {
            c->outlier_failures = pb->outlier->consecutive_failures;
            c->outlier_base_ejection_ms =
                pb->outlier->base_ejection_ms ? pb->outlier->base_ejection_ms : 30000;
            c->max_ejection_percent = pb->outlier->max_ejection_percent;
        } else {
            c->outlier_failures = 5;
            c->outlier_base_ejection_ms = 30000;
            c->max_ejection_percent = 50;
        }
        if (pb->circuit_breaker) {
            c->cb_max[SL_CB_CONNECTIONS] = pb->circuit_breaker->max_connections;
            c->cb_max[SL_CB_PENDING] = pb->circuit_breaker->max_pending_requests;
            c->cb_max[SL_CB_REQUESTS] = pb->circuit_breaker->max_requests;
            c->cb_max[SL_CB_RETRIES] = pb->circuit_breaker->max_retries;
            for (unsigned k = 0; k < SL_CB__COUNT; k++)
                c->cb_any |= c->cb_max[k] != 0;
        }
        if (pb->pool) {
            c->pool_max_connections = pb->pool->max_connections;
            c->pool_max_idle = pb->pool->max_idle;
            c->pool_idle_timeout_ms = pb->pool->idle_timeout_ms;
        }
        if (!c->pool_max_idle)
            c->pool_max_idle = 64;
        if (!c->pool_idle_timeout_ms)
            c->pool_idle_timeout_ms = 60000;
        c->connect_timeout_ms = pb->connect_timeout_ms ? pb->connect_timeout_ms : gw_connect_ms;
        c->host_rewrite.ptr = pb->host_rewrite;
        c->host_rewrite.len = pb->host_rewrite ? strlen(pb->host_rewrite) : 0;
    }
    return 0;
nomem:
    snprintf(err, errlen, "out of memory building clusters");
    return -1;
}

/* Resolving a cluster name for a table being built: the table keeps a
 * reference to every cluster it points at (tb->used). */
typedef struct {
    sl_generation_t *gen;
    sl_gen_table_t *tb;
    int oom;
} table_ctx_t;

static sl_gen_cluster_t *table_find(table_ctx_t *ctx, const char *name)
{
    sl_gen_cluster_t *c = find_cluster(ctx->gen, name);
    if (!c)
        return NULL;
    sl_gen_table_t *tb = ctx->tb;
    for (size_t i = 0; i < tb->num_used; i++)
        if (tb->used[i] == c)
            return c;
    sl_gen_cluster_t **u = realloc(tb->used, (tb->num_used + 1) * sizeof(*u));
    if (!u) {
        ctx->oom = 1;
        return c; /* the table is freed with the failed build */
    }
    tb->used = u;
    tb->used[tb->num_used++] = c;
    cluster_ref(c);
    return c;
}

static sl_gen_cluster_t *find_cluster_cb(void *ctx, const char *name)
{
    return table_find(ctx, name);
}

/* prev's table tb may serve gen: every cluster it points at is gen's. */
static int table_clusters_same(sl_generation_t *gen, const sl_gen_table_t *tb)
{
    for (size_t i = 0; i < tb->num_used; i++)
        if (find_cluster(gen, tb->used[i]->pb->name) != tb->used[i])
            return 0;
    return 1;
}

static int build_routes(sl_generation_t *gen, const sl_generation_t *prev, int share,
                        const sl_gen_timeouts_t *gw_timeouts, char *err, size_t errlen)
{
    const Sluice__V1__Snapshot *snap = gen->snap;
    size_t nt = snap->n_route_tables ? snap->n_route_tables : 1;
    gen->routes = calloc(nt, sizeof(*gen->routes));
    gen->tables = calloc(nt, sizeof(*gen->tables));
    if (!gen->routes || !gen->tables)
        goto nomem;
    /* The consumers index: prev's when the Consumer messages are the same. */
    if (share && prev->consumers_box &&
        same_msgs((void *const *)prev->snap->consumers, prev->snap->n_consumers,
                  (void *const *)snap->consumers, snap->n_consumers)) {
        gen->consumers_box = prev->consumers_box;
        atomic_fetch_add_explicit(&gen->consumers_box->refs, 1, memory_order_relaxed);
    } else {
        share = 0; /* policy chains point at the consumers: no table is shared */
        gen->consumers_box = calloc(1, sizeof(*gen->consumers_box));
        if (!gen->consumers_box)
            goto nomem;
        atomic_init(&gen->consumers_box->refs, 1);
        gen->consumers_box->c = sl_consumers_build(snap->consumers, snap->n_consumers);
        if (!gen->consumers_box->c)
            goto nomem;
    }
    gen->consumers = gen->consumers_box->c;
    sl_policy_env_t env = {.consumers = gen->consumers, .nworkers = gen->nworkers};
    size_t misses = 0, next = 0; /* where prev's next table probably is */
    /* Every cluster the very one prev has: each table of prev points at
     * clusters of prev (built there, or checked when shared), so at gen's
     * too, without a lookup per table. */
    int clusters_same = share && same_msgs((void *const *)gen->clusters, gen->num_clusters,
                                           (void *const *)prev->clusters, prev->num_clusters);
    for (size_t t = 0; t < snap->n_route_tables; t++) {
        const Sluice__V1__RouteTable *table = snap->route_tables[t];
        if (share) {
            size_t j = find_same((void *const *)prev->snap->route_tables,
                                 prev->snap->n_route_tables, table, next, &misses);
            if (j != SIZE_MAX)
                next = j + 1;
            if (j != SIZE_MAX && prev->tables[j]->consumers == gen->consumers_box &&
                (clusters_same || table_clusters_same(gen, prev->tables[j]))) {
                sl_gen_table_t *old = prev->tables[j];
                atomic_fetch_add_explicit(&old->refs, 1, memory_order_relaxed);
                gen->tables[t] = old;
                gen->routes[t] = old->routes;
                atomic_fetch_add_explicit(&sl_metrics_gauges.gen_tables_shared, 1,
                                          memory_order_relaxed);
                continue;
            }
        }
        sl_gen_table_t *tb = calloc(1, sizeof(*tb));
        if (!tb)
            goto nomem;
        atomic_init(&tb->refs, 1);
        gen->tables[t] = tb;
        tb->pb = table;
        tb->build_id =
            atomic_fetch_add_explicit(&sl_metrics_gauges.gen_tables_built, 1, memory_order_relaxed) +
            1;
        tb->consumers = gen->consumers_box;
        atomic_fetch_add_explicit(&tb->consumers->refs, 1, memory_order_relaxed);
        tb->tlog = gen->tlog;
        if (table->traffic_log) {
            const Sluice__V1__TrafficLogOverride *o = table->traffic_log;
            tb->tlog.enabled = o->enabled;
            tb->tlog.sample_ppm = o->sample_ppm;
            tb->tlog.fields = o->fields64 ? o->fields64 : o->fields;
        }
        table_ctx_t ctx = {.gen = gen, .tb = tb};
        tb->num_routes = table->n_routes;
        sl_gen_route_t *routes = calloc(table->n_routes ? table->n_routes : 1, sizeof(*routes));
        if (!routes)
            goto nomem;
        tb->routes = routes;
        gen->routes[t] = routes;
        env.api = table->name; /* state kept by Api across generations (cache zones) */
        sl_gen_timeouts_t table_timeouts = *gw_timeouts;
        merge_timeouts(&table_timeouts, table->timeouts);
        for (size_t r = 0; r < table->n_routes; r++) {
            const Sluice__V1__Route *pb = table->routes[r];
            sl_gen_route_t *route = &routes[r];
            route->table = table;
            route->pb = pb;
            route->api.ptr = table->name;
            route->api.len = strlen(table->name);
            route->operation.ptr = pb->name;
            route->operation.len = strlen(pb->name);
            route->strip_base_path = table->strip_base_path;
            route->tlog = &tb->tlog;
            route->timeouts = table_timeouts;
            merge_timeouts(&route->timeouts, pb->timeouts);
            const Sluice__V1__RetryPolicy *retry = pb->retry ? pb->retry : table->retry;
            if (retry)
                compile_retry(&route->retry, retry);
            else {
                /* No policy compiled at all: one retry on connection-level
                 * failures, the safe default of every proxy. */
                static const uint32_t statuses[] = {502, 503, 504};
                Sluice__V1__RetryPolicy def = SLUICE__V1__RETRY_POLICY__INIT;
                def.attempts = 1;
                def.on_connect_failure = 1;
                def.on_reset = 1;
                def.n_on_status = 3;
                def.budget_percent = 20;
                def.min_retry_concurrency = 3;
                def.on_status = (uint32_t *)statuses;
                compile_retry(&route->retry, &def);
            }
            route->max_request_body_bytes = pb->max_request_body_bytes ? pb->max_request_body_bytes
                                            : table->max_request_body_bytes
                                                ? table->max_request_body_bytes
                                                : gen->max_request_body_bytes;
            Sluice__V1__BackendRef **refs = pb->n_backends ? pb->backends : table->backends;
            size_t nrefs = pb->n_backends ? pb->n_backends : table->n_backends;
            route->num_backends = nrefs;
            route->backends = calloc(nrefs ? nrefs : 1, sizeof(*route->backends));
            route->backend_weights = calloc(nrefs ? nrefs : 1, sizeof(*route->backend_weights));
            if (!route->backends || !route->backend_weights)
                goto nomem;
            for (size_t b = 0; b < nrefs; b++) {
                route->backends[b] = table_find(&ctx, refs[b]->cluster);
                if (!route->backends[b]) {
                    snprintf(err, errlen, "api %s operation %s: backend %s is not in the snapshot",
                             table->name, pb->name, refs[b]->cluster);
                    return -1;
                }
                route->backend_weights[b] = refs[b]->weight ? refs[b]->weight : 1;
                route->backend_weight_total += route->backend_weights[b];
            }
            /* Success rate among the backendRefs; with rules, the rules'
             * outputs hold their own (route_rules.h). */
            if (pb->success_rate && !pb->routing) {
                const char *names[SL_SRATE_MAX_BACKENDS];
                size_t nn = nrefs < SL_SRATE_MAX_BACKENDS ? nrefs : SL_SRATE_MAX_BACKENDS;
                for (size_t b = 0; b < nn; b++)
                    names[b] = route->backends[b]->pb->name;
                route->srate =
                    sl_srate_route_build(pb->success_rate, NULL, names, nn, 0, err, errlen);
                if (!route->srate)
                    return -1;
            }
            route->stats = sl_metrics_route_acquire(table->name, pb->name);
            if (!route->stats)
                goto nomem;
            route->faults = pb->faults;
            if (pb->mirror) {
                route->mirror = table_find(&ctx, pb->mirror->cluster);
                route->mirror_ppm = pb->mirror->ppm;
                char why[200];
                if (!route->mirror) {
                    snprintf(err, errlen, "api %s operation %s: mirror backend %s is not in the "
                             "snapshot", table->name, pb->name, pb->mirror->cluster);
                    return -1;
                }
                if (sl_mirror_start(gen->nworkers, why, sizeof(why)) != 0) {
                    snprintf(err, errlen, "%s", why);
                    return -1;
                }
            }
            if (pb->routing) {
                /* Rules that cannot be compiled refuse the whole snapshot
                 * (NACK): the controller validated them, so this is a
                 * controller of another build or a hand-made snapshot. */
                char why[512];
                route->rules = sl_route_rules_build(
                    pb->routing, pb->path, pb->path_kind == SLUICE__V1__ROUTE__PATH_KIND__TEMPLATE,
                    find_cluster_cb, &ctx, route->backends, route->backend_weights,
                    route->num_backends, pb->success_rate, gen->nworkers, why, sizeof(why));
                if (!route->rules) {
                    snprintf(err, errlen, "api %s operation %s: %s", table->name, pb->name, why);
                    return -1;
                }
            }
            if (pb->n_policies) {
                env.jwt_claims = sl_route_rules_reads_claims(route->rules);
                /* A chain that cannot be built fails this route closed and
                 * leaves every other route (and Api) as it is. */
                char why[512];
                route->chain =
                    sl_policy_chain_build(pb->policies, pb->n_policies, &env, why, sizeof(why));
                env.jwt_claims = 0;
                size_t nchain = sl_policy_chain_len(route->chain);
                if (route->chain) {
                    route->policy_stats = calloc(nchain, sizeof(*route->policy_stats));
                    if (!route->policy_stats)
                        goto nomem;
                    for (size_t k = 0; k < nchain; k++)
                        route->policy_stats[k] = sl_metrics_policy_acquire(
                            table->name, sl_policy_chain_name(route->chain, k));
                    for (size_t k = 0; k < nchain; k++) {
                        const char *scope = sl_policy_chain_scope(route->chain, k);
                        if (!scope)
                            continue;
                        if (!route->scope_stats &&
                            !(route->scope_stats = calloc(nchain, sizeof(*route->scope_stats))))
                            goto nomem;
                        if (!(route->scope_stats[k] = sl_metrics_scope_acquire(table->name, scope)))
                            goto nomem;
                    }
                } else {
                    sl_log_warn("api %s operation %s: not served until its policies can be "
                                "applied: %s",
                                table->name, pb->name, why);
                    route->policy_error = strdup(why);
                    if (!route->policy_error)
                        goto nomem;
                }
            }
        }
        if (ctx.oom)
            goto nomem;
    }
    return 0;
nomem:
    snprintf(err, errlen, "out of memory building routes");
    return -1;
}

static void listener_key(const Sluice__V1__Listener *l, char *key, size_t keylen)
{
    snprintf(key, keylen, "%s:%u", l->address && *l->address ? l->address : "0.0.0.0", l->port);
}

/* One TLS server per https listener and one client context per Backend
 * with `tls`; any certificate or CA that does not load fails the build with
 * the listener or Backend named (fail closed: the old config keeps serving). */
static int build_tls(sl_generation_t *gen, char *err, size_t errlen)
{
    Sluice__V1__Snapshot *snap = gen->snap;
    for (size_t i = 0; i < gen->num_clusters; i++) {
        sl_gen_cluster_t *cl = gen->clusters[i];
        if (!cl->pb->tls || cl->tls)
            continue; /* none, or a shared cluster's */
        cl->tls = sl_tls_client_ctx_build(cl->pb, snap, err, errlen);
        if (!cl->tls)
            return -1;
        cl->tls_name = cl->pb->tls->sni && *cl->pb->tls->sni ? cl->pb->tls->sni : NULL;
    }
    int any = 0;
    for (size_t i = 0; i < snap->n_listeners; i++)
        any |= snap->listeners[i]->protocol == SLUICE__V1__LISTENER__PROTOCOL__HTTPS;
    if (!any)
        return 0;
    gen->tls = calloc(snap->n_listeners, sizeof(*gen->tls));
    if (!gen->tls) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < snap->n_listeners; i++) {
        const Sluice__V1__Listener *l = snap->listeners[i];
        if (l->protocol != SLUICE__V1__LISTENER__PROTOCOL__HTTPS)
            continue;
        gen->tls[i] = sl_tls_server_build(l, snap, 0, err, errlen);
        if (!gen->tls[i])
            return -1;
    }
    return 0;
}

struct sl_tls_server *sl_generation_tls(const sl_generation_t *gen, const char *key)
{
    if (!gen || !gen->tls)
        return NULL;
    for (size_t i = 0; i < gen->snap->n_listeners; i++) {
        char k[80];
        listener_key(gen->snap->listeners[i], k, sizeof(k));
        if (gen->tls[i] && strcmp(k, key) == 0)
            return gen->tls[i];
    }
    return NULL;
}

/* The codec settings of each listener with an http2 block. The values are
 * checked again here, not only by the validator: a controller of another
 * build may push what this runtime's codec does not accept, and the push is
 * then NACKed with the listener and field named. */
static int build_http2(sl_generation_t *gen, char *err, size_t errlen)
{
    Sluice__V1__Snapshot *snap = gen->snap;
    for (size_t i = 0; i < snap->n_listeners; i++) {
        const Sluice__V1__Listener *l = snap->listeners[i];
        const Sluice__V1__ListenerHttp2 *m = l->http2;
        if (!m)
            continue;
        char what[512];
        if (l->protocol == SLUICE__V1__LISTENER__PROTOCOL__HTTP) {
            snprintf(err, errlen,
                     "listener '%s': http2 is set but the listener's protocol is http (HTTP/1.1 "
                     "only; use h2c or https)",
                     l->name);
            return -1;
        }
        if (sl_listener_http2_check(m, what, sizeof(what)) != 0) {
            snprintf(err, errlen, "listener '%s': %s", l->name, what);
            return -1;
        }
        if (!gen->h2) {
            gen->h2 = calloc(snap->n_listeners, sizeof(*gen->h2));
            if (!gen->h2) {
                snprintf(err, errlen, "out of memory");
                return -1;
            }
        }
        sl_h2_settings_t *s = &gen->h2[i];
        s->max_concurrent_streams = m->max_concurrent_streams;
        s->stream_window_bytes = m->initial_stream_window_bytes;
        s->conn_window_bytes = m->initial_connection_window_bytes;
        s->max_header_list_bytes = m->max_header_list_bytes;
        s->max_header_fields = m->max_header_fields;
        s->max_continuations = m->max_continuation_frames;
        s->header_table_bytes = m->header_table_bytes;
        s->ctrl_frames_max = m->max_control_frames_per_window;
        s->ctrl_window_ms = m->control_window_ms;
        s->aborted_streams_max = m->max_reset_streams_per_window;
        s->aborted_window_ms = m->reset_window_ms;
        s->empty_data_max = m->max_empty_data_frames;
        s->stream_send_buffer_bytes = m->stream_send_buffer_bytes;
        s->conn_send_buffer_bytes = m->connection_send_buffer_bytes;
    }
    return 0;
}

int sl_generation_h2_settings(const sl_generation_t *gen, const char *key, sl_h2_settings_t *out)
{
    memset(out, 0, sizeof(*out));
    if (!gen || !gen->h2)
        return 0;
    for (size_t i = 0; i < gen->snap->n_listeners; i++) {
        char k[80];
        if (!gen->snap->listeners[i]->http2)
            continue;
        listener_key(gen->snap->listeners[i], k, sizeof(k));
        if (strcmp(k, key) == 0) {
            *out = gen->h2[i];
            return 1;
        }
    }
    return 0;
}

sl_generation_t *sl_generation_build(Sluice__V1__Snapshot *snap, const char *source,
                                     unsigned nworkers, char *err, size_t errlen)
{
    /* The main thread is the only one that publishes: the published
     * generation cannot go away under it. */
    return sl_generation_build_from(snap, source, nworkers, sl_generation_published, err, errlen);
}

sl_generation_t *sl_generation_build_from(Sluice__V1__Snapshot *snap, const char *source,
                                          unsigned nworkers, const sl_generation_t *prev,
                                          char *err, size_t errlen)
{
    sl_generation_t *gen = calloc(1, sizeof(*gen));
    if (!gen) {
        sl_pbshare_snapshot_free(snap);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    gen->snap = snap;
    atomic_init(&gen->refs, 1); /* the "published" reference */
    gen->version = snap->version;
    gen->nworkers = nworkers;
    gen->source = strdup(source ? source : "");
    /* One cache line per worker: aligned_alloc of whole lines, so a slot
     * shares its line with nothing else either. */
    size_t nslots = nworkers ? nworkers : 1;
    gen->worker_slots = aligned_alloc(64, nslots * sizeof(*gen->worker_slots));
    if (!gen->source || !gen->worker_slots) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    memset(gen->worker_slots, 0, nslots * sizeof(*gen->worker_slots));
    struct timeval tv;
    gettimeofday(&tv, NULL);
    gen->built_unix_ms = (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;

    /* Gateway-level settings with the defaults of docs/configuration.md; the
     * compiler fills them, these only guard a snapshot from an older
     * controller that left them unset. */
    const Sluice__V1__GatewaySettings *gs = snap->settings;
    const Sluice__V1__Limits *lim = gs ? gs->limits : NULL;
    const Sluice__V1__Timeouts *to = gs ? gs->timeouts : NULL;
    gen->limits.max_request_line_bytes =
        lim && lim->max_request_line_bytes ? lim->max_request_line_bytes : 8192;
    gen->limits.max_header_bytes = lim && lim->max_header_bytes ? lim->max_header_bytes : 32768;
    gen->limits.max_header_count = lim && lim->max_header_count ? lim->max_header_count : 100;
    gen->max_request_body_bytes = lim ? lim->max_request_body_bytes : 0;
    gen->max_connections = lim ? lim->max_connections : 0;
    gen->request_header_timeout_ms = to && to->request_header_ms ? to->request_header_ms : 10000;
    gen->idle_timeout_ms = to && to->idle_ms ? to->idle_ms : 60000;
    gen->add_via = gs ? gs->add_via : 0;
    /* Absent (an older controller): zero, which is path.h's default. */
    const Sluice__V1__PathNormalization *pn = gs ? gs->path_normalization : NULL;
    gen->path_opts.merge_slashes = pn ? pn->merge_slashes : 0;
    switch (pn ? pn->encoded_slashes : 0) {
    case SLUICE__V1__PATH_NORMALIZATION__ENCODED_SLASHES__SLASHES_KEEP:
        gen->path_opts.encoded_slashes = SL_PATH_SLASHES_KEEP;
        break;
    case SLUICE__V1__PATH_NORMALIZATION__ENCODED_SLASHES__SLASHES_DECODE:
        gen->path_opts.encoded_slashes = SL_PATH_SLASHES_DECODE;
        break;
    default: /* reject, or a mode newer than this runtime: fail closed */
        gen->path_opts.encoded_slashes = SL_PATH_SLASHES_REJECT;
        break;
    }
    sl_gen_timeouts_t gw_timeouts = {
        .request_ms = to ? to->request_ms : 0,
        /* Route-level connect timeouts exist only when an Api or operation
         * sets one; otherwise the Backend's (cluster) value applies. */
        .connect_ms = 0,
        .response_ms = to && to->upstream_response_ms ? to->upstream_response_ms : 30000,
    };

    /* The traffic log's record settings; absent (an older controller): the
     * defaults, every record. */
    const Sluice__V1__TrafficLog *tlc = gs ? gs->traffic_log : NULL;
    gen->tlog = sl_tlog_policy_default;
    if (tlc) {
        gen->tlog.enabled = tlc->enabled;
        gen->tlog.sample_ppm = tlc->sample_ppm;
        gen->tlog.fields = tlc->fields64 ? tlc->fields64 : tlc->fields;
        gen->tlog.header_max_bytes = tlc->header_max_bytes;
        gen->tlog.redact = tlc->redact_headers;
        gen->tlog.num_redact = tlc->n_redact_headers;
        gen->tlog.body_max_bytes = tlc->body_max_bytes;
        gen->tlog.body_redact = tlc->redact_body_fields;
        gen->tlog.num_body_redact = tlc->n_redact_body_fields;
        gen->tlog.body_types = tlc->body_content_types;
        gen->tlog.num_body_types = tlc->n_body_content_types;
    }
    {
        const sl_tlog_policy_t *p = &gen->tlog;
        if (p->enabled) {
            if (p->fields & SL_TLOG_BIT(SL_TLOG_F_REQUEST_HEADERS))
                gen->tlog_headers_wanted |= 1;
            if (p->fields & SL_TLOG_BIT(SL_TLOG_F_RESPONSE_HEADERS))
                gen->tlog_headers_wanted |= 2;
            if (p->fields & SL_TLOG_BIT(SL_TLOG_F_REQUEST_BODY))
                gen->tlog_bodies_wanted |= 1;
            if (p->fields & SL_TLOG_BIT(SL_TLOG_F_RESPONSE_BODY))
                gen->tlog_bodies_wanted |= 2;
        }
    }

    const Sluice__V1__Tracing *trc = gs ? gs->tracing : NULL;
    if (trc) {
        gen->tracing.enabled = 1;
        gen->tracing.generate = trc->generate;
        gen->tracing.server_timing = trc->server_timing;
        gen->tracing.sample_ppm = trc->sample_ppm;
    }

    /* What prev may share (see "Sharing"): its settings message and worker
     * count are this snapshot's; for tls Backends its certificates too. */
    int share = prev && prev->snap && prev->snap->settings == snap->settings &&
                prev->nworkers == gen->nworkers;
    int certs_same = share && same_msgs((void *const *)prev->snap->certificates,
                                        prev->snap->n_certificates,
                                        (void *const *)snap->certificates, snap->n_certificates);
    uint32_t gw_connect_ms = to && to->upstream_connect_ms ? to->upstream_connect_ms : 5000;
    if (build_clusters(gen, prev, share, certs_same, gw_connect_ms, err, errlen) != 0)
        goto fail;
    if (build_routes(gen, prev, share, &gw_timeouts, err, errlen) != 0)
        goto fail;
    for (size_t t = 0; t < snap->n_route_tables; t++) {
        const sl_tlog_policy_t *p = &gen->tables[t]->tlog;
        if (!p->enabled)
            continue;
        if (p->fields & SL_TLOG_BIT(SL_TLOG_F_REQUEST_HEADERS))
            gen->tlog_headers_wanted |= 1;
        if (p->fields & SL_TLOG_BIT(SL_TLOG_F_RESPONSE_HEADERS))
            gen->tlog_headers_wanted |= 2;
        if (p->fields & SL_TLOG_BIT(SL_TLOG_F_REQUEST_BODY))
            gen->tlog_bodies_wanted |= 1;
        if (p->fields & SL_TLOG_BIT(SL_TLOG_F_RESPONSE_BODY))
            gen->tlog_bodies_wanted |= 2;
    }
    /* The router from prev's: only the tables whose message changed are
     * compiled and put into the trie (router.h, sl_router_update). */
    gen->router = prev && prev->router ? sl_router_update(prev->router, snap, err, errlen)
                                       : sl_router_build(snap, err, errlen);
    if (!gen->router)
        goto fail;
    if (build_http2(gen, err, errlen) != 0)
        goto fail;
    if (build_tls(gen, err, errlen) != 0)
        goto fail;
    return gen;
fail:
    free_generation(gen);
    return NULL;
}

void sl_generation_discard(sl_generation_t *gen)
{
    free_generation(gen);
}

/* Unit tests that #include this file define it to watch frees. */
#ifndef SL_GENERATION_TEST_ON_FREE
#define SL_GENERATION_TEST_ON_FREE(gen) ((void)(gen))
#endif

static void free_rcu(struct rcu_head *head)
{
    sl_generation_t *gen = caa_container_of(head, sl_generation_t, rcu);
    SL_GENERATION_TEST_ON_FREE(gen);
    atomic_fetch_sub_explicit(&sl_metrics_gauges.generations_alive, 1, memory_order_relaxed);
    free_generation(gen);
}

/* Runs after a grace period: no worker can still be between
 * rcu_dereference and sl_generation_ref of this generation. */
static void drop_published_ref(struct rcu_head *head)
{
    sl_generation_t *gen = caa_container_of(head, sl_generation_t, rcu);
    if (atomic_fetch_sub_explicit(&gen->refs, 1, memory_order_acq_rel) == 1)
        free_rcu(head);
}

void sl_generation_unref(sl_generation_t *gen)
{
    if (atomic_fetch_sub_explicit(&gen->refs, 1, memory_order_acq_rel) == 1) {
        /* Last holder of a retired generation: the rcu_head is free again
         * (drop_published_ref already ran), reuse it to free off-thread.
         * call_rcu wants an online caller; workers are usually offline. */
        int online = rcu_read_ongoing();
        if (!online)
            rcu_thread_online();
        call_rcu(&gen->rcu, free_rcu);
        if (!online)
            rcu_thread_offline();
    }
}

/* ---- worker holds (generation.h, "Worker holds") ---------------------------
 *
 * A slot has one writer, its worker, so relaxed loads and stores make exact
 * counts without a locked instruction; they are atomics only so that another
 * thread may read them (a test) without a data race. The ordering that frees
 * a generation safely is carried by refs (acq_rel on the way down) and by the
 * grace period before the "published" reference is dropped, as before. */

static inline unsigned long slot_requests(const sl_gen_worker_slot_t *s)
{
    return atomic_load_explicit(&s->requests, memory_order_relaxed);
}

static inline sl_gen_worker_slot_t *worker_slot(sl_generation_t *gen, const sl_worker_t *w)
{
    /* A generation is sized for the workers configured when it was built; a
     * worker beyond that (none today) falls back to shared references. */
    return w->id < gen->nworkers ? &gen->worker_slots[w->id] : NULL;
}

/* Drops w's reference on listed generations w has no request on: retired
 * ones, or all of them when the worker exits. */
static void drop_holds(sl_worker_t *w, int even_current)
{
    unsigned i = 0;
    while (i < w->num_gens_held) {
        sl_generation_t *gen = w->gens_held[i];
        sl_gen_worker_slot_t *s = &gen->worker_slots[w->id];
        /* Acquire pairs with sl_generation_retire's release: once a worker
         * sees retired, its own later reads of the published pointer see the
         * newer generation, so it does not list this one again. Safety does
         * not depend on it: a retired generation listed again (read inside a
         * read-side section, so the grace period still protects the new
         * reference) would only be dropped again at the next check. */
        if (slot_requests(s) == 0 &&
            (even_current || atomic_load_explicit(&gen->retired, memory_order_acquire))) {
            atomic_store_explicit(&s->held, 0, memory_order_relaxed);
            w->gens_held[i] = w->gens_held[--w->num_gens_held];
            sl_generation_unref(gen); /* may schedule the free: gen is not touched after */
            continue;
        }
        i++;
    }
}

sl_generation_t *sl_generation_acquire(sl_worker_t *w)
{
    int online = rcu_read_ongoing();
    if (!online)
        rcu_thread_online();
    sl_generation_t *gen = sl_generation_current();
    if (gen) {
        /* Still inside the read-side section: the "published" reference
         * cannot be dropped before this hold is taken (it waits for a grace
         * period after the unpublish), so refs cannot reach 0 under us. */
        sl_gen_worker_slot_t *s = worker_slot(gen, w);
        if (!s) {
            sl_generation_ref(gen);
        } else {
            unsigned long n = slot_requests(s);
            if (!atomic_load_explicit(&s->held, memory_order_relaxed)) {
                /* Shared reference: the worker's own (listed, then borrowed
                 * by its later requests), or this request's when the list is
                 * full or requests of that kind are still running (n > 0:
                 * the slot must not mix the two). */
                sl_generation_ref(gen);
                if (n == 0 && w->num_gens_held < SL_WORKER_GENS_HELD) {
                    atomic_store_explicit(&s->held, 1, memory_order_relaxed);
                    w->gens_held[w->num_gens_held++] = gen;
                }
            }
            atomic_store_explicit(&s->requests, n + 1, memory_order_relaxed);
        }
    }
    if (!online)
        rcu_thread_offline();
    return gen;
}

void sl_generation_release(sl_worker_t *w, sl_generation_t *gen)
{
    sl_gen_worker_slot_t *s = worker_slot(gen, w);
    if (!s) {
        sl_generation_unref(gen);
        return;
    }
    unsigned long n = slot_requests(s);
    atomic_store_explicit(&s->requests, n - 1, memory_order_relaxed);
    if (!atomic_load_explicit(&s->held, memory_order_relaxed)) {
        sl_generation_unref(gen); /* this request's own reference */
        return;
    }
    /* The request's end is when a worker notices a retired generation it no
     * longer needs: this one, or one it went idle on before a reload. */
    drop_holds(w, 0);
}

void sl_generation_tick(sl_worker_t *w)
{
    drop_holds(w, 0);
}

void sl_generation_release_all(sl_worker_t *w)
{
    drop_holds(w, 1);
    if (w->num_gens_held)
        sl_log_alert("worker %u: exits with requests still holding %u config generations", w->id,
                     w->num_gens_held);
}

sl_generation_t *sl_generation_publish(sl_generation_t *gen)
{
    sl_generation_t *old = rcu_xchg_pointer(&sl_generation_published, gen);
    atomic_fetch_add_explicit(&sl_metrics_gauges.generations_alive, 1, memory_order_relaxed);
    atomic_store(&sl_metrics_gauges.generation_version, gen->version);
    atomic_fetch_add(&sl_metrics_gauges.generation_swaps, 1);
    /* sluice_certificate_expiry_seconds follows what is served. */
    if (sl_tls_publish_expiry(gen->tls, gen->tls ? gen->snap->n_listeners : 0) != SL_OK)
        sl_log_warn("generation %" PRIu64
                    ": certificate expiry metrics not updated (out of memory)",
                    gen->version);
    if (old)
        sl_generation_retire(old);
    return old;
}

void sl_generation_retire(sl_generation_t *gen)
{
    /* Workers drop their references as soon as they see this with no request
     * left on gen, even before the grace period below ends. Release: see
     * drop_holds. */
    atomic_store_explicit(&gen->retired, 1, memory_order_release);
    call_rcu(&gen->rcu, drop_published_ref);
}
