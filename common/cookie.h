/* One Cookie header's value (RFC 6265 § 5.4: "a=1; b=2"), searched by
 * name: for the routing rules' cookie conditions and the jwt policy's
 * token cookie, so both read cookies the same way. */
#ifndef SL_COOKIE_H
#define SL_COOKIE_H

#include "sl_types.h"

#include <stddef.h>

/* 1 with *out pointing into value (trailing spaces and one pair of double
 * quotes removed) when a cookie named exactly `name` is there, else 0. */
int sl_cookie_find(const char *value, size_t len, const char *name, size_t name_len,
                   sl_str_t *out);

#endif
