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

#endif
