/*
 * Inside the traffic log: a sink, its queue and its thread (tlog.c), and
 * the ops each type provides (tlog_file.c, tlog_net.c). Not a public
 * interface: the rest of the runtime uses tlog.h.
 *
 * A sink's queue holds encoded records: bytes in the sink's own framing
 * (a JSON line; an Elasticsearch action line and its document; ...), each
 * record ending its last line with '\n'. The logger thread appends under
 * the sink's lock; the sink thread takes a batch out under the lock and
 * delivers it without it. queue_bytes + inflight_bytes never exceed
 * buffer_bytes: the record that would is dropped and counted.
 */
#ifndef SL_TLOG_SINK_H
#define SL_TLOG_SINK_H

#include "tlog.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* A decoded record (logger thread), with the origin it is written with. */
typedef struct {
    sl_tlog_record_t rec;
    const sl_tlog_origin_t *origin;
    uint8_t padded; /* its strings have 7 readable bytes after them (in a ring) */
} sl_tlog_view_t;

/* A growable byte buffer of the logger and sink threads. */
typedef struct {
    char *data;
    size_t len, cap;
} sl_tlog_buf_t;
int sl_tlog_buf_add(sl_tlog_buf_t *b, const void *p, size_t n);
void sl_tlog_buf_free(sl_tlog_buf_t *b);

struct sl_tlog_sink;

enum sl_tlog_deliver_result {
    SL_TLOG_DELIVERED = 0, /* the whole batch (some records may have been counted rejected) */
    SL_TLOG_RETRY,         /* nothing (or part) delivered: the batch now holds what to resend */
};

typedef struct {
    const char *type;
    /* Framing of one record, appended to out (logger thread). json is the
     * record as one JSON object without a newline. */
    int (*encode)(struct sl_tlog_sink *s, const sl_tlog_view_t *v, const char *json,
                  size_t json_len, sl_tlog_buf_t *out);
    /* Sink thread: delivers batch (nrec records). May rewrite the batch to
     * what is left to retry, setting *nrec. Adds what it delivered and what
     * the collector refused for good to the sink's counters itself. */
    enum sl_tlog_deliver_result (*deliver)(struct sl_tlog_sink *s, sl_tlog_buf_t *batch,
                                           unsigned *nrec);
    /* Sink thread: reopen the file (SIGUSR1); NULL = nothing to reopen. */
    void (*reopen)(struct sl_tlog_sink *s);
    /* Sink thread, at its end: close what deliver opened. */
    void (*close)(struct sl_tlog_sink *s);
    /* Records per "line" unit: how many '\n' end one record. */
    unsigned lines_per_record;
    /* Takes the records meant for span export (SL_TLOG_TO_TRACE) instead
     * of the traffic log's. */
    uint8_t trace;
} sl_tlog_sink_ops_t;

typedef struct sl_tlog_sink {
    struct sl_tlog_sink *next;
    char *key;                 /* the whole configuration, to tell a changed sink from a kept one */
    sl_tlog_sink_config_t cfg; /* strings owned (copies) */
    const sl_tlog_sink_ops_t *ops;

    pthread_mutex_t lock;
    pthread_cond_t cond; /* the sink thread waits on it */
    pthread_cond_t done_cond;
    sl_tlog_buf_t queue; /* under lock */
    unsigned queue_records;
    uint64_t first_queued_ms; /* when the oldest queued record came */
    size_t inflight_bytes;    /* taken by the sink thread, not delivered yet */
    unsigned inflight_records;
    int stopping; /* under lock: deliver what is queued once, then end */
    uint64_t reopen_req, reopen_done;
    pthread_t thread;
    int thread_started;
    atomic_int finished;

    _Atomic uint64_t written;
    _Atomic uint64_t dropped;
    _Atomic uint64_t batches_failed;
    _Atomic uint64_t lost_logged_ms; /* when a drop was last logged (sl_tlog_sink_lost) */

    /* Type state (sink thread only, except what open set up). */
    void *state;
    /* Logger thread: the day the cached Elasticsearch index name is for. */
    uint64_t es_day;
    char es_action[320];
    size_t es_action_len;
} sl_tlog_sink_t;

/* Adds n to the sink's dropped count and says why, once per distinct why
 * and not more than once a minute. Any thread. */
void sl_tlog_sink_lost(sl_tlog_sink_t *s, uint64_t n, const char *why);

/* Milliseconds on the monotonic clock. */
uint64_t sl_tlog_now_ms(void);

/* Sink thread: waits ms or until the sink is stopping; 1 if stopping. */
int sl_tlog_sink_sleep(sl_tlog_sink_t *s, uint64_t ms);

/* The ops of each type, and the file sink's open check. */
extern const sl_tlog_sink_ops_t sl_tlog_file_ops;
extern const sl_tlog_sink_ops_t sl_tlog_http_ops;
extern const sl_tlog_sink_ops_t sl_tlog_es_ops;
extern const sl_tlog_sink_ops_t sl_tlog_clickhouse_ops;
extern const sl_tlog_sink_ops_t sl_tlog_otlp_ops;
int sl_tlog_file_open(sl_tlog_sink_t *s, char *err, size_t errlen);
int sl_tlog_net_open(sl_tlog_sink_t *s, char *err, size_t errlen);

/* The OTLP/JSON spans of a record (tlog.c): the gateway's server span and,
 * when an upstream was called, its client span, as two elements of a
 * "spans" array ("{...},{...}"), appended to out. */
int sl_tlog_format_spans(const sl_tlog_view_t *v, sl_tlog_buf_t *out);

/* The nginx "combined" line of a record (tlog.c). */
int sl_tlog_format_combined(const sl_tlog_view_t *v, sl_tlog_buf_t *out);

#endif
