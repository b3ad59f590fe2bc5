/*
 * TLS to upstreams (OpenSSL 3): one client SSL_CTX per Backend with `tls`,
 * built with the generation, and a client SSL per upstream connection.
 *
 * Verification is always on: the chain against the Backend's CA (PEM or
 * file) or the system's CAs, and the name: the Backend's `sni`, or else the
 * endpoint's address (a DNS name is checked against the certificate's DNS
 * names, an IP literal against its IP addresses). The same name goes out as
 * SNI when it is a DNS name. TLS 1.2 at least; ALPN offers http/1.1 (the
 * upstream exchange speaks HTTP/1.1). A client certificate (mTLS to the
 * backend) comes from a Certificate of the snapshot.
 *
 * Ownership: the generation owns the SSL_CTX (SSL_CTX_free when it is
 * freed); every SSL made from it holds OpenSSL's own reference on it, so a
 * pooled connection outlives the generation that opened it safely.
 * Handshake, read and write use net/tls.h's helpers (they work for both
 * sides). Not here: sockets, pools, HTTP (proxy/upstream.c, exchange.c).
 */
#ifndef SL_TLS_CLIENT_H
#define SL_TLS_CLIENT_H

#include "sluice/v1/snapshot.pb-c.h"

#include <openssl/ssl.h>
#include <stddef.h>

/* The client context of a Backend's `tls`; NULL with err (naming the
 * Backend's field, never key material) when it cannot be built. Main
 * thread. */
SSL_CTX *sl_tls_client_ctx_build(const Sluice__V1__Cluster *cl, const Sluice__V1__Snapshot *snap,
                                 char *err, size_t errlen);

/* A client SSL on a connected (or connecting) non-blocking socket, verifying
 * `name` (a DNS name or an IP literal) and sending it as SNI when it is a
 * DNS name. The caller owns the SSL. NULL on allocation failure. */
SSL *sl_tls_client_ssl_new(SSL_CTX *ctx, int fd, const char *name);

#endif
