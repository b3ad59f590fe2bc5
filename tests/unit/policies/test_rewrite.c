/* rewrite: an operation's path parameters found in the request path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../../../policies/rewrite/rewrite.c"

static sl_policy_req_t req(const char *path, const char *query, const char *host)
{
    sl_policy_req_t r;
    memset(&r, 0, sizeof(r));
    r.path = (sl_str_t){path, strlen(path)};
    r.query = (sl_str_t){query, strlen(query)};
    r.host = (sl_str_t){host, strlen(host)};
    return r;
}

static void expect_param(const char *tpl, const char *path, size_t base, const char *name,
                         const char *want)
{
    sl_policy_req_t r = req(path, "", "h");
    r.route_path = (sl_str_t){tpl, strlen(tpl)};
    r.route_path_template = 1;
    r.base_path_len = base;
    sl_str_t v;
    int rc = sl_policy_path_param(&r, name, strlen(name), &v);
    if (!want) {
        assert_int_equal(rc, -1);
        return;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(v.len, strlen(want));
    assert_memory_equal(v.ptr, want, v.len);
}

static void test_params(void **st)
{
    (void)st;
    expect_param("/pets/{id}", "/v1/pets/42", 3, "id", "42");
    expect_param("/pets/{id}/photos/{p}", "/pets/7/photos/x%20y", 0, "p", "x%20y");
    expect_param("/pets/{id}", "/pets/7", 0, "name", NULL);
    expect_param("/{a}/{b}", "/base/1/2", 5, "b", "2");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
