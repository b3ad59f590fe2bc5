/*
 * api-key: the caller presents a key in a header (or a query parameter);
 * its SHA-256 must be a Consumer's `keyHash` (consumers.h: looked up by
 * hash, compared in constant time). The Consumer is known to every later
 * policy and the log. The key is removed before the request goes upstream
 * unless `forward: true`.
 *
 *   config: {header: X-Api-Key, query: api_key, forward: false}
 */
#include "consumers.h"
#include "policy.h"

#include <ctype.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct {
    const sl_consumers_t *consumers; /* the generation's, outlives us */
    char header[128];
    size_t header_len;
    char query[128]; /* "" = not read from the query */
    size_t query_len;
    int forward;
    char challenge[192]; /* WWW-Authenticate */
} api_key_t;

/* What compile can hold (127 bytes), and what a request can carry: a
 * header token, a query name without the query's own separators. */
static void check_name(sl_vctx_t *c, json_t *v, const void *arg)
{
    const char *s = json_string_value(v);
    int header = arg != NULL, ok = s && *s && strlen(s) <= 127;
    for (const char *p = s; ok && *p; p++)
        ok = header ? isalnum((unsigned char)*p) || strchr("!#$%&'*+-.^_`|~", *p)
                    : *p > 0x20 && *p < 0x7f && !strchr("&=#", *p);
    if (!ok)
        sl_validate_error(c, header ? "a header name of 1 to 127 characters (letters, digits, "
                                      "'-' and the other token characters)"
                                    : "a query parameter name of 1 to 127 printable characters "
                                      "without spaces, '&', '=' or '#'");
}

static const sl_vfield_t fields[] = {
    {"header", check_name, "header", 0},
    {"query", check_name, NULL, 0},
    {"forward", sl_vcheck_bool, NULL, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t schema = {fields, NULL};

static void *compile(json_t *config, const sl_policy_env_t *env, char *err, size_t errlen)
{
    api_key_t *k = calloc(1, sizeof(*k));
    if (!k) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    k->consumers = env->consumers;
    json_t *h = json_object_get(config, "header");
    json_t *q = json_object_get(config, "query");
    const char *hv = json_is_string(h) ? json_string_value(h) : "X-Api-Key";
    const char *qv = json_is_string(q) ? json_string_value(q) : "";
    if (strlen(hv) >= sizeof(k->header) || strlen(qv) >= sizeof(k->query)) {
        snprintf(err, errlen, "header and query names are limited to 127 characters");
        free(k);
        return NULL;
    }
    strcpy(k->header, hv);
    k->header_len = strlen(hv);
    strcpy(k->query, qv);
    k->query_len = strlen(qv);
    k->forward = json_is_true(json_object_get(config, "forward"));
    snprintf(k->challenge, sizeof(k->challenge), "ApiKey realm=\"sluice\", header=\"%s\"", hv);
    return k;
}

static int reject(const api_key_t *k, sl_policy_reply_t *reply, const char *message)
{
    reply->status = 401;
    reply->code = "unauthorized";
    snprintf(reply->message, sizeof(reply->message), "%.250s", message);
    reply->headers[0].name = "WWW-Authenticate";
    snprintf(reply->headers[0].value, sizeof(reply->headers[0].value), "%s", k->challenge);
    reply->num_headers = 1;
    return SL_POLICY_REPLY;
}

static int on_request(const void *state, sl_policy_req_t *req, sl_policy_reply_t *reply)
{
    const api_key_t *k = state;
    sl_str_t key = {NULL, 0};
    int in_query = 0;
    size_t from = 0, to = 0;
    for (size_t i = 0; i < req->num_headers; i++) {
        const sl_policy_header_t *h = &req->headers[i];
        if (h->name.len == k->header_len &&
            strncasecmp(h->name.ptr, k->header, k->header_len) == 0) {
            if (key.ptr) /* two keys: which one is meant is anyone's guess */
                return reject(k, reply, "more than one API key in the request");
            key = h->value;
        }
    }
    if (!key.ptr && k->query_len &&
        sl_policy_query_param(req->query, k->query, k->query_len, &key, &from, &to))
        in_query = 1;
    if (!key.ptr || key.len == 0) {
        char msg[320];
        if (k->query_len)
            snprintf(msg, sizeof(msg),
                     "an API key is required (header %.100s or query parameter %.100s)", k->header,
                     k->query);
        else
            snprintf(msg, sizeof(msg), "an API key is required (header %.100s)", k->header);
        return reject(k, reply, msg);
    }
    uint8_t sha[SHA256_DIGEST_LENGTH];
    if (sl_policy_sha256(key.ptr, key.len, sha) != 0) {
        reply->status = 500;
        reply->code = "policy_error";
        snprintf(reply->message, sizeof(reply->message), "the API key cannot be hashed");
        return SL_POLICY_REPLY;
    }
    const char *credential = NULL;
    const sl_consumer_t *c = sl_consumers_by_key(k->consumers, sha, &credential);
    if (!c)
        return reject(k, reply, "the API key is not valid");
    req->consumer.name = c->name;
    req->consumer.group = c->group;
    req->consumer.credential = credential && credential[0] ? credential : NULL;
    if (k->forward)
        return SL_POLICY_CONTINUE;
    if (in_query) {
        if (sl_policy_query_remove(req, from, to) != 0) {
            reply->status = 500;
            reply->code = "policy_error";
            snprintf(reply->message, sizeof(reply->message), "the request is too large to rewrite");
            return SL_POLICY_REPLY;
        }
    } else if (sl_policy_edit(req, 0, SL_HDR_REMOVE, k->header, k->header_len, NULL, 0) != 0) {
        reply->status = 500;
        reply->code = "policy_error";
        snprintf(reply->message, sizeof(reply->message), "too many header edits");
        return SL_POLICY_REPLY;
    }
    return SL_POLICY_CONTINUE;
}

const sl_policy_def_t sl_policy_api_key = {
    .name = "api-key",
    .phase = SL_PHASE_AUTHN,
    .schema = &schema,
    .compile = compile,
    .free = free,
    .on_request = on_request,
};
