/*
 * Internals of validation shared by validate.c (the walker, metadata and
 * generic field checks) and the per-kind spec schemas (validate_spec.c).
 * Not a public interface: the controller and runtime use model.h.
 *
 * A schema is a static table of fields; the walker reports unknown fields
 * (with a "did you mean" suggestion), missing required ones and wrong types,
 * and builds the field path ("spec.operations[1].path") as it descends, so a
 * check function only says what is wrong with the value in front of it.
 */
#ifndef SL_VALIDATE_H
#define SL_VALIDATE_H

#include "model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SL_VALIDATE_PATH_MAX 512
/* Longest string sl_vcheck_string accepts. */
#define SL_VALIDATE_STRING_MAX 4096

typedef struct {
    sl_errors_t *errs;
    const char *source;
    int doc;
    char path[SL_VALIDATE_PATH_MAX];
    size_t len;
    size_t nerr; /* errors added by this validation */
} sl_vctx_t;

typedef void (*sl_vcheck_fn)(sl_vctx_t *c, json_t *v, const void *arg);

#define SL_VFIELD_REQUIRED 1u
/* The value is a credential (a shared secret, a password): shown nowhere
 * the config is echoed for reading (the runtime's /config_dump), see
 * sl_validate_redact. */
#define SL_VFIELD_SECRET 2u

typedef struct {
    const char *name;
    sl_vcheck_fn check;
    const void *arg;
    unsigned flags;
} sl_vfield_t;

typedef struct {
    const sl_vfield_t *fields; /* terminated by a {NULL} entry */
    /* Rules across fields, run only when the fields themselves were valid. */
    void (*extra)(sl_vctx_t *c, json_t *obj);
} sl_vschema_t;

typedef struct {
    int64_t min, max;
} sl_vrange_t;

typedef struct {
    sl_vcheck_fn check;
    const void *arg;
    size_t min_items, max_items;
} sl_varray_t;

/* Reports an error at the current path. */
void sl_validate_error(sl_vctx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Path stack: returns the length to restore with sl_validate_pop. */
size_t sl_validate_push_key(sl_vctx_t *c, const char *key);
size_t sl_validate_push_index(sl_vctx_t *c, size_t i);
void sl_validate_pop(sl_vctx_t *c, size_t saved);

/* Reads a field, treating an explicit null as absent (Kubernetes semantics:
 * `field: null` and a missing field mean the same). */
json_t *sl_validate_get(json_t *obj, const char *key);

/* Replaces, in a document valid against `schema`, every value of a field
 * flagged SL_VFIELD_SECRET by the string "[redacted]" (an empty string
 * stays empty: nothing to hide), through nested objects and arrays of
 * objects. */
void sl_validate_redact(const sl_vschema_t *schema, json_t *obj);

/* Generic checks (arg in brackets). */
void sl_vcheck_object(sl_vctx_t *c, json_t *v, const void *schema); /* [sl_vschema_t] */
void sl_vcheck_array(sl_vctx_t *c, json_t *v, const void *spec);    /* [sl_varray_t] */
void sl_vcheck_string(sl_vctx_t *c, json_t *v, const void *arg);    /* non-empty, ≤ 4096 */
void sl_vcheck_bool(sl_vctx_t *c, json_t *v, const void *arg);
void sl_vcheck_int(sl_vctx_t *c, json_t *v, const void *range);      /* [sl_vrange_t] */
void sl_vcheck_duration(sl_vctx_t *c, json_t *v, const void *range); /* [sl_vrange_t] ms */
void sl_vcheck_enum(sl_vctx_t *c, json_t *v, const void *names);     /* [const char *const[]] */
void sl_vcheck_any(sl_vctx_t *c, json_t *v, const void *arg);
/* A PCRE2 pattern of 1..1024 characters that compiles with the default
 * options (how the policies compile theirs); the error gives the offset. */
void sl_vcheck_regex(sl_vctx_t *c, json_t *v, const void *arg);
void sl_vcheck_dns_subdomain(sl_vctx_t *c, json_t *v, const void *arg);
void sl_vcheck_dns_label(sl_vctx_t *c, json_t *v, const void *arg);
void sl_vcheck_ip(sl_vctx_t *c, json_t *v, const void *arg);
void sl_vcheck_host_or_ip(sl_vctx_t *c, json_t *v, const void *arg);

/* The "did you mean" helper: closest of names within edit distance 2, or NULL. */
const char *sl_validate_suggest(const char *word, const char *const *names, size_t n);

/* Pure predicates, shared with the compiler. */
bool sl_validate_is_dns_subdomain(const char *s);
bool sl_validate_is_dns_label(const char *s);
bool sl_validate_is_ip(const char *s);
bool sl_validate_is_hostname(const char *s);

/* True when two listeners cannot both bind: same port and the same address,
 * or one of them a wildcard covering the other (validate_spec.c). */
bool sl_validate_spec_listeners_conflict(const char *addr_a, long port_a, const char *addr_b,
                                         long port_b);

/* Spec schemas of each kind (validate_spec.c). */
extern const sl_vschema_t sl_validate_spec_gateway;
extern const sl_vschema_t sl_validate_spec_api;
extern const sl_vschema_t sl_validate_spec_backend;
extern const sl_vschema_t sl_validate_spec_consumer;
extern const sl_vschema_t sl_validate_spec_certificate;
/* A policy's `when` (policies/policy.h): methods, pathPrefixes, headers. */
extern const sl_vschema_t sl_validate_policy_when;

/* The OpenAPI v3 schema of each check function of validate_spec.c, for the
 * CRDs (common/crd.c) that are generated from these same tables: JSON text,
 * or built from the field's arg. The generic checks above are described in
 * crd.c; a check described nowhere makes the generator fail, so a new check
 * cannot silently drop out of the CRDs. */
typedef struct {
    sl_vcheck_fn check;
    const char *openapi;                    /* JSON text, or NULL */
    json_t *(*openapi_of)(const void *arg); /* when the schema depends on arg */
} sl_vopenapi_t;
extern const sl_vopenapi_t sl_validate_spec_openapi[]; /* ends with {NULL} */

#endif
