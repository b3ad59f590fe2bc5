/*
 * The HTTP/2 limits of a Gateway listener (`http2:` on an h2c or https
 * listener), as one table: the Gateway field, the snapshot field, the
 * bounds and the codec's default. The validator (validate_spec.c), the
 * compiler (compiler.c) and the runtime's check of a pushed snapshot
 * (runtime/control/generation.c) all read this table, so the three cannot
 * disagree on a bound; docs/configuration.md ("Listener HTTP/2") lists the
 * same values (by hand: keep them in step). test_validate.c checks every
 * field's name and bounds through the validator.
 *
 * Not here: applying the limits (runtime/http/h2.c enforces them, and its
 * settings_fill owns the defaults; `def` below repeats them for the
 * cross-field rules and the docs, and unit/runtime/control/test_generation.c
 * checks they agree).
 */
#ifndef SL_LISTENER_HTTP2_H
#define SL_LISTENER_HTTP2_H

#include "sluice/v1/snapshot.pb-c.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *name;    /* Gateway field: "maxConcurrentStreams" */
    const char *pb_name; /* snapshot field: "max_concurrent_streams" */
    size_t pb_offset;    /* of its uint32_t in Sluice__V1__ListenerHttp2 */
    bool duration;       /* a duration in the Gateway, milliseconds in the snapshot */
    uint32_t min, max;   /* inclusive; 0 in the snapshot means `def` */
    uint32_t def;        /* the codec's default */
} sl_listener_http2_field_t;

/* Indices into sl_listener_http2_fields, in snapshot field order. */
enum {
    SL_LH2_MAX_CONCURRENT_STREAMS = 0,
    SL_LH2_STREAM_WINDOW,
    SL_LH2_CONN_WINDOW,
    SL_LH2_MAX_HEADER_LIST,
    SL_LH2_MAX_HEADER_FIELDS,
    SL_LH2_MAX_CONTINUATIONS,
    SL_LH2_HEADER_TABLE,
    SL_LH2_CTRL_FRAMES_MAX,
    SL_LH2_CTRL_WINDOW,
    SL_LH2_RESETS_MAX,
    SL_LH2_RESET_WINDOW,
    SL_LH2_EMPTY_DATA_MAX,
    SL_LH2_STREAM_SEND_BUFFER,
    SL_LH2_CONN_SEND_BUFFER,
    SL_LH2__COUNT
};

extern const sl_listener_http2_field_t sl_listener_http2_fields[SL_LH2__COUNT];

/* The value of field `i` in `m` as written (0 = unset). */
uint32_t sl_listener_http2_get(const Sluice__V1__ListenerHttp2 *m, int i);
void sl_listener_http2_set(Sluice__V1__ListenerHttp2 *m, int i, uint32_t v);

/* A cross-field rule: field `larger` (default applied) must be at least
 * field `smaller`. Terminated by {-1, -1}. */
typedef struct {
    int larger, smaller;
} sl_listener_http2_rule_t;
extern const sl_listener_http2_rule_t sl_listener_http2_rules[];

/* Checks a compiled block: every set field within its bounds, then the
 * cross-field rules with defaults applied. Returns 0, or -1 with
 * "http2.<pb_name>: <what is wrong>" in err. */
int sl_listener_http2_check(const Sluice__V1__ListenerHttp2 *m, char *err, size_t errlen);

#endif
