/*
 * libFuzzer driver: the certificate/PEM loader (common/tls_pem.c), which
 * reads what a REST client posts as a Certificate and what a runtime reads
 * from its certificate files.
 *
 * Input: byte 0 flags (bit 0: check validity now, bit 1: no key), bytes 1-2
 * the length of the chain text (little endian, clamped), then the chain text
 * and, after it, the key text. Both are handed over as exact-size copies, so
 * ASan sees any read past them (they are not NUL-terminated).
 *
 * Invariants (abort() on violation):
 *  - 0: a leaf, a key unless none was given, 1..SL_PEM_MAX_NAMES names in
 *    lower case of [a-z0-9.-] with '*' only as a first label, a 64-digit hex
 *    fingerprint, printable-ASCII subject and issuer, a supported key type,
 *    notBefore <= now <= notAfter when validity was asked for;
 *  - -1: a non-empty message that names no key material (no run of 24
 *    base64 characters), the output struct left empty;
 *  - either way OpenSSL's error queue is empty afterwards, and a second call
 *    gives the same answer.
 */
#include "fuzz_util.h"
#include "tls_pem.h"

#include <ctype.h>
#include <openssl/err.h>
#include <time.h>

static int64_t now_unix;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* One clock per process: a replayed input gives the same verdict for as
     * long as its certificate's validity window holds. */
    now_unix = (int64_t)time(NULL);
    return 0;
}

static bool printable(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
            return false;
    return true;
}

static bool base64_run(const char *s, size_t min)
{
    size_t run = 0;
    for (; *s; s++) {
        run = (isalnum((unsigned char)*s) || *s == '+' || *s == '/' || *s == '=') ? run + 1 : 0;
        if (run >= min)
            return true;
    }
    return false;
}

static void check_ok(const sl_pem_cert_t *c, bool want_key, unsigned flags)
{
    FUZZ_CHECK(c->leaf != NULL, "no leaf");
    FUZZ_CHECK(c->chain != NULL, "no chain stack");
    FUZZ_CHECK(!want_key || c->key != NULL, "no key");
    FUZZ_CHECK(c->key_type != SL_PEM_KEY_UNSUPPORTED, "unsupported key type accepted");
    FUZZ_CHECK(c->n_names >= 1 && c->n_names <= SL_PEM_MAX_NAMES, "%zu names", c->n_names);
    for (size_t i = 0; i < c->n_names; i++) {
        const char *n = c->names[i];
        FUZZ_CHECK(n[0] != '\0', "empty name");
        for (size_t k = 0; n[k]; k++)
            FUZZ_CHECK(islower((unsigned char)n[k]) || isdigit((unsigned char)n[k]) ||
                           n[k] == '.' || n[k] == '-' || (n[k] == '*' && k == 0),
                       "name '%s'", n);
    }
    FUZZ_CHECK(strlen(c->sha256_hex) == 64, "fingerprint length");
    for (size_t k = 0; k < 64; k++)
        FUZZ_CHECK(isxdigit((unsigned char)c->sha256_hex[k]), "fingerprint digit");
    FUZZ_CHECK(c->subject && printable(c->subject), "subject");
    FUZZ_CHECK(c->issuer && printable(c->issuer), "issuer");
    if (flags & SL_PEM_CHECK_VALIDITY)
        FUZZ_CHECK(c->not_before_unix <= now_unix && now_unix <= c->not_after_unix,
                   "validity %lld..%lld", (long long)c->not_before_unix,
                   (long long)c->not_after_unix);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    unsigned flags = (data[0] & 1) ? SL_PEM_CHECK_VALIDITY : 0;
    bool no_key = (data[0] & 2) != 0;
    size_t chain_len = (size_t)data[1] | (size_t)data[2] << 8;
    data += 3;
    size -= 3;
    if (chain_len > size)
        chain_len = size;
    char *chain = malloc(chain_len ? chain_len : 1);
    char *key = malloc(size - chain_len ? size - chain_len : 1);
    FUZZ_CHECK(chain && key, "malloc");
    memcpy(chain, data, chain_len);
    memcpy(key, data + chain_len, size - chain_len);

    int rc[2];
    char err[2][512];
    for (int round = 0; round < 2; round++) {
        sl_pem_cert_t c;
        sl_pem_field_t f;
        rc[round] = sl_pem_load(&c, chain, chain_len, no_key ? NULL : key, size - chain_len, flags,
                                now_unix, &f, err[round], sizeof(err[round]));
        FUZZ_CHECK(ERR_peek_error() == 0, "OpenSSL error queue left non-empty");
        if (rc[round] == 0) {
            check_ok(&c, !no_key, flags);
            sl_pem_free(&c);
        } else {
            FUZZ_CHECK(rc[round] == -1, "rc %d", rc[round]);
            FUZZ_CHECK(err[round][0] != '\0', "error without a message");
            FUZZ_CHECK(!base64_run(err[round], 24), "key-like text in the error: %s", err[round]);
            FUZZ_CHECK(f == SL_PEM_FIELD_CERTIFICATE || f == SL_PEM_FIELD_PRIVATE_KEY, "field %d",
                       (int)f);
            FUZZ_CHECK(c.leaf == NULL && c.names == NULL && c.key == NULL,
                       "output not empty on failure");
        }
    }
    FUZZ_CHECK(rc[0] == rc[1] && strcmp(err[0], err[1]) == 0, "second call differs");
    free(chain);
    free(key);
    return 0;
}
