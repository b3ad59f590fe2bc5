/*
 * The cache policy's compiled config and its per-request ask: the contract
 * between the policy (cache.c: config, key, the request's directives,
 * X-Cache and Age) and the runtime that looks up, waits, serves and stores
 * (runtime/proxy/cache.c), which never reads a policy config itself.
 */
#ifndef SL_CACHE_POLICY_H
#define SL_CACHE_POLICY_H

#include "cache_store.h"
#include "sl_types.h"

#include <stddef.h>
#include <stdint.h>

#define SL_CACHE_MAX_KEY_HEADERS 16
#define SL_CACHE_MAX_KEY_QUERY 32
/* A key longer than this is not cached (X-Cache: BYPASS): it must fit the
 * request's policy arena with room to spare for the other policies. */
#define SL_CACHE_MAX_KEY_BYTES 2048

typedef struct sl_cache_conf {
    sl_cache_zone_t *zone; /* held while this config lives */
    uint64_t ttl_ms;
    uint64_t max_bytes;
    uint64_t max_entry_bytes;
    uint64_t coalesce_timeout_ms;
    uint64_t pass_ms;                      /* hit-for-miss markers: min(ttl, 120 s) */
    uint8_t respect_cache_control;         /* the origin's Cache-Control, Expires */
    uint8_t respect_request_cache_control; /* the client's no-store, no-cache */
    uint8_t coalesce;
    uint8_t ignore_cookies;
    uint8_t whole_query; /* keyQuery absent: the query as sent is in the key */
    uint8_t key_cookie;  /* keyHeaders names Cookie */
    size_t num_key_query, num_key_headers;
    char *key_query[SL_CACHE_MAX_KEY_QUERY];
    char *key_headers[SL_CACHE_MAX_KEY_HEADERS]; /* lower case */
    uint64_t statuses[10];                       /* bit per status 0..639 */
} sl_cache_conf_t;

typedef struct sl_cache_ask {
    const sl_cache_conf_t *conf;
    const char *key; /* in the request's policy arena */
    size_t key_len;
    uint64_t hash;
    uint8_t lookup;     /* may be answered from the cache (no client no-cache) */
    uint8_t store;      /* its response may be stored (GET) */
    uint8_t authorized; /* carries credentials the key does not cover */
} sl_cache_ask_t;

/* Cache-Control directives (RFC 9111 5.2), from any number of lines. */
typedef struct {
    uint8_t no_store, no_cache, private_, public_, must_revalidate;
    int64_t max_age, s_maxage; /* seconds, -1 = absent */
} sl_cache_cc_t;
void sl_cache_cc_init(sl_cache_cc_t *cc);
void sl_cache_cc_parse(sl_cache_cc_t *cc, sl_str_t value);

/* Whether the config stores responses of this status. */
int sl_cache_conf_status(const sl_cache_conf_t *c, int status);
/* Whether a request header is part of the key (a Vary the key covers). */
int sl_cache_conf_keys_header(const sl_cache_conf_t *c, const char *name, size_t len);

#endif
