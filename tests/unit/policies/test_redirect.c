/* redirect: Location templates (${path}, ${query} with its '?', ${host}). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../../../policies/redirect/redirect.c"

static sl_policy_req_t req(const char *path, const char *query, const char *host)
{
    sl_policy_req_t r;
    memset(&r, 0, sizeof(r));
    r.path = (sl_str_t){path, strlen(path)};
    r.query = (sl_str_t){query, strlen(query)};
    r.host = (sl_str_t){host, strlen(host)};
    return r;
}

static void expect(const char *tpl, const sl_policy_req_t *r, const char *want)
{
    char out[256];
    size_t n = expand(tpl, r, NULL);
    assert_true(n < sizeof(out));
    assert_int_equal(expand(tpl, r, out), n);
    out[n] = '\0';
    assert_string_equal(out, want);
}

static void test_location(void **st)
{
    (void)st;
    sl_policy_req_t r = req("/a/b", "x=1", "shop.example.com");
    expect("https://new.example.com${path}${query}", &r, "https://new.example.com/a/b?x=1");
    expect("https://${host}/moved", &r, "https://shop.example.com/moved");
    expect("/static", &r, "/static");
    r = req("/a", "", "h");
    expect("https://n${path}${query}", &r, "https://n/a"); /* no query: no '?' */
    expect("${unknown}", &r, "");                          /* refused by validation */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_location),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
