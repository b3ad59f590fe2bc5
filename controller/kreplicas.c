/*
 * Programmed across controller replicas (kreplicas.h).
 */
#include "kreplicas.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MESSAGE_MAX 1024

static json_t *condition(json_t *status, const char *type)
{
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(status, "conditions"), i, c)
    {
        const char *t = json_string_value(json_object_get(c, "type"));
        if (t && strcmp(t, type) == 0)
            return c;
    }
    return NULL;
}

static const char *str(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

static void appendf(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void appendf(char *buf, size_t len, const char *fmt, ...)
{
    size_t used = strlen(buf);
    if (used + 1 >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, len - used, fmt, ap);
    va_end(ap);
}

/* Sums the entries' fleets (sorted by name): the newest version each
 * reports, every runtime, and the runtimes that run that newest version.
 * *missing: fleets with runtimes whose snapshot lacks the object. */
static json_t *sum_fleets(json_t *entries, int *total, int *total_prog, int *missing)
{
    json_t *by = json_object(); /* fleet -> {version, runtimes, programmed} */
    const char *name;
    json_t *e;
    json_object_foreach(entries, name, e)
    {
        size_t i;
        json_t *f;
        json_array_foreach(json_object_get(e, "fleets"), i, f)
        {
            const char *fl = str(f, "fleet");
            json_int_t v = json_integer_value(json_object_get(f, "version"));
            json_t *s = json_object_get(by, fl);
            if (!s) {
                s = json_pack("{s:I, s:i, s:i}", "version", (json_int_t)0, "runtimes", 0,
                              "programmed", 0);
                json_object_set_new(by, fl, s);
            }
            if (v > json_integer_value(json_object_get(s, "version")))
                json_object_set_new(s, "version", json_integer(v));
        }
    }
    json_object_foreach(entries, name, e)
    {
        size_t i;
        json_t *f;
        json_array_foreach(json_object_get(e, "fleets"), i, f)
        {
            json_t *s = json_object_get(by, str(f, "fleet"));
            json_int_t n = json_integer_value(json_object_get(f, "runtimes"));
            json_object_set_new(
                s, "runtimes",
                json_integer(json_integer_value(json_object_get(s, "runtimes")) + n));
            /* Runtimes of a replica that lags run an older version. */
            if (json_integer_value(json_object_get(f, "version")) ==
                json_integer_value(json_object_get(s, "version")))
                json_object_set_new(
                    s, "programmed",
                    json_integer(json_integer_value(json_object_get(s, "programmed")) +
                                 json_integer_value(json_object_get(f, "programmed"))));
        }
    }
    /* Sorted by fleet name: the same array on every replica. */
    const char **names = calloc(json_object_size(by) + 1, sizeof(*names));
    size_t n = 0;
    json_t *v;
    json_object_foreach(by, name, v) names[n++] = name;
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            const char *t = names[j];
            names[j] = names[j - 1];
            names[j - 1] = t;
        }
    json_t *out = json_array();
    *total = *total_prog = *missing = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_object_get(by, names[i]);
        int rt = (int)json_integer_value(json_object_get(s, "runtimes"));
        int pr = (int)json_integer_value(json_object_get(s, "programmed"));
        json_array_append_new(out, json_pack("{s:s, s:O, s:i, s:i}", "fleet", names[i], "version",
                                             json_object_get(s, "version"), "runtimes", rt,
                                             "programmed", pr));
        *total += rt;
        *total_prog += pr;
        if (rt && !json_integer_value(json_object_get(s, "version")))
            (*missing)++;
    }
    free(names);
    json_decref(by);
    return out;
}

/* The Programmed condition over the live entries (sorted by replica name
 * by the caller): a function of the entries alone. */
static json_t *programmed_of(json_t *entries, const char *const *names, size_t n, json_t *fleets,
                             int total, int total_prog, int missing)
{
    json_int_t gen = -1;
    json_t *rejected = NULL, *not_accepted = NULL, *no_runtimes = NULL;
    for (size_t i = 0; i < n; i++) {
        json_t *p = json_object_get(json_object_get(entries, names[i]), "programmed");
        json_int_t g = json_integer_value(json_object_get(p, "observedGeneration"));
        if (gen < 0 || g < gen)
            gen = g;
        const char *reason = str(p, "reason");
        if (!strcmp(reason, "NotAccepted") && !not_accepted)
            not_accepted = p;
        if (!strcmp(reason, "Rejected") && !rejected)
            rejected = p;
        if (!strcmp(reason, "NoRuntimes") && !no_runtimes)
            no_runtimes = p;
    }
    if (gen < 0)
        gen = 0;
    json_t *take = not_accepted ? not_accepted : rejected ? rejected : total ? NULL : no_runtimes;
    if (take)
        return json_pack("{s:s, s:s, s:s, s:s, s:I}", "type", "Programmed", "status", "False",
                         "reason", str(take, "reason"), "message", str(take, "message"),
                         "observedGeneration", gen);
    char msg[MESSAGE_MAX] = "";
    size_t i;
    json_t *f;
    json_array_foreach(fleets, i, f)
    {
        json_int_t rt = json_integer_value(json_object_get(f, "runtimes"));
        json_int_t pr = json_integer_value(json_object_get(f, "programmed"));
        json_int_t v = json_integer_value(json_object_get(f, "version"));
        if (!rt)
            continue;
        if (v)
            appendf(msg, sizeof(msg),
                    "%sfleet %s: %" JSON_INTEGER_FORMAT " of %" JSON_INTEGER_FORMAT
                    " runtime%s run%s version %" JSON_INTEGER_FORMAT,
                    msg[0] ? "; " : "", str(f, "fleet"), pr, rt, rt == 1 ? "" : "s",
                    pr == 1 ? "s" : "", v);
        else
            appendf(msg, sizeof(msg),
                    "%sfleet %s: 0 of %" JSON_INTEGER_FORMAT " runtime%s: not in the fleet's "
                    "snapshot",
                    msg[0] ? "; " : "", str(f, "fleet"), rt, rt == 1 ? "" : "s");
    }
    if (!total)
        snprintf(msg, sizeof(msg), "no runtime of any fleet is connected");
    appendf(msg, sizeof(msg), " (%zu controller replicas)", n);
    bool done = total && total_prog == total && !missing;
    return json_pack("{s:s, s:s, s:s, s:s, s:I}", "type", "Programmed", "status",
                     done ? "True" : "False", "reason",
                     done    ? "Programmed"
                     : total ? "Pending"
                             : "NoRuntimes",
                     "message", msg, "observedGeneration", gen);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

json_t *sl_kreplicas_status(json_t *own, json_t *server, const char *me, json_t *live)
{
    json_t *mine = condition(own, "Programmed");
    if (!mine || !json_is_object(own))
        return json_incref(own);
    json_t *out = json_deep_copy(own);
    json_t *fl = json_object_get(own, "fleets");
    json_t *gen = json_object_get(mine, "observedGeneration");
    json_t *entry =
        json_pack("{s:o, s:{s:O, s:O, s:O, s:o}}", "fleets", fl ? json_deep_copy(fl) : json_array(),
                  "programmed", "status", json_object_get(mine, "status"), "reason",
                  json_object_get(mine, "reason"), "message", json_object_get(mine, "message"),
                  "observedGeneration", gen ? json_incref(gen) : json_integer(0));
    if (!entry) {
        json_decref(out);
        return json_incref(own);
    }
    /* The live entries: ours, and the others' as the server holds them. */
    json_t *entries = json_object();
    json_object_set(entries, me, entry);
    json_t *patch = json_object();
    json_object_set(patch, me, entry);
    json_decref(entry);
    const char *name;
    json_t *e;
    json_object_foreach(json_object_get(server, "replicas"), name, e)
    {
        if (!strcmp(name, me))
            continue;
        if (json_object_get(live, name) && json_is_object(e))
            json_object_set(entries, name, e);
        else
            json_object_set_new(patch, name, json_null()); /* gone: remove */
    }
    size_t n = 0;
    const char **names = calloc(json_object_size(entries) + 1, sizeof(*names));
    json_object_foreach(entries, name, e) names[n++] = name;
    qsort(names, n, sizeof(*names), cmp_str);
    int total, total_prog, missing;
    json_t *fleets = sum_fleets(entries, &total, &total_prog, &missing);
    json_t *prog = programmed_of(entries, names, n, fleets, total, total_prog, missing);
    free(names);
    /* Replace our Programmed condition, keep the others (Accepted). */
    json_t *conds = json_object_get(out, "conditions");
    size_t i;
    json_t *c;
    json_array_foreach(conds, i, c)
    {
        if (!strcmp(str(c, "type"), "Programmed")) {
            json_array_set(conds, i, prog);
            break;
        }
    }
    json_decref(prog);
    json_object_set_new(out, "fleets", fleets);
    json_object_set_new(out, "replicas", patch);
    json_decref(entries);
    return out;
}

/* RFC 7386 onto a copy. */
static json_t *merged(json_t *target, json_t *patch)
{
    if (!json_is_object(patch))
        return json_incref(patch);
    json_t *out = json_is_object(target) ? json_deep_copy(target) : json_object();
    const char *k;
    json_t *v;
    json_object_foreach(patch, k, v)
    {
        if (json_is_null(v)) {
            json_object_del(out, k);
            continue;
        }
        json_object_set_new(out, k, merged(json_object_get(out, k), v));
    }
    return out;
}

bool sl_kreplicas_unchanged(json_t *server, json_t *patch)
{
    json_t *after = merged(server, patch);
    json_t *before = json_is_object(server) ? json_incref(server) : json_object();
    bool same = json_equal(after, before);
    json_decref(after);
    json_decref(before);
    return same;
}

size_t sl_kreplicas_from_slices(json_t *list, json_t *live)
{
    size_t n = 0;
    size_t i, j;
    json_t *slice, *ep;
    json_array_foreach(json_object_get(list, "items"), i, slice)
    {
        json_array_foreach(json_object_get(slice, "endpoints"), j, ep)
        {
            json_t *ready = json_object_get(json_object_get(ep, "conditions"), "ready");
            json_t *ref = json_object_get(ep, "targetRef");
            const char *name = str(ref, "name");
            if (json_is_false(ready) || !name[0] || strcmp(str(ref, "kind"), "Pod") != 0)
                continue;
            if (!json_object_get(live, name))
                n++;
            json_object_set_new(live, name, json_true());
        }
    }
    return n;
}
