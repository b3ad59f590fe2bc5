/*
 * Config stream server on the gRPC core C API (stream.h).
 *
 * Threads: the completion-queue thread runs cq_thread() and is the only one
 * that sees gRPC completions; the main thread only calls sl_stream_send
 * (grpc_call_start_batch may be called from any thread) and receives events
 * through `events` + eventfd.
 *
 * Lifetime of a stream: one reference per started batch (released by its
 * completion) and one for the main thread (released after on_close ran).
 * The call is unref'd and the struct freed at zero.
 *
 * Limits (sl_stream_server_set_limits), against a fleet that reconnects at
 * once: past --max-streams a new call is ended at once with
 * RESOURCE_EXHAUSTED (the runtime backs off with jitter and comes back, or
 * its load balancer sends it to another replica) before any work is done
 * for it; and new calls are accepted at most --stream-accept-rate per
 * second: an accept is posted again only when the token bucket allows, so
 * the calls beyond wait inside gRPC in arrival order (served in order,
 * nothing refused, no burst of pushes). Per runtime at most one response
 * is in flight (core.c waits for its ACK), so no send queue grows.
 *
 * TLS (sl_stream_tls_t): gRPC's SSL server credentials. With a client CA
 * the handshake asks for a client certificate and verifies any that is
 * presented against the CA (an untrusted one never gets a connection), but
 * does not insist on one (GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY
 * rather than ..._REQUIRE_...): a runtime without a certificate then gets
 * a call, which the core ends at once with UNAUTHENTICATED saying why, and
 * counts; a failed handshake would reach neither the runtime's log nor our
 * counters as anything but "handshake failed". Nothing such a call sends
 * is read (no RECV_MESSAGE is posted). The peer's certificate names are
 * read from the call's auth context when the call starts, on the queue
 * thread, before EV_OPEN; after that they are read-only.
 */
#include "stream.h"

#include "controller.h"
#include "grpc_util.h"
#include "log.h"

#include <errno.h>
#include <event2/event.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define PENDING_CALLS 8     /* accepts posted ahead, so connection bursts queue in gRPC */
#define PEER_NAMES_MAX 32   /* certificate names kept per stream */
#define PEER_NAMES_TEXT 512 /* their description in messages */

enum tag_kind {
    TAG_NEW_CALL = 1,
    TAG_RECV,
    TAG_SEND,
    TAG_CLOSE,
    TAG_START,
    TAG_STATUS,
    TAG_SHUTDOWN
};

typedef struct {
    enum tag_kind kind;
    sl_stream_t *s;
} tag_t;

typedef struct send_item {
    grpc_byte_buffer *bb;
    struct send_item *next;
} send_item_t;

struct sl_stream {
    sl_stream_server_t *srv;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array request_md;
    int cancelled;
    grpc_byte_buffer *recv_buf;
    atomic_int refs;
    pthread_mutex_t lock;
    send_item_t *send_head, *send_tail;
    send_item_t *send_inflight; /* gRPC reads its buffer until TAG_SEND */
    unsigned queued;
    int send_busy;
    int over; /* call finished: no more sends */
    int status_sent;
    char *peer;
    void *user;
    tag_t t_new, t_recv, t_send, t_close, t_start, t_status;
    /* the client certificate (TLS with a client CA only) */
    int has_cert;
    int names_are_cn; /* no SAN at all: names[] holds the CN */
    int has_fleets;   /* some names are SL_STREAM_FLEET_URI_PREFIX URIs */
    size_t n_names;   /* DNS and URI SANs, or the CN */
    char *names[PEER_NAMES_MAX];
    enum name_kind { NAME_EXACT, NAME_DNS, NAME_FLEET } name_kind[PEER_NAMES_MAX];
    char names_text[PEER_NAMES_TEXT];
};

enum ev_kind { EV_OPEN = 1, EV_REQUEST, EV_CLOSE };

typedef struct stream_event {
    enum ev_kind kind;
    sl_stream_t *s;
    Sluice__V1__DiscoveryRequest *req;
    struct stream_event *next;
} stream_event_t;

struct sl_stream_server {
    grpc_server *server;
    grpc_completion_queue *cq;
    void *method;
    int port;
    int tls, client_auth;
    pthread_t thread;
    int thread_started;
    atomic_int shutting_down;
    atomic_int live_streams;
    /* Limits (0 = none); the bucket is the queue thread's alone. */
    atomic_uint max_streams;
    atomic_uint accept_rate; /* new calls per second, also the burst */
    double tokens;
    uint64_t refilled_ns;
    unsigned deferred_accepts; /* accepts owed, posted as tokens come */
    int shutdown_done;
    tag_t t_shutdown;
    sl_stream_hooks_t hooks;
    /* events for the main thread */
    pthread_mutex_t ev_lock;
    stream_event_t *ev_head, *ev_tail;
    int ev_fd;
    struct event *ev;
};

static void stream_unref(sl_stream_t *s)
{
    if (atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    sl_stream_server_t *srv = s->srv;
    if (s->call)
        grpc_call_unref(s->call);
    grpc_metadata_array_destroy(&s->request_md);
    send_item_t *it = s->send_head;
    while (it) {
        send_item_t *next = it->next;
        grpc_byte_buffer_destroy(it->bb);
        free(it);
        it = next;
    }
    if (s->peer)
        gpr_free(s->peer);
    for (size_t i = 0; i < s->n_names; i++)
        free(s->names[i]);
    pthread_mutex_destroy(&s->lock);
    int was_call = s->t_start.kind == TAG_START;
    free(s);
    if (was_call)
        atomic_fetch_sub(&srv->live_streams, 1);
}

static void post_event(sl_stream_server_t *srv, enum ev_kind kind, sl_stream_t *s,
                       Sluice__V1__DiscoveryRequest *req)
{
    stream_event_t *e = calloc(1, sizeof(*e));
    if (!e) {
        /* Without the event the main thread would leak the stream's main
         * reference; this is start-up class OOM, so say it loudly. */
        sl_log_alert("stream: out of memory queueing an event");
        if (req)
            protobuf_c_message_free_unpacked(&req->base, NULL);
        return;
    }
    e->kind = kind;
    e->s = s;
    e->req = req;
    pthread_mutex_lock(&srv->ev_lock);
    if (srv->ev_tail)
        srv->ev_tail->next = e;
    else
        srv->ev_head = e;
    srv->ev_tail = e;
    pthread_mutex_unlock(&srv->ev_lock);
    uint64_t one = 1;
    ssize_t n = write(srv->ev_fd, &one, sizeof(one));
    (void)n;
}

static void events_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    sl_stream_server_t *srv = arg;
    uint64_t v;
    ssize_t n = read(fd, &v, sizeof(v));
    (void)n;
    pthread_mutex_lock(&srv->ev_lock);
    stream_event_t *e = srv->ev_head;
    srv->ev_head = srv->ev_tail = NULL;
    pthread_mutex_unlock(&srv->ev_lock);
    while (e) {
        stream_event_t *next = e->next;
        switch (e->kind) {
        case EV_OPEN:
            srv->hooks.on_open(srv->hooks.ctx, e->s);
            break;
        case EV_REQUEST:
            srv->hooks.on_request(srv->hooks.ctx, e->s, e->req);
            break;
        case EV_CLOSE:
            srv->hooks.on_close(srv->hooks.ctx, e->s);
            stream_unref(e->s); /* the main thread's reference */
            break;
        }
        free(e);
        e = next;
    }
}

static sl_stream_t *stream_new(sl_stream_server_t *srv)
{
    sl_stream_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->srv = srv;
    grpc_metadata_array_init(&s->request_md);
    pthread_mutex_init(&s->lock, NULL);
    s->t_new = (tag_t){TAG_NEW_CALL, s};
    s->t_recv = (tag_t){TAG_RECV, s};
    s->t_send = (tag_t){TAG_SEND, s};
    s->t_close = (tag_t){TAG_CLOSE, s};
    s->t_status = (tag_t){TAG_STATUS, s};
    atomic_init(&s->refs, 1); /* the pending accept */
    return s;
}

static int post_accept(sl_stream_server_t *srv)
{
    sl_stream_t *s = stream_new(srv);
    if (!s)
        return -1;
    grpc_call_error e =
        grpc_server_request_registered_call(srv->server, srv->method, &s->call, &s->deadline,
                                            &s->request_md, NULL, srv->cq, srv->cq, &s->t_new);
    if (e != GRPC_CALL_OK) {
        sl_log_error("stream: cannot post an accept (grpc error %d)", (int)e);
        stream_unref(s);
        return -1;
    }
    return 0;
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void refill(sl_stream_server_t *srv, unsigned rate)
{
    uint64_t now = mono_ns();
    if (!srv->refilled_ns) /* the first call: a full bucket */
        srv->tokens = rate;
    else
        srv->tokens += (double)(now - srv->refilled_ns) * rate / 1e9;
    if (srv->tokens > rate)
        srv->tokens = rate;
    srv->refilled_ns = now;
}

/* Replaces a consumed accept, or owes it until the bucket has a token. */
static void accept_next(sl_stream_server_t *srv)
{
    unsigned rate = atomic_load(&srv->accept_rate);
    if (rate) {
        refill(srv, rate);
        if (srv->tokens < 1) {
            srv->deferred_accepts++;
            atomic_fetch_add(&sl_ctrl_metrics.stream_accepts_deferred, 1);
            return;
        }
        srv->tokens -= 1;
    }
    post_accept(srv);
}

/* Posts the accepts owed that the bucket allows now; the wait until the
 * next one is due (ms), or -1 when none is owed. */
static int pay_deferred(sl_stream_server_t *srv)
{
    if (!srv->deferred_accepts)
        return -1;
    if (atomic_load(&srv->shutting_down)) {
        srv->deferred_accepts = 0;
        return -1;
    }
    unsigned rate = atomic_load(&srv->accept_rate);
    if (rate)
        refill(srv, rate);
    while (srv->deferred_accepts && (!rate || srv->tokens >= 1)) {
        if (rate)
            srv->tokens -= 1;
        srv->deferred_accepts--;
        post_accept(srv);
    }
    if (!srv->deferred_accepts)
        return -1;
    int ms = (int)((1 - srv->tokens) * 1000 / rate) + 1;
    return ms < 1 ? 1 : ms;
}

/* Ends a new call at once, before any work for it (over --max-streams):
 * the accept's reference goes with the status batch. */
static void reject_call(sl_stream_t *s, unsigned max)
{
    char msg[160];
    snprintf(msg, sizeof(msg),
             "the controller serves at most %u streams (--max-streams %u); retry later or "
             "reach another replica",
             max, max);
    grpc_op ops[3];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[1].data.recv_close_on_server.cancelled = &s->cancelled;
    ops[2].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[2].data.send_status_from_server.status = GRPC_STATUS_RESOURCE_EXHAUSTED;
    grpc_slice details = grpc_slice_from_copied_string(msg);
    ops[2].data.send_status_from_server.status_details = &details;
    s->status_sent = 1;
    s->over = 1;
    atomic_fetch_add(&sl_ctrl_metrics.streams_over_limit, 1);
    if (grpc_call_start_batch(s->call, ops, 3, &s->t_status, NULL) != GRPC_CALL_OK)
        stream_unref(s);
    grpc_slice_unref(details);
}

void sl_stream_server_set_limits(sl_stream_server_t *srv, unsigned max_streams,
                                 unsigned accepts_per_second)
{
    atomic_store(&srv->max_streams, max_streams);
    atomic_store(&srv->accept_rate, accepts_per_second);
}

static void arm_recv(sl_stream_t *s)
{
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &s->recv_buf;
    atomic_fetch_add(&s->refs, 1);
    if (grpc_call_start_batch(s->call, &op, 1, &s->t_recv, NULL) != GRPC_CALL_OK) {
        stream_unref(s);
    }
}

/* Ends the call with a status (once). Caller holds s->lock. */
static void send_status_locked(sl_stream_t *s, grpc_status_code code, const char *msg)
{
    if (s->status_sent)
        return;
    s->status_sent = 1;
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    op.data.send_status_from_server.trailing_metadata_count = 0;
    op.data.send_status_from_server.status = code;
    grpc_slice details = grpc_slice_from_copied_string(msg);
    op.data.send_status_from_server.status_details = &details;
    atomic_fetch_add(&s->refs, 1);
    if (grpc_call_start_batch(s->call, &op, 1, &s->t_status, NULL) != GRPC_CALL_OK)
        atomic_fetch_sub(&s->refs, 1);
    grpc_slice_unref(details);
}

/* Appends to the stream's certificate names and to their description
 * ("DNS:a, URI:b"). */
static void add_name(sl_stream_t *s, const grpc_auth_property *p, const char *kind,
                     enum name_kind nk)
{
    if (s->n_names >= PEER_NAMES_MAX || !p->value)
        return;
    char *v = strndup(p->value, p->value_length);
    if (!v)
        return;
    if (nk == NAME_EXACT && !s->names_are_cn &&
        strncmp(v, SL_STREAM_FLEET_URI_PREFIX, strlen(SL_STREAM_FLEET_URI_PREFIX)) == 0) {
        nk = NAME_FLEET;
        s->has_fleets = 1;
    }
    s->name_kind[s->n_names] = nk;
    s->names[s->n_names++] = v;
    /* The description, for messages and logs: printable ASCII only. */
    char shown[128];
    size_t k = 0, vlen = strlen(v);
    for (; k < vlen && k < sizeof(shown) - 4; k++)
        shown[k] = v[k] > ' ' && v[k] <= '~' ? v[k] : '?';
    if (k < vlen) {
        memcpy(shown + k, "...", 3);
        k += 3;
    }
    shown[k] = '\0';
    size_t len = strlen(s->names_text);
    if (len < sizeof(s->names_text))
        snprintf(s->names_text + len, sizeof(s->names_text) - len, "%s%s:%s", len ? ", " : "", kind,
                 shown);
}

static int has_property(const grpc_auth_context *ctx, const char *name)
{
    grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(ctx, name);
    return grpc_auth_property_iterator_next(&it) != NULL;
}

/* The names of the peer's certificate, from the call's auth context: its
 * DNS and URI SANs, or its CN when it has no SAN at all (RFC 6125: a CN
 * counts only without SANs). */
static void read_peer_certificate(sl_stream_t *s)
{
    grpc_auth_context *ctx = grpc_call_auth_context(s->call);
    if (!ctx)
        return;
    s->has_cert = has_property(ctx, GRPC_X509_PEM_CERT_PROPERTY_NAME) ||
                  has_property(ctx, GRPC_X509_SUBJECT_PROPERTY_NAME);
    const grpc_auth_property *p;
    if (has_property(ctx, GRPC_X509_SAN_PROPERTY_NAME)) {
        grpc_auth_property_iterator it =
            grpc_auth_context_find_properties_by_name(ctx, GRPC_PEER_DNS_PROPERTY_NAME);
        while ((p = grpc_auth_property_iterator_next(&it)))
            add_name(s, p, "DNS", NAME_DNS);
        it = grpc_auth_context_find_properties_by_name(ctx, GRPC_PEER_URI_PROPERTY_NAME);
        while ((p = grpc_auth_property_iterator_next(&it)))
            add_name(s, p, "URI", NAME_EXACT);
    } else {
        grpc_auth_property_iterator it =
            grpc_auth_context_find_properties_by_name(ctx, GRPC_X509_CN_PROPERTY_NAME);
        if ((p = grpc_auth_property_iterator_next(&it))) {
            s->names_are_cn = 1;
            add_name(s, p, "CN", NAME_EXACT);
        }
    }
    grpc_auth_context_release(ctx);
}

static void start_call(sl_stream_server_t *srv, sl_stream_t *s)
{
    atomic_fetch_add(&srv->live_streams, 1);
    s->t_start.kind = TAG_START;
    s->t_start.s = s;
    s->peer = grpc_call_get_peer(s->call);
    if (srv->client_auth)
        read_peer_certificate(s);
    /* The accept reference becomes the main thread's reference. */
    grpc_op ops[2];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = 0;
    ops[1].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[1].data.recv_close_on_server.cancelled = &s->cancelled;
    atomic_fetch_add(&s->refs, 1);
    if (grpc_call_start_batch(s->call, ops, 2, &s->t_close, NULL) != GRPC_CALL_OK) {
        atomic_fetch_sub(&s->refs, 1);
        sl_log_error("stream %s: cannot start the call", s->peer);
        s->over = 1;
        post_event(srv, EV_OPEN, s, NULL);
        post_event(srv, EV_CLOSE, s, NULL);
        return;
    }
    post_event(srv, EV_OPEN, s, NULL);
    /* Without a certificate nothing the peer sends is read: the core
     * refuses the stream on open. */
    if (!srv->client_auth || s->has_cert)
        arm_recv(s);
}

static void start_send_locked(sl_stream_t *s)
{
    while (!s->send_busy && s->send_head && !s->over) {
        send_item_t *it = s->send_head;
        s->send_head = it->next;
        if (!s->send_head)
            s->send_tail = NULL;
        s->queued--;
        grpc_op op;
        memset(&op, 0, sizeof(op));
        op.op = GRPC_OP_SEND_MESSAGE;
        op.data.send_message.send_message = it->bb;
        atomic_fetch_add(&s->refs, 1);
        s->send_busy = 1;
        s->send_inflight = it;
        if (grpc_call_start_batch(s->call, &op, 1, &s->t_send, NULL) != GRPC_CALL_OK) {
            atomic_fetch_sub(&s->refs, 1);
            s->send_busy = 0;
            s->send_inflight = NULL;
            grpc_byte_buffer_destroy(it->bb);
            free(it);
        }
    }
}

void sl_stream_send(sl_stream_t *s, grpc_byte_buffer *bb)
{
    send_item_t *it = calloc(1, sizeof(*it));
    if (!it) {
        grpc_byte_buffer_destroy(bb);
        return;
    }
    it->bb = bb;
    pthread_mutex_lock(&s->lock);
    if (s->over) {
        pthread_mutex_unlock(&s->lock);
        grpc_byte_buffer_destroy(bb);
        free(it);
        return;
    }
    if (s->send_tail)
        s->send_tail->next = it;
    else
        s->send_head = it;
    s->send_tail = it;
    s->queued++;
    start_send_locked(s);
    pthread_mutex_unlock(&s->lock);
}

void sl_stream_close(sl_stream_t *s, grpc_status_code code, const char *msg)
{
    pthread_mutex_lock(&s->lock);
    if (!s->over) {
        /* Nothing queued goes out after the status; on_close follows when
         * the call completes (RECV_CLOSE_ON_SERVER). */
        s->over = 1;
        send_status_locked(s, code, msg);
    }
    pthread_mutex_unlock(&s->lock);
}

unsigned sl_stream_queued(const sl_stream_t *s)
{
    return s->queued + (unsigned)s->send_busy;
}

const char *sl_stream_peer(const sl_stream_t *s)
{
    return s->peer ? s->peer : "";
}

int sl_stream_client_auth(const sl_stream_t *s)
{
    return s->srv->client_auth;
}

int sl_stream_peer_has_certificate(const sl_stream_t *s)
{
    return s->has_cert;
}

int sl_stream_peer_certificate_matches(const sl_stream_t *s, const char *id)
{
    for (size_t i = 0; i < s->n_names; i++)
        if ((s->name_kind[i] == NAME_DNS && strcasecmp(s->names[i], id) == 0) ||
            (s->name_kind[i] == NAME_EXACT && strcmp(s->names[i], id) == 0))
            return 1;
    return 0;
}

int sl_stream_peer_certificate_allows_fleet(const sl_stream_t *s, const char *fleet)
{
    if (!s->has_fleets)
        return 1;
    size_t plen = strlen(SL_STREAM_FLEET_URI_PREFIX);
    for (size_t i = 0; i < s->n_names; i++)
        if (s->name_kind[i] == NAME_FLEET && strcmp(s->names[i] + plen, fleet) == 0)
            return 1;
    return 0;
}

const char *sl_stream_peer_certificate_text(const sl_stream_t *s)
{
    if (!s->has_cert)
        return "no client certificate";
    if (!s->n_names)
        return "the certificate has no DNS or URI SAN and no CN";
    return s->names_text;
}

int sl_stream_peer_certificate_uses_cn(const sl_stream_t *s)
{
    return s->names_are_cn;
}

void sl_stream_set_user(sl_stream_t *s, void *user)
{
    s->user = user;
}

void *sl_stream_user(const sl_stream_t *s)
{
    return s->user;
}

static void handle(sl_stream_server_t *srv, tag_t *tag, int ok)
{
    sl_stream_t *s = tag->s;
    switch (tag->kind) {
    case TAG_NEW_CALL:
        if (!ok) {
            /* Server shutting down: the accept is cancelled. */
            stream_unref(s);
            return;
        }
        if (!atomic_load(&srv->shutting_down))
            accept_next(srv);
        unsigned max = atomic_load(&srv->max_streams);
        if (max && (unsigned)atomic_load(&srv->live_streams) >= max)
            reject_call(s, max);
        else
            start_call(srv, s);
        return;
    case TAG_RECV:
        if (ok && s->recv_buf) {
            Sluice__V1__DiscoveryRequest *req = (Sluice__V1__DiscoveryRequest *)sl_grpc_unpack(
                &sluice__v1__discovery_request__descriptor, s->recv_buf);
            grpc_byte_buffer_destroy(s->recv_buf);
            s->recv_buf = NULL;
            if (!req) {
                pthread_mutex_lock(&s->lock);
                send_status_locked(s, GRPC_STATUS_INVALID_ARGUMENT,
                                   "DiscoveryRequest could not be decoded");
                pthread_mutex_unlock(&s->lock);
            } else {
                post_event(srv, EV_REQUEST, s, req);
                arm_recv(s);
            }
        } else if (ok) {
            /* The runtime half-closed: finish the call cleanly. */
            pthread_mutex_lock(&s->lock);
            send_status_locked(s, GRPC_STATUS_OK, "stream closed by the runtime");
            pthread_mutex_unlock(&s->lock);
        }
        stream_unref(s);
        return;
    case TAG_SEND: {
        pthread_mutex_lock(&s->lock);
        send_item_t *it = s->send_inflight;
        s->send_inflight = NULL;
        s->send_busy = 0;
        if (ok)
            start_send_locked(s);
        pthread_mutex_unlock(&s->lock);
        if (it) {
            grpc_byte_buffer_destroy(it->bb);
            free(it);
        }
        stream_unref(s);
        return;
    }
    case TAG_CLOSE:
        /* The call is over (runtime went away, or we sent the status). */
        pthread_mutex_lock(&s->lock);
        s->over = 1;
        pthread_mutex_unlock(&s->lock);
        post_event(srv, EV_CLOSE, s, NULL);
        stream_unref(s);
        return;
    case TAG_STATUS:
        stream_unref(s);
        return;
    case TAG_SHUTDOWN:
        srv->shutdown_done = 1;
        return;
    case TAG_START:
        return;
    }
}

static void *cq_thread(void *arg)
{
    sl_stream_server_t *srv = arg;
    int wait_ms = -1; /* until an owed accept is due */
    for (;;) {
        gpr_timespec deadline =
            wait_ms < 0 ? gpr_inf_future(GPR_CLOCK_REALTIME)
                        : gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                       gpr_time_from_millis(wait_ms, GPR_TIMESPAN));
        grpc_event ev = grpc_completion_queue_next(srv->cq, deadline, NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type == GRPC_OP_COMPLETE)
            handle(srv, ev.tag, ev.success);
        wait_ms = pay_deferred(srv);
    }
    return NULL;
}

/* The port's credentials: insecure, or SSL with our certificate and, with a
 * client CA, client certificates asked for and verified (see the top). */
static grpc_server_credentials *server_credentials(const sl_stream_tls_t *tls)
{
    if (!tls || !tls->cert_pem)
        return grpc_insecure_server_credentials_create();
    grpc_ssl_pem_key_cert_pair pair = {.private_key = tls->key_pem, .cert_chain = tls->cert_pem};
    /* gRPC copies the PEM texts. */
    return grpc_ssl_server_credentials_create_ex(
        tls->client_ca_pem, &pair, 1,
        tls->client_ca_pem ? GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY
                           : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
}

sl_stream_server_t *sl_stream_server_start(struct event_base *base, const char *addr,
                                           const sl_stream_tls_t *tls,
                                           const sl_stream_hooks_t *hooks, char *err, size_t errlen)
{
    sl_stream_server_t *srv = calloc(1, sizeof(*srv));
    if (!srv) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    srv->hooks = *hooks;
    srv->tls = tls && tls->cert_pem;
    srv->client_auth = srv->tls && tls->client_ca_pem;
    srv->t_shutdown = (tag_t){TAG_SHUTDOWN, NULL};
    pthread_mutex_init(&srv->ev_lock, NULL);
    srv->ev_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (srv->ev_fd < 0)
        goto fail_msg;
    srv->ev = event_new(base, srv->ev_fd, EV_READ | EV_PERSIST, events_cb, srv);
    if (!srv->ev || event_add(srv->ev, NULL) != 0)
        goto fail_msg;

    /* Keepalive matching the runtimes' (REFERENCE.md): accept their pings
     * without data and never GOAWAY them for "too many pings". */
    grpc_arg args[] = {
        {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIME_MS, {.integer = 10000}},
        {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, {.integer = 5000}},
        {GRPC_ARG_INTEGER, GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, {.integer = 1}},
        {GRPC_ARG_INTEGER,
         GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
         {.integer = 1000}},
        {GRPC_ARG_INTEGER, GRPC_ARG_HTTP2_MAX_PING_STRIKES, {.integer = 0}},
        {GRPC_ARG_INTEGER, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, {.integer = -1}},
        /* Requests are small; a NACK's reason is kept to 4 KiB anyway
         * (core.c), so a peer gets no more than gRPC's default. */
        {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = 4 * 1024 * 1024}},
    };
    grpc_channel_args cargs = {sizeof(args) / sizeof(args[0]), args};
    srv->server = grpc_server_create(&cargs, NULL);
    srv->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(srv->server, srv->cq, NULL);
    srv->method = grpc_server_register_method(srv->server, SL_GRPC_STREAM_METHOD, NULL,
                                              GRPC_SRM_PAYLOAD_NONE, 0);
    grpc_server_credentials *creds = server_credentials(tls);
    srv->port = creds ? grpc_server_add_http2_port(srv->server, addr, creds) : 0;
    if (creds)
        grpc_server_credentials_release(creds);
    if (srv->port <= 0) {
        if (!creds)
            snprintf(err, errlen,
                     "--stream %s: gRPC refused the TLS credentials (check --stream-tls-cert, "
                     "--stream-tls-key and --stream-client-ca)",
                     addr);
        else
            snprintf(err, errlen, "--stream %s: cannot listen (address in use, or not host:port?)",
                     addr);
        grpc_server_destroy(srv->server);
        grpc_completion_queue_shutdown(srv->cq);
        while (grpc_completion_queue_next(srv->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
               GRPC_QUEUE_SHUTDOWN)
            ;
        grpc_completion_queue_destroy(srv->cq);
        goto fail;
    }
    grpc_server_start(srv->server);
    for (int i = 0; i < PENDING_CALLS; i++)
        post_accept(srv);
    if (pthread_create(&srv->thread, NULL, cq_thread, srv) != 0) {
        snprintf(err, errlen, "cannot start the stream thread");
        sl_stream_server_stop(srv);
        return NULL;
    }
    srv->thread_started = 1;
    return srv;
fail_msg:
    snprintf(err, errlen, "stream server: %s", strerror(errno));
fail:
    if (srv->ev)
        event_free(srv->ev);
    if (srv->ev_fd >= 0)
        close(srv->ev_fd);
    pthread_mutex_destroy(&srv->ev_lock);
    free(srv);
    return NULL;
}

int sl_stream_server_port(const sl_stream_server_t *srv)
{
    return srv->port;
}

void sl_stream_server_stop(sl_stream_server_t *srv)
{
    if (!srv)
        return;
    atomic_store(&srv->shutting_down, 1);
    grpc_server_shutdown_and_notify(srv->server, srv->cq, &srv->t_shutdown);
    /* Streams never end by themselves: cancel them so runtimes see
     * UNAVAILABLE and reconnect (to this controller when it restarts). */
    grpc_server_cancel_all_calls(srv->server);
    if (srv->thread_started) {
        /* Let the queue thread finish every completion, including the close
         * events it posts, before shutting the queue down. */
        for (int i = 0; i < 500 && (!srv->shutdown_done || atomic_load(&srv->live_streams) > 0);
             i++) {
            /* Deliver close events so the main-thread references drop. */
            events_cb(srv->ev_fd, EV_READ, srv);
            usleep(2000);
        }
        grpc_completion_queue_shutdown(srv->cq);
        pthread_join(srv->thread, NULL);
        events_cb(srv->ev_fd, EV_READ, srv);
    }
    grpc_server_destroy(srv->server);
    grpc_completion_queue_destroy(srv->cq);
    event_free(srv->ev);
    close(srv->ev_fd);
    pthread_mutex_destroy(&srv->ev_lock);
    free(srv);
}
