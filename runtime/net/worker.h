/*
 * Worker threads: each owns one libevent event_base, its SO_REUSEPORT
 * listener sockets, its downstream connections and its upstream connection
 * pools. Nothing on the request path is shared between workers except the
 * RCU-published generation and atomics (endpoint health, counters).
 *
 * The main thread talks to a worker only through its command queue (a
 * mutex-protected list plus an eventfd that wakes the worker's loop): add or
 * remove a listener socket, drain and stop. The mutex is taken once per
 * command, never per request.
 *
 * RCU: workers are registered QSBR readers that stay offline except around
 * the few places that dereference the published generation (proxy.c), so an
 * idle worker never delays a grace period.
 *
 * Generations: a worker holds ONE reference on each generation its requests
 * use, and its requests borrow it (generation.h, "Worker holds"), so a
 * request's hold writes only this worker's memory. gens_held lists them for
 * the once-a-second sweep, which drops the retired ones an idle worker no
 * longer uses, and for the worker's exit.
 */
#ifndef SL_WORKER_H
#define SL_WORKER_H

#include "buf.h"
#include "lb.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

struct event_base;
struct event;
struct sl_conn;
struct sl_pool;
struct sl_generation;

/* Generations one worker holds a reference on: the current one, plus old
 * ones while requests from before a reload run (usually 1-2 in all). Past
 * this bound a request takes its own shared reference (generation.c). */
#define SL_WORKER_GENS_HELD 8

typedef struct sl_listener_sock {
    struct sl_worker *worker;
    char *key; /* "0.0.0.0:8080", the listener's identity */
    char *name;
    int fd;
    struct event *ev;
    uint32_t max_connections; /* this worker's share, 0 = unlimited */
    uint32_t active;
    uint8_t h2c; /* HTTP/2 with prior knowledge (HTTP/1.1 accepted too) */
    uint8_t tls; /* https: TLS with the generation's certificates */
    struct sl_listener_sock *next;
} sl_listener_sock_t;

enum sl_worker_cmd_kind {
    SL_WCMD_LISTEN = 0, /* fd, key, name, max_connections */
    SL_WCMD_UNLISTEN,   /* key: stop accepting, existing connections go on */
    SL_WCMD_LIMITS,     /* key, max_connections, h2c, tls */
    SL_WCMD_DRAIN,      /* drain_ms: close listeners and idle conns, exit when empty */
    SL_WCMD_RUN,        /* run(w, arg) on the worker's thread (response cache wake-ups) */
};

typedef struct sl_worker_cmd {
    enum sl_worker_cmd_kind kind;
    int fd;
    char *key;
    char *name;
    uint32_t max_connections;
    uint32_t drain_ms;
    uint8_t h2c; /* LISTEN, LIMITS: the listener speaks h2c */
    uint8_t tls; /* LISTEN, LIMITS: the listener is https */
    /* RUN: run owns arg (frees it); a worker that exits first frees it. */
    void (*run)(struct sl_worker *w, void *arg);
    void *arg;
    struct sl_worker_cmd *next;
} sl_worker_cmd_t;

/* A connection's socket writes put off to the end of the worker's current
 * batch of events (sl_worker_defer). */
typedef struct sl_deferred {
    struct sl_deferred *next;
    void (*run)(struct sl_deferred *d);
    uint8_t queued;
} sl_deferred_t;

/* Cached 32 KiB blocks for connection buffers, so keep-alive connections do
 * not hold buffers while idle and busy ones do not call malloc per request. */
#define SL_WORKER_BLOCK_SIZE (32 * 1024)
#define SL_WORKER_BLOCK_CACHE 256
#define SL_WORKER_SMALL_BLOCK_SIZE 4096
#define SL_WORKER_SMALL_BLOCK_CACHE 1024
#define SL_WORKER_POLICY_CACHE 64

typedef struct sl_worker {
    unsigned id;
    pthread_t thread;
    struct event_base *base;
    sl_lb_rng_t rng;

    pthread_mutex_t cmd_lock;
    sl_worker_cmd_t *cmd_head, *cmd_tail;
    int cmd_fd; /* eventfd */
    struct event *cmd_ev;

    sl_listener_sock_t *listeners;
    struct sl_conn *conns;  /* HTTP/1.1 client connections (doubly linked) */
    struct sl_h2c *h2conns; /* HTTP/2 client connections (doubly linked) */
    size_t num_conns;
    uint32_t max_connections; /* this worker's share of --max-connections, 0 = none */

    /* upstream pools keyed by endpoint state pointer (open addressing) */
    struct sl_pool **pools;
    size_t pools_cap, pools_used;
    struct event *sweep_ev; /* closes idle upstream connections past their timeout */

    char *blocks[SL_WORKER_BLOCK_CACHE];
    unsigned num_blocks;
    char *small_blocks[SL_WORKER_SMALL_BLOCK_CACHE];
    unsigned num_small_blocks;
    /* Spare per-request policy states (request.h sl_req_policy_t, about
     * 16 KiB): a request through a policy chain takes one and gives it
     * back, so the chain costs no malloc and free per request. */
    void *policy_states[SL_WORKER_POLICY_CACHE];
    unsigned num_policy_states;

    int draining;
    struct event *drain_ev;
    uint64_t request_counter;

    /* sl_worker_defer's queue, run by flush_ev: FIFO. */
    sl_deferred_t *deferred, **deferred_tail;
    struct event *flush_ev;
    uint8_t flush_active;
    /* Worker thread only; see generation.h "Worker holds". */
    struct sl_generation *gens_held[SL_WORKER_GENS_HELD];
    unsigned num_gens_held;
} sl_worker_t;

/* Creates nworkers workers (not started). */
sl_worker_t *sl_workers_create(unsigned nworkers);
int sl_workers_start(sl_worker_t *workers, unsigned nworkers);
/* Queues a command; takes ownership of cmd. Any thread. */
void sl_worker_send(sl_worker_t *w, sl_worker_cmd_t *cmd);
void sl_workers_join(sl_worker_t *workers, unsigned nworkers);
void sl_workers_destroy(sl_worker_t *workers, unsigned nworkers);

/* Buffer blocks (worker thread only): 32 KiB ones for bodies and
 * responses, 4 KiB ones for request heads. put() recognises either (and
 * frees anything else, e.g. a head buffer grown past 4 KiB). */
int sl_worker_buf_get(sl_worker_t *w, sl_buf_t *b);
int sl_worker_small_buf_get(sl_worker_t *w, sl_buf_t *b);
void sl_worker_buf_put(sl_worker_t *w, sl_buf_t *b);

/*
 * Write batching (worker thread only). An HTTP/2 connection that has frames
 * to send because of some other connection's event (an upstream's response
 * for a client stream, a client's request for an upstream stream) queues
 * its flush here instead of writing at once. The queue runs from an event
 * activated at the default priority, which libevent appends behind the
 * events of the batch it is running: what one epoll batch produces for a
 * connection (a response's HEADERS, DATA and trailers, the responses of
 * ten streams, a request's HEADERS, DATA and END_STREAM) leaves in one
 * write(2), as h2o and HAProxy do, instead of one per frame. Returns 1 if d
 * is queued now (the caller holds its object until d->run), 0 if it already
 * was, -1 if this worker does not batch (write now). d->run runs in FIFO
 * order; what it queues runs in the same pass.
 */
int sl_worker_defer(sl_worker_t *w, sl_deferred_t *d);
/* Runs the queue now (the loop has ended: nothing may stay queued). */
void sl_worker_run_deferred(sl_worker_t *w);

/* Called by proxy.c when a connection closes; stops the loop when draining
 * and nothing is left. */
void sl_worker_conn_closed(sl_worker_t *w);

/* The runtime's workers (sl_workers_create), for work one worker hands to
 * another (sl_worker_post); NULL/0 before and after. */
extern sl_worker_t *sl_workers_all;
extern unsigned sl_workers_count;

/* Runs run(w, arg) on worker `index`'s thread, from its event loop (never
 * inline, even from that worker): any thread. arg is run's to free; 0, or
 * -1 (out of memory, or no such worker: arg is freed). */
int sl_worker_post(unsigned index, void (*run)(sl_worker_t *w, void *arg), void *arg);

/* Number of worker threads whose loop has ended (drain finished). */
extern atomic_uint sl_workers_exited;

/* Worker thread only: the id of the worker running on this thread. */
extern __thread sl_worker_t *sl_worker_self;

#endif
