/*
 * Runtimes of every controller replica on a shared store (replicas.h).
 */
#include "replicas.h"

#include "core.h"
#include "log.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define COALESCE_MS 20

struct sl_replicas {
    struct event_base *base;
    sl_store_t *store;
    sl_controller_t *ctl;
    char name[256];
    uint64_t timeout_ms;
    struct event *tick_ev;
    int dirty;        /* runtimes changed since the rows were written */
    uint64_t last_ms; /* last tick (monotonic) */
    uint64_t due_ms;  /* when the next tick is scheduled (monotonic) */
    /* What the table holds of this replica's runtimes: node id -> document
     * text; `written_known` 0 when that is not known (at start, after a
     * failure): the next write is a full one. */
    json_t *written;
    int written_known;
    json_t *gens; /* the other live replicas: name -> generation read */
    json_t *rows; /* their rows as last read */
    int synced;   /* the view was given to the core once */
    int failing;  /* the last tick failed */
    char why[600];
};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void schedule(sl_replicas_t *r, uint64_t delay_ms)
{
    r->due_ms = mono_ms() + delay_ms;
    struct timeval tv = {(time_t)(delay_ms / 1000), (suseconds_t)(delay_ms % 1000) * 1000};
    event_add(r->tick_ev, &tv);
}

/* This replica's runtime documents that differ from what the table holds
 * (all of them when full), as a JSON array text into *rows (NULL when
 * none), the node ids no longer there into *gone (NULL when none), and the
 * new state of the table into *next. -1 when out of memory. */
static int changes(sl_replicas_t *r, int full, char **rows, char **gone, json_t **next)
{
    *rows = *gone = NULL;
    *next = json_object();
    json_t *own = sl_controller_own_runtimes_json(r->ctl);
    json_t *up = json_array(), *del = json_array();
    if (!*next || !own || !up || !del)
        goto fail;
    size_t i;
    json_t *doc;
    json_array_foreach(own, i, doc)
    {
        const char *node = json_string_value(json_object_get(doc, "node_id"));
        char *text = json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS);
        if (!node || !text) {
            free(text);
            goto fail;
        }
        const char *was = json_string_value(json_object_get(r->written, node));
        if (full || !was || strcmp(was, text) != 0)
            json_array_append(up, doc);
        json_object_set_new(*next, node, json_string(text));
        free(text);
    }
    const char *node;
    json_t *v;
    if (!full)
        json_object_foreach(r->written, node, v)
        {
            if (!json_object_get(*next, node))
                json_array_append_new(del, json_string(node));
        }
    if ((full || json_array_size(up)) && !(*rows = json_dumps(up, JSON_COMPACT)))
        goto fail;
    if (json_array_size(del) && !(*gone = json_dumps(del, JSON_COMPACT)))
        goto fail;
    json_decref(own);
    json_decref(up);
    json_decref(del);
    return 0;
fail:
    free(*rows);
    free(*gone);
    *rows = *gone = NULL;
    json_decref(*next);
    *next = NULL;
    json_decref(own);
    json_decref(up);
    json_decref(del);
    return -1;
}

static void fail(sl_replicas_t *r, const char *why)
{
    if (!r->failing)
        sl_log_warn("replicas: %s (status reads count this replica's runtimes only until the "
                    "store answers)",
                    why);
    r->failing = 1;
    snprintf(r->why, sizeof(r->why), "%s", why);
    r->dirty = 1; /* rewrite everything once it answers */
    r->written_known = 0;
    json_object_clear(r->gens);
    json_array_clear(r->rows);
    sl_controller_set_peers(r->ctl, NULL, NULL, r->why);
}

static void tick(sl_replicas_t *r)
{
    char err[600];
    r->last_ms = mono_ms();
    char *rows = NULL, *gone = NULL;
    json_t *next = NULL;
    int full = r->dirty && !r->written_known;
    if (r->dirty && changes(r, full, &rows, &gone, &next) != 0) {
        fail(r, "out of memory");
        return;
    }
    json_t *removed = json_object();
    int rc = sl_store_replica_publish(r->store, r->name, rows, gone, full, r->timeout_ms, removed,
                                      err, sizeof(err));
    if (rc == 1) {
        /* Another replica removed ours with its rows (this one was cut off
         * longer than the timeout): write them all again. */
        free(rows);
        free(gone);
        json_decref(next);
        if (changes(r, 1, &rows, &gone, &next) != 0) {
            json_decref(removed);
            fail(r, "out of memory");
            return;
        }
        rc = sl_store_replica_publish(r->store, r->name, rows, NULL, 1, r->timeout_ms, removed, err,
                                      sizeof(err));
    }
    free(rows);
    free(gone);
    if (rc != 0) {
        json_decref(next);
        json_decref(removed);
        fail(r, err);
        return;
    }
    if (next) {
        json_decref(r->written);
        r->written = next;
        r->written_known = 1;
        r->dirty = 0;
    }
    const char *name;
    json_t *v;
    json_object_foreach(removed, name, v)
    {
        sl_log_notice("replicas: controller replica %s had no heartbeat for %" PRIu64
                      " ms: removed with its %" JSON_INTEGER_FORMAT " runtime record(s)",
                      name, r->timeout_ms, json_integer_value(v));
    }
    json_decref(removed);
    json_t *live = json_object();
    if (sl_store_replica_read(r->store, r->name, r->timeout_ms, live, NULL, err, sizeof(err)) !=
        0) {
        json_decref(live);
        fail(r, err);
        return;
    }
    json_t *others = json_deep_copy(live);
    json_object_del(others, r->name);
    int changed = !r->synced || r->failing || !json_equal(others, r->gens);
    if (changed) {
        json_t *fresh = json_array();
        if (sl_store_replica_read(r->store, r->name, r->timeout_ms, NULL, fresh, err,
                                  sizeof(err)) != 0) {
            json_decref(fresh);
            json_decref(others);
            json_decref(live);
            fail(r, err);
            return;
        }
        json_decref(r->rows);
        r->rows = fresh;
        json_decref(r->gens);
        r->gens = json_incref(others);
        if (r->failing)
            sl_log_notice("replicas: the store answers again: status reads count the runtimes "
                          "of every live replica");
        r->failing = 0;
        r->synced = 1;
        r->why[0] = '\0';
        /* This replica is live whatever the store's clock said. */
        json_object_set_new(live, r->name, json_integer(0));
        sl_controller_set_peers(r->ctl, r->rows, live, NULL);
    }
    json_decref(others);
    json_decref(live);
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sl_replicas_t *r = arg;
    tick(r);
    schedule(r, SL_REPLICAS_HEARTBEAT_MS);
}

/* A runtime connected, disconnected, ACKed or NACKed: written with the
 * next tick, brought forward to COALESCE_MS when the last was a heartbeat
 * ago. */
static void runtimes_changed(void *arg)
{
    sl_replicas_t *r = arg;
    r->dirty = 1;
    uint64_t now = mono_ms();
    uint64_t at = r->last_ms + SL_REPLICAS_HEARTBEAT_MS;
    if (at < now + COALESCE_MS)
        at = now + COALESCE_MS;
    if (at < r->due_ms)
        schedule(r, at - now);
}

static void default_name(char *out, size_t len)
{
    char host[200] = "controller";
    if (gethostname(host, sizeof(host) - 1) != 0 || !host[0])
        snprintf(host, sizeof(host), "controller");
    host[sizeof(host) - 1] = '\0';
    unsigned rnd = (unsigned)time(NULL) ^ (unsigned)getpid();
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &rnd, sizeof(rnd)) != (ssize_t)sizeof(rnd))
            rnd ^= (unsigned)clock();
        close(fd);
    }
    snprintf(out, len, "%s-%d-%04x", host, (int)getpid(), rnd & 0xffff);
}

sl_replicas_t *sl_replicas_start(struct event_base *base, sl_store_t *store, sl_controller_t *ctl,
                                 const char *name, uint64_t timeout_ms)
{
    sl_replicas_t *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->base = base;
    r->store = store;
    r->ctl = ctl;
    r->timeout_ms = timeout_ms;
    r->dirty = 1;
    r->written = json_object();
    r->gens = json_object();
    r->rows = json_array();
    r->tick_ev = evtimer_new(base, tick_cb, r);
    if (!r->gens || !r->rows || !r->tick_ev) {
        sl_replicas_stop(r);
        return NULL;
    }
    if (name && name[0])
        snprintf(r->name, sizeof(r->name), "%s", name);
    else
        default_name(r->name, sizeof(r->name));
    sl_controller_set_replica(ctl, r->name, runtimes_changed, r);
    sl_log_notice("replicas: this controller is replica %s of store %s (heartbeat every %d ms, "
                  "a replica without one for %" PRIu64 " ms is gone)",
                  r->name, sl_store_name(store), SL_REPLICAS_HEARTBEAT_MS, timeout_ms);
    tick(r);
    schedule(r, SL_REPLICAS_HEARTBEAT_MS);
    return r;
}

void sl_replicas_stop(sl_replicas_t *r)
{
    if (!r)
        return;
    if (r->tick_ev) {
        event_free(r->tick_ev);
        sl_controller_set_replica(r->ctl, NULL, NULL, NULL);
        if (sl_store_replica_leave(r->store, r->name) != 0)
            sl_log_warn("replicas: could not remove replica %s's rows: the other replicas stop "
                        "counting its runtimes after %" PRIu64 " ms",
                        r->name, r->timeout_ms);
    }
    json_decref(r->written);
    json_decref(r->gens);
    json_decref(r->rows);
    free(r);
}
