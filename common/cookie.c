/* Cookie lookup (cookie.h). */
#include "cookie.h"

#include <string.h>

int sl_cookie_find(const char *value, size_t len, const char *name, size_t name_len, sl_str_t *out)
{
    const char *p = value, *end = value + len;
    while (p < end) {
        while (p < end && (*p == ' ' || *p == ';'))
            p++;
        const char *semi = memchr(p, ';', (size_t)(end - p));
        const char *pe = semi ? semi : end;
        const char *eq = memchr(p, '=', (size_t)(pe - p));
        if (eq && (size_t)(eq - p) == name_len && memcmp(p, name, name_len) == 0) {
            const char *vs = eq + 1, *ve = pe;
            while (ve > vs && ve[-1] == ' ')
                ve--;
            if (ve - vs >= 2 && *vs == '"' && ve[-1] == '"')
                vs++, ve--;
            *out = (sl_str_t){vs, (size_t)(ve - vs)};
            return 1;
        }
        p = pe;
    }
    return 0;
}
