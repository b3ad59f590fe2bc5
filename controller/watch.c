/*
 * The watch hub (watch.h): what `GET ...?watch=true` streams.
 *
 * What it holds:
 *   - a ring of the last `history` changes the store reported (rv, type,
 *     kind, a private deep copy of the stored document), oldest first, and
 *     `horizon`: the resourceVersion after which every change is in the
 *     ring. It starts at first_rv (changes before the hub existed were never
 *     seen) and moves to the rv of each event the ring drops. A watch from
 *     RV N can be served iff N >= horizon; otherwise it gets a 410 Expired
 *     ERROR event and the client relists;
 *   - the open watches, each an evhttp request whose chunked response stays
 *     open, with its filter (kind, namespace, the caller's match function),
 *     a bookmark timer and an "end" timer (timeoutSeconds, or a deferred
 *     drop).
 *
 * One event is rendered (render fn: the stored document as the client sees
 * it) and serialized once per publish, however many watches it goes to;
 * replays of history render per watch.
 *
 * Never blocking the main thread on a client: output goes to the
 * connection's bufferevent, which libevent writes as the socket allows. A
 * client that reads too slowly is dropped when the bytes queued on its
 * connection would pass max_output (16 MiB by default), or when nothing
 * could be written for WATCH_WRITE_TIMEOUT_S. The connection is then closed
 * (the client sees the stream cut and re-watches from its last RV), which
 * frees what was queued at once.
 *
 * evhttp details relied on (libevent 2.1):
 *   - a client that goes away mid-response: evhttp detaches the request from
 *     its connection (evhttp_request_get_connection() == NULL) and frees the
 *     connection, calling its close callback; the request is then ours to
 *     free, which evhttp_send_reply_end() does. When evhttp frees the
 *     connection with the request still attached (evhttp_free() at exit), it
 *     frees the request itself;
 *   - the server's timeout (evhttp_set_timeout) is also a read timeout on a
 *     response being written: a watch is silent on the client's side, so its
 *     connection gets no read timeout, a write timeout instead, and
 *     `Connection: close`, so that no kept-alive connection outlives the
 *     watch without a read timeout;
 *   - closing a connection from inside evhttp's own callbacks is not safe,
 *     so a drop decided while serving is done from the event loop (end_ev).
 *
 * Main thread only.
 */
#include "watch.h"

#include "ctrl_metrics.h"
#include "log.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WATCH_HISTORY_DEFAULT 4096
#define WATCH_BOOKMARK_DEFAULT_S 60
#define WATCH_MAX_OUTPUT_DEFAULT ((size_t)16 << 20)
/* No byte written to a watch's client for this long while some wait: drop. */
#define WATCH_WRITE_TIMEOUT_S 60
/* Bytes a client may send on a watch connection (nothing is expected) before
 * reading from it stops, so a talkative client cannot grow our input. */
#define WATCH_INPUT_MAX_BYTES 65536

typedef struct {
    uint64_t rv;
    const char *type; /* one of the static strings of event_type() */
    enum sl_kind kind;
    json_t *obj; /* private deep copy of the stored document */
} event_t;

enum end_how {
    END_CLEAN, /* finish the chunked response */
    END_ABORT, /* close the connection (slow client), dropping what is queued */
};

typedef struct watch {
    sl_watch_hub_t *hub;
    struct evhttp_request *req;
    struct evhttp_connection *conn;
    enum sl_kind kind;
    char *ns; /* NULL = all namespaces */
    bool bookmarks;
    struct timeval bookmark_tv;
    struct event *bookmark_ev; /* NULL without bookmarks */
    struct event *end_ev;      /* timeoutSeconds, or a deferred drop */
    enum end_how end_how;
    bool doomed; /* a drop is scheduled: send nothing more */
    sl_watch_match_fn match;
    void *match_ctx;
    void (*match_free)(void *match_ctx);
    struct watch *prev, *next;
} watch_t;

struct sl_watch_hub {
    struct event_base *base;
    uint64_t horizon; /* every change with rv > horizon is in the ring */
    uint64_t cur_rv;  /* latest rv seen (first_rv before any) */
    event_t *ring;
    size_t cap, head, count; /* head: index of the oldest */
    sl_watch_render_fn render;
    void *render_ctx;
    watch_t *watches;
    size_t nwatches;
    size_t max_output;
    unsigned bookmark_s; /* period for watches that do not set their own */
    struct evbuffer *scratch; /* one line on its way to a connection */
};

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static const char *event_type(const char *type)
{
    static const char *const types[] = {"ADDED", "MODIFIED", "DELETED"};
    for (size_t i = 0; type && i < sizeof(types) / sizeof(types[0]); i++)
        if (strcmp(type, types[i]) == 0)
            return types[i];
    return NULL;
}

/* A resourceVersion: decimal digits only, fitting 64 bits. */
static int parse_rv(const char *s, uint64_t *out)
{
    if (!s || !*s)
        return -1;
    uint64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

static const char *meta_string(json_t *obj, const char *key)
{
    return json_string_value(json_object_get(json_object_get(obj, "metadata"), key));
}

static bool ns_passes(const watch_t *w, json_t *obj)
{
    if (!w->ns)
        return true;
    const char *ns = meta_string(obj, "namespace");
    return strcmp(ns ? ns : "default", w->ns) == 0;
}

/* {"type":T,"object":OBJ} as one compact line (no newline); malloc'd. */
static char *event_line(const char *type, json_t *obj)
{
    json_t *ev = json_pack("{s:s, s:O}", "type", type, "object", obj);
    char *line = ev ? json_dumps(ev, JSON_COMPACT) : NULL;
    json_decref(ev);
    return line;
}

/* ---- ending a watch ----------------------------------------------------------- */

static void watch_free(watch_t *w)
{
    sl_watch_hub_t *hub = w->hub;
    if (w->prev)
        w->prev->next = w->next;
    else
        hub->watches = w->next;
    if (w->next)
        w->next->prev = w->prev;
    hub->nwatches--;
    sl_ctrl_watch_closed();
    if (w->bookmark_ev)
        event_free(w->bookmark_ev);
    if (w->end_ev)
        event_free(w->end_ev);
    if (w->match_free)
        w->match_free(w->match_ctx);
    free(w->ns);
    free(w);
}

/* Ends the response (or the connection) and frees the watch. Not from inside
 * evhttp's callbacks for this connection with END_ABORT (see the top). */
static void watch_end(watch_t *w, enum end_how how)
{
    evhttp_connection_set_closecb(w->conn, NULL, NULL);
    if (how == END_ABORT && evhttp_request_get_connection(w->req))
        evhttp_connection_free(w->conn); /* frees the request too */
    else
        evhttp_send_reply_end(w->req); /* frees it if the client is gone */
    watch_free(w);
}

static void end_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    watch_t *w = arg;
    watch_end(w, w->end_how);
}

/* Schedules a drop from the event loop; the watch sends nothing more. */
static void watch_doom(watch_t *w, const char *why)
{
    if (w->doomed)
        return;
    sl_log_warn("watch %s%s%s: %s; dropping it (the client re-watches from its last "
                "resourceVersion)",
                sl_kind_plural(w->kind), w->ns ? " in namespace " : "", w->ns ? w->ns : "", why);
    w->doomed = true;
    w->end_how = END_ABORT;
    event_active(w->end_ev, EV_TIMEOUT, 1);
}

/* The client went away: evhttp is freeing the connection. */
static void close_cb(struct evhttp_connection *conn, void *arg)
{
    (void)conn;
    watch_t *w = arg;
    if (!evhttp_request_get_connection(w->req))
        evhttp_send_reply_end(w->req); /* detached: ours to free */
    watch_free(w);
}

/* ---- sending -------------------------------------------------------------------- */

/* Queues one line. Returns 0, or -1 when the watch sends nothing more (a
 * drop is scheduled; the watch stays valid until the event loop runs). */
static int watch_send(watch_t *w, const char *type, const char *line)
{
    if (w->doomed)
        return -1;
    struct evhttp_connection *conn = evhttp_request_get_connection(w->req);
    if (!conn)
        return -1; /* the close callback is on its way */
    size_t len = strlen(line);
    struct evbuffer *out = bufferevent_get_output(evhttp_connection_get_bufferevent(conn));
    size_t queued = evbuffer_get_length(out);
    if (queued + len + 16 > w->hub->max_output) {
        char why[128];
        snprintf(why, sizeof(why), "the client reads too slowly (%zu bytes queued, limit %zu)",
                 queued, w->hub->max_output);
        watch_doom(w, why);
        return -1;
    }
    struct evbuffer *b = w->hub->scratch;
    if (evbuffer_add(b, line, len) != 0 || evbuffer_add(b, "\n", 1) != 0) {
        evbuffer_drain(b, evbuffer_get_length(b));
        watch_doom(w, "out of memory");
        return -1;
    }
    evhttp_send_reply_chunk(w->req, b); /* moves the bytes out of b */
    evbuffer_drain(b, evbuffer_get_length(b));
    sl_ctrl_count_watch_event(type);
    if (w->bookmark_ev)
        evtimer_add(w->bookmark_ev, &w->bookmark_tv); /* "while nothing was sent" */
    return 0;
}

/* Renders and sends one stored event to one watch (replays). */
static int watch_send_stored(watch_t *w, const event_t *ev)
{
    if (ev->kind != w->kind || !ns_passes(w, ev->obj))
        return 0;
    sl_watch_hub_t *hub = w->hub;
    json_t *rendered = hub->render(hub->render_ctx, ev->kind, ev->obj);
    if (!rendered)
        return 0;
    int rc = 0;
    if (!w->match || w->match(w->match_ctx, rendered)) {
        char *line = event_line(ev->type, rendered);
        if (line)
            rc = watch_send(w, ev->type, line);
        else {
            watch_doom(w, "out of memory");
            rc = -1;
        }
        free(line);
    }
    json_decref(rendered);
    return rc;
}

static void bookmark_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    watch_t *w = arg;
    char rv[24];
    snprintf(rv, sizeof(rv), "%" PRIu64, w->hub->cur_rv);
    json_t *obj = json_pack("{s:s, s:s, s:{s:s}}", "kind", sl_kind_name(w->kind), "apiVersion",
                            SL_API_VERSION, "metadata", "resourceVersion", rv);
    char *line = obj ? event_line("BOOKMARK", obj) : NULL;
    json_decref(obj);
    if (line)
        watch_send(w, "BOOKMARK", line); /* re-arms the timer */
    else
        evtimer_add(w->bookmark_ev, &w->bookmark_tv);
    free(line);
}

/* ---- the hub ------------------------------------------------------------------- */

sl_watch_hub_t *sl_watch_hub_new(struct event_base *base, uint64_t first_rv, size_t history,
                                 sl_watch_render_fn render, void *render_ctx)
{
    if (!base || !render)
        return NULL;
    sl_watch_hub_t *hub = calloc(1, sizeof(*hub));
    if (!hub)
        return NULL;
    hub->base = base;
    hub->horizon = hub->cur_rv = first_rv;
    hub->cap = history ? history : WATCH_HISTORY_DEFAULT;
    hub->ring = calloc(hub->cap, sizeof(*hub->ring));
    hub->scratch = evbuffer_new();
    hub->render = render;
    hub->render_ctx = render_ctx;
    hub->max_output = WATCH_MAX_OUTPUT_DEFAULT;
    hub->bookmark_s = WATCH_BOOKMARK_DEFAULT_S;
    if (!hub->ring || !hub->scratch) {
        free(hub->ring);
        if (hub->scratch)
            evbuffer_free(hub->scratch);
        free(hub);
        return NULL;
    }
    return hub;
}

void sl_watch_hub_set_bookmark_seconds(sl_watch_hub_t *hub, unsigned seconds)
{
    hub->bookmark_s = seconds ? seconds : WATCH_BOOKMARK_DEFAULT_S;
}

void sl_watch_hub_set_max_output(sl_watch_hub_t *hub, size_t bytes)
{
    hub->max_output = bytes ? bytes : WATCH_MAX_OUTPUT_DEFAULT;
}

void sl_watch_hub_free(sl_watch_hub_t *hub)
{
    if (!hub)
        return;
    while (hub->watches)
        watch_end(hub->watches, hub->watches->doomed ? END_ABORT : END_CLEAN);
    for (size_t i = 0; i < hub->count; i++)
        json_decref(hub->ring[(hub->head + i) % hub->cap].obj);
    free(hub->ring);
    evbuffer_free(hub->scratch);
    free(hub);
}

size_t sl_watch_count(const sl_watch_hub_t *hub)
{
    return hub ? hub->nwatches : 0;
}

void sl_watch_publish(sl_watch_hub_t *hub, const char *type, enum sl_kind kind, json_t *obj)
{
    if (!hub)
        return;
    const char *t = event_type(type);
    uint64_t rv;
    if (!t || (unsigned)kind >= SL_KIND__COUNT ||
        parse_rv(meta_string(obj, "resourceVersion"), &rv) != 0) {
        sl_log_error("watch: ignoring a change without a type, kind or resourceVersion (%s %s)",
                     type ? type : "(no type)",
                     meta_string(obj, "name") ? meta_string(obj, "name") : "(no name)");
        return;
    }
    json_t *copy = json_deep_copy(obj);
    if (!copy) {
        /* Watchers would miss it without knowing: make them relist. */
        const char *name = meta_string(obj, "name");
        sl_log_error("watch: out of memory keeping %s %s; open watches are dropped", t,
                     name ? name : "(no name)");
        for (watch_t *w = hub->watches; w; w = w->next)
            watch_doom(w, "out of memory");
        hub->horizon = rv;
        if (rv > hub->cur_rv)
            hub->cur_rv = rv;
        return;
    }
    if (hub->count == hub->cap) {
        event_t *old = &hub->ring[hub->head];
        if (old->rv > hub->horizon)
            hub->horizon = old->rv;
        json_decref(old->obj);
        hub->head = (hub->head + 1) % hub->cap;
        hub->count--;
    }
    event_t *ev = &hub->ring[(hub->head + hub->count) % hub->cap];
    *ev = (event_t){.rv = rv, .type = t, .kind = kind, .obj = copy};
    hub->count++;
    if (rv > hub->cur_rv)
        hub->cur_rv = rv;

    /* Rendered and serialized once for all the watches it goes to. */
    json_t *rendered = NULL;
    char *line = NULL;
    watch_t *next;
    for (watch_t *w = hub->watches; w; w = next) {
        next = w->next; /* a send may only doom w, never free it */
        if (w->kind != kind || w->doomed || !ns_passes(w, copy))
            continue;
        if (!rendered && !(rendered = hub->render(hub->render_ctx, kind, copy)))
            break; /* the render fn skips this object */
        if (w->match && !w->match(w->match_ctx, rendered))
            continue;
        if (!line && !(line = event_line(t, rendered))) {
            watch_doom(w, "out of memory");
            continue;
        }
        watch_send(w, t, line);
    }
    free(line);
    json_decref(rendered);
}

void sl_watch_observe(void *hub, const char *type, enum sl_kind kind, json_t *obj)
{
    sl_watch_publish(hub, type, kind, obj);
}

/* The single event a watch from an expired RV gets, as the API server sends
 * it; then the response ends. */
static void send_expired(sl_watch_hub_t *hub, struct evhttp_request *req, uint64_t n)
{
    char msg[96];
    snprintf(msg, sizeof(msg), "too old resource version: %" PRIu64 " (%" PRIu64 ")", n,
             hub->horizon);
    json_t *status = json_pack("{s:s, s:s, s:{}, s:s, s:s, s:s, s:i}", "kind", "Status",
                               "apiVersion", "v1", "metadata", "status", "Failure", "message", msg,
                               "reason", "Expired", "code", 410);
    char *line = status ? event_line("ERROR", status) : NULL;
    json_decref(status);
    evhttp_send_reply_start(req, 200, "OK");
    if (line) {
        struct evbuffer *b = hub->scratch;
        evbuffer_add(b, line, strlen(line));
        evbuffer_add(b, "\n", 1);
        evhttp_send_reply_chunk(req, b);
        evbuffer_drain(b, evbuffer_get_length(b));
        sl_ctrl_count_watch_event("ERROR");
        free(line);
    }
    evhttp_send_reply_end(req);
}

int sl_watch_serve(sl_watch_hub_t *hub, struct evhttp_request *req, const sl_watch_params_t *p,
                   char *err, size_t errlen)
{
    if (!hub || !req || !p || (unsigned)p->kind >= SL_KIND__COUNT) {
        set_err(err, errlen, "watch: no hub, request or kind");
        return -1;
    }
    const char *rvs = p->resource_version;
    bool from_now = !rvs || !rvs[0] || strcmp(rvs, "0") == 0;
    uint64_t n = 0;
    if (!from_now && parse_rv(rvs, &n) != 0) {
        set_err(err, errlen,
                "resourceVersion \"%.64s\" is not a non-negative integer (use the "
                "metadata.resourceVersion of a list or an event, or 0 for the current state)",
                rvs);
        return -1;
    }
    struct evhttp_connection *conn = evhttp_request_get_connection(req);
    if (!conn) {
        set_err(err, errlen, "watch: the client has gone away");
        return -1;
    }
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", "application/json");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    if (!from_now && n < hub->horizon) {
        send_expired(hub, req, n);
        if (p->match_free)
            p->match_free(p->match_ctx); /* on 0, match_ctx is the hub's */
        return 0;
    }
    evhttp_remove_header(h, "Connection");
    evhttp_add_header(h, "Connection", "close");

    watch_t *w = calloc(1, sizeof(*w));
    if (!w) {
        set_err(err, errlen, "watch: out of memory");
        return -1;
    }
    w->hub = hub;
    w->req = req;
    w->conn = conn;
    w->kind = p->kind;
    w->match = p->match;
    w->match_ctx = p->match_ctx;
    w->bookmarks = p->bookmarks;
    w->end_how = END_CLEAN;
    w->bookmark_tv.tv_sec = p->bookmark_seconds ? p->bookmark_seconds : hub->bookmark_s;
    w->end_ev = evtimer_new(hub->base, end_cb, w);
    if (w->bookmarks)
        w->bookmark_ev = evtimer_new(hub->base, bookmark_cb, w);
    if ((p->ns && !(w->ns = strdup(p->ns))) || !w->end_ev || (w->bookmarks && !w->bookmark_ev)) {
        if (w->end_ev)
            event_free(w->end_ev);
        if (w->bookmark_ev)
            event_free(w->bookmark_ev);
        free(w->ns);
        free(w);
        set_err(err, errlen, "watch: out of memory");
        return -1;
    }
    /* From here the watch owns match_ctx. */
    w->match_free = p->match_free;
    w->next = hub->watches;
    if (hub->watches)
        hub->watches->prev = w;
    hub->watches = w;
    hub->nwatches++;
    sl_ctrl_watch_opened();

    struct bufferevent *bev = evhttp_connection_get_bufferevent(conn);
    struct timeval write_tv = {WATCH_WRITE_TIMEOUT_S, 0};
    bufferevent_set_timeouts(bev, NULL, &write_tv);
    bufferevent_setwatermark(bev, EV_READ, 0, WATCH_INPUT_MAX_BYTES);
    evhttp_connection_set_closecb(conn, close_cb, w);
    if (p->timeout_seconds) {
        struct timeval tv = {(time_t)p->timeout_seconds, 0};
        evtimer_add(w->end_ev, &tv);
    }
    evhttp_send_reply_start(req, 200, "OK");

    if (from_now) {
        size_t i;
        json_t *obj;
        json_array_foreach(p->initial, i, obj)
        {
            if (!ns_passes(w, obj) || (w->match && !w->match(w->match_ctx, obj)))
                continue;
            char *line = event_line("ADDED", obj);
            int rc = line ? watch_send(w, "ADDED", line) : -1;
            free(line);
            if (rc != 0)
                break;
        }
    } else {
        /* n >= horizon: every change after n is in the ring. An n past the
         * latest change is served as the current state. */
        for (size_t i = 0; i < hub->count; i++) {
            const event_t *ev = &hub->ring[(hub->head + i) % hub->cap];
            if (ev->rv > n && watch_send_stored(w, ev) != 0)
                break;
        }
    }
    if (w->bookmark_ev && !w->doomed)
        evtimer_add(w->bookmark_ev, &w->bookmark_tv);
    return 0;
}
