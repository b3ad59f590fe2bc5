/*
 * Access log: workers format one line per request into their own ring, a
 * writer thread drains the rings to a file or stdout.
 *
 * Responsible for: the two line formats (JSON lines, nginx "combined"),
 * escaping so that every JSON line parses whatever bytes a client sent, the
 * per-worker single-producer/single-consumer byte rings, the writer thread,
 * reopening the file for rotation, and counting what had to be dropped.
 *
 * Not responsible for: deciding what goes into an entry (the worker fills
 * sl_accesslog_entry_t), signal handling (the main thread calls
 * sl_accesslog_reopen from its SIGUSR1 event), nor rotation itself
 * (logrotate renames; we reopen).
 *
 * Threading and ordering: ring i has exactly one producer, worker i, and one
 * consumer, the writer thread. The producer publishes whole lines only
 * (release store of `head` after the copy), so the writer never sees half a
 * line, and lines of one worker reach the file in the order they were logged.
 * A worker never blocks and never makes a system call except one eventfd
 * write when its ring passes half full (a counter write never blocks). When a
 * ring has no room, the line is dropped and counted in the ring's own
 * counter (single writer, relaxed).
 */
#include "accesslog.h"

#include "log.h"
#include "metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define RING_BYTES (1u << 20) /* per worker; a power of two */
#define LINE_MAX_BYTES (64 * 1024)
#define FLUSH_INTERVAL_MS 100
#define REOPEN_WAIT_MS 2000

/* Input bytes kept per field before escaping; escaping grows a byte to at
 * most 6 ("\u00XX"), so the worst line stays well below LINE_MAX_BYTES. */
#define FIELD_MAX_PATH 4096
#define FIELD_MAX_LONG 1024 /* user agent, referer */
#define FIELD_MAX_SHORT 256 /* everything else */

typedef struct {
    _Atomic size_t head __attribute__((aligned(64))); /* bytes published, producer-owned */
    _Atomic uint64_t dropped;                         /* lines dropped, producer-owned */
    _Atomic size_t tail __attribute__((aligned(64))); /* bytes consumed, writer-owned */
    char *buf __attribute__((aligned(64)));
    char *line; /* the worker's scratch line, LINE_MAX_BYTES */
} ring_t;

static struct {
    atomic_int enabled;
    enum sl_accesslog_format fmt;
    unsigned nworkers;
    ring_t *rings;
    char *path; /* NULL for stdout */
    int fd;
    int wake_fd; /* eventfd */
    pthread_t writer;
    atomic_int stopping;
    _Atomic uint64_t reopen_requested; /* sequence numbers */
    uint64_t reopen_done;              /* under reopen_lock */
    pthread_mutex_t reopen_lock;
    pthread_cond_t reopen_cond;
    _Atomic uint64_t write_lost_lines; /* lines lost to a failed write(2) */
    _Atomic uint64_t bad_worker_drops; /* worker index out of range */
    int last_write_errno;              /* writer thread only */
} alog = {
    .fd = -1,
    .wake_fd = -1,
    .reopen_lock = PTHREAD_MUTEX_INITIALIZER,
    .reopen_cond = PTHREAD_COND_INITIALIZER,
};

/* ---- formatting -------------------------------------------------------- */

typedef struct {
    char *p;
    char *end;
} out_t;

static inline void put(out_t *o, const char *s, size_t n)
{
    if ((size_t)(o->end - o->p) < n)
        n = (size_t)(o->end - o->p);
    memcpy(o->p, s, n);
    o->p += n;
}

static inline void put_c(out_t *o, char c)
{
    if (o->p < o->end)
        *o->p++ = c;
}

#define PUT_LIT(o, lit) put((o), (lit), sizeof(lit) - 1)

static void put_u64(out_t *o, uint64_t v)
{
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        put_c(o, tmp[--n]);
}

static void put_2d(out_t *o, unsigned v)
{
    put_c(o, (char)('0' + v / 10 % 10));
    put_c(o, (char)('0' + v % 10));
}

static const char hex_digits[] = "0123456789abcdef";

/* Length of a valid UTF-8 sequence at s (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF), or 0 if the byte at s does not start
 * one. */
static size_t utf8_valid_len(const unsigned char *s, size_t avail)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf; /* allowed range of the 2nd byte */
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f;
    } else
        return 0;
    if (avail < n || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return n;
}

/* A JSON string body: quote, backslash and control characters escaped; valid
 * UTF-8 copied; each byte that is not part of valid UTF-8 written as \u00XX
 * (its Latin-1 reading) so the line is valid JSON and the byte value stays
 * visible. At most `max_in` input bytes are used. */
static void put_json_str(out_t *o, sl_str_t s, size_t max_in)
{
    const unsigned char *p = (const unsigned char *)s.ptr;
    size_t len = s.ptr ? (s.len < max_in ? s.len : max_in) : 0;
    size_t i = 0;
    while (i < len) {
        unsigned char c = p[i];
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
            size_t run = i;
            while (run < len && p[run] >= 0x20 && p[run] < 0x80 && p[run] != '"' && p[run] != '\\')
                run++;
            put(o, (const char *)p + i, run - i);
            i = run;
            continue;
        }
        switch (c) {
        case '"':
            PUT_LIT(o, "\\\"");
            i++;
            continue;
        case '\\':
            PUT_LIT(o, "\\\\");
            i++;
            continue;
        case '\n':
            PUT_LIT(o, "\\n");
            i++;
            continue;
        case '\r':
            PUT_LIT(o, "\\r");
            i++;
            continue;
        case '\t':
            PUT_LIT(o, "\\t");
            i++;
            continue;
        default:
            break;
        }
        size_t n = c >= 0x80 ? utf8_valid_len(p + i, len - i) : 0;
        if (n) {
            put(o, (const char *)p + i, n);
            i += n;
            continue;
        }
        char esc[6] = {'\\', 'u', '0', '0', hex_digits[c >> 4], hex_digits[c & 15]};
        put(o, esc, sizeof(esc));
        i++;
    }
}

/* nginx's escaping of its log variables: '"', '\\' and bytes outside
 * 0x20..0x7e as \xXX. Empty values print as "-". */
static void put_combined_str(out_t *o, sl_str_t s, size_t max_in)
{
    const unsigned char *p = (const unsigned char *)s.ptr;
    size_t len = s.ptr ? (s.len < max_in ? s.len : max_in) : 0;
    if (len == 0) {
        put_c(o, '-');
        return;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char c = p[i];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
            put_c(o, (char)c);
        } else {
            char esc[4] = {'\\', 'x', hex_digits[c >> 4], hex_digits[c & 15]};
            put(o, esc, sizeof(esc));
        }
    }
}

typedef struct {
    unsigned year, month, day, hour, min, sec, msec;
} civil_time_t;

/* UTC calendar time without gmtime_r: glibc's takes a process-wide lock,
 * which a worker must not do per request. Days-to-civil after Howard
 * Hinnant's public-domain date algorithms. */
static void civil_from_unix_us(uint64_t unix_us, civil_time_t *t)
{
    uint64_t secs = unix_us / 1000000;
    t->msec = (unsigned)(unix_us % 1000000 / 1000);
    uint64_t days = secs / 86400, rem = secs % 86400;
    t->hour = (unsigned)(rem / 3600);
    t->min = (unsigned)(rem % 3600 / 60);
    t->sec = (unsigned)(rem % 60);
    uint64_t z = days + 719468;
    uint64_t era = z / 146097;
    uint64_t doe = z - era * 146097;
    uint64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    uint64_t y = yoe + era * 400;
    uint64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    uint64_t mp = (5 * doy + 2) / 153;
    t->day = (unsigned)(doy - (153 * mp + 2) / 5 + 1);
    t->month = (unsigned)(mp < 10 ? mp + 3 : mp - 9);
    t->year = (unsigned)(y + (t->month <= 2));
}

static void put_protocol(out_t *o, int minor_version)
{
    if (minor_version < 0) {
        PUT_LIT(o, "HTTP/2.0");
        return;
    }
    PUT_LIT(o, "HTTP/1.");
    put_c(o, (minor_version >= 0 && minor_version <= 9) ? (char)('0' + minor_version) : '1');
}

static size_t format_json(char *buf, size_t cap, const sl_accesslog_entry_t *e)
{
    out_t o = {buf, buf + cap};
    civil_time_t t;
    civil_from_unix_us(e->start_unix_us, &t);

    PUT_LIT(&o, "{\"time\":\"");
    put_u64(&o, t.year);
    put_c(&o, '-');
    put_2d(&o, t.month);
    put_c(&o, '-');
    put_2d(&o, t.day);
    put_c(&o, 'T');
    put_2d(&o, t.hour);
    put_c(&o, ':');
    put_2d(&o, t.min);
    put_c(&o, ':');
    put_2d(&o, t.sec);
    put_c(&o, '.');
    put_c(&o, (char)('0' + t.msec / 100));
    put_2d(&o, t.msec % 100);
    PUT_LIT(&o, "Z\",\"client\":\"");
    put_json_str(&o, e->client_addr, FIELD_MAX_SHORT);
    PUT_LIT(&o, "\",\"method\":\"");
    put_json_str(&o, e->method, FIELD_MAX_SHORT);
    PUT_LIT(&o, "\",\"path\":\"");
    put_json_str(&o, e->path, FIELD_MAX_PATH);
    PUT_LIT(&o, "\",\"protocol\":\"");
    put_protocol(&o, e->minor_version);
    PUT_LIT(&o, "\",\"status\":");
    put_u64(&o, e->status > 0 ? (uint64_t)e->status : 0);
    PUT_LIT(&o, ",\"bytes_received\":");
    put_u64(&o, e->bytes_received);
    PUT_LIT(&o, ",\"bytes_sent\":");
    put_u64(&o, e->bytes_sent);
    PUT_LIT(&o, ",\"duration_ms\":");
    put_u64(&o, e->duration_us / 1000);
    put_c(&o, '.');
    put_c(&o, (char)('0' + e->duration_us % 1000 / 100));
    put_2d(&o, (unsigned)(e->duration_us % 100));
    PUT_LIT(&o, ",\"request_id\":\"");
    put_json_str(&o, e->request_id, FIELD_MAX_SHORT);
    PUT_LIT(&o, "\",\"api\":\"");
    put_json_str(&o, e->api, FIELD_MAX_SHORT);
    PUT_LIT(&o, "\",\"operation\":\"");
    put_json_str(&o, e->operation, FIELD_MAX_SHORT);
    PUT_LIT(&o, "\",\"upstream\":\"");
    put_json_str(&o, e->upstream_addr, FIELD_MAX_SHORT);
    PUT_LIT(&o, "\",\"user_agent\":\"");
    put_json_str(&o, e->user_agent, FIELD_MAX_LONG);
    PUT_LIT(&o, "\",\"referer\":\"");
    put_json_str(&o, e->referer, FIELD_MAX_LONG);
    PUT_LIT(&o, "\",\"host\":\"");
    put_json_str(&o, e->host, FIELD_MAX_SHORT);
    PUT_LIT(&o, "\",\"error\":\"");
    put_json_str(&o, e->error_code, FIELD_MAX_SHORT);
    PUT_LIT(&o, "\",\"consumer\":\"");
    put_json_str(&o, e->consumer, FIELD_MAX_SHORT);
    PUT_LIT(&o, "\",\"policy\":\"");
    put_json_str(&o, e->policy, FIELD_MAX_SHORT);
    PUT_LIT(&o, "\",\"cache\":\"");
    put_json_str(&o, e->cache, FIELD_MAX_SHORT);
    PUT_LIT(&o, "\"}\n");
    return (size_t)(o.p - buf);
}

/* nginx:  $remote_addr - $remote_user [$time_local] "$request" $status
 *         $body_bytes_sent "$http_referer" "$http_user_agent"
 * Times are UTC (+0000): workers never consult the time zone. The byte count
 * is the whole response including its head (nginx's $bytes_sent), the only
 * count the entry carries. */
static size_t format_combined(char *buf, size_t cap, const sl_accesslog_entry_t *e)
{
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    out_t o = {buf, buf + cap};
    civil_time_t t;
    civil_from_unix_us(e->start_unix_us, &t);

    put_combined_str(&o, e->client_addr, FIELD_MAX_SHORT);
    /* $remote_user: the authenticated Consumer, as nginx logs its user. */
    if (e->consumer.len) {
        PUT_LIT(&o, " - ");
        put_combined_str(&o, e->consumer, FIELD_MAX_SHORT);
        PUT_LIT(&o, " [");
    } else {
        PUT_LIT(&o, " - - [");
    }
    put_2d(&o, t.day);
    put_c(&o, '/');
    put(&o, months[(t.month - 1) % 12], 3);
    put_c(&o, '/');
    put_u64(&o, t.year);
    put_c(&o, ':');
    put_2d(&o, t.hour);
    put_c(&o, ':');
    put_2d(&o, t.min);
    put_c(&o, ':');
    put_2d(&o, t.sec);
    PUT_LIT(&o, " +0000] \"");
    put_combined_str(&o, e->method, FIELD_MAX_SHORT);
    put_c(&o, ' ');
    put_combined_str(&o, e->path, FIELD_MAX_PATH);
    put_c(&o, ' ');
    put_protocol(&o, e->minor_version);
    PUT_LIT(&o, "\" ");
    put_u64(&o, e->status > 0 ? (uint64_t)e->status : 0);
    put_c(&o, ' ');
    put_u64(&o, e->bytes_sent);
    PUT_LIT(&o, " \"");
    put_combined_str(&o, e->referer, FIELD_MAX_LONG);
    PUT_LIT(&o, "\" \"");
    put_combined_str(&o, e->user_agent, FIELD_MAX_LONG);
    PUT_LIT(&o, "\"\n");
    return (size_t)(o.p - buf);
}

/* ---- workers' side ----------------------------------------------------- */

int sl_accesslog_enabled(void)
{
    return atomic_load_explicit(&alog.enabled, memory_order_relaxed);
}

static void wake_writer(void)
{
    uint64_t one = 1;
    /* Never blocks: the counter only fails (EAGAIN) at 2^64-2 pending. */
    ssize_t w = write(alog.wake_fd, &one, sizeof(one));
    (void)w;
}

void sl_accesslog_write(unsigned worker, const sl_accesslog_entry_t *e)
{
    if (!atomic_load_explicit(&alog.enabled, memory_order_acquire) || !e)
        return;
    if (sl_unlikely(worker >= alog.nworkers)) {
        atomic_fetch_add_explicit(&alog.bad_worker_drops, 1, memory_order_relaxed);
        return;
    }
    ring_t *r = &alog.rings[worker];
    size_t len = alog.fmt == SL_ACCESSLOG_COMBINED ? format_combined(r->line, LINE_MAX_BYTES, e)
                                                   : format_json(r->line, LINE_MAX_BYTES, e);
    size_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    size_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    size_t used = head - tail;
    if (len > RING_BYTES - used) {
        SL_STAT_ADD(r->dropped, 1);
        return;
    }
    size_t off = head & (RING_BYTES - 1);
    size_t first = RING_BYTES - off < len ? RING_BYTES - off : len;
    memcpy(r->buf + off, r->line, first);
    memcpy(r->buf, r->line + first, len - first);
    atomic_store_explicit(&r->head, head + len, memory_order_release);
    if (used < RING_BYTES / 2 && used + len >= RING_BYTES / 2)
        wake_writer();
}

uint64_t sl_accesslog_dropped(void)
{
    uint64_t n = atomic_load_explicit(&alog.write_lost_lines, memory_order_relaxed) +
                 atomic_load_explicit(&alog.bad_worker_drops, memory_order_relaxed);
    ring_t *rings = alog.rings;
    for (unsigned i = 0; rings && i < alog.nworkers; i++)
        n += atomic_load_explicit(&rings[i].dropped, memory_order_relaxed);
    return n;
}

/* ---- writer thread ----------------------------------------------------- */

static uint64_t count_lines(const struct iovec *iov, int n)
{
    uint64_t lines = 0;
    for (int i = 0; i < n; i++) {
        const char *p = iov[i].iov_base, *end = p + iov[i].iov_len;
        while ((p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
            lines++;
            p++;
        }
    }
    return lines;
}

/* Writes every iovec completely. On an error other than EINTR the rest is
 * lost (counted as dropped lines, logged once per distinct errno): the rings
 * must keep moving or every worker would start dropping. */
static void write_all(struct iovec *iov, int n)
{
    while (n > 0) {
        ssize_t w = writev(alog.fd, iov, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                /* stdout inherited in non-blocking mode: wait for room. */
                struct pollfd pfd = {.fd = alog.fd, .events = POLLOUT};
                poll(&pfd, 1, FLUSH_INTERVAL_MS);
                continue;
            }
            int e = errno;
            atomic_fetch_add_explicit(&alog.write_lost_lines, count_lines(iov, n),
                                      memory_order_relaxed);
            if (e != alog.last_write_errno)
                sl_log_error("access log %s: write failed: %s; lines are dropped until it recovers",
                             alog.path ? alog.path : "stdout", strerror(e));
            alog.last_write_errno = e;
            return;
        }
        alog.last_write_errno = 0;
        size_t done = (size_t)w;
        while (n > 0 && done >= iov->iov_len) {
            done -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + done;
            iov->iov_len -= done;
        }
    }
}

/* One writev for everything the rings hold now (two iovecs per ring when its
 * data wraps), then the tails move so the workers get their room back. */
static void drain_all(void)
{
    struct iovec iov[2 * SL_MAX_WORKERS];
    size_t heads[SL_MAX_WORKERS];
    int n = 0;
    for (unsigned i = 0; i < alog.nworkers; i++) {
        ring_t *r = &alog.rings[i];
        size_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
        size_t head = atomic_load_explicit(&r->head, memory_order_acquire);
        heads[i] = head;
        if (head == tail)
            continue;
        size_t off = tail & (RING_BYTES - 1), len = head - tail;
        size_t first = RING_BYTES - off < len ? RING_BYTES - off : len;
        iov[n++] = (struct iovec){r->buf + off, first};
        if (len > first)
            iov[n++] = (struct iovec){r->buf, len - first};
    }
    if (n == 0)
        return;
    write_all(iov, n);
    for (unsigned i = 0; i < alog.nworkers; i++)
        atomic_store_explicit(&alog.rings[i].tail, heads[i], memory_order_release);
}

static void do_reopen(void)
{
    if (!alog.path)
        return; /* stdout: nothing to reopen */
    int fd = open(alog.path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0) {
        sl_log_error("access log %s: reopen failed: %s; still writing to the previous file",
                     alog.path, strerror(errno));
        return;
    }
    close(alog.fd);
    alog.fd = fd;
    alog.last_write_errno = 0;
    sl_log_notice("access log %s: reopened", alog.path);
}

static void *writer_main(void *arg)
{
    (void)arg;
    for (;;) {
        struct pollfd pfd = {.fd = alog.wake_fd, .events = POLLIN};
        if (poll(&pfd, 1, FLUSH_INTERVAL_MS) > 0) {
            uint64_t v;
            ssize_t rd = read(alog.wake_fd, &v, sizeof(v));
            (void)rd;
        }
        int stop = atomic_load_explicit(&alog.stopping, memory_order_acquire);
        drain_all();
        uint64_t want = atomic_load_explicit(&alog.reopen_requested, memory_order_acquire);
        if (want != alog.reopen_done) {
            /* What was logged before the request went to the old file
             * (drained just above); what follows goes to the new one. */
            do_reopen();
            pthread_mutex_lock(&alog.reopen_lock);
            alog.reopen_done = want;
            pthread_cond_broadcast(&alog.reopen_cond);
            pthread_mutex_unlock(&alog.reopen_lock);
        }
        if (stop) {
            drain_all();
            return NULL;
        }
    }
}

/* Error text for the caller; err may be NULL. vsnprintf truncates quietly
 * when a long path does not fit, which is what we want. */
static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ---- control (main thread) --------------------------------------------- */

static void free_state(void)
{
    for (unsigned i = 0; alog.rings && i < alog.nworkers; i++) {
        free(alog.rings[i].buf);
        free(alog.rings[i].line);
    }
    free(alog.rings);
    alog.rings = NULL;
    alog.nworkers = 0;
    if (alog.fd >= 0 && alog.path)
        close(alog.fd);
    alog.fd = -1;
    if (alog.wake_fd >= 0)
        close(alog.wake_fd);
    alog.wake_fd = -1;
    free(alog.path);
    alog.path = NULL;
}

/* Call before the workers start logging. On failure nothing stays open. */
int sl_accesslog_open(const char *target, enum sl_accesslog_format fmt, unsigned nworkers,
                      char *err, size_t errlen)
{
    if (!target || strcmp(target, "off") == 0)
        return 0;
    if (alog.rings) {
        set_err(err, errlen, "access log %s: already open", target);
        return -1;
    }
    if (nworkers == 0 || nworkers > SL_MAX_WORKERS) {
        set_err(err, errlen, "access log %s: %u workers, expected 1..%d", target, nworkers,
                SL_MAX_WORKERS);
        return -1;
    }
    if (fmt != SL_ACCESSLOG_JSON && fmt != SL_ACCESSLOG_COMBINED) {
        set_err(err, errlen, "access log %s: unknown format", target);
        return -1;
    }
    if (target[0] == '\0') {
        set_err(err, errlen, "access log: empty target; use a file path, \"stdout\" or \"off\"");
        return -1;
    }

    alog.fmt = fmt;
    alog.nworkers = nworkers;
    alog.rings = calloc(nworkers, sizeof(*alog.rings));
    if (!alog.rings)
        goto fail_oom;
    for (unsigned i = 0; i < nworkers; i++) {
        alog.rings[i].buf = malloc(RING_BYTES);
        alog.rings[i].line = malloc(LINE_MAX_BYTES);
        if (!alog.rings[i].buf || !alog.rings[i].line)
            goto fail_oom;
    }
    alog.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (alog.wake_fd < 0) {
        set_err(err, errlen, "access log %s: eventfd: %s", target, strerror(errno));
        goto fail;
    }
    if (strcmp(target, "stdout") == 0) {
        alog.fd = STDOUT_FILENO;
    } else {
        alog.path = strdup(target);
        if (!alog.path)
            goto fail_oom;
        alog.fd = open(target, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
        if (alog.fd < 0) {
            set_err(err, errlen,
                    "access log %s: %s (check the path and its directory's permissions)", target,
                    strerror(errno));
            goto fail;
        }
    }
    atomic_store(&alog.stopping, 0);
    atomic_store(&alog.reopen_requested, 0);
    alog.reopen_done = 0;
    alog.last_write_errno = 0;
    /* The writer runs with every signal blocked: signals belong to the main
     * thread's event loop, and a write to a closed pipe must come back as
     * EPIPE (counted, logged) rather than kill the process with SIGPIPE. */
    sigset_t all, saved;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &saved);
    int rc = pthread_create(&alog.writer, NULL, writer_main, NULL);
    pthread_sigmask(SIG_SETMASK, &saved, NULL);
    if (rc != 0) {
        set_err(err, errlen, "access log %s: cannot start the writer thread: %s", target,
                strerror(rc));
        goto fail;
    }
    atomic_store_explicit(&alog.enabled, 1, memory_order_release);
    return 0;

fail_oom:
    set_err(err, errlen, "access log %s: out of memory", target);
fail:
    free_state();
    return -1;
}

/* Blocks the caller (the main thread) until the writer has drained what was
 * logged so far to the old file and opened the new one, or REOPEN_WAIT_MS
 * passed (a writer stuck on a hung disk must not freeze the main thread).
 * Not async-signal-safe: call it from a libevent signal event. */
void sl_accesslog_reopen(void)
{
    if (!atomic_load(&alog.enabled) || !alog.path)
        return;
    uint64_t seq = atomic_fetch_add(&alog.reopen_requested, 1) + 1;
    wake_writer();
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += REOPEN_WAIT_MS / 1000;
    deadline.tv_nsec += (REOPEN_WAIT_MS % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&alog.reopen_lock);
    while (alog.reopen_done < seq) {
        if (pthread_cond_timedwait(&alog.reopen_cond, &alog.reopen_lock, &deadline) == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&alog.reopen_lock);
}

/* Call after the workers stopped logging: everything in the rings is written
 * (this waits for the disk or the stdout reader, as a shutdown should),
 * then the writer is joined and all resources freed. The dropped count is
 * kept: it is a Prometheus counter and must not go back. */
void sl_accesslog_close(void)
{
    if (!alog.rings)
        return;
    atomic_store_explicit(&alog.enabled, 0, memory_order_release);
    atomic_store_explicit(&alog.stopping, 1, memory_order_release);
    wake_writer();
    pthread_join(alog.writer, NULL);
    uint64_t dropped = sl_accesslog_dropped();
    free_state();
    atomic_store(&alog.write_lost_lines, dropped);
    atomic_store(&alog.bad_worker_drops, 0);
}
