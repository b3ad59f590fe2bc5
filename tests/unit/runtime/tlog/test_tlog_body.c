/*
 * Unit tests of runtime/tlog/tlog_body.c: content types, JSON and form
 * redaction (at depth, escaped names, failing closed on anything that is
 * not one complete JSON value), the record strings, and the body object as
 * format_json writes it (tlog.c).
 */
#include "tlog.c"
#include "tlog_body.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>

static char *const names[] = {"password", "token", "card number"};

static char *redact(const char *in)
{
    static char out[4096];
    ssize_t n = sl_tlog_redact_json(in, strlen(in), names, 3, out);
    if (n < 0)
        return NULL;
    assert_true((size_t)n <= SL_TLOG_BODY_REDACTED_MAX(strlen(in)));
    out[n] = '\0';
    return out;
}

static void test_json_redaction_at_depth(void **state)
{
    (void)state;
    assert_string_equal(redact("{\"a\":1,\"password\":\"x\"}"),
                        "{\"a\":1,\"password\":\"[redacted]\"}");
    /* Any value, any depth, inside arrays; formatting kept. */
    assert_string_equal(
        redact(" { \"u\" : [ {\"token\" : {\"deep\": [1,2]} } , {\"Token\":true} ] } "),
        " { \"u\" : [ {\"token\" : \"[redacted]\" } , {\"Token\":true} ] } ");
    assert_string_equal(redact("{\"card number\":4111111111111111,\"n\":null}"),
                        "{\"card number\":\"[redacted]\",\"n\":null}");
    /* An escaped name is the name it spells. */
    assert_string_equal(redact("{\"p\\u0061ssword\":\"s\",\"x\":\"\\\"password\\\"\"}"),
                        "{\"p\\u0061ssword\":\"[redacted]\",\"x\":\"\\\"password\\\"\"}");
    /* A name as a value, a longer name, a top-level scalar: kept. */
    assert_string_equal(redact("[\"password\",{\"passwords\":1}]"),
                        "[\"password\",{\"passwords\":1}]");
    assert_string_equal(redact("-12.5e+3"), "-12.5e+3");
    assert_string_equal(redact("{}"), "{}");
    assert_string_equal(redact("[]"), "[]");
    /* Unicode beyond the BMP, escaped or not. */
    assert_string_equal(redact("{\"\\ud83d\\ude00\":\"\xf0\x9f\x98\x80\",\"token\":\"t\"}"),
                        "{\"\\ud83d\\ude00\":\"\xf0\x9f\x98\x80\",\"token\":\"[redacted]\"}");
}

static void test_json_redaction_fails_closed(void **state)
{
    (void)state;
    const char *bad[] = {
        "",
        "   ",
        "{",
        "{\"a\"}",
        "{\"a\":}",
        "{\"a\":1,}",
        "[1,]",
        "01",
        "1.",
        "-",
        "tru",
        "{\"a\":1} x",
        "{'a':1}",
        "\"\\x\"",
        "{\"password\":\"x\", oops}",
        "\"a\tb\"",
        "{\"a\":\"\\u12\"}",
        "[1 2]",
        "{\"a\" 1}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_null(redact(bad[i]));
    /* Every strict prefix of an object is refused. */
    const char *doc = "{\"user\":\"ann\",\"password\":\"hunter2\",\"list\":[1,{\"token\":2.5e3}]}";
    char buf[256], out[2048];
    for (size_t n = 0; n < strlen(doc); n++) {
        memcpy(buf, doc, n);
        assert_int_equal(sl_tlog_redact_json(buf, n, names, 3, out), -1);
    }
    /* Deeper than 64: refused rather than recursed into. */
    char deep[300];
    size_t k = 0;
    for (int i = 0; i < 100; i++)
        deep[k++] = '[';
    for (int i = 0; i < 100; i++)
        deep[k++] = ']';
    deep[k] = '\0';
    assert_null(redact(deep));
    /* 64 is fine. */
    k = 0;
    for (int i = 0; i < 64; i++)
        deep[k++] = '[';
    for (int i = 0; i < 64; i++)
        deep[k++] = ']';
    deep[k] = '\0';
    assert_non_null(redact(deep));
}

static char *form(const char *in)
{
    static char out[4096];
    size_t n = sl_tlog_redact_form(in, strlen(in), names, 3, out);
    assert_true(n <= SL_TLOG_BODY_REDACTED_MAX(strlen(in)));
    out[n] = '\0';
    return out;
}

static void test_form_redaction(void **state)
{
    (void)state;
    assert_string_equal(form("a=1&password=x&b=2"), "a=1&password=[redacted]&b=2");
    assert_string_equal(form("card+number=4111&card%20number=1&pass%77ord=y&token"),
                        "card+number=[redacted]&card%20number=[redacted]&pass%77ord=[redacted]&"
                        "token");
    assert_string_equal(form("password=&password="), "password=[redacted]&password=[redacted]");
    assert_string_equal(form("Password=x&x=password&%zz=1&%"), "Password=x&x=password&%zz=1&%");
    /* A pair cut by the cap keeps its name only. */
    assert_string_equal(form("a=1&password=hun"), "a=1&password=[redacted]");
    assert_string_equal(form("a=1&passw"), "a=1&passw");
    /* The worst growth stays in the bound. */
    assert_string_equal(form("token=&token=&token="),
                        "token=[redacted]&token=[redacted]&token=[redacted]");
}

static void test_content_types(void **state)
{
    (void)state;
    sl_tlog_policy_t p = sl_tlog_policy_default;
#define KIND(s) sl_tlog_body_kind(&p, s, strlen(s))
    assert_int_equal(KIND("application/json"), SL_TLOG_BODY_JSON);
    assert_int_equal(KIND(" Application/JSON ; charset=utf-8"), SL_TLOG_BODY_JSON);
    assert_int_equal(KIND("application/problem+json"), SL_TLOG_BODY_JSON);
    assert_int_equal(KIND("application/x-www-form-urlencoded"), SL_TLOG_BODY_FORM);
    assert_int_equal(KIND("text/plain;charset=utf-8"), SL_TLOG_BODY_TEXT);
    assert_int_equal(KIND("text/html"), SL_TLOG_BODY_TEXT);
    assert_int_equal(KIND("application/octet-stream"), SL_TLOG_BODY_SKIP);
    assert_int_equal(KIND("application/jsonx"), SL_TLOG_BODY_SKIP);
    assert_int_equal(KIND("application/+json"), SL_TLOG_BODY_SKIP);
    assert_int_equal(KIND("multipart/form-data; boundary=x"), SL_TLOG_BODY_SKIP);
    assert_int_equal(KIND("textplain"), SL_TLOG_BODY_SKIP);
    assert_int_equal(KIND(""), SL_TLOG_BODY_SKIP);
    char *only[] = {"application/octet-stream"};
    p.body_types = only;
    p.num_body_types = 1;
    assert_int_equal(KIND("application/octet-stream"), SL_TLOG_BODY_TEXT);
    assert_int_equal(KIND("application/json"), SL_TLOG_BODY_SKIP);
#undef KIND
}

/* The body's object as format_json writes it, parsed back. */
static json_t *body_object(const sl_tlog_policy_t *p, const sl_tlog_body_t *b)
{
    char meta[SL_TLOG_BODY_META_MAX];
    static char scratch[1 << 16];
    sl_str_t text;
    size_t ml = sl_tlog_body_strings(p, b, meta, &text, scratch);
    assert_true(ml <= SL_TLOG_BODY_META_MAX);
    sl_tlog_view_t v = {0};
    v.rec.fields = SL_TLOG_BIT(SL_TLOG_F_REQUEST_BODY) | SL_TLOG_BIT(SL_TLOG_F_STATUS);
    v.rec.status = 200;
    v.rec.str[SL_TLOG_S_REQUEST_BODY_META] = (sl_str_t){meta, ml};
    v.rec.str[SL_TLOG_S_REQUEST_BODY] = text;
    static char out[1 << 20];
    size_t n = format_json(out, sizeof(out), &v);
    assert_true(n > 0);
    json_error_t err;
    json_t *j = json_loadb(out, n, 0, &err);
    assert_non_null(j);
    json_t *o = json_incref(json_object_get(j, "request_body"));
    json_decref(j);
    assert_non_null(o);
    return o;
}

static void test_record_strings(void **state)
{
    (void)state;
    sl_tlog_policy_t p = sl_tlog_policy_default;
    const char *doc = "{\"password\":\"x\",\"q\":\"\\\"\xff\"}";
    sl_tlog_body_t b = {SL_TLOG_BODY_JSON, {"application/json", 16}, doc, strlen(doc), strlen(doc)};
    /* No redaction: the bytes as a string, invalid UTF-8 escaped (\u00ff). */
    json_t *o = body_object(&p, &b);
    assert_string_equal(json_string_value(json_object_get(o, "content_type")), "application/json");
    assert_int_equal(json_integer_value(json_object_get(o, "size")), strlen(doc));
    assert_string_equal(json_string_value(json_object_get(o, "text")),
                        "{\"password\":\"x\",\"q\":\"\\\"\xc3\xbf\"}");
    assert_null(json_object_get(o, "_truncated"));
    json_decref(o);

    /* Redaction on: the redacted text. */
    char *red[] = {"password"};
    p.body_redact = red;
    p.num_body_redact = 1;
    const char *ok = "{\"password\":\"x\",\"a\":[1]}";
    b.data = ok;
    b.len = b.size = strlen(ok);
    o = body_object(&p, &b);
    assert_string_equal(json_string_value(json_object_get(o, "text")),
                        "{\"password\":\"[redacted]\",\"a\":[1]}");
    json_decref(o);

    /* Cut at the cap: omitted, never the bytes, even a prefix that parses. */
    b.data = "1234";
    b.len = 2;
    b.size = 4;
    o = body_object(&p, &b);
    assert_null(json_object_get(o, "text"));
    assert_int_equal(json_integer_value(json_object_get(o, "_truncated")), 2);
    assert_string_equal(json_string_value(json_object_get(o, "_omitted")),
                        "truncated JSON cannot be redacted");
    json_decref(o);

    /* Not listed: type and size only; a hostile content type is escaped. */
    b.kind = SL_TLOG_BODY_SKIP;
    b.ctype = (sl_str_t){"x/\"y\"\n\\", 7};
    b.data = NULL;
    b.len = 0;
    b.size = 10;
    o = body_object(&p, &b);
    assert_string_equal(json_string_value(json_object_get(o, "content_type")), "x/\"y\"\n\\");
    assert_string_equal(json_string_value(json_object_get(o, "_omitted")),
                        "content type not logged");
    assert_null(json_object_get(o, "text"));
    json_decref(o);

    /* Text: as is, cut, redaction does not apply. */
    b.kind = SL_TLOG_BODY_TEXT;
    b.ctype = (sl_str_t){"", 0};
    b.data = "password=x";
    b.len = 8;
    b.size = 10;
    o = body_object(&p, &b);
    assert_null(json_object_get(o, "content_type"));
    assert_string_equal(json_string_value(json_object_get(o, "text")), "password");
    assert_int_equal(json_integer_value(json_object_get(o, "_truncated")), 2);
    json_decref(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_redaction_at_depth),
        cmocka_unit_test(test_json_redaction_fails_closed),
        cmocka_unit_test(test_form_redaction),
        cmocka_unit_test(test_content_types),
        cmocka_unit_test(test_record_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
