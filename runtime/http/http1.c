/*
 * HTTP/1.1 message heads and chunked framing (RFC 9110, RFC 9112).
 *
 * Responsible for: turning the bytes of a request head from a client, or of a
 * response head from an upstream, into slices of the caller's buffer plus the
 * facts the proxy needs to frame the body (none / Content-Length / chunked /
 * until close), keep-alive and Expect; and for walking a chunked body so the
 * proxy can forward it verbatim and know exactly where it ends.
 *
 * Not responsible for: I/O, buffering, header rewriting, routing, decoding of
 * percent-escapes or normalisation of the path (the router's job), choosing
 * the response to an error (the caller answers error_status and closes).
 *
 * Design choices, and why:
 * - Strict, because the gateway sits in front of servers that may frame a
 *   message differently from us. Whatever two implementations could read two
 *   ways (CL+TE, repeated CL, obs-fold, bare CR/LF, whitespace before the
 *   colon, chunked not last...) is an error, never "repaired".
 * - Zero-copy and allocation-free: every string out is a slice of `buf`.
 * - Stateless between calls for heads: the caller re-parses from buf[0] once
 *   more bytes arrived. Heads are bounded (max_header_bytes), so the cost of
 *   re-parsing is bounded, and there is no half-parsed state to get wrong.
 *   Because bytes are validated while they are scanned, a malformed prefix is
 *   rejected at once instead of waiting for the end of the head (a client
 *   sending "\n\n" does not get to hold the connection until the timeout).
 * - Hot loops use 256-byte class tables rather than per-byte calls, and SSE2
 *   (always present on x86-64) to skip over header values and targets 16
 *   bytes at a time. The scalar loop is the same code that handles the tail,
 *   so it is exercised by every short value.
 * - On SL_AGAIN and SL_ERROR, `num_headers` is left at the caller's capacity so
 *   that calling again with more bytes needs no reset; it becomes the count
 *   only on success.
 */
#include "http1.h"

#include <limits.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Bounds of the chunked scanner (documented in the config reference as fixed
 * protocol limits): a chunk-size line with its extensions, and the whole
 * trailer section. Real clients send a few bytes of each. */
#define CHUNK_LINE_MAX_BYTES 4096u
#define CHUNK_TRAILER_MAX_BYTES (32u * 1024u)

/* Used when the caller passes no limits. */
static const sl_http1_limits_t default_limits = {
    .max_request_line_bytes = 8192,
    .max_header_bytes = 32768,
    .max_header_count = 100,
};

/* ---- character classes ------------------------------------------------- */

/* tchar (RFC 9110 5.6.2): method, field names, codings, Connection options. */
static const uint8_t tchar_tab[256] = {
    ['!'] = 1, ['#'] = 1, ['$'] = 1, ['%'] = 1,         ['&'] = 1,         ['\''] = 1,
    ['*'] = 1, ['+'] = 1, ['-'] = 1, ['.'] = 1,         ['^'] = 1,         ['_'] = 1,
    ['`'] = 1, ['|'] = 1, ['~'] = 1, ['0' ... '9'] = 1, ['A' ... 'Z'] = 1, ['a' ... 'z'] = 1,
};

/* field-vchar / SP / HTAB: what a field value (and a reason phrase) may hold.
 * Everything else is a CTL (incl. NUL, CR, LF) or DEL. */
static const uint8_t value_tab[256] = {
    ['\t'] = 1,
    [0x20 ... 0x7e] = 1,
    [0x80 ... 0xff] = 1,
};

/* Bytes allowed in an origin-form request-target: VCHAR minus '#'. A fragment
 * is never sent by a conforming client, and raw non-ASCII, SP and CTLs are
 * how targets get split differently by different parsers. */
static const uint8_t target_tab[256] = {
    [0x21 ... 0x22] = 1,
    [0x24 ... 0x7e] = 1,
};

/* Host (RFC 3986 reg-name / IPv4): unreserved, pct-encoded, sub-delims. */
static const uint8_t host_tab[256] = {
    ['-'] = 1, ['.'] = 1,         ['_'] = 1,         ['~'] = 1,         ['%'] = 1,
    ['!'] = 1, ['$'] = 1,         ['&'] = 1,         ['\''] = 1,        ['('] = 1,
    [')'] = 1, ['*'] = 1,         ['+'] = 1,         [','] = 1,         [';'] = 1,
    ['='] = 1, ['0' ... '9'] = 1, ['A' ... 'Z'] = 1, ['a' ... 'z'] = 1,
};

/* Hex digit value + 1; 0 = not a hex digit. */
static const uint8_t hex_tab[256] = {
    ['0'] = 1,  ['1'] = 2,  ['2'] = 3,  ['3'] = 4,  ['4'] = 5,  ['5'] = 6,  ['6'] = 7,  ['7'] = 8,
    ['8'] = 9,  ['9'] = 10, ['A'] = 11, ['B'] = 12, ['C'] = 13, ['D'] = 14, ['E'] = 15, ['F'] = 16,
    ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14, ['e'] = 15, ['f'] = 16,
};

static inline unsigned char lower(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') ? (unsigned char)(c | 0x20) : c;
}

/* Case-insensitive equality with a lower-case literal of the same length. */
static inline int eq_lower(const char *s, size_t len, const char *lit, size_t lit_len)
{
    if (len != lit_len)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (lower((unsigned char)s[i]) != (unsigned char)lit[i])
            return 0;
    return 1;
}

#define EQ_LIT(s, len, lit) eq_lower((s), (len), (lit), sizeof(lit) - 1)

static inline int is_ows(unsigned char c)
{
    return c == ' ' || c == '\t';
}

static inline int is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

/*
 * Returns the first byte in [p, end) that cannot be part of a field value, or
 * end. The SIMD loop flags CTLs and DEL 16 bytes at a time; HTAB is flagged
 * too (it is a CTL) and simply stepped over, as it is rare in real values.
 */
static inline const char *scan_value(const char *p, const char *end)
{
#if defined(__SSE2__)
    const __m128i ctl_max = _mm_set1_epi8(0x1f);
    const __m128i del = _mm_set1_epi8(0x7f);
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        __m128i is_ctl = _mm_cmpeq_epi8(_mm_min_epu8(v, ctl_max), v);
        __m128i is_del = _mm_cmpeq_epi8(v, del);
        unsigned mask = (unsigned)_mm_movemask_epi8(_mm_or_si128(is_ctl, is_del));
        if (mask == 0) {
            p += 16;
            continue;
        }
        p += __builtin_ctz(mask);
        if (*p != '\t')
            return p;
        p++;
    }
#endif
    while (p < end && value_tab[(unsigned char)*p])
        p++;
    return p;
}

/* Same for the request-target: stops at anything outside target_tab (SP
 * ends the target; every other stop byte is an error or needs more input). */
static inline const char *scan_target(const char *p, const char *end)
{
#if defined(__SSE2__)
    const __m128i sp = _mm_set1_epi8(0x20);
    const __m128i tilde = _mm_set1_epi8(0x7e);
    const __m128i hash = _mm_set1_epi8('#');
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        __m128i low = _mm_cmpeq_epi8(_mm_min_epu8(v, sp), v);     /* <= 0x20 */
        __m128i high = _mm_cmpeq_epi8(_mm_max_epu8(v, tilde), v); /* >= 0x7e */
        high = _mm_andnot_si128(_mm_cmpeq_epi8(v, tilde), high);  /* > 0x7e */
        __m128i bad = _mm_or_si128(_mm_or_si128(low, high), _mm_cmpeq_epi8(v, hash));
        unsigned mask = (unsigned)_mm_movemask_epi8(bad);
        if (mask != 0)
            return p + __builtin_ctz(mask);
        p += 16;
    }
#endif
    while (p < end && target_tab[(unsigned char)*p])
        p++;
    return p;
}

/* ---- shared head parsing ----------------------------------------------- */

/* What the header fields said, collected while parsing one head. */
struct head_facts {
    unsigned cl_seen : 1;
    unsigned host_seen : 1;
    unsigned te_seen : 1;
    unsigned te_chunked : 1;      /* chunked appeared (at most once, else error) */
    unsigned te_last_chunked : 1; /* the last coding so far is chunked */
    unsigned te_unknown : 1;      /* a coding other than chunked appeared */
    unsigned conn_close : 1;
    unsigned conn_keep_alive : 1;
    unsigned expect_continue : 1;
    unsigned upgrade : 1;
    uint64_t content_length;
    sl_str_t host;
    sl_str_t host_value; /* the Host field as sent, port included */
};

enum line_result { LINE_FIELD = 1, LINE_END = 0 };

/*
 * Parses one field line (or the empty line ending the head) at *pp, within
 * [*pp, end). Returns LINE_FIELD with *h filled, LINE_END, SL_AGAIN when the
 * line is incomplete, or SL_ERROR with *err. On LINE_FIELD/LINE_END *pp moves
 * past the CRLF.
 */
static inline int parse_field_line(const char **pp, const char *end, sl_http1_header_t *h,
                                   const char **err)
{
    const char *p = *pp;

    if (sl_unlikely(p == end))
        return SL_AGAIN;
    if (*p == '\r') {
        if (end - p < 2)
            return SL_AGAIN;
        if (p[1] != '\n') {
            *err = "bare CR at the end of the head (CRLF required)";
            return SL_ERROR;
        }
        *pp = p + 2;
        return LINE_END;
    }

    const char *name = p;
    while (p < end && tchar_tab[(unsigned char)*p])
        p++;
    if (sl_unlikely(p == end))
        return SL_AGAIN;
    if (sl_unlikely(*p != ':')) {
        unsigned char c = (unsigned char)*p;
        if (p == name && is_ows(c))
            *err = "header line starts with whitespace (obs-fold is not accepted)";
        else if (c == '\n')
            *err = "bare LF in header section (CRLF required)";
        else if (is_ows(c))
            *err = "whitespace between header name and colon";
        else if (c == '\r')
            *err = "header line without a colon";
        else
            *err = "invalid character in header name";
        return SL_ERROR;
    }
    if (sl_unlikely(p == name)) {
        *err = "empty header name";
        return SL_ERROR;
    }
    h->name.ptr = name;
    h->name.len = (size_t)(p - name);
    p++;

    while (p < end && is_ows((unsigned char)*p))
        p++;
    const char *value = p;
    p = scan_value(p, end);
    if (p == end)
        return SL_AGAIN;
    if (sl_unlikely(*p != '\r')) {
        *err = *p == '\n' ? "bare LF in header section (CRLF required)"
                          : "invalid character (NUL or control) in header value";
        return SL_ERROR;
    }
    if (end - p < 2)
        return SL_AGAIN;
    if (sl_unlikely(p[1] != '\n')) {
        *err = "bare CR in header value (CRLF required)";
        return SL_ERROR;
    }
    const char *value_end = p;
    while (value_end > value && is_ows((unsigned char)value_end[-1]))
        value_end--;
    h->value.ptr = value;
    h->value.len = (size_t)(value_end - value);
    *pp = p + 2;
    return LINE_FIELD;
}

/* Content-Length: 1*DIGIT, at most INT64_MAX so that no caller doing signed
 * offset arithmetic can be surprised. Lists ("5, 5") are rejected: they only
 * exist to be read two ways. */
static int parse_content_length(const sl_str_t *v, uint64_t *out, const char **err)
{
    if (v->len == 0) {
        *err = "empty Content-Length";
        return SL_ERROR;
    }
    uint64_t n = 0;
    for (size_t i = 0; i < v->len; i++) {
        unsigned d = (unsigned)(unsigned char)v->ptr[i] - '0';
        if (d > 9) {
            *err = "Content-Length is not a decimal number";
            return SL_ERROR;
        }
        if (n > ((uint64_t)INT64_MAX - d) / 10) {
            *err = "Content-Length too large";
            return SL_ERROR;
        }
        n = n * 10 + d;
    }
    *out = n;
    return SL_OK;
}

/*
 * Walks a comma-separated list of tokens (RFC 9110 5.6.1; empty elements are
 * allowed and ignored), calling `fn` for each. Anything but a token between
 * the commas is an error: these lists (Connection, Transfer-Encoding) decide
 * framing and connection reuse, so guessing is not an option.
 */
typedef int (*token_fn)(const char *tok, size_t len, struct head_facts *f, const char **err);

static int for_each_token(const sl_str_t *v, token_fn fn, struct head_facts *f, const char **err,
                          const char *bad_list_error)
{
    const char *p = v->ptr, *end = v->ptr + v->len;
    while (p < end) {
        while (p < end && (is_ows((unsigned char)*p) || *p == ','))
            p++;
        if (p == end)
            break;
        const char *tok = p;
        while (p < end && tchar_tab[(unsigned char)*p])
            p++;
        if (p == tok) {
            *err = bad_list_error;
            return SL_ERROR;
        }
        size_t tok_len = (size_t)(p - tok);
        while (p < end && is_ows((unsigned char)*p))
            p++;
        if (p < end && *p != ',') {
            *err = bad_list_error;
            return SL_ERROR;
        }
        if (fn(tok, tok_len, f, err) != SL_OK)
            return SL_ERROR;
    }
    return SL_OK;
}

static int te_coding(const char *tok, size_t len, struct head_facts *f, const char **err)
{
    if (EQ_LIT(tok, len, "chunked")) {
        if (f->te_chunked) {
            *err = "Transfer-Encoding applies chunked more than once";
            return SL_ERROR;
        }
        f->te_chunked = 1;
        f->te_last_chunked = 1;
    } else {
        f->te_unknown = 1;
        f->te_last_chunked = 0;
    }
    return SL_OK;
}

static int connection_option(const char *tok, size_t len, struct head_facts *f, const char **err)
{
    (void)err;
    if (EQ_LIT(tok, len, "close"))
        f->conn_close = 1;
    else if (EQ_LIT(tok, len, "keep-alive"))
        f->conn_keep_alive = 1;
    return SL_OK;
}

/*
 * Applies the fields that change framing or connection handling, for requests
 * and responses alike. Returns SL_OK or SL_ERROR with *err.
 */
static int note_framing_field(const sl_http1_header_t *h, struct head_facts *f, int strict_lists,
                              const char **err)
{
    const char *n = h->name.ptr;
    switch (h->name.len) {
    case 14:
        if (EQ_LIT(n, 14, "content-length")) {
            if (f->cl_seen) {
                *err = "several Content-Length headers";
                return SL_ERROR;
            }
            f->cl_seen = 1;
            return parse_content_length(&h->value, &f->content_length, err);
        }
        break;
    case 17:
        if (EQ_LIT(n, 17, "transfer-encoding")) {
            f->te_seen = 1;
            return for_each_token(&h->value, te_coding, f, err,
                                  "invalid Transfer-Encoding (expected a list of codings)");
        }
        break;
    case 10:
        if (EQ_LIT(n, 10, "connection")) {
            if (for_each_token(&h->value, connection_option, f, err,
                               "invalid Connection header (expected a list of tokens)") != SL_OK &&
                strict_lists)
                return SL_ERROR;
        }
        break;
    case 7:
        if (EQ_LIT(n, 7, "upgrade"))
            f->upgrade = 1;
        break;
    default:
        break;
    }
    return SL_OK;
}

/*
 * Host: uri-host [ ":" port ]. `out` gets the host without the port; an
 * IP-literal keeps its brackets ("[::1]") as RFC 3986 writes it, so the
 * router can never confuse it with a name.
 */
static int parse_host(const sl_str_t *v, sl_str_t *out, const char **err)
{
    const char *p = v->ptr, *end = v->ptr + v->len;
    const char *host_end;

    if (v->len == 0) {
        *err = "empty Host header";
        return SL_ERROR;
    }
    if (*p == '[') {
        p++;
        while (p < end && (hex_tab[(unsigned char)*p] || *p == ':' || *p == '.'))
            p++;
        if (p == end || *p != ']' || p == v->ptr + 1) {
            *err = "invalid IP literal in Host header";
            return SL_ERROR;
        }
        p++;
    } else {
        while (p < end && host_tab[(unsigned char)*p])
            p++;
        if (p == v->ptr) {
            *err = "invalid Host header";
            return SL_ERROR;
        }
    }
    host_end = p;
    if (p < end) {
        if (*p != ':') {
            *err = "invalid character in Host header";
            return SL_ERROR;
        }
        p++;
        if (end - p > 5) {
            *err = "invalid port in Host header";
            return SL_ERROR;
        }
        while (p < end) {
            if (!is_digit((unsigned char)*p)) {
                *err = "invalid port in Host header";
                return SL_ERROR;
            }
            p++;
        }
    }
    out->ptr = v->ptr;
    out->len = (size_t)(host_end - v->ptr);
    return SL_OK;
}

/* ---- requests ---------------------------------------------------------- */

static int req_fail(sl_http1_request_t *req, int status, const char *error)
{
    req->error_status = status;
    req->error = error;
    return SL_ERROR;
}

/* Checks the bytes of "HTTP/d.d" that are present (a prefix) and reports a
 * mismatch as soon as it is visible. Returns SL_OK or SL_ERROR. */
static int version_prefix_ok(const char *p, size_t avail)
{
    static const char lit[] = "HTTP/";
    size_t n = avail < 8 ? avail : 8;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (i < 5) {
            if (c != (unsigned char)lit[i])
                return SL_ERROR;
        } else if (i == 6) {
            if (c != '.')
                return SL_ERROR;
        } else if (!is_digit(c)) {
            return SL_ERROR;
        }
    }
    return SL_OK;
}

/*
 * Request line within [p, end). Returns SL_OK with *next past the CRLF,
 * SL_AGAIN, or SL_ERROR (req->error/error_status set).
 */
static int parse_request_line(const char *p, const char *end, sl_http1_request_t *req,
                              const char **next)
{
    /* method */
    const char *method = p;
    while (p < end && tchar_tab[(unsigned char)*p])
        p++;
    if (p == end)
        return SL_AGAIN;
    /* A line that starts with a space has an empty method: never a request
     * (fuzz finding; some servers would skip the space and see another). */
    if (sl_unlikely(*p != ' ' || p == method)) {
        if (p == method)
            return req_fail(req, 400,
                            *p == ' ' || *p == '\t' ? "request line starts with whitespace"
                                                    : "request line does not start with a method");
        if (*p == '\r' || *p == '\n')
            return req_fail(req, 400, "request line has no request-target");
        return req_fail(req, 400, "invalid character in method");
    }
    req->method.ptr = method;
    req->method.len = (size_t)(p - method);
    p++;

    /* request-target */
    if (p == end)
        return SL_AGAIN;
    if (sl_unlikely(*p == ' '))
        return req_fail(req, 400, "more than one space between method and request-target");
    const char *target = p;
    p = scan_target(p, end);
    if (p == end)
        return SL_AGAIN;
    if (sl_unlikely(*p != ' ')) {
        unsigned char c = (unsigned char)*p;
        if (c == '\r' || c == '\n')
            return req_fail(req, 400, "request line has no HTTP version");
        if (c == '#')
            return req_fail(req, 400, "fragment ('#') in request-target");
        if (c == '\t')
            return req_fail(req, 400, "whitespace in request-target");
        return req_fail(req, 400, "invalid character in request-target");
    }
    if (p == target)
        return req_fail(req, 400, "more than one space between method and request-target");
    req->target.ptr = target;
    req->target.len = (size_t)(p - target);
    p++;

    /* HTTP-version CRLF */
    size_t avail = (size_t)(end - p);
    if (avail >= 10 && memcmp(p, "HTTP/1.1\r\n", 10) == 0) {
        req->minor_version = 1;
        p += 10;
    } else {
        if (avail > 0 && *p == ' ')
            return req_fail(req, 400, "more than one space between request-target and version");
        if (version_prefix_ok(p, avail) != SL_OK)
            return req_fail(req, 400, "invalid HTTP version in request line");
        if (avail < 9)
            return SL_AGAIN;
        if (p[8] != '\r') {
            if (p[8] == '\n')
                return req_fail(req, 400, "bare LF after request line (CRLF required)");
            return req_fail(req, 400, "invalid HTTP version in request line");
        }
        if (avail < 10)
            return SL_AGAIN;
        if (p[9] != '\n')
            return req_fail(req, 400, "bare CR in request line (CRLF required)");
        if (p[5] != '1' || (p[7] != '0' && p[7] != '1'))
            return req_fail(req, 505, "HTTP version not supported (only 1.0 and 1.1)");
        req->minor_version = p[7] - '0';
        p += 10;
    }
    *next = p;
    return SL_OK;
}

/* Splits an origin-form target "/p?q" at its first '?'. */
static int split_path_query(sl_http1_request_t *req, const char *t, size_t len)
{
    const char *q = memchr(t, '?', len);
    if (q) {
        req->path.ptr = t;
        req->path.len = (size_t)(q - t);
        req->query.ptr = q + 1;
        req->query.len = len - req->path.len - 1;
        req->flags |= SL_HTTP1_F_HAS_QUERY; /* "/p?" keeps its '?' upstream */
    } else {
        req->path.ptr = t;
        req->path.len = len;
        req->query.ptr = t + len;
        req->query.len = 0;
    }
    return SL_OK;
}

/*
 * absolute-form, "http://host[:port]/path?query" (RFC 9112 3.2.2): what a
 * client talking to a proxy sends, and what a server must accept. Only the
 * http and https schemes name something this gateway can serve; userinfo is
 * deprecated and a classic way to disguise the real host ("http://good@evil"),
 * so it is refused rather than stripped. The authority is checked with the
 * same rules as a Host header; the caller routes on it and sends the origin
 * origin-form with the authority as Host.
 */
static int check_absolute_form(sl_http1_request_t *req, const char *t, size_t len)
{
    const char *end = t + len, *p;
    if (len >= 7 && strncasecmp(t, "http://", 7) == 0)
        p = t + 7;
    else if (len >= 8 && strncasecmp(t, "https://", 8) == 0)
        p = t + 8;
    else
        return req_fail(req, 400, "absolute-form request-target: only http and https are served");
    const char *auth = p;
    while (p < end && *p != '/' && *p != '?')
        p++;
    sl_str_t authority = {auth, (size_t)(p - auth)};
    if (memchr(authority.ptr, '@', authority.len))
        return req_fail(req, 400, "absolute-form request-target: userinfo is not allowed");
    const char *err = NULL;
    sl_str_t host;
    if (authority.len == 0 || parse_host(&authority, &host, &err) != SL_OK)
        return req_fail(req, 400, "absolute-form request-target: invalid host");
    req->authority = authority;
    req->host = host;
    req->flags |= SL_HTTP1_F_ABSOLUTE_FORM;
    if (p == end || *p == '?') {
        /* No path: the origin gets "/" (RFC 9112 3.2.1). The slice is the
         * last '/' of "://", so that it still points into the caller's
         * buffer like every other slice. */
        split_path_query(req, p, (size_t)(end - p));
        req->path = (sl_str_t){auth - 1, 1};
        return SL_OK;
    }
    return split_path_query(req, p, (size_t)(end - p));
}

/* Splits and checks the target once the method is known. */
static int check_target(sl_http1_request_t *req)
{
    const char *t = req->target.ptr;
    size_t len = req->target.len;

    if (sl_likely(t[0] == '/'))
        return split_path_query(req, t, len);
    if (len == 1 && t[0] == '*') {
        if (req->method_bit != SL_METHOD_OPTIONS)
            return req_fail(req, 400, "asterisk-form request-target is only allowed for OPTIONS");
        req->path = req->target;
        req->query.ptr = t + len;
        req->query.len = 0;
        return SL_OK;
    }
    if (len > 3 && memmem(t, len, "://", 3) != NULL)
        return check_absolute_form(req, t, len);
    return req_fail(req, 400, "request-target must start with '/'");
}

/* Decides body framing and connection reuse for a complete request head. */
static int finish_request(sl_http1_request_t *req, const struct head_facts *f)
{
    if (f->te_seen) {
        if (req->minor_version == 0)
            return req_fail(req, 400, "Transfer-Encoding in an HTTP/1.0 request");
        if (f->cl_seen)
            return req_fail(req, 400, "both Content-Length and Transfer-Encoding");
        if (!f->te_last_chunked)
            return req_fail(req, 400, "Transfer-Encoding: the final coding must be chunked");
        if (f->te_unknown)
            return req_fail(req, 501, "unsupported transfer coding (only chunked is supported)");
        req->body = SL_HTTP1_BODY_CHUNKED;
    } else if (f->cl_seen) {
        req->body = SL_HTTP1_BODY_LENGTH;
        req->content_length = f->content_length;
    } else {
        req->body = SL_HTTP1_BODY_NONE;
    }

    if (req->minor_version == 1) {
        if (!f->host_seen)
            return req_fail(req, 400, "missing Host header (required in HTTP/1.1)");
        if (f->expect_continue)
            req->flags |= SL_HTTP1_F_EXPECT_CONTINUE;
        if (!f->conn_close)
            req->flags |= SL_HTTP1_F_KEEP_ALIVE;
    } else if (f->conn_keep_alive && !f->conn_close) {
        req->flags |= SL_HTTP1_F_KEEP_ALIVE;
    }
    if (f->conn_close)
        req->flags |= SL_HTTP1_F_CONN_CLOSE;
    if (f->upgrade)
        req->flags |= SL_HTTP1_F_UPGRADE;
    if (!(req->flags & SL_HTTP1_F_ABSOLUTE_FORM)) {
        req->host = f->host;
        req->authority = f->host_value;
    }
    return SL_OK;
}

ssize_t sl_http1_parse_request(const char *buf, size_t len, const sl_http1_limits_t *limits,
                               sl_http1_request_t *req)
{
    const sl_http1_limits_t *lim = limits ? limits : &default_limits;
    const size_t capacity = req->num_headers;
    const size_t max_fields =
        lim->max_header_count < capacity ? (size_t)lim->max_header_count : capacity;
    const size_t max_head = lim->max_header_bytes;
    const uint64_t max_line = lim->max_request_line_bytes;
    const char *p = buf;
    const char *end = buf + len;
    struct head_facts f;
    size_t count = 0;
    int rc;

    memset(&f, 0, sizeof(f));
    req->method = (sl_str_t){NULL, 0};
    req->method_bit = SL_METHOD_OTHER;
    req->target = req->path = req->query = req->host = req->authority = (sl_str_t){NULL, 0};
    req->minor_version = 0;
    req->body = SL_HTTP1_BODY_NONE;
    req->content_length = 0;
    req->flags = 0;
    req->head_len = 0;
    req->error_status = 0;
    req->error = NULL;

    /* RFC 9112 2.2: ignore empty lines before the request line (clients may
     * send a CRLF after a POST body). They count towards max_header_bytes. */
    while (end - p >= 2 && p[0] == '\r' && p[1] == '\n' && (size_t)(p - buf) < max_head)
        p += 2;
    if ((size_t)(p - buf) >= max_head && max_head > 0)
        return req_fail(req, 431, "request header section too large");
    if (p < end && *p == '\n')
        return req_fail(req, 400, "bare LF before request line (CRLF required)");
    if (end - p == 1 && *p == '\r')
        return SL_AGAIN;

    /*
     * The request line is parsed within max_line + CRLF bytes, so an endless
     * line is refused as soon as it is longer than allowed, without waiting
     * for a CRLF that may never come.
     */
    const char *line = p;
    uint64_t line_avail = (uint64_t)(end - line);
    const char *line_end = line_avail > max_line + 2 ? line + (size_t)max_line + 2 : end;
    rc = parse_request_line(line, line_end, req, &p);
    if (rc == SL_ERROR)
        return SL_ERROR;
    if (rc == SL_AGAIN) {
        if (line_avail >= max_line + 2 || (line_avail == max_line + 1 && line[max_line] != '\r'))
            return req_fail(req, 414, "request line too long");
        if (len >= max_head)
            return req_fail(req, 431, "request header section too large");
        return SL_AGAIN;
    }
    req->method_bit = sl_http1_method_bit(req->method.ptr, req->method.len);
    if (check_target(req) != SL_OK)
        return SL_ERROR;

    /* Field lines, within max_head bytes from the start of the buffer. */
    const char *head_end = len > max_head ? buf + max_head : end;
    for (;;) {
        /* Parsed in place into the caller's array (a field past the limit
         * goes to scratch, only to be refused). The array's contents are
         * unspecified unless the parse succeeds. */
        sl_http1_header_t scratch;
        sl_http1_header_t *h = count < max_fields ? &req->headers[count] : &scratch;
        const char *err = NULL;
        rc = p < head_end ? parse_field_line(&p, head_end, h, &err) : SL_AGAIN;
        if (rc == LINE_END)
            break;
        if (rc == SL_AGAIN) {
            if (len >= max_head)
                return req_fail(req, 431, "request header section too large");
            return SL_AGAIN;
        }
        if (rc == SL_ERROR)
            return req_fail(req, 400, err);
        if (count == max_fields)
            return req_fail(req, 431, "too many request headers");

        if (h->name.len == 4 && EQ_LIT(h->name.ptr, 4, "host")) {
            if (f.host_seen)
                return req_fail(req, 400, "several Host headers");
            f.host_seen = 1;
            f.host_value = h->value;
            if (parse_host(&h->value, &f.host, &err) != SL_OK)
                return req_fail(req, 400, err);
        } else if (h->name.len == 6 && EQ_LIT(h->name.ptr, 6, "expect")) {
            if (EQ_LIT(h->value.ptr, h->value.len, "100-continue"))
                f.expect_continue = 1;
        } else if (note_framing_field(h, &f, 1, &err) != SL_OK) {
            return req_fail(req, 400, err);
        }
        count++;
    }

    if (finish_request(req, &f) != SL_OK)
        return SL_ERROR;
    req->num_headers = count;
    req->head_len = (size_t)(p - buf);
    return (ssize_t)req->head_len;
}

/* ---- responses --------------------------------------------------------- */

static ssize_t resp_fail(sl_http1_response_t *resp, const char *error)
{
    resp->error = error;
    return SL_ERROR;
}

/* "HTTP/d.d ddd" prefix check, like version_prefix_ok. */
static int status_prefix_ok(const char *p, size_t avail)
{
    size_t n = avail < 12 ? avail : 12;
    if (version_prefix_ok(p, n) != SL_OK)
        return SL_ERROR;
    for (size_t i = 8; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (i == 8 ? c != ' ' : !is_digit(c))
            return SL_ERROR;
    }
    return SL_OK;
}

ssize_t sl_http1_parse_response(const char *buf, size_t len, unsigned request_method_bit,
                                size_t max_head_bytes, sl_http1_response_t *resp)
{
    const size_t capacity = resp->num_headers;
    const char *end = len > max_head_bytes ? buf + max_head_bytes : buf + len;
    const char *p = buf;
    struct head_facts f;
    size_t count = 0;
    int rc;

    memset(&f, 0, sizeof(f));
    resp->status = 0;
    resp->reason = (sl_str_t){NULL, 0};
    resp->minor_version = 0;
    resp->body = SL_HTTP1_BODY_NONE;
    resp->content_length = 0;
    resp->flags = 0;
    resp->head_len = 0;
    resp->error = NULL;

    /* status-line = HTTP-version SP status-code SP [ reason-phrase ] CRLF;
     * a missing SP before an empty reason is tolerated (common, harmless). */
    size_t avail = (size_t)(end - p);
    if (status_prefix_ok(p, avail) != SL_OK)
        return resp_fail(resp, "invalid status line in upstream response");
    if (avail < 13)
        goto again;
    if (p[5] != '1' || (p[7] != '0' && p[7] != '1'))
        return resp_fail(resp, "upstream response HTTP version is not 1.0 or 1.1");
    resp->minor_version = p[7] - '0';
    resp->status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    if (resp->status < 100 || resp->status > 599)
        return resp_fail(resp, "invalid status code in upstream response");
    p += 12;
    if (*p == ' ') {
        p++;
        const char *reason = p;
        p = scan_value(p, end);
        resp->reason.ptr = reason;
        resp->reason.len = (size_t)(p - reason);
        if (p == end)
            goto again;
    } else {
        resp->reason.ptr = p;
    }
    if (*p != '\r')
        return resp_fail(resp, *p == '\n' ? "bare LF in upstream status line"
                                          : "invalid character in upstream status line");
    if (end - p < 2)
        goto again;
    if (p[1] != '\n')
        return resp_fail(resp, "bare CR in upstream status line");
    p += 2;

    for (;;) {
        sl_http1_header_t scratch;
        sl_http1_header_t *h = count < capacity ? &resp->headers[count] : &scratch;
        const char *err = NULL;
        rc = parse_field_line(&p, end, h, &err);
        if (rc == LINE_END)
            break;
        if (rc == SL_AGAIN)
            goto again;
        if (rc == SL_ERROR)
            return resp_fail(resp, err);
        if (count == capacity)
            return resp_fail(resp, "too many headers in upstream response");
        if (note_framing_field(h, &f, 0, &err) != SL_OK)
            return resp_fail(resp, err);
        count++;
    }

    /* Framing, RFC 9112 6.3, in its order. */
    if (f.te_seen && f.cl_seen)
        return resp_fail(resp, "upstream response has both Content-Length and Transfer-Encoding");
    if (f.te_seen && resp->minor_version == 0)
        return resp_fail(resp, "Transfer-Encoding in an HTTP/1.0 upstream response");
    if ((request_method_bit & SL_METHOD_HEAD) || resp->status < 200 || resp->status == 204 ||
        resp->status == 304) {
        resp->body = SL_HTTP1_BODY_NONE;
    } else if (f.te_seen) {
        resp->body = f.te_last_chunked ? SL_HTTP1_BODY_CHUNKED : SL_HTTP1_BODY_CLOSE;
    } else if (f.cl_seen) {
        resp->body = SL_HTTP1_BODY_LENGTH;
        resp->content_length = f.content_length;
    } else {
        resp->body = SL_HTTP1_BODY_CLOSE;
    }

    if (f.conn_close)
        resp->flags |= SL_HTTP1_F_CONN_CLOSE;
    if (f.upgrade)
        resp->flags |= SL_HTTP1_F_UPGRADE;
    if (resp->body != SL_HTTP1_BODY_CLOSE && !f.conn_close &&
        (resp->minor_version == 1 || f.conn_keep_alive))
        resp->flags |= SL_HTTP1_F_KEEP_ALIVE;
    resp->num_headers = count;
    resp->head_len = (size_t)(p - buf);
    return (ssize_t)resp->head_len;

again:
    if (len >= max_head_bytes)
        return resp_fail(resp, "upstream response head too large");
    return SL_AGAIN;
}

/* ---- chunked bodies ---------------------------------------------------- */

enum chunk_state {
    CH_SIZE_START = 0, /* first hex digit of a chunk-size */
    CH_SIZE,           /* more hex digits */
    CH_SIZE_BWS,       /* whitespace after the size: only before ';' */
    CH_EXT_PRE_NAME,   /* after ';' */
    CH_EXT_NAME,
    CH_EXT_POST_NAME, /* BWS after a name: '=' or ';' follows */
    CH_EXT_PRE_VALUE, /* after '=' */
    CH_EXT_TOKEN_VALUE,
    CH_EXT_QUOTED_VALUE,
    CH_EXT_QUOTED_ESCAPE,
    CH_EXT_AFTER_QUOTE, /* right after the closing quote */
    CH_EXT_POST_VALUE,  /* BWS after a value: ';' follows */
    CH_SIZE_LF,         /* CR of the size line seen */
    CH_DATA,
    CH_DATA_CR,
    CH_DATA_LF,
    CH_TRAILER_LINE, /* start of a trailer field line or of the final CRLF */
    CH_TRAILER_NAME,
    CH_TRAILER_VALUE,
    CH_TRAILER_LF,
    CH_FINAL_LF,
    CH_DONE,
    CH_ERROR,
};

void sl_http1_chunked_init(sl_http1_chunked_t *c)
{
    memset(c, 0, sizeof(*c));
    c->state = CH_SIZE_START;
}

static ssize_t chunk_fail(sl_http1_chunked_t *c, const char *error)
{
    c->state = CH_ERROR;
    c->error = error;
    return SL_ERROR;
}

/* qdtext / quoted-pair byte (RFC 9110 5.6.4), minus '"' and '\\'. */
static inline int is_qdtext(unsigned char c)
{
    return c == '\t' || (c >= 0x20 && c != 0x7f && c != '"' && c != '\\');
}

ssize_t sl_http1_chunked_scan(sl_http1_chunked_t *c, const char *buf, size_t len, int *done)
{
    const unsigned char *p = (const unsigned char *)buf;
    const unsigned char *end = p + len;

    *done = 0;
    if (c->state == CH_DONE) {
        *done = 1;
        return 0;
    }
    if (c->state == CH_ERROR)
        return SL_ERROR;

    while (p < end) {
        unsigned char ch;

        if (c->state == CH_DATA) {
            size_t take = (size_t)(end - p);
            if (take > c->chunk_left)
                take = (size_t)c->chunk_left;
            p += take;
            c->chunk_left -= take;
            c->data_bytes += take;
            if (c->chunk_left == 0)
                c->state = CH_DATA_CR;
            continue;
        }

        ch = *p++;
        if (c->state <= CH_SIZE_LF) {
            if (++c->line_bytes > CHUNK_LINE_MAX_BYTES)
                return chunk_fail(c, "chunk-size line too long");
        } else if (c->state >= CH_TRAILER_LINE && c->state <= CH_FINAL_LF) {
            if (++c->trailer_bytes > CHUNK_TRAILER_MAX_BYTES)
                return chunk_fail(c, "chunked trailer section too large");
        }

        switch ((enum chunk_state)c->state) {
        case CH_SIZE_START:
            if (!hex_tab[ch])
                return chunk_fail(c, "invalid chunk size (expected a hex digit)");
            c->chunk_left = hex_tab[ch] - 1u;
            c->state = CH_SIZE;
            break;
        case CH_SIZE:
            if (hex_tab[ch]) {
                unsigned d = hex_tab[ch] - 1u;
                if (c->chunk_left > ((uint64_t)INT64_MAX - d) >> 4)
                    return chunk_fail(c, "chunk size too large");
                c->chunk_left = (c->chunk_left << 4) | d;
            } else if (ch == '\r') {
                c->state = CH_SIZE_LF;
            } else if (ch == ';') {
                c->state = CH_EXT_PRE_NAME;
            } else if (is_ows(ch)) {
                c->state = CH_SIZE_BWS;
            } else {
                return chunk_fail(c, "invalid chunk size");
            }
            break;
        case CH_SIZE_BWS:
            if (ch == ';')
                c->state = CH_EXT_PRE_NAME;
            else if (!is_ows(ch))
                return chunk_fail(c, "invalid chunk size (whitespace not followed by ';')");
            break;
        case CH_EXT_PRE_NAME:
            if (tchar_tab[ch])
                c->state = CH_EXT_NAME;
            else if (!is_ows(ch))
                return chunk_fail(c, "invalid chunk extension name");
            break;
        case CH_EXT_NAME:
            if (tchar_tab[ch])
                break;
            if (ch == '\r')
                c->state = CH_SIZE_LF;
            else if (ch == '=')
                c->state = CH_EXT_PRE_VALUE;
            else if (ch == ';')
                c->state = CH_EXT_PRE_NAME;
            else if (is_ows(ch))
                c->state = CH_EXT_POST_NAME;
            else
                return chunk_fail(c, "invalid chunk extension");
            break;
        case CH_EXT_POST_NAME:
            if (ch == '=')
                c->state = CH_EXT_PRE_VALUE;
            else if (ch == ';')
                c->state = CH_EXT_PRE_NAME;
            else if (!is_ows(ch))
                return chunk_fail(c, "invalid chunk extension");
            break;
        case CH_EXT_PRE_VALUE:
            if (ch == '"')
                c->state = CH_EXT_QUOTED_VALUE;
            else if (tchar_tab[ch])
                c->state = CH_EXT_TOKEN_VALUE;
            else if (!is_ows(ch))
                return chunk_fail(c, "invalid chunk extension value");
            break;
        case CH_EXT_TOKEN_VALUE:
            if (tchar_tab[ch])
                break;
            if (ch == '\r')
                c->state = CH_SIZE_LF;
            else if (ch == ';')
                c->state = CH_EXT_PRE_NAME;
            else if (is_ows(ch))
                c->state = CH_EXT_POST_VALUE;
            else
                return chunk_fail(c, "invalid chunk extension value");
            break;
        case CH_EXT_QUOTED_VALUE:
            if (ch == '"')
                c->state = CH_EXT_AFTER_QUOTE;
            else if (ch == '\\')
                c->state = CH_EXT_QUOTED_ESCAPE;
            else if (!is_qdtext(ch))
                return chunk_fail(c, "invalid character in quoted chunk extension");
            break;
        case CH_EXT_QUOTED_ESCAPE:
            if (!(ch == '\t' || (ch >= 0x20 && ch != 0x7f)))
                return chunk_fail(c, "invalid escape in quoted chunk extension");
            c->state = CH_EXT_QUOTED_VALUE;
            break;
        case CH_EXT_AFTER_QUOTE:
            if (ch == '\r')
                c->state = CH_SIZE_LF;
            else if (ch == ';')
                c->state = CH_EXT_PRE_NAME;
            else if (is_ows(ch))
                c->state = CH_EXT_POST_VALUE;
            else
                return chunk_fail(c, "invalid chunk extension after quoted value");
            break;
        case CH_EXT_POST_VALUE:
            if (ch == ';')
                c->state = CH_EXT_PRE_NAME;
            else if (!is_ows(ch))
                return chunk_fail(c, "invalid chunk extension (whitespace not followed by ';')");
            break;
        case CH_SIZE_LF:
            if (ch != '\n')
                return chunk_fail(c, "bare CR in chunk-size line (CRLF required)");
            c->line_bytes = 0;
            c->state = c->chunk_left ? CH_DATA : CH_TRAILER_LINE;
            break;
        case CH_DATA_CR:
            if (ch != '\r')
                return chunk_fail(c, "chunk data not followed by CRLF");
            c->state = CH_DATA_LF;
            break;
        case CH_DATA_LF:
            if (ch != '\n')
                return chunk_fail(c, "chunk data not followed by CRLF");
            c->state = CH_SIZE_START;
            break;
        case CH_TRAILER_LINE:
            if (ch == '\r')
                c->state = CH_FINAL_LF;
            else if (tchar_tab[ch])
                c->state = CH_TRAILER_NAME;
            else if (is_ows(ch))
                return chunk_fail(c, "trailer line starts with whitespace (obs-fold)");
            else
                return chunk_fail(c, "invalid trailer field");
            break;
        case CH_TRAILER_NAME:
            if (ch == ':')
                c->state = CH_TRAILER_VALUE;
            else if (!tchar_tab[ch])
                return chunk_fail(c, is_ows(ch) ? "whitespace between trailer name and colon"
                                                : "invalid character in trailer name");
            break;
        case CH_TRAILER_VALUE:
            if (ch == '\r')
                c->state = CH_TRAILER_LF;
            else if (!value_tab[ch])
                return chunk_fail(c, "invalid character in trailer value");
            break;
        case CH_TRAILER_LF:
            if (ch != '\n')
                return chunk_fail(c, "bare CR in trailer (CRLF required)");
            c->state = CH_TRAILER_LINE;
            break;
        case CH_FINAL_LF:
            if (ch != '\n')
                return chunk_fail(c, "bare CR at end of chunked body (CRLF required)");
            c->state = CH_DONE;
            *done = 1;
            return (ssize_t)((const char *)p - buf);
        case CH_DATA:
        case CH_DONE:
        case CH_ERROR:
            /* handled before the switch */
            return chunk_fail(c, "chunked scanner in an impossible state");
        }
    }
    return (ssize_t)len;
}

/* ---- small helpers ----------------------------------------------------- */

const sl_http1_header_t *sl_http1_find_header(const sl_http1_header_t *headers, size_t n,
                                              const char *name, size_t name_len)
{
    for (size_t i = 0; i < n; i++) {
        const sl_http1_header_t *h = &headers[i];
        if (h->name.len != name_len)
            continue;
        size_t j = 0;
        while (j < name_len &&
               lower((unsigned char)h->name.ptr[j]) == lower((unsigned char)name[j]))
            j++;
        if (j == name_len)
            return h;
    }
    return NULL;
}

unsigned sl_http1_method_bit(const char *name, size_t len)
{
    /* Methods are case-sensitive (RFC 9110 9.1): "get" is not GET. */
    switch (len) {
    case 3:
        if (memcmp(name, "GET", 3) == 0)
            return SL_METHOD_GET;
        if (memcmp(name, "PUT", 3) == 0)
            return SL_METHOD_PUT;
        break;
    case 4:
        if (memcmp(name, "POST", 4) == 0)
            return SL_METHOD_POST;
        if (memcmp(name, "HEAD", 4) == 0)
            return SL_METHOD_HEAD;
        break;
    case 5:
        if (memcmp(name, "PATCH", 5) == 0)
            return SL_METHOD_PATCH;
        if (memcmp(name, "TRACE", 5) == 0)
            return SL_METHOD_TRACE;
        break;
    case 6:
        if (memcmp(name, "DELETE", 6) == 0)
            return SL_METHOD_DELETE;
        break;
    case 7:
        if (memcmp(name, "OPTIONS", 7) == 0)
            return SL_METHOD_OPTIONS;
        if (memcmp(name, "CONNECT", 7) == 0)
            return SL_METHOD_CONNECT;
        break;
    default:
        break;
    }
    return SL_METHOD_OTHER;
}

/* RFC 9110 section 15, plus 429 (RFC 6585). 306 and 418 are reserved
 * ("Unused") and have no phrase. */
static const char *const reason_tab[600] = {
    [100] = "Continue",
    [101] = "Switching Protocols",
    [200] = "OK",
    [201] = "Created",
    [202] = "Accepted",
    [203] = "Non-Authoritative Information",
    [204] = "No Content",
    [205] = "Reset Content",
    [206] = "Partial Content",
    [300] = "Multiple Choices",
    [301] = "Moved Permanently",
    [302] = "Found",
    [303] = "See Other",
    [304] = "Not Modified",
    [305] = "Use Proxy",
    [307] = "Temporary Redirect",
    [308] = "Permanent Redirect",
    [400] = "Bad Request",
    [401] = "Unauthorized",
    [402] = "Payment Required",
    [403] = "Forbidden",
    [404] = "Not Found",
    [405] = "Method Not Allowed",
    [406] = "Not Acceptable",
    [407] = "Proxy Authentication Required",
    [408] = "Request Timeout",
    [409] = "Conflict",
    [410] = "Gone",
    [411] = "Length Required",
    [412] = "Precondition Failed",
    [413] = "Content Too Large",
    [414] = "URI Too Long",
    [415] = "Unsupported Media Type",
    [416] = "Range Not Satisfiable",
    [417] = "Expectation Failed",
    [421] = "Misdirected Request",
    [422] = "Unprocessable Content",
    [426] = "Upgrade Required",
    [429] = "Too Many Requests",
    [500] = "Internal Server Error",
    [501] = "Not Implemented",
    [502] = "Bad Gateway",
    [503] = "Service Unavailable",
    [504] = "Gateway Timeout",
    [505] = "HTTP Version Not Supported",
};

const char *sl_http1_reason(int status)
{
    if (status < 0 || status >= (int)SL_ARRAY_LEN(reason_tab) || reason_tab[status] == NULL)
        return "";
    return reason_tab[status];
}

ssize_t sl_http1_chunked_decode(sl_http1_chunked_t *c, char *buf, size_t len, size_t *payload,
                                int *done)
{
    size_t in = 0, out = 0;
    *done = 0;
    while (in < len && !*done) {
        if (c->state == CH_DATA) {
            size_t take = len - in;
            if (take > c->chunk_left)
                take = (size_t)c->chunk_left;
            memmove(buf + out, buf + in, take);
            /* The scanner only counts data bytes, it does not read them. */
            ssize_t r = sl_http1_chunked_scan(c, buf + out, take, done);
            if (r < 0)
                return r;
            out += take;
            in += take;
            continue;
        }
        /* Framing (size lines, CRLFs, trailers) is a few bytes per chunk. */
        int in_trailer = c->state >= CH_TRAILER_LINE && c->state <= CH_TRAILER_LF;
        ssize_t r = sl_http1_chunked_scan(c, buf + in, 1, done);
        if (r < 0)
            return r;
        if (r == 0)
            break;
        /* A trailer line's byte (the CR of the final CRLF moves to CH_FINAL_LF). */
        if (c->trailer_out && in_trailer && c->state != CH_FINAL_LF) {
            if (c->trailer_len < c->trailer_cap)
                c->trailer_out[c->trailer_len] = buf[in];
            if (c->trailer_len <= c->trailer_cap)
                c->trailer_len++;
        }
        in += (size_t)r;
    }
    *payload = out;
    return (ssize_t)in;
}
