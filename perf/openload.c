/* perf/openload.c: an open-loop HTTP/1.1 load generator for the latency at
 * fixed rates section of perf/bench.sh (issue 15).
 *
 * Why: wrk and h2load over HTTP/1.1 are closed-loop. A connection cannot send
 * while its request is outstanding, so when the server stalls the client
 * stops sending too and the requests it "should" have sent are never timed
 * (coordinated omission). Here requests are SCHEDULED at a fixed rate from the
 * start (request i at t0 + i / rate), queued in order when no connection is
 * free, and each latency is measured from its scheduled send time, as wrk2
 * does: a stall shows up in every request scheduled during it.
 *
 * How: one thread, epoll over N keep-alive connections and a timerfd armed at
 * the next scheduled time (timer slack set to 1 ns). A connection the server
 * closes (Connection: close, or an idle close) is reopened; a failed one is
 * retried after 10 ms. Responses are parsed with Content-Length, chunked or
 * close-delimited bodies, which are counted and discarded.
 *
 * Output: one line of key=value pairs on stdout (bench.sh parses it), and with
 * --csv FILE one row per measured request: "index,scheduled_us,latency_us,status"
 * (status 0 = failed: connection error, timeout, or never sent). Exit 0 when
 * the run happened (errors are reported, not fatal), 2 on bad arguments.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define MAX_HEAD (64 * 1024)
#define RETRY_NS (10 * 1000000ull)

enum cstate { C_DOWN, C_CONNECTING, C_IDLE, C_BUSY };
enum rstate {
    R_HEAD,
    R_BODY_LEN,
    R_BODY_CLOSE,
    R_CHUNK_SIZE,
    R_CHUNK_DATA,
    R_CHUNK_CRLF,
    R_TRAILER
};

struct conn {
    int fd;
    enum cstate state;
    long req;         /* index of the request in flight, or -1 */
    size_t woff;      /* bytes of the request written */
    uint64_t sent_ns; /* when its first byte was written (timeouts) */
    uint64_t retry_at;
    /* response parser */
    enum rstate rs;
    char head[MAX_HEAD];
    size_t hlen;
    int status;
    int server_close; /* "Connection: close" in the response */
    uint64_t left;    /* body bytes (Content-Length or the chunk) still to come */
    int want_out;     /* EPOLLOUT registered */
};

struct opts {
    const char *host, *path, *method, *csv;
    int port, conns;
    double rate, duration, warmup, timeout;
    size_t body;
    char **headers;
    int nheaders;
};

static struct opts O = {
    .host = "127.0.0.1", .path = "/", .method = "GET", .conns = 10, .duration = 10, .timeout = 10};
static char *reqbuf;
static size_t reqlen;
static int ep;
static uint64_t t0;
static long total, first_measured;
static int64_t *lat_ns; /* per request: latency, or -1 (failed / never done) */
static int *status_of;
static long inflight, failed, non2xx, completed_measured;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t sched_ns(long i)
{
    return t0 + (uint64_t)((double)i * 1e9 / O.rate);
}

static void usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "openload: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr,
            "\nusage: openload --port PORT --rate REQ_PER_S [--host 127.0.0.1] [--path /]\n"
            "  [--connections 10] [--duration 10] [--warmup 0] [--timeout 10]\n"
            "  [--method GET] [--body-size BYTES] [--header 'Name: value']... [--csv FILE]\n");
    exit(2);
}

static double parse_num(const char *name, const char *s, double min)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < min) {
        char msg[160];
        snprintf(msg, sizeof msg, "--%s: '%%s' is not a number >= %g", name, min);
        usage_error(msg, s);
    }
    return v;
}

static void build_request(void)
{
    size_t cap = 512 + O.body + strlen(O.path) + strlen(O.host);
    for (int i = 0; i < O.nheaders; i++)
        cap += strlen(O.headers[i]) + 2;
    reqbuf = malloc(cap);
    if (!reqbuf)
        abort();
    int n = snprintf(reqbuf, cap, "%s %s HTTP/1.1\r\nHost: %s:%d\r\n", O.method, O.path, O.host,
                     O.port);
    for (int i = 0; i < O.nheaders; i++)
        n += snprintf(reqbuf + n, cap - n, "%s\r\n", O.headers[i]);
    if (O.body || strcmp(O.method, "GET") != 0)
        n += snprintf(reqbuf + n, cap - n,
                      "Content-Type: application/octet-stream\r\nContent-Length: %zu\r\n", O.body);
    n += snprintf(reqbuf + n, cap - n, "\r\n");
    memset(reqbuf + n, 'x', O.body);
    reqlen = (size_t)n + O.body;
}

static void set_events(struct conn *c, int out)
{
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.ptr = c};
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) == 0)
        c->want_out = out;
}

static void conn_open(struct conn *c)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)O.port)};
    inet_pton(AF_INET, O.host, &sa.sin_addr);
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        perror("openload: socket");
        exit(1);
    }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev) < 0) {
        perror("openload: epoll_ctl");
        exit(1);
    }
    c->want_out = 1;
    c->state = C_CONNECTING;
    if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
        c->state = C_IDLE;
        set_events(c, 0);
    } else if (errno != EINPROGRESS) {
        close(c->fd);
        c->fd = -1;
        c->state = C_DOWN;
        c->retry_at = now_ns() + RETRY_NS;
    }
}

/* Ends the connection; its request in flight (if any) fails. `again`: the
 * server closed an idle or finished connection, reopen now; else after 10 ms. */
static void conn_close(struct conn *c, int again)
{
    if (c->req >= 0) {
        failed++;
        inflight--;
        c->req = -1;
    }
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->state = C_DOWN;
    c->retry_at = again ? 0 : now_ns() + RETRY_NS;
}

static void request_done(struct conn *c)
{
    uint64_t now = now_ns();
    long i = c->req;
    if (i >= first_measured) {
        lat_ns[i - first_measured] = (int64_t)(now - sched_ns(i));
        status_of[i - first_measured] = c->status;
        completed_measured++;
        if (c->status < 200 || c->status > 299)
            non2xx++;
    }
    c->req = -1;
    inflight--;
    c->state = C_IDLE;
    if (c->server_close)
        conn_close(c, 1);
}

static void send_more(struct conn *c)
{
    while (c->woff < reqlen) {
        ssize_t n = send(c->fd, reqbuf + c->woff, reqlen - c->woff, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) {
                if (!c->want_out)
                    set_events(c, 1);
                return;
            }
            conn_close(c, 0);
            return;
        }
        c->woff += (size_t)n;
    }
    if (c->want_out)
        set_events(c, 0);
}

static void start_request(struct conn *c, long i)
{
    c->req = i;
    c->woff = 0;
    c->sent_ns = now_ns();
    c->rs = R_HEAD;
    c->hlen = 0;
    c->status = 0;
    c->server_close = 0;
    c->state = C_BUSY;
    inflight++;
    send_more(c);
}

/* Parses the response head in c->head[0..end): status and framing. */
static int parse_head(struct conn *c, size_t end)
{
    c->head[end - 1] = 0;
    if (strncmp(c->head, "HTTP/1.", 7) != 0 || end < 12)
        return -1;
    c->status = atoi(c->head + 9);
    int chunked = 0, have_len = 0;
    for (char *line = strstr(c->head, "\r\n"); line && line[2]; line = strstr(line + 2, "\r\n")) {
        char *h = line + 2;
        if (!strncasecmp(h, "content-length:", 15)) {
            c->left = strtoull(h + 15, NULL, 10);
            have_len = 1;
        } else if (!strncasecmp(h, "transfer-encoding:", 18)) {
            char *eol = strstr(h, "\r\n");
            char save = eol ? *eol : 0;
            if (eol)
                *eol = 0;
            if (strcasestr(h, "chunked"))
                chunked = 1;
            if (eol)
                *eol = save;
        } else if (!strncasecmp(h, "connection:", 11)) {
            char *eol = strstr(h, "\r\n");
            char save = eol ? *eol : 0;
            if (eol)
                *eol = 0;
            if (strcasestr(h, "close"))
                c->server_close = 1;
            if (eol)
                *eol = save;
        }
    }
    if (c->status == 204 || c->status == 304 || (c->status >= 100 && c->status < 200) ||
        !strcmp(O.method, "HEAD"))
        c->rs = R_BODY_LEN, c->left = 0;
    else if (chunked)
        c->rs = R_CHUNK_SIZE, c->hlen = 0;
    else if (have_len)
        c->rs = R_BODY_LEN;
    else
        c->rs = R_BODY_CLOSE, c->server_close = 1;
    return 0;
}

/* Feeds received bytes to the parser; returns 1 when the response is
 * complete, 0 for more, -1 on a malformed response. */
static int feed(struct conn *c, const char *p, size_t n)
{
    while (n > 0 || c->rs == R_BODY_LEN) {
        switch (c->rs) {
        case R_HEAD: {
            size_t take = n < MAX_HEAD - 1 - c->hlen ? n : MAX_HEAD - 1 - c->hlen;
            if (take == 0)
                return -1;
            memcpy(c->head + c->hlen, p, take);
            size_t from = c->hlen > 3 ? c->hlen - 3 : 0;
            c->hlen += take;
            c->head[c->hlen] = 0;
            char *e = strstr(c->head + from, "\r\n\r\n");
            if (!e) {
                p += take, n -= take;
                continue;
            }
            size_t end = (size_t)(e - c->head) + 4;
            size_t used = take - (c->hlen - end);
            p += used, n -= used;
            if (parse_head(c, end) < 0)
                return -1;
            if (c->status >= 100 && c->status < 200)
                c->rs = R_HEAD, c->hlen = 0; /* interim */
            continue;
        }
        case R_BODY_LEN: {
            if (n == 0 && c->left > 0)
                return 0;
            uint64_t take = n < c->left ? n : c->left;
            c->left -= take, p += take, n -= take;
            if (c->left == 0)
                return 1;
            continue;
        }
        case R_BODY_CLOSE:
            return 0;
        case R_CHUNK_SIZE:
        case R_TRAILER: {
            const char *nl = memchr(p, '\n', n);
            size_t take = nl ? (size_t)(nl - p) + 1 : n;
            if (c->hlen + take >= MAX_HEAD)
                return -1;
            memcpy(c->head + c->hlen, p, take);
            c->hlen += take;
            p += take, n -= take;
            if (!nl)
                continue;
            c->head[c->hlen] = 0;
            if (c->rs == R_TRAILER) {
                int empty = c->hlen <= 2;
                c->hlen = 0;
                if (empty)
                    return 1;
                continue;
            }
            char *end;
            c->left = strtoull(c->head, &end, 16);
            if (end == c->head)
                return -1;
            c->hlen = 0;
            c->rs = c->left ? R_CHUNK_DATA : R_TRAILER;
            continue;
        }
        case R_CHUNK_DATA: {
            uint64_t take = n < c->left ? n : c->left;
            c->left -= take, p += take, n -= take;
            if (c->left == 0)
                c->rs = R_CHUNK_CRLF, c->left = 2;
            continue;
        }
        case R_CHUNK_CRLF: {
            uint64_t take = n < c->left ? n : c->left;
            c->left -= take, p += take, n -= take;
            if (c->left == 0)
                c->rs = R_CHUNK_SIZE, c->hlen = 0;
            continue;
        }
        }
    }
    return 0;
}

static void on_readable(struct conn *c)
{
    char buf[65536];
    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof buf, 0);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                return;
            conn_close(c, 0);
            return;
        }
        if (n == 0) {
            if (c->state == C_BUSY && c->rs == R_BODY_CLOSE) {
                request_done(c); /* closes: server_close is set */
                return;
            }
            conn_close(c, c->state == C_IDLE); /* an idle close: reopen now */
            return;
        }
        if (c->state != C_BUSY) { /* bytes nobody asked for */
            conn_close(c, 0);
            return;
        }
        int r = feed(c, buf, (size_t)n);
        if (r < 0) {
            conn_close(c, 0);
            return;
        }
        if (r == 1) {
            request_done(c);
            return;
        }
    }
}

static void on_writable(struct conn *c)
{
    if (c->state == C_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) {
            conn_close(c, 0);
            return;
        }
        c->state = C_IDLE;
        set_events(c, 0);
    } else if (c->state == C_BUSY) {
        send_more(c);
    } else if (c->want_out) {
        set_events(c, 0);
    }
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static double pct(const int64_t *sorted, long n, double p)
{
    if (n == 0)
        return 0;
    long k = (long)ceil(p / 100.0 * (double)n) - 1;
    if (k < 0)
        k = 0;
    if (k >= n)
        k = n - 1;
    return (double)sorted[k] / 1000.0;
}

int main(int argc, char **argv)
{
    static struct option lo[] = {{"host", 1, 0, 'H'},
                                 {"port", 1, 0, 'p'},
                                 {"path", 1, 0, 'P'},
                                 {"rate", 1, 0, 'r'},
                                 {"connections", 1, 0, 'c'},
                                 {"duration", 1, 0, 'd'},
                                 {"warmup", 1, 0, 'w'},
                                 {"timeout", 1, 0, 't'},
                                 {"method", 1, 0, 'm'},
                                 {"body-size", 1, 0, 'b'},
                                 {"header", 1, 0, 'h'},
                                 {"csv", 1, 0, 'o'},
                                 {0, 0, 0, 0}};
    O.headers = calloc((size_t)argc, sizeof *O.headers);
    int opt;
    while ((opt = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (opt) {
        case 'H': {
            struct in_addr a;
            if (inet_pton(AF_INET, optarg, &a) != 1)
                usage_error("--host: '%s' is not an IPv4 address", optarg);
            O.host = optarg;
            break;
        }
        case 'p':
            O.port = (int)parse_num("port", optarg, 1);
            break;
        case 'P':
            if (optarg[0] != '/')
                usage_error("--path: '%s' must start with /", optarg);
            O.path = optarg;
            break;
        case 'r':
            O.rate = parse_num("rate", optarg, 0.001);
            break;
        case 'c':
            O.conns = (int)parse_num("connections", optarg, 1);
            break;
        case 'd':
            O.duration = parse_num("duration", optarg, 0.001);
            break;
        case 'w':
            O.warmup = parse_num("warmup", optarg, 0);
            break;
        case 't':
            O.timeout = parse_num("timeout", optarg, 0.001);
            break;
        case 'm':
            O.method = optarg;
            break;
        case 'b':
            O.body = (size_t)parse_num("body-size", optarg, 0);
            break;
        case 'h':
            if (!strchr(optarg, ':') || strpbrk(optarg, "\r\n"))
                usage_error("--header: '%s' must be 'Name: value' on one line", optarg);
            O.headers[O.nheaders++] = optarg;
            break;
        case 'o':
            O.csv = optarg;
            break;
        default:
            usage_error("unknown option%s", "");
        }
    }
    if (optind < argc)
        usage_error("unexpected argument '%s'", argv[optind]);
    if (O.port < 1 || O.port > 65535)
        usage_error("--port is required (1-65535)%s", "");
    if (O.rate <= 0)
        usage_error("--rate is required (requests per second, > 0)%s", "");
    if (O.body > 64u << 20)
        usage_error("--body-size: at most 64 MiB%s", "");
    double want = (O.warmup + O.duration) * O.rate;
    if (want > 100e6)
        usage_error("rate x (warmup + duration) above 100 million requests%s", "");
    total = (long)want;
    first_measured = (long)(O.warmup * O.rate);
    long measured = total - first_measured;
    if (measured < 1)
        usage_error("rate x duration is below one request%s", "");
    lat_ns = malloc((size_t)measured * sizeof *lat_ns);
    status_of = calloc((size_t)measured, sizeof *status_of);
    if (!lat_ns || !status_of)
        abort();
    for (long i = 0; i < measured; i++)
        lat_ns[i] = -1;

    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* wake at the scheduled time, not up to 50 µs later */
    build_request();
    ep = epoll_create1(EPOLL_CLOEXEC);
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    struct epoll_event tev = {.events = EPOLLIN, .data.ptr = NULL};
    if (ep < 0 || tfd < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &tev) < 0) {
        perror("openload: epoll/timerfd");
        return 1;
    }
    struct conn *cs = calloc((size_t)O.conns, sizeof *cs);
    if (!cs)
        abort();
    for (int i = 0; i < O.conns; i++) {
        cs[i].fd = -1;
        cs[i].req = -1;
        conn_open(&cs[i]);
    }
    /* Connections open before the clock starts (a wrk2 run does the same). */
    uint64_t open_deadline = now_ns() + 5000000000ull;
    for (;;) {
        int up = 0;
        for (int i = 0; i < O.conns; i++)
            up += cs[i].state == C_IDLE;
        if (up == O.conns || now_ns() > open_deadline)
            break;
        struct epoll_event evs[256];
        int n = epoll_wait(ep, evs, 256, 10);
        for (int k = 0; k < n; k++)
            if (evs[k].data.ptr)
                on_writable(evs[k].data.ptr);
        for (int i = 0; i < O.conns; i++)
            if (cs[i].state == C_DOWN && now_ns() >= cs[i].retry_at)
                conn_open(&cs[i]);
    }

    t0 = now_ns() + 1000000; /* 1 ms from now */
    uint64_t timeout_ns = (uint64_t)(O.timeout * 1e9);
    uint64_t deadline = sched_ns(total) + timeout_ns;
    long next_due = 0, next_send = 0;
    for (;;) {
        uint64_t now = now_ns();
        while (next_due < total && sched_ns(next_due) <= now)
            next_due++;
        for (int i = 0; i < O.conns; i++) {
            struct conn *c = &cs[i];
            if (c->state == C_DOWN && now >= c->retry_at)
                conn_open(c);
            if (c->state == C_IDLE && next_send < next_due)
                start_request(c, next_send++);
        }
        if (next_send == total && inflight == 0)
            break;
        if (now >= deadline)
            break;
        uint64_t wake = next_due < total ? sched_ns(next_due) : now + 10000000ull;
        for (int i = 0; i < O.conns; i++) { /* timeouts, retries */
            struct conn *c = &cs[i];
            if (c->state == C_BUSY && now > c->sent_ns && now - c->sent_ns >= timeout_ns)
                conn_close(c, 0);
            if (c->state == C_DOWN && c->retry_at && c->retry_at < wake)
                wake = c->retry_at;
        }
        if (wake > now + 10000000ull)
            wake = now + 10000000ull;
        if (wake <= now)
            wake = now + 1000;
        struct itimerspec its = {.it_value = {.tv_sec = (time_t)(wake / 1000000000ull),
                                              .tv_nsec = (long)(wake % 1000000000ull)}};
        timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
        struct epoll_event evs[256];
        int n = epoll_wait(ep, evs, 256, -1);
        for (int k = 0; k < n; k++) {
            struct conn *c = evs[k].data.ptr;
            if (!c) {
                uint64_t exp;
                if (read(tfd, &exp, sizeof exp) < 0) { /* nothing: spurious */
                }
                continue;
            }
            if (c->fd < 0)
                continue; /* closed by an earlier event of this batch */
            if (evs[k].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
                on_writable(c);
            if (c->fd >= 0 && (evs[k].events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
                on_readable(c);
        }
    }
    uint64_t end = now_ns();
    long unsent = total - next_send;

    FILE *csv = NULL;
    if (O.csv && !(csv = fopen(O.csv, "w"))) {
        fprintf(stderr, "openload: --csv %s: %s\n", O.csv, strerror(errno));
        return 1;
    }
    if (csv)
        fprintf(csv, "index,scheduled_us,latency_us,status\n");
    int64_t *sorted = malloc((size_t)measured * sizeof *sorted);
    if (!sorted)
        abort();
    long nok = 0;
    for (long i = 0; i < measured; i++) {
        if (csv)
            fprintf(csv, "%ld,%.1f,%.1f,%d\n", i,
                    (double)(sched_ns(i + first_measured) - t0) / 1000.0,
                    lat_ns[i] < 0 ? -1.0 : (double)lat_ns[i] / 1000.0,
                    lat_ns[i] < 0 ? 0 : status_of[i]);
        if (lat_ns[i] >= 0)
            sorted[nok++] = lat_ns[i];
    }
    if (csv && fclose(csv) != 0) {
        fprintf(stderr, "openload: --csv %s: %s\n", O.csv, strerror(errno));
        return 1;
    }
    qsort(sorted, (size_t)nok, sizeof *sorted, cmp_i64);
    long lost = measured - completed_measured; /* failed, timed out or never sent */
    double secs = (double)(end - sched_ns(first_measured)) / 1e9;
    printf("rate=%.1f connections=%d requests=%ld completed=%ld errors=%ld non2xx=%ld failed=%ld "
           "unsent=%ld achieved_rps=%.1f p50_us=%.1f p90_us=%.1f p99_us=%.1f p999_us=%.1f "
           "max_us=%.1f\n",
           O.rate, O.conns, measured, completed_measured, lost + non2xx, non2xx, failed, unsent,
           (double)completed_measured / (secs > 0 ? secs : 1), pct(sorted, nok, 50),
           pct(sorted, nok, 90), pct(sorted, nok, 99), pct(sorted, nok, 99.9),
           nok ? (double)sorted[nok - 1] / 1000.0 : 0.0);
    for (int i = 0; i < O.conns; i++)
        if (cs[i].fd >= 0)
            close(cs[i].fd);
    close(tfd);
    close(ep);
    free(cs);
    free(sorted);
    free(lat_ns);
    free(status_of);
    free(reqbuf);
    free(O.headers);
    return 0;
}
