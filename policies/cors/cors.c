/*
 * cors: Cross-Origin Resource Sharing as the Fetch standard defines it, at
 * the gateway (docs/policies/cors.md).
 *
 *   preflight  OPTIONS with Origin and Access-Control-Request-Method: the
 *              gateway answers it, never the upstream: 204 with the
 *              Access-Control-* headers, or 403 cors_rejected naming the
 *              origin, method or header that is not allowed;
 *   actual     a request with Origin: from an allowed origin, the response
 *              (the upstream's or the gateway's own error) gets
 *              Access-Control-Allow-Origin, -Allow-Credentials and
 *              -Expose-Headers; from any other origin it gets none (the
 *              browser blocks it) and the request still goes upstream, as
 *              it would without CORS. Vary: Origin whenever the answer
 *              depends on the origin.
 *
 * Phase ACCESS, not REQUEST: browsers never send credentials with a
 * preflight, so a preflight that met api-key or jwt first would always be
 * refused; and the response headers are decided here, in on_request, while
 * the request's headers are still readable (at response time the codec may
 * have reused the buffer they were in), as response edits that every
 * response of the request then carries, a 401 of a later policy included.
 * Put ip-filter before cors in the list when preflights from denied
 * addresses must be refused too.
 */
#include "policy.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <ctype.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_LIST 64

typedef struct {
    char **origins; /* exact, lower case; "*" = any */
    size_t norigins;
    int any_origin;
    pcre2_code **patterns;
    size_t npatterns;
    char **methods; /* NULL = default: the operation's methods */
    size_t nmethods;
    int any_method;
    char **headers; /* allowed request headers, lower case */
    size_t nheaders;
    int any_header;
    char *expose;  /* joined exposeHeaders, NULL = none */
    char *max_age; /* decimal, NULL = not sent */
    int credentials;
    int origin_dependent; /* responses differ by Origin: Vary: Origin */
} cors_t;

/* ---- validation --------------------------------------------------------------- */

static int is_tchar(unsigned char ch)
{
    return isalnum(ch) || strchr("!#$%&'*+-.^_`|~", ch);
}

static int is_token(const char *s)
{
    if (!*s)
        return 0;
    for (; *s; s++)
        if (!is_tchar((unsigned char)*s))
            return 0;
    return 1;
}

/* "scheme://host[:port]", as browsers serialise an origin. */
static int is_origin(const char *s)
{
    const char *sep = strstr(s, "://");
    if (!sep || sep == s || !sep[3])
        return 0;
    for (const char *p = s; p < sep; p++)
        if (!isalnum((unsigned char)*p) && !strchr("+-.", *p))
            return 0;
    for (const char *p = sep + 3; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("-.:[]_", *p))
            return 0;
    return 1;
}

static void check_origin(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    const char *s = json_string_value(v);
    if (!s)
        sl_validate_error(c, "expected a string");
    else if (strcmp(s, "*") != 0 && !is_origin(s))
        sl_validate_error(c,
                          "'%.80s' is not an origin: scheme://host[:port] with no path or "
                          "trailing slash (https://app.example.com), or \"*\"",
                          s);
}

static void check_token(sl_vctx_t *c, json_t *v, const void *arg)
{
    const char *s = json_string_value(v);
    if (!s || (strcmp(s, "*") != 0 && (!is_token(s) || strlen(s) > 128)))
        sl_validate_error(c, "expected %s (an RFC 9110 token) or \"*\"", (const char *)arg);
}

static void check_expose(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    const char *s = json_string_value(v);
    if (!s || !is_token(s) || strlen(s) > 128)
        sl_validate_error(c, "expected a header name");
}

static const sl_vrange_t max_age_range = {0, 86400};

static void check_rules(sl_vctx_t *c, json_t *obj)
{
    json_t *origins = json_object_get(obj, "allowOrigins");
    if (!json_array_size(origins) &&
        !json_array_size(json_object_get(obj, "allowOriginPatterns"))) {
        sl_validate_error(c, "allowOrigins or allowOriginPatterns is required (the origins "
                             "that may call this API)");
        return;
    }
    if (!json_is_true(json_object_get(obj, "allowCredentials")))
        return;
    for (size_t i = 0; i < json_array_size(origins); i++) {
        const char *s = json_string_value(json_array_get(origins, i));
        if (s && strcmp(s, "*") == 0) {
            size_t saved = sl_validate_push_key(c, "allowOrigins");
            size_t saved2 = sl_validate_push_index(c, i);
            sl_validate_error(c, "\"*\" cannot be used with allowCredentials: true (browsers "
                                 "refuse credentialed responses to any origin); list the "
                                 "origins, or match them with allowOriginPatterns");
            sl_validate_pop(c, saved2);
            sl_validate_pop(c, saved);
        }
    }
}

static const sl_vfield_t fields[] = {
    {"allowOrigins", sl_vcheck_array, &(const sl_varray_t){check_origin, NULL, 1, MAX_LIST}, 0},
    {"allowOriginPatterns", sl_vcheck_array, &(const sl_varray_t){sl_vcheck_regex, NULL, 1, 32}, 0},
    {"allowMethods", sl_vcheck_array, &(const sl_varray_t){check_token, "a method", 1, 32}, 0},
    {"allowHeaders", sl_vcheck_array,
     &(const sl_varray_t){check_token, "a header name", 1, MAX_LIST}, 0},
    {"exposeHeaders", sl_vcheck_array, &(const sl_varray_t){check_expose, NULL, 1, MAX_LIST}, 0},
    {"allowCredentials", sl_vcheck_bool, NULL, 0},
    {"maxAgeSeconds", sl_vcheck_int, &max_age_range, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t schema = {fields, check_rules};

/* ---- compile ------------------------------------------------------------------ */

static void free_list(char **l, size_t n)
{
    for (size_t i = 0; l && i < n; i++)
        free(l[i]);
    free(l);
}

static void cfree(void *state)
{
    cors_t *c = state;
    if (!c)
        return;
    free_list(c->origins, c->norigins);
    for (size_t i = 0; i < c->npatterns; i++)
        pcre2_code_free(c->patterns[i]);
    free(c->patterns);
    free_list(c->methods, c->nmethods);
    free_list(c->headers, c->nheaders);
    free(c->expose);
    free(c->max_age);
    free(c);
}

/* A list of strings (lower-cased when `lower`); sets *any for "*". */
static int copy_list(json_t *a, char ***out, size_t *n, int *any, int lower)
{
    *out = calloc(json_array_size(a) + 1, sizeof(**out));
    if (!*out)
        return -1;
    for (size_t i = 0; i < json_array_size(a); i++) {
        const char *s = json_string_value(json_array_get(a, i));
        if (strcmp(s, "*") == 0) {
            *any = 1;
            continue;
        }
        char *d = strdup(s);
        if (!d)
            return -1;
        for (char *p = d; lower && *p; p++)
            *p = (char)tolower((unsigned char)*p);
        (*out)[(*n)++] = d;
    }
    return 0;
}

static void *compile(json_t *config, const sl_policy_env_t *env, char *err, size_t errlen)
{
    (void)env;
    cors_t *c = calloc(1, sizeof(*c));
    if (!c)
        goto oom;
    if (copy_list(json_object_get(config, "allowOrigins"), &c->origins, &c->norigins,
                  &c->any_origin, 1) != 0)
        goto oom;
    json_t *pats = json_object_get(config, "allowOriginPatterns");
    c->patterns = calloc(json_array_size(pats) + 1, sizeof(*c->patterns));
    if (!c->patterns)
        goto oom;
    for (size_t i = 0; i < json_array_size(pats); i++) {
        int ec;
        PCRE2_SIZE off;
        c->patterns[i] = pcre2_compile((PCRE2_SPTR)json_string_value(json_array_get(pats, i)),
                                       PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED | PCRE2_ENDANCHORED,
                                       &ec, &off, NULL);
        if (!c->patterns[i]) {
            snprintf(err, errlen, "allowOriginPatterns[%zu] does not compile", i);
            cfree(c);
            return NULL;
        }
        c->npatterns++;
    }
    json_t *methods = json_object_get(config, "allowMethods");
    if (methods && copy_list(methods, &c->methods, &c->nmethods, &c->any_method, 0) != 0)
        goto oom;
    if (copy_list(json_object_get(config, "allowHeaders"), &c->headers, &c->nheaders,
                  &c->any_header, 1) != 0)
        goto oom;
    json_t *expose = json_object_get(config, "exposeHeaders");
    if (json_array_size(expose)) {
        size_t len = 0;
        for (size_t i = 0; i < json_array_size(expose); i++)
            len += strlen(json_string_value(json_array_get(expose, i))) + 2;
        if (!(c->expose = calloc(1, len + 1)))
            goto oom;
        for (size_t i = 0; i < json_array_size(expose); i++) {
            if (i)
                strcat(c->expose, ", ");
            strcat(c->expose, json_string_value(json_array_get(expose, i)));
        }
    }
    json_t *age = json_object_get(config, "maxAgeSeconds");
    if (age) {
        char buf[24];
        snprintf(buf, sizeof(buf), "%lld", (long long)json_integer_value(age));
        if (!(c->max_age = strdup(buf)))
            goto oom;
    }
    c->credentials = json_is_true(json_object_get(config, "allowCredentials"));
    c->origin_dependent = !c->any_origin || c->credentials;
    return c;
oom:
    cfree(c);
    snprintf(err, errlen, "out of memory");
    return NULL;
}

/* Per-worker match data for the origin patterns. */
static void *worker_new(const void *state)
{
    const cors_t *c = state;
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    (void)c;
    return md;
}

static void worker_free(void *ws)
{
    pcre2_match_data_free(ws);
}

/* ---- per request -------------------------------------------------------------- */

static int origin_allowed(const cors_t *c, sl_str_t o, void *md)
{
    if (c->any_origin)
        return 1;
    for (size_t i = 0; i < c->norigins; i++)
        if (strlen(c->origins[i]) == o.len && strncasecmp(c->origins[i], o.ptr, o.len) == 0)
            return 1;
    for (size_t i = 0; md && i < c->npatterns; i++)
        if (pcre2_match(c->patterns[i], (PCRE2_SPTR)o.ptr, o.len, 0, 0, md, NULL) >= 0)
            return 1;
    return 0;
}

static int is_safelisted_method(sl_str_t m)
{
    return (m.len == 3 && memcmp(m.ptr, "GET", 3) == 0) ||
           (m.len == 4 && memcmp(m.ptr, "HEAD", 4) == 0) ||
           (m.len == 4 && memcmp(m.ptr, "POST", 4) == 0);
}

static int in_list(char *const *l, size_t n, sl_str_t s, int nocase)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(l[i]) == s.len &&
            (nocase ? strncasecmp(l[i], s.ptr, s.len) : memcmp(l[i], s.ptr, s.len)) == 0)
            return 1;
    return 0;
}

/* Methods are case-sensitive (RFC 9110 9.1). */
static int method_allowed(const cors_t *c, const sl_policy_req_t *r, sl_str_t m)
{
    if (is_safelisted_method(m) || c->any_method)
        return 1;
    if (c->methods)
        return in_list(c->methods, c->nmethods, m, 0);
    return in_list((char *const *)r->route_methods, r->num_route_methods, m, 0);
}

/* Access-Control-Allow-Methods: the configured list, or the operation's
 * methods (GET, HEAD, POST for an operation of any method), or, for "*",
 * the method asked for. In the request's arena. */
static sl_str_t methods_value(const cors_t *c, sl_policy_req_t *r, sl_str_t asked)
{
    if (c->any_method)
        return asked;
    char *const *l = c->methods ? c->methods : (char *const *)r->route_methods;
    size_t n = c->methods ? c->nmethods : r->num_route_methods;
    if (n == 0)
        return (sl_str_t){"GET, HEAD, POST", 15};
    size_t len = 0;
    for (size_t i = 0; i < n; i++)
        len += strlen(l[i]) + 2;
    char *out = sl_policy_alloc(r, len);
    if (!out)
        return (sl_str_t){NULL, 0};
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (i) {
            memcpy(out + o, ", ", 2);
            o += 2;
        }
        memcpy(out + o, l[i], strlen(l[i]));
        o += strlen(l[i]);
    }
    return (sl_str_t){out, o};
}

static sl_str_t arena_copy(sl_policy_req_t *r, sl_str_t s)
{
    char *p = sl_policy_alloc(r, s.len ? s.len : 1);
    if (!p)
        return (sl_str_t){NULL, 0};
    memcpy(p, s.ptr, s.len);
    return (sl_str_t){p, s.len};
}

#define EDIT(op, name, v, vlen) sl_policy_edit(r, 1, op, name, strlen(name), v, vlen)

/* The headers of a response to an allowed origin (both kinds of request). */
static int allow_headers(const cors_t *c, sl_policy_req_t *r, sl_str_t origin)
{
    int rc = 0;
    if (c->any_origin && !c->credentials) {
        rc |= EDIT(SL_HDR_SET, "Access-Control-Allow-Origin", "*", 1);
    } else {
        sl_str_t o = arena_copy(r, origin);
        if (!o.ptr)
            return -1;
        rc |= EDIT(SL_HDR_SET, "Access-Control-Allow-Origin", o.ptr, o.len);
    }
    if (c->credentials)
        rc |= EDIT(SL_HDR_SET, "Access-Control-Allow-Credentials", "true", 4);
    return rc;
}

static int reject(sl_policy_reply_t *reply, const char *what, sl_str_t value)
{
    reply->status = 403;
    reply->code = "cors_rejected";
    snprintf(reply->message, sizeof(reply->message), "CORS: %s '%.*s' is not allowed", what,
             (int)(value.len > 120 ? 120 : value.len), value.ptr);
    return SL_POLICY_REPLY;
}

static int fail_closed(sl_policy_reply_t *reply)
{
    reply->status = 500;
    reply->code = "policy_error";
    snprintf(reply->message, sizeof(reply->message), "too many header changes for one request");
    return SL_POLICY_REPLY;
}

/* Checks each name of an Access-Control-Request-Headers list; on success
 * *echo is the list to answer (lower case), in the arena. */
static int headers_allowed(const cors_t *c, sl_policy_req_t *r, sl_str_t list, sl_str_t *bad,
                           sl_str_t *echo)
{
    char *out = sl_policy_alloc(r, list.len + 1);
    if (!out)
        return -1;
    size_t o = 0;
    const char *p = list.ptr, *end = list.ptr + list.len;
    while (p < end) {
        while (p < end && (*p == ' ' || *p == '\t' || *p == ','))
            p++;
        const char *s = p;
        while (p < end && *p != ',')
            p++;
        const char *e = p;
        while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
            e--;
        if (e == s)
            continue;
        sl_str_t name = {s, (size_t)(e - s)};
        if (!c->any_header && !in_list(c->headers, c->nheaders, name, 1)) {
            *bad = name;
            return 1;
        }
        if (o) {
            out[o++] = ',';
        }
        for (size_t i = 0; i < name.len; i++)
            out[o++] = (char)tolower((unsigned char)name.ptr[i]);
    }
    *echo = (sl_str_t){out, o};
    return 0;
}

static const char preflight_vary[] =
    "Origin, Access-Control-Request-Method, Access-Control-Request-Headers";

static int on_request(const void *state, sl_policy_req_t *r, sl_policy_reply_t *reply)
{
    const cors_t *c = state;
    const sl_policy_header_t *origin = sl_policy_header(r, "origin", 6);
    if (!origin)
        return SL_POLICY_CONTINUE; /* not a cross-origin request */
    const sl_policy_header_t *acrm = NULL;
    if (r->method.len == 7 && memcmp(r->method.ptr, "OPTIONS", 7) == 0)
        acrm = sl_policy_header(r, "access-control-request-method", 29);
    int allowed = origin_allowed(c, origin->value, r->worker_state);
    if (!acrm) { /* an actual request */
        if (c->origin_dependent && EDIT(SL_HDR_ADD, "Vary", "Origin", 6) != 0)
            return fail_closed(reply);
        if (!allowed) /* the upstream's own CORS headers would allow what we refuse */
            return EDIT(SL_HDR_REMOVE, "Access-Control-Allow-Origin", NULL, 0) ||
                           EDIT(SL_HDR_REMOVE, "Access-Control-Allow-Credentials", NULL, 0)
                       ? fail_closed(reply)
                       : SL_POLICY_CONTINUE;
        if (allow_headers(c, r, origin->value) != 0 ||
            (c->expose &&
             EDIT(SL_HDR_SET, "Access-Control-Expose-Headers", c->expose, strlen(c->expose)) != 0))
            return fail_closed(reply);
        return SL_POLICY_CONTINUE;
    }
    /* A preflight: answered here, whatever follows in the chain. */
    if (!allowed)
        return reject(reply, "origin", origin->value);
    if (!method_allowed(c, r, acrm->value))
        return reject(reply, "method", acrm->value);
    const sl_policy_header_t *acrh = sl_policy_header(r, "access-control-request-headers", 30);
    sl_str_t bad = {NULL, 0}, echo = {NULL, 0};
    if (acrh) {
        int hr = headers_allowed(c, r, acrh->value, &bad, &echo);
        if (hr < 0)
            return fail_closed(reply);
        if (hr > 0)
            return reject(reply, "header", bad);
    }
    sl_str_t methods = methods_value(c, r, acrm->value);
    if (!methods.ptr || allow_headers(c, r, origin->value) != 0 ||
        EDIT(SL_HDR_SET, "Access-Control-Allow-Methods", methods.ptr, methods.len) != 0 ||
        (echo.len && EDIT(SL_HDR_SET, "Access-Control-Allow-Headers", echo.ptr, echo.len) != 0) ||
        (c->max_age &&
         EDIT(SL_HDR_SET, "Access-Control-Max-Age", c->max_age, strlen(c->max_age)) != 0) ||
        EDIT(SL_HDR_ADD, "Vary", preflight_vary, strlen(preflight_vary)) != 0)
        return fail_closed(reply);
    reply->status = 204;
    reply->code = "cors_preflight";
    snprintf(reply->message, sizeof(reply->message), "CORS preflight answered by the gateway");
    reply->body = "";
    reply->body_len = 0;
    return SL_POLICY_REPLY;
}

const sl_policy_def_t sl_policy_cors = {
    .name = "cors",
    .phase = SL_PHASE_ACCESS,
    .schema = &schema,
    .compile = compile,
    .free = cfree,
    .on_request = on_request,
    .worker_new = worker_new,
    .worker_free = worker_free,
};
