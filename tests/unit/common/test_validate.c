/*
 * Unit tests of validation (common/validate.c, validate_spec.c): a valid
 * example of every kind with every field, and each class of error with its
 * exact message and field path.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "listener_http2.h"
#include "model.h"
#include "tls_pem.h"

#include "common/tls_testcerts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEAD "apiVersion: gateway.sluice.dev/v1alpha1\n"

/* Parses text (which must hold exactly one document) and returns the
 * formatted errors ("" when valid). Caller frees. */
static char *errors_of(const char *text)
{
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    int rc = sl_model_parse(&set, text, strlen(text), "t.yaml", &errs);
    char *s = sl_errors_format(&errs);
    assert_int_equal(rc == 0, errs.count == 0);
    assert_int_equal(set.count, rc == 0 ? 1 : 0);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
    return s;
}

static void expect_valid(const char *text)
{
    char *s = errors_of(text);
    if (s[0])
        fail_msg("expected valid, got:\n%s", s);
    free(s);
}

static void expect_error(const char *text, const char *want)
{
    char *s = errors_of(text);
    if (strcmp(s, want) != 0)
        fail_msg("errors differ.\n got: %s\nwant: %s", s, want);
    free(s);
}

#define API(ops)                                                                                   \
    HEAD "kind: Api\nmetadata: {name: a}\nspec:\n  backendRefs: [{name: b}]\n  operations:\n" ops

#define GATEWAY(body) HEAD "kind: Gateway\nmetadata: {name: g}\nspec:\n" body

#define BACKEND(body) HEAD "kind: Backend\nmetadata: {name: b}\nspec:\n" body

static void test_every_kind_valid(void **state)
{
    (void)state;
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    int rc = sl_model_load_path(&set, "tests/data/model/full.yaml", &errs);
    if (rc != 0) {
        char *s = sl_errors_format(&errs);
        fail_msg("full.yaml: %s", s);
    }
    assert_int_equal(set.count, 8);
    int seen[SL_KIND__COUNT] = {0};
    for (size_t i = 0; i < set.count; i++)
        seen[set.items[i].kind]++;
    for (int k = 0; k < SL_KIND__COUNT; k++)
        assert_true(seen[k] >= 1);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);

    expect_valid(HEAD "kind: Consumer\nmetadata: {name: c}\nspec: {}\n");
    expect_valid(API("  - {method: GET, path: /}\n"));
}

static void test_unknown_field_with_suggestion(void **state)
{
    (void)state;
    expect_error(API("  - {methd: GET, path: /pets}\n"),
                 "t.yaml doc 1: spec.operations[0].methd: unknown field (did you mean "
                 "'method'?)\n");
    expect_error(API("  - {method: GET, path: /pets, colour: red}\n"),
                 "t.yaml doc 1: spec.operations[0].colour: unknown field\n");
    expect_error(HEAD "kind: Api\nmetadata: {name: a}\nspec:\n  basepath: /x\n"
                      "  backendRefs: [{name: b}]\n  operations: [{path: /}]\n",
                 "t.yaml doc 1: spec.basepath: unknown field (did you mean 'basePath'?)\n");
    expect_error(HEAD "kind: Backend\nmetadata: {name: b}\nspec: {endpoints: [{address: a, "
                      "port: 1}]}\nsepc: {}\n",
                 "t.yaml doc 1: sepc: unknown field (did you mean 'spec'?)\n");
    expect_error(HEAD "kind: Backend\nmetadata: {name: b, lables: {}}\nspec: {endpoints: "
                      "[{address: a, port: 1}]}\n",
                 "t.yaml doc 1: metadata.lables: unknown field (did you mean 'labels'?)\n");
}

static void test_wrong_types_name_the_expected_type(void **state)
{
    (void)state;
    expect_error(GATEWAY("  listeners: [{name: http, port: \"8080\"}]\n"),
                 "t.yaml doc 1: spec.listeners[0].port: expected integer, got string\n");
    expect_error(GATEWAY("  listeners: {name: http, port: 8080}\n"),
                 "t.yaml doc 1: spec.listeners: expected array, got object\n");
    expect_error(GATEWAY("  listeners: [{name: http, port: 8080}]\n  via: \"yes\"\n"),
                 "t.yaml doc 1: spec.via: expected boolean, got string\n");
    expect_error(GATEWAY("  listeners: [{name: http, port: 80.5}]\n"),
                 "t.yaml doc 1: spec.listeners[0].port: expected integer, got number\n");
    expect_error(API("  - {method: GET, path: 7}\n"),
                 "t.yaml doc 1: spec.operations[0].path: expected string, got integer\n");
    expect_error(HEAD "kind: Backend\nmetadata: {name: b}\nspec: []\n",
                 "t.yaml doc 1: spec: expected object, got array\n");
    expect_error("- 1\n- 2\n", "t.yaml doc 1: expected a resource object, got array\n");
}

static void test_ranges_and_enums(void **state)
{
    (void)state;
    expect_error(GATEWAY("  listeners: [{name: http, port: 70000}]\n"),
                 "t.yaml doc 1: spec.listeners[0].port: 70000 is out of range 1..65535\n");
    expect_error(GATEWAY("  listeners: [{name: http, port: 80, protocol: htp}]\n"),
                 "t.yaml doc 1: spec.listeners[0].protocol: 'htp' is not one of http, https, "
                 "h2c (did you mean 'http'?)\n");
    expect_error(GATEWAY("  listeners: [{name: http, port: 80}]\n"
                         "  limits: {maxRequestLineBytes: 100}\n"),
                 "t.yaml doc 1: spec.limits.maxRequestLineBytes: 100 is out of range "
                 "256..65536\n");
    expect_error(BACKEND("  endpoints: [{address: 10.0.0.1, port: 80, weight: 0}]\n"),
                 "t.yaml doc 1: spec.endpoints[0].weight: 0 is out of range 1..1000\n");
    expect_error(GATEWAY("  listeners: []\n"),
                 "t.yaml doc 1: spec.listeners: needs at least 1 item\n");
    expect_error(GATEWAY("  listeners: [{name: http, port: 80, address: localhost}]\n"),
                 "t.yaml doc 1: spec.listeners[0].address: 'localhost' is not an IPv4 or IPv6 "
                 "address\n");
}

static void test_bad_durations(void **state)
{
    (void)state;
    expect_error(GATEWAY("  listeners: [{name: http, port: 80}]\n  timeouts: {idle: 10 s}\n"),
                 "t.yaml doc 1: spec.timeouts.idle: invalid duration '10 s' (use a number and "
                 "one unit: ms, s, m, h; like \"250ms\" or \"10s\")\n");
    expect_error(GATEWAY("  listeners: [{name: http, port: 80}]\n  timeouts: {idle: 0}\n"),
                 "t.yaml doc 1: spec.timeouts.idle: duration 0ms is out of range "
                 "1ms..4294967295ms\n");
    expect_error(GATEWAY("  listeners: [{name: http, port: 80}]\n  timeouts: {idle: true}\n"),
                 "t.yaml doc 1: spec.timeouts.idle: expected duration (string like \"10s\" or "
                 "integer ms), got boolean\n");
    /* request: 0 means none at the Gateway. */
    expect_valid(GATEWAY("  listeners: [{name: http, port: 80}]\n  timeouts: {request: 0, idle: "
                         "1500}\n"));
}

static void test_bad_template_in_third_document(void **state)
{
    (void)state;
    const char *text = HEAD "kind: Gateway\nmetadata: {name: default}\nspec:\n"
                            "  listeners: [{name: http, port: 8080}]\n---\n" HEAD
                            "kind: Backend\nmetadata: {name: echo}\nspec:\n"
                            "  endpoints: [{address: 127.0.0.1, port: 9001}]\n---\n" HEAD
                            "kind: Api\nmetadata: {name: petstore}\nspec:\n"
                            "  basePath: /petstore/v1\n  backendRefs: [{name: echo}]\n"
                            "  operations:\n  - {method: GET, path: /pets}\n"
                            "  - {method: GET, path: \"/pets/{id\"}\n";
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    assert_int_equal(sl_model_parse(&set, text, strlen(text), "quickstart.yaml", &errs), -1);
    char *s = sl_errors_format(&errs);
    assert_string_equal(s, "quickstart.yaml doc 3: spec.operations[1].path: unbalanced '{'\n");
    free(s);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
}

static void test_paths(void **state)
{
    (void)state;
    expect_error(API("  - {method: GET, path: pets}\n"),
                 "t.yaml doc 1: spec.operations[0].path: must start with '/'\n");
    expect_error(API("  - {method: GET, path: \"/pets/{id}/x/{id}\"}\n"),
                 "t.yaml doc 1: spec.operations[0].path: parameter 'id' appears twice\n");
    expect_error(API("  - {method: GET, path: \"/a/{id}\", pathType: exact}\n"),
                 "t.yaml doc 1: spec.operations[0].path: '{' and '}' are only allowed with "
                 "pathType template\n");
    expect_error(API("  - {method: GET, path: \"^/a/(b\", pathType: regex}\n"),
                 "t.yaml doc 1: spec.operations[0].path: invalid regular expression at offset "
                 "6: missing closing parenthesis\n");
    expect_valid(API("  - {method: GET, path: \"^/a/{2,3}$\", pathType: regex}\n"));
    expect_valid(API("  - {method: GET, path: /static, pathType: prefix}\n"));
}

static void test_methods(void **state)
{
    (void)state;
    expect_error(API("  - {method: FETCH, path: /}\n"),
                 "t.yaml doc 1: spec.operations[0].method: 'FETCH' is not an HTTP method (GET, "
                 "HEAD, POST, PUT, DELETE, PATCH, OPTIONS, TRACE, CONNECT, or \"*\" for any)\n");
    expect_error(API("  - {method: GET, methods: [POST], path: /}\n"),
                 "t.yaml doc 1: spec.operations[0].methods: set either method or methods, not "
                 "both\n");
    expect_error(API("  - {methods: [GET, get], path: /}\n"),
                 "t.yaml doc 1: spec.operations[0].methods[1]: method get is listed twice\n");
    expect_error(API("  - {methods: [GET, \"*\"], path: /}\n"),
                 "t.yaml doc 1: spec.operations[0].methods[1]: \"*\" (any method) cannot be "
                 "combined with other methods\n");
}

static void test_duplicate_operations(void **state)
{
    (void)state;
    expect_error(API("  - {method: GET, path: /pets}\n"
                     "  - {method: POST, path: /pets}\n"
                     "  - {method: GET, path: /pets}\n"),
                 "t.yaml doc 1: spec.operations[2]: same method (GET), path and matches as "
                 "spec.operations[0]; the second could never be selected\n");
    /* Template parameter names do not make two routes different. */
    expect_error(API("  - {method: GET, path: \"/pets/{id}\"}\n"
                     "  - {methods: [PUT, GET], path: \"/pets/{petId}\"}\n"),
                 "t.yaml doc 1: spec.operations[1]: same method (GET), path and matches as "
                 "spec.operations[0]; the second could never be selected\n");
    expect_error(API("  - {name: pets, method: GET, path: /a}\n"
                     "  - {name: pets, method: GET, path: /b}\n"),
                 "t.yaml doc 1: spec.operations[1].name: 'pets' is already the name of "
                 "spec.operations[0]\n");
    /* Different matches: both selectable. */
    expect_valid(API("  - {method: GET, path: /pets}\n"
                     "  - {method: GET, path: /pets, headers: [{name: X-V, value: '2'}]}\n"
                     "  - {method: GET, path: /pets, pathType: prefix}\n"));
}

static void test_api_rules(void **state)
{
    (void)state;
    expect_error(HEAD "kind: Api\nmetadata: {name: a}\nspec:\n  operations:\n"
                      "  - {method: GET, path: /a, backendRefs: [{name: x}]}\n"
                      "  - {method: GET, path: /b}\n",
                 "t.yaml doc 1: spec.backendRefs: required field missing "
                 "(spec.operations[1] has no backendRefs of its own)\n");
    expect_valid(HEAD "kind: Api\nmetadata: {name: a}\nspec:\n  operations:\n"
                      "  - {method: GET, path: /a, backendRefs: [{name: x}]}\n");
    expect_error(HEAD "kind: Api\nmetadata: {name: a}\nspec:\n  backendRefs: [{name: b}]\n",
                 "t.yaml doc 1: spec.operations: required field missing\n");
    expect_error(HEAD "kind: Api\nmetadata: {name: a}\nspec:\n  backendRefs: [{name: b}]\n"
                      "  operations: []\n",
                 "t.yaml doc 1: spec.operations: needs at least 1 item\n");
    expect_error(HEAD "kind: Api\nmetadata: {name: a}\nspec:\n  basePath: /v1/\n"
                      "  backendRefs: [{name: b}]\n  operations: [{path: /}]\n",
                 "t.yaml doc 1: spec.basePath: must not end with '/' (use \"/v1\")\n");
    expect_error(HEAD "kind: Api\nmetadata: {name: a}\nspec:\n  basePath: /v1/{x}\n"
                      "  backendRefs: [{name: b}]\n  operations: [{path: /}]\n",
                 "t.yaml doc 1: spec.basePath: templates are not allowed in basePath; put "
                 "'{param}' in the operation paths\n");
    expect_error(HEAD "kind: Api\nmetadata: {name: a}\nspec:\n  hosts: [Api.Example.com]\n"
                      "  backendRefs: [{name: b}]\n  operations: [{path: /}]\n",
                 "t.yaml doc 1: spec.hosts[0]: 'Api.Example.com' must be lowercase\n");
    expect_error(HEAD "kind: Api\nmetadata: {name: a}\nspec:\n  hosts: [\"api.example.com:80\"]\n"
                      "  backendRefs: [{name: b}]\n  operations: [{path: /}]\n",
                 "t.yaml doc 1: spec.hosts[0]: 'api.example.com:80' is not a hostname, "
                 "\"*.suffix\" or \"*\" (no port, no scheme, '*' only as the whole first "
                 "label)\n");
    expect_error(HEAD "kind: Api\nmetadata: {name: a}\nspec:\n"
                      "  backendRefs: [{name: b}, {name: b, weight: 2}]\n"
                      "  operations: [{path: /}]\n",
                 "t.yaml doc 1: spec.backendRefs[1]: Backend 'b' is already referenced by "
                 "backendRefs[0]\n");
    expect_error(API("  - path: /\n    headers: [{name: X-A, type: regex}]\n"),
                 "t.yaml doc 1: spec.operations[0].headers[0].value: required field missing "
                 "(unless type is present)\n");
    expect_error(API("  - path: /\n    headers: [{name: \"X A\", value: v}]\n"),
                 "t.yaml doc 1: spec.operations[0].headers[0].name: 'X A' is not a valid "
                 "header name\n");
    expect_error(API("  - path: /\n    retries: {attempts: 11, \"on\": [reste, 404]}\n"),
                 "t.yaml doc 1: spec.operations[0].retries.attempts: 11 is out of range 0..10\n"
                 "t.yaml doc 1: spec.operations[0].retries.on[0]: 'reste' is not "
                 "connect-failure, reset or a 5xx status code (did you mean 'reset'?)\n"
                 "t.yaml doc 1: spec.operations[0].retries.on[1]: 404 is not a 5xx status "
                 "code\n");
    expect_error(API("  - path: /\n    timeouts: {request: 0}\n"),
                 "t.yaml doc 1: spec.operations[0].timeouts.request: duration 0ms is out of "
                 "range 1ms..4294967295ms\n");
}

static void test_gateway_rules(void **state)
{
    (void)state;
    expect_error(GATEWAY("  listeners:\n  - {name: a, port: 80}\n  - {name: a, port: 81}\n"),
                 "t.yaml doc 1: spec.listeners[1].name: listener name 'a' is already used by "
                 "listeners[0]\n");
    expect_error(GATEWAY("  listeners:\n  - {name: a, port: 80}\n"
                         "  - {name: b, port: 80, address: 127.0.0.1}\n"),
                 "t.yaml doc 1: spec.listeners[1].port: 127.0.0.1:80 overlaps listeners[0] "
                 "(0.0.0.0:80)\n");
    expect_valid(GATEWAY("  listeners:\n  - {name: a, port: 80, address: 127.0.0.1}\n"
                         "  - {name: b, port: 80, address: 127.0.0.2}\n"
                         "  - {name: c, port: 81, address: \"::1\"}\n"));
    expect_error(GATEWAY("  listeners: [{port: 80}]\n"),
                 "t.yaml doc 1: spec.listeners[0].name: required field missing\n");
    /* https needs its certificates; which exist is the compiler's question. */
    expect_valid(GATEWAY("  listeners: [{name: tls, port: 8443, protocol: https,\n"
                         "    tls: {certificateRefs: [{name: a}]}}]\n"));
}

static void test_upgrades(void **state)
{
    (void)state;
    expect_valid(API("  - {method: GET, path: /ws, upgrades: [{type: websocket, enabled: false}]}\n"
                     "  upgrades: [{type: my-proto}]\n  timeouts: {tunnelIdle: 30s}\n"));
    expect_error(API("  - {method: GET, path: /ws, upgrades: [{type: h2c}]}\n"),
                 "t.yaml doc 1: spec.operations[0].upgrades[0].type: h2c upgrades are never "
                 "tunnelled: the HTTP/2 inside would bypass the gateway's routes and policies (use "
                 "an h2c listener)\n");
    expect_error(API("  - {method: GET, path: /ws, upgrades: [{type: \"web socket\"}]}\n"),
                 "t.yaml doc 1: spec.operations[0].upgrades[0].type: invalid character in upgrade "
                 "token 'web socket' (an RFC 9110 token)\n");
    expect_error(API("  - {method: GET, path: /ws, upgrades: [{enabled: true}]}\n"),
                 "t.yaml doc 1: spec.operations[0].upgrades[0].type: required field missing\n");
    expect_error(API("  - {method: GET, path: /ws, timeouts: {tunnelIdle: 0s}}\n"),
                 "t.yaml doc 1: spec.operations[0].timeouts.tunnelIdle: duration 0ms is out of "
                 "range 1ms..4294967295ms\n");
}

static void test_backend_protocols(void **state)
{
    (void)state;
    expect_valid(BACKEND("  endpoints: [{address: 127.0.0.1, port: 9}]\n  protocol: h2c\n"));
    expect_valid(BACKEND("  endpoints: [{address: a.example, port: 443}]\n  protocol: h2\n"
                         "  tls: {sni: a.example}\n"));
    expect_error(BACKEND("  endpoints: [{address: a.example, port: 443}]\n  protocol: h2\n"),
                 "t.yaml doc 1: spec.protocol: h2 is HTTP/2 over TLS: add tls (or use h2c for "
                 "plaintext HTTP/2)\n");
    expect_error(BACKEND("  endpoints: [{address: a.example, port: 443}]\n  protocol: h2c\n"
                         "  tls: {sni: a.example}\n"),
                 "t.yaml doc 1: spec.protocol: h2c is plaintext HTTP/2: remove tls (or use h2 "
                 "for HTTP/2 over TLS)\n");
    expect_error(BACKEND("  endpoints: [{address: a.example, port: 443}]\n  protocol: h3\n"),
                 "t.yaml doc 1: spec.protocol: 'h3' is not one of http1, h2, h2c (did you mean "
                 "'h2'?)\n");
    /* Active health checks speak the Backend's protocol, TLS included. */
    expect_valid(BACKEND("  endpoints: [{address: 127.0.0.1, port: 9}]\n  protocol: h2c\n"
                         "  healthCheck: {path: /health}\n"));
    expect_valid(BACKEND("  endpoints: [{address: a.example, port: 443}]\n  protocol: h2\n"
                         "  tls: {sni: a.example}\n  healthCheck: {path: /health}\n"));
    expect_valid(BACKEND("  endpoints: [{address: a.example, port: 443}]\n"
                         "  tls: {sni: a.example}\n  healthCheck: {path: /health}\n"));
    /* A combination no probe can speak is refused once, for the protocol. */
    expect_error(BACKEND("  endpoints: [{address: a.example, port: 443}]\n  protocol: h2\n"
                         "  healthCheck: {path: /health}\n"),
                 "t.yaml doc 1: spec.protocol: h2 is HTTP/2 over TLS: add tls (or use h2c for "
                 "plaintext HTTP/2)\n");
    char *e = errors_of(BACKEND("  endpoints: [{address: a.example, port: 443}]\n"
                                "  tls: {caBundle: x}\n"));
    assert_non_null(strstr(e, "spec.tls.caBundle: expected a PEM certificate"));
    free(e);
    /* A real CA certificate in caBundle, and caFile too: one source only. */
    tc_pair_t ca;
    tc_make(&ca, TC_EC256, "Test CA", "ca.example", -3600, 86400, NULL, true);
    json_t *doc = json_pack("{s:s,s:s,s:{s:s},s:{s:[{s:s,s:i}],s:{s:s,s:s}}}", "apiVersion",
                            "gateway.sluice.dev/v1alpha1", "kind", "Backend", "metadata", "name",
                            "b", "spec", "endpoints", "address", "a.example", "port", 443, "tls",
                            "caBundle", ca.cert_pem, "caFile", "/etc/ca.pem");
    char *text = json_dumps(doc, 0);
    e = errors_of(text);
    assert_string_equal(e, "t.yaml doc 1: spec.tls: set at most one of caBundle (PEM) or caFile "
                           "(a path)\n");
    free(e);
    free(text);
    json_decref(doc);
    tc_free(&ca);
}

static void test_gateway_path_normalization(void **state)
{
    (void)state;
    expect_valid(GATEWAY("  listeners: [{name: http, port: 80}]\n"
                         "  pathNormalization: {mergeSlashes: true, encodedSlashes: decode}\n"));
    expect_valid(GATEWAY("  listeners: [{name: http, port: 80}]\n"
                         "  pathNormalization: {encodedSlashes: keep}\n"));
    expect_valid(GATEWAY("  listeners: [{name: http, port: 80}]\n"
                         "  pathNormalization: {encodedSlashes: reject}\n"));
    expect_valid(GATEWAY("  listeners: [{name: http, port: 80}]\n  pathNormalization: {}\n"));
    expect_error(GATEWAY("  listeners: [{name: http, port: 80}]\n"
                         "  pathNormalization: {encodedSlashes: decod}\n"),
                 "t.yaml doc 1: spec.pathNormalization.encodedSlashes: 'decod' is not one of "
                 "reject, keep, decode (did you mean 'decode'?)\n");
    expect_error(GATEWAY("  listeners: [{name: http, port: 80}]\n"
                         "  pathNormalization: {encodedSlashes: unescape}\n"),
                 "t.yaml doc 1: spec.pathNormalization.encodedSlashes: 'unescape' is not one of "
                 "reject, keep, decode\n");
    expect_error(GATEWAY("  listeners: [{name: http, port: 80}]\n"
                         "  pathNormalization: {encodedSlashes: true}\n"),
                 "t.yaml doc 1: spec.pathNormalization.encodedSlashes: expected string, got "
                 "boolean\n");
    expect_error(GATEWAY("  listeners: [{name: http, port: 80}]\n"
                         "  pathNormalization: {mergeSlashes: \"yes\"}\n"),
                 "t.yaml doc 1: spec.pathNormalization.mergeSlashes: expected boolean, got "
                 "string\n");
    expect_error(GATEWAY("  listeners: [{name: http, port: 80}]\n"
                         "  pathNormalization: {mergeSlash: true}\n"),
                 "t.yaml doc 1: spec.pathNormalization.mergeSlash: unknown field (did you mean "
                 "'mergeSlashes'?)\n");
    expect_error(GATEWAY("  listeners: [{name: http, port: 80}]\n"
                         "  pathNormalisation: {mergeSlashes: true}\n"),
                 "t.yaml doc 1: spec.pathNormalisation: unknown field (did you mean "
                 "'pathNormalization'?)\n");
    expect_error(GATEWAY("  listeners: [{name: http, port: 80}]\n  pathNormalization: keep\n"),
                 "t.yaml doc 1: spec.pathNormalization: expected object, got string\n");
}

static void test_backend_rules(void **state)
{
    (void)state;
    expect_error(BACKEND("  endpoints: [{address: a, port: 1}]\n"
                         "  loadBalancing: {policy: consistent-hash}\n"),
                 "t.yaml doc 1: spec.loadBalancing.hashOn: required field missing (policy "
                 "consistent-hash needs a key)\n");
    expect_error(BACKEND("  endpoints: [{address: a, port: 1}]\n"
                         "  loadBalancing: {policy: consistent-hash, hashOn: {header: X-A, "
                         "cookie: c}}\n"),
                 "t.yaml doc 1: spec.loadBalancing.hashOn: set exactly one of header, cookie or "
                 "clientIp\n");
    expect_error(BACKEND("  endpoints: [{address: a, port: 1}]\n"
                         "  loadBalancing: {hashOn: {clientIp: true}}\n"),
                 "t.yaml doc 1: spec.loadBalancing.hashOn: only used with policy "
                 "consistent-hash\n");
    expect_error(BACKEND("  endpoints:\n  - {address: 10.0.0.1, port: 80}\n"
                         "  - {address: 10.0.0.1, port: 80}\n"),
                 "t.yaml doc 1: spec.endpoints[1]: same address and port as endpoints[0] (raise "
                 "its weight instead)\n");
    expect_error(BACKEND("  endpoints: [{address: \"bad host\", port: 1}]\n"),
                 "t.yaml doc 1: spec.endpoints[0].address: 'bad host' is not an IP address or a "
                 "hostname\n");
    expect_error(BACKEND("  endpoints: [{address: a, port: 1}]\n"
                         "  healthCheck: {path: /h, interval: 1s, timeout: 2s}\n"),
                 "t.yaml doc 1: spec.healthCheck.timeout: must not be longer than interval\n");
    expect_error(BACKEND("  endpoints: [{address: a, port: 1}]\n"
                         "  healthCheck: {path: /h, expectedStatuses: 399-200}\n"),
                 "t.yaml doc 1: spec.healthCheck.expectedStatuses: '399-200' must be within "
                 "100-599, low to high\n");
    expect_valid(BACKEND("  endpoints: [{address: a, port: 1}]\n"
                         "  healthCheck: {path: /h, expectedStatuses: 204}\n"));
    expect_error(BACKEND("  endpoints: [{address: a, port: 1}]\n  healthCheck: {interval: 1s}\n"),
                 "t.yaml doc 1: spec.healthCheck.path: required field missing (or set grpc: "
                 "{service: ...} for a gRPC health check)\n");
    /* gRPC health checks: HTTP/2 Backends only, instead of path. */
    expect_valid(BACKEND("  endpoints: [{address: a, port: 1}]\n  protocol: h2c\n"
                         "  healthCheck: {grpc: {service: \"\"}}\n"));
    expect_valid(BACKEND("  endpoints: [{address: a.example, port: 443}]\n  protocol: h2\n"
                         "  tls: {sni: a.example}\n"
                         "  healthCheck: {grpc: {service: pkg.Svc, authority: a.example}}\n"));
    expect_error(BACKEND("  endpoints: [{address: a, port: 1}]\n"
                         "  healthCheck: {grpc: {service: pkg.Svc}}\n"),
                 "t.yaml doc 1: spec.healthCheck.grpc: gRPC health checks need an HTTP/2 "
                 "Backend: set protocol h2c (or h2 with tls), or use healthCheck.path for an "
                 "HTTP/1.1 check\n");
    expect_error(BACKEND("  endpoints: [{address: a, port: 1}]\n  protocol: h2c\n"
                         "  healthCheck: {path: /h, grpc: {service: pkg.Svc}}\n"),
                 "t.yaml doc 1: spec.healthCheck.grpc: grpc and path are mutually exclusive: "
                 "remove path for a gRPC health check (it always calls "
                 "/grpc.health.v1.Health/Check), or remove grpc for an HTTP GET of path\n");
    expect_error(BACKEND("  endpoints: [{address: a, port: 1}]\n  protocol: h2c\n"
                         "  healthCheck: {grpc: {service: \"bad name\"}}\n"),
                 "t.yaml doc 1: spec.healthCheck.grpc.service: must be a gRPC service name "
                 "(e.g. \"pkg.Service\", or \"\" for the whole server): printable ASCII "
                 "without spaces, at most 1024 characters\n");
    expect_error(BACKEND("  endpoints: [{address: a, port: 1}]\n  protocol: h2c\n"
                         "  healthCheck: {grpc: {servce: x}}\n"),
                 "t.yaml doc 1: spec.healthCheck.grpc.servce: unknown field (did you mean "
                 "'service'?)\n");
}

static void test_consumer_and_certificate_rules(void **state)
{
    (void)state;
    expect_error(HEAD "kind: Consumer\nmetadata: {name: c}\n"
                      "spec: {credentials: {apiKeys: [{keyHash: secret-in-clear}]}}\n",
                 "t.yaml doc 1: spec.credentials.apiKeys[0].keyHash: expected \"sha256:\" "
                 "followed by 64 hex digits (store hashes, never the secret itself)\n");
    expect_error(HEAD "kind: Consumer\nmetadata: {name: c}\n"
                      "spec: {credentials: {jwt: [{subject: s}]}}\n",
                 "t.yaml doc 1: spec.credentials.jwt[0].issuer: required field missing\n");
    expect_error(HEAD "kind: Certificate\nmetadata: {name: c}\n"
                      "spec: {file: {certificate: /a, privateKey: /b}, secretRef: {name: s}}\n",
                 "t.yaml doc 1: spec: set exactly one source: certificate + privateKey, file, or "
                 "secretRef\n");
    expect_error(HEAD "kind: Certificate\nmetadata: {name: c}\nspec: {}\n",
                 "t.yaml doc 1: spec: set exactly one source: certificate + privateKey, file, or "
                 "secretRef\n");
    expect_error(HEAD "kind: Certificate\nmetadata: {name: c}\n"
                      "spec: {certificate: not-pem, privateKey: also-not}\n",
                 "t.yaml doc 1: spec.certificate: expected a PEM certificate (-----BEGIN "
                 "CERTIFICATE----- ... -----END CERTIFICATE-----)\n"
                 "t.yaml doc 1: spec.privateKey: expected a PEM private key (-----BEGIN PRIVATE "
                 "KEY----- ...)\n");
}

static void test_envelope(void **state)
{
    (void)state;
    expect_error("apiVersion: v1\nkind: Backend\nmetadata: {name: b}\n"
                 "spec: {endpoints: [{address: a, port: 1}]}\n",
                 "t.yaml doc 1: apiVersion: 'v1' is not supported (use "
                 "gateway.sluice.dev/v1alpha1)\n");
    expect_error(HEAD "kind: Gatway\nmetadata: {name: g}\nspec: {}\n",
                 "t.yaml doc 1: kind: 'Gatway' is not one of Gateway, Api, Backend, Consumer, "
                 "Certificate (did you mean 'Gateway'?)\n");
    expect_error(HEAD "kind: Backend\nmetadata: {name: Echo_1}\n"
                      "spec: {endpoints: [{address: a, port: 1}]}\n",
                 "t.yaml doc 1: metadata.name: 'Echo_1' is not a valid name (lowercase letters, "
                 "digits, '-' and '.', starting and ending with a letter or digit, at most 253 "
                 "characters)\n");
    expect_error(HEAD "kind: Backend\nmetadata: {name: b, namespace: a.b}\n"
                      "spec: {endpoints: [{address: a, port: 1}]}\n",
                 "t.yaml doc 1: metadata.namespace: 'a.b' is not a valid DNS label (lowercase "
                 "letters, digits and '-', starting and ending with a letter or digit, at most "
                 "63 characters)\n");
    expect_error(HEAD "kind: Backend\nmetadata: {name: b, labels: {tier: 1}}\n"
                      "spec: {endpoints: [{address: a, port: 1}]}\n",
                 "t.yaml doc 1: metadata.labels.tier: expected string, got integer\n");
    expect_error(HEAD "kind: Backend\nmetadata: {namespace: x}\n"
                      "spec: {endpoints: [{address: a, port: 1}]}\n",
                 "t.yaml doc 1: metadata.name: required field missing\n");
    expect_error(HEAD "kind: Backend\nmetadata: {name: b}\n",
                 "t.yaml doc 1: spec: required field missing\n");
    /* Server-set fields and status are accepted (kubectl get -o yaml output). */
    expect_valid(HEAD "kind: Backend\nmetadata:\n  name: b\n  resourceVersion: \"7\"\n"
                      "  generation: 2\n  uid: abc\n  creationTimestamp: null\n"
                      "spec: {endpoints: [{address: a, port: 1}]}\n"
                      "status: {conditions: [{type: Ready}]}\n");
}

/* --- TLS: Certificate PEM checks and listener tls ------------------------- */

static char *cert_errors(const char *cert_pem, const char *key_pem)
{
    char *doc = tc_certificate_doc("c", cert_pem, key_pem);
    char *s = errors_of(doc);
    free(doc);
    return s;
}

static void expect_cert_error(const char *cert_pem, const char *key_pem, const char *field,
                              const char *want_part)
{
    char *s = cert_errors(cert_pem, key_pem);
    char prefix[128];
    snprintf(prefix, sizeof(prefix), "t.yaml doc 1: %s: ", field);
    if (strncmp(s, prefix, strlen(prefix)) != 0 || !strstr(s, want_part))
        fail_msg("want '%s...%s', got: %s", prefix, want_part, s);
    /* No key material in any message: not a line of the key's base64. */
    const char *nl = strchr(key_pem, '\n');
    char line[65] = "";
    if (nl)
        snprintf(line, sizeof(line), "%.40s", nl + 1);
    if (line[0] && strstr(s, line))
        fail_msg("key material in the error: %s", s);
    free(s);
}

static void test_certificate_pem_checks(void **state)
{
    (void)state;
    tc_pair_t ok, rsa, other, expired, future, p521, rsa1024, ca, leaf, ed;
    tc_make(&ok, TC_EC256, "a.example", "a.example,www.a.example", -3600, 90 * 86400, NULL, false);
    tc_make(&rsa, TC_RSA2048, "a.example", "a.example", -3600, 90 * 86400, NULL, false);
    tc_make(&other, TC_EC256, "a.example", "a.example", -3600, 90 * 86400, NULL, false);
    tc_make(&expired, TC_EC256, "old.example", "old.example", -90 * 86400, -86400, NULL, false);
    tc_make(&future, TC_EC256, "new.example", "new.example", 86400, 90 * 86400, NULL, false);
    tc_make(&p521, TC_EC521, "p.example", "p.example", -3600, 86400, NULL, false);
    tc_make(&rsa1024, TC_RSA1024, "r.example", "r.example", -3600, 86400, NULL, false);
    tc_make(&ca, TC_EC256, "Test CA", NULL, -3600, 365 * 86400, NULL, true);
    tc_make(&leaf, TC_EC256, "l.example", "l.example", -3600, 86400, &ca, false);
    tc_make(&ed, TC_ED25519, "e.example", "e.example", -3600, 86400, NULL, false);

    char *s = cert_errors(ok.cert_pem, ok.key_pem);
    assert_string_equal(s, "");
    free(s);
    s = cert_errors(rsa.cert_pem, rsa.key_pem);
    assert_string_equal(s, "");
    free(s);
    s = cert_errors(ed.cert_pem, ed.key_pem);
    assert_string_equal(s, "");
    free(s);

    /* A chain in TLS order (leaf, then its issuer) is accepted; reversed is not. */
    char chain[8192], reversed[8192];
    snprintf(chain, sizeof(chain), "%s%s", leaf.cert_pem, ca.cert_pem);
    snprintf(reversed, sizeof(reversed), "%s%s", ca.cert_pem, leaf.cert_pem);
    s = cert_errors(chain, leaf.key_pem);
    assert_string_equal(s, "");
    free(s);
    expect_cert_error(reversed, leaf.key_pem, "spec.certificate",
                      "certificate 2 of the chain did not issue certificate 1");

    expect_cert_error(ok.cert_pem, other.key_pem, "spec.privateKey",
                      "the private key does not match the certificate");
    expect_cert_error(expired.cert_pem, expired.key_pem, "spec.certificate",
                      "the certificate expired at ");
    expect_cert_error(future.cert_pem, future.key_pem, "spec.certificate",
                      "the certificate is not valid before ");
    expect_cert_error(p521.cert_pem, p521.key_pem, "spec.certificate", "unsupported key type");
    expect_cert_error(rsa1024.cert_pem, rsa1024.key_pem, "spec.certificate",
                      "RSA key of 1024 bits");

    /* Bad PEM: the markers are there, the body is not base64 DER. */
    expect_cert_error("-----BEGIN CERTIFICATE-----\nnot*base64\n-----END CERTIFICATE-----\n",
                      ok.key_pem, "spec.certificate", "certificate 1 of the chain does not parse");
    expect_cert_error(ok.cert_pem, "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
                      "spec.privateKey", "the private key does not parse");
    /* A key pasted into the certificate field would be shown by every GET. */
    char with_key[8192];
    snprintf(with_key, sizeof(with_key), "%s%s", ok.cert_pem, ok.key_pem);
    expect_cert_error(with_key, ok.key_pem, "spec.certificate", "contains a private key block");

    /* An encrypted key is refused, never prompted for. */
    BIO *b = BIO_new(BIO_s_mem());
    PEM_write_bio_PKCS8PrivateKey(b, ok.k, EVP_aes_128_cbc(), "pw", 2, NULL, NULL);
    char *enc = tc_bio_text(b);
    expect_cert_error(ok.cert_pem, enc, "spec.privateKey", "the key is encrypted");
    free(enc);

    /* The facts sl_pem_load reads. */
    sl_pem_cert_t pc;
    sl_pem_field_t f;
    char err[256];
    assert_int_equal(sl_pem_load(&pc, chain, strlen(chain), leaf.key_pem, strlen(leaf.key_pem),
                                 SL_PEM_CHECK_VALIDITY, (int64_t)time(NULL), &f, err, sizeof(err)),
                     0);
    assert_int_equal(pc.n_names, 1);
    assert_string_equal(pc.names[0], "l.example");
    assert_int_equal(sk_X509_num(pc.chain), 1);
    assert_int_equal(pc.key_type, SL_PEM_KEY_EC_P256);
    assert_string_equal(pc.subject, "CN=l.example");
    assert_string_equal(pc.issuer, "CN=Test CA");
    assert_int_equal(strlen(pc.sha256_hex), 64);
    unsigned char md[32];
    unsigned int mdlen;
    X509_digest(leaf.x, EVP_sha256(), md, &mdlen);
    char hex[65];
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    assert_string_equal(pc.sha256_hex, hex);
    sl_pem_free(&pc);
    /* Without SL_PEM_CHECK_VALIDITY an expired pair loads (the compiler and
     * the controller's status read facts, the validator judges). */
    assert_int_equal(sl_pem_load(&pc, expired.cert_pem, strlen(expired.cert_pem), NULL, 0, 0, 0, &f,
                                 err, sizeof(err)),
                     0);
    assert_true(pc.not_after_unix < (int64_t)time(NULL));
    sl_pem_free(&pc);

    tc_free(&ok);
    tc_free(&rsa);
    tc_free(&other);
    tc_free(&expired);
    tc_free(&future);
    tc_free(&p521);
    tc_free(&rsa1024);
    tc_free(&ca);
    tc_free(&leaf);
    tc_free(&ed);
}

#define TLS_LISTENER(tls)                                                                          \
    GATEWAY("  listeners:\n  - name: web\n    port: 8443\n    protocol: https\n    tls: " tls "\n")

static void test_listener_tls(void **state)
{
    (void)state;
    /* The example, every field of tls, and the h2c listener. */
    expect_valid(GATEWAY("  listeners:\n"
                         "  - name: https\n    port: 8443\n    protocol: https\n"
                         "    tls:\n      certificateRefs: [{name: a-example}, {name: b-example}]\n"
                         "  - {name: h2c, port: 8081, protocol: h2c}\n"));
    expect_valid(TLS_LISTENER(
        "{certificateRefs: [{name: a}], minVersion: \"1.3\", "
        "cipherSuites: \"TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256\", "
        "groups: \"X25519:P-256\", alpn: [http/1.1], sessionTickets: {enabled: true, rotation: "
        "1h}, "
        "sessionCache: {enabled: false, size: 1000}, ocspStapleFile: /etc/sluice/ocsp.der, "
        "clientAuth: {caFile: /etc/sluice/clients.pem, mode: optional, verifyDepth: 2}}"));
    expect_error(TLS_LISTENER("{certificateRefs: [{name: a}], minVersoin: \"1.3\"}"),
                 "t.yaml doc 1: spec.listeners[0].tls.minVersoin: unknown field (did you mean "
                 "'minVersion'?)\n");
    expect_error(TLS_LISTENER("{certificateRefs: []}"),
                 "t.yaml doc 1: spec.listeners[0].tls.certificateRefs: needs at least 1 item\n");
    expect_error(TLS_LISTENER("{certificateRefs: [{name: a}, {name: a}]}"),
                 "t.yaml doc 1: spec.listeners[0].tls.certificateRefs[1]: Certificate 'a' is "
                 "already referenced by certificateRefs[0]\n");
    expect_error(TLS_LISTENER("{certificateRefs: [{name: a}], minVersion: \"1.1\"}"),
                 "t.yaml doc 1: spec.listeners[0].tls.minVersion: '1.1' is not one of 1.2, 1.3 "
                 "(did you mean '1.2'?)\n");
    expect_error(TLS_LISTENER("{certificateRefs: [{name: a}], alpn: [spdy/3.1]}"),
                 "t.yaml doc 1: spec.listeners[0].tls.alpn[0]: 'spdy/3.1' is not one of h2, "
                 "http/1.1\n");
    expect_error(TLS_LISTENER("{certificateRefs: [{name: a}], alpn: [h2, h2]}"),
                 "t.yaml doc 1: spec.listeners[0].tls.alpn[1]: listed twice\n");
    expect_error(TLS_LISTENER("{certificateRefs: [{name: a}], ciphers: \"A B\"}"),
                 "t.yaml doc 1: spec.listeners[0].tls.ciphers: expected an OpenSSL list of "
                 "1..1024 characters such as \"TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_"
                 "SHA256\" (names separated by ':', no spaces)\n");
    expect_error(TLS_LISTENER("{certificateRefs: [{name: a}], minVersion: \"1.3\", ciphers: "
                              "\"ECDHE+AESGCM\"}"),
                 "t.yaml doc 1: spec.listeners[0].tls.ciphers: TLS 1.2 ciphers have no effect "
                 "with minVersion 1.3 (use cipherSuites)\n");
    expect_error(TLS_LISTENER("{certificateRefs: [{name: a}], sessionTickets: {rotation: 1s}}"),
                 "t.yaml doc 1: spec.listeners[0].tls.sessionTickets.rotation: duration 1000ms "
                 "is out of range 60000ms..604800000ms\n");
    expect_error(TLS_LISTENER("{certificateRefs: [{name: a}], clientAuth: {mode: required}}"),
                 "t.yaml doc 1: spec.listeners[0].tls.clientAuth: set exactly one of caBundle "
                 "(PEM) or caFile (a path)\n");
    expect_error(TLS_LISTENER("{certificateRefs: [{name: a}], clientAuth: {caFile: rel.pem, "
                              "verifyDepth: 0}}"),
                 "t.yaml doc 1: spec.listeners[0].tls.clientAuth.caFile: must be an absolute "
                 "path on the runtime's machine\n"
                 "t.yaml doc 1: spec.listeners[0].tls.clientAuth.verifyDepth: 0 is out of range "
                 "1..10\n");
    expect_error(GATEWAY("  listeners: [{name: web, port: 8443, protocol: https}]\n"),
                 "t.yaml doc 1: spec.listeners[0].tls: required field missing (an https listener "
                 "needs tls.certificateRefs)\n");
    expect_error(GATEWAY("  listeners: [{name: h, port: 8081, protocol: h2c, tls: "
                         "{certificateRefs: [{name: a}]}}]\n"),
                 "t.yaml doc 1: spec.listeners[0]: tls is only for protocol https (this "
                 "listener is h2c, which is plaintext)\n");
}

#define H2C_LISTENER(h2)                                                                           \
    GATEWAY("  listeners: [{name: h, port: 8080, protocol: h2c, http2: " h2 "}]\n")

static void test_listener_http2(void **state)
{
    (void)state;
    expect_valid(H2C_LISTENER("{}"));
    expect_valid(H2C_LISTENER(
        "{maxConcurrentStreams: 5, initialStreamWindowBytes: 131072, "
        "initialConnectionWindowBytes: 4194304, maxHeaderListBytes: 16384, maxHeaderFields: 50, "
        "maxContinuationFrames: 4, headerTableBytes: 8192, maxControlFramesPerWindow: 500, "
        "controlWindow: 5s, maxResetStreamsPerWindow: 50, resetWindow: 2s, "
        "maxEmptyDataFrames: 10, streamSendBufferBytes: 32768, "
        "connectionSendBufferBytes: 262144}"));
    /* https offering h2 (the default ALPN, or listed). */
    expect_valid(
        GATEWAY("  listeners: [{name: tls, port: 8443, protocol: https,\n"
                "    tls: {certificateRefs: [{name: c}]}, http2: {maxHeaderFields: 20}}]\n"));
    expect_valid(GATEWAY("  listeners: [{name: tls, port: 8443, protocol: https,\n"
                         "    tls: {certificateRefs: [{name: c}], alpn: [h2]},\n"
                         "    http2: {maxHeaderFields: 20}}]\n"));

    expect_error(H2C_LISTENER("{maxConcurentStreams: 5}"),
                 "t.yaml doc 1: spec.listeners[0].http2.maxConcurentStreams: unknown field (did "
                 "you mean 'maxConcurrentStreams'?)\n");
    expect_error(H2C_LISTENER("{maxConcurrentStreams: 0}"),
                 "t.yaml doc 1: spec.listeners[0].http2.maxConcurrentStreams: 0 is out of range "
                 "1..10000\n");
    expect_error(H2C_LISTENER("{maxHeaderListBytes: 100}"),
                 "t.yaml doc 1: spec.listeners[0].http2.maxHeaderListBytes: 100 is out of range "
                 "1024..1048576\n");
    expect_error(H2C_LISTENER("{resetWindow: 100ms}"),
                 "t.yaml doc 1: spec.listeners[0].http2.resetWindow: duration 100ms is out of "
                 "range 1000ms..600000ms\n");
    expect_error(H2C_LISTENER("{controlWindow: soon}"),
                 "t.yaml doc 1: spec.listeners[0].http2.controlWindow: invalid duration 'soon' "
                 "(use a number and one unit: ms, s, m, h; like \"250ms\" or \"10s\")\n");
    expect_error(H2C_LISTENER("{maxResetStreamsPerWindow: \"5\"}"),
                 "t.yaml doc 1: spec.listeners[0].http2.maxResetStreamsPerWindow: expected "
                 "integer, got string\n");
    expect_error(GATEWAY("  listeners: [{name: h, port: 8080, protocol: h2c, http2: 5}]\n"),
                 "t.yaml doc 1: spec.listeners[0].http2: expected object, got integer\n");

    /* Every field, at each bound and one past it: the schema's names point
     * at the table entries of the same name. */
    for (int i = 0; i < SL_LH2__COUNT; i++) {
        const sl_listener_http2_field_t *f = &sl_listener_http2_fields[i];
        char text[512], want[512];
        for (int edge = 0; edge < 2; edge++) {
            uint32_t ok = edge ? f->max : f->min;
            /* Only the rules' larger fields can be valid at their minimum
             * with the defaults of the others: skip those combinations. */
            snprintf(text, sizeof(text),
                     GATEWAY("  listeners: [{name: h, port: 8080, "
                             "protocol: h2c, http2: {%s: %u%s}}]\n"),
                     f->name, ok, f->duration ? "ms" : "");
            char *got = errors_of(text);
            if (got[0] && !strstr(got, "is less than"))
                fail_msg("%s: %u: %s", f->name, ok, got);
            free(got);
        }
        snprintf(text, sizeof(text),
                 GATEWAY("  listeners: [{name: h, port: 8080, protocol: "
                         "h2c, http2: {%s: %llu%s}}]\n"),
                 f->name, (unsigned long long)f->max + 1, f->duration ? "ms" : "");
        if (f->duration)
            snprintf(want, sizeof(want),
                     "t.yaml doc 1: spec.listeners[0].http2.%s: duration %llums is out of "
                     "range %ums..%ums\n",
                     f->name, (unsigned long long)f->max + 1, f->min, f->max);
        else
            snprintf(want, sizeof(want),
                     "t.yaml doc 1: spec.listeners[0].http2.%s: %llu is out of range %u..%u\n",
                     f->name, (unsigned long long)f->max + 1, f->min, f->max);
        expect_error(text, want);
        assert_true(f->def >= f->min && f->def <= f->max);
    }

    /* Cross-field rules, with the default named when it is the culprit. */
    expect_error(H2C_LISTENER("{initialStreamWindowBytes: 2097152}"),
                 "t.yaml doc 1: spec.listeners[0].http2.initialConnectionWindowBytes: 1048576 "
                 "(the default) is less than initialStreamWindowBytes (2097152): it must be at "
                 "least as large\n");
    expect_valid(H2C_LISTENER("{initialStreamWindowBytes: 2097152, "
                              "initialConnectionWindowBytes: 2097152}"));
    expect_error(H2C_LISTENER("{streamSendBufferBytes: 65536, connectionSendBufferBytes: 32768}"),
                 "t.yaml doc 1: spec.listeners[0].http2.connectionSendBufferBytes: 32768 is less "
                 "than streamSendBufferBytes (65536): it must be at least as large\n");

    /* A listener that does not speak HTTP/2. */
    expect_error(
        GATEWAY("  listeners: [{name: h, port: 8080, http2: {maxConcurrentStreams: 5}}]\n"),
        "t.yaml doc 1: spec.listeners[0].http2: http2 is only for protocol h2c or https "
        "(this listener is http, which serves HTTP/1.1 only)\n");
    expect_error(GATEWAY("  listeners: [{name: h, port: 8080, protocol: http, http2: {}}]\n"),
                 "t.yaml doc 1: spec.listeners[0].http2: http2 is only for protocol h2c or https "
                 "(this listener is http, which serves HTTP/1.1 only)\n");
    expect_error(GATEWAY("  listeners: [{name: tls, port: 8443, protocol: https,\n"
                         "    tls: {certificateRefs: [{name: c}], alpn: [http/1.1]},\n"
                         "    http2: {maxHeaderFields: 20}}]\n"),
                 "t.yaml doc 1: spec.listeners[0].http2: has no effect: tls.alpn does not offer "
                 "\"h2\" (add it, or remove http2)\n");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kind_valid),
        cmocka_unit_test(test_unknown_field_with_suggestion),
        cmocka_unit_test(test_wrong_types_name_the_expected_type),
        cmocka_unit_test(test_ranges_and_enums),
        cmocka_unit_test(test_bad_durations),
        cmocka_unit_test(test_bad_template_in_third_document),
        cmocka_unit_test(test_paths),
        cmocka_unit_test(test_methods),
        cmocka_unit_test(test_duplicate_operations),
        cmocka_unit_test(test_api_rules),
        cmocka_unit_test(test_gateway_rules),
        cmocka_unit_test(test_gateway_path_normalization),
        cmocka_unit_test(test_backend_protocols),
        cmocka_unit_test(test_upgrades),
        cmocka_unit_test(test_backend_rules),
        cmocka_unit_test(test_consumer_and_certificate_rules),
        cmocka_unit_test(test_certificate_pem_checks),
        cmocka_unit_test(test_listener_tls),
        cmocka_unit_test(test_listener_http2),
        cmocka_unit_test(test_envelope),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
