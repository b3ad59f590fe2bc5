/*
 * Runtime admin listener: /live, /ready, /metrics, /config_dump, /clusters
 * over libevent's evhttp on the main thread's event_base.
 *
 * Responsible for: parsing the --admin address, binding it with an error that
 * names the address and the fix, answering the five endpoints (GET and HEAD
 * only), JSON errors for everything else, and bounding what a client may send
 * (header bytes, body bytes, idle time).
 *
 * Not responsible for: deciding readiness or producing the config document
 * (the runtime's hooks do), nor the metrics themselves (metrics.c). It is not
 * hardened for the public internet: it binds loopback by default and has no
 * authentication, like Envoy's admin port.
 */
#include "admin.h"
#include "bearer.h"
#include "endpoint.h"
#include "hostport.h"

#include "metrics.h"
#include "policy.h"
#include "sl_types.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Admin requests are tiny GETs; anything bigger is a mistake or an attack. */
#define ADMIN_MAX_HEADER_BYTES (16 * 1024)
#define ADMIN_MAX_BODY_BYTES (4 * 1024)
#define ADMIN_TIMEOUT_S 30

struct sl_admin {
    struct evhttp *http; /* NULL when the admin listener is "off" */
    struct evhttp_bound_socket *bound;
    sl_admin_hooks_t hooks;
    int port;
    bool have_token; /* --admin-token-file */
    unsigned char token_sha256[32];
};

/* What a probe or a scraper needs, and tells nothing about the config:
 * never behind the token (kubelet's probes send none), as the
 * controller's /healthz, /readyz and /metrics. Every other path, present
 * or future, needs it: new endpoints are protected unless listed here. */
static const char *const open_paths[] = {"/live", "/ready", "/metrics", NULL};

void sl_admin_set_token(sl_admin_t *admin, const char *token)
{
    admin->have_token = token && *token;
    if (admin->have_token)
        sl_bearer_digest(token, strlen(token), admin->token_sha256);
}

/* evhttp 2.1 writes the body of a HEAD response too; HEAD gets the headers
 * of the GET (Content-Length included) and no body, as RFC 9110 asks. */
static void send_reply(struct evhttp_request *req, int status, const char *reason,
                       const char *content_type, struct evbuffer *body)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", content_type);
    evhttp_add_header(h, "Cache-Control", "no-store");
    if (evhttp_request_get_command(req) == EVHTTP_REQ_HEAD) {
        char len[32];
        snprintf(len, sizeof(len), "%zu", body ? evbuffer_get_length(body) : (size_t)0);
        evhttp_add_header(h, "Content-Length", len);
        evhttp_send_reply(req, status, reason, NULL);
        return;
    }
    evhttp_send_reply(req, status, reason, body);
}

/* Sends {"error":{"status":..,"code":..,"message":..}}. The message is always
 * a constant of ours: request data is never reflected into a response. */
static void reply_error(struct evhttp_request *req, int status, const char *reason,
                        const char *code, const char *message)
{
    struct evbuffer *body = evbuffer_new();
    if (body)
        evbuffer_add_printf(body,
                            "{\"error\":{\"status\":%d,\"code\":\"%s\",\"message\":\"%s\"}}\n",
                            status, code, message);
    send_reply(req, status, reason, "application/json", body);
    if (body)
        evbuffer_free(body);
}

static void handle_live(sl_admin_t *admin, struct evhttp_request *req)
{
    (void)admin;
    struct evbuffer *body = evbuffer_new();
    if (!body) {
        evhttp_send_error(req, 500, "Internal Server Error");
        return;
    }
    evbuffer_add(body, "ok\n", 3);
    send_reply(req, 200, "OK", "text/plain; charset=utf-8", body);
    evbuffer_free(body);
}

static void handle_ready(sl_admin_t *admin, struct evhttp_request *req)
{
    int ready = admin->hooks.is_ready && admin->hooks.is_ready(admin->hooks.ctx);
    struct evbuffer *body = evbuffer_new();
    if (!body) {
        evhttp_send_error(req, 500, "Internal Server Error");
        return;
    }
    char note[512] = "";
    if (admin->hooks.ready_note)
        admin->hooks.ready_note(admin->hooks.ctx, note, sizeof(note));
    evbuffer_add_printf(body, "%s%s%s\n", ready ? "ready" : "not ready", note[0] ? ": " : "", note);
    if (ready)
        send_reply(req, 200, "OK", "text/plain; charset=utf-8", body);
    else
        send_reply(req, 503, "Service Unavailable", "text/plain; charset=utf-8", body);
    evbuffer_free(body);
}

static void handle_metrics(sl_admin_t *admin, struct evhttp_request *req)
{
    (void)admin;
    struct evbuffer *body = evbuffer_new();
    if (!body) {
        evhttp_send_error(req, 500, "Internal Server Error");
        return;
    }
    sl_metrics_render(body);
    send_reply(req, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", body);
    evbuffer_free(body);
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int dump_to_evbuffer(const char *buf, size_t size, void *data)
{
    return evbuffer_add(data, buf, size);
}

/* Private keys and the traffic log sinks' credentials travel in the
 * snapshot (the stream is the secret channel);
 * the admin listener is not one, so they never leave through it. */
/* A policy of a chain ({"name", "config_json", ...}): its config, parsed,
 * with the policy's credentials hidden (policies/policy.h). */
static void redact_policy(json_t *policy)
{
    const char *name = json_string_value(json_object_get(policy, "name"));
    const char *text = json_string_value(json_object_get(policy, "config_json"));
    json_t *config = text ? json_loads(text, 0, NULL) : NULL;
    if (!config) {
        /* Never shown when it cannot be checked for credentials. */
        if (text && *text)
            json_object_set_new(policy, "config_json", json_string("[redacted]"));
        return;
    }
    sl_policy_redact(name, config);
    char *out = json_dumps(config, JSON_COMPACT);
    json_object_set_new(policy, "config_json", json_string(out ? out : "[redacted]"));
    free(out);
    json_decref(config);
}

void sl_admin_redact_secrets(json_t *doc)
{
    /* Fields of snapshot.proto that hold credentials or what stands for
     * them (a password's crypt hash, an API key's SHA-256: both can be
     * attacked offline). */
    static const char *const secret_fields[] = {"private_key_pem", "password", "api_key",
                                                "password_hash", NULL};
    const char *key;
    json_t *v;
    size_t i;
    if (json_is_object(doc)) {
        if (json_is_string(json_object_get(doc, "config_json")))
            redact_policy(doc);
        json_object_foreach(doc, key, v)
        {
            int secret = 0;
            for (size_t f = 0; secret_fields[f] && !secret; f++)
                secret = strcmp(key, secret_fields[f]) == 0;
            /* Consumer.ApiKey.sha256 (bytes, base64 here). */
            if (strcmp(key, "api_keys") == 0 && json_is_array(v)) {
                size_t j;
                json_t *k;
                json_array_foreach(v, j, k)
                {
                    if (json_string_length(json_object_get(k, "sha256")) > 0)
                        json_object_set_new(k, "sha256", json_string("[redacted]"));
                }
            } else if (secret && json_is_string(v) && json_string_length(v) > 0) {
                json_object_set_new(doc, key, json_string("[redacted]"));
            } else {
                sl_admin_redact_secrets(v);
            }
        }
    } else if (json_is_array(doc)) {
        json_array_foreach(doc, i, v)
        {
            sl_admin_redact_secrets(v);
        }
    }
}

static void handle_config_dump(sl_admin_t *admin, struct evhttp_request *req)
{
    json_t *doc = admin->hooks.config_dump ? admin->hooks.config_dump(admin->hooks.ctx) : NULL;
    sl_admin_redact_secrets(doc);
    if (!doc) {
        reply_error(req, 503, "Service Unavailable", "no_config",
                    "no active configuration generation");
        return;
    }
    struct evbuffer *body = evbuffer_new();
    if (!body || json_dump_callback(doc, dump_to_evbuffer, body, JSON_INDENT(2)) != 0 ||
        evbuffer_add(body, "\n", 1) != 0) {
        json_decref(doc);
        if (body)
            evbuffer_free(body);
        reply_error(req, 500, "Internal Server Error", "internal_error",
                    "could not serialize the configuration");
        return;
    }
    json_decref(doc);
    send_reply(req, 200, "OK", "application/json", body);
    evbuffer_free(body);
}

/* One endpoint of /clusters, added to its backend's array in `by_backend`
 * (an object keyed by backend name). Runs under the endpoint registry lock:
 * only reads the state. */
static void add_endpoint_json(sl_endpoint_state_t *ep, void *arg)
{
    json_t *by_backend = arg;
    json_t *list = json_object_get(by_backend, ep->cluster);
    if (list == NULL) {
        list = json_array();
        if (list == NULL || json_object_set_new(by_backend, ep->cluster, list) != 0)
            return;
    }
    char hp[300], reason[SL_ENDPOINT_MAX_REASON_LEN];
    sl_endpoint_format(ep, hp, sizeof(hp));
    sl_endpoint_hc_failure(ep, reason, sizeof(reason));
    uint64_t now = sl_endpoint_now_ms();
    uint64_t until = atomic_load_explicit(&ep->ejected_until_ms, memory_order_relaxed);
    int checked = atomic_load_explicit(&ep->hc_checked, memory_order_relaxed);
    json_t *o = json_object();
    if (o == NULL)
        return;
    json_object_set_new(o, "endpoint", json_string(hp));
    json_object_set_new(o, "address", json_string(ep->address));
    json_object_set_new(o, "port", json_integer(ep->port));
    json_object_set_new(o, "usable", json_boolean(sl_endpoint_usable(ep, now)));
    json_t *hc = json_object();
    if (hc != NULL) {
        json_object_set_new(hc, "checked", json_boolean(checked));
        json_object_set_new(
            hc, "healthy",
            json_boolean(atomic_load_explicit(&ep->hc_healthy, memory_order_relaxed)));
        json_object_set_new(hc, "last_failure",
                            reason[0] != '\0' ? json_string(reason) : json_null());
        json_object_set_new(hc, "consecutive_successes",
                            json_integer(atomic_load_explicit(&ep->hc_consecutive_successes,
                                                              memory_order_relaxed)));
        json_object_set_new(
            hc, "consecutive_failures",
            json_integer(atomic_load_explicit(&ep->hc_consecutive_failures, memory_order_relaxed)));
        json_object_set_new(hc, "checks_succeeded",
                            json_integer((json_int_t)atomic_load_explicit(&ep->hc_checks_succeeded,
                                                                          memory_order_relaxed)));
        json_object_set_new(hc, "checks_failed",
                            json_integer((json_int_t)atomic_load_explicit(&ep->hc_checks_failed,
                                                                          memory_order_relaxed)));
        json_object_set_new(o, "health_check", hc);
    }
    json_t *od = json_object();
    if (od != NULL) {
        json_object_set_new(od, "ejected", json_boolean(until > now));
        json_object_set_new(od, "ejected_for_ms",
                            json_integer(until > now ? (json_int_t)(until - now) : 0));
        json_object_set_new(
            od, "ejections",
            json_integer(atomic_load_explicit(&ep->ejections, memory_order_relaxed)));
        json_object_set_new(o, "outlier_detection", od);
    }
    json_array_append_new(list, o);
}

static int compare_endpoint_json(const void *a, const void *b)
{
    json_t *const *x = a, *const *y = b;
    return strcmp(json_string_value(json_object_get(*x, "endpoint")),
                  json_string_value(json_object_get(*y, "endpoint")));
}

/* GET /clusters: every endpoint of the live generations by backend, sorted,
 * with its active health state and outlier ejection. */
static void handle_clusters(sl_admin_t *admin, struct evhttp_request *req)
{
    (void)admin;
    json_t *by_backend = json_object();
    json_t *doc = json_object();
    json_t *backends = json_array();
    struct evbuffer *body = evbuffer_new();
    if (!by_backend || !doc || !backends || !body)
        goto fail;
    sl_endpoint_foreach(add_endpoint_json, by_backend);
    /* jansson keeps insertion order; sort names and endpoints so that the
     * document does not depend on hash order. */
    size_t n = json_object_size(by_backend), i = 0;
    const char **names = calloc(n ? n : 1, sizeof(*names));
    if (names == NULL)
        goto fail;
    const char *key;
    json_t *v;
    json_object_foreach(by_backend, key, v) names[i++] = key;
    qsort(names, n, sizeof(*names), compare_names);
    for (i = 0; i < n; i++) {
        json_t *eps = json_object_get(by_backend, names[i]);
        size_t ne = json_array_size(eps);
        json_t **items = calloc(ne ? ne : 1, sizeof(*items));
        json_t *sorted = json_array();
        if (items == NULL || sorted == NULL) {
            free(items);
            json_decref(sorted);
            free(names);
            goto fail;
        }
        for (size_t e = 0; e < ne; e++)
            items[e] = json_array_get(eps, e);
        qsort(items, ne, sizeof(*items), compare_endpoint_json);
        for (size_t e = 0; e < ne; e++)
            json_array_append(sorted, items[e]);
        free(items);
        json_array_append_new(backends,
                              json_pack("{s:s,s:o}", "name", names[i], "endpoints", sorted));
    }
    free(names);
    json_object_set_new(doc, "backends", backends);
    backends = NULL;
    if (json_dump_callback(doc, dump_to_evbuffer, body, JSON_INDENT(2)) != 0 ||
        evbuffer_add(body, "\n", 1) != 0)
        goto fail;
    json_decref(doc);
    json_decref(by_backend);
    send_reply(req, 200, "OK", "application/json", body);
    evbuffer_free(body);
    return;

fail:
    json_decref(by_backend);
    json_decref(doc);
    json_decref(backends);
    if (body)
        evbuffer_free(body);
    reply_error(req, 500, "Internal Server Error", "internal_error",
                "could not build the clusters document");
}

static const struct {
    const char *path;
    void (*handler)(sl_admin_t *, struct evhttp_request *);
} admin_routes[] = {
    {"/live", handle_live},         {"/ready", handle_ready},
    {"/metrics", handle_metrics},   {"/config_dump", handle_config_dump},
    {"/clusters", handle_clusters},
};

static void admin_request(struct evhttp_request *req, void *arg)
{
    sl_admin_t *admin = arg;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;

    bool open = false;
    for (size_t i = 0; path && open_paths[i] && !open; i++)
        open = strcmp(path, open_paths[i]) == 0;
    bool presented = false;
    if (admin->have_token && !open &&
        !sl_bearer_check(evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization"),
                         admin->token_sha256, &presented)) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate",
                          presented ? "Bearer realm=\"sluice-runtime\", error=\"invalid_token\""
                                    : "Bearer realm=\"sluice-runtime\"");
        reply_error(req, 401, "Unauthorized", "unauthorized",
                    presented ? "the bearer token is wrong; send Authorization: Bearer <the "
                                "content of the runtime's --admin-token-file>"
                              : "this endpoint needs Authorization: Bearer <the content of the "
                                "runtime's --admin-token-file> (/live, /ready and /metrics "
                                "do not)");
        return;
    }
    for (size_t i = 0; path && i < SL_ARRAY_LEN(admin_routes); i++) {
        if (strcmp(path, admin_routes[i].path) != 0)
            continue;
        enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
        if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
            evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, HEAD");
            reply_error(req, 405, "Method Not Allowed", "method_not_allowed",
                        "admin endpoints answer GET and HEAD only");
            return;
        }
        admin_routes[i].handler(admin, req);
        return;
    }
    reply_error(req, 404, "Not Found", "not_found",
                "no such admin endpoint; try /live, /ready, /metrics, /config_dump or /clusters");
}

/* Error text for the caller; err may be NULL. vsnprintf truncates quietly
 * when a long path does not fit, which is what we want. */
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

/* Splits "host:port" or "[v6]:port" into a host evhttp can bind and a port.
 * Returns 0, or -1 with err set. */

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

/* On success the caller owns the returned object (sl_admin_free); `hooks` is
 * copied. On failure nothing is left allocated or bound. "off" returns an
 * object that serves nothing (sl_admin_port() == -1), so NULL always means
 * an error. */
sl_admin_t *sl_admin_start(struct event_base *base, const char *addr, const sl_admin_hooks_t *hooks,
                           char *err, size_t errlen)
{
    char host[256];
    unsigned short port = 0;

    if (err && errlen)
        err[0] = '\0';
    if (!base || !addr) {
        set_err(err, errlen, "admin: no event base or address given");
        return NULL;
    }
    sl_admin_t *admin = calloc(1, sizeof(*admin));
    if (!admin) {
        set_err(err, errlen, "admin %s: out of memory", addr);
        return NULL;
    }
    admin->port = -1;
    if (hooks)
        admin->hooks = *hooks;
    if (strcmp(addr, "off") == 0)
        return admin;

    if (sl_hostport_parse(addr, "admin", 9901, host, sizeof(host), &port, err, errlen) != 0)
        goto fail_admin;
    admin->http = evhttp_new(base);
    if (!admin->http) {
        set_err(err, errlen, "admin %s: out of memory", addr);
        goto fail_admin;
    }
    /* Let every method reach admin_request so a POST gets our JSON 405
     * rather than evhttp's HTML one. */
    evhttp_set_allowed_methods(admin->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST |
                                                EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                                EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE |
                                                EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
    evhttp_set_max_headers_size(admin->http, ADMIN_MAX_HEADER_BYTES);
    evhttp_set_max_body_size(admin->http, ADMIN_MAX_BODY_BYTES);
    evhttp_set_timeout(admin->http, ADMIN_TIMEOUT_S);
    evhttp_set_gencb(admin->http, admin_request, admin);

    errno = 0;
    admin->bound = evhttp_bind_socket_with_handle(admin->http, host, port);
    if (!admin->bound) {
        int e = errno;
        if (e == EADDRINUSE)
            set_err(err, errlen,
                    "admin %s: %s (is another runtime running? use --admin to choose another "
                    "address, or --admin off)",
                    addr, strerror(e));
        else if (e != 0)
            set_err(err, errlen, "admin %s: %s (check the --admin address)", addr, strerror(e));
        else
            set_err(err, errlen, "admin %s: cannot resolve or bind (check the --admin address)",
                    addr);
        goto fail_http;
    }
    admin->port = bound_port(admin->bound);
    return admin;

fail_http:
    evhttp_free(admin->http);
fail_admin:
    free(admin);
    return NULL;
}

int sl_admin_port(const sl_admin_t *admin)
{
    return admin ? admin->port : -1;
}

/* Closes the listener and every admin connection still open. */
void sl_admin_free(sl_admin_t *admin)
{
    if (!admin)
        return;
    if (admin->http)
        evhttp_free(admin->http);
    free(admin);
}
