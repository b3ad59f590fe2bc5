/*
 * The table of listener_http2.h. Bounds: a lower bound keeps a listener
 * usable (a 1-byte window or a 1-stream connection is a denial of service
 * against oneself; 0 cannot be written because the snapshot reads 0 as the
 * default), an upper bound keeps each connection's memory bounded and
 * inside what RFC 9113 allows (windows below 2^31).
 */
#include "listener_http2.h"

#include <stdio.h>

#define F(field, yaml, dur, lo, hi, d)                                                             \
    {                                                                                              \
        yaml, #field, offsetof(Sluice__V1__ListenerHttp2, field), dur, lo, hi, d                   \
    }

const sl_listener_http2_field_t sl_listener_http2_fields[SL_LH2__COUNT] = {
    [SL_LH2_MAX_CONCURRENT_STREAMS] =
        F(max_concurrent_streams, "maxConcurrentStreams", false, 1, 10000, 100),
    [SL_LH2_STREAM_WINDOW] =
        F(initial_stream_window_bytes, "initialStreamWindowBytes", false, 1024, 16777216, 65535),
    [SL_LH2_CONN_WINDOW] = F(initial_connection_window_bytes, "initialConnectionWindowBytes", false,
                             65535, 268435456, 1048576),
    [SL_LH2_MAX_HEADER_LIST] =
        F(max_header_list_bytes, "maxHeaderListBytes", false, 1024, 1048576, 65536),
    [SL_LH2_MAX_HEADER_FIELDS] = F(max_header_fields, "maxHeaderFields", false, 8, 1000, 100),
    [SL_LH2_MAX_CONTINUATIONS] =
        F(max_continuation_frames, "maxContinuationFrames", false, 1, 1000, 8),
    [SL_LH2_HEADER_TABLE] = F(header_table_bytes, "headerTableBytes", false, 256, 65536, 4096),
    [SL_LH2_CTRL_FRAMES_MAX] =
        F(max_control_frames_per_window, "maxControlFramesPerWindow", false, 10, 1000000, 1000),
    [SL_LH2_CTRL_WINDOW] = F(control_window_ms, "controlWindow", true, 1000, 600000, 10000),
    [SL_LH2_RESETS_MAX] =
        F(max_reset_streams_per_window, "maxResetStreamsPerWindow", false, 1, 100000, 200),
    [SL_LH2_RESET_WINDOW] = F(reset_window_ms, "resetWindow", true, 1000, 600000, 10000),
    [SL_LH2_EMPTY_DATA_MAX] = F(max_empty_data_frames, "maxEmptyDataFrames", false, 1, 10000, 100),
    [SL_LH2_STREAM_SEND_BUFFER] =
        F(stream_send_buffer_bytes, "streamSendBufferBytes", false, 16384, 16777216, 65536),
    [SL_LH2_CONN_SEND_BUFFER] = F(connection_send_buffer_bytes, "connectionSendBufferBytes", false,
                                  16384, 268435456, 524288),
};
#undef F

/* The codec would quietly raise the connection's send buffer (h2.c,
 * settings_fill) and a connection window below the stream window would cap
 * every stream at it: both are mistakes worth saying. */
const sl_listener_http2_rule_t sl_listener_http2_rules[] = {
    {SL_LH2_CONN_WINDOW, SL_LH2_STREAM_WINDOW},
    {SL_LH2_CONN_SEND_BUFFER, SL_LH2_STREAM_SEND_BUFFER},
    {-1, -1},
};

uint32_t sl_listener_http2_get(const Sluice__V1__ListenerHttp2 *m, int i)
{
    return *(const uint32_t *)((const char *)m + sl_listener_http2_fields[i].pb_offset);
}

void sl_listener_http2_set(Sluice__V1__ListenerHttp2 *m, int i, uint32_t v)
{
    *(uint32_t *)((char *)m + sl_listener_http2_fields[i].pb_offset) = v;
}

int sl_listener_http2_check(const Sluice__V1__ListenerHttp2 *m, char *err, size_t errlen)
{
    for (int i = 0; i < SL_LH2__COUNT; i++) {
        const sl_listener_http2_field_t *f = &sl_listener_http2_fields[i];
        uint32_t v = sl_listener_http2_get(m, i);
        if (v && (v < f->min || v > f->max)) {
            snprintf(err, errlen, "http2.%s: %u is out of range %u..%u (0 = default %u)",
                     f->pb_name, v, f->min, f->max, f->def);
            return -1;
        }
    }
    for (const sl_listener_http2_rule_t *r = sl_listener_http2_rules; r->larger >= 0; r++) {
        const sl_listener_http2_field_t *fl = &sl_listener_http2_fields[r->larger];
        const sl_listener_http2_field_t *fs = &sl_listener_http2_fields[r->smaller];
        uint32_t l = sl_listener_http2_get(m, r->larger), s = sl_listener_http2_get(m, r->smaller);
        if (!l)
            l = fl->def;
        if (!s)
            s = fs->def;
        if (l < s) {
            snprintf(err, errlen, "http2.%s: %u is less than %s (%u)", fl->pb_name, l, fs->pb_name,
                     s);
            return -1;
        }
    }
    return 0;
}
