/*
 * Unit tests of the controller's durable store (controller/store.c) against a
 * real SQLite file in a fresh temporary directory: open/migrate/reopen,
 * refusing newer schemas and unusable paths, put/replace/delete semantics of
 * resourceVersion, generation, uid and creationTimestamp, preconditions,
 * list order, put_many atomicity, durable counters, load_all, and kill -9
 * safety (a child writing in a loop is SIGKILLed; every write it reported as
 * acknowledged must be there and the database must pass integrity_check).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
    char dir[256];
    sl_store_t *st;
} fixture_t;

static void rm_rf(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    if (!f)
        return -1;
    snprintf(f->dir, sizeof(f->dir), "/tmp/sl-test-store-XXXXXX");
    if (!mkdtemp(f->dir)) {
        free(f);
        return -1;
    }
    char err[512];
    char data[300];
    snprintf(data, sizeof(data), "%s/data", f->dir);
    f->st = sl_store_open(data, err, sizeof(err));
    if (!f->st) {
        fprintf(stderr, "open: %s\n", err);
        rm_rf(f->dir);
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    sl_store_close(f->st);
    rm_rf(f->dir);
    free(f);
    return 0;
}

static const char *data_dir(fixture_t *f)
{
    static char buf[300];
    snprintf(buf, sizeof(buf), "%s/data", f->dir);
    return buf;
}

static void reopen(fixture_t *f)
{
    char err[512];
    sl_store_close(f->st);
    f->st = sl_store_open(data_dir(f), err, sizeof(err));
    if (!f->st)
        fail_msg("reopen: %s", err);
}

static json_t *backend(const char *ns, const char *name, int port)
{
    json_t *o = json_pack("{s:s, s:s, s:{s:s}, s:{s:[{s:s, s:i}]}}", "apiVersion", SL_API_VERSION,
                          "kind", "Backend", "metadata", "name", name, "spec", "endpoints",
                          "address", "127.0.0.1", "port", port);
    assert_non_null(o);
    if (ns)
        json_object_set_new(json_object_get(o, "metadata"), "namespace", json_string(ns));
    return o;
}

static const char *meta_str(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(json_object_get(o, "metadata"), key));
    assert_non_null(s);
    return s;
}

static json_int_t meta_int(json_t *o, const char *key)
{
    json_t *v = json_object_get(json_object_get(o, "metadata"), key);
    assert_true(json_is_integer(v));
    return json_integer_value(v);
}

/* Puts and asserts success; returns the stored object (caller decrefs). */
static json_t *put_ok(sl_store_t *st, json_t *obj, enum sl_store_mode mode, const char *rv)
{
    char err[512] = "";
    json_t *stored = NULL;
    enum sl_store_result r = sl_store_put(st, obj, mode, rv, &stored, err, sizeof(err));
    if (r != SL_STORE_OK)
        fail_msg("put failed (%d): %s", r, err);
    assert_non_null(stored);
    return stored;
}

static void sql_exec(const char *path, const char *sql)
{
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK)
        fail_msg("%s: %s", sql, msg);
    sqlite3_close(db);
}

static sqlite3_int64 sql_int(const char *path, const char *sql)
{
    sqlite3 *db;
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    sqlite3_int64 v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return v;
}

static void db_path(fixture_t *f, char *out, size_t len)
{
    snprintf(out, len, "%s/data/sluice.db", f->dir);
}

/* ---- open / migrate ------------------------------------------------------- */

static void test_open_creates_nested_dir_wal_and_schema(void **state)
{
    fixture_t *f = *state;
    char path[400];
    db_path(f, path, sizeof(path));
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sql_int(path, "SELECT max(version) FROM schema_version"), 4);

    /* Nested directories are created (mkdir -p). */
    char nested[400], err[512];
    snprintf(nested, sizeof(nested), "%s/a/b/c", f->dir);
    sl_store_t *st = sl_store_open(nested, err, sizeof(err));
    assert_non_null(st);
    sl_store_close(st);
    snprintf(nested, sizeof(nested), "%s/a/b/c/sluice.db", f->dir);
    assert_int_equal(stat(nested, &sb), 0);

    /* WAL mode persists in the file. */
    sqlite3 *db;
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &s, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(s, 0), "wal");
    sqlite3_finalize(s);
    sqlite3_close(db);

    /* Reopening an up-to-date store runs no migration and keeps the data. */
    json_t *b = backend(NULL, "echo", 9001);
    json_decref(put_ok(f->st, b, SL_STORE_CREATE, ""));
    json_decref(b);
    reopen(f);
    json_t *got = NULL;
    assert_int_equal(sl_store_get(f->st, SL_KIND_BACKEND, "default", "echo", &got), SL_STORE_OK);
    json_decref(got);
    assert_int_equal(sql_int(path, "SELECT count(*) FROM schema_version"), 1);
}

static void test_open_refuses_newer_schema(void **state)
{
    fixture_t *f = *state;
    char path[400], err[512];
    db_path(f, path, sizeof(path));
    sl_store_close(f->st);
    f->st = NULL;
    sql_exec(path, "UPDATE schema_version SET version = 99");
    sl_store_t *st = sl_store_open(data_dir(f), err, sizeof(err));
    assert_null(st);
    assert_non_null(strstr(err, "schema version 99 is newer"));
    assert_non_null(strstr(err, path));
    /* Nothing was changed by the refused open. */
    assert_int_equal(sql_int(path, "SELECT version FROM schema_version"), 99);
    sql_exec(path, "UPDATE schema_version SET version = 4");
    reopen(f);
}

/* A store written by the schema of version 1 (before the status column)
 * is migrated on open, keeping its objects. */
static void test_migrates_version_1_store(void **state)
{
    fixture_t *f = *state;
    char path[400];
    db_path(f, path, sizeof(path));
    json_t *b = backend(NULL, "old", 9001);
    json_decref(put_ok(f->st, b, SL_STORE_CREATE, ""));
    json_decref(b);
    sl_store_close(f->st);
    f->st = NULL;
    sql_exec(path, "ALTER TABLE resources DROP COLUMN status; "
                   "UPDATE schema_version SET version = 1");
    reopen(f);
    assert_int_equal(sql_int(path, "SELECT version FROM schema_version"), 4);
    json_t *got = NULL;
    assert_int_equal(sl_store_get(f->st, SL_KIND_BACKEND, "default", "old", &got), SL_STORE_OK);
    assert_null(json_object_get(got, "status"));
    json_decref(got);
}

/* The status subresource: stored durably, resourceVersion moves, generation
 * does not, spec writes keep it, get and list return it, delete forgets it. */
static void test_put_status(void **state)
{
    fixture_t *f = *state;
    char err[512];
    json_t *b = backend(NULL, "echo", 9001);
    json_t *v1 = put_ok(f->st, b, SL_STORE_CREATE, "");
    const char *rv1 =
        json_string_value(json_object_get(json_object_get(v1, "metadata"), "resourceVersion"));
    json_t *status = json_pack("{s:[{s:s, s:s}]}", "conditions", "type", "Ready", "status", "True");
    json_t *stored = NULL;
    assert_int_equal(sl_store_put_status(f->st, SL_KIND_BACKEND, "default", "echo", status, "0",
                                         &stored, err, sizeof(err)),
                     SL_STORE_CONFLICT);
    assert_int_equal(sl_store_put_status(f->st, SL_KIND_BACKEND, "default", "nope", status, "",
                                         &stored, err, sizeof(err)),
                     SL_STORE_NOT_FOUND);
    assert_int_equal(sl_store_put_status(f->st, SL_KIND_BACKEND, "default", "echo", status, rv1,
                                         &stored, err, sizeof(err)),
                     SL_STORE_OK);
    json_t *m = json_object_get(stored, "metadata");
    assert_true(json_equal(json_object_get(stored, "status"), status));
    assert_int_equal(json_integer_value(json_object_get(m, "generation")), 1);
    assert_true(strtoull(json_string_value(json_object_get(m, "resourceVersion")), NULL, 10) >
                strtoull(rv1, NULL, 10));
    assert_int_equal(sl_store_resource_version(f->st),
                     strtoull(json_string_value(json_object_get(m, "resourceVersion")), NULL, 10));
    json_decref(stored);

    reopen(f);
    json_t *got = NULL;
    assert_int_equal(sl_store_get(f->st, SL_KIND_BACKEND, "default", "echo", &got), SL_STORE_OK);
    assert_true(json_equal(json_object_get(got, "status"), status));
    json_decref(got);
    /* A spec write keeps the written status and ignores a status in the body. */
    json_object_set_new(b, "status", json_pack("{s:s}", "bogus", "x"));
    json_t *ep = json_array_get(json_object_get(json_object_get(b, "spec"), "endpoints"), 0);
    json_object_set_new(ep, "port", json_integer(9002));
    json_t *v2 = put_ok(f->st, b, SL_STORE_REPLACE, "");
    assert_true(json_equal(json_object_get(v2, "status"), status));
    json_t *list = NULL;
    assert_int_equal(sl_store_list(f->st, SL_KIND_BACKEND, NULL, &list), SL_STORE_OK);
    assert_true(json_equal(json_object_get(json_array_get(list, 0), "status"), status));
    json_decref(list);
    /* Deleted and created again: no written status. */
    json_t *gone = NULL;
    assert_int_equal(
        sl_store_delete(f->st, SL_KIND_BACKEND, "default", "echo", "", &gone, err, sizeof(err)),
        SL_STORE_OK);
    json_decref(gone);
    json_object_del(b, "status");
    json_t *v3 = put_ok(f->st, b, SL_STORE_CREATE, "");
    assert_null(json_object_get(v3, "status"));
    json_decref(v1);
    json_decref(v2);
    json_decref(v3);
    json_decref(b);
    json_decref(status);
}

static void test_open_errors_name_path_and_fix(void **state)
{
    fixture_t *f = *state;
    char p[400], err[512];

    /* A component of the path is a regular file. */
    snprintf(p, sizeof(p), "%s/file", f->dir);
    FILE *fp = fopen(p, "w");
    assert_non_null(fp);
    fputs("x", fp);
    fclose(fp);
    snprintf(p, sizeof(p), "%s/file/sub", f->dir);
    assert_null(sl_store_open(p, err, sizeof(err)));
    assert_non_null(strstr(err, "cannot create"));
    assert_non_null(strstr(err, "--data-dir"));

    /* The data dir itself is a file. */
    snprintf(p, sizeof(p), "%s/file", f->dir);
    assert_null(sl_store_open(p, err, sizeof(err)));
    assert_non_null(strstr(err, "not a directory"));

    /* sluice.db is not a SQLite database. */
    snprintf(p, sizeof(p), "%s/garbage", f->dir);
    assert_int_equal(mkdir(p, 0700), 0);
    snprintf(p, sizeof(p), "%s/garbage/sluice.db", f->dir);
    fp = fopen(p, "w");
    assert_non_null(fp);
    for (int i = 0; i < 200; i++)
        fputs("this is not a database file at all. ", fp);
    fclose(fp);
    snprintf(p, sizeof(p), "%s/garbage", f->dir);
    assert_null(sl_store_open(p, err, sizeof(err)));
    assert_non_null(strstr(err, "sluice.db"));

    assert_null(sl_store_open("", err, sizeof(err)));
    assert_non_null(strstr(err, "empty path"));
}

/* ---- put / get / delete ------------------------------------------------------ */

static void test_put_create_sets_server_metadata(void **state)
{
    fixture_t *f = *state;
    assert_int_equal(sl_store_resource_version(f->st), 0);
    json_t *b = backend(NULL, "echo", 9001);
    json_object_set_new(b, "status", json_pack("{s:s}", "phase", "bogus"));
    json_object_set_new(json_object_get(b, "metadata"), "resourceVersion", json_string("77"));
    json_t *s = put_ok(f->st, b, SL_STORE_CREATE, "");

    assert_string_equal(meta_str(s, "resourceVersion"), "1");
    assert_int_equal(meta_int(s, "generation"), 1);
    assert_string_equal(meta_str(s, "namespace"), "default");
    assert_null(json_object_get(s, "status"));
    const char *uid = meta_str(s, "uid");
    assert_int_equal(strlen(uid), 36);
    assert_int_equal(uid[14], '4'); /* version 4 */
    assert_true(strchr("89ab", uid[19]) != NULL);
    assert_int_equal(uid[8], '-');
    const char *ts = meta_str(s, "creationTimestamp");
    assert_int_equal(strlen(ts), 20);
    assert_int_equal(ts[10], 'T');
    assert_int_equal(ts[19], 'Z');
    /* The caller's document is not modified. */
    assert_non_null(json_object_get(b, "status"));
    assert_string_equal(meta_str(b, "resourceVersion"), "77");
    assert_int_equal(sl_store_resource_version(f->st), 1);
    assert_true(sl_store_last_write_us(f->st) > 0);

    /* A get returns what the put returned. */
    json_t *g = NULL;
    assert_int_equal(sl_store_get(f->st, SL_KIND_BACKEND, "default", "echo", &g), SL_STORE_OK);
    assert_true(json_equal(g, s));
    json_decref(g);
    assert_int_equal(sl_store_get(f->st, SL_KIND_API, "default", "echo", &g), SL_STORE_NOT_FOUND);
    assert_null(g);
    assert_int_equal(sl_store_get(f->st, SL_KIND_BACKEND, "other", "echo", &g), SL_STORE_NOT_FOUND);

    /* A second create is refused and changes nothing. */
    char err[512];
    json_t *s2 = (json_t *)0x1;
    assert_int_equal(sl_store_put(f->st, b, SL_STORE_CREATE, "", &s2, err, sizeof(err)),
                     SL_STORE_EXISTS);
    assert_null(s2);
    assert_non_null(strstr(err, "already exists"));
    assert_int_equal(sl_store_resource_version(f->st), 1);
    json_decref(s);
    json_decref(b);
}

static void test_replace_generation_only_on_spec_change(void **state)
{
    fixture_t *f = *state;
    json_t *b = backend("team-a", "echo", 9001);
    json_t *s1 = put_ok(f->st, b, SL_STORE_REPLACE, "");
    assert_string_equal(meta_str(s1, "resourceVersion"), "1");

    /* Same spec, new label: new resourceVersion, same generation, uid,
     * creationTimestamp. */
    json_object_set_new(json_object_get(b, "metadata"), "labels", json_pack("{s:s}", "team", "a"));
    json_t *s2 = put_ok(f->st, b, SL_STORE_REPLACE, "");
    assert_string_equal(meta_str(s2, "resourceVersion"), "2");
    assert_int_equal(meta_int(s2, "generation"), 1);
    assert_string_equal(meta_str(s2, "uid"), meta_str(s1, "uid"));
    assert_string_equal(meta_str(s2, "creationTimestamp"), meta_str(s1, "creationTimestamp"));

    /* The same spec with keys in another order is the same spec. */
    json_t *b2 = json_pack("{s:s, s:s, s:{s:s, s:s}, s:{s:[{s:i, s:s}]}}", "kind", "Backend",
                           "apiVersion", SL_API_VERSION, "metadata", "namespace", "team-a", "name",
                           "echo", "spec", "endpoints", "port", 9001, "address", "127.0.0.1");
    json_t *s3 = put_ok(f->st, b2, SL_STORE_REPLACE, "");
    assert_int_equal(meta_int(s3, "generation"), 1);
    assert_string_equal(meta_str(s3, "resourceVersion"), "3");

    /* A spec change bumps generation. */
    json_t *b3 = backend("team-a", "echo", 9002);
    json_t *s4 = put_ok(f->st, b3, SL_STORE_REPLACE, "");
    assert_int_equal(meta_int(s4, "generation"), 2);
    assert_string_equal(meta_str(s4, "uid"), meta_str(s1, "uid"));

    /* A generation in the body is ignored (the server owns it). */
    json_object_set_new(json_object_get(b3, "metadata"), "generation", json_integer(40));
    json_t *s5 = put_ok(f->st, b3, SL_STORE_REPLACE, "");
    assert_int_equal(meta_int(s5, "generation"), 2);

    json_decref(s1);
    json_decref(s2);
    json_decref(s3);
    json_decref(s4);
    json_decref(s5);
    json_decref(b);
    json_decref(b2);
    json_decref(b3);
}

static void test_put_preconditions(void **state)
{
    fixture_t *f = *state;
    char err[512];
    json_t *stored = NULL;
    json_t *b = backend(NULL, "echo", 9001);

    /* Expecting a version of an object that does not exist. */
    assert_int_equal(sl_store_put(f->st, b, SL_STORE_REPLACE, "1", &stored, err, sizeof(err)),
                     SL_STORE_NOT_FOUND);
    assert_null(stored);
    assert_int_equal(sl_store_resource_version(f->st), 0);

    json_decref(put_ok(f->st, b, SL_STORE_CREATE, NULL)); /* rv 1 */
    json_t *other = backend(NULL, "other", 9002);
    json_decref(put_ok(f->st, other, SL_STORE_CREATE, NULL)); /* rv 2 */

    /* echo is at rv 1: "2" is somebody else's version. */
    json_t *b2 = backend(NULL, "echo", 9003);
    assert_int_equal(sl_store_put(f->st, b2, SL_STORE_REPLACE, "2", &stored, err, sizeof(err)),
                     SL_STORE_CONFLICT);
    assert_null(stored);
    assert_non_null(strstr(err, "resourceVersion is 1, not 2"));
    assert_int_equal(sl_store_resource_version(f->st), 2);
    json_t *g = NULL;
    assert_int_equal(sl_store_get(f->st, SL_KIND_BACKEND, "default", "echo", &g), SL_STORE_OK);
    assert_int_equal(
        json_integer_value(json_object_get(
            json_array_get(json_object_get(json_object_get(g, "spec"), "endpoints"), 0), "port")),
        9001);
    json_decref(g);

    /* The right version wins. */
    json_t *s = put_ok(f->st, b2, SL_STORE_REPLACE, "1");
    assert_string_equal(meta_str(s, "resourceVersion"), "3");
    json_decref(s);
    json_decref(b);
    json_decref(b2);
    json_decref(other);
}

static void test_delete(void **state)
{
    fixture_t *f = *state;
    char err[512];
    json_t *deleted = NULL;
    assert_int_equal(
        sl_store_delete(f->st, SL_KIND_BACKEND, "default", "echo", "", &deleted, err, sizeof(err)),
        SL_STORE_NOT_FOUND);
    assert_null(deleted);
    assert_non_null(strstr(err, "not found"));

    json_t *b = backend(NULL, "echo", 9001);
    json_t *s = put_ok(f->st, b, SL_STORE_CREATE, ""); /* rv 1 */

    assert_int_equal(
        sl_store_delete(f->st, SL_KIND_BACKEND, "default", "echo", "7", &deleted, err, sizeof(err)),
        SL_STORE_CONFLICT);
    assert_null(deleted);
    assert_int_equal(sl_store_resource_version(f->st), 1);

    assert_int_equal(
        sl_store_delete(f->st, SL_KIND_BACKEND, NULL, "echo", "1", &deleted, err, sizeof(err)),
        SL_STORE_OK);
    assert_true(json_equal(deleted, s));
    json_decref(deleted);
    /* A delete moves the store's resourceVersion. */
    assert_int_equal(sl_store_resource_version(f->st), 2);
    json_t *g = NULL;
    assert_int_equal(sl_store_get(f->st, SL_KIND_BACKEND, "default", "echo", &g),
                     SL_STORE_NOT_FOUND);

    /* Re-created: new uid, generation restarts. */
    json_t *s2 = put_ok(f->st, b, SL_STORE_CREATE, "");
    assert_string_not_equal(meta_str(s2, "uid"), meta_str(s, "uid"));
    assert_int_equal(meta_int(s2, "generation"), 1);
    assert_string_equal(meta_str(s2, "resourceVersion"), "3");
    /* deleted may be NULL. */
    assert_int_equal(
        sl_store_delete(f->st, SL_KIND_BACKEND, "default", "echo", NULL, NULL, err, sizeof(err)),
        SL_STORE_OK);
    json_decref(s);
    json_decref(s2);
    json_decref(b);
}

static void test_list_order_and_namespace_filter(void **state)
{
    fixture_t *f = *state;
    const char *objs[][2] = {
        {"zeta", "b"}, {"alpha", "b"}, {"zeta", "a"}, {"default", "m"}, {"alpha", "a"}};
    for (size_t i = 0; i < sizeof(objs) / sizeof(objs[0]); i++) {
        json_t *b = backend(objs[i][0], objs[i][1], 9000 + (int)i);
        json_decref(put_ok(f->st, b, SL_STORE_CREATE, ""));
        json_decref(b);
    }
    /* An object of another kind is not listed. */
    json_t *c = json_pack("{s:s, s:s, s:{s:s}, s:{}}", "apiVersion", SL_API_VERSION, "kind",
                          "Consumer", "metadata", "name", "a", "spec");
    json_decref(put_ok(f->st, c, SL_STORE_CREATE, ""));
    json_decref(c);

    json_t *arr = NULL;
    assert_int_equal(sl_store_list(f->st, SL_KIND_BACKEND, NULL, &arr), SL_STORE_OK);
    const char *want[][2] = {
        {"alpha", "a"}, {"alpha", "b"}, {"default", "m"}, {"zeta", "a"}, {"zeta", "b"}};
    assert_int_equal(json_array_size(arr), 5);
    for (size_t i = 0; i < 5; i++) {
        json_t *o = json_array_get(arr, i);
        assert_string_equal(meta_str(o, "namespace"), want[i][0]);
        assert_string_equal(meta_str(o, "name"), want[i][1]);
    }
    json_decref(arr);

    assert_int_equal(sl_store_list(f->st, SL_KIND_BACKEND, "zeta", &arr), SL_STORE_OK);
    assert_int_equal(json_array_size(arr), 2);
    assert_string_equal(meta_str(json_array_get(arr, 0), "name"), "a");
    assert_string_equal(meta_str(json_array_get(arr, 1), "name"), "b");
    json_decref(arr);

    assert_int_equal(sl_store_list(f->st, SL_KIND_API, NULL, &arr), SL_STORE_OK);
    assert_int_equal(json_array_size(arr), 0);
    json_decref(arr);
}

static void test_put_many_is_all_or_nothing(void **state)
{
    fixture_t *f = *state;
    char err[512];
    json_t *existing = backend(NULL, "keep", 9000);
    json_t *s = put_ok(f->st, existing, SL_STORE_CREATE, ""); /* rv 1 */
    json_decref(s);
    json_decref(existing);

    /* The third item has no name: the whole batch rolls back, including the
     * replacement of "keep". */
    json_t *bad = json_array();
    json_array_append_new(bad, backend(NULL, "one", 9001));
    json_array_append_new(bad, backend(NULL, "keep", 9999));
    json_array_append_new(bad, json_pack("{s:s, s:s, s:{}, s:{}}", "apiVersion", SL_API_VERSION,
                                         "kind", "Backend", "metadata", "spec"));
    json_t *stored = NULL;
    assert_int_equal(sl_store_put_many(f->st, bad, &stored, err, sizeof(err)), SL_STORE_ERROR);
    assert_null(stored);
    json_t *g = NULL;
    assert_int_equal(sl_store_get(f->st, SL_KIND_BACKEND, "default", "one", &g),
                     SL_STORE_NOT_FOUND);
    assert_int_equal(sl_store_get(f->st, SL_KIND_BACKEND, "default", "keep", &g), SL_STORE_OK);
    assert_string_equal(meta_str(g, "resourceVersion"), "1");
    json_decref(g);
    assert_int_equal(sl_store_resource_version(f->st), 1);
    json_decref(bad);

    /* A good batch: every item stored, consecutive versions, in order. */
    json_t *good = json_array();
    json_array_append_new(good, backend(NULL, "one", 9001));
    json_array_append_new(good, backend(NULL, "keep", 9999));
    json_array_append_new(good, backend("ns2", "two", 9002));
    assert_int_equal(sl_store_put_many(f->st, good, &stored, err, sizeof(err)), SL_STORE_OK);
    assert_int_equal(json_array_size(stored), 3);
    assert_string_equal(meta_str(json_array_get(stored, 0), "resourceVersion"), "2");
    assert_string_equal(meta_str(json_array_get(stored, 1), "resourceVersion"), "3");
    assert_int_equal(meta_int(json_array_get(stored, 1), "generation"), 2);
    assert_string_equal(meta_str(json_array_get(stored, 2), "namespace"), "ns2");
    assert_int_equal(sl_store_resource_version(f->st), 4);
    json_decref(stored);
    json_decref(good);

    /* Not an array. */
    json_t *notarray = json_object();
    assert_int_equal(sl_store_put_many(f->st, notarray, &stored, err, sizeof(err)), SL_STORE_ERROR);
    json_decref(notarray);
}

static void test_counters_and_versions_durable_across_reopen(void **state)
{
    fixture_t *f = *state;
    assert_int_equal(sl_store_counter_get(f->st, "config_version"), 0);
    assert_int_equal(sl_store_counter_next(f->st, "config_version"), 1);
    assert_int_equal(sl_store_counter_next(f->st, "config_version"), 2);
    assert_int_equal(sl_store_counter_next(f->st, "config_version"), 3);
    assert_int_equal(sl_store_counter_next(f->st, "other"), 1);
    /* Full 64-bit values (content hashes) round-trip. */
    char cerr[256];
    assert_int_equal(sl_store_counter_set(f->st, "fleet/default/routes/hash", UINT64_MAX - 1, cerr,
                                          sizeof(cerr)),
                     0);
    assert_int_equal(
        sl_store_counter_set(f->st, "fleet/default/routes/version", 41, cerr, sizeof(cerr)), 0);
    assert_int_equal(
        sl_store_counter_set(f->st, "fleet/default/routes/version", 42, cerr, sizeof(cerr)), 0);
    json_t *b = backend(NULL, "echo", 9001);
    json_decref(put_ok(f->st, b, SL_STORE_CREATE, ""));
    json_decref(put_ok(f->st, b, SL_STORE_REPLACE, ""));
    reopen(f);
    assert_int_equal(sl_store_counter_get(f->st, "config_version"), 3);
    assert_int_equal(sl_store_counter_next(f->st, "config_version"), 4);
    assert_int_equal(sl_store_counter_get(f->st, "other"), 1);
    assert_true(sl_store_counter_get(f->st, "fleet/default/routes/hash") == UINT64_MAX - 1);
    assert_int_equal(sl_store_counter_get(f->st, "fleet/default/routes/version"), 42);
    assert_int_equal(sl_store_counter_get(f->st, "never-set"), 0);
    assert_int_equal(sl_store_resource_version(f->st), 2);
    /* The resourceVersion sequence continues after a restart, even after a
     * delete of the newest object. */
    char err[256];
    assert_int_equal(
        sl_store_delete(f->st, SL_KIND_BACKEND, "default", "echo", "", NULL, err, sizeof(err)),
        SL_STORE_OK);
    reopen(f);
    json_t *s = put_ok(f->st, b, SL_STORE_CREATE, "");
    assert_string_equal(meta_str(s, "resourceVersion"), "4");
    json_decref(s);
    json_decref(b);
}

static void test_load_all_builds_resource_set(void **state)
{
    fixture_t *f = *state;
    char err[512];
    sl_resource_set_t set;
    sl_resource_set_init(&set);
    assert_int_equal(sl_store_load_all(f->st, &set, err, sizeof(err)), SL_STORE_OK);
    assert_int_equal(set.count, 0);

    const char *quick = "apiVersion: gateway.sluice.dev/v1alpha1\n"
                        "kind: Backend\n"
                        "metadata: {name: echo}\n"
                        "spec:\n"
                        "  endpoints:\n"
                        "  - {address: 127.0.0.1, port: 9001}\n"
                        "---\n"
                        "apiVersion: gateway.sluice.dev/v1alpha1\n"
                        "kind: Api\n"
                        "metadata: {name: petstore, namespace: shop}\n"
                        "spec:\n"
                        "  basePath: /petstore/v1\n"
                        "  backendRefs: [{name: echo}]\n"
                        "  operations:\n"
                        "  - {method: GET, path: /pets}\n";
    sl_errors_t errs;
    sl_errors_init(&errs);
    sl_resource_set_t in;
    sl_resource_set_init(&in);
    if (sl_model_parse(&in, quick, strlen(quick), "q.yaml", &errs) != 0)
        fail_msg("%s", sl_errors_format(&errs));
    json_t *arr = json_array();
    for (size_t i = 0; i < in.count; i++)
        json_array_append(arr, in.items[i].obj);
    json_t *stored = NULL;
    assert_int_equal(sl_store_put_many(f->st, arr, &stored, err, sizeof(err)), SL_STORE_OK);
    json_decref(stored);
    json_decref(arr);
    sl_resource_set_free(&in);
    sl_errors_free(&errs);

    assert_int_equal(sl_store_load_all(f->st, &set, err, sizeof(err)), SL_STORE_OK);
    assert_int_equal(set.count, 2);
    int seen = 0;
    for (size_t i = 0; i < set.count; i++) {
        sl_resource_t *r = &set.items[i];
        assert_int_equal(r->doc, 0);
        if (r->kind == SL_KIND_API) {
            assert_string_equal(r->source, "apis/shop/petstore");
            assert_string_equal(r->ns, "shop");
            assert_string_equal(r->name, "petstore");
            seen |= 1;
        } else {
            assert_int_equal(r->kind, SL_KIND_BACKEND);
            assert_string_equal(r->source, "backends/default/echo");
            assert_string_equal(r->ns, "default");
            assert_string_equal(r->name, "echo");
            seen |= 2;
        }
        /* Stored documents are still valid for the shared validator. */
        sl_errors_init(&errs);
        assert_int_equal(sl_model_validate(r->obj, r->source, 0, &errs), 0);
        sl_errors_free(&errs);
    }
    assert_int_equal(seen, 3);
    sl_resource_set_free(&set);
}

/* ---- kill -9 safety ------------------------------------------------------ */

typedef struct {
    uint32_t pair; /* 0: one create; 1: a put_many of two objects */
    uint32_t i;
    uint64_t rv; /* resourceVersion of the (last) stored object */
} ack_t;

/* Child: writes forever, reporting each acknowledged write. Never returns. */
static void writer_child(const char *dir, int fd, uint32_t start)
{
    char err[512];
    sl_store_t *st = sl_store_open(dir, err, sizeof(err));
    if (!st)
        _exit(3);
    for (uint32_t i = start; i < start + 100000; i++) {
        char name[64];
        ack_t a = {.pair = i % 3 == 0, .i = i, .rv = 0};
        json_t *stored = NULL;
        if (a.pair) {
            json_t *arr = json_array();
            snprintf(name, sizeof(name), "pair-%u-a", i);
            json_array_append_new(arr, backend("kill", name, 1000 + (int)(i % 60000)));
            snprintf(name, sizeof(name), "pair-%u-b", i);
            json_array_append_new(arr, backend("kill", name, 1000 + (int)(i % 60000)));
            if (sl_store_put_many(st, arr, &stored, err, sizeof(err)) != SL_STORE_OK)
                _exit(4);
            a.rv = strtoull(meta_str(json_array_get(stored, 1), "resourceVersion"), NULL, 10);
            json_decref(arr);
        } else {
            snprintf(name, sizeof(name), "one-%u", i);
            json_t *b = backend("kill", name, 1000 + (int)(i % 60000));
            if (sl_store_put(st, b, SL_STORE_CREATE, "", &stored, err, sizeof(err)) != SL_STORE_OK)
                _exit(5);
            a.rv = strtoull(meta_str(stored, "resourceVersion"), NULL, 10);
            json_decref(b);
        }
        json_decref(stored);
        if (write(fd, &a, sizeof(a)) != (ssize_t)sizeof(a))
            _exit(6);
    }
    _exit(0);
}

/* The set load_all serves from memory (after this handle's own puts,
 * replaces, status writes, deletes and put_many) equals a full load by a
 * second handle on the same file, document for document, in the same
 * order, with the same content hashes; a write by that other handle (another
 * process) is noticed and the next load reads the database. */
static void test_load_all_from_memory_equals_database(void **state)
{
    fixture_t *f = *state;
    char err[512];
    sl_store_t *other = sl_store_open(data_dir(f), err, sizeof(err));
    assert_non_null(other);
    const char *nss[] = {"default", "a-b", "shop", "z"};
    srand(7);
    uint64_t mem0, db0, mem1, db1;
    sl_resource_set_t warm;
    sl_resource_set_init(&warm);
    assert_int_equal(sl_store_load_all(f->st, &warm, err, sizeof(err)), SL_STORE_OK);
    sl_resource_set_free(&warm);
    sl_store_load_stats(f->st, &mem0, &db0);
    int foreign = 0;
    for (int step = 0; step < 200; step++) {
        char name[32];
        const char *ns = nss[rand() % 4];
        snprintf(name, sizeof(name), "b%d%s", rand() % 12, rand() % 2 ? "-x" : "");
        int op = rand() % 10;
        sl_store_t *writer = op == 9 ? other : f->st;
        foreign += op == 9;
        json_t *out = NULL;
        if (op < 5 || op == 9) {
            json_t *b = backend(ns, name, 9000 + rand() % 50);
            json_decref(put_ok(writer, b, SL_STORE_REPLACE, ""));
            json_decref(b);
        } else if (op < 7) {
            json_t *st = json_pack("{s:[{s:s}]}", "conditions", "type", "X");
            sl_store_put_status(f->st, SL_KIND_BACKEND, ns, name, st, "", &out, err, sizeof(err));
            json_decref(st);
        } else if (op < 8) {
            sl_store_delete(f->st, SL_KIND_BACKEND, ns, name, "", &out, err, sizeof(err));
        } else {
            json_t *arr = json_array();
            json_array_append_new(arr, backend(ns, name, 1));
            json_array_append_new(arr, backend(nss[rand() % 4], "many", 2));
            assert_int_equal(sl_store_put_many(f->st, arr, &out, err, sizeof(err)), SL_STORE_OK);
            json_decref(arr);
        }
        json_decref(out);
        sl_resource_set_t a, b;
        sl_resource_set_init(&a);
        sl_resource_set_init(&b);
        assert_int_equal(sl_store_load_all(f->st, &a, err, sizeof(err)), SL_STORE_OK);
        assert_int_equal(sl_store_load_all(other, &b, err, sizeof(err)), SL_STORE_OK);
        assert_int_equal(a.count, b.count);
        for (size_t i = 0; i < a.count; i++) {
            assert_string_equal(a.items[i].source, b.items[i].source);
            assert_int_equal(a.items[i].doc, b.items[i].doc);
            assert_string_equal(a.items[i].ns, b.items[i].ns);
            assert_string_equal(a.items[i].name, b.items[i].name);
            assert_true(json_equal(a.items[i].obj, b.items[i].obj));
            assert_int_equal(a.items[i].hash, sl_json_hash(b.items[i].obj));
            assert_int_equal(b.items[i].hash, a.items[i].hash);
        }
        assert_int_equal(sl_store_loaded_version(f->st), sl_store_loaded_version(other));
        sl_resource_set_free(&a);
        sl_resource_set_free(&b);
    }
    sl_store_load_stats(f->st, &mem1, &db1);
    /* Every load after a write of this handle came from memory; those
     * after a write of the other handle read the database. */
    assert_true(foreign > 0);
    assert_int_equal(db1 - db0, (uint64_t)foreign);
    assert_int_equal(mem1 - mem0, (uint64_t)(200 - foreign));
    sl_store_close(other);
}

static void test_kill9_loses_no_acknowledged_write(void **state)
{
    fixture_t *f = *state;
    char path[400];
    db_path(f, path, sizeof(path));
    uint32_t next = 0;
    srand((unsigned)getpid());

    for (int round = 0; round < 3; round++) {
        sl_store_close(f->st); /* no SQLite connection crosses fork() */
        f->st = NULL;
        int p[2];
        assert_int_equal(pipe(p), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(p[0]);
            writer_child(data_dir(f), p[1], next);
        }
        close(p[1]);

        ack_t *acks = calloc(200000, sizeof(*acks));
        assert_non_null(acks);
        size_t n = 0, kill_after = 20 + (size_t)(rand() % 80);
        bool killed = false;
        for (;;) {
            ack_t a;
            ssize_t r = read(p[0], &a, sizeof(a));
            if (r == 0)
                break;
            if (r < 0 && errno == EINTR)
                continue;
            if (r != (ssize_t)sizeof(a)) {
                kill(pid, SIGKILL);
                fail_msg("short read from the writer: %zd", r);
            }
            acks[n++] = a;
            if (!killed && n >= kill_after) {
                /* Kill mid-stream: the child is inside its next write. */
                kill(pid, SIGKILL);
                killed = true;
            }
        }
        close(p[0]);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status));
        assert_int_equal(WTERMSIG(status), SIGKILL);
        assert_true(n >= kill_after);

        /* SQLite's own check, on a separate connection, before we reopen. */
        sqlite3 *db;
        sqlite3_stmt *s;
        assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
        assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &s, NULL), SQLITE_OK);
        assert_int_equal(sqlite3_step(s), SQLITE_ROW);
        assert_string_equal((const char *)sqlite3_column_text(s, 0), "ok");
        sqlite3_finalize(s);
        sqlite3_close(db);

        reopen(f);
        uint64_t max_rv = 0;
        for (size_t k = 0; k < n; k++) {
            char name[64];
            json_t *g = NULL;
            if (acks[k].pair)
                snprintf(name, sizeof(name), "pair-%u-b", acks[k].i);
            else
                snprintf(name, sizeof(name), "one-%u", acks[k].i);
            if (sl_store_get(f->st, SL_KIND_BACKEND, "kill", name, &g) != SL_STORE_OK)
                fail_msg("round %d: acknowledged write %s (rv %" PRIu64 ") lost", round, name,
                         acks[k].rv);
            assert_int_equal(strtoull(meta_str(g, "resourceVersion"), NULL, 10), acks[k].rv);
            json_decref(g);
            if (acks[k].rv > max_rv)
                max_rv = acks[k].rv;
        }
        assert_true(sl_store_resource_version(f->st) >= max_rv);

        /* No half-applied put_many: pairs come complete, and no object has a
         * resourceVersion above the counter. */
        json_t *arr = NULL;
        assert_int_equal(sl_store_list(f->st, SL_KIND_BACKEND, "kill", &arr), SL_STORE_OK);
        size_t idx;
        json_t *o;
        size_t a_count = 0, b_count = 0;
        json_array_foreach(arr, idx, o)
        {
            const char *nm = meta_str(o, "name");
            size_t len = strlen(nm);
            if (strncmp(nm, "pair-", 5) == 0 && nm[len - 1] == 'a')
                a_count++;
            if (strncmp(nm, "pair-", 5) == 0 && nm[len - 1] == 'b')
                b_count++;
            assert_true(strtoull(meta_str(o, "resourceVersion"), NULL, 10) <=
                        sl_store_resource_version(f->st));
        }
        assert_int_equal(a_count, b_count);
        json_decref(arr);
        free(acks);
        next += 100000;
    }
}

/* ---- observer ------------------------------------------------------------- */

typedef struct {
    char db[512];   /* read through a second connection: sees committed rows only */
    json_t *events; /* [{type, kind, obj, committed_rv}] */
} observed_t;

/* The row's resource_version as another connection sees it (-1: no row). */
static sqlite3_int64 committed_rv(const char *db_path, const char *kind, const char *ns,
                                  const char *name)
{
    sqlite3 *db;
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db,
                                        "SELECT resource_version FROM resources WHERE kind = ?1"
                                        " AND namespace = ?2 AND name = ?3",
                                        -1, &s, NULL),
                     SQLITE_OK);
    sqlite3_bind_text(s, 1, kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, ns, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, name, -1, SQLITE_STATIC);
    sqlite3_int64 v = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1;
    sqlite3_finalize(s);
    sqlite3_close(db);
    return v;
}

static void record(void *arg, const char *type, enum sl_kind kind, json_t *obj)
{
    observed_t *o = arg;
    json_t *meta = json_object_get(obj, "metadata");
    sqlite3_int64 rv = committed_rv(o->db, sl_kind_name(kind),
                                    json_string_value(json_object_get(meta, "namespace")),
                                    json_string_value(json_object_get(meta, "name")));
    json_array_append_new(o->events, json_pack("{s:s, s:s, s:o, s:I}", "type", type, "kind",
                                               sl_kind_name(kind), "obj", json_deep_copy(obj),
                                               "committed_rv", (json_int_t)rv));
}

static void expect_event(observed_t *o, size_t i, const char *type, const char *name,
                         const char *rv, json_int_t committed)
{
    json_t *e = json_array_get(o->events, i);
    assert_non_null(e);
    assert_string_equal(json_string_value(json_object_get(e, "type")), type);
    assert_string_equal(json_string_value(json_object_get(e, "kind")), "Backend");
    json_t *obj = json_object_get(e, "obj");
    assert_string_equal(meta_str(obj, "name"), name);
    assert_string_equal(meta_str(obj, "resourceVersion"), rv);
    /* Told after the commit: another connection already sees the change. */
    assert_int_equal(json_integer_value(json_object_get(e, "committed_rv")), committed);
}

static void test_observer_sees_each_committed_change_once(void **state)
{
    fixture_t *f = *state;
    char err[512];
    observed_t o = {.events = json_array()};
    db_path(f, o.db, sizeof(o.db));
    sl_store_set_observer(f->st, record, &o);

    json_t *b = backend(NULL, "echo", 9001);
    json_decref(put_ok(f->st, b, SL_STORE_CREATE, "")); /* rv 1: ADDED */
    json_t *b2 = backend(NULL, "echo", 9002);
    json_decref(put_ok(f->st, b2, SL_STORE_REPLACE, "1")); /* rv 2: MODIFIED */
    assert_int_equal(json_array_size(o.events), 2);
    expect_event(&o, 0, "ADDED", "echo", "1", 1);
    expect_event(&o, 1, "MODIFIED", "echo", "2", 2);

    /* Failed writes tell nothing. */
    json_t *stored = NULL;
    assert_int_equal(sl_store_put(f->st, b, SL_STORE_CREATE, "", &stored, err, sizeof(err)),
                     SL_STORE_EXISTS);
    assert_int_equal(sl_store_put(f->st, b, SL_STORE_REPLACE, "1", &stored, err, sizeof(err)),
                     SL_STORE_CONFLICT);
    json_t *bad = json_array();
    json_array_append_new(bad, backend(NULL, "one", 9001));
    json_array_append_new(bad, json_pack("{s:s, s:s, s:{}, s:{}}", "apiVersion", SL_API_VERSION,
                                         "kind", "Backend", "metadata", "spec"));
    assert_int_equal(sl_store_put_many(f->st, bad, &stored, err, sizeof(err)), SL_STORE_ERROR);
    json_decref(bad);
    assert_int_equal(
        sl_store_delete(f->st, SL_KIND_BACKEND, "default", "echo", "1", NULL, err, sizeof(err)),
        SL_STORE_CONFLICT);
    assert_int_equal(json_array_size(o.events), 2);

    /* put_many: after the commit, in order; the second write of "one" in the
     * same batch is a MODIFIED. While the first is told, the whole batch is
     * committed. */
    json_t *many = json_array();
    json_array_append_new(many, backend(NULL, "one", 9001));  /* rv 3 */
    json_array_append_new(many, backend(NULL, "echo", 9003)); /* rv 4 */
    json_array_append_new(many, backend(NULL, "one", 9004));  /* rv 5 */
    assert_int_equal(sl_store_put_many(f->st, many, &stored, err, sizeof(err)), SL_STORE_OK);
    json_decref(stored);
    json_decref(many);
    assert_int_equal(json_array_size(o.events), 5);
    expect_event(&o, 2, "ADDED", "one", "3", 5);
    expect_event(&o, 3, "MODIFIED", "echo", "4", 4);
    expect_event(&o, 4, "MODIFIED", "one", "5", 5);

    /* DELETED: the last stored document at the deletion's resourceVersion;
     * the caller's copy keeps the stored one. */
    json_t *deleted = NULL;
    assert_int_equal(
        sl_store_delete(f->st, SL_KIND_BACKEND, NULL, "echo", "4", &deleted, err, sizeof(err)),
        SL_STORE_OK);
    assert_string_equal(meta_str(deleted, "resourceVersion"), "4");
    assert_int_equal(json_array_size(o.events), 6);
    expect_event(&o, 5, "DELETED", "echo", "6", -1);
    json_t *gone = json_object_get(json_array_get(o.events, 5), "obj");
    json_t *ep = json_array_get(json_object_get(json_object_get(gone, "spec"), "endpoints"), 0);
    assert_int_equal(json_integer_value(json_object_get(ep, "port")), 9003);
    assert_string_equal(meta_str(gone, "uid"), meta_str(deleted, "uid"));
    json_decref(deleted);

    /* Re-created after the delete: ADDED again. */
    json_decref(put_ok(f->st, b, SL_STORE_CREATE, "")); /* rv 7 */
    expect_event(&o, 6, "ADDED", "echo", "7", 7);

    /* No observer: nothing told. */
    sl_store_set_observer(f->st, NULL, NULL);
    json_decref(put_ok(f->st, b2, SL_STORE_REPLACE, ""));
    assert_int_equal(json_array_size(o.events), 7);

    json_decref(b);
    json_decref(b2);
    json_decref(o.events);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_open_creates_nested_dir_wal_and_schema, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_open_refuses_newer_schema, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_errors_name_path_and_fix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_create_sets_server_metadata, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replace_generation_only_on_spec_change, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_put_preconditions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_delete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migrates_version_1_store, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_status, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_order_and_namespace_filter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_many_is_all_or_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_counters_and_versions_durable_across_reopen, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_load_all_builds_resource_set, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_all_from_memory_equals_database, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill9_loses_no_acknowledged_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_observer_sees_each_committed_change_once, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
