/*
 * Several controller replicas on one PostgreSQL store (--store
 * postgres://...): each replica records the runtimes connected to it in the
 * store, with a heartbeat, and reads the other live replicas' records, so
 * that status reads (an Api's or Gateway's Programmed and status.fleets,
 * /api/v1/status fleets, /api/v1/runtimes) count every runtime of every
 * live replica and both replicas answer the same.
 *
 * Batched: one transaction per replica per HEARTBEAT (1 s): the heartbeat,
 * the runtime rows that changed when a runtime connected, disconnected,
 * subscribed, ACKed or NACKed since the last one (coalesced: the first
 * change after a quiet second is written within 20 ms, later ones at most
 * once a second; all rows only at start, after a store failure, or when
 * another replica had removed this one), and the removal of replicas
 * without a heartbeat for --replica-timeout (and their rows). Then the live
 * replicas are read, and their rows only when a replica's rows changed (a
 * generation per replica) or the live set did.
 *
 * A store that cannot be reached: the view falls back to this replica's own
 * runtimes (sl_controller_set_peers with why), which the status reads say.
 * Runs on the controller's main thread, on the store's connection, like the
 * store's own periodic check: a server that stops answering without closing
 * the connection holds the loop up to the statement timeout (5 s).
 *
 * Not responsible for: what a status read counts (core.c, over the rows
 * given to sl_controller_set_peers), the SQL (store_pg.c).
 */
#ifndef SL_REPLICAS_H
#define SL_REPLICAS_H

#include "controller.h"
#include "store.h"

#include <event2/event.h>
#include <stdint.h>

#define SL_REPLICAS_HEARTBEAT_MS 1000
#define SL_REPLICAS_DEFAULT_TIMEOUT_S 10

typedef struct sl_replicas sl_replicas_t;

/* name: this replica's name (NULL: <hostname>-<pid>-<random>); timeout_ms:
 * a replica without a heartbeat this long is gone. Starts at once (the
 * first heartbeat runs before this returns). NULL when out of memory. */
sl_replicas_t *sl_replicas_start(struct event_base *base, sl_store_t *store, sl_controller_t *ctl,
                                 const char *name, uint64_t timeout_ms);
/* A clean stop: this replica's rows are removed at once (the others stop
 * counting its runtimes without waiting for the timeout). */
void sl_replicas_stop(sl_replicas_t *r);

#endif
