/*
 * Compiler: a validated resource set -> the snapshot of one fleet (the
 * protobuf-c messages of proto/sluice/v1/snapshot.proto). Shared by the
 * controller and the standalone runtime, so both run the same compiled form.
 *
 * Applies defaults (documented in docs/configuration.md), resolves references
 * (an Api's backendRefs name Backends), and reports what cannot be compiled
 * with the same error format as validation, naming the referring field:
 * "petstore.yaml doc 3: spec.backendRefs[0].name: Backend 'echo' not found".
 */
#ifndef SL_COMPILER_H
#define SL_COMPILER_H

#include "model.h"
#include "sluice/v1/snapshot.pb-c.h"

#include <stdint.h>

/* Compiles every resource of `set` selected by `fleet` (Gateways whose
 * spec.fleet equals it, default "default"; Apis/Backends apply to every
 * fleet). Returns a snapshot allocated with malloc (free with
 * sl_snapshot_free), or NULL with errors appended. */
Sluice__V1__Snapshot *sl_compile_snapshot(const sl_resource_set_t *set, const char *fleet,
                                          uint64_t version, sl_errors_t *errs);

/* Frees a snapshot from sl_compile_snapshot or sl_snapshot_unpack (both
 * return protobuf-c unpacked form, so one free serves both). */
void sl_snapshot_free(Sluice__V1__Snapshot *snap);

/* Serialises / parses a snapshot (protobuf wire format). pack returns malloc'd
 * bytes; unpack returns NULL on malformed input. */
uint8_t *sl_snapshot_pack(const Sluice__V1__Snapshot *snap, size_t *len);
Sluice__V1__Snapshot *sl_snapshot_unpack(const uint8_t *data, size_t len);

#endif
