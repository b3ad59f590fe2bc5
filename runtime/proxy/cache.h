/*
 * The response cache on the request path (docs/policies/cache.md): what
 * the runtime does with the cache policy's ask (policies/cache/
 * cache_policy.h) once the chain has run, for HTTP/1.1 and HTTP/2 clients
 * and upstreams alike, through the exchange (exchange.h):
 *
 *   lookup   at sl_exchange_start: a fresh entry is a hit, served through
 *            the exchange's ops as if an upstream had sent it (the codec
 *            writes it in its own framing, the chain's response hooks run,
 *            X-Cache: HIT and Age are added) with no upstream at all;
 *   coalesce a miss for a key another request is already fetching parks
 *            (phase SL_XP_CACHE_WAIT; no thread blocks) until that fill
 *            ends: the leader's worker posts a wake-up to the waiter's
 *            worker (sl_worker_post), which looks again and serves the new
 *            entry, or goes upstream itself when nothing was stored. A
 *            waiter never waits past coalesceTimeout (then it goes
 *            upstream) nor past its request's deadline;
 *   capture  a miss that may be stored copies the upstream's response as
 *            it streams to the client: the head when it arrives (decided
 *            storable or not right then: a response that is not ends the
 *            fill at once, so waiters do not wait for its body), the body
 *            as payload (chunked framing removed) up to maxEntryBytes, and
 *            stores it when the response is complete. A response cut, too
 *            large or failed is never stored.
 *
 * Parked requests are found by token (a slot index and a sequence number in
 * a per-worker table), never by a pointer another thread kept, so a
 * wake-up for a request that ended meanwhile is ignored.
 *
 * Worker-thread only (the store has the locks). Not here: the key and the
 * request's directives (the policy), the memory (cache_store.c).
 */
#ifndef SL_CACHE_H
#define SL_CACHE_H

#include "exchange.h"

/* At sl_exchange_start for a request the cache policy asked about:
 * SL_DONE when the cache answered or parked it, SL_DECLINED when the
 * exchange goes upstream (capturing the response when it may be stored). */
int sl_cache_start(sl_exchange_t *x);

/* The client drained a hit's bytes: 1 when the cache serves x (and went
 * on), 0 when x is not a hit. */
int sl_cache_resume(sl_exchange_t *x);

/* The codec's timer fired while x waited for another request's fill. */
void sl_cache_wait_timeout(sl_exchange_t *x);

/* The upstream's final response head, its body bytes as they reach the
 * client's buffer (framed as x->resp_body says), and its end (complete). */
void sl_cache_capture_head(sl_exchange_t *x, const sl_http1_response_t *resp);
void sl_cache_capture_body(sl_exchange_t *x, const char *p, size_t n);
void sl_cache_capture_end(sl_exchange_t *x);

/* Ends the request's part in the cache: a parked request leaves its slot,
 * a fill it leads ends (waking its waiters), a hit's entry is released.
 * Idempotent; called before the request lets go of its generation. */
void sl_cache_request_end(sl_request_t *r);

#endif
