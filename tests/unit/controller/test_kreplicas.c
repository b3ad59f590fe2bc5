/*
 * controller/kreplicas.c: the Programmed condition over several controller
 * replicas. Counts add up over live replicas only; a replica that lags
 * counts its runtimes but not as programmed; a rejection anywhere shows;
 * entries of replicas that are gone are removed; and every replica
 * computes the same status from the same entries (no write ping-pong).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "kreplicas.h"

#include <string.h>

static json_t *doc(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    if (!j)
        fail_msg("bad test JSON: %s", e.text);
    return j;
}

/* A replica's own status as core.c computes it. */
static json_t *own(int version, int runtimes, int programmed, const char *reason,
                   const char *message)
{
    return json_pack(
        "{s:[{s:s, s:s, s:s}, {s:s, s:s, s:s, s:s, s:i}], s:[{s:s, s:i, s:i, s:i}], "
        "s:s}",
        "conditions", "type", "Accepted", "status", "True", "reason", "Accepted", "type",
        "Programmed", "status", !strcmp(reason, "Programmed") ? "True" : "False", "reason", reason,
        "message", message, "observedGeneration", 3, "fleets", "fleet", "default", "version",
        version, "runtimes", runtimes, "programmed", programmed, "configResourceVersion", "42");
}

static json_t *programmed(json_t *st)
{
    return json_array_get(json_object_get(st, "conditions"), 1);
}

static const char *s(json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

static void test_counts_add_up_over_live_replicas(void **state)
{
    (void)state;
    json_t *live = doc("{\"ctl-a\": true, \"ctl-b\": true}");
    json_t *a = own(5, 2, 2, "Programmed", "fleet default: 2 of 2 runtimes run version 5");
    json_t *b = own(5, 1, 1, "Programmed", "fleet default: 1 of 1 runtime runs version 5");
    /* a writes first (nothing on the server), then b sees a's entry. */
    json_t *pa = sl_kreplicas_status(a, NULL, "ctl-a", live);
    json_t *pb = sl_kreplicas_status(b, pa, "ctl-b", live);
    json_t *f = json_array_get(json_object_get(pb, "fleets"), 0);
    assert_int_equal(json_integer_value(json_object_get(f, "runtimes")), 3);
    assert_int_equal(json_integer_value(json_object_get(f, "programmed")), 3);
    assert_string_equal(s(programmed(pb), "status"), "True");
    assert_string_equal(s(programmed(pb), "message"),
                        "fleet default: 3 of 3 runtimes run version 5 (2 controller replicas)");
    /* a, seeing both entries now, computes exactly the same. */
    json_t *server = json_deep_copy(pa);
    json_object_update(json_object_get(server, "replicas"), json_object_get(pb, "replicas"));
    json_object_set(server, "fleets", json_object_get(pb, "fleets"));
    json_object_set(server, "conditions", json_object_get(pb, "conditions"));
    json_t *pa2 = sl_kreplicas_status(a, server, "ctl-a", live);
    assert_true(json_equal(json_object_get(pa2, "conditions"), json_object_get(pb, "conditions")));
    assert_true(json_equal(json_object_get(pa2, "fleets"), json_object_get(pb, "fleets")));
    assert_true(sl_kreplicas_unchanged(server, pa2));
    /* The Accepted condition and other fields stay a's own. */
    assert_string_equal(s(json_array_get(json_object_get(pa2, "conditions"), 0), "type"),
                        "Accepted");
    assert_string_equal(s(pa2, "configResourceVersion"), "42");
    json_decref(pa2);
    json_decref(server);
    json_decref(pa);
    json_decref(pb);
    json_decref(a);
    json_decref(b);
    json_decref(live);
}

static void test_lagging_gone_and_rejected_replicas(void **state)
{
    (void)state;
    json_t *server = doc(
        "{\"replicas\": {"
        "\"ctl-b\": {\"fleets\": [{\"fleet\": \"default\", \"version\": 4, \"runtimes\": 1, "
        "\"programmed\": 1}], \"programmed\": {\"status\": \"True\", \"reason\": \"Programmed\", "
        "\"message\": \"m\", \"observedGeneration\": 2}},"
        "\"ctl-gone\": {\"fleets\": [{\"fleet\": \"default\", \"version\": 5, \"runtimes\": 7, "
        "\"programmed\": 7}], \"programmed\": {\"status\": \"True\", \"reason\": \"Programmed\", "
        "\"message\": \"m\", \"observedGeneration\": 3}}}}");
    json_t *live = doc("{\"ctl-a\": true, \"ctl-b\": true}");
    json_t *a = own(5, 2, 2, "Programmed", "x");
    json_t *p = sl_kreplicas_status(a, server, "ctl-a", live);
    /* b lags (version 4): its runtime is counted, not as programmed; the
     * replica that is gone is neither counted nor kept. */
    json_t *f = json_array_get(json_object_get(p, "fleets"), 0);
    assert_int_equal(json_integer_value(json_object_get(f, "version")), 5);
    assert_int_equal(json_integer_value(json_object_get(f, "runtimes")), 3);
    assert_int_equal(json_integer_value(json_object_get(f, "programmed")), 2);
    assert_string_equal(s(programmed(p), "reason"), "Pending");
    assert_int_equal(json_integer_value(json_object_get(programmed(p), "observedGeneration")), 2);
    json_t *reps = json_object_get(p, "replicas");
    assert_true(json_is_null(json_object_get(reps, "ctl-gone")));
    assert_null(json_object_get(reps, "ctl-b")); /* b's entry is b's to write */
    assert_non_null(json_object_get(reps, "ctl-a"));
    assert_false(sl_kreplicas_unchanged(server, p));
    json_decref(p);

    /* A rejection by b's runtimes shows whatever a's own runtimes do. */
    json_t *bp = json_object_get(json_object_get(json_object_get(server, "replicas"), "ctl-b"),
                                 "programmed");
    json_object_set_new(bp, "status", json_string("False"));
    json_object_set_new(bp, "reason", json_string("Rejected"));
    json_object_set_new(bp, "message", json_string("1 runtime rejected it: rt-9 NACKed"));
    p = sl_kreplicas_status(a, server, "ctl-a", live);
    assert_string_equal(s(programmed(p), "reason"), "Rejected");
    assert_string_equal(s(programmed(p), "message"), "1 runtime rejected it: rt-9 NACKed");
    json_decref(p);
    json_decref(a);
    json_decref(live);
    json_decref(server);
}

static void test_objects_without_programmed_and_slices(void **state)
{
    (void)state;
    json_t *backend = doc("{\"conditions\": [{\"type\": \"Accepted\", \"status\": \"True\"}]}");
    json_t *live = doc("{}");
    json_t *p = sl_kreplicas_status(backend, NULL, "ctl-a", live);
    assert_true(json_equal(p, backend));
    json_decref(p);
    json_decref(backend);

    json_t *list = doc(
        "{\"items\": [{\"endpoints\": ["
        "{\"conditions\": {\"ready\": true}, \"targetRef\": {\"kind\": \"Pod\", \"name\": \"a\"}},"
        "{\"conditions\": {\"ready\": false}, \"targetRef\": {\"kind\": \"Pod\", \"name\": \"b\"}},"
        "{\"targetRef\": {\"kind\": \"Pod\", \"name\": \"c\"}},"
        "{\"conditions\": {\"ready\": true}, \"targetRef\": {\"kind\": \"Node\", \"name\": \"d\"}}"
        "]}, {\"endpoints\": [{\"conditions\": {\"ready\": true}, \"targetRef\": "
        "{\"kind\": \"Pod\", \"name\": \"a\"}}]}]}");
    assert_int_equal(sl_kreplicas_from_slices(list, live), 2);
    assert_non_null(json_object_get(live, "a"));
    assert_non_null(json_object_get(live, "c"));
    assert_null(json_object_get(live, "b"));
    assert_null(json_object_get(live, "d"));
    json_decref(list);
    json_decref(live);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_add_up_over_live_replicas),
        cmocka_unit_test(test_lagging_gone_and_rejected_replicas),
        cmocka_unit_test(test_objects_without_programmed_and_slices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
