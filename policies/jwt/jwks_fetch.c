/*
 * The remote JWKS fetcher (jwks_fetch.h): one thread per compiled jwt
 * policy with a jwksUri, blocking HTTP/1.1 GETs (over TLS for https://)
 * on a non-blocking socket polled with a deadline and the wake-up pipe.
 */
#include "jwks_fetch.h"

#include "hostport.h"
#include "httpc.h"
#include "log.h"
#include "tls_pem.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct sl_jwks_fetch {
    char uri[1024];
    sl_httpc_t http; /* the fetcher thread's (its connection, c->why) */
    char *ca_pem;    /* jwksCaBundle, or NULL */
    char *ca_file;   /* jwksCaFile, or NULL; neither = the system's CAs */
    unsigned ttl_s;
    _Atomic(sl_jwks_t *) current;
    atomic_int started;
    atomic_int stop;
    _Atomic uint64_t refresh_asked_ms; /* 0 = never */
    int wake[2];                       /* [0] the fetcher polls, [1] anyone writes */
    pthread_t thread;
    int thread_running;
    /* fetcher thread only: */
    sl_jwks_t *retired;
    unsigned char digest[SHA256_DIGEST_LENGTH];
    int have_digest;
};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* An http:// or https:// URI in its parts (hostport.h); 0 or -1 with err. */
static int split_uri(const char *uri, int *tls, char *host, size_t hcap, char *port, size_t pcap,
                     char *path, size_t pathcap, char *err, size_t errlen)
{
    const char *why = NULL;
    if (sl_url_split(uri, tls, host, hcap, port, pcap, path, pathcap, &why) == 0)
        return 0;
    snprintf(err, errlen, "%s", why);
    return -1;
}

int sl_jwks_uri_check(const char *uri, int *tls, char *err, size_t errlen)
{
    char host[256], port[8], path[768];
    int t = 0;
    if (strlen(uri) >= 1024) {
        snprintf(err, errlen, "at most 1023 characters");
        return -1;
    }
    int rc =
        split_uri(uri, &t, host, sizeof(host), port, sizeof(port), path, sizeof(path), err, errlen);
    if (tls)
        *tls = t;
    return rc;
}

int sl_jwks_ca_pem_check(const char *pem, char *err, size_t errlen)
{
    return sl_pem_ca_load(NULL, pem, err, errlen) > 0 ? 0 : -1;
}

static int drain(sl_jwks_fetch_t *f)
{
    char buf[64];
    while (read(f->wake[0], buf, sizeof(buf)) > 0)
        ;
    return atomic_load(&f->stop);
}

/* httpc's cancel hook: the pipe was written to; give up when stopping. */
static int stop_asked(void *arg)
{
    return drain(arg);
}

sl_jwks_fetch_t *sl_jwks_fetch_new(const char *uri, unsigned ttl_s, const char *ca_pem,
                                   const char *ca_file)
{
    sl_jwks_fetch_t *f = calloc(1, sizeof(*f));
    if (!f)
        return NULL;
    f->wake[0] = f->wake[1] = -1;
    snprintf(f->uri, sizeof(f->uri), "%s", uri);
    const char *why = NULL;
    if (sl_httpc_init(&f->http, uri, &why) != 0 || (ca_pem && !(f->ca_pem = strdup(ca_pem))) ||
        (ca_file && !(f->ca_file = strdup(ca_file))) ||
        pipe2(f->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        free(f->ca_pem);
        free(f->ca_file);
        free(f);
        return NULL;
    }
    f->ttl_s = ttl_s;
    f->http.ca_pem = f->ca_pem;
    f->http.ca_file = f->ca_file;
    f->http.ca_pem_name = "jwksCaBundle";
    f->http.ca_file_name = "jwksCaFile";
    /* A stop (or a refresh) written to the pipe ends a wait at once. */
    f->http.cancel_fd = f->wake[0];
    f->http.cancelled = stop_asked;
    f->http.cancel_arg = f;
    f->http.max_response = SL_JWKS_MAX_DOCUMENT + 16384;
    return f;
}

const sl_jwks_t *sl_jwks_fetch_current(const sl_jwks_fetch_t *f)
{
    return atomic_load_explicit(&((sl_jwks_fetch_t *)f)->current, memory_order_acquire);
}

static void wake(sl_jwks_fetch_t *f, char why)
{
    ssize_t w = write(f->wake[1], &why, 1);
    (void)w; /* a full pipe already holds a wake-up */
}

void sl_jwks_fetch_refresh(sl_jwks_fetch_t *f)
{
    uint64_t now = mono_ms();
    uint64_t last = atomic_load(&f->refresh_asked_ms);
    if (last && now - last < SL_JWKS_REFRESH_MIN_MS)
        return;
    if (atomic_compare_exchange_strong(&f->refresh_asked_ms, &last, now))
        wake(f, 'r');
}

/* Drains the pipe; 1 when asked to stop. */

/* One fetch: publishes a changed set. 0 when the keys are good (new or
 * unchanged), -1 otherwise (logged; the old set stays). */
static int fetch_once(sl_jwks_fetch_t *f)
{
    char err[sizeof(f->http.why)];
    const char *body = NULL;
    size_t blen = 0;
    int status = sl_httpc_request(&f->http, "GET", f->http.path,
                                  "Accept: application/json\r\nConnection: close\r\n", NULL, 0,
                                  SL_JWKS_FETCH_TIMEOUT_MS, &body, &blen);
    if (status == 0)
        snprintf(err, sizeof(err), "%s", f->http.why);
    else if (status != 200)
        snprintf(err, sizeof(err), "status %d", status);
    else if (blen > SL_JWKS_MAX_DOCUMENT)
        snprintf(err, sizeof(err), "the document is larger than %d bytes", SL_JWKS_MAX_DOCUMENT);
    if (status != 200 || blen > SL_JWKS_MAX_DOCUMENT) {
        sl_httpc_close(&f->http);
        if (!atomic_load(&f->stop))
            sl_log_warn("jwt: JWKS %s: %s (%s)", f->uri, err,
                        sl_jwks_fetch_current(f) ? "the previous keys stay in use"
                                                 : "tokens with unknown keys get 503");
        return -1;
    }
    unsigned char digest[SHA256_DIGEST_LENGTH];
    SHA256((unsigned char *)body, (size_t)blen, digest);
    if (f->have_digest && memcmp(digest, f->digest, sizeof(digest)) == 0) {
        sl_httpc_close(&f->http);
        return 0;
    }
    json_error_t jerr;
    json_t *doc = json_loadb(body, blen, JSON_REJECT_DUPLICATES, &jerr);
    sl_httpc_close(&f->http);
    sl_jwks_t *set = NULL;
    if (!doc)
        snprintf(err, sizeof(err), "not JSON: %s (line %d)", jerr.text, jerr.line);
    else
        set = sl_jwks_parse(doc, 0, 0, err, sizeof(err));
    json_decref(doc);
    if (!set) {
        sl_log_warn("jwt: JWKS %s: %s (%s)", f->uri, err,
                    sl_jwks_fetch_current(f) ? "the previous keys stay in use"
                                             : "tokens with unknown keys get 503");
        return -1;
    }
    memcpy(f->digest, digest, sizeof(digest));
    f->have_digest = 1;
    sl_jwks_t *old = atomic_exchange_explicit(&f->current, set, memory_order_acq_rel);
    if (old) {
        old->retired_next = f->retired;
        f->retired = old;
    }
    sl_log_info("jwt: JWKS %s: %zu signature keys", f->uri, set->n);
    return 0;
}

static void *run(void *arg)
{
    sl_jwks_fetch_t *f = arg;
    while (!atomic_load(&f->stop)) {
        int ok = fetch_once(f) == 0;
        uint64_t wait_ms = ok ? (uint64_t)f->ttl_s * 1000 : SL_JWKS_RETRY_MS;
        if (!ok && wait_ms > (uint64_t)f->ttl_s * 1000)
            wait_ms = (uint64_t)f->ttl_s * 1000;
        struct pollfd p = {f->wake[0], POLLIN, 0};
        int n;
        do
            n = poll(&p, 1, (int)wait_ms);
        while (n < 0 && errno == EINTR);
        if (n > 0 && drain(f))
            break;
    }
    return NULL;
}

void sl_jwks_fetch_start(sl_jwks_fetch_t *f)
{
    int expected = 0;
    if (atomic_load_explicit(&f->started, memory_order_relaxed) ||
        !atomic_compare_exchange_strong(&f->started, &expected, 1))
        return;
    if (pthread_create(&f->thread, NULL, run, f) != 0) {
        sl_log_error("jwt: JWKS %s: cannot start the fetcher thread", f->uri);
        return;
    }
    f->thread_running = 1;
}

void sl_jwks_fetch_free(sl_jwks_fetch_t *f)
{
    if (!f)
        return;
    atomic_store(&f->stop, 1);
    wake(f, 's');
    if (f->thread_running)
        pthread_join(f->thread, NULL);
    sl_httpc_free(&f->http);
    close(f->wake[0]);
    close(f->wake[1]);
    free(f->ca_pem);
    free(f->ca_file);
    sl_jwks_free(atomic_load(&f->current));
    while (f->retired) {
        sl_jwks_t *next = f->retired->retired_next;
        sl_jwks_free(f->retired);
        f->retired = next;
    }
    free(f);
}
