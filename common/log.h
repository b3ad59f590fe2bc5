/*
 * Process log (not the access log): leveled lines to stderr with a time stamp.
 * Levels follow nginx: the integration harness fails a test on any [alert]
 * line, so SL_LOG_ALERT is for "this must never happen".
 */
#ifndef SL_LOG_H
#define SL_LOG_H

enum sl_log_level {
    SL_LOG_DEBUG = 0,
    SL_LOG_INFO,
    SL_LOG_NOTICE,
    SL_LOG_WARN,
    SL_LOG_ERROR,
    SL_LOG_ALERT,
};

void sl_log_set_level(enum sl_log_level level);
int sl_log_level_from_string(const char *name, enum sl_log_level *out);
void sl_log(enum sl_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define sl_log_debug(...) sl_log(SL_LOG_DEBUG, __VA_ARGS__)
#define sl_log_info(...) sl_log(SL_LOG_INFO, __VA_ARGS__)
#define sl_log_notice(...) sl_log(SL_LOG_NOTICE, __VA_ARGS__)
#define sl_log_warn(...) sl_log(SL_LOG_WARN, __VA_ARGS__)
#define sl_log_error(...) sl_log(SL_LOG_ERROR, __VA_ARGS__)
#define sl_log_alert(...) sl_log(SL_LOG_ALERT, __VA_ARGS__)

#endif
