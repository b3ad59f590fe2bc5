/*
 * The controller core: resources -> per-fleet snapshots -> pushes to the
 * runtimes connected over the config stream. The REST API (rest.c) writes to
 * the store and then tells the core what changed; the core owns compile
 * scheduling (coalescing), object status (e.g. a missing Backend) and the
 * state of every runtime. Main-thread API unless said otherwise.
 */
#ifndef SL_CONTROLLER_H
#define SL_CONTROLLER_H

#include "model.h"
#include "store.h"

#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>

struct event_base;
typedef struct sl_controller sl_controller_t;

/* Called after every durable change of the resource store. Cheap: it only
 * schedules a (coalesced) recompile. */
void sl_controller_changed(sl_controller_t *ctl);

/*
 * Admission against the controller's limits (--max-routes), before a write
 * is stored: `objs` is an array of the documents about to be written. 0 when
 * they fit (and the core counts them from now on), or -1 with err naming
 * the count and the limit ("config would have 200001 routes, more than
 * --max-routes 200000"); nothing is counted then.
 */
int sl_controller_admit(sl_controller_t *ctl, json_t *objs, char *err, size_t errlen);
/* A stored object was deleted (its routes no longer count). */
void sl_controller_forget(sl_controller_t *ctl, enum sl_kind kind, const char *ns,
                          const char *name);

/* The status the controller computed for an object, e.g.
 * {"conditions":[{"type":"Accepted","status":"False","reason":"BackendNotFound",
 *   "message":"spec.backendRefs[0].name: Backend \"default/echo\" not found"}],
 *  "observedGeneration":3}. New reference, or NULL when none is known yet. */
json_t *sl_controller_object_status(sl_controller_t *ctl, enum sl_kind kind, const char *ns,
                                    const char *name);

/* GET /api/v1/runtimes: [{node_id, fleet, address, connected, connected_since,
 * last_seen, acked_version, types:{<type>: {acked_version, nack:{version,
 * message, at}}}, streams_replaced, last_replaced}] for every runtime that is
 * connected or was within --runtime-expiry. New ref. */
json_t *sl_controller_runtimes_json(sl_controller_t *ctl);
/* With several replicas on a shared store: {"replica": this one's name,
 * "replicas": [live replicas], "scope": "all_replicas" or "this_replica",
 * "error": why the others' runtimes are not counted, or null}; NULL for a
 * single controller. New ref. */
json_t *sl_controller_runtimes_view(sl_controller_t *ctl);

/* GET /api/v1/status: {config_version, error, fleets:{<fleet>:{version,
 * runtimes_connected, runtimes_at_version}}}; error says why versions cannot
 * be persisted, null when they can. New ref. */
json_t *sl_controller_status_json(sl_controller_t *ctl);

/* Counters for /metrics, written by the core and the stream thread. */
typedef struct {
    _Atomic uint64_t pushes; /* responses sent */
    _Atomic uint64_t acks;
    _Atomic uint64_t nacks;
    _Atomic uint64_t compiles;
    _Atomic uint64_t compile_errors;
    _Atomic int64_t runtimes_connected;
    _Atomic uint64_t store_writes;
    _Atomic uint64_t config_version;
    _Atomic uint64_t streams_replaced; /* closed for a newer stream of the same node */
    _Atomic uint64_t streams_refused;  /* closed for an invalid request or a full table */
    _Atomic uint64_t streams_over_limit;      /* ended at once: --max-streams */
    _Atomic uint64_t stream_accepts_deferred; /* waited for --stream-accept-rate */
    _Atomic uint64_t runtimes_expired; /* records forgotten (expiry or --max-runtimes) */
    _Atomic uint64_t runtime_records;  /* records kept, connected or not */
} sl_ctrl_metrics_t;
extern sl_ctrl_metrics_t sl_ctrl_metrics;

struct evbuffer;
/* The core's own /metrics families (sluice_controller_fleet_runtimes_connected);
 * main thread. With ctl NULL, only their HELP and TYPE. */
void sl_controller_render_metrics(sl_controller_t *ctl, struct evbuffer *b);

#endif
