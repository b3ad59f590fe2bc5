/*
 * HTTP/2 server codec on nghttp2 (h2.h says what it does and what the glue
 * does). nghttp2 owns framing, HPACK, stream states and the RFC 9113 request
 * checks of its "HTTP messaging" mode; this file adds what a gateway needs on
 * top and what the library leaves to its user:
 *
 *   - the request head as an sl_req_head_t: fields copied into one
 *     per-connection scratch area while the header block is decoded (a block
 *     is never interleaved with another, RFC 9113 4.3, so one area serves
 *     every stream), :authority/Host and :path checked and split, cookies
 *     joined (8.2.3);
 *   - bounded request bodies: automatic WINDOW_UPDATEs are off, so a DATA
 *     byte is credited back only when the glue has forwarded it
 *     (sl_h2_consume), or when its stream ends first;
 *   - bounded response bodies: a send buffer per stream, filled by
 *     sl_h2_stream_write under a per-stream and a per-connection bound and
 *     drained by nghttp2's data provider without a copy of its own
 *     (NGHTTP2_DATA_FLAG_NO_COPY: the DATA frame is written straight from the
 *     stream buffer into the glue's output buffer);
 *   - the defences nghttp2 1.52 lacks or does differently: the header-list
 *     size and field count it advertises but does not enforce, the encoded
 *     size of a block, aborted-stream counting (client resets and client-
 *     caused stream errors, not every RST_STREAM as its token bucket does),
 *     control-frame and empty-DATA floods, stall and header-block times for
 *     the glue's timers, a drain before stream ids run out.
 *
 * nghttp2 callbacks run inside nghttp2_session_mem_recv (feed) or
 * nghttp2_session_send (flush). A connection error found in a callback
 * queues GOAWAY (nghttp2_session_terminate_session) and makes the callback
 * fail, so mem_recv stops at once and feed returns SL_ERROR.
 */
#include "h2.h"

#include <nghttp2/nghttp2.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { P_METHOD, P_SCHEME, P_AUTHORITY, P_PATH, P_PROTOCOL, P_COUNT };

/* A field inside the header scratch area, by offset: the area may move
 * while it grows. */
typedef struct {
    uint32_t name_off, name_len, value_off, value_len;
} hfield_t;

typedef struct h2_stream h2_stream_t;
struct h2_stream {
    int32_t id;
    h2_stream_t *prev, *next;
    sl_buf_t out;            /* response body bytes not yet framed */
    uint64_t unconsumed;     /* request body delivered, not yet sl_h2_consume'd */
    uint64_t stall_since_ms; /* waiting for the client's window since, 0 = not */
    nghttp2_nv *trailers;    /* one allocation: the array, then its bytes */
    size_t n_trailers;
    uint8_t announced;      /* on_request was called */
    uint8_t rejected;       /* answered by the codec (431) or refused */
    uint8_t final_sent;     /* final response head submitted */
    uint8_t has_provider;   /* ...with a body to come */
    uint8_t out_eof;        /* the glue has written the whole body */
    uint8_t done_sent;      /* our END_STREAM has gone out */
    uint8_t deferred;       /* the data provider waits for sl_h2_stream_write */
    uint8_t want_writable;  /* a write was cut short: on_stream_writable owed */
    uint8_t rst_after_head; /* RST_STREAM NO_ERROR once our response head is out */
};

struct sl_h2_conn {
    nghttp2_session *ng;
    sl_h2_settings_t set;
    sl_h2_callbacks_t cb;
    void *user;

    h2_stream_t *streams; /* every stream we hold state for */
    uint32_t nstreams;
    size_t send_buffered; /* sum of the streams' out buffers */
    sl_buf_t *out;        /* the glue's buffer, during a flush only */
    uint8_t busy;         /* inside feed or flush */
    uint8_t failed;       /* a connection error was declared */
    uint8_t freeing;
    uint8_t draining;      /* our GOAWAY is submitted: */
    int32_t drain_last_id; /* streams above this id are refused */

    /* The header block being received (one at a time per connection). */
    struct {
        int32_t stream_id; /* 0: nothing being collected */
        uint8_t trailers;
        uint8_t too_large;
        uint32_t fields;     /* seen, pseudo included */
        uint64_t list_bytes; /* RFC 9113 6.5.2 size */
        uint64_t wire_bytes; /* HEADERS + CONTINUATION payloads */
        uint32_t continuations;
        uint64_t since_ms; /* unfinished block began, 0 = none */
        char *mem;
        size_t len, cap;
        hfield_t *f;
        size_t n;
        hfield_t pseudo[P_COUNT];
        uint8_t have[P_COUNT];
        uint32_t cookies, hosts;
    } hb;
    sl_header_t *fields_out; /* max_header_fields, built at delivery */

    char *nvmem; /* response fields lower-cased, max_response_header_bytes */

    uint64_t ctrl_since_ms;
    uint32_t ctrl_count;
    uint64_t abort_since_ms;
    uint32_t abort_count;
    uint32_t empty_data_run;
    uint64_t window_updates; /* received, over the connection's life */
    uint64_t data_frames_sent;

    sl_h2_stats_t st;
};

static const char PREFACE[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
#define PREFACE_LEN (sizeof(PREFACE) - 1)

/* Headroom of an encoded header block over the decoded list limit: HPACK
 * only shrinks fields, so only padding and table-size updates can make the
 * wire form larger, and never by a frame's worth. */
#define BLOCK_SLACK_BYTES 16384

/* Above this, the header scratch is freed once its block was delivered, so
 * an idle connection keeps no large buffer. */
#define HB_KEEP_BYTES 8192

/* Host (RFC 3986 reg-name / IPv4): unreserved, pct-encoded, sub-delims; the
 * same set as runtime/http/http1.c so both codecs route the same names. */
static const uint8_t host_tab[256] = {
    ['-'] = 1, ['.'] = 1,         ['_'] = 1,         ['~'] = 1,         ['%'] = 1,
    ['!'] = 1, ['$'] = 1,         ['&'] = 1,         ['\''] = 1,        ['('] = 1,
    [')'] = 1, ['*'] = 1,         ['+'] = 1,         [','] = 1,         [';'] = 1,
    ['='] = 1, ['0' ... '9'] = 1, ['A' ... 'Z'] = 1, ['a' ... 'z'] = 1,
};

static const uint8_t hex_tab[256] = {
    ['0' ... '9'] = 1,
    ['A' ... 'F'] = 1,
    ['a' ... 'f'] = 1,
};

/* RFC 9110 tchar. */
static const uint8_t tchar_tab[256] = {
    ['!'] = 1, ['#'] = 1, ['$'] = 1, ['%'] = 1,         ['&'] = 1,         ['\''] = 1,
    ['*'] = 1, ['+'] = 1, ['-'] = 1, ['.'] = 1,         ['^'] = 1,         ['_'] = 1,
    ['`'] = 1, ['|'] = 1, ['~'] = 1, ['0' ... '9'] = 1, ['A' ... 'Z'] = 1, ['a' ... 'z'] = 1,
};

/* ---- small helpers ------------------------------------------------------ */

static uint64_t now_ms(sl_h2_conn_t *c)
{
    uint64_t t;
    if (c->cb.now_ms) {
        t = c->cb.now_ms(c->user);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        t = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    }
    /* 0 means "not waiting" in the stall and header-block times. */
    return t ? t : 1;
}

static int lit_eq(const char *p, size_t n, const char *lit)
{
    size_t l = strlen(lit);
    return n == l && memcmp(p, lit, l) == 0;
}

static h2_stream_t *stream_get(sl_h2_conn_t *c, int32_t id)
{
    if (id <= 0)
        return NULL;
    return nghttp2_session_get_stream_user_data(c->ng, id);
}

/*
 * A connection error found inside a callback: GOAWAY with `code` after
 * whatever is queued, and a callback failure so that mem_recv stops here.
 */
static int conn_fail(sl_h2_conn_t *c, uint32_t code)
{
    if (!c->failed) {
        c->failed = 1;
        c->st.goaway_code = code;
        nghttp2_session_terminate_session(c->ng, code);
    }
    return NGHTTP2_ERR_CALLBACK_FAILURE;
}

/* Counts `c->*count` in a fixed window of window_ms; 1 when over max. */
static int window_count(sl_h2_conn_t *c, uint64_t *since, uint32_t *count, uint32_t window_ms,
                        uint32_t max)
{
    uint64_t now = now_ms(c);
    if (*since == 0 || now - *since >= window_ms) {
        *since = now;
        *count = 0;
    }
    return ++*count > max;
}

/* A stream the client ended early or made us reset (rapid reset and its
 * server-reset variant): too many per window is a connection error. */
static int count_abort(sl_h2_conn_t *c)
{
    c->st.aborted_streams++;
    if (window_count(c, &c->abort_since_ms, &c->abort_count, c->set.aborted_window_ms,
                     c->set.aborted_streams_max))
        return conn_fail(c, SL_H2_ENHANCE_YOUR_CALM);
    return 0;
}

static int count_ctrl(sl_h2_conn_t *c)
{
    if (window_count(c, &c->ctrl_since_ms, &c->ctrl_count, c->set.ctrl_window_ms,
                     c->set.ctrl_frames_max))
        return conn_fail(c, SL_H2_ENHANCE_YOUR_CALM);
    return 0;
}

static void stream_free(sl_h2_conn_t *c, h2_stream_t *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        c->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    c->nstreams--;
    c->send_buffered -= sl_buf_len(&s->out);
    sl_buf_free(&s->out);
    free(s->trailers);
    free(s);
}

/* ---- the header block --------------------------------------------------- */

/*
 * The field arrays exist only while the connection has streams: an idle
 * keep-alive connection then holds nghttp2's session and this struct only.
 */
static int hb_arrays(sl_h2_conn_t *c)
{
    if (!c->hb.f)
        c->hb.f = malloc(c->set.max_header_fields * sizeof(*c->hb.f));
    if (!c->fields_out)
        c->fields_out = malloc(c->set.max_header_fields * sizeof(*c->fields_out));
    return c->hb.f && c->fields_out ? SL_OK : SL_ERROR;
}

static void hb_release(sl_h2_conn_t *c)
{
    free(c->hb.f);
    free(c->fields_out);
    free(c->hb.mem);
    c->hb.f = NULL;
    c->fields_out = NULL;
    c->hb.mem = NULL;
    c->hb.cap = c->hb.len = 0;
}

static void hb_begin(sl_h2_conn_t *c, int32_t stream_id, int trailers)
{
    c->hb.stream_id = stream_id;
    c->hb.trailers = (uint8_t)trailers;
    c->hb.too_large = 0;
    c->hb.fields = 0;
    c->hb.list_bytes = 0;
    c->hb.len = 0;
    c->hb.n = 0;
    c->hb.cookies = 0;
    c->hb.hosts = 0;
    memset(c->hb.have, 0, sizeof(c->hb.have));
}

static void hb_end(sl_h2_conn_t *c)
{
    c->hb.stream_id = 0;
    if (c->hb.cap > HB_KEEP_BYTES) {
        free(c->hb.mem);
        c->hb.mem = NULL;
        c->hb.cap = 0;
    }
    c->hb.len = 0;
}

/* Appends n bytes (p NULL: only reserves them) to the scratch area; growth
 * stays under twice the list limit (fields within the limit, plus one
 * joined cookie value). */
static int hb_append(sl_h2_conn_t *c, const void *p, size_t n, uint32_t *off)
{
    size_t need = c->hb.len + n;
    if (need > c->hb.cap) {
        size_t bound = (size_t)c->set.max_header_list_bytes * 2 + 64;
        size_t cap = c->hb.cap ? c->hb.cap * 2 : 1024;
        while (cap < need)
            cap *= 2;
        if (cap > bound)
            cap = bound;
        if (cap < need)
            return SL_ERROR;
        char *m = realloc(c->hb.mem, cap);
        if (!m)
            return SL_ERROR;
        c->hb.mem = m;
        c->hb.cap = cap;
    }
    if (p && n)
        memcpy(c->hb.mem + c->hb.len, p, n);
    *off = (uint32_t)c->hb.len;
    c->hb.len = need;
    return SL_OK;
}

static sl_str_t hb_str(const sl_h2_conn_t *c, uint32_t off, uint32_t len)
{
    return (sl_str_t){c->hb.mem + off, len};
}

static int pseudo_index(const uint8_t *name, size_t len)
{
    const char *n = (const char *)name;
    if (lit_eq(n, len, ":method"))
        return P_METHOD;
    if (lit_eq(n, len, ":scheme"))
        return P_SCHEME;
    if (lit_eq(n, len, ":authority"))
        return P_AUTHORITY;
    if (lit_eq(n, len, ":path"))
        return P_PATH;
    if (lit_eq(n, len, ":protocol"))
        return P_PROTOCOL;
    return -1;
}

/*
 * :authority / Host: uri-host [ ":" port ] (no userinfo, RFC 9113 8.3.1).
 * `host` gets it without the port; an IP literal keeps its brackets.
 */
static int parse_authority(sl_str_t v, sl_str_t *host)
{
    const char *p = v.ptr, *end = v.ptr + v.len;
    if (v.len == 0)
        return SL_ERROR;
    if (*p == '[') {
        p++;
        while (p < end && (hex_tab[(unsigned char)*p] || *p == ':' || *p == '.'))
            p++;
        if (p == end || *p != ']' || p == v.ptr + 1)
            return SL_ERROR;
        p++;
    } else {
        while (p < end && host_tab[(unsigned char)*p])
            p++;
        if (p == v.ptr)
            return SL_ERROR;
    }
    const char *host_end = p;
    if (p < end) {
        if (*p != ':' || end - p - 1 > 5)
            return SL_ERROR;
        for (p++; p < end; p++)
            if (*p < '0' || *p > '9')
                return SL_ERROR;
    }
    host->ptr = v.ptr;
    host->len = (size_t)(host_end - v.ptr);
    return SL_OK;
}

/* :path goes into an HTTP/1.1 request line upstream: no byte that could end
 * or split that line, and no fragment (RFC 9113 8.3.1). */
static int path_ok(sl_str_t p)
{
    for (size_t i = 0; i < p.len; i++) {
        unsigned char ch = (unsigned char)p.ptr[i];
        if (ch <= 0x20 || ch == 0x7f || ch == '#')
            return 0;
    }
    return 1;
}

static int parse_content_length(sl_str_t v, uint64_t *out)
{
    uint64_t n = 0;
    if (v.len == 0 || v.len > 19)
        return SL_ERROR;
    for (size_t i = 0; i < v.len; i++) {
        if (v.ptr[i] < '0' || v.ptr[i] > '9')
            return SL_ERROR;
        n = n * 10 + (uint64_t)(v.ptr[i] - '0');
    }
    *out = n;
    return SL_OK;
}

/* A stream error we decide ourselves (the client's fault). */
static int stream_error(sl_h2_conn_t *c, h2_stream_t *s, uint32_t code)
{
    s->rejected = 1;
    nghttp2_submit_rst_stream(c->ng, NGHTTP2_FLAG_NONE, s->id, code);
    return count_abort(c);
}

/* Joins several Cookie fields into the first (RFC 9113 8.2.3) and builds the
 * field array the callbacks get. Returns the count, or SL_ERROR. */
static ssize_t build_fields(sl_h2_conn_t *c, int join_cookies)
{
    size_t first_cookie = SIZE_MAX;
    if (join_cookies && c->hb.cookies > 1) {
        /* The joined value goes at the end of the scratch area; the other
         * Cookie fields are dropped below. */
        uint32_t start = (uint32_t)c->hb.len, off;
        int first = 1;
        for (size_t i = 0; i < c->hb.n; i++) {
            hfield_t *f = &c->hb.f[i];
            if (!lit_eq(c->hb.mem + f->name_off, f->name_len, "cookie"))
                continue;
            if (first_cookie == SIZE_MAX)
                first_cookie = i;
            if (!first && hb_append(c, "; ", 2, &off) != SL_OK)
                return SL_ERROR;
            first = 0;
            /* hb_append may move mem: copy through a stable offset. */
            uint32_t voff = f->value_off, vlen = f->value_len;
            if (hb_append(c, NULL, vlen, &off) != SL_OK)
                return SL_ERROR;
            memcpy(c->hb.mem + off, c->hb.mem + voff, vlen);
        }
        c->hb.f[first_cookie].value_off = start;
        c->hb.f[first_cookie].value_len = (uint32_t)(c->hb.len - start);
    }
    size_t k = 0;
    for (size_t i = 0; i < c->hb.n; i++) {
        hfield_t *f = &c->hb.f[i];
        if (first_cookie != SIZE_MAX && i != first_cookie &&
            lit_eq(c->hb.mem + f->name_off, f->name_len, "cookie"))
            continue;
        c->fields_out[k].name = hb_str(c, f->name_off, f->name_len);
        c->fields_out[k].value = hb_str(c, f->value_off, f->value_len);
        k++;
    }
    return (ssize_t)k;
}

/* 431 from the codec: the head was over the limits, so no head to announce. */
static int reject_431(sl_h2_conn_t *c, h2_stream_t *s, int end_stream)
{
    static const nghttp2_nv nv[] = {
        {(uint8_t *)":status", (uint8_t *)"431", 7, 3, NGHTTP2_NV_FLAG_NONE},
    };
    s->rejected = 1;
    c->st.rejected++;
    nghttp2_submit_response(c->ng, s->id, nv, 1, NULL);
    /* A complete response, then "stop sending, no error" (RFC 9113 8.1);
     * only once the response is out: nghttp2 drops a queued head of a
     * stream it is resetting. */
    s->rst_after_head = !end_stream;
    if (c->cb.on_reject)
        c->cb.on_reject(c->user, s->id, 431, "request header list over the limit");
    return count_abort(c);
}

static int deliver_request(sl_h2_conn_t *c, h2_stream_t *s, int end_stream)
{
    if (c->hb.too_large)
        return reject_431(c, s, end_stream);

    sl_req_head_t h;
    sl_h2_req_info_t info = {0};
    memset(&h, 0, sizeof(h));
    /* First: joining cookies may move the scratch area, so no slice of it
     * may be taken before (a fuzz_h2_frames finding). */
    ssize_t nf = build_fields(c, 1);
    if (nf < 0)
        return stream_error(c, s, SL_H2_INTERNAL_ERROR);
    h.headers = c->fields_out;
    h.num_headers = (size_t)nf;
    if (!c->hb.have[P_METHOD])
        return stream_error(c, s, SL_H2_PROTOCOL_ERROR);
    h.method = hb_str(c, c->hb.pseudo[P_METHOD].value_off, c->hb.pseudo[P_METHOD].value_len);
    h.method_bit = sl_http1_method_bit(h.method.ptr, h.method.len);
    int connect = h.method_bit == SL_METHOD_CONNECT;
    if (c->hb.have[P_SCHEME])
        info.scheme = hb_str(c, c->hb.pseudo[P_SCHEME].value_off, c->hb.pseudo[P_SCHEME].value_len);
    if (c->hb.have[P_PROTOCOL]) {
        if (!connect)
            return stream_error(c, s, SL_H2_PROTOCOL_ERROR);
        info.protocol =
            hb_str(c, c->hb.pseudo[P_PROTOCOL].value_off, c->hb.pseudo[P_PROTOCOL].value_len);
        info.flags |= SL_H2_REQ_EXTENDED_CONNECT;
    }
    if (end_stream)
        info.flags |= SL_H2_REQ_END_STREAM;

    /* :authority wins over Host; Host alone stands in for it. One Host at
     * most, as for HTTP/1.1. */
    if (c->hb.hosts > 1)
        return stream_error(c, s, SL_H2_PROTOCOL_ERROR);
    if (c->hb.have[P_AUTHORITY]) {
        h.authority =
            hb_str(c, c->hb.pseudo[P_AUTHORITY].value_off, c->hb.pseudo[P_AUTHORITY].value_len);
    } else {
        const sl_header_t *host = sl_http1_find_header(h.headers, h.num_headers, "host", 4);
        if (host)
            h.authority = host->value;
    }
    if (h.authority.len == 0 || parse_authority(h.authority, &h.host) != SL_OK)
        return stream_error(c, s, SL_H2_PROTOCOL_ERROR);

    if (c->hb.have[P_PATH]) {
        sl_str_t p = hb_str(c, c->hb.pseudo[P_PATH].value_off, c->hb.pseudo[P_PATH].value_len);
        if (!path_ok(p))
            return stream_error(c, s, SL_H2_PROTOCOL_ERROR);
        if (lit_eq(p.ptr, p.len, "*")) {
            if (h.method_bit != SL_METHOD_OPTIONS)
                return stream_error(c, s, SL_H2_PROTOCOL_ERROR);
        } else if (p.len == 0 || p.ptr[0] != '/') {
            return stream_error(c, s, SL_H2_PROTOCOL_ERROR);
        }
        h.target = p;
        const char *q = memchr(p.ptr, '?', p.len);
        if (q) {
            h.path = (sl_str_t){p.ptr, (size_t)(q - p.ptr)};
            h.query = (sl_str_t){q + 1, p.len - h.path.len - 1};
            h.has_query = 1;
        } else {
            h.path = p;
        }
    } else if (!connect || c->hb.have[P_PROTOCOL]) {
        /* nghttp2 checks this too; the head must never lack a path. */
        return stream_error(c, s, SL_H2_PROTOCOL_ERROR);
    }

    const sl_header_t *cl = sl_http1_find_header(h.headers, h.num_headers, "content-length", 14);
    if (cl) {
        if (parse_content_length(cl->value, &h.content_length) != SL_OK)
            return stream_error(c, s, SL_H2_PROTOCOL_ERROR);
        h.has_length = 1;
    } else if (end_stream) {
        h.has_length = 1;
        h.content_length = 0;
    }
    h.version = 20;

    s->announced = 1;
    c->st.requests++;
    if (c->cb.on_request)
        c->cb.on_request(c->user, s->id, &h, &info);
    /* Stream ids end at 2^31-1: drain while the streams in flight can
     * still finish, so the client moves to a new connection cleanly. */
    if ((uint32_t)s->id >= c->set.drain_stream_id && !c->draining)
        sl_h2_goaway(c, 1);
    return 0;
}

static int deliver_trailers(sl_h2_conn_t *c, h2_stream_t *s)
{
    if (!s->announced || s->rejected)
        return 0;
    if (c->hb.too_large)
        return stream_error(c, s, SL_H2_ENHANCE_YOUR_CALM);
    ssize_t nf = build_fields(c, 0);
    if (nf < 0)
        return stream_error(c, s, SL_H2_INTERNAL_ERROR);
    if (c->cb.on_trailers)
        c->cb.on_trailers(c->user, s->id, c->fields_out, (size_t)nf);
    if (c->cb.on_data)
        c->cb.on_data(c->user, s->id, NULL, 0, 1);
    return 0;
}

/* ---- nghttp2 callbacks: input ------------------------------------------- */

static int on_begin_frame(nghttp2_session *ng, const nghttp2_frame_hd *hd, void *user)
{
    (void)ng;
    sl_h2_conn_t *c = user;
    uint64_t block_limit = (uint64_t)c->set.max_header_list_bytes + BLOCK_SLACK_BYTES;

    if (hd->type == NGHTTP2_CONTINUATION) {
        c->hb.wire_bytes += hd->length;
        if (++c->hb.continuations > c->set.max_continuations || c->hb.wire_bytes > block_limit)
            return conn_fail(c, SL_H2_ENHANCE_YOUR_CALM);
        if (hd->flags & NGHTTP2_FLAG_END_HEADERS)
            c->hb.since_ms = 0;
        return 0;
    }
    /* Any other frame means the previous header block has ended (blocks are
     * contiguous), including one nghttp2 decoded without our callbacks. */
    c->hb.since_ms = 0;
    if (hd->type == NGHTTP2_HEADERS) {
        c->hb.wire_bytes = hd->length;
        c->hb.continuations = 0;
        if (c->hb.wire_bytes > block_limit)
            return conn_fail(c, SL_H2_ENHANCE_YOUR_CALM);
        if (!(hd->flags & NGHTTP2_FLAG_END_HEADERS))
            c->hb.since_ms = now_ms(c);
    }
    return 0;
}

static int on_begin_headers(nghttp2_session *ng, const nghttp2_frame *frame, void *user)
{
    sl_h2_conn_t *c = user;
    int32_t id = frame->hd.stream_id;

    if (frame->headers.cat == NGHTTP2_HCAT_REQUEST) {
        c->hb.stream_id = 0;
        /* After our GOAWAY was submitted but before it went out, nghttp2
         * still opens streams: refuse them, they were never processed. */
        if (c->draining && id > c->drain_last_id) {
            nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, id, SL_H2_REFUSED_STREAM);
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        }
        h2_stream_t *s = hb_arrays(c) == SL_OK ? calloc(1, sizeof(*s)) : NULL;
        if (!s)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
        s->id = id;
        s->next = c->streams;
        if (c->streams)
            c->streams->prev = s;
        c->streams = s;
        c->nstreams++;
        nghttp2_session_set_stream_user_data(ng, id, s);
        hb_begin(c, id, 0);
    } else if (frame->headers.cat == NGHTTP2_HCAT_HEADERS) {
        /* A stream exists, so the arrays do. */
        hb_begin(c, stream_get(c, id) ? id : 0, 1);
    }
    return 0;
}

static int on_header(nghttp2_session *ng, const nghttp2_frame *frame, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                     void *user)
{
    (void)ng;
    (void)flags;
    sl_h2_conn_t *c = user;
    if (c->hb.stream_id == 0 || frame->hd.stream_id != c->hb.stream_id)
        return 0;
    /* Count everything, store nothing once over a limit: the block must still
     * be decoded to keep the HPACK state in step, and its end answered. */
    c->hb.fields++;
    c->hb.list_bytes += namelen + valuelen + 32;
    if (c->hb.list_bytes > c->set.max_header_list_bytes || c->hb.fields > c->set.max_header_fields)
        c->hb.too_large = 1;
    if (c->hb.too_large)
        return 0;

    hfield_t f = {.name_len = (uint32_t)namelen, .value_len = (uint32_t)valuelen};
    if (hb_append(c, name, namelen, &f.name_off) != SL_OK ||
        hb_append(c, value, valuelen, &f.value_off) != SL_OK)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    if (namelen > 0 && name[0] == ':') {
        /* nghttp2 has refused unknown, repeated and misplaced ones. */
        int i = pseudo_index(name, namelen);
        if (i >= 0) {
            c->hb.pseudo[i] = f;
            c->hb.have[i] = 1;
        }
        return 0;
    }
    if (lit_eq((const char *)name, namelen, "cookie"))
        c->hb.cookies++;
    else if (lit_eq((const char *)name, namelen, "host"))
        c->hb.hosts++;
    c->hb.f[c->hb.n++] = f;
    return 0;
}

static int on_frame_recv(nghttp2_session *ng, const nghttp2_frame *frame, void *user)
{
    (void)ng;
    sl_h2_conn_t *c = user;
    int32_t id = frame->hd.stream_id;
    h2_stream_t *s;
    int rv = 0;

    switch (frame->hd.type) {
    case NGHTTP2_HEADERS:
        c->hb.since_ms = 0;
        s = stream_get(c, id);
        if (s && c->hb.stream_id == id) {
            if (frame->headers.cat == NGHTTP2_HCAT_REQUEST)
                rv = deliver_request(c, s, (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0);
            else if (c->hb.trailers)
                rv = deliver_trailers(c, s);
        }
        hb_end(c);
        return rv;
    case NGHTTP2_DATA: {
        size_t payload = frame->hd.length - frame->data.padlen;
        int end = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
        if (payload == 0 && !end) {
            /* Free for the client: no window spent. Non-empty frames are
             * bounded by the window, so only a run of empty ones counts. */
            if (++c->empty_data_run > c->set.empty_data_max)
                return conn_fail(c, SL_H2_ENHANCE_YOUR_CALM);
        } else {
            c->empty_data_run = 0;
        }
        s = stream_get(c, id);
        if (end && s && s->announced && !s->rejected && c->cb.on_data)
            c->cb.on_data(c->user, id, NULL, 0, 1);
        return 0;
    }
    case NGHTTP2_RST_STREAM:
        s = stream_get(c, id);
        if (s && s->announced && !s->done_sent)
            return count_abort(c);
        return count_ctrl(c);
    case NGHTTP2_PING:
    case NGHTTP2_SETTINGS:
        if (frame->hd.flags & NGHTTP2_FLAG_ACK)
            return 0;
        return count_ctrl(c);
    case NGHTTP2_PRIORITY:
    case NGHTTP2_GOAWAY:
        return count_ctrl(c);
    case NGHTTP2_WINDOW_UPDATE:
        /* A client reading our DATA sends WINDOW_UPDATEs in proportion to
         * it (as Envoy bounds them), some clients one more per stream they
         * open; beyond that they are a free flood. */
        if (++c->window_updates > 64 + (uint64_t)c->set.window_updates_per_data_frame *
                                           (c->data_frames_sent + c->st.requests + 1))
            return conn_fail(c, SL_H2_ENHANCE_YOUR_CALM);
        return 0;
    default:
        return 0;
    }
}

static int on_invalid_frame_recv(nghttp2_session *ng, const nghttp2_frame *frame, int lib_error,
                                 void *user)
{
    (void)ng;
    (void)lib_error;
    sl_h2_conn_t *c = user;
    /* nghttp2 has reset a stream for the client's frame (or is closing the
     * connection, when counting no longer matters). */
    if (frame->hd.stream_id != 0) {
        return count_abort(c);
    }
    return 0;
}

static int on_data_chunk_recv(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *data,
                              size_t len, void *user)
{
    (void)flags;
    sl_h2_conn_t *c = user;
    h2_stream_t *s = stream_get(c, id);
    if (!s || !s->announced || s->rejected) {
        /* Nobody will forward it: credit it back now. */
        nghttp2_session_consume(ng, id, len);
        return 0;
    }
    s->unconsumed += len;
    if (c->cb.on_data)
        c->cb.on_data(c->user, id, data, len, 0);
    return 0;
}

static int on_stream_close(nghttp2_session *ng, int32_t id, uint32_t error_code, void *user)
{
    sl_h2_conn_t *c = user;
    h2_stream_t *s = stream_get(c, id);
    if (!s || c->freeing)
        return 0;
    /* Body bytes the glue never forwarded still count against the
     * connection window: give them back, or the connection starves. */
    if (s->unconsumed)
        nghttp2_session_consume_connection(ng, s->unconsumed);
    nghttp2_session_set_stream_user_data(ng, id, NULL);
    if (c->hb.stream_id == id)
        c->hb.stream_id = 0;
    int announced = s->announced;
    stream_free(c, s);
    if (c->nstreams == 0 && c->hb.stream_id == 0)
        hb_release(c);
    if (announced && c->cb.on_stream_close)
        c->cb.on_stream_close(c->user, id, error_code);
    return 0;
}

/* ---- nghttp2 callbacks: output ------------------------------------------ */

static ssize_t send_cb(nghttp2_session *ng, const uint8_t *data, size_t len, int flags, void *user)
{
    (void)ng;
    (void)flags;
    sl_h2_conn_t *c = user;
    sl_buf_t *out = c->out;
    if (!out)
        return NGHTTP2_ERR_WOULDBLOCK;
    size_t n = sl_buf_space(out);
    if (n == 0)
        return NGHTTP2_ERR_WOULDBLOCK;
    if (n > len)
        n = len;
    memcpy(sl_buf_tail(out), data, n);
    out->end += n;
    return (ssize_t)n;
}

/* Called inside the data provider at the end of a body with trailers. */
static void submit_trailers_now(sl_h2_conn_t *c, h2_stream_t *s)
{
    nghttp2_submit_trailer(c->ng, s->id, s->trailers, s->n_trailers);
    free(s->trailers);
    s->trailers = NULL;
    s->n_trailers = 0;
}

static ssize_t data_read_cb(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t length,
                            uint32_t *data_flags, nghttp2_data_source *source, void *user)
{
    (void)ng;
    (void)id;
    (void)buf;
    sl_h2_conn_t *c = user;
    h2_stream_t *s = source->ptr;
    size_t avail = sl_buf_len(&s->out);

    if (avail == 0) {
        if (!s->out_eof) {
            s->deferred = 1;
            return NGHTTP2_ERR_DEFERRED;
        }
        *data_flags |= NGHTTP2_DATA_FLAG_EOF;
        if (s->trailers) {
            *data_flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
            submit_trailers_now(c, s);
        }
        return 0;
    }
    size_t n = avail < length ? avail : length;
    /* Size the frame to what the glue's buffer can take now, so it goes out
     * in this flush; if almost nothing fits, keep a full frame for the next
     * one (SL_H2_MIN_OUT_BYTES guarantees it will fit). */
    if (c->out) {
        size_t space = sl_buf_space(c->out);
        size_t fit = space > 9 ? space - 9 : 0;
        if (fit >= 4096 || fit >= n)
            n = n < fit ? n : fit;
        if (c->out->cap > 9 && n > c->out->cap - 9)
            n = c->out->cap - 9;
    }
    *data_flags |= NGHTTP2_DATA_FLAG_NO_COPY;
    if (n == avail && s->out_eof) {
        *data_flags |= NGHTTP2_DATA_FLAG_EOF;
        if (s->trailers) {
            *data_flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
            submit_trailers_now(c, s);
        }
    }
    return (ssize_t)n;
}

static int send_data_cb(nghttp2_session *ng, nghttp2_frame *frame, const uint8_t *framehd,
                        size_t length, nghttp2_data_source *source, void *user)
{
    (void)ng;
    sl_h2_conn_t *c = user;
    h2_stream_t *s = source->ptr;
    sl_buf_t *out = c->out;
    (void)frame;
    if (!out || sl_buf_space(out) < 9 + length)
        return NGHTTP2_ERR_WOULDBLOCK;
    memcpy(sl_buf_tail(out), framehd, 9);
    memcpy(sl_buf_tail(out) + 9, sl_buf_head(&s->out), length);
    out->end += 9 + length;
    sl_buf_consume(&s->out, length);
    c->send_buffered -= length;
    return 0;
}

static int on_frame_send(nghttp2_session *ng, const nghttp2_frame *frame, void *user)
{
    (void)ng;
    sl_h2_conn_t *c = user;
    if (frame->hd.type == NGHTTP2_DATA)
        c->data_frames_sent++;
    if (frame->hd.type == NGHTTP2_GOAWAY) {
        c->st.goaway_sent = 1;
        c->st.goaway_code = frame->goaway.error_code;
    } else if ((frame->hd.type == NGHTTP2_HEADERS || frame->hd.type == NGHTTP2_DATA) &&
               (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
        h2_stream_t *s = stream_get(c, frame->hd.stream_id);
        if (s) {
            s->done_sent = 1;
            if (s->rst_after_head)
                nghttp2_submit_rst_stream(c->ng, NGHTTP2_FLAG_NONE, s->id, SL_H2_NO_ERROR);
        }
    }
    return 0;
}

/* ---- public: connection ------------------------------------------------- */

int sl_h2_is_preface(const uint8_t *p, size_t n)
{
    size_t m = n < PREFACE_LEN ? n : PREFACE_LEN;
    if (memcmp(p, PREFACE, m) != 0)
        return SL_DECLINED;
    return n < PREFACE_LEN ? SL_AGAIN : SL_OK;
}

static void settings_fill(sl_h2_settings_t *s)
{
#define DEF(f, v)                                                                                  \
    if (s->f == 0)                                                                                 \
    s->f = (v)
    DEF(max_concurrent_streams, 100);
    DEF(stream_window_bytes, 65535);
    DEF(conn_window_bytes, 1u << 20);
    DEF(max_header_list_bytes, 65536);
    DEF(max_header_fields, 100);
    DEF(max_continuations, 8);
    DEF(header_table_bytes, 4096);
    DEF(deflate_table_bytes, 4096);
    DEF(max_settings_entries, 32);
    DEF(max_outbound_ack, 128);
    DEF(ctrl_frames_max, 1000);
    DEF(ctrl_window_ms, 10000);
    DEF(aborted_streams_max, 200);
    DEF(aborted_window_ms, 10000);
    DEF(empty_data_max, 100);
    DEF(window_updates_per_data_frame, 10);
    DEF(stream_send_buffer_bytes, 65536);
    DEF(conn_send_buffer_bytes, 524288);
    DEF(max_response_header_bytes, 65536);
    DEF(drain_stream_id, 0x7fff0000u);
    DEF(enable_connect_protocol, 1);
#undef DEF
    /* RFC 9113 6.5.2 / 6.9.1 ranges. */
    if (s->stream_window_bytes > 0x7fffffffu)
        s->stream_window_bytes = 0x7fffffffu;
    if (s->conn_window_bytes > 0x7fffffffu)
        s->conn_window_bytes = 0x7fffffffu;
    if (s->conn_window_bytes < 65535)
        s->conn_window_bytes = 65535;
    if (s->conn_send_buffer_bytes < s->stream_send_buffer_bytes)
        s->conn_send_buffer_bytes = s->stream_send_buffer_bytes;
    if (s->drain_stream_id > 0x7fffffffu)
        s->drain_stream_id = 0x7fffffffu;
}

/*
 * Owns on success: the session, the scratch arrays. On failure everything
 * allocated so far is freed and NULL returned.
 */
sl_h2_conn_t *sl_h2_conn_new(const sl_h2_settings_t *set, const sl_h2_callbacks_t *cb, void *user)
{
    nghttp2_session_callbacks *cbs = NULL;
    nghttp2_option *opt = NULL;
    sl_h2_conn_t *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    if (set)
        c->set = *set;
    settings_fill(&c->set);
    if (cb)
        c->cb = *cb;
    c->user = user;

    if (nghttp2_session_callbacks_new(&cbs) != 0)
        goto fail_conn;
    nghttp2_session_callbacks_set_send_callback(cbs, send_cb);
    nghttp2_session_callbacks_set_send_data_callback(cbs, send_data_cb);
    nghttp2_session_callbacks_set_on_begin_frame_callback(cbs, on_begin_frame);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
    nghttp2_session_callbacks_set_on_invalid_frame_recv_callback(cbs, on_invalid_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk_recv);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
    nghttp2_session_callbacks_set_on_frame_send_callback(cbs, on_frame_send);

    if (nghttp2_option_new(&opt) != 0)
        goto fail_cbs;
    /* Request body credit only through sl_h2_consume. */
    nghttp2_option_set_no_auto_window_update(opt, 1);
    nghttp2_option_set_max_deflate_dynamic_table_size(opt, c->set.deflate_table_bytes);
    nghttp2_option_set_max_outbound_ack(opt, c->set.max_outbound_ack);
    nghttp2_option_set_max_settings(opt, c->set.max_settings_entries);
    nghttp2_option_set_max_continuations(opt, c->set.max_continuations);
    nghttp2_option_set_max_send_header_block_length(opt, c->set.max_response_header_bytes +
                                                             BLOCK_SLACK_BYTES);
    /* No priority tree to keep closed streams for (and to attack). */
    nghttp2_option_set_no_closed_streams(opt, 1);

    if (nghttp2_session_server_new2(&c->ng, cbs, c, opt) != 0)
        goto fail_opt;
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cbs);

    nghttp2_settings_entry iv[8];
    size_t niv = 0;
    iv[niv++] = (nghttp2_settings_entry){NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS,
                                         c->set.max_concurrent_streams};
    iv[niv++] =
        (nghttp2_settings_entry){NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, c->set.stream_window_bytes};
    iv[niv++] = (nghttp2_settings_entry){NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE,
                                         c->set.max_header_list_bytes};
    iv[niv++] =
        (nghttp2_settings_entry){NGHTTP2_SETTINGS_HEADER_TABLE_SIZE, c->set.header_table_bytes};
    iv[niv++] = (nghttp2_settings_entry){NGHTTP2_SETTINGS_ENABLE_PUSH, 0};
    iv[niv++] = (nghttp2_settings_entry){NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES, 1};
    if (c->set.enable_connect_protocol == 1)
        iv[niv++] = (nghttp2_settings_entry){NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL, 1};
    if (nghttp2_submit_settings(c->ng, NGHTTP2_FLAG_NONE, iv, niv) != 0 ||
        nghttp2_session_set_local_window_size(c->ng, NGHTTP2_FLAG_NONE, 0,
                                              (int32_t)c->set.conn_window_bytes) != 0)
        goto fail_session;
    return c;

fail_session:
    nghttp2_session_del(c->ng);
    goto fail_conn;
fail_opt:
    nghttp2_option_del(opt);
fail_cbs:
    nghttp2_session_callbacks_del(cbs);
fail_conn:
    free(c->hb.f);
    free(c->fields_out);
    free(c);
    return NULL;
}

void sl_h2_conn_free(sl_h2_conn_t *c)
{
    if (!c)
        return;
    c->freeing = 1;
    while (c->streams) {
        h2_stream_t *s = c->streams;
        int32_t id = s->id;
        int announced = s->announced;
        nghttp2_session_set_stream_user_data(c->ng, id, NULL);
        stream_free(c, s);
        if (announced && c->cb.on_stream_close)
            c->cb.on_stream_close(c->user, id, SL_H2_CANCEL);
    }
    nghttp2_session_del(c->ng);
    free(c->hb.mem);
    free(c->hb.f);
    free(c->fields_out);
    free(c->nvmem);
    free(c);
}

const sl_h2_settings_t *sl_h2_conn_settings(const sl_h2_conn_t *c)
{
    return &c->set;
}

ssize_t sl_h2_conn_feed(sl_h2_conn_t *c, const uint8_t *in, size_t len)
{
    if (c->busy)
        return SL_AGAIN;
    if (c->failed)
        return SL_ERROR;
    c->busy = 1;
    ssize_t rv = nghttp2_session_mem_recv(c->ng, in, len);
    c->busy = 0;
    if (rv >= 0)
        return rv;
    if (!c->failed) {
        /* nghttp2's own fatal verdicts: floods of ACKs or CONTINUATIONs are
         * abuse, a bad preface a protocol error; say so before closing. */
        uint32_t code = SL_H2_INTERNAL_ERROR;
        if (rv == NGHTTP2_ERR_FLOODED || rv == NGHTTP2_ERR_TOO_MANY_CONTINUATIONS)
            code = SL_H2_ENHANCE_YOUR_CALM;
        else if (rv == NGHTTP2_ERR_BAD_CLIENT_MAGIC)
            code = SL_H2_PROTOCOL_ERROR;
        c->failed = 1;
        c->st.goaway_code = code;
        nghttp2_session_terminate_session(c->ng, code);
    }
    return SL_ERROR;
}

/* After a send: which streams wait for the client's window, and which may
 * write again. Returns how many writable callbacks were made. */
static int after_send(sl_h2_conn_t *c)
{
    int32_t conn_window = nghttp2_session_get_remote_window_size(c->ng);
    uint64_t now = 0;
    int notified = 0;
    size_t half = c->set.stream_send_buffer_bytes / 2;

    for (h2_stream_t *s = c->streams; s; s = s->next) {
        int pending = s->has_provider && !s->done_sent && (sl_buf_len(&s->out) > 0 || s->out_eof);
        int stalled = 0;
        if (pending) {
            int32_t w = nghttp2_session_get_stream_remote_window_size(c->ng, s->id);
            stalled = w <= 0 || conn_window <= 0;
        }
        if (stalled && s->stall_since_ms == 0) {
            if (!now)
                now = now_ms(c);
            s->stall_since_ms = now;
        } else if (!stalled) {
            s->stall_since_ms = 0;
        }
    }
    for (h2_stream_t *s = c->streams; s; s = s->next) {
        if (!s->want_writable)
            continue;
        if (c->set.stream_send_buffer_bytes - sl_buf_len(&s->out) < half ||
            c->set.conn_send_buffer_bytes - c->send_buffered < half)
            continue;
        s->want_writable = 0;
        notified++;
        if (c->cb.on_stream_writable)
            c->cb.on_stream_writable(c->user, s->id);
    }
    return notified;
}

int sl_h2_conn_flush_into(sl_h2_conn_t *c, sl_buf_t *out)
{
    if (c->busy)
        return SL_AGAIN;
    sl_buf_compact(out);
    /* Writable callbacks may write more: frame it in the same flush, a few
     * rounds at most so one flush stays bounded. */
    for (int round = 0; round < 4; round++) {
        c->busy = 1;
        c->out = out;
        int rv = nghttp2_session_send(c->ng);
        c->out = NULL;
        if (rv != 0) {
            c->busy = 0;
            return SL_ERROR;
        }
        int notified = after_send(c);
        c->busy = 0;
        if (!notified || sl_buf_space(out) == 0)
            break;
    }
    return SL_OK;
}

int sl_h2_conn_want_read(const sl_h2_conn_t *c)
{
    return !c->failed && nghttp2_session_want_read(c->ng);
}

int sl_h2_conn_want_write(const sl_h2_conn_t *c)
{
    return nghttp2_session_want_write(c->ng);
}

int sl_h2_conn_idle(const sl_h2_conn_t *c)
{
    return c->nstreams == 0 && c->hb.since_ms == 0;
}

uint64_t sl_h2_conn_header_block_since(const sl_h2_conn_t *c)
{
    return c->hb.since_ms;
}

int32_t sl_h2_conn_oldest_stall(const sl_h2_conn_t *c, uint64_t *since_ms)
{
    int32_t id = 0;
    uint64_t since = 0;
    for (const h2_stream_t *s = c->streams; s; s = s->next)
        if (s->stall_since_ms && (since == 0 || s->stall_since_ms < since)) {
            since = s->stall_since_ms;
            id = s->id;
        }
    if (since_ms)
        *since_ms = since;
    return id;
}

uint64_t sl_h2_stream_stalled_ms(sl_h2_conn_t *c, int32_t stream_id)
{
    h2_stream_t *s = stream_get(c, stream_id);
    if (!s || !s->stall_since_ms)
        return 0;
    uint64_t now = now_ms(c);
    return now > s->stall_since_ms ? now - s->stall_since_ms : 0;
}

void sl_h2_consume(sl_h2_conn_t *c, int32_t stream_id, size_t n)
{
    h2_stream_t *s = stream_get(c, stream_id);
    if (!s)
        return;
    if (n > s->unconsumed)
        n = s->unconsumed;
    if (n == 0)
        return;
    s->unconsumed -= n;
    nghttp2_session_consume(c->ng, stream_id, n);
}

/* ---- public: responses -------------------------------------------------- */

static int is_hop_by_hop(const char *n, size_t len)
{
    /* Lower-case already; RFC 9113 8.2.2. */
    return lit_eq(n, len, "connection") || lit_eq(n, len, "keep-alive") ||
           lit_eq(n, len, "proxy-connection") || lit_eq(n, len, "transfer-encoding") ||
           lit_eq(n, len, "upgrade");
}

/*
 * Fills nv[0..) from `fields` (after an optional ":status"), lower-casing
 * names into c->nvmem and trimming OWS from values (a peer must refuse
 * leading or trailing whitespace, RFC 9113 8.2.1). Values point into the
 * caller's fields: nghttp2 copies them at submission. Returns the count or
 * SL_ERROR.
 */
static ssize_t build_nv(sl_h2_conn_t *c, nghttp2_nv *nv, const char *status,
                        const sl_header_t *fields, size_t n)
{
    size_t k = 0, used = 0, cap = c->set.max_response_header_bytes;
    if (!c->nvmem) {
        c->nvmem = malloc(cap);
        if (!c->nvmem)
            return SL_ERROR;
    }
    if (status)
        nv[k++] = (nghttp2_nv){(uint8_t *)":status", (uint8_t *)status, 7, 3, NGHTTP2_NV_FLAG_NONE};
    for (size_t i = 0; i < n; i++) {
        const sl_header_t *f = &fields[i];
        if (f->name.len == 0 || used + f->name.len + f->value.len > cap)
            return SL_ERROR;
        char *name = c->nvmem + used;
        for (size_t j = 0; j < f->name.len; j++) {
            unsigned char ch = (unsigned char)f->name.ptr[j];
            if (!tchar_tab[ch])
                return SL_ERROR;
            name[j] = (char)(ch >= 'A' && ch <= 'Z' ? ch | 0x20 : ch);
        }
        if (is_hop_by_hop(name, f->name.len))
            continue;
        used += f->name.len;
        const char *v = f->value.ptr;
        size_t vl = f->value.len;
        for (size_t j = 0; j < vl; j++)
            if (v[j] == '\r' || v[j] == '\n' || v[j] == '\0')
                return SL_ERROR;
        while (vl && (v[0] == ' ' || v[0] == '\t')) {
            v++;
            vl--;
        }
        while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
            vl--;
        used += f->value.len;
        nv[k++] =
            (nghttp2_nv){(uint8_t *)name, (uint8_t *)v, f->name.len, vl, NGHTTP2_NV_FLAG_NONE};
    }
    return (ssize_t)k;
}

int sl_h2_submit_response(sl_h2_conn_t *c, int32_t stream_id, int status, const sl_header_t *fields,
                          size_t n, int end_stream)
{
    h2_stream_t *s = stream_get(c, stream_id);
    if (!s || s->rejected)
        return SL_DECLINED;
    if (!s->announced || s->final_sent || status < 100 || status > 599 || status == 101)
        return SL_ERROR;
    int interim = status < 200;
    if (interim && end_stream)
        return SL_ERROR;

    char code[4] = {(char)('0' + status / 100), (char)('0' + status / 10 % 10),
                    (char)('0' + status % 10), 0};
    nghttp2_nv stack_nv[64];
    nghttp2_nv *nv = n + 1 <= SL_ARRAY_LEN(stack_nv) ? stack_nv : malloc((n + 1) * sizeof(*nv));
    if (!nv)
        return SL_ERROR;
    int rv = SL_ERROR;
    ssize_t k = build_nv(c, nv, code, fields, n);
    if (k < 0)
        goto out;
    if (interim) {
        if (nghttp2_submit_headers(c->ng, NGHTTP2_FLAG_NONE, stream_id, NULL, nv, (size_t)k, NULL) <
            0)
            goto out;
    } else {
        nghttp2_data_provider prd = {.source.ptr = s, .read_callback = data_read_cb};
        if (nghttp2_submit_response(c->ng, stream_id, nv, (size_t)k, end_stream ? NULL : &prd) != 0)
            goto out;
        s->final_sent = 1;
        s->has_provider = !end_stream;
        s->out_eof = (uint8_t)end_stream;
    }
    rv = SL_OK;
out:
    if (nv != stack_nv)
        free(nv);
    return rv;
}

/* Grows the stream's buffer as needed, never past its bound. */
static int stream_buf_room(sl_h2_conn_t *c, h2_stream_t *s, size_t n)
{
    sl_buf_t *b = &s->out;
    if (sl_buf_space(b) >= n)
        return SL_OK;
    sl_buf_compact(b);
    if (sl_buf_space(b) >= n)
        return SL_OK;
    size_t want = b->cap ? b->cap * 2 : 4096;
    while (want < b->end + n)
        want *= 2;
    if (want > c->set.stream_send_buffer_bytes)
        want = c->set.stream_send_buffer_bytes;
    return sl_buf_reserve(b, want) == 0 ? SL_OK : SL_ERROR;
}

ssize_t sl_h2_stream_write(sl_h2_conn_t *c, int32_t stream_id, const uint8_t *p, size_t n,
                           int end_stream)
{
    h2_stream_t *s = stream_get(c, stream_id);
    if (!s || s->rejected)
        return SL_DECLINED;
    if (!s->has_provider || s->out_eof)
        return SL_ERROR;
    size_t held = sl_buf_len(&s->out);
    size_t room = c->set.stream_send_buffer_bytes - held;
    size_t conn_room = c->set.conn_send_buffer_bytes - c->send_buffered;
    size_t take = n;
    if (take > room)
        take = room;
    if (take > conn_room)
        take = conn_room;
    if (take > 0) {
        if (stream_buf_room(c, s, take) != SL_OK)
            return SL_ERROR;
        memcpy(sl_buf_tail(&s->out), p, take);
        s->out.end += take;
        c->send_buffered += take;
        if (held + take > c->st.send_buffer_max)
            c->st.send_buffer_max = (uint32_t)(held + take);
    }
    if (take < n)
        s->want_writable = 1;
    else if (end_stream)
        s->out_eof = 1;
    if (s->deferred && (take > 0 || s->out_eof)) {
        s->deferred = 0;
        nghttp2_session_resume_data(c->ng, stream_id);
    }
    return (ssize_t)take;
}

int sl_h2_submit_trailers(sl_h2_conn_t *c, int32_t stream_id, const sl_header_t *fields, size_t n)
{
    h2_stream_t *s = stream_get(c, stream_id);
    if (!s || s->rejected)
        return SL_DECLINED;
    if (!s->has_provider || s->out_eof || n == 0)
        return SL_ERROR;
    nghttp2_nv stack_nv[64];
    nghttp2_nv *nv = n <= SL_ARRAY_LEN(stack_nv) ? stack_nv : malloc(n * sizeof(*nv));
    if (!nv)
        return SL_ERROR;
    int rv = SL_ERROR;
    ssize_t k = build_nv(c, nv, NULL, fields, n);
    if (k <= 0)
        goto out;
    /* Kept until the body has gone out (trailers submitted earlier would
     * overtake the DATA still buffered): one block, array then bytes. */
    size_t bytes = 0;
    for (ssize_t i = 0; i < k; i++)
        bytes += nv[i].namelen + nv[i].valuelen;
    nghttp2_nv *copy = malloc((size_t)k * sizeof(*copy) + bytes);
    if (!copy)
        goto out;
    uint8_t *m = (uint8_t *)(copy + k);
    for (ssize_t i = 0; i < k; i++) {
        copy[i] = nv[i];
        copy[i].name = m;
        memcpy(m, nv[i].name, nv[i].namelen);
        m += nv[i].namelen;
        copy[i].value = m;
        memcpy(m, nv[i].value, nv[i].valuelen);
        m += nv[i].valuelen;
    }
    s->trailers = copy;
    s->n_trailers = (size_t)k;
    s->out_eof = 1;
    if (s->deferred) {
        s->deferred = 0;
        nghttp2_session_resume_data(c->ng, stream_id);
    }
    rv = SL_OK;
out:
    if (nv != stack_nv)
        free(nv);
    return rv;
}

int sl_h2_reset_stream(sl_h2_conn_t *c, int32_t stream_id, uint32_t error_code)
{
    h2_stream_t *s = stream_get(c, stream_id);
    if (!s)
        return SL_DECLINED;
    /* "Complete response, then stop sending": nghttp2 would drop what is
     * still queued for a stream it resets, so wait for our END_STREAM. */
    if (error_code == SL_H2_NO_ERROR && s->final_sent && !s->done_sent) {
        s->rst_after_head = 1;
        return SL_OK;
    }
    return nghttp2_submit_rst_stream(c->ng, NGHTTP2_FLAG_NONE, stream_id, error_code) == 0
               ? SL_OK
               : SL_DECLINED;
}

void sl_h2_goaway(sl_h2_conn_t *c, int graceful)
{
    if (!graceful) {
        nghttp2_session_terminate_session(c->ng, SL_H2_NO_ERROR);
        return;
    }
    if (c->draining)
        return;
    int32_t last = nghttp2_session_get_last_proc_stream_id(c->ng);
    if (last < 0)
        last = 0;
    c->draining = 1;
    c->drain_last_id = last;
    nghttp2_submit_goaway(c->ng, NGHTTP2_FLAG_NONE, last, SL_H2_NO_ERROR, NULL, 0);
}

void sl_h2_conn_stats(const sl_h2_conn_t *c, sl_h2_stats_t *st)
{
    *st = c->st;
    st->open_streams = c->nstreams;
    st->send_buffered = (uint32_t)c->send_buffered;
}
