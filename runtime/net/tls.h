/*
 * TLS termination for https listeners (OpenSSL 3): one immutable server
 * object per listener and config generation, and the non-blocking
 * handshake/read/write helpers that a codec calls on each connection.
 *
 * What this file does: build the listener's SSL_CTXs from the snapshot
 * (certificates chosen by SNI, RSA and ECDSA side by side, versions, suites,
 * groups, ALPN, session cache, session tickets, OCSP stapling, client
 * certificates), own the session-ticket keys that every worker and every
 * generation of the runtime shares, and report what a connection negotiated
 * (ALPN, the verified client certificate). What it does not do: sockets,
 * epoll, timeouts, HTTP (the proxy owns the connection and calls in here),
 * nor validation of documents (common/tls_pem.c, shared with the validator).
 *
 * ---- Life cycle and ownership ---------------------------------------------
 *
 *   main thread, per generation and https listener:
 *       srv = sl_tls_server_build(listener, snapshot, flags, err, errlen);
 *       NULL -> the snapshot is refused (NACK / reload error) with err, which
 *       names the listener, the Certificate and the field, never key bytes.
 *   worker, per accepted socket (fd non-blocking, already accepted):
 *       SSL *ssl = sl_tls_server_ssl_new(srv, fd);   NULL -> close fd
 *       ... sl_tls_handshake / sl_tls_read / sl_tls_write ...
 *       sl_tls_shutdown(ssl, &want);  SSL_free(ssl);  close(fd);
 *   main thread, when the generation is freed (after its grace period):
 *       sl_tls_server_free(srv);
 *
 * A server is immutable once built; workers share it without locks
 * (SSL_new on a shared SSL_CTX is thread-safe). sl_tls_server_free drops the
 * builder's reference only: every SSL made from the server keeps the server
 * alive until SSL_free, through OpenSSL's own reference count on the
 * server's first SSL_CTX (no extra atomic per connection). So a generation
 * may be freed while handshakes on its listeners are still in progress, and
 * an established connection keeps its certificate across any number of
 * config changes; new connections take the new generation's server at once.
 * sl_tls_server_free may be called from any thread.
 *
 * Session tickets: the keys live in a ring per listener name, outside any
 * generation, so a ticket issued before a config change still resumes after
 * it. Three keys: the current one encrypts, the two before it still decrypt
 * (and the session is then re-issued under the current key). A key is
 * current for `ticket_rotation_s`; sessions live as long, so every ticket
 * can be decrypted for its whole lifetime. Rotation happens on the first
 * new ticket after the period (one trylock, never waited for); workers read
 * the ring through a sequence lock: no lock and no write to shared memory on
 * the handshake path. Keys are random per process, never written anywhere.
 *
 * ---- Non-blocking I/O with edge-triggered epoll ---------------------------
 *
 * Every helper clears this thread's OpenSSL error queue first and leaves it
 * empty. *want is set to SL_TLS_WANT_READ or SL_TLS_WANT_WRITE only when
 * the result says "again":
 *
 *   sl_tls_handshake  SL_OK       handshake done (ALPN and peer are known)
 *                     SL_AGAIN    wait for *want (read: EPOLLIN, write: EPOLLOUT)
 *                     SL_ERROR    failed (bad client hello, version below the
 *                                 minimum, no shared ALPN protocol, client
 *                                 certificate missing or untrusted); close
 *   sl_tls_read      > 0          bytes of application data
 *                    0            the peer closed: close_notify or plain EOF
 *                                 (a truncated request is detected by the
 *                                 codec's own framing, as on plaintext)
 *                    -1, EAGAIN   nothing more now; wait for *want
 *                    -1, other    fatal: errno is the socket's error
 *                                 (ECONNRESET...) or EPROTO for TLS errors
 *   sl_tls_write     > 0          bytes taken, possibly fewer than len
 *                                 (partial writes are on: call again at once
 *                                 with the rest, do not wait for an event)
 *                    -1, EAGAIN   wait for *want, then call again with the
 *                                 same bytes (same content, at least the
 *                                 same length; the buffer may move)
 *                    -1, other    fatal (EPIPE after the peer's close_notify)
 *
 * "Again" means the socket itself returned EAGAIN, so an edge will come.
 * With edge-triggered epoll the caller must keep reading until -1/EAGAIN:
 * OpenSSL buffers a whole record, and bytes it holds raise no event. A
 * caller that stops early (its buffer is full) must call sl_tls_read again
 * when it has room, without waiting for EPOLLIN, if sl_tls_has_pending()
 * says so. A read can want a write (TLS 1.3 KeyUpdate answer) and a write
 * a read; renegotiation is refused.
 *
 * Clean close: sl_tls_shutdown sends close_notify once (SL_OK or SL_AGAIN;
 * a caller closing anyway may ignore SL_AGAIN) and does not wait for the
 * peer's. Calling it before SSL_free also keeps a cached session resumable.
 * OpenSSL writes with write(2): the process must ignore SIGPIPE (main.c
 * does). Never call sl_tls_shutdown after SL_ERROR or a fatal -1.
 *
 * ---- Wiring checklist (the connection code) --------------------------------
 *
 *  1. Generation build: one server per https listener, flags SL_TLS_NO_H2
 *     while no HTTP/2 codec serves the connection; a NULL is a refused
 *     snapshot with err as the NACK detail. After publishing the generation,
 *     sl_tls_publish_expiry(its servers) (n = 0 clears the metric).
 *  2. Accept: take the server from the generation current at accept time;
 *     the SSL keeps it alive, so the connection need not hold the
 *     generation. Bound the handshake by the listener's header timeout.
 *  3. Handshake done: sl_tls_alpn() picks the codec (NONE = HTTP/1.1);
 *     sl_tls_peer() once, kept with the connection, becomes
 *     X-Client-Cert-Subject / -SANs / -SHA256 on every request, after
 *     removing whatever the client sent under those names.
 *  4. I/O as above; close: sl_tls_shutdown, SSL_free, close(fd).
 */
#ifndef SL_TLS_H
#define SL_TLS_H

#include "sl_types.h"
#include "sluice/v1/snapshot.pb-c.h"

#include <openssl/ssl.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct sl_tls_server sl_tls_server_t;

/* Build flags. */
#define SL_TLS_NO_H2 0x1u /* drop "h2" from the listener's ALPN list (no HTTP/2 codec) */

#define SL_TLS_WANT_READ 1
#define SL_TLS_WANT_WRITE 2

/*
 * Builds the TLS server of an https listener from the snapshot that holds it
 * (l->tls names certificates in snap->certificates; file-based ones are read
 * now, as are the OCSP response and a client CA file). The first of
 * l->tls->certificates is the default for clients without SNI or with a name
 * no certificate has. Checks every certificate as the validator does
 * (tls_pem.h, at the current time): an expired one fails the build.
 * Main thread. Returns NULL and a message in err on any error.
 */
sl_tls_server_t *sl_tls_server_build(const Sluice__V1__Listener *l,
                                     const Sluice__V1__Snapshot *snap, unsigned flags, char *err,
                                     size_t errlen);

/* Drops the builder's reference (see "Life cycle" above). NULL is a no-op. */
void sl_tls_server_free(sl_tls_server_t *srv);

/* A server-side SSL on an accepted non-blocking socket, in accept state.
 * The caller owns the SSL (SSL_free) and the fd (SSL_free does not close
 * it). NULL on allocation failure. Any thread. */
SSL *sl_tls_server_ssl_new(sl_tls_server_t *srv, int fd);

int sl_tls_handshake(SSL *ssl, int *want);
ssize_t sl_tls_read(SSL *ssl, void *buf, size_t len, int *want);
ssize_t sl_tls_write(SSL *ssl, const void *buf, size_t len, int *want);
int sl_tls_shutdown(SSL *ssl, int *want);

/*
 * A connection's socket I/O, plain (ssl NULL) or TLS, with read(2)/write(2)
 * results: -1 with errno EAGAIN means "wait for the socket's edge". Over TLS
 * a read may need the socket writable first (and a write readable): then
 * *other_way is set, and the caller's event handler must treat the other
 * direction's edge as this one's. Every client and upstream connection of
 * the proxy does its I/O through these two.
 */
ssize_t sl_io_read(int fd, SSL *ssl, void *buf, size_t len, uint8_t *other_way);
ssize_t sl_io_write(int fd, SSL *ssl, const void *buf, size_t len, uint8_t *other_way);

/* True when OpenSSL holds bytes a read would return without the socket. */
bool sl_tls_has_pending(const SSL *ssl);

typedef enum { SL_TLS_ALPN_NONE = 0, SL_TLS_ALPN_HTTP11, SL_TLS_ALPN_H2 } sl_tls_alpn_t;

/* The protocol ALPN chose; NONE when the client offered no ALPN (speak
 * HTTP/1.1 then). Valid after the handshake. */
sl_tls_alpn_t sl_tls_alpn(const SSL *ssl);

/* The verified client certificate, for the X-Client-Cert-* headers the proxy
 * sets (always replacing any the client sent). Every string is printable
 * ASCII (controls, non-ASCII, ',' inside a SAN and '"' escaped as \xHH), so
 * it can go into a header value as is; too long a value is cut and
 * `truncated` set. */
typedef struct sl_tls_peer {
    char subject[512];   /* RFC 2253: "CN=client-1,O=Example" */
    char sans[1024];     /* "DNS:a.example,URI:spiffe://x/y,email:a@b,IP:10.0.0.1" */
    char sha256_hex[65]; /* of the certificate's DER, lower-case hex */
    bool truncated;
} sl_tls_peer_t;

/* SL_OK with *out filled when the client presented a certificate that
 * verified against the listener's CA bundle; SL_DECLINED when it presented
 * none (clientAuth optional, or not configured). Valid after the handshake,
 * also on a resumed session. Costs a few microseconds: call once per
 * connection and keep the result. */
int sl_tls_peer(const SSL *ssl, sl_tls_peer_t *out);

/* The Certificate ("namespace/name") this connection was served with, or
 * NULL before the certificate was chosen. Points into the server, valid
 * while the SSL lives. For logs. */
const char *sl_tls_certificate_name(const SSL *ssl);

/* The certificates a server serves, for the expiry metric. Returns how many
 * there are; fills up to cap entries (pointers into srv). */
typedef struct {
    const char *name;
    int64_t not_after_unix;
} sl_tls_cert_expiry_t;
size_t sl_tls_server_certificates(const sl_tls_server_t *srv, sl_tls_cert_expiry_t *out,
                                  size_t cap);

/* Publishes the certificates of a generation's servers (each name once) as
 * sluice_certificate_expiry_seconds{certificate} (control/metrics.h),
 * replacing the previous set; NULL entries (plaintext listeners) are
 * skipped, n = 0 clears it. Main thread, when the generation is published.
 * SL_OK or SL_ERROR (memory; the previous set stays). */
int sl_tls_publish_expiry(sl_tls_server_t *const *servers, size_t n);

/* Makes a new current ticket key for the listener now (the oldest key is
 * dropped). For tests and for an operator's forced rotation. SL_OK, or
 * SL_DECLINED when no live server of that listener uses tickets. */
int sl_tls_tickets_rotate(const char *listener);

#endif
