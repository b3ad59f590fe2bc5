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
/* --max-routes (0 = no limit). */
void sl_controller_set_max_routes(sl_controller_t *ctl, uint64_t max_routes);
/* Compiles at once (start-up), instead of after the coalescing delay. */
void sl_controller_compile_now(sl_controller_t *ctl);
/* Hooks to give sl_stream_server_start. */
sl_stream_hooks_t sl_controller_stream_hooks(sl_controller_t *ctl);
void sl_controller_free(sl_controller_t *ctl);

#endif
