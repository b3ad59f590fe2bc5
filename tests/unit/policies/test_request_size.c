/* request-size: a declared Content-Length over the limit is refused (413),
 * and the limit is handed to the request (the lower of two holds) for the
 * codecs to enforce while a body without a declared length streams. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../../../policies/request-size/request_size.c"

#include <string.h>

static request_size_t *make(uint64_t max)
{
    char text[64];
    snprintf(text, sizeof(text), "{\"maxBytes\": %llu}", (unsigned long long)max);
    json_t *cfg = json_loads(text, 0, NULL);
    sl_policy_env_t env = {.consumers = NULL, .nworkers = 1};
    char err[128];
    request_size_t *s = compile(cfg, &env, err, sizeof(err));
    json_decref(cfg);
    assert_non_null(s);
    return s;
}

static int run(request_size_t *s, const char *content_length, uint64_t route_max,
               sl_policy_req_t *r, sl_policy_reply_t *reply)
{
    static sl_policy_header_t h[2];
    memset(r, 0, sizeof(*r));
    memset(reply, 0, sizeof(*reply));
    h[0] = (sl_policy_header_t){{"Host", 4}, {"a", 1}};
    r->headers = h;
    r->num_headers = 1;
    if (content_length) {
        h[1] = (sl_policy_header_t){{"Content-Length", 14},
                                    {content_length, strlen(content_length)}};
        r->num_headers = 2;
    }
    r->max_body_bytes = route_max;
    return on_request(s, r, reply);
}

static void test_declared_length(void **st)
{
    (void)st;
    request_size_t *s = make(1000);
    sl_policy_req_t r;
    sl_policy_reply_t reply;
    assert_int_equal(run(s, "1000", 0, &r, &reply), SL_POLICY_CONTINUE);
    assert_int_equal(r.max_body_bytes, 1000);
    assert_int_equal(run(s, "1001", 0, &r, &reply), SL_POLICY_REPLY);
    assert_int_equal(reply.status, 413);
    assert_string_equal(reply.code, "payload_too_large");
    assert_non_null(strstr(reply.message, "1000 bytes"));
    free(s);
}

static void test_streamed_bodies_get_the_lower_limit(void **st)
{
    (void)st;
    request_size_t *s = make(1000);
    sl_policy_req_t r;
    sl_policy_reply_t reply;
    assert_int_equal(run(s, NULL, 0, &r, &reply), SL_POLICY_CONTINUE);
    assert_int_equal(r.max_body_bytes, 1000); /* no route limit: ours */
    assert_int_equal(run(s, NULL, 500, &r, &reply), SL_POLICY_CONTINUE);
    assert_int_equal(r.max_body_bytes, 500); /* the route's is lower: it holds */
    assert_int_equal(run(s, NULL, 5000, &r, &reply), SL_POLICY_CONTINUE);
    assert_int_equal(r.max_body_bytes, 1000);
    /* A Content-Length that is not a plain number is the codec's to refuse:
     * here it counts as undeclared, and the streaming limit still holds. */
    assert_int_equal(run(s, "12x", 0, &r, &reply), SL_POLICY_CONTINUE);
    assert_int_equal(r.max_body_bytes, 1000);
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_declared_length),
        cmocka_unit_test(test_streamed_bodies_get_the_lower_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
