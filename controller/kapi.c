/*
 * The Kubernetes-compatible API (kapi.h) on the REST API's listener.
 *
 * Responsible for: the Kubernetes wire format of the controller's five
 * kinds: discovery and /version (what kubectl asks first), the OpenAPI v3
 * documents generated from the CRDs (crd.c: one source of truth with the
 * validation, so strict server-side field validation and `kubectl explain`
 * see what the controller checks), objects with apiVersion/kind and lists,
 * Table output with the CRDs' printer columns, label and field selectors,
 * the three PATCH flavours, dryRun=All, fieldValidation, the /status
 * subresource, meta/v1 Status errors, and handing watches to the watch hub
 * (watch.h).
 *
 * Server-side apply and every other write keep metadata.managedFields
 * (ssa.c): an apply that would change another manager's field conflicts
 * (409 with the fields, unless force=true), and a field its manager no
 * longer applies is removed, as on a cluster.
 *
 * Not responsible for: the socket, TLS, the bearer token and the bound on
 * bodies (rest.c), durability and server metadata (store.c), what status
 * the controller computes (core.c), how a stored object is shown
 * (objects.c, shared with /api/v1), the watch streams (watch.c).
 */
#include "kapi.h"

#include "crd.h"
#include "objects.h"
#include "ssa.h"
#include "validate.h"

#include "log.h"

#include <ctype.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <time.h>

/* The Kubernetes version kubectl reads from /version: its dispatcher picks
 * the kubectl build of this minor (REFERENCE.md). */
#define KAPI_MAJOR "1"
#define KAPI_MINOR "32"
#define KAPI_GIT_VERSION "v1.32.0-sluice"
#define KAPI_GV SL_CRD_GROUP "/" SL_CRD_VERSION
#define KAPI_PREFIX "/apis/" SL_CRD_GROUP "/" SL_CRD_VERSION
#define KAPI_OPENAPI_GV "/openapi/v3/apis/" SL_CRD_GROUP "/" SL_CRD_VERSION
#define KAPI_TABLE_TYPE "application/json;as=Table;v=v1;g=meta.k8s.io"
/* Path segments after KAPI_PREFIX: namespaces/{ns}/{plural}/{name}/status. */
#define KAPI_MAX_SEGMENTS 5
#define KAPI_MAX_NAME 253
/* Label selector requirements and values kept per request. */
#define KAPI_MAX_REQUIREMENTS 32
#define KAPI_MAX_VALUES 16

struct sl_kapi {
    sl_store_t *st;
    sl_controller_t *ctl;
    sl_kapi_options_t opt;
    json_t *crds[SL_KIND__COUNT]; /* crd.c's CRD of each kind */
    json_t *resource_list;        /* APIResourceList */
    char *openapi_text;           /* the GV document, compact */
    char openapi_hash[65];        /* SHA-256 of openapi_text, hex */
};

enum field_validation { FV_STRICT, FV_WARN, FV_IGNORE };

/* A label selector requirement (k8s.io/apimachinery/pkg/labels). */
enum lop { L_EQ, L_NEQ, L_IN, L_NOTIN, L_EXISTS, L_NOT_EXISTS };
typedef struct {
    char key[KAPI_MAX_NAME + 64];
    enum lop op;
    size_t nvalues;
    char values[KAPI_MAX_VALUES][64];
} lreq_t;

/* A request's filters: label and field selectors. Heap-allocated because a
 * watch keeps it as its match context. */
typedef struct {
    size_t nlabels;
    lreq_t labels[KAPI_MAX_REQUIREMENTS];
    char name[KAPI_MAX_NAME + 1], not_name[KAPI_MAX_NAME + 1];
    char ns[64], not_ns[64];
} filter_t;

typedef struct {
    sl_kapi_t *k;
    struct evhttp_request *req;
    enum evhttp_cmd_type cmd;
    struct evkeyvalq q;
    enum sl_kind kind;
    char ns[64]; /* "" = every namespace (the non-namespaced list path) */
    char name[KAPI_MAX_NAME + 1];
    bool status_sub; /* .../{name}/status */
    bool dry_run;
    enum field_validation fv;
    char manager[129]; /* fieldManager, else the User-Agent's product */
    bool force;        /* server-side apply: take conflicting fields */
} kreq_t;

/* ---- replies -------------------------------------------------------------- */

static int dump_cb(const char *buf, size_t size, void *data)
{
    return evbuffer_add(data, buf, size);
}

/* Sends doc (stolen) as JSON with this Content-Type. */
static void send_doc(struct evhttp_request *req, int code, const char *ctype, json_t *doc)
{
    struct evbuffer *body = evbuffer_new();
    if (!doc || !body || json_dump_callback(doc, dump_cb, body, JSON_COMPACT) != 0 ||
        evbuffer_add(body, "\n", 1) != 0) {
        json_decref(doc);
        if (body)
            evbuffer_free(body);
        sl_objects_send(req, 500, "application/json", NULL);
        return;
    }
    json_decref(doc);
    sl_objects_send(req, code, ctype, body);
    evbuffer_free(body);
}

static void send_json(struct evhttp_request *req, int code, json_t *doc)
{
    send_doc(req, code, "application/json", doc);
}

/* A meta/v1 Status; details (stolen) may be NULL. */
static void reply_status_v(struct evhttp_request *req, int code, const char *reason,
                           json_t *details, const char *fmt, va_list ap)
{
    char msg[2048];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    json_t *st =
        json_pack("{s:s, s:s, s:{}, s:s, s:s, s:s, s:i}", "kind", "Status", "apiVersion", "v1",
                  "metadata", "status", "Failure", "message", msg, "reason", reason, "code", code);
    if (st && details)
        json_object_set_new(st, "details", details);
    else
        json_decref(details);
    send_json(req, code, st);
}

static void reply_status(struct evhttp_request *req, int code, const char *reason, json_t *details,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void reply_status(struct evhttp_request *req, int code, const char *reason, json_t *details,
                         const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_status_v(req, code, reason, details, fmt, ap);
    va_end(ap);
}

void sl_kapi_reply_status(struct evhttp_request *req, int code, const char *reason, const char *fmt,
                          ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_status_v(req, code, reason, NULL, fmt, ap);
    va_end(ap);
}

/* details {name, group, kind} of the request's object. */
static json_t *details_of(const kreq_t *r, const char *name)
{
    return json_pack("{s:s, s:s, s:s}", "name", name ? name : r->name, "group", SL_CRD_GROUP,
                     "kind", sl_kind_plural(r->kind));
}

static void reply_not_found(kreq_t *r, const char *ns, const char *name)
{
    reply_status(r->req, 404, "NotFound", details_of(r, name),
                 "%s.%s \"%s\" not found (namespace %s)", sl_kind_plural(r->kind), SL_CRD_GROUP,
                 name, ns);
}

static void reply_405(kreq_t *r, const char *allow, const char *what)
{
    evhttp_add_header(evhttp_request_get_output_headers(r->req), "Allow", allow);
    reply_status(r->req, 405, "MethodNotAllowed", NULL, "%s accepts %s only", what, allow);
}

static void reply_read_only(kreq_t *r)
{
    reply_status(r->req, 405, "MethodNotAllowed", NULL,
                 "the controller runs from --resources files (immutable mode): change the files "
                 "and restart the controller instead of writing through the API");
}

/* A PostgreSQL store that cannot be reached: a Status 503
 * ServiceUnavailable whose cause is store_unavailable, naming the store. */
static void reply_store_unavailable(kreq_t *r, const char *msg)
{
    char why[700] = "";
    if (!msg || !msg[0]) {
        sl_store_available(r->k->st, why, sizeof(why));
        msg = why[0] ? why : "the store is unavailable";
    }
    evhttp_add_header(evhttp_request_get_output_headers(r->req), "Retry-After", "1");
    reply_status(r->req, 503, "ServiceUnavailable",
                 json_pack("{s:[{s:s, s:s}], s:i}", "causes", "reason", "store_unavailable",
                           "message", msg, "retryAfterSeconds", 1),
                 "store_unavailable: %s", msg);
}

static void reply_store_error(kreq_t *r, enum sl_store_result res, const char *name,
                              const char *msg)
{
    switch (res) {
    case SL_STORE_EXISTS:
        reply_status(r->req, 409, "AlreadyExists", details_of(r, name),
                     "%s.%s \"%s\" already exists", sl_kind_plural(r->kind), SL_CRD_GROUP, name);
        break;
    case SL_STORE_CONFLICT:
        reply_status(r->req, 409, "Conflict", details_of(r, name),
                     "Operation cannot be fulfilled on %s.%s \"%s\": %s", sl_kind_plural(r->kind),
                     SL_CRD_GROUP, name, msg);
        break;
    case SL_STORE_NOT_FOUND:
        reply_not_found(r, r->ns[0] ? r->ns : "default", name);
        break;
    case SL_STORE_UNAVAILABLE:
        reply_store_unavailable(r, msg);
        break;
    default:
        sl_log_error("kapi: %s", msg);
        reply_status(r->req, 500, "InternalError", details_of(r, name), "%s", msg);
        break;
    }
}

/* ---- rendering ------------------------------------------------------------ */

json_t *sl_kapi_render(void *ctl, enum sl_kind kind, json_t *stored)
{
    json_t *o = json_deep_copy(stored);
    if (!o)
        return NULL;
    json_object_set_new(o, "apiVersion", json_string(SL_API_VERSION));
    json_object_set_new(o, "kind", json_string(sl_kind_name(kind)));
    sl_objects_with_status(ctl, o);
    sl_objects_public_view(o);
    return o;
}

static const char *meta_str(json_t *obj, const char *key)
{
    return json_string_value(json_object_get(json_object_get(obj, "metadata"), key));
}

/* ---- selectors ------------------------------------------------------------ */

static bool label_key_ok(const char *s)
{
    if (!*s)
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("-_./", *s))
            return false;
    return true;
}

static bool label_value_ok(const char *s)
{
    if (strlen(s) > 63)
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("-_.", *s))
            return false;
    return true;
}

/* Copies s[0..n) trimmed of spaces into out; false when it does not fit. */
static bool trimmed(const char *s, size_t n, char *out, size_t outlen)
{
    while (n && *s == ' ') {
        s++;
        n--;
    }
    while (n && s[n - 1] == ' ')
        n--;
    if (n >= outlen)
        return false;
    memcpy(out, s, n);
    out[n] = '\0';
    return true;
}

/* One requirement: "k", "!k", "k=v", "k==v", "k!=v", "k in (a,b)",
 * "k notin (a,b)". 0, or -1 with err. */
static int parse_requirement(const char *s, size_t n, lreq_t *q, char *err, size_t errlen)
{
    char text[1024];
    if (!trimmed(s, n, text, sizeof(text)) || !text[0]) {
        snprintf(err, errlen, "empty or too long requirement");
        return -1;
    }
    memset(q, 0, sizeof(*q));
    char *val = NULL;
    char *p;
    if (text[0] == '!') {
        q->op = L_NOT_EXISTS;
        if (!trimmed(text + 1, strlen(text + 1), q->key, sizeof(q->key)))
            goto bad;
    } else if ((p = strstr(text, " notin ")) || (p = strstr(text, " in "))) {
        q->op = p[1] == 'n' ? L_NOTIN : L_IN;
        if (!trimmed(text, (size_t)(p - text), q->key, sizeof(q->key)))
            goto bad;
        char *open = strchr(p, '('), *close = strrchr(p, ')');
        if (!open || !close || close < open || close[1] != '\0') {
            snprintf(err, errlen, "'%s': a set needs values in parentheses, e.g. env in (a,b)",
                     text);
            return -1;
        }
        for (char *v = open + 1; v <= close;) {
            size_t len = strcspn(v, ",)");
            if (q->nvalues == KAPI_MAX_VALUES ||
                !trimmed(v, len, q->values[q->nvalues], sizeof(q->values[0])) ||
                !label_value_ok(q->values[q->nvalues])) {
                snprintf(err, errlen, "'%s': invalid value or more than %d values", text,
                         KAPI_MAX_VALUES);
                return -1;
            }
            q->nvalues++;
            v += len + 1;
        }
    } else if ((p = strstr(text, "!="))) {
        q->op = L_NEQ;
        *p = '\0';
        val = p + 2;
    } else if ((p = strstr(text, "=="))) {
        q->op = L_EQ;
        *p = '\0';
        val = p + 2;
    } else if ((p = strchr(text, '='))) {
        q->op = L_EQ;
        *p = '\0';
        val = p + 1;
    } else {
        q->op = L_EXISTS;
        if (!trimmed(text, strlen(text), q->key, sizeof(q->key)))
            goto bad;
    }
    if (val) {
        if (!trimmed(text, strlen(text), q->key, sizeof(q->key)) ||
            !trimmed(val, strlen(val), q->values[0], sizeof(q->values[0])) ||
            !label_value_ok(q->values[0]))
            goto bad;
        q->nvalues = 1;
    }
    if (!label_key_ok(q->key))
        goto bad;
    return 0;
bad:
    snprintf(err, errlen,
             "unable to parse requirement '%s': keys are [A-Za-z0-9._/-], values "
             "[A-Za-z0-9._-] of at most 63",
             text);
    return -1;
}

static int parse_label_selector(const char *s, filter_t *f, char *err, size_t errlen)
{
    while (*s) {
        /* A comma inside parentheses belongs to a set. */
        size_t n = 0;
        int depth = 0;
        while (s[n] && (s[n] != ',' || depth)) {
            depth += s[n] == '(' ? 1 : s[n] == ')' ? -1 : 0;
            n++;
        }
        if (f->nlabels == KAPI_MAX_REQUIREMENTS) {
            snprintf(err, errlen, "more than %d requirements", KAPI_MAX_REQUIREMENTS);
            return -1;
        }
        if (parse_requirement(s, n, &f->labels[f->nlabels++], err, errlen) != 0)
            return -1;
        s += n;
        if (*s == ',')
            s++;
    }
    return 0;
}

/* metadata.name and metadata.namespace with =, == and !=, as the API server
 * supports them for custom resources. */
static int parse_field_selector(const char *s, filter_t *f, char *err, size_t errlen)
{
    while (*s) {
        size_t n = strcspn(s, ",");
        char text[400], key[64], val[KAPI_MAX_NAME + 1];
        if (!trimmed(s, n, text, sizeof(text))) {
            snprintf(err, errlen, "field selector requirement too long");
            return -1;
        }
        char *p = strstr(text, "!=");
        bool neg = p != NULL;
        size_t oplen = 2;
        if (!p && !(p = strstr(text, "==")) && (p = strchr(text, '=')))
            oplen = 1;
        if (!p || !trimmed(text, (size_t)(p - text), key, sizeof(key)) ||
            !trimmed(p + oplen, strlen(p + oplen), val, sizeof(val))) {
            snprintf(err, errlen, "invalid field selector '%s': use metadata.name=NAME", text);
            return -1;
        }
        if (strcmp(key, "metadata.name") == 0)
            snprintf(neg ? f->not_name : f->name, sizeof(f->name), "%s", val);
        else if (strcmp(key, "metadata.namespace") == 0)
            snprintf(neg ? f->not_ns : f->ns, sizeof(f->ns), "%.63s", val);
        else {
            snprintf(err, errlen,
                     "field label not supported: %s (metadata.name and metadata.namespace are)",
                     key);
            return -1;
        }
        s += n;
        if (*s == ',')
            s++;
    }
    return 0;
}

static bool filter_match(void *ctx, json_t *obj)
{
    const filter_t *f = ctx;
    if (!f)
        return true;
    const char *name = meta_str(obj, "name"), *ns = meta_str(obj, "namespace");
    name = name ? name : "";
    ns = ns ? ns : "default";
    if ((f->name[0] && strcmp(f->name, name) != 0) ||
        (f->not_name[0] && !strcmp(f->not_name, name)) || (f->ns[0] && strcmp(f->ns, ns) != 0) ||
        (f->not_ns[0] && !strcmp(f->not_ns, ns)))
        return false;
    json_t *labels = json_object_get(json_object_get(obj, "metadata"), "labels");
    for (size_t i = 0; i < f->nlabels; i++) {
        const lreq_t *q = &f->labels[i];
        const char *v = json_string_value(json_object_get(labels, q->key));
        bool in = false;
        for (size_t j = 0; v && j < q->nvalues; j++)
            in = in || strcmp(v, q->values[j]) == 0;
        switch (q->op) {
        case L_EQ:
        case L_IN:
            if (!in)
                return false;
            break;
        case L_NEQ:
        case L_NOTIN:
            if (in)
                return false;
            break;
        case L_EXISTS:
            if (!v)
                return false;
            break;
        case L_NOT_EXISTS:
            if (v)
                return false;
            break;
        }
    }
    return true;
}

/* The request's selectors: a new filter (NULL when there is none), or -1
 * after replying 400. */
static int request_filter(kreq_t *r, filter_t **out)
{
    *out = NULL;
    const char *ls = evhttp_find_header(&r->q, "labelSelector");
    const char *fs = evhttp_find_header(&r->q, "fieldSelector");
    if ((!ls || !*ls) && (!fs || !*fs))
        return 0;
    filter_t *f = calloc(1, sizeof(*f));
    char err[600] = "";
    if (!f) {
        reply_status(r->req, 500, "InternalError", NULL, "out of memory");
        return -1;
    }
    if (ls && parse_label_selector(ls, f, err, sizeof(err)) != 0) {
        free(f);
        reply_status(r->req, 400, "BadRequest", NULL, "labelSelector: %s", err);
        return -1;
    }
    if (fs && parse_field_selector(fs, f, err, sizeof(err)) != 0) {
        free(f);
        reply_status(r->req, 400, "BadRequest", NULL, "fieldSelector: %s", err);
        return -1;
    }
    *out = f;
    return 0;
}

/* ---- tables --------------------------------------------------------------- */

/* "5m" or, with a second unit, "5m30s" (b 0: none). */
static void units(char *out, size_t len, int64_t a, char ua, int64_t b, char ub)
{
    if (b)
        snprintf(out, len, "%" PRId64 "%c%" PRId64 "%c", a, ua, b, ub);
    else
        snprintf(out, len, "%" PRId64 "%c", a, ua);
}

/* kubectl's duration.HumanDuration, so cells read as kubectl prints ages. */
static void human_duration(int64_t s, char *out, size_t len)
{
    if (s < -1) {
        snprintf(out, len, "<invalid>");
        return;
    }
    if (s < 0)
        s = 0;
    int64_t m = s / 60, h = s / 3600, d = h / 24, y = d / 365;
    if (s < 120)
        units(out, len, s, 's', 0, 0);
    else if (m < 10)
        units(out, len, m, 'm', s % 60, 's');
    else if (m < 180)
        units(out, len, m, 'm', 0, 0);
    else if (h < 8)
        units(out, len, h, 'h', m % 60, 'm');
    else if (h < 48)
        units(out, len, h, 'h', 0, 0);
    else if (h < 192)
        units(out, len, d, 'd', h % 24, 'h');
    else if (d < 730)
        units(out, len, d, 'd', 0, 0);
    else if (y < 8)
        units(out, len, y, 'y', d % 365, 'd');
    else
        units(out, len, y, 'y', 0, 0);
}

static int64_t age_seconds(const char *rfc3339)
{
    struct tm tm;
    memset(&tm, 0, sizeof(tm));
    if (!rfc3339 || !strptime(rfc3339, "%Y-%m-%dT%H:%M:%SZ", &tm))
        return -2;
    return (int64_t)time(NULL) - (int64_t)timegm(&tm);
}

#define JP_MAX 64

/* The JSONPath subset of the CRDs' printer columns: .a.b, [*], [N] and
 * [?(@.key=="value")]. Results (borrowed) go to out; returns their count. */
static size_t jsonpath(json_t *root, const char *path, json_t **out)
{
    json_t *cur[JP_MAX], *next[JP_MAX];
    size_t n = 1, m;
    cur[0] = root;
    const char *p = path;
    while (*p && n) {
        m = 0;
        if (*p == '.') {
            p++;
            size_t len = strcspn(p, ".[");
            char key[128];
            if (len >= sizeof(key))
                return 0;
            memcpy(key, p, len);
            key[len] = '\0';
            p += len;
            for (size_t i = 0; i < n; i++) {
                json_t *v = json_object_get(cur[i], key);
                if (v && m < JP_MAX)
                    next[m++] = v;
            }
        } else if (*p == '[') {
            const char *close = strstr(p, "]");
            if (!close)
                return 0;
            char sel[160];
            size_t len = (size_t)(close - p - 1);
            if (len >= sizeof(sel))
                return 0;
            memcpy(sel, p + 1, len);
            sel[len] = '\0';
            p = close + 1;
            char fkey[64], fval[96];
            bool filter = sscanf(sel, "?(@.%63[^=]==\"%95[^\"]\")", fkey, fval) == 2;
            for (size_t i = 0; i < n; i++) {
                if (!json_is_array(cur[i]))
                    continue;
                if (strcmp(sel, "*") == 0 || filter) {
                    size_t j;
                    json_t *it;
                    json_array_foreach(cur[i], j, it)
                    {
                        const char *fv =
                            filter ? json_string_value(json_object_get(it, fkey)) : NULL;
                        if (m < JP_MAX && (!filter || (fv && strcmp(fv, fval) == 0)))
                            next[m++] = it;
                    }
                } else if (isdigit((unsigned char)sel[0])) {
                    json_t *it = json_array_get(cur[i], strtoul(sel, NULL, 10));
                    if (it && m < JP_MAX)
                        next[m++] = it;
                }
            }
        } else {
            return 0;
        }
        memcpy(cur, next, m * sizeof(*cur));
        n = m;
    }
    memcpy(out, cur, n * sizeof(*cur));
    return n;
}

/* A cell as the API server prints a column: one value as itself, several
 * joined with ",", none as null (kubectl shows <none>). */
static json_t *cell_of(json_t *obj, json_t *col)
{
    const char *path = json_string_value(json_object_get(col, "jsonPath"));
    const char *type = json_string_value(json_object_get(col, "type"));
    json_t *res[JP_MAX];
    size_t n = path ? jsonpath(obj, path, res) : 0;
    if (n == 0)
        return json_null();
    if (type && strcmp(type, "date") == 0) {
        char age[32];
        human_duration(age_seconds(json_string_value(res[0])), age, sizeof(age));
        return json_string(age);
    }
    if (n == 1 && !json_is_array(res[0]) && !json_is_object(res[0]))
        return json_incref(res[0]);
    struct evbuffer *b = evbuffer_new();
    for (size_t i = 0; b && i < n; i++) {
        if (i)
            evbuffer_add(b, ",", 1);
        if (json_is_string(res[i]))
            evbuffer_add(b, json_string_value(res[i]), json_string_length(res[i]));
        else
            json_dump_callback(res[i], dump_cb, b, JSON_COMPACT | JSON_ENCODE_ANY);
    }
    json_t *s = b ? json_stringn((const char *)evbuffer_pullup(b, -1), evbuffer_get_length(b))
                  : json_null();
    if (b)
        evbuffer_free(b);
    return s ? s : json_null();
}

static bool wants_table(kreq_t *r)
{
    const char *accept = evhttp_find_header(evhttp_request_get_input_headers(r->req), "Accept");
    return accept && strstr(accept, "as=Table") && strstr(accept, "g=meta.k8s.io") &&
           strstr(accept, "v=v1;") != NULL;
}

/* A meta.k8s.io/v1 Table of rendered objects (borrowed array). */
static json_t *table_of(kreq_t *r, json_t *items, const char *rv)
{
    json_t *cols = json_object_get(
        json_array_get(json_object_get(json_object_get(r->k->crds[r->kind], "spec"), "versions"),
                       0),
        "additionalPrinterColumns");
    json_t *defs = json_array(), *rows = json_array();
    json_array_append_new(defs, json_pack("{s:s, s:s, s:s, s:s, s:i}", "name", "Name", "type",
                                          "string", "format", "name", "description",
                                          "the object's name", "priority", 0));
    size_t i, j;
    json_t *col, *obj;
    json_array_foreach(cols, i, col)
    {
        json_t *prio = json_object_get(col, "priority");
        json_array_append_new(
            defs,
            json_pack("{s:O, s:s, s:s, s:O, s:I}", "name", json_object_get(col, "name"), "type",
                      strcmp(json_string_value(json_object_get(col, "type")), "date")
                          ? json_string_value(json_object_get(col, "type"))
                          : "string",
                      "format", "", "description", json_object_get(col, "description"), "priority",
                      prio ? json_integer_value(prio) : 0));
    }
    const char *include = evhttp_find_header(&r->q, "includeObject");
    json_array_foreach(items, j, obj)
    {
        json_t *cells = json_array();
        json_array_append_new(cells,
                              json_string(meta_str(obj, "name") ? meta_str(obj, "name") : ""));
        json_array_foreach(cols, i, col)
        {
            json_array_append_new(cells, cell_of(obj, col));
        }
        json_t *row = json_pack("{s:o}", "cells", cells);
        if (include && strcmp(include, "Object") == 0)
            json_object_set(row, "object", obj);
        else if (!include || strcmp(include, "None") != 0)
            json_object_set_new(row, "object",
                                json_pack("{s:s, s:s, s:O}", "kind", "PartialObjectMetadata",
                                          "apiVersion", "meta.k8s.io/v1", "metadata",
                                          json_object_get(obj, "metadata")));
        json_array_append_new(rows, row);
    }
    return json_pack("{s:s, s:s, s:{s:s}, s:o, s:o}", "kind", "Table", "apiVersion",
                     "meta.k8s.io/v1", "metadata", "resourceVersion", rv, "columnDefinitions", defs,
                     "rows", rows);
}

/* ---- discovery and OpenAPI ------------------------------------------------ */

static json_t *crd_names(const sl_kapi_t *k, enum sl_kind kind)
{
    return json_object_get(json_object_get(k->crds[kind], "spec"), "names");
}

static json_t *gvk(const char *kind)
{
    return json_pack("{s:s, s:s, s:s}", "group", SL_CRD_GROUP, "version", SL_CRD_VERSION, "kind",
                     kind);
}

static json_t *build_resource_list(sl_kapi_t *k)
{
    json_t *res = json_array();
    bool ro = k->opt.read_only;
    for (int i = 0; i < SL_KIND__COUNT; i++) {
        json_t *names = crd_names(k, (enum sl_kind)i);
        json_t *verbs = ro ? json_pack("[s, s]", "get", "list")
                           : json_pack("[s, s, s, s, s, s]", "create", "delete", "get", "list",
                                       "patch", "update");
        if (k->opt.watch_hub)
            json_array_append_new(verbs, json_string("watch"));
        json_array_append_new(res, json_pack("{s:O, s:O, s:b, s:O, s:o, s:O, s:O}", "name",
                                             json_object_get(names, "plural"), "singularName",
                                             json_object_get(names, "singular"), "namespaced", 1,
                                             "kind", json_object_get(names, "kind"), "verbs", verbs,
                                             "shortNames", json_object_get(names, "shortNames"),
                                             "categories", json_object_get(names, "categories")));
        char sub[80];
        snprintf(sub, sizeof(sub), "%s/status", sl_kind_plural((enum sl_kind)i));
        json_array_append_new(
            res, json_pack("{s:s, s:s, s:b, s:O, s:o}", "name", sub, "singularName", "",
                           "namespaced", 1, "kind", json_object_get(names, "kind"), "verbs",
                           ro ? json_pack("[s]", "get")
                              : json_pack("[s, s, s]", "get", "patch", "update")));
    }
    return json_pack("{s:s, s:s, s:s, s:o}", "kind", "APIResourceList", "apiVersion", "v1",
                     "groupVersion", KAPI_GV, "resources", res);
}

static json_t *query_param(const char *name, const char *desc)
{
    return json_pack("{s:s, s:s, s:s, s:{s:s, s:b}}", "name", name, "in", "query", "description",
                     desc, "schema", "type", "string", "uniqueItems", 1);
}

static json_t *path_param(const char *name)
{
    return json_pack("{s:s, s:s, s:b, s:{s:s}}", "name", name, "in", "path", "required", 1,
                     "schema", "type", "string");
}

static json_t *write_params(bool patch)
{
    json_t *p = json_pack(
        "[o, o, o]", query_param("dryRun", "All: validate and answer without persisting"),
        query_param("fieldManager", "the writer's name, recorded in metadata.managedFields"),
        query_param("fieldValidation", "Strict, Warn (default) or Ignore: what "
                                       "unknown fields do"));
    if (patch)
        json_array_append_new(
            p, query_param("force", "server-side apply: take the fields other managers own"));
    return p;
}

static void schema_ref(const char *kind, bool list, char *out, size_t len)
{
    snprintf(out, len, "#/components/schemas/dev.sluice.gateway.%s.%s%s", SL_CRD_VERSION, kind,
             list ? "List" : "");
}

/* One operation of the GV document; body_types: the request body's media
 * types, space-separated, or NULL. */
static json_t *operation(const char *id, const char *action, const char *kind, bool list,
                         json_t *params, const char *body_types)
{
    char ref[200];
    schema_ref(kind, list, ref, sizeof(ref));
    json_t *op =
        json_pack("{s:s, s:[s], s:o, s:{s:{s:s, s:{s:{s:{s:s}}}}}, s:s, s:o}", "operationId", id,
                  "tags", KAPI_GV, "parameters", params ? params : json_array(), "responses", "200",
                  "description", "OK", "content", "application/json", "schema", "$ref", ref,
                  "x-kubernetes-action", action, "x-kubernetes-group-version-kind", gvk(kind));
    if (op && body_types) {
        schema_ref(kind, false, ref, sizeof(ref));
        json_t *content = json_object();
        char types[200];
        snprintf(types, sizeof(types), "%s", body_types);
        for (char *save = NULL, *t = strtok_r(types, " ", &save); t; t = strtok_r(NULL, " ", &save))
            json_object_set_new(content, t,
                                json_pack("{s:o}", "schema",
                                          strstr(t, "patch") ? json_pack("{s:s}", "type", "object")
                                                             : json_pack("{s:s}", "$ref", ref)));
        json_object_set_new(op, "requestBody",
                            json_pack("{s:o, s:b}", "content", content, "required", 1));
    }
    return op;
}

static json_t *build_openapi(sl_kapi_t *k)
{
    json_t *paths = json_object(), *schemas = json_object();
    static const char patch_types[] =
        "application/json-patch+json application/merge-patch+json application/apply-patch+yaml";
    for (int i = 0; i < SL_KIND__COUNT; i++) {
        const char *kind = sl_kind_name((enum sl_kind)i), *plural = sl_kind_plural((enum sl_kind)i);
        json_t *schema = json_deep_copy(json_object_get(
            json_object_get(
                json_array_get(json_object_get(json_object_get(k->crds[i], "spec"), "versions"), 0),
                "schema"),
            "openAPIV3Schema"));
        json_object_set_new(schema, "x-kubernetes-group-version-kind", json_pack("[o]", gvk(kind)));
        char name[160], list_kind[64], id[160], p[300];
        snprintf(list_kind, sizeof(list_kind), "%sList", kind);
        snprintf(name, sizeof(name), "dev.sluice.gateway.%s.%s", SL_CRD_VERSION, kind);
        json_object_set_new(schemas, name, schema);
        snprintf(name, sizeof(name), "dev.sluice.gateway.%s.%s", SL_CRD_VERSION, list_kind);
        char item_ref[200];
        schema_ref(kind, false, item_ref, sizeof(item_ref));
        json_object_set_new(
            schemas, name,
            json_pack("{s:s, s:{s:{s:s}, s:{s:s, s:{s:s}}, s:{s:s}, s:{s:s}}, s:[s], s:[o]}",
                      "type", "object", "properties", "apiVersion", "type", "string", "items",
                      "type", "array", "items", "$ref", item_ref, "kind", "type", "string",
                      "metadata", "type", "object", "required", "items",
                      "x-kubernetes-group-version-kind", gvk(list_kind)));

        /* namespaced collection */
        snprintf(p, sizeof(p), "%s/namespaces/{namespace}/%s", KAPI_PREFIX, plural);
        json_t *coll = json_object();
        snprintf(id, sizeof(id), "listNamespaced%s", kind);
        json_object_set_new(
            coll, "get",
            operation(id, "list", kind, true,
                      json_pack("[o, o, o, o]", query_param("labelSelector", "label selector"),
                                query_param("fieldSelector", "field selector"),
                                query_param("watch", "watch for changes"),
                                query_param("resourceVersion", "watch from")),
                      NULL));
        snprintf(id, sizeof(id), "createNamespaced%s", kind);
        json_object_set_new(coll, "post",
                            operation(id, "post", kind, false, write_params(false),
                                      "application/json application/yaml"));
        json_object_set_new(coll, "parameters", json_pack("[o]", path_param("namespace")));
        json_object_set_new(paths, p, coll);

        /* object and status */
        for (int sub = 0; sub < 2; sub++) {
            snprintf(p, sizeof(p), "%s/namespaces/{namespace}/%s/{name}%s", KAPI_PREFIX, plural,
                     sub ? "/status" : "");
            json_t *obj = json_object();
            const char *suffix = sub ? "Status" : "";
            snprintf(id, sizeof(id), "readNamespaced%s%s", kind, suffix);
            json_object_set_new(obj, "get", operation(id, "get", kind, false, NULL, NULL));
            snprintf(id, sizeof(id), "replaceNamespaced%s%s", kind, suffix);
            json_object_set_new(obj, "put",
                                operation(id, "put", kind, false, write_params(false),
                                          "application/json application/yaml"));
            snprintf(id, sizeof(id), "patchNamespaced%s%s", kind, suffix);
            json_object_set_new(
                obj, "patch", operation(id, "patch", kind, false, write_params(true), patch_types));
            if (!sub) {
                snprintf(id, sizeof(id), "deleteNamespaced%s", kind);
                json_object_set_new(
                    obj, "delete",
                    operation(id, "delete", kind, false,
                              json_pack("[o, o]", query_param("dryRun", "All"),
                                        query_param("propagationPolicy", "accepted, no effect")),
                              NULL));
            }
            json_object_set_new(obj, "parameters",
                                json_pack("[o, o]", path_param("name"), path_param("namespace")));
            json_object_set_new(paths, p, obj);
        }

        /* every namespace */
        snprintf(p, sizeof(p), "%s/%s", KAPI_PREFIX, plural);
        snprintf(id, sizeof(id), "list%sForAllNamespaces", kind);
        json_object_set_new(
            paths, p,
            json_pack(
                "{s:o}", "get",
                operation(id, "list", kind, true,
                          json_pack("[o, o, o]", query_param("labelSelector", "label selector"),
                                    query_param("fieldSelector", "field selector"),
                                    query_param("watch", "watch for changes")),
                          NULL)));
    }
    return json_pack("{s:s, s:{s:s, s:s}, s:o, s:{s:o}}", "openapi", "3.0.0", "info", "title",
                     "Sluice controller (Kubernetes-compatible API)", "version", KAPI_GIT_VERSION,
                     "paths", paths, "components", "schemas", schemas);
}

sl_kapi_t *sl_kapi_new(sl_store_t *st, sl_controller_t *ctl, const sl_kapi_options_t *opt,
                       char *err, size_t errlen)
{
    sl_kapi_t *k = calloc(1, sizeof(*k));
    if (!k) {
        snprintf(err, errlen, "Kubernetes-compatible API: out of memory");
        return NULL;
    }
    k->st = st;
    k->ctl = ctl;
    if (opt)
        k->opt = *opt;
    json_t *crds = sl_crd_all(err, errlen);
    if (!crds)
        goto fail;
    size_t i;
    json_t *crd;
    json_array_foreach(crds, i, crd)
    {
        enum sl_kind kind;
        const char *kn = json_string_value(
            json_object_get(json_object_get(json_object_get(crd, "spec"), "names"), "kind"));
        if (kn && sl_kind_from_name(kn, &kind) == 0)
            k->crds[kind] = json_incref(crd);
    }
    json_decref(crds);
    for (int j = 0; j < SL_KIND__COUNT; j++)
        if (!k->crds[j]) {
            snprintf(err, errlen, "Kubernetes-compatible API: no CRD for kind %s",
                     sl_kind_name((enum sl_kind)j));
            goto fail;
        }
    k->resource_list = build_resource_list(k);
    json_t *doc = build_openapi(k);
    k->openapi_text = doc ? json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(doc);
    if (!k->resource_list || !k->openapi_text) {
        snprintf(err, errlen,
                 "Kubernetes-compatible API: cannot build the discovery documents "
                 "(out of memory?)");
        goto fail;
    }
    unsigned char md[32];
    unsigned int mdlen = 0;
    if (!EVP_Digest(k->openapi_text, strlen(k->openapi_text), md, &mdlen, EVP_sha256(), NULL) ||
        mdlen != 32) {
        snprintf(err, errlen, "Kubernetes-compatible API: SHA-256 failed");
        goto fail;
    }
    for (unsigned j = 0; j < 32; j++)
        snprintf(k->openapi_hash + 2 * j, 3, "%02X", md[j]);
    return k;
fail:
    sl_kapi_free(k);
    return NULL;
}

void sl_kapi_free(sl_kapi_t *k)
{
    if (!k)
        return;
    for (int i = 0; i < SL_KIND__COUNT; i++)
        json_decref(k->crds[i]);
    json_decref(k->resource_list);
    free(k->openapi_text);
    free(k);
}

bool sl_kapi_owns(const char *path)
{
    return strcmp(path, "/version") == 0 || strcmp(path, "/api") == 0 ||
           strcmp(path, "/apis") == 0 || strncmp(path, "/apis/", 6) == 0 ||
           strcmp(path, "/openapi") == 0 || strncmp(path, "/openapi/", 9) == 0;
}

static void serve_openapi(kreq_t *r, const char *path)
{
    if (strcmp(path, "/openapi/v3") == 0 || strcmp(path, "/openapi/v3/") == 0) {
        char url[200];
        snprintf(url, sizeof(url), "%s?hash=%s", KAPI_OPENAPI_GV, r->k->openapi_hash);
        send_json(r->req, 200,
                  json_pack("{s:{s:{s:s}}}", "paths", "apis/" KAPI_GV, "serverRelativeURL", url));
        return;
    }
    if (strcmp(path, KAPI_OPENAPI_GV) != 0) {
        reply_status(r->req, 404, "NotFound", NULL,
                     "the server could not find the requested resource (this controller serves "
                     "/openapi/v3 and %s)",
                     KAPI_OPENAPI_GV);
        return;
    }
    struct evkeyvalq *out = evhttp_request_get_output_headers(r->req);
    const char *hash = evhttp_find_header(&r->q, "hash");
    char etag[80];
    snprintf(etag, sizeof(etag), "\"%s\"", r->k->openapi_hash);
    if (hash && strcmp(hash, r->k->openapi_hash) != 0) {
        /* An old hash: the document changed; send the client to the new one. */
        char url[200];
        snprintf(url, sizeof(url), "%s?hash=%s", KAPI_OPENAPI_GV, r->k->openapi_hash);
        evhttp_add_header(out, "Location", url);
        reply_status(r->req, 301, "MovedPermanently", NULL, "the document is now at %s", url);
        return;
    }
    evhttp_add_header(out, "ETag", etag);
    evhttp_add_header(out, "Cache-Control",
                      hash ? "public, immutable, max-age=31536000" : "no-cache, private");
    struct evbuffer *b = evbuffer_new();
    if (!b) {
        reply_status(r->req, 500, "InternalError", NULL, "out of memory");
        return;
    }
    evbuffer_add(b, r->k->openapi_text, strlen(r->k->openapi_text));
    sl_objects_send(r->req, 200, "application/json", b);
    evbuffer_free(b);
}

/* /version, /api, /apis, /apis/GROUP, /apis/GROUP/VERSION. Returns false
 * when the path is none of them. */
static bool serve_discovery(kreq_t *r, const char *path)
{
    if (strcmp(path, "/version") == 0) {
        send_json(r->req, 200,
                  json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "major", KAPI_MAJOR,
                            "minor", KAPI_MINOR, "gitVersion", KAPI_GIT_VERSION, "gitCommit", "",
                            "gitTreeState", "clean", "buildDate", "", "goVersion", "", "compiler",
                            "", "platform", "linux/amd64"));
    } else if (strcmp(path, "/api") == 0) {
        /* No core group: kubectl accepts an empty APIVersions. */
        send_json(r->req, 200,
                  json_pack("{s:s, s:[], s:[]}", "kind", "APIVersions", "versions",
                            "serverAddressByClientCIDRs"));
    } else if (strcmp(path, "/apis") == 0 || strcmp(path, "/apis/" SL_CRD_GROUP) == 0) {
        json_t *group =
            json_pack("{s:s, s:[{s:s, s:s}], s:{s:s, s:s}}", "name", SL_CRD_GROUP, "versions",
                      "groupVersion", KAPI_GV, "version", SL_CRD_VERSION, "preferredVersion",
                      "groupVersion", KAPI_GV, "version", SL_CRD_VERSION);
        if (strcmp(path, "/apis") == 0) {
            send_json(r->req, 200,
                      json_pack("{s:s, s:s, s:[o]}", "kind", "APIGroupList", "apiVersion", "v1",
                                "groups", group));
        } else {
            json_object_set_new(group, "kind", json_string("APIGroup"));
            json_object_set_new(group, "apiVersion", json_string("v1"));
            send_json(r->req, 200, group);
        }
    } else if (strcmp(path, KAPI_PREFIX) == 0) {
        send_json(r->req, 200, json_incref(r->k->resource_list));
    } else {
        return false;
    }
    return true;
}

/* ---- bodies and validation ------------------------------------------------ */

/* The media type of the body without parameters, lowercased into out. */
static void content_type(kreq_t *r, char *out, size_t len)
{
    const char *ct = evhttp_find_header(evhttp_request_get_input_headers(r->req), "Content-Type");
    size_t n = ct ? strcspn(ct, "; \t") : 0;
    if (n >= len)
        n = len - 1;
    for (size_t i = 0; i < n; i++)
        out[i] = (char)tolower((unsigned char)ct[i]);
    out[n] = '\0';
}

/* The body as one JSON value (JSON, or YAML for the YAML media types and
 * server-side apply). NULL after replying. */
static json_t *read_body(kreq_t *r, bool want_object)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(r->req);
    size_t len = evbuffer_get_length(in);
    if (len > r->k->opt.max_body_bytes) {
        reply_status(r->req, 413, "RequestEntityTooLarge", NULL,
                     "the request body of %zu bytes is larger than the limit of %zu bytes", len,
                     r->k->opt.max_body_bytes);
        return NULL;
    }
    const char *text = len ? (const char *)evbuffer_pullup(in, -1) : "";
    if (!text) {
        reply_status(r->req, 500, "InternalError", NULL, "out of memory reading the body");
        return NULL;
    }
    char ct[100];
    content_type(r, ct, sizeof(ct));
    json_t *v = NULL;
    if (strstr(ct, "yaml")) {
        sl_errors_t errs;
        sl_errors_init(&errs);
        json_t *docs = sl_yaml_to_json(text, len, "", &errs);
        if (!docs || json_array_size(docs) != 1) {
            char *m = docs ? NULL : sl_errors_format(&errs);
            reply_status(r->req, 400, "BadRequest", NULL, "the body is not one YAML document%s%s",
                         m ? ": " : "", m ? m : "");
            free(m);
            json_decref(docs);
            sl_errors_free(&errs);
            return NULL;
        }
        v = json_incref(json_array_get(docs, 0));
        json_decref(docs);
        sl_errors_free(&errs);
    } else {
        json_error_t je;
        v = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
        if (!v) {
            reply_status(r->req, 400, "BadRequest", NULL,
                         "the body is not valid JSON: line %d column %d: %s", je.line, je.column,
                         je.text);
            return NULL;
        }
    }
    if (want_object && !json_is_object(v)) {
        json_decref(v);
        reply_status(r->req, 400, "BadRequest", NULL, "the body must be a JSON or YAML object");
        return NULL;
    }
    return v;
}

static const char *cause_reason(const char *message)
{
    if (strcmp(message, "required field missing") == 0)
        return "FieldValueRequired";
    if (strstr(message, "is not one of") || strstr(message, "is not supported"))
        return "FieldValueNotSupported";
    if (strncmp(message, "unknown field", 13) == 0)
        return "FieldValueInvalid";
    return "FieldValueInvalid";
}

/* Deletes the field named by a validation path ("spec.operations[1].foo")
 * from root. A key containing dots is matched whole when it exists. */
static void delete_field(json_t *root, const char *path)
{
    json_t *cur = root;
    const char *p = path;
    while (*p && cur) {
        if (*p == '[') {
            char *end;
            size_t idx = strtoul(p + 1, &end, 10);
            if (*end != ']')
                return;
            p = end + 1;
            if (*p == '.')
                p++;
            if (!*p) {
                json_array_remove(cur, idx);
                return;
            }
            cur = json_array_get(cur, idx);
            continue;
        }
        if (json_object_get(cur, p)) {
            json_object_del(cur, p);
            return;
        }
        size_t len = strcspn(p, ".[");
        char key[256];
        if (len >= sizeof(key))
            return;
        memcpy(key, p, len);
        key[len] = '\0';
        p += len;
        if (!*p) {
            json_object_del(cur, key);
            return;
        }
        cur = json_object_get(cur, key);
        if (*p == '.')
            p++;
    }
}

/*
 * Validates obj with the model library, honouring fieldValidation: unknown
 * fields are a 400 under Strict (as the API server's "strict decoding
 * error"), are dropped with a `Warning: 299` header under Warn (the
 * default) and silently under Ignore; every other error is a 422 Invalid
 * with one cause per error. Returns 0 (obj is valid, unknown fields
 * removed), or -1 after replying.
 */
static int validate(kreq_t *r, json_t *obj, const char *name)
{
    sl_errors_t errs;
    sl_errors_init(&errs);
    int rc = 0;
    for (int pass = 0; pass < 2; pass++) {
        sl_errors_free(&errs);
        sl_errors_init(&errs);
        if (sl_model_validate(obj, "", 0, &errs) == 0)
            goto out;
        size_t unknown = 0;
        for (size_t i = 0; i < errs.count; i++)
            unknown += strncmp(errs.items[i].message, "unknown field", 13) == 0;
        if (pass == 1 || unknown == 0)
            break;
        if (r->fv == FV_STRICT && unknown == errs.count) {
            struct evbuffer *b = evbuffer_new();
            for (size_t i = 0; b && i < errs.count; i++)
                evbuffer_add_printf(b, "%sunknown field \"%s\"", i ? ", " : "",
                                    errs.items[i].field);
            if (b)
                evbuffer_add(b, "", 1);
            reply_status(r->req, 400, "BadRequest", details_of(r, name),
                         "%s in version \"%s\" cannot be handled as a %s: strict decoding error: "
                         "%s",
                         sl_kind_name(r->kind), KAPI_GV, sl_kind_name(r->kind),
                         b ? (const char *)evbuffer_pullup(b, -1) : "unknown fields");
            if (b)
                evbuffer_free(b);
            rc = -1;
            goto out;
        }
        if (r->fv == FV_STRICT)
            break;
        for (size_t i = 0; i < errs.count; i++) {
            if (strncmp(errs.items[i].message, "unknown field", 13) != 0)
                continue;
            if (r->fv == FV_WARN) {
                char w[700];
                snprintf(w, sizeof(w), "299 - \"unknown field \\\"%.600s\\\"\"",
                         errs.items[i].field);
                evhttp_add_header(evhttp_request_get_output_headers(r->req), "Warning", w);
            }
            delete_field(obj, errs.items[i].field);
        }
    }
    /* 422 with causes. */
    json_t *causes = json_array();
    struct evbuffer *b = evbuffer_new();
    for (size_t i = 0; i < errs.count; i++) {
        const sl_error_t *e = &errs.items[i];
        json_array_append_new(causes, json_pack("{s:s, s:s, s:s}", "reason",
                                                cause_reason(e->message), "message", e->message,
                                                "field", e->field[0] ? e->field : "<root>"));
        if (b)
            evbuffer_add_printf(b, "%s%s: %s", i ? ", " : "", e->field[0] ? e->field : "<root>",
                                e->message);
    }
    if (b)
        evbuffer_add(b, "", 1);
    json_t *d = details_of(r, name);
    json_object_set_new(d, "kind", json_string(sl_kind_name(r->kind)));
    json_object_set_new(d, "causes", causes);
    reply_status(r->req, 422, "Invalid", d, "%s.%s \"%s\" is invalid: %s%s%s",
                 sl_kind_name(r->kind), SL_CRD_GROUP, name, errs.count > 1 ? "[" : "",
                 b ? (const char *)evbuffer_pullup(b, -1) : "", errs.count > 1 ? "]" : "");
    if (b)
        evbuffer_free(b);
    rc = -1;
out:
    sl_errors_free(&errs);
    return rc;
}

/* ---- patches -------------------------------------------------------------- */

/* RFC 7386 JSON merge patch: target (stolen, may be NULL) patched by patch
 * (borrowed). New reference. */
static json_t *merge_patch(json_t *target, json_t *patch)
{
    if (!json_is_object(patch)) {
        json_decref(target);
        return json_deep_copy(patch);
    }
    if (!json_is_object(target)) {
        json_decref(target);
        target = json_object();
    }
    const char *key;
    json_t *v;
    json_object_foreach(patch, key, v)
    {
        if (json_is_null(v)) {
            json_object_del(target, key);
            continue;
        }
        json_t *cur = json_object_get(target, key);
        json_object_set_new(target, key, merge_patch(json_incref(cur), v));
    }
    return target;
}

/* RFC 6901 pointer: the parent container of the last token and the token
 * (unescaped). 0, or -1 when the parent does not exist. */
static int pointer_parent(json_t *root, const char *ptr, json_t **parent, char *last, size_t len)
{
    if (ptr[0] != '/')
        return -1;
    json_t *cur = root;
    const char *p = ptr + 1;
    for (;;) {
        size_t n = strcspn(p, "/");
        char tok[512];
        size_t o = 0;
        for (size_t i = 0; i < n && o + 1 < sizeof(tok); i++) {
            if (p[i] == '~' && i + 1 < n && (p[i + 1] == '0' || p[i + 1] == '1')) {
                tok[o++] = p[i + 1] == '0' ? '~' : '/';
                i++;
            } else {
                tok[o++] = p[i];
            }
        }
        tok[o] = '\0';
        if (p[n] == '\0') {
            *parent = cur;
            snprintf(last, len, "%s", tok);
            return cur ? 0 : -1;
        }
        if (json_is_object(cur))
            cur = json_object_get(cur, tok);
        else if (json_is_array(cur) && isdigit((unsigned char)tok[0]))
            cur = json_array_get(cur, strtoul(tok, NULL, 10));
        else
            cur = NULL;
        if (!cur)
            return -1;
        p += n + 1;
    }
}

static json_t *pointer_get(json_t *root, const char *ptr)
{
    if (!ptr[0])
        return root;
    json_t *parent;
    char last[512];
    if (pointer_parent(root, ptr, &parent, last, sizeof(last)) != 0)
        return NULL;
    if (json_is_object(parent))
        return json_object_get(parent, last);
    if (json_is_array(parent) && isdigit((unsigned char)last[0]))
        return json_array_get(parent, strtoul(last, NULL, 10));
    return NULL;
}

/* add (value stolen) / remove at ptr. 0 or -1. */
static int pointer_add(json_t *root, const char *ptr, json_t *value)
{
    json_t *parent;
    char last[512];
    if (pointer_parent(root, ptr, &parent, last, sizeof(last)) != 0) {
        json_decref(value);
        return -1;
    }
    if (json_is_object(parent))
        return json_object_set_new(parent, last, value);
    if (json_is_array(parent)) {
        if (strcmp(last, "-") == 0)
            return json_array_append_new(parent, value);
        if (isdigit((unsigned char)last[0]) && strtoul(last, NULL, 10) <= json_array_size(parent))
            return json_array_insert_new(parent, strtoul(last, NULL, 10), value);
    }
    json_decref(value);
    return -1;
}

static int pointer_remove(json_t *root, const char *ptr)
{
    json_t *parent;
    char last[512];
    if (pointer_parent(root, ptr, &parent, last, sizeof(last)) != 0)
        return -1;
    if (json_is_object(parent))
        return json_object_del(parent, last);
    if (json_is_array(parent) && isdigit((unsigned char)last[0]))
        return json_array_remove(parent, strtoul(last, NULL, 10));
    return -1;
}

/* RFC 6902 JSON patch applied to doc (modified in place; the root itself is
 * not replaceable). 0, or -1 with err naming the failing operation. */
static int json_patch(json_t *doc, json_t *ops, char *err, size_t errlen)
{
    if (!json_is_array(ops)) {
        snprintf(err, errlen, "a JSON patch is an array of operations");
        return -1;
    }
    size_t i;
    json_t *op;
    json_array_foreach(ops, i, op)
    {
        const char *kind = json_string_value(json_object_get(op, "op"));
        const char *path = json_string_value(json_object_get(op, "path"));
        const char *from = json_string_value(json_object_get(op, "from"));
        json_t *value = json_object_get(op, "value");
        int rc = -1;
        if (!kind || !path || !path[0]) {
            snprintf(err, errlen, "operation %zu: needs \"op\" and a non-root \"path\"", i);
            return -1;
        }
        if (strcmp(kind, "add") == 0 && value) {
            rc = pointer_add(doc, path, json_deep_copy(value));
        } else if (strcmp(kind, "remove") == 0) {
            rc = pointer_remove(doc, path);
        } else if (strcmp(kind, "replace") == 0 && value) {
            rc = pointer_get(doc, path) && pointer_remove(doc, path) == 0
                     ? pointer_add(doc, path, json_deep_copy(value))
                     : -1;
        } else if ((strcmp(kind, "move") == 0 || strcmp(kind, "copy") == 0) && from) {
            json_t *v = pointer_get(doc, from);
            json_t *copy = v ? json_deep_copy(v) : NULL;
            if (copy && kind[0] == 'm' && pointer_remove(doc, from) != 0) {
                json_decref(copy);
                copy = NULL;
            }
            rc = copy ? pointer_add(doc, path, copy) : -1;
        } else if (strcmp(kind, "test") == 0 && value) {
            rc = json_equal(pointer_get(doc, path), value) ? 0 : -1;
            if (rc != 0) {
                snprintf(err, errlen, "operation %zu: test of %.200s failed", i, path);
                return -1;
            }
        } else {
            snprintf(err, errlen, "operation %zu: unknown op '%.20s' or missing value/from", i,
                     kind);
            return -1;
        }
        if (rc != 0) {
            snprintf(err, errlen, "operation %zu (%s %.200s): the path does not exist", i, kind,
                     path);
            return -1;
        }
    }
    return 0;
}

/* ---- objects -------------------------------------------------------------- */

/* The stored object ns/name: 0 with *obj (new reference), 1 when absent
 * (nothing replied), -1 after replying 500. */
static int load(kreq_t *r, const char *ns, const char *name, json_t **obj)
{
    *obj = NULL;
    const sl_resource_set_t *set = r->k->opt.static_set;
    if (r->k->opt.read_only && set) {
        for (size_t i = 0; i < set->count && !*obj; i++)
            if (set->items[i].kind == r->kind && strcmp(set->items[i].ns, ns) == 0 &&
                strcmp(set->items[i].name, name) == 0)
                *obj = json_deep_copy(set->items[i].obj);
        return *obj ? 0 : 1;
    }
    enum sl_store_result res = sl_store_get(r->k->st, r->kind, ns, name, obj);
    if (res == SL_STORE_OK)
        return 0;
    if (res == SL_STORE_NOT_FOUND)
        return 1;
    if (res == SL_STORE_UNAVAILABLE) {
        reply_store_unavailable(r, NULL);
        return -1;
    }
    reply_status(r->req, 500, "InternalError", NULL,
                 "cannot read %s %s/%s (see the controller log)", sl_kind_name(r->kind), ns, name);
    return -1;
}

static json_t *render(kreq_t *r, json_t *stored)
{
    return sl_kapi_render(r->k->ctl, r->kind, stored);
}

/* Sends one stored object (borrowed), as JSON or as a one-row Table. */
static void reply_object(kreq_t *r, int code, json_t *stored)
{
    json_t *o = render(r, stored);
    if (o && wants_table(r)) {
        json_t *items = json_pack("[o]", o);
        const char *rv = meta_str(stored, "resourceVersion");
        send_doc(r->req, code, KAPI_TABLE_TYPE, table_of(r, items, rv ? rv : ""));
        json_decref(items);
        return;
    }
    send_json(r->req, code, o);
}

/* Rendered objects of the request's kind and namespace that pass f. New
 * array, or NULL after replying. *rv: the list's resourceVersion. */
static json_t *list_rendered(kreq_t *r, const filter_t *f, char *rv, size_t rvlen)
{
    const char *ns = r->ns[0] ? r->ns : NULL;
    json_t *stored = NULL;
    snprintf(rv, rvlen, "0");
    if (r->k->opt.read_only && r->k->opt.static_set) {
        const sl_resource_set_t *set = r->k->opt.static_set;
        stored = json_array();
        for (size_t i = 0; stored && i < set->count; i++)
            if (set->items[i].kind == r->kind && (!ns || strcmp(set->items[i].ns, ns) == 0))
                json_array_append(stored, set->items[i].obj);
    } else {
        enum sl_store_result lr = sl_store_list(r->k->st, r->kind, ns, &stored);
        if (lr == SL_STORE_UNAVAILABLE) {
            reply_store_unavailable(r, NULL);
            return NULL;
        }
        if (lr != SL_STORE_OK)
            stored = NULL;
        snprintf(rv, rvlen, "%" PRIu64, sl_store_resource_version(r->k->st));
    }
    json_t *out = stored ? json_array() : NULL;
    size_t i;
    json_t *it;
    json_array_foreach(stored, i, it)
    {
        json_t *o = render(r, it);
        if (o && filter_match((void *)f, o))
            json_array_append(out, o);
        json_decref(o);
    }
    json_decref(stored);
    if (!out)
        reply_status(r->req, 500, "InternalError", NULL, "cannot list %s (see the controller log)",
                     sl_kind_plural(r->kind));
    return out;
}

static void free_filter(void *f)
{
    free(f);
}

static void handle_list(kreq_t *r)
{
    filter_t *f;
    if (request_filter(r, &f) != 0)
        return;
    char rv[24];
    const char *w = evhttp_find_header(&r->q, "watch");
    bool watch = w && (strcmp(w, "true") == 0 || strcmp(w, "1") == 0);
    const char *from = evhttp_find_header(&r->q, "resourceVersion");
    json_t *items = NULL;
    if (!watch || !from || !from[0] || strcmp(from, "0") == 0) {
        items = list_rendered(r, f, rv, sizeof(rv));
        if (!items) {
            free(f);
            return;
        }
    }
    if (watch) {
        if (r->k->opt.watch_hub) {
            const char *t = evhttp_find_header(&r->q, "timeoutSeconds");
            const char *bm = evhttp_find_header(&r->q, "allowWatchBookmarks");
            sl_watch_params_t p = {
                .kind = r->kind,
                .ns = r->ns[0] ? r->ns : NULL,
                .resource_version = from,
                .bookmarks = bm && strcmp(bm, "true") == 0,
                .timeout_seconds = t ? (unsigned)strtoul(t, NULL, 10) : 0,
                .initial = items,
                .match = f ? filter_match : NULL,
                .match_ctx = f,
                .match_free = f ? free_filter : NULL,
            };
            char err[300] = "";
            if (sl_watch_serve(r->k->opt.watch_hub, r->req, &p, err, sizeof(err)) != 0) {
                free(f);
                reply_status(r->req, 400, "BadRequest", NULL, "%s", err);
            }
            json_decref(items);
            return;
        }
        free(f);
        json_decref(items);
        reply_status(r->req, 405, "MethodNotAllowed", NULL,
                     "watch is not available: this controller has no watch hub; list instead");
        return;
    }
    free(f);
    if (wants_table(r)) {
        send_doc(r->req, 200, KAPI_TABLE_TYPE, table_of(r, items, rv));
        json_decref(items);
        return;
    }
    char list_kind[48];
    snprintf(list_kind, sizeof(list_kind), "%sList", sl_kind_name(r->kind));
    send_json(r->req, 200,
              json_pack("{s:s, s:s, s:{s:s}, s:o}", "apiVersion", SL_API_VERSION, "kind", list_kind,
                        "metadata", "resourceVersion", rv, "items", items));
}

static void handle_get(kreq_t *r)
{
    json_t *obj;
    int found = load(r, r->ns, r->name, &obj);
    if (found == 1)
        reply_not_found(r, r->ns, r->name);
    if (found != 0)
        return;
    reply_object(r, 200, obj);
    json_decref(obj);
}

static void reply_conflict(kreq_t *r, const char *name, const char *cur, const char *expect)
{
    char msg[300];
    snprintf(msg, sizeof(msg),
             "the object has been modified; please apply your changes to the latest version and "
             "try again (resourceVersion is %s, not %s)",
             cur ? cur : "?", expect);
    reply_store_error(r, SL_STORE_CONFLICT, name, msg);
}

/*
 * Writes obj (validated; metadata.namespace set) over old (NULL = create),
 * with expect ("" = none) as the resourceVersion precondition, and answers.
 * An unchanged object is not rewritten; a dry run answers with what would be
 * stored and writes nothing (nor counts routes for admission).
 */
static void commit(kreq_t *r, json_t *obj, json_t *old, const char *expect)
{
    const char *name = meta_str(obj, "name");
    const char *cur = old ? meta_str(old, "resourceVersion") : NULL;
    if (old && expect[0] && (!cur || strcmp(cur, expect) != 0)) {
        reply_conflict(r, name, cur, expect);
        return;
    }
    if (old && sl_objects_same_user_fields(old, obj) && sl_ssa_same_ownership(old, obj)) {
        reply_object(r, 200, old);
        return;
    }
    if (r->dry_run) {
        json_t *would = json_deep_copy(obj);
        json_t *m = json_object_get(would, "metadata");
        json_object_del(would, "status");
        if (old) {
            json_t *om = json_object_get(old, "metadata");
            static const char *const keep[] = {"uid", "creationTimestamp", "resourceVersion"};
            for (size_t i = 0; i < 3; i++)
                json_object_set(m, keep[i], json_object_get(om, keep[i]));
            json_int_t gen = json_integer_value(json_object_get(om, "generation"));
            bool spec_changed =
                !json_equal(json_object_get(old, "spec"), json_object_get(obj, "spec"));
            json_object_set_new(m, "generation", json_integer(gen + (spec_changed ? 1 : 0)));
            if (json_object_get(old, "status"))
                json_object_set(would, "status", json_object_get(old, "status"));
        } else {
            char now[32];
            time_t t = time(NULL);
            struct tm tm;
            gmtime_r(&t, &tm);
            strftime(now, sizeof(now), "%Y-%m-%dT%H:%M:%SZ", &tm);
            json_object_set_new(m, "creationTimestamp", json_string(now));
            json_object_set_new(m, "generation", json_integer(1));
            json_object_del(m, "resourceVersion");
            json_object_del(m, "uid");
        }
        reply_object(r, old ? 200 : 201, would);
        json_decref(would);
        return;
    }
    char err[512] = "";
    if (r->k->ctl) {
        json_t *one = json_pack("[O]", obj);
        int ok = one && sl_controller_admit(r->k->ctl, one, err, sizeof(err)) == 0;
        json_decref(one);
        if (!ok) {
            reply_status(r->req, 403, "Forbidden", details_of(r, name), "%s", err);
            return;
        }
    }
    json_t *stored = NULL;
    enum sl_store_result res = sl_store_put(r->k->st, obj, old ? SL_STORE_REPLACE : SL_STORE_CREATE,
                                            expect, &stored, err, sizeof(err));
    if (res != SL_STORE_OK) {
        reply_store_error(r, res, name, err);
        return;
    }
    sl_objects_written(r->k->ctl);
    reply_object(r, old ? 200 : 201, stored);
    json_decref(stored);
}

/* Checks a body object against the request (kind, name, namespace) and
 * settles its namespace. 0, or -1 after replying. */
static int check_identity(kreq_t *r, json_t *obj, bool name_from_path)
{
    const char *kind = json_string_value(json_object_get(obj, "kind"));
    if (kind && strcmp(kind, sl_kind_name(r->kind)) != 0) {
        reply_status(r->req, 400, "BadRequest", NULL,
                     "the body is a %.64s but the path is for %s (send it to %s/namespaces/%s/%s)",
                     kind, sl_kind_name(r->kind), KAPI_PREFIX, r->ns, sl_kind_plural(r->kind));
        return -1;
    }
    json_t *meta = json_object_get(obj, "metadata");
    if (!json_is_object(meta)) {
        meta = json_object();
        json_object_set_new(obj, "metadata", meta);
    }
    const char *name = json_string_value(json_object_get(meta, "name"));
    if (name_from_path) {
        if (name && strcmp(name, r->name) != 0) {
            reply_status(r->req, 400, "BadRequest", details_of(r, r->name),
                         "the name of the object (%.253s) does not match the name on the URL (%s)",
                         name, r->name);
            return -1;
        }
        json_object_set_new(meta, "name", json_string(r->name));
    }
    const char *ns = json_string_value(json_object_get(meta, "namespace"));
    if (ns && strcmp(ns, r->ns) != 0) {
        reply_status(r->req, 400, "BadRequest", NULL,
                     "the namespace of the provided object (%.63s) does not match the namespace "
                     "sent on the request (%s)",
                     ns, r->ns);
        return -1;
    }
    json_object_set_new(meta, "namespace", json_string(r->ns));
    return 0;
}

static void now_rfc3339(char *out, size_t len)
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* An ordinary write (create, replace, merge or JSON patch) by the request's
 * manager: it owns what it changed (ssa.h). */
static void record_update(kreq_t *r, json_t *old, json_t *obj)
{
    char now[32];
    now_rfc3339(now, sizeof(now));
    sl_ssa_update(old, obj, r->manager, now);
}

/* 409 Conflict of a server-side apply, as a cluster words it (kubectl
 * prints the causes and suggests --force-conflicts). */
static void reply_apply_conflicts(kreq_t *r, json_t *conflicts)
{
    json_t *causes = json_array();
    struct evbuffer *b = evbuffer_new();
    size_t i;
    json_t *c;
    json_array_foreach(conflicts, i, c)
    {
        const char *m = json_string_value(json_object_get(c, "manager"));
        const char *f = json_string_value(json_object_get(c, "field"));
        char msg[300];
        snprintf(msg, sizeof(msg), "conflict with \"%.128s\" using %s", m, KAPI_GV);
        json_array_append_new(causes, json_pack("{s:s, s:s, s:s}", "reason", "FieldManagerConflict",
                                                "message", msg, "field", f));
        if (b)
            evbuffer_add_printf(b, "%s%s: %s", i ? ", " : "", msg, f);
    }
    if (b)
        evbuffer_add(b, "", 1);
    json_t *d = details_of(r, r->name);
    json_object_set_new(d, "kind", json_string(sl_kind_plural(r->kind)));
    json_object_set_new(d, "causes", causes);
    size_t n = json_array_size(conflicts);
    reply_status(r->req, 409, "Conflict", d, "Apply failed with %zu conflict%s: %s", n,
                 n == 1 ? "" : "s", b ? (const char *)evbuffer_pullup(b, -1) : "");
    if (b)
        evbuffer_free(b);
}

static const char *body_rv(json_t *obj)
{
    const char *rv = meta_str(obj, "resourceVersion");
    return rv ? rv : "";
}

static void handle_create(kreq_t *r)
{
    json_t *obj = read_body(r, true);
    if (!obj)
        return;
    json_t *old = NULL;
    const char *name;
    if (check_identity(r, obj, false) != 0)
        goto out;
    name = meta_str(obj, "name");
    if (validate(r, obj, name ? name : "") != 0)
        goto out;
    int found = load(r, r->ns, name, &old);
    if (found < 0)
        goto out;
    if (found == 0) {
        reply_store_error(r, SL_STORE_EXISTS, name, "");
        goto out;
    }
    /* A create ignores a resourceVersion copied from another object. */
    json_object_del(json_object_get(obj, "metadata"), "resourceVersion");
    record_update(r, NULL, obj);
    commit(r, obj, NULL, "");
out:
    json_decref(old);
    json_decref(obj);
}

/* Stores status (borrowed; NULL = missing) as the written status of old
 * (stored, borrowed) and answers with the object. */
static void put_status(kreq_t *r, json_t *old, json_t *status, const char *expect)
{
    const char *cur = meta_str(old, "resourceVersion");
    if (!status) {
        json_t *d = details_of(r, r->name);
        json_object_set_new(d, "kind", json_string(sl_kind_name(r->kind)));
        json_object_set_new(d, "causes",
                            json_pack("[{s:s, s:s, s:s}]", "reason", "FieldValueRequired",
                                      "message", "Required value", "field", "status"));
        reply_status(r->req, 422, "Invalid", d, "%s.%s \"%s\" is invalid: status: Required value",
                     sl_kind_name(r->kind), SL_CRD_GROUP, r->name);
        return;
    }
    if (expect[0] && (!cur || strcmp(cur, expect) != 0)) {
        reply_conflict(r, r->name, cur, expect);
        return;
    }
    if (r->dry_run) {
        json_t *would = json_deep_copy(old);
        json_object_set(would, "status", status);
        reply_object(r, 200, would);
        json_decref(would);
        return;
    }
    char err[512] = "";
    json_t *stored = NULL;
    enum sl_store_result res = sl_store_put_status(r->k->st, r->kind, r->ns, r->name, status,
                                                   expect, &stored, err, sizeof(err));
    if (res != SL_STORE_OK) {
        reply_store_error(r, res, r->name, err);
        return;
    }
    reply_object(r, 200, stored);
    json_decref(stored);
}

/* PUT of an object or of its status. */
static void handle_replace(kreq_t *r)
{
    json_t *obj = read_body(r, true);
    if (!obj)
        return;
    json_t *old = NULL;
    if (check_identity(r, obj, true) != 0)
        goto out;
    int found = load(r, r->ns, r->name, &old);
    if (found == 1)
        reply_not_found(r, r->ns, r->name);
    if (found != 0)
        goto out;
    if (r->status_sub) {
        json_t *status = json_object_get(obj, "status");
        put_status(r, old, json_is_object(status) ? status : NULL, body_rv(obj));
        goto out;
    }
    if (validate(r, obj, r->name) != 0)
        goto out;
    record_update(r, old, obj);
    commit(r, obj, old, body_rv(obj));
out:
    json_decref(old);
    json_decref(obj);
}

static void handle_patch(kreq_t *r)
{
    char ct[100];
    content_type(r, ct, sizeof(ct));
    bool apply = strcmp(ct, "application/apply-patch+yaml") == 0;
    bool merge = strcmp(ct, "application/merge-patch+json") == 0;
    bool jsonp = strcmp(ct, "application/json-patch+json") == 0;
    if (!apply && !merge && !jsonp) {
        reply_status(r->req, 415, "UnsupportedMediaType", NULL,
                     "the body of a PATCH must be application/merge-patch+json, "
                     "application/json-patch+json or application/apply-patch+yaml, not '%s'%s",
                     ct,
                     strstr(ct, "strategic") ? " (strategic merge patch does not exist for "
                                               "custom resources: use --type merge)"
                                             : "");
        return;
    }
    if (r->force && !apply) {
        reply_status(r->req, 422, "Invalid", NULL,
                     "force: Forbidden: may not be specified for non-apply patch");
        return;
    }
    if (apply && !evhttp_find_header(&r->q, "fieldManager")) {
        reply_status(r->req, 422, "Invalid", NULL,
                     "fieldManager: Required value: is required for apply patch");
        return;
    }
    json_t *patch = read_body(r, !jsonp);
    if (!patch)
        return;
    json_t *old = NULL, *patched = NULL, *conflicts = NULL;
    if (apply && check_identity(r, patch, true) != 0)
        goto out;
    int found = load(r, r->ns, r->name, &old);
    if (found < 0)
        goto out;
    if (apply && !r->status_sub) {
        /* Server-side apply (creating when absent): field ownership. */
        char now[32];
        now_rfc3339(now, sizeof(now));
        int rc = sl_ssa_apply(found == 0 ? old : NULL, patch, r->manager, r->force, now, &patched,
                              &conflicts);
        if (rc == 1) {
            reply_apply_conflicts(r, conflicts);
            goto out;
        }
        if (rc != 0) {
            reply_status(r->req, 400, "BadRequest", NULL,
                         "the applied configuration must be "
                         "an object");
            goto out;
        }
        if (check_identity(r, patched, true) != 0 || validate(r, patched, r->name) != 0)
            goto out;
        commit(r, patched, found == 0 ? old : NULL, found == 0 ? body_rv(patched) : "");
        goto out;
    }
    if (found == 1) {
        reply_not_found(r, r->ns, r->name);
        goto out;
    }
    patched = json_deep_copy(old);
    if (r->status_sub)
        sl_objects_with_status(r->k->ctl, patched);
    if (jsonp) {
        char err[300];
        if (json_patch(patched, patch, err, sizeof(err)) != 0) {
            reply_status(r->req, 422, "Invalid", details_of(r, r->name),
                         "the JSON patch cannot be applied: %s", err);
            goto out;
        }
    } else {
        patched = merge_patch(patched, patch);
    }
    if (r->status_sub) {
        json_t *status = json_object_get(patched, "status");
        const char *rv = body_rv(patched);
        const char *cur = meta_str(old, "resourceVersion");
        put_status(r, old, json_is_object(status) ? status : NULL,
                   cur && strcmp(rv, cur) != 0 ? rv : "");
        goto out;
    }
    if (check_identity(r, patched, true) != 0 || validate(r, patched, r->name) != 0)
        goto out;
    record_update(r, old, patched);
    commit(r, patched, old, body_rv(patched));
out:
    json_decref(conflicts);
    json_decref(patched);
    json_decref(old);
    json_decref(patch);
}

static void handle_delete(kreq_t *r)
{
    char expect[64] = "";
    struct evbuffer *in = evhttp_request_get_input_buffer(r->req);
    if (evbuffer_get_length(in)) {
        /* DeleteOptions: propagationPolicy is accepted (nothing is owned by
         * anything here); preconditions.resourceVersion is honoured. */
        json_t *opts = read_body(r, true);
        if (!opts)
            return;
        const char *rv = json_string_value(
            json_object_get(json_object_get(opts, "preconditions"), "resourceVersion"));
        snprintf(expect, sizeof(expect), "%s", rv ? rv : "");
        json_t *dr = json_object_get(opts, "dryRun");
        if (json_is_array(dr) && json_array_size(dr))
            r->dry_run = true;
        json_decref(opts);
    }
    json_t *old;
    int found = load(r, r->ns, r->name, &old);
    if (found == 1)
        reply_not_found(r, r->ns, r->name);
    if (found != 0)
        return;
    const char *cur = meta_str(old, "resourceVersion");
    if (expect[0] && (!cur || strcmp(cur, expect) != 0)) {
        reply_conflict(r, r->name, cur, expect);
        json_decref(old);
        return;
    }
    if (r->dry_run) {
        reply_object(r, 200, old);
        json_decref(old);
        return;
    }
    json_decref(old);
    char err[512] = "";
    json_t *deleted = NULL;
    enum sl_store_result res =
        sl_store_delete(r->k->st, r->kind, r->ns, r->name, expect, &deleted, err, sizeof(err));
    if (res != SL_STORE_OK) {
        reply_store_error(r, res, r->name, err);
        return;
    }
    if (r->k->ctl)
        sl_controller_forget(r->k->ctl, r->kind, r->ns, r->name);
    sl_objects_written(r->k->ctl);
    reply_object(r, 200, deleted);
    json_decref(deleted);
}

/* ---- routing -------------------------------------------------------------- */

/* Query options every write shares. 0, or -1 after replying 400. */
static int write_options(kreq_t *r)
{
    const char *dr = evhttp_find_header(&r->q, "dryRun");
    if (dr && dr[0] && strcmp(dr, "All") != 0) {
        reply_status(r->req, 400, "BadRequest", NULL,
                     "dryRun: Unsupported value: \"%.40s\": supported values: \"All\"", dr);
        return -1;
    }
    r->dry_run = dr && dr[0];
    const char *fv = evhttp_find_header(&r->q, "fieldValidation");
    r->fv = FV_WARN;
    if (fv && strcmp(fv, "Strict") == 0)
        r->fv = FV_STRICT;
    else if (fv && strcmp(fv, "Ignore") == 0)
        r->fv = FV_IGNORE;
    else if (fv && fv[0] && strcmp(fv, "Warn") != 0) {
        reply_status(r->req, 400, "BadRequest", NULL,
                     "fieldValidation: Unsupported value: \"%.40s\": supported values: "
                     "\"Ignore\", \"Strict\", \"Warn\"",
                     fv);
        return -1;
    }
    const char *fm = evhttp_find_header(&r->q, "fieldManager");
    if (fm && fm[0]) {
        size_t n = strlen(fm);
        bool printable = n <= 128;
        for (size_t i = 0; printable && i < n; i++)
            printable = fm[i] >= 0x20 && fm[i] < 0x7f;
        if (!printable) {
            reply_status(r->req, 422, "Invalid", NULL,
                         "fieldManager: Invalid value: must be at most 128 printable ASCII "
                         "characters");
            return -1;
        }
        snprintf(r->manager, sizeof(r->manager), "%s", fm);
    } else {
        sl_ssa_default_manager(
            evhttp_find_header(evhttp_request_get_input_headers(r->req), "User-Agent"), r->manager,
            sizeof(r->manager));
    }
    const char *force = evhttp_find_header(&r->q, "force");
    r->force = force && strcmp(force, "true") == 0;
    if (force && strcmp(force, "true") != 0 && strcmp(force, "false") != 0) {
        reply_status(r->req, 400, "BadRequest", NULL,
                     "force: Invalid value: \"%.40s\": true or false", force);
        return -1;
    }
    return 0;
}

static bool is_get(enum evhttp_cmd_type cmd)
{
    return cmd == EVHTTP_REQ_GET || cmd == EVHTTP_REQ_HEAD;
}

static void route_objects(kreq_t *r, const char *rest)
{
    char seg[KAPI_MAX_SEGMENTS][KAPI_MAX_NAME + 1];
    int n = 0;
    for (const char *p = rest; *p;) {
        size_t len = strcspn(p, "/");
        if (len == 0 || len > KAPI_MAX_NAME || n == KAPI_MAX_SEGMENTS) {
            n = -1;
            break;
        }
        memcpy(seg[n], p, len);
        seg[n++][len] = '\0';
        p += len;
        if (*p == '/')
            p++;
    }
    int first = 0;
    if (n >= 3 && strcmp(seg[0], "namespaces") == 0) {
        if (!sl_validate_is_dns_label(seg[1])) {
            reply_status(r->req, 404, "NotFound", NULL,
                         "namespace '%s' is not a DNS-1123 label (lowercase letters, digits and "
                         "'-', at most 63)",
                         seg[1]);
            return;
        }
        snprintf(r->ns, sizeof(r->ns), "%.63s", seg[1]);
        first = 2;
    }
    int m = n - first;
    if (n < 1 || m < 1 || m > 3 || (first == 0 && m != 1) ||
        sl_kind_from_plural(seg[first], &r->kind) != 0 ||
        (m == 3 && strcmp(seg[first + 2], "status") != 0)) {
        reply_status(r->req, 404, "NotFound", NULL,
                     "the server could not find the requested resource (use %s/[namespaces/{ns}/]"
                     "{gateways,apis,backends,consumers,certificates}[/{name}[/status]])",
                     KAPI_PREFIX);
        return;
    }
    bool ro = r->k->opt.read_only;
    enum evhttp_cmd_type cmd = r->cmd;
    if (m == 1) {
        if (is_get(cmd))
            return handle_list(r);
        if (cmd != EVHTTP_REQ_POST || !r->ns[0])
            return reply_405(r, r->ns[0] && !ro ? "GET, POST" : "GET", "a collection");
        if (ro)
            return reply_read_only(r);
        if (write_options(r) == 0)
            handle_create(r);
        return;
    }
    if (!sl_validate_is_dns_subdomain(seg[first + 1])) {
        reply_status(r->req, 404, "NotFound", NULL,
                     "'%s' is not a valid name: lowercase letters, digits, '-' and '.', starting "
                     "and ending with a letter or digit, at most 253",
                     seg[first + 1]);
        return;
    }
    snprintf(r->name, sizeof(r->name), "%s", seg[first + 1]);
    r->status_sub = m == 3;
    if (is_get(cmd))
        return handle_get(r);
    bool del = cmd == EVHTTP_REQ_DELETE && !r->status_sub;
    if (cmd != EVHTTP_REQ_PUT && cmd != EVHTTP_REQ_PATCH && !del)
        return reply_405(r, r->status_sub ? "GET, PUT, PATCH" : "GET, PUT, PATCH, DELETE",
                         r->status_sub ? "the status subresource" : "an object");
    if (ro)
        return reply_read_only(r);
    if (write_options(r) != 0)
        return;
    if (cmd == EVHTTP_REQ_PUT)
        handle_replace(r);
    else if (cmd == EVHTTP_REQ_PATCH)
        handle_patch(r);
    else
        handle_delete(r);
}

void sl_kapi_handle(sl_kapi_t *k, struct evhttp_request *req)
{
    kreq_t r;
    memset(&r, 0, sizeof(r));
    r.k = k;
    r.req = req;
    r.cmd = evhttp_request_get_command(req);
    TAILQ_INIT(&r.q);
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    const char *query = uri ? evhttp_uri_get_query(uri) : NULL;
    if (!path) {
        reply_status(req, 400, "BadRequest", NULL, "the request target must be an absolute path");
        return;
    }
    if (query && evhttp_parse_query_str(query, &r.q) != 0) {
        reply_status(req, 400, "BadRequest", NULL, "the query string cannot be parsed");
        return;
    }
    size_t plen = strlen(KAPI_PREFIX);
    if (strncmp(path, KAPI_PREFIX "/", plen + 1) == 0 && path[plen + 1]) {
        route_objects(&r, path + plen + 1);
    } else if (!is_get(r.cmd)) {
        reply_405(&r, "GET", "discovery");
    } else if (strncmp(path, "/openapi", 8) == 0) {
        serve_openapi(&r, path);
    } else if (!serve_discovery(&r, path)) {
        reply_status(req, 404, "NotFound", NULL,
                     "the server could not find the requested resource (this controller serves "
                     "the group %s only)",
                     KAPI_GV);
    }
    evhttp_clear_headers(&r.q);
}
