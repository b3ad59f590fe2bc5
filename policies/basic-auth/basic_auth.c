/*
 * basic-auth: `Authorization: Basic base64(user:password)` (RFC 7617),
 * checked against the Consumers' `credentials.basicAuth` (consumers.h:
 * user -> crypt(3) hash: bcrypt, yescrypt or SHA-crypt). The Consumer is
 * known to every later policy and the log. The Authorization header is
 * removed before the request goes upstream unless `forward: true`.
 *
 *   config: {realm: sluice, cacheSeconds: 300, forward: false}
 *
 * Cost. A password hash is slow on purpose (bcrypt and yescrypt tens of
 * milliseconds, SHA-crypt with many rounds as much): crypt_r runs on the
 * worker thread and blocks every connection of that worker while it runs.
 * So each worker keeps a cache of successful verifications, keyed by
 * SHA-256(user ":" password ":" hash) (a changed password or hash misses),
 * for cacheSeconds, at most CACHE_SLOTS entries: a client's repeated
 * requests pay crypt once per TTL. Failures are never cached (a cache of
 * wrong guesses would only help the guesser); what bounds guessing is the
 * rate-limit policy in front of this one. A debug log line gives crypt's
 * time for each verification, and says when the cache answered.
 *
 * Not here: user enumeration by timing (an unknown user is answered without
 * running crypt, faster than a wrong password for a known one).
 */
#include "consumers.h"
#include "log.h"
#include "policy.h"

#include <crypt.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define REALM_MAX 100
#define CRED_MAX 1024    /* decoded user:password bytes */
#define CACHE_SLOTS 1024 /* per worker and chain entry: 1024 * 48 bytes */
#define CACHE_WAYS 4     /* slots a key may sit in (set-associative) */

typedef struct {
    const sl_consumers_t *consumers; /* the generation's, outlives us */
    int forward;
    uint64_t cache_ms;   /* 0 = no cache */
    char challenge[192]; /* WWW-Authenticate */
} basic_auth_t;

/* ---- config ----------------------------------------------------------- */

static void check_realm(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_string(v)) {
        sl_validate_error(c, "expected string");
        return;
    }
    const char *s = json_string_value(v);
    size_t n = strlen(s);
    if (n == 0 || n > REALM_MAX) {
        sl_validate_error(c, "a realm of 1 to %d characters", REALM_MAX);
        return;
    }
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] >= 0x7f || s[i] == '"' ||
            s[i] == '\\') {
            sl_validate_error(c, "printable ASCII without '\"' or '\\' (it is sent in a quoted "
                                 "WWW-Authenticate parameter)");
            return;
        }
}

static const sl_vrange_t cache_range = {0, 86400};
static const sl_vfield_t fields[] = {
    {"realm", check_realm, NULL, 0},
    {"cacheSeconds", sl_vcheck_int, &cache_range, 0},
    {"forward", sl_vcheck_bool, NULL, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t schema = {fields, NULL};

static void *compile(json_t *config, const sl_policy_env_t *env, char *err, size_t errlen)
{
    basic_auth_t *b = calloc(1, sizeof(*b));
    if (!b) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    b->consumers = env->consumers;
    json_t *realm = json_object_get(config, "realm");
    json_t *cache = json_object_get(config, "cacheSeconds");
    b->forward = json_is_true(json_object_get(config, "forward"));
    b->cache_ms = 1000 * (uint64_t)(json_is_integer(cache) ? json_integer_value(cache) : 300);
    snprintf(b->challenge, sizeof(b->challenge), "Basic realm=\"%.*s\", charset=\"UTF-8\"",
             REALM_MAX, json_is_string(realm) ? json_string_value(realm) : "sluice");
    return b;
}

/* ---- the header --------------------------------------------------------- */

static int b64_value(unsigned char ch)
{
    if (ch >= 'A' && ch <= 'Z')
        return ch - 'A';
    if (ch >= 'a' && ch <= 'z')
        return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9')
        return ch - '0' + 52;
    if (ch == '+')
        return 62;
    if (ch == '/')
        return 63;
    return -1;
}

/* Standard base64 (RFC 4648 section 4), padding optional, nothing else
 * (no whitespace, no URL alphabet). Returns the decoded length, or -1. */
static long b64_decode(const char *in, size_t n, unsigned char *out, size_t cap)
{
    while (n > 0 && in[n - 1] == '=' && n % 4 != 1)
        n--; /* padding: at most two, checked below */
    if (n % 4 == 1)
        return -1;
    size_t olen = n / 4 * 3 + (n % 4 ? n % 4 - 1 : 0);
    if (olen > cap)
        return -1;
    uint32_t acc = 0;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int v = b64_value((unsigned char)in[i]);
        if (v < 0)
            return -1;
        acc = acc << 6 | (uint32_t)v;
        if (i % 4 == 3) {
            out[o++] = (unsigned char)(acc >> 16);
            out[o++] = (unsigned char)(acc >> 8);
            out[o++] = (unsigned char)acc;
            acc = 0;
        }
    }
    if (n % 4 == 2) {
        if (acc & 0xf)
            return -1; /* non-canonical: bits that decode to nothing */
        out[o++] = (unsigned char)(acc >> 4);
    } else if (n % 4 == 3) {
        if (acc & 0x3)
            return -1;
        out[o++] = (unsigned char)(acc >> 10);
        out[o++] = (unsigned char)(acc >> 2);
    }
    return (long)o;
}

enum parse_result {
    CRED_OK = 0,
    CRED_MISSING,   /* no Authorization header, or another scheme */
    CRED_MULTIPLE,  /* two Authorization headers */
    CRED_MALFORMED, /* Basic, but not base64 of user:password */
};

/* Finds the Basic credentials among the request's headers and decodes them
 * into buf (NUL-terminated: user '\0' password '\0'). */
static enum parse_result parse_credentials(const sl_policy_header_t *headers, size_t n, char *buf,
                                           size_t cap, sl_str_t *user, sl_str_t *password)
{
    const sl_policy_header_t *auth = NULL;
    for (size_t i = 0; i < n; i++)
        if (headers[i].name.len == 13 &&
            strncasecmp(headers[i].name.ptr, "authorization", 13) == 0) {
            if (auth)
                return CRED_MULTIPLE;
            auth = &headers[i];
        }
    if (!auth)
        return CRED_MISSING;
    const char *p = auth->value.ptr, *end = p + auth->value.len;
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    if (end - p < 5 || strncasecmp(p, "basic", 5) != 0)
        return CRED_MISSING;
    p += 5;
    if (p == end)
        return CRED_MALFORMED; /* "Basic" alone */
    if (*p != ' ')
        return CRED_MISSING; /* "Basicx ...": another scheme */
    while (p < end && *p == ' ')
        p++;
    if (p == end || cap < 2)
        return CRED_MALFORMED;
    long len = b64_decode(p, (size_t)(end - p), (unsigned char *)buf, cap - 1);
    if (len <= 0)
        return CRED_MALFORMED;
    char *colon = memchr(buf, ':', (size_t)len);
    if (!colon || colon == buf)
        return CRED_MALFORMED; /* no colon, or no user */
    /* crypt takes a C string: a NUL would cut the password short; control
     * characters are not allowed in either part (RFC 7617 section 2). */
    for (long i = 0; i < len; i++)
        if ((unsigned char)buf[i] < 0x20 || buf[i] == 0x7f)
            return CRED_MALFORMED;
    buf[len] = '\0';
    *colon = '\0';
    *user = (sl_str_t){buf, (size_t)(colon - buf)};
    *password = (sl_str_t){colon + 1, (size_t)(buf + len - colon - 1)};
    return CRED_OK;
}

/* ---- the per-worker cache ---------------------------------------------- */

typedef struct {
    uint8_t key[SHA256_DIGEST_LENGTH];
    uint64_t expires_ms; /* 0 = empty */
} cache_slot_t;

typedef struct {
    cache_slot_t slots[CACHE_SLOTS];
    struct crypt_data crypt; /* crypt_r's scratch: ~32 KiB, one per worker */
} worker_t;

/* 0, or -1 when it cannot be made (then the cache is not used). */
static int cache_key(sl_str_t user, sl_str_t password, const char *hash, uint8_t out[32])
{
    char in[CRED_MAX + 2 + 512];
    size_t hlen = strnlen(hash, 512), n = 0;
    memcpy(in + n, user.ptr, user.len), n += user.len;
    in[n++] = ':';
    memcpy(in + n, password.ptr, password.len), n += password.len;
    in[n++] = ':';
    memcpy(in + n, hash, hlen), n += hlen;
    int rc = sl_policy_sha256(in, n, out);
    OPENSSL_cleanse(in, n);
    return rc;
}

static size_t cache_set(const uint8_t key[32])
{
    uint64_t h;
    memcpy(&h, key, sizeof(h)); /* a SHA-256 is uniform already */
    return (size_t)(h % (CACHE_SLOTS / CACHE_WAYS)) * CACHE_WAYS;
}

static int cache_hit(const worker_t *w, const uint8_t key[32], uint64_t now_ms)
{
    const cache_slot_t *s = &w->slots[cache_set(key)];
    for (int i = 0; i < CACHE_WAYS; i++)
        if (s[i].expires_ms > now_ms && CRYPTO_memcmp(s[i].key, key, 32) == 0)
            return 1;
    return 0;
}

/* Into the first empty or expired slot of the key's set, else over the one
 * that expires first: the bound holds however many users a worker sees. */
static void cache_put(worker_t *w, const uint8_t key[32], uint64_t now_ms, uint64_t ttl_ms)
{
    cache_slot_t *s = &w->slots[cache_set(key)];
    int victim = 0;
    for (int i = 0; i < CACHE_WAYS; i++) {
        if (s[i].expires_ms <= now_ms || memcmp(s[i].key, key, 32) == 0) {
            victim = i;
            break;
        }
        if (s[i].expires_ms < s[victim].expires_ms)
            victim = i;
    }
    memcpy(s[victim].key, key, 32);
    s[victim].expires_ms = now_ms + ttl_ms;
}

static void *worker_new(const void *state)
{
    (void)state;
    return calloc(1, sizeof(worker_t));
}

/* ---- the request ---------------------------------------------------------- */

static int reject(const basic_auth_t *b, sl_policy_reply_t *reply, const char *message)
{
    reply->status = 401;
    reply->code = "unauthorized";
    snprintf(reply->message, sizeof(reply->message), "%s", message);
    reply->headers[0].name = "WWW-Authenticate";
    snprintf(reply->headers[0].value, sizeof(reply->headers[0].value), "%s", b->challenge);
    reply->num_headers = 1;
    return SL_POLICY_REPLY;
}

static uint64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* crypt_r with hash as the setting, compared with hash in constant time. */
static int verify(worker_t *w, const char *password, const char *hash, const char *api)
{
    uint64_t t0 = mono_us();
    const char *out = crypt_r(password, hash, &w->crypt);
    uint64_t us = mono_us() - t0;
    size_t hlen = strlen(hash);
    int ok = out && out[0] != '*' && strlen(out) == hlen && CRYPTO_memcmp(out, hash, hlen) == 0;
    sl_log_debug("basic-auth %s: crypt %.4s... took %llu.%03llu ms (%s)", api, hash,
                 (unsigned long long)(us / 1000), (unsigned long long)(us % 1000),
                 ok ? "match" : "no match");
    return ok;
}

/* Everything but the scrubbing of the decoded credentials (on_request). */
static int authenticate(const basic_auth_t *b, sl_policy_req_t *req, sl_policy_reply_t *reply,
                        char *buf, size_t cap)
{
    worker_t *w = req->worker_state;
    sl_str_t user, password;
    switch (parse_credentials(req->headers, req->num_headers, buf, cap, &user, &password)) {
    case CRED_OK:
        break;
    case CRED_MISSING:
        return reject(b, reply, "basic credentials are required (Authorization: Basic)");
    case CRED_MULTIPLE:
        return reject(b, reply, "more than one Authorization header in the request");
    case CRED_MALFORMED:
    default:
        return reject(b, reply, "the Authorization header is not Basic base64(user:password)");
    }
    const char *hash = NULL;
    const sl_consumer_t *c = sl_consumers_by_user(b->consumers, user, &hash);
    if (!c || !hash)
        return reject(b, reply, "the user name or password is not valid");
    uint8_t key[SHA256_DIGEST_LENGTH];
    int cacheable = b->cache_ms && cache_key(user, password, hash, key) == 0;
    const char *api = req->api ? req->api : "-";
    if (cacheable && cache_hit(w, key, req->now_ms)) {
        sl_log_debug("basic-auth %s: verified from the cache", api);
    } else {
        if (!verify(w, password.ptr, hash, api))
            return reject(b, reply, "the user name or password is not valid");
        if (cacheable)
            cache_put(w, key, req->now_ms, b->cache_ms);
    }
    req->consumer.name = c->name;
    req->consumer.group = c->group;
    /* The credential is the user name (a Consumer may have several). */
    char *cred = sl_policy_alloc(req, user.len + 1);
    if (cred) {
        memcpy(cred, user.ptr, user.len + 1);
        req->consumer.credential = cred;
    }
    if (b->forward)
        return SL_POLICY_CONTINUE;
    if (sl_policy_edit(req, 0, SL_HDR_REMOVE, "Authorization", 13, NULL, 0) != 0) {
        reply->status = 500;
        reply->code = "policy_error";
        snprintf(reply->message, sizeof(reply->message), "too many header edits");
        return SL_POLICY_REPLY;
    }
    return SL_POLICY_CONTINUE;
}

static int on_request(const void *state, sl_policy_req_t *req, sl_policy_reply_t *reply)
{
    char buf[CRED_MAX + 1];
    int rc = authenticate(state, req, reply, buf, sizeof(buf));
    OPENSSL_cleanse(buf, sizeof(buf)); /* the password, decoded */
    return rc;
}

const sl_policy_def_t sl_policy_basic_auth = {
    .name = "basic-auth",
    .phase = SL_PHASE_AUTHN,
    .schema = &schema,
    .compile = compile,
    .free = free,
    .on_request = on_request,
    .worker_new = worker_new,
    .worker_free = free,
};
