/*
 * The CustomResourceDefinitions of the five kinds (group gateway.sluice.dev,
 * version v1alpha1), generated from the model's own validation tables
 * (common/validate_spec.c), so that what `kubectl apply` checks against and
 * what the controller accepts come from one source. Written to
 * helm/sluice/crds/ by `sluice-controller --print-crds`.
 */
#ifndef SL_CRD_H
#define SL_CRD_H

#include <jansson.h>
#include <stddef.h>

#define SL_CRD_GROUP "gateway.sluice.dev"
#define SL_CRD_VERSION "v1alpha1"

/* A JSON array of the five CRDs, or NULL with the reason in err (a check
 * function of the tables that has no OpenAPI description). */
json_t *sl_crd_all(char *err, size_t errlen);

#endif
