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
 * The reader is no more lenient than kubectl's (sigs.k8s.io/yaml, go-yaml v2,
 * itself a port of libyaml): a '{' in a plain value of a flow mapping is a
 * syntax error for both, reported with the value to quote; and where kubectl
 * types a scalar by YAML 1.1 and a YAML 1.2 parser would read another value,
 * the scalar is refused with the spelling every client reads alike (see
 * "where kubectl's reader and YAML 1.2 part ways" below).
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
} ctx_t;

static void yerr(ctx_t *c, const yaml_mark_t *m, const char *fmt, const char *arg)
{
    char msg[512];
    snprintf(msg, sizeof(msg), fmt, arg ? arg : "");
    sl_errors_add(c->errs, c->source, c->doc, "", "line %zu column %zu: %s", m->line + 1,
                  m->column + 1, msg);
    c->failed = true;
}

/* ---- where kubectl's reader and YAML 1.2 part ways ----------------------
 *
 * kubectl reads YAML with sigs.k8s.io/yaml, a go-yaml v2 port of libyaml's
 * scanner with YAML 1.1 typing: `yes`/`on`/`y` are true, `017` is octal,
 * `1_000` and `0b101` are numbers, and a key `on` becomes the JSON key
 * "true". A strict YAML 1.2 parser reads each of those differently. A file
 * must mean one thing to every client (curl to the REST API, kubectl, a
 * static file), so a plain scalar the two families read differently is
 * refused with the spelling that means the same everywhere; the rest is read
 * by the YAML 1.2 core schema, which on those scalars agrees with kubectl.
 * (Measured with `kubectl annotate --local -f FILE k=v -o json`, which prints
 * what kubectl read without a cluster.) */

static bool str_is(const char *s, size_t n, const char *lit)
{
    return strlen(lit) == n && memcmp(s, lit, n) == 0;
}

/* When kubectl reads plain scalar s as a boolean that YAML 1.2 reads as a
 * string, returns that boolean's text ("true"/"false"); else NULL. */
static const char *yaml11_bool(const char *s, size_t n)
{
    static const char *const t[] = {"y", "Y", "yes", "Yes", "YES", "on", "On", "ON", NULL};
    static const char *const f[] = {"n", "N", "no", "No", "NO", "off", "Off", "OFF", NULL};
    for (int i = 0; t[i]; i++)
        if (str_is(s, n, t[i]))
            return "true";
    for (int i = 0; f[i]; i++)
        if (str_is(s, n, f[i]))
            return "false";
    return NULL;
}

/* Whether Go's strconv.ParseInt(s, 0, 64) takes s (no sign: the caller
 * skipped it): decimal, 0x/0X hex, 0o/0O or leading-0 octal, 0b/0B binary. */
static bool go_int(const char *s, size_t n)
{
    const char *set = "0123456789";
    size_t i = 0;
    if (n > 2 && s[0] == '0' && strchr("xXoObB", s[1])) {
        set = strchr("xX", s[1]) ? "0123456789abcdefABCDEF" : strchr("oO", s[1]) ? "01234567" : "01";
        i = 2;
    } else if (n > 1 && s[0] == '0') {
        set = "01234567";
        i = 1;
    }
    if (i >= n)
        return false;
    for (; i < n; i++)
        if (!strchr(set, s[i]))
            return false;
    return true;
}

/* Whether s matches go-yaml's float form [0-9]+(.[0-9]*)?|.[0-9]+ with an
 * optional exponent [eE][-+]?[0-9]+ (no sign: the caller skipped it). */
static bool go_float(const char *s, size_t n)
{
    size_t i = 0, int_digits = 0, frac_digits = 0;
    while (i < n && s[i] >= '0' && s[i] <= '9')
        i++, int_digits++;
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++, frac_digits++;
        if (!int_digits && !frac_digits)
            return false;
    } else if (!int_digits) {
        return false;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        size_t e = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++, e++;
        if (!e)
            return false;
    }
    return i == n;
}

/* True when kubectl reads plain scalar s as a number and YAML 1.2 reads it
 * as a string or as another number: digits grouped with '_', binary, a sign
 * or an upper-case letter before a 0x/0o/0b prefix, a leading-zero octal
 * whose value differs from the decimal reading. */
static bool yaml11_number_differs(const char *s, size_t n)
{
    size_t i = (n > 0 && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
    bool sign = i == 1;
    if (i >= n || !((s[i] >= '0' && s[i] <= '9') || s[i] == '.'))
        return false;
    if (memchr(s, '_', n)) {
        /* go-yaml drops every '_' and then reads a number if strconv takes
         * what is left (an integer with an optional 0x/0o/0b prefix or a
         * leading-0 octal, or a float like 1.5e3); YAML 1.2 reads any '_'
         * as a string. Anything else stays a string for both. */
        char buf[64];
        size_t k = 0;
        for (size_t j = i; j < n; j++)
            if (s[j] != '_') {
                if (k + 1 >= sizeof(buf))
                    return false;
                buf[k++] = s[j];
            }
        buf[k] = '\0';
        return k > 0 && (go_int(buf, k) || go_float(buf, k));
    }
    if (n - i > 2 && s[i] == '0' && strchr("xXoObB", s[i + 1])) {
        const char *set = strchr("xX", s[i + 1])   ? "0123456789abcdefABCDEF"
                          : strchr("oO", s[i + 1]) ? "01234567"
                                                   : "01";
        for (size_t j = i + 2; j < n; j++)
            if (!strchr(set, s[j]))
                return false;
        return sign || s[i + 1] == 'X' || s[i + 1] == 'O' || s[i + 1] == 'b' || s[i + 1] == 'B';
    }
    if (n - i > 1 && s[i] == '0') {
        for (size_t j = i + 1; j < n; j++)
            if (s[j] < '0' || s[j] > '7')
                return false; /* 08, 0.5, 019, 0123abc: the same for both */
        if (n - i > 20)
            return true; /* octal digits past 64 bits: not the decimal reading */
        unsigned long long oct = 0, dec = 0;
        for (size_t j = i + 1; j < n; j++) {
            oct = oct * 8 + (unsigned)(s[j] - '0');
            dec = dec * 10 + (unsigned)(s[j] - '0');
        }
        return oct != dec;
    }
    return false;
}

/* Appends s as a double-quoted YAML string to out. */
static void quote_into(char *out, size_t outsz, const char *s, size_t n)
{
    size_t o = strlen(out);
    if (o + 1 < outsz)
        out[o++] = '"';
    for (size_t i = 0; i < n && o + 3 < outsz; i++) {
        if (s[i] == '"' || s[i] == '\\')
            out[o++] = '\\';
        out[o++] = s[i];
    }
    if (o + 1 < outsz)
        out[o++] = '"';
    out[o] = '\0';
}

/* A plain untagged scalar kubectl reads differently from YAML 1.2: adds the
 * error with the spelling to use and returns true. */
static bool refuse_ambiguous(ctx_t *c, const char *s, size_t n, bool key, const yaml_mark_t *m)
{
    char msg[400];
    const char *b = yaml11_bool(s, n);
    int w = n > 100 ? 100 : (int)n;
    if (b && key)
        snprintf(msg, sizeof(msg),
                 "the key %.*s is the key \"%s\" for kubectl (YAML 1.1): quote it: ", w, s, b);
    else if (b)
        snprintf(
            msg, sizeof(msg),
            "%.*s is the boolean %s for kubectl (YAML 1.1) but a string in YAML 1.2: write %s, "
            "or quote it for the string: ",
            w, s, b, b);
    else if (yaml11_number_differs(s, n))
        snprintf(msg, sizeof(msg),
                 "%.*s is a different number for kubectl (YAML 1.1: '_' ignored, 0b binary, a "
                 "leading 0 octal) than for YAML 1.2: write a plain decimal (or 0x/0o) number, or "
                 "quote it for the string: ",
                 w, s);
    else
        return false;
    quote_into(msg, sizeof(msg), s, n);
    yerr(c, m, "%s", msg);
    return true;
}

/* ---- the one syntax error worth a hint -----------------------------------
 *
 * `{method: GET, path: /pets/{id}}`: inside a flow collection a plain scalar
 * may not hold '{', '}', '[', ']' or ',' (YAML 1.2 ns-plain-safe-in), so the
 * '{' opens a mapping where a ',' or '}' must come. libyaml, go-yaml (kubectl)
 * and every strict parser refuse it; this finds the value in the lines the
 * parser looked at, to say which value to quote. */

static bool plain_char(unsigned char ch)
{
    return ch > ' ' && !strchr(",[]{}:\"'#", ch);
}

/* Fills msg and *line (0-based) when text[from_line..to_line] holds a flow
 * bracket glued to a plain value inside a flow collection. */
static bool flow_bracket_hint(const char *text, size_t len, size_t from_line, size_t to_line,
                              char *msg, size_t msgsz, size_t *line)
{
    size_t i = 0, l = 0;
    while (i < len && l < from_line)
        if (text[i++] == '\n')
            l++;
    char openers[SL_YAML_MAX_DEPTH];
    int depth = 0;
    for (; i < len && l <= to_line; i++) {
        char ch = text[i];
        if (ch == '\n') {
            l++;
            continue;
        }
        if (ch == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t')) {
            while (i + 1 < len && text[i + 1] != '\n')
                i++;
            continue;
        }
        if ((ch == '"' || ch == '\'') && (i == 0 || !plain_char((unsigned char)text[i - 1]))) {
            for (i++; i < len && text[i] != ch; i++)
                if (ch == '"' && text[i] == '\\')
                    i++;
                else if (text[i] == '\n')
                    l++;
            continue;
        }
        if ((ch == '{' || ch == '[') && depth > 0 && i > 0 &&
            plain_char((unsigned char)text[i - 1])) {
            size_t start = i, end = i;
            while (start > 0 && plain_char((unsigned char)text[start - 1]))
                start--;
            int inner = 0;
            for (; end < len && text[end] > ' ' && text[end] != ','; end++) {
                if (text[end] == '{' || text[end] == '[')
                    inner++;
                else if (text[end] == '}' || text[end] == ']') {
                    if (inner == 0)
                        break;
                    inner--;
                }
            }
            snprintf(msg, msgsz, "a '%s' inside a plain value in a flow %s: quote the value: ",
                     ch == '{' ? "{' or '}" : "[' or ']",
                     openers[depth - 1] == '{' ? "mapping" : "sequence");
            quote_into(msg, msgsz, text + start, end - start);
            *line = l;
            return true;
        }
        if (ch == '{' || ch == '[') {
            if (depth < SL_YAML_MAX_DEPTH)
                openers[depth++] = ch;
        } else if ((ch == '}' || ch == ']') && depth > 0) {
            depth--;
        }
    }
    return false;
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
    if (refuse_ambiguous(c, s, n, false, &ev->start_mark))
        return NULL;
    return plain_scalar(c, s, n, &ev->start_mark);
}

/* A plain key is a string to YAML 1.2 readers only if it does not look
 * like another type; kubectl turns a key that does into that value's JSON
 * text (`True:` -> "true", `0x1F:` -> "31", `~:` -> "null", `<<:` merges).
 * Keys kubectl would rename are refused. */
static int check_plain_key(ctx_t *c, const char *k, size_t n, const yaml_mark_t *m)
{
    if (str_is(k, n, "<<")) {
        yerr(c, m, "merge keys (<<) are not supported: write the keys out, or quote it: \"<<\"%s",
             NULL);
        return -1;
    }
    if (refuse_ambiguous(c, k, n, true, m))
        return -1;
    /* Typed as a value would be, errors (an out-of-range number) aside. */
    sl_errors_t scratch, *saved = c->errs;
    bool failed = c->failed;
    sl_errors_init(&scratch);
    c->errs = &scratch;
    json_t *v = plain_scalar(c, k, n, m);
    c->errs = saved;
    c->failed = failed;
    sl_errors_free(&scratch);
    char canon[64] = "";
    bool renamed = false;
    if (json_is_real(v))
        renamed = true;
    else if (json_is_boolean(v))
        snprintf(canon, sizeof(canon), "%s", json_is_true(v) ? "true" : "false");
    else if (json_is_integer(v))
        snprintf(canon, sizeof(canon), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    bool null_key = json_is_null(v);
    if (canon[0] && !str_is(k, n, canon))
        renamed = true;
    json_decref(v);
    if (!renamed && !null_key)
        return 0;
    char msg[300] = "";
    int w = n > 100 ? 100 : (int)n;
    if (null_key)
        snprintf(msg, sizeof(msg), "the key %.*s is null, which kubectl refuses: quote it: ", w, k);
    else
        snprintf(msg, sizeof(msg),
                 "the key %.*s is not a string: kubectl names it%s%s, quote it: ", w, k,
                 canon[0] ? " " : " by its number", canon);
    quote_into(msg, sizeof(msg), k, n);
    yerr(c, m, "%s", msg);
    return -1;
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
        if (ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && !ev->data.scalar.tag &&
            check_plain_key(c, k, n, &ev->start_mark) != 0)
            return -1;
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
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);

    bool done = false;
    while (!done && !c.failed) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            char msg[512];
            yaml_mark_t m = parser.problem_mark;
            size_t from = parser.context ? parser.context_mark.line : m.line;
            size_t hint_line;
            if (flow_bracket_hint(text, len, from < m.line ? from : m.line, m.line, msg,
                                  sizeof(msg), &hint_line)) {
                sl_errors_add(errs, c.source, c.doc ? c.doc : 1, "", "line %zu: %s", hint_line + 1,
                              msg);
            } else {
                snprintf(msg, sizeof(msg), "%s%s%s",
                         parser.problem ? parser.problem : "syntax error",
                         parser.context ? " " : "", parser.context ? parser.context : "");
                sl_errors_add(errs, c.source, c.doc ? c.doc : 1, "", "line %zu column %zu: %s",
                              m.line + 1, m.column + 1, msg);
            }
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
    if (c.failed) {
        json_decref(docs);
        return NULL;
    }
    return docs;
}

/* ---- JSON -> YAML (sl_yaml_dump) ------------------------------------------ */

typedef struct {
    char *buf;
    size_t len, cap;
    bool oom;
} outbuf_t;

static int out_write(void *data, unsigned char *bytes, size_t size)
{
    outbuf_t *o = data;
    if (o->len + size + 1 > o->cap) {
        size_t ncap = (o->len + size + 1) * 2;
        char *n = realloc(o->buf, ncap);
        if (!n) {
            o->oom = true;
            return 0;
        }
        o->buf = n;
        o->cap = ncap;
    }
    memcpy(o->buf + o->len, bytes, size);
    o->len += size;
    o->buf[o->len] = '\0';
    return 1;
}

/* True when s, written plain, reads back as the string s for this reader
 * and for kubectl: not a null, boolean or number in either YAML 1.1 or 1.2. */
static bool plain_reads_as_string(const char *s, size_t n)
{
    if (n == 0 || yaml11_bool(s, n) || yaml11_number_differs(s, n) || str_is(s, n, "<<"))
        return false;
    ctx_t probe;
    memset(&probe, 0, sizeof(probe));
    sl_errors_t scratch;
    sl_errors_init(&scratch);
    probe.errs = &scratch;
    json_t *v = plain_scalar(&probe, s, n, &(yaml_mark_t){0, 0, 0});
    bool ok = v && json_is_string(v) && !probe.failed;
    json_decref(v);
    sl_errors_free(&scratch);
    return ok &&
           !(eq_any(s, n,
                    (const char *const[]){".inf", ".nan", ".NaN", ".Inf", ".INF", ".NAN", NULL}));
}

static int emit_scalar(yaml_emitter_t *e, const char *s, size_t n, bool plain_ok)
{
    yaml_event_t ev;
    if (!yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)s, (int)n, plain_ok, 1,
                                      plain_ok ? YAML_ANY_SCALAR_STYLE
                                               : YAML_DOUBLE_QUOTED_SCALAR_STYLE))
        return -1;
    return yaml_emitter_emit(e, &ev) ? 0 : -1;
}

static int emit_value(yaml_emitter_t *e, json_t *v)
{
    yaml_event_t ev;
    char num[64];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        if (!yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE) ||
            !yaml_emitter_emit(e, &ev))
            return -1;
        const char *k;
        json_t *child;
        json_object_foreach(v, k, child)
        {
            if (emit_scalar(e, k, strlen(k), plain_reads_as_string(k, strlen(k))) != 0 ||
                emit_value(e, child) != 0)
                return -1;
        }
        if (!yaml_mapping_end_event_initialize(&ev) || !yaml_emitter_emit(e, &ev))
            return -1;
        return 0;
    }
    case JSON_ARRAY: {
        if (!yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_SEQUENCE_STYLE) ||
            !yaml_emitter_emit(e, &ev))
            return -1;
        size_t i;
        json_t *child;
        json_array_foreach(v, i, child)
        {
            if (emit_value(e, child) != 0)
                return -1;
        }
        if (!yaml_sequence_end_event_initialize(&ev) || !yaml_emitter_emit(e, &ev))
            return -1;
        return 0;
    }
    case JSON_STRING: {
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        return emit_scalar(e, s, n, plain_reads_as_string(s, n));
    }
    case JSON_INTEGER:
        snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return emit_scalar(e, num, strlen(num), true);
    case JSON_REAL:
        snprintf(num, sizeof(num), "%.17g", json_real_value(v));
        if (!strpbrk(num, ".e"))
            strcat(num, ".0");
        return emit_scalar(e, num, strlen(num), true);
    case JSON_TRUE:
        return emit_scalar(e, "true", 4, true);
    case JSON_FALSE:
        return emit_scalar(e, "false", 5, true);
    default:
        return emit_scalar(e, "null", 4, true);
    }
}

char *sl_yaml_dump(json_t *docs)
{
    yaml_emitter_t e;
    outbuf_t o = {0};
    yaml_event_t ev;
    if (!yaml_emitter_initialize(&e))
        return NULL;
    yaml_emitter_set_output(&e, out_write, &o);
    yaml_emitter_set_unicode(&e, 1);
    yaml_emitter_set_width(&e, 100);
    bool ok =
        yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING) && yaml_emitter_emit(&e, &ev);
    size_t i;
    json_t *doc;
    json_array_foreach(docs, i, doc)
    {
        ok = ok && yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, i == 0) &&
             yaml_emitter_emit(&e, &ev);
        ok = ok && emit_value(&e, doc) == 0;
        ok = ok && yaml_document_end_event_initialize(&ev, 1) && yaml_emitter_emit(&e, &ev);
    }
    ok = ok && yaml_stream_end_event_initialize(&ev) && yaml_emitter_emit(&e, &ev) &&
         yaml_emitter_flush(&e);
    yaml_emitter_delete(&e);
    if (!ok || o.oom) {
        free(o.buf);
        return NULL;
    }
    return o.buf;
}
