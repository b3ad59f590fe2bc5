/*
 * The resource model shared by the controller and the standalone runtime:
 * reading Kubernetes-shaped documents (YAML via libyaml, or JSON, several
 * documents per file) into jansson objects, validating every field with
 * errors that carry the field path, and the resource set that the compiler
 * (compiler.h) turns into a snapshot.
 *
 * Kinds (apiVersion gateway.sluice.dev/v1alpha1): Gateway, Api, Backend,
 * Consumer, Certificate. The accepted fields are documented in
 * docs/configuration.md; unknown fields are errors.
 */
#ifndef SL_MODEL_H
#define SL_MODEL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#define SL_API_VERSION "gateway.sluice.dev/v1alpha1"

/* One validation or parse error: "quickstart.yaml doc 3: spec.operations[1].path:
 * unbalanced '{'". source/doc are empty/0 when not from a file. */
typedef struct {
    char *source;  /* file name as given, or "" */
    int doc;       /* 1-based document index in the file, 0 = n/a */
    char *field;   /* "spec.operations[1].path", or "" for the whole document */
    char *message;
} sl_error_t;

typedef struct {
    sl_error_t *items;
    size_t count, cap;
} sl_errors_t;

void sl_errors_init(sl_errors_t *errs);
void sl_errors_free(sl_errors_t *errs);
void sl_errors_add(sl_errors_t *errs, const char *source, int doc, const char *field,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* "source doc N: field: message" (parts omitted when empty). Caller frees. */
char *sl_error_format(const sl_error_t *e);
/* All errors, one per line. Caller frees. */
char *sl_errors_format(const sl_errors_t *errs);

enum sl_kind {
    SL_KIND_GATEWAY = 0,
    SL_KIND_API,
    SL_KIND_BACKEND,
    SL_KIND_CONSUMER,
    SL_KIND_CERTIFICATE,
    SL_KIND__COUNT
};
const char *sl_kind_name(enum sl_kind k);    /* "Api" */
const char *sl_kind_plural(enum sl_kind k);  /* "apis" */
int sl_kind_from_name(const char *name, enum sl_kind *out);   /* "Api" -> SL_KIND_API */
int sl_kind_from_plural(const char *plural, enum sl_kind *out);

typedef struct {
    json_t *obj;          /* the whole document (owned reference) */
    enum sl_kind kind;
    const char *name;     /* metadata.name (points into obj) */
    const char *ns;       /* metadata.namespace, "default" when absent */
    char *source;         /* file name or "" */
    int doc;              /* 1-based document index */
    /* Content hash of obj (sl_json_hash), 0 = not computed: a set whose
     * documents never change in place (the store's) fills it once per
     * write, so the compile cache does not hash every document per compile. */
    uint64_t hash;
} sl_resource_t;

typedef struct {
    sl_resource_t *items;
    size_t count, cap;
    json_t *index; /* private: "Kind/namespace/name" -> position, for O(1) duplicate checks */
} sl_resource_set_t;

void sl_resource_set_init(sl_resource_set_t *set);
void sl_resource_set_free(sl_resource_set_t *set);

/* Appends an already validated document (takes a new reference; source is
 * copied). For sets assembled from a store or filtered from another set.
 * 0, or -1 on allocation failure. */
int sl_resource_set_add(sl_resource_set_t *set, json_t *doc, const char *source, int doc_index);

/* FNV-1a 64 of the document's canonical JSON (compact, sorted keys); never 0. */
uint64_t sl_json_hash(json_t *doc);
/* r->hash, or sl_json_hash(r->obj) when it is 0. */
uint64_t sl_resource_hash(const sl_resource_t *r);

/* Parses YAML or JSON text (auto-detected; YAML is a superset) with one or
 * more documents ("---"); each document is validated (sl_model_validate) and
 * appended. Returns 0 when every document was valid, -1 otherwise (errors
 * appended to errs; nothing from an invalid document is added). Empty
 * documents are skipped. */
int sl_model_parse(sl_resource_set_t *set, const char *text, size_t len, const char *source,
                   sl_errors_t *errs);

/* Loads a file, or every *.yaml / *.yml / *.json file of a directory in name
 * order. Same return convention. */
int sl_model_load_path(sl_resource_set_t *set, const char *path, sl_errors_t *errs);

/* YAML text -> JSON values, one per document (a jansson array). Scalars are
 * typed like YAML 1.2 core schema (true/false, null, ints, floats, else
 * strings; quoted scalars always strings). NULL on a syntax error, with the
 * line and column in errs. */
json_t *sl_yaml_to_json(const char *text, size_t len, const char *source, sl_errors_t *errs);
/* The documents of the JSON array docs as YAML text ("---" between them),
 * with every string that a reader could type as something else quoted, so
 * that sl_yaml_to_json and kubectl read back exactly docs. Malloc'd, NULL
 * when out of memory. */
char *sl_yaml_dump(json_t *docs);

/* Validates one document: apiVersion, kind, metadata (DNS-1123 name,
 * namespace, labels, annotations), spec of that kind, no unknown fields.
 * Fills defaults? No: the document is left as written; the compiler applies
 * defaults. Returns 0 or -1 (errors appended with source/doc). */
int sl_model_validate(json_t *doc, const char *source, int doc_index, sl_errors_t *errs);

/* Durations are strings "250ms", "10s", "1m", "1h" (or integers of ms).
 * Returns 0 and the value in ms, or -1. */
int sl_parse_duration_ms(json_t *v, uint64_t *out_ms);

#endif
