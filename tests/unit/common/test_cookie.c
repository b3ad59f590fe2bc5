/* sl_cookie_find: the one Cookie reader of the routing rules and the jwt
 * policy. */
#include "cookie.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

static int find(const char *header, const char *name, char *out, size_t outlen)
{
    sl_str_t v;
    if (!sl_cookie_find(header, strlen(header), name, strlen(name), &v))
        return 0;
    snprintf(out, outlen, "%.*s", (int)v.len, v.ptr);
    return 1;
}

static void test_names_values_and_quotes(void **state)
{
    (void)state;
    char v[64];
    assert_true(find("a=1; session=abc; b=2", "session", v, sizeof(v)));
    assert_string_equal(v, "abc");
    assert_true(find("a=1;b=2", "b", v, sizeof(v)));
    assert_string_equal(v, "2");
    assert_true(find("tok=\"x.y.z\" ", "tok", v, sizeof(v))); /* quotes, trailing space */
    assert_string_equal(v, "x.y.z");
    assert_true(find("empty=; a=1", "empty", v, sizeof(v)));
    assert_string_equal(v, "");
    /* Exact names only: a prefix, a longer name or a value never match. */
    assert_false(find("sessionid=1", "session", v, sizeof(v)));
    assert_false(find("session=1", "sessionid", v, sizeof(v)));
    assert_false(find("a=session", "session", v, sizeof(v)));
    assert_false(find("noequals; ;;", "noequals", v, sizeof(v)));
    assert_false(find("", "a", v, sizeof(v)));
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_names_values_and_quotes)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
