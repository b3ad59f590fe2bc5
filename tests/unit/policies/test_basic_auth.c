/*
 * Unit tests of the basic-auth policy (policies/basic-auth/basic_auth.c):
 * the Authorization header's parsing (strict base64, user:password), the
 * per-worker cache of verifications (hits, expiry, the bound) and crypt_r's
 * verification against a hash made here.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../../../policies/basic-auth/basic_auth.c"

static enum parse_result parse1(const char *value, char *buf, size_t cap, sl_str_t *u, sl_str_t *p)
{
    sl_policy_header_t h = {{"Authorization", 13}, {value, strlen(value)}};
    return parse_credentials(&h, 1, buf, cap, u, p);
}

static void test_b64(void **st)
{
    (void)st;
    unsigned char out[64];
    assert_int_equal(b64_decode("YWxpY2U6czNjcmV0", 16, out, sizeof(out)), 12);
    assert_memory_equal(out, "alice:s3cret", 12);
    assert_int_equal(b64_decode("YQ==", 4, out, sizeof(out)), 1); /* padded */
    assert_int_equal(b64_decode("YQ", 2, out, sizeof(out)), 1);   /* unpadded */
    assert_int_equal(b64_decode("YWI=", 4, out, sizeof(out)), 2);
    assert_int_equal(b64_decode("YR==", 4, out, sizeof(out)), -1); /* non-canonical bits */
    assert_int_equal(b64_decode("Y", 1, out, sizeof(out)), -1);
    assert_int_equal(b64_decode("YW J", 4, out, sizeof(out)), -1);
    assert_int_equal(b64_decode("YW_-", 4, out, sizeof(out)), -1);     /* URL alphabet */
    assert_int_equal(b64_decode("YWxpY2U6czNjcmV0", 16, out, 11), -1); /* over the bound */
}

static void test_parse_ok(void **st)
{
    (void)st;
    char buf[128];
    sl_str_t u, p;
    assert_int_equal(parse1("Basic YWxpY2U6czNjcmV0", buf, sizeof(buf), &u, &p), CRED_OK);
    assert_int_equal(u.len, 5);
    assert_memory_equal(u.ptr, "alice", 5);
    assert_string_equal(p.ptr, "s3cret"); /* NUL-terminated for crypt */
    /* scheme case-insensitive, extra spaces; a colon in the password */
    assert_int_equal(parse1("  bAsIc   YWxpY2U6YTpi  ", buf, sizeof(buf), &u, &p), CRED_OK);
    assert_string_equal(p.ptr, "a:b");
    /* empty password: valid syntax (the hash decides) */
    assert_int_equal(parse1("Basic YWxpY2U6", buf, sizeof(buf), &u, &p), CRED_OK);
    assert_int_equal(p.len, 0);
}

static void test_parse_errors(void **st)
{
    (void)st;
    char buf[128];
    sl_str_t u, p;
    assert_int_equal(parse1("Bearer abc", buf, sizeof(buf), &u, &p), CRED_MISSING);
    assert_int_equal(parse1("Basicx YWxpY2U6czNjcmV0", buf, sizeof(buf), &u, &p), CRED_MISSING);
    assert_int_equal(parse1("", buf, sizeof(buf), &u, &p), CRED_MISSING);
    assert_int_equal(parse1("Basic", buf, sizeof(buf), &u, &p), CRED_MALFORMED);
    assert_int_equal(parse1("Basic ", buf, sizeof(buf), &u, &p), CRED_MALFORMED);
    assert_int_equal(parse1("Basic YWxpY2U=", buf, sizeof(buf), &u, &p),
                     CRED_MALFORMED);                                                 /* no colon */
    assert_int_equal(parse1("Basic OnB3", buf, sizeof(buf), &u, &p), CRED_MALFORMED); /* ":pw" */
    assert_int_equal(parse1("Basic !!!!", buf, sizeof(buf), &u, &p), CRED_MALFORMED);
    assert_int_equal(parse1("Basic YWxpY2U6YQBi", buf, sizeof(buf), &u, &p),
                     CRED_MALFORMED); /* NUL */
    assert_int_equal(parse1("Basic YWxpY2U6czNjcmV0", buf, 8, &u, &p),
                     CRED_MALFORMED); /* too long */
    sl_policy_header_t two[] = {{{"authorization", 13}, {"Basic YQ==", 10}},
                                {{"X-Other", 7}, {"x", 1}},
                                {{"AUTHORIZATION", 13}, {"Basic YQ==", 10}}};
    assert_int_equal(parse_credentials(two, 3, buf, sizeof(buf), &u, &p), CRED_MULTIPLE);
    assert_int_equal(parse_credentials(two + 1, 1, buf, sizeof(buf), &u, &p), CRED_MISSING);
}

static void test_cache(void **st)
{
    (void)st;
    worker_t *w = worker_new(NULL);
    assert_non_null(w);
    uint8_t k1[32], k2[32];
    cache_key((sl_str_t){"alice", 5}, (sl_str_t){"pw", 2}, "$5$x$y", k1);
    cache_key((sl_str_t){"alice", 5}, (sl_str_t){"pX", 2}, "$5$x$y", k2);
    assert_false(cache_hit(w, k1, 1000));
    cache_put(w, k1, 1000, 300000);
    assert_true(cache_hit(w, k1, 1000));
    assert_true(cache_hit(w, k1, 300999));
    assert_false(cache_hit(w, k1, 301000)); /* expired */
    assert_false(cache_hit(w, k2, 2000));   /* another password */
    uint8_t k3[32];
    cache_key((sl_str_t){"alice", 5}, (sl_str_t){"pw", 2}, "$5$x$z", k3);
    assert_false(cache_hit(w, k3, 2000)); /* the hash changed */
    /* The bound: many more keys than slots; the table never grows and the
     * newest keys are there. */
    for (unsigned i = 0; i < 5 * CACHE_SLOTS; i++) {
        uint8_t k[32];
        char pw[16];
        int n = snprintf(pw, sizeof(pw), "%u", i);
        cache_key((sl_str_t){"u", 1}, (sl_str_t){pw, (size_t)n}, "$5$x$y", k);
        cache_put(w, k, 10000 + i, 300000);
        assert_true(cache_hit(w, k, 10000 + i));
    }
    size_t live = 0;
    for (size_t i = 0; i < CACHE_SLOTS; i++)
        live += w->slots[i].expires_ms > 10000;
    assert_true(live <= CACHE_SLOTS);
    free(w);
}

static void test_cache_evicts_first_to_expire(void **st)
{
    (void)st;
    worker_t *w = worker_new(NULL);
    /* Five keys of one set (forced: same first 8 bytes). */
    uint8_t k[5][32];
    for (int i = 0; i < 5; i++) {
        memset(k[i], 0, 32);
        k[i][31] = (uint8_t)(i + 1);
        cache_put(w, k[i], 100, (uint64_t)(1000 + (i == 2 ? 0 : 10 * i + 100)));
    }
    assert_false(cache_hit(w, k[2], 200)); /* the one that expired first made room */
    for (int i = 0; i < 5; i++)
        if (i != 2)
            assert_true(cache_hit(w, k[i], 200));
    free(w);
}

static void test_verify(void **st)
{
    (void)st;
    worker_t *w = worker_new(NULL);
    char setting[CRYPT_GENSALT_OUTPUT_SIZE];
    assert_non_null(crypt_gensalt_rn("$5$", 1000, NULL, 0, setting, sizeof(setting)));
    struct crypt_data *cd = calloc(1, sizeof(*cd));
    char *h = crypt_r("s3cret", setting, cd);
    assert_non_null(h);
    char hash[CRYPT_OUTPUT_SIZE];
    snprintf(hash, sizeof(hash), "%s", h);
    free(cd);
    assert_true(verify(w, "s3cret", hash, "t"));
    assert_false(verify(w, "s3cre", hash, "t"));
    assert_false(verify(w, "s3cret", "$5$garbage", "t"));
    assert_false(verify(w, "s3cret", "*0", "t"));
    free(w);
}

static void test_challenge(void **st)
{
    (void)st;
    json_t *cfg = json_pack("{s:s}", "realm", "pets api");
    sl_policy_env_t env = {NULL, 1, NULL};
    char err[128];
    basic_auth_t *b = compile(cfg, &env, err, sizeof(err));
    assert_non_null(b);
    assert_string_equal(b->challenge, "Basic realm=\"pets api\", charset=\"UTF-8\"");
    assert_int_equal(b->cache_ms, 300000);
    assert_false(b->forward);
    free(b);
    json_decref(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_b64),
        cmocka_unit_test(test_parse_ok),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_cache),
        cmocka_unit_test(test_cache_evicts_first_to_expire),
        cmocka_unit_test(test_verify),
        cmocka_unit_test(test_challenge),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
