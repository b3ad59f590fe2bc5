/*
 * HTTP/1.1 message-head parsing and body framing (RFC 9110, RFC 9112), for
 * requests from clients and responses from upstreams. Pure functions over
 * caller-owned bytes: no I/O, no allocation. The parser is strict: anything
 * that two HTTP implementations could frame differently (request smuggling)
 * is an error, answered 400 by the caller, which then closes the connection.
 *
 * Not here: routing, header rewriting, the socket state machine (proxy.c).
 */
#ifndef SL_HTTP1_H
#define SL_HTTP1_H

#include "sl_types.h"

#include <sys/types.h>

typedef struct {
    sl_str_t name;
    sl_str_t value; /* leading/trailing OWS removed */
} sl_http1_header_t;

enum sl_http1_body {
    SL_HTTP1_BODY_NONE = 0,
    SL_HTTP1_BODY_LENGTH,  /* Content-Length bytes follow */
    SL_HTTP1_BODY_CHUNKED, /* Transfer-Encoding: chunked (last coding) */
    SL_HTTP1_BODY_CLOSE,   /* responses only: body ends when the upstream closes */
};

/* Well-known methods as bits, for routing and for the Allow header. */
enum sl_http_method {
    SL_METHOD_OTHER = 0,
    SL_METHOD_GET = 1u << 0,
    SL_METHOD_HEAD = 1u << 1,
    SL_METHOD_POST = 1u << 2,
    SL_METHOD_PUT = 1u << 3,
    SL_METHOD_DELETE = 1u << 4,
    SL_METHOD_PATCH = 1u << 5,
    SL_METHOD_OPTIONS = 1u << 6,
    SL_METHOD_TRACE = 1u << 7,
    SL_METHOD_CONNECT = 1u << 8,
};

/* Limits applied while parsing; a head over a limit is an error with the
 * status the caller answers (414 request line, 431 headers). */
typedef struct {
    uint32_t max_request_line_bytes; /* e.g. 8192 */
    uint32_t max_header_bytes;       /* whole head incl. request line, e.g. 32768 */
    uint32_t max_header_count;       /* <= capacity of the headers array */
} sl_http1_limits_t;

/* Flags set by the parser from the Connection/Expect/Upgrade headers. */
#define SL_HTTP1_F_KEEP_ALIVE (1u << 0)      /* connection may persist after this message */
#define SL_HTTP1_F_EXPECT_CONTINUE (1u << 1) /* Expect: 100-continue */
#define SL_HTTP1_F_UPGRADE (1u << 2)         /* Upgrade header present */
#define SL_HTTP1_F_CONN_CLOSE (1u << 3)      /* Connection: close seen */
#define SL_HTTP1_F_HAS_QUERY (1u << 4)       /* the target had a '?', even with an empty query */
#define SL_HTTP1_F_ABSOLUTE_FORM (1u << 5)   /* absolute-form target: authority is the host */

typedef struct {
    /* out */
    sl_str_t method;
    unsigned method_bit;        /* enum sl_http_method, SL_METHOD_OTHER if unknown */
    sl_str_t target;            /* as sent: origin-form "/p?q" or absolute-form "http://a/p?q" */
    sl_str_t path;              /* path up to '?' ("/" for an absolute-form target without one) */
    sl_str_t query;             /* after '?', without it; len 0 if none */
    int minor_version;          /* 0 or 1 */
    sl_http1_header_t *headers; /* in: array of capacity num_headers */
    size_t num_headers;         /* in: capacity; out: count */
    sl_str_t host;              /* Host header value (required for 1.1), without port; for an
                                 * absolute-form target, the target's host instead (RFC 9112
                                 * 3.2.2: the Host header is then ignored) */
    sl_str_t authority;         /* host[:port]: an absolute-form target's, else the Host
                                 * field as sent (empty without one) */
    enum sl_http1_body body;
    uint64_t content_length;
    unsigned flags;  /* SL_HTTP1_F_* */
    size_t head_len; /* bytes of request line + headers + final CRLF */
    /* on error */
    int error_status;  /* 400, 414, 431, 501 (unknown transfer coding), 505 */
    const char *error; /* static string saying what was wrong */
} sl_http1_request_t;

typedef struct {
    int status; /* 100..599 */
    sl_str_t reason;
    int minor_version;
    sl_http1_header_t *headers;
    size_t num_headers;
    enum sl_http1_body body;
    uint64_t content_length;
    unsigned flags; /* SL_HTTP1_F_KEEP_ALIVE / CONN_CLOSE */
    size_t head_len;
    const char *error;
} sl_http1_response_t;

/*
 * Parses a request head at buf[0..len). Returns:
 *   > 0       complete: the head length (also in req->head_len)
 *   SL_AGAIN  incomplete and within limits: read more and call again with the
 *             whole buffer (parsing restarts from buf[0])
 *   SL_ERROR  malformed or over a limit: req->error_status and req->error set
 * Rejected with 400: bare CR or LF, NUL or other CTLs, obs-fold, whitespace
 * before the colon or in the name, both Content-Length and Transfer-Encoding,
 * several differing or invalid Content-Length values, Transfer-Encoding whose
 * last coding is not chunked, chunked applied twice, missing Host in 1.1,
 * several Host headers, asterisk-form for non-OPTIONS, absolute-form with a
 * scheme other than http/https, with userinfo or with an empty host.
 * 501 for a transfer coding other than chunked; 505 for HTTP versions other
 * than 1.0 / 1.1.
 */
ssize_t sl_http1_parse_request(const char *buf, size_t len, const sl_http1_limits_t *limits,
                               sl_http1_request_t *req);

/*
 * Parses an upstream response head. `request_method_bit` decides framing of
 * responses to HEAD (no body); 1xx, 204 and 304 never have a body. Returns
 * like sl_http1_parse_request (SL_ERROR means a bad upstream response: 502).
 */
ssize_t sl_http1_parse_response(const char *buf, size_t len, unsigned request_method_bit,
                                size_t max_head_bytes, sl_http1_response_t *resp);

/*
 * Chunked framing scanner, for forwarding a chunked body verbatim while
 * checking it: walks chunk-size lines, data, CRLFs, the last chunk and the
 * trailer section. Keeps its position across calls, so the body may arrive in
 * any split.
 */
typedef struct {
    int state;              /* private */
    uint64_t chunk_left;    /* private */
    uint32_t line_bytes;    /* private: bytes of the current size/trailer line */
    uint32_t trailer_bytes; /* private */
    uint64_t data_bytes;    /* out: payload bytes seen so far (for body limits) */
    const char *error;      /* out, on SL_ERROR */
    /* Optional, set after sl_http1_chunked_init: sl_http1_chunked_decode
     * copies the trailer field lines ("Name: value\r\n"..., not the final
     * CRLF) here, for a client that takes them in another form (HTTP/2). */
    char *trailer_out;
    uint32_t trailer_cap;
    uint32_t trailer_len; /* out; > trailer_cap: they did not fit (none kept) */
} sl_http1_chunked_t;

void sl_http1_chunked_init(sl_http1_chunked_t *c);

/*
 * Scans buf[0..len). Returns the number of bytes that belong to the body
 * (<= len; the rest, if any, is the next message), sets *done to 1 once the
 * final CRLF after the trailers has been consumed, or returns SL_ERROR on bad
 * framing (invalid hex, size overflow, missing CRLF, over-long lines).
 */
ssize_t sl_http1_chunked_scan(sl_http1_chunked_t *c, const char *buf, size_t len, int *done);

/*
 * Like sl_http1_chunked_scan, but also removes the framing, for clients that
 * cannot take chunked coding (HTTP/1.0): the payload bytes found in
 * buf[0..len) are moved to the front of buf and *payload says how many.
 * Returns the bytes of buf that belonged to the body, or SL_ERROR.
 */
ssize_t sl_http1_chunked_decode(sl_http1_chunked_t *c, char *buf, size_t len, size_t *payload,
                                int *done);

/* Case-insensitive header lookup; returns the first match or NULL. */
const sl_http1_header_t *sl_http1_find_header(const sl_http1_header_t *headers, size_t n,
                                              const char *name, size_t name_len);

/* Method name to bit (SL_METHOD_OTHER when not one of the nine). */
unsigned sl_http1_method_bit(const char *name, size_t len);

/* Status code's reason phrase ("Not Found"), "" when unknown. */
const char *sl_http1_reason(int status);

#endif
