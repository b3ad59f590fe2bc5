/*
 * The HTTP/1.1 proxy state machine of one downstream connection: read and
 * parse a request head, route it, forward it to an upstream endpoint with
 * retries, stream both bodies with bounded buffers and backpressure, write
 * the response, then keep the connection alive or close it.
 *
 * Worker-thread only. Not here: parsing rules (http1.c), route lookup
 * (router.c), endpoint choice and pools (upstream.c), listeners (worker.c).
 */
#ifndef SL_PROXY_H
#define SL_PROXY_H

#include "worker.h"

#include <sys/socket.h>

/* Takes ownership of an accepted, non-blocking socket. */
void sl_proxy_accept(sl_listener_sock_t *ls, int fd, const struct sockaddr *addr);

/* Refuses a connection over a connection limit with a 503 and closes it. */
void sl_proxy_refuse(sl_worker_t *w, int fd);

/* Drain: close idle connections now, ask busy ones to close after their
 * current response. */
void sl_proxy_drain(sl_worker_t *w);

/* Closes every connection at once (drain timeout expired). */
void sl_proxy_close_all(sl_worker_t *w);

/*
 * HTTP/2 (proxy_h2.c). sl_proxy_h2_start takes over an accepted socket whose
 * first bytes (`bytes`, n, already read) are the HTTP/2 client preface (h2c
 * with prior knowledge), or a TLS connection whose ALPN chose h2 (`ssl`,
 * with the verified client certificate `peer` or NULL, both handed over);
 * the connection's accounting (worker and listener counts, metrics) moves
 * with it. SL_OK, or SL_ERROR (out of memory: the caller still owns all).
 */
struct ssl_st;
struct sl_tls_peer;
int sl_proxy_h2_start(sl_listener_sock_t *ls, int fd, struct ssl_st *ssl, struct sl_tls_peer *peer,
                      const char *client_ip, const char *bytes, size_t n);
void sl_proxy_h2_drain(sl_worker_t *w);
void sl_proxy_h2_close_all(sl_worker_t *w);

#endif
