/*
 * sluice-runtime: command line, start-up, signals and the main thread's loop
 * (admin listener, health checks, config reloads). The request path lives in
 * the workers (worker.c, proxy.c).
 */
#include "admin.h"
#include "bearer.h"
#include "compiler.h"
#include "config.h"
#include "tlog.h"
#include "tlog_config.h"
#include "generation.h"
#include "health.h"
#include "log.h"
#include "metrics.h"
#include "model.h"
#include "pbjson.h"
#include "srate.h"
#include "tls_files.h"
#include "worker.h"
#include "snapcache.h"
#include "xds.h"

#include <grpc/grpc.h>

#include <errno.h>
#include <event2/event.h>
#include <getopt.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SL_VERSION "0.1.0"

typedef struct {
    const char **config_paths;
    size_t num_config_paths;
    unsigned workers;
    const char *admin;
    const char *access_log;
    int access_log_combined; /* --access-log-format combined */
    const char *fleet;
    const char *controller;
    const char *controller_ca, *cert, *key; /* TLS on the config stream */
    const char *node_id;
    char node_id_buf[256];
    uint64_t drain_ms;
    uint64_t drain_delay_ms; /* --drain-delay: /ready 503 but still serving */
    uint64_t max_routes;
    uint32_t max_connections;
    int check_only;
    const char *admin_token_file; /* --admin-token-file */
    const char *cache_dir;        /* --cache-dir */
    int xds_sotw;                 /* --xds-mode sotw (default delta) */
    uint64_t cache_timeout_ms;    /* --cache-timeout */
} options_t;

typedef struct {
    options_t opt;
    struct event_base *base;
    sl_worker_t *workers;
    sl_config_t *config;
    sl_health_t *health;
    sl_admin_t *admin;
    sl_xds_t *xds;
    sl_snapcache_t *cache;
    struct event *cache_timer;
    /* Serving the --cache-dir snapshot of this version, until the
     * controller's config replaces it (0 = not from the cache). */
    uint64_t cache_version;
    uint64_t cache_written_ms;
    uint64_t next_version;
    int draining;      /* SIGTERM/SIGINT seen: /ready is 503 */
    int drain_started; /* the workers were told to drain */
    struct event *drain_poll;
    struct event *drain_delay_ev;
    unsigned workers_done;
} runtime_t;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sluice-runtime --config FILE_OR_DIR [--config ...] [options]\n"
            "  --config PATH          resource file or directory (*.yaml, *.yml, *.json)\n"
            "  --controller HOST:PORT take the config from a sluice-controller instead\n"
            "  --node-id ID           this runtime's id on the controller (default: host name)\n"
            "  --controller-ca FILE   reach the controller over TLS, trusting this CA (PEM)\n"
            "  --cert FILE            client certificate (PEM chain) for a controller that\n"
            "                         requires one; its SAN must be the --node-id\n"
            "  --key FILE             the client certificate's private key (PEM)\n"
            "  --xds-mode MODE        config stream mode: delta (default: only what changed\n"
            "                         is sent) or sotw (every type's whole set)\n"
            "  --cache-dir DIR        keep the last config from the controller in DIR and\n"
            "                         serve it when no controller answers at start-up\n"
            "  --cache-timeout DUR    how long to wait for the controller before serving\n"
            "                         the cache (default 3s)\n"
            "  --workers N            worker threads (default: number of CPUs)\n"
            "  --admin ADDR           admin listener, default 127.0.0.1:9901, or 'off'\n"
            "  --admin-token-file F   the admin listener wants this bearer token on every\n"
            "                         path but /live, /ready and /metrics\n"
            "  --access-log TARGET    file path, 'stdout' or 'off' (default off)\n"
            "  --access-log-format F  json (default) or combined\n"
            "  --fleet NAME           fleet whose Gateway to serve (default 'default')\n"
            "  --drain-timeout DUR    graceful shutdown limit, e.g. 10s (default 10s)\n"
            "  --drain-delay DUR      after SIGTERM, keep serving this long with /ready 503\n"
            "                         so load balancers stop sending, then drain (default 0)\n"
            "  --max-connections N    client connections of the whole process, split over\n"
            "                         workers (default 0 = only the open files limit)\n"
            "  --max-routes N         refuse configs with more routes (default 200000)\n"
            "  --log-level LEVEL      debug, info, notice, warn, error (default info)\n"
            "  --check                validate and compile the config, then exit\n"
            "  --version              print the version\n"
            "signals: HUP reloads the config files, TERM/INT drain and exit, USR1 reopens the "
            "access log\n");
}

static int parse_duration_arg(const char *s, uint64_t *ms)
{
    json_t *v = json_string(s);
    int rc = v ? sl_parse_duration_ms(v, ms) : -1;
    json_decref(v);
    return rc;
}

static int parse_options(int argc, char **argv, options_t *o)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"workers", required_argument, NULL, 'w'},
        {"admin", required_argument, NULL, 'a'},
        {"access-log", required_argument, NULL, 'l'},
        {"access-log-format", required_argument, NULL, 'F'},
        {"fleet", required_argument, NULL, 'f'},
        {"controller", required_argument, NULL, 'C'},
        {"node-id", required_argument, NULL, 'N'},
        {"controller-ca", required_argument, NULL, 1001},
        {"cert", required_argument, NULL, 1002},
        {"key", required_argument, NULL, 1003},
        {"drain-timeout", required_argument, NULL, 'd'},
        {"drain-delay", required_argument, NULL, 1004},
        {"cache-dir", required_argument, NULL, 1005},
        {"xds-mode", required_argument, NULL, 1008},
        {"admin-token-file", required_argument, NULL, 1007},
        {"cache-timeout", required_argument, NULL, 1006},
        {"log-level", required_argument, NULL, 'L'},
        {"check", no_argument, NULL, 't'},
        {"max-routes", required_argument, NULL, 'M'},
        {"max-connections", required_argument, NULL, 'X'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    o->config_paths = calloc((size_t)argc, sizeof(char *));
    if (!o->config_paths)
        return -1;
    o->admin = "127.0.0.1:9901";
    o->access_log = "off";
    o->fleet = "default";
    o->drain_ms = 10000;
    o->cache_timeout_ms = 3000;
    o->max_routes = 200000;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o->workers = ncpu > 0 ? (unsigned)ncpu : 1;
    int ch;
    while ((ch = getopt_long(argc, argv, "c:w:th", longopts, NULL)) != -1) {
        switch (ch) {
        case 'c':
            o->config_paths[o->num_config_paths++] = optarg;
            break;
        case 'w': {
            char *end;
            long n = strtol(optarg, &end, 10);
            if (*end || n < 1 || n > SL_MAX_WORKERS) {
                fprintf(stderr, "sluice-runtime: --workers %s: must be 1..%d\n", optarg,
                        SL_MAX_WORKERS);
                return -1;
            }
            o->workers = (unsigned)n;
            break;
        }
        case 'a':
            o->admin = optarg;
            break;
        case 'l':
            o->access_log = optarg;
            break;
        case 'F':
            if (strcmp(optarg, "json") == 0)
                o->access_log_combined = 0;
            else if (strcmp(optarg, "combined") == 0)
                o->access_log_combined = 1;
            else {
                fprintf(stderr, "sluice-runtime: --access-log-format %s: use json or combined\n",
                        optarg);
                return -1;
            }
            break;
        case 'f':
            o->fleet = optarg;
            break;
        case 'C':
            o->controller = optarg;
            break;
        case 'N':
            o->node_id = optarg;
            break;
        case 1001:
            o->controller_ca = optarg;
            break;
        case 1002:
            o->cert = optarg;
            break;
        case 1003:
            o->key = optarg;
            break;
        case 'd':
            if (parse_duration_arg(optarg, &o->drain_ms) != 0) {
                fprintf(stderr, "sluice-runtime: --drain-timeout %s: use a duration like 10s\n",
                        optarg);
                return -1;
            }
            break;
        case 1004:
            if (strcmp(optarg, "0") == 0) {
                o->drain_delay_ms = 0;
            } else if (parse_duration_arg(optarg, &o->drain_delay_ms) != 0 ||
                       o->drain_delay_ms > 3600000) {
                fprintf(stderr,
                        "sluice-runtime: --drain-delay %s: use a duration like 2s "
                        "(0 to drain at once, at most 1h)\n",
                        optarg);
                return -1;
            }
            break;
        case 1005:
            o->cache_dir = optarg;
            break;
        case 1008:
            if (strcmp(optarg, "delta") != 0 && strcmp(optarg, "sotw") != 0) {
                fprintf(stderr, "sluice-runtime: --xds-mode %s: use delta (the default) or sotw\n",
                        optarg);
                return -1;
            }
            o->xds_sotw = strcmp(optarg, "sotw") == 0;
            break;
        case 1007:
            o->admin_token_file = optarg;
            break;
        case 1006:
            if (parse_duration_arg(optarg, &o->cache_timeout_ms) != 0 || o->cache_timeout_ms == 0 ||
                o->cache_timeout_ms > 600000) {
                fprintf(stderr,
                        "sluice-runtime: --cache-timeout %s: use a duration like 3s (more than "
                        "0, at most 10m)\n",
                        optarg);
                return -1;
            }
            break;
        case 'L': {
            enum sl_log_level lvl;
            if (sl_log_level_from_string(optarg, &lvl) != 0) {
                fprintf(stderr,
                        "sluice-runtime: --log-level %s: use debug, info, notice, warn "
                        "or error\n",
                        optarg);
                return -1;
            }
            sl_log_set_level(lvl);
            break;
        }
        case 't':
            o->check_only = 1;
            break;
        case 'M':
        case 'X': {
            char *end;
            errno = 0;
            unsigned long long n = strtoull(optarg, &end, 10);
            if (*end || errno || optarg[0] == '-' || (ch == 'X' && n > UINT32_MAX)) {
                fprintf(stderr, "sluice-runtime: --%s %s: must be a number\n",
                        ch == 'M' ? "max-routes" : "max-connections", optarg);
                return -1;
            }
            if (ch == 'M')
                o->max_routes = n;
            else
                o->max_connections = (uint32_t)n;
            break;
        }
        case 'V':
            printf("sluice-runtime %s\n", SL_VERSION);
            exit(0);
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "sluice-runtime: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (o->num_config_paths == 0 && !o->controller) {
        fprintf(stderr, "sluice-runtime: give --config FILE_OR_DIR or --controller HOST:PORT\n");
        usage(stderr);
        return -1;
    }
    if (o->num_config_paths && o->controller) {
        fprintf(stderr, "sluice-runtime: --config and --controller exclude each other (files "
                        "for a standalone runtime, the controller for a managed one)\n");
        return -1;
    }
    if (o->admin_token_file && strcmp(o->admin, "off") == 0) {
        fprintf(stderr, "sluice-runtime: --admin-token-file protects the admin listener: it "
                        "needs --admin ADDR, not off\n");
        return -1;
    }
    if (o->cache_dir && !o->controller) {
        fprintf(stderr, "sluice-runtime: --cache-dir keeps the controller's config: it needs "
                        "--controller (a standalone runtime has its --config files)\n");
        return -1;
    }
    if ((o->controller_ca || o->cert || o->key) && !o->controller) {
        fprintf(stderr, "sluice-runtime: --controller-ca, --cert and --key are for the config "
                        "stream: they need --controller\n");
        return -1;
    }
    if (!o->cert != !o->key) {
        fprintf(stderr, "sluice-runtime: --cert and --key go together (the client certificate "
                        "and its private key)\n");
        return -1;
    }
    if (o->cert && !o->controller_ca) {
        fprintf(stderr, "sluice-runtime: --cert and --key need --controller-ca (client "
                        "certificates are sent over TLS; give the CA of the controller's "
                        "certificate)\n");
        return -1;
    }
    if (o->controller && o->check_only) {
        fprintf(stderr, "sluice-runtime: --check validates --config files\n");
        return -1;
    }
    if (!o->node_id) {
        if (gethostname(o->node_id_buf, sizeof(o->node_id_buf) - 1) != 0)
            snprintf(o->node_id_buf, sizeof(o->node_id_buf), "runtime-%d", (int)getpid());
        o->node_id = o->node_id_buf;
    }
    return 0;
}

/* A proxy holds two descriptors per request in flight: take the hard limit
 * (nginx's worker_rlimit_nofile, done for the operator). */
static void raise_nofile_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            sl_log_warn("cannot raise the open files limit: %s", strerror(errno));
    }
}

/* Reads, validates and compiles every --config path. Returns the snapshot,
 * or NULL with every error logged (one line each, naming file, document and
 * field). */
static Sluice__V1__Snapshot *load_snapshot(runtime_t *rt, uint64_t version, char *source,
                                           size_t source_len)
{
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    Sluice__V1__Snapshot *snap = NULL;
    int failed = 0;
    source[0] = '\0';
    for (size_t i = 0; i < rt->opt.num_config_paths; i++) {
        if (sl_model_load_path(&set, rt->opt.config_paths[i], &errs) != 0)
            failed = 1;
        size_t used = strlen(source);
        snprintf(source + used, source_len - used, "%s%s",
                 i ? "," : "file:", rt->opt.config_paths[i]);
    }
    if (!failed)
        snap = sl_compile_snapshot(&set, rt->opt.fleet, version, &errs);
    for (size_t i = 0; i < errs.count; i++) {
        char *line = sl_error_format(&errs.items[i]);
        sl_log_error("config: %s", line ? line : errs.items[i].message);
        free(line);
    }
    sl_errors_free(&errs);
    sl_resource_set_free(&set);
    return snap;
}

/* The generation's client TLS context of a cluster, for the health checks
 * (they probe with the context traffic uses). */
static struct ssl_ctx_st *generation_cluster_tls(void *arg, size_t cluster_index)
{
    const sl_generation_t *gen = arg;
    return cluster_index < gen->num_clusters ? gen->clusters[cluster_index]->tls : NULL;
}

static int reload(runtime_t *rt, const char *why)
{
    char source[1024];
    uint64_t version = rt->next_version;
    Sluice__V1__Snapshot *snap = load_snapshot(rt, version, source, sizeof(source));
    if (!snap) {
        atomic_fetch_add(&sl_metrics_gauges.config_errors, 1);
        sl_log_error("config %s: rejected, the active config (version %llu) keeps serving", why,
                     (unsigned long long)sl_config_version(rt->config));
        return -1;
    }
    char err[1024];
    if (sl_config_apply(rt->config, snap, source, err, sizeof(err)) != 0) {
        atomic_fetch_add(&sl_metrics_gauges.config_errors, 1);
        sl_log_error("config %s: %s; the active config (version %llu) keeps serving", why, err,
                     (unsigned long long)sl_config_version(rt->config));
        return -1;
    }
    rt->next_version++;
    rcu_thread_online();
    sl_generation_t *gen = rcu_dereference(sl_generation_published);
    size_t nroutes = 0;
    for (size_t i = 0; gen && i < gen->snap->n_route_tables; i++)
        nroutes += gen->snap->route_tables[i]->n_routes;
    sl_log_notice("config %s: version %llu active (%zu apis, %zu routes, %zu backends)", why,
                  (unsigned long long)version, gen ? gen->snap->n_route_tables : 0, nroutes,
                  gen ? gen->snap->n_clusters : 0);
    rcu_thread_offline();
    return 0;
}

/* Every applied config, whatever its source: the health checks follow the
 * published generation's clusters. */
static void config_applied(void *arg)
{
    runtime_t *rt = arg;
    rcu_thread_online();
    sl_generation_t *gen = rcu_dereference(sl_generation_published);
    if (rt->health && gen)
        sl_health_update(rt->health, gen->snap, generation_cluster_tls, gen);
    rcu_thread_offline();
}

/* --cache-timeout after start-up: no config from the controller yet, so
 * serve the last one this runtime applied, until the controller's own
 * replaces it (an ordinary swap: no connection is dropped). */
static void cache_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    runtime_t *rt = arg;
    if (sl_config_ready(rt->config) || sl_xds_synced(rt->xds))
        return; /* the controller answered in time */
    char err[4400], source[4600];
    uint64_t version = 0, written = 0;
    int absent = 0;
    Sluice__V1__Snapshot *snap = sl_snapcache_load(rt->opt.cache_dir, rt->opt.fleet, &version,
                                                   &written, &absent, err, sizeof(err));
    if (!snap) {
        if (absent)
            sl_log_warn("no controller config after %llu ms and no cached one (%s): waiting "
                        "for the controller",
                        (unsigned long long)rt->opt.cache_timeout_ms, err);
        else
            sl_log_error("--cache-dir: the cached config is ignored: %s; waiting for the "
                         "controller",
                         err);
        return;
    }
    snprintf(source, sizeof(source), "cache %s/%s (version %llu)", rt->opt.cache_dir,
             SL_SNAPCACHE_FILE, (unsigned long long)version);
    int rc = sl_config_check(rt->config, snap, err, sizeof(err));
    if (rc != 0)
        sl_snapshot_free(snap); /* sl_config_apply takes it, the check does not */
    else if ((rc = sl_config_apply(rt->config, snap, source, err, sizeof(err))) == 0)
        sl_xds_seed(rt->xds, snap); /* owned by the generation now, alive until the next */
    if (rc != 0) {
        sl_log_error("--cache-dir: the cached config (version %llu) cannot be applied: %s; "
                     "waiting for the controller",
                     (unsigned long long)version, err);
        return;
    }
    struct timeval now;
    gettimeofday(&now, NULL);
    uint64_t now_ms = (uint64_t)now.tv_sec * 1000 + (uint64_t)now.tv_usec / 1000;
    rt->cache_version = version;
    rt->cache_written_ms = written;
    atomic_store(&sl_metrics_gauges.config_from_cache, 1);
    sl_log_warn("no controller config after %llu ms: serving the cached config version %llu "
                "(written %llu s ago) until the controller answers",
                (unsigned long long)rt->opt.cache_timeout_ms, (unsigned long long)version,
                (unsigned long long)((now_ms > written ? now_ms - written : 0) / 1000));
}

/* ---- admin hooks ---------------------------------------------------------- */

static int admin_ready(void *ctx)
{
    runtime_t *rt = ctx;
    return !rt->draining && sl_config_ready(rt->config);
}

/* The cached config is served until the controller's replaces it. */
static int serving_cache(const runtime_t *rt)
{
    return rt->cache_version &&
           atomic_load_explicit(&sl_metrics_gauges.config_from_cache, memory_order_relaxed);
}

static json_t *cache_json(runtime_t *rt)
{
    return json_pack("{s:s, s:b, s:I, s:I}", "dir", rt->opt.cache_dir, "serving", serving_cache(rt),
                     "version", (json_int_t)rt->cache_version, "written_unix_ms",
                     (json_int_t)rt->cache_written_ms);
}

/* /ready's body says when the config is the cache's, not the controller's. */
static void admin_ready_note(void *ctx, char *buf, size_t len)
{
    runtime_t *rt = ctx;
    if (serving_cache(rt))
        snprintf(buf, len,
                 "serving the cached config version %llu from %s; the controller has not "
                 "answered yet",
                 (unsigned long long)rt->cache_version, rt->opt.cache_dir);
}

static json_t *admin_config_dump(void *ctx)
{
    /* Main thread: the only writer of the published pointer, so reading it
     * here needs no read-side section beyond being online. */
    rcu_thread_online();
    sl_generation_t *gen = rcu_dereference(sl_generation_published);
    runtime_t *rt = ctx;
    json_t *out = NULL;
    if (gen) {
        out = json_pack("{s:I, s:s, s:I, s:o}", "version", (json_int_t)gen->version, "source",
                        gen->source, "built_unix_ms", (json_int_t)gen->built_unix_ms, "snapshot",
                        sl_pbjson_from_message(&gen->snap->base));
    }
    rcu_thread_offline();
    if (out) {
        /* Success-rate routing: the (key, backend) pairs out of the choice. */
        json_t *elim = sl_srate_scores_json(SIZE_MAX, 1);
        if (elim)
            json_object_set_new(out, "success_rate_eliminations", elim);
    }
    if (rt->xds) {
        /* A managed runtime shows its stream state even before a config. */
        if (!out)
            out = json_object();
        if (out)
            json_object_set_new(out, "controller", sl_xds_status_json(rt->xds));
    }
    if (out && rt->cache)
        json_object_set_new(out, "cache", cache_json(rt));
    return out;
}

/* ---- signals -------------------------------------------------------------- */

static void drain_poll_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    runtime_t *rt = arg;
    if (atomic_load(&sl_workers_exited) == rt->opt.workers)
        event_base_loopbreak(rt->base);
}

/* Tells every worker to drain: close its listeners and idle connections,
 * finish in-flight requests within --drain-timeout, then exit. */
static void start_drain(runtime_t *rt, const char *why)
{
    if (rt->drain_started)
        return;
    rt->drain_started = 1;
    event_del(rt->drain_delay_ev);
    sl_log_notice("%s: draining (up to %llu ms), then exiting", why,
                  (unsigned long long)rt->opt.drain_ms);
    for (unsigned i = 0; i < rt->opt.workers; i++) {
        sl_worker_cmd_t *cmd = calloc(1, sizeof(*cmd));
        if (!cmd)
            continue;
        cmd->kind = SL_WCMD_DRAIN;
        cmd->drain_ms = (uint32_t)rt->opt.drain_ms;
        sl_worker_send(&rt->workers[i], cmd);
    }
    /* The main loop keeps serving the admin listener (/ready is 503) until
     * every worker has exited. */
    struct timeval tv = {0, 20000};
    event_add(rt->drain_poll, &tv);
}

static void drain_delay_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    start_drain(arg, "--drain-delay over");
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    runtime_t *rt = arg;
    switch (sig) {
    case SIGHUP:
        if (rt->xds)
            sl_log_notice("SIGHUP ignored: the config comes from the controller %s",
                          rt->opt.controller);
        else if (!rt->draining)
            reload(rt, "reload (SIGHUP)");
        break;
    case SIGUSR1:
        sl_tlog_reopen(); /* every file sink; each logs its reopen */
        break;
    case SIGTERM:
    case SIGINT:
        if (rt->draining) {
            sl_log_notice("second %s: closing now", sig == SIGTERM ? "SIGTERM" : "SIGINT");
            /* still in --drain-delay: the workers must stop too */
            start_drain(rt, sig == SIGTERM ? "SIGTERM" : "SIGINT");
            event_base_loopbreak(rt->base);
            break;
        }
        rt->draining = 1; /* /ready answers 503 from now on */
        if (rt->opt.drain_delay_ms) {
            /* Keep accepting and serving while load balancers' health checks
             * see the 503 and take this runtime out; closing the listener and
             * the idle keep-alive connections now would race with requests
             * they are still sending here. */
            sl_log_notice("%s: /ready answers 503; serving for %llu ms more (--drain-delay)",
                          sig == SIGTERM ? "SIGTERM" : "SIGINT",
                          (unsigned long long)rt->opt.drain_delay_ms);
            struct timeval tv = {(time_t)(rt->opt.drain_delay_ms / 1000),
                                 (suseconds_t)(rt->opt.drain_delay_ms % 1000) * 1000};
            event_add(rt->drain_delay_ev, &tv);
        } else {
            start_drain(rt, sig == SIGTERM ? "SIGTERM" : "SIGINT");
        }
        break;
    default:
        break;
    }
}

int main(int argc, char **argv)
{
    runtime_t rt;
    memset(&rt, 0, sizeof(rt));
    if (parse_options(argc, argv, &rt.opt) != 0) {
        free(rt.opt.config_paths);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    raise_nofile_limit();
    rcu_register_thread();
    rcu_thread_offline();
    int exit_code = 1;

    if (rt.opt.check_only) {
        char source[1024];
        Sluice__V1__Snapshot *snap = load_snapshot(&rt, 1, source, sizeof(source));
        if (!snap)
            goto out_rcu;
        char err[512];
        uint64_t routes = 0;
        for (size_t i = 0; i < snap->n_route_tables; i++)
            routes += snap->route_tables[i]->n_routes;
        if (rt.opt.max_routes && routes > rt.opt.max_routes) {
            sl_log_error("config: %llu routes, more than --max-routes %llu",
                         (unsigned long long)routes, (unsigned long long)rt.opt.max_routes);
            sl_snapshot_free(snap);
            goto out_rcu;
        }
        sl_generation_t *gen = sl_generation_build(snap, source, 1, err, sizeof(err));
        if (!gen) {
            sl_log_error("config: %s", err);
            goto out_rcu;
        }
        if (sl_tlog_check_snapshot(snap, err, sizeof(err)) != 0) {
            sl_log_error("config: %s", err);
            sl_generation_discard(gen);
            goto out_rcu;
        }
        sl_generation_discard(gen);
        printf("sluice-runtime: configuration %s is valid\n", source);
        exit_code = 0;
        goto out_rcu;
    }

    if (sl_metrics_init(rt.opt.workers) != 0) {
        sl_log_error("cannot initialise metrics");
        goto out_rcu;
    }
    char err[1024];
    /* The traffic log: its rings and logger thread always (a Gateway may
     * configure sinks at any time); --access-log is one file sink of it,
     * checked now so that a bad path fails the start-up. */
    {
        const char *al =
            rt.opt.access_log && strcmp(rt.opt.access_log, "off") != 0 ? rt.opt.access_log : NULL;
        if (al && !al[0]) {
            sl_log_error("--access-log: empty target; use a file path, \"stdout\" or \"off\"");
            goto out_rcu;
        }
        if (sl_tlog_set_base(al, rt.opt.access_log_combined, rt.opt.fleet, rt.opt.node_id) != 0) {
            sl_log_error("out of memory");
            goto out_rcu;
        }
        if (al && sl_tlog_sink_check(sl_tlog_cli_sink(), err, sizeof(err)) != 0) {
            sl_log_error("--access-log %s", err);
            goto out_rcu;
        }
        if (sl_tlog_init(rt.opt.workers, err, sizeof(err)) != 0) {
            sl_log_error("%s", err);
            goto out_rcu;
        }
        if (al)
            sl_tlog_apply_snapshot(NULL);
    }
    rt.base = event_base_new();
    rt.workers = sl_workers_create(rt.opt.workers);
    if (!rt.base || !rt.workers) {
        sl_log_error("cannot create event loops");
        goto out_log;
    }
    for (unsigned i = 0; i < rt.opt.workers; i++)
        rt.workers[i].max_connections =
            rt.opt.max_connections ? (rt.opt.max_connections + rt.opt.workers - 1) / rt.opt.workers
                                   : 0;
    rt.config = sl_config_new(rt.workers, rt.opt.workers);
    if (rt.config)
        sl_config_set_max_routes(rt.config, rt.opt.max_routes);
    rt.health = sl_health_new(rt.base);
    if (!rt.config || !rt.health)
        goto out_log;
    sl_config_on_applied(rt.config, config_applied, &rt);
    rt.next_version = 1;
    if (rt.opt.controller) {
        grpc_init();
        atomic_store(&sl_metrics_gauges.controller_mode, 1);
        char *ca_pem = NULL, *cert_pem = NULL, *key_pem = NULL;
        if ((rt.opt.controller_ca && sl_tls_files_read_ca("--controller-ca", rt.opt.controller_ca,
                                                          &ca_pem, err, sizeof(err)) != 0) ||
            (rt.opt.cert && sl_tls_files_read_pair("--cert", rt.opt.cert, "--key", rt.opt.key,
                                                   &cert_pem, &key_pem, err, sizeof(err)) != 0)) {
            sl_log_error("%s", err);
            sl_tls_files_free(ca_pem);
            goto out_workers;
        }
        if (rt.opt.cache_dir &&
            !(rt.cache = sl_snapcache_open(rt.opt.cache_dir, err, sizeof(err)))) {
            sl_log_error("%s", err);
            sl_tls_files_free(ca_pem);
            sl_tls_files_free(cert_pem);
            sl_tls_files_free(key_pem);
            goto out_workers;
        }
        sl_xds_options_t xo = {.controller = rt.opt.controller,
                               .node_id = rt.opt.node_id,
                               .fleet = rt.opt.fleet,
                               .build_version = SL_VERSION,
                               .ca_pem = ca_pem,
                               .cert_pem = cert_pem,
                               .key_pem = key_pem,
                               .cache = rt.cache,
                               .delta = !rt.opt.xds_sotw};
        rt.xds = sl_xds_start(rt.base, &xo, rt.config, err, sizeof(err));
        /* The stream's credentials hold their own copies. */
        sl_tls_files_free(ca_pem);
        sl_tls_files_free(cert_pem);
        sl_tls_files_free(key_pem);
        if (!rt.xds) {
            sl_log_error("%s", err);
            goto out_workers;
        }
        if (rt.cache) {
            struct timeval tv = {(time_t)(rt.opt.cache_timeout_ms / 1000),
                                 (suseconds_t)(rt.opt.cache_timeout_ms % 1000) * 1000};
            rt.cache_timer = evtimer_new(rt.base, cache_timeout_cb, &rt);
            if (!rt.cache_timer || evtimer_add(rt.cache_timer, &tv) != 0) {
                sl_log_error("--cache-dir: cannot arm the start-up timer");
                goto out_workers;
            }
        }
    } else if (reload(&rt, "start-up") != 0) {
        goto out_workers;
    }

    sl_admin_hooks_t hooks = {.is_ready = admin_ready,
                              .ready_note = admin_ready_note,
                              .config_dump = admin_config_dump,
                              .ctx = &rt};
    if (strcmp(rt.opt.admin, "off") != 0) {
        rt.admin = sl_admin_start(rt.base, rt.opt.admin, &hooks, err, sizeof(err));
        if (!rt.admin) {
            sl_log_error("%s", err);
            goto out_workers;
        }
        if (rt.opt.admin_token_file) {
            char *token =
                sl_bearer_load("--admin-token-file", rt.opt.admin_token_file, err, sizeof(err));
            if (!token) {
                sl_log_error("%s", err);
                goto out_workers;
            }
            sl_admin_set_token(rt.admin, token);
            sl_bearer_free(token); /* the listener keeps a digest only */
        }
    }
    if (sl_workers_start(rt.workers, rt.opt.workers) != 0)
        goto out_workers;

    int sigs[] = {SIGHUP, SIGTERM, SIGINT, SIGUSR1};
    struct event *sev[4];
    for (int i = 0; i < 4; i++) {
        sev[i] = evsignal_new(rt.base, sigs[i], on_signal, &rt);
        event_add(sev[i], NULL);
    }
    rt.drain_poll = event_new(rt.base, -1, EV_PERSIST, drain_poll_cb, &rt);
    rt.drain_delay_ev = evtimer_new(rt.base, drain_delay_cb, &rt);
    if (rt.xds)
        sl_log_notice("sluice-runtime %s started: %u workers, admin %s, config from controller "
                      "%s (node %s, fleet %s)",
                      SL_VERSION, rt.opt.workers, rt.opt.admin, rt.opt.controller, rt.opt.node_id,
                      rt.opt.fleet);
    else
        sl_log_notice("sluice-runtime %s started: %u workers, admin %s, config version %llu",
                      SL_VERSION, rt.opt.workers, rt.opt.admin,
                      (unsigned long long)sl_config_version(rt.config));

    event_base_dispatch(rt.base);

    /* Draining: workers exit when their connections are done. */
    sl_workers_join(rt.workers, rt.opt.workers);
    for (int i = 0; i < 4; i++)
        event_free(sev[i]);
    event_free(rt.drain_poll);
    event_free(rt.drain_delay_ev);
    sl_log_notice("all workers stopped, exiting");
    exit_code = 0;

out_workers:
    if (rt.cache_timer)
        event_free(rt.cache_timer);
    if (rt.xds) {
        sl_xds_stop(rt.xds);
        rt.xds = NULL;
    }
    /* After the stream: nothing queues a snapshot any more; what is
     * queued is written before exit. */
    sl_snapcache_close(rt.cache);
    if (rt.opt.controller)
        grpc_shutdown();
    if (rt.admin)
        sl_admin_free(rt.admin);
    if (rt.health)
        sl_health_free(rt.health);
    sl_config_free(rt.config);
    rcu_thread_online();
    rcu_barrier(); /* every call_rcu callback (generation frees) has run */
    rcu_thread_offline();
    /* After a clean stop every hold is gone (workers drop theirs as they
     * exit): a generation still alive here is a leaked hold, which the
     * leak checkers cannot always see (liburcu's helper thread may keep a
     * stale pointer to it). */
    if (exit_code == 0) {
        int64_t alive = atomic_load(&sl_metrics_gauges.generations_alive);
        if (alive != 0)
            sl_log_alert("%lld config generation(s) still alive at exit: a hold on a "
                         "generation was never released",
                         (long long)alive);
    }
    if (rt.workers)
        sl_workers_destroy(rt.workers, rt.opt.workers);
out_log:
    sl_tlog_shutdown();
    if (rt.base)
        event_base_free(rt.base);
out_rcu:
    free(rt.opt.config_paths);
    rcu_thread_online();
    rcu_unregister_thread();
    return exit_code;
}
