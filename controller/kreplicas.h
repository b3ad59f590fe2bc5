/*
 * The Programmed condition of an Api or a Gateway when several controller
 * replicas run on one Kubernetes API server (--source kubernetes), each
 * serving the runtimes connected to it.
 *
 * Each replica writes its own counts under status.replicas.<its pod name>
 * ({"fleets": [...], "programmed": {status, reason, message,
 * observedGeneration}}); a JSON merge patch of the status touches only that
 * member, so replicas never overwrite each other's counts. status.fleets
 * and the Programmed condition are then computed from the entries of every
 * live replica (the ready endpoints of the controllers' Service) by a
 * function of those entries alone, so every replica computes the same and
 * they do not write in turn; entries of replicas that are gone are removed
 * (null in the patch).
 */
#ifndef SL_KREPLICAS_H
#define SL_KREPLICAS_H

#include <jansson.h>
#include <stdbool.h>

/*
 * own: this replica's status of the object (core.c: conditions Accepted
 * and Programmed, fleets, ...; borrowed). server: the status the API server
 * holds (borrowed, NULL or not an object when none). me: this replica's
 * name. live: object whose keys are the live replicas' names (borrowed; me
 * counts as live in any case). Returns the status to merge-patch (new
 * reference): own with status.replicas.<me>, null for the entries of
 * replicas not live, and fleets and Programmed over every live entry.
 * Objects without a Programmed condition come back as own.
 */
json_t *sl_kreplicas_status(json_t *own, json_t *server, const char *me, json_t *live);

/* Whether merge-patching `patch` into `server` (a status, either may be
 * NULL) changes nothing. */
bool sl_kreplicas_unchanged(json_t *server, json_t *patch);

/* Live replica names from an EndpointSliceList (discovery.k8s.io/v1):
 * endpoints whose conditions.ready is not false, by targetRef.name (a
 * Pod), into `live` (an object used as a set). Returns how many. */
size_t sl_kreplicas_from_slices(json_t *list, json_t *live);

#endif
