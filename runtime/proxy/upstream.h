/*
 * Upstream side of the proxy, per worker: endpoint selection (load
 * balancing over usable endpoints, with the panic rule for outlier
 * ejection) and keep-alive connection pools.
 *
 * Pools are keyed by the shared endpoint state (endpoint.h), not by the
 * generation, so a config swap that keeps an endpoint keeps its warm
 * connections. A pool holds a reference on the endpoint state so the key
 * stays valid and unique while the pool exists.
 */
#ifndef SL_UPSTREAM_H
#define SL_UPSTREAM_H

#include "endpoint.h"
#include "generation.h"
#include "worker.h"

struct event;
struct sl_exchange;

typedef struct sl_upconn {
    int fd;
    /* Edge-triggered read+write for the connection's life; events go to the
     * owning request, or close the connection while it is idle. */
    struct event *ev;
    struct sl_pool *pool;
    struct sl_exchange *owner; /* the exchange using it; NULL while idle in the pool */
    struct sl_upconn *idle_next, *idle_prev;
    uint64_t idle_since_ms;
    uint32_t idle_timeout_ms;
    unsigned requests; /* requests started on it; > 0 = reused */
    unsigned worker;   /* the worker that opened it (its slot of ep->upconns) */
    uint8_t connected;
    /* TLS to the upstream (Backend `tls`), else NULL; the handshake runs
     * after the TCP connect and before the first request byte. */
    struct ssl_st *ssl;
    uint8_t handshaken;
    uint8_t tls_read_wants_write, tls_write_wants_read;
    struct sl_h2up *h2; /* an HTTP/2 connection's socket: its events go there */
} sl_upconn_t;

typedef struct sl_pool {
    sl_endpoint_state_t *ep; /* reference held */
    sl_upconn_t *idle;       /* most recently used first */
    uint32_t num_idle;
    uint32_t num_busy;        /* connections owned by a request or connecting */
    uint32_t active_requests; /* for least-request balancing */
    uint32_t retries_active;
    struct sl_h2up *h2; /* HTTP/2 connections (upstream_h2.c) */
} sl_pool_t;

/* The pool of `ep` on worker w, created on first use. NULL on OOM. */
sl_pool_t *sl_upstream_pool(sl_worker_t *w, sl_endpoint_state_t *ep);

/*
 * Picks an endpoint of cluster c for a request on worker w, skipping
 * `exclude` (the endpoint that just failed, -1 for none). hash is used by
 * consistent hashing. Returns the endpoint index, -1 when none is usable
 * (*why set to SL_UPSTREAM_ERR_NO_HEALTHY or SL_UPSTREAM_ERR_POOL_FULL).
 */
int sl_upstream_pick(sl_worker_t *w, sl_gen_cluster_t *c, uint64_t hash, int exclude, int *why);

/*
 * An idle connection of the pool, or NULL. The connection is taken out of
 * the idle list and counted busy. The idle watcher closes connections whose
 * EOF or bytes arrive while they sit in the pool; one whose event fired in
 * the loop's current batch (its callback not run yet) is closed here, for
 * free. With `check` (requests that are not retried when a connection turns
 * out dead), a candidate idle for SL_POOL_PEEK_AFTER_MS or more is also
 * asked (sl_upstream_idle_usable, a system call): an origin's keep-alive
 * timeout closes connections that sat idle, not ones reused at once.
 */
#define SL_POOL_PEEK_AFTER_MS 1000
sl_upconn_t *sl_upstream_take_idle(sl_pool_t *pool, int check);
/* 1 when nothing (no byte, no EOF, no error) is pending on the connection:
 * one non-blocking MSG_PEEK, a system call. */
int sl_upstream_idle_usable(const sl_upconn_t *uc);
/* A new non-blocking connection being established (counted busy), or NULL
 * with errno set. With `tls` (the cluster's client context) the connection
 * will speak TLS, verifying `tls_name` (NULL: the endpoint's address). */
sl_upconn_t *sl_upstream_connect(sl_worker_t *w, sl_pool_t *pool, struct ssl_ctx_st *tls,
                                 const char *tls_name);

/* The connection's I/O, plain or TLS, with read(2)/write(2) results (-1 and
 * errno EAGAIN: wait for the socket's edge; a TLS operation that needs the
 * other direction sets tls_read_wants_write / tls_write_wants_read). */
ssize_t sl_upstream_read(sl_upconn_t *uc, void *buf, size_t n);
ssize_t sl_upstream_write(sl_upconn_t *uc, const void *buf, size_t n);
/* Drives the TLS handshake of a connected socket: SL_OK (done, or no TLS),
 * SL_AGAIN (wait for the socket), SL_ERROR (failed: verification, protocol). */
int sl_upstream_handshake(sl_upconn_t *uc);
/* Returns a healthy keep-alive connection to its pool (or closes it when the
 * pool is full). */
void sl_upstream_release(sl_worker_t *w, sl_upconn_t *uc, uint32_t max_idle,
                         uint32_t idle_timeout_ms);
/* Closes a connection for good. */
void sl_upstream_close(sl_worker_t *w, sl_upconn_t *uc);
/* Periodic sweep: idle timeouts and empty pools of endpoints no longer used. */
void sl_upstream_sweep(sl_worker_t *w, uint64_t now_ms);
/* Closes everything (worker exit). */
void sl_upstream_shutdown(sl_worker_t *w);

#endif
