/*
 * headers: set, add and remove request headers (what the upstream gets) and
 * response headers (what the client gets, on the upstream's responses and
 * the gateway's own). Values may use variables, expanded per request:
 * ${client_ip} ${request_id} ${consumer} ${consumer_group} ${method}
 * ${host} ${path}, ${path.<param>} (the operation's path parameter) and
 * ${jwt.<claim>} (a claim of the token the jwt policy verified). A
 * variable with no value expands to "": a `set` header still replaces
 * what the client sent, so a missing claim never lets a client's own
 * value through.
 *
 *   config: {request: {set: {X-A: v}, add: {X-B: v}, remove: [X-C]},
 *            response: {set: {X-Frame-Options: DENY}}}
 */
#include "policy.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum var {
    V_NONE = 0,
    V_CLIENT_IP,
    V_REQUEST_ID,
    V_CONSUMER,
    V_GROUP,
    V_METHOD,
    V_HOST,
    V_PATH,
    V_PATH_PARAM, /* ${path.id} */
    V_JWT_CLAIM,  /* ${jwt.sub} */
    V_BAD
};
static const char *const var_names[] = {NULL,   "client_ip", "request_id", "consumer",
                                        "consumer_group", "method", "host", "path"};
#define NUM_PLAIN_VARS (sizeof(var_names) / sizeof(var_names[0]))
#define MAX_CLAIM_PATH 256
#define MAX_CLAIM_TEXT 1024

/* A value: literal pieces and variables, in order. */
typedef struct {
    enum var var; /* V_NONE: the literal text */
    char *text;   /* the literal; the parameter's name; the claim's path */
    size_t len;
} piece_t;

typedef struct {
    sl_hdr_op_t op;
    char *name;
    size_t name_len;
    piece_t *pieces;
    size_t npieces;
    int literal; /* one literal piece: no expansion needed */
} edit_t;

typedef struct {
    edit_t *e[2]; /* [0] request, [1] response */
    size_t n[2];
} headers_t;

/* Headers a policy must not touch: framing and connection management are
 * the codecs' (a wrong Content-Length is request smuggling). */
static const char *const forbidden[] = {"connection", "transfer-encoding", "content-length",
                                        "upgrade",    "te",                "keep-alive",
                                        "proxy-connection", "host", NULL};

static int is_tchar(unsigned char ch)
{
    return isalnum(ch) || strchr("!#$%&'*+-.^_`|~", ch);
}

static void check_name(sl_vctx_t *c, const char *name)
{
    if (!*name || strlen(name) > 256) {
        sl_validate_error(c, "a header name of 1 to 256 characters");
        return;
    }
    for (const char *p = name; *p; p++)
        if (!is_tchar((unsigned char)*p)) {
            sl_validate_error(c, "'%.64s' is not a valid header name", name);
            return;
        }
    for (size_t i = 0; forbidden[i]; i++)
        if (strcasecmp(name, forbidden[i]) == 0) {
            sl_validate_error(c, "%s is managed by the gateway and cannot be changed by a policy",
                              name);
            return;
        }
}

/* The variable named s (between "${" and "}"); *arg the parameter's name
 * or the claim's path. V_BAD for anything unknown or malformed. */
static enum var var_of(const char *s, size_t len, const char **arg, size_t *arg_len)
{
    for (size_t v = 1; v < NUM_PLAIN_VARS; v++)
        if (strlen(var_names[v]) == len && memcmp(var_names[v], s, len) == 0)
            return (enum var)v;
    if (len > 5 && memcmp(s, "path.", 5) == 0) {
        /* a template parameter's name (common/pathtpl.c): [A-Za-z_][A-Za-z0-9_]* */
        *arg = s + 5;
        *arg_len = len - 5;
        for (size_t i = 0; i < *arg_len; i++) {
            unsigned char ch = (unsigned char)(*arg)[i];
            if (!(isalpha(ch) || ch == '_' || (i > 0 && isdigit(ch))))
                return V_BAD;
        }
        return V_PATH_PARAM;
    }
    if (len > 4 && memcmp(s, "jwt.", 4) == 0) {
        /* a claim's name or dotted path; URLs are claim names too */
        *arg = s + 4;
        *arg_len = len - 4;
        if (*arg_len > MAX_CLAIM_PATH)
            return V_BAD;
        for (size_t i = 0; i < *arg_len; i++)
            if ((unsigned char)(*arg)[i] <= 0x20 || (*arg)[i] == '{' || (*arg)[i] == 0x7f)
                return V_BAD;
        return V_JWT_CLAIM;
    }
    return V_BAD;
}

static void check_value(sl_vctx_t *c, const char *v)
{
    if (strlen(v) > 4096) {
        sl_validate_error(c, "longer than 4096 characters");
        return;
    }
    for (const char *p = v; *p; p++) {
        if ((unsigned char)*p < 0x20 && *p != '\t') {
            sl_validate_error(c, "control characters are not allowed in a header value");
            return;
        }
        if (p[0] == '$' && p[1] == '{') {
            const char *end = strchr(p, '}'), *arg;
            size_t arg_len;
            if (!end || var_of(p + 2, (size_t)(end - p - 2), &arg, &arg_len) == V_BAD) {
                sl_validate_error(c, "unknown variable '%.*s' (known: ${client_ip}, "
                                     "${request_id}, ${consumer}, ${consumer_group}, ${method}, "
                                     "${host}, ${path}, ${path.<parameter>}, ${jwt.<claim>})",
                                  end ? (int)(end - p + 1 > 64 ? 64 : end - p + 1) : 64, p);
                return;
            }
        }
    }
}

static void check_map(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_object(v)) {
        sl_validate_error(c, "expected an object of header names to values");
        return;
    }
    if (json_object_size(v) > 32)
        sl_validate_error(c, "at most 32 headers");
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val)
    {
        size_t saved = sl_validate_push_key(c, key);
        check_name(c, key);
        if (!json_is_string(val))
            sl_validate_error(c, "expected a string value");
        else
            check_value(c, json_string_value(val));
        sl_validate_pop(c, saved);
    }
}

static void check_remove_name(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_string(v)) {
        sl_validate_error(c, "expected a header name");
        return;
    }
    check_name(c, json_string_value(v));
}

static const sl_vfield_t side_fields[] = {
    {"set", check_map, NULL, 0},
    {"add", check_map, NULL, 0},
    {"remove", sl_vcheck_array, &(const sl_varray_t){check_remove_name, NULL, 1, 32}, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t side_schema = {side_fields, NULL};

static const sl_vfield_t fields[] = {
    {"request", sl_vcheck_object, &side_schema, 0},
    {"response", sl_vcheck_object, &side_schema, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t schema = {fields, NULL};

/* The path parameters and claims the values use (policy.h: the Api's
 * validation checks an operation has them, and the chain tells the jwt
 * policy to keep claims). */
static void refs(json_t *config, sl_policy_ref_fn fn, void *ctx)
{
    static const char *const sides[2] = {"request", "response"};
    static const char *const ops[2] = {"set", "add"};
    for (int s = 0; s < 2; s++)
        for (int o = 0; o < 2; o++) {
            const char *key;
            json_t *val;
            json_object_foreach(json_object_get(json_object_get(config, sides[s]), ops[o]), key,
                                val)
            {
                const char *v = json_string_value(val);
                for (const char *p = v; p && (p = strstr(p, "${")); p += 2) {
                    const char *end = strchr(p, '}'), *arg = NULL;
                    size_t arg_len = 0;
                    if (!end)
                        break;
                    enum var k = var_of(p + 2, (size_t)(end - p - 2), &arg, &arg_len);
                    if (k != V_PATH_PARAM && k != V_JWT_CLAIM)
                        continue;
                    sl_policy_ref_t r = {k == V_PATH_PARAM ? SL_POLICY_REF_PATH_PARAM
                                                           : SL_POLICY_REF_JWT_CLAIM,
                                         arg, arg_len, p, (size_t)(end - p + 1),
                                         {sides[s], ops[o], key}, 3};
                    fn(ctx, &r);
                }
            }
        }
}

static void hfree(void *state)
{
    headers_t *h = state;
    if (!h)
        return;
    for (int s = 0; s < 2; s++) {
        for (size_t i = 0; i < h->n[s]; i++) {
            free(h->e[s][i].name);
            for (size_t p = 0; p < h->e[s][i].npieces; p++)
                free(h->e[s][i].pieces[p].text);
            free(h->e[s][i].pieces);
        }
        free(h->e[s]);
    }
    free(h);
}

static int parse_value(edit_t *e, const char *v)
{
    size_t cap = 1;
    for (const char *p = v; *p; p++)
        cap += *p == '$';
    e->pieces = calloc(2 * cap + 1, sizeof(*e->pieces));
    if (!e->pieces)
        return -1;
    const char *p = v, *lit = v;
    while (*p) {
        const char *end, *arg = NULL;
        size_t arg_len = 0;
        if (p[0] == '$' && p[1] == '{' && (end = strchr(p, '}'))) {
            if (p > lit) {
                e->pieces[e->npieces] = (piece_t){V_NONE, strndup(lit, (size_t)(p - lit)),
                                                  (size_t)(p - lit)};
                if (!e->pieces[e->npieces++].text)
                    return -1;
            }
            piece_t *pc = &e->pieces[e->npieces++];
            pc->var = var_of(p + 2, (size_t)(end - p - 2), &arg, &arg_len);
            if (arg && !(pc->text = strndup(arg, arg_len)))
                return -1;
            pc->len = arg_len;
            p = lit = end + 1;
        } else {
            p++;
        }
    }
    if (p > lit || e->npieces == 0) {
        e->pieces[e->npieces] = (piece_t){V_NONE, strndup(lit, (size_t)(p - lit)),
                                          (size_t)(p - lit)};
        if (!e->pieces[e->npieces++].text)
            return -1;
    }
    e->literal = e->npieces == 1 && e->pieces[0].var == V_NONE;
    return 0;
}

static int add_edit(headers_t *h, int side, sl_hdr_op_t op, const char *name, const char *value)
{
    edit_t *e = &h->e[side][h->n[side]++];
    e->op = op;
    e->name = strdup(name);
    e->name_len = strlen(name);
    if (!e->name)
        return -1;
    return op == SL_HDR_REMOVE ? 0 : parse_value(e, value);
}

static void *compile(json_t *config, const sl_policy_env_t *env, char *err, size_t errlen)
{
    (void)env;
    headers_t *h = calloc(1, sizeof(*h));
    if (!h)
        goto oom;
    static const char *const sides[2] = {"request", "response"};
    for (int s = 0; s < 2; s++) {
        json_t *side = json_object_get(config, sides[s]);
        size_t n = json_object_size(json_object_get(side, "set")) +
                   json_object_size(json_object_get(side, "add")) +
                   json_array_size(json_object_get(side, "remove"));
        h->e[s] = calloc(n ? n : 1, sizeof(*h->e[s]));
        if (!h->e[s])
            goto oom;
        /* Removals first, then sets, then adds: `remove: [X]` with
         * `add: {X: v}` leaves exactly the added X. */
        json_t *rm = json_object_get(side, "remove");
        for (size_t i = 0; i < json_array_size(rm); i++)
            if (add_edit(h, s, SL_HDR_REMOVE, json_string_value(json_array_get(rm, i)), NULL))
                goto oom;
        const char *key;
        json_t *val;
        json_object_foreach(json_object_get(side, "set"), key, val)
        {
            if (add_edit(h, s, SL_HDR_SET, key, json_string_value(val)))
                goto oom;
        }
        json_object_foreach(json_object_get(side, "add"), key, val)
        {
            if (add_edit(h, s, SL_HDR_ADD, key, json_string_value(val)))
                goto oom;
        }
    }
    return h;
oom:
    hfree(h);
    snprintf(err, errlen, "out of memory");
    return NULL;
}

/* A variable's value; buf (MAX_CLAIM_TEXT bytes) holds it when it must be
 * made (a number claim). */
static sl_str_t var_value(const sl_policy_req_t *r, const piece_t *pc, char *buf)
{
    const char *s = NULL;
    sl_str_t out;
    switch (pc->var) {
    case V_PATH_PARAM:
        if (sl_policy_path_param(r, pc->text, pc->len, &out) == 0)
            return out;
        break;
    case V_JWT_CLAIM:
        if (r->jwt_claims &&
            sl_policy_claim_text(sl_policy_claim_at(r->jwt_claims, pc->text, pc->len), buf,
                                 MAX_CLAIM_TEXT, &out) == 0)
            return out;
        break;
    case V_CLIENT_IP:
        s = r->client_ip;
        break;
    case V_REQUEST_ID:
        s = r->request_id;
        break;
    case V_CONSUMER:
        s = r->consumer.name;
        break;
    case V_GROUP:
        s = r->consumer.group;
        break;
    case V_METHOD:
        return r->method;
    case V_HOST:
        return r->host;
    case V_PATH:
        return r->path;
    default:
        break;
    }
    return (sl_str_t){s ? s : "", s ? strlen(s) : 0};
}

/* Applies one side's edits; -1 when the request's bounds are reached. */
static int apply(const headers_t *h, int side, sl_policy_req_t *r)
{
    char buf[MAX_CLAIM_TEXT];
    for (size_t i = 0; i < h->n[side]; i++) {
        const edit_t *e = &h->e[side][i];
        const char *val = NULL;
        size_t len = 0;
        if (e->op != SL_HDR_REMOVE) {
            if (e->literal) {
                val = e->pieces[0].text;
                len = e->pieces[0].len;
            } else {
                for (size_t p = 0; p < e->npieces; p++)
                    len += e->pieces[p].var ? var_value(r, &e->pieces[p], buf).len
                                            : e->pieces[p].len;
                char *out = sl_policy_alloc(r, len ? len : 1);
                if (!out)
                    return -1;
                size_t o = 0;
                for (size_t p = 0; p < e->npieces; p++) {
                    sl_str_t s = e->pieces[p].var ? var_value(r, &e->pieces[p], buf)
                                                  : (sl_str_t){e->pieces[p].text, e->pieces[p].len};
                    for (size_t k = 0; k < s.len; k++) /* a variable cannot split the line */
                        out[o++] = s.ptr[k] == '\r' || s.ptr[k] == '\n' ? ' ' : s.ptr[k];
                }
                val = out;
            }
        }
        if (sl_policy_edit(r, side, e->op, e->name, e->name_len, val, len) != 0)
            return -1;
    }
    return 0;
}

static int on_request(const void *state, sl_policy_req_t *req, sl_policy_reply_t *reply)
{
    if (apply(state, 0, req) == 0)
        return SL_POLICY_CONTINUE;
    reply->status = 500;
    reply->code = "policy_error";
    snprintf(reply->message, sizeof(reply->message), "too many header changes for one request");
    return SL_POLICY_REPLY;
}

static void on_response(const void *state, sl_policy_req_t *req, int status)
{
    (void)status;
    /* Past the bound an edit is dropped: the response is under way and
     * cannot fail closed any more; the bound (policy.h) is far above what
     * validation lets a chain ask for. */
    (void)apply(state, 1, req);
}

/* Header values are free-form, so a set or added credential (an upstream's
 * Authorization, an API key header, a cookie) is hidden by the header's
 * name: the names that carry credentials by convention. */
static int credential_header(const char *name)
{
    static const char *const exact[] = {"authorization", "proxy-authorization", "cookie",
                                        "set-cookie", NULL};
    static const char *const parts[] = {"token",   "secret", "password",  "api-key",
                                        "apikey",  "auth",   "session",   "signature",
                                        NULL};
    for (size_t i = 0; exact[i]; i++)
        if (strcasecmp(name, exact[i]) == 0)
            return 1;
    for (size_t i = 0; parts[i]; i++)
        if (strcasestr(name, parts[i]))
            return 1;
    return 0;
}

static void redact(json_t *config)
{
    static const char *const sides[2] = {"request", "response"};
    static const char *const ops[2] = {"set", "add"};
    for (int s = 0; s < 2; s++)
        for (int o = 0; o < 2; o++) {
            json_t *map = json_object_get(json_object_get(config, sides[s]), ops[o]);
            const char *name;
            json_t *v;
            json_object_foreach(map, name, v)
            {
                if (credential_header(name))
                    json_object_set_new(map, name, json_string("[redacted]"));
            }
        }
}

const sl_policy_def_t sl_policy_headers = {
    .name = "headers",
    .phase = SL_PHASE_REQUEST,
    .schema = &schema,
    .compile = compile,
    .free = hfree,
    .on_request = on_request,
    .on_response = on_response,
    .refs = refs,
    .redact = redact,
};
