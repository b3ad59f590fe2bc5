/*
 * Unit tests of common/pbjson.c: real Snapshot messages (built, packed and
 * unpacked with the generated code) dumped to JSON, plus a hand-written
 * descriptor for the field types and labels the Snapshot proto does not use
 * (bytes, float/double, signed ints, oneof, optional, recursion).
 */
#include "pbjson.c"

#include "sluice/v1/snapshot.pb-c.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

static json_t *roundtrip_dump(const ProtobufCMessage *msg, const ProtobufCMessageDescriptor *d)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(len ? len : 1);
    assert_non_null(buf);
    assert_int_equal(protobuf_c_message_pack(msg, buf), len);
    ProtobufCMessage *copy = protobuf_c_message_unpack(d, NULL, len, buf);
    free(buf);
    assert_non_null(copy);
    json_t *j = sl_pbjson_from_message(copy);
    protobuf_c_message_free_unpacked(copy, NULL);
    return j;
}

static void test_snapshot_to_json(void **state)
{
    (void)state;
    Sluice__V1__Snapshot snap = SLUICE__V1__SNAPSHOT__INIT;
    snap.version = 42;
    snap.fleet = "default";

    Sluice__V1__Listener lst = SLUICE__V1__LISTENER__INIT;
    lst.name = "http";
    lst.port = 8080;
    lst.protocol = SLUICE__V1__LISTENER__PROTOCOL__H2C;
    Sluice__V1__Listener *listeners[] = {&lst};
    snap.n_listeners = 1;
    snap.listeners = listeners;

    Sluice__V1__Endpoint ep1 = SLUICE__V1__ENDPOINT__INIT, ep2 = SLUICE__V1__ENDPOINT__INIT;
    ep1.address = "127.0.0.1";
    ep1.port = 9001;
    ep1.weight = 3;
    ep2.address = "127.0.0.2";
    ep2.port = 9002;
    Sluice__V1__Endpoint *eps[] = {&ep1, &ep2};
    Sluice__V1__HealthCheck hc = SLUICE__V1__HEALTH_CHECK__INIT;
    hc.path = "/healthz";
    hc.interval_ms = 1000;
    Sluice__V1__Cluster with_hc = SLUICE__V1__CLUSTER__INIT, without_hc = SLUICE__V1__CLUSTER__INIT;
    with_hc.name = "echo";
    with_hc.n_endpoints = 2;
    with_hc.endpoints = eps;
    with_hc.lb_policy = SLUICE__V1__CLUSTER__LB_POLICY__CONSISTENT_HASH;
    with_hc.hash_on = SLUICE__V1__CLUSTER__HASH_ON__HASH_HEADER;
    with_hc.hash_key = "x-user";
    with_hc.health_check = &hc;
    without_hc.name = "bare";
    Sluice__V1__Cluster *clusters[] = {&with_hc, &without_hc};
    snap.n_clusters = 2;
    snap.clusters = clusters;

    Sluice__V1__RetryPolicy retry = SLUICE__V1__RETRY_POLICY__INIT;
    uint32_t on_status[] = {502, 503, 504};
    retry.attempts = 2;
    retry.on_connect_failure = 1;
    retry.n_on_status = 3;
    retry.on_status = on_status;
    Sluice__V1__Route route = SLUICE__V1__ROUTE__INIT;
    char *methods[] = {"GET", "HEAD"};
    route.name = "getPet";
    route.n_methods = 2;
    route.methods = methods;
    route.path_kind = SLUICE__V1__ROUTE__PATH_KIND__TEMPLATE;
    route.path = "/pets/{id}";
    route.retry = &retry;
    Sluice__V1__Route *routes[] = {&route};
    Sluice__V1__RouteTable table = SLUICE__V1__ROUTE_TABLE__INIT;
    char *hosts[] = {"*.example.com", "*"};
    table.name = "default/petstore";
    table.n_hosts = 2;
    table.hosts = hosts;
    table.base_path = "/petstore/v1";
    table.strip_base_path = 1;
    table.n_routes = 1;
    table.routes = routes;
    table.max_request_body_bytes = 1ULL << 40;
    Sluice__V1__RouteTable *tables[] = {&table};
    snap.n_route_tables = 1;
    snap.route_tables = tables;

    json_t *got = roundtrip_dump(&snap.base, &sluice__v1__snapshot__descriptor);
    assert_non_null(got);
    json_error_t jerr;
    json_t *want = json_loads(
        "{\"version\":42,\"fleet\":\"default\","
        " \"listeners\":[{\"name\":\"http\",\"address\":\"\",\"port\":8080,\"protocol\":\"H2C\"}],"
        " \"clusters\":["
        "  {\"name\":\"echo\","
        "   \"endpoints\":[{\"address\":\"127.0.0.1\",\"port\":9001,\"weight\":3},"
        "                  {\"address\":\"127.0.0.2\",\"port\":9002,\"weight\":0}],"
        "   \"lb_policy\":\"CONSISTENT_HASH\",\"hash_on\":\"HASH_HEADER\",\"hash_key\":\"x-user\","
        "   \"health_check\":{\"path\":\"/healthz\",\"interval_ms\":1000,\"timeout_ms\":0,"
        "     \"healthy_threshold\":0,\"unhealthy_threshold\":0,\"expected_status_min\":0,"
        "     \"expected_status_max\":0,\"host\":\"\"},"
        "   \"connect_timeout_ms\":0,\"host_rewrite\":\"\",\"protocol\":\"HTTP1\"},"
        "  "
        "{\"name\":\"bare\",\"endpoints\":[],\"lb_policy\":\"ROUND_ROBIN\",\"hash_on\":\"HASH_"
        "NONE\","
        "   "
        "\"hash_key\":\"\",\"connect_timeout_ms\":0,\"host_rewrite\":\"\",\"protocol\":\"HTTP1\"}],"
        " \"route_tables\":[{\"name\":\"default/petstore\",\"hosts\":[\"*.example.com\",\"*\"],"
        "   \"base_path\":\"/petstore/v1\",\"strip_base_path\":true,\"backends\":[],"
        "   "
        "\"routes\":[{\"name\":\"getPet\",\"methods\":[\"GET\",\"HEAD\"],\"path_kind\":"
        "\"TEMPLATE\","
        "     \"path\":\"/pets/{id}\",\"headers\":[],\"query\":[],\"backends\":[],"
        "     \"retry\":{\"attempts\":2,\"on_connect_failure\":true,\"on_reset\":false,"
        "       \"on_status\":[502,503,504],\"non_idempotent\":false,\"budget_percent\":0,"
        "       \"min_retry_concurrency\":0,\"per_try_timeout_ms\":0},"
        "     \"max_request_body_bytes\":0,\"upgrades\":[],\"tunnel_idle_ms\":0,\"policies\":[],"
        "     \"action\":\"PROXY\"}],"
        "   \"max_request_body_bytes\":1099511627776,\"version\":\"\"}],"
        " \"certificates\":[], \"consumers\":[]}",
        0, &jerr);
    if (!want)
        fail_msg("expected JSON does not parse: %s at %d", jerr.text, jerr.position);
    if (!json_equal(got, want)) {
        char *s = json_dumps(got, JSON_INDENT(1));
        fail_msg("unexpected dump:\n%s", s);
    }
    /* Keys in field-number order, so a dump reads like the .proto. */
    const char *first_key = json_object_iter_key(json_object_iter(got));
    assert_string_equal(first_key, "version");
    json_decref(got);
    json_decref(want);
}

static void test_uint64_above_int64_max_is_exact_string(void **state)
{
    (void)state;
    Sluice__V1__Snapshot snap = SLUICE__V1__SNAPSHOT__INIT;
    snap.version = UINT64_MAX;
    json_t *j = sl_pbjson_from_message(&snap.base);
    assert_string_equal(json_string_value(json_object_get(j, "version")), "18446744073709551615");
    json_decref(j);
    snap.version = (uint64_t)INT64_MAX;
    j = sl_pbjson_from_message(&snap.base);
    assert_true(json_integer_value(json_object_get(j, "version")) == INT64_MAX);
    json_decref(j);
}

static void test_invalid_utf8_string_still_valid_json(void **state)
{
    (void)state;
    Sluice__V1__Listener l = SLUICE__V1__LISTENER__INIT;
    char name[] = "a\xff"
                  "b\xc3("
                  "\xed\xa0\x80"
                  "ok\xc3\xa9";
    l.name = name;
    json_t *j = sl_pbjson_from_message(&l.base);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "name")),
                        "a\xef\xbf\xbd"
                        "b\xef\xbf\xbd("
                        "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                        "ok\xc3\xa9");
    char *text = json_dumps(j, 0);
    json_t *back = json_loads(text, 0, NULL);
    assert_non_null(back);
    json_decref(back);
    free(text);
    json_decref(j);
}

static void test_unknown_enum_value_stays_a_number(void **state)
{
    (void)state;
    Sluice__V1__Listener l = SLUICE__V1__LISTENER__INIT;
    l.protocol = (Sluice__V1__Listener__Protocol)77;
    json_t *j = sl_pbjson_from_message(&l.base);
    assert_int_equal(json_integer_value(json_object_get(j, "protocol")), 77);
    json_decref(j);
}

static void test_not_a_message_is_null(void **state)
{
    (void)state;
    assert_null(sl_pbjson_from_message(NULL));
    ProtobufCMessageDescriptor bogus = {0};
    ProtobufCMessage m = {&bogus, 0, NULL};
    assert_null(sl_pbjson_from_message(&m));
}

/* ---- a hand-written descriptor for what snapshot.proto lacks ------------ */

typedef struct AllTypes AllTypes;
struct AllTypes {
    ProtobufCMessage base;
    int32_t i32;
    int64_t s64;
    float f;
    double d;
    ProtobufCBinaryData blob;
    protobuf_c_boolean has_opt_u32;
    uint32_t opt_u32;
    char *opt_str;
    uint32_t choice_case;
    union {
        char *choice_a;
        int32_t choice_b;
    };
    size_t n_blobs;
    ProtobufCBinaryData *blobs;
    size_t n_doubles;
    double *doubles;
    AllTypes *child;
};

extern const ProtobufCMessageDescriptor all_types_descriptor;

#define F(name, id, label, type, q, member, desc, flags)                                           \
    {                                                                                              \
        name, id, PROTOBUF_C_LABEL_##label, PROTOBUF_C_TYPE_##type, q, offsetof(AllTypes, member), \
            desc, NULL, flags, 0, NULL, NULL                                                       \
    }
static const ProtobufCFieldDescriptor all_types_fields[] = {
    F("i32", 1, NONE, INT32, 0, i32, NULL, 0),
    F("s64", 2, NONE, SINT64, 0, s64, NULL, 0),
    F("f", 3, NONE, FLOAT, 0, f, NULL, 0),
    F("d", 4, NONE, DOUBLE, 0, d, NULL, 0),
    F("blob", 5, NONE, BYTES, 0, blob, NULL, 0),
    F("opt_u32", 6, OPTIONAL, UINT32, offsetof(AllTypes, has_opt_u32), opt_u32, NULL, 0),
    F("opt_str", 7, OPTIONAL, STRING, 0, opt_str, NULL, 0),
    F("choice_a", 8, OPTIONAL, STRING, offsetof(AllTypes, choice_case), choice_a, NULL,
      PROTOBUF_C_FIELD_FLAG_ONEOF),
    F("choice_b", 9, OPTIONAL, INT32, offsetof(AllTypes, choice_case), choice_b, NULL,
      PROTOBUF_C_FIELD_FLAG_ONEOF),
    F("blobs", 10, REPEATED, BYTES, offsetof(AllTypes, n_blobs), blobs, NULL, 0),
    F("doubles", 11, REPEATED, DOUBLE, offsetof(AllTypes, n_doubles), doubles, NULL, 0),
    F("child", 12, NONE, MESSAGE, 0, child, &all_types_descriptor, 0),
};
#undef F

const ProtobufCMessageDescriptor all_types_descriptor = {
    .magic = PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC,
    .name = "test.AllTypes",
    .short_name = "AllTypes",
    .c_name = "AllTypes",
    .package_name = "test",
    .sizeof_message = sizeof(AllTypes),
    .n_fields = sizeof(all_types_fields) / sizeof(all_types_fields[0]),
    .fields = all_types_fields,
};

static void init_all(AllTypes *m)
{
    memset(m, 0, sizeof(*m));
    m->base.descriptor = &all_types_descriptor;
}

static void test_scalar_types_bytes_optional_oneof(void **state)
{
    (void)state;
    AllTypes m;
    init_all(&m);
    m.i32 = -7;
    m.s64 = INT64_MIN;
    m.f = 1.5f;
    m.d = -0.25;
    uint8_t raw[] = {0x00, 0xff, 'h', 'i'};
    m.blob = (ProtobufCBinaryData){sizeof(raw), raw};
    m.opt_str = "set";
    m.choice_case = 9;
    m.choice_b = 5;
    ProtobufCBinaryData blobs[] = {
        {1, (uint8_t *)"f"}, {2, (uint8_t *)"fo"}, {3, (uint8_t *)"foo"}, {0, NULL}};
    m.n_blobs = 4;
    m.blobs = blobs;
    double doubles[] = {1.0, NAN, INFINITY, -INFINITY};
    m.n_doubles = 4;
    m.doubles = doubles;

    json_t *j = sl_pbjson_from_message(&m.base);
    assert_non_null(j);
    json_t *want =
        json_pack("{s:i,s:I,s:f,s:f,s:s,s:s,s:i,s:[s,s,s,s],s:[f,s,s,s]}", "i32", -7, "s64",
                  (json_int_t)INT64_MIN, "f", 1.5, "d", -0.25, "blob", "AP9oaQ==", "opt_str", "set",
                  "choice_b", 5, "blobs", "Zg==", "Zm8=", "Zm9v", "", "doubles", 1.0, "NaN",
                  "Infinity", "-Infinity");
    assert_non_null(want);
    if (!json_equal(j, want)) {
        char *s = json_dumps(j, 0);
        fail_msg("unexpected dump: %s", s);
    }
    /* Unset optional and the other oneof member are omitted; absent child too. */
    assert_null(json_object_get(j, "opt_u32"));
    assert_null(json_object_get(j, "choice_a"));
    assert_null(json_object_get(j, "child"));
    json_decref(want);
    json_decref(j);

    m.has_opt_u32 = 1; /* set to zero is still set */
    m.choice_case = 8;
    m.choice_a = "a";
    j = sl_pbjson_from_message(&m.base);
    assert_int_equal(json_integer_value(json_object_get(j, "opt_u32")), 0);
    assert_string_equal(json_string_value(json_object_get(j, "choice_a")), "a");
    assert_null(json_object_get(j, "choice_b"));
    json_decref(j);
}

/* Nested messages recurse; a chain deeper than the bound fails cleanly
 * instead of exhausting the stack. */
static void test_nesting_depth_bounded(void **state)
{
    (void)state;
    enum { DEEP = SL_PBJSON_MAX_DEPTH + 10 };
    AllTypes *chain = calloc(DEEP, sizeof(*chain));
    for (int i = 0; i < DEEP; i++) {
        init_all(&chain[i]);
        chain[i].i32 = i;
        chain[i].child = (i + 1 < DEEP) ? &chain[i + 1] : NULL;
    }
    json_t *j = sl_pbjson_from_message(&chain[DEEP - 5].base);
    assert_non_null(j);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "child"), "i32")),
                     DEEP - 4);
    json_decref(j);
    assert_null(sl_pbjson_from_message(&chain[0].base));
    free(chain);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_snapshot_to_json),
        cmocka_unit_test(test_uint64_above_int64_max_is_exact_string),
        cmocka_unit_test(test_invalid_utf8_string_still_valid_json),
        cmocka_unit_test(test_unknown_enum_value_stays_a_number),
        cmocka_unit_test(test_not_a_message_is_null),
        cmocka_unit_test(test_scalar_types_bytes_optional_oneof),
        cmocka_unit_test(test_nesting_depth_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
