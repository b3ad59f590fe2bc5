/*
 * The config stream server: gRPC core C API, one bidirectional call per
 * runtime (ConfigDiscovery.Stream). A completion-queue thread does the gRPC
 * I/O and decodes requests; everything the core decides runs on the main
 * thread, which gets the stream events through a queue and an eventfd on its
 * event_base. Sends may be queued from the main thread; they go out one at a
 * time per call (gRPC allows one SEND_MESSAGE in flight per call).
 *
 * Not here: what to send when (core.c).
 */
#ifndef SL_STREAM_H
#define SL_STREAM_H

#include "sluice/v1/discovery.pb-c.h"

#include <grpc/grpc.h>

struct event_base;
typedef struct sl_stream_server sl_stream_server_t;
typedef struct sl_stream sl_stream_t;

/* Called on the main thread. A stream is valid from on_open until on_close
 * returns. */
typedef struct {
    void (*on_open)(void *ctx, sl_stream_t *s);
    /* Takes ownership of req (protobuf_c_message_free_unpacked). */
    void (*on_request)(void *ctx, sl_stream_t *s, Sluice__V1__DiscoveryRequest *req);
    void (*on_close)(void *ctx, sl_stream_t *s);
    void *ctx;
} sl_stream_hooks_t;

/* TLS of the stream port; PEM texts, copied by sl_stream_server_start. */
typedef struct {
    const char *cert_pem, *key_pem; /* server chain and key; NULL cert_pem = plaintext */
    /* CA of the runtimes' client certificates; NULL = none asked for. With
     * it, every stream is either refused on open (no certificate) or
     * carries the certificate's names (sl_stream_peer_certificate_*). */
    const char *client_ca_pem;
} sl_stream_tls_t;

/* addr "127.0.0.1:18000" (":0" picks a port); tls NULL = plaintext. NULL
 * with err set. */
sl_stream_server_t *sl_stream_server_start(struct event_base *base, const char *addr,
                                           const sl_stream_tls_t *tls,
                                           const sl_stream_hooks_t *hooks, char *err,
                                           size_t errlen);
int sl_stream_server_port(const sl_stream_server_t *srv);
/* Past max_streams open streams a new one ends at once with
 * RESOURCE_EXHAUSTED; new streams are accepted at most accepts_per_second
 * (the rest wait in order). 0 = no limit. Any thread, any time. */
void sl_stream_server_set_limits(sl_stream_server_t *srv, unsigned max_streams,
                                 unsigned accepts_per_second);

/* Stops accepting, ends every call with UNAVAILABLE (runtimes reconnect to
 * the next controller), waits for the queue thread and frees everything. */
void sl_stream_server_stop(sl_stream_server_t *srv);

/* Queues a message (takes ownership of bb). Main thread. Dropped silently
 * when the call is already over (on_close follows). */
void sl_stream_send(sl_stream_t *s, grpc_byte_buffer *bb);

/* Ends the call with a status (e.g. ALREADY_EXISTS when a newer stream of
 * the same node replaces it); queued messages are dropped. Main thread.
 * on_close follows once gRPC has finished the call. */
void sl_stream_close(sl_stream_t *s, grpc_status_code code, const char *msg);

/* Messages queued but not yet handed to gRPC, for "slow runtime" checks. */
unsigned sl_stream_queued(const sl_stream_t *s);

/* Peer address ("ipv4:127.0.0.1:53412"). */
const char *sl_stream_peer(const sl_stream_t *s);

/* 1 when the server was started with a client CA: every stream must come
 * with a client certificate, whose names are below. */
int sl_stream_client_auth(const sl_stream_t *s);
/* 1 when the peer presented a certificate (verified against the client CA
 * by the handshake). */
int sl_stream_peer_has_certificate(const sl_stream_t *s);
/* 1 when `id` is one of the certificate's DNS SANs (ASCII case-insensitive)
 * or URI SANs (exact; fleet URIs below excepted), or its CN when the
 * certificate has no SAN at all. Wildcards are not expanded: "*.example"
 * matches only "*.example". */
int sl_stream_peer_certificate_matches(const sl_stream_t *s, const char *id);
/* URI SANs "sluice:fleet:NAME" bind a certificate to fleets: with any of
 * them, a node may only join one of those fleets (1 when `fleet` is one, or
 * when the certificate names no fleet at all). */
#define SL_STREAM_FLEET_URI_PREFIX "sluice:fleet:"
int sl_stream_peer_certificate_allows_fleet(const sl_stream_t *s, const char *fleet);
/* 1 when the names are the CN (the certificate has no SAN). */
int sl_stream_peer_certificate_uses_cn(const sl_stream_t *s);
/* The names for messages and logs: "DNS:node-a, URI:spiffe://x/node-a",
 * "CN:node-a", or why there are none. Printable ASCII. */
const char *sl_stream_peer_certificate_text(const sl_stream_t *s);

void sl_stream_set_user(sl_stream_t *s, void *user);
void *sl_stream_user(const sl_stream_t *s);

#endif
