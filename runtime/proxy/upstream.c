/*
 * Per-worker upstream pools and endpoint selection (upstream.h).
 *
 * Idle keep-alive connections are watched for readability: an idle
 * connection that becomes readable was closed by the upstream (or sent
 * garbage) and is dropped at once, so a request is rarely handed a dead
 * connection. Idle timeouts are enforced by a once-a-second sweep instead of
 * a timer per connection, which keeps the request path free of timer-heap
 * operations for pooled connections.
 */
#include "upstream.h"

#include "log.h"
#include "metrics.h"
#include "tls.h"
#include "tls_client.h"
#include "upstream_h2.h"
#include "exchange.h"

#include <errno.h>
#include <event2/event.h>
#include <event2/event_struct.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static size_t ptr_hash(const void *p, size_t cap)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x & (cap - 1);
}

static int pools_grow(sl_worker_t *w)
{
    size_t ncap = w->pools_cap ? w->pools_cap * 2 : 64;
    sl_pool_t **np = calloc(ncap, sizeof(*np));
    if (!np)
        return -1;
    for (size_t i = 0; i < w->pools_cap; i++) {
        sl_pool_t *p = w->pools[i];
        if (!p)
            continue;
        size_t j = ptr_hash(p->ep, ncap);
        while (np[j])
            j = (j + 1) & (ncap - 1);
        np[j] = p;
    }
    free(w->pools);
    w->pools = np;
    w->pools_cap = ncap;
    return 0;
}

sl_pool_t *sl_upstream_pool(sl_worker_t *w, sl_endpoint_state_t *ep)
{
    if (w->pools_cap) {
        size_t i = ptr_hash(ep, w->pools_cap);
        while (w->pools[i]) {
            if (w->pools[i]->ep == ep)
                return w->pools[i];
            i = (i + 1) & (w->pools_cap - 1);
        }
    }
    if ((w->pools_used + 1) * 2 > w->pools_cap && pools_grow(w) != 0)
        return NULL;
    sl_pool_t *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    /* The caller's generation holds a reference, so the count is >= 1 and a
     * plain increment is safe; released through the registry. */
    atomic_fetch_add(&ep->refs, 1);
    p->ep = ep;
    size_t i = ptr_hash(ep, w->pools_cap);
    while (w->pools[i])
        i = (i + 1) & (w->pools_cap - 1);
    w->pools[i] = p;
    w->pools_used++;
    return p;
}

/* Removes pool slot i and re-inserts the rest of its probe run. */
static void pools_remove_at(sl_worker_t *w, size_t i)
{
    w->pools[i] = NULL;
    w->pools_used--;
    size_t j = (i + 1) & (w->pools_cap - 1);
    while (w->pools[j]) {
        sl_pool_t *p = w->pools[j];
        w->pools[j] = NULL;
        size_t k = ptr_hash(p->ep, w->pools_cap);
        while (w->pools[k])
            k = (k + 1) & (w->pools_cap - 1);
        w->pools[k] = p;
        j = (j + 1) & (w->pools_cap - 1);
    }
}

int sl_upstream_pick(sl_worker_t *w, sl_gen_cluster_t *c, uint64_t hash, int exclude, int *why)
{
    size_t n = c->num_endpoints;
    if (n == 0) {
        *why = SL_UPSTREAM_ERR_NO_HEALTHY;
        return -1;
    }
    uint8_t usable_buf[256];
    uint32_t active_buf[256];
    uint8_t *usable = n <= 256 ? usable_buf : malloc(n);
    uint32_t *active = n <= 256 ? active_buf : malloc(n * sizeof(uint32_t));
    int idx = -1;
    if (!usable || !active) {
        *why = SL_UPSTREAM_ERR_NO_HEALTHY;
        goto out;
    }
    uint64_t now = sl_endpoint_now_ms();
    size_t healthy = 0, ejected = 0, pool_full = 0, ok = 0;
    for (size_t i = 0; i < n; i++) {
        sl_endpoint_state_t *ep = c->endpoints[i];
        int hc = atomic_load_explicit(&ep->hc_healthy, memory_order_relaxed);
        int ej = atomic_load_explicit(&ep->ejected_until_ms, memory_order_relaxed) > now;
        healthy += hc != 0;
        ejected += hc && ej;
        usable[i] = (uint8_t)(hc && !ej && (int)i != exclude);
        active[i] = 0;
    }
    /* Panic rule for passive ejection: never eject more than
     * max_ejection_percent of the healthy endpoints; past that, ejected ones
     * take traffic again rather than overloading the rest or failing. */
    if (healthy && ejected * 100 > (size_t)c->max_ejection_percent * healthy) {
        for (size_t i = 0; i < n; i++) {
            int hc = atomic_load_explicit(&c->endpoints[i]->hc_healthy, memory_order_relaxed);
            usable[i] = (uint8_t)(hc && (int)i != exclude);
        }
    }
    /* Pool limits and least-request counts come from this worker's pools. */
    for (size_t i = 0; i < n; i++) {
        if (!usable[i])
            continue;
        if (c->pool_max_connections ||
            c->pb->lb_policy == SLUICE__V1__CLUSTER__LB_POLICY__LEAST_REQUEST) {
            sl_pool_t *p = sl_upstream_pool(w, c->endpoints[i]);
            if (p) {
                active[i] = p->active_requests;
                if (c->pool_max_connections && p->num_idle == 0 &&
                    p->num_busy >= c->pool_max_connections) {
                    usable[i] = 0;
                    pool_full++;
                    continue;
                }
            }
        }
        ok++;
    }
    if (ok == 0) {
        *why = pool_full ? SL_UPSTREAM_ERR_POOL_FULL : SL_UPSTREAM_ERR_NO_HEALTHY;
        goto out;
    }
    switch (c->pb->lb_policy) {
    case SLUICE__V1__CLUSTER__LB_POLICY__LEAST_REQUEST:
        idx = sl_lb_p2c_pick(&w->rng, c->weights, active, usable, n);
        break;
    case SLUICE__V1__CLUSTER__LB_POLICY__RANDOM:
        idx = sl_lb_random_pick(&w->rng, c->weights, usable, n);
        break;
    case SLUICE__V1__CLUSTER__LB_POLICY__CONSISTENT_HASH:
        idx = c->ring ? sl_lb_ring_pick(c->ring, hash, usable) : -1;
        break;
    case SLUICE__V1__CLUSTER__LB_POLICY__ROUND_ROBIN:
    default:
        idx = sl_lb_swrr_pick(c->swrr_current + (size_t)w->id * n, c->weights, usable, n);
        break;
    }
    if (idx < 0)
        *why = SL_UPSTREAM_ERR_NO_HEALTHY;
out:
    if (usable != usable_buf)
        free(usable);
    if (active != active_buf)
        free(active);
    return idx;
}

static int idle_tls_usable(const sl_upconn_t *uc);

static void upconn_event_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    sl_upconn_t *uc = arg;
    if (uc->h2) {
        sl_h2up_event(uc->h2, what);
        return;
    }
    if (uc->owner) {
        sl_exchange_upstream_event(uc->owner, what);
        return;
    }
    /* Readable while idle: EOF from the upstream (its keep-alive timeout) or
     * unsolicited bytes; either way the connection is done. Writable edges
     * of an idle connection mean nothing. */
    if ((what & (EV_READ | EV_CLOSED)) && !(uc->ssl && idle_tls_usable(uc)))
        sl_upstream_close(sl_worker_self, uc);
}

static void idle_unlink(sl_upconn_t *uc)
{
    sl_pool_t *p = uc->pool;
    if (uc->idle_prev)
        uc->idle_prev->idle_next = uc->idle_next;
    else
        p->idle = uc->idle_next;
    if (uc->idle_next)
        uc->idle_next->idle_prev = uc->idle_prev;
    uc->idle_next = uc->idle_prev = NULL;
    p->num_idle--;
}

/*
 * Over TLS, bytes on an idle connection may be the server's own records
 * (TLS 1.3 session tickets, sent after the handshake): only a read through
 * OpenSSL tells them from data or a close_notify. A byte of data still
 * means the connection is unusable (and it is closed: losing it is fine).
 */
static int idle_tls_usable(const sl_upconn_t *uc)
{
    char byte;
    int want = 0;
    ssize_t n = sl_tls_read(uc->ssl, &byte, 1, &want);
    return n < 0 && errno == EAGAIN && want == SL_TLS_WANT_READ;
}

int sl_upstream_idle_usable(const sl_upconn_t *uc)
{
    if (uc->ssl)
        return idle_tls_usable(uc);
    char byte;
    ssize_t n = recv(uc->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR)
        n = recv(uc->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/*
 * The connection's event fired in the loop's current batch and its callback
 * has not run yet (the batch is being processed): the socket has news, EOF
 * or bytes, that the idle watcher would act on next. Free to ask: libevent
 * keeps it in the event itself (event_struct.h, stable through 2.1).
 */
static int event_fired(const struct event *ev)
{
    return (ev->ev_evcallback.evcb_flags & (EVLIST_ACTIVE | EVLIST_ACTIVE_LATER)) != 0 &&
           (ev->ev_res & (EV_READ | EV_CLOSED)) != 0;
}

sl_upconn_t *sl_upstream_take_idle(sl_pool_t *pool, int check)
{
    sl_upconn_t *uc;
    while ((uc = pool->idle) != NULL) {
        idle_unlink(uc);
        pool->num_busy++;
        int dead = event_fired(uc->ev);
        /* The system call only where an origin's idle close is likely: a
         * connection that has sat in the pool for a while. One reused at
         * once (under load, every one) was watched until just now. */
        if (!dead && check && sl_endpoint_now_ms() - uc->idle_since_ms >= SL_POOL_PEEK_AFTER_MS)
            dead = !sl_upstream_idle_usable(uc);
        if (!dead)
            return uc;
        sl_upstream_close(sl_worker_self, uc); /* EOF, error or stray bytes */
    }
    return NULL;
}

ssize_t sl_upstream_read(sl_upconn_t *uc, void *buf, size_t n)
{
    return sl_io_read(uc->fd, uc->ssl, buf, n, &uc->tls_read_wants_write);
}

ssize_t sl_upstream_write(sl_upconn_t *uc, const void *buf, size_t n)
{
    return sl_io_write(uc->fd, uc->ssl, buf, n, &uc->tls_write_wants_read);
}

int sl_upstream_handshake(sl_upconn_t *uc)
{
    if (!uc->ssl || uc->handshaken)
        return SL_OK;
    int want = 0;
    int rc = sl_tls_handshake(uc->ssl, &want);
    if (rc == SL_OK)
        uc->handshaken = 1;
    return rc;
}

static void tls_free(sl_upconn_t *uc)
{
    if (uc->ssl) {
        int want;
        sl_tls_shutdown(uc->ssl, &want);
        SSL_free(uc->ssl);
        uc->ssl = NULL;
    }
}

sl_upconn_t *sl_upstream_connect(sl_worker_t *w, sl_pool_t *pool, struct ssl_ctx_st *tls,
                                 const char *tls_name)
{
    sl_endpoint_state_t *ep = pool->ep;
    int fd = socket(ep->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return NULL;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, (const struct sockaddr *)&ep->addr, ep->addr_len) != 0 &&
        errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        errno = e;
        return NULL;
    }
    sl_upconn_t *uc = calloc(1, sizeof(*uc));
    if (!uc)
        goto fail;
    uc->ev = event_new(w->base, fd, EV_READ | EV_WRITE | EV_CLOSED | EV_ET | EV_PERSIST,
                       upconn_event_cb, uc);
    if (!uc->ev || event_add(uc->ev, NULL) != 0)
        goto fail;
    uc->fd = fd;
    uc->pool = pool;
    if (tls) {
        uc->ssl = sl_tls_client_ssl_new(tls, fd, tls_name ? tls_name : ep->address);
        if (!uc->ssl) {
            event_free(uc->ev);
            free(uc);
            close(fd);
            errno = ENOMEM;
            return NULL;
        }
    }
    pool->num_busy++;
    uc->worker = w->id;
    if (uc->worker < ep->nslots)
        SL_STAT_ADD(ep->upconns[uc->worker], 1);
    return uc;
fail:
    if (uc) {
        if (uc->ev)
            event_free(uc->ev);
        free(uc);
    }
    close(fd);
    errno = ENOMEM;
    return NULL;
}

/* Closes the socket and frees the connection; counted out of the
 * endpoint's open connections (on the worker that opened it, the only one
 * that ever holds it). */
static void upconn_free(sl_upconn_t *uc)
{
    sl_endpoint_state_t *ep = uc->pool->ep;
    if (uc->worker < ep->nslots)
        SL_STAT_ADD(ep->upconns[uc->worker], -1);
    event_free(uc->ev);
    tls_free(uc);
    close(uc->fd);
    free(uc);
}

void sl_upstream_close(sl_worker_t *w, sl_upconn_t *uc)
{
    (void)w;
    sl_pool_t *p = uc->pool;
    if (uc->owner == NULL && (uc->idle_prev || p->idle == uc))
        idle_unlink(uc);
    else if (p->num_busy)
        p->num_busy--;
    upconn_free(uc);
}

void sl_upstream_release(sl_worker_t *w, sl_upconn_t *uc, uint32_t max_idle,
                         uint32_t idle_timeout_ms)
{
    sl_pool_t *p = uc->pool;
    if (p->num_idle >= max_idle || w->draining) {
        uc->owner = NULL;
        if (p->num_busy)
            p->num_busy--;
        upconn_free(uc);
        return;
    }
    p->num_busy--;
    uc->owner = NULL;
    uc->idle_since_ms = sl_endpoint_now_ms();
    uc->idle_timeout_ms = idle_timeout_ms;
    uc->idle_prev = NULL;
    uc->idle_next = p->idle;
    if (p->idle)
        p->idle->idle_prev = uc;
    p->idle = uc;
    p->num_idle++;
}

void sl_upstream_sweep(sl_worker_t *w, uint64_t now_ms)
{
    for (size_t i = 0; i < w->pools_cap; i++) {
        sl_pool_t *p = w->pools[i];
        if (!p)
            continue;
        sl_upconn_t *uc = p->idle;
        uint32_t idle_ms = 60000;
        while (uc) {
            sl_upconn_t *next = uc->idle_next;
            idle_ms = uc->idle_timeout_ms;
            if (now_ms - uc->idle_since_ms >= uc->idle_timeout_ms)
                sl_upstream_close(w, uc);
            uc = next;
        }
        if (p->h2)
            sl_h2up_sweep(p, now_ms, idle_ms);
    }
    /* Drop empty pools: they only pin endpoint states of old configs. A pool
     * still in use is recreated on the next request anyway. */
    for (size_t i = 0; i < w->pools_cap;) {
        sl_pool_t *p = w->pools[i];
        if (p && p->num_idle == 0 && p->num_busy == 0 && p->active_requests == 0 &&
            p->retries_active == 0) {
            pools_remove_at(w, i);
            sl_endpoint_release(p->ep);
            free(p);
            continue; /* slot i may hold a moved pool now */
        }
        i++;
    }
}

void sl_upstream_shutdown(sl_worker_t *w)
{
    for (size_t i = 0; i < w->pools_cap; i++) {
        sl_pool_t *p = w->pools[i];
        if (!p)
            continue;
        sl_h2up_close_all(p);
        while (p->idle)
            sl_upstream_close(w, p->idle);
        sl_endpoint_release(p->ep);
        free(p);
        w->pools[i] = NULL;
    }
    free(w->pools);
    w->pools = NULL;
    w->pools_cap = w->pools_used = 0;
}
