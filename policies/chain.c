/* Policy chains: build, condition checks, and the per-request walk. */
#include "chain.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct {
    const char *name; /* borrowed from the snapshot */
    size_t name_len;
    const char *value;
    size_t value_len;
    Sluice__V1__HeaderMatch__Kind kind;
    int invert;
    pcre2_code *re;
} cond_header_t;

typedef struct {
    const sl_policy_def_t *def;
    enum sl_policy_phase phase; /* def->phase, or what its config chose */
    void *state;
    void **worker_states;                    /* [nworkers] when def->worker_new, made lazily */
    const Sluice__V1__PolicyCondition *when; /* borrowed, NULL = always */
    cond_header_t *headers;
} entry_t;

struct sl_policy_chain {
    unsigned nworkers;
    size_t n;
    entry_t *e;
    uint8_t has_response;
};

void sl_policy_chain_free(sl_policy_chain_t *ch)
{
    if (!ch)
        return;
    for (size_t i = 0; i < ch->n; i++) {
        for (unsigned w = 0; ch->e[i].worker_states && w < ch->nworkers; w++)
            if (ch->e[i].worker_states[w] && ch->e[i].def->worker_free)
                ch->e[i].def->worker_free(ch->e[i].worker_states[w]);
        free(ch->e[i].worker_states);
        if (ch->e[i].state && ch->e[i].def->free)
            ch->e[i].def->free(ch->e[i].state);
        if (ch->e[i].headers && ch->e[i].when)
            for (size_t h = 0; h < ch->e[i].when->n_headers; h++)
                pcre2_code_free(ch->e[i].headers[h].re);
        free(ch->e[i].headers);
    }
    free(ch->e);
    free(ch);
}

static int build_condition(entry_t *e, char *err, size_t errlen)
{
    const Sluice__V1__PolicyCondition *w = e->when;
    if (!w || !w->n_headers)
        return 0;
    e->headers = calloc(w->n_headers, sizeof(*e->headers));
    if (!e->headers) {
        snprintf(err, errlen, "policy %s: out of memory", e->def->name);
        return -1;
    }
    for (size_t i = 0; i < w->n_headers; i++) {
        const Sluice__V1__HeaderMatch *m = w->headers[i];
        cond_header_t *h = &e->headers[i];
        *h = (cond_header_t){m->name, strlen(m->name), m->value, strlen(m->value),
                             m->kind, m->invert,       NULL};
        if (m->kind == SLUICE__V1__HEADER_MATCH__KIND__REGEX) {
            int ec;
            PCRE2_SIZE off;
            h->re = pcre2_compile((PCRE2_SPTR)m->value, PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED, &ec,
                                  &off, NULL);
            if (!h->re) {
                snprintf(err, errlen, "policy %s: when.headers[%zu]: the regex does not compile",
                         e->def->name, i);
                return -1;
            }
        }
    }
    return 0;
}

static void note_claims(void *ctx, const sl_policy_ref_t *ref)
{
    if (ref->kind == SL_POLICY_REF_JWT_CLAIM)
        *(uint8_t *)ctx = 1;
}

/* Whether a policy of the chain reads the verified token's claims: only
 * then does the jwt policy keep them (policy.h, sl_policy_env_t). */
static uint8_t chain_reads_claims(Sluice__V1__Policy *const *ps, size_t n)
{
    uint8_t reads = 0;
    for (size_t i = 0; i < n && !reads; i++) {
        const sl_policy_def_t *def = sl_policy_find(ps[i]->name);
        if (!def || !def->refs || !ps[i]->config_json[0])
            continue;
        json_t *config = json_loads(ps[i]->config_json, 0, NULL);
        if (config)
            def->refs(config, note_claims, &reads);
        json_decref(config);
    }
    return reads;
}

sl_policy_chain_t *sl_policy_chain_build(Sluice__V1__Policy *const *ps, size_t n,
                                         const sl_policy_env_t *env_in, char *err, size_t errlen)
{
    err[0] = '\0';
    if (n == 0)
        return NULL;
    if (n > 64) { /* sl_policy_req_t.applied; names are unique, so never in practice */
        snprintf(err, errlen, "a chain has at most 64 policies");
        return NULL;
    }
    sl_policy_chain_t *ch = calloc(1, sizeof(*ch));
    if (!ch || !(ch->e = calloc(n, sizeof(*ch->e)))) {
        free(ch);
        snprintf(err, errlen, "out of memory while building the policy chain");
        return NULL;
    }
    sl_policy_env_t env_chain = *env_in;
    env_chain.jwt_claims = env_in->jwt_claims || chain_reads_claims(ps, n);
    const sl_policy_env_t *env = &env_chain;
    ch->nworkers = env->nworkers ? env->nworkers : 1;
    for (size_t i = 0; i < n; i++) {
        entry_t *e = &ch->e[ch->n];
        e->def = sl_policy_find(ps[i]->name);
        if (!e->def) {
            /* A controller of another build: fail closed, say which. */
            snprintf(err, errlen, "policy %s is not known to this runtime", ps[i]->name);
            goto fail;
        }
        ch->n++;
        e->when = ps[i]->when;
        json_error_t je;
        json_t *config = json_loads(ps[i]->config_json[0] ? ps[i]->config_json : "{}", 0, &je);
        if (!config) {
            snprintf(err, errlen, "policy %s: config is not JSON: %s", e->def->name, je.text);
            goto fail;
        }
        char why[256] = "";
        e->phase = e->def->phase_of ? e->def->phase_of(config) : e->def->phase;
        e->state = e->def->compile(config, env, why, sizeof(why));
        json_decref(config);
        if (!e->state) {
            snprintf(err, errlen, "policy %s: %s", e->def->name,
                     why[0] ? why : "cannot be compiled");
            goto fail;
        }
        if (build_condition(e, err, errlen) != 0)
            goto fail;
        if (e->def->worker_new) {
            e->worker_states = calloc(env->nworkers ? env->nworkers : 1, sizeof(void *));
            if (!e->worker_states) {
                snprintf(err, errlen, "policy %s: out of memory", e->def->name);
                goto fail;
            }
        }
        ch->has_response |= e->def->on_response != NULL;
    }
    /* Stable insertion sort by phase. */
    for (size_t i = 1; i < ch->n; i++) {
        entry_t tmp = ch->e[i];
        size_t j = i;
        while (j > 0 && ch->e[j - 1].phase > tmp.phase) {
            ch->e[j] = ch->e[j - 1];
            j--;
        }
        ch->e[j] = tmp;
    }
    return ch;
fail:
    sl_policy_chain_free(ch);
    return NULL;
}

static const sl_policy_header_t *find_header(const sl_policy_req_t *r, const char *name, size_t len)
{
    for (size_t i = 0; i < r->num_headers; i++)
        if (r->headers[i].name.len == len && strncasecmp(r->headers[i].name.ptr, name, len) == 0)
            return &r->headers[i];
    return NULL;
}

static int header_matches(const cond_header_t *h, const sl_policy_req_t *r)
{
    const sl_policy_header_t *f = find_header(r, h->name, h->name_len);
    int m;
    switch (h->kind) {
    case SLUICE__V1__HEADER_MATCH__KIND__PRESENT:
        m = f != NULL;
        break;
    case SLUICE__V1__HEADER_MATCH__KIND__PREFIX:
        m = f && f->value.len >= h->value_len && memcmp(f->value.ptr, h->value, h->value_len) == 0;
        break;
    case SLUICE__V1__HEADER_MATCH__KIND__REGEX: {
        m = 0;
        if (f) {
            pcre2_match_data *md = pcre2_match_data_create_from_pattern(h->re, NULL);
            if (md) {
                int rc = pcre2_match(h->re, (PCRE2_SPTR)f->value.ptr, f->value.len, 0,
                                     PCRE2_ANCHORED | PCRE2_ENDANCHORED, md, NULL);
                m = rc >= 0;
                pcre2_match_data_free(md);
            }
        }
        break;
    }
    default:
        m = f && f->value.len == h->value_len && memcmp(f->value.ptr, h->value, h->value_len) == 0;
        break;
    }
    return h->invert ? !m : m;
}

static int applies(const entry_t *e, const sl_policy_req_t *r)
{
    const Sluice__V1__PolicyCondition *w = e->when;
    if (!w)
        return 1;
    if (w->n_methods) {
        size_t i;
        for (i = 0; i < w->n_methods; i++)
            if (strlen(w->methods[i]) == r->method.len &&
                memcmp(w->methods[i], r->method.ptr, r->method.len) == 0)
                break;
        if (i == w->n_methods)
            return 0;
    }
    if (w->n_path_prefixes) {
        size_t i;
        for (i = 0; i < w->n_path_prefixes; i++) {
            size_t l = strlen(w->path_prefixes[i]);
            if (r->path.len >= l && memcmp(r->path.ptr, w->path_prefixes[i], l) == 0)
                break;
        }
        if (i == w->n_path_prefixes)
            return 0;
    }
    for (size_t i = 0; i < w->n_headers; i++)
        if (!header_matches(&e->headers[i], r))
            return 0;
    return 1;
}

/* The entry's state for this request's worker, made on first use. Only
 * that worker reads or writes its slot. */
static void *worker_state(const sl_policy_chain_t *ch, const entry_t *e, unsigned worker)
{
    if (!e->worker_states || worker >= ch->nworkers)
        return NULL;
    if (!e->worker_states[worker])
        e->worker_states[worker] = e->def->worker_new(e->state);
    return e->worker_states[worker];
}

int sl_policy_chain_request(const sl_policy_chain_t *ch, sl_policy_req_t *req,
                            sl_policy_reply_t *reply)
{
    /* The reply may be an earlier request's (the runtime reuses the memory):
     * policies fill status, code, message and headers, and must find no
     * stale status, count or body (a 403 with a 204's empty body). Not a
     * memset: the reply is 2 KiB and this runs on every request. */
    reply->status = 0;
    reply->code = NULL;
    reply->message[0] = '\0';
    reply->num_headers = 0;
    reply->body = NULL;
    reply->body_len = 0;
    reply->content_type = NULL;
    /* Every entry's condition, now, while the request can be read: the
     * response hooks of entries after a short-circuit use it too. */
    req->applied = 0;
    for (size_t i = 0; ch && i < ch->n; i++)
        if (applies(&ch->e[i], req))
            req->applied |= 1ULL << i;
    for (size_t i = 0; ch && i < ch->n; i++) {
        const entry_t *e = &ch->e[i];
        if (!e->def->on_request || !(req->applied & (1ULL << i)))
            continue;
        req->worker_state = worker_state(ch, e, req->worker);
        if (e->def->worker_new && !req->worker_state) {
            /* Fail closed: a policy without its state is not skipped. */
            reply->status = 503;
            reply->code = "overloaded";
            snprintf(reply->message, sizeof(reply->message), "out of memory");
            req->rejected_by = e->def->name;
            req->rejected_index = (unsigned)i;
            return SL_POLICY_REPLY;
        }
        req->entry = (unsigned)i;
        if (e->def->on_request(e->state, req, reply) == SL_POLICY_REPLY) {
            req->rejected_by = e->def->name;
            req->rejected_index = (unsigned)i;
            return SL_POLICY_REPLY;
        }
    }
    return SL_POLICY_CONTINUE;
}

int sl_policy_chain_body(const sl_policy_chain_t *ch, sl_policy_req_t *req, const char *body,
                         size_t len, sl_policy_reply_t *reply)
{
    for (size_t i = 0; ch && i < ch->n; i++) {
        const entry_t *e = &ch->e[i];
        if (!e->def->on_body || !(req->body_entries & (1ULL << i)))
            continue;
        req->worker_state = worker_state(ch, e, req->worker);
        req->entry = (unsigned)i;
        if (e->def->on_body(e->state, req, body, len, reply) == SL_POLICY_REPLY) {
            req->rejected_by = e->def->name;
            req->rejected_index = (unsigned)i;
            return SL_POLICY_REPLY;
        }
    }
    return SL_POLICY_CONTINUE;
}

void sl_policy_chain_response(const sl_policy_chain_t *ch, sl_policy_req_t *req, int status)
{
    for (size_t i = 0; ch && ch->has_response && i < ch->n; i++) {
        const entry_t *e = &ch->e[i];
        if (!e->def->on_response || !(req->applied & (1ULL << i)))
            continue;
        req->worker_state = worker_state(ch, e, req->worker);
        e->def->on_response(e->state, req, status);
    }
}

size_t sl_policy_chain_len(const sl_policy_chain_t *ch)
{
    return ch ? ch->n : 0;
}

const char *sl_policy_chain_name(const sl_policy_chain_t *ch, size_t i)
{
    return ch && i < ch->n ? ch->e[i].def->name : NULL;
}

const char *sl_policy_chain_scope(const sl_policy_chain_t *ch, size_t i)
{
    if (!ch || i >= ch->n || !ch->e[i].def->metric_scope)
        return NULL;
    return ch->e[i].def->metric_scope(ch->e[i].state);
}

int sl_policy_chain_has_response(const sl_policy_chain_t *ch)
{
    return ch && ch->has_response;
}

int sl_policy_chain_has(const sl_policy_chain_t *ch, const char *name)
{
    for (size_t i = 0; ch && i < ch->n; i++)
        if (strcmp(ch->e[i].def->name, name) == 0)
            return 1;
    return 0;
}
