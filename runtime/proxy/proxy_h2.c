/*
 * The HTTP/2 side of a client connection: the glue between a socket, the
 * HTTP/2 codec (http/h2.c, I/O-free) and, per stream, the protocol-
 * independent request and its upstream exchange (request.c, exchange.c).
 * Every stream is one sl_request_t + sl_exchange_t, exactly as an HTTP/1.1
 * request is, so routing, limits, errors, retries, metrics and the access
 * log are the same code for both protocols; only the framing differs.
 *
 * Per connection: `in` (bytes read, fed to the codec at once) and `out`
 * (frames for the client; while the client does not read it, the
 * connection stops reading too, so neither side grows memory).
 * Per stream: `pending`, request body bytes from DATA frames that wait for
 * room in the exchange's uout (bounded by the stream's flow-control window:
 * the codec credits the client only when sl_h2_consume says they moved on),
 * and `out`, response body bytes the exchange read from the upstream for
 * sl_h2_stream_write (bounded by the codec's per-stream send buffer: when it
 * is full the exchange pauses until on_stream_writable).
 *
 * Request bodies go to HTTP/1.1 upstreams with Content-Length when the
 * client sent one, else chunked (framed here); response bodies reach the
 * codec as payload only (the exchange de-chunks). A body a policy reads
 * whole (read_policy_body) is gathered in the request's body buffer first,
 * its window credited as it comes, then becomes `pending` with a length.
 *
 * WebSocket over HTTP/2 (RFC 8441): an extended CONNECT with :protocol is
 * routed as a GET of its :path (same router, same `upgrades` allow-list as
 * an HTTP/1.1 Upgrade) and goes to the HTTP/1.1 origin as that GET with
 * Upgrade, a Sec-WebSocket-Key of ours (exchange.c writes it) and version
 * 13. A 101 whose Upgrade and Sec-WebSocket-Accept check out
 * (sl_exchange_tunnel_check) is answered 200, and the stream becomes a byte
 * tunnel (tunnel_pump): DATA payload -> the origin's socket, its bytes ->
 * DATA. The same buffers bound it: `pending` holds client bytes the origin
 * has not taken (credited with sl_h2_consume only once written, so the
 * client's window is the bound), `out` origin bytes the codec has not taken
 * (the origin is not read while the stream's send buffer is full). Each
 * side's end is relayed as the other's: END_STREAM -> shutdown(SHUT_WR),
 * the origin's EOF -> END_STREAM; a reset or error on either side ends
 * both (RST_STREAM CANCEL to the client). Like an HTTP/1.1 tunnel, it is
 * logged when it opens, holds no generation, and closes after the route's
 * tunnelIdle without a byte either way.
 *
 * Worker-thread only. Memory: a stream or connection is freed only when no
 * callback of it is on the stack (in_cb), as in proxy.c.
 */
#include "proxy.h"

#include "exchange.h"
#include "generation.h"
#include "h2.h"
#include "log.h"
#include "metrics.h"
#include "request.h"
#include "tls.h"
#include "websocket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct h2s h2s_t;

typedef struct sl_h2c {
    sl_worker_t *w;
    sl_listener_sock_t *ls;
    int fd;
    struct event *ev, *timer;
    sl_h2_conn_t *h2;
    sl_buf_t in, out;
    char client_ip[INET6_ADDRSTRLEN];
    uint8_t read_ready;
    uint8_t write_blocked;     /* the socket took less than we had */
    uint64_t blocked_since_ms; /* ...and has taken nothing more since */
    uint8_t fatal;             /* a connection error: flush what is pending, then close */
    uint8_t dead;              /* closed; freed when the last callback unwinds */
    unsigned in_cb;
    uint64_t idle_since_ms;
    h2s_t *streams;
    struct sl_h2c *prev, *next;
    SSL *ssl;            /* h2 over TLS (ALPN), else NULL */
    sl_tls_peer_t *peer; /* its verified client certificate, or NULL */
    uint8_t tls_read_wants_write, tls_write_wants_read;
    sl_deferred_t flush; /* conn_pump at the end of the event batch */
} h2c_t;

struct h2s {
    sl_exchange_t x; /* first: an exchange pointer is its stream */
    h2c_t *hc;
    int32_t id;
    struct event *timer;
    sl_buf_t pending;     /* request body bytes not yet in uout */
    sl_buf_t out;         /* response body bytes not yet taken by the codec */
    uint8_t body_end;     /* the client's END_STREAM arrived */
    uint8_t chunked;      /* the request body goes upstream chunked */
    uint8_t started;      /* routed; the exchange runs */
    uint8_t ended;        /* our response ended (END_STREAM queued) */
    uint8_t end_pending;  /* complete() waits for room to write the rest */
    uint8_t done;         /* logged and counted; the upstream side is released */
    uint8_t closed;       /* the codec closed the stream: its id is invalid */
    uint8_t body_read;    /* reading a body a policy reads whole (read_policy_body) */
    uint8_t body_granted; /* ...read: `pending` holds it, its window credited already */
    uint8_t tunnel;       /* an extended CONNECT: a 101 opens a tunnel */
    uint8_t tun_open;     /* ...it did: bytes flow, see tunnel_pump */
    uint8_t tun_up_eof;   /* the origin's EOF was read */
    uint8_t tun_up_shut;  /* the client's END_STREAM went on as shutdown(SHUT_WR) */
    uint8_t tun_down_end; /* the origin's EOF went on as END_STREAM */
    uint32_t tun_idle_ms;
    uint64_t tun_last_ms; /* last byte relayed, for the idle timeout */
    unsigned in_cb;
    h2s_t *prev, *next;
};

static const sl_exchange_ops_t h2_exchange_ops;
static void conn_pump(h2c_t *hc);
static void conn_close(h2c_t *hc);

static void deferred_pump(sl_deferred_t *d)
{
    h2c_t *hc = (h2c_t *)((char *)d - offsetof(h2c_t, flush));
    if (!hc->dead)
        conn_pump(hc);
    if (--hc->in_cb == 0 && hc->dead)
        free(hc);
}
static void stream_free(h2s_t *s);

static inline h2s_t *stream_of(sl_exchange_t *x)
{
    return (h2s_t *)x;
}

/* Socket I/O, plain or TLS, with read(2)/write(2) results (see proxy.c). */
static ssize_t conn_recv(h2c_t *hc, void *buf, size_t n)
{
    return sl_io_read(hc->fd, hc->ssl, buf, n, &hc->tls_read_wants_write);
}

static ssize_t conn_send(h2c_t *hc, const void *buf, size_t n)
{
    return sl_io_write(hc->fd, hc->ssl, buf, n, &hc->tls_write_wants_read);
}

static h2s_t *find_stream(h2c_t *hc, int32_t id)
{
    for (h2s_t *s = hc->streams; s; s = s->next)
        if (s->id == id)
            return s;
    return NULL;
}

static uint64_t now_ms(void *user)
{
    (void)user;
    return sl_endpoint_now_ms();
}

/* ---- stream life ------------------------------------------------------------ */

/* The request is over for the gateway: release the upstream side, count
 * and log it once. */
static void stream_done(h2s_t *s, int ok)
{
    if (s->done)
        return;
    s->done = 1;
    sl_exchange_finish(&s->x, ok);
    if (!s->x.r.status)
        s->x.r.status = 499;
    sl_request_log(&s->x.r);
    evtimer_del(s->timer);
}

static void stream_free(h2s_t *s)
{
    h2c_t *hc = s->hc;
    if (s->tun_open)
        sl_exchange_finish(&s->x, 0); /* closes the origin's connection */
    if (s->prev)
        s->prev->next = s->next;
    else
        hc->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    sl_request_reset(&s->x.r);
    sl_exchange_reset(&s->x);
    sl_worker_buf_put(hc->w, &s->pending);
    sl_worker_buf_put(hc->w, &s->out);
    if (s->timer)
        event_free(s->timer);
    free(s);
}

static void stream_enter(h2s_t *s)
{
    s->in_cb++;
    s->hc->in_cb++;
}

static void stream_leave(h2s_t *s)
{
    h2c_t *hc = s->hc;
    if (--s->in_cb == 0 && s->closed)
        stream_free(s);
    if (--hc->in_cb == 0 && !hc->dead) {
        /* Outermost callback of the connection (an upstream's event or a
         * timer, not this connection's own): send what it queued with what
         * the rest of the event batch adds (worker.h, "Write batching"). */
        hc->flush.run = deferred_pump;
        int r = sl_worker_defer(hc->w, &hc->flush);
        if (r > 0) {
            hc->in_cb++; /* held until deferred_pump */
        } else if (r < 0) {
            hc->in_cb++;
            conn_pump(hc);
            hc->in_cb--;
        }
    }
    if (hc->in_cb == 0 && hc->dead)
        free(hc);
}

/* Response fields from the upstream's, for the codec: hop-by-hop ones and
 * Content-Length of 1xx/204 removed (the codec drops connection-specific
 * ones and lower-cases names); Date and X-Request-Id added when missing. */
static size_t response_fields(h2s_t *s, const sl_http1_response_t *resp, sl_header_t *f, size_t cap,
                              char *date_buf, size_t date_cap)
{
    sl_conn_opts_t co;
    sl_conn_opts_collect(&co, resp->headers, resp->num_headers);
    int drop_length = resp->status < 200 || resp->status == 204;
    int has_date = 0, has_reqid = 0;
    size_t n = 0;
    for (size_t i = 0; i < resp->num_headers && n + 3 < cap; i++) {
        const sl_header_t *h = &resp->headers[i];
        if (sl_http_is_hop_by_hop(h, &co))
            continue;
        if (h->name.len == 14 && strncasecmp(h->name.ptr, "content-length", 14) == 0 && drop_length)
            continue;
        /* No Trailer (advisory); the fields follow as trailing HEADERS. */
        if (h->name.len == 7 && strncasecmp(h->name.ptr, "trailer", 7) == 0)
            continue;
        if (h->name.len == 4 && strncasecmp(h->name.ptr, "date", 4) == 0)
            has_date = 1;
        if (h->name.len == 12 && strncasecmp(h->name.ptr, "x-request-id", 12) == 0)
            has_reqid = 1;
        if (sl_unlikely(s->x.r.pol) && sl_request_header_dropped(&s->x.r, 1, h->name))
            continue;
        f[n++] = *h;
    }
    if (sl_unlikely(s->x.r.pol) && resp->status >= 200 && n + 3 < cap)
        n += sl_request_header_added(&s->x.r, 1, f + n, cap - 3 - n);
    if (!has_date) {
        size_t dl;
        const char *d = sl_request_date_line(&dl); /* "Date: ...\r\n" */
        if (dl > 8 && dl - 8 < date_cap) {
            memcpy(date_buf, d + 6, dl - 8);
            f[n++] = (sl_header_t){{"date", 4}, {date_buf, dl - 8}};
        }
    }
    if (!has_reqid && s->x.r.m_reqid.len)
        f[n++] = (sl_header_t){{"x-request-id", 12}, s->x.r.m_reqid};
    if (s->x.r.gen && s->x.r.gen->add_via)
        f[n++] = (sl_header_t){{"via", 3}, {"1.1 sluice", 10}};
    return n;
}

/* A gateway error as an HTTP/2 response (JSON body, as for HTTP/1.1). */
/*
 * A gateway error for a gRPC client: a Trailers-Only response (HTTP 200,
 * grpc-status, grpc-message percent-encoded as the protocol says), which
 * every gRPC client turns into a status, where a JSON body would only be a
 * protocol error to it. The log and metrics keep the HTTP status it stands
 * for (with the error code).
 */
static void stream_grpc_error(h2s_t *s, int status, const char *code, const char *message)
{
    h2c_t *hc = s->hc;
    char gs[8], msg[600], date_buf[48];
    snprintf(gs, sizeof(gs), "%d", sl_request_grpc_status(status, code));
    size_t o = 0;
    for (const char *p = message; *p && o + 4 < sizeof(msg); p++) {
        unsigned char ch = (unsigned char)*p;
        if (ch >= 0x20 && ch <= 0x7e && ch != '%') {
            msg[o++] = (char)ch;
        } else {
            static const char hex[] = "0123456789ABCDEF";
            msg[o++] = '%';
            msg[o++] = hex[ch >> 4];
            msg[o++] = hex[ch & 15];
        }
    }
    sl_header_t f[6];
    size_t n = 0;
    f[n++] = (sl_header_t){{"content-type", 12}, {"application/grpc", 16}};
    f[n++] = (sl_header_t){{"grpc-status", 11}, {gs, strlen(gs)}};
    f[n++] = (sl_header_t){{"grpc-message", 12}, {msg, o}};
    f[n++] = (sl_header_t){{"x-request-id", 12}, s->x.r.m_reqid};
    size_t dl;
    const char *d = sl_request_date_line(&dl);
    if (dl > 8 && dl - 8 < sizeof(date_buf)) {
        memcpy(date_buf, d + 6, dl - 8);
        f[n++] = (sl_header_t){{"date", 4}, {date_buf, dl - 8}};
    }
    if (sl_h2_submit_response(hc->h2, s->id, 200, f, n, 1) == SL_OK) {
        s->ended = 1;
        if (!s->body_end)
            sl_h2_reset_stream(hc->h2, s->id, SL_H2_NO_ERROR);
    }
    stream_done(s, 0);
}

static void stream_error(h2s_t *s, int status, const char *code, const char *message,
                         unsigned allow)
{
    h2c_t *hc = s->hc;
    s->x.r.error_code = code;
    s->x.r.status = status;
    if (s->x.r.grpc) {
        sl_request_ensure_id(&s->x.r);
        stream_grpc_error(s, status, code, message);
        return;
    }
    char body[900], clen[24], allow_buf[96], date_buf[48];
    size_t blen = sl_request_error_body(&s->x.r, status, code, message, body, sizeof(body));
    const char *bp = body;
    sl_str_t ctype = {"application/json", 16};
    const sl_policy_reply_t *reply = sl_request_reply(&s->x.r);
    if (reply && reply->body) { /* respond, redirect: the policy's own body */
        bp = reply->body;
        blen = reply->body_len;
        if (reply->content_type)
            ctype = (sl_str_t){reply->content_type, strlen(reply->content_type)};
    }
    snprintf(clen, sizeof(clen), "%zu", blen);
    sl_header_t f[6 + SL_POLICY_MAX_REPLY_HEADERS + SL_REQ_POLICY_EDITS];
    size_t n = 0;
    if (status == 204) { /* a CORS preflight's answer: no body, no length (RFC 9110 8.6) */
        blen = 0;
    } else {
        f[n++] = (sl_header_t){{"content-type", 12}, ctype};
        f[n++] = (sl_header_t){{"content-length", 14}, {clen, strlen(clen)}};
    }
    f[n++] = (sl_header_t){{"x-request-id", 12}, s->x.r.m_reqid};
    size_t dl;
    const char *d = sl_request_date_line(&dl);
    if (dl > 8 && dl - 8 < sizeof(date_buf)) {
        memcpy(date_buf, d + 6, dl - 8);
        f[n++] = (sl_header_t){{"date", 4}, {date_buf, dl - 8}};
    }
    if (allow) {
        static const struct {
            unsigned bit;
            const char *name;
        } methods[] = {{SL_METHOD_GET, "GET"},         {SL_METHOD_HEAD, "HEAD"},
                       {SL_METHOD_POST, "POST"},       {SL_METHOD_PUT, "PUT"},
                       {SL_METHOD_DELETE, "DELETE"},   {SL_METHOD_PATCH, "PATCH"},
                       {SL_METHOD_OPTIONS, "OPTIONS"}, {SL_METHOD_TRACE, "TRACE"},
                       {SL_METHOD_CONNECT, "CONNECT"}};
        size_t o = 0;
        for (size_t i = 0; i < SL_ARRAY_LEN(methods); i++) {
            if (!(allow & methods[i].bit))
                continue;
            o += (size_t)snprintf(allow_buf + o, sizeof(allow_buf) - o, "%s%s", o ? ", " : "",
                                  methods[i].name);
        }
        f[n++] = (sl_header_t){{"allow", 5}, {allow_buf, o}};
    }
    for (unsigned i = 0; reply && i < reply->num_headers; i++)
        f[n++] = (sl_header_t){{reply->headers[i].name, strlen(reply->headers[i].name)},
                               {reply->headers[i].value, strlen(reply->headers[i].value)}};
    if (sl_unlikely(s->x.r.pol)) {
        sl_request_response_hooks(&s->x.r, status);
        n += sl_request_header_added(&s->x.r, 1, f + n, SL_ARRAY_LEN(f) - n);
    }
    int head_only = s->x.r.method_bit == SL_METHOD_HEAD || status == 204;
    if (sl_h2_submit_response(hc->h2, s->id, status, f, n, head_only) == SL_OK) {
        if (!head_only)
            sl_h2_stream_write(hc->h2, s->id, (const uint8_t *)bp, blen, 1);
        s->ended = 1;
        /* The rest of a request body is not wanted (RFC 9113 8.1). */
        if (!s->body_end)
            sl_h2_reset_stream(hc->h2, s->id, SL_H2_NO_ERROR);
    }
    stream_done(s, 0);
}

/* ---- codec callbacks ---------------------------------------------------------- */

static void stream_timer_cb(evutil_socket_t fd, short what, void *arg);
static void tunnel_request(h2s_t *s, const sl_req_head_t *head, const sl_h2_req_info_t *info);
static void tunnel_pump(h2s_t *s);
static void read_policy_body(h2s_t *s, const uint8_t *p, size_t n, int end_stream);
static void x_arm_timer(sl_exchange_t *x, uint32_t ms);
static void x_pump_body(sl_exchange_t *x);

static void on_request(void *user, int32_t id, const sl_req_head_t *head,
                       const sl_h2_req_info_t *info)
{
    h2c_t *hc = user;
    h2s_t *s = calloc(1, sizeof(*s));
    if (!s || !(s->timer = evtimer_new(hc->w->base, stream_timer_cb, s))) {
        free(s);
        sl_h2_reset_stream(hc->h2, id, SL_H2_REFUSED_STREAM);
        return;
    }
    s->hc = hc;
    s->id = id;
    s->next = hc->streams;
    if (hc->streams)
        hc->streams->prev = s;
    hc->streams = s;
    stream_enter(s);
    sl_request_init(&s->x.r, hc->w, hc->client_ip);
    s->x.r.https = hc->ssl != NULL;
    s->x.r.peer = hc->peer;
    s->x.ops = &h2_exchange_ops;
    s->x.interim_ok = 1;
    s->x.dechunk = 1; /* the codec frames payload itself */
    sl_request_begin(&s->x.r);
    sl_request_set_head(&s->x.r, head);
    s->body_end = (info->flags & SL_H2_REQ_END_STREAM) != 0;
    s->x.req_body_done = s->body_end;
    if (info->flags & SL_H2_REQ_EXTENDED_CONNECT) {
        tunnel_request(s, head, info);
        goto out;
    }
    sl_str_t path;
    sl_request_error_t err;
    if (sl_request_route(&s->x.r, head, &path, &err) != SL_OK) {
        stream_error(s, err.status, err.code, err.message, err.allow);
        goto out;
    }
    enum sl_http1_body body = s->body_end        ? SL_HTTP1_BODY_NONE
                              : head->has_length ? SL_HTTP1_BODY_LENGTH
                                                 : SL_HTTP1_BODY_CHUNKED;
    /* A body a policy reads whole gets its length once it is read. */
    uint64_t body_cap = sl_request_body_cap(&s->x.r);
    if (sl_unlikely(body_cap))
        body = SL_HTTP1_BODY_NONE;
    s->chunked = body == SL_HTTP1_BODY_CHUNKED;
    if (sl_exchange_build_head(&s->x, head, path, body, head->content_length,
                               (sl_str_t){NULL, 0}) != SL_OK) {
        stream_error(s, 503, "overloaded", "out of memory", 0);
        goto out;
    }
    if (sl_unlikely(body_cap)) {
        s->body_read = 1; /* the exchange starts once it is read */
        x_arm_timer(&s->x, s->x.r.gen->idle_timeout_ms);
        goto out;
    }
    s->started = 1;
    sl_exchange_start(&s->x);
out:
    stream_leave(s);
}

static int body_over_limit(h2s_t *s)
{
    return s->x.r.max_body_bytes && s->x.r.bytes_received > s->x.r.max_body_bytes;
}

static void on_data(void *user, int32_t id, const uint8_t *p, size_t n, int end_stream)
{
    h2c_t *hc = user;
    h2s_t *s = find_stream(hc, id);
    if (s && sl_unlikely(s->body_read) && !s->done) {
        stream_enter(s);
        read_policy_body(s, p, n, end_stream);
        stream_leave(s);
        return;
    }
    int tunnel_bytes = s && s->tunnel && (s->tun_open || (s->started && !s->done));
    if (!s || ((s->done || !s->started) && !tunnel_bytes)) {
        /* Nobody wants these bytes: let the client's window recover. */
        if (n)
            sl_h2_consume(hc->h2, id, n);
        return;
    }
    stream_enter(s);
    if (s->tunnel) {
        /* Tunnel bytes (also before the 200: a client may be optimistic),
         * held until the origin takes them; the stream window bounds them. */
        if (n && sl_buf_append(&s->pending, p, n) != 0) {
            stream_error(s, 503, "overloaded", "out of memory", 0);
            goto out;
        }
        if (end_stream)
            s->body_end = 1;
        tunnel_pump(s);
        goto out;
    }
    if (n) {
        s->x.r.bytes_received += n;
        if (body_over_limit(s)) {
            sl_h2_consume(hc->h2, id, n);
            if (s->x.resp_head_sent) {
                s->x.r.error_code = "payload_too_large";
                stream_done(s, 0);
                sl_h2_reset_stream(hc->h2, id, SL_H2_CANCEL);
            } else {
                stream_error(s, 413, "payload_too_large",
                             "the request body exceeds the limit of this API", 0);
            }
            goto out;
        }
        if (sl_buf_append(&s->pending, p, n) != 0) {
            stream_error(s, 503, "overloaded", "out of memory", 0);
            goto out;
        }
    }
    if (end_stream)
        s->body_end = 1;
    sl_exchange_drive(&s->x);
out:
    stream_leave(s);
}

static void on_stream_close(void *user, int32_t id, uint32_t error_code)
{
    h2c_t *hc = user;
    h2s_t *s = find_stream(hc, id);
    if (!s)
        return;
    if (!s->done) {
        /* The client reset the stream, or the connection went away. */
        s->x.r.error_code = error_code == SL_H2_NO_ERROR ? "client_closed" : "client_reset";
        stream_done(s, 0);
    }
    s->closed = 1;
    if (s->in_cb == 0)
        stream_free(s);
}

static void stream_write_out(h2s_t *s);

static void on_stream_writable(void *user, int32_t id)
{
    h2c_t *hc = user;
    h2s_t *s = find_stream(hc, id);
    if (s && s->tun_open) {
        stream_enter(s);
        tunnel_pump(s);
        stream_leave(s);
        return;
    }
    if (!s || s->done)
        return;
    stream_enter(s);
    if (s->end_pending)
        stream_write_out(s);
    else
        sl_exchange_resume(&s->x);
    stream_leave(s);
}

/* ---- exchange ops -------------------------------------------------------------- */

static void x_enter(sl_exchange_t *x)
{
    stream_enter(stream_of(x));
}

static void x_leave(sl_exchange_t *x)
{
    stream_leave(stream_of(x));
}

static int x_alive(sl_exchange_t *x)
{
    h2s_t *s = stream_of(x);
    return !s->done && !s->closed && !s->hc->dead;
}

static int x_head(sl_exchange_t *x, const sl_http1_response_t *resp, int interim)
{
    h2s_t *s = stream_of(x);
    if (sl_unlikely(x->r.pol) && !interim)
        sl_request_response_hooks(&x->r, resp->status);
    sl_header_t f[136 + SL_REQ_POLICY_EDITS];
    char date_buf[48], timing[96];
    size_t n = response_fields(s, resp, f, SL_ARRAY_LEN(f), date_buf, sizeof(date_buf));
    if (sl_unlikely(x->r.gen && x->r.gen->tracing.server_timing) && !interim &&
        n < SL_ARRAY_LEN(f)) {
        size_t tl = sl_request_server_timing(&x->r, timing, sizeof(timing));
        if (tl)
            f[n++] = (sl_header_t){{"server-timing", 13}, {timing, tl}};
    }
    int end = !interim && x->resp_done;
    int rc = sl_h2_submit_response(s->hc->h2, s->id, resp->status, f, n, end);
    if (rc == SL_DECLINED) {
        /* The stream is gone: on_stream_close ends the request. */
        return SL_OK;
    }
    if (rc != SL_OK)
        return SL_ERROR;
    if (end)
        s->ended = 1;
    return SL_OK;
}

static sl_buf_t *x_body_buf(sl_exchange_t *x)
{
    h2s_t *s = stream_of(x);
    if (!s->out.data)
        sl_worker_buf_get(s->hc->w, &s->out);
    return &s->out;
}

/* Hands `out` to the codec. 1 all taken, 0 the stream's buffer is full, -1
 * the stream is gone. */
static int hand_out(h2s_t *s, int end)
{
    h2c_t *hc = s->hc;
    for (;;) {
        size_t len = sl_buf_len(&s->out);
        ssize_t n =
            sl_h2_stream_write(hc->h2, s->id, (const uint8_t *)sl_buf_head(&s->out), len, end);
        if (n < 0) {
            if (!s->done) {
                s->x.r.error_code = "client_closed";
                stream_done(s, 0);
            }
            return -1;
        }
        s->x.r.bytes_sent += (uint64_t)n;
        sl_buf_consume(&s->out, (size_t)n);
        if ((size_t)n < len)
            return 0;
        return 1;
    }
}

static int x_body_flush(sl_exchange_t *x)
{
    h2s_t *s = stream_of(x);
    if (sl_buf_len(&s->out) == 0)
        return 1;
    return hand_out(s, 0);
}

/* The last bytes and END_STREAM (or the upstream's trailers, as gRPC's
 * grpc-status); then the request is done. */
static void stream_write_out(h2s_t *s)
{
    if (!s->ended && sl_buf_len(&s->x.trailers)) {
        int r = hand_out(s, 0);
        if (r < 0)
            return;
        if (r == 0) {
            s->end_pending = 1;
            return;
        }
        sl_header_t f[64];
        size_t n = sl_exchange_trailers(&s->x, f, SL_ARRAY_LEN(f));
        if (sl_h2_submit_trailers(s->hc->h2, s->id, f, n) != SL_OK) {
            s->x.r.error_code = "bad_upstream_trailers";
            stream_done(s, 0);
            sl_h2_reset_stream(s->hc->h2, s->id, SL_H2_INTERNAL_ERROR);
            return;
        }
        s->ended = 1;
    }
    if (!s->ended) {
        int r = hand_out(s, 1);
        if (r < 0)
            return;
        if (r == 0) {
            s->end_pending = 1; /* on_stream_writable comes back here */
            return;
        }
        s->ended = 1;
    }
    s->end_pending = 0;
    stream_done(s, 1);
    /* Not a tunnel after all: the client's side of the stream is not
     * wanted (RFC 9113 8.1). */
    if (s->tunnel && !s->body_end && !s->closed)
        sl_h2_reset_stream(s->hc->h2, s->id, SL_H2_NO_ERROR);
}

static void x_complete(sl_exchange_t *x)
{
    h2s_t *s = stream_of(x);
    evtimer_del(s->timer);
    stream_write_out(s);
}

static void x_error(sl_exchange_t *x, int status, const char *code, const char *message, int close)
{
    (void)close; /* a stream has nothing to close but itself */
    stream_error(stream_of(x), status, code, message, 0);
}

/* A response cut after its head: RST_STREAM tells the client it is not
 * complete (HTTP/2 has no other way, and needs no more). */
static void x_abort(sl_exchange_t *x, const char *code)
{
    h2s_t *s = stream_of(x);
    s->x.r.error_code = code;
    stream_done(s, 0);
    if (!s->closed)
        sl_h2_reset_stream(s->hc->h2, s->id, SL_H2_INTERNAL_ERROR);
}

static void x_arm_timer(sl_exchange_t *x, uint32_t ms)
{
    h2s_t *s = stream_of(x);
    if (x->r.deadline_ms) {
        uint64_t now = sl_endpoint_now_ms();
        uint64_t left = x->r.deadline_ms > now ? x->r.deadline_ms - now : 0;
        if (ms == 0 || left < ms)
            ms = (uint32_t)left;
    }
    if (ms == 0) {
        evtimer_del(s->timer);
        return;
    }
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(s->timer, &tv);
}

/* Moves request body bytes from `pending` to uout (chunk-framed when the
 * upstream gets no length), crediting the client's window as they move. */
static void x_pump_body(sl_exchange_t *x)
{
    h2s_t *s = stream_of(x);
    if (s->tunnel)
        return; /* tunnel bytes wait for the 101, the GET has no body */
    while (sl_buf_len(&s->pending) || (s->body_end && !x->req_body_done)) {
        /* Room in uout: drop what was sent if the buffer is full. */
        if (sl_buf_space(&x->uout) < 1024) {
            if (x->uout_sent > 0 && x->phase != SL_XP_CONNECTING) {
                x->uout.start += x->uout_sent;
                x->uout_sent = 0;
                sl_buf_compact(&x->uout);
                x->r.replayable = 0;
            }
            if (sl_buf_space(&x->uout) < 1024)
                return; /* backpressure: the upstream takes it first */
        }
        /* An HTTP/2 upstream frames the body itself: payload only. */
        int frame = s->chunked && !x->up_h2;
        size_t len = sl_buf_len(&s->pending);
        if (len == 0) {
            if (frame)
                sl_buf_append(&x->uout, "0\r\n\r\n", 5);
            x->req_body_done = 1;
            sl_worker_buf_put(s->hc->w, &s->pending);
            return;
        }
        size_t room = sl_buf_space(&x->uout) - (frame ? 24 : 0);
        size_t take = len < room ? len : room;
        if (frame) {
            char line[24];
            int h = snprintf(line, sizeof(line), "%zx\r\n", take);
            sl_buf_append(&x->uout, line, (size_t)h);
        }
        memcpy(sl_buf_tail(&x->uout), sl_buf_head(&s->pending), take);
        sl_request_body_seen(&x->r, 0, sl_buf_head(&s->pending), take, 0);
        x->uout.end += take;
        if (frame)
            sl_buf_append(&x->uout, "\r\n", 2);
        sl_buf_consume(&s->pending, take);
        if (!s->body_granted)
            sl_h2_consume(s->hc->h2, s->id, take);
    }
}

/* ---- a request body a policy reads whole --------------------------------------- */

/*
 * The chain asked for the body (request.h, sl_request_body_cap): DATA
 * payload is gathered in the request's body buffer, and credited to the
 * client's windows at once, so the client goes on sending up to the cap
 * (past it: 413, RST_STREAM NO_ERROR). Memory: the cap per such stream
 * (at most SETTINGS_MAX_CONCURRENT_STREAMS of them per connection). With
 * END_STREAM the body hooks decide; passed, the body is the stream's
 * `pending`, as if the client had sent it with a content-length, and the
 * exchange starts. Between DATA frames the client's idle timeout applies
 * (408), within the request's deadline.
 */
static void finish_policy_body(h2s_t *s)
{
    sl_request_error_t err;
    sl_buf_t body;
    s->body_read = 0;
    if (sl_request_body_done(&s->x.r, &body, &err) != SL_OK) {
        stream_error(s, err.status, err.code, err.message, err.allow);
        return;
    }
    size_t len = sl_buf_len(&body);
    if (sl_exchange_set_body_length(&s->x, len) != SL_OK) {
        sl_buf_free(&body);
        stream_error(s, 503, "overloaded", "out of memory", 0);
        return;
    }
    sl_worker_buf_put(s->hc->w, &s->pending);
    s->pending = body;
    s->body_granted = 1;
    s->x.req_body_done = len == 0;
    s->started = 1;
    /* What fits goes into uout now: no more DATA will come to drive it. */
    x_pump_body(&s->x);
    sl_exchange_start(&s->x);
}

static void read_policy_body(h2s_t *s, const uint8_t *p, size_t n, int end_stream)
{
    sl_request_error_t err;
    if (n) {
        sl_h2_consume(s->hc->h2, s->id, n);
        s->x.r.bytes_received += n;
        if (sl_request_body_add(&s->x.r, p, n, &err) != SL_OK) {
            s->body_read = 0;
            stream_error(s, err.status, err.code, err.message, 0);
            return;
        }
        x_arm_timer(&s->x, s->x.r.gen->idle_timeout_ms);
    }
    if (end_stream) {
        s->body_end = 1;
        finish_policy_body(s);
    }
}

/* Expect: 100-continue over HTTP/2: an interim 100 once an endpoint is
 * chosen. */
static void x_send_continue(sl_exchange_t *x)
{
    h2s_t *s = stream_of(x);
    sl_h2_submit_response(s->hc->h2, s->id, 100, NULL, 0, 0);
}

/* ---- WebSocket over HTTP/2 (RFC 8441): a stream as a tunnel --------------------- */

/*
 * An extended CONNECT: routed as a GET of :path, then the exchange sends
 * the origin that GET with the upgrade (exchange.c). Refused with the
 * gateway's error when the route does not tunnel the :protocol, or its
 * backend speaks HTTP/2 (extended CONNECT to an HTTP/2 origin is not done).
 */
static void tunnel_request(h2s_t *s, const sl_req_head_t *head, const sl_h2_req_info_t *info)
{
    sl_req_head_t get = *head;
    get.method = (sl_str_t){"GET", 3};
    get.method_bit = SL_METHOD_GET;
    get.has_length = 1; /* the GET has no body: tunnel bytes wait for the 101 */
    get.content_length = 0;
    /* The log keeps CONNECT; the exchange reads the answer to a GET. */
    s->x.r.method_bit = SL_METHOD_GET;
    s->tunnel = 1;
    int websocket = info->protocol.len == 9 && strncasecmp(info->protocol.ptr, "websocket", 9) == 0;
    if (websocket) {
        const sl_header_t *v =
            sl_http1_find_header(head->headers, head->num_headers, "sec-websocket-version", 21);
        if (!v || v->value.len != 2 || memcmp(v->value.ptr, "13", 2) != 0) {
            stream_error(s, 400, "bad_request",
                         "a WebSocket extended CONNECT needs sec-websocket-version: 13", 0);
            return;
        }
    }
    sl_str_t path;
    sl_request_error_t err;
    if (sl_request_route(&s->x.r, &get, &path, &err) != SL_OK) {
        stream_error(s, err.status, err.code, err.message, err.allow);
        return;
    }
    if (!sl_exchange_route_tunnels(s->x.r.route, info->protocol)) {
        char msg[160];
        snprintf(msg, sizeof(msg), "this route does not tunnel :protocol %.*s (upgrades)",
                 (int)(info->protocol.len > 40 ? 40 : info->protocol.len), info->protocol.ptr);
        stream_error(s, 501, "upgrade_not_allowed", msg, 0);
        return;
    }
    if (s->x.r.cluster->pb->protocol != SLUICE__V1__CLUSTER__PROTOCOL__HTTP1) {
        stream_error(s, 501, "not_implemented",
                     "extended CONNECT (WebSocket over HTTP/2) needs an HTTP/1.1 backend; this "
                     "route's backend speaks HTTP/2",
                     0);
        return;
    }
    if (websocket && sl_websocket_key_new(s->x.ws_key) != SL_OK) {
        stream_error(s, 503, "overloaded", "no randomness for a WebSocket key", 0);
        return;
    }
    s->x.upgrade = 1;
    s->x.upgrade_required = 1;
    s->x.interim_ok = 0; /* an interim head would reach the client before the 200 */
    s->x.req_body_done = 1;
    if (sl_exchange_build_head(&s->x, &get, path, SL_HTTP1_BODY_NONE, 0, info->protocol) != SL_OK) {
        stream_error(s, 503, "overloaded", "out of memory", 0);
        return;
    }
    s->started = 1;
    sl_exchange_start(&s->x);
}

/* The origin's backend error: both sides end. */
static void tunnel_fail(h2s_t *s)
{
    sl_exchange_finish(&s->x, 0);
    if (!s->closed)
        sl_h2_reset_stream(s->hc->h2, s->id, SL_H2_CANCEL);
}

/*
 * Moves bytes both ways until neither moves: the origin's into `out` and on
 * to the codec (the origin is read only once `out` is empty and the codec
 * took all: backpressure, resumed by on_stream_writable), and the client's
 * from `pending` to the origin's socket, credited to the client's window as
 * they leave (resumed by the origin's write edge, x_tunnel_event).
 */
static void tunnel_pump(h2s_t *s)
{
    sl_exchange_t *x = &s->x;
    h2c_t *hc = s->hc;
    if (!s->tun_open || s->closed || hc->dead || !x->up)
        return;
    int moved = 0;
    for (;;) {
        int progress = 0;
        /* origin -> client */
        while (!s->tun_down_end) {
            size_t len = sl_buf_len(&s->out);
            if (len) {
                ssize_t n = sl_h2_stream_write(hc->h2, s->id, (const uint8_t *)sl_buf_head(&s->out),
                                               len, 0);
                if (n < 0) {
                    tunnel_fail(s);
                    return;
                }
                sl_buf_consume(&s->out, (size_t)n);
                progress |= n > 0;
                if ((size_t)n < len)
                    break; /* the stream's send buffer is full */
                continue;
            }
            if (s->tun_up_eof) {
                if (sl_h2_stream_write(hc->h2, s->id, NULL, 0, 1) < 0) {
                    tunnel_fail(s);
                    return;
                }
                s->tun_down_end = 1;
                progress = 1;
                break;
            }
            if (!x->up_read_ready)
                break;
            if (!s->out.data && sl_worker_buf_get(hc->w, &s->out) != 0) {
                tunnel_fail(s);
                return;
            }
            s->out.start = s->out.end = 0;
            ssize_t n = sl_upstream_read(x->up, sl_buf_tail(&s->out), sl_buf_space(&s->out));
            if (n > 0) {
                s->out.end += (size_t)n;
                progress = 1;
            } else if (n == 0) {
                s->tun_up_eof = 1;
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                x->up_read_ready = 0;
            } else if (errno != EINTR) {
                tunnel_fail(s);
                return;
            }
        }
        /* client -> origin */
        while (!s->tun_up_shut) {
            size_t len = sl_buf_len(&s->pending);
            if (len) {
                ssize_t n = sl_upstream_write(x->up, sl_buf_head(&s->pending), len);
                if (n > 0) {
                    sl_buf_consume(&s->pending, (size_t)n);
                    sl_h2_consume(hc->h2, s->id, (size_t)n);
                    progress = 1;
                    continue;
                }
                if (n < 0 && errno == EINTR)
                    continue;
                if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                    break; /* the origin's write edge resumes us */
                tunnel_fail(s);
                return;
            }
            if (s->body_end) {
                /* Relay the client's end; the origin may still answer.
                 * Over TLS that is close_notify first. */
                if (x->up->ssl) {
                    int want;
                    sl_tls_shutdown(x->up->ssl, &want);
                }
                shutdown(x->up->fd, SHUT_WR);
                s->tun_up_shut = 1;
                progress = 1;
            }
            break;
        }
        if (!progress)
            break;
        moved = 1;
    }
    if (moved)
        s->tun_last_ms = sl_endpoint_now_ms();
    if (s->tun_down_end && s->tun_up_shut)
        sl_exchange_finish(x, 0); /* both ways ended: the stream closes once sent */
}

/* A 101 to the extended CONNECT: check it, answer 200, open the tunnel. */
static int x_upgraded(sl_exchange_t *x, const sl_http1_response_t *resp, size_t head_len)
{
    h2s_t *s = stream_of(x);
    if (!s->tunnel || sl_exchange_tunnel_check(x, resp) != SL_OK)
        return SL_ERROR;
    /* The origin's fields (sec-websocket-protocol, -extensions, ...), not
     * the answer to a key the client never sent. */
    sl_header_t f[136];
    char date_buf[48];
    size_t n = response_fields(s, resp, f, SL_ARRAY_LEN(f), date_buf, sizeof(date_buf));
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!(f[i].name.len == 20 && strncasecmp(f[i].name.ptr, "sec-websocket-accept", 20) == 0))
            f[k++] = f[i];
    if (sl_h2_submit_response(s->hc->h2, s->id, 200, f, k, 0) != SL_OK)
        return SL_ERROR;
    x->resp_head_sent = 1;
    /* Bytes of the new protocol that came with the head. */
    sl_buf_consume(&x->uin, head_len);
    if (sl_buf_len(&x->uin)) {
        if (!s->out.data && sl_worker_buf_get(s->hc->w, &s->out) != 0)
            return SL_ERROR;
        sl_buf_append(&s->out, sl_buf_head(&x->uin), sl_buf_len(&x->uin));
    }
    s->tun_idle_ms = sl_exchange_tunnel_opened(x, 200);
    s->done = 1; /* counted and logged: the stream is a tunnel now */
    s->tun_open = 1;
    s->tun_last_ms = sl_endpoint_now_ms();
    struct timeval tv = {s->tun_idle_ms / 1000, (s->tun_idle_ms % 1000) * 1000};
    evtimer_add(s->timer, &tv);
    x->up_read_ready = 1;
    tunnel_pump(s);
    return SL_OK;
}

static void x_tunnel_event(sl_exchange_t *x)
{
    tunnel_pump(stream_of(x));
}

/* Both sides quiet for tunnelIdle: the tunnel ends. */
static void tunnel_timer(h2s_t *s)
{
    uint64_t idle = sl_endpoint_now_ms() - s->tun_last_ms;
    if (idle >= s->tun_idle_ms) {
        tunnel_fail(s);
        return;
    }
    uint32_t left = (uint32_t)(s->tun_idle_ms - idle);
    struct timeval tv = {left / 1000, (left % 1000) * 1000};
    evtimer_add(s->timer, &tv);
}

static const sl_exchange_ops_t h2_exchange_ops = {
    .enter = x_enter,
    .leave = x_leave,
    .alive = x_alive,
    .head = x_head,
    .body_buf = x_body_buf,
    .body_flush = x_body_flush,
    .complete = x_complete,
    .error = x_error,
    .abort = x_abort,
    .arm_timer = x_arm_timer,
    .pump_body = x_pump_body,
    .send_continue = x_send_continue,
    .upgraded = x_upgraded,
    .tunnel_event = x_tunnel_event,
};

static void stream_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    h2s_t *s = arg;
    if (s->tun_open && !s->closed) {
        stream_enter(s);
        tunnel_timer(s);
        stream_leave(s);
        return;
    }
    if (s->done)
        return;
    stream_enter(s);
    uint64_t now = sl_endpoint_now_ms();
    if (s->x.r.deadline_ms && now >= s->x.r.deadline_ms) {
        if (!s->x.resp_head_sent) {
            sl_exchange_finish(&s->x, 0);
            stream_error(s, 504, "request_timeout", "the request did not complete in time", 0);
        } else {
            s->x.r.error_code = "request_timeout";
            stream_done(s, 0);
            sl_h2_reset_stream(s->hc->h2, s->id, SL_H2_CANCEL);
        }
    } else if (s->body_read) {
        stream_error(s, 408, "request_body_timeout", "the request body did not arrive in time", 0);
    } else {
        /* A client that stopped taking the response shows as a stalled
         * stream or a paused exchange. */
        int client_blocked = s->x.up_paused || sl_h2_stream_stalled_ms(s->hc->h2, s->id) > 0;
        sl_exchange_timeout(&s->x, client_blocked);
    }
    stream_leave(s);
}

/* ---- connection I/O ------------------------------------------------------------ */

/* Writes `out`, refills it from the codec, until the codec has nothing more
 * or the socket is full; then decides whether the connection is over. */
static void conn_pump(h2c_t *hc)
{
    if (hc->dead)
        return;
    int wrote = 0;
    for (;;) {
        while (sl_buf_len(&hc->out)) {
            ssize_t n = conn_send(hc, sl_buf_head(&hc->out), sl_buf_len(&hc->out));
            if (n > 0) {
                sl_buf_consume(&hc->out, (size_t)n);
                wrote = 1;
                continue;
            }
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                if (!hc->write_blocked || wrote)
                    hc->blocked_since_ms = sl_endpoint_now_ms();
                hc->write_blocked = 1;
                return; /* the write edge resumes us */
            }
            conn_close(hc); /* the client is gone */
            return;
        }
        hc->write_blocked = 0;
        size_t before = sl_buf_len(&hc->out);
        if (sl_h2_conn_flush_into(hc->h2, &hc->out) == SL_ERROR) {
            conn_close(hc);
            return;
        }
        if (sl_buf_len(&hc->out) == before)
            break;
    }
    /* After a connection error the GOAWAY went out above: done. */
    if (hc->fatal || (!sl_h2_conn_want_read(hc->h2) && !sl_h2_conn_want_write(hc->h2))) {
        conn_close(hc);
        return;
    }
    hc->idle_since_ms = sl_h2_conn_idle(hc->h2)
                            ? (hc->idle_since_ms ? hc->idle_since_ms : sl_endpoint_now_ms())
                            : 0;
}

/* Reads and feeds the codec while the socket has bytes, unless the client
 * does not read what we already have for it (then it waits: bounded). */
static void conn_read(h2c_t *hc)
{
    while (!hc->dead && !hc->fatal && hc->read_ready && !hc->write_blocked) {
        if (!hc->in.data && sl_worker_buf_get(hc->w, &hc->in) != 0) {
            conn_close(hc);
            return;
        }
        hc->in.start = hc->in.end = 0;
        ssize_t n = conn_recv(hc, sl_buf_tail(&hc->in), sl_buf_space(&hc->in));
        if (n > 0) {
            if (sl_h2_conn_feed(hc->h2, (const uint8_t *)hc->in.data, (size_t)n) == SL_ERROR)
                hc->fatal = 1; /* a GOAWAY is pending: flush it, then close */
            conn_pump(hc);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            hc->read_ready = 0;
            break;
        }
        conn_close(hc); /* EOF or error: the streams end with it */
        return;
    }
    if (!hc->dead && hc->in.data)
        sl_worker_buf_put(hc->w, &hc->in);
}

static void conn_event_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    h2c_t *hc = arg;
    hc->in_cb++;
    if (what & (EV_READ | EV_CLOSED))
        hc->read_ready = 1;
    /* TLS may need the other direction's edge (net/tls.h). */
    if ((what & EV_WRITE) && hc->tls_read_wants_write)
        hc->read_ready = 1;
    if ((what & (EV_READ | EV_CLOSED)) && hc->tls_write_wants_read)
        what |= EV_WRITE;
    if (what & EV_WRITE)
        conn_pump(hc);
    if (!hc->dead)
        conn_read(hc);
    if (!hc->dead)
        conn_pump(hc);
    if (--hc->in_cb == 0 && hc->dead)
        free(hc);
}

/* Once a second: the idle timeout (no stream open), the header timeout (a
 * header block left unfinished), and streams stalled on a zero window past
 * the idle timeout. */
static void conn_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    h2c_t *hc = arg;
    hc->in_cb++;
    uint32_t idle_ms = 60000, header_ms = 10000;
    rcu_thread_online();
    sl_generation_t *g = sl_generation_current();
    if (g) {
        idle_ms = g->idle_timeout_ms;
        header_ms = g->request_header_timeout_ms;
    }
    rcu_thread_offline();
    uint64_t now = sl_endpoint_now_ms();
    uint64_t since = sl_h2_conn_header_block_since(hc->h2);
    if (hc->write_blocked && now - hc->blocked_since_ms >= idle_ms) {
        /* The client stopped reading: nothing reaches it any more, not even
         * a GOAWAY. Close, as HTTP/1.1 does after the idle timeout
         * (test_http2_attacks.py, a client that stops reading). */
        for (h2s_t *s = hc->streams; s; s = s->next) {
            if (!s->done) {
                s->x.r.error_code = "client_write_timeout";
                stream_done(s, 0);
            }
        }
        conn_close(hc);
    } else if (since && now - since >= header_ms) {
        sl_h2_goaway(hc->h2, 0);
        hc->fatal = 1;
    } else if (hc->idle_since_ms && now - hc->idle_since_ms >= idle_ms) {
        sl_h2_goaway(hc->h2, 0);
        hc->fatal = 1;
    } else {
        /* Every stream stalled past the idle timeout, not only the oldest:
         * one per tick would hold the 100th of a client's stalled streams
         * for 99 s more (test_http2_attacks.py, zero-window stall). */
        for (h2s_t *s = hc->streams; s; s = s->next) {
            uint64_t stalled_ms = s->closed ? 0 : sl_h2_stream_stalled_ms(hc->h2, s->id);
            if (stalled_ms == 0 || stalled_ms < idle_ms)
                continue;
            if (!s->done) {
                s->x.r.error_code = "client_write_timeout";
                stream_done(s, 0);
            }
            sl_h2_reset_stream(hc->h2, s->id, SL_H2_CANCEL);
        }
    }
    conn_pump(hc);
    if (!hc->dead) {
        struct timeval tv = {1, 0};
        evtimer_add(hc->timer, &tv);
    }
    if (--hc->in_cb == 0 && hc->dead)
        free(hc);
}

static void conn_close(h2c_t *hc)
{
    if (hc->dead)
        return;
    sl_worker_t *w = hc->w;
    hc->in_cb++;             /* the stream callbacks below must not free hc */
    sl_h2_conn_free(hc->h2); /* on_stream_close(CANCEL) for every open stream */
    hc->h2 = NULL;
    while (hc->streams) {
        h2s_t *s = hc->streams;
        if (!s->done) {
            s->x.r.error_code = "client_closed";
            stream_done(s, 0);
        }
        s->closed = 1;
        if (s->in_cb)
            break; /* freed when its callback unwinds; cannot happen today */
        stream_free(s);
    }
    hc->in_cb--;
    event_free(hc->ev);
    event_free(hc->timer);
    if (hc->ssl) {
        int want;
        sl_tls_shutdown(hc->ssl, &want);
        SSL_free(hc->ssl);
        hc->ssl = NULL;
    }
    free(hc->peer);
    hc->peer = NULL;
    close(hc->fd);
    sl_worker_buf_put(w, &hc->in);
    sl_worker_buf_put(w, &hc->out);
    if (hc->prev)
        hc->prev->next = hc->next;
    else
        w->h2conns = hc->next;
    if (hc->next)
        hc->next->prev = hc->prev;
    if (hc->ls && hc->ls->active)
        hc->ls->active--;
    SL_STAT_ADD(sl_metrics_worker(w->id)->connections_active, -1);
    hc->dead = 1;
    if (hc->in_cb == 0)
        free(hc);
    sl_worker_conn_closed(w);
}

/* ---- entry points ---------------------------------------------------------------- */

int sl_proxy_h2_start(sl_listener_sock_t *ls, int fd, SSL *ssl, sl_tls_peer_t *peer,
                      const char *client_ip, const char *bytes, size_t n)
{
    sl_worker_t *w = ls->worker;
    h2c_t *hc = calloc(1, sizeof(*hc));
    if (!hc)
        return SL_ERROR;
    static const sl_h2_callbacks_t cbs = {
        .on_request = on_request,
        .on_data = on_data,
        .on_stream_close = on_stream_close,
        .on_stream_writable = on_stream_writable,
        .now_ms = now_ms,
    };
    hc->w = w;
    hc->ls = ls;
    hc->fd = fd;
    snprintf(hc->client_ip, sizeof(hc->client_ip), "%s", client_ip);
    /* The listener's http2 limits in the current generation; the codec
     * copies them, so a reload applies to new connections only. */
    sl_h2_settings_t set;
    rcu_thread_online();
    sl_generation_h2_settings(sl_generation_current(), ls->key, &set);
    rcu_thread_offline();
    hc->h2 = sl_h2_conn_new(&set, &cbs, hc);
    hc->ev = event_new(w->base, fd, EV_READ | EV_WRITE | EV_CLOSED | EV_ET | EV_PERSIST,
                       conn_event_cb, hc);
    hc->timer = evtimer_new(w->base, conn_timer_cb, hc);
    if (!hc->h2 || !hc->ev || !hc->timer || sl_worker_buf_get(w, &hc->out) != 0 ||
        event_add(hc->ev, NULL) != 0) {
        if (hc->ev)
            event_free(hc->ev);
        if (hc->timer)
            event_free(hc->timer);
        sl_h2_conn_free(hc->h2);
        sl_worker_buf_put(w, &hc->out);
        free(hc);
        return SL_ERROR;
    }
    /* The connection now counts as ours (the caller's accounting moves). */
    hc->ssl = ssl;
    hc->peer = peer;
    hc->next = w->h2conns;
    if (w->h2conns)
        w->h2conns->prev = hc;
    w->h2conns = hc;
    struct timeval tv = {1, 0};
    evtimer_add(hc->timer, &tv);
    hc->idle_since_ms = sl_endpoint_now_ms();
    hc->read_ready = 1;
    hc->in_cb++;
    if (n && sl_h2_conn_feed(hc->h2, (const uint8_t *)bytes, n) == SL_ERROR)
        hc->fatal = 1;
    conn_pump(hc);
    if (!hc->dead)
        conn_read(hc);
    if (!hc->dead)
        conn_pump(hc);
    if (--hc->in_cb == 0 && hc->dead)
        free(hc);
    return SL_OK;
}

void sl_proxy_h2_drain(sl_worker_t *w)
{
    for (h2c_t *hc = w->h2conns, *next; hc; hc = next) {
        next = hc->next;
        sl_h2_goaway(hc->h2, 1);
        hc->in_cb++;
        conn_pump(hc);
        if (--hc->in_cb == 0 && hc->dead)
            free(hc);
    }
}

void sl_proxy_h2_close_all(sl_worker_t *w)
{
    while (w->h2conns)
        conn_close(w->h2conns);
}
