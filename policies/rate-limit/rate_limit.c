/*
 * rate-limit: requests per period by consumer, group, client IP, header
 * value or route; several limits at once (a request is admitted only when
 * every limit admits it). Rejections are 429 rate_limited with Retry-After
 * and RateLimit-Limit/-Remaining/-Reset; admitted responses carry the
 * RateLimit-* headers of the most restrictive limit (the one with the
 * fewest requests left). Phase RATE_LIMIT, after authentication; with
 * beforeAuthentication: true, ACCESS, so requests an authentication policy
 * refuses (wrong passwords) are counted too: only limits that need no
 * consumer (by ip, header, route) may run there.
 *
 *   config: {limits: [{requests: 5, period: 1s, by: consumer}],
 *            mode: local, headers: true, maxKeys: 16384}
 *   config: {limits: [...], mode: fleet, failOpen: false,
 *            redis: {address: "10.0.0.5:6379", password: ..., database: 0,
 *                    keyPrefix: "sluice:rl"}}
 *
 * Budgets live in a process-wide registry keyed by the policy's config
 * (canonical JSON), not in the generation: a reload that leaves a policy's
 * config alone keeps its counters (the new generation's compile finds the
 * table before the old generation lets go of it); a changed config starts
 * afresh. Bucket keys include the Api, so two Apis with the same config
 * share a table but not budgets, and the operations of one Api that inherit
 * its policy share one budget (an operation with its own config has its
 * own). local: rl_table.h (GCRA, lock-free). fleet: rl_fleet.h (leases
 * from Redis, a thread of its own).
 */
#include "fmt.h"
#include "policy.h"
#include "rl_fleet.h"
#include "rl_table.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#define MAX_LIMITS 8
#define DEFAULT_MAX_KEYS 16384

enum { BY_CONSUMER = 0, BY_GROUP, BY_IP, BY_HEADER, BY_ROUTE };
static const char *const by_names[] = {"consumer", "group", "ip", "header", "route", NULL};
static const char *const mode_names[] = {"local", "fleet", NULL};

/* ---- schema -------------------------------------------------------------------- */

static const sl_vrange_t requests_range = {1, 1000000};
static const sl_vrange_t period_range = {1000, 24 * 3600 * 1000};
static const sl_vrange_t max_keys_range = {64, 1 << 22};
static const sl_vrange_t database_range = {0, 15};

static void check_limit(sl_vctx_t *c, json_t *limit)
{
    json_t *by = sl_validate_get(limit, "by");
    json_t *header = sl_validate_get(limit, "header");
    int is_header = json_is_string(by) && strcmp(json_string_value(by), "header") == 0;
    if (is_header && !header) {
        size_t saved = sl_validate_push_key(c, "header");
        sl_validate_error(c, "required when by is header (the header whose value is the key)");
        sl_validate_pop(c, saved);
    } else if (!is_header && header) {
        size_t saved = sl_validate_push_key(c, "header");
        sl_validate_error(c, "only used with by: header");
        sl_validate_pop(c, saved);
    }
}

static const sl_vfield_t limit_fields[] = {
    {"requests", sl_vcheck_int, &requests_range, SL_VFIELD_REQUIRED},
    {"period", sl_vcheck_duration, &period_range, SL_VFIELD_REQUIRED},
    {"by", sl_vcheck_enum, by_names, SL_VFIELD_REQUIRED},
    {"header", sl_vcheck_string, NULL, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t limit_schema = {limit_fields, check_limit};

static int needs_consumer(const char *by)
{
    return by && (strcmp(by, "consumer") == 0 || strcmp(by, "group") == 0);
}
static const sl_varray_t limits_spec = {sl_vcheck_object, &limit_schema, 1, MAX_LIMITS};

/* "host:port", the port 1..65535. */
static int split_address(const char *a, char *host, size_t hostlen, int *port)
{
    const char *colon = strrchr(a, ':');
    if (!colon || colon == a || (size_t)(colon - a) >= hostlen)
        return -1;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || end == colon + 1 || p < 1 || p > 65535)
        return -1;
    size_t hl = (size_t)(colon - a);
    if (a[0] == '[' && hl > 2 && a[hl - 1] == ']') { /* [::1]:6379 */
        memcpy(host, a + 1, hl - 2);
        host[hl - 2] = '\0';
    } else {
        memcpy(host, a, hl);
        host[hl] = '\0';
    }
    *port = (int)p;
    return 0;
}

static void check_address(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    char host[256];
    int port;
    if (!json_is_string(v)) {
        sl_validate_error(c, "expected string host:port");
        return;
    }
    if (split_address(json_string_value(v), host, sizeof(host), &port) != 0)
        sl_validate_error(c, "expected host:port with a port 1..65535, like \"10.0.0.5:6379\"");
}

static const sl_vfield_t redis_fields[] = {
    {"address", check_address, NULL, SL_VFIELD_REQUIRED},
    {"password", sl_vcheck_string, NULL, SL_VFIELD_SECRET},
    {"database", sl_vcheck_int, &database_range, 0},
    {"keyPrefix", sl_vcheck_string, NULL, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t redis_schema = {redis_fields, NULL};

static void check_config(sl_vctx_t *c, json_t *obj)
{
    json_t *mode = sl_validate_get(obj, "mode");
    int fleet = json_is_string(mode) && strcmp(json_string_value(mode), "fleet") == 0;
    if (fleet && !sl_validate_get(obj, "redis")) {
        size_t saved = sl_validate_push_key(c, "redis");
        sl_validate_error(c, "required when mode is fleet (redis: {address: host:port})");
        sl_validate_pop(c, saved);
    }
    if (!fleet && sl_validate_get(obj, "redis")) {
        size_t saved = sl_validate_push_key(c, "redis");
        sl_validate_error(c, "only used with mode: fleet");
        sl_validate_pop(c, saved);
    }
    if (!fleet && sl_validate_get(obj, "failOpen")) {
        size_t saved = sl_validate_push_key(c, "failOpen");
        sl_validate_error(c, "only used with mode: fleet (a local limit cannot be unavailable)");
        sl_validate_pop(c, saved);
    }
    if (json_is_true(sl_validate_get(obj, "beforeAuthentication"))) {
        json_t *limits = sl_validate_get(obj, "limits");
        for (size_t i = 0; i < json_array_size(limits); i++) {
            const char *by = json_string_value(sl_validate_get(json_array_get(limits, i), "by"));
            if (!needs_consumer(by))
                continue;
            size_t saved = sl_validate_push_key(c, "limits");
            sl_validate_push_index(c, i);
            sl_validate_push_key(c, "by");
            sl_validate_error(c,
                              "by: %s needs the authenticated consumer, which is not known "
                              "before authentication (with beforeAuthentication: true, count "
                              "by ip, header or route)",
                              by);
            sl_validate_pop(c, saved);
        }
    }
}

/* ACCESS with beforeAuthentication: the request has not met an
 * authentication policy yet (policy.h, phase_of). */
static enum sl_policy_phase phase_of(json_t *config)
{
    return json_is_true(json_object_get(config, "beforeAuthentication")) ? SL_PHASE_ACCESS
                                                                         : SL_PHASE_RATE_LIMIT;
}

static const sl_vfield_t fields[] = {
    {"limits", sl_vcheck_array, &limits_spec, SL_VFIELD_REQUIRED},
    {"mode", sl_vcheck_enum, mode_names, 0},
    {"redis", sl_vcheck_object, &redis_schema, 0},
    {"failOpen", sl_vcheck_bool, NULL, 0},
    {"headers", sl_vcheck_bool, NULL, 0},
    {"maxKeys", sl_vcheck_int, &max_keys_range, 0},
    {"beforeAuthentication", sl_vcheck_bool, NULL, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t schema = {fields, check_config};

/* ---- the registry of budgets ------------------------------------------------- */

typedef struct shared {
    struct shared *next;
    char *config; /* canonical JSON: the registry's key */
    unsigned refs;
    sl_rl_table_t *table; /* local */
    sl_rl_fleet_t *fleet; /* fleet */
} shared_t;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static shared_t *registry;
static uint64_t process_seed;

typedef struct {
    int by;
    char header[128];
    size_t header_len;
    uint64_t requests, period_ms;
    sl_rl_gcra_t gcra;
    char period_text[32];
    char requests_text[24]; /* RateLimit-Limit's value, formatted once */
    size_t requests_text_len;
} limit_t;

typedef struct {
    shared_t *sh;
    uint64_t seed; /* of bucket keys: random per process (local), the config's hash (fleet) */
    int fleet, fail_open, headers;
    size_t nlimits;
    limit_t limits[MAX_LIMITS];
    /* The start of each limit's bucket keys: the seed, the limit and the
     * Api (env->api, the name requests carry in req->api), hashed once
     * here; api_seeded = 0 when compile was not told the Api. */
    uint64_t api_seed[MAX_LIMITS];
    const char *api_name; /* env->api, which outlives the state */
    int api_seeded;
} rl_t;

static void shared_release(shared_t *sh)
{
    pthread_mutex_lock(&registry_lock);
    int last = --sh->refs == 0;
    if (last)
        for (shared_t **p = &registry; *p; p = &(*p)->next)
            if (*p == sh) {
                *p = sh->next;
                break;
            }
    pthread_mutex_unlock(&registry_lock);
    if (!last)
        return;
    sl_rl_table_free(sh->table);
    sl_rl_fleet_free(sh->fleet);
    free(sh->config);
    free(sh);
}

static void rl_free(void *state)
{
    rl_t *rl = state;
    if (!rl)
        return;
    if (rl->sh)
        shared_release(rl->sh);
    free(rl);
}

static int parse_limits(rl_t *rl, json_t *limits, char *err, size_t errlen)
{
    if (!json_is_array(limits) || json_array_size(limits) == 0 ||
        json_array_size(limits) > MAX_LIMITS) {
        snprintf(err, errlen, "limits: between 1 and %d limits are required", MAX_LIMITS);
        return -1;
    }
    rl->nlimits = json_array_size(limits);
    for (size_t i = 0; i < rl->nlimits; i++) {
        json_t *l = json_array_get(limits, i);
        limit_t *lim = &rl->limits[i];
        json_t *by = json_object_get(l, "by"), *period = json_object_get(l, "period");
        json_int_t requests = json_integer_value(json_object_get(l, "requests"));
        uint64_t period_ms;
        if (!json_is_string(by) || requests < 1 || !period ||
            sl_parse_duration_ms(period, &period_ms) != 0 || period_ms < 1000) {
            snprintf(err, errlen, "limits[%zu]: requests, period and by are required", i);
            return -1;
        }
        lim->by = -1;
        for (int b = 0; by_names[b]; b++)
            if (strcmp(by_names[b], json_string_value(by)) == 0)
                lim->by = b;
        const char *h = json_string_value(json_object_get(l, "header"));
        if (lim->by < 0 || (lim->by == BY_HEADER && (!h || strlen(h) >= sizeof(lim->header)))) {
            snprintf(err, errlen, "limits[%zu]: by or header is not valid", i);
            return -1;
        }
        if (h && lim->by == BY_HEADER) {
            strcpy(lim->header, h);
            lim->header_len = strlen(h);
        }
        lim->requests = (uint64_t)requests;
        lim->period_ms = period_ms;
        lim->gcra = sl_rl_gcra_make(lim->requests, period_ms * 1000000ull);
        lim->requests_text_len = (size_t)snprintf(lim->requests_text, sizeof(lim->requests_text),
                                                  "%llu", (unsigned long long)lim->requests);
        if (json_is_string(period))
            snprintf(lim->period_text, sizeof(lim->period_text), "%s", json_string_value(period));
        else
            snprintf(lim->period_text, sizeof(lim->period_text), "%llums",
                     (unsigned long long)period_ms);
    }
    return 0;
}

static void *compile(json_t *config, const sl_policy_env_t *env, char *err, size_t errlen)
{
    rl_t *rl = calloc(1, sizeof(*rl));
    if (!rl) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (parse_limits(rl, json_object_get(config, "limits"), err, errlen) != 0)
        goto fail;
    const char *mode = json_string_value(json_object_get(config, "mode"));
    rl->fleet = mode && strcmp(mode, "fleet") == 0;
    rl->fail_open = json_is_true(json_object_get(config, "failOpen"));
    rl->headers = !json_is_false(json_object_get(config, "headers"));
    json_t *mk = json_object_get(config, "maxKeys");
    size_t max_keys = json_is_integer(mk) ? (size_t)json_integer_value(mk) : DEFAULT_MAX_KEYS;
    if (env->check_only)
        return rl; /* the buckets and the Redis client are the runtime's */

    char *canon = json_dumps(config, JSON_COMPACT | JSON_SORT_KEYS);
    if (!canon) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    uint64_t cfg_hash = sl_rl_hash(0, canon, strlen(canon));

    pthread_mutex_lock(&registry_lock);
    if (!process_seed && getrandom(&process_seed, sizeof(process_seed), 0) != sizeof(process_seed))
        process_seed = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull;
    rl->seed = rl->fleet ? cfg_hash : process_seed ^ cfg_hash;
    shared_t *sh;
    for (sh = registry; sh; sh = sh->next)
        if (strcmp(sh->config, canon) == 0)
            break;
    if (sh) {
        sh->refs++;
        free(canon);
    } else if ((sh = calloc(1, sizeof(*sh)))) {
        sh->config = canon;
        sh->refs = 1;
        if (rl->fleet) {
            json_t *redis = json_object_get(config, "redis");
            char host[256];
            int port;
            const char *addr = json_string_value(json_object_get(redis, "address"));
            const char *prefix = json_string_value(json_object_get(redis, "keyPrefix"));
            sl_rl_fleet_limit_t fl[MAX_LIMITS];
            for (size_t i = 0; i < rl->nlimits; i++)
                fl[i] = (sl_rl_fleet_limit_t){rl->limits[i].requests, rl->limits[i].period_ms};
            if (!addr || split_address(addr, host, sizeof(host), &port) != 0) {
                snprintf(err, errlen, "redis.address: expected host:port");
            } else {
                sl_rl_fleet_conf_t fc = {
                    host,
                    port,
                    json_string_value(json_object_get(redis, "password")),
                    (int)json_integer_value(json_object_get(redis, "database")),
                    prefix ? prefix : "sluice:rl",
                    cfg_hash,
                    max_keys,
                    rl->fail_open,
                };
                sh->fleet = sl_rl_fleet_new(&fc, fl, rl->nlimits, err, errlen);
            }
        } else {
            sh->table = sl_rl_table_new(max_keys);
            if (!sh->table)
                snprintf(err, errlen, "out of memory for %zu buckets", max_keys);
        }
        if (!sh->table && !sh->fleet) {
            free(sh->config);
            free(sh);
            sh = NULL;
        } else {
            sh->next = registry;
            registry = sh;
        }
    } else {
        free(canon);
        snprintf(err, errlen, "out of memory");
    }
    pthread_mutex_unlock(&registry_lock);
    if (!sh)
        goto fail;
    rl->sh = sh;
    if (env->api) {
        for (size_t i = 0; i < rl->nlimits; i++)
            rl->api_seed[i] = sl_rl_hash(rl->seed + (i + 1) * 0x9e3779b97f4a7c15ull, env->api,
                                         strlen(env->api) + 1);
        rl->api_name = env->api;
        rl->api_seeded = 1;
    }
    return rl;
fail:
    free(rl);
    return NULL;
}

/* ---- requests ------------------------------------------------------------------ */

/* The bucket key of limit i for this request: the Api, the limit, what the
 * limit counts by. Anonymous callers of a by-consumer (or by-group) limit,
 * and requests without the header of a by-header limit, count by client
 * IP. */
static uint64_t bucket_key(const rl_t *rl, size_t i, const sl_policy_req_t *req)
{
    const limit_t *lim = &rl->limits[i];
    uint64_t h;
    if (rl->api_seeded && req->api == rl->api_name) {
        h = rl->api_seed[i];
    } else {
        const char *api = req->api ? req->api : "";
        h = sl_rl_hash(rl->seed + (i + 1) * 0x9e3779b97f4a7c15ull, api, strlen(api) + 1);
    }
    const char *k = NULL;
    size_t klen = 0;
    char tag = 'i';
    switch (lim->by) {
    case BY_GROUP:
        if (req->consumer.group) {
            tag = 'g';
            k = req->consumer.group;
            break;
        }
        /* a consumer without a group is a group of its own */
        __attribute__((fallthrough));
    case BY_CONSUMER:
        if (req->consumer.name) {
            tag = 'c';
            k = req->consumer.name;
        }
        break;
    case BY_HEADER: {
        const sl_policy_header_t *f = sl_policy_header(req, lim->header, lim->header_len);
        if (f) {
            tag = 'h';
            k = f->value.ptr;
            klen = f->value.len;
        }
        break;
    }
    case BY_ROUTE:
        tag = 'r';
        k = req->operation ? req->operation : "";
        break;
    default:
        break;
    }
    if (!k) {
        tag = 'i';
        k = req->client_ip ? req->client_ip : "";
    }
    if (!klen)
        klen = strlen(k);
    h = sl_rl_hash(h, &tag, 1);
    return sl_rl_hash(h, k, klen);
}

static uint64_t seconds_up(uint64_t ns)
{
    return (ns + 999999999ull) / 1000000000ull;
}

static void give_back(const rl_t *rl, const uint64_t *keys, size_t n, uint64_t now_real_ms)
{
    for (size_t j = 0; j < n; j++) {
        if (!keys[j])
            continue; /* skipped (fleet unavailable, fail open) */
        if (rl->fleet)
            sl_rl_fleet_refund(rl->sh->fleet, keys[j], now_real_ms, (unsigned)j);
        else
            sl_rl_table_refund(rl->sh->table, keys[j], &rl->limits[j].gcra);
    }
}

static void set_header(sl_policy_reply_t *reply, const char *name, uint64_t value)
{
    unsigned i = reply->num_headers++;
    reply->headers[i].name = name;
    snprintf(reply->headers[i].value, sizeof(reply->headers[i].value), "%llu",
             (unsigned long long)value);
}

static int on_request(const void *state, sl_policy_req_t *req, sl_policy_reply_t *reply)
{
    const rl_t *rl = state;
    struct timespec ts;
    uint64_t now_ns = 0, now_real_ms = 0;
    if (rl->fleet) {
        clock_gettime(CLOCK_REALTIME, &ts);
        now_real_ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    } else {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        now_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    }
    uint64_t keys[MAX_LIMITS] = {0};
    sl_rl_verdict_t best = {0, UINT64_MAX, 0, 0};
    size_t best_i = SIZE_MAX;
    for (size_t i = 0; i < rl->nlimits; i++) {
        const limit_t *lim = &rl->limits[i];
        uint64_t key = bucket_key(rl, i, req);
        if (key == 0)
            key = 1; /* 0 means "not taken" in keys[] */
        sl_rl_verdict_t v;
        int admitted;
        if (rl->fleet) {
            int rc = sl_rl_fleet_take(rl->sh->fleet, (unsigned)i, key, now_real_ms, &v);
            if (rc == SL_RL_FLEET_UNAVAILABLE) {
                if (rl->fail_open)
                    continue; /* this limit is not enforced until Redis is back */
                give_back(rl, keys, i, now_real_ms);
                reply->status = 503;
                reply->code = "rate_limit_unavailable";
                snprintf(reply->message, sizeof(reply->message),
                         "the rate limit cannot be checked (its Redis is unreachable)");
                set_header(reply, "Retry-After", 1);
                return SL_POLICY_REPLY;
            }
            admitted = rc == SL_RL_FLEET_ADMIT;
        } else {
            admitted = sl_rl_table_take(rl->sh->table, key, &lim->gcra, now_ns, &v);
        }
        if (!admitted) {
            give_back(rl, keys, i, now_real_ms);
            reply->status = 429;
            reply->code = "rate_limited";
            snprintf(reply->message, sizeof(reply->message),
                     "rate limit exceeded: %llu requests per %s by %s",
                     (unsigned long long)lim->requests, lim->period_text, by_names[lim->by]);
            uint64_t retry = seconds_up(v.retry_after_ns);
            set_header(reply, "Retry-After", retry ? retry : 1);
            if (rl->headers) {
                set_header(reply, "RateLimit-Limit", lim->requests);
                set_header(reply, "RateLimit-Remaining", 0);
                set_header(reply, "RateLimit-Reset", seconds_up(v.reset_ns));
            }
            return SL_POLICY_REPLY;
        }
        keys[i] = key;
        if (v.remaining < best.remaining ||
            (v.remaining == best.remaining && v.reset_ns > best.reset_ns)) {
            best = v;
            best_i = i;
        }
    }
    if (!rl->headers || best_i == SIZE_MAX)
        return SL_POLICY_CONTINUE;
    /* The most restrictive limit's figures on the response. */
    static const char *const names[3] = {"RateLimit-Limit", "RateLimit-Remaining",
                                         "RateLimit-Reset"};
    const limit_t *lim = &rl->limits[best_i];
    uint64_t values[3] = {0, best.remaining, seconds_up(best.reset_ns)};
    static const size_t name_lens[3] = {15, 19, 15};
    if (sl_policy_edit(req, 1, SL_HDR_SET, names[0], name_lens[0], lim->requests_text,
                       lim->requests_text_len) != 0)
        return SL_POLICY_CONTINUE;
    for (int i = 1; i < 3; i++) {
        char *buf = sl_policy_alloc(req, 20);
        if (!buf)
            break; /* the arena is full: the headers are informative, the request goes on */
        size_t n = sl_fmt_u64(buf, values[i]);
        if (sl_policy_edit(req, 1, SL_HDR_SET, names[i], name_lens[i], buf, n) != 0)
            break;
    }
    return SL_POLICY_CONTINUE;
}

static const char *metric_scope(const void *state)
{
    return ((const rl_t *)state)->fleet ? "fleet" : "local";
}

const sl_policy_def_t sl_policy_rate_limit = {
    .name = "rate-limit",
    .phase = SL_PHASE_RATE_LIMIT,
    .phase_of = phase_of,
    .schema = &schema,
    .compile = compile,
    .free = rl_free,
    .on_request = on_request,
    .metric_scope = metric_scope,
};
