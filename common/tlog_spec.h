/*
 * The traffic log's configuration, shared by the controller and the runtime:
 * the record's field names (the keys of a JSON record, and the names a
 * `fields` list uses), the schemas of a Gateway's `spec.trafficLog` and of an
 * Api's override, and the defaults the compiler applies
 * (docs/configuration.md, "Traffic log").
 *
 * Not here: writing records (runtime/tlog/), compiling (compiler.c).
 */
#ifndef SL_TLOG_SPEC_H
#define SL_TLOG_SPEC_H

#include <jansson.h>
#include <stdint.h>

/* Bit i of a field mask = sl_tlog_field_names[i]. Order is the order of the
 * keys in a JSON record; the numbers travel in snapshots (append only). */
enum sl_tlog_field {
    SL_TLOG_F_TIME = 0,
    SL_TLOG_F_REQUEST_ID,
    SL_TLOG_F_GATEWAY,
    SL_TLOG_F_FLEET,
    SL_TLOG_F_RUNTIME,
    SL_TLOG_F_API,
    SL_TLOG_F_OPERATION,
    SL_TLOG_F_CONSUMER,
    SL_TLOG_F_CLIENT,
    SL_TLOG_F_METHOD,
    SL_TLOG_F_HOST,
    SL_TLOG_F_PATH,
    SL_TLOG_F_QUERY,
    SL_TLOG_F_PROTOCOL,
    SL_TLOG_F_STATUS,
    SL_TLOG_F_BYTES_RECEIVED,
    SL_TLOG_F_BYTES_SENT,
    SL_TLOG_F_DURATION_MS,
    SL_TLOG_F_UPSTREAM_MS,
    SL_TLOG_F_GATEWAY_MS,
    SL_TLOG_F_UPSTREAM,
    SL_TLOG_F_RETRIES,
    SL_TLOG_F_ERROR,
    SL_TLOG_F_POLICY,
    SL_TLOG_F_POLICY_REASON,
    SL_TLOG_F_CACHE,
    SL_TLOG_F_USER_AGENT,
    SL_TLOG_F_REFERER,
    SL_TLOG_F_REQUEST_HEADERS,
    SL_TLOG_F_RESPONSE_HEADERS,
    SL_TLOG_F_TRACE_ID,
    SL_TLOG_F_SPAN_ID,
    SL_TLOG_F_REQUEST_BODY,
    SL_TLOG_F_RESPONSE_BODY,
    SL_TLOG_F__COUNT
};

extern const char *const sl_tlog_field_names[SL_TLOG_F__COUNT + 1]; /* NULL-terminated */
/* A field mask is 64 bits (snapshots carry it as uint64 `fields64`, and its
 * low 32 bits as `fields` for a runtime that predates the wider mask). */
_Static_assert(SL_TLOG_F__COUNT <= 64, "traffic log field masks are 64 bits");
#define SL_TLOG_BIT(f) (1ull << (f))

/* Every field but the headers and the bodies. */
#define SL_TLOG_FIELDS_DEFAULT                                                                     \
    (((SL_TLOG_BIT(SL_TLOG_F__COUNT - 1) << 1) - 1) &                                              \
     ~(SL_TLOG_BIT(SL_TLOG_F_REQUEST_HEADERS) | SL_TLOG_BIT(SL_TLOG_F_RESPONSE_HEADERS) |          \
       SL_TLOG_BIT(SL_TLOG_F_REQUEST_BODY) | SL_TLOG_BIT(SL_TLOG_F_RESPONSE_BODY)))

/* Defaults (docs/configuration.md lists the same). */
#define SL_TLOG_DEF_HEADER_MAX_BYTES 2048
#define SL_TLOG_MAX_HEADER_MAX_BYTES 16384
#define SL_TLOG_DEF_BODY_MAX_BYTES 4096
#define SL_TLOG_MAX_BODY_MAX_BYTES 65536
#define SL_TLOG_MAX_BODY_REDACT 64
#define SL_TLOG_MAX_BODY_CONTENT_TYPES 32
#define SL_TLOG_DEF_BATCH_RECORDS 500
#define SL_TLOG_DEF_BATCH_BYTES (1024 * 1024)
#define SL_TLOG_DEF_BATCH_DELAY_MS 1000
#define SL_TLOG_DEF_FILE_BATCH_DELAY_MS 100
#define SL_TLOG_DEF_BUFFER_BYTES (16u * 1024 * 1024)
#define SL_TLOG_DEF_TIMEOUT_MS 5000
#define SL_TLOG_DEF_BACKOFF_INITIAL_MS 200
#define SL_TLOG_DEF_BACKOFF_MAX_MS 30000
#define SL_TLOG_DEF_ROTATE_KEEP 5
#define SL_TLOG_DEF_ES_INDEX "sluice"
#define SL_TLOG_DEF_CH_TABLE "sluice_traffic"

/* Headers whose values are always replaced by "[redacted]". */
extern const char *const sl_tlog_default_redact[];

/* The content types whose bodies a record holds when `bodies.contentTypes`
 * says nothing (NULL-terminated). */
extern const char *const sl_tlog_default_body_types[];

/* Whether a Content-Type value (parameters allowed, any case) matches one of
 * the patterns ("type/subtype", "type/any" written with a star, or a star
 * and "+suffix" as the subtype; lower case). */
int sl_tlog_content_type_match(const char *const *patterns, size_t n, const char *ctype,
                               size_t len);

/* The mask of a validated `fields` list. */
uint64_t sl_tlog_fields_mask(json_t *list);

/* A validated sampling value (0..1) in records per million. */
uint32_t sl_tlog_sample_ppm(json_t *v);

/* A caBundle's longest text. */
#define SL_TLOG_MAX_CA_PEM (1024 * 1024)

#endif
