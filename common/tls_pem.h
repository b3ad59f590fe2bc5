/*
 * PEM certificates and private keys for TLS listeners: parsing a chain and a
 * key, checking them the way a listener needs them, and the facts people and
 * the runtime read from a certificate (DNS names, validity, SHA-256
 * fingerprint, subject, issuer, key type).
 *
 * Shared by the validator (a Certificate's spec.certificate and
 * spec.privateKey), the compiler (the snapshot's TlsCertificate fields), the
 * controller (the computed status of a Certificate) and the runtime
 * (runtime/net/tls.c loads what this file parsed into its SSL_CTXs).
 *
 * Checks (sl_pem_load): the chain parses and holds no private key, leaf
 * first and each certificate issued by the next one; the key parses, is not
 * encrypted, and matches the leaf; the leaf's key is RSA of 2048..8192 bits,
 * ECDSA P-256 or P-384, or Ed25519; with SL_PEM_CHECK_VALIDITY the leaf is
 * valid at the given time. Chain verification against trust anchors is not
 * done: a listener serves what it is given, clients verify.
 *
 * Not here: SSL_CTX, SNI, connections (runtime/net/tls.c); reading files
 * (callers read them, so this code never opens a path).
 *
 * Key material: no error message quotes the input; OpenSSL's error queue is
 * cleared before returning, so no later log line can carry a fragment of it.
 */
#ifndef SL_TLS_PEM_H
#define SL_TLS_PEM_H

#include <openssl/evp.h>
#include <openssl/x509.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bounds, documented in docs/configuration.md: a chain of more than 10
 * certificates or a leaf with more than 100 DNS names is refused. */
#define SL_PEM_MAX_BYTES (1024 * 1024)
#define SL_PEM_MAX_CHAIN 10
#define SL_PEM_MAX_NAMES 100

/* Which input an error is about; callers turn it into a field path. */
typedef enum {
    SL_PEM_FIELD_CERTIFICATE = 0, /* the chain: spec.certificate */
    SL_PEM_FIELD_PRIVATE_KEY,     /* spec.privateKey */
} sl_pem_field_t;

typedef enum {
    SL_PEM_KEY_UNSUPPORTED = 0,
    SL_PEM_KEY_RSA,
    SL_PEM_KEY_EC_P256,
    SL_PEM_KEY_EC_P384,
    SL_PEM_KEY_ED25519,
} sl_pem_key_type_t;

#define SL_PEM_CHECK_VALIDITY 1u /* refuse a leaf that is expired or not yet valid */

typedef struct {
    X509 *leaf;
    STACK_OF(X509) * chain;     /* the certificates after the leaf, in order; may be empty */
    EVP_PKEY *key;              /* NULL when loaded without a key */
    sl_pem_key_type_t key_type; /* of the leaf's public key */
    int key_bits;
    int64_t not_before_unix, not_after_unix;
    char sha256_hex[65]; /* lower-case hex of SHA-256 over the leaf's DER */
    char *subject;       /* RFC 2253, control and non-ASCII bytes escaped */
    char *issuer;
    char **names; /* DNS names in lower case: the dNSName SANs, else the CN */
    size_t n_names;
} sl_pem_cert_t;

/*
 * Parses and checks a chain (and a key when key_pem is not NULL). Lengths
 * are explicit: the texts need not be NUL-terminated. On success fills *out
 * (release with sl_pem_free) and returns 0. On failure returns -1, leaves
 * *out empty (nothing to free), sets *field and writes a message for a
 * person into err ("the private key does not match the certificate ...",
 * never key bytes).
 */
int sl_pem_load(sl_pem_cert_t *out, const char *chain_pem, size_t chain_len, const char *key_pem,
                size_t key_len, unsigned flags, int64_t now_unix, sl_pem_field_t *field, char *err,
                size_t errlen);

void sl_pem_free(sl_pem_cert_t *c);

/* "RSA", "ECDSA P-256", "ECDSA P-384", "Ed25519" or "unsupported". */
const char *sl_pem_key_type_name(sl_pem_key_type_t t);

/* The field of a Certificate's spec an error is about: "certificate" or
 * "privateKey". */
const char *sl_pem_field_name(sl_pem_field_t f);

/* ISO 8601 UTC ("2026-12-01T20:00:00Z") into buf (at least 21 bytes). */
void sl_pem_format_time(int64_t unix_s, char *buf, size_t len);

/* Loads every certificate of a PEM text (trust anchors: a caBundle) into
 * store (NULL: only parses and counts them). The number loaded, or -1 with
 * the reason in err ("certificate 2 does not parse: ..."). Shared by the jwt
 * policy's JWKS client and the traffic log's https sinks. */
int sl_pem_ca_load(X509_STORE *store, const char *pem, char *err, size_t errlen);

#endif
