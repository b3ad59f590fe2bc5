/*
 * The spec of each kind, as tables for the walker of validate.c, plus the
 * rules that span several fields (method vs methods, duplicate operations,
 * listener conflicts, consistent hashing needing a key, one certificate
 * source). Bounds and defaults are documented in docs/configuration.md; keep
 * the two in step.
 *
 * Not responsible for references between documents (compiler.c) nor for
 * defaults (compiler.c applies them; this file only checks what is written).
 */
#include "policy.h"
#include "hostport.h"
#include "validate.h"

#include "listener_http2.h"
#include "pathtpl.h"
#include "tls_pem.h"
#include "tlog_spec.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <arpa/inet.h>
#include <ctype.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* --- ranges and small tables --------------------------------------------- */

static const sl_vrange_t port_range = {1, 65535};
static const sl_vrange_t weight_range = {1, 1000};
static const sl_vrange_t bytes_range = {0, INT64_MAX};
static const sl_vrange_t dur_positive = {1, UINT32_MAX};
static const sl_vrange_t dur_any = {0, UINT32_MAX};
static const sl_vrange_t request_line_range = {256, 65536};
static const sl_vrange_t header_bytes_range = {1024, 1048576};
static const sl_vrange_t header_count_range = {1, 1000};
static const sl_vrange_t connections_range = {0, 10000000};
static const sl_vrange_t attempts_range = {0, 10};
static const sl_vrange_t percent_range = {0, 100};
static const sl_vrange_t concurrency_range = {0, 100000};
static const sl_vrange_t threshold_range = {1, 1000};
static const sl_vrange_t failures_range = {0, 1000};
static const sl_vrange_t idle_range = {0, 100000};

static const char *const protocols[] = {"http", "https", "h2c", NULL};
static const char *const path_types[] = {"template", "exact", "prefix", "regex", NULL};
static const char *const match_types[] = {"exact", "prefix", "regex", "present", NULL};
static const char *const encoded_slashes_modes[] = {"reject", "keep", "decode", NULL};
static const char *const lb_policies[] = {"round-robin", "least-request", "random",
                                          "consistent-hash", NULL};
static const char *const http_methods[] = {"GET",   "HEAD",    "POST",  "PUT",     "DELETE",
                                           "PATCH", "OPTIONS", "TRACE", "CONNECT", NULL};

static const char *type_of(json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "object";
    case JSON_ARRAY:
        return "array";
    case JSON_STRING:
        return "string";
    case JSON_INTEGER:
        return "integer";
    case JSON_REAL:
        return "number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "boolean";
    default:
        return "null";
    }
}

static bool want_string(sl_vctx_t *c, json_t *v)
{
    if (json_is_string(v))
        return true;
    sl_validate_error(c, "expected string, got %s", type_of(v));
    return false;
}

/* Runs a check on obj[key] with the path extended, if the field is present. */
static void at_key(sl_vctx_t *c, const char *key, void (*fn)(sl_vctx_t *, const char *),
                   const char *msg)
{
    size_t saved = sl_validate_push_key(c, key);
    fn(c, msg);
    sl_validate_pop(c, saved);
}

static void report(sl_vctx_t *c, const char *msg)
{
    sl_validate_error(c, "%s", msg);
}

/* --- value checks --------------------------------------------------------- */

/* Longer patterns are refused: they cost compile time and memory in every
 * runtime of the fleet, and nothing an API route needs comes close. */
#define SL_REGEX_MAX_LEN 1024

static void check_regex_text(sl_vctx_t *c, const char *re)
{
    if (strlen(re) > SL_REGEX_MAX_LEN) {
        sl_validate_error(c,
                          "regular expression longer than %d characters (%zu); split the "
                          "operation or use a template",
                          SL_REGEX_MAX_LEN, strlen(re));
        return;
    }
    int code;
    PCRE2_SIZE off;
    pcre2_code *p =
        pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &code, &off, NULL);
    if (p) {
        pcre2_code_free(p);
        return;
    }
    PCRE2_UCHAR msg[256];
    if (pcre2_get_error_message(code, msg, sizeof(msg)) < 0)
        snprintf((char *)msg, sizeof(msg), "error %d", code);
    sl_validate_error(c, "invalid regular expression at offset %zu: %s", (size_t)off,
                      (const char *)msg);
}

void sl_vcheck_regex(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    const char *s = json_string_value(v);
    if (!s || !*s || strlen(s) > 1024) {
        sl_validate_error(c, "expected a regular expression of 1 to 1024 characters");
        return;
    }
    int ec;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)s, PCRE2_ZERO_TERMINATED, 0, &ec, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[120];
        pcre2_get_error_message(ec, msg, sizeof(msg));
        sl_validate_error(c, "the regular expression does not compile at offset %zu: %s",
                          (size_t)off, (const char *)msg);
        return;
    }
    pcre2_code_free(re);
}

static void check_method(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!want_string(c, v))
        return;
    const char *m = json_string_value(v);
    if (strcmp(m, "*") == 0)
        return;
    for (size_t i = 0; http_methods[i]; i++)
        if (strcasecmp(http_methods[i], m) == 0)
            return;
    sl_validate_error(c,
                      "'%.64s' is not an HTTP method (GET, HEAD, POST, PUT, DELETE, PATCH, "
                      "OPTIONS, TRACE, CONNECT, or \"*\" for any)",
                      m);
}

static bool is_tchar(unsigned char ch)
{
    return isalnum(ch) || (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static void check_header_name(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!want_string(c, v))
        return;
    const char *s = json_string_value(v);
    size_t n = strlen(s);
    if (n == 0 || n > 256) {
        sl_validate_error(c, "header names are 1..256 characters");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (!is_tchar((unsigned char)s[i])) {
            sl_validate_error(c, "'%.256s' is not a valid header name", s);
            return;
        }
    }
}

static void check_any_string(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (want_string(c, v) && json_string_length(v) > 4096)
        sl_validate_error(c, "longer than 4096 characters");
}

static void check_api_host(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!want_string(c, v))
        return;
    const char *s = json_string_value(v);
    if (strcmp(s, "*") == 0)
        return;
    const char *name = strncmp(s, "*.", 2) == 0 ? s + 2 : s;
    for (const char *p = name; *p; p++) {
        if (*p >= 'A' && *p <= 'Z') {
            sl_validate_error(c, "'%.253s' must be lowercase", s);
            return;
        }
    }
    if (!sl_validate_is_hostname(name))
        sl_validate_error(c,
                          "'%.253s' is not a hostname, \"*.suffix\" or \"*\" (no port, no "
                          "scheme, '*' only as the whole first label)",
                          s);
}

static void check_base_path(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!want_string(c, v))
        return;
    const char *s = json_string_value(v);
    size_t n = strlen(s);
    char err[256];
    if (n == 0 || s[0] != '/') {
        sl_validate_error(c, "must start with '/'");
    } else if (strchr(s, '{') || strchr(s, '}')) {
        sl_validate_error(c, "templates are not allowed in basePath; put '{param}' in the "
                             "operation paths");
    } else if (n > 1 && s[n - 1] == '/') {
        sl_validate_error(c, "must not end with '/' (use \"%.*s\")",
                          (int)(n - 1 > 200 ? 200 : n - 1), s);
    } else if (n > 1024) {
        sl_validate_error(c, "longer than 1024 characters");
    } else if (sl_pathtpl_check(s, err, sizeof(err)) != 0) {
        sl_validate_error(c, "%s", err);
    }
}

static void check_retry_on(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (json_is_integer(v)) {
        json_int_t code = json_integer_value(v);
        if (code < 500 || code > 599)
            sl_validate_error(c, "%lld is not a 5xx status code", (long long)code);
        return;
    }
    if (!json_is_string(v)) {
        sl_validate_error(c, "expected string or integer, got %s", type_of(v));
        return;
    }
    const char *s = json_string_value(v);
    if (strcmp(s, "connect-failure") == 0 || strcmp(s, "reset") == 0)
        return;
    if (strlen(s) == 3 && s[0] == '5' && isdigit((unsigned char)s[1]) &&
        isdigit((unsigned char)s[2]))
        return;
    static const char *const words[] = {"connect-failure", "reset"};
    const char *sug = sl_validate_suggest(s, words, 2);
    if (sug)
        sl_validate_error(c,
                          "'%.64s' is not connect-failure, reset or a 5xx status code (did you "
                          "mean '%s'?)",
                          s, sug);
    else
        sl_validate_error(c, "'%.64s' is not connect-failure, reset or a 5xx status code", s);
}

static void check_status_range(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    long lo, hi;
    if (json_is_integer(v)) {
        lo = hi = (long)json_integer_value(v);
        if (json_integer_value(v) < 100 || json_integer_value(v) > 599) {
            sl_validate_error(c, "%lld is not an HTTP status code (100..599)",
                              (long long)json_integer_value(v));
            return;
        }
        return;
    }
    if (!json_is_string(v)) {
        sl_validate_error(c, "expected string \"200-399\" or a status code, got %s", type_of(v));
        return;
    }
    const char *s = json_string_value(v);
    char tail;
    int n = sscanf(s, "%3ld-%3ld%c", &lo, &hi, &tail);
    if (n == 1 && sscanf(s, "%3ld%c", &lo, &tail) == 1)
        hi = lo;
    else if (n != 2) {
        sl_validate_error(
            c, "'%.64s' is not a status range like \"200-399\" or a code like \"200\"", s);
        return;
    }
    if (lo < 100 || hi > 599 || lo > hi)
        sl_validate_error(c, "'%.64s' must be within 100-599, low to high", s);
}

static void check_sha256(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!want_string(c, v))
        return;
    const char *s = json_string_value(v);
    bool ok = strncmp(s, "sha256:", 7) == 0 && strlen(s) == 7 + 64;
    for (size_t i = 7; ok && i < 7 + 64; i++)
        ok = isxdigit((unsigned char)s[i]) != 0;
    if (!ok)
        sl_validate_error(c, "expected \"sha256:\" followed by 64 hex digits (store hashes, "
                             "never the secret itself)");
}

/* A password hash crypt(3) verifies (libcrypt's crypt_r): bcrypt, yescrypt
 * or SHA-crypt. Unsalted fast hashes are refused: a leaked store of them is
 * a leaked store of passwords. */
static void check_password_hash(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!want_string(c, v))
        return;
    const char *s = json_string_value(v);
    static const char *const prefixes[] = {"$2b$", "$2y$", "$2a$", "$y$", "$6$", "$5$"};
    bool ok = false;
    for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++)
        ok = ok || strncmp(s, prefixes[i], strlen(prefixes[i])) == 0;
    size_t len = strlen(s);
    if (ok && (len < 20 || len > 256))
        ok = false;
    for (size_t i = 0; ok && i < len; i++)
        ok = isalnum((unsigned char)s[i]) || strchr("$./=,-", s[i]);
    if (!ok)
        sl_validate_error(c, "expected a bcrypt ($2b$), yescrypt ($y$) or SHA-crypt ($6$, $5$) "
                             "hash; make one with `mkpasswd -m yescrypt` or `openssl passwd -6` "
                             "(unsalted \"sha256:\" hashes are no longer accepted)");
}

#define SL_PEM_MAX (1024 * 1024)

static void check_pem_cert(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!want_string(c, v))
        return;
    const char *s = json_string_value(v);
    if (json_string_length(v) > SL_PEM_MAX)
        sl_validate_error(c, "longer than %d bytes", SL_PEM_MAX);
    else if (!strstr(s, "-----BEGIN CERTIFICATE-----") || !strstr(s, "-----END CERTIFICATE-----"))
        sl_validate_error(c, "expected a PEM certificate (-----BEGIN CERTIFICATE----- ... "
                             "-----END CERTIFICATE-----)");
}

static void check_pem_key(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!want_string(c, v))
        return;
    const char *s = json_string_value(v);
    const char *b = strstr(s, "-----BEGIN ");
    if (json_string_length(v) > SL_PEM_MAX)
        sl_validate_error(c, "longer than %d bytes", SL_PEM_MAX);
    else if (!b || !strstr(b, "PRIVATE KEY-----") || !strstr(b, "-----END "))
        sl_validate_error(c, "expected a PEM private key (-----BEGIN PRIVATE KEY----- ...)");
}

static void check_host_header(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!want_string(c, v))
        return;
    const char *s = json_string_value(v);
    size_t n = strlen(s);
    bool ok = n > 0 && n <= 260;
    for (size_t i = 0; ok && i < n; i++)
        ok = isalnum((unsigned char)s[i]) || strchr(".-:[]_", s[i]);
    if (!ok)
        sl_validate_error(c, "'%.64s' is not a valid Host value (host or host:port)", s);
}

static void check_abs_path(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!want_string(c, v))
        return;
    const char *s = json_string_value(v);
    size_t n = strlen(s);
    bool ok = n > 0 && s[0] == '/' && n <= 1024;
    for (size_t i = 0; ok && i < n; i++)
        ok = (unsigned char)s[i] > ' ' && (unsigned char)s[i] < 0x7f;
    if (!ok)
        sl_validate_error(c, "must be a path starting with '/', without spaces or control "
                             "characters");
}

/* --- shared sub-objects --------------------------------------------------- */

static const sl_vfield_t backend_ref_fields[] = {
    {"name", sl_vcheck_dns_subdomain, NULL, SL_VFIELD_REQUIRED},
    {"weight", sl_vcheck_int, &weight_range, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t backend_ref_schema = {backend_ref_fields, NULL};
static const sl_varray_t backend_refs_array = {sl_vcheck_object, &backend_ref_schema, 1, 64};

static void backend_refs_unique(sl_vctx_t *c, json_t *refs, const char *field)
{
    size_t saved = sl_validate_push_key(c, field);
    for (size_t i = 0; i < json_array_size(refs); i++) {
        const char *a = json_string_value(json_object_get(json_array_get(refs, i), "name"));
        for (size_t j = 0; j < i; j++) {
            const char *b = json_string_value(json_object_get(json_array_get(refs, j), "name"));
            if (strcmp(a, b) == 0) {
                size_t s2 = sl_validate_push_index(c, i);
                sl_validate_error(c, "Backend '%s' is already referenced by %s[%zu]", a, field, j);
                sl_validate_pop(c, s2);
                break;
            }
        }
    }
    sl_validate_pop(c, saved);
}

static const sl_vfield_t retry_fields[] = {
    {"attempts", sl_vcheck_int, &attempts_range, 0},
    {"on", sl_vcheck_array, &(const sl_varray_t){check_retry_on, NULL, 0, 64}, 0},
    {"nonIdempotent", sl_vcheck_bool, NULL, 0},
    {"budgetPercent", sl_vcheck_int, &percent_range, 0},
    {"minRetryConcurrency", sl_vcheck_int, &concurrency_range, 0},
    {"perTryTimeout", sl_vcheck_duration, &dur_positive, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t retry_schema = {retry_fields, NULL};

/* --- routing: success rate (runtime/proxy/srate.h; docs/routing.md
 * "Success-rate routing"). The rule-based half of `routing` (rules,
 * default) is validated with the rule evaluator. ----------------------- */

typedef struct {
    double min, max;
    const char *what;
} num_range_t;

static void check_number_range(sl_vctx_t *c, json_t *v, const void *arg)
{
    const num_range_t *r = arg;
    if (!json_is_number(v)) {
        sl_validate_error(c, "expected a number from %g to %g (%s)", r->min, r->max, r->what);
        return;
    }
    double d = json_number_value(v);
    if (!(d >= r->min && d <= r->max))
        sl_validate_error(c, "%g is out of range: give a number from %g to %g (%s)", d, r->min,
                          r->max, r->what);
}

static const num_range_t explore_percent_range = {0, 100,
                                                  "the percentage of requests that ignore "
                                                  "the scores"};
static const num_range_t elimination_range = {0, 1, "0 turns elimination off"};
static const sl_vrange_t sr_window_range = {1, 1024};
static const sl_vrange_t sr_recovery_range = {0, 1024};
static const num_range_t tolerance_range = {0, 1, "scores within this of the best are tied"};
static const sl_vrange_t sr_max_keys_range = {1, 100000};
static const sl_vrange_t sr_status_range = {400, 599};
static const char *const routing_strategies[] = {"weighted", "success-rate", NULL};
static const char *const operation_actions[] = {"proxy", "decide", "feedback", NULL};
static const char *const sr_failure_kinds[] = {"connect-failure", "reset", "timeout", "5xx", NULL};

/* A scoring key: exactly one request attribute. */
static void sr_key_extra(sl_vctx_t *c, json_t *k)
{
    int n = (sl_validate_get(k, "header") != NULL) + (sl_validate_get(k, "query") != NULL);
    if (n != 1)
        sl_validate_error(c, "a scoring key is one request attribute: give either "
                             "{header: Name} or {query: name}");
}

static const sl_vfield_t sr_key_fields[] = {
    {"header", check_header_name, NULL, 0},
    {"query", sl_vcheck_string, NULL, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t sr_key_schema = {sr_key_fields, sr_key_extra};

static const sl_vfield_t sr_failure_header_fields[] = {
    {"name", check_header_name, NULL, SL_VFIELD_REQUIRED},
    {"value", sl_vcheck_string, NULL, SL_VFIELD_REQUIRED},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t sr_failure_header_schema = {sr_failure_header_fields, NULL};

static const sl_vfield_t sr_failure_fields[] = {
    {"on", sl_vcheck_array, &(const sl_varray_t){sl_vcheck_enum, sr_failure_kinds, 0, 4}, 0},
    {"statuses", sl_vcheck_array, &(const sl_varray_t){sl_vcheck_int, &sr_status_range, 0, 64}, 0},
    {"header", sl_vcheck_object, &sr_failure_header_schema, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t sr_failure_schema = {sr_failure_fields, NULL};

static const sl_vfield_t sr_redis_fields[] = {
    {"address", sl_vcheck_string, NULL, SL_VFIELD_REQUIRED},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t sr_redis_schema = {sr_redis_fields, NULL};
static const char *const sr_sharing_kinds[] = {"local", "redis", NULL};

static void success_rate_extra(sl_vctx_t *c, json_t *s)
{
    json_t *sharing = sl_validate_get(s, "sharing");
    int redis = sharing && strcmp(json_string_value(sharing), "redis") == 0;
    if (redis && !sl_validate_get(s, "redis"))
        at_key(c, "redis", report, "required with sharing: redis (redis: {address: host:port})");
    if (!redis && sl_validate_get(s, "redis"))
        at_key(c, "redis", report, "only used with sharing: redis");
}

static const sl_vfield_t success_rate_fields[] = {
    {"sharing", sl_vcheck_enum, sr_sharing_kinds, 0},
    {"redis", sl_vcheck_object, &sr_redis_schema, 0},
    {"window", sl_vcheck_int, &sr_window_range, 0},
    {"explorePercent", check_number_range, &explore_percent_range, 0},
    {"eliminationThreshold", check_number_range, &elimination_range, 0},
    {"tolerance", check_number_range, &tolerance_range, 0},
    {"recoveryProbes", sl_vcheck_int, &sr_recovery_range, 0},
    {"keys", sl_vcheck_array, &(const sl_varray_t){sl_vcheck_object, &sr_key_schema, 0, 8}, 0},
    {"maxKeys", sl_vcheck_int, &sr_max_keys_range, 0},
    {"maxOutcomeAge", sl_vcheck_duration, &dur_any, 0},
    {"failure", sl_vcheck_object, &sr_failure_schema, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t success_rate_schema = {success_rate_fields, success_rate_extra};

static int is_success_rate(json_t *obj)
{
    json_t *s = sl_validate_get(obj, "strategy");
    return s && json_is_string(s) && strcmp(json_string_value(s), "success-rate") == 0;
}

/* successRate configures the block's success-rate lists: the block's
 * strategy, or one output's, must use it. */
static void strategy_extra(sl_vctx_t *c, json_t *r)
{
    int sr = is_success_rate(r) || is_success_rate(sl_validate_get(r, "default"));
    json_t *rules = sl_validate_get(r, "rules");
    for (size_t i = 0; i < json_array_size(rules) && !sr; i++)
        sr = is_success_rate(json_array_get(rules, i));
    if (!sr && sl_validate_get(r, "successRate"))
        at_key(c, "successRate", report,
               "only used with strategy: success-rate; set the strategy or remove this block");
}

static void match_extra(sl_vctx_t *c, json_t *obj)
{
    json_t *type = sl_validate_get(obj, "type");
    const char *t = type ? json_string_value(type) : "exact";
    json_t *value = sl_validate_get(obj, "value");
    if (strcmp(t, "present") == 0) {
        if (value)
            at_key(c, "value", report, "must not be set with type present");
        return;
    }
    if (!value) {
        at_key(c, "value", report, "required field missing (unless type is present)");
        return;
    }
    if (strcmp(t, "regex") == 0) {
        size_t saved = sl_validate_push_key(c, "value");
        check_regex_text(c, json_string_value(value));
        sl_validate_pop(c, saved);
    }
}

static const sl_vfield_t header_match_fields[] = {
    {"name", check_header_name, NULL, SL_VFIELD_REQUIRED},
    {"value", check_any_string, NULL, 0},
    {"type", sl_vcheck_enum, match_types, 0},
    {"invert", sl_vcheck_bool, NULL, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t header_match_schema = {header_match_fields, match_extra};

static const sl_vfield_t query_match_fields[] = {
    {"name", sl_vcheck_string, NULL, SL_VFIELD_REQUIRED},
    {"value", check_any_string, NULL, 0},
    {"type", sl_vcheck_enum, match_types, 0},
    {"invert", sl_vcheck_bool, NULL, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t query_match_schema = {query_match_fields, match_extra};

/* --- Api ------------------------------------------------------------------ */

static const sl_vfield_t op_timeout_fields[] = {
    {"request", sl_vcheck_duration, &dur_positive, 0},
    {"upstreamConnect", sl_vcheck_duration, &dur_positive, 0},
    {"upstreamResponse", sl_vcheck_duration, &dur_positive, 0},
    {"tunnelIdle", sl_vcheck_duration, &dur_positive, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t op_timeout_schema = {op_timeout_fields, NULL};

static const sl_vfield_t api_timeout_fields[] = {
    {"request", sl_vcheck_duration, &dur_any, 0},
    {"upstreamConnect", sl_vcheck_duration, &dur_positive, 0},
    {"upstreamResponse", sl_vcheck_duration, &dur_positive, 0},
    {"tunnelIdle", sl_vcheck_duration, &dur_positive, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t api_timeout_schema = {api_timeout_fields, NULL};

/*
 * An upgrade token a route may tunnel (`Upgrade: websocket`). h2c is never
 * one: an h2c upgrade turns the connection into HTTP/2 that the gateway
 * would pass through unseen, so later requests on it would bypass every
 * route and policy (Traefik's GHSA-w4v4-9rw7-5326).
 */
static void check_upgrade_type(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_string(v)) {
        sl_validate_error(c, "expected a string (an upgrade token such as websocket)");
        return;
    }
    const char *t = json_string_value(v);
    size_t n = strlen(t);
    if (n == 0 || n > 64) {
        sl_validate_error(c, "expected an upgrade token of 1..64 characters");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)t[i];
        if (!(isalnum(ch) || strchr("!#$%&'*+-.^_`|~/", ch))) {
            sl_validate_error(c, "invalid character in upgrade token '%s' (an RFC 9110 token)", t);
            return;
        }
    }
    if (strcasecmp(t, "h2c") == 0)
        sl_validate_error(c, "h2c upgrades are never tunnelled: the HTTP/2 inside would bypass "
                             "the gateway's routes and policies (use an h2c listener)");
}

static const sl_vfield_t upgrade_fields[] = {
    {"type", check_upgrade_type, NULL, SL_VFIELD_REQUIRED},
    {"enabled", sl_vcheck_bool, NULL, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t upgrade_schema = {upgrade_fields, NULL};
static const sl_varray_t upgrades_array = {sl_vcheck_object, &upgrade_schema, 0, 16};

/* --- routing (docs/routing.md "Rule-based backend choice") ---------------- */

/* Bounds: a statement holds at most this many items (and nests three
 * levels, below); an `in` list, a priority list and a split are bounded too, so a
 * request's evaluation and its fallback list are bounded
 * (runtime/proxy/route_rules.h). */
#define SL_ROUTING_ITEMS_MAX 32
#define SL_ROUTING_IN_MAX 256
#define SL_ROUTING_PRIORITY_MAX 8
#define SL_ROUTING_SPLIT_MAX 16

static const char *const routing_subjects[] = {"header", "query",     "cookie", "pathParam",
                                               "claim",  "body",      "attribute", NULL};
static const char *const routing_attributes[] = {"method", "clientIp", "consumer",
                                                 "consumerGroup", NULL};
static const char *const routing_ops[] = {"equals", "notEquals", "in", "prefix", "regex", "lt",
                                          "le", "gt", "ge", "present", "absent", NULL};
static const sl_vrange_t split_weight_range = {0, 1000};
static const sl_vrange_t routing_body_range = {1, 16 * 1024 * 1024};

/* An IPv4/IPv6 address, or one with a /prefix length. */
static bool is_cidr(const char *s)
{
    char buf[64];
    const char *slash = strchr(s, '/');
    size_t n = slash ? (size_t)(slash - s) : strlen(s);
    if (n == 0 || n >= sizeof(buf))
        return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    unsigned char a[16];
    int v6 = strchr(buf, ':') != NULL;
    if (inet_pton(v6 ? AF_INET6 : AF_INET, buf, a) != 1)
        return false;
    if (!slash)
        return true;
    char *end;
    long bits = strtol(slash + 1, &end, 10);
    return slash[1] && !*end && bits >= 0 && bits <= (v6 ? 128 : 32);
}

/* A value compared as a string: YAML may type `equals: 1` as a number. */
static void check_route_scalar(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (json_is_string(v) ? strlen(json_string_value(v)) <= SL_VALIDATE_STRING_MAX
                          : (json_is_integer(v) || json_is_real(v) || json_is_boolean(v)))
        return;
    sl_validate_error(c, "expected a string (or a number), got %s", type_of(v));
}

static void check_route_number(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_number(v))
        sl_validate_error(c, "expected a number, got %s", type_of(v));
}

static void check_route_true(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_true(v))
        sl_validate_error(c, "must be true (write present: true or absent: true)");
}

static const sl_varray_t route_in_list = {check_route_scalar, NULL, 1, SL_ROUTING_IN_MAX};

static void route_condition_extra(sl_vctx_t *c, json_t *obj)
{
    json_t *all = sl_validate_get(obj, "all"), *any = sl_validate_get(obj, "any");
    size_t nsubj = 0, nops = 0;
    const char *subj = NULL, *op = NULL;
    for (size_t i = 0; routing_subjects[i]; i++)
        if (sl_validate_get(obj, routing_subjects[i]))
            nsubj++, subj = routing_subjects[i];
    for (size_t i = 0; routing_ops[i]; i++)
        if (sl_validate_get(obj, routing_ops[i]))
            nops++, op = routing_ops[i];
    if (all || any) {
        if ((all && any) || nsubj || nops)
            sl_validate_error(c, "a statement is either all: [...], any: [...] or one condition "
                                 "(an attribute and an operator), not several");
        return;
    }
    if (nsubj != 1) {
        sl_validate_error(c,
                          "a condition names one attribute: header, query, cookie, pathParam, "
                          "claim (with a name), body (a JSON pointer) or attribute (method, "
                          "clientIp, consumer, consumerGroup)%s",
                          nsubj ? "; this one names several" : "");
        return;
    }
    if (nops != 1) {
        sl_validate_error(c,
                          "a condition has exactly one operator: equals, notEquals, in, prefix, "
                          "regex, lt, le, gt, ge, present or absent%s",
                          nops ? "; this one has several" : "");
        return;
    }
    if (strcmp(subj, "header") == 0 || strcmp(subj, "query") == 0 ||
        strcmp(subj, "cookie") == 0 || strcmp(subj, "pathParam") == 0 ||
        strcmp(subj, "claim") == 0) {
        const char *n = json_string_value(sl_validate_get(obj, subj));
        if (!n || !*n || strlen(n) > 256) {
            at_key(c, subj, report, "expected a name of 1 to 256 characters");
            return;
        }
    }
    if (strcmp(subj, "body") == 0) {
        const char *n = json_string_value(sl_validate_get(obj, "body"));
        if (!n || n[0] != '/' || strlen(n) > 256) {
            at_key(c, "body", report,
                   "expected a JSON pointer of up to 256 characters, such as /amount or "
                   "/customer/country");
            return;
        }
    }
    json_t *attr = sl_validate_get(obj, "attribute");
    int client_ip = attr && strcmp(json_string_value(attr), "clientIp") == 0;
    if (client_ip && strcmp(op, "in") != 0 && strcmp(op, "notEquals") != 0 &&
        strcmp(op, "equals") != 0 && strcmp(op, "present") != 0 && strcmp(op, "absent") != 0) {
        at_key(c, op, report,
               "clientIp takes in (a list of addresses or CIDR ranges), equals, notEquals, "
               "present or absent");
        return;
    }
    json_t *val = sl_validate_get(obj, op);
    size_t saved = sl_validate_push_key(c, op);
    if (strcmp(op, "regex") == 0) {
        if (!json_is_string(val))
            sl_validate_error(c, "expected a regular expression (string)");
        else
            sl_vcheck_regex(c, val, NULL);
    } else if (client_ip && strcmp(op, "in") == 0) {
        for (size_t i = 0; i < json_array_size(val); i++) {
            const char *s = json_string_value(json_array_get(val, i));
            if (!s || !is_cidr(s)) {
                size_t s2 = sl_validate_push_index(c, i);
                sl_validate_error(c, "expected an IP address or a CIDR range such as "
                                     "10.0.0.0/8 or 2001:db8::/32");
                sl_validate_pop(c, s2);
            }
        }
    } else if (client_ip && (strcmp(op, "equals") == 0 || strcmp(op, "notEquals") == 0)) {
        if (!json_is_string(val) || !sl_validate_is_ip(json_string_value(val)))
            sl_validate_error(c, "expected an IP address (use in: for CIDR ranges)");
    }
    sl_validate_pop(c, saved);
}

/* A condition's fields; a statement adds all/any. Three levels, written
 * out rather than recursive so that the CRD (generated from these tables)
 * is a structural schema: match[] -> all/any -> all/any -> conditions. */
#define ROUTE_CONDITION_FIELDS                                                                     \
    {"header", check_header_name, NULL, 0}, {"query", sl_vcheck_string, NULL, 0},                 \
        {"cookie", sl_vcheck_string, NULL, 0}, {"pathParam", sl_vcheck_string, NULL, 0},          \
        {"claim", sl_vcheck_string, NULL, 0}, {"body", sl_vcheck_string, NULL, 0},                \
        {"attribute", sl_vcheck_enum, routing_attributes, 0},                                     \
        {"equals", check_route_scalar, NULL, 0}, {"notEquals", check_route_scalar, NULL, 0},      \
        {"in", sl_vcheck_array, &route_in_list, 0}, {"prefix", check_route_scalar, NULL, 0},      \
        {"regex", check_route_scalar, NULL, 0}, {"lt", check_route_number, NULL, 0},              \
        {"le", check_route_number, NULL, 0}, {"gt", check_route_number, NULL, 0},                 \
        {"ge", check_route_number, NULL, 0}, {"present", check_route_true, NULL, 0},              \
        {"absent", check_route_true, NULL, 0}

static const sl_vfield_t route_cond3_fields[] = {ROUTE_CONDITION_FIELDS, {NULL, NULL, NULL, 0}};
static const sl_vschema_t route_cond3_schema = {route_cond3_fields, route_condition_extra};
static const sl_varray_t route_statements3 = {sl_vcheck_object, &route_cond3_schema, 1,
                                              SL_ROUTING_ITEMS_MAX};
static const sl_vfield_t route_cond2_fields[] = {
    {"all", sl_vcheck_array, &route_statements3, 0},
    {"any", sl_vcheck_array, &route_statements3, 0},
    ROUTE_CONDITION_FIELDS,
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t route_cond2_schema = {route_cond2_fields, route_condition_extra};
static const sl_varray_t route_statements2 = {sl_vcheck_object, &route_cond2_schema, 1,
                                              SL_ROUTING_ITEMS_MAX};
static const sl_vfield_t route_cond1_fields[] = {
    {"all", sl_vcheck_array, &route_statements2, 0},
    {"any", sl_vcheck_array, &route_statements2, 0},
    ROUTE_CONDITION_FIELDS,
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t route_cond1_schema = {route_cond1_fields, route_condition_extra};
static const sl_varray_t route_statements = {sl_vcheck_object, &route_cond1_schema, 1,
                                             SL_ROUTING_ITEMS_MAX};

static const sl_varray_t route_priority_array = {sl_vcheck_dns_subdomain, NULL, 1,
                                                 SL_ROUTING_PRIORITY_MAX};

static void route_target_extra(sl_vctx_t *c, json_t *obj)
{
    if (!!sl_validate_get(obj, "backend") + !!sl_validate_get(obj, "priority") != 1)
        sl_validate_error(c, "a split entry has either backend or priority (a list), and a "
                             "weight");
}

static const sl_vfield_t route_target_fields[] = {
    {"backend", sl_vcheck_dns_subdomain, NULL, 0},
    {"priority", sl_vcheck_array, &route_priority_array, 0},
    {"weight", sl_vcheck_int, &split_weight_range, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t route_target_schema = {route_target_fields, route_target_extra};
static const sl_varray_t route_split_array = {sl_vcheck_object, &route_target_schema, 1,
                                              SL_ROUTING_SPLIT_MAX};

/* The output part of a rule or of `default`: one backend, a priority
 * list, or a split. */
static void route_output_check(sl_vctx_t *c, json_t *obj)
{
    int n = !!sl_validate_get(obj, "backend") + !!sl_validate_get(obj, "priority") +
            !!sl_validate_get(obj, "split");
    if (n != 1) {
        sl_validate_error(c, "%s: set one of backend, priority (a list of backends, the first "
                             "healthy wins) or split (weighted entries)",
                          n ? "more than one output" : "no output");
        return;
    }
    json_t *split = sl_validate_get(obj, "split");
    if (split) {
        json_int_t sum = 0;
        for (size_t i = 0; i < json_array_size(split); i++) {
            json_t *w = sl_validate_get(json_array_get(split, i), "weight");
            sum += w ? json_integer_value(w) : 1;
        }
        if (sum == 0)
            at_key(c, "split", report,
                   "the weights sum to 0: give at least one entry a weight above 0");
    }
}

static void route_rule_extra(sl_vctx_t *c, json_t *obj)
{
    route_output_check(c, obj);
}

static const sl_vfield_t route_rule_fields[] = {
    {"name", sl_vcheck_string, NULL, 0},
    {"match", sl_vcheck_array, &route_statements, 0},
    {"backend", sl_vcheck_dns_subdomain, NULL, 0},
    {"priority", sl_vcheck_array, &route_priority_array, 0},
    {"split", sl_vcheck_array, &route_split_array, 0},
    {"strategy", sl_vcheck_enum, routing_strategies, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t route_rule_schema = {route_rule_fields, route_rule_extra};

static const sl_vfield_t route_default_fields[] = {
    {"backend", sl_vcheck_dns_subdomain, NULL, 0},
    {"priority", sl_vcheck_array, &route_priority_array, 0},
    {"split", sl_vcheck_array, &route_split_array, 0},
    {"strategy", sl_vcheck_enum, routing_strategies, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t route_default_schema = {route_default_fields, route_output_check};

/* A rule that can never match because an earlier one always does: an
 * earlier rule without `match` takes every request, and an earlier rule
 * with the same statements takes every request this one would. */
static void rules_extra(sl_vctx_t *c, json_t *obj)
{
    json_t *rules = sl_validate_get(obj, "rules");
    for (size_t j = 0; j < json_array_size(rules); j++) {
        json_t *mj = sl_validate_get(json_array_get(rules, j), "match");
        for (size_t i = 0; i < j; i++) {
            json_t *mi = sl_validate_get(json_array_get(rules, i), "match");
            if (mi && !(mj && json_equal(mi, mj)))
                continue;
            size_t saved = sl_validate_push_key(c, "rules");
            size_t s2 = sl_validate_push_index(c, j);
            if (!mi)
                sl_validate_error(c,
                                  "can never match: rules[%zu] has no match and takes every "
                                  "request (move this rule before it, or give it a match)",
                                  i);
            else
                sl_validate_error(c,
                                  "can never match: rules[%zu] has the same match and comes "
                                  "first",
                                  i);
            sl_validate_pop(c, s2);
            sl_validate_pop(c, saved);
            break;
        }
    }
}

static const sl_vfield_t routing_fields[] = {
    {"rules", sl_vcheck_array, &(const sl_varray_t){sl_vcheck_object, &route_rule_schema, 0, 1000},
     0},
    {"default", sl_vcheck_object, &route_default_schema, 0},
    {"maxBodyBytes", sl_vcheck_int, &routing_body_range, 0},
    {"strategy", sl_vcheck_enum, routing_strategies, 0},
    {"successRate", sl_vcheck_object, &success_rate_schema, 0},
    {NULL, NULL, NULL, 0},
};

/* An output scored by success rate (its own strategy, else the block's):
 * the scores order its backends, so a split of priority lists (an order
 * already) says two things at once; and an output that names its strategy
 * must have something to choose from. The field is where the output is. */
static void sr_output_check(sl_vctx_t *c, json_t *out, int block_sr)
{
    json_t *own = sl_validate_get(out, "strategy");
    if (!(own ? is_success_rate(out) : block_sr))
        return;
    json_t *split = sl_validate_get(out, "split");
    for (size_t i = 0; i < json_array_size(split); i++) {
        if (!sl_validate_get(json_array_get(split, i), "priority"))
            continue;
        size_t saved = sl_validate_push_key(c, "split");
        size_t s2 = sl_validate_push_index(c, i);
        at_key(c, "priority", report,
               "a success-rate output orders its backends by score, so a split entry is one "
               "backend ({backend: a, weight: 90}); write the backends of this list as split "
               "entries, or give the output strategy: weighted to keep the list as written");
        sl_validate_pop(c, s2);
        sl_validate_pop(c, saved);
        return;
    }
    if (own && sl_validate_get(out, "backend"))
        at_key(c, "strategy", report,
               "success-rate chooses among several backends and this output has one: list "
               "them with priority or split, or remove strategy");
}

/* Rule names are unique in a block: a rule's success-rate windows and the
 * decision API's `rule` are named by them. */
static void rule_names_check(sl_vctx_t *c, json_t *rules)
{
    for (size_t j = 0; j < json_array_size(rules); j++) {
        json_t *nj = sl_validate_get(json_array_get(rules, j), "name");
        if (!json_is_string(nj))
            continue;
        for (size_t i = 0; i < j; i++) {
            json_t *ni = sl_validate_get(json_array_get(rules, i), "name");
            if (!json_is_string(ni) || strcmp(json_string_value(ni), json_string_value(nj)))
                continue;
            size_t saved = sl_validate_push_key(c, "rules");
            size_t s2 = sl_validate_push_index(c, j);
            size_t s3 = sl_validate_push_key(c, "name");
            sl_validate_error(c,
                              "'%s' is already the name of rules[%zu]: rule names are unique "
                              "(success-rate windows and the decision API's rule are named by "
                              "them)",
                              json_string_value(nj), i);
            sl_validate_pop(c, s3);
            sl_validate_pop(c, s2);
            sl_validate_pop(c, saved);
            break;
        }
    }
}

/* One `routing` block: rules (docs/routing.md "Rule-based backend choice")
 * and the strategy among the chosen backends ("Success-rate routing"). */
static void routing_extra(sl_vctx_t *c, json_t *obj)
{
    rules_extra(c, obj);
    strategy_extra(c, obj);
    json_t *rules = sl_validate_get(obj, "rules");
    rule_names_check(c, rules);
    int block_sr = is_success_rate(obj);
    for (size_t i = 0; i < json_array_size(rules); i++) {
        size_t saved = sl_validate_push_key(c, "rules");
        size_t s2 = sl_validate_push_index(c, i);
        sr_output_check(c, json_array_get(rules, i), block_sr);
        sl_validate_pop(c, s2);
        sl_validate_pop(c, saved);
    }
    if (sl_validate_get(obj, "default")) {
        size_t saved = sl_validate_push_key(c, "default");
        sr_output_check(c, sl_validate_get(obj, "default"), block_sr);
        sl_validate_pop(c, saved);
    }
}
static const sl_vschema_t routing_schema = {routing_fields, routing_extra};

/* Every pathParam a statement names, for the operation's check that its
 * path has them. */
static void route_params_check(sl_vctx_t *c, json_t *st, const char *path)
{
    json_t *kids = sl_validate_get(st, "all");
    if (!kids)
        kids = sl_validate_get(st, "any");
    for (size_t i = 0; i < json_array_size(kids); i++)
        route_params_check(c, json_array_get(kids, i), path);
    const char *p = json_string_value(sl_validate_get(st, "pathParam"));
    if (!p)
        return;
    char want[300];
    snprintf(want, sizeof(want), "{%s}", p);
    if (!strstr(path, want))
        sl_validate_error(c, "pathParam '%s' is not a parameter of the operation's path %s", p,
                          path);
}

static void route_rules_params_check(sl_vctx_t *c, json_t *routing, const char *path)
{
    json_t *rules = sl_validate_get(routing, "rules");
    for (size_t i = 0; i < json_array_size(rules); i++) {
        json_t *m = sl_validate_get(json_array_get(rules, i), "match");
        for (size_t j = 0; j < json_array_size(m); j++) {
            char field[64];
            snprintf(field, sizeof(field), "routing.rules[%zu].match[%zu]", i, j);
            size_t saved = sl_validate_push_key(c, field);
            route_params_check(c, json_array_get(m, j), path);
            sl_validate_pop(c, saved);
        }
    }
}

static void operation_extra(sl_vctx_t *c, json_t *op)
{
    json_t *method = sl_validate_get(op, "method");
    json_t *methods = sl_validate_get(op, "methods");
    if (method && methods)
        at_key(c, "methods", report, "set either method or methods, not both");
    if (methods) {
        size_t n = json_array_size(methods);
        for (size_t i = 0; i < n; i++) {
            const char *a = json_string_value(json_array_get(methods, i));
            size_t saved = sl_validate_push_key(c, "methods");
            size_t s2 = sl_validate_push_index(c, i);
            if (strcmp(a, "*") == 0 && n > 1)
                sl_validate_error(c, "\"*\" (any method) cannot be combined with other methods");
            for (size_t j = 0; j < i; j++) {
                if (strcasecmp(a, json_string_value(json_array_get(methods, j))) == 0) {
                    sl_validate_error(c, "method %s is listed twice", a);
                    break;
                }
            }
            sl_validate_pop(c, s2);
            sl_validate_pop(c, saved);
        }
    }

    const char *path = json_string_value(json_object_get(op, "path"));
    json_t *pt = sl_validate_get(op, "pathType");
    const char *type = pt ? json_string_value(pt) : (strchr(path, '{') ? "template" : "exact");
    size_t saved = sl_validate_push_key(c, "path");
    char err[256];
    if (strlen(path) > 2048) {
        sl_validate_error(c, "longer than 2048 characters");
    } else if (strcmp(type, "regex") == 0) {
        check_regex_text(c, path);
    } else if (strcmp(type, "template") == 0) {
        if (sl_pathtpl_check(path, err, sizeof(err)) != 0)
            sl_validate_error(c, "%s", err);
    } else {
        if (strchr(path, '{') || strchr(path, '}'))
            sl_validate_error(c, "'{' and '}' are only allowed with pathType template");
        else if (sl_pathtpl_check(path, err, sizeof(err)) != 0)
            sl_validate_error(c, "%s", err);
    }
    sl_validate_pop(c, saved);
    if (sl_validate_get(op, "backendRefs"))
        backend_refs_unique(c, sl_validate_get(op, "backendRefs"), "backendRefs");
    if (sl_validate_get(op, "routing") && strcmp(type, "template") == 0)
        route_rules_params_check(c, sl_validate_get(op, "routing"), path);
}

static const sl_vfield_t policy_when_fields[] = {
    {"methods", sl_vcheck_array, &(const sl_varray_t){check_method, NULL, 1, 9}, 0},
    {"pathPrefixes", sl_vcheck_array, &(const sl_varray_t){check_abs_path, NULL, 1, 32}, 0},
    {"headers", sl_vcheck_array,
     &(const sl_varray_t){sl_vcheck_object, &header_match_schema, 1, 32}, 0},
    {NULL, NULL, NULL, 0},
};
const sl_vschema_t sl_validate_policy_when = {policy_when_fields, NULL};

/* --- fault injection ------------------------------------------------------- */

static const sl_vrange_t fault_ms_range = {1, 3600000};
static const sl_vrange_t fault_status_range = {200, 599};

static void check_percent_number(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) > 100)
        sl_validate_error(c, "expected a percentage from 0 to 100 (decimals allowed: 0.5)");
}

static const sl_vfield_t fault_delay_fields[] = {
    {"ms", sl_vcheck_int, &fault_ms_range, SL_VFIELD_REQUIRED},
    {"percent", check_percent_number, NULL, SL_VFIELD_REQUIRED},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t fault_delay_schema = {fault_delay_fields, NULL};
static const sl_vfield_t fault_abort_fields[] = {
    {"status", sl_vcheck_int, &fault_status_range, SL_VFIELD_REQUIRED},
    {"percent", check_percent_number, NULL, SL_VFIELD_REQUIRED},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t fault_abort_schema = {fault_abort_fields, NULL};

static void faults_extra(sl_vctx_t *c, json_t *obj)
{
    if (!sl_validate_get(obj, "delay") && !sl_validate_get(obj, "abort"))
        sl_validate_error(c, "set delay, abort or both");
}

static const sl_vfield_t faults_fields[] = {
    {"delay", sl_vcheck_object, &fault_delay_schema, 0},
    {"abort", sl_vcheck_object, &fault_abort_schema, 0},
    {"header", check_header_name, NULL, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t faults_schema = {faults_fields, faults_extra};

static const sl_vfield_t mirror_fields[] = {
    {"backend", sl_vcheck_dns_subdomain, NULL, SL_VFIELD_REQUIRED},
    {"percent", check_percent_number, NULL, SL_VFIELD_REQUIRED},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t mirror_schema = {mirror_fields, NULL};

static const sl_vfield_t operation_fields[] = {
    {"name", sl_vcheck_string, NULL, 0},
    {"method", check_method, NULL, 0},
    {"methods", sl_vcheck_array, &(const sl_varray_t){check_method, NULL, 1, 9}, 0},
    {"path", sl_vcheck_string, NULL, SL_VFIELD_REQUIRED},
    {"pathType", sl_vcheck_enum, path_types, 0},
    {"headers", sl_vcheck_array,
     &(const sl_varray_t){sl_vcheck_object, &header_match_schema, 0, 32}, 0},
    {"query", sl_vcheck_array, &(const sl_varray_t){sl_vcheck_object, &query_match_schema, 0, 32},
     0},
    {"backendRefs", sl_vcheck_array, &backend_refs_array, 0},
    {"routing", sl_vcheck_object, &routing_schema, 0},
    {"faults", sl_vcheck_object, &faults_schema, 0},
    {"mirror", sl_vcheck_object, &mirror_schema, 0},
    {"timeouts", sl_vcheck_object, &op_timeout_schema, 0},
    {"retries", sl_vcheck_object, &retry_schema, 0},
    {"maxRequestBodyBytes", sl_vcheck_int, &bytes_range, 0},
    {"upgrades", sl_vcheck_array, &upgrades_array, 0},
    {"policies", sl_policy_vcheck_list, "operation", 0},
    {"action", sl_vcheck_enum, operation_actions, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t operation_schema = {operation_fields, operation_extra};

/* One key per (method, path kind, path, matches) of an operation; template
 * parameter names are erased because /pets/{id} and /pets/{petId} match the
 * same requests. */
typedef struct {
    char *key;
    size_t op;
} op_key_t;

static int cmp_op_key(const void *a, const void *b)
{
    const op_key_t *x = a, *y = b;
    int r = strcmp(x->key, y->key);
    if (r)
        return r;
    return x->op < y->op ? -1 : x->op > y->op;
}

static char *op_key(json_t *op, const char *method)
{
    const char *path = json_string_value(json_object_get(op, "path"));
    json_t *pt = sl_validate_get(op, "pathType");
    const char *type = pt ? json_string_value(pt) : (strchr(path, '{') ? "template" : "exact");
    size_t plen = strlen(path);
    char *norm = malloc(plen + 1);
    if (!norm)
        return NULL;
    size_t o = 0;
    bool tpl = strcmp(type, "template") == 0;
    for (size_t i = 0; i < plen; i++) {
        norm[o++] = path[i];
        if (tpl && path[i] == '{') {
            while (i < plen && path[i] != '}')
                i++;
            norm[o++] = '}';
        }
    }
    norm[o] = '\0';
    char *h =
        json_dumps(sl_validate_get(op, "headers") ? sl_validate_get(op, "headers") : json_null(),
                   JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    char *q = json_dumps(sl_validate_get(op, "query") ? sl_validate_get(op, "query") : json_null(),
                         JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    char *key = NULL;
    char mup[16];
    size_t i = 0;
    for (; method[i] && i < sizeof(mup) - 1; i++)
        mup[i] = (char)toupper((unsigned char)method[i]);
    mup[i] = '\0';
    if (h && q && asprintf(&key, "%s\x1f%s\x1f%s\x1f%s\x1f%s", mup, type, norm, h, q) < 0)
        key = NULL;
    free(norm);
    free(h);
    free(q);
    return key;
}

static void operations_unique(sl_vctx_t *c, json_t *ops)
{
    size_t nops = json_array_size(ops), nkeys = 0;
    op_key_t *keys = calloc(nops * 9 + 1, sizeof(*keys));
    if (!keys) {
        sl_validate_error(c, "out of memory");
        return;
    }
    for (size_t i = 0; i < nops; i++) {
        json_t *op = json_array_get(ops, i);
        json_t *methods = sl_validate_get(op, "methods");
        json_t *method = sl_validate_get(op, "method");
        size_t nm = methods ? json_array_size(methods) : 1;
        for (size_t m = 0; m < nm; m++) {
            const char *name = methods  ? json_string_value(json_array_get(methods, m))
                               : method ? json_string_value(method)
                                        : "*";
            char *k = op_key(op, name);
            if (!k)
                continue;
            keys[nkeys].key = k;
            keys[nkeys].op = i;
            nkeys++;
        }
    }
    qsort(keys, nkeys, sizeof(*keys), cmp_op_key);
    size_t reported = (size_t)-1;
    for (size_t i = 1; i < nkeys; i++) {
        if (strcmp(keys[i].key, keys[i - 1].key) != 0 || keys[i].op == keys[i - 1].op ||
            keys[i].op == reported)
            continue;
        reported = keys[i].op;
        size_t saved = sl_validate_push_key(c, "operations");
        size_t s2 = sl_validate_push_index(c, keys[i].op);
        const char *method = keys[i].key;
        const char *sep = strchr(method, '\x1f');
        sl_validate_error(c,
                          "same method (%.*s), path and matches as spec.operations[%zu]; the "
                          "second could never be selected",
                          (int)(sep - method), method, keys[i - 1].op);
        sl_validate_pop(c, s2);
        sl_validate_pop(c, saved);
    }
    for (size_t i = 0; i < nkeys; i++)
        free(keys[i].key);
    free(keys);
}

static void api_extra(sl_vctx_t *c, json_t *spec)
{
    json_t *refs = sl_validate_get(spec, "backendRefs");
    json_t *ops = json_object_get(spec, "operations");
    if (refs) {
        backend_refs_unique(c, refs, "backendRefs");
    } else {
        for (size_t i = 0; i < json_array_size(ops); i++) {
            json_t *op = json_array_get(ops, i);
            if (!sl_validate_get(op, "backendRefs") &&
                !sl_validate_get(sl_validate_get(op, "routing"), "default") &&
                !sl_validate_get(sl_validate_get(spec, "routing"), "default")) {
                size_t saved = sl_validate_push_key(c, "backendRefs");
                sl_validate_error(c,
                                  "required field missing (spec.operations[%zu] has no "
                                  "backendRefs of its own)",
                                  i);
                sl_validate_pop(c, saved);
                break;
            }
        }
    }
    json_t *hosts = sl_validate_get(spec, "hosts");
    for (size_t i = 0; i < json_array_size(hosts); i++) {
        for (size_t j = 0; j < i; j++) {
            if (json_equal(json_array_get(hosts, i), json_array_get(hosts, j))) {
                size_t saved = sl_validate_push_key(c, "hosts");
                size_t s2 = sl_validate_push_index(c, i);
                sl_validate_error(c, "'%s' is listed twice",
                                  json_string_value(json_array_get(hosts, i)));
                sl_validate_pop(c, s2);
                sl_validate_pop(c, saved);
                break;
            }
        }
    }
    /* Explicit operation names label metrics and logs: two operations
     * sharing one would silently merge their counters. */
    for (size_t i = 0; i < json_array_size(ops); i++) {
        json_t *name = sl_validate_get(json_array_get(ops, i), "name");
        for (size_t j = 0; name && j < i; j++) {
            json_t *other = sl_validate_get(json_array_get(ops, j), "name");
            if (other && json_equal(name, other)) {
                size_t saved = sl_validate_push_key(c, "operations");
                size_t s2 = sl_validate_push_index(c, i);
                size_t s3 = sl_validate_push_key(c, "name");
                sl_validate_error(c, "'%.200s' is already the name of spec.operations[%zu]",
                                  json_string_value(name), j);
                sl_validate_pop(c, s3);
                sl_validate_pop(c, s2);
                sl_validate_pop(c, saved);
                break;
            }
        }
    }
    operations_unique(c, ops);
    sl_policy_vcheck_api(c, spec);
}

/* --- traffic log (runtime/tlog/; docs/configuration.md "Traffic log") ----- */

static void check_fraction(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_number(v)) {
        sl_validate_error(c, "expected a number from 0 to 1 (the share of requests logged)");
        return;
    }
    double d = json_number_value(v);
    if (!(d >= 0 && d <= 1))
        sl_validate_error(c, "%g is out of range: give a number from 0 (none) to 1 (every request)",
                          d);
}

static const sl_varray_t tlog_fields_array = {sl_vcheck_enum, sl_tlog_field_names, 1,
                                              SL_TLOG_F__COUNT};

static void tlog_fields_extra_check(sl_vctx_t *c, json_t *v, const void *arg)
{
    sl_vcheck_array(c, v, arg);
    if (!json_is_array(v))
        return;
    for (size_t i = 0; i < json_array_size(v); i++)
        for (size_t j = 0; j < i; j++)
            if (json_equal(json_array_get(v, i), json_array_get(v, j))) {
                size_t saved = sl_validate_push_index(c, i);
                sl_validate_error(c, "'%s' is listed twice (also fields[%zu])",
                                  json_string_value(json_array_get(v, i)), j);
                sl_validate_pop(c, saved);
            }
}

static const sl_vrange_t tlog_header_bytes_range = {64, SL_TLOG_MAX_HEADER_MAX_BYTES};
static const sl_vfield_t tlog_headers_fields[] = {
    {"maxBytes", sl_vcheck_int, &tlog_header_bytes_range, 0},
    {"redact", sl_vcheck_array, &(const sl_varray_t){check_header_name, NULL, 0, 64}, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t tlog_headers_schema = {tlog_headers_fields, NULL};

/* bodies.redact: a JSON member or form field name, matched exactly. */
static void check_body_field_name(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!want_string(c, v))
        return;
    size_t n = json_string_length(v);
    if (n == 0 || n > 256)
        sl_validate_error(c, "field names are 1..256 characters (matched exactly, case-sensitive)");
}

/* bodies.contentTypes: type/subtype, type/any (a star) or a star and +suffix. */
static void check_body_media_type(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!want_string(c, v))
        return;
    const char *s = json_string_value(v);
    const char *slash = strchr(s, '/');
    int ok = slash && slash > s && slash[1] && strlen(s) <= 127;
    for (const char *p = s; ok && *p; p++)
        if (p != slash && !(is_tchar((unsigned char)*p) && *p != '*') &&
            !(*p == '*' && p == slash + 1 && (p[1] == '\0' || p[1] == '+')))
            ok = 0;
    if (ok && slash[1] == '*' && slash[2] == '+' && !slash[3])
        ok = 0;
    if (!ok)
        sl_validate_error(c,
                          "'%.128s' is not a media type: give type/subtype (application/json), "
                          "type/* (text/*) or type/*+suffix (application/*+json), without "
                          "parameters",
                          s);
}

static const sl_vrange_t tlog_body_bytes_range = {1, SL_TLOG_MAX_BODY_MAX_BYTES};
static const sl_vfield_t tlog_bodies_fields[] = {
    {"maxBytes", sl_vcheck_int, &tlog_body_bytes_range, 0},
    {"redact", sl_vcheck_array,
     &(const sl_varray_t){check_body_field_name, NULL, 0, SL_TLOG_MAX_BODY_REDACT}, 0},
    {"contentTypes", sl_vcheck_array,
     &(const sl_varray_t){check_body_media_type, NULL, 1, SL_TLOG_MAX_BODY_CONTENT_TYPES}, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t tlog_bodies_schema = {tlog_bodies_fields, NULL};

static const char *const tlog_sink_types[] = {"file", "http", "elasticsearch", "clickhouse", NULL};
static const char *const tlog_file_formats[] = {"json", "combined", NULL};

static void check_tlog_url(sl_vctx_t *c, json_t *v, const void *arg)
{
    sl_vcheck_string(c, v, arg);
    if (!json_is_string(v) || json_string_length(v) == 0)
        return;
    int tls;
    char host[256], port[8], path[1024];
    const char *why = NULL;
    if (sl_url_split(json_string_value(v), &tls, host, sizeof(host), port, sizeof(port), path,
                     sizeof(path), &why) != 0)
        sl_validate_error(c, "%s (e.g. http://collector:8080/ingest)", why);
    else if (strchr(path, '?'))
        sl_validate_error(c, "must not have a query: the sink adds its own");
}

static void check_tlog_path(sl_vctx_t *c, json_t *v, const void *arg)
{
    sl_vcheck_string(c, v, arg);
    if (json_is_string(v) && json_string_length(v) && json_string_value(v)[0] != '/' &&
        strcmp(json_string_value(v), "stdout") != 0)
        sl_validate_error(c, "must be an absolute path (on the runtime's machine) or \"stdout\"");
}

/* Elasticsearch's index name rules (lower case, none of the characters below, not
 * starting with -_+); the sink appends "-YYYY.MM.DD". */
static void check_es_index(sl_vctx_t *c, json_t *v, const void *arg)
{
    sl_vcheck_string(c, v, arg);
    const char *s = json_string_value(v);
    if (!s || !*s)
        return;
    if (strlen(s) > 200 || strchr("-_+", s[0])) {
        sl_validate_error(c, "must be at most 200 characters and not start with '-', '_' or '+'");
        return;
    }
    for (const char *p = s; *p; p++)
        if ((*p >= 'A' && *p <= 'Z') || strchr("\\/*?\"<>| ,#:", *p) || (unsigned char)*p < 0x20) {
            sl_validate_error(c,
                              "'%c' is not allowed in an index name (lower case, none of "
                              "\\/*?\"<>| ,#:)",
                              *p);
            return;
        }
}

static void check_sql_table(sl_vctx_t *c, json_t *v, const void *arg)
{
    sl_vcheck_string(c, v, arg);
    const char *s = json_string_value(v);
    if (!s || !*s)
        return;
    const char *dot = strchr(s, '.');
    if (dot && (dot == s || strchr(dot + 1, '.') || !dot[1] || isdigit((unsigned char)dot[1]))) {
        sl_validate_error(c, "a table name is letters, digits, '_' and one optional "
                             "'database.' prefix");
        return;
    }
    for (const char *p = s; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '_' || *p == '.') ||
            ((p == s || p[-1] == '.') && isdigit((unsigned char)*p))) {
            sl_validate_error(c, "a table name is letters, digits, '_' and one optional "
                                 "'database.' prefix");
            return;
        }
}

static void check_sql_database(sl_vctx_t *c, json_t *v, const void *arg)
{
    sl_vcheck_string(c, v, arg);
    const char *s = json_string_value(v);
    if (!s || !*s)
        return;
    for (const char *p = s; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '_') || (p == s && isdigit((unsigned char)*p))) {
            sl_validate_error(c, "a database name is letters, digits and '_', not starting with "
                                 "a digit");
            return;
        }
}

/* caBundle: PEM CA certificates that parse (as the jwt policy's
 * jwksCaBundle). */
static void check_tlog_ca_pem(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    const char *s = json_string_value(v);
    char why[200];
    if (!s)
        sl_validate_error(c, "expected a string of PEM certificates");
    else if (json_string_length(v) > SL_TLOG_MAX_CA_PEM)
        sl_validate_error(c, "longer than %d bytes", SL_TLOG_MAX_CA_PEM);
    else if (!strstr(s, "-----BEGIN CERTIFICATE-----") || !strstr(s, "-----END CERTIFICATE-----"))
        sl_validate_error(c, "expected PEM certificates (-----BEGIN CERTIFICATE----- ... "
                             "-----END CERTIFICATE-----)");
    else if (sl_pem_ca_load(NULL, s, why, sizeof(why)) < 0)
        sl_validate_error(c, "%s", why);
}

/* caFile: a path on the runtime's machine (read by the runtime; its
 * `--check` also reads it). */
static void check_tlog_ca_file(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    const char *s = json_string_value(v);
    if (!s || s[0] != '/')
        sl_validate_error(c, "an absolute path on the runtime's machine (a PEM file of CA "
                             "certificates)");
    else if (strlen(s) > 4096)
        sl_validate_error(c, "longer than 4096 characters");
}

static void tlog_auth_extra(sl_vctx_t *c, json_t *a)
{
    bool user = sl_validate_get(a, "username") != NULL, pass = sl_validate_get(a, "password");
    bool key = sl_validate_get(a, "apiKey") != NULL;
    if (key && (user || pass))
        sl_validate_error(c, "set either apiKey or username and password, not both");
    else if (user != pass)
        at_key(c, user ? "password" : "username", report,
               "required field missing (basic auth needs username and password)");
    else if (!key && !user)
        sl_validate_error(c, "set apiKey, or username and password");
}

static const sl_vfield_t tlog_auth_fields[] = {
    {"username", sl_vcheck_string, NULL, 0},
    {"password", sl_vcheck_string, NULL, 0},
    {"apiKey", sl_vcheck_string, NULL, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t tlog_auth_schema = {tlog_auth_fields, tlog_auth_extra};

static const sl_vrange_t tlog_batch_records_range = {1, 100000};
static const sl_vrange_t tlog_batch_bytes_range = {1024, 64 * 1024 * 1024};
static const sl_vrange_t tlog_buffer_range = {64 * 1024, 1024LL * 1024 * 1024};
static const sl_vrange_t tlog_rotate_bytes_range = {4096, INT64_MAX};
static const sl_vrange_t tlog_rotate_keep_range = {1, 100};
static const sl_vrange_t tlog_delay_range = {1, 600000};

static const sl_vfield_t tlog_batch_fields[] = {
    {"maxRecords", sl_vcheck_int, &tlog_batch_records_range, 0},
    {"maxBytes", sl_vcheck_int, &tlog_batch_bytes_range, 0},
    {"maxDelay", sl_vcheck_duration, &tlog_delay_range, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t tlog_batch_schema = {tlog_batch_fields, NULL};

static const sl_vfield_t tlog_rotate_fields[] = {
    {"maxBytes", sl_vcheck_int, &tlog_rotate_bytes_range, SL_VFIELD_REQUIRED},
    {"keep", sl_vcheck_int, &tlog_rotate_keep_range, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t tlog_rotate_schema = {tlog_rotate_fields, NULL};

static void tlog_retry_extra(sl_vctx_t *c, json_t *r)
{
    uint64_t lo = SL_TLOG_DEF_BACKOFF_INITIAL_MS, hi = SL_TLOG_DEF_BACKOFF_MAX_MS;
    if (sl_validate_get(r, "initialBackoff"))
        sl_parse_duration_ms(json_object_get(r, "initialBackoff"), &lo);
    if (sl_validate_get(r, "maxBackoff"))
        sl_parse_duration_ms(json_object_get(r, "maxBackoff"), &hi);
    if (lo > hi)
        at_key(c, "initialBackoff", report, "must not be longer than maxBackoff");
}

static const sl_vfield_t tlog_retry_fields[] = {
    {"initialBackoff", sl_vcheck_duration, &tlog_delay_range, 0},
    {"maxBackoff", sl_vcheck_duration, &tlog_delay_range, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t tlog_retry_schema = {tlog_retry_fields, tlog_retry_extra};

/* Which fields belong to which sink type. */
static void tlog_sink_extra(sl_vctx_t *c, json_t *s)
{
    const char *type = json_string_value(json_object_get(s, "type"));
    bool file = strcmp(type, "file") == 0, es = strcmp(type, "elasticsearch") == 0;
    bool ch = strcmp(type, "clickhouse") == 0;
    static const char *const file_only[] = {"format", "rotate", NULL};
    static const char *const net_only[] = {"url",    "auth",     "timeout", "retry",
                                           "caFile", "caBundle", NULL};
    if (file && !sl_validate_get(s, "path"))
        at_key(c, "path", report, "required field missing (a file sink writes to this path)");
    if (!file && !sl_validate_get(s, "url"))
        at_key(c, "url", report,
               "required field missing (where this sink sends its batches, e.g. "
               "http://collector:8080/ingest)");
    if (!file && sl_validate_get(s, "path"))
        at_key(c, "path", report, "only for type file (this sink sends to url)");
    for (int i = 0; file_only[i]; i++)
        if (!file && sl_validate_get(s, file_only[i]))
            at_key(c, file_only[i], report, "only for type file");
    for (int i = 0; net_only[i]; i++)
        if (file && sl_validate_get(s, net_only[i]))
            at_key(c, net_only[i], report,
                   "not for type file (it is for http, elasticsearch and clickhouse sinks)");
    if (!es && sl_validate_get(s, "index"))
        at_key(c, "index", report, "only for type elasticsearch");
    if (!ch && sl_validate_get(s, "table"))
        at_key(c, "table", report, "only for type clickhouse");
    if (!ch && sl_validate_get(s, "database"))
        at_key(c, "database", report, "only for type clickhouse");
    json_t *table = sl_validate_get(s, "table");
    if (ch && sl_validate_get(s, "database") && table && strchr(json_string_value(table), '.'))
        at_key(c, "database", report,
               "the table already names its database (database.table): set one of the two");
    if (sl_validate_get(s, "caBundle") && sl_validate_get(s, "caFile"))
        at_key(c, "caFile", report, "set at most one of caBundle (PEM) or caFile (a path)");
    json_t *url = sl_validate_get(s, "url");
    if (!file && url && strncasecmp(json_string_value(url), "https://", 8) != 0)
        for (int i = 0; i < 2; i++) {
            const char *k = i ? "caFile" : "caBundle";
            if (sl_validate_get(s, k))
                at_key(c, k, report, "only meaningful with an https:// url");
        }
    json_t *auth = sl_validate_get(s, "auth");
    if (auth && !es && sl_validate_get(auth, "apiKey"))
        at_key(c, "auth", report, "apiKey is only for type elasticsearch (use username/password)");
    json_t *path = sl_validate_get(s, "path");
    if (path && sl_validate_get(s, "rotate") && strcmp(json_string_value(path), "stdout") == 0)
        at_key(c, "rotate", report, "stdout cannot be rotated");
}

static const sl_vfield_t tlog_sink_fields[] = {
    {"name", sl_vcheck_dns_label, NULL, SL_VFIELD_REQUIRED},
    {"type", sl_vcheck_enum, tlog_sink_types, SL_VFIELD_REQUIRED},
    {"path", check_tlog_path, NULL, 0},
    {"format", sl_vcheck_enum, tlog_file_formats, 0},
    {"rotate", sl_vcheck_object, &tlog_rotate_schema, 0},
    {"url", check_tlog_url, NULL, 0},
    {"index", check_es_index, NULL, 0},
    {"table", check_sql_table, NULL, 0},
    {"database", check_sql_database, NULL, 0},
    {"caBundle", check_tlog_ca_pem, NULL, 0},
    {"caFile", check_tlog_ca_file, NULL, 0},
    {"auth", sl_vcheck_object, &tlog_auth_schema, 0},
    {"batch", sl_vcheck_object, &tlog_batch_schema, 0},
    {"bufferBytes", sl_vcheck_int, &tlog_buffer_range, 0},
    {"timeout", sl_vcheck_duration, &tlog_delay_range, 0},
    {"retry", sl_vcheck_object, &tlog_retry_schema, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t tlog_sink_schema = {tlog_sink_fields, tlog_sink_extra};

static void traffic_log_extra(sl_vctx_t *c, json_t *t)
{
    json_t *sinks = sl_validate_get(t, "sinks");
    for (size_t i = 0; i < json_array_size(sinks); i++) {
        const char *a = json_string_value(json_object_get(json_array_get(sinks, i), "name"));
        const char *pa = json_string_value(json_object_get(json_array_get(sinks, i), "path"));
        for (size_t j = 0; j < i; j++) {
            json_t *o = json_array_get(sinks, j);
            const char *b = json_string_value(json_object_get(o, "name"));
            const char *pb = json_string_value(json_object_get(o, "path"));
            size_t s1 = sl_validate_push_key(c, "sinks"), s2 = sl_validate_push_index(c, i);
            if (a && b && strcmp(a, b) == 0)
                at_key(c, "name", report, "this name is already used by another sink");
            else if (pa && pb && strcmp(pa, pb) == 0)
                sl_validate_error(c,
                                  "sinks[%zu] writes to the same path; give each file sink "
                                  "its own",
                                  j);
            sl_validate_pop(c, s2);
            sl_validate_pop(c, s1);
        }
    }
}

static const sl_vfield_t traffic_log_fields[] = {
    {"enabled", sl_vcheck_bool, NULL, 0},
    {"sampling", check_fraction, NULL, 0},
    {"fields", tlog_fields_extra_check, &tlog_fields_array, 0},
    {"headers", sl_vcheck_object, &tlog_headers_schema, 0},
    {"bodies", sl_vcheck_object, &tlog_bodies_schema, 0},
    {"sinks", sl_vcheck_array, &(const sl_varray_t){sl_vcheck_object, &tlog_sink_schema, 0, 16}, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t traffic_log_schema = {traffic_log_fields, traffic_log_extra};

/* spec.tracing: W3C trace context, Server-Timing, OTLP span export. */
static void tracing_export_extra(sl_vctx_t *c, json_t *e)
{
    json_t *url = sl_validate_get(e, "url");
    if (!url)
        at_key(c, "url", report,
               "required field missing (the collector's OTLP/HTTP traces endpoint, e.g. "
               "http://otel-collector:4318/v1/traces)");
    if (sl_validate_get(e, "caBundle") && sl_validate_get(e, "caFile"))
        at_key(c, "caFile", report, "set at most one of caBundle (PEM) or caFile (a path)");
    if (url && strncasecmp(json_string_value(url), "https://", 8) != 0)
        for (int i = 0; i < 2; i++) {
            const char *k = i ? "caFile" : "caBundle";
            if (sl_validate_get(e, k))
                at_key(c, k, report, "only meaningful with an https:// url");
        }
}

static const sl_vfield_t tracing_export_fields[] = {
    {"url", check_tlog_url, NULL, 0},
    {"serviceName", sl_vcheck_string, NULL, 0},
    {"caBundle", check_tlog_ca_pem, NULL, 0},
    {"caFile", check_tlog_ca_file, NULL, 0},
    {"batch", sl_vcheck_object, &tlog_batch_schema, 0},
    {"bufferBytes", sl_vcheck_int, &tlog_buffer_range, 0},
    {"timeout", sl_vcheck_duration, &tlog_delay_range, 0},
    {"retry", sl_vcheck_object, &tlog_retry_schema, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t tracing_export_schema = {tracing_export_fields, tracing_export_extra};

static const sl_vfield_t tracing_fields[] = {
    {"generate", sl_vcheck_bool, NULL, 0},
    {"sampling", check_fraction, NULL, 0},
    {"serverTiming", sl_vcheck_bool, NULL, 0},
    {"export", sl_vcheck_object, &tracing_export_schema, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t tracing_schema = {tracing_fields, NULL};

/* An Api's override: what is logged of its requests; the sinks are the
 * Gateway's. */
static const sl_vfield_t traffic_log_api_fields[] = {
    {"enabled", sl_vcheck_bool, NULL, 0},
    {"sampling", check_fraction, NULL, 0},
    {"fields", tlog_fields_extra_check, &tlog_fields_array, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t traffic_log_api_schema = {traffic_log_api_fields, NULL};

static const sl_vfield_t api_fields[] = {
    {"hosts", sl_vcheck_array, &(const sl_varray_t){check_api_host, NULL, 1, 256}, 0},
    {"basePath", check_base_path, NULL, 0},
    {"stripBasePath", sl_vcheck_bool, NULL, 0},
    {"version", sl_vcheck_string, NULL, 0},
    {"backendRefs", sl_vcheck_array, &backend_refs_array, 0},
    {"routing", sl_vcheck_object, &routing_schema, 0},
    {"faults", sl_vcheck_object, &faults_schema, 0},
    {"mirror", sl_vcheck_object, &mirror_schema, 0},
    {"operations", sl_vcheck_array,
     &(const sl_varray_t){sl_vcheck_object, &operation_schema, 1, 10000}, SL_VFIELD_REQUIRED},
    {"timeouts", sl_vcheck_object, &api_timeout_schema, 0},
    {"retries", sl_vcheck_object, &retry_schema, 0},
    {"maxRequestBodyBytes", sl_vcheck_int, &bytes_range, 0},
    {"upgrades", sl_vcheck_array, &upgrades_array, 0},
    {"policies", sl_policy_vcheck_list, "api", 0},
    {"trafficLog", sl_vcheck_object, &traffic_log_api_schema, 0},
    {NULL, NULL, NULL, 0},
};
const sl_vschema_t sl_validate_spec_api = {api_fields, api_extra};

/* --- Gateway -------------------------------------------------------------- */

/* --- listener TLS (runtime/net/tls.h applies these; docs/configuration.md
 * lists defaults and bounds) ------------------------------------------------ */

static const char *const tls_versions[] = {"1.2", "1.3", NULL};
static const char *const client_auth_modes[] = {"required", "optional", NULL};
static const sl_vrange_t verify_depth_range = {1, 10};
static const sl_vrange_t session_cache_range = {1, 1000000};
static const sl_vrange_t ticket_rotation_range = {60000, 7 * 24 * 3600000LL};

/* OpenSSL list syntax ("TLS_AES_128_GCM_SHA256:...", "ECDHE+AESGCM",
 * "X25519:P-256"): printable, no spaces; whether OpenSSL accepts the names is
 * known only where it is loaded (the runtime NACKs a list it refuses). */
static void check_openssl_list(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!want_string(c, v))
        return;
    const char *s = json_string_value(v);
    size_t n = strlen(s);
    bool ok = n > 0 && n <= 1024;
    for (size_t i = 0; ok && i < n; i++)
        ok = isalnum((unsigned char)s[i]) || strchr(":_-+!@=.", s[i]);
    if (!ok)
        sl_validate_error(c, "expected an OpenSSL list of 1..1024 characters such as "
                             "\"TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256\" (names "
                             "separated by ':', no spaces)");
}

/* ALPN protocol ids this gateway speaks (RFC 7301 registry names). */
static const char *const alpn_protocols[] = {"h2", "http/1.1", NULL};

static void check_alpn_list(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    sl_vcheck_array(c, v, &(const sl_varray_t){sl_vcheck_enum, alpn_protocols, 1, 2});
    if (json_array_size(v) == 2 && json_equal(json_array_get(v, 0), json_array_get(v, 1))) {
        size_t saved = sl_validate_push_index(c, 1);
        sl_validate_error(c, "listed twice");
        sl_validate_pop(c, saved);
    }
}

static const sl_vfield_t cert_ref_fields[] = {
    {"name", sl_vcheck_dns_subdomain, NULL, SL_VFIELD_REQUIRED},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t cert_ref_schema = {cert_ref_fields, NULL};

static const sl_vfield_t tickets_fields[] = {
    {"enabled", sl_vcheck_bool, NULL, 0},
    {"rotation", sl_vcheck_duration, &ticket_rotation_range, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t tickets_schema = {tickets_fields, NULL};

static const sl_vfield_t session_cache_fields[] = {
    {"enabled", sl_vcheck_bool, NULL, 0},
    {"size", sl_vcheck_int, &session_cache_range, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t session_cache_schema = {session_cache_fields, NULL};

static void check_file_path(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (want_string(c, v) && json_string_value(v)[0] != '/')
        sl_validate_error(c, "must be an absolute path on the runtime's machine");
    else if (json_is_string(v) && json_string_length(v) > 4096)
        sl_validate_error(c, "longer than 4096 characters");
}

static void client_auth_extra(sl_vctx_t *c, json_t *ca)
{
    bool bundle = sl_validate_get(ca, "caBundle") != NULL;
    bool file = sl_validate_get(ca, "caFile") != NULL;
    if (bundle == file)
        sl_validate_error(c, "set exactly one of caBundle (PEM) or caFile (a path)");
}

static const sl_vfield_t client_auth_fields[] = {
    {"caBundle", check_pem_cert, NULL, 0},
    {"caFile", check_file_path, NULL, 0},
    {"mode", sl_vcheck_enum, client_auth_modes, 0},
    {"verifyDepth", sl_vcheck_int, &verify_depth_range, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t client_auth_schema = {client_auth_fields, client_auth_extra};

static void listener_tls_extra(sl_vctx_t *c, json_t *tls)
{
    json_t *refs = json_object_get(tls, "certificateRefs");
    for (size_t i = 0; i < json_array_size(refs); i++) {
        const char *a = json_string_value(json_object_get(json_array_get(refs, i), "name"));
        for (size_t j = 0; j < i; j++) {
            const char *b = json_string_value(json_object_get(json_array_get(refs, j), "name"));
            if (strcmp(a, b) == 0) {
                size_t s1 = sl_validate_push_key(c, "certificateRefs");
                size_t s2 = sl_validate_push_index(c, i);
                sl_validate_error(c,
                                  "Certificate '%s' is already referenced by "
                                  "certificateRefs[%zu]",
                                  a, j);
                sl_validate_pop(c, s2);
                sl_validate_pop(c, s1);
                break;
            }
        }
    }
    json_t *minv = sl_validate_get(tls, "minVersion");
    if (minv && strcmp(json_string_value(minv), "1.3") == 0 && sl_validate_get(tls, "ciphers"))
        at_key(c, "ciphers", report,
               "TLS 1.2 ciphers have no effect with minVersion 1.3 (use cipherSuites)");
}

static const sl_vfield_t listener_tls_fields[] = {
    {"certificateRefs", sl_vcheck_array,
     &(const sl_varray_t){sl_vcheck_object, &cert_ref_schema, 1, 64}, SL_VFIELD_REQUIRED},
    {"minVersion", sl_vcheck_enum, tls_versions, 0},
    {"cipherSuites", check_openssl_list, NULL, 0},
    {"ciphers", check_openssl_list, NULL, 0},
    {"groups", check_openssl_list, NULL, 0},
    {"alpn", check_alpn_list, NULL, 0},
    {"sessionTickets", sl_vcheck_object, &tickets_schema, 0},
    {"sessionCache", sl_vcheck_object, &session_cache_schema, 0},
    {"ocspStapleFile", check_file_path, NULL, 0},
    {"clientAuth", sl_vcheck_object, &client_auth_schema, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t listener_tls_schema = {listener_tls_fields, listener_tls_extra};

/* --- listener HTTP/2 (bounds and defaults: common/listener_http2.c) ------- */

static void check_http2_limit(sl_vctx_t *c, json_t *v, const void *arg)
{
    const sl_listener_http2_field_t *f = arg;
    const sl_vrange_t r = {f->min, f->max};
    if (f->duration)
        sl_vcheck_duration(c, v, &r);
    else
        sl_vcheck_int(c, v, &r);
}

/* The value written, else the codec's default (fields were checked). */
static uint32_t http2_value(json_t *h2, int i)
{
    const sl_listener_http2_field_t *f = &sl_listener_http2_fields[i];
    json_t *v = sl_validate_get(h2, f->name);
    uint64_t ms;
    if (!v)
        return f->def;
    if (f->duration)
        return sl_parse_duration_ms(v, &ms) == 0 ? (uint32_t)ms : f->def;
    return (uint32_t)json_integer_value(v);
}

static void listener_http2_extra(sl_vctx_t *c, json_t *h2)
{
    for (const sl_listener_http2_rule_t *r = sl_listener_http2_rules; r->larger >= 0; r++) {
        const char *larger = sl_listener_http2_fields[r->larger].name;
        const char *smaller = sl_listener_http2_fields[r->smaller].name;
        uint32_t l = http2_value(h2, r->larger), s = http2_value(h2, r->smaller);
        if (l >= s)
            continue;
        char msg[256];
        snprintf(msg, sizeof(msg), "%u%s is less than %s (%u): it must be at least as large", l,
                 sl_validate_get(h2, larger) ? "" : " (the default)", smaller, s);
        at_key(c, larger, report, msg);
    }
}

/* The names repeat the table's (a schema needs constant names); test_validate.c
 * checks that each entry points at the table entry of its own name. */
static const sl_vfield_t listener_http2_fields[] = {
    {"maxConcurrentStreams", check_http2_limit,
     &sl_listener_http2_fields[SL_LH2_MAX_CONCURRENT_STREAMS], 0},
    {"initialStreamWindowBytes", check_http2_limit, &sl_listener_http2_fields[SL_LH2_STREAM_WINDOW],
     0},
    {"initialConnectionWindowBytes", check_http2_limit,
     &sl_listener_http2_fields[SL_LH2_CONN_WINDOW], 0},
    {"maxHeaderListBytes", check_http2_limit, &sl_listener_http2_fields[SL_LH2_MAX_HEADER_LIST], 0},
    {"maxHeaderFields", check_http2_limit, &sl_listener_http2_fields[SL_LH2_MAX_HEADER_FIELDS], 0},
    {"maxContinuationFrames", check_http2_limit,
     &sl_listener_http2_fields[SL_LH2_MAX_CONTINUATIONS], 0},
    {"headerTableBytes", check_http2_limit, &sl_listener_http2_fields[SL_LH2_HEADER_TABLE], 0},
    {"maxControlFramesPerWindow", check_http2_limit,
     &sl_listener_http2_fields[SL_LH2_CTRL_FRAMES_MAX], 0},
    {"controlWindow", check_http2_limit, &sl_listener_http2_fields[SL_LH2_CTRL_WINDOW], 0},
    {"maxResetStreamsPerWindow", check_http2_limit, &sl_listener_http2_fields[SL_LH2_RESETS_MAX],
     0},
    {"resetWindow", check_http2_limit, &sl_listener_http2_fields[SL_LH2_RESET_WINDOW], 0},
    {"maxEmptyDataFrames", check_http2_limit, &sl_listener_http2_fields[SL_LH2_EMPTY_DATA_MAX], 0},
    {"streamSendBufferBytes", check_http2_limit,
     &sl_listener_http2_fields[SL_LH2_STREAM_SEND_BUFFER], 0},
    {"connectionSendBufferBytes", check_http2_limit,
     &sl_listener_http2_fields[SL_LH2_CONN_SEND_BUFFER], 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t listener_http2_schema = {listener_http2_fields, listener_http2_extra};

/* https needs tls (its certificates); http and h2c are plaintext. http2
 * needs a listener that speaks it: h2c, or https offering "h2" in ALPN. */
static void listener_extra(sl_vctx_t *c, json_t *l)
{
    json_t *p = sl_validate_get(l, "protocol");
    const char *proto = p ? json_string_value(p) : "http";
    json_t *tls = sl_validate_get(l, "tls");
    bool has_tls = tls != NULL;
    if (strcmp(proto, "https") == 0 && !has_tls)
        at_key(c, "tls", report,
               "required field missing (an https listener needs tls.certificateRefs)");
    else if (strcmp(proto, "https") != 0 && has_tls)
        sl_validate_error(c,
                          "tls is only for protocol https (this listener is %s, which is "
                          "plaintext)",
                          proto);
    if (!sl_validate_get(l, "http2"))
        return;
    if (strcmp(proto, "http") == 0) {
        at_key(c, "http2", report,
               "http2 is only for protocol h2c or https (this listener is http, which serves "
               "HTTP/1.1 only)");
        return;
    }
    json_t *alpn = tls ? sl_validate_get(tls, "alpn") : NULL;
    bool offers_h2 = alpn == NULL;
    for (size_t i = 0; alpn && i < json_array_size(alpn); i++)
        offers_h2 |= strcmp(json_string_value(json_array_get(alpn, i)), "h2") == 0;
    if (!offers_h2)
        at_key(c, "http2", report,
               "has no effect: tls.alpn does not offer \"h2\" (add it, or remove http2)");
}

static const sl_vfield_t listener_fields[] = {
    {"name", sl_vcheck_dns_label, NULL, SL_VFIELD_REQUIRED},
    {"port", sl_vcheck_int, &port_range, SL_VFIELD_REQUIRED},
    {"protocol", sl_vcheck_enum, protocols, 0},
    {"address", sl_vcheck_ip, NULL, 0},
    {"tls", sl_vcheck_object, &listener_tls_schema, 0},
    {"http2", sl_vcheck_object, &listener_http2_schema, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t listener_schema = {listener_fields, listener_extra};

static const sl_vfield_t limits_fields[] = {
    {"maxRequestLineBytes", sl_vcheck_int, &request_line_range, 0},
    {"maxHeaderBytes", sl_vcheck_int, &header_bytes_range, 0},
    {"maxHeaderCount", sl_vcheck_int, &header_count_range, 0},
    {"maxRequestBodyBytes", sl_vcheck_int, &bytes_range, 0},
    {"maxConnections", sl_vcheck_int, &connections_range, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t limits_schema = {limits_fields, NULL};

static const sl_vfield_t gateway_timeout_fields[] = {
    {"requestHeader", sl_vcheck_duration, &dur_positive, 0},
    {"idle", sl_vcheck_duration, &dur_positive, 0},
    {"request", sl_vcheck_duration, &dur_any, 0},
    {"upstreamConnect", sl_vcheck_duration, &dur_positive, 0},
    {"upstreamResponse", sl_vcheck_duration, &dur_positive, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t gateway_timeout_schema = {gateway_timeout_fields, NULL};

/* runtime/http/path.h has what each does; docs/routing.md why reject is the default. */
static const sl_vfield_t path_normalization_fields[] = {
    {"mergeSlashes", sl_vcheck_bool, NULL, 0},
    {"encodedSlashes", sl_vcheck_enum, encoded_slashes_modes, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t path_normalization_schema = {path_normalization_fields, NULL};

bool sl_validate_spec_listeners_conflict(const char *addr_a, long port_a, const char *addr_b,
                                         long port_b)
{
    if (port_a != port_b)
        return false;
    unsigned char a[16], b[16];
    int fa = inet_pton(AF_INET, addr_a, a) == 1    ? AF_INET
             : inet_pton(AF_INET6, addr_a, a) == 1 ? AF_INET6
                                                   : 0;
    int fb = inet_pton(AF_INET, addr_b, b) == 1    ? AF_INET
             : inet_pton(AF_INET6, addr_b, b) == 1 ? AF_INET6
                                                   : 0;
    if (!fa || !fb)
        return strcmp(addr_a, addr_b) == 0;
    static const unsigned char zero[16];
    size_t la = fa == AF_INET ? 4 : 16, lb = fb == AF_INET ? 4 : 16;
    bool wa = memcmp(a, zero, la) == 0, wb = memcmp(b, zero, lb) == 0;
    /* A wildcard bind overlaps every address of its family, and "::" is
     * dual-stack on Linux by default, so it overlaps IPv4 too. */
    if (wa && (fa == fb || fa == AF_INET6))
        return true;
    if (wb && (fa == fb || fb == AF_INET6))
        return true;
    return fa == fb && memcmp(a, b, la) == 0;
}

static void gateway_extra(sl_vctx_t *c, json_t *spec)
{
    json_t *ls = json_object_get(spec, "listeners");
    for (size_t i = 0; i < json_array_size(ls); i++) {
        json_t *l = json_array_get(ls, i);
        const char *name = json_string_value(json_object_get(l, "name"));
        json_t *av = sl_validate_get(l, "address");
        const char *addr = av ? json_string_value(av) : "0.0.0.0";
        long port = (long)json_integer_value(json_object_get(l, "port"));
        for (size_t j = 0; j < i; j++) {
            json_t *o = json_array_get(ls, j);
            json_t *ov = sl_validate_get(o, "address");
            const char *oaddr = ov ? json_string_value(ov) : "0.0.0.0";
            size_t saved = sl_validate_push_key(c, "listeners");
            size_t s2 = sl_validate_push_index(c, i);
            if (strcmp(name, json_string_value(json_object_get(o, "name"))) == 0) {
                size_t s3 = sl_validate_push_key(c, "name");
                sl_validate_error(c, "listener name '%s' is already used by listeners[%zu]", name,
                                  j);
                sl_validate_pop(c, s3);
            } else if (sl_validate_spec_listeners_conflict(
                           addr, port, oaddr,
                           (long)json_integer_value(json_object_get(o, "port")))) {
                size_t s3 = sl_validate_push_key(c, "port");
                sl_validate_error(c, "%s:%ld overlaps listeners[%zu] (%s:%ld)", addr, port, j,
                                  oaddr, port);
                sl_validate_pop(c, s3);
            }
            sl_validate_pop(c, s2);
            sl_validate_pop(c, saved);
        }
    }
}

static const sl_vfield_t gateway_fields[] = {
    {"fleet", sl_vcheck_dns_subdomain, NULL, 0},
    {"listeners", sl_vcheck_array, &(const sl_varray_t){sl_vcheck_object, &listener_schema, 1, 64},
     SL_VFIELD_REQUIRED},
    {"limits", sl_vcheck_object, &limits_schema, 0},
    {"timeouts", sl_vcheck_object, &gateway_timeout_schema, 0},
    {"via", sl_vcheck_bool, NULL, 0},
    {"pathNormalization", sl_vcheck_object, &path_normalization_schema, 0},
    {"trafficLog", sl_vcheck_object, &traffic_log_schema, 0},
    {"tracing", sl_vcheck_object, &tracing_schema, 0},
    {NULL, NULL, NULL, 0},
};
const sl_vschema_t sl_validate_spec_gateway = {gateway_fields, gateway_extra};

/* --- Backend -------------------------------------------------------------- */

static const sl_vfield_t endpoint_fields[] = {
    {"address", sl_vcheck_host_or_ip, NULL, SL_VFIELD_REQUIRED},
    {"port", sl_vcheck_int, &port_range, SL_VFIELD_REQUIRED},
    {"weight", sl_vcheck_int, &weight_range, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t endpoint_schema = {endpoint_fields, NULL};

static void check_client_ip(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!json_is_true(v))
        sl_validate_error(c, "must be true (omit hashOn.clientIp to hash on something else)");
}

static void hash_on_extra(sl_vctx_t *c, json_t *obj)
{
    if (json_object_size(obj) != 1)
        sl_validate_error(c, "set exactly one of header, cookie or clientIp");
}

static const sl_vfield_t hash_on_fields[] = {
    {"header", check_header_name, NULL, 0},
    {"cookie", sl_vcheck_string, NULL, 0},
    {"clientIp", check_client_ip, NULL, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t hash_on_schema = {hash_on_fields, hash_on_extra};

static void lb_extra(sl_vctx_t *c, json_t *lb)
{
    json_t *p = sl_validate_get(lb, "policy");
    bool ch = p && strcmp(json_string_value(p), "consistent-hash") == 0;
    bool has_hash = sl_validate_get(lb, "hashOn") != NULL;
    if (ch && !has_hash)
        at_key(c, "hashOn", report, "required field missing (policy consistent-hash needs a key)");
    else if (!ch && has_hash)
        at_key(c, "hashOn", report, "only used with policy consistent-hash");
}

static const sl_vfield_t lb_fields[] = {
    {"policy", sl_vcheck_enum, lb_policies, 0},
    {"hashOn", sl_vcheck_object, &hash_on_schema, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t lb_schema = {lb_fields, lb_extra};

static void health_timing_extra(sl_vctx_t *c, json_t *hc)
{
    uint64_t interval = 5000, timeout = 2000;
    if (sl_validate_get(hc, "interval"))
        sl_parse_duration_ms(json_object_get(hc, "interval"), &interval);
    if (sl_validate_get(hc, "timeout"))
        sl_parse_duration_ms(json_object_get(hc, "timeout"), &timeout);
    if (timeout > interval)
        at_key(c, "timeout", report, "must not be longer than interval");
}

/* A gRPC service name goes into the request message as is; printable
 * ASCII keeps it readable in logs and /clusters. "" asks about the whole
 * server (grpc.health.v1). */
#define SL_GRPC_SERVICE_MAX_LEN 1024

static void check_grpc_service(sl_vctx_t *c, json_t *v, const void *arg)
{
    (void)arg;
    if (!want_string(c, v))
        return;
    const char *s = json_string_value(v);
    size_t n = strlen(s);
    bool ok = n <= SL_GRPC_SERVICE_MAX_LEN;
    for (size_t i = 0; ok && i < n; i++)
        ok = (unsigned char)s[i] > ' ' && (unsigned char)s[i] < 0x7f;
    if (!ok)
        sl_validate_error(c,
                          "must be a gRPC service name (e.g. \"pkg.Service\", or \"\" for the "
                          "whole server): printable ASCII without spaces, at most %d characters",
                          SL_GRPC_SERVICE_MAX_LEN);
}

static const sl_vfield_t grpc_health_fields[] = {
    {"service", check_grpc_service, NULL, 0},
    {"authority", check_host_header, NULL, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t grpc_health_schema = {grpc_health_fields, NULL};

static void health_extra(sl_vctx_t *c, json_t *hc)
{
    bool has_path = sl_validate_get(hc, "path") != NULL;
    bool has_grpc = sl_validate_get(hc, "grpc") != NULL;
    if (has_path && has_grpc)
        at_key(c, "grpc", report,
               "grpc and path are mutually exclusive: remove path for a gRPC health check "
               "(it always calls /grpc.health.v1.Health/Check), or remove grpc for an HTTP "
               "GET of path");
    else if (!has_path && !has_grpc) {
        at_key(c, "path", report,
               "required field missing (or set grpc: {service: ...} for a gRPC health check)");
        return; /* one error for a check that does not say what it asks */
    }
    health_timing_extra(c, hc);
}

static const sl_vfield_t health_fields[] = {
    {"path", check_abs_path, NULL, 0},
    {"grpc", sl_vcheck_object, &grpc_health_schema, 0},
    {"interval", sl_vcheck_duration, &dur_positive, 0},
    {"timeout", sl_vcheck_duration, &dur_positive, 0},
    {"healthyThreshold", sl_vcheck_int, &threshold_range, 0},
    {"unhealthyThreshold", sl_vcheck_int, &threshold_range, 0},
    {"expectedStatuses", check_status_range, NULL, 0},
    {"host", check_host_header, NULL, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t health_schema = {health_fields, health_extra};

static const sl_vfield_t outlier_fields[] = {
    {"consecutiveFailures", sl_vcheck_int, &failures_range, 0},
    {"baseEjectionTime", sl_vcheck_duration, &dur_positive, 0},
    {"maxEjectionPercent", sl_vcheck_int, &percent_range, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t outlier_schema = {outlier_fields, NULL};

static const sl_vfield_t pool_fields[] = {
    {"maxConnections", sl_vcheck_int, &connections_range, 0},
    {"maxIdle", sl_vcheck_int, &idle_range, 0},
    {"idleTimeout", sl_vcheck_duration, &dur_positive, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t pool_schema = {pool_fields, NULL};

static const sl_vfield_t backend_timeout_fields[] = {
    {"connect", sl_vcheck_duration, &dur_positive, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t backend_timeout_schema = {backend_timeout_fields, NULL};

static const char *const backend_protocols[] = {"http1", "h2", "h2c", NULL};

static void backend_extra(sl_vctx_t *c, json_t *spec)
{
    /* h2 is HTTP/2 over TLS (ALPN h2); h2c is HTTP/2 in plaintext. */
    json_t *proto = json_object_get(spec, "protocol");
    const char *pv = json_is_string(proto) ? json_string_value(proto) : "http1";
    int has_tls = json_object_get(spec, "tls") != NULL;
    if (strcmp(pv, "h2") == 0 && !has_tls) {
        size_t saved = sl_validate_push_key(c, "protocol");
        sl_validate_error(c, "h2 is HTTP/2 over TLS: add tls (or use h2c for plaintext HTTP/2)");
        sl_validate_pop(c, saved);
    } else if (strcmp(pv, "h2c") == 0 && has_tls) {
        size_t saved = sl_validate_push_key(c, "protocol");
        sl_validate_error(c, "h2c is plaintext HTTP/2: remove tls (or use h2 for HTTP/2 over TLS)");
        sl_validate_pop(c, saved);
    }
    /* A probe speaks what the Backend speaks (runtime/proxy/health.c); the
     * combinations it cannot speak, h2 without tls and h2c with tls, are
     * refused above. gRPC runs over HTTP/2 only. */
    json_t *hc = json_object_get(spec, "healthCheck");
    if (json_is_object(hc) && json_object_get(hc, "grpc") != NULL && strcmp(pv, "h2") != 0 &&
        strcmp(pv, "h2c") != 0) {
        size_t s1 = sl_validate_push_key(c, "healthCheck");
        size_t s2 = sl_validate_push_key(c, "grpc");
        sl_validate_error(c, "gRPC health checks need an HTTP/2 Backend: set protocol h2c (or h2 "
                             "with tls), or use healthCheck.path for an HTTP/1.1 check");
        sl_validate_pop(c, s2);
        sl_validate_pop(c, s1);
    }
    json_t *eps = json_object_get(spec, "endpoints");
    for (size_t i = 0; i < json_array_size(eps); i++) {
        json_t *e = json_array_get(eps, i);
        for (size_t j = 0; j < i; j++) {
            json_t *o = json_array_get(eps, j);
            if (strcasecmp(json_string_value(json_object_get(e, "address")),
                           json_string_value(json_object_get(o, "address"))) == 0 &&
                json_integer_value(json_object_get(e, "port")) ==
                    json_integer_value(json_object_get(o, "port"))) {
                size_t saved = sl_validate_push_key(c, "endpoints");
                size_t s2 = sl_validate_push_index(c, i);
                sl_validate_error(c,
                                  "same address and port as endpoints[%zu] (raise its "
                                  "weight instead)",
                                  j);
                sl_validate_pop(c, s2);
                sl_validate_pop(c, saved);
                break;
            }
        }
    }
}

/*
 * TLS to the upstream: verification is always on (there is no "insecure"
 * switch: an origin with a private CA names it in caBundle/caFile), against
 * the system's CAs unless one is given; the name checked and sent as SNI is
 * `sni`, else each endpoint's address.
 */
static void backend_tls_extra(sl_vctx_t *c, json_t *tls)
{
    if (sl_validate_get(tls, "caBundle") && sl_validate_get(tls, "caFile"))
        sl_validate_error(c, "set at most one of caBundle (PEM) or caFile (a path)");
}

static const sl_vfield_t backend_tls_fields[] = {
    {"sni", check_host_header, NULL, 0},
    {"caBundle", check_pem_cert, NULL, 0},
    {"caFile", check_file_path, NULL, 0},
    {"clientCertificateRef", sl_vcheck_object, &cert_ref_schema, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t backend_tls_schema = {backend_tls_fields, backend_tls_extra};

static const sl_vrange_t breaker_range = {1, 10000000};
static const sl_vfield_t circuit_breaker_fields[] = {
    {"maxConnections", sl_vcheck_int, &breaker_range, 0},
    {"maxPendingRequests", sl_vcheck_int, &breaker_range, 0},
    {"maxRequests", sl_vcheck_int, &breaker_range, 0},
    {"maxRetries", sl_vcheck_int, &breaker_range, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t circuit_breaker_schema = {circuit_breaker_fields, NULL};

static const sl_vfield_t backend_fields[] = {
    {"endpoints", sl_vcheck_array,
     &(const sl_varray_t){sl_vcheck_object, &endpoint_schema, 1, 1024}, SL_VFIELD_REQUIRED},
    {"loadBalancing", sl_vcheck_object, &lb_schema, 0},
    {"healthCheck", sl_vcheck_object, &health_schema, 0},
    {"outlierDetection", sl_vcheck_object, &outlier_schema, 0},
    {"connectionPool", sl_vcheck_object, &pool_schema, 0},
    {"timeouts", sl_vcheck_object, &backend_timeout_schema, 0},
    {"hostRewrite", check_host_header, NULL, 0},
    {"tls", sl_vcheck_object, &backend_tls_schema, 0},
    {"protocol", sl_vcheck_enum, backend_protocols, 0},
    {"circuitBreaker", sl_vcheck_object, &circuit_breaker_schema, 0},
    {NULL, NULL, NULL, 0},
};
const sl_vschema_t sl_validate_spec_backend = {backend_fields, backend_extra};

/* --- Consumer ------------------------------------------------------------- */

static const sl_vfield_t api_key_fields[] = {
    {"name", sl_vcheck_string, NULL, 0},
    {"keyHash", check_sha256, NULL, SL_VFIELD_REQUIRED},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t api_key_schema = {api_key_fields, NULL};

static const sl_vfield_t basic_fields[] = {
    {"username", sl_vcheck_string, NULL, SL_VFIELD_REQUIRED},
    {"passwordHash", check_password_hash, NULL, SL_VFIELD_REQUIRED},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t basic_schema = {basic_fields, NULL};

static const sl_vfield_t jwt_fields[] = {
    {"subject", sl_vcheck_string, NULL, SL_VFIELD_REQUIRED},
    {"issuer", sl_vcheck_string, NULL, SL_VFIELD_REQUIRED},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t jwt_schema = {jwt_fields, NULL};

static const sl_vfield_t credentials_fields[] = {
    {"apiKeys", sl_vcheck_array, &(const sl_varray_t){sl_vcheck_object, &api_key_schema, 0, 1000},
     0},
    {"basicAuth", sl_vcheck_array, &(const sl_varray_t){sl_vcheck_object, &basic_schema, 0, 1000},
     0},
    {"jwt", sl_vcheck_array, &(const sl_varray_t){sl_vcheck_object, &jwt_schema, 0, 1000}, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t credentials_schema = {credentials_fields, NULL};

static const sl_vfield_t consumer_fields[] = {
    {"credentials", sl_vcheck_object, &credentials_schema, 0},
    {"group", sl_vcheck_string, NULL, 0},
    {NULL, NULL, NULL, 0},
};
const sl_vschema_t sl_validate_spec_consumer = {consumer_fields, NULL};

/* --- Certificate ---------------------------------------------------------- */

static const sl_vfield_t cert_file_fields[] = {
    {"certificate", sl_vcheck_string, NULL, SL_VFIELD_REQUIRED},
    {"privateKey", sl_vcheck_string, NULL, SL_VFIELD_REQUIRED},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t cert_file_schema = {cert_file_fields, NULL};

static const sl_vfield_t secret_ref_fields[] = {
    {"name", sl_vcheck_dns_subdomain, NULL, SL_VFIELD_REQUIRED},
    {"namespace", sl_vcheck_dns_label, NULL, 0},
    {NULL, NULL, NULL, 0},
};
static const sl_vschema_t secret_ref_schema = {secret_ref_fields, NULL};

static void certificate_extra(sl_vctx_t *c, json_t *spec)
{
    bool inline_cert = sl_validate_get(spec, "certificate") != NULL;
    bool inline_key = sl_validate_get(spec, "privateKey") != NULL;
    int sources = (inline_cert || inline_key) + (sl_validate_get(spec, "file") != NULL) +
                  (sl_validate_get(spec, "secretRef") != NULL);
    if (sources != 1) {
        sl_validate_error(c, "set exactly one source: certificate + privateKey, file, or "
                             "secretRef");
        return;
    }
    if (inline_cert && !inline_key) {
        at_key(c, "privateKey", report, "required field missing (with certificate)");
    } else if (inline_key && !inline_cert) {
        at_key(c, "certificate", report, "required field missing (with privateKey)");
    } else if (inline_cert) {
        /* The deep checks (tls_pem.h): a runtime would refuse this pair, so
         * the API refuses it first. File-based pairs are checked where the
         * files are, by the runtime that loads them. */
        json_t *cv = json_object_get(spec, "certificate");
        json_t *kv = json_object_get(spec, "privateKey");
        sl_pem_cert_t pc;
        sl_pem_field_t f;
        char msg[512];
        if (sl_pem_load(&pc, json_string_value(cv), json_string_length(cv), json_string_value(kv),
                        json_string_length(kv), SL_PEM_CHECK_VALIDITY, (int64_t)time(NULL), &f, msg,
                        sizeof(msg)) != 0)
            at_key(c, sl_pem_field_name(f), report, msg);
        else
            sl_pem_free(&pc);
    }
}

static const sl_vfield_t certificate_fields[] = {
    {"certificate", check_pem_cert, NULL, 0},
    {"privateKey", check_pem_key, NULL, 0},
    {"file", sl_vcheck_object, &cert_file_schema, 0},
    {"secretRef", sl_vcheck_object, &secret_ref_schema, 0},
    {NULL, NULL, NULL, 0},
};
const sl_vschema_t sl_validate_spec_certificate = {certificate_fields, certificate_extra};

/* --- OpenAPI of the checks above, for the CRDs (validate.h) ---------------- */

#define STR_DESC(max, desc)                                                                        \
    "{\"type\":\"string\",\"minLength\":1,\"maxLength\":" #max ",\"description\":\"" desc "\"}"
#define INT_OR_STRING(desc) "{\"x-kubernetes-int-or-string\":true,\"description\":\"" desc "\"}"

static json_t *http2_limit_openapi(const void *arg)
{
    const sl_listener_http2_field_t *f = arg;
    if (f->duration)
        return json_pack("{s:b, s:s, s:s}", "x-kubernetes-int-or-string", 1, "pattern",
                         "^[0-9]+(ms|s|m|h)$", "description",
                         "a duration: \"250ms\", \"10s\", \"5m\", \"1h\", or integer "
                         "milliseconds");
    return json_pack("{s:s, s:I, s:I}", "type", "integer", "minimum", (json_int_t)f->min, "maximum",
                     (json_int_t)f->max);
}

/* The traffic log's `fields`: a set of the record's field names. */
static json_t *tlog_fields_openapi(const void *arg)
{
    (void)arg;
    json_t *names = json_array();
    for (unsigned f = 0; f < SL_TLOG_F__COUNT; f++)
        json_array_append_new(names, json_string(sl_tlog_field_names[f]));
    return json_pack("{s:s, s:i, s:i, s:{s:s, s:o}, s:s}", "type", "array", "minItems", 1,
                     "maxItems", (int)SL_TLOG_F__COUNT, "items", "type", "string", "enum", names,
                     "x-kubernetes-list-type", "set");
}

static json_t *number_range_openapi(const void *arg)
{
    const num_range_t *r = arg;
    return json_pack("{s:s, s:f, s:f, s:s}", "type", "number", "minimum", r->min, "maximum", r->max,
                     "description", r->what);
}

const sl_vopenapi_t sl_validate_spec_openapi[] = {
    {check_number_range, NULL, number_range_openapi},
    {check_method,
     "{\"type\":\"string\",\"description\":\"an HTTP method (GET, HEAD, POST, PUT, DELETE, PATCH, "
     "OPTIONS, TRACE, CONNECT) or \\\"*\\\" for any\"}",
     NULL},
    {check_header_name,
     "{\"type\":\"string\",\"minLength\":1,\"maxLength\":256,\"pattern\":\"^[!#$%&'*+.^_`|~0-9A-Za-"
     "z-]+$\"}",
     NULL},
    {check_any_string, "{\"type\":\"string\",\"maxLength\":4096}", NULL},
    {check_api_host,
     STR_DESC(253, "a lowercase hostname, \\\"*.suffix\\\" or \\\"*\\\" (no port, no scheme)"),
     NULL},
    {check_base_path,
     STR_DESC(1024, "a path starting with '/', not ending with '/', without templates"), NULL},
    {check_retry_on,
     INT_OR_STRING("connect-failure, reset, or a 5xx status code as string or integer"), NULL},
    {check_status_range, INT_OR_STRING("a status code (100..599) or a range like \\\"200-399\\\""),
     NULL},
    {check_sha256,
     "{\"type\":\"string\",\"pattern\":\"^sha256:[0-9a-fA-F]{64}$\",\"description\":\"sha256: "
     "followed by 64 hex digits\"}",
     NULL},
    {check_password_hash,
     "{\"type\":\"string\",\"minLength\":20,\"maxLength\":256,\"pattern\":\"^[$](2[aby]|y|5|6)[$]"
     "\","
     "\"description\":\"a bcrypt, yescrypt or SHA-crypt hash\"}",
     NULL},
    {check_pem_cert,
     "{\"type\":\"string\",\"maxLength\":1048576,\"description\":\"PEM "
     "certificates\"}",
     NULL},
    {check_pem_key,
     "{\"type\":\"string\",\"maxLength\":1048576,\"description\":\"a PEM private "
     "key\"}",
     NULL},
    {check_host_header, STR_DESC(260, "a Host value: host or host:port"), NULL},
    {check_abs_path, STR_DESC(1024, "a path starting with '/', without spaces"), NULL},
    {check_upgrade_type, STR_DESC(64, "an upgrade token such as websocket (never h2c)"), NULL},
    {check_openssl_list, STR_DESC(1024, "an OpenSSL list, names separated by ':'"), NULL},
    {check_alpn_list,
     "{\"type\":\"array\",\"minItems\":1,\"maxItems\":2,\"items\":{\"type\":\"string\","
     "\"enum\":[\"h2\",\"http/1.1\"]}}",
     NULL},
    {check_file_path, STR_DESC(4096, "an absolute path on the runtime's machine"), NULL},
    {check_http2_limit, NULL, http2_limit_openapi},
    {check_client_ip, "{\"type\":\"boolean\",\"enum\":[true]}", NULL},
    {check_grpc_service,
     "{\"type\":\"string\",\"maxLength\":1024,\"description\":\"a gRPC service name, or "
     "\\\"\\\" for the whole server\"}",
     NULL},
    {check_fraction,
     "{\"type\":\"number\",\"minimum\":0,\"maximum\":1,\"description\":\"a share of "
     "requests: 0 (none) to 1 (every request)\"}",
     NULL},
    {tlog_fields_extra_check, NULL, tlog_fields_openapi},
    {check_body_field_name,
     "{\"type\":\"string\",\"minLength\":1,\"maxLength\":256,\"description\":\"a JSON member or "
     "form field name, matched exactly\"}",
     NULL},
    {check_body_media_type,
     "{\"type\":\"string\",\"maxLength\":127,\"pattern\":\"^[!#$%&'+.^_`|~0-9A-Za-z-]+/"
     "([!#$%&'+.^_`|~0-9A-Za-z-]+|[*]|[*][+][!#$%&'+.^_`|~0-9A-Za-z-]+)$\",\"description\":"
     "\"type/subtype, type/* or type/*+suffix\"}",
     NULL},
    {check_tlog_url, STR_DESC(2048, "an http:// or https:// URL without a query"), NULL},
    {check_tlog_path, STR_DESC(4096, "an absolute path on the runtime's machine, or stdout"), NULL},
    {check_es_index,
     STR_DESC(200, "an Elasticsearch index prefix: lower case, no \\\\/*?\\\"<>| ,#:"), NULL},
    {check_sql_database,
     "{\"type\":\"string\",\"minLength\":1,\"maxLength\":256,\"pattern\":\"^[A-Za-z_][A-Za-z0-9_]*$"
     "\","
     "\"description\":\"a ClickHouse database\"}",
     NULL},
    {check_tlog_ca_pem,
     "{\"type\":\"string\",\"maxLength\":1048576,\"description\":\"PEM CA certificates\"}", NULL},
    {check_tlog_ca_file, STR_DESC(4096, "an absolute path on the runtime's machine (a PEM file)"),
     NULL},
    {check_sql_table,
     "{\"type\":\"string\",\"minLength\":1,\"maxLength\":256,\"pattern\":\"^([A-Za-z_][A-Za-z0-"
     "9_]*[.])?[A-Za-z_][A-Za-z0-9_]*$\",\"description\":\"a ClickHouse table, optionally "
     "database.table\"}",
     NULL},
    {check_route_scalar,
     "{\"x-kubernetes-int-or-string\":true,\"description\":\"a value compared as a "
     "string\"}",
     NULL},
    {check_route_number, "{\"type\":\"number\"}", NULL},
    {check_route_true, "{\"type\":\"boolean\",\"enum\":[true]}", NULL},
    {check_percent_number,
     "{\"type\":\"number\",\"minimum\":0,\"maximum\":100,\"description\":\"a "
     "percentage of requests\"}",
     NULL},
    {NULL, NULL, NULL},
};
