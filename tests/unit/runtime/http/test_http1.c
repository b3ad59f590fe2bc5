/*
 * Unit tests of runtime/http1.c: request and response heads, the smuggling
 * vectors the parser must refuse (one test per attack), limits, and the
 * chunked scanner under arbitrary splits.
 *
 * Every input is copied into a heap buffer of exactly its length before it
 * is parsed, so that a read past the end is an ASan report in the sanitized
 * build rather than a silent pass.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "http1.c"

#define MAX_TEST_HEADERS 64

static const sl_http1_limits_t test_limits = {
    .max_request_line_bytes = 8192,
    .max_header_bytes = 32768,
    .max_header_count = MAX_TEST_HEADERS,
};

static sl_http1_header_t headers[MAX_TEST_HEADERS];

/* Test-only allocation: out of memory ends the run (abort is noreturn, so
 * the compiler also knows the pointer is valid afterwards). */
static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL)
        abort();
    return p;
}
static char *held; /* exact-size copy of the last input; slices point into it */

static const char *hold(const char *s, size_t n)
{
    free(held);
    held = xmalloc(n);
    memcpy(held, s, n);
    return held;
}

static ssize_t parse_req_lim(const char *s, size_t n, const sl_http1_limits_t *lim,
                             sl_http1_request_t *req)
{
    memset(req, 0x5a, sizeof(*req)); /* garbage in: the parser must set every field */
    req->headers = headers;
    req->num_headers = MAX_TEST_HEADERS;
    return sl_http1_parse_request(hold(s, n), n, lim, req);
}

static ssize_t parse_req(const char *s, sl_http1_request_t *req)
{
    return parse_req_lim(s, strlen(s), &test_limits, req);
}

static ssize_t parse_resp_n(const char *s, size_t n, unsigned method, size_t max,
                            sl_http1_response_t *resp)
{
    memset(resp, 0x5a, sizeof(*resp));
    resp->headers = headers;
    resp->num_headers = MAX_TEST_HEADERS;
    return sl_http1_parse_response(hold(s, n), n, method, max, resp);
}

static ssize_t parse_resp(const char *s, unsigned method, sl_http1_response_t *resp)
{
    return parse_resp_n(s, strlen(s), method, 32768, resp);
}

static int str_eq(sl_str_t s, const char *lit)
{
    return s.len == strlen(lit) && memcmp(s.ptr, lit, s.len) == 0;
}

#define assert_str(s, lit)                                                                         \
    do {                                                                                           \
        if (!str_eq((s), (lit)))                                                                   \
            fail_msg("expected \"%s\", got \"%.*s\"", (lit), (int)(s).len,                         \
                     (s).ptr ? (s).ptr : "");                                                      \
    } while (0)

/* Asserts that `s` is refused with `status`; returns nothing. */
static void expect_req_error(const char *s, int status)
{
    sl_http1_request_t req;
    ssize_t rc = parse_req(s, &req);
    if (rc != SL_ERROR)
        fail_msg("accepted (rc %zd) but expected %d: %s", rc, status, s);
    if (req.error_status != status)
        fail_msg("status %d (%s), expected %d: %s", req.error_status, req.error, status, s);
    assert_non_null(req.error);
    assert_true(strlen(req.error) > 0);
    assert_int_equal(req.num_headers, MAX_TEST_HEADERS);
}

static void expect_req_ok(const char *s, sl_http1_request_t *req)
{
    ssize_t rc = parse_req(s, req);
    if (rc != (ssize_t)strlen(s))
        fail_msg("rc %zd (%d %s), expected %zu: %s", rc, req->error_status,
                 req->error ? req->error : "", strlen(s), s);
    assert_int_equal(req->head_len, strlen(s));
    assert_int_equal(req->error_status, 0);
    assert_null(req->error);
}

static int group_teardown(void **state)
{
    (void)state;
    free(held);
    held = NULL;
    return 0;
}

/* ---- valid requests ---------------------------------------------------- */

static void test_parses_simple_get(void **state)
{
    (void)state;
    sl_http1_request_t req;
    expect_req_ok("GET /pets/7?x=1&y=2 HTTP/1.1\r\n"
                  "Host: api.example.com\r\n"
                  "User-Agent: curl/8.0\r\n"
                  "Accept: */*\r\n"
                  "\r\n",
                  &req);
    assert_str(req.method, "GET");
    assert_int_equal(req.method_bit, SL_METHOD_GET);
    assert_str(req.target, "/pets/7?x=1&y=2");
    assert_str(req.path, "/pets/7");
    assert_str(req.query, "x=1&y=2");
    assert_int_equal(req.minor_version, 1);
    assert_int_equal(req.num_headers, 3);
    assert_str(req.headers[0].name, "Host");
    assert_str(req.headers[0].value, "api.example.com");
    assert_str(req.headers[1].name, "User-Agent");
    assert_str(req.headers[1].value, "curl/8.0");
    assert_str(req.headers[2].value, "*/*");
    assert_str(req.host, "api.example.com");
    assert_str(req.authority, "api.example.com"); /* the Host field as sent */
    assert_int_equal(req.body, SL_HTTP1_BODY_NONE);
    assert_int_equal(req.flags, SL_HTTP1_F_KEEP_ALIVE | SL_HTTP1_F_HAS_QUERY);
    /* zero-copy: slices point into the caller's buffer */
    assert_ptr_equal(req.method.ptr, held);
    assert_ptr_equal(req.target.ptr, held + 4);
}

static void test_parses_post_with_content_length(void **state)
{
    (void)state;
    sl_http1_request_t req;
    expect_req_ok("POST /pets HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
                  "content-length: 1024\r\n\r\n",
                  &req);
    assert_int_equal(req.method_bit, SL_METHOD_POST);
    assert_int_equal(req.body, SL_HTTP1_BODY_LENGTH);
    assert_int_equal(req.content_length, 1024);
    assert_str(req.query, "");
}

static void test_parses_zero_content_length(void **state)
{
    (void)state;
    sl_http1_request_t req;
    expect_req_ok("PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", &req);
    assert_int_equal(req.body, SL_HTTP1_BODY_LENGTH);
    assert_int_equal(req.content_length, 0);
    expect_req_ok("PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 0005\r\n\r\n", &req);
    assert_int_equal(req.content_length, 5);
    expect_req_ok("PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 9223372036854775807\r\n\r\n",
                  &req);
    assert_int_equal(req.content_length, INT64_MAX);
}

static void test_parses_chunked_post(void **state)
{
    (void)state;
    sl_http1_request_t req;
    expect_req_ok("POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", &req);
    assert_int_equal(req.body, SL_HTTP1_BODY_CHUNKED);
    /* case-insensitive coding and field name, OWS around list elements */
    expect_req_ok("POST /up HTTP/1.1\r\nHost: a\r\ntransfer-ENCODING:  , CHUNKED \r\n\r\n", &req);
    assert_int_equal(req.body, SL_HTTP1_BODY_CHUNKED);
}

static void test_parses_http10_request(void **state)
{
    (void)state;
    sl_http1_request_t req;
    expect_req_ok("GET /old HTTP/1.0\r\nUser-Agent: x\r\n\r\n", &req);
    assert_int_equal(req.minor_version, 0);
    assert_int_equal(req.host.len, 0);
    assert_int_equal(req.flags & SL_HTTP1_F_KEEP_ALIVE, 0);
    expect_req_ok("GET / HTTP/1.0\r\n\r\n", &req);
    assert_int_equal(req.num_headers, 0);
    assert_int_equal(req.head_len, 18);
}

static void test_http10_keep_alive_needs_header(void **state)
{
    (void)state;
    sl_http1_request_t req;
    expect_req_ok("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", &req);
    assert_true(req.flags & SL_HTTP1_F_KEEP_ALIVE);
    expect_req_ok("GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n", &req);
    assert_false(req.flags & SL_HTTP1_F_KEEP_ALIVE);
    assert_true(req.flags & SL_HTTP1_F_CONN_CLOSE);
}

static void test_http11_connection_close(void **state)
{
    (void)state;
    sl_http1_request_t req;
    expect_req_ok("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", &req);
    assert_false(req.flags & SL_HTTP1_F_KEEP_ALIVE);
    assert_true(req.flags & SL_HTTP1_F_CONN_CLOSE);
    /* token lists, any case, split over several lines */
    expect_req_ok("GET / HTTP/1.1\r\nHost: a\r\nConnection: x-foo, Upgrade\r\n"
                  "Connection: CLOSE\r\nUpgrade: websocket\r\n\r\n",
                  &req);
    assert_int_equal(req.flags, SL_HTTP1_F_CONN_CLOSE | SL_HTTP1_F_UPGRADE);
    /* a header merely containing the word is not the option */
    expect_req_ok("GET / HTTP/1.1\r\nHost: a\r\nConnection: closed\r\n\r\n", &req);
    assert_int_equal(req.flags, SL_HTTP1_F_KEEP_ALIVE);
    expect_req_error("GET / HTTP/1.1\r\nHost: a\r\nConnection: close;x\r\n\r\n", 400);
    expect_req_error("GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive close\r\n\r\n", 400);
}

static void test_expect_continue(void **state)
{
    (void)state;
    sl_http1_request_t req;
    expect_req_ok("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nExpect: 100-Continue\r\n\r\n",
                  &req);
    assert_true(req.flags & SL_HTTP1_F_EXPECT_CONTINUE);
    expect_req_ok("POST / HTTP/1.0\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n", &req);
    assert_false(req.flags & SL_HTTP1_F_EXPECT_CONTINUE);
    expect_req_ok("POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue-ish\r\n\r\n", &req);
    assert_false(req.flags & SL_HTTP1_F_EXPECT_CONTINUE);
}

static void test_host_port_stripped(void **state)
{
    (void)state;
    sl_http1_request_t req;
    expect_req_ok("GET / HTTP/1.1\r\nHost: Api.Example.com:8080\r\n\r\n", &req);
    assert_str(req.host, "Api.Example.com");
    expect_req_ok("GET / HTTP/1.1\r\nHost: [2001:db8::1]:8443\r\n\r\n", &req);
    assert_str(req.host, "[2001:db8::1]");
    expect_req_ok("GET / HTTP/1.1\r\nHost: [::1]\r\n\r\n", &req);
    assert_str(req.host, "[::1]");
    expect_req_ok("GET / HTTP/1.1\r\nHost: 10.0.0.1:\r\n\r\n", &req);
    assert_str(req.host, "10.0.0.1");
    expect_req_ok("GET / HTTP/1.1\r\nhost:\tlocalhost \r\n\r\n", &req);
    assert_str(req.host, "localhost");
}

static void test_rejects_invalid_host(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",         "a b",       "ex/ample", "[::1",    "[::1]x",  "[]",   "host:port",
        "h:123456", "user@host", "a:8080:1", "[::1]:x", "[zz::1]", "a\\b",
    };
    char buf[256];
    for (size_t i = 0; i < SL_ARRAY_LEN(bad); i++) {
        snprintf(buf, sizeof(buf), "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", bad[i]);
        expect_req_error(buf, 400);
    }
}

static void test_query_split(void **state)
{
    (void)state;
    sl_http1_request_t req;
    expect_req_ok("GET /? HTTP/1.1\r\nHost: a\r\n\r\n", &req);
    assert_str(req.path, "/");
    assert_str(req.query, "");
    expect_req_ok("GET /a?b?c=/d HTTP/1.1\r\nHost: a\r\n\r\n", &req);
    assert_str(req.path, "/a");
    assert_str(req.query, "b?c=/d");
    /* characters outside RFC 3986 but harmless to framing pass through */
    expect_req_ok("GET /a/%7Bx%7D/{y}|\"z\" HTTP/1.1\r\nHost: a\r\n\r\n", &req);
    assert_str(req.path, "/a/%7Bx%7D/{y}|\"z\"");
}

static void test_options_asterisk_form(void **state)
{
    (void)state;
    sl_http1_request_t req;
    expect_req_ok("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", &req);
    assert_int_equal(req.method_bit, SL_METHOD_OPTIONS);
    assert_str(req.target, "*");
    assert_str(req.path, "*");
    assert_str(req.query, "");
}

static void test_rejects_asterisk_form_for_non_options(void **state)
{
    (void)state;
    expect_req_error("GET * HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    expect_req_error("OPTIONS *x HTTP/1.1\r\nHost: a\r\n\r\n", 400);
}

/* RFC 9112 3.2.2: absolute-form is accepted; its authority is the host and
 * the Host header is ignored for routing. */
static void test_absolute_form(void **state)
{
    (void)state;
    sl_http1_request_t req;
    const char *s = "GET http://a.example:8080/x/y?q=1 HTTP/1.1\r\nHost: other.example\r\n\r\n";
    assert_int_equal(parse_req(s, &req), (ssize_t)strlen(s));
    assert_true(req.flags & SL_HTTP1_F_ABSOLUTE_FORM);
    assert_true(req.flags & SL_HTTP1_F_HAS_QUERY);
    assert_str(req.host, "a.example");
    assert_str(req.authority, "a.example:8080");
    assert_str(req.path, "/x/y");
    assert_str(req.query, "q=1");
    /* scheme is case-insensitive; no path is "/"; an empty query keeps its flag */
    s = "GET HTTPS://b.example HTTP/1.1\r\nHost: b.example\r\n\r\n";
    assert_int_equal(parse_req(s, &req), (ssize_t)strlen(s));
    assert_str(req.path, "/");
    assert_str(req.host, "b.example");
    assert_false(req.flags & SL_HTTP1_F_HAS_QUERY);
    s = "GET http://[::1]:1?  HTTP/1.1\r\n";
    expect_req_error(s, 400);
    s = "GET http://c.example? HTTP/1.0\r\n\r\n";
    assert_int_equal(parse_req(s, &req), (ssize_t)strlen(s));
    assert_str(req.path, "/");
    assert_true(req.flags & SL_HTTP1_F_HAS_QUERY);
    assert_int_equal(req.query.len, 0);
    s = "GET http://[::1]:81/z HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(parse_req(s, &req), (ssize_t)strlen(s));
    assert_str(req.host, "[::1]");
}

static void test_rejects_bad_absolute_form(void **state)
{
    (void)state;
    sl_http1_request_t req;
    assert_int_equal(
        parse_req("GET http://u@a.example/x HTTP/1.1\r\nHost: a.example\r\n\r\n", &req), SL_ERROR);
    assert_int_equal(req.error_status, 400);
    assert_non_null(strstr(req.error, "userinfo"));
    expect_req_error("GET ftp://a.example/x HTTP/1.1\r\nHost: a.example\r\n\r\n", 400);
    expect_req_error("GET http:///x HTTP/1.1\r\nHost: a.example\r\n\r\n", 400);
    expect_req_error("GET http://a<b/x HTTP/1.1\r\nHost: a.example\r\n\r\n", 400);
    expect_req_error("GET http://a.example:123456/x HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    /* Host is still required in HTTP/1.1 (RFC 9112 3.2) */
    expect_req_error("GET http://a.example/x HTTP/1.1\r\n\r\n", 400);
    expect_req_error("CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n", 400);
    expect_req_error("GET a/b HTTP/1.1\r\nHost: a\r\n\r\n", 400);
}

static void test_query_flag(void **state)
{
    (void)state;
    sl_http1_request_t req;
    const char *s = "GET /p? HTTP/1.1\r\nHost: a\r\n\r\n";
    assert_int_equal(parse_req(s, &req), (ssize_t)strlen(s));
    assert_true(req.flags & SL_HTTP1_F_HAS_QUERY);
    assert_int_equal(req.query.len, 0);
    s = "GET /p HTTP/1.1\r\nHost: a\r\n\r\n";
    assert_int_equal(parse_req(s, &req), (ssize_t)strlen(s));
    assert_false(req.flags & SL_HTTP1_F_HAS_QUERY);
}

static void test_rejects_whitespace_in_target(void **state)
{
    (void)state;
    expect_req_error("GET /a b HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    expect_req_error("GET /a\tb HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    expect_req_error("GET /a\x0b HTTP/1.1\r\nHost: a\r\n\r\n", 400);
}

static void test_rejects_extra_spaces_in_request_line(void **state)
{
    (void)state;
    expect_req_error("GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    expect_req_error("GET /  HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    expect_req_error("GET / HTTP/1.1 \r\nHost: a\r\n\r\n", 400);
    expect_req_error(" GET / HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    expect_req_error("GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n", 400);
}

static void test_rejects_fragment_and_non_ascii_target(void **state)
{
    (void)state;
    expect_req_error("GET /a#frag HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    expect_req_error("GET /caf\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    expect_req_error("GET /a\x7f HTTP/1.1\r\nHost: a\r\n\r\n", 400);
}

static void test_rejects_bad_method(void **state)
{
    (void)state;
    expect_req_error("GE(T / HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    expect_req_error("G\xc3\x89T / HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    expect_req_error("GET\r\nHost: a\r\n\r\n", 400);
    sl_http1_request_t req;
    /* extension methods are tokens too; methods are case-sensitive */
    expect_req_ok("PURGE /x HTTP/1.1\r\nHost: a\r\n\r\n", &req);
    assert_int_equal(req.method_bit, SL_METHOD_OTHER);
    assert_str(req.method, "PURGE");
    expect_req_ok("get /x HTTP/1.1\r\nHost: a\r\n\r\n", &req);
    assert_int_equal(req.method_bit, SL_METHOD_OTHER);
}

static void test_value_ows_trimmed_and_obs_text(void **state)
{
    (void)state;
    sl_http1_request_t req;
    expect_req_ok("GET / HTTP/1.1\r\nHost: a\r\nX-A: \t v a l \t \r\nX-Empty:\r\nX-Sp:   \r\n"
                  "X-Utf8: caf\xc3\xa9\r\n\r\n",
                  &req);
    assert_int_equal(req.num_headers, 5);
    assert_str(req.headers[1].value, "v a l");
    assert_str(req.headers[2].value, "");
    assert_str(req.headers[3].value, "");
    assert_str(req.headers[4].value, "caf\xc3\xa9");
}

/* Bad bytes at every position of short and long values, so that both the
 * 16-byte loop and the scalar tail see them. */
static void test_value_bytes_at_every_position(void **state)
{
    (void)state;
    static const unsigned char bad[] = {0x00, 0x01, 0x0b, 0x1b, 0x1f, 0x7f, '\n', '\r'};
    char value[80], msg[200];
    sl_http1_request_t req;

    for (size_t vlen = 1; vlen < sizeof(value); vlen += 3) {
        for (size_t pos = 0; pos < vlen; pos++) {
            for (size_t b = 0; b < sizeof(bad); b++) {
                memset(value, 'v', vlen);
                value[pos] = (char)bad[b];
                size_t n = (size_t)snprintf(msg, sizeof(msg), "GET / HTTP/1.1\r\nHost: a\r\nX: ");
                memcpy(msg + n, value, vlen);
                n += vlen;
                memcpy(msg + n, "z\r\n\r\n", 5);
                n += 5;
                assert_int_equal(parse_req_lim(msg, n, &test_limits, &req), SL_ERROR);
                assert_int_equal(req.error_status, 400);
            }
            /* HTAB and obs-text are allowed anywhere inside */
            memset(value, 'v', vlen);
            value[pos] = (pos & 1) ? '\t' : (char)0x80;
            size_t n = (size_t)snprintf(msg, sizeof(msg), "GET / HTTP/1.1\r\nHost: a\r\nX: a");
            memcpy(msg + n, value, vlen);
            n += vlen;
            memcpy(msg + n, "z\r\n\r\n", 5);
            n += 5;
            assert_int_equal(parse_req_lim(msg, n, &test_limits, &req), (ssize_t)n);
            assert_int_equal(req.headers[1].value.len, vlen + 2);
        }
    }
}

static void test_target_bytes_at_every_position(void **state)
{
    (void)state;
    static const unsigned char bad[] = {0x00, 0x01, '\t', 0x7f, 0x80, 0xff, '#', '\n'};
    char msg[200];
    sl_http1_request_t req;

    for (size_t tlen = 2; tlen < 70; tlen += 3) {
        for (size_t pos = 1; pos < tlen; pos++) {
            for (size_t b = 0; b < sizeof(bad); b++) {
                size_t n = 4;
                memcpy(msg, "GET ", 4);
                memset(msg + n, 'p', tlen);
                msg[n] = '/';
                msg[n + pos] = (char)bad[b];
                n += tlen;
                memcpy(msg + n, " HTTP/1.1\r\nHost: a\r\n\r\n", 22);
                n += 22;
                assert_int_equal(parse_req_lim(msg, n, &test_limits, &req), SL_ERROR);
                assert_int_equal(req.error_status, 400);
            }
        }
        size_t n = 4;
        memcpy(msg, "GET ", 4);
        memset(msg + n, '~', tlen);
        msg[n] = '/';
        n += tlen;
        memcpy(msg + n, " HTTP/1.1\r\nHost: a\r\n\r\n", 22);
        n += 22;
        assert_int_equal(parse_req_lim(msg, n, &test_limits, &req), (ssize_t)n);
        assert_int_equal(req.target.len, tlen);
    }
}

static void test_leading_empty_lines_skipped(void **state)
{
    (void)state;
    sl_http1_request_t req;
    expect_req_ok("\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", &req);
    assert_str(req.method, "GET");
    expect_req_error("\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    expect_req_error("\r\n\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 400);
}

/* ---- incremental input and pipelining ---------------------------------- */

static void test_pipelined_requests(void **state)
{
    (void)state;
    const char *r1 = "GET /one HTTP/1.1\r\nHost: a\r\n\r\n";
    const char *r2 = "POST /two HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n";
    const char *body = "hello";
    const char *r3 = "GET /three HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    char all[512];
    snprintf(all, sizeof(all), "%s%s%s%s", r1, r2, body, r3);
    size_t total = strlen(all);
    char *buf = xmalloc(total);
    memcpy(buf, all, total);

    sl_http1_request_t req;
    size_t off = 0;
    memset(&req, 0, sizeof(req));
    req.headers = headers;
    req.num_headers = MAX_TEST_HEADERS;
    ssize_t rc = sl_http1_parse_request(buf + off, total - off, &test_limits, &req);
    assert_int_equal(rc, strlen(r1));
    assert_str(req.path, "/one");
    off += (size_t)rc;

    req.num_headers = MAX_TEST_HEADERS;
    rc = sl_http1_parse_request(buf + off, total - off, &test_limits, &req);
    assert_int_equal(rc, strlen(r2));
    assert_str(req.path, "/two");
    assert_int_equal(req.body, SL_HTTP1_BODY_LENGTH);
    off += (size_t)rc + req.content_length;

    req.num_headers = MAX_TEST_HEADERS;
    rc = sl_http1_parse_request(buf + off, total - off, &test_limits, &req);
    assert_int_equal(rc, strlen(r3));
    assert_str(req.path, "/three");
    assert_true(req.flags & SL_HTTP1_F_CONN_CLOSE);
    off += (size_t)rc;
    assert_int_equal(off, total);
    free(buf);
}

static void test_every_split_returns_again(void **state)
{
    (void)state;
    static const char *const reqs[] = {
        ("GET /pets/7?x=1 HTTP/1.1\r\nHost: api.example.com:8080\r\nAccept: */*\r\n"
         "X-Long: 0123456789abcdef0123456789abcdef0123456789abcdef\r\n\r\n"),
        "POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nExpect: "
        "100-continue\r\n\r\n",
        "\r\nGET / HTTP/1.0\r\n\r\n",
        "OPTIONS * HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
    };
    for (size_t r = 0; r < SL_ARRAY_LEN(reqs); r++) {
        size_t n = strlen(reqs[r]);
        sl_http1_request_t req;
        for (size_t i = 0; i < n; i++) {
            ssize_t rc = parse_req_lim(reqs[r], i, &test_limits, &req);
            if (rc != SL_AGAIN)
                fail_msg("request %zu prefix %zu: rc %zd (%s)", r, i, rc,
                         rc == SL_ERROR ? req.error : "");
            assert_int_equal(req.num_headers, MAX_TEST_HEADERS);
        }
        assert_int_equal(parse_req_lim(reqs[r], n, &test_limits, &req), (ssize_t)n);
    }
}

/* Once a prefix is known bad, every longer prefix is bad too, and no prefix
 * of a bad request ever parses. */
static void test_every_split_of_bad_request_errors(void **state)
{
    (void)state;
    static const char *const reqs[] = {
        "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\nX: a\nY: b\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a\r\n X: folded\r\n\r\n",
        "GET / HTTP/2.0\r\nHost: a\r\n\r\n",
    };
    for (size_t r = 0; r < SL_ARRAY_LEN(reqs); r++) {
        size_t n = strlen(reqs[r]);
        int seen_error = 0;
        sl_http1_request_t req;
        for (size_t i = 0; i <= n; i++) {
            ssize_t rc = parse_req_lim(reqs[r], i, &test_limits, &req);
            assert_true(rc == SL_AGAIN || rc == SL_ERROR);
            if (seen_error)
                assert_int_equal(rc, SL_ERROR);
            seen_error |= rc == SL_ERROR;
        }
        assert_true(seen_error);
    }
}

/* ---- smuggling vectors, one test per attack ---------------------------- */

static void test_rejects_cl_and_te(void **state)
{
    (void)state;
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n",
                     400);
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
                     "Content-Length: 0\r\n\r\n",
                     400);
}

static void test_rejects_te_not_last_chunked(void **state)
{
    (void)state;
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 400);
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
                     "Transfer-Encoding: gzip\r\n\r\n",
                     400);
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 400);
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n", 400);
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n\r\n", 400);
}

static void test_rejects_chunked_twice(void **state)
{
    (void)state;
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
                     400);
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n",
                     400);
}

static void test_unknown_transfer_coding_is_501(void **state)
{
    (void)state;
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501);
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n",
                     501);
}

static void test_rejects_malformed_te(void **state)
{
    (void)state;
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked;x=1\r\n\r\n", 400);
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chun ked\r\n\r\n", 400);
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \"chunked\"\r\n\r\n", 400);
    /* a missing comma must not turn two codings into a valid list */
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip chunked\r\n\r\n", 400);
}

static void test_rejects_te_in_http10(void **state)
{
    (void)state;
    expect_req_error("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400);
}

static void test_rejects_obs_fold(void **state)
{
    (void)state;
    sl_http1_request_t req;
    assert_int_equal(parse_req("GET / HTTP/1.1\r\nHost: a\r\nX-A: one\r\n two\r\n\r\n", &req),
                     SL_ERROR);
    assert_non_null(strstr(req.error, "obs-fold"));
    expect_req_error("GET / HTTP/1.1\r\nHost: a\r\nX-A: one\r\n two\r\n\r\n", 400);
    expect_req_error("GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\tchunked\r\n\r\n",
                     400);
    /* whitespace before the first field line (RFC 9112 2.2) */
    expect_req_error("GET / HTTP/1.1\r\n Host: a\r\n\r\n", 400);
}

static void test_rejects_space_before_colon(void **state)
{
    (void)state;
    expect_req_error("GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400);
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n", 400);
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nContent-Length\t: 5\r\n\r\n", 400);
}

static void test_rejects_bare_lf(void **state)
{
    (void)state;
    expect_req_error("GET / HTTP/1.1\nHost: a\r\n\r\n", 400);
    expect_req_error("GET / HTTP/1.1\r\nHost: a\nX: b\r\n\r\n", 400);
    expect_req_error("GET / HTTP/1.1\r\nHost: a\r\n\n", 400);
    expect_req_error("GET / HTTP/1.1\r\nHost: a\r\nX\n: b\r\n\r\n", 400);
}

static void test_rejects_bare_cr(void **state)
{
    (void)state;
    expect_req_error("GET / HTTP/1.1\rHost: a\r\n\r\n", 400);
    expect_req_error("GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n", 400);
    expect_req_error("GET / HTTP/1.1\r\nHost: a\r\n\r\r\n", 400);
    expect_req_error("GET /a\rb HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    expect_req_error("GET / HTTP/1.1\r\nHost: a\r\nX\r: b\r\n\r\n", 400);
}

static void test_rejects_nul(void **state)
{
    (void)state;
#define NUL_REQ(lit)                                                                               \
    {                                                                                              \
        lit, sizeof(lit) - 1                                                                       \
    }
    static const struct {
        const char *s;
        size_t len; /* the requests contain NUL: strlen would stop there */
    } reqs[] = {
        NUL_REQ("G\0T / HTTP/1.1\r\nHost: a\r\n\r\n"),
        NUL_REQ("GET /\0 HTTP/1.1\r\nHost: a\r\n\r\n"),
        NUL_REQ("GET / HTTP/1.1\0\r\nHost: a\r\n\r\n"),
        NUL_REQ("GET / HTTP/1.1\r\nHo\0st: a\r\n\r\n"),
        NUL_REQ("GET / HTTP/1.1\r\nHost: a\0b\r\n\r\n"),
        NUL_REQ("GET / HTTP/1.1\r\nHost: a\r\nX: \0\r\n\r\n"),
        NUL_REQ("GET / HTTP/1.1\r\nHost: a\r\nX: a\0\r\n\r\n"),
    };
#undef NUL_REQ
    for (size_t i = 0; i < SL_ARRAY_LEN(reqs); i++) {
        sl_http1_request_t req;
        assert_non_null(memchr(reqs[i].s, '\0', reqs[i].len));
        assert_int_equal(parse_req_lim(reqs[i].s, reqs[i].len, &test_limits, &req), SL_ERROR);
        assert_int_equal(req.error_status, 400);
    }
}

static void test_rejects_ctl_in_value(void **state)
{
    (void)state;
    expect_req_error("GET / HTTP/1.1\r\nHost: a\r\nX: a\x01\r\n\r\n", 400);
    expect_req_error("GET / HTTP/1.1\r\nHost: a\r\nX: a\x7f\r\n\r\n", 400);
    expect_req_error("GET / HTTP/1.1\r\nHost: a\r\nX: \x1b[31m\r\n\r\n", 400);
}

static void test_rejects_duplicate_cl(void **state)
{
    (void)state;
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
                     400);
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\ncontent-length: 6\r\n\r\n",
                     400);
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n", 400);
    expect_req_error("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5,5\r\n\r\n", 400);
}

static void test_rejects_invalid_cl(void **state)
{
    (void)state;
    static const char *const bad[] = {"", " ", "+5", "-1", "5a", "0x5", "5 5", "5.0", "\xd9\xa5"};
    char buf[128];
    for (size_t i = 0; i < SL_ARRAY_LEN(bad); i++) {
        snprintf(buf, sizeof(buf), "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: %s\r\n\r\n",
                 bad[i]);
        expect_req_error(buf, 400);
    }
}

static void test_rejects_cl_overflow(void **state)
{
    (void)state;
    static const char *const big[] = {"9223372036854775808", "18446744073709551615",
                                      "18446744073709551616", "99999999999999999999999"};
    char buf[128];
    for (size_t i = 0; i < SL_ARRAY_LEN(big); i++) {
        snprintf(buf, sizeof(buf), "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: %s\r\n\r\n",
                 big[i]);
        expect_req_error(buf, 400);
    }
}

static void test_rejects_empty_and_invalid_header_name(void **state)
{
    (void)state;
    expect_req_error("GET / HTTP/1.1\r\nHost: a\r\n: x\r\n\r\n", 400);
    expect_req_error("GET / HTTP/1.1\r\nHost: a\r\nX(Y): x\r\n\r\n", 400);
    expect_req_error("GET / HTTP/1.1\r\nHost: a\r\n\xc3\x84: x\r\n\r\n", 400);
    expect_req_error("GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n", 400);
}

static void test_rejects_missing_host_http11(void **state)
{
    (void)state;
    sl_http1_request_t req;
    assert_int_equal(parse_req("GET / HTTP/1.1\r\nAccept: */*\r\n\r\n", &req), SL_ERROR);
    assert_int_equal(req.error_status, 400);
    assert_non_null(strstr(req.error, "Host"));
}

static void test_rejects_several_host_headers(void **state)
{
    (void)state;
    expect_req_error("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400);
    expect_req_error("GET / HTTP/1.1\r\nHost: a\r\nhOST: a\r\n\r\n", 400);
    expect_req_error("GET / HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n", 400);
}

static void test_rejects_unsupported_version_505(void **state)
{
    (void)state;
    expect_req_error("GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505);
    expect_req_error("GET / HTTP/1.2\r\nHost: a\r\n\r\n", 505);
    expect_req_error("GET / HTTP/0.9\r\nHost: a\r\n\r\n", 505);
    expect_req_error("GET / HTTP/3.1\r\nHost: a\r\n\r\n", 505);
}

static void test_rejects_malformed_version_400(void **state)
{
    (void)state;
    static const char *const bad[] = {"HTTP/1.10", "HTTP/11.1", "http/1.1", "HTTP/1",
                                      "HTTP/1.x",  "HTTPS/1.1", "HTTP 1.1", "HTTP/1.1x"};
    char buf[128];
    for (size_t i = 0; i < SL_ARRAY_LEN(bad); i++) {
        snprintf(buf, sizeof(buf), "GET / %s\r\nHost: a\r\n\r\n", bad[i]);
        expect_req_error(buf, 400);
    }
    expect_req_error("GET /\r\n\r\n", 400); /* HTTP/0.9 simple request */
}

/* ---- limits ------------------------------------------------------------ */

static void test_414_before_crlf(void **state)
{
    (void)state;
    const sl_http1_limits_t lim = {
        .max_request_line_bytes = 64, .max_header_bytes = 4096, .max_header_count = 8};
    char line[256];
    sl_http1_request_t req;

    /* "GET /aaa...a HTTP/1.1" of exactly n bytes, plus CRLF + Host + CRLF */
    for (size_t n = 20; n <= 70; n++) {
        size_t tlen = n - 4 - 9; /* "GET " and " HTTP/1.1" */
        memcpy(line, "GET /", 5);
        memset(line + 5, 'a', tlen - 1);
        memcpy(line + 4 + tlen, " HTTP/1.1\r\nHost: a\r\n\r\n", 22);
        size_t total = n + 13; /* CRLF + "Host: a\r\n" + CRLF */
        ssize_t rc = parse_req_lim(line, total, &lim, &req);
        if (n <= 64) {
            assert_int_equal(rc, (ssize_t)total);
        } else {
            assert_int_equal(rc, SL_ERROR);
            assert_int_equal(req.error_status, 414);
        }
        /* every prefix: 414 exactly once more than 64 line bytes are visible */
        for (size_t i = 0; i < n + 2; i++) {
            rc = parse_req_lim(line, i, &lim, &req);
            if (n > 64 && i > 64) {
                assert_int_equal(rc, SL_ERROR);
                assert_int_equal(req.error_status, 414);
            } else {
                assert_int_equal(rc, SL_AGAIN);
            }
        }
    }

    /* an endless target without CRLF: error long before any CRLF */
    char big[9000];
    memcpy(big, "GET /", 5);
    memset(big + 5, 'x', sizeof(big) - 5);
    assert_int_equal(parse_req_lim(big, sizeof(big), &test_limits, &req), SL_ERROR);
    assert_int_equal(req.error_status, 414);
    assert_int_equal(parse_req_lim(big, 8192, &test_limits, &req), SL_AGAIN);
    assert_int_equal(parse_req_lim(big, 8193, &test_limits, &req), SL_ERROR);
    assert_int_equal(req.error_status, 414);
}

static void test_431_header_bytes(void **state)
{
    (void)state;
    const sl_http1_limits_t lim = {
        .max_request_line_bytes = 64, .max_header_bytes = 100, .max_header_count = 8};
    char buf[512];
    sl_http1_request_t req;

    /* "GET / HTTP/1.1\r\nHost: a\r\nX: vvv...\r\n\r\n" with the head exactly n bytes */
    for (size_t n = 32; n <= 110; n++) {
        size_t vlen = n - 16 - 9 - 5 - 2;
        size_t off = 0;
        memcpy(buf, "GET / HTTP/1.1\r\nHost: a\r\nX: ", 28);
        off = 28;
        memset(buf + off, 'v', vlen);
        off += vlen;
        memcpy(buf + off, "\r\n\r\n", 4);
        off += 4;
        assert_int_equal(off, n);
        ssize_t rc = parse_req_lim(buf, n, &lim, &req);
        if (n <= 100) {
            assert_int_equal(rc, (ssize_t)n);
        } else {
            assert_int_equal(rc, SL_ERROR);
            assert_int_equal(req.error_status, 431);
        }
        /* incomplete and already at the limit: 431 without waiting */
        for (size_t i = 0; i < n; i++) {
            rc = parse_req_lim(buf, i, &lim, &req);
            if (i >= 100) {
                assert_int_equal(rc, SL_ERROR);
                assert_int_equal(req.error_status, 431);
            } else {
                assert_int_equal(rc, SL_AGAIN);
            }
        }
    }
}

static void test_431_header_count(void **state)
{
    (void)state;
    const sl_http1_limits_t lim = {
        .max_request_line_bytes = 64, .max_header_bytes = 4096, .max_header_count = 4};
    sl_http1_request_t req;
    const char *four = "GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n";
    const char *five = "GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n";
    assert_int_equal(parse_req_lim(four, strlen(four), &lim, &req), (ssize_t)strlen(four));
    assert_int_equal(req.num_headers, 4);
    assert_int_equal(parse_req_lim(five, strlen(five), &lim, &req), SL_ERROR);
    assert_int_equal(req.error_status, 431);

    /* the caller's array capacity is a limit too */
    sl_http1_header_t small[2];
    memset(&req, 0, sizeof(req));
    req.headers = small;
    req.num_headers = SL_ARRAY_LEN(small);
    assert_int_equal(sl_http1_parse_request(four, strlen(four), &test_limits, &req), SL_ERROR);
    assert_int_equal(req.error_status, 431);
    assert_int_equal(req.num_headers, 2);
    const char *two = "GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\n\r\n";
    assert_int_equal(sl_http1_parse_request(two, strlen(two), &test_limits, &req),
                     (ssize_t)strlen(two));
    assert_int_equal(req.num_headers, 2);
}

static void test_default_limits_when_null(void **state)
{
    (void)state;
    sl_http1_request_t req;
    const char *ok = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    assert_int_equal(parse_req_lim(ok, strlen(ok), NULL, &req), (ssize_t)strlen(ok));
    char big[8300];
    memcpy(big, "GET /", 5);
    memset(big + 5, 'x', sizeof(big) - 5);
    assert_int_equal(parse_req_lim(big, sizeof(big), NULL, &req), SL_ERROR);
    assert_int_equal(req.error_status, 414);
}

/* ---- responses --------------------------------------------------------- */

static void test_response_content_length(void **state)
{
    (void)state;
    sl_http1_response_t resp;
    const char *s =
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 12\r\n\r\nhello";
    ssize_t rc = parse_resp(s, SL_METHOD_GET, &resp);
    assert_int_equal(rc, strlen(s) - 5);
    assert_int_equal(resp.status, 200);
    assert_str(resp.reason, "OK");
    assert_int_equal(resp.minor_version, 1);
    assert_int_equal(resp.num_headers, 2);
    assert_int_equal(resp.body, SL_HTTP1_BODY_LENGTH);
    assert_int_equal(resp.content_length, 12);
    assert_int_equal(resp.flags, SL_HTTP1_F_KEEP_ALIVE);
    assert_null(resp.error);
}

static void test_response_chunked(void **state)
{
    (void)state;
    sl_http1_response_t resp;
    assert_true(parse_resp("HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n",
                           SL_METHOD_POST, &resp) > 0);
    assert_int_equal(resp.body, SL_HTTP1_BODY_CHUNKED);
    /* other codings before chunked are the upstream's business: forwarded */
    assert_true(parse_resp("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                           SL_METHOD_GET, &resp) > 0);
    assert_int_equal(resp.body, SL_HTTP1_BODY_CHUNKED);
}

static void test_response_te_not_chunked_is_close_delimited(void **state)
{
    (void)state;
    sl_http1_response_t resp;
    assert_true(
        parse_resp("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", SL_METHOD_GET, &resp) > 0);
    assert_int_equal(resp.body, SL_HTTP1_BODY_CLOSE);
    assert_false(resp.flags & SL_HTTP1_F_KEEP_ALIVE);
    assert_int_equal(parse_resp("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
                                SL_METHOD_GET, &resp),
                     SL_ERROR);
}

static void test_response_close_delimited(void **state)
{
    (void)state;
    sl_http1_response_t resp;
    assert_true(parse_resp("HTTP/1.1 200 OK\r\nServer: x\r\n\r\n", SL_METHOD_GET, &resp) > 0);
    assert_int_equal(resp.body, SL_HTTP1_BODY_CLOSE);
    assert_false(resp.flags & SL_HTTP1_F_KEEP_ALIVE);
}

static void test_response_without_body(void **state)
{
    (void)state;
    sl_http1_response_t resp;
    assert_true(
        parse_resp("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", SL_METHOD_HEAD, &resp) > 0);
    assert_int_equal(resp.body, SL_HTTP1_BODY_NONE);
    assert_true(resp.flags & SL_HTTP1_F_KEEP_ALIVE);
    assert_true(parse_resp("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", SL_METHOD_HEAD,
                           &resp) > 0);
    assert_int_equal(resp.body, SL_HTTP1_BODY_NONE);
    static const char *const none[] = {
        "HTTP/1.1 204 No Content\r\n\r\n",
        "HTTP/1.1 304 Not Modified\r\nContent-Length: 50\r\n\r\n",
        "HTTP/1.1 100 Continue\r\n\r\n",
        "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n",
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(none); i++) {
        assert_int_equal(parse_resp(none[i], SL_METHOD_GET, &resp), (ssize_t)strlen(none[i]));
        assert_int_equal(resp.body, SL_HTTP1_BODY_NONE);
    }
    assert_true(resp.flags & SL_HTTP1_F_UPGRADE);
}

static void test_response_rejects_cl_and_te(void **state)
{
    (void)state;
    sl_http1_response_t resp;
    assert_int_equal(parse_resp("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n"
                                "Transfer-Encoding: chunked\r\n\r\n",
                                SL_METHOD_GET, &resp),
                     SL_ERROR);
    assert_non_null(resp.error);
    assert_int_equal(parse_resp("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                                "Content-Length: 5\r\n\r\n",
                                SL_METHOD_HEAD, &resp),
                     SL_ERROR);
}

static void test_response_rejects_bad_content_length(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 5x\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
        "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(bad); i++) {
        sl_http1_response_t resp;
        assert_int_equal(parse_resp(bad[i], SL_METHOD_GET, &resp), SL_ERROR);
        assert_non_null(resp.error);
    }
}

static void test_response_keep_alive_rules(void **state)
{
    (void)state;
    sl_http1_response_t resp;
    assert_true(parse_resp("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n", SL_METHOD_GET, &resp) >
                0);
    assert_int_equal(resp.minor_version, 0);
    assert_false(resp.flags & SL_HTTP1_F_KEEP_ALIVE);
    assert_true(parse_resp("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n",
                           SL_METHOD_GET, &resp) > 0);
    assert_true(resp.flags & SL_HTTP1_F_KEEP_ALIVE);
    assert_true(parse_resp("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n",
                           SL_METHOD_GET, &resp) > 0);
    assert_int_equal(resp.flags, SL_HTTP1_F_CONN_CLOSE);
    /* an odd Connection value from an upstream is tolerated, not fatal */
    assert_true(parse_resp("HTTP/1.1 200 OK\r\nConnection: a b\r\nContent-Length: 1\r\n\r\n",
                           SL_METHOD_GET, &resp) > 0);
}

static void test_response_status_line(void **state)
{
    (void)state;
    sl_http1_response_t resp;
    assert_int_equal(parse_resp("HTTP/1.1 404 \r\n\r\n", SL_METHOD_GET, &resp), 17);
    assert_int_equal(resp.status, 404);
    assert_str(resp.reason, "");
    assert_int_equal(parse_resp("HTTP/1.1 503\r\n\r\n", SL_METHOD_GET, &resp), 16);
    assert_int_equal(resp.status, 503);
    assert_int_equal(resp.reason.len, 0);
    assert_true(parse_resp("HTTP/1.1 599 Odd \t Phrase\xc3\xa9\r\n\r\n", SL_METHOD_GET, &resp) > 0);
    assert_str(resp.reason, "Odd \t Phrase\xc3\xa9");

    static const char *const bad[] = {
        "HTTP/1.1 20 OK\r\n\r\n",      "HTTP/1.1 600 X\r\n\r\n",     "HTTP/1.1 099 X\r\n\r\n",
        "HTTP/2 200 OK\r\n\r\n",       "HTTP/2.0 200 OK\r\n\r\n",    "HTTP/1.1  200 OK\r\n\r\n",
        "HTTP/1.1 200 OK\n\r\n",       "ICY 200 OK\r\n\r\n",         "HTTP/1.1 200OK\r\n\r\n",
        "HTTP/1.1 200 O\x01K\r\n\r\n", "HTTP/1.1 200 OK\rX\r\n\r\n", "http/1.1 200 OK\r\n\r\n",
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(bad); i++) {
        if (parse_resp(bad[i], SL_METHOD_GET, &resp) != SL_ERROR)
            fail_msg("accepted bad status line %zu: %s", i, bad[i]);
        assert_non_null(resp.error);
    }
}

static void test_response_rejects_bad_fields(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "HTTP/1.1 200 OK\r\nX: a\r\n b\r\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nX: a\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length : 0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nX: a\x01\r\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\n",
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(bad); i++) {
        sl_http1_response_t resp;
        assert_int_equal(parse_resp(bad[i], SL_METHOD_GET, &resp), SL_ERROR);
        assert_non_null(resp.error);
    }
}

static void test_response_limits_and_splits(void **state)
{
    (void)state;
    const char *s = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\n\r\n";
    size_t n = strlen(s);
    sl_http1_response_t resp;
    for (size_t i = 0; i < n; i++) {
        ssize_t rc = parse_resp_n(s, i, SL_METHOD_GET, n, &resp);
        if (rc != SL_AGAIN)
            fail_msg("prefix %zu: rc %zd", i, rc);
        assert_int_equal(resp.num_headers, MAX_TEST_HEADERS);
    }
    assert_int_equal(parse_resp_n(s, n, SL_METHOD_GET, n, &resp), (ssize_t)n);
    /* one byte less room than the head needs */
    assert_int_equal(parse_resp_n(s, n, SL_METHOD_GET, n - 1, &resp), SL_ERROR);
    assert_int_equal(parse_resp_n(s, n - 1, SL_METHOD_GET, n - 1, &resp), SL_ERROR);
    assert_int_equal(parse_resp_n(s, n - 2, SL_METHOD_GET, n - 1, &resp), SL_AGAIN);

    sl_http1_header_t one[1];
    memset(&resp, 0, sizeof(resp));
    resp.headers = one;
    resp.num_headers = 1;
    assert_int_equal(sl_http1_parse_response(s, n, SL_METHOD_GET, 4096, &resp), SL_ERROR);
    assert_non_null(resp.error);
}

/* ---- chunked bodies ---------------------------------------------------- */

/* Scans `s` in one call; returns the result, *done and the scanner. */
static ssize_t scan_all(const char *s, size_t n, sl_http1_chunked_t *c, int *done)
{
    sl_http1_chunked_init(c);
    return sl_http1_chunked_scan(c, hold(s, n), n, done);
}

static void expect_chunked_error(const char *s)
{
    sl_http1_chunked_t c;
    int done = 7;
    ssize_t rc = scan_all(s, strlen(s), &c, &done);
    if (rc != SL_ERROR)
        fail_msg("accepted bad chunked body (rc %zd): %s", rc, s);
    assert_non_null(c.error);
    assert_int_equal(done, 0);
    /* errors are sticky */
    assert_int_equal(sl_http1_chunked_scan(&c, "0\r\n\r\n", 5, &done), SL_ERROR);
}

static void expect_chunked_ok(const char *s, uint64_t data_bytes)
{
    sl_http1_chunked_t c;
    int done = 0;
    ssize_t rc = scan_all(s, strlen(s), &c, &done);
    if (rc != (ssize_t)strlen(s) || !done)
        fail_msg("rc %zd done %d (%s): %s", rc, done, c.error ? c.error : "", s);
    assert_int_equal(c.data_bytes, data_bytes);
}

static void test_chunked_simple(void **state)
{
    (void)state;
    expect_chunked_ok("5\r\nhello\r\n0\r\n\r\n", 5);
    expect_chunked_ok("0\r\n\r\n", 0);
    expect_chunked_ok("A\r\n0123456789\r\n1\r\nx\r\n0\r\n\r\n", 11);
    expect_chunked_ok("0005\r\nhello\r\n000\r\n\r\n", 5);
    expect_chunked_ok("1f\r\n0123456789abcdef0123456789abcde\r\n0\r\n\r\n", 31);

    /* done is sticky and consumes nothing more */
    sl_http1_chunked_t c;
    int done = 0;
    assert_int_equal(scan_all("0\r\n\r\n", 5, &c, &done), 5);
    assert_int_equal(done, 1);
    done = 0;
    assert_int_equal(sl_http1_chunked_scan(&c, "GET", 3, &done), 0);
    assert_int_equal(done, 1);
}

static void test_chunked_incomplete(void **state)
{
    (void)state;
    const char *s = "5\r\nhel";
    sl_http1_chunked_t c;
    int done = 1;
    assert_int_equal(scan_all(s, strlen(s), &c, &done), (ssize_t)strlen(s));
    assert_int_equal(done, 0);
    assert_int_equal(c.data_bytes, 3);
    assert_int_equal(sl_http1_chunked_scan(&c, "lo\r\n0\r\n", 7, &done), 7);
    assert_int_equal(done, 0);
    assert_int_equal(sl_http1_chunked_scan(&c, "\r\nNEXT", 6, &done), 2);
    assert_int_equal(done, 1);
    assert_int_equal(c.data_bytes, 5);
    assert_int_equal(sl_http1_chunked_scan(&c, "", 0, &done), 0);
}

static void test_chunked_byte_at_a_time(void **state)
{
    (void)state;
    const char *s = "4;ext=\"q\\\"v\"\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n"
                    "0\r\nExpires: never\r\nX-Sum: 1\r\n\r\n";
    size_t n = strlen(s);
    sl_http1_chunked_t c;
    int done = 0;
    sl_http1_chunked_init(&c);
    for (size_t i = 0; i < n; i++) {
        char *one = xmalloc(1);
        one[0] = s[i];
        ssize_t rc = sl_http1_chunked_scan(&c, one, 1, &done);
        free(one);
        if (rc != 1)
            fail_msg("byte %zu: rc %zd (%s)", i, rc, c.error ? c.error : "");
        assert_int_equal(done, i == n - 1);
    }
    assert_int_equal(c.data_bytes, 23);
}

/* Deterministic xorshift, so that a failure reproduces. */
static uint32_t rng_state = 0x9e3779b9u;
static uint32_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

static void test_chunked_random_splits(void **state)
{
    (void)state;
    size_t cap = 1 << 20;
    char *body = xmalloc(cap);

    for (int round = 0; round < 50; round++) {
        size_t n = 0;
        uint64_t payload = 0;
        int chunks = 1 + (int)(rng() % 20);
        for (int i = 0; i < chunks; i++) {
            size_t sz = 1 + rng() % 3000;
            n += (size_t)snprintf(body + n, cap - n, (rng() & 1) ? "%zx" : "%zX", sz);
            switch (rng() % 4) {
            case 0:
                n += (size_t)snprintf(body + n, cap - n, ";name=value");
                break;
            case 1:
                n += (size_t)snprintf(body + n, cap - n, " ; a = \"x;\\\"y\" ;b");
                break;
            default:
                break;
            }
            n += (size_t)snprintf(body + n, cap - n, "\r\n");
            for (size_t k = 0; k < sz; k++)
                body[n + k] = (char)(rng() & 0xff); /* data may hold CR, LF, NUL... */
            n += sz;
            payload += sz;
            n += (size_t)snprintf(body + n, cap - n, "\r\n");
        }
        n += (size_t)snprintf(body + n, cap - n, "0\r\n");
        if (rng() & 1)
            n += (size_t)snprintf(body + n, cap - n, "Trailer-A: 1\r\nTrailer-B: two words\r\n");
        n += (size_t)snprintf(body + n, cap - n, "\r\n");
        size_t body_len = n;
        n += (size_t)snprintf(body + n, cap - n, "GET /next HTTP/1.1\r\nHost: a\r\n\r\n");

        sl_http1_chunked_t c;
        sl_http1_chunked_init(&c);
        size_t off = 0;
        int done = 0;
        while (!done) {
            assert_true(off < n);
            size_t piece = 1 + rng() % 700;
            if (piece > n - off)
                piece = n - off;
            char *copy = xmalloc(piece);
            memcpy(copy, body + off, piece);
            ssize_t rc = sl_http1_chunked_scan(&c, copy, piece, &done);
            free(copy);
            if (rc < 0)
                fail_msg("round %d offset %zu: %s", round, off, c.error);
            assert_true((size_t)rc <= piece);
            if (!done)
                assert_int_equal(rc, (ssize_t)piece);
            off += (size_t)rc;
        }
        assert_int_equal(off, body_len);
        assert_int_equal(c.data_bytes, payload);
        assert_memory_equal(body + off, "GET /next", 9);
    }
    free(body);
}

/* The size-line bound is per line, not per body: thousands of small chunks
 * are fine. */
static void test_chunked_many_small_chunks(void **state)
{
    (void)state;
    size_t chunks = 5000, cap = chunks * 16 + 16, n = 0;
    char *s = xmalloc(cap);
    for (size_t i = 0; i < chunks; i++)
        n += (size_t)snprintf(s + n, cap - n, "2;i=%zu\r\nxy\r\n", i % 10);
    n += (size_t)snprintf(s + n, cap - n, "0\r\n\r\n");
    sl_http1_chunked_t c;
    int done = 0;
    sl_http1_chunked_init(&c);
    assert_int_equal(sl_http1_chunked_scan(&c, s, n, &done), (ssize_t)n);
    assert_int_equal(done, 1);
    assert_int_equal(c.data_bytes, 2 * chunks);
    free(s);
}

static void test_chunked_trailers(void **state)
{
    (void)state;
    expect_chunked_ok("3\r\nabc\r\n0\r\nX-Checksum: abc123\r\nX-Empty:\r\n\r\n", 3);
    expect_chunked_error("0\r\nX-A: 1\r\n folded\r\n\r\n");
    expect_chunked_error("0\r\nX-A : 1\r\n\r\n");
    expect_chunked_error("0\r\nX-A: \x01\r\n\r\n");
    expect_chunked_error("0\r\nX-A: 1\n\r\n");
    expect_chunked_error("0\r\nX-A\r\n\r\n");
    expect_chunked_error("0\r\n: v\r\n\r\n");
}

/* The trailer lines kept for an HTTP/2 client (exchange.c), in any split;
 * when they do not fit, trailer_len says so. */
static void test_chunked_decode_keeps_trailer_lines(void **state)
{
    (void)state;
    const char *in = "3\r\nabc\r\n0\r\nX-Checksum: abc123\r\nX-Empty:\r\n\r\nNEXT";
    const char *want = "X-Checksum: abc123\r\nX-Empty:\r\n";
    for (size_t split = 1; split <= strlen(in); split++) {
        char buf[128], kept[64];
        memcpy(buf, in, strlen(in));
        sl_http1_chunked_t c;
        sl_http1_chunked_init(&c);
        c.trailer_out = kept;
        c.trailer_cap = sizeof(kept);
        size_t pos = 0, payload_total = 0;
        int done = 0;
        while (!done && pos < strlen(in)) {
            size_t n = strlen(in) - pos < split ? strlen(in) - pos : split, payload = 0;
            ssize_t used = sl_http1_chunked_decode(&c, buf + pos, n, &payload, &done);
            assert_true(used >= 0);
            payload_total += payload;
            pos += (size_t)used;
        }
        assert_true(done);
        assert_int_equal(payload_total, 3);
        assert_int_equal(pos, strlen(in) - 4); /* NEXT is the next message */
        assert_int_equal(c.trailer_len, strlen(want));
        assert_memory_equal(kept, want, strlen(want));
    }
    char buf[64], kept[8];
    memcpy(buf, in, strlen(in));
    sl_http1_chunked_t c;
    sl_http1_chunked_init(&c);
    c.trailer_out = kept;
    c.trailer_cap = sizeof(kept);
    size_t payload = 0;
    int done = 0;
    assert_true(sl_http1_chunked_decode(&c, buf, strlen(in), &payload, &done) > 0);
    assert_true(done);
    assert_true(c.trailer_len > c.trailer_cap);
}

static void test_chunked_extensions(void **state)
{
    (void)state;
    expect_chunked_ok("5;a\r\nhello\r\n0\r\n\r\n", 5);
    expect_chunked_ok("5;a=b\r\nhello\r\n0;last=1\r\n\r\n", 5);
    expect_chunked_ok("5 ; a = b ; c\r\nhello\r\n0\r\n\r\n", 5);
    expect_chunked_ok("5;a=\"x; y\\\"z\\\\\"\r\nhello\r\n0\r\n\r\n", 5);
    expect_chunked_ok("5;a=\"\";b=\"v\" ;c\r\nhello\r\n0\r\n\r\n", 5);

    expect_chunked_error("5;\r\nhello\r\n0\r\n\r\n");
    expect_chunked_error("5;=v\r\nhello\r\n0\r\n\r\n");
    expect_chunked_error("5;a=\r\nhello\r\n0\r\n\r\n");
    expect_chunked_error("5;a=\"x\r\nhello\r\n0\r\n\r\n");
    expect_chunked_error("5;a=\"x\"y\r\nhello\r\n0\r\n\r\n");
    expect_chunked_error("5;a=b c\r\nhello\r\n0\r\n\r\n");
    expect_chunked_error("5;a b\r\nhello\r\n0\r\n\r\n");
    expect_chunked_error("5;a=\"\x01\"\r\nhello\r\n0\r\n\r\n");
    expect_chunked_error("5;a\x01\r\nhello\r\n0\r\n\r\n");
}

static void test_chunked_body_boundary(void **state)
{
    (void)state;
    /* the body ends exactly at the final CRLF; what follows is the next message */
    const char *body = "3\r\nabc\r\n0\r\n\r\n";
    const char *s = "3\r\nabc\r\n0\r\n\r\nPOST /x HTTP/1.1\r\n";
    sl_http1_chunked_t c;
    int done = 0;
    assert_int_equal(scan_all(s, strlen(s), &c, &done), (ssize_t)strlen(body));
    assert_int_equal(done, 1);
    assert_int_equal(c.data_bytes, 3);

    const char *t = "3\r\nabc\r\n0\r\nT: v\r\n\r\n\r\n";
    assert_int_equal(scan_all(t, strlen(t), &c, &done), (ssize_t)strlen(t) - 2);
    assert_int_equal(done, 1);
}

static void test_rejects_invalid_chunk_size(void **state)
{
    (void)state;
    expect_chunked_error("g\r\n\r\n");
    expect_chunked_error("\r\n\r\n");
    expect_chunked_error("-1\r\nx\r\n0\r\n\r\n");
    expect_chunked_error(" 5\r\nhello\r\n0\r\n\r\n");
    expect_chunked_error("+5\r\nhello\r\n0\r\n\r\n");
    expect_chunked_error("0x5\r\nhello\r\n0\r\n\r\n");
    expect_chunked_error("5 \r\nhello\r\n0\r\n\r\n");
    expect_chunked_error("5\t\r\nhello\r\n0\r\n\r\n");
    expect_chunked_error("5,5\r\nhello\r\n0\r\n\r\n");
}

static void test_chunk_size_overflow(void **state)
{
    (void)state;
    expect_chunked_error("10000000000000000\r\n");
    expect_chunked_error("8000000000000000\r\n");
    expect_chunked_error("ffffffffffffffffff\r\n");
    sl_http1_chunked_t c;
    int done;
    const char *max = "7fffffffffffffff\r\nabc";
    assert_int_equal(scan_all(max, strlen(max), &c, &done), (ssize_t)strlen(max));
    assert_int_equal(c.chunk_left, (uint64_t)INT64_MAX - 3);
    assert_int_equal(c.data_bytes, 3);
}

static void test_chunk_size_line_too_long(void **state)
{
    (void)state;
    size_t n = 5000;
    char *s = xmalloc(n + 1);
    memset(s, '0', n);
    s[n] = '\0';
    expect_chunked_error(s); /* endless leading zeros */
    memcpy(s, "5;a=", 4);
    memset(s + 4, 'b', n - 4);
    expect_chunked_error(s); /* endless extension */

    /* just under the bound passes */
    size_t ok_len = CHUNK_LINE_MAX_BYTES - 2;
    memset(s, '0', ok_len);
    memcpy(s + ok_len, "\r\n\r\n", 4);
    sl_http1_chunked_t c;
    int done = 0;
    assert_int_equal(scan_all(s, ok_len + 4, &c, &done), (ssize_t)ok_len + 4);
    assert_int_equal(done, 1);
    free(s);
}

static void test_chunked_trailer_section_too_large(void **state)
{
    (void)state;
    size_t cap = 40 * 1024;
    char *s = xmalloc(cap);
    size_t n = (size_t)snprintf(s, cap, "0\r\n");
    while (n + 64 < cap)
        n += (size_t)snprintf(s + n, cap - n, "X-Trailer: %040d\r\n", 7);
    sl_http1_chunked_t c;
    int done = 0;
    sl_http1_chunked_init(&c);
    assert_int_equal(sl_http1_chunked_scan(&c, s, n, &done), SL_ERROR);
    assert_non_null(c.error);
    free(s);
}

static void test_chunked_missing_crlf_after_data(void **state)
{
    (void)state;
    expect_chunked_error("5\r\nhelloX\r\n0\r\n\r\n");
    expect_chunked_error("5\r\nhello\rX0\r\n\r\n");
    expect_chunked_error("5\r\nhello0\r\n\r\n");
    expect_chunked_error("5\r\nhelloX\n0\r\n\r\n");
    expect_chunked_error("3\r\nhello\r\n0\r\n\r\n"); /* size smaller than the data */
}

static void test_chunked_rejects_bare_lf_and_cr(void **state)
{
    (void)state;
    expect_chunked_error("5\nhello\r\n0\r\n\r\n");
    expect_chunked_error("5\r\nhello\n0\r\n\r\n");
    expect_chunked_error("0\r\n\n");
    expect_chunked_error("5\rhello\r\n0\r\n\r\n");
    expect_chunked_error("0\r\n\rX");
}

/* ---- helpers ----------------------------------------------------------- */

static void test_find_header(void **state)
{
    (void)state;
    sl_http1_request_t req;
    expect_req_ok("GET / HTTP/1.1\r\nHost: a\r\nX-Id: 1\r\nx-id: 2\r\nX-Idx: 3\r\n\r\n", &req);
    const sl_http1_header_t *h = sl_http1_find_header(req.headers, req.num_headers, "X-ID", 4);
    assert_non_null(h);
    assert_str(h->value, "1");
    h = sl_http1_find_header(req.headers, req.num_headers, "x-idx", 5);
    assert_non_null(h);
    assert_str(h->value, "3");
    assert_null(sl_http1_find_header(req.headers, req.num_headers, "X-I", 3));
    assert_null(sl_http1_find_header(req.headers, 0, "Host", 4));
}

static void test_method_bit(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        unsigned bit;
    } cases[] = {
        {"GET", SL_METHOD_GET},         {"HEAD", SL_METHOD_HEAD},
        {"POST", SL_METHOD_POST},       {"PUT", SL_METHOD_PUT},
        {"DELETE", SL_METHOD_DELETE},   {"PATCH", SL_METHOD_PATCH},
        {"OPTIONS", SL_METHOD_OPTIONS}, {"TRACE", SL_METHOD_TRACE},
        {"CONNECT", SL_METHOD_CONNECT}, {"get", SL_METHOD_OTHER},
        {"GETS", SL_METHOD_OTHER},      {"", SL_METHOD_OTHER},
        {"PROPFIND", SL_METHOD_OTHER},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++)
        assert_int_equal(sl_http1_method_bit(cases[i].name, strlen(cases[i].name)), cases[i].bit);
}

static void test_reason(void **state)
{
    (void)state;
    assert_string_equal(sl_http1_reason(200), "OK");
    assert_string_equal(sl_http1_reason(404), "Not Found");
    assert_string_equal(sl_http1_reason(413), "Content Too Large");
    assert_string_equal(sl_http1_reason(429), "Too Many Requests");
    assert_string_equal(sl_http1_reason(431), "");
    assert_string_equal(sl_http1_reason(505), "HTTP Version Not Supported");
    assert_string_equal(sl_http1_reason(308), "Permanent Redirect");
    assert_string_equal(sl_http1_reason(306), "");
    assert_string_equal(sl_http1_reason(-1), "");
    assert_string_equal(sl_http1_reason(600), "");
    assert_string_equal(sl_http1_reason(99999), "");
    /* every RFC 9110 status (306 and 418 are reserved) has its phrase */
    static const int all[] = {100, 101, 200, 201, 202, 203, 204, 205, 206, 300, 301,
                              302, 303, 304, 305, 307, 308, 400, 401, 402, 403, 404,
                              405, 406, 407, 408, 409, 410, 411, 412, 413, 414, 415,
                              416, 417, 421, 422, 426, 500, 501, 502, 503, 504, 505};
    for (size_t i = 0; i < SL_ARRAY_LEN(all); i++)
        assert_true(strlen(sl_http1_reason(all[i])) > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parses_simple_get),
        cmocka_unit_test(test_parses_post_with_content_length),
        cmocka_unit_test(test_parses_zero_content_length),
        cmocka_unit_test(test_parses_chunked_post),
        cmocka_unit_test(test_parses_http10_request),
        cmocka_unit_test(test_http10_keep_alive_needs_header),
        cmocka_unit_test(test_http11_connection_close),
        cmocka_unit_test(test_expect_continue),
        cmocka_unit_test(test_host_port_stripped),
        cmocka_unit_test(test_rejects_invalid_host),
        cmocka_unit_test(test_query_split),
        cmocka_unit_test(test_options_asterisk_form),
        cmocka_unit_test(test_rejects_asterisk_form_for_non_options),
        cmocka_unit_test(test_absolute_form),
        cmocka_unit_test(test_rejects_bad_absolute_form),
        cmocka_unit_test(test_query_flag),
        cmocka_unit_test(test_rejects_whitespace_in_target),
        cmocka_unit_test(test_rejects_extra_spaces_in_request_line),
        cmocka_unit_test(test_rejects_fragment_and_non_ascii_target),
        cmocka_unit_test(test_rejects_bad_method),
        cmocka_unit_test(test_value_ows_trimmed_and_obs_text),
        cmocka_unit_test(test_value_bytes_at_every_position),
        cmocka_unit_test(test_target_bytes_at_every_position),
        cmocka_unit_test(test_leading_empty_lines_skipped),
        cmocka_unit_test(test_pipelined_requests),
        cmocka_unit_test(test_every_split_returns_again),
        cmocka_unit_test(test_every_split_of_bad_request_errors),
        cmocka_unit_test(test_rejects_cl_and_te),
        cmocka_unit_test(test_rejects_te_not_last_chunked),
        cmocka_unit_test(test_rejects_chunked_twice),
        cmocka_unit_test(test_unknown_transfer_coding_is_501),
        cmocka_unit_test(test_rejects_malformed_te),
        cmocka_unit_test(test_rejects_te_in_http10),
        cmocka_unit_test(test_rejects_obs_fold),
        cmocka_unit_test(test_rejects_space_before_colon),
        cmocka_unit_test(test_rejects_bare_lf),
        cmocka_unit_test(test_rejects_bare_cr),
        cmocka_unit_test(test_rejects_nul),
        cmocka_unit_test(test_rejects_ctl_in_value),
        cmocka_unit_test(test_rejects_duplicate_cl),
        cmocka_unit_test(test_rejects_invalid_cl),
        cmocka_unit_test(test_rejects_cl_overflow),
        cmocka_unit_test(test_rejects_empty_and_invalid_header_name),
        cmocka_unit_test(test_rejects_missing_host_http11),
        cmocka_unit_test(test_rejects_several_host_headers),
        cmocka_unit_test(test_rejects_unsupported_version_505),
        cmocka_unit_test(test_rejects_malformed_version_400),
        cmocka_unit_test(test_414_before_crlf),
        cmocka_unit_test(test_431_header_bytes),
        cmocka_unit_test(test_431_header_count),
        cmocka_unit_test(test_default_limits_when_null),
        cmocka_unit_test(test_response_content_length),
        cmocka_unit_test(test_response_chunked),
        cmocka_unit_test(test_response_te_not_chunked_is_close_delimited),
        cmocka_unit_test(test_response_close_delimited),
        cmocka_unit_test(test_response_without_body),
        cmocka_unit_test(test_response_rejects_cl_and_te),
        cmocka_unit_test(test_response_rejects_bad_content_length),
        cmocka_unit_test(test_response_keep_alive_rules),
        cmocka_unit_test(test_response_status_line),
        cmocka_unit_test(test_response_rejects_bad_fields),
        cmocka_unit_test(test_response_limits_and_splits),
        cmocka_unit_test(test_chunked_simple),
        cmocka_unit_test(test_chunked_incomplete),
        cmocka_unit_test(test_chunked_byte_at_a_time),
        cmocka_unit_test(test_chunked_random_splits),
        cmocka_unit_test(test_chunked_many_small_chunks),
        cmocka_unit_test(test_chunked_trailers),
        cmocka_unit_test(test_chunked_decode_keeps_trailer_lines),
        cmocka_unit_test(test_chunked_extensions),
        cmocka_unit_test(test_chunked_body_boundary),
        cmocka_unit_test(test_rejects_invalid_chunk_size),
        cmocka_unit_test(test_chunk_size_overflow),
        cmocka_unit_test(test_chunk_size_line_too_long),
        cmocka_unit_test(test_chunked_trailer_section_too_large),
        cmocka_unit_test(test_chunked_missing_crlf_after_data),
        cmocka_unit_test(test_chunked_rejects_bare_lf_and_cr),
        cmocka_unit_test(test_find_header),
        cmocka_unit_test(test_method_bit),
        cmocka_unit_test(test_reason),
    };
    return cmocka_run_group_tests(tests, NULL, group_teardown);
}
