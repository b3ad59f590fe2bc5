/*
 * JSON Schema (draft 2020-12), the part the json-schema policy offers
 * (docs/policies/json-schema.md): a schema document compiled once into an
 * immutable tree, then evaluated on parsed JSON values by any number of
 * threads at once.
 *
 * Not here: reading or parsing request bodies, content types, replies
 * (json_schema.c).
 */
#ifndef SL_JSCHEMA_H
#define SL_JSCHEMA_H

#include "validate.h"

#include <jansson.h>

typedef struct sl_jschema sl_jschema_t;

/*
 * Compiles the schema document `schema` (an object or a boolean). Every
 * problem is reported to c at its keyword's path below c's current path
 * (".properties.name.type"): unknown or unsupported keywords, wrong values,
 * patterns that do not compile, a $ref that is not "#" or a JSON pointer
 * "#/..." to a schema of this document, $ref cycles that would never end.
 * Returns NULL when anything was reported. The result keeps a copy of
 * the document; `schema` stays the caller's.
 */
sl_jschema_t *sl_jschema_compile(sl_vctx_t *c, json_t *schema);
void sl_jschema_free(sl_jschema_t *s);

/* The first failure found: where in the value (a JSON pointer, "" for the
 * value itself; cut at the front with "..." when longer than the buffer),
 * which keyword, and why. */
typedef struct {
    char pointer[256];
    const char *keyword; /* static */
    char message[160];
} sl_jschema_error_t;

/* 1 when `value` is valid against s, else 0 with *err filled. */
int sl_jschema_validate(const sl_jschema_t *s, json_t *value, sl_jschema_error_t *err);

#endif
