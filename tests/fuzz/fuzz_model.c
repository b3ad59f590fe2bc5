/*
 * libFuzzer driver: the resource model (common/model.c, yaml.c, validate*.c)
 * and the compiler (common/compiler.c), i.e. everything an operator's YAML or
 * JSON file goes through before it becomes a snapshot.
 *
 * The whole input is one file's text (YAML or JSON; YAML is a superset and
 * detection is the model's job). Every document that validates goes on to
 * sl_compile_snapshot, and a snapshot that compiles must pack, unpack and
 * pack again to the same bytes.
 *
 * Invariants (abort() on violation):
 *  - sl_model_parse returns 0 with no errors, or -1 with at least one error,
 *    and every error formats to a non-empty line;
 *  - a set that parsed holds only objects with a name, a namespace and a
 *    known kind;
 *  - sl_compile_snapshot returns a snapshot with no errors, or NULL with
 *    errors; a snapshot round-trips through pack/unpack.
 */
#include "compiler.h"
#include "fuzz_util.h"
#include "model.h"

static void check_errors(const sl_errors_t *errs)
{
    for (size_t i = 0; i < errs->count; i++) {
        FUZZ_CHECK(errs->items[i].message && errs->items[i].message[0], "error %zu: no message", i);
        char *line = sl_error_format(&errs->items[i]);
        FUZZ_CHECK(line && line[0], "error %zu does not format", i);
        free(line);
    }
    char *all = sl_errors_format(errs);
    FUZZ_CHECK(all != NULL, "sl_errors_format returned NULL");
    free(all);
}

static void compile_and_roundtrip(const sl_resource_set_t *set, const char *fleet)
{
    sl_errors_t errs;
    sl_errors_init(&errs);
    Sluice__V1__Snapshot *snap = sl_compile_snapshot(set, fleet, 42, &errs);
    if (!snap) {
        FUZZ_CHECK(errs.count > 0, "compile failed without an error");
        check_errors(&errs);
        sl_errors_free(&errs);
        return;
    }
    FUZZ_CHECK(errs.count == 0, "compile returned a snapshot and %zu errors", errs.count);
    size_t len1 = 0, len2 = 0;
    uint8_t *p1 = sl_snapshot_pack(snap, &len1);
    FUZZ_CHECK(p1 != NULL, "pack failed");
    Sluice__V1__Snapshot *again = sl_snapshot_unpack(p1, len1);
    FUZZ_CHECK(again != NULL, "a compiled snapshot (%zu bytes) does not unpack", len1);
    uint8_t *p2 = sl_snapshot_pack(again, &len2);
    FUZZ_CHECK(p2 && len1 == len2 && memcmp(p1, p2, len1) == 0,
               "pack/unpack/pack differs (%zu vs %zu bytes)", len1, len2);
    FUZZ_CHECK(again->version == 42, "version %llu", (unsigned long long)again->version);
    free(p1);
    free(p2);
    sl_snapshot_free(again);
    sl_snapshot_free(snap);
    sl_errors_free(&errs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sl_resource_set_t set;
    sl_errors_t errs;
    sl_resource_set_init(&set);
    sl_errors_init(&errs);
    /* Exact-size copy: the parsers get (text, len) and must not need a NUL. */
    char *text = fuzz_dup(data, size);
    int rc = sl_model_parse(&set, text, size, "fuzz.yaml", &errs);
    if (rc == 0) {
        FUZZ_CHECK(errs.count == 0, "parse returned 0 with %zu errors", errs.count);
    } else {
        FUZZ_CHECK(rc == -1 && errs.count > 0, "parse returned %d with %zu errors", rc, errs.count);
        check_errors(&errs);
    }
    for (size_t i = 0; i < set.count; i++) {
        const sl_resource_t *r = &set.items[i];
        FUZZ_CHECK(r->obj && r->name && r->name[0] && r->ns && r->ns[0], "item %zu incomplete", i);
        FUZZ_CHECK((unsigned)r->kind < SL_KIND__COUNT, "item %zu kind %d", i, (int)r->kind);
    }
    /* Only a fully valid file is compiled, as the controller and the
     * runtime's file mode do; fleets: the default and one the file names. */
    if (rc == 0 && set.count > 0) {
        compile_and_roundtrip(&set, "default");
        compile_and_roundtrip(&set, "edge");
    }
    free(text);
    sl_resource_set_free(&set);
    sl_errors_free(&errs);
    return 0;
}
