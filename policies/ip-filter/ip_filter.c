/*
 * ip-filter: allow or deny requests by the client's address, before any
 * other policy (phase ACCESS). A deny match wins; with an allow list,
 * every address it does not match is denied. 403 forbidden.
 *
 *   config: {allow: [10.0.0.0/8, "2001:db8::/32"], deny: [10.0.66.0/24],
 *            trustedProxies: 1}
 *
 * Addresses. Every address is a 128-bit number: IPv4 a.b.c.d is the
 * IPv4-mapped ::ffff:a.b.c.d, so an IPv4 rule also matches a client that a
 * dual-stack listener reports as ::ffff:a.b.c.d. Each list compiles into
 * sorted, merged [first, last] ranges; a lookup is one binary search
 * (O(log n)), whatever the number of rules.
 *
 * The client. By default the connection's peer address. `trustedProxies: N`
 * says N proxies that append to X-Forwarded-For stand in front of the
 * gateway: the client is then the Nth XFF entry from the right (all XFF
 * header lines read as one list, in order). Entries further left were
 * written by the client and are never used. An entry that is not an
 * address (optionally "[v6]:port" or "v4:port"), or an XFF with fewer than
 * N entries, falls back to the connection's address: the request is then
 * judged as coming from the proxy. Only use trustedProxies when the
 * gateway cannot be reached except through those proxies.
 */
#include "policy.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define LIST_MAX 10000
#define PROXIES_MAX 16

typedef unsigned __int128 addr_t;

typedef struct {
    addr_t first, last;
} range_t;

typedef struct {
    range_t *r;
    size_t n;
} ranges_t;

typedef struct {
    ranges_t allow, deny;
    int has_allow;
    unsigned trusted_proxies;
} ip_filter_t;

/* ---- addresses and CIDRs -------------------------------------------------- */

static addr_t from_bytes(const unsigned char *b, size_t n)
{
    addr_t a = 0;
    for (size_t i = 0; i < n; i++)
        a = a << 8 | b[i];
    return a;
}

/* An IPv4 or IPv6 address (inet_pton's syntax) of len bytes at s. */
static int parse_addr(const char *s, size_t len, addr_t *out)
{
    char buf[INET6_ADDRSTRLEN + 1];
    if (len == 0 || len >= sizeof(buf))
        return -1;
    memcpy(buf, s, len);
    buf[len] = '\0';
    unsigned char b[16];
    if (inet_pton(AF_INET, buf, b) == 1) {
        *out = (addr_t)0xffff << 32 | from_bytes(b, 4);
        return 0;
    }
    if (memchr(buf, ':', len) && inet_pton(AF_INET6, buf, b) == 1) {
        *out = from_bytes(b, 16);
        return 0;
    }
    return -1;
}

static addr_t mask_of(unsigned bits) /* the top `bits` bits of 128 */
{
    return bits == 0 ? 0 : ~(addr_t)0 << (128 - bits);
}

/* "addr" or "addr/prefix" -> a range. On error, a reason for the person
 * who wrote it in why (e.g. a CIDR with host bits: "did you mean"). */
static int parse_cidr(const char *s, range_t *out, char *why, size_t whylen)
{
    const char *slash = strchr(s, '/');
    size_t alen = slash ? (size_t)(slash - s) : strlen(s);
    addr_t a;
    if (parse_addr(s, alen, &a) != 0) {
        snprintf(why, whylen,
                 "'%.64s' is not an IPv4 or IPv6 address or CIDR (10.0.0.0/8, "
                 "2001:db8::/32, 192.0.2.7)",
                 s);
        return -1;
    }
    int v4 = memchr(s, ':', alen) == NULL;
    unsigned max = v4 ? 32 : 128, bits = max;
    if (slash) {
        const char *p = slash + 1;
        size_t n = strlen(p);
        unsigned v = 0;
        int ok = n >= 1 && n <= 3 && !(n > 1 && p[0] == '0');
        for (size_t i = 0; ok && i < n; i++) {
            ok = p[i] >= '0' && p[i] <= '9';
            v = v * 10 + (unsigned)(p[i] - '0');
        }
        if (!ok || v > max) {
            snprintf(why, whylen, "'%.64s': the prefix length must be 0 to %u", s, max);
            return -1;
        }
        bits = v;
    }
    unsigned bits128 = v4 ? bits + 96 : bits;
    addr_t mask = mask_of(bits128);
    if ((a & ~mask) != 0) {
        char net[INET6_ADDRSTRLEN];
        unsigned char b[16];
        addr_t m = a & mask;
        for (int i = 15; i >= 0; i--, m >>= 8)
            b[i] = (unsigned char)m;
        inet_ntop(v4 ? AF_INET : AF_INET6, v4 ? b + 12 : b, net, sizeof(net));
        snprintf(why, whylen, "'%.64s' has bits set after the prefix (did you mean %s/%u?)", s, net,
                 bits);
        return -1;
    }
    out->first = a;
    out->last = a | ~mask;
    return 0;
}

/* ---- config --------------------------------------------------------------- */

static void check_cidr(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_string(v)) {
        sl_validate_error(c, "expected string (an address or CIDR)");
        return;
    }
    range_t r;
    char why[256];
    if (parse_cidr(json_string_value(v), &r, why, sizeof(why)) != 0)
        sl_validate_error(c, "%s", why);
}

static void check_filter(sl_vctx_t *c, json_t *obj)
{
    if (!sl_validate_get(obj, "allow") && !sl_validate_get(obj, "deny"))
        sl_validate_error(c, "an allow or a deny list is required (allow: [10.0.0.0/8])");
}

static const sl_varray_t cidr_list = {check_cidr, NULL, 1, LIST_MAX};
static const sl_vrange_t proxies_range = {0, PROXIES_MAX};
static const sl_vfield_t fields[] = {
    {"allow", sl_vcheck_array, &cidr_list, 0},
    {"deny", sl_vcheck_array, &cidr_list, 0},
    {"trustedProxies", sl_vcheck_int, &proxies_range, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t schema = {fields, check_filter};

static int cmp_range(const void *x, const void *y)
{
    const range_t *a = x, *b = y;
    return a->first < b->first ? -1 : a->first > b->first;
}

/* Sorted by first address, overlapping and adjacent ranges merged: the
 * ranges are disjoint and increasing, which lookup's binary search needs. */
static int compile_list(json_t *list, ranges_t *out, char *err, size_t errlen)
{
    size_t n = json_array_size(list);
    out->r = calloc(n ? n : 1, sizeof(range_t));
    if (!out->r) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const char *s = json_string_value(json_array_get(list, i));
        if (!s || parse_cidr(s, &out->r[i], err, errlen) != 0)
            return -1; /* validation ran before: not reached */
    }
    qsort(out->r, n, sizeof(range_t), cmp_range);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k > 0 &&
            (out->r[i].first <= out->r[k - 1].last || out->r[i].first - 1 == out->r[k - 1].last)) {
            if (out->r[i].last > out->r[k - 1].last)
                out->r[k - 1].last = out->r[i].last;
        } else {
            out->r[k++] = out->r[i];
        }
    }
    out->n = k;
    return 0;
}

static void filter_free(void *state)
{
    ip_filter_t *f = state;
    if (!f)
        return;
    free(f->allow.r);
    free(f->deny.r);
    free(f);
}

static void *compile(json_t *config, const sl_policy_env_t *env, char *err, size_t errlen)
{
    (void)env;
    ip_filter_t *f = calloc(1, sizeof(*f));
    if (!f) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    json_t *allow = json_object_get(config, "allow");
    json_t *deny = json_object_get(config, "deny");
    json_t *proxies = json_object_get(config, "trustedProxies");
    f->has_allow = json_is_array(allow);
    if (compile_list(allow, &f->allow, err, errlen) != 0 ||
        compile_list(deny, &f->deny, err, errlen) != 0) {
        filter_free(f);
        return NULL;
    }
    f->trusted_proxies = json_is_integer(proxies) ? (unsigned)json_integer_value(proxies) : 0;
    return f;
}

/* ---- the request ---------------------------------------------------------- */

static int ranges_match(const ranges_t *rs, addr_t a)
{
    /* The last range whose first address is <= a. */
    size_t lo = 0, hi = rs->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (rs->r[mid].first <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && a <= rs->r[lo - 1].last;
}

/* One X-Forwarded-For entry: an address, "[v6]", "[v6]:port" or
 * "v4:port", with optional whitespace around it. */
static int parse_xff_entry(const char *s, size_t n, addr_t *out)
{
    while (n > 0 && (*s == ' ' || *s == '\t'))
        s++, n--;
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    if (n > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (!close)
            return -1;
        size_t rest = n - (size_t)(close + 1 - s);
        if (rest != 0 && close[1] != ':')
            return -1;
        for (size_t i = 2; i < rest; i++)
            if (close[i] < '0' || close[i] > '9')
                return -1;
        if (!memchr(s, ':', (size_t)(close - s)))
            return -1; /* brackets are for IPv6 */
        return parse_addr(s + 1, (size_t)(close - s - 1), out);
    }
    const char *colon = memchr(s, ':', n);
    if (colon && !memchr(colon + 1, ':', n - (size_t)(colon + 1 - s))) {
        /* one colon: v4:port */
        for (const char *p = colon + 1; p < s + n; p++)
            if (*p < '0' || *p > '9')
                return -1;
        if (colon + 1 == s + n || memchr(s, '.', (size_t)(colon - s)) == NULL)
            return -1;
        return parse_addr(s, (size_t)(colon - s), out);
    }
    return parse_addr(s, n, out);
}

/* The Nth X-Forwarded-For entry from the right, over all XFF lines in
 * order; -1 when there are fewer than n entries or that one is not an
 * address. Keeps the last n entries in a ring as it reads left to right. */
static int client_from_xff(const sl_policy_header_t *headers, size_t nh, unsigned n, addr_t *out)
{
    sl_str_t ring[PROXIES_MAX];
    size_t count = 0;
    for (size_t i = 0; i < nh; i++) {
        if (headers[i].name.len != 15 ||
            strncasecmp(headers[i].name.ptr, "x-forwarded-for", 15) != 0)
            continue;
        const char *p = headers[i].value.ptr, *end = p + headers[i].value.len;
        for (;;) {
            const char *comma = memchr(p, ',', (size_t)(end - p));
            const char *e = comma ? comma : end;
            ring[count++ % n] = (sl_str_t){p, (size_t)(e - p)};
            if (!comma)
                break;
            p = comma + 1;
        }
    }
    if (count < n)
        return -1;
    sl_str_t s = ring[count % n]; /* the oldest of the last n */
    return parse_xff_entry(s.ptr, s.len, out);
}

static int on_request(const void *state, sl_policy_req_t *req, sl_policy_reply_t *reply)
{
    const ip_filter_t *f = state;
    addr_t a;
    int known = 0;
    if (f->trusted_proxies &&
        client_from_xff(req->headers, req->num_headers, f->trusted_proxies, &a) == 0)
        known = 1;
    if (!known && req->client_ip && parse_addr(req->client_ip, strlen(req->client_ip), &a) == 0)
        known = 1;
    /* An address we cannot read (not IP: never on TCP) is denied: closed. */
    if (known && !ranges_match(&f->deny, a) && (!f->has_allow || ranges_match(&f->allow, a)))
        return SL_POLICY_CONTINUE;
    reply->status = 403;
    reply->code = "forbidden";
    snprintf(reply->message, sizeof(reply->message), "the client address is not allowed");
    return SL_POLICY_REPLY;
}

const sl_policy_def_t sl_policy_ip_filter = {
    .name = "ip-filter",
    .phase = SL_PHASE_ACCESS,
    .schema = &schema,
    .compile = compile,
    .free = filter_free,
    .on_request = on_request,
};
