/*
 * The network sinks: http (a JSON array per batch, POSTed to any
 * collector), elasticsearch (the _bulk API: an action line and the document
 * per record, daily index names, per-item results) and clickhouse
 * (INSERT ... FORMAT JSONEachRow over its HTTP interface). All three speak
 * HTTP/1.1 through the small blocking client below, on the sink's own
 * thread, with a deadline on every connect, TLS handshake, send and
 * receive (the sink's timeout), keep-alive between batches, and basic or
 * API-key auth.
 *
 * https URLs: TLS 1.2 or later with OpenSSL, the server's certificate
 * verified against the system's CAs, or the sink's caBundle (PEM) or
 * caFile, for the URL's host name (SNI sent) or address. The CAs are
 * loaded when the first connection is made and again after a failed
 * handshake, so a caFile fixed on disk is picked up at the next retry. A
 * handshake or verification failure is a failed delivery like a refused
 * connection: logged with its reason, retried with the backoff.
 *
 * What is retried (with the sink's backoff): a connection that fails, a
 * timeout, 429 and 5xx answers, and Elasticsearch items refused with 429 or
 * 5xx; only those items are sent again. Any other refusal (400 bad
 * document, 401/403 bad credentials) drops the records for good, counted
 * and logged: resending them would never succeed.
 *
 * Not here: queues, batching and backoff timing (tlog.c).
 */
#include "tlog_sink.h"
#include "hostport.h"

#include "log.h"
#include "tls_pem.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define RESPONSE_MAX_BYTES (64 * 1024 * 1024)

typedef struct {
    char host[256];
    char port[8];
    char path[1024]; /* the URL's path, no trailing slash added */
    char auth[1024]; /* "Authorization: ...\r\n" or "" */
    int fd;
    int tls;       /* an https URL */
    int host_ip;   /* the host is an address: no SNI, the certificate names the address */
    SSL_CTX *ctx;  /* https: made at the first connection, again after a failed handshake */
    SSL *ssl;      /* https: the connection's */
    char why[768]; /* the last failure, for the log */
    sl_tlog_buf_t req, resp;
} net_state_t;

int sl_tlog_net_open(sl_tlog_sink_t *s, char *err, size_t errlen)
{
    net_state_t *n = calloc(1, sizeof(*n));
    if (!n) {
        snprintf(err, errlen, "traffic log sink %s: out of memory", s->cfg.name);
        return -1;
    }
    n->fd = -1;
    int tls = 0;
    const char *why = NULL;
    char why_buf[200];
    if (sl_url_split(s->cfg.url, &tls, n->host, sizeof(n->host), n->port, sizeof(n->port), n->path,
                     sizeof(n->path), &why) != 0) {
        snprintf(err, errlen, "traffic log sink %s: url %s: %s", s->cfg.name, s->cfg.url, why);
        free(n);
        return -1;
    }
    n->tls = tls;
    unsigned char addr[16];
    n->host_ip = inet_pton(AF_INET, n->host, addr) == 1 || inet_pton(AF_INET6, n->host, addr) == 1;
    if (tls && s->cfg.ca_pem[0] &&
        sl_pem_ca_load(NULL, s->cfg.ca_pem, why_buf, sizeof(why_buf)) < 0) {
        snprintf(err, errlen, "traffic log sink %s: caBundle: %s", s->cfg.name, why_buf);
        free(n);
        return -1;
    }
    if (s->cfg.api_key[0]) {
        snprintf(n->auth, sizeof(n->auth), "Authorization: ApiKey %s\r\n", s->cfg.api_key);
    } else if (s->cfg.username[0]) {
        char plain[600];
        unsigned char b64[820];
        int pl = snprintf(plain, sizeof(plain), "%s:%s", s->cfg.username, s->cfg.password);
        if (pl < 0 || (size_t)pl >= sizeof(plain)) {
            snprintf(err, errlen, "traffic log sink %s: username and password are too long",
                     s->cfg.name);
            free(n);
            return -1;
        }
        EVP_EncodeBlock(b64, (const unsigned char *)plain, pl);
        snprintf(n->auth, sizeof(n->auth), "Authorization: Basic %s\r\n", b64);
        OPENSSL_cleanse(plain, sizeof(plain));
    }
    s->state = n;
    return 0;
}

static int wait_fd(int fd, short events, uint64_t deadline_ms)
{
    for (;;) {
        uint64_t now = sl_tlog_now_ms();
        if (now >= deadline_ms)
            return -1;
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, (int)(deadline_ms - now));
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

static void conn_close(net_state_t *n)
{
    if (n->ssl) {
        /* A quiet close: the collector gets a close_notify if the socket
         * takes it now, and nobody waits for its answer. */
        SSL_shutdown(n->ssl);
        SSL_free(n->ssl);
        n->ssl = NULL;
    }
    if (n->fd >= 0)
        close(n->fd);
    n->fd = -1;
    ERR_clear_error();
}

static const char *ssl_reason(void)
{
    unsigned long e = ERR_peek_last_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    return r ? r : "unknown error";
}

/* The TLS context: TLS >= 1.2, peer verification against caBundle, caFile
 * or the system's CAs. 0, or -1 with n->why. */
static int tls_ctx(sl_tlog_sink_t *s, net_state_t *n)
{
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        snprintf(n->why, sizeof(n->why), "out of memory for TLS");
        return -1;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION);
    SSL_CTX_set_mode(ctx, SSL_MODE_AUTO_RETRY);
    static const unsigned char alpn[] = "\x08http/1.1";
    SSL_CTX_set_alpn_protos(ctx, alpn, sizeof(alpn) - 1);
    char why[200];
    if (s->cfg.ca_pem[0]) {
        if (sl_pem_ca_load(SSL_CTX_get_cert_store(ctx), s->cfg.ca_pem, why, sizeof(why)) <= 0) {
            snprintf(n->why, sizeof(n->why), "caBundle: %s", why);
            goto fail;
        }
    } else if (s->cfg.ca_file[0]) {
        /* Opened here first: OpenSSL's own error for a missing file is
         * "system lib". */
        FILE *f = fopen(s->cfg.ca_file, "re");
        const char *reason = f ? NULL : strerror(errno);
        if (f)
            fclose(f);
        if (reason || SSL_CTX_load_verify_locations(ctx, s->cfg.ca_file, NULL) != 1) {
            snprintf(n->why, sizeof(n->why),
                     "caFile %.200s cannot be used: %s (a readable PEM file of CA certificates)",
                     s->cfg.ca_file, reason ? reason : ssl_reason());
            goto fail;
        }
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        snprintf(n->why, sizeof(n->why), "the system's CA certificates could not be loaded: %s",
                 ssl_reason());
        goto fail;
    }
    ERR_clear_error();
    n->ctx = ctx;
    return 0;
fail:
    ERR_clear_error();
    SSL_CTX_free(ctx);
    return -1;
}

/* Waits for what the last SSL call wants; 1 when it may be called again,
 * 0 when it failed for good or the deadline passed. */
static int tls_wait(net_state_t *n, int r, uint64_t deadline)
{
    switch (SSL_get_error(n->ssl, r)) {
    case SSL_ERROR_WANT_READ:
        return wait_fd(n->fd, POLLIN, deadline) == 0;
    case SSL_ERROR_WANT_WRITE:
        return wait_fd(n->fd, POLLOUT, deadline) == 0;
    default:
        return 0;
    }
}

/* The handshake on n->fd: SNI (for a name only, RFC 6066), the name or
 * address the certificate must carry. 0, or -1 with n->why. */
static int tls_connect(sl_tlog_sink_t *s, net_state_t *n, uint64_t deadline)
{
    if (!n->ctx && tls_ctx(s, n) != 0)
        return -1;
    if (!(n->ssl = SSL_new(n->ctx)) || SSL_set_fd(n->ssl, n->fd) != 1) {
        snprintf(n->why, sizeof(n->why), "out of memory for TLS");
        return -1;
    }
    X509_VERIFY_PARAM *param = SSL_get0_param(n->ssl);
    X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    if ((n->host_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, n->host)
                    : X509_VERIFY_PARAM_set1_host(param, n->host, 0)) != 1 ||
        (!n->host_ip && SSL_set_tlsext_host_name(n->ssl, n->host) != 1)) {
        snprintf(n->why, sizeof(n->why), "cannot set the name to verify: %s", ssl_reason());
        return -1;
    }
    ERR_clear_error();
    for (;;) {
        int r = SSL_connect(n->ssl);
        if (r == 1)
            return 0;
        if (tls_wait(n, r, deadline))
            continue;
        long vr = SSL_get_verify_result(n->ssl);
        if (vr != X509_V_OK)
            snprintf(n->why, sizeof(n->why),
                     "TLS to %s:%s: certificate verify failed: %s (the server's certificate must "
                     "chain to %s and name %s)",
                     n->host, n->port, X509_verify_cert_error_string(vr),
                     s->cfg.ca_pem[0]    ? "caBundle"
                     : s->cfg.ca_file[0] ? "caFile"
                                         : "a system CA (or set caFile / caBundle)",
                     n->host);
        else if (sl_tlog_now_ms() >= deadline)
            snprintf(n->why, sizeof(n->why), "TLS to %s:%s: timed out in the handshake", n->host,
                     n->port);
        else if (ERR_peek_last_error())
            snprintf(n->why, sizeof(n->why), "TLS to %s:%s: handshake failed: %s", n->host, n->port,
                     ssl_reason());
        else
            snprintf(n->why, sizeof(n->why),
                     "TLS to %s:%s: handshake failed: the connection was closed", n->host, n->port);
        ERR_clear_error();
        /* The CAs are loaded again for the next attempt. */
        SSL_CTX_free(n->ctx);
        n->ctx = NULL;
        return -1;
    }
}

static int conn_open(sl_tlog_sink_t *s, net_state_t *n, uint64_t deadline)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(n->host, n->port, &hints, &res);
    if (rc != 0) {
        snprintf(n->why, sizeof(n->why), "cannot resolve %s: %s", n->host, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
            break;
        if (errno == EINPROGRESS && wait_fd(fd, POLLOUT, deadline) == 0) {
            int soerr = 0;
            socklen_t sl = sizeof(soerr);
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
            if (soerr == 0)
                break;
            errno = soerr;
        }
        snprintf(n->why, sizeof(n->why), "connect to %s:%s: %s", n->host, n->port,
                 errno == EINPROGRESS ? "timed out" : strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    /* A batch is sent as a head and a body: without NODELAY the body's last
     * segment waits for the ACK of the head, which the collector delays (up
     * to 40 ms on Linux): one batch per delayed ACK. */
    if (fd >= 0)
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &(int){1}, sizeof(int));
    n->fd = fd;
    if (fd < 0)
        return -1;
    if (n->tls && tls_connect(s, n, deadline) != 0) {
        conn_close(n);
        return -1;
    }
    return 0;
}

static int send_all(net_state_t *n, const char *p, size_t len, uint64_t deadline)
{
    while (len && n->ssl) {
        ERR_clear_error();
        int w = SSL_write(n->ssl, p, (int)(len > 1u << 30 ? 1u << 30 : len));
        if (w > 0) {
            p += w;
            len -= (size_t)w;
            continue;
        }
        if (tls_wait(n, w, deadline))
            continue;
        snprintf(n->why, sizeof(n->why), "send to %s:%s: %s", n->host, n->port,
                 sl_tlog_now_ms() >= deadline ? "timed out"
                 : ERR_peek_last_error()      ? ssl_reason()
                                              : "the connection was closed");
        ERR_clear_error();
        return -1;
    }
    while (len) {
        ssize_t w = send(n->fd, p, len, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            len -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
            wait_fd(n->fd, POLLOUT, deadline) == 0)
            continue;
        snprintf(n->why, sizeof(n->why), "send to %s:%s: %s", n->host, n->port,
                 w < 0 && errno != EAGAIN ? strerror(errno) : "timed out");
        return -1;
    }
    return 0;
}

/* Reads more into resp; 1 read, 0 closed, -1 error or timeout. */
static int recv_more(net_state_t *n, uint64_t deadline)
{
    for (;;) {
        if (n->resp.cap - n->resp.len < 16384) {
            if (n->resp.len >= RESPONSE_MAX_BYTES) {
                snprintf(n->why, sizeof(n->why), "the response is larger than %d bytes",
                         RESPONSE_MAX_BYTES);
                return -1;
            }
            size_t cap = n->resp.cap ? n->resp.cap * 2 : 65536;
            char *d = realloc(n->resp.data, cap);
            if (!d) {
                snprintf(n->why, sizeof(n->why), "out of memory");
                return -1;
            }
            n->resp.data = d;
            n->resp.cap = cap;
        }
        if (n->ssl) {
            ERR_clear_error();
            int r =
                SSL_read(n->ssl, n->resp.data + n->resp.len, (int)(n->resp.cap - n->resp.len - 1));
            if (r > 0) {
                n->resp.len += (size_t)r;
                n->resp.data[n->resp.len] = '\0';
                return 1;
            }
            int e = SSL_get_error(n->ssl, r);
            if (e == SSL_ERROR_ZERO_RETURN ||
                (e == SSL_ERROR_SSL &&
                 ERR_GET_REASON(ERR_peek_last_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING) ||
                (e == SSL_ERROR_SYSCALL && ERR_peek_last_error() == 0 && errno == 0)) {
                /* close_notify, or a close without it: the response's own
                 * framing says whether it was complete. */
                ERR_clear_error();
                return 0;
            }
            if (tls_wait(n, r, deadline))
                continue;
            snprintf(n->why, sizeof(n->why), "receive from %s:%s: %s", n->host, n->port,
                     sl_tlog_now_ms() >= deadline ? "timed out"
                     : ERR_peek_last_error()      ? ssl_reason()
                                                  : strerror(errno));
            ERR_clear_error();
            return -1;
        }
        ssize_t r = recv(n->fd, n->resp.data + n->resp.len, n->resp.cap - n->resp.len - 1, 0);
        if (r > 0) {
            n->resp.len += (size_t)r;
            n->resp.data[n->resp.len] = '\0';
            return 1;
        }
        if (r == 0)
            return 0;
        if (errno == EINTR)
            continue;
        if ((errno == EAGAIN || errno == EWOULDBLOCK) && wait_fd(n->fd, POLLIN, deadline) == 0)
            continue;
        snprintf(n->why, sizeof(n->why), "receive from %s:%s: %s", n->host, n->port,
                 errno == EAGAIN ? "timed out" : strerror(errno));
        return -1;
    }
}

/* Decodes a chunked body in place; its length, or -1 when incomplete or bad. */
static long dechunk(char *p, size_t len, int *complete)
{
    size_t in = 0, out = 0;
    *complete = 0;
    for (;;) {
        char *eol = memmem(p + in, len - in, "\r\n", 2);
        if (!eol)
            return (long)out;
        char *end;
        unsigned long sz = strtoul(p + in, &end, 16);
        if (end == p + in)
            return -1;
        size_t data = (size_t)(eol - p) + 2;
        if (sz == 0) {
            *complete = memmem(p + data, len - data, "\r\n", 2) != NULL;
            return (long)out;
        }
        if (len - data < sz + 2)
            return (long)out;
        memmove(p + out, p + data, sz);
        out += sz;
        in = data + sz + 2;
        /* What is left is moved down with the next chunk's data. */
        memmove(p + out, p + in, len - in);
        len = out + (len - in);
        in = out;
    }
}

/* One request, one response. Returns the status (body in *body, owned by
 * n->resp) or 0 with n->why on a transport failure. */
static int http_post(sl_tlog_sink_t *s, net_state_t *n, const char *target, const char *ctype,
                     const char *body, size_t blen, char **rbody, size_t *rlen)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        uint64_t deadline = sl_tlog_now_ms() + s->cfg.timeout_ms;
        int reused = n->fd >= 0;
        if (!reused && conn_open(s, n, deadline) != 0)
            return 0;
        char head[2048];
        int hl = snprintf(head, sizeof(head),
                          "POST %s HTTP/1.1\r\nHost: %s%s%s:%s\r\nUser-Agent: sluice-runtime\r\n"
                          "Content-Type: %s\r\nContent-Length: %zu\r\n%s\r\n",
                          target, strchr(n->host, ':') ? "[" : "", n->host,
                          strchr(n->host, ':') ? "]" : "", n->port, ctype, blen, n->auth);
        if (hl < 0 || (size_t)hl >= sizeof(head)) {
            snprintf(n->why, sizeof(n->why), "request head too long");
            return 0;
        }
        n->resp.len = 0;
        if (send_all(n, head, (size_t)hl, deadline) != 0 ||
            send_all(n, body, blen, deadline) != 0) {
            conn_close(n);
            if (reused)
                continue; /* the collector closed an idle connection: once more on a new one */
            return 0;
        }
        /* The head. */
        char *hend = NULL;
        int rr = 1;
        while (!(hend = n->resp.len ? strstr(n->resp.data, "\r\n\r\n") : NULL)) {
            rr = recv_more(n, deadline);
            if (rr <= 0)
                break;
        }
        if (!hend) {
            conn_close(n);
            if (rr == 0 && reused && n->resp.len == 0)
                continue;
            if (rr == 0)
                snprintf(n->why, sizeof(n->why), "%s:%s closed the connection before answering",
                         n->host, n->port);
            return 0;
        }
        int status = 0;
        if (sscanf(n->resp.data, "HTTP/1.%*d %d", &status) != 1 || status < 100 || status > 599) {
            snprintf(n->why, sizeof(n->why), "not an HTTP response from %s:%s", n->host, n->port);
            conn_close(n);
            return 0;
        }
        size_t hlen = (size_t)(hend - n->resp.data) + 4;
        *hend = '\0';
        int chunked = 0, close_after = 0;
        long clen = -1;
        for (char *line = strstr(n->resp.data, "\r\n"); line && line < hend;
             line = strstr(line + 2, "\r\n")) {
            char *l = line + 2;
            if (strncasecmp(l, "content-length:", 15) == 0)
                clen = strtol(l + 15, NULL, 10);
            else if (strncasecmp(l, "transfer-encoding:", 18) == 0 && strcasestr(l, "chunked"))
                chunked = 1;
            else if (strncasecmp(l, "connection:", 11) == 0 && strcasestr(l, "close"))
                close_after = 1;
        }
        *hend = '\r';
        /* The body. */
        for (;;) {
            size_t have = n->resp.len - hlen;
            if (chunked) {
                /* Decode a copy: a partial body is read further. */
                char *copy = malloc(have + 1);
                if (!copy) {
                    conn_close(n);
                    return 0;
                }
                memcpy(copy, n->resp.data + hlen, have);
                int complete = 0;
                long out = dechunk(copy, have, &complete);
                if (out >= 0 && complete) {
                    memcpy(n->resp.data + hlen, copy, (size_t)out);
                    n->resp.data[hlen + (size_t)out] = '\0';
                    free(copy);
                    *rbody = n->resp.data + hlen;
                    *rlen = (size_t)out;
                    break;
                }
                free(copy);
                if (out < 0) {
                    snprintf(n->why, sizeof(n->why), "bad chunked body from %s:%s", n->host,
                             n->port);
                    conn_close(n);
                    return 0;
                }
            } else if (clen >= 0 && have >= (size_t)clen) {
                *rbody = n->resp.data + hlen;
                *rlen = (size_t)clen;
                break;
            }
            int r = recv_more(n, deadline);
            if (r < 0) {
                conn_close(n);
                return 0;
            }
            if (r == 0) {
                if (clen < 0 && !chunked) {
                    *rbody = n->resp.data + hlen;
                    *rlen = n->resp.len - hlen;
                    close_after = 1;
                    break;
                }
                snprintf(n->why, sizeof(n->why), "%s:%s closed the connection mid-response",
                         n->host, n->port);
                conn_close(n);
                return 0;
            }
        }
        if (close_after)
            conn_close(n);
        return status;
    }
    return 0;
}

/* What an answer means for a whole batch. */
static enum sl_tlog_deliver_result judge(sl_tlog_sink_t *s, net_state_t *n, int status,
                                         const char *rbody, size_t rlen, unsigned nrec)
{
    if (status >= 200 && status < 300) {
        atomic_fetch_add_explicit(&s->written, nrec, memory_order_relaxed);
        return SL_TLOG_DELIVERED;
    }
    if (status == 0 || status == 429 || status >= 500) {
        if (status)
            snprintf(n->why, sizeof(n->why), "HTTP %d: %.*s", status,
                     (int)(rlen < 160 ? rlen : 160), rbody ? rbody : "");
        sl_log_warn("traffic log sink %s: delivery failed (%s); retrying with backoff", s->cfg.name,
                    n->why);
        return SL_TLOG_RETRY;
    }
    char why[400];
    snprintf(why, sizeof(why), "the collector refused the batch with HTTP %d: %.*s", status,
             (int)(rlen < 200 ? rlen : 200), rbody ? rbody : "");
    sl_tlog_sink_lost(s, nrec, why);
    return SL_TLOG_DELIVERED;
}

/* ---- http: a JSON array per batch ---------------------------------------- */

static int line_encode(sl_tlog_sink_t *s, const sl_tlog_view_t *v, const char *json,
                       size_t json_len, sl_tlog_buf_t *out)
{
    (void)s;
    (void)v;
    if (sl_tlog_buf_add(out, json, json_len) != 0)
        return -1;
    return sl_tlog_buf_add(out, "\n", 1);
}

/* Every '\n' (the end of a record: a record has none inside) becomes ','
 * so the records are a JSON array's elements; memchr scans a word or a
 * vector at a time, a byte loop cost a sink ~1 instruction per byte. */
static void lines_to_commas(char *p, size_t n)
{
    char *end = p + n;
    while (p < end && (p = memchr(p, '\n', (size_t)(end - p))) != NULL)
        *p++ = ',';
}

static enum sl_tlog_deliver_result http_deliver(sl_tlog_sink_t *s, sl_tlog_buf_t *batch,
                                                unsigned *nrec)
{
    net_state_t *n = s->state;
    /* The lines become the array's elements: '\n' -> ',' in a copy, so a
     * retry sends the same batch. */
    sl_tlog_buf_t *body = &n->req;
    body->len = 0;
    if (sl_tlog_buf_add(body, "[", 1) != 0 || sl_tlog_buf_add(body, batch->data, batch->len) != 0)
        return SL_TLOG_RETRY;
    lines_to_commas(body->data + 1, body->len - 1);
    if (body->len > 1 && body->data[body->len - 1] == ',')
        body->data[body->len - 1] = ']';
    else if (sl_tlog_buf_add(body, "]", 1) != 0)
        return SL_TLOG_RETRY;
    char *rbody = NULL;
    size_t rlen = 0;
    int status = http_post(s, n, n->path, "application/json", body->data, body->len, &rbody, &rlen);
    return judge(s, n, status, rbody, rlen, *nrec);
}

/* ---- elasticsearch: _bulk ------------------------------------------------- */

/* The action line of a record: {"index":{"_index":"<index>-YYYY.MM.DD"}}. The
 * day is the record's (UTC), so a batch across midnight splits correctly. */
static int es_encode(sl_tlog_sink_t *s, const sl_tlog_view_t *v, const char *json, size_t json_len,
                     sl_tlog_buf_t *out)
{
    uint64_t day = v->rec.start_unix_us / 1000000 / 86400;
    if (day != s->es_day || !s->es_action_len) {
        time_t t = (time_t)(day * 86400);
        struct tm tm;
        gmtime_r(&t, &tm); /* logger thread, once a day */
        int n = snprintf(s->es_action, sizeof(s->es_action),
                         "{\"index\":{\"_index\":\"%s-%04d.%02d.%02d\"}}\n", s->cfg.index,
                         tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday);
        s->es_action_len = n > 0 && (size_t)n < sizeof(s->es_action) ? (size_t)n : 0;
        s->es_day = day;
    }
    if (sl_tlog_buf_add(out, s->es_action, s->es_action_len) != 0 ||
        sl_tlog_buf_add(out, json, json_len) != 0)
        return -1;
    return sl_tlog_buf_add(out, "\n", 1);
}

/* The start of record i's two lines in batch, or NULL. */
static const char *nth_pair(const sl_tlog_buf_t *b, size_t i, size_t *len)
{
    const char *p = b->data, *end = b->data + b->len;
    for (size_t k = 0; k < i; k++) {
        for (int l = 0; l < 2; l++) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            if (!nl)
                return NULL;
            p = nl + 1;
        }
    }
    const char *q = p;
    for (int l = 0; l < 2; l++) {
        const char *nl = memchr(q, '\n', (size_t)(end - q));
        if (!nl)
            return NULL;
        q = nl + 1;
    }
    *len = (size_t)(q - p);
    return p;
}

static enum sl_tlog_deliver_result es_deliver(sl_tlog_sink_t *s, sl_tlog_buf_t *batch,
                                              unsigned *nrec)
{
    net_state_t *n = s->state;
    char target[1100];
    size_t pl = strlen(n->path);
    snprintf(target, sizeof(target), "%.*s/_bulk",
             (int)(pl && n->path[pl - 1] == '/' ? pl - 1 : pl), n->path);
    char *rbody = NULL;
    size_t rlen = 0;
    int status =
        http_post(s, n, target, "application/x-ndjson", batch->data, batch->len, &rbody, &rlen);
    if (status < 200 || status >= 300)
        return judge(s, n, status, rbody, rlen, *nrec);
    /* 200 with "errors":false before "items": every document was indexed.
     * Elasticsearch writes took, errors, then items; reading that flag
     * spares parsing an item per document (~2 µs a record). */
    if (rbody && rlen) {
        static const char items_key[] = "\"items\"", no_errors[] = "\"errors\":false";
        const char *items = memmem(rbody, rlen, items_key, sizeof(items_key) - 1);
        if (items && memmem(rbody, (size_t)(items - rbody), no_errors, sizeof(no_errors) - 1)) {
            atomic_fetch_add_explicit(&s->written, *nrec, memory_order_relaxed);
            return SL_TLOG_DELIVERED;
        }
    }
    /* 200: per item. */
    json_error_t jerr;
    json_t *doc = json_loadb(rbody, rlen, 0, &jerr);
    json_t *items = json_object_get(doc, "items");
    if (!doc || !json_is_array(items)) {
        json_decref(doc);
        snprintf(n->why, sizeof(n->why), "the _bulk answer is not a bulk response");
        sl_log_warn("traffic log sink %s: %s; retrying", s->cfg.name, n->why);
        return SL_TLOG_RETRY;
    }
    if (!json_is_true(json_object_get(doc, "errors")) && json_array_size(items) == *nrec) {
        json_decref(doc);
        atomic_fetch_add_explicit(&s->written, *nrec, memory_order_relaxed);
        return SL_TLOG_DELIVERED;
    }
    sl_tlog_buf_t again = {0};
    unsigned nagain = 0, ok = 0, refused = 0;
    char reason[300] = "";
    for (size_t i = 0; i < *nrec; i++) {
        json_t *item = json_array_get(items, i);
        const char *op;
        json_t *res = NULL;
        json_object_foreach(item, op, res) break;
        int st = res ? (int)json_integer_value(json_object_get(res, "status")) : 0;
        if (st >= 200 && st < 300) {
            ok++;
            continue;
        }
        if (st == 0 || st == 429 || st >= 500) {
            size_t len = 0;
            const char *p = nth_pair(batch, i, &len);
            if (p && sl_tlog_buf_add(&again, p, len) == 0) {
                nagain++;
                continue;
            }
        }
        refused++;
        if (!reason[0]) {
            json_t *e = json_object_get(res, "error");
            snprintf(reason, sizeof(reason), "Elasticsearch refused a document with %d: %s: %s", st,
                     json_string_value(json_object_get(e, "type")) ?: "?",
                     json_string_value(json_object_get(e, "reason")) ?: "?");
        }
    }
    json_decref(doc);
    atomic_fetch_add_explicit(&s->written, ok, memory_order_relaxed);
    if (refused)
        sl_tlog_sink_lost(s, refused, reason);
    if (nagain == 0) {
        sl_tlog_buf_free(&again);
        return SL_TLOG_DELIVERED;
    }
    sl_tlog_buf_free(batch);
    *batch = again;
    *nrec = nagain;
    sl_log_warn("traffic log sink %s: Elasticsearch asked to retry %u document(s)", s->cfg.name,
                nagain);
    return SL_TLOG_RETRY;
}

/* ---- clickhouse: INSERT ... FORMAT JSONEachRow ----------------------------- */

/* Errors of a ClickHouse exception ("Code: N, ...", or the
 * X-ClickHouse-Exception-Code header of newer servers) that come from the
 * rows themselves or the table's schema: sending the same rows again would
 * fail the same way, so they are dropped (counted, logged) instead of
 * retried. ClickHouse answers them with HTTP 500 like a server in trouble. */
static int ch_permanent(int code)
{
    static const int codes[] = {
        6,   /* CANNOT_PARSE_TEXT */
        16,  /* NO_SUCH_COLUMN_IN_TABLE */
        26,  /* CANNOT_PARSE_QUOTED_STRING */
        27,  /* CANNOT_PARSE_INPUT_ASSERTION_FAILED */
        38,  /* CANNOT_PARSE_DATE */
        41,  /* CANNOT_PARSE_DATETIME */
        53,  /* TYPE_MISMATCH */
        60,  /* UNKNOWN_TABLE */
        62,  /* SYNTAX_ERROR */
        70,  /* CANNOT_CONVERT_TYPE */
        72,  /* CANNOT_PARSE_NUMBER */
        81,  /* UNKNOWN_DATABASE */
        117, /* INCORRECT_DATA */
        192, /* UNKNOWN_USER */
        193, /* WRONG_PASSWORD */
        497, /* ACCESS_DENIED */
    };
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
        if (codes[i] == code)
            return 1;
    return 0;
}

static enum sl_tlog_deliver_result ch_deliver(sl_tlog_sink_t *s, sl_tlog_buf_t *batch,
                                              unsigned *nrec)
{
    net_state_t *n = s->state;
    char target[1400];
    /* input_format_skip_unknown_fields: a table need not have every field;
     * date_time_input_format=best_effort: `time` (RFC 3339 with
     * milliseconds and Z) loads into a DateTime (or DateTime64) column. */
    snprintf(target, sizeof(target),
             "%s?input_format_skip_unknown_fields=1&date_time_input_format=best_effort&"
             "query=INSERT%%20INTO%%20%s%%20FORMAT%%20JSONEachRow",
             n->path, s->cfg.table);
    char *rbody = NULL;
    size_t rlen = 0;
    int status =
        http_post(s, n, target, "application/x-ndjson", batch->data, batch->len, &rbody, &rlen);
    int code = 0;
    if (status >= 500 && rbody && sscanf(rbody, "Code: %d", &code) == 1 && ch_permanent(code)) {
        char why[400];
        snprintf(why, sizeof(why), "ClickHouse refused the batch with HTTP %d: %.*s", status,
                 (int)(rlen < 240 ? rlen : 240), rbody);
        sl_tlog_sink_lost(s, *nrec, why);
        return SL_TLOG_DELIVERED;
    }
    return judge(s, n, status, rbody, rlen, *nrec);
}

static void net_close(sl_tlog_sink_t *s)
{
    net_state_t *n = s->state;
    if (!n)
        return;
    conn_close(n);
    SSL_CTX_free(n->ctx);
    sl_tlog_buf_free(&n->req);
    sl_tlog_buf_free(&n->resp);
    OPENSSL_cleanse(n->auth, sizeof(n->auth));
    free(n);
    s->state = NULL;
}

const sl_tlog_sink_ops_t sl_tlog_http_ops = {
    .type = "http",
    .encode = line_encode,
    .deliver = http_deliver,
    .close = net_close,
    .lines_per_record = 1,
};

const sl_tlog_sink_ops_t sl_tlog_es_ops = {
    .type = "elasticsearch",
    .encode = es_encode,
    .deliver = es_deliver,
    .close = net_close,
    .lines_per_record = 2,
};

const sl_tlog_sink_ops_t sl_tlog_clickhouse_ops = {
    .type = "clickhouse",
    .encode = line_encode,
    .deliver = ch_deliver,
    .close = net_close,
    .lines_per_record = 1,
};

/* ---- otlp: spans as OTLP/HTTP with the JSON encoding ---------------------- */

static int otlp_encode(sl_tlog_sink_t *s, const sl_tlog_view_t *v, const char *json,
                       size_t json_len, sl_tlog_buf_t *out)
{
    (void)s;
    (void)json;
    (void)json_len;
    size_t before = out->len;
    if (sl_tlog_format_spans(v, out) != 0)
        return -1;
    if (out->len == before)
        return 0; /* no span: nothing queued, but the record line must still end */
    return sl_tlog_buf_add(out, "\n", 1);
}

/* An ExportTraceServiceRequest: one resource (service.name), one scope,
 * the batch's spans. A 2xx may carry partialSuccess.rejectedSpans: those
 * are lost for good (the collector said why), the rest delivered. */
static enum sl_tlog_deliver_result otlp_deliver(sl_tlog_sink_t *s, sl_tlog_buf_t *batch,
                                                unsigned *nrec)
{
    net_state_t *n = s->state;
    sl_tlog_buf_t *body = &n->req;
    body->len = 0;
    char head[600];
    json_t *svc =
        json_string(s->cfg.service_name && *s->cfg.service_name ? s->cfg.service_name : "sluice");
    char *svc_json = svc ? json_dumps(svc, JSON_ENCODE_ANY) : NULL;
    json_decref(svc);
    int hl =
        snprintf(head, sizeof(head),
                 "{\"resourceSpans\":[{\"resource\":{\"attributes\":[{\"key\":\"service.name\","
                 "\"value\":{\"stringValue\":%s}}]},\"scopeSpans\":[{\"scope\":{\"name\":"
                 "\"sluice-runtime\"},\"spans\":[",
                 svc_json ? svc_json : "\"sluice\"");
    free(svc_json);
    if (hl < 0 || (size_t)hl >= sizeof(head) || sl_tlog_buf_add(body, head, (size_t)hl) != 0)
        return SL_TLOG_RETRY;
    size_t spans_at = body->len;
    if (sl_tlog_buf_add(body, batch->data, batch->len) != 0)
        return SL_TLOG_RETRY;
    lines_to_commas(body->data + spans_at, body->len - spans_at);
    if (body->len > spans_at && body->data[body->len - 1] == ',')
        body->len--;
    if (sl_tlog_buf_add(body, "]}]}]}", 6) != 0)
        return SL_TLOG_RETRY;
    char *rbody = NULL;
    size_t rlen = 0;
    int status = http_post(s, n, n->path, "application/json", body->data, body->len, &rbody, &rlen);
    if (status >= 200 && status < 300 && rlen) {
        json_t *doc = json_loadb(rbody, rlen, 0, NULL);
        json_t *ps = json_object_get(doc, "partialSuccess");
        json_t *rj = json_object_get(ps, "rejectedSpans");
        /* int64 fields are strings in OTLP/JSON; accept a number too. */
        long long rejected = json_is_string(rj)    ? strtoll(json_string_value(rj), NULL, 10)
                             : json_is_integer(rj) ? json_integer_value(rj)
                                                   : 0;
        if (rejected > 0) {
            unsigned lost = rejected >= (long long)*nrec ? *nrec : (unsigned)rejected;
            char why[400];
            snprintf(why, sizeof(why), "the collector rejected %lld span(s): %s", rejected,
                     json_string_value(json_object_get(ps, "errorMessage")) ?: "no reason given");
            sl_tlog_sink_lost(s, lost, why);
            atomic_fetch_add_explicit(&s->written, *nrec - lost, memory_order_relaxed);
            json_decref(doc);
            return SL_TLOG_DELIVERED;
        }
        json_decref(doc);
    }
    return judge(s, n, status, rbody, rlen, *nrec);
}

const sl_tlog_sink_ops_t sl_tlog_otlp_ops = {
    .type = "otlp",
    .encode = otlp_encode,
    .deliver = otlp_deliver,
    .close = net_close,
    .lines_per_record = 1,
    .trace = 1,
};
