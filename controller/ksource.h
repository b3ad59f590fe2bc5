/*
 * `--source kubernetes`: the Kubernetes API server is the store. The
 * resources are the custom resources of group gateway.sluice.dev/v1alpha1
 * (helm/sluice/crds/), read the way client-go's informers read them:
 *
 *   - one thread per kind (gateways, apis, backends, consumers,
 *     certificates) LISTs the kind, remembers the list's
 *     metadata.resourceVersion, then WATCHes from it
 *     (?watch=true&resourceVersion=RV&allowWatchBookmarks=true
 *     &timeoutSeconds=~300). ADDED / MODIFIED / DELETED events go to the
 *     main thread; a BOOKMARK only moves RV; an ERROR event with code 410
 *     (or an HTTP 410) means RV is too old: list again. A watch that ends
 *     (timeoutSeconds) resumes from RV at once; a dropped connection or a
 *     server that is down is retried from RV with exponential backoff and
 *     jitter (0.5 s doubling to 30 s). Every failure is logged once per
 *     cause, and its end ("watch of apis resumed") once.
 *   - the main thread keeps a cache per kind (namespace/name -> object),
 *     and once every kind has been listed, rebuilds the resource set after
 *     each change that is more than a status or a resourceVersion: every
 *     object is validated with the model library, as --resources files
 *     are; an invalid object is left out with an Accepted=False status and
 *     never stops the others. The core compiles it (core.h:
 *     sl_controller_use_input) with versions derived from the input.
 *   - the Secrets that Certificates name (spec.secretRef, type
 *     kubernetes.io/tls) are listed+watched one by one, by
 *     fieldSelector=metadata.name=NAME in their namespace, each on a thread
 *     started when a Certificate comes to name it and stopped when none
 *     does; a rebuild hands the compiler such a Certificate with the
 *     Secret's tls.crt/tls.key as inline PEM, or leaves it out with
 *     Accepted=False and a reason (SecretNotFound, InvalidSecret,
 *     SecretUnreadable, RefNotPermitted). Why per name, and how versions
 *     count Secrets: ksource.c, "Secrets that Certificates name".
 *   - after every compile, and every few seconds for Programmed, each
 *     object's status (sl_controller_object_status) that differs from
 *     what the API server holds and from what was last written is PATCHed
 *     to .../NAME/status (application/merge-patch+json {"status":...}) by a
 *     writer thread; failures are retried with backoff (the newest status
 *     wins), logged once per cause.
 *
 * Threads block in common/httpc.c with the stop pipe as their cancel fd,
 * so stopping never waits for a network timeout.
 *
 * Not here: where the server is and how to authenticate (kubeconfig.h).
 */
#ifndef SL_KSOURCE_H
#define SL_KSOURCE_H

#include "controller.h"
#include "kubeconfig.h"

#include <jansson.h>
#include <stdint.h>

struct event_base;
typedef struct sl_ksource sl_ksource_t;

/* Starts the watchers and the status writer. kc is taken (freed by
 * sl_ksource_stop, also on failure); ns NULL = every namespace. NULL with
 * err when a thread or the client cannot be set up. */
sl_ksource_t *sl_ksource_start(struct event_base *base, sl_controller_t *ctl, sl_kubeconfig_t *kc,
                               const char *ns, char *err, size_t errlen);

/* The resources as last rebuilt, as written (a secretRef Certificate
 * without its Secret's PEM): stable for the source's life (its content
 * changes on the main thread), for the read-only REST API. */
const sl_resource_set_t *sl_ksource_set(sl_ksource_t *ks);

/* For /readyz (sl_rest_options_t.is_ready, ctx = the source): ready once
 * every kind was listed and the core is ready. */
int sl_ksource_ready(void *ks, char *why, size_t whylen);

/* Stops the threads (at once: their waits are cancelled) and frees. */
void sl_ksource_stop(sl_ksource_t *ks);

#endif
