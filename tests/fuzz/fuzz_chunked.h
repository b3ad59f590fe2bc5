/*
 * Chunked-framing checks shared by fuzz_http1_request and fuzz_http1_response:
 * the scanner run over a body in one piece and in socket-like splits must
 * reach the same verdict (error or not, done or not, bytes consumed, payload
 * bytes counted), and sl_http1_chunked_decode must produce exactly the payload
 * the scanner counted, whatever the splits.
 *
 * Not here: head parsing (the drivers do that).
 */
#ifndef SL_FUZZ_CHUNKED_H
#define SL_FUZZ_CHUNKED_H

#include "fuzz_util.h"
#include "http1.h"

typedef struct {
    int error;       /* 1 if SL_ERROR was returned */
    int done;        /* final CRLF consumed */
    size_t consumed; /* bytes that belonged to the body */
    uint64_t data_bytes;
} fuzz_chunk_verdict_t;

/* One call over the whole of buf[0..len). */
static inline fuzz_chunk_verdict_t fuzz_chunk_whole(const uint8_t *buf, size_t len)
{
    fuzz_chunk_verdict_t v = {0, 0, 0, 0};
    sl_http1_chunked_t c;
    sl_http1_chunked_init(&c);
    char *copy = fuzz_dup(buf, len);
    int done = 0;
    ssize_t r = sl_http1_chunked_scan(&c, copy, len, &done);
    if (r < 0) {
        FUZZ_CHECK(r == SL_ERROR, "scan returned %zd", r);
        FUZZ_CHECK(c.error != NULL, "SL_ERROR without an error message");
        v.error = 1;
    } else {
        FUZZ_CHECK((size_t)r <= len, "scan consumed %zd of %zu bytes", r, len);
        FUZZ_CHECK(done || (size_t)r == len, "scan stopped at %zd of %zu bytes without being done",
                   r, len);
        v.done = done;
        v.consumed = (size_t)r;
        v.data_bytes = c.data_bytes;
        if (done) {
            /* Once done, the scanner stays done and takes nothing more. */
            int again = 0;
            ssize_t r2 = sl_http1_chunked_scan(&c, copy, len, &again);
            FUZZ_CHECK(r2 == 0 && again == 1, "scan after done returned %zd done=%d", r2, again);
        }
    }
    free(copy);
    return v;
}

/* The same body delivered in splits drawn from rng; each piece is its own
 * exact-size allocation, as a socket read would be. */
static inline fuzz_chunk_verdict_t fuzz_chunk_split(const uint8_t *buf, size_t len, fuzz_rng_t *rng)
{
    fuzz_chunk_verdict_t v = {0, 0, 0, 0};
    sl_http1_chunked_t c;
    sl_http1_chunked_init(&c);
    size_t pos = 0;
    while (pos < len) {
        size_t n = fuzz_next_split(rng, len - pos);
        char *piece = fuzz_dup(buf + pos, n);
        int done = 0;
        ssize_t r = sl_http1_chunked_scan(&c, piece, n, &done);
        free(piece);
        if (r < 0) {
            FUZZ_CHECK(r == SL_ERROR, "scan returned %zd", r);
            v.error = 1;
            return v;
        }
        FUZZ_CHECK((size_t)r <= n, "scan consumed %zd of a %zu-byte piece", r, n);
        v.consumed += (size_t)r;
        if (done) {
            v.done = 1;
            break;
        }
        FUZZ_CHECK((size_t)r == n, "scan stopped at %zd of %zu without being done", r, n);
        pos += n;
    }
    v.data_bytes = c.data_bytes;
    return v;
}

/*
 * sl_http1_chunked_decode in splits: returns the verdict and appends the
 * decoded payload to *out (malloc'd, *out_len bytes).
 */
static inline fuzz_chunk_verdict_t fuzz_chunk_decode_split(const uint8_t *buf, size_t len,
                                                           fuzz_rng_t *rng, uint8_t **out,
                                                           size_t *out_len)
{
    fuzz_chunk_verdict_t v = {0, 0, 0, 0};
    sl_http1_chunked_t c;
    sl_http1_chunked_init(&c);
    uint8_t *payload = malloc(len ? len : 1);
    if (!payload)
        abort();
    size_t have = 0, pos = 0;
    while (pos < len) {
        size_t n = fuzz_next_split(rng, len - pos);
        char *piece = fuzz_dup(buf + pos, n);
        int done = 0;
        size_t got = (size_t)-1;
        ssize_t r = sl_http1_chunked_decode(&c, piece, n, &got, &done);
        if (r < 0) {
            free(piece);
            FUZZ_CHECK(r == SL_ERROR, "decode returned %zd", r);
            v.error = 1;
            break;
        }
        FUZZ_CHECK((size_t)r <= n, "decode consumed %zd of a %zu-byte piece", r, n);
        FUZZ_CHECK(got <= (size_t)r, "decode produced %zu payload bytes from %zd", got, r);
        memcpy(payload + have, piece, got);
        have += got;
        free(piece);
        v.consumed += (size_t)r;
        if (done) {
            v.done = 1;
            break;
        }
        /* decode may stop early only at the end of the body */
        FUZZ_CHECK((size_t)r == n, "decode stopped at %zd of %zu without being done", r, n);
        pos += n;
    }
    v.data_bytes = c.data_bytes;
    *out = payload;
    *out_len = have;
    return v;
}

static inline void fuzz_chunk_same(const fuzz_chunk_verdict_t *a, const fuzz_chunk_verdict_t *b,
                                   const char *what)
{
    FUZZ_CHECK(a->error == b->error, "%s: error %d vs %d", what, a->error, b->error);
    if (a->error)
        return;
    FUZZ_CHECK(a->done == b->done, "%s: done %d vs %d", what, a->done, b->done);
    FUZZ_CHECK(a->consumed == b->consumed, "%s: consumed %zu vs %zu", what, a->consumed,
               b->consumed);
    FUZZ_CHECK(a->data_bytes == b->data_bytes, "%s: payload bytes %llu vs %llu", what,
               (unsigned long long)a->data_bytes, (unsigned long long)b->data_bytes);
}

/*
 * Reference de-chunking of a body the scanner accepted, written
 * independently of http1.c (RFC 9112 7.1): size in hex, optional extensions
 * up to CRLF, data, CRLF; last chunk "0" then trailer lines until an empty
 * line. Only called on bodies the scanner said are done, to compare the
 * payload that decode produced. Returns 0 and the payload, or -1 if this
 * simple reader cannot follow the framing (which then is itself a finding).
 */
static inline int fuzz_chunk_reference(const uint8_t *b, size_t len, uint8_t *out, size_t *out_len)
{
    size_t i = 0, o = 0;
    for (;;) {
        uint64_t size = 0;
        size_t digits = 0;
        while (i < len) {
            uint8_t ch = b[i];
            int d = ch >= '0' && ch <= '9'   ? ch - '0'
                    : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                    : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                             : -1;
            if (d < 0)
                break;
            if (size > (UINT64_MAX >> 4))
                return -1;
            size = size * 16 + (uint64_t)d;
            digits++;
            i++;
        }
        if (digits == 0)
            return -1;
        /* skip extensions up to the line's LF */
        while (i < len && b[i] != '\n')
            i++;
        if (i >= len)
            return -1;
        i++;
        if (size == 0)
            break;
        if (size > len - i)
            return -1;
        memcpy(out + o, b + i, (size_t)size);
        o += (size_t)size;
        i += (size_t)size;
        if (len - i < 2 || b[i] != '\r' || b[i + 1] != '\n')
            return -1;
        i += 2;
    }
    /* trailer lines until an empty one */
    for (;;) {
        size_t start = i;
        while (i < len && b[i] != '\n')
            i++;
        if (i >= len)
            return -1;
        i++;
        if (i - start == 2)
            break;
    }
    *out_len = o;
    return 0;
}

#endif
