/*
 * libFuzzer driver: the HTTP/1.1 request parser (runtime/http1.c) as
 * runtime/proxy.c drives it. Bytes arrive in socket-like splits and the whole
 * buffer is re-parsed after each read, up to four pipelined requests per
 * input; chunked bodies go through the scanner, also in splits.
 *
 * Input layout: byte 0 picks limits and header capacity, bytes 1..3 seed the
 * split generator, the rest is what the client sends.
 *
 * Invariants (abort() on violation, so libFuzzer saves the input):
 *  - a result is SL_AGAIN, SL_ERROR (with a status of 400/414/431/501/505 and
 *    a message) or a head length <= the bytes parsed;
 *  - every pointer in the result lies inside the parsed head;
 *  - parsing in splits and parsing the whole buffer agree; a shorter prefix
 *    of an accepted head returns SL_AGAIN;
 *  - the chunked scanner gives the same verdict whole and in splits.
 *
 * Not checked here: whether a request *should* be accepted (the unit tests
 * and tests/fuzz/diff_nginx.py do that).
 */
#include "fuzz_chunked.h"
#include "fuzz_util.h"
#include "http1.h"

#define MAX_HEADERS 100
#define MAX_MESSAGES 4

typedef struct {
    ssize_t r;
    sl_http1_request_t req;
    sl_http1_header_t headers[MAX_HEADERS];
} parsed_t;

static void check_result(const char *buf, size_t len, ssize_t r, const sl_http1_request_t *req,
                         size_t capacity)
{
    if (r == SL_AGAIN)
        return;
    if (r == SL_ERROR) {
        int s = req->error_status;
        FUZZ_CHECK(s == 400 || s == 414 || s == 431 || s == 501 || s == 505, "error status %d", s);
        FUZZ_CHECK(req->error != NULL && req->error[0] != '\0', "error without a message");
        return;
    }
    FUZZ_CHECK(r > 0, "unexpected return %zd", r);
    FUZZ_CHECK((size_t)r <= len, "head_len %zd > len %zu", r, len);
    FUZZ_CHECK(req->head_len == (size_t)r, "head_len %zu != return %zd", req->head_len, r);
    FUZZ_CHECK(req->num_headers <= capacity, "num_headers %zu > capacity %zu", req->num_headers,
               capacity);
    FUZZ_CHECK(req->minor_version == 0 || req->minor_version == 1, "minor %d", req->minor_version);
    FUZZ_CHECK(req->method.len > 0, "empty method accepted");
    FUZZ_CHECK(fuzz_within(buf, (size_t)r, req->method.ptr, req->method.len), "method");
    FUZZ_CHECK(fuzz_within(buf, (size_t)r, req->target.ptr, req->target.len), "target");
    FUZZ_CHECK(fuzz_within(buf, (size_t)r, req->path.ptr, req->path.len), "path");
    FUZZ_CHECK(fuzz_within(buf, (size_t)r, req->query.ptr, req->query.len), "query");
    FUZZ_CHECK(fuzz_within(buf, (size_t)r, req->host.ptr, req->host.len), "host");
    FUZZ_CHECK(req->path.len <= req->target.len, "path longer than target");
    FUZZ_CHECK(req->minor_version == 0 || req->host.ptr != NULL, "HTTP/1.1 without Host");
    for (size_t i = 0; i < req->num_headers; i++) {
        const sl_http1_header_t *h = &req->headers[i];
        FUZZ_CHECK(h->name.len > 0, "empty header name at %zu", i);
        FUZZ_CHECK(fuzz_within(buf, (size_t)r, h->name.ptr, h->name.len), "header name %zu", i);
        FUZZ_CHECK(fuzz_within(buf, (size_t)r, h->value.ptr, h->value.len), "header value %zu", i);
        if (h->value.len > 0) {
            unsigned char first = (unsigned char)h->value.ptr[0];
            unsigned char last = (unsigned char)h->value.ptr[h->value.len - 1];
            FUZZ_CHECK(first != ' ' && first != '\t' && last != ' ' && last != '\t',
                       "header value %zu keeps OWS", i);
        }
    }
    FUZZ_CHECK(req->body <= SL_HTTP1_BODY_CHUNKED, "request body kind %d", (int)req->body);
    FUZZ_CHECK(req->body == SL_HTTP1_BODY_LENGTH || req->content_length == 0,
               "content_length %llu without a length body",
               (unsigned long long)req->content_length);
}

/* One parse of buf[0..len) from an exact-size copy, like a fresh read. */
static void parse_copy(const uint8_t *data, size_t len, const sl_http1_limits_t *lim,
                       size_t capacity, parsed_t *out)
{
    char *copy = fuzz_dup(data, len);
    memset(&out->req, 0, sizeof(out->req));
    out->req.headers = out->headers;
    out->req.num_headers = capacity;
    out->r = sl_http1_parse_request(copy, len, lim, &out->req);
    check_result(copy, len, out->r, &out->req, capacity);
    /* Re-base pointers onto data so results of different copies compare. */
    if (out->r > 0) {
        ptrdiff_t d = (const char *)data - copy;
#define REBASE(s)                                                                                  \
    do {                                                                                           \
        if ((s).ptr)                                                                               \
            (s).ptr += d;                                                                          \
    } while (0)
        REBASE(out->req.method);
        REBASE(out->req.target);
        REBASE(out->req.path);
        REBASE(out->req.query);
        REBASE(out->req.host);
        for (size_t i = 0; i < out->req.num_headers; i++) {
            REBASE(out->headers[i].name);
            REBASE(out->headers[i].value);
        }
#undef REBASE
    }
    free(copy);
}

static int str_same(sl_str_t a, sl_str_t b)
{
    return a.len == b.len && (a.len == 0 || a.ptr == b.ptr);
}

static void same_request(const parsed_t *a, const parsed_t *b)
{
    FUZZ_CHECK(a->r == b->r, "split result %zd vs whole %zd", a->r, b->r);
    if (a->r <= 0)
        return;
    const sl_http1_request_t *x = &a->req, *y = &b->req;
    FUZZ_CHECK(str_same(x->method, y->method) && x->method_bit == y->method_bit, "method");
    FUZZ_CHECK(str_same(x->target, y->target), "target");
    FUZZ_CHECK(str_same(x->path, y->path) && str_same(x->query, y->query), "path/query");
    FUZZ_CHECK(str_same(x->host, y->host), "host");
    FUZZ_CHECK(x->minor_version == y->minor_version, "minor_version");
    FUZZ_CHECK(x->num_headers == y->num_headers, "num_headers %zu vs %zu", x->num_headers,
               y->num_headers);
    FUZZ_CHECK(x->body == y->body && x->content_length == y->content_length, "framing");
    FUZZ_CHECK(x->flags == y->flags, "flags %x vs %x", x->flags, y->flags);
}

/*
 * One request head at data[0..len): parsed in splits as the proxy does, and
 * whole. Returns the head length, or 0 when the input ends before the head
 * does or the head is rejected.
 */
static size_t one_head(const uint8_t *data, size_t len, const sl_http1_limits_t *lim,
                       size_t capacity, fuzz_rng_t *rng, parsed_t *split)
{
    static parsed_t whole, probe;
    size_t have = 0;
    split->r = SL_AGAIN;
    while (have < len) {
        have += fuzz_next_split(rng, len - have);
        parse_copy(data, have, lim, capacity, split);
        if (split->r != SL_AGAIN)
            break;
    }
    parse_copy(data, len, lim, capacity, &whole);
    if (whole.r > 0) {
        /* An accepted head is accepted identically however it arrived, and
         * every proper prefix of it is only incomplete. */
        same_request(split, &whole);
        size_t h = (size_t)whole.r;
        parse_copy(data, h - 1, lim, capacity, &probe);
        FUZZ_CHECK(probe.r == SL_AGAIN, "prefix of %zu of an accepted %zu-byte head gave %zd",
                   h - 1, h, probe.r);
        size_t cut = fuzz_rng_next(rng) % h;
        parse_copy(data, cut, lim, capacity, &probe);
        FUZZ_CHECK(probe.r == SL_AGAIN, "prefix of %zu of an accepted %zu-byte head gave %zd", cut,
                   h, probe.r);
        return h;
    }
    if (split->r > 0)
        FUZZ_CHECK(0, "split accepted %zd bytes, whole buffer gave %zd", split->r, whole.r);
    if (split->r == SL_ERROR)
        FUZZ_CHECK(whole.r == SL_ERROR, "split rejected, whole buffer gave %zd", whole.r);
    return 0;
}

/* Scanner verdicts over body bytes, whole and in splits; returns the bytes
 * the body took when it is complete, else 0. */
static size_t chunked_body(const uint8_t *data, size_t len, fuzz_rng_t *rng)
{
    fuzz_chunk_verdict_t w = fuzz_chunk_whole(data, len);
    fuzz_chunk_verdict_t s = fuzz_chunk_split(data, len, rng);
    fuzz_chunk_same(&w, &s, "chunked scan whole vs split");
    return !w.error && w.done ? w.consumed : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static parsed_t split;
    if (size < 4)
        return 0;
    uint8_t cfg = data[0];
    fuzz_rng_t rng;
    fuzz_rng_init(&rng, (uint32_t)data[1] | (uint32_t)data[2] << 8 | (uint32_t)data[3] << 16);
    data += 4;
    size -= 4;

    /* Small limits make the 414/431 paths reachable with small inputs. */
    sl_http1_limits_t lim = {8192, 32768, 100};
    if (cfg & 1)
        lim = (sl_http1_limits_t){(uint32_t)(cfg >> 2) + 8, 256 + (uint32_t)cfg * 4,
                                  (uint32_t)(cfg >> 4) + 1};
    size_t capacity = (cfg & 2) ? 1 + (cfg >> 5) : MAX_HEADERS;

    size_t pos = 0;
    for (int m = 0; m < MAX_MESSAGES && pos < size; m++) {
        size_t h = one_head(data + pos, size - pos, &lim, capacity, &rng, &split);
        if (h == 0) {
            /* Not a request: still exercise the scanner on the raw bytes. */
            if (m == 0)
                (void)chunked_body(data + pos, size - pos, &rng);
            break;
        }
        pos += h;
        if (split.req.body == SL_HTTP1_BODY_LENGTH) {
            if (split.req.content_length > size - pos)
                break;
            pos += (size_t)split.req.content_length;
        } else if (split.req.body == SL_HTTP1_BODY_CHUNKED) {
            size_t b = chunked_body(data + pos, size - pos, &rng);
            if (b == 0)
                break;
            pos += b;
        }
        if (!(split.req.flags & SL_HTTP1_F_KEEP_ALIVE))
            break;
    }
    return 0;
}
