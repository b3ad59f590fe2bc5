/*
 * The built-in policies, by name, and the validator of a `policies` list
 * (policy.h). A policy is added here and in docs/policies/.
 */
#include "policy.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

extern const sl_policy_def_t sl_policy_api_key;
extern const sl_policy_def_t sl_policy_basic_auth;
extern const sl_policy_def_t sl_policy_cache;
extern const sl_policy_def_t sl_policy_cors;
extern const sl_policy_def_t sl_policy_headers;
extern const sl_policy_def_t sl_policy_ip_filter;
extern const sl_policy_def_t sl_policy_json_schema;
extern const sl_policy_def_t sl_policy_jwt;
extern const sl_policy_def_t sl_policy_redirect;
extern const sl_policy_def_t sl_policy_request_size;
extern const sl_policy_def_t sl_policy_respond;
extern const sl_policy_def_t sl_policy_rate_limit;
extern const sl_policy_def_t sl_policy_rewrite;

/* clang-format off: one policy per line */
static const sl_policy_def_t *const registry[] = {
    &sl_policy_api_key,
    &sl_policy_basic_auth,
    &sl_policy_cache,
    &sl_policy_cors,
    &sl_policy_headers,
    &sl_policy_ip_filter,
    &sl_policy_json_schema,
    &sl_policy_jwt,
    &sl_policy_redirect,
    &sl_policy_request_size,
    &sl_policy_respond,
    &sl_policy_rate_limit,
    &sl_policy_rewrite,
    NULL,
};
/* clang-format on */

static const char *names[sizeof(registry) / sizeof(registry[0])];

const sl_policy_def_t *sl_policy_find(const char *name)
{
    for (size_t i = 0; registry[i]; i++)
        if (strcmp(registry[i]->name, name) == 0)
            return registry[i];
    return NULL;
}

void sl_policy_redact(const char *name, json_t *config)
{
    const sl_policy_def_t *def = name ? sl_policy_find(name) : NULL;
    if (!def || !json_is_object(config))
        return;
    sl_validate_redact(def->schema, config);
    if (def->redact)
        def->redact(config);
}

const char *const *sl_policy_names(void)
{
    /* Immutable after the first call's fill: the table is static. */
    if (!names[0] && registry[0])
        for (size_t i = 0; registry[i]; i++)
            names[i] = registry[i]->name;
    return names;
}


static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;
static EVP_MD *sha256_md;       /* process lifetime */
static pthread_key_t sha256_key; /* the thread's EVP_MD_CTX, freed at thread exit */
static int sha256_key_ok;

static void ctx_free(void *ctx)
{
    EVP_MD_CTX_free(ctx);
}

static void sha256_init(void)
{
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
    sha256_key_ok = pthread_key_create(&sha256_key, ctx_free) == 0;
}

int sl_policy_sha256(const void *p, size_t n, uint8_t out[32])
{
    pthread_once(&sha256_once, sha256_init);
    if (!sha256_md || !sha256_key_ok)
        return -1;
    EVP_MD_CTX *ctx = pthread_getspecific(sha256_key);
    if (!ctx) {
        ctx = EVP_MD_CTX_new();
        if (!ctx || pthread_setspecific(sha256_key, ctx) != 0) {
            EVP_MD_CTX_free(ctx);
            return -1;
        }
    }
    if (!EVP_DigestInit_ex2(ctx, sha256_md, NULL) || !EVP_DigestUpdate(ctx, p, n) ||
        !EVP_DigestFinal_ex(ctx, out, NULL))
        return -1;
    return 0;
}

void sl_policy_want_body(sl_policy_req_t *r, uint64_t max_bytes)
{
    if (max_bytes == 0)
        max_bytes = SL_POLICY_BODY_DEFAULT_MAX;
    r->body_entries |= 1ULL << r->entry;
    if (!r->body_max_bytes || max_bytes < r->body_max_bytes)
        r->body_max_bytes = max_bytes;
}

char *sl_policy_alloc(sl_policy_req_t *r, size_t n)
{
    if (!r->arena || n > r->arena_cap - r->arena_len)
        return NULL;
    char *p = r->arena + r->arena_len;
    r->arena_len += n;
    return p;
}

void sl_policy_req_end(sl_policy_req_t *r)
{
    json_decref(r->jwt_claims);
    r->jwt_claims = NULL;
}

int sl_policy_path_param(const sl_policy_req_t *r, const char *name, size_t name_len,
                         sl_str_t *out)
{
    if (!r->route_path_template || r->base_path_len > r->path.len)
        return -1;
    const char *t = r->route_path.ptr, *tend = t + r->route_path.len;
    const char *p = r->path.ptr + r->base_path_len, *pend = r->path.ptr + r->path.len;
    while (t < tend && p < pend) {
        /* one segment of each, past its '/' */
        if (*t == '/')
            t++;
        if (*p == '/')
            p++;
        const char *ts = t, *ps = p;
        while (t < tend && *t != '/')
            t++;
        while (p < pend && *p != '/')
            p++;
        if (t - ts == (ptrdiff_t)name_len + 2 && ts[0] == '{' &&
            memcmp(ts + 1, name, name_len) == 0) {
            *out = (sl_str_t){ps, (size_t)(p - ps)};
            return 0;
        }
    }
    return -1;
}

json_t *sl_policy_claim_at(json_t *claims, const char *path, size_t len)
{
    char seg[257];
    if (len >= sizeof(seg))
        return NULL;
    memcpy(seg, path, len);
    seg[len] = '\0';
    json_t *v = json_object_get(claims, seg);
    if (v)
        return v;
    v = claims;
    const char *end = path + len;
    while (path < end && json_is_object(v)) {
        const char *dot = memchr(path, '.', (size_t)(end - path));
        size_t l = dot ? (size_t)(dot - path) : (size_t)(end - path);
        memcpy(seg, path, l);
        seg[l] = '\0';
        v = json_object_get(v, seg);
        if (!dot)
            return v;
        path = dot + 1;
    }
    return NULL;
}

int sl_policy_claim_text(json_t *v, char *buf, size_t cap, sl_str_t *out)
{
    int n;
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        size_t l = json_string_length(v);
        if (l >= cap)
            return -1;
        for (size_t i = 0; i < l; i++)
            if (((unsigned char)s[i] < 0x20 && s[i] != '\t') || s[i] == 0x7f)
                return -1; /* CR, LF, NUL: header injection */
        *out = (sl_str_t){s, l};
        return 0;
    }
    if (json_is_integer(v))
        n = snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        n = snprintf(buf, cap, "%.17g", json_real_value(v));
    else if (json_is_boolean(v))
        n = snprintf(buf, cap, "%s", json_is_true(v) ? "true" : "false");
    else
        return -1;
    if (n < 0 || (size_t)n >= cap)
        return -1;
    *out = (sl_str_t){buf, (size_t)n};
    return 0;
}

int sl_policy_query_param(sl_str_t q, const char *name, size_t nlen, sl_str_t *val, size_t *from,
                          size_t *to)
{
    size_t i = 0;
    while (i <= q.len) {
        size_t end = i;
        while (end < q.len && q.ptr[end] != '&')
            end++;
        if (end - i > nlen && memcmp(q.ptr + i, name, nlen) == 0 && q.ptr[i + nlen] == '=') {
            *val = (sl_str_t){q.ptr + i + nlen + 1, end - i - nlen - 1};
            *from = i;
            *to = end;
            return 1;
        }
        i = end + 1;
    }
    return 0;
}

int sl_policy_query_remove(sl_policy_req_t *req, size_t from, size_t to)
{
    sl_str_t q = req->query;
    if (to < q.len)
        to++; /* its trailing '&' */
    else if (from > 0)
        from--; /* the last one: its leading '&' */
    char *out = sl_policy_alloc(req, q.len - (to - from) + 1);
    if (!out)
        return -1;
    memcpy(out, q.ptr, from);
    memcpy(out + from, q.ptr + to, q.len - to);
    req->query_out = (sl_str_t){out, q.len - (to - from)};
    return 0;
}

/* One entry of a list: {name, config, disabled, when}. */
static void check_entry(sl_vctx_t *c, json_t *v, int operation)
{
    if (!json_is_object(v)) {
        sl_validate_error(c, "expected object {name, config}");
        return;
    }
    json_t *jname = sl_validate_get(v, "name");
    const sl_policy_def_t *def = NULL;
    size_t saved = sl_validate_push_key(c, "name");
    if (!jname) {
        sl_validate_error(c, "required field missing");
    } else if (!json_is_string(jname)) {
        sl_validate_error(c, "expected string");
    } else if (!(def = sl_policy_find(json_string_value(jname)))) {
        const char *s = sl_validate_suggest(json_string_value(jname), sl_policy_names(),
                                            sizeof(names) / sizeof(names[0]) - 1);
        if (s)
            sl_validate_error(c, "unknown policy (did you mean '%s'?)", s);
        else
            sl_validate_error(c, "unknown policy");
    }
    sl_validate_pop(c, saved);
    const char *key;
    json_t *child;
    json_object_foreach(v, key, child)
    {
        saved = sl_validate_push_key(c, key);
        if (strcmp(key, "name") == 0) {
        } else if (strcmp(key, "config") == 0) {
            if (def && !json_is_null(child))
                sl_vcheck_object(c, child, def->schema);
        } else if (strcmp(key, "when") == 0) {
            sl_vcheck_object(c, child, &sl_validate_policy_when);
        } else if (strcmp(key, "disabled") == 0) {
            if (!operation)
                sl_validate_error(c, "only an operation's policies can be disabled (remove it "
                                     "from the Api's list instead)");
            else
                sl_vcheck_bool(c, child, NULL);
        } else {
            static const char *const fields[] = {"name", "config", "when", "disabled"};
            const char *s = sl_validate_suggest(key, fields, 4);
            if (s)
                sl_validate_error(c, "unknown field (did you mean '%s'?)", s);
            else
                sl_validate_error(c, "unknown field");
        }
        sl_validate_pop(c, saved);
    }
}

void sl_policy_vcheck_list(sl_vctx_t *c, json_t *v, const void *arg)
{
    int operation = arg && strcmp(arg, "operation") == 0;
    if (!json_is_array(v)) {
        sl_validate_error(c, "expected a list of policies");
        return;
    }
    size_t n = json_array_size(v);
    for (size_t i = 0; i < n; i++) {
        size_t saved = sl_validate_push_index(c, i);
        json_t *e = json_array_get(v, i);
        check_entry(c, e, operation);
        const char *name = json_string_value(sl_validate_get(e, "name"));
        for (size_t j = 0; name && j < i; j++) {
            const char *other = json_string_value(sl_validate_get(json_array_get(v, j), "name"));
            if (other && strcmp(name, other) == 0) {
                sl_validate_error(c, "policy %s is listed twice (merge the two configs)", name);
                break;
            }
        }
        sl_validate_pop(c, saved);
    }
}

/* ---- checks across an Api: what policies refer to ----------------------- */

/* Whether the operation's path is a template with a {name} segment. */
static int op_has_param(json_t *op, const char *name, size_t len)
{
    const char *path = json_string_value(sl_validate_get(op, "path"));
    const char *type = json_string_value(sl_validate_get(op, "pathType"));
    if (!path || (type ? strcmp(type, "template") != 0 : !strchr(path, '{')))
        return 0;
    for (const char *p = path; (p = strchr(p, '{')); p++)
        if (strncmp(p + 1, name, len) == 0 && p[1 + len] == '}')
            return 1;
    return 0;
}

/* The operation's own entry for the policy `name`, or NULL. */
static json_t *op_entry(json_t *op, const char *name)
{
    json_t *list = sl_validate_get(op, "policies");
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *e = json_array_get(list, i);
        const char *n = json_string_value(sl_validate_get(e, "name"));
        if (n && strcmp(n, name) == 0)
            return e;
    }
    return NULL;
}

/* Whether the operation's resolved chain (the compiler's rule: an
 * operation's entry replaces or removes the Api's) has the policy. */
static int chain_has(json_t *api_list, json_t *op, const char *name)
{
    json_t *e = op_entry(op, name);
    if (e)
        return !json_is_true(sl_validate_get(e, "disabled"));
    for (size_t i = 0; i < json_array_size(api_list); i++) {
        const char *n = json_string_value(sl_validate_get(json_array_get(api_list, i), "name"));
        if (n && strcmp(n, name) == 0)
            return 1;
    }
    return 0;
}

typedef struct {
    sl_vctx_t *c;
    json_t *api_list, *ops;
    const char *policy;
    long only_op; /* >= 0: an operation's own entry; else the Api's */
} refs_ctx_t;

static void check_ref(void *arg, const sl_policy_ref_t *ref)
{
    refs_ctx_t *x = arg;
    int applies = 0, met = 0;
    for (size_t i = 0; i < json_array_size(x->ops) && !met; i++) {
        json_t *op = json_array_get(x->ops, i);
        /* The Api's entry runs where no operation entry replaces it. */
        if (x->only_op >= 0 ? (long)i != x->only_op : op_entry(op, x->policy) != NULL)
            continue;
        applies = 1;
        met = ref->kind == SL_POLICY_REF_PATH_PARAM ? op_has_param(op, ref->name, ref->name_len)
                                                    : chain_has(x->api_list, op, "jwt");
    }
    if (!applies || met)
        return; /* replaced on every operation: this config never runs */
    size_t saved = x->c->len;
    for (unsigned f = 0; f < ref->nfield; f++)
        sl_validate_push_key(x->c, ref->field[f]);
    if (ref->kind == SL_POLICY_REF_JWT_CLAIM)
        sl_validate_error(x->c, "%.*s: no jwt policy verifies a token on the operations this "
                                "policy applies to (add the jwt policy before it)",
                          (int)ref->text_len, ref->text);
    else if (x->only_op >= 0)
        sl_validate_error(x->c, "%.*s: this operation's path has no parameter {%.*s} (a "
                                "template such as \"/pets/{%.*s}\")",
                          (int)ref->text_len, ref->text, (int)ref->name_len, ref->name,
                          (int)ref->name_len, ref->name);
    else
        sl_validate_error(x->c, "%.*s: no operation this policy applies to has a path "
                                "parameter {%.*s} (a template such as \"/pets/{%.*s}\")",
                          (int)ref->text_len, ref->text, (int)ref->name_len, ref->name,
                          (int)ref->name_len, ref->name);
    sl_validate_pop(x->c, saved);
}

/* The references of one list entry, its path pushed by the caller. */
static void entry_refs(refs_ctx_t *x, json_t *e)
{
    const char *name = json_string_value(sl_validate_get(e, "name"));
    const sl_policy_def_t *def = name ? sl_policy_find(name) : NULL;
    json_t *config = sl_validate_get(e, "config");
    if (!def || !def->refs || !config || json_is_true(sl_validate_get(e, "disabled")))
        return;
    x->policy = name;
    size_t saved = sl_validate_push_key(x->c, "config");
    def->refs(config, check_ref, x);
    sl_validate_pop(x->c, saved);
}

void sl_policy_vcheck_api(sl_vctx_t *c, json_t *spec)
{
    refs_ctx_t x = {c, sl_validate_get(spec, "policies"), sl_validate_get(spec, "operations"),
                    NULL, -1};
    size_t saved = sl_validate_push_key(c, "policies");
    for (size_t i = 0; i < json_array_size(x.api_list); i++) {
        size_t s2 = sl_validate_push_index(c, i);
        entry_refs(&x, json_array_get(x.api_list, i));
        sl_validate_pop(c, s2);
    }
    sl_validate_pop(c, saved);
    saved = sl_validate_push_key(c, "operations");
    for (size_t o = 0; o < json_array_size(x.ops); o++) {
        json_t *list = sl_validate_get(json_array_get(x.ops, o), "policies");
        size_t s2 = sl_validate_push_index(c, o);
        size_t s3 = sl_validate_push_key(c, "policies");
        x.only_op = (long)o;
        for (size_t i = 0; i < json_array_size(list); i++) {
            size_t s4 = sl_validate_push_index(c, i);
            entry_refs(&x, json_array_get(list, i));
            sl_validate_pop(c, s4);
        }
        sl_validate_pop(c, s3);
        sl_validate_pop(c, s2);
    }
    sl_validate_pop(c, saved);
}
