/*
 * Regression tests for what fuzzing (tests/fuzz/fuzz_http1_request.c,
 * fuzz_http1_response.c) found in runtime/http1.c. One test per finding,
 * named after what broke; the minimized fuzz inputs are kept under
 * tests/fuzz/regressions/<driver>/.
 *
 * Inputs are parsed from heap copies of exactly their length, so a read past
 * the end is an ASan report in the sanitized build.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "http1.h"

static const sl_http1_limits_t limits = {8192, 32768, 32};

static ssize_t parse(const char *text, sl_http1_request_t *req, sl_http1_header_t *headers)
{
    size_t len = strlen(text);
    char *copy = malloc(len ? len : 1);
    assert_non_null(copy);
    memcpy(copy, text, len);
    memset(req, 0, sizeof(*req));
    req->headers = headers;
    req->num_headers = 32;
    ssize_t r = sl_http1_parse_request(copy, len, &limits, req);
    free(copy);
    return r;
}

/*
 * fuzz_http1_request, tests/fuzz/regressions/fuzz_http1_request/empty_method:
 * a request line that starts with a space (" / HTTP/1.0") was accepted with
 * an empty method. parse_request_line only refused an empty method when the
 * byte after it was not a space. RFC 9112 3: method is a token (1*tchar), and
 * nginx answers 400; a parser that accepts what the next hop reads
 * differently is where request smuggling starts.
 */
static void test_request_line_starting_with_space_is_400(void **state)
{
    (void)state;
    sl_http1_header_t headers[32];
    sl_http1_request_t req;
    static const char *const inputs[] = {
        " / HTTP/1.0\r\n\r\n",
        " /://+ HTTP/1.0\r\n\r\n",
        " /pets HTTP/1.1\r\nHost: example.com\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(inputs) / sizeof(inputs[0]); i++) {
        ssize_t r = parse(inputs[i], &req, headers);
        if (r != SL_ERROR)
            fail_msg("input %zu accepted (head_len %zd, method length %zu); want 400", i, r,
                     req.method.len);
        assert_int_equal(req.error_status, 400);
        assert_non_null(req.error);
    }
    /* The same lines with a method still parse (the test above is about the
     * leading space, not about these requests). */
    assert_true(parse("GET / HTTP/1.0\r\n\r\n", &req, headers) > 0);
    assert_int_equal(req.method.len, 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_line_starting_with_space_is_400),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
