/*
 * common/httpc.c against a loopback server this test runs: response
 * framing (Content-Length, chunked with extensions, the end of the
 * connection), statuses, truncated and malformed bodies, keep-alive and
 * a kept connection the server closed, refused connections, timeouts and
 * cancellation; streamed bodies (sl_httpc_stream). TLS is exercised by the integration tests of its
 * two users (test_policy_jwt.py, test_traffic_log.py).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "httpc.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* The server: answers the requests it reads, in order, with replies[i];
 * after a reply whose `close` is set it closes the connection; a NULL
 * text means "read the request and never answer". */
typedef struct {
    const char *text;
    int close;
    int slow; /* written a few bytes at a time, as a watch streams */
} reply_t;

static struct {
    int listen_fd;
    int port;
    const reply_t *replies;
    size_t n, next;
    int connections;
    pthread_t thread;
} srv;

static void *serve(void *arg)
{
    (void)arg;
    for (;;) {
        int fd = accept(srv.listen_fd, NULL, NULL);
        if (fd < 0)
            return NULL;
        srv.connections++;
        char buf[4096];
        size_t have = 0;
        for (;;) {
            char *end = have ? memmem(buf, have, "\r\n\r\n", 4) : NULL;
            if (!end) {
                ssize_t r = read(fd, buf + have, sizeof(buf) - have);
                if (r <= 0)
                    break;
                have += (size_t)r;
                continue;
            }
            size_t used = (size_t)(end - buf) + 4;
            memmove(buf, buf + used, have - used);
            have -= used;
            if (srv.next >= srv.n)
                break;
            const reply_t *rp = &srv.replies[srv.next++];
            if (!rp->text) {
                usleep(500000); /* the client gives up first */
                break;
            }
            size_t tl = strlen(rp->text);
            for (size_t off = 0; off < tl;) {
                size_t n = rp->slow ? (tl - off < 7 ? tl - off : 7) : tl - off;
                ssize_t w = write(fd, rp->text + off, n);
                if (w <= 0)
                    break;
                off += (size_t)w;
                if (rp->slow)
                    usleep(2000);
            }
            if (rp->close)
                break;
        }
        close(fd);
    }
}

static void serve_start(const reply_t *replies, size_t n)
{
    srv.listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(srv.listen_fd, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t al = sizeof(a);
    getsockname(srv.listen_fd, (struct sockaddr *)&a, &al);
    srv.port = ntohs(a.sin_port);
    assert_int_equal(listen(srv.listen_fd, 8), 0);
    srv.replies = replies;
    srv.n = n;
    srv.next = 0;
    srv.connections = 0;
    pthread_create(&srv.thread, NULL, serve, NULL);
}

static void serve_stop(void)
{
    shutdown(srv.listen_fd, SHUT_RDWR);
    close(srv.listen_fd);
    pthread_join(srv.thread, NULL);
}

static void client(sl_httpc_t *c)
{
    char url[64];
    const char *why = NULL;
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/x", srv.port);
    assert_int_equal(sl_httpc_init(c, url, &why), 0);
}

static int get(sl_httpc_t *c, const char **body, size_t *len)
{
    return sl_httpc_request(c, "GET", "/x", NULL, NULL, 0, 2000, body, len);
}

static void test_framing_and_keep_alive(void **state)
{
    (void)state;
    static const reply_t r[] = {
        {"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", 0, 0},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: "
         "chunked\r\n\r\n3\r\nhel\r\n2;x=y\r\nlo\r\n0\r\n\r\n",
         0, 0},
        {"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found", 0, 0},
        {"HTTP/1.1 204 No Content\r\n\r\n", 0, 0},
        {"HTTP/1.0 200 OK\r\n\r\n{}", 1, 0}, /* ends with the connection */
    };
    serve_start(r, 5);
    sl_httpc_t c;
    client(&c);
    const char *body;
    size_t len;
    assert_int_equal(get(&c, &body, &len), 200);
    assert_int_equal(len, 5);
    assert_memory_equal(body, "hello", 5);
    assert_int_equal(get(&c, &body, &len), 200);
    assert_int_equal(len, 5);
    assert_memory_equal(body, "hello", 5);
    assert_int_equal(get(&c, &body, &len), 404);
    assert_string_equal(body, "not found");
    assert_int_equal(get(&c, &body, &len), 204);
    assert_int_equal(len, 0);
    assert_int_equal(get(&c, &body, &len), 200);
    assert_int_equal(len, 2);
    assert_memory_equal(body, "{}", 2);
    /* All five on one connection. */
    assert_int_equal(srv.connections, 1);
    sl_httpc_free(&c);
    serve_stop();
}

static void test_kept_connection_closed_by_the_server(void **state)
{
    (void)state;
    static const reply_t r[] = {
        {"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na", 1, 0}, /* then closes */
        {"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb", 0, 0},
    };
    serve_start(r, 2);
    sl_httpc_t c;
    client(&c);
    const char *body;
    size_t len;
    assert_int_equal(get(&c, &body, &len), 200);
    usleep(50000); /* the close arrives while the client keeps the connection */
    assert_int_equal(get(&c, &body, &len), 200);
    assert_memory_equal(body, "b", 1);
    assert_int_equal(srv.connections, 2);
    sl_httpc_free(&c);
    serve_stop();
}

static void test_truncated_and_malformed(void **state)
{
    (void)state;
    static const reply_t r[] = {
        {"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nshort", 1, 0},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n", 1, 0},
        {"SMTP ready\r\n\r\n", 1, 0},
    };
    serve_start(r, 3);
    sl_httpc_t c;
    client(&c);
    const char *body;
    size_t len;
    assert_int_equal(get(&c, &body, &len), 0);
    assert_non_null(strstr(c.why, "closed the connection mid-response"));
    assert_int_equal(get(&c, &body, &len), 0);
    assert_non_null(strstr(c.why, "bad chunked body"));
    assert_int_equal(get(&c, &body, &len), 0);
    assert_non_null(strstr(c.why, "not an HTTP/1.x response"));
    sl_httpc_free(&c);
    serve_stop();
}

static int cancel_now(void *arg)
{
    (void)arg;
    return 1;
}

static void test_refused_timeout_and_cancel(void **state)
{
    (void)state;
    static const reply_t r[] = {{NULL, 0, 0}, {NULL, 0, 0}};
    serve_start(r, 2);
    sl_httpc_t c;
    client(&c);
    const char *body;
    size_t len;
    assert_int_equal(sl_httpc_request(&c, "GET", "/x", NULL, NULL, 0, 200, &body, &len), 0);
    assert_non_null(strstr(c.why, "receive from 127.0.0.1:"));
    assert_non_null(strstr(c.why, "timed out"));
    /* A readable cancel descriptor whose hook says stop ends the wait. */
    int p[2];
    assert_int_equal(pipe(p), 0);
    assert_int_equal(write(p[1], "s", 1), 1);
    c.cancel_fd = p[0];
    c.cancelled = cancel_now;
    assert_int_equal(sl_httpc_request(&c, "GET", "/x", NULL, NULL, 0, 2000, &body, &len), 0);
    assert_non_null(strstr(c.why, "cancelled"));
    close(p[0]);
    close(p[1]);
    sl_httpc_free(&c);
    int port = srv.port;
    serve_stop();
    /* Nothing listens there now. */
    char url[64];
    const char *why;
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/x", port);
    assert_int_equal(sl_httpc_init(&c, url, &why), 0);
    assert_int_equal(get(&c, &body, &len), 0);
    assert_non_null(strstr(c.why, "connect to 127.0.0.1:"));
    assert_non_null(strstr(c.why, "Connection refused"));
    sl_httpc_free(&c);
    assert_int_equal(sl_httpc_init(&c, "ftp://x/", &why), -1);
}

/* A server that takes the connection and never answers the TLS handshake
 * (seen in CI from an API server): the client gives up at its connect
 * timeout, not at the request's much longer one, so its caller's retry
 * opens another connection soon. */
static void test_handshake_never_answered(void **state)
{
    (void)state;
    static const reply_t r[] = {{NULL, 0, 0}};
    serve_start(r, 1);
    sl_httpc_t c;
    char url[64];
    const char *why = NULL, *body;
    size_t len;
    snprintf(url, sizeof(url), "https://127.0.0.1:%d/x", srv.port);
    assert_int_equal(sl_httpc_init(&c, url, &why), 0);
    c.connect_timeout_ms = 300;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(sl_httpc_request(&c, "GET", "/x", NULL, NULL, 0, 20000, &body, &len), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    assert_non_null(strstr(c.why, "timed out in the handshake"));
    assert_true(ms >= 250 && ms < 10000);
    sl_httpc_free(&c);
    serve_stop();
}

typedef struct {
    char got[4096];
    size_t len;
    int pieces;
    size_t stop_after; /* stop once this much arrived (0 = never) */
} sink_t;

static int sink(void *arg, const char *data, size_t len)
{
    sink_t *s = arg;
    assert_true(s->len + len < sizeof(s->got));
    memcpy(s->got + s->len, data, len);
    s->len += len;
    s->pieces++;
    return s->stop_after && s->len >= s->stop_after;
}

static void test_stream(void **state)
{
    (void)state;
    static const reply_t r[] = {
        /* chunked, arriving a few bytes at a time, with an extension and a trailer */
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
         "d\r\n{\"type\":\"A\"}\n\r\ne;ext=1\r\n{\"type\":\"BB\"}\n\r\n0\r\nX-T: 1\r\n\r\n",
         0, 1},
        /* not a 2xx: read whole, no callback */
        {"HTTP/1.1 410 Gone\r\nContent-Length: 7\r\n\r\nexpired", 0, 0},
        /* Content-Length */
        {"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nabcdef", 0, 1},
        /* the callback stops reading */
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n3\r\ndef\r\n", 0, 0},
        /* the connection drops mid-body */
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", 1, 0},
    };
    serve_start(r, 5);
    sl_httpc_t c;
    client(&c);
    const char *body;
    size_t len;
    sink_t s = {0};
    assert_int_equal(sl_httpc_stream(&c, "GET", "/w", NULL, 2000, 2000, sink, &s, &body, &len),
                     200);
    assert_int_equal(s.len, 13 + 14);
    assert_memory_equal(s.got, "{\"type\":\"A\"}\n{\"type\":\"BB\"}\n", 27);
    assert_true(s.pieces > 2); /* handed over as it arrived */
    memset(&s, 0, sizeof(s));
    assert_int_equal(sl_httpc_stream(&c, "GET", "/w", NULL, 2000, 2000, sink, &s, &body, &len),
                     410);
    assert_int_equal(s.pieces, 0);
    assert_int_equal(len, 7);
    assert_memory_equal(body, "expired", 7);
    assert_int_equal(sl_httpc_stream(&c, "GET", "/w", NULL, 2000, 2000, sink, &s, &body, &len),
                     200);
    assert_int_equal(s.len, 6);
    assert_memory_equal(s.got, "abcdef", 6);
    /* Three on one kept connection. */
    assert_int_equal(srv.connections, 1);
    memset(&s, 0, sizeof(s));
    s.stop_after = 3;
    assert_int_equal(sl_httpc_stream(&c, "GET", "/w", NULL, 2000, 2000, sink, &s, &body, &len),
                     200);
    assert_int_equal(s.len, 3);
    memset(&s, 0, sizeof(s));
    assert_int_equal(sl_httpc_stream(&c, "GET", "/w", NULL, 2000, 2000, sink, &s, &body, &len), 0);
    assert_non_null(strstr(c.why, "closed the connection mid-response"));
    assert_int_equal(s.len, 3); /* what came before the drop was handed over */
    sl_httpc_free(&c);
    serve_stop();
}

static void test_stream_idle_timeout(void **state)
{
    (void)state;
    /* The head, one chunk, then nothing while the server waits. */
    static const reply_t r[] = {
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n", 0, 0},
        {NULL, 0, 0},
    };
    serve_start(r, 2);
    sl_httpc_t c;
    client(&c);
    const char *body;
    size_t len;
    sink_t s = {0};
    assert_int_equal(sl_httpc_stream(&c, "GET", "/w", NULL, 2000, 150, sink, &s, &body, &len), 0);
    assert_non_null(strstr(c.why, "timed out"));
    assert_int_equal(s.len, 2);
    sl_httpc_free(&c);
    serve_stop();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_framing_and_keep_alive),
        cmocka_unit_test(test_kept_connection_closed_by_the_server),
        cmocka_unit_test(test_truncated_and_malformed),
        cmocka_unit_test(test_refused_timeout_and_cancel),
        cmocka_unit_test(test_handshake_never_answered),
        cmocka_unit_test(test_stream),
        cmocka_unit_test(test_stream_idle_timeout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
