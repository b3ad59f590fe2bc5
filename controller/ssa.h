/*
 * Field ownership for the Kubernetes-compatible API (kapi.c): the
 * metadata.managedFields of server-side apply, as a cluster keeps them.
 *
 * Every write records which manager (the request's fieldManager, else the
 * User-Agent's product) set which fields, in FieldsV1 form. A server-side
 * apply then:
 *  - conflicts (409, unless force) when it would change a field another
 *    manager owns to another value;
 *  - removes the fields its manager applied last time and no longer
 *    applies, when no other manager owns them (so deleting a line from the
 *    applied file deletes the field, as on a cluster);
 *  - owns exactly the fields of the applied configuration afterwards.
 * Other writes (create, replace, merge and JSON patches) give their manager
 * the fields they changed and take those from every other manager.
 *
 * Fields are the user's: metadata.labels and metadata.annotations entry by
 * entry, and every field outside metadata, status, apiVersion and kind.
 * Objects are granular (each member its own field); lists are atomic, as
 * for a CRD without x-kubernetes-list-type (ours have none), so a list is
 * one field owned as a whole.
 */
#ifndef SL_SSA_H
#define SL_SSA_H

#include <jansson.h>
#include <stdbool.h>

/* API version recorded in the entries. */
#define SL_SSA_API_VERSION "gateway.sluice.dev/v1alpha1"

/*
 * Server-side apply of `applied` (borrowed) by `manager` onto `live`
 * (borrowed; NULL when the object does not exist yet). now: RFC 3339 time
 * for the entry. On success returns 0 and *out is the new object (a new
 * reference) with its managedFields. On a conflict without force returns 1
 * and *conflicts is a new array of {"manager", "field"} (field in
 * ".spec.basePath" form), *out NULL. -1 when an argument is unusable
 * (applied not an object).
 */
int sl_ssa_apply(json_t *live, json_t *applied, const char *manager, bool force, const char *now,
                 json_t **out, json_t **conflicts);

/*
 * Records an ordinary write of `obj` (the object about to be stored; its
 * metadata.managedFields are set here) over `old` (NULL for a create) by
 * `manager` at `now` (NULL: the current time). The entries start from obj's
 * own managedFields when the client sent some (an empty list resets them,
 * as on a cluster), else from old's.
 */
void sl_ssa_update(json_t *old, json_t *obj, const char *manager, const char *now);

/* The default manager of a request without fieldManager: the User-Agent
 * up to its first '/' ("kubectl"), else "unknown"; into out. */
void sl_ssa_default_manager(const char *user_agent, char *out, size_t len);

/* Whether a and b have the same managed field sets (ignoring entry times):
 * a write that changes neither the object nor ownership is no write. */
bool sl_ssa_same_ownership(json_t *a, json_t *b);

#endif
