/*
 * Field ownership (ssa.h): metadata.managedFields for server-side apply.
 *
 * A field set is a JSON object used as a set: each key is one field's path,
 * its segments joined by SEP (a byte no field name of ours holds; label and
 * annotation keys may hold '.', so '.' cannot be the separator). The stored
 * form is Kubernetes' FieldsV1 tree ({"f:spec": {"f:basePath": {}}}), read
 * and written only at the edges.
 *
 * An entry while working: {"manager", "operation", "set", "orig"} where
 * orig is the stored entry (kept for entries of a subresource, which this
 * file never changes).
 */
#include "ssa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SEP '\x1f'
#define SEP_S "\x1f"

/* ---- paths ----------------------------------------------------------------- */

static char *join(const char *prefix, const char *key)
{
    size_t a = strlen(prefix), b = strlen(key);
    char *p = malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, prefix, a);
    size_t n = a;
    if (a)
        p[n++] = SEP;
    memcpy(p + n, key, b + 1);
    return p;
}

/* Every leaf of v under prefix into set: a non-empty object is granular, a
 * list, a scalar or an empty object is one field. Nulls are no field (an
 * applied null deletes). */
static void collect(json_t *v, const char *prefix, json_t *set)
{
    if (json_is_null(v))
        return;
    if (json_is_object(v) && json_object_size(v) > 0) {
        const char *k;
        json_t *c;
        json_object_foreach(v, k, c)
        {
            char *p = join(prefix, k);
            if (p)
                collect(c, p, set);
            free(p);
        }
        return;
    }
    json_object_set_new(set, prefix, json_true());
}

/* The user's fields of an object (ssa.h says which). */
static json_t *fields_of(json_t *obj)
{
    json_t *set = json_object();
    if (!json_is_object(obj))
        return set;
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v)
    {
        if (!strcmp(k, "apiVersion") || !strcmp(k, "kind") || !strcmp(k, "status") ||
            !strcmp(k, "metadata"))
            continue;
        collect(v, k, set);
    }
    json_t *meta = json_object_get(obj, "metadata");
    static const char *const maps[] = {"labels", "annotations"};
    for (size_t i = 0; i < 2; i++) {
        json_t *m = json_object_get(meta, maps[i]);
        if (!json_is_object(m))
            continue;
        json_object_foreach(m, k, v)
        {
            if (json_is_null(v))
                continue;
            char *p = join(maps[i], k), *q = p ? join("metadata", p) : NULL;
            if (q)
                json_object_set_new(set, q, json_true());
            free(p);
            free(q);
        }
    }
    return set;
}

/* The value at path (borrowed) or NULL. */
static json_t *value_at(json_t *obj, const char *path)
{
    const char *s = path;
    json_t *cur = obj;
    while (cur) {
        const char *e = strchr(s, SEP);
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (!json_is_object(cur))
            return NULL;
        json_t *next = json_object_getn(cur, s, n);
        if (!e)
            return next;
        cur = next;
        s = e + 1;
    }
    return NULL;
}

/* Sets the value at path (stolen), making objects on the way (a member on
 * the way that is not an object is replaced: the applied shape wins). */
static void set_at(json_t *obj, const char *path, json_t *value)
{
    const char *s = path;
    json_t *cur = obj;
    for (;;) {
        const char *e = strchr(s, SEP);
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (!e) {
            json_object_setn_new(cur, s, n, value);
            return;
        }
        json_t *next = json_object_getn(cur, s, n);
        if (!json_is_object(next)) {
            next = json_object();
            json_object_setn_new(cur, s, n, next);
        }
        cur = next;
        s = e + 1;
    }
}

static void del_at(json_t *obj, const char *path)
{
    const char *last = strrchr(path, SEP);
    json_t *parent = obj;
    if (last) {
        char *head = strndup(path, (size_t)(last - path));
        parent = head ? value_at(obj, head) : NULL;
        free(head);
    }
    if (json_is_object(parent))
        json_object_del(parent, last ? last + 1 : path);
}

/* Whether any entry's set holds path. */
static bool owned(json_t *entries, const char *path)
{
    size_t i;
    json_t *e;
    json_array_foreach(entries, i, e)
    {
        if (json_object_get(json_object_get(e, "set"), path))
            return true;
    }
    return false;
}

/* Deletes path, then each parent object it leaves empty that nobody owns
 * itself: dropping `timeouts: {request: 5s}` from a file drops `timeouts`. */
static void prune(json_t *obj, const char *path, json_t *entries)
{
    char *p = strdup(path);
    if (!p)
        return;
    del_at(obj, p);
    for (char *last = strrchr(p, SEP); last; last = strrchr(p, SEP)) {
        *last = '\0';
        json_t *parent = value_at(obj, p);
        /* Top-level members (spec, metadata) stay. */
        if (!strchr(p, SEP) || !json_is_object(parent) || json_object_size(parent) ||
            owned(entries, p))
            break;
        del_at(obj, p);
    }
    free(p);
}

/* The field in ".spec.basePath" form. */
static json_t *display(const char *path)
{
    size_t n = strlen(path);
    char *d = malloc(n + 2);
    if (!d)
        return json_string("");
    d[0] = '.';
    for (size_t i = 0; i <= n; i++)
        d[i + 1] = path[i] == SEP ? '.' : path[i];
    json_t *s = json_string(d);
    free(d);
    return s;
}

/* ---- FieldsV1 -------------------------------------------------------------- */

static void tree_collect(json_t *node, const char *prefix, json_t *set)
{
    if (!json_is_object(node))
        return;
    if (json_object_size(node) == 0) {
        if (prefix[0])
            json_object_set_new(set, prefix, json_true());
        return;
    }
    const char *k;
    json_t *c;
    json_object_foreach(node, k, c)
    {
        if (!strcmp(k, ".") || strncmp(k, "f:", 2) != 0) {
            /* "." owns the node itself; a list item key (k:, v:, i:) of a
             * list we treat as atomic owns the list. */
            if (prefix[0])
                json_object_set_new(set, prefix, json_true());
            continue;
        }
        char *p = join(prefix, k + 2);
        if (p)
            tree_collect(c, p, set);
        free(p);
    }
}

/* Normalises the markers of tree(): a leaf that is also a parent keeps
 * ".", a plain leaf becomes {}. */
static void tree_finish(json_t *node)
{
    const char *k;
    json_t *c;
    json_object_foreach(node, k, c)
    {
        if (strcmp(k, ".") != 0)
            tree_finish(c);
    }
    if (json_object_size(node) == 1 && json_object_get(node, "."))
        json_object_del(node, ".");
}

static json_t *tree(json_t *set)
{
    json_t *root = json_object();
    const char *path;
    json_t *v;
    json_object_foreach(set, path, v)
    {
        json_t *cur = root;
        const char *s = path;
        for (;;) {
            const char *e = strchr(s, SEP);
            size_t n = e ? (size_t)(e - s) : strlen(s);
            char *key = malloc(n + 3);
            if (!key)
                break;
            memcpy(key, "f:", 2);
            memcpy(key + 2, s, n);
            key[n + 2] = '\0';
            json_t *next = json_object_get(cur, key);
            if (!next) {
                next = json_object();
                json_object_set_new(cur, key, next);
            }
            free(key);
            cur = next;
            if (!e) {
                json_object_set_new(cur, ".", json_object());
                break;
            }
            s = e + 1;
        }
    }
    tree_finish(root);
    return root;
}

/* ---- entries --------------------------------------------------------------- */

static json_t *entries_of(json_t *mf)
{
    json_t *out = json_array();
    size_t i;
    json_t *e;
    json_array_foreach(mf, i, e)
    {
        const char *m = json_string_value(json_object_get(e, "manager"));
        const char *op = json_string_value(json_object_get(e, "operation"));
        if (!json_is_object(e) || !m || !op)
            continue;
        json_t *set = json_object();
        tree_collect(json_object_get(e, "fieldsV1"), "", set);
        json_array_append_new(out, json_pack("{s:s, s:s, s:o, s:O}", "manager", m, "operation", op,
                                             "set", set, "orig", e));
    }
    return out;
}

static bool is_subresource(json_t *entry)
{
    const char *sub =
        json_string_value(json_object_get(json_object_get(entry, "orig"), "subresource"));
    return sub && sub[0];
}

static json_t *find_entry(json_t *entries, const char *manager, const char *op)
{
    size_t i;
    json_t *e;
    json_array_foreach(entries, i, e)
    {
        if (!is_subresource(e) &&
            !strcmp(json_string_value(json_object_get(e, "manager")), manager) &&
            !strcmp(json_string_value(json_object_get(e, "operation")), op))
            return e;
    }
    return NULL;
}

static json_t *entry_set(json_t *e)
{
    return json_object_get(e, "set");
}

/* Entries back to managedFields on obj's metadata (none: the key goes).
 * An entry whose set became empty is dropped; `touched` entries get `now`. */
static void store_entries(json_t *obj, json_t *entries)
{
    json_t *mf = json_array();
    size_t i;
    json_t *e;
    json_array_foreach(entries, i, e)
    {
        if (is_subresource(e)) {
            json_array_append(mf, json_object_get(e, "orig"));
            continue;
        }
        json_t *set = entry_set(e);
        if (!json_object_size(set))
            continue;
        json_t *orig = json_object_get(e, "orig");
        const char *time = json_string_value(json_object_get(e, "time"));
        if (!time)
            time = json_string_value(json_object_get(orig, "time"));
        json_t *out =
            json_pack("{s:O, s:O, s:s}", "manager", json_object_get(e, "manager"), "operation",
                      json_object_get(e, "operation"), "apiVersion", SL_SSA_API_VERSION);
        if (time)
            json_object_set_new(out, "time", json_string(time));
        json_object_set_new(out, "fieldsType", json_string("FieldsV1"));
        json_object_set_new(out, "fieldsV1", tree(set));
        json_array_append_new(mf, out);
    }
    json_t *meta = json_object_get(obj, "metadata");
    if (!json_is_object(meta)) {
        meta = json_object();
        json_object_set_new(obj, "metadata", meta);
    }
    if (json_array_size(mf))
        json_object_set_new(meta, "managedFields", mf);
    else {
        json_object_del(meta, "managedFields");
        json_decref(mf);
    }
}

static json_t *entry_new(json_t *entries, const char *manager, const char *op)
{
    json_t *e =
        json_pack("{s:s, s:s, s:o}", "manager", manager, "operation", op, "set", json_object());
    json_array_append_new(entries, e);
    return e;
}

/* ---- apply ----------------------------------------------------------------- */

/* The paths of the nulls in v (applied configurations may say "delete
 * this" with a null, as a merge patch does). */
static void collect_nulls(json_t *v, const char *prefix, json_t *set)
{
    const char *k;
    json_t *c;
    json_object_foreach(v, k, c)
    {
        if (!prefix[0] && (!strcmp(k, "apiVersion") || !strcmp(k, "kind") || !strcmp(k, "status")))
            continue;
        char *p = join(prefix, k);
        if (!p)
            continue;
        if (json_is_null(c))
            json_object_set_new(set, p, json_true());
        else if (json_is_object(c))
            collect_nulls(c, p, set);
        free(p);
    }
}

int sl_ssa_apply(json_t *live, json_t *applied, const char *manager, bool force, const char *now,
                 json_t **out, json_t **conflicts)
{
    *out = NULL;
    *conflicts = NULL;
    if (!json_is_object(applied))
        return -1;
    json_t *entries =
        entries_of(json_object_get(json_object_get(live, "metadata"), "managedFields"));
    json_t *set_a = fields_of(applied);
    json_t *found = json_array();
    json_t *losers = json_array(); /* [entry, path] pairs to take on force */
    size_t i;
    json_t *e;
    json_array_foreach(entries, i, e)
    {
        if (is_subresource(e) || !strcmp(json_string_value(json_object_get(e, "manager")), manager))
            continue;
        const char *path;
        json_t *v;
        json_object_foreach(entry_set(e), path, v)
        {
            if (!json_object_get(set_a, path))
                continue;
            json_t *lv = value_at(live, path);
            if (!lv || json_equal(lv, value_at(applied, path)))
                continue; /* the same value: shared ownership, no conflict */
            json_array_append_new(found,
                                  json_pack("{s:O, s:o}", "manager", json_object_get(e, "manager"),
                                            "field", display(path)));
            json_array_append_new(losers, json_pack("[O, s]", e, path));
        }
    }
    if (json_array_size(found) && !force) {
        *conflicts = found;
        json_decref(losers);
        json_decref(set_a);
        json_decref(entries);
        return 1;
    }
    json_decref(found);
    json_array_foreach(losers, i, e)
    {
        json_object_del(entry_set(json_array_get(e, 0)), json_string_value(json_array_get(e, 1)));
    }
    json_decref(losers);

    json_t *res = live ? json_deep_copy(live) : json_object();
    static const char *const ident[] = {"apiVersion", "kind"};
    for (size_t k = 0; k < 2; k++)
        if (json_object_get(applied, ident[k]))
            json_object_set(res, ident[k], json_object_get(applied, ident[k]));
    json_t *rmeta = json_object_get(res, "metadata");
    if (!json_is_object(rmeta)) {
        rmeta = json_object();
        json_object_set_new(res, "metadata", rmeta);
    }
    json_t *ameta = json_object_get(applied, "metadata");
    static const char *const idmeta[] = {"name", "namespace", "resourceVersion"};
    for (size_t k = 0; k < 3; k++)
        if (json_is_string(json_object_get(ameta, idmeta[k])))
            json_object_set(rmeta, idmeta[k], json_object_get(ameta, idmeta[k]));

    /* What this manager applied before and no longer does goes, unless
     * another manager owns it too. */
    json_t *mine = find_entry(entries, manager, "Apply");
    if (mine) {
        const char *path;
        json_t *v;
        json_object_foreach(entry_set(mine), path, v)
        {
            if (json_object_get(set_a, path))
                continue;
            bool shared = false;
            json_array_foreach(entries, i, e)
            {
                if (e != mine && json_object_get(entry_set(e), path)) {
                    shared = true;
                    break;
                }
            }
            if (!shared)
                prune(res, path, entries);
        }
    } else {
        mine = entry_new(entries, manager, "Apply");
    }
    const char *path;
    json_t *v;
    json_object_foreach(set_a, path, v)
    {
        set_at(res, path, json_deep_copy(value_at(applied, path)));
    }
    /* Nulls in the applied configuration delete (as in a merge patch). */
    json_t *nulls = json_object();
    collect_nulls(applied, "", nulls);
    json_object_foreach(nulls, path, v)
    {
        if (strncmp(path, "metadata" SEP_S, 9) == 0 &&
            strncmp(path, "metadata" SEP_S "labels" SEP_S, 16) != 0 &&
            strncmp(path, "metadata" SEP_S "annotations" SEP_S, 21) != 0)
            continue;
        del_at(res, path);
    }
    json_decref(nulls);
    json_object_set(mine, "set", set_a);
    json_object_set_new(mine, "time", json_string(now));
    json_decref(set_a);
    store_entries(res, entries);
    json_decref(entries);
    *out = res;
    return 0;
}

/* ---- update ---------------------------------------------------------------- */

void sl_ssa_update(json_t *old, json_t *obj, const char *manager, const char *now)
{
    char buf[32];
    if (!now) {
        time_t t = time(NULL);
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
        now = buf;
    }
    json_t *sent = json_object_get(json_object_get(obj, "metadata"), "managedFields");
    json_t *entries = entries_of(
        json_is_array(sent) ? sent
                            : json_object_get(json_object_get(old, "metadata"), "managedFields"));
    json_t *set_old = fields_of(old), *set_new = fields_of(obj);
    json_t *changed = json_object(), *gone = json_object();
    const char *path;
    json_t *v;
    json_object_foreach(set_new, path, v)
    {
        json_t *was = json_object_get(set_old, path) ? value_at(old, path) : NULL;
        if (!was || !json_equal(was, value_at(obj, path)))
            json_object_set_new(changed, path, json_true());
    }
    json_object_foreach(set_old, path, v)
    {
        if (!json_object_get(set_new, path))
            json_object_set_new(gone, path, json_true());
    }
    size_t i;
    json_t *e;
    json_array_foreach(entries, i, e)
    {
        if (is_subresource(e))
            continue;
        json_t *set = entry_set(e);
        json_object_foreach(changed, path, v) json_object_del(set, path);
        json_object_foreach(gone, path, v) json_object_del(set, path);
    }
    if (json_object_size(changed)) {
        json_t *mine = find_entry(entries, manager, "Update");
        if (!mine)
            mine = entry_new(entries, manager, "Update");
        json_object_update(entry_set(mine), changed);
        json_object_set_new(mine, "time", json_string(now));
    }
    store_entries(obj, entries);
    json_decref(entries);
    json_decref(set_old);
    json_decref(set_new);
    json_decref(changed);
    json_decref(gone);
}

/* ---- helpers --------------------------------------------------------------- */

void sl_ssa_default_manager(const char *user_agent, char *out, size_t len)
{
    size_t n = 0;
    if (user_agent)
        while (user_agent[n] && user_agent[n] != '/' && n < 128)
            n++;
    if (!n)
        snprintf(out, len, "unknown");
    else
        snprintf(out, len, "%.*s", (int)n, user_agent);
}

static json_t *ownership(json_t *obj)
{
    json_t *entries =
        entries_of(json_object_get(json_object_get(obj, "metadata"), "managedFields"));
    json_t *out = json_array();
    size_t i;
    json_t *e;
    json_array_foreach(entries, i, e)
    {
        json_array_append_new(out, json_pack("[O, O, O]", json_object_get(e, "manager"),
                                             json_object_get(e, "operation"), entry_set(e)));
    }
    json_decref(entries);
    return out;
}

bool sl_ssa_same_ownership(json_t *a, json_t *b)
{
    json_t *x = ownership(a), *y = ownership(b);
    bool same = json_equal(x, y);
    json_decref(x);
    json_decref(y);
    return same;
}
