/*
 * HTTP/2 server codec (RFC 9113) on nghttp2: bytes from a client in, bytes
 * for the client out, and callbacks up with protocol-independent request
 * heads (sl_req_head_t, request.h). It does no I/O and owns no socket: the
 * glue (plain TCP or TLS with ALPN "h2", or an h2c listener with prior
 * knowledge) reads into sl_h2_conn_feed, writes what sl_h2_conn_flush_into
 * leaves in its buffer, and runs the timers this codec only reports.
 *
 * Rule, as for HTTP/1.1 (http1.h): anything two implementations could read
 * differently is refused. A malformed request (RFC 9113 8.1.1: pseudo-header
 * fields missing, unknown, repeated or after regular fields; connection-
 * specific fields; "te" other than "trailers"; upper-case or invalid names;
 * CR, LF or NUL in values; Content-Length not matching the DATA) is a stream
 * error, RST_STREAM PROTOCOL_ERROR, and never reaches the callbacks; frame-
 * level violations are connection errors (GOAWAY), as the RFC says.
 *
 * Ownership and lifetimes
 *   - sl_h2_conn_t is the caller's from sl_h2_conn_new to sl_h2_conn_free;
 *     the callbacks struct and `user` must outlive it (the struct is copied,
 *     `user` is not touched).
 *   - Request heads, fields and DATA passed to callbacks are slices of the
 *     codec's per-connection scratch or of the caller's input: valid only
 *     during the callback. Copy what must live longer.
 *   - Response fields, trailers and body bytes passed to sl_h2_* are copied
 *     before the call returns.
 *   - Every stream announced by on_request gets exactly one on_stream_close,
 *     at the latest from sl_h2_conn_free (then with SL_H2_CANCEL). Streams the
 *     codec refused or answered itself (431) are never announced.
 *
 * Memory bounds (all per connection; defaults in sl_h2_settings_t)
 *   - request header block: max_header_list_bytes of copied fields (+ the
 *     joined cookie), max_header_fields entries; the copy is freed after its
 *     block if it grew past 8 KiB, everything once no stream is open (an idle
 *     connection holds ~26 KB, nearly all of it nghttp2's session);
 *   - request bodies: never buffered here. on_data passes slices of the input;
 *     what the glue holds is bounded by the flow-control windows we advertise
 *     (stream_window_bytes per stream, conn_window_bytes in all), because no
 *     window is credited back until the glue calls sl_h2_consume;
 *   - response bodies: stream_send_buffer_bytes per stream and
 *     conn_send_buffer_bytes over all streams; sl_h2_stream_write takes what
 *     fits and on_stream_writable says when to write again;
 *   - output: nghttp2 holds at most one serialised frame; the rest of what we
 *     would send stays as unframed bytes in the stream buffers, and the
 *     control frames nghttp2 queues are bounded by max_outbound_ack (PING and
 *     SETTINGS ACKs) and by the aborted-stream limit (RST_STREAM).
 *
 * Threading: one connection, one worker thread; nothing is shared.
 * Re-entrancy: callbacks run inside sl_h2_conn_feed (requests, data,
 * trailers, closes), sl_h2_conn_flush_into (closes, once our END_STREAM or
 * RST_STREAM has been framed; on_stream_writable) and sl_h2_conn_free
 * (closes). From a callback the glue may submit, write, consume, reset and
 * GOAWAY; it must not feed, flush or free the connection (feed and flush
 * then return SL_AGAIN).
 *
 * What the glue does
 *   1. feed every byte read (the first bytes may be tested with
 *      sl_h2_is_preface on an h2c port); SL_ERROR: flush once, close;
 *   2. after every feed and every submit/write, flush into its output buffer
 *      (capacity >= SL_H2_MIN_OUT_BYTES) and write that buffer to the socket;
 *   3. sl_h2_consume once request body bytes have left for the upstream;
 *   4. pause the upstream read when sl_h2_stream_write takes less than it was
 *      given, and resume on on_stream_writable;
 *   5. close when !sl_h2_conn_want_read && !sl_h2_conn_want_write;
 *   6. timers, from the queries below: idle (sl_h2_conn_idle: no stream open,
 *      then GOAWAY and close), request header (sl_h2_conn_header_block_since:
 *      a header block left unfinished), zero-window stall
 *      (sl_h2_conn_oldest_stall: reset that stream), and the socket write
 *      timeout while the output buffer cannot drain (a client that does not
 *      read at all);
 *   7. drain: sl_h2_goaway(conn, 1), keep serving the streams in flight.
 *
 * Not here: sockets, TLS and ALPN (net/), translating to HTTP/1.1 upstream
 * requests and the request's life (proxy/), HTTP/2 to upstreams.
 */
#ifndef SL_H2_H
#define SL_H2_H

#include "sl_types.h"
#include "buf.h"
#include "request.h"

#include <sys/types.h>

/* RFC 9113 7 error codes used by the API (the others pass through). */
#define SL_H2_NO_ERROR 0x0u
#define SL_H2_PROTOCOL_ERROR 0x1u
#define SL_H2_INTERNAL_ERROR 0x2u
#define SL_H2_FLOW_CONTROL_ERROR 0x3u
#define SL_H2_REFUSED_STREAM 0x7u
#define SL_H2_CANCEL 0x8u
#define SL_H2_COMPRESSION_ERROR 0x9u
#define SL_H2_ENHANCE_YOUR_CALM 0xbu

/* The glue's output buffer must hold one whole DATA frame (16 KiB payload +
 * 9 bytes of frame header), or a frame could never be written. */
#define SL_H2_MIN_OUT_BYTES (16384 + 9)

/*
 * Limits. A zero field takes its default (in brackets); every one is enforced
 * by the codec and has a unit test (docs/security.md, "HTTP/2"). Frames of
 * unknown types are ignored uncounted: they cost the client what they cost
 * us and ask for nothing back.
 */
typedef struct sl_h2_settings {
    uint32_t max_concurrent_streams;        /* [100] SETTINGS; the 101st: REFUSED_STREAM */
    uint32_t stream_window_bytes;           /* [65535] request body bytes per stream we let in
                                             * before sl_h2_consume */
    uint32_t conn_window_bytes;             /* [1 MiB] the same over all streams */
    uint32_t max_header_list_bytes;         /* [65536] RFC 9113 size (name+value+32 each) of a
                                             * request's fields: over it, 431 and the stream ends;
                                             * a block whose encoded size passes it by 16 KiB
                                             * is a connection error (ENHANCE_YOUR_CALM) */
    uint32_t max_header_fields;             /* [100] fields of a block, pseudo-fields included */
    uint32_t max_continuations;             /* [8] CONTINUATION frames per block: more is a
                                             * connection error */
    uint32_t header_table_bytes;            /* [4096] HPACK decoder table the client may use;
                                             * a larger size update: COMPRESSION_ERROR */
    uint32_t deflate_table_bytes;           /* [4096] our encoder's table, whatever the client
                                             * allows */
    uint32_t max_settings_entries;          /* [32] per SETTINGS frame */
    uint32_t max_outbound_ack;              /* [128] PING/SETTINGS ACKs queued while the client
                                             * does not read: more is a connection error */
    uint32_t ctrl_frames_max;               /* [1000] PING, SETTINGS, PRIORITY, GOAWAY frames
                                             * and RST_STREAM of finished streams per window */
    uint32_t ctrl_window_ms;                /* [10000] */
    uint32_t aborted_streams_max;           /* [200] streams the client ended early (RST_STREAM
                                             * before our response ended) or made us reset
                                             * (stream errors, 431) per window: rapid reset,
                                             * CVE-2023-44487, and CVE-2025-8671 */
    uint32_t aborted_window_ms;             /* [10000] */
    uint32_t empty_data_max;                /* [100] consecutive DATA frames with no payload and
                                             * no END_STREAM */
    uint32_t window_updates_per_data_frame; /* [10] WINDOW_UPDATEs received: at most
                                             * 64 + this x (DATA frames sent + requests
                                             * + 1) */
    uint32_t stream_send_buffer_bytes;      /* [65536] response body bytes held per stream */
    uint32_t conn_send_buffer_bytes;        /* [524288] the same over all streams (raised to
                                             * stream_send_buffer_bytes if lower) */
    uint32_t max_response_header_bytes;     /* [65536] fields of one submit_response/trailers */
    uint32_t drain_stream_id;               /* [0x7fff0000] a request at or above this id starts
                                             * a graceful GOAWAY: ids end at 2^31-1 */
    uint8_t enable_connect_protocol;        /* [1] RFC 8441 extended CONNECT (:protocol,
                                             * WebSocket over HTTP/2); SL_H2_OFF: not
                                             * advertised, a :protocol is a stream error */
} sl_h2_settings_t;

/* A flag of sl_h2_settings_t whose default is on, turned off. */
#define SL_H2_OFF 0xffu

/* What on_request says besides the head. */
#define SL_H2_REQ_END_STREAM 0x1u       /* no body follows */
#define SL_H2_REQ_EXTENDED_CONNECT 0x2u /* CONNECT with :protocol (RFC 8441) */

typedef struct {
    unsigned flags;    /* SL_H2_REQ_* */
    sl_str_t scheme;   /* :scheme, empty for a plain CONNECT */
    sl_str_t protocol; /* :protocol of an extended CONNECT ("websocket"), else empty */
} sl_h2_req_info_t;

typedef struct {
    /*
     * A complete, valid request head. head->version is 20; host is the
     * :authority (or, without one, the Host field) without the port, and
     * authority the whole value; path/query split :path at the first '?';
     * target is :path; headers are the regular fields in order (Host and
     * Content-Length included, several Cookie fields joined into the first
     * with "; "); has_length/content_length from Content-Length, or 0 known
     * when END_STREAM came with the head.
     */
    void (*on_request)(void *user, int32_t stream_id, const sl_req_head_t *head,
                       const sl_h2_req_info_t *info);
    /* Request body bytes (n > 0, end_stream 0), or the end of the body
     * (p NULL, n 0, end_stream 1). Credit them with sl_h2_consume. */
    void (*on_data)(void *user, int32_t stream_id, const uint8_t *p, size_t n, int end_stream);
    /* Request trailers (optional; dropped when NULL). on_data(end) follows. */
    void (*on_trailers)(void *user, int32_t stream_id, const sl_header_t *fields, size_t n);
    /* The stream is gone: ended both ways (SL_H2_NO_ERROR), reset by either
     * side (its code), or the connection went away (SL_H2_CANCEL). The
     * stream id is invalid for the sl_h2_* calls afterwards. */
    void (*on_stream_close)(void *user, int32_t stream_id, uint32_t error_code);
    /* Room again in the stream's send buffer after a short sl_h2_stream_write. */
    void (*on_stream_writable)(void *user, int32_t stream_id);
    /* Optional: a request the codec answered itself (431), for metrics/logs. */
    void (*on_reject)(void *user, int32_t stream_id, int status, const char *reason);
    /* Optional clock, milliseconds, monotonic; default CLOCK_MONOTONIC. */
    uint64_t (*now_ms)(void *user);
} sl_h2_callbacks_t;

typedef struct sl_h2_conn sl_h2_conn_t;

/*
 * The first bytes of an h2c connection: SL_OK when they are the client
 * preface "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", SL_AGAIN when they are a
 * prefix of it, SL_DECLINED otherwise (HTTP/1.1).
 */
int sl_h2_is_preface(const uint8_t *p, size_t n);

/*
 * A server connection; queues our SETTINGS (and the connection window
 * update), so flush after it. `s` NULL: defaults. NULL on allocation
 * failure. The caller owns the result.
 */
sl_h2_conn_t *sl_h2_conn_new(const sl_h2_settings_t *s, const sl_h2_callbacks_t *cb, void *user);

/* Calls on_stream_close (SL_H2_CANCEL) for every announced open stream,
 * then frees everything. Not from a callback. NULL is fine. */
void sl_h2_conn_free(sl_h2_conn_t *c);

/* The settings in force (defaults filled in). */
const sl_h2_settings_t *sl_h2_conn_settings(const sl_h2_conn_t *c);

/*
 * Bytes from the client, the preface first. Returns len (everything is
 * consumed), SL_AGAIN when called from a callback, or SL_ERROR after a
 * connection error: a GOAWAY is pending, flush once and close.
 */
ssize_t sl_h2_conn_feed(sl_h2_conn_t *c, const uint8_t *in, size_t len);

/*
 * Frames what is ready into out's free space, never more (the buffer never
 * grows here; a frame that does not fit waits for the next call). Then
 * refreshes stall times and calls on_stream_writable where room freed up.
 * SL_OK, SL_AGAIN from a callback, SL_ERROR on a fatal nghttp2 error.
 */
int sl_h2_conn_flush_into(sl_h2_conn_t *c, sl_buf_t *out);

int sl_h2_conn_want_read(const sl_h2_conn_t *c);
int sl_h2_conn_want_write(const sl_h2_conn_t *c);

/* 1 when no stream is open and no header block is half received. */
int sl_h2_conn_idle(const sl_h2_conn_t *c);

/* When (now_ms clock) an unfinished header block began, 0 if none. */
uint64_t sl_h2_conn_header_block_since(const sl_h2_conn_t *c);

/*
 * The stream whose response has waited longest for the client's flow-
 * control window (stream or connection window at zero while we have bytes
 * for it); *since_ms gets when the wait began. 0 (and *since_ms 0) if none.
 */
int32_t sl_h2_conn_oldest_stall(const sl_h2_conn_t *c, uint64_t *since_ms);

/* How long (ms) this stream has waited for window, 0 when it is not. */
uint64_t sl_h2_stream_stalled_ms(sl_h2_conn_t *c, int32_t stream_id);

/* Request body bytes delivered by on_data that the glue has forwarded: the
 * client may send that many again. Extra or late calls are ignored. */
void sl_h2_consume(sl_h2_conn_t *c, int32_t stream_id, size_t n);

/*
 * Response head: status 100..599 but not 101. A 1xx is interim (any number,
 * before the final one). Field names are sent lower-cased; connection-
 * specific fields (connection, keep-alive, proxy-connection,
 * transfer-encoding, upgrade) are dropped; a name that is not a token or a
 * value with CR, LF or NUL is SL_ERROR (nothing sent). end_stream: no body.
 * SL_OK, SL_DECLINED (the stream is gone), SL_ERROR (misuse, limits).
 */
int sl_h2_submit_response(sl_h2_conn_t *c, int32_t stream_id, int status, const sl_header_t *fields,
                          size_t n, int end_stream);

/*
 * Appends response body bytes to the stream's send buffer: returns how many
 * it took (possibly 0; then on_stream_writable follows), SL_DECLINED when
 * the stream is gone, SL_ERROR before a final response or after the end.
 * end_stream applies only when all n bytes were taken.
 */
ssize_t sl_h2_stream_write(sl_h2_conn_t *c, int32_t stream_id, const uint8_t *p, size_t n,
                           int end_stream);

/* Ends the response with trailers (gRPC's grpc-status), after the body
 * bytes already written. Same rules and results as sl_h2_submit_response. */
int sl_h2_submit_trailers(sl_h2_conn_t *c, int32_t stream_id, const sl_header_t *fields, size_t n);

/* RST_STREAM with the code; on_stream_close follows. SL_OK or SL_DECLINED.
 * NO_ERROR after a final response (RFC 9113 8.1: a complete response, then
 * "stop sending the request") waits until that response has ended. */
int sl_h2_reset_stream(sl_h2_conn_t *c, int32_t stream_id, uint32_t error_code);

/*
 * graceful: GOAWAY NO_ERROR with the last stream we accepted; streams in
 * flight finish, new ones are refused (the client retries them elsewhere,
 * RFC 9113 6.8); want_read/want_write go to 0 once the last one ends.
 * Not graceful: GOAWAY NO_ERROR and the connection ends after it is sent.
 */
void sl_h2_goaway(sl_h2_conn_t *c, int graceful);

/* Counters, for tests and metrics. */
typedef struct {
    uint64_t requests;        /* announced by on_request */
    uint64_t rejected;        /* answered by the codec (431) */
    uint64_t aborted_streams; /* counted towards aborted_streams_max */
    uint32_t open_streams;
    uint32_t send_buffered;   /* response bytes held over all streams */
    uint32_t send_buffer_max; /* the most any one stream ever held */
    uint32_t goaway_code;     /* of our GOAWAY, if one was sent for an error */
    uint8_t goaway_sent;
} sl_h2_stats_t;

void sl_h2_conn_stats(const sl_h2_conn_t *c, sl_h2_stats_t *st);

#endif
