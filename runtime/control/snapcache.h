/*
 * The runtime's snapshot cache (--cache-dir): every snapshot applied from
 * the controller is written to DIR/snapshot.bin, so that a runtime that
 * restarts while no controller answers can serve the last config it had
 * instead of nothing.
 *
 * The file is a small fixed header (magic, format number, config version,
 * the time it was written, payload length, SHA-256 of the payload) and the
 * packed sluice.v1.Snapshot. It is written atomically (a temporary file,
 * fsync, rename, fsync of the directory) with mode 0600: snapshots hold TLS
 * private keys. Writes happen on a thread of their own, so the main thread
 * never waits for the disk; when snapshots come faster than the disk takes
 * them, only the newest is written.
 *
 * Loading refuses, with a reason, a file that is truncated, fails its
 * checksum, has another format number, does not decode, or belongs to
 * another fleet: the caller logs it and goes on without a cache.
 */
#ifndef SL_SNAPCACHE_H
#define SL_SNAPCACHE_H

#include "sluice/v1/snapshot.pb-c.h"

#include <stddef.h>
#include <stdint.h>

#define SL_SNAPCACHE_FILE "snapshot.bin"
#define SL_SNAPCACHE_FORMAT 1u

typedef struct sl_snapcache sl_snapcache_t;

/* Checks that DIR exists (creating it with mode 0700 if it does not) and
 * that a file can be written there, and starts the writer thread. NULL with
 * err naming the directory and the fix. */
sl_snapcache_t *sl_snapcache_open(const char *dir, char *err, size_t errlen);

/* Queues a packed Snapshot (copied) for writing. Main thread. */
void sl_snapcache_store(sl_snapcache_t *c, const uint8_t *packed, size_t len, uint64_t version);

/* Writes what is queued, stops the thread, frees. NULL is fine. */
void sl_snapcache_close(sl_snapcache_t *c);

/* Writes once, synchronously (the writer thread's work; also for tests).
 * 0, or -1 with err. */
int sl_snapcache_write_file(const char *dir, const uint8_t *packed, size_t len, uint64_t version,
                            char *err, size_t errlen);

/* Reads DIR/snapshot.bin. Returns the snapshot (free with
 * sl_snapshot_free) with its version and write time; NULL with err saying
 * why (no file: err says so and *absent is set to 1). `fleet` must match
 * the snapshot's. */
Sluice__V1__Snapshot *sl_snapcache_load(const char *dir, const char *fleet, uint64_t *version,
                                        uint64_t *written_unix_ms, int *absent, char *err,
                                        size_t errlen);

#endif
