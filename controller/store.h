/*
 * Durable resource store of the controller: SQLite in WAL mode with
 * synchronous=FULL, so a write acknowledged with a 2xx survives kill -9 and
 * power loss; the schema is migrated by version on open. Or PostgreSQL
 * (sl_store_open_postgres), shared by several controller replicas: the
 * same schema and API; each replica's observer also sees the others' writes
 * (store_pg.h).
 *
 * Holds the resources (as the JSON documents the user wrote, plus server
 * metadata) and the controller's counters that must never go backwards (the
 * config version pushed to runtimes). Single-threaded: the controller's main
 * thread owns it.
 */
#ifndef SL_STORE_H
#define SL_STORE_H

#include "model.h"

#include <event2/event.h>
#include <jansson.h>
#include <stdint.h>

typedef struct sl_store sl_store_t;

/* Opens (creating) DATA_DIR/sluice.db. NULL with a message naming the path
 * and the fix. */
sl_store_t *sl_store_open(const char *data_dir, char *err, size_t errlen);
/* `url`: a libpq connection URI, postgres://USER@HOST:PORT/DB?... (the
 * password in it, or from PGPASSWORD / PGPASSFILE; never logged). NULL
 * with a message naming the store (without its password) and the fix. */
sl_store_t *sl_store_open_postgres(const char *url, char *err, size_t errlen);
void sl_store_close(sl_store_t *st);
/* PostgreSQL: LISTEN for other replicas' writes, check every 5 s, reconnect
 * with backoff, on `base`; on_change is called after changes of any replica
 * were replayed to the observer. A no-op for SQLite. 0 or -1. */
int sl_store_attach(sl_store_t *st, struct event_base *base, void (*on_change)(void *arg),
                    void *arg);
/* 1 when the store can be written; else 0 with why naming it (a PostgreSQL
 * store that cannot be reached). `arg` is the store (a readiness check). */
int sl_store_available(void *arg, char *why, size_t whylen);
/* Its name for messages: the SQLite file, or the URI without password. */
const char *sl_store_name(const sl_store_t *st);
/* 1 for a store several controllers may share (PostgreSQL). */
int sl_store_shared(const sl_store_t *st);
/* The config resourceVersion of the state the last sl_store_load_all
 * returned: the resourceVersion of the newest write that changed a spec,
 * labels or annotations, or deleted an object (status writes do not move
 * it). Read in the same snapshot as the objects, so replicas that loaded the
 * same state get the same number. */
uint64_t sl_store_loaded_version(const sl_store_t *st);

/*
 * A shared store (PostgreSQL): what each controller replica serves, so
 * every replica can answer status reads over all of them (replicas.h).
 * Tables controller_replicas (name, heartbeat in the server's clock, a
 * generation of its rows) and controller_runtimes (replica, node_id, fleet,
 * connected, doc: the runtime as /api/v1/runtimes shows it). -1 with err
 * for SQLite or a store that cannot be reached.
 *
 * publish: one transaction: this replica's heartbeat; `rows` (a JSON array
 * text of runtime documents, each with node_id, NULL for none) upserted by
 * node id and the node ids of `gone` (a JSON array text, NULL for none)
 * deleted, or, `full`, rows replacing all of this replica's; replicas
 * without a heartbeat for timeout_ms and their rows are removed (`removed`,
 * when not NULL, gets name -> rows removed). 1, when not full, if this
 * replica's row was new (another replica had removed it with its rows):
 * publish in full.
 */
int sl_store_replica_publish(sl_store_t *st, const char *replica, const char *rows,
                             const char *gone, int full, uint64_t timeout_ms, json_t *removed,
                             char *err, size_t errlen);
/* live (when not NULL): live replicas, this one too, name -> generation of
 * their rows. rows (when not NULL): the runtime documents of the live
 * replicas other than `replica`, each with "replica" set. */
int sl_store_replica_read(sl_store_t *st, const char *replica, uint64_t timeout_ms, json_t *live,
                          json_t *rows, char *err, size_t errlen);
/* Removes this replica's heartbeat and rows (a clean stop); 0 or -1. */
int sl_store_replica_leave(sl_store_t *st, const char *replica);

enum sl_store_result {
    SL_STORE_OK = 0,
    SL_STORE_NOT_FOUND,
    SL_STORE_EXISTS,      /* create of an existing object (409) */
    SL_STORE_CONFLICT,    /* resourceVersion precondition failed (409/412) */
    SL_STORE_ERROR,       /* I/O or SQLite error, message in err */
    SL_STORE_UNAVAILABLE, /* PostgreSQL cannot be reached (503), message in err */
};

/*
 * Writes one object. `obj` is a validated document; the store sets
 * metadata.resourceVersion (a store-wide increasing integer, as a string),
 * metadata.generation (+1 when spec changes), metadata.uid and
 * metadata.creationTimestamp (kept from the existing object), and ignores
 * `status` (the controller computes it; a status written through
 * sl_store_put_status is kept). mode:
 *   SL_STORE_CREATE   fail with SL_STORE_EXISTS if present
 *   SL_STORE_REPLACE  create or replace
 * expect_rv: "" = no precondition, else must equal the stored
 * resourceVersion (SL_STORE_CONFLICT otherwise; SL_STORE_NOT_FOUND if absent).
 * On success *stored is a new reference to the object as stored. Durable
 * before return.
 */
enum sl_store_mode { SL_STORE_CREATE = 0, SL_STORE_REPLACE };
enum sl_store_result sl_store_put(sl_store_t *st, json_t *obj, enum sl_store_mode mode,
                                  const char *expect_rv, json_t **stored, char *err, size_t errlen);

/* Several objects in one transaction (all or nothing), mode REPLACE. */
enum sl_store_result sl_store_put_many(sl_store_t *st, json_t *objs /* array */,
                                       json_t **stored /* array */, char *err, size_t errlen);

enum sl_store_result sl_store_get(sl_store_t *st, enum sl_kind kind, const char *ns,
                                  const char *name, json_t **obj);

/* Deletes; *deleted gets the last stored object. expect_rv as for put. */
enum sl_store_result sl_store_delete(sl_store_t *st, enum sl_kind kind, const char *ns,
                                     const char *name, const char *expect_rv, json_t **deleted,
                                     char *err, size_t errlen);

/* The status subresource (the Kubernetes-compatible API): stores `status`
 * (an object, borrowed) as the object's written status, durable before
 * return; resourceVersion moves on, generation does not. From then on get
 * and list return the object with that status (until it is deleted); a
 * spec write keeps it. expect_rv as for put. On success *stored is a new
 * reference to the object with its status. */
enum sl_store_result sl_store_put_status(sl_store_t *st, enum sl_kind kind, const char *ns,
                                         const char *name, json_t *status, const char *expect_rv,
                                         json_t **stored, char *err, size_t errlen);

/* Objects of a kind (ns NULL = all namespaces), ordered by namespace, name. */
enum sl_store_result sl_store_list(sl_store_t *st, enum sl_kind kind, const char *ns,
                                   json_t **array);

/* Every stored object into a resource set (source "<plural>/<ns>/<name>",
 * doc 0), for the compiler. */
enum sl_store_result sl_store_load_all(sl_store_t *st, sl_resource_set_t *set, char *err,
                                       size_t errlen);

/* The same set without a copy, for the compiler: *out is owned by the
 * store and valid until the next call on it (the in-memory set itself when
 * it is current, else a full load; PostgreSQL catches up with the other
 * replicas' changes first). Its documents are never changed in place: a
 * write replaces a document by a new object. In byte order of (kind,
 * namespace, name) on both backends. */
enum sl_store_result sl_store_load_shared(sl_store_t *st, const sl_resource_set_t **out, char *err,
                                          size_t errlen);
/* How many sl_store_load_shared calls were served from the in-memory set
 * (SQLite: kept current by this process's writes; PostgreSQL: by every
 * replica's replayed changes; nothing read or parsed) and how many loads
 * read every row (at start, after a write by another process, a change not
 * replayed one by one, a lost connection or any failure to keep the memory
 * current). sl_store_load_all on SQLite is served from memory too. */
void sl_store_load_stats(const sl_store_t *st, uint64_t *from_memory, uint64_t *from_database);
/* Latest resourceVersion handed out (0 for an empty store). */
uint64_t sl_store_resource_version(sl_store_t *st);

/* A durable monotonic counter by name: returns the incremented value,
 * persisted before return; 0 on error (logged with the cause). */
uint64_t sl_store_counter_next(sl_store_t *st, const char *name);
/* 0 when absent or on error (logged); sl_store_counter_read tells them apart. */
uint64_t sl_store_counter_get(sl_store_t *st, const char *name);
/* 0 with *out set (0 when absent), or -1 with err naming the cause. */
int sl_store_counter_read(sl_store_t *st, const char *name, uint64_t *out, char *err,
                          size_t errlen);
/* Sets a named durable 64-bit value (creating it); 0 on success, -1 with err
 * naming the store, the counter and SQLite's reason. Used for the config
 * version and the per-fleet, per-type versions and content hashes, so a
 * restarted controller knows what its runtimes already have. */
int sl_store_counter_set(sl_store_t *st, const char *name, uint64_t value, char *err,
                         size_t errlen);
/* The largest value in [0, limit] of the counters whose name matches the SQL
 * LIKE pattern `like` (0 when none): 0, or -1 with err. */
int sl_store_counter_max(sl_store_t *st, const char *like, uint64_t limit, uint64_t *out, char *err,
                         size_t errlen);

/* Called after every durable write, once per object (put_many: after the
 * commit, in order): type "ADDED" (no object of that kind/namespace/name
 * before), "MODIFIED" or "DELETED"; `obj` is the stored document (for
 * DELETED the last stored one with metadata.resourceVersion set to the
 * deletion's). Borrowed for the call. Feeds watches (watch.h). */
typedef void (*sl_store_observer_fn)(void *arg, const char *type, enum sl_kind kind, json_t *obj);
void sl_store_set_observer(sl_store_t *st, sl_store_observer_fn fn, void *arg);
/* Time of the last write operation in microseconds (for metrics). */
uint64_t sl_store_last_write_us(const sl_store_t *st);

#endif
