/*
 * Where the traffic log's sinks come from: the published snapshot's
 * Gateway settings and the --access-log command-line shortcut (one more
 * file sink, named "access-log"). Main thread only.
 */
#ifndef SL_TLOG_CONFIG_H
#define SL_TLOG_CONFIG_H

#include "sluice/v1/snapshot.pb-c.h"
#include "tlog.h"

/* The command line's part: --access-log (NULL = none), its format, and
 * the origin fields. 0, or -1 (out of memory). */
int sl_tlog_set_base(const char *access_log, int combined, const char *fleet, const char *runtime);

/* The --access-log sink's configuration, or NULL. */
const sl_tlog_sink_config_t *sl_tlog_cli_sink(void);

/* Hands the logger the sinks of snap (NULL: none yet) plus the command
 * line's. 0, or -1 (out of memory: the previous set stays). */
int sl_tlog_apply_snapshot(const Sluice__V1__Snapshot *snap);

/* `--check`: what only the runtime's machine can tell, i.e. that every
 * network sink's caFile can be read and holds PEM certificates. 0, or -1
 * with err naming the field (spec.trafficLog.sinks[0].caFile: ...). A
 * running runtime reads the file at its first connection instead, and a
 * file it cannot use is a failed delivery, retried. */
int sl_tlog_check_snapshot(const Sluice__V1__Snapshot *snap, char *err, size_t errlen);

#endif
