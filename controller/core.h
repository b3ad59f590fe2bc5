/*
 * Controller core life cycle (the REST-facing API is in controller.h).
 */
#ifndef SL_CORE_H
#define SL_CORE_H

#include "controller.h"
#include "stream.h"

/* static_set: resources from --resources files (immutable mode), or NULL to
 * compile from the store. The set must outlive the controller. */
sl_controller_t *sl_controller_new(struct event_base *base, sl_store_t *store,
                                   const sl_resource_set_t *static_set);
/*
 * --source kubernetes (ksource.c): the resources are `set`, owned by the
 * caller and changed by it on the main thread between compiles (it calls
 * sl_controller_changed after each change; nothing is compiled before the
 * first sl_controller_set_input_version). Versions are then derived from
 * the input instead of the store's durable counter, so that every replica
 * watching the same API server gives the same content the same version:
 * a compile that changes anything gives every type the version
 * `input_version` (the newest resourceVersion of the input, see
 * docs/architecture.md), or one past the current version when the input's
 * did not move past it. Nothing is persisted in the store.
 */
void sl_controller_use_input(sl_controller_t *ctl, const sl_resource_set_t *set);
void sl_controller_set_input_version(sl_controller_t *ctl, uint64_t input_version);
/* A store shared by several replicas (sl_store_shared): versions derived
 * from the store's config resourceVersion (sl_store_loaded_version) the
 * same way, so that every replica gives the same stored state the same
 * version; nothing is persisted in the counters. */
void sl_controller_use_store_versions(sl_controller_t *ctl);
/* Called on the main thread after every committed compile (the statuses
 * are then current), e.g. to write statuses back. */
void sl_controller_on_compiled(sl_controller_t *ctl, void (*fn)(void *arg), void *arg);
/* --max-routes (0 = no limit). */
void sl_controller_set_max_routes(sl_controller_t *ctl, uint64_t max_routes);
/* Records of runtimes: at most max_runtimes (the one disconnected longest
 * ago is forgotten for a new one; when all are connected a new node is
 * refused), and a disconnected runtime is forgotten after expiry_ms.
 * Defaults: --max-runtimes 10000, --runtime-expiry 3600 s. */
#define SL_CONTROLLER_DEFAULT_MAX_RUNTIMES 10000
#define SL_CONTROLLER_DEFAULT_RUNTIME_EXPIRY_MS 3600000ULL
void sl_controller_set_runtime_limits(sl_controller_t *ctl, size_t max_runtimes,
                                      uint64_t expiry_ms);
/* For /readyz (sl_rest_options_t.is_ready, ctx = the controller): 1 when
 * ready, else 0 with why (e.g. the store refuses to persist versions). */
int sl_controller_ready(void *ctl, char *why, size_t whylen);
/*
 * A store shared by replicas (replicas.c). set_replica: this replica's
 * name (NULL: none, a single controller), shown as "replica" of its
 * runtimes; changed(arg) is called when one of its runtimes connects,
 * disconnects, ACKs or NACKs (the callee coalesces).
 * set_peers: the runtimes of the other live replicas (`rows`, documents of
 * /api/v1/runtimes with "replica" set; copied) and the live replicas
 * (`live`, names as keys, this one too); or, with why, that they cannot be
 * read: status reads then count this replica's runtimes only and say why.
 * own_runtimes_json: this replica's runtime records only (new ref).
 */
void sl_controller_set_replica(sl_controller_t *ctl, const char *name, void (*changed)(void *arg),
                               void *arg);
void sl_controller_set_peers(sl_controller_t *ctl, json_t *rows, json_t *live, const char *why);
json_t *sl_controller_own_runtimes_json(sl_controller_t *ctl);
/* Compiles at once (start-up), instead of after the coalescing delay. */
void sl_controller_compile_now(sl_controller_t *ctl);
/* Hooks to give sl_stream_server_start. */
sl_stream_hooks_t sl_controller_stream_hooks(sl_controller_t *ctl);
void sl_controller_free(sl_controller_t *ctl);

#endif
