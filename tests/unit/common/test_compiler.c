/*
 * Unit tests of the compiler (common/compiler.c): the quickstart field by
 * field, defaults and their precedence (operation > Api > Gateway), every
 * field of full.yaml, fleets and merged Gateways, reference and protocol
 * errors, and the pack/unpack round trip.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "compiler.h"

#include "common/tls_testcerts.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEAD "apiVersion: gateway.sluice.dev/v1alpha1\n"

static void load(sl_resource_set_t *set, const char *path)
{
    sl_errors_t errs;
    sl_errors_init(&errs);
    sl_resource_set_init(set);
    if (sl_model_load_path(set, path, &errs) != 0) {
        char *s = sl_errors_format(&errs);
        fail_msg("%s: %s", path, s);
    }
    sl_errors_free(&errs);
}

static void parse(sl_resource_set_t *set, const char *source, const char *text)
{
    sl_errors_t errs;
    sl_errors_init(&errs);
    if (sl_model_parse(set, text, strlen(text), source, &errs) != 0) {
        char *s = sl_errors_format(&errs);
        fail_msg("%s: %s", source, s);
    }
    sl_errors_free(&errs);
}

static Sluice__V1__Snapshot *compile_ok(const sl_resource_set_t *set, const char *fleet)
{
    sl_errors_t errs;
    sl_errors_init(&errs);
    Sluice__V1__Snapshot *snap = sl_compile_snapshot(set, fleet, 42, &errs);
    if (!snap) {
        char *s = sl_errors_format(&errs);
        fail_msg("compile failed: %s", s);
    }
    assert_int_equal(errs.count, 0);
    sl_errors_free(&errs);
    return snap;
}

/* Compiles a set that must fail; returns the formatted errors. */
static char *compile_error(const sl_resource_set_t *set, const char *fleet)
{
    sl_errors_t errs;
    sl_errors_init(&errs);
    Sluice__V1__Snapshot *snap = sl_compile_snapshot(set, fleet, 1, &errs);
    assert_null(snap);
    char *s = sl_errors_format(&errs);
    sl_errors_free(&errs);
    return s;
}

static void test_quickstart_field_by_field(void **state)
{
    (void)state;
    sl_resource_set_t set;
    load(&set, "examples/quickstart.yaml");
    Sluice__V1__Snapshot *snap = compile_ok(&set, "default");

    assert_int_equal(snap->version, 42);
    assert_string_equal(snap->fleet, "default");

    assert_int_equal(snap->n_listeners, 1);
    assert_string_equal(snap->listeners[0]->name, "http");
    assert_string_equal(snap->listeners[0]->address, "0.0.0.0");
    assert_int_equal(snap->listeners[0]->port, 8080);
    assert_int_equal(snap->listeners[0]->protocol, SLUICE__V1__LISTENER__PROTOCOL__HTTP);

    /* Gateway defaults. */
    Sluice__V1__GatewaySettings *gs = snap->settings;
    assert_non_null(gs);
    assert_non_null(gs->limits);
    assert_int_equal(gs->limits->max_request_line_bytes, 8192);
    assert_int_equal(gs->limits->max_header_bytes, 32768);
    assert_int_equal(gs->limits->max_header_count, 100);
    assert_int_equal(gs->limits->max_request_body_bytes, 0);
    assert_int_equal(gs->limits->max_connections, 0);
    assert_non_null(gs->timeouts);
    assert_int_equal(gs->timeouts->request_header_ms, 10000);
    assert_int_equal(gs->timeouts->idle_ms, 60000);
    assert_int_equal(gs->timeouts->request_ms, 0);
    assert_int_equal(gs->timeouts->upstream_connect_ms, 5000);
    assert_int_equal(gs->timeouts->upstream_response_ms, 30000);
    assert_false(gs->add_via);
    assert_non_null(gs->path_normalization);
    assert_false(gs->path_normalization->merge_slashes);
    assert_int_equal(gs->path_normalization->encoded_slashes,
                     SLUICE__V1__PATH_NORMALIZATION__ENCODED_SLASHES__SLASHES_REJECT);

    assert_int_equal(snap->n_clusters, 1);
    Sluice__V1__Cluster *cl = snap->clusters[0];
    assert_string_equal(cl->name, "default/echo");
    assert_int_equal(cl->n_endpoints, 1);
    assert_string_equal(cl->endpoints[0]->address, "127.0.0.1");
    assert_int_equal(cl->endpoints[0]->port, 9001);
    assert_int_equal(cl->endpoints[0]->weight, 1);
    assert_int_equal(cl->lb_policy, SLUICE__V1__CLUSTER__LB_POLICY__ROUND_ROBIN);
    assert_int_equal(cl->hash_on, SLUICE__V1__CLUSTER__HASH_ON__HASH_NONE);
    assert_null(cl->health_check);
    assert_non_null(cl->outlier);
    assert_int_equal(cl->outlier->consecutive_failures, 5);
    assert_int_equal(cl->outlier->base_ejection_ms, 30000);
    assert_int_equal(cl->outlier->max_ejection_percent, 50);
    assert_non_null(cl->pool);
    assert_int_equal(cl->pool->max_connections, 0);
    assert_int_equal(cl->pool->max_idle, 1024);
    assert_int_equal(cl->pool->idle_timeout_ms, 60000);
    assert_int_equal(cl->connect_timeout_ms, 5000);
    assert_string_equal(cl->host_rewrite, "");

    assert_int_equal(snap->n_route_tables, 1);
    Sluice__V1__RouteTable *t = snap->route_tables[0];
    assert_string_equal(t->name, "default/petstore");
    assert_int_equal(t->n_hosts, 1);
    assert_string_equal(t->hosts[0], "*");
    assert_string_equal(t->base_path, "/petstore/v1");
    assert_true(t->strip_base_path);
    assert_string_equal(t->version, "");
    assert_int_equal(t->n_backends, 1);
    assert_string_equal(t->backends[0]->cluster, "default/echo");
    assert_int_equal(t->backends[0]->weight, 1);
    assert_non_null(t->timeouts);
    assert_int_equal(t->timeouts->request_header_ms, 10000);
    assert_int_equal(t->timeouts->idle_ms, 60000);
    assert_int_equal(t->timeouts->request_ms, 0);
    assert_int_equal(t->timeouts->upstream_connect_ms, 0); /* the cluster's applies */
    assert_int_equal(t->timeouts->upstream_response_ms, 30000);
    assert_non_null(t->retry);
    assert_int_equal(t->retry->attempts, 1);
    assert_true(t->retry->on_connect_failure);
    assert_true(t->retry->on_reset);
    /* 503 (an origin shedding load) is not retried by default. */
    assert_int_equal(t->retry->n_on_status, 2);
    assert_int_equal(t->retry->on_status[0], 502);
    assert_int_equal(t->retry->on_status[1], 504);
    assert_false(t->retry->non_idempotent);
    assert_int_equal(t->retry->budget_percent, 20);
    assert_int_equal(t->retry->min_retry_concurrency, 3);
    assert_int_equal(t->retry->per_try_timeout_ms, 0);
    assert_int_equal(t->max_request_body_bytes, 0);

    assert_int_equal(t->n_routes, 3);
    const char *names[] = {"GET /pets", "GET /pets/{id}", "POST /pets"};
    const char *methods[] = {"GET", "GET", "POST"};
    const char *paths[] = {"/pets", "/pets/{id}", "/pets"};
    int kinds[] = {SLUICE__V1__ROUTE__PATH_KIND__EXACT, SLUICE__V1__ROUTE__PATH_KIND__TEMPLATE,
                   SLUICE__V1__ROUTE__PATH_KIND__EXACT};
    for (size_t i = 0; i < 3; i++) {
        Sluice__V1__Route *r = t->routes[i];
        assert_string_equal(r->name, names[i]);
        assert_int_equal(r->n_methods, 1);
        assert_string_equal(r->methods[0], methods[i]);
        assert_int_equal(r->path_kind, kinds[i]);
        assert_string_equal(r->path, paths[i]);
        assert_int_equal(r->n_headers, 0);
        assert_int_equal(r->n_query, 0);
        assert_int_equal(r->n_backends, 0); /* the table's */
        assert_non_null(r->timeouts);
        assert_int_equal(r->timeouts->upstream_response_ms, 30000);
        assert_non_null(r->retry);
        assert_int_equal(r->retry->attempts, 1);
    }
    sl_snapshot_free(snap);
    sl_resource_set_free(&set);
}

static void test_full_example_and_precedence(void **state)
{
    (void)state;
    sl_resource_set_t set;
    load(&set, "tests/data/model/full.yaml");
    Sluice__V1__Snapshot *snap = compile_ok(&set, "edge");

    assert_int_equal(snap->n_listeners, 2);
    assert_string_equal(snap->listeners[0]->address, "127.0.0.1");
    assert_int_equal(snap->listeners[0]->port, 8081);
    assert_string_equal(snap->listeners[1]->name, "alt");
    assert_string_equal(snap->listeners[1]->address, "::1");

    Sluice__V1__GatewaySettings *gs = snap->settings;
    assert_int_equal(gs->limits->max_request_line_bytes, 4096);
    assert_int_equal(gs->limits->max_header_bytes, 16384);
    assert_int_equal(gs->limits->max_header_count, 50);
    assert_int_equal(gs->limits->max_request_body_bytes, 1048576);
    assert_int_equal(gs->limits->max_connections, 1000);
    assert_int_equal(gs->timeouts->request_header_ms, 5000);
    assert_int_equal(gs->timeouts->idle_ms, 120000);
    assert_int_equal(gs->timeouts->request_ms, 3600000);
    assert_int_equal(gs->timeouts->upstream_connect_ms, 250);
    assert_int_equal(gs->timeouts->upstream_response_ms, 15000);
    assert_true(gs->add_via);

    assert_int_equal(snap->n_clusters, 2);
    Sluice__V1__Cluster *pets = snap->clusters[0];
    assert_string_equal(pets->name, "prod/pets");
    assert_int_equal(pets->n_endpoints, 2);
    assert_int_equal(pets->endpoints[0]->weight, 3);
    assert_string_equal(pets->endpoints[1]->address, "pets.internal.example.com");
    assert_int_equal(pets->endpoints[1]->weight, 1);
    assert_int_equal(pets->lb_policy, SLUICE__V1__CLUSTER__LB_POLICY__CONSISTENT_HASH);
    assert_int_equal(pets->hash_on, SLUICE__V1__CLUSTER__HASH_ON__HASH_HEADER);
    assert_string_equal(pets->hash_key, "X-User");
    assert_non_null(pets->health_check);
    assert_string_equal(pets->health_check->path, "/healthz");
    assert_int_equal(pets->health_check->interval_ms, 10000);
    assert_int_equal(pets->health_check->timeout_ms, 1000);
    assert_int_equal(pets->health_check->healthy_threshold, 3);
    assert_int_equal(pets->health_check->unhealthy_threshold, 4);
    assert_int_equal(pets->health_check->expected_status_min, 200);
    assert_int_equal(pets->health_check->expected_status_max, 299);
    assert_string_equal(pets->health_check->host, "health.local");
    assert_null(pets->health_check->grpc); /* an HTTP check */
    assert_int_equal(pets->outlier->consecutive_failures, 7);
    assert_int_equal(pets->outlier->base_ejection_ms, 10000);
    assert_int_equal(pets->outlier->max_ejection_percent, 30);
    assert_int_equal(pets->pool->max_connections, 100);
    assert_int_equal(pets->pool->max_idle, 8);
    assert_int_equal(pets->pool->idle_timeout_ms, 30000);
    assert_int_equal(pets->connect_timeout_ms, 2000);
    assert_string_equal(pets->host_rewrite, "pets.internal:8000");
    Sluice__V1__Cluster *audit = snap->clusters[1];
    assert_int_equal(audit->lb_policy, SLUICE__V1__CLUSTER__LB_POLICY__LEAST_REQUEST);
    assert_int_equal(audit->connect_timeout_ms, 250); /* no Backend value: the Gateway's */

    Sluice__V1__RouteTable *t = snap->route_tables[0];
    assert_string_equal(t->name, "prod/pets");
    assert_int_equal(t->n_hosts, 2);
    assert_string_equal(t->hosts[1], "*.pets.example.com");
    assert_false(t->strip_base_path);
    assert_string_equal(t->version, "v2");
    assert_int_equal(t->n_backends, 2);
    assert_string_equal(t->backends[0]->cluster, "prod/pets");
    assert_int_equal(t->backends[0]->weight, 9);
    assert_int_equal(t->backends[1]->weight, 1);
    /* Api > Gateway */
    assert_int_equal(t->timeouts->request_ms, 20000);
    assert_int_equal(t->timeouts->upstream_response_ms, 10000);
    assert_int_equal(t->timeouts->upstream_connect_ms, 0);
    assert_int_equal(t->timeouts->request_header_ms, 5000);
    assert_int_equal(t->timeouts->idle_ms, 120000);
    assert_int_equal(t->retry->attempts, 2);
    assert_true(t->retry->on_connect_failure);
    assert_false(t->retry->on_reset); /* `on` replaces the whole list */
    assert_int_equal(t->retry->n_on_status, 2);
    assert_int_equal(t->retry->on_status[0], 503);
    assert_int_equal(t->retry->on_status[1], 500);
    assert_int_equal(t->retry->budget_percent, 10);
    assert_int_equal(t->retry->min_retry_concurrency, 3);
    assert_int_equal(t->max_request_body_bytes, 65536);

    assert_int_equal(t->n_routes, 5);
    Sluice__V1__Route *list = t->routes[0];
    assert_string_equal(list->name, "list-pets");
    assert_int_equal(list->n_query, 1);
    assert_string_equal(list->query[0]->name, "limit");
    assert_int_equal(list->query[0]->kind, SLUICE__V1__HEADER_MATCH__KIND__PRESENT);
    /* Inherited from the table. */
    assert_int_equal(list->timeouts->request_ms, 20000);
    assert_int_equal(list->retry->attempts, 2);
    assert_int_equal(list->max_request_body_bytes, 65536);

    Sluice__V1__Route *get = t->routes[1];
    assert_string_equal(get->name, "GET,HEAD /pets/{petId}");
    assert_int_equal(get->n_methods, 2);
    assert_string_equal(get->methods[0], "GET"); /* upper-cased */
    assert_string_equal(get->methods[1], "HEAD");
    assert_int_equal(get->path_kind, SLUICE__V1__ROUTE__PATH_KIND__TEMPLATE);
    assert_int_equal(get->n_headers, 2);
    assert_string_equal(get->headers[0]->name, "X-Version");
    assert_string_equal(get->headers[0]->value, "^v[0-9]+$");
    assert_int_equal(get->headers[0]->kind, SLUICE__V1__HEADER_MATCH__KIND__REGEX);
    assert_false(get->headers[0]->invert);
    assert_int_equal(get->headers[1]->kind, SLUICE__V1__HEADER_MATCH__KIND__PRESENT);
    assert_true(get->headers[1]->invert);

    /* Operation > Api > Gateway */
    Sluice__V1__Route *post = t->routes[2];
    assert_int_equal(post->n_backends, 1);
    assert_string_equal(post->backends[0]->cluster, "prod/audit");
    assert_int_equal(post->backends[0]->weight, 2);
    assert_int_equal(post->timeouts->request_ms, 5000);
    assert_int_equal(post->timeouts->upstream_connect_ms, 100);
    assert_int_equal(post->timeouts->upstream_response_ms, 4000);
    assert_int_equal(post->retry->attempts, 0);
    assert_true(post->retry->non_idempotent);
    assert_int_equal(post->retry->per_try_timeout_ms, 1000);
    assert_int_equal(post->retry->min_retry_concurrency, 1);
    assert_int_equal(post->retry->budget_percent, 10); /* from the Api */
    assert_int_equal(post->retry->n_on_status, 2);     /* from the Api */
    assert_int_equal(post->max_request_body_bytes, 1024);

    Sluice__V1__Route *any = t->routes[3];
    assert_string_equal(any->name, "* /static");
    assert_int_equal(any->n_methods, 0);
    assert_int_equal(any->path_kind, SLUICE__V1__ROUTE__PATH_KIND__PREFIX);
    assert_int_equal(t->routes[4]->path_kind, SLUICE__V1__ROUTE__PATH_KIND__REGEX);

    sl_snapshot_free(snap);

    /* The default fleet has no Gateway in this set: no listeners, default
     * settings, the same Apis and Backends. */
    snap = compile_ok(&set, NULL);
    assert_string_equal(snap->fleet, "default");
    assert_int_equal(snap->n_listeners, 0);
    assert_int_equal(snap->settings->limits->max_header_count, 100);
    assert_int_equal(snap->n_clusters, 2);
    assert_int_equal(snap->clusters[1]->connect_timeout_ms, 5000);
    assert_int_equal(snap->n_route_tables, 1);
    sl_snapshot_free(snap);
    sl_resource_set_free(&set);
}

/* Gateway pathNormalization: each value reaches the snapshot, defaults
 * fill what is not written, and it comes from the first Gateway by name like
 * the other settings. */
static void test_gateway_path_normalization(void **state)
{
    (void)state;
    static const struct {
        const char *yaml;
        bool merge;
        int slashes;
    } cases[] = {
        {"", false, SLUICE__V1__PATH_NORMALIZATION__ENCODED_SLASHES__SLASHES_REJECT},
        {"  pathNormalization: {}\n", false,
         SLUICE__V1__PATH_NORMALIZATION__ENCODED_SLASHES__SLASHES_REJECT},
        {"  pathNormalization: {mergeSlashes: true}\n", true,
         SLUICE__V1__PATH_NORMALIZATION__ENCODED_SLASHES__SLASHES_REJECT},
        {"  pathNormalization: {encodedSlashes: keep}\n", false,
         SLUICE__V1__PATH_NORMALIZATION__ENCODED_SLASHES__SLASHES_KEEP},
        {"  pathNormalization: {encodedSlashes: decode, mergeSlashes: true}\n", true,
         SLUICE__V1__PATH_NORMALIZATION__ENCODED_SLASHES__SLASHES_DECODE},
        {"  pathNormalization: {encodedSlashes: reject, mergeSlashes: false}\n", false,
         SLUICE__V1__PATH_NORMALIZATION__ENCODED_SLASHES__SLASHES_REJECT},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char text[512];
        snprintf(text, sizeof(text),
                 HEAD "kind: Gateway\nmetadata: {name: g}\nspec:\n"
                      "  listeners: [{name: web, port: 8080}]\n%s",
                 cases[i].yaml);
        sl_resource_set_t set;
        sl_resource_set_init(&set);
        parse(&set, "gw.yaml", text);
        Sluice__V1__Snapshot *snap = compile_ok(&set, "default");
        /* What a runtime receives: through the wire format. */
        size_t len;
        uint8_t *wire = sl_snapshot_pack(snap, &len);
        assert_non_null(wire);
        Sluice__V1__Snapshot *back = sl_snapshot_unpack(wire, len);
        assert_non_null(back);
        free(wire);
        Sluice__V1__Snapshot *both[] = {snap, back};
        for (int k = 0; k < 2; k++) {
            const Sluice__V1__PathNormalization *pn = both[k]->settings->path_normalization;
            if (!pn)
                fail_msg("case %zu: no path_normalization (%s)", i, k ? "unpacked" : "built");
            assert_int_equal(pn->merge_slashes, cases[i].merge);
            assert_int_equal(pn->encoded_slashes, cases[i].slashes);
        }
        sl_snapshot_free(back);
        sl_snapshot_free(snap);
        sl_resource_set_free(&set);
    }

    sl_resource_set_t set;
    sl_resource_set_init(&set);
    parse(&set, "gw.yaml",
          HEAD "kind: Gateway\nmetadata: {name: b}\nspec:\n"
               "  listeners: [{name: web2, port: 8081}]\n"
               "  pathNormalization: {encodedSlashes: decode}\n---\n" HEAD
               "kind: Gateway\nmetadata: {name: a}\nspec:\n"
               "  listeners: [{name: web1, port: 8080}]\n"
               "  pathNormalization: {encodedSlashes: keep, mergeSlashes: true}\n");
    Sluice__V1__Snapshot *snap = compile_ok(&set, "default");
    assert_int_equal(snap->settings->path_normalization->encoded_slashes,
                     SLUICE__V1__PATH_NORMALIZATION__ENCODED_SLASHES__SLASHES_KEEP);
    assert_true(snap->settings->path_normalization->merge_slashes);
    sl_snapshot_free(snap);
    /* No Gateway in the fleet: the defaults. */
    snap = compile_ok(&set, "elsewhere");
    assert_non_null(snap->settings->path_normalization);
    assert_int_equal(snap->settings->path_normalization->encoded_slashes,
                     SLUICE__V1__PATH_NORMALIZATION__ENCODED_SLASHES__SLASHES_REJECT);
    assert_false(snap->settings->path_normalization->merge_slashes);
    sl_snapshot_free(snap);
    sl_resource_set_free(&set);
}

static void test_upgrades_resolved_per_route(void **state)
{
    (void)state;
    sl_resource_set_t set;
    sl_resource_set_init(&set);
    parse(&set, "a.yaml",
          HEAD "kind: Backend\nmetadata: {name: b}\nspec:\n  endpoints: [{address: 127.0.0.1, "
               "port: 1}]\n---\n" HEAD
               "kind: Api\nmetadata: {name: a}\nspec:\n  backendRefs: [{name: b}]\n"
               "  upgrades: [{type: My-Proto}]\n  timeouts: {tunnelIdle: 30s}\n"
               "  operations:\n"
               "  - {name: plain, method: GET, path: /plain, upgrades: [{type: websocket, "
               "enabled: false}]}\n"
               "  - {name: all, method: GET, path: /all, timeouts: {tunnelIdle: 5s}}\n"
               "  - {name: noproto, method: GET, path: /np, upgrades: [{type: my-proto, enabled: "
               "false}]}\n");
    Sluice__V1__Snapshot *snap = compile_ok(&set, "default");
    Sluice__V1__RouteTable *t = snap->route_tables[0];
    assert_int_equal(t->n_routes, 3);
    /* websocket off, the Api's my-proto (lower-cased) on */
    assert_int_equal(t->routes[0]->n_upgrades, 1);
    assert_string_equal(t->routes[0]->upgrades[0], "my-proto");
    assert_int_equal(t->routes[0]->tunnel_idle_ms, 30000);
    assert_int_equal(t->routes[1]->n_upgrades, 2);
    assert_string_equal(t->routes[1]->upgrades[0], "websocket");
    assert_string_equal(t->routes[1]->upgrades[1], "my-proto");
    assert_int_equal(t->routes[1]->tunnel_idle_ms, 5000);
    assert_int_equal(t->routes[2]->n_upgrades, 1);
    assert_string_equal(t->routes[2]->upgrades[0], "websocket");
    sl_snapshot_free(snap);
    sl_resource_set_free(&set);
    /* Defaults: websocket only, an hour of idle. */
    sl_resource_set_init(&set);
    load(&set, "examples/quickstart.yaml");
    snap = compile_ok(&set, "default");
    assert_int_equal(snap->route_tables[0]->routes[0]->n_upgrades, 1);
    assert_string_equal(snap->route_tables[0]->routes[0]->upgrades[0], "websocket");
    assert_int_equal(snap->route_tables[0]->routes[0]->tunnel_idle_ms, 3600000);
    sl_snapshot_free(snap);
    sl_resource_set_free(&set);
}

static void test_missing_backend_reference(void **state)
{
    (void)state;
    sl_resource_set_t set;
    sl_resource_set_init(&set);
    parse(&set, "petstore.yaml",
          HEAD "kind: Backend\nmetadata: {name: echo, namespace: other}\n"
               "spec: {endpoints: [{address: 127.0.0.1, port: 9001}]}\n---\n" HEAD
               "kind: Api\nmetadata: {name: petstore}\nspec:\n"
               "  backendRefs: [{name: echo}]\n"
               "  operations:\n  - {method: GET, path: /a}\n"
               "  - {method: GET, path: /b, backendRefs: [{name: echo}, {name: gone}]}\n");
    char *s = compile_error(&set, "default");
    /* The Backend exists, but in another namespace: references stay inside
     * the Api's namespace. */
    assert_string_equal(s, "petstore.yaml doc 2: spec.backendRefs[0].name: Backend "
                           "\"default/echo\" not found\n"
                           "petstore.yaml doc 2: spec.operations[1].backendRefs[0].name: Backend "
                           "\"default/echo\" not found\n"
                           "petstore.yaml doc 2: spec.operations[1].backendRefs[1].name: Backend "
                           "\"default/gone\" not found\n");
    free(s);
    sl_resource_set_free(&set);
}

static void test_h2c_listener(void **state)
{
    (void)state;
    sl_resource_set_t set;
    sl_resource_set_init(&set);
    /* h2c: HTTP/2 with prior knowledge (and HTTP/1.1) on a plain port. */
    parse(&set, "gw.yaml",
          HEAD "kind: Gateway\nmetadata: {name: g}\nspec:\n"
               "  listeners: [{name: a, port: 80}, {name: b, port: 8081, protocol: h2c}]\n");
    Sluice__V1__Snapshot *snap = compile_ok(&set, "default");
    assert_int_equal(snap->n_listeners, 2);
    assert_int_equal(snap->listeners[0]->protocol, SLUICE__V1__LISTENER__PROTOCOL__HTTP);
    assert_int_equal(snap->listeners[1]->protocol, SLUICE__V1__LISTENER__PROTOCOL__H2C);
    assert_null(snap->listeners[1]->tls);
    sl_snapshot_free(snap);
    sl_resource_set_free(&set);
}

/* http2: the fields written, durations in ms, 0 for the rest (the codec's
 * defaults); no http2 block, no message. */
static void test_listener_http2(void **state)
{
    (void)state;
    sl_resource_set_t set;
    sl_resource_set_init(&set);
    parse(&set, "gw.yaml",
          HEAD "kind: Gateway\nmetadata: {name: g}\nspec:\n"
               "  listeners:\n"
               "  - {name: a, port: 8081, protocol: h2c}\n"
               "  - name: b\n    port: 8082\n    protocol: h2c\n"
               "    http2: {maxConcurrentStreams: 5, maxHeaderListBytes: 2048,\n"
               "            maxResetStreamsPerWindow: 20, resetWindow: 2s, controlWindow: 1500,\n"
               "            streamSendBufferBytes: 32768, connectionSendBufferBytes: 65536}\n");
    Sluice__V1__Snapshot *snap = compile_ok(&set, "default");
    assert_int_equal(snap->n_listeners, 2);
    assert_null(snap->listeners[0]->http2);
    const Sluice__V1__ListenerHttp2 *h = snap->listeners[1]->http2;
    assert_non_null(h);
    assert_int_equal(h->max_concurrent_streams, 5);
    assert_int_equal(h->max_header_list_bytes, 2048);
    assert_int_equal(h->max_reset_streams_per_window, 20);
    assert_int_equal(h->reset_window_ms, 2000);
    assert_int_equal(h->control_window_ms, 1500);
    assert_int_equal(h->stream_send_buffer_bytes, 32768);
    assert_int_equal(h->connection_send_buffer_bytes, 65536);
    assert_int_equal(h->initial_stream_window_bytes, 0);
    assert_int_equal(h->initial_connection_window_bytes, 0);
    assert_int_equal(h->max_header_fields, 0);
    assert_int_equal(h->max_continuation_frames, 0);
    assert_int_equal(h->header_table_bytes, 0);
    assert_int_equal(h->max_control_frames_per_window, 0);
    assert_int_equal(h->max_empty_data_frames, 0);
    sl_snapshot_free(snap);
    sl_resource_set_free(&set);
}

static void test_gateways_of_a_fleet_merge(void **state)
{
    (void)state;
    sl_resource_set_t set;
    sl_resource_set_init(&set);
    /* "b" comes first in the file, but settings come from "a" (name order). */
    parse(&set, "gw.yaml",
          HEAD "kind: Gateway\nmetadata: {name: b}\nspec:\n"
               "  listeners: [{name: web2, port: 8081}]\n  via: false\n---\n" HEAD
               "kind: Gateway\nmetadata: {name: a}\nspec:\n"
               "  listeners: [{name: web1, port: 8080}]\n  via: true\n---\n" HEAD
               "kind: Gateway\nmetadata: {name: c}\nspec:\n  fleet: other\n"
               "  listeners: [{name: web3, port: 8080}]\n");
    Sluice__V1__Snapshot *snap = compile_ok(&set, "default");
    assert_int_equal(snap->n_listeners, 2);
    assert_string_equal(snap->listeners[0]->name, "web1");
    assert_string_equal(snap->listeners[1]->name, "web2");
    assert_true(snap->settings->add_via);
    sl_snapshot_free(snap);

    snap = compile_ok(&set, "other");
    assert_int_equal(snap->n_listeners, 1);
    assert_string_equal(snap->listeners[0]->name, "web3");
    assert_false(snap->settings->add_via);
    sl_snapshot_free(snap);

    parse(&set, "more.yaml",
          HEAD "kind: Gateway\nmetadata: {name: d}\nspec:\n"
               "  listeners: [{name: web4, port: 8080, address: 127.0.0.1}, {name: web2, port: "
               "9000}]\n");
    char *s = compile_error(&set, "default");
    assert_string_equal(s, "more.yaml doc 1: spec.listeners[0].port: 127.0.0.1:8080 conflicts "
                           "with listener 'web1' (0.0.0.0:8080) of Gateway default/a (gw.yaml "
                           "doc 2)\n"
                           "more.yaml doc 1: spec.listeners[1].name: listener name 'web2' is also "
                           "used by Gateway default/b (gw.yaml doc 1)\n");
    free(s);
    sl_resource_set_free(&set);
}

static void test_pack_unpack_round_trip(void **state)
{
    (void)state;
    sl_resource_set_t set;
    load(&set, "tests/data/model/full.yaml");
    Sluice__V1__Snapshot *snap = compile_ok(&set, "edge");
    size_t len = 0, len2 = 0;
    uint8_t *wire = sl_snapshot_pack(snap, &len);
    assert_non_null(wire);
    assert_true(len > 100);
    Sluice__V1__Snapshot *back = sl_snapshot_unpack(wire, len);
    assert_non_null(back);
    assert_int_equal(back->version, 42);
    assert_string_equal(back->route_tables[0]->routes[1]->headers[0]->value, "^v[0-9]+$");
    assert_int_equal(back->clusters[0]->health_check->expected_status_max, 299);
    uint8_t *wire2 = sl_snapshot_pack(back, &len2);
    assert_int_equal(len, len2);
    assert_memory_equal(wire, wire2, len);
    free(wire2);
    sl_snapshot_free(back);

    /* Truncated or garbage input is refused, not half-read. */
    assert_null(sl_snapshot_unpack(wire, len - 1));
    const uint8_t garbage[] = {0x1a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x00};
    assert_null(sl_snapshot_unpack(garbage, sizeof(garbage)));
    free(wire);
    sl_snapshot_free(snap);
    sl_snapshot_free(NULL);
    sl_resource_set_free(&set);
}

/* The example: an https listener naming two Certificates. The
 * snapshot carries exactly the referenced ones, every tls default applied. */
static void test_https_listener(void **state)
{
    (void)state;
    tc_pair_t a, b, c;
    tc_make(&a, TC_EC256, "a.example", "a.example", -3600, 86400, NULL, false);
    tc_make(&b, TC_RSA2048, "b.example", "b.example,*.b.example", -3600, 86400, NULL, false);
    tc_make(&c, TC_EC256, "c.example", "c.example", -3600, 86400, NULL, false);
    char *da = tc_certificate_doc("a-example", a.cert_pem, a.key_pem);
    char *db = tc_certificate_doc("b-example", b.cert_pem, b.key_pem);
    char *dc = tc_certificate_doc("unused", c.cert_pem, c.key_pem);
    sl_resource_set_t set;
    sl_resource_set_init(&set);
    parse(&set, "gw.yaml",
          HEAD "kind: Gateway\nmetadata: {name: default}\nspec:\n  listeners:\n"
               "  - name: https\n    port: 8443\n    protocol: https\n    tls:\n"
               "      certificateRefs: [{name: a-example}, {name: b-example}]\n"
               "  - name: mtls\n    port: 9443\n    protocol: https\n    tls:\n"
               "      certificateRefs: [{name: b-example}]\n      minVersion: \"1.3\"\n"
               "      alpn: [http/1.1]\n      sessionTickets: {enabled: false, rotation: 1h}\n"
               "      sessionCache: {size: 100}\n      ocspStapleFile: /o.der\n"
               "      clientAuth: {caFile: /ca.pem, mode: optional, verifyDepth: 5}\n");
    parse(&set, "a.yaml", da);
    parse(&set, "b.yaml", db);
    parse(&set, "c.yaml", dc);
    Sluice__V1__Snapshot *snap = compile_ok(&set, "default");
    assert_int_equal(snap->n_listeners, 2);
    Sluice__V1__Listener *l = snap->listeners[0];
    assert_int_equal(l->protocol, SLUICE__V1__LISTENER__PROTOCOL__HTTPS);
    assert_non_null(l->tls);
    assert_int_equal(l->tls->n_certificates, 2);
    assert_string_equal(l->tls->certificates[0], "default/a-example");
    assert_string_equal(l->tls->certificates[1], "default/b-example");
    assert_int_equal(l->tls->min_version, SLUICE__V1__LISTENER_TLS__VERSION__TLS1_2);
    assert_int_equal(l->tls->n_alpn, 2);
    assert_string_equal(l->tls->alpn[0], "h2");
    assert_string_equal(l->tls->alpn[1], "http/1.1");
    assert_true(l->tls->session_tickets);
    assert_int_equal(l->tls->ticket_rotation_s, 12 * 3600);
    assert_true(l->tls->session_cache);
    assert_int_equal(l->tls->session_cache_size, 20480);
    assert_int_equal(l->tls->client_auth, SLUICE__V1__LISTENER_TLS__CLIENT_AUTH__CLIENT_AUTH_NONE);
    assert_string_equal(l->tls->groups, "X25519:P-256:P-384");
    assert_non_null(strstr(l->tls->cipher_suites, "TLS_AES_128_GCM_SHA256"));
    assert_non_null(strstr(l->tls->ciphers, "ECDHE-ECDSA-AES128-GCM-SHA256"));

    Sluice__V1__ListenerTls *m = snap->listeners[1]->tls;
    assert_int_equal(m->min_version, SLUICE__V1__LISTENER_TLS__VERSION__TLS1_3);
    assert_int_equal(m->n_alpn, 1);
    assert_false(m->session_tickets);
    assert_int_equal(m->ticket_rotation_s, 3600);
    assert_int_equal(m->session_cache_size, 100);
    assert_string_equal(m->ocsp_staple_file, "/o.der");
    assert_int_equal(m->client_auth, SLUICE__V1__LISTENER_TLS__CLIENT_AUTH__CLIENT_AUTH_OPTIONAL);
    assert_string_equal(m->client_ca_file, "/ca.pem");
    assert_int_equal(m->verify_depth, 5);

    /* Two certificates, not three: "unused" is named by no listener and its
     * key must not travel. b-example is named twice but carried once. */
    assert_int_equal(snap->n_certificates, 2);
    Sluice__V1__TlsCertificate *ca = snap->certificates[0], *cb = snap->certificates[1];
    assert_string_equal(ca->name, "default/a-example");
    assert_string_equal(cb->name, "default/b-example");
    assert_string_equal(ca->chain_pem, a.cert_pem);
    assert_string_equal(ca->private_key_pem, a.key_pem);
    assert_int_equal(cb->n_names, 2);
    assert_string_equal(cb->names[1], "*.b.example");
    assert_int_equal(strlen(ca->sha256_fingerprint), 64);
    assert_true(ca->not_after_unix > 0);
    sl_snapshot_free(snap);
    sl_resource_set_free(&set);
    free(da);
    free(db);
    free(dc);
    tc_free(&a);
    tc_free(&b);
    tc_free(&c);
}

static void test_https_certificate_refs(void **state)
{
    (void)state;
    sl_resource_set_t set;
    sl_resource_set_init(&set);
    parse(&set, "gw.yaml",
          HEAD "kind: Gateway\nmetadata: {name: g, namespace: edge}\nspec:\n  listeners:\n"
               "  - {name: web, port: 8443, protocol: https, tls: {certificateRefs: "
               "[{name: missing}, {name: k8s}, {name: from-file}]}}\n");
    parse(&set, "c.yaml",
          HEAD "kind: Certificate\nmetadata: {name: k8s, namespace: edge}\n"
               "spec: {secretRef: {name: tls}}\n---\n" HEAD
               "kind: Certificate\nmetadata: {name: from-file, namespace: edge}\n"
               "spec: {file: {certificate: /c.pem, privateKey: /k.pem}}\n---\n" HEAD
               "kind: Certificate\nmetadata: {name: missing, namespace: other}\n"
               "spec: {file: {certificate: /c.pem, privateKey: /k.pem}}\n");
    char *s = compile_error(&set, "default");
    assert_string_equal(s, "gw.yaml doc 1: spec.listeners[0].tls.certificateRefs[0].name: "
                           "Certificate \"edge/missing\" not found\n"
                           "gw.yaml doc 1: spec.listeners[0].tls.certificateRefs[1].name: "
                           "Certificate \"edge/k8s\" uses secretRef, which needs "
                           "sluice-controller --source kubernetes; use certificate + privateKey, "
                           "or file\n"
                           "c.yaml doc 1: spec.secretRef: secretRef needs sluice-controller "
                           "--source kubernetes (it reads the Secret from the Kubernetes API "
                           "server); use certificate + privateKey, or file\n");
    free(s);
    sl_resource_set_free(&set);

    /* Two certificates for the same names and key type: one would never be
     * served. RSA next to ECDSA for the same names is the supported pair. */
    tc_pair_t e1, e2, r1;
    tc_make(&e1, TC_EC256, "d.example", "d.example", -3600, 86400, NULL, false);
    tc_make(&e2, TC_EC384, "d.example", "d.example", -3600, 86400, NULL, false);
    tc_make(&r1, TC_RSA2048, "d.example", "d.example", -3600, 86400, NULL, false);
    char *d1 = tc_certificate_doc("e1", e1.cert_pem, e1.key_pem);
    char *d2 = tc_certificate_doc("e2", e2.cert_pem, e2.key_pem);
    char *d3 = tc_certificate_doc("r1", r1.cert_pem, r1.key_pem);
    sl_resource_set_init(&set);
    parse(&set, "gw.yaml",
          HEAD "kind: Gateway\nmetadata: {name: g}\nspec:\n  listeners:\n"
               "  - {name: web, port: 8443, protocol: https, tls: {certificateRefs: "
               "[{name: e1}, {name: r1}, {name: e2}]}}\n");
    parse(&set, "1.yaml", d1);
    parse(&set, "2.yaml", d2);
    parse(&set, "3.yaml", d3);
    s = compile_error(&set, "default");
    assert_string_equal(s, "gw.yaml doc 1: spec.listeners[0].tls.certificateRefs[2].name: same "
                           "names and key type as certificateRefs[0]: a listener serves one "
                           "certificate per key type and name (remove one, or pair RSA with "
                           "ECDSA)\n");
    free(s);
    sl_resource_set_free(&set);
    sl_resource_set_init(&set);
    parse(&set, "gw.yaml",
          HEAD "kind: Gateway\nmetadata: {name: g}\nspec:\n  listeners:\n"
               "  - {name: web, port: 8443, protocol: https, tls: {certificateRefs: "
               "[{name: e1}, {name: r1}]}}\n");
    parse(&set, "1.yaml", d1);
    parse(&set, "3.yaml", d3);
    Sluice__V1__Snapshot *pair = compile_ok(&set, "default");
    assert_int_equal(pair->n_certificates, 2);
    sl_snapshot_free(pair);
    sl_resource_set_free(&set);
    free(d1);
    free(d2);
    free(d3);
    tc_free(&e1);
    tc_free(&e2);
    tc_free(&r1);

    /* File-based Certificates compile to paths the runtime reads. */
    sl_resource_set_init(&set);
    parse(&set, "gw.yaml",
          HEAD "kind: Gateway\nmetadata: {name: g}\nspec:\n  listeners:\n"
               "  - {name: web, port: 8443, protocol: https, tls: {certificateRefs: "
               "[{name: from-file}]}}\n---\n" HEAD
               "kind: Certificate\nmetadata: {name: from-file}\n"
               "spec: {file: {certificate: /c.pem, privateKey: /k.pem}}\n");
    Sluice__V1__Snapshot *snap = compile_ok(&set, "default");
    assert_int_equal(snap->n_certificates, 1);
    assert_string_equal(snap->certificates[0]->chain_file, "/c.pem");
    assert_string_equal(snap->certificates[0]->private_key_file, "/k.pem");
    assert_string_equal(snap->certificates[0]->private_key_pem, "");
    sl_snapshot_free(snap);
    sl_resource_set_free(&set);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quickstart_field_by_field),
        cmocka_unit_test(test_full_example_and_precedence),
        cmocka_unit_test(test_gateway_path_normalization),
        cmocka_unit_test(test_upgrades_resolved_per_route),
        cmocka_unit_test(test_missing_backend_reference),
        cmocka_unit_test(test_h2c_listener),
        cmocka_unit_test(test_listener_http2),
        cmocka_unit_test(test_https_listener),
        cmocka_unit_test(test_https_certificate_refs),
        cmocka_unit_test(test_gateways_of_a_fleet_merge),
        cmocka_unit_test(test_pack_unpack_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
