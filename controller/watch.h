/*
 * Watches on the controller's resources, the way the Kubernetes API server
 * serves them (`GET ...?watch=true&resourceVersion=RV`), for the
 * Kubernetes-compatible API (kapi.c) and so for `kubectl get -w` and the
 * `--source kubernetes` client pointed at a controller.
 *
 * The store reports every durable write (sl_store_set_observer); the hub
 * keeps the last `history` events in memory, in resourceVersion order, and
 * streams them to every open watch whose filter they pass, as one JSON
 * object per line ({"type":"ADDED|MODIFIED|DELETED|BOOKMARK|ERROR",
 * "object":...}) in a chunked response that stays open.
 *
 * resourceVersion semantics (as the API server's):
 *   - "" or "0": first a synthetic ADDED for each object of `initial`
 *     (the current state, as the caller lists it), then every later change;
 *   - "N": every change with a resourceVersion > N; when N is older than the
 *     oldest event kept, a single ERROR event carrying a Status with code
 *     410, reason "Expired" ("too old resource version: N (M)"), then the
 *     response ends: the client relists.
 * With allowWatchBookmarks, a BOOKMARK event (an object of the watched kind
 * with only metadata.resourceVersion) at least every `bookmark_seconds`
 * while nothing else is sent, so a quiet watch can resume without a relist.
 * timeoutSeconds ends the response cleanly after that long; a client that
 * goes away or stops reading is dropped (its output is bounded), never
 * blocking the controller's main thread.
 *
 * Main thread only, like the store and the REST API.
 */
#ifndef SL_WATCH_H
#define SL_WATCH_H

#include "model.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct evhttp_request;
typedef struct sl_watch_hub sl_watch_hub_t;

/* Turns a stored document into what the client sees (apiVersion and kind
 * set, status merged in). Returns a new reference, or NULL to skip. */
typedef json_t *(*sl_watch_render_fn)(void *ctx, enum sl_kind kind, json_t *stored);
/* Whether an object (the rendered one) passes the watch's filters (label
 * selector, field selector on metadata.name). NULL filter = all. */
typedef bool (*sl_watch_match_fn)(void *ctx, json_t *rendered);

/* `first_rv`: the store's resourceVersion when the hub starts
 * (sl_store_resource_version): watches from any RV >= first_rv can be
 * served. `history`: events kept (0 = 4096). */
sl_watch_hub_t *sl_watch_hub_new(struct event_base *base, uint64_t first_rv, size_t history,
                                 sl_watch_render_fn render, void *render_ctx);
/* Ends every open watch (their responses are finished) and frees. */
void sl_watch_hub_free(sl_watch_hub_t *hub);

/* One durable change: type "ADDED", "MODIFIED" or "DELETED"; `obj` is the
 * stored document (for DELETED the last stored one, with
 * metadata.resourceVersion set to the deletion's). Borrowed. The event is
 * sent to the open watches before this returns (queued on their
 * connections). */
void sl_watch_publish(sl_watch_hub_t *hub, const char *type, enum sl_kind kind, json_t *obj);

/* sl_watch_publish with the store observer's signature (store.h), so that
 * main.c wires the two with sl_store_set_observer(st, sl_watch_observe, hub). */
void sl_watch_observe(void *hub, const char *type, enum sl_kind kind, json_t *obj);

typedef struct {
    enum sl_kind kind;
    const char *ns;               /* NULL = all namespaces */
    const char *resource_version; /* "" / NULL / "0" / "N" as above */
    bool bookmarks;               /* allowWatchBookmarks=true */
    unsigned timeout_seconds;     /* 0 = until the client goes away */
    unsigned bookmark_seconds;    /* 0 = the hub's (60 by default) */
    json_t *initial;              /* borrowed array of rendered objects, for RV "" / "0" */
    sl_watch_match_fn match;
    void *match_ctx;
    void (*match_free)(void *match_ctx); /* called when the watch ends; may be NULL */
} sl_watch_params_t;

/* Starts the response (200, Content-Type application/json, chunked) and
 * keeps it open. Returns 0; or -1 with err set and nothing sent (a bad
 * resourceVersion: the caller answers 400). On 0 the hub owns match_ctx
 * (match_free runs when the watch ends, at once after a 410); on -1 the
 * caller keeps it. The response carries Connection: close. */
int sl_watch_serve(sl_watch_hub_t *hub, struct evhttp_request *req, const sl_watch_params_t *p,
                   char *err, size_t errlen);

/* The bytes that may wait on one watch's connection before that watch is
 * dropped as a slow client (0 = the default, 16 MiB). For tests and tuning. */
void sl_watch_hub_set_max_output(sl_watch_hub_t *hub, size_t bytes);
/* How often a watch that asked for bookmarks gets one while nothing else
 * was sent to it, unless its params say (0 = 60 s, the Kubernetes API
 * server's period). */
void sl_watch_hub_set_bookmark_seconds(sl_watch_hub_t *hub, unsigned seconds);

/* Open watches (for /metrics and tests). */
size_t sl_watch_count(const sl_watch_hub_t *hub);

#endif
