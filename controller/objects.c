/*
 * Shared views and write bookkeeping of the two resource APIs (objects.h).
 */
#include "objects.h"

#include "ctrl_metrics.h"
#include "tls_pem.h"

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

const char *sl_objects_reason(int status)
{
    switch (status) {
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 301:
        return "Moved Permanently";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 409:
        return "Conflict";
    case 412:
        return "Precondition Failed";
    case 413:
        return "Payload Too Large";
    case 422:
        return "Unprocessable Entity";
    case 415:
        return "Unsupported Media Type";
    case 500:
        return "Internal Server Error";
    case 503:
        return "Service Unavailable";
    default:
        return "Error";
    }
}

/* evhttp 2.1 writes the body of a HEAD response too; HEAD gets the headers
 * of the GET (Content-Length included) and no body, as RFC 9110 asks. */
void sl_objects_send(struct evhttp_request *req, int status, const char *content_type,
                     struct evbuffer *body)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", content_type);
    if (!evhttp_find_header(h, "Cache-Control"))
        evhttp_add_header(h, "Cache-Control", "no-store");
    sl_ctrl_count_rest(evhttp_request_get_command(req), status);
    if (evhttp_request_get_command(req) == EVHTTP_REQ_HEAD) {
        char len[32];
        snprintf(len, sizeof(len), "%zu", body ? evbuffer_get_length(body) : (size_t)0);
        evhttp_add_header(h, "Content-Length", len);
        evhttp_send_reply(req, status, sl_objects_reason(status), NULL);
        return;
    }
    evhttp_send_reply(req, status, sl_objects_reason(status), body);
}

/* Within this many seconds of notAfter a Certificate's status says Expiring. */
#define CERT_EXPIRING_S (30 * 86400)

/*
 * A Certificate as the API shows it: the private key is accepted on write
 * and never returned; status.certificate says what the certificate is
 * (subject, SANs, issuer, validity, SHA-256), with an Expiring condition
 * (status True) from 30 days before notAfter. File-based Certificates are
 * read by the runtimes, not here: their status has no certificate facts.
 */
static void certificate_view(json_t *obj)
{
    json_t *spec = json_object_get(obj, "spec");
    json_t *cv = json_object_get(spec, "certificate");
    json_object_del(spec, "privateKey");
    /* Ownership (ssa.h) names spec.privateKey: kept in the store for
     * server-side apply, never shown, so nothing that leaves the API
     * mentions the key. */
    json_object_del(json_object_get(obj, "metadata"), "managedFields");
    if (!json_is_string(cv))
        return;
    sl_pem_cert_t pc;
    sl_pem_field_t f;
    char msg[256];
    if (sl_pem_load(&pc, json_string_value(cv), json_string_length(cv), NULL, 0, 0, 0, &f, msg,
                    sizeof(msg)) != 0)
        return;
    char nb[32], na[32];
    sl_pem_format_time(pc.not_before_unix, nb, sizeof(nb));
    sl_pem_format_time(pc.not_after_unix, na, sizeof(na));
    json_t *sans = json_array();
    for (size_t i = 0; sans && i < pc.n_names; i++)
        json_array_append_new(sans, json_string(pc.names[i]));
    json_t *facts =
        json_pack("{s:s, s:o, s:s, s:s, s:s, s:s, s:s}", "subject", pc.subject, "dnsNames",
                  sans ? sans : json_array(), "issuer", pc.issuer, "notBefore", nb, "notAfter", na,
                  "sha256Fingerprint", pc.sha256_hex, "keyType", sl_pem_key_type_name(pc.key_type));
    json_t *status = json_object_get(obj, "status");
    if (!json_is_object(status)) {
        status = json_object();
        json_object_set_new(obj, "status", status);
    }
    if (facts && status)
        json_object_set_new(status, "certificate", facts);
    int64_t left = pc.not_after_unix - (int64_t)time(NULL);
    json_t *conds = json_object_get(status, "conditions");
    if (status && !json_is_array(conds)) {
        conds = json_array();
        json_object_set_new(status, "conditions", conds);
    }
    char text[160];
    if (left < 0)
        snprintf(text, sizeof(text), "expired at %s; runtimes refuse it: renew it", na);
    else
        snprintf(text, sizeof(text), "expires at %s, in %lld days", na, (long long)(left / 86400));
    json_array_append_new(conds, json_pack("{s:s, s:s, s:s, s:s}", "type", "Expiring", "status",
                                           left < CERT_EXPIRING_S ? "True" : "False", "reason",
                                           left < 0                 ? "Expired"
                                           : left < CERT_EXPIRING_S ? "ExpiresSoon"
                                                                    : "Valid",
                                           "message", text));
    sl_pem_free(&pc);
}

/* Every document that leaves the API passes here: a Certificate, or the
 * items of a list. */
void sl_objects_public_view(json_t *doc)
{
    if (!json_is_object(doc))
        return;
    const char *kind = json_string_value(json_object_get(doc, "kind"));
    if (kind && strcmp(kind, "Certificate") == 0)
        certificate_view(doc);
    json_t *items = json_object_get(doc, "items");
    size_t i;
    json_t *it;
    json_array_foreach(items, i, it)
    {
        const char *k = json_string_value(json_object_get(it, "kind"));
        if (k && strcmp(k, "Certificate") == 0)
            certificate_view(it);
    }
}

void sl_objects_written(sl_controller_t *ctl)
{
    atomic_fetch_add(&sl_ctrl_metrics.store_writes, 1);
    if (ctl)
        sl_controller_changed(ctl);
}

json_t *sl_objects_with_status(sl_controller_t *ctl, json_t *obj)
{
    if (!ctl || json_is_object(json_object_get(obj, "status")))
        return obj;
    enum sl_kind kind;
    json_t *meta = json_object_get(obj, "metadata");
    const char *name = json_string_value(json_object_get(meta, "name"));
    const char *ns = json_string_value(json_object_get(meta, "namespace"));
    if (!name || sl_kind_from_name(json_string_value(json_object_get(obj, "kind")), &kind) != 0)
        return obj;
    json_t *status = sl_controller_object_status(ctl, kind, ns ? ns : "default", name);
    if (status)
        json_object_set_new(obj, "status", status);
    return obj;
}

static json_t *user_view(json_t *obj)
{
    json_t *v = json_deep_copy(obj);
    if (!v)
        return NULL;
    json_object_del(v, "status");
    json_t *meta = json_object_get(v, "metadata");
    /* managedFields too: sl_ssa_same_ownership compares them without
     * their times. */
    static const char *const server[] = {"resourceVersion", "generation", "uid",
                                         "creationTimestamp", "managedFields"};
    for (size_t i = 0; i < sizeof(server) / sizeof(server[0]); i++)
        json_object_del(meta, server[i]);
    return v;
}

bool sl_objects_same_user_fields(json_t *a, json_t *b)
{
    json_t *x = user_view(a), *y = user_view(b);
    bool same = x && y && json_equal(x, y);
    json_decref(x);
    json_decref(y);
    return same;
}
