/*
 * The controller's side of the config stream protocol (controller/core.c,
 * included to reach its stream hooks and statics), driven request by
 * request over fake streams: the regressions of issue 7 at the unit level.
 * The same defects are tested end to end, from an independent gRPC peer, in
 * tests/integration/test_stream_controller.py.
 *
 * The fake stream (below) replaces stream.c: it decodes what the core sends
 * and records how the core closed it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../../../controller/core.c"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SENT 64

struct sl_stream {
    char peer[64];
    void *user;
    int closed;
    grpc_status_code code;
    char message[512];
    Sluice__V1__DiscoveryResponse *sent[MAX_SENT];
    int nsent, nread;
    /* the client certificate, as stream.c reads it under --stream-client-ca */
    int client_auth, has_cert, uses_cn;
    const char *names[4];
    int n_names;
    const char *fleet; /* the certificate's one fleet SAN; NULL = none */
};

void sl_stream_send(sl_stream_t *s, grpc_byte_buffer *bb)
{
    Sluice__V1__DiscoveryResponse *r = (Sluice__V1__DiscoveryResponse *)sl_grpc_unpack(
        &sluice__v1__discovery_response__descriptor, bb);
    grpc_byte_buffer_destroy(bb);
    assert_non_null(r);
    assert_true(s->nsent < MAX_SENT);
    s->sent[s->nsent++] = r;
}

void sl_stream_close(sl_stream_t *s, grpc_status_code code, const char *msg)
{
    if (s->closed)
        return;
    s->closed = 1;
    s->code = code;
    snprintf(s->message, sizeof(s->message), "%s", msg);
}

unsigned sl_stream_queued(const sl_stream_t *s)
{
    (void)s;
    return 0;
}

const char *sl_stream_peer(const sl_stream_t *s)
{
    return s->peer;
}

int sl_stream_client_auth(const sl_stream_t *s)
{
    return s->client_auth;
}

int sl_stream_peer_has_certificate(const sl_stream_t *s)
{
    return s->has_cert;
}

int sl_stream_peer_certificate_matches(const sl_stream_t *s, const char *id)
{
    for (int i = 0; i < s->n_names; i++)
        if (strcmp(s->names[i], id) == 0)
            return 1;
    return 0;
}

int sl_stream_peer_certificate_allows_fleet(const sl_stream_t *s, const char *fleet)
{
    return !s->fleet || strcmp(s->fleet, fleet) == 0;
}

int sl_stream_peer_certificate_uses_cn(const sl_stream_t *s)
{
    return s->uses_cn;
}

const char *sl_stream_peer_certificate_text(const sl_stream_t *s)
{
    return s->n_names ? s->names[0] : "none";
}

void sl_stream_set_user(sl_stream_t *s, void *user)
{
    s->user = user;
}

void *sl_stream_user(const sl_stream_t *s)
{
    return s->user;
}

/* ---- fixture ------------------------------------------------------------- */

typedef struct {
    char dir[64];
    sl_store_t *st;
    struct event_base *base;
    sl_controller_t *ctl;
    sl_stream_hooks_t hooks;
    sl_stream_t *streams[32];
    int nstreams;
} fx_t;

static int setup(void **state)
{
    sl_log_set_level(SL_LOG_ALERT);
    fx_t *f = calloc(1, sizeof(*f));
    snprintf(f->dir, sizeof(f->dir), "/tmp/sl-core-stream-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    char err[512];
    f->st = sl_store_open(f->dir, err, sizeof(err));
    assert_non_null(f->st);
    f->base = event_base_new();
    f->ctl = sl_controller_new(f->base, f->st, NULL);
    assert_non_null(f->ctl);
    sl_controller_compile_now(f->ctl); /* empty config: every type at version 1 */
    f->hooks = sl_controller_stream_hooks(f->ctl);
    memset(&sl_ctrl_metrics, 0, sizeof(sl_ctrl_metrics));
    *state = f;
    return 0;
}

static void stream_free(sl_stream_t *s)
{
    for (int i = 0; i < s->nsent; i++)
        protobuf_c_message_free_unpacked(&s->sent[i]->base, NULL);
    free(s);
}

static int teardown(void **state)
{
    fx_t *f = *state;
    for (int i = 0; i < f->nstreams; i++) {
        if (sl_stream_user(f->streams[i]))
            f->hooks.on_close(f->hooks.ctx, f->streams[i]);
        stream_free(f->streams[i]);
    }
    sl_controller_free(f->ctl);
    event_base_free(f->base);
    sl_store_close(f->st);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
    assert_int_equal(system(cmd), 0);
    free(f);
    return 0;
}

static sl_stream_t *open_stream(fx_t *f, const char *peer)
{
    sl_stream_t *s = calloc(1, sizeof(*s));
    snprintf(s->peer, sizeof(s->peer), "%s", peer);
    f->streams[f->nstreams++] = s;
    f->hooks.on_open(f->hooks.ctx, s);
    return s;
}

static void close_stream(fx_t *f, sl_stream_t *s)
{
    f->hooks.on_close(f->hooks.ctx, s);
}

/* One request as the stream thread delivers it: heap-allocated, owned by
 * the core. node_id NULL = no node; nack NULL = not a NACK. */
static void request(fx_t *f, sl_stream_t *s, const char *node_id, int type, const char *version,
                    const char *nonce, const char *nack)
{
    Sluice__V1__DiscoveryRequest req = SLUICE__V1__DISCOVERY_REQUEST__INIT;
    Sluice__V1__Node node = SLUICE__V1__NODE__INIT;
    Sluice__V1__Status st = SLUICE__V1__STATUS__INIT;
    if (node_id) {
        node.id = (char *)node_id;
        node.fleet = "default";
        req.node = &node;
    }
    req.type_url = (char *)(type >= 0 ? sl_xds_type_urls[type] : "type.example/unknown");
    req.version_info = (char *)version;
    req.response_nonce = (char *)(nonce ? nonce : "");
    if (nack) {
        st.code = 3;
        st.message = (char *)nack;
        req.error_detail = &st;
    }
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    uint8_t *buf = malloc(len ? len : 1);
    protobuf_c_message_pack(&req.base, buf);
    Sluice__V1__DiscoveryRequest *heap = sluice__v1__discovery_request__unpack(NULL, len, buf);
    free(buf);
    assert_non_null(heap);
    f->hooks.on_request(f->hooks.ctx, s, heap);
}

static void subscribe_all(fx_t *f, sl_stream_t *s, const char *node_id)
{
    for (int t = 0; t < SL_XDS__COUNT; t++)
        request(f, s, t == 0 ? node_id : NULL, t, "", NULL, NULL);
}

/* The next response the core sent on s that the test has not looked at. */
static Sluice__V1__DiscoveryResponse *next_sent(sl_stream_t *s)
{
    if (s->nread >= s->nsent)
        return NULL;
    return s->sent[s->nread++];
}

static runtime_rec_t *record(fx_t *f, const char *node_id)
{
    for (runtime_rec_t *rt = f->ctl->runtimes; rt; rt = rt->next)
        if (strcmp(rt->node_id, node_id) == 0)
            return rt;
    return NULL;
}

static void ack(fx_t *f, sl_stream_t *s, const Sluice__V1__DiscoveryResponse *r)
{
    request(f, s, NULL, sl_xds_type_from_url(r->type_url), r->version_info, r->nonce, NULL);
}

/* ---- 1: NACK parking ------------------------------------------------------ */

static uint64_t hist_count(const sl_ctrl_hist_t *h)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < SL_CTRL_HIST_BUCKETS; i++)
        n += atomic_load(&h->buckets[i]);
    return n;
}

/* sluice_controller_fleet_runtimes_connected{fleet="default"}, -1 if absent. */
static long fleet_connected(fx_t *f)
{
    struct evbuffer *b = evbuffer_new();
    sl_controller_render_metrics(f->ctl, b);
    evbuffer_add(b, "", 1);
    const char *text = (const char *)evbuffer_pullup(b, -1);
    const char *line =
        strstr(text, "\nsluice_controller_fleet_runtimes_connected{fleet=\"default\"} ");
    long v = line ? strtol(strchr(line, '}') + 2, NULL, 10) : -1;
    evbuffer_free(b);
    return v;
}

static void test_nack_stops_resending_only_on_its_stream(void **state)
{
    fx_t *f = *state;
    uint64_t acks0 = hist_count(&sl_ctrl_push_ack_seconds);
    uint64_t nacks0 = hist_count(&sl_ctrl_push_nack_seconds);
    sl_stream_t *a = open_stream(f, "ipv4:127.0.0.1:1001");
    subscribe_all(f, a, "node");
    assert_int_equal(fleet_connected(f), 1);
    Sluice__V1__DiscoveryResponse *r;
    for (int t = 0; t < SL_XDS_LISTENER; t++) {
        r = next_sent(a);
        assert_non_null(r);
        ack(f, a, r);
    }
    /* Push latency: one observation per ACK of a response in flight. */
    assert_int_equal(hist_count(&sl_ctrl_push_ack_seconds) - acks0, SL_XDS_LISTENER);
    r = next_sent(a);
    assert_string_equal(r->type_url, SL_TYPE_LISTENER);
    request(f, a, NULL, SL_XDS_LISTENER, "", r->nonce, "port busy");
    assert_int_equal(hist_count(&sl_ctrl_push_nack_seconds) - nacks0, 1);
    assert_null(next_sent(a));                            /* no NACK loop */
    request(f, a, NULL, SL_XDS_LISTENER, "", NULL, NULL); /* same version again */
    assert_null(next_sent(a));
    close_stream(f, a);
    assert_int_equal(fleet_connected(f), 0);

    /* The runtime restarts (same node id): a new stream starts fresh. */
    sl_stream_t *b = open_stream(f, "ipv4:127.0.0.1:1002");
    subscribe_all(f, b, "node");
    int listeners = 0;
    while ((r = next_sent(b))) {
        listeners += strcmp(r->type_url, SL_TYPE_LISTENER) == 0;
        ack(f, b, r);
    }
    assert_int_equal(listeners, 1);
    assert_int_equal(atomic_load(&sl_ctrl_metrics.nacks), 1);
}

/* ---- 2 and 8: versions from runtimes, versions that cannot be persisted -- */

static void test_versions_from_runtimes_are_checked(void **state)
{
    fx_t *f = *state;
    static const char *const bad[] = {
        "18446744073709551615", "9007199254740992", "abc", "-1", " 7", "007",
        "9007199254740991" /* far ahead */};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char peer[32];
        snprintf(peer, sizeof(peer), "ipv4:10.0.0.1:%zu", i);
        sl_stream_t *s = open_stream(f, peer);
        request(f, s, "stray", SL_XDS_CLUSTER, bad[i], NULL, NULL);
        assert_true(s->closed);
        assert_int_equal(s->code, GRPC_STATUS_INVALID_ARGUMENT);
        assert_non_null(strstr(s->message, bad[i]));
        assert_int_equal(s->nsent, 0);
        /* Later requests of a refused stream are ignored. */
        request(f, s, NULL, SL_XDS_CLUSTER, "", NULL, NULL);
        assert_int_equal(s->nsent, 0);
    }
    assert_null(record(f, "stray"));
    assert_true(f->ctl->version_floor == 0);
    assert_int_equal(f->ctl->config_version, 1);
    /* Versions still move. */
    sl_controller_compile_now(f->ctl);
    assert_string_equal(f->ctl->version_error, "");
}

static void test_unpersistable_version_fails_the_compile_and_is_retried(void **state)
{
    fx_t *f = *state;
    sl_stream_t *s = open_stream(f, "ipv4:127.0.0.1:1003");
    subscribe_all(f, s, "node");
    Sluice__V1__DiscoveryResponse *r;
    while ((r = next_sent(s)))
        ack(f, s, r);
    char err[256];
    assert_int_equal(
        sl_store_counter_set(f->st, "config_version", SL_XDS_VERSION_MAX, err, sizeof(err)), 0);
    /* A change: the fleet's hash no longer matches (as after a write). */
    fleet_t *fl = fleet_find(f->ctl, "default");
    fl->t[SL_XDS_ROUTE].hash ^= 1;
    uint64_t before = fl->t[SL_XDS_ROUTE].version;
    sl_controller_compile_now(f->ctl);
    assert_non_null(strstr(f->ctl->version_error, "cannot persist the config version"));
    assert_non_null(strstr(f->ctl->version_error, "9007199254740991"));
    char why[600];
    assert_int_equal(sl_controller_ready(f->ctl, why, sizeof(why)), 0);
    assert_string_equal(why, f->ctl->version_error);
    json_t *st = sl_controller_status_json(f->ctl);
    assert_string_equal(json_string_value(json_object_get(st, "error")), f->ctl->version_error);
    json_decref(st);
    assert_true(fl->t[SL_XDS_ROUTE].version == before); /* nothing swapped in */
    assert_null(next_sent(s));                          /* nothing pushed */
    assert_true(evtimer_pending(f->ctl->retry_ev, NULL));

    /* The store takes versions again: the retry pushes and clears it all. */
    assert_int_equal(sl_store_counter_set(f->st, "config_version", 41, err, sizeof(err)), 0);
    retry_cb(-1, 0, f->ctl);
    assert_string_equal(f->ctl->version_error, "");
    assert_int_equal(sl_controller_ready(f->ctl, why, sizeof(why)), 1);
    assert_int_equal(fl->t[SL_XDS_ROUTE].version, 42);
    r = next_sent(s);
    assert_non_null(r);
    assert_string_equal(r->version_info, "42");
}

/* ---- 4: one stream per node id ---------------------------------------------- */

static void test_newer_stream_of_a_node_closes_the_older(void **state)
{
    fx_t *f = *state;
    sl_stream_t *a = open_stream(f, "ipv4:10.0.0.7:40312");
    subscribe_all(f, a, "twin");
    sl_stream_t *b = open_stream(f, "ipv4:10.0.0.9:51200");
    subscribe_all(f, b, "twin");
    assert_true(a->closed);
    assert_int_equal(a->code, GRPC_STATUS_ALREADY_EXISTS);
    assert_non_null(strstr(a->message, "replaced by a newer stream from ipv4:10.0.0.9:51200"));
    assert_false(b->closed);
    runtime_rec_t *rt = record(f, "twin");
    assert_ptr_equal(rt->stream, b);
    assert_int_equal(rt->streams_replaced, 1);
    assert_string_equal(rt->replaced_address, "ipv4:10.0.0.7:40312");
    assert_int_equal(atomic_load(&sl_ctrl_metrics.streams_replaced), 1);
    assert_int_equal(atomic_load(&sl_ctrl_metrics.runtimes_connected), 1);
    /* The old stream's close does not disconnect the new one. */
    close_stream(f, a);
    assert_ptr_equal(rt->stream, b);
    assert_int_equal(atomic_load(&sl_ctrl_metrics.runtimes_connected), 1);
}

/* ---- 5: nonces ---------------------------------------------------------------- */

static void test_nonces_are_unique_and_matched_with_their_type(void **state)
{
    fx_t *f = *state;
    sl_stream_t *a = open_stream(f, "ipv4:127.0.0.1:2001");
    sl_stream_t *b = open_stream(f, "ipv4:127.0.0.1:2002");
    subscribe_all(f, a, "n1");
    subscribe_all(f, b, "n2");
    Sluice__V1__DiscoveryResponse *ra = next_sent(a), *rb = next_sent(b);
    assert_string_equal(ra->version_info, rb->version_info);
    assert_string_not_equal(ra->nonce, rb->nonce);
    /* The right nonce with another type is stale. */
    request(f, a, NULL, SL_XDS_LISTENER, ra->version_info, ra->nonce, NULL);
    assert_null(next_sent(a));
    runtime_rec_t *n1 = record(f, "n1");
    assert_string_equal(n1->acked[SL_XDS_LISTENER], "");
    assert_string_equal(n1->acked[SL_XDS_SECRET], "");
    /* An ACK settles the type and version that were sent (the first type
     * of the push order, then the next). */
    assert_string_equal(ra->type_url, SL_TYPE_SECRET);
    request(f, a, NULL, SL_XDS_SECRET, "777", ra->nonce, NULL);
    assert_string_equal(n1->acked[SL_XDS_SECRET], ra->version_info);
    Sluice__V1__DiscoveryResponse *next = next_sent(a);
    assert_string_equal(next->type_url, SL_TYPE_CONSUMER);
    assert_string_not_equal(next->nonce, ra->nonce);
    assert_string_not_equal(next->nonce, rb->nonce);
}

/* ---- 6: bounded state ----------------------------------------------------- */

static void test_state_of_unauthenticated_peers_is_bounded(void **state)
{
    fx_t *f = *state;
    sl_controller_set_runtime_limits(f->ctl, 2, 60000);
    /* Unknown types register nothing. */
    sl_stream_t *junk = open_stream(f, "ipv4:10.0.0.2:1");
    request(f, junk, "junk", -1, "", NULL, NULL);
    request(f, junk, NULL, -1, "", NULL, NULL);
    assert_null(record(f, "junk"));
    assert_false(junk->closed);
    /* A NACK reason is cut to 4 KiB. */
    sl_stream_t *big = open_stream(f, "ipv4:10.0.0.3:1");
    request(f, big, "big", SL_XDS_CLUSTER, "", NULL, NULL);
    Sluice__V1__DiscoveryResponse *r = next_sent(big);
    char *huge = malloc(1 << 20);
    memset(huge, 'x', (1 << 20) - 1);
    huge[(1 << 20) - 1] = '\0';
    request(f, big, NULL, SL_XDS_CLUSTER, "", r->nonce, huge);
    free(huge);
    runtime_rec_t *rt = record(f, "big");
    assert_true(strlen(rt->nack[SL_XDS_CLUSTER].message) <= NACK_MESSAGE_MAX);
    close_stream(f, big);
    /* At most 2 records: the one disconnected longest ago makes room. */
    sl_stream_t *c = open_stream(f, "ipv4:10.0.0.4:1");
    request(f, c, "c", SL_XDS_CLUSTER, "", NULL, NULL);
    sl_stream_t *d = open_stream(f, "ipv4:10.0.0.5:1");
    request(f, d, "d", SL_XDS_CLUSTER, "", NULL, NULL);
    assert_null(record(f, "big"));
    assert_int_equal(f->ctl->n_runtimes, 2);
    /* Both connected: a third node is refused. */
    sl_stream_t *e = open_stream(f, "ipv4:10.0.0.6:1");
    request(f, e, "e", SL_XDS_CLUSTER, "", NULL, NULL);
    assert_true(e->closed);
    assert_int_equal(e->code, GRPC_STATUS_RESOURCE_EXHAUSTED);
    assert_null(record(f, "e"));
    /* Records of disconnected runtimes expire. */
    close_stream(f, c);
    record(f, "c")->disconnected_ms -= 60001;
    sweep_runtimes(f->ctl);
    assert_null(record(f, "c"));
    assert_non_null(record(f, "d"));
    assert_int_equal(f->ctl->n_runtimes, 1);
}

/* ---- mTLS: a node is who its certificate says ---------------------------- */

/* A stream under --stream-client-ca; names NULL = no certificate. */
static sl_stream_t *open_mtls_stream(fx_t *f, const char *peer, const char *name, int uses_cn)
{
    sl_stream_t *s = calloc(1, sizeof(*s));
    snprintf(s->peer, sizeof(s->peer), "%s", peer);
    s->client_auth = 1;
    s->has_cert = name != NULL;
    s->uses_cn = uses_cn;
    if (name)
        s->names[s->n_names++] = name;
    f->streams[f->nstreams++] = s;
    f->hooks.on_open(f->hooks.ctx, s);
    return s;
}

static void test_client_certificate_must_name_the_node(void **state)
{
    fx_t *f = *state;
    /* No certificate: refused on open, before any request is looked at. */
    sl_stream_t *none = open_mtls_stream(f, "ipv4:10.0.0.1:1", NULL, 0);
    assert_true(none->closed);
    assert_int_equal(none->code, GRPC_STATUS_UNAUTHENTICATED);
    assert_non_null(strstr(none->message, "--cert"));
    subscribe_all(f, none, "node-a");
    assert_int_equal(none->nsent, 0);
    assert_null(record(f, "node-a"));

    /* node-a's certificate, node id node-b: refused, never registered,
     * and node-b's record (if any) untouched. */
    sl_stream_t *rogue = open_mtls_stream(f, "ipv4:10.0.0.2:2", "node-a", 0);
    assert_false(rogue->closed);
    subscribe_all(f, rogue, "node-b");
    assert_true(rogue->closed);
    assert_int_equal(rogue->code, GRPC_STATUS_PERMISSION_DENIED);
    assert_non_null(strstr(rogue->message, "node id node-b does not match the client "
                                           "certificate (SANs: node-a)"));
    assert_int_equal(rogue->nsent, 0);
    assert_null(record(f, "node-b"));
    assert_int_equal(f->ctl->n_runtimes, 0);
    assert_int_equal(atomic_load(&sl_ctrl_metrics.streams_refused), 2);

    /* The matching certificate is served; a CN counts when there is no
     * SAN. */
    sl_stream_t *a = open_mtls_stream(f, "ipv4:10.0.0.3:3", "node-a", 0);
    subscribe_all(f, a, "node-a");
    assert_false(a->closed);
    assert_non_null(record(f, "node-a"));
    assert_true(a->nsent > 0);
    sl_stream_t *c = open_mtls_stream(f, "ipv4:10.0.0.4:4", "node-c", 1);
    subscribe_all(f, c, "node-c");
    assert_false(c->closed);
    assert_non_null(record(f, "node-c"));
    /* A stream that matched keeps its node: later requests carry none. */
    request(f, a, "node-b", SL_XDS_ROUTE, "", NULL, NULL);
    assert_false(a->closed);
    assert_null(record(f, "node-b"));

    /* A certificate bound to fleet edge cannot join fleet default (the
     * requests' fleet); bound to default, it can. */
    sl_stream_t *e = calloc(1, sizeof(*e));
    e->client_auth = e->has_cert = 1;
    e->names[e->n_names++] = "node-e";
    e->fleet = "edge";
    f->streams[f->nstreams++] = e;
    f->hooks.on_open(f->hooks.ctx, e);
    subscribe_all(f, e, "node-e");
    assert_true(e->closed);
    assert_int_equal(e->code, GRPC_STATUS_PERMISSION_DENIED);
    assert_non_null(strstr(e->message, "fleet default is not a fleet of its client certificate"));
    assert_null(record(f, "node-e"));
    sl_stream_t *d = open_mtls_stream(f, "ipv4:10.0.0.5:5", "node-d", 0);
    d->fleet = "default";
    subscribe_all(f, d, "node-d");
    assert_false(d->closed);
    assert_non_null(record(f, "node-d"));
}

/* ---- the nonce rides after the shared body ---------------------------------- */

static void test_nonce_appended_to_the_shared_encoding(void **state)
{
    (void)state;
    grpc_slice body = encode_response(NULL, 0, SL_XDS_ROUTE, "12");
    grpc_byte_buffer *bb = response_with_nonce(body, "34");
    Sluice__V1__DiscoveryResponse *r = (Sluice__V1__DiscoveryResponse *)sl_grpc_unpack(
        &sluice__v1__discovery_response__descriptor, bb);
    assert_non_null(r);
    assert_string_equal(r->version_info, "12");
    assert_string_equal(r->type_url, SL_TYPE_ROUTE);
    assert_string_equal(r->nonce, "34");
    protobuf_c_message_free_unpacked(&r->base, NULL);
    grpc_byte_buffer_destroy(bb);
    grpc_slice_unref(body);
}

/* ---- issue 14: delta streams ------------------------------------------------ */

/* A delta request: subscription (nonce NULL) with what it holds
 * (iv_name -> iv_version, or none), or the ACK/NACK of a response
 * (rejected: the one name it did not apply, or NULL). */
static void delta_request(fx_t *f, sl_stream_t *s, const char *node_id, int type,
                          const char *version, const char *nonce, const char *iv_name,
                          const char *iv_version, const char *nack, const char *rejected)
{
    Sluice__V1__DiscoveryRequest req = SLUICE__V1__DISCOVERY_REQUEST__INIT;
    Sluice__V1__Node node = SLUICE__V1__NODE__INIT;
    Sluice__V1__Status st = SLUICE__V1__STATUS__INIT;
    Sluice__V1__DiscoveryRequest__InitialResourceVersionsEntry e =
        SLUICE__V1__DISCOVERY_REQUEST__INITIAL_RESOURCE_VERSIONS_ENTRY__INIT;
    Sluice__V1__DiscoveryRequest__InitialResourceVersionsEntry *ep = &e;
    char *rej = (char *)rejected;
    if (node_id) {
        node.id = (char *)node_id;
        node.fleet = "default";
        req.node = &node;
    }
    req.incremental = 1;
    req.type_url = (char *)sl_xds_type_urls[type];
    req.version_info = (char *)version;
    req.response_nonce = (char *)(nonce ? nonce : "");
    if (iv_name) {
        e.key = (char *)iv_name;
        e.value = (char *)iv_version;
        req.initial_resource_versions = &ep;
        req.n_initial_resource_versions = 1;
    }
    if (nack) {
        st.code = 3;
        st.message = (char *)nack;
        req.error_detail = &st;
    }
    if (rejected) {
        req.rejected_resources = &rej;
        req.n_rejected_resources = 1;
    }
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    uint8_t *buf = malloc(len ? len : 1);
    protobuf_c_message_pack(&req.base, buf);
    Sluice__V1__DiscoveryRequest *heap = sluice__v1__discovery_request__unpack(NULL, len, buf);
    free(buf);
    assert_non_null(heap);
    f->hooks.on_request(f->hooks.ctx, s, heap);
}

static void test_delta_sends_what_differs_and_parks_rejected_resources(void **state)
{
    fx_t *f = *state;
    /* First stream: every type answered once; settings is the only resource
     * of the empty config, with a content-hash version. */
    sl_stream_t *a = open_stream(f, "ipv4:127.0.0.1:2001");
    for (int t = 0; t < SL_XDS__COUNT; t++)
        delta_request(f, a, t == 0 ? "d-node" : NULL, t, "", NULL, NULL, NULL, NULL, NULL);
    char settings_version[32] = "", type_version[SL_XDS__COUNT][VERSION_LEN];
    Sluice__V1__DiscoveryResponse *r;
    for (int t = 0; t < SL_XDS__COUNT; t++) {
        r = next_sent(a);
        assert_non_null(r);
        assert_string_equal(r->type_url, sl_xds_type_urls[t]); /* make-before-break order */
        snprintf(type_version[t], VERSION_LEN, "%s", r->version_info);
        if (t == SL_XDS_SETTINGS) {
            assert_int_equal(r->n_resources, 1);
            assert_string_equal(r->resources[0]->name, "settings");
            assert_int_equal(strlen(r->resources[0]->version), 16);
            snprintf(settings_version, sizeof(settings_version), "%s", r->resources[0]->version);
        } else {
            assert_int_equal(r->n_resources, 0);
        }
        delta_request(f, a, NULL, t, r->version_info, r->nonce, NULL, NULL, NULL, NULL);
    }
    assert_null(next_sent(a));
    assert_string_equal(record(f, "d-node")->acked[SL_XDS_SETTINGS],
                        f->ctl->fleets->t[SL_XDS_SETTINGS].version_str);
    assert_int_equal(record(f, "d-node")->delta, 1);
    close_stream(f, a);

    /* Reconnect holding everything: nothing is sent. */
    sl_stream_t *b = open_stream(f, "ipv4:127.0.0.1:2002");
    for (int t = 0; t < SL_XDS__COUNT; t++)
        delta_request(f, b, t == 0 ? "d-node" : NULL, t, type_version[t], NULL,
                      t == SL_XDS_SETTINGS ? "settings" : NULL, settings_version, NULL, NULL);
    assert_null(next_sent(b));
    assert_int_equal(record(f, "d-node")->resources_sent, 1); /* from the first stream */
    close_stream(f, b);

    /* Reconnect with a stale settings version: settings alone is re-sent;
     * rejected by name, it is parked on the stream (not re-sent on a new
     * subscription of the same type) and the type is not acknowledged. */
    sl_stream_t *c = open_stream(f, "ipv4:127.0.0.1:2003");
    for (int t = 0; t < SL_XDS__COUNT; t++)
        delta_request(f, c, t == 0 ? "d-node" : NULL, t, type_version[t], NULL,
                      t == SL_XDS_SETTINGS ? "settings" : NULL,
                      t == SL_XDS_SETTINGS ? "00000000000000ff" : NULL, NULL, NULL);
    r = next_sent(c);
    assert_non_null(r);
    assert_string_equal(r->type_url, SL_TYPE_SETTINGS);
    assert_int_equal(r->n_resources, 1);
    assert_string_equal(r->resources[0]->version, settings_version);
    delta_request(f, c, NULL, SL_XDS_SETTINGS, type_version[SL_XDS_SETTINGS], r->nonce, NULL, NULL,
                  "settings: bad", "settings");
    assert_null(next_sent(c));
    assert_string_equal(record(f, "d-node")->nack[SL_XDS_SETTINGS].message, "settings: bad");
    assert_string_not_equal(record(f, "d-node")->acked[SL_XDS_SETTINGS],
                            f->ctl->fleets->t[SL_XDS_SETTINGS].version_str);
    delta_request(f, c, NULL, SL_XDS_SETTINGS, "", NULL, NULL, NULL, NULL, NULL);
    assert_null(next_sent(c));

    /* A stream keeps its mode. */
    request(f, c, NULL, SL_XDS_ROUTE, "", NULL, NULL);
    assert_true(c->closed);
    assert_int_equal(c->code, GRPC_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(c->message, "keeps the mode"));
}

/* What a delta peer reports is bounded by the fleet's config, not by the
 * request size. */
static void test_delta_initial_versions_are_bounded(void **state)
{
    fx_t *f = *state;
    size_t n = DELTA_NAMES_SLACK + 2; /* the empty config has at most 1 per type */
    Sluice__V1__DiscoveryRequest req = SLUICE__V1__DISCOVERY_REQUEST__INIT;
    Sluice__V1__Node node = SLUICE__V1__NODE__INIT;
    node.id = "greedy";
    node.fleet = "default";
    req.node = &node;
    req.incremental = 1;
    req.type_url = (char *)sl_xds_type_urls[SL_XDS_ROUTE];
    req.version_info = "";
    Sluice__V1__DiscoveryRequest__InitialResourceVersionsEntry *ents = calloc(n, sizeof(*ents));
    Sluice__V1__DiscoveryRequest__InitialResourceVersionsEntry **ptrs = calloc(n, sizeof(*ptrs));
    char(*names)[16] = calloc(n, 16);
    for (size_t i = 0; i < n; i++) {
        sluice__v1__discovery_request__initial_resource_versions_entry__init(&ents[i]);
        snprintf(names[i], 16, "r%zu", i);
        ents[i].key = names[i];
        ents[i].value = "0000000000000001";
        ptrs[i] = &ents[i];
    }
    req.initial_resource_versions = ptrs;
    req.n_initial_resource_versions = n;
    size_t len = protobuf_c_message_get_packed_size(&req.base);
    uint8_t *buf = malloc(len);
    protobuf_c_message_pack(&req.base, buf);
    Sluice__V1__DiscoveryRequest *heap = sluice__v1__discovery_request__unpack(NULL, len, buf);
    free(buf);
    free(ents);
    free(ptrs);
    free(names);
    sl_stream_t *s = open_stream(f, "ipv4:127.0.0.1:2100");
    f->hooks.on_request(f->hooks.ctx, s, heap);
    assert_true(s->closed);
    assert_int_equal(s->code, GRPC_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(s->message, "initial_resource_versions"));
    assert_null(record(f, "greedy")->d[SL_XDS_ROUTE].have);
}

static void test_version_parse(void **state)
{
    (void)state;
    uint64_t v = 99;
    assert_int_equal(sl_xds_version_parse("", &v), 0);
    assert_int_equal(v, 0);
    assert_int_equal(sl_xds_version_parse("0", &v), 0);
    assert_int_equal(sl_xds_version_parse("9007199254740991", &v), 0);
    assert_true(v == SL_XDS_VERSION_MAX);
    static const char *const bad[] = {"9007199254740992",
                                      "18446744073709551615",
                                      "abc",
                                      "-1",
                                      "+1",
                                      " 1",
                                      "1 ",
                                      "01",
                                      "1e3",
                                      "0x1",
                                      "99999999999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (sl_xds_version_parse(bad[i], &v) != -1)
            fail_msg("\"%s\" parsed as a version", bad[i]);
}

/* ---- delta: the digest shortcuts answer as the walk ---- */

static uint64_t drng = 0x2545f4914f6cdd1dull;
static unsigned drnd(unsigned n)
{
    drng ^= drng << 13;
    drng ^= drng >> 7;
    drng ^= drng << 17;
    return (unsigned)(drng % n);
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_json_str(const void *a, const void *b)
{
    return strcmp(json_string_value(*(json_t *const *)a), json_string_value(*(json_t *const *)b));
}

/* Sorted copies: the order of changes and removals carries no meaning. */
static void expect_same_delta(const size_t *c1, size_t n1, json_t *r1, const size_t *c2, size_t n2,
                              json_t *r2, unsigned round)
{
    size_t *a = calloc(n1 + 1, sizeof *a), *b = calloc(n2 + 1, sizeof *b);
    assert_true(a && b);
    memcpy(a, c1, n1 * sizeof *a);
    memcpy(b, c2, n2 * sizeof *b);
    qsort(a, n1, sizeof *a, cmp_size);
    qsort(b, n2, sizeof *b, cmp_size);
    if (n1 != n2 || memcmp(a, b, n1 * sizeof *a) != 0)
        fail_msg("round %u: %zu changes with the shortcut, %zu by the walk", round, n1, n2);
    free(a);
    free(b);
    size_t m1 = json_array_size(r1), m2 = json_array_size(r2);
    if (m1 != m2)
        fail_msg("round %u: %zu removals with the shortcut, %zu by the walk", round, m1, m2);
    json_t **x = calloc(m1 + 1, sizeof *x), **y = calloc(m2 + 1, sizeof *y);
    for (size_t i = 0; i < m1; i++) {
        x[i] = json_array_get(r1, i);
        y[i] = json_array_get(r2, i);
    }
    qsort(x, m1, sizeof *x, cmp_json_str);
    qsort(y, m2, sizeof *y, cmp_json_str);
    for (size_t i = 0; i < m1; i++)
        if (strcmp(json_string_value(x[i]), json_string_value(y[i])) != 0)
            fail_msg("round %u: removal %s with the shortcut, %s by the walk", round,
                     json_string_value(x[i]), json_string_value(y[i]));
    free(x);
    free(y);
}

/*
 * A fleet's routes change at random (versions moved, resources added and
 * removed, in place or rebuilt); a runtime holds the fleet's previous
 * entries, its current ones, or something else (one version off, one
 * resource more or less, a subscription list, a parked NACK). Whatever it
 * holds, delta_compute (digests: nothing to send, or the last compile's
 * diff) gives what walking both sets gives.
 */
static void test_delta_shortcuts_answer_as_the_walk(void **state)
{
    (void)state;
    enum { POOL = 40 };
    const int t = SL_XDS_ROUTE;
    static char names[POOL][16];
    static uint8_t byte = 1;
    sl_cres_t cres[POOL];
    for (int i = 0; i < POOL; i++) {
        snprintf(names[i], sizeof names[i], "ns%d/api%d", i % 3, i);
        cres[i] = (sl_cres_t){.refs = 1, .name = names[i], .data = &byte, .len = 1};
    }
    fleet_t f;
    memset(&f, 0, sizeof f);
    json_t *prev_have = json_object(); /* the fleet's entries before the last compile */
    unsigned shortcut = 0, diffs = 0;
    for (unsigned round = 0; round < 4000; round++) {
        /* The new entries: mostly a few versions moved on the same names
         * (the in-place path), sometimes names added or dropped. */
        sl_cres_t *res[POOL];
        size_t n = 0;
        int reshape = f.t[t].n_ents == 0 || drnd(4) == 0;
        for (int i = 0; i < POOL; i++) {
            int in = reshape ? drnd(3) != 0 : json_object_get(f.t[t].index, names[i]) != NULL;
            if (!in)
                continue;
            if (reshape || drnd(8) == 0)
                cres[i].hash = drnd(6) + 1;
            res[n++] = &cres[i];
        }
        json_t *before = json_object();
        for (size_t i = 0; i < f.t[t].n_ents; i++)
            json_object_set_new(before, f.t[t].ents[i].name, json_string(f.t[t].ents[i].version));
        assert_int_equal(build_entries(&f, t, res, n), 0);
        json_decref(prev_have);
        prev_have = before;

        /* What the runtime holds. */
        runtime_rec_t rt;
        memset(&rt, 0, sizeof rt);
        rt.d[t].parked = json_object();
        unsigned kind = drnd(5);
        const char *name;
        json_t *v;
        if (kind == 0 || kind == 3) {
            json_object_foreach(prev_have, name, v) have_set(&rt, t, name, v);
        } else if (kind == 1) {
            for (size_t i = 0; i < f.t[t].n_ents; i++) {
                json_t *jv = json_string(f.t[t].ents[i].version);
                have_set(&rt, t, f.t[t].ents[i].name, jv);
                json_decref(jv);
            }
        } else {
            for (int i = 0; i < POOL; i++)
                if (drnd(2)) {
                    char ver[24];
                    snprintf(ver, sizeof ver, "%016x", drnd(6) + 1);
                    json_t *jv = json_string(ver);
                    have_set(&rt, t, names[i], jv);
                    json_decref(jv);
                }
        }
        if (kind == 3 && drnd(2)) { /* one off: a version, a resource more or less */
            const char *k = names[drnd(POOL)];
            if (drnd(2)) {
                have_del(&rt, t, k);
            } else {
                json_t *jv = json_string("0000000000000009");
                have_set(&rt, t, k, jv);
                json_decref(jv);
            }
        }
        if (drnd(10) == 0) {
            rt.d[t].subs = json_object();
            json_object_set_new(rt.d[t].subs, names[drnd(POOL)], json_true());
        }
        if (drnd(10) == 0 && f.t[t].n_ents)
            json_object_set_new(rt.d[t].parked, f.t[t].ents[0].name,
                                json_string(f.t[t].ents[0].version));

        for (int hp = 0; hp < 2; hp++) {
            size_t c1[POOL + 1], c2[POOL + 1];
            json_t *r1 = json_array(), *r2 = json_array();
            size_t n1 = delta_compute(&f, &rt, t, c1, r1, hp);
            size_t n2 = delta_compute_walk(&f, &rt, t, c2, r2, hp);
            if (n1 != n2)
                fail_msg("round %u: delta_compute says %zu, the walk %zu", round, n1, n2);
            expect_same_delta(c1, n1 - json_array_size(r1), r1, c2, n2 - json_array_size(r2), r2,
                              round);
            /* Changes only, removals only: the same counts. */
            assert_int_equal(delta_compute(&f, &rt, t, c1, NULL, hp),
                             delta_compute_walk(&f, &rt, t, c2, NULL, hp));
            json_decref(r1);
            json_decref(r2);
            r1 = json_array();
            r2 = json_array();
            assert_int_equal(delta_compute(&f, &rt, t, NULL, r1, hp),
                             delta_compute_walk(&f, &rt, t, NULL, r2, hp));
            json_decref(r1);
            json_decref(r2);
        }
        int plain = !rt.d[t].subs && !json_object_size(rt.d[t].parked);
        size_t nh = json_object_size(rt.d[t].have);
        shortcut += plain && nh == f.t[t].n_ents && digest_eq(&rt.d[t].dig, &f.t[t].dig);
        diffs += plain && f.t[t].diff_ok && nh == f.t[t].prev_n &&
                 digest_eq(&rt.d[t].dig, &f.t[t].prev_dig);
        have_clear(&rt, t);
        json_decref(rt.d[t].parked);
        json_decref(rt.d[t].subs);
    }
    /* Both shortcuts were taken, often. */
    if (shortcut < 300 || diffs < 300)
        fail_msg("shortcuts taken: %u in step, %u from the previous entries", shortcut, diffs);
    json_decref(prev_have);
    for (int t2 = 0; t2 < SL_XDS__COUNT; t2++) {
        entries_free(f.t[t2].ents, f.t[t2].n_ents);
        json_decref(f.t[t2].index);
        diff_free(&f, t2);
    }
}

int main(void)
{
    grpc_init();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_nack_stops_resending_only_on_its_stream, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_versions_from_runtimes_are_checked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unpersistable_version_fails_the_compile_and_is_retried,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_newer_stream_of_a_node_closes_the_older, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_nonces_are_unique_and_matched_with_their_type, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_state_of_unauthenticated_peers_is_bounded, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_client_certificate_must_name_the_node, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_delta_sends_what_differs_and_parks_rejected_resources,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_delta_initial_versions_are_bounded, setup, teardown),
        cmocka_unit_test(test_nonce_appended_to_the_shared_encoding),
        cmocka_unit_test(test_version_parse),
        cmocka_unit_test(test_delta_shortcuts_answer_as_the_walk),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    grpc_shutdown();
    return rc;
}
