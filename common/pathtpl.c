/*
 * Path template syntax check. Matching lives in the router, which compiles
 * templates into its segment trie; this file only says whether a template is
 * well formed, with a message that names the problem.
 */
#include "pathtpl.h"

#include <stdio.h>
#include <string.h>

static int is_pchar(unsigned char c)
{
    /* RFC 3986 pchar minus '%'-decoding: unreserved / sub-delims / ':' / '@' / '%' */
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return 1;
    return strchr("-._~!$&'()*+,;=:@%", c) != NULL && c != '\0';
}

static int is_name_char(unsigned char c, int first)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_')
        return 1;
    return !first && ((c >= '0' && c <= '9') || c == '-');
}

int sl_pathtpl_check(const char *tpl, char *err, size_t errlen)
{
    const char *names[64];
    size_t name_lens[64];
    int nnames = 0;

    if (tpl[0] != '/') {
        snprintf(err, errlen, "must start with '/'");
        return -1;
    }
    const char *p = tpl + 1;
    while (*p) {
        const char *seg = p;
        const char *end = strchr(p, '/');
        if (!end)
            end = p + strlen(p);
        size_t seglen = (size_t)(end - seg);
        const char *open = memchr(seg, '{', seglen);
        const char *close = memchr(seg, '}', seglen);
        if (open || close) {
            if (!open || !close || close < open) {
                snprintf(err, errlen, "unbalanced '%c'", open ? '{' : '}');
                return -1;
            }
            if (open != seg || close != end - 1) {
                snprintf(err, errlen,
                         "parameter must be a whole segment, like /{id}, not '%.*s'",
                         (int)seglen, seg);
                return -1;
            }
            const char *name = seg + 1;
            size_t nlen = seglen - 2;
            if (nlen == 0) {
                snprintf(err, errlen, "empty parameter name '{}'");
                return -1;
            }
            for (size_t i = 0; i < nlen; i++) {
                if (name[i] == '{' || name[i] == '}') {
                    snprintf(err, errlen, "unbalanced '%c'", name[i]);
                    return -1;
                }
                if (!is_name_char((unsigned char)name[i], i == 0)) {
                    snprintf(err, errlen,
                             "parameter name '%.*s' must match [A-Za-z_][A-Za-z0-9_-]*",
                             (int)nlen, name);
                    return -1;
                }
            }
            for (int i = 0; i < nnames; i++) {
                if (name_lens[i] == nlen && memcmp(names[i], name, nlen) == 0) {
                    snprintf(err, errlen, "parameter '%.*s' appears twice", (int)nlen, name);
                    return -1;
                }
            }
            if (nnames == 64) {
                snprintf(err, errlen, "more than 64 parameters");
                return -1;
            }
            names[nnames] = name;
            name_lens[nnames++] = nlen;
        } else {
            if (seglen == 0 && *end == '/') {
                snprintf(err, errlen, "empty segment '//'");
                return -1;
            }
            for (size_t i = 0; i < seglen; i++) {
                if (!is_pchar((unsigned char)seg[i])) {
                    snprintf(err, errlen, "character '%c' is not allowed in a path",
                             seg[i]);
                    return -1;
                }
            }
        }
        p = *end ? end + 1 : end;
    }
    return 0;
}

int sl_pathtpl_param_count(const char *tpl)
{
    int n = 0;
    for (const char *p = tpl; *p; p++)
        n += *p == '{';
    return n;
}
