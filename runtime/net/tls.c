/*
 * TLS servers of https listeners (tls.h has the contract, the life cycle and
 * the I/O rules; this comment is about the inside).
 *
 * A server is a set of SSL_CTXs, one per group of certificates that name the
 * same hosts: OpenSSL holds one certificate per key type in a context, so an
 * RSA and an ECDSA certificate for the same names share a group and the
 * client's signature algorithms pick between them. The group of the
 * listener's first certificate is the "front" context every SSL starts on;
 * the servername callback moves a connection to the group its SNI names:
 * exact names first, then "*.suffix" wildcards (one label), else it stays on
 * the front. Each group context carries every listener setting, because
 * after SSL_set_SSL_CTX OpenSSL reads some of them (ALPN, verify store) from
 * the new context and others (tickets, session cache) from the front one.
 *
 * Lifetime: the server struct hangs off the front context's ex_data with a
 * free callback, so it lives exactly as long as OpenSSL's reference count on
 * the front context, which every SSL made by sl_tls_server_ssl_new holds
 * (as its session context) until SSL_free. Callbacks find the server through
 * a second ex_data slot on every group context (no free callback there: a
 * group context may outlive the server by a few instructions inside
 * SSL_free and must not touch it).
 *
 * Ticket keys: a ring per listener name in a registry (mutex, main thread
 * and rare rotations only). Readers copy the ring under a sequence lock with
 * relaxed atomic loads, so the handshake path takes no lock and writes no
 * shared cache line. A slot is used only when its `valid` word is set: an
 * all-zero key would let anyone forge a ticket.
 */
#include "tls.h"

#include "metrics.h"
#include "tls_pem.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/ocsp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- ticket key ring ------------------------------------------------------ */

#define TICKET_KEYS 3
/* name 16 + AES-256 key 32 + HMAC-SHA256 key 32 bytes = 10 words, then the
 * valid flag. */
#define TICKET_WORDS 11
#define TICKET_VALID_WORD 10

typedef struct ticket_ring {
    char *listener;
    unsigned refs; /* servers using it; registry_lock */
    pthread_mutex_t rotate_lock;
    _Atomic uint64_t seq; /* odd while a rotation writes */
    uint64_t keys[TICKET_KEYS][TICKET_WORDS];
    uint64_t current; /* index into keys; inside the sequence lock */
    _Atomic int64_t next_rotation_unix;
    _Atomic uint32_t rotation_s;
    struct ticket_ring *next;
} ticket_ring_t;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static ticket_ring_t *rings;

static void ring_read(ticket_ring_t *r, uint64_t out[TICKET_KEYS][TICKET_WORDS], unsigned *cur)
{
    for (;;) {
        uint64_t s1 = atomic_load_explicit(&r->seq, memory_order_acquire);
        if (s1 & 1) {
            sched_yield();
            continue;
        }
        for (unsigned i = 0; i < TICKET_KEYS; i++)
            for (unsigned j = 0; j < TICKET_WORDS; j++)
                out[i][j] = __atomic_load_n(&r->keys[i][j], __ATOMIC_RELAXED);
        *cur = (unsigned)__atomic_load_n(&r->current, __ATOMIC_RELAXED);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&r->seq, memory_order_relaxed) == s1)
            return;
    }
}

/* Caller holds rotate_lock. */
static int ring_rotate_locked(ticket_ring_t *r, int64_t now)
{
    uint64_t fresh[TICKET_WORDS];
    if (RAND_bytes((unsigned char *)fresh, 80) != 1)
        return -1;
    fresh[TICKET_VALID_WORD] = 1;
    uint64_t s = atomic_load_explicit(&r->seq, memory_order_relaxed);
    atomic_store_explicit(&r->seq, s + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    unsigned next = (unsigned)((__atomic_load_n(&r->current, __ATOMIC_RELAXED) + 1) % TICKET_KEYS);
    for (unsigned j = 0; j < TICKET_WORDS; j++)
        __atomic_store_n(&r->keys[next][j], fresh[j], __ATOMIC_RELAXED);
    __atomic_store_n(&r->current, (uint64_t)next, __ATOMIC_RELAXED);
    atomic_store_explicit(&r->seq, s + 2, memory_order_release);
    OPENSSL_cleanse(fresh, sizeof(fresh));
    atomic_store_explicit(&r->next_rotation_unix,
                          now + (int64_t)atomic_load_explicit(&r->rotation_s, memory_order_relaxed),
                          memory_order_relaxed);
    return 0;
}

/* Registry: the ring of a listener name, made on first use. */
static ticket_ring_t *ring_acquire(const char *listener, uint32_t rotation_s)
{
    pthread_mutex_lock(&registry_lock);
    ticket_ring_t *r = rings;
    while (r && strcmp(r->listener, listener) != 0)
        r = r->next;
    if (r) {
        r->refs++;
        atomic_store_explicit(&r->rotation_s, rotation_s, memory_order_relaxed);
        pthread_mutex_unlock(&registry_lock);
        return r;
    }
    r = calloc(1, sizeof(*r));
    if (!r || !(r->listener = strdup(listener))) {
        free(r);
        pthread_mutex_unlock(&registry_lock);
        return NULL;
    }
    pthread_mutex_init(&r->rotate_lock, NULL);
    atomic_store_explicit(&r->rotation_s, rotation_s, memory_order_relaxed);
    r->current = TICKET_KEYS - 1; /* the first rotation fills slot 0 */
    if (ring_rotate_locked(r, (int64_t)time(NULL)) != 0) {
        pthread_mutex_destroy(&r->rotate_lock);
        free(r->listener);
        free(r);
        pthread_mutex_unlock(&registry_lock);
        return NULL;
    }
    r->refs = 1;
    r->next = rings;
    rings = r;
    pthread_mutex_unlock(&registry_lock);
    return r;
}

static void ring_release(ticket_ring_t *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&registry_lock);
    if (--r->refs == 0) {
        for (ticket_ring_t **p = &rings; *p; p = &(*p)->next) {
            if (*p == r) {
                *p = r->next;
                break;
            }
        }
        OPENSSL_cleanse(r->keys, sizeof(r->keys));
        pthread_mutex_destroy(&r->rotate_lock);
        free(r->listener);
        free(r);
    }
    pthread_mutex_unlock(&registry_lock);
}

int sl_tls_tickets_rotate(const char *listener)
{
    pthread_mutex_lock(&registry_lock);
    ticket_ring_t *r = rings;
    while (r && strcmp(r->listener, listener) != 0)
        r = r->next;
    int rc = SL_DECLINED;
    if (r) {
        pthread_mutex_lock(&r->rotate_lock);
        rc = ring_rotate_locked(r, (int64_t)time(NULL)) == 0 ? SL_OK : SL_ERROR;
        pthread_mutex_unlock(&r->rotate_lock);
    }
    pthread_mutex_unlock(&registry_lock);
    return rc;
}

/* ---- the server ------------------------------------------------------------ */

typedef struct {
    char *name; /* "namespace/name" */
    sl_pem_cert_t pem;
    size_t group;
} cert_t;

typedef struct {
    SSL_CTX *ctx;
    const cert_t *first; /* its names are the group's */
    unsigned key_types;  /* bit per sl_pem_key_type_t present */
} group_t;

typedef struct {
    const char *name; /* exact host, or the suffix of "*.suffix" */
    size_t group;
} sni_entry_t;

struct sl_tls_server {
    char *listener;
    SSL_CTX *front; /* groups[0].ctx */
    group_t *groups;
    size_t ngroups;
    cert_t *certs;
    size_t ncerts;
    sni_entry_t *exact, *wild;
    size_t nexact, nwild;
    unsigned char alpn[32]; /* wire format, server preference order */
    size_t alpn_len;
    ticket_ring_t *ring; /* NULL when tickets are off */
    unsigned char *ocsp_der;
    size_t ocsp_len;
    const cert_t *ocsp_cert;
};

static int idx_srv = -1, idx_owner = -1;
static pthread_once_t idx_once = PTHREAD_ONCE_INIT;

static void server_destroy(sl_tls_server_t *srv, bool with_front);

static void owner_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl, void *argp)
{
    (void)parent;
    (void)ad;
    (void)idx;
    (void)argl;
    (void)argp;
    if (ptr)
        server_destroy(ptr, false);
}

static void init_indexes(void)
{
    idx_srv = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, NULL);
    idx_owner = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, owner_free);
}

static sl_tls_server_t *server_of(const SSL *ssl)
{
    return SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), idx_srv);
}

static void server_destroy(sl_tls_server_t *srv, bool with_front)
{
    for (size_t g = 0; g < srv->ngroups; g++)
        if (srv->groups[g].ctx && (with_front || g != 0))
            SSL_CTX_free(srv->groups[g].ctx);
    for (size_t i = 0; i < srv->ncerts; i++) {
        free(srv->certs[i].name);
        sl_pem_free(&srv->certs[i].pem);
    }
    free(srv->certs);
    free(srv->groups);
    free(srv->exact);
    free(srv->wild);
    free(srv->ocsp_der);
    ring_release(srv->ring);
    free(srv->listener);
    free(srv);
}

void sl_tls_server_free(sl_tls_server_t *srv)
{
    if (srv)
        SSL_CTX_free(srv->front); /* the last SSL, or this, runs owner_free */
}

/* ---- callbacks (worker threads, during handshakes) ------------------------ */

static int cmp_sni(const void *a, const void *b)
{
    const sni_entry_t *x = a, *y = b;
    int d = strcmp(x->name, y->name);
    if (d)
        return d;
    return x->group < y->group ? -1 : x->group > y->group;
}

static int cmp_sni_name(const void *a, const void *b)
{
    return strcmp(((const sni_entry_t *)a)->name, ((const sni_entry_t *)b)->name);
}

/* Tables hold each name once (build_sni), so any match is the match. */
static const sni_entry_t *sni_find(const sni_entry_t *tab, size_t n, const char *name)
{
    sni_entry_t key = {name, 0};
    return bsearch(&key, tab, n, sizeof(*tab), cmp_sni_name);
}

static int servername_cb(SSL *ssl, int *alert, void *arg)
{
    (void)alert;
    sl_tls_server_t *srv = arg;
    const char *host = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
    if (!host)
        return SSL_TLSEXT_ERR_OK; /* the front (default) certificate */
    char name[254];
    size_t n = strlen(host);
    if (n && host[n - 1] == '.')
        n--;
    if (n == 0 || n >= sizeof(name))
        return SSL_TLSEXT_ERR_OK;
    for (size_t i = 0; i < n; i++)
        name[i] = (char)tolower((unsigned char)host[i]);
    name[n] = '\0';
    const sni_entry_t *e = sni_find(srv->exact, srv->nexact, name);
    if (!e) {
        const char *dot = strchr(name, '.');
        if (dot && dot[1])
            e = sni_find(srv->wild, srv->nwild, dot + 1);
    }
    if (e && e->group != 0 && !SSL_set_SSL_CTX(ssl, srv->groups[e->group].ctx))
        return SSL_TLSEXT_ERR_ALERT_FATAL;
    return SSL_TLSEXT_ERR_OK;
}

static int alpn_cb(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                   const unsigned char *in, unsigned int inlen, void *arg)
{
    (void)ssl;
    sl_tls_server_t *srv = arg;
    unsigned char *sel = NULL;
    /* Server preference: the listener's order decides, as nginx does. */
    if (SSL_select_next_proto(&sel, outlen, srv->alpn, (unsigned int)srv->alpn_len, in, inlen) ==
        OPENSSL_NPN_NEGOTIATED) {
        *out = sel;
        return SSL_TLSEXT_ERR_OK;
    }
    /* RFC 7301 3.2: no protocol in common is a no_application_protocol
     * alert, not a silent fallback the client did not ask for. */
    return SSL_TLSEXT_ERR_ALERT_FATAL;
}

static int ticket_cb(SSL *ssl, unsigned char key_name[16], unsigned char iv[EVP_MAX_IV_LENGTH],
                     EVP_CIPHER_CTX *cctx, EVP_MAC_CTX *hctx, int enc)
{
    sl_tls_server_t *srv = server_of(ssl);
    if (!srv || !srv->ring)
        return 0;
    ticket_ring_t *r = srv->ring;
    if (enc) {
        int64_t now = (int64_t)time(NULL);
        if (now >= atomic_load_explicit(&r->next_rotation_unix, memory_order_relaxed) &&
            pthread_mutex_trylock(&r->rotate_lock) == 0) {
            if (now >= atomic_load_explicit(&r->next_rotation_unix, memory_order_relaxed))
                ring_rotate_locked(r, now);
            pthread_mutex_unlock(&r->rotate_lock);
        }
    }
    uint64_t keys[TICKET_KEYS][TICKET_WORDS];
    unsigned cur;
    ring_read(r, keys, &cur);
    int rc = 0;
    unsigned k = cur;
    if (!enc) {
        for (k = 0; k < TICKET_KEYS; k++)
            if (keys[k][TICKET_VALID_WORD] && memcmp(keys[k], key_name, 16) == 0)
                break;
        if (k == TICKET_KEYS)
            goto out; /* unknown or dropped key: a full handshake */
    }
    const unsigned char *kb = (const unsigned char *)keys[k];
    OSSL_PARAM params[3] = {
        OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_KEY, (void *)(kb + 48), 32),
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_end(),
    };
    if (enc) {
        memcpy(key_name, kb, 16);
        if (RAND_bytes(iv, 16) != 1 ||
            !EVP_EncryptInit_ex(cctx, EVP_aes_256_cbc(), NULL, kb + 16, iv) ||
            !EVP_MAC_CTX_set_params(hctx, params)) {
            rc = -1;
            goto out;
        }
        rc = 1;
    } else {
        if (!EVP_MAC_CTX_set_params(hctx, params) ||
            !EVP_DecryptInit_ex(cctx, EVP_aes_256_cbc(), NULL, kb + 16, iv)) {
            rc = -1;
            goto out;
        }
        rc = k == cur ? 1 : 2; /* 2: valid, re-issue under the current key */
    }
out:
    OPENSSL_cleanse(keys, sizeof(keys));
    return rc;
}

static int ocsp_cb(SSL *ssl, void *arg)
{
    sl_tls_server_t *srv = arg;
    X509 *x = SSL_get_certificate(ssl);
    if (!srv->ocsp_der || !x || X509_cmp(x, srv->ocsp_cert->pem.leaf) != 0)
        return SSL_TLSEXT_ERR_NOACK;
    unsigned char *copy = OPENSSL_malloc(srv->ocsp_len); /* OpenSSL frees it */
    if (!copy)
        return SSL_TLSEXT_ERR_NOACK;
    memcpy(copy, srv->ocsp_der, srv->ocsp_len);
    SSL_set_tlsext_status_ocsp_resp(ssl, copy, (long)srv->ocsp_len);
    return SSL_TLSEXT_ERR_OK;
}

/* ---- building ------------------------------------------------------------- */

#define BUILD_FAIL(...)                                                                            \
    do {                                                                                           \
        snprintf(err, errlen, __VA_ARGS__);                                                        \
        goto fail;                                                                                 \
    } while (0)

/* Reads a whole file of at most max bytes; NUL-terminated. */
static char *read_file(const char *path, size_t max, size_t *len, char *why, size_t whylen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, whylen, "%s", strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size > max) {
        snprintf(why, whylen, "not a regular file of at most %zu bytes", max);
        close(fd);
        return NULL;
    }
    char *buf = malloc((size_t)st.st_size + 1);
    size_t got = 0;
    while (buf && got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
        if (n <= 0) {
            snprintf(why, whylen, "%s", n < 0 ? strerror(errno) : "file shrank while read");
            free(buf);
            buf = NULL;
            break;
        }
        got += (size_t)n;
    }
    close(fd);
    if (!buf) {
        if (!why[0])
            snprintf(why, whylen, "out of memory");
        return NULL;
    }
    buf[got] = '\0';
    *len = got;
    return buf;
}

static const Sluice__V1__TlsCertificate *find_cert(const Sluice__V1__Snapshot *snap,
                                                   const char *name)
{
    for (size_t i = 0; i < snap->n_certificates; i++)
        if (strcmp(snap->certificates[i]->name, name) == 0)
            return snap->certificates[i];
    return NULL;
}

static int load_cert(cert_t *c, const Sluice__V1__TlsCertificate *tc, char *err, size_t errlen)
{
    const char *chain = tc->chain_pem, *key = tc->private_key_pem;
    size_t chain_len = strlen(chain), key_len = strlen(key);
    char *chain_buf = NULL, *key_buf = NULL, why[256] = "";
    bool from_file = tc->chain_file[0] != '\0';
    int rc = -1;
    if (from_file) {
        chain = chain_buf =
            read_file(tc->chain_file, SL_PEM_MAX_BYTES, &chain_len, why, sizeof(why));
        if (!chain_buf)
            BUILD_FAIL("certificate %s: file.certificate %s: %s", tc->name, tc->chain_file, why);
        key = key_buf =
            read_file(tc->private_key_file, SL_PEM_MAX_BYTES, &key_len, why, sizeof(why));
        if (!key_buf)
            BUILD_FAIL("certificate %s: file.privateKey %s: %s", tc->name, tc->private_key_file,
                       why);
    }
    sl_pem_field_t f;
    char msg[512];
    if (sl_pem_load(&c->pem, chain, chain_len, key, key_len, SL_PEM_CHECK_VALIDITY,
                    (int64_t)time(NULL), &f, msg, sizeof(msg)) != 0) {
        if (from_file)
            BUILD_FAIL("certificate %s: file.%s %s: %s", tc->name, sl_pem_field_name(f),
                       f == SL_PEM_FIELD_PRIVATE_KEY ? tc->private_key_file : tc->chain_file, msg);
        BUILD_FAIL("certificate %s: spec.%s: %s", tc->name, sl_pem_field_name(f), msg);
    }
    rc = 0;
fail:
    if (key_buf) {
        OPENSSL_cleanse(key_buf, key_len);
        free(key_buf);
    }
    free(chain_buf);
    return rc;
}

static bool same_names(const sl_pem_cert_t *a, const sl_pem_cert_t *b)
{
    if (a->n_names != b->n_names)
        return false;
    for (size_t i = 0; i < a->n_names; i++) {
        bool found = false;
        for (size_t j = 0; j < b->n_names && !found; j++)
            found = strcmp(a->names[i], b->names[j]) == 0;
        if (!found)
            return false;
    }
    return true;
}

static X509_STORE *load_ca_store(const char *pem, size_t len, STACK_OF(X509_NAME) * *names)
{
    BIO *b = BIO_new_mem_buf(pem, (int)len);
    STACK_OF(X509_INFO) *infos = b ? PEM_X509_INFO_read_bio(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    X509_STORE *store = X509_STORE_new();
    *names = sk_X509_NAME_new_null();
    int n = 0;
    for (int i = 0; infos && store && *names && i < sk_X509_INFO_num(infos); i++) {
        X509_INFO *xi = sk_X509_INFO_value(infos, i);
        if (!xi->x509)
            continue;
        if (!X509_STORE_add_cert(store, xi->x509))
            continue;
        X509_NAME *nm = X509_NAME_dup(X509_get_subject_name(xi->x509));
        if (nm && !sk_X509_NAME_push(*names, nm))
            X509_NAME_free(nm);
        n++;
    }
    sk_X509_INFO_pop_free(infos, X509_INFO_free);
    ERR_clear_error();
    if (n == 0 || !store || !*names) {
        X509_STORE_free(store);
        sk_X509_NAME_pop_free(*names, X509_NAME_free);
        *names = NULL;
        return NULL;
    }
    return store;
}

/* The session id context: sessions resume only on the same listener with
 * the same client-certificate trust, so a session authenticated under an
 * old CA bundle is not resumed after the bundle changes. */
static void session_id_context(const Sluice__V1__Listener *l, const char *ca_pem, size_t ca_len,
                               unsigned char out[32])
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned int n = 0;
    unsigned char mode = (unsigned char)l->tls->client_auth;
    if (!md || !EVP_DigestInit_ex(md, EVP_sha256(), NULL) ||
        !EVP_DigestUpdate(md, l->name, strlen(l->name) + 1) || !EVP_DigestUpdate(md, &mode, 1) ||
        !EVP_DigestUpdate(md, ca_pem ? ca_pem : "", ca_len) || !EVP_DigestFinal_ex(md, out, &n))
        memset(out, 0, 32);
    EVP_MD_CTX_free(md);
}

typedef struct {
    X509_STORE *store;
    STACK_OF(X509_NAME) * ca_names;
    unsigned char sid[32];
} common_t;

static int configure_ctx(sl_tls_server_t *srv, SSL_CTX *ctx, const Sluice__V1__ListenerTls *t,
                         const common_t *cm, char *err, size_t errlen)
{
    SSL_CTX_set_ex_data(ctx, idx_srv, srv);
    if (!SSL_CTX_set_min_proto_version(
            ctx, t->min_version == SLUICE__V1__LISTENER_TLS__VERSION__TLS1_3 ? TLS1_3_VERSION
                                                                             : TLS1_2_VERSION))
        BUILD_FAIL("tls.minVersion: refused by OpenSSL");
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                                 SSL_OP_NO_COMPRESSION | SSL_OP_IGNORE_UNEXPECTED_EOF |
                                 (t->session_tickets ? 0 : SSL_OP_NO_TICKET));
    /* Partial writes and a movable buffer suit a codec that writes from a
     * ring; released buffers keep an idle keep-alive connection ~34 KB
     * smaller (nginx does the same). */
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                              SSL_MODE_RELEASE_BUFFERS);
    if (t->cipher_suites[0] && !SSL_CTX_set_ciphersuites(ctx, t->cipher_suites))
        BUILD_FAIL("tls.cipherSuites: OpenSSL knows none of \"%.200s\"", t->cipher_suites);
    if (t->ciphers[0] && !SSL_CTX_set_cipher_list(ctx, t->ciphers))
        BUILD_FAIL("tls.ciphers: OpenSSL knows none of \"%.200s\"", t->ciphers);
    if (t->groups[0] && !SSL_CTX_set1_groups_list(ctx, t->groups))
        BUILD_FAIL("tls.groups: OpenSSL refuses \"%.200s\"", t->groups);
    SSL_CTX_set_session_id_context(ctx, cm->sid, sizeof(cm->sid));
    if (t->session_cache) {
        SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_SERVER);
        SSL_CTX_sess_set_cache_size(ctx, t->session_cache_size);
    } else {
        SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    }
    SSL_CTX_set_timeout(ctx, t->ticket_rotation_s ? (long)t->ticket_rotation_s : 300);
    if (t->session_tickets)
        SSL_CTX_set_tlsext_ticket_key_evp_cb(ctx, ticket_cb);
    SSL_CTX_set_tlsext_servername_callback(ctx, servername_cb);
    SSL_CTX_set_tlsext_servername_arg(ctx, srv);
    SSL_CTX_set_alpn_select_cb(ctx, alpn_cb, srv);
    if (srv->ocsp_der) {
        SSL_CTX_set_tlsext_status_cb(ctx, ocsp_cb);
        SSL_CTX_set_tlsext_status_arg(ctx, srv);
    }
    if (cm->store) {
        if (!X509_STORE_up_ref(cm->store))
            BUILD_FAIL("out of memory");
        SSL_CTX_set_cert_store(ctx, cm->store);
        STACK_OF(X509_NAME) *names = SSL_dup_CA_list(cm->ca_names);
        if (!names)
            BUILD_FAIL("out of memory");
        SSL_CTX_set_client_CA_list(ctx, names);
        int mode = SSL_VERIFY_PEER;
        if (t->client_auth == SLUICE__V1__LISTENER_TLS__CLIENT_AUTH__CLIENT_AUTH_REQUIRED)
            mode |= SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
        SSL_CTX_set_verify(ctx, mode, NULL);
        SSL_CTX_set_verify_depth(ctx, t->verify_depth ? (int)t->verify_depth : 3);
    }
    return 0;
fail:
    return -1;
}

static int add_cert_to_ctx(SSL_CTX *ctx, const cert_t *c, char *err, size_t errlen)
{
    ERR_clear_error();
    if (SSL_CTX_use_certificate(ctx, c->pem.leaf) != 1 ||
        SSL_CTX_set1_chain(ctx, c->pem.chain) != 1 ||
        SSL_CTX_use_PrivateKey(ctx, c->pem.key) != 1) {
        unsigned long e = ERR_peek_last_error();
        char why[160];
        ERR_error_string_n(e, why, sizeof(why));
        ERR_clear_error();
        snprintf(err, errlen, "certificate %s: OpenSSL refuses it (%s)", c->name, why);
        return -1;
    }
    return 0;
}

static int build_sni(sl_tls_server_t *srv, char *err, size_t errlen)
{
    size_t total = 0;
    for (size_t g = 0; g < srv->ngroups; g++)
        total += srv->groups[g].first->pem.n_names;
    srv->exact = calloc(total ? total : 1, sizeof(*srv->exact));
    srv->wild = calloc(total ? total : 1, sizeof(*srv->wild));
    if (!srv->exact || !srv->wild) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (size_t g = 0; g < srv->ngroups; g++) {
        const sl_pem_cert_t *p = &srv->groups[g].first->pem;
        for (size_t i = 0; i < p->n_names; i++) {
            const char *n = p->names[i];
            if (strncmp(n, "*.", 2) == 0)
                srv->wild[srv->nwild++] = (sni_entry_t){n + 2, g};
            else if (!strchr(n, '*'))
                srv->exact[srv->nexact++] = (sni_entry_t){n, g};
        }
    }
    /* Sorted by name, then group: the first group (certificateRefs order)
     * that lists a name keeps it. */
    sni_entry_t *tabs[2] = {srv->exact, srv->wild};
    size_t *counts[2] = {&srv->nexact, &srv->nwild};
    for (int t = 0; t < 2; t++) {
        qsort(tabs[t], *counts[t], sizeof(sni_entry_t), cmp_sni);
        size_t w = 0;
        for (size_t i = 0; i < *counts[t]; i++)
            if (w == 0 || strcmp(tabs[t][w - 1].name, tabs[t][i].name) != 0)
                tabs[t][w++] = tabs[t][i];
        *counts[t] = w;
    }
    return 0;
}

static int load_ocsp(sl_tls_server_t *srv, const char *path, char *err, size_t errlen)
{
    char why[256] = "";
    size_t len = 0;
    char *der = read_file(path, SL_PEM_MAX_BYTES, &len, why, sizeof(why));
    if (!der) {
        snprintf(err, errlen, "tls.ocspStapleFile %s: %s", path, why);
        return -1;
    }
    const unsigned char *p = (const unsigned char *)der;
    OCSP_RESPONSE *resp = d2i_OCSP_RESPONSE(NULL, &p, (long)len);
    OCSP_BASICRESP *bs = resp ? OCSP_response_get1_basic(resp) : NULL;
    int rc = -1;
    if (!resp || OCSP_response_status(resp) != OCSP_RESPONSE_STATUS_SUCCESSFUL || !bs) {
        snprintf(err, errlen,
                 "tls.ocspStapleFile %s: not a successful DER OCSP response (openssl ocsp "
                 "-respout writes one)",
                 path);
        goto out;
    }
    /* The response must be about one of the listener's certificates (serial
     * and, when the chain holds the issuer, the issuer too) and current. */
    for (size_t i = 0; i < srv->ncerts && !srv->ocsp_cert; i++) {
        const cert_t *c = &srv->certs[i];
        for (int k = 0; k < OCSP_resp_count(bs); k++) {
            OCSP_SINGLERESP *single = OCSP_resp_get0(bs, k);
            const OCSP_CERTID *id = OCSP_SINGLERESP_get0_id(single);
            ASN1_INTEGER *serial = NULL;
            OCSP_id_get0_info(NULL, NULL, NULL, &serial, (OCSP_CERTID *)id);
            if (!serial || ASN1_INTEGER_cmp(serial, X509_get0_serialNumber(c->pem.leaf)) != 0)
                continue;
            if (sk_X509_num(c->pem.chain) > 0) {
                /* Serials are unique per issuer only: with the issuer at
                 * hand, the whole CertID must match. */
                OCSP_CERTID *want =
                    OCSP_cert_to_id(NULL, c->pem.leaf, sk_X509_value(c->pem.chain, 0));
                bool same = want && OCSP_id_cmp(want, id) == 0;
                OCSP_CERTID_free(want);
                if (!same)
                    continue;
            }
            ASN1_GENERALIZEDTIME *thisupd = NULL, *nextupd = NULL;
            int reason = 0;
            int status = OCSP_single_get0_status(single, &reason, NULL, &thisupd, &nextupd);
            if (status != V_OCSP_CERTSTATUS_GOOD) {
                snprintf(err, errlen, "tls.ocspStapleFile %s: certificate %s is not 'good' in it",
                         path, c->name);
                goto out;
            }
            if (!OCSP_check_validity(thisupd, nextupd, 300, -1)) {
                snprintf(err, errlen,
                         "tls.ocspStapleFile %s: the response is stale or not yet valid "
                         "(fetch a new one)",
                         path);
                goto out;
            }
            srv->ocsp_cert = c;
            break;
        }
    }
    if (!srv->ocsp_cert) {
        snprintf(err, errlen,
                 "tls.ocspStapleFile %s: the response is about none of the listener's "
                 "certificates",
                 path);
        goto out;
    }
    srv->ocsp_der = (unsigned char *)der;
    srv->ocsp_len = len;
    der = NULL;
    rc = 0;
out:
    OCSP_BASICRESP_free(bs);
    OCSP_RESPONSE_free(resp);
    free(der);
    ERR_clear_error();
    return rc;
}

sl_tls_server_t *sl_tls_server_build(const Sluice__V1__Listener *l,
                                     const Sluice__V1__Snapshot *snap, unsigned flags, char *err,
                                     size_t errlen)
{
    char inner[768] = "";
    const size_t ilen = sizeof(inner);
    pthread_once(&idx_once, init_indexes);
    if (idx_srv < 0 || idx_owner < 0) {
        snprintf(err, errlen, "listener %s: OpenSSL ex_data indexes unavailable", l->name);
        return NULL;
    }
    const Sluice__V1__ListenerTls *t = l->tls;
    if (!t || t->n_certificates == 0) {
        snprintf(err, errlen, "listener %s: https needs tls.certificateRefs", l->name);
        return NULL;
    }
    common_t cm = {0};
    char *ca_buf = NULL;
    sl_tls_server_t *srv = calloc(1, sizeof(*srv));
    if (!srv || !(srv->listener = strdup(l->name)))
        goto oom;
    srv->certs = calloc(t->n_certificates, sizeof(*srv->certs));
    srv->groups = calloc(t->n_certificates, sizeof(*srv->groups));
    if (!srv->certs || !srv->groups)
        goto oom;

    /* Certificates, grouped by their set of names. */
    for (size_t i = 0; i < t->n_certificates; i++) {
        const Sluice__V1__TlsCertificate *tc = find_cert(snap, t->certificates[i]);
        if (!tc) {
            snprintf(inner, ilen, "certificate %s is not in the snapshot", t->certificates[i]);
            goto fail;
        }
        cert_t *c = &srv->certs[srv->ncerts];
        if (!(c->name = strdup(tc->name)))
            goto oom;
        srv->ncerts++;
        if (load_cert(c, tc, inner, ilen) != 0)
            goto fail;
        size_t g = 0;
        while (g < srv->ngroups && !same_names(&srv->groups[g].first->pem, &c->pem))
            g++;
        if (g == srv->ngroups)
            srv->groups[srv->ngroups++] = (group_t){NULL, c, 0};
        unsigned bit = 1u << c->pem.key_type;
        /* RSA and ECDSA side by side; two of one type for the same names
         * would leave one unreachable. ECDSA P-256 and P-384 share a slot. */
        unsigned slot = c->pem.key_type == SL_PEM_KEY_EC_P384 ? 1u << SL_PEM_KEY_EC_P256 : bit;
        if (srv->groups[g].key_types & slot) {
            snprintf(inner, ilen,
                     "certificate %s has the same names and key type as %s; a listener serves "
                     "one certificate per key type and name (remove one, or pair RSA with ECDSA)",
                     c->name, srv->groups[g].first->name);
            goto fail;
        }
        srv->groups[g].key_types |= slot;
        c->group = g;
    }

    /* Client certificates: the trust anchors and the names sent in the
     * CertificateRequest. */
    const char *ca_pem = NULL;
    size_t ca_len = 0;
    if (t->client_auth != SLUICE__V1__LISTENER_TLS__CLIENT_AUTH__CLIENT_AUTH_NONE) {
        char why[256] = "";
        if (t->client_ca_file[0]) {
            ca_pem = ca_buf =
                read_file(t->client_ca_file, SL_PEM_MAX_BYTES, &ca_len, why, sizeof(why));
            if (!ca_buf) {
                snprintf(inner, ilen, "tls.clientAuth.caFile %s: %s", t->client_ca_file, why);
                goto fail;
            }
        } else {
            ca_pem = t->client_ca_pem;
            ca_len = strlen(ca_pem);
        }
        cm.store = load_ca_store(ca_pem, ca_len, &cm.ca_names);
        if (!cm.store) {
            snprintf(inner, ilen, "tls.clientAuth: no CA certificate could be read from %s",
                     t->client_ca_file[0] ? "caFile" : "caBundle");
            goto fail;
        }
    }
    session_id_context(l, ca_pem, ca_len, cm.sid);

    /* ALPN, in wire format; h2 dropped when the caller cannot speak it. */
    for (size_t i = 0; i < t->n_alpn; i++) {
        size_t n = strlen(t->alpn[i]);
        if ((flags & SL_TLS_NO_H2) && strcmp(t->alpn[i], "h2") == 0)
            continue;
        if (n == 0 || n > 255 || srv->alpn_len + 1 + n > sizeof(srv->alpn)) {
            snprintf(inner, ilen, "tls.alpn: '%.40s' does not fit", t->alpn[i]);
            goto fail;
        }
        srv->alpn[srv->alpn_len++] = (unsigned char)n;
        memcpy(srv->alpn + srv->alpn_len, t->alpn[i], n);
        srv->alpn_len += n;
    }
    if (srv->alpn_len == 0) {
        memcpy(srv->alpn, "\x08http/1.1", 9);
        srv->alpn_len = 9;
    }

    if (t->session_tickets &&
        !(srv->ring = ring_acquire(l->name, t->ticket_rotation_s ? t->ticket_rotation_s : 43200)))
        goto oom;
    if (t->ocsp_staple_file[0] && load_ocsp(srv, t->ocsp_staple_file, inner, ilen) != 0)
        goto fail;

    for (size_t g = 0; g < srv->ngroups; g++) {
        SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
        if (!ctx)
            goto oom;
        srv->groups[g].ctx = ctx;
        if (configure_ctx(srv, ctx, t, &cm, inner, ilen) != 0)
            goto fail;
        for (size_t i = 0; i < srv->ncerts; i++)
            if (srv->certs[i].group == g && add_cert_to_ctx(ctx, &srv->certs[i], inner, ilen) != 0)
                goto fail;
    }
    if (build_sni(srv, inner, ilen) != 0)
        goto fail;
    srv->front = srv->groups[0].ctx;
    /* From here the front context owns the server (owner_free). */
    if (!SSL_CTX_set_ex_data(srv->front, idx_owner, srv))
        goto oom;
    X509_STORE_free(cm.store);
    sk_X509_NAME_pop_free(cm.ca_names, X509_NAME_free);
    free(ca_buf);
    ERR_clear_error();
    return srv;

oom:
    snprintf(inner, ilen, "out of memory");
fail:
    snprintf(err, errlen, "listener %s: %s", l->name, inner);
    X509_STORE_free(cm.store);
    sk_X509_NAME_pop_free(cm.ca_names, X509_NAME_free);
    free(ca_buf);
    if (srv)
        server_destroy(srv, true);
    ERR_clear_error();
    return NULL;
}

/* ---- connections ------------------------------------------------------------ */

SSL *sl_tls_server_ssl_new(sl_tls_server_t *srv, int fd)
{
    SSL *ssl = SSL_new(srv->front);
    if (!ssl)
        goto fail;
    if (!SSL_set_fd(ssl, fd)) {
        SSL_free(ssl);
        goto fail;
    }
    SSL_set_accept_state(ssl);
    return ssl;
fail:
    ERR_clear_error();
    return NULL;
}

int sl_tls_handshake(SSL *ssl, int *want)
{
    ERR_clear_error();
    int rc = SSL_do_handshake(ssl);
    if (rc == 1)
        return SL_OK;
    switch (SSL_get_error(ssl, rc)) {
    case SSL_ERROR_WANT_READ:
        *want = SL_TLS_WANT_READ;
        return SL_AGAIN;
    case SSL_ERROR_WANT_WRITE:
        *want = SL_TLS_WANT_WRITE;
        return SL_AGAIN;
    default:
        ERR_clear_error();
        return SL_ERROR;
    }
}

/* The common tail of read and write: -1 with errno, *want on EAGAIN. */
static ssize_t io_error(SSL *ssl, int rc, int *want, int closed_errno)
{
    int saved = errno;
    int e = SSL_get_error(ssl, rc);
    ERR_clear_error();
    switch (e) {
    case SSL_ERROR_WANT_READ:
        *want = SL_TLS_WANT_READ;
        errno = EAGAIN;
        return -1;
    case SSL_ERROR_WANT_WRITE:
        *want = SL_TLS_WANT_WRITE;
        errno = EAGAIN;
        return -1;
    case SSL_ERROR_ZERO_RETURN:
        if (!closed_errno)
            return 0;
        errno = closed_errno;
        return -1;
    case SSL_ERROR_SYSCALL:
        if (!saved && !closed_errno)
            return 0; /* EOF on a read */
        errno = saved ? saved : closed_errno;
        return -1;
    default:
        errno = EPROTO;
        return -1;
    }
}

ssize_t sl_tls_read(SSL *ssl, void *buf, size_t len, int *want)
{
    size_t n = 0;
    ERR_clear_error();
    errno = 0;
    if (SSL_read_ex(ssl, buf, len, &n) == 1)
        return (ssize_t)n;
    return io_error(ssl, 0, want, 0);
}

ssize_t sl_tls_write(SSL *ssl, const void *buf, size_t len, int *want)
{
    size_t n = 0;
    if (len == 0)
        return 0;
    ERR_clear_error();
    errno = 0;
    if (SSL_write_ex(ssl, buf, len, &n) == 1)
        return (ssize_t)n;
    return io_error(ssl, 0, want, EPIPE);
}

int sl_tls_shutdown(SSL *ssl, int *want)
{
    ERR_clear_error();
    int rc = SSL_shutdown(ssl);
    if (rc >= 0)
        return SL_OK; /* 0: our close_notify is sent; the peer's is not awaited */
    int e = SSL_get_error(ssl, rc);
    ERR_clear_error();
    if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) {
        *want = e == SSL_ERROR_WANT_WRITE ? SL_TLS_WANT_WRITE : SL_TLS_WANT_READ;
        return SL_AGAIN;
    }
    return SL_ERROR;
}

bool sl_tls_has_pending(const SSL *ssl)
{
    return SSL_has_pending(ssl) == 1;
}

sl_tls_alpn_t sl_tls_alpn(const SSL *ssl)
{
    const unsigned char *p = NULL;
    unsigned int n = 0;
    SSL_get0_alpn_selected(ssl, &p, &n);
    if (n == 2 && memcmp(p, "h2", 2) == 0)
        return SL_TLS_ALPN_H2;
    if (n == 8 && memcmp(p, "http/1.1", 8) == 0)
        return SL_TLS_ALPN_HTTP11;
    return SL_TLS_ALPN_NONE;
}

/* ---- the client's certificate ---------------------------------------------- */

typedef struct {
    char *buf;
    size_t cap, len;
    bool *truncated;
} out_t;

static void put_bytes(out_t *o, const unsigned char *s, size_t n, bool escape_comma)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = s[i];
        char esc[5];
        size_t k = 1;
        esc[0] = (char)ch;
        if (ch < 0x20 || ch > 0x7e || ch == '"' || ch == '\\' || (escape_comma && ch == ',')) {
            snprintf(esc, sizeof(esc), "\\x%02x", ch);
            k = 4;
        }
        if (o->len + k + 1 > o->cap) {
            *o->truncated = true;
            return;
        }
        memcpy(o->buf + o->len, esc, k);
        o->len += k;
        o->buf[o->len] = '\0';
    }
}

static void put_str(out_t *o, const char *s)
{
    put_bytes(o, (const unsigned char *)s, strlen(s), false);
}

int sl_tls_peer(const SSL *ssl, sl_tls_peer_t *out)
{
    memset(out, 0, sizeof(*out));
    X509 *x = SSL_get0_peer_certificate(ssl);
    if (!x || SSL_get_verify_result(ssl) != X509_V_OK)
        return SL_DECLINED;
    unsigned char md[32];
    unsigned int mdlen = 0;
    if (!X509_digest(x, EVP_sha256(), md, &mdlen) || mdlen != 32) {
        ERR_clear_error();
        return SL_ERROR;
    }
    for (unsigned i = 0; i < 32; i++)
        snprintf(out->sha256_hex + 2 * i, 3, "%02x", md[i]);

    out_t o = {out->subject, sizeof(out->subject), 0, &out->truncated};
    BIO *b = BIO_new(BIO_s_mem());
    if (b && X509_NAME_print_ex(b, X509_get_subject_name(x), 0, XN_FLAG_RFC2253) >= 0) {
        char *p;
        long n = BIO_get_mem_data(b, &p);
        put_bytes(&o, (const unsigned char *)p, (size_t)n, false);
    }
    BIO_free(b);

    o = (out_t){out->sans, sizeof(out->sans), 0, &out->truncated};
    GENERAL_NAMES *sans = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
    for (int i = 0; sans && i < sk_GENERAL_NAME_num(sans); i++) {
        const GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, i);
        const char *tag = NULL;
        const ASN1_STRING *v = NULL;
        char ip[64] = "";
        switch (g->type) {
        case GEN_DNS:
            tag = "DNS:", v = g->d.dNSName;
            break;
        case GEN_URI:
            tag = "URI:", v = g->d.uniformResourceIdentifier;
            break;
        case GEN_EMAIL:
            tag = "email:", v = g->d.rfc822Name;
            break;
        case GEN_IPADD: {
            tag = "IP:";
            const unsigned char *a = ASN1_STRING_get0_data(g->d.iPAddress);
            int n = ASN1_STRING_length(g->d.iPAddress);
            if (n == 4)
                snprintf(ip, sizeof(ip), "%u.%u.%u.%u", a[0], a[1], a[2], a[3]);
            else if (n == 16)
                for (int k = 0; k < 16; k += 2)
                    snprintf(ip + strlen(ip), sizeof(ip) - strlen(ip), "%s%x", k ? ":" : "",
                             (unsigned)(a[k] << 8 | a[k + 1]));
            break;
        }
        default:
            continue;
        }
        if (o.len)
            put_str(&o, ",");
        put_str(&o, tag);
        if (v)
            put_bytes(&o, ASN1_STRING_get0_data(v), (size_t)ASN1_STRING_length(v), true);
        else
            put_str(&o, ip);
    }
    GENERAL_NAMES_free(sans);
    ERR_clear_error();
    return SL_OK;
}

const char *sl_tls_certificate_name(const SSL *ssl)
{
    sl_tls_server_t *srv = server_of(ssl);
    X509 *x = SSL_get_certificate(ssl);
    if (!srv || !x)
        return NULL;
    for (size_t i = 0; i < srv->ncerts; i++)
        if (X509_cmp(x, srv->certs[i].pem.leaf) == 0)
            return srv->certs[i].name;
    return NULL;
}

/* ---- expiry ------------------------------------------------------------------ */

size_t sl_tls_server_certificates(const sl_tls_server_t *srv, sl_tls_cert_expiry_t *out, size_t cap)
{
    for (size_t i = 0; i < srv->ncerts && i < cap; i++)
        out[i] = (sl_tls_cert_expiry_t){srv->certs[i].name, srv->certs[i].pem.not_after_unix};
    return srv->ncerts;
}

int sl_tls_publish_expiry(sl_tls_server_t *const *servers, size_t n)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += servers[i] ? servers[i]->ncerts : 0; /* NULL: a listener without TLS */
    const char **names = calloc(total ? total : 1, sizeof(*names));
    int64_t *not_after = calloc(total ? total : 1, sizeof(*not_after));
    size_t k = 0;
    int rc = SL_ERROR;
    if (!names || !not_after)
        goto out;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; servers[i] && j < servers[i]->ncerts; j++) {
            const cert_t *c = &servers[i]->certs[j];
            size_t m = 0;
            while (m < k && strcmp(names[m], c->name) != 0)
                m++;
            if (m == k) {
                names[k] = c->name;
                not_after[k++] = c->pem.not_after_unix;
            }
        }
    }
    rc = sl_metrics_set_certificates(names, not_after, k) == 0 ? SL_OK : SL_ERROR;
out:
    free(names);
    free(not_after);
    return rc;
}

ssize_t sl_io_read(int fd, SSL *ssl, void *buf, size_t len, uint8_t *other_way)
{
    if (!ssl)
        return read(fd, buf, len);
    int want = 0;
    ssize_t r = sl_tls_read(ssl, buf, len, &want);
    *other_way = r < 0 && errno == EAGAIN && want == SL_TLS_WANT_WRITE;
    return r;
}

ssize_t sl_io_write(int fd, SSL *ssl, const void *buf, size_t len, uint8_t *other_way)
{
    if (!ssl)
        return write(fd, buf, len);
    int want = 0;
    ssize_t r = sl_tls_write(ssl, buf, len, &want);
    *other_way = r < 0 && errno == EAGAIN && want == SL_TLS_WANT_READ;
    return r;
}
