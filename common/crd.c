/*
 * CRDs from the validation tables (crd.h).
 *
 * Responsible for turning each kind's schema table into an OpenAPI v3
 * structural schema (every node typed, every object's properties listed),
 * and for the parts of a CRD the tables do not hold: names, short names,
 * printer columns, the status subresource. Not responsible for emitting YAML
 * (yaml.c) nor for what the CRDs are used for (the chart, kubectl).
 *
 * What OpenAPI cannot say stays in the model and is checked by the
 * controller: rules across fields (the tables' `extra` functions: exactly
 * one certificate source, consistent hashing needs a key...), path template
 * syntax, PEM contents, and a policy's `config`, whose fields depend on the
 * policy's `name`: a structural schema has no union keyed by a sibling, so
 * `config` is an object with x-kubernetes-preserve-unknown-fields and the
 * controller validates it against the policy's own table.
 */
#include "crd.h"

#include "policy.h"
#include "validate.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    char *err;
    size_t errlen;
} gen_t;

static json_t *schema_of(gen_t *g, sl_vcheck_fn fn, const void *arg, const char *field);

static json_t *object_schema(gen_t *g, const sl_vschema_t *schema)
{
    json_t *props = json_object(), *required = json_array();
    for (const sl_vfield_t *f = schema->fields; f->name; f++) {
        json_t *s = schema_of(g, f->check, f->arg, f->name);
        if (!s) {
            json_decref(props);
            json_decref(required);
            return NULL;
        }
        json_object_set_new(props, f->name, s);
        if (f->flags & SL_VFIELD_REQUIRED)
            json_array_append_new(required, json_string(f->name));
    }
    json_t *o = json_pack("{s:s, s:o}", "type", "object", "properties", props);
    if (json_array_size(required))
        json_object_set_new(o, "required", required);
    else
        json_decref(required);
    return o;
}

/* A `policies` list: {name, config, when, disabled}. */
static json_t *policies_schema(gen_t *g, int operation)
{
    json_t *names = json_array();
    for (const char *const *n = sl_policy_names(); *n; n++)
        json_array_append_new(names, json_string(*n));
    json_t *when = object_schema(g, &sl_validate_policy_when);
    if (!when) {
        json_decref(names);
        return NULL;
    }
    json_t *props = json_pack(
        "{s:{s:s, s:o}, s:{s:s, s:b, s:s}, s:o}", "name", "type", "string", "enum", names, "config",
        "type", "object", "x-kubernetes-preserve-unknown-fields", 1, "description",
        "the policy's configuration; its fields depend on `name` and are checked by the "
        "controller against that policy's schema (docs/policies/)",
        "when", when);
    if (operation)
        json_object_set_new(props, "disabled", json_pack("{s:s}", "type", "boolean"));
    return json_pack("{s:s, s:s, s:{s:s, s:o, s:[s]}}", "type", "array", "x-kubernetes-list-type",
                     "atomic", "items", "type", "object", "properties", props, "required", "name");
}

static json_t *schema_of(gen_t *g, sl_vcheck_fn fn, const void *arg, const char *field)
{
    if (fn == sl_vcheck_object)
        return object_schema(g, arg);
    if (fn == sl_vcheck_array) {
        const sl_varray_t *a = arg;
        json_t *items = schema_of(g, a->check, a->arg, field);
        if (!items)
            return NULL;
        json_t *s = json_pack("{s:s, s:o}", "type", "array", "items", items);
        if (a->min_items)
            json_object_set_new(s, "minItems", json_integer((json_int_t)a->min_items));
        if (a->max_items)
            json_object_set_new(s, "maxItems", json_integer((json_int_t)a->max_items));
        return s;
    }
    if (fn == sl_vcheck_string)
        return json_pack("{s:s, s:i, s:i}", "type", "string", "minLength", 1, "maxLength",
                         SL_VALIDATE_STRING_MAX);
    if (fn == sl_vcheck_bool)
        return json_pack("{s:s}", "type", "boolean");
    if (fn == sl_vcheck_int) {
        const sl_vrange_t *r = arg;
        json_t *s = json_pack("{s:s, s:s}", "type", "integer", "format", "int64");
        if (r->min > INT64_MIN)
            json_object_set_new(s, "minimum", json_integer(r->min));
        if (r->max < INT64_MAX)
            json_object_set_new(s, "maximum", json_integer(r->max));
        return s;
    }
    if (fn == sl_vcheck_duration) {
        const sl_vrange_t *r = arg;
        char desc[200];
        snprintf(desc, sizeof(desc),
                 "a duration: \"250ms\", \"10s\", \"5m\", \"1h\", or integer milliseconds; "
                 "%lldms..%lldms",
                 (long long)r->min, (long long)r->max);
        return json_pack("{s:b, s:s, s:s}", "x-kubernetes-int-or-string", 1, "pattern",
                         "^[0-9]+(ms|s|m|h)$", "description", desc);
    }
    if (fn == sl_vcheck_enum) {
        json_t *e = json_array();
        for (const char *const *n = arg; *n; n++)
            json_array_append_new(e, json_string(*n));
        return json_pack("{s:s, s:o}", "type", "string", "enum", e);
    }
    if (fn == sl_vcheck_any)
        return json_pack("{s:b}", "x-kubernetes-preserve-unknown-fields", 1);
    if (fn == sl_vcheck_regex)
        return json_pack("{s:s, s:i, s:i, s:s}", "type", "string", "minLength", 1, "maxLength",
                         1024, "description", "a PCRE2 regular expression");
    if (fn == sl_vcheck_dns_subdomain)
        return json_pack("{s:s, s:i, s:s}", "type", "string", "maxLength", 253, "pattern",
                         "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$");
    if (fn == sl_vcheck_dns_label)
        return json_pack("{s:s, s:i, s:s}", "type", "string", "maxLength", 63, "pattern",
                         "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$");
    if (fn == sl_vcheck_ip)
        return json_pack("{s:s, s:s}", "type", "string", "description", "an IPv4 or IPv6 address");
    if (fn == sl_vcheck_host_or_ip)
        return json_pack("{s:s, s:i, s:s}", "type", "string", "maxLength", 253, "description",
                         "a hostname or an IP address");
    if (fn == sl_policy_vcheck_list)
        return policies_schema(g, arg && strcmp(arg, "operation") == 0);
    for (const sl_vopenapi_t *d = sl_validate_spec_openapi; d->check; d++) {
        if (d->check != fn)
            continue;
        if (d->openapi_of)
            return d->openapi_of(arg);
        json_error_t je;
        json_t *s = json_loads(d->openapi, 0, &je);
        if (!s)
            snprintf(g->err, g->errlen, "field %s: its OpenAPI text does not parse: %s", field,
                     je.text);
        return s;
    }
    snprintf(g->err, g->errlen,
             "field %s: its check function has no OpenAPI description (add it to "
             "sl_validate_spec_openapi in common/validate_spec.c)",
             field);
    return NULL;
}

static json_t *status_schema(const char *kind)
{
    json_t *s = json_pack(
        "{s:s, s:b, s:{s:{s:s, s:s, s:{s:s, s:{s:{s:s}, s:{s:s, s:[s,s,s]}, s:{s:s}, s:{s:s}, "
        "s:{s:s, s:s}, s:{s:s, s:s}}, s:[s, s]}}}}",
        "type", "object", "x-kubernetes-preserve-unknown-fields", 1, "properties", "conditions",
        "type", "array", "x-kubernetes-list-type", "atomic", "items", "type", "object",
        "properties", "type", "type", "string", "status", "type", "string", "enum", "True", "False",
        "Unknown", "reason", "type", "string", "message", "type", "string", "observedGeneration",
        "type", "integer", "format", "int64", "lastTransitionTime", "type", "string", "format",
        "date-time", "required", "type", "status");
    if (s && (strcmp(kind, "Api") == 0 || strcmp(kind, "Gateway") == 0))
        /* Per fleet (every fleet for an Api, its own for a Gateway): the
         * version that first contains the current spec, the runtimes
         * connected, and how many of them run it (controller/core.c,
         * object_programmed). */
        json_object_set_new(
            json_object_get(s, "properties"), "fleets",
            json_pack("{s:s, s:s, s:{s:s, s:{s:{s:s}, s:{s:s, s:s}, s:{s:s, s:s}, s:{s:s, s:s}}, "
                      "s:[s]}}",
                      "type", "array", "x-kubernetes-list-type", "atomic", "items", "type",
                      "object", "properties", "fleet", "type", "string", "version", "type",
                      "integer", "format", "int64", "runtimes", "type", "integer", "format",
                      "int32", "programmed", "type", "integer", "format", "int32", "required",
                      "fleet"));
    return s;
}

static json_t *column(const char *name, const char *type, const char *path, int priority,
                      const char *desc)
{
    json_t *c = json_pack("{s:s, s:s, s:s, s:s}", "name", name, "type", type, "jsonPath", path,
                          "description", desc);
    if (priority)
        json_object_set_new(c, "priority", json_integer(priority));
    return c;
}

#define COND(t) ".status.conditions[?(@.type==\"" t "\")].status"

static json_t *columns_of(const char *kind)
{
    json_t *a = json_array();
    if (strcmp(kind, "Api") == 0) {
        json_array_append_new(a, column("Base Path", "string", ".spec.basePath", 0,
                                        "the path prefix of every operation"));
        json_array_append_new(a, column("Backends", "string", ".spec.backendRefs[*].name", 0,
                                        "the Backends requests go to"));
        json_array_append_new(
            a, column("Hosts", "string", ".spec.hosts", 1, "the hostnames the Api answers"));
    } else if (strcmp(kind, "Gateway") == 0) {
        json_array_append_new(
            a, column("Fleet", "string", ".spec.fleet", 0, "the runtimes that serve this Gateway"));
        json_array_append_new(
            a, column("Ports", "string", ".spec.listeners[*].port", 0, "the listeners' ports"));
    } else if (strcmp(kind, "Backend") == 0) {
        json_array_append_new(a, column("Endpoints", "string", ".spec.endpoints[*].address", 0,
                                        "the upstream addresses"));
    } else if (strcmp(kind, "Consumer") == 0) {
        json_array_append_new(a,
                              column("Group", "string", ".spec.group", 0, "the rate-limit group"));
    }
    json_array_append_new(a, column("Accepted", "string", COND("Accepted"), 0,
                                    "valid and compiled by the controller"));
    if (strcmp(kind, "Api") == 0 || strcmp(kind, "Gateway") == 0)
        json_array_append_new(a, column("Programmed", "string", COND("Programmed"), 0,
                                        "served by the runtimes of its fleet"));
    json_array_append_new(a, column("Age", "date", ".metadata.creationTimestamp", 0,
                                    "time since the resource was created"));
    return a;
}

static const struct {
    const char *kind, *plural, *shortname;
    const sl_vschema_t *spec;
    const char *desc;
} kinds[] = {
    {"Gateway", "gateways", "slgw", &sl_validate_spec_gateway,
     "A fleet's listeners: ports, protocols, TLS, limits and timeouts."},
    {"Api", "apis", "slapi", &sl_validate_spec_api,
     "An API: hosts, base path, operations, backends and policies."},
    {"Backend", "backends", "slbe", &sl_validate_spec_backend,
     "An upstream cluster: endpoints, load balancing, health checks, TLS."},
    {"Consumer", "consumers", "slcon", &sl_validate_spec_consumer,
     "An API client: its credentials and its group."},
    {"Certificate", "certificates", "slcert", &sl_validate_spec_certificate,
     "A PEM certificate chain and key, or files on the runtimes."},
};

json_t *sl_crd_all(char *err, size_t errlen)
{
    gen_t g = {err, errlen};
    json_t *out = json_array();
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        json_t *spec = object_schema(&g, kinds[i].spec);
        if (!spec) {
            json_decref(out);
            return NULL;
        }
        char name[128], lower[64];
        snprintf(name, sizeof(name), "%s.%s", kinds[i].plural, SL_CRD_GROUP);
        size_t n = strlen(kinds[i].kind);
        for (size_t j = 0; j <= n; j++)
            lower[j] =
                (char)(kinds[i].kind[j] >= 'A' && kinds[i].kind[j] <= 'Z' ? kinds[i].kind[j] + 32
                                                                          : kinds[i].kind[j]);
        json_t *schema =
            json_pack("{s:s, s:s, s:{s:{s:s}, s:{s:s}, s:{s:s}, s:o, s:o}, s:[s]}", "type",
                      "object", "description", kinds[i].desc, "properties", "apiVersion", "type",
                      "string", "kind", "type", "string", "metadata", "type", "object", "spec",
                      spec, "status", status_schema(kinds[i].kind), "required", "spec");
        json_t *crd = json_pack(
            "{s:s, s:s, s:{s:s, s:{s:s}}, s:{s:s, s:s, s:{s:s, s:s, s:s, s:s, s:[s], s:[s]}, "
            "s:[{s:s, s:b, s:b, s:{s:o}, s:{s:{}}, s:o}]}}",
            "apiVersion", "apiextensions.k8s.io/v1", "kind", "CustomResourceDefinition", "metadata",
            "name", name, "labels", "app.kubernetes.io/part-of", "sluice", "spec", "group",
            SL_CRD_GROUP, "scope", "Namespaced", "names", "kind", kinds[i].kind, "listKind", "",
            "plural", kinds[i].plural, "singular", lower, "shortNames", kinds[i].shortname,
            "categories", "sluice", "versions", "name", SL_CRD_VERSION, "served", 1, "storage", 1,
            "schema", "openAPIV3Schema", schema, "subresources", "status",
            "additionalPrinterColumns", columns_of(kinds[i].kind));
        if (!crd) {
            snprintf(err, errlen, "%s: building the CRD failed", kinds[i].kind);
            json_decref(out);
            return NULL;
        }
        char list[80];
        snprintf(list, sizeof(list), "%sList", kinds[i].kind);
        json_object_set_new(json_object_get(json_object_get(crd, "spec"), "names"), "listKind",
                            json_string(list));
        json_array_append_new(out, crd);
    }
    return out;
}
