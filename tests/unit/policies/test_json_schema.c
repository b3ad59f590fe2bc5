/*
 * json-schema (policies/json-schema/): the schema compiler's errors with
 * their keyword paths, every keyword's evaluation with the failing value's
 * JSON pointer, $ref (to $defs, to any subschema, recursive, cycles), and
 * the policy's hooks: content types, the body asked for, invalid JSON and
 * the reply's message.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../../../policies/json-schema/json_schema.c"
#include "model.h"

/* ---- helpers ------------------------------------------------------------------ */

static json_t *parse(const char *text)
{
    json_error_t je;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &je);
    if (!j)
        fail_msg("bad test JSON %s: %s", text, je.text);
    return j;
}

/* The errors compiling `schema` gives, one per line, or "" when none. */
static char *errors_of(const char *schema)
{
    static char out[4096];
    json_t *j = parse(schema);
    sl_errors_t errs;
    sl_errors_init(&errs);
    sl_vctx_t c = {.errs = &errs};
    size_t saved = sl_validate_push_key(&c, "schema");
    sl_jschema_t *s = sl_jschema_compile(&c, j);
    sl_validate_pop(&c, saved);
    char *text = c.nerr ? sl_errors_format(&errs) : NULL;
    snprintf(out, sizeof(out), "%s", text ? text : "");
    assert_true((s == NULL) == (c.nerr != 0));
    free(text);
    sl_jschema_free(s);
    sl_errors_free(&errs);
    json_decref(j);
    return out;
}

static sl_jschema_t *compile_ok(const char *schema)
{
    json_t *j = parse(schema);
    sl_errors_t errs;
    sl_errors_init(&errs);
    sl_vctx_t c = {.errs = &errs};
    sl_jschema_t *s = sl_jschema_compile(&c, j);
    if (!s) {
        char *text = sl_errors_format(&errs);
        fail_msg("schema %s: %s", schema, text);
    }
    sl_errors_free(&errs);
    json_decref(j);
    return s;
}

static sl_jschema_error_t last;

static int valid(const sl_jschema_t *s, const char *value)
{
    json_error_t je;
    json_t *v = json_loads(value, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!v)
        fail_msg("bad test value %s: %s", value, je.text);
    memset(&last, 0, sizeof(last));
    int ok = sl_jschema_validate(s, v, &last);
    json_decref(v);
    return ok;
}

/* Invalid, at `pointer`, by `keyword`. */
static void invalid_at(const sl_jschema_t *s, const char *value, const char *pointer,
                       const char *keyword)
{
    if (valid(s, value))
        fail_msg("%s: valid, expected a failure at %s (%s)", value, pointer, keyword);
    if (strcmp(last.pointer, pointer) != 0 || strcmp(last.keyword, keyword) != 0)
        fail_msg("%s: failed at \"%s\" (%s: %s), expected \"%s\" (%s)", value, last.pointer,
                 last.keyword, last.message, pointer, keyword);
}

#define assert_contains(hay, needle)                                                               \
    do {                                                                                           \
        if (!strstr((hay), (needle)))                                                              \
            fail_msg("\"%s\" not in \"%s\"", (needle), (hay));                                     \
    } while (0)

/* ---- compile ------------------------------------------------------------------ */

static void test_compile_errors_name_the_keyword(void **st)
{
    (void)st;
    assert_string_equal(errors_of("{\"type\": \"object\"}"), "");
    assert_string_equal(errors_of("true"), "");
    assert_contains(errors_of("{\"properties\": {\"name\": {\"type\": \"strin\"}}}"),
                    "schema.properties.name.type: unknown type (did you mean 'string'?)");
    assert_contains(errors_of("{\"type\": [\"string\", \"string\"]}"),
                    "schema.type[1]: type string is listed twice");
    assert_contains(errors_of("{\"properties\": {\"a\": {\"maxLenght\": 3}}}"),
                    "schema.properties.a.maxLenght: unknown keyword (did you mean 'maxLength'?)");
    assert_contains(errors_of("{\"allOf\": [{\"minimum\": \"1\"}]}"),
                    "schema.allOf[0].minimum: expected a number");
    assert_contains(errors_of("{\"minLength\": -1}"),
                    "schema.minLength: expected a non-negative integer");
    assert_contains(errors_of("{\"multipleOf\": 0}"),
                    "schema.multipleOf: expected a number greater");
    assert_contains(errors_of("{\"enum\": []}"), "schema.enum: expected a non-empty list");
    assert_contains(errors_of("{\"required\": [\"a\", \"a\"]}"),
                    "schema.required[1]: \"a\" is listed twice");
    assert_contains(errors_of("{\"pattern\": \"(\"}"),
                    "schema.pattern: the pattern does not compile at offset 1");
    assert_contains(errors_of("{\"patternProperties\": {\"[\": true}}"),
                    "schema.patternProperties.[: the pattern does not compile");
    assert_contains(errors_of("{\"items\": [true]}"), "schema.items: expected a schema");
    assert_contains(errors_of("{\"definitions\": {}}"), "names it $defs");
    assert_contains(errors_of("{\"exclusiveMinimum\": true}"), "draft 4's boolean form");
    assert_contains(errors_of("{\"unevaluatedProperties\": false}"),
                    "schema.unevaluatedProperties: unevaluatedProperties is not supported");
    assert_contains(errors_of("{\"$schema\": \"http://json-schema.org/draft-07/schema#\"}"),
                    "schema.$schema: this policy implements draft 2020-12");
    assert_string_equal(
        errors_of("{\"$schema\": \"https://json-schema.org/draft/2020-12/schema\"}"), "");
    assert_contains(errors_of("{\"properties\": {\"a\": {\"$id\": \"x\"}}}"),
                    "schema.properties.a.$id: $id is only allowed at the root");
    assert_contains(errors_of("{\"properties\": {\"a\": 3}}"),
                    "schema.properties.a: expected a schema");
    assert_contains(errors_of("{\"title\": 3, \"default\": {\"any\": [1]}}"),
                    "schema.title: expected a string");
}

static void test_compile_refs(void **st)
{
    (void)st;
    assert_string_equal(errors_of("{\"$defs\": {\"a\": {\"type\": \"string\"}},"
                                  " \"items\": {\"$ref\": \"#/$defs/a\"}}"),
                        "");
    assert_contains(errors_of("{\"items\": {\"$ref\": \"#/$defs/a\"}}"),
                    "schema.items.$ref: \"#/$defs/a\" points to nothing in this schema");
    assert_contains(errors_of("{\"properties\": {\"a\": true}, \"items\": {\"$ref\": "
                              "\"#/properties\"}}"),
                    "schema.items.$ref: \"#/properties\" is not a schema");
    assert_contains(errors_of("{\"enum\": [{\"type\": \"x\"}], \"items\": {\"$ref\": "
                              "\"#/enum/0\"}}"),
                    "\"#/enum/0\" is not a schema");
    assert_contains(errors_of("{\"$ref\": \"https://example.com/s.json\"}"),
                    "schema.$ref: only references within this schema");
    assert_contains(errors_of("{\"$ref\": \"#anchor\"}"), "only references within this schema");
    /* Cycles that never descend into the value. */
    assert_contains(errors_of("{\"$ref\": \"#\"}"), "schema.$ref: this $ref leads back to itself");
    assert_contains(errors_of("{\"$defs\": {\"a\": {\"anyOf\": [{\"type\": \"string\"}, "
                              "{\"$ref\": \"#/$defs/b\"}]}, \"b\": {\"not\": {\"$ref\": "
                              "\"#/$defs/a\"}}}}"),
                    "$ref: this $ref leads back to itself");
    /* Cycles through properties or items descend: fine. */
    assert_string_equal(errors_of("{\"properties\": {\"next\": {\"$ref\": \"#\"}}}"), "");
    assert_string_equal(errors_of("{\"$defs\": {\"list\": {\"type\": \"array\", \"items\": "
                                  "{\"$ref\": \"#/$defs/list\"}}}, \"$ref\": \"#/$defs/list\"}"),
                        "");
    /* A JSON pointer's escapes: ~1 for '/', ~0 for '~', %25 for '%'. */
    assert_string_equal(errors_of("{\"$defs\": {\"a/b~c%\": {\"type\": \"null\"}},"
                                  " \"$ref\": \"#/$defs/a~1b~0c%25\"}"),
                        "");
}

/* ---- evaluate ----------------------------------------------------------------- */

static void test_types(void **st)
{
    (void)st;
    sl_jschema_t *s = compile_ok("{\"type\": \"integer\"}");
    assert_true(valid(s, "1"));
    assert_true(valid(s, "1.0")); /* 2020-12: a number with no fraction */
    assert_true(valid(s, "-9223372036854775808"));
    invalid_at(s, "1.5", "", "type");
    assert_contains(last.message, "expected integer, got number");
    invalid_at(s, "\"1\"", "", "type");
    sl_jschema_free(s);
    s = compile_ok("{\"type\": [\"string\", \"null\"]}");
    assert_true(valid(s, "\"x\""));
    assert_true(valid(s, "null"));
    invalid_at(s, "false", "", "type");
    assert_contains(last.message, "expected null or string, got boolean");
    sl_jschema_free(s);
    s = compile_ok("{\"type\": \"number\"}");
    assert_true(valid(s, "1") && valid(s, "1e300") && valid(s, "-0.5"));
    invalid_at(s, "[]", "", "type");
    sl_jschema_free(s);
    s = compile_ok("false");
    invalid_at(s, "{}", "", "false");
    sl_jschema_free(s);
    s = compile_ok("{}");
    assert_true(valid(s, "{\"anything\": [1, null]}"));
    sl_jschema_free(s);
}

static void test_enum_const_equality(void **st)
{
    (void)st;
    sl_jschema_t *s = compile_ok("{\"enum\": [1, \"a\", null, {\"k\": [1, 2]}]}");
    assert_true(valid(s, "1.0")); /* numbers compare as numbers */
    assert_true(valid(s, "\"a\""));
    assert_true(valid(s, "null"));
    assert_true(valid(s, "{\"k\": [1.0, 2]}"));
    invalid_at(s, "{\"k\": [2, 1]}", "", "enum");
    invalid_at(s, "\"A\"", "", "enum");
    invalid_at(s, "true", "", "enum");
    sl_jschema_free(s);
    s = compile_ok("{\"properties\": {\"v\": {\"const\": {\"a\": 1, \"b\": false}}}}");
    assert_true(valid(s, "{\"v\": {\"b\": false, \"a\": 1}}"));
    invalid_at(s, "{\"v\": {\"a\": 1}}", "/v", "const");
    sl_jschema_free(s);
    s = compile_ok("{\"const\": null}");
    assert_true(valid(s, "null"));
    invalid_at(s, "0", "", "const");
    sl_jschema_free(s);
}

static void test_numbers(void **st)
{
    (void)st;
    sl_jschema_t *s = compile_ok("{\"minimum\": 1, \"maximum\": 10.5}");
    assert_true(valid(s, "1") && valid(s, "10.5") && valid(s, "\"not a number\""));
    invalid_at(s, "0.99", "", "minimum");
    assert_contains(last.message, "0.98999999999999999 is less than the minimum 1");
    invalid_at(s, "11", "", "maximum");
    sl_jschema_free(s);
    s = compile_ok("{\"exclusiveMinimum\": 0, \"exclusiveMaximum\": 9007199254740993}");
    assert_true(valid(s, "1") && valid(s, "9007199254740992"));
    invalid_at(s, "0", "", "exclusiveMinimum");
    invalid_at(s, "9007199254740993", "", "exclusiveMaximum"); /* integers compare exactly */
    sl_jschema_free(s);
    s = compile_ok("{\"multipleOf\": 0.1}");
    assert_true(valid(s, "0.3") && valid(s, "12.7") && valid(s, "0") && valid(s, "-0.2"));
    invalid_at(s, "0.35", "", "multipleOf");
    sl_jschema_free(s);
    s = compile_ok("{\"multipleOf\": 3}");
    assert_true(valid(s, "9") && valid(s, "-3") && valid(s, "9.0"));
    invalid_at(s, "10", "", "multipleOf");
    invalid_at(s, "4.5", "", "multipleOf");
    sl_jschema_free(s);
}

static void test_strings(void **st)
{
    (void)st;
    sl_jschema_t *s = compile_ok("{\"minLength\": 2, \"maxLength\": 3}");
    assert_true(valid(s, "\"ab\""));
    assert_true(valid(s, "\"\\u2603\\u2603\\u2603\"")); /* 3 code points, 9 bytes */
    assert_true(valid(s, "\"\\ud83d\\ude00x\""));       /* one code point outside the BMP */
    invalid_at(s, "\"\\u2603\"", "", "minLength");
    invalid_at(s, "\"abcd\"", "", "maxLength");
    assert_contains(last.message, "4 characters, more than 3");
    assert_true(valid(s, "5"));
    sl_jschema_free(s);
    s = compile_ok("{\"pattern\": \"^[a-z]+-\\\\d{2}$\"}");
    assert_true(valid(s, "\"abc-12\""));
    invalid_at(s, "\"abc-1\"", "", "pattern");
    assert_contains(last.message, "does not match /^[a-z]+-\\d{2}$/");
    sl_jschema_free(s);
    s = compile_ok("{\"pattern\": \"b\"}"); /* unanchored */
    assert_true(valid(s, "\"abc\""));
    invalid_at(s, "\"xyz\"", "", "pattern");
    sl_jschema_free(s);
    s = compile_ok("{\"pattern\": \"^.$\"}"); /* a code point, not a byte */
    assert_true(valid(s, "\"\\u00e9\""));
    sl_jschema_free(s);
    /* A pattern that backtracks forever fails closed. */
    s = compile_ok("{\"pattern\": \"^(a+)+$\"}");
    invalid_at(s,
               "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab\"",
               "", "pattern");
    assert_contains(last.message, "too costly");
    sl_jschema_free(s);
}

static void test_arrays(void **st)
{
    (void)st;
    sl_jschema_t *s = compile_ok("{\"minItems\": 1, \"maxItems\": 3, \"items\": {\"type\": "
                                 "\"integer\"}}");
    assert_true(valid(s, "[1, 2, 3]"));
    invalid_at(s, "[]", "", "minItems");
    invalid_at(s, "[1, 2, 3, 4]", "", "maxItems");
    invalid_at(s, "[1, \"2\"]", "/1", "type");
    sl_jschema_free(s);
    s = compile_ok("{\"prefixItems\": [{\"type\": \"string\"}, {\"type\": \"number\"}],"
                   " \"items\": false}");
    assert_true(valid(s, "[\"a\", 1]") && valid(s, "[\"a\"]") && valid(s, "[]"));
    invalid_at(s, "[1, 1]", "/0", "type");
    invalid_at(s, "[\"a\", 1, null]", "/2", "false");
    sl_jschema_free(s);
    s = compile_ok("{\"uniqueItems\": true}");
    assert_true(valid(s, "[1, \"1\", [1], {\"a\": 1}, {\"a\": 2}, true, null]"));
    invalid_at(s, "[1, 2, 1.0]", "", "uniqueItems");
    assert_contains(last.message, "items 0 and 2 are equal");
    invalid_at(s, "[{\"a\": 1, \"b\": [2]}, {\"b\": [2], \"a\": 1}]", "", "uniqueItems");
    invalid_at(s, "[0, -0.0]", "", "uniqueItems");
    sl_jschema_free(s);
    s = compile_ok("{\"contains\": {\"const\": 5}}");
    assert_true(valid(s, "[1, 5]"));
    invalid_at(s, "[1, 2]", "", "contains");
    invalid_at(s, "[]", "", "contains");
    sl_jschema_free(s);
    s = compile_ok(
        "{\"contains\": {\"type\": \"string\"}, \"minContains\": 2, \"maxContains\": 3}");
    assert_true(valid(s, "[\"a\", 1, \"b\"]"));
    invalid_at(s, "[\"a\", 1]", "", "minContains");
    invalid_at(s, "[\"a\", \"b\", \"c\", \"d\"]", "", "maxContains");
    sl_jschema_free(s);
}

static void test_objects(void **st)
{
    (void)st;
    sl_jschema_t *s = compile_ok(
        "{\"type\": \"object\", \"required\": [\"id\"], \"minProperties\": 1, "
        "\"maxProperties\": 3, \"properties\": {\"id\": {\"type\": \"integer\"}, "
        "\"a/b~c\": {\"type\": \"string\"}}, \"patternProperties\": {\"^x-\": {\"type\": "
        "\"boolean\"}}, \"additionalProperties\": false}");
    assert_true(valid(s, "{\"id\": 1, \"a/b~c\": \"s\", \"x-on\": true}"));
    invalid_at(s, "{\"a/b~c\": \"s\"}", "", "required");
    assert_contains(last.message, "the property \"id\" is missing");
    invalid_at(s, "{\"id\": 1, \"a/b~c\": 2}", "/a~1b~0c", "type");
    invalid_at(s, "{\"id\": 1, \"x-on\": 2}", "/x-on", "type");
    invalid_at(s, "{\"id\": 1, \"other\": 2}", "/other", "additionalProperties");
    invalid_at(s, "{\"id\": 1, \"x-a\": true, \"x-b\": true, \"x-c\": true}", "", "maxProperties");
    sl_jschema_free(s);
    s = compile_ok("{\"additionalProperties\": {\"type\": \"number\"}, \"propertyNames\": "
                   "{\"maxLength\": 3}}");
    assert_true(valid(s, "{\"a\": 1, \"bcd\": 2}"));
    invalid_at(s, "{\"a\": \"1\"}", "/a", "type");
    invalid_at(s, "{\"abcd\": 1}", "/abcd", "maxLength");
    sl_jschema_free(s);
    s = compile_ok("{\"dependentRequired\": {\"card\": [\"billing\"]}, \"dependentSchemas\": "
                   "{\"gift\": {\"required\": [\"to\"]}}}");
    assert_true(valid(s, "{}") && valid(s, "{\"card\": 1, \"billing\": 2}"));
    invalid_at(s, "{\"card\": 1}", "", "dependentRequired");
    invalid_at(s, "{\"gift\": true}", "", "required");
    sl_jschema_free(s);
}

static void test_combinators(void **st)
{
    (void)st;
    sl_jschema_t *s = compile_ok("{\"allOf\": [{\"type\": \"integer\"}, {\"minimum\": 2}]}");
    assert_true(valid(s, "3"));
    invalid_at(s, "1", "", "minimum");
    sl_jschema_free(s);
    s = compile_ok("{\"anyOf\": [{\"type\": \"string\"}, {\"minimum\": 2}]}");
    assert_true(valid(s, "\"x\"") && valid(s, "3"));
    invalid_at(s, "1", "", "anyOf");
    sl_jschema_free(s);
    s = compile_ok("{\"oneOf\": [{\"type\": \"integer\"}, {\"minimum\": 2}]}");
    assert_true(valid(s, "1") && valid(s, "2.5"));
    invalid_at(s, "3", "", "oneOf");
    assert_contains(last.message, "more than one schema of oneOf (0 and 1)");
    invalid_at(s, "1.5", "", "oneOf");
    sl_jschema_free(s);
    s = compile_ok("{\"not\": {\"type\": \"null\"}}");
    assert_true(valid(s, "0"));
    invalid_at(s, "null", "", "not");
    sl_jschema_free(s);
    s = compile_ok("{\"if\": {\"properties\": {\"kind\": {\"const\": \"dog\"}}}, \"then\": "
                   "{\"required\": [\"bark\"]}, \"else\": {\"required\": [\"meow\"]}}");
    assert_true(valid(s, "{\"kind\": \"dog\", \"bark\": 1}"));
    assert_true(valid(s, "{\"kind\": \"cat\", \"meow\": 1}"));
    invalid_at(s, "{\"kind\": \"dog\", \"meow\": 1}", "", "required");
    invalid_at(s, "{\"kind\": \"cat\"}", "", "required");
    sl_jschema_free(s);
}

static void test_refs(void **st)
{
    (void)st;
    /* A tree, recursive through $defs; a $ref next to other keywords applies with them. */
    sl_jschema_t *s = compile_ok(
        "{\"$defs\": {\"node\": {\"type\": \"object\", \"required\": [\"v\"], \"properties\": "
        "{\"v\": {\"type\": \"integer\"}, \"kids\": {\"type\": \"array\", \"items\": {\"$ref\": "
        "\"#/$defs/node\"}}}}}, \"$ref\": \"#/$defs/node\", \"maxProperties\": 2}");
    assert_true(valid(s, "{\"v\": 1, \"kids\": [{\"v\": 2, \"kids\": [{\"v\": 3}]}]}"));
    invalid_at(s, "{\"v\": 1, \"kids\": [{\"v\": 2, \"kids\": [{\"v\": \"3\"}]}]}",
               "/kids/0/kids/0/v", "type");
    invalid_at(s, "{\"v\": 1, \"kids\": [], \"x\": 0}", "", "maxProperties");
    sl_jschema_free(s);
    /* To a subschema that is not in $defs, and to the root. */
    s = compile_ok("{\"properties\": {\"a\": {\"type\": \"string\"}, \"b\": {\"$ref\": "
                   "\"#/properties/a\"}, \"self\": {\"$ref\": \"#\"}}}");
    assert_true(valid(s, "{\"a\": \"x\", \"b\": \"y\", \"self\": {\"b\": \"z\"}}"));
    invalid_at(s, "{\"self\": {\"self\": {\"b\": 1}}}", "/self/self/b", "type");
    sl_jschema_free(s);
}

static void test_deep_values_fail_closed(void **st)
{
    (void)st;
    /* Every level goes through two nodes: deeper than the evaluator's
     * bound fails, whatever the schema says. */
    sl_jschema_t *s = compile_ok("{\"items\": {\"$ref\": \"#\"}}");
    char deep[3200];
    size_t o = 0;
    for (int i = 0; i < 1500; i++) /* under jansson's 2048 */
        deep[o++] = '[';
    for (int i = 0; i < 1500; i++)
        deep[o++] = ']';
    deep[o] = '\0';
    json_error_t je;
    json_t *v = json_loads(deep, 0, &je);
    assert_non_null(v);
    sl_jschema_error_t e;
    assert_false(sl_jschema_validate(s, v, &e));
    assert_contains(e.message, "nest too deep");
    json_decref(v);
    assert_true(valid(s, "[[[[[]]]]]"));
    sl_jschema_free(s);
}

static void test_long_pointers_keep_their_end(void **st)
{
    (void)st;
    sl_jschema_t *s = compile_ok("{\"additionalProperties\": {\"$ref\": \"#\"}, \"type\": "
                                 "\"object\"}");
    char value[8192];
    size_t o = 0;
    for (int i = 0; i < 40; i++)
        o += (size_t)snprintf(value + o, sizeof(value) - o, "{\"key-number-%02d\": ", i);
    o += (size_t)snprintf(value + o, sizeof(value) - o, "1");
    for (int i = 0; i < 40; i++)
        value[o++] = '}';
    value[o] = '\0';
    assert_false(valid(s, value));
    assert_string_equal(last.keyword, "type");
    assert_int_equal(strncmp(last.pointer, "...", 3), 0);
    assert_non_null(strstr(last.pointer, "/key-number-39"));
    assert_true(strlen(last.pointer) < sizeof(last.pointer));
    sl_jschema_free(s);
}

/* ---- the policy's hooks -------------------------------------------------------- */

typedef struct {
    sl_policy_req_t r;
    sl_policy_header_t h[2];
} req_t;

static void req_init(req_t *q, const char *content_type, int has_body)
{
    memset(q, 0, sizeof(*q));
    q->r.method = (sl_str_t){"POST", 4};
    q->r.has_body = (uint8_t)has_body;
    q->r.entry = 3;
    if (content_type) {
        q->h[0] = (sl_policy_header_t){{"Content-Type", 12}, {content_type, strlen(content_type)}};
        q->r.headers = q->h;
        q->r.num_headers = 1;
    }
}

static json_schema_t *make(const char *config)
{
    json_t *cfg = parse(config);
    sl_errors_t errs;
    sl_errors_init(&errs);
    sl_vctx_t c = {.errs = &errs, .source = "t"};
    sl_vcheck_object(&c, cfg, &config_schema);
    if (c.nerr) {
        char *s = sl_errors_format(&errs);
        fail_msg("%s", s);
    }
    sl_errors_free(&errs);
    char err[256] = "";
    json_schema_t *s = compile(cfg, NULL, err, sizeof(err));
    json_decref(cfg);
    assert_non_null(s);
    return s;
}

static void test_content_types_and_the_body_asked_for(void **st)
{
    (void)st;
    json_schema_t *s = make("{\"schema\": true, \"maxBodyBytes\": 5000, \"contentTypes\": "
                            "[\"application/json\", \"application/*+json\"]}");
    req_t q;
    sl_policy_reply_t reply;
    const char *asks[] = {"application/json", "APPLICATION/Json ; charset=utf-8",
                          "application/problem+json", "\tapplication/json"};
    for (size_t i = 0; i < 4; i++) {
        req_init(&q, asks[i], 1);
        assert_int_equal(on_request(s, &q.r, &reply), SL_POLICY_CONTINUE);
        assert_int_equal(q.r.body_entries, 1ULL << 3);
        assert_int_equal(q.r.body_max_bytes, 5000);
    }
    const char *refused[] = {"text/plain", "application/jsonx", "application/+json", "json", NULL};
    for (size_t i = 0; i < 5; i++) {
        req_init(&q, refused[i], 1);
        memset(&reply, 0, sizeof(reply));
        assert_int_equal(on_request(s, &q.r, &reply), SL_POLICY_REPLY);
        assert_int_equal(reply.status, 415);
        assert_string_equal(reply.code, "unsupported_media_type");
        assert_contains(reply.message, "application/json, application/*+json");
        assert_int_equal(q.r.body_entries, 0);
    }
    /* Nothing to check without a body. */
    req_init(&q, "text/plain", 0);
    assert_int_equal(on_request(s, &q.r, &reply), SL_POLICY_CONTINUE);
    assert_int_equal(q.r.body_entries, 0);
    js_free(s);
    s = make("{\"schema\": true, \"otherContentTypes\": \"pass\"}");
    req_init(&q, "text/plain", 1);
    assert_int_equal(on_request(s, &q.r, &reply), SL_POLICY_CONTINUE);
    assert_int_equal(q.r.body_entries, 0);
    req_init(&q, "application/json", 1);
    assert_int_equal(on_request(s, &q.r, &reply), SL_POLICY_CONTINUE);
    assert_int_equal(q.r.body_max_bytes, SL_POLICY_BODY_DEFAULT_MAX);
    js_free(s);
}

static int body(json_schema_t *s, const char *b, sl_policy_reply_t *reply)
{
    req_t q;
    req_init(&q, "application/json", 1);
    memset(reply, 0, sizeof(*reply));
    return on_body(s, &q.r, b, strlen(b), reply);
}

static void test_on_body(void **st)
{
    (void)st;
    json_schema_t *s = make("{\"maxDepth\": 4, \"schema\": {\"type\": \"object\", \"properties\": "
                            "{\"n\": {\"type\": \"integer\", \"maximum\": 10}, \"s\": {\"type\": "
                            "\"string\"}}}}");
    sl_policy_reply_t reply;
    assert_int_equal(body(s, "{\"n\": 3, \"s\": \"a\\u0000b\"}", &reply), SL_POLICY_CONTINUE);
    assert_int_equal(body(s, " {\"x\": [[[]]]} \n", &reply), SL_POLICY_CONTINUE);
    assert_int_equal(body(s, "{\"n\": 11}", &reply), SL_POLICY_REPLY);
    assert_int_equal(reply.status, 400);
    assert_string_equal(reply.code, "schema_violation");
    assert_string_equal(reply.message, "at \"/n\": maximum: 11 is greater than the maximum 10");
    /* An integer too big for 64 bits is still a number. */
    assert_int_equal(body(s, "{\"n\": 100000000000000000000000}", &reply), SL_POLICY_REPLY);
    assert_string_equal(reply.code, "schema_violation");
    assert_int_equal(body(s, "{\"s\": 100000000000000000000000}", &reply), SL_POLICY_REPLY);
    assert_contains(reply.message, "expected string, got integer");
    struct {
        const char *body, *why;
    } bad[] = {
        {"", "empty"},
        {"{\"n\": 1", "not valid JSON"},
        {"{\"n\": 1, \"n\": 2}", "duplicate object key"},
        {"{\"x\": [[[[]]]]}", "deeper than 4 levels"},
        {"{\"s\": \"[[[[[\"}", NULL}, /* brackets in strings do not count */
        {"{} {}", "not valid JSON"},
        {"{\"s\": \"\\ud800\"}", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = body(s, bad[i].body, &reply);
        if (!bad[i].why) {
            assert_int_equal(rc, SL_POLICY_CONTINUE);
            continue;
        }
        assert_int_equal(rc, SL_POLICY_REPLY);
        assert_int_equal(reply.status, 400);
        assert_string_equal(reply.code, "invalid_json");
        assert_contains(reply.message, bad[i].why);
    }
    js_free(s);
}

static void test_config_validation(void **st)
{
    (void)st;
    struct {
        const char *config, *want;
    } cases[] = {
        {"{}", "schema: required field missing"},
        {"{\"schema\": {\"type\": \"strng\"}}", "schema.type: unknown type"},
        {"{\"schema\": true, \"maxBodyBytes\": 0}", "maxBodyBytes"},
        {"{\"schema\": true, \"maxBodyBytes\": 67108865}", "maxBodyBytes"},
        {"{\"schema\": true, \"maxDepth\": 513}", "maxDepth"},
        {"{\"schema\": true, \"contentTypes\": []}", "contentTypes"},
        {"{\"schema\": true, \"contentTypes\": [\"application/json; charset=utf-8\"]}",
         "contentTypes[0]: expected a media type"},
        {"{\"schema\": true, \"contentTypes\": [\"*/json\"]}", "contentTypes[0]"},
        {"{\"schema\": true, \"contentTypes\": [\"application/x*\"]}", "contentTypes[0]"},
        {"{\"schema\": true, \"otherContentTypes\": \"allow\"}", "otherContentTypes"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *cfg = parse(cases[i].config);
        sl_errors_t errs;
        sl_errors_init(&errs);
        sl_vctx_t c = {.errs = &errs, .source = "t"};
        sl_vcheck_object(&c, cfg, &config_schema);
        char *text = sl_errors_format(&errs);
        if (!c.nerr)
            fail_msg("%s: accepted", cases[i].config);
        assert_contains(text, cases[i].want);
        free(text);
        sl_errors_free(&errs);
        json_decref(cfg);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compile_errors_name_the_keyword),
        cmocka_unit_test(test_compile_refs),
        cmocka_unit_test(test_types),
        cmocka_unit_test(test_enum_const_equality),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_arrays),
        cmocka_unit_test(test_objects),
        cmocka_unit_test(test_combinators),
        cmocka_unit_test(test_refs),
        cmocka_unit_test(test_deep_values_fail_closed),
        cmocka_unit_test(test_long_pointers_keep_their_end),
        cmocka_unit_test(test_content_types_and_the_body_asked_for),
        cmocka_unit_test(test_on_body),
        cmocka_unit_test(test_config_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
