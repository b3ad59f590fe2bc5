/* The runtime's snapshot cache (--cache-dir): what is written is what is
 * read back, and every kind of damaged or foreign file is refused with its
 * reason instead of being served. */
#include "compiler.h"
#include "snapcache.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

static char dir[64];

static int setup(void **state)
{
    (void)state;
    strcpy(dir, "/tmp/sl-snapcache-XXXXXX");
    assert_non_null(mkdtemp(dir));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    return 0;
}

/* A packed snapshot of `fleet` with one cluster named `name`. */
static uint8_t *packed(const char *fleet, const char *name, size_t *len)
{
    Sluice__V1__Snapshot snap = SLUICE__V1__SNAPSHOT__INIT;
    Sluice__V1__Cluster cl = SLUICE__V1__CLUSTER__INIT;
    Sluice__V1__Cluster *cls[] = {&cl};
    cl.name = (char *)name;
    snap.fleet = (char *)fleet;
    snap.version = 42;
    snap.n_clusters = 1;
    snap.clusters = cls;
    uint8_t *buf = sl_snapshot_pack(&snap, len);
    assert_non_null(buf);
    return buf;
}

static void path_of(char *out, size_t len)
{
    snprintf(out, len, "%s/%s", dir, SL_SNAPCACHE_FILE);
}

static void expect_refused(const char *fleet, const char *why)
{
    uint64_t v = 0, at = 0;
    int absent = 0;
    char err[512];
    Sluice__V1__Snapshot *s = sl_snapcache_load(dir, fleet, &v, &at, &absent, err, sizeof(err));
    assert_null(s);
    assert_int_equal(absent, 0);
    if (!strstr(err, why))
        fail_msg("expected \"%s\" in \"%s\"", why, err);
}

static void test_round_trip_and_mode(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = packed("edge", "pets", &len);
    char err[512];
    assert_int_equal(sl_snapcache_write_file(dir, buf, len, 42, err, sizeof(err)), 0);
    free(buf);
    char path[256];
    path_of(path, sizeof(path));
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600); /* snapshots hold private keys */

    uint64_t v = 0, at = 0;
    int absent = 1;
    Sluice__V1__Snapshot *s = sl_snapcache_load(dir, "edge", &v, &at, &absent, err, sizeof(err));
    if (!s)
        fail_msg("load: %s", err);
    assert_int_equal(v, 42);
    assert_true(at > 1700000000000ull);
    assert_int_equal(s->n_clusters, 1);
    assert_string_equal(s->clusters[0]->name, "pets");
    sl_snapshot_free(s);
    /* No temporary file is left behind. */
    char tmp[300];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    assert_int_not_equal(access(tmp, F_OK), 0);
}

static void test_absent(void **state)
{
    (void)state;
    uint64_t v, at;
    int absent = 0;
    char err[512];
    assert_null(sl_snapcache_load(dir, "edge", &v, &at, &absent, err, sizeof(err)));
    assert_int_equal(absent, 1);
}

static void test_damaged_and_foreign_files(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = packed("edge", "pets", &len);
    char err[512], path[256];
    path_of(path, sizeof(path));
    assert_int_equal(sl_snapcache_write_file(dir, buf, len, 42, err, sizeof(err)), 0);
    free(buf);

    /* Another fleet's snapshot is never served. */
    expect_refused("default", "fleet \"edge\"");

    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    /* A flipped payload byte: the checksum catches it. */
    assert_int_equal(fseek(f, 88 + 3, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, 88 + 3, SEEK_SET), 0);
    fputc(c ^ 0xff, f);
    fflush(f);
    expect_refused("edge", "checksum mismatch");
    /* Another format number (a newer runtime wrote it). */
    assert_int_equal(fseek(f, 16, SEEK_SET), 0);
    fputc(9, f);
    fflush(f);
    expect_refused("edge", "cache format 9");
    assert_int_equal(fseek(f, 16, SEEK_SET), 0);
    fputc(1, f);
    fclose(f);

    /* Cut short. */
    assert_int_equal(truncate(path, 100), 0);
    expect_refused("edge", "truncated or corrupt");
    assert_int_equal(truncate(path, 10), 0);
    expect_refused("edge", "shorter than its header");
    /* Not ours at all. */
    f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < 200; i++)
        fputc('x', f);
    fclose(f);
    expect_refused("edge", "not a sluice snapshot cache");
}

static void test_payload_that_does_not_decode(void **state)
{
    (void)state;
    /* A valid header and checksum over bytes that are not a Snapshot. */
    static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    char err[512];
    assert_int_equal(sl_snapcache_write_file(dir, junk, sizeof(junk), 1, err, sizeof(err)), 0);
    expect_refused("edge", "does not decode");
}

/* The writer thread: the newest queued snapshot is on disk after close. */
static void test_store_writes_the_newest(void **state)
{
    (void)state;
    char err[512];
    sl_snapcache_t *c = sl_snapcache_open(dir, err, sizeof(err));
    if (!c)
        fail_msg("open: %s", err);
    for (int i = 1; i <= 20; i++) {
        char name[16];
        snprintf(name, sizeof(name), "c%d", i);
        size_t len;
        uint8_t *buf = packed("edge", name, &len);
        sl_snapcache_store(c, buf, len, (uint64_t)i);
        free(buf);
    }
    sl_snapcache_close(c);
    uint64_t v = 0, at;
    int absent;
    Sluice__V1__Snapshot *s = sl_snapcache_load(dir, "edge", &v, &at, &absent, err, sizeof(err));
    if (!s)
        fail_msg("load: %s", err);
    assert_int_equal(v, 20);
    assert_string_equal(s->clusters[0]->name, "c20");
    sl_snapshot_free(s);
}

static void test_open_refuses_what_cannot_be_used(void **state)
{
    (void)state;
    char err[512], file[256];
    snprintf(file, sizeof(file), "%s/plain-file", dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    assert_null(sl_snapcache_open(file, err, sizeof(err)));
    assert_non_null(strstr(err, "not a directory"));
    /* A missing directory is created, private. */
    char sub[256];
    snprintf(sub, sizeof(sub), "%s/new", dir);
    sl_snapcache_t *c = sl_snapcache_open(sub, err, sizeof(err));
    if (!c)
        fail_msg("open: %s", err);
    sl_snapcache_close(c);
    struct stat st;
    assert_int_equal(stat(sub, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip_and_mode, setup, teardown),
        cmocka_unit_test_setup_teardown(test_absent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_and_foreign_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_payload_that_does_not_decode, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store_writes_the_newest, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_refuses_what_cannot_be_used, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
