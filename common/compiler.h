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

/*
 * The per-resource compile cache (the controller's incremental compile).
 *
 * sl_compile_cached compiles the same fleet as sl_compile_snapshot, with the
 * same errors in the same order, but keeps each Backend's, Api's and
 * Consumer's compiled form packed (sl_cres_t) in `cache`, keyed by the
 * document's content hash (sl_resource_hash), the fleet's GatewaySettings
 * (which carry every Gateway default a table or cluster inherits) and every
 * other resource its compile looked up (recorded as it ran: a Backend an
 * Api names, a Certificate a Backend names, present or not, with its content
 * hash). A resource whose key is unchanged is not compiled again: its packed
 * bytes, content hash and errors are reused. Packing each resource on its
 * own gives the bytes type_resources would get from sl_compile_snapshot's
 * snapshot (tests/unit/common/test_ccache.c checks it after random edits).
 */
typedef struct sl_cres {
    unsigned refs;
    char *name;    /* the message's name ("ns/name") */
    uint8_t *data; /* the packed message (Cluster, RouteTable, Consumer, ...) */
    size_t len;
    uint64_t hash; /* FNV-1a 64 over name, NUL, data: the delta version */
} sl_cres_t;

/* A new compiled resource from a message (packed), refs 1; NULL when out of memory. */
sl_cres_t *sl_cres_from_message(const char *name, const ProtobufCMessage *msg);
sl_cres_t *sl_cres_ref(sl_cres_t *r);
void sl_cres_unref(sl_cres_t *r);

typedef struct sl_ccache sl_ccache_t;
sl_ccache_t *sl_ccache_new(void);
void sl_ccache_free(sl_ccache_t *cache);
/* Drops the entries no sl_compile_cached call used since the last sweep
 * (resources deleted, or left out of every round). */
void sl_ccache_sweep(sl_ccache_t *cache);
/* Entries held (for tests). */
size_t sl_ccache_size(const sl_ccache_t *cache);

enum { SL_CRES_CLUSTER = 0, SL_CRES_ROUTE, SL_CRES_CONSUMER, SL_CRES__COUNT };

typedef struct {
    /* settings, listeners and certificates (compiled every time: they
     * depend on every Gateway of the fleet); no clusters, route tables or
     * consumers, which are res[] (in set order, as in the snapshot). */
    Sluice__V1__Snapshot *snap;
    sl_cres_t **res[SL_CRES__COUNT];
    size_t n[SL_CRES__COUNT];
    /* Resources compiled by this call (cache misses). */
    size_t compiled;
} sl_compiled_t;

/* 0 and *out filled (free with sl_compiled_free), or -1 with the errors
 * sl_compile_snapshot would give (out->compiled is set either way). */
int sl_compile_cached(const sl_resource_set_t *set, const char *fleet, sl_ccache_t *cache,
                      sl_compiled_t *out, sl_errors_t *errs);
void sl_compiled_free(sl_compiled_t *out);

#endif
