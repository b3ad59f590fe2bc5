/*
 * Histograms and REST request counters of the controller's /metrics, and
 * the Prometheus text helpers (label escaping, histogram lines) the
 * renderers share. The simple counters stay in sl_ctrl_metrics
 * (controller.h).
 *
 * Threading: observations are atomic adds (the store and the REST server
 * run on the main thread, the stream callbacks too, but /metrics may be
 * read while another thread counts); a scrape reads each counter on its
 * own, so a histogram's buckets and count may differ by an observation in
 * flight, which Prometheus accepts.
 */
#ifndef SL_CTRL_METRICS_H
#define SL_CTRL_METRICS_H

#include <stdatomic.h>
#include <stdint.h>

struct evbuffer;

/* Bucket upper bounds in microseconds, 100 us to 30 s; +Inf last. */
#define SL_CTRL_HIST_BUCKETS 18
extern const uint64_t sl_ctrl_hist_bounds_us[SL_CTRL_HIST_BUCKETS - 1];

typedef struct {
    _Atomic uint64_t buckets[SL_CTRL_HIST_BUCKETS]; /* not cumulative */
    _Atomic uint64_t sum_us;
} sl_ctrl_hist_t;

void sl_ctrl_hist_observe(sl_ctrl_hist_t *h, uint64_t us);

/* The _bucket, _sum and _count lines of `name` (no HELP/TYPE), with
 * `labels` (already escaped, e.g. "op=\"read\"", or "") before le. */
void sl_ctrl_hist_render(struct evbuffer *b, const char *name, const char *labels,
                         const sl_ctrl_hist_t *h);

/* Store operations, timed by store.c: reads (get, list, load, counter
 * reads) and writes (transactions, fsync included). */
extern sl_ctrl_hist_t sl_ctrl_store_read_seconds;
extern sl_ctrl_hist_t sl_ctrl_store_write_seconds;

/* From a config response sent on the stream to the runtime's ACK or NACK
 * of its nonce. */
extern sl_ctrl_hist_t sl_ctrl_push_ack_seconds;
extern sl_ctrl_hist_t sl_ctrl_push_nack_seconds;

/* One REST response (rest.c, send_body): its method (an evhttp
 * EVHTTP_REQ_* bit) and status code. */
void sl_ctrl_count_rest(int evhttp_cmd, int status);
/* sluice_controller_http_requests_total{method,code} (HELP and TYPE
 * included; only the pairs seen). */
void sl_ctrl_render_rest(struct evbuffer *b);

/* Watches (watch.c): open watches over every hub, and events written to
 * them by type (ADDED, MODIFIED, DELETED, BOOKMARK, ERROR). */
void sl_ctrl_watch_opened(void);
void sl_ctrl_watch_closed(void);
void sl_ctrl_count_watch_event(const char *type);
/* sluice_controller_watches and sluice_controller_watch_events_total{type}
 * (HELP and TYPE included). */
void sl_ctrl_render_watch(struct evbuffer *b);

/* Monotonic microseconds. */
uint64_t sl_ctrl_now_us(void);

#endif
