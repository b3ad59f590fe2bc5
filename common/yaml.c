/*
 * YAML text -> jansson values (sl_yaml_to_json), with libyaml's event parser.
 *
 * Responsible for: building one JSON value per YAML document; typing plain
 * scalars by the YAML 1.2 core schema; resolving anchors and aliases while
 * bounding what they can expand to (an alias bomb must fail fast, not eat the
 * machine); rejecting duplicate keys and non-string keys; errors with line
 * and column. Not responsible for what the documents mean (validate.c) nor
 * for JSON text (model.c hands JSON to jansson directly, for exact numbers).
 *
 * One deliberate leniency: strict YAML forbids '{' and '}' inside plain
 * scalars of flow collections, so `{method: GET, path: /pets/{id}}` (the
 * quickstart's own style) would be a syntax error. A '{' directly after a
 * scalar character can never start a flow mapping, so before parsing such a
 * "word{param}" group is masked with two private-use code points (one
 * character each, so line:column stay exact) and unmasked in every scalar.
 * Valid YAML parses exactly as before; only would-be syntax errors change.
 *
 * Aliases are expanded by deep copy rather than shared by reference, so every
 * document is an ordinary tree that later code may modify freely. The node
 * and depth bounds below are what keep that copy cheap.
 */
#include "model.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* Bounds on what a document may expand to, counting alias expansions: a
 * billion-laughs document reaches the node bound after a few levels. */
#define SL_YAML_MAX_NODES 1000000
#define SL_YAML_MAX_DEPTH 64
#define SL_YAML_MAX_ANCHORS 10000

/* U+E000 and U+E001 in UTF-8: stand-ins for a masked '{' and '}'. */
static const char MASK_OPEN[] = "\xEE\x80\x80";
static const char MASK_CLOSE[] = "\xEE\x80\x81";

static bool is_scalar_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '/' ||
           c == '_' || c == '-' || c == '.' || c == '~' || c == '%' || c == '$' || c == '^' ||
           c == '*' || c == '+' || c == ')' || c >= 0x80;
}

/* Length of a maskable "{...}" group at s[0] == '{', or 0. The inside may not
 * hold quotes, comments, brackets or line breaks, so masking can never move a
 * quoted string's or a collection's boundary. */
static size_t brace_group_len(const char *s, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '}')
            return i + 1;
        if (c <= ' ' || strchr("{[]\"'#", c))
            return 0;
    }
    return 0;
}

/* Returns the masked copy of text (and its length), or NULL when nothing
 * needs masking or the text already holds the stand-in code points. */
static char *brace_mask(const char *text, size_t len, size_t *outlen)
{
    size_t groups = 0;
    for (size_t i = 0; i + 2 < len; i++) {
        if ((unsigned char)text[i] == 0xEE && (unsigned char)text[i + 1] == 0x80 &&
            ((unsigned char)text[i + 2] == 0x80 || (unsigned char)text[i + 2] == 0x81))
            return NULL;
    }
    for (size_t i = 1; i < len; i++) {
        if (text[i] == '{' && is_scalar_char((unsigned char)text[i - 1])) {
            size_t g = brace_group_len(text + i, len - i);
            if (g) {
                groups++;
                i += g - 1;
            }
        }
    }
    if (groups == 0)
        return NULL;
    char *out = malloc(len + groups * 4 + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        size_t g = 0;
        if (i > 0 && text[i] == '{' && is_scalar_char((unsigned char)text[i - 1]))
            g = brace_group_len(text + i, len - i);
        if (!g) {
            out[o++] = text[i];
            continue;
        }
        memcpy(out + o, MASK_OPEN, 3);
        o += 3;
        memcpy(out + o, text + i + 1, g - 2);
        o += g - 2;
        memcpy(out + o, MASK_CLOSE, 3);
        o += 3;
        i += g - 1;
    }
    out[o] = '\0';
    *outlen = o;
    return out;
}

/* Undoes brace_mask in a scalar, in place (the result is never longer). */
static size_t brace_unmask(char *s, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + 2 < n && (unsigned char)s[i] == 0xEE && (unsigned char)s[i + 1] == 0x80 &&
            ((unsigned char)s[i + 2] == 0x80 || (unsigned char)s[i + 2] == 0x81)) {
            s[o++] = (unsigned char)s[i + 2] == 0x80 ? '{' : '}';
            i += 2;
            continue;
        }
        s[o++] = s[i];
    }
    s[o] = '\0';
    return o;
}

typedef struct {
    json_t *node;      /* object or array being filled */
    char *pending_key; /* for objects: key waiting for its value */
    char *anchor;      /* anchor of this collection, or NULL */
    size_t start_nodes;
    int height; /* 1 + max height of the children seen so far */
} frame_t;

typedef struct {
    char *name;
    json_t *value;
    size_t nodes;
    int height;
} anchor_t;

typedef struct {
    const char *source;
    sl_errors_t *errs;
    int doc;
    frame_t stack[SL_YAML_MAX_DEPTH];
    int depth;
    anchor_t *anchors;
    size_t nanchors, anchors_cap;
    size_t nodes;
    json_t *root; /* value of the current document */
    bool failed;
    bool masked; /* the text went through brace_mask */
} ctx_t;

static void yerr(ctx_t *c, const yaml_mark_t *m, const char *fmt, const char *arg)
{
    char msg[512];
    snprintf(msg, sizeof(msg), fmt, arg ? arg : "");
    sl_errors_add(c->errs, c->source, c->doc, "", "line %zu column %zu: %s", m->line + 1,
                  m->column + 1, msg);
    c->failed = true;
}

static void anchors_clear(ctx_t *c)
{
    for (size_t i = 0; i < c->nanchors; i++) {
        free(c->anchors[i].name);
        json_decref(c->anchors[i].value);
    }
    c->nanchors = 0;
}

static void stack_clear(ctx_t *c)
{
    while (c->depth > 0) {
        frame_t *f = &c->stack[--c->depth];
        json_decref(f->node);
        free(f->pending_key);
        free(f->anchor);
    }
}

static int anchor_add(ctx_t *c, const char *name, json_t *value, size_t nodes, int height,
                      const yaml_mark_t *m)
{
    if (c->nanchors == SL_YAML_MAX_ANCHORS) {
        yerr(c, m, "more than %s anchors in one document", "10000");
        return -1;
    }
    if (c->nanchors == c->anchors_cap) {
        size_t ncap = c->anchors_cap ? c->anchors_cap * 2 : 16;
        anchor_t *n = realloc(c->anchors, ncap * sizeof(*n));
        if (!n) {
            yerr(c, m, "out of memory%s", NULL);
            return -1;
        }
        c->anchors = n;
        c->anchors_cap = ncap;
    }
    char *dup = strdup(name);
    if (!dup) {
        yerr(c, m, "out of memory%s", NULL);
        return -1;
    }
    anchor_t *a = &c->anchors[c->nanchors++];
    a->name = dup;
    a->value = json_incref(value);
    a->nodes = nodes;
    a->height = height;
    return 0;
}

/* Hands a finished value to its parent (or makes it the document root).
 * Takes the reference to v in every case. */
static int add_value(ctx_t *c, json_t *v, int height, const yaml_mark_t *m)
{
    if (c->depth == 0) {
        c->root = v;
        return 0;
    }
    frame_t *f = &c->stack[c->depth - 1];
    if (f->height < height + 1)
        f->height = height + 1;
    if (json_is_array(f->node)) {
        if (json_array_append_new(f->node, v) != 0) {
            yerr(c, m, "out of memory%s", NULL);
            return -1;
        }
        return 0;
    }
    /* object: the key was taken by the scalar handler */
    char *key = f->pending_key;
    f->pending_key = NULL;
    if (json_object_set_new(f->node, key, v) != 0) {
        free(key);
        yerr(c, m, "out of memory%s", NULL);
        return -1;
    }
    free(key);
    return 0;
}

/* True when the top of the stack is a mapping waiting for a key. */
static bool expecting_key(const ctx_t *c)
{
    if (c->depth == 0)
        return false;
    const frame_t *f = &c->stack[c->depth - 1];
    return json_is_object(f->node) && f->pending_key == NULL;
}

static bool eq_any(const char *s, size_t n, const char *const *list)
{
    for (; *list; list++)
        if (strlen(*list) == n && memcmp(*list, s, n) == 0)
            return true;
    return false;
}

static bool all_in(const char *s, size_t n, const char *set)
{
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!strchr(set, s[i]) || s[i] == '\0')
            return false;
    return true;
}

/* YAML 1.2 core schema float: [-+]? ( \. [0-9]+ | [0-9]+ ( \. [0-9]* )? ) ( [eE] [-+]? [0-9]+ )? */
static bool is_core_float(const char *s, size_t n)
{
    size_t i = 0, digits = 0;
    if (i < n && (s[i] == '+' || s[i] == '-'))
        i++;
    while (i < n && s[i] >= '0' && s[i] <= '9')
        i++, digits++;
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++, digits++;
    }
    if (digits == 0)
        return false;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        size_t ed = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++, ed++;
        if (ed == 0)
            return false;
    }
    return i == n;
}

/* Types a plain scalar. Returns a new value, or NULL with an error added. */
static json_t *plain_scalar(ctx_t *c, const char *s, size_t n, const yaml_mark_t *m)
{
    static const char *const nulls[] = {"", "~", "null", "Null", "NULL", NULL};
    static const char *const trues[] = {"true", "True", "TRUE", NULL};
    static const char *const falses[] = {"false", "False", "FALSE", NULL};
    static const char *const infs[] = {".inf",  ".Inf",  ".INF", "+.inf", "+.Inf", "+.INF", "-.inf",
                                       "-.Inf", "-.INF", ".nan", ".NaN",  ".NAN",  NULL};
    char buf[128];

    if (eq_any(s, n, nulls))
        return json_null();
    if (eq_any(s, n, trues))
        return json_true();
    if (eq_any(s, n, falses))
        return json_false();
    if (eq_any(s, n, infs)) {
        yerr(c, m, "infinite and NaN numbers are not supported%s", NULL);
        return NULL;
    }
    int base = 0;
    const char *digits = s;
    size_t dlen = n;
    bool neg = false;
    if (n > 2 && s[0] == '0' && s[1] == 'x' && all_in(s + 2, n - 2, "0123456789abcdefABCDEF"))
        base = 16, digits = s + 2, dlen = n - 2;
    else if (n > 2 && s[0] == '0' && s[1] == 'o' && all_in(s + 2, n - 2, "01234567"))
        base = 8, digits = s + 2, dlen = n - 2;
    else {
        size_t i = (n > 0 && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
        if (all_in(s + i, n - i, "0123456789")) {
            base = 10;
            neg = s[0] == '-';
            digits = s + i;
            dlen = n - i;
        }
    }
    if (base) {
        if (dlen >= sizeof(buf)) {
            yerr(c, m, "integer out of range%s", NULL);
            return NULL;
        }
        memcpy(buf, digits, dlen);
        buf[dlen] = '\0';
        errno = 0;
        unsigned long long u = strtoull(buf, NULL, base);
        if (errno == ERANGE || (!neg && u > (unsigned long long)LLONG_MAX) ||
            (neg && u > (unsigned long long)LLONG_MAX + 1ULL)) {
            yerr(c, m, "integer out of range%s", NULL);
            return NULL;
        }
        json_int_t v = neg ? (u == (unsigned long long)LLONG_MAX + 1ULL ? (json_int_t)LLONG_MIN
                                                                        : -(json_int_t)u)
                           : (json_int_t)u;
        return json_integer(v);
    }
    if (is_core_float(s, n)) {
        if (n >= sizeof(buf)) {
            yerr(c, m, "number too long%s", NULL);
            return NULL;
        }
        memcpy(buf, s, n);
        buf[n] = '\0';
        double d = strtod(buf, NULL);
        if (!isfinite(d)) {
            yerr(c, m, "number out of range%s", NULL);
            return NULL;
        }
        return json_real(d);
    }
    return json_stringn(s, n);
}

static json_t *scalar_value(ctx_t *c, const yaml_event_t *ev)
{
    const char *s = (const char *)ev->data.scalar.value;
    size_t n = ev->data.scalar.length;
    const char *tag = (const char *)ev->data.scalar.tag;

    if (memchr(s, '\0', n)) {
        yerr(c, &ev->start_mark, "strings must not contain NUL characters%s", NULL);
        return NULL;
    }
    if (tag && strcmp(tag, "!") != 0 && strcmp(tag, YAML_STR_TAG) != 0) {
        /* Explicit core tags re-type the scalar as if it were plain; anything
         * else is an application tag we do not know. */
        if (strcmp(tag, YAML_INT_TAG) == 0 || strcmp(tag, YAML_FLOAT_TAG) == 0 ||
            strcmp(tag, YAML_BOOL_TAG) == 0 || strcmp(tag, YAML_NULL_TAG) == 0) {
            json_t *v = plain_scalar(c, s, n, &ev->start_mark);
            if (!v)
                return NULL;
            bool ok = (strcmp(tag, YAML_INT_TAG) == 0 && json_is_integer(v)) ||
                      (strcmp(tag, YAML_FLOAT_TAG) == 0 && json_is_number(v)) ||
                      (strcmp(tag, YAML_BOOL_TAG) == 0 && json_is_boolean(v)) ||
                      (strcmp(tag, YAML_NULL_TAG) == 0 && json_is_null(v));
            if (!ok) {
                json_decref(v);
                yerr(c, &ev->start_mark, "value does not match its tag %s", tag);
                return NULL;
            }
            return v;
        }
        yerr(c, &ev->start_mark, "unsupported tag '%s'", tag);
        return NULL;
    }
    if (tag || ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return json_stringn(s, n);
    return plain_scalar(c, s, n, &ev->start_mark);
}

static int check_nodes(ctx_t *c, size_t add, const yaml_mark_t *m)
{
    if (add > SL_YAML_MAX_NODES || c->nodes + add > SL_YAML_MAX_NODES) {
        yerr(c, m, "document expands to more than 1000000 nodes (aliases nested too deep?)%s",
             NULL);
        return -1;
    }
    c->nodes += add;
    return 0;
}

static int on_scalar(ctx_t *c, yaml_event_t *ev)
{
    if (c->masked)
        ev->data.scalar.length =
            brace_unmask((char *)ev->data.scalar.value, ev->data.scalar.length);
    if (expecting_key(c)) {
        const char *k = (const char *)ev->data.scalar.value;
        size_t n = ev->data.scalar.length;
        frame_t *f = &c->stack[c->depth - 1];
        if (memchr(k, '\0', n)) {
            yerr(c, &ev->start_mark, "keys must not contain NUL characters%s", NULL);
            return -1;
        }
        if (json_object_get(f->node, k)) {
            yerr(c, &ev->start_mark, "duplicate key '%s'", k);
            return -1;
        }
        if (ev->data.scalar.anchor) {
            yerr(c, &ev->start_mark, "anchors on mapping keys are not supported%s", NULL);
            return -1;
        }
        f->pending_key = strndup(k, n);
        if (!f->pending_key) {
            yerr(c, &ev->start_mark, "out of memory%s", NULL);
            return -1;
        }
        return check_nodes(c, 1, &ev->start_mark);
    }
    if (check_nodes(c, 1, &ev->start_mark) != 0)
        return -1;
    json_t *v = scalar_value(c, ev);
    if (!v) {
        if (!c->failed)
            yerr(c, &ev->start_mark, "out of memory%s", NULL);
        return -1;
    }
    if (ev->data.scalar.anchor &&
        anchor_add(c, (const char *)ev->data.scalar.anchor, v, 1, 0, &ev->start_mark) != 0) {
        json_decref(v);
        return -1;
    }
    return add_value(c, v, 0, &ev->start_mark);
}

static int on_start(ctx_t *c, const yaml_event_t *ev, bool mapping)
{
    const yaml_mark_t *m = &ev->start_mark;
    const char *anchor =
        (const char *)(mapping ? ev->data.mapping_start.anchor : ev->data.sequence_start.anchor);
    const char *tag =
        (const char *)(mapping ? ev->data.mapping_start.tag : ev->data.sequence_start.tag);
    if (expecting_key(c)) {
        yerr(c, m, "mapping keys must be strings, not %s", mapping ? "mappings" : "sequences");
        return -1;
    }
    if (tag && strcmp(tag, mapping ? YAML_MAP_TAG : YAML_SEQ_TAG) != 0 && strcmp(tag, "!") != 0) {
        yerr(c, m, "unsupported tag '%s'", tag);
        return -1;
    }
    if (c->depth == SL_YAML_MAX_DEPTH) {
        yerr(c, m, "nesting deeper than %s levels", "64");
        return -1;
    }
    if (check_nodes(c, 1, m) != 0)
        return -1;
    frame_t *f = &c->stack[c->depth];
    memset(f, 0, sizeof(*f));
    f->node = mapping ? json_object() : json_array();
    if (anchor)
        f->anchor = strdup(anchor);
    if (!f->node || (anchor && !f->anchor)) {
        json_decref(f->node);
        free(f->anchor);
        yerr(c, m, "out of memory%s", NULL);
        return -1;
    }
    f->start_nodes = c->nodes - 1;
    f->height = 1;
    c->depth++;
    return 0;
}

static int on_end(ctx_t *c, const yaml_event_t *ev)
{
    frame_t f = c->stack[--c->depth];
    free(f.pending_key); /* cannot be set: libyaml pairs keys with values */
    if (f.anchor) {
        int rc =
            anchor_add(c, f.anchor, f.node, c->nodes - f.start_nodes, f.height, &ev->start_mark);
        free(f.anchor);
        if (rc != 0) {
            json_decref(f.node);
            return -1;
        }
    }
    return add_value(c, f.node, f.height, &ev->start_mark);
}

static int on_alias(ctx_t *c, const yaml_event_t *ev)
{
    const char *name = (const char *)ev->data.alias.anchor;
    const yaml_mark_t *m = &ev->start_mark;
    if (expecting_key(c)) {
        yerr(c, m, "aliases cannot be mapping keys (*%s)", name);
        return -1;
    }
    for (size_t i = c->nanchors; i-- > 0;) {
        anchor_t *a = &c->anchors[i];
        if (strcmp(a->name, name) != 0)
            continue;
        if (c->depth + a->height > SL_YAML_MAX_DEPTH) {
            yerr(c, m, "alias *%s nests deeper than 64 levels", name);
            return -1;
        }
        if (check_nodes(c, a->nodes, m) != 0)
            return -1;
        json_t *copy = json_deep_copy(a->value);
        if (!copy) {
            yerr(c, m, "out of memory%s", NULL);
            return -1;
        }
        return add_value(c, copy, a->height, m);
    }
    yerr(c, m, "unknown alias *%s", name);
    return -1;
}

json_t *sl_yaml_to_json(const char *text, size_t len, const char *source, sl_errors_t *errs)
{
    yaml_parser_t parser;
    ctx_t c;
    memset(&c, 0, sizeof(c));
    c.source = source ? source : "";
    c.errs = errs;

    json_t *docs = json_array();
    if (!docs) {
        sl_errors_add(errs, c.source, 0, "", "out of memory");
        return NULL;
    }
    if (!yaml_parser_initialize(&parser)) {
        sl_errors_add(errs, c.source, 0, "", "out of memory");
        json_decref(docs);
        return NULL;
    }
    size_t masked_len = 0;
    char *masked = brace_mask(text, len, &masked_len);
    if (masked) {
        c.masked = true;
        text = masked;
        len = masked_len;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);

    bool done = false;
    while (!done && !c.failed) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            char msg[512];
            snprintf(msg, sizeof(msg), "%s%s%s", parser.problem ? parser.problem : "syntax error",
                     parser.context ? " " : "", parser.context ? parser.context : "");
            yaml_mark_t m = parser.problem_mark;
            sl_errors_add(errs, c.source, c.doc ? c.doc : 1, "", "line %zu column %zu: %s",
                          m.line + 1, m.column + 1, msg);
            c.failed = true;
            break;
        }
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            done = true;
            break;
        case YAML_DOCUMENT_START_EVENT:
            c.doc++;
            c.root = NULL;
            break;
        case YAML_DOCUMENT_END_EVENT:
            /* Anchors are scoped to their document. */
            anchors_clear(&c);
            if (json_array_append_new(docs, c.root ? c.root : json_null()) != 0) {
                sl_errors_add(errs, c.source, c.doc, "", "out of memory");
                c.failed = true;
            }
            c.root = NULL;
            break;
        case YAML_SCALAR_EVENT:
            on_scalar(&c, &ev);
            break;
        case YAML_SEQUENCE_START_EVENT:
            on_start(&c, &ev, false);
            break;
        case YAML_MAPPING_START_EVENT:
            on_start(&c, &ev, true);
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            on_end(&c, &ev);
            break;
        case YAML_ALIAS_EVENT:
            on_alias(&c, &ev);
            break;
        default:
            break;
        }
        yaml_event_delete(&ev);
    }

    stack_clear(&c);
    anchors_clear(&c);
    free(c.anchors);
    json_decref(c.root);
    yaml_parser_delete(&parser);
    free(masked);
    if (c.failed) {
        json_decref(docs);
        return NULL;
    }
    return docs;
}
