/*
 * Path templates of Api operations: "/pets/{id}/photos". A segment is either
 * literal text or a whole "{name}" parameter that matches one non-empty path
 * segment. Shared by validation (common/validate.c) and the router.
 */
#ifndef SL_PATHTPL_H
#define SL_PATHTPL_H

#include <stddef.h>

/* Checks a template. Returns 0, or -1 with a message such as
 * "unbalanced '{'" or "parameter 'id' appears twice" written to err. */
int sl_pathtpl_check(const char *tpl, char *err, size_t errlen);

/* Number of '{param}' segments in a valid template. */
int sl_pathtpl_param_count(const char *tpl);

#endif
