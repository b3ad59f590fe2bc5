/*
 * Router micro-benchmark: builds route tables of 10, 1,000, 10,000 and
 * 100,000 routes (exact paths and templates spread over many Apis, base
 * paths and host kinds) and reports the build time and the nanoseconds per
 * sl_router_match for exact hits, template hits and misses (404).
 *
 * What it shows: lookup cost must stay flat as the number of routes grows
 * (docs/routing.md "Measured"). What it does not: end-to-end proxy cost
 * (perf/bench.sh). Every looked-up request is first checked to resolve to the
 * route it was made for, so a fast wrong answer cannot pass for a result.
 *
 *   make BUILD=build perf-tools && build/perf/bench_router [lookups-per-size [sizes...]]
 *
 * Under `valgrind --tool=callgrind` the same program gives instruction
 * counts, which unlike times do not depend on the machine's load.
 */
#include "router.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ROUTES_PER_API 50
#define NUM_REQUESTS 4096 /* distinct requests: "spread", beyond the CPU caches at 100k */
#define HOT_REQUESTS 64   /* distinct requests: "hot", the route data stays in L1/L2 */

typedef struct {
    char host[64];
    char path[128];
    unsigned method_bit;
    const char *method;
    uint32_t table, route; /* expected; table = UINT32_MAX for a 404 */
} bench_req_t;

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n, size);
    if (!p) {
        fprintf(stderr, "bench_router: out of memory\n");
        exit(1);
    }
    return p;
}

static char *xstrdup(const char *s)
{
    char *p = strdup(s);
    if (!p) {
        fprintf(stderr, "bench_router: out of memory\n");
        exit(1);
    }
    return p;
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Api a: base "/svc<a>/v<1..3>"; hosts cycle exact, wildcard, "*". Route r:
 * even = exact "/things<r>" (GET), odd = template
 * "/things<r>/{id}/sub<r%5>/{sub}" (GET, POST). */
static void api_host(int a, char *buf, size_t len, int for_request)
{
    switch (a % 3) {
    case 0:
        snprintf(buf, len, "api%d.example.com", a);
        break;
    case 1:
        snprintf(buf, len, for_request ? "edge-3.t%d.example.com" : "*.t%d.example.com", a);
        break;
    default:
        snprintf(buf, len, for_request ? "anything.example.org" : "*");
        break;
    }
}

static Sluice__V1__Snapshot *make_snapshot(int nroutes)
{
    Sluice__V1__Snapshot *s = xcalloc(1, sizeof *s);
    sluice__v1__snapshot__init(s);
    int napis = (nroutes + ROUTES_PER_API - 1) / ROUTES_PER_API;
    s->route_tables = xcalloc((size_t)napis, sizeof *s->route_tables);
    char buf[128];
    int left = nroutes;
    for (int a = 0; a < napis; a++) {
        Sluice__V1__RouteTable *t = xcalloc(1, sizeof *t);
        sluice__v1__route_table__init(t);
        snprintf(buf, sizeof buf, "api%d", a);
        t->name = xstrdup(buf);
        snprintf(buf, sizeof buf, "/svc%d/v%d", a, a % 3 + 1);
        t->base_path = xstrdup(buf);
        t->hosts = xcalloc(1, sizeof *t->hosts);
        api_host(a, buf, sizeof buf, 0);
        t->hosts[t->n_hosts++] = xstrdup(buf);
        int n = left < ROUTES_PER_API ? left : ROUTES_PER_API;
        left -= n;
        t->routes = xcalloc((size_t)n, sizeof *t->routes);
        for (int r = 0; r < n; r++) {
            Sluice__V1__Route *rt = xcalloc(1, sizeof *rt);
            sluice__v1__route__init(rt);
            snprintf(buf, sizeof buf, "op%d", r);
            rt->name = xstrdup(buf);
            rt->methods = xcalloc(2, sizeof *rt->methods);
            rt->methods[rt->n_methods++] = xstrdup("GET");
            if (r % 2) {
                rt->methods[rt->n_methods++] = xstrdup("POST");
                rt->path_kind = SLUICE__V1__ROUTE__PATH_KIND__TEMPLATE;
                snprintf(buf, sizeof buf, "/things%d/{id}/sub%d/{sub}", r, r % 5);
            } else {
                rt->path_kind = SLUICE__V1__ROUTE__PATH_KIND__EXACT;
                snprintf(buf, sizeof buf, "/things%d", r);
            }
            rt->path = xstrdup(buf);
            t->routes[t->n_routes++] = rt;
        }
        s->route_tables[s->n_route_tables++] = t;
    }
    return s;
}

/* kind 0: exact hit, 1: template hit, 2: miss (unknown path under a real Api). */
static void make_requests(bench_req_t *reqs, int nroutes, int kind, unsigned seed)
{
    int napis = (nroutes + ROUTES_PER_API - 1) / ROUTES_PER_API;
    for (int i = 0; i < NUM_REQUESTS; i++) {
        bench_req_t *q = &reqs[i];
        seed = seed * 1103515245u + 12345u;
        int a = (int)((seed >> 8) % (unsigned)napis);
        int in_api = a == napis - 1 ? nroutes - a * ROUTES_PER_API : ROUTES_PER_API;
        seed = seed * 1103515245u + 12345u;
        int r = (int)((seed >> 8) % (unsigned)in_api);
        if (kind == 0 && r % 2)
            r = r - 1;
        if (kind == 1 && r % 2 == 0)
            r = r + 1 < in_api ? r + 1 : r - 1;
        if (kind == 1 && r < 0) /* an Api with one route has no template */
            r = 0;
        api_host(a, q->host, sizeof q->host, 1);
        q->method = "GET";
        q->method_bit = SL_METHOD_GET;
        q->table = (uint32_t)a;
        q->route = (uint32_t)r;
        if (kind == 2) {
            snprintf(q->path, sizeof q->path, "/svc%d/v%d/things%d/unknown", a, a % 3 + 1, r);
            q->table = UINT32_MAX;
        } else if (r % 2) {
            snprintf(q->path, sizeof q->path, "/svc%d/v%d/things%d/%d/sub%d/s-%d", a, a % 3 + 1, r,
                     i, r % 5, i);
        } else {
            snprintf(q->path, sizeof q->path, "/svc%d/v%d/things%d", a, a % 3 + 1, r);
        }
    }
}

static sl_router_request_t to_request(const bench_req_t *q)
{
    return (sl_router_request_t){
        .host = {q->host, strlen(q->host)},
        .path = {q->path, strlen(q->path)},
        .query = {"", 0},
        .method_bit = q->method_bit,
        .method = {q->method, strlen(q->method)},
    };
}

/* Returns ns per lookup over `lookups` calls cycling through the first
 * `nreqs` requests (a power of two), after checking every answer. */
static double time_lookups(const sl_router_t *router, const bench_req_t *reqs, int nreqs,
                           long lookups)
{
    static sl_router_request_t rq[NUM_REQUESTS];
    for (int i = 0; i < NUM_REQUESTS; i++) {
        sl_router_result_t res;
        rq[i] = to_request(&reqs[i]);
        int rc = sl_router_match(router, &rq[i], &res);
        int ok = reqs[i].table == UINT32_MAX ? rc == 404
                                             : rc == SL_OK && res.table_index == reqs[i].table &&
                                                   res.route_index == reqs[i].route;
        if (!ok) {
            fprintf(stderr, "bench_router: %s%s resolved wrongly (rc %d)\n", reqs[i].host,
                    reqs[i].path, rc);
            exit(1);
        }
    }
    volatile uint32_t sink = 0;
    double t0 = now_ns();
    for (long n = 0; n < lookups; n++) {
        sl_router_result_t res;
        int rc = sl_router_match(router, &rq[n & (nreqs - 1)], &res);
        sink += (uint32_t)rc + res.route_index;
    }
    double t1 = now_ns();
    (void)sink;
    return (t1 - t0) / (double)lookups;
}

int main(int argc, char **argv)
{
    static int sizes[] = {10, 1000, 10000, 100000};
    size_t nsizes = sizeof sizes / sizeof sizes[0];
    long lookups = argc > 1 ? atol(argv[1]) : 2000000;
    static bench_req_t reqs[NUM_REQUESTS];
    char err[512];

    if (lookups <= 0) {
        fprintf(stderr, "usage: %s [lookups-per-size > 0 [sizes...]]\n", argv[0]);
        return 2;
    }
    if (argc > 2) {
        nsizes = 0;
        for (int i = 2; i < argc && nsizes < sizeof sizes / sizeof sizes[0]; i++) {
            sizes[nsizes] = atoi(argv[i]);
            if (sizes[nsizes] <= 0 || sizes[nsizes] > 10000000) {
                fprintf(stderr, "%s: size '%s' must be 1..10000000\n", argv[0], argv[i]);
                return 2;
            }
            nsizes++;
        }
    }
    printf("ns per lookup; hot = %d distinct requests, spread = %d over every Api\n", HOT_REQUESTS,
           NUM_REQUESTS);
    printf("%8s %6s %9s %9s %9s %9s %9s %9s %9s\n", "routes", "apis", "build ms", "exact", "",
           "template", "", "miss 404", "");
    printf("%8s %6s %9s %9s %9s %9s %9s %9s %9s\n", "", "", "", "hot", "spread", "hot", "spread",
           "hot", "spread");
    for (size_t i = 0; i < nsizes; i++) {
        int n = sizes[i];
        Sluice__V1__Snapshot *snap = make_snapshot(n);
        double t0 = now_ns();
        sl_router_t *router = sl_router_build(snap, err, sizeof err);
        double build_ms = (now_ns() - t0) / 1e6;
        if (!router) {
            fprintf(stderr, "bench_router: build of %d routes failed: %s\n", n, err);
            return 1;
        }
        double hot[3], spread[3];
        for (int kind = 0; kind < 3; kind++) {
            make_requests(reqs, n, kind, 12345u + (unsigned)kind);
            hot[kind] = time_lookups(router, reqs, HOT_REQUESTS, lookups);
            spread[kind] = time_lookups(router, reqs, NUM_REQUESTS, lookups);
        }
        printf("%8d %6zu %9.2f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f\n", n, snap->n_route_tables,
               build_ms, hot[0], spread[0], hot[1], spread[1], hot[2], spread[2]);
        fflush(stdout);
        sl_router_free(router);
        sluice__v1__snapshot__free_unpacked(snap, NULL);
    }
    return 0;
}
