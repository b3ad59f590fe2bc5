/*
 * Unit tests of the policy engine (policies/): chains resolved by the
 * compiler from an Api and its operations (override, disable, order),
 * built into phase order, `when` conditions, fail-closed builds, the
 * Consumers index, and the api-key and headers policies on a request view.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "chain.h"
#include "compiler.h"
#include "consumers.h"
#include "model.h"

#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEAD "apiVersion: gateway.sluice.dev/v1alpha1\n"
/* sha256("secret-1") */
static char key_hash[80];

static Sluice__V1__Snapshot *compile(const char *yaml)
{
    sl_errors_t errs;
    sl_errors_init(&errs);
    sl_resource_set_t set;
    sl_resource_set_init(&set);
    int rc = sl_model_parse(&set, yaml, strlen(yaml), "t.yaml", &errs);
    if (rc != 0) {
        char *s = sl_errors_format(&errs);
        fprintf(stderr, "%s\n", s);
        free(s);
    }
    assert_int_equal(rc, 0);
    Sluice__V1__Snapshot *snap = sl_compile_snapshot(&set, "default", 1, &errs);
    assert_non_null(snap);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
    return snap;
}

static char *config(void)
{
    static char buf[4096];
    snprintf(
        buf, sizeof(buf),
        HEAD
        "kind: Backend\nmetadata: {name: b}\nspec:\n  endpoints: [{address: 127.0.0.1, port: 9}]\n"
        "---\n" HEAD "kind: Consumer\nmetadata: {name: alice}\nspec:\n  group: gold\n"
        "  credentials:\n    apiKeys: [{name: laptop, keyHash: \"%s\"}]\n"
        "    basicAuth: [{username: al, passwordHash: "
        "\"$6$abcdefgh$"
        "bp46WUxDu2cphMRE0PvVJlqas2imuSq186YS793XKfmqn9XUEL17HECskUTZInaNigNndLLYc7A6yWBmFEFn3/"
        "\"}]\n"
        "    jwt: [{issuer: https://idp, subject: u-1}]\n"
        "---\n" HEAD "kind: Api\nmetadata: {name: a}\nspec:\n  backendRefs: [{name: b}]\n"
        "  policies:\n"
        "  - {name: headers, config: {response: {set: {X-A: \"1\"}}}}\n"
        "  - {name: api-key}\n"
        "  operations:\n"
        "  - {name: plain, method: GET, path: /p}\n"
        "  - {name: \"off\", method: GET, path: /off, policies: [{name: api-key, disabled: "
        "true}]}\n"
        "  - {name: over, method: GET, path: /over, policies: [{name: api-key, config: {header: "
        "X-K}}, "
        "{name: respond, config: {status: 418}, when: {methods: [GET], pathPrefixes: "
        "[/over/x]}}]}\n",
        key_hash);
    return buf;
}

static const Sluice__V1__Route *route(const Sluice__V1__Snapshot *s, const char *name)
{
    for (size_t i = 0; i < s->route_tables[0]->n_routes; i++)
        if (strcmp(s->route_tables[0]->routes[i]->name, name) == 0)
            return s->route_tables[0]->routes[i];
    fail_msg("no route %s", name);
    return NULL;
}

static void test_compiler_resolves_chains(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *s = compile(config());
    const Sluice__V1__Route *r = route(s, "plain");
    assert_int_equal(r->n_policies, 2);
    assert_string_equal(r->policies[0]->name, "headers");
    assert_string_equal(r->policies[1]->name, "api-key");
    assert_string_equal(r->policies[1]->config_json, "{}");
    r = route(s, "off");
    assert_int_equal(r->n_policies, 1);
    assert_string_equal(r->policies[0]->name, "headers");
    r = route(s, "over"); /* replaced in place, then appended */
    assert_int_equal(r->n_policies, 3);
    assert_string_equal(r->policies[1]->name, "api-key");
    assert_string_equal(r->policies[1]->config_json, "{\"header\":\"X-K\"}");
    assert_string_equal(r->policies[2]->name, "respond");
    assert_non_null(r->policies[2]->when);
    assert_string_equal(r->policies[2]->when->methods[0], "GET");
    assert_int_equal(s->n_consumers, 1);
    assert_string_equal(s->consumers[0]->name, "default/alice");
    assert_int_equal(s->consumers[0]->api_keys[0]->sha256.len, 32);
    sl_snapshot_free(s);
}

static sl_policy_req_t view(sl_policy_header_t *h, size_t nh, sl_hdr_edit_t *edits, char *arena)
{
    sl_policy_req_t v;
    memset(&v, 0, sizeof(v));
    v.method = (sl_str_t){"GET", 3};
    v.path = (sl_str_t){"/over/x/1", 9};
    v.headers = h;
    v.num_headers = nh;
    v.req_edits = edits;
    v.resp_edits = edits + 16;
    v.max_edits = 16;
    v.arena = arena;
    v.arena_cap = 512;
    v.client_ip = "127.0.0.1";
    return v;
}

static void test_chain_runs_in_phase_order_with_conditions(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *s = compile(config());
    sl_consumers_t *cons = sl_consumers_build(s->consumers, s->n_consumers);
    sl_policy_env_t env = {.consumers = cons, .nworkers = 2};
    char err[256];
    const Sluice__V1__Route *r = route(s, "over");
    sl_policy_chain_t *ch =
        sl_policy_chain_build(r->policies, r->n_policies, &env, err, sizeof(err));
    assert_non_null(ch);
    /* authn before the request phase, whatever the written order */
    assert_string_equal(sl_policy_chain_name(ch, 0), "api-key");
    assert_string_equal(sl_policy_chain_name(ch, 1), "headers");
    assert_string_equal(sl_policy_chain_name(ch, 2), "respond");

    sl_hdr_edit_t edits[32];
    char arena[512];
    sl_policy_reply_t reply;
    sl_policy_header_t none[1];
    sl_policy_req_t v = view(none, 0, edits, arena);
    memset(&reply, 0, sizeof(reply));
    assert_int_equal(sl_policy_chain_request(ch, &v, &reply), SL_POLICY_REPLY);
    assert_int_equal(reply.status, 401);
    assert_string_equal(v.rejected_by, "api-key");
    assert_int_equal(v.rejected_index, 0);

    sl_policy_header_t good[] = {{{"x-k", 3}, {"secret-1", 8}}};
    v = view(good, 1, edits, arena);
    memset(&reply, 0, sizeof(reply));
    assert_int_equal(sl_policy_chain_request(ch, &v, &reply), SL_POLICY_REPLY);
    assert_int_equal(reply.status, 418); /* the respond condition holds */
    assert_string_equal(v.consumer.name, "default/alice");
    assert_string_equal(v.consumer.group, "gold");
    assert_string_equal(v.consumer.credential, "laptop");
    assert_int_equal(v.num_req_edits, 1); /* X-K removed */
    assert_int_equal(v.req_edits[0].op, SL_HDR_REMOVE);

    v = view(good, 1, edits, arena);
    v.path = (sl_str_t){"/over", 5}; /* outside pathPrefixes */
    assert_int_equal(sl_policy_chain_request(ch, &v, &reply), SL_POLICY_CONTINUE);
    sl_policy_chain_response(ch, &v, 200);
    assert_int_equal(v.num_resp_edits, 1);
    assert_memory_equal(v.resp_edits[0].name, "X-A", 3);
    assert_int_equal(v.resp_edits[0].op, SL_HDR_SET);

    sl_policy_chain_free(ch);
    sl_consumers_free(cons);
    sl_snapshot_free(s);
}

/* rate-limit's beforeAuthentication moves it to the access phase: it
 * runs before the authentication policy written before it. */
static void test_config_chooses_the_phase(void **state)
{
    (void)state;
    Sluice__V1__Policy auth = SLUICE__V1__POLICY__INIT, rl = SLUICE__V1__POLICY__INIT;
    auth.name = "basic-auth";
    auth.config_json = "{}";
    rl.name = "rate-limit";
    rl.config_json = "{\"limits\":[{\"requests\":1,\"period\":\"1m\",\"by\":\"ip\"}]}";
    Sluice__V1__Policy *ps[] = {&auth, &rl};
    sl_policy_env_t env = {.consumers = NULL, .nworkers = 1};
    char err[256];
    sl_policy_chain_t *ch = sl_policy_chain_build(ps, 2, &env, err, sizeof(err));
    assert_non_null(ch);
    assert_string_equal(sl_policy_chain_name(ch, 0), "basic-auth");
    assert_string_equal(sl_policy_chain_name(ch, 1), "rate-limit");
    sl_policy_chain_free(ch);
    rl.config_json = "{\"beforeAuthentication\":true,"
                     "\"limits\":[{\"requests\":1,\"period\":\"1m\",\"by\":\"ip\"}]}";
    ch = sl_policy_chain_build(ps, 2, &env, err, sizeof(err));
    assert_non_null(ch);
    assert_string_equal(sl_policy_chain_name(ch, 0), "rate-limit");
    assert_string_equal(sl_policy_chain_name(ch, 1), "basic-auth");
    /* The second anonymous request is limited before basic-auth runs. */
    sl_hdr_edit_t edits[32];
    char arena[512];
    sl_policy_reply_t reply;
    sl_policy_header_t none[1];
    for (int i = 0; i < 2; i++) {
        sl_policy_req_t v = view(none, 0, edits, arena);
        v.api = "default/a";
        memset(&reply, 0, sizeof(reply));
        assert_int_equal(sl_policy_chain_request(ch, &v, &reply), SL_POLICY_REPLY);
        assert_int_equal(reply.status, i == 0 ? 401 : 429);
        assert_string_equal(v.rejected_by, i == 0 ? "basic-auth" : "rate-limit");
    }
    sl_policy_chain_free(ch);
}

static void test_unknown_policy_fails_the_chain_closed(void **state)
{
    (void)state;
    Sluice__V1__Policy p = SLUICE__V1__POLICY__INIT;
    p.name = "no-such-policy";
    p.config_json = "{}";
    Sluice__V1__Policy *ps[] = {&p};
    sl_policy_env_t env = {.consumers = NULL, .nworkers = 1};
    char err[256];
    assert_null(sl_policy_chain_build(ps, 1, &env, err, sizeof(err)));
    assert_string_equal(err, "policy no-such-policy is not known to this runtime");
    p.name = "respond";
    p.config_json = "{not json";
    assert_null(sl_policy_chain_build(ps, 1, &env, err, sizeof(err)));
    assert_non_null(strstr(err, "policy respond: config is not JSON"));
    assert_null(sl_policy_chain_build(ps, 0, &env, err, sizeof(err)));
    assert_string_equal(err, "");
}

static void test_consumers_index(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *s = compile(config());
    sl_consumers_t *c = sl_consumers_build(s->consumers, s->n_consumers);
    uint8_t h[32];
    SHA256((const unsigned char *)"secret-1", 8, h);
    const char *cred = NULL;
    const sl_consumer_t *k = sl_consumers_by_key(c, h, &cred);
    assert_non_null(k);
    assert_string_equal(k->name, "default/alice");
    assert_string_equal(cred, "laptop");
    h[31] ^= 1;
    assert_null(sl_consumers_by_key(c, h, NULL));
    const char *hash = NULL;
    assert_non_null(sl_consumers_by_user(c, (sl_str_t){"al", 2}, &hash));
    assert_int_equal(strncmp(hash, "$6$", 3), 0);
    assert_null(sl_consumers_by_user(c, (sl_str_t){"a", 1}, NULL));
    assert_non_null(sl_consumers_by_jwt(c, (sl_str_t){"https://idp", 11}, (sl_str_t){"u-1", 3}));
    assert_null(sl_consumers_by_jwt(c, (sl_str_t){"https://idpu", 12}, (sl_str_t){"-1", 2}));
    sl_consumers_free(c);
    sl_snapshot_free(s);
}

/* The controller's check (policies/check.c): each entry compiled from the
 * config alone, failures with their field path; a disabled entry and a
 * fleet-mode rate limit (no Redis client in check mode) are no failures. */
static void test_check_spec_names_entries_that_cannot_be_compiled(void **state)
{
    (void)state;
    json_t *spec = json_loads(
        "{\"policies\": [{\"name\": \"headers\", \"config\": {}},"
        " {\"name\": \"jwt\", \"config\": {\"jwksUri\": \"https://idp/k\", \"jwksCaBundle\":"
        " \"-----BEGIN CERTIFICATE-----\\nMIIBAAAA\\n-----END CERTIFICATE-----\\n\"}}],"
        " \"operations\": [{\"path\": \"/a\", \"policies\": [{\"name\": \"jwt\", \"disabled\": "
        "true},"
        "  {\"name\": \"rate-limit\", \"config\": {\"mode\": \"fleet\", \"limits\": "
        "[{\"requests\": 1,"
        "   \"period\": \"1s\", \"by\": \"ip\"}], \"redis\": {\"address\": "
        "\"192.0.2.1:6379\"}}}]}]}",
        0, NULL);
    assert_non_null(spec);
    sl_policy_env_t env = {.consumers = NULL, .nworkers = 1};
    char msg[512];
    assert_int_equal(sl_policy_check_spec(spec, &env, msg, sizeof(msg)), 1);
    assert_non_null(
        strstr(msg, "spec.policies[1] (jwt): jwksCaBundle: certificate 1 does not parse"));
    assert_null(strstr(msg, "operations"));
    json_decref(spec);
}

int main(void)
{
    uint8_t h[32];
    SHA256((const unsigned char *)"secret-1", 8, h);
    char *p = key_hash + sprintf(key_hash, "sha256:");
    for (int i = 0; i < 32; i++)
        p += sprintf(p, "%02x", h[i]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compiler_resolves_chains),
        cmocka_unit_test(test_chain_runs_in_phase_order_with_conditions),
        cmocka_unit_test(test_unknown_policy_fails_the_chain_closed),
        cmocka_unit_test(test_consumers_index),
        cmocka_unit_test(test_config_chooses_the_phase),
        cmocka_unit_test(test_check_spec_names_entries_that_cannot_be_compiled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
