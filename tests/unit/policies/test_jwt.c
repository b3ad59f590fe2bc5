/*
 * Unit tests of the jwt policy's pieces (policies/jwt/): strict base64url,
 * JWK parsing (and its refusals), the JOSE ECDSA signature conversion, the
 * key-decides-the-algorithm rule, claim checks, dotted claim paths, the
 * HTTP body reader of the JWKS fetcher, and the per-worker cache.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "jwt/jwk.c"
#include "jwt/jwks_fetch.c"
#include "jwt/jwt.c"

#include <openssl/ec.h>

static long dec(const char *s, unsigned char *out)
{
    return sl_jwt_b64url_decode(s, strlen(s), out);
}

static void test_b64url(void **state)
{
    (void)state;
    unsigned char out[64];
    assert_int_equal(dec("", out), 0);
    assert_int_equal(dec("YQ", out), 1);
    assert_memory_equal(out, "a", 1);
    assert_int_equal(dec("YWI", out), 2);
    assert_int_equal(dec("YWJj", out), 3);
    assert_memory_equal(out, "abc", 3);
    assert_int_equal(dec("-_8", out), 2); /* the URL-safe alphabet */
    assert_int_equal(out[0], 0xfb);
    assert_int_equal(out[1], 0xff);
    assert_int_equal(dec("YQ==", out), -1);  /* padding */
    assert_int_equal(dec("+/8", out), -1);   /* standard alphabet */
    assert_int_equal(dec("Y", out), -1);     /* impossible length */
    assert_int_equal(dec("YR", out), -1);    /* non-zero unused bits */
    assert_int_equal(dec("YW Jj", out), -1); /* space */
}

static json_t *J(const char *text)
{
    json_t *v = json_loads(text, 0, NULL);
    assert_non_null(v);
    return v;
}

/* A P-256 JWK made here from a fresh key. */
static json_t *p256_jwk(EVP_PKEY **keep)
{
    EVP_PKEY *k = EVP_EC_gen("P-256");
    assert_non_null(k);
    BIGNUM *x = NULL, *y = NULL;
    assert_int_equal(EVP_PKEY_get_bn_param(k, OSSL_PKEY_PARAM_EC_PUB_X, &x), 1);
    assert_int_equal(EVP_PKEY_get_bn_param(k, OSSL_PKEY_PARAM_EC_PUB_Y, &y), 1);
    unsigned char bx[32], by[32];
    BN_bn2binpad(x, bx, 32);
    BN_bn2binpad(y, by, 32);
    BN_free(x);
    BN_free(y);
    char ex[64], ey[64];
    EVP_EncodeBlock((unsigned char *)ex, bx, 32);
    EVP_EncodeBlock((unsigned char *)ey, by, 32);
    for (char *p = ex; *p; p++)
        *p = *p == '+' ? '-' : *p == '/' ? '_' : *p == '=' ? '\0' : *p;
    for (char *p = ey; *p; p++)
        *p = *p == '+' ? '-' : *p == '/' ? '_' : *p == '=' ? '\0' : *p;
    *keep = k;
    return json_pack("{s:s, s:s, s:s, s:s, s:s}", "kty", "EC", "crv", "P-256", "x", ex, "y", ey,
                     "kid", "e1");
}

static void test_jwk_parse_and_refusals(void **state)
{
    (void)state;
    sl_jwk_t k;
    const char *field;
    char err[200];
    EVP_PKEY *priv;
    json_t *ec = p256_jwk(&priv);
    assert_int_equal(sl_jwk_parse(ec, 1, &k, &field, err, sizeof(err)), 0);
    assert_string_equal(k.kid, "e1");
    assert_int_equal(k.kind, SL_JWK_EC256);
    assert_int_equal(k.algs, SL_JWT_ALG_BIT(SL_JWT_ES256));
    sl_jwk_clear(&k);

    /* A point off the curve. */
    json_t *bad = json_deep_copy(ec);
    json_object_set_new(bad, "y", json_string("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAE"));
    assert_int_equal(sl_jwk_parse(bad, 1, &k, &field, err, sizeof(err)), -1);
    assert_string_equal(field, "");
    assert_non_null(strstr(err, "not on P-256"));
    json_decref(bad);
    /* alg narrows, and must fit the key. */
    bad = json_deep_copy(ec);
    json_object_set_new(bad, "alg", json_string("HS256"));
    assert_int_equal(sl_jwk_parse(bad, 1, &k, &field, err, sizeof(err)), -1);
    assert_string_equal(field, "alg");
    json_decref(bad);
    /* Encryption keys are skipped. */
    bad = json_deep_copy(ec);
    json_object_set_new(bad, "use", json_string("enc"));
    assert_int_equal(sl_jwk_parse(bad, 1, &k, &field, err, sizeof(err)), 1);
    json_decref(bad);

    json_t *v = J("{\"kty\": \"RSA\", \"n\": \"AQAB\", \"e\": \"AQAB\"}");
    assert_int_equal(sl_jwk_parse(v, 1, &k, &field, err, sizeof(err)), -1);
    assert_string_equal(field, "n");
    assert_non_null(strstr(err, "2048 to 8192 bits"));
    json_decref(v);
    v = J("{\"kty\": \"oct\", \"k\": \"c2hvcnQ\"}");
    assert_int_equal(sl_jwk_parse(v, 1, &k, &field, err, sizeof(err)), -1);
    assert_string_equal(field, "k");
    assert_int_equal(sl_jwk_parse(v, 0, &k, &field, err, sizeof(err)), 1); /* remote: skipped */
    json_decref(v);
    v = J("{\"kty\": \"OKP\", \"crv\": \"X25519\", \"x\": \"AA\"}");
    assert_int_equal(sl_jwk_parse(v, 1, &k, &field, err, sizeof(err)), -1);
    assert_string_equal(field, "crv");
    json_decref(v);

    /* Sets: strict refuses any bad key, remote skips it while one is usable. */
    json_t *set = json_pack("{s:[O, {s:s}]}", "keys", ec, "kty", "XYZ");
    sl_jwks_t *s = sl_jwks_parse(set, 1, 1, err, sizeof(err));
    assert_null(s);
    assert_non_null(strstr(err, "keys[1].kty: unsupported"));
    s = sl_jwks_parse(set, 0, 0, err, sizeof(err));
    assert_non_null(s);
    assert_int_equal(s->n, 1);
    sl_jwks_free(s);
    json_decref(set);
    set = J("{\"keys\": [{\"kty\": \"XYZ\"}]}");
    assert_null(sl_jwks_parse(set, 0, 0, err, sizeof(err)));
    json_decref(set);
    set = J("{\"keys\": []}");
    assert_null(sl_jwks_parse(set, 0, 0, err, sizeof(err)));
    json_decref(set);
    json_decref(ec);
    EVP_PKEY_free(priv);
}

static void test_es_signature_conversion_and_verify(void **state)
{
    (void)state;
    EVP_PKEY *priv;
    json_t *jwk = p256_jwk(&priv);
    sl_jwk_t k;
    const char *field;
    char err[200];
    assert_int_equal(sl_jwk_parse(jwk, 1, &k, &field, err, sizeof(err)), 0);
    const unsigned char msg[] = "header.payload";
    unsigned char der[128];
    size_t dlen = sizeof(der);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    assert_int_equal(EVP_DigestSignInit(ctx, NULL, EVP_sha256(), NULL, priv), 1);
    assert_int_equal(EVP_DigestSign(ctx, der, &dlen, msg, sizeof(msg) - 1), 1);
    EVP_MD_CTX_free(ctx);
    /* DER -> JOSE r||s by hand, then back through the code under test. */
    const unsigned char *p = der;
    ECDSA_SIG *es = d2i_ECDSA_SIG(NULL, &p, (long)dlen);
    assert_non_null(es);
    unsigned char raw[64];
    BN_bn2binpad(ECDSA_SIG_get0_r(es), raw, 32);
    BN_bn2binpad(ECDSA_SIG_get0_s(es), raw + 32, 32);
    ECDSA_SIG_free(es);
    unsigned char back[128];
    long blen = sl_jwt_es_sig_to_der(raw, 64, 32, back, sizeof(back));
    assert_true(blen > 0);
    assert_int_equal(sl_jwk_verify(&k, SL_JWT_ES256, msg, sizeof(msg) - 1, raw, 64), 1);
    assert_int_equal(sl_jwt_es_sig_to_der(raw, 63, 32, back, sizeof(back)), -1);
    /* DER itself is not a JOSE signature. */
    assert_int_equal(sl_jwk_verify(&k, SL_JWT_ES256, msg, sizeof(msg) - 1, der, dlen), 0);
    raw[5] ^= 1;
    assert_int_equal(sl_jwk_verify(&k, SL_JWT_ES256, msg, sizeof(msg) - 1, raw, 64), 0);
    /* The key decides: an EC key never verifies ES384 or HS256. */
    assert_int_equal(sl_jwk_verify(&k, SL_JWT_ES384, msg, sizeof(msg) - 1, raw, 64), 0);
    assert_int_equal(sl_jwk_verify(&k, SL_JWT_HS256, msg, sizeof(msg) - 1, raw, 32), 0);
    sl_jwk_clear(&k);
    json_decref(jwk);
    EVP_PKEY_free(priv);
    assert_int_equal(sl_jwt_alg_from_name("none", 4), -1);
    assert_int_equal(sl_jwt_alg_from_name("hs256", 5), -1);
    assert_int_equal(sl_jwt_alg_from_name("EdDSA", 5), SL_JWT_EDDSA);
}

static jwt_t *compiled(const char *config)
{
    json_t *c = J(config);
    sl_policy_env_t env = {.consumers = NULL, .nworkers = 1};
    char err[256] = "";
    jwt_t *j = compile(c, &env, err, sizeof(err));
    json_decref(c);
    assert_non_null(j);
    return j;
}

static void test_claims(void **state)
{
    (void)state;
    jwt_t *j = compiled("{\"secret\": \"0123456789abcdef0123456789abcdef\", \"issuers\": [\"i\"],"
                        " \"audiences\": [\"a\", \"b\"], \"leewaySeconds\": 10,"
                        " \"requiredClaims\": [\"exp\"], \"requiredScopes\": [\"r\", \"w\"]}");
    struct {
        const char *payload;
        enum refusal want;
    } cases[] = {
        {"{\"iss\": \"i\", \"aud\": \"a\", \"exp\": 1005, \"scope\": \"w r\"}", R_NONE},
        {"{\"iss\": \"i\", \"aud\": [\"x\", \"b\"], \"exp\": 995, \"scp\": [\"r\", \"w\"]}",
         R_NONE},
        {"{\"iss\": \"i\", \"aud\": \"a\", \"exp\": 989, \"scope\": \"w r\"}", R_INVALID},
        {"{\"iss\": \"i\", \"aud\": \"a\", \"exp\": 2000, \"nbf\": 1011, \"scope\": \"w r\"}",
         R_INVALID},
        {"{\"iss\": \"i\", \"aud\": \"a\", \"exp\": 2000, \"nbf\": 1009, \"scope\": \"w r\"}",
         R_NONE},
        {"{\"iss\": \"i\", \"aud\": \"a\", \"exp\": 2000, \"iat\": 1011, \"scope\": \"w r\"}",
         R_INVALID},
        {"{\"iss\": \"j\", \"aud\": \"a\", \"exp\": 2000, \"scope\": \"w r\"}", R_INVALID},
        {"{\"aud\": \"a\", \"exp\": 2000, \"scope\": \"w r\"}", R_INVALID},
        {"{\"iss\": \"i\", \"aud\": \"c\", \"exp\": 2000, \"scope\": \"w r\"}", R_INVALID},
        {"{\"iss\": \"i\", \"aud\": \"a\", \"scope\": \"w r\"}", R_INVALID},
        {"{\"iss\": \"i\", \"aud\": \"a\", \"exp\": \"2000\", \"scope\": \"w r\"}", R_INVALID},
        {"{\"iss\": \"i\", \"aud\": \"a\", \"exp\": 2000, \"scope\": \"w rr\"}", R_SCOPE},
        {"{\"iss\": \"i\", \"aud\": \"a\", \"exp\": 2000, \"scp\": \"w r\"}", R_NONE},
        {"{\"iss\": \"i\", \"aud\": \"a\", \"exp\": 2000}", R_SCOPE},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *p = J(cases[i].payload);
        verdict_t v = check_claims(j, p, 1000.0);
        if (v.status != cases[i].want)
            fail_msg("case %zu (%s): got %d (%s)", i, cases[i].payload, v.status,
                     v.desc ? v.desc : "");
        json_decref(p);
    }
    assert_string_equal(j->scope_challenge,
                        "Bearer realm=\"sluice\", error=\"insufficient_scope\", scope=\"r w\"");
    jwt_free(j);
}

static void test_claim_paths_and_values(void **state)
{
    (void)state;
    json_t *p = J("{\"sub\": \"s\", \"org\": {\"id\": 7, \"t\": {\"x\": true}},"
                  " \"https://e.com/r\": \"lit\", \"f\": 0.5, \"a\": [1], \"bad\": \"a\\nb\"}");
    char out[64];
    assert_int_equal(claim_value(claim_at(p, "sub"), out, sizeof(out)), 1);
    assert_int_equal(claim_value(claim_at(p, "org.id"), out, sizeof(out)), 1);
    assert_memory_equal(out, "7", 1);
    assert_int_equal(claim_value(claim_at(p, "org.t.x"), out, sizeof(out)), 4);
    assert_memory_equal(out, "true", 4);
    assert_int_equal(claim_value(claim_at(p, "https://e.com/r"), out, sizeof(out)), 3);
    assert_int_equal(claim_value(claim_at(p, "f"), out, sizeof(out)), 3);
    assert_int_equal(claim_value(claim_at(p, "a"), out, sizeof(out)), -1);
    assert_int_equal(claim_value(claim_at(p, "org"), out, sizeof(out)), -1);
    assert_int_equal(claim_value(claim_at(p, "bad"), out, sizeof(out)), -1);
    assert_null(claim_at(p, "org.nope"));
    assert_null(claim_at(p, "sub.x"));
    json_decref(p);
}

static void test_uri_and_ca_checks(void **state)
{
    (void)state;
    char uerr[200];
    int tls = -1;
    assert_int_equal(sl_jwks_uri_check("http://idp:8080/k", &tls, uerr, sizeof(uerr)), 0);
    assert_int_equal(tls, 0);
    assert_int_equal(sl_jwks_uri_check("http://[::1]:80/k", NULL, uerr, sizeof(uerr)), 0);
    assert_int_equal(sl_jwks_uri_check("https://idp/k", &tls, uerr, sizeof(uerr)), 0);
    assert_int_equal(tls, 1);
    assert_int_equal(sl_jwks_uri_check("ftp://idp/k", NULL, uerr, sizeof(uerr)), -1);
    assert_int_equal(sl_jwks_uri_check("http://u@idp/k", NULL, uerr, sizeof(uerr)), -1);
    assert_int_equal(sl_jwks_uri_check("http://idp:0/k", NULL, uerr, sizeof(uerr)), -1);
    /* The port defaults to the scheme's. */
    char host[256], port[8], path[768];
    assert_int_equal(split_uri("https://idp/k", &tls, host, sizeof(host), port, sizeof(port), path,
                               sizeof(path), uerr, sizeof(uerr)),
                     0);
    assert_string_equal(port, "443");
    assert_int_equal(sl_jwks_ca_pem_check("-----BEGIN CERTIFICATE-----\nnot base64!\n"
                                          "-----END CERTIFICATE-----\n",
                                          uerr, sizeof(uerr)),
                     -1);
    assert_non_null(strstr(uerr, "certificate 1 does not parse"));
}

static void test_cache_is_bounded_and_expires(void **state)
{
    (void)state;
    cache_t *c = worker_new(NULL);
    uint8_t sha[32] = {0};
    /* Five tokens in one set of four ways: the least recently used goes. */
    for (int i = 0; i < 5; i++) {
        sha[1] = (uint8_t)i;
        entry_t *e = cache_victim(c, sha, 1000);
        free(e->values);
        memcpy(e->sha, sha, 32);
        e->until_ms = 2000;
        e->used = ++c->tick;
        e->values = malloc(1);
        if (i == 3) { /* touch 0 so that 1 is the oldest */
            sha[1] = 0;
            assert_non_null(cache_find(c, sha, 1000));
        }
    }
    sha[1] = 0;
    assert_non_null(cache_find(c, sha, 1000));
    sha[1] = 1;
    assert_null(cache_find(c, sha, 1000));
    sha[1] = 4;
    assert_non_null(cache_find(c, sha, 1000));
    assert_null(cache_find(c, sha, 2000)); /* expired */
    worker_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_b64url),
        cmocka_unit_test(test_jwk_parse_and_refusals),
        cmocka_unit_test(test_es_signature_conversion_and_verify),
        cmocka_unit_test(test_claims),
        cmocka_unit_test(test_claim_paths_and_values),
        cmocka_unit_test(test_uri_and_ca_checks),
        cmocka_unit_test(test_cache_is_bounded_and_expires),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
