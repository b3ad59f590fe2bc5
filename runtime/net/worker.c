/*
 * Worker threads (worker.h): event loop, command queue, listener sockets,
 * buffer block cache, drain.
 */
#include "worker.h"

#include "generation.h"
#include "log.h"
#include "metrics.h"
#include "proxy.h"
#include "upstream.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <urcu-qsbr.h>

__thread sl_worker_t *sl_worker_self;
atomic_uint sl_workers_exited;
sl_worker_t *sl_workers_all;
unsigned sl_workers_count;

int sl_worker_buf_get(sl_worker_t *w, sl_buf_t *b)
{
    if (b->data)
        return 0;
    char *block = w->num_blocks ? w->blocks[--w->num_blocks] : malloc(SL_WORKER_BLOCK_SIZE);
    if (!block)
        return -1;
    b->data = block;
    b->cap = SL_WORKER_BLOCK_SIZE;
    b->start = b->end = 0;
    return 0;
}

int sl_worker_small_buf_get(sl_worker_t *w, sl_buf_t *b)
{
    if (b->data)
        return 0;
    char *block = w->num_small_blocks ? w->small_blocks[--w->num_small_blocks]
                                      : malloc(SL_WORKER_SMALL_BLOCK_SIZE);
    if (!block)
        return -1;
    b->data = block;
    b->cap = SL_WORKER_SMALL_BLOCK_SIZE;
    b->start = b->end = 0;
    return 0;
}

void sl_worker_buf_put(sl_worker_t *w, sl_buf_t *b)
{
    if (!b->data)
        return;
    if (b->cap == SL_WORKER_BLOCK_SIZE && w->num_blocks < SL_WORKER_BLOCK_CACHE)
        w->blocks[w->num_blocks++] = b->data;
    else if (b->cap == SL_WORKER_SMALL_BLOCK_SIZE &&
             w->num_small_blocks < SL_WORKER_SMALL_BLOCK_CACHE)
        w->small_blocks[w->num_small_blocks++] = b->data;
    else
        free(b->data);
    b->data = NULL;
    b->cap = b->start = b->end = 0;
}

static void accept_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    sl_listener_sock_t *ls = arg;
    /* Bounded batch so one busy listener cannot starve the loop. */
    for (int i = 0; i < 64; i++) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        int cfd = accept4(fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE)
                sl_log_error("listener %s: accept: %s (raise the open files limit, ulimit -n)",
                             ls->key, strerror(errno));
            return;
        }
        if ((ls->max_connections && ls->active >= ls->max_connections) ||
            (ls->worker->max_connections && ls->worker->num_conns >= ls->worker->max_connections)) {
            if (ls->tls)
                close(cfd); /* a plaintext 503 means nothing to a TLS client */
            else
                sl_proxy_refuse(ls->worker, cfd);
            continue;
        }
        sl_proxy_accept(ls, cfd, (struct sockaddr *)&ss);
    }
}

static void listener_free(sl_listener_sock_t *ls)
{
    if (ls->ev)
        event_free(ls->ev);
    if (ls->fd >= 0)
        close(ls->fd);
    free(ls->key);
    free(ls->name);
    free(ls);
}

static void close_listener(sl_listener_sock_t *ls)
{
    if (ls->ev) {
        event_free(ls->ev);
        ls->ev = NULL;
    }
    if (ls->fd >= 0) {
        close(ls->fd);
        ls->fd = -1;
    }
}

/* Listener structs stay allocated while connections point at them; they are
 * freed when the worker exits. Closed ones are unlinked lazily here. */
static void handle_cmd(sl_worker_t *w, sl_worker_cmd_t *cmd)
{
    switch (cmd->kind) {
    case SL_WCMD_LISTEN: {
        sl_listener_sock_t *ls = calloc(1, sizeof(*ls));
        if (!ls) {
            close(cmd->fd);
            break;
        }
        ls->worker = w;
        ls->key = cmd->key;
        ls->name = cmd->name;
        cmd->key = cmd->name = NULL;
        ls->fd = cmd->fd;
        ls->max_connections = cmd->max_connections;
        ls->h2c = cmd->h2c;
        ls->tls = cmd->tls;
        ls->ev = event_new(w->base, ls->fd, EV_READ | EV_PERSIST, accept_cb, ls);
        if (!ls->ev || event_add(ls->ev, NULL) != 0) {
            sl_log_alert("worker %u: cannot watch listener %s", w->id, ls->key);
            listener_free(ls);
            break;
        }
        if (w->draining) {
            close_listener(ls);
        }
        ls->next = w->listeners;
        w->listeners = ls;
        break;
    }
    case SL_WCMD_UNLISTEN:
        for (sl_listener_sock_t *ls = w->listeners; ls; ls = ls->next)
            if (ls->fd >= 0 && strcmp(ls->key, cmd->key) == 0)
                close_listener(ls);
        break;
    case SL_WCMD_LIMITS:
        for (sl_listener_sock_t *ls = w->listeners; ls; ls = ls->next)
            if (ls->fd >= 0 && strcmp(ls->key, cmd->key) == 0) {
                ls->max_connections = cmd->max_connections;
                ls->h2c = cmd->h2c;
                ls->tls = cmd->tls;
            }
        break;
    case SL_WCMD_DRAIN: {
        w->draining = 1;
        for (sl_listener_sock_t *ls = w->listeners; ls; ls = ls->next)
            close_listener(ls);
        sl_proxy_drain(w);
        if (w->num_conns == 0) {
            event_base_loopbreak(w->base);
            break;
        }
        struct timeval tv = {cmd->drain_ms / 1000, (cmd->drain_ms % 1000) * 1000};
        evtimer_add(w->drain_ev, &tv);
        break;
    }
    case SL_WCMD_RUN:
        cmd->run(w, cmd->arg);
        cmd->arg = NULL;
        break;
    }
}

static void cmd_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    sl_worker_t *w = arg;
    uint64_t v;
    ssize_t n = read(fd, &v, sizeof(v));
    (void)n;
    pthread_mutex_lock(&w->cmd_lock);
    sl_worker_cmd_t *cmds = w->cmd_head;
    w->cmd_head = w->cmd_tail = NULL;
    pthread_mutex_unlock(&w->cmd_lock);
    while (cmds) {
        sl_worker_cmd_t *next = cmds->next;
        handle_cmd(w, cmds);
        free(cmds->arg);
        free(cmds->key);
        free(cmds->name);
        free(cmds);
        cmds = next;
    }
}

static void drain_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sl_worker_t *w = arg;
    if (w->num_conns)
        sl_log_warn("worker %u: drain timeout, closing %zu connections", w->id, w->num_conns);
    sl_proxy_close_all(w);
    event_base_loopbreak(w->base);
}

static void sweep_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sl_worker_t *w = arg;
    sl_upstream_sweep(w, sl_endpoint_now_ms());
    /* An idle worker must not keep a replaced generation alive. */
    sl_generation_tick(w);
}

void sl_worker_run_deferred(sl_worker_t *w)
{
    w->flush_active = 1; /* what the runs queue joins this pass */
    while (w->deferred) {
        sl_deferred_t *d = w->deferred;
        w->deferred = d->next;
        if (!w->deferred)
            w->deferred_tail = &w->deferred;
        d->next = NULL;
        d->queued = 0;
        d->run(d);
    }
    w->flush_active = 0;
}

static void flush_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    sl_worker_run_deferred(arg);
}

int sl_worker_defer(sl_worker_t *w, sl_deferred_t *d)
{
    if (d->queued)
        return 0;
    if (!w->flush_ev)
        return -1; /* a worker made by hand (unit tests): write now */
    d->queued = 1;
    d->next = NULL;
    *w->deferred_tail = d;
    w->deferred_tail = &d->next;
    if (!w->flush_active) {
        w->flush_active = 1;
        event_active(w->flush_ev, EV_WRITE, 0);
    }
    return 1;
}

void sl_worker_conn_closed(sl_worker_t *w)
{
    w->num_conns--;
    if (w->draining && w->num_conns == 0)
        event_base_loopbreak(w->base);
}

int sl_worker_post(unsigned index, void (*run)(sl_worker_t *w, void *arg), void *arg)
{
    sl_worker_cmd_t *cmd = index < sl_workers_count ? calloc(1, sizeof(*cmd)) : NULL;
    if (!cmd) {
        free(arg);
        return -1;
    }
    cmd->kind = SL_WCMD_RUN;
    cmd->run = run;
    cmd->arg = arg;
    sl_worker_send(&sl_workers_all[index], cmd);
    return 0;
}

void sl_worker_send(sl_worker_t *w, sl_worker_cmd_t *cmd)
{
    cmd->next = NULL;
    pthread_mutex_lock(&w->cmd_lock);
    if (w->cmd_tail)
        w->cmd_tail->next = cmd;
    else
        w->cmd_head = cmd;
    w->cmd_tail = cmd;
    pthread_mutex_unlock(&w->cmd_lock);
    uint64_t one = 1;
    ssize_t n = write(w->cmd_fd, &one, sizeof(one));
    (void)n;
}

sl_worker_t *sl_workers_create(unsigned nworkers)
{
    sl_worker_t *ws = calloc(nworkers, sizeof(*ws));
    if (!ws)
        return NULL;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    for (unsigned i = 0; i < nworkers; i++) {
        sl_worker_t *w = &ws[i];
        w->id = i;
        sl_lb_rng_seed(&w->rng, (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
                                    ((uint64_t)getpid() << 40) ^ (0x9e3779b97f4a7c15ULL * (i + 1)));
        pthread_mutex_init(&w->cmd_lock, NULL);
        struct event_config *cfg = event_config_new();
        if (!cfg)
            return NULL;
        /* Without PRECISE_TIMER a 1 ms timer fires every ~4 ms (REFERENCE.md). */
        event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER | EVENT_BASE_FLAG_NOLOCK);
        w->base = event_base_new_with_config(cfg);
        event_config_free(cfg);
        w->cmd_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (!w->base || w->cmd_fd < 0)
            return NULL;
        w->cmd_ev = event_new(w->base, w->cmd_fd, EV_READ | EV_PERSIST, cmd_cb, w);
        w->drain_ev = evtimer_new(w->base, drain_timeout_cb, w);
        w->sweep_ev = event_new(w->base, -1, EV_PERSIST, sweep_cb, w);
        w->flush_ev = event_new(w->base, -1, 0, flush_cb, w);
        w->deferred_tail = &w->deferred;
        if (!w->cmd_ev || !w->drain_ev || !w->sweep_ev || !w->flush_ev)
            return NULL;
        event_add(w->cmd_ev, NULL);
        struct timeval one_s = {1, 0};
        event_add(w->sweep_ev, &one_s);
    }
    sl_workers_all = ws;
    sl_workers_count = nworkers;
    return ws;
}

static void *worker_main(void *arg)
{
    sl_worker_t *w = arg;
    sl_worker_self = w;
    char name[16];
    snprintf(name, sizeof(name), "sl-worker-%u", w->id);
    pthread_setname_np(pthread_self(), name);
    rcu_register_thread();
    /* Offline by default: we go online only around generation reads, so an
     * idle worker never holds up a grace period (REFERENCE.md, QSBR). */
    rcu_thread_offline();
    event_base_dispatch(w->base);
    /* Queued flushes hold their connections: run them before closing. */
    sl_worker_run_deferred(w);
    sl_proxy_close_all(w);
    sl_upstream_shutdown(w);
    sl_worker_run_deferred(w);
    /* After the last request: the current generation's reference too, or
     * it would outlive the runtime's final retire. */
    sl_generation_release_all(w);
    rcu_thread_online();
    rcu_unregister_thread();
    atomic_fetch_add(&sl_workers_exited, 1);
    return NULL;
}

int sl_workers_start(sl_worker_t *ws, unsigned nworkers)
{
    for (unsigned i = 0; i < nworkers; i++) {
        int rc = pthread_create(&ws[i].thread, NULL, worker_main, &ws[i]);
        if (rc != 0) {
            sl_log_error("cannot start worker %u: %s", i, strerror(rc));
            return -1;
        }
    }
    return 0;
}

void sl_workers_join(sl_worker_t *ws, unsigned nworkers)
{
    for (unsigned i = 0; i < nworkers; i++)
        pthread_join(ws[i].thread, NULL);
}

void sl_workers_destroy(sl_worker_t *ws, unsigned nworkers)
{
    for (unsigned i = 0; i < nworkers; i++) {
        sl_worker_t *w = &ws[i];
        sl_listener_sock_t *ls = w->listeners;
        while (ls) {
            sl_listener_sock_t *next = ls->next;
            listener_free(ls);
            ls = next;
        }
        sl_worker_cmd_t *cmd = w->cmd_head;
        while (cmd) {
            sl_worker_cmd_t *next = cmd->next;
            if (cmd->kind == SL_WCMD_LISTEN)
                close(cmd->fd);
            free(cmd->arg);
            free(cmd->key);
            free(cmd->name);
            free(cmd);
            cmd = next;
        }
        for (unsigned b = 0; b < w->num_blocks; b++)
            free(w->blocks[b]);
        for (unsigned b = 0; b < w->num_small_blocks; b++)
            free(w->small_blocks[b]);
        for (unsigned b = 0; b < w->num_policy_states; b++)
            free(w->policy_states[b]);
        event_free(w->cmd_ev);
        event_free(w->drain_ev);
        event_free(w->sweep_ev);
        event_free(w->flush_ev);
        close(w->cmd_fd);
        event_base_free(w->base);
        pthread_mutex_destroy(&w->cmd_lock);
    }
    if (sl_workers_all == ws) {
        sl_workers_all = NULL;
        sl_workers_count = 0;
    }
    free(ws);
}
