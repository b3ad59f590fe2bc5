/*
 * Number formatting for the paths that build text per request (the
 * decision API's JSON, the traffic log, rate-limit keys, hash-ring keys),
 * where snprintf would cost more than the rest of the work together.
 */
#ifndef SL_FMT_H
#define SL_FMT_H

#include <stddef.h>
#include <stdint.h>

/* The decimal digits of v into buf (at least 20 bytes, no terminator);
 * returns their count. */
static inline size_t sl_fmt_u64(char *buf, uint64_t v)
{
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        buf[i] = tmp[n - 1 - i];
    return n;
}

#endif
