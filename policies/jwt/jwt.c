/*
 * jwt: the caller presents a JWS compact token (RFC 7519) as a bearer
 * token (RFC 6750); the gateway verifies its signature with a configured
 * key (inline JWKS, a shared secret, or a remote JWKS kept fresh by
 * jwks_fetch.c), checks its claims (exp, nbf, iat with leeway, iss, aud,
 * required claims, scopes), maps (iss, sub) to a Consumer, and passes
 * chosen claims upstream as headers.
 *
 *   config: {jwks: {keys: [...]}, jwksUri: https://idp/keys, secret: ...,
 *            issuers: [...], audiences: [...], requiredScopes: [...],
 *            claimsToHeaders: {sub: X-User}, consumerRequired: false}
 *
 * Refused, always: "alg": "none" and unknown algorithms, a "crit" header
 * (extensions we do not implement), an algorithm the key cannot do (the
 * key decides the family: jwk.h), duplicate JSON members. The token's own
 * key hints (jku, x5u, jwk) are never followed.
 *
 * Cost of a hot token: each worker caches tokens it verified (by SHA-256,
 * 256 sets of 4 ways, until exp and at most CACHE_MAX_MS), so a repeated
 * token costs one hash and a lookup; the claims' header values are kept
 * in the entry and copied into the request's arena.
 *
 * Not here: the key and signature code (jwk.c), the remote fetch
 * (jwks_fetch.c).
 */
#include "consumers.h"
#include "cookie.h"
#include "jwk.h"
#include "jwks_fetch.h"
#include "policy.h"

#include <ctype.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define MAX_TOKEN 16384
#define MAX_LIST 64
#define MAX_CLAIM_HEADERS 16
#define MAX_CLAIM_VALUE 1024
#define CACHE_SETS 256
#define CACHE_WAYS 4
#define CACHE_MAX_MS (300 * 1000)

typedef struct {
    char *path;  /* "org.id" */
    char *header;
    size_t header_len;
} claim_header_t;

typedef struct {
    const sl_consumers_t *consumers; /* the generation's, outlives us */
    char header[128];
    size_t header_len;
    char prefix[32]; /* "Bearer"; "" = the whole value is the token */
    size_t prefix_len;
    char cookie[128];
    char query[128];
    sl_jwks_t *inline_keys; /* jwks + secret; may be NULL */
    sl_jwks_fetch_t *remote;
    unsigned algs; /* allowed SL_JWT_ALG_BITs */
    char **issuers;
    size_t nissuers;
    char **audiences;
    size_t naudiences;
    char **required_claims;
    size_t nrequired_claims;
    char **scopes;
    size_t nscopes;
    long leeway_s;
    int consumer_required;
    int forward_token;
    int keep_claims; /* a later policy reads req->jwt_claims (env.jwt_claims) */
    claim_header_t claims[MAX_CLAIM_HEADERS];
    size_t nclaims;
    char scope_challenge[192];
} jwt_t;

/* ---- config --------------------------------------------------------------- */

/* A config member; an explicit null is absent (the model's rule). */
static json_t *cfg(json_t *config, const char *key)
{
    json_t *v = json_object_get(config, key);
    return json_is_null(v) ? NULL : v;
}

static const char *const encodings[] = {"plain", "base64url", NULL};

static int is_tchar(unsigned char ch)
{
    return isalnum(ch) || strchr("!#$%&'*+-.^_`|~", ch);
}

/* Headers a policy must not set (framing, routing): see headers.c. */
static const char *const forbidden[] = {"connection", "transfer-encoding", "content-length",
                                        "upgrade",    "te",                "keep-alive",
                                        "proxy-connection", "host", NULL};

static void check_header_name(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    const char *s = json_string_value(v);
    if (!s || !*s || strlen(s) > 127) {
        sl_validate_error(c, "a header name of 1 to 127 characters");
        return;
    }
    for (const char *p = s; *p; p++)
        if (!is_tchar((unsigned char)*p)) {
            sl_validate_error(c, "'%.64s' is not a valid header name", s);
            return;
        }
    for (size_t i = 0; forbidden[i]; i++)
        if (strcasecmp(s, forbidden[i]) == 0) {
            sl_validate_error(c, "%s is managed by the gateway and cannot be set by a policy", s);
            return;
        }
}

static void check_prefix(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    const char *s = json_string_value(v);
    if (!s || strlen(s) > 31 || strpbrk(s, " \t\r\n\"")) {
        sl_validate_error(c, "an authentication scheme of 0 to 31 characters without spaces "
                             "(\"Bearer\"; \"\" for a header holding only the token)");
    }
}

static void check_name(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    const char *s = json_string_value(v);
    if (!s || !*s || strlen(s) > 127 || strpbrk(s, " \t\r\n;=&"))
        sl_validate_error(c, "a name of 1 to 127 characters without spaces, ';', '=' or '&'");
}

static void check_short_string(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) > 1024)
        sl_validate_error(c, "a string of 1 to 1024 characters");
}

/* RFC 6749 3.3: scope tokens are NQCHARs. */
static void check_scope(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    const char *s = json_string_value(v);
    int ok = s && *s && strlen(s) <= 64;
    for (const char *p = s; ok && *p; p++)
        ok = *p >= 0x21 && *p <= 0x7e && *p != '"' && *p != '\\';
    if (!ok)
        sl_validate_error(c, "a scope of 1 to 64 printable characters without spaces, '\"' "
                             "or '\\'");
}

static void check_jwks(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_object(v)) {
        sl_validate_error(c, "expected a JWKS object {keys: [...]}");
        return;
    }
    json_t *keys = json_object_get(v, "keys");
    if (!json_is_array(keys) || json_array_size(keys) == 0 ||
        json_array_size(keys) > SL_JWKS_MAX_KEYS) {
        size_t saved = sl_validate_push_key(c, "keys");
        sl_validate_error(c, "a list of 1 to %d JWKs", SL_JWKS_MAX_KEYS);
        sl_validate_pop(c, saved);
        return;
    }
    for (size_t i = 0; i < json_array_size(keys); i++) {
        size_t saved = sl_validate_push_key(c, "keys");
        sl_validate_push_index(c, i);
        sl_jwk_t k;
        const char *field = "";
        char why[160];
        int rc = sl_jwk_parse(json_array_get(keys, i), 1, &k, &field, why, sizeof(why));
        if (rc == 0)
            sl_jwk_clear(&k);
        else if (rc > 0)
            sl_validate_error(c, "not a signature key (\"use\" must be \"sig\")");
        else {
            if (*field)
                sl_validate_push_key(c, field);
            sl_validate_error(c, "%s", why);
        }
        sl_validate_pop(c, saved);
    }
}

static void check_uri(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    char err[200];
    if (!json_is_string(v))
        sl_validate_error(c, "expected a URL string");
    else if (sl_jwks_uri_check(json_string_value(v), NULL, err, sizeof(err)) != 0)
        sl_validate_error(c, "%s", err);
}

#define MAX_CA_PEM (1024 * 1024)

/* The shape only: the certificates are parsed by compile (jwks_fetch.h),
 * as a Backend's caBundle is. */
static void check_ca_pem(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    const char *s = json_string_value(v);
    if (!s)
        sl_validate_error(c, "expected a string of PEM certificates");
    else if (json_string_length(v) > MAX_CA_PEM)
        sl_validate_error(c, "longer than %d bytes", MAX_CA_PEM);
    else if (!strstr(s, "-----BEGIN CERTIFICATE-----") || !strstr(s, "-----END CERTIFICATE-----"))
        sl_validate_error(c, "expected PEM certificates (-----BEGIN CERTIFICATE----- ... "
                             "-----END CERTIFICATE-----)");
}

static void check_ca_file(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    const char *s = json_string_value(v);
    if (!s || s[0] != '/')
        sl_validate_error(c, "an absolute path on the runtime's machine");
    else if (strlen(s) > 4096)
        sl_validate_error(c, "longer than 4096 characters");
}

static void check_claims_to_headers(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_object(v)) {
        sl_validate_error(c, "expected an object of claims to header names");
        return;
    }
    if (json_object_size(v) > MAX_CLAIM_HEADERS)
        sl_validate_error(c, "at most %d claims", MAX_CLAIM_HEADERS);
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val)
    {
        size_t saved = sl_validate_push_key(c, key);
        if (!*key || strlen(key) > 256)
            sl_validate_error(c, "a claim path of 1 to 256 characters");
        else
            check_header_name(c, val, NULL);
        sl_validate_pop(c, saved);
    }
}

static const sl_vrange_t cache_range = {10, 86400};
static const sl_vrange_t leeway_range = {0, 3600};

static const sl_vfield_t fields[] = {
    {"header", check_header_name, NULL, 0},
    {"prefix", check_prefix, NULL, 0},
    {"cookie", check_name, NULL, 0},
    {"query", check_name, NULL, 0},
    {"jwks", check_jwks, NULL, 0},
    {"jwksUri", check_uri, NULL, 0},
    {"jwksCacheSeconds", sl_vcheck_int, &cache_range, 0},
    {"jwksCaBundle", check_ca_pem, NULL, 0},
    {"jwksCaFile", check_ca_file, NULL, 0},
    {"secret", check_short_string, NULL, SL_VFIELD_SECRET},
    {"secretEncoding", sl_vcheck_enum, encodings, 0},
    {"algorithms", sl_vcheck_array,
     &(const sl_varray_t){sl_vcheck_enum, sl_jwt_alg_names, 1, SL_JWT_ALG_COUNT}, 0},
    {"issuers", sl_vcheck_array, &(const sl_varray_t){check_short_string, NULL, 1, MAX_LIST}, 0},
    {"audiences", sl_vcheck_array, &(const sl_varray_t){check_short_string, NULL, 1, MAX_LIST},
     0},
    {"leewaySeconds", sl_vcheck_int, &leeway_range, 0},
    {"requiredClaims", sl_vcheck_array,
     &(const sl_varray_t){check_short_string, NULL, 1, 32}, 0},
    {"requiredScopes", sl_vcheck_array, &(const sl_varray_t){check_scope, NULL, 1, 32}, 0},
    {"consumerRequired", sl_vcheck_bool, NULL, 0},
    {"claimsToHeaders", check_claims_to_headers, NULL, 0},
    {"forwardToken", sl_vcheck_bool, NULL, 0},
    {NULL, NULL, NULL, 0},
};

/* The shared secret's bytes (caller frees), or NULL with err. */
static unsigned char *secret_bytes(json_t *config, size_t *len, char *err, size_t errlen)
{
    const char *s = json_string_value(cfg(config, "secret"));
    const char *enc = json_string_value(cfg(config, "secretEncoding"));
    size_t n = strlen(s);
    unsigned char *out = malloc(n + 1);
    if (!out) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (enc && strcmp(enc, "base64url") == 0) {
        long got = sl_jwt_b64url_decode(s, n, out);
        if (got < 0) {
            snprintf(err, errlen, "not valid base64url (no padding, '-' and '_')");
            free(out);
            return NULL;
        }
        n = (size_t)got;
    } else {
        memcpy(out, s, n);
    }
    if (n < SL_JWK_SECRET_MIN || n > SL_JWK_SECRET_MAX) {
        snprintf(err, errlen, "a secret of %d to %d bytes (this one has %zu): an HMAC key "
                              "shorter than its hash is guessable", SL_JWK_SECRET_MIN,
                 SL_JWK_SECRET_MAX, n);
        OPENSSL_cleanse(out, n);
        free(out);
        return NULL;
    }
    *len = n;
    return out;
}

/* The algorithms the configured keys can verify: every key's, and every
 * asymmetric one when keys come from a jwksUri (HS keys are never taken
 * from a remote document). */
static unsigned key_algs(json_t *config)
{
    unsigned algs = 0;
    json_t *keys = json_object_get(cfg(config, "jwks"), "keys");
    for (size_t i = 0; i < json_array_size(keys); i++) {
        sl_jwk_t k;
        const char *field;
        char why[160];
        if (sl_jwk_parse(json_array_get(keys, i), 1, &k, &field, why, sizeof(why)) == 0) {
            algs |= k.algs;
            sl_jwk_clear(&k);
        }
    }
    if (cfg(config, "secret"))
        algs |= SL_JWT_ALGS_HS;
    if (cfg(config, "jwksUri"))
        algs |= SL_JWT_ALGS_ASYMMETRIC;
    return algs;
}

static void check_config(sl_vctx_t *c, json_t *config)
{
    if (!cfg(config, "jwks") && !cfg(config, "jwksUri") &&
        !cfg(config, "secret")) {
        sl_validate_error(c, "the jwt policy needs keys: jwks (inline), jwksUri or secret");
        return;
    }
    char err[200];
    if (cfg(config, "secret")) {
        size_t len;
        unsigned char *s = secret_bytes(config, &len, err, sizeof(err));
        size_t saved = sl_validate_push_key(c, "secret");
        if (!s)
            sl_validate_error(c, "%s", err);
        else {
            OPENSSL_cleanse(s, len);
            free(s);
        }
        sl_validate_pop(c, saved);
    }
    static const char *const ca_fields[] = {"jwksCaBundle", "jwksCaFile"};
    const char *uri = json_string_value(cfg(config, "jwksUri"));
    int tls = 0;
    if (uri && sl_jwks_uri_check(uri, &tls, err, sizeof(err)) != 0)
        uri = NULL; /* reported by its field */
    for (int i = 0; i < 2; i++) {
        if (!cfg(config, ca_fields[i]))
            continue;
        size_t saved = sl_validate_push_key(c, ca_fields[i]);
        if (i == 1 && cfg(config, ca_fields[0]))
            sl_validate_error(c, "set at most one of jwksCaBundle (PEM) or jwksCaFile (a path)");
        else if (!cfg(config, "jwksUri"))
            sl_validate_error(c, "only meaningful with jwksUri");
        else if (uri && !tls)
            sl_validate_error(c, "only meaningful with an https:// jwksUri");
        sl_validate_pop(c, saved);
    }
    if (cfg(config, "secretEncoding") && !cfg(config, "secret")) {
        size_t saved = sl_validate_push_key(c, "secretEncoding");
        sl_validate_error(c, "only meaningful with secret");
        sl_validate_pop(c, saved);
    }
    unsigned have = key_algs(config);
    json_t *algs = cfg(config, "algorithms");
    for (size_t i = 0; i < json_array_size(algs); i++) {
        const char *name = json_string_value(json_array_get(algs, i));
        int a = sl_jwt_alg_from_name(name, strlen(name));
        if (a >= 0 && !(have & SL_JWT_ALG_BIT(a))) {
            size_t saved = sl_validate_push_key(c, "algorithms");
            sl_validate_push_index(c, i);
            sl_validate_error(c, "no configured key can verify %s%s", name,
                              a >= SL_JWT_HS256 ? " (HS keys come from secret or an inline "
                                                  "oct key, never from jwksUri)"
                                                : "");
            sl_validate_pop(c, saved);
        }
    }
}
static const sl_vschema_t schema = {fields, check_config};

static char **string_list(json_t *arr, size_t *n)
{
    *n = json_array_size(arr);
    if (!*n)
        return NULL;
    char **out = calloc(*n, sizeof(*out));
    for (size_t i = 0; out && i < *n; i++)
        if (!(out[i] = strdup(json_string_value(json_array_get(arr, i))))) {
            for (size_t j = 0; j < i; j++)
                free(out[j]);
            free(out);
            out = NULL;
        }
    if (!out)
        *n = (size_t)-1;
    return out;
}

static void free_list(char **l, size_t n)
{
    for (size_t i = 0; l && i < n; i++)
        free(l[i]);
    free(l);
}

static void jwt_free(void *state)
{
    jwt_t *j = state;
    if (!j)
        return;
    sl_jwks_free(j->inline_keys);
    sl_jwks_fetch_free(j->remote);
    free_list(j->issuers, j->nissuers);
    free_list(j->audiences, j->naudiences);
    free_list(j->required_claims, j->nrequired_claims);
    free_list(j->scopes, j->nscopes);
    for (size_t i = 0; i < j->nclaims; i++) {
        free(j->claims[i].path);
        free(j->claims[i].header);
    }
    free(j);
}

/* Inline keys: the JWKS's, then the secret as one more (oct) key. */
static sl_jwks_t *inline_keys(json_t *config, char *err, size_t errlen)
{
    json_t *jwks = cfg(config, "jwks");
    sl_jwks_t *s = jwks ? sl_jwks_parse(jwks, 1, 1, err, errlen) : calloc(1, sizeof(*s));
    if (!s) {
        if (!jwks)
            snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (!cfg(config, "secret"))
        return s;
    size_t len = 0;
    unsigned char *secret = secret_bytes(config, &len, err, errlen);
    sl_jwk_t *keys = secret ? realloc(s->keys, (s->n + 1) * sizeof(*keys)) : NULL;
    if (!keys) {
        if (secret) {
            OPENSSL_cleanse(secret, len);
            snprintf(err, errlen, "out of memory");
        }
        free(secret);
        sl_jwks_free(s);
        return NULL;
    }
    s->keys = keys;
    memset(&keys[s->n], 0, sizeof(keys[0]));
    keys[s->n].kind = SL_JWK_OCT;
    keys[s->n].algs = SL_JWT_ALGS_HS;
    keys[s->n].secret = secret;
    keys[s->n].secret_len = len;
    s->n++;
    return s;
}

static void *compile(json_t *config, const sl_policy_env_t *env, char *err, size_t errlen)
{
    jwt_t *j = calloc(1, sizeof(*j));
    if (!j) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    j->consumers = env->consumers;
    j->keep_claims = env->jwt_claims;
    const char *h = json_string_value(cfg(config, "header"));
    snprintf(j->header, sizeof(j->header), "%s", h ? h : "Authorization");
    j->header_len = strlen(j->header);
    const char *p = json_string_value(cfg(config, "prefix"));
    if (!p)
        p = strcasecmp(j->header, "Authorization") == 0 ? "Bearer" : "";
    snprintf(j->prefix, sizeof(j->prefix), "%s", p);
    j->prefix_len = strlen(j->prefix);
    const char *ck = json_string_value(cfg(config, "cookie"));
    const char *q = json_string_value(cfg(config, "query"));
    snprintf(j->cookie, sizeof(j->cookie), "%s", ck ? ck : "");
    snprintf(j->query, sizeof(j->query), "%s", q ? q : "");
    if (cfg(config, "jwks") || cfg(config, "secret")) {
        if (!(j->inline_keys = inline_keys(config, err, errlen)))
            goto fail;
    }
    const char *uri = json_string_value(cfg(config, "jwksUri"));
    if (uri) {
        json_t *ttl = cfg(config, "jwksCacheSeconds");
        const char *ca_pem = json_string_value(cfg(config, "jwksCaBundle"));
        const char *ca_file = json_string_value(cfg(config, "jwksCaFile"));
        char why[200];
        if (ca_pem && sl_jwks_ca_pem_check(ca_pem, why, sizeof(why)) != 0) {
            snprintf(err, errlen, "jwksCaBundle: %s", why);
            goto fail;
        }
        if (!env->check_only &&
            !(j->remote = sl_jwks_fetch_new(uri, ttl ? (unsigned)json_integer_value(ttl) : 300,
                                            ca_pem, ca_file))) {
            snprintf(err, errlen, "jwksUri: cannot set up the fetcher (out of memory or pipes)");
            goto fail;
        }
    }
    j->algs = key_algs(config);
    json_t *algs = cfg(config, "algorithms");
    if (algs) {
        unsigned allowed = 0;
        for (size_t i = 0; i < json_array_size(algs); i++) {
            const char *name = json_string_value(json_array_get(algs, i));
            allowed |= SL_JWT_ALG_BIT(sl_jwt_alg_from_name(name, strlen(name)));
        }
        j->algs &= allowed;
    }
    j->issuers = string_list(cfg(config, "issuers"), &j->nissuers);
    j->audiences = string_list(cfg(config, "audiences"), &j->naudiences);
    j->required_claims = string_list(cfg(config, "requiredClaims"),
                                     &j->nrequired_claims);
    j->scopes = string_list(cfg(config, "requiredScopes"), &j->nscopes);
    if (j->nissuers == (size_t)-1 || j->naudiences == (size_t)-1 ||
        j->nrequired_claims == (size_t)-1 || j->nscopes == (size_t)-1) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    json_t *leeway = cfg(config, "leewaySeconds");
    j->leeway_s = leeway ? (long)json_integer_value(leeway) : 30;
    j->consumer_required = json_is_true(cfg(config, "consumerRequired"));
    j->forward_token = !json_is_false(cfg(config, "forwardToken"));
    const char *key;
    json_t *val;
    json_object_foreach(cfg(config, "claimsToHeaders"), key, val)
    {
        claim_header_t *ch = &j->claims[j->nclaims];
        ch->path = strdup(key);
        ch->header = strdup(json_string_value(val));
        j->nclaims++;
        if (!ch->path || !ch->header) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        ch->header_len = strlen(ch->header);
    }
    /* The insufficient_scope challenge names the scopes needed (RFC 6750
     * 3), when they fit the reply header. */
    int w = snprintf(j->scope_challenge, sizeof(j->scope_challenge),
                     "Bearer realm=\"sluice\", error=\"insufficient_scope\", scope=\"");
    for (size_t i = 0; i < j->nscopes; i++)
        w += snprintf(j->scope_challenge + w, sizeof(j->scope_challenge) - (size_t)w, "%s%s",
                      i ? " " : "", j->scopes[i]);
    if ((size_t)w + 2 > sizeof(j->scope_challenge))
        snprintf(j->scope_challenge, sizeof(j->scope_challenge),
                 "Bearer realm=\"sluice\", error=\"insufficient_scope\"");
    else
        strcat(j->scope_challenge, "\"");
    return j;
fail:
    jwt_free(j);
    return NULL;
}

/* ---- claims --------------------------------------------------------------- */

/* Why a token is refused: the HTTP status, and a short description (static
 * text only: it goes into a header and must never quote the token). */
enum refusal {
    R_NONE = 0,  /* accepted */
    R_INVALID,   /* 401 invalid_token */
    R_SCOPE,     /* 403 insufficient_scope */
    R_CONSUMER,  /* 403: consumerRequired and no Consumer has (iss, sub) */
    R_NO_KEYS,   /* 503 jwks_unavailable */
    R_NO_MEMORY, /* 503 overloaded */
};
typedef struct {
    enum refusal status;
    const char *desc;
} verdict_t;

static verdict_t refuse(enum refusal status, const char *desc)
{
    return (verdict_t){status, desc};
}

static int in_list(char *const *l, size_t n, const char *s)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(l[i], s) == 0)
            return 1;
    return 0;
}

/* Whether the token's scopes (scope: "a b", scp: ["a", "b"] or "a b")
 * include want. */
static int has_scope(json_t *payload, const char *want)
{
    const char *names[] = {"scope", "scp"};
    size_t wl = strlen(want);
    for (int n = 0; n < 2; n++) {
        json_t *v = json_object_get(payload, names[n]);
        if (json_is_array(v)) {
            size_t i;
            json_t *e;
            json_array_foreach(v, i, e) if (json_is_string(e) && strcmp(json_string_value(e),
                                                                         want) == 0) return 1;
        } else if (json_is_string(v)) {
            const char *s = json_string_value(v);
            while (*s) {
                while (*s == ' ')
                    s++;
                size_t l = strcspn(s, " ");
                if (l == wl && memcmp(s, want, wl) == 0)
                    return 1;
                s += l;
            }
        }
    }
    return 0;
}

/* The registered time and audience claims, the required ones and scopes,
 * at wall-clock second now. */
static verdict_t check_claims(const jwt_t *j, json_t *payload, double now)
{
    json_t *exp = json_object_get(payload, "exp"), *nbf = json_object_get(payload, "nbf"),
           *iat = json_object_get(payload, "iat");
    if ((exp && !json_is_number(exp)) || (nbf && !json_is_number(nbf)) ||
        (iat && !json_is_number(iat)))
        return refuse(R_INVALID, "exp, nbf and iat must be numbers");
    if (exp && now > json_number_value(exp) + (double)j->leeway_s)
        return refuse(R_INVALID, "the token has expired");
    if (nbf && now + (double)j->leeway_s < json_number_value(nbf))
        return refuse(R_INVALID, "the token is not valid yet");
    if (iat && now + (double)j->leeway_s < json_number_value(iat))
        return refuse(R_INVALID, "the token was issued in the future");
    json_t *iss = json_object_get(payload, "iss");
    if (iss && !json_is_string(iss))
        return refuse(R_INVALID, "iss must be a string");
    if (j->nissuers && (!iss || !in_list(j->issuers, j->nissuers, json_string_value(iss))))
        return refuse(R_INVALID, "the token's issuer is not accepted");
    json_t *sub = json_object_get(payload, "sub");
    if (sub && !json_is_string(sub))
        return refuse(R_INVALID, "sub must be a string");
    if (j->naudiences) {
        json_t *aud = json_object_get(payload, "aud");
        int ok = 0;
        if (json_is_string(aud)) {
            ok = in_list(j->audiences, j->naudiences, json_string_value(aud));
        } else if (json_is_array(aud)) {
            size_t i;
            json_t *e;
            json_array_foreach(aud, i, e) if (json_is_string(e) &&
                                              in_list(j->audiences, j->naudiences,
                                                      json_string_value(e))) ok = 1;
        }
        if (!ok)
            return refuse(R_INVALID, "the token is not meant for this audience");
    }
    for (size_t i = 0; i < j->nrequired_claims; i++)
        if (!json_object_get(payload, j->required_claims[i]))
            return refuse(R_INVALID, "a required claim is missing");
    for (size_t i = 0; i < j->nscopes; i++)
        if (!has_scope(payload, j->scopes[i]))
            return refuse(R_SCOPE, "the token lacks a required scope");
    return refuse(R_NONE, NULL);
}

/* The claim at a dotted path ("org.id"): policy.h. */
static json_t *claim_at(json_t *payload, const char *path)
{
    return sl_policy_claim_at(payload, path, strlen(path));
}

/* A claim as a header value copied into out (cap bytes): its length, or
 * -1 when it has none (sl_policy_claim_text). */
static int claim_value(json_t *v, char *out, size_t cap)
{
    sl_str_t t;
    if (sl_policy_claim_text(v, out, cap, &t) != 0)
        return -1;
    if (t.ptr != out)
        memcpy(out, t.ptr, t.len);
    return (int)t.len;
}

/* ---- the per-worker cache of verified tokens ----------------------------- */

typedef struct {
    uint8_t sha[SHA256_DIGEST_LENGTH];
    uint64_t until_ms; /* wall clock; 0 = empty */
    uint64_t used;
    const sl_consumer_t *consumer;
    json_t *claims; /* the token's claims when kept (jwt_t.keep_claims), a reference */
    char *values;   /* claimsToHeaders values, back to back */
    int32_t off[MAX_CLAIM_HEADERS]; /* -1 = no value: the header is removed */
    uint16_t len[MAX_CLAIM_HEADERS];
} entry_t;

typedef struct {
    uint64_t tick;
    entry_t sets[CACHE_SETS][CACHE_WAYS];
} cache_t;

static void *worker_new(const void *state)
{
    (void)state;
    return calloc(1, sizeof(cache_t));
}

static void worker_free(void *ws)
{
    cache_t *c = ws;
    if (!c)
        return;
    for (size_t s = 0; s < CACHE_SETS; s++)
        for (size_t w = 0; w < CACHE_WAYS; w++) {
            free(c->sets[s][w].values);
            json_decref(c->sets[s][w].claims);
        }
    free(c);
}

static entry_t *cache_find(cache_t *c, const uint8_t *sha, uint64_t now_ms)
{
    entry_t *set = c->sets[sha[0]];
    for (size_t w = 0; w < CACHE_WAYS; w++)
        if (set[w].until_ms > now_ms && memcmp(set[w].sha, sha, SHA256_DIGEST_LENGTH) == 0) {
            set[w].used = ++c->tick;
            return &set[w];
        }
    return NULL;
}

/* The way to overwrite: an expired one, else the least recently used. */
static entry_t *cache_victim(cache_t *c, const uint8_t *sha, uint64_t now_ms)
{
    entry_t *set = c->sets[sha[0]], *v = &set[0];
    for (size_t w = 0; w < CACHE_WAYS; w++) {
        if (set[w].until_ms <= now_ms)
            return &set[w];
        if (set[w].used < v->used)
            v = &set[w];
    }
    return v;
}

/* ---- the request ---------------------------------------------------------- */

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int reply_401(sl_policy_reply_t *reply, const char *desc)
{
    /* The chain hands over the reply as it was left (policy.h does not say
     * it is zeroed): body and content_type must not be stale. */
    memset(reply, 0, sizeof(*reply));
    reply->status = 401;
    reply->code = "unauthorized";
    reply->headers[0].name = "WWW-Authenticate";
    if (desc) {
        snprintf(reply->message, sizeof(reply->message), "invalid token: %s", desc);
        snprintf(reply->headers[0].value, sizeof(reply->headers[0].value),
                 "Bearer realm=\"sluice\", error=\"invalid_token\", error_description=\"%.100s\"",
                 desc);
    } else {
        /* RFC 6750 3.1: a request without credentials gets no error code. */
        snprintf(reply->message, sizeof(reply->message), "a bearer token is required");
        snprintf(reply->headers[0].value, sizeof(reply->headers[0].value),
                 "Bearer realm=\"sluice\"");
    }
    reply->num_headers = 1;
    return SL_POLICY_REPLY;
}

static int reply_status(sl_policy_reply_t *reply, int status, const char *code, const char *msg)
{
    memset(reply, 0, sizeof(*reply));
    reply->status = status;
    reply->code = code;
    snprintf(reply->message, sizeof(reply->message), "%s", msg);
    return SL_POLICY_REPLY;
}

/* The value of the cookie named name among the request's Cookie headers. */
static int find_cookie(const sl_policy_req_t *req, const char *name, sl_str_t *out)
{
    size_t nl = strlen(name);
    for (size_t i = 0; i < req->num_headers; i++) {
        const sl_policy_header_t *h = &req->headers[i];
        if (h->name.len != 6 || strncasecmp(h->name.ptr, "cookie", 6) != 0)
            continue;
        if (sl_cookie_find(h->value.ptr, h->value.len, name, nl, out))
            return 1;
    }
    return 0;
}

enum source { SRC_NONE = 0, SRC_HEADER, SRC_COOKIE, SRC_QUERY };

/* Finds the token; SRC_NONE with *bad set when the request holds a
 * malformed or ambiguous one. */
static enum source find_token(const jwt_t *j, const sl_policy_req_t *req, sl_str_t *tok,
                              const char **bad, size_t *qfrom, size_t *qto)
{
    sl_str_t v = {NULL, 0};
    for (size_t i = 0; i < req->num_headers; i++) {
        const sl_policy_header_t *h = &req->headers[i];
        if (h->name.len == j->header_len && strncasecmp(h->name.ptr, j->header, j->header_len) == 0) {
            if (v.ptr) {
                *bad = "more than one token header";
                return SRC_NONE;
            }
            v = h->value;
        }
    }
    if (v.ptr) {
        if (j->prefix_len) {
            if (v.len <= j->prefix_len || strncasecmp(v.ptr, j->prefix, j->prefix_len) != 0 ||
                v.ptr[j->prefix_len] != ' ') {
                *bad = "the header does not hold a bearer token";
                return SRC_NONE;
            }
            v.ptr += j->prefix_len;
            v.len -= j->prefix_len;
        }
        while (v.len && (*v.ptr == ' ' || *v.ptr == '\t')) {
            v.ptr++;
            v.len--;
        }
        while (v.len && (v.ptr[v.len - 1] == ' ' || v.ptr[v.len - 1] == '\t'))
            v.len--;
        *tok = v;
        return SRC_HEADER;
    }
    if (j->cookie[0] && find_cookie(req, j->cookie, tok))
        return SRC_COOKIE;
    if (j->query[0] && sl_policy_query_param(req->query, j->query, strlen(j->query), tok, qfrom, qto))
        return SRC_QUERY;
    return SRC_NONE;
}

/* A verified token's results, for the request and the cache. */
typedef struct {
    const sl_consumer_t *consumer;
    json_t *claims; /* a reference when kept, else NULL */
    char values[MAX_CLAIM_HEADERS][MAX_CLAIM_VALUE];
    int len[MAX_CLAIM_HEADERS]; /* -1 = absent */
    double exp;                 /* 0 = none */
} accepted_t;

/* Verifies the token's signature and claims. 503 status for "the keys
 * are not there yet". */
static verdict_t verify(const jwt_t *j, sl_str_t tok, double now, accepted_t *out)
{
    const char *d1 = memchr(tok.ptr, '.', tok.len);
    const char *d2 = d1 ? memchr(d1 + 1, '.', tok.len - (size_t)(d1 + 1 - tok.ptr)) : NULL;
    if (!d1 || !d2 || memchr(d2 + 1, '.', tok.len - (size_t)(d2 + 1 - tok.ptr)))
        return refuse(R_INVALID, "not a JWS compact token");
    size_t hlen = (size_t)(d1 - tok.ptr), plen = (size_t)(d2 - d1 - 1),
           slen = tok.len - (size_t)(d2 + 1 - tok.ptr);
    unsigned char *buf = malloc(tok.len + 3);
    if (!buf)
        return refuse(R_NO_MEMORY, "out of memory");
    unsigned char *hbuf = buf, *pbuf = NULL, *sbuf = NULL;
    long hn = sl_jwt_b64url_decode(tok.ptr, hlen, hbuf), pn = -1, sn = -1;
    if (hn > 0) {
        pbuf = hbuf + hn + 1;
        pn = sl_jwt_b64url_decode(d1 + 1, plen, pbuf);
    }
    if (pn > 0) {
        sbuf = pbuf + pn + 1;
        sn = sl_jwt_b64url_decode(d2 + 1, slen, sbuf);
    }
    verdict_t v = refuse(R_NONE, NULL);
    json_t *header = NULL, *payload = NULL;
    if (hn <= 0 || pn <= 0 || sn <= 0) {
        v = refuse(R_INVALID, "the token is not valid base64url");
        goto done;
    }
    header = json_loadb((const char *)hbuf, (size_t)hn, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(header)) {
        v = refuse(R_INVALID, "the token header is not a JSON object");
        goto done;
    }
    json_t *jalg = json_object_get(header, "alg"), *jkid = json_object_get(header, "kid");
    int alg = json_is_string(jalg)
                  ? sl_jwt_alg_from_name(json_string_value(jalg), json_string_length(jalg))
                  : -1;
    if (alg < 0 || !(j->algs & SL_JWT_ALG_BIT(alg))) {
        v = refuse(R_INVALID, "the token's algorithm is not accepted");
        goto done;
    }
    if (json_object_get(header, "crit")) {
        v = refuse(R_INVALID, "critical header extensions are not supported");
        goto done;
    }
    if (jkid && !json_is_string(jkid)) {
        v = refuse(R_INVALID, "kid must be a string");
        goto done;
    }
    const char *kid = jkid ? json_string_value(jkid) : NULL;
    const sl_jwks_t *sets[2] = {j->inline_keys, j->remote ? sl_jwks_fetch_current(j->remote)
                                                          : NULL};
    int candidates = 0, verified = 0, kid_found = 0;
    for (int s = 0; s < 2 && !verified; s++)
        for (size_t i = 0; sets[s] && i < sets[s]->n && !verified; i++) {
            const sl_jwk_t *k = &sets[s]->keys[i];
            if (kid && strcmp(k->kid, kid) != 0)
                continue;
            kid_found = 1;
            if (!(k->algs & SL_JWT_ALG_BIT(alg)))
                continue; /* confusion: the key decides */
            candidates++;
            verified = sl_jwk_verify(k, alg, (const unsigned char *)tok.ptr, (size_t)(d2 - tok.ptr),
                                     sbuf, (size_t)sn);
        }
    if (!verified) {
        if (!candidates && j->remote && !kid_found) {
            sl_jwks_fetch_refresh(j->remote);
            if (!sets[1]) {
                v = refuse(R_NO_KEYS, "the signing keys are not available");
                goto done;
            }
        }
        if (kid && !kid_found)
            v = refuse(R_INVALID, "unknown key id");
        else if (!candidates)
            v = refuse(R_INVALID, "no key can verify the token's algorithm");
        else
            v = refuse(R_INVALID, "the signature is not valid");
        goto done;
    }
    payload = json_loadb((const char *)pbuf, (size_t)pn, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(payload)) {
        v = refuse(R_INVALID, "the token's claims are not a JSON object");
        goto done;
    }
    v = check_claims(j, payload, now);
    if (v.status)
        goto done;
    json_t *iss = json_object_get(payload, "iss"), *sub = json_object_get(payload, "sub");
    out->consumer = NULL;
    if (iss && sub && j->consumers)
        out->consumer = sl_consumers_by_jwt(
            j->consumers, (sl_str_t){json_string_value(iss), json_string_length(iss)},
            (sl_str_t){json_string_value(sub), json_string_length(sub)});
    if (!out->consumer && j->consumer_required) {
        v = refuse(R_CONSUMER, "the token's subject is not a known consumer");
        goto done;
    }
    for (size_t i = 0; i < j->nclaims; i++)
        out->len[i] = claim_value(claim_at(payload, j->claims[i].path), out->values[i],
                                  MAX_CLAIM_VALUE);
    json_t *exp = json_object_get(payload, "exp");
    out->exp = exp ? json_number_value(exp) : 0;
    if (j->keep_claims)
        out->claims = json_incref(payload);
done:
    json_decref(header);
    json_decref(payload);
    free(buf);
    return v;
}

/* The request's claims for later policies (policy.h), taking the
 * reference claims holds (NULL: none kept). */
static void set_claims(sl_policy_req_t *req, json_t *claims)
{
    json_decref(req->jwt_claims);
    req->jwt_claims = claims;
}

static int fail_edit(sl_policy_reply_t *reply)
{
    return reply_status(reply, 500, "policy_error",
                        "too many header edits or header values too large");
}

static int on_request(const void *state, sl_policy_req_t *req, sl_policy_reply_t *reply)
{
    const jwt_t *j = state;
    if (j->remote)
        sl_jwks_fetch_start(j->remote);
    sl_str_t tok = {NULL, 0};
    const char *bad = NULL;
    size_t qfrom = 0, qto = 0;
    enum source src = find_token(j, req, &tok, &bad, &qfrom, &qto);
    if (src == SRC_NONE)
        return reply_401(reply, bad);
    if (tok.len == 0)
        return reply_401(reply, NULL);
    if (tok.len > MAX_TOKEN)
        return reply_401(reply, "the token is too large");

    uint64_t now_ms = wall_ms();
    uint8_t sha[SHA256_DIGEST_LENGTH];
    /* Without the token's hash there is no cache: verify it every time. */
    cache_t *cache = sl_policy_sha256(tok.ptr, tok.len, sha) == 0 ? req->worker_state : NULL;
    entry_t *e = cache ? cache_find(cache, sha, now_ms) : NULL;
    const sl_consumer_t *consumer;
    if (e) {
        consumer = e->consumer;
    } else {
        accepted_t *acc = malloc(sizeof(*acc));
        if (!acc)
            return reply_status(reply, 503, "overloaded", "out of memory");
        acc->claims = NULL;
        verdict_t v = verify(j, tok, (double)now_ms / 1000.0, acc);
        if (v.status != R_NONE)
            free(acc);
        switch (v.status) {
        case R_NONE:
            break;
        case R_NO_MEMORY:
            return reply_status(reply, 503, "overloaded", "out of memory");
        case R_NO_KEYS:
            reply_status(reply, 503, "jwks_unavailable",
                         "the signing keys are not available yet; retry later");
            reply->headers[0].name = "Retry-After";
            snprintf(reply->headers[0].value, sizeof(reply->headers[0].value), "5");
            reply->num_headers = 1;
            return SL_POLICY_REPLY;
        case R_CONSUMER:
            return reply_status(reply, 403, "forbidden", v.desc);
        case R_SCOPE:
            reply_status(reply, 403, "forbidden", v.desc);
            reply->headers[0].name = "WWW-Authenticate";
            snprintf(reply->headers[0].value, sizeof(reply->headers[0].value), "%s",
                     j->scope_challenge);
            reply->num_headers = 1;
            return SL_POLICY_REPLY;
        case R_INVALID:
            return reply_401(reply, v.desc);
        }
        consumer = acc->consumer;
        if (cache) {
            /* Cached until exp (with the leeway the claims check granted),
             * never longer than CACHE_MAX_MS: a key removed from the JWKS
             * stops working within that bound. */
            uint64_t until = now_ms + CACHE_MAX_MS;
            if (acc->exp > 0) {
                double ex = (acc->exp + (double)j->leeway_s) * 1000.0;
                if (ex < (double)until)
                    until = (uint64_t)ex;
            }
            size_t total = 0;
            for (size_t i = 0; i < j->nclaims; i++)
                total += acc->len[i] > 0 ? (size_t)acc->len[i] : 0;
            char *values = malloc(total + 1);
            if (values && until > now_ms) {
                e = cache_victim(cache, sha, now_ms);
                free(e->values);
                json_decref(e->claims);
                e->claims = json_incref(acc->claims);
                memcpy(e->sha, sha, sizeof(sha));
                e->until_ms = until;
                e->used = ++cache->tick;
                e->consumer = consumer;
                e->values = values;
                size_t off = 0;
                for (size_t i = 0; i < j->nclaims; i++) {
                    e->off[i] = acc->len[i] < 0 ? -1 : (int32_t)off;
                    e->len[i] = acc->len[i] < 0 ? 0 : (uint16_t)acc->len[i];
                    if (acc->len[i] > 0)
                        memcpy(values + off, acc->values[i], (size_t)acc->len[i]);
                    off += e->len[i];
                }
            } else {
                free(values);
            }
        }
        if (!e) {
            /* No cache entry (no memory): apply from acc directly. */
            for (size_t i = 0; i < j->nclaims; i++) {
                const claim_header_t *ch = &j->claims[i];
                int rc;
                if (acc->len[i] < 0) {
                    rc = sl_policy_edit(req, 0, SL_HDR_REMOVE, ch->header, ch->header_len, NULL, 0);
                } else {
                    char *v = sl_policy_alloc(req, (size_t)acc->len[i] + 1);
                    if (v)
                        memcpy(v, acc->values[i], (size_t)acc->len[i]);
                    rc = v ? sl_policy_edit(req, 0, SL_HDR_SET, ch->header, ch->header_len, v,
                                            (size_t)acc->len[i])
                           : -1;
                }
                if (rc != 0) {
                    json_decref(acc->claims);
                    free(acc);
                    return fail_edit(reply);
                }
            }
            set_claims(req, acc->claims); /* the request takes acc's reference */
            free(acc);
            goto consumer;
        }
        json_decref(acc->claims);
        free(acc);
    }
    set_claims(req, json_incref(e->claims));
    /* The claims' headers, from the cache entry (copied: the entry may be
     * replaced by this worker's next request while this one is upstream). */
    for (size_t i = 0; i < j->nclaims; i++) {
        const claim_header_t *ch = &j->claims[i];
        int rc;
        if (e->off[i] < 0) {
            rc = sl_policy_edit(req, 0, SL_HDR_REMOVE, ch->header, ch->header_len, NULL, 0);
        } else {
            char *v = sl_policy_alloc(req, (size_t)e->len[i] + 1);
            if (v)
                memcpy(v, e->values + e->off[i], e->len[i]);
            rc = v ? sl_policy_edit(req, 0, SL_HDR_SET, ch->header, ch->header_len, v, e->len[i])
                   : -1;
        }
        if (rc != 0)
            return fail_edit(reply);
    }
consumer:
    if (consumer) {
        req->consumer.name = consumer->name;
        req->consumer.group = consumer->group;
        req->consumer.credential = NULL;
    }
    if (j->forward_token)
        return SL_POLICY_CONTINUE;
    if (src == SRC_HEADER) {
        if (sl_policy_edit(req, 0, SL_HDR_REMOVE, j->header, j->header_len, NULL, 0) != 0)
            return fail_edit(reply);
    } else if (src == SRC_QUERY) {
        if (sl_policy_query_remove(req, qfrom, qto) != 0)
            return fail_edit(reply);
    }
    return SL_POLICY_CONTINUE;
}

/* Inline JWKs may carry secret material (RFC 7518 § 6: an oct key's "k",
 * the private members of RSA, EC and OKP keys): the public parts stay
 * visible, so /config_dump still shows which keys are configured. */
static void redact(json_t *config)
{
    static const char *const private_members[] = {"k", "d", "p", "q", "dp", "dq", "qi", "oth",
                                                  NULL};
    json_t *keys = json_object_get(json_object_get(config, "jwks"), "keys");
    size_t i;
    json_t *key;
    json_array_foreach(keys, i, key)
    {
        for (size_t m = 0; private_members[m]; m++)
            if (json_object_get(key, private_members[m]))
                json_object_set_new(key, private_members[m], json_string("[redacted]"));
    }
}

const sl_policy_def_t sl_policy_jwt = {
    .name = "jwt",
    .phase = SL_PHASE_AUTHN,
    .schema = &schema,
    .compile = compile,
    .free = jwt_free,
    .on_request = on_request,
    .worker_new = worker_new,
    .worker_free = worker_free,
    .redact = redact,
};
