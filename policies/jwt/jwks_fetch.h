/*
 * A remote JWKS (jwksUri), kept fresh by a thread of its own so that no
 * worker ever waits on the network: the fetcher does an HTTP/1.1 GET, over
 * TLS for https:// (the server's certificate verified against the system's
 * CAs, or jwksCaBundle / jwksCaFile, for the URL's host name or address,
 * which is also sent as SNI), with one deadline for connect, handshake and
 * response, parses the document (jwk.h) and publishes the key set
 * through an atomic pointer; workers load the pointer and use the set for
 * the rest of their hook.
 *
 * Threading and memory: the current set is replaced only when the document
 * changed (its SHA-256 differs), and a replaced set is never freed while
 * the policy state lives: it goes on a list the fetcher alone touches,
 * freed by sl_jwks_fetch_free after the thread is joined. So a worker's
 * pointer stays valid without a read section, and memory grows only with
 * real key rotations, never with requests.
 *
 * The thread starts on the first request (sl_jwks_fetch_start, from any
 * worker; the controller compiles policies but never runs them, so it
 * never fetches), fetches every ttl seconds (every few seconds while no
 * fetch succeeded), and earlier when a worker meets an unknown kid
 * (sl_jwks_fetch_refresh, at most once per SL_JWKS_REFRESH_MIN_MS).
 * A wake-up pipe interrupts its waits and fetches: free never waits for a
 * timeout.
 *
 * Not here: redirects, Cache-Control, proxies, client certificates.
 */
#ifndef SL_JWT_JWKS_FETCH_H
#define SL_JWT_JWKS_FETCH_H

#include "jwk.h"

#include <stdint.h>

#define SL_JWKS_REFRESH_MIN_MS 10000
#define SL_JWKS_FETCH_TIMEOUT_MS 5000
#define SL_JWKS_RETRY_MS 2000
#define SL_JWKS_MAX_DOCUMENT (1024 * 1024)

typedef struct sl_jwks_fetch sl_jwks_fetch_t;

/* Whether uri is one the fetcher can use ("https://host[:port][/path]" or
 * "http://..."), *tls (may be NULL) set for https; the reason in err when
 * not. */
int sl_jwks_uri_check(const char *uri, int *tls, char *err, size_t errlen);

/* Whether pem holds at least one certificate and each parses (compile
 * time: a jwksCaBundle that cannot be used fails the policy). */
int sl_jwks_ca_pem_check(const char *pem, char *err, size_t errlen);

/* A fetcher for uri (checked), not started; its TLS trusts ca_pem, else
 * the CA file ca_file (read at each fetch), else the system's CAs (both
 * NULL). NULL on out of memory. */
sl_jwks_fetch_t *sl_jwks_fetch_new(const char *uri, unsigned ttl_s, const char *ca_pem,
                                   const char *ca_file);
/* Starts the thread once; any thread may call it, any number of times. */
void sl_jwks_fetch_start(sl_jwks_fetch_t *f);
/* The latest key set, or NULL while no fetch has succeeded. */
const sl_jwks_t *sl_jwks_fetch_current(const sl_jwks_fetch_t *f);
/* Asks for a fetch now (an unknown kid), unless one was asked for less than
 * SL_JWKS_REFRESH_MIN_MS ago. */
void sl_jwks_fetch_refresh(sl_jwks_fetch_t *f);
/* Stops and joins the thread, frees every set it ever published. */
void sl_jwks_fetch_free(sl_jwks_fetch_t *f);

#endif
