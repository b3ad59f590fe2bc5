/*
 * JSON Web Keys and JWS signatures for the jwt policy (RFC 7515, 7517,
 * 7518, 8037): strict base64url, a JWK's public parameters turned into an
 * OpenSSL EVP_PKEY (RSA n/e, EC P-256/P-384 x/y, OKP Ed25519 x) or an HMAC
 * secret (oct k), and one signature check with a given key and algorithm.
 *
 * The rule against algorithm confusion lives here: a key says which
 * algorithms it can verify (sl_jwk_algs: an RSA key RS and PS, an EC key
 * the ES of its curve, an Ed25519 key EdDSA, a secret HS; narrowed by the
 * JWK's own "alg"), and sl_jwk_verify refuses any other pairing, so an RSA
 * public key is never used as an HMAC secret whatever the token says.
 *
 * Not here: fetching key sets (jwks_fetch.c), claims (jwt.c).
 */
#ifndef SL_JWT_JWK_H
#define SL_JWT_JWK_H

#include <jansson.h>
#include <openssl/evp.h>
#include <stddef.h>
#include <stdint.h>

enum sl_jwt_alg {
    SL_JWT_RS256 = 0,
    SL_JWT_RS384,
    SL_JWT_RS512,
    SL_JWT_PS256,
    SL_JWT_PS384,
    SL_JWT_PS512,
    SL_JWT_ES256,
    SL_JWT_ES384,
    SL_JWT_EDDSA,
    SL_JWT_HS256,
    SL_JWT_HS384,
    SL_JWT_HS512,
    SL_JWT_ALG_COUNT
};
#define SL_JWT_ALG_BIT(a) (1u << (a))
#define SL_JWT_ALGS_RSA 0x3fu /* RS* and PS* */
#define SL_JWT_ALGS_HS (SL_JWT_ALG_BIT(SL_JWT_HS256) | SL_JWT_ALG_BIT(SL_JWT_HS384) | \
                        SL_JWT_ALG_BIT(SL_JWT_HS512))
#define SL_JWT_ALGS_ASYMMETRIC ((1u << SL_JWT_HS256) - 1u)

/* NULL-terminated list of algorithm names, for the config's enum. */
extern const char *const sl_jwt_alg_names[];
/* The algorithm named s (exactly, case-sensitive as RFC 7518), or -1:
 * "none" and anything unknown are -1. */
int sl_jwt_alg_from_name(const char *s, size_t len);

enum sl_jwk_kind { SL_JWK_RSA = 0, SL_JWK_EC256, SL_JWK_EC384, SL_JWK_ED25519, SL_JWK_OCT };

#define SL_JWK_KID_MAX 128
#define SL_JWK_SECRET_MIN 32 /* bytes; RFC 7518 3.2: at least the hash size */
#define SL_JWK_SECRET_MAX 512
#define SL_JWKS_MAX_KEYS 64

typedef struct sl_jwk {
    char kid[SL_JWK_KID_MAX + 1]; /* "" = none */
    enum sl_jwk_kind kind;
    unsigned algs;         /* SL_JWT_ALG_BIT set this key may verify */
    EVP_PKEY *pkey;        /* asymmetric kinds */
    unsigned char *secret; /* SL_JWK_OCT */
    size_t secret_len;
} sl_jwk_t;

typedef struct sl_jwks {
    sl_jwk_t *keys;
    size_t n;
    struct sl_jwks *retired_next; /* jwks_fetch.c's list of replaced sets */
} sl_jwks_t;

/* Strict base64url without padding (RFC 7515 2): the alphabet only, no
 * '=', unused trailing bits zero. Returns the decoded length, or -1. out
 * must hold len * 3 / 4 + 1 bytes. */
long sl_jwt_b64url_decode(const char *in, size_t len, unsigned char *out);

/* Parses one JWK. Returns 0 with *out filled, 1 when the key is skipped
 * (its "use" is not "sig", or an oct key where allow_oct is 0), -1 with
 * the offending member in *field ("n", "crv", "" for the key itself) and
 * the reason in err. */
int sl_jwk_parse(json_t *jwk, int allow_oct, sl_jwk_t *out, const char **field, char *err,
                 size_t errlen);
void sl_jwk_clear(sl_jwk_t *k);

/* A key set from a JWKS document ({"keys": [...]}). Remote sets skip keys
 * they cannot use (the document is someone else's); inline ones (strict)
 * refuse them. NULL with the reason in err (with the key index). */
sl_jwks_t *sl_jwks_parse(json_t *doc, int strict, int allow_oct, char *err, size_t errlen);
void sl_jwks_free(sl_jwks_t *s);

/* A JOSE ECDSA signature (r || s, each coord_len bytes) as DER, into der
 * (cap bytes). Returns the DER length, or -1. */
long sl_jwt_es_sig_to_der(const unsigned char *sig, size_t sig_len, size_t coord_len,
                          unsigned char *der, size_t cap);

/* 1 when sig is a valid `alg` signature of input under k; 0 otherwise,
 * including when k cannot verify alg (algorithm confusion). */
int sl_jwk_verify(const sl_jwk_t *k, int alg, const unsigned char *input, size_t input_len,
                  const unsigned char *sig, size_t sig_len);

#endif
