/*
 * Active HTTP health checks (health.h), run on the main thread's event_base.
 *
 * Responsible for: one check target per (cluster, address, port) of every
 * cluster that has a health_check; a timer per target; a fresh non-blocking
 * connection per check that sends
 *     GET <path> HTTP/1.1 / Host / User-Agent: sluice-health-check /
 *     Connection: close
 * and judges only the status line; counting consecutive results and flipping
 * the shared endpoint state's hc_healthy (endpoint.h) at the thresholds, with
 * one notice line per flip; following config changes by key so that checks
 * of endpoints that stay keep their counters and schedule.
 *
 * Not responsible for: passive failure detection (workers call
 * sl_endpoint_report), deciding what an unhealthy endpoint means for routing
 * (upstream.c reads hc_healthy through sl_endpoint_usable), validating the
 * Backend resource (common/ does, with field paths; the checks below only
 * refuse what would corrupt the request, so a bad snapshot from elsewhere
 * cannot inject headers).
 *
 * Choices (documented for operators):
 *   - Defaults for fields left 0 match the compiler's: interval 5 s (at least
 *     10 ms), timeout 2 s, healthy_threshold 2, unhealthy_threshold 3,
 *     expected statuses 200-399 (max < min means exactly min).
 *   - A new target is checked first after a random delay in [0, interval],
 *     so a fleet restarting or a big config push does not hit every backend
 *     at the same instant; afterwards one check per interval, counted from
 *     the end of the previous check (checks never overlap).
 *   - timeout_ms bounds the whole check: connect, send and status line.
 *   - Host: the configured host, else the endpoint's address, with ":port"
 *     unless it is 80 (RFC 9110 7.2; bracketed for IPv6 literals).
 *   - Only the status line is read (at most 1 KiB); the rest of the response
 *     is not waited for.
 *   - An endpoint nobody checks is healthy: when a target stops (endpoint or
 *     cluster removed, health_check removed, checker freed) its hc_healthy
 *     goes back to 1.
 *
 * Threading: everything here runs on the event_base's thread (main); the
 * only shared data are the atomics of sl_endpoint_state_t.
 */
#include "health.h"

#include "endpoint.h"
#include "lb.h"
#include "log.h"

#include <errno.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SL_HEALTH_DEFAULT_INTERVAL_MS 5000
#define SL_HEALTH_MIN_INTERVAL_MS 10
#define SL_HEALTH_DEFAULT_TIMEOUT_MS 2000
#define SL_HEALTH_DEFAULT_HEALTHY 2
#define SL_HEALTH_DEFAULT_UNHEALTHY 3
#define SL_HEALTH_DEFAULT_STATUS_MIN 200
#define SL_HEALTH_DEFAULT_STATUS_MAX 399
#define SL_HEALTH_MAX_PATH_LEN 2048
#define SL_HEALTH_MAX_HOST_LEN 255
#define SL_HEALTH_MAX_STATUS_LINE 1024
#define SL_HEALTH_MIN_BUCKETS 64

enum hc_phase { HC_IDLE, HC_CONNECTING, HC_SENDING, HC_READING };

typedef struct hc_target hc_target_t;
struct hc_target {
    sl_health_t *hc;
    hc_target_t *next; /* hash chain */
    uint64_t hash;
    unsigned seen_round;

    sl_endpoint_state_t *ep; /* one reference, owned */
    char *name;              /* "backend X endpoint A:P", for logs */

    /* config, copied from the snapshot */
    char *request;
    size_t request_len;
    uint32_t interval_ms, timeout_ms;
    uint32_t healthy_threshold, unhealthy_threshold;
    uint32_t status_min, status_max;

    struct event *timer; /* next check */

    /* the check in flight */
    enum hc_phase phase;
    int fd;
    struct event *io;
    uint64_t deadline_ms;
    size_t sent;
    size_t resp_len;
    char resp[SL_HEALTH_MAX_STATUS_LINE];

    /* verdict */
    int healthy;
    uint32_t successes, failures; /* consecutive */
};

struct sl_health {
    struct event_base *base;
    hc_target_t **buckets;
    size_t n_buckets; /* power of two, or 0 */
    size_t count;
    unsigned round;
    sl_lb_rng_t rng;
};

/* ---- small helpers ---- */

static uint64_t target_key_hash(const char *cluster, const char *address, uint16_t port)
{
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

static struct timeval ms_to_tv(uint64_t ms)
{
    struct timeval tv = {.tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000) * 1000};
    return tv;
}

/* Visible ASCII only: no space, no control character, nothing that could end
 * the request line or a header early. */
static int is_token_text(const char *s, size_t max_len)
{
    size_t n = 0;
    for (; s[n] != '\0'; n++) {
        unsigned char ch = (unsigned char)s[n];
        if (ch <= 0x20 || ch >= 0x7f || n >= max_len)
            return 0;
    }
    return n > 0;
}

/* The check's request, built once per config. NULL with err set when the
 * path or host cannot be sent as is. */
static char *build_request(const Sluice__V1__HealthCheck *cfg, const char *address, uint16_t port,
                           size_t *len, char *err, size_t errlen)
{
    const char *path = cfg->path != NULL && cfg->path[0] != '\0' ? cfg->path : "/";
    if (path[0] != '/' || !is_token_text(path, SL_HEALTH_MAX_PATH_LEN)) {
        snprintf(err, errlen,
                 "health_check.path must start with '/', be at most %d bytes and contain no "
                 "spaces or control characters",
                 SL_HEALTH_MAX_PATH_LEN);
        return NULL;
    }
    char host[SL_HEALTH_MAX_HOST_LEN + 16];
    if (cfg->host != NULL && cfg->host[0] != '\0') {
        if (!is_token_text(cfg->host, SL_HEALTH_MAX_HOST_LEN)) {
            snprintf(err, errlen,
                     "health_check.host must be at most %d bytes with no spaces or control "
                     "characters",
                     SL_HEALTH_MAX_HOST_LEN);
            return NULL;
        }
        snprintf(host, sizeof(host), "%s", cfg->host);
    } else {
        int v6 = strchr(address, ':') != NULL && address[0] != '[';
        if (port == 80)
            snprintf(host, sizeof(host), v6 ? "[%s]" : "%s", address);
        else
            snprintf(host, sizeof(host), v6 ? "[%s]:%u" : "%s:%u", address, (unsigned)port);
    }
    static const char fmt[] = "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: sluice-health-check\r\n"
                              "Connection: close\r\n\r\n";
    int n = snprintf(NULL, 0, fmt, path, host);
    char *req = n > 0 ? malloc((size_t)n + 1) : NULL;
    if (req == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    snprintf(req, (size_t)n + 1, fmt, path, host);
    *len = (size_t)n;
    return req;
}

/* ---- one check ---- */

static void schedule(hc_target_t *t, uint64_t delay_ms)
{
    struct timeval tv = ms_to_tv(delay_ms);
    event_add(t->timer, &tv);
}

static void close_check(hc_target_t *t)
{
    if (t->io != NULL) {
        event_free(t->io);
        t->io = NULL;
    }
    if (t->fd >= 0) {
        close(t->fd);
        t->fd = -1;
    }
    t->phase = HC_IDLE;
}

/* Ends the check in flight with its verdict and schedules the next one. */
static void finish_check(hc_target_t *t, int ok, const char *reason)
{
    close_check(t);
    if (ok) {
        t->failures = 0;
        if (t->successes < UINT32_MAX)
            t->successes++;
        if (!t->healthy && t->successes >= t->healthy_threshold) {
            t->healthy = 1;
            atomic_store_explicit(&t->ep->hc_healthy, 1, memory_order_relaxed);
            sl_log_notice("%s: healthy (%u check%s passed)", t->name, (unsigned)t->successes,
                          t->successes == 1 ? "" : "s");
        }
    } else {
        t->successes = 0;
        if (t->failures < UINT32_MAX)
            t->failures++;
        if (t->healthy && t->failures >= t->unhealthy_threshold) {
            t->healthy = 0;
            atomic_store_explicit(&t->ep->hc_healthy, 0, memory_order_relaxed);
            sl_log_notice("%s: unhealthy (%s, %u check%s)", t->name, reason, (unsigned)t->failures,
                          t->failures == 1 ? "" : "s");
        } else {
            sl_log_debug("%s: health check failed (%s)", t->name, reason);
        }
    }
    schedule(t, t->interval_ms);
}

static const char *connect_error(int err, char *buf, size_t len)
{
    switch (err) {
    case ECONNREFUSED:
        return "connect refused";
    case ETIMEDOUT:
        return "connect timed out";
    case EHOSTUNREACH:
    case ENETUNREACH:
        return "no route to host";
    default:
        snprintf(buf, len, "connect failed: %s", strerror(err));
        return buf;
    }
}

static void io_cb(evutil_socket_t fd, short what, void *arg);

/* (Re)arms the I/O event for the current phase with what is left of the
 * check's time budget. Returns -1 (after finishing the check) on failure. */
static int arm_io(hc_target_t *t, short events)
{
    if (t->io != NULL) {
        event_free(t->io);
        t->io = NULL;
    }
    uint64_t now = sl_endpoint_now_ms();
    if (now >= t->deadline_ms) {
        finish_check(t, 0, "timeout");
        return -1;
    }
    t->io = event_new(t->hc->base, t->fd, events, io_cb, t);
    struct timeval tv = ms_to_tv(t->deadline_ms - now);
    if (t->io == NULL || event_add(t->io, &tv) != 0) {
        finish_check(t, 0, "out of memory");
        return -1;
    }
    return 0;
}

/* Judges the status line line[0, len), LF excluded: "HTTP/x.y SSS ...". */
static void judge_status_line(hc_target_t *t, const char *line, size_t len)
{
    if (len < 12 || memcmp(line, "HTTP/", 5) != 0 || line[5] < '0' || line[5] > '9' ||
        line[6] != '.' || line[7] < '0' || line[7] > '9' || line[8] != ' ' || line[9] < '0' ||
        line[9] > '9' || line[10] < '0' || line[10] > '9' || line[11] < '0' || line[11] > '9' ||
        (len > 12 && line[12] != ' ' && line[12] != '\r')) {
        finish_check(t, 0, "bad status line");
        return;
    }
    unsigned status = (unsigned)(line[9] - '0') * 100 + (unsigned)(line[10] - '0') * 10 +
                      (unsigned)(line[11] - '0');
    if (status < t->status_min || status > t->status_max) {
        char reason[32];
        snprintf(reason, sizeof(reason), "status %u", status);
        finish_check(t, 0, reason);
        return;
    }
    finish_check(t, 1, NULL);
}

static void on_writable(hc_target_t *t)
{
    char buf[128];
    if (t->phase == HC_CONNECTING) {
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        if (getsockopt(t->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0)
            soerr = errno;
        if (soerr != 0) {
            finish_check(t, 0, connect_error(soerr, buf, sizeof(buf)));
            return;
        }
        t->phase = HC_SENDING;
    }
    while (t->sent < t->request_len) {
        ssize_t n = send(t->fd, t->request + t->sent, t->request_len - t->sent, MSG_NOSIGNAL);
        if (n > 0) {
            t->sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            arm_io(t, EV_WRITE);
            return;
        }
        snprintf(buf, sizeof(buf), "send failed: %s", n < 0 ? strerror(errno) : "no progress");
        finish_check(t, 0, buf);
        return;
    }
    t->phase = HC_READING;
    arm_io(t, EV_READ);
}

static void on_readable(hc_target_t *t)
{
    for (;;) {
        size_t room = sizeof(t->resp) - t->resp_len;
        if (room == 0) {
            finish_check(t, 0, "status line longer than 1024 bytes");
            return;
        }
        ssize_t n = recv(t->fd, t->resp + t->resp_len, room, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            arm_io(t, EV_READ);
            return;
        }
        if (n < 0) {
            char buf[128];
            snprintf(buf, sizeof(buf), "read failed: %s", strerror(errno));
            finish_check(t, 0, buf);
            return;
        }
        if (n == 0) {
            finish_check(t, 0, "connection closed before the status line");
            return;
        }
        size_t old = t->resp_len;
        t->resp_len += (size_t)n;
        const char *lf = memchr(t->resp + old, '\n', (size_t)n);
        if (lf != NULL) {
            judge_status_line(t, t->resp, (size_t)(lf - t->resp));
            return;
        }
    }
}

static void io_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    hc_target_t *t = arg;
    if (what & EV_TIMEOUT) {
        finish_check(t, 0,
                     t->phase == HC_CONNECTING ? "connect timeout"
                     : t->phase == HC_SENDING  ? "timeout sending the request"
                                               : "timeout waiting for the status line");
        return;
    }
    if (t->phase == HC_READING)
        on_readable(t);
    else
        on_writable(t);
}

static void timer_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    hc_target_t *t = arg;
    char buf[128];
    if (t->phase != HC_IDLE)
        return; /* cannot happen: the timer is only armed between checks */

    t->sent = 0;
    t->resp_len = 0;
    t->deadline_ms = sl_endpoint_now_ms() + t->timeout_ms;
    t->fd = socket(t->ep->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (t->fd < 0) {
        /* Out of descriptors is our problem, not the endpoint's; still a
         * failed check, but the reason says so. */
        snprintf(buf, sizeof(buf), "socket: %s", strerror(errno));
        finish_check(t, 0, buf);
        return;
    }
    t->phase = HC_CONNECTING;
    int rc;
    do {
        rc = connect(t->fd, (const struct sockaddr *)&t->ep->addr, t->ep->addr_len);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0 && errno != EINPROGRESS) {
        finish_check(t, 0, connect_error(errno, buf, sizeof(buf)));
        return;
    }
    arm_io(t, EV_WRITE);
}

/* ---- targets and the diff ---- */

static hc_target_t *find_target(sl_health_t *hc, uint64_t hash, const char *cluster,
                                const char *address, uint16_t port)
{
    if (hc->n_buckets == 0)
        return NULL;
    for (hc_target_t *t = hc->buckets[hash & (hc->n_buckets - 1)]; t != NULL; t = t->next) {
        if (t->hash == hash && t->ep->port == port && strcmp(t->ep->address, address) == 0 &&
            strcmp(t->ep->cluster, cluster) == 0)
            return t;
    }
    return NULL;
}

static int insert_target(sl_health_t *hc, hc_target_t *t)
{
    if (hc->count >= hc->n_buckets) {
        size_t n = hc->n_buckets == 0 ? SL_HEALTH_MIN_BUCKETS : hc->n_buckets * 2;
        hc_target_t **b = calloc(n, sizeof(*b));
        if (b != NULL) {
            for (size_t i = 0; i < hc->n_buckets; i++) {
                hc_target_t *e = hc->buckets[i];
                while (e != NULL) {
                    hc_target_t *next = e->next;
                    e->next = b[e->hash & (n - 1)];
                    b[e->hash & (n - 1)] = e;
                    e = next;
                }
            }
            free(hc->buckets);
            hc->buckets = b;
            hc->n_buckets = n;
        } else if (hc->n_buckets == 0) {
            return -1;
        }
    }
    hc_target_t **head = &hc->buckets[t->hash & (hc->n_buckets - 1)];
    t->next = *head;
    *head = t;
    hc->count++;
    return 0;
}

/* Stops and frees t; it must already be unlinked. The endpoint is nobody's
 * to check any more, so it counts as healthy again. */
static void free_target(hc_target_t *t)
{
    close_check(t);
    if (t->timer != NULL)
        event_free(t->timer);
    if (t->ep != NULL) {
        atomic_store_explicit(&t->ep->hc_healthy, 1, memory_order_relaxed);
        sl_endpoint_release(t->ep);
    }
    free(t->request);
    free(t->name);
    free(t);
}

/* Copies the check settings of cfg into t, defaults applied. Takes
 * ownership of request. */
static void apply_config(hc_target_t *t, const Sluice__V1__HealthCheck *cfg, char *request,
                         size_t request_len)
{
    free(t->request);
    t->request = request;
    t->request_len = request_len;
    t->interval_ms = cfg->interval_ms != 0 ? cfg->interval_ms : SL_HEALTH_DEFAULT_INTERVAL_MS;
    if (t->interval_ms < SL_HEALTH_MIN_INTERVAL_MS)
        t->interval_ms = SL_HEALTH_MIN_INTERVAL_MS;
    t->timeout_ms = cfg->timeout_ms != 0 ? cfg->timeout_ms : SL_HEALTH_DEFAULT_TIMEOUT_MS;
    t->healthy_threshold =
        cfg->healthy_threshold != 0 ? cfg->healthy_threshold : SL_HEALTH_DEFAULT_HEALTHY;
    t->unhealthy_threshold =
        cfg->unhealthy_threshold != 0 ? cfg->unhealthy_threshold : SL_HEALTH_DEFAULT_UNHEALTHY;
    if (cfg->expected_status_min == 0 && cfg->expected_status_max == 0) {
        t->status_min = SL_HEALTH_DEFAULT_STATUS_MIN;
        t->status_max = SL_HEALTH_DEFAULT_STATUS_MAX;
    } else {
        t->status_min = cfg->expected_status_min;
        t->status_max = cfg->expected_status_max < cfg->expected_status_min
                            ? cfg->expected_status_min
                            : cfg->expected_status_max;
    }
}

/*
 * A new target for an endpoint of `cluster`. On success it owns a reference
 * on the endpoint state and the request; its first check is scheduled. On
 * failure (logged) nothing is kept and request is freed.
 */
static hc_target_t *new_target(sl_health_t *hc, uint64_t hash, const char *cluster,
                               const Sluice__V1__Endpoint *pe, const Sluice__V1__HealthCheck *cfg,
                               char *request, size_t request_len)
{
    char err[512];
    hc_target_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        goto fail_alloc;
    t->fd = -1;
    t->hc = hc;
    t->hash = hash;
    t->ep = sl_endpoint_acquire(cluster, pe->address, (uint16_t)pe->port, err, sizeof(err));
    if (t->ep == NULL) {
        sl_log_error("%s; it is not health-checked", err);
        goto fail;
    }
    int v6 = strchr(pe->address, ':') != NULL && pe->address[0] != '[';
    size_t nlen = strlen(cluster) + strlen(pe->address) + 48;
    t->name = malloc(nlen);
    t->timer = event_new(hc->base, -1, 0, timer_cb, t);
    if (t->name == NULL || t->timer == NULL)
        goto fail_alloc;
    snprintf(t->name, nlen, v6 ? "backend %s endpoint [%s]:%u" : "backend %s endpoint %s:%u",
             cluster, pe->address, (unsigned)pe->port);
    t->healthy = atomic_load_explicit(&t->ep->hc_healthy, memory_order_relaxed);
    apply_config(t, cfg, request, request_len);
    request = NULL;
    if (insert_target(hc, t) != 0)
        goto fail_alloc;
    /* First check within one interval, spread at random (see the top). */
    schedule(t, sl_lb_rng_next(&hc->rng) % ((uint64_t)t->interval_ms + 1));
    return t;

fail_alloc:
    sl_log_error("backend %s endpoint %s:%u: out of memory; it is not health-checked", cluster,
                 pe->address, (unsigned)pe->port);
fail:
    free(request);
    if (t != NULL)
        free_target(t);
    return NULL;
}

sl_health_t *sl_health_new(struct event_base *base)
{
    if (base == NULL)
        return NULL;
    sl_health_t *hc = calloc(1, sizeof(*hc));
    if (hc == NULL)
        return NULL;
    hc->base = base;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    /* Different per process, so that runtimes of a fleet started together
     * do not check the same backend in lockstep. */
    sl_lb_rng_seed(&hc->rng, (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
                                 ((uint64_t)getpid() << 40) ^ (uint64_t)(uintptr_t)hc);
    return hc;
}

static void update_cluster(sl_health_t *hc, const Sluice__V1__Cluster *cl)
{
    const Sluice__V1__HealthCheck *cfg = cl->health_check;
    const char *cluster = cl->name != NULL ? cl->name : "";
    for (size_t e = 0; e < cl->n_endpoints; e++) {
        const Sluice__V1__Endpoint *pe = cl->endpoints[e];
        if (pe == NULL || pe->address == NULL || pe->port == 0 || pe->port > 65535)
            continue; /* sl_endpoint_acquire would refuse it too; the
                       * generation build reports it */
        uint16_t port = (uint16_t)pe->port;
        char err[256];
        size_t request_len = 0;
        char *request = build_request(cfg, pe->address, port, &request_len, err, sizeof(err));
        if (request == NULL) {
            /* The same for every endpoint of the cluster: say it once. The
             * cluster's targets are not marked seen, so they stop. */
            sl_log_error("backend %s: %s; active health checks disabled", cluster, err);
            return;
        }
        uint64_t hash = target_key_hash(cluster, pe->address, port);
        hc_target_t *t = find_target(hc, hash, cluster, pe->address, port);
        if (t != NULL) {
            if (t->seen_round == hc->round) {
                free(request); /* the same endpoint listed twice */
                continue;
            }
            uint32_t old_interval = t->interval_ms;
            apply_config(t, cfg, request, request_len);
            t->seen_round = hc->round;
            /* Keep the schedule unless the interval changed; then the next
             * check is at most one new interval away. */
            if (t->interval_ms != old_interval && t->phase == HC_IDLE) {
                event_del(t->timer);
                schedule(t, sl_lb_rng_next(&hc->rng) % ((uint64_t)t->interval_ms + 1));
            }
            continue;
        }
        t = new_target(hc, hash, cluster, pe, cfg, request, request_len);
        if (t != NULL)
            t->seen_round = hc->round;
    }
}

void sl_health_update(sl_health_t *hc, const Sluice__V1__Snapshot *snap)
{
    if (hc == NULL)
        return;
    hc->round++;
    for (size_t c = 0; snap != NULL && c < snap->n_clusters; c++) {
        const Sluice__V1__Cluster *cl = snap->clusters[c];
        if (cl != NULL && cl->health_check != NULL)
            update_cluster(hc, cl);
    }
    /* Whatever this snapshot did not mention stops. */
    for (size_t b = 0; b < hc->n_buckets; b++) {
        hc_target_t **link = &hc->buckets[b];
        while (*link != NULL) {
            hc_target_t *t = *link;
            if (t->seen_round == hc->round) {
                link = &t->next;
                continue;
            }
            *link = t->next;
            hc->count--;
            free_target(t);
        }
    }
}

void sl_health_free(sl_health_t *hc)
{
    if (hc == NULL)
        return;
    for (size_t b = 0; b < hc->n_buckets; b++) {
        hc_target_t *t = hc->buckets[b];
        while (t != NULL) {
            hc_target_t *next = t->next;
            free_target(t);
            t = next;
        }
    }
    free(hc->buckets);
    free(hc);
}
