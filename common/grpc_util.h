/*
 * protobuf-c messages in and out of gRPC byte buffers, shared by the
 * controller's stream server and the runtime's stream client.
 */
#ifndef SL_GRPC_UTIL_H
#define SL_GRPC_UTIL_H

#include <grpc/byte_buffer.h>
#include <protobuf-c/protobuf-c.h>
#include <stdint.h>

/* A new byte buffer holding the packed message (NULL on allocation failure). */
grpc_byte_buffer *sl_grpc_pack(const ProtobufCMessage *msg);

/* Unpacks a whole byte buffer into a message of descriptor d (free with
 * protobuf_c_message_free_unpacked); NULL when the bytes are not a valid
 * message. Does not destroy bb. */
ProtobufCMessage *sl_grpc_unpack(const ProtobufCMessageDescriptor *d, grpc_byte_buffer *bb);

/* Method path of the config stream. */
#define SL_GRPC_STREAM_METHOD "/sluice.v1.ConfigDiscovery/Stream"

/* Type URLs of the resource types, in push order (make before break:
 * certificates before the Backends and listeners that name them, Consumers
 * before the routes whose policies match them, backends before the routes
 * that use them, listeners last so a port opens only when its routes
 * exist). Secrets are Envoy's SDS: certificates and their keys. */
#define SL_TYPE_SECRET "type.sluice.dev/sluice.v1.TlsCertificate"
#define SL_TYPE_CONSUMER "type.sluice.dev/sluice.v1.Consumer"
#define SL_TYPE_CLUSTER "type.sluice.dev/sluice.v1.Cluster"
#define SL_TYPE_SETTINGS "type.sluice.dev/sluice.v1.GatewaySettings"
#define SL_TYPE_ROUTE "type.sluice.dev/sluice.v1.RouteTable"
#define SL_TYPE_LISTENER "type.sluice.dev/sluice.v1.Listener"

enum sl_xds_type {
    SL_XDS_SECRET = 0,
    SL_XDS_CONSUMER,
    SL_XDS_CLUSTER,
    SL_XDS_SETTINGS,
    SL_XDS_ROUTE,
    SL_XDS_LISTENER,
    SL_XDS__COUNT
};
extern const char *const sl_xds_type_urls[SL_XDS__COUNT];
extern const char *const sl_xds_type_names[SL_XDS__COUNT]; /* "clusters", ... */
int sl_xds_type_from_url(const char *url);                 /* -1 when unknown */

/*
 * Versions on the stream (version_info) are decimal integers from 1 to
 * 2^53 - 1 ("0" reads as none), so that they stay exact in JSON (/api/v1/status, /config_dump)
 * whatever parses it; "" means "none yet". Anything else (a sign, spaces,
 * hex, a number past the bound) is refused rather than read as 0, which
 * would silently mean "nothing applied".
 */
#define SL_XDS_VERSION_MAX 9007199254740991ULL /* 2^53 - 1 */
/* 0 with *out set (0 for ""), or -1 when `s` is not a valid version. */
int sl_xds_version_parse(const char *s, uint64_t *out);

#endif
