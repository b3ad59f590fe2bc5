/*
 * Compiler: a validated resource set -> the Snapshot of one fleet.
 *
 * Responsible for: choosing the fleet's Gateways and merging their
 * listeners; applying every default so that the runtime never has to guess
 * (precedence operation > Api > Gateway, documented in
 * docs/configuration.md); resolving backendRefs to Clusters and a https
 * listener's certificateRefs to the Certificates the snapshot carries (only
 * the referenced ones: they hold private keys); refusing a secretRef
 * Certificate, which only `sluice-controller --source kubernetes` can load
 * (controller/ksource.c reads the Secret and hands this file the PEM as an
 * inline Certificate, so a secretRef that reaches here was not resolved).
 * Also the snapshot's wire helpers (pack, unpack, free).
 *
 * Not responsible for checking single documents (validate.c already did, so
 * this file reads fields without re-checking their types) nor for turning a
 * snapshot into runtime tables (runtime/).
 *
 * Memory: the snapshot is built with malloc in the exact shape protobuf-c's
 * unpacker produces, so protobuf_c_message_free_unpacked frees a half-built
 * one on any failure. The result handed out is that build packed and
 * unpacked again: the caller gets precisely what a remote runtime would
 * receive, and one free function (sl_snapshot_free) serves every snapshot.
 *
 * One field is deliberately left 0 when not written: a route's and a table's
 * timeouts.upstream_connect_ms. It is set only when an operation or Api says
 * upstreamConnect; otherwise the Cluster's connect_timeout_ms (Backend's
 * timeouts.connect, else the Gateway's upstreamConnect, else 5s) applies, so
 * that a Backend's own connect timeout means something.
 */
#include "compiler.h"
#include "fmt.h"

#include "listener_http2.h"
#include "tls_pem.h"
#include "tlog_spec.h"
#include "validate.h"

#include <ctype.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Defaults; docs/configuration.md lists the same values. */
#define DEF_MAX_REQUEST_LINE_BYTES 8192
#define DEF_MAX_HEADER_BYTES 32768
#define DEF_MAX_HEADER_COUNT 100
#define DEF_REQUEST_HEADER_MS 10000
#define DEF_IDLE_MS 60000
#define DEF_REQUEST_MS 0
#define DEF_UPSTREAM_CONNECT_MS 5000
#define DEF_UPSTREAM_RESPONSE_MS 30000
#define DEF_RETRY_ATTEMPTS 1
/* The body a `routing` block with body conditions reads, at most. */
#define DEF_ROUTING_BODY_BYTES (64 * 1024)
/* Success-rate routing defaults (docs/routing.md). */
#define DEF_SR_WINDOW 125
#define DEF_SR_EXPLORE_PPM 50000     /* 5% */
#define DEF_SR_ELIMINATION_PPM 50000 /* 0.05 */
#define DEF_SR_MAX_KEYS 1024
#define DEF_SR_TOLERANCE_PPM 20000 /* 0.02: 2.5 outcomes of a 125-outcome window */
#define DEF_SR_RECOVERY_PROBES 16
#define DEF_RETRY_BUDGET_PERCENT 20
#define DEF_RETRY_MIN_CONCURRENCY 3
#define DEF_HC_INTERVAL_MS 5000
#define DEF_HC_TIMEOUT_MS 2000
#define DEF_HC_HEALTHY 2
#define DEF_HC_UNHEALTHY 3
#define DEF_HC_STATUS_MIN 200
#define DEF_HC_STATUS_MAX 399
#define DEF_OUTLIER_FAILURES 5
#define DEF_OUTLIER_EJECTION_MS 30000
#define DEF_OUTLIER_MAX_PERCENT 50
#define DEF_POOL_MAX_IDLE 1024
#define DEF_POOL_IDLE_TIMEOUT_MS 60000

/* A lookup of another resource made while compiling one (compile cache):
 * what was asked for and the content hash of what was found (0: absent). */
typedef struct {
    enum sl_kind kind;
    char *key; /* "ns/name" */
    uint64_t hash;
} cdep_t;

typedef struct {
    const sl_resource_set_t *set;
    sl_errors_t *errs;
    bool failed;
    bool oom;
    Sluice__V1__Snapshot *snap; /* for the certificates listeners add */
    /* Compile cache (sl_compile_cached): the lookups of the resource being
     * compiled are recorded in deps; a compile that adds a Certificate to
     * the snapshot (a side effect on another type) is not cacheable. */
    bool track;
    bool uncacheable;
    cdep_t *deps;
    size_t ndeps, capdeps;
} cctx_t;

/* --- reading validated documents ----------------------------------------- */

static json_t *jget(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return json_is_null(v) ? NULL : v;
}

static uint64_t jint(json_t *obj, const char *key, uint64_t def)
{
    json_t *v = jget(obj, key);
    return json_is_integer(v) ? (uint64_t)json_integer_value(v) : def;
}

static bool jbool(json_t *obj, const char *key, bool def)
{
    json_t *v = jget(obj, key);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

static const char *jstr(json_t *obj, const char *key, const char *def)
{
    json_t *v = jget(obj, key);
    return json_is_string(v) ? json_string_value(v) : def;
}

/* Durations were validated to fit uint32 milliseconds. */
static uint32_t jdur(json_t *obj, const char *key, uint32_t def)
{
    uint64_t ms;
    json_t *v = jget(obj, key);
    if (!v || sl_parse_duration_ms(v, &ms) != 0)
        return def;
    return (uint32_t)ms;
}

/* --- building messages --------------------------------------------------- */

static void *cnew(cctx_t *c, size_t size)
{
    void *p = calloc(1, size);
    if (!p)
        c->oom = true;
    return p;
}

/* Strings are always malloc'd copies (never protobuf_c_empty_string unless
 * allocation failed), so free_unpacked can free every one of them. */
static char *cstr(cctx_t *c, const char *s)
{
    char *d = strdup(s ? s : "");
    if (!d) {
        c->oom = true;
        return (char *)protobuf_c_empty_string;
    }
    return d;
}

static char *cprintf(cctx_t *c, const char *fmt, const char *a, const char *b)
{
    char *d = NULL;
    if (asprintf(&d, fmt, a, b) < 0) {
        c->oom = true;
        return (char *)protobuf_c_empty_string;
    }
    return d;
}

static void cerr(cctx_t *c, const sl_resource_t *r, const char *field, const char *fmt,
                 const char *a, const char *b)
{
    sl_errors_add(c->errs, r->source, r->doc, field, fmt, a, b);
    c->failed = true;
}

/* Allocates an array of n message pointers (NULL when n == 0). */
static void **carray(cctx_t *c, size_t n, size_t elem)
{
    if (n == 0)
        return NULL;
    void **a = calloc(n, elem);
    if (!a)
        c->oom = true;
    return a;
}

/* --- the fleet's Gateways ----------------------------------------------- */

typedef struct {
    const sl_resource_t *r;
} gw_ref_t;

static int cmp_gateways(const void *a, const void *b)
{
    const sl_resource_t *x = ((const gw_ref_t *)a)->r, *y = ((const gw_ref_t *)b)->r;
    int rc = strcmp(x->name, y->name);
    return rc ? rc : strcmp(x->ns, y->ns);
}

static const char *listener_address(json_t *l)
{
    return jstr(l, "address", "0.0.0.0");
}

static void place(char *buf, size_t len, const sl_resource_t *r)
{
    if (r->source[0])
        snprintf(buf, len, "%s doc %d", r->source, r->doc);
    else
        snprintf(buf, len, "doc %d", r->doc);
}

/* --- listener TLS and Certificates ---------------------------------------- */

/* Defaults of a listener's tls (docs/configuration.md, "Listener TLS"): the
 * TLS 1.3 suites are OpenSSL's; the TLS 1.2 list is Mozilla's "intermediate"
 * (forward secrecy and AEAD only); groups put X25519 first, as browsers do. */
#define DEF_TLS_CIPHER_SUITES                                                                      \
    "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
#define DEF_TLS_CIPHERS                                                                            \
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"     \
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"
#define DEF_TLS_GROUPS "X25519:P-256:P-384"
#define DEF_TLS_TICKET_ROTATION_MS (12u * 3600u * 1000u)
#define DEF_TLS_SESSION_CACHE_SIZE 20480
#define DEF_TLS_VERIFY_DEPTH 3

/*
 * a, sep, b (and sep2, c when c is not NULL) into buf as snprintf would
 * write them (cut at len - 1). The compile cache builds such keys for every
 * resource and dependency per compile, where snprintf's formatting cost
 * more than the lookups themselves.
 */
static void join_key(char *buf, size_t len, const char *a, char sep, const char *b, char sep2,
                     const char *c)
{
    size_t la = strlen(a), lb = strlen(b), lc = c ? strlen(c) : 0;
    if (la + lb + lc + 3 > len) {
        if (c)
            snprintf(buf, len, "%s%c%s%c%s", a, sep, b, sep2, c);
        else
            snprintf(buf, len, "%s%c%s", a, sep, b);
        return;
    }
    char *p = buf;
    memcpy(p, a, la);
    p += la;
    *p++ = sep;
    memcpy(p, b, lb);
    p += lb;
    if (c) {
        *p++ = sep2;
        memcpy(p, c, lc);
        p += lc;
    }
    *p = '\0';
}

/* Finds a resource by kind, namespace and name: through the set's index
 * when it has one (sl_resource_set_add builds it), else by scanning. */
static const sl_resource_t *set_find(const sl_resource_set_t *set, enum sl_kind kind,
                                     const char *ns, const char *name)
{
    if (set->index) {
        char key[1024];
        join_key(key, sizeof(key), sl_kind_name(kind), '/', ns, '/', name);
        json_t *pos = json_object_get(set->index, key);
        size_t i = pos ? (size_t)json_integer_value(pos) : set->count;
        if (i < set->count && set->items[i].kind == kind && strcmp(set->items[i].ns, ns) == 0 &&
            strcmp(set->items[i].name ? set->items[i].name : "", name) == 0)
            return &set->items[i];
        if (!pos)
            return NULL;
    }
    for (size_t i = 0; i < set->count; i++) {
        const sl_resource_t *r = &set->items[i];
        if (r->kind == kind && strcmp(r->ns, ns) == 0 && r->name && strcmp(r->name, name) == 0)
            return r;
    }
    return NULL;
}

/* Records a lookup of the resource being compiled (once per key). */
static void track_dep(cctx_t *c, enum sl_kind kind, const char *ns, const char *name,
                      const sl_resource_t *found)
{
    char key[1024];
    snprintf(key, sizeof(key), "%s/%s", ns, name);
    for (size_t i = 0; i < c->ndeps; i++)
        if (c->deps[i].kind == kind && strcmp(c->deps[i].key, key) == 0)
            return;
    if (c->ndeps == c->capdeps) {
        size_t ncap = c->capdeps ? c->capdeps * 2 : 4;
        cdep_t *n = realloc(c->deps, ncap * sizeof(*n));
        if (!n) {
            c->uncacheable = true;
            return;
        }
        c->deps = n;
        c->capdeps = ncap;
    }
    char *k = strdup(key);
    if (!k) {
        c->uncacheable = true;
        return;
    }
    c->deps[c->ndeps++] = (cdep_t){kind, k, found ? sl_resource_hash(found) : 0};
}

static const sl_resource_t *find_kind(cctx_t *c, enum sl_kind kind, const char *ns,
                                      const char *name)
{
    const sl_resource_t *r = set_find(c->set, kind, ns, name);
    if (c->track)
        track_dep(c, kind, ns, name, r);
    return r;
}

static const sl_resource_t *find_certificate(cctx_t *c, const char *ns, const char *name)
{
    return find_kind(c, SL_KIND_CERTIFICATE, ns, name);
}

/* A Certificate with spec.secretRef named at `field` of `r`: refused at
 * both ends, so that the Certificate's status says it too. */
static void refuse_secret_ref(cctx_t *c, const sl_resource_t *r, const char *field,
                              const sl_resource_t *cert, const char *full)
{
    cerr(c, r, field, "Certificate \"%s\" uses secretRef, %s", full,
         "which needs sluice-controller --source kubernetes; use certificate + privateKey, or "
         "file");
    cerr(c, cert, "spec.secretRef", "%s%s",
         "secretRef needs sluice-controller --source kubernetes (it reads the Secret from the "
         "Kubernetes API server)",
         "; use certificate + privateKey, or file");
}

/* Adds the Certificate `r` (compiled name `full`) to the snapshot once,
 * however many listeners name it; errors are reported at the Certificate. */
static void add_certificate(cctx_t *c, const sl_resource_t *r, const char *full)
{
    Sluice__V1__Snapshot *snap = c->snap;
    c->uncacheable = true; /* a compiled Backend's side effect on the Secrets */
    for (size_t i = 0; i < snap->n_certificates; i++)
        if (strcmp(snap->certificates[i]->name, full) == 0)
            return;
    if (!snap->certificates)
        return; /* allocation failed earlier; c->oom is set */
    Sluice__V1__TlsCertificate *t = cnew(c, sizeof(*t));
    if (!t)
        return;
    sluice__v1__tls_certificate__init(t);
    snap->certificates[snap->n_certificates++] = t;
    t->name = cstr(c, full);
    json_t *spec = jget(r->obj, "spec");
    json_t *file = jget(spec, "file");
    if (file) {
        t->chain_file = cstr(c, jstr(file, "certificate", ""));
        t->private_key_file = cstr(c, jstr(file, "privateKey", ""));
        return;
    }
    json_t *cv = jget(spec, "certificate"), *kv = jget(spec, "privateKey");
    /* Validation checked the pair when it was written; the facts are read
     * again here without the clock, so a stored Certificate that has since
     * expired still compiles and the runtime, not the compiler, refuses it
     * (with the expiry metric and the Expiring condition warning first). */
    sl_pem_cert_t pc;
    sl_pem_field_t f;
    char msg[512], field[64];
    if (sl_pem_load(&pc, json_string_value(cv), json_string_length(cv), json_string_value(kv),
                    json_string_length(kv), 0, 0, &f, msg, sizeof(msg)) != 0) {
        snprintf(field, sizeof(field), "spec.%s", sl_pem_field_name(f));
        cerr(c, r, field, "%s%s", msg, "");
        return;
    }
    t->chain_pem = cstr(c, json_string_value(cv));
    t->private_key_pem = cstr(c, json_string_value(kv));
    t->not_after_unix = pc.not_after_unix;
    t->sha256_fingerprint = cstr(c, pc.sha256_hex);
    t->names = (char **)carray(c, pc.n_names, sizeof(*t->names));
    for (size_t i = 0; t->names && i < pc.n_names; i++)
        t->names[t->n_names++] = cstr(c, pc.names[i]);
    sl_pem_free(&pc);
}

/* The key "slot" of a certificate: a listener holds one certificate per
 * slot and name set (OpenSSL keeps one per key type; P-256 and P-384 are
 * both ECDSA). */
static int key_slot(sl_pem_key_type_t t)
{
    return t == SL_PEM_KEY_EC_P384 ? SL_PEM_KEY_EC_P256 : (int)t;
}

static bool same_names(const sl_pem_cert_t *a, const sl_pem_cert_t *b)
{
    if (a->n_names != b->n_names)
        return false;
    for (size_t i = 0; i < a->n_names; i++) {
        bool found = false;
        for (size_t j = 0; j < b->n_names && !found; j++)
            found = strcmp(a->names[i], b->names[j]) == 0;
        if (!found)
            return false;
    }
    return true;
}

/* Two inline certificates of one listener with the same names and key type:
 * one would never be served. The runtime refuses it too (runtime/net/tls.c,
 * also for file-based ones); here the error names the field. */
static void check_cert_slots(cctx_t *c, const sl_resource_t *gw, json_t *refs, size_t index)
{
    size_t n = json_array_size(refs);
    sl_pem_cert_t *pcs = calloc(n ? n : 1, sizeof(*pcs));
    bool *ok = calloc(n ? n : 1, sizeof(*ok));
    if (!pcs || !ok) {
        c->oom = true;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const sl_resource_t *cert =
            find_certificate(c, gw->ns, jstr(json_array_get(refs, i), "name", ""));
        json_t *cv = cert ? jget(jget(cert->obj, "spec"), "certificate") : NULL;
        sl_pem_field_t f;
        char msg[256];
        ok[i] = cv && sl_pem_load(&pcs[i], json_string_value(cv), json_string_length(cv), NULL, 0,
                                  0, 0, &f, msg, sizeof(msg)) == 0;
        for (size_t j = 0; ok[i] && j < i; j++) {
            if (ok[j] && key_slot(pcs[j].key_type) == key_slot(pcs[i].key_type) &&
                same_names(&pcs[j], &pcs[i])) {
                char field[128], other[64];
                snprintf(field, sizeof(field), "spec.listeners[%zu].tls.certificateRefs[%zu].name",
                         index, i);
                snprintf(other, sizeof(other), "certificateRefs[%zu]", j);
                cerr(c, gw, field,
                     "same names and key type as %s: a listener serves one certificate per key "
                     "type and name (remove one, or pair RSA with ECDSA)%s",
                     other, "");
                break;
            }
        }
    }
out:
    for (size_t i = 0; pcs && i < n; i++)
        if (ok && ok[i])
            sl_pem_free(&pcs[i]);
    free(pcs);
    free(ok);
}

static Sluice__V1__ListenerTls *compile_listener_tls(cctx_t *c, const sl_resource_t *gw,
                                                     json_t *tls, size_t index)
{
    Sluice__V1__ListenerTls *t = cnew(c, sizeof(*t));
    if (!t)
        return NULL;
    sluice__v1__listener_tls__init(t);
    json_t *refs = jget(tls, "certificateRefs");
    size_t n = json_array_size(refs);
    t->certificates = (char **)carray(c, n, sizeof(*t->certificates));
    for (size_t i = 0; t->certificates && i < n; i++) {
        const char *name = jstr(json_array_get(refs, i), "name", "");
        char field[128], full[600];
        snprintf(field, sizeof(field), "spec.listeners[%zu].tls.certificateRefs[%zu].name", index,
                 i);
        snprintf(full, sizeof(full), "%s/%s", gw->ns, name);
        const sl_resource_t *cert = find_certificate(c, gw->ns, name);
        if (!cert) {
            cerr(c, gw, field, "Certificate \"%s\" not found%s", full, "");
            continue;
        }
        if (jget(jget(cert->obj, "spec"), "secretRef")) {
            refuse_secret_ref(c, gw, field, cert, full);
            continue;
        }
        add_certificate(c, cert, full);
        t->certificates[t->n_certificates++] = cstr(c, full);
    }
    check_cert_slots(c, gw, refs, index);
    const char *minv = jstr(tls, "minVersion", "1.2");
    t->min_version = strcmp(minv, "1.3") == 0 ? SLUICE__V1__LISTENER_TLS__VERSION__TLS1_3
                                              : SLUICE__V1__LISTENER_TLS__VERSION__TLS1_2;
    t->cipher_suites = cstr(c, jstr(tls, "cipherSuites", DEF_TLS_CIPHER_SUITES));
    t->ciphers = cstr(c, jstr(tls, "ciphers", DEF_TLS_CIPHERS));
    t->groups = cstr(c, jstr(tls, "groups", DEF_TLS_GROUPS));
    json_t *alpn = jget(tls, "alpn");
    static const char *const def_alpn[] = {"h2", "http/1.1"};
    size_t na = alpn ? json_array_size(alpn) : 2;
    t->alpn = (char **)carray(c, na, sizeof(*t->alpn));
    for (size_t i = 0; t->alpn && i < na; i++)
        t->alpn[t->n_alpn++] =
            cstr(c, alpn ? json_string_value(json_array_get(alpn, i)) : def_alpn[i]);
    json_t *tk = jget(tls, "sessionTickets");
    t->session_tickets = jbool(tk, "enabled", true);
    t->ticket_rotation_s = jdur(tk, "rotation", DEF_TLS_TICKET_ROTATION_MS) / 1000;
    json_t *sc = jget(tls, "sessionCache");
    t->session_cache = jbool(sc, "enabled", true);
    t->session_cache_size = (uint32_t)jint(sc, "size", DEF_TLS_SESSION_CACHE_SIZE);
    t->ocsp_staple_file = cstr(c, jstr(tls, "ocspStapleFile", ""));
    json_t *ca = jget(tls, "clientAuth");
    t->client_ca_pem = cstr(c, jstr(ca, "caBundle", ""));
    t->client_ca_file = cstr(c, jstr(ca, "caFile", ""));
    t->verify_depth = (uint32_t)jint(ca, "verifyDepth", DEF_TLS_VERIFY_DEPTH);
    if (ca)
        t->client_auth = strcmp(jstr(ca, "mode", "required"), "optional") == 0
                             ? SLUICE__V1__LISTENER_TLS__CLIENT_AUTH__CLIENT_AUTH_OPTIONAL
                             : SLUICE__V1__LISTENER_TLS__CLIENT_AUTH__CLIENT_AUTH_REQUIRED;
    return t;
}

/* Only the fields written: 0 leaves each at the codec's default, so a
 * runtime with other defaults applies its own (proto: ListenerHttp2). */
static Sluice__V1__ListenerHttp2 *compile_listener_http2(cctx_t *c, json_t *h2)
{
    Sluice__V1__ListenerHttp2 *m = cnew(c, sizeof(*m));
    if (!m)
        return NULL;
    sluice__v1__listener_http2__init(m);
    for (int i = 0; i < SL_LH2__COUNT; i++) {
        const sl_listener_http2_field_t *f = &sl_listener_http2_fields[i];
        uint32_t v = f->duration ? jdur(h2, f->name, 0) : (uint32_t)jint(h2, f->name, 0);
        sl_listener_http2_set(m, i, v);
    }
    return m;
}

static void compile_listeners(cctx_t *c, Sluice__V1__Snapshot *snap, gw_ref_t *gws, size_t ngw)
{
    size_t total = 0;
    for (size_t g = 0; g < ngw; g++)
        total += json_array_size(jget(jget(gws[g].r->obj, "spec"), "listeners"));
    snap->listeners = (Sluice__V1__Listener **)carray(c, total, sizeof(*snap->listeners));
    if (total && !snap->listeners)
        return;
    /* Where each compiled listener came from, for conflict messages. */
    const sl_resource_t **owner = calloc(total ? total : 1, sizeof(*owner));
    if (!owner) {
        c->oom = true;
        return;
    }
    for (size_t g = 0; g < ngw; g++) {
        const sl_resource_t *r = gws[g].r;
        json_t *ls = jget(jget(r->obj, "spec"), "listeners");
        for (size_t i = 0; i < json_array_size(ls); i++) {
            json_t *l = json_array_get(ls, i);
            char field[64];
            const char *proto = jstr(l, "protocol", "http");
            const char *name = jstr(l, "name", "");
            const char *addr = listener_address(l);
            uint32_t port = (uint32_t)jint(l, "port", 0);
            if (strcmp(proto, "http") != 0 && strcmp(proto, "https") != 0 &&
                strcmp(proto, "h2c") != 0) {
                snprintf(field, sizeof(field), "spec.listeners[%zu].protocol", i);
                cerr(c, r, field, "protocol %s is not supported by this runtime yet%s", proto,
                     " (use http)");
                continue;
            }
            bool clash = false;
            for (size_t k = 0; k < snap->n_listeners && !clash; k++) {
                Sluice__V1__Listener *o = snap->listeners[k];
                char where[600], msg[900];
                place(where, sizeof(where), owner[k]);
                if (strcmp(o->name, name) == 0) {
                    snprintf(field, sizeof(field), "spec.listeners[%zu].name", i);
                    snprintf(msg, sizeof(msg),
                             "listener name '%s' is also used by Gateway %s/%s (%s)", name,
                             owner[k]->ns, owner[k]->name, where);
                    cerr(c, r, field, "%s%s", msg, "");
                    clash = true;
                } else if (sl_validate_spec_listeners_conflict(addr, (long)port, o->address,
                                                               (long)o->port)) {
                    snprintf(field, sizeof(field), "spec.listeners[%zu].port", i);
                    snprintf(msg, sizeof(msg),
                             "%s:%u conflicts with listener '%s' (%s:%u) of Gateway %s/%s (%s)",
                             addr, port, o->name, o->address, o->port, owner[k]->ns, owner[k]->name,
                             where);
                    cerr(c, r, field, "%s%s", msg, "");
                    clash = true;
                }
            }
            if (clash)
                continue;
            Sluice__V1__Listener *out = cnew(c, sizeof(*out));
            if (!out)
                break;
            sluice__v1__listener__init(out);
            owner[snap->n_listeners] = r;
            snap->listeners[snap->n_listeners++] = out;
            out->name = cstr(c, name);
            out->address = cstr(c, addr);
            out->port = port;
            out->protocol = SLUICE__V1__LISTENER__PROTOCOL__HTTP;
            if (strcmp(proto, "h2c") == 0)
                out->protocol = SLUICE__V1__LISTENER__PROTOCOL__H2C;
            if (strcmp(proto, "https") == 0) {
                out->protocol = SLUICE__V1__LISTENER__PROTOCOL__HTTPS;
                out->tls = compile_listener_tls(c, r, jget(l, "tls"), i);
            }
            if (out->protocol != SLUICE__V1__LISTENER__PROTOCOL__HTTP && jget(l, "http2"))
                out->http2 = compile_listener_http2(c, jget(l, "http2"));
        }
    }
    free(owner);
}

/* The Gateway-level values every table and route inherits. */
typedef struct {
    Sluice__V1__Limits limits;
    Sluice__V1__Timeouts timeouts;
    bool via;
    Sluice__V1__PathNormalization path;
} gw_defaults_t;

static void gateway_defaults(json_t *spec, gw_defaults_t *d)
{
    json_t *lim = jget(spec, "limits");
    json_t *to = jget(spec, "timeouts");
    sluice__v1__limits__init(&d->limits);
    sluice__v1__timeouts__init(&d->timeouts);
    d->limits.max_request_line_bytes =
        (uint32_t)jint(lim, "maxRequestLineBytes", DEF_MAX_REQUEST_LINE_BYTES);
    d->limits.max_header_bytes = (uint32_t)jint(lim, "maxHeaderBytes", DEF_MAX_HEADER_BYTES);
    d->limits.max_header_count = (uint32_t)jint(lim, "maxHeaderCount", DEF_MAX_HEADER_COUNT);
    d->limits.max_request_body_bytes = jint(lim, "maxRequestBodyBytes", 0);
    d->limits.max_connections = (uint32_t)jint(lim, "maxConnections", 0);
    d->timeouts.request_header_ms = jdur(to, "requestHeader", DEF_REQUEST_HEADER_MS);
    d->timeouts.idle_ms = jdur(to, "idle", DEF_IDLE_MS);
    d->timeouts.request_ms = jdur(to, "request", DEF_REQUEST_MS);
    d->timeouts.upstream_connect_ms = jdur(to, "upstreamConnect", DEF_UPSTREAM_CONNECT_MS);
    d->timeouts.upstream_response_ms = jdur(to, "upstreamResponse", DEF_UPSTREAM_RESPONSE_MS);
    d->via = jbool(spec, "via", false);
    /* Defaults: keep "//", reject encoded slashes (docs/routing.md, "Path
     * normalisation", says why). */
    json_t *pn = jget(spec, "pathNormalization");
    sluice__v1__path_normalization__init(&d->path);
    d->path.merge_slashes = jbool(pn, "mergeSlashes", false);
    const char *slashes = jstr(pn, "encodedSlashes", "reject");
    if (strcmp(slashes, "keep") == 0)
        d->path.encoded_slashes = SLUICE__V1__PATH_NORMALIZATION__ENCODED_SLASHES__SLASHES_KEEP;
    else if (strcmp(slashes, "decode") == 0)
        d->path.encoded_slashes = SLUICE__V1__PATH_NORMALIZATION__ENCODED_SLASHES__SLASHES_DECODE;
    else
        d->path.encoded_slashes = SLUICE__V1__PATH_NORMALIZATION__ENCODED_SLASHES__SLASHES_REJECT;
}

static void compile_settings(cctx_t *c, Sluice__V1__Snapshot *snap, const gw_defaults_t *d)
{
    Sluice__V1__GatewaySettings *s = cnew(c, sizeof(*s));
    if (!s)
        return;
    sluice__v1__gateway_settings__init(s);
    snap->settings = s;
    s->limits = cnew(c, sizeof(*s->limits));
    s->timeouts = cnew(c, sizeof(*s->timeouts));
    if (s->limits)
        *s->limits = d->limits;
    if (s->timeouts)
        *s->timeouts = d->timeouts;
    s->add_via = d->via;
    s->path_normalization = cnew(c, sizeof(*s->path_normalization));
    if (s->path_normalization)
        *s->path_normalization = d->path;
}

/* --- traffic log ------------------------------------------------------------ */

static void compile_tlog_sink(cctx_t *c, Sluice__V1__TrafficLogSink *o, json_t *s)
{
    const char *type = jstr(s, "type", "file");
    o->name = cstr(c, jstr(s, "name", ""));
    o->type = strcmp(type, "http") == 0 ? SLUICE__V1__TRAFFIC_LOG_SINK__TYPE__HTTP
              : strcmp(type, "elasticsearch") == 0
                  ? SLUICE__V1__TRAFFIC_LOG_SINK__TYPE__ELASTICSEARCH
              : strcmp(type, "clickhouse") == 0 ? SLUICE__V1__TRAFFIC_LOG_SINK__TYPE__CLICKHOUSE
                                                : SLUICE__V1__TRAFFIC_LOG_SINK__TYPE__FILE;
    bool file = o->type == SLUICE__V1__TRAFFIC_LOG_SINK__TYPE__FILE;
    o->path = cstr(c, jstr(s, "path", ""));
    o->format = strcmp(jstr(s, "format", "json"), "combined") == 0
                    ? SLUICE__V1__TRAFFIC_LOG_SINK__FORMAT__COMBINED
                    : SLUICE__V1__TRAFFIC_LOG_SINK__FORMAT__JSON;
    json_t *rot = jget(s, "rotate");
    o->rotate_max_bytes = jint(rot, "maxBytes", 0);
    o->rotate_keep = (uint32_t)jint(rot, "keep", SL_TLOG_DEF_ROTATE_KEEP);
    o->url = cstr(c, jstr(s, "url", ""));
    o->index = cstr(c, o->type == SLUICE__V1__TRAFFIC_LOG_SINK__TYPE__ELASTICSEARCH
                           ? jstr(s, "index", SL_TLOG_DEF_ES_INDEX)
                           : "");
    /* database: X is the same as table X.<table>: the sink inserts into it. */
    const char *db = jstr(s, "database", "");
    o->table = o->type != SLUICE__V1__TRAFFIC_LOG_SINK__TYPE__CLICKHOUSE ? cstr(c, "")
               : db[0] ? cprintf(c, "%s.%s", db, jstr(s, "table", SL_TLOG_DEF_CH_TABLE))
                       : cstr(c, jstr(s, "table", SL_TLOG_DEF_CH_TABLE));
    json_t *auth = jget(s, "auth");
    o->username = cstr(c, jstr(auth, "username", ""));
    o->password = cstr(c, jstr(auth, "password", ""));
    o->api_key = cstr(c, jstr(auth, "apiKey", ""));
    o->ca_pem = cstr(c, jstr(s, "caBundle", ""));
    o->ca_file = cstr(c, jstr(s, "caFile", ""));
    json_t *b = jget(s, "batch");
    o->batch_max_records = (uint32_t)jint(b, "maxRecords", SL_TLOG_DEF_BATCH_RECORDS);
    o->batch_max_bytes = (uint32_t)jint(b, "maxBytes", SL_TLOG_DEF_BATCH_BYTES);
    o->batch_max_delay_ms =
        jdur(b, "maxDelay", file ? SL_TLOG_DEF_FILE_BATCH_DELAY_MS : SL_TLOG_DEF_BATCH_DELAY_MS);
    o->buffer_bytes = jint(s, "bufferBytes", SL_TLOG_DEF_BUFFER_BYTES);
    o->timeout_ms = jdur(s, "timeout", SL_TLOG_DEF_TIMEOUT_MS);
    json_t *r = jget(s, "retry");
    o->backoff_initial_ms = jdur(r, "initialBackoff", SL_TLOG_DEF_BACKOFF_INITIAL_MS);
    o->backoff_max_ms = jdur(r, "maxBackoff", SL_TLOG_DEF_BACKOFF_MAX_MS);
}

/* spec.trafficLog of the fleet's (first) Gateway; always present, so the
 * runtime never guesses a default. */
static Sluice__V1__TrafficLog *compile_traffic_log(cctx_t *c, const sl_resource_t *gw)
{
    Sluice__V1__TrafficLog *t = cnew(c, sizeof(*t));
    if (!t)
        return NULL;
    sluice__v1__traffic_log__init(t);
    json_t *tl = gw ? jget(jget(gw->obj, "spec"), "trafficLog") : NULL;
    t->gateway = gw ? cprintf(c, "%s/%s", gw->ns, gw->name) : cstr(c, "");
    t->enabled = jbool(tl, "enabled", true);
    t->sample_ppm = jget(tl, "sampling") ? sl_tlog_sample_ppm(jget(tl, "sampling")) : 1000000;
    t->fields64 =
        jget(tl, "fields") ? sl_tlog_fields_mask(jget(tl, "fields")) : SL_TLOG_FIELDS_DEFAULT;
    t->fields = (uint32_t)t->fields64;
    json_t *bd = jget(tl, "bodies");
    t->body_max_bytes = (uint32_t)jint(bd, "maxBytes", SL_TLOG_DEF_BODY_MAX_BYTES);
    json_t *bredact = jget(bd, "redact");
    size_t nbr = json_array_size(bredact);
    t->redact_body_fields = (char **)carray(c, nbr, sizeof(*t->redact_body_fields));
    for (size_t i = 0; t->redact_body_fields && i < nbr; i++)
        t->redact_body_fields[t->n_redact_body_fields++] =
            cstr(c, json_string_value(json_array_get(bredact, i)));
    json_t *btypes = jget(bd, "contentTypes");
    size_t nbt = 0;
    if (!btypes)
        while (sl_tlog_default_body_types[nbt])
            nbt++;
    else
        nbt = json_array_size(btypes);
    t->body_content_types = (char **)carray(c, nbt, sizeof(*t->body_content_types));
    for (size_t i = 0; t->body_content_types && i < nbt; i++) {
        char *ct = cstr(c, btypes ? json_string_value(json_array_get(btypes, i))
                                  : sl_tlog_default_body_types[i]);
        for (char *p = ct; p && *p; p++)
            *p = (char)tolower((unsigned char)*p);
        t->body_content_types[t->n_body_content_types++] = ct;
    }
    json_t *h = jget(tl, "headers");
    t->header_max_bytes = (uint32_t)jint(h, "maxBytes", SL_TLOG_DEF_HEADER_MAX_BYTES);
    json_t *redact = jget(h, "redact");
    size_t ndef = 0;
    while (sl_tlog_default_redact[ndef])
        ndef++;
    size_t nr = json_array_size(redact);
    t->redact_headers = (char **)carray(c, ndef + nr, sizeof(*t->redact_headers));
    for (size_t i = 0; t->redact_headers && i < ndef + nr; i++) {
        const char *name = i < ndef ? sl_tlog_default_redact[i]
                                    : json_string_value(json_array_get(redact, i - ndef));
        char *low = cstr(c, name);
        for (char *p = low; p && *p; p++)
            *p = (char)tolower((unsigned char)*p);
        t->redact_headers[t->n_redact_headers++] = low;
    }
    json_t *sinks = jget(tl, "sinks");
    size_t ns = json_array_size(sinks);
    t->sinks = (Sluice__V1__TrafficLogSink **)carray(c, ns, sizeof(*t->sinks));
    for (size_t i = 0; t->sinks && i < ns; i++) {
        Sluice__V1__TrafficLogSink *o = cnew(c, sizeof(*o));
        if (!o)
            break;
        sluice__v1__traffic_log_sink__init(o);
        t->sinks[t->n_sinks++] = o;
        compile_tlog_sink(c, o, json_array_get(sinks, i));
    }
    return t;
}

/* spec.tracing of the fleet's (first) Gateway; NULL when it has none (the
 * runtime then leaves traceparent to pass through untouched). */
static Sluice__V1__Tracing *compile_tracing(cctx_t *c, const sl_resource_t *gw)
{
    json_t *tr = gw ? jget(jget(gw->obj, "spec"), "tracing") : NULL;
    if (!tr)
        return NULL;
    Sluice__V1__Tracing *t = cnew(c, sizeof(*t));
    if (!t)
        return NULL;
    sluice__v1__tracing__init(t);
    t->generate = jbool(tr, "generate", true);
    t->sample_ppm = jget(tr, "sampling") ? sl_tlog_sample_ppm(jget(tr, "sampling")) : 1000000;
    t->server_timing = jbool(tr, "serverTiming", false);
    json_t *ex = jget(tr, "export");
    t->service_name = cstr(c, jstr(ex, "serviceName", "sluice"));
    if (ex) {
        Sluice__V1__TrafficLogSink *o = cnew(c, sizeof(*o));
        if (o) {
            sluice__v1__traffic_log_sink__init(o);
            compile_tlog_sink(c, o, ex);
            /* an export has no name of its own: the sink is "tracing" */
            if (o->name != protobuf_c_empty_string)
                free(o->name);
            o->name = cstr(c, "tracing");
            o->type = SLUICE__V1__TRAFFIC_LOG_SINK__TYPE__OTLP;
            t->export = o;
        }
    }
    return t;
}

/* An Api's trafficLog: its unset parts are the Gateway's. */
static Sluice__V1__TrafficLogOverride *
compile_traffic_log_override(cctx_t *c, json_t *tl, const Sluice__V1__TrafficLog *gw)
{
    if (!tl)
        return NULL;
    Sluice__V1__TrafficLogOverride *o = cnew(c, sizeof(*o));
    if (!o)
        return NULL;
    sluice__v1__traffic_log_override__init(o);
    o->enabled = jbool(tl, "enabled", gw ? gw->enabled : true);
    o->sample_ppm = jget(tl, "sampling") ? sl_tlog_sample_ppm(jget(tl, "sampling"))
                                         : (gw ? gw->sample_ppm : 1000000);
    o->fields64 = jget(tl, "fields") ? sl_tlog_fields_mask(jget(tl, "fields"))
                                     : (gw ? gw->fields64 : SL_TLOG_FIELDS_DEFAULT);
    o->fields = (uint32_t)o->fields64;
    return o;
}

/* --- Backends -> Clusters ------------------------------------------------ */

static void compile_cluster(cctx_t *c, Sluice__V1__Cluster *out, const sl_resource_t *r,
                            const gw_defaults_t *d)
{
    json_t *spec = jget(r->obj, "spec");
    out->name = cprintf(c, "%s/%s", r->ns, r->name);

    json_t *eps = jget(spec, "endpoints");
    size_t n = json_array_size(eps);
    out->endpoints = (Sluice__V1__Endpoint **)carray(c, n, sizeof(*out->endpoints));
    for (size_t i = 0; out->endpoints && i < n; i++) {
        json_t *e = json_array_get(eps, i);
        Sluice__V1__Endpoint *ep = cnew(c, sizeof(*ep));
        if (!ep)
            break;
        sluice__v1__endpoint__init(ep);
        out->endpoints[out->n_endpoints++] = ep;
        ep->address = cstr(c, jstr(e, "address", ""));
        ep->port = (uint32_t)jint(e, "port", 0);
        ep->weight = (uint32_t)jint(e, "weight", 1);
    }

    json_t *lb = jget(spec, "loadBalancing");
    const char *policy = jstr(lb, "policy", "round-robin");
    if (strcmp(policy, "least-request") == 0)
        out->lb_policy = SLUICE__V1__CLUSTER__LB_POLICY__LEAST_REQUEST;
    else if (strcmp(policy, "random") == 0)
        out->lb_policy = SLUICE__V1__CLUSTER__LB_POLICY__RANDOM;
    else if (strcmp(policy, "consistent-hash") == 0)
        out->lb_policy = SLUICE__V1__CLUSTER__LB_POLICY__CONSISTENT_HASH;
    else
        out->lb_policy = SLUICE__V1__CLUSTER__LB_POLICY__ROUND_ROBIN;
    json_t *hash = jget(lb, "hashOn");
    if (jget(hash, "header")) {
        out->hash_on = SLUICE__V1__CLUSTER__HASH_ON__HASH_HEADER;
        out->hash_key = cstr(c, jstr(hash, "header", ""));
    } else if (jget(hash, "cookie")) {
        out->hash_on = SLUICE__V1__CLUSTER__HASH_ON__HASH_COOKIE;
        out->hash_key = cstr(c, jstr(hash, "cookie", ""));
    } else if (jget(hash, "clientIp")) {
        out->hash_on = SLUICE__V1__CLUSTER__HASH_ON__HASH_CLIENT_IP;
    }

    json_t *hc = jget(spec, "healthCheck");
    if (hc) {
        Sluice__V1__HealthCheck *h = cnew(c, sizeof(*h));
        if (h) {
            sluice__v1__health_check__init(h);
            out->health_check = h;
            h->path = cstr(c, jstr(hc, "path", "/"));
            h->interval_ms = jdur(hc, "interval", DEF_HC_INTERVAL_MS);
            h->timeout_ms = jdur(hc, "timeout", DEF_HC_TIMEOUT_MS);
            h->healthy_threshold = (uint32_t)jint(hc, "healthyThreshold", DEF_HC_HEALTHY);
            h->unhealthy_threshold = (uint32_t)jint(hc, "unhealthyThreshold", DEF_HC_UNHEALTHY);
            h->expected_status_min = DEF_HC_STATUS_MIN;
            h->expected_status_max = DEF_HC_STATUS_MAX;
            json_t *st = jget(hc, "expectedStatuses");
            if (json_is_integer(st)) {
                h->expected_status_min = h->expected_status_max = (uint32_t)json_integer_value(st);
            } else if (json_is_string(st)) {
                unsigned lo = 0, hi = 0;
                int k = sscanf(json_string_value(st), "%u-%u", &lo, &hi);
                h->expected_status_min = lo;
                h->expected_status_max = k == 2 ? hi : lo;
            }
            h->host = cstr(c, jstr(hc, "host", ""));
            json_t *grpc = jget(hc, "grpc");
            if (grpc) {
                h->grpc = cnew(c, sizeof(*h->grpc));
                if (h->grpc) {
                    sluice__v1__grpc_health_check__init(h->grpc);
                    h->grpc->service = cstr(c, jstr(grpc, "service", ""));
                    h->grpc->authority = cstr(c, jstr(grpc, "authority", ""));
                }
            }
        }
    }

    json_t *od = jget(spec, "outlierDetection");
    out->outlier = cnew(c, sizeof(*out->outlier));
    if (out->outlier) {
        sluice__v1__outlier_detection__init(out->outlier);
        out->outlier->consecutive_failures =
            (uint32_t)jint(od, "consecutiveFailures", DEF_OUTLIER_FAILURES);
        out->outlier->base_ejection_ms = jdur(od, "baseEjectionTime", DEF_OUTLIER_EJECTION_MS);
        out->outlier->max_ejection_percent =
            (uint32_t)jint(od, "maxEjectionPercent", DEF_OUTLIER_MAX_PERCENT);
    }

    json_t *cp = jget(spec, "connectionPool");
    out->pool = cnew(c, sizeof(*out->pool));
    if (out->pool) {
        sluice__v1__connection_pool__init(out->pool);
        out->pool->max_connections = (uint32_t)jint(cp, "maxConnections", 0);
        out->pool->max_idle = (uint32_t)jint(cp, "maxIdle", DEF_POOL_MAX_IDLE);
        out->pool->idle_timeout_ms = jdur(cp, "idleTimeout", DEF_POOL_IDLE_TIMEOUT_MS);
    }

    json_t *cb = jget(spec, "circuitBreaker");
    if (cb && (out->circuit_breaker = cnew(c, sizeof(*out->circuit_breaker)))) {
        sluice__v1__circuit_breaker__init(out->circuit_breaker);
        out->circuit_breaker->max_connections = (uint32_t)jint(cb, "maxConnections", 0);
        out->circuit_breaker->max_pending_requests = (uint32_t)jint(cb, "maxPendingRequests", 0);
        out->circuit_breaker->max_requests = (uint32_t)jint(cb, "maxRequests", 0);
        out->circuit_breaker->max_retries = (uint32_t)jint(cb, "maxRetries", 0);
    }

    out->connect_timeout_ms =
        jdur(jget(spec, "timeouts"), "connect", d->timeouts.upstream_connect_ms);
    out->host_rewrite = cstr(c, jstr(spec, "hostRewrite", ""));
    const char *proto = jstr(spec, "protocol", "http1");
    out->protocol = strcmp(proto, "h2") == 0    ? SLUICE__V1__CLUSTER__PROTOCOL__H2
                    : strcmp(proto, "h2c") == 0 ? SLUICE__V1__CLUSTER__PROTOCOL__H2C
                                                : SLUICE__V1__CLUSTER__PROTOCOL__HTTP1;
    json_t *tls = jget(spec, "tls");
    if (tls) {
        Sluice__V1__UpstreamTls *t = cnew(c, sizeof(*t));
        if (t) {
            sluice__v1__upstream_tls__init(t);
            out->tls = t;
            t->sni = cstr(c, jstr(tls, "sni", ""));
            t->ca_pem = cstr(c, jstr(tls, "caBundle", ""));
            t->ca_file = cstr(c, jstr(tls, "caFile", ""));
            json_t *ref = jget(tls, "clientCertificateRef");
            if (ref) {
                const char *name = jstr(ref, "name", "");
                char full[600];
                snprintf(full, sizeof(full), "%s/%s", r->ns, name);
                const sl_resource_t *cert = find_certificate(c, r->ns, name);
                if (!cert) {
                    cerr(c, r, "spec.tls.clientCertificateRef.name",
                         "Certificate \"%s\" not found%s", full, "");
                } else if (jget(jget(cert->obj, "spec"), "secretRef")) {
                    refuse_secret_ref(c, r, "spec.tls.clientCertificateRef.name", cert, full);
                } else {
                    add_certificate(c, cert, full);
                    t->client_certificate = cstr(c, full);
                }
            }
        }
    }
}

/* --- Apis -> RouteTables ------------------------------------------------- */

static const sl_resource_t *find_backend(cctx_t *c, const char *ns, const char *name)
{
    return find_kind(c, SL_KIND_BACKEND, ns, name);
}

static void compile_backend_refs(cctx_t *c, const sl_resource_t *api, json_t *refs,
                                 const char *field_prefix, Sluice__V1__BackendRef ***out,
                                 size_t *nout)
{
    size_t n = json_array_size(refs);
    *out = (Sluice__V1__BackendRef **)carray(c, n, sizeof(**out));
    for (size_t i = 0; *out && i < n; i++) {
        json_t *ref = json_array_get(refs, i);
        const char *name = jstr(ref, "name", "");
        if (!find_backend(c, api->ns, name)) {
            char field[128], full[600];
            snprintf(field, sizeof(field), "%sbackendRefs[%zu].name", field_prefix, i);
            snprintf(full, sizeof(full), "%s/%s", api->ns, name);
            cerr(c, api, field, "Backend \"%s\" not found%s", full, "");
            continue;
        }
        Sluice__V1__BackendRef *b = cnew(c, sizeof(*b));
        if (!b)
            return;
        sluice__v1__backend_ref__init(b);
        (*out)[(*nout)++] = b;
        b->cluster = cprintf(c, "%s/%s", api->ns, name);
        b->weight = (uint32_t)jint(ref, "weight", 1);
    }
}

/* A retry policy: `base` (the level above) overridden field by field by the
 * `retries` object; `on`, when written, replaces the whole list. */
static Sluice__V1__RetryPolicy *compile_retry(cctx_t *c, const Sluice__V1__RetryPolicy *base,
                                              json_t *retries)
{
    Sluice__V1__RetryPolicy *p = cnew(c, sizeof(*p));
    if (!p)
        return NULL;
    sluice__v1__retry_policy__init(p);
    if (base) {
        p->attempts = base->attempts;
        p->on_connect_failure = base->on_connect_failure;
        p->on_reset = base->on_reset;
        p->non_idempotent = base->non_idempotent;
        p->budget_percent = base->budget_percent;
        p->min_retry_concurrency = base->min_retry_concurrency;
        p->per_try_timeout_ms = base->per_try_timeout_ms;
        if (base->n_on_status) {
            p->on_status = malloc(base->n_on_status * sizeof(*p->on_status));
            if (!p->on_status) {
                c->oom = true;
            } else {
                memcpy(p->on_status, base->on_status, base->n_on_status * sizeof(*p->on_status));
                p->n_on_status = base->n_on_status;
            }
        }
    } else {
        /* 503 is not retried by default: it is how an origin sheds load, and
         * a retry doubles the load it is shedding (docs/configuration.md). */
        static const uint32_t def_status[] = {502, 504};
        p->attempts = DEF_RETRY_ATTEMPTS;
        p->on_connect_failure = 1;
        p->on_reset = 1;
        p->budget_percent = DEF_RETRY_BUDGET_PERCENT;
        p->min_retry_concurrency = DEF_RETRY_MIN_CONCURRENCY;
        p->on_status = malloc(sizeof(def_status));
        if (!p->on_status) {
            c->oom = true;
        } else {
            memcpy(p->on_status, def_status, sizeof(def_status));
            p->n_on_status = sizeof(def_status) / sizeof(def_status[0]);
        }
    }
    if (!retries)
        return p;
    p->attempts = (uint32_t)jint(retries, "attempts", p->attempts);
    p->non_idempotent = jbool(retries, "nonIdempotent", p->non_idempotent);
    p->budget_percent = (uint32_t)jint(retries, "budgetPercent", p->budget_percent);
    p->min_retry_concurrency =
        (uint32_t)jint(retries, "minRetryConcurrency", p->min_retry_concurrency);
    p->per_try_timeout_ms = jdur(retries, "perTryTimeout", p->per_try_timeout_ms);
    json_t *on = jget(retries, "on");
    if (on) {
        free(p->on_status);
        p->on_status = NULL;
        p->n_on_status = 0;
        p->on_connect_failure = 0;
        p->on_reset = 0;
        size_t n = json_array_size(on);
        if (n) {
            p->on_status = malloc(n * sizeof(*p->on_status));
            if (!p->on_status) {
                c->oom = true;
                return p;
            }
        }
        for (size_t i = 0; i < n; i++) {
            json_t *v = json_array_get(on, i);
            uint32_t code = 0;
            if (json_is_integer(v))
                code = (uint32_t)json_integer_value(v);
            else if (strcmp(json_string_value(v), "connect-failure") == 0)
                p->on_connect_failure = 1;
            else if (strcmp(json_string_value(v), "reset") == 0)
                p->on_reset = 1;
            else
                code = (uint32_t)atoi(json_string_value(v));
            if (!code)
                continue;
            bool dup = false;
            for (size_t k = 0; k < p->n_on_status; k++)
                dup |= p->on_status[k] == code;
            if (!dup)
                p->on_status[p->n_on_status++] = code;
        }
    }
    return p;
}

static Sluice__V1__HeaderMatch **compile_matches(cctx_t *c, json_t *list, size_t *nout)
{
    size_t n = json_array_size(list);
    Sluice__V1__HeaderMatch **out = (Sluice__V1__HeaderMatch **)carray(c, n, sizeof(*out));
    for (size_t i = 0; out && i < n; i++) {
        json_t *m = json_array_get(list, i);
        Sluice__V1__HeaderMatch *h = cnew(c, sizeof(*h));
        if (!h)
            break;
        sluice__v1__header_match__init(h);
        out[(*nout)++] = h;
        h->name = cstr(c, jstr(m, "name", ""));
        h->value = cstr(c, jstr(m, "value", ""));
        const char *type = jstr(m, "type", "exact");
        if (strcmp(type, "prefix") == 0)
            h->kind = SLUICE__V1__HEADER_MATCH__KIND__PREFIX;
        else if (strcmp(type, "regex") == 0)
            h->kind = SLUICE__V1__HEADER_MATCH__KIND__REGEX;
        else if (strcmp(type, "present") == 0)
            h->kind = SLUICE__V1__HEADER_MATCH__KIND__PRESENT;
        else
            h->kind = SLUICE__V1__HEADER_MATCH__KIND__EXACT;
        h->invert = jbool(m, "invert", false);
    }
    return out;
}

static char *upper_dup(cctx_t *c, const char *s)
{
    char *d = cstr(c, s);
    if (d != protobuf_c_empty_string)
        for (char *p = d; *p; p++)
            if (*p >= 'a' && *p <= 'z')
                *p = (char)(*p - 'a' + 'A');
    return d;
}

/* Default idle timeout of an upgraded (tunnelled) connection: an hour, as
 * Envoy's; 60 s (nginx, Kong) closes quiet WebSockets that users expect to
 * stay open. */
#define DEF_TUNNEL_IDLE_MS 3600000u

/*
 * The upgrade tokens a route tunnels: websocket unless disabled, then the
 * Api's `upgrades` entries, then the operation's, each adding
 * (`enabled: true`, the default) or removing a token. Tokens compare
 * case-insensitively and are stored in lower case.
 */
static void apply_upgrades(json_t *list, char **tokens, bool *on, size_t *n, size_t cap)
{
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *u = json_array_get(list, i);
        const char *type = jstr(u, "type", "");
        bool enabled = jbool(u, "enabled", true);
        size_t k;
        for (k = 0; k < *n; k++)
            if (strcasecmp(tokens[k], type) == 0)
                break;
        if (k == *n) {
            if (*n == cap)
                continue;
            tokens[(*n)++] = (char *)type;
        }
        on[k] = enabled;
    }
}

static void compile_upgrades(cctx_t *c, Sluice__V1__Route *rt, json_t *api_list, json_t *op_list)
{
    char *tokens[33] = {"websocket"};
    bool on[33] = {true};
    size_t n = 1;
    apply_upgrades(api_list, tokens, on, &n, 33);
    apply_upgrades(op_list, tokens, on, &n, 33);
    size_t enabled = 0;
    for (size_t i = 0; i < n; i++)
        enabled += on[i];
    rt->upgrades = (char **)carray(c, enabled, sizeof(*rt->upgrades));
    for (size_t i = 0; rt->upgrades && i < n; i++) {
        if (!on[i])
            continue;
        char *t = cstr(c, tokens[i]);
        if (t != protobuf_c_empty_string)
            for (char *p = t; *p; p++)
                *p = (char)tolower((unsigned char)*p);
        rt->upgrades[rt->n_upgrades++] = t;
    }
}

/* A policy list entry's `when`, compiled; NULL when absent. */
static Sluice__V1__PolicyCondition *compile_condition(cctx_t *c, json_t *when)
{
    if (!when)
        return NULL;
    Sluice__V1__PolicyCondition *pc = cnew(c, sizeof(*pc));
    if (!pc)
        return NULL;
    sluice__v1__policy_condition__init(pc);
    json_t *methods = jget(when, "methods");
    pc->methods = (char **)carray(c, json_array_size(methods), sizeof(*pc->methods));
    for (size_t i = 0; pc->methods && i < json_array_size(methods); i++)
        pc->methods[pc->n_methods++] = upper_dup(c, json_string_value(json_array_get(methods, i)));
    json_t *prefixes = jget(when, "pathPrefixes");
    pc->path_prefixes = (char **)carray(c, json_array_size(prefixes), sizeof(*pc->path_prefixes));
    for (size_t i = 0; pc->path_prefixes && i < json_array_size(prefixes); i++)
        pc->path_prefixes[pc->n_path_prefixes++] =
            cstr(c, json_string_value(json_array_get(prefixes, i)));
    pc->headers = compile_matches(c, jget(when, "headers"), &pc->n_headers);
    return pc;
}

/*
 * A route's policy chain (policies/policy.h): the Api's `policies` in
 * order; then each of the operation's entries replaces the inherited one
 * of the same name in place (config and when), removes it (`disabled:
 * true`), or is appended. Validation has checked names and configs.
 */
static void compile_policies(cctx_t *c, Sluice__V1__Route *rt, json_t *api_list, json_t *op_list)
{
    size_t cap = json_array_size(api_list) + json_array_size(op_list);
    if (cap == 0)
        return;
    json_t **chain = calloc(cap, sizeof(*chain));
    if (!chain) {
        c->oom = true;
        return;
    }
    size_t n = 0;
    for (size_t i = 0; i < json_array_size(api_list); i++)
        chain[n++] = json_array_get(api_list, i);
    for (size_t i = 0; i < json_array_size(op_list); i++) {
        json_t *e = json_array_get(op_list, i);
        const char *name = jstr(e, "name", "");
        size_t k;
        for (k = 0; k < n; k++)
            if (strcmp(jstr(chain[k], "name", ""), name) == 0)
                break;
        if (jbool(e, "disabled", false)) {
            if (k < n) {
                memmove(&chain[k], &chain[k + 1], (n - k - 1) * sizeof(*chain));
                n--;
            }
        } else if (k < n) {
            chain[k] = e;
        } else {
            chain[n++] = e;
        }
    }
    rt->policies = (Sluice__V1__Policy **)carray(c, n, sizeof(*rt->policies));
    for (size_t i = 0; rt->policies && i < n; i++) {
        Sluice__V1__Policy *p = cnew(c, sizeof(*p));
        if (!p)
            break;
        sluice__v1__policy__init(p);
        rt->policies[rt->n_policies++] = p;
        p->name = cstr(c, jstr(chain[i], "name", ""));
        json_t *config = jget(chain[i], "config");
        char *js = config ? json_dumps(config, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY)
                          : strdup("{}");
        if (!js)
            c->oom = true;
        p->config_json = js ? js : (char *)protobuf_c_empty_string;
        p->when = compile_condition(c, jget(chain[i], "when"));
    }
    free(chain);
}

/* --- routing (Api/operation `routing`) ------------------------------------ */

/* A value written as a number or boolean is compared as its text. */
static char *scalar_text(cctx_t *c, json_t *v)
{
    if (json_is_string(v))
        return cstr(c, json_string_value(v));
    char buf[64];
    if (json_is_integer(v))
        snprintf(buf, sizeof(buf), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
    else if (json_is_real(v))
        snprintf(buf, sizeof(buf), "%.17g", json_real_value(v));
    else
        snprintf(buf, sizeof(buf), "%s", json_is_true(v) ? "true" : "false");
    return cstr(c, buf);
}

static char *lower_dup(cctx_t *c, const char *s)
{
    char *d = cstr(c, s);
    for (char *p = d; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    return d;
}

static Sluice__V1__RouteMatch *compile_statement(cctx_t *c, json_t *st)
{
    Sluice__V1__RouteMatch *m = cnew(c, sizeof(*m));
    if (!m)
        return NULL;
    sluice__v1__route_match__init(m);
    json_t *kids = jget(st, "all");
    m->kind = SLUICE__V1__ROUTE_MATCH__KIND__ALL;
    if (!kids) {
        kids = jget(st, "any");
        m->kind = SLUICE__V1__ROUTE_MATCH__KIND__ANY;
    }
    if (kids) {
        m->children = (Sluice__V1__RouteMatch **)carray(c, json_array_size(kids),
                                                       sizeof(*m->children));
        for (size_t i = 0; m->children && i < json_array_size(kids); i++) {
            Sluice__V1__RouteMatch *k = compile_statement(c, json_array_get(kids, i));
            if (k)
                m->children[m->n_children++] = k;
        }
        return m;
    }
    m->kind = SLUICE__V1__ROUTE_MATCH__KIND__CONDITION;
    static const struct {
        const char *key;
        Sluice__V1__RouteMatch__Attr attr;
    } named[] = {
        {"header", SLUICE__V1__ROUTE_MATCH__ATTR__HEADER},
        {"query", SLUICE__V1__ROUTE_MATCH__ATTR__QUERY},
        {"cookie", SLUICE__V1__ROUTE_MATCH__ATTR__COOKIE},
        {"pathParam", SLUICE__V1__ROUTE_MATCH__ATTR__PATH_PARAM},
        {"claim", SLUICE__V1__ROUTE_MATCH__ATTR__CLAIM},
        {"body", SLUICE__V1__ROUTE_MATCH__ATTR__BODY},
    };
    m->name = cstr(c, "");
    for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++) {
        const char *n = jstr(st, named[i].key, NULL);
        if (!n)
            continue;
        m->attr = named[i].attr;
        free(m->name);
        m->name = named[i].attr == SLUICE__V1__ROUTE_MATCH__ATTR__HEADER ? lower_dup(c, n)
                                                                           : cstr(c, n);
    }
    const char *a = jstr(st, "attribute", NULL);
    if (a)
        m->attr = strcmp(a, "method") == 0     ? SLUICE__V1__ROUTE_MATCH__ATTR__METHOD
                  : strcmp(a, "clientIp") == 0 ? SLUICE__V1__ROUTE_MATCH__ATTR__CLIENT_IP
                  : strcmp(a, "consumer") == 0 ? SLUICE__V1__ROUTE_MATCH__ATTR__CONSUMER
                                               : SLUICE__V1__ROUTE_MATCH__ATTR__CONSUMER_GROUP;
    static const struct {
        const char *key;
        Sluice__V1__RouteMatch__Op op;
    } ops[] = {
        {"equals", SLUICE__V1__ROUTE_MATCH__OP__EQUALS},
        {"notEquals", SLUICE__V1__ROUTE_MATCH__OP__NOT_EQUALS},
        {"in", SLUICE__V1__ROUTE_MATCH__OP__IN},
        {"prefix", SLUICE__V1__ROUTE_MATCH__OP__PREFIX},
        {"regex", SLUICE__V1__ROUTE_MATCH__OP__REGEX},
        {"lt", SLUICE__V1__ROUTE_MATCH__OP__LT},
        {"le", SLUICE__V1__ROUTE_MATCH__OP__LE},
        {"gt", SLUICE__V1__ROUTE_MATCH__OP__GT},
        {"ge", SLUICE__V1__ROUTE_MATCH__OP__GE},
        {"present", SLUICE__V1__ROUTE_MATCH__OP__PRESENT},
        {"absent", SLUICE__V1__ROUTE_MATCH__OP__ABSENT},
    };
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        json_t *v = jget(st, ops[i].key);
        if (!v)
            continue;
        m->op = ops[i].op;
        if (json_is_array(v)) {
            m->values = (char **)carray(c, json_array_size(v), sizeof(*m->values));
            for (size_t k = 0; m->values && k < json_array_size(v); k++)
                m->values[m->n_values++] = scalar_text(c, json_array_get(v, k));
        } else if (json_is_number(v) && m->op >= SLUICE__V1__ROUTE_MATCH__OP__LT &&
                   m->op <= SLUICE__V1__ROUTE_MATCH__OP__GE) {
            m->number = json_number_value(v);
        } else if (!json_is_true(v) || m->op < SLUICE__V1__ROUTE_MATCH__OP__PRESENT) {
            m->values = (char **)carray(c, 1, sizeof(*m->values));
            if (m->values)
                m->values[m->n_values++] = scalar_text(c, v);
        }
    }
    return m;
}

/* A rule's or the default's output; backend names are checked against the
 * Backends of the Api's namespace (field: "spec.routing.rules[0]."). */
static Sluice__V1__RouteOutput *compile_route_output(cctx_t *c, const sl_resource_t *api,
                                                     json_t *obj, const char *field, int quiet,
                                                     const char *block_strategy)
{
    Sluice__V1__RouteOutput *o = cnew(c, sizeof(*o));
    if (!o)
        return NULL;
    sluice__v1__route_output__init(o);
    /* An output's own strategy, else the block's (docs/routing.md
     * "Success-rate routing over rule outputs"). */
    o->success_rate = strcmp(jstr(obj, "strategy", block_strategy), "success-rate") == 0;
    json_t *split = jget(obj, "split");
    size_t n = split ? json_array_size(split) : 1;
    o->targets = (Sluice__V1__RouteOutput__Target **)carray(c, n, sizeof(*o->targets));
    for (size_t i = 0; o->targets && i < n; i++) {
        json_t *src = split ? json_array_get(split, i) : obj;
        Sluice__V1__RouteOutput__Target *t = cnew(c, sizeof(*t));
        if (!t)
            break;
        sluice__v1__route_output__target__init(t);
        o->targets[o->n_targets++] = t;
        t->weight = split ? (uint32_t)jint(src, "weight", 1) : 1;
        json_t *prio = jget(src, "priority");
        json_t *one = jget(src, "backend");
        size_t np = prio ? json_array_size(prio) : 1;
        t->clusters = (char **)carray(c, np, sizeof(*t->clusters));
        for (size_t k = 0; t->clusters && k < np; k++) {
            const char *name = json_string_value(prio ? json_array_get(prio, k) : one);
            char where[200], full[600];
            if (split && prio)
                snprintf(where, sizeof(where), "%ssplit[%zu].priority[%zu]", field, i, k);
            else if (split)
                snprintf(where, sizeof(where), "%ssplit[%zu].backend", field, i);
            else if (prio)
                snprintf(where, sizeof(where), "%spriority[%zu]", field, k);
            else
                snprintf(where, sizeof(where), "%sbackend", field);
            if (!name || !find_backend(c, api->ns, name)) {
                snprintf(full, sizeof(full), "%s/%s", api->ns, name ? name : "");
                if (quiet)
                    c->failed = true;
                else
                    cerr(c, api, where, "Backend \"%s\" not found%s", full, "");
                continue;
            }
            t->clusters[t->n_clusters++] = cprintf(c, "%s/%s", api->ns, name);
        }
    }
    return o;
}

/* quiet: the Api's block compiled again for another operation; its
 * errors were reported with the first. */
static Sluice__V1__Routing *compile_routing(cctx_t *c, const sl_resource_t *api, json_t *routing,
                                            const char *field_prefix, int quiet)
{
    Sluice__V1__Routing *r = cnew(c, sizeof(*r));
    if (!r)
        return NULL;
    sluice__v1__routing__init(r);
    char field[160];
    const char *strategy = jstr(routing, "strategy", "weighted");
    json_t *rules = jget(routing, "rules");
    r->rules = (Sluice__V1__RouteRule **)carray(c, json_array_size(rules), sizeof(*r->rules));
    for (size_t i = 0; r->rules && i < json_array_size(rules); i++) {
        json_t *rj = json_array_get(rules, i);
        Sluice__V1__RouteRule *rule = cnew(c, sizeof(*rule));
        if (!rule)
            break;
        sluice__v1__route_rule__init(rule);
        r->rules[r->n_rules++] = rule;
        char deflt[32];
        snprintf(deflt, sizeof(deflt), "rules[%zu]", i);
        rule->name = cstr(c, jstr(rj, "name", deflt));
        json_t *m = jget(rj, "match");
        rule->match =
            (Sluice__V1__RouteMatch **)carray(c, json_array_size(m), sizeof(*rule->match));
        for (size_t k = 0; rule->match && k < json_array_size(m); k++) {
            Sluice__V1__RouteMatch *st = compile_statement(c, json_array_get(m, k));
            if (st)
                rule->match[rule->n_match++] = st;
        }
        snprintf(field, sizeof(field), "%srouting.rules[%zu].", field_prefix, i);
        rule->output = compile_route_output(c, api, rj, field, quiet, strategy);
    }
    r->max_body_bytes = jint(routing, "maxBodyBytes", DEF_ROUTING_BODY_BYTES);
    if (jget(routing, "default")) {
        snprintf(field, sizeof(field), "%srouting.default.", field_prefix);
        r->default_output =
            compile_route_output(c, api, jget(routing, "default"), field, quiet, strategy);
    } else {
        r->backends_success_rate = strcmp(strategy, "success-rate") == 0;
    }
    return r;
}

static int statement_reads_body(const Sluice__V1__RouteMatch *m)
{
    if (m->kind == SLUICE__V1__ROUTE_MATCH__KIND__CONDITION)
        return m->attr == SLUICE__V1__ROUTE_MATCH__ATTR__BODY;
    for (size_t i = 0; i < m->n_children; i++)
        if (statement_reads_body(m->children[i]))
            return 1;
    return 0;
}

/* A block with body conditions chooses the backend after the upstream
 * request head is written (the body comes after it): every backend it can
 * choose must take the same head, so the same protocol and Host. */
static void routing_body_check(cctx_t *c, const sl_resource_t *api, const Sluice__V1__Routing *r,
                               const Sluice__V1__Route *rt, const Sluice__V1__RouteTable *t,
                               const char *field)
{
    int reads = 0;
    for (size_t i = 0; i < r->n_rules && !reads; i++)
        for (size_t k = 0; k < r->rules[i]->n_match && !reads; k++)
            reads = statement_reads_body(r->rules[i]->match[k]);
    if (!reads)
        return;
    const char *first = NULL, *first_proto = NULL, *first_host = NULL;
    const Sluice__V1__RouteOutput *outs[1001];
    size_t nouts = 0;
    for (size_t i = 0; i < r->n_rules && nouts < 1000; i++)
        outs[nouts++] = r->rules[i]->output;
    if (r->default_output)
        outs[nouts++] = r->default_output;
    size_t nrefs = rt->n_backends ? rt->n_backends : t->n_backends;
    Sluice__V1__BackendRef **refs = rt->n_backends ? rt->backends : t->backends;
    for (size_t o = 0; o <= nouts; o++) {
        size_t nt = o < nouts ? (outs[o] ? outs[o]->n_targets : 0) : (r->default_output ? 0 : nrefs);
        for (size_t i = 0; i < nt; i++) {
            size_t nc = o < nouts ? outs[o]->targets[i]->n_clusters : 1;
            for (size_t k = 0; k < nc; k++) {
                const char *full = o < nouts ? outs[o]->targets[i]->clusters[k] : refs[i]->cluster;
                const char *slash = strchr(full, '/');
                const sl_resource_t *b = find_backend(c, api->ns, slash ? slash + 1 : full);
                if (!b)
                    continue;
                json_t *spec = jget(b->obj, "spec");
                const char *proto = jstr(spec, "protocol", "http1");
                const char *host = jstr(spec, "hostRewrite", "");
                if (!first) {
                    first = full, first_proto = proto, first_host = host;
                } else if (strcmp(proto, first_proto) != 0 || strcmp(host, first_host) != 0) {
                    char msg[700];
                    snprintf(msg, sizeof(msg),
                             "a rule reads the body, so the backend is chosen after the upstream "
                             "request head is written: Backends %s and %s differ in protocol or "
                             "hostRewrite",
                             first, full);
                    cerr(c, api, field, "%s%s", msg, "");
                    return;
                }
            }
        }
    }
}

/* The block's strategy is success-rate, or one of its outputs says so. */
static bool routing_uses_success_rate(json_t *routing)
{
    if (strcmp(jstr(routing, "strategy", "weighted"), "success-rate") == 0)
        return true;
    if (strcmp(jstr(jget(routing, "default"), "strategy", "weighted"), "success-rate") == 0)
        return true;
    json_t *rules = jget(routing, "rules");
    for (size_t i = 0; i < json_array_size(rules); i++)
        if (strcmp(jstr(json_array_get(rules, i), "strategy", "weighted"), "success-rate") == 0)
            return true;
    return false;
}

/*
 * Success-rate routing (docs/routing.md "Success-rate routing"): the
 * operation's `routing` block, else the Api's, when its strategy (or an
 * output's) is success-rate; NULL otherwise (weighted pick by backendRefs,
 * outputs as written). The scope
 * names the windows: an operation with its own block has windows of its
 * own, the other operations of the Api share the Api's.
 */
static Sluice__V1__SuccessRate *compile_success_rate(cctx_t *c, const char *table_name,
                                                     const char *op_name, json_t *api_routing,
                                                     json_t *op_routing)
{
    json_t *routing = op_routing ? op_routing : api_routing;
    if (!routing || !routing_uses_success_rate(routing))
        return NULL;
    json_t *s = jget(routing, "successRate");
    Sluice__V1__SuccessRate *sr = cnew(c, sizeof(*sr));
    if (!sr)
        return NULL;
    sluice__v1__success_rate__init(sr);
    sr->scope = op_routing ? cprintf(c, "%s %s", table_name, op_name) : cstr(c, table_name);
    sr->window = (uint32_t)jint(s, "window", DEF_SR_WINDOW);
    json_t *v = jget(s, "explorePercent");
    sr->explore_ppm = v ? (uint32_t)(json_number_value(v) * 10000.0 + 0.5) : DEF_SR_EXPLORE_PPM;
    v = jget(s, "eliminationThreshold");
    sr->elimination_ppm =
        v ? (uint32_t)(json_number_value(v) * 1000000.0 + 0.5) : DEF_SR_ELIMINATION_PPM;
    sr->max_keys = (uint32_t)jint(s, "maxKeys", DEF_SR_MAX_KEYS);
    v = jget(s, "tolerance");
    sr->tolerance_ppm =
        v ? (uint32_t)(json_number_value(v) * 1000000.0 + 0.5) : DEF_SR_TOLERANCE_PPM;
    sr->recovery_probes = (uint32_t)jint(s, "recoveryProbes", DEF_SR_RECOVERY_PROBES);
    sr->max_outcome_age_ms = jdur(s, "maxOutcomeAge", 0);
    json_t *keys = jget(s, "keys");
    size_t nk = json_array_size(keys);
    sr->keys = (Sluice__V1__SuccessRate__Key **)carray(c, nk, sizeof(*sr->keys));
    for (size_t i = 0; sr->keys && i < nk; i++) {
        json_t *k = json_array_get(keys, i);
        Sluice__V1__SuccessRate__Key *key = cnew(c, sizeof(*key));
        if (!key)
            break;
        sluice__v1__success_rate__key__init(key);
        sr->keys[sr->n_keys++] = key;
        if (jget(k, "header")) {
            key->source = SLUICE__V1__SUCCESS_RATE__KEY__SOURCE__HEADER;
            key->name = cstr(c, jstr(k, "header", ""));
            if (key->name != protobuf_c_empty_string)
                for (char *p = key->name; *p; p++)
                    *p = (char)tolower((unsigned char)*p);
        } else {
            key->source = SLUICE__V1__SUCCESS_RATE__KEY__SOURCE__QUERY;
            key->name = cstr(c, jstr(k, "query", ""));
        }
    }
    json_t *f = jget(s, "failure");
    json_t *on = jget(f, "on");
    if (on) {
        for (size_t i = 0; i < json_array_size(on); i++) {
            const char *kind = json_string_value(json_array_get(on, i));
            if (strcmp(kind, "connect-failure") == 0)
                sr->fail_connect = 1;
            else if (strcmp(kind, "reset") == 0)
                sr->fail_reset = 1;
            else if (strcmp(kind, "timeout") == 0)
                sr->fail_timeout = 1;
            else if (strcmp(kind, "5xx") == 0)
                sr->fail_5xx = 1;
        }
    } else {
        sr->fail_connect = sr->fail_reset = sr->fail_timeout = sr->fail_5xx = 1;
    }
    json_t *st = jget(f, "statuses");
    size_t ns = json_array_size(st);
    if (ns) {
        sr->fail_statuses = calloc(ns, sizeof(*sr->fail_statuses));
        if (!sr->fail_statuses)
            c->oom = true;
        for (size_t i = 0; sr->fail_statuses && i < ns; i++)
            sr->fail_statuses[sr->n_fail_statuses++] =
                (uint32_t)json_integer_value(json_array_get(st, i));
    }
    if (strcmp(jstr(s, "sharing", "local"), "redis") == 0)
        sr->redis_address = cstr(c, jstr(jget(s, "redis"), "address", ""));
    json_t *h = jget(f, "header");
    if (h) {
        sr->fail_header = cstr(c, jstr(h, "name", ""));
        if (sr->fail_header != protobuf_c_empty_string)
            for (char *p = sr->fail_header; *p; p++)
                *p = (char)tolower((unsigned char)*p);
        sr->fail_header_value = cstr(c, jstr(h, "value", ""));
    }
    return sr;
}

static bool routing_has_rules(json_t *block)
{
    return block && (jget(block, "rules") || jget(block, "default"));
}

static void compile_route(cctx_t *c, Sluice__V1__Route *rt, const sl_resource_t *api, json_t *op,
                          size_t index, const Sluice__V1__RouteTable *table)
{
    const char *path = jstr(op, "path", "/");
    json_t *method = jget(op, "method");
    json_t *methods = jget(op, "methods");
    size_t nm = methods ? json_array_size(methods) : method ? 1 : 0;
    if (nm == 1 &&
        strcmp(methods ? json_string_value(json_array_get(methods, 0)) : json_string_value(method),
               "*") == 0)
        nm = 0; /* "*": any method, an empty list in the snapshot */
    rt->methods = (char **)carray(c, nm, sizeof(*rt->methods));
    for (size_t i = 0; rt->methods && i < nm; i++)
        rt->methods[rt->n_methods++] = upper_dup(
            c, methods ? json_string_value(json_array_get(methods, i)) : json_string_value(method));

    if (jget(op, "name")) {
        rt->name = cstr(c, jstr(op, "name", ""));
    } else {
        /* "<METHOD> <path>", methods joined by ',' and "*" for any. */
        size_t len = strlen(path) + 2;
        for (size_t i = 0; i < rt->n_methods; i++)
            len += strlen(rt->methods[i]) + 1;
        char *name = malloc(len + 2);
        if (!name) {
            c->oom = true;
        } else {
            name[0] = '\0';
            for (size_t i = 0; i < rt->n_methods; i++) {
                if (i)
                    strcat(name, ",");
                strcat(name, rt->methods[i]);
            }
            if (rt->n_methods == 0)
                strcat(name, "*");
            strcat(name, " ");
            strcat(name, path);
            rt->name = name;
        }
    }

    json_t *pt = jget(op, "pathType");
    const char *type = pt ? json_string_value(pt) : (strchr(path, '{') ? "template" : "exact");
    if (strcmp(type, "template") == 0)
        rt->path_kind = SLUICE__V1__ROUTE__PATH_KIND__TEMPLATE;
    else if (strcmp(type, "prefix") == 0)
        rt->path_kind = SLUICE__V1__ROUTE__PATH_KIND__PREFIX;
    else if (strcmp(type, "regex") == 0)
        rt->path_kind = SLUICE__V1__ROUTE__PATH_KIND__REGEX;
    else
        rt->path_kind = SLUICE__V1__ROUTE__PATH_KIND__EXACT;
    rt->path = cstr(c, path);
    rt->headers = compile_matches(c, jget(op, "headers"), &rt->n_headers);
    rt->query = compile_matches(c, jget(op, "query"), &rt->n_query);

    json_t *refs = jget(op, "backendRefs");
    if (refs) {
        char prefix[64];
        snprintf(prefix, sizeof(prefix), "spec.operations[%zu].", index);
        compile_backend_refs(c, api, refs, prefix, &rt->backends, &rt->n_backends);
    }

    json_t *to = jget(op, "timeouts");
    rt->timeouts = cnew(c, sizeof(*rt->timeouts));
    if (rt->timeouts && table->timeouts) {
        *rt->timeouts = *table->timeouts;
        rt->timeouts->request_ms = jdur(to, "request", table->timeouts->request_ms);
        rt->timeouts->upstream_connect_ms =
            jdur(to, "upstreamConnect", table->timeouts->upstream_connect_ms);
        rt->timeouts->upstream_response_ms =
            jdur(to, "upstreamResponse", table->timeouts->upstream_response_ms);
    }
    rt->retry = compile_retry(c, table->retry, jget(op, "retries"));
    rt->max_request_body_bytes = jint(op, "maxRequestBodyBytes", table->max_request_body_bytes);
    json_t *spec = jget(api->obj, "spec");
    compile_upgrades(c, rt, jget(spec, "upgrades"), jget(op, "upgrades"));
    rt->tunnel_idle_ms =
        jdur(to, "tunnelIdle", jdur(jget(spec, "timeouts"), "tunnelIdle", DEF_TUNNEL_IDLE_MS));
    compile_policies(c, rt, jget(spec, "policies"), jget(op, "policies"));
    json_t *faults = jget(op, "faults") ? jget(op, "faults") : jget(spec, "faults");
    if (faults && (rt->faults = cnew(c, sizeof(*rt->faults)))) {
        sluice__v1__faults__init(rt->faults);
        json_t *d = jget(faults, "delay"), *a = jget(faults, "abort");
        rt->faults->delay_ms = (uint32_t)jint(d, "ms", 0);
        rt->faults->delay_ppm = d ? (uint32_t)(json_number_value(jget(d, "percent")) * 10000 + 0.5) : 0;
        rt->faults->abort_status = (uint32_t)jint(a, "status", 0);
        rt->faults->abort_ppm = a ? (uint32_t)(json_number_value(jget(a, "percent")) * 10000 + 0.5) : 0;
        rt->faults->header = lower_dup(c, jstr(faults, "header", ""));
    }
    json_t *mirror = jget(op, "mirror") ? jget(op, "mirror") : jget(spec, "mirror");
    if (mirror) {
        const char *name = jstr(mirror, "backend", "");
        char field[96], full[600];
        snprintf(field, sizeof(field), "%s", jget(op, "mirror") ? "" : "spec.mirror.backend");
        if (jget(op, "mirror"))
            snprintf(field, sizeof(field), "spec.operations[%zu].mirror.backend", index);
        if (!find_backend(c, api->ns, name)) {
            snprintf(full, sizeof(full), "%s/%s", api->ns, name);
            if (jget(op, "mirror") || index == 0)
                cerr(c, api, field, "Backend \"%s\" not found%s", full, "");
            else
                c->failed = true;
        } else if ((rt->mirror = cnew(c, sizeof(*rt->mirror)))) {
            sluice__v1__mirror__init(rt->mirror);
            rt->mirror->cluster = cprintf(c, "%s/%s", api->ns, name);
            rt->mirror->ppm = (uint32_t)(json_number_value(jget(mirror, "percent")) * 10000 + 0.5);
        }
    }
    /* The operation's routing block replaces the Api's whole. Rules are
     * compiled when the block has rules or a default; a block with only a
     * strategy (success-rate, below) picks among backendRefs itself. */
    if (jget(op, "routing") && !routing_has_rules(jget(op, "routing"))) {
        /* nothing: the operation's block has no rules, the Api's are replaced */
    } else if (jget(op, "routing")) {
        char prefix[64];
        snprintf(prefix, sizeof(prefix), "spec.operations[%zu].", index);
        rt->routing = compile_routing(c, api, jget(op, "routing"), prefix, 0);
        snprintf(prefix, sizeof(prefix), "spec.operations[%zu].routing", index);
        if (rt->routing)
            routing_body_check(c, api, rt->routing, rt, table, prefix);
    } else if (routing_has_rules(jget(spec, "routing"))) {
        rt->routing = compile_routing(c, api, jget(spec, "routing"), "spec.", index > 0);
        if (rt->routing && index == 0)
            routing_body_check(c, api, rt->routing, rt, table, "spec.routing");
    }
    rt->success_rate =
        compile_success_rate(c, table->name, rt->name, jget(spec, "routing"), jget(op, "routing"));
    const char *action = jstr(op, "action", "proxy");
    rt->action = strcmp(action, "decide") == 0     ? SLUICE__V1__ROUTE__ACTION__DECIDE
                 : strcmp(action, "feedback") == 0 ? SLUICE__V1__ROUTE__ACTION__FEEDBACK
                                                   : SLUICE__V1__ROUTE__ACTION__PROXY;
}

static void compile_table(cctx_t *c, Sluice__V1__RouteTable *t, const sl_resource_t *api,
                          const gw_defaults_t *d)
{
    json_t *spec = jget(api->obj, "spec");
    t->name = cprintf(c, "%s/%s", api->ns, api->name);

    json_t *hosts = jget(spec, "hosts");
    size_t nh = hosts ? json_array_size(hosts) : 1;
    t->hosts = (char **)carray(c, nh, sizeof(*t->hosts));
    for (size_t i = 0; t->hosts && i < nh; i++)
        t->hosts[t->n_hosts++] = cstr(c, hosts ? json_string_value(json_array_get(hosts, i)) : "*");
    t->base_path = cstr(c, jstr(spec, "basePath", "/"));
    t->strip_base_path = jbool(spec, "stripBasePath", true);
    t->version = cstr(c, jstr(spec, "version", ""));
    if (jget(spec, "backendRefs"))
        compile_backend_refs(c, api, jget(spec, "backendRefs"), "spec.", &t->backends,
                             &t->n_backends);

    json_t *to = jget(spec, "timeouts");
    t->timeouts = cnew(c, sizeof(*t->timeouts));
    if (t->timeouts) {
        sluice__v1__timeouts__init(t->timeouts);
        t->timeouts->request_header_ms = d->timeouts.request_header_ms;
        t->timeouts->idle_ms = d->timeouts.idle_ms;
        t->timeouts->request_ms = jdur(to, "request", d->timeouts.request_ms);
        t->timeouts->upstream_connect_ms = jdur(to, "upstreamConnect", 0);
        t->timeouts->upstream_response_ms =
            jdur(to, "upstreamResponse", d->timeouts.upstream_response_ms);
    }
    t->retry = compile_retry(c, NULL, jget(spec, "retries"));
    t->max_request_body_bytes = jint(spec, "maxRequestBodyBytes", d->limits.max_request_body_bytes);
    t->traffic_log = compile_traffic_log_override(
        c, jget(spec, "trafficLog"), c->snap->settings ? c->snap->settings->traffic_log : NULL);

    json_t *ops = jget(spec, "operations");
    size_t n = json_array_size(ops);
    t->routes = (Sluice__V1__Route **)carray(c, n, sizeof(*t->routes));
    for (size_t i = 0; t->routes && i < n; i++) {
        Sluice__V1__Route *rt = cnew(c, sizeof(*rt));
        if (!rt)
            break;
        sluice__v1__route__init(rt);
        t->routes[t->n_routes++] = rt;
        compile_route(c, rt, api, json_array_get(ops, i), i, t);
    }
}

/* --- Consumers ------------------------------------------------------------- */

static int hexval(int ch)
{
    return ch <= '9' ? ch - '0' : (ch | 0x20) - 'a' + 10;
}

static void compile_consumer(cctx_t *c, Sluice__V1__Consumer *out, const sl_resource_t *r)
{
    json_t *spec = jget(r->obj, "spec");
    json_t *creds = jget(spec, "credentials");
    out->name = cprintf(c, "%s/%s", r->ns, r->name);
    out->group = cstr(c, jstr(spec, "group", ""));
    json_t *keys = jget(creds, "apiKeys");
    out->api_keys =
        (Sluice__V1__Consumer__ApiKey **)carray(c, json_array_size(keys), sizeof(*out->api_keys));
    for (size_t i = 0; out->api_keys && i < json_array_size(keys); i++) {
        json_t *k = json_array_get(keys, i);
        Sluice__V1__Consumer__ApiKey *ak = cnew(c, sizeof(*ak));
        uint8_t *h = cnew(c, 32);
        if (!ak || !h) {
            free(ak);
            free(h);
            break;
        }
        sluice__v1__consumer__api_key__init(ak);
        out->api_keys[out->n_api_keys++] = ak;
        ak->name = cstr(c, jstr(k, "name", ""));
        const char *hex = jstr(k, "keyHash", "") + 7; /* validated: "sha256:" + 64 hex */
        for (size_t j = 0; j < 32; j++)
            h[j] = (uint8_t)(hexval(hex[2 * j]) << 4 | hexval(hex[2 * j + 1]));
        ak->sha256.data = h;
        ak->sha256.len = 32;
    }
    json_t *users = jget(creds, "basicAuth");
    out->basic_users = (Sluice__V1__Consumer__BasicUser **)carray(c, json_array_size(users),
                                                                  sizeof(*out->basic_users));
    for (size_t i = 0; out->basic_users && i < json_array_size(users); i++) {
        json_t *u = json_array_get(users, i);
        Sluice__V1__Consumer__BasicUser *bu = cnew(c, sizeof(*bu));
        if (!bu)
            break;
        sluice__v1__consumer__basic_user__init(bu);
        out->basic_users[out->n_basic_users++] = bu;
        bu->username = cstr(c, jstr(u, "username", ""));
        bu->password_hash = cstr(c, jstr(u, "passwordHash", ""));
    }
    json_t *subjects = jget(creds, "jwt");
    out->jwt = (Sluice__V1__Consumer__JwtSubject **)carray(c, json_array_size(subjects),
                                                           sizeof(*out->jwt));
    for (size_t i = 0; out->jwt && i < json_array_size(subjects); i++) {
        json_t *j = json_array_get(subjects, i);
        Sluice__V1__Consumer__JwtSubject *js = cnew(c, sizeof(*js));
        if (!js)
            break;
        sluice__v1__consumer__jwt_subject__init(js);
        out->jwt[out->n_jwt++] = js;
        js->issuer = cstr(c, jstr(j, "issuer", ""));
        js->subject = cstr(c, jstr(j, "subject", ""));
    }
}

/* --- entry points -------------------------------------------------------- */

/* The fleet-level part of a snapshot: its Gateways' settings and listeners
 * and the Certificates they name. n[] gets the number of Backends, Apis and
 * Consumers of the set. NULL (error added) when out of memory. */
static Sluice__V1__Snapshot *begin_snapshot(cctx_t *c, const sl_resource_set_t *set,
                                            const char *fleet, uint64_t version, gw_defaults_t *d,
                                            size_t n[SL_CRES__COUNT])
{
    Sluice__V1__Snapshot *snap = calloc(1, sizeof(*snap));
    gw_ref_t *gws = calloc(set->count ? set->count : 1, sizeof(*gws));
    if (!snap || !gws) {
        free(snap);
        free(gws);
        sl_errors_add(c->errs, "", 0, "", "out of memory while compiling the configuration");
        return NULL;
    }
    sluice__v1__snapshot__init(snap);
    snap->version = version;
    snap->fleet = cstr(c, fleet);

    size_t ngw = 0, ncert = 0;
    n[SL_CRES_CLUSTER] = n[SL_CRES_ROUTE] = n[SL_CRES_CONSUMER] = 0;
    for (size_t i = 0; i < set->count; i++) {
        const sl_resource_t *r = &set->items[i];
        if (r->kind == SL_KIND_GATEWAY &&
            strcmp(jstr(jget(r->obj, "spec"), "fleet", "default"), fleet) == 0)
            gws[ngw++].r = r;
        n[SL_CRES_ROUTE] += r->kind == SL_KIND_API;
        n[SL_CRES_CLUSTER] += r->kind == SL_KIND_BACKEND;
        ncert += r->kind == SL_KIND_CERTIFICATE;
        n[SL_CRES_CONSUMER] += r->kind == SL_KIND_CONSUMER;
    }
    c->snap = snap;
    snap->certificates =
        (Sluice__V1__TlsCertificate **)carray(c, ncert, sizeof(*snap->certificates));
    /* Several Gateways of one fleet: listeners merged, settings from the
     * first by name, so the result does not depend on file order. */
    qsort(gws, ngw, sizeof(*gws), cmp_gateways);
    gateway_defaults(ngw ? jget(gws[0].r->obj, "spec") : NULL, d);
    compile_settings(c, snap, d);
    if (snap->settings) {
        snap->settings->traffic_log = compile_traffic_log(c, ngw ? gws[0].r : NULL);
        snap->settings->tracing = compile_tracing(c, ngw ? gws[0].r : NULL);
    }
    compile_listeners(c, snap, gws, ngw);
    free(gws);
    return snap;
}

Sluice__V1__Snapshot *sl_compile_snapshot(const sl_resource_set_t *set, const char *fleet,
                                          uint64_t version, sl_errors_t *errs)
{
    cctx_t c = {.set = set, .errs = errs};
    if (!fleet || !fleet[0])
        fleet = "default";
    gw_defaults_t d;
    size_t counts[SL_CRES__COUNT];
    Sluice__V1__Snapshot *snap = begin_snapshot(&c, set, fleet, version, &d, counts);
    if (!snap)
        return NULL;
    size_t nbackend = counts[SL_CRES_CLUSTER], napi = counts[SL_CRES_ROUTE],
           nconsumer = counts[SL_CRES_CONSUMER];

    snap->clusters = (Sluice__V1__Cluster **)carray(&c, nbackend, sizeof(*snap->clusters));
    snap->route_tables = (Sluice__V1__RouteTable **)carray(&c, napi, sizeof(*snap->route_tables));
    snap->consumers = (Sluice__V1__Consumer **)carray(&c, nconsumer, sizeof(*snap->consumers));
    for (size_t i = 0; i < set->count && !c.oom; i++) {
        const sl_resource_t *r = &set->items[i];
        if (r->kind == SL_KIND_BACKEND && snap->clusters) {
            Sluice__V1__Cluster *cl = cnew(&c, sizeof(*cl));
            if (!cl)
                break;
            sluice__v1__cluster__init(cl);
            snap->clusters[snap->n_clusters++] = cl;
            compile_cluster(&c, cl, r, &d);
        } else if (r->kind == SL_KIND_API && snap->route_tables) {
            Sluice__V1__RouteTable *t = cnew(&c, sizeof(*t));
            if (!t)
                break;
            sluice__v1__route_table__init(t);
            snap->route_tables[snap->n_route_tables++] = t;
            compile_table(&c, t, r, &d);
        } else if (r->kind == SL_KIND_CONSUMER && snap->consumers) {
            Sluice__V1__Consumer *cs = cnew(&c, sizeof(*cs));
            if (!cs)
                break;
            sluice__v1__consumer__init(cs);
            snap->consumers[snap->n_consumers++] = cs;
            compile_consumer(&c, cs, r);
        }
    }

    if (c.oom)
        sl_errors_add(errs, "", 0, "", "out of memory while compiling the configuration");
    if (c.oom || c.failed) {
        protobuf_c_message_free_unpacked(&snap->base, NULL);
        return NULL;
    }
    size_t len = 0;
    uint8_t *wire = sl_snapshot_pack(snap, &len);
    protobuf_c_message_free_unpacked(&snap->base, NULL);
    if (!wire) {
        sl_errors_add(errs, "", 0, "", "out of memory while compiling the configuration");
        return NULL;
    }
    Sluice__V1__Snapshot *out = sl_snapshot_unpack(wire, len);
    free(wire);
    if (!out)
        sl_errors_add(errs, "", 0, "", "out of memory while compiling the configuration");
    return out;
}

void sl_snapshot_free(Sluice__V1__Snapshot *snap)
{
    if (snap)
        protobuf_c_message_free_unpacked(&snap->base, NULL);
}

uint8_t *sl_snapshot_pack(const Sluice__V1__Snapshot *snap, size_t *len)
{
    size_t n = sluice__v1__snapshot__get_packed_size(snap);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return NULL;
    *len = sluice__v1__snapshot__pack(snap, buf);
    return buf;
}

Sluice__V1__Snapshot *sl_snapshot_unpack(const uint8_t *data, size_t len)
{
    return sluice__v1__snapshot__unpack(NULL, len, data);
}

/* --- the per-resource compile cache ----------------------------------------- */

sl_cres_t *sl_cres_from_message(const char *name, const ProtobufCMessage *msg)
{
    sl_cres_t *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    size_t len = protobuf_c_message_get_packed_size(msg);
    r->name = strdup(name ? name : "");
    r->data = malloc(len ? len : 1);
    if (!r->name || !r->data) {
        free(r->name);
        free(r->data);
        free(r);
        return NULL;
    }
    r->len = protobuf_c_message_pack(msg, r->data);
    r->refs = 1;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)r->name;; p++) {
        h ^= *p;
        h *= 0x100000001b3ULL;
        if (!*p)
            break;
    }
    for (size_t i = 0; i < r->len; i++) {
        h ^= r->data[i];
        h *= 0x100000001b3ULL;
    }
    r->hash = h;
    return r;
}

sl_cres_t *sl_cres_ref(sl_cres_t *r)
{
    if (r)
        r->refs++;
    return r;
}

void sl_cres_unref(sl_cres_t *r)
{
    if (!r || --r->refs > 0)
        return;
    free(r->name);
    free(r->data);
    free(r);
}

/* One resource's last compile: the key it was compiled under and what it
 * gave (the packed resource, or the errors it added). */
typedef struct {
    uint64_t doc_hash, ctx_hash;
    cdep_t *deps;
    size_t ndeps;
    sl_cres_t *res;   /* NULL when the compile failed */
    sl_errors_t errs; /* added by the compile, in order */
    bool failed;      /* c->failed (possibly without an error of its own) */
    bool used;        /* since the last sweep */
} centry_t;

struct sl_ccache {
    json_t *map; /* "<source>#<doc>" -> integer holding the centry_t pointer */
};

static void deps_free(cdep_t *deps, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(deps[i].key);
    free(deps);
}

static void centry_free(centry_t *e)
{
    if (!e)
        return;
    deps_free(e->deps, e->ndeps);
    sl_cres_unref(e->res);
    sl_errors_free(&e->errs);
    free(e);
}

static centry_t *centry_of(json_t *v)
{
    return v ? (centry_t *)(intptr_t)json_integer_value(v) : NULL;
}

sl_ccache_t *sl_ccache_new(void)
{
    sl_ccache_t *c = calloc(1, sizeof(*c));
    if (c && !(c->map = json_object())) {
        free(c);
        return NULL;
    }
    return c;
}

void sl_ccache_free(sl_ccache_t *cache)
{
    if (!cache)
        return;
    const char *k;
    json_t *v;
    json_object_foreach(cache->map, k, v) centry_free(centry_of(v));
    json_decref(cache->map);
    free(cache);
}

void sl_ccache_sweep(sl_ccache_t *cache)
{
    const char *k;
    json_t *v;
    void *tmp;
    json_object_foreach_safe(cache->map, tmp, k, v)
    {
        centry_t *e = centry_of(v);
        if (!e->used) {
            centry_free(e);
            json_object_del(cache->map, k);
        } else {
            e->used = false;
        }
    }
}

size_t sl_ccache_size(const sl_ccache_t *cache)
{
    return json_object_size(cache->map);
}

static void errors_append(sl_errors_t *dst, const sl_errors_t *src)
{
    for (size_t i = 0; i < src->count; i++) {
        const sl_error_t *e = &src->items[i];
        sl_errors_add(dst, e->source, e->doc, e->field, "%s", e->message);
    }
}

/* Every lookup the entry's compile made finds the same thing now. */
static bool deps_hold(const cctx_t *c, const centry_t *e)
{
    for (size_t i = 0; i < e->ndeps; i++) {
        const cdep_t *d = &e->deps[i];
        const char *slash = strchr(d->key, '/');
        char ns[512];
        size_t nl = slash ? (size_t)(slash - d->key) : 0;
        if (!slash || nl >= sizeof(ns))
            return false;
        memcpy(ns, d->key, nl);
        ns[nl] = '\0';
        const sl_resource_t *r = set_find(c->set, d->kind, ns, slash + 1);
        if ((r ? sl_resource_hash(r) : 0) != d->hash)
            return false;
    }
    return true;
}

static size_t cres_kind(enum sl_kind k)
{
    return k == SL_KIND_BACKEND ? SL_CRES_CLUSTER
           : k == SL_KIND_API   ? SL_CRES_ROUTE
                                : SL_CRES_CONSUMER;
}

/* Compiles one Backend, Api or Consumer (as sl_compile_snapshot's loop
 * does), recording its lookups; returns its packed form (a new reference)
 * or NULL when it failed. Errors go to c->errs as usual. */
static sl_cres_t *compile_one(cctx_t *c, const sl_resource_t *r, const gw_defaults_t *d,
                              centry_t *e)
{
    ProtobufCMessage *msg = NULL;
    const char *name = NULL;
    c->track = true;
    c->uncacheable = false;
    c->ndeps = 0;
    if (r->kind == SL_KIND_BACKEND) {
        Sluice__V1__Cluster *cl = cnew(c, sizeof(*cl));
        if (cl) {
            sluice__v1__cluster__init(cl);
            compile_cluster(c, cl, r, d);
            msg = &cl->base;
            name = cl->name;
        }
    } else if (r->kind == SL_KIND_API) {
        Sluice__V1__RouteTable *t = cnew(c, sizeof(*t));
        if (t) {
            sluice__v1__route_table__init(t);
            compile_table(c, t, r, d);
            msg = &t->base;
            name = t->name;
        }
    } else {
        Sluice__V1__Consumer *cs = cnew(c, sizeof(*cs));
        if (cs) {
            sluice__v1__consumer__init(cs);
            compile_consumer(c, cs, r);
            msg = &cs->base;
            name = cs->name;
        }
    }
    c->track = false;
    sl_cres_t *res = NULL;
    if (msg && !c->oom && !c->failed && !(res = sl_cres_from_message(name, msg)))
        c->oom = true;
    if (msg)
        protobuf_c_message_free_unpacked(msg, NULL);
    if (e) {
        e->res = res ? sl_cres_ref(res) : NULL;
        e->deps = c->deps;
        e->ndeps = c->ndeps;
        c->deps = NULL;
        c->ndeps = c->capdeps = 0;
    }
    return res;
}

int sl_compile_cached(const sl_resource_set_t *set, const char *fleet, sl_ccache_t *cache,
                      sl_compiled_t *out, sl_errors_t *errs)
{
    memset(out, 0, sizeof(*out));
    cctx_t c = {.set = set, .errs = errs};
    if (!fleet || !fleet[0])
        fleet = "default";
    gw_defaults_t d;
    size_t counts[SL_CRES__COUNT];
    Sluice__V1__Snapshot *snap = begin_snapshot(&c, set, fleet, 0, &d, counts);
    if (!snap)
        return -1;
    /* What every table and cluster inherits from the fleet's Gateways is in
     * its settings (the defaults d, the traffic log). */
    uint64_t ctx = 0;
    if (snap->settings) {
        sl_cres_t *st = sl_cres_from_message("settings", &snap->settings->base);
        if (!st)
            c.oom = true;
        ctx = st ? st->hash : 0;
        sl_cres_unref(st);
    }
    for (int k = 0; k < SL_CRES__COUNT; k++)
        if (counts[k] && !(out->res[k] = calloc(counts[k], sizeof(*out->res[k]))))
            c.oom = true;

    for (size_t i = 0; i < set->count && !c.oom; i++) {
        const sl_resource_t *r = &set->items[i];
        if (r->kind != SL_KIND_BACKEND && r->kind != SL_KIND_API && r->kind != SL_KIND_CONSUMER)
            continue;
        char key[1100], doc[24];
        if (r->doc >= 0)
            doc[sl_fmt_u64(doc, (uint64_t)r->doc)] = '\0';
        else
            snprintf(doc, sizeof(doc), "%d", r->doc);
        join_key(key, sizeof(key), r->source, '#', doc, 0, NULL);
        uint64_t dh = sl_resource_hash(r);
        uint64_t ch = r->kind == SL_KIND_CONSUMER ? 0 : ctx;
        centry_t *e = centry_of(json_object_get(cache->map, key));
        sl_cres_t *res = NULL;
        if (e && e->doc_hash == dh && e->ctx_hash == ch && deps_hold(&c, e)) {
            e->used = true;
            errors_append(errs, &e->errs);
            if (e->failed)
                c.failed = true;
            res = sl_cres_ref(e->res);
        } else {
            out->compiled++;
            if (e)
                json_object_del(cache->map, key);
            centry_free(e);
            e = calloc(1, sizeof(*e));
            if (!e) {
                c.oom = true;
                break;
            }
            sl_errors_init(&e->errs);
            sl_errors_t *outer = c.errs;
            bool outer_failed = c.failed;
            c.errs = &e->errs;
            c.failed = false;
            res = compile_one(&c, r, &d, e);
            e->failed = c.failed;
            c.errs = outer;
            c.failed = outer_failed || e->failed;
            errors_append(errs, &e->errs);
            e->doc_hash = dh;
            e->ctx_hash = ch;
            e->used = true;
            if (c.oom || c.uncacheable ||
                json_object_set_new(cache->map, key, json_integer((json_int_t)(intptr_t)e)) != 0)
                centry_free(e);
        }
        if (res) {
            size_t k = cres_kind(r->kind);
            out->res[k][out->n[k]++] = res;
        }
    }
    deps_free(c.deps, c.ndeps);
    if (c.oom)
        sl_errors_add(errs, "", 0, "", "out of memory while compiling the configuration");
    if (c.oom || c.failed) {
        protobuf_c_message_free_unpacked(&snap->base, NULL);
        size_t compiled = out->compiled;
        sl_compiled_free(out);
        out->compiled = compiled;
        return -1;
    }
    out->snap = snap;
    return 0;
}

void sl_compiled_free(sl_compiled_t *out)
{
    if (out->snap)
        protobuf_c_message_free_unpacked(&out->snap->base, NULL);
    for (int k = 0; k < SL_CRES__COUNT; k++) {
        for (size_t i = 0; i < out->n[k]; i++)
            sl_cres_unref(out->res[k][i]);
        free(out->res[k]);
    }
    memset(out, 0, sizeof(*out));
}
