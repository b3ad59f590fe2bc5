/*
 * headers: values with variables expanded on a request view (path
 * parameters, JWT claims, the rest), and the Api-wide checks of what the
 * variables refer to (policies/registry.c, sl_policy_vcheck_api).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../../../policies/headers/headers.c"
#include "model.h"

#define HEAD "apiVersion: gateway.sluice.dev/v1alpha1\n"

static headers_t *make(const char *json)
{
    json_error_t je;
    json_t *config = json_loads(json, 0, &je);
    assert_non_null(config);
    char err[200] = "";
    sl_policy_env_t env = {.consumers = NULL, .nworkers = 1};
    headers_t *h = compile(config, &env, err, sizeof(err));
    json_decref(config);
    assert_non_null(h);
    return h;
}

static const sl_hdr_edit_t *edit(const sl_hdr_edit_t *e, unsigned n, const char *name)
{
    for (unsigned i = 0; i < n; i++)
        if (e[i].name_len == strlen(name) && memcmp(e[i].name, name, e[i].name_len) == 0)
            return &e[i];
    fail_msg("no edit of %s", name);
    return NULL;
}

#define assert_value(e, want)                                                                      \
    do {                                                                                           \
        assert_int_equal((e)->value_len, strlen(want));                                            \
        assert_memory_equal((e)->value, want, strlen(want));                                       \
    } while (0)

static void test_path_parameters_and_claims(void **state)
{
    (void)state;
    headers_t *h = make("{\"request\": {\"set\": {"
                        "\"X-Pet\": \"pet-${path.id}/${path.photo}\","
                        "\"X-Sub\": \"${jwt.sub}\", \"X-Org\": \"${jwt.org.id}\","
                        "\"X-Admin\": \"${jwt.admin}\", \"X-Url\": \"${jwt.https://e.com/r}\","
                        "\"X-Missing\": \"[${jwt.nope}]\", \"X-Obj\": \"${jwt.org}\","
                        "\"X-Bad\": \"${jwt.bad}\", \"X-None\": \"${path.none}\"}},"
                        "\"response\": {\"set\": {\"X-Echo-Sub\": \"${jwt.sub}:${path.id}\"}}}");
    sl_hdr_edit_t edits[64];
    char arena[1024];
    sl_policy_req_t r;
    memset(&r, 0, sizeof(r));
    r.method = (sl_str_t){"GET", 3};
    r.path = (sl_str_t){"/v1/pets/42/photos/a%20b", 24};
    r.route_path = (sl_str_t){"/pets/{id}/photos/{photo}", 25};
    r.route_path_template = 1;
    r.base_path_len = 3;
    r.req_edits = edits;
    r.resp_edits = edits + 32;
    r.max_edits = 32;
    r.arena = arena;
    r.arena_cap = sizeof(arena);
    r.jwt_claims = json_loads("{\"sub\": \"alice\", \"org\": {\"id\": 7}, \"admin\": true,"
                              "\"https://e.com/r\": \"x\", \"bad\": \"a\\r\\nX-Evil: 1\"}",
                              0, NULL);
    assert_non_null(r.jwt_claims);
    sl_policy_reply_t reply;
    assert_int_equal(on_request(h, &r, &reply), SL_POLICY_CONTINUE);
    assert_value(edit(edits, r.num_req_edits, "X-Pet"), "pet-42/a%20b");
    assert_value(edit(edits, r.num_req_edits, "X-Sub"), "alice");
    assert_value(edit(edits, r.num_req_edits, "X-Org"), "7");
    assert_value(edit(edits, r.num_req_edits, "X-Admin"), "true");
    assert_value(edit(edits, r.num_req_edits, "X-Url"), "x");
    /* Absent, an object, a value with CR LF, an unknown parameter: empty,
     * and still set (a client's own header of that name is replaced). */
    assert_value(edit(edits, r.num_req_edits, "X-Missing"), "[]");
    assert_value(edit(edits, r.num_req_edits, "X-Obj"), "");
    assert_value(edit(edits, r.num_req_edits, "X-Bad"), "");
    assert_value(edit(edits, r.num_req_edits, "X-None"), "");
    assert_int_equal(edit(edits, r.num_req_edits, "X-None")->op, SL_HDR_SET);

    /* Response hooks run after the request head is gone: the path is a
     * copy, the claims are the request's own reference. */
    char copy[32];
    memcpy(copy, r.path.ptr, r.path.len);
    r.path.ptr = copy;
    on_response(h, &r, 200);
    assert_value(edit(r.resp_edits, r.num_resp_edits, "X-Echo-Sub"), "alice:42");
    sl_policy_req_end(&r);
    assert_null(r.jwt_claims);

    /* No token verified: claims expand to "". */
    r.num_req_edits = r.num_resp_edits = 0;
    r.arena_len = 0;
    assert_int_equal(on_request(h, &r, &reply), SL_POLICY_CONTINUE);
    assert_value(edit(edits, r.num_req_edits, "X-Sub"), "");
    assert_value(edit(edits, r.num_req_edits, "X-Pet"), "pet-42/a%20b");
    hfree(h);
}

/* The errors of validating yaml, formatted; "" when valid. */
static char *validate(const char *yaml)
{
    sl_errors_t errs;
    sl_errors_init(&errs);
    sl_resource_set_t set;
    sl_resource_set_init(&set);
    int rc = sl_model_parse(&set, yaml, strlen(yaml), "t.yaml", &errs);
    char *s = rc == 0 ? strdup("") : sl_errors_format(&errs);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
    return s;
}

static void expect(const char *api_tail, const char *want)
{
    char yaml[4096];
    snprintf(yaml, sizeof(yaml),
             HEAD "kind: Backend\nmetadata: {name: b}\nspec:\n  endpoints: [{address: 127.0.0.1, "
                  "port: 9}]\n---\n" HEAD "kind: Api\nmetadata: {name: a}\nspec:\n"
                  "  backendRefs: [{name: b}]\n%s",
             api_tail);
    char *got = validate(yaml);
    if (!want) {
        if (*got)
            fail_msg("unexpected errors: %s", got);
    } else if (!strstr(got, want)) {
        fail_msg("want '%s' in: %s", want, got);
    }
    free(got);
}

static void test_variables_are_checked_across_the_api(void **state)
{
    (void)state;
    expect("  policies:\n  - {name: headers, config: {request: {set: {X-A: \"${nope}\"}}}}\n"
           "  operations:\n  - {method: GET, path: /p}\n",
           "spec.policies[0].config.request.set.X-A: unknown variable '${nope}'");
    expect("  policies:\n  - {name: headers, config: {request: {set: {X-A: \"${path.1x}\"}}}}\n"
           "  operations:\n  - {method: GET, path: /p}\n",
           "unknown variable '${path.1x}'");
    /* One operation with {id} is enough for the Api's policy. */
    expect("  policies:\n  - {name: headers, config: {request: {add: {X-Pet: \"${path.id}\"}}}}\n"
           "  operations:\n  - {method: GET, path: /p}\n  - {method: GET, path: \"/p/{id}\"}\n",
           NULL);
    expect("  policies:\n  - {name: headers, config: {request: {add: {X-Pet: \"${path.id}\"}}}}\n"
           "  operations:\n  - {method: GET, path: /p}\n  - {method: GET, path: \"/q/{pid}\"}\n",
           "spec.policies[0].config.request.add.X-Pet: ${path.id}: no operation this policy "
           "applies to has a path parameter {id}");
    /* ... and that operation must run the Api's entry, not its own. */
    expect("  policies:\n  - {name: headers, config: {request: {add: {X-Pet: \"${path.id}\"}}}}\n"
           "  operations:\n  - {method: GET, path: /p}\n"
           "  - {method: GET, path: \"/p/{id}\", policies: [{name: headers, disabled: true}]}\n",
           "no operation this policy applies to has a path parameter {id}");
    /* An operation's own entry: its path only. */
    expect("  operations:\n  - {method: GET, path: \"/p/{id}\"}\n"
           "  - {method: GET, path: /q, policies: [{name: headers, config: {response: {set: "
           "{X-Pet: \"${path.id}\"}}}}]}\n",
           "spec.operations[1].policies[0].config.response.set.X-Pet: ${path.id}: this "
           "operation's path has no parameter {id}");
    /* An operation's own entry on its own template. */
    expect("  operations:\n  - {method: GET, path: \"/p/{id}\", policies: [{name: headers, "
           "config: {request: {set: {X-Pet: \"${path.id}\"}}}}]}\n",
           NULL);
    /* Claims need a jwt policy on an operation the entry applies to. */
    expect("  policies:\n  - {name: headers, config: {request: {set: {X-U: \"${jwt.sub}\"}}}}\n"
           "  operations:\n  - {method: GET, path: /p}\n",
           "spec.policies[0].config.request.set.X-U: ${jwt.sub}: no jwt policy verifies a token");
    expect("  policies:\n  - {name: jwt, config: {secret: "
           "\"0123456789abcdef0123456789abcdef\"}}\n"
           "  - {name: headers, config: {request: {set: {X-U: \"${jwt.sub}\"}}}}\n"
           "  operations:\n  - {method: GET, path: /p}\n",
           NULL);
    expect("  policies:\n  - {name: jwt, config: {secret: "
           "\"0123456789abcdef0123456789abcdef\"}}\n"
           "  operations:\n  - {method: GET, path: /p, policies: [{name: jwt, disabled: true}, "
           "{name: headers, config: {request: {set: {X-U: \"${jwt.tenant}\"}}}}]}\n",
           "spec.operations[0].policies[1].config.request.set.X-U: ${jwt.tenant}: no jwt policy");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_path_parameters_and_claims),
        cmocka_unit_test(test_variables_are_checked_across_the_api),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
