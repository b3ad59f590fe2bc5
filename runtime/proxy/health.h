/*
 * Active HTTP health checks, run by the main thread on its event_base: for
 * every endpoint of every cluster that has a health_check, a timer sends
 * "GET <path> HTTP/1.1" on a fresh connection and judges the status line.
 * After unhealthy_threshold failures in a row the shared endpoint state
 * (endpoint.h) is marked unhealthy; after healthy_threshold successes it is
 * healthy again. Workers only read that flag.
 */
#ifndef SL_HEALTH_H
#define SL_HEALTH_H

#include "sluice/v1/snapshot.pb-c.h"

struct event_base;
typedef struct sl_health sl_health_t;

sl_health_t *sl_health_new(struct event_base *base);

/* Makes the checker follow `snap`: checks of endpoints that stay (same
 * cluster, address, port) keep their counters and schedule, new ones start
 * within one interval, removed ones stop. Copies what it needs from snap. */
void sl_health_update(sl_health_t *hc, const Sluice__V1__Snapshot *snap);

void sl_health_free(sl_health_t *hc);

#endif
