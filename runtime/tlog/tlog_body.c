/*
 * Bodies in traffic log records: content types, redaction, record strings
 * (tlog_body.h).
 */
#include "tlog_body.h"

#include <stdio.h>
#include <string.h>

int sl_tlog_body_kind(const sl_tlog_policy_t *p, const char *ctype, size_t len)
{
    if (!len || !sl_tlog_content_type_match((const char *const *)p->body_types, p->num_body_types,
                                            ctype, len))
        return SL_TLOG_BODY_SKIP;
    static const char *const json[] = {"application/json", "application/*+json"};
    static const char *const form[] = {"application/x-www-form-urlencoded"};
    if (sl_tlog_content_type_match(json, 2, ctype, len))
        return SL_TLOG_BODY_JSON;
    if (sl_tlog_content_type_match(form, 1, ctype, len))
        return SL_TLOG_BODY_FORM;
    return SL_TLOG_BODY_TEXT;
}

static int name_listed(const char *name, size_t len, char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(names[i]) == len && memcmp(names[i], name, len) == 0)
            return 1;
    return 0;
}

/* ---- JSON ---------------------------------------------------------------
 *
 * A validating scanner (RFC 8259) that copies nothing itself: the output is
 * the input with redacted values cut out, so only the span before a redacted
 * value is copied when one is found, and the rest at the end. */

#define JR_MAX_DEPTH 64
#define JR_KEY_MAX 256

typedef struct {
    const char *p, *end;
    const char *copied; /* input up to here is in out */
    char *o;
    char *const *names;
    size_t num_names;
} jr_t;

static void jr_ws(jr_t *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int hex4(const char *p, unsigned *v)
{
    unsigned x = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        x <<= 4;
        if (c >= '0' && c <= '9')
            x |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            x |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            x |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *v = x;
    return 0;
}

static size_t utf8_put(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* A string at j->p ('"'); its unescaped text into key (when not NULL, up
 * to JR_KEY_MAX bytes; *klen = JR_KEY_MAX + 1 when longer). */
static int jr_string(jr_t *j, char *key, size_t *klen)
{
    size_t k = 0;
    j->p++; /* the quote */
    while (j->p < j->end) {
        unsigned char c = (unsigned char)*j->p;
        if (c == '"') {
            j->p++;
            if (klen)
                *klen = k;
            return 0;
        }
        if (c < 0x20)
            return -1;
        char dec[8];
        size_t dn = 0;
        if (c != '\\') {
            dec[dn++] = (char)c;
            j->p++;
        } else {
            if (j->end - j->p < 2)
                return -1;
            char e = j->p[1];
            j->p += 2;
            switch (e) {
            case '"':
            case '\\':
            case '/':
                dec[dn++] = e;
                break;
            case 'b':
                dec[dn++] = '\b';
                break;
            case 'f':
                dec[dn++] = '\f';
                break;
            case 'n':
                dec[dn++] = '\n';
                break;
            case 'r':
                dec[dn++] = '\r';
                break;
            case 't':
                dec[dn++] = '\t';
                break;
            case 'u': {
                unsigned cp, lo;
                if (j->end - j->p < 4 || hex4(j->p, &cp) != 0)
                    return -1;
                j->p += 4;
                if (cp >= 0xd800 && cp < 0xdc00 && j->end - j->p >= 6 && j->p[0] == '\\' &&
                    j->p[1] == 'u' && hex4(j->p + 2, &lo) == 0 && lo >= 0xdc00 && lo < 0xe000) {
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    j->p += 6;
                }
                dn = utf8_put(dec, cp);
                break;
            }
            default:
                return -1;
            }
        }
        if (key) {
            if (k + dn <= JR_KEY_MAX)
                memcpy(key + k, dec, dn);
            k = k + dn <= JR_KEY_MAX ? k + dn : JR_KEY_MAX + 1;
        }
    }
    return -1; /* cut short */
}

static int jr_digits(jr_t *j)
{
    const char *s = j->p;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
        j->p++;
    return j->p > s ? 0 : -1;
}

static int jr_number(jr_t *j)
{
    if (*j->p == '-')
        j->p++;
    if (j->p < j->end && *j->p == '0')
        j->p++;
    else if (jr_digits(j) != 0)
        return -1;
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        if (jr_digits(j) != 0)
            return -1;
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
            j->p++;
        if (jr_digits(j) != 0)
            return -1;
    }
    /* A number that ends the input may have been cut short: the caller's
     * check that the text is complete (a value at the top level is followed
     * by the end) cannot tell, so a bare top-level number is taken as is. */
    return 0;
}

static int jr_literal(jr_t *j, const char *lit, size_t n)
{
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n) != 0)
        return -1;
    j->p += n;
    return 0;
}

static int jr_value(jr_t *j, int depth);

static int jr_object(jr_t *j, int depth)
{
    j->p++; /* '{' */
    jr_ws(j);
    if (j->p < j->end && *j->p == '}') {
        j->p++;
        return 0;
    }
    for (;;) {
        jr_ws(j);
        if (j->p >= j->end || *j->p != '"')
            return -1;
        char key[JR_KEY_MAX];
        size_t klen = 0;
        if (jr_string(j, key, &klen) != 0)
            return -1;
        jr_ws(j);
        if (j->p >= j->end || *j->p != ':')
            return -1;
        j->p++;
        jr_ws(j);
        const char *vstart = j->p;
        if (jr_value(j, depth + 1) != 0)
            return -1;
        if (klen <= JR_KEY_MAX && name_listed(key, klen, j->names, j->num_names)) {
            size_t n = (size_t)(vstart - j->copied);
            memcpy(j->o, j->copied, n);
            j->o += n;
            memcpy(j->o, "\"[redacted]\"", 12);
            j->o += 12;
            j->copied = j->p;
        }
        jr_ws(j);
        if (j->p >= j->end)
            return -1;
        if (*j->p == '}') {
            j->p++;
            return 0;
        }
        if (*j->p != ',')
            return -1;
        j->p++;
    }
}

static int jr_array(jr_t *j, int depth)
{
    j->p++; /* '[' */
    jr_ws(j);
    if (j->p < j->end && *j->p == ']') {
        j->p++;
        return 0;
    }
    for (;;) {
        jr_ws(j);
        if (jr_value(j, depth + 1) != 0)
            return -1;
        jr_ws(j);
        if (j->p >= j->end)
            return -1;
        if (*j->p == ']') {
            j->p++;
            return 0;
        }
        if (*j->p != ',')
            return -1;
        j->p++;
    }
}

static int jr_value(jr_t *j, int depth)
{
    if (depth > JR_MAX_DEPTH || j->p >= j->end)
        return -1;
    switch (*j->p) {
    case '{':
        return jr_object(j, depth);
    case '[':
        return jr_array(j, depth);
    case '"':
        return jr_string(j, NULL, NULL);
    case 't':
        return jr_literal(j, "true", 4);
    case 'f':
        return jr_literal(j, "false", 5);
    case 'n':
        return jr_literal(j, "null", 4);
    default:
        if (*j->p == '-' || (*j->p >= '0' && *j->p <= '9'))
            return jr_number(j);
        return -1;
    }
}

ssize_t sl_tlog_redact_json(const char *in, size_t n, char *const *names, size_t num_names,
                            char *out)
{
    jr_t j = {in, in + n, in, out, names, num_names};
    jr_ws(&j);
    if (jr_value(&j, 0) != 0)
        return -1;
    jr_ws(&j);
    if (j.p != j.end)
        return -1;
    size_t rest = (size_t)(j.end - j.copied);
    memcpy(j.o, j.copied, rest);
    j.o += rest;
    return (ssize_t)(j.o - out);
}

/* ---- forms ---------------------------------------------------------------- */

static int unhex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

size_t sl_tlog_redact_form(const char *in, size_t n, char *const *names, size_t num_names,
                           char *out)
{
    char *o = out;
    size_t i = 0;
    while (i < n) {
        size_t start = i;
        while (i < n && in[i] != '&' && in[i] != '=')
            i++;
        /* The name, decoded ('+' is a space, %XX a byte). */
        char name[JR_KEY_MAX];
        size_t nl = 0;
        for (size_t k = start; k < i; k++) {
            char c = in[k];
            if (c == '+') {
                c = ' ';
            } else if (c == '%' && k + 2 < i && unhex(in[k + 1]) >= 0 && unhex(in[k + 2]) >= 0) {
                c = (char)(unhex(in[k + 1]) * 16 + unhex(in[k + 2]));
                k += 2;
            }
            if (nl < JR_KEY_MAX)
                name[nl] = c;
            nl++;
        }
        memcpy(o, in + start, i - start);
        o += i - start;
        if (i < n && in[i] == '=') {
            size_t vstart = ++i;
            while (i < n && in[i] != '&')
                i++;
            *o++ = '=';
            if (nl <= JR_KEY_MAX && name_listed(name, nl, names, num_names)) {
                memcpy(o, "[redacted]", 10);
                o += 10;
            } else {
                memcpy(o, in + vstart, i - vstart);
                o += i - vstart;
            }
        }
        if (i < n) { /* '&' */
            *o++ = '&';
            i++;
        }
    }
    return (size_t)(o - out);
}

/* ---- the record's strings ------------------------------------------------- */

static const char hexd[] = "0123456789abcdef";

size_t sl_tlog_body_strings(const sl_tlog_policy_t *p, const sl_tlog_body_t *b, char *meta,
                            sl_str_t *text, char *scratch)
{
    char *o = meta;
    *text = (sl_str_t){"", 0};
    if (b->ctype.len) {
        size_t n = b->ctype.len < SL_TLOG_BODY_TYPE_MAX ? b->ctype.len : SL_TLOG_BODY_TYPE_MAX;
        memcpy(o, "\"content_type\":\"", 16);
        o += 16;
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)b->ctype.ptr[i];
            if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
                *o++ = (char)c;
            } else {
                char esc[6] = {'\\', 'u', '0', '0', hexd[c >> 4], hexd[c & 15]};
                memcpy(o, esc, 6);
                o += 6;
            }
        }
        memcpy(o, "\",", 2);
        o += 2;
    }
    o += snprintf(o, 32, "\"size\":%llu", (unsigned long long)b->size);
    if (b->size > b->len)
        o += snprintf(o, 40, ",\"_truncated\":%llu", (unsigned long long)(b->size - b->len));
    const char *omitted = NULL;
    if (b->kind == SL_TLOG_BODY_SKIP) {
        omitted = "content type not logged";
    } else if (b->len && p->num_body_redact && b->kind == SL_TLOG_BODY_JSON) {
        /* A cut JSON text never parses, but a cut top-level number or
         * literal would: anything cut is refused here. */
        if (b->size > b->len) {
            omitted = "truncated JSON cannot be redacted";
        } else {
            ssize_t r =
                sl_tlog_redact_json(b->data, b->len, p->body_redact, p->num_body_redact, scratch);
            if (r < 0)
                omitted = "invalid JSON cannot be redacted";
            else
                *text = (sl_str_t){scratch, (size_t)r};
        }
    } else if (b->len && p->num_body_redact && b->kind == SL_TLOG_BODY_FORM) {
        *text = (sl_str_t){scratch, sl_tlog_redact_form(b->data, b->len, p->body_redact,
                                                        p->num_body_redact, scratch)};
    } else {
        *text = (sl_str_t){b->data ? b->data : "", b->len};
    }
    if (omitted)
        o += snprintf(o, 64, ",\"_omitted\":\"%s\"", omitted);
    return (size_t)(o - meta);
}
