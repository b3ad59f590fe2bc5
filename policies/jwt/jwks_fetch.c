/*
 * The remote JWKS fetcher (jwks_fetch.h): one thread per compiled jwt
 * policy with a jwksUri, blocking HTTP/1.1 GETs over a non-blocking socket
 * polled with a deadline and the wake-up pipe.
 */
#include "jwks_fetch.h"

#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/sha.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct sl_jwks_fetch {
    char uri[1024];
    char host[256];
    char port[8];
    char path[768];
    unsigned ttl_s;
    _Atomic(sl_jwks_t *) current;
    atomic_int started;
    atomic_int stop;
    _Atomic uint64_t refresh_asked_ms; /* 0 = never */
    int wake[2];                       /* [0] the fetcher polls, [1] anyone writes */
    pthread_t thread;
    int thread_running;
    /* fetcher thread only: */
    sl_jwks_t *retired;
    unsigned char digest[SHA256_DIGEST_LENGTH];
    int have_digest;
};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Splits an http:// URI; 0 or -1 with err. */
static int split_uri(const char *uri, char *host, size_t hcap, char *port, size_t pcap, char *path,
                     size_t pathcap, char *err, size_t errlen)
{
    if (strncasecmp(uri, "http://", 7) != 0) {
        snprintf(err, errlen, "an http:// URL (https is not supported yet: serve the JWKS "
                              "on a trusted network or through a local proxy)");
        return -1;
    }
    const char *h = uri + 7;
    const char *slash = strchr(h, '/');
    size_t hostport = slash ? (size_t)(slash - h) : strlen(h);
    const char *p = slash ? slash : "/";
    if (strlen(p) >= pathcap || strpbrk(p, " \t\r\n#")) {
        snprintf(err, errlen, "the path is longer than %zu characters or has spaces", pathcap - 1);
        return -1;
    }
    const char *colon = memchr(h, ':', hostport);
    if (h[0] == '[') { /* [v6]:port */
        const char *close = memchr(h, ']', hostport);
        if (!close) {
            snprintf(err, errlen, "an unterminated [IPv6] host");
            return -1;
        }
        colon = close + 1 < h + hostport && close[1] == ':' ? close + 1 : NULL;
        size_t hl = (size_t)(close - h - 1);
        if (hl == 0 || hl >= hcap) {
            snprintf(err, errlen, "a host of 1 to %zu characters", hcap - 1);
            return -1;
        }
        memcpy(host, h + 1, hl);
        host[hl] = '\0';
    } else {
        size_t hl = colon ? (size_t)(colon - h) : hostport;
        if (hl == 0 || hl >= hcap || memchr(h, '@', hl)) {
            snprintf(err, errlen, "a host of 1 to %zu characters (no user info)", hcap - 1);
            return -1;
        }
        memcpy(host, h, hl);
        host[hl] = '\0';
    }
    if (colon) {
        size_t pl = (size_t)(h + hostport - colon - 1);
        char tmp[8] = "";
        if (pl == 0 || pl >= sizeof(tmp)) {
            snprintf(err, errlen, "a port of 1 to 65535");
            return -1;
        }
        memcpy(tmp, colon + 1, pl);
        char *end;
        long v = strtol(tmp, &end, 10);
        if (*end || v < 1 || v > 65535) {
            snprintf(err, errlen, "a port of 1 to 65535");
            return -1;
        }
        snprintf(port, pcap, "%ld", v);
    } else {
        snprintf(port, pcap, "80");
    }
    snprintf(path, pathcap, "%s", p);
    return 0;
}

int sl_jwks_uri_check(const char *uri, char *err, size_t errlen)
{
    char host[256], port[8], path[768];
    if (strlen(uri) >= 1024) {
        snprintf(err, errlen, "at most 1023 characters");
        return -1;
    }
    return split_uri(uri, host, sizeof(host), port, sizeof(port), path, sizeof(path), err,
                     errlen);
}

sl_jwks_fetch_t *sl_jwks_fetch_new(const char *uri, unsigned ttl_s)
{
    sl_jwks_fetch_t *f = calloc(1, sizeof(*f));
    char err[160];
    if (!f)
        return NULL;
    snprintf(f->uri, sizeof(f->uri), "%s", uri);
    if (split_uri(uri, f->host, sizeof(f->host), f->port, sizeof(f->port), f->path,
                  sizeof(f->path), err, sizeof(err)) != 0 ||
        pipe2(f->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        free(f);
        return NULL;
    }
    f->ttl_s = ttl_s;
    return f;
}

const sl_jwks_t *sl_jwks_fetch_current(const sl_jwks_fetch_t *f)
{
    return atomic_load_explicit(&((sl_jwks_fetch_t *)f)->current, memory_order_acquire);
}

static void wake(sl_jwks_fetch_t *f, char why)
{
    ssize_t w = write(f->wake[1], &why, 1);
    (void)w; /* a full pipe already holds a wake-up */
}

void sl_jwks_fetch_refresh(sl_jwks_fetch_t *f)
{
    uint64_t now = mono_ms();
    uint64_t last = atomic_load(&f->refresh_asked_ms);
    if (last && now - last < SL_JWKS_REFRESH_MIN_MS)
        return;
    if (atomic_compare_exchange_strong(&f->refresh_asked_ms, &last, now))
        wake(f, 'r');
}

/* Drains the pipe; 1 when asked to stop. */
static int drain(sl_jwks_fetch_t *f)
{
    char buf[64];
    while (read(f->wake[0], buf, sizeof(buf)) > 0)
        ;
    return atomic_load(&f->stop);
}

/* Waits for fd to be ready for events before deadline; 1 ready, 0 timed
 * out or stopping. */
static int wait_fd(sl_jwks_fetch_t *f, int fd, short events, uint64_t deadline)
{
    for (;;) {
        uint64_t now = mono_ms();
        if (now >= deadline || atomic_load(&f->stop))
            return 0;
        struct pollfd p[2] = {{fd, events, 0}, {f->wake[0], POLLIN, 0}};
        int n = poll(p, 2, (int)(deadline - now));
        if (n < 0 && errno != EINTR)
            return 0;
        if (n > 0 && p[1].revents && drain(f))
            return 0;
        if (n > 0 && p[0].revents)
            return 1;
    }
}

long sl_jwks_http_body(char *buf, size_t len, char **body, char *err, size_t errlen)
{
    char *end = memmem(buf, len, "\r\n\r\n", 4);
    if (!end) {
        snprintf(err, errlen, "no complete response head");
        return -1;
    }
    int status = 0;
    if (len < 12 || strncmp(buf, "HTTP/1.", 7) != 0 || sscanf(buf + 8, " %3d", &status) != 1) {
        snprintf(err, errlen, "not an HTTP/1.x response");
        return -1;
    }
    if (status != 200) {
        snprintf(err, errlen, "status %d", status);
        return -1;
    }
    long clen = -1;
    int chunked = 0;
    for (char *line = memchr(buf, '\n', (size_t)(end - buf)); line && line < end;
         line = memchr(line, '\n', (size_t)(end - line))) {
        line++;
        if (strncasecmp(line, "content-length:", 15) == 0)
            clen = strtol(line + 15, NULL, 10);
        else if (strncasecmp(line, "transfer-encoding:", 18) == 0)
            chunked = 1; /* we asked for nothing else than identity or chunked */
    }
    char *b = end + 4;
    size_t avail = len - (size_t)(b - buf);
    if (chunked) {
        /* Decode in place: the output never overtakes the input. */
        char *in = b, *out = b, *stop = b + avail;
        for (;;) {
            char *eol = memmem(in, (size_t)(stop - in), "\r\n", 2);
            if (!eol) {
                snprintf(err, errlen, "truncated chunked body");
                return -1;
            }
            char *hexend;
            unsigned long n = strtoul(in, &hexend, 16);
            if (hexend == in || n > SL_JWKS_MAX_DOCUMENT || (size_t)(stop - eol - 2) < n + 2) {
                snprintf(err, errlen, "bad or truncated chunk");
                return -1;
            }
            if (n == 0)
                break;
            memmove(out, eol + 2, n);
            out += n;
            in = eol + 2 + n + 2;
        }
        *body = b;
        return (long)(out - b);
    }
    if (clen >= 0) {
        if ((size_t)clen > avail) {
            snprintf(err, errlen, "truncated body (%zu of %ld bytes)", avail, clen);
            return -1;
        }
        avail = (size_t)clen;
    }
    *body = b;
    return (long)avail;
}

/* GETs the document into a fresh buffer (caller frees); its length in
 * *len, or NULL with err. */
static char *http_get(sl_jwks_fetch_t *f, size_t *len, char *err, size_t errlen)
{
    uint64_t deadline = mono_ms() + SL_JWKS_FETCH_TIMEOUT_MS;
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(f->host, f->port, &hints, &ai);
    if (gai != 0) {
        snprintf(err, errlen, "cannot resolve %.100s: %s", f->host, gai_strerror(gai));
        return NULL;
    }
    int fd = -1;
    snprintf(err, errlen, "cannot connect");
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
            break;
        if (errno == EINPROGRESS && wait_fd(f, fd, POLLOUT, deadline) &&
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
            break;
        snprintf(err, errlen, "cannot connect to %.100s:%s: %s", f->host, f->port,
                 soerr ? strerror(soerr) : "timed out");
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return NULL;
    char req[1200];
    int rl = snprintf(req, sizeof(req),
                      "GET %s HTTP/1.1\r\nHost: %s%s%s\r\nAccept: application/json\r\n"
                      "User-Agent: sluice-jwt\r\nConnection: close\r\n\r\n",
                      f->path, f->host, strcmp(f->port, "80") ? ":" : "",
                      strcmp(f->port, "80") ? f->port : "");
    size_t sent = 0;
    while (sent < (size_t)rl) {
        ssize_t w = send(fd, req + sent, (size_t)rl - sent, MSG_NOSIGNAL);
        if (w > 0) {
            sent += (size_t)w;
        } else if (w < 0 && errno == EAGAIN && wait_fd(f, fd, POLLOUT, deadline)) {
        } else {
            snprintf(err, errlen, "send failed");
            close(fd);
            return NULL;
        }
    }
    size_t cap = 16384, got = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        if (got == cap) {
            if (cap >= SL_JWKS_MAX_DOCUMENT + 16384) {
                snprintf(err, errlen, "the response is larger than %d bytes",
                         SL_JWKS_MAX_DOCUMENT);
                goto fail;
            }
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb)
                goto fail;
            buf = nb;
            cap *= 2;
        }
        ssize_t r = recv(fd, buf + got, cap - got, 0);
        if (r > 0) {
            got += (size_t)r;
        } else if (r == 0) {
            break;
        } else if (errno == EAGAIN || errno == EINTR) {
            if (!wait_fd(f, fd, POLLIN, deadline)) {
                snprintf(err, errlen, "timed out reading the response");
                goto fail;
            }
        } else {
            snprintf(err, errlen, "read failed: %s", strerror(errno));
            goto fail;
        }
    }
    close(fd);
    if (!buf)
        snprintf(err, errlen, "out of memory");
    else
        buf[got] = '\0';
    *len = got;
    return buf;
fail:
    close(fd);
    free(buf);
    return NULL;
}

/* One fetch: publishes a changed set. 0 when the keys are good (new or
 * unchanged), -1 otherwise (logged; the old set stays). */
static int fetch_once(sl_jwks_fetch_t *f)
{
    char err[256];
    size_t len = 0;
    char *buf = http_get(f, &len, err, sizeof(err));
    char *body = NULL;
    long blen = buf ? sl_jwks_http_body(buf, len, &body, err, sizeof(err)) : -1;
    if (blen < 0) {
        if (!atomic_load(&f->stop))
            sl_log_warn("jwt: JWKS %s: %s (%s)", f->uri, err,
                        sl_jwks_fetch_current(f) ? "the previous keys stay in use"
                                                 : "tokens with unknown keys get 503");
        free(buf);
        return -1;
    }
    unsigned char digest[SHA256_DIGEST_LENGTH];
    SHA256((unsigned char *)body, (size_t)blen, digest);
    if (f->have_digest && memcmp(digest, f->digest, sizeof(digest)) == 0) {
        free(buf);
        return 0;
    }
    json_error_t jerr;
    json_t *doc = json_loadb(body, (size_t)blen, JSON_REJECT_DUPLICATES, &jerr);
    free(buf);
    sl_jwks_t *set = NULL;
    if (!doc)
        snprintf(err, sizeof(err), "not JSON: %s (line %d)", jerr.text, jerr.line);
    else
        set = sl_jwks_parse(doc, 0, 0, err, sizeof(err));
    json_decref(doc);
    if (!set) {
        sl_log_warn("jwt: JWKS %s: %s (%s)", f->uri, err,
                    sl_jwks_fetch_current(f) ? "the previous keys stay in use"
                                             : "tokens with unknown keys get 503");
        return -1;
    }
    memcpy(f->digest, digest, sizeof(digest));
    f->have_digest = 1;
    sl_jwks_t *old = atomic_exchange_explicit(&f->current, set, memory_order_acq_rel);
    if (old) {
        old->retired_next = f->retired;
        f->retired = old;
    }
    sl_log_info("jwt: JWKS %s: %zu signature keys", f->uri, set->n);
    return 0;
}

static void *run(void *arg)
{
    sl_jwks_fetch_t *f = arg;
    while (!atomic_load(&f->stop)) {
        int ok = fetch_once(f) == 0;
        uint64_t wait_ms = ok ? (uint64_t)f->ttl_s * 1000 : SL_JWKS_RETRY_MS;
        if (!ok && wait_ms > (uint64_t)f->ttl_s * 1000)
            wait_ms = (uint64_t)f->ttl_s * 1000;
        struct pollfd p = {f->wake[0], POLLIN, 0};
        int n;
        do
            n = poll(&p, 1, (int)wait_ms);
        while (n < 0 && errno == EINTR);
        if (n > 0 && drain(f))
            break;
    }
    return NULL;
}

void sl_jwks_fetch_start(sl_jwks_fetch_t *f)
{
    int expected = 0;
    if (atomic_load_explicit(&f->started, memory_order_relaxed) ||
        !atomic_compare_exchange_strong(&f->started, &expected, 1))
        return;
    if (pthread_create(&f->thread, NULL, run, f) != 0) {
        sl_log_error("jwt: JWKS %s: cannot start the fetcher thread", f->uri);
        return;
    }
    f->thread_running = 1;
}

void sl_jwks_fetch_free(sl_jwks_fetch_t *f)
{
    if (!f)
        return;
    atomic_store(&f->stop, 1);
    wake(f, 's');
    if (f->thread_running)
        pthread_join(f->thread, NULL);
    close(f->wake[0]);
    close(f->wake[1]);
    sl_jwks_free(atomic_load(&f->current));
    while (f->retired) {
        sl_jwks_t *next = f->retired->retired_next;
        sl_jwks_free(f->retired);
        f->retired = next;
    }
    free(f);
}
