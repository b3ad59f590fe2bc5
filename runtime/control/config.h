/*
 * Applying configuration on the main thread: snapshot -> generation ->
 * listener diff -> publish. Shared by the file source (SIGHUP reload) and,
 * later, the controller stream. A snapshot that cannot be applied in full
 * (bad regex, port taken) changes nothing: the old generation keeps serving.
 */
#ifndef SL_CONFIG_H
#define SL_CONFIG_H

#include "generation.h"
#include "worker.h"

typedef struct sl_config sl_config_t;

sl_config_t *sl_config_new(sl_worker_t *workers, unsigned nworkers);

/* Refuse snapshots with more routes than this (0 = no limit). */
void sl_config_set_max_routes(sl_config_t *cfg, uint64_t max_routes);

/* Called on the main thread after every successful sl_config_apply,
 * whoever applied it (files, the controller stream, the --cache-dir
 * snapshot), once the new generation is published: what follows the
 * active config (health checks) hangs here, so no source can forget it. */
typedef void (*sl_config_applied_fn)(void *arg);
void sl_config_on_applied(sl_config_t *cfg, sl_config_applied_fn fn, void *arg);

/* Checks a snapshot against the runtime's limits. 0, or -1 with err. */
int sl_config_check(const sl_config_t *cfg, const Sluice__V1__Snapshot *snap, char *err,
                    size_t errlen);

/* Takes ownership of snap. Returns 0, or -1 with the reason in err. */
int sl_config_apply(sl_config_t *cfg, Sluice__V1__Snapshot *snap, const char *source, char *err,
                    size_t errlen);

/* 1 when a generation is published and at least one listener is open. */
int sl_config_ready(const sl_config_t *cfg);

/* Version of the active generation, 0 before the first. */
uint64_t sl_config_version(const sl_config_t *cfg);

/* Closes every listener socket the main thread still holds a copy of and
 * retires the active generation (shutdown). */
void sl_config_free(sl_config_t *cfg);

#endif
