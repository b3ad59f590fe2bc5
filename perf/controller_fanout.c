/*
 * Controller fan-out benchmark: N simulated runtimes, each a real gRPC
 * client with its own channel and TCP connection, on one completion queue
 * in one thread. Each subscribes to the four resource types like
 * sluice-runtime does (node on the first request, wildcard, empty versions)
 * and ACKs every response with its version and nonce. Once the fleet is in
 * sync the program makes one config change through the REST API (PUT of an
 * Api) and measures, from the REST answer, when each client received and
 * ACKed the new routes version; "all acked" is the time of the last one.
 *
 * What it shows: how long the controller takes to push one change to a
 * large fleet (issue 3 target: 200 runtimes in under 1 s). What it does
 * not: the runtime's apply cost (the simulated clients decode nothing), nor
 * the propagation to real request routing (perf/propagation.py measures
 * that with real runtimes).
 *
 *   make BUILD=build perf-tools
 *   build/perf/controller_fanout --controller 127.0.0.1:18000 --rest 127.0.0.1:9090 \
 *       [--clients 200] [--rounds 10] [--fleet default]
 *
 * The controller must already run; the program creates Backend and Api
 * "fanout-probe" (in the default namespace) and changes the Api each round.
 * It exits 1 when a stream fails or a round times out (10 s).
 *
 * With --controller-pid PID it also reports the controller's memory (VmRSS
 * before the clients, after they synced: per connected client) and CPU
 * time (utime + stime) of each phase. --storm then drops every stream at
 * once and reconnects all clients together, twice: first as runtimes that
 * kept their config (each reports the versions it runs: the controller
 * should send nothing), then as runtimes that restarted empty (the whole
 * config to every one); each storm reports the time until every client is
 * served again, the responses received and the controller's CPU and peak
 * memory (sampled every 10 ms).
 */
#include "grpc_util.h"
#include "sluice/v1/discovery.pb-c.h"

#include <errno.h>
#include <getopt.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CLIENTS 5000
#define VERSION_LEN 32
#define ROUND_TIMEOUT_MS 10000
#define QUIET_MS 300 /* no push for this long after every client synced: in sync */

enum tag_kind { TAG_START = 1, TAG_RECV, TAG_SEND, TAG_STATUS };

struct client;
typedef struct {
    enum tag_kind kind;
    struct client *c;
} tag_t;

typedef struct send_item {
    grpc_byte_buffer *bb;
    struct send_item *next;
} send_item_t;

typedef struct client {
    int index;
    char node_id[32];
    grpc_channel *channel;
    grpc_call *call;
    tag_t t_start, t_recv, t_send, t_status;
    grpc_metadata_array md_initial, md_trailing;
    grpc_status_code status;
    grpc_slice status_details;
    grpc_byte_buffer *recv_buf;
    send_item_t *send_head, *send_tail;
    int send_busy;
    int over;
    int pending; /* batches started and not completed yet */
    int responses;
    double started_ms; /* when the stream was up (0: not yet) */
    char acked[SL_XDS__COUNT][VERSION_LEN];
    int received[SL_XDS__COUNT];
    double routes_acked_ms; /* monotonic ms of the last routes ACK */
} client_t;

static client_t *clients;
static int nclients = 200;
static grpc_completion_queue *cq;
static const char *fleet = "default";
static double last_push_ms;
static int failed;
static int ctl_pid;
static long ctl_peak_kb;
static double last_sample_ms;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- gRPC client side ----------------------------------------------------- */

static void start_send(client_t *c)
{
    if (c->send_busy || !c->send_head || c->over)
        return;
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = c->send_head->bb;
    if (grpc_call_start_batch(c->call, &op, 1, &c->t_send, NULL) == GRPC_CALL_OK) {
        c->send_busy = 1;
        c->pending++;
    }
}

/* Queues one DiscoveryRequest; gRPC allows one send in flight per call. */
static int queue_request(client_t *c, int type, const char *version, const char *nonce,
                         int with_node)
{
    Sluice__V1__DiscoveryRequest req = SLUICE__V1__DISCOVERY_REQUEST__INIT;
    Sluice__V1__Node node = SLUICE__V1__NODE__INIT;
    if (with_node) {
        node.id = c->node_id;
        node.fleet = (char *)fleet;
        node.build_version = "controller_fanout";
        req.node = &node;
    }
    req.type_url = (char *)sl_xds_type_urls[type];
    req.version_info = (char *)version;
    req.response_nonce = (char *)nonce;
    send_item_t *it = calloc(1, sizeof(*it));
    if (!it)
        return -1;
    it->bb = sl_grpc_pack(&req.base);
    if (!it->bb) {
        free(it);
        return -1;
    }
    if (c->send_tail)
        c->send_tail->next = it;
    else
        c->send_head = it;
    c->send_tail = it;
    start_send(c);
    return 0;
}

static int arm_recv(client_t *c)
{
    grpc_op op;
    memset(&op, 0, sizeof(op));
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv_buf;
    if (grpc_call_start_batch(c->call, &op, 1, &c->t_recv, NULL) != GRPC_CALL_OK)
        return -1;
    c->pending++;
    return 0;
}

/* Opens the client's channel and stream; subscribes to every type with the
 * versions in c->acked (empty: a new runtime). */
static int client_start(client_t *c, const char *target)
{
    /* A local subchannel pool: otherwise channels with equal arguments share
     * one connection, and 200 "runtimes" would be one HTTP/2 connection. */
    grpc_arg args[] = {
        {GRPC_ARG_INTEGER, GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, {.integer = 1}},
        {GRPC_ARG_INTEGER, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, {.integer = 512 * 1024 * 1024}},
    };
    grpc_channel_args cargs = {sizeof(args) / sizeof(args[0]), args};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    c->channel = grpc_channel_create(target, creds, &cargs);
    grpc_channel_credentials_release(creds);
    if (!c->channel)
        return -1;
    grpc_slice method = grpc_slice_from_static_string(SL_GRPC_STREAM_METHOD);
    c->call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method, NULL,
                                       gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (!c->call)
        return -1;
    c->t_start = (tag_t){TAG_START, c};
    c->t_recv = (tag_t){TAG_RECV, c};
    c->t_send = (tag_t){TAG_SEND, c};
    c->t_status = (tag_t){TAG_STATUS, c};
    grpc_metadata_array_init(&c->md_initial);
    grpc_metadata_array_init(&c->md_trailing);

    grpc_op ops[2];
    memset(ops, 0, sizeof(ops));
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].flags = GRPC_INITIAL_METADATA_WAIT_FOR_READY;
    ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[1].data.recv_initial_metadata.recv_initial_metadata = &c->md_initial;
    if (grpc_call_start_batch(c->call, ops, 2, &c->t_start, NULL) != GRPC_CALL_OK)
        return -1;
    c->pending++;
    grpc_op st;
    memset(&st, 0, sizeof(st));
    st.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    st.data.recv_status_on_client.trailing_metadata = &c->md_trailing;
    st.data.recv_status_on_client.status = &c->status;
    st.data.recv_status_on_client.status_details = &c->status_details;
    if (grpc_call_start_batch(c->call, &st, 1, &c->t_status, NULL) != GRPC_CALL_OK)
        return -1;
    c->pending++;
    if (arm_recv(c) != 0)
        return -1;
    for (int t = 0; t < SL_XDS__COUNT; t++)
        if (queue_request(c, t, c->acked[t], "", t == 0) != 0)
            return -1;
    return 0;
}

static void on_response(client_t *c)
{
    Sluice__V1__DiscoveryResponse *resp = (Sluice__V1__DiscoveryResponse *)sl_grpc_unpack(
        &sluice__v1__discovery_response__descriptor, c->recv_buf);
    grpc_byte_buffer_destroy(c->recv_buf);
    c->recv_buf = NULL;
    if (!resp) {
        fprintf(stderr, "%s: a response that does not decode\n", c->node_id);
        failed = 1;
        return;
    }
    int t = sl_xds_type_from_url(resp->type_url ? resp->type_url : "");
    if (t >= 0) {
        snprintf(c->acked[t], sizeof(c->acked[t]), "%s", resp->version_info);
        c->received[t] = 1;
        c->responses++;
        if (queue_request(c, t, resp->version_info, resp->nonce, 0) != 0)
            failed = 1;
        if (t == SL_XDS_ROUTE)
            c->routes_acked_ms = now_ms();
    }
    last_push_ms = now_ms();
    protobuf_c_message_free_unpacked(&resp->base, NULL);
}

/* ---- the controller's memory and CPU (--controller-pid) -------------------- */

static long ctl_rss_kb(void)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", ctl_pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

/* utime + stime of the controller in ms, -1 without --controller-pid. */
static double ctl_cpu_ms(void)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", ctl_pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command may hold spaces */
    unsigned long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

static void sample_peak(void)
{
    if (!ctl_pid || now_ms() - last_sample_ms < 10)
        return;
    last_sample_ms = now_ms();
    long kb = ctl_rss_kb();
    if (kb > ctl_peak_kb)
        ctl_peak_kb = kb;
}

/* Runs the completion queue for up to `ms`, or until done() says so. */
static void pump(double ms, int (*done)(void *), void *arg)
{
    double end = now_ms() + ms;
    while (!failed && now_ms() < end) {
        if (done && done(arg))
            return;
        sample_peak();
        grpc_event ev = grpc_completion_queue_next(
            cq, gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(5, GPR_TIMESPAN)),
            NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT)
            continue;
        if (ev.type != GRPC_OP_COMPLETE)
            break;
        tag_t *tag = ev.tag;
        client_t *c = tag->c;
        c->pending--;
        switch (tag->kind) {
        case TAG_START:
            if (!ev.success) {
                fprintf(stderr, "%s: stream did not start\n", c->node_id);
                failed = 1;
            }
            c->started_ms = now_ms();
            break;
        case TAG_RECV:
            if (ev.success && c->recv_buf) {
                on_response(c);
                if (arm_recv(c) != 0)
                    failed = 1;
            }
            break;
        case TAG_SEND: {
            send_item_t *it = c->send_head;
            c->send_head = it->next;
            if (!c->send_head)
                c->send_tail = NULL;
            grpc_byte_buffer_destroy(it->bb);
            free(it);
            c->send_busy = 0;
            if (ev.success)
                start_send(c);
            break;
        }
        case TAG_STATUS: {
            char *details = grpc_slice_to_c_string(c->status_details);
            fprintf(stderr, "%s: stream ended: status %d %s\n", c->node_id, (int)c->status,
                    details);
            gpr_free(details);
            c->over = 1;
            failed = 1;
            break;
        }
        }
    }
}

static int all_synced(void *arg)
{
    (void)arg;
    for (int i = 0; i < nclients; i++) {
        if (!clients[i].started_ms)
            return 0;
        for (int t = 0; t < SL_XDS__COUNT; t++)
            if (!clients[i].received[t])
                return 0;
    }
    return now_ms() - last_push_ms > QUIET_MS;
}

static int all_changed(void *arg)
{
    char(*before)[VERSION_LEN] = arg;
    for (int i = 0; i < nclients; i++)
        if (strcmp(clients[i].acked[SL_XDS_ROUTE], before[i]) == 0)
            return 0;
    return 1;
}

/* Cancels every stream and waits until each call's batches have all
 * completed (so no tag of an old call arrives after its client is reused),
 * then frees the calls and channels: the clients' TCP connections close. */
static void stop_all(void)
{
    if (!clients)
        return;
    for (int i = 0; i < nclients; i++)
        if (clients[i].call)
            grpc_call_cancel(clients[i].call, NULL);
    for (double end = now_ms() + 10000; now_ms() < end;) {
        int left = 0;
        for (int i = 0; i < nclients; i++)
            left += clients[i].pending;
        if (!left)
            break;
        grpc_event ev = grpc_completion_queue_next(
            cq, gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(100, GPR_TIMESPAN)),
            NULL);
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        tag_t *tag = ev.tag;
        client_t *c = tag->c;
        c->pending--;
        if (tag->kind == TAG_STATUS) {
            c->over = 1;
            grpc_slice_unref(c->status_details);
        } else if (tag->kind == TAG_RECV && c->recv_buf) {
            grpc_byte_buffer_destroy(c->recv_buf);
            c->recv_buf = NULL;
        } else if (tag->kind == TAG_SEND) {
            send_item_t *it = c->send_head;
            c->send_head = it->next;
            if (!c->send_head)
                c->send_tail = NULL;
            grpc_byte_buffer_destroy(it->bb);
            free(it);
            c->send_busy = 0;
        }
    }
    for (int i = 0; i < nclients; i++) {
        client_t *c = &clients[i];
        while (c->send_head) {
            send_item_t *it = c->send_head;
            c->send_head = it->next;
            grpc_byte_buffer_destroy(it->bb);
            free(it);
        }
        c->send_tail = NULL;
        c->send_busy = 0;
        if (c->call) {
            grpc_call_unref(c->call);
            grpc_metadata_array_destroy(&c->md_initial);
            grpc_metadata_array_destroy(&c->md_trailing);
        }
        if (c->channel)
            grpc_channel_destroy(c->channel);
        c->call = NULL;
        c->channel = NULL;
        c->over = 0;
        c->pending = 0;
        c->started_ms = 0;
    }
}

/* A reconnect storm: every stream dropped, then every client reconnects at
 * once, reporting the versions it runs (keep) or none (a restarted, empty
 * runtime). Served again: each client has its stream and, when it came
 * empty, every type; then a quiet period without pushes. */
static int storm(const char *target, int keep)
{
    stop_all();
    for (int i = 0; i < nclients; i++) {
        clients[i].responses = 0;
        for (int t = 0; t < SL_XDS__COUNT; t++) {
            clients[i].received[t] = keep;
            if (!keep)
                clients[i].acked[t][0] = '\0';
        }
    }
    ctl_peak_kb = ctl_pid ? ctl_rss_kb() : 0;
    double cpu0 = ctl_pid ? ctl_cpu_ms() : 0;
    double t0 = now_ms();
    last_push_ms = t0;
    for (int i = 0; i < nclients; i++)
        if (client_start(&clients[i], target) != 0) {
            fprintf(stderr, "controller_fanout: storm: cannot restart client %d\n", i);
            return -1;
        }
    pump(60000, all_synced, NULL);
    if (failed || !all_synced(NULL)) {
        fprintf(stderr, "controller_fanout: storm: the %d clients were not served in 60 s\n",
                nclients);
        return -1;
    }
    double served = last_push_ms - t0, took = 0;
    for (int i = 0; i < nclients; i++)
        if (clients[i].started_ms - t0 > took)
            took = clients[i].started_ms - t0;
    long responses = 0;
    for (int i = 0; i < nclients; i++)
        responses += clients[i].responses;
    printf("storm (%s): %d clients reconnected at once: %s in %.0f ms, %ld responses "
           "(%.2f per client)",
           keep ? "with the versions they run" : "empty", nclients,
           keep ? "all streams up, nothing left to push" : "all served", keep ? took : served,
           responses, (double)responses / nclients);
    if (ctl_pid)
        printf("; controller CPU %.0f ms, peak RSS %.1f MB", ctl_cpu_ms() - cpu0,
               (double)ctl_peak_kb / 1024.0);
    printf("\n");
    fflush(stdout);
    return 0;
}

/* ---- REST ----------------------------------------------------------------- */

/* One request with Connection: close; returns the HTTP status or -1. */
static int rest_put(const char *hostport, const char *path, const char *json)
{
    char host[256], port[16];
    const char *colon = strrchr(hostport, ':');
    if (!colon || (size_t)(colon - hostport) >= sizeof(host))
        return -1;
    snprintf(host, sizeof(host), "%.*s", (int)(colon - hostport), hostport);
    snprintf(port, sizeof(port), "%s", colon + 1);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, port, &hints, &ai) != 0)
        return -1;
    int fd = socket(ai->ai_family, ai->ai_socktype, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return -1;
    }
    freeaddrinfo(ai);
    char head[512];
    int hn = snprintf(head, sizeof(head),
                      "PUT %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                      path, hostport, strlen(json));
    int status = -1;
    if (hn <= 0 || (size_t)hn >= sizeof(head) || write(fd, head, (size_t)hn) != hn ||
        write(fd, json, strlen(json)) != (ssize_t)strlen(json))
        goto out;
    char buf[65536];
    size_t got = 0;
    for (;;) {
        ssize_t n = read(fd, buf + got, sizeof(buf) - 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
        if (got == sizeof(buf) - 1)
            break;
    }
    buf[got] = '\0';
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1)
        status = -1;
    else if (status >= 300)
        fprintf(stderr, "PUT %s: %s\n", path, buf);
out:
    close(fd);
    return status;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *sorted, int n, double p)
{
    int i = (int)(p / 100.0 * (n - 1) + 0.5);
    return sorted[i < 0 ? 0 : i >= n ? n - 1 : i];
}

int main(int argc, char **argv)
{
    const char *target = "127.0.0.1:18000", *rest = "127.0.0.1:9090";
    int rounds = 10, with_storm = 0;
    static const struct option longopts[] = {
        {"controller", required_argument, NULL, 'c'},
        {"rest", required_argument, NULL, 'r'},
        {"clients", required_argument, NULL, 'n'},
        {"rounds", required_argument, NULL, 'k'},
        {"fleet", required_argument, NULL, 'f'},
        {"controller-pid", required_argument, NULL, 'p'},
        {"storm", no_argument, NULL, 's'},
        {NULL, 0, NULL, 0},
    };
    int ch;
    while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (ch) {
        case 'c':
            target = optarg;
            break;
        case 'r':
            rest = optarg;
            break;
        case 'n':
            nclients = atoi(optarg);
            break;
        case 'k':
            rounds = atoi(optarg);
            break;
        case 'f':
            fleet = optarg;
            break;
        case 'p':
            ctl_pid = atoi(optarg);
            break;
        case 's':
            with_storm = 1;
            break;
        default:
            fprintf(stderr, "usage: controller_fanout --controller HOST:PORT --rest HOST:PORT "
                            "[--clients N] [--rounds K] [--fleet NAME] [--controller-pid PID] "
                            "[--storm]\n");
            return 2;
        }
    }
    if (nclients < 1 || nclients > MAX_CLIENTS || rounds < 1 || rounds > 1000) {
        fprintf(stderr, "controller_fanout: --clients 1..%d, --rounds 1..1000\n", MAX_CLIENTS);
        return 2;
    }
    int exit_code = 1;
    char(*before)[VERSION_LEN] = NULL;
    double *lat = NULL, *alls = NULL;
    grpc_init();
    cq = grpc_completion_queue_create_for_next(NULL);
    clients = calloc((size_t)nclients, sizeof(*clients));
    before = calloc((size_t)nclients, sizeof(*before));
    lat = calloc((size_t)nclients, sizeof(*lat));
    alls = calloc((size_t)rounds, sizeof(*alls));
    if (!clients || !before || !lat || !alls)
        goto fail;

    if (rest_put(rest, "/api/v1/backends/fanout-probe",
                 "{\"apiVersion\":\"gateway.sluice.dev/v1alpha1\",\"kind\":\"Backend\","
                 "\"metadata\":{\"name\":\"fanout-probe\"},\"spec\":{\"endpoints\":"
                 "[{\"address\":\"127.0.0.1\",\"port\":9}]}}") >= 300) {
        fprintf(stderr, "controller_fanout: cannot create Backend fanout-probe via %s\n", rest);
        goto fail;
    }

    if (ctl_pid && ctl_rss_kb() < 0) {
        fprintf(stderr, "controller_fanout: --controller-pid %d: no such process\n", ctl_pid);
        goto fail;
    }
    long rss0 = ctl_pid ? ctl_rss_kb() : 0;
    double cpu0 = ctl_pid ? ctl_cpu_ms() : 0;
    double t0 = now_ms();
    for (int i = 0; i < nclients; i++) {
        clients[i].index = i;
        snprintf(clients[i].node_id, sizeof(clients[i].node_id), "sim-%d", i);
        if (client_start(&clients[i], target) != 0) {
            fprintf(stderr, "controller_fanout: cannot start client %d\n", i);
            goto fail;
        }
    }
    pump(30000, all_synced, NULL);
    if (failed || !all_synced(NULL)) {
        fprintf(stderr, "controller_fanout: the %d clients did not sync in 30 s\n", nclients);
        goto fail;
    }
    printf("clients %d synced in %.0f ms (incl. %d ms quiet period)\n", nclients, now_ms() - t0,
           QUIET_MS);
    if (ctl_pid) {
        long rss1 = ctl_rss_kb();
        printf("controller: RSS %.1f MB before the clients, %.1f MB with them: %.1f KB per "
               "connected client; CPU to connect and sync them %.0f ms\n",
               rss0 / 1024.0, rss1 / 1024.0, (double)(rss1 - rss0) / nclients, ctl_cpu_ms() - cpu0);
    }
    fflush(stdout);
    double cpu_rounds = ctl_pid ? ctl_cpu_ms() : 0;

    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < nclients; i++)
            memcpy(before[i], clients[i].acked[SL_XDS_ROUTE], VERSION_LEN);
        char body[512];
        snprintf(body, sizeof(body),
                 "{\"apiVersion\":\"gateway.sluice.dev/v1alpha1\",\"kind\":\"Api\","
                 "\"metadata\":{\"name\":\"fanout-probe\"},\"spec\":{\"basePath\":"
                 "\"/fanout-probe\",\"backendRefs\":[{\"name\":\"fanout-probe\"}],"
                 "\"operations\":[{\"method\":\"GET\",\"path\":\"/r%d-%ld\"}]}}",
                 r, (long)time(NULL));
        double put_start = now_ms();
        int st = rest_put(rest, "/api/v1/apis/fanout-probe", body);
        double answered = now_ms();
        if (st < 200 || st >= 300) {
            fprintf(stderr, "controller_fanout: PUT of the Api answered %d\n", st);
            goto fail;
        }
        pump(ROUND_TIMEOUT_MS, all_changed, before);
        if (failed || !all_changed(before)) {
            fprintf(stderr,
                    "controller_fanout: round %d: not every client got the change in "
                    "%d ms\n",
                    r, ROUND_TIMEOUT_MS);
            goto fail;
        }
        for (int i = 0; i < nclients; i++)
            lat[i] = clients[i].routes_acked_ms - answered;
        qsort(lat, (size_t)nclients, sizeof(*lat), cmp_double);
        alls[r] = lat[nclients - 1];
        printf("round %d: version %s, REST answer %.1f ms; ACKed from the answer: first %.1f "
               "ms, p50 %.1f ms, p99 %.1f ms, all %d in %.1f ms\n",
               r, clients[0].acked[SL_XDS_ROUTE], answered - put_start, lat[0],
               pct(lat, nclients, 50), pct(lat, nclients, 99), nclients, lat[nclients - 1]);
        fflush(stdout);
        pump(QUIET_MS, NULL, NULL);
    }
    qsort(alls, (size_t)rounds, sizeof(*alls), cmp_double);
    printf("summary: %d clients, %d rounds: all ACKed in p50 %.1f ms, max %.1f ms", nclients,
           rounds, pct(alls, rounds, 50), alls[rounds - 1]);
    if (ctl_pid)
        printf("; controller CPU %.1f ms per round", (ctl_cpu_ms() - cpu_rounds) / rounds);
    printf("\n");
    fflush(stdout);
    if (with_storm && (storm(target, 1) != 0 || storm(target, 0) != 0))
        goto fail;
    exit_code = 0;
fail:
    stop_all();
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    grpc_shutdown();
    free(clients);
    free(before);
    free(lat);
    free(alls);
    return exit_code;
}
