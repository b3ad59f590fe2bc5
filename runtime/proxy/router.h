/*
 * Request routing: (host, path, method, headers, query) -> one compiled route
 * of the active generation. Built once per generation by the main thread,
 * immutable afterwards, read lock-free by every worker.
 *
 * Cost does not grow with the number of routes: hosts are looked up in hash
 * maps, paths walk a segment trie (literal children hashed, one parameter
 * child per node); only routes of kind REGEX are tried one by one, and only
 * those of the host bucket at hand.
 *
 * Precedence (documented in docs/configuration.md):
 *   host: exact > longest "*.suffix" wildcard > "*"; if no route of a more
 *         specific host bucket matches the path, the next bucket is tried;
 *   path: exact > template (at each segment, a literal beats a parameter,
 *         left to right) > prefix (longest first) > regex (declaration order);
 *   same path: routes with more header/query matches first, then
 *         declaration order.
 * A path that matches with the wrong method everywhere gives 405 with the
 * union of the allowed methods.
 */
#ifndef SL_ROUTER_H
#define SL_ROUTER_H

#include "http1.h"
#include "sl_types.h"
#include "sluice/v1/snapshot.pb-c.h"

typedef struct sl_router sl_router_t;

typedef struct {
    sl_str_t host;   /* Host without port; matched case-insensitively */
    sl_str_t path;   /* raw path, no query; percent-encoding is not decoded */
    sl_str_t query;  /* raw query string without '?' */
    unsigned method_bit; /* enum sl_http_method */
    sl_str_t method;     /* for SL_METHOD_OTHER */
    const sl_http1_header_t *headers;
    size_t num_headers;
} sl_router_request_t;

typedef struct {
    /* on SL_OK */
    uint32_t table_index;  /* index in snapshot->route_tables */
    uint32_t route_index;  /* index in route_tables[t]->routes */
    size_t base_path_len;  /* bytes of the request path covered by the base path
                              ("/petstore/v1"); 0 for base path "/" */
    /* on 405 */
    unsigned allow_methods; /* bits of enum sl_http_method */
} sl_router_result_t;

/* Builds the router of a snapshot. Returns NULL with a message in err (for
 * instance a regex PCRE2 refuses, naming the table and the route). The router
 * keeps pointers into `snap`, which must outlive it. */
sl_router_t *sl_router_build(const Sluice__V1__Snapshot *snap, char *err, size_t errlen);
void sl_router_free(sl_router_t *router);

/* The router of `snap` made from `prev`, the router of an earlier snapshot
 * that is still alive (issue 14, "the router is rebuilt per affected Api"):
 * route tables whose message is the very one prev was built from (pbshare.h)
 * keep their compiled routes and trie entries; the routes of removed or
 * changed tables leave the trie and those of new or changed ones enter it,
 * at the same precedence as in a whole build (same results, same lookup
 * cost). Falls back to sl_router_build when a changed table has regex routes
 * or a host no table had, when kept tables change order, and every
 * SL_ROUTER_MAX_PATCHES (1024) patches or when what patches left behind
 * grows too big (removed routes over a quarter of the live ones, unused
 * entries over the live ones). The new router shares prev's regexes and long
 * keys by reference count (either may be freed first). Errors as
 * sl_router_build. */
sl_router_t *sl_router_update(const sl_router_t *prev, const Sluice__V1__Snapshot *snap,
                              char *err, size_t errlen);

/* Patches since the router was last built whole (0: built whole). */
uint32_t sl_router_patches(const sl_router_t *router);

/* Returns SL_OK and fills res, or 404 or 405 (res->allow_methods set).
 * Thread-safe for concurrent readers (uses per-thread PCRE2 match data). */
int sl_router_match(const sl_router_t *router, const sl_router_request_t *req,
                    sl_router_result_t *res);

/* The calling thread's PCRE2 match data (one pair of offsets: the router
 * and the routing rules only ask whether a regex matches), made on first
 * use and freed when the thread exits; NULL when out of memory. */
struct pcre2_real_match_data_8;
struct pcre2_real_match_data_8 *sl_router_match_data(void);

#endif
