/*
 * A flat byte buffer with a read and a write offset: what a connection reads
 * into and writes out of. Bounded by its capacity; growth is explicit.
 */
#ifndef SL_BUF_H
#define SL_BUF_H

#include <stdlib.h>
#include <string.h>

typedef struct {
    char *data;
    size_t start; /* first unread byte */
    size_t end;   /* one past the last written byte */
    size_t cap;
} sl_buf_t;

static inline size_t sl_buf_len(const sl_buf_t *b) { return b->end - b->start; }
static inline size_t sl_buf_space(const sl_buf_t *b) { return b->cap - b->end; }
static inline char *sl_buf_head(const sl_buf_t *b) { return b->data + b->start; }
static inline char *sl_buf_tail(const sl_buf_t *b) { return b->data + b->end; }

static inline void sl_buf_consume(sl_buf_t *b, size_t n)
{
    b->start += n;
    if (b->start == b->end)
        b->start = b->end = 0;
}

/* Moves unread bytes to the front so the free space is contiguous. */
static inline void sl_buf_compact(sl_buf_t *b)
{
    if (b->start == 0)
        return;
    size_t len = b->end - b->start;
    memmove(b->data, b->data + b->start, len);
    b->start = 0;
    b->end = len;
}

/* Ensures capacity >= cap; returns -1 on allocation failure. */
static inline int sl_buf_reserve(sl_buf_t *b, size_t cap)
{
    if (b->cap >= cap)
        return 0;
    char *d = realloc(b->data, cap);
    if (!d)
        return -1;
    b->data = d;
    b->cap = cap;
    return 0;
}

/* Makes room for n more bytes at the tail; -1 on allocation failure. */
static inline int sl_buf_room(sl_buf_t *b, size_t n)
{
    if (sl_buf_space(b) < n) {
        sl_buf_compact(b);
        if (sl_buf_space(b) < n) {
            size_t want = b->cap ? b->cap * 2 : 4096;
            while (want < b->end + n)
                want *= 2;
            if (sl_buf_reserve(b, want) != 0)
                return -1;
        }
    }
    return 0;
}

/* Appends n bytes, growing as needed. */
static inline int sl_buf_append(sl_buf_t *b, const void *p, size_t n)
{
    if (sl_buf_room(b, n) != 0)
        return -1;
    memcpy(b->data + b->end, p, n);
    b->end += n;
    return 0;
}

/* Appends a header line "name: value\r\n": one room check for the four
 * pieces a head writer would otherwise append one by one. */
static inline int sl_buf_append_field(sl_buf_t *b, const char *name, size_t name_len,
                                      const char *value, size_t value_len)
{
    if (sl_buf_room(b, name_len + value_len + 4) != 0)
        return -1;
    char *t = b->data + b->end;
    memcpy(t, name, name_len);
    t += name_len;
    t[0] = ':';
    t[1] = ' ';
    memcpy(t + 2, value, value_len);
    t += 2 + value_len;
    t[0] = '\r';
    t[1] = '\n';
    b->end += name_len + value_len + 4;
    return 0;
}

static inline void sl_buf_free(sl_buf_t *b)
{
    free(b->data);
    b->data = NULL;
    b->start = b->end = b->cap = 0;
}

#endif
