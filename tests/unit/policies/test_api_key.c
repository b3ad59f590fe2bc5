/*
 * api-key on a request view: the key from the header or the query, looked
 * up by its SHA-256 among the Consumers, the Consumer and credential set
 * for later policies, the key removed before forwarding (or not, with
 * forward), and the 401s with their challenge.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../../../policies/api-key/api_key.c"

#include "compiler.h"
#include "model.h"

#include <openssl/sha.h>

#define HEAD "apiVersion: gateway.sluice.dev/v1alpha1\n"

typedef struct {
    Sluice__V1__Snapshot *snap;
    sl_consumers_t *consumers;
} fixture_t;

static int setup(void **st)
{
    static const char key[] = "k-alice-0123456789";
    uint8_t sha[SHA256_DIGEST_LENGTH];
    SHA256((const unsigned char *)key, strlen(key), sha);
    char hex[65];
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", sha[i]);
    char yaml[1024];
    snprintf(yaml, sizeof(yaml),
             HEAD "kind: Consumer\nmetadata: {name: alice}\nspec:\n  group: gold\n"
                  "  credentials:\n    apiKeys: [{name: laptop, keyHash: \"sha256:%s\"}]\n",
             hex);
    sl_errors_t errs;
    sl_errors_init(&errs);
    sl_resource_set_t set;
    sl_resource_set_init(&set);
    assert_int_equal(sl_model_parse(&set, yaml, strlen(yaml), "t.yaml", &errs), 0);
    fixture_t *f = calloc(1, sizeof(*f));
    f->snap = sl_compile_snapshot(&set, "default", 1, &errs);
    assert_non_null(f->snap);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
    f->consumers = sl_consumers_build(f->snap->consumers, f->snap->n_consumers);
    assert_non_null(f->consumers);
    *st = f;
    return 0;
}

static int teardown(void **st)
{
    fixture_t *f = *st;
    sl_consumers_free(f->consumers);
    sl_snapshot_free(f->snap);
    free(f);
    return 0;
}

static api_key_t *make(fixture_t *f, const char *config_json)
{
    json_t *cfg = json_loads(config_json, 0, NULL);
    assert_non_null(cfg);
    sl_policy_env_t env = {.consumers = f->consumers, .nworkers = 1};
    char err[256];
    api_key_t *k = compile(cfg, &env, err, sizeof(err));
    json_decref(cfg);
    assert_non_null(k);
    return k;
}

typedef struct {
    sl_policy_req_t r;
    sl_policy_header_t h[4];
    sl_hdr_edit_t edits[2][8];
    char arena[512];
    sl_policy_reply_t reply;
} view_t;

static void view(view_t *v, const char *query, const char *name, const char *value)
{
    memset(v, 0, sizeof(*v));
    v->r.query = (sl_str_t){query, strlen(query)};
    v->h[0] = (sl_policy_header_t){{"Host", 4}, {"a", 1}};
    v->r.num_headers = 1;
    if (name) {
        v->h[1] = (sl_policy_header_t){{name, strlen(name)}, {value, strlen(value)}};
        v->r.num_headers = 2;
    }
    v->r.headers = v->h;
    v->r.req_edits = v->edits[0];
    v->r.resp_edits = v->edits[1];
    v->r.max_edits = 8;
    v->r.arena = v->arena;
    v->r.arena_cap = sizeof(v->arena);
}

static void test_header_key_found_and_removed(void **st)
{
    fixture_t *f = *st;
    api_key_t *k = make(f, "{}");
    view_t v;
    view(&v, "", "x-api-key", "k-alice-0123456789"); /* header names compare without case */
    assert_int_equal(on_request(k, &v.r, &v.reply), SL_POLICY_CONTINUE);
    assert_string_equal(v.r.consumer.name, "default/alice");
    assert_string_equal(v.r.consumer.group, "gold");
    assert_string_equal(v.r.consumer.credential, "laptop");
    assert_int_equal(v.r.num_req_edits, 1);
    assert_int_equal(v.r.req_edits[0].op, SL_HDR_REMOVE);
    assert_memory_equal(v.r.req_edits[0].name, "X-Api-Key", 9);
    free(k);
}

static void test_forward_keeps_the_key(void **st)
{
    fixture_t *f = *st;
    api_key_t *k = make(f, "{\"forward\": true}");
    view_t v;
    view(&v, "", "X-Api-Key", "k-alice-0123456789");
    assert_int_equal(on_request(k, &v.r, &v.reply), SL_POLICY_CONTINUE);
    assert_int_equal(v.r.num_req_edits, 0);
    free(k);
}

static void test_query_key_removed_from_the_query(void **st)
{
    fixture_t *f = *st;
    api_key_t *k = make(f, "{\"query\": \"api_key\"}");
    view_t v;
    view(&v, "a=1&api_key=k-alice-0123456789&b=2", NULL, NULL);
    assert_int_equal(on_request(k, &v.r, &v.reply), SL_POLICY_CONTINUE);
    assert_string_equal(v.r.consumer.name, "default/alice");
    assert_non_null(v.r.query_out.ptr);
    assert_int_equal(v.r.query_out.len, 7);
    assert_memory_equal(v.r.query_out.ptr, "a=1&b=2", 7);
    free(k);
}

static void test_refusals(void **st)
{
    fixture_t *f = *st;
    api_key_t *k = make(f, "{}");
    view_t v;
    view(&v, "", NULL, NULL);
    assert_int_equal(on_request(k, &v.r, &v.reply), SL_POLICY_REPLY);
    assert_int_equal(v.reply.status, 401);
    assert_string_equal(v.reply.code, "unauthorized");
    assert_string_equal(v.reply.headers[0].name, "WWW-Authenticate");
    assert_non_null(strstr(v.reply.headers[0].value, "header=\"X-Api-Key\""));
    assert_null(v.r.consumer.name);

    view(&v, "", "X-Api-Key", "k-alice-012345678"); /* one byte short */
    assert_int_equal(on_request(k, &v.r, &v.reply), SL_POLICY_REPLY);
    assert_int_equal(v.reply.status, 401);
    assert_non_null(strstr(v.reply.message, "not valid"));
    assert_null(v.r.consumer.name);

    view(&v, "", "X-Api-Key", "k-alice-0123456789");
    v.h[2] = (sl_policy_header_t){{"X-API-KEY", 9}, {"k-alice-0123456789", 18}};
    v.r.num_headers = 3; /* two keys: which one is meant is anyone's guess */
    assert_int_equal(on_request(k, &v.r, &v.reply), SL_POLICY_REPLY);
    assert_non_null(strstr(v.reply.message, "more than one"));

    view(&v, "", "X-Api-Key", ""); /* present but empty */
    assert_int_equal(on_request(k, &v.r, &v.reply), SL_POLICY_REPLY);
    assert_non_null(strstr(v.reply.message, "required"));
    free(k);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_key_found_and_removed),
        cmocka_unit_test(test_forward_keeps_the_key),
        cmocka_unit_test(test_query_key_removed_from_the_query),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
