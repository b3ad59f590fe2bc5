/*
 * rewrite: the path and the Host the upstream gets (docs/policies/rewrite.md).
 * One way to make the path, at most:
 *
 *   path:   a template; {name} is the operation's path parameter of that
 *           name ("/pets/{id}" -> path: "/v2/animals/{id}");
 *   prefix: replaces the part of the path the Api's basePath covers
 *           ("/petstore/v1/pets/1" with prefix: /v2 -> "/v2/pets/1");
 *   regex + substitution: PCRE2 on the whole path, $1..$9 in the
 *           substitution; a path the regex does not match is left as is;
 *
 * and `host`, the Host header the upstream gets (over the Backend's
 * hostRewrite). The query string is kept as it is. The result is the whole
 * upstream path: the Api's stripBasePath does not apply on top of it.
 */
#include "policy.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <ctype.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PATH 2048

enum mode { M_NONE = 0, M_TEMPLATE, M_PREFIX, M_REGEX };

typedef struct {
    enum mode mode;
    char *text; /* template, prefix or substitution */
    pcre2_code *re;
    char *host;
} rewrite_t;

/* ---- validation --------------------------------------------------------------- */

static int bad_path_char(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s <= 0x20 || (unsigned char)*s >= 0x7f || *s == '?' || *s == '#')
            return 1;
    return 0;
}

static void check_path(sl_vctx_t *c, json_t *v, const void *arg)
{
    const char *s = json_string_value(v);
    if (!s || s[0] != '/' || strlen(s) > MAX_PATH || bad_path_char(s)) {
        sl_validate_error(c,
                          "expected a path starting with '/', at most %d characters, without "
                          "spaces, '?' or '#'",
                          MAX_PATH);
        return;
    }
    if (!arg) /* prefix: no parameters */
        return;
    for (const char *p = s; (p = strchr(p, '{')); p++) {
        const char *end = strchr(p, '}');
        if (!end || end == p + 1 || memchr(p + 1, '/', (size_t)(end - p - 1))) {
            sl_validate_error(c, "'{' opens a parameter: {name}, closed on the same segment");
            return;
        }
    }
}

static void check_host(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    const char *s = json_string_value(v);
    int ok = s && *s && strlen(s) <= 255;
    for (const char *p = s; ok && *p; p++)
        ok = isalnum((unsigned char)*p) || strchr("-.:[]_", *p);
    if (!ok)
        sl_validate_error(c, "expected a host name or address, with an optional :port");
}

static void check_rules(sl_vctx_t *c, json_t *obj)
{
    int n = !!json_object_get(obj, "path") + !!json_object_get(obj, "prefix") +
            !!json_object_get(obj, "regex");
    if (n > 1)
        sl_validate_error(c, "path, prefix and regex are alternatives: use one of them");
    else if (json_object_get(obj, "regex") && !json_object_get(obj, "substitution"))
        sl_validate_error(c, "regex needs a substitution (the new path, with $1..$9)");
    else if (!json_object_get(obj, "regex") && json_object_get(obj, "substitution"))
        sl_validate_error(c, "substitution goes with regex");
    else if (n == 0 && !json_object_get(obj, "host"))
        sl_validate_error(c, "nothing to rewrite: set path, prefix, regex or host");
}

static const sl_vfield_t fields[] = {
    {"path", check_path, "template", 0}, {"prefix", check_path, NULL, 0},
    {"regex", sl_vcheck_regex, NULL, 0}, {"substitution", check_path, NULL, 0},
    {"host", check_host, NULL, 0},       {NULL, NULL, NULL, 0},
};
static const sl_vschema_t schema = {fields, check_rules};

/* ---- compile ------------------------------------------------------------------ */

static void rwfree(void *state)
{
    rewrite_t *r = state;
    if (!r)
        return;
    free(r->text);
    free(r->host);
    pcre2_code_free(r->re);
    free(r);
}

static void *compile(json_t *config, const sl_policy_env_t *env, char *err, size_t errlen)
{
    (void)env;
    rewrite_t *r = calloc(1, sizeof(*r));
    if (!r)
        goto oom;
    const char *text = NULL;
    if ((text = json_string_value(json_object_get(config, "path")))) {
        r->mode = M_TEMPLATE;
    } else if ((text = json_string_value(json_object_get(config, "prefix")))) {
        r->mode = M_PREFIX;
    } else if ((text = json_string_value(json_object_get(config, "substitution")))) {
        r->mode = M_REGEX;
        int ec;
        PCRE2_SIZE off;
        r->re = pcre2_compile((PCRE2_SPTR)json_string_value(json_object_get(config, "regex")),
                              PCRE2_ZERO_TERMINATED, 0, &ec, &off, NULL);
        if (!r->re) {
            snprintf(err, errlen, "regex does not compile");
            rwfree(r);
            return NULL;
        }
    }
    if (text && !(r->text = strdup(text)))
        goto oom;
    const char *host = json_string_value(json_object_get(config, "host"));
    if (host && !(r->host = strdup(host)))
        goto oom;
    return r;
oom:
    rwfree(r);
    snprintf(err, errlen, "out of memory");
    return NULL;
}

static void *worker_new(const void *state)
{
    const rewrite_t *r = state;
    return pcre2_match_data_create(r->re ? 10 : 1, NULL);
}

static void worker_free(void *ws)
{
    pcre2_match_data_free(ws);
}

/* ---- per request -------------------------------------------------------------- */

static int policy_error(sl_policy_reply_t *reply, const char *fmt, const char *arg, size_t len)
{
    reply->status = 500;
    reply->code = "policy_error";
    snprintf(reply->message, sizeof(reply->message), fmt, (int)len, arg);
    return SL_POLICY_REPLY;
}

static int expand_template(const rewrite_t *rw, sl_policy_req_t *r, sl_policy_reply_t *reply)
{
    /* First the length, then the copy: parameters are path segments. */
    size_t len = 0;
    for (int pass = 0; pass < 2; pass++) {
        char *out = NULL;
        if (pass == 1 && !(out = sl_policy_alloc(r, len ? len : 1)))
            return policy_error(reply, "rewrite: %.*s", "the new path is too long", 24);
        size_t o = 0;
        for (const char *p = rw->text; *p;) {
            const char *end;
            if (*p == '{' && (end = strchr(p, '}'))) {
                sl_str_t v;
                if (sl_policy_path_param(r, p + 1, (size_t)(end - p - 1), &v) != 0)
                    return policy_error(reply,
                                        "rewrite: the operation has no path parameter {%.*s}",
                                        p + 1, (size_t)(end - p - 1));
                if (out)
                    memcpy(out + o, v.ptr, v.len);
                o += v.len;
                p = end + 1;
            } else {
                if (out)
                    out[o] = *p;
                o++;
                p++;
            }
        }
        len = o;
        if (out)
            r->path_out = (sl_str_t){out, o};
    }
    return SL_POLICY_CONTINUE;
}

static int substitute(const rewrite_t *rw, sl_policy_req_t *r, sl_policy_reply_t *reply)
{
    PCRE2_SIZE cap = r->arena_cap - r->arena_len;
    if (cap > MAX_PATH * 4)
        cap = MAX_PATH * 4;
    char *out = r->arena + r->arena_len;
    PCRE2_SIZE olen = cap;
    int rc =
        pcre2_substitute(rw->re, (PCRE2_SPTR)r->path.ptr, r->path.len, 0, 0, r->worker_state, NULL,
                         (PCRE2_SPTR)rw->text, PCRE2_ZERO_TERMINATED, (PCRE2_UCHAR *)out, &olen);
    if (rc == 0 || rc == PCRE2_ERROR_NOMATCH)
        return SL_POLICY_CONTINUE; /* not matched: the path stays */
    if (rc < 0)
        return policy_error(reply, "rewrite: %.*s", "the substitution failed", 23);
    if (olen == 0 || out[0] != '/')
        return policy_error(reply, "rewrite: %.*s", "the new path does not start with '/'", 36);
    sl_policy_alloc(r, olen + 1); /* claims what pcre2 wrote, and its NUL */
    r->path_out = (sl_str_t){out, olen};
    return SL_POLICY_CONTINUE;
}

static int on_request(const void *state, sl_policy_req_t *r, sl_policy_reply_t *reply)
{
    const rewrite_t *rw = state;
    if (rw->host)
        r->host_out = (sl_str_t){rw->host, strlen(rw->host)};
    switch (rw->mode) {
    case M_TEMPLATE:
        return expand_template(rw, r, reply);
    case M_PREFIX: {
        size_t plen = strlen(rw->text), rest = r->path.len - r->base_path_len;
        /* "/v2/" or "/" + "/pets" must not make a "//" */
        while (plen && rw->text[plen - 1] == '/')
            plen--;
        char *out = sl_policy_alloc(r, plen + rest + 1);
        if (!out)
            return policy_error(reply, "rewrite: %.*s", "the new path is too long", 24);
        memcpy(out, rw->text, plen);
        memcpy(out + plen, r->path.ptr + r->base_path_len, rest);
        size_t n = plen + rest;
        if (n == 0)
            out[n++] = '/';
        r->path_out = (sl_str_t){out, n};
        return SL_POLICY_CONTINUE;
    }
    case M_REGEX:
        return substitute(rw, r, reply);
    default:
        return SL_POLICY_CONTINUE;
    }
}

const sl_policy_def_t sl_policy_rewrite = {
    .name = "rewrite",
    .phase = SL_PHASE_REQUEST,
    .schema = &schema,
    .compile = compile,
    .free = rwfree,
    .on_request = on_request,
    .worker_new = worker_new,
    .worker_free = worker_free,
};
