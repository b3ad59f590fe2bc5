/*
 * json-schema: validates JSON request bodies against a JSON Schema (draft
 * 2020-12, the part jschema.h offers) before they reach the upstream
 * (docs/policies/json-schema.md).
 *
 *   config: {schema: {...}, maxBodyBytes: 1048576, maxDepth: 64,
 *            contentTypes: [application/json], otherContentTypes: reject}
 *
 * At the request's head (on_request): a request whose Content-Type is one
 * of contentTypes asks for its body (policy.h, sl_policy_want_body); one
 * with another or no Content-Type is refused 415 when it has a body
 * (otherContentTypes: reject, the default: a backend that parses JSON
 * whatever the label would otherwise get an unchecked body) or passes
 * unchecked (pass). A request without a body and without a listed type
 * has nothing to check and passes.
 *
 * With the whole body (on_body): 400 invalid_json when it is not one JSON
 * value (empty, bad syntax, a duplicate object key, deeper than maxDepth),
 * 400 schema_violation naming the failing value's JSON pointer and the
 * keyword; else the body goes upstream unchanged.
 */
#include "jschema.h"
#include "policy.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_CONTENT_TYPES 32

typedef struct {
    char type[64], subtype[64]; /* "*" = any; subtype "*+json" = any with that suffix */
} media_range_t;

typedef struct {
    sl_jschema_t *schema;
    uint64_t max_body_bytes;
    unsigned max_depth;
    int pass_other;
    media_range_t types[MAX_CONTENT_TYPES];
    size_t n_types;
    char types_text[160]; /* for the 415's message */
} json_schema_t;

/* ---- config -------------------------------------------------------------------- */

static int is_tchar(unsigned char ch)
{
    return isalnum(ch) || strchr("!#$%&'*+-.^_`|~", ch);
}

/* A media range: type/subtype, with '*' as the whole subtype (also
 * "*+suffix") or as both parts. 1 with *out. */
static int parse_range(const char *s, media_range_t *out)
{
    const char *slash = strchr(s, '/');
    if (!slash || slash == s || !slash[1] || (size_t)(slash - s) >= sizeof(out->type) ||
        strlen(slash + 1) >= sizeof(out->subtype))
        return 0;
    for (const char *p = s; *p; p++)
        if (p != slash && !is_tchar((unsigned char)*p))
            return 0;
    snprintf(out->type, sizeof(out->type), "%.*s", (int)(slash - s), s);
    snprintf(out->subtype, sizeof(out->subtype), "%s", slash + 1);
    /* '*' only as a whole part, or as "*+suffix" */
    if (strchr(out->type, '*') && strcmp(out->type, "*") != 0)
        return 0;
    if (strcmp(out->type, "*") == 0 && strcmp(out->subtype, "*") != 0)
        return 0;
    const char *star = strchr(out->subtype, '*');
    if (star && !(star == out->subtype && (!star[1] || (star[1] == '+' && star[2]))))
        return 0;
    if (star && strchr(star + 1, '*'))
        return 0;
    return 1;
}

static void check_content_type(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    media_range_t r;
    if (!json_is_string(v) || !parse_range(json_string_value(v), &r))
        sl_validate_error(c, "expected a media type such as application/json, application/*+json "
                             "or */* (without parameters)");
}

static void check_schema(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    sl_jschema_free(sl_jschema_compile(c, v));
}

static const sl_vrange_t max_bytes_range = {1, 64 * 1024 * 1024};
static const sl_vrange_t depth_range = {1, 512};
static const char *const other_values[] = {"reject", "pass", NULL};

static const sl_vfield_t fields[] = {
    {"schema", check_schema, NULL, SL_VFIELD_REQUIRED},
    {"maxBodyBytes", sl_vcheck_int, &max_bytes_range, 0},
    {"maxDepth", sl_vcheck_int, &depth_range, 0},
    {"contentTypes", sl_vcheck_array,
     &(const sl_varray_t){check_content_type, NULL, 1, MAX_CONTENT_TYPES}, 0},
    {"otherContentTypes", sl_vcheck_enum, other_values, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t config_schema = {fields, NULL};

static void js_free(void *state)
{
    json_schema_t *s = state;
    if (!s)
        return;
    sl_jschema_free(s->schema);
    free(s);
}

static void *compile(json_t *config, const sl_policy_env_t *env, char *err, size_t errlen)
{
    (void)env;
    json_schema_t *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    json_t *v = json_object_get(config, "maxBodyBytes");
    s->max_body_bytes = v ? (uint64_t)json_integer_value(v) : SL_POLICY_BODY_DEFAULT_MAX;
    v = json_object_get(config, "maxDepth");
    s->max_depth = v ? (unsigned)json_integer_value(v) : 64;
    v = json_object_get(config, "otherContentTypes");
    s->pass_other = v && strcmp(json_string_value(v), "pass") == 0;
    json_t *types = json_object_get(config, "contentTypes");
    size_t o = 0;
    for (size_t i = 0; i < (types ? json_array_size(types) : 1) && i < MAX_CONTENT_TYPES; i++) {
        const char *t = types ? json_string_value(json_array_get(types, i)) : "application/json";
        if (t && parse_range(t, &s->types[s->n_types])) {
            s->n_types++;
            if (o < sizeof(s->types_text))
                o += (size_t)snprintf(s->types_text + o, sizeof(s->types_text) - o, "%s%s",
                                      o ? ", " : "", t);
        }
    }
    sl_errors_t errs;
    sl_errors_init(&errs);
    sl_vctx_t c = {.errs = &errs};
    s->schema = sl_jschema_compile(&c, json_object_get(config, "schema"));
    if (!s->schema) {
        /* The validator refused the same config already: only when called
         * without it (or out of memory). */
        char *text = sl_errors_format(&errs);
        snprintf(err, errlen, "schema: %s", text ? text : "cannot be compiled");
        free(text);
        sl_errors_free(&errs);
        js_free(s);
        return NULL;
    }
    sl_errors_free(&errs);
    return s;
}

/* ---- the request ------------------------------------------------------------------ */

/* Whether the Content-Type's media type (parameters ignored,
 * case-insensitive) is one of the configured ranges. */
static int listed(const json_schema_t *s, sl_str_t v)
{
    size_t i = 0, end = v.len;
    while (i < end && (v.ptr[i] == ' ' || v.ptr[i] == '\t'))
        i++;
    const char *semi = memchr(v.ptr + i, ';', end - i);
    if (semi)
        end = (size_t)(semi - v.ptr);
    while (end > i && (v.ptr[end - 1] == ' ' || v.ptr[end - 1] == '\t'))
        end--;
    const char *mt = v.ptr + i, *slash = memchr(mt, '/', end - i);
    if (!slash)
        return 0;
    size_t tlen = (size_t)(slash - mt), slen = end - i - tlen - 1;
    const char *sub = slash + 1;
    for (size_t k = 0; k < s->n_types; k++) {
        const media_range_t *r = &s->types[k];
        if (strcmp(r->type, "*") == 0)
            return 1;
        if (strlen(r->type) != tlen || strncasecmp(r->type, mt, tlen) != 0)
            continue;
        if (strcmp(r->subtype, "*") == 0)
            return 1;
        if (r->subtype[0] == '*') { /* "*+suffix" */
            size_t sfx = strlen(r->subtype) - 1;
            if (slen > sfx && strncasecmp(sub + slen - sfx, r->subtype + 1, sfx) == 0)
                return 1;
            continue;
        }
        if (strlen(r->subtype) == slen && strncasecmp(r->subtype, sub, slen) == 0)
            return 1;
    }
    return 0;
}

static int on_request(const void *state, sl_policy_req_t *req, sl_policy_reply_t *reply)
{
    const json_schema_t *s = state;
    const sl_policy_header_t *ct = sl_policy_header(req, "content-type", 12);
    if (!ct || !listed(s, ct->value)) {
        if (!req->has_body || s->pass_other)
            return SL_POLICY_CONTINUE;
        reply->status = 415;
        reply->code = "unsupported_media_type";
        snprintf(reply->message, sizeof(reply->message),
                 "the request body must be %s (this API checks it against a JSON Schema)",
                 s->types_text);
        return SL_POLICY_REPLY;
    }
    sl_policy_want_body(req, s->max_body_bytes);
    return SL_POLICY_CONTINUE;
}

/* Whether the JSON text nests arrays and objects deeper than max: checked
 * before parsing, so a body of a million '[' costs one pass and no stack. */
static int too_deep(const char *p, size_t n, unsigned max)
{
    unsigned depth = 0;
    int in_string = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if (in_string) {
            if (ch == '\\')
                i++;
            else if (ch == '"')
                in_string = 0;
        } else if (ch == '"') {
            in_string = 1;
        } else if (ch == '[' || ch == '{') {
            if (++depth > max)
                return 1;
        } else if ((ch == ']' || ch == '}') && depth) {
            depth--;
        }
    }
    return 0;
}

static int invalid_json(sl_policy_reply_t *reply, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int invalid_json(sl_policy_reply_t *reply, const char *fmt, ...)
{
    reply->status = 400;
    reply->code = "invalid_json";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reply->message, sizeof(reply->message), fmt, ap);
    va_end(ap);
    return SL_POLICY_REPLY;
}

static int on_body(const void *state, sl_policy_req_t *req, const char *body, size_t len,
                   sl_policy_reply_t *reply)
{
    (void)req;
    const json_schema_t *s = state;
    if (len == 0)
        return invalid_json(reply, "the request body is empty; expected JSON");
    if (too_deep(body, len, s->max_depth))
        return invalid_json(reply, "the JSON nests deeper than %u levels (maxDepth)", s->max_depth);
    /* Duplicate keys are refused: the upstream's parser might keep the
     * other value than the one checked here. */
    size_t flags = JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL;
    json_error_t je;
    json_t *doc = json_loadb(body, len, flags, &je);
    if (!doc && json_error_code(&je) == json_error_numeric_overflow)
        doc = json_loadb(body, len, flags | JSON_DECODE_INT_AS_REAL, &je); /* 1e400-sized ints */
    if (!doc)
        return invalid_json(reply, "the request body is not valid JSON: %s (at byte %d)", je.text,
                            je.position);
    sl_jschema_error_t e;
    int ok = sl_jschema_validate(s->schema, doc, &e);
    json_decref(doc);
    if (ok)
        return SL_POLICY_CONTINUE;
    reply->status = 400;
    reply->code = "schema_violation";
    /* A long pointer keeps its end, the part that names the value. */
    const char *ptr = e.pointer;
    size_t plen = strlen(ptr);
    int cut = plen > 100;
    if (cut)
        ptr += plen - 97;
    snprintf(reply->message, sizeof(reply->message), "at \"%s%.100s\": %.24s: %.116s",
             cut ? "..." : "", ptr, e.keyword, e.message);
    return SL_POLICY_REPLY;
}

const sl_policy_def_t sl_policy_json_schema = {
    .name = "json-schema",
    .phase = SL_PHASE_REQUEST,
    .schema = &config_schema,
    .compile = compile,
    .free = js_free,
    .on_request = on_request,
    .on_body = on_body,
};
