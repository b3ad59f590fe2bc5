/*
 * JWKs and JWS signature checks (jwk.h): parsing public keys into OpenSSL 3
 * EVP_PKEYs through EVP_PKEY_fromdata, and verifying with EVP_DigestVerify
 * (one EVP_MD_CTX per call: a parsed EVP_PKEY is shared read-only by every
 * worker, which OpenSSL 3 allows).
 */
#include "jwk.h"

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/hmac.h>
#include <openssl/param_build.h>
#include <openssl/rsa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const sl_jwt_alg_names[] = {"RS256", "RS384", "RS512", "PS256", "PS384",
                                        "PS512", "ES256", "ES384", "EdDSA", "HS256",
                                        "HS384", "HS512", NULL};

int sl_jwt_alg_from_name(const char *s, size_t len)
{
    for (int i = 0; i < SL_JWT_ALG_COUNT; i++)
        if (strlen(sl_jwt_alg_names[i]) == len && memcmp(sl_jwt_alg_names[i], s, len) == 0)
            return i;
    return -1;
}

static int b64_value(unsigned char ch)
{
    if (ch >= 'A' && ch <= 'Z')
        return ch - 'A';
    if (ch >= 'a' && ch <= 'z')
        return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9')
        return ch - '0' + 52;
    if (ch == '-')
        return 62;
    if (ch == '_')
        return 63;
    return -1;
}

long sl_jwt_b64url_decode(const char *in, size_t len, unsigned char *out)
{
    if (len % 4 == 1)
        return -1;
    size_t o = 0;
    uint32_t acc = 0;
    unsigned bits = 0;
    for (size_t i = 0; i < len; i++) {
        int v = b64_value((unsigned char)in[i]);
        if (v < 0)
            return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    if (acc != 0) /* non-zero unused bits: two spellings of one value */
        return -1;
    return (long)o;
}

/* A base64url member of jwk decoded into a fresh buffer (caller frees). */
static unsigned char *member(json_t *jwk, const char *name, size_t *len, const char **field,
                             char *err, size_t errlen)
{
    json_t *v = json_object_get(jwk, name);
    *field = name;
    if (!json_is_string(v)) {
        snprintf(err, errlen, v ? "expected a base64url string" : "required member missing");
        return NULL;
    }
    size_t n = json_string_length(v);
    if (n == 0 || n > 8192) {
        snprintf(err, errlen, "expected 1 to 8192 base64url characters");
        return NULL;
    }
    unsigned char *buf = malloc(n * 3 / 4 + 1);
    if (!buf) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    long got = sl_jwt_b64url_decode(json_string_value(v), n, buf);
    if (got <= 0) {
        free(buf);
        snprintf(err, errlen, "not valid base64url (RFC 7515: no padding, no '+' or '/')");
        return NULL;
    }
    *len = (size_t)got;
    return buf;
}

static EVP_PKEY *from_params(const char *type, OSSL_PARAM_BLD *bld)
{
    OSSL_PARAM *params = OSSL_PARAM_BLD_to_param(bld);
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_name(NULL, type, NULL);
    EVP_PKEY *pkey = NULL;
    if (params && ctx && EVP_PKEY_fromdata_init(ctx) == 1)
        if (EVP_PKEY_fromdata(ctx, &pkey, EVP_PKEY_PUBLIC_KEY, params) != 1)
            pkey = NULL;
    EVP_PKEY_CTX_free(ctx);
    OSSL_PARAM_free(params);
    return pkey;
}

static int parse_rsa(json_t *jwk, sl_jwk_t *out, const char **field, char *err, size_t errlen)
{
    size_t nlen = 0, elen = 0;
    unsigned char *n = member(jwk, "n", &nlen, field, err, errlen);
    if (!n)
        return -1;
    unsigned char *e = member(jwk, "e", &elen, field, err, errlen);
    if (!e) {
        free(n);
        return -1;
    }
    int rc = -1;
    BIGNUM *bn = BN_bin2bn(n, (int)nlen, NULL), *be = BN_bin2bn(e, (int)elen, NULL);
    OSSL_PARAM_BLD *bld = OSSL_PARAM_BLD_new();
    *field = "n";
    if (!bn || !be || !bld) {
        snprintf(err, errlen, "out of memory");
    } else if (BN_num_bits(bn) < 2048 || BN_num_bits(bn) > 8192) {
        snprintf(err, errlen, "an RSA modulus of 2048 to 8192 bits (this one has %d)",
                 BN_num_bits(bn));
    } else if (!BN_is_odd(be) || BN_num_bits(be) < 2 || BN_num_bits(be) > 64) {
        *field = "e";
        snprintf(err, errlen, "not a usable RSA public exponent");
    } else if (OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, bn) != 1 ||
               OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, be) != 1 ||
               !(out->pkey = from_params("RSA", bld))) {
        *field = "";
        snprintf(err, errlen, "OpenSSL refused the RSA key");
    } else {
        out->kind = SL_JWK_RSA;
        out->algs = SL_JWT_ALGS_RSA;
        rc = 0;
    }
    OSSL_PARAM_BLD_free(bld);
    BN_free(bn);
    BN_free(be);
    free(n);
    free(e);
    return rc;
}

static int parse_ec(json_t *jwk, sl_jwk_t *out, const char **field, char *err, size_t errlen)
{
    const char *crv = json_string_value(json_object_get(jwk, "crv"));
    size_t coord;
    const char *group;
    *field = "crv";
    if (crv && strcmp(crv, "P-256") == 0) {
        coord = 32;
        group = "P-256";
        out->kind = SL_JWK_EC256;
        out->algs = SL_JWT_ALG_BIT(SL_JWT_ES256);
    } else if (crv && strcmp(crv, "P-384") == 0) {
        coord = 48;
        group = "P-384";
        out->kind = SL_JWK_EC384;
        out->algs = SL_JWT_ALG_BIT(SL_JWT_ES384);
    } else {
        snprintf(err, errlen, "an EC key's crv must be P-256 or P-384");
        return -1;
    }
    size_t xlen = 0, ylen = 0;
    unsigned char *x = member(jwk, "x", &xlen, field, err, errlen);
    if (!x)
        return -1;
    unsigned char *y = member(jwk, "y", &ylen, field, err, errlen);
    if (!y) {
        free(x);
        return -1;
    }
    int rc = -1;
    unsigned char point[1 + 2 * 48];
    OSSL_PARAM_BLD *bld = NULL;
    if (xlen != coord || ylen != coord) {
        *field = xlen != coord ? "x" : "y";
        snprintf(err, errlen, "a %s coordinate is %zu bytes", crv, coord);
        goto done;
    }
    point[0] = 0x04; /* uncompressed */
    memcpy(point + 1, x, coord);
    memcpy(point + 1 + coord, y, coord);
    bld = OSSL_PARAM_BLD_new();
    *field = "";
    if (!bld || OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME, group, 0) != 1 ||
        OSSL_PARAM_BLD_push_octet_string(bld, OSSL_PKEY_PARAM_PUB_KEY, point, 1 + 2 * coord) != 1 ||
        !(out->pkey = from_params("EC", bld))) {
        snprintf(err, errlen, "the point (x, y) is not on %s", crv);
        goto done;
    }
    /* fromdata may take a point it never checked: a point off the curve
     * is the invalid-curve attack's way in. */
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_pkey(NULL, out->pkey, NULL);
    int ok = ctx && EVP_PKEY_public_check(ctx) == 1;
    EVP_PKEY_CTX_free(ctx);
    if (!ok) {
        EVP_PKEY_free(out->pkey);
        out->pkey = NULL;
        snprintf(err, errlen, "the point (x, y) is not on %s", crv);
        goto done;
    }
    rc = 0;
done:
    OSSL_PARAM_BLD_free(bld);
    free(x);
    free(y);
    return rc;
}

static int parse_okp(json_t *jwk, sl_jwk_t *out, const char **field, char *err, size_t errlen)
{
    const char *crv = json_string_value(json_object_get(jwk, "crv"));
    *field = "crv";
    if (!crv || strcmp(crv, "Ed25519") != 0) {
        snprintf(err, errlen, "an OKP key's crv must be Ed25519");
        return -1;
    }
    size_t xlen = 0;
    unsigned char *x = member(jwk, "x", &xlen, field, err, errlen);
    if (!x)
        return -1;
    if (xlen != 32 || !(out->pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, x, 32))) {
        snprintf(err, errlen, "an Ed25519 public key is 32 bytes");
        free(x);
        return -1;
    }
    free(x);
    out->kind = SL_JWK_ED25519;
    out->algs = SL_JWT_ALG_BIT(SL_JWT_EDDSA);
    return 0;
}

static int parse_oct(json_t *jwk, sl_jwk_t *out, const char **field, char *err, size_t errlen)
{
    size_t klen = 0;
    unsigned char *k = member(jwk, "k", &klen, field, err, errlen);
    if (!k)
        return -1;
    if (klen < SL_JWK_SECRET_MIN || klen > SL_JWK_SECRET_MAX) {
        snprintf(err, errlen, "an HMAC secret of %d to %d bytes (this one has %zu)",
                 SL_JWK_SECRET_MIN, SL_JWK_SECRET_MAX, klen);
        OPENSSL_cleanse(k, klen);
        free(k);
        return -1;
    }
    out->kind = SL_JWK_OCT;
    out->algs = SL_JWT_ALGS_HS;
    out->secret = k;
    out->secret_len = klen;
    return 0;
}

void sl_jwk_clear(sl_jwk_t *k)
{
    EVP_PKEY_free(k->pkey);
    if (k->secret) {
        OPENSSL_cleanse(k->secret, k->secret_len);
        free(k->secret);
    }
    memset(k, 0, sizeof(*k));
}

int sl_jwk_parse(json_t *jwk, int allow_oct, sl_jwk_t *out, const char **field, char *err,
                 size_t errlen)
{
    memset(out, 0, sizeof(*out));
    *field = "";
    if (!json_is_object(jwk)) {
        snprintf(err, errlen, "expected a JWK object");
        return -1;
    }
    json_t *use = json_object_get(jwk, "use");
    if (use && !(json_is_string(use) && strcmp(json_string_value(use), "sig") == 0))
        return 1; /* an encryption key: not ours to use */
    json_t *kid = json_object_get(jwk, "kid");
    if (kid) {
        *field = "kid";
        if (!json_is_string(kid) || json_string_length(kid) == 0 ||
            json_string_length(kid) > SL_JWK_KID_MAX) {
            snprintf(err, errlen, "a kid is a string of 1 to %d characters", SL_JWK_KID_MAX);
            return -1;
        }
        memcpy(out->kid, json_string_value(kid), json_string_length(kid) + 1);
    }
    const char *kty = json_string_value(json_object_get(jwk, "kty"));
    *field = "kty";
    int rc;
    if (!kty) {
        snprintf(err, errlen, "required member missing (RSA, EC, OKP or oct)");
        return -1;
    } else if (strcmp(kty, "RSA") == 0) {
        rc = parse_rsa(jwk, out, field, err, errlen);
    } else if (strcmp(kty, "EC") == 0) {
        rc = parse_ec(jwk, out, field, err, errlen);
    } else if (strcmp(kty, "OKP") == 0) {
        rc = parse_okp(jwk, out, field, err, errlen);
    } else if (strcmp(kty, "oct") == 0) {
        if (!allow_oct)
            return 1;
        rc = parse_oct(jwk, out, field, err, errlen);
    } else {
        snprintf(err, errlen, "unsupported kty '%.32s' (RSA, EC, OKP or oct)", kty);
        return -1;
    }
    if (rc != 0)
        return rc;
    json_t *alg = json_object_get(jwk, "alg");
    if (alg) {
        int a = json_is_string(alg) ? sl_jwt_alg_from_name(json_string_value(alg),
                                                           json_string_length(alg))
                                    : -1;
        *field = "alg";
        if (a < 0 || !(out->algs & SL_JWT_ALG_BIT(a))) {
            snprintf(err, errlen, "alg '%.32s' cannot be used with a %s key",
                     json_is_string(alg) ? json_string_value(alg) : "?", kty);
            sl_jwk_clear(out);
            return -1;
        }
        out->algs = SL_JWT_ALG_BIT(a);
    }
    return 0;
}

void sl_jwks_free(sl_jwks_t *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        sl_jwk_clear(&s->keys[i]);
    free(s->keys);
    free(s);
}

sl_jwks_t *sl_jwks_parse(json_t *doc, int strict, int allow_oct, char *err, size_t errlen)
{
    json_t *keys = json_is_object(doc) ? json_object_get(doc, "keys") : NULL;
    if (!json_is_array(keys)) {
        snprintf(err, errlen, "a JWKS is an object with a \"keys\" array");
        return NULL;
    }
    size_t n = json_array_size(keys);
    if (n > SL_JWKS_MAX_KEYS) {
        snprintf(err, errlen, "at most %d keys", SL_JWKS_MAX_KEYS);
        return NULL;
    }
    sl_jwks_t *s = calloc(1, sizeof(*s));
    if (!s || (n && !(s->keys = calloc(n, sizeof(*s->keys))))) {
        free(s);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    int skipped_error = 0;
    for (size_t i = 0; i < n; i++) {
        const char *field = "";
        char why[160];
        int rc = sl_jwk_parse(json_array_get(keys, i), allow_oct, &s->keys[s->n], &field, why,
                              sizeof(why));
        if (rc == 0) {
            s->n++;
            continue;
        }
        if (rc > 0 && !strict)
            continue; /* an encryption key in someone else's set */
        if (rc > 0)
            snprintf(why, sizeof(why), "not a signature key (\"use\" must be \"sig\")");
        if (!skipped_error)
            snprintf(err, errlen, "keys[%zu]%s%s: %s", i, *field ? "." : "", field, why);
        skipped_error = 1;
        if (strict)
            break;
    }
    /* Strict: any error refuses the set. Remote: keys we cannot use are
     * skipped, unless nothing usable is left. */
    if (skipped_error && (strict || s->n == 0)) {
        sl_jwks_free(s);
        return NULL;
    }
    if (s->n == 0 && !strict) {
        snprintf(err, errlen, "no usable signature key in the set");
        sl_jwks_free(s);
        return NULL;
    }
    return s;
}

long sl_jwt_es_sig_to_der(const unsigned char *sig, size_t sig_len, size_t coord_len,
                          unsigned char *der, size_t cap)
{
    if (sig_len != 2 * coord_len)
        return -1;
    ECDSA_SIG *es = ECDSA_SIG_new();
    BIGNUM *r = BN_bin2bn(sig, (int)coord_len, NULL);
    BIGNUM *s = BN_bin2bn(sig + coord_len, (int)coord_len, NULL);
    if (!es || !r || !s || ECDSA_SIG_set0(es, r, s) != 1) {
        ECDSA_SIG_free(es);
        BN_free(r);
        BN_free(s);
        return -1;
    }
    long len = -1;
    int need = i2d_ECDSA_SIG(es, NULL);
    if (need > 0 && (size_t)need <= cap) {
        unsigned char *p = der;
        len = i2d_ECDSA_SIG(es, &p);
    }
    ECDSA_SIG_free(es); /* frees r and s */
    return len;
}

static const EVP_MD *alg_md(int alg)
{
    switch (alg) {
    case SL_JWT_RS256:
    case SL_JWT_PS256:
    case SL_JWT_ES256:
    case SL_JWT_HS256:
        return EVP_sha256();
    case SL_JWT_RS384:
    case SL_JWT_PS384:
    case SL_JWT_ES384:
    case SL_JWT_HS384:
        return EVP_sha384();
    case SL_JWT_RS512:
    case SL_JWT_PS512:
    case SL_JWT_HS512:
        return EVP_sha512();
    default:
        return NULL; /* EdDSA: no pre-hash */
    }
}

int sl_jwk_verify(const sl_jwk_t *k, int alg, const unsigned char *input, size_t input_len,
                  const unsigned char *sig, size_t sig_len)
{
    if (alg < 0 || alg >= SL_JWT_ALG_COUNT || !(k->algs & SL_JWT_ALG_BIT(alg)))
        return 0;
    const EVP_MD *md = alg_md(alg);
    if (k->kind == SL_JWK_OCT) {
        unsigned char mac[EVP_MAX_MD_SIZE];
        unsigned int mlen = 0;
        if (!HMAC(md, k->secret, (int)k->secret_len, input, input_len, mac, &mlen))
            return 0;
        return sig_len == mlen && CRYPTO_memcmp(mac, sig, mlen) == 0;
    }
    if (!k->pkey)
        return 0;
    unsigned char der[2 * 48 + 16];
    if (alg == SL_JWT_ES256 || alg == SL_JWT_ES384) {
        long dlen = sl_jwt_es_sig_to_der(sig, sig_len, alg == SL_JWT_ES256 ? 32 : 48, der,
                                         sizeof(der));
        if (dlen < 0)
            return 0;
        sig = der;
        sig_len = (size_t)dlen;
    }
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_PKEY_CTX *pctx = NULL;
    int ok = 0;
    if (!ctx || EVP_DigestVerifyInit(ctx, &pctx, md, NULL, k->pkey) != 1)
        goto done;
    if (alg >= SL_JWT_PS256 && alg <= SL_JWT_PS512 &&
        (EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PSS_PADDING) != 1 ||
         EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, RSA_PSS_SALTLEN_DIGEST) != 1 ||
         EVP_PKEY_CTX_set_rsa_mgf1_md(pctx, md) != 1))
        goto done;
    ok = EVP_DigestVerify(ctx, sig, sig_len, input, input_len) == 1;
done:
    EVP_MD_CTX_free(ctx);
    return ok;
}
