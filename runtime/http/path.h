/*
 * Request-path normalisation: the path a client sent -> the one path that is
 * routed and forwarded, so that what a route matches is what the backend
 * sees (issue 8; docs/routing.md, "Path normalisation"). Without it,
 * `/public/../admin` is matched by a `/public` route and served by the
 * backend as `/admin`, and `/api/%2e%2e/secret` climbs the same way.
 *
 * A pure function over caller-owned bytes: no allocation, no I/O, no state.
 * Input is the path of an origin-form target (up to '?', without it), which
 * always starts with '/'. The rules, applied in one left-to-right pass, and
 * why:
 *
 *  1. Percent-escapes. `%XX` of an unreserved character (ALPHA DIGIT - . _ ~)
 *     is decoded: RFC 3986 §2.3 says the two spellings are the same URI, so
 *     `/%61dmin` must not slip past a rule written for `/admin`. Any other
 *     escape stays encoded with upper-case hex (`%2f` -> `%2F`, §6.2.2.1):
 *     decoding it would change what the path means (`%3F` is data, `?` is
 *     not) and the router compares bytes. `%25` stays `%25`, so nothing is
 *     ever decoded twice. A malformed escape (`%`, `%1`, `%G1`) is an error:
 *     servers disagree on how to read one. `%00` is an error: a NUL ends the
 *     path for a C backend and nothing else.
 *  2. Encoded slashes `%2F` and `%5C`, and a literal `\`: some servers treat
 *     them as a separator (Windows/IIS for `\`; many frameworks decode `%2F`
 *     before routing), others as data, so the gateway cannot know which
 *     segments the backend will see. sl_path_opts_t.encoded_slashes chooses:
 *       REJECT (default) - error, answered 400;
 *       KEEP   - data inside a segment, never a separator: `%2F`/`%5C` stay
 *                escaped (hex upper-cased), `\` stays as sent;
 *       DECODE - a separator: each becomes `/` before rule 3, so
 *                `/a%2F..%2Fb` is `/b`.
 *     The literal `\` follows the same choice because it carries the same
 *     ambiguity and is not a URI character at all (RFC 3986 has no `\`;
 *     browsers turn it into `/` before sending).
 *  3. Dot segments (RFC 3986 §5.2.4 remove_dot_segments), after decoding, so
 *     `%2e`, `%2E.` and friends count: `.` segments go, `..` removes the
 *     segment before it. A `..` at the root is clamped (`/../a` -> `/a`), as
 *     the RFC, Envoy and browsers do: the result stays inside the root, so
 *     there is nothing left to protect by answering 400, and clients that
 *     build URLs by concatenation keep working. A trailing `.` or `..` leaves
 *     the trailing slash (`/a/b/..` -> `/a/`), as the RFC says.
 *  4. Consecutive slashes. Kept by default (as Envoy; `//` is a valid empty
 *     segment and some APIs use it). With merge_slashes they collapse to one
 *     as they are read, so an empty segment does not exist for rule 3
 *     either: `/a//..` is `/` when merging (nginx reads it so), `/a/` when
 *     not (the RFC: `..` removes the empty segment).
 *  5. A NUL byte is an error; every other byte is passed as it is (which
 *     bytes a request-target may hold is the codec's rule, http1.h).
 *
 * The output is never longer than the input (each input byte yields at most
 * one output byte, an escape of three yields one or three, and removals only
 * shrink), so an output buffer of `len` bytes always suffices. Normalising an
 * output again returns SL_PATH_UNCHANGED (the rules are idempotent).
 *
 * Cost: an already-normal path (no escape to rewrite, no dot segment, no `\`
 * or `//` to act on) is recognised by one scan that stops only at `%`, `.`,
 * `\` and NUL (and `/` when merging), 16 bytes at a time with SSE2, and
 * returns SL_PATH_UNCHANGED without writing anything: about 5 ns for
 * `/petstore/v1/pets/12345` on the 2-vCPU development VM, and no copy.
 *
 * Not here: calling it (runtime/proxy/request.c normalises before routing and
 * forwards the result), the query string (never touched), case folding
 * (paths are case-sensitive), Unicode normalisation, or escaping characters
 * that RFC 3986 would want escaped (the codec has already accepted them).
 */
#ifndef SL_PATH_H
#define SL_PATH_H

#include "sl_types.h"

/* What to do with `%2F`, `%5C` and a literal `\` (rule 2 above). Zero is the
 * default, so a zero-initialised sl_path_opts_t is the default behaviour. */
typedef enum {
    SL_PATH_SLASHES_REJECT = 0,
    SL_PATH_SLASHES_KEEP = 1,
    SL_PATH_SLASHES_DECODE = 2,
} sl_path_slashes_t;

typedef struct {
    uint8_t merge_slashes;   /* 1: "//" collapses to "/" (rule 4); default 0 */
    uint8_t encoded_slashes; /* sl_path_slashes_t; an unknown value acts as REJECT */
} sl_path_opts_t;

/* The input is already normal: use it as it is; `out` was not written. A name
 * of the shared vocabulary's SL_DECLINED ("nothing for me to do"). */
#define SL_PATH_UNCHANGED SL_DECLINED

/*
 * Normalises in[0..len) by the rules above.
 *
 * Returns
 *   SL_PATH_UNCHANGED - already normal; *out_len = len, out untouched (so a
 *                       caller may pass a buffer it has not filled or even
 *                       NULL with out_cap 0, and allocate only when needed);
 *   SL_OK             - out[0..*out_len) holds the normalised path, which is
 *                       not NUL-terminated and always starts with '/';
 *   SL_ERROR          - *why is a static, human-readable reason, to be
 *                       answered 400 ("malformed percent-escape in path"),
 *                       or, only when out_cap < len and work was needed, a
 *                       caller bug reported as such (answer 500).
 * out must not overlap in. opts NULL means the defaults. why may be NULL.
 */
int sl_path_normalize(const char *in, size_t len, char *out, size_t out_cap,
                      const sl_path_opts_t *opts, size_t *out_len, const char **why);

#endif
