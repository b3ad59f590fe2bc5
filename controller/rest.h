/*
 * The controller's REST admin API (default 127.0.0.1:9090), served by
 * libevent's evhttp on the controller main thread's event_base:
 *
 *   /api/v1/{gateways,apis,backends,consumers,certificates}[/{name}]
 *   /api/v1/namespaces/{ns}/{plural}[/{name}]
 *       GET (list/get), POST (create), PUT (create or replace), DELETE
 *   /api/v1/resources        POST|PUT a whole multi-document file
 *   /api/v1/runtimes, /api/v1/status
 *   /healthz, /readyz, /metrics (never behind the token)
 *   /version, /api, /apis/..., /openapi/...: the Kubernetes-compatible API
 *       (kapi.h), behind the same token
 *
 * Every /api/ answer is JSON; errors are {"error":{"status","code","message"
 * [,"details":[{"field","message"}]]}}. docs/admin-api.md is the reference.
 * Writes go to the store (durable before the 2xx) and then call
 * sl_controller_changed once per successful write.
 */
#ifndef SL_REST_H
#define SL_REST_H

#include "controller.h"
#include "model.h"
#include "store.h"
#include "watch.h"

#include <stdbool.h>
#include <stddef.h>

struct event_base;
typedef struct sl_rest sl_rest_t;

/* Request bodies larger than this are refused with 413. */
#define SL_REST_DEFAULT_MAX_BODY_BYTES (8u * 1024u * 1024u)

typedef struct {
    /* Bearer token every /api/ request must carry (the content of
     * --admin-token-file, read by sl_bearer_load); NULL or "" = no auth.
     * Copied by sl_rest_start. */
    const char *admin_token;
    /* --insecure-admin: allow a non-loopback address without a token. */
    bool insecure;
    /* --resources (immutable GitOps mode): POST/PUT/DELETE answer 405. */
    bool read_only;
    /* In read_only mode, GETs answer from this set (the files given to
     * --resources) instead of the store. Borrowed: must outlive the API. */
    const sl_resource_set_t *static_set;
    /* Why writes are refused in read_only mode (NULL: the --resources
     * files' message), e.g. "the controller reads Kubernetes (--source
     * kubernetes): kubectl apply to the cluster instead". */
    const char *read_only_why;
    /* /readyz answers 200 when this returns non-zero; else 503 with the
     * reason it wrote to `why` (e.g. the store refuses to persist versions).
     * NULL = ready as soon as the API is started. */
    int (*is_ready)(void *ctx, char *why, size_t whylen);
    void *ready_ctx;
    /* 0 = SL_REST_DEFAULT_MAX_BODY_BYTES. */
    size_t max_body_bytes;
    /* --rest-tls-cert/--rest-tls-key: serve HTTPS (TLS 1.2 and 1.3) with
     * this PEM chain (leaf first) and key, as read and checked by
     * sl_tls_files_read_pair. Loaded into the API's SSL_CTX by
     * sl_rest_start, not kept. NULL = plain HTTP. */
    const char *tls_cert_pem, *tls_key_pem;
    /* Watches on the Kubernetes-compatible paths (kapi.h); borrowed, must
     * outlive the API. NULL = `watch=true` answers 405. */
    sl_watch_hub_t *watch_hub;
} sl_rest_options_t;

/*
 * Binds addr ("127.0.0.1:9090", "[::1]:9090", "0.0.0.0:9090") and serves the
 * API. st and ctl are borrowed and must outlive the returned object; st may
 * be NULL only in read_only mode with a static_set; ctl may be NULL (then
 * /api/v1/runtimes and /api/v1/status answer 503 and writes notify no one).
 * opt may be NULL (defaults). Refuses a non-loopback address without a token
 * unless opt->insecure. Returns NULL with err set, e.g. "--rest
 * 0.0.0.0:9090: refusing to serve the admin API on a non-loopback address
 * without --admin-token-file (or pass --insecure-admin)".
 */
sl_rest_t *sl_rest_start(struct event_base *base, const char *addr, sl_store_t *st,
                         sl_controller_t *ctl, const sl_rest_options_t *opt, char *err,
                         size_t errlen);
/* Port actually bound (useful with port 0), -1 if none. */
int sl_rest_port(const sl_rest_t *rest);
/* Closes the listener and every open admin connection. NULL is fine. */
void sl_rest_free(sl_rest_t *rest);

#endif
