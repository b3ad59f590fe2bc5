/*
 * The file sink: JSON lines (or nginx "combined" lines) appended to a path
 * or stdout, a batch per write(2); size-based rotation (path -> path.1 ->
 * ... -> path.<keep>, the oldest deleted) and reopening on SIGUSR1 for an
 * external logrotate. A write that fails loses its batch (counted, said
 * once per distinct error): the queue must keep moving, or the budget
 * would fill and every later record be dropped as well.
 */
#include "tlog_sink.h"

#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    int fd;
    int is_stdout;
    uint64_t size; /* bytes in the current file, for rotation */
    int last_errno;
} file_state_t;

static int open_path(const char *path, uint64_t *size)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd >= 0 && size) {
        struct stat st;
        *size = fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
    }
    return fd;
}

int sl_tlog_file_open(sl_tlog_sink_t *s, char *err, size_t errlen)
{
    file_state_t *f = calloc(1, sizeof(*f));
    if (!f) {
        snprintf(err, errlen, "traffic log sink %s: out of memory", s->cfg.name);
        return -1;
    }
    if (strcmp(s->cfg.path, "stdout") == 0) {
        f->fd = STDOUT_FILENO;
        f->is_stdout = 1;
    } else {
        f->fd = open_path(s->cfg.path, &f->size);
        if (f->fd < 0) {
            snprintf(err, errlen,
                     "traffic log sink %s: %s: %s (check the path and its directory's "
                     "permissions)",
                     s->cfg.name, s->cfg.path, strerror(errno));
            free(f);
            return -1;
        }
    }
    s->state = f;
    return 0;
}

static int file_encode(sl_tlog_sink_t *s, const sl_tlog_view_t *v, const char *json,
                       size_t json_len, sl_tlog_buf_t *out)
{
    if (s->cfg.combined)
        return sl_tlog_format_combined(v, out);
    if (sl_tlog_buf_add(out, json, json_len) != 0)
        return -1;
    return sl_tlog_buf_add(out, "\n", 1);
}

static void rotate(sl_tlog_sink_t *s, file_state_t *f)
{
    size_t plen = strlen(s->cfg.path) + 16;
    char *from = malloc(plen), *to = malloc(plen);
    if (!from || !to) {
        free(from);
        free(to);
        return;
    }
    snprintf(to, plen, "%s.%u", s->cfg.path, s->cfg.rotate_keep);
    unlink(to);
    for (unsigned k = s->cfg.rotate_keep; k > 1; k--) {
        snprintf(from, plen, "%s.%u", s->cfg.path, k - 1);
        snprintf(to, plen, "%s.%u", s->cfg.path, k);
        rename(from, to); /* ENOENT for the ones not made yet */
    }
    snprintf(to, plen, "%s.1", s->cfg.path);
    if (rename(s->cfg.path, to) != 0 && errno != ENOENT) {
        sl_log_error("traffic log sink %s: cannot rotate %s: %s; still writing to it", s->cfg.name,
                     s->cfg.path, strerror(errno));
    } else {
        uint64_t size = 0;
        int fd = open_path(s->cfg.path, &size);
        if (fd < 0) {
            sl_log_error("traffic log sink %s: cannot open %s after rotating: %s; still "
                         "writing to %s",
                         s->cfg.name, s->cfg.path, strerror(errno), to);
        } else {
            close(f->fd);
            f->fd = fd;
            f->size = size;
        }
    }
    free(from);
    free(to);
}

static uint64_t count_lines(const char *p, size_t n)
{
    uint64_t lines = 0;
    const char *end = p + n;
    while ((p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
        lines++;
        p++;
    }
    return lines;
}

static enum sl_tlog_deliver_result file_deliver(sl_tlog_sink_t *s, sl_tlog_buf_t *batch,
                                                unsigned *nrec)
{
    file_state_t *f = s->state;
    if (!f->is_stdout && s->cfg.rotate_max_bytes && f->size > 0 &&
        f->size + batch->len > s->cfg.rotate_max_bytes)
        rotate(s, f);
    const char *p = batch->data;
    size_t left = batch->len;
    while (left) {
        ssize_t w = write(f->fd, p, left);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                /* stdout inherited in non-blocking mode: wait for room. */
                struct pollfd pfd = {.fd = f->fd, .events = POLLOUT};
                poll(&pfd, 1, 100);
                continue;
            }
            int e = errno;
            uint64_t lost = count_lines(p, left);
            /* A record cut in the middle of the write counts as lost. */
            if (left != batch->len && p[-1] != '\n')
                lost++;
            if (e != f->last_errno)
                sl_log_error("traffic log sink %s: write to %s failed: %s; records are dropped "
                             "until it recovers",
                             s->cfg.name, f->is_stdout ? "stdout" : s->cfg.path, strerror(e));
            f->last_errno = e;
            sl_tlog_sink_lost(s, lost, NULL);
            uint64_t written = *nrec > lost ? *nrec - lost : 0;
            atomic_fetch_add_explicit(&s->written, written, memory_order_relaxed);
            return SL_TLOG_DELIVERED;
        }
        f->last_errno = 0;
        p += w;
        left -= (size_t)w;
        f->size += (uint64_t)w;
    }
    atomic_fetch_add_explicit(&s->written, *nrec, memory_order_relaxed);
    return SL_TLOG_DELIVERED;
}

static void file_reopen(sl_tlog_sink_t *s)
{
    file_state_t *f = s->state;
    if (f->is_stdout)
        return;
    uint64_t size = 0;
    int fd = open_path(s->cfg.path, &size);
    if (fd < 0) {
        sl_log_error("traffic log sink %s: reopen of %s failed: %s; still writing to the "
                     "previous file",
                     s->cfg.name, s->cfg.path, strerror(errno));
        return;
    }
    close(f->fd);
    f->fd = fd;
    f->size = size;
    f->last_errno = 0;
    sl_log_notice("traffic log sink %s: %s reopened", s->cfg.name, s->cfg.path);
}

static void file_close(sl_tlog_sink_t *s)
{
    file_state_t *f = s->state;
    if (!f)
        return;
    if (!f->is_stdout && f->fd >= 0)
        close(f->fd);
    free(f);
    s->state = NULL;
}

const sl_tlog_sink_ops_t sl_tlog_file_ops = {
    .type = "file",
    .encode = file_encode,
    .deliver = file_deliver,
    .reopen = file_reopen,
    .close = file_close,
    .lines_per_record = 1,
};
