/*
 * The controller's durable resource store (store.h): one SQLite database,
 * DATA_DIR/sluice.db, in WAL mode with synchronous=FULL so that a write is on
 * disk before sl_store_put returns and therefore before the REST API answers
 * 2xx.
 *
 * Responsible for: creating the data directory, opening and migrating the
 * schema by version (refusing a schema newer than this binary), every write
 * in one BEGIN IMMEDIATE transaction (so kill -9 at any instant leaves the old
 * or the new state, never half of a file), the server-set metadata
 * (resourceVersion from one store-wide counter, generation bumped only when
 * the spec changes, uid, creationTimestamp), durable monotonic counters, and
 * telling one observer (the watch hub) of each change once it is committed.
 *
 * Not responsible for: validation (the documents given to it have passed
 * sl_model_parse), status (computed by the controller core and merged by the
 * REST layer), nor HTTP semantics (rest.c maps results to status codes).
 * Single-threaded: the controller's main thread owns the handle.
 */
#include "store.h"

#include "ctrl_metrics.h"
#include "store_pg.h"

#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define STORE_DB_NAME "sluice.db"
/* How long a write waits for a lock held by another connection (a backup
 * tool, sqlite3 on the command line) before failing with a clear error. */
#define STORE_BUSY_TIMEOUT_MS 5000
#define STORE_RV_COUNTER "resource_version"
/* The resourceVersion of the newest write that changed an object's spec,
 * labels or annotations, or deleted one (not status writes): the version
 * of the config, from which replicas on one PostgreSQL store derive the
 * same versions (sl_store_loaded_version). */
#define STORE_CONFIG_RV_COUNTER "config_resource_version"
/* Longest data directory path we accept: PATH_MAX-sized buffers below. */
#define STORE_MAX_PATH 4000

/*
 * Ordered schema migrations. Migration i (1-based) brings the schema from
 * version i-1 to i; they run in one transaction on open, so an interrupted
 * upgrade leaves the previous version intact. Append only: never edit a
 * migration that has shipped.
 */
static const char *const migrations[] = {
    /* 1: resources and counters. */
    "CREATE TABLE resources ("
    " kind TEXT NOT NULL,"
    " namespace TEXT NOT NULL,"
    " name TEXT NOT NULL,"
    " uid TEXT NOT NULL,"
    " resource_version INTEGER NOT NULL,"
    " generation INTEGER NOT NULL,"
    " spec_hash TEXT NOT NULL,"
    " body TEXT NOT NULL,"
    " created_at TEXT NOT NULL,"
    " updated_at TEXT NOT NULL,"
    " PRIMARY KEY (kind, namespace, name));"
    "CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);",
    /* 2: the status written through the Kubernetes /status subresource
     * (kapi.c); NULL = never written, the controller's computed status is
     * served. */
    "ALTER TABLE resources ADD COLUMN status TEXT;",
    /* 3: what replicas of a PostgreSQL store replay (store_pg.c): the
     * resources changed since a resourceVersion, and the deletions (written
     * by the PostgreSQL backend only: one SQLite file has one controller). */
    "CREATE INDEX IF NOT EXISTS resources_rv ON resources (resource_version);"
    "CREATE TABLE IF NOT EXISTS deletions ("
    " resource_version INTEGER PRIMARY KEY,"
    " kind TEXT NOT NULL,"
    " namespace TEXT NOT NULL,"
    " name TEXT NOT NULL,"
    " body TEXT NOT NULL);",
    /* 4: the runtimes connected to each replica of a PostgreSQL store and
     * each replica's heartbeat (sl_store_replica_publish; written by the
     * PostgreSQL backend only, like deletions). */
    "CREATE TABLE IF NOT EXISTS controller_replicas ("
    " replica TEXT PRIMARY KEY,"
    " heartbeat_at TEXT NOT NULL,"
    " started_at TEXT NOT NULL,"
    " runtimes_gen INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS controller_runtimes ("
    " replica TEXT NOT NULL,"
    " node_id TEXT NOT NULL,"
    " fleet TEXT NOT NULL,"
    " connected INTEGER NOT NULL,"
    " doc TEXT NOT NULL,"
    " PRIMARY KEY (replica, node_id));",
};
#define STORE_SCHEMA_VERSION ((int)(sizeof(migrations) / sizeof(migrations[0])))

/* The same schema for PostgreSQL, migration for migration (64-bit
 * integers; the resourceVersion counter is a SEQUENCE, bounded at 2^53-1
 * like every version a runtime accepts). */
static const char *const pg_migrations[] = {
    /* 1 */
    "CREATE TABLE resources ("
    " kind TEXT NOT NULL,"
    " namespace TEXT NOT NULL,"
    " name TEXT NOT NULL,"
    " uid TEXT NOT NULL,"
    " resource_version BIGINT NOT NULL,"
    " generation BIGINT NOT NULL,"
    " spec_hash TEXT NOT NULL,"
    " body TEXT NOT NULL,"
    " created_at TEXT NOT NULL,"
    " updated_at TEXT NOT NULL,"
    " PRIMARY KEY (kind, namespace, name));"
    "CREATE TABLE counters (name TEXT PRIMARY KEY, value BIGINT NOT NULL);"
    /* From 2: config version 1 is the empty store's (core.c, derived
     * versions), which no stored state may share. */
    "CREATE SEQUENCE sluice_resource_version AS BIGINT MINVALUE 1 MAXVALUE 9007199254740991"
    " START WITH 2;",
    /* 2 */
    "ALTER TABLE resources ADD COLUMN status TEXT;",
    /* 3 */
    "CREATE INDEX IF NOT EXISTS resources_rv ON resources (resource_version);"
    "CREATE TABLE IF NOT EXISTS deletions ("
    " resource_version BIGINT PRIMARY KEY,"
    " kind TEXT NOT NULL,"
    " namespace TEXT NOT NULL,"
    " name TEXT NOT NULL,"
    " body TEXT NOT NULL);",
    /* 4: heartbeats in the server's clock (now()), so replicas on hosts
     * whose clocks differ agree on which replica is live. */
    "CREATE TABLE IF NOT EXISTS controller_replicas ("
    " replica TEXT PRIMARY KEY,"
    " heartbeat_at TIMESTAMPTZ NOT NULL,"
    " started_at TIMESTAMPTZ NOT NULL,"
    " runtimes_gen BIGINT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS controller_runtimes ("
    " replica TEXT NOT NULL,"
    " node_id TEXT NOT NULL,"
    " fleet TEXT NOT NULL,"
    " connected BOOLEAN NOT NULL,"
    " doc TEXT NOT NULL,"
    " PRIMARY KEY (replica, node_id));",
};
_Static_assert(sizeof(pg_migrations) == sizeof(migrations),
               "every schema migration exists for SQLite and for PostgreSQL");

enum stmt_id {
    STMT_BEGIN = 0,
    STMT_COMMIT,
    STMT_ROLLBACK,
    STMT_GET,
    STMT_UPSERT,
    STMT_DELETE,
    STMT_SET_STATUS,
    STMT_LIST_KIND,
    STMT_LIST_KIND_NS,
    STMT_LIST_ALL,
    STMT_COUNTER_GET,
    STMT_COUNTER_SET,
    STMT__COUNT
};

static const char *const stmt_sql[STMT__COUNT] = {
    [STMT_BEGIN] = "BEGIN IMMEDIATE",
    [STMT_COMMIT] = "COMMIT",
    [STMT_ROLLBACK] = "ROLLBACK",
    [STMT_GET] = "SELECT uid, resource_version, generation, spec_hash, body, created_at, status"
                 " FROM resources WHERE kind = ?1 AND namespace = ?2 AND name = ?3",
    [STMT_UPSERT] =
        "INSERT INTO resources (kind, namespace, name, uid, resource_version, generation,"
        " spec_hash, body, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
        " ON CONFLICT (kind, namespace, name) DO UPDATE SET uid = excluded.uid,"
        " resource_version = excluded.resource_version, generation = excluded.generation,"
        " spec_hash = excluded.spec_hash, body = excluded.body, created_at = excluded.created_at,"
        " updated_at = excluded.updated_at",
    [STMT_DELETE] = "DELETE FROM resources WHERE kind = ?1 AND namespace = ?2 AND name = ?3",
    [STMT_SET_STATUS] = "UPDATE resources SET status = ?4, resource_version = ?5, body = ?6,"
                        " updated_at = ?7 WHERE kind = ?1 AND namespace = ?2 AND name = ?3",
    [STMT_LIST_KIND] =
        "SELECT body, status FROM resources WHERE kind = ?1 ORDER BY namespace, name",
    [STMT_LIST_KIND_NS] =
        "SELECT body, status FROM resources WHERE kind = ?1 AND namespace = ?2 ORDER BY name",
    [STMT_LIST_ALL] = "SELECT kind, namespace, name, body FROM resources"
                      " ORDER BY kind, namespace, name",
    [STMT_COUNTER_GET] = "SELECT value FROM counters WHERE name = ?1",
    [STMT_COUNTER_SET] = "INSERT INTO counters (name, value) VALUES (?1, ?2)"
                         " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
};

struct sl_store {
    sqlite3 *db;             /* SQLite backend, or */
    sl_store_pg_t *pg;       /* PostgreSQL backend (--store postgres://...) */
    uint64_t tx_rv;          /* resourceVersion taken by the open transaction */
    uint64_t loaded_version; /* config RV of the last load_all */
    char *path;              /* DATA_DIR/sluice.db or the URI without password, for messages */
    sqlite3_stmt *stmt[STMT__COUNT];
    uint64_t last_write_us;
    /* Told of every committed change (watches); NULL = nobody. */
    sl_store_observer_fn observer;
    void *observer_arg;
    /* Every stored document (without status, as load_all reads it), in
     * load_all's order, with its content hash, so that a compile neither
     * reads nor parses the store again. SQLite: kept current by this
     * controller's writes, valid while the store's resourceVersion counter
     * is mem_rv (the last write applied to it). PostgreSQL: kept current by
     * the replayed changes of every replica (sl_store__emit, in
     * resourceVersion order), valid while mem_rv is the last replayed one
     * (sl_store_pg_seen). Anything else (a write of another process, a
     * change not replayed one by one, a lost connection, any failure to
     * update it) means a full load, which rebuilds it. */
    sl_resource_set_t mem;
    sl_resource_set_t scratch; /* sl_store_load_shared's full loads */
    int mem_valid;
    uint64_t mem_rv;
    uint64_t mem_hits, mem_loads; /* loads served from memory / from the database */
};

static void mem_drop(sl_store_t *st);

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* A write done (committed, fsync included): kept for the REST counters and
 * timed for /metrics. */
static void wrote(sl_store_t *st, uint64_t t0)
{
    st->last_write_us = now_us() - t0;
    sl_ctrl_hist_observe(&sl_ctrl_store_write_seconds, st->last_write_us);
}

/* RFC 3339 UTC with second precision, as Kubernetes writes it. */
static void rfc3339_now(char out[32])
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Random (version 4) UUID from the OpenSSL CSPRNG. */
static int uuid_v4(char out[37])
{
    unsigned char b[16];
    if (RAND_bytes(b, sizeof(b)) != 1)
        return -1;
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
    return 0;
}

/* SHA-256 (hex) of the canonical JSON of spec: sorted keys, compact, so that
 * key order or whitespace in the user's document never bumps generation. */
static int spec_hash(json_t *spec, char out[65])
{
    char *canon =
        json_dumps(spec ? spec : json_null(), JSON_SORT_KEYS | JSON_COMPACT | JSON_ENCODE_ANY);
    if (!canon)
        return -1;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    int ok = EVP_Digest(canon, strlen(canon), md, &mdlen, EVP_sha256(), NULL);
    free(canon);
    if (!ok || mdlen != 32)
        return -1;
    for (unsigned i = 0; i < mdlen; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    return 0;
}

/* mkdir -p with the failing component named in the error. */
static int mkdir_p(const char *dir, char *err, size_t errlen)
{
    char buf[STORE_MAX_PATH + 1];
    size_t len = strlen(dir);
    if (len == 0 || len > STORE_MAX_PATH) {
        set_err(err, errlen, "data dir '%.200s': %s (use --data-dir with a path of 1..%d bytes)",
                dir, len ? "path too long" : "empty path", STORE_MAX_PATH);
        return -1;
    }
    memcpy(buf, dir, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char saved = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0700) != 0 && errno != EEXIST) {
            set_err(err, errlen,
                    "data dir %s: cannot create %s: %s (create it, fix its permissions or choose "
                    "another --data-dir)",
                    dir, buf, strerror(errno));
            return -1;
        }
        buf[i] = saved;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        set_err(err, errlen,
                "data dir %s: exists but is not a directory (choose another --data-dir)", dir);
        return -1;
    }
    return 0;
}

/* The backend's last error, for messages. */
static const char *db_errmsg(sl_store_t *st)
{
    return st->pg ? sl_store_pg_errmsg(st->pg) : sqlite3_errmsg(st->db);
}

static void stmt_done(sqlite3_stmt *s)
{
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
}

/* Runs a statement that returns no rows. */
static int run(sl_store_t *st, enum stmt_id id)
{
    sqlite3_stmt *s = st->stmt[id];
    int rc = sqlite3_step(s);
    stmt_done(s);
    return rc == SQLITE_DONE ? 0 : -1;
}

static int exec_sql(sqlite3 *db, const char *sql, const char *path, const char *what, char *err,
                    size_t errlen)
{
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        set_err(err, errlen, "store %s: %s: %s", path, what, msg ? msg : sqlite3_errmsg(db));
        sqlite3_free(msg);
        return -1;
    }
    return 0;
}

/* A PRAGMA that answers one text row (journal_mode). */
static int pragma_text(sqlite3 *db, const char *sql, char *out, size_t outlen)
{
    sqlite3_stmt *s = NULL;
    int ok = -1;
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK)
        return -1;
    if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_text(s, 0)) {
        snprintf(out, outlen, "%s", (const char *)sqlite3_column_text(s, 0));
        ok = 0;
    }
    sqlite3_finalize(s);
    return ok;
}

/* Brings the schema to STORE_SCHEMA_VERSION in one transaction. */
static int migrate(sqlite3 *db, const char *path, char *err, size_t errlen)
{
    if (exec_sql(db, "BEGIN IMMEDIATE", path, "cannot start the schema migration", err, errlen))
        return -1;
    if (exec_sql(db, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)", path,
                 "cannot create schema_version", err, errlen))
        goto fail;

    sqlite3_stmt *s = NULL;
    int version = 0;
    if (sqlite3_prepare_v2(db, "SELECT max(version) FROM schema_version", -1, &s, NULL) !=
        SQLITE_OK) {
        set_err(err, errlen, "store %s: cannot read the schema version: %s", path,
                sqlite3_errmsg(db));
        goto fail;
    }
    if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_type(s, 0) == SQLITE_INTEGER) {
        sqlite3_int64 v = sqlite3_column_int64(s, 0);
        version = v > INT32_MAX ? INT32_MAX : (int)v;
    }
    sqlite3_finalize(s);

    if (version > STORE_SCHEMA_VERSION) {
        set_err(err, errlen,
                "store %s: schema version %d is newer than this sluice-controller knows (%d); "
                "run the sluice-controller that wrote it, or restore a backup of the data dir",
                path, version, STORE_SCHEMA_VERSION);
        goto fail;
    }
    for (int v = version; v < STORE_SCHEMA_VERSION; v++) {
        char what[64];
        snprintf(what, sizeof(what), "schema migration %d failed", v + 1);
        if (exec_sql(db, migrations[v], path, what, err, errlen))
            goto fail;
    }
    if (version < STORE_SCHEMA_VERSION) {
        char sql[128];
        snprintf(sql, sizeof(sql),
                 "DELETE FROM schema_version; INSERT INTO schema_version (version) VALUES (%d)",
                 STORE_SCHEMA_VERSION);
        if (exec_sql(db, sql, path, "cannot record the schema version", err, errlen))
            goto fail;
        if (version > 0)
            sl_log_notice("store %s: schema migrated from version %d to %d", path, version,
                          STORE_SCHEMA_VERSION);
    }
    if (exec_sql(db, "COMMIT", path, "cannot commit the schema migration", err, errlen))
        goto fail;
    return 0;

fail:
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    return -1;
}

/* On success the caller owns the store (sl_store_close). On failure nothing
 * is left open; the directory may have been created. */
sl_store_t *sl_store_open(const char *data_dir, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!data_dir) {
        set_err(err, errlen, "store: no data dir given (use --data-dir DIR)");
        return NULL;
    }
    if (mkdir_p(data_dir, err, errlen) != 0)
        return NULL;

    sl_store_t *st = calloc(1, sizeof(*st));
    if (!st) {
        set_err(err, errlen, "store %s: out of memory", data_dir);
        return NULL;
    }
    size_t plen = strlen(data_dir) + 1 + sizeof(STORE_DB_NAME);
    st->path = malloc(plen);
    if (!st->path) {
        set_err(err, errlen, "store %s: out of memory", data_dir);
        goto fail_st;
    }
    snprintf(st->path, plen, "%s/%s", data_dir, STORE_DB_NAME);

    /* The store holds Certificates' private keys: the directory is 0700 and
     * the database 0600 whatever the umask (SQLite gives the -wal and -shm
     * files the database's mode). An existing looser directory or file is
     * tightened, not refused: it was ours to begin with. */
    if (chmod(data_dir, 0700) != 0) {
        set_err(err, errlen, "data dir %s: cannot set mode 0700: %s (is it yours?)", data_dir,
                strerror(errno));
        goto fail_db; /* st->db is NULL: sqlite3_close(NULL) is a no-op */
    }
    int dbfd = open(st->path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (dbfd < 0 || fchmod(dbfd, 0600) != 0) {
        set_err(err, errlen, "store %s: cannot create it with mode 0600: %s", st->path,
                strerror(errno));
        if (dbfd >= 0)
            close(dbfd);
        goto fail_db; /* st->db is NULL: sqlite3_close(NULL) is a no-op */
    }
    close(dbfd);

    int rc = sqlite3_open_v2(
        st->path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        set_err(err, errlen, "store %s: cannot open: %s (check the permissions of --data-dir)",
                st->path, st->db ? db_errmsg(st) : sqlite3_errstr(rc));
        goto fail_db;
    }
    sqlite3_extended_result_codes(st->db, 1);
    sqlite3_busy_timeout(st->db, STORE_BUSY_TIMEOUT_MS);

    /* The first statement reads the header: a file that is not SQLite fails
     * here with "file is not a database". */
    char mode[16] = "";
    if (pragma_text(st->db, "PRAGMA journal_mode=WAL", mode, sizeof(mode)) != 0) {
        set_err(err, errlen,
                "store %s: cannot enable WAL: %s (is it a SQLite database written by "
                "sluice-controller?)",
                st->path, db_errmsg(st));
        goto fail_db;
    }
    if (strcmp(mode, "wal") != 0) {
        set_err(err, errlen,
                "store %s: the file system refused WAL mode (journal_mode=%s); put --data-dir "
                "on a local file system",
                st->path, mode);
        goto fail_db;
    }
    if (exec_sql(st->db, "PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON", st->path,
                 "cannot set pragmas", err, errlen))
        goto fail_db;
    if (migrate(st->db, st->path, err, errlen) != 0)
        goto fail_db;

    for (int i = 0; i < STMT__COUNT; i++) {
        if (sqlite3_prepare_v3(st->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &st->stmt[i],
                               NULL) != SQLITE_OK) {
            set_err(err, errlen, "store %s: cannot prepare statement %d: %s", st->path, i,
                    db_errmsg(st));
            goto fail_stmts;
        }
    }
    return st;

fail_stmts:
    for (int i = 0; i < STMT__COUNT; i++)
        sqlite3_finalize(st->stmt[i]);
fail_db:
    sqlite3_close(st->db);
    free(st->path);
fail_st:
    free(st);
    return NULL;
}

/* The PostgreSQL backend: no data dir, no SQLite handle; the same logic
 * above the primitives. */
sl_store_t *sl_store_open_postgres(const char *url, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    sl_store_t *st = calloc(1, sizeof(*st));
    char display[512] = "";
    if (!st) {
        set_err(err, errlen, "store: out of memory");
        return NULL;
    }
    st->pg = sl_store_pg_open(st, url, pg_migrations, STORE_SCHEMA_VERSION, display,
                              sizeof(display), err, errlen);
    if (!st->pg || !(st->path = strdup(display))) {
        if (st->pg)
            set_err(err, errlen, "store: out of memory");
        sl_store_pg_close(st->pg);
        free(st);
        return NULL;
    }
    return st;
}

int sl_store_attach(sl_store_t *st, struct event_base *base, void (*on_change)(void *arg),
                    void *arg)
{
    return st->pg ? sl_store_pg_attach(st->pg, base, on_change, arg) : 0;
}

int sl_store_available(void *arg, char *why, size_t whylen)
{
    sl_store_t *st = arg;
    return !st || !st->pg || sl_store_pg_available(st->pg, why, whylen);
}

const char *sl_store_name(const sl_store_t *st)
{
    return st->path;
}

int sl_store_shared(const sl_store_t *st)
{
    return st->pg != NULL;
}

int sl_store_replica_publish(sl_store_t *st, const char *replica, const char *rows,
                             const char *gone, int full, uint64_t timeout_ms, json_t *removed,
                             char *err, size_t errlen)
{
    if (!st->pg) {
        set_err(err, errlen, "store %s: not shared by replicas (SQLite)", st->path);
        return -1;
    }
    int rc = sl_store_pg_replica_publish(st->pg, replica, rows, gone, full, timeout_ms, removed);
    if (rc < 0)
        set_err(err, errlen, "store %s: %s", st->path, sl_store_pg_errmsg(st->pg));
    return rc;
}

int sl_store_replica_read(sl_store_t *st, const char *replica, uint64_t timeout_ms, json_t *live,
                          json_t *rows, char *err, size_t errlen)
{
    if (!st->pg) {
        set_err(err, errlen, "store %s: not shared by replicas (SQLite)", st->path);
        return -1;
    }
    if ((live && sl_store_pg_replicas_live(st->pg, timeout_ms, live) != 0) ||
        (rows && sl_store_pg_replica_rows(st->pg, replica, timeout_ms, rows) != 0)) {
        set_err(err, errlen, "store %s: %s", st->path, sl_store_pg_errmsg(st->pg));
        return -1;
    }
    return 0;
}

int sl_store_replica_leave(sl_store_t *st, const char *replica)
{
    return st->pg ? sl_store_pg_replica_leave(st->pg, replica) : 0;
}

uint64_t sl_store_loaded_version(const sl_store_t *st)
{
    return st->loaded_version;
}

/* A failure of a PostgreSQL store that cannot be reached is
 * SL_STORE_UNAVAILABLE, with err naming the store and the reason. */
static enum sl_store_result outcome(sl_store_t *st, enum sl_store_result r, char *err,
                                    size_t errlen)
{
    char why[600];
    if (r != SL_STORE_ERROR || !st || !st->pg || sl_store_pg_available(st->pg, why, sizeof(why)))
        return r;
    set_err(err, errlen, "%s; retry when it is back", why);
    return SL_STORE_UNAVAILABLE;
}

void sl_store_close(sl_store_t *st)
{
    if (!st)
        return;
    sl_resource_set_free(&st->scratch);
    if (st->pg) {
        sl_store_pg_close(st->pg);
        mem_drop(st);
        free(st->path);
        free(st);
        return;
    }
    mem_drop(st);
    for (int i = 0; i < STMT__COUNT; i++)
        sqlite3_finalize(st->stmt[i]);
    if (sqlite3_close(st->db) != SQLITE_OK)
        sl_log_error("store %s: close: %s", st->path, db_errmsg(st));
    free(st->path);
    free(st);
}

/* ---- counters (inside a transaction) ------------------------------------ */

static int counter_read(sl_store_t *st, const char *name, uint64_t *out)
{
    if (st->pg)
        return sl_store_pg_counter_read(st->pg, name, out);
    sqlite3_stmt *s = st->stmt[STMT_COUNTER_GET];
    sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        /* Stored as the bit pattern of the uint64 (content hashes use all
         * 64 bits); SQLite integers are signed. */
        *out = (uint64_t)sqlite3_column_int64(s, 0);
    } else if (rc == SQLITE_DONE) {
        *out = 0;
    }
    stmt_done(s);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : -1;
}

static int counter_write(sl_store_t *st, const char *name, uint64_t value)
{
    if (st->pg)
        return sl_store_pg_counter_write(st->pg, name, value);
    sqlite3_stmt *s = st->stmt[STMT_COUNTER_SET];
    sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, (sqlite3_int64)value);
    return run(st, STMT_COUNTER_SET);
}

static int tx_begin(sl_store_t *st, char *err, size_t errlen)
{
    st->tx_rv = 0;
    if (st->pg ? sl_store_pg_begin(st->pg) != 0 : run(st, STMT_BEGIN) != 0) {
        set_err(err, errlen, "store %s: cannot start a transaction: %s", st->path, db_errmsg(st));
        return -1;
    }
    return 0;
}

static int tx_commit(sl_store_t *st, char *err, size_t errlen)
{
    if (st->pg) {
        /* Other replicas are told by NOTIFY, in the transaction. */
        if (sl_store_pg_commit(st->pg, st->tx_rv) != 0) {
            set_err(err, errlen, "store %s: commit failed: %s", st->path, db_errmsg(st));
            return -1;
        }
        return 0;
    }
    if (run(st, STMT_COMMIT) != 0) {
        set_err(err, errlen, "store %s: commit failed: %s (is the disk full?)", st->path,
                db_errmsg(st));
        /* A failed COMMIT may leave the transaction open. */
        if (!sqlite3_get_autocommit(st->db))
            run(st, STMT_ROLLBACK);
        return -1;
    }
    return 0;
}

static void tx_rollback(sl_store_t *st)
{
    if (st->pg) {
        sl_store_pg_rollback(st->pg);
        return;
    }
    if (!sqlite3_get_autocommit(st->db) && run(st, STMT_ROLLBACK) != 0)
        sl_log_error("store %s: rollback failed: %s", st->path, db_errmsg(st));
}

/* ---- objects -------------------------------------------------------------- */

typedef struct {
    bool found;
    char uid[64];
    uint64_t rv;
    int64_t generation;
    char spec_hash[72];
    char created_at[40];
    json_t *body;   /* owned, NULL unless asked for */
    json_t *status; /* owned: the written status (NULL when never written) */
} row_t;

static json_t *parse_body(sl_store_t *st, const char *text, const char *kind, const char *ns,
                          const char *name)
{
    json_error_t jerr;
    json_t *v = json_loads(text ? text : "", 0, &jerr);
    if (!v || !json_is_object(v)) {
        sl_log_error("store %s: %s %s/%s: stored body is not a JSON object (%s)", st->path, kind,
                     ns, name, v ? "not an object" : jerr.text);
        json_decref(v);
        return NULL;
    }
    return v;
}

/* The stored texts of a row, from either backend, into row (parsed). */
static int row_fill(sl_store_t *st, const char *kind, const char *ns, const char *name,
                    bool want_body, row_t *row, const char *uid, int64_t rv, int64_t generation,
                    const char *hash, const char *created, const char *body, const char *status)
{
    int ret = 0;
    row->found = true;
    snprintf(row->uid, sizeof(row->uid), "%s", uid ? uid : "");
    row->rv = rv < 0 ? 0 : (uint64_t)rv;
    row->generation = generation;
    snprintf(row->spec_hash, sizeof(row->spec_hash), "%s", hash ? hash : "");
    snprintf(row->created_at, sizeof(row->created_at), "%s", created ? created : "");
    if (status && !(row->status = parse_body(st, status, kind, ns, name)))
        ret = -1;
    /* With the body, the status moves into it (row->status is then
     * borrowed from the body); without, the caller owns row->status. */
    if (want_body && ret == 0) {
        row->body = parse_body(st, body, kind, ns, name);
        if (!row->body)
            ret = -1;
        else if (row->status)
            json_object_set_new(row->body, "status", row->status);
    }
    if (want_body && ret != 0) {
        json_decref(row->status);
        row->status = NULL;
    }
    return ret;
}

/* Reads one row (in a write transaction: locked until its end). Returns 0
 * (row->found says whether it exists) or -1. */
static int row_get(sl_store_t *st, const char *kind, const char *ns, const char *name,
                   bool want_body, row_t *row)
{
    memset(row, 0, sizeof(*row));
    if (st->pg) {
        sl_store_pg_row_t r;
        if (sl_store_pg_row_get(st->pg, kind, ns, name, &r) != 0)
            return -1;
        if (!r.found)
            return 0;
        return row_fill(st, kind, ns, name, want_body, row, r.uid, r.rv, r.generation, r.spec_hash,
                        r.created_at, r.body, r.status);
    }
    sqlite3_stmt *s = st->stmt[STMT_GET];
    sqlite3_bind_text(s, 1, kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, ns, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, name, -1, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    int ret = 0;
    if (rc == SQLITE_ROW) {
        ret = row_fill(
            st, kind, ns, name, want_body, row, (const char *)sqlite3_column_text(s, 0),
            sqlite3_column_int64(s, 1), sqlite3_column_int64(s, 2),
            (const char *)sqlite3_column_text(s, 3), (const char *)sqlite3_column_text(s, 5),
            (const char *)sqlite3_column_text(s, 4),
            sqlite3_column_type(s, 6) == SQLITE_TEXT ? (const char *)sqlite3_column_text(s, 6)
                                                     : NULL);
    } else if (rc != SQLITE_DONE) {
        ret = -1;
    }
    stmt_done(s);
    return ret;
}

/* The next resourceVersion, inside the open write transaction: the store's
 * counter (SQLite) or the database SEQUENCE (PostgreSQL; never handed out
 * twice, whichever replica asks). */
static int next_rv(sl_store_t *st, uint64_t *rv, char *err, size_t errlen)
{
    uint64_t v = 0;
    if (st->pg) {
        if (sl_store_pg_next_rv(st->pg, &v) != 0) {
            set_err(err, errlen, "store %s: cannot take a resourceVersion: %s", st->path,
                    db_errmsg(st));
            return -1;
        }
    } else {
        if (counter_read(st, STORE_RV_COUNTER, &v) != 0) {
            set_err(err, errlen, "store %s: cannot read the resourceVersion counter: %s", st->path,
                    db_errmsg(st));
            return -1;
        }
        /* resource_version column is a signed SQLite integer. */
        if (v >= (uint64_t)INT64_MAX) {
            set_err(err, errlen, "store %s: resourceVersion counter exhausted", st->path);
            return -1;
        }
        v++;
        if (counter_write(st, STORE_RV_COUNTER, v) != 0) {
            set_err(err, errlen, "store %s: cannot write the resourceVersion counter: %s", st->path,
                    db_errmsg(st));
            return -1;
        }
    }
    *rv = v;
    st->tx_rv = v;
    return 0;
}

static bool same_json(json_t *a, json_t *b)
{
    return (!a && !b) || (a && b && json_equal(a, b));
}

/* Identity of a document: kind name, namespace ("default" when absent) and
 * name. -1 when the document lacks them (it was not validated). */
static int identity(json_t *obj, enum sl_kind *kind, const char **ns, const char **name)
{
    json_t *meta = json_object_get(obj, "metadata");
    json_t *nsv = json_object_get(meta, "namespace");
    *name = json_string_value(json_object_get(meta, "name"));
    *ns = json_is_string(nsv) ? json_string_value(nsv) : "default";
    if (!json_is_object(obj) || !*name ||
        sl_kind_from_name(json_string_value(json_object_get(obj, "kind")), kind) != 0)
        return -1;
    return 0;
}

static enum sl_store_result put_one_row(sl_store_t *st, json_t *obj, enum sl_store_mode mode,
                                        const char *expect_rv, json_t **stored, row_t *old,
                                        char *err, size_t errlen);

/* One put inside an open transaction. *stored: new reference on success,
 * with the written status (if any) kept: a spec write leaves it alone.
 * *existed: whether an object of that kind/namespace/name was there before
 * (the observer's ADDED or MODIFIED). */
static enum sl_store_result put_one(sl_store_t *st, json_t *obj, enum sl_store_mode mode,
                                    const char *expect_rv, json_t **stored, bool *existed,
                                    char *err, size_t errlen)
{
    row_t old;
    memset(&old, 0, sizeof(old));
    enum sl_store_result r = put_one_row(st, obj, mode, expect_rv, stored, &old, err, errlen);
    *existed = old.found;
    if (r == SL_STORE_OK && old.status)
        json_object_set(*stored, "status", old.status);
    json_decref(old.status);
    return r;
}

static enum sl_store_result put_one_row(sl_store_t *st, json_t *obj, enum sl_store_mode mode,
                                        const char *expect_rv, json_t **stored, row_t *oldp,
                                        char *err, size_t errlen)
{
    row_t old;
    enum sl_kind kind;
    const char *ns, *name;
    if (identity(obj, &kind, &ns, &name) != 0) {
        set_err(err, errlen, "store: document without a valid kind and metadata.name");
        return SL_STORE_ERROR;
    }
    const char *kname = sl_kind_name(kind);
    if (row_get(st, kname, ns, name, true, &old) != 0) {
        set_err(err, errlen, "store %s: cannot read %s %s/%s: %s", st->path, kname, ns, name,
                db_errmsg(st));
        return SL_STORE_ERROR;
    }
    /* Whether the write changes the config (spec, labels, annotations):
     * then it moves the config resourceVersion. */
    json_t *old_meta = json_object_get(old.body, "metadata");
    json_t *new_meta = json_object_get(obj, "metadata");
    bool meta_same =
        old.found &&
        same_json(json_object_get(old_meta, "labels"), json_object_get(new_meta, "labels")) &&
        same_json(json_object_get(old_meta, "annotations"),
                  json_object_get(new_meta, "annotations"));
    /* The status is kept apart from the body from here on. */
    old.status = json_incref(json_object_get(old.body, "status"));
    json_decref(old.body);
    old.body = NULL;
    *oldp = old; /* the caller releases old.status */
    if (mode == SL_STORE_CREATE && old.found) {
        set_err(err, errlen, "%s \"%s/%s\" already exists (use PUT to replace it)", kname, ns,
                name);
        return SL_STORE_EXISTS;
    }
    if (expect_rv && expect_rv[0]) {
        if (!old.found) {
            set_err(err, errlen, "%s \"%s/%s\" does not exist (resourceVersion %s expected)", kname,
                    ns, name, expect_rv);
            return SL_STORE_NOT_FOUND;
        }
        char cur[24];
        snprintf(cur, sizeof(cur), "%" PRIu64, old.rv);
        if (strcmp(cur, expect_rv) != 0) {
            set_err(err, errlen,
                    "%s \"%s/%s\" was modified: resourceVersion is %s, not %s (GET it again and "
                    "reapply your change)",
                    kname, ns, name, cur, expect_rv);
            return SL_STORE_CONFLICT;
        }
    }

    char hash[65];
    if (spec_hash(json_object_get(obj, "spec"), hash) != 0) {
        set_err(err, errlen, "store: cannot hash the spec of %s %s/%s", kname, ns, name);
        return SL_STORE_ERROR;
    }
    uint64_t rv;
    if (next_rv(st, &rv, err, errlen) != 0)
        return SL_STORE_ERROR;
    int64_t generation = 1;
    char uid[64], created[40], now[32];
    rfc3339_now(now);
    if (old.found) {
        generation = strcmp(old.spec_hash, hash) == 0 ? old.generation : old.generation + 1;
        snprintf(uid, sizeof(uid), "%s", old.uid);
        snprintf(created, sizeof(created), "%s", old.created_at);
    } else {
        if (uuid_v4(uid) != 0) {
            set_err(err, errlen, "store: no randomness for a uid (OpenSSL RAND_bytes failed)");
            return SL_STORE_ERROR;
        }
        snprintf(created, sizeof(created), "%s", now);
    }

    /* The stored document: the user's, minus status, plus server metadata. */
    json_t *doc = json_deep_copy(obj);
    if (!doc)
        goto oom;
    json_object_del(doc, "status");
    json_t *meta = json_object_get(doc, "metadata");
    char rvs[24];
    snprintf(rvs, sizeof(rvs), "%" PRIu64, rv);
    if (!json_is_object(meta) || json_object_set_new(meta, "namespace", json_string(ns)) ||
        json_object_set_new(meta, "uid", json_string(uid)) ||
        json_object_set_new(meta, "resourceVersion", json_string(rvs)) ||
        json_object_set_new(meta, "generation", json_integer(generation)) ||
        json_object_set_new(meta, "creationTimestamp", json_string(created)))
        goto oom_doc;
    char *body = json_dumps(doc, JSON_COMPACT);
    if (!body)
        goto oom_doc;

    int rc;
    if (st->pg) {
        rc = sl_store_pg_upsert(st->pg, kname, ns, name, uid, rv, generation, hash, body, created,
                                now);
    } else {
        sqlite3_stmt *s = st->stmt[STMT_UPSERT];
        sqlite3_bind_text(s, 1, kname, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, ns, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 3, name, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 4, uid, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 5, (sqlite3_int64)rv);
        sqlite3_bind_int64(s, 6, generation);
        sqlite3_bind_text(s, 7, hash, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 8, body, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 9, created, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 10, now, -1, SQLITE_STATIC);
        rc = run(st, STMT_UPSERT);
    }
    free(body);
    bool config_changed = !meta_same || strcmp(old.spec_hash, hash) != 0;
    if (rc != 0 || (config_changed && counter_write(st, STORE_CONFIG_RV_COUNTER, rv) != 0)) {
        set_err(err, errlen, "store %s: cannot write %s %s/%s: %s", st->path, kname, ns, name,
                db_errmsg(st));
        json_decref(doc);
        return SL_STORE_ERROR;
    }
    *stored = doc;
    return SL_STORE_OK;

oom_doc:
    json_decref(doc);
oom:
    set_err(err, errlen, "store: out of memory writing %s %s/%s", kname, ns, name);
    return SL_STORE_ERROR;
}

/* Tells the observer of one committed change. Called only after COMMIT, so a
 * watcher never sees a change that a rollback undid. */
static void observe(sl_store_t *st, const char *type, json_t *doc)
{
    enum sl_kind kind;
    const char *ns, *name;
    if (!st->observer || identity(doc, &kind, &ns, &name) != 0)
        return;
    st->observer(st->observer_arg, type, kind, doc);
}

/* SQLite: this controller's write, told at once. PostgreSQL: nothing here;
 * committed() replays every change since the last one, this write included,
 * so the observer sees the writes of every replica once, in order. */
static void mem_apply(sl_store_t *st, const char *type, json_t *doc);

static void notify(sl_store_t *st, const char *type, json_t *doc)
{
    if (!st->pg) {
        observe(st, type, doc);
        mem_apply(st, type, doc);
    }
}

static void committed(sl_store_t *st)
{
    if (st->pg)
        sl_store_pg_sync(st->pg);
}

void sl_store__doubt(sl_store_t *st)
{
    mem_drop(st);
}

void sl_store__emit(sl_store_t *st, const char *type, const char *body, const char *status)
{
    if (!st->observer && !st->mem_valid)
        return;
    json_t *doc = parse_body(st, body, "replayed", "*", "*");
    if (!doc)
        return;
    json_t *stv = status ? parse_body(st, status, "replayed", "*", "*") : NULL;
    if (stv)
        json_object_set_new(doc, "status", stv);
    observe(st, type, doc);
    mem_apply(st, type, doc);
    json_decref(doc);
}

void sl_store_set_observer(sl_store_t *st, sl_store_observer_fn fn, void *arg)
{
    st->observer = fn;
    st->observer_arg = arg;
}

/* `obj` is borrowed; on SL_STORE_OK *stored is a new reference (the caller
 * decrefs it). On any other result nothing was written and *stored is NULL. */
static enum sl_store_result put_impl(sl_store_t *st, json_t *obj, enum sl_store_mode mode,
                                     const char *expect_rv, json_t **stored, char *err,
                                     size_t errlen)
{
    *stored = NULL;
    uint64_t t0 = now_us();
    if (tx_begin(st, err, errlen) != 0)
        return SL_STORE_ERROR;
    json_t *doc = NULL;
    bool existed = false;
    enum sl_store_result r = put_one(st, obj, mode, expect_rv, &doc, &existed, err, errlen);
    if (r != SL_STORE_OK) {
        tx_rollback(st);
        return r;
    }
    if (tx_commit(st, err, errlen) != 0) {
        json_decref(doc);
        return SL_STORE_ERROR;
    }
    wrote(st, t0);
    *stored = doc;
    notify(st, existed ? "MODIFIED" : "ADDED", doc);
    committed(st);
    return SL_STORE_OK;
}

/* All of `objs` or none: the first failing item rolls the whole transaction
 * back and its error names it. On SL_STORE_OK *stored is a new array, in the
 * order of `objs`. */
static enum sl_store_result put_many_impl(sl_store_t *st, json_t *objs, json_t **stored, char *err,
                                          size_t errlen)
{
    *stored = NULL;
    if (!json_is_array(objs)) {
        set_err(err, errlen, "store: put_many needs an array of documents");
        return SL_STORE_ERROR;
    }
    uint64_t t0 = now_us();
    json_t *out = json_array();
    if (!out) {
        set_err(err, errlen, "store: out of memory");
        return SL_STORE_ERROR;
    }
    /* Whether each item existed before, for the observer after the commit (a
     * batch may hold the same object twice: the second is then MODIFIED). */
    bool *existed = calloc(json_array_size(objs) + 1, sizeof(*existed));
    if (!existed) {
        json_decref(out);
        set_err(err, errlen, "store: out of memory");
        return SL_STORE_ERROR;
    }
    if (tx_begin(st, err, errlen) != 0) {
        free(existed);
        json_decref(out);
        return SL_STORE_ERROR;
    }
    size_t i;
    json_t *obj;
    json_array_foreach(objs, i, obj)
    {
        json_t *doc = NULL;
        enum sl_store_result r =
            put_one(st, obj, SL_STORE_REPLACE, NULL, &doc, &existed[i], err, errlen);
        if (r == SL_STORE_OK && json_array_append_new(out, doc) != 0) {
            set_err(err, errlen, "store: out of memory");
            r = SL_STORE_ERROR;
        }
        if (r != SL_STORE_OK) {
            tx_rollback(st);
            free(existed);
            json_decref(out);
            return r;
        }
    }
    if (tx_commit(st, err, errlen) != 0) {
        free(existed);
        json_decref(out);
        return SL_STORE_ERROR;
    }
    wrote(st, t0);
    *stored = out;
    json_array_foreach(out, i, obj) notify(st, existed[i] ? "MODIFIED" : "ADDED", obj);
    committed(st);
    free(existed);
    return SL_STORE_OK;
}

/* *obj: new reference on SL_STORE_OK, NULL otherwise. */
static enum sl_store_result get_impl(sl_store_t *st, enum sl_kind kind, const char *ns,
                                     const char *name, json_t **obj)
{
    *obj = NULL;
    if ((unsigned)kind >= SL_KIND__COUNT || !name)
        return SL_STORE_NOT_FOUND;
    row_t row;
    if (row_get(st, sl_kind_name(kind), ns ? ns : "default", name, true, &row) != 0) {
        sl_log_error("store %s: get %s %s/%s: %s", st->path, sl_kind_name(kind),
                     ns ? ns : "default", name, db_errmsg(st));
        return SL_STORE_ERROR;
    }
    if (!row.found)
        return SL_STORE_NOT_FOUND;
    *obj = row.body;
    return SL_STORE_OK;
}

enum sl_store_result sl_store_get(sl_store_t *st, enum sl_kind kind, const char *ns,
                                  const char *name, json_t **obj)
{
    uint64_t t0 = now_us();
    enum sl_store_result r = get_impl(st, kind, ns, name, obj);
    sl_ctrl_hist_observe(&sl_ctrl_store_read_seconds, now_us() - t0);
    return outcome(st, r, NULL, 0);
}

/*
 * The start of a write to an existing object: opens the transaction, reads
 * its row (with the body), checks expect_rv ("" = none) and reads the next
 * resourceVersion. On SL_STORE_OK the transaction is open and the caller
 * owns row->body; on any other result err says why, the transaction is
 * rolled back and nothing is held.
 */
static enum sl_store_result begin_write(sl_store_t *st, const char *kname, const char *ns,
                                        const char *name, const char *expect_rv, row_t *row,
                                        uint64_t *rvp, char *err, size_t errlen)
{
    memset(row, 0, sizeof(*row));
    if (tx_begin(st, err, errlen) != 0)
        return SL_STORE_ERROR;
    if (row_get(st, kname, ns, name, true, row) != 0) {
        set_err(err, errlen, "store %s: cannot read %s %s/%s: %s", st->path, kname, ns, name,
                db_errmsg(st));
        tx_rollback(st);
        return SL_STORE_ERROR;
    }
    if (!row->found) {
        set_err(err, errlen, "%s \"%s/%s\" not found", kname, ns, name);
        tx_rollback(st);
        return SL_STORE_NOT_FOUND;
    }
    enum sl_store_result r = SL_STORE_OK;
    char cur[24];
    snprintf(cur, sizeof(cur), "%" PRIu64, row->rv);
    uint64_t rv = 0;
    if (expect_rv && expect_rv[0] && strcmp(cur, expect_rv) != 0) {
        set_err(err, errlen,
                "%s \"%s/%s\" was modified: resourceVersion is %s, not %s (GET it again and "
                "reapply your change)",
                kname, ns, name, cur, expect_rv);
        r = SL_STORE_CONFLICT;
    } else if (next_rv(st, &rv, err, errlen) != 0) {
        r = SL_STORE_ERROR;
    }
    if (r != SL_STORE_OK) {
        json_decref(row->body);
        row->body = NULL;
        tx_rollback(st);
    }
    *rvp = rv;
    return r;
}

/* A delete also takes a resourceVersion, so that a list's resourceVersion
 * changes whenever its content does. */
static enum sl_store_result delete_impl(sl_store_t *st, enum sl_kind kind, const char *ns,
                                        const char *name, const char *expect_rv, json_t **deleted,
                                        char *err, size_t errlen)
{
    if (deleted)
        *deleted = NULL;
    if ((unsigned)kind >= SL_KIND__COUNT || !name) {
        set_err(err, errlen, "store: delete needs a kind and a name");
        return SL_STORE_ERROR;
    }
    const char *kname = sl_kind_name(kind);
    uint64_t t0 = now_us(), rv;
    row_t row;
    enum sl_store_result r =
        begin_write(st, kname, ns ? ns : "default", name, expect_rv, &row, &rv, err, errlen);
    if (r != SL_STORE_OK)
        return r;
    if (!ns)
        ns = "default";
    /* The last stored document at the deletion's resourceVersion, as the
     * API server sends it to watches; the caller's copy keeps the stored
     * one. */
    json_t *gone = json_copy(row.body);
    json_t *meta = gone ? json_copy(json_object_get(gone, "metadata")) : NULL;
    char rvs[24];
    snprintf(rvs, sizeof(rvs), "%" PRIu64, rv);
    if (meta && json_object_set_new(meta, "resourceVersion", json_string(rvs)) != 0) {
        json_decref(meta);
        meta = NULL;
    }
    /* json_object_set_new takes meta even when it fails. */
    if (!meta || json_object_set_new(gone, "metadata", meta) != 0) {
        json_decref(gone);
        set_err(err, errlen, "store: out of memory deleting %s %s/%s", kname, ns, name);
        goto fail_body;
    }
    json_object_del(gone, "status");
    char *gone_text = st->pg ? json_dumps(gone, JSON_COMPACT) : NULL;
    int rc;
    if (st->pg) {
        /* The tombstone other replicas replay the deletion from. */
        rc = !gone_text || sl_store_pg_delete(st->pg, kname, ns, name) != 0 ||
             sl_store_pg_tombstone(st->pg, rv, kname, ns, name, gone_text) != 0;
    } else {
        sqlite3_stmt *s = st->stmt[STMT_DELETE];
        sqlite3_bind_text(s, 1, kname, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, ns, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 3, name, -1, SQLITE_STATIC);
        rc = run(st, STMT_DELETE);
    }
    free(gone_text);
    if (row.status)
        json_object_set(gone, "status", row.status);
    if (rc != 0 || counter_write(st, STORE_CONFIG_RV_COUNTER, rv) != 0) {
        json_decref(gone);
        set_err(err, errlen, "store %s: cannot delete %s %s/%s: %s", st->path, kname, ns, name,
                db_errmsg(st));
        goto fail_body;
    }
    if (tx_commit(st, err, errlen) != 0) {
        json_decref(gone);
        json_decref(row.body);
        return SL_STORE_ERROR;
    }
    wrote(st, t0);
    notify(st, "DELETED", gone);
    json_decref(gone);
    committed(st);
    if (deleted)
        *deleted = row.body;
    else
        json_decref(row.body);
    return SL_STORE_OK;

fail_body:
    json_decref(row.body);
    tx_rollback(st);
    return SL_STORE_ERROR;
}

/* The written status replaces the stored one in one transaction, with a new
 * resourceVersion (also in the body's metadata) and the same generation. */
static enum sl_store_result put_status_impl(sl_store_t *st, enum sl_kind kind, const char *ns,
                                            const char *name, json_t *status, const char *expect_rv,
                                            json_t **stored, char *err, size_t errlen)
{
    *stored = NULL;
    if ((unsigned)kind >= SL_KIND__COUNT || !name || !json_is_object(status)) {
        set_err(err, errlen, "store: a status write needs a kind, a name and a status object");
        return SL_STORE_ERROR;
    }
    ns = ns ? ns : "default";
    const char *kname = sl_kind_name(kind);
    uint64_t t0 = now_us(), rv;
    row_t row;
    enum sl_store_result ret = begin_write(st, kname, ns, name, expect_rv, &row, &rv, err, errlen);
    if (ret != SL_STORE_OK)
        return ret;
    char *body_text = NULL, *status_text = NULL;
    ret = SL_STORE_ERROR;
    char rvs[24], now[32];
    snprintf(rvs, sizeof(rvs), "%" PRIu64, rv);
    rfc3339_now(now);
    json_object_del(row.body, "status");
    json_object_set_new(json_object_get(row.body, "metadata"), "resourceVersion", json_string(rvs));
    body_text = json_dumps(row.body, JSON_COMPACT);
    status_text = json_dumps(status, JSON_COMPACT);
    if (!body_text || !status_text) {
        set_err(err, errlen, "store: out of memory writing the status of %s %s/%s", kname, ns,
                name);
        goto fail;
    }
    int rc;
    if (st->pg) {
        rc = sl_store_pg_set_status(st->pg, kname, ns, name, status_text, rv, body_text, now);
    } else {
        sqlite3_stmt *s = st->stmt[STMT_SET_STATUS];
        sqlite3_bind_text(s, 1, kname, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, ns, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 3, name, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 4, status_text, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 5, (sqlite3_int64)rv);
        sqlite3_bind_text(s, 6, body_text, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 7, now, -1, SQLITE_STATIC);
        rc = run(st, STMT_SET_STATUS);
    }
    if (rc != 0) {
        set_err(err, errlen, "store %s: cannot write the status of %s %s/%s: %s", st->path, kname,
                ns, name, db_errmsg(st));
        goto fail;
    }
    if (tx_commit(st, err, errlen) != 0) {
        ret = SL_STORE_ERROR;
        goto out;
    }
    wrote(st, t0);
    json_object_set(row.body, "status", status);
    /* Watches see a status write like any other change (its own
     * resourceVersion). */
    notify(st, "MODIFIED", row.body);
    committed(st);
    *stored = row.body;
    row.body = NULL;
    ret = SL_STORE_OK;
    goto out;
fail:
    tx_rollback(st);
out:
    free(body_text);
    free(status_text);
    json_decref(row.body);
    return ret;
}

typedef struct {
    sl_store_t *st;
    json_t *out;
    const char *kname, *ns;
} list_ctx_t;

/* One listed row (either backend): the body with its written status. */
static int list_row(void *arg, const char *body, const char *status)
{
    list_ctx_t *c = arg;
    json_t *v = parse_body(c->st, body, c->kname, c->ns ? c->ns : "*", "*");
    if (!v || json_array_append_new(c->out, v) != 0)
        return -1;
    if (status) {
        json_t *stv = parse_body(c->st, status, c->kname, c->ns ? c->ns : "*", "*");
        if (!stv || json_object_set_new(v, "status", stv) != 0)
            return -1;
    }
    return 0;
}

/* *array: new reference on SL_STORE_OK (possibly empty). */
static enum sl_store_result list_impl(sl_store_t *st, enum sl_kind kind, const char *ns,
                                      json_t **array)
{
    *array = NULL;
    if ((unsigned)kind >= SL_KIND__COUNT)
        return SL_STORE_ERROR;
    json_t *out = json_array();
    if (!out)
        return SL_STORE_ERROR;
    const char *kname = sl_kind_name(kind);
    list_ctx_t c = {st, out, kname, ns};
    if (st->pg) {
        if (sl_store_pg_list(st->pg, kname, ns, list_row, &c) != 0) {
            sl_log_error("store %s: list %s: %s", st->path, sl_kind_plural(kind), db_errmsg(st));
            json_decref(out);
            return SL_STORE_ERROR;
        }
        *array = out;
        return SL_STORE_OK;
    }
    sqlite3_stmt *s = st->stmt[ns ? STMT_LIST_KIND_NS : STMT_LIST_KIND];
    sqlite3_bind_text(s, 1, kname, -1, SQLITE_STATIC);
    if (ns)
        sqlite3_bind_text(s, 2, ns, -1, SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (list_row(&c, (const char *)sqlite3_column_text(s, 0),
                     sqlite3_column_type(s, 1) == SQLITE_TEXT
                         ? (const char *)sqlite3_column_text(s, 1)
                         : NULL) != 0)
            goto fail;
    }
    if (rc != SQLITE_DONE) {
        sl_log_error("store %s: list %s: %s", st->path, sl_kind_plural(kind), db_errmsg(st));
        goto fail;
    }
    stmt_done(s);
    *array = out;
    return SL_STORE_OK;

fail:
    stmt_done(s);
    json_decref(out);
    return SL_STORE_ERROR;
}

enum sl_store_result sl_store_list(sl_store_t *st, enum sl_kind kind, const char *ns,
                                   json_t **array)
{
    uint64_t t0 = now_us();
    enum sl_store_result r = list_impl(st, kind, ns, array);
    sl_ctrl_hist_observe(&sl_ctrl_store_read_seconds, now_us() - t0);
    return outcome(st, r, NULL, 0);
}

typedef struct {
    sl_store_t *st;
    sl_resource_set_t *set;
    char *err;
    size_t errlen;
} load_ctx_t;

/* ---- the in-memory resource set (SQLite) ---------------------------------- */

static void mem_drop(sl_store_t *st)
{
    sl_resource_set_free(&st->mem);
    st->mem_valid = 0;
}

/* -1: the counter cannot be read; 1: the memory is current. */
static int mem_current(sl_store_t *st, uint64_t *rv_now)
{
    *rv_now = 0;
    if (counter_read(st, STORE_RV_COUNTER, rv_now) != 0) {
        mem_drop(st);
        return -1;
    }
    return st->mem_valid && st->mem_rv == *rv_now;
}

/* The set's index ("Kind/ns/name" -> position) after positions moved. */
static int mem_reindex(sl_resource_set_t *set)
{
    json_object_clear(set->index);
    for (size_t i = 0; i < set->count; i++) {
        char key[1024];
        const sl_resource_t *r = &set->items[i];
        snprintf(key, sizeof(key), "%s/%s/%s", sl_kind_name(r->kind), r->ns, r->name);
        if (json_object_set_new(set->index, key, json_integer((json_int_t)i)) != 0)
            return -1;
    }
    return 0;
}

/* load_all's order: ORDER BY kind, namespace, name (SQLite's BINARY
 * collation, i.e. strcmp). */
static int mem_cmp(const sl_resource_t *a, const char *kname, const char *ns, const char *name)
{
    int c = strcmp(sl_kind_name(a->kind), kname);
    if (!c)
        c = strcmp(a->ns, ns);
    return c ? c : strcmp(a->name, name);
}

/* One committed write of this process (the document as the observer gets
 * it) into the memory; on any failure the memory is dropped. */
static void mem_apply(sl_store_t *st, const char *type, json_t *doc)
{
    if (!st->mem_valid)
        return;
    enum sl_kind kind;
    const char *ns, *name;
    json_t *rvj = json_object_get(json_object_get(doc, "metadata"), "resourceVersion");
    uint64_t rv = json_is_string(rvj) ? strtoull(json_string_value(rvj), NULL, 10) : 0;
    if (identity(doc, &kind, &ns, &name) != 0 || !rv || !st->mem.index) {
        mem_drop(st);
        return;
    }
    sl_resource_set_t *set = &st->mem;
    const char *kname = sl_kind_name(kind);
    char key[1024];
    snprintf(key, sizeof(key), "%s/%s/%s", kname, ns, name);
    json_t *pos = json_object_get(set->index, key);
    size_t at = pos ? (size_t)json_integer_value(pos) : set->count;
    if (strcmp(type, "DELETED") == 0) {
        if (at < set->count) {
            json_decref(set->items[at].obj);
            free(set->items[at].source);
            memmove(&set->items[at], &set->items[at + 1],
                    (set->count - at - 1) * sizeof(set->items[0]));
            set->count--;
            if (mem_reindex(set) != 0) {
                mem_drop(st);
                return;
            }
        }
        st->mem_rv = rv;
        return;
    }
    /* As load_all reads it: the body, without the status. */
    json_t *copy = json_deep_copy(doc);
    if (!copy) {
        mem_drop(st);
        return;
    }
    json_object_del(copy, "status");
    uint64_t hash = sl_json_hash(copy);
    if (at < set->count) {
        sl_resource_t *r = &set->items[at];
        json_t *meta = json_object_get(copy, "metadata");
        json_t *nsj = json_object_get(meta, "namespace");
        json_decref(r->obj);
        r->obj = copy;
        r->name = json_string_value(json_object_get(meta, "name"));
        r->ns = json_is_string(nsj) ? json_string_value(nsj) : "default";
        r->hash = hash;
    } else {
        char source[600];
        snprintf(source, sizeof(source), "%s/%s/%s", sl_kind_plural(kind), ns, name);
        int added = sl_resource_set_add(set, copy, source, 0);
        json_decref(copy);
        if (added != 0) {
            mem_drop(st);
            return;
        }
        set->items[set->count - 1].hash = hash;
        /* Into its place in load_all's order. */
        size_t k = set->count - 1;
        while (k > 0 && mem_cmp(&set->items[k - 1], kname, ns, name) > 0)
            k--;
        if (k != set->count - 1) {
            sl_resource_t tmp = set->items[set->count - 1];
            memmove(&set->items[k + 1], &set->items[k],
                    (set->count - 1 - k) * sizeof(set->items[0]));
            set->items[k] = tmp;
            if (mem_reindex(set) != 0) {
                mem_drop(st);
                return;
            }
        }
    }
    st->mem_rv = rv;
}

static int set_order(const void *a, const void *b)
{
    const sl_resource_t *x = a, *y = b;
    return mem_cmp(x, sl_kind_name(y->kind), y->ns, y->name);
}

/* PostgreSQL orders by the database's collation: the set is put in the
 * byte order the memory keeps (SQLite's), so that a full load and the
 * memory compile to the same bytes on every replica. */
static int set_sort(sl_resource_set_t *set)
{
    if (set->count < 2)
        return 0;
    qsort(set->items, set->count, sizeof(set->items[0]), set_order);
    return set->index ? mem_reindex(set) : 0;
}

/* A full load's result becomes the memory (the same documents, shared:
 * neither side changes them). */
static void mem_fill(sl_store_t *st, const sl_resource_set_t *set, uint64_t rv)
{
    mem_drop(st);
    for (size_t i = 0; i < set->count; i++) {
        const sl_resource_t *r = &set->items[i];
        if (sl_resource_set_add(&st->mem, r->obj, r->source, r->doc) != 0) {
            mem_drop(st);
            return;
        }
        st->mem.items[i].hash = r->hash;
    }
    if (!st->mem.index && !(st->mem.index = json_object())) {
        mem_drop(st);
        return;
    }
    st->mem_valid = 1;
    st->mem_rv = rv;
}

/* One loaded row (either backend) into the resource set. */
static int load_row(void *arg, const char *kname, const char *ns, const char *name,
                    const char *body)
{
    load_ctx_t *c = arg;
    enum sl_kind kind;
    if (!kname || !ns || !name || sl_kind_from_name(kname, &kind) != 0) {
        set_err(c->err, c->errlen,
                "store %s: row of unknown kind '%s' (written by a newer version?)", c->st->path,
                kname ? kname : "");
        return -1;
    }
    json_t *obj = parse_body(c->st, body, kname, ns, name);
    if (!obj) {
        set_err(c->err, c->errlen, "store %s: %s %s/%s: stored body is corrupt", c->st->path, kname,
                ns, name);
        return -1;
    }
    char source[600];
    snprintf(source, sizeof(source), "%s/%s/%s", sl_kind_plural(kind), ns, name);
    int added = sl_resource_set_add(c->set, obj, source, 0);
    json_decref(obj); /* the set holds its own reference */
    if (added == 0)
        c->set->items[c->set->count - 1].hash = sl_json_hash(obj);
    if (added != 0) {
        set_err(c->err, c->errlen, "store: out of memory loading %s", source);
        return -1;
    }
    return 0;
}

/* Appends every stored object to `set` (which the caller initialised and
 * keeps owning), and notes the config resourceVersion of that state (one
 * snapshot). On error the set may hold part of the objects; the caller
 * frees it. */
static enum sl_store_result load_all_impl(sl_store_t *st, sl_resource_set_t *set, char *err,
                                          size_t errlen)
{
    load_ctx_t c = {st, set, err, errlen};
    if (err && errlen)
        err[0] = '\0';
    if (st->pg) {
        uint64_t crv = 0;
        if (sl_store_pg_load_all(st->pg, load_row, &c, STORE_CONFIG_RV_COUNTER, &crv) != 0) {
            if (!err || !err[0])
                set_err(err, errlen, "store %s: cannot read resources: %s", st->path,
                        db_errmsg(st));
            return SL_STORE_ERROR;
        }
        st->loaded_version = crv;
        st->mem_loads++;
        if (set_sort(set) != 0) {
            set_err(err, errlen, "store: out of memory loading the resources");
            mem_drop(st);
            return SL_STORE_ERROR;
        }
        /* Every change up to what the replay has seen is in this state;
         * changes after it are replayed again on top (no change). */
        mem_fill(st, set, sl_store_pg_seen(st->pg));
        return SL_STORE_OK;
    }
    /* Nothing written since the memory was last brought up to date (by
     * this process): the set from memory, without reading a row. */
    uint64_t rv_now = 0;
    int cur = mem_current(st, &rv_now);
    if (cur < 0) {
        set_err(err, errlen, "store %s: cannot read resources: %s", st->path, db_errmsg(st));
        return SL_STORE_ERROR;
    }
    if (cur && set != &st->mem) {
        for (size_t i = 0; i < st->mem.count; i++) {
            const sl_resource_t *r = &st->mem.items[i];
            if (sl_resource_set_add(set, r->obj, r->source, r->doc) != 0) {
                set_err(err, errlen, "store: out of memory loading %s", r->source);
                return SL_STORE_ERROR;
            }
            set->items[set->count - 1].hash = r->hash;
        }
        st->mem_hits++;
        return counter_read(st, STORE_CONFIG_RV_COUNTER, &st->loaded_version) == 0 ? SL_STORE_OK
                                                                                   : SL_STORE_ERROR;
    }
    st->mem_loads++;
    sqlite3_stmt *s = st->stmt[STMT_LIST_ALL];
    enum sl_store_result ret = SL_STORE_OK;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (load_row(&c, (const char *)sqlite3_column_text(s, 0),
                     (const char *)sqlite3_column_text(s, 1),
                     (const char *)sqlite3_column_text(s, 2),
                     (const char *)sqlite3_column_text(s, 3)) != 0) {
            ret = SL_STORE_ERROR;
            break;
        }
    }
    if (ret == SL_STORE_OK && rc != SQLITE_DONE) {
        set_err(err, errlen, "store %s: cannot read resources: %s", st->path, db_errmsg(st));
        ret = SL_STORE_ERROR;
    }
    stmt_done(s);
    /* One connection on one thread: the counter is of the same state. */
    if (ret == SL_STORE_OK && counter_read(st, STORE_CONFIG_RV_COUNTER, &st->loaded_version) != 0)
        ret = SL_STORE_ERROR;
    if (ret == SL_STORE_OK)
        mem_fill(st, set, rv_now);
    else
        mem_drop(st);
    return ret;
}

enum sl_store_result sl_store_load_shared(sl_store_t *st, const sl_resource_set_t **out, char *err,
                                          size_t errlen)
{
    uint64_t t0 = now_us(), rv_now = 0;
    enum sl_store_result r;
    *out = NULL;
    sl_resource_set_free(&st->scratch);
    if (err && errlen)
        err[0] = '\0';
    if (st->pg && st->mem_valid && sl_store_pg_sync(st->pg) == 0 && st->mem_valid &&
        st->mem_rv == sl_store_pg_seen(st->pg)) {
        /* Caught up with every replica's changes, all replayed into it. */
        st->mem_hits++;
        st->loaded_version = sl_store_pg_seen_config(st->pg);
        r = SL_STORE_OK;
        *out = &st->mem;
    } else if (!st->pg && mem_current(st, &rv_now) == 1) {
        st->mem_hits++;
        r = counter_read(st, STORE_CONFIG_RV_COUNTER, &st->loaded_version) == 0 ? SL_STORE_OK
                                                                                : SL_STORE_ERROR;
        if (r != SL_STORE_OK)
            set_err(err, errlen, "store %s: cannot read the config version: %s", st->path,
                    db_errmsg(st));
        *out = &st->mem;
    } else {
        r = load_all_impl(st, &st->scratch, err, errlen);
        *out = &st->scratch;
    }
    sl_ctrl_hist_observe(&sl_ctrl_store_read_seconds, now_us() - t0);
    if (r != SL_STORE_OK) {
        sl_resource_set_free(&st->scratch);
        *out = NULL;
    }
    return outcome(st, r, err, errlen);
}

void sl_store_load_stats(const sl_store_t *st, uint64_t *from_memory, uint64_t *from_database)
{
    *from_memory = st->mem_hits;
    *from_database = st->mem_loads;
}

enum sl_store_result sl_store_load_all(sl_store_t *st, sl_resource_set_t *set, char *err,
                                       size_t errlen)
{
    uint64_t t0 = now_us();
    enum sl_store_result r = load_all_impl(st, set, err, errlen);
    sl_ctrl_hist_observe(&sl_ctrl_store_read_seconds, now_us() - t0);
    return outcome(st, r, err, errlen);
}

/* The writes of the store's public API, with a PostgreSQL store that
 * cannot be reached answering SL_STORE_UNAVAILABLE. */
enum sl_store_result sl_store_put(sl_store_t *st, json_t *obj, enum sl_store_mode mode,
                                  const char *expect_rv, json_t **stored, char *err, size_t errlen)
{
    return outcome(st, put_impl(st, obj, mode, expect_rv, stored, err, errlen), err, errlen);
}

enum sl_store_result sl_store_put_many(sl_store_t *st, json_t *objs, json_t **stored, char *err,
                                       size_t errlen)
{
    return outcome(st, put_many_impl(st, objs, stored, err, errlen), err, errlen);
}

enum sl_store_result sl_store_delete(sl_store_t *st, enum sl_kind kind, const char *ns,
                                     const char *name, const char *expect_rv, json_t **deleted,
                                     char *err, size_t errlen)
{
    return outcome(st, delete_impl(st, kind, ns, name, expect_rv, deleted, err, errlen), err,
                   errlen);
}

enum sl_store_result sl_store_put_status(sl_store_t *st, enum sl_kind kind, const char *ns,
                                         const char *name, json_t *status, const char *expect_rv,
                                         json_t **stored, char *err, size_t errlen)
{
    return outcome(st, put_status_impl(st, kind, ns, name, status, expect_rv, stored, err, errlen),
                   err, errlen);
}

/* PostgreSQL: what this replica has replayed, after catching up, so that a
 * list and a watch from its resourceVersion agree with the watch hub. */
uint64_t sl_store_resource_version(sl_store_t *st)
{
    if (st->pg) {
        sl_store_pg_sync(st->pg);
        return sl_store_pg_seen(st->pg);
    }
    return sl_store_counter_get(st, STORE_RV_COUNTER);
}

uint64_t sl_store_counter_next(sl_store_t *st, const char *name)
{
    if (!st || !name)
        return 0;
    uint64_t t0 = now_us();
    char err[256];
    if (tx_begin(st, err, sizeof(err)) != 0) {
        sl_log_error("%s", err);
        return 0;
    }
    uint64_t v;
    if (counter_read(st, name, &v) != 0) {
        sl_log_error("store %s: counter %s: cannot read it: %s", st->path, name, db_errmsg(st));
        tx_rollback(st);
        return 0;
    }
    /* Not an SQLite error: sqlite3_errmsg would say "not an error". */
    if (v >= (uint64_t)INT64_MAX) {
        sl_log_error("store %s: counter %s is at %" PRIu64 ", it cannot go further", st->path, name,
                     v);
        tx_rollback(st);
        return 0;
    }
    if (counter_write(st, name, v + 1) != 0) {
        sl_log_error("store %s: counter %s: cannot write it: %s", st->path, name, db_errmsg(st));
        tx_rollback(st);
        return 0;
    }
    if (tx_commit(st, err, sizeof(err)) != 0) {
        sl_log_error("%s", err);
        return 0;
    }
    wrote(st, t0);
    return v + 1;
}

/* One statement in autocommit mode: atomic and, with synchronous=FULL,
 * durable before return. */
int sl_store_counter_set(sl_store_t *st, const char *name, uint64_t value, char *err, size_t errlen)
{
    if (!st || !name) {
        set_err(err, errlen, "store: no store");
        return -1;
    }
    uint64_t t0 = now_us();
    if (counter_write(st, name, value) != 0) {
        set_err(err, errlen, "store %s: counter %s: %s (is the disk full or read-only?)", st->path,
                name, db_errmsg(st));
        return -1;
    }
    wrote(st, t0);
    return 0;
}

static int counter_read_impl(sl_store_t *st, const char *name, uint64_t *out, char *err,
                             size_t errlen)
{
    if (!st || !name || counter_read(st, name, out) != 0) {
        set_err(err, errlen, "store %s: counter %s: cannot read it: %s", st ? st->path : "?",
                name ? name : "?", st ? db_errmsg(st) : "no store");
        return -1;
    }
    return 0;
}

int sl_store_counter_read(sl_store_t *st, const char *name, uint64_t *out, char *err, size_t errlen)
{
    uint64_t t0 = now_us();
    int r = counter_read_impl(st, name, out, err, errlen);
    sl_ctrl_hist_observe(&sl_ctrl_store_read_seconds, now_us() - t0);
    return r;
}

int sl_store_counter_max(sl_store_t *st, const char *like, uint64_t limit, uint64_t *out, char *err,
                         size_t errlen)
{
    if (st->pg) {
        if (sl_store_pg_counter_max(st->pg, like, limit, out) != 0) {
            set_err(err, errlen, "store %s: %s", st->path, db_errmsg(st));
            return -1;
        }
        return 0;
    }
    sqlite3_stmt *q = NULL;
    /* Values are stored as the bit pattern of a uint64 (signed in SQLite):
     * the range test also drops those past INT64_MAX. */
    if (sqlite3_prepare_v2(st->db,
                           "SELECT MAX(value) FROM counters WHERE name LIKE ?1 AND value >= 0 "
                           "AND value <= ?2",
                           -1, &q, NULL) != SQLITE_OK) {
        set_err(err, errlen, "store %s: %s", st->path, db_errmsg(st));
        return -1;
    }
    sqlite3_bind_text(q, 1, like, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 2, (sqlite3_int64)limit);
    int rc = sqlite3_step(q);
    *out = rc == SQLITE_ROW ? (uint64_t)sqlite3_column_int64(q, 0) : 0;
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        set_err(err, errlen, "store %s: %s", st->path, db_errmsg(st));
    sqlite3_finalize(q);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : -1;
}

static uint64_t counter_get_impl(sl_store_t *st, const char *name)
{
    uint64_t v = 0;
    if (!st || !name)
        return 0;
    if (counter_read(st, name, &v) != 0) {
        sl_log_error("store %s: counter %s: %s", st->path, name, db_errmsg(st));
        return 0;
    }
    return v;
}

uint64_t sl_store_counter_get(sl_store_t *st, const char *name)
{
    uint64_t t0 = now_us();
    uint64_t r = counter_get_impl(st, name);
    sl_ctrl_hist_observe(&sl_ctrl_store_read_seconds, now_us() - t0);
    return r;
}

uint64_t sl_store_last_write_us(const sl_store_t *st)
{
    return st ? st->last_write_us : 0;
}
