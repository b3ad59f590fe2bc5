/*
 * Config application (config.h). Listener sockets are created here, one per
 * worker per address with SO_REUSEPORT, and handed to the workers; the main
 * thread keeps no copy. Unchanged listeners are never touched, new ones are
 * opened before the generation that needs them is published, removed ones
 * are closed after (their established connections carry on).
 */
#include "config.h"
#include "tlog_config.h"

#include "compiler.h"
#include "log.h"
#include "pbshare.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct cfg_listener {
    char *key; /* "address:port" */
    uint32_t max_connections;
    uint8_t h2c;
    uint8_t tls;
    int seen;
    struct cfg_listener *next;
} cfg_listener_t;

struct sl_config {
    sl_worker_t *workers;
    unsigned nworkers;
    cfg_listener_t *listeners;
    uint64_t version;
    int have_generation;
    uint64_t max_routes;
    sl_config_applied_fn on_applied;
    void *on_applied_arg;
};

void sl_config_on_applied(sl_config_t *cfg, sl_config_applied_fn fn, void *arg)
{
    cfg->on_applied = fn;
    cfg->on_applied_arg = arg;
}

void sl_config_set_max_routes(sl_config_t *cfg, uint64_t max_routes)
{
    cfg->max_routes = max_routes;
}

int sl_config_check(const sl_config_t *cfg, const Sluice__V1__Snapshot *snap, char *err,
                    size_t errlen)
{
    uint64_t routes = 0;
    for (size_t i = 0; i < snap->n_route_tables; i++)
        routes += snap->route_tables[i]->n_routes;
    if (cfg->max_routes && routes > cfg->max_routes) {
        snprintf(err, errlen, "config has %llu routes, more than this runtime's --max-routes %llu",
                 (unsigned long long)routes, (unsigned long long)cfg->max_routes);
        return -1;
    }
    return 0;
}

sl_config_t *sl_config_new(sl_worker_t *workers, unsigned nworkers)
{
    sl_config_t *cfg = calloc(1, sizeof(*cfg));
    if (!cfg)
        return NULL;
    cfg->workers = workers;
    cfg->nworkers = nworkers;
    return cfg;
}

static int make_addr(const char *address, uint32_t port, struct sockaddr_storage *ss,
                     socklen_t *len)
{
    memset(ss, 0, sizeof(*ss));
    struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    const char *a = address && *address ? address : "0.0.0.0";
    if (inet_pton(AF_INET, a, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)port);
        *len = sizeof(*in4);
        return 0;
    }
    if (inet_pton(AF_INET6, a, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        *len = sizeof(*in6);
        return 0;
    }
    return -1;
}

static int open_socket(const struct sockaddr_storage *ss, socklen_t len, int reuseport)
{
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (reuseport)
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    if (ss->ss_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (bind(fd, (const struct sockaddr *)ss, len) != 0 || (reuseport && listen(fd, 4096) != 0)) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/*
 * Opens one SO_REUSEPORT socket per worker. A probe bind without
 * SO_REUSEPORT first: otherwise a second runtime of the same user would
 * silently share the port instead of failing with "address in use".
 */
static int open_listener(sl_config_t *cfg, const Sluice__V1__Listener *l, int *fds, char *err,
                         size_t errlen)
{
    struct sockaddr_storage ss;
    socklen_t len;
    if (make_addr(l->address, l->port, &ss, &len) != 0) {
        snprintf(err, errlen, "listener %s: address '%s' is not an IP address", l->name,
                 l->address);
        return -1;
    }
    int probe = open_socket(&ss, len, 0);
    if (probe < 0)
        goto fail;
    close(probe);
    for (unsigned i = 0; i < cfg->nworkers; i++) {
        fds[i] = open_socket(&ss, len, 1);
        if (fds[i] < 0) {
            int e = errno;
            for (unsigned j = 0; j < i; j++)
                close(fds[j]);
            errno = e;
            goto fail;
        }
    }
    return 0;
fail:
    snprintf(err, errlen, "listener %s %s:%u: %s%s", l->name,
             l->address && *l->address ? l->address : "0.0.0.0", l->port, strerror(errno),
             errno == EADDRINUSE ? " (is another runtime or server running on that port?)"
             : errno == EACCES   ? " (ports below 1024 need privileges)"
                                 : "");
    return -1;
}

static void listener_key(const Sluice__V1__Listener *l, char *key, size_t keylen)
{
    snprintf(key, keylen, "%s:%u", l->address && *l->address ? l->address : "0.0.0.0", l->port);
}

static uint32_t per_worker(uint32_t total, unsigned nworkers)
{
    return total ? (total + nworkers - 1) / nworkers : 0;
}

int sl_config_apply(sl_config_t *cfg, Sluice__V1__Snapshot *snap, const char *source, char *err,
                    size_t errlen)
{
    if (sl_config_check(cfg, snap, err, errlen) != 0) {
        sl_pbshare_snapshot_free(snap);
        return -1;
    }
    sl_generation_t *gen = sl_generation_build(snap, source, cfg->nworkers, err, errlen);
    if (!gen)
        return -1;
    snap = gen->snap;

    size_t nl = snap->n_listeners;
    int *fds = calloc(nl ? nl * cfg->nworkers : 1, sizeof(int));
    char(*keys)[80] = calloc(nl ? nl : 1, sizeof(*keys));
    uint8_t *is_new = calloc(nl ? nl : 1, 1);
    if (!fds || !keys || !is_new) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (cfg_listener_t *cl = cfg->listeners; cl; cl = cl->next)
        cl->seen = 0;
    size_t opened = 0;
    for (size_t i = 0; i < nl; i++) {
        listener_key(snap->listeners[i], keys[i], sizeof(keys[i]));
        cfg_listener_t *cl = cfg->listeners;
        while (cl && strcmp(cl->key, keys[i]) != 0)
            cl = cl->next;
        if (cl) {
            cl->seen = 1;
            continue;
        }
        for (size_t j = 0; j < i; j++) {
            if (strcmp(keys[j], keys[i]) == 0) {
                snprintf(err, errlen, "listeners %s and %s both use %s", snap->listeners[j]->name,
                         snap->listeners[i]->name, keys[i]);
                goto fail_close;
            }
        }
        if (open_listener(cfg, snap->listeners[i], fds + i * cfg->nworkers, err, errlen) != 0)
            goto fail_close;
        is_new[i] = 1;
        opened = i + 1;
    }

    rcu_thread_online();
    sl_generation_publish(gen);
    rcu_thread_offline();
    /* The traffic log's sinks follow (kept ones untouched): records of the
     * new generation's requests written before the logger switches go to
     * the previous set, none is lost. */
    if (sl_tlog_apply_snapshot(snap) != 0)
        sl_log_error("traffic log: out of memory applying the sinks of version %llu; the "
                     "previous sinks stay",
                     (unsigned long long)gen->version);
    cfg->version = gen->version;
    cfg->have_generation = 1;

    uint32_t max_conns = per_worker(gen->max_connections, cfg->nworkers);
    for (size_t i = 0; i < nl; i++) {
        uint8_t h2c = snap->listeners[i]->protocol == SLUICE__V1__LISTENER__PROTOCOL__H2C;
        uint8_t tls = snap->listeners[i]->protocol == SLUICE__V1__LISTENER__PROTOCOL__HTTPS;
        if (!is_new[i]) {
            /* Same address: the socket stays; limits and protocol apply to
             * new connections at once. */
            for (cfg_listener_t *cl = cfg->listeners; cl; cl = cl->next) {
                if (strcmp(cl->key, keys[i]) == 0 &&
                    (cl->max_connections != max_conns || cl->h2c != h2c || cl->tls != tls)) {
                    cl->max_connections = max_conns;
                    cl->h2c = h2c;
                    cl->tls = tls;
                    for (unsigned w = 0; w < cfg->nworkers; w++) {
                        sl_worker_cmd_t *cmd = calloc(1, sizeof(*cmd));
                        if (!cmd)
                            continue;
                        cmd->kind = SL_WCMD_LIMITS;
                        cmd->key = strdup(keys[i]);
                        cmd->max_connections = max_conns;
                        cmd->h2c = h2c;
                        cmd->tls = tls;
                        sl_worker_send(&cfg->workers[w], cmd);
                    }
                }
            }
            continue;
        }
        cfg_listener_t *cl = calloc(1, sizeof(*cl));
        if (cl) {
            cl->key = strdup(keys[i]);
            cl->max_connections = max_conns;
            cl->h2c = h2c;
            cl->tls = tls;
            cl->seen = 1;
            cl->next = cfg->listeners;
            cfg->listeners = cl;
        }
        sl_log_notice("listener %s on %s: open (%u workers)", snap->listeners[i]->name, keys[i],
                      cfg->nworkers);
        for (unsigned w = 0; w < cfg->nworkers; w++) {
            sl_worker_cmd_t *cmd = calloc(1, sizeof(*cmd));
            if (!cmd) {
                close(fds[i * cfg->nworkers + w]);
                continue;
            }
            cmd->kind = SL_WCMD_LISTEN;
            cmd->fd = fds[i * cfg->nworkers + w];
            cmd->key = strdup(keys[i]);
            cmd->name = strdup(snap->listeners[i]->name);
            cmd->max_connections = max_conns;
            cmd->h2c = h2c;
            cmd->tls = tls;
            sl_worker_send(&cfg->workers[w], cmd);
        }
    }
    /* Listeners gone from the config: stop accepting; connections go on. */
    cfg_listener_t **pp = &cfg->listeners;
    while (*pp) {
        cfg_listener_t *cl = *pp;
        if (cl->seen) {
            pp = &cl->next;
            continue;
        }
        sl_log_notice("listener on %s: closed (removed from the config)", cl->key);
        for (unsigned w = 0; w < cfg->nworkers; w++) {
            sl_worker_cmd_t *cmd = calloc(1, sizeof(*cmd));
            if (!cmd)
                continue;
            cmd->kind = SL_WCMD_UNLISTEN;
            cmd->key = strdup(cl->key);
            sl_worker_send(&cfg->workers[w], cmd);
        }
        *pp = cl->next;
        free(cl->key);
        free(cl);
    }
    free(fds);
    free(keys);
    free(is_new);
    if (cfg->on_applied)
        cfg->on_applied(cfg->on_applied_arg);
    return 0;

fail_close:
    for (size_t i = 0; i < opened; i++)
        if (is_new[i])
            for (unsigned w = 0; w < cfg->nworkers; w++)
                close(fds[i * cfg->nworkers + w]);
fail:
    free(fds);
    free(keys);
    free(is_new);
    sl_generation_discard(gen);
    return -1;
}

int sl_config_ready(const sl_config_t *cfg)
{
    /* Ready = a generation serves and at least one listener is open: a
     * runtime without listeners cannot take traffic from a load balancer. */
    return cfg->have_generation && cfg->listeners != NULL;
}

uint64_t sl_config_version(const sl_config_t *cfg)
{
    return cfg->version;
}

void sl_config_free(sl_config_t *cfg)
{
    if (!cfg)
        return;
    cfg_listener_t *cl = cfg->listeners;
    while (cl) {
        cfg_listener_t *next = cl->next;
        free(cl->key);
        free(cl);
        cl = next;
    }
    rcu_thread_online();
    sl_generation_t *old = rcu_xchg_pointer(&sl_generation_published, NULL);
    if (old)
        sl_generation_retire(old);
    rcu_thread_offline();
    free(cfg);
}
