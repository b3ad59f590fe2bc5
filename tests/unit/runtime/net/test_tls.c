/*
 * Unit tests of runtime/net/tls.c: real TLS handshakes between a server made
 * by sl_tls_server_build and an OpenSSL client, over non-blocking socket
 * pairs driven in one thread. Certificates are made at test time
 * (tests/unit/common/tls_testcerts.h).
 *
 * Covered: SNI (exact, wildcard, default, case), RSA vs ECDSA by the
 * client's signature algorithms, minimum version, ALPN (server preference,
 * h2 removed, no overlap), resumption with a ticket across two builds and
 * after rotations, client certificates required/optional, build errors
 * (expired, mismatched key, duplicate key type, unknown cipher, files),
 * OCSP stapling, read/write/shutdown results, expiry data.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tls.h"

#include "admin.h"
#include "compiler.h"
#include "pbjson.h"

#include "common/tls_testcerts.h"
#include "metrics.h"

#include <errno.h>
#include <event2/buffer.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/ocsp.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

/* ---- certificates shared by the tests ------------------------------------ */

static tc_pair_t a_ec, a_rsa, b_ec, wild_ec, dual_rsa, dual_ec, ca, client_ok, other_ca, client_bad,
    expired, future;

static int setup(void **state)
{
    (void)state;
    /* The runtime ignores SIGPIPE too (main.c): OpenSSL writes with write(2). */
    signal(SIGPIPE, SIG_IGN);
    tc_make(&a_ec, TC_EC256, "a.example", "a.example", -3600, 90 * 86400, NULL, false);
    tc_make(&a_rsa, TC_RSA2048, "a.example", "a.example", -3600, 90 * 86400, NULL, false);
    tc_make(&b_ec, TC_EC256, "b.example", "b.example", -3600, 90 * 86400, NULL, false);
    tc_make(&wild_ec, TC_EC256, "*.wild.example", "*.wild.example", -3600, 90 * 86400, NULL, false);
    tc_make(&dual_rsa, TC_RSA2048, "dual.example", "dual.example", -3600, 90 * 86400, NULL, false);
    tc_make(&dual_ec, TC_EC256, "dual.example", "dual.example", -3600, 90 * 86400, NULL, false);
    tc_make(&ca, TC_EC256, "Client CA", NULL, -3600, 365 * 86400, NULL, true);
    tc_make(&client_ok, TC_EC256, "client-1", "client-1.example", -3600, 86400, &ca, false);
    tc_make(&other_ca, TC_EC256, "Other CA", NULL, -3600, 365 * 86400, NULL, true);
    tc_make(&client_bad, TC_EC256, "intruder", "intruder.example", -3600, 86400, &other_ca, false);
    tc_make(&expired, TC_EC256, "old.example", "old.example", -90 * 86400, -60, NULL, false);
    tc_make(&future, TC_EC256, "new.example", "new.example", 86400, 90 * 86400, NULL, false);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tc_pair_t *all[] = {&a_ec, &a_rsa,     &b_ec,     &wild_ec,    &dual_rsa, &dual_ec,
                        &ca,   &client_ok, &other_ca, &client_bad, &expired,  &future};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        tc_free(all[i]);
    return 0;
}

/* ---- snapshots ------------------------------------------------------------ */

#define MAX_CERTS 8

typedef struct {
    Sluice__V1__Snapshot snap;
    Sluice__V1__Listener listener;
    Sluice__V1__ListenerTls tls;
    Sluice__V1__TlsCertificate certs[MAX_CERTS];
    Sluice__V1__TlsCertificate *cert_ptrs[MAX_CERTS];
    char *names[MAX_CERTS];
    char *alpn[2];
} snap_t;

/* A listener named `listener` serving `pairs` (the first is the default),
 * every setting at the compiler's defaults. */
static void snap_init(snap_t *s, const char *listener, tc_pair_t *const *pairs, size_t n)
{
    memset(s, 0, sizeof(*s));
    sluice__v1__snapshot__init(&s->snap);
    sluice__v1__listener__init(&s->listener);
    sluice__v1__listener_tls__init(&s->tls);
    s->listener.name = (char *)listener;
    s->listener.protocol = SLUICE__V1__LISTENER__PROTOCOL__HTTPS;
    s->listener.tls = &s->tls;
    for (size_t i = 0; i < n; i++) {
        Sluice__V1__TlsCertificate *c = &s->certs[i];
        sluice__v1__tls_certificate__init(c);
        char *name = malloc(32);
        snprintf(name, 32, "default/c%zu", i);
        c->name = name;
        c->chain_pem = pairs[i]->cert_pem;
        c->private_key_pem = pairs[i]->key_pem;
        s->cert_ptrs[i] = c;
        s->names[i] = name;
    }
    s->snap.certificates = s->cert_ptrs;
    s->snap.n_certificates = n;
    s->tls.certificates = s->names;
    s->tls.n_certificates = n;
    s->tls.cipher_suites = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                           "TLS_CHACHA20_POLY1305_SHA256";
    s->tls.ciphers = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256";
    s->tls.groups = "X25519:P-256:P-384";
    s->alpn[0] = "h2";
    s->alpn[1] = "http/1.1";
    s->tls.alpn = s->alpn;
    s->tls.n_alpn = 2;
    s->tls.session_tickets = 1;
    s->tls.ticket_rotation_s = 3600;
    s->tls.session_cache = 1;
    s->tls.session_cache_size = 100;
    s->tls.verify_depth = 3;
}

static void snap_done(snap_t *s)
{
    for (size_t i = 0; i < s->snap.n_certificates; i++)
        free(s->names[i]);
}

static sl_tls_server_t *build_ok(snap_t *s, unsigned flags)
{
    char err[1024] = "";
    sl_tls_server_t *srv = sl_tls_server_build(&s->listener, &s->snap, flags, err, sizeof(err));
    if (!srv)
        fail_msg("build failed: %s", err);
    return srv;
}

static char *build_error(snap_t *s)
{
    char err[1024] = "";
    sl_tls_server_t *srv = sl_tls_server_build(&s->listener, &s->snap, 0, err, sizeof(err));
    if (srv) {
        sl_tls_server_free(srv);
        fail_msg("build succeeded, expected an error");
    }
    assert_int_equal(ERR_peek_error(), 0); /* the error queue is left empty */
    return strdup(err);
}

/* ---- the client and the handshake driver ---------------------------------- */

typedef struct {
    const char *sni;
    const char *sigalgs; /* NULL: OpenSSL's default */
    int max_version;     /* 0: any */
    int min_version;     /* 0: OpenSSL's default */
    const char *alpn;    /* wire format, NULL: none */
    size_t alpn_len;
    SSL_SESSION *resume;
    tc_pair_t *client_cert;
    bool want_ocsp;
} client_opts_t;

typedef struct {
    int fds[2]; /* [0] server, [1] client */
    SSL *server, *client;
    SSL_CTX *cctx;
    bool server_ok, client_ok, failed;
} conn_t;

static SSL_SESSION *last_session;

static int new_session_cb(SSL *ssl, SSL_SESSION *sess)
{
    (void)ssl;
    SSL_SESSION_free(last_session);
    last_session = sess; /* keep the reference OpenSSL hands us */
    return 1;
}

static void conn_open(conn_t *c, sl_tls_server_t *srv, const client_opts_t *o)
{
    memset(c, 0, sizeof(*c));
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, c->fds), 0);
    for (int i = 0; i < 2; i++)
        fcntl(c->fds[i], F_SETFL, fcntl(c->fds[i], F_GETFL) | O_NONBLOCK);
    c->server = sl_tls_server_ssl_new(srv, c->fds[0]);
    assert_non_null(c->server);
    c->cctx = SSL_CTX_new(TLS_client_method());
    assert_non_null(c->cctx);
    if (o->max_version && o->max_version < TLS1_2_VERSION) {
        /* Old versions are off at OpenSSL's default security level. */
        SSL_CTX_set_security_level(c->cctx, 0);
        SSL_CTX_set_cipher_list(c->cctx, "DEFAULT@SECLEVEL=0");
    }
    if (o->min_version)
        SSL_CTX_set_min_proto_version(c->cctx, o->min_version);
    if (o->max_version)
        SSL_CTX_set_max_proto_version(c->cctx, o->max_version);
    if (o->sigalgs)
        assert_int_equal(SSL_CTX_set1_sigalgs_list(c->cctx, o->sigalgs), 1);
    SSL_CTX_set_session_cache_mode(c->cctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL);
    SSL_CTX_sess_set_new_cb(c->cctx, new_session_cb);
    if (o->client_cert) {
        assert_int_equal(SSL_CTX_use_certificate(c->cctx, o->client_cert->x), 1);
        assert_int_equal(SSL_CTX_use_PrivateKey(c->cctx, o->client_cert->k), 1);
    }
    c->client = SSL_new(c->cctx);
    SSL_set_fd(c->client, c->fds[1]);
    SSL_set_connect_state(c->client);
    if (o->sni)
        SSL_set_tlsext_host_name(c->client, o->sni);
    if (o->alpn)
        SSL_set_alpn_protos(c->client, (const unsigned char *)o->alpn, (unsigned)o->alpn_len);
    if (o->resume)
        SSL_set_session(c->client, o->resume);
    if (o->want_ocsp)
        SSL_set_tlsext_status_type(c->client, TLSEXT_STATUSTYPE_ocsp);
}

/* Runs both ends until both finished or one failed. In TLS 1.3 the client
 * finishes before the server has checked its certificate, so the server's
 * verdict is waited for too. */
static bool handshake(conn_t *c)
{
    for (int round = 0; round < 200 && !c->failed && !(c->server_ok && c->client_ok); round++) {
        if (!c->client_ok) {
            ERR_clear_error();
            int rc = SSL_do_handshake(c->client);
            if (rc == 1)
                c->client_ok = true;
            else if (SSL_get_error(c->client, rc) != SSL_ERROR_WANT_READ &&
                     SSL_get_error(c->client, rc) != SSL_ERROR_WANT_WRITE)
                c->failed = true;
        }
        if (!c->server_ok && !c->failed) {
            int want = 0;
            int rc = sl_tls_handshake(c->server, &want);
            if (rc == SL_OK)
                c->server_ok = true;
            else if (rc == SL_ERROR)
                c->failed = true;
            else
                assert_true(want == SL_TLS_WANT_READ || want == SL_TLS_WANT_WRITE);
        }
    }
    ERR_clear_error();
    return c->server_ok && c->client_ok && !c->failed;
}

/* One request/response round, so the client reads the TLS 1.3 tickets. */
static void exchange(conn_t *c)
{
    int want = 0;
    assert_int_equal(SSL_write(c->client, "ping", 4), 4);
    char buf[16];
    ssize_t n = sl_tls_read(c->server, buf, sizeof(buf), &want);
    assert_int_equal(n, 4);
    assert_memory_equal(buf, "ping", 4);
    assert_int_equal(sl_tls_write(c->server, "pong", 4, &want), 4);
    int got = 0;
    for (int i = 0; i < 50 && got <= 0; i++)
        got = SSL_read(c->client, buf, sizeof(buf));
    assert_int_equal(got, 4);
    ERR_clear_error();
}

/* Both ends say close_notify: OpenSSL forgets a session whose connection
 * ended without one (tls.h says so for the server side). */
static void conn_close(conn_t *c)
{
    int want;
    if (c->client_ok)
        SSL_shutdown(c->client);
    if (c->server_ok)
        sl_tls_shutdown(c->server, &want);
    SSL_free(c->server);
    SSL_free(c->client);
    SSL_CTX_free(c->cctx);
    close(c->fds[0]);
    close(c->fds[1]);
    ERR_clear_error();
}

/* The certificate the client was served. */
static bool served(conn_t *c, const tc_pair_t *want)
{
    X509 *x = SSL_get0_peer_certificate(c->client);
    return x && X509_cmp(x, want->x) == 0;
}

static bool connect_and_check(sl_tls_server_t *srv, const client_opts_t *o, const tc_pair_t *want)
{
    conn_t c;
    conn_open(&c, srv, o);
    bool ok = handshake(&c) && served(&c, want);
    conn_close(&c);
    return ok;
}

/* ---- tests -------------------------------------------------------------- */

static void test_sni_exact_wildcard_default(void **state)
{
    (void)state;
    snap_t s;
    tc_pair_t *pairs[] = {&a_ec, &b_ec, &wild_ec};
    snap_init(&s, "sni", pairs, 3);
    sl_tls_server_t *srv = build_ok(&s, 0);
    assert_true(connect_and_check(srv, &(client_opts_t){.sni = "a.example"}, &a_ec));
    assert_true(connect_and_check(srv, &(client_opts_t){.sni = "b.example"}, &b_ec));
    assert_true(connect_and_check(srv, &(client_opts_t){.sni = "B.Example"}, &b_ec));
    assert_true(connect_and_check(srv, &(client_opts_t){.sni = "x.wild.example"}, &wild_ec));
    /* A wildcard covers one label only; the rest falls back to the default. */
    assert_true(connect_and_check(srv, &(client_opts_t){.sni = "y.x.wild.example"}, &a_ec));
    assert_true(connect_and_check(srv, &(client_opts_t){.sni = "wild.example"}, &a_ec));
    assert_true(connect_and_check(srv, &(client_opts_t){.sni = "unknown.example"}, &a_ec));
    assert_true(connect_and_check(srv, &(client_opts_t){0}, &a_ec));

    /* The name of the served Certificate, for logs. */
    conn_t c;
    conn_open(&c, srv, &(client_opts_t){.sni = "b.example"});
    assert_true(handshake(&c));
    assert_string_equal(sl_tls_certificate_name(c.server), "default/c1");
    conn_close(&c);
    sl_tls_server_free(srv);
    snap_done(&s);
}

static void test_rsa_and_ecdsa_side_by_side(void **state)
{
    (void)state;
    snap_t s;
    tc_pair_t *pairs[] = {&a_ec, &dual_rsa, &dual_ec};
    snap_init(&s, "dual", pairs, 3);
    sl_tls_server_t *srv = build_ok(&s, 0);
    for (int v = 0; v < 2; v++) {
        int ver = v ? TLS1_3_VERSION : TLS1_2_VERSION;
        assert_true(connect_and_check(
            srv,
            &(client_opts_t){.sni = "dual.example", .sigalgs = "ECDSA+SHA256", .max_version = ver},
            &dual_ec));
        assert_true(connect_and_check(srv,
                                      &(client_opts_t){.sni = "dual.example",
                                                       .sigalgs = "RSA-PSS+SHA256:RSA+SHA256",
                                                       .max_version = ver},
                                      &dual_rsa));
    }
    /* The default group may pair types too: a.example RSA next to ECDSA. */
    sl_tls_server_free(srv);
    snap_done(&s);
    tc_pair_t *pairs2[] = {&a_ec, &a_rsa};
    snap_init(&s, "dual2", pairs2, 2);
    srv = build_ok(&s, 0);
    assert_true(connect_and_check(srv, &(client_opts_t){.sigalgs = "RSA-PSS+SHA256"}, &a_rsa));
    assert_true(connect_and_check(srv, &(client_opts_t){.sigalgs = "ECDSA+SHA256"}, &a_ec));
    sl_tls_server_free(srv);
    snap_done(&s);
}

static void test_min_version(void **state)
{
    (void)state;
    snap_t s;
    tc_pair_t *pairs[] = {&a_ec};
    snap_init(&s, "versions", pairs, 1);
    sl_tls_server_t *srv = build_ok(&s, 0);
    conn_t c;
    conn_open(&c, srv, &(client_opts_t){.max_version = TLS1_1_VERSION});
    assert_false(handshake(&c));
    conn_close(&c);
    conn_open(&c, srv, &(client_opts_t){.max_version = TLS1_2_VERSION});
    assert_true(handshake(&c));
    assert_int_equal(SSL_version(c.client), TLS1_2_VERSION);
    conn_close(&c);
    sl_tls_server_free(srv);

    s.tls.min_version = SLUICE__V1__LISTENER_TLS__VERSION__TLS1_3;
    srv = build_ok(&s, 0);
    conn_open(&c, srv, &(client_opts_t){.max_version = TLS1_2_VERSION});
    assert_false(handshake(&c));
    conn_close(&c);
    conn_open(&c, srv, &(client_opts_t){0});
    assert_true(handshake(&c));
    assert_int_equal(SSL_version(c.client), TLS1_3_VERSION);
    conn_close(&c);
    sl_tls_server_free(srv);
    snap_done(&s);
}

#define ALPN_BOTH "\x08http/1.1\x02h2"
#define ALPN_H2 "\x02h2"

static sl_tls_alpn_t alpn_of(sl_tls_server_t *srv, const char *alpn, size_t len, bool *ok)
{
    conn_t c;
    conn_open(&c, srv, &(client_opts_t){.alpn = alpn, .alpn_len = len});
    *ok = handshake(&c);
    sl_tls_alpn_t a = *ok ? sl_tls_alpn(c.server) : SL_TLS_ALPN_NONE;
    conn_close(&c);
    return a;
}

static void test_alpn(void **state)
{
    (void)state;
    snap_t s;
    tc_pair_t *pairs[] = {&a_ec};
    snap_init(&s, "alpn", pairs, 1);
    bool ok;
    sl_tls_server_t *srv = build_ok(&s, 0);
    /* The listener's order wins over the client's. */
    assert_int_equal(alpn_of(srv, ALPN_BOTH, sizeof(ALPN_BOTH) - 1, &ok), SL_TLS_ALPN_H2);
    assert_true(ok);
    assert_int_equal(alpn_of(srv, NULL, 0, &ok), SL_TLS_ALPN_NONE);
    assert_true(ok);
    sl_tls_server_free(srv);

    /* Without an HTTP/2 codec the caller removes h2. */
    srv = build_ok(&s, SL_TLS_NO_H2);
    assert_int_equal(alpn_of(srv, ALPN_BOTH, sizeof(ALPN_BOTH) - 1, &ok), SL_TLS_ALPN_HTTP11);
    assert_true(ok);
    /* No protocol in common: no_application_protocol, not a silent fallback. */
    alpn_of(srv, ALPN_H2, sizeof(ALPN_H2) - 1, &ok);
    assert_false(ok);
    sl_tls_server_free(srv);
    snap_done(&s);
}

/* Each attempt offers a copy: an OpenSSL client with a session cache marks a
 * TLS 1.3 session it resumed as used (RFC 8446 C.4 single use). */
static bool resumes(sl_tls_server_t *srv, SSL_SESSION *sess, int max_version)
{
    conn_t c;
    SSL_SESSION *copy = SSL_SESSION_dup(sess);
    conn_open(&c, srv, &(client_opts_t){.resume = copy, .max_version = max_version});
    assert_true(handshake(&c));
    exchange(&c);
    bool reused = SSL_session_reused(c.client) == 1;
    conn_close(&c);
    SSL_SESSION_free(copy);
    return reused;
}

static SSL_SESSION *fresh_session(sl_tls_server_t *srv, int max_version)
{
    conn_t c;
    SSL_SESSION_free(last_session);
    last_session = NULL;
    conn_open(&c, srv, &(client_opts_t){.max_version = max_version});
    assert_true(handshake(&c));
    exchange(&c);
    conn_close(&c);
    assert_non_null(last_session);
    SSL_SESSION *s = last_session;
    last_session = NULL;
    return s;
}

static void test_ticket_resumption_across_builds_and_rotation(void **state)
{
    (void)state;
    snap_t s;
    tc_pair_t *pairs[] = {&a_ec};
    snap_init(&s, "tickets", pairs, 1);
    s.tls.session_cache = 0; /* only the ticket can resume */
    for (int v = 0; v < 2; v++) {
        int ver = v ? TLS1_3_VERSION : TLS1_2_VERSION;
        sl_tls_server_t *gen1 = build_ok(&s, 0);
        SSL_SESSION *sess = fresh_session(gen1, ver);
        /* A config change: the next generation's server resumes it. */
        sl_tls_server_t *gen2 = build_ok(&s, 0);
        sl_tls_server_free(gen1);
        assert_true(resumes(gen2, sess, ver));
        /* One rotation: the old key still decrypts (and the ticket is
         * re-issued under the new one). */
        assert_int_equal(sl_tls_tickets_rotate("tickets"), SL_OK);
        assert_true(resumes(gen2, sess, ver));
        /* Two more: the key has left the ring of three. */
        assert_int_equal(sl_tls_tickets_rotate("tickets"), SL_OK);
        assert_int_equal(sl_tls_tickets_rotate("tickets"), SL_OK);
        assert_false(resumes(gen2, sess, ver));
        SSL_SESSION_free(sess);

        /* Another listener's ring does not know this listener's keys. */
        sess = fresh_session(gen2, ver);
        snap_t other;
        snap_init(&other, "other-listener", pairs, 1);
        sl_tls_server_t *o = build_ok(&other, 0);
        assert_false(resumes(o, sess, ver));
        sl_tls_server_free(o);
        snap_done(&other);
        SSL_SESSION_free(sess);
        sl_tls_server_free(gen2);
    }
    /* No live server of the listener: its ring is gone. */
    assert_int_equal(sl_tls_tickets_rotate("tickets"), SL_DECLINED);
    snap_done(&s);
}

static void test_session_cache_resumption(void **state)
{
    (void)state;
    snap_t s;
    tc_pair_t *pairs[] = {&a_ec};
    snap_init(&s, "cache", pairs, 1);
    s.tls.session_tickets = 0;
    sl_tls_server_t *srv = build_ok(&s, 0);
    SSL_SESSION *sess = fresh_session(srv, TLS1_2_VERSION);
    assert_true(resumes(srv, sess, TLS1_2_VERSION));
    SSL_SESSION_free(sess);
    sl_tls_server_free(srv);
    snap_done(&s);
}

static void test_client_auth(void **state)
{
    (void)state;
    snap_t s;
    tc_pair_t *pairs[] = {&a_ec};
    snap_init(&s, "mtls", pairs, 1);
    s.tls.client_auth = SLUICE__V1__LISTENER_TLS__CLIENT_AUTH__CLIENT_AUTH_REQUIRED;
    s.tls.client_ca_pem = ca.cert_pem;
    s.tls.client_ca_file = "";
    sl_tls_server_t *srv = build_ok(&s, 0);
    conn_t c;
    for (int v = 0; v < 2; v++) {
        int ver = v ? TLS1_3_VERSION : TLS1_2_VERSION;
        conn_open(&c, srv, &(client_opts_t){.max_version = ver});
        assert_false(handshake(&c)); /* no certificate */
        conn_close(&c);
        conn_open(&c, srv, &(client_opts_t){.max_version = ver, .client_cert = &client_bad});
        assert_false(handshake(&c)); /* a CA the listener does not trust */
        conn_close(&c);
        conn_open(&c, srv, &(client_opts_t){.max_version = ver, .client_cert = &client_ok});
        assert_true(handshake(&c));
        sl_tls_peer_t peer;
        assert_int_equal(sl_tls_peer(c.server, &peer), SL_OK);
        assert_string_equal(peer.subject, "CN=client-1");
        assert_string_equal(peer.sans, "DNS:client-1.example");
        unsigned char md[32];
        unsigned int mdlen;
        X509_digest(client_ok.x, EVP_sha256(), md, &mdlen);
        char hex[65];
        for (int i = 0; i < 32; i++)
            snprintf(hex + 2 * i, 3, "%02x", md[i]);
        assert_string_equal(peer.sha256_hex, hex);
        assert_false(peer.truncated);
        conn_close(&c);
    }
    sl_tls_server_free(srv);

    s.tls.client_auth = SLUICE__V1__LISTENER_TLS__CLIENT_AUTH__CLIENT_AUTH_OPTIONAL;
    srv = build_ok(&s, 0);
    conn_open(&c, srv, &(client_opts_t){0});
    assert_true(handshake(&c));
    sl_tls_peer_t peer;
    assert_int_equal(sl_tls_peer(c.server, &peer), SL_DECLINED);
    conn_close(&c);
    conn_open(&c, srv, &(client_opts_t){.client_cert = &client_ok});
    assert_true(handshake(&c));
    assert_int_equal(sl_tls_peer(c.server, &peer), SL_OK);
    assert_string_equal(peer.subject, "CN=client-1");
    conn_close(&c);
    /* Optional still means verified: an untrusted certificate fails. */
    conn_open(&c, srv, &(client_opts_t){.client_cert = &client_bad});
    assert_false(handshake(&c));
    conn_close(&c);
    sl_tls_server_free(srv);

    /* On a certificate chosen by SNI (another SSL_CTX) the same rules hold. */
    snap_t two;
    tc_pair_t *both[] = {&a_ec, &b_ec};
    snap_init(&two, "mtls-sni", both, 2);
    two.tls.client_auth = SLUICE__V1__LISTENER_TLS__CLIENT_AUTH__CLIENT_AUTH_REQUIRED;
    two.tls.client_ca_pem = ca.cert_pem;
    two.tls.client_ca_file = "";
    sl_tls_server_t *srv2 = build_ok(&two, 0);
    conn_open(&c, srv2, &(client_opts_t){.sni = "b.example"});
    assert_false(handshake(&c));
    conn_close(&c);
    conn_open(&c, srv2, &(client_opts_t){.sni = "b.example", .client_cert = &client_bad});
    assert_false(handshake(&c));
    conn_close(&c);
    conn_open(&c, srv2, &(client_opts_t){.sni = "b.example", .client_cert = &client_ok});
    assert_true(handshake(&c));
    assert_true(served(&c, &b_ec));
    assert_int_equal(sl_tls_peer(c.server, &peer), SL_OK);
    conn_close(&c);
    sl_tls_server_free(srv2);
    snap_done(&two);

    /* No client auth configured: a presented certificate is not asked for. */
    s.tls.client_auth = SLUICE__V1__LISTENER_TLS__CLIENT_AUTH__CLIENT_AUTH_NONE;
    srv = build_ok(&s, 0);
    conn_open(&c, srv, &(client_opts_t){.client_cert = &client_ok});
    assert_true(handshake(&c));
    assert_int_equal(sl_tls_peer(c.server, &peer), SL_DECLINED);
    conn_close(&c);
    sl_tls_server_free(srv);
    snap_done(&s);
}

static void expect_build_error(snap_t *s, const char *want)
{
    char *e = build_error(s);
    if (!strstr(e, want))
        fail_msg("error '%s' does not contain '%s'", e, want);
    free(e);
}

static char *write_temp(const char *text, size_t len)
{
    char *path = strdup("/tmp/sluice-test-tls-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    close(fd);
    return path;
}

static void test_build_errors(void **state)
{
    (void)state;
    snap_t s;
    tc_pair_t *one[] = {&expired};
    snap_init(&s, "errors", one, 1);
    expect_build_error(&s, "listener errors: certificate default/c0: spec.certificate: the "
                           "certificate expired at ");
    snap_done(&s);

    tc_pair_t *fut[] = {&future};
    snap_init(&s, "errors", fut, 1);
    expect_build_error(&s, "spec.certificate: the certificate is not valid before ");
    snap_done(&s);

    tc_pair_t *mism[] = {&a_ec};
    snap_init(&s, "errors", mism, 1);
    s.certs[0].private_key_pem = b_ec.key_pem;
    expect_build_error(&s, "certificate default/c0: spec.privateKey: the private key does not "
                           "match the certificate");
    s.certs[0].private_key_pem = a_ec.key_pem;
    s.tls.cipher_suites = "TLS_NOT_A_SUITE";
    expect_build_error(&s, "listener errors: tls.cipherSuites: OpenSSL knows none of "
                           "\"TLS_NOT_A_SUITE\"");
    s.tls.cipher_suites = "";
    s.tls.groups = "P-999";
    expect_build_error(&s, "tls.groups: OpenSSL refuses \"P-999\"");
    s.tls.groups = "";
    char *missing = "default/nope";
    s.tls.certificates = &missing;
    expect_build_error(&s, "certificate default/nope is not in the snapshot");
    snap_done(&s);

    tc_pair_t *dup[] = {&a_ec, &b_ec, &b_ec};
    snap_init(&s, "errors", dup, 3);
    expect_build_error(&s, "certificate default/c2 has the same names and key type as "
                           "default/c1");
    snap_done(&s);

    /* Files: read at build time, errors name the path. */
    tc_pair_t *filecert[] = {&a_ec};
    snap_init(&s, "files", filecert, 1);
    char *cpath = write_temp(a_ec.cert_pem, strlen(a_ec.cert_pem));
    char *kpath = write_temp(a_ec.key_pem, strlen(a_ec.key_pem));
    s.certs[0].chain_pem = "";
    s.certs[0].private_key_pem = "";
    s.certs[0].chain_file = cpath;
    s.certs[0].private_key_file = "/nonexistent/key.pem";
    expect_build_error(&s, "certificate default/c0: file.privateKey /nonexistent/key.pem: No "
                           "such file or directory");
    s.certs[0].private_key_file = kpath;
    sl_tls_server_t *srv = build_ok(&s, 0);
    assert_true(connect_and_check(srv, &(client_opts_t){.sni = "a.example"}, &a_ec));
    sl_tls_server_free(srv);
    unlink(cpath);
    unlink(kpath);
    free(cpath);
    free(kpath);
    snap_done(&s);
}

static void test_ocsp_stapling(void **state)
{
    (void)state;
    /* A leaf issued by `ca`, its chain, and a "good" response signed by ca. */
    tc_pair_t leaf;
    tc_make(&leaf, TC_EC256, "ocsp.example", "ocsp.example", -3600, 86400, &ca, false);
    char chain[8192];
    snprintf(chain, sizeof(chain), "%s%s", leaf.cert_pem, ca.cert_pem);
    OCSP_CERTID *id = OCSP_cert_to_id(NULL, leaf.x, ca.x);
    OCSP_BASICRESP *bs = OCSP_BASICRESP_new();
    ASN1_TIME *thisupd = X509_gmtime_adj(NULL, -60), *nextupd = X509_gmtime_adj(NULL, 86400);
    assert_non_null(
        OCSP_basic_add1_status(bs, id, V_OCSP_CERTSTATUS_GOOD, 0, NULL, thisupd, nextupd));
    assert_int_equal(OCSP_basic_sign(bs, ca.x, ca.k, EVP_sha256(), NULL, 0), 1);
    OCSP_RESPONSE *resp = OCSP_response_create(OCSP_RESPONSE_STATUS_SUCCESSFUL, bs);
    unsigned char *der = NULL;
    int der_len = i2d_OCSP_RESPONSE(resp, &der);
    assert_true(der_len > 0);
    char *path = write_temp((const char *)der, (size_t)der_len);

    snap_t s;
    tc_pair_t *pairs[] = {&leaf};
    snap_init(&s, "ocsp", pairs, 1);
    s.certs[0].chain_pem = chain;
    s.tls.ocsp_staple_file = path;
    sl_tls_server_t *srv = build_ok(&s, 0);
    conn_t c;
    conn_open(&c, srv, &(client_opts_t){.want_ocsp = true});
    assert_true(handshake(&c));
    const unsigned char *got = NULL;
    long got_len = SSL_get_tlsext_status_ocsp_resp(c.client, &got);
    assert_int_equal(got_len, der_len);
    assert_memory_equal(got, der, (size_t)der_len);
    conn_close(&c);
    sl_tls_server_free(srv);

    /* A response about another certificate is refused at build. */
    tc_pair_t *others[] = {&a_ec};
    snap_t s2;
    snap_init(&s2, "ocsp2", others, 1);
    s2.tls.ocsp_staple_file = path;
    expect_build_error(&s2, "the response is about none of the listener's certificates");
    snap_done(&s2);
    s.tls.ocsp_staple_file = "/nonexistent.der";
    expect_build_error(&s, "tls.ocspStapleFile /nonexistent.der: No such file or directory");

    unlink(path);
    free(path);
    snap_done(&s);
    OPENSSL_free(der);
    OCSP_RESPONSE_free(resp);
    OCSP_BASICRESP_free(bs);
    OCSP_CERTID_free(id);
    ASN1_TIME_free(thisupd);
    ASN1_TIME_free(nextupd);
    tc_free(&leaf);
}

static void test_read_write_shutdown(void **state)
{
    (void)state;
    snap_t s;
    tc_pair_t *pairs[] = {&a_ec};
    snap_init(&s, "io", pairs, 1);
    sl_tls_server_t *srv = build_ok(&s, 0);
    conn_t c;
    conn_open(&c, srv, &(client_opts_t){0});
    assert_true(handshake(&c));
    /* The client's tickets arrive; nothing for the server yet. */
    char buf[64];
    int want = 0;
    errno = 0;
    assert_int_equal(sl_tls_read(c.server, buf, sizeof(buf), &want), -1);
    assert_int_equal(errno, EAGAIN);
    assert_int_equal(want, SL_TLS_WANT_READ);
    exchange(&c);
    /* Two records: one read takes the first, the second waits in the
     * socket; a second read returns it (the ET rule: read to EAGAIN). */
    assert_int_equal(SSL_write(c.client, "one", 3), 3);
    assert_int_equal(SSL_write(c.client, "two", 3), 3);
    assert_int_equal(sl_tls_read(c.server, buf, 2, &want), 2);
    assert_true(sl_tls_has_pending(c.server)); /* "e" of "one" is held */
    assert_int_equal(sl_tls_read(c.server, buf, sizeof(buf), &want), 1);
    assert_int_equal(sl_tls_read(c.server, buf, sizeof(buf), &want), 3);
    assert_memory_equal(buf, "two", 3);
    assert_int_equal(sl_tls_read(c.server, buf, sizeof(buf), &want), -1);
    assert_int_equal(errno, EAGAIN);
    /* The client's close_notify reads as 0; our shutdown is then SL_OK. */
    SSL_shutdown(c.client);
    assert_int_equal(sl_tls_read(c.server, buf, sizeof(buf), &want), 0);
    assert_int_equal(sl_tls_shutdown(c.server, &want), SL_OK);
    conn_close(&c);

    /* A plain EOF without close_notify also reads as 0. */
    conn_open(&c, srv, &(client_opts_t){0});
    assert_true(handshake(&c));
    shutdown(c.fds[1], SHUT_WR);
    assert_int_equal(sl_tls_read(c.server, buf, sizeof(buf), &want), 0);
    conn_close(&c);

    /* Garbage instead of a ClientHello fails the handshake. */
    int fds[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    assert_int_equal(write(fds[1], "GET / HTTP/1.1\r\n\r\n", 18), 18);
    SSL *ssl = sl_tls_server_ssl_new(srv, fds[0]);
    assert_int_equal(sl_tls_handshake(ssl, &want), SL_ERROR);
    assert_int_equal(ERR_peek_error(), 0);
    SSL_free(ssl);
    close(fds[0]);
    close(fds[1]);
    sl_tls_server_free(srv);
    snap_done(&s);
}

/* The server outlives sl_tls_server_free while a connection made from it
 * is open (a generation freed during a handshake). ASan checks the rest. */
static void test_server_outlives_free_while_connections_live(void **state)
{
    (void)state;
    snap_t s;
    tc_pair_t *pairs[] = {&a_ec, &b_ec};
    snap_init(&s, "lifetime", pairs, 2);
    sl_tls_server_t *srv = build_ok(&s, 0);
    conn_t c;
    conn_open(
        &c, srv,
        &(client_opts_t){.sni = "b.example", .alpn = ALPN_BOTH, .alpn_len = sizeof(ALPN_BOTH) - 1});
    sl_tls_server_free(srv); /* before the handshake even starts */
    assert_true(handshake(&c));
    assert_true(served(&c, &b_ec));
    assert_int_equal(sl_tls_alpn(c.server), SL_TLS_ALPN_H2);
    assert_string_equal(sl_tls_certificate_name(c.server), "default/c1");
    exchange(&c);
    conn_close(&c);
    snap_done(&s);
}

static void test_expiry_metric(void **state)
{
    (void)state;
    snap_t s1, s2;
    tc_pair_t *p1[] = {&a_ec, &b_ec};
    tc_pair_t *p2[] = {&a_ec};
    snap_init(&s1, "m1", p1, 2);
    snap_init(&s2, "m2", p2, 1);
    /* As a generation holds them: NULL for its plaintext listeners. */
    sl_tls_server_t *srv[3] = {build_ok(&s1, 0), NULL, build_ok(&s2, 0)};
    sl_tls_cert_expiry_t info[4];
    assert_int_equal(sl_tls_server_certificates(srv[0], info, 4), 2);
    assert_string_equal(info[1].name, "default/c1");
    assert_true(info[1].not_after_unix > (int64_t)time(NULL) + 89 * 86400);
    assert_int_equal(sl_tls_publish_expiry(srv, 3), SL_OK);
    struct evbuffer *out = evbuffer_new();
    sl_metrics_render(out);
    size_t len = evbuffer_get_length(out);
    char *text = malloc(len + 1);
    evbuffer_copyout(out, text, len);
    text[len] = '\0';
    /* default/c0 is in both servers and rendered once. */
    const char *first =
        strstr(text, "sluice_certificate_expiry_seconds{certificate=\"default/c0\"}");
    assert_non_null(first);
    assert_null(strstr(strchr(first, '}'), "{certificate=\"default/c0\"}"));
    long long secs = 0;
    assert_int_equal(sscanf(strchr(first, '}') + 1, " %lld", &secs), 1);
    assert_true(secs > 89 * 86400 && secs <= 90 * 86400);
    assert_non_null(strstr(text, "{certificate=\"default/c1\"}"));
    free(text);
    evbuffer_free(out);
    sl_tls_server_free(srv[0]);
    sl_tls_server_free(srv[2]);
    assert_int_equal(sl_tls_publish_expiry(srv, 0), SL_OK);
    out = evbuffer_new();
    sl_metrics_render(out);
    len = evbuffer_get_length(out);
    text = malloc(len + 1);
    evbuffer_copyout(out, text, len);
    text[len] = '\0';
    assert_null(strstr(text, "sluice_certificate_expiry_seconds")); /* cleared */
    free(text);
    evbuffer_free(out);
    snap_done(&s1);
    snap_done(&s2);
}

/* /config_dump shows the snapshot as JSON: private keys never in it. */
static void test_config_dump_redacts_private_keys(void **state)
{
    (void)state;
    char *cert = tc_certificate_doc("a-example", a_ec.cert_pem, a_ec.key_pem);
    char *text = NULL;
    assert_true(asprintf(&text,
                         "apiVersion: gateway.sluice.dev/v1alpha1\nkind: Gateway\n"
                         "metadata: {name: default}\nspec:\n  listeners:\n"
                         "  - name: https\n    port: 8443\n    protocol: https\n"
                         "    tls: {certificateRefs: [{name: a-example}]}\n---\n%s",
                         cert) > 0);
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    assert_int_equal(sl_model_parse(&set, text, strlen(text), "t.yaml", &errs), 0);
    Sluice__V1__Snapshot *snap = sl_compile_snapshot(&set, "default", 1, &errs);
    assert_non_null(snap);
    assert_string_equal(snap->certificates[0]->private_key_pem, a_ec.key_pem);
    json_t *doc = json_pack("{s:o}", "snapshot", sl_pbjson_from_message(&snap->base));
    sl_admin_redact_secrets(doc);
    char *dump = json_dumps(doc, 0);
    assert_null(strstr(dump, "PRIVATE KEY"));
    assert_non_null(strstr(dump, "\"private_key_pem\": \"[redacted]\""));
    assert_non_null(strstr(dump, "BEGIN CERTIFICATE")); /* the chain is public */
    free(dump);
    json_decref(doc);
    /* An empty key (file-based certificate) stays empty. */
    doc = json_pack("{s:[{s:s}]}", "certificates", "private_key_pem", "");
    sl_admin_redact_secrets(doc);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(json_object_get(doc, "certificates"), 0),
                                          "private_key_pem")),
        "");
    json_decref(doc);
    sl_snapshot_free(snap);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
    free(text);
    free(cert);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sni_exact_wildcard_default),
        cmocka_unit_test(test_rsa_and_ecdsa_side_by_side),
        cmocka_unit_test(test_min_version),
        cmocka_unit_test(test_alpn),
        cmocka_unit_test(test_ticket_resumption_across_builds_and_rotation),
        cmocka_unit_test(test_session_cache_resumption),
        cmocka_unit_test(test_client_auth),
        cmocka_unit_test(test_build_errors),
        cmocka_unit_test(test_ocsp_stapling),
        cmocka_unit_test(test_read_write_shutdown),
        cmocka_unit_test(test_server_outlives_free_while_connections_live),
        cmocka_unit_test(test_expiry_metric),
        cmocka_unit_test(test_config_dump_redacts_private_keys),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    SSL_SESSION_free(last_session);
    return rc;
}
