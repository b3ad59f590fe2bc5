/*
 * What the controller's two resource APIs (rest.c under /api/v1 and the
 * Kubernetes-compatible kapi.c under /apis/gateway.sluice.dev) share about
 * an object once it is stored: how it is shown (the Certificate view, the
 * status), when a write changes nothing, and what follows a durable write.
 * One place, so that the two APIs cannot drift apart.
 *
 * Status rule: an object whose status was written through the Kubernetes
 * /status subresource (sl_store_put_status) is served with that status; any
 * other object is served with the status the controller computed.
 *
 * Main thread only, like the store and the core.
 */
#ifndef SL_OBJECTS_H
#define SL_OBJECTS_H

#include "controller.h"

#include <jansson.h>
#include <stdbool.h>

/* The public view of a document, in place: a Certificate loses
 * spec.privateKey and gains status.certificate facts and an Expiring
 * condition; a list ({"items": [...]}) gets it for each item. */
void sl_objects_public_view(json_t *doc);

/* Sets obj's status to the controller's computed status unless obj carries
 * a written one (see above). ctl may be NULL. Returns obj. */
json_t *sl_objects_with_status(sl_controller_t *ctl, json_t *obj);

/* Whether the fields a user controls (everything but status and the
 * server-set metadata) are equal: a write that changes none of them is a
 * no-op (no new resourceVersion, no recompile), as in Kubernetes. */
bool sl_objects_same_user_fields(json_t *a, json_t *b);

struct evbuffer;
struct evhttp_request;
/* "Not Found" for 404... ("Error" when unknown). */
const char *sl_objects_reason(int status);
/* Sends a reply with this body (copied; NULL = empty) and counts it for
 * /metrics; a HEAD gets the headers of the GET and no body. */
void sl_objects_send(struct evhttp_request *req, int status, const char *content_type,
                     struct evbuffer *body);

/* After a successful durable write: counts it and tells the core (ctl may
 * be NULL). */
void sl_objects_written(sl_controller_t *ctl);

#endif
