/*
 * Seed generator for fuzz_snapshot_apply: compiles real model files (the
 * quickstart, tests/data/model/...) and writes what a controller would send
 * for them, in the driver's two input forms:
 *   <outdir>/snapshot-<n>: 0x00 + packed Snapshot
 *   <outdir>/stream-<n>:   0x01 + records [type][len lo][len hi][packed
 *                          DiscoveryResponse], one per resource type in the
 *                          controller's order, then a cluster push without
 *                          the first cluster (exercises the retention rule).
 * Usage: seedgen OUTDIR MODEL_PATH...
 *
 * Not a test: run by hand (see tests/fuzz/README.md) when the model or the
 * proto changes; the outputs are committed under tests/fuzz/corpus/.
 */
#include "compiler.h"
#include "grpc_util.h"
#include "model.h"
#include "sluice/v1/discovery.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int write_file(const char *path, const uint8_t *a, size_t alen)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(a, 1, alen, f) != alen) {
        fprintf(stderr, "%s: cannot write\n", path);
        if (f)
            fclose(f);
        return -1;
    }
    return fclose(f);
}

typedef struct {
    uint8_t *p;
    size_t len, cap;
} bytes_t;

static void put(bytes_t *b, const void *d, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p)
            abort();
    }
    memcpy(b->p + b->len, d, n);
    b->len += n;
}

/* One DiscoveryResponse of type t carrying msgs[skip..n), appended as a record. */
static void put_response(bytes_t *out, int t, const ProtobufCMessage *const *msgs,
                         char *const *names, size_t n, size_t skip, const char *version)
{
    Sluice__V1__Resource *res = calloc(n + 1, sizeof(*res));
    Sluice__V1__Resource **rp = calloc(n + 1, sizeof(*rp));
    size_t k = 0;
    for (size_t i = skip; i < n; i++, k++) {
        sluice__v1__resource__init(&res[k]);
        res[k].name = names[i];
        res[k].type_url = (char *)sl_xds_type_urls[t];
        res[k].value.len = protobuf_c_message_get_packed_size(msgs[i]);
        res[k].value.data = malloc(res[k].value.len + 1);
        protobuf_c_message_pack(msgs[i], res[k].value.data);
        rp[k] = &res[k];
    }
    Sluice__V1__DiscoveryResponse resp = SLUICE__V1__DISCOVERY_RESPONSE__INIT;
    resp.version_info = (char *)version;
    resp.type_url = (char *)sl_xds_type_urls[t];
    resp.nonce = "seed";
    resp.n_resources = k;
    resp.resources = rp;
    size_t len = protobuf_c_message_get_packed_size(&resp.base);
    uint8_t *buf = malloc(len + 1);
    protobuf_c_message_pack(&resp.base, buf);
    uint8_t hdr[3] = {(uint8_t)t, (uint8_t)(len & 0xff), (uint8_t)(len >> 8)};
    put(out, hdr, 3);
    put(out, buf, len);
    free(buf);
    for (size_t i = 0; i < k; i++)
        free(res[i].value.data);
    free(res);
    free(rp);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s OUTDIR MODEL_PATH...\n", argv[0]);
        return 2;
    }
    int rc = 0;
    for (int a = 2; a < argc; a++) {
        sl_resource_set_t set;
        sl_errors_t errs;
        sl_resource_set_init(&set);
        sl_errors_init(&errs);
        Sluice__V1__Snapshot *snap = NULL;
        if (sl_model_load_path(&set, argv[a], &errs) == 0)
            snap = sl_compile_snapshot(&set, "default", 7, &errs);
        if (!snap) {
            char *msg = sl_errors_format(&errs);
            fprintf(stderr, "%s: skipped:\n%s\n", argv[a], msg ? msg : "");
            free(msg);
            sl_errors_free(&errs);
            sl_resource_set_free(&set);
            continue;
        }
        char path[4096];
        size_t len = 0;
        uint8_t *packed = sl_snapshot_pack(snap, &len);
        bytes_t b = {0};
        put(&b, "\x00", 1);
        put(&b, packed, len);
        snprintf(path, sizeof(path), "%s/snapshot-%d", argv[1], a - 1);
        rc |= write_file(path, b.p, b.len);
        free(packed);
        b.len = 0;

        put(&b, "\x01", 1);
        char *settings_name = "settings";
        const ProtobufCMessage *settings = snap->settings ? &snap->settings->base : NULL;
        char **cnames = calloc(snap->n_clusters + 1, sizeof(char *));
        char **rnames = calloc(snap->n_route_tables + 1, sizeof(char *));
        char **lnames = calloc(snap->n_listeners + 1, sizeof(char *));
        for (size_t i = 0; i < snap->n_clusters; i++)
            cnames[i] = snap->clusters[i]->name;
        for (size_t i = 0; i < snap->n_route_tables; i++)
            rnames[i] = snap->route_tables[i]->name;
        for (size_t i = 0; i < snap->n_listeners; i++)
            lnames[i] = snap->listeners[i]->name;
        put_response(&b, SL_XDS_CLUSTER, (const ProtobufCMessage *const *)snap->clusters, cnames,
                     snap->n_clusters, 0, "7");
        put_response(&b, SL_XDS_SETTINGS, &settings, &settings_name, settings ? 1 : 0, 0, "7");
        put_response(&b, SL_XDS_ROUTE, (const ProtobufCMessage *const *)snap->route_tables, rnames,
                     snap->n_route_tables, 0, "7");
        put_response(&b, SL_XDS_LISTENER, (const ProtobufCMessage *const *)snap->listeners, lnames,
                     snap->n_listeners, 0, "7");
        put_response(&b, SL_XDS_CLUSTER, (const ProtobufCMessage *const *)snap->clusters, cnames,
                     snap->n_clusters, 1, "8");
        snprintf(path, sizeof(path), "%s/stream-%d", argv[1], a - 1);
        rc |= write_file(path, b.p, b.len);
        free(b.p);
        free(cnames);
        free(rnames);
        free(lnames);
        sl_snapshot_free(snap);
        sl_errors_free(&errs);
        sl_resource_set_free(&set);
    }
    return rc ? 1 : 0;
}
