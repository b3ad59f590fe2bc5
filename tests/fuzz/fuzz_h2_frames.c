/*
 * libFuzzer driver: runtime/http/h2.c, the HTTP/2 server codec, fed a client
 * connection: a valid preface and empty SETTINGS, then the input's frames.
 *
 * Input: byte 0 chooses the options (bit 0: extended CONNECT enabled; bit 1:
 * small limits, so the 431, concurrency and buffer paths are reached with
 * short inputs; bit 2: a client that stops reading after the first flushes;
 * bit 3: the glue consumes request bodies late, at the next flush, instead of
 * at once; bits 4..7 seed the socket-like splits). The rest is fed in pieces,
 * each followed by a flush into a bounded output buffer that is then drained
 * (or not, with bit 2).
 *
 * The glue's callbacks answer like a proxy would: by stream id, 1xx then a
 * final response with a body written through sl_h2_stream_write (refilled on
 * on_stream_writable), with trailers, with END_STREAM on the head, or a
 * reset; late writes to closed streams must say SL_DECLINED.
 *
 * Invariants (abort() on violation):
 *  - every on_request head is well formed: method a token, version 20, host
 *    a non-empty prefix of authority, target = path ["?" query] with
 *    has_query exactly when a '?' was sent, a path starting with '/' (or "*"
 *    for OPTIONS, or empty for a plain CONNECT), no byte <= 0x20, 0x7f or '#'
 *    in the target, field names lower-case tokens (never pseudo), values
 *    without CR, LF or NUL, at most max_header_fields fields, at most one
 *    Cookie field, has_length set when END_STREAM came with the head,
 *    extended CONNECT only when enabled and with a :protocol;
 *  - a stream is announced once and closed once, never before it was
 *    announced, and every announced stream is closed by sl_h2_conn_free;
 *  - on_data never delivers more than the stream window we advertise before
 *    a consume (flow control holds), nor data after the end;
 *  - a flush never writes past the output buffer; the response bytes held
 *    stay within the per-stream and per-connection bounds;
 *  - feed consumes all its input or returns SL_ERROR, and after SL_ERROR
 *    nothing is read any more.
 */
#include "fuzz_util.h"

#include "h2.h"

#include <nghttp2/nghttp2.h>

#define MAX_TRACK 1024

typedef struct {
    int32_t id;
    uint8_t closed;
    uint8_t ended;
    uint64_t unconsumed;
    uint64_t received;
} track_t;

typedef struct {
    sl_h2_conn_t *c;
    const sl_h2_settings_t *set;
    uint8_t opts;
    track_t t[MAX_TRACK];
    size_t nt;
    int overflow; /* more streams than tracked: skip the per-stream checks */
} fz_t;

static track_t *find(fz_t *f, int32_t id)
{
    for (size_t i = 0; i < f->nt; i++)
        if (f->t[i].id == id)
            return &f->t[i];
    return NULL;
}

static int is_tchar(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

static void check_head(fz_t *f, const sl_req_head_t *h, const sl_h2_req_info_t *info)
{
    FUZZ_CHECK(h->version == 20, "version %d", h->version);
    FUZZ_CHECK(h->method.len > 0, "empty method");
    for (size_t i = 0; i < h->method.len; i++)
        FUZZ_CHECK(is_tchar((unsigned char)h->method.ptr[i]), "method byte %02x",
                   (unsigned char)h->method.ptr[i]);
    FUZZ_CHECK(h->host.len > 0 && h->host.len <= h->authority.len &&
                   memcmp(h->host.ptr, h->authority.ptr, h->host.len) == 0,
               "host not a prefix of authority");
    for (size_t i = 0; i < h->target.len; i++) {
        unsigned char ch = (unsigned char)h->target.ptr[i];
        FUZZ_CHECK(ch > 0x20 && ch != 0x7f && ch != '#', "target byte %02x", ch);
    }
    size_t want = h->path.len + (h->has_query ? 1 + h->query.len : 0);
    FUZZ_CHECK(h->target.len == want, "target %zu != path+query %zu", h->target.len, want);
    FUZZ_CHECK(h->path.len == 0 || h->path.ptr == h->target.ptr, "path not at target start");
    FUZZ_CHECK(memchr(h->path.ptr ? h->path.ptr : "", '?', h->path.len) == NULL, "'?' in path");
    int connect = h->method_bit == SL_METHOD_CONNECT;
    if (h->path.len == 0)
        FUZZ_CHECK(connect && !(info->flags & SL_H2_REQ_EXTENDED_CONNECT), "empty path");
    else if (h->path.ptr[0] != '/')
        FUZZ_CHECK(h->path.len == 1 && h->path.ptr[0] == '*' && h->method_bit == SL_METHOD_OPTIONS,
                   "path start");
    if (info->flags & SL_H2_REQ_EXTENDED_CONNECT)
        FUZZ_CHECK(connect && info->protocol.len > 0 && f->set->enable_connect_protocol,
                   "extended CONNECT");
    FUZZ_CHECK(h->num_headers <= f->set->max_header_fields, "too many fields");
    int cookies = 0;
    for (size_t i = 0; i < h->num_headers; i++) {
        sl_str_t n = h->headers[i].name, v = h->headers[i].value;
        FUZZ_CHECK(n.len > 0 && n.ptr[0] != ':', "empty or pseudo name");
        for (size_t j = 0; j < n.len; j++) {
            unsigned char ch = (unsigned char)n.ptr[j];
            FUZZ_CHECK(is_tchar(ch) && !(ch >= 'A' && ch <= 'Z'), "name byte %02x", ch);
        }
        for (size_t j = 0; j < v.len; j++)
            FUZZ_CHECK(v.ptr[j] != '\r' && v.ptr[j] != '\n' && v.ptr[j] != 0, "value byte");
        if (n.len == 6 && memcmp(n.ptr, "cookie", 6) == 0)
            cookies++;
    }
    FUZZ_CHECK(cookies <= 1, "%d cookie fields", cookies);
    if (info->flags & SL_H2_REQ_END_STREAM)
        FUZZ_CHECK(h->has_length, "END_STREAM head without a known length");
}

static const uint8_t body[3000] = {0};

static void respond(fz_t *f, int32_t id)
{
    sl_header_t hf[] = {{SL_STR("Content-Type"), SL_STR("text/plain")},
                        {SL_STR("X-Mixed-Case"), SL_STR(" trimmed ")},
                        {SL_STR("connection"), SL_STR("close")}};
    switch ((uint32_t)id % 11) {
    case 1: /* head only */
        sl_h2_submit_response(f->c, id, 204, hf, 3, 1);
        break;
    case 3: /* interim, then a body in pieces */
        sl_h2_submit_response(f->c, id, 103, NULL, 0, 0);
        sl_h2_submit_response(f->c, id, 200, hf, 3, 0);
        sl_h2_stream_write(f->c, id, body, sizeof(body), 0);
        break;
    case 5: /* body and trailers */
        sl_h2_submit_response(f->c, id, 200, hf, 2, 0);
        sl_h2_stream_write(f->c, id, body, 100, 0);
        {
            sl_header_t t[] = {{SL_STR("grpc-status"), SL_STR("0")}};
            sl_h2_submit_trailers(f->c, id, t, 1);
        }
        break;
    case 7: /* the glue gives up */
        sl_h2_reset_stream(f->c, id, SL_H2_INTERNAL_ERROR);
        break;
    case 9: /* early answer, stop the client (NO_ERROR after the response) */
        sl_h2_submit_response(f->c, id, 413, NULL, 0, 1);
        sl_h2_reset_stream(f->c, id, SL_H2_NO_ERROR);
        break;
    default: /* answered when the body has ended */
        break;
    }
}

/* The ids respond() answers at once; the others get 200 at the body's end. */
static int answers_early(int32_t id)
{
    uint32_t k = (uint32_t)id % 11;
    return k == 1 || k == 3 || k == 5 || k == 7 || k == 9;
}

static void on_request(void *user, int32_t id, const sl_req_head_t *h, const sl_h2_req_info_t *info)
{
    fz_t *f = user;
    check_head(f, h, info);
    FUZZ_CHECK(find(f, id) == NULL, "stream %d announced twice", id);
    if (f->nt < MAX_TRACK)
        f->t[f->nt++] = (track_t){.id = id, .ended = (info->flags & SL_H2_REQ_END_STREAM) != 0};
    else
        f->overflow = 1;
    respond(f, id);
    if (!answers_early(id) && (info->flags & SL_H2_REQ_END_STREAM))
        sl_h2_submit_response(f->c, id, 200, NULL, 0, 1);
}

static void on_data(void *user, int32_t id, const uint8_t *p, size_t n, int end)
{
    fz_t *f = user;
    track_t *t = find(f, id);
    FUZZ_CHECK(t || f->overflow, "data for unannounced stream %d", id);
    if (!t)
        return;
    FUZZ_CHECK(!t->closed && !t->ended, "data after end/close on %d", id);
    if (end) {
        FUZZ_CHECK(p == NULL && n == 0, "end with bytes");
        t->ended = 1;
        if (!answers_early(id))
            sl_h2_submit_response(f->c, id, 200, NULL, 0, 1);
        return;
    }
    FUZZ_CHECK(p != NULL && n > 0, "empty data chunk");
    /* Flow control: never more unconsumed than the window we advertise
     * (or the RFC's 65535 until the client has acknowledged our SETTINGS). */
    t->unconsumed += n;
    t->received += n;
    uint64_t window = f->set->stream_window_bytes > 65535 ? f->set->stream_window_bytes : 65535;
    FUZZ_CHECK(t->unconsumed <= window, "stream %d holds %llu > window", id,
               (unsigned long long)t->unconsumed);
    if (!(f->opts & 8)) {
        sl_h2_consume(f->c, id, n);
        t->unconsumed = 0;
    }
}

static void on_trailers(void *user, int32_t id, const sl_header_t *fields, size_t n)
{
    fz_t *f = user;
    track_t *t = find(f, id);
    FUZZ_CHECK(t || f->overflow, "trailers for unannounced stream %d", id);
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK(fields[i].name.len > 0 && fields[i].name.ptr[0] != ':', "pseudo trailer");
}

static void on_close(void *user, int32_t id, uint32_t code)
{
    (void)code;
    fz_t *f = user;
    track_t *t = find(f, id);
    FUZZ_CHECK(t || f->overflow, "close of unannounced stream %d", id);
    if (!t)
        return;
    FUZZ_CHECK(!t->closed, "stream %d closed twice", id);
    t->closed = 1;
}

static void on_writable(void *user, int32_t id)
{
    fz_t *f = user;
    ssize_t n = sl_h2_stream_write(f->c, id, body, sizeof(body), 0);
    FUZZ_CHECK(n >= 0 || n == SL_DECLINED || n == SL_ERROR, "write result %zd", n);
}

static void consume_late(fz_t *f)
{
    for (size_t i = 0; i < f->nt; i++)
        if (!f->t[i].closed && f->t[i].unconsumed) {
            sl_h2_consume(f->c, f->t[i].id, f->t[i].unconsumed);
            f->t[i].unconsumed = 0;
        }
}

static void check_bounds(fz_t *f)
{
    sl_h2_stats_t st;
    sl_h2_conn_stats(f->c, &st);
    FUZZ_CHECK(st.send_buffered <= f->set->conn_send_buffer_bytes, "conn buffer %u",
               st.send_buffered);
    FUZZ_CHECK(st.send_buffer_max <= f->set->stream_send_buffer_bytes, "stream buffer %u",
               st.send_buffer_max);
    FUZZ_CHECK(st.open_streams <= f->set->max_concurrent_streams, "open streams %u",
               st.open_streams);
}

static int flush(fz_t *f, sl_buf_t *out, int drain)
{
    int rv = sl_h2_conn_flush_into(f->c, out);
    FUZZ_CHECK(out->end <= out->cap && out->start <= out->end, "output past the buffer");
    if (drain)
        sl_buf_consume(out, sl_buf_len(out));
    if (f->opts & 8)
        consume_late(f);
    check_bounds(f);
    return rv;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static fz_t f;
    if (size < 1)
        return 0;
    memset(&f, 0, sizeof(f));
    f.opts = data[0];
    sl_h2_settings_t set = {.enable_connect_protocol = f.opts & 1};
    if (f.opts & 2) {
        set.max_concurrent_streams = 4;
        set.max_header_list_bytes = 512;
        set.max_header_fields = 12;
        set.stream_window_bytes = 1024;
        set.conn_window_bytes = 65535;
        set.stream_send_buffer_bytes = 4096;
        set.conn_send_buffer_bytes = 8192;
        set.aborted_streams_max = 8;
        set.empty_data_max = 4;
        set.ctrl_frames_max = 16;
    }
    static const sl_h2_callbacks_t cb = {
        .on_request = on_request,
        .on_data = on_data,
        .on_trailers = on_trailers,
        .on_stream_close = on_close,
        .on_stream_writable = on_writable,
    };
    f.c = sl_h2_conn_new(&set, &cb, &f);
    FUZZ_CHECK(f.c != NULL, "conn_new");
    f.set = sl_h2_conn_settings(f.c);

    sl_buf_t out = {malloc(SL_H2_MIN_OUT_BYTES), 0, 0, SL_H2_MIN_OUT_BYTES};
    FUZZ_CHECK(out.data != NULL, "malloc");
    static const uint8_t start[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                                   "\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    FUZZ_CHECK(sl_h2_conn_feed(f.c, start, sizeof(start) - 1) == (ssize_t)(sizeof(start) - 1),
               "preface refused");

    fuzz_rng_t rng;
    fuzz_rng_init(&rng, (uint32_t)(f.opts >> 4) * 0x01000193u + (uint32_t)size);
    const uint8_t *p = data + 1;
    size_t left = size - 1;
    int failed = 0, flushes = 0;
    while (left > 0) {
        size_t n = fuzz_next_split(&rng, left);
        /* An exact-size copy: a read past what "arrived" is an ASan report. */
        char *piece = fuzz_dup(p, n);
        ssize_t r = sl_h2_conn_feed(f.c, (const uint8_t *)piece, n);
        free(piece);
        FUZZ_CHECK(r == (ssize_t)n || r == SL_ERROR, "feed returned %zd of %zu", r, n);
        if (failed)
            FUZZ_CHECK(r == SL_ERROR, "read after a connection error");
        int drain = !(f.opts & 4) || flushes < 2;
        flush(&f, &out, drain);
        flushes++;
        if (r == SL_ERROR) {
            failed = 1;
            FUZZ_CHECK(!sl_h2_conn_want_read(f.c), "wants to read after SL_ERROR");
        }
        p += n;
        left -= n;
    }
    for (int i = 0; i < 8 && sl_h2_conn_want_write(f.c); i++)
        flush(&f, &out, !(f.opts & 4));

    sl_h2_conn_free(f.c);
    for (size_t i = 0; i < f.nt; i++)
        FUZZ_CHECK(f.t[i].closed, "stream %d never closed", f.t[i].id);
    free(out.data);
    return 0;
}
