/*
 * Controller core (controller.h): compile scheduling, per-fleet snapshots,
 * and the push protocol with every runtime.
 *
 * Protocol, per runtime (one gRPC stream, state-of-the-world per type):
 *  - a runtime subscribes to the four types, telling which version of each
 *    it already runs (empty when new);
 *  - the controller answers at most one response at a time per runtime and
 *    waits for its ACK or NACK before the next (no push storms: a slow
 *    runtime simply gets the newest state when it answers);
 *  - types go out in make-before-break order: clusters, settings, routes,
 *    listeners. Removals come last by construction: a runtime keeps a removed
 *    cluster while the routes it still runs reference it, until the new
 *    routes arrive (runtime/xds.c);
 *  - a NACKed (type, version) is never sent again to that runtime; the next
 *    config change produces a new version, which is;
 *  - a response whose nonce is not the one in flight is stale and ignored.
 *
 * Versions: one durable, monotonic config version (store counter). A
 * compile bumps it only if some type's content changed, and a type keeps the
 * version at which its content last changed; both are persisted per fleet
 * with the content hash, so a restarted controller continues the sequence
 * and a runtime reconnecting with what it already runs gets no re-push.
 */
#include "controller.h"

#include "compiler.h"
#include "core.h"
#include "grpc_util.h"
#include "log.h"
#include "stream.h"

#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

sl_ctrl_metrics_t sl_ctrl_metrics;

#define COALESCE_MS 20      /* first window of a burst */
#define COALESCE_MAX_MS 200 /* the window doubles up to this while writes keep coming */
#define VERSION_LEN 24

typedef struct fleet {
    char *name;
    Sluice__V1__Snapshot *snap;
    int compiled_ok;
    struct {
        uint64_t version;
        uint64_t hash;
        char version_str[VERSION_LEN];
        grpc_byte_buffer *response;
        size_t resources;
    } t[SL_XDS__COUNT];
    struct fleet *next;
} fleet_t;

typedef struct runtime_rec {
    char *node_id;
    char *fleet_name;
    char *address;
    char *build_version;
    sl_stream_t *stream;
    uint64_t connected_since_ms;
    uint64_t last_seen_ms;
    uint64_t disconnected_ms;
    int subscribed[SL_XDS__COUNT];
    char acked[SL_XDS__COUNT][VERSION_LEN];
    char inflight_nonce[64];
    int inflight_type;
    char inflight_version[VERSION_LEN];
    struct {
        char version[VERSION_LEN];
        char *message;
        uint64_t at_ms;
    } nack[SL_XDS__COUNT];
    uint64_t responses_sent;
    struct runtime_rec *next;
} runtime_rec_t;

typedef struct {
    runtime_rec_t *rt; /* set by the first request (it carries the node) */
} stream_ctx_t;

struct sl_controller {
    struct event_base *base;
    sl_store_t *store;
    const sl_resource_set_t *static_set; /* --resources mode, else NULL */
    struct event *compile_ev;
    int compile_pending;
    uint64_t last_compile_ms; /* end of the last compile, monotonic */
    uint64_t window_ms;       /* current coalescing window */
    unsigned coalesced;       /* changes that joined the pending compile */
    fleet_t *fleets;
    runtime_rec_t *runtimes;
    json_t *statuses; /* "<plural>/<ns>/<name>" -> status object */
    uint64_t config_version;
    /* A runtime runs newer versions than ours: push nothing until the
     * compile has given every type a version past it. */
    int versions_stale;
    /* Routes per Api ("ns/name" -> operations), for admission. Apis apply
     * to every fleet, so the total is each fleet's route count. Rebuilt
     * from the store on every compile. */
    json_t *api_routes;
    uint64_t total_routes;
    uint64_t max_routes;
};

static uint64_t api_route_count(json_t *doc)
{
    json_t *ops = json_object_get(json_object_get(doc, "spec"), "operations");
    return json_is_array(ops) ? json_array_size(ops) : 0;
}

static void count_routes(sl_controller_t *ctl, const sl_resource_set_t *all)
{
    json_object_clear(ctl->api_routes);
    ctl->total_routes = 0;
    for (size_t i = 0; i < all->count; i++) {
        if (all->items[i].kind != SL_KIND_API)
            continue;
        char key[600];
        snprintf(key, sizeof(key), "%s/%s", all->items[i].ns, all->items[i].name);
        uint64_t n = api_route_count(all->items[i].obj);
        json_object_set_new(ctl->api_routes, key, json_integer((json_int_t)n));
        ctl->total_routes += n;
    }
}

int sl_controller_admit(sl_controller_t *ctl, json_t *objs, char *err, size_t errlen)
{
    uint64_t total = ctl->total_routes;
    size_t i;
    json_t *doc;
    json_array_foreach(objs, i, doc)
    {
        if (strcmp(json_string_value(json_object_get(doc, "kind")) ?: "", "Api") != 0)
            continue;
        json_t *meta = json_object_get(doc, "metadata");
        const char *ns = json_string_value(json_object_get(meta, "namespace")) ?: "default";
        char key[600];
        snprintf(key, sizeof(key), "%s/%s", ns,
                 json_string_value(json_object_get(meta, "name")) ?: "");
        total -= (uint64_t)json_integer_value(json_object_get(ctl->api_routes, key));
        total += api_route_count(doc);
    }
    if (ctl->max_routes && total > ctl->max_routes) {
        snprintf(err, errlen,
                 "config would have %llu routes, more than --max-routes %llu; remove operations "
                 "or Apis, or raise the limit",
                 (unsigned long long)total, (unsigned long long)ctl->max_routes);
        return -1;
    }
    json_array_foreach(objs, i, doc)
    {
        if (strcmp(json_string_value(json_object_get(doc, "kind")) ?: "", "Api") != 0)
            continue;
        json_t *meta = json_object_get(doc, "metadata");
        const char *ns = json_string_value(json_object_get(meta, "namespace")) ?: "default";
        char key[600];
        snprintf(key, sizeof(key), "%s/%s", ns,
                 json_string_value(json_object_get(meta, "name")) ?: "");
        json_object_set_new(ctl->api_routes, key, json_integer((json_int_t)api_route_count(doc)));
    }
    ctl->total_routes = total;
    return 0;
}

void sl_controller_forget(sl_controller_t *ctl, enum sl_kind kind, const char *ns,
                          const char *name)
{
    if (kind != SL_KIND_API)
        return;
    char key[600];
    snprintf(key, sizeof(key), "%s/%s", ns, name);
    ctl->total_routes -= (uint64_t)json_integer_value(json_object_get(ctl->api_routes, key));
    json_object_del(ctl->api_routes, key);
}

void sl_controller_set_max_routes(sl_controller_t *ctl, uint64_t max_routes)
{
    ctl->max_routes = max_routes;
}

static uint64_t now_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static void iso_time(uint64_t ms, char *buf, size_t len)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* ---- fleets --------------------------------------------------------------- */

static fleet_t *fleet_find(sl_controller_t *ctl, const char *name)
{
    for (fleet_t *f = ctl->fleets; f; f = f->next)
        if (strcmp(f->name, name) == 0)
            return f;
    return NULL;
}

static fleet_t *fleet_get(sl_controller_t *ctl, const char *name)
{
    fleet_t *f = fleet_find(ctl, name);
    if (f)
        return f;
    f = calloc(1, sizeof(*f));
    if (!f)
        return NULL;
    f->name = strdup(name);
    /* What this fleet's runtimes may already run, from before a restart. */
    for (int t = 0; t < SL_XDS__COUNT; t++) {
        char key[256];
        snprintf(key, sizeof(key), "fleet/%s/%s/version", name, sl_xds_type_names[t]);
        f->t[t].version = sl_store_counter_get(ctl->store, key);
        snprintf(key, sizeof(key), "fleet/%s/%s/hash", name, sl_xds_type_names[t]);
        f->t[t].hash = sl_store_counter_get(ctl->store, key);
    }
    f->next = ctl->fleets;
    ctl->fleets = f;
    return f;
}

static void fleet_free(fleet_t *f)
{
    for (int t = 0; t < SL_XDS__COUNT; t++)
        if (f->t[t].response)
            grpc_byte_buffer_destroy(f->t[t].response);
    if (f->snap)
        sl_snapshot_free(f->snap);
    free(f->name);
    free(f);
}

/* Packs the resources of one type of a snapshot into resources[], returning
 * their content hash. Caller frees resources[i]->value.data and the array. */
static size_t type_resources(const Sluice__V1__Snapshot *snap, int type,
                             Sluice__V1__Resource ***out, uint64_t *hash)
{
    size_t n = 0;
    const ProtobufCMessage **msgs = NULL;
    const char **names = NULL;
    Sluice__V1__GatewaySettings empty_settings = SLUICE__V1__GATEWAY_SETTINGS__INIT;
    switch (type) {
    case SL_XDS_CLUSTER:
        n = snap->n_clusters;
        break;
    case SL_XDS_ROUTE:
        n = snap->n_route_tables;
        break;
    case SL_XDS_LISTENER:
        n = snap->n_listeners;
        break;
    case SL_XDS_SETTINGS:
        n = 1;
        break;
    }
    msgs = calloc(n ? n : 1, sizeof(*msgs));
    names = calloc(n ? n : 1, sizeof(*names));
    Sluice__V1__Resource **res = calloc(n ? n : 1, sizeof(*res));
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        switch (type) {
        case SL_XDS_CLUSTER:
            msgs[i] = &snap->clusters[i]->base;
            names[i] = snap->clusters[i]->name;
            break;
        case SL_XDS_ROUTE:
            msgs[i] = &snap->route_tables[i]->base;
            names[i] = snap->route_tables[i]->name;
            break;
        case SL_XDS_LISTENER:
            msgs[i] = &snap->listeners[i]->base;
            names[i] = snap->listeners[i]->name;
            break;
        case SL_XDS_SETTINGS:
            msgs[i] = snap->settings ? &snap->settings->base : &empty_settings.base;
            names[i] = "settings";
            break;
        }
        res[i] = malloc(sizeof(Sluice__V1__Resource));
        sluice__v1__resource__init(res[i]);
        res[i]->name = (char *)names[i];
        res[i]->type_url = (char *)sl_xds_type_urls[type];
        size_t len = protobuf_c_message_get_packed_size(msgs[i]);
        res[i]->value.data = malloc(len ? len : 1);
        res[i]->value.len = protobuf_c_message_pack(msgs[i], res[i]->value.data);
        h = fnv1a(h, names[i], strlen(names[i]) + 1);
        h = fnv1a(h, res[i]->value.data, res[i]->value.len);
    }
    free(msgs);
    free(names);
    *out = res;
    *hash = h ? h : 1;
    return n;
}

static void free_resources(Sluice__V1__Resource **res, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(res[i]->value.data);
        free(res[i]);
    }
    free(res);
}

static grpc_byte_buffer *encode_response(Sluice__V1__Resource **res, size_t n, int type,
                                         const char *version)
{
    Sluice__V1__DiscoveryResponse resp = SLUICE__V1__DISCOVERY_RESPONSE__INIT;
    char nonce[64];
    /* Unique per (version, type): one encoding serves every runtime. */
    snprintf(nonce, sizeof(nonce), "%s/%d", version, type);
    resp.version_info = (char *)version;
    resp.type_url = (char *)sl_xds_type_urls[type];
    resp.nonce = nonce;
    resp.n_resources = n;
    resp.resources = res;
    return sl_grpc_pack(&resp.base);
}

/* ---- pushing -------------------------------------------------------------- */

static void try_push(sl_controller_t *ctl, runtime_rec_t *rt)
{
    if (!rt->stream || rt->inflight_nonce[0] || ctl->versions_stale)
        return;
    fleet_t *f = fleet_find(ctl, rt->fleet_name);
    if (!f || !f->compiled_ok)
        return;
    for (int t = 0; t < SL_XDS__COUNT; t++) {
        if (!rt->subscribed[t] || !f->t[t].response)
            continue;
        if (strcmp(rt->acked[t], f->t[t].version_str) == 0)
            continue;
        if (strcmp(rt->nack[t].version, f->t[t].version_str) == 0)
            continue; /* rejected this exact version: wait for a new one */
        grpc_byte_buffer *bb = grpc_byte_buffer_copy(f->t[t].response);
        if (!bb)
            return;
        snprintf(rt->inflight_nonce, sizeof(rt->inflight_nonce), "%s/%d", f->t[t].version_str, t);
        snprintf(rt->inflight_version, sizeof(rt->inflight_version), "%s", f->t[t].version_str);
        rt->inflight_type = t;
        rt->responses_sent++;
        atomic_fetch_add(&sl_ctrl_metrics.pushes, 1);
        sl_log_debug("push %s to %s: version %s (%zu resources)", sl_xds_type_names[t],
                     rt->node_id, f->t[t].version_str, f->t[t].resources);
        sl_stream_send(rt->stream, bb);
        return;
    }
}

static void push_fleet(sl_controller_t *ctl, const char *fleet)
{
    for (runtime_rec_t *rt = ctl->runtimes; rt; rt = rt->next)
        if (rt->stream && strcmp(rt->fleet_name, fleet) == 0)
            try_push(ctl, rt);
}

/* ---- compiling ------------------------------------------------------------ */

static json_t *accepted_status(int ok, const char *reason, const char *message, json_t *obj)
{
    json_t *meta = json_object_get(obj, "metadata");
    json_t *gen = json_object_get(meta, "generation");
    return json_pack("{s:[{s:s, s:s, s:s, s:s}], s:o}", "conditions", "type", "Accepted",
                     "status", ok ? "True" : "False", "reason", reason, "message", message,
                     "observedGeneration",
                     json_is_integer(gen) ? json_incref(gen) : json_integer(1));
}

/*
 * Compiles one fleet. An object that cannot be compiled (e.g. an Api naming
 * a missing Backend) is left out and its status says why, instead of
 * breaking every other Api of the fleet.
 */
static Sluice__V1__Snapshot *compile_fleet(sl_controller_t *ctl, const sl_resource_set_t *all,
                                           const char *fleet, json_t *statuses)
{
    uint8_t *excluded = calloc(all->count ? all->count : 1, 1);
    if (!excluded)
        return NULL;
    Sluice__V1__Snapshot *snap = NULL;
    for (int round = 0; round < 64; round++) {
        sl_resource_set_t set;
        sl_resource_set_init(&set);
        for (size_t i = 0; i < all->count; i++)
            if (!excluded[i])
                sl_resource_set_add(&set, all->items[i].obj, all->items[i].source,
                                    all->items[i].doc);
        sl_errors_t errs;
        sl_errors_init(&errs);
        snap = sl_compile_snapshot(&set, fleet, 0, &errs);
        sl_resource_set_free(&set);
        if (snap) {
            sl_errors_free(&errs);
            break;
        }
        int progress = 0;
        for (size_t e = 0; e < errs.count; e++) {
            const sl_error_t *err = &errs.items[e];
            for (size_t i = 0; i < all->count; i++) {
                if (excluded[i] || strcmp(all->items[i].source, err->source) != 0 ||
                    all->items[i].doc != err->doc)
                    continue;
                excluded[i] = 1;
                progress = 1;
                char msg[1024];
                snprintf(msg, sizeof(msg), "%s%s%s", err->field, err->field[0] ? ": " : "",
                         err->message);
                json_object_set_new(statuses, all->items[i].source,
                                    accepted_status(0, "Invalid", msg, all->items[i].obj));
                sl_log_warn("fleet %s: %s left out: %s", fleet, all->items[i].source, msg);
            }
        }
        if (!progress) {
            char *text = sl_errors_format(&errs);
            sl_log_error("fleet %s: config does not compile, keeping the previous one: %s", fleet,
                         text ? text : "?");
            free(text);
            sl_errors_free(&errs);
            break;
        }
        sl_errors_free(&errs);
    }
    free(excluded);
    (void)ctl;
    return snap;
}

static void persist_type(sl_controller_t *ctl, fleet_t *f, int t)
{
    char key[256];
    snprintf(key, sizeof(key), "fleet/%s/%s/version", f->name, sl_xds_type_names[t]);
    sl_store_counter_set(ctl->store, key, f->t[t].version);
    snprintf(key, sizeof(key), "fleet/%s/%s/hash", f->name, sl_xds_type_names[t]);
    sl_store_counter_set(ctl->store, key, f->t[t].hash);
}

static void compile_all(sl_controller_t *ctl)
{
    atomic_fetch_add(&sl_ctrl_metrics.compiles, 1);
    sl_resource_set_t loaded;
    sl_resource_set_init(&loaded);
    const sl_resource_set_t *all = ctl->static_set;
    if (!all) {
        char err[512];
        if (sl_store_load_all(ctl->store, &loaded, err, sizeof(err)) != SL_STORE_OK) {
            sl_log_error("compile: cannot read the store: %s", err);
            atomic_fetch_add(&sl_ctrl_metrics.compile_errors, 1);
            return;
        }
        all = &loaded;
    }
    /* Fleets: every Gateway's, every connected runtime's, and "default". */
    fleet_get(ctl, "default");
    for (size_t i = 0; i < all->count; i++) {
        if (all->items[i].kind != SL_KIND_GATEWAY)
            continue;
        json_t *fl = json_object_get(json_object_get(all->items[i].obj, "spec"), "fleet");
        fleet_get(ctl, json_is_string(fl) ? json_string_value(fl) : "default");
    }
    for (runtime_rec_t *rt = ctl->runtimes; rt; rt = rt->next)
        fleet_get(ctl, rt->fleet_name);

    count_routes(ctl, all);
    json_t *statuses = json_object();
    for (size_t i = 0; i < all->count; i++)
        json_object_set_new(statuses, all->items[i].source,
                            accepted_status(1, "Accepted", "compiled and pushed to the fleets",
                                            all->items[i].obj));

    uint64_t new_version = 0;
    for (fleet_t *f = ctl->fleets; f; f = f->next) {
        Sluice__V1__Snapshot *snap = compile_fleet(ctl, all, f->name, statuses);
        if (!snap) {
            atomic_fetch_add(&sl_ctrl_metrics.compile_errors, 1);
            continue;
        }
        for (int t = 0; t < SL_XDS__COUNT; t++) {
            Sluice__V1__Resource **res;
            uint64_t hash;
            size_t n = type_resources(snap, t, &res, &hash);
            if (hash != f->t[t].hash || !f->t[t].response) {
                if (hash != f->t[t].hash || f->t[t].version == 0) {
                    if (!new_version) {
                        new_version = sl_store_counter_next(ctl->store, "config_version");
                        if (!new_version) {
                            sl_log_error("compile: cannot persist the config version");
                            free_resources(res, n);
                            continue;
                        }
                    }
                    f->t[t].version = new_version;
                    f->t[t].hash = hash;
                    persist_type(ctl, f, t);
                }
                snprintf(f->t[t].version_str, VERSION_LEN, "%" PRIu64, f->t[t].version);
                if (f->t[t].response)
                    grpc_byte_buffer_destroy(f->t[t].response);
                f->t[t].response = encode_response(res, n, t, f->t[t].version_str);
                f->t[t].resources = n;
            }
            free_resources(res, n);
        }
        if (f->snap)
            sl_snapshot_free(f->snap);
        f->snap = snap;
        f->compiled_ok = 1;
    }
    json_decref(ctl->statuses);
    ctl->statuses = statuses;
    sl_resource_set_free(&loaded);
    ctl->config_version = sl_store_counter_get(ctl->store, "config_version");
    atomic_store(&sl_ctrl_metrics.config_version, ctl->config_version);
    ctl->versions_stale = 0;
    if (new_version)
        sl_log_notice("config version %" PRIu64 " compiled", new_version);
    for (fleet_t *f = ctl->fleets; f; f = f->next)
        push_fleet(ctl, f->name);
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void compile_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sl_controller_t *ctl = arg;
    ctl->compile_pending = 0;
    /* Several changes in one window: a burst, widen the window. One: a
     * client making changes one at a time, keep it short. */
    if (ctl->coalesced)
        ctl->window_ms = ctl->window_ms * 2 > COALESCE_MAX_MS ? COALESCE_MAX_MS
                                                               : ctl->window_ms * 2;
    else
        ctl->window_ms = COALESCE_MS;
    ctl->coalesced = 0;
    compile_all(ctl);
    ctl->last_compile_ms = mono_ms();
}

void sl_controller_changed(sl_controller_t *ctl)
{
    /* Coalesce, leading edge first: a change after a quiet spell compiles
     * at once (on the next loop turn, so writes already queued join it), so
     * a single change pays no delay. A change within the window of the last
     * compile waits for the window's end. Windows that gather several
     * changes double the next one (20 ms up to 200 ms), so a long burst of
     * writes makes a handful of compiles and pushes, not one per write,
     * while a client changing one thing at a time keeps the short window. */
    if (ctl->compile_pending) {
        ctl->coalesced++;
        return;
    }
    ctl->compile_pending = 1;
    if (!ctl->window_ms)
        ctl->window_ms = COALESCE_MS;
    uint64_t since = mono_ms() - ctl->last_compile_ms;
    uint64_t wait_ms = since >= ctl->window_ms ? 0 : ctl->window_ms - since;
    struct timeval tv = {0, (suseconds_t)(wait_ms * 1000)};
    evtimer_add(ctl->compile_ev, &tv);
}

/* ---- stream events -------------------------------------------------------- */

static runtime_rec_t *runtime_get(sl_controller_t *ctl, const char *node_id)
{
    for (runtime_rec_t *rt = ctl->runtimes; rt; rt = rt->next)
        if (strcmp(rt->node_id, node_id) == 0)
            return rt;
    runtime_rec_t *rt = calloc(1, sizeof(*rt));
    if (!rt)
        return NULL;
    rt->node_id = strdup(node_id);
    rt->next = ctl->runtimes;
    ctl->runtimes = rt;
    return rt;
}

static void on_open(void *arg, sl_stream_t *s)
{
    (void)arg;
    stream_ctx_t *sc = calloc(1, sizeof(*sc));
    sl_stream_set_user(s, sc);
}

static void on_close(void *arg, sl_stream_t *s)
{
    sl_controller_t *ctl = arg;
    stream_ctx_t *sc = sl_stream_user(s);
    if (sc && sc->rt && sc->rt->stream == s) {
        runtime_rec_t *rt = sc->rt;
        rt->stream = NULL;
        rt->inflight_nonce[0] = '\0';
        rt->disconnected_ms = now_ms();
        atomic_fetch_sub(&sl_ctrl_metrics.runtimes_connected, 1);
        sl_log_notice("runtime %s (fleet %s) disconnected", rt->node_id, rt->fleet_name);
    }
    (void)ctl;
    free(sc);
    sl_stream_set_user(s, NULL);
}

static uint64_t parse_version(const char *v)
{
    char *end;
    unsigned long long n = strtoull(v, &end, 10);
    return (*v && !*end) ? (uint64_t)n : 0;
}

static void on_request(void *arg, sl_stream_t *s, Sluice__V1__DiscoveryRequest *req)
{
    sl_controller_t *ctl = arg;
    stream_ctx_t *sc = sl_stream_user(s);
    if (!sc)
        goto out;
    runtime_rec_t *rt = sc->rt;
    if (!rt) {
        if (!req->node || !req->node->id || !req->node->id[0]) {
            sl_log_warn("stream %s: first request without node.id, ignored", sl_stream_peer(s));
            goto out;
        }
        rt = runtime_get(ctl, req->node->id);
        if (!rt)
            goto out;
        if (rt->stream && rt->stream != s) {
            /* Same node reconnected before we saw the old stream end. */
            atomic_fetch_sub(&sl_ctrl_metrics.runtimes_connected, 1);
            stream_ctx_t *old = sl_stream_user(rt->stream);
            if (old)
                old->rt = NULL;
        }
        sc->rt = rt;
        rt->stream = s;
        const char *fleet = req->node->fleet && req->node->fleet[0] ? req->node->fleet : "default";
        free(rt->fleet_name);
        rt->fleet_name = strdup(fleet);
        free(rt->address);
        rt->address = strdup(sl_stream_peer(s));
        free(rt->build_version);
        rt->build_version = strdup(req->node->build_version ? req->node->build_version : "");
        rt->connected_since_ms = now_ms();
        rt->inflight_nonce[0] = '\0';
        memset(rt->subscribed, 0, sizeof(rt->subscribed));
        atomic_fetch_add(&sl_ctrl_metrics.runtimes_connected, 1);
        sl_log_notice("runtime %s (fleet %s) connected from %s", rt->node_id, rt->fleet_name,
                      rt->address);
        if (!fleet_find(ctl, fleet)) {
            fleet_get(ctl, fleet);
            sl_controller_changed(ctl); /* compile for the new fleet */
        }
    }
    rt->last_seen_ms = now_ms();
    int t = sl_xds_type_from_url(req->type_url ? req->type_url : "");
    if (t < 0) {
        sl_log_warn("runtime %s: unknown type %s ignored", rt->node_id, req->type_url);
        goto out;
    }
    const char *version = req->version_info ? req->version_info : "";
    if (req->response_nonce && req->response_nonce[0]) {
        if (strcmp(req->response_nonce, rt->inflight_nonce) != 0)
            goto out; /* stale: answers a response that was superseded */
        rt->inflight_nonce[0] = '\0';
        if (req->error_detail) {
            snprintf(rt->nack[t].version, VERSION_LEN, "%s", rt->inflight_version);
            free(rt->nack[t].message);
            rt->nack[t].message =
                strdup(req->error_detail->message ? req->error_detail->message : "");
            rt->nack[t].at_ms = now_ms();
            atomic_fetch_add(&sl_ctrl_metrics.nacks, 1);
            sl_log_warn("runtime %s NACKed %s version %s: %s", rt->node_id,
                        sl_xds_type_names[t], rt->inflight_version, rt->nack[t].message);
        } else {
            snprintf(rt->acked[t], VERSION_LEN, "%s", version);
            atomic_fetch_add(&sl_ctrl_metrics.acks, 1);
        }
    } else {
        /* Subscription, also after a reconnect: what does it run already? */
        rt->subscribed[t] = 1;
        snprintf(rt->acked[t], VERSION_LEN, "%s", version);
        uint64_t v = parse_version(version);
        if (v > sl_store_counter_get(ctl->store, "config_version")) {
            /* The runtime runs a newer version than we ever issued (store
             * restored from an old backup?): move past it so runtimes never
             * see a version go backwards. */
            char key[] = "config_version";
            sl_store_counter_set(ctl->store, key, v);
            sl_log_warn("runtime %s runs version %s, newer than the store's; versions continue "
                        "after it",
                        rt->node_id, version);
            for (fleet_t *f = ctl->fleets; f; f = f->next)
                for (int i = 0; i < SL_XDS__COUNT; i++)
                    f->t[i].hash = 0; /* force new versions on the next compile */
            ctl->versions_stale = 1;
            sl_controller_changed(ctl);
            /* Nothing now: what we hold carries older versions. The compile
             * gives every type a version past the runtime's and pushes. */
            goto out;
        }
    }
    try_push(ctl, rt);
out:
    protobuf_c_message_free_unpacked(&req->base, NULL);
}

/* ---- JSON views ----------------------------------------------------------- */

json_t *sl_controller_object_status(sl_controller_t *ctl, enum sl_kind kind, const char *ns,
                                    const char *name)
{
    char key[600];
    snprintf(key, sizeof(key), "%s/%s/%s", sl_kind_plural(kind), ns, name);
    json_t *st = json_object_get(ctl->statuses, key);
    return st ? json_incref(st) : NULL;
}

json_t *sl_controller_runtimes_json(sl_controller_t *ctl)
{
    json_t *arr = json_array();
    for (runtime_rec_t *rt = ctl->runtimes; rt; rt = rt->next) {
        char since[32] = "", seen[32] = "", gone[32] = "";
        if (rt->connected_since_ms)
            iso_time(rt->connected_since_ms, since, sizeof(since));
        if (rt->last_seen_ms)
            iso_time(rt->last_seen_ms, seen, sizeof(seen));
        if (rt->disconnected_ms)
            iso_time(rt->disconnected_ms, gone, sizeof(gone));
        json_t *types = json_object();
        const char *min_acked = NULL;
        uint64_t min_v = UINT64_MAX;
        json_t *last_nack = json_null();
        uint64_t last_nack_at = 0;
        for (int t = 0; t < SL_XDS__COUNT; t++) {
            json_t *ty = json_pack("{s:s}", "acked_version", rt->acked[t]);
            if (rt->nack[t].message) {
                char at[32];
                iso_time(rt->nack[t].at_ms, at, sizeof(at));
                json_object_set_new(ty, "nack",
                                    json_pack("{s:s, s:s, s:s}", "version", rt->nack[t].version,
                                              "message", rt->nack[t].message, "at", at));
                if (rt->nack[t].at_ms >= last_nack_at) {
                    last_nack_at = rt->nack[t].at_ms;
                    json_decref(last_nack);
                    last_nack = json_pack("{s:s, s:s, s:s, s:s}", "type", sl_xds_type_names[t],
                                          "version", rt->nack[t].version, "message",
                                          rt->nack[t].message, "at", at);
                }
            }
            json_object_set_new(types, sl_xds_type_names[t], ty);
            uint64_t v = parse_version(rt->acked[t]);
            if (v < min_v) {
                min_v = v;
                min_acked = rt->acked[t];
            }
        }
        /* The runtime runs config version V when every type is at <= V and
         * the newest type version it acknowledged is V. */
        uint64_t max_v = 0;
        for (int t = 0; t < SL_XDS__COUNT; t++) {
            uint64_t v = parse_version(rt->acked[t]);
            if (v > max_v)
                max_v = v;
        }
        (void)min_acked;
        json_array_append_new(
            arr, json_pack("{s:s, s:s, s:s, s:s, s:b, s:s, s:s, s:s, s:I, s:o, s:o, s:I}",
                           "node_id", rt->node_id, "fleet", rt->fleet_name ? rt->fleet_name : "",
                           "address", rt->address ? rt->address : "", "build_version",
                           rt->build_version ? rt->build_version : "", "connected",
                           rt->stream != NULL, "connected_since", since, "last_seen", seen,
                           "disconnected_at", gone, "acked_version", (json_int_t)max_v, "types",
                           types, "last_nack", last_nack, "responses_sent",
                           (json_int_t)rt->responses_sent));
    }
    return arr;
}

/* A runtime is "at" the fleet's version when it acknowledged every type's
 * current version. */
static int runtime_in_sync(const runtime_rec_t *rt, const fleet_t *f)
{
    for (int t = 0; t < SL_XDS__COUNT; t++)
        if (strcmp(rt->acked[t], f->t[t].version_str) != 0)
            return 0;
    return 1;
}

json_t *sl_controller_status_json(sl_controller_t *ctl)
{
    json_t *fleets = json_object();
    for (fleet_t *f = ctl->fleets; f; f = f->next) {
        uint64_t v = 0;
        for (int t = 0; t < SL_XDS__COUNT; t++)
            if (f->t[t].version > v)
                v = f->t[t].version;
        int connected = 0, at = 0;
        for (runtime_rec_t *rt = ctl->runtimes; rt; rt = rt->next) {
            if (!rt->stream || strcmp(rt->fleet_name, f->name) != 0)
                continue;
            connected++;
            at += runtime_in_sync(rt, f);
        }
        json_object_set_new(fleets, f->name,
                            json_pack("{s:I, s:b, s:i, s:i}", "version", (json_int_t)v,
                                      "compiled", f->compiled_ok, "runtimes_connected", connected,
                                      "runtimes_at_version", at));
    }
    return json_pack("{s:I, s:o}", "config_version", (json_int_t)ctl->config_version, "fleets",
                     fleets);
}

/* ---- life cycle ----------------------------------------------------------- */

sl_controller_t *sl_controller_new(struct event_base *base, sl_store_t *store,
                                   const sl_resource_set_t *static_set)
{
    sl_controller_t *ctl = calloc(1, sizeof(*ctl));
    if (!ctl)
        return NULL;
    ctl->base = base;
    ctl->store = store;
    ctl->static_set = static_set;
    ctl->statuses = json_object();
    ctl->api_routes = json_object();
    ctl->max_routes = 200000;
    ctl->compile_ev = evtimer_new(base, compile_cb, ctl);
    if (!ctl->compile_ev) {
        free(ctl);
        return NULL;
    }
    ctl->config_version = sl_store_counter_get(store, "config_version");
    atomic_store(&sl_ctrl_metrics.config_version, ctl->config_version);
    return ctl;
}

void sl_controller_compile_now(sl_controller_t *ctl)
{
    if (ctl->compile_pending) {
        evtimer_del(ctl->compile_ev);
        ctl->compile_pending = 0;
    }
    compile_all(ctl);
    ctl->last_compile_ms = mono_ms();
}

sl_stream_hooks_t sl_controller_stream_hooks(sl_controller_t *ctl)
{
    sl_stream_hooks_t h = {.on_open = on_open, .on_request = on_request, .on_close = on_close,
                           .ctx = ctl};
    return h;
}

void sl_controller_free(sl_controller_t *ctl)
{
    if (!ctl)
        return;
    event_free(ctl->compile_ev);
    fleet_t *f = ctl->fleets;
    while (f) {
        fleet_t *next = f->next;
        fleet_free(f);
        f = next;
    }
    runtime_rec_t *rt = ctl->runtimes;
    while (rt) {
        runtime_rec_t *next = rt->next;
        for (int t = 0; t < SL_XDS__COUNT; t++)
            free(rt->nack[t].message);
        free(rt->node_id);
        free(rt->fleet_name);
        free(rt->address);
        free(rt->build_version);
        free(rt);
        rt = next;
    }
    json_decref(ctl->statuses);
    json_decref(ctl->api_routes);
    free(ctl);
}
