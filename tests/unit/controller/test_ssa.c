/*
 * controller/ssa.c: managedFields as a cluster keeps them. Apply by one
 * manager owns exactly what it applied; another manager changing one of
 * those fields conflicts unless forced (then takes it); the same value is
 * shared ownership; a field no longer applied is removed unless someone
 * else owns it; ordinary writes own what they changed; FieldsV1 round-trips
 * (labels with dots, lists atomic).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "ssa.h"

#include <string.h>

#define NOW "2026-12-02T12:00:00Z"

static json_t *doc(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    if (!j)
        fail_msg("bad test JSON: %s", e.text);
    return j;
}

static json_t *entry(json_t *obj, const char *manager, const char *op)
{
    json_t *mf = json_object_get(json_object_get(obj, "metadata"), "managedFields");
    size_t i;
    json_t *e;
    json_array_foreach(mf, i, e)
    {
        if (!strcmp(json_string_value(json_object_get(e, "manager")), manager) &&
            !strcmp(json_string_value(json_object_get(e, "operation")), op))
            return e;
    }
    return NULL;
}

static const char *APPLIED = "{\"apiVersion\":\"gateway.sluice.dev/v1alpha1\",\"kind\":\"Api\","
                             "\"metadata\":{\"name\":\"pets\",\"namespace\":\"default\","
                             "\"labels\":{\"app.kubernetes.io/name\":\"pets\"}},"
                             "\"spec\":{\"basePath\":\"/pets\",\"backendRefs\":[{\"name\":\"a\"}],"
                             "\"timeouts\":{\"request\":\"5s\"}}}";

static void test_apply_creates_and_owns_what_it_applied(void **state)
{
    (void)state;
    json_t *a = doc(APPLIED), *out = NULL, *conf = NULL;
    assert_int_equal(sl_ssa_apply(NULL, a, "ci", false, NOW, &out, &conf), 0);
    assert_null(conf);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(out, "spec"), "basePath")), "/pets");
    json_t *e = entry(out, "ci", "Apply");
    assert_non_null(e);
    assert_string_equal(json_string_value(json_object_get(e, "fieldsType")), "FieldsV1");
    assert_string_equal(json_string_value(json_object_get(e, "time")), NOW);
    json_t *want = doc("{\"f:metadata\":{\"f:labels\":{\"f:app.kubernetes.io/name\":{}}},"
                       "\"f:spec\":{\"f:basePath\":{},\"f:backendRefs\":{},"
                       "\"f:timeouts\":{\"f:request\":{}}}}");
    assert_true(json_equal(json_object_get(e, "fieldsV1"), want));
    json_decref(want);
    json_decref(out);
    json_decref(a);
}

static void test_conflict_force_and_shared_values(void **state)
{
    (void)state;
    json_t *a = doc(APPLIED), *live = NULL, *conf = NULL, *out = NULL;
    assert_int_equal(sl_ssa_apply(NULL, a, "ci", false, NOW, &live, &conf), 0);

    /* Another manager sets basePath to something else: conflict, named. */
    json_t *b = doc("{\"apiVersion\":\"gateway.sluice.dev/v1alpha1\",\"kind\":\"Api\","
                    "\"metadata\":{\"name\":\"pets\"},"
                    "\"spec\":{\"basePath\":\"/other\",\"backendRefs\":[{\"name\":\"a\"}]}}");
    assert_int_equal(sl_ssa_apply(live, b, "human", false, NOW, &out, &conf), 1);
    assert_null(out);
    /* backendRefs has the same value: shared, not a conflict. */
    assert_int_equal(json_array_size(conf), 1);
    json_t *c = json_array_get(conf, 0);
    assert_string_equal(json_string_value(json_object_get(c, "manager")), "ci");
    assert_string_equal(json_string_value(json_object_get(c, "field")), ".spec.basePath");
    json_decref(conf);
    conf = NULL;

    /* force: human takes basePath; ci keeps the rest; both own backendRefs. */
    assert_int_equal(sl_ssa_apply(live, b, "human", true, NOW, &out, &conf), 0);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(out, "spec"), "basePath")), "/other");
    json_t *ci = json_object_get(entry(out, "ci", "Apply"), "fieldsV1");
    json_t *hu = json_object_get(entry(out, "human", "Apply"), "fieldsV1");
    assert_null(json_object_get(json_object_get(ci, "f:spec"), "f:basePath"));
    assert_non_null(json_object_get(json_object_get(ci, "f:spec"), "f:backendRefs"));
    assert_non_null(json_object_get(json_object_get(hu, "f:spec"), "f:basePath"));
    assert_non_null(json_object_get(json_object_get(hu, "f:spec"), "f:backendRefs"));

    /* ci applies its file again: basePath is human's now: conflict. */
    json_t *out2 = NULL;
    assert_int_equal(sl_ssa_apply(out, a, "ci", false, NOW, &out2, &conf), 1);
    json_decref(conf);
    json_decref(out);
    json_decref(b);
    json_decref(live);
    json_decref(a);
}

static void test_dropped_field_is_removed_unless_shared(void **state)
{
    (void)state;
    json_t *a = doc(APPLIED), *live = NULL, *conf = NULL, *out = NULL;
    assert_int_equal(sl_ssa_apply(NULL, a, "ci", false, NOW, &live, &conf), 0);
    /* The same file without the label and the timeouts. */
    json_t *a2 = doc("{\"apiVersion\":\"gateway.sluice.dev/v1alpha1\",\"kind\":\"Api\","
                     "\"metadata\":{\"name\":\"pets\"},"
                     "\"spec\":{\"basePath\":\"/pets\",\"backendRefs\":[{\"name\":\"a\"}]}}");
    assert_int_equal(sl_ssa_apply(live, a2, "ci", false, NOW, &out, &conf), 0);
    /* The emptied parents go too (timeouts, labels); spec stays. */
    assert_null(json_object_get(json_object_get(out, "spec"), "timeouts"));
    assert_null(json_object_get(json_object_get(out, "metadata"), "labels"));
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(out, "spec"), "basePath")), "/pets");
    json_decref(out);

    /* When an ordinary write (kubectl edit) also set the timeout to the same
     * value... it changed nothing, so it owns nothing; set it to another
     * value and it owns it: then ci dropping it leaves it. */
    json_t *edited = json_deep_copy(live);
    json_object_set_new(json_object_get(json_object_get(edited, "spec"), "timeouts"), "request",
                        json_string("9s"));
    sl_ssa_update(live, edited, "kubectl-edit", NOW);
    json_t *ed = entry(edited, "kubectl-edit", "Update");
    assert_non_null(ed);
    json_t *ci = json_object_get(entry(edited, "ci", "Apply"), "fieldsV1");
    assert_null(
        json_object_get(json_object_get(json_object_get(ci, "f:spec"), "f:timeouts"), "f:request"));
    assert_int_equal(sl_ssa_apply(edited, a2, "ci", false, NOW, &out, &conf), 0);
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_object_get(out, "spec"), "timeouts"), "request")),
                        "9s");
    json_decref(out);
    json_decref(edited);
    json_decref(a2);
    json_decref(live);
    json_decref(a);
}

static void test_update_owns_changes_and_drops_removed(void **state)
{
    (void)state;
    json_t *old = doc(APPLIED);
    sl_ssa_update(NULL, old, "kubectl-create", NOW);
    json_t *e = entry(old, "kubectl-create", "Update");
    assert_non_null(e);
    assert_non_null(json_object_get(json_object_get(e, "fieldsV1"), "f:spec"));
    json_t *obj = json_deep_copy(old);
    json_object_del(json_object_get(obj, "spec"), "timeouts");
    json_object_set_new(json_object_get(obj, "spec"), "basePath", json_string("/v2"));
    sl_ssa_update(old, obj, "curl", NOW);
    json_t *cr = json_object_get(
        json_object_get(entry(obj, "kubectl-create", "Update"), "fieldsV1"), "f:spec");
    assert_null(json_object_get(cr, "f:basePath"));
    assert_null(json_object_get(cr, "f:timeouts"));
    assert_non_null(json_object_get(cr, "f:backendRefs"));
    json_t *cu =
        json_object_get(json_object_get(entry(obj, "curl", "Update"), "fieldsV1"), "f:spec");
    assert_non_null(json_object_get(cu, "f:basePath"));
    assert_int_equal(json_object_size(cu), 1);
    /* Nothing changed: no entry for the writer, ownership the same. */
    json_t *same = json_deep_copy(obj);
    sl_ssa_update(obj, same, "third", NOW);
    assert_null(entry(same, "third", "Update"));
    assert_true(sl_ssa_same_ownership(obj, same));
    json_decref(same);
    json_decref(obj);
    json_decref(old);
}

static void test_fieldsv1_round_trip_and_default_manager(void **state)
{
    (void)state;
    /* A stored entry with "." (the node and children) and a list key. */
    json_t *live = doc("{\"metadata\":{\"name\":\"x\",\"managedFields\":[{\"manager\":\"m\","
                       "\"operation\":\"Apply\",\"fieldsType\":\"FieldsV1\",\"fieldsV1\":"
                       "{\"f:spec\":{\".\":{},\"f:a\":{}}}},{\"manager\":\"s\",\"operation\":"
                       "\"Update\",\"subresource\":\"status\",\"fieldsV1\":{\"f:status\":{}}}]},"
                       "\"spec\":{\"a\":1}}");
    json_t *copy = json_deep_copy(live);
    sl_ssa_update(live, copy, "nobody", NOW);
    /* Unchanged object: entries kept as they were (the subresource one
     * verbatim). */
    assert_true(sl_ssa_same_ownership(live, copy));
    json_t *mf = json_object_get(json_object_get(copy, "metadata"), "managedFields");
    assert_int_equal(json_array_size(mf), 2);
    json_t *m = json_object_get(json_array_get(mf, 0), "fieldsV1");
    assert_non_null(json_object_get(json_object_get(m, "f:spec"), "."));
    assert_non_null(json_object_get(json_object_get(m, "f:spec"), "f:a"));
    assert_string_equal(json_string_value(json_object_get(json_array_get(mf, 1), "subresource")),
                        "status");
    json_decref(copy);
    json_decref(live);

    char out[64];
    sl_ssa_default_manager("kubectl/v1.32.1 (linux/amd64) kubernetes/abc", out, sizeof(out));
    assert_string_equal(out, "kubectl");
    sl_ssa_default_manager(NULL, out, sizeof(out));
    assert_string_equal(out, "unknown");
    sl_ssa_default_manager("curl/8.0", out, sizeof(out));
    assert_string_equal(out, "curl");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_apply_creates_and_owns_what_it_applied),
        cmocka_unit_test(test_conflict_force_and_shared_values),
        cmocka_unit_test(test_dropped_field_is_removed_unless_shared),
        cmocka_unit_test(test_update_owns_changes_and_drops_removed),
        cmocka_unit_test(test_fieldsv1_round_trip_and_default_manager),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
