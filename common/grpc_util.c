/*
 * gRPC byte buffer <-> protobuf-c (grpc_util.h). The slices are allocated by
 * gRPC so ownership passes cleanly into the call.
 */
#include "grpc_util.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <string.h>

const char *const sl_xds_type_urls[SL_XDS__COUNT] = {SL_TYPE_SECRET,   SL_TYPE_CONSUMER,
                                                     SL_TYPE_CLUSTER,  SL_TYPE_SETTINGS,
                                                     SL_TYPE_ROUTE,    SL_TYPE_LISTENER};
const char *const sl_xds_type_names[SL_XDS__COUNT] = {"secrets", "consumers", "clusters",
                                                      "settings", "routes",   "listeners"};

int sl_xds_type_from_url(const char *url)
{
    for (int i = 0; i < SL_XDS__COUNT; i++)
        if (strcmp(url, sl_xds_type_urls[i]) == 0)
            return i;
    return -1;
}

int sl_xds_version_parse(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    if (!s)
        s = "";
    /* Leading zeros would give two spellings of one version. */
    if (s[0] == '0' && s[1])
        return -1;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9' || p - s >= 16)
            return -1;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (v > SL_XDS_VERSION_MAX)
        return -1;
    *out = v;
    return 0;
}

grpc_byte_buffer *sl_grpc_pack(const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    grpc_slice slice = grpc_slice_malloc(len);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(slice));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    return bb;
}

ProtobufCMessage *sl_grpc_unpack(const ProtobufCMessageDescriptor *d, grpc_byte_buffer *bb)
{
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, bb))
        return NULL;
    grpc_slice slice = grpc_byte_buffer_reader_readall(&reader);
    ProtobufCMessage *msg =
        protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(slice), GRPC_SLICE_START_PTR(slice));
    grpc_slice_unref(slice);
    grpc_byte_buffer_reader_destroy(&reader);
    return msg;
}
