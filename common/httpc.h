/*
 * A small blocking HTTP/1.1 client for background threads: the jwt
 * policy's JWKS fetcher (policies/jwt/jwks_fetch.c) and the traffic log's
 * network sinks (runtime/tlog/tlog_net.c). Never used on a worker.
 *
 * One client talks to one URL's host: http:// or https:// (TLS 1.2 or
 * later, the peer verified against a CA bundle, a CA file or the system's
 * CAs, SNI for a name, the name or address checked in the certificate).
 * Every step has a deadline (the request's timeout, the handshake
 * included), and opening a connection (TCP and TLS handshake) has its own,
 * shorter one (connect_timeout_ms, as client-go's 10 s TLS handshake
 * timeout): a server that takes a connection and never answers its
 * handshake is given up on soon, and the caller's retry opens another. The connection is kept alive between requests; a request on a
 * kept connection that the server had closed is sent once more on a new
 * one. Responses are framed by Content-Length, chunked encoding, or the
 * end of the connection; over TLS the last needs the server's close_notify
 * (an abrupt end could be a truncation).
 *
 * A client certificate (cert_pem + key_pem) is presented when the server
 * asks for one (the Kubernetes API server's client-certificate auth).
 *
 * Streaming (sl_httpc_stream): a 2xx response's body is handed to a
 * callback piece by piece as it arrives (chunked framing removed), for
 * responses that stay open: the Kubernetes watch client
 * (controller/ksource.c). Each wait for more has its own idle deadline;
 * the response as a whole has none.
 *
 * Errors: a request that gets no answer returns 0 and says why in c->why,
 * naming the peer ("connect to host:port: Connection refused", "TLS to
 * host:port: certificate verify failed: hostname mismatch (...)").
 *
 * Not here: what a status means to the caller, retries and backoff.
 */
#ifndef SL_HTTPC_H
#define SL_HTTPC_H

#include <stddef.h>
#include <stdint.h>

struct ssl_st;
struct ssl_ctx_st;

typedef struct sl_httpc {
    /* From the URL (sl_httpc_init). */
    char host[256]; /* without an IPv6 literal's brackets */
    char port[8];
    char path[1024];
    int tls;
    int host_ip; /* the host is an address: no SNI, the certificate must carry it */
    /* Trust for https (borrowed; NULL or "" = not set): a PEM bundle, or a
     * file, else the system's CAs; and their names for messages (the
     * caller's field names, "caBundle" / "jwksCaFile"). */
    const char *ca_pem, *ca_file;
    const char *ca_pem_name, *ca_file_name;
    /* A client certificate chain and its key, PEM (borrowed; NULL = none),
     * and the name for messages ("client-certificate-data"). */
    const char *cert_pem, *key_pem;
    const char *cert_name;
    /* Optional: a descriptor watched while waiting, and what to do when it
     * is readable: return nonzero to give up ("cancelled"). */
    int cancel_fd;
    int (*cancelled)(void *arg);
    void *cancel_arg;
    size_t max_response; /* head and body, bytes; 0 = 64 MiB */
    uint32_t connect_timeout_ms; /* TCP connect + TLS handshake; 0 = 10 s */

    char why[768]; /* the last failure */

    /* Private. */
    int fd;
    struct ssl_ctx_st *ctx;
    struct ssl_st *ssl;
    char *buf;
    size_t len, cap;
    int clean_eof;        /* the last read's end was announced (FIN, close_notify) */
    const char *wait_err; /* why the last wait failed: "timed out", "cancelled", NULL */
} sl_httpc_t;

/* Sets up a client for url (no connection yet). 0, or -1 with why (a
 * static string). Fields left zero (ca_*, cancel_*) may be set after. */
int sl_httpc_init(sl_httpc_t *c, const char *url, const char **why);

/* One request: `headers` are extra lines ("Name: value\r\n" each, or NULL),
 * Host, Content-Length (when body is not NULL) and User-Agent are added.
 * Returns the status (100..599) with the body in *rbody / *rlen (valid
 * until the next call), or 0 with c->why. */
int sl_httpc_request(sl_httpc_t *c, const char *method, const char *target, const char *headers,
                     const char *body, size_t blen, uint64_t timeout_ms, const char **rbody,
                     size_t *rlen);

/* Called with each piece of a streamed body, in order; return nonzero to
 * stop reading (the connection is closed). */
typedef int (*sl_httpc_body_fn)(void *arg, const char *data, size_t len);

/* A request whose 2xx response is streamed: the head must arrive within
 * head_timeout_ms, then each body piece is given to on_body as it arrives,
 * waiting at most idle_timeout_ms for the next. A status outside 200..299
 * is read whole and returned with its body in *rbody / *rlen, as
 * sl_httpc_request does (on_body is not called). Returns the status when
 * the body ended (its framing said so, or on_body asked to stop), or 0
 * with c->why (a connection closed mid-body, an idle timeout, a cancel). */
int sl_httpc_stream(sl_httpc_t *c, const char *method, const char *target, const char *headers,
                    uint64_t head_timeout_ms, uint64_t idle_timeout_ms, sl_httpc_body_fn on_body,
                    void *arg, const char **rbody, size_t *rlen);

/* Whether a client certificate chain and key (PEM) can be used: 0, or -1
 * with why starting with `name`. */
int sl_httpc_check_client_cert(const char *cert_pem, const char *key_pem, const char *name,
                               char *why, size_t whylen);

/* Closes the connection (kept: the TLS context, the buffer). */
void sl_httpc_close(sl_httpc_t *c);

/* Frees everything (the client can be set up again). */
void sl_httpc_free(sl_httpc_t *c);

#endif
