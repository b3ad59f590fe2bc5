/*
 * Decoded resources shared between the config stream's held set and the
 * generations built from it, by reference count (issue 14, "the runtime
 * rebuilds only what changed").
 *
 * The config stream (xds.c) holds one decoded message per resource. A
 * generation used to get a deep copy of all of them (pack + unpack of the
 * whole snapshot per change); now its snapshot is a "shell": a Snapshot whose
 * arrays point at the held messages themselves, each referenced once more
 * here. So an unchanged resource is the same pointer in two generations, which
 * is how a generation recognizes what it can share with the previous one
 * (generation.c, "Sharing").
 *
 * A message nobody referenced through sl_pbshare_ref has no entry and a
 * single owner: sl_pbshare_unref frees it at once. Thread-safe (one mutex):
 * generations are freed on liburcu's call_rcu thread. Never on the request
 * path. Messages are never written once shared.
 */
#ifndef SL_PBSHARE_H
#define SL_PBSHARE_H

#include "sluice/v1/snapshot.pb-c.h"

#include <stddef.h>

/* One more owner of m (m's current owner keeps its own reference). */
void sl_pbshare_ref(ProtobufCMessage *m);

/* Drops one owner; the last one frees m (protobuf_c_message_free_unpacked). */
void sl_pbshare_unref(ProtobufCMessage *m);

/* A shell snapshot: a new Snapshot with the version and fleet of `view` whose
 * resource arrays point at view's messages, each referenced once. NULL when
 * out of memory. Free it with sl_pbshare_snapshot_free. */
Sluice__V1__Snapshot *sl_pbshare_snapshot(const Sluice__V1__Snapshot *view);

/* Frees a snapshot: a shell drops its references, any other snapshot is freed
 * as a whole (sl_snapshot_free). NULL is ignored. */
void sl_pbshare_snapshot_free(Sluice__V1__Snapshot *snap);

/* Owners of m counted here (0: no entry, one owner or none). Tests. */
long sl_pbshare_refs(const void *m);

#endif
