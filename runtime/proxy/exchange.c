/*
 * The upstream exchange of one request (exchange.h): HTTP/1.1 to the
 * upstream, retries, outcomes, pooling, and the response streamed to the
 * client's codec through sl_exchange_ops_t.
 */
#include "exchange.h"

#include "cache.h"
#include "log.h"
#include "metrics.h"
#include "tls.h"
#include "upstream_h2.h"

#include <ctype.h>
#include <errno.h>
#include <event2/event.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_RESPONSE_HEAD (64 * 1024)
#define READ_LOW_WATER 4096

static void read_response_head(sl_exchange_t *x);
static void read_response_body(sl_exchange_t *x);
static void start_attempt(sl_exchange_t *x);
static int up_send(sl_exchange_t *x);

static int alive(sl_exchange_t *x)
{
    return x->ops->alive(x);
}

/* ---- hop-by-hop rules (RFC 9110 7.6.1) ------------------------------------ */

int sl_http_token_in_list(sl_str_t list, const char *tok, size_t toklen)
{
    const char *p = list.ptr, *end = list.ptr + list.len;
    while (p < end) {
        while (p < end && (*p == ' ' || *p == '\t' || *p == ','))
            p++;
        const char *s = p;
        while (p < end && *p != ',')
            p++;
        const char *e = p;
        while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
            e--;
        if ((size_t)(e - s) == toklen && strncasecmp(s, tok, toklen) == 0)
            return 1;
    }
    return 0;
}

static int name_is(const sl_header_t *h, const char *lit, size_t len)
{
    return h->name.len == len && strncasecmp(h->name.ptr, lit, len) == 0;
}

/*
 * The options of every Connection header line of a message: a sender may
 * split the list over several lines, and each named field is hop-by-hop.
 * Parsed once per message, so that the check per field is a length compare
 * (and nothing at all for the usual "Connection: keep-alive"). Past the
 * inline slots the message's headers are scanned again: slow but exact.
 */
void sl_conn_opts_collect(sl_conn_opts_t *co, const sl_header_t *hs, size_t n)
{
    co->n = 0;
    co->all = NULL;
    co->num_all = 0;
    for (size_t i = 0; i < n; i++) {
        if (hs[i].name.len != 10 || strncasecmp(hs[i].name.ptr, "connection", 10) != 0)
            continue;
        const char *p = hs[i].value.ptr, *end = p + hs[i].value.len;
        while (p < end) {
            while (p < end && (*p == ' ' || *p == '\t' || *p == ','))
                p++;
            const char *s = p;
            while (p < end && *p != ',')
                p++;
            const char *e = p;
            while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
                e--;
            size_t len = (size_t)(e - s);
            if (len == 0 || (len == 5 && strncasecmp(s, "close", 5) == 0) ||
                (len == 10 && strncasecmp(s, "keep-alive", 10) == 0))
                continue;
            if (co->n == SL_CONN_TOKENS_INLINE) {
                co->all = hs;
                co->num_all = n;
                return;
            }
            co->tok[co->n++] = (sl_str_t){s, len};
        }
    }
}

int sl_conn_opts_name(const sl_conn_opts_t *co, const char *name, size_t len)
{
    if (co->all) {
        for (size_t i = 0; i < co->num_all; i++) {
            const sl_header_t *h = &co->all[i];
            if (h->name.len == 10 && strncasecmp(h->name.ptr, "connection", 10) == 0 &&
                sl_http_token_in_list(h->value, name, len))
                return 1;
        }
        return 0;
    }
    for (unsigned i = 0; i < co->n; i++)
        if (co->tok[i].len == len && strncasecmp(co->tok[i].ptr, name, len) == 0)
            return 1;
    return 0;
}

/* Trailer is not here: it is end-to-end (RFC 9110 6.6.2); the client needs
 * it to expect the trailer fields that are forwarded with the body. */
int sl_http_is_hop_by_hop(const sl_header_t *h, const sl_conn_opts_t *co)
{
    int hop = 0;
    switch (h->name.len) {
    case 2:
        hop = name_is(h, "te", 2);
        break;
    case 7:
        hop = name_is(h, "upgrade", 7);
        break;
    case 10:
        hop = name_is(h, "connection", 10) || name_is(h, "keep-alive", 10);
        break;
    case 16:
        hop = name_is(h, "proxy-connection", 16);
        break;
    case 17:
        hop = name_is(h, "transfer-encoding", 17);
        break;
    case 19:
        hop = name_is(h, "proxy-authorization", 19);
        break;
    default:
        break;
    }
    /* Any header the sender named in Connection is hop-by-hop too. */
    return hop || ((co->n || co->all) && sl_conn_opts_name(co, h->name.ptr, h->name.len));
}

/* ---- the request head for the upstream ----------------------------------- */

int sl_exchange_build_head(sl_exchange_t *x, const sl_req_head_t *req, sl_str_t req_path,
                           enum sl_http1_body body, uint64_t content_length, sl_str_t upgrade)
{
    sl_buf_t *b = &x->uout;
    if (!b->data && sl_worker_buf_get(x->r.w, b) != 0)
        return SL_ERROR;
    /* The codecs frame the body for this: raw payload for HTTP/2. */
    x->up_h2 = x->r.cluster->pb->protocol != SLUICE__V1__CLUSTER__PROTOCOL__HTTP1;
    sl_conn_opts_t co;
    sl_conn_opts_collect(&co, req->headers, req->num_headers);

    sl_buf_append(b, req->method.ptr, req->method.len);
    sl_buf_append(b, " ", 1);
    if (x->r.pol && x->r.pol->v.path_out.ptr)
        req_path = x->r.pol->v.path_out; /* rewrite */
    if (req_path.len == 0 || req_path.ptr[0] != '/')
        sl_buf_append(b, "/", 1);
    sl_buf_append(b, req_path.ptr, req_path.len);
    /* A policy may have rewritten the query (api-key removing its own
     * parameter): an emptied query loses its '?' too. */
    sl_str_t query = req->query;
    int has_query = req->has_query;
    if (x->r.pol && x->r.pol->v.query_out.ptr) {
        query = x->r.pol->v.query_out;
        has_query = query.len > 0;
    }
    if (has_query) {
        sl_buf_append(b, "?", 1);
        sl_buf_append(b, query.ptr, query.len);
    }
    /* HTTP/1.0 clients are forwarded as 1.0 so the upstream never answers
     * chunked, which such a client could not read. */
    if (req->version == 10)
        sl_buf_append(b, " HTTP/1.0\r\n", 11);
    else
        sl_buf_append(b, " HTTP/1.1\r\n", 11);

    /* Host, X-Request-Id and the X-Forwarded-* fields are the gateway's to
     * write; Expect is answered by the gateway itself. */
    const sl_header_t *xff = NULL;
    for (size_t i = 0; i < req->num_headers; i++) {
        const sl_header_t *h = &req->headers[i];
        if (sl_http_is_hop_by_hop(h, &co))
            continue;
        if (name_is(h, "x-forwarded-for", 15)) {
            xff = h;
            continue;
        }
        if (name_is(h, "host", 4) || name_is(h, "x-request-id", 12) ||
            name_is(h, "x-forwarded-proto", 17) || name_is(h, "x-forwarded-host", 16) ||
            name_is(h, "expect", 6) || name_is(h, "content-length", 14))
            continue;
        /* The handshake fields the gateway writes itself (ws_key). */
        if (x->ws_key[0] &&
            (name_is(h, "sec-websocket-key", 17) || name_is(h, "sec-websocket-version", 21)))
            continue;
        /* The client certificate fields are the gateway's alone: a client
         * never forges them, whether or not it presented a certificate. */
        if ((h->name.len > 14 && strncasecmp(h->name.ptr, "x-client-cert-", 14) == 0) ||
            name_is(h, "x-forwarded-client-cert", 23))
            continue;
        if (sl_unlikely(x->r.pol) && sl_request_header_dropped(&x->r, 0, h->name))
            continue;
        /* Taking part in the trace: our traceparent replaces the client's,
         * and a trace restarted here drops the old trace's tracestate. */
        if (sl_unlikely(x->r.trace_state == SL_TRACE_OWN) &&
            (name_is(h, "traceparent", 11) || (!x->r.trace_parent && name_is(h, "tracestate", 10))))
            continue;
        sl_buf_append_field(b, h->name.ptr, h->name.len, h->value.ptr, h->value.len);
    }
    if (sl_unlikely(x->r.pol))
        sl_request_append_policy_fields(&x->r, 0, b);
    sl_str_t host_value = req->authority;
    sl_gen_cluster_t *cl = x->r.cluster;
    sl_buf_append(b, "Host: ", 6);
    if (x->r.pol && x->r.pol->v.host_out.ptr) /* rewrite */
        sl_buf_append(b, x->r.pol->v.host_out.ptr, x->r.pol->v.host_out.len);
    else if (cl->host_rewrite.len)
        sl_buf_append(b, cl->host_rewrite.ptr, cl->host_rewrite.len);
    else if (host_value.len)
        sl_buf_append(b, host_value.ptr, host_value.len);
    else
        sl_buf_append(b, "localhost", 9);
    sl_buf_append(b, "\r\nX-Forwarded-For: ", 19);
    if (xff && xff->value.len) {
        sl_buf_append(b, xff->value.ptr, xff->value.len);
        sl_buf_append(b, ", ", 2);
    }
    sl_buf_append(b, x->r.client_ip, strlen(x->r.client_ip));
    if (x->r.https)
        sl_buf_append(b, "\r\nX-Forwarded-Proto: https\r\n", 28);
    else
        sl_buf_append(b, "\r\nX-Forwarded-Proto: http\r\n", 27);
    if (x->r.peer) {
        const sl_tls_peer_t *p = x->r.peer;
        sl_buf_append(b, "X-Client-Cert-Subject: ", 23);
        sl_buf_append(b, p->subject, strlen(p->subject));
        sl_buf_append(b, "\r\nX-Client-Cert-SAN: ", 21);
        sl_buf_append(b, p->sans, strlen(p->sans));
        sl_buf_append(b, "\r\nX-Client-Cert-SHA256: ", 24);
        sl_buf_append(b, p->sha256_hex, strlen(p->sha256_hex));
        sl_buf_append(b, "\r\n", 2);
    }
    if (host_value.len) {
        sl_buf_append(b, "X-Forwarded-Host: ", 18);
        sl_buf_append(b, host_value.ptr, host_value.len);
        sl_buf_append(b, "\r\n", 2);
    }
    sl_buf_append(b, "X-Request-Id: ", 14);
    sl_buf_append(b, x->r.m_reqid.ptr, x->r.m_reqid.len);
    sl_buf_append(b, "\r\n", 2);
    if (sl_unlikely(x->r.trace_state == SL_TRACE_OWN)) {
        char tp[55];
        sl_request_traceparent(&x->r, tp);
        sl_buf_append_field(b, "traceparent", 11, tp, sizeof(tp));
    }
    /* Via names the protocol the request was received in (RFC 9110 7.6.3):
     * "2" for HTTP/2, whatever the upstream hop speaks. */
    if (x->r.gen->add_via) {
        if (req->version == 20)
            sl_buf_append(b, "Via: 2 sluice\r\n", 15);
        else
            sl_buf_append(b, req->version == 10 ? "Via: 1.0 sluice\r\n" : "Via: 1.1 sluice\r\n",
                          17);
    }
    if (body == SL_HTTP1_BODY_LENGTH) {
        char cl_line[48];
        int n = snprintf(cl_line, sizeof(cl_line), "Content-Length: %llu\r\n",
                         (unsigned long long)content_length);
        sl_buf_append(b, cl_line, (size_t)n);
    } else if (body == SL_HTTP1_BODY_CHUNKED) {
        sl_buf_append(b, "Transfer-Encoding: chunked\r\n", 28);
    }
    if (upgrade.len && x->ws_key[0]) {
        sl_buf_append(b, "Sec-WebSocket-Key: ", 19);
        sl_buf_append(b, x->ws_key, SL_WEBSOCKET_KEY_LEN);
        sl_buf_append(b, "\r\nSec-WebSocket-Version: 13\r\n", 29);
    }
    if (upgrade.len) {
        sl_buf_append(b, "Upgrade: ", 9);
        sl_buf_append(b, upgrade.ptr, upgrade.len);
        sl_buf_append(b, "\r\nConnection: upgrade\r\n\r\n", 25);
    } else if (req->version == 10) {
        sl_buf_append(b, "Connection: keep-alive\r\n\r\n", 26);
    } else {
        sl_buf_append(b, "\r\n", 2);
    }
    return SL_OK;
}

int sl_exchange_set_body_length(sl_exchange_t *x, uint64_t len)
{
    /* The head ends with its empty line: the length goes before it. */
    x->uout.end -= 2;
    char line[48];
    int n = snprintf(line, sizeof(line), "Content-Length: %llu\r\n\r\n", (unsigned long long)len);
    return sl_buf_append(&x->uout, line, (size_t)n) == 0 ? SL_OK : SL_ERROR;
}

/* ---- tunnels (exchange.h) ------------------------------------------------- */

int sl_exchange_route_tunnels(const sl_gen_route_t *route, sl_str_t token)
{
    const char *slash = memchr(token.ptr, '/', token.len);
    size_t name_len = slash ? (size_t)(slash - token.ptr) : token.len;
    const Sluice__V1__Route *pb = route->pb;
    if (name_len == 0)
        return 0;
    for (size_t i = 0; i < pb->n_upgrades; i++)
        if (strlen(pb->upgrades[i]) == name_len &&
            strncasecmp(pb->upgrades[i], token.ptr, name_len) == 0)
            return 1;
    return 0;
}

int sl_exchange_tunnel_check(sl_exchange_t *x, const sl_http1_response_t *resp)
{
    const sl_header_t *u = sl_http1_find_header(resp->headers, resp->num_headers, "upgrade", 7);
    /* The origin may only switch to a protocol the route allows. */
    if (!u || !x->r.route || !sl_exchange_route_tunnels(x->r.route, u->value))
        return SL_ERROR;
    if (x->ws_key[0]) {
        const sl_header_t *a =
            sl_http1_find_header(resp->headers, resp->num_headers, "sec-websocket-accept", 20);
        if (!a ||
            !sl_websocket_accept_ok(x->ws_key, SL_WEBSOCKET_KEY_LEN, a->value.ptr, a->value.len))
            return SL_ERROR;
    }
    return SL_OK;
}

uint32_t sl_exchange_tunnel_opened(sl_exchange_t *x, int status)
{
    uint32_t idle_ms = x->r.route->pb->tunnel_idle_ms ? x->r.route->pb->tunnel_idle_ms : 3600000u;
    sl_request_note_outcome(&x->r, 1);
    x->r.status = status;
    sl_request_log(&x->r);
    sl_request_reset(&x->r); /* the pool counters and the generation hold */
    x->phase = SL_XP_NONE;
    sl_worker_buf_put(x->r.w, &x->uin);
    sl_worker_buf_put(x->r.w, &x->uout);
    return idle_ms;
}

/* ---- life ------------------------------------------------------------------ */

void sl_exchange_reset(sl_exchange_t *x)
{
    x->phase = SL_XP_NONE;
    sl_worker_buf_put(x->r.w, &x->uout);
    sl_worker_buf_put(x->r.w, &x->uin);
    x->uout_sent = 0;
    x->req_body_done = 0;
    x->expect_continue = 0;
    x->upgrade = 0;
    x->upgrade_required = 0;
    x->ws_key[0] = '\0';
    x->dechunk = 0;
    x->resp_body = SL_HTTP1_BODY_NONE;
    x->resp_remaining = 0;
    x->resp_head_sent = 0;
    x->interim_sent = 0;
    x->resp_done = 0;
    x->up_reusable = 0;
    x->up_paused = 0;
    x->up_h2 = 0;
    x->h2_status_seen = 0;
    x->h2_status = 0;
    x->h2 = NULL;
    x->h2_stream = 0;
    x->h2_next = NULL;
    sl_worker_buf_put(x->r.w, &x->trailers);
}

/* Gives the upstream connection back (to its pool when reusable). */
static void put_upconn(sl_exchange_t *x, int reusable)
{
    if (x->h2)
        sl_h2up_detach(x); /* the connection stays for its other streams */
    sl_request_leave_pool(&x->r);
    sl_upconn_t *up = x->up;
    if (!up)
        return;
    x->up = NULL;
    if (reusable && x->r.cluster)
        sl_upstream_release(x->r.w, up, x->r.cluster->pool_max_idle,
                            x->r.cluster->pool_idle_timeout_ms);
    else
        sl_upstream_close(x->r.w, up);
}

void sl_exchange_finish(sl_exchange_t *x, int ok)
{
    if (sl_unlikely(x->r.cache))
        sl_cache_request_end(&x->r);
    /*
     * A connection whose FIN (or error) was already seen goes no further: with
     * edge-triggered events, the idle watcher would never hear of it again.
     * Neither does one that may hold unread bytes or a FIN whose edge we
     * consumed: unless the last read proved the socket empty (a short read,
     * the common case), it is peeked once here (nginx checks its keep-alive
     * connections the same way when it frees them).
     */
    if (x->up)
        put_upconn(x, ok && x->up_reusable && x->req_body_done && x->resp_done && !x->up_rdhup &&
                          (x->up_drained || sl_upstream_idle_usable(x->up)));
    else
        put_upconn(x, 0); /* HTTP/2: detach the stream, if any */
}

static void attach_upconn(sl_exchange_t *x, sl_upconn_t *up)
{
    x->up = up;
    up->owner = x;
    up->requests++;
    x->up_read_ready = 0;
    x->up_rdhup = 0;
    x->up_drained = 0;
    x->up_want_write = 0;
    x->up_paused = 0;
}

/* Another attempt after a failure that the retry policy allows. */
static void retry_attempt(sl_exchange_t *x)
{
    sl_request_count_retry(&x->r);
    x->uout_sent = 0;
    start_attempt(x);
    if (alive(x))
        sl_request_retry_started(&x->r);
}

/* An attempt failed: counted as `counted` (a connect timeout is counted
 * apart), then handled as `kind`. */
static void upstream_failed_as(sl_exchange_t *x, enum sl_upstream_error counted,
                               enum sl_upstream_error kind, int status)
{
    sl_request_count_error(&x->r, counted);
    /* A pooled connection that still failed before any response byte: the
     * origin closed it meanwhile. */
    if (kind == SL_UPSTREAM_ERR_RESET && x->up && x->up->requests > 1 && !x->resp_head_sent)
        sl_request_count_reuse_failure(&x->r);
    sl_request_note_outcome(&x->r, 0);
    if (x->up || x->h2)
        put_upconn(x, 0);
    if (sl_request_retry_allowed(&x->r, kind, status, x->resp_head_sent)) {
        retry_attempt(x);
        return;
    }
    switch (kind) {
    case SL_UPSTREAM_ERR_CONNECT:
        x->ops->error(x, 502, "upstream_connect_failed", "could not connect to the backend", 0);
        return;
    case SL_UPSTREAM_ERR_TIMEOUT:
        x->ops->error(x, 504, "upstream_timeout", "the backend did not answer in time", 0);
        return;
    case SL_UPSTREAM_ERR_RESET:
        x->ops->error(x, 502, "upstream_reset", "the backend closed the connection", 0);
        return;
    default:
        x->ops->error(x, 502, "bad_upstream_response", "the backend sent an invalid response", 0);
        return;
    }
}

static void upstream_failed(sl_exchange_t *x, enum sl_upstream_error kind, int status)
{
    upstream_failed_as(x, kind, kind, status);
}

/* The response broke after its head went to the client. */
static void abort_response(sl_exchange_t *x, const char *code, enum sl_upstream_error kind)
{
    x->r.error_code = code;
    sl_request_count_error(&x->r, kind);
    sl_request_note_outcome(&x->r, 0);
    if (x->up || x->h2)
        put_upconn(x, 0);
    x->ops->abort(x, code);
}

void sl_exchange_failed(sl_exchange_t *x, enum sl_upstream_error kind, int status)
{
    upstream_failed(x, kind, status);
}

void sl_exchange_cut(sl_exchange_t *x, const char *code, enum sl_upstream_error kind)
{
    abort_response(x, code, kind);
}

void sl_exchange_drive(sl_exchange_t *x)
{
    for (;;) {
        uint64_t before = x->r.bytes_received;
        size_t sent_before = x->uout_sent;
        if (!x->req_body_done && x->ops->pump_body)
            x->ops->pump_body(x);
        if (!alive(x))
            return;
        if (x->up_h2) {
            if (x->h2_stream)
                sl_h2up_resume_send(x); /* DATA from uout, as the windows allow */
        } else if (x->up && x->phase != SL_XP_CONNECTING && !x->up_want_write) {
            if (up_send(x) != 0)
                return;
        }
        if (!alive(x))
            return;
        if (x->req_body_done && (x->up_want_write || !x->up || x->phase == SL_XP_CONNECTING ||
                                 x->uout_sent == sl_buf_len(&x->uout)))
            return;
        if (x->r.bytes_received == before && x->uout_sent == sent_before)
            return;
    }
}

static void start_attempt(sl_exchange_t *x)
{
    sl_request_error_t err;
    if (sl_request_pick_endpoint(&x->r, &err) != SL_OK) {
        x->ops->error(x, err.status, err.code, err.message, err.close);
        return;
    }
    if (x->expect_continue) {
        /* We are ready for the body now; the upstream never sees Expect. */
        x->expect_continue = 0;
        if (x->ops->send_continue) {
            x->ops->send_continue(x);
            if (!alive(x))
                return;
        }
    }
    if (x->up_h2) {
        sl_h2up_start(x);
        return;
    }
    /* A request that is not retried if its connection turns out dead is only
     * sent on one that is checked at hand-over (a peek: a system call, so
     * idempotent requests, which a failure on reuse retries, skip it). */
    sl_upconn_t *up = sl_upstream_take_idle(x->r.pool, !sl_request_retried_on_reset(&x->r));
    if (up) {
        attach_upconn(x, up);
        x->phase = SL_XP_WAIT_HEAD;
        x->ops->arm_timer(x, x->r.route->timeouts.response_ms);
        sl_exchange_drive(x);
        return;
    }
    if (sl_unlikely(x->r.cluster->cb_any) && sl_request_cb_connect(&x->r, &err) != SL_OK) {
        x->ops->error(x, err.status, err.code, err.message, err.close);
        return;
    }
    up = sl_upstream_connect(x->r.w, x->r.pool, x->r.cluster->tls, x->r.cluster->tls_name);
    if (!up) {
        upstream_failed(x, SL_UPSTREAM_ERR_CONNECT, 0);
        return;
    }
    attach_upconn(x, up);
    x->phase = SL_XP_CONNECTING;
    x->ops->arm_timer(x, x->r.route->timeouts.connect_ms ? x->r.route->timeouts.connect_ms
                                                         : x->r.cluster->connect_timeout_ms);
    /* The connection's first writable edge tells us it is established. */
}

void sl_exchange_start(sl_exchange_t *x)
{
    if (sl_unlikely(x->r.pol) && x->r.pol->v.cache && sl_cache_start(x) == SL_DONE)
        return;
    if (sl_unlikely(x->r.fault_delay_ms)) {
        x->phase = SL_XP_FAULT_DELAY;
        x->ops->arm_timer(x, x->r.fault_delay_ms);
        return;
    }
    start_attempt(x);
}

void sl_exchange_upstream(sl_exchange_t *x)
{
    start_attempt(x);
}

/* The response is whole: the cache may store it, then the codec ends it. */
static void complete(sl_exchange_t *x)
{
    if (sl_unlikely(x->r.cache))
        sl_cache_capture_end(x);
    x->ops->complete(x);
}

void sl_exchange_complete(sl_exchange_t *x)
{
    complete(x);
}

/* Writes pending uout bytes. Returns -1 when the request failed over (the
 * caller must not touch the upstream state any more). */
static int up_send(sl_exchange_t *x)
{
    sl_upconn_t *up = x->up;
    for (;;) {
        size_t pending = sl_buf_len(&x->uout) - x->uout_sent;
        if (pending == 0)
            break;
        ssize_t n = sl_upstream_write(up, sl_buf_head(&x->uout) + x->uout_sent, pending);
        if (n > 0) {
            x->uout_sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            x->up_want_write = 1;
            return 0;
        }
        /* A reused connection the upstream closed meanwhile, or a reset. */
        upstream_failed(x, SL_UPSTREAM_ERR_RESET, 0);
        return -1;
    }
    x->up_want_write = 0;
    if (x->req_body_done && x->phase == SL_XP_WAIT_HEAD && !x->resp_head_sent)
        x->ops->arm_timer(x, x->r.route->timeouts.response_ms);
    return 0;
}

void sl_exchange_upstream_event(sl_exchange_t *x, short what)
{
    x->ops->enter(x);
    sl_upconn_t *up = x->up;
    if (what & EV_CLOSED)
        x->up_rdhup = 1;
    if (what & (EV_READ | EV_CLOSED))
        x->up_read_ready = 1;
    if (x->phase == SL_XP_NONE) {
        /* Not ours to drive: an upgraded connection relays by itself. */
        if (x->ops->tunnel_event)
            x->ops->tunnel_event(x);
        goto out;
    }
    /* TLS may need the other direction's edge (net/tls.h). */
    if ((what & EV_WRITE) && up->tls_read_wants_write)
        x->up_read_ready = 1;
    if ((what & (EV_READ | EV_CLOSED)) && up->tls_write_wants_read && x->up_want_write)
        what |= EV_WRITE;
    if (x->phase == SL_XP_CONNECTING && (what & (EV_WRITE | EV_READ))) {
        if (!up->connected) {
            int err = 0;
            socklen_t len = sizeof(err);
            if (getsockopt(up->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
                upstream_failed(x, SL_UPSTREAM_ERR_CONNECT, 0);
                goto out;
            }
            up->connected = 1;
        }
        /* TLS: the handshake is part of connecting; a failure (the
         * certificate does not verify, no shared protocol) is a connect
         * failure: no request byte was sent, so even a POST may retry. */
        int hs = sl_upstream_handshake(up);
        if (hs == SL_AGAIN)
            goto out;
        if (hs != SL_OK) {
            sl_log_warn("backend %s endpoint %s: TLS handshake failed (check the Backend's "
                        "tls.caBundle/caFile and sni against the endpoint's certificate)",
                        x->r.cluster->pb->name, x->r.upstream_addr);
            upstream_failed(x, SL_UPSTREAM_ERR_CONNECT, 0);
            goto out;
        }
        if (sl_unlikely(x->r.cb_held))
            sl_request_cb_connected(&x->r);
        x->phase = SL_XP_WAIT_HEAD;
        x->ops->arm_timer(x, x->r.route->timeouts.response_ms);
        sl_exchange_drive(x);
    } else if ((what & EV_WRITE) && x->up_want_write) {
        x->up_want_write = 0;
        sl_exchange_drive(x);
    }
    if (!alive(x) || x->up != up || !up)
        goto out;
    if (x->up_read_ready && !x->up_paused) {
        if (x->phase == SL_XP_WAIT_HEAD)
            read_response_head(x);
        else if (x->phase == SL_XP_BODY)
            read_response_body(x);
    }
out:
    x->ops->leave(x);
}

void sl_exchange_resume(sl_exchange_t *x)
{
    if (sl_unlikely(x->r.cache) && sl_cache_resume(x))
        return;
    if (x->h2 && x->up_paused) {
        sl_h2up_resume_recv(x);
        return;
    }
    if (x->phase == SL_XP_BODY && x->up_paused && x->up) {
        x->up_paused = 0;
        x->ops->arm_timer(x, x->r.route->timeouts.response_ms);
        read_response_body(x);
    }
}

void sl_exchange_timeout(sl_exchange_t *x, int client_blocked)
{
    switch (x->phase) {
    case SL_XP_CONNECTING:
        upstream_failed_as(x, SL_UPSTREAM_ERR_CONNECT_TIMEOUT, SL_UPSTREAM_ERR_CONNECT, 0);
        return;
    case SL_XP_WAIT_HEAD:
        upstream_failed(x, SL_UPSTREAM_ERR_TIMEOUT, 0);
        return;
    case SL_XP_CACHE_WAIT:
        sl_cache_wait_timeout(x); /* coalesceTimeout: go upstream alone */
        return;
    case SL_XP_FAULT_DELAY:
        x->phase = SL_XP_NONE;
        x->r.fault_delay_ms = 0;
        start_attempt(x);
        return;
    case SL_XP_BODY:
    default:
        if (client_blocked) {
            x->r.error_code = "client_write_timeout";
        } else {
            x->r.error_code = "upstream_read_timeout";
            sl_request_count_error(&x->r, SL_UPSTREAM_ERR_TIMEOUT);
        }
        if (x->up)
            put_upconn(x, 0);
        x->ops->abort(x, x->r.error_code);
        return;
    }
}

/* ---- the response ---------------------------------------------------------- */

static int response_is_keepalive(const sl_http1_response_t *resp)
{
    return (resp->flags & SL_HTTP1_F_KEEP_ALIVE) != 0 && resp->body != SL_HTTP1_BODY_CLOSE;
}

/*
 * The trailer field lines the chunked decoder kept in x->trailers
 * ("Name: value\r\n"...) become fields ("name\0value\0"..., the form
 * sl_exchange_trailers reads and an HTTP/2 upstream's trailers take), in
 * place: names lower-cased, OWS trimmed, and fields an HTTP/2 message must
 * not carry (connection-specific, RFC 9113 8.2.2) or that frame the body
 * dropped. Fields that did not fit are all dropped: a partial set could
 * mislead (a checksum without the field it covers).
 */
static void trailer_lines_to_fields(sl_exchange_t *x)
{
    sl_buf_t *b = &x->trailers;
    if (x->resp_chunk.trailer_len > x->resp_chunk.trailer_cap) {
        b->start = b->end = 0;
        return;
    }
    char *p = b->data;
    size_t len = x->resp_chunk.trailer_len, in = 0, out = 0;
    while (in < len) {
        char *line = p + in;
        char *lf = memchr(line, '\n', len - in);
        size_t llen = lf ? (size_t)(lf - line) + 1 : len - in;
        in += llen;
        size_t end = llen;
        while (end && (line[end - 1] == '\n' || line[end - 1] == '\r'))
            end--;
        char *colon = memchr(line, ':', end);
        if (!colon)
            continue;
        size_t nlen = (size_t)(colon - line), v = nlen + 1, vend = end;
        while (v < vend && (line[v] == ' ' || line[v] == '\t'))
            v++;
        while (vend > v && (line[vend - 1] == ' ' || line[vend - 1] == '\t'))
            vend--;
        sl_header_t h = {{line, nlen}, {line + v, vend - v}};
        const sl_conn_opts_t no_conn_opts = {0};
        if (sl_http_is_hop_by_hop(&h, &no_conn_opts) || name_is(&h, "content-length", 14) ||
            name_is(&h, "host", 4) || name_is(&h, "trailer", 7))
            continue;
        /* out <= line - p: every field written so far is shorter than its line. */
        for (size_t i = 0; i < nlen; i++)
            p[out + i] = (char)tolower((unsigned char)line[i]);
        p[out + nlen] = '\0';
        memmove(p + out + nlen + 1, line + v, vend - v);
        out += nlen + 1 + (vend - v);
        p[out++] = '\0';
    }
    b->start = 0;
    b->end = out;
}

/* Accounts n new body bytes at `p`; returns how many belong to the body
 * (the rest would be bytes past the response), or -1 on bad framing. *keep
 * is how many bytes at p go to the client: fewer than the body bytes when
 * chunked framing is stripped (a client that takes payload only). */
static ssize_t account_response_body(sl_exchange_t *x, char *p, size_t n, size_t *keep)
{
    switch (x->resp_body) {
    case SL_HTTP1_BODY_LENGTH:
        if (n > x->resp_remaining)
            n = (size_t)x->resp_remaining;
        x->resp_remaining -= n;
        if (x->resp_remaining == 0)
            x->resp_done = 1;
        *keep = n;
        return (ssize_t)n;
    case SL_HTTP1_BODY_CHUNKED: {
        int done = 0;
        ssize_t used;
        if (x->dechunk) {
            used = sl_http1_chunked_decode(&x->resp_chunk, p, n, keep, &done);
        } else {
            used = sl_http1_chunked_scan(&x->resp_chunk, p, n, &done);
            *keep = used > 0 ? (size_t)used : 0;
        }
        if (used < 0)
            return -1;
        if (done) {
            x->resp_done = 1;
            if (x->resp_chunk.trailer_out)
                trailer_lines_to_fields(x);
        }
        return used;
    }
    case SL_HTTP1_BODY_CLOSE:
        *keep = n;
        return (ssize_t)n;
    default:
        x->resp_done = 1;
        *keep = 0;
        return 0;
    }
}

/* The response body bytes the client gets still carry chunk framing. */
static inline int resp_framed(const sl_exchange_t *x)
{
    return x->resp_body == SL_HTTP1_BODY_CHUNKED && !x->dechunk;
}

static void read_response_head(sl_exchange_t *x)
{
    sl_upconn_t *up = x->up;
    if (!x->uin.data && sl_worker_buf_get(x->r.w, &x->uin) != 0) {
        x->ops->error(x, 503, "overloaded", "out of memory", 1);
        return;
    }
    for (;;) {
        if (sl_buf_space(&x->uin) == 0) {
            sl_buf_compact(&x->uin);
            if (sl_buf_space(&x->uin) == 0) {
                if (x->uin.cap >= MAX_RESPONSE_HEAD ||
                    sl_buf_reserve(&x->uin, MAX_RESPONSE_HEAD) != 0) {
                    upstream_failed(x, SL_UPSTREAM_ERR_BAD_RESPONSE, 0);
                    return;
                }
            }
        }
        size_t space = sl_buf_space(&x->uin);
        ssize_t n = sl_upstream_read(up, sl_buf_tail(&x->uin), space);
        if (n > 0) {
            x->uin.end += (size_t)n;
            /* Over TLS a short read proves nothing: OpenSSL may hold more. */
            x->up_drained = (size_t)n < space && !up->ssl;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            x->up_read_ready = 0;
            x->up_drained = 1;
            return;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            /* Closed or reset before a complete head. */
            upstream_failed(x, SL_UPSTREAM_ERR_RESET, 0);
            return;
        }
    parse:;
        sl_http1_header_t rh[128];
        sl_http1_response_t resp;
        memset(&resp, 0, sizeof(resp));
        resp.headers = rh;
        resp.num_headers = SL_ARRAY_LEN(rh);
        ssize_t r = sl_http1_parse_response(sl_buf_head(&x->uin), sl_buf_len(&x->uin),
                                            x->r.method_bit, MAX_RESPONSE_HEAD, &resp);
        if (r == SL_AGAIN)
            continue;
        if (r < 0) {
            upstream_failed(x, SL_UPSTREAM_ERR_BAD_RESPONSE, 0);
            return;
        }
        if (resp.status >= 100 && resp.status < 200) {
            if (resp.status == 101) {
                if (x->upgrade && x->ops->upgraded &&
                    x->ops->upgraded(x, &resp, (size_t)r) == SL_OK)
                    return;
                /* 101 to a request that did not ask for it, or to another
                 * protocol than the route allows: never relayed. */
                upstream_failed(x, SL_UPSTREAM_ERR_BAD_RESPONSE, 0);
                return;
            }
            /* Interim responses other than 100 (103 Early Hints, ...) go to
             * the client ahead of the final one (RFC 9110 15.2), except to
             * a client that must never get one (HTTP/1.0). 100 Continue is
             * ours to send: the gateway answered Expect itself. */
            if (resp.status != 100 && x->interim_ok) {
                if (x->ops->head(x, &resp, 1) != SL_OK) {
                    upstream_failed(x, SL_UPSTREAM_ERR_BAD_RESPONSE, 0);
                    return;
                }
                x->interim_sent = 1;
                sl_buf_consume(&x->uin, (size_t)r);
                if (x->ops->body_flush(x) < 0)
                    return;
                if (sl_buf_len(&x->uin))
                    goto parse;
                continue;
            }
            sl_buf_consume(&x->uin, (size_t)r); /* interim response: skip */
            if (sl_buf_len(&x->uin))
                goto parse;
            continue;
        }
        if (x->upgrade_required && resp.status >= 200 && resp.status < 300) {
            /* Its client would take this for an open tunnel. */
            upstream_failed(x, SL_UPSTREAM_ERR_BAD_RESPONSE, 0);
            return;
        }
        if (resp.status >= 500 && sl_request_retry_allowed(&x->r, SL_UPSTREAM_ERR__COUNT,
                                                           resp.status, x->resp_head_sent)) {
            sl_request_note_response(&x->r, resp.status, resp.headers, resp.num_headers);
            sl_buf_consume(&x->uin, sl_buf_len(&x->uin));
            sl_request_note_outcome(&x->r, 0);
            put_upconn(x, 0);
            retry_attempt(x);
            return;
        }
        sl_request_note_outcome(&x->r, resp.status < 500);
        sl_request_note_response(&x->r, resp.status, resp.headers, resp.num_headers);
        x->r.status = resp.status;
        sl_request_upstream_head(&x->r, resp.headers, resp.num_headers);
        x->resp_body = resp.body;
        x->resp_remaining = resp.content_length;
        x->up_reusable = response_is_keepalive(&resp);
        if (resp.body == SL_HTTP1_BODY_CHUNKED) {
            sl_http1_chunked_init(&x->resp_chunk);
            /* An HTTP/2 client gets the trailer fields as trailing HEADERS
             * (trailer_lines_to_fields); an HTTP/1.0 one cannot take them. */
            if (x->dechunk && x->r.version == 20 && sl_worker_buf_get(x->r.w, &x->trailers) == 0) {
                x->trailers.start = x->trailers.end = 0;
                x->resp_chunk.trailer_out = x->trailers.data;
                x->resp_chunk.trailer_cap = (uint32_t)x->trailers.cap;
            }
        } else {
            x->dechunk = 0; /* nothing to strip */
        }
        if (resp.body == SL_HTTP1_BODY_NONE ||
            (resp.body == SL_HTTP1_BODY_LENGTH && resp.content_length == 0))
            x->resp_done = 1;
        if (sl_unlikely(x->r.cache))
            sl_cache_capture_head(x, &resp);
        if (x->ops->head(x, &resp, 0) != SL_OK) {
            abort_response(x, "out_of_memory", SL_UPSTREAM_ERR_RESET);
            return;
        }
        sl_buf_consume(&x->uin, (size_t)r);
        x->resp_head_sent = 1;
        x->phase = SL_XP_BODY;
        /* Body bytes that came with the head. */
        size_t extra = sl_buf_len(&x->uin);
        if (extra && !x->resp_done) {
            size_t keep = 0;
            ssize_t used = account_response_body(x, sl_buf_head(&x->uin), extra, &keep);
            if (used < 0) {
                abort_response(x, "bad_upstream_response", SL_UPSTREAM_ERR_BAD_RESPONSE);
                return;
            }
            sl_buf_append(x->ops->body_buf(x), sl_buf_head(&x->uin), keep);
            if (sl_unlikely(x->r.cache))
                sl_cache_capture_body(x, sl_buf_head(&x->uin), keep);
            sl_request_body_seen(&x->r, 1, sl_buf_head(&x->uin), keep, resp_framed(x));
            if ((size_t)used < extra)
                x->up_reusable = 0; /* bytes past the response: never reuse */
        } else if (extra) {
            x->up_reusable = 0;
        }
        sl_worker_buf_put(x->r.w, &x->uin);
        if (x->resp_done) {
            complete(x);
        } else {
            /* Go on with the body (it also writes the head out). */
            x->ops->arm_timer(x, x->r.route->timeouts.response_ms);
            read_response_body(x);
        }
        return;
    }
}

/*
 * Streams the response body: read from the upstream into the codec's
 * buffer, let the codec write it, repeat. A loop rather than callbacks
 * calling each other, so a body of any size never deepens the stack. Stops
 * when the client is full (the codec resumes us with sl_exchange_resume) or
 * the upstream has nothing more for now (its read edge resumes us).
 */
static void read_response_body(sl_exchange_t *x)
{
    for (;;) {
        sl_upconn_t *up = x->up;
        sl_buf_t *out = x->ops->body_buf(x);
        while (!x->resp_done) {
            if (sl_buf_space(out) < READ_LOW_WATER) {
                sl_buf_compact(out);
                if (sl_buf_space(out) < READ_LOW_WATER)
                    break; /* write first */
            }
            if (!x->up_read_ready)
                break;
            /* Not capped at the bytes the body still needs: a short read then
             * proves the socket empty (up_drained), and bytes past the body
             * are a broken upstream whose connection is not reused anyway. */
            size_t want = sl_buf_space(out);
            ssize_t n = sl_upstream_read(up, sl_buf_tail(out), want);
            if (n > 0) {
                x->up_drained = (size_t)n < want && !up->ssl;
                size_t keep = 0;
                ssize_t used = account_response_body(x, sl_buf_tail(out), (size_t)n, &keep);
                /* Short read and nothing more expected: skip the EAGAIN read
                 * (a RST that came with the data gets no edge of its own, so
                 * only when nothing more is expected). */
                if ((size_t)n < want && x->resp_done && !x->up_rdhup)
                    x->up_read_ready = 0;
                if (used < 0) {
                    abort_response(x, "bad_upstream_response", SL_UPSTREAM_ERR_BAD_RESPONSE);
                    return;
                }
                if (sl_unlikely(x->r.cache))
                    sl_cache_capture_body(x, sl_buf_tail(out), keep);
                sl_request_body_seen(&x->r, 1, sl_buf_tail(out), keep, resp_framed(x));
                out->end += keep;
                if (used < n)
                    x->up_reusable = 0;
                /* Write as we go: keeps latency low and the buffer small. */
                if (sl_buf_len(out) >= SL_WORKER_BLOCK_SIZE / 2)
                    break;
                continue;
            }
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                x->up_read_ready = 0;
                x->up_drained = 1;
                break;
            }
            if (n < 0 && errno == EINTR)
                continue;
            if (x->resp_body == SL_HTTP1_BODY_CLOSE && n == 0) {
                x->resp_done = 1;
                x->up_reusable = 0;
                break;
            }
            /* Upstream died mid-body: the client sees a truncated response. */
            if (x->ops->body_flush(x) < 0)
                return;
            abort_response(x, "upstream_reset_mid_body", SL_UPSTREAM_ERR_RESET);
            return;
        }
        if (x->resp_done) {
            complete(x); /* completes the request once written */
            return;
        }
        int w = x->ops->body_flush(x);
        if (w < 0)
            return;
        if (w == 0) {
            x->up_paused = 1; /* resumed by sl_exchange_resume */
            return;
        }
        if (!x->up_read_ready) {
            x->ops->arm_timer(x, x->r.route->timeouts.response_ms);
            return; /* resumed by the upstream's read edge */
        }
    }
}
