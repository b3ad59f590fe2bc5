/*
 * The remote JWKS fetcher (jwks_fetch.h): one thread per compiled jwt
 * policy with a jwksUri, blocking HTTP/1.1 GETs (over TLS for https://)
 * on a non-blocking socket polled with a deadline and the wake-up pipe.
 */
#include "jwks_fetch.h"

#include "hostport.h"
#include "log.h"
#include "tls_pem.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
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
    int tls;       /* https:// */
    char *ca_pem;  /* jwksCaBundle, or NULL */
    char *ca_file; /* jwksCaFile, or NULL; neither = the system's CAs */
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

/* An http:// or https:// URI in its parts (hostport.h); 0 or -1 with err. */
static int split_uri(const char *uri, int *tls, char *host, size_t hcap, char *port, size_t pcap,
                     char *path, size_t pathcap, char *err, size_t errlen)
{
    const char *why = NULL;
    if (sl_url_split(uri, tls, host, hcap, port, pcap, path, pathcap, &why) == 0)
        return 0;
    snprintf(err, errlen, "%s", why);
    return -1;
}

int sl_jwks_uri_check(const char *uri, int *tls, char *err, size_t errlen)
{
    char host[256], port[8], path[768];
    int t = 0;
    if (strlen(uri) >= 1024) {
        snprintf(err, errlen, "at most 1023 characters");
        return -1;
    }
    int rc =
        split_uri(uri, &t, host, sizeof(host), port, sizeof(port), path, sizeof(path), err, errlen);
    if (tls)
        *tls = t;
    return rc;
}

/* The reason of OpenSSL's latest error, for a log line. */
static const char *ssl_reason(void)
{
    unsigned long e = ERR_peek_last_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    return r ? r : "unknown error";
}

int sl_jwks_ca_pem_check(const char *pem, char *err, size_t errlen)
{
    return sl_pem_ca_load(NULL, pem, err, errlen) > 0 ? 0 : -1;
}

sl_jwks_fetch_t *sl_jwks_fetch_new(const char *uri, unsigned ttl_s, const char *ca_pem,
                                   const char *ca_file)
{
    sl_jwks_fetch_t *f = calloc(1, sizeof(*f));
    char err[160];
    if (!f)
        return NULL;
    f->wake[0] = f->wake[1] = -1;
    snprintf(f->uri, sizeof(f->uri), "%s", uri);
    if (split_uri(uri, &f->tls, f->host, sizeof(f->host), f->port, sizeof(f->port), f->path,
                  sizeof(f->path), err, sizeof(err)) != 0 ||
        (ca_pem && !(f->ca_pem = strdup(ca_pem))) || (ca_file && !(f->ca_file = strdup(ca_file))) ||
        pipe2(f->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        free(f->ca_pem);
        free(f->ca_file);
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

long sl_jwks_http_body(char *buf, size_t len, int clean_end, char **body, char *err, size_t errlen)
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
    } else if (!clean_end) {
        snprintf(err, errlen,
                 "the response has no Content-Length and the TLS connection ended "
                 "without close_notify: it may be truncated");
        return -1;
    }
    *body = b;
    return (long)avail;
}

/* One connection to the JWKS server: a socket, and its TLS session for
 * https://. */
typedef struct {
    sl_jwks_fetch_t *f;
    int fd;
    SSL_CTX *ctx;
    SSL *ssl;
    uint64_t deadline;
} conn_t;

static void conn_close(conn_t *c)
{
    SSL_free(c->ssl);
    SSL_CTX_free(c->ctx);
    if (c->fd >= 0)
        close(c->fd);
    c->ssl = NULL;
    c->ctx = NULL;
    c->fd = -1;
}

/* Waits for what the TLS session asked for (ret: SSL_connect/read/write's
 * result). 1 to retry, 0 when the session failed or the deadline passed. */
static int tls_wait(conn_t *c, int ret)
{
    switch (SSL_get_error(c->ssl, ret)) {
    case SSL_ERROR_WANT_READ:
        return wait_fd(c->f, c->fd, POLLIN, c->deadline);
    case SSL_ERROR_WANT_WRITE:
        return wait_fd(c->f, c->fd, POLLOUT, c->deadline);
    default:
        return 0;
    }
}

/*
 * The TLS context of one fetch: verification against jwksCaBundle,
 * jwksCaFile or the system's CAs. Made for every fetch (every
 * jwksCacheSeconds, at most every few seconds) so that a CA file rotated
 * on disk, or the system store, is picked up without a reload; loading a
 * store costs milliseconds in this thread, never in a worker.
 */
static SSL_CTX *tls_ctx(sl_jwks_fetch_t *f, char *err, size_t errlen)
{
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        snprintf(err, errlen, "out of memory for TLS");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION);
    static const unsigned char alpn[] = "\x08http/1.1";
    SSL_CTX_set_alpn_protos(ctx, alpn, sizeof(alpn) - 1);
    char why[200];
    if (f->ca_pem) {
        if (sl_pem_ca_load(SSL_CTX_get_cert_store(ctx), f->ca_pem, why, sizeof(why)) <= 0) {
            snprintf(err, errlen, "jwksCaBundle: %s", why);
            goto fail;
        }
    } else if (f->ca_file) {
        if (SSL_CTX_load_verify_locations(ctx, f->ca_file, NULL) != 1) {
            snprintf(err, errlen,
                     "jwksCaFile %.120s: %.60s (a readable PEM file of CA "
                     "certificates)",
                     f->ca_file, ssl_reason());
            goto fail;
        }
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        snprintf(err, errlen, "the system's CA certificates could not be loaded: %s", ssl_reason());
        goto fail;
    }
    ERR_clear_error();
    return ctx;
fail:
    ERR_clear_error();
    SSL_CTX_free(ctx);
    return NULL;
}

/* The TLS handshake on c->fd: SNI (for a name, RFC 6066 forbids it for an
 * address) and the name or address the certificate must carry. 0, or -1
 * with err saying why ("certificate verify failed: ..."). */
static int tls_connect(conn_t *c, char *err, size_t errlen)
{
    sl_jwks_fetch_t *f = c->f;
    if (!(c->ctx = tls_ctx(f, err, errlen)))
        return -1;
    if (!(c->ssl = SSL_new(c->ctx)) || SSL_set_fd(c->ssl, c->fd) != 1) {
        snprintf(err, errlen, "out of memory for TLS");
        return -1;
    }
    unsigned char addr[16];
    int is_ip = inet_pton(AF_INET, f->host, addr) == 1 || inet_pton(AF_INET6, f->host, addr) == 1;
    X509_VERIFY_PARAM *param = SSL_get0_param(c->ssl);
    X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    if ((is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, f->host)
               : X509_VERIFY_PARAM_set1_host(param, f->host, 0)) != 1 ||
        (!is_ip && SSL_set_tlsext_host_name(c->ssl, f->host) != 1)) {
        snprintf(err, errlen, "cannot set the name to verify: %s", ssl_reason());
        return -1;
    }
    ERR_clear_error();
    for (;;) {
        int r = SSL_connect(c->ssl);
        if (r == 1)
            return 0;
        if (tls_wait(c, r))
            continue;
        long vr = SSL_get_verify_result(c->ssl);
        if (vr != X509_V_OK)
            snprintf(err, errlen,
                     "certificate verify failed: %s (the server's certificate "
                     "must chain to %s and name %.100s)",
                     X509_verify_cert_error_string(vr),
                     f->ca_pem    ? "jwksCaBundle"
                     : f->ca_file ? "jwksCaFile"
                                  : "a system CA",
                     f->host);
        else if (mono_ms() >= c->deadline)
            snprintf(err, errlen, "timed out in the TLS handshake");
        else if (ERR_peek_last_error())
            snprintf(err, errlen, "TLS handshake failed: %s", ssl_reason());
        else
            snprintf(err, errlen, "TLS handshake failed: the connection was closed");
        ERR_clear_error();
        return -1;
    }
}

/* Writes all of buf; 0 or -1. */
static int conn_write(conn_t *c, const char *buf, size_t len)
{
    size_t sent = 0;
    while (sent < len) {
        if (c->ssl) {
            int w = SSL_write(c->ssl, buf + sent, (int)(len - sent));
            if (w > 0)
                sent += (size_t)w;
            else if (!tls_wait(c, w))
                return -1;
            continue;
        }
        ssize_t w = send(c->fd, buf + sent, len - sent, MSG_NOSIGNAL);
        if (w > 0)
            sent += (size_t)w;
        else if (!(w < 0 && (errno == EAGAIN || errno == EINTR) &&
                   wait_fd(c->f, c->fd, POLLOUT, c->deadline)))
            return -1;
    }
    return 0;
}

/* Reads up to cap bytes: the count, 0 at the end (*clean: the peer said
 * so, TLS close_notify or a plain FIN), -1 with err. */
static long conn_read(conn_t *c, char *buf, size_t cap, int *clean, char *err, size_t errlen)
{
    for (;;) {
        if (c->ssl) {
            ERR_clear_error();
            int r = SSL_read(c->ssl, buf, (int)cap);
            if (r > 0)
                return r;
            int e = SSL_get_error(c->ssl, r);
            if (e == SSL_ERROR_ZERO_RETURN) {
                *clean = 1;
                return 0;
            }
            if (e == SSL_ERROR_SSL &&
                ERR_GET_REASON(ERR_peek_last_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
                /* Many servers close without close_notify: the body's own
                 * framing must then say it is complete. */
                ERR_clear_error();
                *clean = 0;
                return 0;
            }
            if (tls_wait(c, r))
                continue;
            if (mono_ms() >= c->deadline)
                snprintf(err, errlen, "timed out reading the response");
            else
                snprintf(err, errlen, "TLS read failed: %s", ssl_reason());
            ERR_clear_error();
            return -1;
        }
        ssize_t r = recv(c->fd, buf, cap, 0);
        if (r >= 0) {
            *clean = 1;
            return r;
        }
        if (errno != EAGAIN && errno != EINTR) {
            snprintf(err, errlen, "read failed: %s", strerror(errno));
            return -1;
        }
        if (!wait_fd(c->f, c->fd, POLLIN, c->deadline)) {
            snprintf(err, errlen, "timed out reading the response");
            return -1;
        }
    }
}

/* GETs the document into a fresh buffer (caller frees); its length in
 * *len, and in *clean_end whether the server ended it cleanly (see
 * sl_jwks_http_body), or NULL with err. */
static char *http_get(sl_jwks_fetch_t *f, size_t *len, int *clean_end, char *err, size_t errlen)
{
    conn_t c = {f, -1, NULL, NULL, mono_ms() + SL_JWKS_FETCH_TIMEOUT_MS};
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(f->host, f->port, &hints, &ai);
    if (gai != 0) {
        snprintf(err, errlen, "cannot resolve %.100s: %s", f->host, gai_strerror(gai));
        return NULL;
    }
    snprintf(err, errlen, "cannot connect");
    for (struct addrinfo *a = ai; a && c.fd < 0; a = a->ai_next) {
        c.fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (c.fd < 0)
            continue;
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        if (connect(c.fd, a->ai_addr, a->ai_addrlen) == 0)
            break;
        if (errno == EINPROGRESS && wait_fd(f, c.fd, POLLOUT, c.deadline) &&
            getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
            break;
        snprintf(err, errlen, "cannot connect to %.100s:%s: %s", f->host, f->port,
                 soerr ? strerror(soerr) : "timed out");
        close(c.fd);
        c.fd = -1;
    }
    freeaddrinfo(ai);
    if (c.fd < 0)
        return NULL;
    if (f->tls && tls_connect(&c, err, errlen) != 0) {
        conn_close(&c);
        return NULL;
    }
    char req[1200];
    int dflt = strcmp(f->port, f->tls ? "443" : "80") == 0;
    int v6 = strchr(f->host, ':') != NULL;
    int rl = snprintf(req, sizeof(req),
                      "GET %s HTTP/1.1\r\nHost: %s%s%s%s%s\r\nAccept: application/json\r\n"
                      "User-Agent: sluice-jwt\r\nConnection: close\r\n\r\n",
                      f->path, v6 ? "[" : "", f->host, v6 ? "]" : "", dflt ? "" : ":",
                      dflt ? "" : f->port);
    if (conn_write(&c, req, (size_t)rl) != 0) {
        snprintf(err, errlen, "send failed");
        conn_close(&c);
        return NULL;
    }
    size_t cap = 16384, got = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        if (got == cap) {
            if (cap >= SL_JWKS_MAX_DOCUMENT + 16384) {
                snprintf(err, errlen, "the response is larger than %d bytes", SL_JWKS_MAX_DOCUMENT);
                goto fail;
            }
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb)
                goto fail;
            buf = nb;
            cap *= 2;
        }
        long r = conn_read(&c, buf + got, cap - got, clean_end, err, errlen);
        if (r < 0)
            goto fail;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    conn_close(&c);
    if (!buf)
        snprintf(err, errlen, "out of memory");
    else
        buf[got] = '\0';
    *len = got;
    return buf;
fail:
    conn_close(&c);
    free(buf);
    return NULL;
}

/* One fetch: publishes a changed set. 0 when the keys are good (new or
 * unchanged), -1 otherwise (logged; the old set stays). */
static int fetch_once(sl_jwks_fetch_t *f)
{
    char err[256];
    size_t len = 0;
    int clean_end = 1;
    char *buf = http_get(f, &len, &clean_end, err, sizeof(err));
    char *body = NULL;
    long blen = buf ? sl_jwks_http_body(buf, len, clean_end, &body, err, sizeof(err)) : -1;
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
    free(f->ca_pem);
    free(f->ca_file);
    sl_jwks_free(atomic_load(&f->current));
    while (f->retired) {
        sl_jwks_t *next = f->retired->retired_next;
        sl_jwks_free(f->retired);
        f->retired = next;
    }
    free(f);
}
