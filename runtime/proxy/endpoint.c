/*
 * Registry of shared upstream endpoint state (endpoint.h).
 *
 * Responsible for: one sl_endpoint_state_t per (cluster, address, port),
 * created on first acquire (address resolved once), refcounted so that
 * consecutive config generations that keep an endpoint share its health,
 * ejection and counters; the monotonic clock used for ejection deadlines;
 * passive outlier detection (consecutive failures -> ejection with back-off).
 *
 * Not responsible for: deciding who is healthy by probing (health.c writes
 * hc_healthy), the cluster-wide max_ejection_percent (upstream.c knows the
 * whole cluster and decides whether to honour an ejection), or re-resolving
 * DNS names (an address is resolved when its state is created; a changed
 * record is picked up when the endpoint leaves every generation and comes
 * back, e.g. after a config change).
 *
 * Threading: the registry (hash table + refcounts) is guarded by one mutex
 * and only touched while generations are built or freed (main thread,
 * call_rcu helper thread) and when admin walks it for /metrics and
 * /clusters. The state fields are atomics written by the
 * health checker and by any worker, lock-free on the request path.
 *
 * Bounds: cluster names up to 1024 bytes, addresses up to 255 (a DNS name is
 * at most 253), table load factor 1 with doubling; growth failure only makes
 * chains longer.
 */
#include "endpoint.h"

#include "metrics.h"

#include "log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SL_ENDPOINT_MAX_CLUSTER_LEN 1024
#define SL_ENDPOINT_MAX_ADDRESS_LEN 255
#define SL_ENDPOINT_MIN_BUCKETS 64
/* Envoy's default base ejection time; 0 in the config means "default". */
#define SL_ENDPOINT_DEFAULT_BASE_EJECTION_MS 30000
#define SL_ENDPOINT_MAX_EJECTION_MS 300000

static struct {
    pthread_mutex_t lock;
    sl_endpoint_state_t **buckets;
    size_t n_buckets; /* 0 until the first acquire; a power of two */
    size_t count;
} registry = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Guards every state's hc_last_failure: a string cannot be one atomic.
 * Taken once per failed check and per endpoint on a /clusters request;
 * may be taken inside registry.lock, never the other way round. */
static pthread_mutex_t reason_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t key_hash(const char *cluster, const char *address, uint16_t port)
{
    /* FNV-1a over cluster NUL address NUL port: the NULs keep ("ab","c")
     * and ("a","bc") apart. */
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (const char *p = cluster;; p++) {
        h = (h ^ (unsigned char)*p) * UINT64_C(0x100000001b3);
        if (*p == '\0')
            break;
    }
    for (const char *p = address;; p++) {
        h = (h ^ (unsigned char)*p) * UINT64_C(0x100000001b3);
        if (*p == '\0')
            break;
    }
    h = (h ^ (port & 0xff)) * UINT64_C(0x100000001b3);
    h = (h ^ (port >> 8)) * UINT64_C(0x100000001b3);
    return h ^ (h >> 32);
}

/* Caller holds registry.lock. */
static sl_endpoint_state_t *registry_find(uint64_t hash, const char *cluster, const char *address,
                                          uint16_t port)
{
    if (registry.n_buckets == 0)
        return NULL;
    for (sl_endpoint_state_t *ep = registry.buckets[hash & (registry.n_buckets - 1)]; ep != NULL;
         ep = ep->next) {
        if (ep->port == port && strcmp(ep->address, address) == 0 &&
            strcmp(ep->cluster, cluster) == 0)
            return ep;
    }
    return NULL;
}

/* Caller holds registry.lock. Returns -1 only when the table has no bucket
 * at all and none can be allocated. */
static int registry_insert(sl_endpoint_state_t *ep, uint64_t hash)
{
    if (registry.count >= registry.n_buckets) {
        size_t n = registry.n_buckets == 0 ? SL_ENDPOINT_MIN_BUCKETS : registry.n_buckets * 2;
        sl_endpoint_state_t **b = calloc(n, sizeof(*b));
        if (b != NULL) {
            for (size_t i = 0; i < registry.n_buckets; i++) {
                sl_endpoint_state_t *e = registry.buckets[i];
                while (e != NULL) {
                    sl_endpoint_state_t *next = e->next;
                    size_t slot = key_hash(e->cluster, e->address, e->port) & (n - 1);
                    e->next = b[slot];
                    b[slot] = e;
                    e = next;
                }
            }
            free(registry.buckets);
            registry.buckets = b;
            registry.n_buckets = n;
        } else if (registry.n_buckets == 0) {
            return -1;
        }
    }
    size_t slot = hash & (registry.n_buckets - 1);
    ep->next = registry.buckets[slot];
    registry.buckets[slot] = ep;
    registry.count++;
    return 0;
}

/* Caller holds registry.lock. */
static void registry_remove(sl_endpoint_state_t *ep)
{
    uint64_t hash = key_hash(ep->cluster, ep->address, ep->port);
    sl_endpoint_state_t **link = &registry.buckets[hash & (registry.n_buckets - 1)];
    while (*link != NULL && *link != ep)
        link = &(*link)->next;
    if (*link == ep) {
        *link = ep->next;
        registry.count--;
    }
    if (registry.count == 0) {
        /* Give the memory back when the last endpoint goes (tests, and a
         * runtime whose config lost every cluster). */
        free(registry.buckets);
        registry.buckets = NULL;
        registry.n_buckets = 0;
    }
}

/* "host:port", or "[v6]:port" for an IPv6 literal, for messages. */
static void format_hostport(char *buf, size_t len, const char *address, uint16_t port)
{
    if (strchr(address, ':') != NULL && address[0] != '[')
        snprintf(buf, len, "[%s]:%u", address, (unsigned)port);
    else
        snprintf(buf, len, "%s:%u", address, (unsigned)port);
}

/*
 * Resolves address (IPv4/IPv6 literal, "[v6]", or a host name) into *ss.
 * Literals never touch the resolver. Host names use the first IPv4/IPv6
 * answer in getaddrinfo's (RFC 6724) order. Blocking: main thread only.
 */
static int resolve(const char *cluster, const char *address, uint16_t port,
                   struct sockaddr_storage *ss, socklen_t *ss_len, char *err, size_t errlen)
{
    char host[SL_ENDPOINT_MAX_ADDRESS_LEN + 1];
    size_t alen = strlen(address);
    if (alen >= 2 && address[0] == '[' && address[alen - 1] == ']') {
        memcpy(host, address + 1, alen - 2);
        host[alen - 2] = '\0';
    } else {
        memcpy(host, address, alen + 1);
    }
    char service[8];
    snprintf(service, sizeof(service), "%u", (unsigned)port);

    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc == EAI_NONAME) {
        hints.ai_flags = AI_NUMERICSERV;
        rc = getaddrinfo(host, service, &hints, &res);
    }
    if (rc != 0) {
        char hp[SL_ENDPOINT_MAX_ADDRESS_LEN + 16];
        format_hostport(hp, sizeof(hp), address, port);
        const char *why = rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc);
        snprintf(err, errlen, "backend %s endpoint %s: name does not resolve (%s)", cluster, hp,
                 why);
        return -1;
    }
    int found = 0;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        if ((ai->ai_family == AF_INET || ai->ai_family == AF_INET6) &&
            ai->ai_addrlen <= sizeof(*ss)) {
            memset(ss, 0, sizeof(*ss));
            memcpy(ss, ai->ai_addr, ai->ai_addrlen);
            *ss_len = ai->ai_addrlen;
            found = 1;
            break;
        }
    }
    freeaddrinfo(res);
    if (!found) {
        char hp[SL_ENDPOINT_MAX_ADDRESS_LEN + 16];
        format_hostport(hp, sizeof(hp), address, port);
        snprintf(err, errlen,
                 "backend %s endpoint %s: name does not resolve (no IPv4 or IPv6 address)", cluster,
                 hp);
        return -1;
    }
    return 0;
}

/*
 * On success the caller owns one reference, given back with
 * sl_endpoint_release. On failure NULL, err holds a message naming the
 * backend and the endpoint, nothing is kept.
 */
sl_endpoint_state_t *sl_endpoint_acquire(const char *cluster, const char *address, uint16_t port,
                                         char *err, size_t errlen)
{
    char dummy[1];
    if (err == NULL || errlen == 0) {
        err = dummy;
        errlen = sizeof(dummy);
    }
    err[0] = '\0';
    if (cluster == NULL || address == NULL) {
        snprintf(err, errlen, "endpoint: missing cluster or address");
        return NULL;
    }
    if (strlen(cluster) > SL_ENDPOINT_MAX_CLUSTER_LEN) {
        snprintf(err, errlen, "backend name longer than %d bytes", SL_ENDPOINT_MAX_CLUSTER_LEN);
        return NULL;
    }
    if (address[0] == '\0' || strlen(address) > SL_ENDPOINT_MAX_ADDRESS_LEN) {
        snprintf(err, errlen,
                 "backend %s endpoint: address must be 1 to %d bytes (an IP address or a host "
                 "name)",
                 cluster, SL_ENDPOINT_MAX_ADDRESS_LEN);
        return NULL;
    }
    if (port == 0) {
        snprintf(err, errlen, "backend %s endpoint %s: port 0 is not valid (use 1-65535)", cluster,
                 address);
        return NULL;
    }

    uint64_t hash = key_hash(cluster, address, port);
    pthread_mutex_lock(&registry.lock);
    sl_endpoint_state_t *ep = registry_find(hash, cluster, address, port);
    if (ep != NULL) {
        atomic_fetch_add(&ep->refs, 1);
        pthread_mutex_unlock(&registry.lock);
        return ep;
    }
    pthread_mutex_unlock(&registry.lock);

    /* Resolve without the lock: a slow DNS answer must not stall whoever
     * frees an old generation meanwhile. */
    unsigned nslots = sl_metrics_nworkers();
    sl_endpoint_state_t *fresh = calloc(1, sizeof(*fresh) + nslots * sizeof(fresh->upconns[0]));
    if (fresh == NULL)
        goto fail_alloc;
    fresh->nslots = nslots;
    fresh->cluster = strdup(cluster);
    fresh->address = strdup(address);
    if (fresh->cluster == NULL || fresh->address == NULL)
        goto fail_alloc;
    fresh->port = port;
    snprintf(fresh->label, sizeof(fresh->label), "%s:%u", address, (unsigned)port);
    if (resolve(cluster, address, port, &fresh->addr, &fresh->addr_len, err, errlen) != 0)
        goto fail;
    atomic_init(&fresh->hc_healthy, 1);
    atomic_init(&fresh->ejected_until_ms, 0);
    atomic_init(&fresh->consecutive_failures, 0);
    atomic_init(&fresh->ejections, 0);
    atomic_init(&fresh->hc_checked, 0);
    atomic_init(&fresh->hc_consecutive_successes, 0);
    atomic_init(&fresh->hc_consecutive_failures, 0);
    atomic_init(&fresh->hc_checks_succeeded, 0);
    atomic_init(&fresh->hc_checks_failed, 0);
    atomic_init(&fresh->refs, 1);

    pthread_mutex_lock(&registry.lock);
    ep = registry_find(hash, cluster, address, port);
    if (ep != NULL) {
        /* Someone created it while we resolved: theirs wins. */
        atomic_fetch_add(&ep->refs, 1);
        pthread_mutex_unlock(&registry.lock);
        free(fresh->cluster);
        free(fresh->address);
        free(fresh);
        return ep;
    }
    if (registry_insert(fresh, hash) != 0) {
        pthread_mutex_unlock(&registry.lock);
        goto fail_alloc;
    }
    pthread_mutex_unlock(&registry.lock);
    return fresh;

fail_alloc:
    snprintf(err, errlen, "backend %s endpoint %s: out of memory", cluster, address);
fail:
    if (fresh != NULL) {
        free(fresh->cluster);
        free(fresh->address);
        free(fresh);
    }
    return NULL;
}

void sl_endpoint_release(sl_endpoint_state_t *ep)
{
    if (ep == NULL)
        return;
    pthread_mutex_lock(&registry.lock);
    unsigned refs = atomic_load(&ep->refs);
    if (refs == 0) {
        /* A double release: keep running (the state stays valid, it was not
         * freed), but say it loudly, the caller has a bug. */
        pthread_mutex_unlock(&registry.lock);
        sl_log_alert("endpoint %s/%s:%u released more often than acquired", ep->cluster,
                     ep->address, (unsigned)ep->port);
        return;
    }
    /* Under the lock, so no acquire can find it between the last decrement
     * and the unlink. */
    if (atomic_fetch_sub(&ep->refs, 1) == 1) {
        registry_remove(ep);
        pthread_mutex_unlock(&registry.lock);
        free(ep->cluster);
        free(ep->address);
        free(ep);
        return;
    }
    pthread_mutex_unlock(&registry.lock);
}

void sl_endpoint_set_hc_failure(sl_endpoint_state_t *ep, const char *reason)
{
    pthread_mutex_lock(&reason_lock);
    snprintf(ep->hc_last_failure, sizeof(ep->hc_last_failure), "%s", reason ? reason : "");
    pthread_mutex_unlock(&reason_lock);
}

void sl_endpoint_hc_failure(sl_endpoint_state_t *ep, char *buf, size_t len)
{
    if (len == 0)
        return;
    pthread_mutex_lock(&reason_lock);
    snprintf(buf, len, "%s", ep->hc_last_failure);
    pthread_mutex_unlock(&reason_lock);
}

void sl_endpoint_format(const sl_endpoint_state_t *ep, char *buf, size_t len)
{
    format_hostport(buf, len, ep->address, ep->port);
}

void sl_endpoint_foreach(void (*fn)(sl_endpoint_state_t *ep, void *arg), void *arg)
{
    pthread_mutex_lock(&registry.lock);
    for (size_t i = 0; i < registry.n_buckets; i++)
        for (sl_endpoint_state_t *ep = registry.buckets[i]; ep != NULL; ep = ep->next)
            fn(ep, arg);
    pthread_mutex_unlock(&registry.lock);
}

uint64_t sl_endpoint_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/*
 * Lock-free, called by any worker. Exactly one concurrent reporter wins an
 * ejection: the deadline moves from a past value to a future one by
 * compare-exchange, so everyone else sees either a failed exchange or an
 * endpoint already ejected. Failures reported while ejected (requests that
 * were in flight when it was ejected) do not count toward the next one.
 */
int sl_endpoint_report(sl_endpoint_state_t *ep, int success, uint32_t consecutive_failures,
                       uint32_t base_ejection_ms, uint64_t now_ms)
{
    if (ep == NULL)
        return 0;
    if (success) {
        /* Load first: the common case (already 0) then writes nothing and
         * the cache line stays shared between workers. */
        if (atomic_load_explicit(&ep->consecutive_failures, memory_order_relaxed) != 0)
            atomic_store_explicit(&ep->consecutive_failures, 0, memory_order_relaxed);
        return 0;
    }
    if (consecutive_failures == 0)
        return 0; /* outlier detection off */

    uint64_t until = atomic_load_explicit(&ep->ejected_until_ms, memory_order_acquire);
    if (until > now_ms)
        return 0;
    unsigned n = atomic_fetch_add_explicit(&ep->consecutive_failures, 1, memory_order_relaxed) + 1;
    if (n < consecutive_failures)
        return 0;

    uint64_t base = base_ejection_ms != 0 ? base_ejection_ms : SL_ENDPOINT_DEFAULT_BASE_EJECTION_MS;
    uint64_t times = (uint64_t)atomic_load_explicit(&ep->ejections, memory_order_relaxed) + 1;
    uint64_t duration = base * times; /* < 2^32 * 2^33: no overflow */
    if (duration > SL_ENDPOINT_MAX_EJECTION_MS)
        duration = SL_ENDPOINT_MAX_EJECTION_MS;
    if (!atomic_compare_exchange_strong_explicit(&ep->ejected_until_ms, &until, now_ms + duration,
                                                 memory_order_acq_rel, memory_order_acquire))
        return 0; /* another reporter ejected it (or moved the deadline) first */

    atomic_fetch_add_explicit(&ep->ejections, 1, memory_order_relaxed);
    atomic_store_explicit(&ep->consecutive_failures, 0, memory_order_relaxed);
    return 1;
}
