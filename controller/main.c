/*
 * sluice-controller: command line, start-up and shutdown. The parts: the
 * store (store.c), the REST admin API (rest.c), the core that compiles and
 * pushes (core.c) and the gRPC stream server (stream.c).
 */
#include "controller.h"
#include "core.h"
#include "log.h"
#include "model.h"
#include "rest.h"
#include "store.h"
#include "stream.h"
#include "tls_files.h"

#include <event2/event.h>
#include <getopt.h>
#include <grpc/grpc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SL_VERSION "0.1.0"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: sluice-controller [options]\n"
            "  --rest ADDR              REST admin API, default 127.0.0.1:9090\n"
            "  --stream ADDR            config stream for runtimes, default 127.0.0.1:18000\n"
            "  --stream-tls-cert FILE   serve the config stream over TLS with this PEM chain\n"
            "  --stream-tls-key FILE    ... and this PEM key (both or neither)\n"
            "  --stream-client-ca FILE  require runtimes' client certificates issued by this CA;\n"
            "                           a runtime's --node-id must be a SAN of its certificate\n"
            "                           (its CN when it has no SAN)\n"
            "  --data-dir DIR           durable store, default ./sluice-data\n"
            "  --resources PATH         serve these files (repeatable); the REST API is then\n"
            "                           read-only (GitOps mode)\n"
            "  --admin-token-file FILE  require 'Authorization: Bearer <token>' on /api/\n"
            "  --insecure-admin         allow a non-loopback --rest without a token\n"
            "  --rest-tls-cert FILE     serve the REST admin API over HTTPS with this PEM chain\n"
            "  --rest-tls-key FILE      ... and this PEM key (both or neither)\n"
            "  --log-level LEVEL        debug, info, notice, warn, error (default info)\n"
            "  --max-routes N           refuse writes that make a fleet's config exceed N\n"
            "                           routes (default 200000)\n"
            "  --max-runtimes N         runtime records kept, connected or not; the one\n"
            "                           disconnected longest is forgotten first (default 10000)\n"
            "  --runtime-expiry SECONDS forget a runtime disconnected this long (default 3600)\n"
            "  --version\n");
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    struct event_base *base = arg;
    sl_log_notice("%s: shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    event_base_loopbreak(base);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"rest", required_argument, NULL, 'r'},
        {"stream", required_argument, NULL, 's'},
        {"data-dir", required_argument, NULL, 'd'},
        {"resources", required_argument, NULL, 'R'},
        {"admin-token-file", required_argument, NULL, 't'},
        {"insecure-admin", no_argument, NULL, 'I'},
        {"log-level", required_argument, NULL, 'L'},
        {"max-routes", required_argument, NULL, 'M'},
        {"max-runtimes", required_argument, NULL, 'N'},
        {"runtime-expiry", required_argument, NULL, 'E'},
        {"stream-tls-cert", required_argument, NULL, 'c'},
        {"stream-tls-key", required_argument, NULL, 'k'},
        {"stream-client-ca", required_argument, NULL, 'a'},
        {"rest-tls-cert", required_argument, NULL, 'C'},
        {"rest-tls-key", required_argument, NULL, 'K'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *rest_addr = "127.0.0.1:9090", *stream_addr = "127.0.0.1:18000";
    const char *data_dir = "./sluice-data", *token_file = NULL;
    const char *stream_cert = NULL, *stream_key = NULL, *stream_ca = NULL;
    const char *rest_cert = NULL, *rest_key = NULL;
    const char **resources = calloc((size_t)argc, sizeof(char *));
    size_t nresources = 0;
    int insecure = 0, ch;
    unsigned long long max_routes = 200000, max_runtimes = SL_CONTROLLER_DEFAULT_MAX_RUNTIMES;
    unsigned long long runtime_expiry_s = SL_CONTROLLER_DEFAULT_RUNTIME_EXPIRY_MS / 1000;
    while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (ch) {
        case 'r':
            rest_addr = optarg;
            break;
        case 's':
            stream_addr = optarg;
            break;
        case 'd':
            data_dir = optarg;
            break;
        case 'R':
            resources[nresources++] = optarg;
            break;
        case 't':
            token_file = optarg;
            break;
        case 'I':
            insecure = 1;
            break;
        case 'c':
            stream_cert = optarg;
            break;
        case 'k':
            stream_key = optarg;
            break;
        case 'a':
            stream_ca = optarg;
            break;
        case 'C':
            rest_cert = optarg;
            break;
        case 'K':
            rest_key = optarg;
            break;
        case 'M': {
            char *end;
            max_routes = strtoull(optarg, &end, 10);
            if (*end || optarg[0] == '-' || !optarg[0]) {
                fprintf(stderr, "sluice-controller: --max-routes %s: must be a number\n", optarg);
                return 2;
            }
            break;
        }
        case 'N':
        case 'E': {
            char *end;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (*end || optarg[0] == '-' || !optarg[0] || (ch == 'N' && v == 0) ||
                v > 100000000ULL) {
                fprintf(stderr,
                        "sluice-controller: --%s %s: must be a number from %d to 100000000\n",
                        ch == 'N' ? "max-runtimes" : "runtime-expiry", optarg, ch == 'N');
                return 2;
            }
            if (ch == 'N')
                max_runtimes = v;
            else
                runtime_expiry_s = v;
            break;
        }
        case 'L': {
            enum sl_log_level lvl;
            if (sl_log_level_from_string(optarg, &lvl) != 0) {
                fprintf(stderr,
                        "sluice-controller: --log-level %s: use debug, info, notice, "
                        "warn or error\n",
                        optarg);
                return 2;
            }
            sl_log_set_level(lvl);
            break;
        }
        case 'V':
            printf("sluice-controller %s\n", SL_VERSION);
            return 0;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "sluice-controller: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!stream_cert != !stream_key) {
        fprintf(stderr, "sluice-controller: --stream-tls-cert and --stream-tls-key go together "
                        "(the stream's certificate chain and its private key)\n");
        return 2;
    }
    if (stream_ca && !stream_cert) {
        fprintf(stderr,
                "sluice-controller: --stream-client-ca needs --stream-tls-cert and "
                "--stream-tls-key (client certificates are checked in the TLS handshake)\n");
        return 2;
    }
    if (!rest_cert != !rest_key) {
        fprintf(stderr, "sluice-controller: --rest-tls-cert and --rest-tls-key go together "
                        "(the REST API's certificate chain and its private key)\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);

    int exit_code = 1;
    char err[1024];
    char *token = NULL;
    /* PEM texts, wiped and freed once the servers copied what they need. */
    char *stream_cert_pem = NULL, *stream_key_pem = NULL, *stream_ca_pem = NULL;
    char *rest_cert_pem = NULL, *rest_key_pem = NULL;
    sl_store_t *store = NULL;
    sl_controller_t *ctl = NULL;
    sl_stream_server_t *srv = NULL;
    sl_rest_t *rest = NULL;
    struct event_base *base = NULL;
    sl_resource_set_t files;
    sl_resource_set_init(&files);

    if (token_file && !(token = sl_rest_load_token(token_file, err, sizeof(err)))) {
        sl_log_error("%s", err);
        goto out;
    }
    if ((stream_cert &&
         sl_tls_files_read_pair("--stream-tls-cert", stream_cert, "--stream-tls-key", stream_key,
                                &stream_cert_pem, &stream_key_pem, err, sizeof(err)) != 0) ||
        (stream_ca && sl_tls_files_read_ca("--stream-client-ca", stream_ca, &stream_ca_pem, err,
                                           sizeof(err)) != 0) ||
        (rest_cert &&
         sl_tls_files_read_pair("--rest-tls-cert", rest_cert, "--rest-tls-key", rest_key,
                                &rest_cert_pem, &rest_key_pem, err, sizeof(err)) != 0)) {
        sl_log_error("%s", err);
        goto out;
    }
    if (nresources) {
        sl_errors_t errs;
        sl_errors_init(&errs);
        int bad = 0;
        for (size_t i = 0; i < nresources; i++)
            bad |= sl_model_load_path(&files, resources[i], &errs) != 0;
        for (size_t i = 0; i < errs.count; i++) {
            char *line = sl_error_format(&errs.items[i]);
            sl_log_error("resources: %s", line ? line : errs.items[i].message);
            free(line);
        }
        sl_errors_free(&errs);
        if (bad) {
            exit_code = 2;
            goto out;
        }
    }
    store = sl_store_open(data_dir, err, sizeof(err));
    if (!store) {
        sl_log_error("%s", err);
        goto out;
    }
    base = event_base_new();
    if (!base)
        goto out;
    grpc_init();
    ctl = sl_controller_new(base, store, nresources ? &files : NULL);
    if (!ctl)
        goto out_grpc;
    sl_controller_set_max_routes(ctl, max_routes);
    sl_controller_set_runtime_limits(ctl, (size_t)max_runtimes, runtime_expiry_s * 1000);
    sl_controller_compile_now(ctl);
    sl_stream_hooks_t hooks = sl_controller_stream_hooks(ctl);
    sl_stream_tls_t stream_tls = {
        .cert_pem = stream_cert_pem, .key_pem = stream_key_pem, .client_ca_pem = stream_ca_pem};
    srv = sl_stream_server_start(base, stream_addr, &stream_tls, &hooks, err, sizeof(err));
    if (!srv) {
        sl_log_error("%s", err);
        goto out_grpc;
    }
    sl_rest_options_t ropt = {
        .admin_token = token,
        .insecure = insecure,
        .read_only = nresources > 0,
        .static_set = nresources ? &files : NULL,
        /* Not ready while versions cannot be persisted (the reason is in
         * the 503). */
        .is_ready = sl_controller_ready,
        .ready_ctx = ctl,
        .tls_cert_pem = rest_cert_pem,
        .tls_key_pem = rest_key_pem,
    };
    rest = sl_rest_start(base, rest_addr, store, ctl, &ropt, err, sizeof(err));
    if (!rest) {
        sl_log_error("%s", err);
        goto out_grpc;
    }
    /* Both servers hold their own copies now. */
    sl_tls_files_free(stream_key_pem);
    sl_tls_files_free(rest_key_pem);
    stream_key_pem = rest_key_pem = NULL;
    struct event *sigterm = evsignal_new(base, SIGTERM, on_signal, base);
    struct event *sigint = evsignal_new(base, SIGINT, on_signal, base);
    event_add(sigterm, NULL);
    event_add(sigint, NULL);
    sl_log_notice("sluice-controller %s started: REST %s %s(port %d), stream %s %s(port %d), data "
                  "%s%s",
                  SL_VERSION, rest_addr, rest_cert ? "HTTPS " : "", sl_rest_port(rest), stream_addr,
                  stream_ca     ? "TLS, client certificates required "
                  : stream_cert ? "TLS "
                                : "",
                  sl_stream_server_port(srv), data_dir,
                  nresources ? ", serving --resources files (read-only)" : "");
    event_base_dispatch(base);
    event_free(sigterm);
    event_free(sigint);
    exit_code = 0;

out_grpc:
    if (rest)
        sl_rest_free(rest);
    if (srv)
        sl_stream_server_stop(srv);
    if (ctl)
        sl_controller_free(ctl);
    grpc_shutdown();
out:
    if (store)
        sl_store_close(store);
    if (base)
        event_base_free(base);
    sl_resource_set_free(&files);
    sl_tls_files_free(stream_cert_pem);
    sl_tls_files_free(stream_key_pem);
    sl_tls_files_free(stream_ca_pem);
    sl_tls_files_free(rest_cert_pem);
    sl_tls_files_free(rest_key_pem);
    free(token);
    free(resources);
    return exit_code;
}
