/*
 * PostgreSQL backend of the controller's store (store_pg.h): libpq, one
 * connection for the store's statements, one for LISTEN sluice_changes,
 * both on the controller's main thread.
 *
 * Responsible for: connecting (the user's URI, with connect_timeout,
 * keepalives and tcp_user_timeout defaults it may override; statement and
 * lock timeouts), migrating the schema under an advisory lock, the
 * primitives store.c calls, serializing write transactions across replicas
 * (pg_advisory_xact_lock before anything is read, so resourceVersions from
 * the SEQUENCE commit in increasing order and a replica that has replayed
 * up to N has seen every commit up to N), NOTIFY on commit, replaying other
 * replicas' writes into the observer, and reconnecting with backoff.
 *
 * Not responsible for: anything that is the same for SQLite (store.c).
 */
#include "store_pg.h"

#include "log.h"

#include <inttypes.h>
#include <libpq-fe.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Advisory lock keys: one for migrations (session), one for writes
 * (transaction). Any constant both replicas agree on. */
#define PG_MIGRATE_LOCK "7310012351540101"
#define PG_WRITE_LOCK "7310012351540102"
#define PG_CHANNEL "sluice_changes"
#define PG_CHECK_MS 5000
#define PG_BACKOFF_MIN_MS 250
#define PG_BACKOFF_MAX_MS 5000
/* Deletions are kept this many resourceVersions back; a replica that
 * replayed less recently than that compares its whole key set. */
#define PG_TOMBSTONE_KEEP 100000

struct sl_store_pg {
    sl_store_t *owner;
    char *url;
    char display[512];
    PGconn *conn;  /* statements; NULL while down */
    PGconn *lconn; /* LISTEN; NULL while not listening */
    PGresult *row; /* the last row_get's result (texts borrowed by the caller) */
    int in_tx;
    int down;
    char reason[512]; /* why down */
    char err[512];    /* last error */
    unsigned backoff_ms;
    uint64_t seen;
    json_t *known; /* "kind/ns/name" -> resourceVersion, of the objects replayed */
    /* The config resourceVersion in the snapshot of the last replay that
     * found changes (or of the last full load). */
    uint64_t seen_config_rv;
    struct event_base *base;
    struct event *check_ev, *listen_ev;
    /* A reconnection in progress (non-blocking: PQconnectStartParams and
     * PQconnectPoll on the event loop, so a server that does not answer
     * never holds the controller's loop): the connection, its event, for
     * which role, and when it is given up. */
    PGconn *pending;
    struct event *pending_ev;
    int pending_listen;
    struct timespec pending_deadline;
    void (*on_change)(void *arg);
    void *on_change_arg;
};

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* libpq messages end with a newline; messages here are one line. */
static void copy_msg(char *out, size_t outlen, const char *msg)
{
    snprintf(out, outlen, "%s", msg && msg[0] ? msg : "unknown error");
    for (char *p = out; *p; p++)
        if (*p == '\n' || *p == '\r' || *p == '\t')
            *p = (p[1] ? ' ' : '\0');
}

static void schedule(sl_store_pg_t *pg, unsigned ms)
{
    if (!pg->check_ev)
        return;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    event_add(pg->check_ev, &tv);
}

static void close_listen(sl_store_pg_t *pg)
{
    if (pg->listen_ev) {
        event_free(pg->listen_ev);
        pg->listen_ev = NULL;
    }
    if (pg->lconn) {
        PQfinish(pg->lconn);
        pg->lconn = NULL;
    }
}

static void cancel_pending(sl_store_pg_t *pg)
{
    if (pg->pending_ev) {
        event_free(pg->pending_ev);
        pg->pending_ev = NULL;
    }
    if (pg->pending) {
        PQfinish(pg->pending);
        pg->pending = NULL;
    }
}

/* The connection is gone: every call fails at once until the timer has
 * reconnected. */
static void mark_down(sl_store_pg_t *pg, const char *why)
{
    if (!pg->down)
        sl_log_error("store %s: unavailable: %s (writes answer 503 store_unavailable; "
                     "reconnecting)",
                     pg->display, why);
    pg->down = 1;
    copy_msg(pg->reason, sizeof(pg->reason), why);
    if (pg->owner)
        sl_store__doubt(pg->owner);
    PQclear(pg->row);
    pg->row = NULL;
    if (pg->conn) {
        PQfinish(pg->conn);
        pg->conn = NULL;
    }
    close_listen(pg);
    cancel_pending(pg);
    pg->in_tx = 0;
    pg->backoff_ms = PG_BACKOFF_MIN_MS;
    schedule(pg, pg->backoff_ms);
}

/* The server's NOTICEs (CREATE ... IF NOT EXISTS that skipped) go to the
 * debug log, not to stderr. */
static void on_notice(void *arg, const char *message)
{
    sl_store_pg_t *pg = arg;
    char msg[400];
    copy_msg(msg, sizeof(msg), message);
    sl_log_debug("store %s: %s", pg->display, msg);
}

/* Connection parameters: defaults first, the URI (dbname, expanded)
 * overrides any of them. */
static void connect_params(const sl_store_pg_t *pg, const char *keys[9], const char *vals[9])
{
    static const char *const k[] = {"connect_timeout",     "keepalives",       "keepalives_idle",
                                    "keepalives_interval", "keepalives_count", "tcp_user_timeout",
                                    "application_name",    "dbname",           NULL};
    static const char *const v[] = {"3", "1", "10", "3", "3", "10000", "sluice-controller"};
    for (int i = 0; i < 9; i++) {
        keys[i] = k[i];
        vals[i] = i < 7 ? v[i] : i == 7 ? pg->url : NULL;
    }
}

static PGconn *connect_url(sl_store_pg_t *pg, char *err, size_t errlen)
{
    const char *keys[9], *vals[9];
    connect_params(pg, keys, vals);
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    if (!c || PQstatus(c) != CONNECTION_OK) {
        char msg[400];
        copy_msg(msg, sizeof(msg), c ? PQerrorMessage(c) : "out of memory");
        set_err(err, errlen, "store %s: cannot connect: %s", pg->display, msg);
        PQfinish(c);
        return NULL;
    }
    PQsetNoticeProcessor(c, on_notice, pg);
    return c;
}

/* Runs sql on c; 0 when it gives `want`. */
static int exec_on(PGconn *c, const char *sql, ExecStatusType want, char *err, size_t errlen)
{
    PGresult *r = PQexec(c, sql);
    int ok = PQresultStatus(r) == want;
    if (!ok)
        copy_msg(err, errlen,
                 PQresultErrorMessage(r)[0] ? PQresultErrorMessage(r) : PQerrorMessage(c));
    PQclear(r);
    return ok ? 0 : -1;
}

/* Session settings of the statement connection: no statement or lock wait
 * longer than 5 s (a stuck replica holding the write lock, a server that
 * stopped answering), unless the URI's options set them. */
static int session_setup(sl_store_pg_t *pg, PGconn *c, char *err, size_t errlen)
{
    char msg[400];
    if (!strstr(pg->url, "statement_timeout") &&
        exec_on(c, "SET statement_timeout = 5000", PGRES_COMMAND_OK, msg, sizeof(msg))) {
        set_err(err, errlen, "store %s: %s", pg->display, msg);
        return -1;
    }
    if (!strstr(pg->url, "lock_timeout") &&
        exec_on(c, "SET lock_timeout = 5000", PGRES_COMMAND_OK, msg, sizeof(msg))) {
        set_err(err, errlen, "store %s: %s", pg->display, msg);
        return -1;
    }
    return 0;
}

/* A statement on the main connection; NULL (pg->err says why) unless it
 * gives `want`. */
static PGresult *q(sl_store_pg_t *pg, const char *sql, int n, const char *const *params,
                   ExecStatusType want)
{
    if (pg->down || !pg->conn) {
        set_err(pg->err, sizeof(pg->err), "unavailable: %s", pg->reason);
        return NULL;
    }
    PGresult *r = PQexecParams(pg->conn, sql, n, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(r) == want)
        return r;
    const char *m = PQresultErrorMessage(r);
    copy_msg(pg->err, sizeof(pg->err), m && m[0] ? m : PQerrorMessage(pg->conn));
    PQclear(r);
    if (PQstatus(pg->conn) == CONNECTION_BAD)
        mark_down(pg, pg->err);
    return NULL;
}

static int cmd(sl_store_pg_t *pg, const char *sql, int n, const char *const *params)
{
    PGresult *r = q(pg, sql, n, params, PGRES_COMMAND_OK);
    PQclear(r);
    return r ? 0 : -1;
}

const char *sl_store_pg_errmsg(sl_store_pg_t *pg)
{
    return pg->err;
}

int sl_store_pg_available(sl_store_pg_t *pg, char *why, size_t whylen)
{
    if (!pg->down)
        return 1;
    set_err(why, whylen, "store %s is unavailable: %s", pg->display, pg->reason);
    return 0;
}

/* ---- schema -------------------------------------------------------------- */

static int migrate(sl_store_pg_t *pg, const char *const *migrations, int n, char *err,
                   size_t errlen)
{
    char msg[400];
    PGconn *c = pg->conn;
    /* Two controllers starting at once: the second waits here, then finds
     * the schema current. */
    if (exec_on(c, "SELECT pg_advisory_lock(" PG_MIGRATE_LOCK ")", PGRES_TUPLES_OK, msg,
                sizeof(msg))) {
        set_err(err, errlen, "store %s: cannot take the migration lock: %s", pg->display, msg);
        return -1;
    }
    int version = 0, ret = -1;
    if (exec_on(c, "BEGIN", PGRES_COMMAND_OK, msg, sizeof(msg)) ||
        exec_on(c, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
                PGRES_COMMAND_OK, msg, sizeof(msg))) {
        set_err(err, errlen, "store %s: cannot start the schema migration: %s", pg->display, msg);
        goto out;
    }
    PGresult *r = PQexec(c, "SELECT max(version) FROM schema_version");
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        copy_msg(msg, sizeof(msg), PQresultErrorMessage(r));
        PQclear(r);
        set_err(err, errlen, "store %s: cannot read the schema version: %s", pg->display, msg);
        goto out;
    }
    if (PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
        version = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    if (version > n) {
        set_err(err, errlen,
                "store %s: schema version %d is newer than this sluice-controller knows (%d); "
                "run the sluice-controller that wrote it",
                pg->display, version, n);
        goto out;
    }
    for (int v = version; v < n; v++)
        if (exec_on(c, migrations[v], PGRES_COMMAND_OK, msg, sizeof(msg))) {
            set_err(err, errlen, "store %s: schema migration %d failed: %s", pg->display, v + 1,
                    msg);
            goto out;
        }
    if (version < n) {
        char sql[128];
        snprintf(sql, sizeof(sql),
                 "DELETE FROM schema_version; INSERT INTO schema_version (version) VALUES (%d)", n);
        if (exec_on(c, sql, PGRES_COMMAND_OK, msg, sizeof(msg))) {
            set_err(err, errlen, "store %s: cannot record the schema version: %s", pg->display,
                    msg);
            goto out;
        }
    }
    if (exec_on(c, "COMMIT", PGRES_COMMAND_OK, msg, sizeof(msg))) {
        set_err(err, errlen, "store %s: cannot commit the schema migration: %s", pg->display, msg);
        goto out;
    }
    if (version > 0 && version < n)
        sl_log_notice("store %s: schema migrated from version %d to %d", pg->display, version, n);
    ret = 0;
out:
    if (ret != 0)
        PQclear(PQexec(c, "ROLLBACK"));
    PQclear(PQexec(c, "SELECT pg_advisory_unlock(" PG_MIGRATE_LOCK ")"));
    return ret;
}

/* What this replica knows at start: every key and the newest
 * resourceVersion, in one snapshot. */
static int load_known(sl_store_pg_t *pg)
{
    json_object_clear(pg->known);
    if (cmd(pg, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", 0, NULL))
        return -1;
    PGresult *r = q(pg, "SELECT kind, namespace, name, resource_version FROM resources", 0, NULL,
                    PGRES_TUPLES_OK);
    PGresult *m = r ? q(pg,
                        "SELECT GREATEST((SELECT COALESCE(MAX(resource_version), 0) FROM "
                        "resources), (SELECT COALESCE(MAX(resource_version), 0) FROM deletions))",
                        0, NULL, PGRES_TUPLES_OK)
                    : NULL;
    if (!r || !m) {
        PQclear(r);
        if (!pg->down)
            PQclear(PQexec(pg->conn, "ROLLBACK"));
        return -1;
    }
    for (int i = 0; i < PQntuples(r); i++) {
        char key[800];
        snprintf(key, sizeof(key), "%s/%s/%s", PQgetvalue(r, i, 0), PQgetvalue(r, i, 1),
                 PQgetvalue(r, i, 2));
        json_object_set_new(pg->known, key, json_integer(strtoll(PQgetvalue(r, i, 3), NULL, 10)));
    }
    pg->seen = strtoull(PQgetvalue(m, 0, 0), NULL, 10);
    PQclear(r);
    PQclear(m);
    return cmd(pg, "COMMIT", 0, NULL);
}

/* The URI without its password: user@host:port/dbname. */
static int display_of(const char *url, char *out, size_t outlen, char *err, size_t errlen)
{
    char *perr = NULL;
    PQconninfoOption *opts = PQconninfoParse(url, &perr);
    if (!opts) {
        char msg[300];
        copy_msg(msg, sizeof(msg), perr ? perr : "out of memory");
        set_err(err, errlen,
                "--store: not a PostgreSQL connection URI: %s (expected "
                "postgres://USER@HOST:PORT/DBNAME?connect_timeout=3; the password from "
                "PGPASSWORD or PGPASSFILE, or in the URI)",
                msg);
        PQfreemem(perr);
        return -1;
    }
    const char *user = "", *host = "", *port = "", *db = "";
    for (PQconninfoOption *o = opts; o->keyword; o++) {
        if (!o->val)
            continue;
        if (!strcmp(o->keyword, "user"))
            user = o->val;
        else if (!strcmp(o->keyword, "host"))
            host = o->val;
        else if (!strcmp(o->keyword, "port"))
            port = o->val;
        else if (!strcmp(o->keyword, "dbname"))
            db = o->val;
    }
    snprintf(out, outlen, "postgres://%s%s%s%s%s/%s", user, user[0] ? "@" : "", host,
             port[0] ? ":" : "", port, db);
    PQconninfoFree(opts);
    return 0;
}

sl_store_pg_t *sl_store_pg_open(sl_store_t *owner, const char *url, const char *const *migrations,
                                int nmigrations, char *display, size_t displaylen, char *err,
                                size_t errlen)
{
    sl_store_pg_t *pg = calloc(1, sizeof(*pg));
    if (!pg || !(pg->url = strdup(url)) || !(pg->known = json_object())) {
        set_err(err, errlen, "store: out of memory");
        goto fail;
    }
    pg->owner = owner;
    if (display_of(url, pg->display, sizeof(pg->display), err, errlen) != 0)
        goto fail;
    snprintf(display, displaylen, "%s", pg->display);
    if (!(pg->conn = connect_url(pg, err, errlen)) || session_setup(pg, pg->conn, err, errlen) ||
        migrate(pg, migrations, nmigrations, err, errlen))
        goto fail;
    if (load_known(pg) != 0) {
        set_err(err, errlen, "store %s: cannot read the resources: %s", pg->display, pg->err);
        goto fail;
    }
    return pg;
fail:
    sl_store_pg_close(pg);
    return NULL;
}

void sl_store_pg_close(sl_store_pg_t *pg)
{
    if (!pg)
        return;
    if (pg->check_ev)
        event_free(pg->check_ev);
    cancel_pending(pg);
    close_listen(pg);
    PQclear(pg->row);
    PQfinish(pg->conn);
    json_decref(pg->known);
    free(pg->url);
    free(pg);
}

/* ---- transactions and rows ----------------------------------------------- */

int sl_store_pg_begin(sl_store_pg_t *pg)
{
    /* The lock before any read: a write reads the row it checks and takes
     * the next resourceVersion only once no other replica writes. */
    if (cmd(pg, "BEGIN", 0, NULL))
        return -1;
    pg->in_tx = 1;
    PGresult *r =
        q(pg, "SELECT pg_advisory_xact_lock(" PG_WRITE_LOCK ")", 0, NULL, PGRES_TUPLES_OK);
    PQclear(r);
    if (!r) {
        sl_store_pg_rollback(pg);
        return -1;
    }
    return 0;
}

int sl_store_pg_commit(sl_store_pg_t *pg, uint64_t notify_rv)
{
    if (notify_rv) {
        char rvs[24];
        snprintf(rvs, sizeof(rvs), "%" PRIu64, notify_rv);
        const char *p[] = {rvs};
        PGresult *r = q(pg, "SELECT pg_notify('" PG_CHANNEL "', $1)", 1, p, PGRES_TUPLES_OK);
        PQclear(r);
        if (!r) {
            sl_store_pg_rollback(pg);
            return -1;
        }
    }
    int rc = cmd(pg, "COMMIT", 0, NULL);
    pg->in_tx = 0;
    return rc;
}

void sl_store_pg_rollback(sl_store_pg_t *pg)
{
    if (pg->in_tx && !pg->down && pg->conn)
        PQclear(PQexec(pg->conn, "ROLLBACK"));
    pg->in_tx = 0;
}

int sl_store_pg_next_rv(sl_store_pg_t *pg, uint64_t *rv)
{
    PGresult *r = q(pg, "SELECT nextval('sluice_resource_version')", 0, NULL, PGRES_TUPLES_OK);
    if (!r)
        return -1;
    *rv = strtoull(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return 0;
}

int sl_store_pg_row_get(sl_store_pg_t *pg, const char *kind, const char *ns, const char *name,
                        sl_store_pg_row_t *row)
{
    memset(row, 0, sizeof(*row));
    /* NULL before q(): a lost connection makes q() call mark_down, which
     * clears pg->row too. */
    PQclear(pg->row);
    pg->row = NULL;
    const char *p[] = {kind, ns, name};
    pg->row = q(pg,
                pg->in_tx ? "SELECT uid, resource_version, generation, spec_hash, body, "
                            "created_at, status FROM resources WHERE kind = $1 AND namespace = $2 "
                            "AND name = $3 FOR UPDATE"
                          : "SELECT uid, resource_version, generation, spec_hash, body, "
                            "created_at, status FROM resources WHERE kind = $1 AND namespace = $2 "
                            "AND name = $3",
                3, p, PGRES_TUPLES_OK);
    if (!pg->row)
        return -1;
    if (PQntuples(pg->row) == 0)
        return 0;
    row->found = true;
    row->uid = PQgetvalue(pg->row, 0, 0);
    row->rv = strtoll(PQgetvalue(pg->row, 0, 1), NULL, 10);
    row->generation = strtoll(PQgetvalue(pg->row, 0, 2), NULL, 10);
    row->spec_hash = PQgetvalue(pg->row, 0, 3);
    row->body = PQgetvalue(pg->row, 0, 4);
    row->created_at = PQgetvalue(pg->row, 0, 5);
    row->status = PQgetisnull(pg->row, 0, 6) ? NULL : PQgetvalue(pg->row, 0, 6);
    return 0;
}

int sl_store_pg_upsert(sl_store_pg_t *pg, const char *kind, const char *ns, const char *name,
                       const char *uid, uint64_t rv, int64_t generation, const char *hash,
                       const char *body, const char *created, const char *now)
{
    char rvs[24], gens[24];
    snprintf(rvs, sizeof(rvs), "%" PRIu64, rv);
    snprintf(gens, sizeof(gens), "%" PRId64, generation);
    const char *p[] = {kind, ns, name, uid, rvs, gens, hash, body, created, now};
    return cmd(pg,
               "INSERT INTO resources (kind, namespace, name, uid, resource_version, generation,"
               " spec_hash, body, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8,"
               " $9, $10) ON CONFLICT (kind, namespace, name) DO UPDATE SET uid = excluded.uid,"
               " resource_version = excluded.resource_version, generation = excluded.generation,"
               " spec_hash = excluded.spec_hash, body = excluded.body,"
               " created_at = excluded.created_at, updated_at = excluded.updated_at",
               10, p);
}

int sl_store_pg_delete(sl_store_pg_t *pg, const char *kind, const char *ns, const char *name)
{
    const char *p[] = {kind, ns, name};
    return cmd(pg, "DELETE FROM resources WHERE kind = $1 AND namespace = $2 AND name = $3", 3, p);
}

int sl_store_pg_set_status(sl_store_pg_t *pg, const char *kind, const char *ns, const char *name,
                           const char *status, uint64_t rv, const char *body, const char *now)
{
    char rvs[24];
    snprintf(rvs, sizeof(rvs), "%" PRIu64, rv);
    const char *p[] = {kind, ns, name, status, rvs, body, now};
    return cmd(pg,
               "UPDATE resources SET status = $4, resource_version = $5, body = $6,"
               " updated_at = $7 WHERE kind = $1 AND namespace = $2 AND name = $3",
               7, p);
}

int sl_store_pg_tombstone(sl_store_pg_t *pg, uint64_t rv, const char *kind, const char *ns,
                          const char *name, const char *body)
{
    char rvs[24], below[24];
    snprintf(rvs, sizeof(rvs), "%" PRIu64, rv);
    snprintf(below, sizeof(below), "%" PRIu64, rv > PG_TOMBSTONE_KEEP ? rv - PG_TOMBSTONE_KEEP : 0);
    const char *p[] = {rvs, kind, ns, name, body};
    const char *pb[] = {below};
    if (cmd(pg,
            "INSERT INTO deletions (resource_version, kind, namespace, name, body)"
            " VALUES ($1, $2, $3, $4, $5)",
            5, p))
        return -1;
    if (rv <= PG_TOMBSTONE_KEEP || rv % 1000 != 0)
        return 0;
    /* Now and then: older deletions go, and the bound is recorded so that a
     * replica that replayed less recently compares its whole key set. */
    return cmd(pg, "DELETE FROM deletions WHERE resource_version < $1", 1, pb) ||
                   cmd(pg,
                       "INSERT INTO counters (name, value) VALUES ('deletions_pruned_below', $1)"
                       " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                       1, pb)
               ? -1
               : 0;
}

int sl_store_pg_list(sl_store_pg_t *pg, const char *kind, const char *ns, sl_store_pg_list_fn fn,
                     void *arg)
{
    const char *p[] = {kind, ns};
    PGresult *r = q(pg,
                    ns ? "SELECT body, status FROM resources WHERE kind = $1 AND namespace = $2"
                         " ORDER BY name"
                       : "SELECT body, status FROM resources WHERE kind = $1"
                         " ORDER BY namespace, name",
                    ns ? 2 : 1, p, PGRES_TUPLES_OK);
    if (!r)
        return -1;
    int rc = 0;
    for (int i = 0; i < PQntuples(r) && rc == 0; i++)
        rc = fn(arg, PQgetvalue(r, i, 0), PQgetisnull(r, i, 1) ? NULL : PQgetvalue(r, i, 1));
    PQclear(r);
    return rc;
}

int sl_store_pg_load_all(sl_store_pg_t *pg, sl_store_pg_load_fn fn, void *arg,
                         const char *config_counter, uint64_t *config_rv)
{
    if (cmd(pg, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", 0, NULL))
        return -1;
    pg->in_tx = 1;
    const char *p[] = {config_counter};
    PGresult *c = q(pg, "SELECT value FROM counters WHERE name = $1", 1, p, PGRES_TUPLES_OK);
    PGresult *r = c ? q(pg,
                        "SELECT kind, namespace, name, body FROM resources"
                        " ORDER BY kind, namespace, name",
                        0, NULL, PGRES_TUPLES_OK)
                    : NULL;
    int rc = r ? 0 : -1;
    if (c && PQntuples(c) == 1)
        *config_rv = strtoull(PQgetvalue(c, 0, 0), NULL, 10);
    else
        *config_rv = 0;
    pg->seen_config_rv = *config_rv;
    for (int i = 0; r && i < PQntuples(r) && rc == 0; i++)
        rc = fn(arg, PQgetvalue(r, i, 0), PQgetvalue(r, i, 1), PQgetvalue(r, i, 2),
                PQgetvalue(r, i, 3));
    PQclear(c);
    PQclear(r);
    if (rc == 0 && !pg->down) {
        rc = cmd(pg, "COMMIT", 0, NULL);
        pg->in_tx = 0;
    } else {
        sl_store_pg_rollback(pg);
    }
    return rc;
}

int sl_store_pg_counter_read(sl_store_pg_t *pg, const char *name, uint64_t *out)
{
    const char *p[] = {name};
    PGresult *r = q(pg, "SELECT value FROM counters WHERE name = $1", 1, p, PGRES_TUPLES_OK);
    if (!r)
        return -1;
    /* The bit pattern of the uint64, as in SQLite. */
    *out = PQntuples(r) == 1 ? (uint64_t)strtoll(PQgetvalue(r, 0, 0), NULL, 10) : 0;
    PQclear(r);
    return 0;
}

int sl_store_pg_counter_write(sl_store_pg_t *pg, const char *name, uint64_t value)
{
    char v[24];
    snprintf(v, sizeof(v), "%" PRId64, (int64_t)value);
    const char *p[] = {name, v};
    return cmd(pg,
               "INSERT INTO counters (name, value) VALUES ($1, $2)"
               " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
               2, p);
}

int sl_store_pg_counter_max(sl_store_pg_t *pg, const char *like, uint64_t limit, uint64_t *out)
{
    char lim[24];
    snprintf(lim, sizeof(lim), "%" PRIu64, limit);
    const char *p[] = {like, lim};
    PGresult *r = q(pg,
                    "SELECT COALESCE(MAX(value), 0) FROM counters WHERE name LIKE $1"
                    " AND value >= 0 AND value <= $2",
                    2, p, PGRES_TUPLES_OK);
    if (!r)
        return -1;
    *out = strtoull(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return 0;
}

/* ---- replaying changes ---------------------------------------------------- */

uint64_t sl_store_pg_seen(sl_store_pg_t *pg)
{
    return pg->seen;
}

uint64_t sl_store_pg_seen_config(sl_store_pg_t *pg)
{
    return pg->seen_config_rv;
}

/* Deletions this replica cannot replay one by one (their tombstones were
 * pruned): every known key that is gone is reported DELETED. */
static int resync_deleted(sl_store_pg_t *pg, uint64_t rv)
{
    PGresult *r = q(pg, "SELECT kind, namespace, name FROM resources", 0, NULL, PGRES_TUPLES_OK);
    if (!r)
        return -1;
    /* Read apart from the replay's snapshot: the store's memory of it is
     * not trusted, the next compile reads every row. */
    sl_store__doubt(pg->owner);
    json_t *present = json_object();
    for (int i = 0; i < PQntuples(r); i++) {
        char key[800];
        snprintf(key, sizeof(key), "%s/%s/%s", PQgetvalue(r, i, 0), PQgetvalue(r, i, 1),
                 PQgetvalue(r, i, 2));
        json_object_set_new(present, key, json_true());
    }
    PQclear(r);
    const char *key;
    json_t *v, *tmp;
    void *it;
    (void)tmp;
    for (it = json_object_iter(pg->known); it;) {
        key = json_object_iter_key(it);
        v = json_object_iter_value(it);
        (void)v;
        void *next = json_object_iter_next(pg->known, it);
        if (!json_object_get(present, key)) {
            char kind[100], ns[300], name[300];
            if (sscanf(key, "%99[^/]/%299[^/]/%299s", kind, ns, name) == 3) {
                char rvs[24];
                snprintf(rvs, sizeof(rvs), "%" PRIu64, rv);
                json_t *doc = json_pack("{s:s,s:{s:s,s:s,s:s}}", "kind", kind, "metadata", "name",
                                        name, "namespace", ns, "resourceVersion", rvs);
                char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
                if (text)
                    sl_store__emit(pg->owner, "DELETED", text, NULL);
                free(text);
                json_decref(doc);
            }
            json_object_del(pg->known, key);
        }
        it = next;
    }
    json_decref(present);
    return 0;
}

int sl_store_pg_sync(sl_store_pg_t *pg)
{
    if (pg->down || pg->in_tx)
        return pg->down ? -1 : 0;
    char seen[24];
    snprintf(seen, sizeof(seen), "%" PRIu64, pg->seen);
    uint64_t pruned = 0;
    if (sl_store_pg_counter_read(pg, "deletions_pruned_below", &pruned) != 0)
        return -1;
    const char *p[] = {seen};
    PGresult *r = q(pg,
                    "SELECT kind, namespace, name, resource_version, body, status, 0,"
                    " (SELECT value FROM counters WHERE name = 'config_resource_version')"
                    " FROM resources WHERE resource_version > $1 UNION ALL"
                    " SELECT kind, namespace, name, resource_version, body, NULL, 1,"
                    " (SELECT value FROM counters WHERE name = 'config_resource_version')"
                    " FROM deletions WHERE resource_version > $1 ORDER BY 4",
                    1, p, PGRES_TUPLES_OK);
    if (!r)
        return -1;
    int n = PQntuples(r);
    /* One statement, one snapshot: the counter as of these rows. */
    if (n > 0)
        pg->seen_config_rv = PQgetisnull(r, 0, 7) ? 0 : strtoull(PQgetvalue(r, 0, 7), NULL, 10);
    if (pg->seen < pruned && n > 0 &&
        resync_deleted(pg, strtoull(PQgetvalue(r, n - 1, 3), NULL, 10)) != 0) {
        PQclear(r);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char key[800];
        snprintf(key, sizeof(key), "%s/%s/%s", PQgetvalue(r, i, 0), PQgetvalue(r, i, 1),
                 PQgetvalue(r, i, 2));
        uint64_t rv = strtoull(PQgetvalue(r, i, 3), NULL, 10);
        int deleted = PQgetvalue(r, i, 6)[0] == '1';
        int known = json_object_get(pg->known, key) != NULL;
        if (deleted) {
            if (known) {
                json_object_del(pg->known, key);
                sl_store__emit(pg->owner, "DELETED", PQgetvalue(r, i, 4), NULL);
            }
        } else {
            json_object_set_new(pg->known, key, json_integer((json_int_t)rv));
            sl_store__emit(pg->owner, known ? "MODIFIED" : "ADDED", PQgetvalue(r, i, 4),
                           PQgetisnull(r, i, 5) ? NULL : PQgetvalue(r, i, 5));
        }
        pg->seen = rv;
    }
    PQclear(r);
    if (n > 0 && pg->on_change)
        pg->on_change(pg->on_change_arg);
    return 0;
}

/* ---- LISTEN, periodic check, reconnection -------------------------------- */

static void on_listen(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sl_store_pg_t *pg = arg;
    if (!PQconsumeInput(pg->lconn)) {
        char msg[400];
        copy_msg(msg, sizeof(msg), PQerrorMessage(pg->lconn));
        sl_log_warn("store %s: LISTEN connection lost: %s (the periodic check covers until it "
                    "is back)",
                    pg->display, msg);
        close_listen(pg);
        schedule(pg, PG_BACKOFF_MIN_MS);
        return;
    }
    int got = 0;
    PGnotify *nt;
    while ((nt = PQnotifies(pg->lconn))) {
        got = 1;
        PQfreemem(nt);
    }
    if (got)
        sl_store_pg_sync(pg);
}

/* LISTEN on the connected c (taken: kept as lconn, or finished). */
static int listen_on(sl_store_pg_t *pg, PGconn *c)
{
    char msg[400] = "";
    if (exec_on(c, "LISTEN " PG_CHANNEL, PGRES_COMMAND_OK, msg, sizeof(msg)) ||
        PQsetnonblocking(c, 1) != 0) {
        sl_log_warn("store %s: LISTEN failed: %s", pg->display, msg);
        PQfinish(c);
        return -1;
    }
    pg->lconn = c;
    pg->listen_ev = event_new(pg->base, PQsocket(c), EV_READ | EV_PERSIST, on_listen, pg);
    if (!pg->listen_ev || event_add(pg->listen_ev, NULL) != 0) {
        close_listen(pg);
        return -1;
    }
    return 0;
}

/* Blocking: at start-up only (the server has just answered). */
static int start_listen(sl_store_pg_t *pg)
{
    char err[600];
    PGconn *c = connect_url(pg, err, sizeof(err));
    if (!c)
        return -1;
    return listen_on(pg, c);
}

static void connect_start(sl_store_pg_t *pg, int for_listen);

/* A reconnection ended: c connected, or NULL with why. Sets what comes
 * next (the LISTEN connection after the statement one, the periodic check,
 * or a retry with backoff). */
static void connect_done(sl_store_pg_t *pg, int for_listen, PGconn *c, const char *why)
{
    char err[600];
    if (!for_listen) {
        if (c && session_setup(pg, c, err, sizeof(err)) != 0) {
            PQfinish(c);
            c = NULL;
            const char *p = strstr(err, ": ");
            why = p ? p + 2 : err;
        }
        if (!c) {
            copy_msg(pg->reason, sizeof(pg->reason), why);
            pg->backoff_ms =
                pg->backoff_ms * 2 > PG_BACKOFF_MAX_MS ? PG_BACKOFF_MAX_MS : pg->backoff_ms * 2;
            schedule(pg, pg->backoff_ms);
            return;
        }
        pg->conn = c;
        pg->down = 0;
        sl_log_notice("store %s: connected again", pg->display);
        if (!pg->lconn) {
            connect_start(pg, 1);
            return;
        }
    } else if (!c || listen_on(pg, c) != 0) {
        if (why)
            sl_log_warn("store %s: cannot LISTEN: %s (retrying in %d s; the periodic check "
                        "covers meanwhile)",
                        pg->display, why, PG_CHECK_MS / 1000);
        sl_store_pg_sync(pg);
        if (!pg->down)
            schedule(pg, PG_CHECK_MS);
        return;
    }
    /* What was written while this replica was not listening. */
    sl_store_pg_sync(pg);
    if (!pg->down)
        schedule(pg, PG_CHECK_MS);
}

static void on_connect_io(evutil_socket_t fd, short what, void *arg);

static void connect_wait(sl_store_pg_t *pg, short flags)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long left_ms = (long)(pg->pending_deadline.tv_sec - now.tv_sec) * 1000 +
                   (pg->pending_deadline.tv_nsec - now.tv_nsec) / 1000000;
    if (left_ms < 1)
        left_ms = 1;
    if (pg->pending_ev)
        event_free(pg->pending_ev);
    /* libpq may change the socket between polls (another address). */
    pg->pending_ev = event_new(pg->base, PQsocket(pg->pending), flags, on_connect_io, pg);
    struct timeval tv = {left_ms / 1000, (left_ms % 1000) * 1000};
    if (!pg->pending_ev || event_add(pg->pending_ev, &tv) != 0) {
        int for_listen = pg->pending_listen;
        cancel_pending(pg);
        connect_done(pg, for_listen, NULL, "out of memory");
    }
}

static void on_connect_io(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    sl_store_pg_t *pg = arg;
    int for_listen = pg->pending_listen;
    char why[400];
    if (what & EV_TIMEOUT) {
        cancel_pending(pg);
        connect_done(pg, for_listen, NULL, "the server did not answer within connect_timeout");
        return;
    }
    switch (PQconnectPoll(pg->pending)) {
    case PGRES_POLLING_READING:
        connect_wait(pg, EV_READ);
        return;
    case PGRES_POLLING_WRITING:
        connect_wait(pg, EV_WRITE);
        return;
    case PGRES_POLLING_OK: {
        PGconn *c = pg->pending;
        pg->pending = NULL;
        event_free(pg->pending_ev);
        pg->pending_ev = NULL;
        connect_done(pg, for_listen, c, NULL);
        return;
    }
    default:
        snprintf(why, sizeof(why), "cannot connect: ");
        copy_msg(why + strlen(why), sizeof(why) - strlen(why), PQerrorMessage(pg->pending));
        cancel_pending(pg);
        connect_done(pg, for_listen, NULL, why);
        return;
    }
}

/* Starts a non-blocking connection for the statements or for LISTEN; its
 * end calls connect_done. The deadline is the URI's connect_timeout (3 s by
 * default), which libpq does not apply to non-blocking connections. */
static void connect_start(sl_store_pg_t *pg, int for_listen)
{
    const char *keys[9], *vals[9];
    connect_params(pg, keys, vals);
    PGconn *c = PQconnectStartParams(keys, vals, 1);
    if (!c || PQstatus(c) == CONNECTION_BAD) {
        char why[400] = "cannot connect: ";
        copy_msg(why + strlen(why), sizeof(why) - strlen(why),
                 c ? PQerrorMessage(c) : "out of memory");
        PQfinish(c);
        connect_done(pg, for_listen, NULL, why);
        return;
    }
    PQsetNoticeProcessor(c, on_notice, pg);
    long timeout_s = 3;
    PQconninfoOption *opts = PQconninfo(c);
    for (PQconninfoOption *o = opts; o && o->keyword; o++)
        if (!strcmp(o->keyword, "connect_timeout") && o->val && atol(o->val) > 0)
            timeout_s = atol(o->val);
    PQconninfoFree(opts);
    clock_gettime(CLOCK_MONOTONIC, &pg->pending_deadline);
    pg->pending_deadline.tv_sec += timeout_s;
    pg->pending = c;
    pg->pending_listen = for_listen;
    connect_wait(pg, EV_WRITE);
}

static void on_check(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sl_store_pg_t *pg = arg;
    if (pg->pending)
        return; /* its end schedules the next check */
    if (pg->down) {
        connect_start(pg, 0);
        return;
    }
    if (!pg->lconn) {
        connect_start(pg, 1);
        return;
    }
    /* Also repairs a missed notification. */
    sl_store_pg_sync(pg);
    if (!pg->down)
        schedule(pg, PG_CHECK_MS);
}

int sl_store_pg_attach(sl_store_pg_t *pg, struct event_base *base, void (*on_change)(void *arg),
                       void *arg)
{
    pg->base = base;
    pg->on_change = on_change;
    pg->on_change_arg = arg;
    pg->check_ev = evtimer_new(base, on_check, pg);
    if (!pg->check_ev)
        return -1;
    if (start_listen(pg) != 0)
        sl_log_warn("store %s: cannot LISTEN yet; retrying, changes of other replicas are seen "
                    "by the %d s check meanwhile",
                    pg->display, PG_CHECK_MS / 1000);
    schedule(pg, pg->lconn ? PG_CHECK_MS : PG_BACKOFF_MIN_MS);
    return 0;
}

/* ---- replicas and their runtimes ------------------------------------------ */

/* "... older than timeout_ms": the server's clock decides, never a
 * replica's. */
#define PG_DEAD "heartbeat_at < now() - ($2::bigint * interval '1 millisecond')"
/* The same, live. */
#define PG_LIVE "heartbeat_at >= now() - ($2::bigint * interval '1 millisecond')"

static void rollback_quiet(sl_store_pg_t *pg)
{
    if (!pg->down && pg->conn)
        PQclear(PQexec(pg->conn, "ROLLBACK"));
    pg->in_tx = 0;
}

int sl_store_pg_replica_publish(sl_store_pg_t *pg, const char *replica, const char *rows,
                                const char *gone, int full, uint64_t timeout_ms, json_t *removed)
{
    if (pg->in_tx) {
        set_err(pg->err, sizeof(pg->err), "a transaction is open");
        return -1;
    }
    char tms[24];
    snprintf(tms, sizeof(tms), "%" PRIu64, timeout_ms);
    const char *p1[] = {replica};
    const char *pr[] = {replica, rows ? rows : "[]"};
    const char *pgone[] = {replica, gone ? gone : "[]"};
    const char *pt[] = {replica, tms};
    if (cmd(pg, "BEGIN", 0, NULL))
        return -1;
    pg->in_tx = 1;
    /* xmax = 0: the row was inserted, not updated (a new replica, or one
     * that others took for dead and removed with its runtime rows). */
    PGresult *r = q(pg,
                    "INSERT INTO controller_replicas (replica, heartbeat_at, started_at,"
                    " runtimes_gen) VALUES ($1, now(), now(), 0) ON CONFLICT (replica) DO UPDATE"
                    " SET heartbeat_at = now() RETURNING (xmax = 0)",
                    1, p1, PGRES_TUPLES_OK);
    if (!r)
        goto fail;
    int inserted = PQntuples(r) == 1 && PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    /* Only the rows that changed (an upsert each), and the nodes forgotten;
     * or, full, everything this replica holds. */
    if (full && cmd(pg, "DELETE FROM controller_runtimes WHERE replica = $1", 1, p1))
        goto fail;
    if (gone && !full &&
        cmd(pg,
            "DELETE FROM controller_runtimes WHERE replica = $1 AND node_id IN"
            " (SELECT json_array_elements_text($2::json))",
            2, pgone))
        goto fail;
    if ((rows || full) &&
        cmd(pg,
            "INSERT INTO controller_runtimes (replica, node_id, fleet, connected, doc)"
            " SELECT $1, e->>'node_id', COALESCE(e->>'fleet', ''),"
            " COALESCE((e->>'connected')::boolean, false), e::text"
            " FROM json_array_elements($2::json) e"
            " ON CONFLICT (replica, node_id) DO UPDATE SET fleet = excluded.fleet,"
            " connected = excluded.connected, doc = excluded.doc",
            2, pr))
        goto fail;
    /* The others re-read this replica's rows when the generation moved. */
    if ((rows || gone || full) &&
        cmd(pg, "UPDATE controller_replicas SET runtimes_gen = runtimes_gen + 1 WHERE replica = $1",
            1, p1))
        goto fail;
    /* Replicas without a heartbeat for the timeout (killed, cut off from
     * the store): their rows go, whichever live replica sees it first. */
    r = q(pg,
          "WITH gone AS (DELETE FROM controller_replicas WHERE replica <> $1 AND " PG_DEAD
          " RETURNING replica), rt AS (DELETE FROM controller_runtimes WHERE replica IN"
          " (SELECT replica FROM gone) RETURNING replica)"
          " SELECT g.replica, (SELECT count(*) FROM rt WHERE rt.replica = g.replica) FROM gone g",
          2, pt, PGRES_TUPLES_OK);
    if (!r)
        goto fail;
    for (int i = 0; removed && i < PQntuples(r); i++)
        json_object_set_new(removed, PQgetvalue(r, i, 0),
                            json_integer(strtoll(PQgetvalue(r, i, 1), NULL, 10)));
    PQclear(r);
    if (cmd(pg, "COMMIT", 0, NULL)) {
        pg->in_tx = 0;
        return -1;
    }
    pg->in_tx = 0;
    return inserted && !full ? 1 : 0;
fail:
    rollback_quiet(pg);
    return -1;
}

int sl_store_pg_replicas_live(sl_store_pg_t *pg, uint64_t timeout_ms, json_t *out)
{
    char tms[24];
    snprintf(tms, sizeof(tms), "%" PRIu64, timeout_ms);
    const char *p[] = {tms};
    PGresult *r = q(pg,
                    "SELECT replica, runtimes_gen FROM controller_replicas WHERE heartbeat_at >="
                    " now() - ($1::bigint * interval '1 millisecond')",
                    1, p, PGRES_TUPLES_OK);
    if (!r)
        return -1;
    for (int i = 0; i < PQntuples(r); i++)
        json_object_set_new(out, PQgetvalue(r, i, 0),
                            json_integer(strtoll(PQgetvalue(r, i, 1), NULL, 10)));
    PQclear(r);
    return 0;
}

int sl_store_pg_replica_rows(sl_store_pg_t *pg, const char *replica, uint64_t timeout_ms,
                             json_t *out)
{
    char tms[24];
    snprintf(tms, sizeof(tms), "%" PRIu64, timeout_ms);
    const char *p[] = {replica, tms};
    PGresult *r = q(pg,
                    "SELECT r.replica, r.doc FROM controller_runtimes r JOIN controller_replicas p"
                    " ON p.replica = r.replica WHERE r.replica <> $1 AND p." PG_LIVE
                    " ORDER BY r.replica, r.node_id",
                    2, p, PGRES_TUPLES_OK);
    if (!r)
        return -1;
    for (int i = 0; i < PQntuples(r); i++) {
        json_t *doc = json_loads(PQgetvalue(r, i, 1), 0, NULL);
        if (!json_is_object(doc)) {
            json_decref(doc);
            continue; /* not written by a controller: ignored */
        }
        json_object_set_new(doc, "replica", json_string(PQgetvalue(r, i, 0)));
        json_array_append_new(out, doc);
    }
    PQclear(r);
    return 0;
}

int sl_store_pg_replica_leave(sl_store_pg_t *pg, const char *replica)
{
    const char *p[] = {replica};
    if (pg->in_tx)
        return -1;
    return cmd(pg,
               "WITH gone AS (DELETE FROM controller_replicas WHERE replica = $1 RETURNING replica)"
               " DELETE FROM controller_runtimes WHERE replica = $1",
               1, p);
}
