/*
 * Shared decoded resources (pbshare.h): a pointer -> owners map, entries only
 * for messages with two owners or more, plus the set of shell snapshots.
 * Open addressing with linear probing and backward-shift deletion, under one
 * mutex (main thread and call_rcu thread; a few hundred operations per apply).
 */
#include "pbshare.h"

#include "compiler.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const void *p;
    long n;
} ent_t;

typedef struct {
    ent_t *e;
    size_t cap; /* power of two, or 0 */
    size_t used;
} pmap_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pmap_t owners; /* message -> owners (>= 2) */
static pmap_t shells; /* shell snapshots (n unused) */

static size_t slot_of(const pmap_t *m, const void *p)
{
    uint64_t h = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ULL;
    return (size_t)(h >> 20) & (m->cap - 1);
}

static ent_t *find(pmap_t *m, const void *p)
{
    if (!m->cap)
        return NULL;
    for (size_t i = slot_of(m, p);; i = (i + 1) & (m->cap - 1)) {
        if (m->e[i].p == p)
            return &m->e[i];
        if (!m->e[i].p)
            return NULL;
    }
}

static int grow(pmap_t *m)
{
    size_t cap = m->cap ? m->cap * 2 : 256;
    ent_t *e = calloc(cap, sizeof(*e));
    if (!e)
        return -1;
    pmap_t n = {e, cap, 0};
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->e[i].p)
            continue;
        size_t j = slot_of(&n, m->e[i].p);
        while (n.e[j].p)
            j = (j + 1) & (cap - 1);
        n.e[j] = m->e[i];
        n.used++;
    }
    free(m->e);
    *m = n;
    return 0;
}

/* The entry of p, added with n = 0 when absent; NULL when out of memory. */
static ent_t *insert(pmap_t *m, const void *p)
{
    ent_t *f = find(m, p);
    if (f)
        return f;
    if ((m->used + 1) * 4 > m->cap * 3 && grow(m) != 0)
        return NULL;
    size_t i = slot_of(m, p);
    while (m->e[i].p)
        i = (i + 1) & (m->cap - 1);
    m->e[i].p = p;
    m->e[i].n = 0;
    m->used++;
    return &m->e[i];
}

static void erase(pmap_t *m, ent_t *at)
{
    size_t i = (size_t)(at - m->e);
    size_t mask = m->cap - 1;
    m->e[i].p = NULL;
    m->used--;
    /* Backward shift: move up the entries of the run that probed past i. */
    for (size_t j = (i + 1) & mask; m->e[j].p; j = (j + 1) & mask) {
        size_t home = slot_of(m, m->e[j].p);
        /* j's entry may move to i if its home is not in (i, j] cyclically */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            m->e[i] = m->e[j];
            m->e[j].p = NULL;
            i = j;
        }
    }
}

void sl_pbshare_ref(ProtobufCMessage *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&lock);
    ent_t *e = insert(&owners, m);
    if (e)
        e->n = e->n ? e->n + 1 : 2;
    pthread_mutex_unlock(&lock);
    if (!e)
        abort(); /* an owner we cannot count would be freed twice: refuse */
}

void sl_pbshare_unref(ProtobufCMessage *m)
{
    if (!m)
        return;
    int last = 0;
    pthread_mutex_lock(&lock);
    ent_t *e = find(&owners, m);
    if (!e)
        last = 1;
    else if (--e->n <= 1)
        erase(&owners, e); /* one owner left: no entry needed */
    pthread_mutex_unlock(&lock);
    if (last)
        protobuf_c_message_free_unpacked(m, NULL);
}

long sl_pbshare_refs(const void *m)
{
    pthread_mutex_lock(&lock);
    ent_t *e = find(&owners, m);
    long n = e ? e->n : 0;
    pthread_mutex_unlock(&lock);
    return n;
}

#define REF_ARRAY(dst, src, n)                                                                    \
    do {                                                                                          \
        if (n) {                                                                                  \
            (dst) = malloc((n) * sizeof(*(dst)));                                                 \
            if (!(dst))                                                                           \
                goto nomem;                                                                       \
            memcpy((dst), (src), (n) * sizeof(*(dst)));                                           \
        }                                                                                         \
    } while (0)

Sluice__V1__Snapshot *sl_pbshare_snapshot(const Sluice__V1__Snapshot *view)
{
    Sluice__V1__Snapshot *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    sluice__v1__snapshot__init(s);
    s->version = view->version;
    s->fleet = strdup(view->fleet ? view->fleet : "");
    if (!s->fleet)
        goto nomem;
    REF_ARRAY(s->listeners, view->listeners, view->n_listeners);
    REF_ARRAY(s->clusters, view->clusters, view->n_clusters);
    REF_ARRAY(s->route_tables, view->route_tables, view->n_route_tables);
    REF_ARRAY(s->certificates, view->certificates, view->n_certificates);
    REF_ARRAY(s->consumers, view->consumers, view->n_consumers);
    pthread_mutex_lock(&lock);
    ent_t *e = insert(&shells, s);
    pthread_mutex_unlock(&lock);
    if (!e)
        goto nomem;
    s->n_listeners = view->n_listeners;
    s->n_clusters = view->n_clusters;
    s->n_route_tables = view->n_route_tables;
    s->n_certificates = view->n_certificates;
    s->n_consumers = view->n_consumers;
    s->settings = view->settings;
    for (size_t i = 0; i < s->n_listeners; i++)
        sl_pbshare_ref(&s->listeners[i]->base);
    for (size_t i = 0; i < s->n_clusters; i++)
        sl_pbshare_ref(&s->clusters[i]->base);
    for (size_t i = 0; i < s->n_route_tables; i++)
        sl_pbshare_ref(&s->route_tables[i]->base);
    for (size_t i = 0; i < s->n_certificates; i++)
        sl_pbshare_ref(&s->certificates[i]->base);
    for (size_t i = 0; i < s->n_consumers; i++)
        sl_pbshare_ref(&s->consumers[i]->base);
    if (s->settings)
        sl_pbshare_ref(&s->settings->base);
    return s;
nomem:
    free(s->listeners);
    free(s->clusters);
    free(s->route_tables);
    free(s->certificates);
    free(s->consumers);
    free(s->fleet);
    free(s);
    return NULL;
}

void sl_pbshare_snapshot_free(Sluice__V1__Snapshot *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&lock);
    ent_t *e = find(&shells, s);
    if (e)
        erase(&shells, e);
    pthread_mutex_unlock(&lock);
    if (!e) {
        sl_snapshot_free(s);
        return;
    }
    for (size_t i = 0; i < s->n_listeners; i++)
        sl_pbshare_unref(&s->listeners[i]->base);
    for (size_t i = 0; i < s->n_clusters; i++)
        sl_pbshare_unref(&s->clusters[i]->base);
    for (size_t i = 0; i < s->n_route_tables; i++)
        sl_pbshare_unref(&s->route_tables[i]->base);
    for (size_t i = 0; i < s->n_certificates; i++)
        sl_pbshare_unref(&s->certificates[i]->base);
    for (size_t i = 0; i < s->n_consumers; i++)
        sl_pbshare_unref(&s->consumers[i]->base);
    if (s->settings)
        sl_pbshare_unref(&s->settings->base);
    free(s->listeners);
    free(s->clusters);
    free(s->route_tables);
    free(s->certificates);
    free(s->consumers);
    free(s->fleet);
    free(s);
}
