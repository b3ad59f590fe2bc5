/*
 * The response cache on the request path (cache.h): lookup, coalescing
 * with parked requests woken through their worker's loop, serving a hit
 * through the exchange, capturing and storing a miss's response.
 */
#include "cache.h"

#include "cache/cache_policy.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* A request's part in the cache (sl_request_t.cache), made at lookup. */
typedef struct sl_cache_req {
    const sl_cache_ask_t *ask; /* in the request's policy arena */
    sl_cache_zone_t *zone;     /* held by the request's generation */
    sl_cache_entry_t *entry;   /* a hit being served (a reference) */
    size_t sent;               /* its body bytes handed to the codec */
    sl_cache_fill_t *fill;     /* the fill this request leads */
    uint64_t token;            /* parked: its slot's token */
    uint8_t parked;
    uint8_t may_store; /* the response may be captured */
    uint8_t capturing; /* ...and is being */
    uint8_t framed;    /* the bytes the exchange hands over carry chunked framing */
    uint8_t dec_done;  /* the framing's last chunk was seen */
    uint8_t auth_ok;
    int status;
    uint64_t lifetime_ms;
    uint32_t initial_age_s;
    int64_t expect_len; /* Content-Length, -1 = none */
    sl_http1_chunked_t dec;
    char *head; /* the stored head so far (status line and fields) */
    size_t head_len, head_cap;
    char *body;
    size_t body_len, body_cap;
} sl_cache_req_t;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void set_status(sl_exchange_t *x, const char *s)
{
    if (x->r.pol)
        x->r.pol->v.cache_status = s;
}

/* ---- parked requests: a per-worker slot table -------------------------------- */

typedef struct {
    sl_exchange_t *x; /* NULL = free */
    uint32_t seq;
    uint32_t next_free;
} slot_t;

#define NO_SLOT UINT32_MAX
static __thread slot_t *slots;
static __thread uint32_t num_slots, used_slots, seq_counter;
static __thread uint32_t free_slot = NO_SLOT;

/* A slot for x and its token; 0 when out of memory. */
static uint64_t slot_take(sl_exchange_t *x)
{
    if (free_slot == NO_SLOT) {
        uint32_t n = num_slots ? num_slots * 2 : 64;
        slot_t *s = realloc(slots, n * sizeof(*s));
        if (!s)
            return 0;
        for (uint32_t i = num_slots; i < n; i++)
            s[i] = (slot_t){NULL, 0, i + 1 < n ? i + 1 : NO_SLOT};
        slots = s;
        free_slot = num_slots;
        num_slots = n;
    }
    uint32_t i = free_slot;
    free_slot = slots[i].next_free;
    if (++seq_counter == 0)
        seq_counter = 1;
    slots[i].x = x;
    slots[i].seq = seq_counter;
    used_slots++;
    return ((uint64_t)seq_counter << 32) | i;
}

static void slot_put(uint64_t token)
{
    uint32_t i = (uint32_t)token;
    if (i >= num_slots || slots[i].seq != (uint32_t)(token >> 32) || !slots[i].x)
        return;
    slots[i].x = NULL;
    slots[i].next_free = free_slot;
    free_slot = i;
    /* An idle worker keeps no table (nor leaves one behind at exit). */
    if (--used_slots == 0) {
        free(slots);
        slots = NULL;
        num_slots = 0;
        free_slot = NO_SLOT;
    }
}

static sl_exchange_t *slot_find(uint64_t token)
{
    uint32_t i = (uint32_t)token;
    if (i >= num_slots || slots[i].seq != (uint32_t)(token >> 32))
        return NULL;
    return slots[i].x;
}

static void unpark(sl_cache_req_t *cr)
{
    if (!cr->parked)
        return;
    slot_put(cr->token);
    cr->parked = 0;
}

/* ---- waking the waiters of a fill ------------------------------------------ */

typedef struct {
    size_t n;
    uint64_t tokens[];
} wake_batch_t;

static void after_wait(sl_exchange_t *x);

/* On the waiter's worker, from its loop. */
static void wake_run(sl_worker_t *w, void *arg)
{
    (void)w;
    wake_batch_t *b = arg;
    for (size_t i = 0; i < b->n; i++) {
        sl_exchange_t *x = slot_find(b->tokens[i]);
        if (!x)
            continue; /* it ended (or timed out) meanwhile */
        x->ops->enter(x);
        sl_cache_req_t *cr = x->r.cache;
        if (cr)
            unpark(cr);
        if (cr && x->ops->alive(x) && x->phase == SL_XP_CACHE_WAIT)
            after_wait(x);
        x->ops->leave(x);
    }
    free(b);
}

/* One post per worker that has waiters. */
static void wake(sl_cache_waiter_t *ws, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t worker = ws[i].worker;
        if (worker == UINT32_MAX)
            continue;
        size_t k = 0;
        for (size_t j = i; j < n; j++)
            k += ws[j].worker == worker;
        wake_batch_t *b = malloc(sizeof(*b) + k * sizeof(uint64_t));
        if (!b) {
            /* They time out instead (coalesceTimeout). */
            sl_log_warn("cache: out of memory waking %zu requests", k);
            continue;
        }
        b->n = 0;
        for (size_t j = i; j < n; j++) {
            if (ws[j].worker == worker) {
                b->tokens[b->n++] = ws[j].token;
                ws[j].worker = UINT32_MAX;
            }
        }
        sl_worker_post(worker, wake_run, b);
    }
}

/* Ends the fill this request leads, storing e (or nothing; `pass`: leave a
 * marker, the response was deliberately not storable). */
static void end_fill(sl_cache_req_t *cr, sl_cache_entry_t *e, int pass)
{
    if (!cr->fill) {
        if (e)
            sl_cache_insert(cr->zone, e);
        return;
    }
    sl_cache_waiter_t *ws = NULL;
    size_t n =
        sl_cache_fill_end(cr->zone, cr->fill, e, now_ms(), pass ? cr->ask->conf->pass_ms : 0, &ws);
    cr->fill = NULL;
    wake(ws, n);
    free(ws);
}

/* Drops what a miss copied of its response and stops copying. */
static void capture_reset(sl_cache_req_t *cr)
{
    free(cr->head);
    free(cr->body);
    cr->head = cr->body = NULL;
    cr->head_len = cr->head_cap = cr->body_len = cr->body_cap = 0;
    cr->capturing = 0;
    cr->may_store = 0;
}

static void stop_capture(sl_cache_req_t *cr, int pass)
{
    capture_reset(cr);
    end_fill(cr, NULL, pass);
}

void sl_cache_request_end(sl_request_t *r)
{
    sl_cache_req_t *cr = r->cache;
    if (!cr)
        return;
    unpark(cr);
    stop_capture(cr, 0); /* a fill not ended yet: its response did not complete */
    sl_cache_entry_release(cr->entry);
    free(cr);
    r->cache = NULL;
}

/* ---- serving a hit ------------------------------------------------------------ */

/* Copies the entry's body into the codec's buffer and lets it write, until
 * done or the client is full (sl_cache_resume goes on). */
static void serve_body(sl_exchange_t *x)
{
    sl_cache_req_t *cr = x->r.cache;
    const sl_cache_entry_t *e = cr->entry;
    for (;;) {
        sl_buf_t *out = x->ops->body_buf(x);
        if (!out->data) {
            x->ops->abort(x, "out_of_memory");
            return;
        }
        while (cr->sent < e->body_len) {
            if (sl_buf_space(out) < 1024) {
                sl_buf_compact(out);
                if (sl_buf_space(out) < 1024)
                    break;
            }
            size_t n = e->body_len - cr->sent;
            if (n > sl_buf_space(out))
                n = sl_buf_space(out);
            memcpy(sl_buf_tail(out), e->body + cr->sent, n);
            out->end += n;
            cr->sent += n;
            if (sl_buf_len(out) >= SL_WORKER_BLOCK_SIZE / 2)
                break;
        }
        if (cr->sent == e->body_len) {
            x->resp_done = 1;
            x->ops->complete(x);
            return;
        }
        int w = x->ops->body_flush(x);
        if (w < 0)
            return;
        if (w == 0) {
            x->up_paused = 1; /* sl_cache_resume */
            return;
        }
    }
}

int sl_cache_resume(sl_exchange_t *x)
{
    sl_cache_req_t *cr = x->r.cache;
    if (!cr || !cr->entry)
        return 0;
    if (x->up_paused && x->phase == SL_XP_BODY && !x->resp_done) {
        x->up_paused = 0;
        serve_body(x);
    }
    return 1;
}

/* Answers x from e (the caller's reference, now x's). SL_OK, or SL_ERROR
 * when the stored head does not parse (nothing was sent: go upstream). */
static int serve(sl_exchange_t *x, sl_cache_entry_t *e)
{
    sl_cache_req_t *cr = x->r.cache;
    sl_http1_header_t rh[128];
    sl_http1_response_t resp;
    memset(&resp, 0, sizeof(resp));
    resp.headers = rh;
    resp.num_headers = SL_ARRAY_LEN(rh);
    if (sl_http1_parse_response(e->head, e->head_len, x->r.method_bit, e->head_len + 1, &resp) <=
        0) {
        sl_cache_entry_release(e);
        return SL_ERROR;
    }
    cr->entry = e;
    cr->sent = 0;
    cr->may_store = 0;
    uint64_t now = now_ms();
    set_status(x, "HIT");
    if (x->r.pol)
        x->r.pol->v.cache_age_s =
            e->initial_age_s + (uint32_t)((now > e->stored_ms ? now - e->stored_ms : 0) / 1000);
    x->r.status = resp.status;
    x->resp_body = resp.body;
    x->resp_remaining = resp.body == SL_HTTP1_BODY_LENGTH ? resp.content_length : 0;
    x->dechunk = 0;
    x->phase = SL_XP_BODY;
    x->resp_done = resp.body == SL_HTTP1_BODY_NONE || e->body_len == 0;
    if (resp.body == SL_HTTP1_BODY_NONE)
        cr->sent = e->body_len; /* HEAD: the head alone */
    if (x->ops->head(x, &resp, 0) != SL_OK) {
        x->ops->abort(x, "out_of_memory");
        return SL_OK;
    }
    if (!x->ops->alive(x))
        return SL_OK;
    x->resp_head_sent = 1;
    if (x->resp_done)
        x->ops->complete(x);
    else
        serve_body(x);
    return SL_OK;
}

/* ---- lookup and waiting ----------------------------------------------------- */

static int go_upstream(sl_exchange_t *x, const char *status)
{
    sl_cache_req_t *cr = x->r.cache;
    set_status(x, status);
    cr->may_store = cr->ask->store;
    return SL_DECLINED;
}

/* A waiter woken (or timed out): look again, without waiting again. */
static void after_wait(sl_exchange_t *x)
{
    sl_cache_req_t *cr = x->r.cache;
    const sl_cache_ask_t *ask = cr->ask;
    x->phase = SL_XP_NONE;
    x->ops->arm_timer(x, 0);
    sl_cache_entry_t *e;
    sl_cache_fill_t *f;
    enum sl_cache_result res = sl_cache_lookup(cr->zone, ask->key, ask->key_len, ask->hash,
                                               now_ms(), ask->authorized, NULL, &e, &f);
    if (res == SL_CACHE_HIT && serve(x, e) == SL_OK)
        return;
    go_upstream(x, res == SL_CACHE_EXPIRED ? "EXPIRED" : "MISS");
    sl_exchange_upstream(x);
}

void sl_cache_wait_timeout(sl_exchange_t *x)
{
    sl_cache_req_t *cr = x->r.cache;
    if (!cr)
        return;
    unpark(cr);
    after_wait(x);
}

int sl_cache_start(sl_exchange_t *x)
{
    const sl_cache_ask_t *ask = x->r.pol->v.cache;
    const sl_cache_conf_t *conf = ask->conf;
    if (x->upgrade || !x->req_body_done || x->r.bytes_received) {
        set_status(x, "BYPASS"); /* a body the policy could not see (HTTP/2 DATA) */
        sl_cache_zone_count(conf->zone, SL_CACHE_BYPASS);
        return SL_DECLINED;
    }
    sl_cache_req_t *cr = calloc(1, sizeof(*cr));
    if (!cr) {
        set_status(x, "BYPASS");
        return SL_DECLINED;
    }
    x->r.cache = cr;
    cr->ask = ask;
    cr->zone = conf->zone;
    if (!ask->lookup) {
        /* The client asked for a fresh response: it replaces the stored one. */
        sl_cache_zone_count(cr->zone, SL_CACHE_MISS);
        return go_upstream(x, "MISS");
    }
    /* A request with credentials the key does not cover neither leads nor
     * joins a fill: what it gets is rarely what others may be given. */
    sl_cache_waiter_t waiter = {0, 0};
    int coalesce = ask->store && conf->coalesce && !ask->authorized;
    if (coalesce) {
        cr->token = slot_take(x);
        coalesce = cr->token != 0;
        cr->parked = (uint8_t)coalesce; /* until the lookup says otherwise */
        waiter = (sl_cache_waiter_t){x->r.w->id, cr->token};
    }
    sl_cache_entry_t *e;
    enum sl_cache_result res =
        sl_cache_lookup(cr->zone, ask->key, ask->key_len, ask->hash, now_ms(), ask->authorized,
                        coalesce ? &waiter : NULL, &e, &cr->fill);
    if (res != SL_CACHE_WAIT)
        unpark(cr);
    switch (res) {
    case SL_CACHE_HIT:
        if (serve(x, e) == SL_OK)
            return SL_DONE;
        return go_upstream(x, "MISS");
    case SL_CACHE_WAIT:
        x->phase = SL_XP_CACHE_WAIT;
        x->ops->arm_timer(x, (uint32_t)conf->coalesce_timeout_ms);
        return SL_DONE;
    case SL_CACHE_EXPIRED:
        return go_upstream(x, "EXPIRED");
    default:
        return go_upstream(x, "MISS");
    }
}

/* ---- capturing a response ---------------------------------------------------- */

static int name_is(const sl_http1_header_t *h, const char *lit, size_t len)
{
    return h->name.len == len && strncasecmp(h->name.ptr, lit, len) == 0;
}

static int append(char **buf, size_t *len, size_t *cap, const void *p, size_t n)
{
    if (n == 0)
        return 0;
    if (n > *cap - *len) {
        size_t c = *cap ? *cap : 1024;
        while (c - *len < n)
            c *= 2;
        char *nb = realloc(*buf, c);
        if (!nb)
            return -1;
        *buf = nb;
        *cap = c;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    return 0;
}

/* An HTTP-date (IMF-fixdate; RFC 9110 5.6.7 asks for that form only from
 * senders, the obsolete ones are rare enough to be treated as invalid). */
static int parse_http_date(sl_str_t v, time_t *out)
{
    char buf[64];
    if (v.len == 0 || v.len >= sizeof(buf))
        return -1;
    memcpy(buf, v.ptr, v.len);
    buf[v.len] = '\0';
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    const char *end = strptime(buf, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    if (!end || *end)
        return -1;
    *out = timegm(&tm);
    return 0;
}

static int64_t parse_seconds(sl_str_t v)
{
    if (v.len == 0 || v.len > 10)
        return -1;
    int64_t n = 0;
    for (size_t i = 0; i < v.len; i++) {
        if (v.ptr[i] < '0' || v.ptr[i] > '9')
            return -1;
        n = n * 10 + (v.ptr[i] - '0');
    }
    return n;
}

/*
 * Whether the response may be stored, and for how long (RFC 9111 3 and
 * 4.2.1, for a shared cache): the config's statuses; never with Set-Cookie;
 * with respectCacheControl, never no-store, private or no-cache (there is
 * no revalidation), and the lifetime from s-maxage, max-age, or Expires
 * minus Date before the config's ttl; a request with credentials the key
 * does not cover only when the response says it may be shared; Vary only
 * on headers the key holds. 0 and *lifetime_ms set, or -1.
 */
static int storable(sl_cache_req_t *cr, const sl_http1_response_t *resp, uint64_t *lifetime_ms)
{
    const sl_cache_conf_t *conf = cr->ask->conf;
    if (!sl_cache_conf_status(conf, resp->status))
        return -1;
    sl_cache_cc_t cc;
    sl_cache_cc_init(&cc);
    const sl_http1_header_t *expires = NULL, *date = NULL;
    for (size_t i = 0; i < resp->num_headers; i++) {
        const sl_http1_header_t *h = &resp->headers[i];
        if (name_is(h, "set-cookie", 10))
            return -1;
        if (name_is(h, "cache-control", 13))
            sl_cache_cc_parse(&cc, h->value);
        else if (name_is(h, "expires", 7))
            expires = h;
        else if (name_is(h, "date", 4))
            date = h;
        else if (name_is(h, "age", 3))
            cr->initial_age_s =
                (uint32_t)(parse_seconds(h->value) > 0 ? parse_seconds(h->value) : 0);
        else if (name_is(h, "vary", 4)) {
            const char *p = h->value.ptr, *end = p + h->value.len;
            while (p < end) {
                while (p < end && (*p == ' ' || *p == '\t' || *p == ','))
                    p++;
                const char *s = p;
                while (p < end && *p != ',' && *p != ' ' && *p != '\t')
                    p++;
                if (p > s && (p - s == 1 && *s == '*'))
                    return -1;
                if (p > s && !sl_cache_conf_keys_header(conf, s, (size_t)(p - s)))
                    return -1;
            }
        }
    }
    cr->auth_ok = cc.public_ || cc.s_maxage >= 0 || cc.must_revalidate;
    if (cr->ask->authorized && !cr->auth_ok)
        return -1;
    if (!conf->respect_cache_control) {
        *lifetime_ms = conf->ttl_ms;
        cr->initial_age_s = 0;
        return 0;
    }
    if (cc.no_store || cc.private_ || cc.no_cache)
        return -1;
    if (cc.s_maxage >= 0) {
        *lifetime_ms = (uint64_t)cc.s_maxage * 1000;
    } else if (cc.max_age >= 0) {
        *lifetime_ms = (uint64_t)cc.max_age * 1000;
    } else if (expires) {
        time_t exp, base;
        if (parse_http_date(expires->value, &exp) != 0)
            return -1; /* invalid Expires: already expired (RFC 9111 5.3) */
        if (!date || parse_http_date(date->value, &base) != 0)
            base = time(NULL);
        *lifetime_ms = exp > base ? (uint64_t)(exp - base) * 1000 : 0;
    } else {
        *lifetime_ms = conf->ttl_ms;
    }
    return *lifetime_ms > 0 ? 0 : -1;
}

void sl_cache_capture_head(sl_exchange_t *x, const sl_http1_response_t *resp)
{
    sl_cache_req_t *cr = x->r.cache;
    if (!cr || !cr->may_store)
        return;
    const sl_cache_conf_t *conf = cr->ask->conf;
    uint64_t lifetime_ms = 0;
    if (storable(cr, resp, &lifetime_ms) != 0 ||
        (resp->body == SL_HTTP1_BODY_LENGTH && resp->content_length > conf->max_entry_bytes)) {
        stop_capture(cr, 1); /* waiters go on now, not after the body */
        return;
    }
    /* The head as stored: the status line and end-to-end fields, without
     * those a hit gets anew (Content-Length at the end, Age, the request
     * id) or that framed this transfer only. */
    char line[64];
    int n = snprintf(line, sizeof(line), "HTTP/1.1 %d ", resp->status);
    int fail =
        append(&cr->head, &cr->head_len, &cr->head_cap, line, (size_t)n) ||
        append(&cr->head, &cr->head_len, &cr->head_cap, resp->reason.ptr, resp->reason.len) ||
        append(&cr->head, &cr->head_len, &cr->head_cap, "\r\n", 2);
    sl_conn_opts_t co;
    sl_conn_opts_collect(&co, resp->headers, resp->num_headers);
    for (size_t i = 0; i < resp->num_headers && !fail; i++) {
        const sl_http1_header_t *h = &resp->headers[i];
        if (sl_http_is_hop_by_hop(h, &co) || name_is(h, "content-length", 14) ||
            name_is(h, "age", 3) || name_is(h, "x-request-id", 12) || name_is(h, "trailer", 7))
            continue;
        fail = append(&cr->head, &cr->head_len, &cr->head_cap, h->name.ptr, h->name.len) ||
               append(&cr->head, &cr->head_len, &cr->head_cap, ": ", 2) ||
               append(&cr->head, &cr->head_len, &cr->head_cap, h->value.ptr, h->value.len) ||
               append(&cr->head, &cr->head_len, &cr->head_cap, "\r\n", 2);
    }
    if (fail) {
        stop_capture(cr, 0);
        return;
    }
    cr->capturing = 1;
    cr->status = resp->status;
    cr->lifetime_ms = lifetime_ms;
    cr->expect_len = resp->body == SL_HTTP1_BODY_LENGTH ? (int64_t)resp->content_length : -1;
    cr->framed = resp->body == SL_HTTP1_BODY_CHUNKED && !x->dechunk;
    cr->dec_done = 0;
    if (cr->framed)
        sl_http1_chunked_init(&cr->dec);
}

void sl_cache_capture_body(sl_exchange_t *x, const char *p, size_t n)
{
    sl_cache_req_t *cr = x->r.cache;
    if (!cr || !cr->capturing || n == 0)
        return;
    uint64_t max = cr->ask->conf->max_entry_bytes;
    if (!cr->framed) {
        if (cr->body_len + n > max) {
            stop_capture(cr, 1);
            return;
        }
        if (append(&cr->body, &cr->body_len, &cr->body_cap, p, n) != 0)
            stop_capture(cr, 0);
        return;
    }
    /* Chunked bytes as they go to the client: copied, then decoded in
     * place, so the entry holds the payload. */
    size_t at = cr->body_len;
    if (append(&cr->body, &cr->body_len, &cr->body_cap, p, n) != 0) {
        stop_capture(cr, 0);
        return;
    }
    size_t payload = 0;
    int done = 0;
    if (sl_http1_chunked_decode(&cr->dec, cr->body + at, n, &payload, &done) < 0) {
        stop_capture(cr, 0);
        return;
    }
    cr->body_len = at + payload;
    cr->dec_done |= (uint8_t)done;
    if (cr->body_len > max)
        stop_capture(cr, 1);
}

void sl_cache_capture_end(sl_exchange_t *x)
{
    sl_cache_req_t *cr = x->r.cache;
    if (!cr || !cr->capturing)
        return;
    if ((cr->framed && !cr->dec_done) ||
        (cr->expect_len >= 0 && (uint64_t)cr->expect_len != cr->body_len)) {
        stop_capture(cr, 0);
        return;
    }
    char line[48];
    int n = cr->status == 204
                ? snprintf(line, sizeof(line), "\r\n")
                : snprintf(line, sizeof(line), "Content-Length: %zu\r\n\r\n", cr->body_len);
    if (append(&cr->head, &cr->head_len, &cr->head_cap, line, (size_t)n) != 0) {
        stop_capture(cr, 0);
        return;
    }
    const sl_cache_ask_t *ask = cr->ask;
    sl_cache_entry_t *e = sl_cache_entry_new(
        ask->key, ask->key_len, ask->hash, cr->status, cr->head, cr->head_len, cr->body,
        cr->body_len, now_ms(), cr->lifetime_ms, cr->initial_age_s, cr->auth_ok);
    capture_reset(cr);
    end_fill(cr, e, 0);
}
