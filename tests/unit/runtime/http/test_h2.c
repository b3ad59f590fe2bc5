/*
 * Unit tests of runtime/http/h2.c, the HTTP/2 server codec, driven in memory:
 * a real nghttp2 client session (nghttp2_session_client_new, mem_send /
 * mem_recv) talks to an sl_h2_conn_t, or, for what a well-behaved client
 * library will not send (malformed requests, floods), raw frames with header
 * blocks from nghttp2's own HPACK encoder, and a small frame reader over the
 * codec's output. Every defence of h2.h has a test that makes the attack and
 * a test (or a part of one) that stays just under the limit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <nghttp2/nghttp2.h>

#include "h2.h"

#define MAXS 512 /* stream slots in the recorders, by (id - 1) / 2 */

/* ---- what the server side (the glue) saw -------------------------------- */

typedef struct {
    int requests;
    /* last request head, copied */
    char method[32], host[256], authority[256], path[512], query[512], target[512];
    char scheme[16], protocol[32];
    int has_query, version, has_length;
    uint64_t content_length;
    unsigned flags;
    size_t num_headers;
    char hname[128][64];
    char hvalue[128][4096];
    int32_t last_id;
    /* per stream */
    size_t data[MAXS];
    int ended[MAXS];
    int closed[MAXS];
    uint32_t close_code[MAXS];
    int writable[MAXS];
    int trailers[MAXS];
    char trailer_value[64];
    int rejects, reject_status;
    /* behaviour */
    int respond_on_request; /* submit 200 + small body at once */
    uint64_t now;
} srv_t;

static int slot(int32_t id)
{
    int i = (id - 1) / 2;
    return i >= 0 && i < MAXS ? i : MAXS - 1;
}

static void cp(char *dst, size_t cap, sl_str_t s)
{
    size_t n = s.len < cap - 1 ? s.len : cap - 1;
    if (n)
        memcpy(dst, s.ptr, n);
    dst[n] = 0;
}

static sl_h2_conn_t *g_conn; /* for callbacks that answer */

static void srv_on_request(void *user, int32_t id, const sl_req_head_t *h,
                           const sl_h2_req_info_t *info)
{
    srv_t *s = user;
    s->requests++;
    s->last_id = id;
    cp(s->method, sizeof(s->method), h->method);
    cp(s->host, sizeof(s->host), h->host);
    cp(s->authority, sizeof(s->authority), h->authority);
    cp(s->path, sizeof(s->path), h->path);
    cp(s->query, sizeof(s->query), h->query);
    cp(s->target, sizeof(s->target), h->target);
    cp(s->scheme, sizeof(s->scheme), info->scheme);
    cp(s->protocol, sizeof(s->protocol), info->protocol);
    s->has_query = h->has_query;
    s->version = h->version;
    s->has_length = h->has_length;
    s->content_length = h->content_length;
    s->flags = info->flags;
    s->num_headers = h->num_headers;
    for (size_t i = 0; i < h->num_headers && i < 128; i++) {
        cp(s->hname[i], sizeof(s->hname[i]), h->headers[i].name);
        cp(s->hvalue[i], sizeof(s->hvalue[i]), h->headers[i].value);
    }
    if (info->flags & SL_H2_REQ_END_STREAM)
        s->ended[slot(id)] = 1;
    if (s->respond_on_request) {
        assert_int_equal(sl_h2_submit_response(g_conn, id, 200, NULL, 0, 0), SL_OK);
        assert_int_equal(sl_h2_stream_write(g_conn, id, (const uint8_t *)"ok", 2, 1), 2);
    }
}

static void srv_on_data(void *user, int32_t id, const uint8_t *p, size_t n, int end)
{
    srv_t *s = user;
    if (end) {
        assert_null(p);
        assert_int_equal(n, 0);
        s->ended[slot(id)]++;
    } else {
        assert_non_null(p);
        assert_true(n > 0);
        s->data[slot(id)] += n;
    }
}

static void srv_on_trailers(void *user, int32_t id, const sl_header_t *f, size_t n)
{
    srv_t *s = user;
    s->trailers[slot(id)] = (int)n;
    if (n)
        cp(s->trailer_value, sizeof(s->trailer_value), f[0].value);
}

static void srv_on_close(void *user, int32_t id, uint32_t code)
{
    srv_t *s = user;
    s->closed[slot(id)]++;
    s->close_code[slot(id)] = code;
}

static void srv_on_writable(void *user, int32_t id)
{
    srv_t *s = user;
    s->writable[slot(id)]++;
}

static void srv_on_reject(void *user, int32_t id, int status, const char *reason)
{
    (void)id;
    (void)reason;
    srv_t *s = user;
    s->rejects++;
    s->reject_status = status;
}

static uint64_t srv_now(void *user)
{
    return ((srv_t *)user)->now;
}

static const sl_h2_callbacks_t srv_cb = {
    .on_request = srv_on_request,
    .on_data = srv_on_data,
    .on_trailers = srv_on_trailers,
    .on_stream_close = srv_on_close,
    .on_stream_writable = srv_on_writable,
    .on_reject = srv_on_reject,
    .now_ms = srv_now,
};

/* ---- what the client saw ------------------------------------------------ */

typedef struct {
    int statuses[MAXS][4]; /* every :status in order (1xx first) */
    int nstatus[MAXS];
    size_t body[MAXS];
    int end[MAXS];
    uint32_t rst[MAXS];
    int got_rst[MAXS];
    int closed[MAXS];
    char trailer[MAXS][32]; /* grpc-status */
    int goaway;
    uint32_t goaway_code;
    int32_t goaway_last;
    int consume; /* consume received DATA on these streams (bit per slot 0..63) */
    uint64_t consume_mask;
} cli_t;

static int cli_on_header(nghttp2_session *ng, const nghttp2_frame *f, const uint8_t *name,
                         size_t nl, const uint8_t *value, size_t vl, uint8_t flags, void *u)
{
    (void)ng;
    (void)flags;
    cli_t *c = u;
    int i = slot(f->hd.stream_id);
    if (nl == 7 && memcmp(name, ":status", 7) == 0 && c->nstatus[i] < 4)
        c->statuses[i][c->nstatus[i]++] = atoi((const char *)value);
    if (nl == 11 && memcmp(name, "grpc-status", 11) == 0) {
        size_t n = vl < 31 ? vl : 31;
        memcpy(c->trailer[i], value, n);
        c->trailer[i][n] = 0;
    }
    return 0;
}

static int cli_on_data(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *d, size_t n,
                       void *u)
{
    (void)flags;
    (void)d;
    cli_t *c = u;
    c->body[slot(id)] += n;
    if (c->consume || (slot(id) < 64 && (c->consume_mask >> slot(id)) & 1))
        nghttp2_session_consume(ng, id, n);
    return 0;
}

static int cli_on_frame(nghttp2_session *ng, const nghttp2_frame *f, void *u)
{
    (void)ng;
    cli_t *c = u;
    if (f->hd.type == NGHTTP2_GOAWAY) {
        c->goaway++;
        c->goaway_code = f->goaway.error_code;
        c->goaway_last = f->goaway.last_stream_id;
    }
    if (f->hd.type == NGHTTP2_RST_STREAM) {
        c->got_rst[slot(f->hd.stream_id)] = 1;
        c->rst[slot(f->hd.stream_id)] = f->rst_stream.error_code;
    }
    if ((f->hd.type == NGHTTP2_DATA || f->hd.type == NGHTTP2_HEADERS) &&
        (f->hd.flags & NGHTTP2_FLAG_END_STREAM))
        c->end[slot(f->hd.stream_id)] = 1;
    return 0;
}

static int cli_on_close(nghttp2_session *ng, int32_t id, uint32_t code, void *u)
{
    (void)ng;
    (void)code;
    cli_t *c = u;
    c->closed[slot(id)] = 1;
    return 0;
}

/* ---- the pair ----------------------------------------------------------- */

typedef struct {
    srv_t srv;
    cli_t cli;
    sl_h2_conn_t *c;
    nghttp2_session *ng;
    sl_buf_t out;
    ssize_t last_feed;
} pair_t;

static void pair_open(pair_t *p, const sl_h2_settings_t *set, int client_manual_window,
                      size_t out_cap)
{
    memset(p, 0, sizeof(*p));
    p->srv.now = 1000;
    p->c = sl_h2_conn_new(set, &srv_cb, &p->srv);
    assert_non_null(p->c);
    g_conn = p->c;
    p->out.data = malloc(out_cap);
    p->out.cap = out_cap;

    nghttp2_session_callbacks *cbs;
    nghttp2_session_callbacks_new(&cbs);
    nghttp2_session_callbacks_set_on_header_callback(cbs, cli_on_header);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, cli_on_data);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, cli_on_frame);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, cli_on_close);
    nghttp2_option *opt;
    nghttp2_option_new(&opt);
    if (client_manual_window)
        nghttp2_option_set_no_auto_window_update(opt, 1);
    /* A client that may misbehave: large header blocks, and no assumption
     * about our stream limit before our SETTINGS arrive. */
    nghttp2_option_set_max_send_header_block_length(opt, 1 << 20);
    nghttp2_option_set_peer_max_concurrent_streams(opt, 1000);
    assert_int_equal(nghttp2_session_client_new2(&p->ng, cbs, &p->cli, opt), 0);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cbs);
    nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0}};
    nghttp2_submit_settings(p->ng, NGHTTP2_FLAG_NONE, iv, 1);
    if (client_manual_window)
        nghttp2_session_set_local_window_size(p->ng, NGHTTP2_FLAG_NONE, 0, 1 << 28);
}

static void pair_close(pair_t *p)
{
    sl_h2_conn_free(p->c);
    nghttp2_session_del(p->ng);
    free(p->out.data);
    g_conn = NULL;
}

/* Client bytes to the server; returns bytes moved. */
static size_t c2s(pair_t *p)
{
    size_t moved = 0;
    for (;;) {
        const uint8_t *d;
        ssize_t n = nghttp2_session_mem_send(p->ng, &d);
        assert_true(n >= 0);
        if (n == 0)
            break;
        moved += (size_t)n;
        p->last_feed = sl_h2_conn_feed(p->c, d, (size_t)n);
        if (p->last_feed < 0)
            break;
        assert_int_equal(p->last_feed, n);
    }
    return moved;
}

/* Server bytes to the client (through the bounded buffer); bytes moved. */
static size_t s2c(pair_t *p)
{
    size_t moved = 0;
    for (int i = 0; i < 10000; i++) {
        assert_int_equal(sl_h2_conn_flush_into(p->c, &p->out), SL_OK);
        size_t n = sl_buf_len(&p->out);
        if (n == 0)
            break;
        ssize_t r = nghttp2_session_mem_recv(p->ng, (const uint8_t *)sl_buf_head(&p->out), n);
        assert_int_equal(r, (ssize_t)n);
        sl_buf_consume(&p->out, n);
        moved += n;
    }
    return moved;
}

static void pump(pair_t *p)
{
    for (int i = 0; i < 1000; i++) {
        size_t a = c2s(p);
        if (p->last_feed < 0) {
            s2c(p);
            return;
        }
        size_t b = s2c(p);
        if (a == 0 && b == 0)
            return;
    }
    fail_msg("pump did not settle");
}

#define NV(n, v)                                                                                   \
    {                                                                                              \
        (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, sizeof(v) - 1, NGHTTP2_NV_FLAG_NONE         \
    }

static int32_t get(pair_t *p, const char *path)
{
    nghttp2_nv nv[] = {
        NV(":method", "GET"),
        NV(":scheme", "https"),
        NV(":authority", "example.com"),
        {(uint8_t *)":path", (uint8_t *)path, 5, strlen(path), NGHTTP2_NV_FLAG_NONE}};
    int32_t id = nghttp2_submit_request(p->ng, NULL, nv, 4, NULL, NULL);
    assert_true(id > 0);
    return id;
}

/* ---- raw frames --------------------------------------------------------- */

typedef struct {
    uint8_t *b;
    size_t len, cap;
} bytes_t;

static void put(bytes_t *w, const void *p, size_t n)
{
    if (w->len + n > w->cap) {
        w->cap = (w->len + n) * 2 + 1024;
        w->b = realloc(w->b, w->cap);
    }
    memcpy(w->b + w->len, p, n);
    w->len += n;
}

static void frame(bytes_t *w, uint8_t type, uint8_t flags, uint32_t sid, const void *payload,
                  size_t n)
{
    uint8_t h[9] = {
        (uint8_t)(n >> 16),   (uint8_t)(n >> 8),    (uint8_t)n,          type,        flags,
        (uint8_t)(sid >> 24), (uint8_t)(sid >> 16), (uint8_t)(sid >> 8), (uint8_t)sid};
    put(w, h, 9);
    if (n)
        put(w, payload, n);
}

static void preface(bytes_t *w)
{
    put(w, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24);
    frame(w, NGHTTP2_SETTINGS, 0, 0, NULL, 0);
}

/* A header block from nghttp2's encoder, which takes any names. */
static size_t hpack(nghttp2_hd_deflater *d, const nghttp2_nv *nv, size_t n, uint8_t *out,
                    size_t cap)
{
    ssize_t r = nghttp2_hd_deflate_hd(d, out, cap, nv, n);
    assert_true(r >= 0);
    return (size_t)r;
}

static void headers(bytes_t *w, nghttp2_hd_deflater *d, uint32_t sid, int end_stream,
                    const nghttp2_nv *nv, size_t n)
{
    uint8_t blk[65536];
    size_t len = hpack(d, nv, n, blk, sizeof(blk));
    frame(w, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_HEADERS | (end_stream ? NGHTTP2_FLAG_END_STREAM : 0),
          sid, blk, len);
}

/* What came back, read frame by frame. */
typedef struct {
    uint32_t rst[MAXS];
    int got_rst[MAXS];
    int status[MAXS];
    int goaway;
    uint32_t goaway_code;
    int settings, settings_acks, ping_acks;
    nghttp2_hd_inflater *inf;
} seen_t;

static void read_output(seen_t *s, const uint8_t *p, size_t n)
{
    if (!s->inf)
        nghttp2_hd_inflate_new(&s->inf);
    size_t off = 0;
    while (off + 9 <= n) {
        size_t len = (size_t)p[off] << 16 | (size_t)p[off + 1] << 8 | p[off + 2];
        uint8_t type = p[off + 3], flags = p[off + 4];
        uint32_t sid = ((uint32_t)p[off + 5] << 24 | (uint32_t)p[off + 6] << 16 |
                        (uint32_t)p[off + 7] << 8 | p[off + 8]) &
                       0x7fffffff;
        assert_true(off + 9 + len <= n);
        const uint8_t *pl = p + off + 9;
        if (type == NGHTTP2_RST_STREAM) {
            s->got_rst[slot((int32_t)sid)] = 1;
            s->rst[slot((int32_t)sid)] =
                (uint32_t)pl[0] << 24 | (uint32_t)pl[1] << 16 | (uint32_t)pl[2] << 8 | pl[3];
        } else if (type == NGHTTP2_GOAWAY) {
            s->goaway++;
            s->goaway_code =
                (uint32_t)pl[4] << 24 | (uint32_t)pl[5] << 16 | (uint32_t)pl[6] << 8 | pl[7];
        } else if (type == NGHTTP2_SETTINGS) {
            if (flags & NGHTTP2_FLAG_ACK)
                s->settings_acks++;
            else
                s->settings++;
        } else if (type == NGHTTP2_PING && (flags & NGHTTP2_FLAG_ACK)) {
            s->ping_acks++;
        } else if (type == NGHTTP2_HEADERS) {
            const uint8_t *in = pl;
            size_t left = len;
            for (;;) {
                nghttp2_nv nv;
                int fl = 0;
                ssize_t r = nghttp2_hd_inflate_hd2(s->inf, &nv, &fl, in, left, 1);
                assert_true(r >= 0);
                in += r;
                left -= (size_t)r;
                if (fl & NGHTTP2_HD_INFLATE_EMIT) {
                    if (nv.namelen == 7 && memcmp(nv.name, ":status", 7) == 0)
                        s->status[slot((int32_t)sid)] = atoi((const char *)nv.value);
                }
                if (fl & NGHTTP2_HD_INFLATE_FINAL) {
                    nghttp2_hd_inflate_end_headers(s->inf);
                    break;
                }
                if (left == 0 && !(fl & NGHTTP2_HD_INFLATE_EMIT))
                    break;
            }
        }
        off += 9 + len;
    }
}

/* Feeds raw bytes, flushes everything, reads it. Returns the feed result. */
static ssize_t raw_exchange(sl_h2_conn_t *c, srv_t *srv, bytes_t *w, seen_t *seen)
{
    (void)srv;
    ssize_t r = sl_h2_conn_feed(c, w->b, w->len);
    w->len = 0;
    sl_buf_t out = {malloc(1 << 20), 0, 0, 1 << 20};
    assert_int_equal(sl_h2_conn_flush_into(c, &out), SL_OK);
    read_output(seen, (const uint8_t *)sl_buf_head(&out), sl_buf_len(&out));
    free(out.data);
    return r;
}

typedef struct {
    srv_t srv;
    sl_h2_conn_t *c;
    nghttp2_hd_deflater *d;
    bytes_t w;
    seen_t seen;
} raw_t;

static void raw_open(raw_t *r, const sl_h2_settings_t *set)
{
    memset(r, 0, sizeof(*r));
    r->srv.now = 1000;
    r->c = sl_h2_conn_new(set, &srv_cb, &r->srv);
    assert_non_null(r->c);
    g_conn = r->c;
    nghttp2_hd_deflate_new(&r->d, 4096);
    preface(&r->w);
}

static void raw_close(raw_t *r)
{
    sl_h2_conn_free(r->c);
    nghttp2_hd_deflate_del(r->d);
    if (r->seen.inf)
        nghttp2_hd_inflate_del(r->seen.inf);
    free(r->w.b);
    g_conn = NULL;
}

static const nghttp2_nv base_get[] = {NV(":method", "GET"), NV(":scheme", "https"),
                                      NV(":authority", "example.com"), NV(":path", "/")};

/* ---- tests: requests ---------------------------------------------------- */

static void test_preface(void **state)
{
    (void)state;
    const uint8_t *pf = (const uint8_t *)"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\nxyz";
    assert_int_equal(sl_h2_is_preface(pf, 24), SL_OK);
    assert_int_equal(sl_h2_is_preface(pf, 27), SL_OK);
    assert_int_equal(sl_h2_is_preface(pf, 3), SL_AGAIN);
    assert_int_equal(sl_h2_is_preface(pf, 0), SL_AGAIN);
    assert_int_equal(sl_h2_is_preface((const uint8_t *)"GET / HTTP/1.1\r\n", 16), SL_DECLINED);
    assert_int_equal(sl_h2_is_preface((const uint8_t *)"PRX", 3), SL_DECLINED);
}

static void test_bad_preface_is_connection_error(void **state)
{
    (void)state;
    raw_t r;
    raw_open(&r, NULL);
    r.w.len = 0;
    put(&r.w, "GET / HTTP/1.1\r\nHost: a\r\n\r\n", 27);
    assert_int_equal(raw_exchange(r.c, &r.srv, &r.w, &r.seen), SL_ERROR);
    assert_int_equal(r.seen.goaway, 1);
    assert_int_equal(r.seen.goaway_code, NGHTTP2_PROTOCOL_ERROR);
    raw_close(&r);
}

static void test_get_head(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, NULL, 0, 65536);
    nghttp2_nv nv[] = {NV(":method", "GET"),
                       NV(":scheme", "https"),
                       NV(":authority", "api.example.com:8443"),
                       NV(":path", "/pets/1?x=1&y"),
                       NV("accept", "application/json"),
                       NV("cookie", "a=1"),
                       NV("x-trace", "t1"),
                       NV("cookie", "b=2"),
                       NV("cookie", "c=3")};
    int32_t id = nghttp2_submit_request(p.ng, NULL, nv, SL_ARRAY_LEN(nv), NULL, NULL);
    pump(&p);
    assert_int_equal(p.srv.requests, 1);
    assert_int_equal(p.srv.last_id, id);
    assert_string_equal(p.srv.method, "GET");
    assert_string_equal(p.srv.host, "api.example.com");
    assert_string_equal(p.srv.authority, "api.example.com:8443");
    assert_string_equal(p.srv.path, "/pets/1");
    assert_string_equal(p.srv.query, "x=1&y");
    assert_string_equal(p.srv.target, "/pets/1?x=1&y");
    assert_string_equal(p.srv.scheme, "https");
    assert_int_equal(p.srv.has_query, 1);
    assert_int_equal(p.srv.version, 20);
    /* END_STREAM with the head: the body is known to be empty. */
    assert_int_equal(p.srv.has_length, 1);
    assert_int_equal(p.srv.content_length, 0);
    assert_true(p.srv.flags & SL_H2_REQ_END_STREAM);
    /* Cookies joined into the first one's place, order kept. */
    assert_int_equal(p.srv.num_headers, 3);
    assert_string_equal(p.srv.hname[0], "accept");
    assert_string_equal(p.srv.hname[1], "cookie");
    assert_string_equal(p.srv.hvalue[1], "a=1; b=2; c=3");
    assert_string_equal(p.srv.hname[2], "x-trace");
    assert_string_equal(p.srv.hvalue[2], "t1");

    /* Answer it; the close reaches the glue once. */
    assert_int_equal(sl_h2_submit_response(p.c, id, 204, NULL, 0, 1), SL_OK);
    pump(&p);
    assert_int_equal(p.cli.statuses[slot(id)][0], 204);
    assert_int_equal(p.srv.closed[slot(id)], 1);
    assert_int_equal(p.srv.close_code[slot(id)], 0);
    assert_true(sl_h2_conn_idle(p.c));
    pair_close(&p);
}

static void test_query_empty_and_host_only(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, NULL, 0, 65536);
    /* No :authority: Host stands in; an empty query after '?'. */
    nghttp2_nv nv[] = {NV(":method", "GET"), NV(":scheme", "http"), NV(":path", "/a?"),
                       NV("host", "[::1]:80")};
    nghttp2_submit_request(p.ng, NULL, nv, SL_ARRAY_LEN(nv), NULL, NULL);
    pump(&p);
    assert_int_equal(p.srv.requests, 1);
    assert_string_equal(p.srv.host, "[::1]");
    assert_string_equal(p.srv.authority, "[::1]:80");
    assert_string_equal(p.srv.path, "/a");
    assert_string_equal(p.srv.query, "");
    assert_int_equal(p.srv.has_query, 1);

    /* Both: :authority wins. */
    nghttp2_nv nv2[] = {NV(":method", "GET"), NV(":scheme", "http"), NV(":path", "/b"),
                        NV(":authority", "a.example"), NV("host", "b.example")};
    nghttp2_submit_request(p.ng, NULL, nv2, SL_ARRAY_LEN(nv2), NULL, NULL);
    pump(&p);
    assert_int_equal(p.srv.requests, 2);
    assert_string_equal(p.srv.host, "a.example");
    assert_int_equal(p.srv.has_query, 0);
    pair_close(&p);
}

/* fuzz_h2_frames finding: joining cookies grew (moved) the header scratch
 * after the method had been sliced out of it. Some count of cookies makes
 * the join cross the scratch's capacity; ASan sees a stale slice. */
static void test_cookie_join_that_moves_the_scratch(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, NULL, 0, 65536);
    static char value[60];
    memset(value, 'k', sizeof(value));
    nghttp2_nv nv[4 + 60];
    memcpy(nv, base_get, sizeof(base_get));
    nv[3] = (nghttp2_nv)NV(":path", "/moved?q=1");
    for (int k = 2; k <= 60; k++) {
        for (int i = 0; i < k; i++)
            nv[4 + i] = (nghttp2_nv){(uint8_t *)"cookie", (uint8_t *)value, 6, sizeof(value),
                                     NGHTTP2_NV_FLAG_NO_INDEX};
        nghttp2_submit_request(p.ng, NULL, nv, 4 + (size_t)k, NULL, NULL);
        pump(&p);
        assert_int_equal(p.srv.requests, k - 1);
        assert_string_equal(p.srv.method, "GET");
        assert_string_equal(p.srv.scheme, "https");
        assert_string_equal(p.srv.path, "/moved");
        assert_string_equal(p.srv.query, "q=1");
        assert_string_equal(p.srv.host, "example.com");
        assert_int_equal(p.srv.num_headers, 1);
        assert_int_equal(strlen(p.srv.hvalue[0]), (size_t)k * sizeof(value) + 2 * ((size_t)k - 1));
    }
    pair_close(&p);
}

static ssize_t body_read(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t len, uint32_t *flags,
                         nghttp2_data_source *src, void *u)
{
    (void)ng;
    (void)id;
    (void)u;
    size_t *left = src->ptr;
    size_t n = *left < len ? *left : len;
    memset(buf, 'b', n);
    *left -= n;
    if (*left == 0)
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

static void test_post_body_and_consume(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, NULL, 0, 65536);
    size_t left = 200000;
    nghttp2_nv nv[] = {NV(":method", "POST"), NV(":scheme", "https"),
                       NV(":authority", "example.com"), NV(":path", "/upload"),
                       NV("content-length", "200000")};
    nghttp2_data_provider prd = {.source.ptr = &left, .read_callback = body_read};
    int32_t id = nghttp2_submit_request(p.ng, NULL, nv, SL_ARRAY_LEN(nv), &prd, NULL);
    pump(&p);
    assert_int_equal(p.srv.requests, 1);
    assert_int_equal(p.srv.has_length, 1);
    assert_int_equal(p.srv.content_length, 200000);
    assert_false(p.srv.flags & SL_H2_REQ_END_STREAM);
    /* No credit without consume: exactly one stream window got in. */
    assert_int_equal(p.srv.data[slot(id)], 65535);
    assert_int_equal(nghttp2_session_get_stream_remote_window_size(p.ng, id), 0);
    pump(&p);
    assert_int_equal(p.srv.data[slot(id)], 65535);

    /* Forwarded: credit it back, the client sends more; repeat to the end. */
    for (int i = 0; i < 10 && !p.srv.ended[slot(id)]; i++) {
        sl_h2_consume(p.c, id, p.srv.data[slot(id)]);
        /* Extra and repeated consumes are ignored. */
        sl_h2_consume(p.c, id, 1 << 20);
        pump(&p);
    }
    assert_int_equal(p.srv.data[slot(id)], 200000);
    assert_int_equal(p.srv.ended[slot(id)], 1);
    pair_close(&p);
}

static void test_response_body_trailers_and_103(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, NULL, 0, 65536);
    int32_t id = get(&p, "/grpc");
    pump(&p);
    sl_header_t link[] = {{SL_STR("Link"), SL_STR("</a.css>; rel=preload")}};
    assert_int_equal(sl_h2_submit_response(p.c, id, 103, link, 1, 0), SL_OK);
    sl_header_t h[] = {{SL_STR("Content-Type"), SL_STR(" application/grpc ")},
                       {SL_STR("Connection"), SL_STR("close")},
                       {SL_STR("Transfer-Encoding"), SL_STR("chunked")}};
    assert_int_equal(sl_h2_submit_response(p.c, id, 200, h, 3, 0), SL_OK);
    /* A second final response, a 101, or a bad name are refused. */
    assert_int_equal(sl_h2_submit_response(p.c, id, 200, NULL, 0, 0), SL_ERROR);
    uint8_t body[100000];
    memset(body, 'x', sizeof(body));
    size_t sent = 0;
    for (int i = 0; i < 100 && sent < sizeof(body); i++) {
        ssize_t n = sl_h2_stream_write(p.c, id, body + sent, sizeof(body) - sent, 0);
        assert_true(n >= 0);
        sent += (size_t)n;
        pump(&p);
    }
    assert_int_equal(sent, sizeof(body));
    sl_header_t t[] = {{SL_STR("grpc-status"), SL_STR("0")}, {SL_STR("grpc-message"), SL_STR("")}};
    assert_int_equal(sl_h2_submit_trailers(p.c, id, t, 2), SL_OK);
    /* After the end, writes are misuse. */
    assert_int_equal(sl_h2_stream_write(p.c, id, body, 1, 0), SL_ERROR);
    pump(&p);
    assert_int_equal(p.cli.nstatus[slot(id)], 2);
    assert_int_equal(p.cli.statuses[slot(id)][0], 103);
    assert_int_equal(p.cli.statuses[slot(id)][1], 200);
    assert_int_equal(p.cli.body[slot(id)], sizeof(body));
    assert_string_equal(p.cli.trailer[slot(id)], "0");
    assert_int_equal(p.cli.end[slot(id)], 1);
    assert_int_equal(p.srv.closed[slot(id)], 1);
    /* The stream is gone: further calls say so. */
    assert_int_equal(sl_h2_stream_write(p.c, id, body, 1, 0), SL_DECLINED);
    assert_int_equal(sl_h2_submit_response(p.c, id, 200, NULL, 0, 1), SL_DECLINED);
    pair_close(&p);
}

static void test_response_field_rules(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, NULL, 0, 65536);
    int32_t id = get(&p, "/");
    pump(&p);
    sl_header_t bad_name[] = {{SL_STR("bad name"), SL_STR("v")}};
    sl_header_t bad_value[] = {{SL_STR("x"), SL_STR("a\r\nb: c")}};
    assert_int_equal(sl_h2_submit_response(p.c, id, 101, NULL, 0, 0), SL_ERROR);
    assert_int_equal(sl_h2_submit_response(p.c, id, 103, NULL, 0, 1), SL_ERROR);
    assert_int_equal(sl_h2_submit_response(p.c, id, 200, bad_name, 1, 1), SL_ERROR);
    assert_int_equal(sl_h2_submit_response(p.c, id, 200, bad_value, 1, 1), SL_ERROR);
    /* Trailers need a body provider. */
    assert_int_equal(sl_h2_submit_response(p.c, id, 200, NULL, 0, 1), SL_OK);
    sl_header_t t[] = {{SL_STR("grpc-status"), SL_STR("0")}};
    assert_int_equal(sl_h2_submit_trailers(p.c, id, t, 1), SL_ERROR);
    pump(&p);
    assert_int_equal(p.cli.statuses[slot(id)][0], 200);
    pair_close(&p);
}

static void test_request_trailers(void **state)
{
    (void)state;
    raw_t r;
    raw_open(&r, NULL);
    nghttp2_nv nv[] = {NV(":method", "POST"), NV(":scheme", "http"), NV(":authority", "a"),
                       NV(":path", "/svc/M"), NV("te", "trailers")};
    headers(&r.w, r.d, 1, 0, nv, SL_ARRAY_LEN(nv));
    frame(&r.w, NGHTTP2_DATA, 0, 1, "hello", 5);
    nghttp2_nv tr[] = {NV("x-checksum", "abc")};
    headers(&r.w, r.d, 1, 1, tr, 1);
    raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    assert_int_equal(r.srv.requests, 1);
    assert_int_equal(r.srv.data[0], 5);
    assert_int_equal(r.srv.trailers[0], 1);
    assert_string_equal(r.srv.trailer_value, "abc");
    assert_int_equal(r.srv.ended[0], 1);
    assert_int_equal(r.seen.got_rst[0], 0);
    raw_close(&r);
}

/* ---- tests: RFC 9113 request rules ------------------------------------- */

/* One request per case, each on its own stream; what is expected: */
enum { OK_REQ, STREAM_ERR };

/* The codec's settings for the next cases (NULL: defaults). */
static const sl_h2_settings_t *case_settings;

static void check_case(const nghttp2_nv *nv, size_t n, int expect, const char *what)
{
    raw_t r;
    raw_open(&r, case_settings);
    headers(&r.w, r.d, 1, 1, nv, n);
    assert_true(raw_exchange(r.c, &r.srv, &r.w, &r.seen) >= 0);
    if (expect == OK_REQ) {
        if (r.srv.requests != 1)
            fail_msg("%s: expected a request", what);
        assert_int_equal(r.seen.got_rst[0], 0);
    } else {
        if (r.srv.requests != 0)
            fail_msg("%s: request was delivered", what);
        if (!r.seen.got_rst[0] || r.seen.rst[0] != NGHTTP2_PROTOCOL_ERROR)
            fail_msg("%s: expected RST_STREAM PROTOCOL_ERROR, got %d/%u", what, r.seen.got_rst[0],
                     r.seen.rst[0]);
        assert_int_equal(r.seen.goaway, 0);
        /* The connection lives on: the next request is fine. */
        headers(&r.w, r.d, 3, 1, base_get, 4);
        raw_exchange(r.c, &r.srv, &r.w, &r.seen);
        assert_int_equal(r.srv.requests, 1);
    }
    raw_close(&r);
}

#define CASE(expect, ...)                                                                          \
    do {                                                                                           \
        nghttp2_nv nv_[] = {__VA_ARGS__};                                                          \
        check_case(nv_, SL_ARRAY_LEN(nv_), expect, #__VA_ARGS__);                                  \
    } while (0)

static void test_rfc9113_request_rules(void **state)
{
    (void)state;
    CASE(OK_REQ, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", "/"), NV("te", "trailers"));
    /* pseudo-header fields */
    CASE(STREAM_ERR, NV(":scheme", "https"), NV(":authority", "a"), NV(":path", "/"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":authority", "a"), NV(":path", "/"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", "/"), NV(":foo", "x"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a"),
         NV("accept", "*/*"), NV(":path", "/"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":method", "GET"), NV(":scheme", "https"),
         NV(":authority", "a"), NV(":path", "/"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", ""));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", "x/y"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", "*"));
    CASE(OK_REQ, NV(":method", "OPTIONS"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", "*"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", "/a b"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", "/a#frag"));
    /* :protocol without SETTINGS_ENABLE_CONNECT_PROTOCOL */
    static const sl_h2_settings_t no_connect_protocol = {.enable_connect_protocol = SL_H2_OFF};
    case_settings = &no_connect_protocol;
    CASE(STREAM_ERR, NV(":method", "CONNECT"), NV(":protocol", "websocket"), NV(":scheme", "https"),
         NV(":authority", "a"), NV(":path", "/chat"));
    case_settings = NULL;
    /* with it (the default), :protocol only on CONNECT, and with :path */
    CASE(OK_REQ, NV(":method", "CONNECT"), NV(":protocol", "websocket"), NV(":scheme", "https"),
         NV(":authority", "a"), NV(":path", "/chat"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":protocol", "websocket"), NV(":scheme", "https"),
         NV(":authority", "a"), NV(":path", "/chat"));
    CASE(STREAM_ERR, NV(":method", "CONNECT"), NV(":protocol", "websocket"), NV(":scheme", "https"),
         NV(":authority", "a"));
    /* plain CONNECT: authority only */
    CASE(OK_REQ, NV(":method", "CONNECT"), NV(":authority", "a:443"));
    CASE(STREAM_ERR, NV(":method", "CONNECT"), NV(":authority", "a:443"), NV(":path", "/"));
    /* connection-specific fields */
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", "/"), NV("connection", "keep-alive"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", "/"), NV("keep-alive", "5"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", "/"), NV("proxy-connection", "x"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", "/"), NV("transfer-encoding", "chunked"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", "/"), NV("upgrade", "h2c"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", "/"), NV("te", "gzip"));
    /* names and values */
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", "/"), NV("X-Upper", "1"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", "/"), NV("bad name", "1"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", "/"), NV("x", "a\r\nb"));
    CASE(STREAM_ERR, NV(":method", "G ET"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", "/"));
    /* authority / host */
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":path", "/"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "u@a"),
         NV(":path", "/"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a:99999x"),
         NV(":path", "/"));
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":path", "/"),
         NV("host", "a"), NV("host", "b"));
    /* content-length */
    CASE(STREAM_ERR, NV(":method", "GET"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", "/"), NV("content-length", "abc"));
    CASE(STREAM_ERR, NV(":method", "POST"), NV(":scheme", "https"), NV(":authority", "a"),
         NV(":path", "/"), NV("content-length", "5"));
}

static void test_content_length_vs_data(void **state)
{
    (void)state;
    static const nghttp2_nv post[] = {NV(":method", "POST"), NV(":scheme", "https"),
                                      NV(":authority", "a"), NV(":path", "/"),
                                      NV("content-length", "5")};
    /* More DATA than announced: reset before the extra bytes reach the glue. */
    raw_t r;
    raw_open(&r, NULL);
    headers(&r.w, r.d, 1, 0, post, 5);
    frame(&r.w, NGHTTP2_DATA, 0, 1, "1234567", 7);
    raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    assert_int_equal(r.srv.requests, 1);
    assert_int_equal(r.srv.data[0], 0);
    assert_int_equal(r.seen.rst[0], NGHTTP2_PROTOCOL_ERROR);
    assert_int_equal(r.srv.closed[0], 1);
    assert_int_equal(r.srv.close_code[0], NGHTTP2_PROTOCOL_ERROR);
    assert_int_equal(r.srv.ended[0], 0);
    raw_close(&r);

    /* Fewer: the end never reaches the glue as an end. */
    raw_open(&r, NULL);
    headers(&r.w, r.d, 1, 0, post, 5);
    frame(&r.w, NGHTTP2_DATA, NGHTTP2_FLAG_END_STREAM, 1, "123", 3);
    raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    assert_int_equal(r.seen.rst[0], NGHTTP2_PROTOCOL_ERROR);
    assert_int_equal(r.srv.ended[0], 0);
    assert_int_equal(r.srv.closed[0], 1);
    raw_close(&r);

    /* Exact: fine. */
    raw_open(&r, NULL);
    headers(&r.w, r.d, 1, 0, post, 5);
    frame(&r.w, NGHTTP2_DATA, 0, 1, "12", 2);
    frame(&r.w, NGHTTP2_DATA, NGHTTP2_FLAG_END_STREAM, 1, "345", 3);
    raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    assert_int_equal(r.srv.data[0], 5);
    assert_int_equal(r.srv.ended[0], 1);
    assert_int_equal(r.seen.got_rst[0], 0);
    raw_close(&r);
}

static void test_connection_errors(void **state)
{
    (void)state;
    raw_t r;
    /* HEADERS on stream 0. */
    raw_open(&r, NULL);
    headers(&r.w, r.d, 0, 1, base_get, 4);
    raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    assert_int_equal(r.seen.goaway, 1);
    assert_int_equal(r.seen.goaway_code, NGHTTP2_PROTOCOL_ERROR);
    assert_false(sl_h2_conn_want_read(r.c));
    raw_close(&r);
    /* A server-initiated (even) stream id from the client. */
    raw_open(&r, NULL);
    headers(&r.w, r.d, 2, 1, base_get, 4);
    raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    assert_int_equal(r.seen.goaway_code, NGHTTP2_PROTOCOL_ERROR);
    assert_int_equal(r.srv.requests, 0);
    raw_close(&r);
    /* A frame between HEADERS and its CONTINUATION. */
    raw_open(&r, NULL);
    uint8_t blk[256];
    size_t n = hpack(r.d, base_get, 4, blk, sizeof(blk));
    frame(&r.w, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_STREAM, 1, blk, 2);
    frame(&r.w, NGHTTP2_PING, 0, 0, "12345678", 8);
    frame(&r.w, NGHTTP2_CONTINUATION, NGHTTP2_FLAG_END_HEADERS, 1, blk + 2, n - 2);
    raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    assert_int_equal(r.seen.goaway_code, NGHTTP2_PROTOCOL_ERROR);
    raw_close(&r);
}

static void test_extended_connect(void **state)
{
    (void)state;
    sl_h2_settings_t set = {.enable_connect_protocol = 1};
    raw_t r;
    raw_open(&r, &set);
    nghttp2_nv nv[] = {NV(":method", "CONNECT"), NV(":protocol", "websocket"),
                       NV(":scheme", "https"),   NV(":authority", "chat.example"),
                       NV(":path", "/ws"),       NV("sec-websocket-version", "13")};
    headers(&r.w, r.d, 1, 0, nv, SL_ARRAY_LEN(nv));
    raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    assert_int_equal(r.srv.requests, 1);
    assert_true(r.srv.flags & SL_H2_REQ_EXTENDED_CONNECT);
    assert_false(r.srv.flags & SL_H2_REQ_END_STREAM);
    assert_string_equal(r.srv.protocol, "websocket");
    assert_string_equal(r.srv.method, "CONNECT");
    assert_string_equal(r.srv.path, "/ws");
    assert_int_equal(r.srv.has_length, 0);
    /* A tunnel: 200, then data both ways. */
    assert_int_equal(sl_h2_submit_response(r.c, 1, 200, NULL, 0, 0), SL_OK);
    assert_int_equal(sl_h2_stream_write(r.c, 1, (const uint8_t *)"hi", 2, 0), 2);
    frame(&r.w, NGHTTP2_DATA, 0, 1, "ws-frame", 8);
    raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    assert_int_equal(r.seen.status[0], 200);
    assert_int_equal(r.srv.data[0], 8);
    raw_close(&r);
}

/* SETTINGS_ENABLE_CONNECT_PROTOCOL is advertised by default (WebSocket over
 * HTTP/2 is served), and not when turned off. */
static void test_enable_connect_protocol_setting(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, NULL, 0, 1 << 16);
    pump(&p);
    assert_int_equal(
        nghttp2_session_get_remote_settings(p.ng, NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL), 1);
    assert_int_equal(sl_h2_conn_settings(p.c)->enable_connect_protocol, 1);
    pair_close(&p);
    sl_h2_settings_t off = {.enable_connect_protocol = SL_H2_OFF};
    pair_open(&p, &off, 0, 1 << 16);
    pump(&p);
    assert_int_equal(
        nghttp2_session_get_remote_settings(p.ng, NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL), 0);
    pair_close(&p);
}

/* ---- tests: concurrency, flow control, drain ----------------------------- */

static void test_concurrent_streams_limit(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, NULL, 0, 65536);
    /* The client does not know our limit yet (SETTINGS not read): it sends
     * 101 requests at once; the 101st is refused, the 100 are served. */
    int32_t ids[101];
    for (int i = 0; i < 101; i++)
        ids[i] = get(&p, "/many");
    c2s(&p);
    assert_int_equal(p.srv.requests, 100);
    sl_h2_stats_t st;
    sl_h2_conn_stats(p.c, &st);
    assert_int_equal(st.open_streams, 100);
    s2c(&p);
    assert_int_equal(p.cli.got_rst[slot(ids[100])], 1);
    assert_int_equal(p.cli.rst[slot(ids[100])], NGHTTP2_REFUSED_STREAM);
    assert_int_equal(p.cli.goaway, 0);
    for (int i = 0; i < 100; i++)
        assert_int_equal(sl_h2_submit_response(p.c, ids[i], 200, NULL, 0, 1), SL_OK);
    pump(&p);
    for (int i = 0; i < 100; i++)
        assert_int_equal(p.cli.statuses[slot(ids[i])][0], 200);
    assert_true(sl_h2_conn_idle(p.c));
    /* Once the client knows the limit, it queues rather than exceed it. */
    p.srv.respond_on_request = 1;
    for (int i = 0; i < 150; i++)
        get(&p, "/more");
    pump(&p);
    assert_int_equal(p.srv.requests, 250);
    pair_close(&p);
}

static void test_flow_control_per_stream(void **state)
{
    (void)state;
    pair_t p;
    /* The client reads stream B (credits it) but never stream A. */
    pair_open(&p, NULL, 1, SL_H2_MIN_OUT_BYTES);
    int32_t a = get(&p, "/slow"), b = get(&p, "/fast");
    p.cli.consume_mask = 1ull << slot(b);
    pump(&p);
    assert_int_equal(sl_h2_submit_response(p.c, a, 200, NULL, 0, 0), SL_OK);
    assert_int_equal(sl_h2_submit_response(p.c, b, 200, NULL, 0, 0), SL_OK);
    static uint8_t chunk[100000];
    size_t total = 1 << 20, sent_a = 0, sent_b = 0;
    const uint32_t bound = sl_h2_conn_settings(p.c)->stream_send_buffer_bytes;
    for (int i = 0; i < 2000 && sent_b < total; i++) {
        ssize_t n = sl_h2_stream_write(p.c, a, chunk, sizeof(chunk), 0);
        assert_true(n >= 0);
        sent_a += (size_t)n;
        size_t want = total - sent_b < sizeof(chunk) ? total - sent_b : sizeof(chunk);
        n = sl_h2_stream_write(p.c, b, chunk, want, sent_b + want == total);
        assert_true(n >= 0);
        sent_b += (size_t)n;
        p.srv.now += 10;
        pump(&p);
        sl_h2_stats_t st;
        sl_h2_conn_stats(p.c, &st);
        assert_true(st.send_buffer_max <= bound);
        assert_true(st.send_buffered <= sl_h2_conn_settings(p.c)->conn_send_buffer_bytes);
    }
    pump(&p);
    /* B finished although A is stuck at the client's window. */
    assert_int_equal(p.cli.body[slot(b)], total);
    assert_int_equal(p.cli.end[slot(b)], 1);
    assert_int_equal(p.cli.body[slot(a)], 65535);
    assert_false(p.cli.end[slot(a)]);
    /* A took its window and one buffer, no more. */
    assert_int_equal(sent_a, 65535 + bound);
    assert_true(p.srv.writable[slot(b)] > 0);
    /* Its stall is visible to the glue's timer. */
    p.srv.now += 5000;
    assert_true(sl_h2_stream_stalled_ms(p.c, a) >= 5000);
    assert_int_equal(sl_h2_stream_stalled_ms(p.c, b), 0);
    uint64_t since;
    assert_int_equal(sl_h2_conn_oldest_stall(p.c, &since), a);
    assert_true(since > 0 && since < p.srv.now);
    /* The client opens its window: A flows again, writable follows. */
    nghttp2_session_consume(p.ng, a, p.cli.body[slot(a)]);
    pump(&p);
    assert_true(p.cli.body[slot(a)] > 65535);
    assert_true(p.srv.writable[slot(a)] > 0);
    assert_int_equal(sl_h2_stream_stalled_ms(p.c, a), 0);
    /* The glue's stall timeout resets the stream. */
    assert_int_equal(sl_h2_reset_stream(p.c, a, SL_H2_CANCEL), SL_OK);
    pump(&p);
    assert_int_equal(p.cli.rst[slot(a)], NGHTTP2_CANCEL);
    assert_int_equal(p.srv.closed[slot(a)], 1);
    assert_int_equal(sl_h2_conn_oldest_stall(p.c, &since), 0);
    pair_close(&p);
}

static void test_output_never_exceeds_buffer(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, NULL, 0, 65536);
    int32_t id = get(&p, "/big");
    pump(&p);
    assert_int_equal(sl_h2_submit_response(p.c, id, 200, NULL, 0, 0), SL_OK);
    static uint8_t chunk[65536];
    assert_int_equal(sl_h2_stream_write(p.c, id, chunk, sizeof(chunk), 0), 65536);
    /* Nearly full output buffer: the codec writes only what fits. */
    sl_buf_t out = {malloc(SL_H2_MIN_OUT_BYTES), 0, 0, SL_H2_MIN_OUT_BYTES};
    out.end = SL_H2_MIN_OUT_BYTES - 100;
    assert_int_equal(sl_h2_conn_flush_into(p.c, &out), SL_OK);
    assert_true(out.end <= out.cap);
    assert_true(sl_h2_conn_want_write(p.c));
    /* The reader drains; everything is framed in pieces that fit. */
    size_t got = 0;
    for (int i = 0; i < 100 && sl_h2_conn_want_write(p.c); i++) {
        sl_h2_conn_flush_into(p.c, &out);
        assert_true(out.end <= out.cap);
        if (i == 0)
            sl_buf_consume(&out, SL_H2_MIN_OUT_BYTES - 100); /* the filler */
        size_t n = sl_buf_len(&out);
        assert_int_equal(nghttp2_session_mem_recv(p.ng, (uint8_t *)sl_buf_head(&out), n),
                         (ssize_t)n);
        sl_buf_consume(&out, n);
        got += n;
        c2s(&p);
    }
    assert_true(got > 65535);
    free(out.data);
    pair_close(&p);
}

static void test_unconsumed_body_credited_on_close(void **state)
{
    (void)state;
    pair_t p;
    /* nghttp2 sends WINDOW_UPDATE once half the window is consumed. */
    sl_h2_settings_t set = {.conn_window_bytes = 100000};
    pair_open(&p, &set, 0, 65536);
    size_t left = 60000;
    nghttp2_nv nv[] = {NV(":method", "POST"), NV(":scheme", "https"), NV(":authority", "a"),
                       NV(":path", "/")};
    nghttp2_data_provider prd = {.source.ptr = &left, .read_callback = body_read};
    int32_t id = nghttp2_submit_request(p.ng, NULL, nv, 4, &prd, NULL);
    pump(&p);
    assert_int_equal(p.srv.data[slot(id)], 60000);
    int32_t before = nghttp2_session_get_remote_window_size(p.ng);
    /* The glue answers early and never forwards the body. */
    assert_int_equal(sl_h2_submit_response(p.c, id, 413, NULL, 0, 1), SL_OK);
    assert_int_equal(sl_h2_reset_stream(p.c, id, SL_H2_NO_ERROR), SL_OK);
    pump(&p);
    assert_int_equal(p.srv.closed[slot(id)], 1);
    /* The response went out before the reset. */
    assert_int_equal(p.cli.statuses[slot(id)][0], 413);
    /* The connection window came back, so other streams are not starved. */
    assert_true(nghttp2_session_get_remote_window_size(p.ng) >= before + 60000);
    /* A late consume for the closed stream is ignored. */
    sl_h2_consume(p.c, id, 60000);
    pair_close(&p);
}

static void test_graceful_goaway(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, NULL, 0, 65536);
    int32_t a = get(&p, "/a"), b = get(&p, "/b");
    pump(&p);
    assert_int_equal(p.srv.requests, 2);
    sl_h2_goaway(p.c, 1);
    pump(&p);
    assert_int_equal(p.cli.goaway, 1);
    assert_int_equal(p.cli.goaway_code, NGHTTP2_NO_ERROR);
    assert_int_equal(p.cli.goaway_last, b);
    /* In flight: still served, and the connection still reads. */
    assert_true(sl_h2_conn_want_read(p.c));
    assert_int_equal(sl_h2_submit_response(p.c, a, 200, NULL, 0, 0), SL_OK);
    assert_int_equal(sl_h2_stream_write(p.c, a, (const uint8_t *)"aaa", 3, 1), 3);
    assert_int_equal(sl_h2_submit_response(p.c, b, 200, NULL, 0, 1), SL_OK);
    pump(&p);
    assert_int_equal(p.cli.body[slot(a)], 3);
    assert_int_equal(p.cli.end[slot(a)], 1);
    assert_int_equal(p.cli.end[slot(b)], 1);
    /* Done: the glue may close. */
    assert_false(sl_h2_conn_want_read(p.c));
    assert_false(sl_h2_conn_want_write(p.c));
    pair_close(&p);
}

static void test_goaway_refuses_streams_in_the_race(void **state)
{
    (void)state;
    raw_t r;
    raw_open(&r, NULL);
    headers(&r.w, r.d, 1, 1, base_get, 4);
    raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    /* GOAWAY submitted but not yet sent when stream 3 arrives. */
    sl_h2_goaway(r.c, 1);
    headers(&r.w, r.d, 3, 1, base_get, 4);
    assert_true(sl_h2_conn_feed(r.c, r.w.b, r.w.len) >= 0);
    r.w.len = 0;
    raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    assert_int_equal(r.srv.requests, 1);
    assert_int_equal(r.seen.goaway, 1);
    assert_int_equal(r.seen.goaway_code, 0);
    raw_close(&r);
}

static void test_stream_id_exhaustion_drains(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, NULL, 0, 65536);
    p.srv.respond_on_request = 1;
    get(&p, "/first");
    pump(&p);
    assert_int_equal(p.cli.goaway, 0);
    /* A client near the end of the id space. */
    assert_int_equal(nghttp2_session_set_next_stream_id(p.ng, 0x7fff0001), 0);
    int32_t id = get(&p, "/late");
    pump(&p);
    assert_int_equal(p.srv.requests, 2);
    assert_int_equal(p.cli.goaway, 1);
    assert_int_equal(p.cli.goaway_code, NGHTTP2_NO_ERROR);
    assert_int_equal(p.cli.goaway_last, id);
    /* The request still completes. */
    assert_int_equal(p.cli.statuses[slot(id)][0], 200);
    assert_int_equal(p.cli.body[slot(id)], 2);
    pair_close(&p);
}

static void test_idle_and_free_closes_streams(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, NULL, 0, 65536);
    assert_true(sl_h2_conn_idle(p.c));
    int32_t id = get(&p, "/x");
    pump(&p);
    assert_false(sl_h2_conn_idle(p.c));
    sl_h2_conn_free(p.c);
    /* Every announced stream gets its close, at the latest here. */
    assert_int_equal(p.srv.closed[slot(id)], 1);
    assert_int_equal(p.srv.close_code[slot(id)], SL_H2_CANCEL);
    p.c = sl_h2_conn_new(NULL, &srv_cb, &p.srv);
    pair_close(&p);
}

/* ---- tests: defences ---------------------------------------------------- */

static void test_rapid_reset(void **state)
{
    (void)state;
    pair_t p;
    sl_h2_settings_t set = {.aborted_streams_max = 20, .aborted_window_ms = 1000};
    pair_open(&p, &set, 0, 65536);
    pump(&p);
    /* HEADERS then RST_STREAM at once, 20 times in the window: allowed. */
    for (int i = 0; i < 20; i++) {
        int32_t id = get(&p, "/r");
        c2s(&p);
        nghttp2_submit_rst_stream(p.ng, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
        c2s(&p);
    }
    s2c(&p);
    assert_int_equal(p.cli.goaway, 0);
    /* A new window: 20 more are allowed again. */
    p.srv.now += 1000;
    for (int i = 0; i < 20; i++) {
        int32_t id = get(&p, "/r");
        c2s(&p);
        nghttp2_submit_rst_stream(p.ng, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
        c2s(&p);
    }
    s2c(&p);
    assert_int_equal(p.cli.goaway, 0);
    /* Resets of finished streams do not count. */
    p.srv.respond_on_request = 1;
    for (int i = 0; i < 5; i++) {
        int32_t id = get(&p, "/done");
        pump(&p);
        nghttp2_submit_rst_stream(p.ng, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
        pump(&p);
    }
    assert_int_equal(p.cli.goaway, 0);
    p.srv.respond_on_request = 0;
    /* The 21st in a window: GOAWAY ENHANCE_YOUR_CALM. */
    ssize_t last = 0;
    for (int i = 0; i < 21 && last >= 0; i++) {
        int32_t id = get(&p, "/r");
        c2s(&p);
        nghttp2_submit_rst_stream(p.ng, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
        c2s(&p);
        last = p.last_feed;
    }
    assert_int_equal(last, SL_ERROR);
    s2c(&p);
    assert_int_equal(p.cli.goaway, 1);
    assert_int_equal(p.cli.goaway_code, NGHTTP2_ENHANCE_YOUR_CALM);
    assert_false(sl_h2_conn_want_read(p.c));
    pair_close(&p);
}

static void test_server_reset_counts_too(void **state)
{
    (void)state;
    /* Streams the client makes us reset (CVE-2025-8671) count alike. */
    sl_h2_settings_t set = {.aborted_streams_max = 5};
    raw_t r;
    raw_open(&r, &set);
    static const nghttp2_nv bad[] = {NV(":method", "GET"), NV(":scheme", "https"),
                                     NV(":authority", "a"), NV(":path", "/"), NV("X-Up", "1")};
    ssize_t rv = 0;
    for (uint32_t i = 0; i < 6 && rv >= 0; i++) {
        headers(&r.w, r.d, 1 + 2 * i, 1, bad, 5);
        rv = raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    }
    assert_int_equal(rv, SL_ERROR);
    assert_int_equal(r.seen.goaway_code, NGHTTP2_ENHANCE_YOUR_CALM);
    raw_close(&r);
}

static void test_continuation_flood(void **state)
{
    (void)state;
    raw_t r;
    uint8_t blk[256];
    /* A valid block long enough to be cut into 1-byte frames. */
    static const nghttp2_nv padded[] = {NV(":method", "GET"),
                                        NV(":scheme", "https"),
                                        NV(":authority", "a"),
                                        NV(":path", "/"),
                                        {(uint8_t *)"x-pad",
                                         (uint8_t *)"0123456789012345678901234567890123456789", 5,
                                         40, NGHTTP2_NV_FLAG_NO_INDEX}};
    /* Too many frames: 8 CONTINUATIONs are allowed, the 9th is not. */
    raw_open(&r, NULL);
    size_t n = hpack(r.d, padded, 5, blk, sizeof(blk));
    assert_true(n > 20);
    frame(&r.w, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_STREAM, 1, blk, 1);
    for (int i = 0; i < 8; i++)
        frame(&r.w, NGHTTP2_CONTINUATION, 0, 1, blk + 1 + i, 1);
    size_t fed = r.w.len;
    assert_int_equal(raw_exchange(r.c, &r.srv, &r.w, &r.seen), (ssize_t)fed);
    /* An unfinished block: not idle, and the header timer can see it. */
    assert_false(sl_h2_conn_idle(r.c));
    assert_int_equal(sl_h2_conn_header_block_since(r.c), 1000);
    frame(&r.w, NGHTTP2_CONTINUATION, 0, 1, blk + 9, 1);
    assert_int_equal(raw_exchange(r.c, &r.srv, &r.w, &r.seen), SL_ERROR);
    assert_int_equal(r.seen.goaway, 1);
    assert_int_equal(r.seen.goaway_code, NGHTTP2_ENHANCE_YOUR_CALM);
    assert_int_equal(r.srv.requests, 0);
    (void)n;
    raw_close(&r);

    /* Under the frame limit but too many bytes: many 4 KiB fields. */
    raw_open(&r, NULL);
    static char big[4000];
    memset(big, 'v', sizeof(big));
    nghttp2_nv nv[40];
    memcpy(nv, base_get, sizeof(base_get));
    for (int i = 4; i < 40; i++)
        nv[i] = (nghttp2_nv){(uint8_t *)"x-big", (uint8_t *)big, 5, sizeof(big),
                             NGHTTP2_NV_FLAG_NO_INDEX};
    static uint8_t large[200000];
    n = hpack(r.d, nv, 40, large, sizeof(large));
    assert_true(n > 5 * 16384);
    frame(&r.w, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_STREAM, 1, large, 16384);
    size_t off = 16384;
    for (int i = 0; off < n && i < 7; i++) {
        size_t len = n - off < 16384 ? n - off : 16384;
        frame(&r.w, NGHTTP2_CONTINUATION, off + len == n ? NGHTTP2_FLAG_END_HEADERS : 0, 1,
              large + off, len);
        off += len;
    }
    assert_int_equal(raw_exchange(r.c, &r.srv, &r.w, &r.seen), SL_ERROR);
    assert_int_equal(r.seen.goaway_code, NGHTTP2_ENHANCE_YOUR_CALM);
    assert_int_equal(r.srv.requests, 0);
    raw_close(&r);

    /* Also when the block belongs to a stream nghttp2 ignores (refused):
     * then our callbacks do not see the CONTINUATIONs, nghttp2's cap does. */
    sl_h2_settings_t one = {.max_concurrent_streams = 1};
    raw_open(&r, &one);
    headers(&r.w, r.d, 1, 0, base_get, 4);
    n = hpack(r.d, padded, 5, blk, sizeof(blk));
    assert_true(n > 20);
    frame(&r.w, NGHTTP2_HEADERS, 0, 3, blk, 1);
    for (int i = 0; i < 9; i++)
        frame(&r.w, NGHTTP2_CONTINUATION, 0, 3, blk + 1 + i, 1);
    assert_int_equal(raw_exchange(r.c, &r.srv, &r.w, &r.seen), SL_ERROR);
    assert_int_equal(r.seen.goaway_code, NGHTTP2_ENHANCE_YOUR_CALM);
    raw_close(&r);
}

static void test_header_list_limits_431(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, NULL, 0, 65536);
    static char big[10000];
    memset(big, 'c', sizeof(big));
    /* 7 x 10 KB = 70 KB > 64 KiB. */
    nghttp2_nv nv[11];
    memcpy(nv, base_get, sizeof(base_get));
    for (int i = 4; i < 11; i++)
        nv[i] =
            (nghttp2_nv){(uint8_t *)"x-big", (uint8_t *)big, 5, sizeof(big), NGHTTP2_NV_FLAG_NONE};
    int32_t id = nghttp2_submit_request(p.ng, NULL, nv, 11, NULL, NULL);
    pump(&p);
    assert_int_equal(p.srv.requests, 0);
    assert_int_equal(p.cli.statuses[slot(id)][0], 431);
    assert_int_equal(p.srv.rejects, 1);
    assert_int_equal(p.srv.reject_status, 431);
    assert_int_equal(p.srv.closed[slot(id)], 0); /* never announced */
    assert_int_equal(p.cli.goaway, 0);
    /* 6 x 10 KB fits. */
    id = nghttp2_submit_request(p.ng, NULL, nv, 10, NULL, NULL);
    pump(&p);
    assert_int_equal(p.srv.requests, 1);
    /* Too many fields: 101 with the pseudo ones. */
    nghttp2_nv many[101];
    memcpy(many, base_get, sizeof(base_get));
    for (int i = 4; i < 101; i++)
        many[i] = (nghttp2_nv)NV("x-f", "1");
    id = nghttp2_submit_request(p.ng, NULL, many, 101, NULL, NULL);
    pump(&p);
    assert_int_equal(p.cli.statuses[slot(id)][0], 431);
    id = nghttp2_submit_request(p.ng, NULL, many, 100, NULL, NULL);
    pump(&p);
    assert_int_equal(p.srv.requests, 2);
    assert_int_equal(p.srv.num_headers, 96);
    /* A 431 for a request with a body: response, then RST_STREAM NO_ERROR. */
    size_t left = 10;
    nv[0] = (nghttp2_nv)NV(":method", "POST");
    nghttp2_data_provider prd = {.source.ptr = &left, .read_callback = body_read};
    id = nghttp2_submit_request(p.ng, NULL, nv, 11, &prd, NULL);
    pump(&p);
    assert_int_equal(p.cli.statuses[slot(id)][0], 431);
    assert_int_equal(p.srv.data[slot(id)], 0);
    pair_close(&p);
}

static void test_hpack_table_limits(void **state)
{
    (void)state;
    /* The client's encoder may not grow our decoder's table past 4096. */
    raw_t r;
    raw_open(&r, NULL);
    uint8_t blk[512];
    blk[0] = 0x3f; /* dynamic table size update to 8192 (5-bit prefix) */
    blk[1] = 0xe1;
    blk[2] = 0x3f;
    size_t n = hpack(r.d, base_get, 4, blk + 3, sizeof(blk) - 3);
    frame(&r.w, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_HEADERS | NGHTTP2_FLAG_END_STREAM, 1, blk, n + 3);
    raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    assert_int_equal(r.seen.goaway_code, NGHTTP2_COMPRESSION_ERROR);
    assert_int_equal(r.srv.requests, 0);
    raw_close(&r);

    /* A client allowing a huge table does not make our encoder use one. */
    pair_t p;
    pair_open(&p, NULL, 0, 65536);
    nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_HEADER_TABLE_SIZE, 1 << 24}};
    nghttp2_submit_settings(p.ng, NGHTTP2_FLAG_NONE, iv, 1);
    pump(&p);
    for (int i = 0; i < 50; i++) {
        int32_t id = get(&p, "/t");
        pump(&p);
        char name[32], value[300];
        snprintf(name, sizeof(name), "x-unique-%d", i);
        memset(value, 'a' + i % 26, sizeof(value));
        sl_header_t h[] = {{{name, strlen(name)}, {value, sizeof(value)}}};
        assert_int_equal(sl_h2_submit_response(p.c, id, 200, h, 1, 1), SL_OK);
        pump(&p);
    }
    /* The client's decoder mirrors our encoder's table. */
    assert_true(nghttp2_session_get_hd_inflate_dynamic_table_size(p.ng) <= 4096);
    assert_true(nghttp2_session_get_hd_inflate_dynamic_table_size(p.ng) > 0);
    pair_close(&p);
}

static void test_settings_flood(void **state)
{
    (void)state;
    raw_t r;
    /* A client that never reads: our SETTINGS ACKs pile up to the cap. */
    raw_open(&r, NULL);
    for (int i = 0; i < 200; i++)
        frame(&r.w, NGHTTP2_SETTINGS, 0, 0, NULL, 0);
    assert_int_equal(sl_h2_conn_feed(r.c, r.w.b, r.w.len), SL_ERROR);
    r.w.len = 0;
    raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    assert_int_equal(r.seen.goaway_code, NGHTTP2_ENHANCE_YOUR_CALM);
    assert_true(r.seen.settings_acks <= 128);
    raw_close(&r);

    /* A client that reads: 1000 per window are fine, the 1001st is not. */
    raw_open(&r, NULL);
    ssize_t rv = 0;
    int sent = 0;
    for (int i = 0; i < 1100 && rv >= 0; i++) {
        frame(&r.w, NGHTTP2_SETTINGS, 0, 0, NULL, 0);
        sent++;
        rv = raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    }
    assert_int_equal(rv, SL_ERROR);
    assert_int_equal(sent, 1000); /* the preface's SETTINGS is the first */
    assert_int_equal(r.seen.goaway_code, NGHTTP2_ENHANCE_YOUR_CALM);
    raw_close(&r);

    /* Too many entries in one SETTINGS frame. */
    raw_open(&r, NULL);
    uint8_t iv[33 * 6];
    for (int i = 0; i < 33; i++) {
        uint8_t e[6] = {0, NGHTTP2_SETTINGS_MAX_FRAME_SIZE, 0, 0, 0x40, 0};
        memcpy(iv + i * 6, e, 6);
    }
    frame(&r.w, NGHTTP2_SETTINGS, 0, 0, iv, sizeof(iv));
    /* nghttp2 declares this one itself: the input is consumed, GOAWAY
     * queued, nothing more is read. */
    raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    assert_int_equal(r.seen.goaway_code, NGHTTP2_ENHANCE_YOUR_CALM);
    assert_false(sl_h2_conn_want_read(r.c));
    raw_close(&r);
}

static void test_ping_flood(void **state)
{
    (void)state;
    raw_t r;
    raw_open(&r, NULL);
    for (int i = 0; i < 300; i++)
        frame(&r.w, NGHTTP2_PING, 0, 0, "pingpong", 8);
    assert_int_equal(sl_h2_conn_feed(r.c, r.w.b, r.w.len), SL_ERROR);
    r.w.len = 0;
    raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    assert_int_equal(r.seen.goaway_code, NGHTTP2_ENHANCE_YOUR_CALM);
    assert_true(r.seen.ping_acks <= 128);
    raw_close(&r);

    /* Reading client, pings over the per-window budget. */
    sl_h2_settings_t set = {.ctrl_frames_max = 50, .ctrl_window_ms = 1000};
    raw_open(&r, &set);
    ssize_t rv = 0;
    int i;
    for (i = 0; i < 49; i++) {
        frame(&r.w, NGHTTP2_PING, 0, 0, "pingpong", 8);
        rv = raw_exchange(r.c, &r.srv, &r.w, &r.seen);
        assert_true(rv >= 0);
    }
    assert_int_equal(r.seen.ping_acks, 49);
    r.srv.now += 1000; /* a new window */
    for (i = 0; i < 60 && rv >= 0; i++) {
        frame(&r.w, NGHTTP2_PING, 0, 0, "pingpong", 8);
        rv = raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    }
    assert_int_equal(i, 51);
    assert_int_equal(rv, SL_ERROR);
    assert_int_equal(r.seen.goaway_code, NGHTTP2_ENHANCE_YOUR_CALM);
    raw_close(&r);
}

static void test_empty_data_flood(void **state)
{
    (void)state;
    static const nghttp2_nv post[] = {NV(":method", "POST"), NV(":scheme", "https"),
                                      NV(":authority", "a"), NV(":path", "/")};
    raw_t r;
    raw_open(&r, NULL);
    headers(&r.w, r.d, 1, 0, post, 4);
    for (int i = 0; i < 100; i++)
        frame(&r.w, NGHTTP2_DATA, 0, 1, NULL, 0);
    /* A frame with payload ends the run. */
    frame(&r.w, NGHTTP2_DATA, 0, 1, "x", 1);
    for (int i = 0; i < 100; i++)
        frame(&r.w, NGHTTP2_DATA, 0, 1, NULL, 0);
    assert_true(raw_exchange(r.c, &r.srv, &r.w, &r.seen) >= 0);
    assert_int_equal(r.seen.goaway, 0);
    frame(&r.w, NGHTTP2_DATA, 0, 1, NULL, 0);
    assert_int_equal(raw_exchange(r.c, &r.srv, &r.w, &r.seen), SL_ERROR);
    assert_int_equal(r.seen.goaway_code, NGHTTP2_ENHANCE_YOUR_CALM);
    assert_int_equal(r.srv.data[0], 1);
    raw_close(&r);
}

static void test_window_update_flood(void **state)
{
    (void)state;
    raw_t r;
    raw_open(&r, NULL);
    const uint8_t inc[4] = {0, 0, 0, 1};
    /* Before any DATA from us: 64 + 10 are tolerated. */
    for (int i = 0; i < 74; i++)
        frame(&r.w, NGHTTP2_WINDOW_UPDATE, 0, 0, inc, 4);
    assert_true(raw_exchange(r.c, &r.srv, &r.w, &r.seen) >= 0);
    assert_int_equal(r.seen.goaway, 0);
    /* Each request and each DATA frame we send allow 10 more. */
    headers(&r.w, r.d, 1, 1, base_get, 4);
    raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    assert_int_equal(sl_h2_submit_response(r.c, 1, 200, NULL, 0, 0), SL_OK);
    assert_int_equal(sl_h2_stream_write(r.c, 1, (const uint8_t *)"x", 1, 1), 1);
    raw_exchange(r.c, &r.srv, &r.w, &r.seen);
    for (int i = 0; i < 20; i++)
        frame(&r.w, NGHTTP2_WINDOW_UPDATE, 0, 0, inc, 4);
    assert_true(raw_exchange(r.c, &r.srv, &r.w, &r.seen) >= 0);
    assert_int_equal(r.seen.goaway, 0);
    frame(&r.w, NGHTTP2_WINDOW_UPDATE, 0, 0, inc, 4);
    assert_int_equal(raw_exchange(r.c, &r.srv, &r.w, &r.seen), SL_ERROR);
    assert_int_equal(r.seen.goaway_code, NGHTTP2_ENHANCE_YOUR_CALM);
    raw_close(&r);
}

static void test_goaway_frames_count_as_control(void **state)
{
    (void)state;
    sl_h2_settings_t set = {.ctrl_frames_max = 10};
    raw_t r;
    raw_open(&r, &set);
    const uint8_t ga[8] = {0};
    /* A stream in flight keeps the connection readable after a GOAWAY (with
     * none, nghttp2 stops reading and the glue closes). The preface's
     * SETTINGS is the first control frame. */
    headers(&r.w, r.d, 1, 1, base_get, 4);
    for (int i = 0; i < 9; i++)
        frame(&r.w, NGHTTP2_GOAWAY, 0, 0, ga, 8);
    assert_true(raw_exchange(r.c, &r.srv, &r.w, &r.seen) >= 0);
    assert_int_equal(r.seen.goaway, 0);
    frame(&r.w, NGHTTP2_GOAWAY, 0, 0, ga, 8);
    assert_int_equal(raw_exchange(r.c, &r.srv, &r.w, &r.seen), SL_ERROR);
    assert_int_equal(r.seen.goaway_code, NGHTTP2_ENHANCE_YOUR_CALM);
    raw_close(&r);
}

static void test_immediate_goaway(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, NULL, 0, 65536);
    int32_t id = get(&p, "/x");
    pump(&p);
    sl_h2_goaway(p.c, 0);
    pump(&p);
    assert_int_equal(p.cli.goaway, 1);
    assert_int_equal(p.cli.goaway_code, NGHTTP2_NO_ERROR);
    assert_false(sl_h2_conn_want_read(p.c));
    assert_false(sl_h2_conn_want_write(p.c));
    sl_h2_conn_free(p.c);
    assert_int_equal(p.srv.closed[slot(id)], 1);
    assert_int_equal(p.srv.close_code[slot(id)], SL_H2_CANCEL);
    p.c = sl_h2_conn_new(NULL, &srv_cb, &p.srv);
    pair_close(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_preface),
        cmocka_unit_test(test_bad_preface_is_connection_error),
        cmocka_unit_test(test_get_head),
        cmocka_unit_test(test_query_empty_and_host_only),
        cmocka_unit_test(test_cookie_join_that_moves_the_scratch),
        cmocka_unit_test(test_post_body_and_consume),
        cmocka_unit_test(test_response_body_trailers_and_103),
        cmocka_unit_test(test_response_field_rules),
        cmocka_unit_test(test_request_trailers),
        cmocka_unit_test(test_rfc9113_request_rules),
        cmocka_unit_test(test_content_length_vs_data),
        cmocka_unit_test(test_connection_errors),
        cmocka_unit_test(test_extended_connect),
        cmocka_unit_test(test_enable_connect_protocol_setting),
        cmocka_unit_test(test_concurrent_streams_limit),
        cmocka_unit_test(test_flow_control_per_stream),
        cmocka_unit_test(test_output_never_exceeds_buffer),
        cmocka_unit_test(test_unconsumed_body_credited_on_close),
        cmocka_unit_test(test_graceful_goaway),
        cmocka_unit_test(test_goaway_refuses_streams_in_the_race),
        cmocka_unit_test(test_stream_id_exhaustion_drains),
        cmocka_unit_test(test_idle_and_free_closes_streams),
        cmocka_unit_test(test_rapid_reset),
        cmocka_unit_test(test_server_reset_counts_too),
        cmocka_unit_test(test_continuation_flood),
        cmocka_unit_test(test_header_list_limits_431),
        cmocka_unit_test(test_hpack_table_limits),
        cmocka_unit_test(test_settings_flood),
        cmocka_unit_test(test_ping_flood),
        cmocka_unit_test(test_empty_data_flood),
        cmocka_unit_test(test_window_update_flood),
        cmocka_unit_test(test_goaway_frames_count_as_control),
        cmocka_unit_test(test_immediate_goaway),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
