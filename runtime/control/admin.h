/*
 * Runtime admin listener (default 127.0.0.1:9901), served by libevent's
 * evhttp on the main thread's event_base:
 *   GET /live         200 while the process runs
 *   GET /ready        200 when a generation is active and listeners are up, else 503
 *   GET /metrics      Prometheus text (metrics.h)
 *   GET /config_dump  the active snapshot as JSON (+ source/version/state)
 *   GET /clusters     every upstream endpoint by backend: active health
 *                     (healthy, last failure reason, consecutive counts)
 *                     and outlier ejection, as JSON
 * Not for the public: it binds loopback by default.
 */
#ifndef SL_ADMIN_H
#define SL_ADMIN_H

#include <jansson.h>

struct event_base;

typedef struct {
    int (*is_ready)(void *ctx);
    /* Optional: a line /ready adds to its body (e.g. serving a cached
     * config); nothing written = nothing added. */
    void (*ready_note)(void *ctx, char *buf, size_t len);
    /* New reference to a JSON object describing the active config; NULL = none. */
    json_t *(*config_dump)(void *ctx);
    void *ctx;
} sl_admin_hooks_t;

typedef struct sl_admin sl_admin_t;

/* addr: "127.0.0.1:9901", "[::1]:9901" or "off". Returns NULL with err set
 * (e.g. "admin 127.0.0.1:9901: address in use"). */
sl_admin_t *sl_admin_start(struct event_base *base, const char *addr, const sl_admin_hooks_t *hooks,
                           char *err, size_t errlen);
/* Replaces every credential in doc by "[redacted]" (an empty one stays
 * empty: nothing to hide): private keys, sink passwords and API keys,
 * Consumers' password hashes and API key digests, and inside each policy's
 * config_json what the policy declares secret (sl_policy_redact: e.g. the
 * jwt secret and inline JWKs' private members, a Redis password, set
 * Authorization headers). A config_json that does not parse is replaced
 * whole. /config_dump runs every document through it, whatever the hook
 * returned. */
void sl_admin_redact_secrets(json_t *doc);

/* --admin-token-file: from now on every path but /live, /ready and
 * /metrics needs "Authorization: Bearer <token>" (401 otherwise). Only a
 * digest is kept. NULL or "" = no token. */
void sl_admin_set_token(sl_admin_t *admin, const char *token);

/* Port actually bound (for ":0"). */
int sl_admin_port(const sl_admin_t *admin);
void sl_admin_free(sl_admin_t *admin);

#endif
