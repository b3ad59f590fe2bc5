/*
 * The protocol-independent request (request.h): identity, generation,
 * routing, the route's limits, backend and endpoint choice, retry decisions,
 * outcomes, the gateway's error bodies, metrics and the traffic log record.
 */
#include "request.h"
#include "route_rules.h"
#include "mirror.h"

#include "chain.h"

#include "cache.h"
#include "log.h"
#include "metrics.h"
#include "path.h"
#include "srate.h"
#include "tlog.h"
#include "tlog_body.h"
#include "fmt.h"
#include "utf8.h"

#include <ctype.h>
#include <event2/buffer.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* The normalised path of the request being routed, when it differs from the
 * one sent. A path is never longer than the request line's limit (64 KiB at
 * most), and normalising never lengthens it (path.h). */
#define MAX_PATH_BYTES 65536
static __thread char worker_path[MAX_PATH_BYTES];

static uint64_t now_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static uint64_t now_unix_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* ---- identity and strings ------------------------------------------------- */

void sl_request_make_id(sl_lb_rng_t *rng, char out[37])
{
    static const char hex[] = "0123456789abcdef";
    uint64_t a = sl_lb_rng_next(rng), b = sl_lb_rng_next(rng);
    unsigned char bytes[16];
    memcpy(bytes, &a, 8);
    memcpy(bytes + 8, &b, 8);
    bytes[6] = (unsigned char)((bytes[6] & 0x0f) | 0x40); /* UUID version 4 */
    bytes[8] = (unsigned char)((bytes[8] & 0x3f) | 0x80);
    size_t o = 0;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            out[o++] = '-';
        out[o++] = hex[bytes[i] >> 4];
        out[o++] = hex[bytes[i] & 15];
    }
    out[o] = '\0';
}

/* A client's X-Request-Id is kept only when it is safe to log and to echo
 * in headers and JSON. */
static int valid_request_id(sl_str_t v)
{
    if (v.len == 0 || v.len > 128)
        return 0;
    for (size_t i = 0; i < v.len; i++) {
        unsigned char ch = (unsigned char)v.ptr[i];
        if (ch <= 0x20 || ch >= 0x7f || ch == '"' || ch == '\\')
            return 0;
    }
    return 1;
}

static sl_str_t meta_put(sl_request_t *r, const char *p, size_t n)
{
    if (n == 0 || !p)
        return (sl_str_t){"", 0};
    size_t room = sizeof(r->meta) - r->meta_len;
    if (n > room)
        n = room;
    sl_str_t s = {r->meta + r->meta_len, n};
    memcpy(r->meta + r->meta_len, p, n);
    r->meta_len += n;
    return s;
}

void sl_request_ensure_id(sl_request_t *r)
{
    if (r->m_reqid.len)
        return;
    char id[37];
    sl_request_make_id(&r->w->rng, id);
    r->m_reqid = meta_put(r, id, 36);
}

static const sl_header_t *find_header(const sl_req_head_t *h, const char *name, size_t len)
{
    return sl_http1_find_header(h->headers, h->num_headers, name, len);
}

/* ---- W3C trace context (https://www.w3.org/TR/trace-context/) ------------- */

static int lower_hex(const char *p, size_t n)
{
    int nonzero = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return -1;
        nonzero |= c != '0';
    }
    return nonzero;
}

/* version "-" trace-id "-" parent-id "-" flags; version 00 is exactly 55
 * bytes, a later one (not ff) may go on after a '-'. Upper-case hex, an
 * all-zero id and anything else make it invalid: ignored (the spec's
 * "restart the trace"). */
static int parse_traceparent(sl_request_t *r, sl_str_t v)
{
    const char *p = v.ptr;
    if (v.len < 55 || p[2] != '-' || p[35] != '-' || p[52] != '-')
        return 0;
    if (lower_hex(p, 2) < 0 || (p[0] == 'f' && p[1] == 'f'))
        return 0;
    if (p[0] == '0' && p[1] == '0' ? v.len != 55 : v.len > 55 && p[55] != '-')
        return 0;
    if (lower_hex(p + 3, 32) <= 0 || lower_hex(p + 36, 16) <= 0 || lower_hex(p + 53, 2) < 0)
        return 0;
    memcpy(r->trace_id, p + 3, 32);
    memcpy(r->parent_id, p + 36, 16);
    r->trace_parent = 1;
    unsigned hi = (unsigned)(p[53] <= '9' ? p[53] - '0' : p[53] - 'a' + 10);
    unsigned lo = (unsigned)(p[54] <= '9' ? p[54] - '0' : p[54] - 'a' + 10);
    r->trace_flags = (uint8_t)(hi << 4 | lo);
    return 1;
}

static void random_hex16(sl_lb_rng_t *rng, char out[16])
{
    static const char hex[] = "0123456789abcdef";
    uint64_t v;
    do
        v = sl_lb_rng_next(rng);
    while (v == 0); /* an all-zero id is invalid */
    for (int i = 15; i >= 0; i--, v >>= 4)
        out[i] = hex[v & 15];
}

static void trace_begin(sl_request_t *r, const sl_req_head_t *h)
{
    const sl_header_t *tp = find_header(h, "traceparent", 11);
    int valid = tp && parse_traceparent(r, tp->value);
    if (!r->gen || !r->gen->tracing.enabled) {
        r->trace_state = valid ? SL_TRACE_SEEN : SL_TRACE_NONE;
        return;
    }
    if (!valid) {
        r->trace_parent = 0;
        if (!r->gen->tracing.generate)
            return;
        random_hex16(&r->w->rng, r->trace_id);
        random_hex16(&r->w->rng, r->trace_id + 16);
        uint32_t ppm = r->gen->tracing.sample_ppm;
        r->trace_flags = ppm >= 1000000 || sl_lb_rng_next(&r->w->rng) % 1000000 < ppm;
    } else {
        r->trace_flags &= 1; /* other flags are not ours to pass on */
    }
    random_hex16(&r->w->rng, r->span_id);
    random_hex16(&r->w->rng, r->up_span_id);
    r->trace_state = SL_TRACE_OWN;
}

void sl_request_traceparent(const sl_request_t *r, char out[55])
{
    memcpy(out, "00-", 3);
    memcpy(out + 3, r->trace_id, 32);
    out[35] = '-';
    memcpy(out + 36, r->up_span_id, 16);
    out[52] = '-';
    out[53] = '0';
    out[54] = (char)('0' + (r->trace_flags & 1));
}

size_t sl_request_server_timing(const sl_request_t *r, char *out, size_t cap)
{
    uint64_t total = r->start_mono_us ? now_mono_us() - r->start_mono_us : 0;
    int n;
    if (r->upstream_head_us && r->upstream_start_us &&
        r->upstream_head_us >= r->upstream_start_us) {
        uint64_t up = r->upstream_head_us - r->upstream_start_us;
        uint64_t gw = total > up ? total - up : 0;
        n = snprintf(out, cap, "gateway;dur=%llu.%03llu, upstream;dur=%llu.%03llu",
                     (unsigned long long)(gw / 1000), (unsigned long long)(gw % 1000),
                     (unsigned long long)(up / 1000), (unsigned long long)(up % 1000));
    } else {
        n = snprintf(out, cap, "gateway;dur=%llu.%03llu", (unsigned long long)(total / 1000),
                     (unsigned long long)(total % 1000));
    }
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

/*
 * grpc-timeout: 1..8 digits and a unit (H M S m u n), as the gRPC HTTP/2
 * protocol defines it; anything else is ignored (the route's deadline
 * applies). Rounded up to whole milliseconds, at least 1.
 */
static uint32_t parse_grpc_timeout(sl_str_t v)
{
    if (v.len < 2 || v.len > 9)
        return 0;
    uint64_t n = 0;
    for (size_t i = 0; i + 1 < v.len; i++) {
        if (v.ptr[i] < '0' || v.ptr[i] > '9')
            return 0;
        n = n * 10 + (uint64_t)(v.ptr[i] - '0');
    }
    uint64_t ms;
    switch (v.ptr[v.len - 1]) {
    case 'H':
        ms = n * 3600000u;
        break;
    case 'M':
        ms = n * 60000u;
        break;
    case 'S':
        ms = n * 1000u;
        break;
    case 'm':
        ms = n;
        break;
    case 'u':
        ms = (n + 999) / 1000;
        break;
    case 'n':
        ms = (n + 999999) / 1000000;
        break;
    default:
        return 0;
    }
    if (ms == 0)
        ms = 1;
    return ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
}

/* The headers a traffic log record may hold, as JSON (tlog.h), with the
 * Gateway's cap and redaction; only when some record of the generation
 * asks for them. */
#define TLOG_HEADERS_MAX 256
static void capture_headers(sl_request_t *r, int response, const sl_header_t *f, size_t n)
{
    const sl_tlog_policy_t *p = &r->gen->tlog;
    sl_str_t names[TLOG_HEADERS_MAX], values[TLOG_HEADERS_MAX];
    if (n > TLOG_HEADERS_MAX)
        n = TLOG_HEADERS_MAX;
    for (size_t i = 0; i < n; i++) {
        names[i] = f[i].name;
        values[i] = f[i].value;
    }
    size_t cap = p->header_max_bytes + 64;
    char *buf = r->tlog_headers[response];
    if (!buf)
        buf = malloc(cap > SL_TLOG_MAX_HEADER_MAX_BYTES + 64 ? cap
                                                             : SL_TLOG_MAX_HEADER_MAX_BYTES + 64);
    if (!buf)
        return; /* the record goes without them */
    r->tlog_headers[response] = buf;
    r->tlog_headers_len[response] = (uint32_t)sl_tlog_headers_json(p, names, values, n, buf, cap);
}

/* ---- bodies in the record (tlog_body.h) ------------------------------------ */

struct sl_req_body_cap {
    sl_http1_chunked_t dec; /* framed bytes: their payload */
    uint64_t size;          /* payload bytes seen */
    uint32_t cap, len;      /* bytes kept at most, kept */
    uint8_t kind;           /* enum sl_tlog_body_kind */
    uint8_t ctype_len;
    char ctype[SL_TLOG_BODY_TYPE_MAX];
    char *data; /* cap bytes, allocated with the first byte kept */
};

/* A body's capture, once its head is known and the request's record holds
 * it (the route's settings: an Api may turn bodies off). */
static void body_capture_begin(sl_request_t *r, int dir, const sl_header_t *f, size_t n)
{
    const sl_tlog_policy_t *p = r->route ? r->route->tlog : &r->gen->tlog;
    uint64_t bit = SL_TLOG_BIT(dir ? SL_TLOG_F_RESPONSE_BODY : SL_TLOG_F_REQUEST_BODY);
    if (!p->enabled || !(p->fields & bit) || !(sl_tlog_active() & SL_TLOG_TO_LOG))
        return;
    struct sl_req_body_cap *c = r->tlog_body[dir];
    if (!c) {
        c = calloc(1, sizeof(*c));
        if (!c)
            return; /* the record goes without it */
        r->tlog_body[dir] = c;
    }
    /* A response head again (a retry): the earlier one's body is not this. */
    c->size = 0;
    c->len = 0;
    c->cap = p->body_max_bytes;
    sl_http1_chunked_init(&c->dec);
    const sl_header_t *ct = sl_http1_find_header(f, n, "content-type", 12);
    size_t tl = ct ? ct->value.len : 0;
    if (tl > SL_TLOG_BODY_TYPE_MAX)
        tl = SL_TLOG_BODY_TYPE_MAX;
    if (tl)
        memcpy(c->ctype, ct->value.ptr, tl);
    c->ctype_len = (uint8_t)tl;
    c->kind = (uint8_t)sl_tlog_body_kind(p, c->ctype, tl);
}

void sl_request_body_capture(sl_request_t *r, int dir, const char *p, size_t n, int framed)
{
    struct sl_req_body_cap *c = r->tlog_body[dir];
    if (!n)
        return;
    if (c->kind != SL_TLOG_BODY_SKIP && c->len < c->cap && !c->data) {
        c->data = malloc(c->cap);
        if (!c->data)
            c->kind = SL_TLOG_BODY_SKIP; /* counted, not kept */
    }
    if (!framed) {
        c->size += n;
        if (c->kind != SL_TLOG_BODY_SKIP && c->len < c->cap) {
            size_t take = n < c->cap - c->len ? n : c->cap - c->len;
            memcpy(c->data + c->len, p, take);
            c->len += (uint32_t)take;
        }
        return;
    }
    /* Chunked framing: the raw bytes are copied into the room left and
     * decoded there (the payload is never longer), so no more than the cap
     * is ever copied; past the cap the framing is only scanned, for size.
     * Bad framing stops the count; the codec answers it. */
    int done = 0;
    while (n && !done && c->kind != SL_TLOG_BODY_SKIP && c->len < c->cap) {
        size_t take = n < c->cap - c->len ? n : c->cap - c->len;
        memcpy(c->data + c->len, p, take);
        size_t payload = 0;
        ssize_t used = sl_http1_chunked_decode(&c->dec, c->data + c->len, take, &payload, &done);
        if (used <= 0)
            goto out;
        c->len += (uint32_t)payload;
        p += used;
        n -= (size_t)used;
    }
    if (n && !done && !c->dec.error)
        (void)sl_http1_chunked_scan(&c->dec, p, n, &done);
out:
    c->size = c->dec.data_bytes;
}

/* The record's body strings (meta members, text) of direction dir; the
 * text may be a redacted copy in *scratch (malloc'd, freed by the caller). */
static void body_record(sl_request_t *r, const sl_tlog_policy_t *p, int dir, sl_tlog_record_t *e,
                        char *meta, char **scratch)
{
    struct sl_req_body_cap *c = r->tlog_body[dir];
    if (!c || !c->size ||
        !(p->fields & SL_TLOG_BIT(dir ? SL_TLOG_F_RESPONSE_BODY : SL_TLOG_F_REQUEST_BODY)))
        return;
    sl_tlog_body_t b = {
        .kind = c->kind,
        .ctype = {c->ctype, c->ctype_len},
        .data = c->data,
        .len = c->len,
        .size = c->size,
    };
    if (p->num_body_redact && c->len &&
        (c->kind == SL_TLOG_BODY_JSON || c->kind == SL_TLOG_BODY_FORM)) {
        *scratch = malloc(SL_TLOG_BODY_REDACTED_MAX(c->len));
        if (!*scratch)
            return; /* no record of a body not redacted */
    }
    sl_str_t text;
    size_t ml = sl_tlog_body_strings(p, &b, meta, &text, *scratch);
    e->str[dir ? SL_TLOG_S_RESPONSE_BODY_META : SL_TLOG_S_REQUEST_BODY_META] = (sl_str_t){meta, ml};
    e->str[dir ? SL_TLOG_S_RESPONSE_BODY : SL_TLOG_S_REQUEST_BODY] = text;
}

static void body_capture_free(sl_request_t *r)
{
    for (int d = 0; d < 2; d++) {
        if (r->tlog_body[d]) {
            free(r->tlog_body[d]->data);
            free(r->tlog_body[d]);
            r->tlog_body[d] = NULL;
        }
    }
}

void sl_request_set_head(sl_request_t *r, const sl_req_head_t *h)
{
    const sl_header_t *ct = find_header(h, "content-type", 12);
    r->grpc = ct && ct->value.len >= 16 && strncasecmp(ct->value.ptr, "application/grpc", 16) == 0;
    if (r->grpc) {
        const sl_header_t *gt = find_header(h, "grpc-timeout", 12);
        r->grpc_timeout_ms = gt ? parse_grpc_timeout(gt->value) : 0;
    }
    /* The request id first: errors answered before routing carry it too. */
    const sl_header_t *xrid = find_header(h, "x-request-id", 12);
    if (xrid && valid_request_id(xrid->value))
        r->m_reqid = meta_put(r, xrid->value.ptr, xrid->value.len);
    else
        sl_request_ensure_id(r);
    if (sl_unlikely(sl_tlog_active() || (r->gen && r->gen->tracing.enabled)))
        trace_begin(r, h);
    r->method_bit = h->method_bit;
    r->version = h->version;
    r->m_method = meta_put(r, h->method.ptr, h->method.len > 32 ? 32 : h->method.len);
    r->m_path = meta_put(r, h->path.ptr, h->path.len > 512 ? 512 : h->path.len);
    r->m_host = meta_put(r, h->host.ptr, h->host.len > 128 ? 128 : h->host.len);
    if (sl_tlog_active()) {
        r->m_query = meta_put(r, h->query.ptr, h->query.len > 256 ? 256 : h->query.len);
        const sl_header_t *f = find_header(h, "user-agent", 10);
        if (f)
            r->m_ua = meta_put(r, f->value.ptr, f->value.len > 160 ? 160 : f->value.len);
        f = find_header(h, "referer", 7);
        if (f)
            r->m_referer = meta_put(r, f->value.ptr, f->value.len > 160 ? 160 : f->value.len);
        if (sl_unlikely(r->gen && (r->gen->tlog_headers_wanted & 1)))
            capture_headers(r, 0, h->headers, h->num_headers);
    }
}

/* ---- life ----------------------------------------------------------------- */

void sl_request_init(sl_request_t *r, sl_worker_t *w, const char *client_ip)
{
    memset(r, 0, sizeof(*r));
    r->w = w;
    r->client_ip = client_ip;
    r->ep_index = -1;
    r->replayable = 1;
}

void sl_request_begin(sl_request_t *r)
{
    if (r->gen)
        return;
    r->gen = sl_generation_acquire(r->w);
    r->start_mono_us = now_mono_us();
    r->start_unix_us = now_unix_us();
}

static void set_error(sl_request_error_t *err, int status, const char *code, int close,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* ---- circuit breakers (Backend circuitBreaker) ---------------------------- */

static void cb_release(sl_request_t *r, unsigned kind)
{
    if (r->cb_held & (1u << kind)) {
        atomic_fetch_sub_explicit(&r->cb_stats->cb_active[kind], 1, memory_order_relaxed);
        r->cb_held &= (uint8_t)~(1u << kind);
    }
}

/* Takes one of the Backend's `kind` gauge under its limit: SL_OK, or
 * SL_ERROR (counted as refused) when it is full. */
static int cb_take(sl_request_t *r, unsigned kind)
{
    sl_gen_cluster_t *c = r->cluster;
    if (!c->cb_max[kind] || (r->cb_held & (1u << kind)))
        return SL_OK;
    if (r->cb_held && r->cb_stats != c->stats) {
        for (unsigned k = 0; k < SL_CB__COUNT; k++)
            cb_release(r, k);
    }
    sl_cluster_stats_t *s = c->stats;
    int64_t now = atomic_fetch_add_explicit(&s->cb_active[kind], 1, memory_order_relaxed) + 1;
    if (now > (int64_t)c->cb_max[kind]) {
        atomic_fetch_sub_explicit(&s->cb_active[kind], 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->cb_open[kind], 1, memory_order_relaxed);
        return SL_ERROR;
    }
    r->cb_stats = s;
    r->cb_held |= (uint8_t)(1u << kind);
    return SL_OK;
}

int sl_request_cb_connect(sl_request_t *r, sl_request_error_t *err)
{
    sl_gen_cluster_t *c = r->cluster;
    if (sl_likely(!c->cb_any))
        return SL_OK;
    if (c->cb_max[SL_CB_CONNECTIONS]) {
        int64_t open = 0;
        for (size_t e = 0; e < c->num_endpoints; e++)
            for (unsigned w = 0; w < c->endpoints[e]->nslots; w++)
                open += atomic_load_explicit(&c->endpoints[e]->upconns[w], memory_order_relaxed);
        if (open >= (int64_t)c->cb_max[SL_CB_CONNECTIONS]) {
            atomic_fetch_add_explicit(&c->stats->cb_open[SL_CB_CONNECTIONS], 1,
                                      memory_order_relaxed);
            set_error(err, 503, "circuit_open", 0,
                      "the backend's circuit breaker is open: %u connections (maxConnections)",
                      c->cb_max[SL_CB_CONNECTIONS]);
            return SL_ERROR;
        }
    }
    if (cb_take(r, SL_CB_PENDING) != SL_OK) {
        set_error(err, 503, "circuit_open", 0,
                  "the backend's circuit breaker is open: %u requests wait for a connection "
                  "(maxPendingRequests)",
                  c->cb_max[SL_CB_PENDING]);
        return SL_ERROR;
    }
    return SL_OK;
}

void sl_request_cb_connected(sl_request_t *r)
{
    cb_release(r, SL_CB_PENDING);
}

void sl_request_leave_pool(sl_request_t *r)
{
    if (sl_unlikely(r->cb_held & (1u << SL_CB_PENDING)))
        cb_release(r, SL_CB_PENDING);
    if (r->counted_request && r->pool && r->pool->active_requests)
        r->pool->active_requests--;
    r->counted_request = 0;
    if (r->counted_retry && r->pool && r->pool->retries_active)
        r->pool->retries_active--;
    r->counted_retry = 0;
}

void sl_request_reset(sl_request_t *r)
{
    /* Before the generation goes: the cache zone is the generation's. */
    if (sl_unlikely(r->cache))
        sl_cache_request_end(r);
    sl_request_leave_pool(r);
    if (r->gen) {
        sl_generation_release(r->w, r->gen);
        r->gen = NULL;
    }
    if (sl_unlikely(r->cb_held))
        for (unsigned k = 0; k < SL_CB__COUNT; k++)
            cb_release(r, k);
    r->route = NULL;
    r->cluster = NULL;
    r->num_choices = 0;
    r->fault_delay_ms = 0;
    r->sr = NULL;
    r->sr_pick.slot = 0;
    r->pool = NULL;
    r->ep_index = -1;
    r->replayable = 1;
    r->attempts = 0;
    r->hash = 0;
    r->deadline_ms = 0;
    r->method_bit = 0;
    r->status = 0;
    r->grpc = 0;
    r->grpc_timeout_ms = 0;
    r->error_code = NULL;
    r->bytes_received = 0;
    r->bytes_sent = 0;
    r->max_body_bytes = 0;
    r->meta_len = 0;
    r->m_method = r->m_path = r->m_query = r->m_host = r->m_ua = r->m_referer = r->m_reqid =
        (sl_str_t){"", 0};
    r->upstream_addr[0] = '\0';
    r->upstream_start_us = r->upstream_head_us = 0;
    r->trace_state = 0;
    r->trace_parent = 0;
    r->trace_flags = 0;
    if (sl_unlikely(r->tlog_headers[0] || r->tlog_headers[1])) {
        free(r->tlog_headers[0]);
        free(r->tlog_headers[1]);
        r->tlog_headers[0] = r->tlog_headers[1] = NULL;
        r->tlog_headers_len[0] = r->tlog_headers_len[1] = 0;
    }
    if (sl_unlikely(r->tlog_body[0] || r->tlog_body[1]))
        body_capture_free(r);
    if (r->pol) {
        if (sl_unlikely(r->pol->mirror)) {
            sl_mirror_discard(r->pol->mirror);
            r->pol->mirror = NULL;
        }
        sl_policy_req_end(&r->pol->v);
        sl_buf_free(&r->pol->body);
        sl_worker_t *w = r->w;
        if (w && w->num_policy_states < SL_WORKER_POLICY_CACHE)
            w->policy_states[w->num_policy_states++] = r->pol;
        else
            free(r->pol);
        r->pol = NULL;
    }
}

void sl_request_log(sl_request_t *r)
{
    uint64_t dur = now_mono_us() - r->start_mono_us;
    int status = r->status ? r->status : 499;
    SL_STAT_ADD(sl_metrics_worker(r->w->id)->requests_total, 1);
    if (r->route) {
        sl_metrics_observe(r->route->stats, r->w->id, status, dur);
        if (r->cluster) {
            unsigned cls = (unsigned)status / 100;
            SL_STAT_ADD(r->cluster->stats->slots[r->w->id].by_class[cls < 6 ? cls : 0], 1);
        }
    } else {
        int cls = status / 100;
        if (cls >= 1 && cls <= 5)
            SL_STAT_ADD(sl_metrics_worker(r->w->id)->unrouted_by_status[cls], 1);
    }
    int active = sl_tlog_active();
    if (!active)
        return;
    /* The record's settings: the route's (its Api's override, or the
     * Gateway's), the generation's for a request no route took. */
    const sl_tlog_policy_t *p = r->route ? r->route->tlog
                                : r->gen ? &r->gen->tlog
                                         : &sl_tlog_policy_default;
    unsigned dest = 0;
    if ((active & SL_TLOG_TO_LOG) && p->enabled &&
        (p->sample_ppm >= 1000000 || sl_lb_rng_next(&r->w->rng) % 1000000 < p->sample_ppm))
        dest = SL_TLOG_TO_LOG;
    /* Spans of sampled traces the gateway takes part in. */
    if ((active & SL_TLOG_TO_TRACE) && r->trace_state == SL_TRACE_OWN && (r->trace_flags & 1))
        dest |= SL_TLOG_TO_TRACE;
    if (!dest)
        return;
    sl_tlog_record_t e = {
        .dest = (uint8_t)dest,
        .start_unix_us = r->start_unix_us,
        .duration_us = dur,
        .bytes_received = r->bytes_received,
        .bytes_sent = r->bytes_sent,
        .fields = p->fields,
        .status = status,
        .minor_version = r->version == 10   ? 0
                         : r->version == 20 ? -1
                                            : 1,
        .retries = r->attempts > 1 ? r->attempts - 1 : 0,
    };
    if (r->upstream_head_us && r->upstream_start_us &&
        r->upstream_head_us >= r->upstream_start_us) {
        e.upstream_timed = 1;
        e.upstream_us = r->upstream_head_us - r->upstream_start_us;
    }
    if (r->upstream_start_us && r->upstream_start_us >= r->start_mono_us)
        e.upstream_off_us = (uint32_t)(r->upstream_start_us - r->start_mono_us);
    if (r->trace_state) {
        e.str[SL_TLOG_S_TRACE_ID] = (sl_str_t){r->trace_id, 32};
        if (r->trace_state == SL_TRACE_OWN) {
            e.str[SL_TLOG_S_SPAN_ID] = (sl_str_t){r->span_id, 16};
            e.str[SL_TLOG_S_UPSTREAM_SPAN_ID] = (sl_str_t){r->up_span_id, 16};
        }
        if (r->trace_parent)
            e.str[SL_TLOG_S_PARENT_ID] = (sl_str_t){r->parent_id, 16};
    }
    e.str[SL_TLOG_S_REQUEST_ID] = r->m_reqid;
    e.str[SL_TLOG_S_CLIENT] = (sl_str_t){r->client_ip, strlen(r->client_ip)};
    e.str[SL_TLOG_S_METHOD] = r->m_method;
    e.str[SL_TLOG_S_HOST] = r->m_host;
    e.str[SL_TLOG_S_PATH] = r->m_path;
    e.str[SL_TLOG_S_QUERY] = r->m_query;
    e.str[SL_TLOG_S_UPSTREAM] = (sl_str_t){r->upstream_addr, strlen(r->upstream_addr)};
    if (r->error_code)
        e.str[SL_TLOG_S_ERROR] = (sl_str_t){r->error_code, strlen(r->error_code)};
    e.str[SL_TLOG_S_USER_AGENT] = r->m_ua;
    e.str[SL_TLOG_S_REFERER] = r->m_referer;
    if (r->route) {
        e.str[SL_TLOG_S_API] = r->route->api;
        e.str[SL_TLOG_S_OPERATION] = r->route->operation;
    }
    if (r->pol) {
        const char *c = r->pol->v.consumer.name;
        if (c)
            e.str[SL_TLOG_S_CONSUMER] = (sl_str_t){c, strlen(c)};
        if (r->pol->replied && r->pol->v.rejected_by) {
            e.str[SL_TLOG_S_POLICY] =
                (sl_str_t){r->pol->v.rejected_by, strlen(r->pol->v.rejected_by)};
            /* Why: the reply's code and message ("invalid_api_key: ..."). */
            const char *code = r->pol->reply.code ? r->pol->reply.code : "";
            e.str[SL_TLOG_S_POLICY_REASON] =
                (sl_str_t){r->pol->reply.message,
                           strnlen(r->pol->reply.message, sizeof(r->pol->reply.message))};
            if (!e.str[SL_TLOG_S_POLICY_REASON].len)
                e.str[SL_TLOG_S_POLICY_REASON] = (sl_str_t){code, strlen(code)};
        }
        const char *cs = r->pol->v.cache_status;
        if (cs)
            e.str[SL_TLOG_S_CACHE] = (sl_str_t){cs, strlen(cs)};
    }
    if (sl_unlikely(r->tlog_headers[0]))
        e.str[SL_TLOG_S_REQUEST_HEADERS] = (sl_str_t){r->tlog_headers[0], r->tlog_headers_len[0]};
    if (sl_unlikely(r->tlog_headers[1]))
        e.str[SL_TLOG_S_RESPONSE_HEADERS] = (sl_str_t){r->tlog_headers[1], r->tlog_headers_len[1]};
    if (sl_unlikely(r->tlog_body[0] || r->tlog_body[1])) {
        char meta[2][SL_TLOG_BODY_META_MAX];
        char *scratch[2] = {NULL, NULL};
        if (dest & SL_TLOG_TO_LOG) {
            body_record(r, p, 0, &e, meta[0], &scratch[0]);
            body_record(r, p, 1, &e, meta[1], &scratch[1]);
        }
        sl_tlog_write(r->w->id, &e);
        free(scratch[0]);
        free(scratch[1]);
        return;
    }
    sl_tlog_write(r->w->id, &e);
}

void sl_request_upstream_head(sl_request_t *r, const sl_header_t *headers, size_t n)
{
    if (!sl_request_timed(r))
        return;
    r->upstream_head_us = now_mono_us();
    if (sl_unlikely(r->gen && (r->gen->tlog_headers_wanted & 2)))
        capture_headers(r, 1, headers, n);
    if (sl_unlikely(r->gen && (r->gen->tlog_bodies_wanted & 2)))
        body_capture_begin(r, 1, headers, n);
}

/* ---- routing -------------------------------------------------------------- */

static void set_error(sl_request_error_t *err, int status, const char *code, int close,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void set_error(sl_request_error_t *err, int status, const char *code, int close,
                      const char *fmt, ...)
{
    err->status = status;
    err->code = code;
    err->close = (uint8_t)close;
    err->allow = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
}

/* The consistent-hash key of the request, from the backend's hash source. */
static void hash_key(sl_request_t *r, const sl_req_head_t *h)
{
    const Sluice__V1__Cluster *pb = r->cluster->pb;
    if (pb->lb_policy != SLUICE__V1__CLUSTER__LB_POLICY__CONSISTENT_HASH)
        return;
    switch (pb->hash_on) {
    case SLUICE__V1__CLUSTER__HASH_ON__HASH_HEADER: {
        const sl_header_t *f = find_header(h, pb->hash_key, strlen(pb->hash_key));
        r->hash = f ? sl_lb_hash(f->value.ptr, f->value.len) : sl_lb_rng_next(&r->w->rng);
        return;
    }
    case SLUICE__V1__CLUSTER__HASH_ON__HASH_COOKIE: {
        const sl_header_t *f = find_header(h, "cookie", 6);
        size_t klen = strlen(pb->hash_key);
        r->hash = sl_lb_rng_next(&r->w->rng);
        if (!f)
            return;
        const char *p = f->value.ptr, *end = p + f->value.len;
        while (p < end) {
            while (p < end && (*p == ' ' || *p == ';'))
                p++;
            const char *eq = memchr(p, '=', (size_t)(end - p));
            if (!eq)
                return;
            const char *vend = memchr(eq, ';', (size_t)(end - eq));
            if (!vend)
                vend = end;
            if ((size_t)(eq - p) == klen && memcmp(p, pb->hash_key, klen) == 0) {
                r->hash = sl_lb_hash(eq + 1, (size_t)(vend - eq - 1));
                return;
            }
            p = vend;
        }
        return;
    }
    case SLUICE__V1__CLUSTER__HASH_ON__HASH_CLIENT_IP:
    default:
        r->hash = sl_lb_hash(r->client_ip, strlen(r->client_ip));
        return;
    }
}

/* A request attribute that makes up the success-rate scoring key. Query
 * parameters are matched and returned raw (not percent-decoded). */
static int srate_attr(void *ctx, const Sluice__V1__SuccessRate__Key *key, const char **value,
                      size_t *len)
{
    const sl_req_head_t *h = ctx;
    size_t nlen = strlen(key->name);
    if (key->source == SLUICE__V1__SUCCESS_RATE__KEY__SOURCE__HEADER) {
        const sl_header_t *f = find_header(h, key->name, nlen);
        if (!f)
            return 0;
        *value = f->value.ptr;
        *len = f->value.len;
        return 1;
    }
    const char *p = h->query.ptr, *end = p + h->query.len;
    while (p < end) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        const char *pe = amp ? amp : end;
        const char *eq = memchr(p, '=', (size_t)(pe - p));
        const char *ne = eq ? eq : pe;
        if ((size_t)(ne - p) == nlen && memcmp(p, key->name, nlen) == 0) {
            *value = eq ? eq + 1 : pe;
            *len = eq ? (size_t)(pe - eq - 1) : 0;
            return 1;
        }
        p = pe + 1;
    }
    return 0;
}

/* Success-rate routing over a list of n backends (the route's backendRefs,
 * or a rule's output): the best for the key (hash, name) first, then the
 * others by score, the order retries move down, keeping those that take the
 * same upstream head as the pick (as apply_choice does for rules). The pick
 * is taken whatever its endpoints' state: sl_request_pick_endpoint moves
 * down the list when it has no endpoint to take the request (honouring
 * maxEjectionPercent as every pick does) and scores that as its connect
 * failure. */
static void srate_choose(sl_request_t *r, sl_srate_route_t *sr, const uint32_t *weights,
                         sl_gen_cluster_t *const *clusters, size_t n, uint64_t hash,
                         const char *name)
{
    uint8_t order[SL_SRATE_MAX_BACKENDS];
    if (n > SL_SRATE_MAX_BACKENDS)
        n = SL_SRATE_MAX_BACKENDS;
    sl_srate_pick(sr, weights, n, hash, name, r->start_mono_us / 1000, &r->w->rng, &r->sr_pick,
                  NULL, order);
    if (n > SL_ROUTE_CHOICES_MAX)
        n = SL_ROUTE_CHOICES_MAX;
    sl_gen_cluster_t *pick = clusters[order[0]];
    r->choices[0] = pick;
    r->sr_gidx[0] = sr->gidx[order[0]];
    size_t m = 1;
    for (size_t i = 1; i < n; i++) {
        sl_gen_cluster_t *c = clusters[order[i]];
        if (sl_likely(c->pb->protocol == pick->pb->protocol &&
                      c->host_rewrite.len == pick->host_rewrite.len) &&
            (c->host_rewrite.len == 0 ||
             memcmp(c->host_rewrite.ptr, pick->host_rewrite.ptr, c->host_rewrite.len) == 0)) {
            r->sr_gidx[m] = sr->gidx[order[i]];
            r->choices[m++] = c;
        }
    }
    r->num_choices = (uint8_t)m;
    r->choice = 0;
    r->cluster = pick;
    r->sr = sr;
}

/* Success-rate routing among the route's backendRefs. */
static int pick_by_success_rate(sl_request_t *r, const sl_req_head_t *h)
{
    sl_gen_route_t *rt = r->route;
    char name[SL_SRATE_KEY_NAME_MAX];
    uint64_t hash = sl_srate_key(rt->srate, srate_attr, (void *)h, name);
    if (rt->srate->num_backends == 0)
        return -1;
    srate_choose(r, rt->srate, rt->backend_weights, rt->backends, rt->srate->num_backends, hash,
                 name);
    return 0;
}

/* ---- the decision API (docs/routing.md "The decision API") ------------------ */

/* Where the scoring key's attributes come from: the request itself, or the
 * `attributes` object of a JSON body ({"headers": {...}, "query": {...}}). */
typedef struct {
    const sl_req_head_t *h;
    json_t *attrs; /* NULL: the request's own */
} action_attrs_t;

static int action_attr(void *ctx, const Sluice__V1__SuccessRate__Key *key, const char **value,
                       size_t *len)
{
    action_attrs_t *a = ctx;
    if (!a->attrs)
        return srate_attr((void *)a->h, key, value, len);
    int header = key->source == SLUICE__V1__SUCCESS_RATE__KEY__SOURCE__HEADER;
    json_t *obj = json_object_get(a->attrs, header ? "headers" : "query");
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v)
    {
        if (!json_is_string(v))
            continue;
        if (header ? strcasecmp(k, key->name) == 0 : strcmp(k, key->name) == 0) {
            *value = json_string_value(v);
            *len = json_string_length(v);
            return 1;
        }
    }
    return 0;
}

/* "ns/name" -> "name": Backends are referenced in their Api's namespace. */
static const char *short_backend(const char *cluster)
{
    const char *s = strchr(cluster, '/');
    return s ? s + 1 : cluster;
}

typedef struct {
    size_t idx;
    const sl_srate_score_t *s;
    uint32_t weight;
} fallback_t;

static int cmp_fallback(const void *a, const void *b)
{
    const fallback_t *x = a, *y = b;
    if (x->s && y->s) {
        if (x->s->eliminated != y->s->eliminated)
            return x->s->eliminated - y->s->eliminated;
        if (x->s->score_ppm != y->s->score_ppm)
            return x->s->score_ppm > y->s->score_ppm ? -1 : 1;
    }
    if (x->weight != y->weight)
        return x->weight > y->weight ? -1 : 1;
    return x->idx < y->idx ? -1 : 1;
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The answer (body, n: in the request's arena) as the chain's reply. */
static int action_reply(sl_request_t *r, char *body, size_t n, sl_request_error_t *err)
{
    sl_req_policy_t *p = r->pol;
    if (!body) {
        set_error(err, 503, "overloaded", 0, "the answer does not fit the request's memory");
        return SL_ERROR;
    }
    const char *code =
        r->route->pb->action == SLUICE__V1__ROUTE__ACTION__DECIDE ? "decide" : "feedback";
    p->reply.status = 200;
    p->reply.code = code;
    p->reply.message[0] = '\0';
    p->reply.num_headers = 0;
    p->reply.body = body;
    p->reply.body_len = n;
    p->reply.content_type = "application/json";
    p->replied = 1;
    set_error(err, 200, code, 0, "%s", "");
    return SL_ERROR;
}

/* The answer's JSON into the request's arena, as the chain's reply. */
static int action_answer(sl_request_t *r, json_t *doc, sl_request_error_t *err)
{
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    size_t n = text ? strlen(text) : 0;
    char *body = text ? sl_policy_alloc(&r->pol->v, n) : NULL;
    if (body)
        memcpy(body, text, n);
    free(text);
    return action_reply(r, body, n, err);
}

/*
 * A decision's answer is written straight into the request's arena: built
 * as jansson objects and dumped (every double through printf's %.17g), it
 * was 85% of a decision's instructions (callgrind: about 80,000 per
 * decision). The writer is given an upper bound of what it writes, so it
 * never checks for room per byte.
 */
typedef struct {
    char *p;
    size_t len;
} jw_t;

/* The most jw_str writes for n bytes: each escaped in 6 bytes (\u00 and
 * two hex digits, or \ufffd), and the two quotes. */
#define JW_STR_MAX(n) (6 * (n) + 2)

static void jw_lit(jw_t *w, const char *s, size_t n)
{
    memcpy(w->p + w->len, s, n);
    w->len += n;
}

/* s: a string literal (sizeof of a pointer would cut it). */
#define JW_LIT(w, s) jw_lit((w), "" s, sizeof(s) - 1)

/* A JSON string: valid UTF-8 as it is, control characters escaped, a byte
 * that is not UTF-8 (a key cut in the middle of a character, obs-text in
 * a header) as U+FFFD, so the answer is always valid JSON. */
static void jw_str(jw_t *w, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s);
    w->p[w->len++] = '"';
    for (size_t i = 0; i < n;) {
        unsigned char c = u[i];
        if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
            w->p[w->len++] = (char)c;
            i++;
            continue;
        }
        if (c == '"' || c == '\\') {
            w->p[w->len++] = '\\';
            w->p[w->len++] = (char)c;
            i++;
            continue;
        }
        size_t v = c >= 0x80 ? sl_utf8_valid_len(u + i, n - i) : 0;
        if (v) {
            jw_lit(w, s + i, v);
            i += v;
        } else if (c >= 0x80) {
            JW_LIT(w, "\\ufffd");
            i++;
        } else {
            char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            jw_lit(w, e, sizeof(e));
            i++;
        }
    }
    w->p[w->len++] = '"';
}

static void jw_u64(jw_t *w, uint64_t v)
{
    w->len += sl_fmt_u64(w->p + w->len, v);
}

/* v / 10^digits as a JSON number with at least one decimal ("1.0",
 * "0.992", "3.25"): scores are per million, times in ns. digits <= 18. */
static void jw_fixed(jw_t *w, uint64_t v, unsigned digits)
{
    uint64_t scale = 1;
    for (unsigned i = 0; i < digits; i++)
        scale *= 10;
    jw_u64(w, v / scale);
    w->p[w->len++] = '.';
    uint64_t frac = v % scale;
    char d[20];
    for (unsigned i = digits; i--;) {
        d[i] = (char)('0' + frac % 10);
        frac /= 10;
    }
    unsigned n = digits;
    while (n > 1 && d[n - 1] == '0')
        n--;
    jw_lit(w, d, n);
}

/* Rule attributes from a decision's JSON `attributes` ({"headers": {...},
 * "query": {...}, "cookies": {...}, "method": "POST", "clientIp": "...",
 * "body": {...}}), or from the request itself (attrs NULL). The request's
 * own consumer, group and claims (its policies ran) are used either way.
 * Path parameters are not attributes of a decision. Strings are the JSON
 * document's or in `mem` (the caller frees it). */
#define ACTION_MAX_HEADERS 64
typedef struct {
    sl_header_t headers[ACTION_MAX_HEADERS + 1];
    char *mem;
} action_rule_attrs_t;

static void json_query_append(struct evbuffer *b, const char *s, size_t n)
{
    static const char hexd[] = "0123456789ABCDEF";
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (isalnum(ch) || ch == '-' || ch == '.' || ch == '_' || ch == '~') {
            evbuffer_add(b, &s[i], 1);
        } else {
            char e[3] = {'%', hexd[ch >> 4], hexd[ch & 15]};
            evbuffer_add(b, e, 3);
        }
    }
}

static void decision_rule_attrs(sl_request_t *r, const sl_req_head_t *h, json_t *attrs,
                                action_rule_attrs_t *m, sl_route_attrs_t *a)
{
    memset(a, 0, sizeof(*a));
    m->mem = NULL;
    a->client_ip = r->client_ip;
    if (r->pol) {
        a->consumer = r->pol->v.consumer.name;
        a->consumer_group = r->pol->v.consumer.group;
        a->claims = r->pol->v.jwt_claims;
    }
    if (!attrs) {
        a->method = h->method;
        a->query = h->query;
        a->headers = h->headers;
        a->num_headers = h->num_headers;
        return;
    }
    const char *k;
    json_t *v;
    size_t nh = 0;
    json_object_foreach(json_object_get(attrs, "headers"), k, v)
    {
        if (json_is_string(v) && nh < ACTION_MAX_HEADERS)
            m->headers[nh++] =
                (sl_header_t){{k, strlen(k)}, {json_string_value(v), json_string_length(v)}};
    }
    /* The query and the Cookie field are assembled in one buffer. */
    struct evbuffer *b = evbuffer_new();
    size_t qlen = 0, clen = 0;
    if (b) {
        json_object_foreach(json_object_get(attrs, "query"), k, v)
        {
            if (!json_is_string(v))
                continue;
            if (evbuffer_get_length(b))
                evbuffer_add(b, "&", 1);
            json_query_append(b, k, strlen(k));
            evbuffer_add(b, "=", 1);
            json_query_append(b, json_string_value(v), json_string_length(v));
        }
        qlen = evbuffer_get_length(b);
        json_object_foreach(json_object_get(attrs, "cookies"), k, v)
        {
            if (!json_is_string(v))
                continue;
            if (evbuffer_get_length(b) > qlen)
                evbuffer_add(b, "; ", 2);
            evbuffer_add_printf(b, "%s=%s", k, json_string_value(v));
        }
        clen = evbuffer_get_length(b) - qlen;
        size_t len = evbuffer_get_length(b);
        m->mem = malloc(len + 1);
        if (m->mem) {
            evbuffer_remove(b, m->mem, len);
            m->mem[len] = '\0';
        }
        evbuffer_free(b);
    }
    if (m->mem) {
        a->query = (sl_str_t){m->mem, qlen};
        if (clen && nh < ACTION_MAX_HEADERS)
            m->headers[nh++] = (sl_header_t){{"cookie", 6}, {m->mem + qlen, clen}};
    }
    a->headers = m->headers;
    a->num_headers = nh;
    json_t *method = json_object_get(attrs, "method");
    if (json_is_string(method))
        a->method = (sl_str_t){json_string_value(method), json_string_length(method)};
    else
        a->method = h->method;
    json_t *ip = json_object_get(attrs, "clientIp");
    if (json_is_string(ip))
        a->client_ip = json_string_value(ip);
    a->body = json_object_get(attrs, "body");
}

/* What a decision chooses from: the output of the rule that matched (or the
 * default), or the route's backendRefs. */
typedef struct {
    const char *rule;     /* the rule's name; NULL = the default or backendRefs */
    sl_route_choice_t ch; /* clusters: ranked, or as written when sr */
    sl_srate_route_t *sr; /* scored by success rate, else NULL */
    const uint32_t *weights;
    int ordered; /* ch is the pick and its fallbacks already */
} decision_list_t;

static void decision_list(sl_request_t *r, const sl_req_head_t *h, json_t *attrs,
                          decision_list_t *d)
{
    sl_gen_route_t *rt = r->route;
    memset(d, 0, sizeof(*d));
    if (rt->rules) {
        action_rule_attrs_t m;
        sl_route_attrs_t a;
        decision_rule_attrs(r, h, attrs, &m, &a);
        int rule = sl_route_rules_match(rt->rules, &a);
        free(m.mem);
        sl_route_rules_choose(rt->rules, rule, r->w->id, &d->ch);
        d->rule = rule >= 0 ? d->ch.rule_name : NULL;
        d->sr = d->ch.srate;
        d->weights = d->ch.weights;
        d->ordered = !d->sr;
        return;
    }
    size_t n = rt->num_backends < SL_ROUTE_CHOICES_MAX ? rt->num_backends : SL_ROUTE_CHOICES_MAX;
    d->ch.n = n;
    memcpy(d->ch.clusters, rt->backends, n * sizeof(*rt->backends));
    d->sr = rt->srate;
    d->weights = rt->backend_weights;
}

static int action_decide(sl_request_t *r, const sl_req_head_t *h, json_t *attrs,
                         sl_request_error_t *err)
{
    sl_gen_route_t *rt = r->route;
    uint64_t t0 = mono_ns();
    if (rt->num_backends == 0 && !rt->rules) {
        set_error(err, 503, "no_backend", 0, "the route has no backend");
        return SL_ERROR;
    }
    decision_list_t d;
    decision_list(r, h, attrs, &d);
    size_t n = d.ch.n;
    sl_srate_score_t scores[SL_SRATE_MAX_BACKENDS];
    sl_srate_pick_t pick;
    char key[SL_SRATE_KEY_NAME_MAX];
    uint8_t order[SL_SRATE_MAX_BACKENDS];
    action_attrs_t a = {h, attrs};
    if (d.sr) {
        /* The pick and the fallback by score: the order a proxied request
         * would try them in. */
        uint64_t hash = sl_srate_key(d.sr, action_attr, &a, key);
        sl_srate_pick(d.sr, d.weights, n, hash, key, sl_endpoint_now_ms(), &r->w->rng, &pick,
                      scores, order);
    } else if (d.ordered) {
        for (size_t i = 0; i < n; i++)
            order[i] = (uint8_t)i;
    } else {
        /* The weighted pick, the others by weight. */
        uint64_t x = sl_lb_rng_next(&r->w->rng) % rt->backend_weight_total;
        size_t idx;
        for (idx = 0; idx < n - 1 && x >= rt->backend_weights[idx]; idx++)
            x -= rt->backend_weights[idx];
        fallback_t fb[SL_ROUTE_CHOICES_MAX];
        size_t nfb = 0;
        for (size_t b = 0; b < n; b++)
            if (b != idx)
                fb[nfb++] = (fallback_t){b, NULL, rt->backend_weights[b]};
        qsort(fb, nfb, sizeof(*fb), cmp_fallback);
        order[0] = (uint8_t)idx;
        for (size_t i = 0; i < nfb; i++)
            order[i + 1] = (uint8_t)fb[i].idx;
    }
    uint64_t took_ns = mono_ns() - t0;
    /* {"backend":..,"fallback":[..],"strategy":..,"rule":..|null[,"key":..,
     * "explored":..,"scores":[{"backend":..,"score":..,"eliminated":..,
     * "eliminationScore":..,"outcomes":..},..]],"decisionMicros":..} */
    const char *names[SL_ROUTE_CHOICES_MAX];
    size_t bound = 256 + (d.rule ? JW_STR_MAX(strlen(d.rule)) : 0) +
                   (d.sr ? JW_STR_MAX(strlen(key)) : 0);
    for (size_t b = 0; b < n; b++) {
        names[b] = short_backend(d.ch.clusters[b]->pb->name);
        bound += 2 * JW_STR_MAX(strlen(names[b])) + 160;
    }
    jw_t w = {sl_policy_alloc(&r->pol->v, bound), 0};
    if (!w.p)
        return action_reply(r, NULL, 0, err);
    JW_LIT(&w, "{\"backend\":");
    jw_str(&w, names[order[0]]);
    JW_LIT(&w, ",\"fallback\":[");
    for (size_t i = 1; i < n; i++) {
        if (i > 1)
            JW_LIT(&w, ",");
        jw_str(&w, names[order[i]]);
    }
    if (d.sr)
        JW_LIT(&w, "],\"strategy\":\"success-rate\",\"rule\":");
    else
        JW_LIT(&w, "],\"strategy\":\"weighted\",\"rule\":");
    /* The rule that matched; null when the default or the backendRefs
     * decided. */
    if (d.rule)
        jw_str(&w, d.rule);
    else
        JW_LIT(&w, "null");
    if (d.sr) {
        JW_LIT(&w, ",\"key\":");
        jw_str(&w, key);
        if (pick.explored)
            JW_LIT(&w, ",\"explored\":true,\"scores\":[");
        else
            JW_LIT(&w, ",\"explored\":false,\"scores\":[");
        for (size_t b = 0; b < n; b++) {
            if (b)
                JW_LIT(&w, ",");
            JW_LIT(&w, "{\"backend\":");
            jw_str(&w, names[b]);
            JW_LIT(&w, ",\"score\":");
            jw_fixed(&w, scores[b].score_ppm, 6);
            if (scores[b].eliminated)
                JW_LIT(&w, ",\"eliminated\":true,\"eliminationScore\":");
            else
                JW_LIT(&w, ",\"eliminated\":false,\"eliminationScore\":");
            jw_fixed(&w, scores[b].elimination_ppm, 6);
            JW_LIT(&w, ",\"outcomes\":");
            jw_u64(&w, scores[b].outcomes);
            JW_LIT(&w, "}");
        }
        JW_LIT(&w, "]");
    }
    JW_LIT(&w, ",\"decisionMicros\":");
    jw_fixed(&w, took_ns, 3);
    JW_LIT(&w, "}");
    return action_reply(r, w.p, w.len, err);
}

static int action_feedback(sl_request_t *r, const sl_req_head_t *h, json_t *body,
                           sl_request_error_t *err)
{
    json_t *backend = json_object_get(body, "backend");
    json_t *outcome = json_object_get(body, "outcome");
    json_t *attrs = json_object_get(body, "attributes");
    if (attrs && !json_is_object(attrs)) {
        set_error(err, 400, "bad_feedback", 0,
                  "attributes: an object {\"headers\": {...}, \"query\": {...}}");
        return SL_ERROR;
    }
    /* The list the attributes route to (the rule's output, the default, the
     * backendRefs): its windows take the report. */
    decision_list_t d;
    decision_list(r, h, attrs, &d);
    if (!d.sr) {
        set_error(err, 409, "not_success_rate", 0,
                  "%s%s%s is not scored by success rate: set routing.strategy: success-rate on "
                  "the Api, the operation or the rule",
                  d.rule ? "rule '" : "this operation's routing", d.rule ? d.rule : "",
                  d.rule ? "'" : "");
        return SL_ERROR;
    }
    if (!json_is_string(backend)) {
        set_error(err, 400, "bad_feedback", 0,
                  "backend: required, the name of one of the Api's backendRefs");
        return SL_ERROR;
    }
    const char *o = json_string_value(outcome);
    int success = o && strcmp(o, "success") == 0;
    if (!o || (!success && strcmp(o, "failure") != 0)) {
        set_error(err, 400, "bad_feedback", 0, "outcome: required, \"success\" or \"failure\"");
        return SL_ERROR;
    }
    const char *want = json_string_value(backend);
    const char *cluster = NULL;
    for (size_t b = 0; b < d.ch.n; b++) {
        const char *name = d.ch.clusters[b]->pb->name;
        if (strcmp(name, want) == 0 || strcmp(short_backend(name), want) == 0)
            cluster = name;
    }
    if (!cluster) {
        set_error(err, 400, "bad_feedback", 0,
                  "backend: '%.100s' is not one of the backends %s%s%s", want,
                  d.rule ? "rule '" : "this operation chooses from", d.rule ? d.rule : "",
                  d.rule ? "' chooses from" : "");
        return SL_ERROR;
    }
    action_attrs_t a = {h, attrs};
    char key[SL_SRATE_KEY_NAME_MAX];
    uint64_t hash = sl_srate_key(d.sr, action_attr, &a, key);
    sl_srate_feedback(d.sr, hash, key, cluster, success, sl_endpoint_now_ms());
    json_t *doc =
        json_pack("{s:b, s:s, s:s, s:s}", "recorded", 1, "backend", short_backend(cluster), "key",
                  key, "outcome", success ? "success" : "failure");
    if (doc)
        json_object_set_new(doc, "rule", d.rule ? json_string(d.rule) : json_null());
    return action_answer(r, doc, err);
}

/* A decide or feedback operation answers itself, from the request's
 * attributes, or from its JSON body (body != NULL: read whole). */
static int action_run(sl_request_t *r, const sl_req_head_t *h, const char *body, size_t len,
                      sl_request_error_t *err)
{
    json_t *doc = NULL;
    if (body && len) {
        json_error_t je;
        doc = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
        if (!json_is_object(doc)) {
            json_decref(doc);
            set_error(err, 400, "bad_json", 0, "the body must be a JSON object (line %d: %.100s)",
                      je.line, je.text);
            return SL_ERROR;
        }
    }
    int rc;
    if (r->route->pb->action == SLUICE__V1__ROUTE__ACTION__DECIDE) {
        json_t *attrs = doc ? json_object_get(doc, "attributes") : NULL;
        if (doc && !attrs)
            attrs = doc; /* the body is the attributes object itself */
        rc = action_decide(r, h, attrs, err);
    } else {
        if (!doc) {
            set_error(err, 400, "bad_feedback", 0,
                      "send a JSON body: {\"backend\": ..., \"attributes\": {...}, "
                      "\"outcome\": \"success\" | \"failure\"}");
            rc = SL_ERROR;
        } else {
            rc = action_feedback(r, h, doc, err);
        }
    }
    json_decref(doc);
    return rc;
}

/* The largest JSON body a decide or feedback operation reads. */
#define SL_ACTION_MAX_BODY 65536

static int action_route(sl_request_t *r, const sl_req_head_t *h, sl_request_error_t *err)
{
    sl_req_policy_t *p = r->pol;
    if (p->v.has_body) {
        /* Read first: sl_request_body_done answers. */
        uint64_t cap = SL_ACTION_MAX_BODY;
        if (r->max_body_bytes && r->max_body_bytes < cap)
            cap = r->max_body_bytes;
        if (cap > p->body_cap)
            p->body_cap = cap;
        if (h->has_length && h->content_length > p->body_cap) {
            set_error(err, 413, "payload_too_large", 1,
                      "the request body exceeds the limit of %llu bytes",
                      (unsigned long long)p->body_cap);
            return SL_ERROR;
        }
        if (r->route->num_backends == 0 && !r->route->rules) {
            set_error(err, 503, "no_backend", 0, "the route has no backend");
            return SL_ERROR;
        }
        /* The codecs prepare an upstream head while the body is read, as
         * for any request whose body a policy reads; it is never sent, and
         * the cluster is cleared before the answer (no backend counts it). */
        r->cluster =
            r->route->rules ? sl_route_rules_head_cluster(r->route->rules) : r->route->backends[0];
        return SL_OK;
    }
    return action_run(r, h, NULL, 0, err);
}

/* The backend of the route, by weight. */
static int pick_cluster(sl_request_t *r, const sl_req_head_t *h)
{
    sl_gen_route_t *rt = r->route;
    if (rt->num_backends == 0)
        return -1;
    if (sl_unlikely(rt->srate != NULL))
        return pick_by_success_rate(r, h);
    size_t idx = 0;
    if (rt->num_backends > 1) {
        uint64_t x = sl_lb_rng_next(&r->w->rng) % rt->backend_weight_total;
        for (idx = 0; idx < rt->num_backends; idx++) {
            if (x < rt->backend_weights[idx])
                break;
            x -= rt->backend_weights[idx];
        }
        if (idx >= rt->num_backends)
            idx = rt->num_backends - 1;
    }
    r->cluster = rt->backends[idx];
    return 0;
}

/* The route's `routing` rules choose the backend and its fallbacks, after
 * the policies (the consumer and the token's claims are theirs). */
static void apply_choice(sl_request_t *r, const sl_route_choice_t *ch);

static void rule_attrs(sl_request_t *r, const sl_req_head_t *h, sl_str_t routed_path,
                       size_t base_path_len, sl_route_attrs_t *out)
{
    sl_route_attrs_t a = {
        .method = h->method,
        .rel_path = {routed_path.ptr + base_path_len, routed_path.len - base_path_len},
        .query = h->query,
        .headers = h->headers,
        .num_headers = h->num_headers,
        .client_ip = r->client_ip,
    };
    if (r->pol) {
        a.consumer = r->pol->v.consumer.name;
        a.consumer_group = r->pol->v.consumer.group;
        a.claims = r->pol->v.jwt_claims;
    }
    *out = a;
}

static void route_by_rules(sl_request_t *r, const sl_req_head_t *h, sl_str_t routed_path,
                           size_t base_path_len)
{
    sl_route_attrs_t a;
    rule_attrs(r, h, routed_path, base_path_len, &a);
    sl_route_choice_t ch;
    sl_route_rules_eval(r->route->rules, &a, r->w->id, &ch);
    if (ch.srate) {
        char name[SL_SRATE_KEY_NAME_MAX];
        uint64_t hash = sl_srate_key(ch.srate, srate_attr, (void *)h, name);
        srate_choose(r, ch.srate, ch.weights, ch.clusters, ch.n, hash, name);
        return;
    }
    apply_choice(r, &ch);
}

/* Rules that read the body: the head's conditions now, the choice once the
 * body is read (sl_request_body_done); meanwhile the upstream head is
 * written for a cluster of the block (all take the same head). */
static void defer_rules(sl_request_t *r, const sl_req_head_t *h, sl_str_t routed_path,
                        size_t base_path_len)
{
    sl_route_attrs_t a;
    rule_attrs(r, h, routed_path, base_path_len, &a);
    sl_route_rules_defer(r->route->rules, &a, &r->pol->rule_bits);
    r->pol->rules_deferred = 1;
    sl_srate_route_t *sr = sl_route_rules_any_srate(r->route->rules);
    if (sr)
        r->pol->sr_hash = sl_srate_key(sr, srate_attr, (void *)h, r->pol->sr_key);
    r->cluster = sl_route_rules_head_cluster(r->route->rules);
    r->num_choices = 0;
}

static void apply_choice(sl_request_t *r, const sl_route_choice_t *ch)
{
    _Static_assert(sizeof(r->choices) / sizeof(r->choices[0]) == SL_ROUTE_CHOICES_MAX,
                   "a choice fits the request");
    /* The first backend with a usable endpoint wins (the first listed when
     * none has: its error is the answer). It is chosen here, before the
     * upstream head is built for its protocol and Host; the fallbacks kept
     * for retries are the later ones that speak the same protocol with the
     * same Host, so that head stays right for them. */
    uint64_t now = sl_endpoint_now_ms();
    size_t first = 0;
    for (size_t i = 0; i < ch->n; i++) {
        const sl_gen_cluster_t *c = ch->clusters[i];
        int usable = 0;
        for (size_t e = 0; e < c->num_endpoints && !usable; e++)
            usable = sl_endpoint_usable(c->endpoints[e], now);
        if (usable) {
            first = i;
            break;
        }
    }
    sl_gen_cluster_t *pick = ch->clusters[first];
    size_t n = 0;
    r->choices[n++] = pick;
    for (size_t i = first + 1; i < ch->n; i++) {
        sl_gen_cluster_t *c = ch->clusters[i];
        if (c->pb->protocol == pick->pb->protocol &&
            c->host_rewrite.len == pick->host_rewrite.len &&
            (c->host_rewrite.len == 0 ||
             memcmp(c->host_rewrite.ptr, pick->host_rewrite.ptr, c->host_rewrite.len) == 0))
            r->choices[n++] = c;
    }
    r->num_choices = (uint8_t)n;
    r->choice = 0;
    r->cluster = pick;
}

/* Fault injection: an abort answers now; a delay is kept for the exchange
 * (sl_exchange_start waits it out before the first attempt). */
static int inject_faults(sl_request_t *r, const sl_req_head_t *h, sl_request_error_t *err)
{
    const Sluice__V1__Faults *f = r->route->faults;
    if (f->header[0] && !find_header(h, f->header, strlen(f->header)))
        return SL_OK;
    if (f->abort_ppm && sl_lb_rng_next(&r->w->rng) % 1000000 < f->abort_ppm) {
        SL_STAT_ADD(r->route->stats->slots[r->w->id].faults[1], 1);
        set_error(err, (int)f->abort_status, "fault_abort", 0, "fault injected by the gateway");
        return SL_ERROR;
    }
    if (f->delay_ppm && sl_lb_rng_next(&r->w->rng) % 1000000 < f->delay_ppm) {
        SL_STAT_ADD(r->route->stats->slots[r->w->id].faults[0], 1);
        r->fault_delay_ms = f->delay_ms;
    }
    return SL_OK;
}

static int hop_by_hop_name(sl_str_t n)
{
    static const char *const names[] = {"connection", "keep-alive", "te", "trailer",
                                        "transfer-encoding", "upgrade", "proxy-connection",
                                        "proxy-authorization", "host", "content-length",
                                        "expect", NULL};
    for (size_t i = 0; names[i]; i++)
        if (n.len == strlen(names[i]) && strncasecmp(n.ptr, names[i], n.len) == 0)
            return 1;
    return 0;
}

/* A copy of the request for the route's shadow Backend (mirror.h): now
 * when it has no body, when its body is read (sl_request_body_done) when a
 * policy or a rule reads it whole; a streamed body is not mirrored. */
static void mirror_request(sl_request_t *r, const sl_req_head_t *h, sl_str_t path)
{
    sl_gen_cluster_t *c = r->route->mirror;
    int has_body = !(h->has_length && h->content_length == 0);
    if (c->tls || (has_body && !(r->pol && r->pol->body_cap)) || h->num_headers > 128) {
        sl_mirror_skip();
        return;
    }
    uint64_t now = sl_endpoint_now_ms();
    size_t n = c->num_endpoints, start = n ? (size_t)(sl_lb_rng_next(&r->w->rng) % n) : 0;
    const sl_endpoint_state_t *ep = NULL;
    for (size_t i = 0; i < n && !ep; i++)
        if (sl_endpoint_usable(c->endpoints[(start + i) % n], now))
            ep = c->endpoints[(start + i) % n];
    if (!ep) {
        sl_mirror_skip();
        return;
    }
    char host_port[300];
    int v6 = strchr(ep->address, ':') != NULL;
    snprintf(host_port, sizeof(host_port), v6 ? "[%s]:%u" : "%s:%u", ep->address, ep->port);
    sl_str_t names[128], values[128];
    size_t k = 0;
    for (size_t i = 0; i < h->num_headers; i++) {
        if (hop_by_hop_name(h->headers[i].name))
            continue;
        names[k] = h->headers[i].name;
        values[k++] = h->headers[i].value;
    }
    struct sl_mirror_copy *cp = sl_mirror_prepare(host_port, h->method, path, h->query,
                                                  h->has_query, names, values, k);
    if (!cp)
        return;
    if (has_body)
        r->pol->mirror = cp;
    else
        sl_mirror_push(r->w->id, cp, NULL, 0);
}

static int clip(size_t len, size_t max)
{
    return (int)(len > max ? max : len);
}

/*
 * The Gateway's head limits (maxRequestLineBytes, maxHeaderCount,
 * maxHeaderBytes) for a head whose codec did not apply them while parsing:
 * the HTTP/1.1 parser does (sl_http1_parse_request), the HTTP/2 codec only
 * has its own per-connection bounds (h2.h). Measured on the HTTP/1.1 head
 * the request would be (request line, Host from :authority, one line per
 * field), so a request is within the limits over both protocols or neither.
 */
static int head_within_limits(const sl_generation_t *gen, const sl_req_head_t *h,
                              sl_request_error_t *err)
{
    if (h->version != 20)
        return SL_OK;
    const sl_http1_limits_t *lim = &gen->limits;
    size_t line = h->method.len + 1 + h->target.len + strlen(" HTTP/1.1");
    if (lim->max_request_line_bytes && line > lim->max_request_line_bytes) {
        set_error(err, 414, "uri_too_long", 0, "request line too long");
        return SL_ERROR;
    }
    size_t head = line + 2 + 2, count = h->num_headers;
    int host_sent = 0;
    for (size_t i = 0; i < h->num_headers; i++) {
        const sl_header_t *f = &h->headers[i];
        head += f->name.len + 2 + f->value.len + 2;
        host_sent |= f->name.len == 4 && strncasecmp(f->name.ptr, "host", 4) == 0;
    }
    if (!host_sent && h->authority.len) {
        head += strlen("Host: \r\n") + h->authority.len;
        count++;
    }
    if (lim->max_header_count && count > lim->max_header_count) {
        set_error(err, 431, "header_too_large", 0, "too many request headers");
        return SL_ERROR;
    }
    if (lim->max_header_bytes && head > lim->max_header_bytes) {
        set_error(err, 431, "header_too_large", 0, "request header section too large");
        return SL_ERROR;
    }
    return SL_OK;
}

static int run_policies(sl_request_t *r, const sl_req_head_t *h, sl_str_t path,
                        size_t base_path_len, sl_request_error_t *err);

/*
 * A CORS preflight (OPTIONS with Origin and Access-Control-Request-Method)
 * that the router refused with 405: routes it as the method it asks about.
 * SL_OK with *rr set when that method's operation has cors in its chain.
 */
static int preflight_route(const sl_generation_t *gen, const sl_req_head_t *h,
                           const sl_router_request_t *rq, sl_router_result_t *rr)
{
    const sl_header_t *acrm = find_header(h, "access-control-request-method", 29);
    if (!acrm || !acrm->value.len || !find_header(h, "origin", 6))
        return SL_DECLINED;
    sl_router_request_t as = *rq;
    as.method = acrm->value;
    as.method_bit = sl_http1_method_bit(acrm->value.ptr, acrm->value.len);
    if (as.method_bit == SL_METHOD_OPTIONS || sl_router_match(gen->router, &as, rr) != SL_OK)
        return SL_DECLINED;
    const sl_gen_route_t *rt = &gen->routes[rr->table_index][rr->route_index];
    return rt->chain && sl_policy_chain_has(rt->chain, "cors") ? SL_OK : SL_DECLINED;
}

int sl_request_route(sl_request_t *r, const sl_req_head_t *h, sl_str_t *path,
                     sl_request_error_t *err)
{
    sl_generation_t *gen = r->gen;
    if (!gen) {
        set_error(err, 503, "not_ready", 0, "the gateway has no configuration yet");
        return SL_ERROR;
    }
    if (head_within_limits(gen, h, err) != SL_OK)
        return SL_ERROR;
    /* Route and forward the normalised path: what a route matches is what
     * the backend sees (docs/routing.md, "Path normalisation"). */
    *path = h->path;
    if (h->path.len && h->path.ptr[0] == '/') {
        size_t nlen = 0;
        const char *why = NULL;
        int pr = sl_path_normalize(h->path.ptr, h->path.len, worker_path, sizeof(worker_path),
                                   &gen->path_opts, &nlen, &why);
        if (pr == SL_ERROR) {
            set_error(err, 400, "bad_path", 0, "%s", why ? why : "the path cannot be normalised");
            return SL_ERROR;
        }
        if (pr == SL_OK)
            *path = (sl_str_t){worker_path, nlen};
    }

    sl_router_request_t rq = {
        .host = h->host,
        .path = *path,
        .query = h->query,
        .method_bit = h->method_bit,
        .method = h->method,
        .headers = h->headers,
        .num_headers = h->num_headers,
    };
    sl_router_result_t rr;
    int m = sl_router_match(gen->router, &rq, &rr);
    /* A CORS preflight asks about another method than its own: when the
     * path has no OPTIONS operation, the operation of the method it names
     * answers it, if that operation's chain has cors (docs/policies/cors.md).
     * Anything else keeps the 405. */
    int preflight = 0;
    unsigned preflight_allow = 0;
    if (m == 405 && h->method_bit == SL_METHOD_OPTIONS) {
        preflight_allow = rr.allow_methods;
        preflight = preflight_route(gen, h, &rq, &rr) == SL_OK;
        if (preflight)
            m = SL_OK;
        else
            rr.allow_methods = preflight_allow;
    }
    if (m == SL_ERROR) {
        set_error(err, 503, "overloaded", 1, "out of memory while routing");
        return SL_ERROR;
    }
    if (m != SL_OK) {
        if (m == 405) {
            set_error(err, 405, "method_not_allowed", 0, "method %.*s is not allowed on %.*s",
                      clip(h->method.len, 20), h->method.ptr, clip(path->len, 200), path->ptr);
            err->allow = rr.allow_methods;
        } else {
            set_error(err, 404, "no_route", 0, "no route for %.*s %.*s", clip(h->method.len, 20),
                      h->method.ptr, clip(path->len, 200), path->ptr);
        }
        return SL_ERROR;
    }
    r->route = &gen->routes[rr.table_index][rr.route_index];
    if (r->route->strip_base_path && rr.base_path_len) {
        path->ptr += rr.base_path_len;
        path->len -= rr.base_path_len;
    }
    r->max_body_bytes = r->route->max_request_body_bytes;
    if (r->max_body_bytes && h->has_length && h->content_length > r->max_body_bytes) {
        set_error(err, 413, "payload_too_large", 1,
                  "the request body exceeds the limit of this API");
        return SL_ERROR;
    }
    /* Fail closed: a route whose chain could not be built is not served
     * without it (the log and the Api's status say why). */
    if (sl_unlikely(r->route->policy_error)) {
        set_error(err, 503, "policy_unavailable", 0,
                  "a policy of this API cannot be applied; the API is not served without it");
        return SL_ERROR;
    }
    if (sl_unlikely(r->route->faults) && inject_faults(r, h, err) != SL_OK)
        return SL_ERROR;
    int rules_body = sl_unlikely(r->route->rules != NULL) &&
                     sl_route_rules_reads_body(r->route->rules);
    if (r->route->chain || rules_body || sl_unlikely(r->route->pb->action)) {
        if (run_policies(r, h, rq.path, rr.base_path_len, err) != SL_OK)
            return SL_ERROR;
        /* Rules on the JSON body: it is read whole first (and forwarded
         * unchanged), at most routing.maxBodyBytes. */
        if (rules_body && r->pol->v.has_body &&
            sl_route_rules_body_max(r->route->rules) > r->pol->body_cap)
            r->pol->body_cap = sl_route_rules_body_max(r->route->rules);
        /* A preflight routed to another method's operation that cors did
         * not answer (a `when` skipped it) is not forwarded as that. */
        if (preflight) {
            set_error(err, 405, "method_not_allowed", 0, "method OPTIONS is not allowed on %.*s",
                      clip(path->len, 200), path->ptr);
            err->allow = preflight_allow;
            return SL_ERROR;
        }
        /* request-size: the lower limit holds, while the body streams too. */
        uint64_t pol_max = r->pol->v.max_body_bytes;
        if (pol_max && (!r->max_body_bytes || pol_max < r->max_body_bytes))
            r->max_body_bytes = pol_max;
        if (r->max_body_bytes && h->has_length && h->content_length > r->max_body_bytes) {
            set_error(err, 413, "payload_too_large", 1,
                      "the request body exceeds the limit of this API");
            return SL_ERROR;
        }
        /* A body a policy reads: never more than the route lets through. */
        uint64_t cap = r->pol->body_cap;
        if (cap && r->max_body_bytes && r->max_body_bytes < cap)
            cap = r->pol->body_cap = r->max_body_bytes;
        if (cap && h->has_length && h->content_length > cap) {
            set_error(err, 413, "payload_too_large", 1,
                      "the request body exceeds the limit of %llu bytes", (unsigned long long)cap);
            return SL_ERROR;
        }
    }
    /* An operation that answers a routing decision itself (action: decide
     * or feedback) proxies nothing. */
    if (sl_unlikely(r->route->pb->action))
        return action_route(r, h, err);
    if (sl_unlikely(r->route->rules)) {
        if (rules_body && r->pol->body_cap)
            defer_rules(r, h, rq.path, rr.base_path_len);
        else
            route_by_rules(r, h, rq.path, rr.base_path_len);
    } else if (pick_cluster(r, h) != 0) {
        set_error(err, 503, "no_backend", 0, "the route has no backend");
        return SL_ERROR;
    }
    hash_key(r, h);
    if (sl_unlikely(r->route->mirror) &&
        sl_lb_rng_next(&r->w->rng) % 1000000 < r->route->mirror_ppm)
        mirror_request(r, h, *path);
    if (sl_unlikely(gen->tlog_bodies_wanted & 1))
        body_capture_begin(r, 0, h->headers, h->num_headers);
    if (r->route->timeouts.request_ms)
        r->deadline_ms = sl_endpoint_now_ms() + r->route->timeouts.request_ms;
    /* A gRPC client's deadline is the request's, when it is the shorter. */
    if (r->grpc_timeout_ms) {
        uint64_t d = sl_endpoint_now_ms() + r->grpc_timeout_ms;
        if (!r->deadline_ms || d < r->deadline_ms)
            r->deadline_ms = d;
    }
    return SL_OK;
}

/* ---- policies ------------------------------------------------------------------ */

_Static_assert(sizeof(sl_policy_header_t) == sizeof(sl_header_t) &&
                   offsetof(sl_policy_header_t, value) == offsetof(sl_header_t, value),
               "policies read the codecs' header arrays as they are");

/* Runs the route's chain on the request. SL_OK to go on, or SL_ERROR with
 * *err: the chain's short-circuit (sl_request_reply has the rest). */
/* A copy of s in the request's arena, or an empty string when it is full. */
static sl_str_t keep(sl_policy_req_t *v, sl_str_t s)
{
    char *c = s.len ? sl_policy_alloc(v, s.len) : NULL;
    if (!c)
        return (sl_str_t){"", 0};
    memcpy(c, s.ptr, s.len);
    return (sl_str_t){c, s.len};
}

/* The request head's slices live in the codec's buffers, which hold the
 * next request (or the response) by the time response hooks run: from now
 * on the view keeps copies of what a response hook may read (method, host,
 * path) and no longer offers headers or the query. The chain's conditions
 * were judged on the request already (sl_policy_req_t.applied). */
static void detach_view(sl_policy_req_t *v)
{
    v->method = keep(v, v->method);
    v->host = keep(v, v->host);
    v->path = keep(v, v->path);
    v->query = (sl_str_t){"", 0};
    v->headers = NULL;
    v->num_headers = 0;
}

static int policy_replied(sl_request_t *r, sl_request_error_t *err);

static int run_policies(sl_request_t *r, const sl_req_head_t *h, sl_str_t path,
                        size_t base_path_len, sl_request_error_t *err)
{
    sl_req_policy_t *p = r->pol;
    if (!p) {
        sl_worker_t *w = r->w;
        p = w && w->num_policy_states ? w->policy_states[--w->num_policy_states]
                                      : malloc(sizeof(*p));
        if (!p) {
            set_error(err, 503, "overloaded", 0, "out of memory");
            return SL_ERROR;
        }
        /* A cached state's claims and body were released by sl_request_reset. */
        p->v.jwt_claims = NULL;
        p->mirror = NULL;
        p->body = (sl_buf_t){0};
        r->pol = p;
    }
    sl_policy_req_end(&p->v);
    sl_buf_free(&p->body);
    p->replied = p->responded = 0;
    p->body_cap = 0;
    p->rules_deferred = 0;
    p->mirror = NULL;
    memset(&p->v, 0, sizeof(p->v));
    /* The reply is cleared by sl_policy_chain_request: this memory was
     * another request's, and its reply must not leak into this one. */
    p->v.method = h->method;
    p->v.host = h->host;
    p->v.path = path;
    p->v.query = h->query;
    p->v.headers = (const sl_policy_header_t *)h->headers;
    p->v.num_headers = h->num_headers;
    p->v.client_ip = r->client_ip;
    p->v.api = r->route->table->name;
    p->v.operation = r->route->pb->name;
    const Sluice__V1__Route *pb = r->route->pb;
    p->v.route_path = (sl_str_t){pb->path, strlen(pb->path)};
    p->v.route_path_template = pb->path_kind == SLUICE__V1__ROUTE__PATH_KIND__TEMPLATE;
    p->v.base_path_len = base_path_len;
    p->v.route_methods = (const char *const *)pb->methods;
    p->v.num_route_methods = pb->n_methods;
    p->v.grpc = r->grpc;
    p->v.has_body = !(h->has_length && h->content_length == 0);
    p->v.now_ms = sl_endpoint_now_ms();
    p->v.worker = r->w->id;
    p->v.req_edits = p->edits[0];
    p->v.resp_edits = p->edits[1];
    p->v.max_edits = SL_REQ_POLICY_EDITS;
    p->v.arena = p->arena;
    p->v.arena_cap = sizeof(p->arena);
    char *id = sl_policy_alloc(&p->v, r->m_reqid.len + 1);
    if (id) {
        memcpy(id, r->m_reqid.ptr, r->m_reqid.len);
        id[r->m_reqid.len] = '\0';
        p->v.request_id = id;
    }
    int rc = sl_policy_chain_request(r->route->chain, &p->v, &p->reply);
    detach_view(&p->v);
    if (rc == SL_POLICY_CONTINUE && sl_unlikely(p->v.body_entries)) {
        /* A body was asked for. None to read: the hooks see it empty now. */
        if (p->v.has_body)
            p->body_cap = p->v.body_max_bytes;
        else
            rc = sl_policy_chain_body(r->route->chain, &p->v, "", 0, &p->reply);
    }
    if (rc == SL_POLICY_CONTINUE)
        return SL_OK;
    return policy_replied(r, err);
}

/* The chain answered the request (p->reply): count it against the policy
 * that did, and hand the codec its status and message. */
static int policy_replied(sl_request_t *r, sl_request_error_t *err)
{
    sl_req_policy_t *p = r->pol;
    p->replied = 1;
    if (p->reply.status >= 400 && r->route->policy_stats &&
        r->route->policy_stats[p->v.rejected_index]) {
        SL_STAT_ADD(r->route->policy_stats[p->v.rejected_index]->slots[r->w->id].rejections, 1);
        sl_policy_stats_t *scope =
            r->route->scope_stats ? r->route->scope_stats[p->v.rejected_index] : NULL;
        if (scope && r->w->id < scope->nslots) {
            /* A rate limit: over the limit (429), or unavailable (503:
             * its Redis is unreachable and failOpen is false). */
            if (p->reply.status == 429)
                SL_STAT_ADD(scope->slots[r->w->id].rejections, 1);
            else
                SL_STAT_ADD(scope->slots[r->w->id].unavailable, 1);
        }
    }
    set_error(err, p->reply.status, p->reply.code, 0, "%s", p->reply.message);
    return SL_ERROR;
}

int sl_request_body_add(sl_request_t *r, const void *p, size_t n, sl_request_error_t *err)
{
    sl_req_policy_t *pol = r->pol;
    if (n > pol->body_cap - sl_buf_len(&pol->body)) {
        set_error(err, 413, "payload_too_large", 1,
                  "the request body exceeds the limit of %llu bytes",
                  (unsigned long long)pol->body_cap);
        return SL_ERROR;
    }
    if (n && sl_buf_append(&pol->body, p, n) != 0) {
        set_error(err, 503, "overloaded", 1, "out of memory");
        return SL_ERROR;
    }
    return SL_OK;
}

int sl_request_body_done(sl_request_t *r, sl_buf_t *body, sl_request_error_t *err)
{
    sl_req_policy_t *p = r->pol;
    p->body_cap = 0; /* read: from now on the body is the codec's to forward */
    p->v.now_ms = sl_endpoint_now_ms();
    const char *bytes = p->body.data ? sl_buf_head(&p->body) : "";
    int rc = sl_policy_chain_body(r->route->chain, &p->v, bytes, sl_buf_len(&p->body), &p->reply);
    if (rc != SL_POLICY_CONTINUE) {
        sl_buf_free(&p->body);
        return policy_replied(r, err);
    }
    if (sl_unlikely(r->route->pb->action)) {
        /* The head's buffers are gone by now (detach_view): the attributes
         * come from the body, or the key is the request's none. */
        sl_req_head_t none = {0};
        r->cluster = NULL;
        rc = action_run(r, &none, bytes, sl_buf_len(&p->body), err);
        sl_buf_free(&p->body);
        return rc;
    }
    if (sl_unlikely(p->mirror)) {
        sl_mirror_push(r->w->id, p->mirror, bytes, sl_buf_len(&p->body));
        p->mirror = NULL;
    }
    if (p->rules_deferred) {
        /* A body that is not JSON has no fields: its conditions are false. */
        json_t *doc = json_loadb(bytes, sl_buf_len(&p->body), 0, NULL);
        int rule = sl_route_rules_match_deferred(r->route->rules, &p->rule_bits, doc);
        json_decref(doc);
        sl_route_choice_t ch;
        sl_route_rules_choose(r->route->rules, rule, r->w->id, &ch);
        if (ch.srate)
            srate_choose(r, ch.srate, ch.weights, ch.clusters, ch.n, p->sr_hash, p->sr_key);
        else
            apply_choice(r, &ch);
        p->rules_deferred = 0;
    }
    *body = p->body;
    p->body = (sl_buf_t){0};
    return SL_OK;
}

static int name_eq(sl_str_t a, const char *b, size_t blen)
{
    return a.len == blen && strncasecmp(a.ptr, b, blen) == 0;
}

int sl_request_header_dropped_scan(const sl_request_t *r, int response, sl_str_t name)
{
    const sl_hdr_edit_t *e = response ? r->pol->v.resp_edits : r->pol->v.req_edits;
    unsigned n = response ? r->pol->v.num_resp_edits : r->pol->v.num_req_edits;
    for (unsigned i = 0; i < n; i++)
        if (e[i].op != SL_HDR_ADD && name_eq(name, e[i].name, e[i].name_len))
            return 1;
    return 0;
}

size_t sl_request_header_added(const sl_request_t *r, int response, sl_header_t *f, size_t cap)
{
    if (!r->pol)
        return 0;
    const sl_hdr_edit_t *e = response ? r->pol->v.resp_edits : r->pol->v.req_edits;
    unsigned n = response ? r->pol->v.num_resp_edits : r->pol->v.num_req_edits;
    size_t k = 0;
    for (unsigned i = 0; i < n && k < cap; i++)
        if (e[i].op != SL_HDR_REMOVE)
            f[k++] = (sl_header_t){{e[i].name, e[i].name_len}, {e[i].value, e[i].value_len}};
    return k;
}

void sl_request_response_hooks(sl_request_t *r, int status)
{
    if (!r->pol || !r->route || !r->route->chain || r->pol->responded)
        return;
    r->pol->responded = 1;
    sl_policy_chain_response(r->route->chain, &r->pol->v, status);
}

const sl_policy_reply_t *sl_request_reply(const sl_request_t *r)
{
    return r->pol && r->pol->replied ? &r->pol->reply : NULL;
}

/* ---- upstream attempts ---------------------------------------------------- */

static void srate_outcome(sl_request_t *r, int success);

int sl_request_pick_endpoint(sl_request_t *r, sl_request_error_t *err)
{
    int why = SL_UPSTREAM_ERR_NO_HEALTHY;
    int exclude = r->attempts ? r->ep_index : -1;
    /* A rule's priority list, or the ranking by success rate: a retry goes
     * to the next backend, and its outcome is scored for that one. */
    if (sl_unlikely(r->attempts && r->choice + 1 < r->num_choices)) {
        r->cluster = r->choices[++r->choice];
        r->sr_pick.gbackend = r->sr_gidx[r->choice];
        r->sr_pick.probe = 0;
        r->sr_pick.win = NULL;
        exclude = -1;
    }
    int idx = sl_upstream_pick(r->w, r->cluster, r->hash, exclude, &why);
    if (idx < 0 && exclude >= 0)
        idx = sl_upstream_pick(r->w, r->cluster, r->hash, -1, &why);
    /* The first healthy backend of the list wins. */
    while (sl_unlikely(idx < 0 && r->choice + 1 < r->num_choices)) {
        SL_STAT_ADD(r->cluster->stats->slots[r->w->id].errors[why], 1);
        /* A success-rate pick without an endpoint to take the request is a
         * connect failure (docs/routing.md: "no healthy endpoint"). */
        if (r->sr_pick.slot && r->sr->fail_connect && why == SL_UPSTREAM_ERR_NO_HEALTHY)
            srate_outcome(r, 0);
        r->cluster = r->choices[++r->choice];
        r->sr_pick.gbackend = r->sr_gidx[r->choice];
        r->sr_pick.probe = 0;
        r->sr_pick.win = NULL;
        idx = sl_upstream_pick(r->w, r->cluster, r->hash, -1, &why);
    }
    r->attempts++;
    if (sl_unlikely(r->cluster->cb_any) && idx >= 0 && cb_take(r, SL_CB_REQUESTS) != SL_OK) {
        set_error(err, 503, "circuit_open", 0,
                  "the backend's circuit breaker is open: %u requests in flight (maxRequests)",
                  r->cluster->cb_max[SL_CB_REQUESTS]);
        return SL_ERROR;
    }
    if (idx < 0) {
        SL_STAT_ADD(r->cluster->stats->slots[r->w->id].errors[why], 1);
        if (why == SL_UPSTREAM_ERR_POOL_FULL)
            set_error(err, 503, "upstream_pool_full", 0,
                      "the connection pool to the backend is exhausted");
        else
            set_error(err, 503, "no_healthy_upstream", 0, "no healthy endpoint for the backend");
        return SL_ERROR;
    }
    r->ep_index = idx;
    if (!r->upstream_start_us && sl_request_timed(r))
        r->upstream_start_us = now_mono_us();
    sl_endpoint_state_t *ep = r->cluster->endpoints[idx];
    sl_request_leave_pool(r);
    r->pool = sl_upstream_pool(r->w, ep);
    if (!r->pool) {
        set_error(err, 503, "overloaded", 1, "out of memory");
        return SL_ERROR;
    }
    _Static_assert(sizeof(r->upstream_addr) == sizeof(ep->label), "the label is copied whole");
    memcpy(r->upstream_addr, ep->label, sizeof(r->upstream_addr));
    SL_STAT_ADD(r->cluster->stats->slots[r->w->id].requests, 1);
    r->pool->active_requests++;
    r->counted_request = 1;
    return SL_OK;
}

int sl_request_retry_allowed(const sl_request_t *r, enum sl_upstream_error kind, int status,
                             int response_started)
{
    const sl_gen_retry_t *rp = &r->route->retry;
    if (r->attempts > rp->attempts || !r->replayable || response_started)
        return 0;
    if (r->deadline_ms && sl_endpoint_now_ms() >= r->deadline_ms)
        return 0;
    int idempotent = r->method_bit & (SL_METHOD_GET | SL_METHOD_HEAD | SL_METHOD_OPTIONS |
                                      SL_METHOD_PUT | SL_METHOD_DELETE | SL_METHOD_TRACE);
    if (!idempotent && !rp->non_idempotent) {
        /* A non-idempotent request may only be retried when it provably never
         * reached the upstream: the connection could not be made. */
        if (kind != SL_UPSTREAM_ERR_CONNECT)
            return 0;
    }
    if (status) {
        if (status < 500 || status >= 564 ||
            !(rp->status_mask[(status - 500) / 32] & (1u << ((status - 500) % 32))))
            return 0;
    } else if (kind == SL_UPSTREAM_ERR_CONNECT) {
        if (!rp->on_connect_failure)
            return 0;
    } else if (kind == SL_UPSTREAM_ERR_RESET) {
        if (!rp->on_reset)
            return 0;
    } else {
        return 0;
    }
    /* The Backend's circuit breaker: a retry over maxRetries is not made. */
    if (sl_unlikely(r->cluster->cb_max[SL_CB_RETRIES]) && !(r->cb_held & (1u << SL_CB_RETRIES)) &&
        atomic_load_explicit(&r->cluster->stats->cb_active[SL_CB_RETRIES], memory_order_relaxed) >=
            (int64_t)r->cluster->cb_max[SL_CB_RETRIES]) {
        atomic_fetch_add_explicit(&r->cluster->stats->cb_open[SL_CB_RETRIES], 1,
                                  memory_order_relaxed);
        return 0;
    }
    /* Retry budget: retries in flight on this worker and endpoint stay under
     * budget_percent of active requests (never below the minimum), so a
     * failing backend does not get its load multiplied. */
    if (r->pool) {
        uint32_t allowed = r->pool->active_requests * rp->budget_percent / 100;
        if (allowed < rp->min_retry_concurrency)
            allowed = rp->min_retry_concurrency;
        if (r->pool->retries_active >= allowed)
            return 0;
    }
    return 1;
}

void sl_request_count_retry(sl_request_t *r)
{
    SL_STAT_ADD(r->cluster->stats->slots[r->w->id].retries, 1);
}

void sl_request_retry_started(sl_request_t *r)
{
    if (sl_unlikely(r->cluster->cb_max[SL_CB_RETRIES]))
        (void)cb_take(r, SL_CB_RETRIES); /* checked by sl_request_retry_allowed */
    if (r->pool && !r->counted_retry) {
        r->pool->retries_active++;
        r->counted_retry = 1;
    }
}

void sl_request_count_reuse_failure(sl_request_t *r)
{
    SL_STAT_ADD(r->cluster->stats->slots[r->w->id].reuse_failures, 1);
}

int sl_request_retried_on_reset(const sl_request_t *r)
{
    const sl_gen_retry_t *rp = &r->route->retry;
    int idempotent = r->method_bit & (SL_METHOD_GET | SL_METHOD_HEAD | SL_METHOD_OPTIONS |
                                      SL_METHOD_PUT | SL_METHOD_DELETE | SL_METHOD_TRACE);
    return rp->on_reset && rp->attempts > 0 && (idempotent || rp->non_idempotent);
}

/* An outcome for success-rate routing, unless it is older than the
 * configured age (a request that took longer than that). */
static void srate_outcome(sl_request_t *r, int success)
{
    const sl_srate_route_t *sr = r->sr;
    /* The clock is read only when outcomes age: otherwise the request's
     * start is a good enough time stamp for its slot. */
    uint64_t start_ms = r->start_mono_us / 1000, now = start_ms;
    if (sr->max_outcome_age_ms) {
        now = sl_endpoint_now_ms();
        if (now > start_ms + sr->max_outcome_age_ms)
            return;
    }
    sl_srate_record(sr, &r->sr_pick, success, now);
}

void sl_request_count_error(sl_request_t *r, enum sl_upstream_error kind)
{
    SL_STAT_ADD(r->cluster->stats->slots[r->w->id].errors[kind], 1);
    if (sl_unlikely(r->sr_pick.slot)) {
        const sl_srate_route_t *sr = r->sr;
        int failed = 0;
        switch (kind) {
        case SL_UPSTREAM_ERR_CONNECT:
        case SL_UPSTREAM_ERR_CONNECT_TIMEOUT:
        case SL_UPSTREAM_ERR_NO_HEALTHY:
            failed = sr->fail_connect;
            break;
        case SL_UPSTREAM_ERR_TIMEOUT:
            failed = sr->fail_timeout;
            break;
        case SL_UPSTREAM_ERR_RESET:
            failed = sr->fail_reset;
            break;
        case SL_UPSTREAM_ERR_BAD_RESPONSE:
            failed = sr->fail_5xx; /* answered as 502 */
            break;
        default:
            break; /* pool full is ours; a 5xx is judged by its status */
        }
        if (failed)
            srate_outcome(r, 0);
    }
}

void sl_request_srate_response(sl_request_t *r, int status, const sl_header_t *headers, size_t n)
{
    const sl_srate_route_t *sr = r->sr;
    int ok = 1; /* below 400 without an outcome header: a success, no more to see */
    if (status >= 400 || sr->fail_header_len) {
        const sl_header_t *f = NULL;
        if (sr->fail_header_len)
            f = sl_http1_find_header(headers, n, sr->pb->fail_header, sr->fail_header_len);
        ok = sl_srate_classify_status(sr, status, f ? f->value.ptr : NULL, f ? f->value.len : 0);
    }
    if (ok >= 0)
        srate_outcome(r, ok);
}

void sl_request_note_outcome(sl_request_t *r, int success)
{
    if (r->ep_index < 0 || !r->cluster)
        return;
    sl_gen_cluster_t *cl = r->cluster;
    if (!cl->outlier_failures)
        return;
    sl_endpoint_state_t *ep = cl->endpoints[r->ep_index];
    if (sl_endpoint_report(ep, success, cl->outlier_failures, cl->outlier_base_ejection_ms,
                           sl_endpoint_now_ms()))
        sl_log_notice("backend %s endpoint %s:%u: ejected after %u consecutive failures",
                      cl->pb->name, ep->address, ep->port, cl->outlier_failures);
}

/* ---- the gateway's own answers -------------------------------------------- */

int sl_request_grpc_status(int http_status, const char *code)
{
    if (strcmp(code, "request_timeout") == 0 || strcmp(code, "upstream_timeout") == 0 ||
        http_status == 504 || http_status == 408)
        return 4; /* DEADLINE_EXCEEDED */
    if (http_status == 413 || http_status == 431 || http_status == 429 ||
        strcmp(code, "upstream_pool_full") == 0 || strcmp(code, "connection_limit") == 0 ||
        strcmp(code, "overloaded") == 0)
        return 8; /* RESOURCE_EXHAUSTED */
    if (http_status == 404 || http_status == 405 || http_status == 501)
        return 12; /* UNIMPLEMENTED */
    if (http_status == 401)
        return 16; /* UNAUTHENTICATED */
    if (http_status == 403)
        return 7; /* PERMISSION_DENIED */
    if (http_status == 502 || http_status == 503)
        return 14; /* UNAVAILABLE */
    return 13;     /* INTERNAL */
}

static size_t json_escape(char *dst, size_t cap, const char *src, size_t len)
{
    size_t o = 0;
    for (size_t i = 0; i < len && o + 7 < cap; i++) {
        unsigned char ch = (unsigned char)src[i];
        if (ch == '"' || ch == '\\') {
            dst[o++] = '\\';
            dst[o++] = (char)ch;
        } else if (ch < 0x20 || ch >= 0x7f) {
            o += (size_t)snprintf(dst + o, cap - o, "\\u%04x", ch);
        } else {
            dst[o++] = (char)ch;
        }
    }
    dst[o] = '\0';
    return o;
}

size_t sl_request_error_body(sl_request_t *r, int status, const char *code, const char *message,
                             char *buf, size_t cap)
{
    sl_request_ensure_id(r);
    char esc[600];
    json_escape(esc, sizeof(esc), message, strlen(message));
    int n = snprintf(buf, cap,
                     "{\"error\":{\"status\":%d,\"code\":\"%s\",\"message\":\"%s\","
                     "\"request_id\":\"%.*s\"}}\n",
                     status, code, esc, (int)r->m_reqid.len, r->m_reqid.ptr);
    if (n < 0)
        return 0;
    return (size_t)n < cap ? (size_t)n : strlen(buf);
}

/*
 * A recipient with a clock that forwards a response without Date must add
 * one (RFC 9110 6.6.1), and every response the gateway makes carries one.
 */
const char *sl_request_date_line(size_t *len)
{
    static __thread time_t cached_sec = -1;
    static __thread char line[48];
    static __thread size_t line_len;
    static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    if (ts.tv_sec != cached_sec) {
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        int n = snprintf(line, sizeof(line), "Date: %s, %02d %s %04d %02d:%02d:%02d GMT\r\n",
                         days[tm.tm_wday % 7], tm.tm_mday, months[tm.tm_mon % 12],
                         tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
        line_len = n > 0 && (size_t)n < sizeof(line) ? (size_t)n : 0;
        cached_sec = ts.tv_sec;
    }
    *len = line_len;
    return line;
}
