/*
 * Helpers shared by the libFuzzer drivers of tests/fuzz/: a deterministic
 * split generator (so a crash found with one split pattern replays exactly),
 * exact-size copies (so ASan sees a read one byte past what a "socket" has
 * delivered so far) and an invariant check that aborts with a message.
 *
 * Not here: anything about a particular parser; each driver says what it
 * checks.
 */
#ifndef SL_FUZZ_UTIL_H
#define SL_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An invariant violation is a finding like a sanitizer report: libFuzzer
 * treats abort() as a crash and saves the input. */
#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz invariant violated at %s:%d: %s: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* xorshift32: split points are a function of the seed only, never of time. */
typedef struct {
    uint32_t s;
} fuzz_rng_t;

static inline void fuzz_rng_init(fuzz_rng_t *r, uint32_t seed)
{
    r->s = seed ? seed : 0x9e3779b9u;
}

static inline uint32_t fuzz_rng_next(fuzz_rng_t *r)
{
    uint32_t x = r->s;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    r->s = x;
    return x;
}

/*
 * Length of the next piece a socket would deliver: mostly small (1..8 bytes,
 * where state machines break), sometimes larger, bounded by `left`.
 */
static inline size_t fuzz_next_split(fuzz_rng_t *r, size_t left)
{
    if (left == 0)
        return 0;
    uint32_t v = fuzz_rng_next(r);
    size_t n;
    switch (v & 3) {
    case 0:
        n = 1;
        break;
    case 1:
        n = 1 + ((v >> 2) & 7);
        break;
    case 2:
        n = 1 + ((v >> 2) & 63);
        break;
    default:
        n = 1 + ((v >> 2) & 1023);
        break;
    }
    return n < left ? n : left;
}

/* A malloc'd copy of exactly len bytes (at least 1 byte allocated, so a
 * zero-length buffer is still a valid distinct pointer). */
static inline char *fuzz_dup(const uint8_t *data, size_t len)
{
    char *p = malloc(len ? len : 1);
    if (!p)
        abort();
    if (len)
        memcpy(p, data, len);
    return p;
}

/* 1 when [p, p+n) lies inside [base, base+len). */
static inline int fuzz_within(const char *base, size_t len, const char *p, size_t n)
{
    if (n == 0)
        return 1;
    if (!p)
        return 0;
    uintptr_t b = (uintptr_t)base, q = (uintptr_t)p;
    return q >= b && q - b <= len && n <= len - (q - b);
}

#endif
