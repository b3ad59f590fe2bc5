/*
 * Unit tests of runtime/http/path.c: RFC 3986 §5.4 dot-segment examples, the
 * cases of issue 8, encoded slashes in the three modes, merging slashes,
 * escapes (malformed, %00, hex case, unreserved decoding), the "unchanged"
 * result of an already-normal path, long paths, and properties over random
 * inputs checked against an independent, literal implementation of RFC 3986
 * §5.2.4; and the Gateway's pathNormalization settings as they reach a
 * generation (sl_generation_t.path_opts), the options the proxy passes.
 *
 * Every input is copied into a heap buffer of exactly its length, and every
 * output buffer is exactly as long as the input, so that a read or write one
 * byte too far is an ASan report in the sanitized build.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "path.c"

#include "compiler.h"
#include "generation.h"
#include "model.h"

static const sl_path_opts_t o_reject = {0, SL_PATH_SLASHES_REJECT};
static const sl_path_opts_t o_keep = {0, SL_PATH_SLASHES_KEEP};
static const sl_path_opts_t o_decode = {0, SL_PATH_SLASHES_DECODE};
static const sl_path_opts_t o_merge = {1, SL_PATH_SLASHES_REJECT};
static const sl_path_opts_t o_merge_decode = {1, SL_PATH_SLASHES_DECODE};
static const sl_path_opts_t o_merge_keep = {1, SL_PATH_SLASHES_KEEP};

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL)
        abort();
    return p;
}

/* The result as text: "=" for SL_PATH_UNCHANGED, "!<why>" for SL_ERROR, else
 * the normalised path. Checks the contract common to every call on the way.
 * Caller frees. */
static char *norm_n(const char *s, size_t n, const sl_path_opts_t *o)
{
    char *in = xmalloc(n);
    memcpy(in, s, n);
    char *out = xmalloc(n);
    memset(out, 0x5a, n);
    size_t out_len = (size_t)-1;
    const char *why = NULL;
    int rc = sl_path_normalize(in, n, out, n, o, &out_len, &why);
    char *res;
    if (rc == SL_PATH_UNCHANGED) {
        assert_int_equal(out_len, n);
        for (size_t i = 0; i < n; i++)
            assert_int_equal((unsigned char)out[i], 0x5a); /* not written */
        res = strdup("=");
    } else if (rc == SL_OK) {
        assert_true(out_len >= 1 && out_len <= n);
        assert_int_equal(out[0], '/');
        res = xmalloc(out_len + 1);
        memcpy(res, out, out_len);
        res[out_len] = '\0';
    } else {
        assert_int_equal(rc, SL_ERROR);
        assert_non_null(why);
        assert_true(why[0] != '\0');
        size_t wl = strlen(why);
        res = xmalloc(wl + 2);
        res[0] = '!';
        memcpy(res + 1, why, wl + 1);
    }
    free(in);
    free(out);
    return res;
}

static void check(const sl_path_opts_t *o, const char *in, const char *want, int line)
{
    char *got = norm_n(in, strlen(in), o);
    if (strcmp(got, want) != 0)
        fail_msg("line %d: normalise(\"%s\") = \"%s\", want \"%s\"", line, in, got, want);
    free(got);
}

/* want: the output, "=" for unchanged, or "!" + the start of the reason. */
static void check_prefix(const sl_path_opts_t *o, const char *in, const char *want, int line)
{
    char *got = norm_n(in, strlen(in), o);
    if (strncmp(got, want, strlen(want)) != 0)
        fail_msg("line %d: normalise(\"%s\") = \"%s\", want \"%s...\"", line, in, got, want);
    free(got);
}

#define EQ(o, in, want) check(o, in, want, __LINE__)
#define ERR(o, in, why) check_prefix(o, in, "!" why, __LINE__)

/* RFC 3986 §5.4.1 and §5.4.2: the references resolved against
 * "http://a/b/c/d;p?q" whose result depends on remove_dot_segments, written
 * as the merged path that reaches it (base "/b/c/" + reference). */
static void test_rfc3986_examples(void **state)
{
    (void)state;
    EQ(&o_reject, "/b/c/g", "=");
    EQ(&o_reject, "/b/c/./g", "/b/c/g");
    EQ(&o_reject, "/b/c/g/", "=");
    EQ(&o_reject, "/b/c/.", "/b/c/");
    EQ(&o_reject, "/b/c/./", "/b/c/");
    EQ(&o_reject, "/b/c/..", "/b/");
    EQ(&o_reject, "/b/c/../", "/b/");
    EQ(&o_reject, "/b/c/../g", "/b/g");
    EQ(&o_reject, "/b/c/../..", "/");
    EQ(&o_reject, "/b/c/../../", "/");
    EQ(&o_reject, "/b/c/../../g", "/g");
    /* §5.4.2 abnormal examples: more ".." than segments stay at the root. */
    EQ(&o_reject, "/b/c/../../../g", "/g");
    EQ(&o_reject, "/b/c/../../../../g", "/g");
    EQ(&o_reject, "/./g", "/g");
    EQ(&o_reject, "/../g", "/g");
    EQ(&o_reject, "/b/c/g.", "=");
    EQ(&o_reject, "/b/c/.g", "=");
    EQ(&o_reject, "/b/c/g..", "=");
    EQ(&o_reject, "/b/c/..g", "=");
    EQ(&o_reject, "/b/c/./../g", "/b/g");
    EQ(&o_reject, "/b/c/./g/.", "/b/c/g/");
    EQ(&o_reject, "/b/c/g/./h", "/b/c/g/h");
    EQ(&o_reject, "/b/c/g/../h", "/b/c/h");
    EQ(&o_reject, "/b/c/g;x=1/./y", "/b/c/g;x=1/y");
    EQ(&o_reject, "/b/c/g;x=1/../y", "/b/c/y");
    /* §5.2.4's own walk-through. */
    EQ(&o_reject, "/a/b/c/./../../g", "/a/g");
    EQ(&o_reject, "/mid/content=5/../6", "/mid/6");
}

static void test_issue_cases(void **state)
{
    (void)state;
    for (int m = 0; m < 2; m++) {
        const sl_path_opts_t *o = m ? &o_merge : &o_reject;
        EQ(o, "/api/../secret", "/secret");
        EQ(o, "/api/%2e%2e/secret", "/secret");
        EQ(o, "/api/%2E%2E/secret", "/secret");
        EQ(o, "/api/.%2e/secret", "/secret");
        EQ(o, "/api/%2e./secret", "/secret");
        EQ(o, "/strip/../../etc", "/etc");
        EQ(o, "/public/../admin", "/admin");
        EQ(o, "/public/./../admin", "/admin");
    }
    /* Through encoded slashes only when they are separators. */
    EQ(&o_decode, "/public%2F..%2Fadmin", "/admin");
    EQ(&o_decode, "/public%2f%2e%2e%2fadmin", "/admin");
    EQ(&o_keep, "/public%2F..%2Fadmin", "=");
    EQ(&o_keep, "/public%2f..%2fadmin", "/public%2F..%2Fadmin");
    ERR(&o_reject, "/public%2F..%2Fadmin", "encoded slash");
}

static void test_dot_segments_at_root_are_clamped(void **state)
{
    (void)state;
    EQ(&o_reject, "/..", "/");
    EQ(&o_reject, "/../", "/");
    EQ(&o_reject, "/../..", "/");
    EQ(&o_reject, "/.", "/");
    EQ(&o_reject, "/./", "/");
    EQ(&o_reject, "/%2e", "/");
    EQ(&o_reject, "/%2E%2E/%2E%2E/a", "/a");
    EQ(&o_reject, "/../../../../etc/passwd", "/etc/passwd");
    /* Not dot segments: dots inside a segment or more than two. */
    EQ(&o_reject, "/...", "=");
    EQ(&o_reject, "/.%2e.", "/...");
    EQ(&o_reject, "/a./.b/..c/c../d.", "=");
    EQ(&o_reject, "/v1.2/file.json", "=");
}

static void test_encoded_slashes_reject(void **state)
{
    (void)state;
    ERR(&o_reject, "/a%2Fb", "encoded slash");
    ERR(&o_reject, "/a%2fb", "encoded slash");
    ERR(&o_reject, "/a%5Cb", "encoded slash");
    ERR(&o_reject, "/a%5cb", "encoded slash");
    ERR(&o_reject, "/%2F", "encoded slash");
    ERR(&o_reject, "/a\\b", "backslash");
    ERR(&o_reject, "/public\\..\\admin", "backslash");
    /* NULL options are the defaults: reject. */
    char out[8];
    size_t out_len;
    const char *why = NULL;
    assert_int_equal(sl_path_normalize("/a%2Fb", 6, out, sizeof(out), NULL, &out_len, &why),
                     SL_ERROR);
    assert_non_null(strstr(why, "encoded slash"));
    assert_int_equal(sl_path_normalize("/a\\b", 4, out, sizeof(out), NULL, &out_len, NULL),
                     SL_ERROR);
    /* An unknown mode fails closed, as reject. */
    const sl_path_opts_t odd = {0, 9};
    ERR(&odd, "/a%2Fb", "encoded slash");
    ERR(&odd, "/a\\b", "backslash");
    EQ(&odd, "/a/../b", "/b");
}

static void test_encoded_slashes_keep(void **state)
{
    (void)state;
    EQ(&o_keep, "/a%2Fb", "=");
    EQ(&o_keep, "/a%5Cb", "=");
    EQ(&o_keep, "/a%2fb", "/a%2Fb");
    EQ(&o_keep, "/a%5cb", "/a%5Cb");
    EQ(&o_keep, "/a\\b", "=");
    /* Kept escapes are data: never a separator, never part of a dot segment. */
    EQ(&o_keep, "/a/..%2F", "=");
    EQ(&o_keep, "/a/%2e%2e%2fb", "/a/..%2Fb");
    EQ(&o_keep, "/a\\..\\b", "=");
    EQ(&o_keep, "/a/b\\/../c", "/a/c");
    EQ(&o_keep, "/x/%2F/../y", "/x/y");
    EQ(&o_merge_keep, "/x//%2F//y", "/x/%2F/y");
}

static void test_encoded_slashes_decode(void **state)
{
    (void)state;
    EQ(&o_decode, "/a%2Fb", "/a/b");
    EQ(&o_decode, "/a%2fb", "/a/b");
    EQ(&o_decode, "/a%5Cb", "/a/b");
    EQ(&o_decode, "/a%5cb", "/a/b");
    EQ(&o_decode, "/a\\b", "/a/b");
    EQ(&o_decode, "/a%2F..%2Fb", "/b");
    EQ(&o_decode, "/a%5C..%5Cb", "/b");
    EQ(&o_decode, "/public\\..\\admin", "/admin");
    EQ(&o_decode, "/a/%2e%2e%2f%2e%2e%2fb", "/b");
    /* Decoded slashes are separators, so they make empty segments too. */
    EQ(&o_decode, "/a%2F%2Fb", "/a//b");
    EQ(&o_merge_decode, "/a%2F%2Fb", "/a/b");
    EQ(&o_merge_decode, "/a%2F/\\b", "/a/b");
    EQ(&o_decode, "%2F", "!path does not start with '/'");
}

static void test_merge_slashes(void **state)
{
    (void)state;
    /* Off (the default): an empty segment is a segment. */
    EQ(&o_reject, "//a//b/", "=");
    EQ(&o_reject, "///", "=");
    EQ(&o_reject, "/a//..", "/a/");
    EQ(&o_reject, "/a/.//b", "/a//b");
    EQ(&o_reject, "/a//../b", "/a/b");
    /* On. */
    EQ(&o_merge, "//a//b/", "/a/b/");
    EQ(&o_merge, "///", "/");
    EQ(&o_merge, "//", "/");
    EQ(&o_merge, "/a//..", "/");
    EQ(&o_merge, "/a/.//b", "/a/b");
    EQ(&o_merge, "/a//../b", "/b");
    EQ(&o_merge, "/a/b/", "=");
    EQ(&o_merge, "/a/b", "=");
    EQ(&o_merge, "/", "=");
}

static void test_malformed_escapes_and_nul(void **state)
{
    (void)state;
    const sl_path_opts_t *all[] = {&o_reject, &o_keep, &o_decode, &o_merge};
    for (size_t k = 0; k < SL_ARRAY_LEN(all); k++) {
        const sl_path_opts_t *o = all[k];
        ERR(o, "/%", "malformed percent-escape");
        ERR(o, "/a%", "malformed percent-escape");
        ERR(o, "/a%1", "malformed percent-escape");
        ERR(o, "/a%G1", "malformed percent-escape");
        ERR(o, "/a%1G", "malformed percent-escape");
        ERR(o, "/a%%41", "malformed percent-escape");
        ERR(o, "/a%-1/b", "malformed percent-escape");
        ERR(o, "/a% 1/b", "malformed percent-escape");
        ERR(o, "/a%00b", "percent-encoded NUL");
        ERR(o, "/%00", "percent-encoded NUL");
        /* An error after a change already written still wins. */
        ERR(o, "/./a/%zz", "malformed percent-escape");
        EQ(o, "/", "=");
    }
    /* A raw NUL (only possible with an explicit length). */
    char *got = norm_n("/a\0b", 4, &o_keep);
    assert_string_equal(got, "!NUL byte in path");
    free(got);
    got = norm_n("/\0", 2, &o_reject);
    assert_string_equal(got, "!NUL byte in path");
    free(got);
    /* Exact reasons, as the 400 will carry them. */
    EQ(&o_reject, "/a%G1", "!malformed percent-escape in path");
    EQ(&o_reject, "/a%00", "!percent-encoded NUL (%00) in path");
    EQ(&o_reject, "/a%2F", "!encoded slash (%2F or %5C) in path");
    EQ(&o_reject, "/a\\", "!backslash in path");
}

static void test_hex_case_and_unreserved(void **state)
{
    (void)state;
    EQ(&o_reject, "/%7E", "/~");
    EQ(&o_reject, "/%7e", "/~");
    EQ(&o_reject, "/%41", "/A");
    EQ(&o_reject, "/%61dmin", "/admin");
    EQ(&o_reject, "/%7e%41%5F%2D%30%61%7a%5a%39", "/~A_-0azZ9");
    EQ(&o_reject, "/a%2eb", "/a.b");
    /* Other escapes stay, upper-cased. */
    EQ(&o_reject, "/a%3A", "=");
    EQ(&o_reject, "/a%3a", "/a%3A");
    EQ(&o_reject, "/%c3%a9t%C3%a9", "/%C3%A9t%C3%A9");
    EQ(&o_reject, "/a%20b", "=");
    EQ(&o_reject, "/a%3f", "/a%3F");
    EQ(&o_reject, "/%0a%0D%7f%FF", "/%0A%0D%7F%FF");
    /* %25 is not decoded: nothing is decoded twice. */
    EQ(&o_reject, "/%25", "=");
    EQ(&o_reject, "/%2541", "=");
    EQ(&o_reject, "/%252e%252e/x", "=");
    EQ(&o_reject, "/%252f", "=");
    /* Every byte value: decoded iff unreserved, else upper-case escape. */
    for (unsigned v = 1; v < 256; v++) {
        if (v == '/' || v == '\\')
            continue;
        char in[8], want[8];
        snprintf(in, sizeof(in), "/%%%02x", v);
        if (unreserved_tab[v] && v != '.')
            snprintf(want, sizeof(want), "/%c", (char)v);
        else if (v == '.')
            snprintf(want, sizeof(want), "/");
        else if (v >= 0xA0 || (v & 15) >= 10)
            snprintf(want, sizeof(want), "/%%%02X", v);
        else
            snprintf(want, sizeof(want), "=");
        EQ(&o_reject, in, want);
    }
}

static void test_unchanged_does_not_write(void **state)
{
    (void)state;
    const char *normal[] = {
        "/",     "/api/v1/users/123", "/v1.2/file.json", "/a%20b",         "/a//b", "/~user/_x-y",
        "/a/b/", "/%E2%82%AC",        "/pets/{id}",      "/a;b=c,d/e@f:g",
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(normal); i++) {
        size_t out_len = 0;
        const char *why = "untouched";
        /* No output buffer at all: an already-normal path never needs one. */
        assert_int_equal(
            sl_path_normalize(normal[i], strlen(normal[i]), NULL, 0, &o_reject, &out_len, &why),
            SL_PATH_UNCHANGED);
        assert_int_equal(out_len, strlen(normal[i]));
        assert_string_equal(why, "untouched");
        EQ(&o_reject, normal[i], "=");
    }
    EQ(&o_keep, "/a%2Fb\\c", "=");
}

static void test_output_buffer_bound(void **state)
{
    (void)state;
    /* out_cap == len is enough (norm_n always uses it); less is refused as
     * a caller bug, before anything is written, when work is needed. */
    char out[4] = {'x', 'x', 'x', 'x'};
    size_t out_len = 0;
    const char *why = NULL;
    assert_int_equal(sl_path_normalize("/a/./b", 6, out, 4, NULL, &out_len, &why), SL_ERROR);
    assert_non_null(strstr(why, "internal error"));
    assert_memory_equal(out, "xxxx", 4);
    /* ... but a malformed start is still the client's 400. */
    assert_int_equal(sl_path_normalize("a/./b", 5, out, 0, NULL, &out_len, &why), SL_ERROR);
    assert_string_equal(why, "path does not start with '/'");
    assert_int_equal(sl_path_normalize("", 0, out, 0, NULL, &out_len, &why), SL_ERROR);
    assert_string_equal(why, "path does not start with '/'");
    assert_int_equal(sl_path_normalize("*", 1, out, 1, NULL, &out_len, &why), SL_ERROR);
    assert_int_equal(sl_path_normalize("/a/./b", 6, out, 0, NULL, &out_len, NULL), SL_ERROR);
}

static void test_long_paths(void **state)
{
    (void)state;
    enum { N = 20000 };
    /* "/x/x/.../x/" N times, then "../" N times, then "end". */
    size_t len = 1 + 2 * N + 3 * N + 3;
    char *in = xmalloc(len + 1);
    size_t p = 0;
    in[p++] = '/';
    for (int i = 0; i < N; i++) {
        in[p++] = 'x';
        in[p++] = '/';
    }
    for (int i = 0; i < N; i++) {
        memcpy(in + p, "../", 3);
        p += 3;
    }
    memcpy(in + p, "end", 3);
    p += 3;
    assert_int_equal(p, len);
    in[len] = '\0';
    char *got = norm_n(in, len, &o_reject);
    assert_string_equal(got, "/end");
    free(got);
    /* One more "../" than segments: clamped. */
    in[len - 3] = '.';
    in[len - 2] = '.';
    in[len - 1] = '/';
    got = norm_n(in, len, &o_reject);
    assert_string_equal(got, "/");
    free(got);

    /* A long normal path: unchanged. */
    for (size_t i = 1; i < len; i++)
        in[i] = (i % 7 == 0) ? '/' : (char)('a' + i % 26);
    got = norm_n(in, len, &o_merge);
    assert_string_equal(got, "=");
    free(got);
    /* The same with one escape to rewrite at the very end. */
    memcpy(in + len - 3, "%7e", 3);
    got = norm_n(in, len, &o_merge);
    assert_int_equal(strlen(got), len - 2);
    assert_int_equal(got[len - 3], '~');
    assert_memory_equal(got, in, len - 3);
    free(got);
    free(in);
}

/* --- properties over random inputs ---------------------------------------- */

/* RFC 3986 §5.2.4, written as literally as the RFC states it (an input
 * buffer and an output buffer of strings), independent of path.c. */
static size_t rfc_remove_dot_segments(const char *in0, size_t n, char *out)
{
    char *in = xmalloc(n + 1);
    memcpy(in, in0, n);
    size_t il = n, ol = 0;
#define STARTS(lit) (il >= sizeof(lit) - 1 && memcmp(in, lit, sizeof(lit) - 1) == 0)
#define IS(lit) (il == sizeof(lit) - 1 && memcmp(in, lit, sizeof(lit) - 1) == 0)
#define DROP(k) (memmove(in, in + (k), il - (k)), il -= (k))
    while (il > 0) {
        if (STARTS("../")) {
            DROP(3); /* A */
        } else if (STARTS("./")) {
            DROP(2);
        } else if (STARTS("/./")) {
            DROP(2); /* B: "/./" -> "/" */
        } else if (IS("/.")) {
            in[1] = '\0';
            il = 1;
        } else if (STARTS("/../") || IS("/..")) { /* C */
            if (IS("/..")) {
                il = 1;
            } else {
                DROP(3);
            }
            in[0] = '/';
            while (ol > 0 && out[ol - 1] != '/')
                ol--;
            if (ol > 0)
                ol--;
        } else if (IS(".") || IS("..")) {
            il = 0; /* D */
        } else {
            /* E: the first segment, with its leading '/' if any. */
            size_t k = in[0] == '/' ? 1 : 0;
            while (k < il && in[k] != '/')
                k++;
            memcpy(out + ol, in, k);
            ol += k;
            DROP(k);
        }
    }
#undef STARTS
#undef IS
#undef DROP
    free(in);
    return ol;
}

static uint32_t rng_state = 0x2545f491u;
static uint32_t rnd(void)
{
    uint32_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return rng_state = x;
}

/* Mostly bytes that matter to the normaliser, sometimes anything. */
static size_t random_path(char *buf, size_t max)
{
    static const char alphabet[] = "/./..%%2e2E2f2F5c5C41a7eE00G\\/b/.";
    size_t n = 1 + rnd() % max;
    for (size_t i = 0; i < n; i++)
        buf[i] = rnd() % 8 ? alphabet[rnd() % (sizeof(alphabet) - 1)] : (char)(rnd() & 0xff);
    if (rnd() % 16)
        buf[0] = '/';
    return n;
}

static void assert_normal_form(const char *p, size_t n, const sl_path_opts_t *o)
{
    assert_true(n >= 1);
    assert_int_equal(p[0], '/');
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '/') {
            /* no "." or ".." segment anywhere */
            assert_false(dot_segment_at(p, n, i + 1));
            if (o->merge_slashes)
                assert_false(i + 1 < n && p[i + 1] == '/');
        }
        if (p[i] == '%') {
            assert_true(i + 2 < n);
            assert_true(is_upper_hex((unsigned char)p[i + 1]));
            assert_true(is_upper_hex((unsigned char)p[i + 2]));
        }
        assert_true(p[i] != '\0');
        if (p[i] == '\\')
            assert_int_equal(o->encoded_slashes, SL_PATH_SLASHES_KEEP);
    }
}

static void test_random_properties(void **state)
{
    (void)state;
    const sl_path_opts_t *all[] = {&o_reject, &o_keep,         &o_decode,
                                   &o_merge,  &o_merge_decode, &o_merge_keep};
    char buf[96];
    for (int iter = 0; iter < 200000; iter++) {
        size_t n = random_path(buf, sizeof(buf));
        const sl_path_opts_t *o = all[iter % SL_ARRAY_LEN(all)];
        char *in = xmalloc(n);
        memcpy(in, buf, n);
        char *out = xmalloc(n);
        size_t out_len = 0;
        const char *why = NULL;
        int rc = sl_path_normalize(in, n, out, n, o, &out_len, &why);
        assert_true(rc == SL_OK || rc == SL_PATH_UNCHANGED || rc == SL_ERROR);
        if (rc == SL_ERROR) {
            assert_non_null(why);
        } else {
            const char *res = rc == SL_OK ? out : in;
            assert_true(out_len <= n);
            assert_normal_form(res, out_len, o);
            /* Idempotent, and the filter sees it: the output is "unchanged". */
            char *again = xmalloc(out_len);
            memcpy(again, res, out_len);
            size_t again_len = 0;
            assert_int_equal(sl_path_normalize(again, out_len, NULL, 0, o, &again_len, &why),
                             SL_PATH_UNCHANGED);
            free(again);
        }
        /* The filter is exact: it says "normal" iff the full pass would copy
         * the input byte for byte. */
        if (n >= 1 && in[0] == '/') {
            char *full = xmalloc(n);
            size_t full_len = 0;
            int frc = normalise(in, n, full, o->merge_slashes, o->encoded_slashes, &full_len, &why);
            bool same = frc == SL_OK && full_len == n && memcmp(full, in, n) == 0;
            assert_int_equal(same, is_normal(in, n, o->merge_slashes, o->encoded_slashes));
            assert_int_equal(same, rc == SL_PATH_UNCHANGED);
            free(full);
        }
        free(in);
        free(out);
    }
}

/* Without escapes and backslashes, dot-segment removal is exactly the RFC's;
 * with merging, it is the RFC's applied to the path with "//" collapsed. */
static void test_matches_rfc_reference(void **state)
{
    (void)state;
    static const char alphabet[] = "/.a";
    char buf[40], ref[48], merged[40];
    for (int iter = 0; iter < 200000; iter++) {
        size_t n = 1 + rnd() % (sizeof(buf) - 1);
        buf[0] = '/';
        for (size_t i = 1; i < n; i++)
            buf[i] = alphabet[rnd() % 3];
        size_t rl = rfc_remove_dot_segments(buf, n, ref);
        ref[rl] = '\0';
        buf[n] = '\0';
        char *got = norm_n(buf, n, &o_reject);
        if (strcmp(got, "=") == 0)
            assert_string_equal(buf, ref);
        else if (strcmp(got, ref) != 0)
            fail_msg("normalise(\"%s\") = \"%s\", RFC 3986 says \"%s\"", buf, got, ref);
        free(got);

        size_t ml = 0;
        for (size_t i = 0; i < n; i++)
            if (!(buf[i] == '/' && ml > 0 && merged[ml - 1] == '/'))
                merged[ml++] = buf[i];
        rl = rfc_remove_dot_segments(merged, ml, ref);
        ref[rl] = '\0';
        got = norm_n(buf, n, &o_merge);
        const char *res = strcmp(got, "=") == 0 ? buf : got;
        if (strcmp(res, ref) != 0)
            fail_msg("merging: normalise(\"%s\") = \"%s\", RFC 3986 on \"%.*s\" says \"%s\"", buf,
                     res, (int)ml, merged, ref);
        free(got);
    }
}

/* Anything at all, for the sanitizers: no crash, no read or write outside
 * the buffers, and the basic contract. */
static void test_random_bytes(void **state)
{
    (void)state;
    const sl_path_opts_t *all[] = {&o_reject, &o_keep, &o_decode, &o_merge_decode};
    for (int iter = 0; iter < 50000; iter++) {
        size_t n = rnd() % 64;
        char *in = xmalloc(n);
        for (size_t i = 0; i < n; i++)
            in[i] = (char)(rnd() & 0xff);
        if (n && rnd() % 2)
            in[0] = '/';
        char *out = xmalloc(n);
        size_t out_len = 0;
        const char *why = NULL;
        const sl_path_opts_t *o = all[iter % SL_ARRAY_LEN(all)];
        int rc = sl_path_normalize(in, n, out, n, o, &out_len, &why);
        if (rc == SL_ERROR)
            assert_non_null(why);
        else
            assert_normal_form(rc == SL_OK ? out : in, out_len, o);
        free(in);
        free(out);
    }
}

/* --- configuration: Gateway pathNormalization -> sl_generation_t --------- */

static Sluice__V1__Snapshot *compile_gateway(const char *gateway_extra)
{
    char text[512];
    snprintf(text, sizeof(text),
             "apiVersion: gateway.sluice.dev/v1alpha1\nkind: Gateway\nmetadata: {name: g}\n"
             "spec:\n  listeners: [{name: web, port: 8080}]\n%s",
             gateway_extra);
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    if (sl_model_parse(&set, text, strlen(text), "gw.yaml", &errs) != 0)
        fail_msg("%s", sl_errors_format(&errs));
    Sluice__V1__Snapshot *snap = sl_compile_snapshot(&set, "default", 1, &errs);
    assert_non_null(snap);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
    return snap;
}

static sl_generation_t *build_generation(const char *gateway_extra)
{
    Sluice__V1__Snapshot *snap = compile_gateway(gateway_extra);
    char err[256] = "";
    sl_generation_t *gen = sl_generation_build(snap, "test", 1, err, sizeof(err));
    if (!gen)
        fail_msg("sl_generation_build: %s", err);
    return gen;
}

/* What a request meets, given the generation's options. */
static char *through(const sl_generation_t *gen, const char *path)
{
    return norm_n(path, strlen(path), &gen->path_opts);
}

static void test_gateway_settings_reach_the_generation(void **state)
{
    (void)state;
    static const struct {
        const char *yaml;
        uint8_t merge, slashes;
        const char *slash_path; /* "/a%2Fb//c" becomes */
    } cases[] = {
        {"", 0, SL_PATH_SLASHES_REJECT, "!encoded slash (%2F or %5C) in path"},
        {"  pathNormalization: {mergeSlashes: true}\n", 1, SL_PATH_SLASHES_REJECT,
         "!encoded slash (%2F or %5C) in path"},
        {"  pathNormalization: {encodedSlashes: keep}\n", 0, SL_PATH_SLASHES_KEEP, "="},
        {"  pathNormalization: {encodedSlashes: keep, mergeSlashes: true}\n", 1,
         SL_PATH_SLASHES_KEEP, "/a%2Fb/c"},
        {"  pathNormalization: {encodedSlashes: decode}\n", 0, SL_PATH_SLASHES_DECODE, "/a/b//c"},
        {"  pathNormalization: {encodedSlashes: decode, mergeSlashes: true}\n", 1,
         SL_PATH_SLASHES_DECODE, "/a/b/c"},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(cases); i++) {
        sl_generation_t *gen = build_generation(cases[i].yaml);
        assert_int_equal(gen->path_opts.merge_slashes, cases[i].merge);
        assert_int_equal(gen->path_opts.encoded_slashes, cases[i].slashes);
        char *got = through(gen, "/a%2Fb//c");
        if (strcmp(got, cases[i].slash_path) != 0)
            fail_msg("case %zu: got \"%s\", want \"%s\"", i, got, cases[i].slash_path);
        free(got);
        sl_generation_discard(gen);
    }
}

/* A snapshot from a controller that predates the setting, or one that names
 * a mode this runtime does not know: the defaults, i.e. reject. */
static void test_generation_defaults_without_or_with_unknown_setting(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *snap = compile_gateway("  pathNormalization: {encodedSlashes: decode}\n");
    /* unknown enum value */
    snap->settings->path_normalization->encoded_slashes = 7;
    snap->settings->path_normalization->merge_slashes = 1;
    size_t len;
    uint8_t *wire = sl_snapshot_pack(snap, &len);
    Sluice__V1__Snapshot *copy = sl_snapshot_unpack(wire, len);
    free(wire);
    assert_non_null(copy);
    char err[256];
    sl_generation_t *gen = sl_generation_build(copy, "test", 1, err, sizeof(err));
    assert_non_null(gen);
    assert_int_equal(gen->path_opts.encoded_slashes, SL_PATH_SLASHES_REJECT);
    assert_int_equal(gen->path_opts.merge_slashes, 1);
    sl_generation_discard(gen);
    /* absent */
    protobuf_c_message_free_unpacked(&snap->settings->path_normalization->base, NULL);
    snap->settings->path_normalization = NULL;
    gen = sl_generation_build(snap, "test", 1, err, sizeof(err));
    assert_non_null(gen);
    assert_int_equal(gen->path_opts.encoded_slashes, SL_PATH_SLASHES_REJECT);
    assert_int_equal(gen->path_opts.merge_slashes, 0);
    sl_generation_discard(gen);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rfc3986_examples),
        cmocka_unit_test(test_issue_cases),
        cmocka_unit_test(test_dot_segments_at_root_are_clamped),
        cmocka_unit_test(test_encoded_slashes_reject),
        cmocka_unit_test(test_encoded_slashes_keep),
        cmocka_unit_test(test_encoded_slashes_decode),
        cmocka_unit_test(test_merge_slashes),
        cmocka_unit_test(test_malformed_escapes_and_nul),
        cmocka_unit_test(test_hex_case_and_unreserved),
        cmocka_unit_test(test_unchanged_does_not_write),
        cmocka_unit_test(test_output_buffer_bound),
        cmocka_unit_test(test_long_paths),
        cmocka_unit_test(test_random_properties),
        cmocka_unit_test(test_matches_rfc_reference),
        cmocka_unit_test(test_random_bytes),
        cmocka_unit_test(test_gateway_settings_reach_the_generation),
        cmocka_unit_test(test_generation_defaults_without_or_with_unknown_setting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
