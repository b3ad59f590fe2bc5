/*
 * Unit tests of runtime/tlog/tlog.c (the record formats, headers, the
 * calendar) and of the pipeline end to end with a real file sink and real
 * worker threads: records complete and in order per worker.
 */
#include "tlog.c"

#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>

static sl_str_t S(const char *s)
{
    return (sl_str_t){s, strlen(s)};
}

static const sl_tlog_origin_t origin = {"default/gw", "default", "rt-1"};

static sl_tlog_view_t sample(void)
{
    sl_tlog_view_t v = {.origin = &origin};
    sl_tlog_record_t *e = &v.rec;
    e->start_unix_us = 971186136123456ULL; /* 2000-10-10T13:55:36.123456Z */
    e->duration_us = 1234;
    e->upstream_us = 1000;
    e->upstream_timed = 1;
    e->fields = SL_TLOG_FIELDS_DEFAULT;
    e->status = 200;
    e->minor_version = 1;
    e->bytes_sent = 2326;
    e->retries = 1;
    e->str[SL_TLOG_S_REQUEST_ID] = S("req-1");
    e->str[SL_TLOG_S_API] = S("default/petstore");
    e->str[SL_TLOG_S_OPERATION] = S("listPets");
    e->str[SL_TLOG_S_CLIENT] = S("127.0.0.1");
    e->str[SL_TLOG_S_METHOD] = S("GET");
    e->str[SL_TLOG_S_HOST] = S("api.example.com");
    e->str[SL_TLOG_S_PATH] = S("/petstore/v1/pets");
    e->str[SL_TLOG_S_QUERY] = S("limit=10");
    e->str[SL_TLOG_S_UPSTREAM] = S("127.0.0.1:9001");
    e->str[SL_TLOG_S_USER_AGENT] = S("curl/8.0");
    e->str[SL_TLOG_S_TRACE_ID] = S("4bf92f3577b34da6a3ce929d0e0e4736");
    e->str[SL_TLOG_S_SPAN_ID] = S("00f067aa0ba902b7");
    e->dest = SL_TLOG_TO_LOG;
    return v;
}

static void test_json_record_exact(void **state)
{
    (void)state;
    static char line[JSON_MAX_BYTES];
    sl_tlog_view_t v = sample();
    size_t n = format_json(line, sizeof(line), &v);
    const char *want =
        "{\"time\":\"2000-10-10T13:55:36.123Z\",\"request_id\":\"req-1\",\"gateway\":"
        "\"default/gw\",\"fleet\":\"default\",\"runtime\":\"rt-1\",\"api\":\"default/petstore\","
        "\"operation\":\"listPets\",\"consumer\":\"\",\"client\":\"127.0.0.1\",\"method\":\"GET\","
        "\"host\":\"api.example.com\",\"path\":\"/petstore/v1/pets\",\"query\":\"limit=10\","
        "\"protocol\":\"HTTP/1.1\",\"status\":200,\"bytes_received\":0,\"bytes_sent\":2326,"
        "\"duration_ms\":1.234,\"upstream_ms\":1.000,\"gateway_ms\":0.234,\"upstream\":"
        "\"127.0.0.1:9001\",\"retries\":1,\"error\":\"\",\"policy\":\"\",\"policy_reason\":\"\","
        "\"cache\":\"\",\"user_agent\":\"curl/8.0\",\"referer\":\"\",\"trace_id\":"
        "\"4bf92f3577b34da6a3ce929d0e0e4736\",\"span_id\":\"00f067aa0ba902b7\"}";
    assert_int_equal(n, strlen(want));
    assert_memory_equal(line, want, n);

    /* Only the record's fields; no upstream time without an upstream. */
    v.rec.fields = (1u << SL_TLOG_F_STATUS) | (1u << SL_TLOG_F_UPSTREAM_MS) |
                   (1u << SL_TLOG_F_GATEWAY_MS) | (1u << SL_TLOG_F_REQUEST_HEADERS);
    v.rec.upstream_timed = 0;
    n = format_json(line, sizeof(line), &v);
    line[n] = '\0';
    assert_string_equal(line, "{\"status\":200,\"gateway_ms\":1.234,\"request_headers\":{}}");
}

static void test_combined_line_exact(void **state)
{
    (void)state;
    sl_tlog_view_t v = sample();
    v.rec.str[SL_TLOG_S_PATH] = S("/apache_pb.gif");
    v.rec.str[SL_TLOG_S_QUERY] = S("");
    v.rec.minor_version = 0;
    v.rec.str[SL_TLOG_S_REFERER] = S("http://www.example.com/start.html");
    v.rec.str[SL_TLOG_S_USER_AGENT] = S("Mozilla/4.08 [en] (Win98; I ;Nav)");
    sl_tlog_buf_t b = {0};
    assert_int_equal(sl_tlog_format_combined(&v, &b), 0);
    const char *want =
        "127.0.0.1 - - [10/Oct/2000:13:55:36 +0000] \"GET /apache_pb.gif HTTP/1.0\" 200 "
        "2326 \"http://www.example.com/start.html\" \"Mozilla/4.08 [en] (Win98; I ;Nav)\"\n";
    assert_int_equal(b.len, strlen(want));
    assert_memory_equal(b.data, want, b.len);
    b.len = 0;
    v.rec.str[SL_TLOG_S_CONSUMER] = S("default/alice");
    v.rec.str[SL_TLOG_S_QUERY] = S("a=1");
    v.rec.str[SL_TLOG_S_USER_AGENT] = S("a\"b\\c\nd\xff");
    assert_int_equal(sl_tlog_format_combined(&v, &b), 0);
    sl_tlog_buf_add(&b, "", 1);
    assert_non_null(strstr(b.data, "127.0.0.1 - default/alice ["));
    assert_non_null(strstr(b.data, "GET /apache_pb.gif?a=1 HTTP/1.0"));
    assert_non_null(strstr(b.data, "\"a\\x22b\\x5cc\\x0ad\\xff\"\n"));
    sl_tlog_buf_free(&b);
}

static void test_calendar_matches_gmtime(void **state)
{
    (void)state;
    uint64_t x = 88172645463325252ULL;
    for (int i = 0; i < 20000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        uint64_t secs = i == 0 ? 951782400 /* 2000-02-29 */ : x % 253402300800ULL;
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

/* Whatever bytes a client sends, the record parses and valid UTF-8 stays. */
static void test_hostile_bytes_give_valid_json(void **state)
{
    (void)state;
    static char line[JSON_MAX_BYTES];
    static const char *const inputs[] = {
        "q\"uo\"te",  "back\\slash\\",          "nl\ncr\rtab\t",    "caf\xc3\xa9 \xf0\x9f\x98\x80",
        "ff\xff\xc3", "\xed\xa0\x80 surrogate", "\xc0\xaf overlong"};
    for (size_t i = 0; i < SL_ARRAY_LEN(inputs); i++) {
        sl_tlog_view_t v = sample();
        v.rec.str[SL_TLOG_S_PATH] = S(inputs[i]);
        v.rec.str[SL_TLOG_S_USER_AGENT] = S(inputs[i]);
        size_t n = format_json(line, sizeof(line), &v);
        json_error_t jerr;
        json_t *j = json_loadb(line, n, 0, &jerr);
        assert_non_null(j);
        if (i < 4)
            assert_string_equal(json_string_value(json_object_get(j, "path")), inputs[i]);
        json_decref(j);
    }
}

static void test_headers_json(void **state)
{
    (void)state;
    char *redact[] = {"x-secret"};
    sl_tlog_policy_t p = sl_tlog_policy_default;
    p.redact = redact;
    p.num_redact = 1;
    p.header_max_bytes = 128;
    sl_str_t names[] = {S("Host"), S("X-Secret"), S("X-Dup"), S("x-dup"), S("X-Q"), S("X-Long")};
    sl_str_t values[] = {S("h"), S("s3"), S("a"), S("b"), S("\"\n"), S("")};
    char big[300];
    memset(big, 'v', sizeof(big));
    values[5] = (sl_str_t){big, sizeof(big)};
    char out[SL_TLOG_MAX_HEADER_MAX_BYTES + 64];
    size_t n = sl_tlog_headers_json(&p, names, values, 6, out, 128 + 64);
    out[n] = '\0';
    assert_string_equal(out, "{\"host\":\"h\",\"x-secret\":\"[redacted]\",\"x-dup\":\"a, b\","
                             "\"x-q\":\"\\\"\\n\",\"_truncated\":true}");
    /* The default policy redacts the built-in credentials. */
    sl_str_t an[] = {S("Authorization")}, av[] = {S("Bearer t")};
    n = sl_tlog_headers_json(&sl_tlog_policy_default, an, av, 1, out, sizeof(out));
    out[n] = '\0';
    assert_string_equal(out, "{\"authorization\":\"[redacted]\"}");
}

/* Two worker threads, a file sink: every record, whole, in order per worker. */
#define PER_WORKER 20000
static void *producer(void *arg)
{
    unsigned w = (unsigned)(uintptr_t)arg;
    char path[64];
    for (int i = 0; i < PER_WORKER; i++) {
        sl_tlog_view_t v = sample();
        v.rec.fields = (1u << SL_TLOG_F_PATH) | (1u << SL_TLOG_F_METHOD);
        snprintf(path, sizeof(path), "/w%u/%d", w, i);
        v.rec.str[SL_TLOG_S_PATH] = S(path);
        sl_tlog_write(w, &v.rec);
        /* Let the logger keep up (this test is about order, not speed): at
         * most 64k records a second per worker, which a logger thread drains
         * even on a busy machine; flat out, a 1 MiB ring fills in ~4,000. */
        if (i % 128 == 0)
            usleep(2000);
    }
    return NULL;
}

static void test_pipeline_to_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/sl-tlog-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/t.jsonl", dir);
    char err[256];
    assert_int_equal(sl_tlog_init(2, err, sizeof(err)), 0);
    sl_tlog_sink_config_t c = {.name = "f", .type = "file", .path = path};
    assert_int_equal(sl_tlog_configure(&c, 1, &origin), 0);
    for (int i = 0; i < 200 && !tl.sinks; i++)
        usleep(10000);
    assert_non_null(tl.sinks);
    pthread_t t[2];
    for (uintptr_t i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, producer, (void *)i);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    sl_tlog_shutdown();
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[256];
    int next[2] = {0, 0}, lines = 0;
    while (fgets(line, sizeof(line), f)) {
        unsigned w;
        int i;
        assert_int_equal(sscanf(line, "{\"method\":\"GET\",\"path\":\"/w%u/%d\"}", &w, &i), 2);
        assert_true(w < 2);
        assert_int_equal(i, next[w]);
        next[w]++;
        lines++;
    }
    fclose(f);
    assert_int_equal(lines + (int)sl_tlog_ring_dropped(), 2 * PER_WORKER);
    assert_int_equal(lines, 2 * PER_WORKER);
    unlink(path);
    rmdir(dir);
}

/* The word-at-a-time escaper (j_str) writes exactly what the byte-by-byte
 * one (put_json_str) does, for strings of every length around the 8-byte
 * word, with each special byte at each position. */
static void test_word_escaper_matches_bytewise(void **state)
{
    (void)state;
    static const unsigned char specials[] = {'"',  '\\', 0x00, 0x1f, 0x20, 0x7f, 0x80, 0xc3,
                                             0xa9, 0xff, '\n', 'a',  0x21, 0x5b, 0x5d};
    char in[40], want[40 * 6 + 8], got[40 * 6 + 64];
    uint64_t rng = 88172645463325252ULL;
    for (size_t len = 0; len <= 33; len++) {
        for (int round = 0; round < 300; round++) {
            for (size_t k = 0; k < len; k++) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                /* Mostly plain letters, some specials. */
                in[k] = (rng % 5) ? (char)('a' + rng % 26)
                                  : (char)specials[(rng >> 8) % sizeof(specials)];
            }
            out_t o = {want, want + sizeof(want)};
            put_json_str(&o, in, len);
            size_t wn = (size_t)(o.p - want);
            size_t gn = (size_t)(j_str(got, in, len) - got);
            assert_int_equal(gn, wn);
            assert_memory_equal(got, want, wn);
            /* in[] has 7 bytes after any string up to 33 bytes */
            gn = (size_t)(j_str_padded(got, in, len) - got);
            assert_int_equal(gn, wn);
            assert_memory_equal(got, want, wn);
        }
    }
}

int main(void)
{
    sl_log_set_level(SL_LOG_ALERT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_record_exact),
        cmocka_unit_test(test_combined_line_exact),
        cmocka_unit_test(test_calendar_matches_gmtime),
        cmocka_unit_test(test_hostile_bytes_give_valid_json),
        cmocka_unit_test(test_word_escaper_matches_bytewise),
        cmocka_unit_test(test_headers_json),
        cmocka_unit_test(test_pipeline_to_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
