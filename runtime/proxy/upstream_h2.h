/*
 * HTTP/2 to upstreams (Backend `protocol: h2` over TLS with ALPN h2, or
 * `h2c` with prior knowledge): per worker and endpoint, a few multiplexed
 * connections (nghttp2 client sessions) that carry the exchanges of many
 * requests at once, as streams. The exchange (exchange.h) builds its
 * request head as for HTTP/1.1; this file turns it into HTTP/2 fields
 * (pseudo-headers from the request line and Host, connection-specific fields
 * dropped, `te: trailers` added for gRPC), sends the body bytes the codec put
 * in uout as DATA, and hands the response head, body and trailers back
 * through the exchange's ops, with flow control: the upstream's window
 * is only credited as the client takes the bytes, so a slow client holds
 * the upstream stream, not the gateway's memory.
 *
 * Connections: opened on demand (sl_upstream_connect: TCP, then TLS with
 * ALPN h2), shared by streams up to the peer's SETTINGS_MAX_CONCURRENT_STREAMS,
 * never given new streams after a GOAWAY, closed when idle past the pool's
 * idle timeout (sl_upstream_sweep) or broken. A stream reset by the upstream
 * before its response head is an upstream reset (retried like one); after
 * it, the client's response is cut.
 *
 * Worker-thread only. Not here: HTTP/1.1 upstreams (exchange.c), endpoint
 * choice (upstream.c), the client side (proxy.c, proxy_h2.c).
 */
#ifndef SL_UPSTREAM_H2_H
#define SL_UPSTREAM_H2_H

#include "exchange.h"

struct sl_h2up;

/* Starts the exchange's attempt on an HTTP/2 connection of its pool (the
 * endpoint is chosen; uout holds the head and maybe body bytes). Failures
 * go through the exchange's own failure path. */
void sl_h2up_start(sl_exchange_t *x);

/* More body bytes are in uout (or the body ended): send them. */
void sl_h2up_resume_send(sl_exchange_t *x);

/* The client took bytes: move more of the response to it. */
void sl_h2up_resume_recv(sl_exchange_t *x);

/* The exchange no longer wants its stream (done, failed, client gone): the
 * stream is reset if still open; the connection stays for others. */
void sl_h2up_detach(sl_exchange_t *x);

/* Readiness on the connection's socket (upstream.c dispatches it here). */
void sl_h2up_event(struct sl_h2up *h, short what);

/* Idle timeout and shutdown of the pool's HTTP/2 connections. */
void sl_h2up_sweep(struct sl_pool *pool, uint64_t now_ms, uint32_t idle_timeout_ms);
void sl_h2up_close_all(struct sl_pool *pool);

#endif
