/*
 * Unit tests of runtime/accesslog.c with real files, a real FIFO and real
 * threads: lines complete and in order per worker, JSON that parses for
 * hostile bytes, both formats byte for byte, drops counted (and no blocking)
 * while the writer is stalled, reopen after a rename, stdout, errors.
 */
#include "accesslog.c"

#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/stat.h>
#include <cmocka.h>
#include <jansson.h>

static char tmpdir[64];

static int group_setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/sl-accesslog-test-XXXXXX");
    if (!mkdtemp(tmpdir))
        return -1;
    sl_log_set_level(SL_LOG_ALERT); /* keep "reopened" notices out of the output */
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void tmp_path(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", tmpdir, name);
    unlink(out);
}

static char *read_file(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
    buf[len] = '\0';
    fclose(f);
    if (len_out)
        *len_out = (size_t)len;
    return buf;
}

static sl_str_t S(const char *s)
{
    return (sl_str_t){s, strlen(s)};
}

static sl_accesslog_entry_t sample_entry(void)
{
    sl_accesslog_entry_t e = {
        .start_unix_us = 971186136123456ULL, /* 2000-10-10T13:55:36.123456Z */
        .duration_us = 1234,
        .client_addr = S("127.0.0.1"),
        .method = S("GET"),
        .path = S("/petstore/v1/pets?limit=10"),
        .minor_version = 1,
        .status = 200,
        .bytes_received = 0,
        .bytes_sent = 2326,
        .request_id = S("req-1"),
        .api = S("default/petstore"),
        .operation = S("listPets"),
        .upstream_addr = S("127.0.0.1:9001"),
        .user_agent = S("curl/8.0"),
        .referer = S(""),
        .host = S("api.example.com"),
        .error_code = S(""),
    };
    return e;
}

static void test_json_line_exact(void **state)
{
    (void)state;
    char line[LINE_MAX_BYTES];
    sl_accesslog_entry_t e = sample_entry();
    size_t n = format_json(line, sizeof(line), &e);
    const char *want =
        "{\"time\":\"2000-10-10T13:55:36.123Z\",\"client\":\"127.0.0.1\",\"method\":\"GET\","
        "\"path\":\"/petstore/v1/pets?limit=10\",\"protocol\":\"HTTP/1.1\",\"status\":200,"
        "\"bytes_received\":0,\"bytes_sent\":2326,\"duration_ms\":1.234,\"request_id\":\"req-1\","
        "\"api\":\"default/petstore\",\"operation\":\"listPets\",\"upstream\":\"127.0.0.1:9001\","
        "\"user_agent\":\"curl/"
        "8.0\",\"referer\":\"\",\"host\":\"api.example.com\",\"error\":\"\",\"consumer\":\"\","
        "\"policy\":\"\",\"cache\":\"\"}\n";
    assert_int_equal(n, strlen(want));
    assert_memory_equal(line, want, n);

    e.duration_us = 7;
    e.minor_version = 0;
    n = format_json(line, sizeof(line), &e);
    line[n] = '\0';
    assert_non_null(strstr(line, "\"duration_ms\":0.007,"));
    assert_non_null(strstr(line, "\"protocol\":\"HTTP/1.0\""));
    e.minor_version = -1; /* an HTTP/2 request */
    n = format_json(line, sizeof(line), &e);
    line[n] = '\0';
    assert_non_null(strstr(line, "\"protocol\":\"HTTP/2.0\""));
    e.minor_version = 0;
    e.duration_us = 12345678;
    n = format_json(line, sizeof(line), &e);
    line[n] = '\0';
    assert_non_null(strstr(line, "\"duration_ms\":12345.678,"));

    /* An entry with nothing set still yields every key. */
    sl_accesslog_entry_t empty = {0};
    n = format_json(line, sizeof(line), &empty);
    json_t *j = json_loadb(line, n, 0, NULL);
    assert_non_null(j);
    assert_int_equal(json_object_size(j), 20);
    assert_string_equal(json_string_value(json_object_get(j, "time")), "1970-01-01T00:00:00.000Z");
    assert_string_equal(json_string_value(json_object_get(j, "path")), "");
    json_decref(j);
}

/* The Consumer and the policy that answered: JSON keys, and the Consumer
 * as $remote_user of the combined format. */
static void test_consumer_and_policy(void **state)
{
    (void)state;
    char line[LINE_MAX_BYTES];
    sl_accesslog_entry_t e = sample_entry();
    e.consumer = S("default/alice");
    e.policy = S("rate-limit");
    size_t n = format_json(line, sizeof(line), &e);
    line[n] = '\0';
    assert_non_null(strstr(line, "\"consumer\":\"default/alice\",\"policy\":\"rate-limit\","));
    e.cache = S("HIT");
    n = format_json(line, sizeof(line), &e);
    line[n] = '\0';
    assert_non_null(strstr(line, "\"policy\":\"rate-limit\",\"cache\":\"HIT\"}"));
    n = format_combined(line, sizeof(line), &e);
    line[n] = '\0';
    assert_non_null(strstr(line, "127.0.0.1 - default/alice ["));
}

static void test_combined_line_exact(void **state)
{
    (void)state;
    char line[LINE_MAX_BYTES];
    sl_accesslog_entry_t e = sample_entry();
    e.path = S("/apache_pb.gif");
    e.minor_version = 0;
    e.referer = S("http://www.example.com/start.html");
    e.user_agent = S("Mozilla/4.08 [en] (Win98; I ;Nav)");
    size_t n = format_combined(line, sizeof(line), &e);
    const char *want =
        "127.0.0.1 - - [10/Oct/2000:13:55:36 +0000] \"GET /apache_pb.gif HTTP/1.0\" 200 "
        "2326 \"http://www.example.com/start.html\" \"Mozilla/4.08 [en] (Win98; I ;Nav)\"\n";
    assert_int_equal(n, strlen(want));
    assert_memory_equal(line, want, n);

    /* Empty fields print "-"; quotes, backslashes, control and 8-bit bytes
     * are \xXX so a line can never be split or its quoting broken. */
    e.referer = S("");
    e.user_agent = S("a\"b\\c\nd\xff");
    n = format_combined(line, sizeof(line), &e);
    line[n] = '\0';
    assert_non_null(strstr(line, " \"-\" \"a\\x22b\\x5cc\\x0ad\\xff\"\n"));
    assert_int_equal(strchr(line, '\n') - line, (long)n - 1);
}

static void test_calendar_matches_gmtime(void **state)
{
    (void)state;
    static const uint64_t fixed_secs[] = {
        0,
        951782400 /* 2000-02-29 */,
        951868800 /* 2000-03-01 */,
        1709164800 /* 2024-02-29 */,
        4107456000ULL /* 2100-02-28 */,
        4107542400ULL /* 2100-03-01 */,
        253402300799ULL /* 9999-12-31T23:59:59 */,
    };
    uint64_t x = 88172645463325252ULL;
    for (int i = 0; i < 20000; i++) {
        uint64_t secs;
        if (i < (int)SL_ARRAY_LEN(fixed_secs)) {
            secs = fixed_secs[i];
        } else {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            secs = x % 253402300800ULL;
        }
        civil_time_t c;
        civil_from_unix_us(secs * 1000000 + 999999, &c);
        time_t tt = (time_t)secs;
        struct tm tm;
        gmtime_r(&tt, &tm);
        assert_int_equal(c.year, (unsigned)tm.tm_year + 1900);
        assert_int_equal(c.month, (unsigned)tm.tm_mon + 1);
        assert_int_equal(c.day, (unsigned)tm.tm_mday);
        assert_int_equal(c.hour, (unsigned)tm.tm_hour);
        assert_int_equal(c.min, (unsigned)tm.tm_min);
        assert_int_equal(c.sec, (unsigned)tm.tm_sec);
        assert_int_equal(c.msec, 999);
    }
}

/* Everything a client controls, at its worst: every line must still be one
 * line of valid JSON, and valid UTF-8 must survive unchanged. */
static void test_hostile_bytes_give_valid_json(void **state)
{
    (void)state;
    char path[PATH_MAX];
    tmp_path(path, sizeof(path), "hostile.log");
    char err[256];
    assert_int_equal(sl_accesslog_open(path, SL_ACCESSLOG_JSON, 1, err, sizeof(err)), 0);

    static const struct {
        const char *bytes;
        size_t len;
        const char *decoded; /* what a JSON parser must read back (UTF-8) */
        size_t decoded_len;
    } cases[] = {
#define C(in, out) {in, sizeof(in) - 1, out, sizeof(out) - 1}
        C("q\"uo\"te", "q\"uo\"te"),
        C("back\\slash\\", "back\\slash\\"),
        C("nl\ncr\rtab\tbs\bff\f", "nl\ncr\rtab\tbs\bff\f"),
        C("nul\0mid\x01\x1f\x7f", "nul\0mid\x01\x1f\x7f"),
        C("caf\xc3\xa9 \xf0\x9f\x98\x80 \xe2\x82\xac", "caf\xc3\xa9 \xf0\x9f\x98\x80 \xe2\x82\xac"),
        /* invalid UTF-8: each bad byte becomes U+00XX (its Latin-1 reading) */
        C("ff\xff", "ff\xc3\xbf"),
        C("overlong\xc0\xaf", "overlong\xc3\x80\xc2\xaf"),
        C("surrogate\xed\xa0\x80", "surrogate\xc3\xad\xc2\xa0\xc2\x80"),
        C("truncated\xe2\x82", "truncated\xc3\xa2\xc2\x82"),
        C("toobig\xf4\x90\x80\x80", "toobig\xc3\xb4\xc2\x90\xc2\x80\xc2\x80"),
        C("\xc3", "\xc3\x83"),
#undef C
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
        sl_accesslog_entry_t e = sample_entry();
        sl_str_t hostile = {cases[i].bytes, cases[i].len};
        e.path = e.user_agent = e.referer = e.host = e.method = e.request_id = hostile;
        sl_accesslog_write(0, &e);
    }
    sl_accesslog_close();

    size_t len;
    char *text = read_file(path, &len);
    size_t i = 0;
    for (char *line = text; *line; i++) {
        char *eol = strchr(line, '\n');
        assert_non_null(eol);
        assert_true(i < SL_ARRAY_LEN(cases));
        json_error_t jerr;
        json_t *j = json_loadb(line, (size_t)(eol - line), JSON_ALLOW_NUL, &jerr);
        if (!j)
            fail_msg("case %zu: invalid JSON (%s): %.*s", i, jerr.text, (int)(eol - line), line);
        static const char *const keys[] = {"path", "user_agent", "referer",
                                           "host", "method",     "request_id"};
        for (size_t k = 0; k < SL_ARRAY_LEN(keys); k++) {
            json_t *v = json_object_get(j, keys[k]);
            assert_int_equal(json_string_length(v), cases[i].decoded_len);
            assert_memory_equal(json_string_value(v), cases[i].decoded, cases[i].decoded_len);
        }
        json_decref(j);
        line = eol + 1;
    }
    assert_int_equal(i, SL_ARRAY_LEN(cases));
    free(text);
}

/* A 100 KB path is cut, never overflows the line, and stays valid JSON even
 * when the cut falls inside a multi-byte sequence. */
static void test_oversized_fields_truncated(void **state)
{
    (void)state;
    size_t big = 100 * 1024;
    char *huge = malloc(big);
    for (size_t i = 0; i < big; i += 2) {
        huge[i] = '\xc3';
        huge[i + 1] = '\xa9';
    }
    huge[FIELD_MAX_PATH - 1] = '\xc3'; /* split a sequence at the cut */
    char *line = malloc(LINE_MAX_BYTES);
    sl_accesslog_entry_t e = sample_entry();
    e.path = e.user_agent = e.referer = e.host = e.client_addr = e.method = (sl_str_t){huge, big};
    e.request_id = e.api = e.operation = e.upstream_addr = e.error_code = (sl_str_t){huge, big};
    size_t n = format_json(line, LINE_MAX_BYTES, &e);
    assert_true(n < LINE_MAX_BYTES);
    assert_int_equal(line[n - 1], '\n');
    json_t *j = json_loadb(line, n, 0, NULL);
    assert_non_null(j);
    assert_true(json_string_length(json_object_get(j, "path")) <= FIELD_MAX_PATH + 8);
    json_decref(j);

    /* Worst case for expansion: every byte becomes \u00XX. */
    memset(huge, '\x01', big);
    n = format_json(line, LINE_MAX_BYTES, &e);
    assert_true(n < LINE_MAX_BYTES);
    j = json_loadb(line, n, 0, NULL);
    assert_non_null(j);
    json_decref(j);
    n = format_combined(line, LINE_MAX_BYTES, &e);
    assert_true(n < LINE_MAX_BYTES);
    assert_int_equal(line[n - 1], '\n');
    free(line);
    free(huge);
}

typedef struct {
    unsigned worker;
    int lines;
} producer_arg_t;

static void *producer(void *p)
{
    producer_arg_t *a = p;
    char rid[32];
    for (int i = 0; i < a->lines; i++) {
        sl_accesslog_entry_t e = sample_entry();
        int n = snprintf(rid, sizeof(rid), "w%u-%d", a->worker, i);
        e.request_id = (sl_str_t){rid, (size_t)n};
        /* This test is about order, not drops: wait for the writer to catch
         * up instead of relying on timing (test_stalled_... covers drops). */
        ring_t *r = &alog.rings[a->worker];
        while (atomic_load(&r->head) - atomic_load(&r->tail) > RING_BYTES / 2)
            usleep(200);
        sl_accesslog_write(a->worker, &e);
    }
    return NULL;
}

static void test_lines_complete_and_ordered_per_worker(void **state)
{
    (void)state;
    enum { WORKERS = 4, LINES = 20000 };
    char path[PATH_MAX], err[256];
    tmp_path(path, sizeof(path), "order.log");
    uint64_t dropped_before = sl_accesslog_dropped();
    assert_int_equal(sl_accesslog_open(path, SL_ACCESSLOG_JSON, WORKERS, err, sizeof(err)), 0);
    assert_true(sl_accesslog_enabled());
    pthread_t th[WORKERS];
    producer_arg_t args[WORKERS];
    for (unsigned w = 0; w < WORKERS; w++) {
        args[w] = (producer_arg_t){w, LINES};
        assert_int_equal(pthread_create(&th[w], NULL, producer, &args[w]), 0);
    }
    for (unsigned w = 0; w < WORKERS; w++)
        pthread_join(th[w], NULL);
    sl_accesslog_close();
    assert_false(sl_accesslog_enabled());
    uint64_t dropped = sl_accesslog_dropped() - dropped_before;

    char *text = read_file(path, NULL);
    int next[WORKERS] = {0};
    uint64_t total = 0;
    for (char *line = text; *line;) {
        char *eol = strchr(line, '\n');
        assert_non_null(eol);
        json_t *j = json_loadb(line, (size_t)(eol - line), 0, NULL);
        assert_non_null(j);
        unsigned w;
        int seq;
        assert_int_equal(
            sscanf(json_string_value(json_object_get(j, "request_id")), "w%u-%d", &w, &seq), 2);
        assert_true(w < WORKERS);
        assert_true(seq >= next[w]); /* in order; a gap only where lines were dropped */
        next[w] = seq + 1;
        json_decref(j);
        total++;
        line = eol + 1;
    }
    free(text);
    assert_int_equal(total + dropped, (uint64_t)WORKERS * LINES);
    /* The producers waited for room, so nothing may have been lost. */
    assert_int_equal(dropped, 0);
}

typedef struct {
    int fd;
    uint64_t lines;
} fifo_reader_t;

static void *drain_fifo(void *p)
{
    fifo_reader_t *r = p;
    char buf[65536];
    for (;;) {
        struct pollfd pfd = {.fd = r->fd, .events = POLLIN};
        poll(&pfd, 1, 1000);
        ssize_t n = read(r->fd, buf, sizeof(buf));
        if (n == 0)
            return NULL;
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                continue;
            return NULL;
        }
        for (ssize_t i = 0; i < n; i++)
            r->lines += buf[i] == '\n';
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A FIFO nobody reads: the writer thread blocks in write(2), the ring fills,
 * and the worker keeps going, dropping and counting instead of waiting. */
static void test_stalled_writer_drops_and_never_blocks(void **state)
{
    (void)state;
    enum { LINES = 100000 };
    char path[PATH_MAX], err[256];
    tmp_path(path, sizeof(path), "stalled.fifo");
    assert_int_equal(mkfifo(path, 0600), 0);
    fifo_reader_t reader = {.fd = open(path, O_RDONLY | O_NONBLOCK)};
    assert_true(reader.fd >= 0);
    uint64_t dropped_before = sl_accesslog_dropped();
    assert_int_equal(sl_accesslog_open(path, SL_ACCESSLOG_JSON, 2, err, sizeof(err)), 0);

    double t0 = now_s();
    sl_accesslog_entry_t e = sample_entry();
    for (int i = 0; i < LINES; i++)
        sl_accesslog_write(1, &e);
    double elapsed = now_s() - t0;
    uint64_t dropped = sl_accesslog_dropped() - dropped_before;
    /* ~40 MB of lines against a 64 KiB pipe and a 1 MiB ring. */
    assert_true(dropped > LINES / 2);
    assert_true(elapsed < 5.0); /* formatting only: no waiting on the reader */

    /* Out-of-range worker index: dropped and counted, not a crash. */
    sl_accesslog_write(2, &e);
    sl_accesslog_write(UINT_MAX, &e);
    assert_int_equal(sl_accesslog_dropped() - dropped_before, dropped + 2);

    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, drain_fifo, &reader), 0);
    sl_accesslog_close(); /* flushes what the ring still holds, then EOF */
    pthread_join(th, NULL);
    close(reader.fd);
    assert_int_equal(reader.lines + dropped, LINES);
    /* The counter keeps its value after close (it is a Prometheus counter). */
    assert_int_equal(sl_accesslog_dropped() - dropped_before, dropped + 2);
}

/* The reader of the FIFO went away: writes fail with EPIPE, the lines are
 * counted as dropped, and SIGPIPE (not ignored in this test process) does
 * not kill us because the writer thread blocks it. */
static void test_broken_pipe_counts_lost_lines(void **state)
{
    (void)state;
    enum { LINES = 50 };
    char path[PATH_MAX], err[256];
    tmp_path(path, sizeof(path), "broken.fifo");
    assert_int_equal(mkfifo(path, 0600), 0);
    int reader = open(path, O_RDONLY | O_NONBLOCK);
    assert_true(reader >= 0);
    assert_int_equal(sl_accesslog_open(path, SL_ACCESSLOG_JSON, 1, err, sizeof(err)), 0);
    close(reader);
    uint64_t dropped_before = sl_accesslog_dropped();
    sl_accesslog_entry_t e = sample_entry();
    for (int i = 0; i < LINES; i++)
        sl_accesslog_write(0, &e);
    sl_accesslog_close();
    assert_int_equal(sl_accesslog_dropped() - dropped_before, LINES);
}

static void test_reopen_after_rename(void **state)
{
    (void)state;
    char path[PATH_MAX], rotated[PATH_MAX], err[256];
    tmp_path(path, sizeof(path), "rotate.log");
    tmp_path(rotated, sizeof(rotated), "rotate.log.1");
    assert_int_equal(sl_accesslog_open(path, SL_ACCESSLOG_JSON, 1, err, sizeof(err)), 0);
    sl_accesslog_entry_t e = sample_entry();
    e.request_id = S("before");
    sl_accesslog_write(0, &e);
    assert_int_equal(rename(path, rotated), 0);
    sl_accesslog_reopen();
    struct stat st;
    assert_int_equal(stat(path, &st), 0); /* reopen returned after creating it */
    assert_int_equal(st.st_mode & 0777, 0640);
    e.request_id = S("after");
    sl_accesslog_write(0, &e);
    sl_accesslog_close();

    char *old = read_file(rotated, NULL);
    char *cur = read_file(path, NULL);
    assert_non_null(strstr(old, "\"request_id\":\"before\""));
    assert_null(strstr(old, "\"request_id\":\"after\""));
    assert_non_null(strstr(cur, "\"request_id\":\"after\""));
    assert_null(strstr(cur, "\"request_id\":\"before\""));
    free(old);
    free(cur);
}

/* Reopen failing (directory gone) keeps logging to the open file. */
static void test_failed_reopen_keeps_old_file(void **state)
{
    (void)state;
    char dir[256], path[PATH_MAX], err[256];
    tmp_path(dir, sizeof(dir), "sub");
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(path, sizeof(path), "%s/a.log", dir);
    assert_int_equal(sl_accesslog_open(path, SL_ACCESSLOG_COMBINED, 1, err, sizeof(err)), 0);
    char moved[PATH_MAX];
    tmp_path(moved, sizeof(moved), "a.log.moved");
    assert_int_equal(rename(path, moved), 0);
    assert_int_equal(rmdir(dir), 0);
    sl_accesslog_reopen();
    sl_accesslog_entry_t e = sample_entry();
    sl_accesslog_write(0, &e);
    sl_accesslog_close();
    char *text = read_file(moved, NULL);
    assert_non_null(
        strstr(text, "\"GET /petstore/v1/pets?limit=10 HTTP/1.1\" 200 2326 \"-\" \"curl/8.0\"\n"));
    free(text);
}

static void test_stdout_target(void **state)
{
    (void)state;
    char path[PATH_MAX], err[256];
    tmp_path(path, sizeof(path), "stdout.log");
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, STDOUT_FILENO);
    close(fd);
    int rc = sl_accesslog_open("stdout", SL_ACCESSLOG_JSON, 1, err, sizeof(err));
    sl_accesslog_entry_t e = sample_entry();
    sl_accesslog_write(0, &e);
    sl_accesslog_reopen(); /* no-op for stdout */
    sl_accesslog_close();
    dup2(saved, STDOUT_FILENO);
    close(saved);
    assert_int_equal(rc, 0);
    /* stdout itself stays open for the rest of the process. */
    assert_true(fcntl(STDOUT_FILENO, F_GETFD) >= 0);
    char *text = read_file(path, NULL);
    assert_non_null(strstr(text, "\"request_id\":\"req-1\""));
    free(text);
}

static void test_off_and_open_errors(void **state)
{
    (void)state;
    char err[256];
    assert_int_equal(sl_accesslog_open("off", SL_ACCESSLOG_JSON, 1, err, sizeof(err)), 0);
    assert_false(sl_accesslog_enabled());
    sl_accesslog_entry_t e = sample_entry();
    sl_accesslog_write(0, &e); /* no-op */
    sl_accesslog_reopen();
    sl_accesslog_close();

    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/no/such/dir/a.log", tmpdir);
    assert_int_equal(sl_accesslog_open(path, SL_ACCESSLOG_JSON, 1, err, sizeof(err)), -1);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "No such file or directory"));
    assert_false(sl_accesslog_enabled());

    tmp_path(path, sizeof(path), "errs.log");
    assert_int_equal(sl_accesslog_open(path, SL_ACCESSLOG_JSON, 0, err, sizeof(err)), -1);
    assert_int_equal(
        sl_accesslog_open(path, SL_ACCESSLOG_JSON, SL_MAX_WORKERS + 1, err, sizeof(err)), -1);
    assert_int_equal(sl_accesslog_open(path, (enum sl_accesslog_format)9, 1, err, sizeof(err)), -1);
    assert_int_equal(sl_accesslog_open("", SL_ACCESSLOG_JSON, 1, err, sizeof(err)), -1);
    assert_int_equal(sl_accesslog_open(path, SL_ACCESSLOG_JSON, 1, err, sizeof(err)), 0);
    assert_int_equal(sl_accesslog_open(path, SL_ACCESSLOG_JSON, 1, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "already open"));
    sl_accesslog_close();
    sl_accesslog_close(); /* twice is harmless */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_line_exact),
        cmocka_unit_test(test_consumer_and_policy),
        cmocka_unit_test(test_combined_line_exact),
        cmocka_unit_test(test_calendar_matches_gmtime),
        cmocka_unit_test(test_hostile_bytes_give_valid_json),
        cmocka_unit_test(test_oversized_fields_truncated),
        cmocka_unit_test(test_lines_complete_and_ordered_per_worker),
        cmocka_unit_test(test_stalled_writer_drops_and_never_blocks),
        cmocka_unit_test(test_broken_pipe_counts_lost_lines),
        cmocka_unit_test(test_reopen_after_rename),
        cmocka_unit_test(test_failed_reopen_keeps_old_file),
        cmocka_unit_test(test_stdout_target),
        cmocka_unit_test(test_off_and_open_errors),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
