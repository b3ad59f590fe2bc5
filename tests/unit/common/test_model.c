/*
 * Unit tests of the model's input side: YAML typing, anchors and their
 * bounds, several documents, JSON input, files and directories, duplicate
 * resources, durations and error formatting (common/yaml.c, model.c,
 * errors.c). Field rules are in test_validate.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DATA "tests/data/model/"

/* One document of YAML text -> its JSON value (asserts success). */
static json_t *yaml1(const char *text)
{
    sl_errors_t errs;
    sl_errors_init(&errs);
    json_t *docs = sl_yaml_to_json(text, strlen(text), "t.yaml", &errs);
    if (!docs) {
        char *s = sl_errors_format(&errs);
        fail_msg("unexpected YAML error: %s", s);
    }
    assert_int_equal(errs.count, 0);
    assert_int_equal(json_array_size(docs), 1);
    json_t *v = json_incref(json_array_get(docs, 0));
    json_decref(docs);
    sl_errors_free(&errs);
    return v;
}

/* YAML text that must fail: returns the formatted errors (caller frees). */
static char *yaml_error(const char *text)
{
    sl_errors_t errs;
    sl_errors_init(&errs);
    json_t *docs = sl_yaml_to_json(text, strlen(text), "t.yaml", &errs);
    assert_null(docs);
    assert_true(errs.count >= 1);
    char *s = sl_errors_format(&errs);
    sl_errors_free(&errs);
    return s;
}

static void test_yaml_core_schema_typing(void **state)
{
    (void)state;
    json_t *v = yaml1("int: 42\n"
                      "neg: -7\n"
                      "plus: +3\n"
                      "hex: 0x1F\n"
                      "oct: 0o17\n"
                      "float: 1.5\n"
                      "exp: 1e3\n"
                      "t: true\n"
                      "f: False\n"
                      "n1: null\n"
                      "n2: ~\n"
                      "n3:\n"
                      "quoted_int: '42'\n"
                      "quoted_bool: \"true\"\n"
                      "quoted_yes_is_a_string: \"yes\"\n"
                      "leading_zero_same_for_both: 08\n"
                      "tagged: !!str 7\n"
                      "big: 9223372036854775807\n"
                      "word: hello world\n");
    assert_int_equal(json_integer_value(json_object_get(v, "int")), 42);
    assert_int_equal(json_integer_value(json_object_get(v, "neg")), -7);
    assert_int_equal(json_integer_value(json_object_get(v, "plus")), 3);
    assert_int_equal(json_integer_value(json_object_get(v, "hex")), 31);
    assert_int_equal(json_integer_value(json_object_get(v, "oct")), 15);
    assert_true(json_is_real(json_object_get(v, "float")));
    assert_true(json_real_value(json_object_get(v, "float")) == 1.5);
    assert_true(json_real_value(json_object_get(v, "exp")) == 1000.0);
    assert_true(json_is_true(json_object_get(v, "t")));
    assert_true(json_is_false(json_object_get(v, "f")));
    assert_true(json_is_null(json_object_get(v, "n1")));
    assert_true(json_is_null(json_object_get(v, "n2")));
    assert_true(json_is_null(json_object_get(v, "n3")));
    assert_string_equal(json_string_value(json_object_get(v, "quoted_int")), "42");
    assert_string_equal(json_string_value(json_object_get(v, "quoted_bool")), "true");
    assert_string_equal(json_string_value(json_object_get(v, "quoted_yes_is_a_string")), "yes");
    assert_int_equal(json_integer_value(json_object_get(v, "leading_zero_same_for_both")), 8);
    assert_string_equal(json_string_value(json_object_get(v, "tagged")), "7");
    assert_true(json_integer_value(json_object_get(v, "big")) == 9223372036854775807LL);
    assert_string_equal(json_string_value(json_object_get(v, "word")), "hello world");
    json_decref(v);
}

static void test_yaml_number_errors(void **state)
{
    (void)state;
    char *s = yaml_error("big: 9223372036854775808\n");
    assert_string_equal(s, "t.yaml doc 1: line 1 column 6: integer out of range\n");
    free(s);
    s = yaml_error("x: .inf\n");
    assert_string_equal(s, "t.yaml doc 1: line 1 column 4: infinite and NaN numbers are not "
                           "supported\n");
    free(s);
    s = yaml_error("x: !!int abc\n");
    assert_non_null(strstr(s, "does not match its tag"));
    free(s);
    s = yaml_error("x: !custom abc\n");
    assert_string_equal(s, "t.yaml doc 1: line 1 column 4: unsupported tag '!custom'\n");
    free(s);
}

static void test_yaml_flow_style_and_template_braces(void **state)
{
    (void)state;
    /* Quoted in flow collections, plain in block context: every client
     * reads these alike. */
    json_t *v = yaml1("ops:\n"
                      "- {method: GET, path: \"/pets/{id}\"}\n"
                      "- {method: GET, path: '/a/{x}/b/{y}', tags: [p, q]}\n"
                      "block: /b/{id}\n"
                      "seq:\n- /s/{id}\n"
                      "nested: {inner: {k: v}}\n");
    json_t *ops = json_object_get(v, "ops");
    assert_string_equal(json_string_value(json_object_get(json_array_get(ops, 0), "path")),
                        "/pets/{id}");
    assert_string_equal(json_string_value(json_object_get(json_array_get(ops, 1), "path")),
                        "/a/{x}/b/{y}");
    assert_int_equal(json_array_size(json_object_get(json_array_get(ops, 1), "tags")), 2);
    assert_string_equal(json_string_value(json_object_get(v, "block")), "/b/{id}");
    assert_string_equal(json_string_value(json_array_get(json_object_get(v, "seq"), 0)), "/s/{id}");
    json_decref(v);
}

/* The case: kubectl refuses `{method: GET, path: /pets/{id}}`
 * ("did not find expected ',' or '}'"); so does the model, naming the line
 * and the value to quote. */
static void test_yaml_unquoted_template_in_flow_mapping_is_refused_with_hint(void **state)
{
    (void)state;
    char *s = yaml_error("kind: Api\n"
                         "spec:\n"
                         "  operations:\n"
                         "  - {method: GET, path: /pets}\n"
                         "  - {method: GET, path: /pets/{id}}\n");
    assert_string_equal(s, "t.yaml doc 1: line 5: a '{' or '}' inside a plain value in a flow "
                           "mapping: quote the value: \"/pets/{id}\"\n");
    free(s);
    s = yaml_error("a: {m: GET,\n    path: /a/{x}/b/{y}, t: [p]}\n");
    assert_string_equal(s, "t.yaml doc 1: line 2: a '{' or '}' inside a plain value in a flow "
                           "mapping: quote the value: \"/a/{x}/b/{y}\"\n");
    free(s);
    s = yaml_error("paths: [/x/{y}, /z]\n");
    assert_string_equal(s, "t.yaml doc 1: line 1: a '{' or '}' inside a plain value in a flow "
                           "sequence: quote the value: \"/x/{y}\"\n");
    free(s);
    /* A quote or comment before it does not confuse the search. */
    s = yaml_error("a: {q: \"{x\", p: /v/{w}} # {c}\n");
    assert_non_null(strstr(s, "quote the value: \"/v/{w}\""));
    free(s);
}

/* What kubectl (go-yaml v2, YAML 1.1 typing) reads differently from YAML 1.2
 * is refused with the spelling every client reads alike. */
static void test_yaml_kubectl_yaml11_readings_are_refused(void **state)
{
    (void)state;
    char *s = yaml_error("via: yes\n");
    assert_string_equal(s, "t.yaml doc 1: line 1 column 6: yes is the boolean true for kubectl "
                           "(YAML 1.1) but a string in YAML 1.2: write true, or quote it for the "
                           "string: \"yes\"\n");
    free(s);
    const char *bad_values[] = {"a: on\n",   "a: Off\n",   "a: n\n",     "a: Y\n",
                                "a: 017\n",  "a: 0b101\n", "a: 1_000\n", "a: -0x1F\n",
                                "a: 0X1F\n", "a: [NO]\n",  NULL};
    for (int i = 0; bad_values[i]; i++) {
        s = yaml_error(bad_values[i]);
        assert_non_null(strstr(s, "quote it"));
        free(s);
    }
    /* Keys: kubectl renames `on:` to "true", `y:` (a JWK's) to "true". */
    s = yaml_error("retries:\n  on: [reset]\n");
    assert_string_equal(s, "t.yaml doc 1: line 2 column 3: the key on is the key \"true\" for "
                           "kubectl (YAML 1.1): quote it: \"on\"\n");
    free(s);
    s = yaml_error("k: {x: a, y: b}\n");
    assert_non_null(strstr(s, "quote it: \"y\""));
    free(s);
    s = yaml_error("True: 1\n");
    assert_non_null(strstr(s, "kubectl names it true, quote it: \"True\""));
    free(s);
    s = yaml_error("0x1F: 1\n");
    assert_non_null(strstr(s, "kubectl names it 31"));
    free(s);
    s = yaml_error("~: 1\n");
    assert_non_null(strstr(s, "is null, which kubectl refuses"));
    free(s);
    s = yaml_error("b: &b {p: 1}\nc:\n  <<: *b\n");
    assert_non_null(strstr(s, "merge keys (<<) are not supported"));
    free(s);
    /* What both read alike still reads. */
    json_t *v = yaml1("\"on\": [reset]\n'y': 1\ntrue: 2\n42: 3\nv: [true, 08, 0o17, 0x1F, 1.5]\n");
    assert_non_null(json_object_get(v, "on"));
    assert_non_null(json_object_get(v, "y"));
    assert_non_null(json_object_get(v, "true"));
    assert_non_null(json_object_get(v, "42"));
    assert_int_equal(json_integer_value(json_array_get(json_object_get(v, "v"), 2)), 15);
    json_decref(v);
    /* Strings that merely start like numbers are strings for both: a
     * digit-led secret (regression: a leading 0 followed by 20 more
     * characters was taken for a long octal), '_' in a non-number. */
    v = yaml1("a: 0123456789abcdef0123456789abcdef-shared\nb: 1_abc\nc: 0123abc\nd: 0_x\n");
    assert_string_equal(json_string_value(json_object_get(v, "a")),
                        "0123456789abcdef0123456789abcdef-shared");
    assert_string_equal(json_string_value(json_object_get(v, "b")), "1_abc");
    assert_string_equal(json_string_value(json_object_get(v, "c")), "0123abc");
    assert_string_equal(json_string_value(json_object_get(v, "d")), "0_x");
    json_decref(v);
    /* ...while numbers kubectl reads after dropping '_' stay refused. */
    const char *numbers[] = {"a: 1_0.5e3\n", "a: 0x_1F\n", "a: 000000000000000000000017\n",
                             NULL};
    for (int i = 0; numbers[i]; i++) {
        s = yaml_error(numbers[i]);
        assert_non_null(strstr(s, "different number"));
        free(s);
    }
}

static void test_yaml_anchors_and_aliases(void **state)
{
    (void)state;
    json_t *v = yaml1("base: &b {x: 1, z: [1, 2]}\n"
                      "copy: *b\n"
                      "s: &s text\n"
                      "list: [*s, *s]\n");
    json_t *base = json_object_get(v, "base"), *copy = json_object_get(v, "copy");
    assert_true(json_equal(base, copy));
    assert_ptr_not_equal(base, copy); /* expanded, not shared */
    json_t *list = json_object_get(v, "list");
    assert_string_equal(json_string_value(json_array_get(list, 1)), "text");
    json_decref(v);

    char *s = yaml_error("a: *nope\n");
    assert_string_equal(s, "t.yaml doc 1: line 1 column 4: unknown alias *nope\n");
    free(s);
    /* Anchors do not cross documents. */
    s = yaml_error("a: &x 1\n---\nb: *x\n");
    assert_string_equal(s, "t.yaml doc 2: line 3 column 4: unknown alias *x\n");
    free(s);
}

static void test_yaml_billion_laughs_is_bounded(void **state)
{
    (void)state;
    /* 10^9 nodes if expanded. */
    char *s = yaml_error("a: &a [x, x, x, x, x, x, x, x, x, x]\n"
                         "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                         "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
                         "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
                         "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
                         "f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
                         "g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\n"
                         "h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]\n"
                         "i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]\n");
    assert_non_null(strstr(s, "document expands to more than 1000000 nodes"));
    free(s);
}

static void test_yaml_depth_is_bounded(void **state)
{
    (void)state;
    char text[256];
    memset(text, '[', 65);
    memset(text + 65, ']', 65);
    text[130] = '\0';
    char *s = yaml_error(text);
    assert_string_equal(s, "t.yaml doc 1: line 1 column 65: nesting deeper than 64 levels\n");
    free(s);
    /* 64 levels are fine. */
    memset(text, '[', 64);
    memset(text + 64, ']', 64);
    text[128] = '\0';
    json_t *v = yaml1(text);
    json_decref(v);
    /* An alias may not carry a value deeper than the bound either. */
    char deep[512];
    int n = snprintf(deep, sizeof(deep), "a: &a ");
    for (int i = 0; i < 40; i++)
        deep[n++] = '[';
    for (int i = 0; i < 40; i++)
        deep[n++] = ']';
    n += snprintf(deep + n, sizeof(deep) - (size_t)n, "\nb: ");
    for (int i = 0; i < 30; i++)
        deep[n++] = '[';
    n += snprintf(deep + n, sizeof(deep) - (size_t)n, "*a");
    for (int i = 0; i < 30; i++)
        deep[n++] = ']';
    deep[n] = '\0';
    s = yaml_error(deep);
    assert_non_null(strstr(s, "alias *a nests deeper than 64 levels"));
    free(s);
}

static void test_yaml_duplicate_and_complex_keys(void **state)
{
    (void)state;
    char *s = yaml_error("a: 1\nb: 2\na: 3\n");
    assert_string_equal(s, "t.yaml doc 1: line 3 column 1: duplicate key 'a'\n");
    free(s);
    s = yaml_error("? [a, b]\n: 1\n");
    assert_non_null(strstr(s, "mapping keys must be strings"));
    free(s);
}

static void test_yaml_syntax_error_has_line_and_column(void **state)
{
    (void)state;
    char *s = yaml_error("a: 1\nb: [1, 2\nc: 3\n");
    assert_non_null(strstr(s, "t.yaml doc 1: line "));
    assert_non_null(strstr(s, " column "));
    free(s);
    s = yaml_error("a: 1\n  b: 2\n");
    assert_string_equal(s, "t.yaml doc 1: line 2 column 4: mapping values are not allowed in "
                           "this context\n");
    free(s);
}

static void test_yaml_multi_document(void **state)
{
    (void)state;
    sl_errors_t errs;
    sl_errors_init(&errs);
    const char *text = "a: 1\n---\n---\nb: 2\n...\n---\n[1, 2]\n";
    json_t *docs = sl_yaml_to_json(text, strlen(text), "", &errs);
    assert_non_null(docs);
    assert_int_equal(json_array_size(docs), 4);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(docs, 0), "a")), 1);
    assert_true(json_is_null(json_array_get(docs, 1)));
    assert_int_equal(json_integer_value(json_object_get(json_array_get(docs, 2), "b")), 2);
    assert_int_equal(json_array_size(json_array_get(docs, 3)), 2);
    json_decref(docs);
    sl_errors_free(&errs);
}

/* --- sl_model_parse / sl_model_load_path -------------------------------- */

static const char *const BACKEND_DOC = "apiVersion: gateway.sluice.dev/v1alpha1\n"
                                       "kind: Backend\n"
                                       "metadata: {name: echo}\n"
                                       "spec: {endpoints: [{address: 127.0.0.1, port: 9001}]}\n";

static void test_parse_multi_document_file(void **state)
{
    (void)state;
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    assert_int_equal(sl_model_load_path(&set, "examples/quickstart.yaml", &errs), 0);
    assert_int_equal(errs.count, 0);
    assert_int_equal(set.count, 3);
    assert_int_equal(set.items[0].kind, SL_KIND_GATEWAY);
    assert_int_equal(set.items[1].kind, SL_KIND_BACKEND);
    assert_int_equal(set.items[2].kind, SL_KIND_API);
    assert_string_equal(set.items[2].name, "petstore");
    assert_string_equal(set.items[2].ns, "default");
    assert_string_equal(set.items[2].source, "examples/quickstart.yaml");
    assert_int_equal(set.items[2].doc, 3);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
}

static void test_parse_error_names_file_and_doc(void **state)
{
    (void)state;
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    assert_int_equal(sl_model_load_path(&set, DATA "bad-template.yaml", &errs), -1);
    assert_int_equal(errs.count, 1);
    char *s = sl_errors_format(&errs);
    assert_string_equal(s, DATA "bad-template.yaml doc 3: spec.operations[1].path: unbalanced "
                                "'{'\n");
    free(s);
    assert_string_equal(errs.items[0].field, "spec.operations[1].path");
    assert_int_equal(errs.items[0].doc, 3);
    /* Valid documents of the file are still added; the invalid one is not. */
    assert_int_equal(set.count, 2);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
}

static void test_parse_json_forms(void **state)
{
    (void)state;
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    const char *arr =
        "  [{\"apiVersion\":\"gateway.sluice.dev/v1alpha1\",\"kind\":\"Backend\","
        "\"metadata\":{\"name\":\"a\"},\"spec\":{\"endpoints\":[{\"address\":\"10.0.0.1\","
        "\"port\":80}]}},"
        " {\"apiVersion\":\"gateway.sluice.dev/v1alpha1\",\"kind\":\"Backend\","
        "\"metadata\":{\"name\":\"b\",\"namespace\":\"x\"},\"spec\":{\"endpoints\":[{"
        "\"address\":\"10.0.0.2\",\"port\":81}]}}]";
    assert_int_equal(sl_model_parse(&set, arr, strlen(arr), "a.json", &errs), 0);
    assert_int_equal(set.count, 2);
    assert_string_equal(set.items[1].ns, "x");
    assert_int_equal(set.items[1].doc, 2);

    const char *list =
        "{\"apiVersion\":\"v1\",\"kind\":\"List\",\"items\":[{\"apiVersion\":"
        "\"gateway.sluice.dev/v1alpha1\",\"kind\":\"Backend\",\"metadata\":{\"name\":\"c\"},"
        "\"spec\":{\"endpoints\":[{\"address\":\"10.0.0.3\",\"port\":82}]}}]}";
    assert_int_equal(sl_model_parse(&set, list, strlen(list), "l.json", &errs), 0);
    assert_int_equal(set.count, 3);
    assert_string_equal(set.items[2].name, "c");

    /* Duplicate keys and syntax errors in JSON. */
    const char *dup = "{\"kind\": \"Backend\", \"kind\": \"Api\"}";
    assert_int_equal(sl_model_parse(&set, dup, strlen(dup), "d.json", &errs), -1);
    char *s = sl_errors_format(&errs);
    assert_non_null(strstr(s, "d.json: line 1 column"));
    assert_non_null(strstr(s, "duplicate object key"));
    free(s);
    assert_int_equal(set.count, 3);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
}

static void test_parse_list_in_yaml_and_empty_docs(void **state)
{
    (void)state;
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    char text[1024];
    snprintf(text, sizeof(text), "---\n# only a comment\n---\n%s", BACKEND_DOC);
    assert_int_equal(sl_model_parse(&set, text, strlen(text), "e.yaml", &errs), 0);
    assert_int_equal(set.count, 1);
    assert_int_equal(set.items[0].doc, 2); /* the empty document still counts */
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
}

static void test_parse_duplicate_resources(void **state)
{
    (void)state;
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    assert_int_equal(sl_model_parse(&set, BACKEND_DOC, strlen(BACKEND_DOC), "one.yaml", &errs), 0);
    assert_int_equal(sl_model_parse(&set, BACKEND_DOC, strlen(BACKEND_DOC), "two.yaml", &errs), -1);
    char *s = sl_errors_format(&errs);
    assert_string_equal(s, "two.yaml doc 1: metadata.name: Backend \"default/echo\" is defined "
                           "twice (also at one.yaml doc 1)\n");
    free(s);
    assert_int_equal(set.count, 1);
    /* Same name in another namespace, or another kind, is fine. */
    const char *other = "apiVersion: gateway.sluice.dev/v1alpha1\nkind: Backend\n"
                        "metadata: {name: echo, namespace: staging}\n"
                        "spec: {endpoints: [{address: 127.0.0.1, port: 9001}]}\n";
    assert_int_equal(sl_model_parse(&set, other, strlen(other), "three.yaml", &errs), 0);
    assert_int_equal(set.count, 2);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
}

static void test_load_directory_in_name_order(void **state)
{
    (void)state;
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    assert_int_equal(sl_model_load_path(&set, DATA "dir", &errs), 0);
    assert_int_equal(errs.count, 0);
    assert_int_equal(set.count, 3); /* notes.txt and .hidden.yaml are skipped */
    assert_int_equal(set.items[0].kind, SL_KIND_GATEWAY);
    assert_string_equal(set.items[0].source, DATA "dir/10-gateway.yaml");
    assert_int_equal(set.items[1].kind, SL_KIND_BACKEND);
    assert_string_equal(set.items[1].source, DATA "dir/20-backend.yml");
    assert_int_equal(set.items[2].kind, SL_KIND_API);
    assert_string_equal(set.items[2].source, DATA "dir/30-api.json");
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
}

static void test_load_missing_path(void **state)
{
    (void)state;
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    assert_int_equal(sl_model_load_path(&set, DATA "does-not-exist.yaml", &errs), -1);
    char *s = sl_errors_format(&errs);
    assert_string_equal(s, DATA "does-not-exist.yaml: cannot open: No such file or directory\n");
    free(s);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
}

static void test_durations(void **state)
{
    (void)state;
    struct {
        const char *text;
        int rc;
        uint64_t ms;
    } cases[] = {
        {"250ms", 0, 250},
        {"10s", 0, 10000},
        {"1m", 0, 60000},
        {"1h", 0, 3600000},
        {"0s", 0, 0},
        {"10", -1, 0},
        {"1.5s", -1, 0},
        {"-1s", -1, 0},
        {"10 s", -1, 0},
        {"1m30s", -1, 0},
        {"", -1, 0},
        {"5d", -1, 0},
        {"4294967295ms", 0, 4294967295ULL},
        {"4294967296ms", -1, 0},
        {"1200h", -1, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *v = json_string(cases[i].text);
        uint64_t ms = 12345;
        int rc = sl_parse_duration_ms(v, &ms);
        if (rc != cases[i].rc)
            fail_msg("duration '%s': rc %d, want %d", cases[i].text, rc, cases[i].rc);
        if (rc == 0)
            assert_int_equal(ms, cases[i].ms);
        json_decref(v);
    }
    json_t *i = json_integer(1500);
    uint64_t ms = 0;
    assert_int_equal(sl_parse_duration_ms(i, &ms), 0);
    assert_int_equal(ms, 1500);
    json_decref(i);
    i = json_integer(-1);
    assert_int_equal(sl_parse_duration_ms(i, &ms), -1);
    json_decref(i);
    i = json_real(1.5);
    assert_int_equal(sl_parse_duration_ms(i, &ms), -1);
    json_decref(i);
}

static void test_error_format(void **state)
{
    (void)state;
    sl_errors_t errs;
    sl_errors_init(&errs);
    sl_errors_add(&errs, "q.yaml", 3, "spec.x", "bad %d", 7);
    sl_errors_add(&errs, "", 0, "spec.y", "no source");
    sl_errors_add(&errs, "", 2, "", "doc only");
    sl_errors_add(&errs, "f.yaml", 0, "", "file only");
    char *s = sl_errors_format(&errs);
    assert_string_equal(s, "q.yaml doc 3: spec.x: bad 7\n"
                           "spec.y: no source\n"
                           "doc 2: doc only\n"
                           "f.yaml: file only\n");
    free(s);
    s = sl_error_format(&errs.items[0]);
    assert_string_equal(s, "q.yaml doc 3: spec.x: bad 7");
    free(s);
    sl_errors_free(&errs);
    assert_int_equal(errs.count, 0);
}

static void test_kind_names(void **state)
{
    (void)state;
    enum sl_kind k;
    assert_int_equal(sl_kind_from_name("Api", &k), 0);
    assert_int_equal(k, SL_KIND_API);
    assert_int_equal(sl_kind_from_plural("certificates", &k), 0);
    assert_int_equal(k, SL_KIND_CERTIFICATE);
    assert_int_equal(sl_kind_from_name("api", &k), -1);
    assert_int_equal(sl_kind_from_plural("gateway", &k), -1);
    assert_string_equal(sl_kind_name(SL_KIND_BACKEND), "Backend");
    assert_string_equal(sl_kind_plural(SL_KIND_CONSUMER), "consumers");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_yaml_core_schema_typing),
        cmocka_unit_test(test_yaml_number_errors),
        cmocka_unit_test(test_yaml_flow_style_and_template_braces),
        cmocka_unit_test(test_yaml_unquoted_template_in_flow_mapping_is_refused_with_hint),
        cmocka_unit_test(test_yaml_kubectl_yaml11_readings_are_refused),
        cmocka_unit_test(test_yaml_anchors_and_aliases),
        cmocka_unit_test(test_yaml_billion_laughs_is_bounded),
        cmocka_unit_test(test_yaml_depth_is_bounded),
        cmocka_unit_test(test_yaml_duplicate_and_complex_keys),
        cmocka_unit_test(test_yaml_syntax_error_has_line_and_column),
        cmocka_unit_test(test_yaml_multi_document),
        cmocka_unit_test(test_parse_multi_document_file),
        cmocka_unit_test(test_parse_error_names_file_and_doc),
        cmocka_unit_test(test_parse_json_forms),
        cmocka_unit_test(test_parse_list_in_yaml_and_empty_docs),
        cmocka_unit_test(test_parse_duplicate_resources),
        cmocka_unit_test(test_load_directory_in_name_order),
        cmocka_unit_test(test_load_missing_path),
        cmocka_unit_test(test_durations),
        cmocka_unit_test(test_error_format),
        cmocka_unit_test(test_kind_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
