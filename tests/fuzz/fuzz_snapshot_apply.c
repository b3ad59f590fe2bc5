/*
 * libFuzzer driver: what a runtime does with bytes from its controller. A
 * hostile or broken controller must get a NACK, never a crashed runtime.
 *
 * Byte 0 picks the mode:
 *  - even: the rest is a packed Snapshot (the file/bootstrap form):
 *    sl_snapshot_unpack; if it decodes, pack/unpack must round-trip to the
 *    same bytes, then sl_generation_build (router, clusters, LB rings,
 *    metrics) and sl_generation_discard;
 *  - odd: the rest is a config stream: records [type][len lo][len hi][len
 *    bytes of a packed DiscoveryResponse]. Each goes through the runtime's
 *    own handle_response (runtime/control/xds.c, #included here to reach it): decode
 *    of every Resource as its type, the make-before-break cluster merge,
 *    apply_state's re-encode and sl_generation_build. State carries over
 *    between the records of one input, like pushes on one stream. The type
 *    byte's low bits replace the response's type_url with one of the four
 *    known ones (bit 7 set: keep the pushed type_url) so that mutations do
 *    not have to rediscover the URLs.
 *
 * Substituted: sl_config_apply (renamed to fuzz_config_apply for xds.c),
 * which after sl_generation_build opens listener sockets and publishes.
 * Here it runs the listener checks that come before any socket, builds the
 * generation and discards it: a fuzzer must not bind ports on a machine
 * where others run tests.
 *
 * Invariants: no sanitizer report; a NACKed push leaves the state as it was
 * (versions, resource counts); an ACKed one leaves the pushed version.
 */
/* xds.c's call to sl_config_apply goes to fuzz_config_apply below; the
 * rename keeps config.o's definition out of the way when the archive pulls
 * it in for another symbol. */
#define sl_config_apply fuzz_config_apply
#include "../../runtime/control/xds.c"
#undef sl_config_apply

#include "fuzz_util.h"

#include <urcu-qsbr.h>

int fuzz_config_apply(sl_config_t *cfg, Sluice__V1__Snapshot *snap, const char *source, char *err,
                      size_t errlen)
{
    (void)cfg;
    for (size_t i = 0; i < snap->n_listeners; i++) {
        if (snap->listeners[i]->protocol != SLUICE__V1__LISTENER__PROTOCOL__HTTP) {
            snprintf(err, errlen, "listener %s: only protocol http is supported by this runtime",
                     snap->listeners[i]->name);
            sl_snapshot_free(snap);
            return -1;
        }
    }
    sl_generation_t *gen = sl_generation_build(snap, source, 2, err, errlen);
    if (!gen)
        return -1;
    sl_generation_discard(gen);
    return 0;
}

/* A real config object (no workers, no listeners): xds.c reads its limits
 * (sl_config_check) before applying. */
static sl_config_t *fuzz_cfg;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* Quiet: every NACK logs an error line, millions of times per run. */
    sl_log_set_level(SL_LOG_ALERT);
    if (sl_metrics_init(4) != 0)
        abort();
    fuzz_cfg = sl_config_new(NULL, 2);
    if (!fuzz_cfg)
        abort();
    rcu_register_thread();
    rcu_thread_offline();
    return 0;
}

static void snapshot_mode(const uint8_t *data, size_t size, unsigned nworkers)
{
    Sluice__V1__Snapshot *snap = sl_snapshot_unpack(data, size);
    if (!snap)
        return;
    /* Whatever decodes must re-encode to a fixed point: apply_state relies
     * on pack+unpack to give the generation its own copy. */
    size_t len1 = 0, len2 = 0;
    uint8_t *p1 = sl_snapshot_pack(snap, &len1);
    FUZZ_CHECK(p1 != NULL, "pack of a decoded snapshot failed");
    Sluice__V1__Snapshot *again = sl_snapshot_unpack(p1, len1);
    if (!again) {
        /* protobuf-c 1.4 keeps an unknown field whose over-long tag varint
         * decodes to field number 0 (input 80 00 41) and writes it back as
         * tag 0, which it then refuses to read. Not ours to fix; xds.c's
         * apply_state NACKs such a push ("snapshot does not re-encode"). */
        free(p1);
        goto build;
    }
    uint8_t *p2 = sl_snapshot_pack(again, &len2);
    FUZZ_CHECK(p2 && len1 == len2 && memcmp(p1, p2, len1) == 0,
               "pack/unpack is not a fixed point (%zu vs %zu bytes)", len1, len2);
    free(p1);
    free(p2);
    sl_snapshot_free(again);

build:;
    char err[1024] = "";
    sl_generation_t *gen = sl_generation_build(snap, "fuzz", nworkers, err, sizeof(err));
    if (gen)
        sl_generation_discard(gen);
    else
        FUZZ_CHECK(err[0] != '\0', "sl_generation_build failed without a message");
}

static void free_state(sl_xds_t *x)
{
    for (int t = 0; t < SL_XDS__COUNT; t++) {
        type_state_free(&x->types[t]);
        free(x->types[t].version);
        x->types[t].version = NULL;
    }
    for (size_t i = 0; i < x->cds_n; i++)
        free(x->cds_names[i]);
    free(x->cds_names);
    free(x->last_error);
}

static void stream_mode(const uint8_t *data, size_t size)
{
    sl_xds_t x;
    memset(&x, 0, sizeof(x));
    x.opt.controller = "fuzz:0";
    x.opt.node_id = "fuzz-node";
    x.opt.fleet = "default";
    x.opt.build_version = "fuzz";
    x.cfg = fuzz_cfg;
    pthread_mutex_init(&x.lock, NULL);

    size_t pos = 0;
    while (size - pos >= 3) {
        uint8_t type = data[pos];
        size_t len = (size_t)data[pos + 1] | (size_t)data[pos + 2] << 8;
        pos += 3;
        if (len > size - pos)
            len = size - pos;
        Sluice__V1__DiscoveryResponse *resp =
            sluice__v1__discovery_response__unpack(NULL, len, data + pos);
        pos += len;
        if (!resp)
            continue;
        char *pushed_url = resp->type_url;
        if (!(type & 0x80))
            resp->type_url = (char *)sl_xds_type_urls[type % SL_XDS__COUNT];

        int t = sl_xds_type_from_url(resp->type_url ? resp->type_url : "");
        uint64_t nacked = x.updates_nacked, acked = x.updates_acked;
        char *version_before = t >= 0 && x.types[t].version ? strdup(x.types[t].version) : NULL;
        size_t n_before[SL_XDS__COUNT];
        for (int i = 0; i < SL_XDS__COUNT; i++)
            n_before[i] = x.types[i].n;

        handle_response(&x, 1, resp);

        if (t >= 0) {
            FUZZ_CHECK(x.updates_nacked + x.updates_acked == nacked + acked + 1,
                       "a push was neither ACKed nor NACKed");
            if (x.updates_nacked > nacked) {
                for (int i = 0; i < SL_XDS__COUNT; i++)
                    FUZZ_CHECK(x.types[i].n == n_before[i], "NACKed push changed type %d", i);
                FUZZ_CHECK((version_before == NULL) == (x.types[t].version == NULL) &&
                               (!version_before || strcmp(version_before, x.types[t].version) == 0),
                           "NACKed push changed the version");
            } else {
                const char *v = resp->version_info ? resp->version_info : "";
                FUZZ_CHECK(x.types[t].version && strcmp(x.types[t].version, v) == 0,
                           "ACKed push did not record its version");
            }
        }
        free(version_before);
        resp->type_url = pushed_url;
        sluice__v1__discovery_response__free_unpacked(resp, NULL);
    }
    free_state(&x);
    pthread_mutex_destroy(&x.lock);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] & 1)
        stream_mode(data + 1, size - 1);
    else
        snapshot_mode(data + 1, size - 1, 1 + (data[0] >> 1) % 4);
    return 0;
}
