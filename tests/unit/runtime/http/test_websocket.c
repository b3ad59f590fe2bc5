/*
 * Unit tests of runtime/http/websocket.c: the accept value of RFC 6455's own
 * example (1.3), accept checks (blanks around the value, a wrong or
 * truncated value), and fresh keys (24 base64 characters for 16 bytes,
 * never the same twice).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "websocket.c"

static void test_accept_of_the_rfc_example(void **state)
{
    (void)state;
    char out[SL_WEBSOCKET_ACCEPT_LEN + 1];
    const char *key = "dGhlIHNhbXBsZSBub25jZQ==";
    sl_websocket_accept(key, strlen(key), out);
    assert_string_equal(out, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
}

static void test_accept_ok(void **state)
{
    (void)state;
    const char *key = "dGhlIHNhbXBsZSBub25jZQ==";
    const char *good = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";
    assert_true(sl_websocket_accept_ok(key, strlen(key), good, strlen(good)));
    assert_true(sl_websocket_accept_ok(key, strlen(key), " s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\t", 30));
    assert_false(sl_websocket_accept_ok(key, strlen(key), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo", 27));
    assert_false(sl_websocket_accept_ok(key, strlen(key), "s3pPLMBiTxaQ9kYGzzhZRbK+xOO=", 28));
    assert_false(sl_websocket_accept_ok(key, strlen(key), "", 0));
    /* The accept of another key. */
    const char *other = "AQIDBAUGBwgJCgsMDQ4PEA==";
    assert_false(sl_websocket_accept_ok(other, strlen(other), good, strlen(good)));
}

static void test_key_new(void **state)
{
    (void)state;
    char a[SL_WEBSOCKET_KEY_LEN + 1], b[SL_WEBSOCKET_KEY_LEN + 1];
    assert_int_equal(sl_websocket_key_new(a), SL_OK);
    assert_int_equal(sl_websocket_key_new(b), SL_OK);
    assert_int_equal(strlen(a), SL_WEBSOCKET_KEY_LEN);
    assert_string_not_equal(a, b);
    /* 16 bytes: 22 base64 characters and "==" */
    assert_int_equal(a[22], '=');
    assert_int_equal(a[23], '=');
    unsigned char raw[20];
    assert_int_equal(EVP_DecodeBlock(raw, (const unsigned char *)a, SL_WEBSOCKET_KEY_LEN), 18);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accept_of_the_rfc_example),
        cmocka_unit_test(test_accept_ok),
        cmocka_unit_test(test_key_new),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
