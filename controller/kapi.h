/*
 * The Kubernetes-compatible API of the controller, so that `kubectl` (and
 * the `--source kubernetes` client) can be pointed at a controller without a
 * cluster. Served on the REST API's listener (rest.c owns the socket, TLS,
 * the bearer token and the body bound, and hands these paths over):
 *
 *   /version, /api, /apis, /apis/gateway.sluice.dev[/v1alpha1]   discovery
 *   /openapi/v3, /openapi/v3/apis/gateway.sluice.dev/v1alpha1      schemas
 *   /apis/gateway.sluice.dev/v1alpha1/[namespaces/{ns}/]{plural}[/{name}[/status]]
 *       GET (get, list, watch=true), POST, PUT, PATCH (merge, JSON patch,
 *       server-side apply), DELETE; dryRun=All, fieldValidation,
 *       labelSelector, fieldSelector, Table output.
 *
 * Objects are stored by store.c, validated by the model library, admitted
 * by the core and shown through objects.h, exactly as the /api/v1 API does:
 * only the wire format differs. Every error is a meta/v1 Status.
 * docs/admin-api.md ("Kubernetes-compatible API") is the reference.
 *
 * Main thread only, like the store and the REST API.
 */
#ifndef SL_KAPI_H
#define SL_KAPI_H

#include "controller.h"
#include "model.h"
#include "store.h"
#include "watch.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

struct evhttp_request;
typedef struct sl_kapi sl_kapi_t;

typedef struct {
    size_t max_body_bytes;               /* bodies over this: 413 Status */
    bool read_only;                      /* --resources: writes answer 405 */
    const sl_resource_set_t *static_set; /* read_only: reads come from here */
    sl_watch_hub_t *watch_hub;           /* NULL: watch=true answers 405 */
} sl_kapi_options_t;

/* st and ctl borrowed (st NULL only with a static_set; ctl may be NULL).
 * Builds the discovery and OpenAPI documents from the CRDs (crd.h) once.
 * NULL with err set. */
sl_kapi_t *sl_kapi_new(sl_store_t *st, sl_controller_t *ctl, const sl_kapi_options_t *opt,
                       char *err, size_t errlen);
void sl_kapi_free(sl_kapi_t *k);

/* Whether a request path is one of this API's (see above). */
bool sl_kapi_owns(const char *path);

/* Serves one request on an owned path (authenticated by the caller). */
void sl_kapi_handle(sl_kapi_t *k, struct evhttp_request *req);

/* Answers with a meta/v1 Status: code, reason ("Unauthorized", "NotFound"...)
 * and message. For the caller's own errors on owned paths (401, 403). */
void sl_kapi_reply_status(struct evhttp_request *req, int code, const char *reason, const char *fmt,
                          ...) __attribute__((format(printf, 4, 5)));

/* A stored document as this API serves it (apiVersion and kind, the status
 * rule of objects.h, the Certificate view): a new reference. ctl is the
 * sl_controller_t (may be NULL). Also the watch hub's render function. */
json_t *sl_kapi_render(void *ctl, enum sl_kind kind, json_t *stored);

#endif
