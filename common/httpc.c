/*
 * The blocking HTTP/1.1 client of background threads (httpc.h).
 */
#include "httpc.h"

#include "hostport.h"
#include "tls_pem.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_MAX_RESPONSE (64u * 1024 * 1024)

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int set(const char *s)
{
    return s && *s;
}

int sl_httpc_init(sl_httpc_t *c, const char *url, const char **why)
{
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    c->cancel_fd = -1;
    if (sl_url_split(url, &c->tls, c->host, sizeof(c->host), c->port, sizeof(c->port), c->path,
                     sizeof(c->path), why) != 0)
        return -1;
    unsigned char addr[16];
    c->host_ip = inet_pton(AF_INET, c->host, addr) == 1 || inet_pton(AF_INET6, c->host, addr) == 1;
    return 0;
}

/* Waits for events on fd until the deadline: 0 ready, -1 timed out or
 * cancelled (c->wait_err says which). */
static int wait_fd(sl_httpc_t *c, short events, uint64_t deadline)
{
    for (;;) {
        uint64_t now = now_ms();
        if (now >= deadline) {
            c->wait_err = "timed out";
            return -1;
        }
        struct pollfd p[2] = {{c->fd, events, 0}, {c->cancel_fd, POLLIN, 0}};
        int n = poll(p, c->cancel_fd >= 0 ? 2 : 1, (int)(deadline - now));
        if (n < 0 && errno != EINTR) {
            c->wait_err = "poll failed";
            return -1;
        }
        if (n > 0 && c->cancel_fd >= 0 && p[1].revents && c->cancelled &&
            c->cancelled(c->cancel_arg)) {
            c->wait_err = "cancelled";
            return -1;
        }
        if (n > 0 && p[0].revents)
            return 0;
    }
}

static const char *ssl_reason(void)
{
    unsigned long e = ERR_peek_last_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    return r ? r : "unknown error";
}

void sl_httpc_close(sl_httpc_t *c)
{
    if (c->ssl) {
        /* A quiet close: a close_notify if the socket takes it now, and
         * nobody waits for the peer's. */
        SSL_shutdown(c->ssl);
        SSL_free(c->ssl);
        c->ssl = NULL;
    }
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    ERR_clear_error();
}

void sl_httpc_free(sl_httpc_t *c)
{
    sl_httpc_close(c);
    SSL_CTX_free(c->ctx);
    c->ctx = NULL;
    free(c->buf);
    c->buf = NULL;
    c->len = c->cap = 0;
}

/* A client certificate chain (leaf first) and its key into ctx: 0, or -1
 * with why naming `name`. Not tls_pem.c's checks: those are a listener's
 * (a client certificate names a user, "system:sluice", not a host). */
static int load_client_cert(SSL_CTX *ctx, const char *cert_pem, const char *key_pem,
                            const char *name, char *why, size_t whylen)
{
    if (!name)
        name = "client certificate";
    ERR_clear_error();
    BIO *b = BIO_new_mem_buf(cert_pem, -1);
    X509 *leaf = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
    int ok = leaf && SSL_CTX_use_certificate(ctx, leaf) == 1;
    X509_free(leaf);
    if (!ok) {
        snprintf(why, whylen, "%s: no PEM certificate could be read (%s)", name, ssl_reason());
        BIO_free(b);
        ERR_clear_error();
        return -1;
    }
    X509 *more;
    while (ok && (more = PEM_read_bio_X509(b, NULL, NULL, NULL)))
        if (SSL_CTX_add0_chain_cert(ctx, more) != 1) {
            X509_free(more);
            ok = 0;
        }
    BIO_free(b);
    ERR_clear_error();
    b = BIO_new_mem_buf(key_pem ? key_pem : "", -1);
    EVP_PKEY *key = b ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    if (!ok || !key || SSL_CTX_use_PrivateKey(ctx, key) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
        snprintf(why, whylen, "%s: %s", name,
                 !ok    ? "a certificate after the first cannot be used"
                 : !key ? "its key is not an unencrypted PEM private key"
                        : "the key does not match the certificate");
        EVP_PKEY_free(key);
        ERR_clear_error();
        return -1;
    }
    EVP_PKEY_free(key);
    return 0;
}

int sl_httpc_check_client_cert(const char *cert_pem, const char *key_pem, const char *name,
                               char *why, size_t whylen)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        snprintf(why, whylen, "out of memory for TLS");
        return -1;
    }
    int rc = load_client_cert(ctx, cert_pem, key_pem, name, why, whylen);
    SSL_CTX_free(ctx);
    return rc;
}

/* The TLS context: TLS >= 1.2, the peer verified against the bundle, the
 * file or the system's CAs. Made at the first connection and again after
 * a failed handshake, so a CA file fixed on disk is picked up. */
static int tls_ctx(sl_httpc_t *c)
{
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        snprintf(c->why, sizeof(c->why), "out of memory for TLS");
        return -1;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_mode(ctx, SSL_MODE_AUTO_RETRY);
    static const unsigned char alpn[] = "\x08http/1.1";
    SSL_CTX_set_alpn_protos(ctx, alpn, sizeof(alpn) - 1);
    char why[200];
    if (set(c->ca_pem)) {
        if (sl_pem_ca_load(SSL_CTX_get_cert_store(ctx), c->ca_pem, why, sizeof(why)) <= 0) {
            snprintf(c->why, sizeof(c->why), "%s: %s", c->ca_pem_name, why);
            goto fail;
        }
    } else if (set(c->ca_file)) {
        /* Opened here first: OpenSSL's own error for a missing file is
         * "system lib". */
        FILE *f = fopen(c->ca_file, "re");
        const char *reason = f ? NULL : strerror(errno);
        if (f)
            fclose(f);
        if (reason || SSL_CTX_load_verify_locations(ctx, c->ca_file, NULL) != 1) {
            snprintf(c->why, sizeof(c->why),
                     "%s %.200s cannot be used: %s (a readable PEM file of CA certificates)",
                     c->ca_file_name, c->ca_file, reason ? reason : ssl_reason());
            goto fail;
        }
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        snprintf(c->why, sizeof(c->why), "the system's CA certificates could not be loaded: %s",
                 ssl_reason());
        goto fail;
    }
    if (set(c->cert_pem) &&
        load_client_cert(ctx, c->cert_pem, c->key_pem, c->cert_name, c->why, sizeof(c->why)) != 0)
        goto fail;
    ERR_clear_error();
    c->ctx = ctx;
    return 0;
fail:
    ERR_clear_error();
    SSL_CTX_free(ctx);
    return -1;
}

/* Waits for what the last SSL call wants: 0 to call it again, -1 when it
 * failed for good, timed out or was cancelled. */
static int tls_wait(sl_httpc_t *c, int r, uint64_t deadline)
{
    switch (SSL_get_error(c->ssl, r)) {
    case SSL_ERROR_WANT_READ:
        return wait_fd(c, POLLIN, deadline);
    case SSL_ERROR_WANT_WRITE:
        return wait_fd(c, POLLOUT, deadline);
    default:
        c->wait_err = NULL;
        return -1;
    }
}

/* The handshake: SNI for a name only (RFC 6066), the name or address the
 * certificate must carry. */
static int tls_connect(sl_httpc_t *c, uint64_t deadline)
{
    if (!c->ctx && tls_ctx(c) != 0)
        return -1;
    if (!(c->ssl = SSL_new(c->ctx)) || SSL_set_fd(c->ssl, c->fd) != 1) {
        snprintf(c->why, sizeof(c->why), "out of memory for TLS");
        return -1;
    }
    X509_VERIFY_PARAM *param = SSL_get0_param(c->ssl);
    X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    if ((c->host_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, c->host)
                    : X509_VERIFY_PARAM_set1_host(param, c->host, 0)) != 1 ||
        (!c->host_ip && SSL_set_tlsext_host_name(c->ssl, c->host) != 1)) {
        snprintf(c->why, sizeof(c->why), "cannot set the name to verify: %s", ssl_reason());
        return -1;
    }
    ERR_clear_error();
    for (;;) {
        int r = SSL_connect(c->ssl);
        if (r == 1)
            return 0;
        if (tls_wait(c, r, deadline) == 0)
            continue;
        long vr = SSL_get_verify_result(c->ssl);
        if (vr != X509_V_OK)
            snprintf(c->why, sizeof(c->why),
                     "TLS to %s:%s: certificate verify failed: %s (the server's certificate must "
                     "chain to %s and name %s)",
                     c->host, c->port, X509_verify_cert_error_string(vr),
                     set(c->ca_pem)    ? c->ca_pem_name
                     : set(c->ca_file) ? c->ca_file_name
                                       : "a system CA",
                     c->host);
        else if (c->wait_err)
            snprintf(c->why, sizeof(c->why), "TLS to %s:%s: %s in the handshake", c->host, c->port,
                     c->wait_err);
        else if (ERR_peek_last_error())
            snprintf(c->why, sizeof(c->why), "TLS to %s:%s: handshake failed: %s", c->host, c->port,
                     ssl_reason());
        else
            snprintf(c->why, sizeof(c->why),
                     "TLS to %s:%s: handshake failed: the connection was closed", c->host, c->port);
        ERR_clear_error();
        SSL_CTX_free(c->ctx);
        c->ctx = NULL;
        return -1;
    }
}

static int conn_open(sl_httpc_t *c, uint64_t deadline)
{
    uint64_t open_by = now_ms() + (c->connect_timeout_ms ? c->connect_timeout_ms : 10000);
    if (deadline > open_by)
        deadline = open_by;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(c->host, c->port, &hints, &res);
    if (rc != 0) {
        snprintf(c->why, sizeof(c->why), "cannot resolve %s: %s", c->host, gai_strerror(rc));
        return -1;
    }
    for (struct addrinfo *a = res; a && c->fd < 0; a = a->ai_next) {
        c->fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (c->fd < 0)
            continue;
        if (connect(c->fd, a->ai_addr, a->ai_addrlen) == 0)
            break;
        int err = errno;
        if (err == EINPROGRESS) {
            if (wait_fd(c, POLLOUT, deadline) != 0) {
                err = 0; /* c->wait_err says why */
            } else {
                socklen_t sl = sizeof(err);
                getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &sl);
                if (err == 0)
                    break;
            }
        }
        snprintf(c->why, sizeof(c->why), "connect to %s:%s: %s", c->host, c->port,
                 err ? strerror(err) : c->wait_err);
        close(c->fd);
        c->fd = -1;
    }
    freeaddrinfo(res);
    if (c->fd < 0)
        return -1;
    /* A request goes as a head and a body: without NODELAY the body's last
     * segment waits for the ACK of the head, which the server delays (up to
     * 40 ms on Linux). */
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &(int){1}, sizeof(int));
    if (c->tls && tls_connect(c, deadline) != 0) {
        sl_httpc_close(c);
        return -1;
    }
    return 0;
}

static int send_all(sl_httpc_t *c, const char *p, size_t len, uint64_t deadline)
{
    while (len && c->ssl) {
        ERR_clear_error();
        int w = SSL_write(c->ssl, p, (int)(len > 1u << 30 ? 1u << 30 : len));
        if (w > 0) {
            p += w;
            len -= (size_t)w;
            continue;
        }
        if (tls_wait(c, w, deadline) == 0)
            continue;
        snprintf(c->why, sizeof(c->why), "send to %s:%s: %s", c->host, c->port,
                 c->wait_err             ? c->wait_err
                 : ERR_peek_last_error() ? ssl_reason()
                                         : "the connection was closed");
        ERR_clear_error();
        return -1;
    }
    while (len) {
        ssize_t w = send(c->fd, p, len, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            len -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_fd(c, POLLOUT, deadline) == 0)
                continue;
            snprintf(c->why, sizeof(c->why), "send to %s:%s: %s", c->host, c->port, c->wait_err);
            return -1;
        }
        snprintf(c->why, sizeof(c->why), "send to %s:%s: %s", c->host, c->port, strerror(errno));
        return -1;
    }
    return 0;
}

/* Reads more into the buffer: 1 read, 0 the end (c->clean_eof says
 * whether announced), -1 with c->why. */
static int recv_more(sl_httpc_t *c, uint64_t deadline)
{
    size_t max = c->max_response ? c->max_response : DEFAULT_MAX_RESPONSE;
    for (;;) {
        if (c->cap - c->len < 16384) {
            if (c->len >= max) {
                snprintf(c->why, sizeof(c->why), "the response from %s:%s is larger than %zu bytes",
                         c->host, c->port, max);
                return -1;
            }
            size_t cap = c->cap ? c->cap * 2 : 65536;
            char *d = realloc(c->buf, cap);
            if (!d) {
                snprintf(c->why, sizeof(c->why), "out of memory");
                return -1;
            }
            c->buf = d;
            c->cap = cap;
        }
        if (c->ssl) {
            ERR_clear_error();
            int r = SSL_read(c->ssl, c->buf + c->len, (int)(c->cap - c->len - 1));
            if (r > 0) {
                c->len += (size_t)r;
                c->buf[c->len] = '\0';
                return 1;
            }
            int e = SSL_get_error(c->ssl, r);
            if (e == SSL_ERROR_ZERO_RETURN) {
                c->clean_eof = 1;
                return 0;
            }
            if ((e == SSL_ERROR_SSL &&
                 ERR_GET_REASON(ERR_peek_last_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING) ||
                (e == SSL_ERROR_SYSCALL && ERR_peek_last_error() == 0 && errno == 0)) {
                /* An end without close_notify: the response's own framing
                 * must say it was complete. */
                ERR_clear_error();
                c->clean_eof = 0;
                return 0;
            }
            if (tls_wait(c, r, deadline) == 0)
                continue;
            snprintf(c->why, sizeof(c->why), "receive from %s:%s: %s", c->host, c->port,
                     c->wait_err             ? c->wait_err
                     : ERR_peek_last_error() ? ssl_reason()
                                             : strerror(errno));
            ERR_clear_error();
            return -1;
        }
        ssize_t r = recv(c->fd, c->buf + c->len, c->cap - c->len - 1, 0);
        if (r > 0) {
            c->len += (size_t)r;
            c->buf[c->len] = '\0';
            return 1;
        }
        if (r == 0) {
            c->clean_eof = 1;
            return 0;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (wait_fd(c, POLLIN, deadline) == 0)
                continue;
            snprintf(c->why, sizeof(c->why), "receive from %s:%s: %s", c->host, c->port,
                     c->wait_err);
            return -1;
        }
        snprintf(c->why, sizeof(c->why), "receive from %s:%s: %s", c->host, c->port,
                 strerror(errno));
        return -1;
    }
}

/* Whether p[0..len) holds a whole chunked body: 1, 0 not yet, -1 malformed. */
static int chunked_complete(const char *p, size_t len)
{
    size_t in = 0;
    for (;;) {
        const char *eol = memmem(p + in, len - in, "\r\n", 2);
        if (!eol)
            return 0;
        char *end;
        unsigned long sz = strtoul(p + in, &end, 16);
        if (end == p + in)
            return -1;
        size_t data = (size_t)(eol - p) + 2;
        if (sz == 0) /* the last chunk, then trailers and an empty line */
            return memmem(p + data - 2, len - (data - 2), "\r\n\r\n", 4) ? 1 : 0;
        if (sz > len || len - data < sz + 2)
            return 0;
        if (memcmp(p + data + sz, "\r\n", 2) != 0)
            return -1;
        in = data + sz + 2;
    }
}

/* Moves the payload of a whole chunked body down over its framing; the
 * payload's length. */
static size_t dechunk(char *p, size_t len)
{
    size_t in = 0, out = 0;
    for (;;) {
        char *eol = memmem(p + in, len - in, "\r\n", 2);
        unsigned long sz = strtoul(p + in, NULL, 16);
        size_t data = (size_t)(eol - p) + 2;
        if (sz == 0)
            return out;
        memmove(p + out, p + data, sz);
        out += sz;
        in = data + sz + 2;
    }
}

/* What the head of a response says about its body. */
typedef struct {
    int status;
    size_t hlen; /* bytes of the head in c->buf */
    int chunked, close_after;
    long clen; /* -1 = none */
} head_t;

/* Sends a request and reads the head of its response (a kept connection the
 * server had closed is tried once more on a new one). 0 with *h, or -1 with
 * c->why (the connection closed). */
static int send_and_head(sl_httpc_t *c, const char *method, const char *target, const char *headers,
                         const char *body, size_t blen, uint64_t timeout_ms, head_t *h)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        uint64_t deadline = now_ms() + timeout_ms;
        int reused = c->fd >= 0;
        if (!reused && conn_open(c, deadline) != 0)
            return -1;
        char head[2048 + 4096], length[48] = "";
        if (body)
            snprintf(length, sizeof(length), "Content-Length: %zu\r\n", blen);
        int v6 = strchr(c->host, ':') != NULL;
        int dflt = strcmp(c->port, c->tls ? "443" : "80") == 0;
        int hl = snprintf(head, sizeof(head),
                          "%s %s HTTP/1.1\r\nHost: %s%s%s%s%s\r\nUser-Agent: sluice\r\n%s%s\r\n",
                          method, target, v6 ? "[" : "", c->host, v6 ? "]" : "", dflt ? "" : ":",
                          dflt ? "" : c->port, length, headers ? headers : "");
        if (hl < 0 || (size_t)hl >= sizeof(head)) {
            snprintf(c->why, sizeof(c->why), "request head too long");
            return -1;
        }
        c->len = 0;
        if (send_all(c, head, (size_t)hl, deadline) != 0 ||
            (blen && send_all(c, body, blen, deadline) != 0)) {
            sl_httpc_close(c);
            if (reused)
                continue; /* the server closed an idle connection: once more on a new one */
            return -1;
        }
        /* The head. */
        char *hend = NULL;
        int rr = 1;
        while (!(hend = c->len ? memmem(c->buf, c->len, "\r\n\r\n", 4) : NULL)) {
            rr = recv_more(c, deadline);
            if (rr <= 0)
                break;
        }
        if (!hend) {
            sl_httpc_close(c);
            if (rr == 0 && reused && c->len == 0)
                continue;
            if (rr == 0)
                snprintf(c->why, sizeof(c->why), "%s:%s closed the connection before answering",
                         c->host, c->port);
            return -1;
        }
        int status = 0;
        if (c->len < 12 || strncmp(c->buf, "HTTP/1.", 7) != 0 ||
            sscanf(c->buf + 8, " %3d", &status) != 1 || status < 100 || status > 599) {
            snprintf(c->why, sizeof(c->why), "not an HTTP/1.x response from %s:%s", c->host,
                     c->port);
            sl_httpc_close(c);
            return -1;
        }
        h->status = status;
        h->hlen = (size_t)(hend - c->buf) + 4;
        h->chunked = 0;
        h->close_after = 0;
        h->clen = -1;
        for (char *line = memchr(c->buf, '\n', h->hlen); line && line < hend;
             line = memchr(line, '\n', (size_t)(hend - line))) {
            line++;
            if (strncasecmp(line, "content-length:", 15) == 0)
                h->clen = strtol(line + 15, NULL, 10);
            else if (strncasecmp(line, "transfer-encoding:", 18) == 0)
                h->chunked = 1; /* nothing but chunked is ever sent to a request without TE */
            else if (strncasecmp(line, "connection:", 11) == 0) {
                const char *eol = memchr(line, '\r', (size_t)(hend + 2 - line));
                for (const char *p = line + 11; eol && p + 5 <= eol; p++)
                    if (strncasecmp(p, "close", 5) == 0)
                        h->close_after = 1;
            }
        }
        if (strcasecmp(method, "HEAD") == 0 || status == 204 || status == 304 || status < 200)
            h->clen = 0, h->chunked = 0;
        return 0;
    }
    return -1;
}

/* Reads the whole body after the head: the status, or 0 with c->why. */
static int read_body(sl_httpc_t *c, head_t *h, uint64_t deadline, const char **rbody, size_t *rlen)
{
    size_t hlen = h->hlen;
    for (;;) {
        size_t have = c->len - hlen;
        if (h->chunked) {
            int whole = chunked_complete(c->buf + hlen, have);
            if (whole > 0) {
                *rlen = dechunk(c->buf + hlen, have);
                break;
            }
            if (whole < 0) {
                snprintf(c->why, sizeof(c->why), "bad chunked body from %s:%s", c->host, c->port);
                sl_httpc_close(c);
                return 0;
            }
        } else if (h->clen >= 0 && have >= (size_t)h->clen) {
            *rlen = (size_t)h->clen;
            break;
        }
        int r = recv_more(c, deadline);
        if (r < 0) {
            sl_httpc_close(c);
            return 0;
        }
        if (r == 0) {
            if (h->clen < 0 && !h->chunked && c->clean_eof) {
                *rlen = c->len - hlen;
                h->close_after = 1;
                break;
            }
            snprintf(c->why, sizeof(c->why), "%s:%s %s", c->host, c->port,
                     h->clen < 0 && !h->chunked
                         ? "ended a response without a length with no TLS close_notify: "
                           "it may be truncated"
                         : "closed the connection mid-response");
            sl_httpc_close(c);
            return 0;
        }
    }
    *rbody = c->buf + hlen;
    c->buf[hlen + *rlen] = '\0';
    if (h->close_after)
        sl_httpc_close(c);
    return h->status;
}

int sl_httpc_request(sl_httpc_t *c, const char *method, const char *target, const char *headers,
                     const char *body, size_t blen, uint64_t timeout_ms, const char **rbody,
                     size_t *rlen)
{
    head_t h;
    uint64_t deadline = now_ms() + timeout_ms;
    if (send_and_head(c, method, target, headers, body, blen, timeout_ms, &h) != 0)
        return 0;
    return read_body(c, &h, deadline, rbody, rlen);
}

/* Drops the first n bytes of the buffer (what was handed out). */
static void consume(sl_httpc_t *c, size_t n)
{
    memmove(c->buf, c->buf + n, c->len - n);
    c->len -= n;
    c->buf[c->len] = '\0';
}

int sl_httpc_stream(sl_httpc_t *c, const char *method, const char *target, const char *headers,
                    uint64_t head_timeout_ms, uint64_t idle_timeout_ms, sl_httpc_body_fn on_body,
                    void *arg, const char **rbody, size_t *rlen)
{
    head_t h;
    uint64_t deadline = now_ms() + head_timeout_ms;
    if (send_and_head(c, method, target, headers, NULL, 0, head_timeout_ms, &h) != 0)
        return 0;
    if (h.status < 200 || h.status > 299)
        return read_body(c, &h, deadline, rbody, rlen);
    *rbody = "";
    *rlen = 0;
    consume(c, h.hlen);
    /* Chunked: in_chunk bytes of the current chunk's data are still to
     * come (then its CRLF); 0 = a size line is next. */
    size_t in_chunk = 0, left = h.clen >= 0 ? (size_t)h.clen : 0;
    int need_crlf = 0;
    for (;;) {
        /* Hand out whatever whole pieces the buffer holds. */
        for (;;) {
            if (!h.chunked) {
                size_t n = c->len;
                if (h.clen >= 0 && n > left)
                    n = left;
                if (n && on_body(arg, c->buf, n) != 0) {
                    sl_httpc_close(c);
                    return h.status;
                }
                consume(c, n);
                if (h.clen >= 0 && (left -= n) == 0)
                    goto done;
                break;
            }
            if (need_crlf) {
                if (c->len < 2)
                    break;
                if (memcmp(c->buf, "\r\n", 2) != 0)
                    goto bad_chunk;
                consume(c, 2);
                need_crlf = 0;
            }
            if (in_chunk) {
                size_t n = c->len < in_chunk ? c->len : in_chunk;
                if (!n)
                    break;
                if (on_body(arg, c->buf, n) != 0) {
                    sl_httpc_close(c);
                    return h.status;
                }
                consume(c, n);
                if ((in_chunk -= n) == 0)
                    need_crlf = 1;
                continue;
            }
            char *eol = c->len ? memmem(c->buf, c->len, "\r\n", 2) : NULL;
            if (!eol) {
                if (c->len > 1024)
                    goto bad_chunk;
                break;
            }
            char *end;
            unsigned long long sz = strtoull(c->buf, &end, 16);
            if (end == c->buf || sz > (1ull << 40))
                goto bad_chunk;
            if (sz == 0) {
                /* The last chunk: trailers until an empty line. */
                char *t = memmem(eol, c->len - (size_t)(eol - c->buf), "\r\n\r\n", 4);
                if (!t)
                    break;
                consume(c, (size_t)(t - c->buf) + 4);
                goto done;
            }
            consume(c, (size_t)(eol - c->buf) + 2);
            in_chunk = (size_t)sz;
        }
        int r = recv_more(c, now_ms() + idle_timeout_ms);
        if (r < 0) {
            sl_httpc_close(c);
            return 0;
        }
        if (r == 0) {
            if (h.clen < 0 && !h.chunked && c->clean_eof) {
                sl_httpc_close(c);
                return h.status;
            }
            snprintf(c->why, sizeof(c->why), "%s:%s closed the connection mid-response", c->host,
                     c->port);
            sl_httpc_close(c);
            return 0;
        }
    }
done:
    if (h.close_after)
        sl_httpc_close(c);
    return h.status;
bad_chunk:
    snprintf(c->why, sizeof(c->why), "bad chunked body from %s:%s", c->host, c->port);
    sl_httpc_close(c);
    return 0;
}
