/*
 * Config stream client (xds.h).
 *
 * The queue thread owns the call's life: create a channel and a call on it,
 * receive responses, notice its end, back off, start again. Each call gets
 * a fresh channel and is fail-fast, so one call is exactly one connection
 * attempt and our back-off alone decides when the next one happens: 250 ms
 * doubling to 10 s, full jitter (a wait drawn from [0, cap]), the cap back
 * to 250 ms after a call that stayed connected 10 s or received a push (a
 * controller that accepts streams only to close them does not get a tight
 * loop; one that served us gets fast first retries). With one long-lived
 * channel and WAIT_FOR_READY, gRPC's own reconnect back-off (x1.6 up to the
 * channel's maximum, 20% jitter) decided instead, and a controller that came
 * back was noticed seconds later.
 *
 * The main thread owns the config state: per type the resources last
 * applied and their version. It subscribes as soon as a call exists, without
 * waiting for the controller's response headers: servers built on grpc-go,
 * grpc-java or Python gRPC send headers only with their first response, so
 * waiting for them would leave both sides waiting forever. It applies
 * responses and queues the ACK or NACK.
 *
 * TLS (--controller-ca, --cert/--key): one set of gRPC SSL channel
 * credentials, made at start from the checked PEM texts and shared by every
 * call's channel; the controller's certificate must name the host of
 * --controller (a DNS or IP SAN). A controller that refuses our identity
 * (UNAUTHENTICATED: no client certificate; PERMISSION_DENIED: the node id is
 * not the certificate's) is logged as an error with the fix every time and
 * retried slowly, like a node id taken by another runtime: retrying fast
 * cannot help until a person changes a flag or a certificate.
 *
 * Make before break at the receiver: a cluster that a cluster update removes
 * stays while the active routes still reference it, and goes with the route
 * update that stops using it, so no request is routed to a backend that does
 * not exist, whatever order updates come in.
 */
#include "xds.h"

#include "compiler.h"
#include "generation.h"
#include "grpc_util.h"
#include "log.h"
#include "metrics.h"
#include "pbshare.h"
#include "snapcache.h"
#include "sluice/v1/discovery.pb-c.h"

#include <errno.h>
#include <event2/event.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define BACKOFF_BASE_MS 250
#define BACKOFF_MAX_MS 10000
#define BACKOFF_RESET_AFTER_MS 10000 /* connected this long: start over from the base */

enum tag_kind { TAG_START = 1, TAG_MD, TAG_RECV, TAG_SEND, TAG_STATUS };
typedef struct {
    enum tag_kind kind;
} tag_t;

typedef struct send_item {
    grpc_byte_buffer *bb;
    struct send_item *next;
} send_item_t;

/* XEV_CALL: a call exists (subscribe now); XEV_UP: it reached the
 * controller; XEV_DOWN: it ended (code, message). */
enum ev_kind { XEV_CALL = 1, XEV_UP, XEV_RESPONSE, XEV_DOWN };
typedef struct xds_event {
    enum ev_kind kind;
    uint64_t call_id;
    grpc_status_code code;
    Sluice__V1__DiscoveryResponse *resp;
    char *message;
    struct xds_event *next;
} xds_event_t;

/* Per type, the resources in force (decoded) and their version; in delta
 * mode also each resource's version (Resource.version). */
typedef struct {
    size_t n;
    ProtobufCMessage **msgs;
    char **names;
    char **versions; /* delta only; NULL in sotw */
    char *version;
    int received;
    int from_cache; /* delta: seeded from --cache-dir, not answered by a controller yet */
} type_state_t;

struct sl_xds {
    sl_xds_options_t opt;
    sl_config_t *cfg;
    grpc_channel *channel;           /* the current call's, queue thread only */
    grpc_channel_credentials *creds; /* every call's; read-only after start */
    int tls, client_cert;
    grpc_completion_queue *cq;
    pthread_t thread;
    atomic_int stopping;

    /* current call, shared between the threads under `lock` */
    pthread_mutex_t lock;
    grpc_call *call;
    uint64_t call_id;
    int call_over;
    send_item_t *send_head, *send_tail, *send_inflight;
    int send_busy;

    /* queue-thread only */
    grpc_metadata_array md_initial, md_trailing;
    grpc_status_code status;
    grpc_slice status_details;
    grpc_byte_buffer *recv_buf;
    tag_t t_start, t_md, t_recv, t_send, t_status;
    int outstanding;
    int status_received;

    /* main thread */
    struct event *ev;
    int ev_fd;
    pthread_mutex_t ev_lock;
    xds_event_t *ev_head, *ev_tail;
    type_state_t types[SL_XDS__COUNT];
    /* clusters of the last cluster update; others in types[CLUSTER] are
     * kept only because active routes use them */
    char **cds_names;
    size_t cds_n;
    int connected;
    uint64_t connected_call;
    char *last_error;
    int failure_logged; /* since the last time a call came up */
    uint64_t updates_acked, updates_nacked;
    /* Received over the stream: resources and bytes of their values. */
    uint64_t resources_received, bytes_received;
    uint64_t last_update_ms;
    int synced;
    int sotw_fallback_logged;
    /* /config_dump shows resource versions keyed with this (below). */
    unsigned char dump_key[16];
};

static uint64_t wall_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

/* ---- queue thread ----------------------------------------------------------- */

static void post_code(sl_xds_t *x, enum ev_kind kind, uint64_t call_id,
                      Sluice__V1__DiscoveryResponse *resp, const char *message,
                      grpc_status_code code)
{
    xds_event_t *e = calloc(1, sizeof(*e));
    if (!e) {
        if (resp)
            protobuf_c_message_free_unpacked(&resp->base, NULL);
        return;
    }
    e->kind = kind;
    e->call_id = call_id;
    e->code = code;
    e->resp = resp;
    e->message = message ? strdup(message) : NULL;
    pthread_mutex_lock(&x->ev_lock);
    if (x->ev_tail)
        x->ev_tail->next = e;
    else
        x->ev_head = e;
    x->ev_tail = e;
    pthread_mutex_unlock(&x->ev_lock);
    uint64_t one = 1;
    ssize_t n = write(x->ev_fd, &one, sizeof(one));
    (void)n;
}

static void post(sl_xds_t *x, enum ev_kind kind, uint64_t call_id,
                 Sluice__V1__DiscoveryResponse *resp, const char *message)
{
    post_code(x, kind, call_id, resp, message, GRPC_STATUS_OK);
}

static void start_send_locked(sl_xds_t *x)
{
    while (!x->send_busy && x->send_head && x->call && !x->call_over) {
        send_item_t *it = x->send_head;
        x->send_head = it->next;
        if (!x->send_head)
            x->send_tail = NULL;
        grpc_op op;
        memset(&op, 0, sizeof(op));
        op.op = GRPC_OP_SEND_MESSAGE;
        op.data.send_message.send_message = it->bb;
        x->send_busy = 1;
        x->send_inflight = it;
        if (grpc_call_start_batch(x->call, &op, 1, &x->t_send, NULL) != GRPC_CALL_OK) {
            x->send_busy = 0;
            x->send_inflight = NULL;
            grpc_byte_buffer_destroy(it->bb);
            free(it);
        }
    }
}

static void drop_sends_locked(sl_xds_t *x)
{
    send_item_t *it = x->send_head;
    while (it) {
        send_item_t *next = it->next;
        grpc_byte_buffer_destroy(it->bb);
        free(it);
        it = next;
    }
    x->send_head = x->send_tail = NULL;
}

static int arm_recv(sl_xds_t *x)
{
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &x->recv_buf;
    if (grpc_call_start_batch(x->call, &op, 1, &x->t_recv, NULL) != GRPC_CALL_OK)
        return -1;
    x->outstanding++;
    return 0;
}

/* The channel of one call. Args: keepalive so a hung controller is noticed
 * (MAX_PINGS_WITHOUT_DATA=0: the default would stop pinging an idle stream,
 * REFERENCE.md); the reconnect back-off set to ours, though a call's
 * channel never reconnects (it lives for one attempt); a local subchannel
 * pool, so a new channel never inherits an old one's back-off state. */
static grpc_channel *new_channel(const sl_xds_t *x)
{
    grpc_arg args[] = {
        {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIME_MS, {.integer = 5000}},
        {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, {.integer = 3000}},
        {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, {.integer = 1}},
        {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, {.integer = 0}},
        {GRPC_ARG_INTEGER, GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, {.integer = BACKOFF_BASE_MS}},
        {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, {.integer = BACKOFF_MAX_MS}},
        {GRPC_ARG_INTEGER, GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, {.integer = 1}},
        {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = 512 * 1024 * 1024}},
    };
    grpc_channel_args cargs = {sizeof(args) / sizeof(args[0]), args};
    /* The channel takes its own reference on the credentials. */
    return grpc_channel_create(x->opt.controller, x->creds, &cargs);
}

/*
 * Runs one call from creation to its end: one connection attempt, and the
 * stream if it connects. Returns the call's status; *up_ms is how long it
 * was connected (0 if it never was), *served whether a response arrived.
 */
static grpc_status_code run_call(sl_xds_t *x, uint64_t *up_ms, int *served)
{
    *up_ms = 0;
    *served = 0;
    x->channel = new_channel(x);
    void *method = grpc_channel_register_call(x->channel, SL_GRPC_STREAM_METHOD, NULL, NULL);
    pthread_mutex_lock(&x->lock);
    x->call = grpc_channel_create_registered_call(x->channel, NULL, GRPC_PROPAGATE_DEFAULTS, x->cq,
                                                  method, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    x->call_id++;
    x->call_over = 0;
    uint64_t call_id = x->call_id;
    pthread_mutex_unlock(&x->lock);
    grpc_metadata_array_init(&x->md_initial);
    grpc_metadata_array_init(&x->md_trailing);
    x->outstanding = 0;
    x->status_received = 0;
    x->status = GRPC_STATUS_UNAVAILABLE;
    struct timespec t_up = {0, 0};

    /* Fail-fast (no WAIT_FOR_READY): if the controller cannot be reached,
     * the call fails and our back-off decides when to try again. */
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_SEND_INITIAL_METADATA;
    if (grpc_call_start_batch(x->call, &op, 1, &x->t_start, NULL) == GRPC_CALL_OK)
        x->outstanding++;
    /* The response headers on their own: nothing waits for them. */
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_INITIAL_METADATA;
    op.data.recv_initial_metadata.recv_initial_metadata = &x->md_initial;
    if (grpc_call_start_batch(x->call, &op, 1, &x->t_md, NULL) == GRPC_CALL_OK)
        x->outstanding++;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &x->md_trailing;
    op.data.recv_status_on_client.status = &x->status;
    op.data.recv_status_on_client.status_details = &x->status_details;
    if (grpc_call_start_batch(x->call, &op, 1, &x->t_status, NULL) == GRPC_CALL_OK)
        x->outstanding++;
    arm_recv(x);
    /* Subscribe now: the main thread queues the requests behind the
     * initial metadata. */
    post(x, XEV_CALL, call_id, NULL, NULL);

    for (;;) {
        /* Sends are started from the main thread too; their completions
         * are outstanding while send_busy is set. */
        pthread_mutex_lock(&x->lock);
        int busy = x->send_busy;
        pthread_mutex_unlock(&x->lock);
        if (x->outstanding == 0 && !busy)
            break;
        grpc_event ev = grpc_completion_queue_next(
            x->cq,
            gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_millis(200, GPR_TIMESPAN)),
            NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT) {
            if (atomic_load(&x->stopping))
                grpc_call_cancel(x->call, NULL);
            continue;
        }
        if (ev.type != GRPC_OP_COMPLETE)
            break;
        tag_t *tag = ev.tag;
        if (tag->kind != TAG_SEND)
            x->outstanding--;
        switch (tag->kind) {
        case TAG_START:
            /* The initial metadata went out on a connected transport. */
            if (ev.success) {
                clock_gettime(CLOCK_MONOTONIC, &t_up);
                post(x, XEV_UP, call_id, NULL, NULL);
            }
            break;
        case TAG_MD:
            break;
        case TAG_RECV:
            if (ev.success && x->recv_buf) {
                Sluice__V1__DiscoveryResponse *resp =
                    (Sluice__V1__DiscoveryResponse *)sl_grpc_unpack(
                        &sluice__v1__discovery_response__descriptor, x->recv_buf);
                grpc_byte_buffer_destroy(x->recv_buf);
                x->recv_buf = NULL;
                *served = 1;
                if (resp)
                    post(x, XEV_RESPONSE, call_id, resp, NULL);
                else
                    sl_log_error("controller sent a response that does not decode; ignored");
                arm_recv(x);
            }
            break;
        case TAG_SEND: {
            pthread_mutex_lock(&x->lock);
            send_item_t *it = x->send_inflight;
            x->send_inflight = NULL;
            x->send_busy = 0;
            if (ev.success)
                start_send_locked(x);
            pthread_mutex_unlock(&x->lock);
            if (it) {
                grpc_byte_buffer_destroy(it->bb);
                free(it);
            }
            break;
        }
        case TAG_STATUS: {
            char *details = grpc_slice_to_c_string(x->status_details);
            char msg[512];
            snprintf(msg, sizeof(msg), "stream ended: status %d%s%s", (int)x->status,
                     details[0] ? ", " : "", details);
            gpr_free(details);
            grpc_slice_unref(x->status_details);
            x->status_received = 1;
            pthread_mutex_lock(&x->lock);
            x->call_over = 1;
            drop_sends_locked(x);
            pthread_mutex_unlock(&x->lock);
            post_code(x, XEV_DOWN, call_id, NULL, msg, x->status);
            break;
        }
        }
    }
    if (t_up.tv_sec || t_up.tv_nsec) {
        struct timespec t_end;
        clock_gettime(CLOCK_MONOTONIC, &t_end);
        *up_ms = (uint64_t)(t_end.tv_sec - t_up.tv_sec) * 1000 +
                 (uint64_t)((t_end.tv_nsec - t_up.tv_nsec) / 1000000);
    }
    pthread_mutex_lock(&x->lock);
    grpc_call_unref(x->call);
    x->call = NULL;
    x->call_over = 1;
    drop_sends_locked(x);
    pthread_mutex_unlock(&x->lock);
    grpc_metadata_array_destroy(&x->md_initial);
    grpc_metadata_array_destroy(&x->md_trailing);
    grpc_channel_destroy(x->channel);
    x->channel = NULL;
    return x->status_received ? x->status : GRPC_STATUS_UNAVAILABLE;
}

/*
 * The wait before the next attempt: full jitter, uniform in [0, cap] (`rnd`
 * is a random number), so a fleet that lost its controller does not come
 * back as one wave; then the cap doubles, up to BACKOFF_MAX_MS.
 */
static unsigned backoff_wait_ms(unsigned *cap_ms, unsigned rnd)
{
    unsigned wait = rnd % (*cap_ms + 1);
    *cap_ms = *cap_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : *cap_ms * 2;
    return wait;
}

static void *xds_thread(void *arg)
{
    sl_xds_t *x = arg;
    unsigned cap_ms = BACKOFF_BASE_MS;
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    while (!atomic_load(&x->stopping)) {
        uint64_t up_ms;
        int served;
        grpc_status_code st = run_call(x, &up_ms, &served);
        if (atomic_load(&x->stopping))
            break;
        /* A call that stayed connected a while, or got a push, was healthy. */
        if (up_ms >= BACKOFF_RESET_AFTER_MS || served)
            cap_ms = BACKOFF_BASE_MS;
        unsigned wait = backoff_wait_ms(&cap_ms, (unsigned)rand_r(&seed));
        /* Replaced by a newer stream of our node id: another runtime uses
         * it. Come back slowly (5 to 10 s) rather than take its stream at
         * once; both keep getting config, and the conflict stays visible. */
        if (st == GRPC_STATUS_ALREADY_EXISTS || st == GRPC_STATUS_UNAUTHENTICATED ||
            st == GRPC_STATUS_PERMISSION_DENIED) {
            cap_ms = BACKOFF_MAX_MS;
            wait = BACKOFF_MAX_MS / 2 + (unsigned)rand_r(&seed) % (BACKOFF_MAX_MS / 2 + 1);
        }
        struct timespec t0, now;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            if (atomic_load(&x->stopping))
                break;
            clock_gettime(CLOCK_MONOTONIC, &now);
            int64_t left = (int64_t)wait - ((int64_t)(now.tv_sec - t0.tv_sec) * 1000 +
                                            (now.tv_nsec - t0.tv_nsec) / 1000000);
            if (left <= 0)
                break;
            usleep((useconds_t)(left > 50 ? 50 : left) * 1000);
        }
    }
    return NULL;
}

/* ---- main thread ------------------------------------------------------------ */

static void queue_send(sl_xds_t *x, const ProtobufCMessage *msg, uint64_t call_id)
{
    grpc_byte_buffer *bb = sl_grpc_pack(msg);
    send_item_t *it = calloc(1, sizeof(*it));
    if (!bb || !it) {
        if (bb)
            grpc_byte_buffer_destroy(bb);
        free(it);
        return;
    }
    it->bb = bb;
    pthread_mutex_lock(&x->lock);
    if (!x->call || x->call_over || x->call_id != call_id) {
        pthread_mutex_unlock(&x->lock);
        grpc_byte_buffer_destroy(bb);
        free(it);
        return;
    }
    if (x->send_tail)
        x->send_tail->next = it;
    else
        x->send_head = it;
    x->send_tail = it;
    start_send_locked(x);
    pthread_mutex_unlock(&x->lock);
}

static void subscribe(sl_xds_t *x, uint64_t call_id)
{
    Sluice__V1__Node node = SLUICE__V1__NODE__INIT;
    node.id = (char *)x->opt.node_id;
    node.fleet = (char *)x->opt.fleet;
    node.build_version = (char *)x->opt.build_version;
    for (int t = 0; t < SL_XDS__COUNT; t++) {
        Sluice__V1__DiscoveryRequest req = SLUICE__V1__DISCOVERY_REQUEST__INIT;
        if (t == 0)
            req.node = &node;
        req.type_url = (char *)sl_xds_type_urls[t];
        /* What we run already: the controller sends nothing it would repeat. */
        req.version_info = x->types[t].version ? x->types[t].version : "";
        /* Delta: every resource held, by name and version (a wildcard
         * subscription: no resource_names_subscribe). */
        const type_state_t *ts = &x->types[t];
        Sluice__V1__DiscoveryRequest__InitialResourceVersionsEntry *ents = NULL, **ptrs = NULL;
        if (x->opt.delta) {
            req.incremental = 1;
            ents = calloc(ts->n + 1, sizeof(*ents));
            ptrs = calloc(ts->n + 1, sizeof(*ptrs));
            for (size_t i = 0; ents && ptrs && ts->versions && i < ts->n; i++) {
                sluice__v1__discovery_request__initial_resource_versions_entry__init(&ents[i]);
                ents[i].key = ts->names[i];
                ents[i].value = ts->versions[i];
                ptrs[req.n_initial_resource_versions++] = &ents[i];
            }
            req.initial_resource_versions = ptrs;
        }
        queue_send(x, &req.base, call_id);
        free(ents);
        free(ptrs);
    }
}

static void type_state_free(type_state_t *ts)
{
    for (size_t i = 0; i < ts->n; i++) {
        sl_pbshare_unref(ts->msgs[i]);
        free(ts->names[i]);
        if (ts->versions)
            free(ts->versions[i]);
    }
    free(ts->msgs);
    free(ts->names);
    free(ts->versions);
    ts->msgs = NULL;
    ts->names = NULL;
    ts->versions = NULL;
    ts->n = 0;
}

static const ProtobufCMessageDescriptor *type_descriptor(int t)
{
    switch (t) {
    case SL_XDS_SECRET:
        return &sluice__v1__tls_certificate__descriptor;
    case SL_XDS_CONSUMER:
        return &sluice__v1__consumer__descriptor;
    case SL_XDS_CLUSTER:
        return &sluice__v1__cluster__descriptor;
    case SL_XDS_SETTINGS:
        return &sluice__v1__gateway_settings__descriptor;
    case SL_XDS_ROUTE:
        return &sluice__v1__route_table__descriptor;
    default:
        return &sluice__v1__listener__descriptor;
    }
}

/* Does any route table of `routes` reference cluster `name`? */
static int cluster_referenced(const type_state_t *routes, const char *name)
{
    for (size_t i = 0; i < routes->n; i++) {
        const Sluice__V1__RouteTable *rt = (const Sluice__V1__RouteTable *)routes->msgs[i];
        for (size_t b = 0; b < rt->n_backends; b++)
            if (strcmp(rt->backends[b]->cluster, name) == 0)
                return 1;
        for (size_t r = 0; r < rt->n_routes; r++)
            for (size_t b = 0; b < rt->routes[r]->n_backends; b++)
                if (strcmp(rt->routes[r]->backends[b]->cluster, name) == 0)
                    return 1;
    }
    return 0;
}

static int name_in(char **names, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0)
            return 1;
    return 0;
}

/* Versions we hold were checked when they arrived (handle_response). */
static uint64_t parse_u64(const char *s)
{
    uint64_t v = 0;
    return sl_xds_version_parse(s, &v) == 0 ? v : 0;
}

/*
 * Builds the complete snapshot that results from `types` and applies it.
 * The snapshot is assembled by reference, then packed and unpacked so the
 * generation owns an independent copy. Returns 0 or -1 with err set.
 */
static int apply_state(sl_xds_t *x, type_state_t *types, int dry_run, char *err, size_t errlen)
{
    Sluice__V1__Snapshot snap = SLUICE__V1__SNAPSHOT__INIT;
    snap.fleet = (char *)x->opt.fleet;
    uint64_t version = 0;
    for (int t = 0; t < SL_XDS__COUNT; t++) {
        uint64_t v = parse_u64(types[t].version);
        if (v > version)
            version = v;
    }
    snap.version = version;
    snap.n_certificates = types[SL_XDS_SECRET].n;
    snap.certificates = (Sluice__V1__TlsCertificate **)types[SL_XDS_SECRET].msgs;
    snap.n_consumers = types[SL_XDS_CONSUMER].n;
    snap.consumers = (Sluice__V1__Consumer **)types[SL_XDS_CONSUMER].msgs;
    snap.n_clusters = types[SL_XDS_CLUSTER].n;
    snap.clusters = (Sluice__V1__Cluster **)types[SL_XDS_CLUSTER].msgs;
    snap.n_route_tables = types[SL_XDS_ROUTE].n;
    snap.route_tables = (Sluice__V1__RouteTable **)types[SL_XDS_ROUTE].msgs;
    snap.n_listeners = types[SL_XDS_LISTENER].n;
    snap.listeners = (Sluice__V1__Listener **)types[SL_XDS_LISTENER].msgs;
    snap.settings = types[SL_XDS_SETTINGS].n
                        ? (Sluice__V1__GatewaySettings *)types[SL_XDS_SETTINGS].msgs[0]
                        : NULL;
    /* The generation's snapshot shares the held messages (pbshare.h): no
     * copy, and an unchanged resource keeps its pointer, which is how the
     * new generation finds what it shares with the previous one. Packed
     * only for the cache (--cache-dir). */
    Sluice__V1__Snapshot *owned = sl_pbshare_snapshot(&snap);
    if (!owned) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    if (!dry_run && x->opt.cache) {
        len = protobuf_c_message_get_packed_size(&snap.base);
        buf = malloc(len ? len : 1);
        if (!buf) {
            sl_pbshare_snapshot_free(owned);
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        protobuf_c_message_pack(&snap.base, buf);
    }
    char source[256];
    snprintf(source, sizeof(source), "controller %s version %" PRIu64, x->opt.controller, version);
    if (dry_run) {
        free(buf);
        if (sl_config_check(x->cfg, owned, err, errlen) != 0) {
            sl_pbshare_snapshot_free(owned);
            return -1;
        }
        sl_generation_t *gen = sl_generation_build(owned, source, 1, err, errlen);
        if (!gen)
            return -1;
        sl_generation_discard(gen);
        return 0;
    }
    int rc = sl_config_apply(x->cfg, owned, source, err, errlen);
    /* Only what was applied is cached: a restart from the cache serves
     * exactly what this runtime served. */
    if (rc == 0) {
        if (buf)
            sl_snapcache_store(x->opt.cache, buf, len, version);
        /* The controller's config replaced a cached one, if any. */
        atomic_store(&sl_metrics_gauges.config_from_cache, 0);
    }
    free(buf);
    return rc;
}

static void send_ack_ex(sl_xds_t *x, uint64_t call_id, int t, const char *version,
                        const char *nonce, const char *error, char **rejected, size_t n_rejected)
{
    Sluice__V1__DiscoveryRequest req = SLUICE__V1__DISCOVERY_REQUEST__INIT;
    Sluice__V1__Status st = SLUICE__V1__STATUS__INIT;
    req.incremental = x->opt.delta;
    req.rejected_resources = rejected;
    req.n_rejected_resources = n_rejected;
    req.type_url = (char *)sl_xds_type_urls[t];
    req.version_info = (char *)(version ? version : "");
    req.response_nonce = (char *)nonce;
    if (error) {
        st.code = 3; /* INVALID_ARGUMENT */
        st.message = (char *)error;
        req.error_detail = &st;
    }
    queue_send(x, &req.base, call_id);
}

static void send_ack(sl_xds_t *x, uint64_t call_id, int t, const char *version, const char *nonce,
                     const char *error)
{
    send_ack_ex(x, call_id, t, version, nonce, error, NULL, 0);
}

/* ---- delta ------------------------------------------------------------------ */

/* Names compared segment by segment at '/' ("ns/name"): the order of the
 * controller's store (namespace, then name), so a set assembled from
 * deltas is in the order a state-of-the-world push would have. */
static inline unsigned name_byte(char c)
{
    /* '/' below every other byte but the end: a segment that is a prefix
     * of the other's sorts first, as does a name out of segments first. */
    return c == '\0' ? 0u : c == '/' ? 1u : (unsigned)(unsigned char)c + 1u;
}

static int name_cmp(const char *a, const char *b)
{
    for (;; a++, b++) {
        unsigned ca = name_byte(*a), cb = name_byte(*b);
        if (ca != cb)
            return ca < cb ? -1 : 1;
        if (!ca)
            return 0;
    }
}

/* One change of a delta response: a resource added or replaced (msg set),
 * or removed (msg NULL). */
typedef struct {
    const char *name;
    const char *version;
    ProtobufCMessage *msg;
    int accepted;
    int bad; /* does not decode: never accepted */
} change_t;

typedef struct {
    const char *name;
    const char *version;
    ProtobufCMessage *msg;
    ssize_t held; /* position in the held set, -1 for a new one */
} slot_t;

static int slot_cmp(const void *a, const void *b)
{
    return name_cmp(((const slot_t *)a)->name, ((const slot_t *)b)->name);
}

/*
 * The set of type t that results from the held one and the accepted
 * changes, sorted by name: *out (n, msgs, names, versions) points into the
 * held state and the changes (nothing is copied). -1 when out of memory.
 */
static int delta_merge(const type_state_t *held, const change_t *chg, size_t nchg,
                       type_state_t *out, slot_t **slots_out)
{
    slot_t *slots = calloc(held->n + nchg + 1, sizeof(*slots));
    slot_t *ch = calloc(nchg + 1, sizeof(*ch));
    if (!slots || !ch) {
        free(slots);
        free(ch);
        return -1;
    }
    /* The accepted changes by name (removals too: they take a held one
     * out); the held set is sorted, so one merge pass makes the result, in
     * time linear in the held set, not a sort of it per change. */
    size_t nc = 0;
    for (size_t k = 0; k < nchg; k++)
        if (chg[k].accepted)
            ch[nc++] = (slot_t){chg[k].name, chg[k].version, chg[k].msg, (ssize_t)k};
    qsort(ch, nc, sizeof(*ch), slot_cmp);
    size_t n = 0, i = 0, k = 0;
    int sorted = 1;
    while (i < held->n || k < nc) {
        if (i > 0 && i < held->n && name_cmp(held->names[i - 1], held->names[i]) > 0) {
            sorted = 0; /* not expected; sorted below instead */
            break;
        }
        int c = i == held->n ? 1 : k == nc ? -1 : name_cmp(held->names[i], ch[k].name);
        if (c < 0) {
            slots[n++] = (slot_t){held->names[i], held->versions ? held->versions[i] : "",
                                  held->msgs[i], (ssize_t)i};
            i++;
            continue;
        }
        if (c == 0)
            i++; /* replaced or removed */
        if (ch[k].msg)
            slots[n++] = (slot_t){ch[k].name, ch[k].version, ch[k].msg, -1};
        k++;
    }
    if (!sorted) {
        n = 0;
        for (i = 0; i < held->n; i++) {
            int gone = 0;
            for (k = 0; k < nchg && !gone; k++)
                gone = chg[k].accepted && strcmp(chg[k].name, held->names[i]) == 0;
            if (!gone)
                slots[n++] = (slot_t){held->names[i], held->versions ? held->versions[i] : "",
                                      held->msgs[i], (ssize_t)i};
        }
        for (k = 0; k < nchg; k++)
            if (chg[k].accepted && chg[k].msg)
                slots[n++] = (slot_t){chg[k].name, chg[k].version, chg[k].msg, -1};
        qsort(slots, n, sizeof(*slots), slot_cmp);
    }
    free(ch);
    memset(out, 0, sizeof(*out));
    out->n = n;
    out->msgs = calloc(n + 1, sizeof(*out->msgs));
    out->names = calloc(n + 1, sizeof(*out->names));
    out->versions = calloc(n + 1, sizeof(*out->versions));
    if (!out->msgs || !out->names || !out->versions) {
        free(out->msgs);
        free(out->names);
        free(out->versions);
        free(slots);
        return -1;
    }
    for (i = 0; i < n; i++) {
        out->msgs[i] = slots[i].msg;
        out->names[i] = (char *)slots[i].name;
        out->versions[i] = (char *)slots[i].version;
    }
    if (slots_out)
        *slots_out = slots;
    else
        free(slots);
    return 0;
}

static void merged_free(type_state_t *m)
{
    free(m->msgs);
    free(m->names);
    free(m->versions);
    memset(m, 0, sizeof(*m));
}

/* Builds (dry_run: checks) the config of `types` with type t replaced by
 * the held set plus the accepted changes. */
static int delta_try(sl_xds_t *x, int t, const change_t *chg, size_t nchg, int dry_run,
                     const char *version, char *err, size_t errlen)
{
    type_state_t cand[SL_XDS__COUNT];
    memcpy(cand, x->types, sizeof(cand));
    type_state_t m;
    if (delta_merge(&x->types[t], chg, nchg, &m, NULL) != 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (t == SL_XDS_SETTINGS && m.n > 1) {
        snprintf(err, errlen, "settings: %zu resources, expected one", m.n);
        merged_free(&m);
        return -1;
    }
    m.version = (char *)version;
    cand[t] = m;
    int rc = apply_state(x, cand, dry_run, err, errlen);
    if (rc != 0 && !err[0])
        snprintf(err, errlen, "cannot apply");
    merged_free(&m);
    return rc;
}

/*
 * A delta response: resources added or changed, names removed. All of it
 * is tried at once (one new generation); when that fails, each change is
 * tried on its own on top of those already accepted, so that a resource
 * that cannot be applied is NACKed by name (rejected_resources) while the
 * others of the response are applied, and it keeps its previous version
 * (or stays absent). Nothing is accepted before every type has arrived
 * once: until then the set is only checked, as in sotw.
 */
static void handle_delta_response(sl_xds_t *x, uint64_t call_id, int t,
                                  Sluice__V1__DiscoveryResponse *resp)
{
    char err[1024] = "";
    uint64_t pushed_version = 0;
    if (sl_xds_version_parse(resp->version_info, &pushed_version) != 0 || pushed_version == 0)
        snprintf(err, sizeof(err),
                 "%s version_info \"%.40s\" is not a version: a decimal integer from 1 to "
                 "9007199254740991 (2^53-1) is expected",
                 sl_xds_type_names[t], resp->version_info ? resp->version_info : "");
    else if (pushed_version < parse_u64(x->types[t].version))
        snprintf(err, sizeof(err),
                 "%s version %s is older than the running version %s; refusing a rollback",
                 sl_xds_type_names[t], resp->version_info, x->types[t].version);
    if (err[0]) {
        sl_log_error("controller push of %s version %s rejected: %s", sl_xds_type_names[t],
                     resp->version_info, err);
        free(x->last_error);
        x->last_error = strdup(err);
        x->updates_nacked++;
        atomic_fetch_add(&sl_metrics_gauges.controller_updates_nacked, 1);
        atomic_fetch_add(&sl_metrics_gauges.config_errors, 1);
        send_ack(x, call_id, t, x->types[t].version, resp->nonce, err);
        return;
    }
    /* A controller older than delta streams ignores `incremental` and
     * answers state of the world: resources without versions, no removals.
     * Such a response replaces the whole set (what it lacks is removed), so
     * runtimes can be upgraded before their controller. (An empty one reads
     * as "nothing changed": a type emptied on such a controller keeps its
     * resources until the controller is upgraded or --xds-mode sotw.) */
    int sotw_reply = resp->n_resources > 0 && resp->n_removed_resources == 0;
    for (size_t i = 0; sotw_reply && i < resp->n_resources; i++)
        sotw_reply = !resp->resources[i]->version || !resp->resources[i]->version[0];
    char **gone = NULL;
    size_t ngone = 0;
    const type_state_t *held0 = &x->types[t];
    if (sotw_reply) {
        gone = calloc(held0->n + 1, sizeof(char *));
        for (size_t j = 0; gone && j < held0->n; j++) {
            size_t i = 0;
            while (i < resp->n_resources &&
                   strcmp(resp->resources[i]->name ? resp->resources[i]->name : "",
                          held0->names[j]) != 0)
                i++;
            if (i == resp->n_resources && (gone[ngone] = strdup(held0->names[j])))
                ngone++;
        }
        if (!x->sotw_fallback_logged)
            sl_log_warn("controller %s answers delta subscriptions with state-of-the-world "
                        "responses (an older controller): applying them as such; upgrade it, "
                        "or run this runtime with --xds-mode sotw",
                        x->opt.controller);
        x->sotw_fallback_logged = 1;
    }
    size_t nchg = resp->n_resources + resp->n_removed_resources + ngone;
    change_t *chg = calloc(nchg + 1, sizeof(*chg));
    char **rejected = calloc(nchg + 1, sizeof(char *));
    if (!chg || !rejected) {
        free(chg);
        free(rejected);
        for (size_t i = 0; i < ngone; i++)
            free(gone[i]);
        free(gone);
        return;
    }
    size_t nrej = 0;
    char why[4096] = "";
    for (size_t i = 0; i < resp->n_resources; i++) {
        Sluice__V1__Resource *r = resp->resources[i];
        chg[i].name = r->name ? r->name : "";
        chg[i].version = r->version ? r->version : "";
        x->resources_received++;
        x->bytes_received += r->value.len;
        chg[i].msg =
            protobuf_c_message_unpack(type_descriptor(t), NULL, r->value.len, r->value.data);
        if (!chg[i].msg || !chg[i].name[0] || (!chg[i].version[0] && !sotw_reply)) {
            chg[i].bad = 1;
            size_t used = strlen(why);
            snprintf(why + used, sizeof(why) - used, "%s%s resource '%s': %s", used ? "; " : "",
                     sl_xds_type_names[t], chg[i].name,
                     !chg[i].msg ? "does not decode" : "has no name or no version");
        }
    }
    for (size_t i = 0; i < resp->n_removed_resources; i++)
        chg[resp->n_resources + i].name = resp->removed_resources[i];
    for (size_t i = 0; i < ngone; i++)
        chg[resp->n_resources + resp->n_removed_resources + i].name = gone[i];

    int all = 1;
    for (int i = 0; i < SL_XDS__COUNT; i++)
        all &= i == t || x->types[i].received;
    int dry = !all;
    size_t good = 0;
    for (size_t k = 0; k < nchg; k++)
        if (!chg[k].bad) {
            chg[k].accepted = 1;
            good++;
        }
    char e1[1024] = "";
    if (good && delta_try(x, t, chg, nchg, dry, resp->version_info, e1, sizeof(e1)) != 0) {
        if (good == 1) {
            for (size_t k = 0; k < nchg; k++)
                if (chg[k].accepted) {
                    chg[k].accepted = 0;
                    size_t used = strlen(why);
                    snprintf(why + used, sizeof(why) - used, "%s%s resource '%s'%s: %s",
                             used ? "; " : "", sl_xds_type_names[t], chg[k].name,
                             chg[k].msg ? "" : " (removal)", e1);
                }
        } else {
            /* One at a time on top of what passed: the bad ones stay out. */
            for (size_t k = 0; k < nchg; k++)
                chg[k].accepted = 0;
            for (size_t k = 0; k < nchg; k++) {
                if (chg[k].bad)
                    continue;
                chg[k].accepted = 1;
                char ek[1024] = "";
                if (delta_try(x, t, chg, nchg, dry, resp->version_info, ek, sizeof(ek)) != 0) {
                    chg[k].accepted = 0;
                    size_t used = strlen(why);
                    snprintf(why + used, sizeof(why) - used, "%s%s resource '%s'%s: %s",
                             used ? "; " : "", sl_xds_type_names[t], chg[k].name,
                             chg[k].msg ? "" : " (removal)", ek);
                }
            }
        }
    }
    size_t naccepted = 0;
    for (size_t k = 0; k < nchg; k++) {
        if (chg[k].accepted)
            naccepted++;
        else
            rejected[nrej++] = (char *)chg[k].name;
    }

    /* Commit what was accepted: the merged set owns copies of the new
     * names and versions; replaced and removed resources are freed. */
    if (naccepted) {
        type_state_t m;
        slot_t *slots = NULL;
        type_state_t *held = &x->types[t];
        if (delta_merge(held, chg, nchg, &m, &slots) == 0) {
            uint8_t *kept = calloc(held->n + 1, 1);
            for (size_t i = 0; i < m.n; i++) {
                if (slots[i].held >= 0) {
                    if (kept)
                        kept[slots[i].held] = 1;
                    /* moves: the held strings are reused as they are */
                } else {
                    m.names[i] = strdup(slots[i].name);
                    m.versions[i] = strdup(slots[i].version);
                }
            }
            for (size_t i = 0; i < held->n; i++) {
                if (kept && kept[i])
                    continue;
                sl_pbshare_unref(held->msgs[i]);
                free(held->names[i]);
                if (held->versions)
                    free(held->versions[i]);
            }
            /* Slots that came from the held set keep its strings; a held
             * set without versions (none yet) gets empty ones. */
            for (size_t i = 0; i < m.n; i++)
                if (slots[i].held >= 0 && !held->versions)
                    m.versions[i] = strdup("");
            free(kept);
            free(slots);
            free(held->msgs);
            free(held->names);
            free(held->versions);
            held->msgs = m.msgs;
            held->names = m.names;
            held->versions = m.versions;
            held->n = m.n;
            for (size_t k = 0; k < nchg; k++)
                if (chg[k].accepted)
                    chg[k].msg = NULL; /* owned by the held set now */
        }
        free(held->version);
        held->version = strdup(resp->version_info);
        held->received = 1;
    } else if (!nchg) {
        x->types[t].received = 1; /* an empty response: the type has nothing */
        free(x->types[t].version);
        x->types[t].version = strdup(resp->version_info);
    }
    for (size_t k = 0; k < nchg; k++)
        if (chg[k].msg)
            sl_pbshare_unref(chg[k].msg);

    x->last_update_ms = wall_ms();
    if (naccepted || !nrej)
        x->types[t].from_cache = 0;
    if (nrej) {
        sl_log_error("controller push of %s version %s: %zu of %zu resource%s rejected, the "
                     "others applied: %s",
                     sl_xds_type_names[t], resp->version_info, nrej, nchg, nchg == 1 ? "" : "s",
                     why);
        free(x->last_error);
        x->last_error = strdup(why);
        x->updates_nacked++;
        atomic_fetch_add(&sl_metrics_gauges.controller_updates_nacked, 1);
        atomic_fetch_add(&sl_metrics_gauges.config_errors, 1);
        send_ack_ex(x, call_id, t, x->types[t].version ? x->types[t].version : "", resp->nonce, why,
                    rejected, nrej);
    } else {
        x->updates_acked++;
        atomic_fetch_add(&sl_metrics_gauges.controller_updates_acked, 1);
        sl_log_info("controller delta of %s version %s applied (%zu changed, %zu removed)",
                    sl_xds_type_names[t], resp->version_info, resp->n_resources,
                    resp->n_removed_resources);
        send_ack(x, call_id, t, resp->version_info, resp->nonce, NULL);
    }
    int every = 1;
    for (int i = 0; i < SL_XDS__COUNT; i++)
        every &= x->types[i].received && !x->types[i].from_cache;
    /* Serving the cache and the controller confirmed every type, maybe
     * without changing anything: what runs is the controller's config now
     * (same content, its source and the cache flag say so). */
    if (every && !x->synced && atomic_load(&sl_metrics_gauges.config_from_cache)) {
        char e2[1024] = "";
        if (apply_state(x, x->types, 0, e2, sizeof(e2)) != 0)
            sl_log_error("controller config (confirming the cached one) cannot be applied: %s", e2);
    }
    if (every && !x->synced) {
        x->synced = 1;
        atomic_store(&sl_metrics_gauges.controller_synced, 1);
        sl_log_notice("controller config applied: every resource type received");
    }
    free(chg);
    free(rejected);
    for (size_t i = 0; i < ngone; i++)
        free(gone[i]);
    free(gone);
}

static void handle_response(sl_xds_t *x, uint64_t call_id, Sluice__V1__DiscoveryResponse *resp)
{
    if (x->opt.delta) {
        int t = sl_xds_type_from_url(resp->type_url ? resp->type_url : "");
        if (t < 0)
            sl_log_warn("controller pushed unknown type %s; ignored", resp->type_url);
        else
            handle_delta_response(x, call_id, t, resp);
        return;
    }
    int t = sl_xds_type_from_url(resp->type_url ? resp->type_url : "");
    char err[1024] = "";
    if (t < 0) {
        sl_log_warn("controller pushed unknown type %s; ignored", resp->type_url);
        return;
    }
    /* Decode every resource first: a push is all or nothing. */
    type_state_t next = {0};
    next.n = resp->n_resources;
    next.msgs = calloc(next.n ? next.n : 1, sizeof(*next.msgs));
    next.names = calloc(next.n ? next.n : 1, sizeof(*next.names));
    for (size_t i = 0; i < resp->n_resources; i++) {
        Sluice__V1__Resource *r = resp->resources[i];
        x->resources_received++;
        x->bytes_received += r->value.len;
        next.names[i] = strdup(r->name ? r->name : "");
        next.msgs[i] =
            protobuf_c_message_unpack(type_descriptor(t), NULL, r->value.len, r->value.data);
        if (!next.msgs[i]) {
            snprintf(err, sizeof(err), "%s resource '%s': does not decode as %s",
                     sl_xds_type_names[t], r->name, resp->type_url);
            /* Only [0, i) are complete; this one's name is ours too (fuzz
             * finding: it leaked on every such push). */
            free(next.names[i]);
            next.names[i] = NULL;
            next.n = i;
            break;
        }
    }
    if (t == SL_XDS_SETTINGS && !err[0] && next.n > 1)
        snprintf(err, sizeof(err), "settings: %zu resources, expected one", next.n);
    /* A version that is not one is refused, not read as 0 ("nothing"). */
    uint64_t pushed_version = 0;
    if (!err[0] &&
        (sl_xds_version_parse(resp->version_info, &pushed_version) != 0 || pushed_version == 0))
        snprintf(err, sizeof(err),
                 "%s version_info \"%.40s\" is not a version: a decimal integer from 1 to "
                 "9007199254740991 (2^53-1) is expected",
                 sl_xds_type_names[t], resp->version_info ? resp->version_info : "");
    /* Versions only go forward: an older one means a controller whose store
     * went back in time. Refuse it rather than roll the fleet back; the
     * controller moves its versions past ours when it sees this. */
    if (!err[0] && pushed_version < parse_u64(x->types[t].version))
        snprintf(err, sizeof(err),
                 "%s version %s is older than the running version %s; refusing a rollback",
                 sl_xds_type_names[t], resp->version_info ? resp->version_info : "",
                 x->types[t].version);

    type_state_t cand[SL_XDS__COUNT];
    memcpy(cand, x->types, sizeof(cand));
    type_state_t merged = {0};
    if (!err[0]) {
        if (t == SL_XDS_CLUSTER) {
            /* New clusters plus removed ones the active routes still use. */
            size_t extra = 0;
            const type_state_t *old = &x->types[SL_XDS_CLUSTER];
            merged.msgs = calloc(next.n + old->n + 1, sizeof(*merged.msgs));
            merged.names = calloc(next.n + old->n + 1, sizeof(*merged.names));
            memcpy(merged.msgs, next.msgs, next.n * sizeof(*merged.msgs));
            memcpy(merged.names, next.names, next.n * sizeof(*merged.names));
            for (size_t i = 0; i < old->n; i++) {
                if (!name_in(next.names, next.n, old->names[i]) &&
                    cluster_referenced(&x->types[SL_XDS_ROUTE], old->names[i])) {
                    merged.msgs[next.n + extra] = old->msgs[i];
                    merged.names[next.n + extra] = old->names[i];
                    extra++;
                }
            }
            merged.n = next.n + extra;
            cand[SL_XDS_CLUSTER] = merged;
        } else if (t == SL_XDS_ROUTE) {
            /* Clusters kept only for the old routes go when these don't use them. */
            const type_state_t *old = &x->types[SL_XDS_CLUSTER];
            merged.msgs = calloc(old->n + 1, sizeof(*merged.msgs));
            merged.names = calloc(old->n + 1, sizeof(*merged.names));
            for (size_t i = 0; i < old->n; i++) {
                if (x->cds_names && !name_in(x->cds_names, x->cds_n, old->names[i]) &&
                    !cluster_referenced(&next, old->names[i]))
                    continue;
                merged.msgs[merged.n] = old->msgs[i];
                merged.names[merged.n] = old->names[i];
                merged.n++;
            }
            cand[SL_XDS_CLUSTER] = merged;
            cand[SL_XDS_ROUTE] = next;
        } else {
            cand[t] = next;
        }
        cand[t].version = resp->version_info;
        int all = 1;
        for (int i = 0; i < SL_XDS__COUNT; i++)
            all &= i == t || x->types[i].received;
        /* Until every type has arrived once, check without publishing: the
         * first generation is complete, so /ready never reports a runtime
         * that has clusters but no routes. */
        if (apply_state(x, cand, !all, err, sizeof(err)) != 0 && !err[0])
            snprintf(err, sizeof(err), "cannot apply");
    }

    if (err[0]) {
        /* NACK: keep what we run, report the exact reason. */
        sl_log_error("controller push of %s version %s rejected: %s", sl_xds_type_names[t],
                     resp->version_info, err);
        free(x->last_error);
        x->last_error = strdup(err);
        x->updates_nacked++;
        atomic_fetch_add(&sl_metrics_gauges.controller_updates_nacked, 1);
        atomic_fetch_add(&sl_metrics_gauges.config_errors, 1);
        send_ack(x, call_id, t, x->types[t].version, resp->nonce, err);
        type_state_free(&next);
        free(merged.msgs);
        free(merged.names);
        return;
    }

    /* Commit: free what the new state no longer holds. */
    if (t == SL_XDS_CLUSTER) {
        type_state_t *old = &x->types[SL_XDS_CLUSTER];
        for (size_t i = 0; i < old->n; i++) {
            /* Old messages move into the new state only when retained for
             * the active routes; the rest are replaced or dropped. */
            int retained = 0;
            for (size_t j = next.n; j < merged.n; j++)
                retained |= merged.msgs[j] == old->msgs[i];
            if (!retained) {
                sl_pbshare_unref(old->msgs[i]);
                free(old->names[i]);
            }
        }
        free(old->msgs);
        free(old->names);
        old->msgs = merged.msgs;
        old->names = merged.names;
        old->n = merged.n;
        for (size_t i = 0; i < x->cds_n; i++)
            free(x->cds_names[i]);
        free(x->cds_names);
        x->cds_names = calloc(next.n + 1, sizeof(char *));
        x->cds_n = next.n;
        for (size_t i = 0; i < next.n; i++)
            x->cds_names[i] = strdup(next.names[i]);
        free(next.msgs);
        free(next.names);
    } else if (t == SL_XDS_ROUTE) {
        type_state_t *oldc = &x->types[SL_XDS_CLUSTER];
        for (size_t i = 0; i < oldc->n; i++) {
            int kept = 0;
            for (size_t j = 0; j < merged.n; j++)
                kept |= merged.msgs[j] == oldc->msgs[i];
            if (!kept) {
                sl_pbshare_unref(oldc->msgs[i]);
                free(oldc->names[i]);
            }
        }
        free(oldc->msgs);
        free(oldc->names);
        oldc->msgs = merged.msgs;
        oldc->names = merged.names;
        oldc->n = merged.n;
        type_state_free(&x->types[SL_XDS_ROUTE]);
        x->types[SL_XDS_ROUTE].msgs = next.msgs;
        x->types[SL_XDS_ROUTE].names = next.names;
        x->types[SL_XDS_ROUTE].n = next.n;
    } else {
        type_state_free(&x->types[t]);
        x->types[t].msgs = next.msgs;
        x->types[t].names = next.names;
        x->types[t].n = next.n;
    }
    free(x->types[t].version);
    x->types[t].version = strdup(resp->version_info ? resp->version_info : "");
    x->types[t].received = 1;
    x->updates_acked++;
    atomic_fetch_add(&sl_metrics_gauges.controller_updates_acked, 1);
    x->last_update_ms = wall_ms();
    int all = 1;
    for (int i = 0; i < SL_XDS__COUNT; i++)
        all &= x->types[i].received;
    if (all && !x->synced) {
        x->synced = 1;
        atomic_store(&sl_metrics_gauges.controller_synced, 1);
        sl_log_notice("controller config applied: every resource type received");
    }
    sl_log_info("controller push of %s version %s applied (%zu resources)", sl_xds_type_names[t],
                resp->version_info, resp->n_resources);
    send_ack(x, call_id, t, resp->version_info, resp->nonce, NULL);
}

static void events_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    sl_xds_t *x = arg;
    uint64_t v;
    ssize_t n = read(fd, &v, sizeof(v));
    (void)n;
    pthread_mutex_lock(&x->ev_lock);
    xds_event_t *e = x->ev_head;
    x->ev_head = x->ev_tail = NULL;
    pthread_mutex_unlock(&x->ev_lock);
    while (e) {
        xds_event_t *next = e->next;
        switch (e->kind) {
        case XEV_CALL:
            /* Responses of this call are ours from now on. */
            x->connected_call = e->call_id;
            subscribe(x, e->call_id);
            break;
        case XEV_UP:
            if (e->call_id != x->connected_call)
                break;
            x->connected = 1;
            x->failure_logged = 0;
            atomic_store(&sl_metrics_gauges.controller_connected, 1);
            atomic_fetch_add(&sl_metrics_gauges.controller_connects, 1);
            sl_log_notice("connected to controller %s as %s (fleet %s)", x->opt.controller,
                          x->opt.node_id, x->opt.fleet);
            break;
        case XEV_RESPONSE:
            if (e->call_id == x->connected_call)
                handle_response(x, e->call_id, e->resp);
            protobuf_c_message_free_unpacked(&e->resp->base, NULL);
            break;
        case XEV_DOWN:
            if (e->code == GRPC_STATUS_UNAUTHENTICATED || e->code == GRPC_STATUS_PERMISSION_DENIED)
                /* The controller's message says what to change. */
                sl_log_error("controller %s refused this runtime (%s): %s%s. Serving the last "
                             "good config, retrying in 5 to %d s",
                             x->opt.controller,
                             e->code == GRPC_STATUS_UNAUTHENTICATED ? "UNAUTHENTICATED"
                                                                    : "PERMISSION_DENIED",
                             e->message, x->client_cert ? "" : " (this runtime has no --cert)",
                             BACKOFF_MAX_MS / 1000);
            else if (e->code == GRPC_STATUS_ALREADY_EXISTS)
                sl_log_error("controller %s: %s; another runtime connected with node id %s: "
                             "give each runtime its own --node-id. Serving the last good config, "
                             "reconnecting in up to %d s",
                             x->opt.controller, e->message, x->opt.node_id, BACKOFF_MAX_MS / 1000);
            else if (x->connected)
                sl_log_warn("controller %s: %s; serving the last good config, reconnecting",
                            x->opt.controller, e->message);
            else if (!x->failure_logged)
                /* Once per outage: a controller that is down is no news
                 * after the first line; a TLS mismatch looks the same. */
                sl_log_warn("controller %s: cannot connect: %s; retrying with back-off (%s)",
                            x->opt.controller, e->message,
                            x->tls ? "with --controller-ca: check that the controller serves "
                                     "TLS, that its certificate is issued by that CA and names "
                                     "the host of --controller"
                                   : "if the controller serves TLS, give --controller-ca");
            x->failure_logged = 1;
            x->connected = 0;
            atomic_store(&sl_metrics_gauges.controller_connected, 0);
            atomic_fetch_add(&sl_metrics_gauges.controller_stream_failures, 1);
            free(x->last_error);
            x->last_error = e->message;
            e->message = NULL;
            break;
        }
        free(e->message);
        free(e);
        e = next;
    }
}

sl_xds_t *sl_xds_start(struct event_base *base, const sl_xds_options_t *opt, sl_config_t *cfg,
                       char *err, size_t errlen)
{
    sl_xds_t *x = calloc(1, sizeof(*x));
    if (!x) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    x->opt = *opt;
    x->cfg = cfg;
    if (RAND_bytes(x->dump_key, sizeof(x->dump_key)) != 1) {
        snprintf(err, errlen, "controller client: no random bytes for the dump key");
        free(x);
        return NULL;
    }
    x->t_start.kind = TAG_START;
    x->t_md.kind = TAG_MD;
    x->t_recv.kind = TAG_RECV;
    x->t_send.kind = TAG_SEND;
    x->t_status.kind = TAG_STATUS;
    pthread_mutex_init(&x->lock, NULL);
    pthread_mutex_init(&x->ev_lock, NULL);
    x->ev_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    x->ev = x->ev_fd >= 0 ? event_new(base, x->ev_fd, EV_READ | EV_PERSIST, events_cb, x) : NULL;
    if (!x->ev || event_add(x->ev, NULL) != 0) {
        snprintf(err, errlen, "controller client: %s", strerror(errno));
        goto fail;
    }
    /* gRPC copies the PEM texts; the caller wipes its own. */
    x->tls = opt->ca_pem != NULL;
    x->client_cert = x->tls && opt->cert_pem && opt->key_pem;
    if (x->tls) {
        grpc_ssl_pem_key_cert_pair pair = {.private_key = opt->key_pem,
                                           .cert_chain = opt->cert_pem};
        x->creds =
            grpc_ssl_credentials_create(opt->ca_pem, x->client_cert ? &pair : NULL, NULL, NULL);
    } else {
        x->creds = grpc_insecure_credentials_create();
    }
    x->opt.ca_pem = x->opt.cert_pem = x->opt.key_pem = NULL;
    if (!x->creds) {
        snprintf(err, errlen,
                 "--controller %s: gRPC refused the TLS credentials (check "
                 "--controller-ca, --cert and --key)",
                 opt->controller);
        goto fail;
    }
    /* The target is checked here, so a bad --controller fails at start-up;
     * the calls use channels of their own (run_call). */
    grpc_channel *probe = new_channel(x);
    if (!probe) {
        snprintf(err, errlen, "--controller %s: cannot create a channel", opt->controller);
        goto fail;
    }
    grpc_channel_destroy(probe);
    x->cq = grpc_completion_queue_create_for_next(NULL);
    if (pthread_create(&x->thread, NULL, xds_thread, x) != 0) {
        snprintf(err, errlen, "cannot start the controller client thread");
        goto fail;
    }
    return x;
fail:
    if (x->creds)
        grpc_channel_credentials_release(x->creds);
    if (x->cq)
        grpc_completion_queue_destroy(x->cq);
    if (x->ev)
        event_free(x->ev);
    if (x->ev_fd >= 0)
        close(x->ev_fd);
    free(x);
    return NULL;
}

/* FNV-1a 64, as the controller computes Resource.version (core.c). */
static uint64_t fnv1a(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

void sl_xds_seed(sl_xds_t *x, const Sluice__V1__Snapshot *snap)
{
    if (!x || !x->opt.delta || !snap)
        return;
    for (int t = 0; t < SL_XDS__COUNT; t++)
        if (x->types[t].received)
            return; /* the controller was first */
    for (int t = 0; t < SL_XDS__COUNT; t++) {
        size_t n = 0;
        ProtobufCMessage *const *src = NULL;
        switch (t) {
        case SL_XDS_SECRET:
            n = snap->n_certificates;
            src = (ProtobufCMessage *const *)snap->certificates;
            break;
        case SL_XDS_CONSUMER:
            n = snap->n_consumers;
            src = (ProtobufCMessage *const *)snap->consumers;
            break;
        case SL_XDS_CLUSTER:
            n = snap->n_clusters;
            src = (ProtobufCMessage *const *)snap->clusters;
            break;
        case SL_XDS_SETTINGS:
            n = snap->settings ? 1 : 0;
            src = (ProtobufCMessage *const *)&snap->settings;
            break;
        case SL_XDS_ROUTE:
            n = snap->n_route_tables;
            src = (ProtobufCMessage *const *)snap->route_tables;
            break;
        default:
            n = snap->n_listeners;
            src = (ProtobufCMessage *const *)snap->listeners;
            break;
        }
        type_state_t *ts = &x->types[t];
        ts->msgs = calloc(n + 1, sizeof(*ts->msgs));
        ts->names = calloc(n + 1, sizeof(*ts->names));
        ts->versions = calloc(n + 1, sizeof(*ts->versions));
        if (!ts->msgs || !ts->names || !ts->versions) {
            type_state_free(ts);
            continue;
        }
        for (size_t i = 0; i < n; i++) {
            const char *name = t == SL_XDS_SETTINGS   ? "settings"
                               : t == SL_XDS_SECRET   ? snap->certificates[i]->name
                               : t == SL_XDS_CONSUMER ? snap->consumers[i]->name
                               : t == SL_XDS_CLUSTER  ? snap->clusters[i]->name
                               : t == SL_XDS_ROUTE    ? snap->route_tables[i]->name
                                                      : snap->listeners[i]->name;
            size_t len = protobuf_c_message_get_packed_size(src[i]);
            uint8_t *buf = malloc(len ? len : 1);
            if (!buf)
                break;
            protobuf_c_message_pack(src[i], buf);
            uint64_t h = fnv1a(0xcbf29ce484222325ULL, name, strlen(name) + 1);
            h = fnv1a(h, buf, len);
            char v[17];
            snprintf(v, sizeof(v), "%016" PRIx64, h);
            ts->msgs[ts->n] = protobuf_c_message_unpack(type_descriptor(t), NULL, len, buf);
            free(buf);
            if (!ts->msgs[ts->n])
                break;
            ts->names[ts->n] = strdup(name);
            ts->versions[ts->n] = strdup(v);
            ts->n++;
        }
        /* No version of the type: the controller answers every type once
         * (an empty response when nothing differs), which ends from_cache. */
        ts->received = 1;
        ts->from_cache = 1;
    }
    /* A call already made subscribed with nothing held: the controller
     * would never learn of (nor remove) what the cache holds. End it and
     * ignore what it may still deliver; the next call reports the cache. */
    x->connected_call = 0;
    pthread_mutex_lock(&x->lock);
    if (x->call && !x->call_over)
        grpc_call_cancel(x->call, NULL);
    pthread_mutex_unlock(&x->lock);
    sl_log_info("config stream: the cached config's resources are reported to the controller on "
                "the next call, which sends only what differs");
}

int sl_xds_synced(const sl_xds_t *x)
{
    return x->synced;
}

json_t *sl_xds_status_json(sl_xds_t *x)
{
    json_t *versions = json_object();
    for (int t = 0; t < SL_XDS__COUNT; t++)
        json_object_set_new(versions, sl_xds_type_names[t],
                            json_string(x->types[t].version ? x->types[t].version : ""));
    /* Delta: every resource held, by type, name -> version. A version is
     * an unkeyed hash of the resource's content, secrets included (a jwt
     * HMAC secret in a route table): shown as is, a weak secret could be
     * guessed offline from it and the rest of /config_dump. So it is shown
     * as SHA-256(key || version) cut to 16 hex digits, with a key drawn at
     * start: equal versions look equal within one run of the runtime, and
     * nothing can be tested against them. */
    json_t *held = json_object();
    for (int t = 0; x->opt.delta && t < SL_XDS__COUNT; t++) {
        json_t *m = json_object();
        for (size_t i = 0; i < x->types[t].n; i++) {
            const char *v = x->types[t].versions ? x->types[t].versions[i] : "";
            unsigned char in[16 + 64], md[EVP_MAX_MD_SIZE];
            unsigned mdlen = 0;
            size_t vl = strnlen(v, 64);
            memcpy(in, x->dump_key, 16);
            memcpy(in + 16, v, vl);
            char hex[17] = "";
            if (EVP_Digest(in, 16 + vl, md, &mdlen, EVP_sha256(), NULL) == 1 && mdlen >= 8)
                for (int k = 0; k < 8; k++)
                    snprintf(hex + 2 * k, 3, "%02x", md[k]);
            json_object_set_new(m, x->types[t].names[i], json_string(hex));
        }
        json_object_set_new(held, sl_xds_type_names[t], m);
    }
    json_t *out =
        json_pack("{s:s, s:s, s:s, s:s, s:b, s:b, s:o, s:I, s:I, s:s}", "controller",
                  x->opt.controller, "node_id", x->opt.node_id, "fleet", x->opt.fleet, "transport",
                  x->client_cert ? "mtls"
                  : x->tls       ? "tls"
                                 : "plaintext",
                  "connected", x->connected, "synced", x->synced, "versions", versions,
                  "updates_acked", (json_int_t)x->updates_acked, "updates_nacked",
                  (json_int_t)x->updates_nacked, "last_error", x->last_error ? x->last_error : "");
    if (!out) {
        json_decref(held);
        return NULL;
    }
    json_object_set_new(out, "mode", json_string(x->opt.delta ? "delta" : "sotw"));
    json_object_set_new(out, "resources_received", json_integer((json_int_t)x->resources_received));
    json_object_set_new(out, "bytes_received", json_integer((json_int_t)x->bytes_received));
    if (x->opt.delta)
        json_object_set_new(out, "resources", held);
    else
        json_decref(held);
    return out;
}

void sl_xds_stop(sl_xds_t *x)
{
    if (!x)
        return;
    atomic_store(&x->stopping, 1);
    pthread_mutex_lock(&x->lock);
    if (x->call)
        grpc_call_cancel(x->call, NULL);
    pthread_mutex_unlock(&x->lock);
    pthread_join(x->thread, NULL);
    grpc_completion_queue_shutdown(x->cq);
    while (grpc_completion_queue_next(x->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(x->cq);
    grpc_channel_credentials_release(x->creds);
    events_cb(x->ev_fd, EV_READ, x); /* free queued events */
    event_free(x->ev);
    close(x->ev_fd);
    for (int t = 0; t < SL_XDS__COUNT; t++) {
        type_state_free(&x->types[t]);
        free(x->types[t].version);
    }
    for (size_t i = 0; i < x->cds_n; i++)
        free(x->cds_names[i]);
    free(x->cds_names);
    free(x->last_error);
    pthread_mutex_destroy(&x->lock);
    pthread_mutex_destroy(&x->ev_lock);
    free(x);
}
