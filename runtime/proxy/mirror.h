/*
 * Traffic mirroring (Api/operation `mirror: {backend, percent}`): a copy of
 * a share of requests goes to a shadow Backend, its response is read and
 * discarded, and the real request never waits for it nor fails with it.
 *
 * How: a worker copies what the copy needs (method, target, headers, the
 * body when it has it whole) into one allocation and pushes it onto its own
 * bounded single-producer ring (SL_MIRROR_RING entries); one mirror thread,
 * started with the first generation that mirrors, drains the rings and
 * sends each copy with the blocking client of common/httpc.h (a keep-alive
 * connection per shadow endpoint, a 1 s timeout). A full ring drops the
 * copy and counts it: a slow or dead shadow costs the real requests one
 * copy and one push each, never a wait.
 *
 * Not mirrored (counted as skipped): a request whose body streams (only
 * bodies read whole for a policy or a routing rule are at hand), copies
 * larger than SL_MIRROR_MAX_BYTES, shadow Backends with TLS.
 */
#ifndef SL_MIRROR_H
#define SL_MIRROR_H

#include "sl_types.h"

#include <stddef.h>
#include <stdint.h>

#define SL_MIRROR_RING 1024
#define SL_MIRROR_MAX_BYTES (256 * 1024)

enum { SL_MIRROR_SENT = 0, SL_MIRROR_FAILED, SL_MIRROR_DROPPED, SL_MIRROR_SKIPPED, SL_MIRROR__N };
extern const char *const sl_mirror_result_names[SL_MIRROR__N];

struct sl_request;
struct sl_req_head;

/* Main thread, when a generation that mirrors is built: starts the mirror
 * thread once (rings for nworkers workers). 0, or -1 with err. */
int sl_mirror_start(unsigned nworkers, char *err, size_t errlen);

/* Worker: a copy of the request's head (its forwarded path and query, the
 * head's headers but Host and the hop-by-hop ones) for the shadow endpoint
 * host_port ("address:port"), or NULL (counted as skipped: too large, out
 * of memory). The caller's until sl_mirror_push or sl_mirror_discard. */
struct sl_mirror_copy;
struct sl_mirror_copy *sl_mirror_prepare(const char *host_port, sl_str_t method, sl_str_t path,
                                         sl_str_t query, int has_query, const sl_str_t *hdr_names,
                                         const sl_str_t *hdr_values, size_t nhdr);
/* Worker: adds the body (when the request has one, read whole) and hands
 * the copy to the mirror thread through this worker's ring; drops and
 * counts it when the ring is full. The copy is no longer the caller's. */
void sl_mirror_push(unsigned worker, struct sl_mirror_copy *cp, const char *body, size_t body_len);
void sl_mirror_discard(struct sl_mirror_copy *cp);

/* Counts a request that was not mirrored (streamed body, too large). */
void sl_mirror_skip(void);

/* Totals by result, for /metrics. */
uint64_t sl_mirror_count(int result);

#endif
