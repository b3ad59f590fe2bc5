/*
 * Prometheus text format helpers (prom.h).
 */
#include "prom.h"

#include <event2/buffer.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

void sl_prom_header(struct evbuffer *out, const char *name, const char *type, const char *help)
{
    evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void sl_prom_label_value(struct evbuffer *out, const char *v)
{
    const char *run = v;
    for (const char *p = v; *p; p++) {
        const char *esc = *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" : *p == '\n' ? "\\n" : NULL;
        if (esc) {
            evbuffer_add(out, run, (size_t)(p - run));
            evbuffer_add(out, esc, 2);
            run = p + 1;
        }
    }
    evbuffer_add(out, run, strlen(run));
}

void sl_prom_seconds(char *buf, size_t len, uint64_t us)
{
    uint64_t whole = us / 1000000, frac = us % 1000000;
    if (frac == 0) {
        snprintf(buf, len, "%" PRIu64, whole);
        return;
    }
    char digits[8];
    snprintf(digits, sizeof(digits), "%06" PRIu64, frac);
    size_t n = strlen(digits);
    while (n > 0 && digits[n - 1] == '0')
        digits[--n] = '\0';
    snprintf(buf, len, "%" PRIu64 ".%s", whole, digits);
}
