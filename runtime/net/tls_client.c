/*
 * TLS to upstreams (tls_client.h).
 */
#include "tls_client.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <string.h>

/* The OpenSSL error behind a failure, for messages (never key bytes). */
static const char *ssl_reason(void)
{
    unsigned long e = ERR_peek_last_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    return r ? r : "unknown error";
}

static int load_ca_pem(SSL_CTX *ctx, const char *pem)
{
    BIO *bio = BIO_new_mem_buf(pem, -1);
    if (!bio)
        return -1;
    X509_STORE *store = SSL_CTX_get_cert_store(ctx);
    int n = 0;
    X509 *x;
    while ((x = PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL) {
        if (X509_STORE_add_cert(store, x) == 1)
            n++;
        X509_free(x);
    }
    ERR_clear_error(); /* the end of the PEM text reads as an error */
    BIO_free(bio);
    return n > 0 ? 0 : -1;
}

static int use_client_certificate(SSL_CTX *ctx, const Sluice__V1__TlsCertificate *t)
{
    if (t->chain_file && *t->chain_file) {
        if (SSL_CTX_use_certificate_chain_file(ctx, t->chain_file) != 1 ||
            SSL_CTX_use_PrivateKey_file(ctx, t->private_key_file, SSL_FILETYPE_PEM) != 1)
            return -1;
        return SSL_CTX_check_private_key(ctx) == 1 ? 0 : -1;
    }
    BIO *bio = BIO_new_mem_buf(t->chain_pem, -1);
    if (!bio)
        return -1;
    int rc = -1;
    X509 *leaf = PEM_read_bio_X509(bio, NULL, NULL, NULL);
    if (!leaf || SSL_CTX_use_certificate(ctx, leaf) != 1)
        goto out;
    X509 *ca;
    while ((ca = PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL)
        if (SSL_CTX_add_extra_chain_cert(ctx, ca) != 1) {
            X509_free(ca);
            goto out;
        }
    ERR_clear_error();
    BIO *kbio = BIO_new_mem_buf(t->private_key_pem, -1);
    EVP_PKEY *key = kbio ? PEM_read_bio_PrivateKey(kbio, NULL, NULL, NULL) : NULL;
    BIO_free(kbio);
    if (key && SSL_CTX_use_PrivateKey(ctx, key) == 1 && SSL_CTX_check_private_key(ctx) == 1)
        rc = 0;
    EVP_PKEY_free(key);
out:
    X509_free(leaf);
    BIO_free(bio);
    return rc;
}

SSL_CTX *sl_tls_client_ctx_build(const Sluice__V1__Cluster *cl, const Sluice__V1__Snapshot *snap,
                                 char *err, size_t errlen)
{
    const Sluice__V1__UpstreamTls *t = cl->tls;
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        snprintf(err, errlen, "backend %s: out of memory for TLS", cl->name);
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    /* Renegotiation is never wanted on a proxy's upstream connections. */
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION);
    /* The protocol the Backend speaks, and only that: an HTTP/2 Backend
     * that cannot agree on h2 is a failed handshake, not HTTP/1.1. */
    static const unsigned char alpn_h1[] = "\x08http/1.1";
    static const unsigned char alpn_h2[] = "\x02h2";
    if (cl->protocol == SLUICE__V1__CLUSTER__PROTOCOL__H2)
        SSL_CTX_set_alpn_protos(ctx, alpn_h2, sizeof(alpn_h2) - 1);
    else
        SSL_CTX_set_alpn_protos(ctx, alpn_h1, sizeof(alpn_h1) - 1);
    if (t->ca_pem && *t->ca_pem) {
        if (load_ca_pem(ctx, t->ca_pem) != 0) {
            snprintf(err, errlen, "backend %s: spec.tls.caBundle: no certificate could be loaded",
                     cl->name);
            goto fail;
        }
    } else if (t->ca_file && *t->ca_file) {
        if (SSL_CTX_load_verify_locations(ctx, t->ca_file, NULL) != 1) {
            snprintf(err, errlen, "backend %s: spec.tls.caFile %s: %s (a readable PEM file)",
                     cl->name, t->ca_file, ssl_reason());
            goto fail;
        }
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        snprintf(err, errlen, "backend %s: the system's CA certificates could not be loaded: %s",
                 cl->name, ssl_reason());
        goto fail;
    }
    if (t->client_certificate && *t->client_certificate) {
        const Sluice__V1__TlsCertificate *cert = NULL;
        for (size_t i = 0; i < snap->n_certificates && !cert; i++)
            if (strcmp(snap->certificates[i]->name, t->client_certificate) == 0)
                cert = snap->certificates[i];
        if (!cert || use_client_certificate(ctx, cert) != 0) {
            snprintf(err, errlen,
                     "backend %s: spec.tls.clientCertificateRef: Certificate %s cannot be used "
                     "as a client certificate (%s)",
                     cl->name, t->client_certificate, cert ? ssl_reason() : "not in the snapshot");
            goto fail;
        }
    }
    ERR_clear_error();
    return ctx;
fail:
    ERR_clear_error();
    SSL_CTX_free(ctx);
    return NULL;
}

SSL *sl_tls_client_ssl_new(SSL_CTX *ctx, int fd, const char *name)
{
    SSL *ssl = SSL_new(ctx);
    if (!ssl)
        return NULL;
    if (SSL_set_fd(ssl, fd) != 1)
        goto fail;
    SSL_set_connect_state(ssl);
    SSL_set_mode(ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    unsigned char ip[16];
    int is_ip = inet_pton(AF_INET, name, ip) == 1 || inet_pton(AF_INET6, name, ip) == 1;
    X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
    if (is_ip) {
        if (X509_VERIFY_PARAM_set1_ip_asc(param, name) != 1)
            goto fail;
    } else {
        X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        if (SSL_set1_host(ssl, name) != 1 || SSL_set_tlsext_host_name(ssl, name) != 1)
            goto fail;
    }
    return ssl;
fail:
    ERR_clear_error();
    SSL_free(ssl);
    return NULL;
}
