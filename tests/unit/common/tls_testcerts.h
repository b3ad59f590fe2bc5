/*
 * Certificates made at test time with the OpenSSL API, for the tests of
 * common/tls_pem.c, the validator, the compiler, the controller's REST views
 * and runtime/net/tls.c. Nothing here is a fixture file: every key is fresh,
 * so no test depends on a date that will pass.
 *
 * Header-only (static functions) so each test binary includes it directly.
 */
#ifndef SL_TEST_TLS_TESTCERTS_H
#define SL_TEST_TLS_TESTCERTS_H

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { TC_RSA2048, TC_RSA1024, TC_EC256, TC_EC384, TC_EC521, TC_ED25519 } tc_key_t;

typedef struct {
    X509 *x;
    EVP_PKEY *k;
    char *cert_pem; /* the certificate alone */
    char *key_pem;  /* PKCS#8 */
} tc_pair_t;

static EVP_PKEY *tc_key(tc_key_t t)
{
    switch (t) {
    case TC_RSA2048:
        return EVP_RSA_gen(2048);
    case TC_RSA1024:
        return EVP_RSA_gen(1024);
    case TC_EC256:
        return EVP_EC_gen("P-256");
    case TC_EC384:
        return EVP_EC_gen("P-384");
    case TC_EC521:
        return EVP_EC_gen("P-521");
    case TC_ED25519:
        return EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    }
    return NULL;
}

static char *tc_bio_text(BIO *b)
{
    char *p;
    long n = BIO_get_mem_data(b, &p);
    char *s = malloc((size_t)n + 1);
    memcpy(s, p, (size_t)n);
    s[n] = '\0';
    BIO_free(b);
    return s;
}

static void tc_add_ext(X509 *x, X509 *issuer, int nid, const char *value)
{
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer, x, NULL, NULL, 0);
    X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    if (!e)
        abort();
    X509_add_ext(x, e, -1);
    X509_EXTENSION_free(e);
}

/*
 * A certificate for `cn` with the DNS SANs of `sans` ("a.example,*.b.example",
 * or NULL for none), valid from now+from_s to now+to_s, signed by `issuer`
 * (NULL: self-signed). is_ca marks a CA (basicConstraints CA:TRUE).
 */
static void tc_make(tc_pair_t *out, tc_key_t type, const char *cn, const char *sans, long from_s,
                    long to_s, const tc_pair_t *issuer, bool is_ca)
{
    static long serial = 1000;
    memset(out, 0, sizeof(*out));
    out->k = tc_key(type);
    if (!out->k)
        abort();
    X509 *x = X509_new();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), serial++);
    X509_gmtime_adj(X509_getm_notBefore(x), from_s);
    X509_gmtime_adj(X509_getm_notAfter(x), to_s);
    X509_set_pubkey(x, out->k);
    X509_NAME *name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
    X509 *iss = issuer ? issuer->x : x;
    X509_set_issuer_name(x, X509_get_subject_name(iss));
    if (sans) {
        char buf[1024] = "";
        char *copy = strdup(sans), *save = NULL;
        for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (buf[0])
                strcat(buf, ",");
            strcat(buf, "DNS:");
            strcat(buf, t);
        }
        free(copy);
        tc_add_ext(x, iss, NID_subject_alt_name, buf);
    }
    tc_add_ext(x, iss, NID_basic_constraints, is_ca ? "critical,CA:TRUE" : "CA:FALSE");
    if (is_ca)
        tc_add_ext(x, iss, NID_key_usage, "critical,keyCertSign,cRLSign,digitalSignature");
    tc_add_ext(x, iss, NID_subject_key_identifier, "hash");
    if (issuer)
        tc_add_ext(x, iss, NID_authority_key_identifier, "keyid:always");
    EVP_PKEY *signer = issuer ? issuer->k : out->k;
    int base = EVP_PKEY_get_base_id(signer);
    const EVP_MD *md = base == EVP_PKEY_ED25519 ? NULL : EVP_sha256();
    if (!X509_sign(x, signer, md))
        abort();
    out->x = x;
    BIO *b = BIO_new(BIO_s_mem());
    PEM_write_bio_X509(b, x);
    out->cert_pem = tc_bio_text(b);
    b = BIO_new(BIO_s_mem());
    PEM_write_bio_PrivateKey(b, out->k, NULL, NULL, 0, NULL, NULL);
    out->key_pem = tc_bio_text(b);
}

static void tc_free(tc_pair_t *p)
{
    X509_free(p->x);
    EVP_PKEY_free(p->k);
    free(p->cert_pem);
    free(p->key_pem);
    memset(p, 0, sizeof(*p));
}

/* `text` with every line indented by `indent` spaces, for YAML block
 * scalars. Caller frees. */
static __attribute__((unused)) char *tc_indent(const char *text, int indent)
{
    size_t lines = 1;
    for (const char *p = text; *p; p++)
        lines += *p == '\n';
    char *out = malloc(strlen(text) + lines * (size_t)indent + 1);
    char *o = out;
    bool bol = true;
    for (const char *p = text; *p; p++) {
        if (bol && *p != '\n')
            for (int i = 0; i < indent; i++)
                *o++ = ' ';
        *o++ = *p;
        bol = *p == '\n';
    }
    *o = '\0';
    return out;
}

/* A Certificate document (YAML) for name with the pair inline. Caller frees. */
static __attribute__((unused)) char *tc_certificate_doc(const char *name, const char *cert_pem,
                                                        const char *key_pem)
{
    char *c = tc_indent(cert_pem, 4), *k = tc_indent(key_pem, 4);
    char *doc = NULL;
    if (asprintf(&doc,
                 "apiVersion: gateway.sluice.dev/v1alpha1\nkind: Certificate\n"
                 "metadata: {name: %s}\nspec:\n  certificate: |\n%s  privateKey: |\n%s",
                 name, c, k) < 0)
        abort();
    free(c);
    free(k);
    return doc;
}

#endif
