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
 *    routes arrive (runtime/control/xds.c);
 *  - a NACKed (type, version) is not sent again on the stream that NACKed
 *    it; the next config change produces a new version, which is. A new
 *    stream (a restarted runtime), or a subscription reporting another
 *    version, starts fresh: the reason for the NACK (a busy port) may be gone;
 *  - every response carries a nonce unique for the controller's life; an
 *    ACK/NACK is matched to the response in flight by its nonce and must
 *    name the same type, and the type and version it settles are those that
 *    were sent. Anything else is stale and ignored;
 *  - one stream per node id: a newer stream of the same node closes the
 *    older one with ALREADY_EXISTS, so no runtime keeps an open stream that
 *    never gets another update;
 *  - state kept for unauthenticated peers is bounded: a node is registered
 *    only by a valid subscription, records of disconnected runtimes expire
 *    and their number is capped, NACK reasons are kept to 4 KiB.
 *
 * Versions: one durable, monotonic config version (store counter). A
 * compile bumps it only if some type's content changed, and a type keeps the
 * version at which its content last changed; both are persisted per fleet
 * with the content hash, so a restarted controller continues the sequence
 * and a runtime reconnecting with what it already runs gets no re-push.
 * Versions a runtime reports are checked (decimal, at most 2^53 - 1, at most
 * VERSION_MAX_AHEAD past ours) before they can move ours: any client of the
 * stream port could otherwise exhaust the version space for the whole fleet.
 * A version that cannot be persisted fails the whole compile: nothing is
 * pushed under a version the store does not hold; /readyz and
 * /api/v1/status say why, and the compile is retried.
 *
 * --source kubernetes (sl_controller_use_input): no counter; versions are
 * derived from the input (the newest config resourceVersion, ksource.c),
 * every type takes the new version when anything changed, nothing is
 * persisted: every replica, and a restarted one, gives the same input the
 * same version (docs/architecture.md has the limits).
 *
 * A store shared by several replicas (PostgreSQL,
 * sl_controller_use_store_versions): derived versions too, the input's
 * version being the store's config resourceVersion read with the objects
 * (sl_store_loaded_version); a compile whose input moved gives every type
 * that version even when the content did not change, so a replica's
 * versions depend only on the store's state, never on what it happened to
 * see before.
 */
#include "controller.h"
#include "prom.h"

#include "compiler.h"
#include "consumers.h"
#include "core.h"
#include "ctrl_metrics.h"
#include "policy.h"
#include "grpc_util.h"
#include "log.h"
#include "stream.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

sl_ctrl_metrics_t sl_ctrl_metrics;

#define COALESCE_MS 20      /* first window of a burst */
#define COALESCE_MAX_MS 200 /* the window doubles up to this while writes keep coming */
#define VERSION_LEN 24
/* A runtime may report a version at most this far past the store's (a store
 * restored from a backup that old); a stray client cannot push the counter
 * to the end of its range (about 9e9 subscriptions would be needed). */
#define VERSION_MAX_AHEAD 1000000ULL
#define NACK_MESSAGE_MAX 4096 /* bytes of a NACK reason kept and shown */
#define NODE_FIELD_MAX 253    /* node.id and node.fleet: a DNS name's length */
#define BUILD_VERSION_MAX 128
#define RETRY_MIN_MS 1000 /* compile retry after a store failure, doubling */
#define RETRY_MAX_MS 30000

/* Delta mode: one resource of a fleet's type as compiled, shared by every
 * runtime of the fleet. `wire` is the resource already framed as field 2
 * of a DiscoveryResponse (tag, length, packed Resource with its version):
 * a delta response is a small per-runtime header followed by references to
 * these slices, never a copy. Rebuilt per compile only for resources whose
 * content changed; unchanged ones keep their slice (a reference). */
typedef struct {
    char *name;
    char version[17]; /* 16 hex digits of FNV-1a 64 over name and value */
    uint64_t hash;    /* that hash */
    grpc_slice wire;
} res_entry_t;

/* A set of (name, version) pairs summed into two words per pair
 * (digest_pair): equal sets have equal digests whatever their order, so
 * "this runtime holds exactly the fleet's resources", or exactly those of
 * the fleet's previous compile, is a comparison of the digests and sizes
 * instead of a walk of both sets per runtime and per push. */
typedef struct {
    uint64_t a, b;
} digest_t;

typedef struct fleet {
    char *name;
    size_t idx; /* creation order (fleets are never removed): res_facts_t.prog_vals */
    /* The fleet-level part of the last compile (settings, listeners,
     * certificates); every type's resources are t[].res. */
    Sluice__V1__Snapshot *snap;
    int compiled_ok;
    /* Per-resource compile cache (sl_compile_cached). */
    sl_ccache_t *cache;
    struct {
        /* The type's compiled resources (shared with the cache: a resource
         * that did not change keeps its packed bytes and hash). */
        sl_cres_t **res;
        size_t n;
        uint64_t version;
        uint64_t hash;
        char version_str[VERSION_LEN];
        /* The packed DiscoveryResponse without its nonce: each send appends
         * its own nonce field (response_with_nonce), so one encoding still
         * serves every runtime. */
        grpc_slice body;
        int body_ready; /* encoded on the first sotw send of the version */
        int encoded;    /* the type has been compiled (version_str, res, ents) */
        size_t resources;
        /* Delta: the same resources by name (index: name -> position). */
        res_entry_t *ents;
        size_t n_ents;
        json_t *index;
        /* The entries' digest; the previous entries' digest and size, and
         * what changed since them (positions in ents, names gone), so a
         * runtime that holds the previous entries gets exactly that. */
        digest_t dig, prev_dig;
        size_t prev_n;
        size_t *diff_chg;
        size_t n_diff_chg;
        char **diff_removed;
        size_t n_diff_removed;
        int diff_ok;
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
    /* The version of each type NACKed on the current stream: not re-sent
     * on it. Cleared by a new stream or a subscription to another version. */
    char parked[SL_XDS__COUNT][VERSION_LEN];
    char inflight_nonce[32];
    int inflight_type;
    char inflight_version[VERSION_LEN];
    uint64_t inflight_sent_us; /* when the response in flight was sent (monotonic) */
    /* Streams of this node closed because a newer one arrived. */
    uint64_t streams_replaced;
    char *replaced_address, *replaced_by;
    uint64_t replaced_at_ms;
    struct {
        char version[VERSION_LEN];
        char *message;
        uint64_t at_ms;
    } nack[SL_XDS__COUNT];
    uint64_t responses_sent;
    uint64_t bytes_sent, resources_sent;
    /* Delta streams (rt->delta): per type what the runtime holds, what it
     * rejected on this stream, what it subscribed to; and the resources of
     * the response in flight. */
    int delta;
    struct {
        json_t *have;   /* name -> version held (initial_resource_versions, ACKs) */
        digest_t dig;   /* of have: changed by have_set / have_del only */
        json_t *parked; /* name -> version NACKed on this stream ("" = its removal) */
        json_t *subs;   /* NULL = wildcard, else name -> true */
        /* The type's version_info it runs (subscription, then ACKs): when
         * the fleet's differs, a response goes out even with no resource
         * in it, so versions move as in sotw (a new runtime learns that a
         * type is empty; a renumbering reaches every type). */
        char version[VERSION_LEN];
    } d[SL_XDS__COUNT];
    json_t *inflight_sent;    /* name -> version */
    json_t *inflight_removed; /* names */
    struct runtime_rec *next;
} runtime_rec_t;

typedef struct {
    runtime_rec_t *rt; /* set by the first valid subscription */
    /* The node, from the first request that carries it, until registered. */
    char *node_id, *fleet, *build_version;
    int refused;           /* closed by us: later requests are ignored */
    int mode_known, delta; /* sotw or delta, from the first request */
    int warned_unknown;    /* one warning per stream for unknown types */
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
    size_t n_runtimes;
    size_t max_runtimes;        /* --max-runtimes */
    uint64_t runtime_expiry_ms; /* --runtime-expiry */
    struct event *sweep_ev;
    uint64_t nonce_seq;
    /* Why versions cannot be persisted ("" when they can); the compile is
     * retried by retry_ev with a doubling delay. */
    char version_error[512];
    struct event *retry_ev;
    uint64_t retry_ms;
    json_t *statuses; /* "<plural>/<ns>/<name>" -> status object */
    uint64_t config_version;
    /* A runtime runs newer versions than ours: push nothing until the
     * compile has given every type a version past it. */
    int versions_stale;
    /* The newest version a runtime reported, when past the store's: the
     * next version allocated is above it. */
    uint64_t version_floor;
    /* Routes per Api ("ns/name" -> operations), for admission. Apis apply
     * to every fleet, so the total is each fleet's route count. Brought
     * back to the set's counts by every compile (count_routes). */
    json_t *api_routes;
    uint64_t total_routes;
    uint64_t max_routes;
    /* Where each Api's and Gateway's current spec is programmed:
     * "apis/<ns>/<name>" or "gateways/<ns>/<name>" -> {"hash": spec hash,
     * "generation": N, "fleets": {<fleet>: V}}, V the routes (Api) or
     * listeners (Gateway) version of the first snapshot of that fleet that
     * contains the spec (0: the fleet's snapshot does not contain it). An
     * Api has every fleet, a Gateway only its own. Brought up to date by
     * every committed compile (record_programmed, which rewrites only the
     * records that changed); the Programmed condition is computed from it and
     * the runtimes' ACKs when the status is read (object_programmed). */
    json_t *programmed;
    size_t n_fleets;
    /* The facts of the last committed compile's resources, in set order
     * (facts_align); facts_tracked: they are of the store's set and
     * statuses, programmed and api_routes are in step with them, so the
     * next compile of the store only visits what changed. */
    struct res_facts **facts;
    size_t n_facts;
    int facts_tracked;
    /* api_routes' values before sl_controller_admit or _forget first
     * changed them since the last count ("ns/name" -> count, null when
     * absent): a write admitted but not stored is undone by the count. */
    json_t *routes_undo;
    /* --source kubernetes: versions from the input (sl_controller_use_input). */
    int derived_versions;
    int store_versions; /* derived from the shared store's state */
    int input_ready;
    uint64_t input_version;
    void (*compiled_fn)(void *arg);
    void *compiled_arg;
    /* A store shared by replicas (replicas.c): this replica's name (NULL
     * for a single controller), who to tell when its runtimes change, the
     * other live replicas' runtimes (one document per node id, the best
     * row among them: connected, newest connection) and the live replicas;
     * peer_error: why the others cannot be counted ("" when they are). */
    char *replica;
    void (*runtimes_fn)(void *arg);
    void *runtimes_arg;
    json_t *peers;
    json_t *peer_live;
    char peer_error[600];
};

/* One of this replica's runtimes connected, disconnected, ACKed or NACKed,
 * or its record was forgotten. */
static void runtimes_changed(sl_controller_t *ctl)
{
    if (ctl->runtimes_fn)
        ctl->runtimes_fn(ctl->runtimes_arg);
}

static uint64_t api_route_count(json_t *doc)
{
    json_t *ops = json_object_get(json_object_get(doc, "spec"), "operations");
    return json_is_array(ops) ? json_array_size(ops) : 0;
}

/* Keeps what api_routes held for `key` before its first change since the
 * last count, so that the count can undo a write that was not stored. */
static void routes_note(sl_controller_t *ctl, const char *key)
{
    if (!ctl->routes_undo && !(ctl->routes_undo = json_object())) {
        ctl->facts_tracked = 0;
        return;
    }
    if (json_object_get(ctl->routes_undo, key))
        return;
    json_t *v = json_object_get(ctl->api_routes, key);
    if (json_object_set_new(ctl->routes_undo, key, v ? json_incref(v) : json_null()) != 0)
        ctl->facts_tracked = 0; /* the next compile counts every Api */
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
        routes_note(ctl, key);
        json_object_set_new(ctl->api_routes, key, json_integer((json_int_t)api_route_count(doc)));
    }
    ctl->total_routes = total;
    return 0;
}

void sl_controller_forget(sl_controller_t *ctl, enum sl_kind kind, const char *ns, const char *name)
{
    if (kind != SL_KIND_API)
        return;
    char key[600];
    snprintf(key, sizeof(key), "%s/%s", ns, name);
    ctl->total_routes -= (uint64_t)json_integer_value(json_object_get(ctl->api_routes, key));
    routes_note(ctl, key);
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

/* ---- resource facts --------------------------------------------------------- */

/*
 * What a compile needs of each resource besides compiling it: its routes
 * (admission), its spec's hash and whether it has policies, its generation,
 * the status committed for it and its record in ctl->programmed (mirrored
 * here, so that deciding that a record stays is a few compares, not jansson
 * lookups).
 *
 * Why per resource: a change of one Api among thousands must cost the
 * compile in proportion to the change. The store's in-memory documents are
 * never changed in place (a write gives the resource a new object), so a
 * resource whose object is the one of the last committed compile has the
 * same facts, and its record is carried over (shared by both arrays);
 * holding the document keeps its address from being reused by another.
 * Other sets (--resources, --source kubernetes) are not trusted that way:
 * each compile makes every record afresh, as if nothing were carried.
 *
 * A record is changed only once the compile that uses it commits, so a
 * compile that fails leaves the committed array as it was.
 */
typedef struct res_facts {
    unsigned refs; /* the committed array and the one being compiled */
    json_t *obj;   /* the document (a reference) */
    char *source;
    char *key; /* "ns/name": api_routes' key, an Api's route table */
    enum sl_kind kind;
    json_int_t generation; /* metadata.generation, 1 when absent */
    uint64_t routes;       /* an Api's operations */
    uint64_t spec_hash;    /* Apis and Gateways: FNV-1a of the spec's canonical JSON */
    int has_policies;
    /* The status committed for it (a reference; NULL: not known here) and
     * whether it is a plain Accepted one (a single condition, reason
     * Accepted) of observedGeneration status_gen, which the next compile
     * may reuse. */
    json_t *status;
    int status_plain;
    json_int_t status_gen;
    /* Its record in ctl->programmed, when prog_known: hash, generation,
     * version per fleet (by fleet idx; -1: none) and how many fleets. */
    int prog_known;
    uint64_t prog_hash;
    json_int_t prog_gen;
    json_int_t *prog_vals;
    size_t n_prog_vals, prog_nset;
} res_facts_t;

static int has_policies(json_t *spec)
{
    if (json_array_size(json_object_get(spec, "policies")))
        return 1;
    json_t *ops = json_object_get(spec, "operations");
    for (size_t i = 0; i < json_array_size(ops); i++)
        if (json_array_size(json_object_get(json_array_get(ops, i), "policies")))
            return 1;
    return 0;
}

static void facts_unref(res_facts_t *e)
{
    if (!e || --e->refs)
        return;
    json_decref(e->obj);
    json_decref(e->status);
    free(e->source);
    free(e->key);
    free(e->prog_vals);
    free(e);
}

static void facts_release(res_facts_t **facts, size_t n)
{
    for (size_t i = 0; facts && i < n; i++)
        facts_unref(facts[i]);
    free(facts);
}

static res_facts_t *facts_new(const sl_resource_t *r)
{
    res_facts_t *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->refs = 1;
    e->obj = json_incref(r->obj);
    e->kind = r->kind;
    char key[600];
    snprintf(key, sizeof(key), "%s/%s", r->ns, r->name);
    e->source = strdup(r->source);
    e->key = strdup(key);
    if (!e->source || !e->key) {
        facts_unref(e);
        return NULL;
    }
    json_t *gen = json_object_get(json_object_get(r->obj, "metadata"), "generation");
    e->generation = json_is_integer(gen) ? json_integer_value(gen) : 1;
    if (r->kind == SL_KIND_API)
        e->routes = api_route_count(r->obj);
    if (r->kind == SL_KIND_API || r->kind == SL_KIND_GATEWAY) {
        json_t *spec = json_object_get(r->obj, "spec");
        char *text = json_dumps(spec, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
        e->spec_hash = fnv1a(0xcbf29ce484222325ULL, text ? text : "", text ? strlen(text) : 0);
        free(text);
        e->has_policies = has_policies(spec);
    }
    return e;
}

/*
 * The facts of every resource of `all`, in set order (a new array; NULL
 * when out of memory). With `carry`, the committed array's record of the
 * same document is shared (changed[i] = 0), found where it was or, after
 * an insertion or removal moved the rest, by source; kept[j] says that the
 * committed array's j-th resource is still in the set (possibly as
 * another document). Without, every record is new (changed[i] = 1).
 */
static res_facts_t **facts_align(sl_controller_t *ctl, const sl_resource_set_t *all, int carry,
                                 uint8_t *changed, uint8_t *kept)
{
    size_t n = all->count, m = carry ? ctl->n_facts : 0;
    res_facts_t **old = ctl->facts;
    res_facts_t **out = calloc(n ? n : 1, sizeof(*out));
    json_t *by_source = NULL; /* source -> position in old, built on first need */
    size_t shift = 0;         /* old position - new position, modulo 2^64 */
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        const sl_resource_t *r = &all->items[i];
        size_t j = i + shift;
        int found = j < m && (old[j]->obj == r->obj || strcmp(old[j]->source, r->source) == 0);
        if (!found && m) {
            if (!by_source) {
                if (!(by_source = json_object()))
                    goto fail;
                for (size_t k = 0; k < m; k++)
                    if (json_object_set_new(by_source, old[k]->source, json_integer((json_int_t)k)))
                        goto fail;
            }
            json_t *pos = json_object_get(by_source, r->source);
            if (pos) {
                j = (size_t)json_integer_value(pos);
                shift = j - i;
                found = 1;
            }
        }
        found = found && !kept[j];
        if (found)
            kept[j] = 1;
        if (found && old[j]->obj == r->obj) {
            out[i] = old[j];
            out[i]->refs++;
            changed[i] = 0;
            continue;
        }
        if (!(out[i] = facts_new(r)))
            goto fail;
        changed[i] = 1;
    }
    json_decref(by_source);
    return out;
fail:
    json_decref(by_source);
    facts_release(out, n);
    return NULL;
}

/*
 * Sets with one source per resource (the store's) keep each resource's
 * status and spec facts under its own source. A file of --resources holds
 * several documents under one source: as when statuses and spec facts were
 * maps by source, the statuses of one source are one (slot[i], the first
 * resource with that source), and an Api or Gateway gets the spec facts of
 * the last Api or Gateway with its source (memo_of[i]). -1 when out of memory.
 */
static int facts_slots(const sl_resource_set_t *all, int unique, size_t *slot, size_t *memo_of)
{
    for (size_t i = 0; i < all->count; i++)
        slot[i] = memo_of[i] = i;
    if (unique)
        return 0;
    json_t *first = json_object(), *last = json_object();
    int rc = first && last ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < all->count; i++) {
        const sl_resource_t *r = &all->items[i];
        json_t *f = json_object_get(first, r->source);
        if (f)
            slot[i] = (size_t)json_integer_value(f);
        else if (json_object_set_new(first, r->source, json_integer((json_int_t)i)) != 0)
            rc = -1;
        if ((r->kind == SL_KIND_API || r->kind == SL_KIND_GATEWAY) &&
            json_object_get(r->obj, "spec") &&
            json_object_set_new(last, r->source, json_integer((json_int_t)i)) != 0)
            rc = -1;
    }
    for (size_t i = 0; rc == 0 && i < all->count; i++) {
        json_t *l = json_object_get(last, all->items[i].source);
        if (l)
            memo_of[i] = (size_t)json_integer_value(l);
    }
    json_decref(first);
    json_decref(last);
    return rc;
}

/*
 * Routes per Api for admission (api_routes, total_routes). Writes admitted
 * since the last count are first undone (a write may have been refused by
 * the store after admission); then the Apis gone since the committed facts
 * (`incr`) lose their count and new or rewritten ones get theirs. A map
 * that does not hold exactly the set's Apis after that is rebuilt.
 */
static void count_routes(sl_controller_t *ctl, res_facts_t **facts, const uint8_t *changed,
                         size_t n, const uint8_t *kept, int incr)
{
    const char *key;
    json_t *v;
    json_object_foreach(ctl->routes_undo, key, v)
    {
        if (json_is_null(v))
            json_object_del(ctl->api_routes, key);
        else
            json_object_set(ctl->api_routes, key, v);
    }
    json_object_clear(ctl->routes_undo);
    for (size_t j = 0; incr && j < ctl->n_facts; j++)
        if (!kept[j] && ctl->facts[j]->kind == SL_KIND_API)
            json_object_del(ctl->api_routes, ctl->facts[j]->key);
    uint64_t total = 0;
    size_t napis = 0;
    for (size_t i = 0; i < n; i++) {
        const res_facts_t *e = facts[i];
        if (e->kind != SL_KIND_API)
            continue;
        total += e->routes;
        napis++;
        if (!changed[i])
            continue;
        v = json_object_get(ctl->api_routes, e->key);
        if (!v || (uint64_t)json_integer_value(v) != e->routes)
            json_object_set_new(ctl->api_routes, e->key, json_integer((json_int_t)e->routes));
    }
    ctl->total_routes = total;
    if (json_object_size(ctl->api_routes) == napis)
        return;
    json_object_clear(ctl->api_routes);
    for (size_t i = 0; i < n; i++)
        if (facts[i]->kind == SL_KIND_API)
            json_object_set_new(ctl->api_routes, facts[i]->key,
                                json_integer((json_int_t)facts[i]->routes));
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
    f->idx = ctl->n_fleets++;
    /* What this fleet's runtimes may already run, from before a restart. */
    for (int t = 0; t < SL_XDS__COUNT && !ctl->derived_versions; t++) {
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

static void entries_free(res_entry_t *ents, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(ents[i].name);
        grpc_slice_unref(ents[i].wire);
    }
    free(ents);
}

static uint64_t digest_mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

/* Adds (sign 1) or takes out (sign -1) one pair. */
static void digest_pair(digest_t *d, const char *name, const char *version, int sign)
{
    uint64_t h = fnv1a(0xcbf29ce484222325ULL, name, strlen(name) + 1);
    h = fnv1a(h, version, strlen(version));
    uint64_t a = digest_mix(h ^ 0x9e3779b97f4a7c15ULL), b = digest_mix(h + 0x6a09e667f3bcc909ULL);
    d->a += sign > 0 ? a : -a;
    d->b += sign > 0 ? b : -b;
}

static int digest_eq(const digest_t *x, const digest_t *y)
{
    return x->a == y->a && x->b == y->b;
}

static void diff_free(fleet_t *f, int t)
{
    for (size_t i = 0; i < f->t[t].n_diff_removed; i++)
        free(f->t[t].diff_removed[i]);
    free(f->t[t].diff_removed);
    free(f->t[t].diff_chg);
    f->t[t].diff_removed = NULL;
    f->t[t].diff_chg = NULL;
    f->t[t].n_diff_removed = f->t[t].n_diff_chg = 0;
    f->t[t].diff_ok = 0;
}

static void cres_release(sl_cres_t **res, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sl_cres_unref(res[i]);
    free(res);
}

static void fleet_free(fleet_t *f)
{
    sl_ccache_free(f->cache);
    for (int t = 0; t < SL_XDS__COUNT; t++) {
        cres_release(f->t[t].res, f->t[t].n);
        if (f->t[t].body_ready)
            grpc_slice_unref(f->t[t].body);
        entries_free(f->t[t].ents, f->t[t].n_ents);
        json_decref(f->t[t].index);
        diff_free(f, t);
    }
    if (f->snap)
        sl_snapshot_free(f->snap);
    free(f->name);
    free(f);
}

/* The compiled resources of one type (new references) and their content
 * hash, a hash of each resource's hash: Backends, Apis and Consumers come
 * packed from the compile cache, unchanged ones with their hash already
 * computed; settings, listeners and certificates (few) are packed here. */
static size_t type_resources(const sl_compiled_t *comp, int type, sl_cres_t ***out, uint64_t *hash)
{
    const Sluice__V1__Snapshot *snap = comp->snap;
    size_t n = 0;
    int k = -1;
    Sluice__V1__GatewaySettings empty_settings = SLUICE__V1__GATEWAY_SETTINGS__INIT;
    switch (type) {
    case SL_XDS_SECRET:
        n = snap->n_certificates;
        break;
    case SL_XDS_CONSUMER:
        k = SL_CRES_CONSUMER;
        break;
    case SL_XDS_CLUSTER:
        k = SL_CRES_CLUSTER;
        break;
    case SL_XDS_ROUTE:
        k = SL_CRES_ROUTE;
        break;
    case SL_XDS_LISTENER:
        n = snap->n_listeners;
        break;
    case SL_XDS_SETTINGS:
        n = 1;
        break;
    }
    if (k >= 0)
        n = comp->n[k];
    sl_cres_t **res = calloc(n ? n : 1, sizeof(*res));
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; res && i < n; i++) {
        switch (type) {
        case SL_XDS_SECRET:
            res[i] =
                sl_cres_from_message(snap->certificates[i]->name, &snap->certificates[i]->base);
            break;
        case SL_XDS_LISTENER:
            res[i] = sl_cres_from_message(snap->listeners[i]->name, &snap->listeners[i]->base);
            break;
        case SL_XDS_SETTINGS:
            res[i] = sl_cres_from_message("settings", snap->settings ? &snap->settings->base
                                                                     : &empty_settings.base);
            break;
        default:
            res[i] = sl_cres_ref(comp->res[k][i]);
        }
        if (!res[i]) {
            cres_release(res, i);
            res = NULL;
            break;
        }
        uint8_t le[8];
        for (int b = 0; b < 8; b++)
            le[b] = (uint8_t)(res[i]->hash >> (8 * b));
        h = fnv1a(h, le, sizeof(le));
    }
    *out = res;
    *hash = h ? h : 1;
    return res ? n : 0;
}

/* The response of one type without its nonce, packed once per version. */
static grpc_slice encode_response(sl_cres_t **cres, size_t n, int type, const char *version)
{
    Sluice__V1__Resource *rs = calloc(n ? n : 1, sizeof(*rs));
    Sluice__V1__Resource **res = calloc(n ? n : 1, sizeof(*res));
    Sluice__V1__DiscoveryResponse resp = SLUICE__V1__DISCOVERY_RESPONSE__INIT;
    if (!rs || !res) {
        free(rs);
        free(res);
        return grpc_empty_slice();
    }
    for (size_t i = 0; i < n; i++) {
        sluice__v1__resource__init(&rs[i]);
        rs[i].name = cres[i]->name;
        rs[i].type_url = (char *)sl_xds_type_urls[type];
        rs[i].value.data = cres[i]->data;
        rs[i].value.len = cres[i]->len;
        res[i] = &rs[i];
    }
    resp.version_info = (char *)version;
    resp.type_url = (char *)sl_xds_type_urls[type];
    resp.n_resources = n;
    resp.resources = res;
    size_t len = protobuf_c_message_get_packed_size(&resp.base);
    grpc_slice slice = grpc_slice_malloc(len);
    protobuf_c_message_pack(&resp.base, GRPC_SLICE_START_PTR(slice));
    free(rs);
    free(res);
    return slice;
}

/*
 * One send of a response: the shared body plus its own nonce. Protobuf
 * parsers read a field appended after a message's bytes as part of it, so
 * the body is never copied (a large snapshot is referenced, not re-encoded,
 * for every runtime).
 */
static grpc_byte_buffer *response_with_nonce(grpc_slice body, const char *nonce)
{
    uint8_t tail[2 + 32];
    size_t len = strlen(nonce);
    if (len > sizeof(tail) - 2)
        len = sizeof(tail) - 2;
    tail[0] = (4 << 3) | 2; /* field 4 (nonce), length-delimited */
    tail[1] = (uint8_t)len; /* < 128: a one-byte varint */
    memcpy(tail + 2, nonce, len);
    grpc_slice parts[2] = {body, grpc_slice_from_copied_buffer((const char *)tail, len + 2)};
    /* Takes its own references on both slices. */
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(parts, 2);
    grpc_slice_unref(parts[1]);
    return bb;
}

/* ---- delta ------------------------------------------------------------------ */

/* Pushed by mode (0 sotw, 1 delta): responses, bytes, resources. */
static _Atomic uint64_t push_count[2], push_bytes[2], push_resources[2];

static void count_push(runtime_rec_t *rt, int delta, size_t bytes, size_t resources)
{
    atomic_fetch_add(&push_count[delta], 1);
    atomic_fetch_add(&push_bytes[delta], bytes);
    atomic_fetch_add(&push_resources[delta], resources);
    rt->bytes_sent += bytes;
    rt->resources_sent += resources;
}

static size_t varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/*
 * The delta entries of one type from this compile's packed resources. A
 * resource whose version (content hash) is that of the previous compile
 * keeps its slice; only changed ones are packed again.
 */
/* Field 2 of a DiscoveryResponse: one Resource with its version. */
static grpc_slice entry_wire(int t, const sl_cres_t *res, char *version)
{
    Sluice__V1__Resource r = SLUICE__V1__RESOURCE__INIT;
    r.name = res->name;
    r.type_url = (char *)sl_xds_type_urls[t];
    r.value.data = res->data;
    r.value.len = res->len;
    r.version = version;
    size_t len = protobuf_c_message_get_packed_size(&r.base);
    uint8_t head[11];
    head[0] = (2 << 3) | 2; /* field 2 (resources), length-delimited */
    size_t hl = 1 + varint(head + 1, len);
    grpc_slice wire = grpc_slice_malloc(hl + len);
    memcpy(GRPC_SLICE_START_PTR(wire), head, hl);
    protobuf_c_message_pack(&r.base, GRPC_SLICE_START_PTR(wire) + hl);
    return wire;
}

static int build_entries(fleet_t *f, int t, sl_cres_t **res, size_t n)
{
    /* What a runtime holding the current entries would need: recorded
     * below as the diff from them (diff_ok once it is whole). */
    diff_free(f, t);
    f->t[t].prev_dig = f->t[t].dig;
    f->t[t].prev_n = f->t[t].n_ents;
    size_t *chg = calloc(n + 1, sizeof(*chg));
    size_t nchg = 0;
    /* The same names in the same order (a change to existing resources):
     * only the entries whose version moved are replaced, in place. */
    int same_names = f->t[t].ents && f->t[t].index && n == f->t[t].n_ents;
    for (size_t i = 0; same_names && i < n; i++)
        same_names = strcmp(f->t[t].ents[i].name, res[i]->name) == 0;
    if (same_names) {
        for (size_t i = 0; i < n; i++) {
            res_entry_t *e = &f->t[t].ents[i];
            if (res[i]->hash == e->hash)
                continue;
            digest_pair(&f->t[t].dig, e->name, e->version, -1);
            e->hash = res[i]->hash;
            snprintf(e->version, sizeof(e->version), "%016" PRIx64, res[i]->hash);
            digest_pair(&f->t[t].dig, e->name, e->version, 1);
            grpc_slice_unref(e->wire);
            e->wire = entry_wire(t, res[i], e->version);
            if (chg)
                chg[nchg++] = i;
        }
        f->t[t].diff_chg = chg;
        f->t[t].n_diff_chg = nchg;
        f->t[t].diff_ok = chg != NULL;
        return 0;
    }
    res_entry_t *ents = calloc(n ? n : 1, sizeof(*ents));
    json_t *index = json_object();
    digest_t dig = {0, 0};
    if (!ents || !index)
        goto fail;
    for (size_t i = 0; i < n; i++) {
        snprintf(ents[i].version, sizeof(ents[i].version), "%016" PRIx64, res[i]->hash);
        ents[i].hash = res[i]->hash;
        ents[i].name = strdup(res[i]->name);
        if (!ents[i].name)
            goto fail;
        digest_pair(&dig, ents[i].name, ents[i].version, 1);
        json_t *old = f->t[t].index ? json_object_get(f->t[t].index, res[i]->name) : NULL;
        size_t k = old ? (size_t)json_integer_value(old) : 0;
        if (old && k < f->t[t].n_ents && strcmp(f->t[t].ents[k].version, ents[i].version) == 0) {
            ents[i].wire = grpc_slice_ref(f->t[t].ents[k].wire);
        } else {
            ents[i].wire = entry_wire(t, res[i], ents[i].version);
            if (chg)
                chg[nchg++] = i;
        }
        if (json_object_set_new(index, res[i]->name, json_integer((json_int_t)i)) != 0)
            goto fail;
    }
    /* The names of the previous entries that are gone. */
    char **gone = calloc(f->t[t].n_ents + 1, sizeof(*gone));
    size_t ngone = 0;
    for (size_t k = 0; gone && k < f->t[t].n_ents; k++)
        if (!json_object_get(index, f->t[t].ents[k].name) &&
            !(gone[ngone++] = strdup(f->t[t].ents[k].name))) {
            while (ngone > 0)
                free(gone[--ngone]);
            free(gone);
            gone = NULL;
        }
    entries_free(f->t[t].ents, f->t[t].n_ents);
    json_decref(f->t[t].index);
    f->t[t].ents = ents;
    f->t[t].n_ents = n;
    f->t[t].index = index;
    f->t[t].dig = dig;
    f->t[t].diff_chg = chg;
    f->t[t].n_diff_chg = nchg;
    f->t[t].diff_removed = gone;
    f->t[t].n_diff_removed = ngone;
    f->t[t].diff_ok = chg && gone;
    return 0;
fail:
    /* Entries are filled in order: those with a name have a slice. */
    for (size_t i = 0; ents && i < n && ents[i].name; i++) {
        free(ents[i].name);
        grpc_slice_unref(ents[i].wire);
    }
    free(ents);
    free(chg);
    json_decref(index);
    return -1;
}

static int delta_subscribed(const runtime_rec_t *rt, int t, const char *name)
{
    return !rt->d[t].subs || json_object_get(rt->d[t].subs, name) != NULL;
}

/*
 * What type t of fleet f changes for a delta runtime: positions of entries
 * whose version differs from the one it holds (chg, when not NULL), names it
 * holds that are gone (removed, when not NULL). A (name, version) NACKed on
 * this stream is left out when honour_parked. Returns how many.
 */
/* What the runtime holds of type t: set (version, a JSON string) or
 * dropped, its digest kept with it. 0, or -1 when out of memory. */
static int have_set(runtime_rec_t *rt, int t, const char *name, json_t *version)
{
    if (!rt->d[t].have && !(rt->d[t].have = json_object()))
        return -1;
    json_t *old = json_object_get(rt->d[t].have, name);
    const char *was = old ? json_string_value(old) : NULL;
    digest_t d = rt->d[t].dig;
    if (was)
        digest_pair(&d, name, was, -1);
    digest_pair(&d, name, json_string_value(version) ?: "", 1);
    if (json_object_set(rt->d[t].have, name, version) != 0)
        return -1;
    rt->d[t].dig = d;
    return 0;
}

static void have_del(runtime_rec_t *rt, int t, const char *name)
{
    json_t *old = json_object_get(rt->d[t].have, name);
    if (!old)
        return;
    digest_pair(&rt->d[t].dig, name, json_string_value(old) ?: "", -1);
    json_object_del(rt->d[t].have, name);
}

static void have_clear(runtime_rec_t *rt, int t)
{
    json_decref(rt->d[t].have);
    rt->d[t].have = NULL;
    rt->d[t].dig = (digest_t){0, 0};
}

static size_t delta_compute_walk(const fleet_t *f, const runtime_rec_t *rt, int t, size_t *chg,
                                 json_t *removed, int honour_parked)
{
    size_t n = 0;
    json_t *have = rt->d[t].have, *parked = honour_parked ? rt->d[t].parked : NULL;
    for (size_t i = 0; chg && i < f->t[t].n_ents; i++) {
        const res_entry_t *e = &f->t[t].ents[i];
        if (!delta_subscribed(rt, t, e->name))
            continue;
        const char *held = json_string_value(json_object_get(have, e->name));
        if (held && strcmp(held, e->version) == 0)
            continue;
        const char *nacked = json_string_value(json_object_get(parked, e->name));
        if (nacked && strcmp(nacked, e->version) == 0)
            continue;
        chg[n++] = i;
    }
    if (removed) {
        const char *name;
        json_t *v;
        json_object_foreach(have, name, v)
        {
            if (json_object_get(f->t[t].index, name))
                continue;
            const char *nacked = json_string_value(json_object_get(parked, name));
            if (nacked && !nacked[0])
                continue;
            json_array_append_new(removed, json_string(name));
            n++;
        }
    }
    return n;
}

/* delta_compute_walk's answer without the walk when the runtime takes
 * every resource (no subscription list, nothing parked that counts) and
 * holds exactly the fleet's entries (nothing to send) or exactly the
 * previous ones (the diff of the last compile). A fleet of runtimes in
 * step costs each of them the size of the change, not of the config. */
static size_t delta_compute(const fleet_t *f, const runtime_rec_t *rt, int t, size_t *chg,
                            json_t *removed, int honour_parked)
{
    size_t nh = json_object_size(rt->d[t].have);
    int plain = !rt->d[t].subs && !(honour_parked && json_object_size(rt->d[t].parked));
    if (plain && nh == f->t[t].n_ents && digest_eq(&rt->d[t].dig, &f->t[t].dig))
        return 0;
    if (!plain || !f->t[t].diff_ok || nh != f->t[t].prev_n ||
        !digest_eq(&rt->d[t].dig, &f->t[t].prev_dig))
        return delta_compute_walk(f, rt, t, chg, removed, honour_parked);
    size_t n = 0;
    for (size_t i = 0; chg && i < f->t[t].n_diff_chg; i++)
        chg[n++] = f->t[t].diff_chg[i];
    for (size_t i = 0; removed && i < f->t[t].n_diff_removed; i++) {
        json_array_append_new(removed, json_string(f->t[t].diff_removed[i]));
        n++;
    }
    return n;
}

/* A delta response: its header (version, type, nonce, removed names) packed
 * for this runtime, then the shared slices of the changed resources. */
static grpc_byte_buffer *delta_response(const fleet_t *f, int t, const size_t *chg, size_t nchg,
                                        json_t *removed, const char *nonce, size_t *bytes)
{
    Sluice__V1__DiscoveryResponse resp = SLUICE__V1__DISCOVERY_RESPONSE__INIT;
    resp.version_info = (char *)f->t[t].version_str;
    resp.type_url = (char *)sl_xds_type_urls[t];
    resp.nonce = (char *)nonce;
    resp.n_removed_resources = json_array_size(removed);
    resp.removed_resources = calloc(resp.n_removed_resources + 1, sizeof(char *));
    grpc_slice *parts = calloc(nchg + 1, sizeof(*parts));
    if (!resp.removed_resources || !parts) {
        free(resp.removed_resources);
        free(parts);
        return NULL;
    }
    for (size_t i = 0; i < resp.n_removed_resources; i++)
        resp.removed_resources[i] = (char *)json_string_value(json_array_get(removed, i));
    size_t len = protobuf_c_message_get_packed_size(&resp.base);
    parts[0] = grpc_slice_malloc(len);
    protobuf_c_message_pack(&resp.base, GRPC_SLICE_START_PTR(parts[0]));
    *bytes = len;
    for (size_t i = 0; i < nchg; i++) {
        parts[i + 1] = f->t[t].ents[chg[i]].wire;
        *bytes += GRPC_SLICE_LENGTH(parts[i + 1]);
    }
    /* Takes its own reference on every slice. */
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(parts, nchg + 1);
    grpc_slice_unref(parts[0]);
    free(parts);
    free(resp.removed_resources);
    return bb;
}

/* Types whose removals wait until every type's additions and changes are
 * applied: routes and listeners still running may reference them. */
static int removal_deferred(int t)
{
    return t == SL_XDS_SECRET || t == SL_XDS_CONSUMER || t == SL_XDS_CLUSTER;
}

/*
 * Delta: the first type, in make-before-break order, with something to
 * send. First pass, clusters to listeners: additions and changes, with the
 * removals of routes, settings and listeners (those are replaced within
 * their type at once: a listener renamed on the same port must not
 * coexist with its old self). Second pass, once nothing of the first is
 * left: removals of clusters, consumers and secrets, after the routes that
 * stopped using them. A type with nothing to send (NACKed resources aside)
 * counts as acknowledged at the fleet's version of it.
 */
static void try_push_delta(sl_controller_t *ctl, runtime_rec_t *rt, fleet_t *f)
{
    for (int t = 0; t < SL_XDS__COUNT; t++) {
        if (!rt->subscribed[t] || !f->t[t].encoded ||
            strcmp(rt->acked[t], f->t[t].version_str) == 0)
            continue;
        size_t *tmp = calloc(f->t[t].n_ents + 1, sizeof(size_t));
        json_t *rm = json_array();
        if (tmp && rm && delta_compute(f, rt, t, tmp, rm, 0) == 0)
            snprintf(rt->acked[t], VERSION_LEN, "%s", f->t[t].version_str);
        free(tmp);
        json_decref(rm);
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < SL_XDS__COUNT; k++) {
            int t = pass == 0 ? k : SL_XDS__COUNT - 1 - k;
            if (!rt->subscribed[t] || !f->t[t].encoded)
                continue;
            int with_removals = pass == 0 ? !removal_deferred(t) : removal_deferred(t);
            size_t *chg = pass == 0 ? calloc(f->t[t].n_ents + 1, sizeof(size_t)) : NULL;
            json_t *removed = with_removals ? json_array() : NULL;
            if ((pass == 0 && !chg) || (with_removals && !removed)) {
                free(chg);
                json_decref(removed);
                return;
            }
            size_t nchg = pass == 0 ? delta_compute(f, rt, t, chg, NULL, 1) : 0;
            if (with_removals)
                delta_compute(f, rt, t, NULL, removed, 1);
            if (!nchg && !json_array_size(removed) &&
                !(pass == 0 && strcmp(rt->d[t].version, f->t[t].version_str) != 0)) {
                free(chg);
                json_decref(removed);
                continue;
            }
            snprintf(rt->inflight_nonce, sizeof(rt->inflight_nonce), "%" PRIu64, ++ctl->nonce_seq);
            size_t bytes = 0;
            grpc_byte_buffer *bb =
                delta_response(f, t, chg, nchg, removed, rt->inflight_nonce, &bytes);
            if (!bb) {
                rt->inflight_nonce[0] = '\0';
                free(chg);
                json_decref(removed);
                return;
            }
            json_decref(rt->inflight_sent);
            rt->inflight_sent = json_object();
            for (size_t i = 0; i < nchg; i++)
                json_object_set_new(rt->inflight_sent, f->t[t].ents[chg[i]].name,
                                    json_string(f->t[t].ents[chg[i]].version));
            json_decref(rt->inflight_removed);
            rt->inflight_removed = removed ? removed : json_array();
            snprintf(rt->inflight_version, sizeof(rt->inflight_version), "%s", f->t[t].version_str);
            rt->inflight_type = t;
            rt->inflight_sent_us = sl_ctrl_now_us();
            rt->responses_sent++;
            count_push(rt, 1, bytes, nchg);
            atomic_fetch_add(&sl_ctrl_metrics.pushes, 1);
            sl_log_debug("push %s delta to %s: version %s, nonce %s, %zu changed, %zu removed "
                         "(%zu bytes)",
                         sl_xds_type_names[t], rt->node_id, f->t[t].version_str, rt->inflight_nonce,
                         nchg, json_array_size(rt->inflight_removed), bytes);
            free(chg);
            sl_stream_send(rt->stream, bb);
            return;
        }
    }
}

/* The ACK or NACK of a delta response: what the runtime now holds. A NACK
 * lists the names it did not apply (none listed: it applied nothing); those
 * are parked at the version sent, the rest are held. */
static void delta_settle(runtime_rec_t *rt, int t, const Sluice__V1__DiscoveryRequest *req)
{
    json_t *rejected = json_object();
    int nack = req->error_detail != NULL;
    for (size_t i = 0; nack && i < req->n_rejected_resources; i++)
        json_object_set_new(rejected, req->rejected_resources[i], json_true());
    int all = nack && req->n_rejected_resources == 0;
    size_t applied = 0;
    if (!rt->d[t].have)
        rt->d[t].have = json_object();
    if (!rt->d[t].parked)
        rt->d[t].parked = json_object();
    const char *name;
    json_t *v;
    json_object_foreach(rt->inflight_sent, name, v)
    {
        if (all || json_object_get(rejected, name))
            json_object_set(rt->d[t].parked, name, v);
        else {
            have_set(rt, t, name, v);
            applied++;
        }
    }
    size_t i;
    json_array_foreach(rt->inflight_removed, i, v)
    {
        name = json_string_value(v);
        if (all || json_object_get(rejected, name))
            json_object_set_new(rt->d[t].parked, name, json_string(""));
        else {
            have_del(rt, t, name);
            applied++;
        }
    }
    /* It runs the version sent when it applied something, or when the
     * response was an ACK (an empty one too). */
    if (!nack || applied)
        snprintf(rt->d[t].version, VERSION_LEN, "%s", rt->inflight_version);
    json_decref(rejected);
    json_decref(rt->inflight_sent);
    json_decref(rt->inflight_removed);
    rt->inflight_sent = rt->inflight_removed = NULL;
}

/* ---- pushing -------------------------------------------------------------- */

static void try_push(sl_controller_t *ctl, runtime_rec_t *rt)
{
    if (!rt->stream || rt->inflight_nonce[0] || ctl->versions_stale)
        return;
    fleet_t *f = fleet_find(ctl, rt->fleet_name);
    if (!f || !f->compiled_ok)
        return;
    if (rt->delta) {
        try_push_delta(ctl, rt, f);
        return;
    }
    for (int t = 0; t < SL_XDS__COUNT; t++) {
        if (!rt->subscribed[t] || !f->t[t].encoded)
            continue;
        if (strcmp(rt->acked[t], f->t[t].version_str) == 0)
            continue;
        if (strcmp(rt->parked[t], f->t[t].version_str) == 0)
            continue; /* NACKed on this stream: wait for a new version */
        /* Encoded once per version, on its first state-of-the-world send
         * (a fleet of delta runtimes never pays for it). */
        if (!f->t[t].body_ready) {
            f->t[t].body = encode_response(f->t[t].res, f->t[t].n, t, f->t[t].version_str);
            f->t[t].body_ready = 1;
        }
        /* Unique per response, so a re-send of one version and the same
         * version sent to another runtime are told apart. */
        snprintf(rt->inflight_nonce, sizeof(rt->inflight_nonce), "%" PRIu64, ++ctl->nonce_seq);
        grpc_byte_buffer *bb = response_with_nonce(f->t[t].body, rt->inflight_nonce);
        if (!bb) {
            rt->inflight_nonce[0] = '\0';
            return;
        }
        snprintf(rt->inflight_version, sizeof(rt->inflight_version), "%s", f->t[t].version_str);
        rt->inflight_type = t;
        rt->inflight_sent_us = sl_ctrl_now_us();
        rt->responses_sent++;
        count_push(rt, 0, GRPC_SLICE_LENGTH(f->t[t].body) + 2 + strlen(rt->inflight_nonce),
                   f->t[t].resources);
        atomic_fetch_add(&sl_ctrl_metrics.pushes, 1);
        sl_log_debug("push %s to %s: version %s, nonce %s (%zu resources)", sl_xds_type_names[t],
                     rt->node_id, f->t[t].version_str, rt->inflight_nonce, f->t[t].resources);
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
    return json_pack("{s:[{s:s, s:s, s:s, s:s}], s:o}", "conditions", "type", "Accepted", "status",
                     ok ? "True" : "False", "reason", reason, "message", message,
                     "observedGeneration",
                     json_is_integer(gen) ? json_incref(gen) : json_integer(1));
}

/*
 * Compiles one fleet. An object that cannot be compiled (e.g. an Api naming
 * a missing Backend) is left out and its status says why, instead of
 * breaking every other Api of the fleet.
 */
static _Atomic uint64_t compiled_resources; /* sluice_controller_compiled_resources_total */
static _Atomic uint64_t compile_cpu_us;     /* sluice_controller_compile_cpu_seconds_total */

static uint64_t thread_cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

static int compile_fleet(sl_controller_t *ctl, const sl_resource_set_t *all, fleet_t *f,
                         json_t **statuses, const size_t *slot, sl_compiled_t *out)
{
    const char *fleet = f->name;
    memset(out, 0, sizeof(*out));
    if (!f->cache && !(f->cache = sl_ccache_new()))
        return -1;
    uint8_t *excluded = calloc(all->count ? all->count : 1, 1);
    if (!excluded)
        return -1;
    int ok = 0, any_excluded = 0;
    for (int round = 0; round < 64; round++) {
        /* A round without exclusions compiles `all` itself; later rounds a
         * copy without the excluded documents (hashes kept). */
        sl_resource_set_t set;
        sl_resource_set_init(&set);
        for (size_t i = 0; any_excluded && i < all->count; i++)
            if (!excluded[i] && sl_resource_set_add(&set, all->items[i].obj, all->items[i].source,
                                                    all->items[i].doc) == 0)
                set.items[set.count - 1].hash = all->items[i].hash;
        sl_errors_t errs;
        sl_errors_init(&errs);
        int rc = sl_compile_cached(any_excluded ? &set : all, fleet, f->cache, out, &errs);
        atomic_fetch_add(&compiled_resources, out->compiled);
        sl_resource_set_free(&set);
        if (rc == 0) {
            ok = 1;
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
                any_excluded = progress = 1;
                char msg[1024];
                snprintf(msg, sizeof(msg), "%s%s%s", err->field, err->field[0] ? ": " : "",
                         err->message);
                json_decref(statuses[slot[i]]);
                statuses[slot[i]] = accepted_status(0, "Invalid", msg, all->items[i].obj);
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
    sl_ccache_sweep(f->cache);
    (void)ctl;
    return ok ? 0 : -1;
}

static int persist_type(sl_controller_t *ctl, const char *fleet, int t, uint64_t version,
                        uint64_t hash, char *err, size_t errlen)
{
    if (ctl->derived_versions)
        return 0; /* derived from the input again after a restart */
    char key[256];
    snprintf(key, sizeof(key), "fleet/%s/%s/version", fleet, sl_xds_type_names[t]);
    if (sl_store_counter_set(ctl->store, key, version, err, errlen) != 0)
        return -1;
    snprintf(key, sizeof(key), "fleet/%s/%s/hash", fleet, sl_xds_type_names[t]);
    return sl_store_counter_set(ctl->store, key, hash, err, errlen);
}

/* The next config version, persisted; 0 with err when it cannot be. */
static uint64_t allocate_version(sl_controller_t *ctl, char *err, size_t errlen)
{
    uint64_t cur;
    if (ctl->derived_versions) {
        /* The input's version when it moved past ours; else (the input's
         * newest object was deleted, or a runtime runs a version past
         * ours) the next one. */
        cur = ctl->config_version > ctl->version_floor ? ctl->config_version : ctl->version_floor;
        /* A runtime reporting the input's version itself (it ran it from
         * another replica, or from this one before a restart) is not past
         * it: the same input keeps the same version. */
        uint64_t v = ctl->input_version > ctl->config_version &&
                             ctl->input_version >= ctl->version_floor
                         ? ctl->input_version
                         : cur + 1;
        /* A shared store: the same stored state has one version, also when
         * a compile changes only what a new fleet (a runtime's) gets. */
        if (ctl->store_versions && ctl->input_version && ctl->input_version >= cur)
            v = ctl->input_version;
        if (v > SL_XDS_VERSION_MAX) {
            snprintf(err, errlen,
                     "the input's resourceVersion %" PRIu64 " is past 2^53-1, the largest "
                     "version runtimes accept",
                     v);
            return 0;
        }
        return v;
    }
    if (sl_store_counter_read(ctl->store, "config_version", &cur, err, errlen) != 0)
        return 0;
    if (cur < ctl->version_floor)
        cur = ctl->version_floor;
    if (cur >= SL_XDS_VERSION_MAX) {
        snprintf(err, errlen,
                 "config_version is %" PRIu64 ": no version can follow it (runtimes accept at "
                 "most 2^53-1)",
                 cur);
        return 0;
    }
    if (sl_store_counter_set(ctl->store, "config_version", cur + 1, err, errlen) != 0)
        return 0;
    return cur + 1;
}

static void retry_cb(evutil_socket_t fd, short what, void *arg);

/* A compile could not persist its versions: say so everywhere, retry. */
static void versions_failed(sl_controller_t *ctl, const char *err)
{
    snprintf(ctl->version_error, sizeof(ctl->version_error),
             "cannot persist the config version: %s", err);
    sl_log_error("compile: %s; nothing pushed, retrying", ctl->version_error);
    atomic_fetch_add(&sl_ctrl_metrics.compile_errors, 1);
    ctl->retry_ms = ctl->retry_ms ? ctl->retry_ms * 2 : RETRY_MIN_MS;
    if (ctl->retry_ms > RETRY_MAX_MS)
        ctl->retry_ms = RETRY_MAX_MS;
    struct timeval tv = {(time_t)(ctl->retry_ms / 1000),
                         (suseconds_t)(ctl->retry_ms % 1000) * 1000};
    evtimer_add(ctl->retry_ev, &tv);
}

/* map (source -> entry) with only the entries of the Apis and Gateways in
 * `all` (a resource that went away takes its entry with it); map is
 * consumed. */
static json_t *keep_current(json_t *map, const sl_resource_set_t *all)
{
    json_t *fresh = json_object();
    if (!fresh)
        return map;
    for (size_t r = 0; r < all->count; r++) {
        json_t *e = json_object_get(map, all->items[r].source);
        if (e && (all->items[r].kind == SL_KIND_API || all->items[r].kind == SL_KIND_GATEWAY))
            json_object_set(fresh, all->items[r].source, e);
    }
    json_decref(map);
    return fresh;
}

/*
 * Policies that validate but cannot be compiled (policies/check.c): the
 * Api is pushed all the same, so its routes answer 503 policy_unavailable
 * at the runtimes (fail closed, its other routes and every other Api
 * untouched), and its status says why: a PolicyReady condition, False with
 * reason PolicyUnavailable and each failing entry's field path and reason.
 * Apis with policies that compile get PolicyReady True. The Consumers are
 * those the runtimes get (every fleet's snapshot has them all).
 */
static void check_policies(const sl_resource_set_t *all, res_facts_t **facts, const size_t *memo_of,
                           const size_t *slot, const sl_compiled_t *comp, json_t **statuses)
{
    /* The Consumers as the runtimes get them, unpacked only when some Api
     * has policies. */
    sl_consumers_t *cons = NULL;
    size_t nc = comp->n[SL_CRES_CONSUMER];
    Sluice__V1__Consumer **cm = NULL;
    sl_policy_env_t env = {.nworkers = 1};
    for (size_t i = 0; i < all->count; i++) {
        const sl_resource_t *r = &all->items[i];
        if (r->kind != SL_KIND_API || !facts[memo_of[i]]->has_policies)
            continue;
        json_t *spec = json_object_get(r->obj, "spec");
        json_t *st = statuses[slot[i]];
        json_t *conds = json_object_get(st, "conditions");
        const char *accepted =
            json_string_value(json_object_get(json_array_get(conds, 0), "status"));
        if (!accepted || strcmp(accepted, "True") != 0)
            continue;
        if (!cons) {
            cm = calloc(nc ? nc : 1, sizeof(*cm));
            for (size_t k = 0; cm && k < nc; k++)
                if (!(cm[k] =
                          sluice__v1__consumer__unpack(NULL, comp->res[SL_CRES_CONSUMER][k]->len,
                                                       comp->res[SL_CRES_CONSUMER][k]->data)))
                    break;
            for (size_t k = 0; cm && k < nc; k++)
                if (!cm[k]) {
                    for (size_t j = 0; j < k; j++)
                        sluice__v1__consumer__free_unpacked(cm[j], NULL);
                    free(cm);
                    cm = NULL;
                }
            if (!cm || !(cons = sl_consumers_build(cm, nc))) {
                sl_log_error("compile: out of memory while checking policies");
                break;
            }
            env.consumers = cons;
        }
        char msg[2048];
        int failed = sl_policy_check_spec(spec, &env, msg, sizeof(msg));
        if (failed)
            sl_log_warn("api %s/%s: %d policy entr%s cannot be compiled, the runtimes answer "
                        "its routes 503 policy_unavailable: %s",
                        r->ns, r->name, failed, failed == 1 ? "y" : "ies", msg);
        json_array_append_new(conds, json_pack("{s:s, s:s, s:s, s:s}", "type", "PolicyReady",
                                               "status", failed ? "False" : "True", "reason",
                                               failed ? "PolicyUnavailable" : "Compiled", "message",
                                               failed ? msg : "every policy compiled"));
    }
    if (cons)
        sl_consumers_free(cons);
    for (size_t k = 0; cm && k < nc; k++)
        sluice__v1__consumer__free_unpacked(cm[k], NULL);
    free(cm);
}

/*
 * Is the Gateway res in fleet f's snapshot? Accepted by this compile (a
 * Gateway left out has Accepted False) and each of its listeners there by
 * name (a fleet whose compile failed keeps an older snapshot).
 */
static int gateway_in_snapshot(sl_controller_t *ctl, const sl_resource_t *res, const fleet_t *f)
{
    json_t *conds = json_object_get(json_object_get(ctl->statuses, res->source), "conditions");
    const char *accepted = json_string_value(json_object_get(json_array_get(conds, 0), "status"));
    if (!f->snap || !accepted || strcmp(accepted, "True") != 0)
        return 0;
    json_t *ls = json_object_get(json_object_get(res->obj, "spec"), "listeners");
    for (size_t i = 0; i < json_array_size(ls); i++) {
        const char *name = json_string_value(json_object_get(json_array_get(ls, i), "name"));
        size_t k = 0;
        while (name && k < f->snap->n_listeners && strcmp(f->snap->listeners[k]->name, name) != 0)
            k++;
        if (!name || k == f->snap->n_listeners)
            return 0;
    }
    return 1;
}

/* A Gateway's fleet: spec.fleet, "default" when absent. */
static const char *gateway_fleet(json_t *obj)
{
    json_t *fl = json_object_get(json_object_get(obj, "spec"), "fleet");
    return json_is_string(fl) ? json_string_value(fl) : "default";
}

/* Where a walk over the resources in set order stands in a fleet's route
 * tables, which are in that order too (one per Api accepted): most Apis'
 * tables are where the walk expects them, a string compare; the rest are
 * looked up by name. */
typedef struct {
    size_t next;
    json_t *names; /* the tables by name, when the fleet has no delta index */
} route_walk_t;

static int route_walk_has(route_walk_t *w, const fleet_t *f, const char *key)
{
    size_t n = f->t[SL_XDS_ROUTE].n;
    if (!f->snap)
        return 0;
    if (w->next < n && strcmp(f->t[SL_XDS_ROUTE].res[w->next]->name, key) == 0) {
        w->next++;
        return 1;
    }
    if (w->names)
        return json_object_get(w->names, key) != NULL;
    json_t *pos = json_object_get(f->t[SL_XDS_ROUTE].index, key);
    if (!pos)
        return 0;
    w->next = (size_t)json_integer_value(pos) + 1;
    return 1;
}

/*
 * After a committed compile: for every Api and fleet (for every Gateway and
 * its fleet), the routes (listeners) version of the first snapshot that
 * contains the current spec. Same spec (hash) as at the last compile and
 * contained then: the version recorded then. Else, contained in the fleet's
 * snapshot now (the Api's route table, the Gateway's listeners are there):
 * the fleet's routes (listeners) version now. Not contained (left out as
 * invalid, or the fleet's compile failed and it keeps an older snapshot):
 * 0. `fresh` drops what was recorded (versions were renumbered past a
 * runtime's). The last record is read from the facts when they mirror it
 * (`track`: they are the store's and carried), else from ctl->programmed;
 * with `incr`, the records of resources gone since the committed facts are
 * removed (kept[j] = 0).
 */
static void record_programmed(sl_controller_t *ctl, const sl_resource_set_t *all, int fresh,
                              res_facts_t **facts, const size_t *memo_of, const uint8_t *kept,
                              int incr, int track)
{
    /* Updated in place (a record that did not change stays); rebuilt
     * when it holds an object the set does not. */
    json_t *out = ctl->programmed ? json_incref(ctl->programmed) : json_object();
    size_t nrec = 0;
    size_t nf = ctl->n_fleets;
    route_walk_t *walks = calloc(nf ? nf : 1, sizeof(*walks));
    json_int_t *vals = calloc(nf ? nf : 1, sizeof(*vals));
    json_int_t *pvals = calloc(nf ? nf : 1, sizeof(*pvals));
    if (!out || !walks || !vals || !pvals)
        goto oom;
    for (fleet_t *f = ctl->fleets; f; f = f->next) {
        /* The delta index of the routes has the same names (when built). */
        if (!f->snap ||
            (f->t[SL_XDS_ROUTE].index && f->t[SL_XDS_ROUTE].n_ents == f->t[SL_XDS_ROUTE].n))
            continue;
        json_t *names = walks[f->idx].names = json_object();
        if (!names)
            goto oom;
        for (size_t k = 0; k < f->t[SL_XDS_ROUTE].n; k++)
            json_object_set_new(names, f->t[SL_XDS_ROUTE].res[k]->name, json_true());
    }
    for (size_t j = 0; incr && j < ctl->n_facts; j++)
        if (!kept[j] &&
            (ctl->facts[j]->kind == SL_KIND_API || ctl->facts[j]->kind == SL_KIND_GATEWAY))
            json_object_del(out, ctl->facts[j]->source);
    for (size_t r = 0; r < all->count; r++) {
        const sl_resource_t *res = &all->items[r];
        if (res->kind != SL_KIND_API && res->kind != SL_KIND_GATEWAY)
            continue;
        const int gw = res->kind == SL_KIND_GATEWAY;
        res_facts_t *e = facts[r];
        uint64_t h = facts[memo_of[r]]->spec_hash;
        json_int_t g = e->generation;
        /* The last record: hash, generation, version per fleet, fleets. */
        int present;
        uint64_t phash = 0;
        json_int_t pgen = 0;
        size_t pnset = 0;
        if (track && e->prog_known && !fresh) {
            present = 1;
            phash = e->prog_hash;
            pgen = e->prog_gen;
            pnset = e->prog_nset;
            for (size_t k = 0; k < nf; k++)
                pvals[k] = k < e->n_prog_vals ? e->prog_vals[k] : -1;
        } else {
            json_t *prev = fresh ? NULL : json_object_get(ctl->programmed, res->source);
            json_t *pfl = prev ? json_object_get(prev, "fleets") : NULL;
            present = prev != NULL;
            phash = (uint64_t)json_integer_value(json_object_get(prev, "hash"));
            pgen = json_integer_value(json_object_get(prev, "generation"));
            pnset = json_object_size(pfl);
            for (fleet_t *f = ctl->fleets; f; f = f->next) {
                json_t *pv = json_object_get(pfl, f->name);
                pvals[f->idx] = json_is_integer(pv) ? json_integer_value(pv) : -1;
            }
        }
        int same = present && phash == h;
        /* The record of the last compile when nothing in it changed (most
         * Apis of a compile): shared, not rebuilt. */
        int keep = same && pgen == g;
        size_t nset = 0;
        for (fleet_t *f = ctl->fleets; f; f = f->next) {
            vals[f->idx] = -1;
            if (gw && strcmp(f->name, gateway_fleet(res->obj)) != 0)
                continue;
            json_int_t v = 0;
            if (gw ? gateway_in_snapshot(ctl, res, f) : route_walk_has(&walks[f->idx], f, e->key)) {
                json_int_t was = same && pvals[f->idx] > 0 ? pvals[f->idx] : 0;
                v = was ? was : (json_int_t)f->t[gw ? SL_XDS_LISTENER : SL_XDS_ROUTE].version;
            }
            vals[f->idx] = v;
            nset++;
            if (pvals[f->idx] != v)
                keep = 0;
        }
        nrec++;
        if (!(keep && pnset == nset)) {
            json_t *fl = json_object();
            for (fleet_t *f = ctl->fleets; f; f = f->next)
                if (vals[f->idx] >= 0)
                    json_object_set_new(fl, f->name, json_integer(vals[f->idx]));
            json_object_set_new(
                out, res->source,
                json_pack("{s:I, s:I, s:o}", "hash", (json_int_t)h, "generation", g, "fleets", fl));
        } else if (e->prog_known) {
            continue; /* the record in place is this one, and so is the mirror */
        }
        if (!track)
            continue;
        /* The mirror of the record now in place. */
        if (e->n_prog_vals < nf) {
            json_int_t *pv = realloc(e->prog_vals, nf * sizeof(*pv));
            if (!pv) {
                e->prog_known = 0;
                continue;
            }
            e->prog_vals = pv;
            e->n_prog_vals = nf;
        }
        memcpy(e->prog_vals, vals, nf * sizeof(*vals));
        e->prog_hash = h;
        e->prog_gen = g;
        e->prog_nset = nset;
        e->prog_known = 1;
    }
    if (json_object_size(out) != nrec)
        out = keep_current(out, all);
    json_decref(ctl->programmed);
    ctl->programmed = out;
    out = NULL;
    goto done;
oom:
    sl_log_error("compile: out of memory while recording where Apis are programmed");
done:
    for (size_t k = 0; walks && k < nf; k++)
        json_decref(walks[k].names);
    json_decref(out);
    free(walks);
    free(vals);
    free(pvals);
}

/* The facts side of one compile, until it commits (statuses_commit,
 * record_programmed) or is dropped. */
typedef struct {
    res_facts_t **facts; /* facts_align */
    size_t n;
    uint8_t *changed, *kept;
    size_t *slot, *memo_of; /* facts_slots */
    json_t **statuses;      /* by slot: the status this compile gives */
    int carry;              /* facts carried from the committed ones */
} fstage_t;

static void fstage_free(fstage_t *fs)
{
    facts_release(fs->facts, fs->n);
    for (size_t i = 0; fs->statuses && i < fs->n; i++)
        json_decref(fs->statuses[i]);
    free(fs->statuses);
    free(fs->changed);
    free(fs->kept);
    free(fs->slot);
    free(fs->memo_of);
    memset(fs, 0, sizeof(*fs));
}

/* Is `st` a plain Accepted status (one condition, reason Accepted)? Its
 * observedGeneration (0 when absent) in *gen. */
static int status_plain(json_t *st, json_int_t *gen)
{
    json_t *conds = json_object_get(st, "conditions");
    json_t *c0 = json_array_get(conds, 0);
    *gen = json_integer_value(json_object_get(st, "observedGeneration"));
    return json_array_size(conds) == 1 &&
           strcmp(json_string_value(json_object_get(c0, "reason")) ?: "", "Accepted") == 0;
}

/* The statuses a compile starts from, and how they are set in the
 * committed map. -1 when out of memory. */
static int fstage_begin(sl_controller_t *ctl, const sl_resource_set_t *all, int from_store,
                        fstage_t *fs)
{
    size_t n = all->count, m = ctl->n_facts;
    memset(fs, 0, sizeof(*fs));
    fs->carry = from_store && ctl->facts_tracked;
    fs->changed = calloc(n ? n : 1, 1);
    fs->kept = calloc(m ? m : 1, 1);
    fs->slot = calloc(n ? n : 1, sizeof(*fs->slot));
    fs->memo_of = calloc(n ? n : 1, sizeof(*fs->memo_of));
    fs->statuses = calloc(n ? n : 1, sizeof(*fs->statuses));
    if (!fs->changed || !fs->kept || !fs->slot || !fs->memo_of || !fs->statuses ||
        !(fs->facts = facts_align(ctl, all, fs->carry, fs->changed, fs->kept)))
        return -1;
    fs->n = n;
    if (facts_slots(all, from_store, fs->slot, fs->memo_of) != 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        /* The last compile's Accepted status when it is the one this
         * compile starts from (same generation, no condition added to it:
         * an Api with policies gets a fresh one, check_policies appends to
         * it); statuses are never changed once committed. */
        const sl_resource_t *r = &all->items[i];
        const res_facts_t *e = fs->facts[i];
        json_t *prev;
        json_int_t gen;
        int plain;
        if (fs->carry && !fs->changed[i] && e->status) {
            prev = e->status;
            plain = e->status_plain;
            gen = e->status_gen;
        } else {
            prev = json_object_get(ctl->statuses, r->source);
            plain = status_plain(prev, &gen);
        }
        json_t **st = &fs->statuses[fs->slot[i]];
        json_decref(*st);
        if (plain && gen == e->generation &&
            !(r->kind == SL_KIND_API && fs->facts[fs->memo_of[i]]->has_policies))
            *st = json_incref(prev);
        else
            *st = accepted_status(1, "Accepted", "compiled and pushed to the fleets", r->obj);
    }
    return 0;
}

/* The compile's statuses become the committed ones: set where they are
 * another object than the committed one (carried facts), else a new map
 * (in set order: a source's status is its slot's). `track`: the facts
 * keep them, for the next compile. */
static void statuses_commit(sl_controller_t *ctl, const sl_resource_set_t *all, fstage_t *fs,
                            int track)
{
    json_t *map = fs->carry ? ctl->statuses : json_object();
    if (!map) {
        sl_log_error("compile: out of memory committing the statuses");
        return;
    }
    for (size_t j = 0; fs->carry && j < ctl->n_facts; j++)
        if (!fs->kept[j])
            json_object_del(map, ctl->facts[j]->source);
    for (size_t i = 0; i < fs->n; i++) {
        json_t *st = fs->statuses[fs->slot[i]];
        if (!fs->carry || st != fs->facts[i]->status)
            json_object_set(map, all->items[i].source, st);
    }
    if (fs->carry && json_object_size(map) != fs->n) {
        json_object_clear(map);
        for (size_t i = 0; i < fs->n; i++)
            json_object_set(map, all->items[i].source, fs->statuses[fs->slot[i]]);
    }
    if (!fs->carry) {
        json_decref(ctl->statuses);
        ctl->statuses = map;
    }
    for (size_t i = 0; track && i < fs->n; i++) {
        res_facts_t *e = fs->facts[i];
        json_t *st = fs->statuses[fs->slot[i]];
        if (e->status == st)
            continue;
        json_decref(e->status);
        e->status = json_incref(st);
        e->status_plain = status_plain(st, &e->status_gen);
    }
}

/* What a compile produced for one fleet, before anything is committed. */
typedef struct {
    sl_compiled_t comp;
    int ok;
    struct {
        sl_cres_t **res;
        size_t n;
        uint64_t hash;
        int changed;
    } t[SL_XDS__COUNT];
} staged_t;

/*
 * Compiles every fleet. Staged: snapshots and hashes first; then, if some
 * type changed, one new version is allocated and every changed type's
 * (version, hash) persisted; only then is anything swapped in and pushed. A
 * store failure on the way leaves the previous state whole (and says why).
 */
static void compile_all_timed(sl_controller_t *ctl)
{
    atomic_fetch_add(&sl_ctrl_metrics.compiles, 1);
    int renumbered = ctl->versions_stale;
    sl_resource_set_t loaded;
    sl_resource_set_init(&loaded);
    const sl_resource_set_t *all = ctl->static_set;
    int from_store = 0;
    if (ctl->derived_versions && !ctl->input_ready)
        return; /* nothing listed yet: an empty config would remove everything */
    if (!all) {
        char err[512];
        /* The store's own set (no copy), unchanged until the next store
         * call; compile_all does not write resources. */
        if (sl_store_load_shared(ctl->store, &all, err, sizeof(err)) != SL_STORE_OK) {
            sl_log_error("compile: cannot read the store: %s", err);
            atomic_fetch_add(&sl_ctrl_metrics.compile_errors, 1);
            sl_resource_set_free(&loaded);
            return;
        }
        from_store = 1;
        if (ctl->store_versions)
            ctl->input_version = sl_store_loaded_version(ctl->store);
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

    fstage_t fs;
    if (fstage_begin(ctl, all, from_store, &fs) != 0) {
        sl_log_error("compile: out of memory");
        fstage_free(&fs);
        sl_resource_set_free(&loaded);
        return;
    }
    count_routes(ctl, fs.facts, fs.changed, fs.n, fs.kept, fs.carry);

    size_t nf = 0;
    for (fleet_t *f = ctl->fleets; f; f = f->next)
        nf++;
    staged_t *stg = calloc(nf ? nf : 1, sizeof(*stg));
    if (!stg) {
        sl_log_error("compile: out of memory");
        fstage_free(&fs);
        sl_resource_set_free(&loaded);
        return;
    }
    int need_version = 0;
    size_t i = 0;
    for (fleet_t *f = ctl->fleets; f; f = f->next, i++) {
        stg[i].ok = compile_fleet(ctl, all, f, fs.statuses, fs.slot, &stg[i].comp) == 0;
        for (int t = 0; stg[i].ok && t < SL_XDS__COUNT; t++) {
            stg[i].t[t].n = type_resources(&stg[i].comp, t, &stg[i].t[t].res, &stg[i].t[t].hash);
            if (!stg[i].t[t].res) {
                sl_log_error("compile: out of memory packing the %s of fleet %s",
                             sl_xds_type_names[t], f->name);
                for (int u = 0; u < t; u++)
                    cres_release(stg[i].t[u].res, stg[i].t[u].n);
                sl_compiled_free(&stg[i].comp);
                stg[i].ok = 0;
                break;
            }
            stg[i].t[t].changed = stg[i].t[t].hash != f->t[t].hash || f->t[t].version == 0;
            need_version |= stg[i].t[t].changed;
        }
    }
    /* Derived versions: every type carries the version of the input it was
     * compiled from, so that a replica compiling the same input from
     * scratch gives each type the same version as one that followed every
     * change (a type kept at an older version would depend on history).
     * For the same reason an input that moved past our version is a new
     * version even when the compiled content did not change (an edit
     * reverted, a Secret's metadata rewritten): a replica started after
     * it derives that version, so this one must too. */
    if (ctl->derived_versions && ctl->input_version > ctl->config_version)
        for (i = 0; i < nf; i++)
            need_version |= stg[i].ok;
    for (i = 0; ctl->derived_versions && need_version && i < nf; i++)
        for (int t = 0; stg[i].ok && t < SL_XDS__COUNT; t++)
            stg[i].t[t].changed = 1;

    for (i = 0; i < nf; i++)
        if (stg[i].ok) {
            check_policies(all, fs.facts, fs.memo_of, fs.slot, &stg[i].comp, fs.statuses);
            break;
        }

    char err[512] = "";
    uint64_t new_version = 0;
    if (need_version && !(new_version = allocate_version(ctl, err, sizeof(err))))
        goto persist_failed;
    i = 0;
    for (fleet_t *f = ctl->fleets; f; f = f->next, i++)
        for (int t = 0; stg[i].ok && t < SL_XDS__COUNT; t++)
            if (stg[i].t[t].changed &&
                persist_type(ctl, f->name, t, new_version, stg[i].t[t].hash, err, sizeof(err)) != 0)
                goto persist_failed;

    /* Committed in the store: swap in and push. */
    i = 0;
    for (fleet_t *f = ctl->fleets; f; f = f->next, i++) {
        if (!stg[i].ok)
            continue;
        for (int t = 0; t < SL_XDS__COUNT; t++) {
            if (stg[i].t[t].changed) {
                f->t[t].version = new_version;
                f->t[t].hash = stg[i].t[t].hash;
            }
            if (stg[i].t[t].changed || !f->t[t].encoded) {
                snprintf(f->t[t].version_str, VERSION_LEN, "%" PRIu64, f->t[t].version);
                if (f->t[t].body_ready)
                    grpc_slice_unref(f->t[t].body);
                f->t[t].body_ready = 0;
                f->t[t].encoded = 1;
                f->t[t].resources = stg[i].t[t].n;
                if (build_entries(f, t, stg[i].t[t].res, stg[i].t[t].n) != 0)
                    sl_log_error("compile: out of memory building the delta resources of %s",
                                 sl_xds_type_names[t]);
            }
            cres_release(f->t[t].res, f->t[t].n);
            f->t[t].res = stg[i].t[t].res;
            f->t[t].n = stg[i].t[t].n;
        }
        if (f->snap)
            sl_snapshot_free(f->snap);
        /* The fleet-level messages move to the fleet; the compiled
         * resources are referenced by t[].res. */
        f->snap = stg[i].comp.snap;
        stg[i].comp.snap = NULL;
        sl_compiled_free(&stg[i].comp);
        f->compiled_ok = 1;
    }
    free(stg);
    statuses_commit(ctl, all, &fs, from_store);
    record_programmed(ctl, all, renumbered, fs.facts, fs.memo_of, fs.kept, fs.carry, from_store);
    /* The facts of this compile are now the committed ones. */
    facts_release(ctl->facts, ctl->n_facts);
    ctl->facts = fs.facts;
    ctl->n_facts = fs.n;
    ctl->facts_tracked = from_store;
    fs.facts = NULL;
    fstage_free(&fs);
    sl_resource_set_free(&loaded);
    if (new_version)
        ctl->config_version = new_version;
    atomic_store(&sl_ctrl_metrics.config_version, ctl->config_version);
    ctl->versions_stale = 0;
    if (ctl->version_error[0]) {
        sl_log_notice("compile: versions are persisted again");
        ctl->version_error[0] = '\0';
    }
    ctl->retry_ms = 0;
    if (new_version)
        sl_log_notice("config version %" PRIu64 " compiled", new_version);
    /* Delta: a removal a runtime refused (a cluster its routes still used)
     * is offered again once the config has changed. */
    for (runtime_rec_t *rt = ctl->runtimes; new_version && rt; rt = rt->next)
        for (int t = 0; rt->delta && t < SL_XDS__COUNT; t++) {
            const char *name;
            json_t *v;
            void *tmp;
            json_object_foreach_safe(rt->d[t].parked, tmp, name, v)
            {
                if (!json_string_value(v)[0])
                    json_object_del(rt->d[t].parked, name);
            }
        }
    for (fleet_t *f = ctl->fleets; f; f = f->next)
        push_fleet(ctl, f->name);
    if (ctl->compiled_fn)
        ctl->compiled_fn(ctl->compiled_arg);
    return;

persist_failed:
    for (i = 0; i < nf; i++) {
        if (!stg[i].ok)
            continue;
        for (int t = 0; t < SL_XDS__COUNT; t++)
            cres_release(stg[i].t[t].res, stg[i].t[t].n);
        sl_compiled_free(&stg[i].comp);
    }
    free(stg);
    fstage_free(&fs);
    sl_resource_set_free(&loaded);
    versions_failed(ctl, err);
}

/* compile_all, its CPU time counted. */
static void compile_all(sl_controller_t *ctl)
{
    uint64_t cpu0 = thread_cpu_us();
    compile_all_timed(ctl);
    atomic_fetch_add(&compile_cpu_us, thread_cpu_us() - cpu0);
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
        ctl->window_ms =
            ctl->window_ms * 2 > COALESCE_MAX_MS ? COALESCE_MAX_MS : ctl->window_ms * 2;
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

static void retry_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sl_controller_t *ctl = arg;
    if (ctl->compile_pending)
        return; /* a compile is due anyway */
    compile_all(ctl);
    ctl->last_compile_ms = mono_ms();
}

/* ---- runtime records -------------------------------------------------------- */

static void delta_reset(runtime_rec_t *rt)
{
    for (int t = 0; t < SL_XDS__COUNT; t++) {
        have_clear(rt, t);
        json_decref(rt->d[t].parked);
        json_decref(rt->d[t].subs);
        rt->d[t].parked = rt->d[t].subs = NULL;
    }
    json_decref(rt->inflight_sent);
    json_decref(rt->inflight_removed);
    rt->inflight_sent = rt->inflight_removed = NULL;
}

static void runtime_free(runtime_rec_t *rt)
{
    delta_reset(rt);
    for (int t = 0; t < SL_XDS__COUNT; t++)
        free(rt->nack[t].message);
    free(rt->node_id);
    free(rt->fleet_name);
    free(rt->address);
    free(rt->build_version);
    free(rt->replaced_address);
    free(rt->replaced_by);
    free(rt);
}

static void runtime_unlink(sl_controller_t *ctl, runtime_rec_t *dead)
{
    for (runtime_rec_t **pp = &ctl->runtimes; *pp; pp = &(*pp)->next) {
        if (*pp == dead) {
            *pp = dead->next;
            ctl->n_runtimes--;
            runtime_free(dead);
            return;
        }
    }
}

/* Forgets runtimes disconnected for longer than --runtime-expiry. */
static void sweep_runtimes(sl_controller_t *ctl)
{
    uint64_t now = now_ms();
    runtime_rec_t **pp = &ctl->runtimes;
    while (*pp) {
        runtime_rec_t *rt = *pp;
        if (!rt->stream && now - rt->disconnected_ms >= ctl->runtime_expiry_ms) {
            *pp = rt->next;
            ctl->n_runtimes--;
            sl_log_info("runtime %s forgotten: disconnected for more than %" PRIu64 " s",
                        rt->node_id, ctl->runtime_expiry_ms / 1000);
            atomic_fetch_add(&sl_ctrl_metrics.runtimes_expired, 1);
            runtime_free(rt);
            runtimes_changed(ctl);
            continue;
        }
        pp = &rt->next;
    }
    atomic_store(&sl_ctrl_metrics.runtime_records, ctl->n_runtimes);
}

static void sweep_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sweep_runtimes(arg);
}

/* Makes room for one record: forgets the runtime disconnected longest ago.
 * 0, or -1 when every record is a connected runtime. */
static int evict_one(sl_controller_t *ctl)
{
    runtime_rec_t *oldest = NULL;
    for (runtime_rec_t *rt = ctl->runtimes; rt; rt = rt->next)
        if (!rt->stream && (!oldest || rt->disconnected_ms < oldest->disconnected_ms))
            oldest = rt;
    if (!oldest)
        return -1;
    sl_log_info("runtime %s forgotten: --max-runtimes %zu records reached", oldest->node_id,
                ctl->max_runtimes);
    atomic_fetch_add(&sl_ctrl_metrics.runtimes_expired, 1);
    runtime_unlink(ctl, oldest);
    runtimes_changed(ctl);
    return 0;
}

/* ---- stream events -------------------------------------------------------- */

/* Ends a stream we will not serve, saying why to both ends. */
static void refuse(sl_stream_t *s, stream_ctx_t *sc, grpc_status_code code, const char *msg)
{
    sl_log_warn("stream %s%s%s: refused: %s", sl_stream_peer(s), sc->node_id ? " node " : "",
                sc->node_id ? sc->node_id : "", msg);
    atomic_fetch_add(&sl_ctrl_metrics.streams_refused, 1);
    sc->refused = 1;
    sl_stream_close(s, code, msg);
}

static void on_open(void *arg, sl_stream_t *s)
{
    (void)arg;
    stream_ctx_t *sc = calloc(1, sizeof(*sc));
    sl_stream_set_user(s, sc);
    /* --stream-client-ca: the handshake verified any certificate sent, but
     * a runtime without one gets here (stream.c says why) and no further. */
    if (sc && sl_stream_client_auth(s) && !sl_stream_peer_has_certificate(s))
        refuse(s, sc, GRPC_STATUS_UNAUTHENTICATED,
               "no client certificate: this controller requires one (--stream-client-ca); start "
               "the runtime with --cert and --key, a certificate whose SAN is its --node-id");
}

static void stream_ctx_free(stream_ctx_t *sc)
{
    free(sc->node_id);
    free(sc->fleet);
    free(sc->build_version);
    free(sc);
}

static void on_close(void *arg, sl_stream_t *s)
{
    sl_controller_t *ctl = arg;
    stream_ctx_t *sc = sl_stream_user(s);
    if (sc && sc->rt && sc->rt->stream == s) {
        runtime_rec_t *rt = sc->rt;
        rt->stream = NULL;
        rt->inflight_nonce[0] = '\0';
        json_decref(rt->inflight_sent);
        json_decref(rt->inflight_removed);
        rt->inflight_sent = rt->inflight_removed = NULL;
        rt->disconnected_ms = now_ms();
        atomic_fetch_sub(&sl_ctrl_metrics.runtimes_connected, 1);
        sl_log_notice("runtime %s (fleet %s) disconnected", rt->node_id, rt->fleet_name);
        runtimes_changed(ctl);
    }
    if (sc)
        stream_ctx_free(sc);
    sl_stream_set_user(s, NULL);
}

/* Printable ASCII without spaces, 1..max bytes (node ids go into logs and
 * JSON, and name records). */
static int node_field_ok(const char *v, size_t max)
{
    size_t n = 0;
    for (; v[n]; n++)
        if (n >= max || v[n] <= ' ' || v[n] > '~')
            return 0;
    return n > 0;
}

/* Takes the node from the stream's first request that carries one. 0, or
 * -1 with msg. */
static int take_node(stream_ctx_t *sc, const Sluice__V1__Node *node, char *msg, size_t len)
{
    if (sc->node_id)
        return 0; /* xDS: only the first request must carry it */
    if (!node || !node->id || !node->id[0]) {
        snprintf(msg, len, "the first DiscoveryRequest of a stream must carry node.id");
        return -1;
    }
    if (!node_field_ok(node->id, NODE_FIELD_MAX)) {
        snprintf(msg, len,
                 "node.id must be 1 to %d printable ASCII characters without spaces (like a "
                 "host or pod name)",
                 NODE_FIELD_MAX);
        return -1;
    }
    const char *fleet = node->fleet && node->fleet[0] ? node->fleet : "default";
    if (!node_field_ok(fleet, NODE_FIELD_MAX)) {
        snprintf(msg, len, "node %s: node.fleet must be 1 to %d printable ASCII characters",
                 node->id, NODE_FIELD_MAX);
        return -1;
    }
    sc->node_id = strdup(node->id);
    sc->fleet = strdup(fleet);
    sc->build_version = strndup(node->build_version ? node->build_version : "", BUILD_VERSION_MAX);
    return sc->node_id && sc->fleet && sc->build_version ? 0 : -1;
}

/* A subscription's version: 0 with *v, or -1 with msg saying what is wrong. */
static int check_version(sl_controller_t *ctl, const char *node, int t, const char *version,
                         uint64_t *v, char *msg, size_t len)
{
    if (sl_xds_version_parse(version, v) != 0) {
        snprintf(msg, len,
                 "node %s: %s version_info \"%.40s%s\" is not a version: a decimal integer from 0 "
                 "to 9007199254740991 (2^53-1) is expected, or \"\" for none",
                 node, sl_xds_type_names[t], version, strlen(version) > 40 ? "..." : "");
        return -1;
    }
    uint64_t ours =
        ctl->config_version > ctl->version_floor ? ctl->config_version : ctl->version_floor;
    if (ctl->derived_versions && ctl->input_version > ours)
        ours = ctl->input_version;
    /* Derived versions before the first list: nothing to compare with yet
     * (the API server's resourceVersions may be far past 0). */
    if (ctl->derived_versions && !ctl->input_ready)
        return 0;
    if (*v > ours + VERSION_MAX_AHEAD) {
        snprintf(msg, len,
                 "node %s: %s version %s is more than %llu versions past this controller's "
                 "%" PRIu64 "; refused (no controller of this store issued it: restart the "
                 "runtime to drop it)",
                 node, sl_xds_type_names[t], version, (unsigned long long)VERSION_MAX_AHEAD, ours);
        return -1;
    }
    return 0;
}

/* Keeps a NACK reason to NACK_MESSAGE_MAX bytes, cut on a UTF-8 boundary. */
static char *truncated_message(const char *m)
{
    static const char mark[] = " ... (truncated)";
    size_t len = strlen(m);
    if (len <= NACK_MESSAGE_MAX)
        return strdup(m);
    size_t keep = NACK_MESSAGE_MAX - (sizeof(mark) - 1);
    while (keep > 0 && ((unsigned char)m[keep] & 0xC0) == 0x80)
        keep--;
    char *out = malloc(keep + sizeof(mark));
    if (!out)
        return NULL;
    memcpy(out, m, keep);
    memcpy(out + keep, mark, sizeof(mark));
    return out;
}

/* Names a runtime may report (initial_resource_versions) or subscribe to,
 * per type: those of its fleet plus this many (what it holds from another
 * controller or its cache, and the fleet not compiled yet). Peers are not
 * trusted before a valid subscription: what one stream can make us keep is
 * bounded by the config, not by the 4 MiB request size. */
#define DELTA_NAMES_SLACK 10000
#define DELTA_NAME_MAX 1024
#define DELTA_VERSION_MAX 64

/*
 * A delta subscription request of type t: on the stream's first one for the
 * type, what the runtime holds (initial_resource_versions) and a wildcard
 * unless it names resources; on any, names subscribed ("*": every resource)
 * and unsubscribed (dropped from what it holds: the runtime drops them
 * itself). 0, or -1 with msg.
 */
static int delta_subscribe(sl_controller_t *ctl, runtime_rec_t *rt, int t,
                           const Sluice__V1__DiscoveryRequest *req, int first, char *msg,
                           size_t len)
{
    const char *tn = sl_xds_type_names[t];
    const fleet_t *f = fleet_find(ctl, rt->fleet_name);
    size_t max = (f ? f->t[t].n_ents : 0) + DELTA_NAMES_SLACK;
    if (req->n_initial_resource_versions > max || req->n_resource_names_subscribe > max) {
        snprintf(msg, len,
                 "node %s: %s: more than %zu initial_resource_versions or "
                 "resource_names_subscribe entries (the fleet's %s and %d more)",
                 rt->node_id, tn, max, tn, DELTA_NAMES_SLACK);
        return -1;
    }
    if (first) {
        have_clear(rt, t);
        json_decref(rt->d[t].parked);
        json_decref(rt->d[t].subs);
        rt->d[t].have = json_object();
        rt->d[t].parked = json_object();
        rt->d[t].subs = req->n_resource_names_subscribe ? json_object() : NULL;
        rt->acked[t][0] = '\0';
        snprintf(rt->d[t].version, VERSION_LEN, "%s", req->version_info ? req->version_info : "");
        for (size_t i = 0; i < req->n_initial_resource_versions; i++) {
            const Sluice__V1__DiscoveryRequest__InitialResourceVersionsEntry *e =
                req->initial_resource_versions[i];
            const char *k = e->key ? e->key : "", *v = e->value ? e->value : "";
            json_t *jv = json_string(v);
            int bad = !k[0] || strlen(k) > DELTA_NAME_MAX || strlen(v) > DELTA_VERSION_MAX ||
                      !jv || have_set(rt, t, k, jv) != 0;
            json_decref(jv);
            if (bad) {
                snprintf(msg, len,
                         "node %s: %s initial_resource_versions: entry \"%.60s\" is not a "
                         "resource name (1 to %d bytes of UTF-8) with a version of at most %d "
                         "bytes",
                         rt->node_id, tn, k, DELTA_NAME_MAX, DELTA_VERSION_MAX);
                return -1;
            }
        }
    }
    int star = 0;
    for (size_t i = 0; i < req->n_resource_names_subscribe; i++)
        star |= strcmp(req->resource_names_subscribe[i], "*") == 0;
    if (star) {
        json_decref(rt->d[t].subs);
        rt->d[t].subs = NULL;
    }
    for (size_t i = 0; rt->d[t].subs && i < req->n_resource_names_subscribe; i++) {
        const char *k = req->resource_names_subscribe[i];
        if (!k[0] || strlen(k) > DELTA_NAME_MAX ||
            json_object_set_new(rt->d[t].subs, k, json_true()) != 0) {
            snprintf(msg, len,
                     "node %s: %s resource_names_subscribe: \"%.60s\" is not a resource name "
                     "(1 to %d bytes of UTF-8)",
                     rt->node_id, tn, k, DELTA_NAME_MAX);
            return -1;
        }
    }
    for (size_t i = 0; i < req->n_resource_names_unsubscribe; i++) {
        const char *k = req->resource_names_unsubscribe[i];
        if (strcmp(k, "*") == 0) {
            if (!rt->d[t].subs)
                rt->d[t].subs = json_object();
            continue;
        }
        json_object_del(rt->d[t].subs, k);
        have_del(rt, t, k);
        json_object_del(rt->d[t].parked, k);
    }
    if (json_object_size(rt->d[t].subs) > max) {
        snprintf(msg, len, "node %s: %s: more than %zu names subscribed", rt->node_id, tn, max);
        return -1;
    }
    return 0;
}

/*
 * Attaches the stream to its node's record (created if new), after the
 * stream's first valid subscription. A node with a stream already open gets
 * the new one; the older is closed with ALREADY_EXISTS, so it cannot stay
 * open and silently never get another update. NULL when refused.
 */
static runtime_rec_t *runtime_attach(sl_controller_t *ctl, sl_stream_t *s, stream_ctx_t *sc)
{
    runtime_rec_t *rt = NULL;
    for (runtime_rec_t *r = ctl->runtimes; r; r = r->next)
        if (strcmp(r->node_id, sc->node_id) == 0)
            rt = r;
    if (!rt) {
        if (ctl->n_runtimes >= ctl->max_runtimes && evict_one(ctl) != 0) {
            char msg[256];
            snprintf(msg, sizeof(msg),
                     "this controller already serves --max-runtimes %zu connected runtimes",
                     ctl->max_runtimes);
            refuse(s, sc, GRPC_STATUS_RESOURCE_EXHAUSTED, msg);
            return NULL;
        }
        rt = calloc(1, sizeof(*rt));
        if (!rt || !(rt->node_id = strdup(sc->node_id))) {
            free(rt);
            return NULL;
        }
        rt->next = ctl->runtimes;
        ctl->runtimes = rt;
        ctl->n_runtimes++;
        atomic_store(&sl_ctrl_metrics.runtime_records, ctl->n_runtimes);
    }
    const char *peer = sl_stream_peer(s);
    if (rt->stream && rt->stream != s) {
        char msg[320];
        snprintf(msg, sizeof(msg),
                 "replaced by a newer stream from %s (node id %s; do two runtimes share one "
                 "--node-id?)",
                 peer, rt->node_id);
        sl_log_warn("runtime %s: stream from %s %s", rt->node_id, rt->address, msg);
        stream_ctx_t *old = sl_stream_user(rt->stream);
        if (old) {
            old->rt = NULL;
            old->refused = 1;
        }
        sl_stream_close(rt->stream, GRPC_STATUS_ALREADY_EXISTS, msg);
        rt->streams_replaced++;
        free(rt->replaced_address);
        free(rt->replaced_by);
        rt->replaced_address = strdup(rt->address ? rt->address : "");
        rt->replaced_by = strdup(peer);
        rt->replaced_at_ms = now_ms();
        atomic_fetch_add(&sl_ctrl_metrics.streams_replaced, 1);
        atomic_fetch_sub(&sl_ctrl_metrics.runtimes_connected, 1);
    }
    sc->rt = rt;
    rt->stream = s;
    free(rt->fleet_name);
    rt->fleet_name = strdup(sc->fleet);
    free(rt->address);
    rt->address = strdup(peer);
    free(rt->build_version);
    rt->build_version = strdup(sc->build_version);
    rt->connected_since_ms = now_ms();
    rt->disconnected_ms = 0;
    rt->inflight_nonce[0] = '\0';
    /* A new stream starts fresh: what was NACKed on an earlier one (a busy
     * port, say) may apply now. */
    memset(rt->subscribed, 0, sizeof(rt->subscribed));
    memset(rt->parked, 0, sizeof(rt->parked));
    delta_reset(rt);
    rt->delta = sc->delta;
    atomic_fetch_add(&sl_ctrl_metrics.runtimes_connected, 1);
    sl_log_notice("runtime %s (fleet %s) connected from %s%s%s%s", rt->node_id, rt->fleet_name,
                  rt->address, sl_stream_client_auth(s) ? " (client certificate " : "",
                  sl_stream_client_auth(s) ? sl_stream_peer_certificate_text(s) : "",
                  sl_stream_client_auth(s) ? ")" : "");
    if (!fleet_find(ctl, rt->fleet_name)) {
        fleet_get(ctl, rt->fleet_name);
        sl_controller_changed(ctl); /* compile for the new fleet */
    }
    runtimes_changed(ctl);
    return rt;
}

static void on_request(void *arg, sl_stream_t *s, Sluice__V1__DiscoveryRequest *req)
{
    sl_controller_t *ctl = arg;
    stream_ctx_t *sc = sl_stream_user(s);
    char msg[512];
    if (!sc || sc->refused)
        goto out;
    if (!sc->rt && take_node(sc, req->node, msg, sizeof(msg)) != 0) {
        refuse(s, sc, GRPC_STATUS_INVALID_ARGUMENT, msg);
        goto out;
    }
    /* Under mTLS a node is who its certificate says: a runtime cannot take
     * another node's stream, nor (with fleet SANs in the certificates) the
     * snapshot of another fleet, whose private keys it carries. Checked
     * before anything is registered. */
    if (!sc->rt && sl_stream_client_auth(s) &&
        !sl_stream_peer_certificate_matches(s, sc->node_id)) {
        snprintf(msg, sizeof(msg),
                 "node id %s does not match the client certificate (%s%s); run the runtime "
                 "with --node-id set to a name of its certificate, or give it a certificate "
                 "issued for %s",
                 sc->node_id, sl_stream_peer_certificate_uses_cn(s) ? "no SAN, " : "SANs: ",
                 sl_stream_peer_certificate_text(s), sc->node_id);
        refuse(s, sc, GRPC_STATUS_PERMISSION_DENIED, msg);
        goto out;
    }
    if (!sc->rt && sl_stream_client_auth(s) &&
        !sl_stream_peer_certificate_allows_fleet(s, sc->fleet)) {
        snprintf(msg, sizeof(msg),
                 "node %s: fleet %s is not a fleet of its client certificate (SANs: %s); run the "
                 "runtime with --fleet set to one of its " SL_STREAM_FLEET_URI_PREFIX
                 " SANs, or give it a certificate for fleet %s",
                 sc->node_id, sc->fleet, sl_stream_peer_certificate_text(s), sc->fleet);
        refuse(s, sc, GRPC_STATUS_PERMISSION_DENIED, msg);
        goto out;
    }
    /* The stream's mode is that of its first request. */
    if (!sc->mode_known) {
        sc->mode_known = 1;
        sc->delta = req->incremental;
    } else if (sc->delta != req->incremental) {
        snprintf(msg, sizeof(msg),
                 "node %s: a request %s incremental on a %s stream; a stream keeps the mode of "
                 "its first request (sotw or delta)",
                 sc->node_id, req->incremental ? "with" : "without", sc->delta ? "delta" : "sotw");
        refuse(s, sc, GRPC_STATUS_INVALID_ARGUMENT, msg);
        goto out;
    }
    int t = sl_xds_type_from_url(req->type_url ? req->type_url : "");
    if (t < 0) {
        /* Ignored (a newer runtime may know more types), and it registers
         * nothing. */
        if (!sc->warned_unknown)
            sl_log_warn("stream %s node %s: unknown type \"%.100s\" ignored", sl_stream_peer(s),
                        sc->node_id, req->type_url ? req->type_url : "");
        sc->warned_unknown = 1;
        goto out;
    }
    const char *nonce = req->response_nonce ? req->response_nonce : "";
    const char *version = req->version_info ? req->version_info : "";
    uint64_t v = 0;
    if (!nonce[0] && check_version(ctl, sc->node_id, t, version, &v, msg, sizeof(msg)) != 0) {
        refuse(s, sc, GRPC_STATUS_INVALID_ARGUMENT, msg);
        goto out;
    }
    runtime_rec_t *rt = sc->rt;
    if (!rt) {
        if (nonce[0])
            goto out; /* answers nothing this stream was sent */
        if (!(rt = runtime_attach(ctl, s, sc)))
            goto out;
    }
    rt->last_seen_ms = now_ms();
    if (nonce[0]) {
        /* Matched by nonce, and the type must agree: the type and version
         * settled are those of the response in flight, never the
         * request's. */
        if (!rt->inflight_nonce[0] || strcmp(nonce, rt->inflight_nonce) != 0 ||
            t != rt->inflight_type) {
            sl_log_debug("runtime %s: stale %s for %s nonce %.32s ignored", rt->node_id,
                         req->error_detail ? "NACK" : "ACK", sl_xds_type_names[t], nonce);
            goto out;
        }
        rt->inflight_nonce[0] = '\0';
        uint64_t took_us = sl_ctrl_now_us() - rt->inflight_sent_us;
        sl_ctrl_hist_observe(
            req->error_detail ? &sl_ctrl_push_nack_seconds : &sl_ctrl_push_ack_seconds, took_us);
        if (req->error_detail) {
            snprintf(rt->nack[t].version, VERSION_LEN, "%s", rt->inflight_version);
            if (!rt->delta) /* delta parks resources, not the type (delta_settle) */
                snprintf(rt->parked[t], VERSION_LEN, "%s", rt->inflight_version);
            free(rt->nack[t].message);
            rt->nack[t].message =
                truncated_message(req->error_detail->message ? req->error_detail->message : "");
            rt->nack[t].at_ms = now_ms();
            atomic_fetch_add(&sl_ctrl_metrics.nacks, 1);
            sl_log_warn("runtime %s NACKed %s version %s: %s", rt->node_id, sl_xds_type_names[t],
                        rt->inflight_version, rt->nack[t].message ? rt->nack[t].message : "");
        } else {
            /* Delta: at the fleet's version once nothing is left to send
             * (try_push_delta). */
            if (!rt->delta)
                snprintf(rt->acked[t], VERSION_LEN, "%s", rt->inflight_version);
            atomic_fetch_add(&sl_ctrl_metrics.acks, 1);
        }
        if (rt->delta)
            delta_settle(rt, t, req);
    } else if (rt->delta) {
        int first = !rt->subscribed[t];
        rt->subscribed[t] = 1;
        if (delta_subscribe(ctl, rt, t, req, first, msg, sizeof(msg)) != 0) {
            refuse(s, sc, GRPC_STATUS_INVALID_ARGUMENT, msg);
            goto out;
        }
    } else {
        /* Subscription, also after a reconnect: what does it run already? */
        rt->subscribed[t] = 1;
        if (strcmp(rt->acked[t], version) != 0)
            rt->parked[t][0] = '\0'; /* another version: start fresh */
        snprintf(rt->acked[t], VERSION_LEN, "%s", version);
    }
    /* What it runs or rejected moved: other replicas count it too. */
    runtimes_changed(ctl);
    if (!nonce[0]) {
        uint64_t ours =
            ctl->config_version > ctl->version_floor ? ctl->config_version : ctl->version_floor;
        if (v > ours) {
            /* The runtime runs a newer version than we ever issued (store
             * restored from an old backup?): move past it so runtimes never
             * see a version go backwards. The next compile allocates a
             * version above the floor and persists it. */
            ctl->version_floor = v;
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

static uint64_t parse_version(const char *v)
{
    uint64_t n = 0;
    return sl_xds_version_parse(v, &n) == 0 ? n : 0;
}

#define PROGRAMMED_NACK_SHOWN 200 /* bytes of a NACK reason in a condition */
#define PROGRAMMED_MESSAGE_MAX 2048

static int fleet_name_cmp(const void *a, const void *b)
{
    return strcmp((*(fleet_t *const *)a)->name, (*(fleet_t *const *)b)->name);
}

/* Appends printf-style text to buf (len bytes), keeping it terminated. */
static void appendf(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void appendf(char *buf, size_t len, const char *fmt, ...)
{
    size_t used = strlen(buf);
    if (used + 1 >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, len - used, fmt, ap);
    va_end(ap);
}

/* A connected runtime as status reads count it: one of this replica's, or
 * one another live replica of a shared store serves (texts borrowed from
 * the record or from ctl->peers, until they change). */
typedef struct {
    const char *node_id, *fleet;
    const char *acked[SL_XDS__COUNT];
    const char *nack_version[SL_XDS__COUNT], *nack_message[SL_XDS__COUNT];
} rt_view_t;

static const char *jstr(json_t *o, const char *key)
{
    const char *v = json_string_value(json_object_get(o, key));
    return v ? v : "";
}

/* Every connected runtime once: this replica's, then the other live
 * replicas' whose node is not connected here (one that moved here from a
 * replica killed a moment ago counts once). Free the array. */
static rt_view_t *connected_views(sl_controller_t *ctl, size_t *n)
{
    size_t cap = ctl->n_runtimes + json_array_size(ctl->peers) + 1;
    rt_view_t *v = calloc(cap, sizeof(*v));
    *n = 0;
    if (!v)
        return NULL;
    json_t *here = json_array_size(ctl->peers) ? json_object() : NULL;
    for (const runtime_rec_t *rt = ctl->runtimes; rt; rt = rt->next) {
        if (!rt->stream)
            continue;
        rt_view_t *x = &v[(*n)++];
        x->node_id = rt->node_id;
        x->fleet = rt->fleet_name ? rt->fleet_name : "";
        for (int t = 0; t < SL_XDS__COUNT; t++) {
            x->acked[t] = rt->acked[t];
            x->nack_version[t] = rt->nack[t].version;
            x->nack_message[t] = rt->nack[t].message;
        }
        if (here)
            json_object_set_new(here, rt->node_id, json_true());
    }
    size_t i;
    json_t *doc;
    json_array_foreach(ctl->peers, i, doc)
    {
        if (!json_is_true(json_object_get(doc, "connected")) ||
            json_object_get(here, jstr(doc, "node_id")))
            continue;
        rt_view_t *x = &v[(*n)++];
        x->node_id = jstr(doc, "node_id");
        x->fleet = jstr(doc, "fleet");
        json_t *types = json_object_get(doc, "types");
        for (int t = 0; t < SL_XDS__COUNT; t++) {
            json_t *ty = json_object_get(types, sl_xds_type_names[t]);
            json_t *nack = json_object_get(ty, "nack");
            x->acked[t] = jstr(ty, "acked_version");
            x->nack_version[t] = jstr(nack, "version");
            x->nack_message[t] = json_string_value(json_object_get(nack, "message"));
        }
    }
    json_decref(here);
    return v;
}

/* What a status read says of the runtimes it counted, with several
 * replicas on a shared store: appended to the Programmed message. */
static void append_scope(const sl_controller_t *ctl, char *msg, size_t len)
{
    if (!ctl->replica)
        return;
    if (ctl->peer_error[0])
        appendf(msg, len, " (counted on this controller replica only: %s)", ctl->peer_error);
    else
        appendf(msg, len, " (runtimes of %zu live controller replica%s)",
                json_object_size(ctl->peer_live), json_object_size(ctl->peer_live) == 1 ? "" : "s");
}

/*
 * The Programmed condition and status.fleets of an Api (type SL_XDS_ROUTE)
 * or a Gateway (SL_XDS_LISTENER), from where its spec is programmed
 * (record_programmed) and what each connected runtime ACKed, so ACKs, NACKs
 * and disconnects show at the next read without any write. A runtime runs
 * the object when its ACK of that type is at or past the fleet's version
 * for it (types are pushed in order: routes after the clusters, settings,
 * consumers and secrets they use, listeners last); it rejected the object
 * when it runs an older one and its last NACK of that type is for that
 * version or later. An Api counts the runtimes of every fleet, a Gateway
 * those of its own fleet (the only one in its record).
 */
static void object_programmed(sl_controller_t *ctl, json_t *rec, json_t *status, int type)
{
    const int own_fleet_only = type == SL_XDS_LISTENER;
    json_t *conds = json_object_get(status, "conditions");
    const char *accepted = json_string_value(json_object_get(json_array_get(conds, 0), "status"));
    json_t *vers = json_object_get(rec, "fleets");
    size_t nf = 0;
    for (fleet_t *f = ctl->fleets; f; f = f->next)
        nf++;
    fleet_t **fl = calloc(nf ? nf : 1, sizeof(*fl));
    int *conn = calloc(nf ? nf : 1, sizeof(int)), *prog = calloc(nf ? nf : 1, sizeof(int));
    if (!fl || !conn || !prog) {
        free(fl);
        free(conn);
        free(prog);
        return;
    }
    size_t i = 0;
    for (fleet_t *f = ctl->fleets; f; f = f->next)
        fl[i++] = f;
    qsort(fl, nf, sizeof(*fl), fleet_name_cmp);
    int total = 0, total_prog = 0, rejected = 0;
    const rt_view_t *first_reject = NULL;
    size_t nv = 0;
    rt_view_t *views = connected_views(ctl, &nv);
    for (size_t k = 0; k < nv; k++) {
        const rt_view_t *rt = &views[k];
        for (i = 0; i < nf && strcmp(fl[i]->name, rt->fleet) != 0; i++)
            ;
        if (i == nf)
            continue; /* a fleet not compiled yet */
        if (own_fleet_only && !json_object_get(vers, fl[i]->name))
            continue;
        uint64_t v = (uint64_t)json_integer_value(json_object_get(vers, fl[i]->name));
        conn[i]++;
        total++;
        if (v && parse_version(rt->acked[type]) >= v) {
            prog[i]++;
            total_prog++;
        } else if (v && rt->nack_message[type] && parse_version(rt->nack_version[type]) >= v) {
            rejected++;
            if (!first_reject || strcmp(rt->node_id, first_reject->node_id) < 0)
                first_reject = rt;
        }
    }
    json_t *fleets = json_array();
    char msg[PROGRAMMED_MESSAGE_MAX] = "";
    int missing = 0; /* fleets with runtimes whose snapshot lacks the spec */
    for (i = 0; i < nf; i++) {
        if (own_fleet_only && !json_object_get(vers, fl[i]->name))
            continue;
        json_int_t v = json_integer_value(json_object_get(vers, fl[i]->name));
        json_array_append_new(fleets,
                              json_pack("{s:s, s:I, s:i, s:i}", "fleet", fl[i]->name, "version", v,
                                        "runtimes", conn[i], "programmed", prog[i]));
        if (!conn[i])
            continue;
        if (v)
            appendf(msg, sizeof(msg), "%sfleet %s: %d of %d runtime%s run%s version %" PRId64,
                    msg[0] ? "; " : "", fl[i]->name, prog[i], conn[i], conn[i] == 1 ? "" : "s",
                    prog[i] == 1 ? "s" : "", (int64_t)v);
        else {
            missing++;
            appendf(msg, sizeof(msg), "%sfleet %s: 0 of %d runtime%s: not in the fleet's snapshot",
                    msg[0] ? "; " : "", fl[i]->name, conn[i], conn[i] == 1 ? "" : "s");
        }
    }
    const char *st = "False", *reason;
    if (!accepted || strcmp(accepted, "True") != 0) {
        reason = "NotAccepted";
        appendf(msg, sizeof(msg), "%snot compiled into the fleets' snapshots (see Accepted)",
                msg[0] ? "; " : "");
    } else if (!total) {
        reason = "NoRuntimes";
        const char *only = NULL;
        void *it = own_fleet_only ? json_object_iter(vers) : NULL;
        if (it)
            only = json_object_iter_key(it);
        if (only)
            snprintf(msg, sizeof(msg), "no runtime of fleet %s is connected", only);
        else
            snprintf(msg, sizeof(msg), "no runtime of any fleet is connected");
    } else if (rejected) {
        reason = "Rejected";
        /* The first NACK reason (by node id), cut short. */
        const char *m = first_reject->nack_message[type];
        size_t keep = strlen(m);
        if (keep > PROGRAMMED_NACK_SHOWN) {
            keep = PROGRAMMED_NACK_SHOWN;
            while (keep > 0 && ((unsigned char)m[keep] & 0xC0) == 0x80)
                keep--;
        }
        appendf(msg, sizeof(msg), "; %d runtime%s rejected it, %s NACKed %s version %s: %.*s%s",
                rejected, rejected == 1 ? "" : "s", first_reject->node_id, sl_xds_type_names[type],
                first_reject->nack_version[type], (int)keep, m, keep < strlen(m) ? "..." : "");
    } else if (total_prog == total && !missing) {
        st = "True";
        reason = "Programmed";
    } else {
        reason = "Pending";
    }
    append_scope(ctl, msg, sizeof(msg));
    free(views);
    json_t *gen = json_object_get(rec, "generation");
    json_array_append_new(conds,
                          json_pack("{s:s, s:s, s:s, s:s, s:O}", "type", "Programmed", "status", st,
                                    "reason", reason, "message", msg, "observedGeneration", gen));
    json_object_set_new(status, "fleets", fleets);
    free(fl);
    free(conn);
    free(prog);
}

json_t *sl_controller_object_status(sl_controller_t *ctl, enum sl_kind kind, const char *ns,
                                    const char *name)
{
    char key[600];
    snprintf(key, sizeof(key), "%s/%s/%s", sl_kind_plural(kind), ns, name);
    json_t *st = json_object_get(ctl->statuses, key);
    json_t *rec = kind == SL_KIND_API || kind == SL_KIND_GATEWAY
                      ? json_object_get(ctl->programmed, key)
                      : NULL;
    if (!st || !rec)
        return st ? json_incref(st) : NULL;
    /* A copy of the status and its conditions (the shared one stays as
     * compiled); the conditions themselves are shared, not changed. */
    json_t *out = json_copy(st);
    json_t *conds = json_copy(json_object_get(st, "conditions"));
    if (!out || !conds) {
        json_decref(out);
        json_decref(conds);
        return json_incref(st);
    }
    json_object_set_new(out, "conditions", conds);
    object_programmed(ctl, rec, out, kind == SL_KIND_GATEWAY ? SL_XDS_LISTENER : SL_XDS_ROUTE);
    return out;
}

json_t *sl_controller_own_runtimes_json(sl_controller_t *ctl)
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
                    last_nack =
                        json_pack("{s:s, s:s, s:s, s:s}", "type", sl_xds_type_names[t], "version",
                                  rt->nack[t].version, "message", rt->nack[t].message, "at", at);
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
        json_t *replaced = json_null();
        if (rt->streams_replaced) {
            char at[32];
            iso_time(rt->replaced_at_ms, at, sizeof(at));
            json_decref(replaced);
            replaced = json_pack("{s:s, s:s, s:s}", "address", rt->replaced_address, "replaced_by",
                                 rt->replaced_by, "at", at);
        }
        json_t *item =
            json_pack("{s:s, s:s, s:s, s:s, s:b, s:s, s:s, s:s, s:I, s:o, s:o, s:I}", "node_id",
                      rt->node_id, "fleet", rt->fleet_name ? rt->fleet_name : "", "address",
                      rt->address ? rt->address : "", "build_version",
                      rt->build_version ? rt->build_version : "", "connected", rt->stream != NULL,
                      "connected_since", since, "last_seen", seen, "disconnected_at", gone,
                      "acked_version", (json_int_t)max_v, "types", types, "last_nack", last_nack,
                      "responses_sent", (json_int_t)rt->responses_sent);
        /* Streams of this node closed for a newer one: two runtimes with
         * one node id show up here (and in the logs of both). */
        json_object_set_new(item, "streams_replaced",
                            json_integer((json_int_t)rt->streams_replaced));
        json_object_set_new(item, "last_replaced", replaced);
        /* What went to it over its streams: bytes of responses, resources
         * in them (delta: only changed ones). */
        json_object_set_new(item, "mode", json_string(rt->delta ? "delta" : "sotw"));
        json_object_set_new(item, "bytes_sent", json_integer((json_int_t)rt->bytes_sent));
        json_object_set_new(item, "resources_sent", json_integer((json_int_t)rt->resources_sent));
        json_array_append_new(arr, item);
    }
    return arr;
}

json_t *sl_controller_runtimes_json(sl_controller_t *ctl)
{
    json_t *own = sl_controller_own_runtimes_json(ctl);
    if (!ctl->replica || !own)
        return own;
    /* Every runtime once: a node connected here is this replica's; one
     * connected to another live replica (and only remembered here) is
     * that one's. */
    json_t *connected_here = json_object(), *hide = json_object(), *out = json_array();
    size_t i;
    json_t *doc;
    json_array_foreach(own, i, doc)
    {
        if (json_is_true(json_object_get(doc, "connected")))
            json_object_set_new(connected_here, jstr(doc, "node_id"), json_true());
    }
    json_array_foreach(ctl->peers, i, doc)
    {
        const char *node = jstr(doc, "node_id");
        if (json_object_get(connected_here, node))
            continue;
        if (json_is_true(json_object_get(doc, "connected")))
            json_object_set_new(hide, node, json_true());
        else
            continue; /* shown below unless this replica has a record */
    }
    json_array_foreach(own, i, doc)
    {
        if (json_object_get(hide, jstr(doc, "node_id")))
            continue;
        json_object_set_new(doc, "replica", json_string(ctl->replica));
        json_array_append(out, doc);
        json_object_set_new(hide, jstr(doc, "node_id"), json_true());
    }
    json_array_foreach(ctl->peers, i, doc)
    {
        const char *node = jstr(doc, "node_id");
        int conn = json_is_true(json_object_get(doc, "connected"));
        if (json_object_get(connected_here, node) || (!conn && json_object_get(hide, node)))
            continue;
        json_array_append(out, doc);
    }
    json_decref(connected_here);
    json_decref(hide);
    json_decref(own);
    return out;
}

json_t *sl_controller_runtimes_view(sl_controller_t *ctl)
{
    if (!ctl->replica)
        return NULL;
    json_t *names = json_array();
    const char *name;
    json_t *v;
    json_object_foreach(ctl->peer_live, name, v) json_array_append_new(names, json_string(name));
    if (!json_object_get(ctl->peer_live, ctl->replica))
        json_array_append_new(names, json_string(ctl->replica));
    /* Sorted: the same array on every replica. */
    for (size_t i = 1; i < json_array_size(names); i++)
        for (size_t j = i; j > 0 && strcmp(json_string_value(json_array_get(names, j - 1)),
                                           json_string_value(json_array_get(names, j))) > 0;
             j--) {
            json_t *a = json_incref(json_array_get(names, j - 1));
            json_array_set(names, j - 1, json_array_get(names, j));
            json_array_set_new(names, j, a);
        }
    return json_pack("{s:s, s:o, s:s, s:o}", "replica", ctl->replica, "replicas", names, "scope",
                     ctl->peer_error[0] ? "this_replica" : "all_replicas", "error",
                     ctl->peer_error[0] ? json_string(ctl->peer_error) : json_null());
}

/* The best row of a node among the other replicas': connected first, then
 * the newest connection (a replica killed a moment ago still says
 * connected). */
static int peer_better(json_t *a, json_t *b)
{
    int ca = json_is_true(json_object_get(a, "connected"));
    int cb = json_is_true(json_object_get(b, "connected"));
    if (ca != cb)
        return ca > cb;
    return strcmp(jstr(a, "connected_since"), jstr(b, "connected_since")) > 0;
}

void sl_controller_set_replica(sl_controller_t *ctl, const char *name, void (*changed)(void *arg),
                               void *arg)
{
    free(ctl->replica);
    ctl->replica = name ? strdup(name) : NULL;
    ctl->runtimes_fn = changed;
    ctl->runtimes_arg = arg;
    if (!name) {
        json_decref(ctl->peers);
        json_decref(ctl->peer_live);
        ctl->peers = ctl->peer_live = NULL;
        ctl->peer_error[0] = '\0';
    }
}

void sl_controller_set_peers(sl_controller_t *ctl, json_t *rows, json_t *live, const char *why)
{
    json_t *best = json_object(); /* node id -> doc */
    size_t i;
    json_t *doc;
    json_array_foreach(rows, i, doc)
    {
        const char *node = jstr(doc, "node_id");
        json_t *had = json_object_get(best, node);
        if (node[0] && (!had || peer_better(doc, had)))
            json_object_set(best, node, doc);
    }
    json_t *peers = json_array();
    json_array_foreach(rows, i, doc)
    {
        if (json_object_get(best, jstr(doc, "node_id")) == doc)
            json_array_append(peers, doc);
    }
    json_decref(best);
    json_decref(ctl->peers);
    ctl->peers = peers;
    json_decref(ctl->peer_live);
    ctl->peer_live = live ? json_deep_copy(live) : json_object();
    snprintf(ctl->peer_error, sizeof(ctl->peer_error), "%s", why ? why : "");
    /* A fleet only another replica's runtimes use is compiled here too, so
     * that status reads show it the same on every replica. */
    json_array_foreach(ctl->peers, i, doc)
    {
        const char *fl = jstr(doc, "fleet");
        if (fl[0] && json_is_true(json_object_get(doc, "connected")) && !fleet_find(ctl, fl)) {
            fleet_get(ctl, fl);
            sl_controller_changed(ctl);
        }
    }
}

/* A runtime is "at" the fleet's version when it acknowledged every type's
 * current version. */
static int runtime_in_sync(const rt_view_t *rt, const fleet_t *f)
{
    for (int t = 0; t < SL_XDS__COUNT; t++)
        if (strcmp(rt->acked[t], f->t[t].version_str) != 0)
            return 0;
    return 1;
}

json_t *sl_controller_status_json(sl_controller_t *ctl)
{
    size_t nv = 0;
    rt_view_t *views = connected_views(ctl, &nv);
    json_t *fleets = json_object();
    for (fleet_t *f = ctl->fleets; f; f = f->next) {
        uint64_t v = 0;
        for (int t = 0; t < SL_XDS__COUNT; t++)
            if (f->t[t].version > v)
                v = f->t[t].version;
        int connected = 0, at = 0;
        for (size_t k = 0; k < nv; k++) {
            if (strcmp(views[k].fleet, f->name) != 0)
                continue;
            connected++;
            at += runtime_in_sync(&views[k], f);
        }
        json_object_set_new(fleets, f->name,
                            json_pack("{s:I, s:b, s:i, s:i}", "version", (json_int_t)v, "compiled",
                                      f->compiled_ok, "runtimes_connected", connected,
                                      "runtimes_at_version", at));
    }
    json_t *st = json_pack("{s:I, s:o}", "config_version", (json_int_t)ctl->config_version,
                           "fleets", fleets);
    /* Why versions do not move (a store that cannot be written): null when
     * all is well. */
    json_object_set_new(st, "error",
                        ctl->version_error[0] ? json_string(ctl->version_error) : json_null());
    /* Several replicas: whose runtimes the fleets count. */
    json_t *view = sl_controller_runtimes_view(ctl);
    if (view)
        json_object_set_new(st, "runtimes_view", view);
    free(views);
    return st;
}

int sl_controller_ready(void *arg, char *why, size_t whylen)
{
    sl_controller_t *ctl = arg;
    if (ctl->version_error[0]) {
        snprintf(why, whylen, "%s", ctl->version_error);
        return 0;
    }
    return 1;
}

/* ---- life cycle ----------------------------------------------------------- */

/*
 * A config_version past 2^53-1 is a store written by a controller that took
 * any version a runtime reported (a stray client could send
 * 18446744073709551615): no version can follow it, so nothing would ever be
 * pushed again. Continue from the newest version this store actually gave a
 * fleet's type, which every runtime it served runs at most.
 */
static void repair_config_version(sl_controller_t *ctl)
{
    char err[512];
    uint64_t v, max = 0;
    if (sl_store_counter_read(ctl->store, "config_version", &v, err, sizeof(err)) != 0) {
        sl_log_error("%s", err);
        return;
    }
    if (v <= SL_XDS_VERSION_MAX)
        return;
    if (sl_store_counter_max(ctl->store, "fleet/%/version", SL_XDS_VERSION_MAX, &max, err,
                             sizeof(err)) != 0 ||
        sl_store_counter_set(ctl->store, "config_version", max, err, sizeof(err)) != 0) {
        sl_log_error("config_version %" PRIu64 " is past 2^53-1 and cannot be repaired: %s", v,
                     err);
        return;
    }
    sl_log_warn("config_version was %" PRIu64 ", past 2^53-1 (reported by a runtime to a "
                "controller that did not check versions); continuing from %" PRIu64
                ", the newest version this store gave its fleets",
                v, max);
}

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
    ctl->programmed = json_object();
    ctl->max_routes = 200000;
    ctl->compile_ev = evtimer_new(base, compile_cb, ctl);
    ctl->retry_ev = evtimer_new(base, retry_cb, ctl);
    ctl->sweep_ev = event_new(base, -1, EV_PERSIST, sweep_cb, ctl);
    if (!ctl->compile_ev || !ctl->retry_ev || !ctl->sweep_ev) {
        sl_controller_free(ctl);
        return NULL;
    }
    sl_controller_set_runtime_limits(ctl, SL_CONTROLLER_DEFAULT_MAX_RUNTIMES,
                                     SL_CONTROLLER_DEFAULT_RUNTIME_EXPIRY_MS);
    repair_config_version(ctl);
    ctl->config_version = sl_store_counter_get(store, "config_version");
    atomic_store(&sl_ctrl_metrics.config_version, ctl->config_version);
    return ctl;
}

void sl_controller_use_input(sl_controller_t *ctl, const sl_resource_set_t *set)
{
    ctl->static_set = set;
    ctl->derived_versions = 1;
    ctl->config_version = 0;
    atomic_store(&sl_ctrl_metrics.config_version, 0);
}

void sl_controller_use_store_versions(sl_controller_t *ctl)
{
    ctl->derived_versions = 1;
    ctl->store_versions = 1;
    ctl->input_ready = 1;
    ctl->config_version = 0;
    atomic_store(&sl_ctrl_metrics.config_version, 0);
}

void sl_controller_set_input_version(sl_controller_t *ctl, uint64_t input_version)
{
    ctl->input_version = input_version;
    ctl->input_ready = 1;
}

void sl_controller_on_compiled(sl_controller_t *ctl, void (*fn)(void *arg), void *arg)
{
    ctl->compiled_fn = fn;
    ctl->compiled_arg = arg;
}

void sl_controller_set_runtime_limits(sl_controller_t *ctl, size_t max_runtimes, uint64_t expiry_ms)
{
    ctl->max_runtimes = max_runtimes ? max_runtimes : 1;
    ctl->runtime_expiry_ms = expiry_ms;
    /* Swept at a tenth of the expiry (1 s to 60 s): a record outlives its
     * expiry by at most that. */
    uint64_t every = expiry_ms / 10;
    every = every < 1000 ? 1000 : every > 60000 ? 60000 : every;
    if (expiry_ms < 1000)
        every = expiry_ms ? expiry_ms : 100;
    struct timeval tv = {(time_t)(every / 1000), (suseconds_t)(every % 1000) * 1000};
    event_add(ctl->sweep_ev, &tv);
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
    sl_stream_hooks_t h = {
        .on_open = on_open, .on_request = on_request, .on_close = on_close, .ctx = ctl};
    return h;
}

void sl_controller_free(sl_controller_t *ctl)
{
    if (!ctl)
        return;
    if (ctl->compile_ev)
        event_free(ctl->compile_ev);
    if (ctl->retry_ev)
        event_free(ctl->retry_ev);
    if (ctl->sweep_ev)
        event_free(ctl->sweep_ev);
    fleet_t *f = ctl->fleets;
    while (f) {
        fleet_t *next = f->next;
        fleet_free(f);
        f = next;
    }
    runtime_rec_t *rt = ctl->runtimes;
    while (rt) {
        runtime_rec_t *next = rt->next;
        runtime_free(rt);
        rt = next;
    }
    json_decref(ctl->statuses);
    json_decref(ctl->api_routes);
    json_decref(ctl->programmed);
    json_decref(ctl->peers);
    json_decref(ctl->peer_live);
    free(ctl->replica);
    facts_release(ctl->facts, ctl->n_facts);
    json_decref(ctl->routes_undo);
    free(ctl);
}

/* Connected runtimes per fleet: every fleet the controller compiles for
 * (0 when none is connected now) and every fleet a connected runtime names. */
void sl_controller_render_metrics(sl_controller_t *ctl, struct evbuffer *b)
{
    static const char *const modes[2] = {"sotw", "delta"};
    evbuffer_add_printf(b, "# HELP sluice_controller_push_responses_total Config responses sent "
                           "to runtimes, by stream mode.\n"
                           "# TYPE sluice_controller_push_responses_total counter\n");
    for (int m = 0; m < 2; m++)
        evbuffer_add_printf(b, "sluice_controller_push_responses_total{mode=\"%s\"} %" PRIu64 "\n",
                            modes[m], atomic_load(&push_count[m]));
    evbuffer_add_printf(b, "# HELP sluice_controller_push_bytes_total Bytes of config responses "
                           "sent to runtimes, by stream mode.\n"
                           "# TYPE sluice_controller_push_bytes_total counter\n");
    for (int m = 0; m < 2; m++)
        evbuffer_add_printf(b, "sluice_controller_push_bytes_total{mode=\"%s\"} %" PRIu64 "\n",
                            modes[m], atomic_load(&push_bytes[m]));
    evbuffer_add_printf(b, "# HELP sluice_controller_push_resources_total Resources in config "
                           "responses sent to runtimes, by stream mode.\n"
                           "# TYPE sluice_controller_push_resources_total counter\n");
    for (int m = 0; m < 2; m++)
        evbuffer_add_printf(b, "sluice_controller_push_resources_total{mode=\"%s\"} %" PRIu64 "\n",
                            modes[m], atomic_load(&push_resources[m]));
    evbuffer_add_printf(b,
                        "# HELP sluice_controller_compiled_resources_total Backends, Apis and "
                        "Consumers compiled (compile cache misses, every fleet): a change "
                        "recompiles only what it touches.\n"
                        "# TYPE sluice_controller_compiled_resources_total counter\n"
                        "sluice_controller_compiled_resources_total %" PRIu64 "\n",
                        atomic_load(&compiled_resources));
    if (ctl && ctl->store) {
        uint64_t mem = 0, db = 0;
        sl_store_load_stats(ctl->store, &mem, &db);
        evbuffer_add_printf(b,
                            "# HELP sluice_controller_store_loads_total Reads of every stored "
                            "resource for a compile: from the in-memory set kept current by "
                            "this controller's writes, or from the database (start, another "
                            "process wrote, PostgreSQL).\n"
                            "# TYPE sluice_controller_store_loads_total counter\n"
                            "sluice_controller_store_loads_total{from=\"memory\"} %" PRIu64 "\n"
                            "sluice_controller_store_loads_total{from=\"database\"} %" PRIu64 "\n",
                            mem, db);
    }
    uint64_t cpu = atomic_load(&compile_cpu_us);
    evbuffer_add_printf(b,
                        "# HELP sluice_controller_compile_cpu_seconds_total CPU time of the "
                        "main thread in compiles (store read, compile, packing, versions; not "
                        "the pushes).\n"
                        "# TYPE sluice_controller_compile_cpu_seconds_total counter\n"
                        "sluice_controller_compile_cpu_seconds_total %" PRIu64 ".%06" PRIu64 "\n",
                        cpu / 1000000, cpu % 1000000);
    evbuffer_add_printf(b, "# HELP sluice_controller_fleet_runtimes_connected Runtimes with an "
                           "open config stream, by fleet.\n"
                           "# TYPE sluice_controller_fleet_runtimes_connected gauge\n");
    if (!ctl)
        return;
    for (fleet_t *f = ctl->fleets; f; f = f->next) {
        uint64_t n = 0;
        for (runtime_rec_t *rt = ctl->runtimes; rt; rt = rt->next)
            n += rt->stream && rt->fleet_name && strcmp(rt->fleet_name, f->name) == 0;
        evbuffer_add(b, "sluice_controller_fleet_runtimes_connected{fleet=\"", 50);
        sl_prom_label_value(b, f->name);
        evbuffer_add_printf(b, "\"} %" PRIu64 "\n", n);
    }
}
