/*
 * redirect: answers with a redirection instead of the upstream
 * (docs/policies/redirect.md).
 *
 *   config: {status: 301, location: "https://new.example.com${path}${query}"}
 *
 * status is 301, 302 (the default), 303, 307 or 308. location is a template
 * with ${path} (the request path, from its '/'), ${query} ("?" and the query
 * string when the request has one, else nothing) and ${host} (the request's
 * host, without port). The body is empty.
 */
#include "policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LOCATION 2048

enum var { V_NONE = 0, V_PATH, V_QUERY, V_HOST };
static const char *const var_names[] = {NULL, "path", "query", "host"};

typedef struct {
    int status;
    char *location; /* the template */
    int literal;    /* no variables */
} redirect_t;

static enum var var_of(const char *s, size_t len)
{
    for (int v = 1; v < 4; v++)
        if (strlen(var_names[v]) == len && memcmp(var_names[v], s, len) == 0)
            return (enum var)v;
    return V_NONE;
}

static void check_location(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    const char *s = json_string_value(v);
    if (!s || !*s || strlen(s) > MAX_LOCATION) {
        sl_validate_error(c, "expected a URL or path of 1 to %d characters", MAX_LOCATION);
        return;
    }
    for (const char *p = s; *p; p++) {
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f) {
            sl_validate_error(c, "spaces and control characters are not allowed (percent-encode "
                                 "them)");
            return;
        }
        if (p[0] == '$' && p[1] == '{') {
            const char *end = strchr(p, '}');
            if (!end || var_of(p + 2, (size_t)(end - p - 2)) == V_NONE) {
                sl_validate_error(c, "unknown variable in '%.64s' (known: ${path}, ${query}, "
                                     "${host})", s);
                return;
            }
        }
    }
}

static void check_status(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    json_int_t s = json_is_integer(v) ? json_integer_value(v) : 0;
    if (s != 301 && s != 302 && s != 303 && s != 307 && s != 308)
        sl_validate_error(c, "expected 301, 302, 303, 307 or 308");
}

static const sl_vfield_t fields[] = {
    {"status", check_status, NULL, 0},
    {"location", check_location, NULL, SL_VFIELD_REQUIRED},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t schema = {fields, NULL};

static void rdfree(void *state)
{
    redirect_t *r = state;
    if (r)
        free(r->location);
    free(r);
}

static void *compile(json_t *config, const sl_policy_env_t *env, char *err, size_t errlen)
{
    (void)env;
    redirect_t *r = calloc(1, sizeof(*r));
    if (!r || !(r->location = strdup(json_string_value(json_object_get(config, "location"))))) {
        rdfree(r);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    json_t *st = json_object_get(config, "status");
    r->status = st ? (int)json_integer_value(st) : 302;
    r->literal = !strstr(r->location, "${");
    return r;
}

static sl_str_t var_value(const sl_policy_req_t *req, enum var v)
{
    switch (v) {
    case V_PATH:
        return req->path;
    case V_QUERY: /* expand() puts the '?' before it */
        return req->query;
    case V_HOST:
        return req->host;
    default:
        return (sl_str_t){"", 0};
    }
}

/*
 * Expands the template into out (NULL: measures only); returns the length.
 * A variable's CR, LF and other controls cannot reach the header: the
 * codecs refuse them in the request, and they are replaced here anyway.
 */
static size_t expand(const char *tpl, const sl_policy_req_t *req, char *out)
{
    size_t o = 0;
    for (const char *p = tpl; *p;) {
        const char *end;
        if (p[0] == '$' && p[1] == '{' && (end = strchr(p, '}'))) {
            enum var var = var_of(p + 2, (size_t)(end - p - 2));
            sl_str_t v = var_value(req, var);
            if (var == V_QUERY && v.len) {
                if (out)
                    out[o] = '?';
                o++;
            }
            for (size_t i = 0; i < v.len; i++, o++)
                if (out)
                    out[o] = (unsigned char)v.ptr[i] < 0x20 ? '_' : v.ptr[i];
            p = end + 1;
        } else {
            if (out)
                out[o] = *p;
            o++;
            p++;
        }
    }
    return o;
}

static int on_request(const void *state, sl_policy_req_t *req, sl_policy_reply_t *reply)
{
    const redirect_t *r = state;
    const char *loc = r->location;
    size_t len = strlen(loc);
    if (!r->literal) {
        len = expand(r->location, req, NULL);
        char *out = sl_policy_alloc(req, len ? len : 1);
        if (!out) {
            reply->status = 500;
            reply->code = "policy_error";
            snprintf(reply->message, sizeof(reply->message), "the redirect location is too long");
            return SL_POLICY_REPLY;
        }
        expand(r->location, req, out);
        loc = out;
    }
    /* Location as a response edit: no bound of a reply header's value. */
    if (sl_policy_edit(req, 1, SL_HDR_SET, "Location", 8, loc, len) != 0) {
        reply->status = 500;
        reply->code = "policy_error";
        snprintf(reply->message, sizeof(reply->message), "too many header changes");
        return SL_POLICY_REPLY;
    }
    reply->status = r->status;
    reply->code = "redirect";
    snprintf(reply->message, sizeof(reply->message), "redirected");
    reply->body = "";
    reply->body_len = 0;
    reply->content_type = "text/plain; charset=utf-8";
    return SL_POLICY_REPLY;
}

const sl_policy_def_t sl_policy_redirect = {
    .name = "redirect",
    .phase = SL_PHASE_REQUEST,
    .schema = &schema,
    .compile = compile,
    .free = rdfree,
    .on_request = on_request,
};
