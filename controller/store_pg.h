/*
 * The PostgreSQL backend of the store (store.h, --store postgres://...):
 * internal to store.c, which keeps every piece of logic that is not
 * backend-specific (server metadata, generation, uid, timestamps, JSON
 * handling, the observer) and calls these primitives where the SQLite
 * backend runs its own statements.
 *
 * Several controllers share one database: every write transaction takes
 * one advisory transaction lock before it reads anything, so writes are
 * serialized across replicas and resourceVersions (a SEQUENCE) are committed
 * in increasing order; every write NOTIFYs sluice_changes with its
 * resourceVersion; a second connection LISTENs on the caller's event base
 * and each replica replays what changed (sl_store_pg_sync) into the store's
 * observer, also every 5 s in case a notification was missed.
 *
 * Availability: when the server cannot be reached, every call fails at once
 * (no query waits for a dead connection) and sl_store_pg_available() says why;
 * a timer reconnects with backoff (0.25 s doubling to 5 s), non-blocking
 * (PQconnectPoll on the event loop).
 */
#ifndef SL_STORE_PG_H
#define SL_STORE_PG_H

#include <event2/event.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sl_store_pg sl_store_pg_t;
typedef struct sl_store sl_store_t;

/* One row of `resources` (texts borrowed until the next call on pg). */
typedef struct {
    bool found;
    const char *uid, *spec_hash, *body, *created_at, *status; /* status NULL = none */
    int64_t rv, generation;
} sl_store_pg_row_t;

/* Row callbacks of list/load: 0 to go on, -1 to stop with an error. */
typedef int (*sl_store_pg_list_fn)(void *arg, const char *body, const char *status);
typedef int (*sl_store_pg_load_fn)(void *arg, const char *kind, const char *ns, const char *name,
                                   const char *body);

/* `url` is a libpq connection URI (postgres:// or postgresql://).
 * `display` gets the URI without its password, for every message. The
 * migrations (SQL texts) run under an advisory lock, in one transaction.
 * NULL with err on failure. `owner` is told of changes (sl_store__emit). */
sl_store_pg_t *sl_store_pg_open(sl_store_t *owner, const char *url, const char *const *migrations,
                                int nmigrations, char *display, size_t displaylen, char *err,
                                size_t errlen);
void sl_store_pg_close(sl_store_pg_t *pg);

/* The last error of the server or of the connection. */
const char *sl_store_pg_errmsg(sl_store_pg_t *pg);
/* 1 when connected; else 0 with why (the server's or libpq's reason). */
int sl_store_pg_available(sl_store_pg_t *pg, char *why, size_t whylen);

/* A write transaction (serialized across replicas). commit NOTIFYs rv when
 * it is not 0. All: 0 or -1. */
int sl_store_pg_begin(sl_store_pg_t *pg);
int sl_store_pg_commit(sl_store_pg_t *pg, uint64_t notify_rv);
void sl_store_pg_rollback(sl_store_pg_t *pg);
int sl_store_pg_next_rv(sl_store_pg_t *pg, uint64_t *rv);

int sl_store_pg_row_get(sl_store_pg_t *pg, const char *kind, const char *ns, const char *name,
                        sl_store_pg_row_t *row);
int sl_store_pg_upsert(sl_store_pg_t *pg, const char *kind, const char *ns, const char *name,
                       const char *uid, uint64_t rv, int64_t generation, const char *hash,
                       const char *body, const char *created, const char *now);
int sl_store_pg_delete(sl_store_pg_t *pg, const char *kind, const char *ns, const char *name);
int sl_store_pg_set_status(sl_store_pg_t *pg, const char *kind, const char *ns, const char *name,
                           const char *status, uint64_t rv, const char *body, const char *now);
int sl_store_pg_tombstone(sl_store_pg_t *pg, uint64_t rv, const char *kind, const char *ns,
                          const char *name, const char *body);
int sl_store_pg_list(sl_store_pg_t *pg, const char *kind, const char *ns, sl_store_pg_list_fn fn,
                     void *arg);
/* Every row and `config_counter` read in one snapshot. */
int sl_store_pg_load_all(sl_store_pg_t *pg, sl_store_pg_load_fn fn, void *arg,
                         const char *config_counter, uint64_t *config_rv);

int sl_store_pg_counter_read(sl_store_pg_t *pg, const char *name, uint64_t *out);
int sl_store_pg_counter_write(sl_store_pg_t *pg, const char *name, uint64_t value);
int sl_store_pg_counter_max(sl_store_pg_t *pg, const char *like, uint64_t limit, uint64_t *out);

/* Newest resourceVersion this replica has replayed to the observer. */
uint64_t sl_store_pg_seen(sl_store_pg_t *pg);
/* Replays the changes committed since the last sync (any replica's) to the
 * store's observer, in resourceVersion order, then calls on_change if there
 * were any. 0 or -1 (unavailable). */
int sl_store_pg_sync(sl_store_pg_t *pg);
/* LISTEN, the periodic check and reconnection on `base`. */
int sl_store_pg_attach(sl_store_pg_t *pg, struct event_base *base, void (*on_change)(void *arg),
                       void *arg);

/* Replicas and the runtimes connected to each (tables controller_replicas
 * and controller_runtimes, store.h sl_store_replica_publish). All: 0 or
 * -1 with sl_store_pg_errmsg. publish: in one transaction, this replica's
 * heartbeat (the server's now()); `rows` (a JSON array text of runtime
 * documents, NULL for none) are upserted by node_id and the node ids of
 * `gone` (a JSON array text, NULL for none) deleted, or, `full`, rows
 * replaces all of this replica's; replicas without a heartbeat for
 * timeout_ms and their rows are removed (into `removed`: name -> rows, when
 * not NULL). Returns 1, when not full, if this replica's row was new
 * (removed by another replica meanwhile, with its rows): publish in full. */
int sl_store_pg_replica_publish(sl_store_pg_t *pg, const char *replica, const char *rows,
                                const char *gone, int full, uint64_t timeout_ms, json_t *removed);
/* Live replicas (heartbeat within timeout_ms, this one too) into `out`:
 * name -> generation of their rows. */
int sl_store_pg_replicas_live(sl_store_pg_t *pg, uint64_t timeout_ms, json_t *out);
/* The runtime rows of the live replicas other than `replica`, each
 * document with "replica" set, appended to the array `out`. */
int sl_store_pg_replica_rows(sl_store_pg_t *pg, const char *replica, uint64_t timeout_ms,
                             json_t *out);
/* Removes this replica and its rows (a clean stop). */
int sl_store_pg_replica_leave(sl_store_pg_t *pg, const char *replica);

/* store.c: tells the observer of one change replayed by sl_store_pg_sync (the
 * stored body and written status texts, status NULL when none). */
void sl_store__emit(sl_store_t *st, const char *type, const char *body, const char *status);
/* The replay may have missed changes (the connection was lost): the
 * store's in-memory set is dropped, the next compile reads every row. */
void sl_store__doubt(sl_store_t *st);
/* The config resourceVersion (counter `config_resource_version`) as of the
 * last replay that found changes, or of the last full load. */
uint64_t sl_store_pg_seen_config(sl_store_pg_t *pg);

#endif
