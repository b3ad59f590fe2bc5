/*
 * JSON Schema draft 2020-12 for the json-schema policy (jschema.h).
 *
 * Compile: one walk over the document in document order, so that errors
 * name the keyword's path (…config.schema.properties.name.type). Every
 * schema location gets one node, memoised by its JSON value; `$ref`s are
 * resolved after the walk against the locations found, so a $ref to
 * anything that is not a schema ("#/properties", a value inside an enum)
 * is an error rather than a guess. Then the $ref graph is checked for
 * cycles that never descend into the value ({"$defs": {"a": {"allOf":
 * [{"$ref": "#/$defs/a"}]}}}): evaluating one would never end, so the
 * schema is refused. Every cycle left descends into a child of the value
 * at each turn, so it ends with the value's depth (bounded by the policy's
 * maxDepth), and evaluation has a depth guard on top that fails closed.
 *
 * Evaluate: depth first, fail fast. The first failure names the value's
 * JSON pointer and the keyword. Subschemas whose failure is not an answer
 * (anyOf, oneOf, not, if, contains) are evaluated quietly.
 *
 * Numbers follow JSON Schema, not jansson: 1 and 1.0 are equal, and 1.0 is
 * an integer. Two integers compare exactly; otherwise as doubles.
 */
#include "jschema.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <ctype.h>
#include <math.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Types, as bits. An integer value is a number too. */
enum {
    JT_NULL = 1,
    JT_BOOLEAN = 2,
    JT_OBJECT = 4,
    JT_ARRAY = 8,
    JT_NUMBER = 16,
    JT_STRING = 32,
    JT_INTEGER = 64,
};
static const char *const type_names[] = {"null",   "boolean", "object", "array",
                                         "number", "string",  "integer"};

/* Regex backtracking bounds: a pattern that would take longer on a body
 * fails closed (the value is refused) instead of holding the worker. */
#define MATCH_LIMIT 100000
#define MATCH_DEPTH_LIMIT 10000
/* Nested evaluations (subschemas and $refs) of one value, at most. */
#define EVAL_DEPTH_MAX 2048
/* $ref chains the cycle check follows, at most. */
#define REF_CHAIN_MAX 10000

typedef struct node node_t;

typedef struct {
    pcre2_code *re;
    node_t *schema;
} pattern_prop_t;

/* A name -> subschema map: the names in an index (object of integers),
 * the nodes in an array. */
typedef struct {
    json_t *index;
    node_t **nodes;
    size_t n;
} schema_map_t;

typedef struct {
    node_t **v;
    size_t n;
} schema_list_t;

struct node {
    int8_t boolean; /* 1 true, 0 false, -1 an object schema */
    unsigned types; /* JT_* bits, 0 = any */
    node_t *ref;
    /* values borrowed from the document copy (sl_jschema.doc) */
    json_t *enum_values, *const_value;
    json_t *minimum, *maximum, *exclusive_minimum, *exclusive_maximum, *multiple_of;
    json_t *required, *dependent_required;
    /* -1 = none */
    int64_t min_length, max_length, min_items, max_items, min_props, max_props;
    int64_t min_contains, max_contains;
    pcre2_code *pattern;
    const char *pattern_src;
    uint8_t unique_items;
    schema_list_t prefix_items;
    node_t *items, *contains;
    schema_map_t properties, dependent_schemas;
    pattern_prop_t *pattern_props;
    size_t n_pattern_props;
    node_t *additional_properties, *property_names;
    schema_list_t all_of, any_of, one_of;
    node_t *not_, *if_, *then_, *else_;
    /* compile only */
    char *ref_path; /* the field path of its "$ref", for cycle errors */
    uint8_t colour; /* cycle check: 0 new, 1 on the path, 2 done */
};

struct sl_jschema {
    json_t *doc;
    node_t **nodes;
    size_t n_nodes, cap_nodes;
    node_t *root;
    pcre2_match_context *mctx;
    int has_regex;
};

/* ---- memory ------------------------------------------------------------------ */

static void node_free(node_t *n)
{
    json_decref(n->properties.index);
    free(n->properties.nodes);
    json_decref(n->dependent_schemas.index);
    free(n->dependent_schemas.nodes);
    free(n->prefix_items.v);
    free(n->all_of.v);
    free(n->any_of.v);
    free(n->one_of.v);
    pcre2_code_free(n->pattern);
    for (size_t i = 0; i < n->n_pattern_props; i++)
        pcre2_code_free(n->pattern_props[i].re);
    free(n->pattern_props);
    free(n->ref_path);
    free(n);
}

void sl_jschema_free(sl_jschema_t *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n_nodes; i++)
        node_free(s->nodes[i]);
    free(s->nodes);
    pcre2_match_context_free(s->mctx);
    json_decref(s->doc);
    free(s);
}

/* ---- compile ----------------------------------------------------------------- */

typedef struct {
    node_t *node;
    const char *ref; /* borrowed from the document */
    char *path;
} pending_ref_t;

typedef struct {
    sl_vctx_t *c;
    sl_jschema_t *s;
    json_t *memo; /* "%p" of a schema location's value -> its node's index */
    pending_ref_t *refs;
    size_t n_refs, cap_refs;
    int oom;
} cx_t;

/* Every keyword the policy knows, for "did you mean". */
/* clang-format off */
static const char *const keywords[] = {
    "$schema", "$id", "$ref", "$defs", "$comment", "title", "description", "default", "examples",
    "deprecated", "readOnly", "writeOnly", "format", "contentMediaType", "contentEncoding",
    "contentSchema", "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum",
    "minimum", "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems", "minItems",
    "uniqueItems", "maxContains", "minContains", "prefixItems", "items", "contains",
    "maxProperties", "minProperties", "required", "dependentRequired", "properties",
    "patternProperties", "additionalProperties", "propertyNames", "dependentSchemas", "allOf",
    "anyOf", "oneOf", "not", "if", "then", "else"};
/* clang-format on */

static node_t *compile_schema(cx_t *x, json_t *j);

static node_t *new_node(cx_t *x, json_t *j)
{
    sl_jschema_t *s = x->s;
    node_t *n = calloc(1, sizeof(*n));
    if (n && s->n_nodes == s->cap_nodes) {
        node_t **more = realloc(s->nodes, (s->cap_nodes * 2 + 16) * sizeof(*more));
        if (more) {
            s->nodes = more;
            s->cap_nodes = s->cap_nodes * 2 + 16;
        }
    }
    if (!n || s->n_nodes == s->cap_nodes) {
        free(n);
        x->oom = 1;
        return NULL;
    }
    s->nodes[s->n_nodes] = n;
    char key[32];
    snprintf(key, sizeof(key), "%p", (void *)j);
    json_object_set_new(x->memo, key, json_integer((json_int_t)s->n_nodes));
    s->n_nodes++;
    n->boolean = -1;
    n->min_length = n->max_length = n->min_items = n->max_items = -1;
    n->min_props = n->max_props = n->min_contains = n->max_contains = -1;
    return n;
}

static node_t *memo_get(cx_t *x, json_t *j)
{
    char key[32];
    snprintf(key, sizeof(key), "%p", (void *)j);
    json_t *i = json_object_get(x->memo, key);
    return i ? x->s->nodes[json_integer_value(i)] : NULL;
}

/* A non-negative integer (2.0 counts: draft 2020-12 integers). */
static int nonneg_int(cx_t *x, json_t *v, int64_t *out)
{
    double d = json_is_number(v) ? json_number_value(v) : -1;
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        *out = json_integer_value(v);
        return 1;
    }
    if (json_is_real(v) && d >= 0 && d == floor(d) && d < 9007199254740992.0) {
        *out = (int64_t)d;
        return 1;
    }
    sl_validate_error(x->c, "expected a non-negative integer");
    return 0;
}

static json_t *number(cx_t *x, json_t *v)
{
    if (json_is_number(v))
        return v;
    sl_validate_error(x->c, "expected a number");
    return NULL;
}

static int string_list(cx_t *x, json_t *v)
{
    if (!json_is_array(v)) {
        sl_validate_error(x->c, "expected a list of property names");
        return 0;
    }
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        size_t saved = sl_validate_push_index(x->c, i);
        if (!json_is_string(e))
            sl_validate_error(x->c, "expected a property name (string)");
        for (size_t k = 0; json_is_string(e) && k < i; k++)
            if (json_equal(e, json_array_get(v, k))) {
                sl_validate_error(x->c, "\"%.64s\" is listed twice", json_string_value(e));
                break;
            }
        sl_validate_pop(x->c, saved);
    }
    return 1;
}

static pcre2_code *regex(cx_t *x, json_t *v)
{
    if (!json_is_string(v)) {
        sl_validate_error(x->c, "expected a regular expression (string)");
        return NULL;
    }
    int ec;
    PCRE2_SIZE off;
    /* ECMA-262 semantics as far as PCRE2 shares them: UTF-8 code points,
     * ASCII \d and \w, unanchored. */
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)json_string_value(v), json_string_length(v),
                                   PCRE2_UTF, &ec, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[120];
        pcre2_get_error_message(ec, msg, sizeof(msg));
        sl_validate_error(x->c, "the pattern does not compile at offset %zu: %s", (size_t)off,
                          (const char *)msg);
        return NULL;
    }
    x->s->has_regex = 1;
    return re;
}

static void schema_list(cx_t *x, json_t *v, schema_list_t *out)
{
    if (!json_is_array(v) || json_array_size(v) == 0) {
        sl_validate_error(x->c, "expected a non-empty list of schemas");
        return;
    }
    size_t n = json_array_size(v);
    out->v = calloc(n, sizeof(*out->v));
    if (!out->v) {
        x->oom = 1;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        size_t saved = sl_validate_push_index(x->c, i);
        out->v[out->n++] = compile_schema(x, json_array_get(v, i));
        sl_validate_pop(x->c, saved);
    }
}

static void schema_map(cx_t *x, json_t *v, schema_map_t *out)
{
    if (!json_is_object(v)) {
        sl_validate_error(x->c, "expected an object of names to schemas");
        return;
    }
    out->index = json_object();
    out->nodes = calloc(json_object_size(v) + 1, sizeof(*out->nodes));
    if (!out->index || !out->nodes) {
        x->oom = 1;
        return;
    }
    const char *key;
    json_t *sub;
    json_object_foreach(v, key, sub)
    {
        size_t saved = sl_validate_push_key(x->c, key);
        json_object_set_new(out->index, key, json_integer((json_int_t)out->n));
        out->nodes[out->n++] = compile_schema(x, sub);
        sl_validate_pop(x->c, saved);
    }
}

static void type_keyword(cx_t *x, node_t *n, json_t *v)
{
    json_t *list = json_is_array(v) ? v : NULL;
    size_t count = list ? json_array_size(list) : 1;
    if (list && count == 0)
        sl_validate_error(x->c, "expected a type or a non-empty list of types");
    for (size_t i = 0; i < count; i++) {
        json_t *t = list ? json_array_get(list, i) : v;
        size_t saved = list ? sl_validate_push_index(x->c, i) : x->c->len;
        unsigned bit = 0;
        for (size_t k = 0; json_is_string(t) && k < sizeof(type_names) / sizeof(type_names[0]); k++)
            if (strcmp(json_string_value(t), type_names[k]) == 0)
                bit = 1u << k;
        if (!bit) {
            const char *s =
                json_is_string(t) ? sl_validate_suggest(json_string_value(t), type_names, 7) : NULL;
            if (s)
                sl_validate_error(x->c, "unknown type (did you mean '%s'?)", s);
            else
                sl_validate_error(x->c, "expected one of null, boolean, object, array, number, "
                                        "string, integer");
        } else if (n->types & bit) {
            sl_validate_error(x->c, "type %s is listed twice", json_string_value(t));
        }
        n->types |= bit;
        sl_validate_pop(x->c, saved);
    }
}

static void add_ref(cx_t *x, node_t *n, json_t *v)
{
    if (!json_is_string(v)) {
        sl_validate_error(x->c, "expected a reference (string), e.g. \"#/$defs/pet\"");
        return;
    }
    if (x->n_refs == x->cap_refs) {
        pending_ref_t *r = realloc(x->refs, (x->cap_refs * 2 + 8) * sizeof(*r));
        if (!r) {
            x->oom = 1;
            return;
        }
        x->refs = r;
        x->cap_refs = x->cap_refs * 2 + 8;
    }
    pending_ref_t *r = &x->refs[x->n_refs++];
    r->node = n;
    r->ref = json_string_value(v);
    r->path = strdup(x->c->path);
    n->ref_path = strdup(x->c->path);
    if (!r->path || !n->ref_path)
        x->oom = 1;
}

/* One keyword of an object schema; the path is at the keyword. */
static void keyword(cx_t *x, node_t *n, const char *k, json_t *v, int root)
{
    sl_vctx_t *c = x->c;
    if (strcmp(k, "type") == 0) {
        type_keyword(x, n, v);
    } else if (strcmp(k, "enum") == 0) {
        if (!json_is_array(v) || json_array_size(v) == 0)
            sl_validate_error(c, "expected a non-empty list of values");
        else
            n->enum_values = v;
    } else if (strcmp(k, "const") == 0) {
        n->const_value = v;
    } else if (strcmp(k, "multipleOf") == 0) {
        if ((n->multiple_of = number(x, v)) && json_number_value(v) <= 0) {
            sl_validate_error(c, "expected a number greater than 0");
            n->multiple_of = NULL;
        }
    } else if (strcmp(k, "minimum") == 0) {
        n->minimum = number(x, v);
    } else if (strcmp(k, "maximum") == 0) {
        n->maximum = number(x, v);
    } else if (strcmp(k, "exclusiveMinimum") == 0 || strcmp(k, "exclusiveMaximum") == 0) {
        if (json_is_boolean(v))
            sl_validate_error(c, "expected a number: draft 2020-12 writes the bound itself here "
                                 "(draft 4's boolean form is not supported)");
        else if (strcmp(k, "exclusiveMinimum") == 0)
            n->exclusive_minimum = number(x, v);
        else
            n->exclusive_maximum = number(x, v);
    } else if (strcmp(k, "minLength") == 0) {
        nonneg_int(x, v, &n->min_length);
    } else if (strcmp(k, "maxLength") == 0) {
        nonneg_int(x, v, &n->max_length);
    } else if (strcmp(k, "pattern") == 0) {
        n->pattern = regex(x, v);
        n->pattern_src = json_string_value(v);
    } else if (strcmp(k, "minItems") == 0) {
        nonneg_int(x, v, &n->min_items);
    } else if (strcmp(k, "maxItems") == 0) {
        nonneg_int(x, v, &n->max_items);
    } else if (strcmp(k, "uniqueItems") == 0) {
        if (!json_is_boolean(v))
            sl_validate_error(c, "expected true or false");
        n->unique_items = json_is_true(v);
    } else if (strcmp(k, "minContains") == 0) {
        nonneg_int(x, v, &n->min_contains);
    } else if (strcmp(k, "maxContains") == 0) {
        nonneg_int(x, v, &n->max_contains);
    } else if (strcmp(k, "prefixItems") == 0) {
        schema_list(x, v, &n->prefix_items);
    } else if (strcmp(k, "items") == 0) {
        if (json_is_array(v))
            sl_validate_error(c, "expected a schema: draft 2020-12 writes a tuple as prefixItems "
                                 "(the list form of items is draft 7's)");
        else
            n->items = compile_schema(x, v);
    } else if (strcmp(k, "contains") == 0) {
        n->contains = compile_schema(x, v);
    } else if (strcmp(k, "minProperties") == 0) {
        nonneg_int(x, v, &n->min_props);
    } else if (strcmp(k, "maxProperties") == 0) {
        nonneg_int(x, v, &n->max_props);
    } else if (strcmp(k, "required") == 0) {
        if (string_list(x, v))
            n->required = v;
    } else if (strcmp(k, "dependentRequired") == 0) {
        if (!json_is_object(v)) {
            sl_validate_error(c, "expected an object of property names to lists of names");
            return;
        }
        const char *name;
        json_t *list;
        json_object_foreach(v, name, list)
        {
            size_t saved = sl_validate_push_key(c, name);
            string_list(x, list);
            sl_validate_pop(c, saved);
        }
        n->dependent_required = v;
    } else if (strcmp(k, "properties") == 0) {
        schema_map(x, v, &n->properties);
    } else if (strcmp(k, "dependentSchemas") == 0) {
        schema_map(x, v, &n->dependent_schemas);
    } else if (strcmp(k, "patternProperties") == 0) {
        if (!json_is_object(v)) {
            sl_validate_error(c, "expected an object of regular expressions to schemas");
            return;
        }
        n->pattern_props = calloc(json_object_size(v) + 1, sizeof(*n->pattern_props));
        if (!n->pattern_props) {
            x->oom = 1;
            return;
        }
        const char *re;
        json_t *sub;
        json_object_foreach(v, re, sub)
        {
            size_t saved = sl_validate_push_key(c, re);
            json_t *src = json_string(re);
            pattern_prop_t *pp = &n->pattern_props[n->n_pattern_props++];
            pp->re = src ? regex(x, src) : NULL;
            json_decref(src);
            pp->schema = compile_schema(x, sub);
            sl_validate_pop(c, saved);
        }
    } else if (strcmp(k, "additionalProperties") == 0) {
        n->additional_properties = compile_schema(x, v);
    } else if (strcmp(k, "propertyNames") == 0) {
        n->property_names = compile_schema(x, v);
    } else if (strcmp(k, "allOf") == 0) {
        schema_list(x, v, &n->all_of);
    } else if (strcmp(k, "anyOf") == 0) {
        schema_list(x, v, &n->any_of);
    } else if (strcmp(k, "oneOf") == 0) {
        schema_list(x, v, &n->one_of);
    } else if (strcmp(k, "not") == 0) {
        n->not_ = compile_schema(x, v);
    } else if (strcmp(k, "if") == 0) {
        n->if_ = compile_schema(x, v);
    } else if (strcmp(k, "then") == 0) {
        n->then_ = compile_schema(x, v);
    } else if (strcmp(k, "else") == 0) {
        n->else_ = compile_schema(x, v);
    } else if (strcmp(k, "$ref") == 0) {
        add_ref(x, n, v);
    } else if (strcmp(k, "$defs") == 0) {
        if (!json_is_object(v)) {
            sl_validate_error(c, "expected an object of names to schemas");
            return;
        }
        const char *name;
        json_t *sub;
        json_object_foreach(v, name, sub)
        {
            size_t saved = sl_validate_push_key(c, name);
            compile_schema(x, sub); /* a location $refs may point to */
            sl_validate_pop(c, saved);
        }
    } else if (strcmp(k, "$schema") == 0) {
        const char *u = json_string_value(v);
        if (!root)
            sl_validate_error(c, "only the root of the schema may name its dialect");
        else if (!u || (strcmp(u, "https://json-schema.org/draft/2020-12/schema") != 0 &&
                        strcmp(u, "https://json-schema.org/draft/2020-12/schema#") != 0))
            sl_validate_error(c, "this policy implements draft 2020-12 "
                                 "(\"https://json-schema.org/draft/2020-12/schema\"); "
                                 "remove $schema or port the schema to it");
    } else if (strcmp(k, "$id") == 0) {
        if (!root)
            sl_validate_error(c, "$id is only allowed at the root (references are within this "
                                 "document: \"#/...\")");
        else if (!json_is_string(v))
            sl_validate_error(c, "expected a URI (string)");
    } else if (strcmp(k, "$comment") == 0 || strcmp(k, "title") == 0 ||
               strcmp(k, "description") == 0 || strcmp(k, "format") == 0 ||
               strcmp(k, "contentMediaType") == 0 || strcmp(k, "contentEncoding") == 0) {
        if (!json_is_string(v))
            sl_validate_error(c, "expected a string");
    } else if (strcmp(k, "deprecated") == 0 || strcmp(k, "readOnly") == 0 ||
               strcmp(k, "writeOnly") == 0) {
        if (!json_is_boolean(v))
            sl_validate_error(c, "expected true or false");
    } else if (strcmp(k, "default") == 0 || strcmp(k, "examples") == 0 ||
               strcmp(k, "contentSchema") == 0) {
        /* annotations: any value, never checked */
    } else if (strcmp(k, "definitions") == 0) {
        sl_validate_error(c, "unknown keyword: draft 2020-12 names it $defs");
    } else if (strcmp(k, "additionalItems") == 0) {
        sl_validate_error(c, "unknown keyword: draft 2020-12 uses items after prefixItems");
    } else if (strcmp(k, "dependencies") == 0) {
        sl_validate_error(
            c, "unknown keyword: draft 2020-12 uses dependentRequired or dependentSchemas");
    } else if (strcmp(k, "unevaluatedProperties") == 0 || strcmp(k, "unevaluatedItems") == 0 ||
               strcmp(k, "$anchor") == 0 || strcmp(k, "$dynamicRef") == 0 ||
               strcmp(k, "$dynamicAnchor") == 0 || strcmp(k, "$vocabulary") == 0 ||
               strcmp(k, "$recursiveRef") == 0 || strcmp(k, "$recursiveAnchor") == 0) {
        sl_validate_error(c,
                          "%s is not supported by the json-schema policy "
                          "(docs/policies/json-schema.md lists what is)",
                          k);
    } else {
        const char *s = sl_validate_suggest(k, keywords, sizeof(keywords) / sizeof(keywords[0]));
        if (s)
            sl_validate_error(c, "unknown keyword (did you mean '%s'?)", s);
        else
            sl_validate_error(c, "unknown keyword");
    }
}

static node_t *compile_schema(cx_t *x, json_t *j)
{
    node_t *n = memo_get(x, j);
    if (n)
        return n;
    if (!(n = new_node(x, j)))
        return NULL;
    if (json_is_boolean(j)) {
        n->boolean = json_is_true(j);
        return n;
    }
    if (!json_is_object(j)) {
        sl_validate_error(x->c, "expected a schema: an object, or true or false");
        n->boolean = 0;
        return n;
    }
    int root = j == x->s->doc;
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v)
    {
        size_t saved = sl_validate_push_key(x->c, k);
        keyword(x, n, k, v, root);
        sl_validate_pop(x->c, saved);
    }
    if (n->min_contains >= 0 && !n->contains)
        n->min_contains = -1; /* without contains they mean nothing */
    if (n->contains && n->min_contains < 0)
        n->min_contains = 1;
    return n;
}

/* The value at a JSON pointer "/a/b" (URI-fragment encoded: %XX, ~0, ~1)
 * of doc, or NULL. */
static json_t *resolve_pointer(json_t *doc, const char *p)
{
    json_t *cur = doc;
    while (*p == '/' && cur) {
        p++;
        char tok[512];
        size_t n = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '%') {
                if (!isxdigit((unsigned char)p[0]) || !isxdigit((unsigned char)p[1]))
                    return NULL;
                char hex[3] = {p[0], p[1], 0};
                ch = (char)strtol(hex, NULL, 16);
                p += 2;
            }
            if (n + 1 >= sizeof(tok))
                return NULL;
            tok[n++] = ch;
        }
        tok[n] = '\0';
        if (strlen(tok) != n)
            return NULL; /* a %00 */
        /* ~1 is '/', ~0 is '~' (RFC 6901), after the percent-decoding. */
        size_t o = 0;
        for (size_t i = 0; i < n; i++) {
            if (tok[i] == '~' && (tok[i + 1] == '0' || tok[i + 1] == '1')) {
                tok[o++] = tok[i + 1] == '0' ? '~' : '/';
                i++;
            } else if (tok[i] == '~') {
                return NULL;
            } else {
                tok[o++] = tok[i];
            }
        }
        tok[o] = '\0';
        if (json_is_object(cur)) {
            cur = json_object_get(cur, tok);
        } else if (json_is_array(cur)) {
            char *end;
            if (!tok[0] || (tok[0] == '0' && tok[1]) || tok[0] < '0' || tok[0] > '9')
                return NULL;
            unsigned long i = strtoul(tok, &end, 10);
            cur = *end ? NULL : json_array_get(cur, i);
        } else {
            return NULL;
        }
    }
    return *p ? NULL : cur;
}

static void set_path(sl_vctx_t *c, const char *path)
{
    snprintf(c->path, sizeof(c->path), "%s", path);
    c->len = strlen(c->path);
}

static void resolve_refs(cx_t *x)
{
    char saved[SL_VALIDATE_PATH_MAX];
    size_t saved_len = x->c->len;
    memcpy(saved, x->c->path, sizeof(saved));
    for (size_t i = 0; i < x->n_refs; i++) {
        pending_ref_t *r = &x->refs[i];
        set_path(x->c, r->path);
        json_t *target = NULL;
        if (r->ref[0] != '#' || (r->ref[1] && r->ref[1] != '/')) {
            sl_validate_error(x->c, "only references within this schema are supported: \"#\" or a "
                                    "JSON pointer such as \"#/$defs/pet\"");
            continue;
        }
        if (!(target = resolve_pointer(x->s->doc, r->ref + 1))) {
            sl_validate_error(x->c, "\"%.128s\" points to nothing in this schema", r->ref);
            continue;
        }
        node_t *t = memo_get(x, target);
        if (!t) {
            sl_validate_error(x->c,
                              "\"%.128s\" is not a schema (point to the root, a $defs entry "
                              "or a subschema)",
                              r->ref);
            continue;
        }
        r->node->ref = t;
    }
    memcpy(x->c->path, saved, sizeof(saved));
    x->c->len = saved_len;
}

/*
 * Same-value edges: the keywords that apply another schema to the same
 * value. A cycle made only of them never ends, so it is refused, at the
 * first $ref found on it (every such cycle has one: without $refs the
 * document is a tree).
 */
static int find_cycle(cx_t *x, node_t *n, node_t **stack, size_t depth);

static int visit(cx_t *x, node_t *to, node_t **stack, size_t depth)
{
    return to ? find_cycle(x, to, stack, depth) : 0;
}

static int find_cycle(cx_t *x, node_t *n, node_t **stack, size_t depth)
{
    if (n->colour == 2)
        return 0;
    if (n->colour == 1) {
        /* The cycle is stack[k..depth) where stack[k] == n; blame the
         * first of its edges that is a $ref. */
        size_t k = 0;
        while (k < depth && stack[k] != n)
            k++;
        for (size_t i = k; i < depth; i++)
            if (stack[i]->ref_path && stack[i]->ref == (i + 1 < depth ? stack[i + 1] : n)) {
                char saved[SL_VALIDATE_PATH_MAX];
                size_t saved_len = x->c->len;
                memcpy(saved, x->c->path, sizeof(saved));
                set_path(x->c, stack[i]->ref_path);
                sl_validate_error(x->c, "this $ref leads back to itself without descending into "
                                        "the value (through $ref, allOf, anyOf, oneOf, not, if, "
                                        "then, else or dependentSchemas): it would never end");
                memcpy(x->c->path, saved, sizeof(saved));
                x->c->len = saved_len;
                return 1;
            }
        return 1;
    }
    if (depth >= REF_CHAIN_MAX) {
        sl_validate_error(x->c, "the schema's chains of $ref are too long (at most %d)",
                          REF_CHAIN_MAX);
        return 1;
    }
    n->colour = 1;
    stack[depth++] = n;
    int found = visit(x, n->ref, stack, depth) || visit(x, n->not_, stack, depth) ||
                visit(x, n->if_, stack, depth) || visit(x, n->then_, stack, depth) ||
                visit(x, n->else_, stack, depth);
    const schema_list_t *lists[] = {&n->all_of, &n->any_of, &n->one_of};
    for (size_t l = 0; !found && l < 3; l++)
        for (size_t i = 0; !found && i < lists[l]->n; i++)
            found = visit(x, lists[l]->v[i], stack, depth);
    for (size_t i = 0; !found && i < n->dependent_schemas.n; i++)
        found = visit(x, n->dependent_schemas.nodes[i], stack, depth);
    n->colour = 2;
    return found;
}

sl_jschema_t *sl_jschema_compile(sl_vctx_t *c, json_t *schema)
{
    size_t errors_before = c->nerr;
    cx_t x = {.c = c};
    x.s = calloc(1, sizeof(*x.s));
    x.memo = json_object();
    if (!x.s || !x.memo) {
        sl_validate_error(c, "out of memory");
        goto fail;
    }
    x.s->doc = json_deep_copy(schema);
    if (!x.s->doc) {
        sl_validate_error(c, "out of memory");
        goto fail;
    }
    x.s->root = compile_schema(&x, x.s->doc);
    if (!x.oom)
        resolve_refs(&x);
    if (!x.oom && c->nerr == errors_before) {
        node_t **stack = malloc(REF_CHAIN_MAX * sizeof(*stack));
        if (!stack)
            x.oom = 1;
        for (size_t i = 0; stack && i < x.s->n_nodes; i++)
            if (find_cycle(&x, x.s->nodes[i], stack, 0))
                break;
        free(stack);
    }
    if (x.oom)
        sl_validate_error(c, "out of memory");
    if (!x.oom && x.s->has_regex) {
        x.s->mctx = pcre2_match_context_create(NULL);
        if (x.s->mctx) {
            pcre2_set_match_limit(x.s->mctx, MATCH_LIMIT);
            pcre2_set_depth_limit(x.s->mctx, MATCH_DEPTH_LIMIT);
        } else {
            sl_validate_error(c, "out of memory");
        }
    }
    for (size_t i = 0; i < x.n_refs; i++)
        free(x.refs[i].path);
    free(x.refs);
    json_decref(x.memo);
    if (c->nerr != errors_before) {
        sl_jschema_free(x.s);
        return NULL;
    }
    for (size_t i = 0; i < x.s->n_nodes; i++) {
        free(x.s->nodes[i]->ref_path);
        x.s->nodes[i]->ref_path = NULL;
    }
    return x.s;
fail:
    json_decref(x.memo);
    sl_jschema_free(x.s);
    return NULL;
}

/* ---- values ------------------------------------------------------------------ */

static int is_integral(json_t *v)
{
    if (json_is_integer(v))
        return 1;
    double d = json_real_value(v);
    return isfinite(d) && d == floor(d);
}

static unsigned type_of(json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return JT_OBJECT;
    case JSON_ARRAY:
        return JT_ARRAY;
    case JSON_STRING:
        return JT_STRING;
    case JSON_INTEGER:
        return JT_NUMBER | JT_INTEGER;
    case JSON_REAL:
        return JT_NUMBER | (is_integral(v) ? JT_INTEGER : 0);
    case JSON_TRUE:
    case JSON_FALSE:
        return JT_BOOLEAN;
    default:
        return JT_NULL;
    }
}

static const char *type_name(json_t *v)
{
    unsigned t = type_of(v);
    return t & JT_INTEGER ? "integer" : t & JT_NUMBER ? "number" : type_names[__builtin_ctz(t)];
}

/* <0, 0, >0 as a is less than, equal to, greater than b (both numbers). */
static int num_cmp(json_t *a, json_t *b)
{
    if (json_is_integer(a) && json_is_integer(b)) {
        json_int_t x = json_integer_value(a), y = json_integer_value(b);
        return (x > y) - (x < y);
    }
    double x = json_number_value(a), y = json_number_value(b);
    return (x > y) - (x < y);
}

/* Equality as JSON Schema defines it (enum, const, uniqueItems). */
static int equal(json_t *a, json_t *b)
{
    if (json_is_number(a) && json_is_number(b))
        return num_cmp(a, b) == 0;
    if (json_typeof(a) != json_typeof(b))
        return 0;
    switch (json_typeof(a)) {
    case JSON_STRING:
        return json_string_length(a) == json_string_length(b) &&
               memcmp(json_string_value(a), json_string_value(b), json_string_length(a)) == 0;
    case JSON_ARRAY:
        if (json_array_size(a) != json_array_size(b))
            return 0;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!equal(json_array_get(a, i), json_array_get(b, i)))
                return 0;
        return 1;
    case JSON_OBJECT: {
        if (json_object_size(a) != json_object_size(b))
            return 0;
        const char *k;
        json_t *va;
        json_object_foreach(a, k, va)
        {
            json_t *vb = json_object_get(b, k);
            if (!vb || !equal(va, vb))
                return 0;
        }
        return 1;
    }
    default:
        return 1; /* true, false, null */
    }
}

static uint64_t mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

static uint64_t hash_bytes(const char *p, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 0x100000001b3ULL;
    return mix(h);
}

/* Equal values (equal()) hash alike: numbers by their double value, an
 * object's members in any order. */
static uint64_t hash(json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_INTEGER:
    case JSON_REAL: {
        double d = json_number_value(v);
        if (d == 0)
            d = 0; /* -0.0 */
        uint64_t bits;
        memcpy(&bits, &d, sizeof(bits));
        return mix(bits ^ 0x6e756d);
    }
    case JSON_STRING:
        return hash_bytes(json_string_value(v), json_string_length(v), 0xcbf29ce484222325ULL);
    case JSON_ARRAY: {
        uint64_t h = 0xa77a;
        for (size_t i = 0; i < json_array_size(v); i++)
            h = mix(h * 31 + hash(json_array_get(v, i)));
        return h;
    }
    case JSON_OBJECT: {
        uint64_t h = 0x0b1ec7;
        const char *k;
        json_t *m;
        json_object_foreach(v, k, m)
        {
            h += mix(hash_bytes(k, strlen(k), 0xcbf29ce484222325ULL) ^ hash(m));
        }
        return mix(h);
    }
    case JSON_TRUE:
        return 1;
    case JSON_FALSE:
        return 2;
    default:
        return 3;
    }
}

typedef struct {
    uint64_t h;
    size_t i;
} hashed_t;

static int hashed_cmp(const void *a, const void *b)
{
    const hashed_t *x = a, *y = b;
    if (x->h != y->h)
        return x->h < y->h ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* The first two equal items (by index), or 0 when all differ; -1 when out
 * of memory. Sorting by hash keeps it O(n log n) on any body. */
static int first_duplicate(json_t *arr, size_t *a, size_t *b)
{
    size_t n = json_array_size(arr);
    if (n < 2)
        return 0;
    hashed_t *hs = malloc(n * sizeof(*hs));
    if (!hs)
        return -1;
    for (size_t i = 0; i < n; i++)
        hs[i] = (hashed_t){hash(json_array_get(arr, i)), i};
    qsort(hs, n, sizeof(*hs), hashed_cmp);
    int found = 0;
    for (size_t i = 0; i + 1 < n && !found; i++)
        for (size_t j = i + 1; j < n && hs[j].h == hs[i].h && !found; j++)
            if (equal(json_array_get(arr, hs[i].i), json_array_get(arr, hs[j].i))) {
                *a = hs[i].i < hs[j].i ? hs[i].i : hs[j].i;
                *b = hs[i].i < hs[j].i ? hs[j].i : hs[i].i;
                found = 1;
            }
    free(hs);
    return found;
}

static int multiple_of(json_t *v, json_t *m)
{
    if (json_is_integer(v) && json_is_integer(m))
        return json_integer_value(v) % json_integer_value(m) == 0;
    double x = json_number_value(v), d = json_number_value(m);
    if (!isfinite(x))
        return 0;
    double r = fabs(fmod(x, d));
    /* Decimal fractions are not exact in binary: 0.3 is a multiple of 0.1. */
    return r <= 1e-9 * d || d - r <= 1e-9 * d;
}

static void format_number(json_t *v, char *buf, size_t cap)
{
    if (json_is_integer(v))
        snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
    else
        snprintf(buf, cap, "%.17g", json_real_value(v));
}

/* Code points of a UTF-8 string (jansson checked the encoding). */
static size_t code_points(json_t *v)
{
    const unsigned char *p = (const unsigned char *)json_string_value(v);
    size_t n = 0, len = json_string_length(v);
    for (size_t i = 0; i < len; i++)
        n += (p[i] & 0xc0) != 0x80;
    return n;
}

/* ---- evaluate ---------------------------------------------------------------- */

typedef struct {
    const sl_jschema_t *s;
    pcre2_match_data *md;
    char ptr[1024];
    size_t ptr_len;
    unsigned ptr_cut; /* pushes past the buffer, not written */
    unsigned quiet;   /* > 0: failures are not the answer */
    unsigned depth;
    int too_deep;
    int failed;
    sl_jschema_error_t *err;
} ev_t;

static int fail(ev_t *ev, const char *keyword, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(ev_t *ev, const char *keyword, const char *fmt, ...)
{
    if (ev->quiet || ev->failed)
        return 0;
    ev->failed = 1;
    sl_jschema_error_t *e = ev->err;
    const char *p = ev->ptr;
    size_t len = ev->ptr_len;
    if (len >= sizeof(e->pointer) || ev->ptr_cut) {
        /* The deepest part says most: keep the end. */
        size_t keep = sizeof(e->pointer) - 4;
        if (len > keep) {
            p += len - keep;
            len = keep;
        }
        snprintf(e->pointer, sizeof(e->pointer), "...%.*s", (int)len, p);
    } else {
        snprintf(e->pointer, sizeof(e->pointer), "%.*s", (int)len, p);
    }
    e->keyword = keyword;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    return 0;
}

/* Appends "/token" (RFC 6901 escaped) to the pointer; returns what to
 * restore with pop. */
static size_t push(ev_t *ev, const char *tok, size_t n)
{
    size_t saved = ev->ptr_len;
    size_t o = ev->ptr_len;
    if (o + 1 >= sizeof(ev->ptr)) {
        ev->ptr_cut++;
        return saved | ((size_t)1 << 63);
    }
    ev->ptr[o++] = '/';
    for (size_t i = 0; i < n && o + 2 < sizeof(ev->ptr); i++) {
        if (tok[i] == '~' || tok[i] == '/') {
            ev->ptr[o++] = '~';
            ev->ptr[o++] = tok[i] == '~' ? '0' : '1';
        } else {
            ev->ptr[o++] = tok[i];
        }
    }
    ev->ptr_len = o;
    return saved;
}

static size_t push_index(ev_t *ev, size_t i)
{
    char b[24];
    size_t n = sizeof(b);
    do { /* not snprintf: this runs for every item of every array */
        b[--n] = (char)('0' + i % 10);
        i /= 10;
    } while (i);
    return push(ev, b + n, sizeof(b) - n);
}

static void pop(ev_t *ev, size_t saved)
{
    if (saved & ((size_t)1 << 63)) {
        ev->ptr_cut--;
        saved &= ~((size_t)1 << 63);
    }
    ev->ptr_len = saved;
}

static int eval(ev_t *ev, const node_t *n, json_t *v);

static int eval_quiet(ev_t *ev, const node_t *n, json_t *v)
{
    ev->quiet++;
    int ok = eval(ev, n, v);
    ev->quiet--;
    return ok;
}

/* 1 the pattern matches, 0 it does not, -1 it could not be decided (the
 * match limits): the caller fails closed. */
static int match(ev_t *ev, const pcre2_code *re, const char *s, size_t len)
{
    int rc = pcre2_match(re, (PCRE2_SPTR)s, len, 0, 0, ev->md, ev->s->mctx);
    return rc >= 0 ? 1 : rc == PCRE2_ERROR_NOMATCH ? 0 : -1;
}

static void types_text(unsigned types, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = '\0';
    for (unsigned k = 0; k < 7; k++)
        if (types & (1u << k))
            o += (size_t)snprintf(buf + o, o < cap ? cap - o : 0, "%s%s", o ? " or " : "",
                                  type_names[k]);
}

static int eval_number(ev_t *ev, const node_t *n, json_t *v)
{
    char a[32], b[32];
    if (n->minimum && num_cmp(v, n->minimum) < 0) {
        format_number(v, a, sizeof(a));
        format_number(n->minimum, b, sizeof(b));
        return fail(ev, "minimum", "%s is less than the minimum %s", a, b);
    }
    if (n->exclusive_minimum && num_cmp(v, n->exclusive_minimum) <= 0) {
        format_number(v, a, sizeof(a));
        format_number(n->exclusive_minimum, b, sizeof(b));
        return fail(ev, "exclusiveMinimum", "%s is not greater than %s", a, b);
    }
    if (n->maximum && num_cmp(v, n->maximum) > 0) {
        format_number(v, a, sizeof(a));
        format_number(n->maximum, b, sizeof(b));
        return fail(ev, "maximum", "%s is greater than the maximum %s", a, b);
    }
    if (n->exclusive_maximum && num_cmp(v, n->exclusive_maximum) >= 0) {
        format_number(v, a, sizeof(a));
        format_number(n->exclusive_maximum, b, sizeof(b));
        return fail(ev, "exclusiveMaximum", "%s is not less than %s", a, b);
    }
    if (n->multiple_of && !multiple_of(v, n->multiple_of)) {
        format_number(v, a, sizeof(a));
        format_number(n->multiple_of, b, sizeof(b));
        return fail(ev, "multipleOf", "%s is not a multiple of %s", a, b);
    }
    return 1;
}

static int eval_string(ev_t *ev, const node_t *n, json_t *v)
{
    if (n->min_length >= 0 || n->max_length >= 0) {
        size_t len = code_points(v);
        if (n->min_length >= 0 && len < (uint64_t)n->min_length)
            return fail(ev, "minLength", "the string has %zu characters, fewer than %lld", len,
                        (long long)n->min_length);
        if (n->max_length >= 0 && len > (uint64_t)n->max_length)
            return fail(ev, "maxLength", "the string has %zu characters, more than %lld", len,
                        (long long)n->max_length);
    }
    if (n->pattern) {
        int m = match(ev, n->pattern, json_string_value(v), json_string_length(v));
        if (m < 0)
            return fail(ev, "pattern", "the string is too costly to match against /%.64s/",
                        n->pattern_src);
        if (!m)
            return fail(ev, "pattern", "the string does not match /%.96s/", n->pattern_src);
    }
    return 1;
}

static int eval_array(ev_t *ev, const node_t *n, json_t *v)
{
    size_t count = json_array_size(v);
    if (n->min_items >= 0 && count < (uint64_t)n->min_items)
        return fail(ev, "minItems", "the array has %zu items, fewer than %lld", count,
                    (long long)n->min_items);
    if (n->max_items >= 0 && count > (uint64_t)n->max_items)
        return fail(ev, "maxItems", "the array has %zu items, more than %lld", count,
                    (long long)n->max_items);
    for (size_t i = 0; i < count && (i < n->prefix_items.n || n->items); i++) {
        const node_t *sub = i < n->prefix_items.n ? n->prefix_items.v[i] : n->items;
        size_t saved = push_index(ev, i);
        int ok = eval(ev, sub, json_array_get(v, i));
        pop(ev, saved);
        if (!ok)
            return 0;
    }
    if (n->contains) {
        int64_t matches = 0;
        for (size_t i = 0; i < count; i++) {
            if (eval_quiet(ev, n->contains, json_array_get(v, i)))
                matches++;
            if (ev->too_deep)
                return 0;
        }
        if (matches < n->min_contains) {
            if (n->min_contains == 1)
                return fail(ev, "contains", "no item matches the schema of contains");
            return fail(ev, "minContains", "%lld items match contains, fewer than %lld",
                        (long long)matches, (long long)n->min_contains);
        }
        if (n->max_contains >= 0 && matches > n->max_contains)
            return fail(ev, "maxContains", "%lld items match contains, more than %lld",
                        (long long)matches, (long long)n->max_contains);
    }
    if (n->unique_items) {
        size_t a = 0, b = 0;
        int d = first_duplicate(v, &a, &b);
        if (d < 0)
            return fail(ev, "uniqueItems", "out of memory while comparing the items");
        if (d)
            return fail(ev, "uniqueItems", "items %zu and %zu are equal", a, b);
    }
    return 1;
}

static int eval_object(ev_t *ev, const node_t *n, json_t *v)
{
    size_t count = json_object_size(v);
    if (n->min_props >= 0 && count < (uint64_t)n->min_props)
        return fail(ev, "minProperties", "the object has %zu properties, fewer than %lld", count,
                    (long long)n->min_props);
    if (n->max_props >= 0 && count > (uint64_t)n->max_props)
        return fail(ev, "maxProperties", "the object has %zu properties, more than %lld", count,
                    (long long)n->max_props);
    for (size_t i = 0; n->required && i < json_array_size(n->required); i++) {
        const char *name = json_string_value(json_array_get(n->required, i));
        if (!json_object_get(v, name))
            return fail(ev, "required", "the property \"%.96s\" is missing", name);
    }
    const char *k;
    json_t *m;
    if (n->dependent_required) {
        json_t *list;
        json_object_foreach(n->dependent_required, k, list)
        {
            if (!json_object_get(v, k))
                continue;
            for (size_t i = 0; i < json_array_size(list); i++) {
                const char *name = json_string_value(json_array_get(list, i));
                if (!json_object_get(v, name))
                    return fail(ev, "dependentRequired",
                                "the property \"%.48s\" is missing (required with \"%.48s\")", name,
                                k);
            }
        }
    }
    int members =
        n->properties.n || n->n_pattern_props || n->additional_properties || n->property_names;
    json_object_foreach(v, k, m)
    {
        if (!members)
            break;
        size_t klen = strlen(k);
        size_t saved = push(ev, k, klen);
        int ok = 1, matched = 0;
        if (n->property_names) {
            json_t *name = json_stringn(k, klen);
            ok = name && eval(ev, n->property_names, name);
            if (!name)
                fail(ev, "propertyNames", "out of memory");
            json_decref(name);
        }
        json_t *i = ok && n->properties.index ? json_object_get(n->properties.index, k) : NULL;
        if (i) {
            matched = 1;
            ok = eval(ev, n->properties.nodes[json_integer_value(i)], m);
        }
        for (size_t p = 0; ok && p < n->n_pattern_props; p++) {
            int r = match(ev, n->pattern_props[p].re, k, klen);
            if (r < 0) {
                ok = fail(ev, "patternProperties", "the name is too costly to match");
            } else if (r) {
                matched = 1;
                ok = eval(ev, n->pattern_props[p].schema, m);
            }
        }
        if (ok && !matched && n->additional_properties) {
            if (n->additional_properties->boolean == 0)
                ok = fail(ev, "additionalProperties", "the property \"%.96s\" is not allowed", k);
            else
                ok = eval(ev, n->additional_properties, m);
        }
        pop(ev, saved);
        if (!ok)
            return 0;
    }
    if (n->dependent_schemas.n) {
        json_object_foreach(n->dependent_schemas.index, k, m)
        {
            if (json_object_get(v, k) &&
                !eval(ev, n->dependent_schemas.nodes[json_integer_value(m)], v))
                return 0;
        }
    }
    return 1;
}

static int eval_node(ev_t *ev, const node_t *n, json_t *v)
{
    if (n->ref && !eval(ev, n->ref, v))
        return 0;
    unsigned t = type_of(v);
    if (n->types && !(n->types & t)) {
        char want[80];
        types_text(n->types, want, sizeof(want));
        return fail(ev, "type", "expected %s, got %s", want, type_name(v));
    }
    if (n->const_value && !equal(v, n->const_value))
        return fail(ev, "const", "the value is not the one the schema requires");
    if (n->enum_values) {
        size_t i;
        for (i = 0; i < json_array_size(n->enum_values); i++)
            if (equal(v, json_array_get(n->enum_values, i)))
                break;
        if (i == json_array_size(n->enum_values))
            return fail(ev, "enum", "the value is not one of the %zu allowed",
                        json_array_size(n->enum_values));
    }
    if ((t & JT_NUMBER) && !eval_number(ev, n, v))
        return 0;
    if ((t & JT_STRING) && !eval_string(ev, n, v))
        return 0;
    if ((t & JT_ARRAY) && !eval_array(ev, n, v))
        return 0;
    if ((t & JT_OBJECT) && !eval_object(ev, n, v))
        return 0;
    for (size_t i = 0; i < n->all_of.n; i++)
        if (!eval(ev, n->all_of.v[i], v))
            return 0;
    if (n->any_of.n) {
        size_t i;
        for (i = 0; i < n->any_of.n; i++)
            if (eval_quiet(ev, n->any_of.v[i], v))
                break;
        if (ev->too_deep)
            return 0;
        if (i == n->any_of.n)
            return fail(ev, "anyOf", "the value matches none of the %zu schemas of anyOf",
                        n->any_of.n);
    }
    if (n->one_of.n) {
        size_t first = 0, passed = 0;
        for (size_t i = 0; i < n->one_of.n && passed < 2; i++)
            if (eval_quiet(ev, n->one_of.v[i], v)) {
                if (!passed)
                    first = i;
                else
                    return ev->too_deep ? 0
                                        : fail(ev, "oneOf",
                                               "the value matches more than one schema of oneOf "
                                               "(%zu and %zu)",
                                               first, i);
                passed++;
            }
        if (ev->too_deep)
            return 0;
        if (!passed)
            return fail(ev, "oneOf", "the value matches none of the %zu schemas of oneOf",
                        n->one_of.n);
    }
    if (n->not_) {
        int r = eval_quiet(ev, n->not_, v);
        if (ev->too_deep)
            return 0;
        if (r)
            return fail(ev, "not", "the value matches the schema of not");
    }
    if (n->if_) {
        int r = eval_quiet(ev, n->if_, v);
        if (ev->too_deep)
            return 0;
        if (r && n->then_ && !eval(ev, n->then_, v))
            return 0;
        if (!r && n->else_ && !eval(ev, n->else_, v))
            return 0;
    }
    return 1;
}

static int eval(ev_t *ev, const node_t *n, json_t *v)
{
    if (ev->too_deep)
        return 0;
    if (n->boolean == 1)
        return 1;
    if (n->boolean == 0)
        return fail(ev, "false", "no value is allowed here");
    if (++ev->depth > EVAL_DEPTH_MAX) {
        ev->too_deep = 1; /* fails closed, quiet or not */
        ev->depth--;
        return 0;
    }
    int ok = eval_node(ev, n, v);
    ev->depth--;
    return ok;
}

int sl_jschema_validate(const sl_jschema_t *s, json_t *value, sl_jschema_error_t *err)
{
    ev_t ev = {.s = s, .err = err};
    if (s->has_regex && !(ev.md = pcre2_match_data_create(1, NULL))) {
        snprintf(err->pointer, sizeof(err->pointer), "%s", "");
        err->keyword = "pattern";
        snprintf(err->message, sizeof(err->message), "out of memory");
        return 0;
    }
    int ok = eval(&ev, s->root, value);
    pcre2_match_data_free(ev.md);
    if (ev.too_deep) {
        ev.quiet = 0;
        ev.failed = 0;
        ev.ptr_len = 0;
        ev.ptr_cut = 0;
        fail(&ev, "$ref", "the value and the schema nest too deep to be checked");
        return 0;
    }
    if (!ok && !ev.failed)
        fail(&ev, "schema", "the value is not valid");
    return ok;
}
