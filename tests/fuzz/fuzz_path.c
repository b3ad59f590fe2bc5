/*
 * libFuzzer driver: runtime/http/path.c's sl_path_normalize on client paths.
 *
 * Input: byte 0 chooses the options (bit 0: merge_slashes; bits 1..7: the
 * encoded-slashes mode, 0..2 the three modes and anything else an unknown
 * value, which must act as reject); the rest is the path, any bytes. The
 * output buffer is exactly as long as the path and heap-allocated, so a write
 * past it is an ASan report. path.c is included to reach its filter.
 *
 * Invariants (abort() on violation):
 *  - the result is SL_OK, SL_PATH_UNCHANGED or SL_ERROR with a reason;
 *  - an output is never longer than the input, starts with '/', holds no
 *    NUL, no "." or ".." segment (no "/./", "/../", no trailing "/." or
 *    "/.."), only upper-case escapes, no "//" when merging, no '\' unless
 *    the mode is keep;
 *  - normalising an output again gives SL_PATH_UNCHANGED (idempotent);
 *  - SL_PATH_UNCHANGED exactly when the full pass would copy the input
 *    byte for byte (the hot-path filter is neither too eager nor too lax);
 *  - for a path of '/', '.' and other plain bytes only, the result is RFC
 *    3986 §5.2.4 remove_dot_segments of the input (after collapsing "//"
 *    when merging), computed here by an independent, literal transcription
 *    of the RFC.
 */
#include "fuzz_util.h"

#include "path.c"

#include <stdbool.h>

/* RFC 3986 §5.2.4 with an input and an output buffer, as the RFC says it. */
static size_t rfc_remove_dot_segments(const char *src, size_t n, char *out)
{
    char *in = malloc(n + 1);
    if (!in)
        abort();
    memcpy(in, src, n);
    size_t il = n, ol = 0;
#define STARTS(lit) (il >= sizeof(lit) - 1 && memcmp(in, lit, sizeof(lit) - 1) == 0)
#define IS(lit) (il == sizeof(lit) - 1 && memcmp(in, lit, sizeof(lit) - 1) == 0)
#define DROP(k) (memmove(in, in + (k), il - (k)), il -= (k))
    while (il > 0) {
        if (STARTS("../")) {
            DROP(3);
        } else if (STARTS("./")) {
            DROP(2);
        } else if (STARTS("/./")) {
            DROP(2);
        } else if (IS("/.")) {
            il = 1;
        } else if (STARTS("/../") || IS("/..")) {
            if (IS("/.."))
                il = 1;
            else
                DROP(3);
            in[0] = '/';
            while (ol > 0 && out[ol - 1] != '/')
                ol--;
            if (ol > 0)
                ol--;
        } else if (IS(".") || IS("..")) {
            il = 0;
        } else {
            size_t k = in[0] == '/' ? 1 : 0;
            while (k < il && in[k] != '/')
                k++;
            memcpy(out + ol, in, k);
            ol += k;
            DROP(k);
        }
    }
#undef STARTS
#undef IS
#undef DROP
    free(in);
    return ol;
}

static void check_normal_form(const char *p, size_t n, const sl_path_opts_t *o)
{
    FUZZ_CHECK(n >= 1 && p[0] == '/', "output must start with '/' (len %zu)", n);
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(p[i] != '\0', "NUL in output at %zu", i);
        if (p[i] == '/') {
            FUZZ_CHECK(!dot_segment_at(p, n, i + 1), "dot segment in output at %zu: %.*s", i,
                       (int)n, p);
            FUZZ_CHECK(!(o->merge_slashes && i + 1 < n && p[i + 1] == '/'),
                       "'//' in output while merging: %.*s", (int)n, p);
        }
        if (p[i] == '%')
            FUZZ_CHECK(i + 2 < n && is_upper_hex((unsigned char)p[i + 1]) &&
                           is_upper_hex((unsigned char)p[i + 2]),
                       "escape not in upper-case hex at %zu: %.*s", i, (int)n, p);
        FUZZ_CHECK(p[i] != '\\' || o->encoded_slashes == SL_PATH_SLASHES_KEEP,
                   "backslash in output in mode %u", o->encoded_slashes);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    sl_path_opts_t o = {.merge_slashes = data[0] & 1, .encoded_slashes = data[0] >> 1};
    data++;
    size--;

    char *in = malloc(size ? size : 1);
    char *out = malloc(size ? size : 1);
    if (!in || !out)
        abort();
    memcpy(in, data, size);
    size_t out_len = (size_t)-1;
    const char *why = NULL;
    int rc = sl_path_normalize(in, size, out, size, &o, &out_len, &why);
    FUZZ_CHECK(rc == SL_OK || rc == SL_PATH_UNCHANGED || rc == SL_ERROR, "result %d", rc);
    if (rc == SL_ERROR) {
        FUZZ_CHECK(why && why[0], "error without a reason");
    } else {
        const char *res = rc == SL_OK ? out : in;
        FUZZ_CHECK(out_len <= size, "output %zu longer than input %zu", out_len, size);
        FUZZ_CHECK(rc == SL_OK || out_len == size, "unchanged with length %zu != %zu", out_len,
                   size);
        check_normal_form(res, out_len, &o);
        char *again = malloc(out_len ? out_len : 1);
        if (!again)
            abort();
        memcpy(again, res, out_len);
        size_t again_len = 0;
        const char *why2 = NULL;
        int rc2 = sl_path_normalize(again, out_len, NULL, 0, &o, &again_len, &why2);
        FUZZ_CHECK(rc2 == SL_PATH_UNCHANGED, "not idempotent: %.*s gives %d (%s)", (int)out_len,
                   res, rc2, why2 ? why2 : "");
        free(again);
    }

    if (size >= 1 && in[0] == '/') {
        /* The filter says "unchanged" exactly when the full pass copies. */
        char *full = malloc(size);
        if (!full)
            abort();
        size_t full_len = 0;
        const char *why3 = NULL;
        int frc = normalise(in, size, full, o.merge_slashes, o.encoded_slashes, &full_len, &why3);
        bool same = frc == SL_OK && full_len == size && memcmp(full, in, size) == 0;
        FUZZ_CHECK(same == (rc == SL_PATH_UNCHANGED), "filter and full pass disagree (%d, %d)",
                   same, rc);
        FUZZ_CHECK(frc == rc || (same && rc == SL_PATH_UNCHANGED), "results differ: %d vs %d", frc,
                   rc);

        /* Plain paths: exactly RFC 3986 remove_dot_segments. */
        bool plain = true;
        for (size_t i = 0; i < size && plain; i++)
            plain = in[i] != '%' && in[i] != '\\' && in[i] != '\0';
        if (plain) {
            char *merged = malloc(size);
            char *ref = malloc(size);
            if (!merged || !ref)
                abort();
            size_t ml = 0;
            for (size_t i = 0; i < size; i++)
                if (!(o.merge_slashes && in[i] == '/' && ml > 0 && merged[ml - 1] == '/'))
                    merged[ml++] = in[i];
            size_t rl = rfc_remove_dot_segments(merged, ml, ref);
            const char *res = rc == SL_OK ? out : in;
            FUZZ_CHECK(rc != SL_ERROR && rl == out_len && memcmp(ref, res, rl) == 0,
                       "differs from RFC 3986: %.*s -> %.*s, RFC says %.*s", (int)size, in,
                       (int)out_len, res, (int)rl, ref);
            free(merged);
            free(ref);
        }
        free(full);
    }
    free(in);
    free(out);
    return 0;
}
