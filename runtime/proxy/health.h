/*
 * Active HTTP health checks, run by the main thread on its event_base: for
 * every endpoint of every cluster that has a health_check, a timer sends
 * "GET <path>" on a fresh connection in the Backend's own protocol (HTTP/1.1,
 * HTTP/2 with prior knowledge for h2c, over TLS with the Backend's TLS
 * settings when it has `tls`, ALPN h2 for h2) and judges the status.
 * After unhealthy_threshold failures in a row the shared endpoint state
 * (endpoint.h) is marked unhealthy; after healthy_threshold successes it is
 * healthy again. Workers only read that flag.
 */
#ifndef SL_HEALTH_H
#define SL_HEALTH_H

#include "sluice/v1/snapshot.pb-c.h"

struct event_base;
struct ssl_ctx_st;
typedef struct sl_health sl_health_t;

/* The client TLS context traffic to snap->clusters[index] uses (the
 * generation's, built from the Backend's `tls`), or NULL. The checker takes
 * its own reference on it (SSL_CTX_up_ref). */
typedef struct ssl_ctx_st *(*sl_health_tls_fn)(void *arg, size_t cluster_index);

sl_health_t *sl_health_new(struct event_base *base);

/* Makes the checker follow `snap`: checks of endpoints that stay (same
 * cluster, address, port) keep their counters and schedule, new ones start
 * within one interval, removed ones stop. Copies what it needs from snap.
 * tls_of (may be NULL when no cluster has `tls`) gives the TLS context of
 * each cluster with `tls`; a check in flight keeps the settings it started
 * with. */
void sl_health_update(sl_health_t *hc, const Sluice__V1__Snapshot *snap, sl_health_tls_fn tls_of,
                      void *tls_arg);

void sl_health_free(sl_health_t *hc);

#endif
