/*
 * The runtime's side of the config stream (controller mode): a gRPC core
 * client that keeps one ConfigDiscovery.Stream open to the controller,
 * reconnecting with exponential back-off and jitter, and turns each pushed
 * response into a complete snapshot for sl_config_apply. Every push is
 * validated and compiled completely before it is applied; one that cannot be
 * applied is NACKed with the reason while the old generation keeps serving.
 *
 * Threads: a completion-queue thread does the gRPC I/O; decoding results
 * reach the main thread through an eventfd, and everything that touches the
 * config (apply, ACK/NACK decisions, state) runs on the main thread.
 */
#ifndef SL_XDS_H
#define SL_XDS_H

#include "config.h"

#include <jansson.h>

struct event_base;
typedef struct sl_xds sl_xds_t;

typedef struct {
    const char *controller; /* "127.0.0.1:18000" */
    const char *node_id;
    const char *fleet;
    const char *build_version;
    /* TLS (--controller-ca, --cert/--key): PEM texts checked by
     * tls_files.h, copied into the stream's credentials by sl_xds_start
     * (the pointers are not kept). ca_pem NULL = plaintext; cert_pem and
     * key_pem NULL = no client certificate. */
    const char *ca_pem, *cert_pem, *key_pem;
    /* --cache-dir: every applied snapshot is handed to it (NULL = none). */
    struct sl_snapcache *cache;
    /* --xds-mode: 1 = delta (incremental: per-resource versions, only
     * what changed is sent), 0 = state of the world. */
    int delta;
} sl_xds_options_t;

sl_xds_t *sl_xds_start(struct event_base *base, const sl_xds_options_t *opt, sl_config_t *cfg,
                       char *err, size_t errlen);
/* State for /config_dump: connected, controller, versions per type, last
 * error. New reference. */
json_t *sl_xds_status_json(sl_xds_t *x);
/* Delta mode: takes the resources of a snapshot served from --cache-dir
 * as held (copies), so the next subscription reports them
 * (initial_resource_versions) and the controller sends only what differs.
 * Nothing when something already came from the controller. */
void sl_xds_seed(sl_xds_t *x, const Sluice__V1__Snapshot *snap);
/* 1 once every resource type has been received and applied. */
int sl_xds_synced(const sl_xds_t *x);
void sl_xds_stop(sl_xds_t *x);

#endif
