/*
 * Unit tests of the cache policy (policies/cache/): the store's LRU by
 * bytes, TTL, reference counts, fills and their waiters, pass markers,
 * zones kept across "generations" by holder; the policy's Cache-Control
 * parser, its key (query, headers, consumer) and its bypass rules, and the
 * config's validation with field paths.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cache/cache_policy.h"
#include "model.h"
#include "policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- the store --------------------------------------------------------------- */

/* Keys "<prefix>N" whose hash falls in shard 0, so LRU order is exact. */
static int same_shard_keys(const char *prefix, char keys[][32], int n)
{
    int found = 0;
    for (int i = 0; found < n && i < 100000; i++) {
        snprintf(keys[found], 32, "%s%d", prefix, i);
        if ((sl_cache_hash(keys[found], strlen(keys[found])) >> 60) == 0)
            found++;
    }
    return found;
}

static sl_cache_entry_t *make(const char *key, size_t body_len, uint64_t now, uint64_t life_ms)
{
    static char body[65536];
    memset(body, 'b', sizeof(body));
    const char *head = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
    return sl_cache_entry_new(key, strlen(key), sl_cache_hash(key, strlen(key)), 200, head,
                              strlen(head), body, body_len, now, life_ms, 0, 0);
}

static enum sl_cache_result look(sl_cache_zone_t *z, const char *key, uint64_t now,
                                 sl_cache_entry_t **hit)
{
    sl_cache_fill_t *f;
    enum sl_cache_result r = sl_cache_lookup(z, key, strlen(key), sl_cache_hash(key, strlen(key)),
                                             now, 0, NULL, hit, &f);
    assert_null(f);
    return r;
}

static void grab(const sl_cache_zone_stats_t *s, void *arg)
{
    if (strcmp(s->name, "test/lru") == 0 || strcmp(s->name, "test/evict") == 0)
        *(sl_cache_zone_stats_t *)arg = *s;
}

static void test_lru_by_bytes(void **st)
{
    (void)st;
    int holder = 0;
    char keys[6][32];
    assert_int_equal(same_shard_keys("lru", keys, 6), 6);
    sl_cache_entry_t *probe = make(keys[0], 4000, 0, 1000);
    size_t one = probe->size;
    sl_cache_entry_release(probe);
    /* Room for four entries of this size. */
    sl_cache_zone_t *z = sl_cache_zone_acquire("test/lru", one * 4 + one / 2, &holder);
    assert_non_null(z);
    for (int i = 0; i < 4; i++)
        sl_cache_insert(z, make(keys[i], 4000, 0, 60000));
    /* Touch key 0: key 1 is now the least recently used. */
    sl_cache_entry_t *e;
    assert_int_equal(look(z, keys[0], 1, &e), SL_CACHE_HIT);
    sl_cache_entry_release(e);
    sl_cache_insert(z, make(keys[4], 4000, 2, 60000));
    assert_int_equal(look(z, keys[1], 3, &e), SL_CACHE_MISS);
    assert_int_equal(look(z, keys[0], 3, &e), SL_CACHE_HIT);
    sl_cache_entry_release(e);
    assert_int_equal(look(z, keys[2], 3, &e), SL_CACHE_HIT);
    sl_cache_entry_release(e);
    /* LRU order now 2, 0, 4, 3: a big one (almost two slots) pushes out
     * the two least recent, 3 then 4. */
    sl_cache_insert(z, make(keys[5], 8000, 4, 60000));
    assert_int_equal(look(z, keys[3], 5, &e), SL_CACHE_MISS);
    assert_int_equal(look(z, keys[4], 5, &e), SL_CACHE_MISS);
    for (int k = 0; k <= 5; k += 5) {
        assert_int_equal(look(z, keys[k], 5, &e), SL_CACHE_HIT);
        sl_cache_entry_release(e);
    }
    sl_cache_zone_stats_t got = {0};
    sl_cache_zones_foreach(grab, &got);
    assert_true(got.bytes <= one * 4 + one / 2);
    assert_int_equal(got.evictions, 3);
    assert_int_equal(got.entries, 3);
    sl_cache_zone_release(z, &holder);
}

static void test_eviction_crosses_shards(void **st)
{
    (void)st;
    int holder = 0;
    sl_cache_entry_t *probe = make("x", 1000, 0, 1000);
    size_t one = probe->size;
    sl_cache_entry_release(probe);
    sl_cache_zone_t *z = sl_cache_zone_acquire("test/evict", one * 10, &holder);
    char key[32];
    for (int i = 0; i < 200; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        sl_cache_insert(z, make(key, 1000, 0, 60000));
    }
    /* Larger than the whole zone: never stored, nothing evicted for it. */
    sl_cache_insert(z, make("huge", 20000, 0, 60000));
    sl_cache_entry_t *e;
    assert_int_equal(look(z, "huge", 1, &e), SL_CACHE_MISS);
    sl_cache_zone_stats_t got = {0};
    sl_cache_zones_foreach(grab, &got);
    assert_true(got.bytes <= one * 10);
    assert_true(got.entries >= 8); /* approximate LRU across shards, never empty */
    assert_int_equal(look(z, "k199", 1, &e), SL_CACHE_HIT); /* the newest always stays */
    sl_cache_entry_release(e);
    sl_cache_zone_release(z, &holder);
}

static void test_ttl_and_refcount(void **st)
{
    (void)st;
    int holder = 0;
    sl_cache_zone_t *z = sl_cache_zone_acquire("test/ttl", 1 << 20, &holder);
    sl_cache_insert(z, make("a", 100, 1000, 500));
    sl_cache_entry_t *held;
    assert_int_equal(look(z, "a", 1499, &held), SL_CACHE_HIT);
    /* Expired: dropped from the table, but the reader's copy lives on. */
    sl_cache_entry_t *e;
    assert_int_equal(look(z, "a", 1500, &e), SL_CACHE_EXPIRED);
    assert_int_equal(look(z, "a", 1500, &e), SL_CACHE_MISS);
    assert_int_equal(held->body_len, 100);
    assert_memory_equal(held->key, "a", 1);
    assert_int_equal(atomic_load(&held->refs), 1);
    sl_cache_entry_release(held); /* the last reference frees it (ASan checks) */
    /* The origin's Age shortens the freshness it had left. */
    sl_cache_entry_t *aged =
        sl_cache_entry_new("b", 1, sl_cache_hash("b", 1), 200, "", 0, "", 0, 10000, 60000, 50, 0);
    assert_int_equal(aged->expires_ms, 10000 + 10000);
    sl_cache_insert(z, aged);
    assert_int_equal(look(z, "b", 19999, &e), SL_CACHE_HIT);
    sl_cache_entry_release(e);
    assert_int_equal(look(z, "b", 20000, &e), SL_CACHE_EXPIRED);
    /* Replacing a key keeps one entry. */
    sl_cache_insert(z, make("c", 10, 0, 60000));
    sl_cache_insert(z, make("c", 20, 0, 60000));
    assert_int_equal(look(z, "c", 1, &e), SL_CACHE_HIT);
    assert_int_equal(e->body_len, 20);
    sl_cache_entry_release(e);
    sl_cache_zone_release(z, &holder);
}

static void test_fill_and_waiters(void **st)
{
    (void)st;
    int holder = 0;
    sl_cache_zone_t *z = sl_cache_zone_acquire("test/fill", 1 << 20, &holder);
    const char *k = "f";
    uint64_t h = sl_cache_hash(k, 1);
    sl_cache_entry_t *e;
    sl_cache_fill_t *leader, *f;
    sl_cache_waiter_t w0 = {0, 1}, w1 = {1, 2}, w2 = {1, 3};
    assert_int_equal(sl_cache_lookup(z, k, 1, h, 0, 0, &w0, &e, &leader), SL_CACHE_MISS);
    assert_non_null(leader);
    assert_int_equal(sl_cache_lookup(z, k, 1, h, 0, 0, &w1, &e, &f), SL_CACHE_WAIT);
    assert_null(f);
    assert_int_equal(sl_cache_lookup(z, k, 1, h, 0, 0, &w2, &e, &f), SL_CACHE_WAIT);
    /* Without a waiter nothing waits (HEAD, or a woken request). */
    assert_int_equal(sl_cache_lookup(z, k, 1, h, 0, 0, NULL, &e, &f), SL_CACHE_MISS);
    sl_cache_waiter_t *ws;
    size_t n = sl_cache_fill_end(z, leader, make(k, 10, 0, 60000), 0, 0, &ws);
    assert_int_equal(n, 2);
    assert_int_equal(ws[0].token, 2);
    assert_int_equal(ws[1].token, 3);
    free(ws);
    assert_int_equal(sl_cache_lookup(z, k, 1, h, 1, 0, &w1, &e, &f), SL_CACHE_HIT);
    sl_cache_entry_release(e);

    /* A response that is not storable: a pass marker, no waiting after it. */
    const char *k2 = "g";
    uint64_t h2 = sl_cache_hash(k2, 1);
    assert_int_equal(sl_cache_lookup(z, k2, 1, h2, 0, 0, &w0, &e, &leader), SL_CACHE_MISS);
    assert_int_equal(sl_cache_lookup(z, k2, 1, h2, 0, 0, &w1, &e, &f), SL_CACHE_WAIT);
    n = sl_cache_fill_end(z, leader, NULL, 0, 1000, &ws);
    assert_int_equal(n, 1);
    free(ws);
    assert_int_equal(sl_cache_lookup(z, k2, 1, h2, 10, 0, &w1, &e, &f), SL_CACHE_PASS);
    assert_null(f);
    /* ...but a storable response later replaces the marker. */
    sl_cache_insert(z, make(k2, 5, 20, 60000));
    assert_int_equal(sl_cache_lookup(z, k2, 1, h2, 30, 0, &w1, &e, &f), SL_CACHE_HIT);
    sl_cache_entry_release(e);
    /* A failed fill (no marker): the next miss leads a new fill. */
    const char *k3 = "h";
    uint64_t h3 = sl_cache_hash(k3, 1);
    assert_int_equal(sl_cache_lookup(z, k3, 1, h3, 0, 0, &w0, &e, &leader), SL_CACHE_MISS);
    n = sl_cache_fill_end(z, leader, NULL, 0, 0, &ws);
    assert_int_equal(n, 0);
    free(ws);
    assert_int_equal(sl_cache_lookup(z, k3, 1, h3, 0, 0, &w0, &e, &leader), SL_CACHE_MISS);
    assert_non_null(leader);
    n = sl_cache_fill_end(z, leader, NULL, 0, 0, &ws);
    free(ws);
    sl_cache_zone_release(z, &holder);
}

static void test_authorized_requests_need_shareable_entries(void **st)
{
    (void)st;
    int holder = 0;
    sl_cache_zone_t *z = sl_cache_zone_acquire("test/auth", 1 << 20, &holder);
    sl_cache_insert(z, make("p", 1, 0, 60000)); /* auth_ok 0 */
    sl_cache_entry_t *e;
    sl_cache_fill_t *f;
    assert_int_equal(sl_cache_lookup(z, "p", 1, sl_cache_hash("p", 1), 1, 1, NULL, &e, &f),
                     SL_CACHE_PASS);
    sl_cache_insert(
        z, sl_cache_entry_new("p", 1, sl_cache_hash("p", 1), 200, "", 0, "", 0, 0, 60000, 0, 1));
    assert_int_equal(sl_cache_lookup(z, "p", 1, sl_cache_hash("p", 1), 1, 1, NULL, &e, &f),
                     SL_CACHE_HIT);
    sl_cache_entry_release(e);
    sl_cache_zone_release(z, &holder);
}

static void test_zone_survives_a_new_holder(void **st)
{
    (void)st;
    int gen1 = 1, gen2 = 2;
    sl_cache_zone_t *z = sl_cache_zone_acquire("test/zone", 1 << 20, &gen1);
    sl_cache_insert(z, make("kept", 10, 0, 60000));
    /* The next generation compiles before the old one is freed. */
    sl_cache_zone_t *z2 = sl_cache_zone_acquire("test/zone", 1 << 19, &gen2);
    assert_ptr_equal(z, z2);
    sl_cache_zone_release(z, &gen1);
    sl_cache_entry_t *e;
    assert_int_equal(look(z2, "kept", 1, &e), SL_CACHE_HIT);
    sl_cache_entry_release(e);
    sl_cache_zone_release(z2, &gen2); /* the last holder: freed (ASan checks) */
    int gen3 = 3;
    sl_cache_zone_t *z3 = sl_cache_zone_acquire("test/zone", 1 << 20, &gen3);
    assert_int_equal(look(z3, "kept", 1, &e), SL_CACHE_MISS);
    sl_cache_zone_release(z3, &gen3);
}

/* --- the policy -------------------------------------------------------------- */

static void test_cache_control_parse(void **st)
{
    (void)st;
    sl_cache_cc_t cc;
    sl_cache_cc_init(&cc);
    sl_cache_cc_parse(&cc, SL_STR("public, max-age=60, s-maxage=\"120\", x-ext=\"a,b\""));
    assert_true(cc.public_);
    assert_int_equal(cc.max_age, 60);
    assert_int_equal(cc.s_maxage, 120);
    assert_false(cc.no_store);
    sl_cache_cc_init(&cc);
    sl_cache_cc_parse(&cc, SL_STR("No-Store"));
    sl_cache_cc_parse(&cc, SL_STR("private=\"set-cookie\", no-cache"));
    assert_true(cc.no_store && cc.private_ && cc.no_cache);
    assert_int_equal(cc.max_age, -1);
    sl_cache_cc_init(&cc);
    sl_cache_cc_parse(&cc, SL_STR("max-age=abc"));
    assert_int_equal(cc.max_age, 0); /* invalid: stale */
    sl_cache_cc_init(&cc);
    sl_cache_cc_parse(&cc, SL_STR("max-age=99999999999999"));
    assert_int_equal(cc.max_age, 2147483648LL);
}

typedef struct {
    sl_policy_req_t r;
    sl_hdr_edit_t edits[2][16];
    char arena[4096];
    sl_policy_header_t headers[8];
} fake_req_t;

static void fake(fake_req_t *f, const char *method, const char *path, const char *query,
                 const char *consumer)
{
    memset(f, 0, sizeof(*f));
    f->r.method = (sl_str_t){method, strlen(method)};
    f->r.host = SL_STR("Example.COM");
    f->r.path = (sl_str_t){path, strlen(path)};
    f->r.query = (sl_str_t){query, strlen(query)};
    f->r.headers = f->headers;
    f->r.api = "default/t";
    f->r.operation = "all";
    f->r.consumer.name = consumer;
    f->r.req_edits = f->edits[0];
    f->r.resp_edits = f->edits[1];
    f->r.max_edits = 16;
    f->r.arena = f->arena;
    f->r.arena_cap = sizeof(f->arena);
}

static void add_header(fake_req_t *f, const char *name, const char *value)
{
    f->headers[f->r.num_headers++] =
        (sl_policy_header_t){{name, strlen(name)}, {value, strlen(value)}};
}

static void *compile(const char *json)
{
    const sl_policy_def_t *def = sl_policy_find("cache");
    assert_non_null(def);
    json_t *cfg = json_loads(json, 0, NULL);
    assert_non_null(cfg);
    char err[256] = "";
    sl_policy_env_t env = {.consumers = NULL, .nworkers = 1, .api = "default/unit"};
    void *state = def->compile(cfg, &env, err, sizeof(err));
    json_decref(cfg);
    assert_non_null(state);
    return state;
}

static const sl_cache_ask_t *ask_of(void *state, fake_req_t *f)
{
    const sl_policy_def_t *def = sl_policy_find("cache");
    sl_policy_reply_t rep;
    assert_int_equal(def->on_request(state, &f->r, &rep), SL_POLICY_CONTINUE);
    return f->r.cache;
}

static int same_key(const sl_cache_ask_t *a, const sl_cache_ask_t *b)
{
    return a->key_len == b->key_len && memcmp(a->key, b->key, a->key_len) == 0 &&
           a->hash == b->hash;
}

static void test_key(void **st)
{
    (void)st;
    const sl_policy_def_t *def = sl_policy_find("cache");
    void *s = compile("{\"keyQuery\":[\"page\",\"sort\"],\"keyHeaders\":[\"Accept-Language\"]}");
    fake_req_t a, b;
    fake(&a, "GET", "/items", "utm=1&page=2&sort=asc", NULL);
    fake(&b, "GET", "/items", "sort=asc&page=2", NULL);
    assert_true(same_key(ask_of(s, &a), ask_of(s, &b)));
    fake(&b, "GET", "/items", "page=3&sort=asc", NULL);
    assert_false(same_key(ask_of(s, &a), ask_of(s, &b)));
    /* HEAD shares GET's key, and may not store. */
    fake(&b, "HEAD", "/items", "page=2&sort=asc", NULL);
    const sl_cache_ask_t *hb = ask_of(s, &b);
    assert_true(same_key(ask_of(s, &a), hb));
    assert_false(hb->store);
    /* Headers in the key. */
    fake(&a, "GET", "/x", "", NULL);
    add_header(&a, "accept-language", "en");
    fake(&b, "GET", "/x", "", NULL);
    add_header(&b, "Accept-Language", "fr");
    assert_false(same_key(ask_of(s, &a), ask_of(s, &b)));
    /* Consumers never share a key, nor with anonymous requests. */
    fake_req_t c1, c2, anon;
    fake(&c1, "GET", "/me", "", "default/alice");
    fake(&c2, "GET", "/me", "", "default/bob");
    fake(&anon, "GET", "/me", "", NULL);
    const sl_cache_ask_t *k1 = ask_of(s, &c1), *k2 = ask_of(s, &c2), *k3 = ask_of(s, &anon);
    assert_false(same_key(k1, k2));
    assert_false(same_key(k1, k3));
    assert_false(same_key(k2, k3));
    /* The whole query when keyQuery is absent. */
    void *whole = compile("{}");
    fake(&a, "GET", "/q", "a=1&b=2", NULL);
    fake(&b, "GET", "/q", "b=2&a=1", NULL);
    assert_false(same_key(ask_of(whole, &a), ask_of(whole, &b)));
    /* The query as forwarded: a credential an api-key policy removed from
     * it is not in the key (nor in memory). */
    fake(&a, "GET", "/q", "api_key=s3cret&a=1", "default/alice");
    a.r.query_out = SL_STR("a=1");
    fake(&b, "GET", "/q", "a=1", "default/alice");
    const sl_cache_ask_t *qa = ask_of(whole, &a);
    assert_true(same_key(qa, ask_of(whole, &b)));
    assert_null(memmem(qa->key, qa->key_len, "s3cret", 6));
    /* POST: not the cache's at all. */
    fake(&a, "POST", "/q", "", NULL);
    assert_null(ask_of(whole, &a));
    assert_null(a.r.cache_status);
    def->free(whole);
    def->free(s);
}

static void test_bypass_rules(void **st)
{
    (void)st;
    const sl_policy_def_t *def = sl_policy_find("cache");
    void *s = compile("{}");
    static const char *const bypass[][2] = {
        {"Cache-Control", "no-store"}, {"Range", "bytes=0-1"},           {"Cookie", "a=b"},
        {"Content-Length", "3"},       {"Transfer-Encoding", "chunked"},
    };
    for (size_t i = 0; i < sizeof(bypass) / sizeof(bypass[0]); i++) {
        fake_req_t f;
        fake(&f, "GET", "/b", "", NULL);
        add_header(&f, bypass[i][0], bypass[i][1]);
        assert_null(ask_of(s, &f));
        assert_string_equal(f.r.cache_status, "BYPASS");
    }
    fake_req_t f;
    fake(&f, "GET", "/b", "", NULL);
    add_header(&f, "Cache-Control", "no-cache");
    const sl_cache_ask_t *a = ask_of(s, &f);
    assert_false(a->lookup);
    assert_true(a->store);
    fake(&f, "GET", "/b", "", NULL);
    add_header(&f, "Pragma", "no-cache");
    assert_false(ask_of(s, &f)->lookup);
    /* Authorization without an authenticated consumer: flagged; with one:
     * the consumer is in the key. */
    fake(&f, "GET", "/b", "", NULL);
    add_header(&f, "Authorization", "Bearer x");
    assert_true(ask_of(s, &f)->authorized);
    fake(&f, "GET", "/b", "", "default/alice");
    add_header(&f, "Authorization", "Bearer x");
    assert_false(ask_of(s, &f)->authorized);
    def->free(s);
    /* ignoreCookies, or Cookie in the key: cached. */
    void *ic = compile("{\"ignoreCookies\":true}");
    fake(&f, "GET", "/b", "", NULL);
    add_header(&f, "Cookie", "a=b");
    assert_non_null(ask_of(ic, &f));
    def->free(ic);
    void *rq = compile("{\"respectRequestCacheControl\":false}");
    fake(&f, "GET", "/b", "", NULL);
    add_header(&f, "Cache-Control", "no-store, no-cache");
    assert_true(ask_of(rq, &f)->lookup);
    def->free(rq);
}

static void test_response_headers(void **st)
{
    (void)st;
    const sl_policy_def_t *def = sl_policy_find("cache");
    void *s = compile("{}");
    fake_req_t f;
    fake(&f, "GET", "/r", "", NULL);
    f.r.cache_status = "HIT";
    f.r.cache_age_s = 42;
    def->on_response(s, &f.r, 200);
    assert_int_equal(f.r.num_resp_edits, 2);
    assert_string_equal(f.r.resp_edits[0].name, "X-Cache");
    assert_memory_equal(f.r.resp_edits[0].value, "HIT", 3);
    assert_string_equal(f.r.resp_edits[1].name, "Age");
    assert_memory_equal(f.r.resp_edits[1].value, "42", 2);
    fake(&f, "GET", "/r", "", NULL);
    f.r.cache_status = "MISS";
    def->on_response(s, &f.r, 200);
    assert_int_equal(f.r.num_resp_edits, 1);
    def->free(s);
}

/* --- config validation ------------------------------------------------------ */

static char *errors_of(const char *config)
{
    char text[2048];
    snprintf(text, sizeof(text),
             "apiVersion: gateway.sluice.dev/v1alpha1\nkind: Api\nmetadata: {name: a}\n"
             "spec:\n  backendRefs: [{name: b}]\n  operations: [{method: GET, path: /x}]\n"
             "  policies:\n  - name: cache\n    config: %s\n",
             config);
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    sl_model_parse(&set, text, strlen(text), "t.yaml", &errs);
    char *s = sl_errors_format(&errs);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
    return s;
}

static void expect(const char *config, const char *want)
{
    char *s = errors_of(config);
    if (want[0] ? !strstr(s, want) : s[0] != '\0')
        fail_msg("config %s\n got: %s\nwant: %s", config, s, want[0] ? want : "(valid)");
    free(s);
}

#define P "spec.policies[0].config."

static void test_config_validation(void **st)
{
    (void)st;
    expect("{}", "");
    expect("{ttl: 5m, maxBytes: 1048576, maxEntryBytes: 65536, keyQuery: [page], "
           "keyHeaders: [Accept-Language], statuses: [200, 404], respectCacheControl: false, "
           "respectRequestCacheControl: false, coalesce: true, coalesceTimeout: 2s, "
           "ignoreCookies: true}",
           "");
    expect("{keyQuery: []}", "");
    expect("{maxBytes: 65536}", ""); /* maxEntryBytes defaults within it */
    expect("{ttl: 500ms}", P "ttl");
    expect("{maxBytes: 100}", P "maxBytes");
    expect("{maxBytes: 65536, maxEntryBytes: 70000}",
           P "maxEntryBytes: 70000 is larger than maxBytes");
    expect("{statuses: [206]}", P "statuses[0]: 206 is not cached");
    expect("{statuses: [200, 304]}", P "statuses[1]: 304 is not cached");
    expect("{statuses: [199]}", P "statuses[0]");
    expect("{statuses: []}", P "statuses");
    expect("{keyHeaders: [Authorization]}", P "keyHeaders[0]: Authorization is never part");
    expect("{keyHeaders: [\"a b\"]}", P "keyHeaders[0]: 'a b' is not a header name");
    expect("{coalesce: false, coalesceTimeout: 1s}", P "coalesceTimeout: only used with");
    expect("{tll: 1s}", P "tll: unknown field (did you mean 'ttl'?)");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lru_by_bytes),
        cmocka_unit_test(test_eviction_crosses_shards),
        cmocka_unit_test(test_ttl_and_refcount),
        cmocka_unit_test(test_fill_and_waiters),
        cmocka_unit_test(test_authorized_requests_need_shareable_entries),
        cmocka_unit_test(test_zone_survives_a_new_holder),
        cmocka_unit_test(test_cache_control_parse),
        cmocka_unit_test(test_key),
        cmocka_unit_test(test_bypass_rules),
        cmocka_unit_test(test_response_headers),
        cmocka_unit_test(test_config_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
