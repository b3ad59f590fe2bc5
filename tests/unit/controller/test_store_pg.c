/*
 * Unit tests of the store API (controller/store.h) on its PostgreSQL backend
 * (store_pg.c), against the server named by SLUICE_TEST_PG_URL (a libpq URI;
 * tests/integration/test_pg_store.py starts a throwaway PostgreSQL and runs
 * this binary with it). Without that variable every test is skipped.
 *
 * The same cases as test_store.c where they apply (server metadata,
 * generation, preconditions, list order, put_many atomicity, the status
 * subresource, counters, load_all), and what only a shared store has: two
 * handles (two replicas) seeing each other's writes through the observer,
 * resourceVersions never handed out twice, optimistic concurrency under
 * concurrent writers in two processes (no lost update), migrations run by
 * several processes at once, and an unreachable server refused with a
 * message that names it without its password.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "store.h"

#include <event2/event.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *url(void)
{
    return getenv("SLUICE_TEST_PG_URL");
}

/* Runs sql on the test database; the first value of the first row (static)
 * or "". */
static const char *pg_sql(const char *sql)
{
    static char out[256];
    PGconn *c = PQconnectdb(url());
    if (PQstatus(c) != CONNECTION_OK)
        fail_msg("connect %s: %s", url(), PQerrorMessage(c));
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
        fail_msg("%s: %s", sql, PQresultErrorMessage(r));
    out[0] = '\0';
    if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0)
        snprintf(out, sizeof(out), "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    PQfinish(c);
    return out;
}

static sl_store_t *open_pg(void)
{
    char err[1024];
    sl_store_t *st = sl_store_open_postgres(url(), err, sizeof(err));
    if (!st)
        fail_msg("open: %s", err);
    return st;
}

/* A fresh, empty schema for each test. */
static int setup(void **state)
{
    (void)state;
    if (!url())
        return 0;
    pg_sql("SET client_min_messages = warning; DROP SCHEMA public CASCADE; CREATE SCHEMA public");
    return 0;
}

#define NEED_PG()                                                                                  \
    do {                                                                                           \
        if (!url())                                                                                \
            skip();                                                                                \
    } while (0)

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
    return json_integer_value(json_object_get(json_object_get(o, "metadata"), key));
}

static int port_of(json_t *o)
{
    json_t *ep = json_array_get(json_object_get(json_object_get(o, "spec"), "endpoints"), 0);
    return (int)json_integer_value(json_object_get(ep, "port"));
}

static json_t *put_ok(sl_store_t *st, json_t *obj, enum sl_store_mode mode, const char *rv)
{
    char err[512] = "";
    json_t *stored = NULL;
    enum sl_store_result r = sl_store_put(st, obj, mode, rv, &stored, err, sizeof(err));
    if (r != SL_STORE_OK)
        fail_msg("put failed (%d): %s", r, err);
    return stored;
}

/* put_ok of a new document, both released. */
static void put_new(sl_store_t *st, json_t *obj, enum sl_store_mode mode, const char *rv)
{
    json_decref(put_ok(st, obj, mode, rv));
    json_decref(obj);
}

static void test_metadata_generation_preconditions(void **state)
{
    (void)state;
    NEED_PG();
    sl_store_t *st = open_pg();
    char err[512];
    json_t *b = backend(NULL, "echo", 9001), *stored = NULL;
    json_t *s1 = put_ok(st, b, SL_STORE_CREATE, "");
    /* The SEQUENCE starts at 2 (1 is the empty store's config version). */
    assert_string_equal(meta_str(s1, "resourceVersion"), "2");
    assert_int_equal(meta_int(s1, "generation"), 1);
    assert_int_equal(strlen(meta_str(s1, "uid")), 36);
    assert_string_equal(meta_str(s1, "namespace"), "default");
    const char *created = meta_str(s1, "creationTimestamp");
    assert_int_equal(strlen(created), 20);

    assert_int_equal(sl_store_put(st, b, SL_STORE_CREATE, "", &stored, err, sizeof(err)),
                     SL_STORE_EXISTS);
    assert_non_null(strstr(err, "already exists"));
    /* Same spec: resourceVersion moves, generation does not. */
    json_t *s2 = put_ok(st, b, SL_STORE_REPLACE, "2");
    assert_string_equal(meta_str(s2, "resourceVersion"), "3");
    assert_int_equal(meta_int(s2, "generation"), 1);
    assert_string_equal(meta_str(s2, "uid"), meta_str(s1, "uid"));
    assert_string_equal(meta_str(s2, "creationTimestamp"), created);
    /* Another spec: generation + 1. A stale precondition conflicts. */
    json_t *b2 = backend(NULL, "echo", 9002);
    assert_int_equal(sl_store_put(st, b2, SL_STORE_REPLACE, "2", &stored, err, sizeof(err)),
                     SL_STORE_CONFLICT);
    assert_non_null(strstr(err, "resourceVersion is 3, not 2"));
    json_t *s3 = put_ok(st, b2, SL_STORE_REPLACE, "3");
    assert_int_equal(meta_int(s3, "generation"), 2);
    json_t *missing = backend(NULL, "nope", 1);
    assert_int_equal(sl_store_put(st, missing, SL_STORE_REPLACE, "3", &stored, err, sizeof(err)),
                     SL_STORE_NOT_FOUND);

    json_t *got = NULL;
    assert_int_equal(sl_store_get(st, SL_KIND_BACKEND, NULL, "echo", &got), SL_STORE_OK);
    assert_int_equal(port_of(got), 9002);
    json_decref(got);
    assert_int_equal(sl_store_get(st, SL_KIND_BACKEND, "other", "echo", &got), SL_STORE_NOT_FOUND);

    json_t *deleted = NULL;
    assert_int_equal(
        sl_store_delete(st, SL_KIND_BACKEND, NULL, "echo", "3", &deleted, err, sizeof(err)),
        SL_STORE_CONFLICT);
    assert_int_equal(
        sl_store_delete(st, SL_KIND_BACKEND, NULL, "echo", "4", &deleted, err, sizeof(err)),
        SL_STORE_OK);
    assert_int_equal(port_of(deleted), 9002);
    json_decref(deleted);
    assert_int_equal(sl_store_get(st, SL_KIND_BACKEND, NULL, "echo", &got), SL_STORE_NOT_FOUND);
    assert_int_equal(sl_store_delete(st, SL_KIND_BACKEND, NULL, "echo", "", NULL, err, sizeof(err)),
                     SL_STORE_NOT_FOUND);
    /* The deletion took resourceVersion 5 and left a tombstone. */
    assert_string_equal(pg_sql("SELECT resource_version FROM deletions"), "5");
    assert_int_equal(sl_store_resource_version(st), 5);

    json_decref(s1);
    json_decref(s2);
    json_decref(s3);
    json_decref(b);
    json_decref(b2);
    json_decref(missing);
    sl_store_close(st);
}

static void test_list_put_many_status_counters_load_all(void **state)
{
    (void)state;
    NEED_PG();
    sl_store_t *st = open_pg();
    char err[512];
    put_new(st, backend("b", "z", 1), SL_STORE_CREATE, "");
    json_t *many = json_array(), *stored = NULL;
    json_array_append_new(many, backend("a", "y", 2));
    json_array_append_new(many, backend("b", "a", 3));
    assert_int_equal(sl_store_put_many(st, many, &stored, err, sizeof(err)), SL_STORE_OK);
    json_decref(stored);
    json_decref(many);

    json_t *list = NULL;
    assert_int_equal(sl_store_list(st, SL_KIND_BACKEND, NULL, &list), SL_STORE_OK);
    assert_int_equal(json_array_size(list), 3);
    assert_string_equal(meta_str(json_array_get(list, 0), "name"), "y");
    assert_string_equal(meta_str(json_array_get(list, 1), "name"), "a");
    assert_string_equal(meta_str(json_array_get(list, 2), "name"), "z");
    json_decref(list);
    assert_int_equal(sl_store_list(st, SL_KIND_BACKEND, "b", &list), SL_STORE_OK);
    assert_int_equal(json_array_size(list), 2);
    json_decref(list);

    /* All or nothing: the second document is invalid, the first is not
     * stored either. */
    many = json_array();
    json_array_append_new(many, backend(NULL, "first", 4));
    json_array_append_new(many, json_pack("{s:s, s:s, s:{}, s:{}}", "apiVersion", SL_API_VERSION,
                                          "kind", "Backend", "metadata", "spec"));
    assert_int_equal(sl_store_put_many(st, many, &stored, err, sizeof(err)), SL_STORE_ERROR);
    json_decref(many);
    json_t *got = NULL;
    assert_int_equal(sl_store_get(st, SL_KIND_BACKEND, NULL, "first", &got), SL_STORE_NOT_FOUND);

    /* load_all: every object, and the config resourceVersion of that state
     * (the put_many, rv 4). */
    sl_resource_set_t set;
    sl_resource_set_init(&set);
    assert_int_equal(sl_store_load_all(st, &set, err, sizeof(err)), SL_STORE_OK);
    assert_int_equal(set.count, 3);
    assert_string_equal(set.items[0].source, "backends/a/y");
    sl_resource_set_free(&set);
    uint64_t config_rv = sl_store_loaded_version(st);
    assert_int_equal(config_rv, 4);

    /* The status subresource: resourceVersion moves, generation and the
     * config resourceVersion do not; a spec write keeps it. (The failed
     * put_many took resourceVersion 5 from the SEQUENCE: a gap, never a
     * repeat.) */
    json_t *status = json_pack("{s:s}", "phase", "Ready");
    assert_int_equal(
        sl_store_put_status(st, SL_KIND_BACKEND, "b", "z", status, "", &stored, err, sizeof(err)),
        SL_STORE_OK);
    assert_string_equal(meta_str(stored, "resourceVersion"), "6");
    assert_int_equal(meta_int(stored, "generation"), 1);
    json_decref(stored);
    json_decref(status);
    sl_resource_set_init(&set);
    assert_int_equal(sl_store_load_all(st, &set, err, sizeof(err)), SL_STORE_OK);
    sl_resource_set_free(&set);
    assert_int_equal(sl_store_loaded_version(st), 4);
    put_new(st, backend("b", "z", 9), SL_STORE_REPLACE, "6");
    assert_int_equal(sl_store_get(st, SL_KIND_BACKEND, "b", "z", &got), SL_STORE_OK);
    assert_string_equal(json_string_value(json_object_get(json_object_get(got, "status"), "phase")),
                        "Ready");
    assert_int_equal(meta_int(got, "generation"), 2);
    json_decref(got);
    sl_resource_set_init(&set);
    assert_int_equal(sl_store_load_all(st, &set, err, sizeof(err)), SL_STORE_OK);
    sl_resource_set_free(&set);
    assert_int_equal(sl_store_loaded_version(st), 7);

    /* Counters: 64-bit bit patterns kept, next, max over a pattern. */
    uint64_t v = 0;
    assert_int_equal(sl_store_counter_read(st, "absent", &v, err, sizeof(err)), 0);
    assert_int_equal(v, 0);
    assert_int_equal(
        sl_store_counter_set(st, "fleet/a/routes/hash", UINT64_MAX - 1, err, sizeof(err)), 0);
    assert_int_equal(sl_store_counter_get(st, "fleet/a/routes/hash"), UINT64_MAX - 1);
    assert_int_equal(sl_store_counter_set(st, "fleet/a/routes/version", 7, err, sizeof(err)), 0);
    assert_int_equal(sl_store_counter_set(st, "fleet/b/routes/version", 9, err, sizeof(err)), 0);
    assert_int_equal(sl_store_counter_next(st, "fleet/b/routes/version"), 10);
    uint64_t max = 0;
    assert_int_equal(sl_store_counter_max(st, "fleet/%/version", 100, &max, err, sizeof(err)), 0);
    assert_int_equal(max, 10);
    sl_store_close(st);

    /* Reopened: everything is there, no migration ran again. */
    st = open_pg();
    assert_int_equal(sl_store_counter_get(st, "fleet/b/routes/version"), 10);
    assert_string_equal(pg_sql("SELECT count(*) || '/' || max(version) FROM schema_version"),
                        "1/4");
    sl_store_close(st);
}

typedef struct {
    json_t *events; /* [{type, name, rv}] */
} observed_t;

static void record(void *arg, const char *type, enum sl_kind kind, json_t *obj)
{
    observed_t *o = arg;
    (void)kind;
    json_array_append_new(
        o->events, json_pack("{s:s, s:s, s:s, s:i}", "type", type, "name", meta_str(obj, "name"),
                             "rv", meta_str(obj, "resourceVersion"), "port", port_of(obj)));
}

static void expect_event(observed_t *o, size_t i, const char *type, const char *name,
                         const char *rv)
{
    json_t *e = json_array_get(o->events, i);
    if (!e)
        fail_msg("event %zu missing (have %zu)", i, json_array_size(o->events));
    assert_string_equal(json_string_value(json_object_get(e, "type")), type);
    assert_string_equal(json_string_value(json_object_get(e, "name")), name);
    assert_string_equal(json_string_value(json_object_get(e, "rv")), rv);
}

/* Two handles are two replicas: each one's observer sees every write of
 * both, once, in resourceVersion order. */
static void test_two_replicas_observe_each_other(void **state)
{
    (void)state;
    NEED_PG();
    sl_store_t *a = open_pg(), *b = open_pg();
    observed_t oa = {json_array()}, ob = {json_array()};
    sl_store_set_observer(a, record, &oa);
    sl_store_set_observer(b, record, &ob);
    char err[512];

    put_new(a, backend(NULL, "one", 1), SL_STORE_CREATE, "");   /* 2 */
    put_new(b, backend(NULL, "two", 2), SL_STORE_CREATE, "");   /* 3 */
    put_new(a, backend(NULL, "two", 3), SL_STORE_REPLACE, "3"); /* 4 */
    assert_int_equal(
        sl_store_delete(b, SL_KIND_BACKEND, NULL, "one", "2", NULL, err, sizeof(err)), /* 5 */
        SL_STORE_OK);
    /* What the LISTEN connection or the periodic check would trigger. */
    assert_int_equal(sl_store_resource_version(a), 5);
    assert_int_equal(sl_store_resource_version(b), 5);
    /* a replayed after its own write of "two" at 4: the creation at 3 is
     * seen as the object's current state (ADDED at 4), as a Kubernetes
     * watch that resumes later sees it; b saw the creation itself. */
    assert_int_equal(json_array_size(oa.events), 3);
    expect_event(&oa, 0, "ADDED", "one", "2");
    expect_event(&oa, 1, "ADDED", "two", "4");
    expect_event(&oa, 2, "DELETED", "one", "5");
    assert_int_equal(json_array_size(ob.events), 4);
    expect_event(&ob, 0, "ADDED", "one", "2");
    expect_event(&ob, 1, "ADDED", "two", "3");
    expect_event(&ob, 2, "MODIFIED", "two", "4");
    expect_event(&ob, 3, "DELETED", "one", "5");
    /* The deletion carries the last stored object. */
    assert_int_equal(json_integer_value(json_object_get(json_array_get(oa.events, 2), "port")), 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(ob.events, 3), "port")), 1);
    /* Nothing is told twice. */
    assert_int_equal(sl_store_resource_version(a), 5);
    assert_int_equal(json_array_size(oa.events), 3);
    json_decref(oa.events);
    json_decref(ob.events);
    sl_store_close(a);
    sl_store_close(b);
}

static void count_change(void *arg)
{
    (*(int *)arg)++;
}

static void stop_loop(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    event_base_loopbreak(arg);
}

/* Runs base until o has n events or `ms` passed; the time it took. */
static long run_until(struct event_base *base, observed_t *o, size_t n, long ms)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct event *tick = event_new(base, -1, EV_PERSIST, stop_loop, base);
    struct timeval tv = {0, 20000};
    event_add(tick, &tv);
    long took = 0;
    while (json_array_size(o->events) < n && took < ms) {
        event_base_dispatch(base);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        took = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    }
    event_free(tick);
    return took;
}

/* A replica learns another's write by LISTEN within milliseconds (well
 * before the 5 s check); a LISTEN connection that is killed is replaced and
 * what was missed meanwhile is replayed; a change no NOTIFY announced is
 * found by the periodic check. */
static void test_listen_notify_and_repair(void **state)
{
    (void)state;
    NEED_PG();
    sl_store_t *a = open_pg(), *b = open_pg();
    struct event_base *base = event_base_new();
    observed_t ob = {json_array()};
    int changes = 0;
    sl_store_set_observer(b, record, &ob);
    assert_int_equal(sl_store_attach(b, base, count_change, &changes), 0);

    put_new(a, backend(NULL, "n1", 1), SL_STORE_CREATE, ""); /* 2 */
    long took = run_until(base, &ob, 1, 3000);
    assert_int_equal(json_array_size(ob.events), 1);
    expect_event(&ob, 0, "ADDED", "n1", "2");
    assert_true(took < 1000);
    assert_int_equal(changes, 1);

    /* The LISTEN connection killed by the server: replaced, and the write
     * made meanwhile replayed. */
    pg_sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
           " WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
           " AND datname = current_database()");
    put_new(a, backend(NULL, "n2", 2), SL_STORE_CREATE, ""); /* 3 */
    took = run_until(base, &ob, 2, 4000);
    assert_int_equal(json_array_size(ob.events), 2);
    expect_event(&ob, 1, "ADDED", "n2", "3");
    assert_true(took < 3000);
    assert_string_equal(
        pg_sql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE "
               "'LISTEN%' AND pid <> pg_backend_pid() AND datname = current_database()"),
        "1");

    /* A change that no NOTIFY announced (as if the notification was lost):
     * the 5 s check finds it. */
    pg_sql("UPDATE resources SET resource_version = nextval('sluice_resource_version')"
           " WHERE name = 'n1'");
    took = run_until(base, &ob, 3, 7000);
    assert_int_equal(json_array_size(ob.events), 3);
    json_t *e = json_array_get(ob.events, 2);
    assert_string_equal(json_string_value(json_object_get(e, "type")), "MODIFIED");
    assert_string_equal(json_string_value(json_object_get(e, "name")), "n1");
    assert_true(took > 500);
    assert_int_equal(sl_store_resource_version(b), 4);

    sl_store_close(b);
    sl_store_close(a);
    event_base_free(base);
    json_decref(ob.events);
}

/* Two processes update one object with expect_rv as fast as they can:
 * every successful write is one increment (no lost update), the others are
 * SL_STORE_CONFLICT; resourceVersions are never handed out twice. */
static void test_concurrent_writers(void **state)
{
    (void)state;
    NEED_PG();
    sl_store_t *st = open_pg();
    put_new(st, backend(NULL, "ctr", 1000), SL_STORE_CREATE, "");
    sl_store_close(st);
    enum { ROUNDS = 40 };
    int fds[2][2];
    pid_t pids[2];
    for (int w = 0; w < 2; w++) {
        assert_int_equal(pipe(fds[w]), 0);
        pids[w] = fork();
        assert_true(pids[w] >= 0);
        if (pids[w] == 0) {
            char err[512];
            sl_store_t *s = sl_store_open_postgres(url(), err, sizeof(err));
            int ok = 0, conflicts = 0;
            for (int i = 0; s && i < ROUNDS; i++) {
                json_t *cur = NULL, *stored = NULL;
                if (sl_store_get(s, SL_KIND_BACKEND, NULL, "ctr", &cur) != SL_STORE_OK)
                    _exit(3);
                char rv[24];
                snprintf(rv, sizeof(rv), "%s", meta_str(cur, "resourceVersion"));
                json_t *next = backend(NULL, "ctr", port_of(cur) + 1);
                enum sl_store_result r =
                    sl_store_put(s, next, SL_STORE_REPLACE, rv, &stored, err, sizeof(err));
                if (r == SL_STORE_OK)
                    ok++;
                else if (r == SL_STORE_CONFLICT)
                    conflicts++;
                else
                    _exit(4);
                json_decref(stored);
                json_decref(next);
                json_decref(cur);
            }
            char line[64];
            int n = snprintf(line, sizeof(line), "%d %d\n", ok, conflicts);
            if (write(fds[w][1], line, (size_t)n) != n)
                _exit(5);
            sl_store_close(s);
            _exit(s ? 0 : 2);
        }
        close(fds[w][1]);
    }
    int total_ok = 0;
    for (int w = 0; w < 2; w++) {
        int status = 0;
        assert_int_equal(waitpid(pids[w], &status, 0), pids[w]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        char buf[64] = "";
        assert_true(read(fds[w][0], buf, sizeof(buf) - 1) > 0);
        close(fds[w][0]);
        int ok = 0, conflicts = 0;
        assert_int_equal(sscanf(buf, "%d %d", &ok, &conflicts), 2);
        assert_int_equal(ok + conflicts, ROUNDS);
        total_ok += ok;
    }
    st = open_pg();
    json_t *got = NULL;
    assert_int_equal(sl_store_get(st, SL_KIND_BACKEND, NULL, "ctr", &got), SL_STORE_OK);
    assert_int_equal(port_of(got), 1000 + total_ok);
    /* One resourceVersion per successful write (creation: 2). */
    char want[24];
    snprintf(want, sizeof(want), "%d", 2 + total_ok);
    assert_string_equal(meta_str(got, "resourceVersion"), want);
    json_decref(got);
    sl_store_close(st);
}

/* Three controllers starting at once on an empty database: the advisory
 * lock lets one migrate, the others find the schema current. */
static void test_concurrent_migrations(void **state)
{
    (void)state;
    NEED_PG();
    pid_t pids[3];
    for (int i = 0; i < 3; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            char err[512];
            sl_store_t *s = sl_store_open_postgres(url(), err, sizeof(err));
            if (!s) {
                fprintf(stderr, "open: %s\n", err);
                _exit(1);
            }
            sl_store_close(s);
            _exit(0);
        }
    }
    for (int i = 0; i < 3; i++) {
        int status = 0;
        assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    assert_string_equal(pg_sql("SELECT count(*) || '/' || max(version) FROM schema_version"),
                        "1/4");
}

/* A server that cannot be reached: refused at open, naming the store
 * without the password. */
/* Each replica's heartbeat and runtime rows: the others read them while it
 * is live; rows are replaced as a whole; a replica without a heartbeat for
 * the timeout is removed with its rows by a live one; one whose row was
 * removed is told to write its rows again; leaving removes them at once. */
static void test_replica_rows(void **state)
{
    (void)state;
    NEED_PG();
    sl_store_t *a = open_pg(), *b = open_pg();
    char err[512];
    const uint64_t timeout_ms = 60000;
    assert_int_equal(sl_store_replica_publish(a, "ra",
                                              "[{\"node_id\":\"rt-1\",\"fleet\":\"default\","
                                              "\"connected\":true},{\"node_id\":\"rt-2\","
                                              "\"fleet\":\"edge\",\"connected\":false}]",
                                              NULL, 1, timeout_ms, NULL, err, sizeof(err)),
                     0);
    assert_int_equal(
        sl_store_replica_publish(b, "rb", "[]", NULL, 1, timeout_ms, NULL, err, sizeof(err)), 0);
    json_t *live = json_object(), *rows = json_array();
    assert_int_equal(sl_store_replica_read(b, "rb", timeout_ms, live, rows, err, sizeof(err)), 0);
    assert_int_equal(json_object_size(live), 2);
    assert_int_equal(json_integer_value(json_object_get(live, "ra")), 1);
    assert_int_equal(json_integer_value(json_object_get(live, "rb")), 1);
    assert_int_equal(json_array_size(rows), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(rows, 0), "node_id")),
                        "rt-1");
    assert_string_equal(json_string_value(json_object_get(json_array_get(rows, 0), "replica")),
                        "ra");
    assert_string_equal(pg_sql("SELECT fleet || '/' || connected FROM controller_runtimes WHERE "
                               "node_id = 'rt-2'"),
                        "edge/false");
    /* A heartbeat alone keeps the rows and their generation. */
    assert_int_equal(
        sl_store_replica_publish(a, "ra", NULL, NULL, 0, timeout_ms, NULL, err, sizeof(err)), 0);
    assert_string_equal(pg_sql("SELECT count(*) || '/' || max(runtimes_gen) FROM "
                               "controller_runtimes JOIN controller_replicas USING (replica) "
                               "WHERE replica = 'ra'"),
                        "2/1");
    /* Changes: rt-2 updated, rt-3 added, rt-1 gone; the generation moves. */
    assert_int_equal(sl_store_replica_publish(a, "ra",
                                              "[{\"node_id\":\"rt-2\",\"fleet\":\"edge\","
                                              "\"connected\":true},{\"node_id\":\"rt-3\"}]",
                                              "[\"rt-1\"]", 0, timeout_ms, NULL, err, sizeof(err)),
                     0);
    assert_string_equal(pg_sql("SELECT string_agg(node_id || '/' || connected, ',' ORDER BY "
                               "node_id) || ' ' || max(runtimes_gen) FROM controller_runtimes "
                               "JOIN controller_replicas USING (replica) WHERE replica = 'ra'"),
                        "rt-2/true,rt-3/false 2");
    /* Full: replaces all. */
    assert_int_equal(sl_store_replica_publish(a, "ra", "[{\"node_id\":\"rt-4\"}]", NULL, 1,
                                              timeout_ms, NULL, err, sizeof(err)),
                     0);
    json_array_clear(rows);
    assert_int_equal(sl_store_replica_read(b, "rb", timeout_ms, NULL, rows, err, sizeof(err)), 0);
    assert_int_equal(json_array_size(rows), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(rows, 0), "node_id")),
                        "rt-4");
    /* ra's heartbeat is old: not live for b, and b's next heartbeat
     * removes it with its rows. */
    pg_sql("UPDATE controller_replicas SET heartbeat_at = now() - interval '2 minutes' WHERE "
           "replica = 'ra'");
    json_object_clear(live);
    json_array_clear(rows);
    assert_int_equal(sl_store_replica_read(b, "rb", timeout_ms, live, rows, err, sizeof(err)), 0);
    assert_int_equal(json_object_size(live), 1);
    assert_int_equal(json_array_size(rows), 0);
    json_t *removed = json_object();
    assert_int_equal(
        sl_store_replica_publish(b, "rb", NULL, NULL, 0, timeout_ms, removed, err, sizeof(err)), 0);
    assert_int_equal(json_integer_value(json_object_get(removed, "ra")), 1);
    assert_string_equal(pg_sql("SELECT count(*) FROM controller_runtimes WHERE replica = 'ra'"),
                        "0");
    /* ra comes back with changes only: told to write all its rows. */
    assert_int_equal(sl_store_replica_publish(a, "ra", "[{\"node_id\":\"rt-5\"}]", NULL, 0,
                                              timeout_ms, NULL, err, sizeof(err)),
                     1);
    /* Leaving removes the replica and its rows. */
    assert_int_equal(sl_store_replica_leave(b, "rb"), 0);
    assert_string_equal(pg_sql("SELECT count(*) FROM controller_replicas WHERE replica = 'rb'"),
                        "0");
    /* Not JSON: refused, nothing changed. */
    assert_int_equal(
        sl_store_replica_publish(a, "ra", "not json", NULL, 0, timeout_ms, NULL, err, sizeof(err)),
        -1);
    assert_non_null(strstr(err, "json"));
    assert_string_equal(pg_sql("SELECT count(*) FROM controller_runtimes WHERE replica = 'ra'"),
                        "1");
    json_decref(removed);
    json_decref(live);
    json_decref(rows);
    sl_store_close(a);
    sl_store_close(b);
}

/* Two replicas write (puts, status writes, deletes, put_many) in random
 * order; after each write the set replica A compiles from
 * (sl_store_load_shared: its memory, kept current by replaying every
 * replica's changes) equals a full load by a third handle that never
 * writes, document for document, in the same (byte) order, with the same
 * config resourceVersion; and A read the database only once. */
static void test_load_shared_from_memory_equals_database(void **state)
{
    (void)state;
    NEED_PG();
    sl_store_t *a = open_pg(), *b = open_pg(), *c = open_pg();
    char err[512];
    const char *nss[] = {"default", "a-b", "shop", "Z"};
    const sl_resource_set_t *shared = NULL;
    assert_int_equal(sl_store_load_shared(a, &shared, err, sizeof(err)), SL_STORE_OK);
    uint64_t mem0, db0, mem1, db1;
    sl_store_load_stats(a, &mem0, &db0);
    srand(11);
    for (int step = 0; step < 120; step++) {
        char name[32];
        const char *ns = nss[rand() % 4];
        snprintf(name, sizeof(name), "b%d%s", rand() % 10, rand() % 2 ? "-x" : "");
        int op = rand() % 10;
        sl_store_t *w = rand() % 2 ? a : b;
        json_t *out = NULL;
        if (op < 5) {
            put_new(w, backend(ns, name, 9000 + rand() % 50), SL_STORE_REPLACE, "");
        } else if (op < 7) {
            json_t *st = json_pack("{s:[{s:s}]}", "conditions", "type", "X");
            sl_store_put_status(w, SL_KIND_BACKEND, ns, name, st, "", &out, err, sizeof(err));
            json_decref(st);
        } else if (op < 9) {
            sl_store_delete(w, SL_KIND_BACKEND, ns, name, "", &out, err, sizeof(err));
        } else {
            json_t *arr = json_array();
            json_array_append_new(arr, backend(ns, name, 1));
            json_array_append_new(arr, backend(nss[rand() % 4], "many", 2));
            assert_int_equal(sl_store_put_many(w, arr, &out, err, sizeof(err)), SL_STORE_OK);
            json_decref(arr);
        }
        json_decref(out);
        sl_resource_set_t full;
        sl_resource_set_init(&full);
        assert_int_equal(sl_store_load_shared(a, &shared, err, sizeof(err)), SL_STORE_OK);
        uint64_t va = sl_store_loaded_version(a);
        assert_int_equal(sl_store_load_all(c, &full, err, sizeof(err)), SL_STORE_OK);
        assert_int_equal(shared->count, full.count);
        for (size_t i = 0; i < full.count; i++) {
            assert_string_equal(shared->items[i].source, full.items[i].source);
            assert_true(json_equal(shared->items[i].obj, full.items[i].obj));
            assert_int_equal(shared->items[i].hash, full.items[i].hash);
        }
        assert_int_equal(va, sl_store_loaded_version(c));
        sl_resource_set_free(&full);
    }
    sl_store_load_stats(a, &mem1, &db1);
    assert_int_equal(db1 - db0, 0);
    assert_int_equal(mem1 - mem0, 120);
    sl_store_close(a);
    sl_store_close(b);
    sl_store_close(c);
}

static void test_unreachable_server_named_without_password(void **state)
{
    (void)state;
    NEED_PG();
    char err[1024];
    sl_store_t *st = sl_store_open_postgres(
        "postgres://sluice:s3cr3t-pw@127.0.0.1:1/sluice?connect_timeout=2", err, sizeof(err));
    assert_null(st);
    assert_non_null(strstr(err, "postgres://sluice@127.0.0.1:1/sluice"));
    assert_null(strstr(err, "s3cr3t-pw"));
    st = sl_store_open_postgres("postgres://[bad", err, sizeof(err));
    assert_null(st);
    assert_non_null(strstr(err, "--store"));
}

int main(void)
{
    if (!url())
        fprintf(stderr, "SLUICE_TEST_PG_URL is not set: skipping (tests/integration/"
                        "test_pg_store.py runs this with a PostgreSQL of its own)\n");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_metadata_generation_preconditions, setup),
        cmocka_unit_test_setup(test_list_put_many_status_counters_load_all, setup),
        cmocka_unit_test_setup(test_two_replicas_observe_each_other, setup),
        cmocka_unit_test_setup(test_listen_notify_and_repair, setup),
        cmocka_unit_test_setup(test_concurrent_writers, setup),
        cmocka_unit_test_setup(test_concurrent_migrations, setup),
        cmocka_unit_test_setup(test_replica_rows, setup),
        cmocka_unit_test_setup(test_load_shared_from_memory_equals_database, setup),
        cmocka_unit_test_setup(test_unreachable_server_named_without_password, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
