/*
 * Unit tests of runtime/proxy/route_rules.c as a pure function: attributes
 * in, rule and ordered backends out (the decision API calls it the same
 * way). The Routing message is built by hand; clusters are stand-ins the
 * find callback resolves by name.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "generation.h"
#include "route_rules.h"

static sl_gen_cluster_t clusters[3];
static Sluice__V1__Cluster cpb[3];
static const char *const names[3] = {"ns/a", "ns/b", "ns/c"};

static sl_gen_cluster_t *find(void *ctx, const char *name)
{
    (void)ctx;
    for (int i = 0; i < 3; i++)
        if (strcmp(names[i], name) == 0)
            return &clusters[i];
    return NULL;
}

static Sluice__V1__RouteMatch *cond(Sluice__V1__RouteMatch__Attr attr, const char *name,
                                    Sluice__V1__RouteMatch__Op op, char **values, size_t n,
                                    double number)
{
    static Sluice__V1__RouteMatch pool[16];
    static int used;
    Sluice__V1__RouteMatch *m = &pool[used++];
    sluice__v1__route_match__init(m);
    m->attr = attr;
    m->name = (char *)name;
    m->op = op;
    m->values = values;
    m->n_values = n;
    m->number = number;
    return m;
}

static Sluice__V1__RouteOutput *out1(char **clusters_, size_t n, uint32_t weight,
                                     Sluice__V1__RouteOutput__Target *t, Sluice__V1__RouteOutput *o,
                                     Sluice__V1__RouteOutput__Target **tp)
{
    sluice__v1__route_output__init(o);
    sluice__v1__route_output__target__init(t);
    t->clusters = clusters_;
    t->n_clusters = n;
    t->weight = weight;
    tp[0] = t;
    o->targets = tp;
    o->n_targets = 1;
    return o;
}

static void setup_clusters(void)
{
    for (int i = 0; i < 3; i++) {
        sluice__v1__cluster__init(&cpb[i]);
        cpb[i].name = (char *)names[i];
        clusters[i].pb = &cpb[i];
    }
}

static void test_rules_pick_and_missing_is_false(void **state)
{
    (void)state;
    setup_clusters();
    static char *eu[] = {"EUR", "GBP"}, *on[] = {"on"}, *net[] = {"10.0.0.0/8", "::1"};
    static char *cb[] = {"ns/b"}, *cc[] = {"ns/c", "ns/a"}, *ca[] = {"ns/a"};
    Sluice__V1__RouteMatch *m0[] = {cond(SLUICE__V1__ROUTE_MATCH__ATTR__HEADER, "x-canary",
                                         SLUICE__V1__ROUTE_MATCH__OP__EQUALS, on, 1, 0)};
    Sluice__V1__RouteMatch *m1[] = {cond(SLUICE__V1__ROUTE_MATCH__ATTR__QUERY, "cur",
                                         SLUICE__V1__ROUTE_MATCH__OP__IN, eu, 2, 0),
                                    cond(SLUICE__V1__ROUTE_MATCH__ATTR__CLIENT_IP, "",
                                         SLUICE__V1__ROUTE_MATCH__OP__IN, net, 2, 0)};
    Sluice__V1__RouteOutput o0, o1, od;
    Sluice__V1__RouteOutput__Target t0, t1, td, *tp0[1], *tp1[1], *tpd[1];
    Sluice__V1__RouteRule r0 = SLUICE__V1__ROUTE_RULE__INIT, r1 = SLUICE__V1__ROUTE_RULE__INIT;
    r0.name = "canary";
    r0.match = m0;
    r0.n_match = 1;
    r0.output = out1(cb, 1, 1, &t0, &o0, tp0);
    r1.match = m1;
    r1.n_match = 2;
    r1.output = out1(cc, 2, 1, &t1, &o1, tp1);
    Sluice__V1__RouteRule *rules[] = {&r0, &r1};
    Sluice__V1__Routing pb = SLUICE__V1__ROUTING__INIT;
    pb.rules = rules;
    pb.n_rules = 2;
    pb.default_output = out1(ca, 1, 1, &td, &od, tpd);
    char err[300];
    sl_route_rules_t *rr =
        sl_route_rules_build(&pb, "/", 0, find, NULL, NULL, NULL, 0, NULL, 2, err, sizeof(err));
    assert_non_null(rr);

    sl_http1_header_t h[] = {{{"X-Canary", 8}, {"on", 2}}};
    sl_route_attrs_t a = {
        .method = {"GET", 3}, .headers = h, .num_headers = 1, .client_ip = "192.0.2.1"};
    sl_route_choice_t ch;
    sl_route_rules_eval(rr, &a, 0, &ch);
    assert_int_equal(ch.rule, 0);
    assert_string_equal(ch.rule_name, "canary");
    assert_ptr_equal(ch.clusters[0], &clusters[1]);

    a.num_headers = 0;
    a.query = (sl_str_t){"x=1&cur=GBP", 11};
    sl_route_rules_eval(rr, &a, 0, &ch);
    assert_int_equal(ch.rule, 1);
    assert_int_equal(ch.n, 2); /* the priority list, in order */
    assert_ptr_equal(ch.clusters[0], &clusters[2]);
    assert_ptr_equal(ch.clusters[1], &clusters[0]);

    a.query = (sl_str_t){"cur=USD", 7};
    a.client_ip = "10.1.2.3"; /* the second statement (ORed) */
    assert_int_equal(sl_route_rules_match(rr, &a), 1);
    a.client_ip = "::ffff:10.9.9.9";
    assert_int_equal(sl_route_rules_match(rr, &a), 1);
    a.client_ip = NULL; /* missing: false */
    assert_int_equal(sl_route_rules_match(rr, &a), -1);
    sl_route_rules_eval(rr, &a, 0, &ch);
    assert_string_equal(ch.rule_name, "default");
    assert_ptr_equal(ch.clusters[0], &clusters[0]);
    sl_route_rules_free(rr);
}

static void test_split_is_exact_per_worker(void **state)
{
    (void)state;
    setup_clusters();
    static char *ca[] = {"ns/a"}, *cb[] = {"ns/b"}, *cc[] = {"ns/c"};
    Sluice__V1__RouteOutput__Target t[3];
    Sluice__V1__RouteOutput__Target *tp[3] = {&t[0], &t[1], &t[2]};
    char **cl[3] = {ca, cb, cc};
    uint32_t w[3] = {90, 7, 3};
    for (int i = 0; i < 3; i++) {
        sluice__v1__route_output__target__init(&t[i]);
        t[i].clusters = cl[i];
        t[i].n_clusters = 1;
        t[i].weight = w[i];
    }
    Sluice__V1__RouteOutput o = SLUICE__V1__ROUTE_OUTPUT__INIT;
    o.targets = tp;
    o.n_targets = 3;
    Sluice__V1__Routing pb = SLUICE__V1__ROUTING__INIT;
    pb.default_output = &o;
    char err[300];
    sl_route_rules_t *rr =
        sl_route_rules_build(&pb, "/", 0, find, NULL, NULL, NULL, 0, NULL, 2, err, sizeof(err));
    assert_non_null(rr);
    int count[3] = {0};
    sl_route_attrs_t a = {0};
    for (int i = 0; i < 1000; i++) {
        sl_route_choice_t ch;
        sl_route_rules_eval(rr, &a, 1, &ch);
        assert_int_equal(ch.n, 3); /* the others are the fallback */
        for (int k = 0; k < 3; k++)
            if (ch.clusters[0] == &clusters[k])
                count[k]++;
    }
    assert_int_equal(count[0], 900);
    assert_int_equal(count[1], 70);
    assert_int_equal(count[2], 30);
    sl_route_rules_free(rr);
}

static void test_unknown_cluster_refused(void **state)
{
    (void)state;
    setup_clusters();
    static char *cx[] = {"ns/nope"};
    Sluice__V1__RouteOutput o;
    Sluice__V1__RouteOutput__Target t, *tp[1];
    Sluice__V1__Routing pb = SLUICE__V1__ROUTING__INIT;
    pb.default_output = out1(cx, 1, 1, &t, &o, tp);
    char err[300];
    assert_null(
        sl_route_rules_build(&pb, "/", 0, find, NULL, NULL, NULL, 0, NULL, 1, err, sizeof(err)));
    assert_non_null(strstr(err, "ns/nope"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rules_pick_and_missing_is_false),
        cmocka_unit_test(test_split_is_exact_per_worker),
        cmocka_unit_test(test_unknown_cluster_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
