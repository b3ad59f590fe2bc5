/*
 * The Kubernetes source (ksource.h): list+watch threads, the main thread's
 * cache and resource set, the status writer.
 *
 * Ownership across threads: a watcher builds each event's JSON and hands
 * it to the main thread through the queue (mutex + a pipe watched by the
 * main loop); from then on only the main thread touches it. The status
 * writer gets copies of statuses in `pending` under its own mutex.
 */
#include "ksource.h"

#include "core.h"
#include "httpc.h"
#include "kreplicas.h"
#include "kubeconfig.h"
#include "log.h"
#include "model.h"
#include "tls_pem.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <inttypes.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define GROUP_PATH "/apis/gateway.sluice.dev/v1alpha1"
/* A Secret's watcher has this kind (one past the Sluice kinds). */
#define KIND_SECRET SL_KIND__COUNT
#define SECRET_TLS_TYPE "kubernetes.io/tls"
#define BACKOFF_MIN_MS 500
#define BACKOFF_MAX_MS 30000
#define REQUEST_TIMEOUT_MS 30000 /* a LIST, a PATCH, a watch's head */
#define WATCH_TIMEOUT_S 300      /* asked of the server, +-10% so replicas spread */
#define WATCH_IDLE_MS 130000 /* no byte for this long (bookmarks come every minute): reconnect */
#define LINE_MAX_BYTES (16u * 1024 * 1024) /* one watch event */
#define STATUS_RECHECK_MS 5000
#define PEERS_POLL_MS 10000 /* the controllers' EndpointSlices: who is live */

/* ---- pure parts (unit-tested) --------------------------------------------- */

/* The next backoff delay after `cur_ms` (0 = the first failure): doubling
 * from 0.5 s to 30 s. The wait is drawn in [delay/2, delay] so replicas and
 * kinds do not retry in step. */
static uint64_t backoff_next(uint64_t cur_ms)
{
    uint64_t d = cur_ms ? cur_ms * 2 : BACKOFF_MIN_MS;
    return d > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : d;
}

static uint64_t jitter(uint64_t d, unsigned *seed)
{
    return d / 2 + (uint64_t)rand_r(seed) % (d / 2 + 1);
}

/* A resourceVersion as a number (what the API server hands out is an etcd
 * revision, decimal); 0 when it is not one. */
static uint64_t rv_number(const char *rv)
{
    if (!rv || !*rv || strlen(rv) > 19)
        return 0;
    uint64_t v = 0;
    for (const char *p = rv; *p; p++) {
        if (*p < '0' || *p > '9')
            return 0;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    return v;
}

static const char *obj_rv(json_t *obj)
{
    return json_string_value(json_object_get(json_object_get(obj, "metadata"), "resourceVersion"));
}

enum ev_type { EV_ADDED, EV_MODIFIED, EV_DELETED, EV_BOOKMARK, EV_ERROR, EV_SYNC };

typedef struct {
    enum ev_type type;
    json_t *object; /* owned */
    int code;       /* EV_ERROR: the Status's code */
    const char *rv; /* metadata.resourceVersion of object (points into it) */
} kevent_t;

/* One line of a watch: {"type":..., "object":{...}}. 0 with *ev (free
 * ev->object), or -1 with err. */
static int parse_event(const char *line, size_t len, kevent_t *ev, char *err, size_t errlen)
{
    json_error_t je;
    json_t *j = json_loadb(line, len, 0, &je);
    memset(ev, 0, sizeof(*ev));
    if (!j) {
        snprintf(err, errlen, "a watch event is not JSON: %s", je.text);
        return -1;
    }
    const char *type = json_string_value(json_object_get(j, "type"));
    json_t *obj = json_object_get(j, "object");
    static const char *const names[] = {"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"};
    int t = -1;
    for (int i = 0; type && i < 5; i++)
        if (strcmp(type, names[i]) == 0)
            t = i;
    if (t < 0 || !json_is_object(obj)) {
        snprintf(err, errlen, "a watch event has %s", t < 0 ? "no known type" : "no object");
        json_decref(j);
        return -1;
    }
    ev->type = (enum ev_type)t;
    ev->object = json_incref(obj);
    json_decref(j); /* `type` pointed into it */
    type = names[t];
    if (ev->type == EV_ERROR) {
        ev->code = (int)json_integer_value(json_object_get(ev->object, "code"));
        return 0;
    }
    ev->rv = obj_rv(ev->object);
    if (!ev->rv || !*ev->rv) {
        snprintf(err, errlen, "a %s event's object has no metadata.resourceVersion", type);
        json_decref(ev->object);
        ev->object = NULL;
        return -1;
    }
    if (ev->type != EV_BOOKMARK &&
        !json_is_string(json_object_get(json_object_get(ev->object, "metadata"), "name"))) {
        snprintf(err, errlen, "a %s event's object has no metadata.name", type);
        json_decref(ev->object);
        ev->object = NULL;
        return -1;
    }
    return 0;
}

/* What the controller keeps of an object the API server sent: the fields
 * the model knows (the server adds managedFields, status, ...). */
static json_t *normalize(json_t *obj, enum sl_kind kind)
{
    json_t *m = json_object_get(obj, "metadata");
    json_t *out = json_object(), *meta = json_object();
    json_object_set_new(out, "apiVersion", json_string(SL_API_VERSION));
    json_object_set_new(out, "kind", json_string(sl_kind_name(kind)));
    static const char *const keep[] = {"name",        "namespace",        "labels",
                                       "annotations", "resourceVersion",  "generation",
                                       "uid",         "creationTimestamp"};
    for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++) {
        json_t *v = json_object_get(m, keep[i]);
        if (v)
            json_object_set(meta, keep[i], v);
    }
    json_t *ann = json_object_get(meta, "annotations");
    if (json_is_object(ann) &&
        json_object_get(ann, "kubectl.kubernetes.io/last-applied-configuration")) {
        /* Large and not part of the config. */
        json_t *copy = json_copy(ann);
        json_object_del(copy, "kubectl.kubernetes.io/last-applied-configuration");
        json_object_set_new(meta, "annotations", copy);
    }
    json_object_set_new(out, "metadata", meta);
    json_t *spec = json_object_get(obj, "spec");
    if (spec)
        json_object_set(out, "spec", spec);
    return out;
}

/* Same config, whatever the resourceVersion. */
static int same_content(json_t *a, json_t *b)
{
    json_t *ca = json_deep_copy(a), *cb = json_deep_copy(b);
    json_object_del(json_object_get(ca, "metadata"), "resourceVersion");
    json_object_del(json_object_get(cb, "metadata"), "resourceVersion");
    int same = json_equal(ca, cb);
    json_decref(ca);
    json_decref(cb);
    return same;
}

static void obj_key(json_t *obj, char *key, size_t len)
{
    json_t *m = json_object_get(obj, "metadata");
    snprintf(key, len, "%s/%s", json_string_value(json_object_get(m, "namespace")) ?: "default",
             json_string_value(json_object_get(m, "name")) ?: "");
}

/* The cache of one kind: "ns/name" -> {"obj": normalized, "status": the
 * server's status or null}. */
typedef struct {
    json_t *kinds[SL_KIND__COUNT];
    int synced[SL_KIND__COUNT];
    uint64_t deleted_rv; /* the newest deletion seen */
    /* The Secrets that Certificates name (secret_*): "ns/name" -> {"wid":
     * its watcher, "state": "listing" | "listed" | "unreadable", "obj":
     * the Secret's type, tls.crt, tls.key and resourceVersion (secret_slim)
     * or null when there is none, "error": why it cannot be listed}. */
    json_t *secrets;
    const char *only_ns; /* --namespace: Secrets elsewhere are not read */
} kcache_t;

static void cache_init(kcache_t *c)
{
    memset(c, 0, sizeof(*c));
    for (int k = 0; k < SL_KIND__COUNT; k++)
        c->kinds[k] = json_object();
    c->secrets = json_object();
}

static void cache_free(kcache_t *c)
{
    for (int k = 0; k < SL_KIND__COUNT; k++)
        json_decref(c->kinds[k]);
    json_decref(c->secrets);
}

/*
 * The resourceVersion of an object's last config write (its "config RV"):
 * what versions are derived from, because the statuses the controllers
 * write move resourceVersions without changing the config. Followed from
 * the events; for an object first seen in a list, the value recorded in
 * its status (status.configResourceVersion, written back with every
 * status) when that status is of the current generation, else its
 * resourceVersion (its last write was then a config write).
 */
static uint64_t listed_config_rv(json_t *obj)
{
    json_t *st = json_object_get(obj, "status");
    json_t *gen = json_object_get(json_object_get(obj, "metadata"), "generation");
    json_t *og = json_object_get(st, "observedGeneration");
    uint64_t rec = rv_number(json_string_value(json_object_get(st, "configResourceVersion")));
    uint64_t rv = rv_number(obj_rv(obj));
    if (rec && rec <= rv && json_is_integer(gen) && json_is_integer(og) &&
        json_integer_value(gen) == json_integer_value(og))
        return rec;
    return rv;
}

/* A cache entry for obj: {"obj": normalized, "status": the server's,
 * "crv": config RV}. `old` is the entry it replaces (or NULL); `listed`:
 * obj comes from a list rather than an event. */
static json_t *entry_new(json_t *obj, enum sl_kind kind, json_t *old, int listed, int *changed)
{
    json_t *st = json_object_get(obj, "status");
    json_t *norm = normalize(obj, kind);
    uint64_t crv;
    *changed = !old || !same_content(json_object_get(old, "obj"), norm);
    if (!*changed)
        crv = (uint64_t)json_integer_value(json_object_get(old, "crv"));
    else
        crv = listed ? listed_config_rv(obj) : rv_number(obj_rv(obj));
    return json_pack("{s:o, s:O, s:I}", "obj", norm, "status", st ? st : json_null(), "crv",
                     (json_int_t)crv);
}

/* Applies one event (ADDED, MODIFIED, DELETED, or SYNC with `obj` the
 * list's items): 1 when the config changed, 0 when at most statuses or
 * resourceVersions did. */
static int cache_apply(kcache_t *c, enum sl_kind kind, enum ev_type type, json_t *obj)
{
    json_t *map = c->kinds[kind];
    char key[600];
    int ch;
    if (type == EV_SYNC) {
        json_t *fresh = json_object();
        size_t i;
        json_t *item;
        int changed = !c->synced[kind];
        json_array_foreach(obj, i, item)
        {
            if (!json_is_string(json_object_get(json_object_get(item, "metadata"), "name")))
                continue;
            obj_key(item, key, sizeof(key));
            json_object_set_new(fresh, key,
                                entry_new(item, kind, json_object_get(map, key), 1, &ch));
            changed |= ch;
        }
        changed |= json_object_size(fresh) != json_object_size(map);
        json_decref(c->kinds[kind]);
        c->kinds[kind] = fresh;
        c->synced[kind] = 1;
        return changed;
    }
    obj_key(obj, key, sizeof(key));
    json_t *old = json_object_get(map, key);
    if (type == EV_DELETED) {
        uint64_t rv = rv_number(obj_rv(obj));
        if (rv > c->deleted_rv)
            c->deleted_rv = rv;
        if (!old)
            return 0;
        json_object_del(map, key);
        return 1;
    }
    json_object_set_new(map, key, entry_new(obj, kind, old, 0, &ch));
    return ch;
}

static int all_synced(const kcache_t *c)
{
    for (int k = 0; k < SL_KIND__COUNT; k++)
        if (!c->synced[k])
            return 0;
    return 1;
}

/* ---- Secrets that Certificates name ----------------------------------------
 *
 * A Certificate's spec.secretRef {name, namespace (default: the
 * Certificate's)} names a Secret of type kubernetes.io/tls, what
 * cert-manager and `kubectl create secret tls` write: data tls.crt and
 * tls.key, base64 of the PEM chain and key. The compiler gets the
 * Certificate with that PEM as if it were inline (spec.certificate and
 * spec.privateKey), checked by tls_pem.c as inline ones are; the REST API
 * keeps showing the Certificate as written (ks->view).
 *
 * How they are read: one list+watch per referenced Secret, by
 * fieldSelector=metadata.name=NAME in its namespace, rather than one
 * list+watch of every Secret (or of every kubernetes.io/tls Secret):
 *   - RBAC: get/list/watch on secrets can be granted per namespace, and
 *     even per name (the API server checks a list/watch whose
 *     fieldSelector is metadata.name=NAME against a Role's resourceNames);
 *     and the controller never receives a private key no Certificate names;
 *   - memory: only the referenced Secrets, not every TLS Secret of the
 *     cluster (a cert-manager installation holds hundreds);
 *   - a Secret of the wrong type is seen and named, where a
 *     type=kubernetes.io/tls selector would make it look missing.
 * The cost is a thread and a connection per referenced Secret, idle but
 * for the watch: fine for the tens to hundreds of Certificates of a gateway.
 *
 * Versions: a Secret has no status, so every resourceVersion it takes is a
 * write of it. Its resourceVersion takes part in the input's version as an
 * object's config resourceVersion does (every replica sees the same), and
 * a deleted Secret's as a deletion.
 *
 * The PEM is checked without the clock, as the compiler checks a stored
 * Certificate: whether a Secret is accepted must not depend on when a
 * replica happens to rebuild (an expired certificate is the runtime's to
 * refuse, with the expiry metric and the Expiring condition first).
 */

/* What is kept of a Secret: its type, tls.crt and tls.key (base64, as
 * received) and resourceVersion. */
static json_t *secret_slim(json_t *secret)
{
    json_t *data = json_object_get(secret, "data");
    const char *type = json_string_value(json_object_get(secret, "type"));
    const char *rv = obj_rv(secret);
    json_t *d = json_object();
    static const char *const keys[] = {"tls.crt", "tls.key"};
    for (size_t i = 0; i < 2; i++) {
        json_t *v = json_object_get(data, keys[i]);
        if (json_is_string(v))
            json_object_set(d, keys[i], v);
    }
    /* An empty type is Opaque (the API server's default). */
    return json_pack("{s:s, s:o, s:s}", "type", type && *type ? type : "Opaque", "data", d,
                     "resourceVersion", rv ? rv : "");
}

static const char *secret_state(json_t *e)
{
    const char *s = json_string_value(json_object_get(e, "state"));
    return s ? s : "listing";
}

/* Applies an item of a Secret's watcher (the list: EV_SYNC with the items;
 * an event; EV_ERROR: the list failed, obj is why): 1 when what the
 * compile reads changed. Items of a watcher stopped since are dropped. */
static int secret_apply(kcache_t *c, const char *key, uint64_t wid, enum ev_type type, json_t *obj)
{
    json_t *e = json_object_get(c->secrets, key);
    if (!e || (uint64_t)json_integer_value(json_object_get(e, "wid")) != wid)
        return 0;
    const char *slash = strchr(key, '/');
    const char *name = slash ? slash + 1 : key;
    json_t *now = NULL;
    if (type == EV_ERROR) {
        if (strcmp(secret_state(e), "listed") == 0)
            return 0; /* a failure later keeps what was listed, as for the kinds */
        if (strcmp(secret_state(e), "unreadable") == 0 &&
            json_equal(json_object_get(e, "error"), obj))
            return 0;
        json_object_set_new(e, "state", json_string("unreadable"));
        json_object_set(e, "error", obj);
        return 1;
    }
    if (type == EV_SYNC) {
        size_t i;
        json_t *item;
        json_array_foreach(obj, i, item)
        {
            const char *n =
                json_string_value(json_object_get(json_object_get(item, "metadata"), "name"));
            if (n && strcmp(n, name) == 0) {
                now = secret_slim(item);
                break;
            }
        }
    } else {
        const char *n =
            json_string_value(json_object_get(json_object_get(obj, "metadata"), "name"));
        if (!n || strcmp(n, name) != 0)
            return 0;
        if (type == EV_DELETED) {
            uint64_t rv = rv_number(obj_rv(obj));
            if (rv > c->deleted_rv)
                c->deleted_rv = rv;
        } else if (type == EV_ADDED || type == EV_MODIFIED) {
            now = secret_slim(obj);
        } else {
            return 0;
        }
    }
    json_t *old = json_object_get(e, "obj");
    int changed = strcmp(secret_state(e), "listed") != 0 ||
                  (now ? !json_equal(old, now) : json_is_object(old));
    json_object_set_new(e, "state", json_string("listed"));
    json_object_del(e, "error");
    json_object_set_new(e, "obj", now ? now : json_null());
    return changed;
}

/* A name the API server could hold: DNS characters, at most max. */
static int dns_name(const char *s, size_t max)
{
    size_t n = s ? strlen(s) : 0;
    if (!n || n > max)
        return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '.'))
            return 0;
    return 1;
}

/* The Secret a Certificate names, "ns/name" into key: 0, or -1 when it
 * names none that can exist (validation says why). */
static int cert_secret_key(json_t *cert, char *key, size_t keylen)
{
    json_t *ref = json_object_get(json_object_get(cert, "spec"), "secretRef");
    const char *name = json_string_value(json_object_get(ref, "name"));
    const char *ns = json_string_value(json_object_get(ref, "namespace"));
    if (!ns)
        ns = json_string_value(json_object_get(json_object_get(cert, "metadata"), "namespace"));
    if (!ns)
        ns = "default";
    if (!dns_name(name, 253) || !dns_name(ns, 63) || strchr(ns, '.'))
        return -1;
    snprintf(key, keylen, "%s/%s", ns, name);
    return 0;
}

static int key_in_namespace(const char *key, const char *ns)
{
    size_t n = strlen(ns);
    return strncmp(key, ns, n) == 0 && key[n] == '/';
}

/* The Secrets the cached Certificates name and this controller reads:
 * "ns/name" -> true. */
static json_t *secrets_wanted(kcache_t *c)
{
    json_t *out = json_object();
    const char *k;
    json_t *e;
    json_object_foreach(c->kinds[SL_KIND_CERTIFICATE], k, e)
    {
        char key[320];
        if (cert_secret_key(json_object_get(e, "obj"), key, sizeof(key)) == 0 &&
            (!c->only_ns || key_in_namespace(key, c->only_ns)))
            json_object_set_new(out, key, json_true());
    }
    return out;
}

/* Every named Secret was listed, or failed to be: until then a Secret not
 * read yet would be taken for a missing one. */
static int secrets_settled(kcache_t *c)
{
    const char *k;
    json_t *e;
    json_object_foreach(c->secrets, k, e)
    {
        if (strcmp(secret_state(e), "listing") == 0)
            return 0;
    }
    return 1;
}

/* The PEM chain and key in a Secret (slim): 0 with *chain and *key
 * (malloc'd, NUL-terminated; the caller cleanses the key), or -1 with the
 * reason and msg naming the Secret and the data key. Never quotes data. */
static int secret_pem(json_t *slim, const char *skey, char **chain, size_t *chain_len, char **key,
                      size_t *key_len, const char **reason, char *msg, size_t msglen)
{
    static const char *const names[2] = {"tls.crt", "tls.key"};
    char *out[2] = {NULL, NULL};
    size_t lens[2] = {0, 0};
    const char *type = json_string_value(json_object_get(slim, "type"));
    *reason = "InvalidSecret";
    if (!type || strcmp(type, SECRET_TLS_TYPE) != 0) {
        snprintf(msg, msglen,
                 "Secret %s has type %s: spec.secretRef needs a Secret of type " SECRET_TLS_TYPE
                 " (data tls.crt and tls.key), as cert-manager and `kubectl create secret tls` "
                 "write",
                 skey, type ? type : "(none)");
        return -1;
    }
    for (int i = 0; i < 2; i++) {
        const char *b64 =
            json_string_value(json_object_get(json_object_get(slim, "data"), names[i]));
        if (!b64 || !*b64) {
            snprintf(msg, msglen,
                     "Secret %s has %s data %s (a " SECRET_TLS_TYPE " Secret holds the PEM "
                     "certificate chain in tls.crt and the PEM private key in tls.key)",
                     skey, b64 ? "empty" : "no", names[i]);
            goto fail;
        }
        out[i] = sl_kubeconfig_b64_decode(b64, &lens[i]);
        if (!out[i]) {
            snprintf(msg, msglen, "Secret %s: data %s is not valid base64", skey, names[i]);
            goto fail;
        }
        if (strlen(out[i]) != lens[i]) {
            snprintf(msg, msglen, "Secret %s: data %s is not PEM text (it holds a NUL byte)", skey,
                     names[i]);
            goto fail;
        }
    }
    sl_pem_cert_t pc;
    sl_pem_field_t f;
    char why[512];
    if (sl_pem_load(&pc, out[0], lens[0], out[1], lens[1], 0, 0, &f, why, sizeof(why)) != 0) {
        snprintf(msg, msglen, "Secret %s: data %s: %s", skey,
                 f == SL_PEM_FIELD_PRIVATE_KEY ? names[1] : names[0], why);
        goto fail;
    }
    sl_pem_free(&pc);
    *chain = out[0];
    *chain_len = lens[0];
    *key = out[1];
    *key_len = lens[1];
    return 0;
fail:
    free(out[0]);
    if (out[1])
        OPENSSL_cleanse(out[1], lens[1]);
    free(out[1]);
    return -1;
}

/* A Certificate with spec.secretRef as the compiler takes it: a copy whose
 * spec is the Secret's PEM (certificate + privateKey). NULL with the
 * reason and msg when it cannot be (the Certificate is then left out, as an
 * invalid one is). *secret_rv: the Secret's resourceVersion (0: none). */
static json_t *cert_resolve(kcache_t *c, json_t *cert, const char **reason, char *msg,
                            size_t msglen, uint64_t *secret_rv)
{
    char skey[320];
    *secret_rv = 0;
    *reason = "InvalidSecret";
    if (cert_secret_key(cert, skey, sizeof(skey)) != 0) {
        snprintf(msg, msglen, "spec.secretRef: not the name of a Secret");
        return NULL;
    }
    if (c->only_ns && !key_in_namespace(skey, c->only_ns)) {
        *reason = "RefNotPermitted";
        snprintf(msg, msglen,
                 "spec.secretRef.namespace: Secret %s is outside namespace %s, the only one this "
                 "controller reads (--namespace): put the Secret in %s, or run the controller "
                 "for every namespace",
                 skey, c->only_ns, c->only_ns);
        return NULL;
    }
    json_t *e = json_object_get(c->secrets, skey);
    const char *state = secret_state(e);
    if (!e || strcmp(state, "listing") == 0) {
        *reason = "SecretPending";
        snprintf(msg, msglen, "Secret %s is not listed yet", skey);
        return NULL;
    }
    if (strcmp(state, "unreadable") == 0) {
        *reason = "SecretUnreadable";
        snprintf(msg, msglen, "Secret %s cannot be read: %s", skey,
                 json_string_value(json_object_get(e, "error")) ?: "?");
        return NULL;
    }
    json_t *slim = json_object_get(e, "obj");
    if (!json_is_object(slim)) {
        const char *slash = strchr(skey, '/');
        *reason = "SecretNotFound";
        snprintf(msg, msglen,
                 "Secret %s not found (spec.secretRef): create it with type " SECRET_TLS_TYPE
                 " and data tls.crt and tls.key (cert-manager writes such Secrets; by hand: "
                 "kubectl create secret tls %s -n %.*s --cert=CHAIN.pem --key=KEY.pem)",
                 skey, slash + 1, (int)(slash - skey), skey);
        return NULL;
    }
    *secret_rv = rv_number(json_string_value(json_object_get(slim, "resourceVersion")));
    char *chain, *key;
    size_t chain_len, key_len;
    if (secret_pem(slim, skey, &chain, &chain_len, &key, &key_len, reason, msg, msglen) != 0)
        return NULL;
    json_t *out = json_copy(cert); /* shallow: only spec is replaced */
    json_t *spec = json_object();
    json_object_set_new(spec, "certificate", json_stringn(chain, chain_len));
    json_object_set_new(spec, "privateKey", json_stringn(key, key_len));
    OPENSSL_cleanse(key, key_len);
    free(key);
    free(chain);
    if (out)
        json_object_set_new(out, "spec", spec);
    else
        json_decref(spec);
    return out;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static json_t *invalid_status(json_t *obj, const char *reason, const char *message)
{
    json_t *gen = json_object_get(json_object_get(obj, "metadata"), "generation");
    return json_pack("{s:[{s:s, s:s, s:s, s:s}], s:I}", "conditions", "type", "Accepted", "status",
                     "False", "reason", reason, "message", message, "observedGeneration",
                     json_is_integer(gen) ? json_integer_value(gen) : (json_int_t)1);
}

/*
 * The resource set of the cache, in (kind, namespace, name) order so that
 * every replica builds the same one: `set` to compile (a Certificate's
 * Secret resolved, cert_resolve), `view` (may be NULL) the same objects as
 * written. Invalid objects, and Certificates whose Secret cannot be used,
 * go to `invalid` ("<plural>/<ns>/<name>" -> Accepted=False status)
 * instead. Returns the input's version: the newest config RV among the
 * objects, the Secrets they name and the deletions seen.
 */
static uint64_t cache_build(kcache_t *c, sl_resource_set_t *set, sl_resource_set_t *view,
                            json_t *invalid)
{
    uint64_t version = c->deleted_rv;
    json_object_clear(invalid);
    for (int k = 0; k < SL_KIND__COUNT; k++) {
        size_t n = json_object_size(c->kinds[k]), i = 0;
        const char **keys = calloc(n ? n : 1, sizeof(*keys));
        if (!keys)
            continue;
        const char *key;
        json_t *e;
        json_object_foreach(c->kinds[k], key, e) keys[i++] = key;
        qsort(keys, n, sizeof(*keys), cmp_str);
        for (i = 0; i < n; i++) {
            json_t *entry = json_object_get(c->kinds[k], keys[i]);
            json_t *obj = json_object_get(entry, "obj");
            uint64_t rv = (uint64_t)json_integer_value(json_object_get(entry, "crv"));
            if (rv > version)
                version = rv;
            char source[700];
            snprintf(source, sizeof(source), "%s/%s", sl_kind_plural((enum sl_kind)k), keys[i]);
            sl_errors_t errs;
            sl_errors_init(&errs);
            if (sl_model_validate(obj, "", 0, &errs) != 0) {
                char msg[1024] = "";
                size_t used = 0;
                for (size_t x = 0; x < errs.count && used + 2 < sizeof(msg); x++) {
                    int w = snprintf(msg + used, sizeof(msg) - used, "%s%s%s%s", x ? "; " : "",
                                     errs.items[x].field, errs.items[x].field[0] ? ": " : "",
                                     errs.items[x].message);
                    used += w > 0 ? (size_t)w : 0;
                }
                json_object_set_new(invalid, source, invalid_status(obj, "Invalid", msg));
                sl_log_warn("%s left out: %s", source, msg);
            } else if (k == SL_KIND_CERTIFICATE &&
                       json_object_get(json_object_get(obj, "spec"), "secretRef")) {
                const char *reason;
                char msg[1024];
                uint64_t secret_rv;
                json_t *resolved = cert_resolve(c, obj, &reason, msg, sizeof(msg), &secret_rv);
                if (secret_rv > version)
                    version = secret_rv;
                if (!resolved) {
                    json_object_set_new(invalid, source, invalid_status(obj, reason, msg));
                    sl_log_warn("%s left out: %s", source, msg);
                } else {
                    sl_resource_set_add(set, resolved, source, 0);
                    if (view)
                        sl_resource_set_add(view, obj, source, 0);
                    json_decref(resolved);
                }
            } else {
                sl_resource_set_add(set, obj, source, 0);
                if (view)
                    sl_resource_set_add(view, obj, source, 0);
            }
            sl_errors_free(&errs);
        }
        free(keys);
    }
    return version;
}

/* ---- threads and the queue ---------------------------------------------- */

typedef struct qitem {
    enum sl_kind kind; /* or KIND_SECRET */
    enum ev_type type; /* a Secret's EV_ERROR: obj is why it cannot be listed */
    json_t *obj;
    uint64_t wid;   /* a Secret's: its watcher */
    char skey[320]; /* a Secret's: "ns/name" */
    struct qitem *next;
} qitem_t;

typedef struct watcher {
    struct sl_ksource *ks;
    enum sl_kind kind; /* or KIND_SECRET */
    char label[340];   /* in logs: "apis", "secret default/tls-a" */
    /* A Secret's watcher is started and stopped alone, as Certificates
     * come to name the Secret and stop naming it: its own stop flag and
     * cancel pipe (the source's stop also wakes it). */
    char sns[64], sname[254];
    uint64_t wid;
    int cancel_pipe[2];
    atomic_int stop;
    int listed; /* listed once: a later failure keeps what was listed */
    struct watcher *next;
    pthread_t thread;
    int running;
    sl_httpc_t http;
    char rv[64];
    int relist;   /* set by an ERROR 410 in the stream */
    int received; /* events of this watch */
    char *line;
    size_t len, cap;
    int line_bad;
    char failing[512]; /* the cause logged, until it recovers */
    unsigned seed;
} watcher_t;

struct sl_ksource {
    struct event_base *base;
    sl_controller_t *ctl;
    sl_kubeconfig_t kc;
    char *ns;
    char prefix[1024]; /* the server URL's path, without a trailing '/' */
    int stop_pipe[2];
    atomic_int stop;
    watcher_t w[SL_KIND__COUNT];
    watcher_t *swatchers; /* the Secrets' (main thread) */
    uint64_t next_wid;

    pthread_mutex_t qlock;
    qitem_t *qhead, **qtail;
    int qpipe[2];
    struct event *qev;

    /* Main thread. */
    kcache_t cache;
    sl_resource_set_t set;  /* compiled: Secrets' PEM in their Certificates */
    sl_resource_set_t view; /* the same objects as written, for the REST API */
    int dirty;              /* a change not rebuilt yet (a Secret still listing) */
    json_t *invalid;
    json_t *written; /* "<plural>/<ns>/<name>" -> the status last given to the writer */
    struct event *recheck_ev;
    int started_compiling;

    /* The status writer. */
    pthread_t sthread;
    int srunning;
    sl_httpc_t shttp;
    pthread_mutex_t slock;
    pthread_cond_t scond;
    json_t *pending; /* key -> {kind, ns, name, status} */
    char sfailing[768];

    /* Several replicas (kreplicas.h): this one's name (POD_NAME, else the
     * host name) and, when SLUICE_CONTROLLER_SERVICE names the controllers'
     * Service, the live replicas from its EndpointSlices (polled by the
     * status writer; `live` under slock, NULL until a first answer). */
    char replica[254];
    char peers_service[254];
    char peers_ns[64];
    json_t *live;
    char peers_failing[512];
};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int stop_asked(void *arg)
{
    return atomic_load(&((sl_ksource_t *)arg)->stop);
}

static int w_stopping(watcher_t *w)
{
    return atomic_load(&w->ks->stop) || atomic_load(&w->stop);
}

static int w_cancelled(void *arg)
{
    return w_stopping(arg);
}

/* Sleeps ms unless stopped: 1 when stopping. */
static int nap(watcher_t *w, uint64_t ms)
{
    struct pollfd p = {w->http.cancel_fd, POLLIN, 0};
    poll(&p, 1, (int)ms);
    return w_stopping(w);
}

static void enqueue(watcher_t *w, enum ev_type type, json_t *obj)
{
    sl_ksource_t *ks = w->ks;
    qitem_t *it = calloc(1, sizeof(*it));
    if (!it) {
        json_decref(obj);
        return;
    }
    it->kind = w->kind;
    it->type = type;
    it->obj = obj;
    it->wid = w->wid;
    if (w->kind == (enum sl_kind)KIND_SECRET)
        snprintf(it->skey, sizeof(it->skey), "%s/%s", w->sns, w->sname);
    pthread_mutex_lock(&ks->qlock);
    *ks->qtail = it;
    ks->qtail = &it->next;
    pthread_mutex_unlock(&ks->qlock);
    ssize_t n = write(ks->qpipe[1], "", 1);
    (void)n; /* a full pipe already holds a wake-up */
}

static void collection_path(sl_ksource_t *ks, enum sl_kind kind, char *out, size_t len)
{
    if (ks->ns)
        snprintf(out, len, "%s" GROUP_PATH "/namespaces/%s/%s", ks->prefix, ks->ns,
                 sl_kind_plural(kind));
    else
        snprintf(out, len, "%s" GROUP_PATH "/%s", ks->prefix, sl_kind_plural(kind));
}

/* Logs a failure once per cause. */
static void failing(watcher_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void failing(watcher_t *w, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (strcmp(msg, w->failing) != 0)
        sl_log_warn("kubernetes %s: %s; retrying with backoff", w->label, msg);
    snprintf(w->failing, sizeof(w->failing), "%s", msg);
}

static void recovered(watcher_t *w, const char *what)
{
    if (!w->failing[0])
        return;
    sl_log_notice("kubernetes %s: %s again", w->label, what);
    w->failing[0] = '\0';
}

static void auth_header(watcher_t *w, char *hdr, size_t len)
{
    char err[300];
    if (sl_kubeconfig_auth_header(&w->ks->kc, hdr, len, err, sizeof(err)) != 0)
        failing(w, "%s", err);
}

/* The message of a Status body, for logs. */
static void status_message(const char *body, size_t len, char *out, size_t outlen)
{
    json_t *j = json_loadb(body, len, 0, NULL);
    const char *m = json_string_value(json_object_get(j, "message"));
    snprintf(out, outlen, "%.300s", m ? m : len ? body : "");
    json_decref(j);
}

/* What a watcher lists (and watches, with watch=true added): the kind's
 * collection, or a Secret's namespace with a fieldSelector on its name. */
static void list_target(watcher_t *w, char *out, size_t len)
{
    if (w->kind == (enum sl_kind)KIND_SECRET)
        snprintf(out, len, "%s/api/v1/namespaces/%s/secrets?fieldSelector=metadata.name%%3D%s",
                 w->ks->prefix, w->sns, w->sname);
    else
        collection_path(w->ks, w->kind, out, len);
}

/* A list failure: logged once per cause; a Secret never listed yet is
 * "unreadable" for the main thread (its Certificates say why) instead of
 * holding every compile back. */
static void list_failed(watcher_t *w, const char *msg)
{
    failing(w, "%s", msg);
    if (w->kind == (enum sl_kind)KIND_SECRET && !w->listed) {
        json_t *why = json_string(msg); /* NULL when not UTF-8 */
        enqueue(w, EV_ERROR, why ? why : json_string("the list failed (see the log)"));
    }
}

/* LIST: 0 with the kind's items queued and w->rv set, or -1 (logged). */
static int do_list(watcher_t *w)
{
    char path[1400], hdr[8192], msg[1024];
    list_target(w, path, sizeof(path));
    auth_header(w, hdr, sizeof(hdr));
    strncat(hdr, "Accept: application/json\r\n", sizeof(hdr) - strlen(hdr) - 1);
    const char *body;
    size_t len;
    int st = sl_httpc_request(&w->http, "GET", path, hdr, NULL, 0, REQUEST_TIMEOUT_MS, &body, &len);
    if (st == 0) {
        snprintf(msg, sizeof(msg), "list: %s", w->http.why);
        list_failed(w, msg);
        return -1;
    }
    if (st != 200) {
        char m[400];
        status_message(body, len, m, sizeof(m));
        snprintf(msg, sizeof(msg), "list %.400s: HTTP %d: %s%s", path, st, m,
                 st == 401 ? " (the token or client certificate is not accepted)"
                 : st == 403 && w->kind == (enum sl_kind)KIND_SECRET
                     ? " (RBAC: the controller needs get, list and watch on secrets in this "
                       "namespace: helm/sluice's secrets Role)"
                 : st == 403 ? " (RBAC: the controller needs get, list and watch on this kind)"
                 : st == 404 && w->kind != (enum sl_kind)KIND_SECRET
                     ? " (are the CRDs installed? helm/sluice/crds/)"
                     : "");
        list_failed(w, msg);
        return -1;
    }
    json_error_t je;
    json_t *j = json_loadb(body, len, 0, &je);
    json_t *items = json_object_get(j, "items");
    const char *rv =
        json_string_value(json_object_get(json_object_get(j, "metadata"), "resourceVersion"));
    if (!json_is_array(items) && json_is_null(items))
        items = NULL;
    if (!j || (!json_is_array(items) && items) || !rv || !*rv) {
        snprintf(msg, sizeof(msg), "list %.400s: not a list with metadata.resourceVersion%s%s",
                 path, j ? "" : ": ", j ? "" : je.text);
        list_failed(w, msg);
        json_decref(j);
        return -1;
    }
    snprintf(w->rv, sizeof(w->rv), "%s", rv);
    w->listed = 1;
    enqueue(w, EV_SYNC, items ? json_incref(items) : json_array());
    json_decref(j);
    recovered(w, "listing");
    return 0;
}

/* One line of the watch: 0 to go on, 1 to stop reading. */
static int on_line(watcher_t *w, const char *line, size_t len)
{
    while (len && (line[len - 1] == '\r' || line[len - 1] == ' '))
        len--;
    if (!len)
        return 0;
    kevent_t ev;
    char err[300];
    if (parse_event(line, len, &ev, err, sizeof(err)) != 0) {
        failing(w, "watch: %s", err);
        w->line_bad = 1;
        return 1;
    }
    w->received++;
    recovered(w, "watching");
    switch (ev.type) {
    case EV_ERROR:
        if (ev.code == 410) {
            sl_log_info("kubernetes %s: resourceVersion %s expired, listing again", w->label,
                        w->rv);
            w->relist = 1;
        } else {
            char m[400] = "";
            const char *msg = json_string_value(json_object_get(ev.object, "message"));
            snprintf(m, sizeof(m), "%.300s", msg ? msg : "");
            failing(w, "watch: ERROR event %d: %s", ev.code, m);
            w->line_bad = 1;
        }
        json_decref(ev.object);
        return 1;
    case EV_BOOKMARK:
        snprintf(w->rv, sizeof(w->rv), "%s", ev.rv);
        sl_log_debug("kubernetes %s: bookmark, resourceVersion %s", w->label, w->rv);
        json_decref(ev.object);
        return 0;
    default:
        snprintf(w->rv, sizeof(w->rv), "%s", ev.rv);
        enqueue(w, ev.type, ev.object);
        return 0;
    }
}

/* httpc's body callback: splits the stream into lines. */
static int on_body(void *arg, const char *data, size_t len)
{
    watcher_t *w = arg;
    while (len) {
        const char *nl = memchr(data, '\n', len);
        size_t n = nl ? (size_t)(nl - data) : len;
        if (w->len + n + 1 > w->cap) {
            if (w->len + n + 1 > LINE_MAX_BYTES) {
                failing(w, "watch: an event is larger than %u bytes", LINE_MAX_BYTES);
                w->line_bad = 1;
                return 1;
            }
            size_t cap = w->cap ? w->cap : 65536;
            while (cap < w->len + n + 1)
                cap *= 2;
            char *p = realloc(w->line, cap);
            if (!p)
                return 1;
            w->line = p;
            w->cap = cap;
        }
        memcpy(w->line + w->len, data, n);
        w->len += n;
        if (!nl)
            return 0;
        int stop = on_line(w, w->line, w->len);
        w->len = 0;
        if (stop)
            return 1;
        data += n + 1;
        len -= n + 1;
    }
    return 0;
}

/* WATCH from w->rv: 0 when it ended normally or must relist, -1 on a
 * failure to back off from. */
static int do_watch(watcher_t *w)
{
    char path[1400], target[1700], hdr[8192];
    list_target(w, path, sizeof(path));
    unsigned timeout = WATCH_TIMEOUT_S - WATCH_TIMEOUT_S / 10 +
                       (unsigned)rand_r(&w->seed) % (WATCH_TIMEOUT_S / 5 + 1);
    snprintf(target, sizeof(target),
             "%s%cwatch=true&resourceVersion=%s&allowWatchBookmarks=true&timeoutSeconds=%u", path,
             strchr(path, '?') ? '&' : '?', w->rv, timeout);
    auth_header(w, hdr, sizeof(hdr));
    w->len = 0;
    w->received = 0;
    w->line_bad = 0;
    const char *body;
    size_t len;
    uint64_t started = mono_ms();
    int st = sl_httpc_stream(&w->http, "GET", target, hdr, REQUEST_TIMEOUT_MS, WATCH_IDLE_MS,
                             on_body, w, &body, &len);
    if (w->relist)
        return 0;
    if (st == 410) {
        sl_log_info("kubernetes %s: resourceVersion %s expired (410), listing again", w->label,
                    w->rv);
        w->relist = 1;
        return 0;
    }
    if (w->line_bad) {
        sl_httpc_close(&w->http);
        return -1;
    }
    if (st == 200 && !w->received && mono_ms() - started < 1000) {
        /* Ended at once with nothing: do not spin on such a server. */
        failing(w, "watch %s: the server ended the watch at once", path);
        return -1;
    }
    if (st == 200) {
        recovered(w, "watching");
        return 0;
    }
    if (st == 0) {
        if (w_stopping(w))
            return 0;
        if (strstr(w->http.why, "timed out") && w->received) {
            /* A quiet watch the server kept open with no bookmark: resume. */
            return 0;
        }
        failing(w, "watch: %s", w->http.why);
        return -1;
    }
    char m[400];
    status_message(body, len, m, sizeof(m));
    failing(w, "watch %s: HTTP %d: %s", path, st, m);
    return -1;
}

static void *watch_main(void *arg)
{
    watcher_t *w = arg;
    uint64_t backoff = 0;
    w->relist = 1;
    while (!w_stopping(w)) {
        int rc;
        if (w->relist) {
            rc = do_list(w);
            if (rc == 0)
                w->relist = 0;
        } else {
            rc = do_watch(w);
        }
        if (w_stopping(w))
            break;
        if (rc == 0) {
            if (w->received || !w->relist)
                backoff = 0;
            continue;
        }
        backoff = backoff_next(backoff);
        if (nap(w, jitter(backoff, &w->seed)))
            break;
    }
    return NULL;
}

/* ---- the main thread ------------------------------------------------------- */

static void status_sync(sl_ksource_t *ks);
static int client_init(sl_ksource_t *ks, sl_httpc_t *c, char *err, size_t errlen);

static void swatch_free(watcher_t *w)
{
    if (w->running) {
        atomic_store(&w->stop, 1);
        ssize_t n = write(w->cancel_pipe[1], "", 1);
        (void)n;
        pthread_join(w->thread, NULL);
    }
    sl_httpc_free(&w->http);
    free(w->line);
    for (int i = 0; i < 2; i++)
        if (w->cancel_pipe[i] >= 0)
            close(w->cancel_pipe[i]);
    free(w);
}

/* Starts the watcher of Secret ns/name: NULL with err. Main thread. */
static watcher_t *swatch_start(sl_ksource_t *ks, const char *ns, const char *name, char *err,
                               size_t errlen)
{
    watcher_t *w = calloc(1, sizeof(*w));
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    w->ks = ks;
    w->kind = (enum sl_kind)KIND_SECRET;
    w->wid = ++ks->next_wid;
    w->cancel_pipe[0] = w->cancel_pipe[1] = -1;
    snprintf(w->sns, sizeof(w->sns), "%s", ns);
    snprintf(w->sname, sizeof(w->sname), "%s", name);
    snprintf(w->label, sizeof(w->label), "secret %s/%s", ns, name);
    w->seed = (unsigned)(mono_ms() * 31 + w->wid);
    if (pipe2(w->cancel_pipe, O_NONBLOCK | O_CLOEXEC) != 0) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        goto fail;
    }
    if (client_init(ks, &w->http, err, errlen) != 0)
        goto fail;
    w->http.cancel_fd = w->cancel_pipe[0];
    w->http.cancelled = w_cancelled;
    w->http.cancel_arg = w;
    if (pthread_create(&w->thread, NULL, watch_main, w) != 0) {
        snprintf(err, errlen, "cannot start a thread: %s", strerror(errno));
        goto fail;
    }
    w->running = 1;
    return w;
fail:
    swatch_free(w);
    return NULL;
}

/* Watches the Secrets the Certificates name now, and only those. Main
 * thread. */
static void secrets_reconcile(sl_ksource_t *ks)
{
    json_t *wanted = secrets_wanted(&ks->cache);
    watcher_t **pp = &ks->swatchers;
    while (*pp) {
        watcher_t *w = *pp;
        char key[320];
        snprintf(key, sizeof(key), "%s/%s", w->sns, w->sname);
        if (json_object_get(wanted, key)) {
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        json_object_del(ks->cache.secrets, key);
        swatch_free(w);
        sl_log_info("kubernetes: no Certificate names Secret %s now: not watched", key);
    }
    const char *key;
    json_t *v;
    json_object_foreach(wanted, key, v)
    {
        if (json_object_get(ks->cache.secrets, key))
            continue;
        char ns[64], err[300];
        const char *slash = strchr(key, '/');
        snprintf(ns, sizeof(ns), "%.*s", (int)(slash - key), key);
        watcher_t *w = swatch_start(ks, ns, slash + 1, err, sizeof(err));
        if (w) {
            w->next = ks->swatchers;
            ks->swatchers = w;
            json_object_set_new(
                ks->cache.secrets, key,
                json_pack("{s:I, s:s, s:n}", "wid", (json_int_t)w->wid, "state", "listing", "obj"));
            sl_log_info("kubernetes: watching Secret %s (named by a Certificate)", key);
        } else {
            sl_log_error("kubernetes: Secret %s: %s", key, err);
            json_object_set_new(ks->cache.secrets, key,
                                json_pack("{s:i, s:s, s:n, s:s}", "wid", 0, "state", "unreadable",
                                          "obj", "error", err));
        }
    }
    json_decref(wanted);
}

static void rebuild(sl_ksource_t *ks)
{
    sl_resource_set_t fresh, view;
    sl_resource_set_init(&fresh);
    sl_resource_set_init(&view);
    uint64_t version = cache_build(&ks->cache, &fresh, &view, ks->invalid);
    sl_resource_set_free(&ks->set);
    ks->set = fresh;
    sl_resource_set_free(&ks->view);
    ks->view = view;
    if (!ks->started_compiling)
        sl_log_notice("kubernetes: every kind listed (%zu objects), compiling", fresh.count);
    ks->started_compiling = 1;
    sl_controller_set_input_version(ks->ctl, version);
    sl_controller_changed(ks->ctl);
}

static void on_queue(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    sl_ksource_t *ks = arg;
    char buf[256];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    pthread_mutex_lock(&ks->qlock);
    qitem_t *it = ks->qhead;
    ks->qhead = NULL;
    ks->qtail = &ks->qhead;
    pthread_mutex_unlock(&ks->qlock);
    while (it) {
        qitem_t *next = it->next;
        if (it->kind == (enum sl_kind)KIND_SECRET)
            ks->dirty |= secret_apply(&ks->cache, it->skey, it->wid, it->type, it->obj);
        else
            ks->dirty |= cache_apply(&ks->cache, it->kind, it->type, it->obj);
        json_decref(it->obj);
        free(it);
        it = next;
    }
    if (ks->cache.synced[SL_KIND_CERTIFICATE])
        secrets_reconcile(ks);
    /* A Secret just named is listed before the next rebuild (at most a
     * request's timeout): its Certificate is never taken for one whose
     * Secret is missing. */
    if (all_synced(&ks->cache) && secrets_settled(&ks->cache) &&
        (ks->dirty || !ks->started_compiling)) {
        ks->dirty = 0;
        rebuild(ks);
    } else if (ks->started_compiling) {
        status_sync(ks); /* e.g. a status another replica wrote */
    }
}

/* ---- status write-back ------------------------------------------------------ */

/* Hands every status that differs from the server's and from the last one
 * handed over to the writer. Main thread. */
static void status_sync(sl_ksource_t *ks)
{
    int queued = 0;
    for (int k = 0; k < SL_KIND__COUNT; k++) {
        const char *key;
        json_t *e;
        json_object_foreach(ks->cache.kinds[k], key, e)
        {
            json_t *obj = json_object_get(e, "obj");
            char source[700];
            snprintf(source, sizeof(source), "%s/%s", sl_kind_plural((enum sl_kind)k), key);
            json_t *meta = json_object_get(obj, "metadata");
            const char *ns = json_string_value(json_object_get(meta, "namespace")) ?: "default";
            const char *name = json_string_value(json_object_get(meta, "name")) ?: "";
            json_t *st = json_object_get(ks->invalid, source);
            st = st ? json_incref(st)
                    : sl_controller_object_status(ks->ctl, (enum sl_kind)k, ns, name);
            if (!st)
                continue;
            json_t *copy = json_copy(st); /* the core's is shared: add to a copy */
            json_decref(st);
            if (!(st = copy))
                continue;
            char crv[24];
            snprintf(crv, sizeof(crv), "%" JSON_INTEGER_FORMAT,
                     json_integer_value(json_object_get(e, "crv")));
            json_object_set_new(st, "configResourceVersion", json_string(crv));
            json_t *server = json_object_get(e, "status");
            int replicas = 0;
            if (k == SL_KIND_API || k == SL_KIND_GATEWAY) {
                pthread_mutex_lock(&ks->slock);
                json_t *live = ks->live ? json_deep_copy(ks->live) : NULL;
                pthread_mutex_unlock(&ks->slock);
                if (live) {
                    json_t *agg = sl_kreplicas_status(st, server, ks->replica, live);
                    json_decref(live);
                    json_decref(st);
                    if (!(st = agg))
                        continue;
                    replicas = 1;
                }
            }
            json_t *last = json_object_get(ks->written, source);
            if ((replicas ? sl_kreplicas_unchanged(server, st) : json_equal(st, server)) ||
                (last && json_equal(st, last))) {
                json_decref(st);
                continue;
            }
            json_object_set(ks->written, source, st);
            pthread_mutex_lock(&ks->slock);
            json_object_set_new(ks->pending, source,
                                json_pack("{s:i, s:s, s:s, s:o}", "kind", k, "ns", ns, "name", name,
                                          "status", json_deep_copy(st)));
            pthread_mutex_unlock(&ks->slock);
            json_decref(st);
            queued++;
        }
    }
    /* Forget what was written for objects that are gone. */
    const char *key;
    json_t *v;
    void *tmp;
    json_object_foreach_safe(ks->written, tmp, key, v)
    {
        const char *slash = strchr(key, '/');
        enum sl_kind kind;
        char plural[64];
        size_t pl = slash ? (size_t)(slash - key) : 0;
        if (!slash || pl >= sizeof(plural)) {
            json_object_del(ks->written, key);
            continue;
        }
        memcpy(plural, key, pl);
        plural[pl] = '\0';
        if (sl_kind_from_plural(plural, &kind) != 0 ||
            !json_object_get(ks->cache.kinds[kind], slash + 1))
            json_object_del(ks->written, key);
    }
    if (queued)
        pthread_cond_signal(&ks->scond);
}

static void on_compiled(void *arg)
{
    status_sync(arg);
}

static void recheck_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sl_ksource_t *ks = arg;
    if (ks->started_compiling)
        status_sync(ks);
}

static void swriter_failing(sl_ksource_t *ks, const char *msg)
{
    if (strcmp(msg, ks->sfailing) != 0)
        sl_log_warn("kubernetes: status write-back: %s; retrying with backoff", msg);
    snprintf(ks->sfailing, sizeof(ks->sfailing), "%s", msg);
}

/* PATCH one status: 0 done (written, or the object is gone), -1 retry. */
static int write_status(sl_ksource_t *ks, json_t *item)
{
    enum sl_kind kind = (enum sl_kind)json_integer_value(json_object_get(item, "kind"));
    const char *ns = json_string_value(json_object_get(item, "ns"));
    const char *name = json_string_value(json_object_get(item, "name"));
    char target[1600], hdr[8192], err[300], msg[768];
    snprintf(target, sizeof(target), "%s" GROUP_PATH "/namespaces/%s/%s/%s/status", ks->prefix, ns,
             sl_kind_plural(kind), name);
    if (sl_kubeconfig_auth_header(&ks->kc, hdr, sizeof(hdr), err, sizeof(err)) != 0)
        swriter_failing(ks, err);
    strncat(hdr, "Content-Type: application/merge-patch+json\r\nAccept: application/json\r\n",
            sizeof(hdr) - strlen(hdr) - 1);
    json_t *patch = json_pack("{s:O}", "status", json_object_get(item, "status"));
    char *body = json_dumps(patch, JSON_COMPACT);
    json_decref(patch);
    if (!body)
        return -1;
    const char *rbody;
    size_t rlen;
    int st = sl_httpc_request(&ks->shttp, "PATCH", target, hdr, body, strlen(body),
                              REQUEST_TIMEOUT_MS, &rbody, &rlen);
    free(body);
    if (st >= 200 && st < 300) {
        if (ks->sfailing[0])
            sl_log_notice("kubernetes: status write-back works again");
        ks->sfailing[0] = '\0';
        return 0;
    }
    if (st == 0) {
        snprintf(msg, sizeof(msg), "PATCH %.200s: %.300s", target, ks->shttp.why);
    } else {
        char m[400];
        status_message(rbody, rlen, m, sizeof(m));
        if (st == 404) {
            /* Deleted meanwhile: nothing to write. */
            sl_log_debug("kubernetes: status of %s/%s/%s not written: %s", sl_kind_plural(kind), ns,
                         name, m);
            return 0;
        }
        snprintf(msg, sizeof(msg), "PATCH %.200s: HTTP %d: %.200s%s", target, st, m,
                 st == 403 ? " (RBAC: the controller needs patch on the kind's /status)" : "");
    }
    swriter_failing(ks, msg);
    return -1;
}

/* The live controller replicas: the ready Pods behind the controllers'
 * Service. A failure keeps what was known (a replica never counts its peers
 * as gone because the API server did not answer once). */
static void poll_peers(sl_ksource_t *ks)
{
    char target[1700], hdr[8192], err[300], msg[512] = "";
    snprintf(target, sizeof(target),
             "%s/apis/discovery.k8s.io/v1/namespaces/%s/endpointslices?labelSelector="
             "kubernetes.io%%2Fservice-name%%3D%s",
             ks->prefix, ks->peers_ns, ks->peers_service);
    if (sl_kubeconfig_auth_header(&ks->kc, hdr, sizeof(hdr), err, sizeof(err)) != 0) {
        snprintf(msg, sizeof(msg), "%s", err);
    } else {
        strncat(hdr, "Accept: application/json\r\n", sizeof(hdr) - strlen(hdr) - 1);
        const char *body;
        size_t len;
        int st = sl_httpc_request(&ks->shttp, "GET", target, hdr, NULL, 0, REQUEST_TIMEOUT_MS,
                                  &body, &len);
        json_t *list = st == 200 ? json_loadb(body, len, 0, NULL) : NULL;
        if (list) {
            json_t *live = json_object();
            sl_kreplicas_from_slices(list, live);
            json_object_set_new(live, ks->replica, json_true());
            json_decref(list);
            pthread_mutex_lock(&ks->slock);
            json_decref(ks->live);
            ks->live = live;
            pthread_mutex_unlock(&ks->slock);
            if (ks->peers_failing[0])
                sl_log_notice("kubernetes: the controllers' EndpointSlices are readable again");
            ks->peers_failing[0] = '\0';
            return;
        }
        if (st == 0)
            snprintf(msg, sizeof(msg), "GET %.200s: %.200s", target, ks->shttp.why);
        else
            snprintf(msg, sizeof(msg), "GET %.200s: HTTP %d%s", target, st,
                     st == 403 ? " (RBAC: the controller needs list on endpointslices in "
                                 "discovery.k8s.io)"
                               : "");
    }
    if (strcmp(msg, ks->peers_failing) != 0)
        sl_log_warn("kubernetes: cannot tell which controller replicas are live: %s; the "
                    "Programmed counts use the last known set",
                    msg);
    snprintf(ks->peers_failing, sizeof(ks->peers_failing), "%s", msg);
}

static void *status_main(void *arg)
{
    sl_ksource_t *ks = arg;
    uint64_t backoff = 0, retry_at = 0, peers_at = 0;
    unsigned seed = (unsigned)mono_ms();
    pthread_mutex_lock(&ks->slock);
    while (!atomic_load(&ks->stop)) {
        uint64_t now = mono_ms();
        if (ks->peers_service[0] && now >= peers_at) {
            pthread_mutex_unlock(&ks->slock);
            poll_peers(ks);
            pthread_mutex_lock(&ks->slock);
            peers_at = mono_ms() + PEERS_POLL_MS;
            continue;
        }
        if (!json_object_size(ks->pending) || now < retry_at) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t wait = retry_at > now ? retry_at - now : 1000;
            ts.tv_sec += (time_t)(wait / 1000);
            ts.tv_nsec += (long)(wait % 1000) * 1000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&ks->scond, &ks->slock, &ts);
            continue;
        }
        void *iter = json_object_iter(ks->pending);
        char key[700];
        snprintf(key, sizeof(key), "%s", json_object_iter_key(iter));
        json_t *item = json_incref(json_object_iter_value(iter));
        json_object_del(ks->pending, key);
        pthread_mutex_unlock(&ks->slock);
        int rc = write_status(ks, item);
        pthread_mutex_lock(&ks->slock);
        if (rc != 0) {
            if (!json_object_get(ks->pending, key)) /* a newer status wins */
                json_object_set(ks->pending, key, item);
            backoff = backoff_next(backoff);
            retry_at = mono_ms() + jitter(backoff, &seed);
        } else {
            backoff = 0;
            retry_at = 0;
        }
        json_decref(item);
    }
    pthread_mutex_unlock(&ks->slock);
    return NULL;
}

/* ---- life cycle ------------------------------------------------------------ */

const sl_resource_set_t *sl_ksource_set(sl_ksource_t *ks)
{
    return &ks->view;
}

int sl_ksource_ready(void *arg, char *why, size_t whylen)
{
    sl_ksource_t *ks = arg;
    if (!ks->started_compiling) {
        char missing[512] = "";
        for (int k = 0; k < SL_KIND__COUNT; k++)
            if (!ks->cache.synced[k])
                snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing), "%s%s",
                         missing[0] ? ", " : "", sl_kind_plural((enum sl_kind)k));
        const char *key;
        json_t *e;
        json_object_foreach(ks->cache.secrets, key, e)
        {
            if (strcmp(secret_state(e), "listing") == 0)
                snprintf(missing + strlen(missing), sizeof(missing) - strlen(missing),
                         "%ssecret %s", missing[0] ? ", " : "", key);
        }
        snprintf(why, whylen, "kubernetes: not listed yet: %s (see the log for why)", missing);
        return 0;
    }
    return sl_controller_ready(ks->ctl, why, whylen);
}

static int client_init(sl_ksource_t *ks, sl_httpc_t *c, char *err, size_t errlen)
{
    const char *why = NULL;
    if (sl_httpc_init(c, ks->kc.server, &why) != 0) {
        snprintf(err, errlen, "%s: server %s: %s", ks->kc.source ? ks->kc.source : "kubernetes",
                 ks->kc.server, why);
        return -1;
    }
    c->ca_pem = ks->kc.ca_pem;
    c->ca_pem_name = ks->kc.ca_name ? ks->kc.ca_name : "certificate-authority";
    c->cert_pem = ks->kc.cert_pem;
    c->key_pem = ks->kc.key_pem;
    c->cert_name = ks->kc.cert_name;
    c->cancel_fd = ks->stop_pipe[0];
    c->cancelled = stop_asked;
    c->cancel_arg = ks;
    return 0;
}

sl_ksource_t *sl_ksource_start(struct event_base *base, sl_controller_t *ctl, sl_kubeconfig_t *kc,
                               const char *ns, char *err, size_t errlen)
{
    sl_ksource_t *ks = calloc(1, sizeof(*ks));
    if (!ks) {
        sl_kubeconfig_free(kc);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    ks->base = base;
    ks->ctl = ctl;
    ks->kc = *kc;
    /* The mutex moved with the struct: make it anew. */
    pthread_mutex_init(&ks->kc.lock, NULL);
    memset(kc, 0, sizeof(*kc));
    ks->ns = ns ? strdup(ns) : NULL;
    {
        const char *pod = getenv("POD_NAME"), *svc = getenv("SLUICE_CONTROLLER_SERVICE");
        const char *pns = getenv("POD_NAMESPACE");
        if (pod && *pod)
            snprintf(ks->replica, sizeof(ks->replica), "%s", pod);
        else if (gethostname(ks->replica, sizeof(ks->replica) - 1) != 0 || !ks->replica[0])
            snprintf(ks->replica, sizeof(ks->replica), "sluice-controller");
        if (svc && *svc) {
            snprintf(ks->peers_service, sizeof(ks->peers_service), "%s", svc);
            snprintf(ks->peers_ns, sizeof(ks->peers_ns), "%s",
                     pns && *pns ? pns : ks->ns ? ks->ns : "default");
        }
    }
    ks->stop_pipe[0] = ks->stop_pipe[1] = ks->qpipe[0] = ks->qpipe[1] = -1;
    pthread_mutex_init(&ks->qlock, NULL);
    pthread_mutex_init(&ks->slock, NULL);
    pthread_cond_init(&ks->scond, NULL);
    ks->qtail = &ks->qhead;
    cache_init(&ks->cache);
    ks->cache.only_ns = ks->ns;
    sl_resource_set_init(&ks->set);
    sl_resource_set_init(&ks->view);
    ks->invalid = json_object();
    ks->written = json_object();
    ks->pending = json_object();
    if (pipe2(ks->stop_pipe, O_NONBLOCK | O_CLOEXEC) != 0 ||
        pipe2(ks->qpipe, O_NONBLOCK | O_CLOEXEC) != 0) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        goto fail;
    }
    sl_httpc_t probe;
    if (client_init(ks, &probe, err, errlen) != 0)
        goto fail;
    snprintf(ks->prefix, sizeof(ks->prefix), "%s", probe.path);
    size_t pl = strlen(ks->prefix);
    while (pl && ks->prefix[pl - 1] == '/')
        ks->prefix[--pl] = '\0';
    sl_httpc_free(&probe);
    ks->qev = event_new(base, ks->qpipe[0], EV_READ | EV_PERSIST, on_queue, ks);
    ks->recheck_ev = event_new(base, -1, EV_PERSIST, recheck_cb, ks);
    if (!ks->qev || !ks->recheck_ev) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    event_add(ks->qev, NULL);
    struct timeval tv = {STATUS_RECHECK_MS / 1000, 0};
    event_add(ks->recheck_ev, &tv);
    sl_controller_use_input(ctl, &ks->set);
    sl_controller_on_compiled(ctl, on_compiled, ks);
    for (int k = 0; k < SL_KIND__COUNT; k++) {
        watcher_t *w = &ks->w[k];
        w->ks = ks;
        w->kind = (enum sl_kind)k;
        snprintf(w->label, sizeof(w->label), "%s", sl_kind_plural((enum sl_kind)k));
        w->seed = (unsigned)(mono_ms() * 31 + (uint64_t)k);
        if (client_init(ks, &w->http, err, errlen) != 0)
            goto fail;
        if (pthread_create(&w->thread, NULL, watch_main, w) != 0) {
            snprintf(err, errlen, "cannot start a thread: %s", strerror(errno));
            goto fail;
        }
        w->running = 1;
    }
    if (client_init(ks, &ks->shttp, err, errlen) != 0)
        goto fail;
    if (pthread_create(&ks->sthread, NULL, status_main, ks) != 0) {
        snprintf(err, errlen, "cannot start a thread: %s", strerror(errno));
        goto fail;
    }
    ks->srunning = 1;
    sl_log_notice("kubernetes: watching %s%s at %s (%s)", ks->ns ? "namespace " : "every namespace",
                  ks->ns ? ks->ns : "", ks->kc.server, ks->kc.source ? ks->kc.source : "");
    return ks;
fail:
    sl_ksource_stop(ks);
    return NULL;
}

void sl_ksource_stop(sl_ksource_t *ks)
{
    if (!ks)
        return;
    atomic_store(&ks->stop, 1);
    if (ks->stop_pipe[1] >= 0) {
        ssize_t w = write(ks->stop_pipe[1], "", 1);
        (void)w;
    }
    pthread_mutex_lock(&ks->slock);
    pthread_cond_broadcast(&ks->scond);
    pthread_mutex_unlock(&ks->slock);
    for (int k = 0; k < SL_KIND__COUNT; k++) {
        if (ks->w[k].running)
            pthread_join(ks->w[k].thread, NULL);
        sl_httpc_free(&ks->w[k].http);
        free(ks->w[k].line);
    }
    while (ks->swatchers) {
        watcher_t *w = ks->swatchers;
        ks->swatchers = w->next;
        swatch_free(w);
    }
    if (ks->srunning)
        pthread_join(ks->sthread, NULL);
    sl_httpc_free(&ks->shttp);
    if (ks->ctl) {
        sl_controller_on_compiled(ks->ctl, NULL, NULL);
    }
    if (ks->qev)
        event_free(ks->qev);
    if (ks->recheck_ev)
        event_free(ks->recheck_ev);
    qitem_t *it = ks->qhead;
    while (it) {
        qitem_t *next = it->next;
        json_decref(it->obj);
        free(it);
        it = next;
    }
    for (int i = 0; i < 2; i++) {
        if (ks->stop_pipe[i] >= 0)
            close(ks->stop_pipe[i]);
        if (ks->qpipe[i] >= 0)
            close(ks->qpipe[i]);
    }
    cache_free(&ks->cache);
    sl_resource_set_free(&ks->set);
    sl_resource_set_free(&ks->view);
    json_decref(ks->invalid);
    json_decref(ks->written);
    json_decref(ks->pending);
    json_decref(ks->live);
    pthread_mutex_destroy(&ks->qlock);
    pthread_mutex_destroy(&ks->slock);
    pthread_cond_destroy(&ks->scond);
    sl_kubeconfig_free(&ks->kc);
    free(ks->ns);
    free(ks);
}
