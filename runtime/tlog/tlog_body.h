/*
 * Request and response bodies in traffic log records (fields request_body
 * and response_body; docs/configuration.md "Traffic log", bodies).
 *
 * A body's record value is one JSON object with fixed keys, so that a search
 * index maps it once whatever the body holds:
 *   {"content_type":"application/json","size":1234,"_truncated":234,
 *    "text":"{\"user\":\"ann\",\"password\":\"[redacted]\"}"}
 * content_type  the Content-Type as sent (clipped to 128 bytes);
 * size          the body's bytes (payload: chunk framing never counts);
 * _truncated    bytes past the cap (bodies.maxBytes) not kept, when any;
 * _omitted      why no text is logged: a content type not listed in
 *               bodies.contentTypes, or a JSON body that cannot be redacted
 *               (truncated at the cap, or invalid) while bodies.redact is
 *               set: redaction fails closed, never the raw bytes;
 * text          the kept bytes (redacted), always a JSON string, even for
 *               a JSON body: an index mapping keeps one type for it.
 *
 * The worker captures the first maxBytes of a body as they stream (the
 * codec calls request.c's sl_request_body_seen with the bytes it moves, no
 * whole-body read); this file holds what needs no request: which content
 * types are kept, redaction, and the record strings.
 *
 * Not here: the capture itself (request.c), formatting the object around
 * the strings (tlog.c, format_json).
 */
#ifndef SL_TLOG_BODY_H
#define SL_TLOG_BODY_H

#include "tlog.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The most bytes of a body's meta members (content_type escaped, size,
 * _truncated, _omitted). */
#define SL_TLOG_BODY_TYPE_MAX 128
#define SL_TLOG_BODY_META_MAX (6 * SL_TLOG_BODY_TYPE_MAX + 192)
/* A redacted text is at most this many bytes for n kept: a redacted value
 * grows by at most 10 bytes ("[redacted]" for an empty form value) and
 * takes at least 3 bytes of input ("a=&"; a JSON member takes 6). */
#define SL_TLOG_BODY_REDACTED_MAX(n) (5 * (size_t)(n) + 16)

enum sl_tlog_body_kind {
    SL_TLOG_BODY_SKIP = 0, /* a content type whose bytes are not kept */
    SL_TLOG_BODY_TEXT,
    SL_TLOG_BODY_JSON, /* application/json, application/<x>+json */
    SL_TLOG_BODY_FORM, /* application/x-www-form-urlencoded */
};

/* What the record needs of one captured body. */
typedef struct {
    uint8_t kind;     /* enum sl_tlog_body_kind */
    sl_str_t ctype;   /* the Content-Type value; empty = none sent */
    const char *data; /* the first bytes of the body */
    size_t len;       /* kept */
    uint64_t size;    /* seen (> len: cut at the cap) */
} sl_tlog_body_t;

/* The kind of a body with this Content-Type under p (SKIP when p's
 * contentTypes do not list it, or none was sent). */
int sl_tlog_body_kind(const sl_tlog_policy_t *p, const char *ctype, size_t len);

/* Copies the JSON text in[0..n) to out with the value of every member whose
 * (unescaped) name is one of names, at any depth, replaced by "[redacted]".
 * out holds SL_TLOG_BODY_REDACTED_MAX(n). Returns the length written, or -1
 * when in is not exactly one valid JSON value (invalid, cut short, nested
 * deeper than 64): nothing in out is then to be logged. */
ssize_t sl_tlog_redact_json(const char *in, size_t n, char *const *names, size_t num_names,
                            char *out);

/* Same for an application/x-www-form-urlencoded text: the value of every
 * pair whose (percent-decoded) name is one of names becomes "[redacted]".
 * Never fails: a pair cut short by the cap keeps its name only. */
size_t sl_tlog_redact_form(const char *in, size_t n, char *const *names, size_t num_names,
                           char *out);

/* The record strings of body b under p: the meta members into meta (holds
 * SL_TLOG_BODY_META_MAX; returns their length) and, in *text, the text to
 * log (b's bytes, or their redacted copy in scratch, which holds
 * SL_TLOG_BODY_REDACTED_MAX(b->len); empty when none is logged). */
size_t sl_tlog_body_strings(const sl_tlog_policy_t *p, const sl_tlog_body_t *b, char *meta,
                            sl_str_t *text, char *scratch);

#endif
