/*
 * Prometheus text format 0.0.4, the pieces both /metrics pages write (the
 * runtime's runtime/control/metrics.c, the controller's
 * controller/ctrl_metrics.c and rest.c): a family's HELP and TYPE lines, a
 * label value escaped, a bucket bound in seconds.
 */
#ifndef SL_PROM_H
#define SL_PROM_H

#include <stddef.h>
#include <stdint.h>

struct evbuffer;

/* "# HELP name help\n# TYPE name type\n". */
void sl_prom_header(struct evbuffer *out, const char *name, const char *type, const char *help);

/* A label value with '\\', '"' and newline escaped (no quotes added). */
void sl_prom_label_value(struct evbuffer *out, const char *v);

/* Microseconds as seconds without trailing zeros: 500 -> "0.0005",
 * 2500000 -> "2.5", 10000000 -> "10". */
void sl_prom_seconds(char *buf, size_t len, uint64_t us);

#endif
