/*
 * PEM chain and key parsing and the listener checks (tls_pem.h says which).
 *
 * Parsing goes through memory BIOs bounded by the caller's lengths, with a
 * password callback that refuses: an encrypted key is an error, never a
 * prompt on the controller's terminal. Every return path clears OpenSSL's
 * per-thread error queue, because a queued error could carry a fragment of
 * the input into a later, unrelated log line.
 */
#include "tls_pem.h"

#include <ctype.h>
#include <openssl/bio.h>
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *sl_pem_key_type_name(sl_pem_key_type_t t)
{
    switch (t) {
    case SL_PEM_KEY_RSA:
        return "RSA";
    case SL_PEM_KEY_EC_P256:
        return "ECDSA P-256";
    case SL_PEM_KEY_EC_P384:
        return "ECDSA P-384";
    case SL_PEM_KEY_ED25519:
        return "Ed25519";
    default:
        return "unsupported";
    }
}

const char *sl_pem_field_name(sl_pem_field_t f)
{
    return f == SL_PEM_FIELD_PRIVATE_KEY ? "privateKey" : "certificate";
}

void sl_pem_format_time(int64_t unix_s, char *buf, size_t len)
{
    time_t t = (time_t)unix_s;
    struct tm tm;
    if (!gmtime_r(&t, &tm) || strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        snprintf(buf, len, "@%lld", (long long)unix_s);
}

static int refuse_password(char *buf, int size, int rwflag, void *u)
{
    (void)buf;
    (void)size;
    (void)rwflag;
    *(bool *)u = true;
    return -1;
}

static bool contains(const char *s, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(s + i, needle, k) == 0)
            return true;
    return false;
}

static int64_t asn1_time_unix(const ASN1_TIME *t)
{
    struct tm tm;
    if (!t || !ASN1_TIME_to_tm(t, &tm))
        return 0;
    return (int64_t)timegm(&tm);
}

/* RFC 2253 with every control and non-ASCII byte escaped, so the result is
 * safe in a log line or an HTTP header value. */
static char *name_text(const X509_NAME *name)
{
    BIO *b = BIO_new(BIO_s_mem());
    if (!b)
        return NULL;
    char *out = NULL;
    if (X509_NAME_print_ex(b, name, 0, XN_FLAG_RFC2253) >= 0) {
        char *p;
        long n = BIO_get_mem_data(b, &p);
        out = malloc((size_t)n + 1);
        if (out) {
            memcpy(out, p, (size_t)n);
            out[n] = '\0';
        }
    }
    BIO_free(b);
    return out;
}

/* A DNS name as a certificate may hold it ("*.example.com" allowed), in lower
 * case; anything else (IDNA U-labels, spaces, NULs) is skipped: SNI carries
 * A-labels only, so such a name could never be matched. */
static char *dns_name(const unsigned char *s, int n)
{
    if (n <= 0 || n > 253)
        return NULL;
    char *d = malloc((size_t)n + 1);
    if (!d)
        return NULL;
    for (int i = 0; i < n; i++) {
        unsigned char ch = s[i];
        if (!(isalnum(ch) || ch == '-' || ch == '.' || (ch == '*' && i == 0))) {
            free(d);
            return NULL;
        }
        d[i] = (char)tolower(ch);
    }
    d[n] = '\0';
    return d;
}

static int add_name(sl_pem_cert_t *c, char *name)
{
    if (!name)
        return 0;
    for (size_t i = 0; i < c->n_names; i++) {
        if (strcmp(c->names[i], name) == 0) {
            free(name);
            return 0;
        }
    }
    if (c->n_names == SL_PEM_MAX_NAMES) {
        free(name);
        return -1;
    }
    char **n = realloc(c->names, (c->n_names + 1) * sizeof(*n));
    if (!n) {
        free(name);
        return -1;
    }
    c->names = n;
    c->names[c->n_names++] = name;
    return 0;
}

static int collect_names(sl_pem_cert_t *c)
{
    GENERAL_NAMES *sans = X509_get_ext_d2i(c->leaf, NID_subject_alt_name, NULL, NULL);
    int rc = 0;
    for (int i = 0; sans && i < sk_GENERAL_NAME_num(sans) && rc == 0; i++) {
        const GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, i);
        if (g->type == GEN_DNS)
            rc = add_name(
                c, dns_name(ASN1_STRING_get0_data(g->d.dNSName), ASN1_STRING_length(g->d.dNSName)));
    }
    GENERAL_NAMES_free(sans);
    if (rc == 0 && c->n_names == 0) {
        /* No DNS SAN: the CN, as clients did before RFC 6125 (and as
         * nginx's and HAProxy's SNI selection still do). */
        const X509_NAME *subj = X509_get_subject_name(c->leaf);
        int idx = X509_NAME_get_index_by_NID(subj, NID_commonName, -1);
        if (idx >= 0) {
            const ASN1_STRING *cn = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subj, idx));
            rc = add_name(c, dns_name(ASN1_STRING_get0_data(cn), ASN1_STRING_length(cn)));
        }
    }
    return rc;
}

static sl_pem_key_type_t key_type_of(EVP_PKEY *pk, int *bits)
{
    *bits = EVP_PKEY_get_bits(pk);
    switch (EVP_PKEY_get_base_id(pk)) {
    case EVP_PKEY_RSA:
        return SL_PEM_KEY_RSA;
    case EVP_PKEY_ED25519:
        return SL_PEM_KEY_ED25519;
    case EVP_PKEY_EC: {
        char group[64];
        size_t glen = 0;
        if (!EVP_PKEY_get_utf8_string_param(pk, OSSL_PKEY_PARAM_GROUP_NAME, group, sizeof(group),
                                            &glen))
            return SL_PEM_KEY_UNSUPPORTED;
        if (strcmp(group, "prime256v1") == 0 || strcmp(group, "P-256") == 0)
            return SL_PEM_KEY_EC_P256;
        if (strcmp(group, "secp384r1") == 0 || strcmp(group, "P-384") == 0)
            return SL_PEM_KEY_EC_P384;
        return SL_PEM_KEY_UNSUPPORTED;
    }
    default:
        return SL_PEM_KEY_UNSUPPORTED;
    }
}

void sl_pem_free(sl_pem_cert_t *c)
{
    if (!c)
        return;
    X509_free(c->leaf);
    sk_X509_pop_free(c->chain, X509_free);
    EVP_PKEY_free(c->key);
    free(c->subject);
    free(c->issuer);
    for (size_t i = 0; i < c->n_names; i++)
        free(c->names[i]);
    free(c->names);
    memset(c, 0, sizeof(*c));
}

#define FAIL(f, ...)                                                                               \
    do {                                                                                           \
        *field = (f);                                                                              \
        snprintf(err, errlen, __VA_ARGS__);                                                        \
        goto fail;                                                                                 \
    } while (0)

static int load_chain(sl_pem_cert_t *c, const char *pem, size_t len, sl_pem_field_t *field,
                      char *err, size_t errlen)
{
    /* PEM readers skip blocks of other types, so a key pasted into the
     * certificate field would be stored and shown by every GET. */
    if (contains(pem, len, "PRIVATE KEY-----"))
        FAIL(SL_PEM_FIELD_CERTIFICATE,
             "contains a private key block; put the key in privateKey and only certificates "
             "here");
    BIO *b = BIO_new_mem_buf(pem, (int)len);
    if (!b)
        FAIL(SL_PEM_FIELD_CERTIFICATE, "out of memory");
    c->chain = sk_X509_new_null();
    bool pw = false;
    for (int n = 0;; n++) {
        ERR_clear_error();
        X509 *x = PEM_read_bio_X509(b, NULL, refuse_password, &pw);
        if (!x) {
            unsigned long e = ERR_peek_last_error();
            bool at_end = ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE;
            if (at_end && n > 0)
                break;
            BIO_free(b);
            if (n == 0 && at_end)
                FAIL(SL_PEM_FIELD_CERTIFICATE,
                     "no PEM certificate found (expected -----BEGIN CERTIFICATE-----)");
            FAIL(SL_PEM_FIELD_CERTIFICATE,
                 "certificate %d of the chain does not parse (bad base64 or DER)", n + 1);
        }
        if (n >= SL_PEM_MAX_CHAIN) {
            X509_free(x);
            BIO_free(b);
            FAIL(SL_PEM_FIELD_CERTIFICATE, "more than %d certificates in the chain",
                 SL_PEM_MAX_CHAIN);
        }
        if (n == 0) {
            c->leaf = x;
        } else if (!c->chain || !sk_X509_push(c->chain, x)) {
            X509_free(x);
            BIO_free(b);
            FAIL(SL_PEM_FIELD_CERTIFICATE, "out of memory");
        }
    }
    BIO_free(b);
    if (!c->chain)
        FAIL(SL_PEM_FIELD_CERTIFICATE, "out of memory");
    /* Leaf first, then each issuer: the order TLS sends them in (RFC 8446
     * 4.4.2); a reversed bundle is the most common paste error. */
    X509 *child = c->leaf;
    for (int i = 0; i < sk_X509_num(c->chain); i++) {
        X509 *parent = sk_X509_value(c->chain, i);
        if (X509_check_issued(parent, child) != X509_V_OK)
            FAIL(SL_PEM_FIELD_CERTIFICATE,
                 "certificate %d of the chain did not issue certificate %d: put the leaf first, "
                 "then its issuer, then the issuer's issuer",
                 i + 2, i + 1);
        child = parent;
    }
    return 0;
fail:
    return -1;
}

int sl_pem_load(sl_pem_cert_t *out, const char *chain_pem, size_t chain_len, const char *key_pem,
                size_t key_len, unsigned flags, int64_t now_unix, sl_pem_field_t *field, char *err,
                size_t errlen)
{
    sl_pem_cert_t c;
    memset(&c, 0, sizeof(c));
    memset(out, 0, sizeof(*out));
    *field = SL_PEM_FIELD_CERTIFICATE;
    if (errlen)
        err[0] = '\0';
    if (chain_len > SL_PEM_MAX_BYTES)
        FAIL(SL_PEM_FIELD_CERTIFICATE, "longer than %d bytes", SL_PEM_MAX_BYTES);
    if (key_pem && key_len > SL_PEM_MAX_BYTES)
        FAIL(SL_PEM_FIELD_PRIVATE_KEY, "longer than %d bytes", SL_PEM_MAX_BYTES);
    if (load_chain(&c, chain_pem, chain_len, field, err, errlen) != 0)
        goto fail;

    EVP_PKEY *pub = X509_get0_pubkey(c.leaf);
    if (!pub)
        FAIL(SL_PEM_FIELD_CERTIFICATE, "the leaf certificate's public key does not parse");
    c.key_type = key_type_of(pub, &c.key_bits);
    if (c.key_type == SL_PEM_KEY_UNSUPPORTED)
        FAIL(SL_PEM_FIELD_CERTIFICATE,
             "unsupported key type (%s); use RSA of at least 2048 bits, ECDSA P-256 or P-384, "
             "or Ed25519",
             OBJ_nid2sn(EVP_PKEY_get_base_id(pub)));
    if (c.key_type == SL_PEM_KEY_RSA && (c.key_bits < 2048 || c.key_bits > 8192))
        FAIL(SL_PEM_FIELD_CERTIFICATE,
             "RSA key of %d bits; use 2048 to 8192 bits (2048 or 3072 is usual)", c.key_bits);

    c.not_before_unix = asn1_time_unix(X509_get0_notBefore(c.leaf));
    c.not_after_unix = asn1_time_unix(X509_get0_notAfter(c.leaf));
    if (flags & SL_PEM_CHECK_VALIDITY) {
        char when[32];
        if (now_unix > c.not_after_unix) {
            sl_pem_format_time(c.not_after_unix, when, sizeof(when));
            FAIL(SL_PEM_FIELD_CERTIFICATE, "the certificate expired at %s (notAfter); renew it",
                 when);
        }
        if (now_unix < c.not_before_unix) {
            sl_pem_format_time(c.not_before_unix, when, sizeof(when));
            FAIL(SL_PEM_FIELD_CERTIFICATE,
                 "the certificate is not valid before %s (notBefore); check the issuer's and "
                 "this machine's clock",
                 when);
        }
    }

    if (key_pem) {
        if (!contains(key_pem, key_len, "PRIVATE KEY-----"))
            FAIL(SL_PEM_FIELD_PRIVATE_KEY,
                 "no PEM private key found (expected -----BEGIN PRIVATE KEY-----)");
        BIO *b = BIO_new_mem_buf(key_pem, (int)key_len);
        bool encrypted = false;
        ERR_clear_error();
        c.key = b ? PEM_read_bio_PrivateKey(b, NULL, refuse_password, &encrypted) : NULL;
        BIO_free(b);
        if (!c.key && encrypted)
            FAIL(SL_PEM_FIELD_PRIVATE_KEY,
                 "the key is encrypted; store it decrypted (openssl pkey -in key.pem -out "
                 "plain.pem) and protect it with file permissions or a Secret");
        if (!c.key)
            FAIL(SL_PEM_FIELD_PRIVATE_KEY, "the private key does not parse (bad base64 or DER)");
        ERR_clear_error();
        if (X509_check_private_key(c.leaf, c.key) != 1)
            FAIL(SL_PEM_FIELD_PRIVATE_KEY,
                 "the private key does not match the certificate; use the key the certificate "
                 "was issued for (openssl x509 -noout -pubkey and openssl pkey -pubout must "
                 "print the same key)");
    }

    unsigned char md[32];
    unsigned int mdlen = 0;
    if (!X509_digest(c.leaf, EVP_sha256(), md, &mdlen) || mdlen != 32)
        FAIL(SL_PEM_FIELD_CERTIFICATE, "cannot compute the certificate's SHA-256 fingerprint");
    for (unsigned i = 0; i < 32; i++)
        snprintf(c.sha256_hex + 2 * i, 3, "%02x", md[i]);
    c.subject = name_text(X509_get_subject_name(c.leaf));
    c.issuer = name_text(X509_get_issuer_name(c.leaf));
    if (!c.subject || !c.issuer)
        FAIL(SL_PEM_FIELD_CERTIFICATE, "out of memory");
    if (collect_names(&c) != 0)
        FAIL(SL_PEM_FIELD_CERTIFICATE, "more than %d DNS names (or out of memory)",
             SL_PEM_MAX_NAMES);
    if (c.n_names == 0)
        FAIL(SL_PEM_FIELD_CERTIFICATE,
             "the certificate names no host: no DNS subjectAltName and no usable common name");
    ERR_clear_error();
    *out = c;
    return 0;
fail:
    ERR_clear_error();
    sl_pem_free(&c);
    return -1;
}

/* CA certificates (tls_pem.h). */
int sl_pem_ca_load(X509_STORE *store, const char *pem, char *err, size_t errlen)
{
    ERR_clear_error();
    BIO *bio = BIO_new_mem_buf(pem, -1);
    if (!bio) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int n = 0;
    for (;;) {
        X509 *x = PEM_read_bio_X509(bio, NULL, NULL, NULL);
        if (!x) {
            unsigned long e = ERR_peek_last_error();
            /* The end of the text is "no start line": anything else is a
             * certificate that does not parse. */
            if (ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE && n > 0)
                break;
            const char *r = ERR_reason_error_string(ERR_peek_error());
            snprintf(err, errlen, "certificate %d does not parse: %s", n + 1,
                     n == 0 && ERR_GET_REASON(e) == PEM_R_NO_START_LINE ? "no PEM certificate found"
                     : r                                                ? r
                                                                        : "unknown error");
            BIO_free(bio);
            ERR_clear_error();
            return -1;
        }
        int ok = !store || X509_STORE_add_cert(store, x) == 1 ||
                 ERR_GET_REASON(ERR_peek_last_error()) == X509_R_CERT_ALREADY_IN_HASH_TABLE;
        X509_free(x);
        if (!ok) {
            const char *r = ERR_reason_error_string(ERR_peek_last_error());
            snprintf(err, errlen, "certificate %d cannot be used: %s", n + 1,
                     r ? r : "unknown error");
            BIO_free(bio);
            ERR_clear_error();
            return -1;
        }
        n++;
    }
    BIO_free(bio);
    ERR_clear_error();
    return n;
}
