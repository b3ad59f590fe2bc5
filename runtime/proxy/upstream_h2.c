/*
 * HTTP/2 to upstreams (upstream_h2.h): nghttp2 client sessions, one or a
 * few per worker and endpoint, carrying exchanges as streams.
 */
#include "upstream_h2.h"

#include "cache.h"

#include "log.h"
#include "metrics.h"
#include "upstream.h"

#include <errno.h>
#include <event2/event.h>
#include <nghttp2/nghttp2.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The upstream may send this much response body per stream before the
 * client has taken it: what the gateway holds per stream at most. */
#define STREAM_WINDOW (64 * 1024)
#define CONN_WINDOW (1024 * 1024)
#define MAX_FIELDS 128
#define MAX_HEAD_BYTES (64 * 1024)
#define READ_CHUNK 16384

typedef struct sl_h2up {
    sl_pool_t *pool;
    sl_worker_t *w;
    sl_upconn_t *uc;
    nghttp2_session *sess;
    sl_buf_t out;     /* frames not yet taken by the socket */
    uint32_t streams; /* open streams */
    uint8_t ready;    /* connected (and TLS done): streams may go */
    uint8_t goaway;   /* no new streams */
    uint8_t dead;
    uint8_t write_blocked;
    uint8_t pumping, repump; /* conn_pump is on the stack / must go round again */
    /* Inside nghttp2 (mem_recv, send): the session must not be sent on or
     * deleted from its own callbacks; both wait until it returns. */
    uint8_t in_session, fail_pending;
    unsigned in_cb;
    uint64_t idle_since_ms; /* no stream open since, 0 while busy */
    sl_exchange_t *waiting; /* exchanges queued until ready (x->h2_next) */
    sl_exchange_t *active;  /* exchanges with a stream on it (x->h2_next) */
    sl_deferred_t flush;    /* conn_pump at the end of the event batch */
    struct sl_h2up *next;
} sl_h2up_t;

/* The pool's HTTP/2 connections hang off its endpoint state's pool:
 * upstream.h keeps one list head per pool. */
static sl_h2up_t **pool_list(sl_pool_t *p)
{
    return (sl_h2up_t **)&p->h2;
}

static void conn_pump(sl_h2up_t *h);
static void conn_fail(sl_h2up_t *h);
static void conn_pump_soon(sl_h2up_t *h);

static int alpn_is_h2(SSL *ssl)
{
    const unsigned char *p = NULL;
    unsigned int len = 0;
    SSL_get0_alpn_selected(ssl, &p, &len);
    return len == 2 && memcmp(p, "h2", 2) == 0;
}

static uint32_t max_streams(const sl_h2up_t *h)
{
    return nghttp2_session_get_remote_settings(h->sess, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
}

/* ---- request fields --------------------------------------------------------------- */

static int is_connection_specific(const sl_header_t *f)
{
    static const char *const names[] = {
        "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade",
        "host",       "te"};
    for (size_t i = 0; i < SL_ARRAY_LEN(names); i++)
        if (f->name.len == strlen(names[i]) && strncasecmp(f->name.ptr, names[i], f->name.len) == 0)
            return 1;
    return 0;
}

static nghttp2_nv nv(const char *n, size_t nl, const char *v, size_t vl)
{
    return (nghttp2_nv){(uint8_t *)n, (uint8_t *)v, nl, vl, NGHTTP2_NV_FLAG_NONE};
}

/* Lower-cases the names in place: HTTP/2 field names are lower case, and
 * the head in uout is ours to rewrite (it is never sent as HTTP/1.1). */
static void lower(sl_str_t s)
{
    char *p = (char *)s.ptr;
    for (size_t i = 0; i < s.len; i++)
        if (p[i] >= 'A' && p[i] <= 'Z')
            p[i] = (char)(p[i] - 'A' + 'a');
}

static ssize_t data_read_cb(nghttp2_session *sess, int32_t stream_id, uint8_t *buf, size_t length,
                            uint32_t *flags, nghttp2_data_source *src, void *user)
{
    (void)sess;
    (void)stream_id;
    (void)user;
    sl_exchange_t *x = src->ptr;
    size_t avail = sl_buf_len(&x->uout) - x->uout_sent;
    if (avail == 0) {
        if (x->req_body_done) {
            *flags |= NGHTTP2_DATA_FLAG_EOF;
            return 0;
        }
        return NGHTTP2_ERR_DEFERRED; /* resumed by sl_h2up_resume_send */
    }
    size_t n = avail < length ? avail : length;
    memcpy(buf, sl_buf_head(&x->uout) + x->uout_sent, n);
    x->uout_sent += n;
    /* Room for more of the body: conn_pump asks the codec for it. */
    if (!x->req_body_done)
        x->h2_wants_body = 1;
    if (x->req_body_done && x->uout_sent == sl_buf_len(&x->uout))
        *flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

/* Submits x's request on h: the head the exchange wrote for HTTP/1.1 is
 * read back into HTTP/2 fields; the body bytes after it go as DATA. */
static int submit(sl_h2up_t *h, sl_exchange_t *x)
{
    sl_header_t fields[MAX_FIELDS];
    sl_http1_request_t req;
    memset(&req, 0, sizeof(req));
    req.headers = fields;
    req.num_headers = MAX_FIELDS;
    sl_http1_limits_t lim = {65536, (uint32_t)sl_buf_len(&x->uout) + 1, MAX_FIELDS};
    ssize_t hl = sl_http1_parse_request(sl_buf_head(&x->uout), sl_buf_len(&x->uout), &lim, &req);
    if (hl <= 0)
        return SL_ERROR;
    nghttp2_nv nva[MAX_FIELDS + 8];
    size_t n = 0;
    const sl_header_t *host = sl_http1_find_header(fields, req.num_headers, "host", 4);
    int tls = x->r.cluster->tls != NULL;
    nva[n++] = nv(":method", 7, req.method.ptr, req.method.len);
    nva[n++] = nv(":scheme", 7, tls ? "https" : "http", tls ? 5 : 4);
    if (host)
        nva[n++] = nv(":authority", 10, host->value.ptr, host->value.len);
    nva[n++] = nv(":path", 5, req.target.ptr, req.target.len);
    for (size_t i = 0; i < req.num_headers; i++) {
        if (is_connection_specific(&fields[i]))
            continue;
        lower(fields[i].name);
        nva[n++] =
            nv(fields[i].name.ptr, fields[i].name.len, fields[i].value.ptr, fields[i].value.len);
    }
    /* gRPC servers require it; it is the only TE HTTP/2 allows. */
    nva[n++] = nv("te", 2, "trailers", 8);
    x->uout_sent = (size_t)hl; /* DATA starts after the head */
    int has_body = !x->req_body_done || sl_buf_len(&x->uout) > (size_t)hl;
    nghttp2_data_provider prd = {.source.ptr = x, .read_callback = data_read_cb};
    int32_t id = nghttp2_submit_request(h->sess, NULL, nva, n, has_body ? &prd : NULL, x);
    if (id < 0)
        return SL_ERROR;
    x->h2 = h;
    x->h2_stream = id;
    x->h2_next = h->active;
    h->active = x;
    h->streams++;
    h->idle_since_ms = 0;
    return SL_OK;
}

static void unlink_active(sl_h2up_t *h, sl_exchange_t *x)
{
    sl_exchange_t **pp = &h->active;
    while (*pp && *pp != x)
        pp = &(*pp)->h2_next;
    if (*pp)
        *pp = x->h2_next;
    x->h2_next = NULL;
}

/* ---- the response --------------------------------------------------------------- */

/* Fields collected in x->uin as "name\0value\0", as slices. */
static size_t collected(sl_buf_t *b, sl_header_t *f, size_t cap, int *status)
{
    size_t n = 0;
    const char *p = sl_buf_head(b), *end = p + sl_buf_len(b);
    while (p < end && n < cap) {
        const char *name = p;
        size_t nl = strlen(p);
        const char *val = name + nl + 1;
        size_t vl = strlen(val);
        p = val + vl + 1;
        if (nl == 7 && memcmp(name, ":status", 7) == 0) {
            if (status)
                *status = atoi(val);
            continue;
        }
        if (nl && name[0] == ':')
            continue;
        f[n++] = (sl_header_t){{name, nl}, {val, vl}};
    }
    return n;
}

size_t sl_exchange_trailers(const sl_exchange_t *x, sl_header_t *out, size_t cap)
{
    sl_buf_t b = x->trailers;
    return collected(&b, out, cap, NULL);
}

static int on_header_cb(nghttp2_session *sess, const nghttp2_frame *frame, const uint8_t *name,
                        size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                        void *user)
{
    (void)flags;
    (void)user;
    if (frame->hd.type != NGHTTP2_HEADERS)
        return 0;
    sl_exchange_t *x = nghttp2_session_get_stream_user_data(sess, frame->hd.stream_id);
    if (!x)
        return 0;
    sl_buf_t *b = x->resp_head_sent ? &x->trailers : &x->uin;
    if (!b->data && sl_worker_buf_get(x->r.w, b) != 0)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    /* A response head or trailer block is bounded like an HTTP/1.1 one;
     * past it the stream is reset (and the request fails over). */
    if (sl_buf_len(b) + namelen + valuelen + 2 > MAX_HEAD_BYTES)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    if (sl_buf_append(b, name, namelen) != 0 || sl_buf_append(b, "", 1) != 0 ||
        sl_buf_append(b, value, valuelen) != 0 || sl_buf_append(b, "", 1) != 0)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    return 0;
}

/* Moves staged body bytes to the client and credits the upstream's window
 * with what the client took. */
static void move_body(sl_h2up_t *h, sl_exchange_t *x)
{
    while (sl_buf_len(&x->uin)) {
        sl_buf_t *out = x->ops->body_buf(x);
        if (sl_buf_space(out) < 1024)
            sl_buf_compact(out);
        size_t room = sl_buf_space(out);
        size_t n = sl_buf_len(&x->uin) < room ? sl_buf_len(&x->uin) : room;
        if (n) {
            memcpy(sl_buf_tail(out), sl_buf_head(&x->uin), n);
            if (sl_unlikely(x->r.cache))
                sl_cache_capture_body(x, sl_buf_tail(out), n);
            sl_request_body_seen(&x->r, 1, sl_buf_tail(out), n, 0);
            out->end += n;
            sl_buf_consume(&x->uin, n);
            nghttp2_session_consume(h->sess, x->h2_stream, n);
        }
        int r = x->ops->body_flush(x);
        if (r < 0)
            return;
        if (r == 0 || n == 0) {
            x->up_paused = 1; /* sl_h2up_resume_recv */
            return;
        }
    }
    x->up_paused = 0;
    if (x->resp_done && x->ops->alive(x))
        sl_exchange_complete(x);
}

static void deliver_head(sl_h2up_t *h, sl_exchange_t *x, int end_stream)
{
    sl_header_t f[MAX_FIELDS];
    int status = 0;
    size_t n = collected(&x->uin, f, MAX_FIELDS, &status);
    sl_http1_response_t resp;
    memset(&resp, 0, sizeof(resp));
    resp.status = status;
    resp.reason = (sl_str_t){sl_http1_reason(status), strlen(sl_http1_reason(status))};
    resp.minor_version = 1;
    resp.headers = f;
    resp.num_headers = n;
    if (status >= 100 && status < 200) {
        if (status != 100 && x->interim_ok && x->ops->head(x, &resp, 1) == SL_OK) {
            x->interim_sent = 1;
            x->ops->body_flush(x);
        }
        x->uin.start = x->uin.end = 0;
        return;
    }
    if (status < 200 || status > 599) {
        sl_h2up_detach(x);
        sl_exchange_failed(x, SL_UPSTREAM_ERR_BAD_RESPONSE, 0);
        return;
    }
    sl_request_note_response(&x->r, status, f, n);
    if (status >= 500 && sl_request_retry_allowed(&x->r, SL_UPSTREAM_ERR__COUNT, status, 0)) {
        sl_h2up_detach(x);
        sl_exchange_failed(x, SL_UPSTREAM_ERR__COUNT, status);
        return;
    }
    sl_request_note_outcome(&x->r, status < 500);
    x->r.status = status;
    sl_request_upstream_head(&x->r, f, n);
    const sl_header_t *cl = sl_http1_find_header(f, n, "content-length", 14);
    resp.body = end_stream ? SL_HTTP1_BODY_NONE : cl ? SL_HTTP1_BODY_LENGTH : SL_HTTP1_BODY_CLOSE;
    resp.content_length = cl ? strtoull(cl->value.ptr, NULL, 10) : 0;
    x->resp_body = resp.body;
    x->resp_done = (uint8_t)end_stream;
    x->dechunk = 0;
    if (sl_unlikely(x->r.cache))
        sl_cache_capture_head(x, &resp);
    if (x->ops->head(x, &resp, 0) != SL_OK) {
        sl_h2up_detach(x);
        sl_exchange_cut(x, "out_of_memory", SL_UPSTREAM_ERR_RESET);
        return;
    }
    x->resp_head_sent = 1;
    x->phase = SL_XP_BODY;
    x->uin.start = x->uin.end = 0; /* from now on: body bytes */
    x->ops->arm_timer(x, x->r.route->timeouts.response_ms);
    if (end_stream)
        move_body(h, x);
}

static int on_frame_recv_cb(nghttp2_session *sess, const nghttp2_frame *frame, void *user)
{
    sl_h2up_t *h = user;
    if (frame->hd.type == NGHTTP2_GOAWAY) {
        h->goaway = 1;
        return 0;
    }
    if (frame->hd.type == NGHTTP2_SETTINGS && !(frame->hd.flags & NGHTTP2_FLAG_ACK))
        return 0;
    sl_exchange_t *x = frame->hd.stream_id
                           ? nghttp2_session_get_stream_user_data(sess, frame->hd.stream_id)
                           : NULL;
    if (!x)
        return 0;
    int end = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
    x->ops->enter(x);
    if (frame->hd.type == NGHTTP2_HEADERS && !x->resp_head_sent) {
        deliver_head(h, x, end);
    } else if (end && x->ops->alive(x) && x->h2 == h) {
        /* Trailers or the last DATA: the response is complete. */
        x->resp_done = 1;
        move_body(h, x);
    }
    x->ops->leave(x);
    return 0;
}

static int on_data_chunk_cb(nghttp2_session *sess, uint8_t flags, int32_t stream_id,
                            const uint8_t *data, size_t len, void *user)
{
    (void)flags;
    sl_h2up_t *h = user;
    sl_exchange_t *x = nghttp2_session_get_stream_user_data(sess, stream_id);
    if (!x) {
        nghttp2_session_consume(sess, stream_id, len);
        return 0;
    }
    if (sl_buf_append(&x->uin, data, len) != 0)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    x->ops->enter(x);
    if (x->ops->alive(x) && !x->up_paused)
        move_body(h, x);
    x->ops->leave(x);
    return 0;
}

static int on_stream_close_cb(nghttp2_session *sess, int32_t stream_id, uint32_t error_code,
                              void *user)
{
    sl_h2up_t *h = user;
    if (h->streams)
        h->streams--;
    if (h->streams == 0)
        h->idle_since_ms = sl_endpoint_now_ms();
    sl_exchange_t *x = nghttp2_session_get_stream_user_data(sess, stream_id);
    if (!x)
        return 0;
    nghttp2_session_set_stream_user_data(sess, stream_id, NULL);
    unlink_active(h, x);
    x->h2 = NULL;
    x->h2_stream = 0;
    if (x->resp_done && error_code == NGHTTP2_NO_ERROR)
        return 0; /* complete; the client side finishes on its own */
    x->ops->enter(x);
    if (x->ops->alive(x)) {
        if (!x->resp_head_sent)
            sl_exchange_failed(x, SL_UPSTREAM_ERR_RESET, 0);
        else if (!x->resp_done)
            sl_exchange_cut(x, "upstream_reset_mid_body", SL_UPSTREAM_ERR_RESET);
    }
    x->ops->leave(x);
    return 0;
}

/* ---- connections ------------------------------------------------------------------ */

static void conn_unlink(sl_h2up_t *h)
{
    sl_h2up_t **pp = pool_list(h->pool);
    while (*pp && *pp != h)
        pp = &(*pp)->next;
    if (*pp)
        *pp = h->next;
}

/* Every exchange on h fails over (retry on another connection when allowed),
 * and the connection goes; h itself is freed by the outermost caller. */
static void conn_fail(sl_h2up_t *h)
{
    if (h->dead)
        return;
    if (h->in_session) {
        h->fail_pending = 1;
        return;
    }
    h->dead = 1;
    conn_unlink(h);
    h->in_cb++;
    /* Queued exchanges never got a stream: a connect failure. */
    while (h->waiting) {
        sl_exchange_t *x = h->waiting;
        h->waiting = x->h2_next;
        x->h2 = NULL;
        x->h2_next = NULL;
        x->ops->enter(x);
        sl_exchange_failed(x, SL_UPSTREAM_ERR_CONNECT, 0);
        x->ops->leave(x);
    }
    /* Open streams: nghttp2_session_del does not call on_stream_close. */
    if (h->sess) {
        while (h->active) {
            sl_exchange_t *x = h->active;
            h->active = x->h2_next;
            x->h2_next = NULL;
            nghttp2_session_set_stream_user_data(h->sess, x->h2_stream, NULL);
            x->h2 = NULL;
            x->h2_stream = 0;
            x->ops->enter(x);
            if (x->ops->alive(x)) {
                if (!x->resp_head_sent)
                    sl_exchange_failed(x, SL_UPSTREAM_ERR_RESET, 0);
                else if (!x->resp_done)
                    sl_exchange_cut(x, "upstream_reset_mid_body", SL_UPSTREAM_ERR_RESET);
            }
            x->ops->leave(x);
        }
        nghttp2_session_del(h->sess);
        h->sess = NULL;
    }
    h->in_cb--;
    if (h->uc) {
        h->uc->h2 = NULL;
        sl_upstream_close(h->w, h->uc);
        h->uc = NULL;
    }
    sl_worker_buf_put(h->w, &h->out);
    /* The memory goes when the outermost caller unwinds (in_cb == 0). */
}

static ssize_t send_cb(nghttp2_session *sess, const uint8_t *data, size_t len, int flags,
                       void *user)
{
    (void)sess;
    (void)flags;
    sl_h2up_t *h = user;
    /* Frames queue in `out` (bounded by what nghttp2 frames per call and
     * by the streams' windows); conn_pump writes them. */
    if (sl_buf_len(&h->out) > 4 * READ_CHUNK)
        return NGHTTP2_ERR_WOULDBLOCK;
    if (sl_buf_append(&h->out, data, len) != 0)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    return (ssize_t)len;
}

/* The next exchange whose body DATA took bytes, so that the client side
 * refills uout (streams that wait for body bytes would otherwise wait for a
 * client edge that backpressure has already consumed). */
static sl_exchange_t *next_wanting_body(sl_h2up_t *h)
{
    for (sl_exchange_t *x = h->active; x; x = x->h2_next)
        if (x->h2_wants_body)
            return x;
    return NULL;
}

static void conn_send(sl_h2up_t *h);

/* Sends what the session has, refills request bodies, and again, until
 * neither makes progress; never nested (a resume from a refill just asks
 * for another round). */
static void conn_pump(sl_h2up_t *h)
{
    if (h->dead || !h->ready)
        return;
    if (h->pumping || h->in_session) {
        h->repump = 1;
        return;
    }
    h->pumping = 1;
    do {
        h->repump = 0;
        conn_send(h);
        sl_exchange_t *x;
        while (!h->dead && (x = next_wanting_body(h)) != NULL) {
            x->h2_wants_body = 0;
            x->ops->enter(x);
            if (x->ops->alive(x))
                sl_exchange_drive(x);
            x->ops->leave(x);
        }
    } while (h->repump && !h->dead);
    h->pumping = 0;
    if (!h->dead && !nghttp2_session_want_read(h->sess) && !nghttp2_session_want_write(h->sess) &&
        h->streams == 0)
        conn_fail(h);
}

static void deferred_pump(sl_deferred_t *d)
{
    sl_h2up_t *h = (sl_h2up_t *)((char *)d - offsetof(sl_h2up_t, flush));
    conn_pump(h);
    if (--h->in_cb == 0 && h->dead)
        free(h);
}

/* conn_pump at the end of the worker's event batch (worker.h, "Write
 * batching"), holding h until then; at once where the worker does not
 * batch. */
static void conn_pump_soon(sl_h2up_t *h)
{
    h->flush.run = deferred_pump;
    int r = sl_worker_defer(h->w, &h->flush);
    if (r > 0)
        h->in_cb++;
    else if (r < 0)
        conn_pump(h);
}

static void conn_send(sl_h2up_t *h)
{
    for (;;) {
        while (sl_buf_len(&h->out)) {
            ssize_t n = sl_upstream_write(h->uc, sl_buf_head(&h->out), sl_buf_len(&h->out));
            if (n > 0) {
                sl_buf_consume(&h->out, (size_t)n);
                continue;
            }
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && errno == EAGAIN) {
                h->write_blocked = 1;
                return;
            }
            conn_fail(h);
            return;
        }
        h->write_blocked = 0;
        if (!nghttp2_session_want_write(h->sess))
            break;
        h->in_session++;
        int rc = nghttp2_session_send(h->sess);
        h->in_session--;
        if (rc != 0 || h->fail_pending) {
            conn_fail(h);
            return;
        }
        if (sl_buf_len(&h->out) == 0)
            break;
    }
}

static void conn_ready(sl_h2up_t *h)
{
    h->ready = 1;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEAD_BYTES},
    };
    nghttp2_submit_settings(h->sess, NGHTTP2_FLAG_NONE, iv, SL_ARRAY_LEN(iv));
    nghttp2_session_set_local_window_size(h->sess, NGHTTP2_FLAG_NONE, 0, CONN_WINDOW);
    h->in_cb++;
    while (h->waiting && !h->dead) {
        sl_exchange_t *x = h->waiting;
        h->waiting = x->h2_next;
        x->h2_next = NULL;
        x->h2 = NULL;
        x->ops->enter(x);
        if (x->ops->alive(x) && submit(h, x) != SL_OK)
            sl_exchange_failed(x, SL_UPSTREAM_ERR_CONNECT, 0);
        x->ops->leave(x);
    }
    h->in_cb--;
    conn_pump_soon(h); /* SETTINGS and the queued requests, in one write */
}

void sl_h2up_event(sl_h2up_t *h, short what)
{
    sl_upconn_t *uc = h->uc;
    h->in_cb++;
    if (!h->ready) {
        if (!uc->connected) {
            int err = 0;
            socklen_t len = sizeof(err);
            if (getsockopt(uc->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
                conn_fail(h);
                goto out;
            }
            if (!(what & (EV_WRITE | EV_READ)))
                goto out;
            uc->connected = 1;
        }
        int hs = sl_upstream_handshake(uc);
        if (hs == SL_AGAIN)
            goto out;
        if (hs != SL_OK || (uc->ssl && !alpn_is_h2(uc->ssl))) {
            sl_log_warn("backend endpoint %s:%u: TLS handshake for HTTP/2 failed (check the "
                        "Backend's tls settings, and that the endpoint offers h2 by ALPN)",
                        h->pool->ep->address, h->pool->ep->port);
            conn_fail(h);
            goto out;
        }
        conn_ready(h);
        goto out;
    }
    if ((what & (EV_READ | EV_CLOSED)) || (uc->tls_read_wants_write && (what & EV_WRITE))) {
        char buf[READ_CHUNK];
        for (;;) {
            ssize_t n = sl_upstream_read(uc, buf, sizeof(buf));
            if (n > 0) {
                h->in_session++;
                ssize_t rc = nghttp2_session_mem_recv(h->sess, (const uint8_t *)buf, (size_t)n);
                h->in_session--;
                if (rc < 0 || h->fail_pending) {
                    conn_fail(h);
                    goto out;
                }
                if (h->dead)
                    goto out;
                continue;
            }
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && errno == EAGAIN)
                break;
            conn_fail(h); /* EOF or error */
            goto out;
        }
    }
    conn_pump_soon(h); /* acks and window updates, with what the batch adds */
out:
    if (--h->in_cb == 0 && h->dead)
        free(h);
}

static sl_h2up_t *conn_new(sl_exchange_t *x)
{
    sl_pool_t *pool = x->r.pool;
    sl_h2up_t *h = calloc(1, sizeof(*h));
    if (!h)
        return NULL;
    static nghttp2_session_callbacks *cbs;
    if (!cbs) { /* once per process: immutable afterwards, shared by threads */
        static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
        pthread_mutex_lock(&lock);
        if (!cbs) {
            nghttp2_session_callbacks *c;
            if (nghttp2_session_callbacks_new(&c) == 0) {
                nghttp2_session_callbacks_set_send_callback(c, send_cb);
                nghttp2_session_callbacks_set_on_header_callback(c, on_header_cb);
                nghttp2_session_callbacks_set_on_frame_recv_callback(c, on_frame_recv_cb);
                nghttp2_session_callbacks_set_on_data_chunk_recv_callback(c, on_data_chunk_cb);
                nghttp2_session_callbacks_set_on_stream_close_callback(c, on_stream_close_cb);
                __atomic_store_n(&cbs, c, __ATOMIC_RELEASE);
            }
        }
        pthread_mutex_unlock(&lock);
    }
    nghttp2_option *opt = NULL;
    if (!cbs || nghttp2_option_new(&opt) != 0)
        goto fail;
    /* The window is credited as the client takes the bytes (move_body). */
    nghttp2_option_set_no_auto_window_update(opt, 1);
    int rc = nghttp2_session_client_new2(&h->sess, cbs, h, opt);
    nghttp2_option_del(opt);
    if (rc != 0)
        goto fail;
    h->uc = sl_upstream_connect(x->r.w, pool, x->r.cluster->tls, x->r.cluster->tls_name);
    if (!h->uc)
        goto fail;
    h->uc->h2 = h;
    h->pool = pool;
    h->w = x->r.w;
    h->next = *pool_list(pool);
    *pool_list(pool) = h;
    return h;
fail:
    if (h->sess)
        nghttp2_session_del(h->sess);
    free(h);
    return NULL;
}

void sl_h2up_start(sl_exchange_t *x)
{
    sl_h2up_t *h = *pool_list(x->r.pool);
    while (h && (h->dead || h->goaway || (h->ready && h->streams >= max_streams(h))))
        h = h->next;
    if (!h) {
        h = conn_new(x);
        if (!h) {
            sl_exchange_failed(x, SL_UPSTREAM_ERR_CONNECT, 0);
            return;
        }
    }
    x->phase = SL_XP_WAIT_HEAD;
    x->ops->arm_timer(x, x->r.route->timeouts.response_ms);
    if (!h->ready) {
        x->h2 = h;
        x->h2_next = h->waiting;
        h->waiting = x;
        return;
    }
    h->in_cb++;
    if (submit(h, x) != SL_OK) {
        h->in_cb--;
        sl_exchange_failed(x, SL_UPSTREAM_ERR_CONNECT, 0);
        return;
    }
    conn_pump_soon(h); /* with the body that follows in this batch */
    if (--h->in_cb == 0 && h->dead)
        free(h);
}

void sl_h2up_resume_send(sl_exchange_t *x)
{
    sl_h2up_t *h = x->h2;
    if (!h || !x->h2_stream || h->dead)
        return;
    nghttp2_session_resume_data(h->sess, x->h2_stream);
    h->in_cb++;
    conn_pump_soon(h);
    if (--h->in_cb == 0 && h->dead)
        free(h);
}

void sl_h2up_resume_recv(sl_exchange_t *x)
{
    sl_h2up_t *h = x->h2;
    if (!h || h->dead)
        return;
    h->in_cb++;
    x->up_paused = 0;
    move_body(h, x);
    conn_pump_soon(h); /* the window updates */
    if (--h->in_cb == 0 && h->dead)
        free(h);
}

void sl_h2up_detach(sl_exchange_t *x)
{
    sl_h2up_t *h = x->h2;
    x->h2 = NULL;
    if (!h)
        return;
    if (!x->h2_stream) {
        /* Still queued for the connection. */
        sl_exchange_t **pp = &h->waiting;
        while (*pp && *pp != x)
            pp = &(*pp)->h2_next;
        if (*pp)
            *pp = x->h2_next;
        x->h2_next = NULL;
        return;
    }
    if (h->dead || !h->sess)
        return;
    unlink_active(h, x);
    nghttp2_session_set_stream_user_data(h->sess, x->h2_stream, NULL);
    /* A complete response to a complete request (detached from the frame
     * that ended it, before nghttp2 closes the stream): both ends are
     * closed, so a RST_STREAM would only cost a frame and a write per
     * call. Otherwise the backend must stop: CANCEL. */
    if (!x->resp_done || nghttp2_session_get_stream_local_close(h->sess, x->h2_stream) != 1)
        nghttp2_submit_rst_stream(h->sess, NGHTTP2_FLAG_NONE, x->h2_stream, NGHTTP2_CANCEL);
    x->h2_stream = 0;
    h->in_cb++;
    conn_pump_soon(h);
    if (--h->in_cb == 0 && h->dead)
        free(h);
}

void sl_h2up_sweep(sl_pool_t *pool, uint64_t now_ms, uint32_t idle_timeout_ms)
{
    sl_h2up_t *h = *pool_list(pool);
    while (h) {
        sl_h2up_t *next = h->next;
        if (h->ready && h->streams == 0 && !h->waiting && h->idle_since_ms &&
            now_ms - h->idle_since_ms >= idle_timeout_ms) {
            conn_fail(h);
            if (h->in_cb == 0)
                free(h);
        }
        h = next;
    }
}

void sl_h2up_close_all(sl_pool_t *pool)
{
    while (*pool_list(pool)) {
        sl_h2up_t *h = *pool_list(pool);
        conn_fail(h);
        if (h->in_cb == 0)
            free(h);
    }
}
