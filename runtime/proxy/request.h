/*
 * The request, whatever the protocol (DESIGN.md "The request, whatever the
 * protocol"): what a codec (HTTP/1.1 today, HTTP/2 next) hands over once it
 * has a request head, and everything that acts on it afterwards without
 * knowing how it arrived: the request id, the generation it runs on, path
 * normalisation, routing, the limits a route sets, the backend and endpoint
 * choice, retry decisions, outlier reports, the gateway's own errors (their
 * JSON body), metrics and the access log. As Envoy's codecs feed its
 * connection manager and h2o's protocol handlers fill an h2o_req_t, a codec
 * only turns bytes into an sl_req_head_t and answers through its own writer;
 * the rules here are written once and hold for every protocol.
 *
 * Life of an sl_request_t (owned by the codec's stream: one per HTTP/1.1
 * connection, one per HTTP/2 stream):
 *   sl_request_begin     takes the worker's hold on the current generation
 *                        and the start times;
 *   sl_request_set_head  copies what the log and errors need out of the
 *                        codec's buffers (they do not outlive the head);
 *   sl_request_route     normalises, routes, applies the route's limits and
 *                        picks the backend, or says which error to answer;
 *   sl_request_body_*    only when the route's policies asked for the body:
 *                        the codec reads it whole, the body hooks decide;
 *   sl_request_pick_endpoint / _retry_allowed / _note_outcome
 *                        during the upstream exchange;
 *   sl_request_finish    counts and logs it, releases the generation and
 *                        the pool counters, and leaves it ready for the next.
 *
 * Worker-thread only; nothing here writes memory another worker reads.
 * Not here: bytes, framing and sockets (the codecs and the upstream
 * exchange in proxy.c), route matching (router.c), balancing and pools
 * (upstream.c, lb.c).
 */
#ifndef SL_REQUEST_H
#define SL_REQUEST_H

#include "generation.h"
#include "http1.h"
#include "policy.h"
#include "route_rules.h"
#include "srate.h"
#include "upstream.h"
#include "worker.h"

#include <netinet/in.h>
#include <arpa/inet.h>

/* A header field as every codec delivers it: slices into the codec's buffer. */
typedef sl_http1_header_t sl_header_t;

/* A request head, protocol-independent. Slices point into the codec's
 * buffers and live until the codec consumes the head. */
typedef struct {
    sl_str_t method;
    unsigned method_bit; /* enum sl_http_method */
    sl_str_t host;       /* routing host, no port (Host, absolute-form, :authority) */
    sl_str_t authority;  /* host[:port] the origin gets as Host; empty = none sent */
    sl_str_t path;       /* as sent, up to '?' */
    sl_str_t query;      /* after '?' */
    uint8_t has_query;   /* a '?' was sent, even with an empty query */
    sl_str_t target;     /* as sent, for the log */
    const sl_header_t *headers;
    size_t num_headers;
    int version;        /* 10, 11 or 20 (HTTP/1.0, HTTP/1.1, HTTP/2) */
    uint8_t has_length; /* the body size is known up front */
    uint64_t content_length;
} sl_req_head_t;

/* An error the gateway answers itself (DESIGN.md: a JSON body). */
typedef struct {
    int status;
    const char *code; /* "no_route", static */
    char message[300];
    unsigned allow; /* 405: allowed methods (SL_METHOD_* bits) */
    uint8_t close;  /* the connection cannot be reused after it */
} sl_request_error_t;

struct sl_tls_peer;

/* A request's policy state (policies/policy.h), allocated only for routes
 * with a chain: the zero-policy path carries one NULL pointer. */
#define SL_REQ_POLICY_EDITS 128
#define SL_REQ_POLICY_ARENA 4096
typedef struct sl_req_policy {
    sl_policy_req_t v;       /* the chain's view of the request */
    sl_policy_reply_t reply; /* the short-circuit, when replied */
    uint8_t replied;         /* the chain answered the request itself */
    uint8_t responded;       /* the response hooks ran */
    sl_hdr_edit_t edits[2][SL_REQ_POLICY_EDITS];
    char arena[SL_REQ_POLICY_ARENA];
    /* The request body a policy asked for (sl_request_body_cap), while
     * the codec reads it; 0 / empty for every other request. */
    uint64_t body_cap;
    sl_buf_t body;
    /* Routing rules that read the body (route_rules.h): what the head's
     * conditions said, until the body decides (sl_request_body_done). */
    uint8_t rules_deferred;
    sl_route_bits_t rule_bits;
    /* ...and the scoring key, when an output of the block is scored by
     * success rate (the head is gone when the body decides). */
    uint64_t sr_hash;
    char sr_key[SL_SRATE_KEY_NAME_MAX];
    /* A mirror copy waiting for the body (mirror.h), NULL = none. */
    struct sl_mirror_copy *mirror;
} sl_req_policy_t;

typedef struct sl_request {
    sl_worker_t *w;
    const char *client_ip; /* the connection's, outlives the request */
    /* The connection's, set once by the codec and kept across requests: */
    uint8_t https;                  /* the client connection is TLS */
    const struct sl_tls_peer *peer; /* its verified client certificate, or NULL */

    sl_generation_t *gen; /* held (sl_generation_acquire) while set */
    sl_gen_route_t *route;
    sl_gen_cluster_t *cluster;
    /* The routing rules' choice (route_rules.h): cluster is choices[choice];
     * a retry moves to the next. num_choices 0 = the route has no rules. */
    uint8_t num_choices, choice;
    sl_gen_cluster_t *choices[16];
    /* The circuit breaker gauges this request holds (bit SL_CB_*), on
     * cb_stats: the Backend's whose breaker counted it. */
    uint8_t cb_held;
    uint32_t fault_delay_ms; /* injected before the first attempt (sl_exchange_start) */
    struct sl_cluster_stats *cb_stats;
    /* Success-rate routing: the windows of the list chosen from (NULL =
     * none), what to score (slot 0 = nothing), and each choice's backend
     * in those windows, so an attempt is scored for the backend it went to. */
    sl_srate_route_t *sr;
    sl_srate_pick_t sr_pick;
    uint8_t sr_gidx[16];
    int ep_index;            /* endpoint of the current attempt, -1 none */
    sl_pool_t *pool;         /* that endpoint's pool on this worker */
    uint8_t counted_request; /* pool->active_requests counts this request */
    uint8_t counted_retry;   /* pool->retries_active counts this request */
    uint8_t replayable;      /* the request can still be sent again */
    unsigned attempts;
    uint64_t hash;        /* consistent-hash key */
    uint64_t deadline_ms; /* whole request, 0 = none */
    uint64_t start_mono_us;
    uint64_t start_unix_us;

    unsigned method_bit;
    int version;              /* 10, 11, 20 */
    int status;               /* sent or about to be; 0 = none yet */
    uint8_t grpc;             /* content-type application/grpc: gateway errors are gRPC */
    uint32_t grpc_timeout_ms; /* the client's grpc-timeout, 0 = none */
    const char *error_code;   /* gateway error code for the log, static */
    uint64_t bytes_received;  /* request body bytes */
    uint64_t max_body_bytes;  /* the route's limit, or a policy's lower one; 0 = none */
    uint64_t bytes_sent;      /* response bytes, head included */

    /* Strings kept for the traffic log and errors, copied out of the head. */
    char meta[1280];
    size_t meta_len;
    sl_str_t m_method, m_path, m_query, m_host, m_ua, m_referer, m_reqid;
    char upstream_addr[64];
    /* The traffic log's timing of the upstream: the first attempt's start
     * and the response head's arrival (monotonic µs, 0 = none), taken only
     * while a sink is configured. */
    uint64_t upstream_start_us;
    uint64_t upstream_head_us;
    /* The request's and the response's headers as JSON objects, when the
     * record holds them (sl_tlog_headers_json); malloc'd, NULL = none. */
    char *tlog_headers[2];
    uint32_t tlog_headers_len[2];
    /* The request's (0) and the response's (1) body capture for the
     * record, when it holds them (sl_request_body_seen); NULL = none. */
    struct sl_req_body_cap *tlog_body[2];
    /* W3C trace context (sl_request_set_head). trace_state: 0 none;
     * SL_TRACE_SEEN the client's valid traceparent, passed upstream
     * untouched (the Gateway has no spec.tracing); SL_TRACE_OWN the gateway
     * takes part: a server span (span_id, child of parent_id when the
     * client sent one) and the upstream call's span (up_span_id), which is
     * the parent the upstream gets in its traceparent. Hex digits, no NUL. */
    uint8_t trace_state;
    uint8_t trace_flags;  /* 01 = sampled */
    uint8_t trace_parent; /* parent_id is set */
    char trace_id[32];
    char parent_id[16];
    char span_id[16];
    char up_span_id[16];
    sl_req_policy_t *pol; /* NULL unless the route has a policy chain */
    /* the response cache's part in the request (cache.h), or NULL */
    struct sl_cache_req *cache;
} sl_request_t;

enum { SL_TRACE_NONE = 0, SL_TRACE_SEEN, SL_TRACE_OWN };

/* Whether the request's upstream timing is taken: for the traffic log,
 * spans and Server-Timing. */
static inline int sl_request_timed(const sl_request_t *r)
{
    return sl_tlog_active() || (r->gen && r->gen->tracing.enabled);
}

/* The traceparent value the upstream gets ("00-<trace>-<span>-<flags>",
 * 55 bytes, no NUL) for a request with trace_state SL_TRACE_OWN. */
void sl_request_traceparent(const sl_request_t *r, char out[55]);

/* The Server-Timing field value (gateway and upstream milliseconds so
 * far); returns its length (< cap). */
size_t sl_request_server_timing(const sl_request_t *r, char *out, size_t cap);

/* The traffic log's copy of body bytes as a codec moves them towards their
 * peer (dir 0: the request's, to the upstream; 1: the response's, to the
 * client): the first bodies.maxBytes of the payload are kept, the rest only
 * counted, nothing is held back or read ahead. framed: p holds chunked
 * framing (HTTP/1.1 passed through verbatim), which the copy strips.
 * Without a capture set up (the record holds no body: every request of a
 * Gateway without them) this is one test of a pointer. */
void sl_request_body_capture(sl_request_t *r, int dir, const char *p, size_t n, int framed);
static inline void sl_request_body_seen(sl_request_t *r, int dir, const char *p, size_t n,
                                        int framed)
{
    if (sl_unlikely(r->tlog_body[dir] != NULL))
        sl_request_body_capture(r, dir, p, n, framed);
}

/* Ready for a first request (zeroes it; no generation held). */
void sl_request_init(sl_request_t *r, sl_worker_t *w, const char *client_ip);

/* Start of a request: holds the current generation (NULL when the runtime
 * has none yet) and takes the start times. */
void sl_request_begin(sl_request_t *r);

/* Copies the request id (the client's X-Request-Id when valid, else a new
 * UUIDv4) and the strings the log needs out of the head. */
void sl_request_set_head(sl_request_t *r, const sl_req_head_t *h);

/* A request id for errors answered before there was a head. */
void sl_request_ensure_id(sl_request_t *r);

/*
 * Normalises the path, routes the request and applies what the route says
 * before anything is sent upstream: the body limit (by the length announced),
 * the backend choice (weighted), the hash key and the deadline. *path is the
 * path to forward (the normalised one, in per-worker storage valid until
 * the next call on this worker). Returns SL_OK, or SL_ERROR with *err set.
 */
int sl_request_route(sl_request_t *r, const sl_req_head_t *h, sl_str_t *path,
                     sl_request_error_t *err);

/* Picks the endpoint of the next attempt (not the one that just failed, if
 * there is another), counts the attempt, and joins its pool. Returns SL_OK
 * or SL_ERROR with *err (503 no_healthy_upstream / upstream_pool_full). */
int sl_request_pick_endpoint(sl_request_t *r, sl_request_error_t *err);

/* Whether a failed attempt (kind, or a 5xx `status`) may be retried: the
 * route's retry policy, idempotency, the deadline and the retry budget. */
int sl_request_retry_allowed(const sl_request_t *r, enum sl_upstream_error kind, int status,
                             int response_started);

/* Counts a retry (before its sl_request_pick_endpoint), and then, once the
 * attempt is under way, its place in the endpoint's retry budget. */
void sl_request_count_retry(sl_request_t *r);
void sl_request_retry_started(sl_request_t *r);

/* The Backend's circuit breaker (circuitBreaker) before a new upstream
 * connection: SL_OK, or SL_ERROR with *err (503 circuit_open) when its
 * connections or requests waiting for one are at their limit. Then
 * sl_request_cb_connected once the connection is up. */
int sl_request_cb_connect(sl_request_t *r, sl_request_error_t *err);
void sl_request_cb_connected(sl_request_t *r);

/* Counts an attempt on a pooled connection that the upstream had closed. */
void sl_request_count_reuse_failure(sl_request_t *r);

/* Whether the route retries this request when its connection is reset
 * before a response: then a pooled connection need not be checked with a
 * system call before it carries the request (upstream.h). */
int sl_request_retried_on_reset(const sl_request_t *r);

/*
 * Policies (policies/policy.h), for the codecs and the exchange:
 *   sl_request_header_dropped  whether a header of the upstream request
 *                              (response = 0) or of the response (1) is
 *                              removed or replaced by the chain;
 *   sl_request_header_added    the headers the chain sets or adds, into f
 *                              (returns how many);
 *   sl_request_response_hooks  runs the chain's response hooks once, for a
 *                              response of `status` (upstream's or ours);
 *   sl_request_reply           the chain's short-circuit, or NULL.
 */
int sl_request_header_dropped_scan(const sl_request_t *r, int response, sl_str_t name);
static inline int sl_request_header_dropped(const sl_request_t *r, int response, sl_str_t name)
{
    /* Every forwarded header asks: most names have a length no edit has. */
    if (!r->pol || !(r->pol->v.drop_lens[response != 0] & (1ULL << (name.len & 63))))
        return 0;
    return sl_request_header_dropped_scan(r, response, name);
}
size_t sl_request_header_added(const sl_request_t *r, int response, sl_header_t *f, size_t cap);
/* The headers the chain sets or adds, written as HTTP/1.1 header lines
 * (the HTTP/1.1 codec and the upstream request head): no copy through
 * sl_request_header_added. r->pol is set. */
static inline void sl_request_append_policy_fields(const sl_request_t *r, int response, sl_buf_t *b)
{
    const sl_hdr_edit_t *e = response ? r->pol->v.resp_edits : r->pol->v.req_edits;
    unsigned n = response ? r->pol->v.num_resp_edits : r->pol->v.num_req_edits;
    for (unsigned i = 0; i < n; i++)
        if (e[i].op != SL_HDR_REMOVE)
            sl_buf_append_field(b, e[i].name, e[i].name_len, e[i].value, e[i].value_len);
}
void sl_request_response_hooks(sl_request_t *r, int status);
const sl_policy_reply_t *sl_request_reply(const sl_request_t *r);

/*
 * A request body the chain asked for (policy.h, sl_policy_want_body), for
 * the codecs. Every other request's body streams as before: the check is
 * one pointer test on a route without policies.
 *   sl_request_body_cap   0: stream the body; else read all of it first,
 *                         at most this many bytes, before the exchange
 *                         starts (the upstream head is built without a
 *                         length: sl_exchange_set_body_length);
 *   sl_request_body_add   n more body bytes: SL_OK, or SL_ERROR with *err
 *                         (413 payload_too_large) past the cap;
 *   sl_request_body_done  the body is complete: runs the body hooks. SL_OK
 *                         moves the body into *body (the caller's now, to
 *                         forward unchanged); SL_ERROR with *err is the
 *                         chain's short-circuit (sl_request_reply).
 */
static inline uint64_t sl_request_body_cap(const sl_request_t *r)
{
    return sl_unlikely(r->pol != NULL) ? r->pol->body_cap : 0;
}
int sl_request_body_add(sl_request_t *r, const void *p, size_t n, sl_request_error_t *err);
int sl_request_body_done(sl_request_t *r, sl_buf_t *body, sl_request_error_t *err);

/* A UUIDv4 request id from the worker's generator. */
void sl_request_make_id(sl_lb_rng_t *rng, char out[37]);

/* Reports the attempt's outcome to passive outlier detection. */
void sl_request_note_outcome(sl_request_t *r, int success);

/* Counts an upstream failure of the current attempt (and scores it for
 * success-rate routing when its kind is a failure there). */
void sl_request_count_error(sl_request_t *r, enum sl_upstream_error kind);

/* The upstream's response head of the current attempt, for success-rate
 * routing (status, failure.statuses, failure.header). */
void sl_request_srate_response(sl_request_t *r, int status, const sl_header_t *headers, size_t n);
static inline void sl_request_note_response(sl_request_t *r, int status, const sl_header_t *headers,
                                            size_t n)
{
    if (sl_unlikely(r->sr_pick.slot))
        sl_request_srate_response(r, status, headers, n);
}

/* Leaves the pool counters of the current attempt. */
void sl_request_leave_pool(sl_request_t *r);

/* The JSON body of a gateway error; returns its length (< cap). */
size_t sl_request_error_body(sl_request_t *r, int status, const char *code, const char *message,
                             char *buf, size_t cap);

/* The upstream's response head arrived (each codec's upstream side, before
 * handing it to the client's): its time and, when the record holds them,
 * its headers. */
void sl_request_upstream_head(sl_request_t *r, const sl_header_t *headers, size_t n);

/* Metrics and the traffic log record for the request, once. */
void sl_request_log(sl_request_t *r);

/* Releases the generation and the pool counters and clears the per-request
 * state; the request is ready for sl_request_begin again. */
void sl_request_reset(sl_request_t *r);

/*
 * The gRPC status for an error the gateway answers itself (gRPC's HTTP to
 * status mapping, with the gateway's own causes made precise): timeouts are
 * DEADLINE_EXCEEDED (4), limits RESOURCE_EXHAUSTED (8), no route or method
 * UNIMPLEMENTED (12), upstream failures UNAVAILABLE (14), 401/403
 * UNAUTHENTICATED (16) / PERMISSION_DENIED (7), anything else INTERNAL (13).
 */
int sl_request_grpc_status(int http_status, const char *code);

/* "Date: <IMF-fixdate>\r\n" for now, formatted once a second per worker. */
const char *sl_request_date_line(size_t *len);

#endif
