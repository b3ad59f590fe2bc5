/*
 * Controller histograms, REST and watch counters (ctrl_metrics.h).
 */
#include "ctrl_metrics.h"

#include "prom.h"

#include <event2/buffer.h>
#include <event2/http.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

const uint64_t sl_ctrl_hist_bounds_us[SL_CTRL_HIST_BUCKETS - 1] = {
    100,    250,    500,    1000,    2500,    5000,    10000,    25000,    50000,
    100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000, 30000000,
};

sl_ctrl_hist_t sl_ctrl_store_read_seconds;
sl_ctrl_hist_t sl_ctrl_store_write_seconds;
sl_ctrl_hist_t sl_ctrl_push_ack_seconds;
sl_ctrl_hist_t sl_ctrl_push_nack_seconds;

uint64_t sl_ctrl_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void sl_ctrl_hist_observe(sl_ctrl_hist_t *h, uint64_t us)
{
    unsigned b = 0;
    while (b < SL_CTRL_HIST_BUCKETS - 1 && us > sl_ctrl_hist_bounds_us[b])
        b++;
    atomic_fetch_add_explicit(&h->buckets[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_us, us, memory_order_relaxed);
}

void sl_ctrl_hist_render(struct evbuffer *b, const char *name, const char *labels,
                         const sl_ctrl_hist_t *h)
{
    const char *sep = labels[0] ? "," : "";
    uint64_t cumulative = 0;
    for (unsigned i = 0; i < SL_CTRL_HIST_BUCKETS; i++) {
        char le[32];
        cumulative += atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
        if (i < SL_CTRL_HIST_BUCKETS - 1)
            sl_prom_seconds(le, sizeof(le), sl_ctrl_hist_bounds_us[i]);
        else
            strcpy(le, "+Inf");
        evbuffer_add_printf(b, "%s_bucket{%s%sle=\"%s\"} %" PRIu64 "\n", name, labels, sep, le,
                            cumulative);
    }
    uint64_t sum = atomic_load_explicit(&h->sum_us, memory_order_relaxed);
    const char *open = labels[0] ? "{" : "", *close = labels[0] ? "}" : "";
    evbuffer_add_printf(b, "%s_sum%s%s%s %" PRIu64 ".%06" PRIu64 "\n", name, open, labels, close,
                        sum / 1000000, sum % 1000000);
    /* The count is the +Inf bucket, so the two always agree. */
    evbuffer_add_printf(b, "%s_count%s%s%s %" PRIu64 "\n", name, open, labels, close, cumulative);
}

/* ---- REST requests ---------------------------------------------------------- */

static const struct {
    int cmd;
    const char *name;
} methods[] = {
    {EVHTTP_REQ_GET, "GET"},         {EVHTTP_REQ_HEAD, "HEAD"},   {EVHTTP_REQ_POST, "POST"},
    {EVHTTP_REQ_PUT, "PUT"},         {EVHTTP_REQ_PATCH, "PATCH"}, {EVHTTP_REQ_DELETE, "DELETE"},
    {EVHTTP_REQ_OPTIONS, "OPTIONS"}, {EVHTTP_REQ_TRACE, "TRACE"}, {EVHTTP_REQ_CONNECT, "CONNECT"},
};
#define NMETHODS (sizeof(methods) / sizeof(methods[0]) + 1) /* + "other" */
#define CODE_MIN 100
#define CODE_MAX 599

static _Atomic uint64_t rest_requests[NMETHODS][CODE_MAX - CODE_MIN + 2]; /* last: other codes */

void sl_ctrl_count_rest(int evhttp_cmd, int status)
{
    size_t m = NMETHODS - 1;
    for (size_t i = 0; i < NMETHODS - 1; i++)
        if (methods[i].cmd == evhttp_cmd)
            m = i;
    size_t c = (status >= CODE_MIN && status <= CODE_MAX) ? (size_t)(status - CODE_MIN)
                                                          : (size_t)(CODE_MAX - CODE_MIN + 1);
    atomic_fetch_add_explicit(&rest_requests[m][c], 1, memory_order_relaxed);
}

void sl_ctrl_render_rest(struct evbuffer *b)
{
    evbuffer_add_printf(b, "# HELP sluice_controller_http_requests_total Responses of the REST "
                           "API and the health and metrics endpoints, by method and status "
                           "code.\n# TYPE sluice_controller_http_requests_total counter\n");
    for (size_t m = 0; m < NMETHODS; m++) {
        for (size_t c = 0; c < CODE_MAX - CODE_MIN + 2; c++) {
            uint64_t v = atomic_load_explicit(&rest_requests[m][c], memory_order_relaxed);
            if (!v)
                continue;
            char code[8];
            if (c <= CODE_MAX - CODE_MIN)
                snprintf(code, sizeof(code), "%zu", c + CODE_MIN);
            else
                strcpy(code, "other");
            evbuffer_add_printf(b,
                                "sluice_controller_http_requests_total{method=\"%s\",code=\"%s\"} "
                                "%" PRIu64 "\n",
                                m < NMETHODS - 1 ? methods[m].name : "other", code, v);
        }
    }
}

/* ---- watches ------------------------------------------------------------------ */

static const char *const watch_event_types[] = {"ADDED", "MODIFIED", "DELETED", "BOOKMARK",
                                                "ERROR"};
#define NWATCH_TYPES (sizeof(watch_event_types) / sizeof(watch_event_types[0]))

static _Atomic int64_t watches_open;
static _Atomic uint64_t watch_events[NWATCH_TYPES];

void sl_ctrl_watch_opened(void)
{
    atomic_fetch_add_explicit(&watches_open, 1, memory_order_relaxed);
}

void sl_ctrl_watch_closed(void)
{
    atomic_fetch_sub_explicit(&watches_open, 1, memory_order_relaxed);
}

void sl_ctrl_count_watch_event(const char *type)
{
    for (size_t i = 0; i < NWATCH_TYPES; i++) {
        if (strcmp(type, watch_event_types[i]) == 0) {
            atomic_fetch_add_explicit(&watch_events[i], 1, memory_order_relaxed);
            return;
        }
    }
}

void sl_ctrl_render_watch(struct evbuffer *b)
{
    int64_t open = atomic_load_explicit(&watches_open, memory_order_relaxed);
    sl_prom_header(b, "sluice_controller_watches", "gauge",
                   "Open watches (?watch=true) on the controller's resources.");
    evbuffer_add_printf(b, "sluice_controller_watches %" PRId64 "\n", open < 0 ? 0 : open);
    sl_prom_header(b, "sluice_controller_watch_events_total", "counter",
                   "Events written to watches (one per watch an event was sent to), by type.");
    for (size_t i = 0; i < NWATCH_TYPES; i++)
        evbuffer_add_printf(b, "sluice_controller_watch_events_total{type=\"%s\"} %" PRIu64 "\n",
                            watch_event_types[i],
                            atomic_load_explicit(&watch_events[i], memory_order_relaxed));
}
