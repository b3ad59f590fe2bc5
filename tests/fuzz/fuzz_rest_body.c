/*
 * libFuzzer driver: the controller's admin REST API (controller/rest.c,
 * #included to reach its static handlers) on fuzz-made requests, without a
 * socket: path and query routing, the browser/Host and token checks,
 * If-Match, Content-Type, body parsing and validation (YAML and JSON, one or
 * many documents), namespace reconciliation, preconditions, the store
 * (SQLite on tmpfs) and the controller's admission limit and recompile.
 *
 * How the socket is bypassed: each input builds a connection-less
 * evhttp_request (input headers and body set through libevent's public API)
 * and runs the steps of rest.c's on_request after URI parsing, in its order:
 * refuse_browser, authorized, route_api, dispatch_api. Replies are caught by
 * renaming evhttp_send_reply/evhttp_send_error for the included rest.c only
 * (a real connection-less reply would free the request).
 *
 * Input: up to three requests separated by "\n@@\n", each: byte 0 the
 * method, byte 1 flags (Content-Type, If-Match, Origin, Host, token,
 * read-only, route limit), then the request target up to '\n', the If-Match
 * value up to '\n', and the body (the rest).
 *
 * Invariants (abort() on violation):
 *  - every request is answered exactly once, with a status 200..599;
 *  - every answer is JSON (application/json); an error answer is
 *    {"error":{"status":<the status>,"code":...,"message":<non-empty>}};
 *  - a write that succeeded leaves objects the store can read back and the
 *    controller can compile (sl_controller_compile_now) without a crash.
 * Between inputs every stored object is deleted through the API's own DELETE
 * handler, so inputs do not depend on each other.
 */
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include "fuzz_util.h"

static int fuzz_replies;
static int fuzz_last_status;
static int fuzz_head;

/* Checks one answer; the body is not consumed (the caller frees it). */
static void fuzz_send_reply(struct evhttp_request *req, int code, const char *reason,
                            struct evbuffer *body)
{
    fuzz_replies++;
    fuzz_last_status = code;
    FUZZ_CHECK(code >= 200 && code <= 599, "status %d", code);
    FUZZ_CHECK(reason != NULL, "no reason phrase for %d", code);
    const char *ct = evhttp_find_header(evhttp_request_get_output_headers(req), "Content-Type");
    FUZZ_CHECK(ct && strcmp(ct, "application/json") == 0, "status %d with Content-Type %s", code,
               ct ? ct : "(none)");
    /* HEAD: rest.c sends no body when the request's own command is HEAD,
     * which a connection-less request cannot carry (no public setter), so
     * the body it builds arrives here and is checked like any other. */
    if (fuzz_head && body == NULL)
        return;
    FUZZ_CHECK(body != NULL, "status %d without a body", code);
    size_t len = evbuffer_get_length(body);
    const char *text = (const char *)evbuffer_pullup(body, -1);
    json_error_t jerr;
    json_t *doc = json_loadb(text ? text : "", len, 0, &jerr);
    FUZZ_CHECK(doc != NULL, "status %d: body is not JSON: %s", code, jerr.text);
    if (code >= 400) {
        json_t *e = json_object_get(doc, "error");
        json_t *st = json_object_get(e, "status");
        const char *msg = json_string_value(json_object_get(e, "message"));
        FUZZ_CHECK(json_integer_value(st) == code, "error.status differs from status %d", code);
        FUZZ_CHECK(msg && msg[0], "status %d without an error message", code);
        FUZZ_CHECK(json_string_value(json_object_get(e, "code")) != NULL,
                   "status %d without an error code", code);
    }
    json_decref(doc);
}

static void fuzz_send_error(struct evhttp_request *req, int code, const char *reason)
{
    (void)req;
    (void)reason;
    fuzz_replies++;
    fuzz_last_status = code;
}

#define evhttp_send_reply fuzz_send_reply
#define evhttp_send_error fuzz_send_error
#include "../../controller/rest.c"
#undef evhttp_send_reply
#undef evhttp_send_error

#include "core.h"
#include "store.h"

#include <dirent.h>
#include <ftw.h>
#include <signal.h>

static struct event_base *fuzz_base;
static sl_store_t *fuzz_store;
static sl_controller_t *fuzz_ctl;
static char fuzz_dir[128];

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void remove_store_dir(void)
{
    if (fuzz_store)
        sl_store_close(fuzz_store);
    fuzz_store = NULL;
    if (fuzz_dir[0])
        nftw(fuzz_dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* Store directories of runs that ended without atexit (libFuzzer's
 * -max_total_time and crash exits use _Exit): removed when their process is
 * gone, never while it runs (fork mode has several at once). */
static void remove_stale_dirs(const char *parent)
{
    DIR *d = opendir(parent);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int pid;
        if (sscanf(e->d_name, "sluice-fuzz-rest-%d", &pid) != 1 || pid <= 0)
            continue;
        if (kill(pid, 0) == 0 || errno != ESRCH)
            continue;
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", parent, e->d_name);
        nftw(path, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    }
    closedir(d);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    sl_log_set_level(SL_LOG_ALERT);
    /* tmpfs: the store fsyncs every write (synchronous=FULL). */
    const char *parent = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    remove_stale_dirs(parent);
    snprintf(fuzz_dir, sizeof(fuzz_dir), "%s/sluice-fuzz-rest-%d", parent, (int)getpid());
    if (mkdir(fuzz_dir, 0700) != 0 && errno != EEXIST)
        abort();
    char err[512];
    fuzz_store = sl_store_open(fuzz_dir, err, sizeof(err));
    if (!fuzz_store) {
        fprintf(stderr, "fuzz_rest_body: %s\n", err);
        abort();
    }
    atexit(remove_store_dir);
    fuzz_base = event_base_new();
    fuzz_ctl = fuzz_base ? sl_controller_new(fuzz_base, fuzz_store, NULL) : NULL;
    if (!fuzz_ctl)
        abort();
    return 0;
}

static const enum evhttp_cmd_type methods[8] = {
    EVHTTP_REQ_GET,    EVHTTP_REQ_HEAD,    EVHTTP_REQ_POST,  EVHTTP_REQ_PUT,
    EVHTTP_REQ_DELETE, EVHTTP_REQ_OPTIONS, EVHTTP_REQ_PATCH, EVHTTP_REQ_POST,
};

/* Next '\n'-terminated field of at most max bytes, NUL-terminated into out. */
static size_t take_line(const uint8_t **p, size_t *n, char *out, size_t max)
{
    size_t i = 0;
    while (i < *n && (*p)[i] != '\n' && i < max) {
        out[i] = (*p)[i] ? (char)(*p)[i] : '?';
        i++;
    }
    out[i] = '\0';
    size_t used = i < *n && (*p)[i] == '\n' ? i + 1 : i;
    *p += used;
    *n -= used;
    return i;
}

/* One request through rest.c's steps; returns the status answered. */
static int run_request(sl_rest_t *rest, enum evhttp_cmd_type cmd, const char *target,
                       struct evkeyvalq *headers, const uint8_t *body, size_t body_len)
{
    struct evhttp_request *req = evhttp_request_new(NULL, NULL);
    FUZZ_CHECK(req != NULL, "evhttp_request_new");
    struct evkeyval *h;
    TAILQ_FOREACH(h, headers, next)
    {
        evhttp_add_header(evhttp_request_get_input_headers(req), h->key, h->value);
    }
    if (body_len)
        evbuffer_add(evhttp_request_get_input_buffer(req), body, body_len);

    fuzz_replies = 0;
    fuzz_last_status = 0;
    fuzz_head = cmd == EVHTTP_REQ_HEAD;

    call_t c;
    memset(&c, 0, sizeof(c));
    c.rest = rest;
    c.req = req;
    c.cmd = cmd;

    /* The path and query as evhttp_uri would give them to on_request. */
    char path[600];
    snprintf(path, sizeof(path), "%s", target);
    char *query = strchr(path, '?');
    if (query)
        *query++ = '\0';
    if (path[0] != '/') {
        reply_error(req, 400, "bad_request", NULL, "the request target must be an absolute path");
    } else if (strcmp(path, "/api") != 0 && strncmp(path, "/api/", 5) != 0) {
        reply_error(req, 404, "not_found", NULL, "no such endpoint");
    } else if (!refuse_browser(&c)) {
        bool presented = false;
        if (rest->have_token && !authorized(rest, req, &presented)) {
            reply_error(req, 401, "unauthorized", NULL, "token");
        } else if (route_api(&c, path, query) == 0) {
            dispatch_api(&c);
        }
    }
    FUZZ_CHECK(fuzz_replies == 1, "%s %s answered %d times", fuzz_head ? "HEAD" : "request", target,
               fuzz_replies);
    evhttp_request_free(req);
    return fuzz_last_status;
}

/* Deletes every stored object through the API's DELETE handler. */
static void delete_everything(sl_rest_t *rest)
{
    struct evkeyvalq none;
    TAILQ_INIT(&none);
    for (int k = 0; k < SL_KIND__COUNT; k++) {
        json_t *items = NULL;
        if (sl_store_list(fuzz_store, (enum sl_kind)k, NULL, &items) != SL_STORE_OK)
            abort();
        size_t i;
        json_t *obj;
        json_array_foreach(items, i, obj)
        {
            json_t *meta = json_object_get(obj, "metadata");
            char target[700];
            snprintf(target, sizeof(target), "/api/v1/namespaces/%s/%s/%s",
                     json_string_value(json_object_get(meta, "namespace")),
                     sl_kind_plural((enum sl_kind)k),
                     json_string_value(json_object_get(meta, "name")));
            int st = run_request(rest, EVHTTP_REQ_DELETE, target, &none, NULL, 0);
            FUZZ_CHECK(st == 200, "cleanup DELETE %s answered %d", target, st);
        }
        json_decref(items);
    }
}

/* One request of the input: [method][flags][target\n][If-Match\n][body]. */
static void one_request(const uint8_t *data, size_t size)
{
    if (size < 2)
        return;
    enum evhttp_cmd_type cmd = methods[data[0] & 7];
    uint8_t flags = data[1];
    const uint8_t *p = data + 2;
    size_t n = size - 2;
    char target[520], if_match[80];
    take_line(&p, &n, target, 512);
    take_line(&p, &n, if_match, 64);

    struct evkeyvalq headers;
    TAILQ_INIT(&headers);
    static const char *const types[4] = {NULL, "application/json",
                                         "application/yaml; charset=utf-8",
                                         "application/x-www-form-urlencoded"};
    if (types[flags & 3])
        evhttp_add_header(&headers, "Content-Type", types[flags & 3]);
    if (flags & 4)
        evhttp_add_header(&headers, "If-Match", if_match);
    if (flags & 8)
        evhttp_add_header(&headers, "Origin", "http://evil.example");
    evhttp_add_header(&headers, "Host", (flags & 16) ? "rebind.example:9000" : "127.0.0.1:9000");
    if (flags & 32)
        evhttp_add_header(&headers, "Authorization", "Bearer fuzz-token");

    sl_rest_t rest;
    memset(&rest, 0, sizeof(rest));
    rest.st = fuzz_store;
    rest.ctl = fuzz_ctl;
    rest.opt.max_body_bytes = 1 << 20;
    rest.opt.read_only = (flags & 64) != 0;
    if (flags & 32) {
        /* The token matches the header when the If-Match line is empty;
         * otherwise it is a wrong one, for the 401 path. */
        const char *token = if_match[0] ? if_match : "fuzz-token";
        rest.have_token = true;
        sha256(token, strlen(token), rest.token_sha256);
    }
    sl_controller_set_max_routes(fuzz_ctl, (flags & 128) ? 3 : 200000);

    int st = run_request(&rest, cmd, target, &headers, p, n);
    if (st >= 200 && st < 300 && cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD)
        sl_controller_compile_now(fuzz_ctl);
    evhttp_clear_headers(&headers);
}

/*
 * Up to three requests per input, separated by "\n@@\n", so that a write can
 * meet an existing object (PUT over POST, If-Match, DELETE); then a clean
 * store for the next input.
 */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char sep[] = "\n@@\n";
    const uint8_t *p = data;
    size_t n = size;
    for (int i = 0; i < 3 && n > 0; i++) {
        const uint8_t *end = i < 2 ? memmem(p, n, sep, 4) : NULL;
        size_t len = end ? (size_t)(end - p) : n;
        one_request(p, len);
        if (!end)
            break;
        p += len + 4;
        n -= len + 4;
    }
    sl_rest_t rest;
    memset(&rest, 0, sizeof(rest));
    rest.st = fuzz_store;
    rest.ctl = fuzz_ctl;
    rest.opt.max_body_bytes = 1 << 20;
    delete_everything(&rest);
    sl_controller_compile_now(fuzz_ctl);
    return 0;
}
