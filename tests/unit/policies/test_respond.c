/* respond: the fixed reply (status, body, content type by the body's look
 * or the config, headers), and its config's validation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../../../policies/respond/respond.c"

#include "model.h"

static respond_t *make(const char *config_json)
{
    json_t *cfg = json_loads(config_json, 0, NULL);
    assert_non_null(cfg);
    sl_policy_env_t env = {.consumers = NULL, .nworkers = 1};
    char err[256];
    respond_t *r = compile(cfg, &env, err, sizeof(err));
    json_decref(cfg);
    assert_non_null(r);
    return r;
}

static void test_reply(void **st)
{
    (void)st;
    respond_t *r = make("{\"status\": 503, \"body\": \"{\\\"message\\\": \\\"back soon\\\"}\", "
                        "\"headers\": {\"Retry-After\": \"120\"}}");
    sl_policy_req_t req;
    memset(&req, 0, sizeof(req));
    sl_policy_reply_t reply;
    memset(&reply, 0, sizeof(reply));
    assert_int_equal(on_request(r, &req, &reply), SL_POLICY_REPLY);
    assert_int_equal(reply.status, 503);
    assert_int_equal(reply.body_len, strlen("{\"message\": \"back soon\"}"));
    assert_memory_equal(reply.body, "{\"message\": \"back soon\"}", reply.body_len);
    assert_string_equal(reply.content_type, "application/json"); /* by the body's look */
    assert_int_equal(reply.num_headers, 1);
    assert_string_equal(reply.headers[0].name, "Retry-After");
    assert_string_equal(reply.headers[0].value, "120");
    rfree(r);

    r = make("{\"status\": 200, \"body\": \"ok\"}");
    memset(&reply, 0, sizeof(reply));
    assert_int_equal(on_request(r, &req, &reply), SL_POLICY_REPLY);
    assert_string_equal(reply.content_type, "text/plain; charset=utf-8");
    rfree(r);

    r = make("{\"status\": 204, \"contentType\": \"application/xml\"}");
    memset(&reply, 0, sizeof(reply));
    assert_int_equal(on_request(r, &req, &reply), SL_POLICY_REPLY);
    assert_int_equal(reply.body_len, 0);
    assert_string_equal(reply.content_type, "application/xml");
    rfree(r);
}

static char *errors_of(const char *config)
{
    char text[2048];
    snprintf(text, sizeof(text),
             "apiVersion: gateway.sluice.dev/v1alpha1\nkind: Api\nmetadata: {name: a}\n"
             "spec:\n  backendRefs: [{name: b}]\n  operations: [{method: GET, path: /x}]\n"
             "  policies:\n  - name: respond\n    config: %s\n",
             config);
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    sl_model_parse(&set, text, strlen(text), "t.yaml", &errs);
    char *s = sl_errors_format(&errs);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
    return s;
}

static void test_validation(void **st)
{
    (void)st;
    char *s = errors_of("{status: 200}");
    assert_null(strstr(s, "spec.policies"));
    free(s);
    s = errors_of("{}");
    assert_non_null(strstr(s, "spec.policies[0].config.status: required field missing"));
    free(s);
    s = errors_of("{status: 100}");
    assert_non_null(strstr(s, "spec.policies[0].config.status"));
    free(s);
    s = errors_of("{status: 200, headers: {X-A: \"a\\r\\nInjected: 1\"}}");
    assert_non_null(strstr(s, "spec.policies[0].config.headers.X-A"));
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reply),
        cmocka_unit_test(test_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
