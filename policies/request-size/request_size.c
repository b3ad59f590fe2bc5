/*
 * request-size: a request body limit for an Api or an operation
 * (docs/policies/request-size.md).
 *
 *   config: {maxBytes: 1048576}
 *
 * A declared Content-Length over the limit is refused at once (413
 * payload_too_large, before anything reaches the upstream). A body without
 * a declared length (chunked, HTTP/2 DATA without content-length) is
 * counted while it streams: the policy hands its limit to the request
 * (sl_policy_req_t.max_body_bytes), the lower of it and the route's
 * maxRequestBodyBytes holds, and the codecs stop the body at the first
 * byte past it (413 if the response has not started, the upstream request
 * aborted).
 */
#include "policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

typedef struct {
    uint64_t max_bytes;
} request_size_t;

/* Up to 2^53 bytes: what JSON and YAML carry exactly. */
static const sl_vrange_t max_range = {1, (int64_t)1 << 53};

static const sl_vfield_t fields[] = {
    {"maxBytes", sl_vcheck_int, &max_range, SL_VFIELD_REQUIRED},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t schema = {fields, NULL};

static void *compile(json_t *config, const sl_policy_env_t *env, char *err, size_t errlen)
{
    (void)env;
    request_size_t *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->max_bytes = (uint64_t)json_integer_value(json_object_get(config, "maxBytes"));
    return s;
}

/* The Content-Length the client declared, or -1 (none, or not a plain
 * number: the codecs have refused anything ambiguous already). */
static int64_t declared_length(const sl_policy_req_t *r)
{
    for (size_t i = 0; i < r->num_headers; i++) {
        const sl_policy_header_t *h = &r->headers[i];
        if (h->name.len != 14 || strncasecmp(h->name.ptr, "content-length", 14) != 0)
            continue;
        if (h->value.len == 0 || h->value.len > 18)
            return -1;
        int64_t n = 0;
        for (size_t k = 0; k < h->value.len; k++) {
            if (h->value.ptr[k] < '0' || h->value.ptr[k] > '9')
                return -1;
            n = n * 10 + (h->value.ptr[k] - '0');
        }
        return n;
    }
    return -1;
}

static int on_request(const void *state, sl_policy_req_t *req, sl_policy_reply_t *reply)
{
    const request_size_t *s = state;
    int64_t len = declared_length(req);
    if (len >= 0 && (uint64_t)len > s->max_bytes) {
        reply->status = 413;
        reply->code = "payload_too_large";
        snprintf(reply->message, sizeof(reply->message),
                 "the request body exceeds the limit of %llu bytes",
                 (unsigned long long)s->max_bytes);
        return SL_POLICY_REPLY;
    }
    if (!req->max_body_bytes || s->max_bytes < req->max_body_bytes)
        req->max_body_bytes = s->max_bytes;
    return SL_POLICY_CONTINUE;
}

const sl_policy_def_t sl_policy_request_size = {
    .name = "request-size",
    .phase = SL_PHASE_REQUEST,
    .schema = &schema,
    .compile = compile,
    .free = free,
    .on_request = on_request,
};
