/*
 * The traffic log's sink set from a snapshot (the Gateway's
 * spec.trafficLog.sinks) plus the --access-log shortcut, handed to the
 * logger by sl_tlog_configure on every published generation.
 */
#include "tlog_config.h"

#include "tls_pem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct {
    int have_cli;
    sl_tlog_sink_config_t cli;
    char *cli_path;
    char *fleet;
    char *runtime;
} base;

int sl_tlog_set_base(const char *access_log, int combined, const char *fleet, const char *runtime)
{
    free(base.cli_path);
    free(base.fleet);
    free(base.runtime);
    base.cli_path = access_log ? strdup(access_log) : NULL;
    base.fleet = strdup(fleet ? fleet : "");
    base.runtime = strdup(runtime ? runtime : "");
    if ((access_log && !base.cli_path) || !base.fleet || !base.runtime)
        return -1;
    base.have_cli = access_log != NULL;
    base.cli = (sl_tlog_sink_config_t){
        .name = "access-log",
        .type = "file",
        .path = base.cli_path,
        .combined = combined,
    };
    return 0;
}

const sl_tlog_sink_config_t *sl_tlog_cli_sink(void)
{
    return base.have_cli ? &base.cli : NULL;
}

int sl_tlog_apply_snapshot(const Sluice__V1__Snapshot *snap)
{
    const Sluice__V1__TrafficLog *t = snap && snap->settings ? snap->settings->traffic_log : NULL;
    const Sluice__V1__Tracing *tr = snap && snap->settings ? snap->settings->tracing : NULL;
    const Sluice__V1__TrafficLogSink *ex = tr ? tr->export : NULL;
    size_t n = (t ? t->n_sinks : 0) + (size_t)base.have_cli + (ex != NULL);
    sl_tlog_sink_config_t *v = calloc(n ? n : 1, sizeof(*v));
    if (!v)
        return -1;
    size_t k = 0;
    if (base.have_cli)
        v[k++] = base.cli;
    static const char *const types[] = {"file", "http", "elasticsearch", "clickhouse", "otlp"};
    size_t nsinks = (t ? t->n_sinks : 0) + (ex != NULL);
    for (size_t i = 0; i < nsinks; i++) {
        /* The span export is one more sink, of type otlp, after the log's. */
        const Sluice__V1__TrafficLogSink *s = t && i < t->n_sinks ? t->sinks[i] : ex;
        if ((unsigned)s->type >= SL_ARRAY_LEN(types))
            continue; /* a type newer than this runtime */
        v[k++] = (sl_tlog_sink_config_t){
            .name = s->name,
            .type = types[s->type],
            .path = s->path,
            .combined = s->format == SLUICE__V1__TRAFFIC_LOG_SINK__FORMAT__COMBINED,
            .rotate_max_bytes = s->rotate_max_bytes,
            .rotate_keep = s->rotate_keep,
            .url = s->url,
            .index = s->index,
            .table = s->table,
            .service_name = tr && s == ex ? tr->service_name : "",
            .username = s->username,
            .password = s->password,
            .api_key = s->api_key,
            .ca_pem = s->ca_pem,
            .ca_file = s->ca_file,
            .batch_max_records = s->batch_max_records,
            .batch_max_bytes = s->batch_max_bytes,
            .batch_max_delay_ms = s->batch_max_delay_ms,
            .buffer_bytes = s->buffer_bytes,
            .timeout_ms = s->timeout_ms,
            .backoff_initial_ms = s->backoff_initial_ms,
            .backoff_max_ms = s->backoff_max_ms,
        };
    }
    sl_tlog_origin_t origin = {
        .gateway = t ? t->gateway : "",
        .fleet = base.fleet ? base.fleet : (snap ? snap->fleet : ""),
        .runtime = base.runtime ? base.runtime : "",
    };
    int rc = sl_tlog_configure(v, k, &origin);
    free(v);
    return rc;
}

int sl_tlog_check_snapshot(const Sluice__V1__Snapshot *snap, char *err, size_t errlen)
{
    const Sluice__V1__TrafficLog *t = snap && snap->settings ? snap->settings->traffic_log : NULL;
    for (size_t i = 0; t && i < t->n_sinks; i++) {
        const char *path = t->sinks[i]->ca_file;
        if (!path || !path[0])
            continue;
        char why[256] = "";
        FILE *f = fopen(path, "re");
        char *text = f ? calloc(1, SL_TLOG_MAX_CA_PEM + 1) : NULL;
        if (!f)
            snprintf(why, sizeof(why), "%s", strerror(errno));
        else if (!text)
            snprintf(why, sizeof(why), "out of memory");
        else if (fread(text, 1, SL_TLOG_MAX_CA_PEM + 1, f) > SL_TLOG_MAX_CA_PEM)
            snprintf(why, sizeof(why), "larger than %d bytes", SL_TLOG_MAX_CA_PEM);
        else if (ferror(f))
            snprintf(why, sizeof(why), "%s", strerror(errno));
        else
            sl_pem_ca_load(NULL, text, why, sizeof(why));
        if (f)
            fclose(f);
        free(text);
        if (why[0]) {
            snprintf(err, errlen,
                     "Gateway %s: spec.trafficLog.sinks[%zu].caFile: %s: %s (a readable PEM file "
                     "of CA certificates on the runtime's machine)",
                     t->gateway, i, path, why);
            return -1;
        }
    }
    return 0;
}
