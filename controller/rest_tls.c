/*
 * The REST admin API's generated CA, server certificate and kubeconfig
 * (rest_tls.h). Start-up only, main thread.
 *
 * Names are compared in one canonical text form, "IP:<inet_ntop>" or
 * "DNS:<lower case>", sorted, so that the names wanted now and those of the
 * certificate on disk compare as two sorted lists whatever order or
 * spelling (::0001 vs ::1) they were given in.
 *
 * Key material is never logged; PEM text of keys is wiped before it is
 * freed (sl_tls_files_free) and OpenSSL's error queue is left empty.
 */
#include "rest_tls.h"

#include "hostport.h"
#include "log.h"
#include "model.h"
#include "tls_files.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/buffer.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CA_DAYS 3650
/* The longest validity clients that follow the CA/Browser Forum accept. */
#define SERVER_DAYS 397
/* Reissue a certificate this close to its end at a start. */
#define RENEW_BEFORE_DAYS 30
#define MAX_NAMES 64
#define NAME_LEN 300

typedef struct {
    char v[MAX_NAMES][NAME_LEN];
    size_t n;
    bool overflow;
} names_t;

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ---- names ---------------------------------------------------------------- */

static bool dns_name_ok(const char *s)
{
    size_t len = strlen(s);
    if (len == 0 || len > 253)
        return false;
    if (strncmp(s, "*.", 2) == 0)
        s += 2;
    size_t label = 0;
    for (const char *p = s;; p++) {
        if (*p == '.' || *p == '\0') {
            if (label == 0 || label > 63 || p[-1] == '-')
                return false;
            if (*p == '\0')
                return true;
            label = 0;
            continue;
        }
        if (!isalnum((unsigned char)*p) && !(*p == '-' && label > 0))
            return false;
        label++;
    }
}

/* "IP:..." or "DNS:..." for an address or a name; -1 when it is neither. */
static int canonical_name(const char *in, char *out, size_t outlen)
{
    char buf[NAME_LEN];
    size_t len = strlen(in);
    if (len >= sizeof(buf))
        return -1;
    /* "[::1]" as well as "::1" */
    bool bracketed = len > 2 && in[0] == '[' && in[len - 1] == ']';
    if (bracketed) {
        memcpy(buf, in + 1, len - 2);
        buf[len - 2] = '\0';
    } else
        memcpy(buf, in, len + 1);
    unsigned char a[16];
    char text[INET6_ADDRSTRLEN];
    if (inet_pton(AF_INET, buf, a) == 1) {
        inet_ntop(AF_INET, a, text, sizeof(text));
        snprintf(out, outlen, "IP:%s", text);
        return 0;
    }
    if (inet_pton(AF_INET6, buf, a) == 1) {
        inet_ntop(AF_INET6, a, text, sizeof(text));
        snprintf(out, outlen, "IP:%s", text);
        return 0;
    }
    if (bracketed) /* brackets around a name */
        return -1;
    if (!dns_name_ok(buf))
        return -1;
    for (char *p = buf; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    snprintf(out, outlen, "DNS:%s", buf);
    return 0;
}

static void names_add(names_t *ns, const char *canon)
{
    for (size_t i = 0; i < ns->n; i++)
        if (strcmp(ns->v[i], canon) == 0)
            return;
    if (ns->n == MAX_NAMES) {
        ns->overflow = true;
        return;
    }
    snprintf(ns->v[ns->n++], NAME_LEN, "%s", canon);
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(a, b);
}

static void names_sort(names_t *ns)
{
    qsort(ns->v, ns->n, NAME_LEN, name_cmp);
}

static bool names_equal(const names_t *a, const names_t *b)
{
    if (a->n != b->n || a->overflow || b->overflow)
        return false;
    for (size_t i = 0; i < a->n; i++)
        if (strcmp(a->v[i], b->v[i]) != 0)
            return false;
    return true;
}

int sl_rest_tls_check_san(const char *name, char *err, size_t errlen)
{
    char canon[NAME_LEN];
    if (canonical_name(name, canon, sizeof(canon)) != 0) {
        set_err(err, errlen,
                "--rest-tls-san '%s': not an IP address or a DNS name (letters, digits, '-' and "
                "'.', labels of at most 63 characters, optionally '*.' first)",
                name);
        return -1;
    }
    return 0;
}

bool sl_rest_tls_loopback_host(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (strcasecmp(host, "localhost") == 0)
        return true;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6);
    return false;
}

/* 0.0.0.0, :: or "" (every address): no name of its own. */
static bool wildcard_host(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (!host[0])
        return true;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return a4.s_addr == 0;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_UNSPECIFIED(&a6);
    return false;
}

/* The names the server certificate must carry. */
static int wanted_names(const char *host, const char *const *sans, size_t nsans, names_t *ns,
                        char *err, size_t errlen)
{
    char canon[NAME_LEN];
    ns->n = 0;
    ns->overflow = false;
    if (!wildcard_host(host) && canonical_name(host, canon, sizeof(canon)) == 0)
        names_add(ns, canon);
    names_add(ns, "IP:127.0.0.1");
    names_add(ns, "IP:::1");
    names_add(ns, "DNS:localhost");
    char hn[256];
    if (gethostname(hn, sizeof(hn)) == 0) {
        hn[sizeof(hn) - 1] = '\0';
        if (canonical_name(hn, canon, sizeof(canon)) == 0)
            names_add(ns, canon);
    }
    for (size_t i = 0; i < nsans; i++) {
        if (canonical_name(sans[i], canon, sizeof(canon)) != 0)
            return sl_rest_tls_check_san(sans[i], err, errlen);
        names_add(ns, canon);
    }
    if (ns->overflow) {
        set_err(err, errlen, "--rest-tls-san: more than %d names in all; give fewer", MAX_NAMES);
        return -1;
    }
    names_sort(ns);
    return 0;
}

/* The subjectAltNames of a certificate, canonical and sorted. */
static void cert_names(X509 *x, names_t *ns)
{
    ns->n = 0;
    ns->overflow = false;
    GENERAL_NAMES *gens = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
    for (int i = 0; gens && i < sk_GENERAL_NAME_num(gens); i++) {
        const GENERAL_NAME *g = sk_GENERAL_NAME_value(gens, i);
        char canon[NAME_LEN], text[NAME_LEN];
        if (g->type == GEN_DNS) {
            int len = ASN1_STRING_length(g->d.dNSName);
            if (len <= 0 || len >= (int)sizeof(text)) {
                ns->overflow = true;
                continue;
            }
            memcpy(text, ASN1_STRING_get0_data(g->d.dNSName), (size_t)len);
            text[len] = '\0';
            if (canonical_name(text, canon, sizeof(canon)) == 0 && canon[0] == 'D')
                names_add(ns, canon);
            else
                ns->overflow = true;
        } else if (g->type == GEN_IPADD) {
            int len = ASN1_STRING_length(g->d.iPAddress);
            const unsigned char *a = ASN1_STRING_get0_data(g->d.iPAddress);
            char ip[INET6_ADDRSTRLEN];
            if ((len == 4 && inet_ntop(AF_INET, a, ip, sizeof(ip))) ||
                (len == 16 && inet_ntop(AF_INET6, a, ip, sizeof(ip)))) {
                snprintf(canon, sizeof(canon), "IP:%s", ip);
                names_add(ns, canon);
            } else
                ns->overflow = true;
        } else
            ns->overflow = true; /* a kind we never issue: not ours */
    }
    GENERAL_NAMES_free(gens);
    names_sort(ns);
}

/* ---- files ---------------------------------------------------------------- */

static void join(char *out, size_t outlen, const char *dir, const char *name)
{
    snprintf(out, outlen, "%s/%s", dir, name);
}

/* Writes data to path with mode, replacing it atomically. */
static int write_file(const char *path, const char *data, size_t len, mode_t mode, char *err,
                      size_t errlen)
{
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
        set_err(err, errlen, "%s: %s (check that --data-dir is writable)", tmp, strerror(errno));
        return -1;
    }
    int e = 0;
    if (fchmod(fd, mode) != 0)
        e = errno;
    for (size_t off = 0; !e && off < len;) {
        ssize_t n = write(fd, data + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            e = n < 0 ? errno : EIO;
            break;
        }
        off += (size_t)n;
    }
    if (!e && fsync(fd) != 0)
        e = errno;
    if (close(fd) != 0 && !e)
        e = errno;
    if (!e && rename(tmp, path) != 0)
        e = errno;
    if (e) {
        unlink(tmp);
        set_err(err, errlen, "%s: %s (check that --data-dir is writable and not full)", path,
                strerror(e));
        return -1;
    }
    return 0;
}

static int no_password(char *buf, int size, int rwflag, void *u)
{
    (void)buf;
    (void)size;
    (void)rwflag;
    (void)u;
    return -1;
}

/* NULL when missing (*missing set) or unusable (reason in why). */
static X509 *read_cert(const char *path, bool *missing, char *why, size_t whylen)
{
    *missing = access(path, F_OK) != 0 && errno == ENOENT;
    if (*missing)
        return NULL;
    BIO *b = BIO_new_file(path, "r");
    X509 *x = b ? PEM_read_bio_X509(b, NULL, no_password, NULL) : NULL;
    BIO_free(b);
    ERR_clear_error();
    if (!x)
        set_err(why, whylen, "%s does not hold a PEM certificate", path);
    return x;
}

static EVP_PKEY *read_key(const char *path, bool *missing, char *why, size_t whylen)
{
    *missing = access(path, F_OK) != 0 && errno == ENOENT;
    if (*missing)
        return NULL;
    BIO *b = BIO_new_file(path, "r");
    EVP_PKEY *k = b ? PEM_read_bio_PrivateKey(b, NULL, no_password, NULL) : NULL;
    BIO_free(b);
    ERR_clear_error();
    if (!k)
        set_err(why, whylen, "%s does not hold an unencrypted PEM private key", path);
    return k;
}

/* PEM text of a certificate or a key (malloc'd), NULL when out of memory. */
static char *to_pem(X509 *x, EVP_PKEY *k)
{
    BIO *b = BIO_new(BIO_s_mem());
    char *out = NULL;
    if (!b)
        return NULL;
    if (x ? PEM_write_bio_X509(b, x) == 1
          : PEM_write_bio_PrivateKey(b, k, NULL, NULL, 0, NULL, NULL) == 1) {
        char *data;
        long len = BIO_get_mem_data(b, &data);
        if (len > 0 && (out = malloc((size_t)len + 1))) {
            memcpy(out, data, (size_t)len);
            out[len] = '\0';
        }
    }
    /* The memory BIO's buffer held key text. */
    BUF_MEM *mem = NULL;
    BIO_get_mem_ptr(b, &mem);
    if (mem && mem->data)
        OPENSSL_cleanse(mem->data, mem->max);
    BIO_free(b);
    ERR_clear_error();
    return out;
}

/* Writes a certificate (0644) or a key (0600). */
static int save(const char *path, X509 *x, EVP_PKEY *k, char *err, size_t errlen)
{
    char *pem = to_pem(x, k);
    if (!pem) {
        set_err(err, errlen, "%s: out of memory while encoding", path);
        return -1;
    }
    int rc = write_file(path, pem, strlen(pem), x ? 0644 : 0600, err, errlen);
    sl_tls_files_free(pem);
    return rc;
}

/* ---- checks and issuing --------------------------------------------------- */

/* Valid now and for RENEW_BEFORE_DAYS more. */
static bool valid_long_enough(X509 *x)
{
    time_t later = time(NULL) + (time_t)RENEW_BEFORE_DAYS * 86400;
    return X509_cmp_current_time(X509_get0_notBefore(x)) < 0 &&
           X509_cmp_time(X509_get0_notAfter(x), &later) > 0;
}

static int add_ext(X509 *x, X509V3_CTX *ctx, int nid, const char *value)
{
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, ctx, nid, value);
    if (!ext)
        return -1;
    int ok = X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
    return ok == 1 ? 0 : -1;
}

/*
 * A certificate for pub with subject CN=cn, signed by issuer_key (issuer
 * NULL: self-signed, a CA). NULL when OpenSSL fails (out of memory).
 */
static X509 *issue(const char *cn, EVP_PKEY *pub, X509 *issuer, EVP_PKEY *issuer_key,
                   const names_t *names)
{
    X509 *x = X509_new();
    BIGNUM *bn = BN_new();
    unsigned char serial[16];
    char *san = NULL;
    if (!x || !bn || RAND_bytes(serial, sizeof(serial)) != 1)
        goto fail;
    serial[0] &= 0x7f; /* positive */
    serial[0] |= 0x01; /* and 16 bytes long */
    X509_NAME *subj = X509_get_subject_name(x);
    if (X509_set_version(x, X509_VERSION_3) != 1 || !BN_bin2bn(serial, sizeof(serial), bn) ||
        !BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) ||
        /* an hour back: clocks of clients a little behind still accept it */
        !X509_gmtime_adj(X509_getm_notBefore(x), -3600) ||
        !X509_time_adj_ex(X509_getm_notAfter(x), issuer ? SERVER_DAYS : CA_DAYS, 0, NULL) ||
        X509_NAME_add_entry_by_txt(subj, "O", MBSTRING_ASC, (const unsigned char *)"Sluice", -1, -1,
                                   0) != 1 ||
        X509_NAME_add_entry_by_txt(subj, "CN", MBSTRING_UTF8, (const unsigned char *)cn, -1, -1,
                                   0) != 1 ||
        X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer) : subj) != 1 ||
        X509_set_pubkey(x, pub) != 1)
        goto fail;
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer ? issuer : x, x, NULL, NULL, 0);
    if (!issuer) {
        if (add_ext(x, &ctx, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") != 0 ||
            add_ext(x, &ctx, NID_key_usage, "critical,keyCertSign,cRLSign") != 0 ||
            add_ext(x, &ctx, NID_subject_key_identifier, "hash") != 0)
            goto fail;
    } else {
        size_t len = 1;
        for (size_t i = 0; i < names->n; i++)
            len += strlen(names->v[i]) + 1;
        if (!(san = malloc(len)))
            goto fail;
        san[0] = '\0';
        for (size_t i = 0; i < names->n; i++) {
            if (i)
                strcat(san, ",");
            strcat(san, names->v[i]);
        }
        if (add_ext(x, &ctx, NID_basic_constraints, "critical,CA:FALSE") != 0 ||
            add_ext(x, &ctx, NID_key_usage, "critical,digitalSignature") != 0 ||
            add_ext(x, &ctx, NID_ext_key_usage, "serverAuth") != 0 ||
            add_ext(x, &ctx, NID_subject_key_identifier, "hash") != 0 ||
            add_ext(x, &ctx, NID_authority_key_identifier, "keyid:always") != 0 ||
            add_ext(x, &ctx, NID_subject_alt_name, san) != 0)
            goto fail;
    }
    if (X509_sign(x, issuer_key, EVP_sha256()) <= 0)
        goto fail;
    free(san);
    BN_free(bn);
    return x;
fail:
    free(san);
    BN_free(bn);
    X509_free(x);
    ERR_clear_error();
    return NULL;
}

static EVP_PKEY *new_key(void)
{
    EVP_PKEY *k = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
    ERR_clear_error();
    return k;
}

int sl_rest_tls_prepare(const char *data_dir, const char *rest_addr, const char *const *sans,
                        size_t nsans, char **cert_pem, char **key_pem, char **ca_pem, char *err,
                        size_t errlen)
{
    char host[256];
    unsigned short port;
    names_t *want = calloc(1, sizeof(*want)), *have = calloc(1, sizeof(*have));
    char ca_crt[4096], ca_key_path[4096], srv_crt[4096], srv_key_path[4096], why[4200] = "";
    X509 *ca = NULL, *srv = NULL;
    EVP_PKEY *ca_key = NULL, *srv_key = NULL;
    bool missing_c = false, missing_k = false;
    int rc = -1;
    *cert_pem = *key_pem = *ca_pem = NULL;
    if (!want || !have) {
        set_err(err, errlen, "--rest: out of memory");
        goto out;
    }
    if (sl_hostport_parse(rest_addr, "--rest", 9090, host, sizeof(host), &port, err, errlen) != 0 ||
        wanted_names(host, sans, nsans, want, err, errlen) != 0)
        goto out;
    join(ca_crt, sizeof(ca_crt), data_dir, SL_REST_TLS_CA_CERT);
    join(ca_key_path, sizeof(ca_key_path), data_dir, SL_REST_TLS_CA_KEY);
    join(srv_crt, sizeof(srv_crt), data_dir, SL_REST_TLS_SERVER_CERT);
    join(srv_key_path, sizeof(srv_key_path), data_dir, SL_REST_TLS_SERVER_KEY);

    /* The CA: kept while usable, so that clients need not trust a new one. */
    ca = read_cert(ca_crt, &missing_c, why, sizeof(why));
    ca_key = ca ? read_key(ca_key_path, &missing_k, why, sizeof(why)) : NULL;
    if (ca && ca_key) {
        if (X509_check_private_key(ca, ca_key) != 1)
            set_err(why, sizeof(why), "%s does not match %s", ca_key_path, ca_crt);
        else if (X509_check_ca(ca) < 1)
            set_err(why, sizeof(why), "%s is not a CA certificate", ca_crt);
        else if (!valid_long_enough(ca))
            set_err(why, sizeof(why), "%s expires within %d days or is not valid yet", ca_crt,
                    RENEW_BEFORE_DAYS);
        else
            why[0] = '\0';
        ERR_clear_error();
    } else if (ca && missing_k)
        set_err(why, sizeof(why), "%s is missing", ca_key_path);
    if (!ca || !ca_key || why[0]) {
        if (!missing_c)
            sl_log_warn("REST TLS: %s; issuing a new CA (clients that trusted the old one must "
                        "trust %s again)",
                        why, ca_crt);
        X509_free(ca);
        EVP_PKEY_free(ca_key);
        unsigned char rnd[4];
        char cn[64];
        if (RAND_bytes(rnd, sizeof(rnd)) != 1)
            memset(rnd, 0, sizeof(rnd));
        ERR_clear_error();
        snprintf(cn, sizeof(cn), "Sluice controller CA %02x%02x%02x%02x", rnd[0], rnd[1], rnd[2],
                 rnd[3]);
        ca_key = new_key();
        ca = ca_key ? issue(cn, ca_key, NULL, ca_key, NULL) : NULL;
        if (!ca) {
            set_err(err, errlen, "%s: cannot issue a CA certificate (out of memory?)", ca_crt);
            goto out;
        }
        /* The key first: a certificate without its key is never left. */
        if (save(ca_key_path, NULL, ca_key, err, errlen) != 0 ||
            save(ca_crt, ca, NULL, err, errlen) != 0)
            goto out;
        sl_log_notice("REST TLS: issued a new CA %s (EC P-256, %d days)", ca_crt, CA_DAYS);
        /* Whatever the server certificate was, it is not signed by this CA. */
    } else {
        chmod(ca_crt, 0644);
        chmod(ca_key_path, 0600);
    }

    /* The server certificate: reused when signed by the CA, long enough
     * valid and naming exactly the wanted names. */
    why[0] = '\0';
    srv = read_cert(srv_crt, &missing_c, why, sizeof(why));
    srv_key = srv ? read_key(srv_key_path, &missing_k, why, sizeof(why)) : NULL;
    if (srv && srv_key) {
        EVP_PKEY *ca_pub = X509_get0_pubkey(ca);
        cert_names(srv, have);
        if (X509_check_private_key(srv, srv_key) != 1)
            set_err(why, sizeof(why), "%s does not match %s", srv_key_path, srv_crt);
        else if (!ca_pub || X509_verify(srv, ca_pub) != 1 ||
                 X509_check_issued(ca, srv) != X509_V_OK)
            set_err(why, sizeof(why), "%s is not signed by %s", srv_crt, ca_crt);
        else if (!valid_long_enough(srv))
            set_err(why, sizeof(why), "%s expires within %d days or is not valid yet", srv_crt,
                    RENEW_BEFORE_DAYS);
        else if (!names_equal(want, have))
            set_err(why, sizeof(why), "%s names other hosts than --rest and --rest-tls-san ask",
                    srv_crt);
        else
            why[0] = '\0';
        ERR_clear_error();
    } else if (srv && missing_k)
        set_err(why, sizeof(why), "%s is missing", srv_key_path);
    if (!srv || !srv_key || why[0]) {
        if (!missing_c)
            sl_log_notice("REST TLS: %s; issuing a new server certificate", why);
        X509_free(srv);
        EVP_PKEY_free(srv_key);
        srv_key = new_key();
        srv = srv_key ? issue("sluice-controller", srv_key, ca, ca_key, want) : NULL;
        if (!srv) {
            set_err(err, errlen, "%s: cannot issue the server certificate (out of memory?)",
                    srv_crt);
            goto out;
        }
        if (save(srv_key_path, NULL, srv_key, err, errlen) != 0 ||
            save(srv_crt, srv, NULL, err, errlen) != 0)
            goto out;
        char list[MAX_NAMES * 32] = "";
        for (size_t i = 0; i < want->n; i++) {
            size_t used = strlen(list);
            snprintf(list + used, sizeof(list) - used, "%s%s", i ? ", " : "", want->v[i]);
        }
        sl_log_notice("REST TLS: issued %s for %s (%d days, signed by %s)", srv_crt, list,
                      SERVER_DAYS, ca_crt);
    } else {
        chmod(srv_crt, 0644);
        chmod(srv_key_path, 0600);
        sl_log_info("REST TLS: reusing %s and %s", srv_crt, ca_crt);
    }
    if (!(*cert_pem = to_pem(srv, NULL)) || !(*key_pem = to_pem(NULL, srv_key)) ||
        !(*ca_pem = to_pem(ca, NULL))) {
        set_err(err, errlen, "--rest: out of memory");
        goto out;
    }
    rc = 0;
out:
    if (rc != 0) {
        sl_tls_files_free(*cert_pem);
        sl_tls_files_free(*key_pem);
        sl_tls_files_free(*ca_pem);
        *cert_pem = *key_pem = *ca_pem = NULL;
    }
    X509_free(ca);
    X509_free(srv);
    EVP_PKEY_free(ca_key);
    EVP_PKEY_free(srv_key);
    free(want);
    free(have);
    ERR_clear_error();
    return rc;
}

/* ---- kubeconfig ----------------------------------------------------------- */

int sl_rest_tls_write_kubeconfig(const char *data_dir, const char *rest_addr, int port,
                                 const char *ca_pem, const char *token, char *path, size_t pathlen,
                                 char *err, size_t errlen)
{
    char host[256], server[400];
    unsigned short p;
    struct in6_addr a6;
    if (sl_hostport_parse(rest_addr, "--rest", 9090, host, sizeof(host), &p, err, errlen) != 0)
        return -1;
    if (wildcard_host(host))
        snprintf(host, sizeof(host), "%s", strchr(host, ':') ? "::1" : "127.0.0.1");
    if (inet_pton(AF_INET6, host, &a6) == 1)
        snprintf(server, sizeof(server), "https://[%s]:%d", host, port);
    else
        snprintf(server, sizeof(server), "https://%s:%d", host, port);

    size_t calen = strlen(ca_pem);
    char *b64 = malloc(4 * ((calen + 2) / 3) + 1);
    if (!b64) {
        set_err(err, errlen, "kubeconfig: out of memory");
        return -1;
    }
    EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)ca_pem, (int)calen);
    json_t *docs = json_pack(
        "[{s:s, s:s, s:[{s:s, s:{s:s, s:s}}], s:[{s:s, s:{s:s}}], s:[{s:s, s:{s:s, s:s, s:s}}], "
        "s:s, s:{}}]",
        "apiVersion", "v1", "kind", "Config", "clusters", "name", "sluice", "cluster", "server",
        server, "certificate-authority-data", b64, "users", "name", "sluice", "user", "token",
        token, "contexts", "name", "sluice", "context", "cluster", "sluice", "user", "sluice",
        "namespace", "default", "current-context", "sluice", "preferences");
    free(b64);
    char *text = docs ? sl_yaml_dump(docs) : NULL;
    json_decref(docs);
    if (!text) {
        set_err(err, errlen, "kubeconfig: out of memory");
        return -1;
    }
    join(path, pathlen, data_dir, SL_REST_TLS_KUBECONFIG);
    int rc = write_file(path, text, strlen(text), 0600, err, errlen);
    sl_tls_files_free(text); /* holds the token */
    /* Absolute, for the log line a user copies into `export KUBECONFIG=`. */
    char *abs = rc == 0 ? realpath(path, NULL) : NULL;
    if (abs && strlen(abs) < pathlen)
        memcpy(path, abs, strlen(abs) + 1);
    free(abs);
    return rc;
}
