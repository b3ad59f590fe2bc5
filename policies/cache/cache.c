/*
 * cache: a response cache for GET and HEAD, shared by the workers of a
 * runtime (docs/policies/cache.md).
 *
 *   config: {ttl: 60s, maxBytes: 67108864, maxEntryBytes: 1048576,
 *            keyQuery: [page, sort], keyHeaders: [Accept-Language],
 *            statuses: [200, 203, 204, 300, 301, 308, 404, 410],
 *            respectCacheControl: true, respectRequestCacheControl: true,
 *            coalesce: true, coalesceTimeout: 5s, ignoreCookies: false}
 *
 * This file is the policy: its config, and per request the decision to
 * take part (GET or HEAD, no body, no Range, no client no-store, no
 * Cookie unless allowed), the key (Api, operation, host, path, the query
 * or the chosen parameters, the chosen headers, and the authenticated
 * Consumer when an authentication policy found one, so a response stored
 * for one consumer never answers another), and X-Cache / Age on the
 * response. The lookup, the coalescing of misses, serving a hit and
 * capturing a response to store are the runtime's (runtime/proxy/cache.c),
 * the memory is cache_store.c.
 *
 * Its phase is the last one: a hit is answered only to a request that
 * every access, authentication, authorization, rate-limit and request
 * policy of the chain let through.
 */
#include "cache_policy.h"
#include "policy.h"

#include <ctype.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define DEFAULT_TTL_MS 60000u
#define DEFAULT_MAX_BYTES (64u << 20)
#define DEFAULT_MAX_ENTRY_BYTES (1u << 20)
#define DEFAULT_COALESCE_TIMEOUT_MS 5000u
#define MAX_PASS_MS 120000u

static const int default_statuses[] = {200, 203, 204, 300, 301, 308, 404, 410};

/* ---- schema -------------------------------------------------------------------- */

static const sl_vrange_t ttl_range = {1000, 30LL * 24 * 3600 * 1000};
static const sl_vrange_t max_bytes_range = {65536, (int64_t)1 << 40};
static const sl_vrange_t max_entry_range = {1, (int64_t)1 << 30};
static const sl_vrange_t coalesce_timeout_range = {10, 60000};
static const sl_vrange_t status_range = {200, 599};

static int is_tchar(int ch)
{
    return isalnum(ch) || strchr("!#$%&'*+-.^_`|~", ch);
}

static void check_header_name(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_string(v) || !json_string_length(v)) {
        sl_validate_error(c, "expected a header name");
        return;
    }
    const char *s = json_string_value(v);
    for (const char *p = s; *p; p++)
        if (!is_tchar((unsigned char)*p)) {
            sl_validate_error(c, "'%s' is not a header name (RFC 9110 token characters)", s);
            return;
        }
    if (strcasecmp(s, "authorization") == 0)
        sl_validate_error(c, "Authorization is never part of the key (a credential in a cache "
                             "key is a credential in memory): the authenticated Consumer is, "
                             "when an authentication policy runs before the cache");
}

static void check_status(sl_vctx_t *c, json_t *v, const void *arg)
{
    sl_vcheck_int(c, v, arg);
    if (!json_is_integer(v))
        return;
    json_int_t s = json_integer_value(v);
    if (s == 206)
        sl_validate_error(c, "206 is not cached (partial content answers a Range request, "
                             "which the cache passes to the origin)");
    else if (s == 304)
        sl_validate_error(c, "304 is not cached (it answers a conditional request; the cache "
                             "stores the full response)");
}

static const sl_varray_t key_query_spec = {sl_vcheck_string, NULL, 0, SL_CACHE_MAX_KEY_QUERY};
static const sl_varray_t key_headers_spec = {check_header_name, NULL, 0, SL_CACHE_MAX_KEY_HEADERS};
static const sl_varray_t statuses_spec = {check_status, &status_range, 1, 64};

static void check_config(sl_vctx_t *c, json_t *obj)
{
    json_t *max = sl_validate_get(obj, "maxBytes");
    json_t *entry = sl_validate_get(obj, "maxEntryBytes");
    json_int_t max_v = max ? json_integer_value(max) : DEFAULT_MAX_BYTES;
    json_int_t entry_v = entry ? json_integer_value(entry) : 0;
    if (entry_v > max_v) {
        size_t saved = sl_validate_push_key(c, "maxEntryBytes");
        sl_validate_error(c, "%lld is larger than maxBytes (%lld): no response could be stored",
                          (long long)entry_v, (long long)max_v);
        sl_validate_pop(c, saved);
    }
    json_t *coalesce = sl_validate_get(obj, "coalesce");
    if (coalesce && json_is_false(coalesce) && sl_validate_get(obj, "coalesceTimeout")) {
        size_t saved = sl_validate_push_key(c, "coalesceTimeout");
        sl_validate_error(c, "only used with coalesce: true");
        sl_validate_pop(c, saved);
    }
}

static const sl_vfield_t fields[] = {
    {"ttl", sl_vcheck_duration, &ttl_range, 0},
    {"maxBytes", sl_vcheck_int, &max_bytes_range, 0},
    {"maxEntryBytes", sl_vcheck_int, &max_entry_range, 0},
    {"keyQuery", sl_vcheck_array, &key_query_spec, 0},
    {"keyHeaders", sl_vcheck_array, &key_headers_spec, 0},
    {"statuses", sl_vcheck_array, &statuses_spec, 0},
    {"respectCacheControl", sl_vcheck_bool, NULL, 0},
    {"respectRequestCacheControl", sl_vcheck_bool, NULL, 0},
    {"coalesce", sl_vcheck_bool, NULL, 0},
    {"coalesceTimeout", sl_vcheck_duration, &coalesce_timeout_range, 0},
    {"ignoreCookies", sl_vcheck_bool, NULL, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t schema = {fields, check_config};

/* ---- compile ------------------------------------------------------------------- */

static void set_status(sl_cache_conf_t *c, int s)
{
    if (s >= 0 && s < 640)
        c->statuses[s / 64] |= 1ULL << (s % 64);
}

int sl_cache_conf_status(const sl_cache_conf_t *c, int s)
{
    return s >= 0 && s < 640 && (c->statuses[s / 64] & (1ULL << (s % 64)));
}

int sl_cache_conf_keys_header(const sl_cache_conf_t *c, const char *name, size_t len)
{
    for (size_t i = 0; i < c->num_key_headers; i++)
        if (strlen(c->key_headers[i]) == len && strncasecmp(c->key_headers[i], name, len) == 0)
            return 1;
    return 0;
}

static void cfree(void *state)
{
    sl_cache_conf_t *c = state;
    if (!c)
        return;
    sl_cache_zone_release(c->zone, c);
    for (size_t i = 0; i < c->num_key_query; i++)
        free(c->key_query[i]);
    for (size_t i = 0; i < c->num_key_headers; i++)
        free(c->key_headers[i]);
    free(c);
}

static uint64_t get_ms(json_t *config, const char *name, uint64_t def)
{
    json_t *v = sl_validate_get(config, name);
    uint64_t ms;
    return v && sl_parse_duration_ms(v, &ms) == 0 ? ms : def;
}

static int get_bool(json_t *config, const char *name, int def)
{
    json_t *v = sl_validate_get(config, name);
    return v ? json_is_true(v) : def;
}

static void *compile(json_t *config, const sl_policy_env_t *env, char *err, size_t errlen)
{
    sl_cache_conf_t *c = calloc(1, sizeof(*c));
    if (!c)
        goto nomem;
    c->ttl_ms = get_ms(config, "ttl", DEFAULT_TTL_MS);
    json_t *v = sl_validate_get(config, "maxBytes");
    c->max_bytes = v ? (uint64_t)json_integer_value(v) : DEFAULT_MAX_BYTES;
    v = sl_validate_get(config, "maxEntryBytes");
    /* By default 1 MiB, or all of a smaller zone. */
    c->max_entry_bytes = v                                        ? (uint64_t)json_integer_value(v)
                         : c->max_bytes < DEFAULT_MAX_ENTRY_BYTES ? c->max_bytes
                                                                  : DEFAULT_MAX_ENTRY_BYTES;
    c->coalesce = (uint8_t)get_bool(config, "coalesce", 1);
    c->coalesce_timeout_ms = get_ms(config, "coalesceTimeout", DEFAULT_COALESCE_TIMEOUT_MS);
    c->pass_ms = c->ttl_ms < MAX_PASS_MS ? c->ttl_ms : MAX_PASS_MS;
    c->respect_cache_control = (uint8_t)get_bool(config, "respectCacheControl", 1);
    c->respect_request_cache_control = (uint8_t)get_bool(config, "respectRequestCacheControl", 1);
    c->ignore_cookies = (uint8_t)get_bool(config, "ignoreCookies", 0);
    json_t *kq = sl_validate_get(config, "keyQuery");
    c->whole_query = kq == NULL;
    size_t i;
    json_t *item;
    json_array_foreach(kq, i, item)
    {
        if (!(c->key_query[c->num_key_query] = strdup(json_string_value(item))))
            goto nomem;
        c->num_key_query++;
    }
    json_array_foreach(sl_validate_get(config, "keyHeaders"), i, item)
    {
        char *h = strdup(json_string_value(item));
        if (!h)
            goto nomem;
        for (char *p = h; *p; p++)
            *p = (char)tolower((unsigned char)*p);
        c->key_headers[c->num_key_headers++] = h;
        c->key_cookie |= strcmp(h, "cookie") == 0;
    }
    json_t *st = sl_validate_get(config, "statuses");
    if (st) {
        json_array_foreach(st, i, item) set_status(c, (int)json_integer_value(item));
    } else {
        for (i = 0; i < SL_ARRAY_LEN(default_statuses); i++)
            set_status(c, default_statuses[i]);
    }
    if (env && env->check_only)
        return c; /* the controller's check: no shared store (policy.h) */
    c->zone = sl_cache_zone_acquire(env ? env->api : NULL, c->max_bytes, c);
    if (!c->zone)
        goto nomem;
    return c;
nomem:
    cfree(c);
    snprintf(err, errlen, "out of memory");
    return NULL;
}

/* ---- Cache-Control ------------------------------------------------------------- */

void sl_cache_cc_init(sl_cache_cc_t *cc)
{
    memset(cc, 0, sizeof(*cc));
    cc->max_age = cc->s_maxage = -1;
}

/* delta-seconds (RFC 9111 1.2.2), quoted or not; -1 when not a number. A
 * value past 2^31 is taken as 2^31 (the RFC's "infinity"). */
static int64_t delta_seconds(const char *p, const char *end)
{
    if (p < end && *p == '"') {
        p++;
        if (end > p && end[-1] == '"')
            end--;
    }
    if (p == end)
        return -1;
    int64_t n = 0;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        if (n < 2147483648LL)
            n = n * 10 + (*p - '0');
    }
    return n > 2147483648LL ? 2147483648LL : n;
}

void sl_cache_cc_parse(sl_cache_cc_t *cc, sl_str_t value)
{
    const char *p = value.ptr, *end = value.ptr + value.len;
    while (p < end) {
        while (p < end && (*p == ' ' || *p == '\t' || *p == ','))
            p++;
        const char *name = p;
        while (p < end && *p != ',' && *p != '=' && *p != ' ' && *p != '\t')
            p++;
        size_t nlen = (size_t)(p - name);
        const char *val = NULL, *vend = NULL;
        while (p < end && (*p == ' ' || *p == '\t'))
            p++;
        if (p < end && *p == '=') {
            p++;
            while (p < end && (*p == ' ' || *p == '\t'))
                p++;
            val = p;
            if (p < end && *p == '"') {
                p++;
                while (p < end && *p != '"')
                    p++;
                if (p < end)
                    p++;
            } else {
                while (p < end && *p != ',' && *p != ' ' && *p != '\t')
                    p++;
            }
            vend = p;
        }
        while (p < end && *p != ',')
            p++;
#define IS(lit) (nlen == sizeof(lit) - 1 && strncasecmp(name, lit, nlen) == 0)
        if (IS("no-store"))
            cc->no_store = 1;
        else if (IS("no-cache"))
            cc->no_cache = 1; /* with a field list too: stricter is safe */
        else if (IS("private"))
            cc->private_ = 1;
        else if (IS("public"))
            cc->public_ = 1;
        else if (IS("must-revalidate") || IS("proxy-revalidate"))
            cc->must_revalidate = 1;
        else if (IS("max-age") && val) {
            int64_t n = delta_seconds(val, vend);
            /* Invalid: treated as stale (RFC 9111 4.2.1). */
            cc->max_age = n < 0 ? 0 : n;
        } else if (IS("s-maxage") && val) {
            int64_t n = delta_seconds(val, vend);
            cc->s_maxage = n < 0 ? 0 : n;
        }
#undef IS
    }
}

/* ---- the request ----------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
    int overflow;
} keybuf_t;

static void put(keybuf_t *k, const char *s, size_t n)
{
    if (n == 0) /* an empty slice may have no pointer (HTTP/2's query) */
        return;
    if (k->overflow || n > k->cap - k->len) {
        k->overflow = 1;
        return;
    }
    memcpy(k->p + k->len, s, n);
    k->len += n;
}

static void put_lower(keybuf_t *k, sl_str_t s)
{
    if (k->overflow || s.len > k->cap - k->len) {
        k->overflow = 1;
        return;
    }
    for (size_t i = 0; i < s.len; i++)
        k->p[k->len++] = (char)tolower((unsigned char)s.ptr[i]);
}

/* Every value of header `name`, in order, joined by ", ". */
static void put_header(keybuf_t *k, const sl_policy_req_t *r, const char *name)
{
    size_t len = strlen(name);
    put(k, name, len);
    put(k, ":", 1);
    int first = 1;
    for (size_t i = 0; i < r->num_headers; i++) {
        const sl_policy_header_t *h = &r->headers[i];
        if (h->name.len != len || strncasecmp(h->name.ptr, name, len) != 0)
            continue;
        if (!first)
            put(k, ", ", 2);
        put(k, h->value.ptr, h->value.len);
        first = 0;
    }
    put(k, "\n", 1);
}

/*
 * The key: fields a newline apart (no field of a request can hold one).
 * The Api and operation keep two routes' entries apart; the host and the
 * normalised path are what the route matched; the consumer is "@" and its
 * name, or "@" alone for an anonymous request.
 */
static int build_key(const sl_cache_conf_t *c, sl_policy_req_t *r, keybuf_t *k)
{
    put(k, r->api ? r->api : "", r->api ? strlen(r->api) : 0);
    put(k, "\n", 1);
    put(k, r->operation ? r->operation : "", r->operation ? strlen(r->operation) : 0);
    put(k, "\n", 1);
    put_lower(k, r->host);
    put(k, "\n", 1);
    put(k, r->path.ptr, r->path.len);
    put(k, "\n?", 2);
    /* The query as forwarded: an api-key in a parameter is removed by then
     * (a credential has no place in a key; the Consumer is in it). */
    sl_str_t q = r->query_out.ptr ? r->query_out : r->query;
    if (c->whole_query) {
        put(k, q.ptr, q.len);
    } else {
        for (size_t i = 0; i < c->num_key_query; i++) {
            const char *name = c->key_query[i];
            size_t nlen = strlen(name), from, to;
            sl_str_t val;
            put(k, name, nlen);
            if (sl_policy_query_param(q, name, nlen, &val, &from, &to)) {
                put(k, "=", 1);
                put(k, val.ptr, val.len);
            }
            put(k, "&", 1);
        }
    }
    put(k, "\n", 1);
    for (size_t i = 0; i < c->num_key_headers; i++)
        put_header(k, r, c->key_headers[i]);
    put(k, "@", 1);
    if (r->consumer.name)
        put(k, r->consumer.name, strlen(r->consumer.name));
    return k->overflow ? -1 : 0;
}

static int bypass(const sl_cache_conf_t *c, sl_policy_req_t *r)
{
    r->cache_status = "BYPASS";
    sl_cache_zone_count(c->zone, SL_CACHE_BYPASS);
    return SL_POLICY_CONTINUE;
}

static int on_request(const void *state, sl_policy_req_t *r, sl_policy_reply_t *reply)
{
    (void)reply;
    const sl_cache_conf_t *c = state;
    int head = r->method.len == 4 && memcmp(r->method.ptr, "HEAD", 4) == 0;
    int get = r->method.len == 3 && memcmp(r->method.ptr, "GET", 3) == 0;
    if (!get && !head)
        return SL_POLICY_CONTINUE; /* not the cache's: no X-Cache either */
    /* A request with a body is not what a cached response answered; a
     * range is the origin's to cut; an upgrade is a tunnel. */
    const sl_policy_header_t *cl = sl_policy_header(r, "content-length", 14);
    if ((cl && !(cl->value.len == 1 && cl->value.ptr[0] == '0')) ||
        sl_policy_header(r, "transfer-encoding", 17) || sl_policy_header(r, "range", 5) ||
        sl_policy_header(r, "upgrade", 7))
        return bypass(c, r);
    /* A cookie may make the response personal where the origin forgot to
     * say so (Varnish's default): only with ignoreCookies or Cookie in the
     * key. */
    if (!c->ignore_cookies && !c->key_cookie && sl_policy_header(r, "cookie", 6))
        return bypass(c, r);
    int lookup = 1;
    if (c->respect_request_cache_control) {
        sl_cache_cc_t cc;
        sl_cache_cc_init(&cc);
        int has_cc = 0;
        for (size_t i = 0; i < r->num_headers; i++) {
            const sl_policy_header_t *h = &r->headers[i];
            if (h->name.len == 13 && strncasecmp(h->name.ptr, "cache-control", 13) == 0) {
                sl_cache_cc_parse(&cc, h->value);
                has_cc = 1;
            }
        }
        if (cc.no_store)
            return bypass(c, r);
        /* no-cache / max-age=0: a fresh response from the origin, which
         * then replaces the stored one (there is no revalidation). */
        if (cc.no_cache || cc.max_age == 0)
            lookup = 0;
        const sl_policy_header_t *pragma = has_cc ? NULL : sl_policy_header(r, "pragma", 6);
        if (pragma && pragma->value.len >= 8 && strncasecmp(pragma->value.ptr, "no-cache", 8) == 0)
            lookup = 0;
    }
    /* The ask and its key live in the request's arena (aligned by hand:
     * the arena is bytes). */
    size_t align = alignof(sl_cache_ask_t);
    char *raw = sl_policy_alloc(r, sizeof(sl_cache_ask_t) + align - 1);
    size_t room = r->arena_cap - r->arena_len;
    if (!raw)
        return bypass(c, r);
    sl_cache_ask_t *ask =
        (sl_cache_ask_t *)(((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1));
    keybuf_t k = {r->arena + r->arena_len, 0,
                  room < SL_CACHE_MAX_KEY_BYTES ? room : SL_CACHE_MAX_KEY_BYTES, 0};
    if (build_key(c, r, &k) != 0)
        return bypass(c, r);
    r->arena_len += k.len; /* what build_key wrote is kept */
    *ask = (sl_cache_ask_t){
        .conf = c,
        .key = k.p,
        .key_len = k.len,
        .hash = sl_cache_hash(k.p, k.len),
        .lookup = (uint8_t)lookup,
        .store = (uint8_t)get,
        /* Credentials the key does not cover (no consumer was
         * authenticated): RFC 9111 3.5, only responses the origin marks
         * shareable. */
        .authorized = !r->consumer.name && sl_policy_header(r, "authorization", 13) != NULL,
    };
    r->cache = ask;
    return SL_POLICY_CONTINUE;
}

/* X-Cache says what the cache did; a hit's Age is its time in the cache
 * plus the origin's Age when it was stored (RFC 9111 4.2.3). */
static void on_response(const void *state, sl_policy_req_t *r, int status)
{
    (void)state;
    (void)status;
    if (!r->cache_status)
        return;
    sl_policy_edit(r, 1, SL_HDR_SET, "X-Cache", 7, r->cache_status, strlen(r->cache_status));
    if (strcmp(r->cache_status, "HIT") != 0)
        return;
    char *age = sl_policy_alloc(r, 12);
    if (!age)
        return;
    int n = snprintf(age, 12, "%u", r->cache_age_s);
    sl_policy_edit(r, 1, SL_HDR_SET, "Age", 3, age, (size_t)n);
}

const sl_policy_def_t sl_policy_cache = {
    .name = "cache",
    .phase = SL_PHASE_CACHE,
    .schema = &schema,
    .compile = compile,
    .free = cfree,
    .on_request = on_request,
    .on_response = on_response,
};
