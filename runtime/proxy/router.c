/*
 * Router: compiles the route tables of a snapshot into an immutable matcher,
 * then answers (host, path, method, headers, query) -> one route, 404 or 405.
 *
 * Responsible for: host buckets (exact, "*.suffix", "*"), one segment trie per
 * bucket over the full path (base path + route path), prefix and regex
 * routes, method / header / query matches, and the precedence that router.h
 * states and docs/routing.md explains with examples.
 *
 * Not responsible for: validating resources (common/validate.c; the router
 * only refuses what it cannot compile, with a message naming table and
 * route), path normalisation or percent-decoding (the HTTP layer; the router
 * matches the raw bytes it is given), stripping the base path (the proxy uses
 * base_path_len), writing the 404/405 responses (the proxy).
 *
 * Threading: sl_router_build runs on one thread; afterwards nothing in the
 * router is written, so any number of workers may call sl_router_match at the
 * same time without locks. The only mutable state is each thread's PCRE2
 * match data, which is thread-local and created on the first regex match of
 * that thread (freed at thread exit by a pthread key destructor).
 *
 * Cost of a lookup: one hash probe per host candidate, one hash probe per
 * path segment walked in the trie (plus backtracking into parameter children,
 * bounded by the size of the trie, never by the number of routes), then the
 * prefix entries of the nodes on the literal walk, then the regex routes of
 * the bucket one by one. Only regex routes cost linear time, by design.
 */
#include "router.h"
#include "pathtpl.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* Bounds, documented in docs/routing.md. The depth bound keeps the trie
 * search recursion and the prefix walk on a fixed-size stack. */
#define SL_ROUTER_MAX_DEPTH 128            /* segments of base path + route path */
#define SL_ROUTER_MAX_HOST_LEN 253         /* a DNS name; longer hosts only reach "*" */
#define SL_ROUTER_REGEX_MATCH_LIMIT 100000 /* PCRE2 match limit per regex test */

#define NONE UINT32_MAX

/* Host map keys: exact hosts and wildcard suffixes live in one map. */
#define HOST_EXACT 0u
#define HOST_WILDCARD 1u

/* ------------------------------------------------------------------------ */
/* Compiled form                                                            */

typedef struct {
    const char *name; /* header names are lower-cased copies; query names raw */
    size_t name_len;
    const char *value;
    size_t value_len;
    pcre2_code *re; /* REGEX only */
    int kind;       /* Sluice__V1__HeaderMatch__Kind */
    bool invert;
} cmatch_t;

typedef struct {
    const Sluice__V1__Route *pb; /* for methods outside the nine well-known */
    const char *base;            /* base path, "" for "/" */
    size_t base_len;
    pcre2_code *path_re; /* REGEX routes */
    uint32_t sid;         /* its table's stable id: router->tpos[sid] */
    uint32_t route_index; /* in its table; declaration order is tpos.decl_base + this */
    uint32_t match_begin; /* in router->matches: headers first, then query */
    uint32_t n_headers;
    uint32_t n_query;
    unsigned method_bits;
    bool any_method;
    bool other_methods; /* pb->methods holds a method outside the nine */
} croute_t;

/* Routes hanging at a trie node, in precedence order: exact, template, prefix. */
typedef struct {
    const char *partial; /* prefix routes: text the next segment must start with */
    uint32_t partial_len;
    uint32_t route; /* index in router->routes */
    bool or_end;    /* prefix "/" under a base path: also matches the base itself */
} entry_t;

typedef struct {
    uint32_t param_child;
    uint32_t n_literal; /* literal children (in router->children) */
    uint32_t entry_begin;
    uint32_t n_exact;
    uint32_t n_template;
    uint32_t n_prefix;
} node_t;

typedef struct {
    uint32_t root;
    uint32_t regex_begin; /* in router->regex_routes */
    uint32_t n_regex;
    uint32_t last_table; /* build only: de-duplicates hosts of one table */
} bucket_t;

/* Open-addressing hash map, (parent, bytes) -> value. Used for trie children
 * (parent = node) and hosts (parent = HOST_EXACT / HOST_WILDCARD). Keys of
 * up to SLOT_INLINE bytes (most path segments) are stored in the slot, so a
 * probe touches one cache line and never the snapshot's strings. */
#define SLOT_INLINE 12
typedef struct {
    uint64_t hash;
    uint32_t parent;
    uint32_t value; /* NONE = empty slot */
    uint32_t key_len;
    char key[SLOT_INLINE]; /* the bytes, or a `const char *` to them when longer */
} slot_t;
_Static_assert(sizeof(const char *) <= SLOT_INLINE, "a key pointer must fit in slot_t.key");

/*
 * Chunked arrays, shared copy-on-write between a router and the routers
 * patched from it (sl_router_update). Element i is in chunk i >> S at
 * i & (2^S - 1), S a constant per array; a chunk has a reference count
 * in the CHUNK_HDR bytes before its data. A patched router references
 * every chunk of the router it came from and copies only the chunks it
 * writes, so a change costs what it touches plus one pointer per chunk,
 * never a copy of the whole table (at 100,000 routes the flat arrays were
 * ~20 MB per change). Readers pay one more load per element, from a chunk
 * table that stays in cache.
 */
typedef struct {
    void **c; /* chunk data, each CHUNK_HDR bytes after its reference count */
    uint32_t n_c, cap_c;
} cvec_t;

#define CHUNK_HDR 16
#define ROUTE_S 8  /* 256 croute_t per chunk */
#define MATCH_S 8  /* 256 cmatch_t */
#define NODE_S 10  /* 1,024 node_t */
#define ENTRY_S 10 /* 1,024 entry_t */
#define SLOT_S 10  /* 1,024 slot_t: 32 KB */

#define CV_AT(v, T, S, i) (((T *)(v).c[(size_t)(i) >> (S)])[(size_t)(i) & ((1u << (S)) - 1)])

typedef struct {
    cvec_t slots; /* slot_t, SLOT_S */
    size_t mask;  /* capacity - 1; no slots when count and mask are 0 and slots.n_c is 0 */
    size_t count;
} map_t;

/* What a build or a patch (sl_router_update) allocated that routers share:
 * lower-cased hosts and header names, trie keys longer than SLOT_INLINE,
 * compiled regexes. A patched router references the arenas of the router it
 * came from, since its routes, nodes and map slots point into them; an
 * arena goes with the last router that references it. */
typedef struct {
    atomic_long refs;
    char *strings; /* hosts and header names, sized by the build */
    char **blocks; /* long trie keys and tables' node lists, bump-allocated, never moved */
    size_t n_blocks, block_left;
    char *block_ptr;
    pcre2_code **codes;
    size_t n_codes, codes_cap;
} rarena_t;

/* One route table of the snapshot the router was built from: its routes
 * are routes[first_route .. first_route + n_routes). */
typedef struct {
    const Sluice__V1__RouteTable *pb;
    uint32_t first_route;
    uint32_t n_routes;
    uint32_t sid;         /* stable id, kept while the table is kept by patches */
    const uint32_t *nodes; /* the trie nodes holding its entries (arena), so that
                              its removal visits those only */
    uint32_t n_nodes;
    bool has_regex; /* REGEX routes live in per-bucket lists: no patching */
} rtable_t;

/* Where the table of stable id sid is now: its index in the snapshot (NONE
 * once removed) and the declaration order of its first route. */
typedef struct {
    uint32_t index;
    uint32_t decl_base;
} tpos_t;

struct sl_router {
    uint64_t seed;
    cvec_t routes; /* croute_t, ROUTE_S */
    uint32_t n_routes;
    cvec_t matches; /* cmatch_t, MATCH_S */
    uint32_t n_matches;
    cvec_t nodes; /* node_t, NODE_S */
    uint32_t n_nodes;
    cvec_t entries;          /* entry_t, ENTRY_S */
    uint32_t n_entries;      /* used, with the ranges patches left behind */
    uint32_t n_entries_live; /* in the nodes' ranges */
    uint32_t *regex_routes;
    uint32_t n_regex_routes;
    bucket_t *buckets;
    uint32_t n_buckets;
    uint32_t star_bucket;
    uint32_t *wildcard_lens; /* distinct suffix lengths, longest first */
    uint32_t n_wildcard_lens;
    map_t children;
    map_t hosts;
    pcre2_match_context *mctx;
    rarena_t **arenas; /* [n_arenas], referenced; the last is this build's own */
    uint32_t n_arenas;
    rtable_t *tables; /* [n_tables], the snapshot's order */
    uint32_t n_tables;
    tpos_t *tpos; /* [n_sids], by stable table id */
    uint32_t n_sids;
    uint32_t n_dead;  /* routes of removed tables left in routes[] by patches */
    uint32_t patches; /* sl_router_update steps since the last whole build */
};

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */

static const char *str_or_empty(const char *s)
{
    return s ? s : "";
}

static unsigned char lower(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') ? (unsigned char)(c + ('a' - 'A')) : c;
}

static bool eq_nocase(const char *a, const char *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (lower((unsigned char)a[i]) != lower((unsigned char)b[i]))
            return false;
    return true;
}

static void errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* "route table petstore route getPet" (or "#3" when a name is empty), the
 * prefix of every build error about a route. */
static void route_label(char *buf, size_t len, const Sluice__V1__RouteTable *t, size_t ti,
                        const Sluice__V1__Route *r, size_t ri)
{
    const char *tn = t ? str_or_empty(t->name) : "";
    const char *rn = r ? str_or_empty(r->name) : "";
    char tbuf[24], rbuf[24];
    snprintf(tbuf, sizeof tbuf, "#%zu", ti);
    snprintf(rbuf, sizeof rbuf, "#%zu", ri);
    snprintf(buf, len, "route table %s route %s", *tn ? tn : tbuf, *rn ? rn : rbuf);
}

static void table_label(char *buf, size_t len, const Sluice__V1__RouteTable *t, size_t ti)
{
    const char *tn = t ? str_or_empty(t->name) : "";
    if (*tn)
        snprintf(buf, len, "route table %s", tn);
    else
        snprintf(buf, len, "route table #%zu", ti);
}

/* Returns `arr` grown to hold at least `need` elements of `elem` bytes (the
 * same pointer when it already does), or NULL on overflow or allocation
 * failure, leaving `arr` and *cap untouched. */
static void *grow(void *arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return arr;
    size_t ncap = *cap ? *cap : 16;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2)
            return NULL;
        ncap *= 2;
    }
    if (ncap > SIZE_MAX / elem)
        return NULL;
    void *p = realloc(arr, ncap * elem);
    if (!p)
        return NULL;
    *cap = ncap;
    return p;
}

/* grow() for a typed pointer lvalue; evaluates to 0 or -1. */
#define GROW(ptr, cap, need)                                                                       \
    __extension__({                                                                                \
        void *grown_ = grow((ptr), &(cap), (need), sizeof *(ptr));                                 \
        int rc_ = grown_ ? 0 : -1;                                                                 \
        if (grown_)                                                                                \
            (ptr) = grown_;                                                                        \
        rc_;                                                                                       \
    })

/* ---- chunked arrays (cvec_t) ---- */

static inline atomic_int *chunk_refs(void *data)
{
    return (atomic_int *)(void *)((char *)data - CHUNK_HDR);
}

static void *chunk_new(size_t bytes)
{
    char *p = calloc(1, CHUNK_HDR + bytes);
    if (!p)
        return NULL;
    atomic_init((atomic_int *)(void *)p, 1);
    return p + CHUNK_HDR;
}

static void chunk_unref(void *data)
{
    if (data && atomic_fetch_sub_explicit(chunk_refs(data), 1, memory_order_acq_rel) == 1)
        free((char *)data - CHUNK_HDR);
}

static void cv_free(cvec_t *v)
{
    for (uint32_t i = 0; i < v->n_c; i++)
        chunk_unref(v->c[i]);
    free(v->c);
    *v = (cvec_t){0};
}

/* Chunks for elements [0, n): new ones zeroed. 0, or -1 out of memory. */
static int cv_reserve(cvec_t *v, size_t n, unsigned shift, size_t elem)
{
    size_t need = (n + ((size_t)1 << shift) - 1) >> shift;
    if (need <= v->n_c)
        return 0;
    if (need >= UINT32_MAX)
        return -1;
    if (need > v->cap_c) {
        size_t cap = v->cap_c ? v->cap_c : 4;
        while (cap < need)
            cap *= 2;
        void **c = realloc(v->c, cap * sizeof *c);
        if (!c)
            return -1;
        v->c = c;
        v->cap_c = (uint32_t)cap;
    }
    while (v->n_c < need) {
        if (!(v->c[v->n_c] = chunk_new(elem << shift)))
            return -1;
        v->n_c++;
    }
    return 0;
}

/* Element i (its chunk reserved) made writable: a chunk another router
 * references too is copied first. NULL when out of memory. */
static void *cv_wr(cvec_t *v, size_t i, unsigned shift, size_t elem)
{
    void **cp = &v->c[i >> shift];
    if (atomic_load_explicit(chunk_refs(*cp), memory_order_acquire) != 1) {
        void *copy = chunk_new(elem << shift);
        if (!copy)
            return NULL;
        memcpy(copy, *cp, elem << shift);
        chunk_unref(*cp);
        *cp = copy;
    }
    return (char *)*cp + (i & (((size_t)1 << shift) - 1)) * elem;
}

/* dst references src's chunks (dst empty). */
static int cv_share(cvec_t *dst, const cvec_t *src)
{
    *dst = (cvec_t){0};
    if (!src->n_c)
        return 0;
    if (!(dst->c = malloc((src->n_c + 1) * sizeof *dst->c)))
        return -1;
    for (uint32_t i = 0; i < src->n_c; i++) {
        atomic_fetch_add_explicit(chunk_refs(src->c[i]), 1, memory_order_relaxed);
        dst->c[i] = src->c[i];
    }
    dst->n_c = dst->cap_c = src->n_c;
    return 0;
}

static inline const croute_t *route_at(const sl_router_t *r, uint32_t i)
{
    return &CV_AT(r->routes, croute_t, ROUTE_S, i);
}

static inline const node_t *node_at(const sl_router_t *r, uint32_t i)
{
    return &CV_AT(r->nodes, node_t, NODE_S, i);
}

static inline const entry_t *entry_at(const sl_router_t *r, uint32_t i)
{
    return &CV_AT(r->entries, entry_t, ENTRY_S, i);
}

static inline const cmatch_t *match_at(const sl_router_t *r, uint32_t i)
{
    return &CV_AT(r->matches, cmatch_t, MATCH_S, i);
}

static inline croute_t *route_wr(sl_router_t *r, uint32_t i)
{
    return cv_wr(&r->routes, i, ROUTE_S, sizeof(croute_t));
}

static inline node_t *node_wr(sl_router_t *r, uint32_t i)
{
    return cv_wr(&r->nodes, i, NODE_S, sizeof(node_t));
}

static inline entry_t *entry_wr(sl_router_t *r, uint32_t i)
{
    return cv_wr(&r->entries, i, ENTRY_S, sizeof(entry_t));
}

static inline cmatch_t *match_wr(sl_router_t *r, uint32_t i)
{
    return cv_wr(&r->matches, i, MATCH_S, sizeof(cmatch_t));
}

/* Declaration order: tables, then routes (precedence among equals). */
static inline uint32_t route_decl(const sl_router_t *r, const croute_t *rt)
{
    return r->tpos[rt->sid].decl_base + rt->route_index;
}

/* ------------------------------------------------------------------------ */
/* Hashing                                                                  */

/* Seeded 64-bit hash of a key's bytes (one multiply per 8-byte word, the
 * murmur3 finaliser at the end). The seed is random per router so that
 * request bytes cannot be chosen to collide on a known table layout. A path
 * segment is hashed once per request; hash_child() then combines that hash
 * with each parent node it is looked up under. */
static inline uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

static inline uint64_t load32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t hash_bytes(uint64_t seed, const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    uint64_t h = seed ^ (n * 0x9e3779b97f4a7c15ull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    if (n >= 4) /* two overlapping loads cover 4..7 bytes */
        w = load32(p) | (load32(p + n - 4) << 32);
    else if (n > 0)
        w = (uint64_t)p[0] | ((uint64_t)p[n / 2] << 8) | ((uint64_t)p[n - 1] << 16);
    h = (h ^ w ^ 0x5bd1e9955bd1e995ull) * 0x94d049bb133111ebull;
    return mix64(h);
}

static inline uint64_t hash_child(uint64_t key_hash, uint32_t parent)
{
    return mix64(key_hash ^ (((uint64_t)parent + 1) * 0x9e3779b97f4a7c15ull));
}

static inline bool slot_key_eq(const slot_t *s, const char *key, size_t n)
{
    if (s->key_len != n)
        return false;
    if (n <= SLOT_INLINE)
        return memcmp(s->key, key, n) == 0;
    const char *p;
    memcpy(&p, s->key, sizeof p);
    return memcmp(p, key, n) == 0;
}

static inline const slot_t *slot_at(const map_t *m, size_t i)
{
    return &CV_AT(m->slots, slot_t, SLOT_S, i);
}

static inline uint32_t map_find(const map_t *m, uint64_t h, uint32_t parent, const char *key,
                                size_t n)
{
    if (!m->slots.n_c)
        return NONE;
    for (size_t i = (size_t)h & m->mask;; i = (i + 1) & m->mask) {
        const slot_t *s = slot_at(m, i);
        if (s->value == NONE)
            return NONE;
        if (s->hash == h && s->parent == parent && slot_key_eq(s, key, n))
            return s->value;
    }
}

/* An empty map of `cap` slots (a power of two), every slot free. */
static int map_alloc(map_t *m, size_t cap)
{
    *m = (map_t){.mask = cap - 1};
    if (cv_reserve(&m->slots, cap, SLOT_S, sizeof(slot_t)) < 0) {
        cv_free(&m->slots);
        return -1;
    }
    size_t per = cap < ((size_t)1 << SLOT_S) ? cap : (size_t)1 << SLOT_S;
    for (uint32_t c = 0; c < m->slots.n_c; c++)
        for (size_t i = 0; i < per; i++)
            ((slot_t *)m->slots.c[c])[i].value = NONE;
    return 0;
}

static int map_grow(map_t *m)
{
    size_t ncap = m->slots.n_c ? (m->mask + 1) * 2 : 64;
    if (ncap > SIZE_MAX / sizeof(slot_t))
        return -1;
    map_t nm;
    if (map_alloc(&nm, ncap) < 0)
        return -1;
    for (size_t i = 0; m->slots.n_c && i <= m->mask; i++) {
        const slot_t *s = slot_at(m, i);
        if (s->value == NONE)
            continue;
        size_t j = (size_t)s->hash & (ncap - 1);
        while (slot_at(&nm, j)->value != NONE)
            j = (j + 1) & (ncap - 1);
        *(slot_t *)cv_wr(&nm.slots, j, SLOT_S, sizeof(slot_t)) = *s; /* its own chunks */
    }
    nm.count = m->count;
    cv_free(&m->slots);
    *m = nm;
    return 0;
}

/* Inserts a key known to be absent; `key` must outlive the map when longer
 * than SLOT_INLINE. Keeps the load at most 1/2, so probes stay short and
 * map_find always meets an empty slot. */
static int map_insert(map_t *m, uint64_t h, uint32_t parent, const char *key, size_t n,
                      uint32_t value)
{
    if (n > UINT32_MAX)
        return -1;
    if (!m->slots.n_c || (m->count + 1) * 2 > m->mask + 1) {
        if (map_grow(m) < 0)
            return -1;
    }
    size_t i = (size_t)h & m->mask;
    while (slot_at(m, i)->value != NONE)
        i = (i + 1) & m->mask;
    slot_t *s = cv_wr(&m->slots, i, SLOT_S, sizeof(slot_t));
    if (!s)
        return -1;
    *s = (slot_t){.hash = h, .parent = parent, .value = value, .key_len = (uint32_t)n};
    if (n <= SLOT_INLINE)
        memcpy(s->key, key, n);
    else
        memcpy(s->key, &key, sizeof key);
    m->count++;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Methods                                                                  */

static const struct {
    const char *name;
    unsigned bit;
} known_methods[] = {
    {"GET", SL_METHOD_GET},         {"HEAD", SL_METHOD_HEAD},     {"POST", SL_METHOD_POST},
    {"PUT", SL_METHOD_PUT},         {"DELETE", SL_METHOD_DELETE}, {"PATCH", SL_METHOD_PATCH},
    {"OPTIONS", SL_METHOD_OPTIONS}, {"TRACE", SL_METHOD_TRACE},   {"CONNECT", SL_METHOD_CONNECT},
};

/* Methods are case-sensitive (RFC 9110 9.1): "get" is another method. */
static unsigned method_bit(const char *s)
{
    for (size_t i = 0; i < SL_ARRAY_LEN(known_methods); i++)
        if (strcmp(s, known_methods[i].name) == 0)
            return known_methods[i].bit;
    return SL_METHOD_OTHER;
}

static bool is_token(const char *s)
{
    if (!*s)
        return false;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              (c && strchr("!#$%&'*+-.^_`|~", c))))
            return false;
    }
    return true;
}

/* ------------------------------------------------------------------------ */
/* Regex                                                                    */

/* Compiles a regex that must match the whole subject: PCRE2_ANCHORED and
 * PCRE2_ENDANCHORED at compile time, which JIT honours (wrapping the pattern
 * in "^(?:...)$" would break on patterns such as "a\Q"). Byte mode, no UTF:
 * paths and header values are raw bytes and may be invalid UTF-8. */
static pcre2_code *regex_compile(const char *pattern, const char *label, const char *what,
                                 char *err, size_t errlen)
{
    int code;
    PCRE2_SIZE offset;
    PCRE2_UCHAR msg[256];
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_ANCHORED | PCRE2_ENDANCHORED, &code, &offset, NULL);
    if (!re) {
        pcre2_get_error_message(code, msg, sizeof msg);
        errf(err, errlen, "%s: %sregex \"%s\": %s at offset %zu", label, what, pattern,
             (const char *)msg, (size_t)offset);
        return NULL;
    }
    code = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    if (code != 0) {
        pcre2_get_error_message(code, msg, sizeof msg);
        errf(err, errlen, "%s: %sregex \"%s\": JIT compilation failed: %s", label, what, pattern,
             (const char *)msg);
        pcre2_code_free(re);
        return NULL;
    }
    return re;
}

static __thread pcre2_match_data *tls_match_data;
static pthread_key_t match_data_key;
static pthread_once_t match_data_once = PTHREAD_ONCE_INIT;
static bool match_data_key_ok;

static void match_data_destroy(void *p)
{
    pcre2_match_data_free(p);
}

static void match_data_key_init(void)
{
    match_data_key_ok = pthread_key_create(&match_data_key, match_data_destroy) == 0;
}

/* One pair of offsets is enough for every pattern: the router only asks
 * whether a regex matches, never for captures (a too-small ovector makes
 * pcre2_jit_match return 0, which still means "matched"). */
pcre2_match_data *sl_router_match_data(void)
{
    if (sl_likely(tls_match_data != NULL))
        return tls_match_data;
    pthread_once(&match_data_once, match_data_key_init);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!md)
        return NULL;
    if (match_data_key_ok)
        pthread_setspecific(match_data_key, md);
    tls_match_data = md;
    return md;
}

/* ------------------------------------------------------------------------ */
/* Build                                                                    */

typedef struct {
    uint32_t node;
    uint32_t kind; /* 0 exact, 1 template, 2 prefix: the order at a node */
    uint32_t nmatches;
    uint32_t decl;
    entry_t e;
} bentry_t;

typedef struct {
    uint32_t bucket;
    uint32_t group; /* decl of the first route with the same base and pattern */
    uint32_t nmatches;
    uint32_t decl;
    uint32_t route;
    const char *base;
    const char *pattern;
} bregex_t;

typedef struct {
    sl_router_t *r;
    const Sluice__V1__Snapshot *snap;
    char *err;
    size_t errlen;
    size_t nodes_cap;
    bentry_t *bentries;
    size_t n_bentries, bentries_cap;
    bregex_t *bregex;
    size_t n_bregex, bregex_cap;
    size_t buckets_cap;
    uint32_t *pairs; /* (bucket, table) flattened */
    size_t n_pairs, pairs_cap;
    char *strings_end;
    rarena_t *arena; /* this build's (the router's last) */
} build_t;

/* ---- arenas ---- */

static rarena_t *arena_new(void)
{
    rarena_t *a = calloc(1, sizeof *a);
    if (a)
        atomic_init(&a->refs, 1);
    return a;
}

static void arena_unref(rarena_t *a)
{
    if (!a || atomic_fetch_sub_explicit(&a->refs, 1, memory_order_acq_rel) != 1)
        return;
    for (size_t i = 0; i < a->n_codes; i++)
        pcre2_code_free(a->codes[i]);
    free(a->codes);
    for (size_t i = 0; i < a->n_blocks; i++)
        free(a->blocks[i]);
    free(a->blocks);
    free(a->strings);
    free(a);
}

/* Keeps `code` with the arena (freed with it); on failure frees it. */
static int arena_code(rarena_t *a, pcre2_code *code)
{
    if (GROW(a->codes, a->codes_cap, a->n_codes + 1) < 0) {
        pcre2_code_free(code);
        return -1;
    }
    a->codes[a->n_codes++] = code;
    return 0;
}

/* n bytes, 8-aligned, that live as long as the arena. */
static void *arena_alloc(rarena_t *a, size_t n)
{
    size_t pad = (size_t)(-(uintptr_t)a->block_ptr & 7);
    if (pad > a->block_left) {
        a->block_left = 0;
    } else {
        a->block_ptr += pad;
        a->block_left -= pad;
    }
    if (!a->block_ptr || n > a->block_left) {
        size_t sz = n > 65536 ? n : 65536;
        char **bl = realloc(a->blocks, (a->n_blocks + 1) * sizeof *bl);
        if (!bl)
            return NULL;
        a->blocks = bl;
        if (!(bl[a->n_blocks] = malloc(sz)))
            return NULL;
        a->block_ptr = bl[a->n_blocks++];
        a->block_left = sz;
    }
    char *p = a->block_ptr;
    a->block_ptr += n;
    a->block_left -= n;
    return p;
}

/* A copy of key[0..n) that lives as long as the arena. */
static const char *arena_key(rarena_t *a, const char *key, size_t n)
{
    char *p = arena_alloc(a, n);
    if (p)
        memcpy(p, key, n);
    return p;
}

static int new_node(build_t *b, uint32_t *out)
{
    sl_router_t *r = b->r;
    node_t *n;
    if (r->n_nodes >= NONE - 1 ||
        cv_reserve(&r->nodes, (size_t)r->n_nodes + 1, NODE_S, sizeof(node_t)) < 0 ||
        !(n = node_wr(r, r->n_nodes)))
        return -1;
    *n = (node_t){.param_child = NONE};
    *out = r->n_nodes++;
    return 0;
}

static int literal_child(build_t *b, uint32_t parent, const char *seg, size_t len, uint32_t *out)
{
    sl_router_t *r = b->r;
    uint64_t h = hash_child(hash_bytes(r->seed, seg, len), parent);
    uint32_t c = map_find(&r->children, h, parent, seg, len);
    if (c == NONE) {
        /* Long keys are the map's pointers: copied, so that no slot points
         * into a snapshot that a later router (sl_router_update) outlives. */
        const char *key = len > SLOT_INLINE ? arena_key(b->arena, seg, len) : seg;
        node_t *pn;
        if (!key || new_node(b, &c) < 0 || map_insert(&r->children, h, parent, key, len, c) < 0 ||
            !(pn = node_wr(r, parent)))
            return -1;
        pn->n_literal++;
    }
    *out = c;
    return 0;
}

static int param_child(build_t *b, uint32_t parent, uint32_t *out)
{
    sl_router_t *r = b->r;
    if (node_at(r, parent)->param_child == NONE) {
        uint32_t c;
        node_t *pn;
        if (new_node(b, &c) < 0 || !(pn = node_wr(r, parent)))
            return -1;
        pn->param_child = c;
    }
    *out = node_at(r, parent)->param_child;
    return 0;
}

/* Walks (creating) the segments of path[0..len), which is empty or starts
 * with '/'. In template mode a whole "{name}" segment is a parameter.
 * Returns 0, -1 on allocation failure, -2 when the depth bound is exceeded. */
static int insert_segments(build_t *b, uint32_t *node, unsigned *depth, const char *path,
                           size_t len, bool template_mode)
{
    size_t off = 0;
    while (off < len) {
        const char *seg = path + off + 1;
        const char *slash = memchr(seg, '/', len - off - 1);
        size_t seg_len = slash ? (size_t)(slash - seg) : len - off - 1;
        if (++*depth > SL_ROUTER_MAX_DEPTH)
            return -2;
        int rc;
        if (template_mode && seg_len >= 2 && seg[0] == '{' && seg[seg_len - 1] == '}')
            rc = param_child(b, *node, node);
        else
            rc = literal_child(b, *node, seg, seg_len, node);
        if (rc < 0)
            return -1;
        off += 1 + seg_len;
    }
    return 0;
}

static int add_entry(build_t *b, uint32_t node, uint32_t kind, uint32_t route, const char *partial,
                     size_t partial_len, bool or_end)
{
    const croute_t *rt = route_at(b->r, route);
    if (GROW(b->bentries, b->bentries_cap, b->n_bentries + 1) < 0)
        return -1;
    b->bentries[b->n_bentries++] = (bentry_t){
        .node = node,
        .kind = kind,
        .nmatches = rt->n_headers + rt->n_query,
        .decl = route_decl(b->r, rt),
        .e = {partial, (uint32_t)partial_len, route, or_end},
    };
    return 0;
}

/* Puts one route into one bucket's trie (or its regex list). */
static int insert_route(build_t *b, uint32_t bucket, uint32_t route)
{
    sl_router_t *r = b->r;
    const croute_t *rt = route_at(r, route);
    const char *path = str_or_empty(rt->pb->path);
    size_t len = strlen(path);
    uint32_t node = r->buckets[bucket].root;
    unsigned depth = 0;
    bool root_route = len == 1 && rt->base_len > 0; /* "/" under "/petstore/v1" */
    int rc;

    if (rt->pb->path_kind == SLUICE__V1__ROUTE__PATH_KIND__REGEX) {
        if (GROW(b->bregex, b->bregex_cap, b->n_bregex + 1) < 0)
            return -1;
        b->bregex[b->n_bregex++] = (bregex_t){
            .bucket = bucket,
            .nmatches = rt->n_headers + rt->n_query,
            .decl = route_decl(r, rt),
            .route = route,
            .base = rt->base,
            .pattern = path,
        };
        return 0;
    }

    rc = insert_segments(b, &node, &depth, rt->base, rt->base_len, false);
    if (rc < 0)
        return rc;

    if (rt->pb->path_kind == SLUICE__V1__ROUTE__PATH_KIND__PREFIX) {
        if (root_route)
            return add_entry(b, node, 2, route, "", 0, true);
        /* A prefix is plain text: complete segments go into the trie, the
         * text after the last '/' is compared with the start of the next
         * request segment. */
        const char *last = strrchr(path, '/');
        rc = insert_segments(b, &node, &depth, path, (size_t)(last - path), false);
        if (rc < 0)
            return rc;
        return add_entry(b, node, 2, route, last + 1, strlen(last + 1), false);
    }

    uint32_t kind = rt->pb->path_kind == SLUICE__V1__ROUTE__PATH_KIND__EXACT ? 0 : 1;
    if (root_route) {
        /* The Api's root answers both "/petstore/v1" and "/petstore/v1/". */
        uint32_t slash_node;
        if (add_entry(b, node, kind, route, NULL, 0, false) < 0)
            return -1;
        if (++depth > SL_ROUTER_MAX_DEPTH)
            return -2;
        if (literal_child(b, node, "", 0, &slash_node) < 0)
            return -1;
        return add_entry(b, slash_node, kind, route, NULL, 0, false);
    }
    rc = insert_segments(b, &node, &depth, path, len, kind == 1);
    if (rc < 0)
        return rc;
    return add_entry(b, node, kind, route, NULL, 0, false);
}

static int cmp_bentry(const void *pa, const void *pb)
{
    const bentry_t *a = pa, *b = pb;
    if (a->node != b->node)
        return a->node < b->node ? -1 : 1;
    if (a->kind != b->kind)
        return a->kind < b->kind ? -1 : 1;
    /* Prefix routes: longest first. */
    if (a->e.partial_len != b->e.partial_len)
        return a->e.partial_len > b->e.partial_len ? -1 : 1;
    if (a->nmatches != b->nmatches)
        return a->nmatches > b->nmatches ? -1 : 1;
    return a->decl < b->decl ? -1 : a->decl > b->decl;
}

static int cmp_bregex_group(const void *pa, const void *pb)
{
    const bregex_t *a = pa, *b = pb;
    int c;
    if (a->bucket != b->bucket)
        return a->bucket < b->bucket ? -1 : 1;
    if ((c = strcmp(a->base, b->base)) != 0)
        return c;
    if ((c = strcmp(a->pattern, b->pattern)) != 0)
        return c;
    return a->decl < b->decl ? -1 : a->decl > b->decl;
}

static int cmp_bregex_order(const void *pa, const void *pb)
{
    const bregex_t *a = pa, *b = pb;
    if (a->bucket != b->bucket)
        return a->bucket < b->bucket ? -1 : 1;
    if (a->group != b->group)
        return a->group < b->group ? -1 : 1;
    if (a->nmatches != b->nmatches)
        return a->nmatches > b->nmatches ? -1 : 1;
    return a->decl < b->decl ? -1 : a->decl > b->decl;
}

static int cmp_u32_desc(const void *pa, const void *pb)
{
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    return a > b ? -1 : a < b;
}

/* Compiles one header or query match. Header names are compared
 * case-insensitively, so they are stored lower-cased. */
static int compile_match(build_t *b, const Sluice__V1__HeaderMatch *hm, bool is_query,
                         const char *label, cmatch_t *out)
{
    const char *what = is_query ? "query parameter" : "header";
    if (!hm) {
        errf(b->err, b->errlen, "%s: empty %s match", label, what);
        return -1;
    }
    const char *name = str_or_empty(hm->name);
    const char *value = str_or_empty(hm->value);
    size_t name_len = strlen(name);
    if (name_len == 0) {
        errf(b->err, b->errlen, "%s: %s match without a name", label, what);
        return -1;
    }
    *out = (cmatch_t){
        .name = name,
        .name_len = name_len,
        .value = value,
        .value_len = strlen(value),
        .kind = (int)hm->kind,
        .invert = hm->invert != 0,
    };
    if (!is_query) {
        char *lc = b->strings_end;
        for (size_t i = 0; i < name_len; i++)
            lc[i] = (char)lower((unsigned char)name[i]);
        lc[name_len] = '\0';
        b->strings_end += name_len + 1;
        out->name = lc;
    }
    switch (hm->kind) {
    case SLUICE__V1__HEADER_MATCH__KIND__EXACT:
    case SLUICE__V1__HEADER_MATCH__KIND__PREFIX:
    case SLUICE__V1__HEADER_MATCH__KIND__PRESENT:
        return 0;
    case SLUICE__V1__HEADER_MATCH__KIND__REGEX: {
        char what_buf[300];
        snprintf(what_buf, sizeof what_buf, "%s \"%s\" ", what, name);
        out->re = regex_compile(value, label, what_buf, b->err, b->errlen);
        if (out->re && arena_code(b->arena, out->re) < 0) {
            out->re = NULL;
            errf(b->err, b->errlen, "%s: out of memory", label);
        }
        return out->re ? 0 : -1;
    }
    default:
        errf(b->err, b->errlen, "%s: %s \"%s\": unknown match kind %d", label, what, name,
             (int)hm->kind);
        return -1;
    }
}

/* Checks and compiles one route into r->routes[idx]. */
static int compile_route(build_t *b, const Sluice__V1__RouteTable *t, size_t ti, const char *base,
                         size_t base_len, size_t ri, uint32_t idx, uint32_t sid)
{
    sl_router_t *r = b->r;
    const Sluice__V1__Route *pb = t->routes[ri];
    char label[512];
    char msg[256];
    route_label(label, sizeof label, t, ti, pb, ri);
    if (!pb) {
        errf(b->err, b->errlen, "%s: empty route", label);
        return -1;
    }
    croute_t *rt = route_wr(r, idx);
    if (!rt) {
        errf(b->err, b->errlen, "%s: out of memory", label);
        return -1;
    }
    *rt = (croute_t){
        .pb = pb,
        .base = base,
        .base_len = base_len,
        .sid = sid,
        .route_index = (uint32_t)ri,
        .match_begin = r->n_matches,
        .any_method = pb->n_methods == 0,
    };
    for (size_t m = 0; m < pb->n_methods; m++) {
        const char *name = str_or_empty(pb->methods[m]);
        if (!is_token(name)) {
            errf(b->err, b->errlen, "%s: method \"%s\" is not a valid HTTP method name", label,
                 name);
            return -1;
        }
        unsigned bit = method_bit(name);
        rt->method_bits |= bit;
        if (bit == SL_METHOD_OTHER)
            rt->other_methods = true;
    }
    if (pb->n_methods && rt->method_bits == 0) {
        /* A 405's Allow set names only the nine methods: a route limited
         * to others would answer 405 with an empty Allow ("allows
         * nothing", fuzz finding). The model accepts only the nine, so
         * only a snapshot from elsewhere gets here; refuse it with why. */
        errf(b->err, b->errlen,
             "%s: methods name none of GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, TRACE, "
             "CONNECT",
             label);
        return -1;
    }

    const char *path = str_or_empty(pb->path);
    switch (pb->path_kind) {
    case SLUICE__V1__ROUTE__PATH_KIND__EXACT:
    case SLUICE__V1__ROUTE__PATH_KIND__PREFIX:
        if (path[0] != '/') {
            errf(b->err, b->errlen, "%s: path \"%s\" must start with '/'", label, path);
            return -1;
        }
        break;
    case SLUICE__V1__ROUTE__PATH_KIND__TEMPLATE:
        if (sl_pathtpl_check(path, msg, sizeof msg) < 0) {
            errf(b->err, b->errlen, "%s: path template \"%s\": %s", label, path, msg);
            return -1;
        }
        break;
    case SLUICE__V1__ROUTE__PATH_KIND__REGEX:
        rt->path_re = regex_compile(path, label, "", b->err, b->errlen);
        if (rt->path_re && arena_code(b->arena, rt->path_re) < 0) {
            rt->path_re = NULL;
            errf(b->err, b->errlen, "%s: out of memory", label);
        }
        if (!rt->path_re)
            return -1;
        break;
    default:
        errf(b->err, b->errlen, "%s: unknown path kind %d", label, (int)pb->path_kind);
        return -1;
    }

    for (size_t h = 0; h < pb->n_headers; h++) {
        cmatch_t *cm = match_wr(r, r->n_matches);
        if (!cm) {
            errf(b->err, b->errlen, "%s: out of memory", label);
            goto fail;
        }
        if (compile_match(b, pb->headers[h], false, label, cm) < 0)
            goto fail;
        r->n_matches++;
        rt->n_headers++;
    }
    for (size_t q = 0; q < pb->n_query; q++) {
        cmatch_t *cm = match_wr(r, r->n_matches);
        if (!cm) {
            errf(b->err, b->errlen, "%s: out of memory", label);
            goto fail;
        }
        if (compile_match(b, pb->query[q], true, label, cm) < 0)
            goto fail;
        r->n_matches++;
        rt->n_query++;
    }
    return 0;
fail:
    /* Its regexes are the arena's, freed with it (a refused build used to
     * leak the path regex of the route that failed: fuzz finding). */
    return -1;
}

/* Normalises one configured host into the string arena and returns its
 * bucket, creating it. "*" -> the star bucket; "*.example.com" -> wildcard
 * key ".example.com"; anything else -> exact key, lower-cased, one trailing
 * dot removed (an FQDN "example.com." names the same host). */
static int host_bucket(build_t *b, const Sluice__V1__RouteTable *t, size_t ti, const char *host,
                       uint32_t *out)
{
    sl_router_t *r = b->r;
    char label[300];
    size_t len = strlen(host);
    uint32_t kind = HOST_EXACT;
    const char *key = host;

    table_label(label, sizeof label, t, ti);
    if (len == 1 && host[0] == '*') {
        if (r->star_bucket != NONE) {
            *out = r->star_bucket;
            return 0;
        }
        kind = NONE;
    } else {
        if (len > 0 && host[len - 1] == '.')
            len--;
        if (len >= 2 && host[0] == '*' && host[1] == '.') {
            kind = HOST_WILDCARD;
            key = host + 1; /* keep the dot: ".example.com" */
            len--;
        }
        if (len == 0 || (kind == HOST_WILDCARD && len == 1)) {
            errf(b->err, b->errlen, "%s: host \"%s\": empty host name", label, host);
            return -1;
        }
        if (len > SL_ROUTER_MAX_HOST_LEN) {
            errf(b->err, b->errlen, "%s: host \"%.64s...\": longer than %d bytes", label, host,
                 SL_ROUTER_MAX_HOST_LEN);
            return -1;
        }
        for (size_t i = 0; i < len; i++) {
            unsigned char c = (unsigned char)key[i];
            if (c == '*') {
                errf(b->err, b->errlen,
                     "%s: host \"%s\": '*' is only allowed as \"*\" or a leading \"*.\"", label,
                     host);
                return -1;
            }
            if (c <= 0x20 || c == 0x7f || c == '/') {
                errf(b->err, b->errlen, "%s: host \"%s\": invalid character 0x%02x", label, host,
                     c);
                return -1;
            }
        }
        char *lc = b->strings_end;
        for (size_t i = 0; i < len; i++)
            lc[i] = (char)lower((unsigned char)key[i]);
        lc[len] = '\0';
        uint64_t h = hash_child(hash_bytes(r->seed, lc, len), kind);
        uint32_t found = map_find(&r->hosts, h, kind, lc, len);
        if (found != NONE) {
            *out = found;
            return 0;
        }
        b->strings_end += len + 1;
        key = lc;
    }

    if (r->n_buckets >= NONE - 1 || GROW(r->buckets, b->buckets_cap, (size_t)r->n_buckets + 1) < 0)
        goto fail_oom;
    uint32_t bi = r->n_buckets;
    bucket_t *bk = &r->buckets[bi];
    *bk = (bucket_t){.last_table = NONE};
    if (new_node(b, &r->buckets[bi].root) < 0)
        goto fail_oom;
    r->n_buckets++;
    if (kind == NONE) {
        r->star_bucket = bi;
    } else {
        if (map_insert(&r->hosts, hash_child(hash_bytes(r->seed, key, len), kind), kind, key, len,
                       bi) < 0)
            goto fail_oom;
        if (kind == HOST_WILDCARD) {
            bool seen = false;
            for (uint32_t i = 0; i < r->n_wildcard_lens; i++)
                seen |= r->wildcard_lens[i] == len;
            if (!seen)
                r->wildcard_lens[r->n_wildcard_lens++] = (uint32_t)len;
        }
    }
    *out = bi;
    return 0;

fail_oom:
    errf(b->err, b->errlen, "%s: out of memory", label);
    return -1;
}

static int check_base_path(build_t *b, const Sluice__V1__RouteTable *t, size_t ti, const char *base)
{
    char label[300];
    table_label(label, sizeof label, t, ti);
    size_t len = strlen(base);
    if (len == 0 || (len == 1 && base[0] == '/'))
        return 0;
    if (base[0] != '/') {
        errf(b->err, b->errlen, "%s: base path \"%s\" must start with '/'", label, base);
        return -1;
    }
    if (base[len - 1] == '/') {
        errf(b->err, b->errlen, "%s: base path \"%s\" must not end with '/'", label, base);
        return -1;
    }
    if (strstr(base, "//")) {
        errf(b->err, b->errlen, "%s: base path \"%s\" has an empty segment '//'", label, base);
        return -1;
    }
    if (strpbrk(base, "?#")) {
        errf(b->err, b->errlen, "%s: base path \"%s\" must not contain '?' or '#'", label, base);
        return -1;
    }
    return 0;
}

/* The nodes holding each table's entries, for the tables whose routes the
 * build or patch put into the trie (b->bentries, sorted by node): what a
 * patch that removes the table visits. The lists live in b's arena. */
static int table_node_lists(build_t *b)
{
    sl_router_t *r = b->r;
    uint32_t nt = r->n_tables;
    uint32_t *last = malloc((nt ? nt : 1) * sizeof *last);
    size_t *at = calloc(nt ? nt : 1, sizeof *at);
    if (!last || !at) {
        free(last);
        free(at);
        return -1;
    }
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        uint32_t *blob = NULL;
        if (pass == 1) {
            if (!(blob = arena_alloc(b->arena, (total ? total : 1) * sizeof *blob))) {
                free(last);
                free(at);
                return -1;
            }
            size_t off = 0;
            for (uint32_t t = 0; t < nt; t++) {
                if (!at[t])
                    continue;
                r->tables[t].nodes = blob + off;
                off += at[t];
                at[t] = 0;
            }
        }
        for (uint32_t t = 0; t < nt; t++)
            last[t] = NONE;
        for (size_t i = 0; i < b->n_bentries; i++) {
            const bentry_t *be = &b->bentries[i];
            uint32_t t = r->tpos[route_at(r, be->e.route)->sid].index;
            if (last[t] == be->node)
                continue;
            last[t] = be->node;
            if (pass == 0) {
                at[t]++;
                total++;
            } else {
                ((uint32_t *)r->tables[t].nodes)[at[t]++] = be->node;
                r->tables[t].n_nodes = (uint32_t)at[t];
            }
        }
    }
    free(last);
    free(at);
    return 0;
}

/*
 * Ownership: the returned router is the caller's (sl_router_free); it points
 * into `snap` (paths, names, values), which must outlive it. On failure
 * everything built so far is freed here and NULL is returned with err set.
 */
sl_router_t *sl_router_build(const Sluice__V1__Snapshot *snap, char *err, size_t errlen)
{
    build_t b = {.snap = snap, .err = err, .errlen = errlen};
    sl_router_t *r;
    size_t n_routes = 0, n_matches = 0, strings_len = 1, n_hosts = 0;

    errf(err, errlen, "%s", "");
    r = calloc(1, sizeof *r);
    if (!r)
        goto fail_oom;
    b.r = r;
    r->star_bucket = NONE;
    if (getrandom(&r->seed, sizeof r->seed, GRND_NONBLOCK) != (ssize_t)sizeof r->seed)
        r->seed = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)r;
    r->mctx = pcre2_match_context_create(NULL);
    r->arenas = calloc(1, sizeof *r->arenas);
    if (!r->mctx || !r->arenas || !(r->arenas[0] = arena_new()))
        goto fail_oom;
    r->n_arenas = 1;
    b.arena = r->arenas[0];
    pcre2_set_match_limit(r->mctx, SL_ROUTER_REGEX_MATCH_LIMIT);

    size_t n_tables = snap ? snap->n_route_tables : 0;
    if (n_tables >= NONE) {
        errf(err, errlen, "snapshot: too many route tables (%zu)", n_tables);
        goto fail;
    }
    /* First pass: sizes, so that routes, matches and strings are single
     * allocations and pointers into them stay valid while building. */
    for (size_t ti = 0; ti < n_tables; ti++) {
        const Sluice__V1__RouteTable *t = snap->route_tables[ti];
        char label[300];
        if (!t) {
            errf(err, errlen, "route table #%zu: empty", ti);
            goto fail;
        }
        if (t->n_routes > 0 && !t->routes) {
            table_label(label, sizeof label, t, ti);
            errf(err, errlen, "%s: routes missing", label);
            goto fail;
        }
        n_routes += t->n_routes;
        n_hosts += t->n_hosts ? t->n_hosts : 1;
        for (size_t h = 0; h < t->n_hosts; h++)
            strings_len += strlen(str_or_empty(t->hosts[h])) + 1;
        for (size_t ri = 0; ri < t->n_routes; ri++) {
            const Sluice__V1__Route *rt = t->routes[ri];
            if (!rt)
                continue; /* reported by compile_route */
            n_matches += rt->n_headers + rt->n_query;
            for (size_t h = 0; h < rt->n_headers; h++)
                if (rt->headers[h])
                    strings_len += strlen(str_or_empty(rt->headers[h]->name)) + 1;
        }
    }
    if (n_routes >= NONE || n_matches >= NONE || n_hosts >= NONE) {
        errf(err, errlen, "snapshot: too many routes (%zu)", n_routes);
        goto fail;
    }
    b.arena->strings = malloc(strings_len);
    r->wildcard_lens = calloc(n_hosts ? n_hosts : 1, sizeof *r->wildcard_lens);
    r->tables = calloc(n_tables ? n_tables : 1, sizeof *r->tables);
    r->tpos = calloc(n_tables ? n_tables : 1, sizeof *r->tpos);
    if (cv_reserve(&r->routes, n_routes, ROUTE_S, sizeof(croute_t)) < 0 ||
        cv_reserve(&r->matches, n_matches, MATCH_S, sizeof(cmatch_t)) < 0 ||
        !b.arena->strings || !r->wildcard_lens || !r->tables || !r->tpos)
        goto fail_oom;
    r->n_sids = (uint32_t)n_tables;
    b.strings_end = b.arena->strings;

    /* Second pass: compile every route, in declaration order. */
    for (size_t ti = 0; ti < n_tables; ti++) {
        const Sluice__V1__RouteTable *t = snap->route_tables[ti];
        const char *base = str_or_empty(t->base_path);
        if (check_base_path(&b, t, ti, base) < 0)
            goto fail;
        size_t base_len = strlen(base);
        if (base_len == 1) { /* "/" contributes nothing to the full path */
            base = "";
            base_len = 0;
        }
        r->tables[ti] = (rtable_t){.pb = t, .first_route = r->n_routes,
                                   .n_routes = (uint32_t)t->n_routes, .sid = (uint32_t)ti};
        r->tpos[ti] = (tpos_t){.index = (uint32_t)ti, .decl_base = r->n_routes};
        for (size_t ri = 0; ri < t->n_routes; ri++) {
            if (compile_route(&b, t, ti, base, base_len, ri, r->n_routes, (uint32_t)ti) < 0)
                goto fail;
            r->tables[ti].has_regex |= route_at(r, r->n_routes)->path_re != NULL;
            r->n_routes++;
        }
        r->n_tables = (uint32_t)ti + 1;
    }

    /* Hosts -> buckets, remembering which tables each bucket serves. */
    uint32_t decl_base = 0;
    for (size_t ti = 0; ti < n_tables; ti++) {
        const Sluice__V1__RouteTable *t = snap->route_tables[ti];
        size_t nh = t->n_hosts ? t->n_hosts : 1;
        for (size_t h = 0; h < nh; h++) {
            const char *host = t->n_hosts ? str_or_empty(t->hosts[h]) : "*";
            uint32_t bi;
            if (host_bucket(&b, t, ti, host, &bi) < 0)
                goto fail;
            if (r->buckets[bi].last_table == ti)
                continue; /* same table named twice for one bucket */
            r->buckets[bi].last_table = (uint32_t)ti;
            if (GROW(b.pairs, b.pairs_cap, b.n_pairs + 3) < 0)
                goto fail_oom;
            b.pairs[b.n_pairs++] = bi;
            b.pairs[b.n_pairs++] = (uint32_t)ti;
            b.pairs[b.n_pairs++] = decl_base;
        }
        decl_base += (uint32_t)t->n_routes;
    }
    if (r->n_wildcard_lens > 1) /* qsort's array must not be NULL, even when empty */
        qsort(r->wildcard_lens, r->n_wildcard_lens, sizeof *r->wildcard_lens, cmp_u32_desc);

    /* Every route of a table goes into the trie of each of its buckets. */
    for (size_t p = 0; p < b.n_pairs; p += 3) {
        uint32_t bi = b.pairs[p];
        const Sluice__V1__RouteTable *t = snap->route_tables[b.pairs[p + 1]];
        for (size_t ri = 0; ri < t->n_routes; ri++) {
            uint32_t route = b.pairs[p + 2] + (uint32_t)ri;
            int rc = insert_route(&b, bi, route);
            if (rc == -2) {
                char label[512];
                route_label(label, sizeof label, t, b.pairs[p + 1], t->routes[ri], ri);
                errf(err, errlen, "%s: path has more than %d segments (base path included)", label,
                     SL_ROUTER_MAX_DEPTH);
                goto fail;
            }
            if (rc < 0)
                goto fail_oom;
        }
    }

    /* Freeze the node entries: sorted by node, then kind, then precedence. */
    if (b.n_bentries > 1)
        qsort(b.bentries, b.n_bentries, sizeof *b.bentries, cmp_bentry);
    if (cv_reserve(&r->entries, b.n_bentries, ENTRY_S, sizeof(entry_t)) < 0)
        goto fail_oom;
    for (size_t i = 0; i < b.n_bentries; i++) {
        const bentry_t *be = &b.bentries[i];
        node_t *n = node_wr(r, be->node); /* the build's own chunks: never NULL */
        if (n->n_exact + n->n_template + n->n_prefix == 0)
            n->entry_begin = (uint32_t)i;
        if (be->kind == 0)
            n->n_exact++;
        else if (be->kind == 1)
            n->n_template++;
        else
            n->n_prefix++;
        *entry_wr(r, (uint32_t)i) = be->e;
    }
    r->n_entries = (uint32_t)b.n_bentries;
    r->n_entries_live = r->n_entries;
    if (table_node_lists(&b) < 0)
        goto fail_oom;

    /* Regex routes per bucket: declaration order, except that routes with
     * the same base path and pattern are grouped at the first one's place
     * and ordered by number of header/query matches (router.h "same path"). */
    if (b.n_bregex > 1)
        qsort(b.bregex, b.n_bregex, sizeof *b.bregex, cmp_bregex_group);
    for (size_t i = 0; i < b.n_bregex; i++) {
        bregex_t *x = &b.bregex[i];
        bool same = i > 0 && x->bucket == x[-1].bucket && strcmp(x->base, x[-1].base) == 0 &&
                    strcmp(x->pattern, x[-1].pattern) == 0;
        x->group = same ? x[-1].group : x->decl;
    }
    if (b.n_bregex > 1)
        qsort(b.bregex, b.n_bregex, sizeof *b.bregex, cmp_bregex_order);
    r->regex_routes = malloc((b.n_bregex ? b.n_bregex : 1) * sizeof *r->regex_routes);
    if (!r->regex_routes)
        goto fail_oom;
    for (size_t i = 0; i < b.n_bregex; i++) {
        bucket_t *bk = &r->buckets[b.bregex[i].bucket];
        if (bk->n_regex == 0)
            bk->regex_begin = (uint32_t)i;
        bk->n_regex++;
        r->regex_routes[i] = b.bregex[i].route;
    }
    r->n_regex_routes = (uint32_t)b.n_bregex;

    free(b.bentries);
    free(b.bregex);
    free(b.pairs);
    return r;

fail_oom:
    errf(err, errlen, "router: out of memory");
fail:
    free(b.bentries);
    free(b.bregex);
    free(b.pairs);
    sl_router_free(r);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Update: the router of a new snapshot from the previous one               */

/* The bucket a build would put `host` in, when the router has it already;
 * NONE otherwise (a new host, or one a build refuses: the caller builds
 * whole, which says why). */
static uint32_t existing_bucket(const sl_router_t *r, const char *host)
{
    size_t len = strlen(host);
    if (len == 1 && host[0] == '*')
        return r->star_bucket;
    uint32_t kind = HOST_EXACT;
    const char *key = host;
    if (len > 0 && host[len - 1] == '.')
        len--;
    if (len >= 2 && host[0] == '*' && host[1] == '.') {
        kind = HOST_WILDCARD;
        key = host + 1;
        len--;
    }
    if (len == 0 || len > SL_ROUTER_MAX_HOST_LEN)
        return NONE;
    char lc[SL_ROUTER_MAX_HOST_LEN + 1];
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)key[i];
        if (c == '*' || c <= 0x20 || c == 0x7f || c == '/')
            return NONE;
        lc[i] = (char)lower(c);
    }
    return map_find(&r->hosts, hash_child(hash_bytes(r->seed, lc, len), kind), kind, lc, len);
}

static bool table_has_regex(const Sluice__V1__RouteTable *t)
{
    for (size_t ri = 0; ri < t->n_routes; ri++)
        if (t->routes[ri] && t->routes[ri]->path_kind == SLUICE__V1__ROUTE__PATH_KIND__REGEX)
            return true;
    return false;
}

static void *dup_array(const void *src, size_t n, size_t extra, size_t elem)
{
    size_t total = n + extra ? n + extra : 1;
    void *p = malloc(total * elem);
    if (p && n)
        memcpy(p, src, n * elem);
    return p;
}

/* A trie node's entries without those of removed tables (their stable id
 * points nowhere), in place; nothing is written when it holds none. */
static bool entry_dead(const sl_router_t *r, const entry_t *e)
{
    return r->tpos[route_at(r, e->route)->sid].index == NONE;
}

static int drop_dead_entries(sl_router_t *r, uint32_t node)
{
    const node_t *nd = node_at(r, node);
    uint32_t counts[3] = {nd->n_exact, nd->n_template, nd->n_prefix};
    uint32_t begin = nd->entry_begin, total = counts[0] + counts[1] + counts[2];
    uint32_t i = 0;
    while (i < total && !entry_dead(r, entry_at(r, begin + i)))
        i++;
    if (i == total)
        return 0;
    node_t *wn = node_wr(r, node);
    if (!wn)
        return -1;
    uint32_t w = begin, kept_k[3] = {0, 0, 0};
    i = begin;
    for (int k = 0; k < 3; k++)
        for (uint32_t c = 0; c < counts[k]; c++, i++) {
            entry_t e = *entry_at(r, i);
            if (entry_dead(r, &e))
                continue;
            entry_t *we = entry_wr(r, w++);
            if (!we)
                return -1;
            *we = e;
            kept_k[k]++;
        }
    wn->n_exact = kept_k[0];
    wn->n_template = kept_k[1];
    wn->n_prefix = kept_k[2];
    r->n_entries_live -= total - (kept_k[0] + kept_k[1] + kept_k[2]);
    return 0;
}

/* Patches are bounded: past these the router is built whole again, which
 * drops the nodes, entries and routes that removed tables left behind (the
 * routes and entries are also bounded on their own, below). */
#define SL_ROUTER_MAX_PATCHES 1024

sl_router_t *sl_router_update(const sl_router_t *prev, const Sluice__V1__Snapshot *snap,
                              char *err, size_t errlen)
{
    if (!prev || !snap)
        return sl_router_build(snap, err, errlen);
    errf(err, errlen, "%s", "");
    size_t nt = snap->n_route_tables;
    if (nt >= NONE || prev->patches >= SL_ROUTER_MAX_PATCHES ||
        prev->n_entries > 2 * (size_t)prev->n_entries_live + 4096)
        return sl_router_build(snap, err, errlen);

    /* Which tables are prev's (the same message), in prev's order. */
    uint32_t *from = malloc((nt ? nt : 1) * sizeof *from);
    uint8_t *kept = calloc(prev->n_tables ? prev->n_tables : 1, 1);
    uint32_t *tbuckets = NULL; /* new tables' buckets, per table: count then list */
    size_t n_tb = 0, tb_cap = 0;
    sl_router_t *r = NULL;
    build_t b = {.snap = snap, .err = err, .errlen = errlen};
    if (!from || !kept)
        goto whole;
    size_t live = 0, n_new = 0, n_new_matches = 0, strings_len = 1, dead = 0, misses = 0;
    uint32_t cursor = 0;
    bool ordered = true;
    for (size_t t = 0; t < nt; t++) {
        const Sluice__V1__RouteTable *pb = snap->route_tables[t];
        if (!pb || (pb->n_routes > 0 && !pb->routes))
            goto whole; /* the build reports it */
        /* Usually the next one; a table that is not prev's costs a scan of
         * prev's, so many of them (another snapshot altogether) stop the
         * search: then a whole build is as cheap. */
        uint32_t j = NONE;
        if (cursor < prev->n_tables && prev->tables[cursor].pb == pb)
            j = cursor;
        else if (++misses > 64)
            goto whole;
        for (uint32_t k = 0; k < prev->n_tables && j == NONE; k++)
            if (prev->tables[k].pb == pb)
                j = k;
        if (j != NONE && kept[j])
            j = NONE;
        from[t] = j;
        if (j != NONE) {
            ordered &= j >= cursor;
            cursor = j + 1;
            kept[j] = 1;
            live += pb->n_routes;
            continue;
        }
        /* A new or changed table: its hosts must be buckets already and it
         * must have no regex routes (per-bucket lists, built whole). */
        if (table_has_regex(pb))
            goto whole;
        size_t nh = pb->n_hosts ? pb->n_hosts : 1;
        if (GROW(tbuckets, tb_cap, n_tb + nh + 1) < 0)
            goto whole;
        size_t count_at = n_tb++;
        tbuckets[count_at] = 0;
        for (size_t h = 0; h < nh; h++) {
            uint32_t bi = existing_bucket(prev, pb->n_hosts ? str_or_empty(pb->hosts[h]) : "*");
            if (bi == NONE)
                goto whole;
            bool dup = false;
            for (size_t k = count_at + 1; k < n_tb; k++)
                dup |= tbuckets[k] == bi;
            if (!dup) {
                tbuckets[n_tb++] = bi;
                tbuckets[count_at]++;
            }
        }
        n_new += pb->n_routes;
        for (size_t ri = 0; ri < pb->n_routes; ri++) {
            const Sluice__V1__Route *rt = pb->routes[ri];
            if (!rt)
                continue;
            n_new_matches += rt->n_headers + rt->n_query;
            for (size_t h = 0; h < rt->n_headers; h++)
                if (rt->headers[h])
                    strings_len += strlen(str_or_empty(rt->headers[h]->name)) + 1;
        }
    }
    for (uint32_t k = 0; k < prev->n_tables; k++) {
        if (kept[k])
            continue;
        if (prev->tables[k].has_regex)
            goto whole;
        dead += prev->tables[k].n_routes;
    }
    /* Kept tables in another order would change the declaration order
     * between them; garbage bounded to a quarter of what is live. */
    if (!ordered || (size_t)prev->n_routes + n_new >= NONE ||
        (size_t)prev->n_matches + n_new_matches >= NONE ||
        prev->n_dead + dead > (live + n_new) / 4 + 256)
        goto whole;

    /* A copy of prev: its chunks and arenas referenced, small arrays copied. */
    size_t n_new_tables = 0;
    for (size_t t = 0; t < nt; t++)
        n_new_tables += from[t] == NONE;
    if ((size_t)prev->n_sids + n_new_tables > 2 * nt + 4096)
        goto whole; /* stable ids of removed tables, bounded */
    r = calloc(1, sizeof *r);
    if (!r)
        goto oom;
    b.r = r;
    r->seed = prev->seed;
    r->star_bucket = prev->star_bucket;
    r->mctx = pcre2_match_context_create(NULL);
    r->arenas = malloc((prev->n_arenas + 1) * sizeof *r->arenas);
    if (!r->mctx || !r->arenas)
        goto oom;
    pcre2_set_match_limit(r->mctx, SL_ROUTER_REGEX_MATCH_LIMIT);
    for (uint32_t i = 0; i < prev->n_arenas; i++) {
        r->arenas[i] = prev->arenas[i];
        atomic_fetch_add_explicit(&r->arenas[i]->refs, 1, memory_order_relaxed);
    }
    r->n_arenas = prev->n_arenas;
    if (!(b.arena = arena_new()))
        goto oom;
    r->arenas[r->n_arenas++] = b.arena;
    if (!(b.arena->strings = malloc(strings_len)))
        goto oom;
    b.strings_end = b.arena->strings;
    r->children.mask = prev->children.mask;
    r->children.count = prev->children.count;
    r->hosts.mask = prev->hosts.mask;
    r->hosts.count = prev->hosts.count;
    if (cv_share(&r->routes, &prev->routes) < 0 || cv_share(&r->matches, &prev->matches) < 0 ||
        cv_share(&r->nodes, &prev->nodes) < 0 || cv_share(&r->entries, &prev->entries) < 0 ||
        cv_share(&r->children.slots, &prev->children.slots) < 0 ||
        cv_share(&r->hosts.slots, &prev->hosts.slots) < 0 ||
        cv_reserve(&r->routes, (size_t)prev->n_routes + n_new, ROUTE_S, sizeof(croute_t)) < 0 ||
        cv_reserve(&r->matches, (size_t)prev->n_matches + n_new_matches, MATCH_S,
                   sizeof(cmatch_t)) < 0)
        goto oom;
    r->regex_routes =
        dup_array(prev->regex_routes, prev->n_regex_routes, 0, sizeof *r->regex_routes);
    b.buckets_cap = prev->n_buckets;
    r->buckets = dup_array(prev->buckets, prev->n_buckets, 0, sizeof *r->buckets);
    r->wildcard_lens =
        dup_array(prev->wildcard_lens, prev->n_wildcard_lens, 0, sizeof *r->wildcard_lens);
    r->tables = calloc(nt ? nt : 1, sizeof *r->tables);
    r->tpos = dup_array(prev->tpos, prev->n_sids, n_new_tables, sizeof *r->tpos);
    if (!r->regex_routes || !r->buckets || !r->wildcard_lens || !r->tables || !r->tpos)
        goto oom;
    r->n_sids = prev->n_sids;
    r->n_routes = prev->n_routes;
    r->n_matches = prev->n_matches;
    r->n_nodes = prev->n_nodes;
    r->n_entries = prev->n_entries;
    r->n_entries_live = prev->n_entries_live;
    r->n_regex_routes = prev->n_regex_routes;
    r->n_buckets = prev->n_buckets;
    r->n_wildcard_lens = prev->n_wildcard_lens;

    /* The new snapshot's order: each table's index and declaration order,
     * by stable id. Kept tables keep their routes and ids; the ids of
     * removed tables point nowhere, which is how their routes read as dead. */
    for (uint32_t k = 0; k < prev->n_tables; k++)
        if (!kept[k])
            r->tpos[prev->tables[k].sid].index = NONE;
    uint32_t decl = 0, next = r->n_routes;
    for (size_t t = 0; t < nt; t++) {
        const Sluice__V1__RouteTable *pb = snap->route_tables[t];
        if (from[t] != NONE) {
            r->tables[t] = prev->tables[from[t]];
        } else {
            r->tables[t] = (rtable_t){.pb = pb, .first_route = next,
                                      .n_routes = (uint32_t)pb->n_routes, .sid = r->n_sids++};
            next += (uint32_t)pb->n_routes;
        }
        r->tpos[r->tables[t].sid] = (tpos_t){.index = (uint32_t)t, .decl_base = decl};
        decl += (uint32_t)pb->n_routes;
    }
    r->n_tables = (uint32_t)nt;

    /* Routes of the removed tables leave the nodes that hold them. */
    for (uint32_t k = 0; dead && k < prev->n_tables; k++)
        for (uint32_t i = 0; !kept[k] && i < prev->tables[k].n_nodes; i++)
            if (drop_dead_entries(r, prev->tables[k].nodes[i]) < 0)
                goto oom;

    /* Compile the new tables' routes and put them into their buckets. */
    size_t tb_at = 0;
    for (size_t t = 0; t < nt; t++) {
        const Sluice__V1__RouteTable *pb = snap->route_tables[t];
        if (from[t] != NONE)
            continue;
        const char *base = str_or_empty(pb->base_path);
        if (check_base_path(&b, pb, t, base) < 0)
            goto fail;
        size_t base_len = strlen(base);
        if (base_len == 1) {
            base = "";
            base_len = 0;
        }
        uint32_t first = r->n_routes;
        for (size_t ri = 0; ri < pb->n_routes; ri++) {
            if (compile_route(&b, pb, t, base, base_len, ri, r->n_routes, r->tables[t].sid) < 0)
                goto fail;
            r->n_routes++;
        }
        uint32_t nb = tbuckets[tb_at];
        for (uint32_t k = 0; k < nb; k++) {
            uint32_t bi = tbuckets[tb_at + 1 + k];
            for (size_t ri = 0; ri < pb->n_routes; ri++) {
                int rc = insert_route(&b, bi, first + (uint32_t)ri);
                if (rc == -2) {
                    char label[512];
                    route_label(label, sizeof label, pb, t, pb->routes[ri], ri);
                    errf(err, errlen, "%s: path has more than %d segments (base path included)",
                         label, SL_ROUTER_MAX_DEPTH);
                    goto fail;
                }
                if (rc < 0)
                    goto oom;
            }
        }
        tb_at += 1 + nb;
    }

    /* Each node that got entries: its old and new entries in precedence
     * order, written after the others (the old range is left unused). */
    if (b.n_bentries > 1)
        qsort(b.bentries, b.n_bentries, sizeof *b.bentries, cmp_bentry);
    bentry_t *merged = NULL;
    size_t merged_cap = 0;
    for (size_t i = 0; i < b.n_bentries;) {
        uint32_t node = b.bentries[i].node;
        size_t j = i;
        while (j < b.n_bentries && b.bentries[j].node == node)
            j++;
        const node_t *nd = node_at(r, node);
        uint32_t counts[3] = {nd->n_exact, nd->n_template, nd->n_prefix};
        size_t old = (size_t)counts[0] + counts[1] + counts[2];
        size_t n = old + (j - i);
        if (GROW(merged, merged_cap, n) < 0 ||
            cv_reserve(&r->entries, (size_t)r->n_entries + n, ENTRY_S, sizeof(entry_t)) < 0 ||
            (size_t)r->n_entries + n >= NONE) {
            free(merged);
            goto oom;
        }
        size_t m = 0;
        uint32_t e = nd->entry_begin;
        for (uint32_t k = 0; k < 3; k++)
            for (uint32_t c = 0; c < counts[k]; c++, e++) {
                const entry_t *en = entry_at(r, e);
                const croute_t *rt = route_at(r, en->route);
                merged[m++] = (bentry_t){.node = node, .kind = k,
                                         .nmatches = rt->n_headers + rt->n_query,
                                         .decl = route_decl(r, rt), .e = *en};
            }
        memcpy(merged + m, b.bentries + i, (j - i) * sizeof *merged);
        qsort(merged, n, sizeof *merged, cmp_bentry);
        node_t *wn = node_wr(r, node);
        if (!wn) {
            free(merged);
            goto oom;
        }
        wn->entry_begin = r->n_entries;
        wn->n_exact = wn->n_template = wn->n_prefix = 0;
        for (size_t k = 0; k < n; k++) {
            entry_t *we = entry_wr(r, r->n_entries);
            if (!we) {
                free(merged);
                goto oom;
            }
            if (merged[k].kind == 0)
                wn->n_exact++;
            else if (merged[k].kind == 1)
                wn->n_template++;
            else
                wn->n_prefix++;
            *we = merged[k].e;
            r->n_entries++;
        }
        i = j;
    }
    free(merged);
    if (table_node_lists(&b) < 0)
        goto oom;
    r->n_entries_live += (uint32_t)b.n_bentries;
    r->n_dead = prev->n_dead + (uint32_t)dead;
    r->patches = prev->patches + 1;
    free(b.bentries);
    free(b.bregex);
    free(from);
    free(kept);
    free(tbuckets);
    return r;

oom:
    errf(err, errlen, "router: out of memory");
fail:
    free(b.bentries);
    free(b.bregex);
    free(from);
    free(kept);
    free(tbuckets);
    sl_router_free(r);
    return NULL;
whole:
    free(from);
    free(kept);
    free(tbuckets);
    return sl_router_build(snap, err, errlen);
}

uint32_t sl_router_patches(const sl_router_t *r)
{
    return r ? r->patches : 0;
}

void sl_router_free(sl_router_t *r)
{
    if (!r)
        return;
    for (uint32_t i = 0; i < r->n_arenas; i++)
        arena_unref(r->arenas[i]);
    free(r->arenas);
    free(r->tables);
    free(r->tpos);
    pcre2_match_context_free(r->mctx);
    cv_free(&r->routes);
    cv_free(&r->matches);
    cv_free(&r->nodes);
    cv_free(&r->entries);
    free(r->regex_routes);
    free(r->buckets);
    free(r->wildcard_lens);
    cv_free(&r->children.slots);
    cv_free(&r->hosts.slots);
    free(r);
}

/* ------------------------------------------------------------------------ */
/* Match                                                                    */

/* The request path split once per lookup: segment d is the bytes between
 * seg_off[d] (a '/') and seg_off[d + 1]. A segment's hash does not depend on
 * where in the trie it is looked up, so it is computed once, for every
 * bucket and every backtracking step. Only SL_ROUTER_MAX_DEPTH + 1 segments
 * are recorded: no trie is deeper, so further segments can never match a
 * literal or a parameter, only make a path too long for them. */
#define MAX_SEGS (SL_ROUTER_MAX_DEPTH + 1)

typedef struct {
    const sl_router_t *r;
    const sl_router_request_t *req;
    sl_router_result_t *res;
    const char *path;
    size_t path_len;
    uint32_t n_segs;
    size_t seg_off[MAX_SEGS + 1];
    uint64_t seg_hash[MAX_SEGS];
    /* Literal walk of the current bucket: walk_node[d] is the node at depth
     * d reached through literal children only, for d <= walk_depth. */
    uint32_t walk_node[SL_ROUTER_MAX_DEPTH + 1];
    uint32_t walk_depth;
    unsigned allow;
    bool method_mismatch;
    bool error; /* no PCRE2 match data for this thread: out of memory */
} mctx_t;

/* Whole-subject regex test. A match error (match limit reached, JIT stack
 * exhausted) counts as "no match": a pathological pattern costs a bounded
 * amount of time and never routes a request it was not proven to match. */
static bool regex_match(mctx_t *c, const pcre2_code *re, const char *s, size_t n)
{
    pcre2_match_data *md = sl_router_match_data();
    if (sl_unlikely(!md)) {
        c->error = true;
        return false;
    }
    int rc = pcre2_jit_match(re, (PCRE2_SPTR)(s ? s : ""), n, 0, 0, md, c->r->mctx);
    return rc >= 0;
}

static bool value_matches(mctx_t *c, const cmatch_t *m, const char *v, size_t n)
{
    switch (m->kind) {
    case SLUICE__V1__HEADER_MATCH__KIND__EXACT:
        return n == m->value_len && memcmp(v, m->value, n) == 0;
    case SLUICE__V1__HEADER_MATCH__KIND__PREFIX:
        return n >= m->value_len && memcmp(v, m->value, m->value_len) == 0;
    case SLUICE__V1__HEADER_MATCH__KIND__REGEX:
        return regex_match(c, m->re, v, n);
    default: /* PRESENT */
        return true;
    }
}

/* A header match holds when some header of that name (case-insensitive)
 * has a matching value; `invert` negates the result, so an inverted match
 * holds when the header is absent. */
static bool header_match(mctx_t *c, const cmatch_t *m)
{
    const sl_router_request_t *req = c->req;
    bool found = false;
    for (size_t i = 0; i < req->num_headers && !found; i++) {
        const sl_http1_header_t *h = &req->headers[i];
        if (h->name.len == m->name_len && eq_nocase(h->name.ptr, m->name, m->name_len))
            found = value_matches(c, m, h->value.ptr, h->value.len);
    }
    return found != m->invert;
}

/* Query parameters: '&'-separated, name before the first '=', value after
 * it ("" when there is no '='); names and values compared raw. */
static bool query_match(mctx_t *c, const cmatch_t *m)
{
    const char *q = c->req->query.ptr;
    size_t len = q ? c->req->query.len : 0;
    bool found = false;
    size_t off = 0;
    while (off < len && !found) {
        const char *p = q + off;
        const char *amp = memchr(p, '&', len - off);
        size_t plen = amp ? (size_t)(amp - p) : len - off;
        off += plen + 1;
        const char *eq = memchr(p, '=', plen);
        size_t nlen = eq ? (size_t)(eq - p) : plen;
        if (nlen != m->name_len || memcmp(p, m->name, nlen) != 0)
            continue;
        const char *v = eq ? eq + 1 : p + plen;
        size_t vlen = eq ? plen - nlen - 1 : 0;
        found = value_matches(c, m, v, vlen);
    }
    return found != m->invert;
}

static bool method_matches(const croute_t *rt, const sl_router_request_t *req)
{
    if (rt->any_method)
        return true;
    if (req->method_bit != SL_METHOD_OTHER)
        return (rt->method_bits & req->method_bit) != 0;
    if (!rt->other_methods || !req->method.ptr)
        return false;
    for (size_t i = 0; i < rt->pb->n_methods; i++) {
        const char *m = str_or_empty(rt->pb->methods[i]);
        if (strlen(m) == req->method.len && memcmp(m, req->method.ptr, req->method.len) == 0)
            return true;
    }
    return false;
}

/* The path of this route matched. Returns true when the search must stop:
 * the route matched (res filled) or an error occurred. A route that would
 * match with another method adds its methods to the 405 Allow set. */
static bool try_route(mctx_t *c, uint32_t idx)
{
    const sl_router_t *r = c->r;
    const croute_t *rt = route_at(r, idx);
    bool method_ok = method_matches(rt, c->req);

    for (uint32_t i = 0; i < rt->n_headers; i++)
        if (!header_match(c, match_at(r, rt->match_begin + i)))
            return c->error;
    for (uint32_t i = 0; i < rt->n_query; i++)
        if (!query_match(c, match_at(r, rt->match_begin + rt->n_headers + i)))
            return c->error;
    if (c->error)
        return true;
    if (!method_ok) {
        c->allow |= rt->method_bits;
        c->method_mismatch = true;
        return false;
    }
    c->res->table_index = r->tpos[rt->sid].index;
    c->res->route_index = rt->route_index;
    c->res->base_path_len = rt->base_len;
    c->res->allow_methods = 0;
    return true;
}

static inline size_t seg_len(const mctx_t *c, uint32_t d)
{
    return c->seg_off[d + 1] - c->seg_off[d] - 1;
}

static inline const char *seg_ptr(const mctx_t *c, uint32_t d)
{
    return c->path + c->seg_off[d] + 1;
}

/* True when the path ends right after segment d - 1 (the node at depth d
 * consumed it all). */
static inline bool path_ends_at(const mctx_t *c, uint32_t d)
{
    return d == c->n_segs && c->seg_off[d] == c->path_len;
}

static void split_path(mctx_t *c)
{
    const char *p = c->path;
    size_t len = c->path_len, off = 0;
    uint32_t n = 0;
    while (off < len && n < MAX_SEGS) {
        const char *seg = p + off + 1;
        const char *slash = memchr(seg, '/', len - off - 1);
        size_t l = slash ? (size_t)(slash - seg) : len - off - 1;
        c->seg_off[n] = off;
        c->seg_hash[n] = hash_bytes(c->r->seed, seg, l);
        n++;
        off += 1 + l;
    }
    c->seg_off[n] = off;
    c->n_segs = n;
}

static inline uint32_t literal_lookup(const mctx_t *c, uint32_t node, uint32_t d)
{
    return map_find(&c->r->children, hash_child(c->seg_hash[d], node), node, seg_ptr(c, d),
                    seg_len(c, d));
}

/* Follows literal children from the bucket's root as deep as the path goes. */
static void literal_walk(mctx_t *c, uint32_t root)
{
    uint32_t node = root, d = 0;
    c->walk_node[0] = root;
    while (d < c->n_segs && d < SL_ROUTER_MAX_DEPTH && node_at(c->r, node)->n_literal) {
        node = literal_lookup(c, node, d);
        if (node == NONE)
            break;
        c->walk_node[++d] = node;
    }
    c->walk_depth = d;
}

/* Exact and template routes: depth-first, literal child before parameter
 * child, so at every segment a literal beats a parameter, left to right,
 * and the all-literal node (where exact routes live) is reached first.
 * `on_walk` says the node is walk_node[d], whose literal child is already
 * known. Recursion depth is bounded by the trie depth (SL_ROUTER_MAX_DEPTH). */
static bool trie_search(mctx_t *c, uint32_t node_idx, uint32_t d, bool on_walk)
{
    const sl_router_t *r = c->r;
    const node_t *n = node_at(r, node_idx);

    if (path_ends_at(c, d)) {
        for (uint32_t i = 0; i < n->n_exact + n->n_template; i++)
            if (try_route(c, entry_at(r, n->entry_begin + i)->route))
                return true;
        return false;
    }
    if (d >= c->n_segs || d >= SL_ROUTER_MAX_DEPTH)
        return false; /* deeper than any trie */
    uint32_t child = NONE;
    if (on_walk)
        child = d < c->walk_depth ? c->walk_node[d + 1] : NONE;
    else if (n->n_literal)
        child = literal_lookup(c, node_idx, d);
    if (child != NONE && trie_search(c, child, d + 1, on_walk))
        return true;
    if (n->param_child != NONE && seg_len(c, d) > 0)
        return trie_search(c, n->param_child, d + 1, false);
    return false;
}

/* Prefix routes hang on literal nodes only (base paths and prefixes are
 * plain text), so they are all on the literal walk. Deepest node first: a
 * deeper node's prefixes are longer, and within a node entries are sorted
 * longest first, so the longest prefix wins. */
static bool prefix_search(mctx_t *c)
{
    const sl_router_t *r = c->r;
    for (uint32_t d = c->walk_depth + 1; d-- > 0;) {
        const node_t *n = node_at(r, c->walk_node[d]);
        if (!n->n_prefix)
            continue;
        bool at_end = path_ends_at(c, d);
        const char *next = at_end ? NULL : seg_ptr(c, d);
        size_t next_room = at_end ? 0 : c->path_len - c->seg_off[d] - 1;
        uint32_t first = n->entry_begin + n->n_exact + n->n_template;
        for (uint32_t i = 0; i < n->n_prefix; i++) {
            const entry_t *e = entry_at(r, first + i);
            if (at_end) {
                if (!e->or_end)
                    continue;
            } else if (e->partial_len > next_room ||
                       memcmp(next, e->partial, e->partial_len) != 0) {
                continue;
            }
            if (try_route(c, e->route))
                return true;
        }
    }
    return false;
}

/* Regex routes, one by one, against the path after their base path ("/"
 * when the path is the base path itself). */
static bool regex_search(mctx_t *c, const bucket_t *bk)
{
    const sl_router_t *r = c->r;
    const char *path = c->path;
    size_t len = c->path_len;
    for (uint32_t i = 0; i < bk->n_regex; i++) {
        uint32_t idx = r->regex_routes[bk->regex_begin + i];
        const croute_t *rt = route_at(r, idx);
        if (len < rt->base_len || memcmp(path, rt->base, rt->base_len) != 0)
            continue;
        if (len > rt->base_len && path[rt->base_len] != '/')
            continue; /* "/petstore/v1x" is not under "/petstore/v1" */
        const char *sub = len > rt->base_len ? path + rt->base_len : "/";
        size_t sub_len = len > rt->base_len ? len - rt->base_len : 1;
        if (!regex_match(c, rt->path_re, sub, sub_len)) {
            if (c->error)
                return true;
            continue;
        }
        if (try_route(c, idx))
            return true;
    }
    return false;
}

static bool bucket_search(mctx_t *c, uint32_t bi)
{
    const bucket_t *bk = &c->r->buckets[bi];
    literal_walk(c, bk->root);
    return trie_search(c, bk->root, 0, true) || prefix_search(c) || regex_search(c, bk);
}

int sl_router_match(const sl_router_t *r, const sl_router_request_t *req, sl_router_result_t *res)
{
    mctx_t c; /* not zero-initialised: its arrays are filled by split_path */
    char host[SL_ROUTER_MAX_HOST_LEN + 1];
    size_t host_len;
    uint32_t bi;

    res->allow_methods = 0;
    if (!r || !req)
        return 404;
    c.r = r;
    c.req = req;
    c.res = res;
    c.allow = 0;
    c.method_mismatch = false;
    c.error = false;
    host_len = req->host.ptr ? req->host.len : 0;
    if (!req->path.ptr || req->path.len == 0 || req->path.ptr[0] != '/')
        return 404; /* "*" (OPTIONS *) and empty targets route nowhere */
    c.path = req->path.ptr;
    c.path_len = req->path.len;
    split_path(&c);

    if (host_len > 0 && req->host.ptr[host_len - 1] == '.')
        host_len--;
    if (host_len <= SL_ROUTER_MAX_HOST_LEN) {
        for (size_t i = 0; i < host_len; i++)
            host[i] = (char)lower((unsigned char)req->host.ptr[i]);

        bi = map_find(&r->hosts, hash_child(hash_bytes(r->seed, host, host_len), HOST_EXACT),
                      HOST_EXACT, host, host_len);
        if (bi != NONE && bucket_search(&c, bi))
            goto done;
        /* Longest wildcard first: only suffix lengths that some "*.suffix"
         * has are tried, each one hash probe. */
        for (uint32_t i = 0; i < r->n_wildcard_lens; i++) {
            size_t l = r->wildcard_lens[i];
            if (host_len <= l || host[host_len - l] != '.')
                continue;
            const char *suffix = host + host_len - l;
            bi = map_find(&r->hosts, hash_child(hash_bytes(r->seed, suffix, l), HOST_WILDCARD),
                          HOST_WILDCARD, suffix, l);
            if (bi != NONE && bucket_search(&c, bi))
                goto done;
        }
    }
    if (r->star_bucket != NONE && bucket_search(&c, r->star_bucket))
        goto done;
    if (c.method_mismatch) {
        res->allow_methods = c.allow;
        return 405;
    }
    return 404;

done:
    return c.error ? SL_ERROR : SL_OK;
}
