/*
 * The traffic log's field names and configuration helpers (tlog_spec.h).
 */
#include "tlog_spec.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *const sl_tlog_field_names[SL_TLOG_F__COUNT + 1] = {
    [SL_TLOG_F_TIME] = "time",
    [SL_TLOG_F_REQUEST_ID] = "request_id",
    [SL_TLOG_F_GATEWAY] = "gateway",
    [SL_TLOG_F_FLEET] = "fleet",
    [SL_TLOG_F_RUNTIME] = "runtime",
    [SL_TLOG_F_API] = "api",
    [SL_TLOG_F_OPERATION] = "operation",
    [SL_TLOG_F_CONSUMER] = "consumer",
    [SL_TLOG_F_CLIENT] = "client",
    [SL_TLOG_F_METHOD] = "method",
    [SL_TLOG_F_HOST] = "host",
    [SL_TLOG_F_PATH] = "path",
    [SL_TLOG_F_QUERY] = "query",
    [SL_TLOG_F_PROTOCOL] = "protocol",
    [SL_TLOG_F_STATUS] = "status",
    [SL_TLOG_F_BYTES_RECEIVED] = "bytes_received",
    [SL_TLOG_F_BYTES_SENT] = "bytes_sent",
    [SL_TLOG_F_DURATION_MS] = "duration_ms",
    [SL_TLOG_F_UPSTREAM_MS] = "upstream_ms",
    [SL_TLOG_F_GATEWAY_MS] = "gateway_ms",
    [SL_TLOG_F_UPSTREAM] = "upstream",
    [SL_TLOG_F_RETRIES] = "retries",
    [SL_TLOG_F_ERROR] = "error",
    [SL_TLOG_F_POLICY] = "policy",
    [SL_TLOG_F_POLICY_REASON] = "policy_reason",
    [SL_TLOG_F_CACHE] = "cache",
    [SL_TLOG_F_USER_AGENT] = "user_agent",
    [SL_TLOG_F_REFERER] = "referer",
    [SL_TLOG_F_REQUEST_HEADERS] = "request_headers",
    [SL_TLOG_F_RESPONSE_HEADERS] = "response_headers",
    [SL_TLOG_F_TRACE_ID] = "trace_id",
    [SL_TLOG_F_SPAN_ID] = "span_id",
    [SL_TLOG_F_REQUEST_BODY] = "request_body",
    [SL_TLOG_F_RESPONSE_BODY] = "response_body",
    [SL_TLOG_F__COUNT] = NULL,
};

/* Credentials and session cookies: never in a record, whatever the config
 * says (a configured `redact` list adds to these). */
const char *const sl_tlog_default_redact[] = {"authorization", "proxy-authorization", "cookie",
                                              "set-cookie",    "x-api-key",           NULL};

uint64_t sl_tlog_fields_mask(json_t *list)
{
    uint64_t mask = 0;
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v)
    {
        const char *s = json_string_value(v);
        for (unsigned f = 0; s && f < SL_TLOG_F__COUNT; f++)
            if (strcmp(s, sl_tlog_field_names[f]) == 0)
                mask |= SL_TLOG_BIT(f);
    }
    return mask;
}

const char *const sl_tlog_default_body_types[] = {
    "application/json", "application/*+json", "text/*", "application/x-www-form-urlencoded", NULL};

int sl_tlog_content_type_match(const char *const *patterns, size_t n, const char *ctype, size_t len)
{
    /* The media type: up to ';' or a space, trimmed. */
    while (len && (*ctype == ' ' || *ctype == '\t')) {
        ctype++;
        len--;
    }
    size_t mt = 0;
    while (mt < len && ctype[mt] != ';' && ctype[mt] != ' ' && ctype[mt] != '\t')
        mt++;
    const char *slash = memchr(ctype, '/', mt);
    if (!slash || slash == ctype || (size_t)(slash - ctype) + 1 >= mt)
        return 0;
    size_t tlen = (size_t)(slash - ctype);
    const char *sub = slash + 1;
    size_t slen = mt - tlen - 1;
    for (size_t i = 0; i < n && patterns[i]; i++) {
        const char *p = patterns[i];
        const char *ps = strchr(p, '/');
        if (!ps || (size_t)(ps - p) != tlen || strncasecmp(p, ctype, tlen) != 0)
            continue;
        ps++;
        if (strcmp(ps, "*") == 0)
            return 1;
        if (ps[0] == '*' && ps[1] == '+') {
            /* "*+json": any subtype with that structured suffix */
            size_t sl = strlen(ps + 1);
            if (slen > sl && strncasecmp(sub + slen - sl, ps + 1, sl) == 0)
                return 1;
            continue;
        }
        if (strlen(ps) == slen && strncasecmp(ps, sub, slen) == 0)
            return 1;
    }
    return 0;
}

uint32_t sl_tlog_sample_ppm(json_t *v)
{
    double d = json_number_value(v);
    if (d <= 0)
        return 0;
    if (d >= 1)
        return 1000000;
    return (uint32_t)(d * 1000000.0 + 0.5);
}
