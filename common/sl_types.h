/*
 * Result vocabulary shared by every Sluice module (nginx's NGX_OK/NGX_AGAIN
 * style). Nothing else belongs here: this header is included everywhere, so it
 * stays tiny and includes only libc.
 */
#ifndef SL_TYPES_H
#define SL_TYPES_H

#include <stddef.h>
#include <stdint.h>

#define SL_OK 0
#define SL_ERROR (-1)
#define SL_AGAIN (-2)    /* would block / need more input */
#define SL_DECLINED (-3) /* not mine, next handler */
#define SL_DONE (-4)     /* a response was sent, stop processing */

#define SL_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#if defined(__GNUC__)
#define sl_likely(x) __builtin_expect(!!(x), 1)
#define sl_unlikely(x) __builtin_expect(!!(x), 0)
#else
#define sl_likely(x) (x)
#define sl_unlikely(x) (x)
#endif

/* A borrowed byte range: points into a buffer someone else owns. */
typedef struct {
    const char *ptr;
    size_t len;
} sl_str_t;

#define SL_STR(lit) ((sl_str_t){(lit), sizeof(lit) - 1})

#endif
