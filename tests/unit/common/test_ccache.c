/*
 * Unit tests of the per-resource compile cache (sl_compile_cached in
 * common/compiler.c): random sequences of edits (Gateways, Backends, Apis
 * that reference them or name missing ones, Consumers; added, modified,
 * deleted), and after each one the cached compile must equal a from-scratch
 * sl_compile_snapshot byte for byte (every resource's packed bytes, names,
 * hashes) or fail with the same errors; a second compile of the same set
 * compiles nothing; a Backend change recompiles exactly the Apis that
 * reference it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "compiler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEAD "apiVersion: gateway.sluice.dev/v1alpha1\n"

#define NGW 2
#define NB 5 /* b4 is never created: references to it fail */
#define NA 8
#define NC 3

/* The world: one validated document (or NULL) per slot. */
typedef struct {
    json_t *gw[NGW], *b[NB], *a[NA], *c[NC];
} world_t;

static json_t *parse_one(const char *text)
{
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    if (sl_model_parse(&set, text, strlen(text), "gen", &errs) != 0) {
        char *s = sl_errors_format(&errs);
        fail_msg("generated document is invalid: %s\n%s", s, text);
    }
    assert_int_equal(set.count, 1);
    json_t *doc = json_incref(set.items[0].obj);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
    return doc;
}

static json_t *gen_gateway(int i)
{
    char text[1024];
    snprintf(text, sizeof(text),
             HEAD "kind: Gateway\nmetadata: {name: gw%d}\nspec:\n  fleet: default\n"
                  "  listeners:\n  - {name: l%d, port: %d}\n"
                  "  timeouts: {upstreamResponse: %ds}\n"
                  "  limits: {maxRequestBodyBytes: %d}\n",
             i, i, 8080 + i, 1 + rand() % 5, 1000 * (1 + rand() % 3));
    return parse_one(text);
}

static json_t *gen_backend(int i)
{
    char text[1024];
    int n = snprintf(text, sizeof(text),
                     HEAD "kind: Backend\nmetadata: {name: b%d}\nspec:\n"
                          "  endpoints:\n  - {address: 127.0.0.1, port: %d}\n",
                     i, 9000 + rand() % 4);
    if (rand() % 2)
        snprintf(text + n, sizeof(text) - (size_t)n, "  timeouts: {connect: %ds}\n",
                 1 + rand() % 3);
    return parse_one(text);
}

/* A Backend to reference: now and then the one that never exists. */
static int bref(void)
{
    return rand() % 40 == 0 ? NB - 1 : rand() % (NB - 1);
}

static json_t *gen_api(int i)
{
    char text[4096];
    size_t n = (size_t)snprintf(text, sizeof(text),
                                HEAD "kind: Api\nmetadata: {name: a%d}\nspec:\n"
                                     "  basePath: /a%d\n  backendRefs: [{name: b%d}]\n",
                                i, i, bref());
    if (rand() % 3 == 0)
        n += (size_t)snprintf(text + n, sizeof(text) - n, "  timeouts: {request: %ds}\n",
                              1 + rand() % 9);
    n += (size_t)snprintf(text + n, sizeof(text) - n, "  operations:\n");
    int ops = 1 + rand() % 4;
    for (int k = 0; k < ops; k++) {
        n += (size_t)snprintf(text + n, sizeof(text) - n, "  - method: GET\n    path: /p%d-%d\n", k,
                              rand() % 3);
        if (rand() % 3 == 0)
            n += (size_t)snprintf(text + n, sizeof(text) - n,
                                  "    backendRefs: [{name: b%d, weight: %d}]\n", bref(),
                                  1 + rand() % 3);
        if (rand() % 5 == 0)
            n += (size_t)snprintf(text + n, sizeof(text) - n,
                                  "    mirror: {backend: b%d, percent: 10}\n", bref());
    }
    return parse_one(text);
}

static json_t *gen_consumer(int i)
{
    char text[1024], hex[65];
    for (int k = 0; k < 64; k++)
        hex[k] = "0123456789abcdef"[rand() % 16];
    hex[64] = '\0';
    snprintf(text, sizeof(text),
             HEAD "kind: Consumer\nmetadata: {name: c%d}\nspec:\n  group: g%d\n"
                  "  credentials:\n    apiKeys: [{name: k, keyHash: \"sha256:%s\"}]\n",
             i, rand() % 3, hex);
    return parse_one(text);
}

static void put(json_t **slot, json_t *doc)
{
    json_decref(*slot);
    *slot = doc;
}

/* The set in the store's order (kind, namespace, name) with the store's
 * sources. `hashed`: fill the content hashes as the store does. */
static void world_set(const world_t *w, sl_resource_set_t *set, int hashed)
{
    sl_resource_set_init(set);
    /* Kind names in strcmp order: Api, Backend, Consumer, Gateway. */
    struct {
        json_t *const *docs;
        int n;
        const char *plural;
    } kinds[] = {{w->a, NA, "apis"},
                 {w->b, NB, "backends"},
                 {w->c, NC, "consumers"},
                 {w->gw, NGW, "gateways"}};
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++)
        for (int i = 0; i < kinds[k].n; i++) {
            json_t *d = kinds[k].docs[i];
            if (!d)
                continue;
            char source[128];
            const char *name =
                json_string_value(json_object_get(json_object_get(d, "metadata"), "name"));
            snprintf(source, sizeof(source), "%s/default/%s", kinds[k].plural, name);
            assert_int_equal(sl_resource_set_add(set, d, source, 0), 0);
            if (hashed)
                set->items[set->count - 1].hash = sl_json_hash(d);
        }
}

static void world_free(world_t *w)
{
    for (int i = 0; i < NGW; i++)
        json_decref(w->gw[i]);
    for (int i = 0; i < NB; i++)
        json_decref(w->b[i]);
    for (int i = 0; i < NA; i++)
        json_decref(w->a[i]);
    for (int i = 0; i < NC; i++)
        json_decref(w->c[i]);
}

/* The cached compile of `set` equals the from-scratch one; returns how
 * many resources the cached one compiled (-1 when both failed). */
static long compare(const sl_resource_set_t *set, sl_ccache_t *cache)
{
    sl_errors_t e1, e2;
    sl_errors_init(&e1);
    sl_errors_init(&e2);
    Sluice__V1__Snapshot *snap = sl_compile_snapshot(set, "default", 0, &e1);
    sl_compiled_t comp;
    int rc = sl_compile_cached(set, "default", cache, &comp, &e2);
    char *t1 = sl_errors_format(&e1), *t2 = sl_errors_format(&e2);
    assert_string_equal(t1, t2);
    free(t1);
    free(t2);
    sl_errors_free(&e1);
    sl_errors_free(&e2);
    assert_int_equal(snap != NULL, rc == 0);
    long compiled = (long)comp.compiled;
    if (!snap)
        return -1;
    struct {
        size_t n;
        ProtobufCMessage **msgs;
    } want[SL_CRES__COUNT] = {
        {snap->n_clusters, (ProtobufCMessage **)snap->clusters},
        {snap->n_route_tables, (ProtobufCMessage **)snap->route_tables},
        {snap->n_consumers, (ProtobufCMessage **)snap->consumers},
    };
    for (int k = 0; k < SL_CRES__COUNT; k++) {
        assert_int_equal(comp.n[k], want[k].n);
        for (size_t i = 0; i < want[k].n; i++) {
            const char *name = k == SL_CRES_CLUSTER ? snap->clusters[i]->name
                               : k == SL_CRES_ROUTE ? snap->route_tables[i]->name
                                                    : snap->consumers[i]->name;
            sl_cres_t *fresh = sl_cres_from_message(name, want[k].msgs[i]);
            assert_non_null(fresh);
            assert_string_equal(comp.res[k][i]->name, fresh->name);
            assert_int_equal(comp.res[k][i]->len, fresh->len);
            assert_memory_equal(comp.res[k][i]->data, fresh->data, fresh->len);
            assert_int_equal(comp.res[k][i]->hash, fresh->hash);
            sl_cres_unref(fresh);
        }
    }
    /* The fleet-level part is compiled every time by the same code. */
    assert_int_equal(comp.snap->n_listeners, snap->n_listeners);
    assert_int_equal(comp.snap->n_certificates, snap->n_certificates);
    size_t l1 = 0, l2 = 0;
    uint8_t *w1 = NULL, *w2 = NULL;
    if (snap->settings) {
        w1 = malloc(protobuf_c_message_get_packed_size(&snap->settings->base) + 1);
        w2 = malloc(protobuf_c_message_get_packed_size(&comp.snap->settings->base) + 1);
        l1 = protobuf_c_message_pack(&snap->settings->base, w1);
        l2 = protobuf_c_message_pack(&comp.snap->settings->base, w2);
        assert_int_equal(l1, l2);
        assert_memory_equal(w1, w2, l1);
    }
    free(w1);
    free(w2);
    sl_compiled_free(&comp);
    sl_snapshot_free(snap);
    return compiled;
}

static void random_edits(unsigned seed, int steps)
{
    srand(seed);
    world_t w = {0};
    sl_ccache_t *cache = sl_ccache_new();
    assert_non_null(cache);
    put(&w.gw[0], gen_gateway(0));
    for (int i = 0; i < NB - 1; i++)
        put(&w.b[i], gen_backend(i));
    for (int i = 0; i < NA; i++)
        put(&w.a[i], gen_api(i));
    int ok = 0, failed = 0;
    for (int step = 0; step < steps; step++) {
        int what = rand() % 10;
        int del = rand() % 8 == 0;
        if (what == 0) {
            int i = rand() % NGW;
            put(&w.gw[i], del ? NULL : gen_gateway(i));
        } else if (what <= 3) {
            int i = rand() % (NB - 1);
            put(&w.b[i], del ? NULL : gen_backend(i));
        } else if (what <= 7) {
            int i = rand() % NA;
            put(&w.a[i], del ? NULL : gen_api(i));
        } else {
            int i = rand() % NC;
            put(&w.c[i], del ? NULL : gen_consumer(i));
        }
        sl_resource_set_t set;
        world_set(&w, &set, step % 2);
        long n = compare(&set, cache);
        if (n >= 0) {
            ok++;
            /* The same set again: nothing to compile. */
            assert_int_equal(compare(&set, cache), 0);
        } else {
            failed++;
        }
        if (getenv("CCACHE_VERBOSE"))
            printf("step %d: %s, compiled %ld\n", step, n >= 0 ? "ok" : "failed", n);
        sl_ccache_sweep(cache);
        sl_resource_set_free(&set);
    }
    /* Both outcomes were exercised. */
    assert_true(ok > steps / 10);
    assert_true(failed > 0);
    sl_ccache_free(cache);
    world_free(&w);
}

static void test_random_edits_equal_from_scratch(void **state)
{
    (void)state;
    for (unsigned seed = 1; seed <= 6; seed++)
        random_edits(seed, 150);
}

/* A Backend change recompiles the Backend and exactly the Apis that look it
 * up (by backendRefs at either level or by a mirror); a Gateway change
 * every table and cluster but no Consumer; a Consumer change only itself. */
static void test_backend_change_recompiles_its_apis(void **state)
{
    (void)state;
    world_t w = {0};
    put(&w.gw[0], parse_one(HEAD "kind: Gateway\nmetadata: {name: gw0}\nspec:\n"
                                 "  listeners:\n  - {name: http, port: 8080}\n"));
    put(&w.b[0], parse_one(HEAD "kind: Backend\nmetadata: {name: b0}\nspec:\n"
                                "  endpoints:\n  - {address: 127.0.0.1, port: 9000}\n"));
    put(&w.b[1], parse_one(HEAD "kind: Backend\nmetadata: {name: b1}\nspec:\n"
                                "  endpoints:\n  - {address: 127.0.0.1, port: 9001}\n"));
    const char *apis[] = {
        /* a0: b0 at the Api level */
        "basePath: /a0\n  backendRefs: [{name: b0}]\n  operations: [{method: GET, path: /x}]\n",
        /* a1: b0 in an operation */
        "basePath: /a1\n  backendRefs: [{name: b1}]\n  operations:\n"
        "  - {method: GET, path: /x, backendRefs: [{name: b0}]}\n",
        /* a2: b0 as a mirror */
        "basePath: /a2\n  backendRefs: [{name: b1}]\n  operations:\n"
        "  - {method: GET, path: /x, mirror: {backend: b0, percent: 5}}\n",
        "basePath: /a3\n  backendRefs: [{name: b1}]\n  operations: [{method: GET, path: /x}]\n",
        "basePath: /a4\n  backendRefs: [{name: b1}]\n  operations: [{method: GET, path: /y}]\n",
    };
    for (int i = 0; i < 5; i++) {
        char text[1024];
        snprintf(text, sizeof(text), HEAD "kind: Api\nmetadata: {name: a%d}\nspec:\n  %s", i,
                 apis[i]);
        put(&w.a[i], parse_one(text));
    }
    put(&w.c[0],
        parse_one(HEAD "kind: Consumer\nmetadata: {name: c0}\nspec:\n"
                       "  credentials:\n    jwt: [{issuer: https://idp, subject: u-1}]\n"));
    sl_ccache_t *cache = sl_ccache_new();
    sl_resource_set_t set;
    world_set(&w, &set, 1);
    assert_int_equal(compare(&set, cache), 2 + 5 + 1);
    sl_ccache_sweep(cache);
    sl_resource_set_free(&set);

    put(&w.b[0], parse_one(HEAD "kind: Backend\nmetadata: {name: b0}\nspec:\n"
                                "  endpoints:\n  - {address: 127.0.0.1, port: 9100}\n"));
    world_set(&w, &set, 1);
    assert_int_equal(compare(&set, cache), 1 + 3);
    sl_ccache_sweep(cache);
    sl_resource_set_free(&set);

    /* Deleting b1 (referenced by a1..a4) fails those Apis: recompiled. */
    put(&w.b[1], NULL);
    world_set(&w, &set, 1);
    sl_compiled_t comp;
    sl_errors_t errs;
    sl_errors_init(&errs);
    assert_int_equal(sl_compile_cached(&set, "default", cache, &comp, &errs), -1);
    assert_int_equal(comp.compiled, 4);
    sl_errors_free(&errs);
    sl_ccache_sweep(cache);
    sl_resource_set_free(&set);
    put(&w.b[1], parse_one(HEAD "kind: Backend\nmetadata: {name: b1}\nspec:\n"
                                "  endpoints:\n  - {address: 127.0.0.1, port: 9001}\n"));

    put(&w.gw[0], parse_one(HEAD "kind: Gateway\nmetadata: {name: gw0}\nspec:\n"
                                 "  listeners:\n  - {name: http, port: 8080}\n"
                                 "  timeouts: {upstreamResponse: 3s}\n"));
    world_set(&w, &set, 1);
    assert_int_equal(compare(&set, cache), 2 + 5);
    sl_ccache_sweep(cache);
    sl_resource_set_free(&set);

    put(&w.c[0],
        parse_one(HEAD "kind: Consumer\nmetadata: {name: c0}\nspec:\n  group: g\n"
                       "  credentials:\n    jwt: [{issuer: https://idp, subject: u-1}]\n"));
    world_set(&w, &set, 0);
    assert_int_equal(compare(&set, cache), 1);
    sl_ccache_sweep(cache);
    sl_resource_set_free(&set);

    /* Deleted resources leave the cache at the next sweep. */
    put(&w.a[4], NULL);
    world_set(&w, &set, 1);
    assert_int_equal(compare(&set, cache), 0);
    sl_ccache_sweep(cache);
    assert_int_equal(sl_ccache_size(cache), 2 + 4 + 1);
    sl_resource_set_free(&set);
    sl_ccache_free(cache);
    world_free(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_edits_equal_from_scratch),
        cmocka_unit_test(test_backend_change_recompiles_its_apis),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
