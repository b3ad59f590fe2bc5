/*
 * Unit tests of runtime/health.c against a real loopback HTTP server that
 * lives in the test, on the same event_base as the checker: the server
 * answers a chosen status, closes, stays silent or sends garbage on command,
 * and the test drives the loop until the shared endpoint state flips.
 * Intervals are tens of milliseconds so the whole file runs in ~2 s.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "sl_types.h"

#include "../../../../runtime/proxy/health.c"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <fcntl.h>
#include <sys/time.h>

/* ---- the test server ---- */

enum srv_mode { SRV_STATUS, SRV_CLOSE, SRV_SILENT, SRV_GARBAGE };

#define SRV_MAX_CONNS 256

typedef struct {
    struct event_base *base;
    struct evconnlistener *lev;
    uint16_t port;
    enum srv_mode mode;
    int status;
    int accepted;
    int requests;
    char last_request[1024];
    struct bufferevent *conns[SRV_MAX_CONNS];
} test_server_t;

static void srv_drop(test_server_t *s, struct bufferevent *bev)
{
    for (int i = 0; i < SRV_MAX_CONNS; i++)
        if (s->conns[i] == bev)
            s->conns[i] = NULL;
    bufferevent_free(bev);
}

static void srv_written(struct bufferevent *bev, void *arg)
{
    /* everything flushed: close, as "Connection: close" promised */
    srv_drop(arg, bev);
}

static void srv_event(struct bufferevent *bev, short what, void *arg)
{
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
        srv_drop(arg, bev);
}

static void srv_read(struct bufferevent *bev, void *arg)
{
    test_server_t *s = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    struct evbuffer_ptr end = evbuffer_search(in, "\r\n\r\n", 4, NULL);
    if (end.pos < 0) {
        if (evbuffer_get_length(in) > 4096)
            srv_drop(s, bev);
        return;
    }
    size_t len = (size_t)end.pos + 4;
    if (len >= sizeof(s->last_request))
        len = sizeof(s->last_request) - 1;
    evbuffer_remove(in, s->last_request, len);
    s->last_request[len] = '\0';
    evbuffer_drain(in, evbuffer_get_length(in));
    s->requests++;
    switch (s->mode) {
    case SRV_STATUS:
        bufferevent_setcb(bev, NULL, srv_written, srv_event, s);
        evbuffer_add_printf(bufferevent_get_output(bev),
                            "HTTP/1.1 %d Test\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                            s->status);
        break;
    case SRV_GARBAGE:
        bufferevent_setcb(bev, NULL, srv_written, srv_event, s);
        evbuffer_add_printf(bufferevent_get_output(bev), "SSH-2.0-OpenSSH_9.2\r\n");
        break;
    case SRV_CLOSE:
        srv_drop(s, bev);
        break;
    case SRV_SILENT:
        break; /* keep it open, say nothing */
    }
}

static void srv_accept(struct evconnlistener *lev, evutil_socket_t fd, struct sockaddr *sa,
                       int salen, void *arg)
{
    (void)lev;
    (void)sa;
    (void)salen;
    test_server_t *s = arg;
    s->accepted++;
    struct bufferevent *bev = bufferevent_socket_new(s->base, fd, BEV_OPT_CLOSE_ON_FREE);
    assert_non_null(bev);
    int slot = -1;
    for (int i = 0; i < SRV_MAX_CONNS && slot < 0; i++)
        if (s->conns[i] == NULL)
            slot = i;
    if (slot < 0) {
        bufferevent_free(bev);
        return;
    }
    s->conns[slot] = bev;
    bufferevent_setcb(bev, srv_read, NULL, srv_event, s);
    bufferevent_enable(bev, EV_READ);
}

static void srv_start(test_server_t *s, struct event_base *base, int status)
{
    memset(s, 0, sizeof(*s));
    s->base = base;
    s->mode = SRV_STATUS;
    s->status = status;
    struct sockaddr_in sin = {0};
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    s->lev = evconnlistener_new_bind(base, srv_accept, s, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE,
                                     64, (struct sockaddr *)&sin, sizeof(sin));
    assert_non_null(s->lev);
    struct sockaddr_in bound;
    socklen_t blen = sizeof(bound);
    assert_int_equal(getsockname(evconnlistener_get_fd(s->lev), (struct sockaddr *)&bound, &blen),
                     0);
    s->port = ntohs(bound.sin_port);
}

static void srv_stop(test_server_t *s)
{
    for (int i = 0; i < SRV_MAX_CONNS; i++)
        if (s->conns[i] != NULL)
            srv_drop(s, s->conns[i]);
    if (s->lev != NULL)
        evconnlistener_free(s->lev);
    s->lev = NULL;
}

/* A loopback port with nothing listening: connects are refused. */
static uint16_t closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sin = {0};
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    socklen_t len = sizeof(sin);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sin, &len), 0);
    close(fd);
    return ntohs(sin.sin_port);
}

/* ---- driving the loop ---- */

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
}

/* Runs the loop until pred(ctx) or max_ms elapsed; returns pred's value. */
static int run_until(struct event_base *base, int (*pred)(void *), void *ctx, uint64_t max_ms)
{
    struct event *tick = event_new(base, -1, EV_PERSIST, tick_cb, NULL);
    struct timeval tv = {0, 2000};
    event_add(tick, &tv);
    uint64_t end = sl_endpoint_now_ms() + max_ms;
    int ok = pred != NULL && pred(ctx);
    while (!ok && sl_endpoint_now_ms() < end) {
        event_base_loop(base, EVLOOP_ONCE);
        ok = pred != NULL && pred(ctx);
    }
    event_free(tick);
    return ok;
}

static void run_for(struct event_base *base, uint64_t ms)
{
    run_until(base, NULL, NULL, ms);
}

static int is_unhealthy(void *ep)
{
    return atomic_load(&((sl_endpoint_state_t *)ep)->hc_healthy) == 0;
}

static int is_healthy(void *ep)
{
    return atomic_load(&((sl_endpoint_state_t *)ep)->hc_healthy) == 1;
}

/* ---- capturing the process log (sl_log writes to fd 2) ---- */

static int saved_stderr = -1;
static FILE *capture_file;

static void capture_start(void)
{
    capture_file = tmpfile();
    assert_non_null(capture_file);
    saved_stderr = dup(STDERR_FILENO);
    dup2(fileno(capture_file), STDERR_FILENO);
}

/* Returns what was logged since capture_start (static buffer). */
static const char *capture_stop(void)
{
    static char text[16384];
    dup2(saved_stderr, STDERR_FILENO);
    close(saved_stderr);
    rewind(capture_file);
    size_t n = fread(text, 1, sizeof(text) - 1, capture_file);
    text[n] = '\0';
    fclose(capture_file);
    fputs(text, stderr); /* still show it */
    return text;
}

/* ---- snapshots ---- */

typedef struct {
    Sluice__V1__HealthCheck hc;
    Sluice__V1__Endpoint ep[4];
    Sluice__V1__Endpoint *eps[4];
    Sluice__V1__Cluster cl;
    Sluice__V1__Cluster *cls[1];
    Sluice__V1__Snapshot snap;
    char addr[4][64];
} snap_t;

/* One cluster "default/echo" with the given endpoints on 127.0.0.1 and a
 * fast health check. */
static void snap_init(snap_t *s, const uint16_t *ports, size_t n)
{
    memset(s, 0, sizeof(*s));
    sluice__v1__health_check__init(&s->hc);
    s->hc.path = "/healthz";
    s->hc.host = "";
    s->hc.interval_ms = 30;
    s->hc.timeout_ms = 200;
    s->hc.healthy_threshold = 2;
    s->hc.unhealthy_threshold = 3;
    s->hc.expected_status_min = 200;
    s->hc.expected_status_max = 299;
    for (size_t i = 0; i < n; i++) {
        sluice__v1__endpoint__init(&s->ep[i]);
        snprintf(s->addr[i], sizeof(s->addr[i]), "127.0.0.1");
        s->ep[i].address = s->addr[i];
        s->ep[i].port = ports[i];
        s->ep[i].weight = 1;
        s->eps[i] = &s->ep[i];
    }
    sluice__v1__cluster__init(&s->cl);
    s->cl.name = "default/echo";
    s->cl.n_endpoints = n;
    s->cl.endpoints = s->eps;
    s->cl.health_check = &s->hc;
    s->cls[0] = &s->cl;
    sluice__v1__snapshot__init(&s->snap);
    s->snap.n_clusters = 1;
    s->snap.clusters = s->cls;
}

static sl_endpoint_state_t *watch(uint16_t port)
{
    char err[256];
    sl_endpoint_state_t *ep =
        sl_endpoint_acquire("default/echo", "127.0.0.1", port, err, sizeof(err));
    assert_non_null(ep);
    return ep;
}

static hc_target_t *target_of(sl_health_t *hc, uint16_t port)
{
    return find_target(hc, target_key_hash("default/echo", "127.0.0.1", port), "default/echo",
                       "127.0.0.1", port);
}

/* ---- tests ---- */

static void test_request_format(void **state)
{
    (void)state;
    Sluice__V1__HealthCheck hc = SLUICE__V1__HEALTH_CHECK__INIT;
    char err[256];
    size_t len;
    hc.path = "/healthz?full=1";
    char *r = build_request(&hc, "10.0.0.1", 8080, 80, &len, err, sizeof(err));
    assert_non_null(r);
    assert_string_equal(r, "GET /healthz?full=1 HTTP/1.1\r\nHost: 10.0.0.1:8080\r\n"
                           "User-Agent: sluice-health-check\r\nConnection: close\r\n\r\n");
    assert_int_equal(len, strlen(r));
    free(r);

    hc.path = "";
    r = build_request(&hc, "::1", 80, 80, &len, err, sizeof(err));
    assert_non_null(r);
    assert_non_null(strstr(r, "GET / HTTP/1.1\r\nHost: [::1]\r\n"));
    free(r);

    hc.host = "api.internal";
    r = build_request(&hc, "10.0.0.1", 8080, 80, &len, err, sizeof(err));
    assert_non_null(r);
    assert_non_null(strstr(r, "\r\nHost: api.internal\r\n"));
    free(r);

    /* nothing that could split the request gets through */
    hc.host = "";
    hc.path = "/x\r\nX-Injected: 1";
    assert_null(build_request(&hc, "10.0.0.1", 80, 80, &len, err, sizeof(err)));
    assert_non_null(strstr(err, "health_check.path"));
    hc.path = "/a b";
    assert_null(build_request(&hc, "10.0.0.1", 80, 80, &len, err, sizeof(err)));
    hc.path = "healthz";
    assert_null(build_request(&hc, "10.0.0.1", 80, 80, &len, err, sizeof(err)));
    hc.path = "/";
    hc.host = "evil\r\nX: y";
    assert_null(build_request(&hc, "10.0.0.1", 80, 80, &len, err, sizeof(err)));
    assert_non_null(strstr(err, "health_check.host"));
}

static void test_unhealthy_after_n_failures_then_recovers(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    test_server_t srv;
    srv_start(&srv, base, 503);
    sl_endpoint_state_t *ep = watch(srv.port);
    snap_t s;
    snap_init(&s, &srv.port, 1);

    sl_health_t *hc = sl_health_new(base);
    assert_non_null(hc);
    sl_health_update(hc, &s.snap, NULL, NULL);
    assert_true(run_until(base, is_unhealthy, ep, 2000));
    /* exactly unhealthy_threshold checks */
    assert_int_equal(srv.requests, 3);
    char expect[256];
    snprintf(expect, sizeof(expect),
             "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:%u\r\nUser-Agent: sluice-health-check\r\n"
             "Connection: close\r\n\r\n",
             (unsigned)srv.port);
    assert_string_equal(srv.last_request, expect);

    /* back to 200: healthy after exactly healthy_threshold successes */
    srv.status = 200;
    int before = srv.requests;
    capture_start();
    int ok = run_until(base, is_healthy, ep, 2000);
    const char *log = capture_stop();
    assert_true(ok);
    assert_int_equal(srv.requests - before, 2);
    char line[256];
    snprintf(line, sizeof(line),
             "[notice] backend default/echo endpoint 127.0.0.1:%u: healthy (2 checks passed)",
             (unsigned)srv.port);
    assert_non_null(strstr(log, line));

    /* and it stays healthy while the server keeps answering */
    run_for(base, 150);
    assert_true(srv.requests - before >= 5);
    assert_int_equal(atomic_load(&ep->hc_healthy), 1);

    sl_health_free(hc);
    srv_stop(&srv);
    sl_endpoint_release(ep);
    event_base_free(base);
}

static void test_connect_refused_logs_reason(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    uint16_t port = closed_port();
    sl_endpoint_state_t *ep = watch(port);
    snap_t s;
    snap_init(&s, &port, 1);
    s.hc.unhealthy_threshold = 2;
    sl_health_t *hc = sl_health_new(base);
    capture_start();
    sl_health_update(hc, &s.snap, NULL, NULL);
    int ok = run_until(base, is_unhealthy, ep, 2000);
    const char *log = capture_stop();
    assert_true(ok);
    char line[256];
    snprintf(line, sizeof(line),
             "[notice] backend default/echo endpoint 127.0.0.1:%u: unhealthy (connect refused, 2 "
             "checks)",
             (unsigned)port);
    assert_non_null(strstr(log, line));
    sl_health_free(hc);
    /* the checker is gone: nobody checks it, so it counts as healthy */
    assert_int_equal(atomic_load(&ep->hc_healthy), 1);
    sl_endpoint_release(ep);
    event_base_free(base);
}

static void test_failure_kinds(void **state)
{
    (void)state;
    static const struct {
        enum srv_mode mode;
        int status;
        const char *reason;
    } cases[] = {
        {SRV_SILENT, 0, "(timeout waiting for the status line, 1 check)"},
        {SRV_CLOSE, 0, "(connection closed before the status line, 1 check)"},
        {SRV_GARBAGE, 0, "(bad status line, 1 check)"},
        {SRV_STATUS, 404, "(status 404, 1 check)"},
        {SRV_STATUS, 199, "(status 199, 1 check)"},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
        struct event_base *base = event_base_new();
        test_server_t srv;
        srv_start(&srv, base, cases[i].status);
        srv.mode = cases[i].mode;
        sl_endpoint_state_t *ep = watch(srv.port);
        snap_t s;
        snap_init(&s, &srv.port, 1);
        s.hc.unhealthy_threshold = 1;
        s.hc.timeout_ms = 60;
        sl_health_t *hc = sl_health_new(base);
        capture_start();
        sl_health_update(hc, &s.snap, NULL, NULL);
        int ok = run_until(base, is_unhealthy, ep, 2000);
        const char *log = capture_stop();
        assert_true(ok);
        if (strstr(log, cases[i].reason) == NULL)
            fail_msg("case %zu: expected %s in the log", i, cases[i].reason);
        sl_health_free(hc);
        srv_stop(&srv);
        sl_endpoint_release(ep);
        event_base_free(base);
    }
}

static void test_expected_status_range(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    test_server_t srv;
    srv_start(&srv, base, 302);
    sl_endpoint_state_t *ep = watch(srv.port);
    snap_t s;
    snap_init(&s, &srv.port, 1);
    s.hc.unhealthy_threshold = 1;
    s.hc.expected_status_min = 300;
    s.hc.expected_status_max = 399;
    sl_health_t *hc = sl_health_new(base);
    sl_health_update(hc, &s.snap, NULL, NULL);
    run_for(base, 150);
    assert_true(srv.requests >= 2);
    assert_int_equal(atomic_load(&ep->hc_healthy), 1);
    srv.status = 200; /* outside 300-399 */
    assert_true(run_until(base, is_unhealthy, ep, 1000));

    /* 0/0 means the default 200-399; max < min means exactly min */
    s.hc.expected_status_min = 0;
    s.hc.expected_status_max = 0;
    sl_health_update(hc, &s.snap, NULL, NULL);
    hc_target_t *t = target_of(hc, srv.port);
    assert_non_null(t);
    assert_int_equal(t->status_min, 200);
    assert_int_equal(t->status_max, 399);
    s.hc.expected_status_min = 204;
    s.hc.expected_status_max = 0;
    sl_health_update(hc, &s.snap, NULL, NULL);
    assert_int_equal(t->status_min, 204);
    assert_int_equal(t->status_max, 204);

    sl_health_free(hc);
    srv_stop(&srv);
    sl_endpoint_release(ep);
    event_base_free(base);
}

static void test_first_checks_are_spread_over_one_interval(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    enum { N = 20 };
    snap_t s;
    snap_init(&s, NULL, 0);
    s.hc.interval_ms = 1000;
    Sluice__V1__Endpoint eps[N];
    Sluice__V1__Endpoint *ptrs[N];
    for (int i = 0; i < N; i++) {
        sluice__v1__endpoint__init(&eps[i]);
        eps[i].address = "127.0.0.1";
        eps[i].port = (uint32_t)(1 + i);
        ptrs[i] = &eps[i];
    }
    s.cl.endpoints = ptrs;
    s.cl.n_endpoints = N;
    sl_health_t *hc = sl_health_new(base);
    struct timeval before, after;
    gettimeofday(&before, NULL);
    sl_health_update(hc, &s.snap, NULL, NULL);
    gettimeofday(&after, NULL);
    assert_int_equal(hc->count, N);
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (int i = 0; i < N; i++) {
        hc_target_t *t = target_of(hc, (uint16_t)(1 + i));
        assert_non_null(t);
        struct timeval when;
        assert_true(event_pending(t->timer, EV_TIMEOUT, &when));
        int64_t at_ms = (int64_t)when.tv_sec * 1000 + when.tv_usec / 1000;
        int64_t from = (int64_t)before.tv_sec * 1000 + before.tv_usec / 1000;
        int64_t to = (int64_t)after.tv_sec * 1000 + after.tv_usec / 1000;
        /* first check within one interval of the update */
        assert_true(at_ms >= from - 2);
        assert_true(at_ms <= to + 1000 + 2);
        lo = at_ms < lo ? at_ms : lo;
        hi = at_ms > hi ? at_ms : hi;
    }
    /* and not all at once: 20 uniform draws over 1 s span far more than
     * 300 ms (the odds otherwise are below 1e-8) */
    assert_true(hi - lo > 300);
    sl_health_free(hc);
    event_base_free(base);
}

static int failures_reached_2(void *t)
{
    return ((hc_target_t *)t)->failures == 2 && ((hc_target_t *)t)->phase == HC_IDLE;
}

static void test_update_keeps_state_of_unchanged_endpoints(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    test_server_t a, b;
    srv_start(&a, base, 503);
    srv_start(&b, base, 200);
    sl_endpoint_state_t *ep_a = watch(a.port);
    snap_t s1;
    snap_init(&s1, &a.port, 1);
    sl_health_t *hc = sl_health_new(base);
    sl_health_update(hc, &s1.snap, NULL, NULL);
    hc_target_t *ta = target_of(hc, a.port);
    assert_non_null(ta);
    assert_true(run_until(base, failures_reached_2, ta, 2000));
    assert_int_equal(a.requests, 2);
    struct event *timer = ta->timer;
    assert_true(event_pending(timer, EV_TIMEOUT, NULL));

    /* a new snapshot (fresh objects, same endpoint, plus b) */
    uint16_t ports[2] = {b.port, a.port};
    snap_t s2;
    snap_init(&s2, ports, 2);
    sl_health_update(hc, &s2.snap, NULL, NULL);
    assert_ptr_equal(target_of(hc, a.port), ta);
    assert_int_equal(ta->failures, 2);
    assert_ptr_equal(ta->timer, timer);
    assert_true(event_pending(timer, EV_TIMEOUT, NULL));
    assert_int_equal(hc->count, 2);

    /* the very next failure is the third in a row */
    assert_true(run_until(base, is_unhealthy, ep_a, 2000));
    assert_int_equal(a.requests, 3);
    assert_true(b.requests >= 1);
    assert_int_equal(atomic_load(&target_of(hc, b.port)->ep->hc_healthy), 1);

    /* an interval change keeps counters but reschedules within the new one */
    s2.hc.interval_ms = 20;
    sl_health_update(hc, &s2.snap, NULL, NULL);
    assert_ptr_equal(target_of(hc, a.port), ta);
    assert_int_equal(ta->interval_ms, 20);
    assert_int_equal(ta->healthy, 0);

    sl_health_free(hc);
    srv_stop(&a);
    srv_stop(&b);
    sl_endpoint_release(ep_a);
    event_base_free(base);
}

static void test_removal_stops_checks(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    test_server_t a, b;
    srv_start(&a, base, 503);
    srv_start(&b, base, 200);
    sl_endpoint_state_t *ep_a = watch(a.port);
    uint16_t ports[2] = {a.port, b.port};
    snap_t s;
    snap_init(&s, ports, 2);
    s.hc.unhealthy_threshold = 1;
    sl_health_t *hc = sl_health_new(base);
    sl_health_update(hc, &s.snap, NULL, NULL);
    assert_true(run_until(base, is_unhealthy, ep_a, 2000));
    assert_int_equal(atomic_load(&ep_a->refs), 2); /* ours + the checker's */

    /* a leaves the cluster */
    snap_t s2;
    snap_init(&s2, &b.port, 1);
    s2.hc.unhealthy_threshold = 1;
    sl_health_update(hc, &s2.snap, NULL, NULL);
    assert_null(target_of(hc, a.port));
    assert_int_equal(hc->count, 1);
    assert_int_equal(atomic_load(&ep_a->refs), 1);
    assert_int_equal(atomic_load(&ep_a->hc_healthy), 1);
    /* a connection the checker opened just before may still be accepted
     * (it sat in the listen backlog): let the server catch up first */
    run_for(base, 20);
    int seen_a = a.accepted, seen_b = b.requests;
    run_for(base, 150);
    assert_int_equal(a.accepted, seen_a);
    assert_true(b.requests > seen_b);

    /* the cluster loses its health check: b is no longer checked */
    s2.cl.health_check = NULL;
    sl_health_update(hc, &s2.snap, NULL, NULL);
    assert_int_equal(hc->count, 0);
    run_for(base, 20);
    seen_b = b.accepted;
    run_for(base, 100);
    assert_int_equal(b.accepted, seen_b);

    /* it comes back: checks start again, a new target */
    s2.cl.health_check = &s2.hc;
    sl_health_update(hc, &s2.snap, NULL, NULL);
    assert_int_equal(hc->count, 1);
    run_for(base, 100);
    assert_true(b.accepted > seen_b);

    /* an empty snapshot stops everything */
    sl_health_update(hc, NULL, NULL, NULL);
    assert_int_equal(hc->count, 0);

    sl_health_free(hc);
    srv_stop(&a);
    srv_stop(&b);
    sl_endpoint_release(ep_a);
    event_base_free(base);
}

static void test_unhealthy_endpoint_reset_when_check_removed(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    uint16_t port = closed_port();
    sl_endpoint_state_t *ep = watch(port);
    snap_t s;
    snap_init(&s, &port, 1);
    s.hc.unhealthy_threshold = 1;
    sl_health_t *hc = sl_health_new(base);
    sl_health_update(hc, &s.snap, NULL, NULL);
    assert_true(run_until(base, is_unhealthy, ep, 2000));
    s.cl.health_check = NULL;
    sl_health_update(hc, &s.snap, NULL, NULL);
    assert_int_equal(atomic_load(&ep->hc_healthy), 1);
    sl_health_free(hc);
    sl_endpoint_release(ep);
    event_base_free(base);
}

static void test_bad_config_is_refused(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    test_server_t srv;
    srv_start(&srv, base, 200);
    snap_t s;
    snap_init(&s, &srv.port, 1);
    sl_health_t *hc = sl_health_new(base);
    sl_health_update(hc, &s.snap, NULL, NULL);
    assert_int_equal(hc->count, 1);

    /* an injected header in the path disables this cluster's checks */
    s.hc.path = "/h HTTP/1.1\r\nX-Evil: 1\r\n\r\nGET /";
    capture_start();
    sl_health_update(hc, &s.snap, NULL, NULL);
    const char *log = capture_stop();
    assert_non_null(strstr(log, "backend default/echo: health_check.path must start with '/'"));
    assert_int_equal(hc->count, 0);
    run_for(base, 20);
    int seen = srv.accepted;
    run_for(base, 100);
    assert_int_equal(srv.accepted, seen);

    /* endpoints the checker cannot use are skipped, the others checked */
    s.hc.path = "/healthz";
    Sluice__V1__Endpoint bad = SLUICE__V1__ENDPOINT__INIT;
    bad.address = "name.invalid";
    bad.port = 80;
    Sluice__V1__Endpoint zero = SLUICE__V1__ENDPOINT__INIT;
    zero.address = "127.0.0.1";
    zero.port = 0;
    Sluice__V1__Endpoint big = SLUICE__V1__ENDPOINT__INIT;
    big.address = "127.0.0.1";
    big.port = 70000;
    Sluice__V1__Endpoint dup = s.ep[0];
    Sluice__V1__Endpoint *eps[] = {&bad, &zero, &big, &s.ep[0], &dup, NULL};
    s.cl.endpoints = eps;
    s.cl.n_endpoints = SL_ARRAY_LEN(eps);
    capture_start();
    sl_health_update(hc, &s.snap, NULL, NULL);
    log = capture_stop();
    assert_non_null(strstr(log, "endpoint name.invalid:80: name does not resolve"));
    assert_int_equal(hc->count, 1);
    run_for(base, 100);
    assert_true(srv.requests >= 1);

    /* defaults for fields left 0 */
    Sluice__V1__HealthCheck zeroes = SLUICE__V1__HEALTH_CHECK__INIT;
    s.cl.health_check = &zeroes;
    sl_health_update(hc, &s.snap, NULL, NULL);
    hc_target_t *t = target_of(hc, srv.port);
    assert_non_null(t);
    assert_int_equal(t->interval_ms, 5000);
    assert_int_equal(t->timeout_ms, 2000);
    assert_int_equal(t->healthy_threshold, 2);
    assert_int_equal(t->unhealthy_threshold, 3);
    assert_non_null(strstr(t->request, "GET / HTTP/1.1\r\n"));
    zeroes.interval_ms = 1;
    sl_health_update(hc, &s.snap, NULL, NULL);
    assert_int_equal(t->interval_ms, 10);

    sl_health_free(hc);
    srv_stop(&srv);
    event_base_free(base);
    assert_null(sl_health_new(NULL));
    sl_health_update(NULL, NULL, NULL, NULL);
    sl_health_free(NULL);
}

static int check_in_flight(void *t)
{
    return ((hc_target_t *)t)->phase == HC_READING;
}

/* The gRPC request is HealthCheckRequest{service} in one uncompressed gRPC
 * frame; the varint length takes two bytes from 128 on. */
static void test_grpc_request_encoding(void **state)
{
    (void)state;
    hc_target_t t;
    memset(&t, 0, sizeof(t));
    t.grpc_service = "pkg.Svc";
    assert_int_equal(build_grpc_request(&t), 0);
    static const uint8_t want[] = {0, 0, 0, 0, 9, 0x0a, 7, 'p', 'k', 'g', '.', 'S', 'v', 'c'};
    assert_int_equal(t.grpc_req_len, sizeof(want));
    assert_memory_equal(t.grpc_req, want, sizeof(want));
    free(t.grpc_req);

    t.grpc_service = "";
    assert_int_equal(build_grpc_request(&t), 0);
    static const uint8_t empty[] = {0, 0, 0, 0, 0};
    assert_int_equal(t.grpc_req_len, sizeof(empty));
    assert_memory_equal(t.grpc_req, empty, sizeof(empty));
    free(t.grpc_req);

    char long_name[301];
    memset(long_name, 'a', 300);
    long_name[300] = '\0';
    t.grpc_service = long_name;
    assert_int_equal(build_grpc_request(&t), 0);
    assert_int_equal(t.grpc_req_len, 5 + 1 + 2 + 300);
    assert_int_equal(t.grpc_req[3] << 8 | t.grpc_req[4], 303); /* big-endian */
    assert_int_equal(t.grpc_req[6], 0x80 | (300 & 0x7f));
    assert_int_equal(t.grpc_req[7], 300 >> 7);
    free(t.grpc_req);
}

static void test_grpc_response_parsing(void **state)
{
    (void)state;
    uint64_t st;
    assert_int_equal(parse_health_response((const uint8_t *)"\x08\x01", 2, &st), 0);
    assert_int_equal(st, 1);
    assert_int_equal(parse_health_response((const uint8_t *)"", 0, &st), 0);
    assert_int_equal(st, 0); /* proto3 default: UNKNOWN */
    /* Unknown fields of every wire type are skipped. */
    static const uint8_t extra[] = {0x12, 2,    'h', 'i', 0x19, 1, 2,    3,    4,    5,    6,   7,
                                    8,    0x25, 1,   2,   3,    4, 0x08, 0x02, 0x30, 0x96, 0x01};
    assert_int_equal(parse_health_response(extra, sizeof(extra), &st), 0);
    assert_int_equal(st, 2);
    /* Truncated varint, length past the end, field 0, wire type 3. */
    assert_int_equal(parse_health_response((const uint8_t *)"\x08", 1, &st), -1);
    assert_int_equal(parse_health_response((const uint8_t *)"\x08\x80", 2, &st), -1);
    static const uint8_t past_end[] = {0x12, 5, 'a', 'b'};
    assert_int_equal(parse_health_response(past_end, sizeof(past_end), &st), -1);
    assert_int_equal(parse_health_response((const uint8_t *)"\x00\x01", 2, &st), -1);
    assert_int_equal(parse_health_response((const uint8_t *)"\x0b", 1, &st), -1);
}

static void test_free_with_check_in_flight(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    test_server_t srv;
    srv_start(&srv, base, 0);
    srv.mode = SRV_SILENT;
    snap_t s;
    snap_init(&s, &srv.port, 1);
    s.hc.timeout_ms = 5000;
    sl_health_t *hc = sl_health_new(base);
    sl_health_update(hc, &s.snap, NULL, NULL);
    hc_target_t *t = target_of(hc, srv.port);
    assert_true(run_until(base, check_in_flight, t, 1000));
    assert_true(t->fd >= 0);
    int fd = t->fd;
    /* removal with a connection open closes it (ASan/LSan check the rest) */
    sl_health_update(hc, NULL, NULL, NULL);
    assert_int_equal(fcntl(fd, F_GETFD), -1);
    sl_health_update(hc, &s.snap, NULL, NULL);
    t = target_of(hc, srv.port);
    assert_true(run_until(base, check_in_flight, t, 1000));
    sl_health_free(hc);
    srv_stop(&srv);
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_format),
        cmocka_unit_test(test_unhealthy_after_n_failures_then_recovers),
        cmocka_unit_test(test_connect_refused_logs_reason),
        cmocka_unit_test(test_failure_kinds),
        cmocka_unit_test(test_expected_status_range),
        cmocka_unit_test(test_first_checks_are_spread_over_one_interval),
        cmocka_unit_test(test_update_keeps_state_of_unchanged_endpoints),
        cmocka_unit_test(test_removal_stops_checks),
        cmocka_unit_test(test_unhealthy_endpoint_reset_when_check_removed),
        cmocka_unit_test(test_bad_config_is_refused),
        cmocka_unit_test(test_free_with_check_in_flight),
        cmocka_unit_test(test_grpc_request_encoding),
        cmocka_unit_test(test_grpc_response_parsing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
