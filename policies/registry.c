/*
 * The built-in policies, by name, and the validator of a `policies` list
 * (policy.h). A policy is added here and in docs/policies/.
 */
#include "policy.h"

#include <string.h>

extern const sl_policy_def_t sl_policy_api_key;
extern const sl_policy_def_t sl_policy_basic_auth;
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

const char *const *sl_policy_names(void)
{
    /* Immutable after the first call's fill: the table is static. */
    if (!names[0] && registry[0])
        for (size_t i = 0; registry[i]; i++)
            names[i] = registry[i]->name;
    return names;
}

int sl_policy_edit(sl_policy_req_t *r, int response, sl_hdr_op_t op, const char *name,
                   size_t name_len, const char *value, size_t value_len)
{
    sl_hdr_edit_t *list = response ? r->resp_edits : r->req_edits;
    unsigned *n = response ? &r->num_resp_edits : &r->num_req_edits;
    if (!list || *n >= r->max_edits)
        return -1;
    list[*n] = (sl_hdr_edit_t){op, name, name_len, value, value_len};
    (*n)++;
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
