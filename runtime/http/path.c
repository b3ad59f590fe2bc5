/*
 * Request-path normalisation (path.h has the rules and why).
 *
 * Two steps. is_normal() is a conservative filter on the hot path: it says
 * "normal" only when it is sure that normalise() would copy the input byte
 * for byte, and "maybe not" at the first byte it would have to think about.
 * normalise() is the only place that knows the rules, including every error,
 * so the filter can never make a path pass that the full pass would refuse.
 * The test suite checks that the two agree (tests/unit/runtime/test_path.c).
 *
 * Not here: anything about routing or forwarding (proxy/request.c), the
 * query string.
 */
#include "path.h"

#include <stdbool.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Bytes the filter must look at: everything else is copied as is whatever
 * the options. '/' matters only when merging ("//"); a dot segment is found
 * from its '.', whose previous byte tells whether it starts a segment, so
 * the common '/' does not stop the scan. */
static const uint8_t stop_tab[256] = {[0] = 1, ['%'] = 1, ['\\'] = 1, ['.'] = 1};
static const uint8_t stop_tab_merge[256] = {[0] = 1, ['%'] = 1, ['\\'] = 1, ['.'] = 1, ['/'] = 1};

/* Hex digit value + 1; 0 = not a hex digit. */
static const uint8_t hex_tab[256] = {
    ['0'] = 1,  ['1'] = 2,  ['2'] = 3,  ['3'] = 4,  ['4'] = 5,  ['5'] = 6,  ['6'] = 7,  ['7'] = 8,
    ['8'] = 9,  ['9'] = 10, ['A'] = 11, ['B'] = 12, ['C'] = 13, ['D'] = 14, ['E'] = 15, ['F'] = 16,
    ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14, ['e'] = 15, ['f'] = 16,
};

/* RFC 3986 §2.3 unreserved: ALPHA DIGIT - . _ ~ */
static const uint8_t unreserved_tab[256] = {
    ['A' ... 'Z'] = 1, ['a' ... 'z'] = 1, ['0' ... '9'] = 1, ['-'] = 1,
    ['.'] = 1,         ['_'] = 1,         ['~'] = 1,
};

static const char upper_hex[16] = "0123456789ABCDEF";

static inline bool is_upper_hex(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F');
}

static inline bool is_slash_byte(unsigned v)
{
    return v == '/' || v == '\\';
}

/* A "." or ".." segment starts at in[i] (just after a '/') and ends at the
 * end or at a literal '/'. Other ways to spell one (escapes, a decoded
 * separator) stop the filter at their own byte. */
static inline bool dot_segment_at(const char *in, size_t len, size_t i)
{
    if (i >= len || in[i] != '.')
        return false;
    if (i + 1 == len || in[i + 1] == '/')
        return true;
    return in[i + 1] == '.' && (i + 2 == len || in[i + 2] == '/');
}

/* Index of the first byte at or after i that the filter must look at, or
 * len. SSE2 (always there on x86-64) tests 16 bytes at a time, as http1.c
 * does for targets; the scalar loop finishes the tail. */
static inline size_t skip_plain(const char *in, size_t i, size_t len, bool merge)
{
#if defined(__SSE2__)
    const __m128i pct = _mm_set1_epi8('%'), bsl = _mm_set1_epi8('\\'), dot = _mm_set1_epi8('.');
    const __m128i nul = _mm_setzero_si128();
    const __m128i sl = merge ? _mm_set1_epi8('/') : nul; /* nul: already tested */
    while (len - i >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(in + i));
        __m128i m = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, pct), _mm_cmpeq_epi8(v, bsl)),
                                 _mm_or_si128(_mm_cmpeq_epi8(v, dot), _mm_cmpeq_epi8(v, nul)));
        m = _mm_or_si128(m, _mm_cmpeq_epi8(v, sl));
        unsigned mask = (unsigned)_mm_movemask_epi8(m);
        if (mask)
            return i + (size_t)__builtin_ctz(mask);
        i += 16;
    }
#endif
    const uint8_t *tab = merge ? stop_tab_merge : stop_tab;
    while (i < len && !tab[(unsigned char)in[i]])
        i++;
    return i;
}

/* True when normalise() would return the input unchanged. False means
 * "look closer", not "wrong". Needs in[0] == '/' (so a '.' has a byte
 * before it). */
static bool is_normal(const char *in, size_t len, bool merge, unsigned slashes)
{
    size_t i = 0;
    for (;;) {
        i = skip_plain(in, i, len, merge);
        if (i == len)
            return true;
        switch ((unsigned char)in[i]) {
        case '/': /* only when merging */
            if (i + 1 < len && in[i + 1] == '/')
                return false;
            i++;
            continue;
        case '.':
            if (in[i - 1] == '/' && dot_segment_at(in, len, i))
                return false;
            i++;
            continue;
        case '%': {
            if (len - i < 3)
                return false;
            unsigned char h1 = (unsigned char)in[i + 1], h2 = (unsigned char)in[i + 2];
            if (!is_upper_hex(h1) || !is_upper_hex(h2))
                return false;
            unsigned v = (unsigned)(hex_tab[h1] - 1) << 4 | (unsigned)(hex_tab[h2] - 1);
            if (v == 0 || unreserved_tab[v])
                return false;
            if (is_slash_byte(v) && slashes != SL_PATH_SLASHES_KEEP)
                return false;
            i += 3;
            continue;
        }
        case '\\':
            if (slashes != SL_PATH_SLASHES_KEEP)
                return false;
            i++;
            continue;
        default: /* NUL */
            return false;
        }
    }
}

static int refuse(const char **why, const char *reason)
{
    if (why)
        *why = reason;
    return SL_ERROR;
}

/*
 * The full pass: reads one segment at a time into out (decoding as it
 * goes), then decides what the segment was. out[0..olen) is always a
 * normalised path ending in '/' between segments, so removing a segment is
 * moving olen back to the '/' before it. Writes never pass the read position
 * (olen <= i), which is why out_cap >= len is enough.
 */
static int normalise(const char *in, size_t len, char *out, bool merge, unsigned slashes,
                     size_t *out_len, const char **why)
{
    size_t i = 1, olen = 1;
    out[0] = '/';
    for (;;) {
        size_t seg = olen;
        size_t sep_len = 0; /* bytes of the separator that ended the segment; 0 = end */
        while (i < len) {
            unsigned char c = (unsigned char)in[i];
            if (c == '/') {
                sep_len = 1;
                break;
            }
            if (c == '\\') {
                if (slashes == SL_PATH_SLASHES_KEEP) {
                    out[olen++] = (char)c;
                    i++;
                    continue;
                }
                if (slashes == SL_PATH_SLASHES_DECODE) {
                    sep_len = 1;
                    break;
                }
                return refuse(why, "backslash in path");
            }
            if (c == 0)
                return refuse(why, "NUL byte in path");
            if (c != '%') {
                out[olen++] = (char)c;
                i++;
                continue;
            }
            if (len - i < 3 || !hex_tab[(unsigned char)in[i + 1]] ||
                !hex_tab[(unsigned char)in[i + 2]])
                return refuse(why, "malformed percent-escape in path");
            unsigned v = (unsigned)(hex_tab[(unsigned char)in[i + 1]] - 1) << 4 |
                         (unsigned)(hex_tab[(unsigned char)in[i + 2]] - 1);
            if (v == 0)
                return refuse(why, "percent-encoded NUL (%00) in path");
            if (is_slash_byte(v)) {
                if (slashes == SL_PATH_SLASHES_DECODE) {
                    sep_len = 3;
                    break;
                }
                if (slashes != SL_PATH_SLASHES_KEEP)
                    return refuse(why, "encoded slash (%2F or %5C) in path");
            } else if (unreserved_tab[v]) {
                out[olen++] = (char)v;
                i += 3;
                continue;
            }
            out[olen++] = '%';
            out[olen++] = upper_hex[v >> 4];
            out[olen++] = upper_hex[v & 15];
            i += 3;
        }
        size_t seglen = olen - seg;
        bool dot = seglen == 1 && out[seg] == '.';
        bool dotdot = seglen == 2 && out[seg] == '.' && out[seg + 1] == '.';
        if (dot || dotdot) {
            olen = seg; /* the segment goes; the '/' before it stays */
            if (dotdot && olen > 1) {
                /* ... and so does the segment before it. At the root there
                 * is none: clamped (path.h, rule 3). */
                olen--;
                while (out[olen - 1] != '/')
                    olen--;
            }
        } else if (sep_len && !(merge && seglen == 0)) {
            out[olen++] = '/';
        }
        if (sep_len == 0)
            break;
        i += sep_len;
    }
    *out_len = olen;
    return SL_OK;
}

int sl_path_normalize(const char *in, size_t len, char *out, size_t out_cap,
                      const sl_path_opts_t *opts, size_t *out_len, const char **why)
{
    bool merge = opts && opts->merge_slashes;
    unsigned slashes = opts ? opts->encoded_slashes : SL_PATH_SLASHES_REJECT;
    /* Both loops rely on in[0] == '/': a segment always follows a '/'. */
    if (len == 0 || in[0] != '/')
        return refuse(why, "path does not start with '/'");
    if (sl_likely(is_normal(in, len, merge, slashes))) {
        *out_len = len;
        return SL_PATH_UNCHANGED;
    }
    if (out_cap < len)
        return refuse(why, "internal error: path normalisation buffer smaller than the path");
    return normalise(in, len, out, merge, slashes, out_len, why);
}
