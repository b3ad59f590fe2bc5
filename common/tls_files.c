/*
 * Command-line PEM files for the control plane's TLS (tls_files.h).
 */
#include "tls_files.h"

#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen)
        vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

void sl_tls_files_free(char *pem)
{
    if (!pem)
        return;
    OPENSSL_cleanse(pem, strlen(pem));
    free(pem);
}

/* The whole file as NUL-terminated text, or NULL with err. */
static char *read_file(const char *flag, const char *path, bool is_key, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        set_err(err, errlen, "%s %s: %s (%s)", flag, path, strerror(e),
                e == ENOENT   ? "check the path"
                : e == EACCES ? "make it readable by the user this process runs as"
                              : "check the file");
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        set_err(err, errlen, "%s %s: not a regular file (give the path of a PEM file)", flag, path);
        close(fd);
        return NULL;
    }
    if (sb.st_size > SL_TLS_FILES_MAX_BYTES) {
        set_err(err, errlen, "%s %s: larger than %d bytes; is it the right file?", flag, path,
                SL_TLS_FILES_MAX_BYTES);
        close(fd);
        return NULL;
    }
    if (is_key && (sb.st_mode & (S_IRWXG | S_IRWXO)))
        sl_log_warn("%s %s can be read by other users; chmod 600 it (it holds a private key)", flag,
                    path);
    size_t cap = (size_t)sb.st_size + 1, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        set_err(err, errlen, "%s %s: out of memory", flag, path);
        close(fd);
        return NULL;
    }
    for (;;) {
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            set_err(err, errlen, "%s %s: %s (check the file)", flag, path, strerror(errno));
            goto fail;
        }
        if (n == 0 || len + (size_t)n == cap - 1) {
            len += (size_t)n;
            break;
        }
        len += (size_t)n;
    }
    buf[len] = '\0';
    if (strlen(buf) != len) {
        set_err(err, errlen, "%s %s: contains NUL bytes; a PEM file is text (is it DER?)", flag,
                path);
        goto fail;
    }
    close(fd);
    return buf;
fail:
    OPENSSL_cleanse(buf, cap);
    free(buf);
    close(fd);
    return NULL;
}

static int no_password(char *buf, int size, int rwflag, void *u)
{
    (void)buf;
    (void)size;
    (void)rwflag;
    *(bool *)u = true;
    return -1;
}

/* Every PEM certificate of text into a new stack (at least one), or NULL
 * with err. Other PEM blocks must have been refused by the caller. */
static STACK_OF(X509) *
    parse_certs(const char *flag, const char *path, const char *text, char *err, size_t errlen)
{
    STACK_OF(X509) *certs = sk_X509_new_null();
    BIO *b = BIO_new_mem_buf(text, -1);
    if (!certs || !b) {
        set_err(err, errlen, "%s %s: out of memory", flag, path);
        goto fail;
    }
    for (int n = 0;; n++) {
        bool pw = false;
        ERR_clear_error();
        X509 *x = PEM_read_bio_X509(b, NULL, no_password, &pw);
        if (!x) {
            unsigned long e = ERR_peek_last_error();
            bool at_end = ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE;
            if (at_end && n > 0)
                break;
            if (at_end)
                set_err(err, errlen,
                        "%s %s: no PEM certificate in it (expected -----BEGIN CERTIFICATE-----; "
                        "convert DER with openssl x509 -inform der -in FILE -out FILE.pem)",
                        flag, path);
            else
                set_err(err, errlen,
                        "%s %s: certificate %d does not parse (bad base64 or DER; check the "
                        "file with openssl x509 -noout -text -in FILE)",
                        flag, path, n + 1);
            goto fail;
        }
        if (!sk_X509_push(certs, x)) {
            X509_free(x);
            set_err(err, errlen, "%s %s: out of memory", flag, path);
            goto fail;
        }
    }
    BIO_free(b);
    ERR_clear_error();
    return certs;
fail:
    BIO_free(b);
    sk_X509_pop_free(certs, X509_free);
    ERR_clear_error();
    return NULL;
}

int sl_tls_files_read_ca(const char *flag, const char *path, char **pem, char *err, size_t errlen)
{
    *pem = NULL;
    char *text = read_file(flag, path, false, err, errlen);
    if (!text)
        return -1;
    if (strstr(text, "PRIVATE KEY-----")) {
        set_err(err, errlen,
                "%s %s: holds a private key; give the CA certificate(s) only (the file of "
                "-----BEGIN CERTIFICATE----- blocks)",
                flag, path);
        sl_tls_files_free(text);
        return -1;
    }
    STACK_OF(X509) *certs = parse_certs(flag, path, text, err, errlen);
    if (!certs) {
        sl_tls_files_free(text);
        return -1;
    }
    sk_X509_pop_free(certs, X509_free);
    *pem = text;
    return 0;
}

int sl_tls_files_read_pair(const char *cert_flag, const char *cert_path, const char *key_flag,
                           const char *key_path, char **cert_pem, char **key_pem, char *err,
                           size_t errlen)
{
    *cert_pem = *key_pem = NULL;
    STACK_OF(X509) *certs = NULL;
    EVP_PKEY *key = NULL;
    char *cert = read_file(cert_flag, cert_path, false, err, errlen);
    if (!cert)
        return -1;
    char *keytext = read_file(key_flag, key_path, true, err, errlen);
    if (!keytext)
        goto fail;
    if (strstr(cert, "PRIVATE KEY-----")) {
        set_err(err, errlen,
                "%s %s: holds a private key; give the key to %s and only certificates here "
                "(leaf first, then its intermediates)",
                cert_flag, cert_path, key_flag);
        goto fail;
    }
    if (!(certs = parse_certs(cert_flag, cert_path, cert, err, errlen)))
        goto fail;
    X509 *leaf = sk_X509_value(certs, 0);
    /* Leaf first, then each issuer: the order TLS sends them in. */
    for (int i = 1; i < sk_X509_num(certs); i++)
        if (X509_check_issued(sk_X509_value(certs, i), sk_X509_value(certs, i - 1)) != X509_V_OK) {
            set_err(err, errlen,
                    "%s %s: certificate %d did not issue certificate %d; put the leaf first, "
                    "then its issuer, then the issuer's issuer",
                    cert_flag, cert_path, i + 1, i);
            goto fail;
        }
    if (X509_cmp_current_time(X509_get0_notAfter(leaf)) < 0) {
        set_err(err, errlen, "%s %s: the certificate has expired; renew it", cert_flag, cert_path);
        goto fail;
    }
    if (X509_cmp_current_time(X509_get0_notBefore(leaf)) > 0) {
        set_err(err, errlen,
                "%s %s: the certificate is not valid yet; check the issuer's and this "
                "machine's clock",
                cert_flag, cert_path);
        goto fail;
    }
    if (!strstr(keytext, "PRIVATE KEY-----")) {
        set_err(err, errlen,
                "%s %s: no PEM private key in it (expected -----BEGIN PRIVATE KEY-----; is it "
                "the certificate?)",
                key_flag, key_path);
        goto fail;
    }
    BIO *b = BIO_new_mem_buf(keytext, -1);
    bool encrypted = false;
    ERR_clear_error();
    key = b ? PEM_read_bio_PrivateKey(b, NULL, no_password, &encrypted) : NULL;
    BIO_free(b);
    if (!key) {
        if (encrypted)
            set_err(err, errlen,
                    "%s %s: the key is encrypted; store it decrypted (openssl pkey -in KEY -out "
                    "PLAIN) and protect it with file permissions (chmod 600)",
                    key_flag, key_path);
        else
            set_err(err, errlen, "%s %s: the private key does not parse (bad base64 or DER)",
                    key_flag, key_path);
        goto fail;
    }
    ERR_clear_error();
    if (X509_check_private_key(leaf, key) != 1) {
        set_err(err, errlen,
                "%s %s: the private key does not match the certificate of %s %s; give the key "
                "the certificate was issued for (openssl x509 -noout -pubkey -in CERT and "
                "openssl pkey -pubout -in KEY must print the same key)",
                key_flag, key_path, cert_flag, cert_path);
        goto fail;
    }
    EVP_PKEY_free(key);
    sk_X509_pop_free(certs, X509_free);
    ERR_clear_error();
    *cert_pem = cert;
    *key_pem = keytext;
    return 0;
fail:
    EVP_PKEY_free(key);
    sk_X509_pop_free(certs, X509_free);
    ERR_clear_error();
    sl_tls_files_free(cert);
    sl_tls_files_free(keytext);
    return -1;
}
