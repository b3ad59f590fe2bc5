/*
 * Validation of resource documents (sl_model_validate): the schema walker,
 * the envelope every kind shares (apiVersion, kind, metadata, status) and the
 * generic value checks. The per-kind spec tables and their cross-field rules
 * live in validate_spec.c.
 *
 * Responsible for: every field of a document being known, of the right type
 * and within bounds, each problem reported once with its field path. Not
 * responsible for anything that needs other documents (references, duplicate
 * names across files: model.c and compiler.c) nor for defaults (compiler.c).
 *
 * The document is never modified.
 */
#include "validate.h"

#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *type_name(json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "object";
    case JSON_ARRAY:
        return "array";
    case JSON_STRING:
        return "string";
    case JSON_INTEGER:
        return "integer";
    case JSON_REAL:
        return "number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "boolean";
    case JSON_NULL:
        return "null";
    }
    return "?";
}

void sl_validate_error(sl_vctx_t *c, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    sl_errors_add(c->errs, c->source, c->doc, c->path, "%s", msg);
    c->nerr++;
}

size_t sl_validate_push_key(sl_vctx_t *c, const char *key)
{
    size_t saved = c->len;
    int n = snprintf(c->path + c->len, sizeof(c->path) - c->len, "%s%s", c->len ? "." : "", key);
    if (n < 0 || (size_t)n >= sizeof(c->path) - c->len)
        c->len = sizeof(c->path) - 1; /* truncated: still names the start of the path */
    else
        c->len += (size_t)n;
    return saved;
}

size_t sl_validate_push_index(sl_vctx_t *c, size_t i)
{
    size_t saved = c->len;
    int n = snprintf(c->path + c->len, sizeof(c->path) - c->len, "[%zu]", i);
    if (n < 0 || (size_t)n >= sizeof(c->path) - c->len)
        c->len = sizeof(c->path) - 1;
    else
        c->len += (size_t)n;
    return saved;
}

void sl_validate_pop(sl_vctx_t *c, size_t saved)
{
    c->len = saved;
    c->path[saved] = '\0';
}

json_t *sl_validate_get(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64)
        return 99;
    size_t row[65];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            size_t best = diag + cost;
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

const char *sl_validate_suggest(const char *word, const char *const *names, size_t n)
{
    const char *best = NULL;
    size_t best_d = 3;
    for (size_t i = 0; i < n; i++) {
        size_t d = edit_distance(word, names[i]);
        if (d < best_d) {
            best_d = d;
            best = names[i];
        }
    }
    /* A name cut short or with another ending ("sample" for "sampling") is
     * too far by edits: a common start of 5 characters will do. */
    for (size_t i = 0; !best && strlen(word) >= 5 && i < n; i++)
        if (strncmp(names[i], word, 5) == 0)
            best = names[i];
    return best;
}

void sl_vcheck_object(sl_vctx_t *c, json_t *v, const void *arg)
{
    const sl_vschema_t *schema = arg;
    if (!json_is_object(v)) {
        sl_validate_error(c, "expected object, got %s", type_name(v));
        return;
    }
    size_t before = c->nerr;
    const char *names[64];
    size_t nnames = 0;
    for (const sl_vfield_t *f = schema->fields; f->name && nnames < 64; f++)
        names[nnames++] = f->name;

    const char *key;
    json_t *child;
    json_object_foreach(v, key, child)
    {
        const sl_vfield_t *f = schema->fields;
        while (f->name && strcmp(f->name, key) != 0)
            f++;
        size_t saved = sl_validate_push_key(c, key);
        if (!f->name) {
            const char *s = sl_validate_suggest(key, names, nnames);
            if (s)
                sl_validate_error(c, "unknown field (did you mean '%s'?)", s);
            else
                sl_validate_error(c, "unknown field");
        } else if (!json_is_null(child)) {
            f->check(c, child, f->arg);
        }
        sl_validate_pop(c, saved);
    }
    for (const sl_vfield_t *f = schema->fields; f->name; f++) {
        if ((f->flags & SL_VFIELD_REQUIRED) && !sl_validate_get(v, f->name)) {
            size_t saved = sl_validate_push_key(c, f->name);
            sl_validate_error(c, "required field missing");
            sl_validate_pop(c, saved);
        }
    }
    if (schema->extra && c->nerr == before)
        schema->extra(c, v);
}

static void redact_value(sl_vcheck_fn check, const void *arg, json_t *v)
{
    if (check == sl_vcheck_object) {
        sl_validate_redact(arg, v);
    } else if (check == sl_vcheck_array && json_is_array(v)) {
        const sl_varray_t *spec = arg;
        size_t i;
        json_t *item;
        json_array_foreach(v, i, item)
        {
            redact_value(spec->check, spec->arg, item);
        }
    }
}

void sl_validate_redact(const sl_vschema_t *schema, json_t *obj)
{
    if (!schema || !json_is_object(obj))
        return;
    for (const sl_vfield_t *f = schema->fields; f->name; f++) {
        json_t *v = json_object_get(obj, f->name);
        if (!v)
            continue;
        if (f->flags & SL_VFIELD_SECRET) {
            if (!(json_is_string(v) && json_string_length(v) == 0))
                json_object_set_new(obj, f->name, json_string("[redacted]"));
        } else {
            redact_value(f->check, f->arg, v);
        }
    }
}

void sl_vcheck_array(sl_vctx_t *c, json_t *v, const void *arg)
{
    const sl_varray_t *spec = arg;
    if (!json_is_array(v)) {
        sl_validate_error(c, "expected array, got %s", type_name(v));
        return;
    }
    size_t n = json_array_size(v);
    if (n < spec->min_items) {
        sl_validate_error(c, "needs at least %zu item%s", spec->min_items,
                          spec->min_items == 1 ? "" : "s");
        return;
    }
    if (spec->max_items && n > spec->max_items) {
        sl_validate_error(c, "has %zu items, at most %zu allowed", n, spec->max_items);
        return;
    }
    size_t i;
    json_t *item;
    json_array_foreach(v, i, item)
    {
        size_t saved = sl_validate_push_index(c, i);
        if (json_is_null(item))
            sl_validate_error(c, "expected a value, got null");
        else
            spec->check(c, item, spec->arg);
        sl_validate_pop(c, saved);
    }
}

void sl_vcheck_string(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_string(v)) {
        sl_validate_error(c, "expected string, got %s", type_name(v));
        return;
    }
    size_t n = json_string_length(v);
    if (n == 0)
        sl_validate_error(c, "must not be empty");
    else if (n > SL_VALIDATE_STRING_MAX)
        sl_validate_error(c, "longer than %d characters", SL_VALIDATE_STRING_MAX);
}

void sl_vcheck_bool(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_boolean(v))
        sl_validate_error(c, "expected boolean, got %s", type_name(v));
}

void sl_vcheck_int(sl_vctx_t *c, json_t *v, const void *arg)
{
    const sl_vrange_t *r = arg;
    if (!json_is_integer(v)) {
        sl_validate_error(c, "expected integer, got %s", type_name(v));
        return;
    }
    json_int_t i = json_integer_value(v);
    if (i < r->min || i > r->max)
        sl_validate_error(c, "%lld is out of range %lld..%lld", (long long)i, (long long)r->min,
                          (long long)r->max);
}

void sl_vcheck_duration(sl_vctx_t *c, json_t *v, const void *arg)
{
    const sl_vrange_t *r = arg;
    uint64_t ms;
    if (!json_is_string(v) && !json_is_integer(v)) {
        sl_validate_error(c, "expected duration (string like \"10s\" or integer ms), got %s",
                          type_name(v));
        return;
    }
    if (sl_parse_duration_ms(v, &ms) != 0) {
        if (json_is_string(v))
            sl_validate_error(c,
                              "invalid duration '%s' (use a number and one unit: ms, s, m, h; "
                              "like \"250ms\" or \"10s\")",
                              json_string_value(v));
        else
            sl_validate_error(c, "invalid duration %lld (integer milliseconds 0..4294967295)",
                              (long long)json_integer_value(v));
        return;
    }
    if ((int64_t)ms < r->min || (int64_t)ms > r->max)
        sl_validate_error(c, "duration %llums is out of range %lldms..%lldms",
                          (unsigned long long)ms, (long long)r->min, (long long)r->max);
}

void sl_vcheck_enum(sl_vctx_t *c, json_t *v, const void *arg)
{
    const char *const *names = arg;
    if (!json_is_string(v)) {
        sl_validate_error(c, "expected string, got %s", type_name(v));
        return;
    }
    const char *s = json_string_value(v);
    size_t n = 0;
    for (; names[n]; n++)
        if (strcmp(names[n], s) == 0)
            return;
    char list[512] = "";
    size_t used = 0;
    for (size_t i = 0; i < n && used < sizeof(list); i++) {
        int w = snprintf(list + used, sizeof(list) - used, "%s%s", i ? ", " : "", names[i]);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    const char *s2 = sl_validate_suggest(s, names, n);
    if (s2)
        sl_validate_error(c, "'%s' is not one of %s (did you mean '%s'?)", s, list, s2);
    else
        sl_validate_error(c, "'%s' is not one of %s", s, list);
}

void sl_vcheck_any(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)c;
    (void)v;
    (void)arg;
}

bool sl_validate_is_dns_label(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 63)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
        if (!alnum && !(ch == '-' && i > 0 && i < n - 1))
            return false;
    }
    return true;
}

bool sl_validate_is_dns_subdomain(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 253)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        bool alnum = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
        if (alnum)
            continue;
        /* '-' and '.' only between alphanumerics */
        if ((ch == '-' || ch == '.') && i > 0 && i < n - 1) {
            char prev = s[i - 1], next = s[i + 1];
            if (ch == '.' && (prev == '.' || prev == '-' || next == '.' || next == '-'))
                return false;
            continue;
        }
        return false;
    }
    return true;
}

bool sl_validate_is_ip(const char *s)
{
    unsigned char buf[16];
    return inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1;
}

/* RFC 1123 hostname, any case (endpoint addresses may be written as DNS
 * names in any case), labels of 1..63 characters, 253 in all. */
bool sl_validate_is_hostname(const char *s)
{
    size_t n = strlen(s), label = 0;
    if (n == 0 || n > 253)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        bool alnum =
            (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
        if (ch == '.') {
            if (label == 0 || s[i - 1] == '-')
                return false;
            label = 0;
            continue;
        }
        if (!alnum && !(ch == '-' && label > 0))
            return false;
        if (++label > 63)
            return false;
    }
    return label > 0 && s[n - 1] != '-';
}

void sl_vcheck_dns_subdomain(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_string(v)) {
        sl_validate_error(c, "expected string, got %s", type_name(v));
        return;
    }
    if (!sl_validate_is_dns_subdomain(json_string_value(v)))
        sl_validate_error(c,
                          "'%.300s' is not a valid name (lowercase letters, digits, '-' and '.', "
                          "starting and ending with a letter or digit, at most 253 characters)",
                          json_string_value(v));
}

void sl_vcheck_dns_label(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_string(v)) {
        sl_validate_error(c, "expected string, got %s", type_name(v));
        return;
    }
    if (!sl_validate_is_dns_label(json_string_value(v)))
        sl_validate_error(c,
                          "'%.300s' is not a valid DNS label (lowercase letters, digits and '-', "
                          "starting and ending with a letter or digit, at most 63 characters)",
                          json_string_value(v));
}

void sl_vcheck_ip(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_string(v)) {
        sl_validate_error(c, "expected string, got %s", type_name(v));
        return;
    }
    if (!sl_validate_is_ip(json_string_value(v)))
        sl_validate_error(c, "'%.300s' is not an IPv4 or IPv6 address", json_string_value(v));
}

void sl_vcheck_host_or_ip(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_string(v)) {
        sl_validate_error(c, "expected string, got %s", type_name(v));
        return;
    }
    const char *s = json_string_value(v);
    if (!sl_validate_is_ip(s) && !sl_validate_is_hostname(s))
        sl_validate_error(c, "'%.300s' is not an IP address or a hostname", s);
}

/* --- the envelope -------------------------------------------------------- */

static void check_string_map(sl_vctx_t *c, json_t *v, const void *arg)
{
    size_t max_value = (size_t)(uintptr_t)arg;
    if (!json_is_object(v)) {
        sl_validate_error(c, "expected object of strings, got %s", type_name(v));
        return;
    }
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val)
    {
        size_t saved = sl_validate_push_key(c, key);
        size_t klen = strlen(key);
        if (klen == 0 || klen > 317)
            sl_validate_error(c, "key must be 1..317 characters");
        else if (!json_is_string(val))
            sl_validate_error(c, "expected string, got %s", type_name(val));
        else if (json_string_length(val) > max_value)
            sl_validate_error(c, "value longer than %zu characters", max_value);
        sl_validate_pop(c, saved);
    }
}

static void check_string_any(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_string(v))
        sl_validate_error(c, "expected string, got %s", type_name(v));
}

/* metadata.managedFields (controller/ssa.c keeps them): entries with a
 * manager and an operation; the field sets are read leniently there. */
static void check_managed_fields(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_array(v)) {
        sl_validate_error(c, "expected list, got %s", type_name(v));
        return;
    }
    if (json_array_size(v) > 1000) {
        sl_validate_error(c, "at most 1000 entries");
        return;
    }
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        size_t saved = sl_validate_push_index(c, i);
        if (!json_is_object(e))
            sl_validate_error(c, "expected object, got %s", type_name(e));
        else if (!json_is_string(json_object_get(e, "manager")) ||
                 !json_is_string(json_object_get(e, "operation")))
            sl_validate_error(c, "an entry needs manager and operation (strings)");
        sl_validate_pop(c, saved);
    }
}

static const sl_vrange_t generation_range = {0, INT64_MAX};

static const sl_vfield_t metadata_fields[] = {
    {"name", sl_vcheck_dns_subdomain, NULL, SL_VFIELD_REQUIRED},
    {"namespace", sl_vcheck_dns_label, NULL, 0},
    {"labels", check_string_map, (const void *)(uintptr_t)63, 0},
    {"annotations", check_string_map, (const void *)(uintptr_t)262144, 0},
    /* Set by the server; accepted so that a document read back can be
     * applied again unchanged. */
    {"resourceVersion", check_string_any, NULL, 0},
    {"generation", sl_vcheck_int, &generation_range, 0},
    {"uid", check_string_any, NULL, 0},
    {"creationTimestamp", check_string_any, NULL, 0},
    {"managedFields", check_managed_fields, NULL, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t metadata_schema = {metadata_fields, NULL};

static const char *const kind_names[] = {"Gateway",  "Api",         "Backend",
                                         "Consumer", "Certificate", NULL};
static const char *const api_versions[] = {SL_API_VERSION, NULL};

static const sl_vschema_t *const spec_schemas[SL_KIND__COUNT] = {
    [SL_KIND_GATEWAY] = &sl_validate_spec_gateway,
    [SL_KIND_API] = &sl_validate_spec_api,
    [SL_KIND_BACKEND] = &sl_validate_spec_backend,
    [SL_KIND_CONSUMER] = &sl_validate_spec_consumer,
    [SL_KIND_CERTIFICATE] = &sl_validate_spec_certificate,
};

int sl_model_validate(json_t *doc, const char *source, int doc_index, sl_errors_t *errs)
{
    sl_vctx_t c;
    memset(&c, 0, sizeof(c));
    c.errs = errs;
    c.source = source ? source : "";
    c.doc = doc_index;

    if (!json_is_object(doc)) {
        sl_validate_error(&c, "expected a resource object, got %s", type_name(doc));
        return -1;
    }
    enum sl_kind kind = SL_KIND__COUNT;
    json_t *kindv = json_object_get(doc, "kind");
    if (json_is_string(kindv))
        sl_kind_from_name(json_string_value(kindv), &kind);

    static const char *const top[] = {"apiVersion", "kind", "metadata", "spec", "status"};
    const char *key;
    json_t *v;
    json_object_foreach(doc, key, v)
    {
        size_t saved = sl_validate_push_key(&c, key);
        if (strcmp(key, "apiVersion") == 0) {
            if (json_is_string(v) && strcmp(json_string_value(v), SL_API_VERSION) != 0)
                sl_validate_error(&c, "'%.200s' is not supported (use %s)", json_string_value(v),
                                  SL_API_VERSION);
            else
                sl_vcheck_enum(&c, v, api_versions);
        } else if (strcmp(key, "kind") == 0) {
            sl_vcheck_enum(&c, v, kind_names);
        } else if (strcmp(key, "metadata") == 0) {
            sl_vcheck_object(&c, v, &metadata_schema);
        } else if (strcmp(key, "spec") == 0) {
            /* Checked below, once the kind is known to be valid. */
        } else if (strcmp(key, "status") == 0) {
            /* Written by the controller; ignored on input. */
        } else {
            const char *s = sl_validate_suggest(key, top, sizeof(top) / sizeof(top[0]));
            if (s)
                sl_validate_error(&c, "unknown field (did you mean '%s'?)", s);
            else
                sl_validate_error(&c, "unknown field");
        }
        sl_validate_pop(&c, saved);
    }
    static const char *const required[] = {"apiVersion", "kind", "metadata", "spec"};
    for (size_t i = 0; i < 4; i++) {
        if (!sl_validate_get(doc, required[i])) {
            size_t saved = sl_validate_push_key(&c, required[i]);
            sl_validate_error(&c, "required field missing");
            sl_validate_pop(&c, saved);
        }
    }
    json_t *spec = sl_validate_get(doc, "spec");
    if (spec && kind != SL_KIND__COUNT) {
        size_t saved = sl_validate_push_key(&c, "spec");
        sl_vcheck_object(&c, spec, spec_schemas[kind]);
        sl_validate_pop(&c, saved);
    }
    return c.nerr ? -1 : 0;
}
