/*
 * The network sinks: http (a JSON array per batch, POSTed to any
 * collector), elasticsearch (the _bulk API: an action line and the document
 * per record, daily index names, per-item results) and clickhouse
 * (INSERT ... FORMAT JSONEachRow over its HTTP interface), and otlp (spans).
 * All speak HTTP/1.1 through the blocking client of common/httpc.h on the
 * sink's own thread, with the sink's timeout as the deadline of every
 * connect, TLS handshake, send and receive, keep-alive between batches, and
 * basic or API-key auth.
 *
 * https URLs: TLS 1.2 or later with OpenSSL, the server's certificate
 * verified against the system's CAs, or the sink's caBundle (PEM) or
 * caFile, for the URL's host name (SNI sent) or address. The CAs are
 * loaded when the first connection is made and again after a failed
 * handshake, so a caFile fixed on disk is picked up at the next retry. A
 * handshake or verification failure is a failed delivery like a refused
 * connection: logged with its reason, retried with the backoff.
 *
 * What is retried (with the sink's backoff): a connection that fails, a
 * timeout, 429 and 5xx answers, and Elasticsearch items refused with 429 or
 * 5xx; only those items are sent again. Any other refusal (400 bad
 * document, 401/403 bad credentials) drops the records for good, counted
 * and logged: resending them would never succeed.
 *
 * Not here: queues, batching and backoff timing (tlog.c).
 */
#include "tlog_sink.h"

#include "httpc.h"
#include "log.h"
#include "tls_pem.h"

#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    sl_httpc_t http; /* the URL's parts, the connection, c->why: the last failure */
    char auth[1024]; /* "Authorization: ...\r\n" or "" */
    sl_tlog_buf_t req;
} net_state_t;

int sl_tlog_net_open(sl_tlog_sink_t *s, char *err, size_t errlen)
{
    net_state_t *n = calloc(1, sizeof(*n));
    if (!n) {
        snprintf(err, errlen, "traffic log sink %s: out of memory", s->cfg.name);
        return -1;
    }
    const char *why = NULL;
    char why_buf[200];
    if (sl_httpc_init(&n->http, s->cfg.url, &why) != 0) {
        snprintf(err, errlen, "traffic log sink %s: url %s: %s", s->cfg.name, s->cfg.url, why);
        free(n);
        return -1;
    }
    n->http.ca_pem = s->cfg.ca_pem;
    n->http.ca_file = s->cfg.ca_file;
    n->http.ca_pem_name = "caBundle";
    n->http.ca_file_name = "caFile";
    if (n->http.tls && s->cfg.ca_pem[0] &&
        sl_pem_ca_load(NULL, s->cfg.ca_pem, why_buf, sizeof(why_buf)) < 0) {
        snprintf(err, errlen, "traffic log sink %s: caBundle: %s", s->cfg.name, why_buf);
        free(n);
        return -1;
    }
    if (s->cfg.api_key[0]) {
        snprintf(n->auth, sizeof(n->auth), "Authorization: ApiKey %s\r\n", s->cfg.api_key);
    } else if (s->cfg.username[0]) {
        char plain[600];
        unsigned char b64[820];
        int pl = snprintf(plain, sizeof(plain), "%s:%s", s->cfg.username, s->cfg.password);
        if (pl < 0 || (size_t)pl >= sizeof(plain)) {
            snprintf(err, errlen, "traffic log sink %s: username and password are too long",
                     s->cfg.name);
            free(n);
            return -1;
        }
        EVP_EncodeBlock(b64, (const unsigned char *)plain, pl);
        snprintf(n->auth, sizeof(n->auth), "Authorization: Basic %s\r\n", b64);
        OPENSSL_cleanse(plain, sizeof(plain));
    }
    s->state = n;
    return 0;
}

/* One batch POSTed: the status (body in *rbody) or 0 with n->http.why. */
static int http_post(sl_tlog_sink_t *s, net_state_t *n, const char *target, const char *ctype,
                     const char *body, size_t blen, const char **rbody, size_t *rlen)
{
    char headers[1200];
    snprintf(headers, sizeof(headers), "Content-Type: %s\r\n%s", ctype, n->auth);
    int status = sl_httpc_request(&n->http, "POST", target, headers, body, blen, s->cfg.timeout_ms,
                                  rbody, rlen);
    OPENSSL_cleanse(headers, sizeof(headers));
    return status;
}

/* What an answer means for a whole batch. */
static enum sl_tlog_deliver_result judge(sl_tlog_sink_t *s, net_state_t *n, int status,
                                         const char *rbody, size_t rlen, unsigned nrec)
{
    if (status >= 200 && status < 300) {
        atomic_fetch_add_explicit(&s->written, nrec, memory_order_relaxed);
        return SL_TLOG_DELIVERED;
    }
    if (status == 0 || status == 429 || status >= 500) {
        if (status)
            snprintf(n->http.why, sizeof(n->http.why), "HTTP %d: %.*s", status,
                     (int)(rlen < 160 ? rlen : 160), rbody ? rbody : "");
        sl_log_warn("traffic log sink %s: delivery failed (%s); retrying with backoff", s->cfg.name,
                    n->http.why);
        return SL_TLOG_RETRY;
    }
    char why[400];
    snprintf(why, sizeof(why), "the collector refused the batch with HTTP %d: %.*s", status,
             (int)(rlen < 200 ? rlen : 200), rbody ? rbody : "");
    sl_tlog_sink_lost(s, nrec, why);
    return SL_TLOG_DELIVERED;
}

/* ---- http: a JSON array per batch ---------------------------------------- */

static int line_encode(sl_tlog_sink_t *s, const sl_tlog_view_t *v, const char *json,
                       size_t json_len, sl_tlog_buf_t *out)
{
    (void)s;
    (void)v;
    if (sl_tlog_buf_add(out, json, json_len) != 0)
        return -1;
    return sl_tlog_buf_add(out, "\n", 1);
}

/* Every '\n' (the end of a record: a record has none inside) becomes ','
 * so the records are a JSON array's elements; memchr scans a word or a
 * vector at a time, a byte loop cost a sink ~1 instruction per byte. */
static void lines_to_commas(char *p, size_t n)
{
    char *end = p + n;
    while (p < end && (p = memchr(p, '\n', (size_t)(end - p))) != NULL)
        *p++ = ',';
}

static enum sl_tlog_deliver_result http_deliver(sl_tlog_sink_t *s, sl_tlog_buf_t *batch,
                                                unsigned *nrec)
{
    net_state_t *n = s->state;
    /* The lines become the array's elements: '\n' -> ',' in a copy, so a
     * retry sends the same batch. */
    sl_tlog_buf_t *body = &n->req;
    body->len = 0;
    if (sl_tlog_buf_add(body, "[", 1) != 0 || sl_tlog_buf_add(body, batch->data, batch->len) != 0)
        return SL_TLOG_RETRY;
    lines_to_commas(body->data + 1, body->len - 1);
    if (body->len > 1 && body->data[body->len - 1] == ',')
        body->data[body->len - 1] = ']';
    else if (sl_tlog_buf_add(body, "]", 1) != 0)
        return SL_TLOG_RETRY;
    const char *rbody = NULL;
    size_t rlen = 0;
    int status =
        http_post(s, n, n->http.path, "application/json", body->data, body->len, &rbody, &rlen);
    return judge(s, n, status, rbody, rlen, *nrec);
}

/* ---- elasticsearch: _bulk ------------------------------------------------- */

/* The action line of a record: {"index":{"_index":"<index>-YYYY.MM.DD"}}. The
 * day is the record's (UTC), so a batch across midnight splits correctly. */
static int es_encode(sl_tlog_sink_t *s, const sl_tlog_view_t *v, const char *json, size_t json_len,
                     sl_tlog_buf_t *out)
{
    uint64_t day = v->rec.start_unix_us / 1000000 / 86400;
    if (day != s->es_day || !s->es_action_len) {
        time_t t = (time_t)(day * 86400);
        struct tm tm;
        gmtime_r(&t, &tm); /* logger thread, once a day */
        int n = snprintf(s->es_action, sizeof(s->es_action),
                         "{\"index\":{\"_index\":\"%s-%04d.%02d.%02d\"}}\n", s->cfg.index,
                         tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday);
        s->es_action_len = n > 0 && (size_t)n < sizeof(s->es_action) ? (size_t)n : 0;
        s->es_day = day;
    }
    if (sl_tlog_buf_add(out, s->es_action, s->es_action_len) != 0 ||
        sl_tlog_buf_add(out, json, json_len) != 0)
        return -1;
    return sl_tlog_buf_add(out, "\n", 1);
}

/* The start of record i's two lines in batch, or NULL. */
static const char *nth_pair(const sl_tlog_buf_t *b, size_t i, size_t *len)
{
    const char *p = b->data, *end = b->data + b->len;
    for (size_t k = 0; k < i; k++) {
        for (int l = 0; l < 2; l++) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            if (!nl)
                return NULL;
            p = nl + 1;
        }
    }
    const char *q = p;
    for (int l = 0; l < 2; l++) {
        const char *nl = memchr(q, '\n', (size_t)(end - q));
        if (!nl)
            return NULL;
        q = nl + 1;
    }
    *len = (size_t)(q - p);
    return p;
}

static enum sl_tlog_deliver_result es_deliver(sl_tlog_sink_t *s, sl_tlog_buf_t *batch,
                                              unsigned *nrec)
{
    net_state_t *n = s->state;
    char target[1100];
    size_t pl = strlen(n->http.path);
    snprintf(target, sizeof(target), "%.*s/_bulk",
             (int)(pl && n->http.path[pl - 1] == '/' ? pl - 1 : pl), n->http.path);
    const char *rbody = NULL;
    size_t rlen = 0;
    int status =
        http_post(s, n, target, "application/x-ndjson", batch->data, batch->len, &rbody, &rlen);
    if (status < 200 || status >= 300)
        return judge(s, n, status, rbody, rlen, *nrec);
    /* 200 with "errors":false before "items": every document was indexed.
     * Elasticsearch writes took, errors, then items; reading that flag
     * spares parsing an item per document (~2 µs a record). */
    if (rbody && rlen) {
        static const char items_key[] = "\"items\"", no_errors[] = "\"errors\":false";
        const char *items = memmem(rbody, rlen, items_key, sizeof(items_key) - 1);
        if (items && memmem(rbody, (size_t)(items - rbody), no_errors, sizeof(no_errors) - 1)) {
            atomic_fetch_add_explicit(&s->written, *nrec, memory_order_relaxed);
            return SL_TLOG_DELIVERED;
        }
    }
    /* 200: per item. */
    json_error_t jerr;
    json_t *doc = json_loadb(rbody, rlen, 0, &jerr);
    json_t *items = json_object_get(doc, "items");
    if (!doc || !json_is_array(items)) {
        json_decref(doc);
        snprintf(n->http.why, sizeof(n->http.why), "the _bulk answer is not a bulk response");
        sl_log_warn("traffic log sink %s: %s; retrying", s->cfg.name, n->http.why);
        return SL_TLOG_RETRY;
    }
    if (!json_is_true(json_object_get(doc, "errors")) && json_array_size(items) == *nrec) {
        json_decref(doc);
        atomic_fetch_add_explicit(&s->written, *nrec, memory_order_relaxed);
        return SL_TLOG_DELIVERED;
    }
    sl_tlog_buf_t again = {0};
    unsigned nagain = 0, ok = 0, refused = 0;
    char reason[300] = "";
    for (size_t i = 0; i < *nrec; i++) {
        json_t *item = json_array_get(items, i);
        const char *op;
        json_t *res = NULL;
        json_object_foreach(item, op, res) break;
        int st = res ? (int)json_integer_value(json_object_get(res, "status")) : 0;
        if (st >= 200 && st < 300) {
            ok++;
            continue;
        }
        if (st == 0 || st == 429 || st >= 500) {
            size_t len = 0;
            const char *p = nth_pair(batch, i, &len);
            if (p && sl_tlog_buf_add(&again, p, len) == 0) {
                nagain++;
                continue;
            }
        }
        refused++;
        if (!reason[0]) {
            json_t *e = json_object_get(res, "error");
            snprintf(reason, sizeof(reason), "Elasticsearch refused a document with %d: %s: %s", st,
                     json_string_value(json_object_get(e, "type")) ?: "?",
                     json_string_value(json_object_get(e, "reason")) ?: "?");
        }
    }
    json_decref(doc);
    atomic_fetch_add_explicit(&s->written, ok, memory_order_relaxed);
    if (refused)
        sl_tlog_sink_lost(s, refused, reason);
    if (nagain == 0) {
        sl_tlog_buf_free(&again);
        return SL_TLOG_DELIVERED;
    }
    sl_tlog_buf_free(batch);
    *batch = again;
    *nrec = nagain;
    sl_log_warn("traffic log sink %s: Elasticsearch asked to retry %u document(s)", s->cfg.name,
                nagain);
    return SL_TLOG_RETRY;
}

/* ---- clickhouse: INSERT ... FORMAT JSONEachRow ----------------------------- */

/* Errors of a ClickHouse exception ("Code: N, ...", or the
 * X-ClickHouse-Exception-Code header of newer servers) that come from the
 * rows themselves or the table's schema: sending the same rows again would
 * fail the same way, so they are dropped (counted, logged) instead of
 * retried. ClickHouse answers them with HTTP 500 like a server in trouble. */
static int ch_permanent(int code)
{
    static const int codes[] = {
        6,   /* CANNOT_PARSE_TEXT */
        16,  /* NO_SUCH_COLUMN_IN_TABLE */
        26,  /* CANNOT_PARSE_QUOTED_STRING */
        27,  /* CANNOT_PARSE_INPUT_ASSERTION_FAILED */
        38,  /* CANNOT_PARSE_DATE */
        41,  /* CANNOT_PARSE_DATETIME */
        53,  /* TYPE_MISMATCH */
        60,  /* UNKNOWN_TABLE */
        62,  /* SYNTAX_ERROR */
        70,  /* CANNOT_CONVERT_TYPE */
        72,  /* CANNOT_PARSE_NUMBER */
        81,  /* UNKNOWN_DATABASE */
        117, /* INCORRECT_DATA */
        192, /* UNKNOWN_USER */
        193, /* WRONG_PASSWORD */
        497, /* ACCESS_DENIED */
    };
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
        if (codes[i] == code)
            return 1;
    return 0;
}

static enum sl_tlog_deliver_result ch_deliver(sl_tlog_sink_t *s, sl_tlog_buf_t *batch,
                                              unsigned *nrec)
{
    net_state_t *n = s->state;
    char target[1400];
    /* input_format_skip_unknown_fields: a table need not have every field;
     * date_time_input_format=best_effort: `time` (RFC 3339 with
     * milliseconds and Z) loads into a DateTime (or DateTime64) column. */
    snprintf(target, sizeof(target),
             "%s?input_format_skip_unknown_fields=1&date_time_input_format=best_effort&"
             "query=INSERT%%20INTO%%20%s%%20FORMAT%%20JSONEachRow",
             n->http.path, s->cfg.table);
    const char *rbody = NULL;
    size_t rlen = 0;
    int status =
        http_post(s, n, target, "application/x-ndjson", batch->data, batch->len, &rbody, &rlen);
    int code = 0;
    if (status >= 500 && rbody && sscanf(rbody, "Code: %d", &code) == 1 && ch_permanent(code)) {
        char why[400];
        snprintf(why, sizeof(why), "ClickHouse refused the batch with HTTP %d: %.*s", status,
                 (int)(rlen < 240 ? rlen : 240), rbody);
        sl_tlog_sink_lost(s, *nrec, why);
        return SL_TLOG_DELIVERED;
    }
    return judge(s, n, status, rbody, rlen, *nrec);
}

static void net_close(sl_tlog_sink_t *s)
{
    net_state_t *n = s->state;
    if (!n)
        return;
    sl_httpc_free(&n->http);
    sl_tlog_buf_free(&n->req);
    OPENSSL_cleanse(n->auth, sizeof(n->auth));
    free(n);
    s->state = NULL;
}

const sl_tlog_sink_ops_t sl_tlog_http_ops = {
    .type = "http",
    .encode = line_encode,
    .deliver = http_deliver,
    .close = net_close,
    .lines_per_record = 1,
};

const sl_tlog_sink_ops_t sl_tlog_es_ops = {
    .type = "elasticsearch",
    .encode = es_encode,
    .deliver = es_deliver,
    .close = net_close,
    .lines_per_record = 2,
};

const sl_tlog_sink_ops_t sl_tlog_clickhouse_ops = {
    .type = "clickhouse",
    .encode = line_encode,
    .deliver = ch_deliver,
    .close = net_close,
    .lines_per_record = 1,
};

/* ---- otlp: spans as OTLP/HTTP with the JSON encoding ---------------------- */

static int otlp_encode(sl_tlog_sink_t *s, const sl_tlog_view_t *v, const char *json,
                       size_t json_len, sl_tlog_buf_t *out)
{
    (void)s;
    (void)json;
    (void)json_len;
    size_t before = out->len;
    if (sl_tlog_format_spans(v, out) != 0)
        return -1;
    if (out->len == before)
        return 0; /* no span: nothing queued, but the record line must still end */
    return sl_tlog_buf_add(out, "\n", 1);
}

/* An ExportTraceServiceRequest: one resource (service.name), one scope,
 * the batch's spans. A 2xx may carry partialSuccess.rejectedSpans: those
 * are lost for good (the collector said why), the rest delivered. */
static enum sl_tlog_deliver_result otlp_deliver(sl_tlog_sink_t *s, sl_tlog_buf_t *batch,
                                                unsigned *nrec)
{
    net_state_t *n = s->state;
    sl_tlog_buf_t *body = &n->req;
    body->len = 0;
    char head[600];
    json_t *svc =
        json_string(s->cfg.service_name && *s->cfg.service_name ? s->cfg.service_name : "sluice");
    char *svc_json = svc ? json_dumps(svc, JSON_ENCODE_ANY) : NULL;
    json_decref(svc);
    int hl =
        snprintf(head, sizeof(head),
                 "{\"resourceSpans\":[{\"resource\":{\"attributes\":[{\"key\":\"service.name\","
                 "\"value\":{\"stringValue\":%s}}]},\"scopeSpans\":[{\"scope\":{\"name\":"
                 "\"sluice-runtime\"},\"spans\":[",
                 svc_json ? svc_json : "\"sluice\"");
    free(svc_json);
    if (hl < 0 || (size_t)hl >= sizeof(head) || sl_tlog_buf_add(body, head, (size_t)hl) != 0)
        return SL_TLOG_RETRY;
    size_t spans_at = body->len;
    if (sl_tlog_buf_add(body, batch->data, batch->len) != 0)
        return SL_TLOG_RETRY;
    lines_to_commas(body->data + spans_at, body->len - spans_at);
    if (body->len > spans_at && body->data[body->len - 1] == ',')
        body->len--;
    if (sl_tlog_buf_add(body, "]}]}]}", 6) != 0)
        return SL_TLOG_RETRY;
    const char *rbody = NULL;
    size_t rlen = 0;
    int status =
        http_post(s, n, n->http.path, "application/json", body->data, body->len, &rbody, &rlen);
    if (status >= 200 && status < 300 && rlen) {
        json_t *doc = json_loadb(rbody, rlen, 0, NULL);
        json_t *ps = json_object_get(doc, "partialSuccess");
        json_t *rj = json_object_get(ps, "rejectedSpans");
        /* int64 fields are strings in OTLP/JSON; accept a number too. */
        long long rejected = json_is_string(rj)    ? strtoll(json_string_value(rj), NULL, 10)
                             : json_is_integer(rj) ? json_integer_value(rj)
                                                   : 0;
        if (rejected > 0) {
            unsigned lost = rejected >= (long long)*nrec ? *nrec : (unsigned)rejected;
            char why[400];
            snprintf(why, sizeof(why), "the collector rejected %lld span(s): %s", rejected,
                     json_string_value(json_object_get(ps, "errorMessage")) ?: "no reason given");
            sl_tlog_sink_lost(s, lost, why);
            atomic_fetch_add_explicit(&s->written, *nrec - lost, memory_order_relaxed);
            json_decref(doc);
            return SL_TLOG_DELIVERED;
        }
        json_decref(doc);
    }
    return judge(s, n, status, rbody, rlen, *nrec);
}

const sl_tlog_sink_ops_t sl_tlog_otlp_ops = {
    .type = "otlp",
    .encode = otlp_encode,
    .deliver = otlp_deliver,
    .close = net_close,
    .lines_per_record = 1,
    .trace = 1,
};
