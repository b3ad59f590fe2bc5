/*
 * A route's policy chain, built with its generation (policy.h): each
 * policy's compiled state and `when` condition, sorted by phase (stable:
 * the written order holds within a phase). Immutable once built; shared by
 * every worker.
 */
#ifndef SL_POLICY_CHAIN_H
#define SL_POLICY_CHAIN_H

#include "policy.h"
#include "sluice/v1/snapshot.pb-c.h"

typedef struct sl_policy_chain sl_policy_chain_t;

/* NULL with the reason in err ("policy rate-limit: ...") when a policy
 * cannot be compiled: the caller then fails the route closed. n == 0 gives
 * NULL with err empty (no chain). */
sl_policy_chain_t *sl_policy_chain_build(Sluice__V1__Policy *const *ps, size_t n,
                                         const sl_policy_env_t *env, char *err, size_t errlen);
void sl_policy_chain_free(sl_policy_chain_t *ch);

/* Runs the request hooks in phase order. SL_POLICY_CONTINUE, or
 * SL_POLICY_REPLY with *reply filled and req->rejected_by set. */
int sl_policy_chain_request(const sl_policy_chain_t *ch, sl_policy_req_t *req,
                            sl_policy_reply_t *reply);

/* Runs the body hooks of the entries that asked for the body
 * (req->body_entries), in chain order, on the whole body. Same results as
 * sl_policy_chain_request. */
int sl_policy_chain_body(const sl_policy_chain_t *ch, sl_policy_req_t *req, const char *body,
                         size_t len, sl_policy_reply_t *reply);

/* Runs the response hooks (header edits) for a response of `status`,
 * whether the upstream's or the gateway's own. */
void sl_policy_chain_response(const sl_policy_chain_t *ch, sl_policy_req_t *req, int status);

/* The chain's entries in run order (phase order): for per-policy stats. */
size_t sl_policy_chain_len(const sl_policy_chain_t *ch);
const char *sl_policy_chain_name(const sl_policy_chain_t *ch, size_t i);
/* The entry's metric scope (sl_policy_def_t.metric_scope), NULL for none. */
const char *sl_policy_chain_scope(const sl_policy_chain_t *ch, size_t i);

/* Whether the chain has the policy `name` (request.c: a CORS preflight
 * for a method the path has is routed to a chain with cors). */
int sl_policy_chain_has(const sl_policy_chain_t *ch, const char *name);

/* Whether any policy of the chain has a response hook. */
int sl_policy_chain_has_response(const sl_policy_chain_t *ch);

#endif
