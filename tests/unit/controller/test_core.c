/*
 * Controller core: admission against --max-routes, counted from the store
 * and kept current between compiles.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "core.h"
#include "store.h"

#include <event2/event.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static json_t *api(const char *name, int ops)
{
    json_t *list = json_array();
    for (int i = 0; i < ops; i++) {
        char path[32];
        snprintf(path, sizeof(path), "/p%d", i);
        json_array_append_new(list, json_pack("{s:s, s:s}", "method", "GET", "path", path));
    }
    return json_pack("{s:s, s:s, s:{s:s, s:s}, s:{s:s, s:[{s:s}], s:o}}", "apiVersion",
                     "gateway.sluice.dev/v1alpha1", "kind", "Api", "metadata", "name", name,
                     "namespace", "default", "spec", "basePath", "/x", "backendRefs", "name",
                     "echo", "operations", list);
}

static void test_admission_counts_routes(void **state)
{
    (void)state;
    char dir[] = "/tmp/sl-core-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char err[512];
    sl_store_t *st = sl_store_open(dir, err, sizeof(err));
    assert_non_null(st);
    struct event_base *base = event_base_new();
    sl_controller_t *ctl = sl_controller_new(base, st, NULL);
    sl_controller_set_max_routes(ctl, 3);

    json_t *a = json_pack("[o]", api("a", 2));
    assert_int_equal(sl_controller_admit(ctl, a, err, sizeof(err)), 0);
    json_t *b = json_pack("[o]", api("b", 2));
    assert_int_equal(sl_controller_admit(ctl, b, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "4 routes"));
    assert_non_null(strstr(err, "--max-routes 3"));
    /* Replacing an Api counts its new size instead of its old one. */
    json_t *a1 = json_pack("[o]", api("a", 1));
    assert_int_equal(sl_controller_admit(ctl, a1, err, sizeof(err)), 0);
    assert_int_equal(sl_controller_admit(ctl, b, err, sizeof(err)), 0);
    /* Full again; a deleted Api frees its routes. */
    json_t *c = json_pack("[o]", api("c", 1));
    assert_int_equal(sl_controller_admit(ctl, c, err, sizeof(err)), -1);
    sl_controller_forget(ctl, SL_KIND_API, "default", "b");
    assert_int_equal(sl_controller_admit(ctl, c, err, sizeof(err)), 0);
    /* Several documents at once are judged together. */
    json_t *two = json_pack("[o, o]", api("d", 1), api("e", 1));
    assert_int_equal(sl_controller_admit(ctl, two, err, sizeof(err)), -1);

    json_decref(a);
    json_decref(b);
    json_decref(a1);
    json_decref(c);
    json_decref(two);
    sl_controller_free(ctl);
    event_base_free(base);
    sl_store_close(st);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_admission_counts_routes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
