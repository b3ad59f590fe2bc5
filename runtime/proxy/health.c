/*
 * Active HTTP health checks (health.h), run on the main thread's event_base.
 *
 * Responsible for: one check target per (cluster, address, port) of every
 * cluster that has a health_check; a timer per target; a fresh non-blocking
 * connection per check that speaks the Backend's protocol:
 *     http1  GET <path> HTTP/1.1 / Host / User-Agent: sluice-health-check /
 *            Connection: close; only the status line is judged
 *     h2c    HTTP/2 with prior knowledge: one GET stream (:scheme http,
 *            :authority, :path, user-agent); its final :status is judged
 *     tls    first the TLS handshake with the context traffic uses (the
 *            generation's: CA bundle or system CAs, client certificate),
 *            verifying and sending as SNI the Backend's sni or the address
 *            (net/tls_client.h); then http1, or for h2 the HTTP/2 exchange
 *            above with :scheme https once ALPN chose h2. A handshake that
 *            fails, a certificate that does not verify, or an h2 Backend
 *            whose endpoint does not select ALPN h2 is a failed check whose
 *            reason says which;
 *     grpc   (healthCheck.grpc, h2/h2c Backends) instead of the GET, one
 *            POST /grpc.health.v1.Health/Check stream carrying
 *            HealthCheckRequest{service}; healthy only with :status 200,
 *            grpc-status 0 (trailers, or headers for Trailers-Only) and
 *            HealthCheckResponse{status: SERVING}. Anything else fails
 *            with a reason naming what was wrong (NOT_SERVING,
 *            SERVICE_UNKNOWN, grpc-status 12 ..., a malformed message);
 * counting consecutive results and flipping
 * the shared endpoint state's hc_healthy (endpoint.h) at the thresholds, with
 * one notice line per flip; publishing every verdict in the endpoint state
 * (totals, consecutive counts, the last failure's reason) for /metrics and
 * /clusters; following config changes by key so that checks
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
 *   - timeout_ms bounds the whole check: connect, TLS handshake, send and
 *     status.
 *   - Host (:authority for HTTP/2): the configured host, else the endpoint's
 *     address, with ":port" unless it is the scheme's default, 80 or 443
 *     with TLS (RFC 9110 7.2; bracketed for IPv6 literals).
 *   - Only the status is read (the status line, at most 1 KiB, or the
 *     response HEADERS); the rest of the response is not waited for. A
 *     gRPC check reads its whole stream instead (the verdict is in the
 *     message and the trailers), at most SL_HEALTH_MAX_GRPC_RESPONSE bytes
 *     of message: a HealthCheckResponse is a handful of bytes. An
 *     HTTP/2 check is one stream on its own connection, closed afterwards
 *     (a TLS one with close_notify).
 *   - Why not upstream_h2.c's sessions: they are per worker, carry
 *     exchanges of client requests and live in connection pools; a check
 *     must run on the main thread, on a fresh connection whose failure is
 *     the verdict. The minimal client session here (SETTINGS, one HEADERS,
 *     read until :status) is smaller than an adapter would be.
 *   - Failures are logged with their reason at notice level only when they
 *     flip the endpoint (once per flip, so a dead endpoint does not flood the
 *     log), every failed check at debug level.
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
#include "sl_types.h"
#include "tls.h"
#include "tls_client.h"

#include <errno.h>
#include <event2/event.h>
#include <nghttp2/nghttp2.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
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
/* HTTP/2 frames not yet taken by the socket: a check sends the preface,
 * SETTINGS, one HEADERS and a few acknowledgements, far below this. */
#define SL_HEALTH_MAX_H2_OUT (64 * 1024)
/* gRPC: the service name sent (validate_spec.c allows 1024) and the
 * largest response message read; a HealthCheckResponse is 7 bytes framed. */
#define SL_HEALTH_MAX_GRPC_SERVICE 1024
#define SL_HEALTH_MAX_GRPC_RESPONSE 256
#define SL_HEALTH_GRPC_PATH "/grpc.health.v1.Health/Check"

enum hc_phase { HC_IDLE, HC_CONNECTING, HC_HANDSHAKE, HC_SENDING, HC_READING, HC_H2 };

typedef struct hc_target hc_target_t;
struct hc_target {
    sl_health_t *hc;
    hc_target_t *next; /* hash chain */
    uint64_t hash;
    unsigned seen_round;

    sl_endpoint_state_t *ep; /* one reference, owned */
    char *name;              /* "backend X endpoint A:P", for logs */

    /* config, copied from the snapshot */
    char *request; /* HTTP/1.1 */
    size_t request_len;
    char *path, *authority; /* HTTP/2 */
    SSL_CTX *tls;           /* one reference, NULL = plaintext */
    char *tls_name;         /* verified and sent as SNI; NULL = the address */
    uint8_t h2;             /* HTTP/2: h2 (with tls) or h2c */
    char *grpc_service;     /* gRPC health check of this service; NULL = HTTP */
    uint32_t interval_ms, timeout_ms;
    uint32_t healthy_threshold, unhealthy_threshold;
    uint32_t status_min, status_max;

    struct event *timer; /* next check */

    /* the check in flight (its protocol is fixed when it starts: a config
     * change applies from the next check) */
    enum hc_phase phase;
    int fd;
    struct event *io;
    uint64_t deadline_ms;
    size_t sent;
    size_t resp_len;
    char resp[SL_HEALTH_MAX_STATUS_LINE];
    SSL *ssl;          /* NULL for plaintext */
    uint8_t tls_clean; /* handshake done, no fatal I/O error: close_notify */
    uint8_t check_h2;  /* this check speaks HTTP/2 */
    uint8_t read_wants_write, write_wants_read; /* TLS (net/tls.h sl_io_*) */
    nghttp2_session *sess;
    int32_t stream_id;
    int h2_status;     /* final :status of the stream, 0 before */
    uint8_t h2_closed; /* the stream closed (reset or ended) */
    uint32_t h2_error; /* its error code */
    uint8_t *out;      /* HTTP/2 frames not yet written, [out_sent, out_len) */
    size_t out_len, out_sent;
    /* gRPC check in flight */
    uint8_t check_grpc;
    uint8_t *grpc_req; /* the framed HealthCheckRequest, [grpc_req_sent, grpc_req_len) */
    size_t grpc_req_len, grpc_req_sent;
    int grpc_status;       /* grpc-status of the stream, -1 before */
    char grpc_message[64]; /* its grpc-message, cut */
    uint8_t grpc_resp[SL_HEALTH_MAX_GRPC_RESPONSE];
    size_t grpc_resp_len;
    uint8_t grpc_resp_too_long;

    /* verdict */
    int healthy;
    uint32_t successes, failures; /* consecutive */
};

struct sl_health {
    struct event_base *base;
    nghttp2_session_callbacks *h2_callbacks; /* shared by every HTTP/2 check */
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

/* The path and the Host (or :authority) of the checks, validated. The
 * default Host leaves out the scheme's default port. 0, or -1 with err set
 * when the path or host cannot be sent as is. */
static int check_target(const Sluice__V1__HealthCheck *cfg, const char *address, uint16_t port,
                        uint16_t default_port, const char **path_out, char *host, size_t hostlen,
                        char *err, size_t errlen)
{
    const char *path = cfg->grpc != NULL                           ? SL_HEALTH_GRPC_PATH
                       : cfg->path != NULL && cfg->path[0] != '\0' ? cfg->path
                                                                   : "/";
    /* A gRPC check's own authority wins over the check's host. */
    const char *host_cfg =
        cfg->grpc != NULL && cfg->grpc->authority != NULL && cfg->grpc->authority[0] != '\0'
            ? cfg->grpc->authority
            : cfg->host;
    if (path[0] != '/' || !is_token_text(path, SL_HEALTH_MAX_PATH_LEN)) {
        snprintf(err, errlen,
                 "health_check.path must start with '/', be at most %d bytes and contain no "
                 "spaces or control characters",
                 SL_HEALTH_MAX_PATH_LEN);
        return -1;
    }
    if (host_cfg != NULL && host_cfg[0] != '\0') {
        if (!is_token_text(host_cfg, SL_HEALTH_MAX_HOST_LEN)) {
            snprintf(err, errlen,
                     "health_check.host (or grpc.authority) must be at most %d bytes with no "
                     "spaces or control characters",
                     SL_HEALTH_MAX_HOST_LEN);
            return -1;
        }
        snprintf(host, hostlen, "%s", host_cfg);
    } else {
        int v6 = strchr(address, ':') != NULL && address[0] != '[';
        if (port == default_port)
            snprintf(host, hostlen, v6 ? "[%s]" : "%s", address);
        else
            snprintf(host, hostlen, v6 ? "[%s]:%u" : "%s:%u", address, (unsigned)port);
    }
    *path_out = path;
    return 0;
}

/* The HTTP/1.1 check's request, built once per config; the default Host
 * leaves out default_port (80, or 443 over TLS). NULL with err set when the path or host cannot
 * be sent as is. */
static char *build_request(const Sluice__V1__HealthCheck *cfg, const char *address, uint16_t port,
                           uint16_t default_port, size_t *len, char *err, size_t errlen)
{
    const char *path;
    char host[SL_HEALTH_MAX_HOST_LEN + 16];
    if (check_target(cfg, address, port, default_port, &path, host, sizeof(host), err, errlen) != 0)
        return NULL;
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
    if (t->sess != NULL) {
        nghttp2_session_del(t->sess);
        t->sess = NULL;
    }
    if (t->ssl != NULL) {
        int want;
        if (t->tls_clean)
            sl_tls_shutdown(t->ssl, &want); /* not waited for (net/tls.h) */
        SSL_free(t->ssl);
        t->ssl = NULL;
    }
    if (t->fd >= 0) {
        close(t->fd);
        t->fd = -1;
    }
    free(t->out);
    t->out = NULL;
    t->out_len = t->out_sent = 0;
    free(t->grpc_req);
    t->grpc_req = NULL;
    t->grpc_req_len = t->grpc_req_sent = 0;
    t->tls_clean = 0;
    t->phase = HC_IDLE;
}

/* Ends the check in flight with its verdict and schedules the next one. */
static void finish_check(hc_target_t *t, int ok, const char *reason)
{
    close_check(t);
    sl_endpoint_state_t *ep = t->ep;
    if (ok) {
        atomic_fetch_add_explicit(&ep->hc_checks_succeeded, 1, memory_order_relaxed);
    } else {
        sl_endpoint_set_hc_failure(ep, reason);
        atomic_fetch_add_explicit(&ep->hc_checks_failed, 1, memory_order_relaxed);
    }
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
    atomic_store_explicit(&ep->hc_consecutive_successes, t->successes, memory_order_relaxed);
    atomic_store_explicit(&ep->hc_consecutive_failures, t->failures, memory_order_relaxed);
    schedule(t, t->interval_ms);
}

/* A failed check after a fatal socket or TLS error: no close_notify. */
static void fail_io(hc_target_t *t, const char *reason)
{
    t->tls_clean = 0;
    finish_check(t, 0, reason);
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

/* read(2)/write(2) results over plaintext or TLS (net/tls.h sl_io_*); a
 * plaintext write never raises SIGPIPE. */
static ssize_t check_read(hc_target_t *t, void *buf, size_t len)
{
    if (t->ssl == NULL)
        return recv(t->fd, buf, len, 0);
    return sl_io_read(t->fd, t->ssl, buf, len, &t->read_wants_write);
}

static ssize_t check_write(hc_target_t *t, const void *buf, size_t len)
{
    if (t->ssl == NULL)
        return send(t->fd, buf, len, MSG_NOSIGNAL);
    return sl_io_write(t->fd, t->ssl, buf, len, &t->write_wants_read);
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

/* Judges a response status against the expected range. */
static void judge_status(hc_target_t *t, unsigned status)
{
    if (status < t->status_min || status > t->status_max) {
        char reason[32];
        snprintf(reason, sizeof(reason), "status %u", status);
        finish_check(t, 0, reason);
        return;
    }
    finish_check(t, 1, NULL);
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
    judge_status(t, (unsigned)(line[9] - '0') * 100 + (unsigned)(line[10] - '0') * 10 +
                        (unsigned)(line[11] - '0'));
}

/* ---- HTTP/2 (h2c, and h2 after ALPN) ---- */

static ssize_t h2_send_cb(nghttp2_session *sess, const uint8_t *data, size_t len, int flags,
                          void *user)
{
    (void)sess;
    (void)flags;
    hc_target_t *t = user;
    if (t->out_len + len > SL_HEALTH_MAX_H2_OUT)
        return NGHTTP2_ERR_WOULDBLOCK; /* written first, then nghttp2 goes on */
    if (t->out == NULL) {
        t->out = malloc(SL_HEALTH_MAX_H2_OUT);
        if (t->out == NULL)
            return NGHTTP2_ERR_CALLBACK_FAILURE;
    }
    memcpy(t->out + t->out_len, data, len);
    t->out_len += len;
    return (ssize_t)len;
}

/* grpc-status and grpc-message of a gRPC check, from the trailers (or the
 * headers of a Trailers-Only response). */
static void grpc_header(hc_target_t *t, const uint8_t *name, size_t namelen, const uint8_t *value,
                        size_t valuelen)
{
    if (namelen == 11 && memcmp(name, "grpc-status", 11) == 0) {
        int code = 0;
        for (size_t i = 0; i < valuelen && code <= 1000; i++) {
            if (value[i] < '0' || value[i] > '9') {
                code = 1000; /* not a number: reported as such */
                break;
            }
            code = code * 10 + (value[i] - '0');
        }
        t->grpc_status = valuelen == 0 ? 1000 : code;
    } else if (namelen == 12 && memcmp(name, "grpc-message", 12) == 0) {
        size_t n = valuelen < sizeof(t->grpc_message) - 1 ? valuelen : sizeof(t->grpc_message) - 1;
        for (size_t i = 0; i < n; i++) /* for a log line: printable only */
            t->grpc_message[i] = value[i] >= 0x20 && value[i] < 0x7f ? (char)value[i] : '?';
        t->grpc_message[n] = '\0';
    }
}

/* The final :status of our stream, and for gRPC its grpc-status; the rest
 * is not kept. */
static int h2_header_cb(nghttp2_session *sess, const nghttp2_frame *frame, const uint8_t *name,
                        size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                        void *user)
{
    (void)sess;
    (void)flags;
    hc_target_t *t = user;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->hd.stream_id != t->stream_id)
        return 0;
    if (t->check_grpc)
        grpc_header(t, name, namelen, value, valuelen);
    if (t->h2_status != 0 || namelen != 7 || memcmp(name, ":status", 7) != 0 || valuelen != 3)
        return 0;
    int status = 0;
    for (size_t i = 0; i < 3; i++) {
        if (value[i] < '0' || value[i] > '9')
            return 0; /* nghttp2 refuses such a :status before we see it */
        status = status * 10 + (value[i] - '0');
    }
    if (status >= 200) /* 1xx are interim: the final status follows */
        t->h2_status = status;
    return 0;
}

/* The response message of a gRPC check; anything longer than a health
 * response could be is only noted. */
static int h2_data_cb(nghttp2_session *sess, uint8_t flags, int32_t stream_id, const uint8_t *data,
                      size_t len, void *user)
{
    (void)sess;
    (void)flags;
    hc_target_t *t = user;
    if (stream_id != t->stream_id || !t->check_grpc)
        return 0;
    if (len > sizeof(t->grpc_resp) - t->grpc_resp_len) {
        t->grpc_resp_too_long = 1;
        return 0;
    }
    memcpy(t->grpc_resp + t->grpc_resp_len, data, len);
    t->grpc_resp_len += len;
    return 0;
}

/* The framed HealthCheckRequest, as the body of the gRPC check's stream. */
static ssize_t grpc_body_cb(nghttp2_session *sess, int32_t stream_id, uint8_t *buf, size_t len,
                            uint32_t *data_flags, nghttp2_data_source *source, void *user)
{
    (void)sess;
    (void)stream_id;
    (void)source;
    hc_target_t *t = user;
    size_t n = t->grpc_req_len - t->grpc_req_sent;
    if (n > len)
        n = len;
    memcpy(buf, t->grpc_req + t->grpc_req_sent, n);
    t->grpc_req_sent += n;
    if (t->grpc_req_sent == t->grpc_req_len)
        *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

/* protobuf varint at *p (< end); -1 when truncated or longer than 64 bits. */
static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* HealthCheckResponse{ServingStatus status = 1} from a protobuf message:
 * unknown fields are skipped as protobuf requires. 0, or -1 when the bytes
 * are not a valid message. */
static int parse_health_response(const uint8_t *p, size_t len, uint64_t *status)
{
    const uint8_t *end = p + len;
    *status = 0; /* proto3 default: UNKNOWN */
    while (p < end) {
        uint64_t key, v;
        if (read_varint(&p, end, &key) != 0)
            return -1;
        switch (key & 7) {
        case 0:
            if (read_varint(&p, end, &v) != 0)
                return -1;
            if (key >> 3 == 1)
                *status = v;
            break;
        case 1:
        case 5: {
            size_t n = (key & 7) == 1 ? 8 : 4;
            if ((size_t)(end - p) < n)
                return -1;
            p += n;
            break;
        }
        case 2:
            if (read_varint(&p, end, &v) != 0 || v > (uint64_t)(end - p))
                return -1;
            p += v;
            break;
        default:
            return -1;
        }
        if (key >> 3 == 0)
            return -1;
    }
    return 0;
}

static const char *const grpc_code_names[] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};
static const char *const serving_status_names[] = {"UNKNOWN", "SERVING", "NOT_SERVING",
                                                   "SERVICE_UNKNOWN"};

/* Judges a gRPC check once its stream closed (or its :status is not 200). */
static void judge_grpc(hc_target_t *t)
{
    char reason[192];
    const char *svc = t->grpc_service != NULL ? t->grpc_service : "";
    if (t->h2_status == 0) {
        snprintf(reason, sizeof(reason), "HTTP/2 stream closed without a response (%s)",
                 nghttp2_http2_strerror(t->h2_error));
        finish_check(t, 0, reason);
        return;
    }
    if (t->h2_status != 200) {
        snprintf(reason, sizeof(reason), "gRPC health check: HTTP status %d (want 200)",
                 t->h2_status);
        finish_check(t, 0, reason);
        return;
    }
    if (t->grpc_status < 0) {
        if (t->h2_error != NGHTTP2_NO_ERROR)
            snprintf(reason, sizeof(reason),
                     "gRPC health check: stream reset (%s) before the "
                     "trailers",
                     nghttp2_http2_strerror(t->h2_error));
        else
            snprintf(reason, sizeof(reason), "gRPC health check: no grpc-status in the response");
        finish_check(t, 0, reason);
        return;
    }
    if (t->grpc_status != 0) {
        const char *name = t->grpc_status < (int)SL_ARRAY_LEN(grpc_code_names)
                               ? grpc_code_names[t->grpc_status]
                               : "not a gRPC code";
        snprintf(reason, sizeof(reason), "gRPC health check: grpc-status %d (%s)%s%s",
                 t->grpc_status, name, t->grpc_message[0] != '\0' ? ": " : "", t->grpc_message);
        finish_check(t, 0, reason);
        return;
    }
    /* One message: flag 0, its length, the HealthCheckResponse. */
    const uint8_t *m = t->grpc_resp;
    size_t mlen = t->grpc_resp_len;
    uint64_t serving;
    if (t->grpc_resp_too_long) {
        finish_check(t, 0,
                     "gRPC health check: response message too long for a "
                     "HealthCheckResponse");
        return;
    }
    if (mlen < 5 || m[0] > 1 ||
        ((uint32_t)m[1] << 24 | (uint32_t)m[2] << 16 | (uint32_t)m[3] << 8 | m[4]) != mlen - 5) {
        finish_check(t, 0,
                     mlen == 0 ? "gRPC health check: grpc-status 0 without a response "
                                 "message"
                               : "gRPC health check: malformed response message framing");
        return;
    }
    if (m[0] == 1) {
        finish_check(t, 0, "gRPC health check: compressed response (none was offered)");
        return;
    }
    if (parse_health_response(m + 5, mlen - 5, &serving) != 0) {
        finish_check(t, 0, "gRPC health check: malformed HealthCheckResponse");
        return;
    }
    if (serving == 1) {
        finish_check(t, 1, NULL);
        return;
    }
    snprintf(reason, sizeof(reason), "gRPC health check: service \"%.64s\" is %s", svc,
             serving < SL_ARRAY_LEN(serving_status_names) ? serving_status_names[serving]
                                                          : "in an unknown serving status");
    finish_check(t, 0, reason);
}

static int h2_stream_close_cb(nghttp2_session *sess, int32_t stream_id, uint32_t error_code,
                              void *user)
{
    (void)sess;
    hc_target_t *t = user;
    if (stream_id == t->stream_id) {
        t->h2_closed = 1;
        t->h2_error = error_code;
    }
    return 0;
}

/* Writes the pending frames. 0 when all are out or the socket is full; -1
 * after finishing the check on an error. */
static int h2_flush(hc_target_t *t)
{
    char buf[128];
    while (t->out_sent < t->out_len) {
        ssize_t n = check_write(t, t->out + t->out_sent, t->out_len - t->out_sent);
        if (n > 0) {
            t->out_sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return 0;
        snprintf(buf, sizeof(buf), "send failed: %s", n < 0 ? strerror(errno) : "no progress");
        fail_io(t, buf);
        return -1;
    }
    t->out_len = t->out_sent = 0;
    return 0;
}

/* Moves the HTTP/2 exchange as far as the socket allows, judges the status
 * once it is known, else waits for the socket. */
static void h2_drive(hc_target_t *t)
{
    char buf[160];
    uint8_t in[8192];
    int eof = 0;
    t->read_wants_write = t->write_wants_read = 0;
    for (;;) {
        ssize_t n = check_read(t, in, sizeof(in));
        if (n > 0) {
            ssize_t rv = nghttp2_session_mem_recv(t->sess, in, (size_t)n);
            if (rv < 0) {
                snprintf(buf, sizeof(buf), "HTTP/2 protocol error: %s", nghttp2_strerror((int)rv));
                fail_io(t, buf);
                return;
            }
            if (t->h2_closed || (t->h2_status != 0 && (!t->check_grpc || t->h2_status != 200)))
                break;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            break;
        if (n < 0) {
            snprintf(buf, sizeof(buf), "read failed: %s", strerror(errno));
            fail_io(t, buf);
            return;
        }
        eof = 1;
        break;
    }
    if (t->check_grpc && (t->h2_closed || (t->h2_status != 0 && t->h2_status != 200))) {
        judge_grpc(t);
        return;
    }
    if (!t->check_grpc && t->h2_status != 0) {
        judge_status(t, (unsigned)t->h2_status);
        return;
    }
    if (t->h2_closed) {
        snprintf(buf, sizeof(buf), "HTTP/2 stream closed without a response (%s)",
                 nghttp2_http2_strerror(t->h2_error));
        finish_check(t, 0, buf);
        return;
    }
    if (eof) {
        fail_io(t, "connection closed before the response");
        return;
    }
    int rv = nghttp2_session_send(t->sess);
    if (rv != 0) {
        snprintf(buf, sizeof(buf), "HTTP/2 session: %s", nghttp2_strerror(rv));
        fail_io(t, buf);
        return;
    }
    if (h2_flush(t) != 0)
        return;
    if (!nghttp2_session_want_read(t->sess) && t->out_len == 0) {
        finish_check(t, 0, "the endpoint ended the HTTP/2 session (GOAWAY) before the response");
        return;
    }
    short events = EV_READ;
    if (t->out_len > 0 || t->read_wants_write || nghttp2_session_want_write(t->sess))
        events |= EV_WRITE;
    arm_io(t, events);
}

/* The request of a gRPC check: HealthCheckRequest{string service = 1},
 * hand-encoded (tag 0x0a, varint length, bytes; nothing for ""), framed as
 * one uncompressed gRPC message (flag 0, 4-byte big-endian length). */
static int build_grpc_request(hc_target_t *t)
{
    size_t slen = strlen(t->grpc_service); /* <= SL_HEALTH_MAX_GRPC_SERVICE */
    uint8_t *b = malloc(5 + 1 + 2 + slen);
    if (b == NULL)
        return -1;
    size_t n = 5;
    if (slen > 0) {
        b[n++] = 0x0a;
        if (slen < 0x80) {
            b[n++] = (uint8_t)slen;
        } else {
            b[n++] = (uint8_t)(0x80 | (slen & 0x7f));
            b[n++] = (uint8_t)(slen >> 7);
        }
        memcpy(b + n, t->grpc_service, slen);
        n += slen;
    }
    size_t msg = n - 5;
    b[0] = 0;
    b[1] = (uint8_t)(msg >> 24);
    b[2] = (uint8_t)(msg >> 16);
    b[3] = (uint8_t)(msg >> 8);
    b[4] = (uint8_t)msg;
    t->grpc_req = b;
    t->grpc_req_len = n;
    t->grpc_req_sent = 0;
    return 0;
}

/* Opens the client session on the connected (and handshaken) socket and
 * queues SETTINGS and the check's GET (or gRPC POST). */
static void h2_start(hc_target_t *t)
{
    char buf[128];
    t->h2_status = 0;
    t->h2_closed = 0;
    t->h2_error = 0;
    t->check_grpc = t->grpc_service != NULL;
    t->grpc_status = -1;
    t->grpc_message[0] = '\0';
    t->grpc_resp_len = 0;
    t->grpc_resp_too_long = 0;
    if (t->check_grpc && build_grpc_request(t) != 0) {
        finish_check(t, 0, "out of memory");
        return;
    }
    int rv = nghttp2_session_client_new(&t->sess, t->hc->h2_callbacks, t);
    if (rv != 0) {
        snprintf(buf, sizeof(buf), "HTTP/2 session: %s", nghttp2_strerror(rv));
        finish_check(t, 0, buf);
        return;
    }
    nghttp2_settings_entry settings[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0}};
    int https = t->ssl != NULL;
#define HC_NV(n, v, vl) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, (vl), NGHTTP2_NV_FLAG_NONE}
    nghttp2_nv nva[] = {
        HC_NV(":method", "GET", 3),
        HC_NV(":scheme", https ? "https" : "http", https ? 5 : 4),
        HC_NV(":authority", t->authority, strlen(t->authority)),
        HC_NV(":path", t->path, strlen(t->path)),
        HC_NV("user-agent", "sluice-health-check", sizeof("sluice-health-check") - 1),
    };
    nghttp2_nv grpc_nva[] = {
        HC_NV(":method", "POST", 4),
        HC_NV(":scheme", https ? "https" : "http", https ? 5 : 4),
        HC_NV(":authority", t->authority, strlen(t->authority)),
        HC_NV(":path", SL_HEALTH_GRPC_PATH, sizeof(SL_HEALTH_GRPC_PATH) - 1),
        HC_NV("content-type", "application/grpc", sizeof("application/grpc") - 1),
        HC_NV("te", "trailers", 8),
        HC_NV("user-agent", "sluice-health-check", sizeof("sluice-health-check") - 1),
    };
#undef HC_NV
    rv = nghttp2_submit_settings(t->sess, NGHTTP2_FLAG_NONE, settings, SL_ARRAY_LEN(settings));
    if (rv == 0 && t->check_grpc) {
        nghttp2_data_provider body = {.source = {.ptr = NULL}, .read_callback = grpc_body_cb};
        t->stream_id =
            nghttp2_submit_request(t->sess, NULL, grpc_nva, SL_ARRAY_LEN(grpc_nva), &body, NULL);
        rv = t->stream_id < 0 ? t->stream_id : 0;
    } else if (rv == 0) {
        t->stream_id = nghttp2_submit_request(t->sess, NULL, nva, SL_ARRAY_LEN(nva), NULL, NULL);
        rv = t->stream_id < 0 ? t->stream_id : 0;
    }
    if (rv != 0) {
        snprintf(buf, sizeof(buf), "HTTP/2 request: %s", nghttp2_strerror(rv));
        finish_check(t, 0, buf);
        return;
    }
    t->phase = HC_H2;
    h2_drive(t);
}

/* ---- connect, TLS, HTTP/1.1 ---- */

static void on_writable(hc_target_t *t);

/* Connected (and handshaken): the request goes in the check's protocol. */
static void start_request(hc_target_t *t)
{
    if (t->check_h2) {
        h2_start(t);
        return;
    }
    t->phase = HC_SENDING;
    on_writable(t);
}

static void on_handshake(hc_target_t *t)
{
    char buf[256];
    int want = 0;
    int rc = sl_tls_handshake(t->ssl, &want);
    if (rc == SL_AGAIN) {
        arm_io(t, want == SL_TLS_WANT_WRITE ? EV_WRITE : EV_READ);
        return;
    }
    if (rc != SL_OK) {
        /* The verification result outlives the error queue that
         * sl_tls_handshake cleared: name the certificate problem. */
        long v = SSL_get_verify_result(t->ssl);
        if (v != X509_V_OK)
            snprintf(buf, sizeof(buf),
                     "TLS certificate verification failed: %s (check the Backend's "
                     "tls.caBundle/caFile and tls.sni)",
                     X509_verify_cert_error_string(v));
        else
            snprintf(buf, sizeof(buf), "TLS handshake failed");
        fail_io(t, buf);
        return;
    }
    t->tls_clean = 1;
    if (t->check_h2 && sl_tls_alpn(t->ssl) != SL_TLS_ALPN_H2) {
        finish_check(t, 0,
                     "TLS ALPN did not select h2: the endpoint does not offer HTTP/2 over TLS "
                     "(protocol h2 needs it; use protocol http1 for an HTTP/1.1 endpoint)");
        return;
    }
    start_request(t);
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
        if (t->ssl != NULL) {
            t->phase = HC_HANDSHAKE;
            on_handshake(t);
            return;
        }
        start_request(t);
        return;
    }
    while (t->sent < t->request_len) {
        ssize_t n = check_write(t, t->request + t->sent, t->request_len - t->sent);
        if (n > 0) {
            t->sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            arm_io(t, t->write_wants_read ? EV_READ : EV_WRITE);
            return;
        }
        snprintf(buf, sizeof(buf), "send failed: %s", n < 0 ? strerror(errno) : "no progress");
        fail_io(t, buf);
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
        ssize_t n = check_read(t, t->resp + t->resp_len, room);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            arm_io(t, t->read_wants_write ? EV_WRITE : EV_READ);
            return;
        }
        if (n < 0) {
            char buf[128];
            snprintf(buf, sizeof(buf), "read failed: %s", strerror(errno));
            fail_io(t, buf);
            return;
        }
        if (n == 0) {
            fail_io(t, "connection closed before the status line");
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
        fail_io(t, t->phase == HC_CONNECTING  ? "connect timeout"
                   : t->phase == HC_HANDSHAKE ? "TLS handshake timeout"
                   : t->phase == HC_SENDING   ? "timeout sending the request"
                   : t->phase == HC_H2        ? "timeout waiting for the HTTP/2 response"
                                              : "timeout waiting for the status line");
        return;
    }
    switch (t->phase) {
    case HC_HANDSHAKE:
        on_handshake(t);
        break;
    case HC_READING:
        on_readable(t);
        break;
    case HC_H2:
        h2_drive(t);
        break;
    default:
        on_writable(t);
        break;
    }
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
    t->check_h2 = t->h2;
    t->read_wants_write = t->write_wants_read = 0;
    if (t->tls != NULL) {
        t->ssl = sl_tls_client_ssl_new(t->tls, t->fd,
                                       t->tls_name != NULL ? t->tls_name : t->ep->address);
        if (t->ssl == NULL) {
            finish_check(t, 0, "out of memory for TLS");
            return;
        }
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
        atomic_store_explicit(&t->ep->hc_checked, 0, memory_order_relaxed);
        atomic_store_explicit(&t->ep->hc_consecutive_successes, 0, memory_order_relaxed);
        atomic_store_explicit(&t->ep->hc_consecutive_failures, 0, memory_order_relaxed);
        sl_endpoint_release(t->ep);
    }
    free(t->request);
    free(t->path);
    free(t->authority);
    SSL_CTX_free(t->tls);
    free(t->tls_name);
    free(t->grpc_service);
    free(t->name);
    free(t);
}

/* What the checks of one endpoint speak and send, built per config. The
 * strings are owned until apply_config takes them; tls and tls_name are
 * borrowed from the caller. */
typedef struct {
    char *request; /* HTTP/1.1 */
    size_t request_len;
    char *path, *authority; /* HTTP/2 */
    char *grpc_service;     /* gRPC check; NULL = HTTP */
    SSL_CTX *tls;
    const char *tls_name;
    uint8_t h2;
} hc_probe_t;

static void probe_free(hc_probe_t *p)
{
    free(p->request);
    free(p->path);
    free(p->authority);
    free(p->grpc_service);
    p->request = p->path = p->authority = p->grpc_service = NULL;
}

/* Fills p for an endpoint of cl. 0, or -1 with err set. */
static int build_probe(const Sluice__V1__Cluster *cl, const char *address, uint16_t port,
                       SSL_CTX *tls, hc_probe_t *p, char *err, size_t errlen)
{
    const Sluice__V1__HealthCheck *cfg = cl->health_check;
    memset(p, 0, sizeof(*p));
    p->tls = tls;
    p->tls_name =
        cl->tls != NULL && cl->tls->sni != NULL && cl->tls->sni[0] != '\0' ? cl->tls->sni : NULL;
    p->h2 = cl->protocol == SLUICE__V1__CLUSTER__PROTOCOL__H2 ||
            cl->protocol == SLUICE__V1__CLUSTER__PROTOCOL__H2C;
    uint16_t default_port = tls != NULL ? 443 : 80;
    if (cfg->grpc != NULL && !p->h2) {
        snprintf(err, errlen, "health_check.grpc needs an HTTP/2 backend (protocol h2 or h2c)");
        return -1;
    }
    if (cfg->grpc != NULL) {
        const char *svc = cfg->grpc->service != NULL ? cfg->grpc->service : "";
        if (strlen(svc) > SL_HEALTH_MAX_GRPC_SERVICE) {
            snprintf(err, errlen, "health_check.grpc.service longer than %d bytes",
                     SL_HEALTH_MAX_GRPC_SERVICE);
            return -1;
        }
        if ((p->grpc_service = strdup(svc)) == NULL) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    }
    if (!p->h2) {
        p->request = build_request(cfg, address, port, default_port, &p->request_len, err, errlen);
        return p->request != NULL ? 0 : -1;
    }
    const char *path;
    char host[SL_HEALTH_MAX_HOST_LEN + 16];
    if (check_target(cfg, address, port, default_port, &path, host, sizeof(host), err, errlen) !=
        0) {
        probe_free(p);
        return -1;
    }
    p->path = strdup(path);
    p->authority = strdup(host);
    if (p->path == NULL || p->authority == NULL || (cfg->grpc != NULL && p->grpc_service == NULL)) {
        probe_free(p);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

/* Copies the check settings of cfg into t, defaults applied. Takes
 * ownership of the probe's strings and a reference on its TLS context; a
 * check in flight keeps its own SSL (which holds the old context). */
static int apply_config(hc_target_t *t, const Sluice__V1__HealthCheck *cfg, hc_probe_t *p)
{
    char *tls_name = NULL;
    if (p->tls_name != NULL && (tls_name = strdup(p->tls_name)) == NULL)
        return -1;
    free(t->request);
    free(t->path);
    free(t->authority);
    t->request = p->request;
    t->request_len = p->request_len;
    t->path = p->path;
    t->authority = p->authority;
    free(t->grpc_service);
    t->grpc_service = p->grpc_service;
    p->request = p->path = p->authority = p->grpc_service = NULL;
    if (p->tls != NULL)
        SSL_CTX_up_ref(p->tls);
    SSL_CTX_free(t->tls);
    t->tls = p->tls;
    free(t->tls_name);
    t->tls_name = tls_name;
    t->h2 = p->h2;
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
    return 0;
}

/*
 * A new target for an endpoint of `cluster`. On success it owns a reference
 * on the endpoint state, the probe's strings and a reference on its TLS
 * context; its first check is scheduled. On failure (logged) nothing is kept
 * and the probe's strings are freed.
 */
static hc_target_t *new_target(sl_health_t *hc, uint64_t hash, const char *cluster,
                               const Sluice__V1__Endpoint *pe, const Sluice__V1__HealthCheck *cfg,
                               hc_probe_t *probe)
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
    atomic_store_explicit(&t->ep->hc_checked, 1, memory_order_relaxed);
    if (apply_config(t, cfg, probe) != 0)
        goto fail_alloc;
    if (insert_target(hc, t) != 0)
        goto fail_alloc;
    /* First check within one interval, spread at random (see the top). */
    schedule(t, sl_lb_rng_next(&hc->rng) % ((uint64_t)t->interval_ms + 1));
    return t;

fail_alloc:
    sl_log_error("backend %s endpoint %s:%u: out of memory; it is not health-checked", cluster,
                 pe->address, (unsigned)pe->port);
fail:
    probe_free(probe);
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
    nghttp2_session_callbacks *cbs;
    if (nghttp2_session_callbacks_new(&cbs) != 0) {
        free(hc);
        return NULL;
    }
    nghttp2_session_callbacks_set_send_callback(cbs, h2_send_cb);
    nghttp2_session_callbacks_set_on_header_callback(cbs, h2_header_cb);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, h2_data_cb);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, h2_stream_close_cb);
    hc->h2_callbacks = cbs;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    /* Different per process, so that runtimes of a fleet started together
     * do not check the same backend in lockstep. */
    sl_lb_rng_seed(&hc->rng, (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
                                 ((uint64_t)getpid() << 40) ^ (uint64_t)(uintptr_t)hc);
    return hc;
}

static void update_cluster(sl_health_t *hc, const Sluice__V1__Cluster *cl, SSL_CTX *tls)
{
    const Sluice__V1__HealthCheck *cfg = cl->health_check;
    const char *cluster = cl->name != NULL ? cl->name : "";
    if (cl->tls != NULL && tls == NULL) {
        /* Probing in plaintext would judge a protocol the endpoint does not
         * speak; the generation always has the context, so this is a bug. */
        sl_log_error("backend %s: no TLS context for its health checks; active health checks "
                     "disabled",
                     cluster);
        return;
    }
    for (size_t e = 0; e < cl->n_endpoints; e++) {
        const Sluice__V1__Endpoint *pe = cl->endpoints[e];
        if (pe == NULL || pe->address == NULL || pe->port == 0 || pe->port > 65535)
            continue; /* sl_endpoint_acquire would refuse it too; the
                       * generation build reports it */
        uint16_t port = (uint16_t)pe->port;
        char err[256];
        hc_probe_t probe;
        if (build_probe(cl, pe->address, port, cl->tls != NULL ? tls : NULL, &probe, err,
                        sizeof(err)) != 0) {
            /* The same for every endpoint of the cluster: say it once. The
             * cluster's targets are not marked seen, so they stop. */
            sl_log_error("backend %s: %s; active health checks disabled", cluster, err);
            return;
        }
        uint64_t hash = target_key_hash(cluster, pe->address, port);
        hc_target_t *t = find_target(hc, hash, cluster, pe->address, port);
        if (t != NULL) {
            if (t->seen_round == hc->round) {
                probe_free(&probe); /* the same endpoint listed twice */
                continue;
            }
            uint32_t old_interval = t->interval_ms;
            if (apply_config(t, cfg, &probe) != 0) {
                /* Not marked seen: it stops, the endpoint counts as healthy. */
                sl_log_error("%s: out of memory; it is not health-checked", t->name);
                probe_free(&probe);
                continue;
            }
            t->seen_round = hc->round;
            /* Keep the schedule unless the interval changed; then the next
             * check is at most one new interval away. */
            if (t->interval_ms != old_interval && t->phase == HC_IDLE) {
                event_del(t->timer);
                schedule(t, sl_lb_rng_next(&hc->rng) % ((uint64_t)t->interval_ms + 1));
            }
            continue;
        }
        t = new_target(hc, hash, cluster, pe, cfg, &probe);
        if (t != NULL)
            t->seen_round = hc->round;
    }
}

void sl_health_update(sl_health_t *hc, const Sluice__V1__Snapshot *snap, sl_health_tls_fn tls_of,
                      void *tls_arg)
{
    if (hc == NULL)
        return;
    hc->round++;
    for (size_t c = 0; snap != NULL && c < snap->n_clusters; c++) {
        const Sluice__V1__Cluster *cl = snap->clusters[c];
        if (cl != NULL && cl->health_check != NULL)
            update_cluster(hc, cl, cl->tls != NULL && tls_of != NULL ? tls_of(tls_arg, c) : NULL);
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
    nghttp2_session_callbacks_del(hc->h2_callbacks);
    free(hc);
}
