/*
 * The policy engine's contract (DESIGN.md "Policies", issue 10).
 *
 * A policy is a folder under policies/ that defines one sl_policy_def_t and
 * is listed in registry.c's static table. It never sees a codec, a socket
 * or a runtime type: the request reaches it through sl_policy_req_t (a view
 * the runtime fills from its protocol-independent request, request.h), so
 * the same code runs for HTTP/1.1, HTTP/2 and gRPC, and the whole folder
 * links into the controller too, whose REST API runs the same validators
 * and compile step (a bad policy config is a 400 with the field path there,
 * never a surprise at the runtime).
 *
 * Life of a policy:
 *   schema      its config's fields, checked by the model's validator
 *               (common/validate.h): unknown fields with "did you mean",
 *               types, ranges, field paths like
 *               spec.policies[1].config.limits[0].period;
 *   compile     config (already valid) -> immutable state for one
 *               generation, shared by every worker; may fail (a key file
 *               that does not parse, a JWKS that is not JSON): then the
 *               Api's routes answer 503 policy_unavailable with the reason
 *               in the Api's status, and every other Api keeps its chains
 *               (fail closed, never open);
 *   worker_state optional per-worker state (rate-limit buckets, caches),
 *               made on a worker's first request of a generation;
 *   on_request  at its phase, in chain order: continue, or short-circuit
 *               with a status, headers and a JSON error body;
 *   on_body     optional: the whole request body, for a policy that asked
 *               for it from on_request (sl_policy_want_body): continue
 *               (the body goes upstream unchanged) or short-circuit, like
 *               on_request. Only then is a body held in memory; every
 *               other request's body streams;
 *   on_response the upstream's (or the gateway's) response head, before
 *               the client gets it: header changes only;
 *   free        when the generation goes.
 *
 * Chains: an Api's `spec.policies` applies to all its operations; an
 * operation's `policies` adds a policy, replaces an inherited one's config
 * (same name), or removes it (`disabled: true`). The compiler resolves
 * this into one ordered chain per route; the runtime sorts it by phase
 * (the def's, or the one its config chooses: phase_of; stable, so the
 * written order holds within a phase). A `when` condition
 * (methods, path prefix, header matches) skips a policy for requests it
 * does not match.
 */
#ifndef SL_POLICY_H
#define SL_POLICY_H

#include "sl_types.h"
#include "validate.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <strings.h>

/* Phases, in the order a request meets them. */
enum sl_policy_phase {
    SL_PHASE_ACCESS = 0, /* ip-filter, cors (a preflight carries no credentials) */
    SL_PHASE_AUTHN,      /* api-key, basic-auth, jwt: who is calling */
    SL_PHASE_AUTHZ,      /* scopes, groups */
    SL_PHASE_RATE_LIMIT, /* rate-limit */
    SL_PHASE_REQUEST,    /* headers, request-size, rewrite, redirect, respond, validation */
    SL_PHASE_CACHE,      /* cache: last, so only a request every other policy let through
                          * is answered from (or fills) the cache */
    SL_PHASE_COUNT
};

/* A short-circuit: what the gateway answers instead of the upstream. */
#define SL_POLICY_MAX_REPLY_HEADERS 8
typedef struct {
    int status;        /* 401, 403, 429, ... */
    const char *code;  /* JSON error code, static: "unauthorized", "rate_limited" */
    char message[256]; /* for the JSON body and the log */
    struct {
        const char *name; /* static */
        char value[192];
    } headers[SL_POLICY_MAX_REPLY_HEADERS];
    unsigned num_headers;
    /* A body of the policy's own instead of the JSON error (respond,
     * redirect): borrowed from the compiled state, lives as long as it. */
    const char *body;
    size_t body_len;
    const char *content_type;
} sl_policy_reply_t;

/* A header edit the chain asks for, on the upstream request or on the
 * response. Strings are borrowed from compiled state or from the request's
 * arena: they live until the request ends. */
typedef enum { SL_HDR_SET = 0, SL_HDR_ADD, SL_HDR_REMOVE } sl_hdr_op_t;
typedef struct {
    sl_hdr_op_t op;
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
} sl_hdr_edit_t;

/* A request header as the codecs deliver it (the same layout as
 * sl_http1_header_t: request.c checks it at compile time). */
typedef struct sl_policy_header {
    sl_str_t name, value;
} sl_policy_header_t;

/* What the chain has learnt about the caller. */
typedef struct {
    const char *name;       /* Consumer name, NULL = anonymous */
    const char *group;      /* its group, NULL = none */
    const char *credential; /* which of its credentials ("laptop"), NULL = n/a */
} sl_policy_consumer_t;

/* The request as a policy sees it: read-only fields filled by the runtime,
 * and the outputs the chain fills. Worker thread only.
 * Lifetimes: in on_request everything may be read. By on_response the
 * request head's buffers are gone: method, host and path are copies,
 * headers and query are empty; keep in the arena (or compute in
 * on_request) whatever a response hook needs from the request. */
typedef struct sl_policy_req {
    /* in */
    sl_str_t method, host, path, query;
    const sl_policy_header_t *headers;
    size_t num_headers;
    const char *client_ip;
    const char *request_id;
    const char *api;       /* namespace/name of the Api */
    const char *operation; /* the route's operation name */
    /* The operation as declared: its path relative to the Api's base path
     * (a template like "/pets/{id}" when route_path_template), the bytes
     * of `path` the base path covers, and its methods (none = any). */
    sl_str_t route_path;
    uint8_t route_path_template;
    size_t base_path_len;
    const char *const *route_methods;
    size_t num_route_methods;
    uint8_t grpc; /* application/grpc: the codec answers a short-circuit as a gRPC status */
    uint64_t now_ms;
    unsigned worker; /* index, for per-worker state */
    /* in/out */
    sl_policy_consumer_t consumer;
    /* The claims of the token the jwt policy verified, for later policies
     * (headers' ${jwt.sub}); NULL when none was. A reference the request
     * holds until it ends (sl_policy_req_end), so response hooks may read
     * it too although the jwt policy's per-worker cache may drop its own
     * meanwhile. Set only when the chain reads claims (env.jwt_claims). */
    json_t *jwt_claims;
    /* out: edits, applied by the codec when it writes the upstream request
     * and the response head (bounded; over the bound the chain fails closed
     * with 500 policy_error rather than dropping an edit) */
    sl_hdr_edit_t *req_edits, *resp_edits;
    unsigned num_req_edits, num_resp_edits, max_edits;
    /* Bit (name length & 63) of every set or remove edit's name, [0] for the
     * upstream request and [1] for the response (sl_policy_edit keeps it):
     * the codecs skip the edit list for headers no edit can name. */
    uint64_t drop_lens[2];
    /* A new query string for the upstream request (the api-key policy
     * removing its parameter); ptr NULL = unchanged. */
    sl_str_t query_out;
    /* A new path for the upstream request (rewrite), as sent: starts with
     * '/', no query; ptr NULL = unchanged. */
    sl_str_t path_out;
    /* A new Host for the upstream request (rewrite), over the Backend's
     * hostRewrite; ptr NULL = unchanged. */
    sl_str_t host_out;
    /* A request body limit of the chain's (request-size), in bytes; 0 =
     * none. The lower of it and the route's maxRequestBodyBytes holds,
     * enforced by the codecs while the body streams. */
    uint64_t max_body_bytes;
    /* The running policy's per-worker state (def->worker_new), set by the
     * chain before each hook; NULL for policies without one. */
    void *worker_state;
    /* 0 when the request certainly has no body (no Content-Length or 0,
     * not chunked; an HTTP/2 stream ended with its head), else 1. */
    uint8_t has_body;
    /* The body the chain asked for (sl_policy_want_body): the entries
     * whose on_body runs (bit i = entry i) and the lowest of their limits;
     * `entry` is the running entry's index, set by the chain. */
    uint64_t body_entries;
    uint64_t body_max_bytes;
    unsigned entry;
    /* Per-request memory for values the chain builds (expanded header
     * values, the new query): sl_policy_alloc. */
    char *arena;
    size_t arena_len, arena_cap;
    /* Chain entries whose `when` held for this request (bit i = entry i),
     * judged once while the request's headers could be read: response
     * hooks use it. */
    uint64_t applied;
    /* which policy of the chain rejected the request, for the log/metrics,
     * and its index in the chain (sl_policy_chain_name) */
    const char *rejected_by;
    unsigned rejected_index;
    /* The response cache (policies/cache): the cache policy's ask for a
     * lookup and a store, carried out by the runtime once the chain has
     * run (runtime/proxy/cache.c); NULL = not cached. Then what the runtime
     * did, for the policy's response hook (X-Cache, Age): "HIT", "MISS",
     * "EXPIRED", "BYPASS" (static, NULL = nothing) and a hit's age. */
    const struct sl_cache_ask *cache;
    const char *cache_status;
    uint32_t cache_age_s;
} sl_policy_req_t;

/* n bytes of the request's arena, or NULL when it is full (the caller
 * fails closed). */
char *sl_policy_alloc(sl_policy_req_t *r, size_t n);

/* The end of a request (the runtime calls it before the view's memory is
 * reused or freed): drops what the view holds (jwt_claims). */
void sl_policy_req_end(sl_policy_req_t *r);

/* The operation's path parameter `name` in the request path (the segment
 * at the template's position, as sent: percent-encoding kept). 0, or -1
 * when the operation has no such parameter. Valid in response hooks too. */
int sl_policy_path_param(const sl_policy_req_t *r, const char *name, size_t name_len,
                         sl_str_t *out);

/* The claim at a dotted path ("org.id") of a token's claims: the literal
 * name first (claim names may hold dots, like URLs), else a walk through
 * nested objects. NULL when absent. */
json_t *sl_policy_claim_at(json_t *claims, const char *path, size_t len);
/* A claim as a header value: strings as they are, numbers and booleans as
 * JSON writes them (into buf); -1 for anything else (objects, lists, null)
 * and for a string with control characters or longer than cap. */
int sl_policy_claim_text(json_t *v, char *buf, size_t cap, sl_str_t *out);

#define SL_POLICY_CONTINUE 0
#define SL_POLICY_REPLY 1

/* From on_request: this policy's on_body wants the whole request body,
 * at most max_bytes of it (0 = SL_POLICY_BODY_DEFAULT_MAX). The runtime
 * buffers it (the lowest limit of the chain and of the route holds; over it
 * the request is answered 413 payload_too_large and nothing is forwarded),
 * then runs the on_body hooks that asked, in chain order. */
#define SL_POLICY_BODY_DEFAULT_MAX (1024 * 1024)
void sl_policy_want_body(sl_policy_req_t *r, uint64_t max_bytes);

/* What compile may use besides its config: the generation's Consumers. */
struct sl_consumers;
typedef struct sl_policy_env {
    const struct sl_consumers *consumers;
    unsigned nworkers; /* worker indexes (sl_policy_req_t.worker) are below it */
    /* A policy of this chain reads the verified token's claims
     * (sl_policy_req_t.jwt_claims): the jwt policy keeps them, and pays
     * for it only then. Set by sl_policy_chain_build. */
    uint8_t jwt_claims;
    /* Compile for diagnosis only (the controller, sl_policy_check_spec):
     * decide from the config alone; start no thread, open no connection,
     * read no file of the runtime's machine, make no shared tables. The
     * state is freed unused. */
    uint8_t check_only;
    const char *api; /* namespace/name of the Api whose chain this is; NULL in tests */
} sl_policy_env_t;

/* What a config refers to outside itself, for checks across an Api: a
 * path parameter the operations must have, or the claims of a token the
 * chain must verify. field: where, as keys under the policy's config. */
typedef enum { SL_POLICY_REF_PATH_PARAM = 0, SL_POLICY_REF_JWT_CLAIM } sl_policy_ref_kind_t;
typedef struct {
    sl_policy_ref_kind_t kind;
    const char *name; /* the parameter's name, the claim's path */
    size_t name_len;
    const char *text; /* as written, for the message: "${path.id}" */
    size_t text_len;
    const char *field[4];
    unsigned nfield;
} sl_policy_ref_t;
typedef void (*sl_policy_ref_fn)(void *ctx, const sl_policy_ref_t *ref);

typedef struct sl_policy_def {
    const char *name;
    enum sl_policy_phase phase;
    /* Optional: the phase of one valid config, when the config chooses
     * (rate-limit's beforeAuthentication); else `phase`. */
    enum sl_policy_phase (*phase_of)(json_t *config);
    const sl_vschema_t *schema; /* the `config` object's fields */
    /* config is valid against schema. Returns the state, or NULL with a
     * reason in err (then the Api fails closed). */
    void *(*compile)(json_t *config, const sl_policy_env_t *env, char *err, size_t errlen);
    void (*free)(void *state);
    int (*on_request)(const void *state, sl_policy_req_t *req, sl_policy_reply_t *reply);
    void (*on_response)(const void *state, sl_policy_req_t *req, int status);
    /* The whole request body (len bytes; body is not NUL-terminated and
     * may be empty), when on_request asked for it. The request head is
     * detached by then, as for on_response: decide from the headers in
     * on_request. SL_POLICY_CONTINUE or SL_POLICY_REPLY. */
    int (*on_body)(const void *state, sl_policy_req_t *req, const char *body, size_t len,
                   sl_policy_reply_t *reply);
    /* Optional per-worker state (caches, counters that need no atomics):
     * made on a worker's first request through this chain entry, freed
     * with the generation. Never shared between workers. */
    void *(*worker_new)(const void *state);
    void (*worker_free)(void *worker_state);
    /* Optional: calls fn for each reference of a valid config
     * (sl_policy_ref_t); used by the Api's validation and the chain. */
    void (*refs)(json_t *config, sl_policy_ref_fn fn, void *ctx);
    /* Optional: the scope label of this entry's rejections in
     * sluice_rate_limit_rejections_total ("local", "fleet"); the runtime
     * counts rejections of policies with a scope there too. Static string. */
    const char *(*metric_scope)(const void *state);
    /* Optional: hides, in a valid config, credentials the schema's
     * SL_VFIELD_SECRET flags cannot name (inside free-form parts), for
     * sl_policy_redact. */
    void (*redact)(json_t *config);
} sl_policy_def_t;

/* The registry (registry.c): every built-in policy, by name. */
/* Replaces the credentials in a valid config of policy `name` by
 * "[redacted]": the schema's SL_VFIELD_SECRET fields and the policy's own
 * redact hook. Unknown names leave config as it is. For every place that
 * shows a config for reading (the runtime's /config_dump). */
void sl_policy_redact(const char *name, json_t *config);
const sl_policy_def_t *sl_policy_find(const char *name);
/* NULL-terminated list of names, for "did you mean" and the docs. */
const char *const *sl_policy_names(void);

/* Validator of a `policies` list (arg: "api" or "operation"), for the
 * model's schema tables: names, unique names, `config` against the
 * policy's schema, `disabled` (operations only), `when`. */
void sl_policy_vcheck_list(sl_vctx_t *c, json_t *v, const void *arg);

/* Checks across an Api spec (its fields already valid; the path at
 * "spec"): every policy's references (sl_policy_ref_t) can be met by an
 * operation the policy applies to, e.g. ${path.id} by an operation whose
 * path template has {id}, ${jwt.sub} by a chain with the jwt policy. */
void sl_policy_vcheck_api(sl_vctx_t *c, json_t *spec);

/* Compiles every policy entry of a valid Api spec in check mode
 * (policies/check.c): the number that cannot be compiled, and in msg
 * "spec.policies[1] (jwt): <reason>; ..." (truncated to msglen). */
int sl_policy_check_spec(json_t *spec, const sl_policy_env_t *env, char *msg, size_t msglen);

/* Query parameter `name` (exact, not decoded) of q: its value, and the
 * bytes [*from, *to) it takes in q. 1 found, 0 not. */
int sl_policy_query_param(sl_str_t q, const char *name, size_t nlen, sl_str_t *val, size_t *from,
                          size_t *to);
/* Sets req->query_out to the request's query without the parameter at
 * [from, to) and one of its '&'; -1 when the arena is full. */
int sl_policy_query_remove(sl_policy_req_t *req, size_t from, size_t to);

/* The request's first header named `name` (len bytes, compared without
 * case), or NULL. Only in on_request: later the headers are gone. */
static inline const sl_policy_header_t *sl_policy_header(const sl_policy_req_t *r, const char *name,
                                                         size_t len)
{
    for (size_t i = 0; i < r->num_headers; i++)
        if (r->headers[i].name.len == len && strncasecmp(r->headers[i].name.ptr, name, len) == 0)
            return &r->headers[i];
    return NULL;
}

/* SHA-256 of n bytes into out, for credentials and cache keys on the
 * request path: the algorithm is fetched once per process and each thread
 * reuses one context (OpenSSL's SHA256() fetches and allocates on every
 * call, which costs more than a short key's hashing). 0, or -1 when OpenSSL
 * fails (the caller fails closed). Any thread. */
int sl_policy_sha256(const void *p, size_t n, uint8_t out[32]);

/* Adds an edit; -1 when the bound is reached (the caller fails closed).
 * Inline: a chain makes several per request. */
static inline int sl_policy_edit(sl_policy_req_t *r, int response, sl_hdr_op_t op, const char *name,
                                 size_t name_len, const char *value, size_t value_len)
{
    sl_hdr_edit_t *list = response ? r->resp_edits : r->req_edits;
    unsigned *n = response ? &r->num_resp_edits : &r->num_req_edits;
    if (!list || *n >= r->max_edits)
        return -1;
    list[*n] = (sl_hdr_edit_t){op, name, name_len, value, value_len};
    (*n)++;
    if (op != SL_HDR_ADD)
        r->drop_lens[response != 0] |= 1ULL << (name_len & 63);
    return 0;
}

#endif
