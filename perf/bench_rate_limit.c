/*
 * rate-limit micro-benchmark: nanoseconds per on_request of a local
 * rate-limit policy (one limit by IP, and three limits by consumer, IP and
 * header), for one hot key and for 10,000 keys, single-threaded and with two
 * threads sharing the table (the compare-and-swap under contention). Every
 * request is admitted (the limits are far above the rate), so each call
 * takes a token and adds the three RateLimit-* response headers: the path
 * every admitted request of a real runtime takes.
 *
 *   make BUILD=build perf-tools && build/perf/bench_rate_limit [calls]
 *
 * What it does not show: the end-to-end proxy cost (perf/bench.sh), where
 * this is a small part of a request's CPU time.
 */
#include "policy.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KEYS 10000

typedef struct {
    const sl_policy_def_t *def;
    void *state;
    long calls;
    unsigned nkeys;
    double ns;
} run_t;

static char ips[KEYS][16];

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void *run(void *arg)
{
    run_t *r = arg;
    sl_hdr_edit_t edits[2][16];
    char arena[512];
    sl_policy_header_t hdr = {{"X-Tenant", 8}, {"tenant-1", 8}};
    sl_policy_reply_t reply;
    double t0 = now_ns();
    for (long i = 0; i < r->calls; i++) {
        sl_policy_req_t q;
        memset(&q, 0, sizeof(q));
        q.client_ip = ips[(unsigned long)i % r->nkeys];
        q.api = "default/t";
        q.operation = "all";
        q.consumer.name = ips[(unsigned long)i % r->nkeys];
        q.headers = &hdr;
        q.num_headers = 1;
        q.req_edits = edits[0];
        q.resp_edits = edits[1];
        q.max_edits = 16;
        q.arena = arena;
        q.arena_cap = sizeof(arena);
        if (r->def->on_request(r->state, &q, &reply) != SL_POLICY_CONTINUE) {
            fprintf(stderr, "bench_rate_limit: a request was rejected\n");
            exit(1);
        }
    }
    r->ns = (now_ns() - t0) / (double)r->calls;
    return NULL;
}

static void bench(const char *name, const char *config, long calls, unsigned nkeys, int threads)
{
    const sl_policy_def_t *def = sl_policy_find("rate-limit");
    json_t *cfg = json_loads(config, 0, NULL);
    char err[256];
    sl_policy_env_t env = {NULL, 2, NULL};
    void *state = def->compile(cfg, &env, err, sizeof(err));
    if (!state) {
        fprintf(stderr, "bench_rate_limit: %s\n", err);
        exit(1);
    }
    run_t r[2];
    pthread_t t[2];
    for (int i = 0; i < threads; i++) {
        r[i] = (run_t){def, state, calls, nkeys, 0};
        pthread_create(&t[i], NULL, run, &r[i]);
    }
    double sum = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        sum += r[i].ns;
    }
    printf("%-44s %7u keys %d thread%s %8.1f ns/request\n", name, nkeys, threads,
           threads > 1 ? "s" : " ", sum / threads);
    def->free(state);
    json_decref(cfg);
}

int main(int argc, char **argv)
{
    long calls = argc > 1 ? atol(argv[1]) : 400000; /* per thread: under the 1M/s burst */
    for (unsigned i = 0; i < KEYS; i++)
        snprintf(ips[i], sizeof(ips[i]), "10.%u.%u.%u", i >> 16, (i >> 8) & 255, i & 255);
    const char *one = "{\"limits\":[{\"requests\":1000000,\"period\":\"1s\",\"by\":\"ip\"}],"
                      "\"maxKeys\":65536}";
    const char *three =
        "{\"limits\":[{\"requests\":1000000,\"period\":\"1s\",\"by\":\"consumer\"},"
        "{\"requests\":1000000,\"period\":\"1s\",\"by\":\"ip\"},"
        "{\"requests\":1000000,\"period\":\"1s\",\"by\":\"header\",\"header\":\"X-Tenant\"}],"
        "\"maxKeys\":65536}";
    for (int threads = 1; threads <= 2; threads++) {
        bench("1 limit (by ip)", one, calls, 1, threads);
        bench("1 limit (by ip)", one, calls, KEYS, threads);
        bench("3 limits (consumer, ip, header)", three, calls, 1, threads);
        bench("3 limits (consumer, ip, header)", three, calls, KEYS, threads);
    }
    return 0;
}
