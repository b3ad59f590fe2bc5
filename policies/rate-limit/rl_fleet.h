/*
 * The rate-limit policy's fleet mode: one budget for every runtime that
 * shares a Redis, without a round-trip per request.
 *
 * Fixed windows in Redis: a limit of L requests per period P counts in
 * `<prefix>:<scope>:<key>:<window>` (window = Unix time / P), which expires
 * with its window. A runtime does not ask Redis per request: it leases
 * tokens in batches (INCRBY by the lease size, in a Lua script that also
 * sets the expiry), keeps them in a slot of a lock-free table like the local
 * mode's, and asks for the next lease when half of one is left. Redis grants
 * what is left under L (the script's INCRBY result says how much), so the
 * fleet's total in a window never exceeds L plus the credit below, and
 * falls short of it by at most the tokens a runtime leased and did not use
 * before the window ended (at most one lease per runtime).
 *
 * Lease size: 1 for a key's first lease of a window, then doubling up to
 * max(1, L / 50) (slow start: a runtime that sees few requests of a key
 * leases about as many tokens as it spends). Credit: while a lease is on
 * its way, a
 * runtime admits up to one lease size on credit (the first request of a
 * window always does: its slot is empty), paid from the lease when it
 * arrives; beyond the credit it answers 429 with Retry-After 1. So with n
 * runtimes the total is within L ± n * L/50 (4% for two), and a runtime
 * that spent k tokens of a key in a window wasted at most about k.
 *
 * Threads: Redis is spoken to by one thread per policy table (its own
 * event_base, hiredis on libevent), never by a worker. Workers hand a
 * refill over by setting the slot's `want` word and writing an eventfd;
 * the thread scans the table for wanted slots. Redis down (refused,
 * closed, an error reply, or no reply within a second): `down` is set,
 * workers answer as the config says (fail open or 503), and the thread
 * reconnects every 500 ms; a connection is up once Redis answers PING.
 */
#ifndef SL_RL_FLEET_H
#define SL_RL_FLEET_H

#include "rl_table.h"

#include <stddef.h>
#include <stdint.h>

typedef struct sl_rl_fleet sl_rl_fleet_t;

typedef struct {
    uint64_t requests;
    uint64_t period_ms;
} sl_rl_fleet_limit_t;

typedef struct {
    const char *host; /* IP or name */
    int port;
    const char *password; /* NULL = none */
    int database;
    const char *prefix; /* Redis key prefix */
    uint64_t scope;     /* the policy config's hash: same config, same keys */
    size_t slots;       /* table size */
    int fail_open;      /* failOpen: until Redis first answers, take() says unavailable */
} sl_rl_fleet_conf_t;

/* Starts the Redis thread. NULL with err on failure. limits is copied. */
sl_rl_fleet_t *sl_rl_fleet_new(const sl_rl_fleet_conf_t *conf, const sl_rl_fleet_limit_t *limits,
                               size_t nlimits, char *err, size_t errlen);
/* Stops the thread (joins it) and frees the table. */
void sl_rl_fleet_free(sl_rl_fleet_t *f);

enum { SL_RL_FLEET_ADMIT = 0, SL_RL_FLEET_REJECT, SL_RL_FLEET_UNAVAILABLE };

/* One request of `key` (a hash that includes the limit) under limit
 * `limit`, at Unix time now_ms. Worker threads; never blocks. */
int sl_rl_fleet_take(sl_rl_fleet_t *f, unsigned limit, uint64_t key, uint64_t now_ms,
                     sl_rl_verdict_t *v);
/* Gives back one request taken in the same window. */
void sl_rl_fleet_refund(sl_rl_fleet_t *f, uint64_t key, uint64_t now_ms, unsigned limit);

#endif
