/*
 * Rule-based backend choice: compiling a Routing message and evaluating it
 * (interface and rules: route_rules.h). Everything compiled is immutable
 * after sl_route_rules_build; workers only write their own row of split
 * counters.
 */
#include "route_rules.h"

#include "cookie.h"
#include "generation.h"
#include "lb.h"
#include "router.h"
#include "srate.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <arpa/inet.h>
#include <ctype.h>
#include <math.h>
#include <pcre2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct {
    uint8_t v6;
    uint8_t bits;
    uint8_t addr[16];
} cidr_t;

typedef struct cond {
    Sluice__V1__RouteMatch__Kind kind;
    Sluice__V1__RouteMatch__Attr attr;
    Sluice__V1__RouteMatch__Op op;
    sl_str_t name;
    sl_str_t *values;
    size_t nvalues;
    double number;
    pcre2_code *re;
    cidr_t *cidrs;
    size_t ncidrs;
    int seg;                 /* PATH_PARAM: segment index, -1 = not in this route's path */
    size_t seg_pre, seg_suf; /* literal bytes around the parameter in its segment */
    struct cond *kids;
    size_t nkids;
    unsigned leaf; /* CONDITION: its index in the block (sl_route_bits_t) */
} cond_t;

typedef struct {
    size_t n;
    struct sl_gen_cluster **clusters;
    uint32_t weight;
} target_t;

typedef struct {
    size_t ntargets;
    target_t *targets;
    uint32_t *weights; /* [ntargets] for sl_lb_swrr_pick (0 -> 1, unusable) */
    uint8_t *usable;   /* [ntargets]: weight > 0 */
    int64_t *swrr;     /* [nworkers * stride] */
    size_t stride;     /* a row per worker, whole cache lines */
    /* Scored by success rate: the backends as written (none twice), their
     * weights, and the windows. */
    sl_srate_route_t *sr;
    size_t nflat;
    struct sl_gen_cluster **flat;
    uint32_t *flat_weights;
} output_t;

typedef struct {
    const char *name;
    cond_t *match;
    size_t nmatch;
    output_t out;
} rule_t;

struct sl_route_rules {
    rule_t *rules;
    size_t nrules;
    output_t deflt;
    unsigned nworkers;
    uint8_t reads_claims;
    uint8_t reads_identity;
    uint8_t reads_body;
    unsigned nleaves;
    uint64_t body_max;
};

/* ---- compiling -------------------------------------------------------------- */

static int parse_cidr(const char *s, cidr_t *out)
{
    char buf[64];
    const char *slash = strchr(s, '/');
    size_t n = slash ? (size_t)(slash - s) : strlen(s);
    if (n == 0 || n >= sizeof(buf))
        return -1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    memset(out, 0, sizeof(*out));
    out->v6 = strchr(buf, ':') != NULL;
    if (inet_pton(out->v6 ? AF_INET6 : AF_INET, buf, out->addr) != 1)
        return -1;
    long max = out->v6 ? 128 : 32, bits = max;
    if (slash) {
        char *end;
        bits = strtol(slash + 1, &end, 10);
        if (!slash[1] || *end || bits < 0 || bits > max)
            return -1;
    }
    out->bits = (uint8_t)bits;
    return 0;
}

static int cidr_contains(const cidr_t *c, int v6, const uint8_t *a)
{
    if (c->v6 != v6)
        return 0;
    unsigned full = c->bits / 8, rest = c->bits % 8;
    if (memcmp(c->addr, a, full) != 0)
        return 0;
    if (!rest)
        return 1;
    uint8_t mask = (uint8_t)(0xff << (8 - rest));
    return (c->addr[full] & mask) == (a[full] & mask);
}

/* The segment of `path` (a template like "/pets/{id}/x") holding {name}. */
static void resolve_param(cond_t *c, const char *path)
{
    c->seg = -1;
    char want[300];
    snprintf(want, sizeof(want), "{%.*s}", (int)c->name.len, c->name.ptr);
    const char *at = strstr(path, want);
    if (!at)
        return;
    int seg = -1;
    const char *seg_start = path;
    for (const char *p = path; p <= at; p++)
        if (*p == '/') {
            seg++;
            seg_start = p + 1;
        }
    const char *seg_end = strchr(at, '/');
    if (!seg_end)
        seg_end = path + strlen(path);
    c->seg = seg < 0 ? 0 : seg;
    c->seg_pre = (size_t)(at - seg_start);
    c->seg_suf = (size_t)(seg_end - (at + strlen(want)));
}

static void cond_free(cond_t *c)
{
    for (size_t i = 0; i < c->nkids; i++)
        cond_free(&c->kids[i]);
    free(c->kids);
    free(c->values);
    free(c->cidrs);
    pcre2_code_free(c->re);
}

static int cond_build(sl_route_rules_t *rr, cond_t *c, const Sluice__V1__RouteMatch *pb,
                      const char *route_path, int is_template, char *err, size_t errlen)
{
    memset(c, 0, sizeof(*c));
    c->kind = pb->kind;
    if (pb->kind != SLUICE__V1__ROUTE_MATCH__KIND__CONDITION) {
        c->kids = calloc(pb->n_children ? pb->n_children : 1, sizeof(*c->kids));
        if (!c->kids)
            goto nomem;
        for (size_t i = 0; i < pb->n_children; i++) {
            c->nkids++;
            if (cond_build(rr, &c->kids[i], pb->children[i], route_path, is_template, err,
                           errlen) != 0)
                return -1;
        }
        return 0;
    }
    c->attr = pb->attr;
    c->op = pb->op;
    c->leaf = rr->nleaves++;
    if (c->attr == SLUICE__V1__ROUTE_MATCH__ATTR__BODY)
        rr->reads_body = 1;
    c->name = (sl_str_t){pb->name ? pb->name : "", pb->name ? strlen(pb->name) : 0};
    c->number = pb->number;
    if (c->attr == SLUICE__V1__ROUTE_MATCH__ATTR__CLAIM)
        rr->reads_claims = 1;
    if (c->attr == SLUICE__V1__ROUTE_MATCH__ATTR__CLAIM ||
        c->attr == SLUICE__V1__ROUTE_MATCH__ATTR__CONSUMER ||
        c->attr == SLUICE__V1__ROUTE_MATCH__ATTR__CONSUMER_GROUP)
        rr->reads_identity = 1;
    if (c->attr == SLUICE__V1__ROUTE_MATCH__ATTR__PATH_PARAM) {
        c->seg = -1;
        if (is_template)
            resolve_param(c, route_path);
    }
    c->values = calloc(pb->n_values ? pb->n_values : 1, sizeof(*c->values));
    if (!c->values)
        goto nomem;
    for (size_t i = 0; i < pb->n_values; i++)
        c->values[i] = (sl_str_t){pb->values[i], strlen(pb->values[i])};
    c->nvalues = pb->n_values;
    if (c->attr == SLUICE__V1__ROUTE_MATCH__ATTR__CLIENT_IP &&
        c->op != SLUICE__V1__ROUTE_MATCH__OP__PRESENT &&
        c->op != SLUICE__V1__ROUTE_MATCH__OP__ABSENT) {
        c->cidrs = calloc(pb->n_values ? pb->n_values : 1, sizeof(*c->cidrs));
        if (!c->cidrs)
            goto nomem;
        for (size_t i = 0; i < pb->n_values; i++) {
            if (parse_cidr(pb->values[i], &c->cidrs[i]) != 0) {
                snprintf(err, errlen, "clientIp: '%s' is not an address or a CIDR range",
                         pb->values[i]);
                return -1;
            }
        }
        c->ncidrs = pb->n_values;
    }
    if (c->op == SLUICE__V1__ROUTE_MATCH__OP__REGEX) {
        if (pb->n_values != 1) {
            snprintf(err, errlen, "regex: one pattern expected");
            return -1;
        }
        int ec;
        PCRE2_SIZE off;
        c->re = pcre2_compile((PCRE2_SPTR)pb->values[0], PCRE2_ZERO_TERMINATED, 0, &ec, &off, NULL);
        if (!c->re) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(ec, msg, sizeof(msg));
            snprintf(err, errlen, "regex '%.100s' does not compile at offset %zu: %s",
                     pb->values[0], (size_t)off, (const char *)msg);
            return -1;
        }
        (void)pcre2_jit_compile(c->re, PCRE2_JIT_COMPLETE); /* interpreted if JIT is unavailable */
    } else if ((c->op <= SLUICE__V1__ROUTE_MATCH__OP__PREFIX) && pb->n_values < 1) {
        snprintf(err, errlen, "condition on %s without a value",
                 c->name.len ? c->name.ptr : "an attribute");
        return -1;
    }
    return 0;
nomem:
    snprintf(err, errlen, "out of memory");
    return -1;
}

static void output_free(output_t *o)
{
    for (size_t i = 0; i < o->ntargets; i++)
        free(o->targets[i].clusters);
    free(o->targets);
    free(o->weights);
    free(o->usable);
    free(o->swrr);
    sl_srate_route_free(o->sr);
    free(o->flat);
    free(o->flat_weights);
}

static int output_alloc(output_t *o, size_t n, unsigned nworkers)
{
    o->ntargets = n;
    o->targets = calloc(n ? n : 1, sizeof(*o->targets));
    o->weights = calloc(n ? n : 1, sizeof(*o->weights));
    o->usable = calloc(n ? n : 1, sizeof(*o->usable));
    o->stride = (n + 7) / 8 * 8; /* 64-byte rows: workers never share a line */
    o->swrr = aligned_alloc(64, (nworkers ? nworkers : 1) * (o->stride ? o->stride : 8) *
                                    sizeof(*o->swrr));
    if (o->swrr)
        memset(o->swrr, 0,
               (nworkers ? nworkers : 1) * (o->stride ? o->stride : 8) * sizeof(*o->swrr));
    return o->targets && o->weights && o->usable && o->swrr ? 0 : -1;
}

static void output_weights(output_t *o)
{
    for (size_t i = 0; i < o->ntargets; i++) {
        o->usable[i] = o->targets[i].weight > 0 && o->targets[i].n > 0;
        o->weights[i] = o->targets[i].weight ? o->targets[i].weight : 1;
    }
}

static int output_build(output_t *o, const Sluice__V1__RouteOutput *pb, sl_route_find_fn find,
                        void *ctx, unsigned nworkers, char *err, size_t errlen)
{
    if (!pb || pb->n_targets == 0) {
        snprintf(err, errlen, "an output without backends");
        return -1;
    }
    if (output_alloc(o, pb->n_targets, nworkers) != 0)
        goto nomem;
    for (size_t i = 0; i < pb->n_targets; i++) {
        const Sluice__V1__RouteOutput__Target *t = pb->targets[i];
        target_t *dt = &o->targets[i];
        dt->weight = t->weight;
        dt->clusters = calloc(t->n_clusters ? t->n_clusters : 1, sizeof(*dt->clusters));
        if (!dt->clusters)
            goto nomem;
        for (size_t k = 0; k < t->n_clusters; k++) {
            dt->clusters[k] = find(ctx, t->clusters[k]);
            if (!dt->clusters[k]) {
                snprintf(err, errlen, "backend %s is not in the snapshot", t->clusters[k]);
                return -1;
            }
            dt->n++;
        }
    }
    output_weights(o);
    for (size_t i = 0; i < o->ntargets; i++)
        if (o->usable[i])
            return 0;
    snprintf(err, errlen, "a split whose weights sum to 0");
    return -1;
nomem:
    snprintf(err, errlen, "out of memory");
    return -1;
}

/* An output scored by success rate: its backends as one list (a priority
 * list in its order, ties to the first; a split's entries with their
 * weights) and the windows of `rule` (NULL: the block's own scope). */
static int output_srate(output_t *o, const Sluice__V1__SuccessRate *pb, const char *rule, char *err,
                        size_t errlen)
{
    if (!pb) {
        snprintf(err, errlen, "an output scored by success rate without successRate settings");
        return -1;
    }
    size_t cap = 0;
    for (size_t i = 0; i < o->ntargets; i++)
        cap += o->targets[i].n;
    if (o->ntargets > 1)
        for (size_t i = 0; i < o->ntargets; i++)
            if (o->targets[i].n > 1) {
                snprintf(err, errlen,
                         "a split of priority lists cannot be scored by success "
                         "rate");
                return -1;
            }
    if (cap > SL_ROUTE_CHOICES_MAX)
        cap = SL_ROUTE_CHOICES_MAX;
    o->flat = calloc(cap ? cap : 1, sizeof(*o->flat));
    o->flat_weights = calloc(cap ? cap : 1, sizeof(*o->flat_weights));
    const char *names[SL_ROUTE_CHOICES_MAX];
    if (!o->flat || !o->flat_weights) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < o->ntargets; i++) {
        for (size_t k = 0; k < o->targets[i].n; k++) {
            struct sl_gen_cluster *c = o->targets[i].clusters[k];
            uint32_t w = o->ntargets > 1 ? o->targets[i].weight : 1;
            size_t j = 0;
            while (j < o->nflat && o->flat[j] != c)
                j++;
            if (j < o->nflat) {
                o->flat_weights[j] += w; /* listed twice: one backend, both weights */
                continue;
            }
            if (o->nflat == cap)
                continue;
            o->flat[o->nflat] = c;
            o->flat_weights[o->nflat] = w;
            names[o->nflat++] = c->pb->name;
        }
    }
    o->sr = sl_srate_route_build(pb, rule, names, o->nflat, o->ntargets == 1, err, errlen);
    return o->sr ? 0 : -1;
}

static int same_head(const struct sl_gen_cluster *a, const struct sl_gen_cluster *b)
{
    return a->pb->protocol == b->pb->protocol && a->host_rewrite.len == b->host_rewrite.len &&
           (a->host_rewrite.len == 0 ||
            memcmp(a->host_rewrite.ptr, b->host_rewrite.ptr, a->host_rewrite.len) == 0);
}

/* A block that reads the body: bounded conditions, one upstream head. */
static int body_check(const sl_route_rules_t *rr, char *err, size_t errlen)
{
    if (rr->nleaves > SL_ROUTE_DEFER_MAX) {
        snprintf(err, errlen, "a routing block that reads the body has at most %d conditions",
                 SL_ROUTE_DEFER_MAX);
        return -1;
    }
    const struct sl_gen_cluster *first = rr->deflt.targets[0].clusters[0];
    for (size_t r = 0; r <= rr->nrules; r++) {
        const output_t *o = r < rr->nrules ? &rr->rules[r].out : &rr->deflt;
        for (size_t i = 0; i < o->ntargets; i++)
            for (size_t k = 0; k < o->targets[i].n; k++)
                if (!same_head(first, o->targets[i].clusters[k])) {
                    snprintf(err, errlen,
                             "a rule reads the body, so every backend it can choose must take "
                             "the same upstream head: %s and %s differ in protocol or "
                             "hostRewrite",
                             first->pb->name, o->targets[i].clusters[k]->pb->name);
                    return -1;
                }
    }
    return 0;
}

sl_route_rules_t *sl_route_rules_build(const Sluice__V1__Routing *pb, const char *route_path,
                                       int is_template, sl_route_find_fn find, void *find_ctx,
                                       struct sl_gen_cluster *const *backends,
                                       const uint32_t *weights, size_t n,
                                       const Sluice__V1__SuccessRate *sr, unsigned nworkers,
                                       char *err, size_t errlen)
{
    sl_route_rules_t *rr = calloc(1, sizeof(*rr));
    if (!rr) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    rr->nworkers = nworkers ? nworkers : 1;
    rr->rules = calloc(pb->n_rules ? pb->n_rules : 1, sizeof(*rr->rules));
    if (!rr->rules) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    char why[400];
    for (size_t i = 0; i < pb->n_rules; i++) {
        const Sluice__V1__RouteRule *rp = pb->rules[i];
        rule_t *r = &rr->rules[i];
        rr->nrules++;
        r->name = rp->name && *rp->name ? rp->name : "rule";
        r->match = calloc(rp->n_match ? rp->n_match : 1, sizeof(*r->match));
        if (!r->match) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        for (size_t k = 0; k < rp->n_match; k++) {
            r->nmatch++;
            if (cond_build(rr, &r->match[k], rp->match[k], route_path, is_template, why,
                           sizeof(why)) != 0) {
                snprintf(err, errlen, "routing rule %s: %s", r->name, why);
                goto fail;
            }
        }
        if (output_build(&r->out, rp->output, find, find_ctx, rr->nworkers, why, sizeof(why)) !=
            0) {
            snprintf(err, errlen, "routing rule %s: %s", r->name, why);
            goto fail;
        }
        if (rp->output->success_rate && output_srate(&r->out, sr, r->name, why, sizeof(why)) != 0) {
            snprintf(err, errlen, "routing rule %s: %s", r->name, why);
            goto fail;
        }
    }
    if (pb->default_output) {
        if (output_build(&rr->deflt, pb->default_output, find, find_ctx, rr->nworkers, why,
                         sizeof(why)) != 0) {
            snprintf(err, errlen, "routing default: %s", why);
            goto fail;
        }
        if (pb->default_output->success_rate &&
            output_srate(&rr->deflt, sr, NULL, why, sizeof(why)) != 0) {
            snprintf(err, errlen, "routing default: %s", why);
            goto fail;
        }
    } else {
        /* No default: the route's backendRefs, as a weighted split. */
        if (n == 0) {
            snprintf(err, errlen, "routing has no default and the route no backends");
            goto fail;
        }
        if (output_alloc(&rr->deflt, n, rr->nworkers) != 0) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        for (size_t i = 0; i < n; i++) {
            target_t *t = &rr->deflt.targets[i];
            t->clusters = calloc(1, sizeof(*t->clusters));
            if (!t->clusters) {
                snprintf(err, errlen, "out of memory");
                goto fail;
            }
            t->clusters[0] = backends[i];
            t->n = 1;
            t->weight = weights ? weights[i] : 1;
        }
        output_weights(&rr->deflt);
        /* The backendRefs scored: one list, ties by weight. */
        if (pb->backends_success_rate) {
            if (output_srate(&rr->deflt, sr, NULL, why, sizeof(why)) != 0) {
                snprintf(err, errlen, "routing backendRefs: %s", why);
                goto fail;
            }
        }
    }
    rr->body_max = pb->max_body_bytes ? pb->max_body_bytes : 64 * 1024;
    if (rr->reads_body && body_check(rr, err, errlen) != 0)
        goto fail;
    return rr;
fail:
    sl_route_rules_free(rr);
    return NULL;
}

void sl_route_rules_free(sl_route_rules_t *rr)
{
    if (!rr)
        return;
    for (size_t i = 0; i < rr->nrules; i++) {
        for (size_t k = 0; k < rr->rules[i].nmatch; k++)
            cond_free(&rr->rules[i].match[k]);
        free(rr->rules[i].match);
        output_free(&rr->rules[i].out);
    }
    free(rr->rules);
    output_free(&rr->deflt);
    free(rr);
}

int sl_route_rules_reads_claims(const sl_route_rules_t *rr)
{
    return rr && rr->reads_claims;
}

int sl_route_rules_reads_identity(const sl_route_rules_t *rr)
{
    return rr && rr->reads_identity;
}

int sl_route_rules_reads_body(const sl_route_rules_t *rr)
{
    return rr && rr->reads_body;
}

uint64_t sl_route_rules_body_max(const sl_route_rules_t *rr)
{
    return rr->body_max;
}

struct sl_srate_route *sl_route_rules_any_srate(const sl_route_rules_t *rr)
{
    if (!rr)
        return NULL;
    for (size_t i = 0; i < rr->nrules; i++)
        if (rr->rules[i].out.sr)
            return rr->rules[i].out.sr;
    return rr->deflt.sr;
}

struct sl_gen_cluster *sl_route_rules_head_cluster(const sl_route_rules_t *rr)
{
    return rr->deflt.targets[0].clusters[0];
}

/* ---- evaluating ------------------------------------------------------------ */

/* Per evaluation: what was looked up once (the client address, the last
 * header asked for: rules in a row usually test the same header, e.g. a
 * tenant per rule, and each scan compares every header name). */
typedef struct {
    const sl_route_attrs_t *a;
    const sl_route_bits_t *bits; /* deferred: what the head said, per condition */
    json_t *body;
    int ip_state; /* 0 not parsed, 1 v4, 2 v6, -1 none */
    uint8_t ip[16];
    const char *hname; /* the last header looked up (NULL: none yet) */
    size_t hname_len;
    int hfound;
    sl_str_t hvalue;
    char numbuf[64];
} eval_t;

static int hex(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    ch |= 0x20;
    return ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

/* Decodes %XX and '+' of a query value into buf (at most cap bytes; longer
 * values are compared as sent). */
static sl_str_t query_decode(sl_str_t v, char *buf, size_t cap)
{
    if (!memchr(v.ptr, '%', v.len) && !memchr(v.ptr, '+', v.len))
        return v;
    size_t o = 0;
    for (size_t i = 0; i < v.len; i++) {
        if (o >= cap)
            return v;
        char ch = v.ptr[i];
        if (ch == '+') {
            ch = ' ';
        } else if (ch == '%' && i + 2 < v.len && hex(v.ptr[i + 1]) >= 0 && hex(v.ptr[i + 2]) >= 0) {
            ch = (char)(hex(v.ptr[i + 1]) * 16 + hex(v.ptr[i + 2]));
            i += 2;
        }
        buf[o++] = ch;
    }
    return (sl_str_t){buf, o};
}

/* A JSON value (claim, body field) as compared: strings as they are,
 * numbers and booleans as their JSON text; null is missing. */
static int json_value(eval_t *e, json_t *v, sl_str_t *out)
{
    if (!v || json_is_null(v))
        return 0;
    if (json_is_string(v)) {
        *out = (sl_str_t){json_string_value(v), json_string_length(v)};
    } else if (json_is_integer(v)) {
        int n =
            snprintf(e->numbuf, sizeof(e->numbuf), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        *out = (sl_str_t){e->numbuf, (size_t)n};
    } else if (json_is_real(v)) {
        int n = snprintf(e->numbuf, sizeof(e->numbuf), "%.17g", json_real_value(v));
        *out = (sl_str_t){e->numbuf, (size_t)n};
    } else if (json_is_boolean(v)) {
        *out = json_is_true(v) ? (sl_str_t){"true", 4} : (sl_str_t){"false", 5};
    } else {
        *out = (sl_str_t){"", 0}; /* an object or array: present, equal to nothing */
    }
    return 1;
}

/* The attribute's value: 1 with *out, or 0 when the request has none. */
static int attr_value(eval_t *e, const cond_t *c, sl_str_t *out, char *scratch, size_t cap)
{
    const sl_route_attrs_t *a = e->a;
    switch (c->attr) {
    case SLUICE__V1__ROUTE_MATCH__ATTR__METHOD:
        *out = a->method;
        return a->method.len > 0;
    case SLUICE__V1__ROUTE_MATCH__ATTR__HEADER:
        if (e->hname && e->hname_len == c->name.len &&
            strncasecmp(e->hname, c->name.ptr, c->name.len) == 0) {
            *out = e->hvalue;
            return e->hfound;
        }
        e->hname = c->name.ptr;
        e->hname_len = c->name.len;
        e->hfound = 0;
        e->hvalue = (sl_str_t){"", 0};
        for (size_t i = 0; i < a->num_headers; i++) {
            const sl_http1_header_t *h = &a->headers[i];
            if (h->name.len == c->name.len &&
                strncasecmp(h->name.ptr, c->name.ptr, c->name.len) == 0) {
                e->hvalue = h->value;
                e->hfound = 1;
                break;
            }
        }
        *out = e->hvalue;
        return e->hfound;
    case SLUICE__V1__ROUTE_MATCH__ATTR__QUERY: {
        const char *p = a->query.ptr, *end = p + a->query.len;
        while (p && p < end) {
            const char *amp = memchr(p, '&', (size_t)(end - p));
            const char *pe = amp ? amp : end;
            const char *eq = memchr(p, '=', (size_t)(pe - p));
            const char *ke = eq ? eq : pe;
            if ((size_t)(ke - p) == c->name.len && memcmp(p, c->name.ptr, c->name.len) == 0) {
                sl_str_t v = eq ? (sl_str_t){eq + 1, (size_t)(pe - eq - 1)} : (sl_str_t){"", 0};
                *out = query_decode(v, scratch, cap);
                return 1;
            }
            p = amp ? amp + 1 : NULL;
        }
        return 0;
    }
    case SLUICE__V1__ROUTE_MATCH__ATTR__COOKIE:
        for (size_t i = 0; i < a->num_headers; i++) {
            const sl_http1_header_t *h = &a->headers[i];
            if (h->name.len != 6 || strncasecmp(h->name.ptr, "cookie", 6) != 0)
                continue;
            if (sl_cookie_find(h->value.ptr, h->value.len, c->name.ptr, c->name.len, out))
                return 1;
        }
        return 0;
    case SLUICE__V1__ROUTE_MATCH__ATTR__PATH_PARAM: {
        if (c->seg < 0)
            return 0;
        const char *p = a->rel_path.ptr, *end = p + a->rel_path.len;
        if (!p || p == end)
            return 0;
        if (*p == '/')
            p++;
        for (int s = 0; s < c->seg && p; s++) {
            p = memchr(p, '/', (size_t)(end - p));
            if (p)
                p++;
        }
        if (!p || p > end)
            return 0;
        const char *se = memchr(p, '/', (size_t)(end - p));
        if (!se)
            se = end;
        if ((size_t)(se - p) < c->seg_pre + c->seg_suf)
            return 0;
        *out = (sl_str_t){p + c->seg_pre, (size_t)(se - p) - c->seg_pre - c->seg_suf};
        return out->len > 0;
    }
    case SLUICE__V1__ROUTE_MATCH__ATTR__CLIENT_IP:
        if (!a->client_ip || !*a->client_ip)
            return 0;
        *out = (sl_str_t){a->client_ip, strlen(a->client_ip)};
        return 1;
    case SLUICE__V1__ROUTE_MATCH__ATTR__CONSUMER:
        if (!a->consumer)
            return 0;
        { /* by metadata.name: "shop/alice" is alice */
            const char *slash = strrchr(a->consumer, '/');
            const char *n = slash ? slash + 1 : a->consumer;
            *out = (sl_str_t){n, strlen(n)};
        }
        return 1;
    case SLUICE__V1__ROUTE_MATCH__ATTR__CONSUMER_GROUP:
        if (!a->consumer_group || !*a->consumer_group)
            return 0;
        *out = (sl_str_t){a->consumer_group, strlen(a->consumer_group)};
        return 1;
    case SLUICE__V1__ROUTE_MATCH__ATTR__CLAIM: {
        if (!a->claims)
            return 0;
        json_t *v;
        if (c->name.ptr[0] == '/') {
            /* a JSON pointer into nested claims: /realm_access/roles */
            v = a->claims;
            const char *p = c->name.ptr + 1;
            while (v && p) {
                const char *slash = strchr(p, '/');
                char key[256];
                size_t kl = slash ? (size_t)(slash - p) : strlen(p);
                if (kl >= sizeof(key))
                    return 0;
                memcpy(key, p, kl);
                key[kl] = '\0';
                v = json_is_array(v) ? json_array_get(v, strtoul(key, NULL, 10))
                                     : json_object_get(v, key);
                p = slash ? slash + 1 : NULL;
            }
        } else {
            v = json_object_get(a->claims, c->name.ptr);
        }
        return json_value(e, v, out);
    }
    case SLUICE__V1__ROUTE_MATCH__ATTR__BODY: {
        json_t *v = e->body;
        const char *p = c->name.ptr + 1; /* after the leading '/' */
        while (v && p) {
            const char *slash = strchr(p, '/');
            size_t kl = slash ? (size_t)(slash - p) : strlen(p);
            char key[257];
            size_t o = 0;
            /* RFC 6901: ~1 is '/', ~0 is '~' */
            for (size_t i = 0; i < kl && o < sizeof(key) - 1; i++) {
                if (p[i] == '~' && i + 1 < kl && (p[i + 1] == '0' || p[i + 1] == '1')) {
                    key[o++] = p[i + 1] == '0' ? '~' : '/';
                    i++;
                } else {
                    key[o++] = p[i];
                }
            }
            key[o] = '\0';
            if (json_is_array(v)) {
                char *end;
                unsigned long idx = strtoul(key, &end, 10);
                v = *key && !*end ? json_array_get(v, idx) : NULL;
            } else {
                v = json_object_get(v, key);
            }
            p = slash ? slash + 1 : NULL;
        }
        return json_value(e, v, out);
    }
    default:
        return 0;
    }
}

static int str_eq(sl_str_t a, sl_str_t b)
{
    return a.len == b.len && memcmp(a.ptr, b.ptr, a.len) == 0;
}

static int to_number(sl_str_t v, double *out)
{
    char buf[64];
    if (v.len == 0 || v.len >= sizeof(buf))
        return 0;
    memcpy(buf, v.ptr, v.len);
    buf[v.len] = '\0';
    char *end;
    *out = strtod(buf, &end);
    return *end == '\0' && !isnan(*out);
}

static int ip_of(eval_t *e)
{
    if (e->ip_state == 0) {
        const char *s = e->a->client_ip;
        e->ip_state = -1;
        if (s && inet_pton(AF_INET, s, e->ip) == 1)
            e->ip_state = 1;
        else if (s && inet_pton(AF_INET6, s, e->ip) == 1)
            e->ip_state = 2;
        /* ::ffff:10.0.0.1 is the IPv4 client of a dual-stack listener */
        if (e->ip_state == 2 && memcmp(e->ip, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12) == 0) {
            memmove(e->ip, e->ip + 12, 4);
            e->ip_state = 1;
        }
    }
    return e->ip_state;
}

static int cond_eval(eval_t *e, const cond_t *c)
{
    if (c->kind == SLUICE__V1__ROUTE_MATCH__KIND__ALL) {
        for (size_t i = 0; i < c->nkids; i++)
            if (!cond_eval(e, &c->kids[i]))
                return 0;
        return 1;
    }
    if (c->kind == SLUICE__V1__ROUTE_MATCH__KIND__ANY) {
        for (size_t i = 0; i < c->nkids; i++)
            if (cond_eval(e, &c->kids[i]))
                return 1;
        return 0;
    }
    if (e->bits && c->attr != SLUICE__V1__ROUTE_MATCH__ATTR__BODY)
        return (int)((e->bits->w[c->leaf / 64] >> (c->leaf % 64)) & 1);
    char scratch[512];
    sl_str_t v;
    int has = attr_value(e, c, &v, scratch, sizeof(scratch));
    if (c->op == SLUICE__V1__ROUTE_MATCH__OP__ABSENT)
        return !has;
    if (!has)
        return 0; /* a missing attribute is false */
    if (c->attr == SLUICE__V1__ROUTE_MATCH__ATTR__CLIENT_IP && c->ncidrs) {
        int st = ip_of(e);
        if (st < 0)
            return 0;
        int in = 0;
        for (size_t i = 0; i < c->ncidrs && !in; i++)
            in = cidr_contains(&c->cidrs[i], st == 2, e->ip);
        return c->op == SLUICE__V1__ROUTE_MATCH__OP__NOT_EQUALS ? !in : in;
    }
    switch (c->op) {
    case SLUICE__V1__ROUTE_MATCH__OP__PRESENT:
        return 1;
    case SLUICE__V1__ROUTE_MATCH__OP__EQUALS:
        return str_eq(v, c->values[0]);
    case SLUICE__V1__ROUTE_MATCH__OP__NOT_EQUALS:
        return !str_eq(v, c->values[0]);
    case SLUICE__V1__ROUTE_MATCH__OP__IN:
        for (size_t i = 0; i < c->nvalues; i++)
            if (str_eq(v, c->values[i]))
                return 1;
        return 0;
    case SLUICE__V1__ROUTE_MATCH__OP__PREFIX:
        return v.len >= c->values[0].len && memcmp(v.ptr, c->values[0].ptr, c->values[0].len) == 0;
    case SLUICE__V1__ROUTE_MATCH__OP__REGEX: {
        pcre2_match_data *md = sl_router_match_data();
        if (!md)
            return 0;
        return pcre2_match(c->re, (PCRE2_SPTR)(v.ptr ? v.ptr : ""), v.len, 0, 0, md, NULL) >= 0;
    }
    case SLUICE__V1__ROUTE_MATCH__OP__LT:
    case SLUICE__V1__ROUTE_MATCH__OP__LE:
    case SLUICE__V1__ROUTE_MATCH__OP__GT:
    case SLUICE__V1__ROUTE_MATCH__OP__GE: {
        double x;
        if (!to_number(v, &x))
            return 0;
        switch (c->op) {
        case SLUICE__V1__ROUTE_MATCH__OP__LT:
            return x < c->number;
        case SLUICE__V1__ROUTE_MATCH__OP__LE:
            return x <= c->number;
        case SLUICE__V1__ROUTE_MATCH__OP__GT:
            return x > c->number;
        default:
            return x >= c->number;
        }
    }
    default:
        return 0;
    }
}

static int match_rules(const sl_route_rules_t *rr, eval_t *e)
{
    for (size_t i = 0; i < rr->nrules; i++) {
        const rule_t *r = &rr->rules[i];
        if (r->nmatch == 0)
            return (int)i;
        for (size_t k = 0; k < r->nmatch; k++)
            if (cond_eval(e, &r->match[k]))
                return (int)i;
    }
    return -1;
}

int sl_route_rules_match(const sl_route_rules_t *rr, const sl_route_attrs_t *a)
{
    eval_t e = {.a = a, .body = a->body};
    return match_rules(rr, &e);
}

static void defer_walk(eval_t *e, const cond_t *c, sl_route_bits_t *bits)
{
    for (size_t i = 0; i < c->nkids; i++)
        defer_walk(e, &c->kids[i], bits);
    if (c->kind != SLUICE__V1__ROUTE_MATCH__KIND__CONDITION ||
        c->attr == SLUICE__V1__ROUTE_MATCH__ATTR__BODY || c->leaf >= SL_ROUTE_DEFER_MAX)
        return;
    if (cond_eval(e, c))
        bits->w[c->leaf / 64] |= 1ULL << (c->leaf % 64);
}

void sl_route_rules_defer(const sl_route_rules_t *rr, const sl_route_attrs_t *a,
                          sl_route_bits_t *bits)
{
    memset(bits, 0, sizeof(*bits));
    eval_t e = {.a = a};
    for (size_t i = 0; i < rr->nrules; i++)
        for (size_t k = 0; k < rr->rules[i].nmatch; k++)
            defer_walk(&e, &rr->rules[i].match[k], bits);
}

int sl_route_rules_match_deferred(const sl_route_rules_t *rr, const sl_route_bits_t *bits,
                                  json_t *body)
{
    sl_route_attrs_t none = {0};
    eval_t e = {.a = &none, .bits = bits, .body = body};
    return match_rules(rr, &e);
}

static void add_unique(sl_route_choice_t *out, struct sl_gen_cluster *c)
{
    for (size_t i = 0; i < out->n; i++)
        if (out->clusters[i] == c)
            return;
    if (out->n < SL_ROUTE_CHOICES_MAX)
        out->clusters[out->n++] = c;
}

void sl_route_rules_choose(const sl_route_rules_t *rr, int rule, unsigned worker,
                           sl_route_choice_t *out)
{
    const output_t *o = rule >= 0 ? &rr->rules[rule].out : &rr->deflt;
    out->rule = rule;
    out->rule_name = rule >= 0 ? rr->rules[rule].name : "default";
    out->n = 0;
    out->srate = o->sr;
    out->weights = NULL;
    if (o->sr) {
        /* The caller ranks them by score. */
        out->n = o->nflat;
        memcpy(out->clusters, o->flat, o->nflat * sizeof(*o->flat));
        out->weights = o->flat_weights;
        return;
    }
    size_t pick = 0;
    if (o->ntargets > 1) {
        if (worker >= rr->nworkers)
            worker = 0;
        int p = sl_lb_swrr_pick(o->swrr + (size_t)worker * o->stride, o->weights, o->usable,
                                o->ntargets);
        pick = p < 0 ? 0 : (size_t)p;
    }
    const target_t *t = &o->targets[pick];
    for (size_t k = 0; k < t->n; k++)
        add_unique(out, t->clusters[k]);
    /* The other entries are the fallback, in the order written. */
    for (size_t i = 0; i < o->ntargets; i++)
        for (size_t k = 0; i != pick && k < o->targets[i].n; k++)
            add_unique(out, o->targets[i].clusters[k]);
}
