/*
 * respond: answers every request it applies to with a fixed response, for
 * mocks and maintenance windows (with `when`, for some requests only).
 *
 *   config: {status: 503, body: '{"message": "back soon"}',
 *            contentType: application/json, headers: {Retry-After: "120"}}
 */
#include "policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BODY (64 * 1024)

typedef struct {
    int status;
    char *body;
    size_t body_len;
    char *content_type;
    struct {
        char *name;
        char *value;
    } headers[SL_POLICY_MAX_REPLY_HEADERS];
    unsigned n;
} respond_t;

static const sl_vrange_t status_range = {200, 599};

static void check_body(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_string(v))
        sl_validate_error(c, "expected a string");
    else if (json_string_length(v) > MAX_BODY)
        sl_validate_error(c, "longer than %d bytes", MAX_BODY);
}

static void check_headers(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_object(v)) {
        sl_validate_error(c, "expected an object of header names to values");
        return;
    }
    if (json_object_size(v) > SL_POLICY_MAX_REPLY_HEADERS)
        sl_validate_error(c, "at most %d headers", SL_POLICY_MAX_REPLY_HEADERS);
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val)
    {
        size_t saved = sl_validate_push_key(c, key);
        const char *s = json_string_value(val);
        if (!s)
            sl_validate_error(c, "expected a string value");
        else if (strlen(key) > 64 || strlen(s) > 190 || strpbrk(s, "\r\n") || !*key ||
                 strpbrk(key, " :\r\n\t"))
            sl_validate_error(c, "a header name up to 64 characters and a one-line value up to "
                                 "190 characters");
        sl_validate_pop(c, saved);
    }
}

static const sl_vfield_t fields[] = {
    {"status", sl_vcheck_int, &status_range, SL_VFIELD_REQUIRED},
    {"body", check_body, NULL, 0},
    {"contentType", sl_vcheck_string, NULL, 0},
    {"headers", check_headers, NULL, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t schema = {fields, NULL};

static void rfree(void *state)
{
    respond_t *r = state;
    if (!r)
        return;
    free(r->body);
    free(r->content_type);
    for (unsigned i = 0; i < r->n; i++) {
        free(r->headers[i].name);
        free(r->headers[i].value);
    }
    free(r);
}

static void *compile(json_t *config, const sl_policy_env_t *env, char *err, size_t errlen)
{
    (void)env;
    respond_t *r = calloc(1, sizeof(*r));
    if (!r)
        goto oom;
    r->status = (int)json_integer_value(json_object_get(config, "status"));
    json_t *body = json_object_get(config, "body");
    const char *b = json_is_string(body) ? json_string_value(body) : "";
    r->body_len = json_is_string(body) ? json_string_length(body) : 0;
    r->body = malloc(r->body_len + 1);
    if (!r->body)
        goto oom;
    memcpy(r->body, b, r->body_len + 1);
    json_t *ct = json_object_get(config, "contentType");
    r->content_type = strdup(json_is_string(ct) ? json_string_value(ct)
                             : (b[0] == '{' || b[0] == '[') ? "application/json"
                                                            : "text/plain; charset=utf-8");
    if (!r->content_type)
        goto oom;
    const char *key;
    json_t *val;
    json_object_foreach(json_object_get(config, "headers"), key, val)
    {
        if (r->n == SL_POLICY_MAX_REPLY_HEADERS)
            break;
        r->headers[r->n].name = strdup(key);
        r->headers[r->n].value = strdup(json_string_value(val));
        if (!r->headers[r->n].name || !r->headers[r->n++].value)
            goto oom;
    }
    return r;
oom:
    rfree(r);
    snprintf(err, errlen, "out of memory");
    return NULL;
}

static int on_request(const void *state, sl_policy_req_t *req, sl_policy_reply_t *reply)
{
    (void)req;
    const respond_t *r = state;
    reply->status = r->status;
    reply->code = "respond";
    reply->body = r->body;
    reply->body_len = r->body_len;
    reply->content_type = r->content_type;
    for (unsigned i = 0; i < r->n; i++) {
        reply->headers[i].name = r->headers[i].name;
        snprintf(reply->headers[i].value, sizeof(reply->headers[i].value), "%s",
                 r->headers[i].value);
    }
    reply->num_headers = r->n;
    return SL_POLICY_REPLY;
}

const sl_policy_def_t sl_policy_respond = {
    .name = "respond",
    .phase = SL_PHASE_REQUEST,
    .schema = &schema,
    .compile = compile,
    .free = rfree,
    .on_request = on_request,
};
