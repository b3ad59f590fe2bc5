/*
 * The traffic log pipeline: one record per request, from the workers to the
 * Gateway's sinks (file, http, elasticsearch, clickhouse) and to the
 * --access-log file, without ever making a request wait.
 *
 *   worker ──(its own SPSC byte ring, lock-free, bounded)──► logger thread
 *   logger thread ──(formats once: JSON; per sink: its framing)──► sink queues
 *   sink thread (one per sink) ──batches──► file / HTTP collector
 *
 * A worker copies the record's numbers and strings (each clipped to its
 * bound) into its ring: no formatting, no lock, no system call except one
 * eventfd write when its ring passes half full. A full ring drops the record
 * and counts it. The logger thread drains every ring, formats each record
 * once and appends it to every sink's queue; a queue past its memory budget
 * (bufferBytes) drops the record for that sink and counts it. Each sink has
 * its own thread, so a slow disk or a dead collector stalls only its own
 * queue, never the logger, the other sinks or a worker.
 *
 * Configuration: the Gateway's spec.trafficLog (sinks, and what goes into a
 * record), an Api's override (on/off, sampling, fields), and the
 * --access-log command-line shortcut, which is one more file sink. The
 * record settings travel with the generation (sl_tlog_policy_t, read by the
 * worker per request); the sink set is the logger's: sl_tlog_configure
 * hands it a new one, which it applies between two drains, keeping the
 * sinks whose configuration did not change (their queues and connections
 * carry over), so a reload loses no record.
 *
 * Not here: what the request path knows (request.c fills the record), the
 * signal handling (main.c calls sl_tlog_reopen on SIGUSR1), /metrics
 * (metrics.c reads sl_tlog_foreach_sink).
 */
#ifndef SL_TLOG_H
#define SL_TLOG_H

#include "sl_types.h"
#include "tlog_spec.h"

#include <stdint.h>

/* What a request's record holds, per generation route (or the Gateway's,
 * for a request without one). Read by workers; owned by the generation. */
typedef struct sl_tlog_policy {
    uint8_t enabled;
    uint32_t sample_ppm; /* records per million requests */
    uint64_t fields;     /* SL_TLOG_BIT(SL_TLOG_F_*) bits */
    uint32_t header_max_bytes;
    char *const *redact; /* lower-case names, the generation's */
    size_t num_redact;
    /* Bodies (fields request_body, response_body; tlog_body.h). */
    uint32_t body_max_bytes;
    char *const *body_redact; /* JSON / form field names, case-sensitive */
    size_t num_body_redact;
    char *const *body_types; /* lower-case content type patterns */
    size_t num_body_types;
} sl_tlog_policy_t;

/* Every field of the default set, every request: a runtime without a
 * generation, or one whose Gateway says nothing. */
extern const sl_tlog_policy_t sl_tlog_policy_default;

/* The strings of a record. */
enum sl_tlog_str {
    SL_TLOG_S_REQUEST_ID = 0,
    SL_TLOG_S_API,
    SL_TLOG_S_OPERATION,
    SL_TLOG_S_CONSUMER,
    SL_TLOG_S_CLIENT,
    SL_TLOG_S_METHOD,
    SL_TLOG_S_HOST,
    SL_TLOG_S_PATH,
    SL_TLOG_S_QUERY,
    SL_TLOG_S_UPSTREAM,
    SL_TLOG_S_ERROR,
    SL_TLOG_S_POLICY,
    SL_TLOG_S_POLICY_REASON,
    SL_TLOG_S_CACHE,
    SL_TLOG_S_USER_AGENT,
    SL_TLOG_S_REFERER,
    SL_TLOG_S_REQUEST_HEADERS,  /* a JSON object, already escaped (sl_tlog_headers_json) */
    SL_TLOG_S_RESPONSE_HEADERS, /* same */
    SL_TLOG_S_TRACE_ID,         /* 32 lower-case hex digits, or empty */
    SL_TLOG_S_SPAN_ID,          /* the gateway's server span: 16 hex digits, or empty */
    SL_TLOG_S_PARENT_ID,        /* the client's span, or empty (a trace started here) */
    SL_TLOG_S_UPSTREAM_SPAN_ID, /* the upstream call's span (sent upstream as parent) */
    /* Bodies (tlog_body.h): the members of the body's object, already
     * escaped ("content_type":"...","size":N,...), and the text it holds
     * (raw bytes, escaped when formatted; empty = no "text"). */
    SL_TLOG_S_REQUEST_BODY_META,
    SL_TLOG_S_REQUEST_BODY,
    SL_TLOG_S_RESPONSE_BODY_META,
    SL_TLOG_S_RESPONSE_BODY,
    SL_TLOG_S__COUNT
};

/* A record as the worker fills it; strings are borrowed for the call. */
typedef struct {
    uint64_t start_unix_us;
    uint64_t duration_us;
    uint64_t upstream_us; /* first attempt to the upstream's response head */
    uint64_t bytes_received;
    uint64_t bytes_sent;
    uint64_t fields; /* SL_TLOG_BIT(SL_TLOG_F_*) to write */
    int status;
    int minor_version; /* HTTP/1.x: x; -1 for HTTP/2 */
    unsigned retries;
    uint8_t upstream_timed;   /* upstream_us is set */
    uint8_t dest;             /* SL_TLOG_TO_* */
    uint32_t upstream_off_us; /* from the start to the first upstream attempt (spans) */
    sl_str_t str[SL_TLOG_S__COUNT];
} sl_tlog_record_t;

/* Which sinks a record is for: the traffic log's, the span export's. */
#define SL_TLOG_TO_LOG 1u
#define SL_TLOG_TO_TRACE 2u

/* One sink's configuration (a compiled TrafficLogSink, or the
 * --access-log shortcut). Strings are copied by sl_tlog_configure. */
typedef struct {
    const char *name;
    const char *type; /* "file", "http", "elasticsearch", "clickhouse", "otlp" */
    const char *path; /* file: a path or "stdout" */
    int combined;     /* file: nginx combined lines instead of JSON */
    uint64_t rotate_max_bytes;
    uint32_t rotate_keep;
    const char *url;
    const char *index;
    const char *table;
    const char *service_name; /* otlp: the resource's service.name */
    const char *username, *password, *api_key;
    const char *ca_pem, *ca_file; /* https: caBundle / caFile; both "" = the system's CAs */
    uint32_t batch_max_records, batch_max_bytes, batch_max_delay_ms;
    uint64_t buffer_bytes;
    uint32_t timeout_ms, backoff_initial_ms, backoff_max_ms;
} sl_tlog_sink_config_t;

/* Who writes the records, for their gateway/fleet/runtime fields. */
typedef struct {
    const char *gateway;
    const char *fleet;
    const char *runtime;
} sl_tlog_origin_t;

/* Start-up (main thread, before the workers): the rings of nworkers workers
 * and the logger thread. 0, or -1 with err. */
int sl_tlog_init(unsigned nworkers, char *err, size_t errlen);

/* Checks a sink configuration the way sl_tlog_configure will open it, so a
 * bad --access-log fails the start-up. 0, or -1 with err. */
int sl_tlog_sink_check(const sl_tlog_sink_config_t *cfg, char *err, size_t errlen);

/* Main thread: the sinks from now on (the --access-log one included), and
 * the origin fields. Applied by the logger between two drains: what was
 * logged before goes to the old set. 0, or -1 (out of memory: nothing
 * changed). */
int sl_tlog_configure(const sl_tlog_sink_config_t *sinks, size_t n, const sl_tlog_origin_t *origin);

/* Which kinds of sink are configured (SL_TLOG_TO_* bits; 0 = none): the
 * worker's first, cheapest test. */
extern int sl_tlog_active_flag;
static inline int sl_tlog_active(void)
{
    return __atomic_load_n(&sl_tlog_active_flag, __ATOMIC_RELAXED);
}

/* Worker `worker` logs one record; never blocks. */
void sl_tlog_write(unsigned worker, const sl_tlog_record_t *rec);

/* Worker: the headers a record keeps, as one JSON object ({"name":"value"},
 * names lower-cased, repeated names joined with ", ", the policy's redacted
 * names' values "[redacted]", at most max_bytes, with "_truncated":true when
 * cut). Returns the length written into out (cap >= max_bytes + 32). */
size_t sl_tlog_headers_json(const sl_tlog_policy_t *p, const sl_str_t *names,
                            const sl_str_t *values, size_t n, char *out, size_t cap);

/* Main thread (SIGUSR1): every file sink writes what was logged so far to
 * its current file, then reopens its path (logrotate renamed it). Waits at
 * most 2 s. */
void sl_tlog_reopen(void);

/* Shutdown (after the workers stopped): everything logged is handed to the
 * sinks, each gets one last delivery attempt (network sinks at most their
 * timeout), then the threads end. */
void sl_tlog_shutdown(void);

/* Metrics, any thread (takes the set lock, never held by a worker). */
typedef struct {
    const char *name;
    const char *type;
    uint64_t records_written; /* delivered: written to the file, accepted by the collector */
    uint64_t dropped;         /* every record this sink did not get or could not deliver */
    uint64_t queue_bytes;     /* queued and in flight */
    uint64_t queue_records;   /* same */
    uint64_t batches_failed;  /* delivery attempts that failed (then retried or dropped) */
} sl_tlog_sink_stats_t;
void sl_tlog_foreach_sink(void (*fn)(const sl_tlog_sink_stats_t *st, void *arg), void *arg);
/* Records dropped because a worker's ring was full (every sink counts them too). */
uint64_t sl_tlog_ring_dropped(void);
/* Bytes waiting in the workers' rings now. */
uint64_t sl_tlog_ring_bytes(void);

#endif
