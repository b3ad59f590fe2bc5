/*
 * One request's exchange with an upstream over HTTP/1.1, whatever protocol
 * the client speaks: pick an endpoint, take a pooled connection or connect,
 * send the request head and body, read the response head (interim ones
 * too), stream the response body with backpressure, retry what the route's
 * policy allows, report outcomes, and return the connection to its pool
 * when it can carry another request. Envoy's router filter and upstream
 * request are the model; the codec of the client's protocol is on the
 * other side of sl_exchange_ops_t, so this file is written once for
 * HTTP/1.1 and HTTP/2 clients alike.
 *
 * Buffers (bounded, from the worker's block cache):
 *   uout  the request for the upstream: the head (build by the codec with
 *         sl_exchange_build_head) and body bytes, which the codec appends.
 *         It is kept until the response head arrives while it fits, so the
 *         request can be replayed on another endpoint (retries); a body
 *         larger than the buffer streams and is then not retried;
 *   uin   the upstream response head;
 *   the response body is read straight into the codec's buffer
 *         (ops->body_buf): no copy on the HTTP/1.1 path. When that buffer
 *         is full, reading from the upstream stops (backpressure) until the
 *         codec calls sl_exchange_resume.
 *
 * Ownership: the codec embeds the sl_exchange_t in its stream (the HTTP/1.1
 * connection, an HTTP/2 stream) and keeps it alive while any callback of
 * this file runs (ops->enter/leave bracket upstream events). After an op
 * that may end the downstream (error, abort, body_flush < 0, complete),
 * this file checks ops->alive before touching the exchange again.
 *
 * Worker-thread only. Not here: client framing and sockets (the codecs),
 * routing and policy decisions (request.c), endpoint choice and pools
 * (upstream.c).
 */
#ifndef SL_EXCHANGE_H
#define SL_EXCHANGE_H

#include "http1.h"
#include "request.h"
#include "upstream.h"
#include "websocket.h"

enum sl_exchange_phase {
    SL_XP_NONE = 0,
    SL_XP_CONNECTING,
    SL_XP_WAIT_HEAD, /* sending the request and/or waiting for the response head */
    SL_XP_BODY,      /* streaming the response body */
    /* parked until another request's response is cached (cache.h) */
    SL_XP_CACHE_WAIT,
    /* an injected delay (Api/operation faults) before the first attempt */
    SL_XP_FAULT_DELAY,
};

struct sl_exchange;

typedef struct sl_exchange_ops {
    /* Bracket an upstream event: the codec must not free the exchange's
     * memory between them (the downstream may close meanwhile). */
    void (*enter)(struct sl_exchange *x);
    void (*leave)(struct sl_exchange *x);
    /* Whether the downstream still waits for this exchange. */
    int (*alive)(struct sl_exchange *x);
    /* The response head, final or interim (1xx other than 100), parsed
     * from the upstream: the codec writes it in its own form. SL_OK, or
     * SL_ERROR when it cannot (out of memory: the exchange aborts). */
    int (*head)(struct sl_exchange *x, const sl_http1_response_t *resp, int interim);
    /* The buffer response body bytes are read into. */
    sl_buf_t *(*body_buf)(struct sl_exchange *x);
    /* New bytes are in body_buf: write what the client takes. Returns 1
     * when all was written, 0 when the client is full (the codec calls
     * sl_exchange_resume once it drained), -1 when the client is gone (the
     * codec has ended the exchange). */
    int (*body_flush)(struct sl_exchange *x);
    /* The whole response is in body_buf: the codec finishes the request
     * once it is written (and then calls sl_exchange_finish). */
    void (*complete)(struct sl_exchange *x);
    /* The gateway answers itself: no byte of a final response was sent. */
    void (*error)(struct sl_exchange *x, int status, const char *code, const char *message,
                  int close);
    /* The response broke after its head was sent: the codec logs and ends
     * the stream the way its protocol signals a truncated response. */
    void (*abort)(struct sl_exchange *x, const char *code);
    void (*arm_timer)(struct sl_exchange *x, uint32_t ms);
    /* Move request body bytes into uout (called while the request is being
     * sent); NULL when the codec pushes them itself. */
    void (*pump_body)(struct sl_exchange *x);
    /* The endpoint is chosen: tell a client waiting on Expect: 100-continue
     * to send its body. NULL if not needed. */
    void (*send_continue)(struct sl_exchange *x);
    /* A 101 for a request whose upgrade the route allows: the codec turns
     * the connection into a tunnel and returns SL_OK, or SL_ERROR (502). */
    int (*upgraded)(struct sl_exchange *x, const sl_http1_response_t *resp, size_t head_len);
    /* Readiness on the upstream connection of an upgraded (tunnelled)
     * connection, which the codec relays itself. */
    void (*tunnel_event)(struct sl_exchange *x);
} sl_exchange_ops_t;

typedef struct sl_exchange {
    sl_request_t r;
    const sl_exchange_ops_t *ops;
    sl_upconn_t *up;
    enum sl_exchange_phase phase;
    sl_buf_t uout, uin;
    size_t uout_sent;
    uint8_t req_body_done;   /* the codec has put the whole request body in uout */
    uint8_t expect_continue; /* the client waits for 100 Continue */
    uint8_t upgrade;         /* the route tunnels the request's Upgrade token */
    uint8_t interim_ok;      /* the client takes interim (1xx) responses */
    uint8_t dechunk;         /* the client takes payload only: strip chunked framing */
    /* The client takes any 2xx as "tunnel open" (HTTP/2 extended CONNECT):
     * only a 101 may succeed, another 2xx from the origin is a 502. */
    uint8_t upgrade_required;
    /* The Sec-WebSocket-Key the gateway sends the origin in place of the
     * client's (an HTTP/2 client has none), "" when the client's own goes;
     * the 101's Sec-WebSocket-Accept must answer it. */
    char ws_key[SL_WEBSOCKET_KEY_LEN + 1];

    enum sl_http1_body resp_body;
    uint64_t resp_remaining;
    sl_http1_chunked_t resp_chunk;
    uint8_t resp_head_sent;
    uint8_t interim_sent; /* 1xx heads went to the client */
    uint8_t resp_done;
    uint8_t up_reusable;
    uint8_t up_paused; /* backpressure: the client is slower than the upstream */
    uint8_t up_read_ready;
    uint8_t up_rdhup;
    uint8_t up_drained; /* the last upstream read found the socket empty */
    uint8_t up_want_write;

    /* HTTP/2 to the upstream (upstream_h2.h), instead of `up`. uout_sent is
     * then how far DATA has taken uout; uin holds the response's fields,
     * then body bytes waiting for the client; trailers keeps the response
     * trailers ("name\0value\0"...) until the body has gone out. */
    uint8_t up_h2; /* the cluster speaks HTTP/2 */
    uint8_t h2_status_seen;
    int h2_status;
    struct sl_h2up *h2;          /* the connection carrying the stream, or NULL */
    int32_t h2_stream;           /* its stream id, 0 before submission */
    struct sl_exchange *h2_next; /* waiting for the connection to be ready */
    uint8_t h2_wants_body;       /* DATA took uout's bytes: refill it from the client */
    sl_buf_t trailers;
} sl_exchange_t;

/* Clears the per-request state (buffers go back to the worker). */
void sl_exchange_reset(sl_exchange_t *x);

/*
 * Serialises the HTTP/1.1 request head for the upstream into uout, from the
 * protocol-independent head: origin-form target with `path` (routed,
 * normalised, base path stripped), hop-by-hop fields removed, forwarding
 * fields set. `body` is the framing of the body the codec will append;
 * `upgrade` the token to forward (empty for none). SL_ERROR on OOM.
 */
int sl_exchange_build_head(sl_exchange_t *x, const sl_req_head_t *req, sl_str_t path,
                           enum sl_http1_body body, uint64_t content_length, sl_str_t upgrade);

/* A body read whole before it is forwarded (request.h, sl_request_body_cap):
 * its head was built with SL_HTTP1_BODY_NONE and nothing of it sent yet;
 * this gives it `Content-Length: len`, the framing the body then has.
 * SL_ERROR on OOM. */
int sl_exchange_set_body_length(sl_exchange_t *x, uint64_t len);

/* Whether the route tunnels the upgrade `token` ("websocket", or
 * "name/version": the route lists names; case-insensitive). */
int sl_exchange_route_tunnels(const sl_gen_route_t *route, sl_str_t token);

/*
 * Tunnels, whatever the client's protocol (proxy.c for HTTP/1.1 upgrades,
 * proxy_h2.c for HTTP/2 extended CONNECT). When the origin answers 101, the
 * codec's ops->upgraded calls sl_exchange_tunnel_check: SL_OK when the 101
 * switches to a protocol the route tunnels and, if the gateway made the
 * key (ws_key), carries the matching Sec-WebSocket-Accept; else the codec
 * returns SL_ERROR (502). Once the codec has answered its client,
 * sl_exchange_tunnel_opened counts the attempt a success, logs the request
 * with `status` (101 for HTTP/1.1, 200 for HTTP/2), releases the
 * generation and the pool counters (a tunnel holds neither: config swaps
 * never touch it) and returns the route's tunnel idle timeout in ms. The
 * upstream connection stays in x->up, its events reach ops->tunnel_event
 * (phase SL_XP_NONE), and sl_exchange_finish(x, 0) closes it.
 */
int sl_exchange_tunnel_check(sl_exchange_t *x, const sl_http1_response_t *resp);
uint32_t sl_exchange_tunnel_opened(sl_exchange_t *x, int status);

/* Starts the first attempt (the head is in uout, maybe body bytes too),
 * unless the response cache answers or parks the request (cache.h). */
void sl_exchange_start(sl_exchange_t *x);

/* Starts the first attempt: the cache has nothing for x (cache.c). */
void sl_exchange_upstream(sl_exchange_t *x);

/* The whole response is in the codec's buffer (upstream_h2.c): the cache
 * may store it, then ops->complete. */
void sl_exchange_complete(sl_exchange_t *x);

/* Moves the request forward: body bytes into uout (ops->pump_body), uout
 * to the upstream, until neither side makes progress. */
void sl_exchange_drive(sl_exchange_t *x);

/* The client drained what it was given: go on reading the response. */
void sl_exchange_resume(sl_exchange_t *x);

/* A timer of the codec fired for this exchange: connect or response
 * timeout, or (client_blocked) a client that stopped reading. */
void sl_exchange_timeout(sl_exchange_t *x, int client_blocked);

/* Ends the upstream side of a finished or abandoned exchange: the
 * connection goes back to its pool when `ok` and it can carry another
 * request, else it is closed. */
void sl_exchange_finish(sl_exchange_t *x, int ok);

/* Readiness on the upstream connection owned by x (upstream.c). */
void sl_exchange_upstream_event(sl_exchange_t *x, short what);

/* For upstream_h2.c: the failure paths of an attempt (retry when allowed,
 * else the gateway's error) and of a response cut after its head. */
void sl_exchange_failed(sl_exchange_t *x, enum sl_upstream_error kind, int status);
void sl_exchange_cut(sl_exchange_t *x, const char *code, enum sl_upstream_error kind);

/* The response trailers an HTTP/2 upstream sent, as fields (slices into
 * x->trailers); how many, at most cap. */
size_t sl_exchange_trailers(const sl_exchange_t *x, sl_header_t *out, size_t cap);

/* Hop-by-hop rules shared with the codecs (RFC 9110 7.6.1): the options of
 * every Connection line of a message, and whether a field is hop-by-hop. */
#define SL_CONN_TOKENS_INLINE 8
typedef struct {
    /* The options that name fields ("close" and "keep-alive" name none that
     * is not hop-by-hop already, so the usual message has none at all). */
    sl_str_t tok[SL_CONN_TOKENS_INLINE];
    unsigned n;
    const sl_header_t *all; /* set when there are more options than slots */
    size_t num_all;
} sl_conn_opts_t;
void sl_conn_opts_collect(sl_conn_opts_t *co, const sl_header_t *hs, size_t n);
int sl_conn_opts_name(const sl_conn_opts_t *co, const char *name, size_t len);
int sl_http_is_hop_by_hop(const sl_header_t *h, const sl_conn_opts_t *co);
int sl_http_token_in_list(sl_str_t list, const char *tok, size_t toklen);

#endif
