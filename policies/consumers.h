/*
 * The Consumers of a generation, indexed for authentication policies: API
 * keys by the SHA-256 of the key, basic-auth users by name, JWT subjects by
 * (issuer, subject). Built once per generation from the snapshot (whose
 * strings it borrows: the snapshot outlives it), then read-only and shared
 * by every worker.
 *
 * An API key is looked up by its hash: what a lookup's time depends on is
 * the SHA-256 of the presented key, which tells an attacker nothing about
 * the stored ones; the final comparison of the 32 bytes takes the same
 * time wherever they differ.
 */
#ifndef SL_CONSUMERS_H
#define SL_CONSUMERS_H

#include "sl_types.h"
#include "sluice/v1/snapshot.pb-c.h"

#include <stdint.h>

typedef struct sl_consumer {
    const char *name;  /* namespace/name */
    const char *group; /* NULL = none */
} sl_consumer_t;

typedef struct sl_consumers sl_consumers_t;

/* NULL on out of memory. */
sl_consumers_t *sl_consumers_build(Sluice__V1__Consumer *const *cs, size_t n);
void sl_consumers_free(sl_consumers_t *c);

/* The consumer with an API key hashing to sha (and that key's name in
 * *credential), or NULL. */
const sl_consumer_t *sl_consumers_by_key(const sl_consumers_t *c, const uint8_t sha[32],
                                         const char **credential);
/* The consumer with basic-auth user `user` and its crypt(3) hash, or NULL. */
const sl_consumer_t *sl_consumers_by_user(const sl_consumers_t *c, sl_str_t user,
                                          const char **password_hash);
/* The consumer a JWT's (iss, sub) belongs to, or NULL. */
const sl_consumer_t *sl_consumers_by_jwt(const sl_consumers_t *c, sl_str_t iss, sl_str_t sub);

#endif
