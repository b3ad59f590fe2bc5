/*
 * A small blocking HTTP/1.1 client for background threads: the jwt
 * policy's JWKS fetcher (policies/jwt/jwks_fetch.c) and the traffic log's
 * network sinks (runtime/tlog/tlog_net.c). Never used on a worker.
 *
 * One client talks to one URL's host: http:// or https:// (TLS 1.2 or
 * later, the peer verified against a CA bundle, a CA file or the system's
 * CAs, SNI for a name, the name or address checked in the certificate).
 * Every step has a deadline (the request's timeout, the handshake
 * included). The connection is kept alive between requests; a request on a
 * kept connection that the server had closed is sent once more on a new
 * one. Responses are framed by Content-Length, chunked encoding, or the
 * end of the connection; over TLS the last needs the server's close_notify
 * (an abrupt end could be a truncation).
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
    /* Optional: a descriptor watched while waiting, and what to do when it
     * is readable: return nonzero to give up ("cancelled"). */
    int cancel_fd;
    int (*cancelled)(void *arg);
    void *cancel_arg;
    size_t max_response; /* head and body, bytes; 0 = 64 MiB */

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

/* Closes the connection (kept: the TLS context, the buffer). */
void sl_httpc_close(sl_httpc_t *c);

/* Frees everything (the client can be set up again). */
void sl_httpc_free(sl_httpc_t *c);

#endif
