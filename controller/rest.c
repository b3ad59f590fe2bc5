/*
 * The controller's REST admin API (rest.h) on libevent's evhttp.
 *
 * Responsible for: parsing the listen address and refusing a non-loopback one
 * without a token, bearer-token authentication (constant time), routing
 * /api/v1 paths to resources, reading bodies (JSON or YAML, bounded),
 * validating them with the shared model library and answering 400 with
 * field paths, optimistic concurrency (If-Match -> 412, a stale
 * metadata.resourceVersion in the body -> 409), mapping store results to
 * status codes, merging the controller's status into GETs, the immutable
 * (--resources) mode, /healthz, /readyz and the Prometheus text of
 * /metrics, and JSON errors for everything that goes wrong. With
 * --rest-tls-cert, the same API over HTTPS: evhttp gets an OpenSSL
 * bufferevent per accepted connection (evhttp_set_bevcb), so nothing above
 * the socket knows about TLS.
 *
 * Not responsible for: durability and server-set metadata (store.c), status
 * and compilation (core.c: we only tell it that something changed), nor the
 * Kubernetes-compatible paths (/version, /api, /apis/..., /openapi/...),
 * which kapi.c serves on this listener once the token is checked here.
 *
 * Main thread only, like the store and the core it calls.
 */
#include "rest.h"

#include "ctrl_metrics.h"
#include "kapi.h"
#include "objects.h"
#include "ssa.h"

#include "bearer.h"
#include "rest_tls.h"
#include "hostport.h"
#include "log.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Headers of an admin request are small; a long Authorization header is the
 * largest legitimate one. */
#define REST_MAX_HEADER_BYTES (64 * 1024)
/* A client that sends nothing for this long is dropped. */
#define REST_TIMEOUT_S 60
/* Path segments after /api/v1 (namespaces/{ns}/{plural}/{name}). */
#define REST_MAX_SEGMENTS 5
/* DNS-1123 bounds, as validate.c applies them to metadata. */
#define REST_MAX_NAME 253
#define REST_MAX_NAMESPACE 63

struct sl_rest {
    struct evhttp *http;
    struct evhttp_bound_socket *bound;
    sl_store_t *st;
    sl_controller_t *ctl;
    sl_rest_options_t opt;
    bool have_token;
    unsigned char token_sha256[32];
    int port;
    SSL_CTX *ssl_ctx; /* HTTPS; NULL = plain HTTP */
    sl_kapi_t *kapi;  /* the Kubernetes-compatible paths */
};


/* What a request is about, once the path is parsed. */
enum target {
    T_DISCOVERY,  /* /api/v1 */
    T_RUNTIMES,   /* /api/v1/runtimes */
    T_STATUS,     /* /api/v1/status */
    T_RESOURCES,  /* /api/v1/resources */
    T_COLLECTION, /* /api/v1/{plural} */
    T_OBJECT,     /* /api/v1/{plural}/{name} */
};

typedef struct {
    sl_rest_t *rest;
    struct evhttp_request *req;
    enum evhttp_cmd_type cmd;
    enum target target;
    enum sl_kind kind;
    char name[REST_MAX_NAME + 1];
    /* Namespace named by the path or ?namespace=, "" when none. */
    char ns[REST_MAX_NAMESPACE + 1];
} call_t;

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ---- replies -------------------------------------------------------------- */

static int dump_cb(const char *buf, size_t size, void *data)
{
    return evbuffer_add(data, buf, size);
}

/* Sends `doc` (stolen) as JSON. */
static void send_json(struct evhttp_request *req, int status, json_t *doc)
{
    sl_objects_public_view(doc);
    struct evbuffer *body = evbuffer_new();
    if (!doc || !body ||
        json_dump_callback(doc, dump_cb, body, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) != 0 ||
        evbuffer_add(body, "\n", 1) != 0) {
        json_decref(doc);
        if (body)
            evbuffer_free(body);
        /* The constant fallback cannot fail to serialise. */
        static const char oom[] = "{\"error\":{\"status\":500,\"code\":\"internal_error\","
                                  "\"message\":\"out of memory building the response\"}}\n";
        body = evbuffer_new();
        if (!body) {
            sl_ctrl_count_rest(evhttp_request_get_command(req), 500);
            evhttp_send_error(req, 500, "Internal Server Error");
            return;
        }
        evbuffer_add(body, oom, sizeof(oom) - 1);
        sl_objects_send(req, 500, "application/json", body);
        evbuffer_free(body);
        return;
    }
    json_decref(doc);
    sl_objects_send(req, status, "application/json", body);
    evbuffer_free(body);
}

/* {"error":{"status","code","message"[,"details"]}}; details is stolen. The
 * message is built with jansson, so request data in it is escaped. */
static void reply_error(struct evhttp_request *req, int status, const char *code, json_t *details,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void reply_error(struct evhttp_request *req, int status, const char *code, json_t *details,
                        const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    json_t *e = json_pack("{s:i, s:s, s:s}", "status", status, "code", code, "message", msg);
    if (e && details)
        json_object_set_new(e, "details", details);
    else
        json_decref(details);
    send_json(req, status, e ? json_pack("{s:o}", "error", e) : NULL);
}

static void reply_405(struct evhttp_request *req, const char *allow, const char *what)
{
    evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", allow);
    reply_error(req, 405, "method_not_allowed", NULL, "%s accepts %s only", what, allow);
}

static void set_etag(struct evhttp_request *req, json_t *obj)
{
    const char *rv =
        json_string_value(json_object_get(json_object_get(obj, "metadata"), "resourceVersion"));
    if (!rv)
        return;
    char etag[48];
    snprintf(etag, sizeof(etag), "\"%.40s\"", rv);
    evhttp_add_header(evhttp_request_get_output_headers(req), "ETag", etag);
}

/* ---- names ---------------------------------------------------------------- */

/* DNS-1123 subdomain (metadata.name): lowercase alphanumerics, '-' and '.',
 * starting and ending alphanumeric. */
static bool valid_name(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n == 0 || n > max)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
        if (!alnum && c != '-' && (c != '.' || max == REST_MAX_NAMESPACE))
            return false;
        if ((i == 0 || i == n - 1) && !alnum)
            return false;
    }
    return true;
}

static void plural_list(char *out, size_t len)
{
    size_t off = 0;
    out[0] = '\0';
    for (int k = 0; k < SL_KIND__COUNT && off < len; k++)
        off += (size_t)snprintf(out + off, len - off, "%s%s", k ? ", " : "",
                                sl_kind_plural((enum sl_kind)k));
}

/* ---- authentication ------------------------------------------------------- */

/* The bearer token, compared in constant time (common/bearer.c). */
static bool authorized(sl_rest_t *rest, struct evhttp_request *req, bool *presented)
{
    const char *h = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    return sl_bearer_check(h, rest->token_sha256, presented);
}

/* A PostgreSQL store that cannot be reached: 503 naming it, with the
 * reason; the runtimes keep serving what they have. */
static void reply_store_unavailable(struct evhttp_request *req, sl_store_t *st, const char *msg)
{
    char why[700] = "";
    if (!msg || !msg[0]) {
        sl_store_available(st, why, sizeof(why));
        msg = why[0] ? why : "the store is unavailable";
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
    reply_error(req, 503, "store_unavailable", NULL, "%s", msg);
}

/* ---- health and metrics -------------------------------------------------- */

static void handle_healthz(call_t *c)
{
    send_json(c->req, 200, json_pack("{s:s}", "status", "ok"));
}

static void handle_readyz(call_t *c)
{
    sl_rest_t *r = c->rest;
    bool data = r->st || (r->opt.read_only && r->opt.static_set);
    char why[600] = "";
    bool ready = data && (!r->opt.is_ready || r->opt.is_ready(r->opt.ready_ctx, why, sizeof(why)));
    if (ready)
        send_json(c->req, 200, json_pack("{s:s}", "status", "ready"));
    else
        reply_error(c->req, 503, "not_ready", NULL, "%s",
                    why[0] ? why
                           : "the controller is starting: the store or the config stream server "
                             "is not up yet");
}

static void metric(struct evbuffer *b, const char *name, const char *type, const char *help,
                   uint64_t value)
{
    evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %" PRIu64 "\n", name, help, name, type,
                        name, value);
}

static void handle_metrics(call_t *c)
{
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        reply_error(c->req, 500, "internal_error", NULL, "out of memory");
        return;
    }
    sl_ctrl_metrics_t *m = &sl_ctrl_metrics;
    metric(b, "sluice_controller_pushes_total", "counter",
           "Config responses sent to runtimes over the stream.", atomic_load(&m->pushes));
    metric(b, "sluice_controller_acks_total", "counter", "Pushes acknowledged by runtimes.",
           atomic_load(&m->acks));
    metric(b, "sluice_controller_nacks_total", "counter", "Pushes rejected (NACKed) by runtimes.",
           atomic_load(&m->nacks));
    metric(b, "sluice_controller_compiles_total", "counter",
           "Compilations of the resources into snapshots.", atomic_load(&m->compiles));
    metric(b, "sluice_controller_compile_errors_total", "counter",
           "Compilations that reported errors.", atomic_load(&m->compile_errors));
    int64_t connected = atomic_load(&m->runtimes_connected);
    metric(b, "sluice_controller_runtimes_connected", "gauge",
           "Runtimes with an open config stream.", connected < 0 ? 0 : (uint64_t)connected);
    metric(b, "sluice_controller_config_version", "gauge", "Latest config version compiled.",
           atomic_load(&m->config_version));
    metric(b, "sluice_controller_streams_replaced_total", "counter",
           "Streams closed because a newer stream of the same node id arrived.",
           atomic_load(&m->streams_replaced));
    metric(b, "sluice_controller_streams_refused_total", "counter",
           "Streams closed for an invalid request (node, version) or a full runtime table.",
           atomic_load(&m->streams_refused));
    metric(b, "sluice_controller_streams_over_limit_total", "counter",
           "New streams ended at once because --max-streams were open.",
           atomic_load(&m->streams_over_limit));
    metric(b, "sluice_controller_stream_accepts_deferred_total", "counter",
           "New streams that waited (in order) for --stream-accept-rate.",
           atomic_load(&m->stream_accepts_deferred));
    metric(b, "sluice_controller_runtime_records", "gauge",
           "Runtimes the controller keeps a record of, connected or not.",
           atomic_load(&m->runtime_records));
    metric(b, "sluice_controller_runtimes_forgotten_total", "counter",
           "Records of disconnected runtimes dropped (--runtime-expiry, --max-runtimes).",
           atomic_load(&m->runtimes_expired));
    uint64_t writes = atomic_load(&m->store_writes);
    metric(b, "sluice_controller_store_writes_total", "counter",
           "Successful durable writes to the store.", writes);
    evbuffer_add_printf(b, "# HELP sluice_controller_store_read_seconds Latency of store reads "
                           "(a get, a list, the load of every resource for a compile, a counter "
                           "read).\n# TYPE sluice_controller_store_read_seconds histogram\n");
    sl_ctrl_hist_render(b, "sluice_controller_store_read_seconds", "", &sl_ctrl_store_read_seconds);
    evbuffer_add_printf(b, "# HELP sluice_controller_store_write_seconds Latency of durable store "
                           "writes (a transaction, fsync included): REST writes and the "
                           "controller's version counters.\n"
                           "# TYPE sluice_controller_store_write_seconds histogram\n");
    sl_ctrl_hist_render(b, "sluice_controller_store_write_seconds", "",
                        &sl_ctrl_store_write_seconds);
    evbuffer_add_printf(b, "# HELP sluice_controller_push_duration_seconds Time from sending a "
                           "config response on a runtime's stream to that runtime's ACK or NACK "
                           "of its nonce, by result.\n"
                           "# TYPE sluice_controller_push_duration_seconds histogram\n");
    sl_ctrl_hist_render(b, "sluice_controller_push_duration_seconds", "result=\"ack\"",
                        &sl_ctrl_push_ack_seconds);
    sl_ctrl_hist_render(b, "sluice_controller_push_duration_seconds", "result=\"nack\"",
                        &sl_ctrl_push_nack_seconds);
    sl_ctrl_render_watch(b);
    sl_controller_render_metrics(c->rest->ctl, b);
    sl_ctrl_render_rest(b);
    sl_objects_send(c->req, 200, "text/plain; version=0.0.4; charset=utf-8", b);
    evbuffer_free(b);
}

/* ---- request bodies ------------------------------------------------------- */

typedef struct {
    const char *text;
    size_t len;
    bool json; /* declared application/json */
} body_t;

/* Reads and checks the body. Returns 0, or -1 after replying. */
static int read_body(call_t *c, body_t *b)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(c->req);
    size_t len = evbuffer_get_length(in);
    size_t max = c->rest->opt.max_body_bytes;
    if (len > max) {
        reply_error(c->req, 413, "too_large", NULL,
                    "request body of %zu bytes exceeds the limit of %zu bytes; split the file", len,
                    max);
        return -1;
    }
    const char *ct = evhttp_find_header(evhttp_request_get_input_headers(c->req), "Content-Type");
    b->json = false;
    if (ct) {
        /* The media type, without parameters (charset) and case-insensitive. */
        size_t n = strcspn(ct, ";");
        while (n && (ct[n - 1] == ' ' || ct[n - 1] == '\t'))
            n--;
        static const char *const yaml[] = {"application/yaml", "application/x-yaml", "text/yaml",
                                           "text/x-yaml"};
        bool ok = false;
        if (n == strlen("application/json") && strncasecmp(ct, "application/json", n) == 0)
            ok = b->json = true;
        for (size_t i = 0; !ok && i < sizeof(yaml) / sizeof(yaml[0]); i++)
            ok = n == strlen(yaml[i]) && strncasecmp(ct, yaml[i], n) == 0;
        if (!ok) {
            reply_error(c->req, 415, "unsupported_media_type", NULL,
                        "Content-Type '%.100s' is not supported; send application/json or "
                        "application/yaml (curl --data sends a form type unless you add -H "
                        "'Content-Type: application/yaml')",
                        ct);
            return -1;
        }
    }
    b->text = len ? (const char *)evbuffer_pullup(in, -1) : "";
    b->len = len;
    if (len && !b->text) {
        reply_error(c->req, 500, "internal_error", NULL, "out of memory reading the body");
        return -1;
    }
    if (b->json) {
        size_t i = 0;
        while (i < len && (b->text[i] == ' ' || b->text[i] == '\t' || b->text[i] == '\r' ||
                           b->text[i] == '\n'))
            i++;
        if (i < len && b->text[i] != '{' && b->text[i] != '[') {
            reply_error(c->req, 400, "invalid_json", NULL,
                        "the body is not a JSON object although Content-Type is "
                        "application/json (send the object, or Content-Type: application/yaml)");
            return -1;
        }
    }
    return 0;
}

/* The first document of a body that failed validation, to name it in the
 * message. NULL when the body cannot be parsed at all. */
static json_t *peek_first_doc(const body_t *b)
{
    sl_errors_t errs;
    sl_errors_init(&errs);
    json_t *docs = sl_yaml_to_json(b->text, b->len, "", &errs);
    sl_errors_free(&errs);
    if (!docs)
        return NULL;
    json_t *first = NULL;
    size_t i;
    json_t *d;
    json_array_foreach(docs, i, d)
    {
        if (json_is_array(d))
            d = json_array_get(d, 0);
        if (json_is_object(d)) {
            first = json_incref(d);
            break;
        }
    }
    json_decref(docs);
    return first;
}

static json_t *error_details(const sl_errors_t *errs, bool with_doc)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < errs->count; i++) {
        const sl_error_t *e = &errs->items[i];
        json_t *d = json_pack("{s:s, s:s}", "field", e->field ? e->field : "", "message",
                              e->message ? e->message : "");
        if (d && with_doc && e->doc > 0)
            json_object_set_new(d, "document", json_integer(e->doc));
        json_array_append_new(arr, d);
    }
    return arr;
}

/* 400 for a body that did not validate, naming the object when possible:
 * "Api default/petstore is invalid". */
static void reply_invalid(call_t *c, const body_t *b, const sl_errors_t *errs)
{
    json_t *doc = peek_first_doc(b);
    json_t *meta = json_object_get(doc, "metadata");
    const char *kind = json_string_value(json_object_get(doc, "kind"));
    const char *name = json_string_value(json_object_get(meta, "name"));
    const char *ns = json_string_value(json_object_get(meta, "namespace"));
    if (!kind)
        kind = sl_kind_name(c->kind);
    if (!ns)
        ns = c->ns[0] ? c->ns : "default";
    if (!name && c->name[0])
        name = c->name;
    json_t *details = error_details(errs, false);
    if (name)
        reply_error(c->req, 400, "invalid", details, "%.64s %.63s/%.253s is invalid", kind, ns,
                    name);
    else
        reply_error(c->req, 400, "invalid", details, "the %.64s document is invalid", kind);
    json_decref(doc);
}

/* ---- preconditions -------------------------------------------------------- */

/* If-Match: "5" (also W/"5", 5 and *). Returns 0 with *out filled ("" when
 * absent, "*" for any), or -1 after replying 400. */
static int parse_if_match(call_t *c, char *out, size_t outlen)
{
    out[0] = '\0';
    const char *h = evhttp_find_header(evhttp_request_get_input_headers(c->req), "If-Match");
    if (!h)
        return 0;
    while (*h == ' ' || *h == '\t')
        h++;
    if (strncmp(h, "W/", 2) == 0)
        h += 2;
    size_t n = strlen(h);
    while (n && (h[n - 1] == ' ' || h[n - 1] == '\t'))
        n--;
    if (n == 1 && h[0] == '*') {
        snprintf(out, outlen, "*");
        return 0;
    }
    if (n >= 2 && h[0] == '"' && h[n - 1] == '"') {
        h++;
        n -= 2;
    }
    bool digits = n > 0 && n < 21 && n < outlen;
    for (size_t i = 0; digits && i < n; i++)
        digits = h[i] >= '0' && h[i] <= '9';
    if (!digits) {
        reply_error(c->req, 400, "invalid_header", NULL,
                    "If-Match must be one quoted resourceVersion, e.g. If-Match: \"42\" (the ETag "
                    "of a GET)");
        return -1;
    }
    memcpy(out, h, n);
    out[n] = '\0';
    return 0;
}

/* ---- namespaces ----------------------------------------------------------- */

/* Reconciles the namespace of the request with metadata.namespace of the
 * body, and makes it explicit in the body. Returns 0, or -1 after replying. */
static int settle_namespace(call_t *c, json_t *obj, const char *explicit_ns, char *out,
                            size_t outlen)
{
    json_t *meta = json_object_get(obj, "metadata");
    const char *body_ns = json_string_value(json_object_get(meta, "namespace"));
    if (explicit_ns[0] && body_ns && strcmp(body_ns, explicit_ns) != 0) {
        json_t *d = json_pack("[{s:s, s:s}]", "field", "metadata.namespace", "message",
                              "differs from the namespace of the request");
        reply_error(c->req, 400, "namespace_mismatch", d,
                    "metadata.namespace is '%.63s' but the request is for namespace '%.63s'; make "
                    "them agree or drop one",
                    body_ns, explicit_ns);
        return -1;
    }
    const char *ns = explicit_ns[0] ? explicit_ns : body_ns ? body_ns : "default";
    snprintf(out, outlen, "%s", ns);
    if (json_object_set_new(meta, "namespace", json_string(out)) != 0) {
        reply_error(c->req, 500, "internal_error", NULL, "out of memory");
        return -1;
    }
    return 0;
}

/* ---- objects -------------------------------------------------------------- */

static void static_list(sl_rest_t *r, enum sl_kind kind, const char *ns, json_t *items)
{
    const sl_resource_set_t *set = r->opt.static_set;
    for (size_t i = 0; i < set->count; i++) {
        const sl_resource_t *it = &set->items[i];
        if (it->kind == kind && (!ns || strcmp(it->ns, ns) == 0))
            json_array_append_new(items, json_deep_copy(it->obj));
    }
}

static int cmp_ns_name(const void *a, const void *b)
{
    json_t *x = json_object_get(*(json_t *const *)a, "metadata");
    json_t *y = json_object_get(*(json_t *const *)b, "metadata");
    const char *xn = json_string_value(json_object_get(x, "namespace"));
    const char *yn = json_string_value(json_object_get(y, "namespace"));
    int d = strcmp(xn ? xn : "default", yn ? yn : "default");
    if (d)
        return d;
    const char *xm = json_string_value(json_object_get(x, "name"));
    const char *ym = json_string_value(json_object_get(y, "name"));
    return strcmp(xm ? xm : "", ym ? ym : "");
}

static void handle_list(call_t *c)
{
    sl_rest_t *r = c->rest;
    const char *ns = c->ns[0] ? c->ns : NULL;
    json_t *items = NULL;
    char rv[24] = "0";
    if (r->opt.read_only && r->opt.static_set) {
        items = json_array();
        if (items) {
            static_list(r, c->kind, ns, items);
            /* Files are in file order; lists are in (namespace, name) order. */
            size_t n = json_array_size(items);
            json_t **v = n ? calloc(n, sizeof(*v)) : NULL;
            if (n && !v) {
                json_decref(items);
                items = NULL;
            } else {
                for (size_t i = 0; i < n; i++)
                    v[i] = json_incref(json_array_get(items, i));
                if (n)
                    qsort(v, n, sizeof(*v), cmp_ns_name);
                json_array_clear(items);
                for (size_t i = 0; i < n; i++)
                    json_array_append_new(items, v[i]);
                free(v);
            }
        }
    } else {
        enum sl_store_result lr = sl_store_list(r->st, c->kind, ns, &items);
        if (lr == SL_STORE_UNAVAILABLE) {
            reply_store_unavailable(c->req, r->st, NULL);
            return;
        }
        if (lr != SL_STORE_OK)
            items = NULL;
        snprintf(rv, sizeof(rv), "%" PRIu64, sl_store_resource_version(r->st));
    }
    if (!items) {
        reply_error(c->req, 500, "store_error", NULL, "cannot list %s (see the controller log)",
                    sl_kind_plural(c->kind));
        return;
    }
    size_t i;
    json_t *o;
    json_array_foreach(items, i, o)
    {
        sl_objects_with_status(r->ctl, o);
    }
    char list_kind[48];
    snprintf(list_kind, sizeof(list_kind), "%sList", sl_kind_name(c->kind));
    send_json(c->req, 200,
              json_pack("{s:s, s:s, s:s, s:o}", "apiVersion", SL_API_VERSION, "kind", list_kind,
                        "resourceVersion", rv, "items", items));
}

static void handle_get(call_t *c)
{
    sl_rest_t *r = c->rest;
    const char *ns = c->ns[0] ? c->ns : "default";
    json_t *obj = NULL;
    if (r->opt.read_only && r->opt.static_set) {
        const sl_resource_set_t *set = r->opt.static_set;
        for (size_t i = 0; i < set->count && !obj; i++) {
            const sl_resource_t *it = &set->items[i];
            if (it->kind == c->kind && strcmp(it->ns, ns) == 0 && strcmp(it->name, c->name) == 0)
                obj = json_deep_copy(it->obj);
        }
    } else {
        enum sl_store_result res = sl_store_get(r->st, c->kind, ns, c->name, &obj);
        if (res == SL_STORE_UNAVAILABLE) {
            reply_store_unavailable(c->req, r->st, NULL);
            return;
        }
        if (res == SL_STORE_ERROR) {
            reply_error(c->req, 500, "store_error", NULL,
                        "cannot read %s %s/%s (see the controller log)", sl_kind_name(c->kind), ns,
                        c->name);
            return;
        }
    }
    if (!obj) {
        reply_error(c->req, 404, "not_found", NULL,
                    "%s \"%s/%s\" not found (list them with GET /api/v1/%s?namespace=%s)",
                    sl_kind_name(c->kind), ns, c->name, sl_kind_plural(c->kind), ns);
        return;
    }
    set_etag(c->req, obj);
    send_json(c->req, 200, sl_objects_with_status(r->ctl, obj));
}

static void reply_store_failure(call_t *c, enum sl_store_result res, bool if_match, const char *msg)
{
    switch (res) {
    case SL_STORE_UNAVAILABLE:
        reply_store_unavailable(c->req, c->rest->st, msg);
        break;
    case SL_STORE_EXISTS:
        reply_error(c->req, 409, "already_exists", NULL, "%s", msg);
        break;
    case SL_STORE_NOT_FOUND:
        if (c->cmd == EVHTTP_REQ_DELETE)
            reply_error(c->req, 404, "not_found", NULL, "%s", msg);
        else if (if_match)
            reply_error(c->req, 412, "precondition_failed", NULL, "%s", msg);
        else
            reply_error(c->req, 409, "conflict", NULL,
                        "%s; remove metadata.resourceVersion to create it", msg);
        break;
    case SL_STORE_CONFLICT:
        if (if_match)
            reply_error(c->req, 412, "precondition_failed", NULL, "%s", msg);
        else
            reply_error(c->req, 409, "conflict", NULL, "%s", msg);
        break;
    default:
        reply_error(c->req, 500, "store_error", NULL, "%s", msg);
        break;
    }
}

/* POST to a collection (create) or PUT of a named object (create or
 * replace). */
static void handle_write(call_t *c)
{
    sl_rest_t *r = c->rest;
    bool is_put = c->cmd == EVHTTP_REQ_PUT;
    char if_match[24];
    if (is_put && parse_if_match(c, if_match, sizeof(if_match)) != 0)
        return;
    if (!is_put)
        if_match[0] = '\0';
    body_t b;
    if (read_body(c, &b) != 0)
        return;

    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    if (sl_model_parse(&set, b.text, b.len, "", &errs) != 0) {
        reply_invalid(c, &b, &errs);
        goto out;
    }
    const char *kname = sl_kind_name(c->kind);
    if (set.count == 0) {
        reply_error(c->req, 400, "empty_body", NULL,
                    "the body holds no document; send one %s as JSON or YAML", kname);
        goto out;
    }
    if (set.count > 1) {
        reply_error(c->req, 400, "too_many_documents", NULL,
                    "the body holds %zu documents; send one %s here, or the whole file to "
                    "/api/v1/resources",
                    set.count, kname);
        goto out;
    }
    json_t *obj = set.items[0].obj;
    if (set.items[0].kind != c->kind) {
        const char *bk = sl_kind_name(set.items[0].kind);
        json_t *d =
            json_pack("[{s:s, s:s}]", "field", "kind", "message", "does not match the path");
        reply_error(c->req, 400, "kind_mismatch", d,
                    "kind is %s but the path is for %s; send it to /api/v1/%s", bk,
                    sl_kind_plural(c->kind), sl_kind_plural(set.items[0].kind));
        goto out;
    }
    const char *name = set.items[0].name;
    if (is_put && strcmp(name, c->name) != 0) {
        json_t *d =
            json_pack("[{s:s, s:s}]", "field", "metadata.name", "message", "differs from the path");
        reply_error(c->req, 400, "name_mismatch", d,
                    "metadata.name is '%.253s' but the path names '%s'; make them agree (a rename "
                    "is a create and a delete)",
                    name, c->name);
        goto out;
    }
    char ns[REST_MAX_NAMESPACE + 1];
    if (settle_namespace(c, obj, c->ns, ns, sizeof(ns)) != 0)
        goto out;

    /* Preconditions: If-Match (412) or metadata.resourceVersion of a PUT
     * body (409). POST is a create: a resourceVersion copied from another
     * object is ignored there. */
    const char *body_rv =
        json_string_value(json_object_get(json_object_get(obj, "metadata"), "resourceVersion"));
    if (body_rv && !body_rv[0])
        body_rv = NULL;
    char expect[24] = "";
    bool by_if_match = false;
    if (is_put && if_match[0]) {
        if (body_rv && strcmp(if_match, "*") != 0 && strcmp(body_rv, if_match) != 0) {
            reply_error(c->req, 400, "conflicting_preconditions", NULL,
                        "If-Match \"%s\" and metadata.resourceVersion \"%.20s\" disagree; send one "
                        "of them",
                        if_match, body_rv);
            goto out;
        }
        by_if_match = true;
        snprintf(expect, sizeof(expect), "%s", if_match);
    } else if (is_put && body_rv) {
        snprintf(expect, sizeof(expect), "%.20s", body_rv);
    }

    json_t *old = NULL;
    enum sl_store_result gr = sl_store_get(r->st, c->kind, ns, name, &old);
    if (gr == SL_STORE_UNAVAILABLE) {
        reply_store_unavailable(c->req, r->st, NULL);
        goto out;
    }
    if (gr == SL_STORE_ERROR) {
        reply_error(c->req, 500, "store_error", NULL, "cannot read %s %s/%s (see the log)", kname,
                    ns, name);
        goto out;
    }
    if (strcmp(expect, "*") == 0) {
        /* If-Match: * = "only if it exists": pin the current version. */
        if (!old) {
            reply_error(c->req, 412, "precondition_failed", NULL,
                        "%s \"%s/%s\" does not exist (If-Match: *)", kname, ns, name);
            goto out;
        }
        snprintf(expect, sizeof(expect), "%s",
                 json_string_value(
                     json_object_get(json_object_get(old, "metadata"), "resourceVersion")));
    }
    if (is_put && old && sl_objects_same_user_fields(old, obj)) {
        const char *cur =
            json_string_value(json_object_get(json_object_get(old, "metadata"), "resourceVersion"));
        if (!expect[0] || (cur && strcmp(cur, expect) == 0)) {
            set_etag(c->req, old);
            send_json(c->req, 200, old);
            goto out;
        }
    }
    bool created = !old;
    {
        /* Field ownership for kubectl's server-side apply (ssa.h): this
         * write's manager is the client's product name ("curl"). */
        char manager[129];
        sl_ssa_default_manager(
            evhttp_find_header(evhttp_request_get_input_headers(c->req), "User-Agent"), manager,
            sizeof(manager));
        sl_ssa_update(old, obj, manager, NULL);
    }
    json_decref(old);

    char err[512] = "";
    if (r->ctl) {
        json_t *one = json_pack("[O]", obj);
        int ok = one && sl_controller_admit(r->ctl, one, err, sizeof(err)) == 0;
        json_decref(one);
        if (!ok) {
            reply_error(c->req, 400, "limit_exceeded", NULL, "%s", err);
            goto out;
        }
    }
    json_t *stored = NULL;
    enum sl_store_result res = sl_store_put(r->st, obj, is_put ? SL_STORE_REPLACE : SL_STORE_CREATE,
                                            expect, &stored, err, sizeof(err));
    if (res != SL_STORE_OK) {
        if (res == SL_STORE_ERROR)
            sl_log_error("rest: %s", err);
        reply_store_failure(c, res, by_if_match, err);
        goto out;
    }
    sl_objects_written(r->ctl);
    set_etag(c->req, stored);
    if (created) {
        char loc[512];
        snprintf(loc, sizeof(loc), "/api/v1/namespaces/%s/%s/%s", ns, sl_kind_plural(c->kind),
                 name);
        evhttp_add_header(evhttp_request_get_output_headers(c->req), "Location", loc);
    }
    send_json(c->req, created ? 201 : 200, stored);
out:
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
}

static void handle_delete(call_t *c)
{
    sl_rest_t *r = c->rest;
    char if_match[24];
    if (parse_if_match(c, if_match, sizeof(if_match)) != 0)
        return;
    const char *ns = c->ns[0] ? c->ns : "default";
    char err[512] = "";
    json_t *deleted = NULL;
    /* "*" only asks that it exists, which a delete checks anyway. */
    const char *expect = strcmp(if_match, "*") == 0 ? "" : if_match;
    enum sl_store_result res =
        sl_store_delete(r->st, c->kind, ns, c->name, expect, &deleted, err, sizeof(err));
    if (res != SL_STORE_OK) {
        if (res == SL_STORE_ERROR)
            sl_log_error("rest: %s", err);
        reply_store_failure(c, res, true, err);
        return;
    }
    if (r->ctl)
        sl_controller_forget(r->ctl, c->kind, ns, c->name);
    sl_objects_written(r->ctl);
    send_json(c->req, 200, deleted);
}

/* POST|PUT /api/v1/resources: a whole file, all documents validated first,
 * then stored in one transaction. */
static void handle_resources(call_t *c)
{
    sl_rest_t *r = c->rest;
    body_t b;
    if (read_body(c, &b) != 0)
        return;
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    json_t *to_write = NULL, *result = NULL;

    int rc = sl_model_parse(&set, b.text, b.len, "", &errs);
    /* A ?namespace= applies to documents without one, like kubectl -n. */
    for (size_t i = 0; rc == 0 && c->ns[0] && i < set.count; i++) {
        json_t *meta = json_object_get(set.items[i].obj, "metadata");
        const char *ns = json_string_value(json_object_get(meta, "namespace"));
        if (ns && strcmp(ns, c->ns) != 0)
            sl_errors_add(&errs, "", set.items[i].doc, "metadata.namespace",
                          "'%s' differs from ?namespace=%s", ns, c->ns);
    }
    if (rc != 0 || errs.count) {
        json_t *details = error_details(&errs, true);
        reply_error(c->req, 400, "invalid", details,
                    "%zu error%s in the file; nothing was stored (fix every listed field and send "
                    "the file again)",
                    errs.count, errs.count == 1 ? "" : "s");
        goto out;
    }
    if (set.count == 0) {
        reply_error(c->req, 400, "empty_body", NULL,
                    "the body holds no document; send a YAML stream (--- separated) or a JSON "
                    "array of resources");
        goto out;
    }

    /* Unchanged documents are not rewritten (no new resourceVersion, no
     * recompile), so applying the same file twice is a no-op. */
    to_write = json_array();
    result = json_array();
    if (!to_write || !result) {
        reply_error(c->req, 500, "internal_error", NULL, "out of memory");
        goto out;
    }
    size_t *slot = calloc(set.count, sizeof(*slot));
    if (!slot) {
        reply_error(c->req, 500, "internal_error", NULL, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < set.count; i++) {
        sl_resource_t *it = &set.items[i];
        json_t *meta = json_object_get(it->obj, "metadata");
        char ns[REST_MAX_NAMESPACE + 1];
        const char *body_ns = json_string_value(json_object_get(meta, "namespace"));
        snprintf(ns, sizeof(ns), "%s", c->ns[0] ? c->ns : body_ns ? body_ns : "default");
        json_object_set_new(meta, "namespace", json_string(ns));
        json_t *old = NULL;
        enum sl_store_result gr = sl_store_get(r->st, it->kind, ns, it->name, &old);
        if (gr == SL_STORE_UNAVAILABLE) {
            free(slot);
            reply_store_unavailable(c->req, r->st, NULL);
            goto out;
        }
        if (gr == SL_STORE_ERROR) {
            free(slot);
            reply_error(c->req, 500, "store_error", NULL, "cannot read %s %s/%s (see the log)",
                        sl_kind_name(it->kind), ns, it->name);
            goto out;
        }
        if (old && sl_objects_same_user_fields(old, it->obj)) {
            json_array_append_new(result, old);
            slot[i] = SIZE_MAX;
        } else {
            json_decref(old);
            slot[i] = json_array_size(to_write);
            json_array_append(to_write, it->obj);
            json_array_append_new(result, json_null());
        }
    }
    size_t changed = json_array_size(to_write);
    if (changed && r->ctl) {
        char err[512] = "";
        if (sl_controller_admit(r->ctl, to_write, err, sizeof(err)) != 0) {
            free(slot);
            reply_error(c->req, 400, "limit_exceeded", NULL, "%s", err);
            goto out;
        }
    }
    if (changed) {
        char err[512] = "";
        json_t *stored = NULL;
        enum sl_store_result res = sl_store_put_many(r->st, to_write, &stored, err, sizeof(err));
        if (res != SL_STORE_OK) {
            free(slot);
            sl_log_error("rest: %s", err);
            reply_store_failure(c, res, false, err);
            goto out;
        }
        for (size_t i = 0; i < set.count; i++)
            if (slot[i] != SIZE_MAX)
                json_array_set(result, i, json_array_get(stored, slot[i]));
        json_decref(stored);
        sl_objects_written(r->ctl);
    }
    free(slot);
    send_json(c->req, 200,
              json_pack("{s:O, s:I, s:I}", "items", result, "count", (json_int_t)set.count,
                        "changed", (json_int_t)changed));
out:
    json_decref(to_write);
    json_decref(result);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
}

static void handle_discovery(call_t *c)
{
    json_t *arr = json_array();
    for (int k = 0; arr && k < SL_KIND__COUNT; k++)
        json_array_append_new(arr,
                              json_pack("{s:s, s:s, s:b}", "name", sl_kind_plural((enum sl_kind)k),
                                        "kind", sl_kind_name((enum sl_kind)k), "namespaced", 1));
    send_json(c->req, 200,
              json_pack("{s:s, s:o, s:b}", "apiVersion", SL_API_VERSION, "resources", arr,
                        "readOnly", c->rest->opt.read_only));
}

static void handle_controller_view(call_t *c)
{
    sl_controller_t *ctl = c->rest->ctl;
    if (!ctl) {
        reply_error(c->req, 503, "not_ready", NULL, "the controller core is not running");
        return;
    }
    json_t *v =
        c->target == T_RUNTIMES ? sl_controller_runtimes_json(ctl) : sl_controller_status_json(ctl);
    if (c->target == T_RUNTIMES && v) {
        v = json_pack("{s:o}", "items", v);
        /* Several replicas on a shared store: whose runtimes these are. */
        json_t *view = v ? sl_controller_runtimes_view(ctl) : NULL;
        if (view)
            json_object_set_new(v, "view", view);
    }
    send_json(c->req, 200, v);
}

/* ---- routing -------------------------------------------------------------- */

static bool is_get(enum evhttp_cmd_type cmd)
{
    return cmd == EVHTTP_REQ_GET || cmd == EVHTTP_REQ_HEAD;
}

static void reply_read_only(call_t *c)
{
    evhttp_add_header(evhttp_request_get_output_headers(c->req), "Allow", "GET, HEAD");
    reply_error(c->req, 405, "read_only", NULL,
                c->rest->opt.read_only_why
                    ? c->rest->opt.read_only_why
                    : "the controller runs from --resources files (immutable mode): change the "
                      "files and restart the controller instead of writing through the API");
}

/* Splits the part of the path after /api/v1 into segments. Returns the
 * count, or -1 for empty segments or too many. */
static int split_path(const char *p, char seg[REST_MAX_SEGMENTS][REST_MAX_NAME + 1])
{
    int n = 0;
    while (*p == '/') {
        p++;
        if (*p == '\0')
            break; /* one trailing slash is tolerated */
        size_t len = strcspn(p, "/");
        if (len == 0 || n == REST_MAX_SEGMENTS)
            return -1;
        if (len > REST_MAX_NAME) {
            /* Too long for any name: keep a prefix for the message; the
             * trailing dots make it fail every name check. */
            snprintf(seg[n], REST_MAX_NAME + 1, "%.64s...", p);
        } else {
            memcpy(seg[n], p, len);
            seg[n][len] = '\0';
        }
        p += len;
        n++;
    }
    return *p == '\0' ? n : -1;
}

/* Parses /api/v1/... into c. Returns 0, or -1 after replying. */
static int route_api(call_t *c, const char *path, const char *query)
{
    char seg[REST_MAX_SEGMENTS][REST_MAX_NAME + 1];
    char plurals[128];
    plural_list(plurals, sizeof(plurals));
    if (strncmp(path, "/api/v1", 7) != 0 || (path[7] != '\0' && path[7] != '/')) {
        reply_error(c->req, 404, "not_found", NULL,
                    "unknown API version; the admin API is under /api/v1/ (%s)", plurals);
        return -1;
    }
    int n = split_path(path + 7, seg);
    if (n < 0) {
        reply_error(c->req, 404, "not_found", NULL,
                    "no such path; use /api/v1/{%s}[/{name}] or /api/v1/namespaces/{ns}/...",
                    plurals);
        return -1;
    }

    /* ?namespace= */
    if (query) {
        struct evkeyvalq q;
        if (evhttp_parse_query_str(query, &q) != 0) {
            reply_error(c->req, 400, "invalid_query", NULL, "the query string cannot be parsed");
            return -1;
        }
        const char *qns = evhttp_find_header(&q, "namespace");
        if (qns && !valid_name(qns, REST_MAX_NAMESPACE)) {
            reply_error(c->req, 400, "invalid_namespace", NULL,
                        "namespace '%.63s' is not a DNS-1123 label (lowercase letters, digits and "
                        "'-', at most 63)",
                        qns);
            evhttp_clear_headers(&q);
            return -1;
        }
        if (qns)
            snprintf(c->ns, sizeof(c->ns), "%.63s", qns);
        evhttp_clear_headers(&q);
    }

    int first = 0;
    if (n >= 1 && strcmp(seg[0], "namespaces") == 0) {
        if (n < 3) {
            reply_error(c->req, 404, "not_found", NULL, "use /api/v1/namespaces/{ns}/{%s}[/{name}]",
                        plurals);
            return -1;
        }
        if (!valid_name(seg[1], REST_MAX_NAMESPACE)) {
            reply_error(c->req, 400, "invalid_namespace", NULL,
                        "namespace '%s' in the path is not a DNS-1123 label (lowercase letters, "
                        "digits and '-', at most 63)",
                        seg[1]);
            return -1;
        }
        if (c->ns[0] && strcmp(c->ns, seg[1]) != 0) {
            reply_error(c->req, 400, "namespace_mismatch", NULL,
                        "?namespace=%s contradicts the path's namespace '%s'", c->ns, seg[1]);
            return -1;
        }
        snprintf(c->ns, sizeof(c->ns), "%.63s", seg[1]);
        first = 2;
    } else if (n == 0) {
        c->target = T_DISCOVERY;
        return 0;
    } else if (n == 1 && strcmp(seg[0], "runtimes") == 0) {
        c->target = T_RUNTIMES;
        return 0;
    } else if (n == 1 && strcmp(seg[0], "status") == 0) {
        c->target = T_STATUS;
        return 0;
    } else if (n == 1 && strcmp(seg[0], "resources") == 0) {
        c->target = T_RESOURCES;
        return 0;
    }
    int rest_n = n - first;
    if (rest_n < 1 || rest_n > 2) {
        reply_error(c->req, 404, "not_found", NULL,
                    "no such path; use /api/v1/{%s}[/{name}] or /api/v1/namespaces/{ns}/...",
                    plurals);
        return -1;
    }
    if (sl_kind_from_plural(seg[first], &c->kind) != 0) {
        reply_error(c->req, 404, "not_found", NULL, "unknown resource type '%s'; valid: %s",
                    seg[first], plurals);
        return -1;
    }
    if (rest_n == 1) {
        c->target = T_COLLECTION;
        return 0;
    }
    if (!valid_name(seg[first + 1], REST_MAX_NAME)) {
        reply_error(c->req, 400, "invalid_name", NULL,
                    "'%s' is not a valid name: lowercase letters, digits, '-' and '.', starting "
                    "and ending with a letter or digit, at most 253",
                    seg[first + 1]);
        return -1;
    }
    snprintf(c->name, sizeof(c->name), "%s", seg[first + 1]);
    c->target = T_OBJECT;
    return 0;
}

static void dispatch_api(call_t *c)
{
    sl_rest_t *r = c->rest;
    enum evhttp_cmd_type m = c->cmd;
    bool ro = r->opt.read_only;
    switch (c->target) {
    case T_DISCOVERY:
        if (!is_get(m))
            return reply_405(c->req, "GET, HEAD", "/api/v1");
        return handle_discovery(c);
    case T_RUNTIMES:
    case T_STATUS:
        if (!is_get(m))
            return reply_405(c->req, "GET, HEAD",
                             c->target == T_RUNTIMES ? "/api/v1/runtimes" : "/api/v1/status");
        return handle_controller_view(c);
    case T_RESOURCES:
        if (m != EVHTTP_REQ_POST && m != EVHTTP_REQ_PUT)
            return reply_405(c->req, "POST, PUT", "/api/v1/resources");
        if (ro)
            return reply_read_only(c);
        return handle_resources(c);
    case T_COLLECTION:
        if (is_get(m))
            return handle_list(c);
        if (m == EVHTTP_REQ_POST)
            return ro ? reply_read_only(c) : handle_write(c);
        return reply_405(c->req, ro ? "GET, HEAD" : "GET, HEAD, POST",
                         "a collection (PUT and DELETE take a name: /api/v1/{plural}/{name})");
    case T_OBJECT:
        if (is_get(m))
            return handle_get(c);
        if (m == EVHTTP_REQ_PUT || m == EVHTTP_REQ_DELETE) {
            if (ro)
                return reply_read_only(c);
            return m == EVHTTP_REQ_PUT ? handle_write(c) : handle_delete(c);
        }
        return reply_405(c->req, ro ? "GET, HEAD" : "GET, HEAD, PUT, DELETE",
                         "an object (POST goes to the collection)");
    }
}

/* Host header without the port; false when it does not fit. */
static bool host_name(const char *h, char *out, size_t outlen)
{
    size_t n;
    if (h[0] == '[') {
        const char *close = strchr(h, ']');
        if (!close)
            return false;
        h++;
        n = (size_t)(close - h);
    } else {
        n = strcspn(h, ":");
    }
    if (n == 0 || n >= outlen)
        return false;
    memcpy(out, h, n);
    out[n] = '\0';
    return true;
}

/*
 * A web page must not be able to drive the admin API through the user's
 * browser. A cross-site form or fetch() POST needs no CORS preflight, and a
 * DNS-rebound name reaches 127.0.0.1 as "same origin". So /api/ refuses any
 * request with an Origin header (curl, kubectl and scripts send none), and,
 * when no token protects it, any Host that is not a loopback name or address.
 * Returns true after replying 403.
 */
static bool refuse_browser(call_t *c, bool kube)
{
    struct evkeyvalq *in = evhttp_request_get_input_headers(c->req);
    if (evhttp_find_header(in, "Origin")) {
        static const char msg[] = "requests from web pages (with an Origin header) are refused: "
                                  "the admin API is for curl, kubectl and scripts";
        if (kube)
            sl_kapi_reply_status(c->req, 403, "Forbidden", "%s", msg);
        else
            reply_error(c->req, 403, "cross_origin", NULL, "%s", msg);
        return true;
    }
    if (c->rest->have_token || c->rest->opt.insecure)
        return false;
    const char *host = evhttp_find_header(in, "Host");
    char name[256];
    if (host && (!host_name(host, name, sizeof(name)) || !sl_rest_tls_loopback_host(name))) {
        static const char msg[] = "without --admin-token-file the admin API answers only to a "
                                  "loopback Host (localhost, 127.0.0.1, [::1]); this protects it "
                                  "from DNS rebinding";
        if (kube)
            sl_kapi_reply_status(c->req, 403, "Forbidden", "%s", msg);
        else
            reply_error(c->req, 403, "host_not_allowed", NULL, "%s", msg);
        return true;
    }
    return false;
}

static void on_request(struct evhttp_request *req, void *arg)
{
    call_t c;
    memset(&c, 0, sizeof(c));
    c.rest = arg;
    c.req = req;
    c.cmd = evhttp_request_get_command(req);
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    if (!path || path[0] != '/') {
        reply_error(req, 400, "bad_request", NULL, "the request target must be an absolute path");
        return;
    }

    static const struct {
        const char *path;
        void (*handler)(call_t *);
    } open_routes[] = {
        {"/healthz", handle_healthz},
        {"/readyz", handle_readyz},
        {"/metrics", handle_metrics},
    };
    for (size_t i = 0; i < sizeof(open_routes) / sizeof(open_routes[0]); i++) {
        if (strcmp(path, open_routes[i].path) != 0)
            continue;
        if (!is_get(c.cmd))
            return reply_405(req, "GET, HEAD", open_routes[i].path);
        return open_routes[i].handler(&c);
    }

    /* The Kubernetes-compatible paths (kapi.c) share the checks below but
     * answer every error as a meta/v1 Status. */
    bool kube = sl_kapi_owns(path);
    if (!kube && strncmp(path, "/api/", 5) != 0) {
        reply_error(req, 404, "not_found", NULL,
                    "no such endpoint; the admin API is under /api/v1/ (and the "
                    "Kubernetes-compatible API under /apis/), plus /healthz, /readyz and "
                    "/metrics");
        return;
    }
    if (refuse_browser(&c, kube))
        return;
    /* Authentication before routing: without the token nothing about the
     * API, not even which paths exist, is revealed. */
    bool presented = false;
    if (c.rest->have_token && !authorized(c.rest, req, &presented)) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate",
                          presented ? "Bearer realm=\"sluice-admin\", error=\"invalid_token\""
                                    : "Bearer realm=\"sluice-admin\"");
        const char *msg = presented ? "the bearer token is wrong; send Authorization: Bearer <the "
                                      "content of --admin-token-file>"
                                    : "this API needs Authorization: Bearer <the content of "
                                      "--admin-token-file>";
        if (kube)
            sl_kapi_reply_status(req, 401, "Unauthorized", "%s", msg);
        else
            reply_error(req, 401, "unauthorized", NULL, "%s", msg);
        return;
    }
    if (kube)
        return sl_kapi_handle(c.rest->kapi, req);
    if (route_api(&c, path, evhttp_uri_get_query(uri)) != 0)
        return;
    dispatch_api(&c);
}

/* ---- life cycle ----------------------------------------------------------- */

/* Splits "host:port" or "[v6]:port". Returns 0, or -1 with err set. */

static int bound_port(struct evhttp_bound_socket *bound)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    evutil_socket_t fd = evhttp_bound_socket_get_fd(bound);
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
        return -1;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return -1;
}

static int no_password(char *buf, int size, int rwflag, void *u)
{
    (void)buf;
    (void)size;
    (void)rwflag;
    (void)u;
    return -1;
}

/*
 * The HTTPS context from PEM texts that sl_tls_files_read_pair checked
 * already (so failures here are out-of-memory class): TLS 1.2 minimum,
 * OpenSSL's default suites, no renegotiation, no ALPN (evhttp speaks
 * HTTP/1.1, which clients then use). NULL with err.
 */
static SSL_CTX *https_context(const char *addr, const char *cert_pem, const char *key_pem,
                              char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    BIO *b = NULL;
    EVP_PKEY *key = NULL;
    X509 *x = NULL;
    if (!ctx)
        goto fail;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    if (!(b = BIO_new_mem_buf(cert_pem, -1)) ||
        !(x = PEM_read_bio_X509(b, NULL, no_password, NULL)) ||
        SSL_CTX_use_certificate(ctx, x) != 1)
        goto fail;
    X509_free(x);
    /* The rest of the chain, in order (add0 takes ownership on success). */
    while ((x = PEM_read_bio_X509(b, NULL, no_password, NULL))) {
        if (SSL_CTX_add0_chain_cert(ctx, x) != 1)
            goto fail;
    }
    BIO_free(b);
    if (!(b = BIO_new_mem_buf(key_pem, -1)) ||
        !(key = PEM_read_bio_PrivateKey(b, NULL, no_password, NULL)) ||
        SSL_CTX_use_PrivateKey(ctx, key) != 1 || SSL_CTX_check_private_key(ctx) != 1)
        goto fail;
    EVP_PKEY_free(key);
    BIO_free(b);
    ERR_clear_error();
    return ctx;
fail:
    X509_free(x);
    EVP_PKEY_free(key);
    BIO_free(b);
    SSL_CTX_free(ctx);
    ERR_clear_error(); /* may name parts of the key: never logged */
    set_err(err, errlen,
            "--rest %s: cannot load --rest-tls-cert/--rest-tls-key into OpenSSL (out of memory?)",
            addr);
    return NULL;
}

/* evhttp's connection factory under HTTPS: the accepted socket is set on
 * the bufferevent by evhttp. A NULL answer would make evhttp fall back to a
 * plain socket, serving the API unencrypted; an SSL that cannot be
 * allocated is out of memory in the controller, where failing fast is
 * better than that. */
static struct bufferevent *https_bufferevent(struct event_base *base, void *arg)
{
    sl_rest_t *r = arg;
    SSL *ssl = SSL_new(r->ssl_ctx);
    struct bufferevent *bev =
        ssl ? bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                             BEV_OPT_CLOSE_ON_FREE)
            : NULL;
    if (!bev) {
        sl_log_alert("admin API: out of memory for a TLS connection; exiting rather than "
                     "answer in plain text");
        abort();
    }
    /* A client that closes without close_notify after its answer (curl
     * does at times) is not an error worth a log line. */
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
}

/* On success the caller owns the returned object (sl_rest_free); opt is
 * copied (the token is digested, the static set stays borrowed). On failure
 * nothing is left allocated or bound. */
sl_rest_t *sl_rest_start(struct event_base *base, const char *addr, sl_store_t *st,
                         sl_controller_t *ctl, const sl_rest_options_t *opt, char *err,
                         size_t errlen)
{
    char host[256];
    unsigned short port = 0;
    if (err && errlen)
        err[0] = '\0';
    if (!base || !addr) {
        set_err(err, errlen, "--rest: no event base or address given");
        return NULL;
    }
    if (sl_hostport_parse(addr, "--rest", 9090, host, sizeof(host), &port, err, errlen) != 0)
        return NULL;
    sl_rest_t *r = calloc(1, sizeof(*r));
    if (!r) {
        set_err(err, errlen, "--rest %s: out of memory", addr);
        return NULL;
    }
    if (opt)
        r->opt = *opt;
    r->opt.admin_token = NULL; /* digested below, never kept */
    /* Loaded into an SSL_CTX below, never kept. */
    r->opt.tls_cert_pem = r->opt.tls_key_pem = NULL;
    if (!r->opt.max_body_bytes)
        r->opt.max_body_bytes = SL_REST_DEFAULT_MAX_BODY_BYTES;
    r->st = st;
    r->ctl = ctl;
    r->port = -1;
    if (!st && !(r->opt.read_only && r->opt.static_set)) {
        set_err(err, errlen, "--rest %s: no store (the admin API needs the --data-dir store)",
                addr);
        goto fail_rest;
    }
    if (opt && opt->admin_token && opt->admin_token[0]) {
        r->have_token = true;
        sl_bearer_digest(opt->admin_token, strlen(opt->admin_token), r->token_sha256);
    }
    if (!sl_rest_tls_loopback_host(host) && !r->have_token && !r->opt.insecure) {
        set_err(err, errlen,
                "--rest %s: refusing to serve the admin API on a non-loopback address without "
                "--admin-token-file (or pass --insecure-admin)",
                addr);
        goto fail_rest;
    }

    if (opt && opt->tls_cert_pem && opt->tls_key_pem &&
        !(r->ssl_ctx = https_context(addr, opt->tls_cert_pem, opt->tls_key_pem, err, errlen)))
        goto fail_rest;

    sl_kapi_options_t kopt = {
        .max_body_bytes = r->opt.max_body_bytes,
        .read_only = r->opt.read_only,
        .static_set = r->opt.static_set,
        .watch_hub = r->opt.watch_hub,
    };
    if (!(r->kapi = sl_kapi_new(st, ctl, &kopt, err, errlen)))
        goto fail_rest;

    r->http = evhttp_new(base);
    if (!r->http) {
        set_err(err, errlen, "--rest %s: out of memory", addr);
        goto fail_rest;
    }
    if (r->ssl_ctx)
        evhttp_set_bevcb(r->http, https_bufferevent, r);
    /* Every method reaches on_request, so that a PATCH gets our JSON 405
     * rather than evhttp's HTML 501. */
    evhttp_set_allowed_methods(r->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST |
                                            EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                            EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE |
                                            EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
    evhttp_set_max_headers_size(r->http, REST_MAX_HEADER_BYTES);
    /* The bound is enforced by read_body (JSON) and kapi.c (a Status), not
     * by evhttp: libevent 2.1 has no hook before the body is read, and its
     * own 413 is an HTML page. evhttp buffers up to twice the bound, so
     * bodies up to that size get our answer; beyond it, evhttp's page. */
    evhttp_set_max_body_size(r->http, (ev_ssize_t)(2 * r->opt.max_body_bytes + 1));
    /* Read (and discard) an oversized body before answering 413, so that the
     * client sees the answer instead of a reset connection. */
    evhttp_set_flags(r->http, EVHTTP_SERVER_LINGERING_CLOSE);
    evhttp_set_timeout(r->http, REST_TIMEOUT_S);
    evhttp_set_gencb(r->http, on_request, r);

    errno = 0;
    r->bound = evhttp_bind_socket_with_handle(r->http, host, port);
    if (!r->bound) {
        int e = errno;
        if (e == EADDRINUSE)
            set_err(err, errlen,
                    "--rest %s: %s (is another controller running? choose another --rest "
                    "address)",
                    addr, strerror(e));
        else if (e)
            set_err(err, errlen, "--rest %s: %s (check the --rest address)", addr, strerror(e));
        else
            set_err(err, errlen, "--rest %s: cannot resolve or bind (check the --rest address)",
                    addr);
        goto fail_http;
    }
    r->port = bound_port(r->bound);
    sl_log_info("admin API listening on %s (port %d)%s%s%s", addr, r->port,
                r->ssl_ctx ? ", HTTPS" : "", r->have_token ? ", bearer token required" : "",
                !r->opt.read_only         ? ""
                : r->opt.read_only_why    ? ", read-only (--source kubernetes)"
                                          : ", read-only (--resources)");
    return r;

fail_http:
    evhttp_free(r->http);
fail_rest:
    sl_kapi_free(r->kapi);
    SSL_CTX_free(r->ssl_ctx);
    OPENSSL_cleanse(r->token_sha256, sizeof(r->token_sha256));
    free(r);
    return NULL;
}

int sl_rest_port(const sl_rest_t *rest)
{
    return rest ? rest->port : -1;
}

void sl_rest_free(sl_rest_t *rest)
{
    if (!rest)
        return;
    if (rest->http)
        evhttp_free(rest->http);
    sl_kapi_free(rest->kapi);
    SSL_CTX_free(rest->ssl_ctx);
    OPENSSL_cleanse(rest->token_sha256, sizeof(rest->token_sha256));
    free(rest);
}
