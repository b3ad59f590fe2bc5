/*
 * Unit tests of runtime/router.c: every precedence rule of router.h, hosts
 * and their fallback, base paths, 405 and Allow, header and query matches,
 * regex anchoring and errors, and 10,000 routes each resolving to itself.
 * Snapshots are built by hand with the protobuf-c structs, as the compiler
 * would produce them, and freed with protobuf-c's free_unpacked (every
 * string and array here comes from malloc).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../../../../runtime/proxy/router.c"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXACT SLUICE__V1__ROUTE__PATH_KIND__EXACT
#define PREFIX SLUICE__V1__ROUTE__PATH_KIND__PREFIX
#define TEMPLATE SLUICE__V1__ROUTE__PATH_KIND__TEMPLATE
#define REGEX SLUICE__V1__ROUTE__PATH_KIND__REGEX

#define M_EXACT SLUICE__V1__HEADER_MATCH__KIND__EXACT
#define M_PREFIX SLUICE__V1__HEADER_MATCH__KIND__PREFIX
#define M_REGEX SLUICE__V1__HEADER_MATCH__KIND__REGEX
#define M_PRESENT SLUICE__V1__HEADER_MATCH__KIND__PRESENT

/* ------------------------------------------------------------------------ */
/* Snapshot builders                                                        */

static char *xstrdup(const char *s)
{
    char *p = strdup(s);
    assert_non_null(p);
    return p;
}

static void *xappend(void *arr, size_t n, size_t elem)
{
    void *p = realloc(arr, (n + 1) * elem);
    assert_non_null(p);
    return p;
}

static Sluice__V1__Snapshot *snap_new(void)
{
    Sluice__V1__Snapshot *s = calloc(1, sizeof *s);
    assert_non_null(s);
    sluice__v1__snapshot__init(s);
    return s;
}

static void snap_free(Sluice__V1__Snapshot *s)
{
    sluice__v1__snapshot__free_unpacked(s, NULL);
}

/* hosts: comma-separated list, or NULL for none (= "*"). */
static Sluice__V1__RouteTable *add_table(Sluice__V1__Snapshot *s, const char *name,
                                         const char *hosts, const char *base)
{
    Sluice__V1__RouteTable *t = calloc(1, sizeof *t);
    assert_non_null(t);
    sluice__v1__route_table__init(t);
    t->name = xstrdup(name);
    t->base_path = xstrdup(base);
    if (hosts) {
        char *copy = xstrdup(hosts), *save = NULL;
        for (char *h = strtok_r(copy, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
            t->hosts = xappend(t->hosts, t->n_hosts, sizeof *t->hosts);
            t->hosts[t->n_hosts++] = xstrdup(h);
        }
        free(copy);
    }
    s->route_tables = xappend(s->route_tables, s->n_route_tables, sizeof *s->route_tables);
    s->route_tables[s->n_route_tables++] = t;
    return t;
}

/* methods: comma-separated, or NULL for any method. */
static Sluice__V1__Route *add_route(Sluice__V1__RouteTable *t, const char *name,
                                    const char *methods, int kind, const char *path)
{
    Sluice__V1__Route *r = calloc(1, sizeof *r);
    assert_non_null(r);
    sluice__v1__route__init(r);
    r->name = xstrdup(name);
    r->path_kind = (Sluice__V1__Route__PathKind)kind;
    r->path = xstrdup(path);
    if (methods) {
        char *copy = xstrdup(methods), *save = NULL;
        for (char *m = strtok_r(copy, ",", &save); m; m = strtok_r(NULL, ",", &save)) {
            r->methods = xappend(r->methods, r->n_methods, sizeof *r->methods);
            r->methods[r->n_methods++] = xstrdup(m);
        }
        free(copy);
    }
    t->routes = xappend(t->routes, t->n_routes, sizeof *t->routes);
    t->routes[t->n_routes++] = r;
    return r;
}

static void add_match(Sluice__V1__Route *r, bool query, const char *name, const char *value,
                      int kind, bool invert)
{
    Sluice__V1__HeaderMatch *m = calloc(1, sizeof *m);
    assert_non_null(m);
    sluice__v1__header_match__init(m);
    m->name = xstrdup(name);
    m->value = xstrdup(value);
    m->kind = (Sluice__V1__HeaderMatch__Kind)kind;
    m->invert = invert;
    if (query) {
        r->query = xappend(r->query, r->n_query, sizeof *r->query);
        r->query[r->n_query++] = m;
    } else {
        r->headers = xappend(r->headers, r->n_headers, sizeof *r->headers);
        r->headers[r->n_headers++] = m;
    }
}

static sl_router_t *build_ok(const Sluice__V1__Snapshot *s)
{
    char err[512];
    sl_router_t *r = sl_router_build(s, err, sizeof err);
    if (!r)
        fail_msg("sl_router_build: %s", err);
    return r;
}

/* ------------------------------------------------------------------------ */
/* Requests                                                                 */

static unsigned test_method_bit(const char *m)
{
    static const char *names[] = {"GET",   "HEAD",    "POST",  "PUT",    "DELETE",
                                  "PATCH", "OPTIONS", "TRACE", "CONNECT"};
    for (unsigned i = 0; i < SL_ARRAY_LEN(names); i++)
        if (strcmp(m, names[i]) == 0)
            return 1u << i;
    return SL_METHOD_OTHER;
}

/* hdrs: NULL or { name, value, name, value, ..., NULL }. target may carry a
 * query after '?'. */
static int do_match(const sl_router_t *r, const char *method, const char *host, const char *target,
                    const char *const *hdrs, sl_router_result_t *res)
{
    sl_http1_header_t headers[16];
    size_t nh = 0;
    for (size_t i = 0; hdrs && hdrs[i]; i += 2) {
        assert_true(nh < SL_ARRAY_LEN(headers));
        headers[nh].name = (sl_str_t){hdrs[i], strlen(hdrs[i])};
        headers[nh].value = (sl_str_t){hdrs[i + 1], strlen(hdrs[i + 1])};
        nh++;
    }
    const char *q = strchr(target, '?');
    sl_router_request_t req = {
        .host = {host, strlen(host)},
        .path = {target, q ? (size_t)(q - target) : strlen(target)},
        .query = {q ? q + 1 : "", q ? strlen(q + 1) : 0},
        .method_bit = test_method_bit(method),
        .method = {method, strlen(method)},
        .headers = headers,
        .num_headers = nh,
    };
    memset(res, 0xa5, sizeof *res); /* prove the router sets what it returns */
    return sl_router_match(r, &req, res);
}

#define EXPECT_ROUTE_H(r, m, h, t, hdrs, ti, ri)                                                   \
    do {                                                                                           \
        sl_router_result_t res_;                                                                   \
        int rc_ = do_match((r), (m), (h), (t), (hdrs), &res_);                                     \
        if (rc_ != SL_OK)                                                                          \
            fail_msg("%s %s%s: got %d, want route %d/%d", (m), (h), (t), rc_, (ti), (ri));         \
        if (res_.table_index != (uint32_t)(ti) || res_.route_index != (uint32_t)(ri))              \
            fail_msg("%s %s%s: got route %u/%u, want %d/%d", (m), (h), (t), res_.table_index,      \
                     res_.route_index, (ti), (ri));                                                \
    } while (0)

#define EXPECT_ROUTE(r, m, h, t, ti, ri) EXPECT_ROUTE_H(r, m, h, t, NULL, ti, ri)

#define EXPECT_STATUS_H(r, m, h, t, hdrs, status)                                                  \
    do {                                                                                           \
        sl_router_result_t res_;                                                                   \
        int rc_ = do_match((r), (m), (h), (t), (hdrs), &res_);                                     \
        if (rc_ != (status))                                                                       \
            fail_msg("%s %s%s: got %d (route %u/%u), want %d", (m), (h), (t), rc_,                 \
                     res_.table_index, res_.route_index, (status));                                \
    } while (0)

#define EXPECT_STATUS(r, m, h, t, status) EXPECT_STATUS_H(r, m, h, t, NULL, status)

#define EXPECT_405(r, m, h, t, allow)                                                              \
    do {                                                                                           \
        sl_router_result_t res_;                                                                   \
        int rc_ = do_match((r), (m), (h), (t), NULL, &res_);                                       \
        if (rc_ != 405)                                                                            \
            fail_msg("%s %s%s: got %d, want 405", (m), (h), (t), rc_);                             \
        if (res_.allow_methods != (unsigned)(allow))                                               \
            fail_msg("%s %s%s: Allow bits 0x%x, want 0x%x", (m), (h), (t), res_.allow_methods,     \
                     (unsigned)(allow));                                                           \
    } while (0)

static void expect_build_error(const Sluice__V1__Snapshot *s, const char *want)
{
    char err[512];
    sl_router_t *r = sl_router_build(s, err, sizeof err);
    if (r) {
        sl_router_free(r);
        fail_msg("build succeeded, want error \"%s\"", want);
    }
    assert_string_equal(err, want);
}

/* ------------------------------------------------------------------------ */
/* Tests                                                                    */

static void test_empty_snapshot_is_404(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *s = snap_new();
    sl_router_t *r = build_ok(s);
    EXPECT_STATUS(r, "GET", "example.com", "/", 404);
    EXPECT_STATUS(r, "GET", "", "/anything", 404);
    sl_router_free(r);

    /* A table without routes routes nothing either. */
    add_table(s, "empty", NULL, "/");
    r = build_ok(s);
    EXPECT_STATUS(r, "GET", "example.com", "/", 404);
    sl_router_free(r);
    snap_free(s);

    /* No snapshot at all is an empty one. */
    char err[64];
    r = sl_router_build(NULL, err, sizeof err);
    assert_non_null(r);
    EXPECT_STATUS(r, "GET", "a", "/", 404);
    sl_router_free(r);
}

static void test_exact_beats_template_beats_prefix_beats_regex(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *s = snap_new();
    Sluice__V1__RouteTable *t = add_table(s, "t", NULL, "/");
    /* Declared in reverse order of precedence: order must not matter. */
    add_route(t, "regex", NULL, REGEX, "/pets/.*");           /* 0 */
    add_route(t, "prefix", NULL, PREFIX, "/pets");            /* 1 */
    add_route(t, "template", NULL, TEMPLATE, "/pets/{id}");   /* 2 */
    add_route(t, "exact", NULL, EXACT, "/pets/mine");         /* 3 */
    add_route(t, "regex-only", NULL, REGEX, "/other/[a-z]+"); /* 4 */
    sl_router_t *r = build_ok(s);

    EXPECT_ROUTE(r, "GET", "h", "/pets/mine", 0, 3);
    EXPECT_ROUTE(r, "GET", "h", "/pets/7", 0, 2);
    EXPECT_ROUTE(r, "GET", "h", "/pets/7/photos", 0, 1); /* regex matches too */
    EXPECT_ROUTE(r, "GET", "h", "/pets", 0, 1);
    EXPECT_ROUTE(r, "GET", "h", "/pets/", 0, 1); /* template needs a non-empty segment */
    EXPECT_ROUTE(r, "GET", "h", "/other/abc", 0, 4);
    EXPECT_STATUS(r, "GET", "h", "/other/abc1", 404);
    EXPECT_STATUS(r, "GET", "h", "/pet", 404);
    sl_router_free(r);
    snap_free(s);
}

static void test_long_segments(void **state)
{
    (void)state;
    /* Segments longer than a hash slot's inline key are compared through a
     * pointer into the snapshot. */
    Sluice__V1__Snapshot *s = snap_new();
    Sluice__V1__RouteTable *t = add_table(s, "t", "a-rather-long-host-name.example.com", "/");
    add_route(t, "long", NULL, EXACT, "/a-very-long-segment-name/x");                 /* 0 */
    add_route(t, "long2", NULL, EXACT, "/a-very-long-segment-namf/x");                /* 1 */
    add_route(t, "tpl", NULL, TEMPLATE, "/a-very-long-segment-name/{id}/exactly12b"); /* 2 */
    sl_router_t *r = build_ok(s);
    const char *h = "a-rather-long-host-name.example.com";
    EXPECT_ROUTE(r, "GET", h, "/a-very-long-segment-name/x", 0, 0);
    EXPECT_ROUTE(r, "GET", h, "/a-very-long-segment-namf/x", 0, 1);
    EXPECT_STATUS(r, "GET", h, "/a-very-long-segment-namg/x", 404);
    EXPECT_STATUS(r, "GET", h, "/a-very-long-segment-nam/x", 404);
    EXPECT_ROUTE(r, "GET", h, "/a-very-long-segment-name/7/exactly12b", 0, 2);
    EXPECT_STATUS(r, "GET", h, "/a-very-long-segment-name/7/exactly12c", 404);
    EXPECT_STATUS(r, "GET", "a-rather-long-host-name.example.co", "/a-very-long-segment-name/x",
                  404);
    sl_router_free(r);
    snap_free(s);
}

static void test_exact_and_template_same_node(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *s = snap_new();
    Sluice__V1__RouteTable *t = add_table(s, "t", NULL, "/");
    add_route(t, "tpl-literal", NULL, TEMPLATE, "/users/me"); /* 0 */
    add_route(t, "exact", NULL, EXACT, "/users/me");          /* 1 */
    add_route(t, "tpl", NULL, TEMPLATE, "/users/{id}");       /* 2 */
    sl_router_t *r = build_ok(s);
    EXPECT_ROUTE(r, "GET", "h", "/users/me", 0, 1);
    EXPECT_ROUTE(r, "GET", "h", "/users/42", 0, 2);
    EXPECT_STATUS(r, "GET", "h", "/users/42/x", 404);
    EXPECT_STATUS(r, "GET", "h", "/users/me/", 404); /* trailing slash is significant */
    sl_router_free(r);
    snap_free(s);
}

static void test_literal_beats_param_left_to_right(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *s = snap_new();
    Sluice__V1__RouteTable *t = add_table(s, "t", NULL, "/");
    add_route(t, "y-b-c", NULL, TEMPLATE, "/{y}/b/c");   /* 0 */
    add_route(t, "a-x-c", NULL, TEMPLATE, "/a/{x}/c");   /* 1 */
    add_route(t, "a-x-d", NULL, TEMPLATE, "/a/{x}/d");   /* 2 */
    add_route(t, "y-z-e", NULL, TEMPLATE, "/{y}/{z}/e"); /* 3 */
    add_route(t, "a-b-e", NULL, TEMPLATE, "/{y}/b/e");   /* 4 */
    sl_router_t *r = build_ok(s);
    /* First segment literal "a" beats "{y}" even though 0 was declared first. */
    EXPECT_ROUTE(r, "GET", "h", "/a/b/c", 0, 1);
    EXPECT_ROUTE(r, "GET", "h", "/z/b/c", 0, 0);
    EXPECT_ROUTE(r, "GET", "h", "/a/q/d", 0, 2);
    /* The literal branch fails deeper: backtrack to the parameter branch. */
    EXPECT_ROUTE(r, "GET", "h", "/a/q/e", 0, 3);
    /* Under "{y}", literal "b" beats "{z}". */
    EXPECT_ROUTE(r, "GET", "h", "/q/b/e", 0, 4);
    EXPECT_STATUS(r, "GET", "h", "/a/b", 404);
    EXPECT_STATUS(r, "GET", "h", "//b/c", 404); /* a parameter never matches "" */
    /* Percent-encoding is not decoded: %2F stays inside one segment. */
    EXPECT_ROUTE(r, "GET", "h", "/a%2Fb/b/c", 0, 0);
    sl_router_free(r);
    snap_free(s);
}

static void test_longest_prefix_wins(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *s = snap_new();
    Sluice__V1__RouteTable *t = add_table(s, "t", NULL, "/");
    add_route(t, "a", NULL, PREFIX, "/a");             /* 0 */
    add_route(t, "a-b", NULL, PREFIX, "/a/b");         /* 1 */
    add_route(t, "a-bc", NULL, PREFIX, "/a/bc");       /* 2 */
    add_route(t, "a-b-", NULL, PREFIX, "/a/b/");       /* 3 */
    add_route(t, "root", NULL, PREFIX, "/");           /* 4 */
    add_route(t, "a-b-c-d", NULL, PREFIX, "/a/b/c/d"); /* 5 */
    sl_router_t *r = build_ok(s);
    EXPECT_ROUTE(r, "GET", "h", "/a/bcd", 0, 2);
    EXPECT_ROUTE(r, "GET", "h", "/a/bc", 0, 2);
    EXPECT_ROUTE(r, "GET", "h", "/a/b", 0, 1);
    EXPECT_ROUTE(r, "GET", "h", "/a/bx", 0, 1);
    EXPECT_ROUTE(r, "GET", "h", "/a/b/", 0, 3);
    EXPECT_ROUTE(r, "GET", "h", "/a/b/c", 0, 3);
    EXPECT_ROUTE(r, "GET", "h", "/a/b/c/d", 0, 5);
    EXPECT_ROUTE(r, "GET", "h", "/a/b/c/de/f", 0, 5);
    EXPECT_ROUTE(r, "GET", "h", "/a/b/c/x", 0, 3); /* deepest node fails: back off */
    EXPECT_ROUTE(r, "GET", "h", "/a", 0, 0);
    EXPECT_ROUTE(r, "GET", "h", "/ab", 0, 0); /* plain string prefix, like Envoy */
    EXPECT_ROUTE(r, "GET", "h", "/a/x", 0, 0);
    EXPECT_ROUTE(r, "GET", "h", "/", 0, 4);
    EXPECT_ROUTE(r, "GET", "h", "/zzz", 0, 4);
    sl_router_free(r);
    snap_free(s);
}

static void test_more_matches_first_then_declaration_order(void **state)
{
    (void)state;
    const char *const v2[] = {"X-Version", "2", NULL};
    const char *const v2beta[] = {"X-Version", "2", "X-Beta", "1", NULL};
    Sluice__V1__Snapshot *s = snap_new();
    Sluice__V1__RouteTable *t = add_table(s, "t", NULL, "/");
    add_route(t, "plain", NULL, TEMPLATE, "/pets/{id}");                    /* 0 */
    add_route(t, "plain-dup", NULL, TEMPLATE, "/pets/{petId}");             /* 1 */
    Sluice__V1__Route *v = add_route(t, "v2", NULL, TEMPLATE, "/pets/{x}"); /* 2 */
    add_match(v, false, "x-version", "2", M_EXACT, false);
    Sluice__V1__Route *vb = add_route(t, "v2beta", NULL, TEMPLATE, "/pets/{x}"); /* 3 */
    add_match(vb, false, "x-version", "2", M_EXACT, false);
    add_match(vb, false, "x-beta", "", M_PRESENT, false);
    Sluice__V1__Route *vq = add_route(t, "v2q", NULL, TEMPLATE, "/pets/{x}"); /* 4 */
    add_match(vq, true, "debug", "", M_PRESENT, false);
    /* Same for prefix and exact routes. */
    add_route(t, "p", NULL, PREFIX, "/files");                           /* 5 */
    Sluice__V1__Route *ph = add_route(t, "p-h", NULL, PREFIX, "/files"); /* 6 */
    add_match(ph, false, "x-version", "2", M_EXACT, false);
    add_route(t, "e", NULL, EXACT, "/e");                           /* 7 */
    Sluice__V1__Route *eh = add_route(t, "e-h", NULL, EXACT, "/e"); /* 8 */
    add_match(eh, false, "x-version", "2", M_EXACT, false);
    sl_router_t *r = build_ok(s);

    EXPECT_ROUTE(r, "GET", "h", "/pets/1", 0, 0);
    EXPECT_ROUTE_H(r, "GET", "h", "/pets/1", v2, 0, 2);
    EXPECT_ROUTE_H(r, "GET", "h", "/pets/1", v2beta, 0, 3);
    /* One query match and one header match tie: declaration order (2 < 4). */
    EXPECT_ROUTE_H(r, "GET", "h", "/pets/1?debug", v2, 0, 2);
    EXPECT_ROUTE(r, "GET", "h", "/pets/1?debug", 0, 4);
    EXPECT_ROUTE(r, "GET", "h", "/files/a", 0, 5);
    EXPECT_ROUTE_H(r, "GET", "h", "/files/a", v2, 0, 6);
    EXPECT_ROUTE(r, "GET", "h", "/e", 0, 7);
    EXPECT_ROUTE_H(r, "GET", "h", "/e", v2, 0, 8);
    sl_router_free(r);
    snap_free(s);
}

static void test_regex_declaration_order_and_same_pattern(void **state)
{
    (void)state;
    const char *const hv[] = {"x-v", "1", NULL};
    Sluice__V1__Snapshot *s = snap_new();
    Sluice__V1__RouteTable *t = add_table(s, "t", NULL, "/");
    add_route(t, "broad", NULL, REGEX, "/r/.*");                              /* 0 */
    add_route(t, "narrow", NULL, REGEX, "/r/[0-9]+");                         /* 1: shadowed by 0 */
    add_route(t, "other", NULL, REGEX, "/s/[0-9]+");                          /* 2 */
    Sluice__V1__Route *h = add_route(t, "other-h", NULL, REGEX, "/s/[0-9]+"); /* 3 */
    add_match(h, false, "X-V", "1", M_EXACT, false);
    sl_router_t *r = build_ok(s);
    EXPECT_ROUTE(r, "GET", "h", "/r/12", 0, 0);
    EXPECT_ROUTE(r, "GET", "h", "/s/12", 0, 2);
    EXPECT_ROUTE_H(r, "GET", "h", "/s/12", hv, 0, 3);
    sl_router_free(r);
    snap_free(s);

    /* Declaration order across tables of one bucket. */
    s = snap_new();
    t = add_table(s, "t0", NULL, "/");
    add_route(t, "first", NULL, REGEX, "/x/[a-z]+");
    t = add_table(s, "t1", NULL, "/");
    add_route(t, "second", NULL, REGEX, "/x/.*");
    r = build_ok(s);
    EXPECT_ROUTE(r, "GET", "h", "/x/abc", 0, 0);
    EXPECT_ROUTE(r, "GET", "h", "/x/ABC", 1, 0);
    sl_router_free(r);
    snap_free(s);
}

static void test_regex_is_anchored(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *s = snap_new();
    Sluice__V1__RouteTable *t = add_table(s, "t", NULL, "/");
    add_route(t, "num", NULL, REGEX, "/pets/[0-9]+"); /* 0 */
    add_route(t, "alt", NULL, REGEX, "/a|/ab");       /* 1 */
    add_route(t, "quoted", NULL, REGEX, "/q\\Q.*");   /* 2: \Q without \E */
    sl_router_t *r = build_ok(s);
    EXPECT_ROUTE(r, "GET", "h", "/pets/12", 0, 0);
    EXPECT_STATUS(r, "GET", "h", "/pets/12/x", 404);
    EXPECT_STATUS(r, "GET", "h", "/x/pets/12", 404);
    EXPECT_STATUS(r, "GET", "h", "/pets/", 404);
    /* End anchoring must backtrack into the longer alternative. */
    EXPECT_ROUTE(r, "GET", "h", "/ab", 0, 1);
    EXPECT_ROUTE(r, "GET", "h", "/a", 0, 1);
    EXPECT_STATUS(r, "GET", "h", "/abc", 404);
    EXPECT_ROUTE(r, "GET", "h", "/q.*", 0, 2);
    EXPECT_STATUS(r, "GET", "h", "/qxx", 404);
    sl_router_free(r);
    snap_free(s);
}

static void test_hosts_exact_wildcard_star(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *s = snap_new();
    add_route(add_table(s, "exact", "api.example.com", "/"), "x", NULL, EXACT, "/x");
    add_route(add_table(s, "wild", "*.example.com", "/"), "x", NULL, EXACT, "/x");
    add_route(add_table(s, "wild-b", "*.B.example.com", "/"), "x", NULL, EXACT, "/x");
    add_route(add_table(s, "star", "*", "/"), "x", NULL, EXACT, "/x");
    add_route(add_table(s, "upper", "Shop.Example.ORG.", "/"), "x", NULL, EXACT, "/x");
    sl_router_t *r = build_ok(s);
    EXPECT_ROUTE(r, "GET", "api.example.com", "/x", 0, 0);
    EXPECT_ROUTE(r, "GET", "API.Example.COM", "/x", 0, 0);
    EXPECT_ROUTE(r, "GET", "api.example.com.", "/x", 0, 0);
    EXPECT_ROUTE(r, "GET", "a.example.com", "/x", 1, 0);
    EXPECT_ROUTE(r, "GET", "A.EXAMPLE.com", "/x", 1, 0);
    EXPECT_ROUTE(r, "GET", "a.b.example.com", "/x", 2, 0); /* longest suffix first */
    EXPECT_ROUTE(r, "GET", "x.y.b.example.com", "/x", 2, 0);
    EXPECT_ROUTE(r, "GET", "b.example.com", "/x", 1, 0); /* "*.b..." needs a label */
    EXPECT_ROUTE(r, "GET", "example.com", "/x", 3, 0);   /* not matched by "*.example.com" */
    EXPECT_ROUTE(r, "GET", "xexample.com", "/x", 3, 0);
    EXPECT_ROUTE(r, "GET", ".example.com", "/x", 3, 0); /* no label before the suffix */
    EXPECT_ROUTE(r, "GET", "other.org", "/x", 3, 0);
    EXPECT_ROUTE(r, "GET", "", "/x", 3, 0);
    EXPECT_ROUTE(r, "GET", "shop.example.org", "/x", 4, 0);
    /* A host longer than any DNS name only reaches "*". */
    char longhost[400];
    memset(longhost, 'a', sizeof longhost - 1);
    longhost[sizeof longhost - 1] = '\0';
    memcpy(longhost + sizeof longhost - 1 - 12, ".example.com", 12);
    EXPECT_ROUTE(r, "GET", longhost, "/x", 3, 0);
    sl_router_free(r);
    snap_free(s);

    /* Without a "*" table, an unknown host is a 404; no hosts = "*". */
    s = snap_new();
    add_route(add_table(s, "exact", "api.example.com,API.example.com.", "/"), "x", NULL, EXACT,
              "/x");
    r = build_ok(s);
    EXPECT_ROUTE(r, "GET", "api.example.com", "/x", 0, 0);
    EXPECT_STATUS(r, "GET", "other.org", "/x", 404);
    /* A host named twice puts the table once into its bucket. */
    uint32_t n_exact = 0;
    for (uint32_t i = 0; i < r->n_nodes; i++)
        n_exact += node_at(r, i)->n_exact;
    assert_int_equal(n_exact, 1);
    assert_int_equal(r->n_buckets, 1);
    sl_router_free(r);
    add_route(add_table(s, "nohosts", NULL, "/"), "y", NULL, EXACT, "/x");
    r = build_ok(s);
    EXPECT_ROUTE(r, "GET", "other.org", "/x", 1, 0);
    sl_router_free(r);
    snap_free(s);
}

static void test_host_fallback_to_less_specific_bucket(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *s = snap_new();
    add_route(add_table(s, "exact", "api.example.com", "/"), "only-a", "GET", EXACT, "/a");
    Sluice__V1__RouteTable *w = add_table(s, "wild", "*.example.com", "/");
    add_route(w, "b", NULL, EXACT, "/b");
    add_route(w, "a-post", "POST", EXACT, "/a");
    add_route(add_table(s, "star", NULL, "/"), "c", NULL, PREFIX, "/");
    sl_router_t *r = build_ok(s);
    EXPECT_ROUTE(r, "GET", "api.example.com", "/a", 0, 0);
    EXPECT_ROUTE(r, "GET", "api.example.com", "/b", 1, 0);  /* exact -> wildcard */
    EXPECT_ROUTE(r, "POST", "api.example.com", "/a", 1, 1); /* method fails: next bucket */
    EXPECT_ROUTE(r, "GET", "api.example.com", "/c", 2, 0);  /* exact -> wildcard -> * */
    EXPECT_ROUTE(r, "GET", "z.example.com", "/a", 2, 0);
    sl_router_free(r);
    snap_free(s);
}

static void test_base_path(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *s = snap_new();
    Sluice__V1__RouteTable *t = add_table(s, "petstore", NULL, "/petstore/v1");
    add_route(t, "list", NULL, EXACT, "/pets");        /* 0 */
    add_route(t, "get", NULL, TEMPLATE, "/pets/{id}"); /* 1 */
    add_route(t, "root", NULL, EXACT, "/");            /* 2 */
    add_route(t, "re", NULL, REGEX, "/re/[0-9]+");     /* 3 */
    Sluice__V1__RouteTable *u = add_table(s, "other", NULL, "/petstore/v1x");
    add_route(u, "all", NULL, PREFIX, "/"); /* 1/0 */
    Sluice__V1__RouteTable *v = add_table(s, "files", NULL, "/files");
    add_route(v, "p", NULL, PREFIX, "/docs");     /* 2/0 */
    add_route(v, "tplroot", NULL, TEMPLATE, "/"); /* 2/1 */
    add_route(v, "re-root", NULL, REGEX, "/");    /* 2/2 */
    sl_router_t *r = build_ok(s);
    sl_router_result_t res;

    assert_int_equal(do_match(r, "GET", "h", "/petstore/v1/pets", NULL, &res), SL_OK);
    assert_int_equal(res.route_index, 0);
    assert_int_equal(res.base_path_len, strlen("/petstore/v1"));
    EXPECT_ROUTE(r, "GET", "h", "/petstore/v1/pets/7", 0, 1);
    EXPECT_STATUS(r, "GET", "h", "/petstore/v1/pets/", 404); /* trailing slash significant */
    /* The Api root answers with and without the trailing slash. */
    EXPECT_ROUTE(r, "GET", "h", "/petstore/v1", 0, 2);
    EXPECT_ROUTE(r, "GET", "h", "/petstore/v1/", 0, 2);
    EXPECT_STATUS(r, "GET", "h", "/petstore/v1//", 404);
    EXPECT_ROUTE(r, "GET", "h", "/petstore/v1/re/42", 0, 3);
    EXPECT_STATUS(r, "GET", "h", "/petstore/v1/re/42/", 404);
    EXPECT_STATUS(r, "GET", "h", "/petstore/v1/pets/../re/1", 404);
    /* "/petstore/v1x" is another base path, never under "/petstore/v1". */
    EXPECT_ROUTE(r, "GET", "h", "/petstore/v1x", 1, 0);
    EXPECT_ROUTE(r, "GET", "h", "/petstore/v1x/pets", 1, 0);
    EXPECT_ROUTE(r, "GET", "h", "/petstore/v1x/re/42", 1, 0);
    assert_int_equal(do_match(r, "GET", "h", "/petstore/v1x/pets", NULL, &res), SL_OK);
    assert_int_equal(res.base_path_len, strlen("/petstore/v1x"));
    EXPECT_STATUS(r, "GET", "h", "/petstore/v2/pets", 404);
    EXPECT_STATUS(r, "GET", "h", "/petstore", 404);
    EXPECT_ROUTE(r, "GET", "h", "/files/docs/a", 2, 0);
    EXPECT_ROUTE(r, "GET", "h", "/files/docsx", 2, 0);
    EXPECT_ROUTE(r, "GET", "h", "/files", 2, 1);
    EXPECT_ROUTE(r, "GET", "h", "/files/", 2, 1);
    EXPECT_STATUS(r, "GET", "h", "/filesdocs", 404);
    sl_router_free(r);
    snap_free(s);

    /* A regex sees "/" for the base path itself; a prefix "/" under a base
     * matches the base with and without slash, and nothing beside it. */
    s = snap_new();
    t = add_table(s, "a", NULL, "/api");
    add_route(t, "re-root", NULL, REGEX, "/");
    add_route(t, "pfx", "POST", PREFIX, "/");
    r = build_ok(s);
    EXPECT_ROUTE(r, "GET", "h", "/api", 0, 0);
    EXPECT_ROUTE(r, "GET", "h", "/api/", 0, 0);
    EXPECT_405(r, "GET", "h", "/api/x", SL_METHOD_POST); /* only the prefix route matches */
    EXPECT_ROUTE(r, "POST", "h", "/api", 0, 1);
    EXPECT_ROUTE(r, "POST", "h", "/api/", 0, 1);
    EXPECT_ROUTE(r, "POST", "h", "/api/x/y", 0, 1);
    EXPECT_STATUS(r, "POST", "h", "/apix", 404);
    sl_router_free(r);
    snap_free(s);

    /* A regex that does not start with '/' still only sees paths under its
     * base: "/apix" has no remainder "x" to offer it. */
    s = snap_new();
    t = add_table(s, "a", NULL, "/api");
    add_route(t, "any", NULL, REGEX, ".*");
    r = build_ok(s);
    EXPECT_ROUTE(r, "GET", "h", "/api", 0, 0);
    EXPECT_ROUTE(r, "GET", "h", "/api/x", 0, 0);
    EXPECT_STATUS(r, "GET", "h", "/apix", 404);
    EXPECT_STATUS(r, "GET", "h", "/ap", 404);
    assert_int_equal(do_match(r, "POST", "h", "/api", NULL, &res), SL_OK);
    assert_int_equal(res.base_path_len, 4);
    sl_router_free(r);
    snap_free(s);

    /* Base path "" is "/"; base_path_len is 0. */
    s = snap_new();
    t = add_table(s, "a", NULL, "");
    add_route(t, "root", NULL, EXACT, "/");
    add_route(t, "x", NULL, EXACT, "/x");
    r = build_ok(s);
    assert_int_equal(do_match(r, "GET", "h", "/x", NULL, &res), SL_OK);
    assert_int_equal(res.base_path_len, 0);
    EXPECT_ROUTE(r, "GET", "h", "/", 0, 0);
    EXPECT_STATUS(r, "GET", "h", "//", 404);
    EXPECT_STATUS(r, "GET", "h", "*", 404);
    EXPECT_STATUS(r, "GET", "h", "", 404);
    EXPECT_STATUS(r, "GET", "h", "x", 404);
    sl_router_free(r);
    snap_free(s);
}

static void test_405_allow_bits(void **state)
{
    (void)state;
    const char *const beta[] = {"x-beta", "1", NULL};
    Sluice__V1__Snapshot *s = snap_new();
    Sluice__V1__RouteTable *t = add_table(s, "t", "api.example.com", "/v1");
    add_route(t, "list", "GET,HEAD", EXACT, "/pets");                   /* 0 */
    add_route(t, "create", "POST", EXACT, "/pets");                     /* 1 */
    add_route(t, "delete", "DELETE", TEMPLATE, "/pets/{id}");           /* 2 */
    add_route(t, "purge", "PURGE,GET", EXACT, "/cache");                /* 3 */
    Sluice__V1__Route *b = add_route(t, "beta", "PUT", EXACT, "/beta"); /* 4 */
    add_match(b, false, "x-beta", "1", M_EXACT, false);
    add_route(t, "re", "OPTIONS", REGEX, "/re/.*"); /* 5 */
    add_route(t, "pfx", "TRACE", PREFIX, "/pfx");   /* 6 */
    Sluice__V1__RouteTable *u = add_table(s, "u", "*", "/v1");
    add_route(u, "patch", "PATCH", EXACT, "/pets"); /* 1/0 */
    sl_router_t *r = build_ok(s);

    EXPECT_ROUTE(r, "HEAD", "api.example.com", "/v1/pets", 0, 0);
    EXPECT_ROUTE(r, "POST", "api.example.com", "/v1/pets", 0, 1);
    EXPECT_ROUTE(r, "PATCH", "api.example.com", "/v1/pets", 1, 0);
    /* Union over every route and every host bucket that matched the path. */
    EXPECT_405(r, "PUT", "api.example.com", "/v1/pets",
               SL_METHOD_GET | SL_METHOD_HEAD | SL_METHOD_POST | SL_METHOD_PATCH);
    EXPECT_405(r, "PUT", "other.org", "/v1/pets", SL_METHOD_PATCH);
    EXPECT_405(r, "GET", "api.example.com", "/v1/pets/1", SL_METHOD_DELETE);
    EXPECT_ROUTE(r, "DELETE", "api.example.com", "/v1/pets/1", 0, 2);
    EXPECT_STATUS(r, "PUT", "api.example.com", "/v1/nothing", 404);
    /* Methods outside the nine are matched by name (case-sensitive). */
    EXPECT_ROUTE(r, "PURGE", "api.example.com", "/v1/cache", 0, 3);
    EXPECT_405(r, "purge", "api.example.com", "/v1/cache", SL_METHOD_GET);
    EXPECT_405(r, "FOO", "api.example.com", "/v1/cache", SL_METHOD_GET);
    /* A route whose header match fails does not count as "path matched". */
    EXPECT_STATUS(r, "GET", "api.example.com", "/v1/beta", 404);
    EXPECT_STATUS_H(r, "GET", "api.example.com", "/v1/beta", beta, 405);
    EXPECT_405(r, "GET", "api.example.com", "/v1/re/x", SL_METHOD_OPTIONS);
    EXPECT_405(r, "GET", "api.example.com", "/v1/pfxyz", SL_METHOD_TRACE);
    sl_router_free(r);
    snap_free(s);
}

static void test_wrong_method_does_not_hide_lower_precedence(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *s = snap_new();
    Sluice__V1__RouteTable *t = add_table(s, "t", NULL, "/");
    add_route(t, "get", "GET", TEMPLATE, "/pets/{id}"); /* 0 */
    add_route(t, "exact", "PUT", EXACT, "/pets/1");     /* 1 */
    add_route(t, "del", "DELETE", PREFIX, "/pets/");    /* 2 */
    add_route(t, "re", "POST", REGEX, "/pets/[0-9]+");  /* 3 */
    sl_router_t *r = build_ok(s);
    EXPECT_ROUTE(r, "PUT", "h", "/pets/1", 0, 1);
    EXPECT_ROUTE(r, "GET", "h", "/pets/1", 0, 0);
    EXPECT_ROUTE(r, "DELETE", "h", "/pets/1", 0, 2);
    EXPECT_ROUTE(r, "POST", "h", "/pets/1", 0, 3);
    EXPECT_405(r, "PATCH", "h", "/pets/1",
               SL_METHOD_GET | SL_METHOD_PUT | SL_METHOD_DELETE | SL_METHOD_POST);
    EXPECT_405(r, "PATCH", "h", "/pets/x", SL_METHOD_GET | SL_METHOD_DELETE);
    sl_router_free(r);
    snap_free(s);
}

static void test_header_matches(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *s = snap_new();
    Sluice__V1__RouteTable *t = add_table(s, "t", NULL, "/");
    struct {
        const char *path;
        int kind;
        const char *value;
    } kinds[] = {
        {"/exact", M_EXACT, "Bearer abc"},
        {"/prefix", M_PREFIX, "Bearer "},
        {"/regex", M_REGEX, "Bearer [a-z]+"},
        {"/present", M_PRESENT, "ignored"},
    };
    for (size_t i = 0; i < SL_ARRAY_LEN(kinds); i++) {
        Sluice__V1__Route *r0 = add_route(t, "m", NULL, EXACT, kinds[i].path);
        add_match(r0, false, "Authorization", kinds[i].value, kinds[i].kind, false);
        char inv[32];
        snprintf(inv, sizeof inv, "/not%s", kinds[i].path + 1);
        Sluice__V1__Route *r1 = add_route(t, "inv", NULL, EXACT, inv);
        add_match(r1, false, "authorization", kinds[i].value, kinds[i].kind, true);
    }
    sl_router_t *r = build_ok(s);
    const char *const abc[] = {"AUTHORIZATION", "Bearer abc", NULL};
    const char *const abcd[] = {"authorization", "Bearer abcd", NULL};
    const char *const upper[] = {"Authorization", "Bearer ABC", NULL};
    const char *const basic[] = {"Authorization", "Basic x", NULL};
    const char *const empty[] = {"Authorization", "", NULL};
    const char *const other[] = {"X-Authorization", "Bearer abc", NULL};
    const char *const two[] = {"Authorization", "Basic x", "authorization", "Bearer abc", NULL};

    /* route indexes: exact 0/1, prefix 2/3, regex 4/5, present 6/7 */
    EXPECT_ROUTE_H(r, "GET", "h", "/exact", abc, 0, 0);
    EXPECT_STATUS_H(r, "GET", "h", "/exact", abcd, 404);
    EXPECT_STATUS_H(r, "GET", "h", "/exact", upper, 404); /* values are case-sensitive */
    EXPECT_STATUS_H(r, "GET", "h", "/exact", NULL, 404);
    EXPECT_ROUTE_H(r, "GET", "h", "/exact", two, 0, 0); /* any occurrence */
    EXPECT_STATUS_H(r, "GET", "h", "/notexact", abc, 404);
    EXPECT_ROUTE_H(r, "GET", "h", "/notexact", abcd, 0, 1);
    EXPECT_ROUTE_H(r, "GET", "h", "/notexact", NULL, 0, 1); /* absent: inverted holds */

    EXPECT_ROUTE_H(r, "GET", "h", "/prefix", abcd, 0, 2);
    EXPECT_STATUS_H(r, "GET", "h", "/prefix", basic, 404);
    EXPECT_STATUS_H(r, "GET", "h", "/prefix", empty, 404);
    EXPECT_ROUTE_H(r, "GET", "h", "/notprefix", basic, 0, 3);
    EXPECT_STATUS_H(r, "GET", "h", "/notprefix", abc, 404);

    EXPECT_ROUTE_H(r, "GET", "h", "/regex", abcd, 0, 4);
    EXPECT_STATUS_H(r, "GET", "h", "/regex", upper, 404);
    EXPECT_STATUS_H(r, "GET", "h", "/regex", other, 404);
    const char *const tail[] = {"Authorization", "Bearer abc!", NULL};
    EXPECT_STATUS_H(r, "GET", "h", "/regex", tail, 404); /* anchored at the end */
    const char *const head[] = {"Authorization", "xBearer abc", NULL};
    EXPECT_STATUS_H(r, "GET", "h", "/regex", head, 404); /* and at the start */
    EXPECT_ROUTE_H(r, "GET", "h", "/notregex", upper, 0, 5);
    EXPECT_STATUS_H(r, "GET", "h", "/notregex", abc, 404);

    EXPECT_ROUTE_H(r, "GET", "h", "/present", empty, 0, 6);
    EXPECT_STATUS_H(r, "GET", "h", "/present", other, 404);
    EXPECT_ROUTE_H(r, "GET", "h", "/notpresent", other, 0, 7);
    EXPECT_STATUS_H(r, "GET", "h", "/notpresent", basic, 404);
    sl_router_free(r);
    snap_free(s);
}

static void test_query_matches(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *s = snap_new();
    Sluice__V1__RouteTable *t = add_table(s, "t", NULL, "/");
    Sluice__V1__Route *q;
    q = add_route(t, "exact", NULL, EXACT, "/exact"); /* 0 */
    add_match(q, true, "format", "json", M_EXACT, false);
    q = add_route(t, "prefix", NULL, EXACT, "/prefix"); /* 1 */
    add_match(q, true, "v", "2.", M_PREFIX, false);
    q = add_route(t, "regex", NULL, EXACT, "/regex"); /* 2 */
    add_match(q, true, "id", "[0-9]+", M_REGEX, false);
    q = add_route(t, "present", NULL, EXACT, "/present"); /* 3 */
    add_match(q, true, "debug", "", M_PRESENT, false);
    q = add_route(t, "notpresent", NULL, EXACT, "/notpresent"); /* 4 */
    add_match(q, true, "debug", "", M_PRESENT, true);
    q = add_route(t, "raw", NULL, EXACT, "/raw"); /* 5 */
    add_match(q, true, "a b", "x%20y", M_EXACT, false);
    q = add_route(t, "notexact", NULL, EXACT, "/notexact"); /* 6 */
    add_match(q, true, "format", "json", M_EXACT, true);
    q = add_route(t, "both", NULL, EXACT, "/both"); /* 7 */
    add_match(q, true, "a", "1", M_EXACT, false);
    add_match(q, false, "x-h", "", M_PRESENT, false);
    sl_router_t *r = build_ok(s);
    const char *const xh[] = {"X-H", "v", NULL};

    EXPECT_ROUTE(r, "GET", "h", "/exact?format=json", 0, 0);
    EXPECT_ROUTE(r, "GET", "h", "/exact?a=1&format=json&b", 0, 0);
    EXPECT_ROUTE(r, "GET", "h", "/exact?format=xml&format=json", 0, 0);
    EXPECT_STATUS(r, "GET", "h", "/exact?format=jsonx", 404);
    EXPECT_STATUS(r, "GET", "h", "/exact?Format=json", 404); /* names are exact */
    EXPECT_STATUS(r, "GET", "h", "/exact?xformat=json", 404);
    EXPECT_STATUS(r, "GET", "h", "/exact", 404);
    EXPECT_ROUTE(r, "GET", "h", "/prefix?v=2.1", 0, 1);
    EXPECT_STATUS(r, "GET", "h", "/prefix?v=1.2", 404);
    EXPECT_STATUS(r, "GET", "h", "/prefix?v", 404);
    EXPECT_ROUTE(r, "GET", "h", "/regex?id=123", 0, 2);
    EXPECT_STATUS(r, "GET", "h", "/regex?id=123a", 404);
    EXPECT_STATUS(r, "GET", "h", "/regex?id=", 404);
    EXPECT_ROUTE(r, "GET", "h", "/present?debug", 0, 3);
    EXPECT_ROUTE(r, "GET", "h", "/present?x=1&debug=", 0, 3);
    EXPECT_STATUS(r, "GET", "h", "/present?debugx=1", 404);
    EXPECT_STATUS(r, "GET", "h", "/present?x=debug", 404);
    EXPECT_ROUTE(r, "GET", "h", "/notpresent?x=debug", 0, 4);
    EXPECT_ROUTE(r, "GET", "h", "/notpresent", 0, 4);
    EXPECT_STATUS(r, "GET", "h", "/notpresent?debug", 404);
    EXPECT_ROUTE(r, "GET", "h", "/raw?a b=x%20y", 0, 5); /* raw, never decoded */
    EXPECT_STATUS(r, "GET", "h", "/raw?a%20b=x%20y", 404);
    EXPECT_ROUTE(r, "GET", "h", "/notexact?format=xml", 0, 6);
    EXPECT_ROUTE(r, "GET", "h", "/notexact", 0, 6);
    EXPECT_STATUS(r, "GET", "h", "/notexact?format=json", 404);
    EXPECT_ROUTE_H(r, "GET", "h", "/both?a=1", xh, 0, 7);
    EXPECT_STATUS(r, "GET", "h", "/both?a=1", 404);
    EXPECT_STATUS_H(r, "GET", "h", "/both?a=2", xh, 404);
    EXPECT_ROUTE_H(r, "GET", "h", "/both?&&a=1&", xh, 0, 7);
    sl_router_free(r);
    snap_free(s);
}

static void test_bad_regex_errors(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *s = snap_new();
    Sluice__V1__RouteTable *t = add_table(s, "petstore", NULL, "/");
    add_route(t, "listPets", NULL, REGEX, "/pets");
    add_route(t, "getPet", NULL, REGEX, "/pets/[0-9");
    expect_build_error(s, "route table petstore route getPet: regex \"/pets/[0-9\": "
                          "missing terminating ] for character class at offset 10");
    snap_free(s);

    s = snap_new();
    t = add_table(s, "petstore", NULL, "/");
    Sluice__V1__Route *r = add_route(t, "getPet", NULL, EXACT, "/pets");
    add_match(r, false, "X-Version", "(v1", M_REGEX, false);
    expect_build_error(s, "route table petstore route getPet: header \"X-Version\" regex "
                          "\"(v1\": missing closing parenthesis at offset 3");
    snap_free(s);

    s = snap_new();
    t = add_table(s, "petstore", NULL, "/");
    r = add_route(t, "getPet", NULL, EXACT, "/pets");
    add_match(r, true, "id", "a{2,1}", M_REGEX, false);
    expect_build_error(s, "route table petstore route getPet: query parameter \"id\" regex "
                          "\"a{2,1}\": numbers out of order in {} quantifier at offset 5");
    snap_free(s);
}

static void test_other_build_errors(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *s;
    Sluice__V1__RouteTable *t;

    s = snap_new();
    add_route(add_table(s, "petstore", NULL, "/"), "getPet", NULL, TEMPLATE, "/pets/{id");
    expect_build_error(s, "route table petstore route getPet: path template \"/pets/{id\": "
                          "unbalanced '{'");
    snap_free(s);

    s = snap_new();
    add_route(add_table(s, "petstore", NULL, "/"), "", NULL, EXACT, "pets");
    expect_build_error(s, "route table petstore route #0: path \"pets\" must start with '/'");
    snap_free(s);

    s = snap_new();
    add_route(add_table(s, "petstore", NULL, "/v1/"), "x", NULL, EXACT, "/x");
    expect_build_error(s, "route table petstore: base path \"/v1/\" must not end with '/'");
    snap_free(s);

    s = snap_new();
    add_table(s, "petstore", NULL, "v1");
    expect_build_error(s, "route table petstore: base path \"v1\" must start with '/'");
    snap_free(s);

    s = snap_new();
    add_table(s, "petstore", "api.*.com", "/");
    expect_build_error(s, "route table petstore: host \"api.*.com\": '*' is only allowed as "
                          "\"*\" or a leading \"*.\"");
    snap_free(s);

    s = snap_new();
    add_table(s, "", "*.", "/");
    expect_build_error(s, "route table #0: host \"*.\": '*' is only allowed as \"*\" or a "
                          "leading \"*.\"");
    snap_free(s);

    s = snap_new();
    add_route(add_table(s, "petstore", NULL, "/"), "x", "GET,BAD METHOD", EXACT, "/x");
    expect_build_error(s, "route table petstore route x: method \"BAD METHOD\" is not a valid "
                          "HTTP method name");
    snap_free(s);

    s = snap_new();
    t = add_table(s, "petstore", NULL, "/");
    Sluice__V1__Route *r = add_route(t, "x", NULL, EXACT, "/x");
    r->path_kind = (Sluice__V1__Route__PathKind)9;
    expect_build_error(s, "route table petstore route x: unknown path kind 9");
    snap_free(s);

    s = snap_new();
    r = add_route(add_table(s, "petstore", NULL, "/"), "x", NULL, EXACT, "/x");
    add_match(r, false, "", "v", M_EXACT, false);
    expect_build_error(s, "route table petstore route x: header match without a name");
    snap_free(s);

    s = snap_new();
    r = add_route(add_table(s, "petstore", NULL, "/"), "x", NULL, EXACT, "/x");
    add_match(r, true, "q", "v", 7, false);
    expect_build_error(s, "route table petstore route x: query parameter \"q\": unknown match "
                          "kind 7");
    snap_free(s);

    /* The depth bound: base + route segments. */
    s = snap_new();
    char deep[2 * (SL_ROUTER_MAX_DEPTH + 1) + 1];
    for (int i = 0; i <= SL_ROUTER_MAX_DEPTH; i++)
        memcpy(deep + 2 * i, "/a", 2);
    deep[2 * (SL_ROUTER_MAX_DEPTH + 1)] = '\0';
    add_route(add_table(s, "deep", NULL, "/"), "d", NULL, PREFIX, deep);
    add_route(s->route_tables[0], "d2", NULL, EXACT, deep);
    expect_build_error(s, "route table deep route d2: path has more than 128 segments (base "
                          "path included)");
    /* Exactly at the bound is fine. */
    s->route_tables[0]->routes[1]->path[2 * SL_ROUTER_MAX_DEPTH] = '\0';
    sl_router_t *rt = build_ok(s);
    EXPECT_ROUTE(rt, "GET", "h", s->route_tables[0]->routes[1]->path, 0, 1);
    EXPECT_ROUTE(rt, "GET", "h", deep, 0, 0);
    /* A request far deeper than any trie: only the prefix can match it. */
    char deeper[2 * 300 + 1];
    for (int i = 0; i < 300; i++)
        memcpy(deeper + 2 * i, "/a", 2);
    deeper[2 * 300] = '\0';
    EXPECT_ROUTE(rt, "GET", "h", deeper, 0, 0);
    deeper[2 * 300 - 1] = 'b';
    EXPECT_ROUTE(rt, "GET", "h", deeper, 0, 0);
    deeper[2 * SL_ROUTER_MAX_DEPTH + 1] = 'b'; /* segment 129 no longer "a..." */
    EXPECT_STATUS(rt, "GET", "h", deeper, 404);
    sl_router_free(rt);
    snap_free(s);

    /* A NULL err buffer is allowed. */
    s = snap_new();
    add_table(s, "x", "a*", "/");
    assert_null(sl_router_build(s, NULL, 0));
    snap_free(s);
}

static void test_regex_match_limit_is_no_match(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *s = snap_new();
    Sluice__V1__RouteTable *t = add_table(s, "t", NULL, "/");
    add_route(t, "evil", NULL, REGEX, "/(a|aa)+");
    add_route(t, "fallback", NULL, PREFIX, "/zzz");
    sl_router_t *r = build_ok(s);
    char path[64] = "/";
    memset(path + 1, 'a', 30);
    strcat(path, "!");
    /* Exponential backtracking: PCRE2's own default limit (10,000,000)
     * would spend tens of ms here; the router's limit stops it early and
     * the request is simply not routed by that regex. */
    pcre2_match_data *md = sl_router_match_data();
    assert_non_null(md);
    assert_int_equal(
        pcre2_jit_match(route_at(r, 0)->path_re, (PCRE2_SPTR)path, strlen(path), 0, 0, md, r->mctx),
        PCRE2_ERROR_MATCHLIMIT);
    EXPECT_STATUS(r, "GET", "h", path, 404);
    EXPECT_ROUTE(r, "GET", "h", "/aaaaaa", 0, 0);
    sl_router_free(r);
    snap_free(s);
}

/* 10,000 routes over 100 Apis, 4 host kinds and 100 base paths; every one
 * must resolve to itself. */
static Sluice__V1__Snapshot *big_snapshot(int tables, int routes_per_table)
{
    Sluice__V1__Snapshot *s = snap_new();
    char name[64], base[64], path[64], host[64];
    for (int ti = 0; ti < tables; ti++) {
        snprintf(name, sizeof name, "api%d", ti);
        snprintf(base, sizeof base, "/svc%d/v%d", ti / 4, ti % 4);
        switch (ti % 4) {
        case 0:
            snprintf(host, sizeof host, "api%d.example.com", ti);
            break;
        case 1:
            snprintf(host, sizeof host, "*.zone%d.example.com", ti);
            break;
        default:
            snprintf(host, sizeof host, "*");
            break;
        }
        Sluice__V1__RouteTable *t = add_table(s, name, host, base);
        for (int ri = 0; ri < routes_per_table; ri++) {
            snprintf(name, sizeof name, "op%d", ri);
            if (ri % 2 == 0) {
                snprintf(path, sizeof path, "/res%d", ri);
                add_route(t, name, ri % 4 == 0 ? "GET" : "POST", EXACT, path);
            } else {
                snprintf(path, sizeof path, "/res%d/{id}/items/{item}", ri);
                add_route(t, name, NULL, TEMPLATE, path);
            }
        }
    }
    return s;
}

static void test_10000_routes_all_resolve(void **state)
{
    (void)state;
    const int tables = 100, per = 100;
    Sluice__V1__Snapshot *s = big_snapshot(tables, per);
    sl_router_t *r = build_ok(s);
    char host[64], path[128];
    int checked = 0;
    for (int ti = 0; ti < tables; ti++) {
        switch (ti % 4) {
        case 0:
            snprintf(host, sizeof host, "API%d.example.com", ti);
            break;
        case 1:
            snprintf(host, sizeof host, "node-7.zone%d.example.com", ti);
            break;
        default:
            snprintf(host, sizeof host, "anything.example.net");
            break;
        }
        for (int ri = 0; ri < per; ri++) {
            const char *method = ri % 4 == 0 ? "GET" : ri % 2 == 0 ? "POST" : "PUT";
            if (ri % 2 == 0)
                snprintf(path, sizeof path, "/svc%d/v%d/res%d", ti / 4, ti % 4, ri);
            else
                snprintf(path, sizeof path, "/svc%d/v%d/res%d/%d/items/x%d", ti / 4, ti % 4, ri,
                         ti * 1000 + ri, ri);
            sl_router_result_t res;
            int rc = do_match(r, method, host, path, NULL, &res);
            if (rc != SL_OK || res.table_index != (uint32_t)ti || res.route_index != (uint32_t)ri)
                fail_msg("%s %s%s: rc %d route %u/%u, want %d/%d", method, host, path, rc,
                         res.table_index, res.route_index, ti, ri);
            assert_int_equal(res.base_path_len, strlen(path) - strlen(strstr(path, "/res")));
            checked++;
        }
    }
    assert_int_equal(checked, 10000);
    /* And near misses do not resolve. */
    EXPECT_STATUS(r, "GET", "api0.example.com", "/svc0/v0/res0/", 404);
    EXPECT_STATUS(r, "GET", "api0.example.com", "/svc0/v0/res1/1/items", 404);
    EXPECT_405(r, "PUT", "api0.example.com", "/svc0/v0/res0", SL_METHOD_GET);
    /* api1's host is "*.zone1.example.com": without it only "*" tables. */
    EXPECT_STATUS(r, "PUT", "zone1.example.com", "/svc0/v1/res1/1/items/2", 404);
    sl_router_free(r);
    snap_free(s);
}

typedef struct {
    const sl_router_t *r;
    int failures;
} thread_arg_t;

static void *match_thread(void *p)
{
    thread_arg_t *a = p;
    for (int i = 0; i < 20000; i++) {
        char path[64];
        sl_router_result_t res;
        snprintf(path, sizeof path, "/items/%d", i);
        const char *const hv[] = {"x-n", i % 2 ? "odd" : "even", NULL};
        int rc = do_match(a->r, "GET", "h", path, hv, &res);
        if (rc != SL_OK || res.route_index != (uint32_t)(i % 2))
            a->failures++;
    }
    return NULL;
}

static void test_concurrent_readers(void **state)
{
    (void)state;
    Sluice__V1__Snapshot *s = snap_new();
    Sluice__V1__RouteTable *t = add_table(s, "t", NULL, "/");
    Sluice__V1__Route *r0 = add_route(t, "even", "GET", REGEX, "/items/[0-9]*[02468]");
    add_match(r0, false, "x-n", "e.*", M_REGEX, false);
    Sluice__V1__Route *r1 = add_route(t, "odd", "GET", REGEX, "/items/[0-9]*[13579]");
    add_match(r1, false, "x-n", "o.*", M_REGEX, false);
    sl_router_t *r = build_ok(s);
    pthread_t th[4];
    thread_arg_t args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thread_arg_t){r, 0};
        assert_int_equal(pthread_create(&th[i], NULL, match_thread, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(args[i].failures, 0);
    }
    sl_router_free(r);
    snap_free(s);
}


/* ------------------------------------------------------------------------ */
/* sl_router_update: the router of a changed snapshot made from the previous */
/* one answers exactly as a router built whole                               */

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static const char *const seg_pool[] = {"a", "b", "users", "v1", "{id}",
                                       "a-segment-longer-than-twelve", "x"};
static const char *const base_pool[] = {"/", "/a", "/a/b", "/users", "/v1",
                                        "/a-segment-longer-than-twelve"};
static const char *const host_pool[] = {NULL, "x.com", "*.com", "x.com,*.com"};
static const char *const method_pool[] = {NULL, "GET", "POST", "GET,PUT"};

/* Tables made with their own base path ("/u<id>..."), so that the trie
 * and its maps span many chunks (router.c, cvec_t), and the largest id. */
static bool unique_bases;
static unsigned unique_max;

/* A table with random routes, detached (not in any snapshot). */
static Sluice__V1__RouteTable *random_table(unsigned id, bool regex)
{
    Sluice__V1__Snapshot *tmp = snap_new();
    char name[32], base[64];
    snprintf(name, sizeof name, "t%u", id);
    const char *b = base_pool[rnd(6)];
    if (unique_bases) {
        snprintf(base, sizeof base, "/u%u%s", id, strcmp(b, "/") ? b : "");
        b = base;
        unique_max = id > unique_max ? id : unique_max;
    }
    Sluice__V1__RouteTable *t = add_table(tmp, name, host_pool[rnd(4)], b);
    unsigned n = 1 + rnd(6);
    for (unsigned i = 0; i < n; i++) {
        char path[128] = "", rname[16];
        int kind = (int[]){EXACT, TEMPLATE, PREFIX}[rnd(3)];
        unsigned segs = rnd(4);
        for (unsigned k = 0; k < segs || (!segs && !path[0]); k++) {
            const char *seg = segs ? seg_pool[rnd(7)] : "";
            char param[16];
            if (seg[0] == '{') { /* distinct names: a template names each once */
                snprintf(param, sizeof param, "{p%u}", k);
                seg = kind == TEMPLATE ? param : "b";
            }
            strcat(path, "/");
            strcat(path, seg);
        }
        if (kind == PREFIX && rnd(2))
            strcat(path, "us"); /* a partial segment */
        if (regex && i == 0) {
            kind = REGEX;
            snprintf(path, sizeof path, "/re/[0-9]+");
            free(t->base_path);
            t->base_path = xstrdup("/");
        }
        snprintf(rname, sizeof rname, "r%u", i);
        /* The regex route answers any GET of /re/<digits> (what the
         * fallback test asks), whatever the random draws. */
        bool plain = regex && i == 0;
        const char *methods = method_pool[rnd(4)];
        Sluice__V1__Route *r = add_route(t, rname, plain ? NULL : methods, kind, path);
        if (rnd(4) == 0 && !plain)
            add_match(r, false, rnd(2) ? "X-V" : "x-version-header-long", "1", M_EXACT, false);
        if (rnd(6) == 0 && !plain)
            add_match(r, true, "q", "1", M_PRESENT, false);
    }
    free(tmp->route_tables);
    tmp->route_tables = NULL;
    tmp->n_route_tables = 0;
    snap_free(tmp);
    return t;
}

/* A snapshot that points at tables it does not own. */
static Sluice__V1__Snapshot *view_of(Sluice__V1__RouteTable **tables, size_t n)
{
    Sluice__V1__Snapshot *s = snap_new();
    s->route_tables = calloc(n ? n : 1, sizeof *s->route_tables);
    assert_non_null(s->route_tables);
    memcpy(s->route_tables, tables, n * sizeof *tables);
    s->n_route_tables = n;
    return s;
}

static void view_free(Sluice__V1__Snapshot *s)
{
    free(s->route_tables);
    free(s);
}

static unsigned answers[3]; /* routed, 405, 404: the comparison is not only of 404s */

/* A request path for a route: its base path and path, parameters filled
 * in, sometimes cut short (random_cut). */
static void route_target(const char *path, const char *base, size_t base_len, char *out,
                         size_t outlen, bool random_cut)
{
    const char *p = path ? path : "";
    const char *stop = !random_cut || rnd(3) ? p + strlen(p) : p + rnd((uint32_t)strlen(p) + 1);
    size_t at = (size_t)snprintf(out, outlen, "%.*s", (int)base_len, base);
    while (p < stop && at < outlen - 8) {
        if (*p == '{') {
            out[at++] = '7';
            while (*p && *p != '}')
                p++;
            if (*p)
                p++;
        } else {
            out[at++] = *p++;
        }
    }
    out[at] = '\0';
}

/* Paths of routes of tables removed lately (update_differential). */
static char dead_paths[256][160];
static uint32_t n_dead_paths, dead_at;

static void remember_dead(const Sluice__V1__RouteTable *t)
{
    const char *base = t->base_path && strcmp(t->base_path, "/") ? t->base_path : "";
    for (size_t i = 0; i < t->n_routes; i++) {
        route_target(t->routes[i]->path, base, strlen(base), dead_paths[dead_at],
                     sizeof dead_paths[0], false);
        dead_at = (dead_at + 1) % 256;
        n_dead_paths += n_dead_paths < 256;
    }
}

static void expect_same_answers(const sl_router_t *a, const sl_router_t *b, unsigned step)
{
    static const char *const hosts[] = {"x.com", "y.com", "X.COM", "other.org"};
    static const char *const methods[] = {"GET", "POST", "PUT", "DELETE"};
    static const char *const extra[] = {"123", "zz", "users", "a", "b", ""};
    for (unsigned i = 0; i < 400; i++) {
        char target[256] = "";
        unsigned segs = rnd(5);
        if (unique_bases && rnd(4) != 0) {
            /* Mostly the path of some route (parameters filled in), or
             * its base path with something else under it; now and then
             * that of a route of a removed table. */
            if (n_dead_paths && rnd(3) == 0) {
                snprintf(target, sizeof target, "%s", dead_paths[rnd(n_dead_paths)]);
            } else {
                const croute_t *rt = route_at(b, rnd(b->n_routes));
                route_target(rt->pb->path, rt->base, rt->base_len, target, sizeof target, true);
            }
            segs = rnd(4) == 0;
        }
        for (unsigned k = 0; k < segs; k++) {
            strcat(target, "/");
            strcat(target, rnd(3) ? seg_pool[rnd(7)] : extra[rnd(6)]);
        }
        if (!segs || rnd(8) == 0)
            strcat(target, "/");
        if (rnd(5) == 0)
            strcat(target, "?q=1");
        const char *hdr[] = {"x-v", "1", NULL};
        const char *host = hosts[rnd(4)], *method = methods[rnd(4)];
        const char *const *h = rnd(3) == 0 ? hdr : NULL;
        sl_router_result_t ra, rb;
        int ca = do_match(a, method, host, target, h, &ra);
        int cb = do_match(b, method, host, target, h, &rb);
        bool same = ca == cb &&
                    (ca != SL_OK || (ra.table_index == rb.table_index &&
                                     ra.route_index == rb.route_index &&
                                     ra.base_path_len == rb.base_path_len)) &&
                    (ca != 405 || ra.allow_methods == rb.allow_methods);
        answers[ca == SL_OK ? 0 : ca == 405 ? 1 : 2]++;
        if (!same)
            fail_msg("step %u: %s %s%s: updated router %d (%u/%u allow %x), whole build %d "
                     "(%u/%u allow %x)",
                     step, method, host, target, ca, ra.table_index, ra.route_index,
                     ra.allow_methods, cb, rb.table_index, rb.route_index, rb.allow_methods);
    }
}

/* `steps` random changes (an Api changed, removed or added) from `start`
 * tables, at most `maxt`: after each, the updated router and one built
 * whole give the same answers. */
static void update_differential(size_t maxt, size_t start, unsigned steps)
{
    Sluice__V1__RouteTable **tables = calloc(maxt, sizeof *tables);
    Sluice__V1__RouteTable **gone = calloc(maxt * 4, sizeof *gone);
    assert_true(tables && gone);
    const size_t MAXT = maxt;
    size_t n = 0, ngone = 0;
    unsigned next_id = 0;
    /* Every host of the pool appears from the start: its bucket exists. */
    while (n < start)
        tables[n++] = random_table(next_id++, false);
    const char *all_hosts[] = {"x.com", "*.com"};
    Sluice__V1__Snapshot *tmp = snap_new();
    tables[n++] = add_table(tmp, "hosts", "x.com,*.com", "/h");
    add_route(tables[n - 1], "r0", NULL, EXACT, "/h");
    free(tmp->route_tables);
    tmp->route_tables = NULL;
    tmp->n_route_tables = 0;
    snap_free(tmp);
    (void)all_hosts;

    Sluice__V1__Snapshot *snap = view_of(tables, n);
    sl_router_t *cur = build_ok(snap);
    if (unique_bases && (cur->routes.n_c < 4 || cur->nodes.n_c < 3 || cur->entries.n_c < 2 ||
                         cur->children.slots.n_c < 4))
        fail_msg("chunks: routes %u, nodes %u, entries %u, slots %u", cur->routes.n_c,
                 cur->nodes.n_c, cur->entries.n_c, cur->children.slots.n_c);
    unsigned patched = 0;
    for (unsigned step = 0; step < steps; step++) {
        unsigned op = rnd(3);
        if (op == 0 && n > 2) { /* an Api changed: a new message in its place */
            size_t i = rnd((uint32_t)n);
            gone[ngone++] = tables[i];
            tables[i] = random_table(next_id++, false);
        } else if (op == 1 && n > 2) { /* an Api removed */
            size_t i = rnd((uint32_t)n);
            gone[ngone++] = tables[i];
            memmove(&tables[i], &tables[i + 1], (n - i - 1) * sizeof *tables);
            n--;
        } else if (n < MAXT) { /* an Api added anywhere: later indexes shift */
            size_t i = rnd((uint32_t)n + 1);
            memmove(&tables[i + 1], &tables[i], (n - i) * sizeof *tables);
            tables[i] = random_table(next_id++, false);
            n++;
        }
        Sluice__V1__Snapshot *next = view_of(tables, n);
        char err[512];
        sl_router_t *upd = sl_router_update(cur, next, err, sizeof err);
        if (!upd)
            fail_msg("step %u: sl_router_update: %s", step, err);
        patched += sl_router_patches(upd) > 0;
        sl_router_t *whole = build_ok(next);
        /* The previous router and the tables only it used go first: the
         * updated one must not need them (ASan says so). */
        sl_router_free(cur);
        view_free(snap);
        for (size_t g = 0; g < ngone; g++) {
            remember_dead(gone[g]);
            sluice__v1__route_table__free_unpacked(gone[g], NULL);
        }
        ngone = 0;
        expect_same_answers(upd, whole, step);
        sl_router_free(whole);
        cur = upd;
        snap = next;
    }
    /* Most steps were patches (the rest: the garbage bound, rebuilt whole). */
    assert_true(patched > steps * 2 / 3);
    sl_router_free(cur);
    view_free(snap);
    for (size_t i = 0; i < n; i++)
        sluice__v1__route_table__free_unpacked(tables[i], NULL);
    free(tables);
    free(gone);
}

static void test_update_answers_as_a_whole_build(void **state)
{
    (void)state;
    memset(answers, 0, sizeof answers);
    update_differential(24, 10, 120);
    if (answers[0] < 2000 || answers[1] < 100 || answers[2] < 2000)
        fail_msg("answers: %u routed, %u 405, %u 404", answers[0], answers[1], answers[2]);
}

/* The same over tables spanning many chunks of every array: routes (256
 * per chunk), trie nodes, entries and map slots (1,024), so that patches
 * copy some chunks, share the others and write across chunk edges. */
static void test_update_across_chunks(void **state)
{
    (void)state;
    memset(answers, 0, sizeof answers);
    unique_bases = true;
    update_differential(900, 700, 60);
    unique_bases = false;
    print_message("answers: %u routed, %u 405, %u 404\n", answers[0], answers[1], answers[2]);
    if (answers[0] < 1000 || answers[1] < 200 || answers[2] < 3000)
        fail_msg("answers: %u routed, %u 405, %u 404", answers[0], answers[1], answers[2]);
}

static void test_update_falls_back_to_a_whole_build(void **state)
{
    (void)state;
    Sluice__V1__RouteTable *tables[3] = {random_table(100, false), random_table(101, false), NULL};
    Sluice__V1__Snapshot *s1 = view_of(tables, 2);
    sl_router_t *r1 = build_ok(s1);
    char err[512];

    /* A table with a regex route: built whole, same answers. */
    tables[2] = random_table(102, true);
    Sluice__V1__Snapshot *s2 = view_of(tables, 3);
    sl_router_t *r2 = sl_router_update(r1, s2, err, sizeof err);
    assert_non_null(r2);
    assert_int_equal(sl_router_patches(r2), 0);
    EXPECT_ROUTE(r2, "GET", "x.com", "/re/42", 2, 0);

    /* A host no table had: a new bucket, built whole. */
    Sluice__V1__Snapshot *tmp = snap_new();
    Sluice__V1__RouteTable *hosted = add_table(tmp, "new-host", "new.example", "/");
    add_route(hosted, "only", NULL, EXACT, "/only");
    free(tmp->route_tables);
    tmp->route_tables = NULL;
    tmp->n_route_tables = 0;
    snap_free(tmp);
    Sluice__V1__RouteTable *t3[4] = {tables[0], tables[1], tables[2], hosted};
    Sluice__V1__Snapshot *s3 = view_of(t3, 4);
    sl_router_t *r3 = sl_router_update(r2, s3, err, sizeof err);
    assert_non_null(r3);
    assert_int_equal(sl_router_patches(r3), 0);
    EXPECT_ROUTE(r3, "GET", "new.example", "/only", 3, 0);

    /* Nothing changed: a patch with nothing in it, same answers. */
    Sluice__V1__Snapshot *s4 = view_of(t3, 4);
    sl_router_t *r4 = sl_router_update(r3, s4, err, sizeof err);
    assert_non_null(r4);
    assert_int_equal(sl_router_patches(r4), 1);
    EXPECT_ROUTE(r4, "GET", "new.example", "/only", 3, 0);
    EXPECT_ROUTE(r4, "GET", "x.com", "/re/42", 2, 0);

    /* Kept tables in another order: built whole. */
    Sluice__V1__RouteTable *t5[4] = {tables[1], tables[0], tables[2], hosted};
    Sluice__V1__Snapshot *s5 = view_of(t5, 4);
    sl_router_t *r5 = sl_router_update(r4, s5, err, sizeof err);
    assert_non_null(r5);
    assert_int_equal(sl_router_patches(r5), 0);
    EXPECT_ROUTE(r5, "GET", "new.example", "/only", 3, 0);

    /* A new table that cannot be compiled: the build's error. */
    tmp = snap_new();
    Sluice__V1__RouteTable *bad = add_table(tmp, "bad", NULL, "/bad/");
    add_route(bad, "r", NULL, EXACT, "/x");
    free(tmp->route_tables);
    tmp->route_tables = NULL;
    tmp->n_route_tables = 0;
    snap_free(tmp);
    Sluice__V1__RouteTable *t6[5] = {tables[1], tables[0], tables[2], hosted, bad};
    Sluice__V1__Snapshot *s6 = view_of(t6, 5);
    assert_null(sl_router_update(r5, s6, err, sizeof err));
    assert_non_null(strstr(err, "route table bad: base path \"/bad/\" must not end with '/'"));

    sl_router_t *rs[] = {r1, r2, r3, r4, r5};
    for (size_t i = 0; i < 5; i++)
        sl_router_free(rs[i]);
    Sluice__V1__Snapshot *ss[] = {s1, s2, s3, s4, s5, s6};
    for (size_t i = 0; i < 6; i++)
        view_free(ss[i]);
    for (size_t i = 0; i < 3; i++)
        sluice__v1__route_table__free_unpacked(tables[i], NULL);
    sluice__v1__route_table__free_unpacked(hosted, NULL);
    sluice__v1__route_table__free_unpacked(bad, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_snapshot_is_404),
        cmocka_unit_test(test_exact_beats_template_beats_prefix_beats_regex),
        cmocka_unit_test(test_exact_and_template_same_node),
        cmocka_unit_test(test_long_segments),
        cmocka_unit_test(test_literal_beats_param_left_to_right),
        cmocka_unit_test(test_longest_prefix_wins),
        cmocka_unit_test(test_more_matches_first_then_declaration_order),
        cmocka_unit_test(test_regex_declaration_order_and_same_pattern),
        cmocka_unit_test(test_regex_is_anchored),
        cmocka_unit_test(test_hosts_exact_wildcard_star),
        cmocka_unit_test(test_host_fallback_to_less_specific_bucket),
        cmocka_unit_test(test_base_path),
        cmocka_unit_test(test_405_allow_bits),
        cmocka_unit_test(test_wrong_method_does_not_hide_lower_precedence),
        cmocka_unit_test(test_header_matches),
        cmocka_unit_test(test_query_matches),
        cmocka_unit_test(test_bad_regex_errors),
        cmocka_unit_test(test_other_build_errors),
        cmocka_unit_test(test_regex_match_limit_is_no_match),
        cmocka_unit_test(test_10000_routes_all_resolve),
        cmocka_unit_test(test_concurrent_readers),
        cmocka_unit_test(test_update_answers_as_a_whole_build),
        cmocka_unit_test(test_update_across_chunks),
        cmocka_unit_test(test_update_falls_back_to_a_whole_build),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
