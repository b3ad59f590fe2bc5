/*
 * Unit tests of the pure parts of the Kubernetes-compatible API
 * (controller/kapi.c, included to reach its static functions): ages as
 * kubectl prints them, label and field selectors, JSON merge patch (RFC
 * 7386), JSON patch (RFC 6902), the JSONPath subset of printer columns and
 * the removal of unknown fields by their validation path. The HTTP side is
 * covered by tests/integration/test_kubectl.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kapi.c"

static void test_human_duration_as_kubectl(void **state)
{
    (void)state;
    static const struct {
        int64_t s;
        const char *want;
    } cases[] = {
        {-5, "<invalid>"},
        {-1, "0s"},
        {0, "0s"},
        {119, "119s"},
        {120, "2m"},
        {330, "5m30s"},
        {600, "10m"},
        {10799, "179m"},
        {10800, "3h"},
        {12600, "3h30m"},
        {28800, "8h"},
        {169200, "47h"},
        {172800, "2d"},
        {190800, "2d5h"},
        {691200, "8d"},
        {400 * 86400, "400d"},
        {(3 * 365 + 10) * 86400LL, "3y10d"},
        {9 * 365 * 86400LL, "9y"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char out[32];
        human_duration(cases[i].s, out, sizeof(out));
        assert_string_equal(out, cases[i].want);
    }
}

static json_t *labelled(const char *name, const char *ns, const char *labels_json)
{
    json_t *o = json_pack("{s:{s:s, s:s}}", "metadata", "name", name, "namespace", ns);
    json_object_set_new(json_object_get(o, "metadata"), "labels", json_loads(labels_json, 0, NULL));
    return o;
}

static bool selects(const char *ls, const char *fs, json_t *obj)
{
    filter_t f;
    char err[600];
    memset(&f, 0, sizeof(f));
    assert_int_equal(parse_label_selector(ls, &f, err, sizeof(err)), 0);
    assert_int_equal(parse_field_selector(fs, &f, err, sizeof(err)), 0);
    return filter_match(&f, obj);
}

static void test_selectors(void **state)
{
    (void)state;
    json_t *a = labelled("a", "default", "{\"env\": \"prod\", \"tier\": \"1\"}");
    json_t *b = labelled("b", "team", "{\"env\": \"dev\"}");
    assert_true(selects("env=prod", "", a));
    assert_false(selects("env==prod", "", b));
    assert_true(selects("env!=prod", "", b));
    assert_true(selects("env in (dev, prod)", "", b));
    assert_false(selects("env notin (dev,qa)", "", b));
    assert_true(selects("tier", "", a));
    assert_true(selects("!tier", "", b));
    assert_true(selects("tier, env in (prod)", "metadata.name=a", a));
    assert_false(selects("", "metadata.name!=a", a));
    assert_true(selects("", "metadata.namespace==team", b));
    assert_false(selects("", "metadata.namespace=team", a));
    filter_t f;
    char err[600];
    memset(&f, 0, sizeof(f));
    assert_int_equal(parse_label_selector("env in prod", &f, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "parentheses"));
    assert_int_equal(parse_label_selector("bad key=x", &f, err, sizeof(err)), -1);
    assert_int_equal(parse_field_selector("spec.basePath=/x", &f, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "field label not supported: spec.basePath"));
    json_decref(a);
    json_decref(b);
}

static void assert_json(json_t *got, const char *want_text)
{
    json_t *want = json_loads(want_text, 0, NULL);
    assert_non_null(want);
    if (!json_equal(got, want)) {
        char *g = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);
        fail_msg("got %s, want %s", g, want_text);
    }
    json_decref(want);
}

static void test_merge_patch_rfc7386(void **state)
{
    (void)state;
    json_t *doc = json_loads("{\"a\": {\"b\": 1, \"c\": [1, 2]}, \"d\": 2}", 0, NULL);
    json_t *patch = json_loads("{\"a\": {\"b\": null, \"c\": [3], \"e\": {\"f\": 1}}, \"d\": null, "
                               "\"g\": \"x\"}",
                               0, NULL);
    doc = merge_patch(doc, patch);
    assert_json(doc, "{\"a\": {\"c\": [3], \"e\": {\"f\": 1}}, \"g\": \"x\"}");
    json_decref(doc);
    json_decref(patch);
}

static void test_json_patch_rfc6902(void **state)
{
    (void)state;
    json_t *doc = json_loads("{\"a\": [1, 2], \"b\": {\"x~/y\": 1}}", 0, NULL);
    json_t *ops = json_loads("[{\"op\": \"add\", \"path\": \"/a/1\", \"value\": 9},"
                             " {\"op\": \"add\", \"path\": \"/a/-\", \"value\": 3},"
                             " {\"op\": \"remove\", \"path\": \"/a/0\"},"
                             " {\"op\": \"replace\", \"path\": \"/b/x~0~1y\", \"value\": 2},"
                             " {\"op\": \"copy\", \"from\": \"/b\", \"path\": \"/c\"},"
                             " {\"op\": \"move\", \"from\": \"/c/x~0~1y\", \"path\": \"/d\"},"
                             " {\"op\": \"test\", \"path\": \"/d\", \"value\": 2}]",
                             0, NULL);
    char err[300];
    assert_int_equal(json_patch(doc, ops, err, sizeof(err)), 0);
    assert_json(doc, "{\"a\": [9, 2, 3], \"b\": {\"x~/y\": 2}, \"c\": {}, \"d\": 2}");
    json_decref(ops);
    static const char *const bad[] = {
        "[{\"op\": \"test\", \"path\": \"/d\", \"value\": 3}]",
        "[{\"op\": \"remove\", \"path\": \"/nothing\"}]",
        "[{\"op\": \"replace\", \"path\": \"/a/7\", \"value\": 1}]",
        "[{\"op\": \"add\", \"path\": \"/no/such\", \"value\": 1}]",
        "[{\"op\": \"jump\", \"path\": \"/a\"}]",
        "{\"op\": \"add\"}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ops = json_loads(bad[i], 0, NULL);
        assert_int_equal(json_patch(doc, ops, err, sizeof(err)), -1);
        assert_true(err[0] != '\0');
        json_decref(ops);
    }
    json_decref(doc);
}

static void test_jsonpath_of_printer_columns(void **state)
{
    (void)state;
    json_t *o = json_loads("{\"spec\": {\"refs\": [{\"name\": \"a\"}, {\"name\": \"b\"}]},"
                           " \"status\": {\"conditions\": [{\"type\": \"Accepted\", \"status\": "
                           "\"True\"}, {\"type\": \"Programmed\", \"status\": \"False\"}]}}",
                           0, NULL);
    json_t *col = json_pack("{s:s, s:s}", "jsonPath", ".spec.refs[*].name", "type", "string");
    json_t *cell = cell_of(o, col);
    assert_string_equal(json_string_value(cell), "a,b");
    json_decref(cell);
    json_object_set_new(col, "jsonPath",
                        json_string(".status.conditions[?(@.type==\"Programmed\")].status"));
    cell = cell_of(o, col);
    assert_string_equal(json_string_value(cell), "False");
    json_decref(cell);
    json_object_set_new(col, "jsonPath", json_string(".spec.refs[1].name"));
    cell = cell_of(o, col);
    assert_string_equal(json_string_value(cell), "b");
    json_decref(cell);
    json_object_set_new(col, "jsonPath", json_string(".spec.missing"));
    cell = cell_of(o, col);
    assert_true(json_is_null(cell));
    json_decref(cell);
    json_decref(col);
    json_decref(o);
}

static void test_delete_field_by_validation_path(void **state)
{
    (void)state;
    json_t *o = json_loads("{\"spec\": {\"ops\": [{\"x\": 1, \"odd\": 2}], \"a.b\": 1, \"c\": 3},"
                           " \"top\": 1}",
                           0, NULL);
    delete_field(o, "spec.ops[0].odd");
    delete_field(o, "spec.a.b");
    delete_field(o, "top");
    delete_field(o, "spec.none.deeper");
    assert_json(o, "{\"spec\": {\"ops\": [{\"x\": 1}], \"c\": 3}}");
    json_decref(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_human_duration_as_kubectl),
        cmocka_unit_test(test_selectors),
        cmocka_unit_test(test_merge_patch_rfc7386),
        cmocka_unit_test(test_json_patch_rfc6902),
        cmocka_unit_test(test_jsonpath_of_printer_columns),
        cmocka_unit_test(test_delete_field_by_validation_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
