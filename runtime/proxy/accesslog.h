/*
 * Access log: one line per request, JSON lines or combined format, to a file
 * or stdout. Workers format into their own bounded ring (no lock, no system
 * call); a writer thread drains the rings and does the I/O, so a slow disk
 * never blocks a worker. When a ring is full the line is dropped and counted
 * (sluice_accesslog_dropped_total) rather than stalling traffic.
 */
#ifndef SL_ACCESSLOG_H
#define SL_ACCESSLOG_H

#include "sl_types.h"

#include <stdint.h>

enum sl_accesslog_format { SL_ACCESSLOG_JSON = 0, SL_ACCESSLOG_COMBINED };

typedef struct {
    uint64_t start_unix_us;    /* request start, wall clock */
    uint64_t duration_us;
    sl_str_t client_addr;      /* "1.2.3.4" */
    sl_str_t method;
    sl_str_t path;             /* as received, with query */
    int minor_version;         /* HTTP/1.x: x; -1 for HTTP/2 */
    int status;
    uint64_t bytes_received;   /* request body bytes */
    uint64_t bytes_sent;       /* response bytes incl. head */
    sl_str_t request_id;
    sl_str_t api;              /* "" when unrouted */
    sl_str_t operation;
    sl_str_t upstream_addr;    /* "127.0.0.1:9001" or "" */
    sl_str_t user_agent;
    sl_str_t referer;
    sl_str_t host;
    sl_str_t error_code;       /* gateway error code ("no_route") or "" */
    sl_str_t consumer;         /* the authenticated Consumer, or "" */
    sl_str_t policy;           /* the policy that answered the request itself, or "" */
    sl_str_t cache;            /* what the response cache did: "HIT", "MISS", ... or "" */
} sl_accesslog_entry_t;

/* target: a file path (appended to, created 0640), "stdout", or "off".
 * Starts the writer thread. Returns 0, or -1 with err set. */
int sl_accesslog_open(const char *target, enum sl_accesslog_format fmt, unsigned nworkers,
                      char *err, size_t errlen);
int sl_accesslog_enabled(void);
/* Worker `worker` logs one entry; never blocks. */
void sl_accesslog_write(unsigned worker, const sl_accesslog_entry_t *e);
/* Reopen the file (log rotation, SIGUSR1). Any thread. */
void sl_accesslog_reopen(void);
/* Flushes everything written so far and stops the writer thread. */
void sl_accesslog_close(void);
uint64_t sl_accesslog_dropped(void);

#endif
