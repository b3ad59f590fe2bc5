/*
 * The error list of the model library: every parse, validation and compile
 * problem becomes one sl_error_t carrying where it came from (file, document,
 * field path) so that a person can find and fix it. Formatting lives here so
 * the controller's REST answers and the runtime's start-up messages agree.
 *
 * Not responsible for deciding what is an error (yaml.c, validate.c,
 * compiler.c do) nor for logging.
 *
 * Allocation failure while recording an error aborts: errors are produced at
 * start-up or in the controller, never on the request path, and a silently
 * dropped error would let invalid config through.
 */
#include "model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A hostile document can produce an error per field; past this many the rest
 * add nothing a person would read, and memory stays bounded. */
#define SL_ERRORS_MAX 1000

static void *xmalloc_or_die(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fputs("sluice: out of memory while recording a configuration error\n", stderr);
        abort();
    }
    return p;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s ? s : "") + 1;
    char *d = xmalloc_or_die(n);
    memcpy(d, s ? s : "", n);
    return d;
}

void sl_errors_init(sl_errors_t *errs)
{
    errs->items = NULL;
    errs->count = 0;
    errs->cap = 0;
}

void sl_errors_free(sl_errors_t *errs)
{
    for (size_t i = 0; i < errs->count; i++) {
        free(errs->items[i].source);
        free(errs->items[i].field);
        free(errs->items[i].message);
    }
    free(errs->items);
    sl_errors_init(errs);
}

void sl_errors_add(sl_errors_t *errs, const char *source, int doc, const char *field,
                   const char *fmt, ...)
{
    if (errs->count >= SL_ERRORS_MAX)
        return;
    if (errs->count == errs->cap) {
        size_t ncap = errs->cap ? errs->cap * 2 : 8;
        sl_error_t *n = realloc(errs->items, ncap * sizeof(*n));
        if (!n) {
            fputs("sluice: out of memory while recording a configuration error\n", stderr);
            abort();
        }
        errs->items = n;
        errs->cap = ncap;
    }
    sl_error_t *e = &errs->items[errs->count];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (len < 0)
        len = 0;
    e->message = xmalloc_or_die((size_t)len + 1);
    va_start(ap, fmt);
    vsnprintf(e->message, (size_t)len + 1, fmt, ap);
    va_end(ap);
    e->source = xstrdup(source);
    e->doc = doc;
    e->field = xstrdup(field);
    errs->count++;
}

char *sl_error_format(const sl_error_t *e)
{
    char docbuf[32] = "";
    const char *src = e->source ? e->source : "";
    const char *field = e->field ? e->field : "";
    if (e->doc > 0)
        snprintf(docbuf, sizeof(docbuf), "%sdoc %d", src[0] ? " " : "", e->doc);
    size_t n = strlen(src) + strlen(docbuf) + strlen(field) + strlen(e->message) + 8;
    char *out = xmalloc_or_die(n);
    int head = src[0] || docbuf[0];
    snprintf(out, n, "%s%s%s%s%s%s", src, docbuf, head ? ": " : "", field, field[0] ? ": " : "",
             e->message);
    return out;
}

char *sl_errors_format(const sl_errors_t *errs)
{
    size_t total = 1, used = 0;
    char *out = xmalloc_or_die(total);
    out[0] = '\0';
    for (size_t i = 0; i < errs->count; i++) {
        char *line = sl_error_format(&errs->items[i]);
        size_t ll = strlen(line);
        char *n = realloc(out, total + ll + 1);
        if (!n) {
            fputs("sluice: out of memory while formatting configuration errors\n", stderr);
            abort();
        }
        out = n;
        memcpy(out + used, line, ll);
        used += ll;
        out[used++] = '\n';
        out[used] = '\0';
        total += ll + 1;
        free(line);
    }
    return out;
}
