/*
 * The HTTP/1.1 side of a client connection (proxy.h): read and parse request
 * heads, hand each request to the protocol-independent request (request.c)
 * and its upstream exchange (exchange.c), carry the request body into the
 * exchange, and write what the exchange answers in HTTP/1.1 framing, with
 * keep-alive, pipelining and upgrades (a 101 turns the connection into a
 * byte tunnel).
 *
 * Buffers (bounded, from the worker's block cache):
 *   in    client bytes: the request head, chunked body bytes, pipelined
 *         requests that wait their turn, tunnel bytes;
 *   out   the response head and body bytes to the client. The exchange reads
 *         body bytes from the upstream straight into it (exchange.h, ops
 *         body_buf); when it is full, the exchange stops reading from the
 *         upstream (backpressure) until the client drains it.
 *   The upstream's buffers (uout, uin) are the exchange's.
 *   A body a policy reads whole (CS_BODY, read_policy_body) is gathered in
 *   the request's body buffer (request.h) before the exchange starts, and
 *   then takes the place of `in`; every other body streams through `in`.
 *
 * Every request holds its generation (sl_request_begin), so a config swap
 * never changes the rules of a request in flight, and a retired generation
 * lives until its last request ends.
 */
#include "proxy.h"

#include "tlog.h"
#include "generation.h"
#include "http1.h"
#include "log.h"
#include "exchange.h"
#include "h2.h"
#include "tls.h"
#include "metrics.h"
#include "request.h"
#include "fmt.h"
#include "upstream.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_HEADERS_CAP 1000

enum conn_state {
    CS_HANDSHAKE, /* https: the TLS handshake is under way */
    CS_HEAD,      /* waiting for / reading a request head */
    CS_BODY,      /* reading a request body a policy reads whole (read_policy_body) */
    CS_PROXY,     /* a request is in progress */
    CS_RESPOND,   /* writing a response the gateway generated itself */
    CS_TUNNEL,    /* upgraded (101): bytes are relayed both ways, see tunnel_pump */
    CS_CLOSED,    /* conn_close ran; memory lives until the callback unwinds */
};

typedef struct sl_conn {
    /* The request in progress and its upstream side (exchange.h); first, so
     * that an exchange pointer is the connection's. */
    sl_exchange_t x;
    sl_worker_t *w;
    sl_listener_sock_t *ls;
    int fd;
    /* One edge-triggered read+write event for the connection's life: no
     * epoll_ctl per request. Readiness is remembered in read_ready and
     * acted on when the state machine wants to read (nginx's model). */
    struct event *ev, *timer;
    struct sl_conn *prev, *next;
    enum conn_state state;
    sl_buf_t in, out;
    char client_ip[INET6_ADDRSTRLEN];
    uint8_t first_request;
    uint8_t closing;               /* close once `out` is flushed */
    uint8_t want_read, want_write; /* the state machine waits for that */
    uint8_t read_ready;            /* the socket may have unread bytes */
    uint8_t rdhup;                 /* the peer's FIN is pending (EPOLLRDHUP) */
    uint8_t pending_input;         /* `in` holds a request not yet parsed */
    uint8_t dead;                  /* closed; freed when the callback unwinds */
    uint8_t in_cb;                 /* callback nesting depth */
    uint8_t depth;                 /* pipelining recursion guard */
    uint8_t sniffed;               /* h2c listener: the first bytes were not the preface */
    SSL *ssl;                      /* https listener: the connection's TLS, else NULL */
    uint8_t tls_read_wants_write;  /* a TLS read waits for the socket to take bytes */
    uint8_t tls_write_wants_read;  /* a TLS write waits for bytes from the socket */
    sl_tls_peer_t *peer;           /* the verified client certificate (mTLS), else NULL */
    unsigned requests;

    int minor_version;
    uint8_t keep_alive;
    enum sl_http1_body req_body;
    uint64_t req_remaining;
    sl_http1_chunked_t req_chunk;

    /* CS_TUNNEL: each direction ends with its sender's EOF, relayed as a
     * shutdown(SHUT_WR) once the bytes before it are written. */
    uint8_t tun_client_eof, tun_up_eof;
    uint8_t tun_client_shut, tun_up_shut;
    uint32_t tun_idle_ms;
    uint64_t tun_last_ms; /* last byte relayed, for the idle timeout */

    /* An HTTP/2 upstream's body without a length, for an HTTP/1.1 client:
     * the codec frames it chunked (with the trailers at the end), so the
     * connection stays reusable. The upstream's bytes land in `stage`. */
    uint8_t frame_chunked;
    sl_buf_t stage;
} sl_conn_t;

/* Parse space for header slices. Per worker, not per connection: slices are
 * only used while process_input runs (routing, the upstream head, copies for
 * the log), so idle and slow connections do not each hold 32 KB of it. */
static __thread sl_http1_header_t worker_headers[MAX_HEADERS_CAP];

static void client_event_cb(evutil_socket_t fd, short what, void *arg);
static void timer_cb(evutil_socket_t fd, short what, void *arg);
static void read_head(sl_conn_t *c);
static void process_input(sl_conn_t *c);
static void conn_close(sl_conn_t *c);
static void client_flush(sl_conn_t *c);
static int client_write_some(sl_conn_t *c);
static void tunnel_pump(sl_conn_t *c);
static int tunnel_start(sl_conn_t *c, const sl_http1_response_t *resp, size_t head_len);
static void append_policy_headers(sl_conn_t *c, sl_buf_t *b);
static void pump_request_body(sl_conn_t *c);
static void start_policy_body(sl_conn_t *c);
static void read_policy_body(sl_conn_t *c);
static void h1_send_continue(sl_exchange_t *x);
static void h2_takeover(sl_conn_t *c);
static void tls_handshake(sl_conn_t *c);
static const sl_exchange_ops_t h1_exchange_ops;

/* The connection of an exchange: the exchange is its first member. */
static inline sl_conn_t *conn_of(sl_exchange_t *x)
{
    return (sl_conn_t *)x;
}

/*
 * Client socket I/O, plain or TLS, with read(2)/write(2) results (-1 and
 * errno EAGAIN when the socket has nothing / takes nothing now). Over TLS,
 * a read may need the socket to be writable first and a write readable
 * (net/tls.h): the flag makes the other edge resume the operation.
 */
static ssize_t client_read(sl_conn_t *c, void *buf, size_t n)
{
    return sl_io_read(c->fd, c->ssl, buf, n, &c->tls_read_wants_write);
}

static ssize_t client_write(sl_conn_t *c, const void *buf, size_t n)
{
    return sl_io_write(c->fd, c->ssl, buf, n, &c->tls_write_wants_read);
}

static size_t headers_cap_for(const sl_generation_t *gen)
{
    size_t n = gen ? gen->limits.max_header_count : 100;
    return n > MAX_HEADERS_CAP ? MAX_HEADERS_CAP : n;
}

/* ---- event helpers -------------------------------------------------------- */

static void client_rev(sl_conn_t *c, int on)
{
    c->want_read = (uint8_t)on;
}

static void client_wev(sl_conn_t *c, int on)
{
    c->want_write = (uint8_t)on;
}

/* Every callback that may close the connection brackets its work with these,
 * so conn_close inside it never frees memory the callback still uses. */
static inline void cb_enter(sl_conn_t *c)
{
    c->in_cb++;
}

static inline void cb_leave(sl_conn_t *c)
{
    if (--c->in_cb == 0 && c->dead)
        free(c);
}

static void arm_timer(sl_conn_t *c, uint32_t ms)
{
    if (c->x.r.deadline_ms) {
        uint64_t now = sl_endpoint_now_ms();
        uint64_t left = c->x.r.deadline_ms > now ? c->x.r.deadline_ms - now : 0;
        if (ms == 0 || left < ms)
            ms = (uint32_t)left;
    }
    if (ms == 0) {
        evtimer_del(c->timer);
        return;
    }
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    evtimer_add(c->timer, &tv);
}

/* ---- request bookkeeping -------------------------------------------------- */

static void reset_request(sl_conn_t *c)
{
    sl_request_reset(&c->x.r);
    sl_exchange_reset(&c->x);
    c->frame_chunked = 0;
    sl_worker_buf_put(c->w, &c->stage);
    c->req_body = SL_HTTP1_BODY_NONE;
    c->req_remaining = 0;
}

/* The response is complete and flushed: log it, recycle, go on. */
static void request_done(sl_conn_t *c)
{
    sl_exchange_finish(&c->x, 1);
    sl_request_log(&c->x.r);
    int keep = c->keep_alive && !c->closing && !c->w->draining && c->x.req_body_done;
    reset_request(c);
    if (!keep) {
        conn_close(c);
        return;
    }
    c->state = CS_HEAD;
    c->requests++;
    c->first_request = 0;
    if (sl_buf_len(&c->out) == 0)
        sl_worker_buf_put(c->w, &c->out);
    if (sl_buf_len(&c->in) > 0) {
        /* A pipelined request is already here. Recursion is bounded; past
         * the bound the next request is handled from the event loop. */
        if (c->depth < 8) {
            c->depth++;
            process_input(c);
            c->depth--;
        } else {
            c->pending_input = 1;
            event_active(c->ev, EV_READ, 1);
        }
        return;
    }
    sl_worker_buf_put(c->w, &c->in);
    client_rev(c, 1);
    if (c->read_ready)
        event_active(c->ev, EV_READ, 1);
    uint32_t idle = 60000;
    rcu_thread_online();
    sl_generation_t *g = sl_generation_current();
    if (g)
        idle = g->idle_timeout_ms;
    rcu_thread_offline();
    arm_timer(c, idle);
}

static void append_allow(sl_buf_t *b, unsigned allow)
{
    static const struct {
        unsigned bit;
        const char *name;
    } methods[] = {{SL_METHOD_GET, "GET"},         {SL_METHOD_HEAD, "HEAD"},
                   {SL_METHOD_POST, "POST"},       {SL_METHOD_PUT, "PUT"},
                   {SL_METHOD_DELETE, "DELETE"},   {SL_METHOD_PATCH, "PATCH"},
                   {SL_METHOD_OPTIONS, "OPTIONS"}, {SL_METHOD_TRACE, "TRACE"},
                   {SL_METHOD_CONNECT, "CONNECT"}};
    sl_buf_append(b, "Allow: ", 7);
    int first = 1;
    for (size_t i = 0; i < SL_ARRAY_LEN(methods); i++) {
        if (!(allow & methods[i].bit))
            continue;
        if (!first)
            sl_buf_append(b, ", ", 2);
        sl_buf_append(b, methods[i].name, strlen(methods[i].name));
        first = 0;
    }
    sl_buf_append(b, "\r\n", 2);
}

/*
 * Answers the request with a JSON error. `close_after` closes the connection
 * once written (bad framing, unread body). If part of a response was already
 * sent, the only honest signal left is closing the connection.
 */
static void send_error(sl_conn_t *c, int status, const char *code, const char *message,
                       int close_after, unsigned allow)
{
    c->x.r.error_code = code;
    sl_exchange_finish(&c->x, 0);
    if (c->x.resp_head_sent) {
        c->x.r.status = c->x.r.status ? c->x.r.status : status;
        sl_request_log(&c->x.r);
        reset_request(c);
        conn_close(c);
        return;
    }
    if (!c->x.req_body_done)
        close_after = 1; /* the rest of the body is still on the wire */
    c->x.r.status = status;
    c->state = CS_RESPOND;
    c->x.phase = SL_XP_NONE;
    if (close_after)
        c->closing = 1;
    if (!c->out.data && sl_worker_buf_get(c->w, &c->out) != 0) {
        conn_close(c);
        return;
    }
    if (!c->x.interim_sent)
        c->out.start = c->out.end = 0; /* else append after the interim heads */
    char body[900];
    const char *bp = body, *ctype = "application/json";
    int blen;
    const sl_policy_reply_t *reply = sl_request_reply(&c->x.r);
    if (reply && reply->body) { /* respond, redirect, decide: the policy's own body */
        bp = reply->body;
        blen = (int)reply->body_len;
        ctype = reply->content_type ? reply->content_type : "text/plain";
    } else {
        blen = (int)sl_request_error_body(&c->x.r, status, code, message, body, sizeof(body));
    }
    /* Appended piece by piece: snprintf here was a third of the cost of a
     * decision answered by the gateway (callgrind). */
    char num[20];
    const char *reason = sl_http1_reason(status);
    sl_buf_append(&c->out, "HTTP/1.1 ", 9);
    sl_buf_append(&c->out, num, sl_fmt_u64(num, (uint64_t)status));
    sl_buf_append(&c->out, " ", 1);
    sl_buf_append(&c->out, reason, strlen(reason));
    if (status == 204) { /* a CORS preflight's answer: no body, no length (RFC 9110 8.6) */
        blen = 0;
        sl_buf_append(&c->out, "\r\n", 2);
    } else {
        size_t clen = strnlen(ctype, 200);
        sl_buf_append(&c->out, "\r\nContent-Type: ", 16);
        sl_buf_append(&c->out, ctype, clen);
        sl_buf_append(&c->out, "\r\nContent-Length: ", 18);
        sl_buf_append(&c->out, num, sl_fmt_u64(num, (uint64_t)blen));
        sl_buf_append(&c->out, "\r\n", 2);
    }
    sl_buf_append(&c->out, "X-Request-Id: ", 14);
    sl_buf_append(&c->out, c->x.r.m_reqid.ptr, c->x.r.m_reqid.len);
    sl_buf_append(&c->out, "\r\n", 2);
    if (c->closing || !c->keep_alive)
        sl_buf_append(&c->out, "Connection: close\r\n", 19);
    if (reply) {
        for (unsigned i = 0; i < reply->num_headers; i++) {
            sl_buf_append(&c->out, reply->headers[i].name, strlen(reply->headers[i].name));
            sl_buf_append(&c->out, ": ", 2);
            sl_buf_append(&c->out, reply->headers[i].value, strlen(reply->headers[i].value));
            sl_buf_append(&c->out, "\r\n", 2);
        }
    }
    if (sl_unlikely(c->x.r.pol)) {
        sl_request_response_hooks(&c->x.r, status);
        append_policy_headers(c, &c->out);
    }
    size_t dl;
    const char *d = sl_request_date_line(&dl);
    sl_buf_append(&c->out, d, dl);
    if (allow)
        append_allow(&c->out, allow);
    sl_buf_append(&c->out, "\r\n", 2);
    if (c->x.r.method_bit != SL_METHOD_HEAD)
        sl_buf_append(&c->out, bp, (size_t)blen);
    c->x.resp_head_sent = 1;
    c->x.resp_done = 1;
    evtimer_del(c->timer);
    client_rev(c, 0);
    client_flush(c);
}

/* ---- connection life ------------------------------------------------------ */

/* Frees the connection's state; the socket itself is the caller's. */
static void conn_release(sl_conn_t *c)
{
    sl_worker_t *w = c->w;
    sl_exchange_finish(&c->x, 0);
    sl_request_reset(&c->x.r);
    if (c->ev)
        event_free(c->ev);
    c->ev = NULL;
    event_free(c->timer);
    sl_worker_buf_put(w, &c->in);
    sl_worker_buf_put(w, &c->out);
    sl_worker_buf_put(w, &c->x.uout);
    sl_worker_buf_put(w, &c->x.uin);
    sl_worker_buf_put(w, &c->x.trailers);
    sl_worker_buf_put(w, &c->stage);
    free(c->peer);
    c->peer = NULL;
    if (c->prev)
        c->prev->next = c->next;
    else
        w->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->dead = 1;
    c->state = CS_CLOSED; /* every "state != ..." check upstream of us now stops */
}

/* The client sent the HTTP/2 preface on an h2c listener: the socket, the
 * bytes read so far and the connection's accounting go to proxy_h2.c. */
static void h2_takeover(sl_conn_t *c)
{
    event_free(c->ev); /* the HTTP/2 side watches the socket from now on */
    c->ev = NULL;
    if (sl_proxy_h2_start(c->ls, c->fd, c->ssl, c->peer, c->client_ip, sl_buf_head(&c->in),
                          sl_buf_len(&c->in)) != SL_OK) {
        conn_close(c);
        return;
    }
    c->ssl = NULL; /* both are the HTTP/2 connection's now */
    c->peer = NULL;
    conn_release(c);
    if (c->in_cb == 0)
        free(c);
}

static void conn_close(sl_conn_t *c)
{
    sl_worker_t *w = c->w;
    conn_release(c);
    if (c->ssl) {
        /* close_notify, best effort (also keeps the session resumable). */
        int want;
        sl_tls_shutdown(c->ssl, &want);
        SSL_free(c->ssl);
        c->ssl = NULL;
    }
    close(c->fd);
    if (c->ls && c->ls->active)
        c->ls->active--;
    SL_STAT_ADD(sl_metrics_worker(w->id)->connections_active, -1);
    if (c->in_cb == 0)
        free(c);
    sl_worker_conn_closed(w);
}

void sl_proxy_refuse(sl_worker_t *w, int fd)
{
    /* Best effort, never blocks: the socket is fresh, so the small answer
     * fits its send buffer. No request was read, but the error keeps the
     * usual shape, request id included, for log correlation. */
    char id[37], body[256], resp[640];
    sl_request_make_id(&w->rng, id);
    int blen = snprintf(body, sizeof(body),
                        "{\"error\":{\"status\":503,\"code\":\"connection_limit\",\"message\":"
                        "\"too many connections; retry later\",\"request_id\":\"%s\"}}\n",
                        id);
    int n = snprintf(resp, sizeof(resp),
                     "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                     "Content-Length: %d\r\nConnection: close\r\nRetry-After: 1\r\n"
                     "X-Request-Id: %s\r\n\r\n%s",
                     blen, id, body);
    ssize_t written = write(fd, resp, (size_t)n);
    (void)written;
    close(fd);
}

void sl_proxy_accept(sl_listener_sock_t *ls, int fd, const struct sockaddr *addr)
{
    sl_worker_t *w = ls->worker;
    sl_conn_t *c = calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        return;
    }
    c->w = w;
    c->ls = ls;
    c->fd = fd;
    c->first_request = 1;
    sl_request_init(&c->x.r, w, c->client_ip);
    c->x.ops = &h1_exchange_ops;
    c->ev = event_new(w->base, fd, EV_READ | EV_WRITE | EV_CLOSED | EV_ET | EV_PERSIST,
                      client_event_cb, c);
    c->timer = evtimer_new(w->base, timer_cb, c);
    if (!c->ev || !c->timer || event_add(c->ev, NULL) != 0) {
        if (c->ev)
            event_free(c->ev);
        if (c->timer)
            event_free(c->timer);
        close(fd);
        free(c);
        return;
    }
    if (addr->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)addr)->sin_addr, c->client_ip,
                  sizeof(c->client_ip));
    else if (addr->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)addr)->sin6_addr, c->client_ip,
                  sizeof(c->client_ip));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->next = w->conns;
    if (w->conns)
        w->conns->prev = c;
    w->conns = c;
    w->num_conns++;
    ls->active++;
    SL_STAT_ADD(sl_metrics_worker(w->id)->connections_accepted, 1);
    SL_STAT_ADD(sl_metrics_worker(w->id)->connections_active, 1);
    reset_request(c);
    c->state = CS_HEAD;
    client_rev(c, 1);
    c->read_ready = 1; /* data often arrives with the connection: try at once */
    uint32_t header_ms = 10000;
    rcu_thread_online();
    sl_generation_t *g = sl_generation_current();
    if (g)
        header_ms = g->request_header_timeout_ms;
    if (ls->tls) {
        c->x.r.https = 1;
        /* The current generation's certificates for the handshake; the SSL
         * keeps its server alive after that generation is gone. */
        sl_tls_server_t *srv = sl_generation_tls(g, ls->key);
        c->ssl = srv ? sl_tls_server_ssl_new(srv, fd) : NULL;
    }
    rcu_thread_offline();
    /* The handshake and the whole first head share the header timeout. */
    arm_timer(c, header_ms);
    cb_enter(c);
    if (ls->tls && !c->ssl)
        conn_close(c); /* no TLS server for this listener now (or no memory) */
    else if (c->ssl) {
        c->state = CS_HANDSHAKE;
        tls_handshake(c);
    } else {
        read_head(c);
    }
    cb_leave(c);
}

/*
 * Drives the TLS handshake; when done, the connection speaks what ALPN
 * chose: HTTP/2 goes to proxy_h2.c, anything else is HTTP/1.1 here. The
 * verified client certificate (mTLS) is read once and kept for the
 * X-Client-Cert-* headers of every request of the connection.
 */
static void tls_handshake(sl_conn_t *c)
{
    int want = 0;
    int rc = sl_tls_handshake(c->ssl, &want);
    if (rc == SL_AGAIN) {
        if (want == SL_TLS_WANT_READ)
            c->read_ready = 0;
        return; /* the socket's next edge resumes us */
    }
    if (rc != SL_OK) {
        conn_close(c);
        return;
    }
    sl_tls_peer_t peer;
    if (sl_tls_peer(c->ssl, &peer) == SL_OK) {
        c->peer = malloc(sizeof(*c->peer));
        if (!c->peer) {
            conn_close(c);
            return;
        }
        *c->peer = peer;
    }
    c->x.r.peer = c->peer;
    if (sl_tls_alpn(c->ssl) == SL_TLS_ALPN_H2) {
        h2_takeover(c);
        return;
    }
    c->state = CS_HEAD;
    c->read_ready = 1; /* OpenSSL may already hold the first request */
    read_head(c);
}

void sl_proxy_drain(sl_worker_t *w)
{
    sl_conn_t *c = w->conns;
    while (c) {
        sl_conn_t *next = c->next;
        if (c->state == CS_HEAD && sl_buf_len(&c->in) == 0 && !c->x.r.gen)
            conn_close(c);
        else
            c->closing = 1;
        c = next;
    }
    sl_proxy_h2_drain(w);
}

void sl_proxy_close_all(sl_worker_t *w)
{
    while (w->conns)
        conn_close(w->conns);
    sl_proxy_h2_close_all(w);
}

/* ---- client side I/O ------------------------------------------------------ */

/*
 * Writes as much of `out` as the socket takes. Returns 1 when `out` is
 * empty, 0 when the socket is full (the write edge resumes us), -1 when the
 * client is gone (the connection is closed).
 */
static int client_write_some(sl_conn_t *c)
{
    while (sl_buf_len(&c->out) > 0) {
        ssize_t n = client_write(c, sl_buf_head(&c->out), sl_buf_len(&c->out));
        if (n > 0) {
            sl_buf_consume(&c->out, (size_t)n);
            c->x.r.bytes_sent += (uint64_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            client_wev(c, 1);
            /* A client that stops reading gets the idle timeout, not forever. */
            if (c->x.resp_done || c->x.phase == SL_XP_BODY) {
                uint32_t ms = c->x.r.gen ? c->x.r.gen->idle_timeout_ms : 60000;
                arm_timer(c, ms);
            }
            return 0;
        }
        /* The client went away. */
        c->x.r.error_code = c->x.r.error_code ? c->x.r.error_code : "client_closed";
        if (!c->x.r.status)
            c->x.r.status = 499;
        sl_exchange_finish(&c->x, 0);
        sl_request_log(&c->x.r);
        reset_request(c);
        conn_close(c);
        return -1;
    }
    client_wev(c, 0);
    return 1;
}

/* Writes `out`; when it empties, moves the exchange on. */
static void client_flush(sl_conn_t *c)
{
    if (client_write_some(c) != 1)
        return;
    if (c->state == CS_RESPOND || (c->state == CS_PROXY && c->x.resp_done)) {
        if (c->state == CS_PROXY && !c->x.req_body_done) {
            /* Upstream answered before the whole body arrived: the unread
             * rest of the body makes the connection unusable. */
            c->keep_alive = 0;
        }
        request_done(c);
        return;
    }
    if (c->state == CS_PROXY)
        sl_exchange_resume(&c->x);
}

static void client_event_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    sl_conn_t *c = arg;
    cb_enter(c);
    /* A FIN that came with the data gets no edge of its own: remember it so
     * the short-read shortcut does not hide the end of the stream. */
    if (what & EV_CLOSED)
        c->rdhup = 1;
    if (what & (EV_READ | EV_CLOSED))
        c->read_ready = 1;
    if (c->ssl) {
        /* TLS may need the other direction's edge (net/tls.h). */
        if ((what & EV_WRITE) && c->tls_read_wants_write)
            c->read_ready = 1;
        if ((what & (EV_READ | EV_CLOSED)) && c->tls_write_wants_read)
            what |= EV_WRITE;
        if (c->state == CS_HANDSHAKE) {
            tls_handshake(c);
            cb_leave(c);
            return;
        }
    }
    if (c->state == CS_TUNNEL) {
        tunnel_pump(c);
        cb_leave(c);
        return;
    }
    if ((what & EV_WRITE) && c->want_write)
        client_flush(c);
    if (!c->dead && c->want_read && (c->read_ready || c->pending_input)) {
        if (c->state == CS_PROXY)
            sl_exchange_drive(&c->x);
        else if (c->state == CS_HEAD)
            read_head(c);
        else if (c->state == CS_BODY)
            read_policy_body(c);
    }
    cb_leave(c);
}

static void timer_expired(sl_conn_t *c);

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sl_conn_t *c = arg;
    cb_enter(c);
    timer_expired(c);
    cb_leave(c);
}

static void timer_expired(sl_conn_t *c)
{
    uint64_t now = sl_endpoint_now_ms();
    int request_expired = c->x.r.deadline_ms && now >= c->x.r.deadline_ms;
    switch (c->state) {
    case CS_HANDSHAKE:
        conn_close(c); /* the TLS handshake did not finish within the header timeout */
        return;
    case CS_HEAD:
        if (sl_buf_len(&c->in) == 0) {
            /* Not a byte of a request: an idle keep-alive connection, or one
             * that never spoke. Close quietly, as nginx does. */
            conn_close(c);
            return;
        }
        c->keep_alive = 0;
        c->x.req_body_done = 1;
        send_error(c, 408, "request_header_timeout", "the request head did not arrive in time", 1,
                   0);
        return;
    case CS_RESPOND:
        conn_close(c); /* client does not read its error response */
        return;
    case CS_TUNNEL: {
        uint64_t idle = now - c->tun_last_ms;
        if (idle >= c->tun_idle_ms) {
            conn_close(c); /* both sides quiet for tunnelIdle */
            return;
        }
        arm_timer(c, (uint32_t)(c->tun_idle_ms - idle));
        return;
    }
    case CS_BODY:
        if (request_expired)
            send_error(c, 504, "request_timeout", "the request did not complete in time", 1, 0);
        else
            send_error(c, 408, "request_body_timeout", "the request body did not arrive in time", 1,
                       0);
        return;
    case CS_PROXY:
        break;
    case CS_CLOSED:
        return;
    }
    if (request_expired) {
        send_error(c, 504, "request_timeout", "the request did not complete in time", 1, 0);
        return;
    }
    /* Connect or response timeout, or a client that stopped reading. */
    sl_exchange_timeout(&c->x, c->want_write);
}

/* A connection waiting for a request head starts with a small buffer and
 * grows it only for big heads (nginx's client_header_buffer_size idea), so
 * thousands of slow or idle clients cost little memory. */
static int ensure_in(sl_conn_t *c)
{
    if (!c->in.data)
        return sl_worker_small_buf_get(c->w, &c->in);
    return 0;
}

/* Reads and parses request heads while the socket has bytes and the
 * connection is between requests. */
static void read_head(sl_conn_t *c)
{
    if (c->pending_input) {
        c->pending_input = 0;
        process_input(c);
    }
    while (!c->dead && c->state == CS_HEAD && c->read_ready) {
        if (ensure_in(c) != 0) {
            conn_close(c);
            return;
        }
        if (sl_buf_space(&c->in) == 0)
            sl_buf_compact(&c->in);
        if (sl_buf_space(&c->in) == 0) {
            /* Head bigger than the buffer: grow up to the header limit. */
            size_t limit = 32768;
            rcu_thread_online();
            sl_generation_t *g = sl_generation_current();
            if (g)
                limit = g->limits.max_header_bytes;
            rcu_thread_offline();
            size_t want = c->in.cap * 4 < limit + 1 ? c->in.cap * 4 : limit + 1;
            if (c->in.cap >= limit + 1 || sl_buf_reserve(&c->in, want) != 0) {
                conn_close(c);
                return;
            }
        }
        size_t space = sl_buf_space(&c->in);
        ssize_t n = client_read(c, sl_buf_tail(&c->in), space);
        if (n > 0) {
            /* Over TLS a short read proves nothing: OpenSSL may hold more. */
            int short_read = (size_t)n < space && !c->ssl;
            c->in.end += (size_t)n;
            if (c->ls->h2c && c->first_request && c->requests == 0 && !c->sniffed) {
                /* An h2c listener: HTTP/2 with prior knowledge when the
                 * first bytes are the client preface, else HTTP/1.1. */
                int p = sl_h2_is_preface((const uint8_t *)sl_buf_head(&c->in), sl_buf_len(&c->in));
                if (p == SL_AGAIN)
                    continue;
                if (p == SL_OK) {
                    h2_takeover(c);
                    return;
                }
                c->sniffed = 1;
            }
            if (sl_buf_len(&c->in) == (size_t)n && !c->first_request) {
                /* First byte of a keep-alive request: the header timeout starts. */
                uint32_t header_ms = 10000;
                rcu_thread_online();
                sl_generation_t *g = sl_generation_current();
                if (g)
                    header_ms = g->request_header_timeout_ms;
                rcu_thread_offline();
                arm_timer(c, header_ms);
            }
            process_input(c);
            /*
             * A short read means the socket was drained, and the next bytes
             * bring a new edge: trusting it saves an EAGAIN read per request.
             * Only when we have all we wait for, though: a RST that came with
             * the data gets no edge of its own (libevent reports it as
             * READ|WRITE, without CLOSED), so whoever still needs bytes reads
             * on until EAGAIN or the error.
             */
            if (short_read && !c->rdhup && !c->dead && c->state != CS_HEAD && c->x.req_body_done)
                c->read_ready = 0;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            c->read_ready = 0;
            return;
        }
        conn_close(c); /* EOF or error between requests */
        return;
    }
}

/* ---- request head --------------------------------------------------------- */

/*
 * The protocol this request may upgrade to, or an empty slice: the first
 * element of its Upgrade header (RFC 9110 7.8), when Connection names
 * "upgrade" and the route tunnels that token (Api/operation `upgrades`;
 * websocket by default). Only that element is forwarded, so an origin can
 * never switch to a protocol the route did not allow (such as h2c).
 */
static sl_str_t allowed_upgrade(sl_conn_t *c, const sl_http1_request_t *req)
{
    sl_str_t none = {NULL, 0};
    const sl_http1_header_t *u = sl_http1_find_header(req->headers, req->num_headers, "upgrade", 7);
    if (!u)
        return none;
    sl_conn_opts_t co;
    sl_conn_opts_collect(&co, req->headers, req->num_headers);
    if (!sl_conn_opts_name(&co, "upgrade", 7))
        return none;
    const char *p = u->value.ptr, *end = p + u->value.len;
    while (p < end && (*p == ' ' || *p == '\t' || *p == ','))
        p++;
    const char *s = p;
    while (p < end && *p != ',' && *p != ' ' && *p != '\t')
        p++;
    sl_str_t elem = {s, (size_t)(p - s)};
    return sl_exchange_route_tunnels(c->x.r.route, elem) ? elem : none;
}

/* The codec's view of a parsed HTTP/1.1 head, for the request's life. */
static void head_from_http1(sl_req_head_t *h, const sl_http1_request_t *req)
{
    *h = (sl_req_head_t){
        .method = req->method,
        .method_bit = req->method_bit,
        .host = req->host,
        .path = req->path,
        .query = req->query,
        .has_query = (req->flags & SL_HTTP1_F_HAS_QUERY) != 0,
        .target = req->target,
        .headers = req->headers,
        .num_headers = req->num_headers,
        .version = req->minor_version ? 11 : 10,
        .has_length = req->body == SL_HTTP1_BODY_LENGTH || req->body == SL_HTTP1_BODY_NONE,
        .content_length = req->body == SL_HTTP1_BODY_LENGTH ? req->content_length : 0,
    };
    /* The origin's Host: an absolute-form target's authority replaces the
     * Host header (RFC 9112 3.2.2); the parser chose. */
    h->authority = req->authority;
}

/* Parses and dispatches the request at the front of `in`. */
static void process_input(sl_conn_t *c)
{
    sl_request_begin(&c->x.r);
    sl_generation_t *gen = c->x.r.gen;
    sl_http1_limits_t limits = gen ? gen->limits : (sl_http1_limits_t){8192, 32768, 100};
    sl_http1_request_t req;
    memset(&req, 0, sizeof(req));
    req.headers = worker_headers;
    req.num_headers = headers_cap_for(gen);
    if (limits.max_header_count > req.num_headers)
        limits.max_header_count = (uint32_t)req.num_headers;
    ssize_t r = sl_http1_parse_request(sl_buf_head(&c->in), sl_buf_len(&c->in), &limits, &req);
    if (r == SL_AGAIN) {
        client_rev(c, 1);
        return;
    }
    client_rev(c, 0);
    c->state = CS_PROXY;
    c->x.req_body_done = 1; /* until we know there is a body */
    if (r < 0) {
        c->minor_version = 1;
        c->keep_alive = 0;
        const char *code = req.error_status == 414   ? "uri_too_long"
                           : req.error_status == 431 ? "header_too_large"
                           : req.error_status == 501 ? "not_implemented"
                           : req.error_status == 505 ? "version_not_supported"
                                                     : "bad_request";
        sl_buf_consume(&c->in, sl_buf_len(&c->in));
        send_error(c, req.error_status ? req.error_status : 400, code,
                   req.error ? req.error : "malformed request", 1, 0);
        return;
    }
    sl_req_head_t head;
    head_from_http1(&head, &req);
    c->minor_version = req.minor_version;
    c->keep_alive = (req.flags & SL_HTTP1_F_KEEP_ALIVE) != 0;
    sl_request_set_head(&c->x.r, &head);
    c->req_body = req.body;
    if (req.body == SL_HTTP1_BODY_LENGTH) {
        c->req_remaining = req.content_length;
        c->x.req_body_done = req.content_length == 0;
    } else if (req.body == SL_HTTP1_BODY_CHUNKED) {
        sl_http1_chunked_init(&c->req_chunk);
        c->x.req_body_done = 0;
    }

    sl_str_t path;
    sl_request_error_t err;
    if (sl_request_route(&c->x.r, &head, &path, &err) != SL_OK) {
        sl_buf_consume(&c->in, req.head_len);
        send_error(c, err.status, err.code, err.message, err.close, err.allow);
        return;
    }
    c->x.expect_continue = (req.flags & SL_HTTP1_F_EXPECT_CONTINUE) && !c->x.req_body_done;
    sl_str_t upgrade = {NULL, 0};
    if ((req.flags & SL_HTTP1_F_UPGRADE) && req.minor_version == 1 &&
        req.body == SL_HTTP1_BODY_NONE)
        upgrade = allowed_upgrade(c, &req);
    c->x.upgrade = upgrade.len != 0;
    /* No interim responses for HTTP/1.0 clients (RFC 9110 15.2); their
     * chunked responses are de-chunked (they end with the connection). */
    c->x.interim_ok = req.minor_version == 1;
    c->x.dechunk = req.minor_version == 0;

    /* A body a policy reads whole gets its length once it is read. */
    uint64_t body_cap = sl_request_body_cap(&c->x.r);
    if (sl_exchange_build_head(&c->x, &head, path, body_cap ? SL_HTTP1_BODY_NONE : req.body,
                               req.content_length, upgrade) != SL_OK) {
        send_error(c, 503, "overloaded", "out of memory", 1, 0);
        return;
    }
    sl_buf_consume(&c->in, req.head_len);
    evtimer_del(c->timer);
    if (sl_unlikely(body_cap)) {
        start_policy_body(c);
        return;
    }
    /* Body bytes that came with the head. */
    pump_request_body(c);
    if (c->state != CS_PROXY)
        return;
    sl_exchange_start(&c->x);
}

/* ---- request body ---------------------------------------------------------- */

static int body_over_limit(sl_conn_t *c)
{
    return c->x.r.max_body_bytes && c->x.r.bytes_received > c->x.r.max_body_bytes;
}

/*
 * Moves request body bytes from `in` (and the socket) to uout, as far as
 * uout has room. Keeps uout for replay while it fits.
 */
/* The client closed (or failed) while its request body was being read:
 * the request ends as 499 client_closed, logged, and the connection goes. */
static void client_gone_mid_body(sl_conn_t *c)
{
    c->x.r.error_code = "client_closed";
    c->x.r.status = 499;
    sl_exchange_finish(&c->x, 0);
    sl_request_log(&c->x.r);
    reset_request(c);
    conn_close(c);
}

static void pump_request_body(sl_conn_t *c)
{
    if (c->x.req_body_done) {
        client_rev(c, 0);
        return;
    }
    for (;;) {
        /* Room in uout: drop what was sent if the buffer is full. */
        if (sl_buf_space(&c->x.uout) < 1024) {
            if (c->x.uout_sent > 0 && c->x.phase != SL_XP_CONNECTING) {
                size_t sent = c->x.uout_sent;
                c->x.uout.start += sent;
                c->x.uout_sent = 0;
                sl_buf_compact(&c->x.uout);
                c->x.r.replayable = 0;
            }
            if (sl_buf_space(&c->x.uout) < 1024) {
                client_rev(c, 0); /* backpressure: wait for the upstream */
                return;
            }
        }
        if (sl_buf_len(&c->in) == 0) {
            if (c->req_body == SL_HTTP1_BODY_LENGTH && c->in.data == NULL) {
                /* Fixed length: read straight into uout, never past the body. */
                size_t want = sl_buf_space(&c->x.uout);
                if (want > c->req_remaining)
                    want = (size_t)c->req_remaining;
                if (!c->read_ready)
                    break;
                ssize_t n = client_read(c, sl_buf_tail(&c->x.uout), want);
                if (n > 0) {
                    sl_request_body_seen(&c->x.r, 0, sl_buf_tail(&c->x.uout), (size_t)n, 0);
                    c->x.uout.end += (size_t)n;
                    c->req_remaining -= (uint64_t)n;
                    c->x.r.bytes_received += (uint64_t)n;
                    if (c->req_remaining == 0) {
                        c->x.req_body_done = 1;
                        break;
                    }
                    continue;
                }
                if (n < 0 && errno == EINTR)
                    continue;
                if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                    c->read_ready = 0;
                    break;
                }
                goto client_gone;
            }
            if (!c->read_ready)
                break;
            if (c->in.data && c->in.cap < SL_WORKER_BLOCK_SIZE && sl_buf_len(&c->in) == 0)
                sl_worker_buf_put(c->w, &c->in); /* a body streams: take a big buffer */
            if (!c->in.data && sl_worker_buf_get(c->w, &c->in) != 0)
                goto client_gone;
            sl_buf_compact(&c->in);
            size_t space = sl_buf_space(&c->in);
            ssize_t n = client_read(c, sl_buf_tail(&c->in), space);
            if (n > 0) {
                c->in.end += (size_t)n;
            } else if (n < 0 && errno == EINTR) {
                continue;
            } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                c->read_ready = 0;
                break;
            } else {
                goto client_gone;
            }
        }
        size_t avail = sl_buf_len(&c->in);
        size_t room = sl_buf_space(&c->x.uout);
        size_t take = avail < room ? avail : room;
        if (c->req_body == SL_HTTP1_BODY_LENGTH) {
            if (take > c->req_remaining)
                take = (size_t)c->req_remaining;
            memcpy(sl_buf_tail(&c->x.uout), sl_buf_head(&c->in), take);
            sl_request_body_seen(&c->x.r, 0, sl_buf_head(&c->in), take, 0);
            c->x.uout.end += take;
            sl_buf_consume(&c->in, take);
            c->req_remaining -= take;
            c->x.r.bytes_received += take;
            if (c->req_remaining == 0) {
                c->x.req_body_done = 1;
                break;
            }
        } else {
            int done = 0;
            /* An HTTP/2 upstream takes the payload only: the framing is
             * stripped in place (the payload moves to the front of `in`). */
            size_t payload = 0;
            ssize_t used =
                c->x.up_h2 ? sl_http1_chunked_decode(&c->req_chunk, sl_buf_head(&c->in), take,
                                                     &payload, &done)
                           : sl_http1_chunked_scan(&c->req_chunk, sl_buf_head(&c->in), take, &done);
            if (!c->x.up_h2 && used > 0)
                payload = (size_t)used;
            if (used < 0) {
                c->keep_alive = 0;
                send_error(c, 400, "bad_request",
                           c->req_chunk.error ? c->req_chunk.error : "invalid chunked body", 1, 0);
                return;
            }
            memcpy(sl_buf_tail(&c->x.uout), sl_buf_head(&c->in), payload);
            /* Payload only for an HTTP/2 upstream; chunk-framed otherwise. */
            sl_request_body_seen(&c->x.r, 0, sl_buf_head(&c->in), payload, !c->x.up_h2);
            c->x.uout.end += payload;
            sl_buf_consume(&c->in, (size_t)used);
            c->x.r.bytes_received = c->req_chunk.data_bytes;
            if (done) {
                c->x.req_body_done = 1;
                break;
            }
        }
        if (body_over_limit(c)) {
            send_error(c, 413, "payload_too_large",
                       "the request body exceeds the limit of this API", 1, 0);
            return;
        }
        if (sl_buf_len(&c->in) == 0 && c->in.data && c->req_body == SL_HTTP1_BODY_LENGTH) {
            /* Leftover head bytes are consumed: read the rest straight into uout. */
            sl_worker_buf_put(c->w, &c->in);
        }
    }
    if (body_over_limit(c)) {
        send_error(c, 413, "payload_too_large", "the request body exceeds the limit of this API", 1,
                   0);
        return;
    }
    client_rev(c, !c->x.req_body_done);
    return;
client_gone:
    client_gone_mid_body(c);
}

/* ---- a request body a policy reads whole ----------------------------------- */

/*
 * The chain asked for the body (request.h, sl_request_body_cap): it is read
 * whole into the request's body buffer, chunked framing stripped, before
 * anything goes upstream (CS_BODY); past the cap the answer is 413 and the
 * connection closes. A client waiting on Expect: 100-continue is told to
 * send the body now (the exchange would only say so once it has an
 * endpoint, after the body). The client's idle timeout applies between
 * reads, within the request's deadline, so a stalled body ends with 408.
 */
static void start_policy_body(sl_conn_t *c)
{
    c->state = CS_BODY;
    if (c->x.expect_continue) {
        c->x.expect_continue = 0;
        h1_send_continue(&c->x);
        if (c->state != CS_BODY)
            return;
    }
    arm_timer(c, c->x.r.gen->idle_timeout_ms);
    read_policy_body(c);
}

/* The whole body is read: the body hooks decide. Passed, it becomes the
 * request's body as if the client had sent it with a Content-Length (a
 * chunked one loses its trailers), ahead of any pipelined bytes in `in`,
 * and the exchange starts as for any request. */
static void finish_policy_body(sl_conn_t *c)
{
    sl_request_error_t err;
    sl_buf_t body;
    c->x.req_body_done = 1; /* all read: the connection may carry another request */
    if (sl_request_body_done(&c->x.r, &body, &err) != SL_OK) {
        send_error(c, err.status, err.code, err.message, err.close, err.allow);
        return;
    }
    size_t len = sl_buf_len(&body);
    if ((sl_buf_len(&c->in) &&
         sl_buf_append(&body, sl_buf_head(&c->in), sl_buf_len(&c->in)) != 0) ||
        sl_exchange_set_body_length(&c->x, len) != SL_OK) {
        sl_buf_free(&body);
        send_error(c, 503, "overloaded", "out of memory", 1, 0);
        return;
    }
    sl_worker_buf_put(c->w, &c->in);
    c->in = body;
    c->req_body = SL_HTTP1_BODY_LENGTH;
    c->req_remaining = len;
    c->x.req_body_done = len == 0;
    c->x.r.bytes_received = 0; /* counted again on its way upstream */
    c->state = CS_PROXY;
    evtimer_del(c->timer);
    pump_request_body(c);
    if (c->state != CS_PROXY)
        return;
    sl_exchange_start(&c->x);
}

static void read_policy_body(sl_conn_t *c)
{
    sl_request_error_t err;
    int progress = 0;
    while (c->state == CS_BODY) {
        size_t avail = sl_buf_len(&c->in);
        if (avail) {
            size_t used, payload;
            int done = 0;
            if (c->req_body == SL_HTTP1_BODY_LENGTH) {
                used = payload = avail < c->req_remaining ? avail : (size_t)c->req_remaining;
                c->req_remaining -= used;
                done = c->req_remaining == 0;
            } else {
                ssize_t u = sl_http1_chunked_decode(&c->req_chunk, sl_buf_head(&c->in), avail,
                                                    &payload, &done);
                if (u < 0) {
                    c->keep_alive = 0;
                    send_error(c, 400, "bad_request",
                               c->req_chunk.error ? c->req_chunk.error : "invalid chunked body", 1,
                               0);
                    return;
                }
                used = (size_t)u;
            }
            c->x.r.bytes_received += payload;
            if (sl_request_body_add(&c->x.r, sl_buf_head(&c->in), payload, &err) != SL_OK) {
                send_error(c, err.status, err.code, err.message, 1, 0);
                return;
            }
            sl_buf_consume(&c->in, used);
            if (done) {
                finish_policy_body(c);
                return;
            }
            if (used)
                continue;
        }
        if (!c->read_ready)
            break;
        if (c->in.data && c->in.cap < SL_WORKER_BLOCK_SIZE && sl_buf_len(&c->in) == 0)
            sl_worker_buf_put(c->w, &c->in); /* the small head buffer: take a big one */
        if (!c->in.data && sl_worker_buf_get(c->w, &c->in) != 0)
            goto client_gone;
        sl_buf_compact(&c->in);
        ssize_t n = client_read(c, sl_buf_tail(&c->in), sl_buf_space(&c->in));
        if (n > 0) {
            c->in.end += (size_t)n;
            progress = 1;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            c->read_ready = 0;
        } else {
            goto client_gone;
        }
    }
    if (c->state != CS_BODY)
        return;
    if (progress)
        arm_timer(c, c->x.r.gen->idle_timeout_ms);
    client_rev(c, 1);
    return;
client_gone:
    client_gone_mid_body(c);
}

/*
 * Appends the upstream's header fields to b, without hop-by-hop fields.
 * Returns which of Date / X-Request-Id were present.
 */
#define HAS_DATE 1u
#define HAS_REQID 2u
static int name_is(const sl_http1_header_t *h, const char *lit, size_t len)
{
    return h->name.len == len && strncasecmp(h->name.ptr, lit, len) == 0;
}

static unsigned append_response_fields(sl_conn_t *c, sl_buf_t *b, const sl_http1_response_t *resp)
{
    sl_conn_opts_t co;
    sl_conn_opts_collect(&co, resp->headers, resp->num_headers);
    /* RFC 9110 8.6: no Content-Length in 1xx and 204 responses; an origin
     * that sends one anyway does not get it past us (HAProxy does the same). */
    int drop_length = resp->status < 200 || resp->status == 204;
    unsigned has = 0;
    for (size_t i = 0; i < resp->num_headers; i++) {
        const sl_http1_header_t *h = &resp->headers[i];
        if (sl_http_is_hop_by_hop(h, &co))
            continue;
        switch (h->name.len) {
        case 4:
            if (name_is(h, "date", 4))
                has |= HAS_DATE;
            break;
        case 7:
            /* A de-chunked body loses its trailer fields with its framing. */
            if (c->x.dechunk && name_is(h, "trailer", 7))
                continue;
            break;
        case 12:
            if (name_is(h, "x-request-id", 12))
                has |= HAS_REQID;
            break;
        case 14:
            if (drop_length && name_is(h, "content-length", 14))
                continue;
            break;
        default:
            break;
        }
        if (sl_unlikely(c->x.r.pol) && sl_request_header_dropped(&c->x.r, 1, h->name))
            continue;
        sl_buf_append_field(b, h->name.ptr, h->name.len, h->value.ptr, h->value.len);
    }
    if (!(has & HAS_DATE)) {
        size_t dl;
        const char *d = sl_request_date_line(&dl);
        sl_buf_append(b, d, dl);
    }
    return has;
}

/* The status line: always our own version, HTTP/1.1, whatever the client's
 * (RFC 9112 2.3); an HTTP/1.0 client keeps 1.0 semantics (no chunked, close
 * unless keep-alive), which the rest of the head takes care of. */
static void append_status_line(sl_buf_t *b, const sl_http1_response_t *resp)
{
    char line[32] = "HTTP/1.1 ";
    int n;
    /* The parser's range, written without snprintf (once per response). */
    if (resp->status >= 100 && resp->status <= 999) {
        line[9] = (char)('0' + resp->status / 100);
        line[10] = (char)('0' + resp->status / 10 % 10);
        line[11] = (char)('0' + resp->status % 10);
        line[12] = ' ';
        n = 13;
    } else {
        n = snprintf(line, sizeof(line), "HTTP/1.1 %d ", resp->status);
    }
    sl_buf_append(b, line, (size_t)n);
    sl_buf_append(b, resp->reason.ptr, resp->reason.len);
    sl_buf_append(b, "\r\n", 2);
}

/* An interim (1xx) response head for the client, e.g. 103 Early Hints. */
static void build_interim_head(sl_conn_t *c, const sl_http1_response_t *resp)
{
    append_status_line(&c->out, resp);
    append_response_fields(c, &c->out, resp);
    sl_buf_append(&c->out, "\r\n", 2);
}

/* The headers a policy chain sets or adds on the response. */
static void append_policy_headers(sl_conn_t *c, sl_buf_t *b)
{
    sl_request_append_policy_fields(&c->x.r, 1, b);
}

/* Builds the client response head from the upstream's into `out`. */
static void build_client_head(sl_conn_t *c, const sl_http1_response_t *resp)
{
    sl_buf_t *b = &c->out;
    if (sl_unlikely(c->x.r.pol))
        sl_request_response_hooks(&c->x.r, resp->status);
    append_status_line(b, resp);
    int has_reqid = (append_response_fields(c, b, resp) & HAS_REQID) != 0;
    if (sl_unlikely(c->x.r.pol))
        append_policy_headers(c, b);
    if (!has_reqid && c->x.r.m_reqid.len) {
        sl_buf_append(b, "X-Request-Id: ", 14);
        sl_buf_append(b, c->x.r.m_reqid.ptr, c->x.r.m_reqid.len);
        sl_buf_append(b, "\r\n", 2);
    }
    if (c->x.r.gen->add_via)
        sl_buf_append(b, "Via: 1.1 sluice\r\n", 17);
    if (sl_unlikely(c->x.r.gen->tracing.server_timing)) {
        char timing[96];
        size_t tl = sl_request_server_timing(&c->x.r, timing, sizeof(timing));
        if (tl)
            sl_buf_append_field(b, "Server-Timing", 13, timing, tl);
    }
    if (c->x.resp_body == SL_HTTP1_BODY_CHUNKED && !c->x.dechunk)
        sl_buf_append(b, "Transfer-Encoding: chunked\r\n", 28);
    /* HTTP/2 has no close-delimited bodies: one without a length is framed
     * chunked for an HTTP/1.1 client, so its connection stays reusable. */
    c->frame_chunked = c->x.up_h2 && c->x.resp_body == SL_HTTP1_BODY_CLOSE && c->minor_version;
    if (c->frame_chunked)
        sl_buf_append(b, "Transfer-Encoding: chunked\r\n", 28);
    /* A de-chunked body has no length: it ends with the connection. */
    int close_client = !c->keep_alive || c->closing || c->w->draining ||
                       (c->x.resp_body == SL_HTTP1_BODY_CLOSE && !c->frame_chunked) ||
                       !c->x.req_body_done || c->x.dechunk;
    if (close_client) {
        c->keep_alive = 0;
        sl_buf_append(b, "Connection: close\r\n", 19);
    } else if (c->minor_version == 0) {
        sl_buf_append(b, "Connection: keep-alive\r\n", 24);
    }
    sl_buf_append(b, "\r\n", 2);
}

/* ---- upgraded connections (101): a byte tunnel ---------------------------- */

/*
 * The origin switched protocols: relay the 101 (its fields, without hop-by-hop
 * ones, plus our Upgrade/Connection pair) and turn the connection into a
 * tunnel. The exchange is over for the gateway: it is counted and logged now
 * (status 101), and the tunnel holds no generation, so config changes never
 * touch it; it lives until either side closes or both are quiet for
 * `timeouts.tunnelIdle`.
 */
static int tunnel_start(sl_conn_t *c, const sl_http1_response_t *resp, size_t head_len)
{
    if (sl_exchange_tunnel_check(&c->x, resp) != SL_OK)
        return SL_ERROR;
    const sl_http1_header_t *u =
        sl_http1_find_header(resp->headers, resp->num_headers, "upgrade", 7);
    if (!c->out.data && sl_worker_buf_get(c->w, &c->out) != 0)
        return SL_ERROR;
    append_status_line(&c->out, resp);
    append_response_fields(c, &c->out, resp);
    if (c->x.r.m_reqid.len) {
        sl_buf_append(&c->out, "X-Request-Id: ", 14);
        sl_buf_append(&c->out, c->x.r.m_reqid.ptr, c->x.r.m_reqid.len);
        sl_buf_append(&c->out, "\r\n", 2);
    }
    sl_buf_append(&c->out, "Upgrade: ", 9);
    sl_buf_append(&c->out, u->value.ptr, u->value.len);
    sl_buf_append(&c->out, "\r\nConnection: upgrade\r\n\r\n", 25);
    /* Bytes of the new protocol that came with the head. */
    sl_buf_consume(&c->x.uin, head_len);
    sl_buf_append(&c->out, sl_buf_head(&c->x.uin), sl_buf_len(&c->x.uin));
    c->tun_idle_ms = sl_exchange_tunnel_opened(&c->x, 101);
    c->state = CS_TUNNEL;
    c->keep_alive = 0;
    c->tun_client_eof = c->tun_up_eof = c->tun_client_shut = c->tun_up_shut = 0;
    c->tun_last_ms = sl_endpoint_now_ms();
    arm_timer(c, c->tun_idle_ms);
    c->read_ready = 1;
    c->x.up_read_ready = 1;
    tunnel_pump(c);
    return SL_OK;
}

/* Moves bytes src_fd -> buf -> dst_fd for one direction of the tunnel.
 * Returns 1 on progress, 0 when blocked, -1 when the tunnel must close. */
static int tunnel_relay(sl_conn_t *c, int to_client, uint8_t *src_ready, uint8_t *src_eof,
                        sl_buf_t *buf, uint8_t *dst_shut)
{
    int dst_fd = to_client ? c->fd : c->x.up->fd;
    int progress = 0;
    for (;;) {
        while (sl_buf_len(buf)) {
            ssize_t n = to_client ? client_write(c, sl_buf_head(buf), sl_buf_len(buf))
                                  : sl_upstream_write(c->x.up, sl_buf_head(buf), sl_buf_len(buf));
            if (n > 0) {
                sl_buf_consume(buf, (size_t)n);
                progress = 1;
                continue;
            }
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return progress; /* the destination's write edge resumes us */
            return -1;
        }
        if (*src_eof) {
            if (!*dst_shut) {
                /* Relay the EOF: the other side may still answer. Over
                 * TLS that is close_notify (it has no half-close of its
                 * own), then the socket's FIN. */
                SSL *dst_ssl = to_client ? c->ssl : c->x.up->ssl;
                if (dst_ssl) {
                    int want;
                    sl_tls_shutdown(dst_ssl, &want);
                }
                shutdown(dst_fd, SHUT_WR);
                *dst_shut = 1;
                progress = 1;
            }
            return progress;
        }
        if (!*src_ready)
            return progress;
        if (!buf->data && sl_worker_buf_get(c->w, buf) != 0)
            return -1;
        buf->start = buf->end = 0;
        ssize_t n = to_client ? sl_upstream_read(c->x.up, sl_buf_tail(buf), sl_buf_space(buf))
                              : client_read(c, sl_buf_tail(buf), sl_buf_space(buf));
        if (n > 0) {
            buf->end += (size_t)n;
            progress = 1;
            continue;
        }
        if (n == 0) {
            *src_eof = 1;
            continue;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            *src_ready = 0;
            return progress;
        }
        return -1;
    }
}

static void tunnel_pump(sl_conn_t *c)
{
    if (!c->x.up) {
        conn_close(c);
        return;
    }
    /* A client buffer that is still the small head buffer is swapped for a
     * block, like a request body: tunnels move bulk data. */
    if (c->in.data && c->in.cap < SL_WORKER_BLOCK_SIZE && sl_buf_len(&c->in) == 0)
        sl_worker_buf_put(c->w, &c->in);
    int moved = 0;
    for (;;) {
        int down =
            tunnel_relay(c, 1, &c->x.up_read_ready, &c->tun_up_eof, &c->out, &c->tun_client_shut);
        if (down < 0)
            break;
        int upw = tunnel_relay(c, 0, &c->read_ready, &c->tun_client_eof, &c->in, &c->tun_up_shut);
        if (upw < 0)
            break;
        if (c->tun_client_shut && c->tun_up_shut) {
            conn_close(c); /* both directions ended */
            return;
        }
        if (!down && !upw) {
            if (moved)
                c->tun_last_ms = sl_endpoint_now_ms();
            return;
        }
        moved = 1;
    }
    conn_close(c); /* a reset or an error on either side */
}

/* ---- what the exchange asks of an HTTP/1.1 client connection --------------- */

static void h1_enter(sl_exchange_t *x)
{
    cb_enter(conn_of(x));
}

static void h1_leave(sl_exchange_t *x)
{
    cb_leave(conn_of(x));
}

static int h1_alive(sl_exchange_t *x)
{
    sl_conn_t *c = conn_of(x);
    return !c->dead && c->state == CS_PROXY;
}

static int h1_head(sl_exchange_t *x, const sl_http1_response_t *resp, int interim)
{
    sl_conn_t *c = conn_of(x);
    if (!c->out.data && sl_worker_buf_get(c->w, &c->out) != 0)
        return SL_ERROR;
    if (interim)
        build_interim_head(c, resp);
    else
        build_client_head(c, resp);
    return SL_OK;
}

static sl_buf_t *h1_body_buf(sl_exchange_t *x)
{
    sl_conn_t *c = conn_of(x);
    if (c->frame_chunked && !c->stage.data)
        sl_worker_buf_get(c->w, &c->stage);
    return c->frame_chunked ? &c->stage : &c->out;
}

/* Moves the staged bytes into `out` as one chunk. */
static void frame_stage(sl_conn_t *c)
{
    size_t n = sl_buf_len(&c->stage);
    if (!n)
        return;
    char line[24];
    int h = snprintf(line, sizeof(line), "%zx\r\n", n);
    if (!c->out.data)
        sl_worker_buf_get(c->w, &c->out);
    sl_buf_append(&c->out, line, (size_t)h);
    sl_buf_append(&c->out, sl_buf_head(&c->stage), n);
    sl_buf_append(&c->out, "\r\n", 2);
    sl_buf_consume(&c->stage, n);
}

static int h1_body_flush(sl_exchange_t *x)
{
    sl_conn_t *c = conn_of(x);
    if (c->frame_chunked) {
        /* Bounded: a chunk goes into `out` only once `out` has drained. */
        int w = client_write_some(c);
        if (w != 1)
            return w;
        frame_stage(c);
    }
    return client_write_some(c);
}

static void h1_complete(sl_exchange_t *x)
{
    sl_conn_t *c = conn_of(x);
    evtimer_del(c->timer);
    if (c->frame_chunked) {
        /* The last chunk, and the upstream's trailers (RFC 9112 7.1.2). */
        frame_stage(c);
        sl_buf_append(&c->out, "0\r\n", 3);
        sl_header_t f[64];
        size_t n = sl_exchange_trailers(x, f, SL_ARRAY_LEN(f));
        for (size_t i = 0; i < n; i++) {
            sl_buf_append(&c->out, f[i].name.ptr, f[i].name.len);
            sl_buf_append(&c->out, ": ", 2);
            sl_buf_append(&c->out, f[i].value.ptr, f[i].value.len);
            sl_buf_append(&c->out, "\r\n", 2);
        }
        sl_buf_append(&c->out, "\r\n", 2);
        c->frame_chunked = 0;
        sl_worker_buf_put(c->w, &c->stage);
    }
    client_flush(c); /* completes the request once written */
}

static void h1_error(sl_exchange_t *x, int status, const char *code, const char *message, int close)
{
    send_error(conn_of(x), status, code, message, close, 0);
}

/* A response cut after its head: closing the connection at once is the only
 * signal HTTP/1.1 has (the client sees fewer bytes than announced, or no
 * last chunk), never a response that looks complete. */
static void h1_abort(sl_exchange_t *x, const char *code)
{
    sl_conn_t *c = conn_of(x);
    c->x.r.error_code = code;
    sl_request_log(&c->x.r);
    reset_request(c);
    conn_close(c);
}

static void h1_arm_timer(sl_exchange_t *x, uint32_t ms)
{
    arm_timer(conn_of(x), ms);
}

static void h1_pump_body(sl_exchange_t *x)
{
    pump_request_body(conn_of(x));
}

/* Expect: 100-continue: the gateway says go on once it has an endpoint; the
 * upstream never sees Expect. */
static void h1_send_continue(sl_exchange_t *x)
{
    sl_conn_t *c = conn_of(x);
    if (!c->out.data && sl_worker_buf_get(c->w, &c->out) != 0) {
        send_error(c, 503, "overloaded", "out of memory", 1, 0);
        return;
    }
    sl_buf_append(&c->out, "HTTP/1.1 100 Continue\r\n\r\n", 25);
    ssize_t n = client_write(c, sl_buf_head(&c->out), sl_buf_len(&c->out));
    if (n > 0)
        sl_buf_consume(&c->out, (size_t)n);
    if (sl_buf_len(&c->out))
        client_wev(c, 1);
    client_rev(c, 1);
}

static int h1_upgraded(sl_exchange_t *x, const sl_http1_response_t *resp, size_t head_len)
{
    return tunnel_start(conn_of(x), resp, head_len);
}

static void h1_tunnel_event(sl_exchange_t *x)
{
    sl_conn_t *c = conn_of(x);
    if (c->state == CS_TUNNEL)
        tunnel_pump(c);
}

static const sl_exchange_ops_t h1_exchange_ops = {
    .enter = h1_enter,
    .leave = h1_leave,
    .alive = h1_alive,
    .head = h1_head,
    .body_buf = h1_body_buf,
    .body_flush = h1_body_flush,
    .complete = h1_complete,
    .error = h1_error,
    .abort = h1_abort,
    .arm_timer = h1_arm_timer,
    .pump_body = h1_pump_body,
    .send_continue = h1_send_continue,
    .upgraded = h1_upgraded,
    .tunnel_event = h1_tunnel_event,
};
