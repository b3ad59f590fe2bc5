/*
 * Unit tests of the watch hub (controller/watch.c) with everything real
 * around it: a store in a temporary directory whose observer feeds
 * sl_watch_publish, an evhttp server on 127.0.0.1:0 whose handler parses the
 * watch parameters as the Kubernetes-compatible API does and calls
 * sl_watch_serve, and clients on plain sockets that decode the chunked
 * stream while the test drives the event loop.
 *
 * Covers: synthetic ADDED for RV 0 then live MODIFIED/DELETED, kind,
 * namespace and match filters, one render per event for any number of
 * watches, resuming from an RV (exactly the missed events), 410 Expired
 * once the ring dropped them or for an RV older than the hub, a bad RV,
 * bookmarks, timeoutSeconds, a client that goes away, a client that stops
 * reading, the hub's end, and the watch metrics. Run under ASan for leaks
 * and use-after-free.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ctrl_metrics.h"
#include "store.h"
#include "watch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    char dir[256];
    sl_store_t *st;
    struct event_base *base;
    struct evhttp *http;
    int port;
    sl_watch_hub_t *hub;
    int renders; /* calls of render() */
} fixture_t;

/* ---- server side ------------------------------------------------------------ */

/* As kapi.c does: apiVersion and kind set, status merged in. */
static json_t *render(void *ctx, enum sl_kind kind, json_t *stored)
{
    fixture_t *f = ctx;
    f->renders++;
    json_t *o = json_deep_copy(stored);
    json_object_set_new(o, "kind", json_string(sl_kind_name(kind)));
    json_object_set_new(o, "status", json_pack("{s:b}", "rendered", 1));
    return o;
}

/* A label selector of one "key=value". */
static bool match_label(void *ctx, json_t *rendered)
{
    const char *sel = ctx;
    const char *eq = strchr(sel, '=');
    char key[64];
    snprintf(key, sizeof(key), "%.*s", (int)(eq - sel), sel);
    json_t *labels = json_object_get(json_object_get(rendered, "metadata"), "labels");
    const char *v = json_string_value(json_object_get(labels, key));
    return v && strcmp(v, eq + 1) == 0;
}

/* GET /watch/<plural>?resourceVersion=&namespace=&timeoutSeconds=
 * &allowWatchBookmarks=&bookmarkSeconds=&labelSelector= */
static void handler(struct evhttp_request *req, void *arg)
{
    fixture_t *f = arg;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = evhttp_uri_get_path(uri);
    enum sl_kind kind;
    if (strncmp(path, "/watch/", 7) != 0 || sl_kind_from_plural(path + 7, &kind) != 0) {
        evhttp_send_reply(req, 404, "Not Found", NULL);
        return;
    }
    struct evkeyvalq q;
    evhttp_parse_query_str(evhttp_uri_get_query(uri) ? evhttp_uri_get_query(uri) : "", &q);
    const char *rv = evhttp_find_header(&q, "resourceVersion");
    const char *ns = evhttp_find_header(&q, "namespace");
    const char *timeout = evhttp_find_header(&q, "timeoutSeconds");
    const char *bookmarks = evhttp_find_header(&q, "allowWatchBookmarks");
    const char *bookmark_s = evhttp_find_header(&q, "bookmarkSeconds");
    const char *sel = evhttp_find_header(&q, "labelSelector");

    sl_watch_params_t p = {
        .kind = kind,
        .ns = ns,
        .resource_version = rv,
        .bookmarks = bookmarks && strcmp(bookmarks, "true") == 0,
        .timeout_seconds = timeout ? (unsigned)atoi(timeout) : 0,
        .bookmark_seconds = bookmark_s ? (unsigned)atoi(bookmark_s) : 0,
    };
    if (sel) {
        p.match = match_label;
        p.match_ctx = strdup(sel);
        p.match_free = free;
    }
    json_t *initial = NULL;
    if (!rv || !rv[0] || strcmp(rv, "0") == 0) {
        json_t *list = NULL;
        assert_int_equal(sl_store_list(f->st, kind, ns, &list), SL_STORE_OK);
        initial = json_array();
        size_t i;
        json_t *o;
        json_array_foreach(list, i, o) json_array_append_new(initial, render(f, kind, o));
        json_decref(list);
    }
    p.initial = initial;
    char err[256];
    if (sl_watch_serve(f->hub, req, &p, err, sizeof(err)) != 0) {
        free(p.match_ctx);
        struct evbuffer *b = evbuffer_new();
        evbuffer_add_printf(b, "%s", err);
        evhttp_send_reply(req, 400, "Bad Request", b);
        evbuffer_free(b);
    }
    json_decref(initial);
    evhttp_clear_headers(&q);
}

static void rm_rf(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

static fixture_t *setup_history(size_t history, void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    snprintf(f->dir, sizeof(f->dir), "/tmp/sl-test-watch-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    char err[512];
    f->st = sl_store_open(f->dir, err, sizeof(err));
    if (!f->st)
        fail_msg("store: %s", err);
    f->base = event_base_new();
    f->http = evhttp_new(f->base);
    assert_non_null(f->http);
    /* The server timeout is also a read timeout while a response is written:
     * 1 s here, so that the quiet watches below prove it does not cut them. */
    evhttp_set_timeout(f->http, 1);
    evhttp_set_gencb(f->http, handler, f);
    struct evhttp_bound_socket *bound = evhttp_bind_socket_with_handle(f->http, "127.0.0.1", 0);
    assert_non_null(bound);
    struct sockaddr_in sa;
    socklen_t len = sizeof(sa);
    assert_int_equal(getsockname(evhttp_bound_socket_get_fd(bound), (struct sockaddr *)&sa, &len),
                     0);
    f->port = ntohs(sa.sin_port);
    f->hub = sl_watch_hub_new(f->base, sl_store_resource_version(f->st), history, render, f);
    assert_non_null(f->hub);
    sl_store_set_observer(f->st, sl_watch_observe, f->hub);
    *state = f;
    return f;
}

static int setup(void **state)
{
    setup_history(0, state);
    return 0;
}

static int setup_small_history(void **state)
{
    setup_history(4, state);
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    sl_watch_hub_free(f->hub);
    /* Let the ended responses go out before the server goes. */
    for (int i = 0; i < 10; i++)
        event_base_loop(f->base, EVLOOP_NONBLOCK);
    evhttp_free(f->http);
    event_base_free(f->base);
    sl_store_close(f->st);
    rm_rf(f->dir);
    free(f);
    return 0;
}

/* ---- writes through the store --------------------------------------------- */

static json_t *backend(const char *ns, const char *name, int port, const char *app)
{
    json_t *o = json_pack("{s:s, s:s, s:{s:s, s:s}, s:{s:[{s:s, s:i}]}}", "apiVersion",
                          SL_API_VERSION, "kind", "Backend", "metadata", "name", name, "namespace",
                          ns, "spec", "endpoints", "address", "127.0.0.1", "port", port);
    if (app)
        json_object_set_new(json_object_get(o, "metadata"), "labels",
                            json_pack("{s:s}", "app", app));
    return o;
}

static void put(fixture_t *f, const char *ns, const char *name, int port, const char *app)
{
    json_t *o = backend(ns, name, port, app);
    json_t *stored = NULL;
    char err[512];
    if (sl_store_put(f->st, o, SL_STORE_REPLACE, "", &stored, err, sizeof(err)) != SL_STORE_OK)
        fail_msg("put: %s", err);
    json_decref(stored);
    json_decref(o);
}

static void del(fixture_t *f, const char *ns, const char *name)
{
    char err[512];
    if (sl_store_delete(f->st, SL_KIND_BACKEND, ns, name, "", NULL, err, sizeof(err)) !=
        SL_STORE_OK)
        fail_msg("delete: %s", err);
}

static void put_api(fixture_t *f, const char *name)
{
    json_t *o = json_pack("{s:s, s:s, s:{s:s}, s:{s:s, s:[{s:s}]}}", "apiVersion", SL_API_VERSION,
                          "kind", "Api", "metadata", "name", name, "spec", "basePath", "/x",
                          "backends", "name", "echo");
    json_t *stored = NULL;
    char err[512];
    if (sl_store_put(f->st, o, SL_STORE_REPLACE, "", &stored, err, sizeof(err)) != SL_STORE_OK)
        fail_msg("put api: %s", err);
    json_decref(stored);
    json_decref(o);
}

/* ---- client side ------------------------------------------------------------ */

typedef struct {
    int fd;
    struct evbuffer *raw;  /* bytes not decoded yet */
    struct evbuffer *body; /* decoded body */
    char head[2048];
    int status;
    bool headers_done, chunked, ended, closed;
    long chunk; /* size of the chunk being read; -1: reading a size line */
} client_t;

static client_t *client_open(fixture_t *f, const char *target, int rcvbuf)
{
    client_t *c = calloc(1, sizeof(*c));
    assert_non_null(c);
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(c->fd >= 0);
    if (rcvbuf)
        setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)f->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    char req[512];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", target);
    assert_int_equal(send(c->fd, req, (size_t)n, 0), n);
    fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
    c->raw = evbuffer_new();
    c->body = evbuffer_new();
    c->chunk = -1;
    return c;
}

static void client_close(client_t *c)
{
    if (!c)
        return;
    if (c->fd >= 0)
        close(c->fd);
    evbuffer_free(c->raw);
    evbuffer_free(c->body);
    free(c);
}

static void decode(client_t *c)
{
    if (!c->headers_done) {
        struct evbuffer_ptr end = evbuffer_search(c->raw, "\r\n\r\n", 4, NULL);
        if (end.pos < 0)
            return;
        size_t n =
            (size_t)end.pos + 4 < sizeof(c->head) ? (size_t)end.pos + 4 : sizeof(c->head) - 1;
        evbuffer_remove(c->raw, c->head, n);
        c->head[n] = '\0';
        evbuffer_drain(c->raw, (size_t)end.pos + 4 - n);
        c->status = atoi(c->head + 9);
        c->chunked = strcasestr(c->head, "\r\nTransfer-Encoding: chunked") != NULL;
        c->headers_done = true;
    }
    if (!c->chunked) {
        evbuffer_add_buffer(c->body, c->raw);
        return;
    }
    while (!c->ended) {
        if (c->chunk < 0) {
            char *line = evbuffer_readln(c->raw, NULL, EVBUFFER_EOL_CRLF_STRICT);
            if (!line)
                return;
            c->chunk = strtol(line, NULL, 16);
            free(line);
            if (c->chunk == 0) {
                c->ended = true;
                return;
            }
        }
        if (evbuffer_get_length(c->raw) < (size_t)c->chunk + 2)
            return;
        evbuffer_remove_buffer(c->raw, c->body, (size_t)c->chunk);
        evbuffer_drain(c->raw, 2);
        c->chunk = -1;
    }
}

/* Reads what is there (never blocks). */
static void client_read(client_t *c)
{
    char buf[65536];
    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
        if (n > 0) {
            evbuffer_add(c->raw, buf, (size_t)n);
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR))
            c->closed = true;
        break;
    }
    decode(c);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Runs the server's loop and the client for up to `ms`. */
static void pump(fixture_t *f, client_t *c, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;
    do {
        event_base_loop(f->base, EVLOOP_NONBLOCK);
        if (c) {
            struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
            poll(&pfd, 1, 5);
            client_read(c);
        } else {
            usleep(5000);
        }
    } while (now_ms() < end);
}

/* The next event line, or NULL when none came within `ms` (or the response
 * ended). Caller decrefs. */
static json_t *next_event(fixture_t *f, client_t *c, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;
    for (;;) {
        char *line = evbuffer_readln(c->body, NULL, EVBUFFER_EOL_LF);
        if (line) {
            json_error_t jerr;
            json_t *ev = json_loads(line, 0, &jerr);
            if (!ev)
                fail_msg("not JSON: %s (%s)", line, jerr.text);
            free(line);
            return ev;
        }
        if (c->ended || c->closed || now_ms() >= end)
            return NULL;
        event_base_loop(f->base, EVLOOP_NONBLOCK);
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        poll(&pfd, 1, 5);
        client_read(c);
    }
}

static const char *ev_type(json_t *ev)
{
    return json_string_value(json_object_get(ev, "type"));
}

static const char *ev_meta(json_t *ev, const char *key)
{
    return json_string_value(
        json_object_get(json_object_get(json_object_get(ev, "object"), "metadata"), key));
}

/* Asserts the next event's type, name and resourceVersion (rv NULL: any). */
static void expect(fixture_t *f, client_t *c, const char *type, const char *name, const char *rv)
{
    json_t *ev = next_event(f, c, 3000);
    if (!ev)
        fail_msg("no %s event for %s (status %d, ended %d, closed %d)", type, name, c->status,
                 c->ended, c->closed);
    assert_string_equal(ev_type(ev), type);
    assert_string_equal(ev_meta(ev, "name"), name);
    if (rv)
        assert_string_equal(ev_meta(ev, "resourceVersion"), rv);
    /* Rendered: the render fn's additions are there. */
    assert_true(json_is_true(
        json_object_get(json_object_get(json_object_get(ev, "object"), "status"), "rendered")));
    assert_string_equal(json_string_value(json_object_get(json_object_get(ev, "object"), "kind")),
                        "Backend");
    json_decref(ev);
}

static void expect_nothing(fixture_t *f, client_t *c, int ms)
{
    json_t *ev = next_event(f, c, ms);
    if (ev) {
        char *s = json_dumps(ev, 0);
        fail_msg("unexpected event: %s", s);
    }
}

static void wait_count(fixture_t *f, size_t want)
{
    uint64_t end = now_ms() + 3000;
    while (sl_watch_count(f->hub) != want && now_ms() < end)
        pump(f, NULL, 5);
    assert_int_equal(sl_watch_count(f->hub), want);
}

static uint64_t metric(const char *name_and_labels)
{
    struct evbuffer *b = evbuffer_new();
    sl_ctrl_render_watch(b);
    size_t len = evbuffer_get_length(b);
    char *text = calloc(1, len + 1);
    evbuffer_remove(b, text, len);
    evbuffer_free(b);
    char needle[128];
    snprintf(needle, sizeof(needle), "\n%s ", name_and_labels);
    char *at = strstr(text, needle);
    if (!at)
        fail_msg("no %s in %s", name_and_labels, text);
    uint64_t v = strtoull(at + strlen(needle), NULL, 10);
    free(text);
    return v;
}

/* ---- tests ------------------------------------------------------------------ */

static void test_initial_added_then_live_changes(void **state)
{
    fixture_t *f = *state;
    put(f, "default", "a", 9001, NULL); /* rv 1 */
    put(f, "default", "b", 9002, NULL); /* rv 2 */
    put_api(f, "petstore");             /* rv 3: another kind */
    uint64_t added0 = metric("sluice_controller_watch_events_total{type=\"ADDED\"}");

    client_t *c = client_open(f, "/watch/backends?resourceVersion=0", 0);
    expect(f, c, "ADDED", "a", "1");
    expect(f, c, "ADDED", "b", "2");
    assert_int_equal(c->status, 200);
    assert_true(c->chunked);
    assert_non_null(strcasestr(c->head, "\r\nContent-Type: application/json"));
    assert_non_null(strcasestr(c->head, "\r\nCache-Control: no-cache"));
    assert_int_equal(sl_watch_count(f->hub), 1);
    assert_int_equal(metric("sluice_controller_watches"), 1);
    assert_int_equal(metric("sluice_controller_watch_events_total{type=\"ADDED\"}"), added0 + 2);

    put_api(f, "other");                /* rv 4: not sent */
    put(f, "default", "a", 9011, NULL); /* rv 5 */
    expect(f, c, "MODIFIED", "a", "5");
    del(f, "default", "b"); /* rv 6 */
    json_t *ev = next_event(f, c, 3000);
    assert_non_null(ev);
    assert_string_equal(ev_type(ev), "DELETED");
    assert_string_equal(ev_meta(ev, "name"), "b");
    assert_string_equal(ev_meta(ev, "resourceVersion"), "6");
    /* The last stored state of the deleted object. */
    json_t *ep = json_array_get(
        json_object_get(json_object_get(json_object_get(ev, "object"), "spec"), "endpoints"), 0);
    assert_int_equal(json_integer_value(json_object_get(ep, "port")), 9002);
    json_decref(ev);
    put(f, "default", "c", 9003, NULL); /* rv 7: ADDED live */
    expect(f, c, "ADDED", "c", "7");
    expect_nothing(f, c, 100);
    assert_false(c->ended);

    client_close(c);
    wait_count(f, 0);
    assert_int_equal(metric("sluice_controller_watches"), 0);
}

static void test_namespace_and_match_filters_render_once(void **state)
{
    fixture_t *f = *state;
    put(f, "a", "one", 9001, "web");
    put(f, "b", "two", 9002, "web");
    put(f, "a", "three", 9003, "db");

    client_t *in_a = client_open(f, "/watch/backends?namespace=a", 0);
    expect(f, in_a, "ADDED", "one", NULL);
    expect(f, in_a, "ADDED", "three", NULL);
    client_t *web = client_open(f, "/watch/backends?labelSelector=app%3Dweb", 0);
    expect(f, web, "ADDED", "one", NULL);
    expect(f, web, "ADDED", "two", NULL);
    client_t *all[3];
    for (int i = 0; i < 3; i++) {
        all[i] = client_open(f, "/watch/backends?resourceVersion=0", 0);
        expect(f, all[i], "ADDED", "one", NULL);
        expect(f, all[i], "ADDED", "three", NULL);
        expect(f, all[i], "ADDED", "two", NULL);
    }
    wait_count(f, 5);

    int renders = f->renders;
    put(f, "b", "two", 9012, "db");            /* in b, now db: only the "all" watches */
    assert_int_equal(f->renders, renders + 1); /* once for the five watches */
    for (int i = 0; i < 3; i++)
        expect(f, all[i], "MODIFIED", "two", NULL);
    expect_nothing(f, in_a, 100);
    expect_nothing(f, web, 50);

    put(f, "a", "four", 9004, "web"); /* every watch */
    expect(f, in_a, "ADDED", "four", NULL);
    expect(f, web, "ADDED", "four", NULL);
    for (int i = 0; i < 3; i++) {
        expect(f, all[i], "ADDED", "four", NULL);
        client_close(all[i]);
    }
    client_close(in_a);
    client_close(web);
    wait_count(f, 0); /* and match_free ran for the selector (ASan: no leak) */
}

static void test_resume_replays_exactly_the_missed_events(void **state)
{
    fixture_t *f = *state;
    put(f, "default", "a", 9001, NULL); /* 1 */
    put(f, "default", "b", 9002, NULL); /* 2 */
    put(f, "default", "a", 9011, NULL); /* 3 */
    put_api(f, "petstore");             /* 4 */
    del(f, "default", "b");             /* 5 */
    put(f, "default", "c", 9003, NULL); /* 6 */

    client_t *c = client_open(f, "/watch/backends?resourceVersion=2", 0);
    expect(f, c, "MODIFIED", "a", "3");
    expect(f, c, "DELETED", "b", "5");
    expect(f, c, "ADDED", "c", "6");
    expect_nothing(f, c, 100);
    put(f, "default", "a", 9021, NULL); /* 7, live */
    expect(f, c, "MODIFIED", "a", "7");
    client_close(c);

    /* From the latest RV: nothing replayed, live only. */
    c = client_open(f, "/watch/backends?resourceVersion=7", 0);
    expect_nothing(f, c, 100);
    put(f, "default", "c", 9013, NULL); /* 8 */
    expect(f, c, "MODIFIED", "c", "8");
    client_close(c);

    /* Past the latest: served as the current state. */
    c = client_open(f, "/watch/backends?resourceVersion=100", 0);
    expect_nothing(f, c, 100);
    assert_int_equal(c->status, 200);
    put(f, "default", "c", 9023, NULL); /* 9 */
    expect(f, c, "MODIFIED", "c", "9");
    client_close(c);

    /* Not a resourceVersion: 400 from the caller, nothing streamed. */
    const char *bad[] = {"abc", "-1", "1x", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char target[128];
        snprintf(target, sizeof(target), "/watch/backends?resourceVersion=%s", bad[i]);
        c = client_open(f, target, 0);
        pump(f, c, 50);
        assert_int_equal(c->status, 400);
        char body[512] = "";
        evbuffer_copyout(c->body, body, sizeof(body) - 1);
        assert_non_null(strstr(body, "is not a non-negative integer"));
        assert_non_null(strstr(body, bad[i]));
        client_close(c);
    }
    wait_count(f, 0);
}

static void expect_expired(fixture_t *f, const char *rv, const char *message)
{
    char target[128];
    snprintf(target, sizeof(target), "/watch/backends?resourceVersion=%s", rv);
    client_t *c = client_open(f, target, 0);
    json_t *ev = next_event(f, c, 3000);
    assert_non_null(ev);
    assert_int_equal(c->status, 200);
    assert_string_equal(ev_type(ev), "ERROR");
    json_t *st = json_object_get(ev, "object");
    assert_string_equal(json_string_value(json_object_get(st, "kind")), "Status");
    assert_string_equal(json_string_value(json_object_get(st, "apiVersion")), "v1");
    assert_true(json_is_object(json_object_get(st, "metadata")));
    assert_string_equal(json_string_value(json_object_get(st, "status")), "Failure");
    assert_string_equal(json_string_value(json_object_get(st, "reason")), "Expired");
    assert_int_equal(json_integer_value(json_object_get(st, "code")), 410);
    assert_string_equal(json_string_value(json_object_get(st, "message")), message);
    json_decref(ev);
    /* Then the response ends. */
    assert_null(next_event(f, c, 3000));
    assert_true(c->ended);
    assert_int_equal(sl_watch_count(f->hub), 0);
    client_close(c);
}

static void test_expired_when_the_ring_dropped_the_events(void **state)
{
    fixture_t *f = *state; /* history 4 */
    for (int i = 1; i <= 6; i++)
        put(f, "default", "a", 9000 + i, NULL); /* rv 1..6; the ring keeps 3..6 */
    expect_expired(f, "1", "too old resource version: 1 (2)");
    /* "0000" is N = 0, not "0"; the selector's context is freed (ASan). */
    expect_expired(f, "0000&labelSelector=app%3Dx", "too old resource version: 0 (2)");

    /* 2 is the oldest RV that can be served: every change after it is kept. */
    client_t *c = client_open(f, "/watch/backends?resourceVersion=2", 0);
    for (int rv = 3; rv <= 6; rv++) {
        char s[16];
        snprintf(s, sizeof(s), "%d", rv);
        expect(f, c, "MODIFIED", "a", s);
    }
    client_close(c);

    /* A hub started after changes it never saw cannot replay them. */
    sl_watch_hub_free(f->hub);
    f->hub = sl_watch_hub_new(f->base, sl_store_resource_version(f->st), 4, render, f);
    assert_non_null(f->hub);
    sl_store_set_observer(f->st, sl_watch_observe, f->hub);
    expect_expired(f, "5", "too old resource version: 5 (6)");
    c = client_open(f, "/watch/backends?resourceVersion=6", 0);
    expect_nothing(f, c, 100);
    put(f, "default", "a", 9100, NULL);
    expect(f, c, "MODIFIED", "a", "7");
    client_close(c);
    wait_count(f, 0);
}

static void test_bookmarks_when_quiet(void **state)
{
    fixture_t *f = *state;
    put(f, "default", "a", 9001, NULL); /* 1 */
    put_api(f, "petstore");             /* 2: the bookmark carries the latest RV */
    client_t *bm = client_open(
        f, "/watch/backends?resourceVersion=1&allowWatchBookmarks=true&bookmarkSeconds=1", 0);
    client_t *plain = client_open(f, "/watch/backends?resourceVersion=1&bookmarkSeconds=1", 0);

    uint64_t t0 = now_ms();
    json_t *ev = next_event(f, bm, 3000);
    assert_non_null(ev);
    uint64_t waited = now_ms() - t0;
    assert_true(waited >= 900);
    assert_string_equal(ev_type(ev), "BOOKMARK");
    json_t *obj = json_object_get(ev, "object");
    assert_string_equal(json_string_value(json_object_get(obj, "kind")), "Backend");
    assert_string_equal(json_string_value(json_object_get(obj, "apiVersion")), SL_API_VERSION);
    assert_string_equal(ev_meta(ev, "resourceVersion"), "2");
    assert_int_equal(json_object_size(json_object_get(obj, "metadata")), 1);
    json_decref(ev);

    /* An event resets the period: no bookmark right after it. */
    pump(f, bm, 500);
    put(f, "default", "a", 9002, NULL); /* 3 */
    expect(f, bm, "MODIFIED", "a", "3");
    expect_nothing(f, bm, 700);
    ev = next_event(f, bm, 1500);
    assert_non_null(ev);
    assert_string_equal(ev_type(ev), "BOOKMARK");
    assert_string_equal(ev_meta(ev, "resourceVersion"), "3");
    json_decref(ev);

    /* Without allowWatchBookmarks, never. */
    expect(f, plain, "MODIFIED", "a", "3");
    expect_nothing(f, plain, 300);
    client_close(bm);
    client_close(plain);
    wait_count(f, 0);
}

static void test_timeout_seconds_ends_the_response(void **state)
{
    fixture_t *f = *state;
    put(f, "default", "a", 9001, NULL);
    uint64_t t0 = now_ms();
    client_t *c = client_open(f, "/watch/backends?resourceVersion=0&timeoutSeconds=1", 0);
    expect(f, c, "ADDED", "a", "1");
    assert_null(next_event(f, c, 3000));
    assert_true(c->ended); /* the terminating chunk: a clean end */
    uint64_t took = now_ms() - t0;
    assert_true(took >= 900 && took < 2500);
    assert_int_equal(sl_watch_count(f->hub), 0);
    /* Then the connection closes. */
    pump(f, c, 100);
    assert_true(c->closed);
    client_close(c);
}

static void test_client_gone_frees_the_watch(void **state)
{
    fixture_t *f = *state;
    client_t *gone = client_open(f, "/watch/backends?timeoutSeconds=30", 0);
    client_t *stays = client_open(f, "/watch/backends?allowWatchBookmarks=true", 0);
    wait_count(f, 2);
    close(gone->fd);
    gone->fd = -1;
    wait_count(f, 1);
    assert_int_equal(metric("sluice_controller_watches"), 1);
    /* The hub goes on with the other (and the freed one's timers are gone:
     * ASan would see them fire on freed memory). */
    put(f, "default", "a", 9001, NULL);
    expect(f, stays, "ADDED", "a", "1");
    client_close(gone);
    client_close(stays);
    wait_count(f, 0);
}

static void test_slow_client_is_dropped(void **state)
{
    fixture_t *f = *state;
    sl_watch_hub_set_max_output(f->hub, 512 * 1024);
    client_t *slow = client_open(f, "/watch/backends", 4096);
    client_t *fast = client_open(f, "/watch/backends", 0);
    wait_count(f, 2);

    /* 64 KiB events: the slow client never reads. */
    char *big = malloc(65536);
    memset(big, 'x', 65535);
    big[65535] = '\0';
    int sent = 0, got = 0;
    for (; sent < 400 && sl_watch_count(f->hub) == 2; sent++) {
        json_t *o = backend("default", "big", 9000, NULL);
        json_object_set_new(json_object_get(o, "metadata"), "annotations",
                            json_pack("{s:s}", "blob", big));
        char rv[16];
        snprintf(rv, sizeof(rv), "%d", sent + 1);
        json_object_set_new(json_object_get(o, "metadata"), "resourceVersion", json_string(rv));
        sl_watch_publish(f->hub, sent ? "MODIFIED" : "ADDED", SL_KIND_BACKEND, o);
        json_decref(o);
        for (int i = 0; i < 3; i++) {
            event_base_loop(f->base, EVLOOP_NONBLOCK);
            client_read(fast);
        }
        json_t *ev;
        while ((ev = next_event(f, fast, 0)) != NULL) {
            got++;
            json_decref(ev);
        }
    }
    free(big);
    assert_true(sent < 400);
    wait_count(f, 1);
    /* Never more than the bound waited for it: it was cut, not ended. */
    for (int i = 0; i < 200 && !slow->closed; i++)
        pump(f, slow, 10);
    assert_true(slow->closed);
    assert_false(slow->ended);
    /* The fast client was not held back and still gets everything. */
    json_t *ev;
    while ((ev = next_event(f, fast, 500)) != NULL) {
        got++;
        json_decref(ev);
    }
    assert_int_equal(got, sent);
    assert_false(fast->closed);
    client_close(slow);
    client_close(fast);
    wait_count(f, 0);
}

static void test_hub_free_ends_every_watch(void **state)
{
    fixture_t *f = *state;
    put(f, "default", "a", 9001, NULL);
    client_t *c1 = client_open(f, "/watch/backends?resourceVersion=0", 0);
    client_t *c2 = client_open(f, "/watch/apis?allowWatchBookmarks=true&labelSelector=a%3Db", 0);
    expect(f, c1, "ADDED", "a", "1");
    wait_count(f, 2);
    sl_watch_hub_free(f->hub);
    f->hub = sl_watch_hub_new(f->base, sl_store_resource_version(f->st), 0, render, f);
    sl_store_set_observer(f->st, sl_watch_observe, f->hub);
    assert_null(next_event(f, c1, 3000));
    assert_true(c1->ended);
    assert_null(next_event(f, c2, 3000));
    assert_true(c2->ended);
    assert_int_equal(metric("sluice_controller_watches"), 0);
    client_close(c1);
    client_close(c2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_initial_added_then_live_changes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_namespace_and_match_filters_render_once, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_resume_replays_exactly_the_missed_events, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_expired_when_the_ring_dropped_the_events,
                                        setup_small_history, teardown),
        cmocka_unit_test_setup_teardown(test_bookmarks_when_quiet, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timeout_seconds_ends_the_response, setup, teardown),
        cmocka_unit_test_setup_teardown(test_client_gone_frees_the_watch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slow_client_is_dropped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hub_free_ends_every_watch, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
