/*
 * libFuzzer driver: the upstream response parser and the chunked body
 * scanner/decoder of runtime/http1.c. An upstream is untrusted input too: a
 * compromised or buggy backend must get a 502, never a crash or a misframed
 * response on a reused connection.
 *
 * Input layout: byte 0 picks the request method (HEAD or not), the head size
 * limit and header capacity; bytes 1..3 seed the split generator; the rest is
 * what the upstream sends (up to four responses on one connection, e.g. a
 * 100 Continue then the final response).
 *
 * Invariants (abort() on violation):
 *  - results are SL_AGAIN, SL_ERROR with a message, or a head length within
 *    the buffer and the head limit, with pointers inside the head;
 *  - split and whole parsing agree; a prefix of an accepted head is SL_AGAIN;
 *  - the chunked scanner gives the same verdict whole and in splits;
 *  - sl_http1_chunked_decode, in splits, agrees with the scanner and its
 *    payload equals the payload a separately written de-chunker reads from
 *    the same bytes, with the length the scanner counted.
 */
#include "fuzz_chunked.h"
#include "fuzz_util.h"
#include "http1.h"

#define MAX_HEADERS 64
#define MAX_MESSAGES 4

typedef struct {
    ssize_t r;
    sl_http1_response_t resp;
    sl_http1_header_t headers[MAX_HEADERS];
} parsed_t;

static void check_result(const char *buf, size_t len, ssize_t r, const sl_http1_response_t *resp,
                         size_t capacity, size_t max_head)
{
    if (r == SL_AGAIN) {
        FUZZ_CHECK(len < max_head, "SL_AGAIN with %zu bytes at a %zu-byte limit", len, max_head);
        return;
    }
    if (r == SL_ERROR) {
        FUZZ_CHECK(resp->error != NULL && resp->error[0] != '\0', "error without a message");
        return;
    }
    FUZZ_CHECK(r > 0, "unexpected return %zd", r);
    FUZZ_CHECK((size_t)r <= len && (size_t)r <= max_head, "head_len %zd, len %zu, limit %zu", r,
               len, max_head);
    FUZZ_CHECK(resp->head_len == (size_t)r, "head_len field %zu != %zd", resp->head_len, r);
    FUZZ_CHECK(resp->status >= 100 && resp->status <= 599, "status %d", resp->status);
    FUZZ_CHECK(resp->minor_version == 0 || resp->minor_version == 1, "minor %d",
               resp->minor_version);
    FUZZ_CHECK(resp->num_headers <= capacity, "num_headers %zu > %zu", resp->num_headers, capacity);
    FUZZ_CHECK(fuzz_within(buf, (size_t)r, resp->reason.ptr, resp->reason.len), "reason");
    for (size_t i = 0; i < resp->num_headers; i++) {
        const sl_http1_header_t *h = &resp->headers[i];
        FUZZ_CHECK(h->name.len > 0, "empty header name");
        FUZZ_CHECK(fuzz_within(buf, (size_t)r, h->name.ptr, h->name.len), "name %zu", i);
        FUZZ_CHECK(fuzz_within(buf, (size_t)r, h->value.ptr, h->value.len), "value %zu", i);
    }
    int bodiless = resp->status < 200 || resp->status == 204 || resp->status == 304;
    FUZZ_CHECK(!bodiless || resp->body == SL_HTTP1_BODY_NONE, "status %d with a body kind %d",
               resp->status, (int)resp->body);
    FUZZ_CHECK(resp->body == SL_HTTP1_BODY_LENGTH || resp->content_length == 0,
               "content_length without a length body");
    FUZZ_CHECK(resp->body != SL_HTTP1_BODY_CLOSE || !(resp->flags & SL_HTTP1_F_KEEP_ALIVE),
               "close-delimited body on a keep-alive connection");
}

static void parse_copy(const uint8_t *data, size_t len, unsigned method_bit, size_t max_head,
                       size_t capacity, parsed_t *out)
{
    char *copy = fuzz_dup(data, len);
    memset(&out->resp, 0, sizeof(out->resp));
    out->resp.headers = out->headers;
    out->resp.num_headers = capacity;
    out->r = sl_http1_parse_response(copy, len, method_bit, max_head, &out->resp);
    check_result(copy, len, out->r, &out->resp, capacity, max_head);
    free(copy);
}

static void same_response(const parsed_t *a, const parsed_t *b)
{
    FUZZ_CHECK(a->r == b->r, "split result %zd vs whole %zd", a->r, b->r);
    if (a->r <= 0)
        return;
    FUZZ_CHECK(a->resp.status == b->resp.status, "status");
    FUZZ_CHECK(a->resp.minor_version == b->resp.minor_version, "minor");
    FUZZ_CHECK(a->resp.num_headers == b->resp.num_headers, "num_headers");
    FUZZ_CHECK(a->resp.body == b->resp.body && a->resp.content_length == b->resp.content_length,
               "framing");
    FUZZ_CHECK(a->resp.flags == b->resp.flags, "flags");
}

static size_t one_head(const uint8_t *data, size_t len, unsigned method_bit, size_t max_head,
                       size_t capacity, fuzz_rng_t *rng, parsed_t *split)
{
    static parsed_t whole, probe;
    size_t have = 0;
    split->r = SL_AGAIN;
    while (have < len) {
        have += fuzz_next_split(rng, len - have);
        parse_copy(data, have, method_bit, max_head, capacity, split);
        if (split->r != SL_AGAIN)
            break;
    }
    parse_copy(data, len, method_bit, max_head, capacity, &whole);
    if (whole.r > 0) {
        same_response(split, &whole);
        size_t h = (size_t)whole.r;
        parse_copy(data, h - 1, method_bit, max_head, capacity, &probe);
        FUZZ_CHECK(probe.r == SL_AGAIN, "prefix %zu of an accepted %zu-byte head gave %zd", h - 1,
                   h, probe.r);
        size_t cut = fuzz_rng_next(rng) % h;
        parse_copy(data, cut, method_bit, max_head, capacity, &probe);
        FUZZ_CHECK(probe.r == SL_AGAIN, "prefix %zu of an accepted %zu-byte head gave %zd", cut, h,
                   probe.r);
        return h;
    }
    FUZZ_CHECK(split->r <= 0, "split accepted %zd, whole gave %zd", split->r, whole.r);
    if (split->r == SL_ERROR)
        FUZZ_CHECK(whole.r == SL_ERROR, "split rejected, whole gave %zd", whole.r);
    return 0;
}

/* Scan whole, scan split, decode split and a reference de-chunk must agree.
 * Returns the body's length when complete, else 0. */
static size_t chunked_body(const uint8_t *data, size_t len, fuzz_rng_t *rng)
{
    fuzz_chunk_verdict_t w = fuzz_chunk_whole(data, len);
    fuzz_chunk_verdict_t s = fuzz_chunk_split(data, len, rng);
    fuzz_chunk_same(&w, &s, "scan whole vs split");
    uint8_t *payload = NULL;
    size_t payload_len = 0;
    fuzz_chunk_verdict_t d = fuzz_chunk_decode_split(data, len, rng, &payload, &payload_len);
    fuzz_chunk_same(&w, &d, "scan whole vs decode split");
    if (!d.error)
        FUZZ_CHECK(payload_len == d.data_bytes, "decode produced %zu bytes, counted %llu",
                   payload_len, (unsigned long long)d.data_bytes);
    if (!w.error && w.done) {
        uint8_t *ref = malloc(len ? len : 1);
        size_t ref_len = 0;
        if (!ref)
            abort();
        FUZZ_CHECK(fuzz_chunk_reference(data, w.consumed, ref, &ref_len) == 0,
                   "scanner accepted a %zu-byte body the reference de-chunker cannot read",
                   w.consumed);
        FUZZ_CHECK(ref_len == payload_len && memcmp(ref, payload, ref_len) == 0,
                   "decoded payload (%zu bytes) differs from the reference (%zu bytes)",
                   payload_len, ref_len);
        free(ref);
    }
    free(payload);
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
    unsigned method_bit = (cfg & 1) ? SL_METHOD_HEAD : SL_METHOD_GET;
    size_t max_head = (cfg & 2) ? 16 + (size_t)(cfg >> 2) * 4 : 65536;
    size_t capacity = (cfg & 0x80) ? 1 + ((cfg >> 2) & 3) : MAX_HEADERS;

    size_t pos = 0;
    for (int m = 0; m < MAX_MESSAGES && pos < size; m++) {
        size_t h = one_head(data + pos, size - pos, method_bit, max_head, capacity, &rng, &split);
        if (h == 0) {
            if (m == 0)
                (void)chunked_body(data + pos, size - pos, &rng);
            break;
        }
        pos += h;
        if (split.resp.body == SL_HTTP1_BODY_LENGTH) {
            if (split.resp.content_length > size - pos)
                break;
            pos += (size_t)split.resp.content_length;
        } else if (split.resp.body == SL_HTTP1_BODY_CHUNKED) {
            size_t b = chunked_body(data + pos, size - pos, &rng);
            if (b == 0)
                break;
            pos += b;
        } else if (split.resp.body == SL_HTTP1_BODY_CLOSE) {
            break;
        }
        if (split.resp.status >= 200 && !(split.resp.flags & SL_HTTP1_F_KEEP_ALIVE))
            break;
    }
    return 0;
}
