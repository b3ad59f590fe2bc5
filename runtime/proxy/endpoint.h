/*
 * Health of upstream endpoints, shared by every worker and carried across
 * config generations: the state is keyed by (cluster, address, port) and
 * refcounted, so a config swap that keeps an endpoint keeps its health,
 * outlier ejection and counters (DESIGN.md: state survives a swap).
 *
 * Writers: the health checker (main thread) and workers (passive outlier
 * detection); all fields are atomics, no locks on the request path. The
 * registry itself (acquire/release) is mutex-protected and only used while
 * building or freeing a generation.
 */
#ifndef SL_ENDPOINT_H
#define SL_ENDPOINT_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/socket.h>

/* The reason of an endpoint's last failed health check is kept up to this
 * many bytes, NUL included (longer ones are cut). */
#define SL_ENDPOINT_MAX_REASON_LEN 192

typedef struct sl_endpoint_state {
    char *cluster;
    char *address;
    uint16_t port;
    /* "address:port" as requests record it (sl_request_t.upstream_addr,
     * the same size), made once here rather than by snprintf per request. */
    char label[64];
    struct sockaddr_storage addr; /* resolved once at acquire */
    socklen_t addr_len;
    atomic_int hc_healthy;                 /* active checks' verdict; 1 when not checked */
    atomic_uint_fast64_t ejected_until_ms; /* passive ejection, monotonic ms; 0 = not */
    atomic_uint consecutive_failures;
    atomic_uint ejections; /* times ejected, for back-off */
    /* Active health checks: written by health.c (main thread), read by
     * /metrics and /clusters (admin). All 0 while nobody checks it. */
    atomic_int hc_checked; /* 1 while a health check runs for it */
    atomic_uint hc_consecutive_successes;
    atomic_uint hc_consecutive_failures;
    atomic_uint_fast64_t hc_checks_succeeded; /* totals, monotonic while the state lives */
    atomic_uint_fast64_t hc_checks_failed;
    char hc_last_failure[SL_ENDPOINT_MAX_REASON_LEN]; /* private: sl_endpoint_hc_failure */
    atomic_uint refs;                                 /* private */
    struct sl_endpoint_state *next;                   /* private: registry chain */
    /* Open upstream connections (HTTP/1 and HTTP/2, connecting ones
     * included), one counter per worker, each written only by its worker
     * (SL_STAT_ADD) when it opens or closes one; /metrics sums them. */
    unsigned nslots;
    _Atomic int64_t upconns[];
} sl_endpoint_state_t;

/* Returns the shared state of that endpoint, creating it (healthy, not
 * ejected) if new. `address` is an IPv4/IPv6 literal or a host name resolved
 * now (blocking getaddrinfo, main thread only). NULL with err set when the
 * name does not resolve. */
sl_endpoint_state_t *sl_endpoint_acquire(const char *cluster, const char *address, uint16_t port,
                                         char *err, size_t errlen);
void sl_endpoint_release(sl_endpoint_state_t *ep);

/* Records / copies out the reason of the last failed health check ("" =
 * none yet). Any thread; a small lock of its own, never on the request
 * path. */
void sl_endpoint_set_hc_failure(sl_endpoint_state_t *ep, const char *reason);
void sl_endpoint_hc_failure(sl_endpoint_state_t *ep, char *buf, size_t len);

/* "address:port", "[v6]:port" for an IPv6 literal: the endpoint label of
 * metrics and /clusters. */
void sl_endpoint_format(const sl_endpoint_state_t *ep, char *buf, size_t len);

/* Calls fn on every endpoint state alive (those of every generation not yet
 * freed), under the registry lock: fn must not acquire or release
 * endpoints. For /metrics and /clusters. */
void sl_endpoint_foreach(void (*fn)(sl_endpoint_state_t *ep, void *arg), void *arg);

/* Monotonic clock in ms (CLOCK_MONOTONIC). */
uint64_t sl_endpoint_now_ms(void);

/* 1 when the endpoint may receive requests now. */
static inline int sl_endpoint_usable(sl_endpoint_state_t *ep, uint64_t now_ms)
{
    return atomic_load_explicit(&ep->hc_healthy, memory_order_relaxed) &&
           atomic_load_explicit(&ep->ejected_until_ms, memory_order_relaxed) <= now_ms;
}

/* Passive outlier detection: workers report each upstream outcome. After
 * `consecutive_failures` failures in a row (0 = off) the endpoint is ejected
 * for base_ejection_ms * number of ejections so far (capped at 300 s).
 * Returns 1 when this report ejected it. */
int sl_endpoint_report(sl_endpoint_state_t *ep, int success, uint32_t consecutive_failures,
                       uint32_t base_ejection_ms, uint64_t now_ms);

#endif
