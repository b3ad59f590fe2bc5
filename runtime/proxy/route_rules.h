/*
 * Rule-based backend choice (Api/operation `routing`, docs/routing.md
 * "Rule-based backend choice"): request attributes -> the first rule whose
 * statements match -> an ordered list of backends (the pick first, then the
 * fallbacks retries move to, in order).
 *
 * Built once per generation by the main thread (sl_route_rules_build: regexes
 * compiled with JIT, CIDRs parsed, path parameters resolved to segments,
 * backend names resolved to the generation's clusters), immutable
 * afterwards, evaluated by every worker without locks. The only state
 * written on the request path is a split's smooth weighted round-robin
 * counters, one row per worker (written only by that worker), so splits are
 * exact to the request: 90/10 is 9 of every 10 per worker, not "about".
 *
 * A clean function of its inputs so that other callers (the decision API,
 * `action: decide`) evaluate the same rules for attributes they assemble
 * themselves: fill an sl_route_attrs_t, call sl_route_rules_eval.
 *
 * An output scored by success rate (RouteOutput.success_rate) holds its
 * windows' handle (srate.h, one scope per rule) and is chosen as its list
 * of backends as written: the caller ranks them by score (request.c, which
 * knows the request's scoring key).
 *
 * Not here: which cluster of the list is healthy (request.c tries them in
 * order, sl_request_pick_endpoint), the success-rate pick itself.
 */
#ifndef SL_ROUTE_RULES_H
#define SL_ROUTE_RULES_H

#include "http1.h"
#include "sl_types.h"
#include "sluice/v1/snapshot.pb-c.h"

#include <jansson.h>

struct sl_gen_cluster;
struct sl_srate_route;
typedef struct sl_route_rules sl_route_rules_t;

/* The most backends a choice lists (the pick and its fallbacks). */
#define SL_ROUTE_CHOICES_MAX 16

/* What rules can look at. Every field may be empty/NULL: a condition on a
 * missing attribute is false (only `absent` is true). */
typedef struct {
    sl_str_t method;
    sl_str_t rel_path; /* the path after the base path (path parameters) */
    sl_str_t query;    /* raw, without '?' */
    const sl_http1_header_t *headers;
    size_t num_headers;
    const char *client_ip;      /* text, as the connection has it */
    const char *consumer;       /* authenticated Consumer (namespace/name), NULL = none */
    const char *consumer_group; /* its group, NULL = none */
    json_t *claims;             /* the verified JWT's claims, NULL = none */
    json_t *body;               /* the JSON request body, NULL = none (or not JSON) */
} sl_route_attrs_t;

typedef struct {
    int rule;              /* index of the rule that matched, -1 = the default */
    const char *rule_name; /* its name ("rules[2]" when unnamed), "default" */
    size_t n;              /* clusters listed, >= 1 */
    struct sl_gen_cluster *clusters[SL_ROUTE_CHOICES_MAX];
    /* Scored by success rate: clusters are the output's backends as
     * written (none twice), weights[n] theirs, and srate ranks them
     * (sl_srate_pick, backend i is the route's i). NULL: clusters are the
     * pick and its fallbacks, in order. */
    struct sl_srate_route *srate;
    const uint32_t *weights;
} sl_route_choice_t;

/* Resolves a snapshot cluster name ("ns/name") to the generation's cluster. */
typedef struct sl_gen_cluster *(*sl_route_find_fn)(void *ctx, const char *name);

/*
 * Compiles `pb` for one route: route_path is the operation's path (relative
 * to the base path) and is_template whether it has parameters; `backends`
 * with `weights` (n of them) is the default when pb has none. sr is the
 * route's success-rate settings (NULL: none), for the outputs scored by
 * success rate. Returns NULL with a message in err (a regex PCRE2 refuses,
 * an unknown cluster): the caller refuses the generation (the runtime
 * NACKs it).
 */
sl_route_rules_t *sl_route_rules_build(const Sluice__V1__Routing *pb, const char *route_path,
                                       int is_template, sl_route_find_fn find, void *find_ctx,
                                       struct sl_gen_cluster *const *backends,
                                       const uint32_t *weights, size_t n,
                                       const Sluice__V1__SuccessRate *sr, unsigned nworkers,
                                       char *err, size_t errlen);

/* An output of the block scored by success rate (they share the block's
 * scoring keys), or NULL when none is. */
struct sl_srate_route *sl_route_rules_any_srate(const sl_route_rules_t *rr);
void sl_route_rules_free(sl_route_rules_t *rr);

/* Some condition reads JWT claims: the chain must keep them. */
int sl_route_rules_reads_claims(const sl_route_rules_t *rr);
/* Some condition reads the consumer, its group or claims: they exist only
 * after the policy chain ran. */
int sl_route_rules_reads_identity(const sl_route_rules_t *rr);

/* Some condition reads the JSON body: the request's body is read whole
 * (at most sl_route_rules_body_max bytes) before the choice. */
int sl_route_rules_reads_body(const sl_route_rules_t *rr);
uint64_t sl_route_rules_body_max(const sl_route_rules_t *rr);

/*
 * The choice in two steps, for a request whose body is read after its head
 * is gone: sl_route_rules_defer evaluates every condition that does not
 * read the body while the head is there and keeps the results in `bits`
 * (one per condition; the build refuses more than SL_ROUTE_DEFER_MAX
 * conditions in a block that reads the body); sl_route_rules_match_deferred
 * then decides with those and the body. sl_route_rules_head_cluster is a
 * cluster of the block, for the upstream head written meanwhile (every
 * cluster the block can choose takes the same head: the build checks).
 */
#define SL_ROUTE_DEFER_MAX 256
typedef struct {
    uint64_t w[SL_ROUTE_DEFER_MAX / 64];
} sl_route_bits_t;
void sl_route_rules_defer(const sl_route_rules_t *rr, const sl_route_attrs_t *a,
                          sl_route_bits_t *bits);
int sl_route_rules_match_deferred(const sl_route_rules_t *rr, const sl_route_bits_t *bits,
                                  json_t *body);
struct sl_gen_cluster *sl_route_rules_head_cluster(const sl_route_rules_t *rr);

/* The index of the first rule that matches a, or -1 (the default). */
int sl_route_rules_match(const sl_route_rules_t *rr, const sl_route_attrs_t *a);

/* The ordered backends of rule `rule` (-1: the default) for worker
 * `worker` (< nworkers; advances that worker's split counters). */
void sl_route_rules_choose(const sl_route_rules_t *rr, int rule, unsigned worker,
                           sl_route_choice_t *out);

/* Both: match, then choose. */
static inline void sl_route_rules_eval(const sl_route_rules_t *rr, const sl_route_attrs_t *a,
                                       unsigned worker, sl_route_choice_t *out)
{
    sl_route_rules_choose(rr, sl_route_rules_match(rr, a), worker, out);
}

#endif
