/*
 * The traffic log pipeline (tlog.h): the workers' rings, the record's wire
 * form in them, the JSON and combined formats, the logger thread, the sink
 * set and each sink's thread.
 *
 * Threading and ordering: ring i has one producer, worker i, and one
 * consumer, the logger thread. The producer publishes whole records only
 * (release store of `head` after the copy), so the logger never sees half a
 * record, and the records of one worker reach a sink in the order they
 * were logged. A full ring drops the record and counts it in the ring's
 * own counter (single writer, relaxed). The sink list is the logger's: it
 * alone adds and removes sinks, under set_lock, which the main thread takes
 * to read it (/metrics, SIGUSR1); a worker never takes any lock.
 *
 * Not here: the file and network sinks' I/O (tlog_file.c, tlog_net.c).
 */
#include "tlog.h"
#include "tlog_body.h"
#include "tlog_sink.h"
#include "fmt.h"
#include "utf8.h"

#include "log.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define RING_BYTES (1u << 20) /* per worker; a power of two */
#define DRAIN_INTERVAL_MS 50
#define REOPEN_WAIT_MS 2000

/* Input bytes kept per string before escaping (the worker clips, so a
 * record in a ring is bounded): escaping grows a byte to at most 6. */
#define FIELD_MAX_PATH 4096
#define FIELD_MAX_LONG 1024
#define FIELD_MAX_SHORT 256
#define RECORD_MAX_BYTES (64 * 1024)
/* The formatted JSON of one record: every string at its bound, escaped
 * (format_json's json_bound). */
#define ORIGIN_MAX 256
#define KEY_COPY 40
#define JSON_FIXED_BYTES (SL_TLOG_F__COUNT * (KEY_COPY + 48) + 3 * 6 * ORIGIN_MAX + 2 * 16 + 256)
#define JSON_MAX_BYTES                                                                             \
    (6 * (RECORD_MAX_BYTES + 2 * SL_TLOG_MAX_HEADER_MAX_BYTES) + JSON_FIXED_BYTES)

/* A counter with one writer: a plain load and store, no locked add. */
#define SL_TLOG_STAT_ADD(field, n)                                                                 \
    atomic_store_explicit(&(field), atomic_load_explicit(&(field), memory_order_relaxed) + (n),    \
                          memory_order_relaxed)

int sl_tlog_active_flag;

const sl_tlog_policy_t sl_tlog_policy_default = {
    .enabled = 1,
    .sample_ppm = 1000000,
    .fields = SL_TLOG_FIELDS_DEFAULT,
    .header_max_bytes = SL_TLOG_DEF_HEADER_MAX_BYTES,
    .body_max_bytes = SL_TLOG_DEF_BODY_MAX_BYTES,
    .body_types = (char *const *)sl_tlog_default_body_types,
    .num_body_types = 4,
};

static const uint32_t str_max[SL_TLOG_S__COUNT] = {
    [SL_TLOG_S_REQUEST_ID] = FIELD_MAX_SHORT,
    [SL_TLOG_S_API] = FIELD_MAX_SHORT,
    [SL_TLOG_S_OPERATION] = FIELD_MAX_SHORT,
    [SL_TLOG_S_CONSUMER] = FIELD_MAX_SHORT,
    [SL_TLOG_S_CLIENT] = FIELD_MAX_SHORT,
    [SL_TLOG_S_METHOD] = FIELD_MAX_SHORT,
    [SL_TLOG_S_HOST] = FIELD_MAX_SHORT,
    [SL_TLOG_S_PATH] = FIELD_MAX_PATH,
    [SL_TLOG_S_QUERY] = FIELD_MAX_PATH,
    [SL_TLOG_S_UPSTREAM] = FIELD_MAX_SHORT,
    [SL_TLOG_S_ERROR] = FIELD_MAX_SHORT,
    [SL_TLOG_S_POLICY] = FIELD_MAX_SHORT,
    [SL_TLOG_S_POLICY_REASON] = FIELD_MAX_LONG,
    [SL_TLOG_S_CACHE] = FIELD_MAX_SHORT,
    [SL_TLOG_S_USER_AGENT] = FIELD_MAX_LONG,
    [SL_TLOG_S_REFERER] = FIELD_MAX_LONG,
    [SL_TLOG_S_REQUEST_HEADERS] = SL_TLOG_MAX_HEADER_MAX_BYTES + 64,
    [SL_TLOG_S_RESPONSE_HEADERS] = SL_TLOG_MAX_HEADER_MAX_BYTES + 64,
    [SL_TLOG_S_TRACE_ID] = 32,
    [SL_TLOG_S_SPAN_ID] = 16,
    [SL_TLOG_S_PARENT_ID] = 16,
    [SL_TLOG_S_UPSTREAM_SPAN_ID] = 16,
    [SL_TLOG_S_REQUEST_BODY_META] = SL_TLOG_BODY_META_MAX,
    [SL_TLOG_S_REQUEST_BODY] = SL_TLOG_BODY_REDACTED_MAX(SL_TLOG_MAX_BODY_MAX_BYTES),
    [SL_TLOG_S_RESPONSE_BODY_META] = SL_TLOG_BODY_META_MAX,
    [SL_TLOG_S_RESPONSE_BODY] = SL_TLOG_BODY_REDACTED_MAX(SL_TLOG_MAX_BODY_MAX_BYTES),
};

/* The record in a ring: this head, then the strings' bytes in order. */
typedef struct {
    uint32_t len;  /* head + strings */
    uint32_t kind; /* 0, or WIRE_PAD */
    uint64_t fields;
    uint64_t start_unix_us, duration_us, upstream_us, bytes_received, bytes_sent;
    int32_t status;
    int16_t minor_version;
    uint8_t upstream_timed;
    uint8_t dest;
    uint8_t nstr; /* strings that follow: a record without bodies has no body strings */
    uint32_t retries;
    uint32_t upstream_off_us;
    uint32_t slen[SL_TLOG_S__COUNT];
} wire_head_t;

/* A record never wraps around the ring's end: one that would not fit before
 * it is preceded by a pad (a head with kind == WIRE_PAD and len the bytes
 * to the end), so the logger reads every record in place. Records are
 * 8-byte aligned. */
#define WIRE_PAD UINT32_MAX
/* The logger's chunk (drain_rings). */
#define CHUNK_RECORDS 256
#define CHUNK_BYTES (256 * 1024)
#define WIRE_ALIGN(n) (((n) + 7) & ~(size_t)7)

typedef struct {
    _Atomic size_t head __attribute__((aligned(64))); /* bytes published, producer-owned */
    _Atomic uint64_t dropped;                         /* records dropped, producer-owned */
    size_t tail_seen; /* producer: tail as last read (room is at least that) */
    int woke;         /* producer: woke the logger since the ring was last below half */
    _Atomic size_t tail __attribute__((aligned(64))); /* bytes consumed, logger-owned */
    char *buf __attribute__((aligned(64)));
} ring_t;

typedef struct pending_cfg {
    sl_tlog_sink_config_t *sinks;
    size_t n;
    sl_tlog_origin_t origin;
    char *strings[3];
} pending_cfg_t;

static struct {
    unsigned nworkers;
    ring_t *rings;
    int wake_fd;
    pthread_t logger;
    int logger_started;
    atomic_int stopping;

    pthread_mutex_t set_lock; /* sinks list; pending config */
    sl_tlog_sink_t *sinks;
    sl_tlog_sink_t *retiring; /* removed, finishing their last delivery */
    pending_cfg_t *pending;
    sl_tlog_origin_t origin; /* logger thread; strings in origin_strings */
    char *origin_strings[3];

    _Atomic uint64_t reopen_requested;
    uint64_t reopen_forwarded; /* under reopen_lock */
    pthread_mutex_t reopen_lock;
    pthread_cond_t reopen_cond;

    uint64_t ring_drops_seen; /* logger: ring drops already charged to the sinks */
    _Atomic uint64_t bad_worker_drops;
    sl_tlog_view_t chunk[CHUNK_RECORDS]; /* logger: records decoded in place */
    size_t line_off[CHUNK_RECORDS + 1];  /* their JSON lines in `lines` */
    unsigned chunk_n;
    unsigned chunk_dest; /* logger: the SL_TLOG_TO_* bits every record of the chunk has */
    sl_tlog_buf_t lines;
    int need_json;      /* logger: some sink takes JSON */
    size_t max_no_body; /* the most bytes a record without bodies takes in a ring */
} tl = {
    .wake_fd = -1,
    .chunk_dest = SL_TLOG_TO_LOG | SL_TLOG_TO_TRACE,
    .set_lock = PTHREAD_MUTEX_INITIALIZER,
    .reopen_lock = PTHREAD_MUTEX_INITIALIZER,
    .reopen_cond = PTHREAD_COND_INITIALIZER,
};

uint64_t sl_tlog_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Room for n more bytes. */
static int buf_reserve(sl_tlog_buf_t *b, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d)
            return -1;
        b->data = d;
        b->cap = cap;
    }
    return 0;
}

int sl_tlog_buf_add(sl_tlog_buf_t *b, const void *p, size_t n)
{
    if (buf_reserve(b, n) != 0)
        return -1;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

void sl_tlog_buf_free(sl_tlog_buf_t *b)
{
    free(b->data);
    *b = (sl_tlog_buf_t){0};
}

/* ---- formatting --------------------------------------------------------- */

typedef struct {
    char *p;
    char *end;
} out_t;

static inline void put(out_t *o, const char *s, size_t n)
{
    if (n == 0)
        return; /* s may be NULL: an unset string */
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
    put(o, tmp, sl_fmt_u64(tmp, v));
}

static void put_2d(out_t *o, unsigned v)
{
    put_c(o, (char)('0' + v / 10 % 10));
    put_c(o, (char)('0' + v % 10));
}

static const char hex_digits[] = "0123456789abcdef";

/* A JSON string body: quote, backslash and control characters escaped;
 * valid UTF-8 copied; each byte that is not part of valid UTF-8 written as
 * \u00XX (its Latin-1 reading), so the record is valid JSON whatever bytes
 * a client sent and the byte value stays visible. */
static inline int json_plain(unsigned char c)
{
    return c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
}

static void put_json_str(out_t *o, const char *ptr, size_t len)
{
    const unsigned char *p = (const unsigned char *)ptr;
    size_t i = 0;
    /* The common case: nothing to escape, one copy. */
    while (i < len && json_plain(p[i]))
        i++;
    if (i == len) {
        put(o, ptr, len);
        return;
    }
    put(o, ptr, i);
    while (i < len) {
        unsigned char c = p[i];
        if (json_plain(c)) {
            size_t run = i;
            while (run < len && json_plain(p[run]))
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
        size_t n = c >= 0x80 ? sl_utf8_valid_len(p + i, len - i) : 0;
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
static void put_combined_str(out_t *o, sl_str_t s)
{
    const unsigned char *p = (const unsigned char *)s.ptr;
    if (s.len == 0 || !p) {
        put_c(o, '-');
        return;
    }
    for (size_t i = 0; i < s.len; i++) {
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

/* UTC calendar time without gmtime_r (glibc's takes a process-wide lock).
 * Days-to-civil after Howard Hinnant's public-domain date algorithms. */
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

/* ---- the JSON record, fast path --------------------------------------------
 *
 * format_json writes without a bounds check per byte: it first checks that
 * the buffer holds the record's bound (json_bound: every string escaped at
 * six bytes per byte, plus JSON_FIXED_BYTES for the keys, numbers and the
 * origin strings, each clipped to ORIGIN_MAX), then writes straight ahead.
 * Copies of a known small size (a key, a number's digits) are fixed-size
 * memcpys the compiler turns into a few moves, writing past the end of
 * what they mean (never past the bound): the next write overwrites it. */

/* ",\"name\":" for every field (and the opening quote of a string value),
 * made once: a key is one fixed-size copy. */
static struct {
    char text[KEY_COPY + 8];
    uint8_t len;
} keys[SL_TLOG_F__COUNT];
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;

static int field_is_number(unsigned f)
{
    switch ((enum sl_tlog_field)f) {
    case SL_TLOG_F_STATUS:
    case SL_TLOG_F_BYTES_RECEIVED:
    case SL_TLOG_F_BYTES_SENT:
    case SL_TLOG_F_DURATION_MS:
    case SL_TLOG_F_UPSTREAM_MS:
    case SL_TLOG_F_GATEWAY_MS:
    case SL_TLOG_F_RETRIES:
    case SL_TLOG_F_REQUEST_HEADERS: /* an object: no quote either */
    case SL_TLOG_F_RESPONSE_HEADERS:
    case SL_TLOG_F_REQUEST_BODY:
    case SL_TLOG_F_RESPONSE_BODY:
        return 1;
    default:
        return 0;
    }
}

static void make_keys(void)
{
    for (unsigned i = 0; i < SL_TLOG_F__COUNT; i++) {
        int n = snprintf(keys[i].text, sizeof(keys[i].text), ",\"%s\":%s", sl_tlog_field_names[i],
                         field_is_number(i) ? "" : "\"");
        keys[i].len = (uint8_t)(n > 0 && n <= KEY_COPY ? n : 0);
    }
}

static inline char *j_key(char *o, int *first, unsigned f)
{
    /* The first key goes without its comma. */
    memcpy(o, keys[f].text + *first, KEY_COPY);
    o += keys[f].len - (size_t)*first;
    *first = 0;
    return o;
}

/* Whether any of 8 bytes needs escaping in a JSON string: below 0x20,
 * 0x80 and above (checked for valid UTF-8 byte by byte), '"' or '\\'. Exact
 * for the word as a whole (the borrows only ever spill above a byte that
 * matched). */
static inline uint64_t json_word_special(uint64_t w)
{
    const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
    uint64_t q = w ^ (ones * '"'), b = w ^ (ones * '\\');
    uint64_t below = (w - ones * 0x20) & ~w;
    return (below | ((q - ones) & ~q) | ((b - ones) & ~b) | w) & high;
}

/* A JSON string body (see put_json_str for what is escaped and how); the
 * caller made room for 6 bytes per input byte plus 8. */
static char *j_str(char *o, const char *ptr, size_t len)
{
    const unsigned char *p = (const unsigned char *)ptr;
    size_t i = 0;
    while (i < len) {
        if (len - i >= 8) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (!json_word_special(w)) {
                memcpy(o, &w, 8);
                o += 8;
                i += 8;
                continue;
            }
        }
        unsigned char c = p[i];
        if (json_plain(c)) {
            *o++ = (char)c;
            i++;
            continue;
        }
        char e = 0;
        switch (c) {
        case '"':
            e = '"';
            break;
        case '\\':
            e = '\\';
            break;
        case '\n':
            e = 'n';
            break;
        case '\r':
            e = 'r';
            break;
        case '\t':
            e = 't';
            break;
        default:
            break;
        }
        if (e) {
            o[0] = '\\';
            o[1] = e;
            o += 2;
            i++;
            continue;
        }
        size_t n = c >= 0x80 ? sl_utf8_valid_len(p + i, len - i) : 0;
        if (n) {
            memcpy(o, p + i, n);
            o += n;
            i += n;
            continue;
        }
        char esc[6] = {'\\', 'u', '0', '0', hex_digits[c >> 4], hex_digits[c & 15]};
        memcpy(o, esc, sizeof(esc));
        o += 6;
        i++;
    }
    return o;
}

/* j_str for a string with 7 readable bytes after it (strings in a ring,
 * which has that slack at its end): its last 1-7 bytes are one word too,
 * the bytes past the end masked to 'a' before the test and the copy (the
 * caller made room for 8 more bytes), so a short string costs one word
 * test instead of a test per byte. */
static char *j_str_padded(char *o, const char *ptr, size_t len)
{
    size_t whole = len & ~(size_t)7, rem = len & 7;
    uint64_t w = 0;
    if (rem) {
        const uint64_t keep = (1ULL << (rem * 8)) - 1; /* little-endian: the first bytes */
        memcpy(&w, ptr + whole, 8);
        w = (w & keep) | (~keep & 0x6161616161616161ULL);
        if (json_word_special(w))
            return j_str(o, ptr, len);
    }
    for (size_t i = 0; i < whole; i += 8) {
        uint64_t x;
        memcpy(&x, ptr + i, 8);
        if (json_word_special(x))
            return j_str(o, ptr, len);
        memcpy(o + i, &x, 8);
    }
    memcpy(o + whole, &w, 8);
    return o + len;
}

static const char digit_pairs[201] = "00010203040506070809101112131415161718192021222324"
                                     "25262728293031323334353637383940414243444546474849"
                                     "50515253545556575859606162636465666768697071727374"
                                     "75767778798081828384858687888990919293949596979899";

/* Decimal digits of v; writes up to 24 bytes, returns the end of the number. */
static inline char *j_u64(char *o, uint64_t v)
{
    char tmp[48];
    char *t = tmp + 24;
    while (v >= 100) {
        t -= 2;
        memcpy(t, digit_pairs + 2 * (v % 100), 2);
        v /= 100;
    }
    if (v >= 10) {
        t -= 2;
        memcpy(t, digit_pairs + 2 * v, 2);
    } else {
        *--t = (char)('0' + v);
    }
    memcpy(o, t, 24);
    return o + (tmp + 24 - t);
}

/* Milliseconds with three decimals, from microseconds. */
static inline char *j_ms(char *o, uint64_t us)
{
    o = j_u64(o, us / 1000);
    unsigned frac = (unsigned)(us % 1000);
    o[0] = '.';
    o[1] = (char)('0' + frac / 100);
    memcpy(o + 2, digit_pairs + 2 * (frac % 100), 2);
    return o + 4;
}

static inline char *j_cstr(char *o, const char *s)
{
    if (!s)
        return o;
    size_t n = strnlen(s, ORIGIN_MAX);
    return j_str(o, s, n);
}

/* The strings a record carries: the body strings (the last ones) only
 * when it holds a body, so a record without pays no loop for them. */
static inline unsigned record_nstr(const sl_tlog_record_t *e)
{
    return sl_unlikely(e->fields &
                       (SL_TLOG_BIT(SL_TLOG_F_REQUEST_BODY) | SL_TLOG_BIT(SL_TLOG_F_RESPONSE_BODY)))
               ? SL_TLOG_S__COUNT
               : SL_TLOG_S_REQUEST_BODY_META;
}
_Static_assert(SL_TLOG_S_REQUEST_BODY_META + 4 == SL_TLOG_S__COUNT, "the body strings are last");

/* The most bytes format_json writes for v. */
static size_t json_bound(const sl_tlog_record_t *e)
{
    size_t n = JSON_FIXED_BYTES;
    for (unsigned i = 0, ns = record_nstr(e); i < ns; i++)
        n += 6 * e->str[i].len;
    return n;
}

/* The "YYYY-MM-DDTHH:MM:SS" of a second, cached: records come in time order. */
static __thread struct {
    uint64_t sec;
    char text[24];
} time_cache = {UINT64_MAX, ""};

static char *j_time(char *o, uint64_t unix_us)
{
    uint64_t sec = unix_us / 1000000;
    if (sec != time_cache.sec) {
        civil_time_t t;
        civil_from_unix_us(unix_us, &t);
        out_t w = {time_cache.text, time_cache.text + sizeof(time_cache.text)};
        put_u64(&w, t.year);
        put_c(&w, '-');
        put_2d(&w, t.month);
        put_c(&w, '-');
        put_2d(&w, t.day);
        put_c(&w, 'T');
        put_2d(&w, t.hour);
        put_c(&w, ':');
        put_2d(&w, t.min);
        put_c(&w, ':');
        put_2d(&w, t.sec);
        if (w.p - time_cache.text != 19)
            return o; /* a year past 9999: not cached, not written */
        time_cache.sec = sec;
    }
    memcpy(o, time_cache.text, 19);
    unsigned ms = (unsigned)(unix_us % 1000000 / 1000);
    o[19] = '.';
    o[20] = (char)('0' + ms / 100);
    memcpy(o + 21, digit_pairs + 2 * (ms % 100), 2);
    o[23] = 'Z';
    o[24] = '"';
    return o + 25;
}

/* The record as one JSON object, no newline; the keys in field order, only
 * the record's fields. 0 if cap is below the record's bound. */
static size_t format_json(char *buf, size_t cap, const sl_tlog_view_t *v)
{
    const sl_tlog_record_t *e = &v->rec;
    if (cap < json_bound(e))
        return 0;
    char *o = buf;
    int first = 1;
    uint64_t f = e->fields;
    pthread_once(&keys_once, make_keys);
    *o++ = '{';
    while (f) {
        unsigned i = (unsigned)__builtin_ctzll(f);
        f &= f - 1;
        int sidx = -1;
        switch ((enum sl_tlog_field)i) {
        case SL_TLOG_F_TIME:
            o = j_key(o, &first, i);
            o = j_time(o, e->start_unix_us);
            continue;
        case SL_TLOG_F_GATEWAY:
            o = j_key(o, &first, i);
            o = j_cstr(o, v->origin ? v->origin->gateway : NULL);
            *o++ = '"';
            continue;
        case SL_TLOG_F_FLEET:
            o = j_key(o, &first, i);
            o = j_cstr(o, v->origin ? v->origin->fleet : NULL);
            *o++ = '"';
            continue;
        case SL_TLOG_F_RUNTIME:
            o = j_key(o, &first, i);
            o = j_cstr(o, v->origin ? v->origin->runtime : NULL);
            *o++ = '"';
            continue;
        case SL_TLOG_F_PROTOCOL:
            o = j_key(o, &first, i);
            if (e->minor_version < 0) {
                memcpy(o, "HTTP/2.0\"", 9);
            } else {
                memcpy(o, "HTTP/1.x\"", 9);
                o[7] = e->minor_version <= 9 ? (char)('0' + e->minor_version) : '1';
            }
            o += 9;
            continue;
        case SL_TLOG_F_STATUS:
            o = j_key(o, &first, i);
            o = j_u64(o, e->status > 0 ? (uint64_t)e->status : 0);
            continue;
        case SL_TLOG_F_BYTES_RECEIVED:
            o = j_key(o, &first, i);
            o = j_u64(o, e->bytes_received);
            continue;
        case SL_TLOG_F_BYTES_SENT:
            o = j_key(o, &first, i);
            o = j_u64(o, e->bytes_sent);
            continue;
        case SL_TLOG_F_DURATION_MS:
            o = j_key(o, &first, i);
            o = j_ms(o, e->duration_us);
            continue;
        case SL_TLOG_F_UPSTREAM_MS:
            /* Absent when no upstream answered (an error of the gateway's
             * own, a policy's reply, a cache hit). */
            if (e->upstream_timed) {
                o = j_key(o, &first, i);
                o = j_ms(o, e->upstream_us);
            }
            continue;
        case SL_TLOG_F_GATEWAY_MS:
            o = j_key(o, &first, i);
            o = j_ms(o, e->upstream_timed && e->upstream_us <= e->duration_us
                            ? e->duration_us - e->upstream_us
                            : e->duration_us);
            continue;
        case SL_TLOG_F_RETRIES:
            o = j_key(o, &first, i);
            o = j_u64(o, e->retries);
            continue;
        case SL_TLOG_F_REQUEST_HEADERS:
        case SL_TLOG_F_RESPONSE_HEADERS: {
            sl_str_t h = e->str[i == SL_TLOG_F_REQUEST_HEADERS ? SL_TLOG_S_REQUEST_HEADERS
                                                               : SL_TLOG_S_RESPONSE_HEADERS];
            o = j_key(o, &first, i);
            /* Already a JSON object (sl_tlog_headers_json); {} when none. */
            if (h.len >= 2 && h.ptr[0] == '{' && h.ptr[h.len - 1] == '}') {
                memcpy(o, h.ptr, h.len);
                o += h.len;
            } else {
                memcpy(o, "{}", 2);
                o += 2;
            }
            continue;
        }
        case SL_TLOG_F_REQUEST_BODY:
        case SL_TLOG_F_RESPONSE_BODY: {
            int req = i == SL_TLOG_F_REQUEST_BODY;
            sl_str_t meta =
                e->str[req ? SL_TLOG_S_REQUEST_BODY_META : SL_TLOG_S_RESPONSE_BODY_META];
            sl_str_t text = e->str[req ? SL_TLOG_S_REQUEST_BODY : SL_TLOG_S_RESPONSE_BODY];
            /* Absent for a request without a body (or none captured). */
            if (!meta.len)
                continue;
            o = j_key(o, &first, i);
            *o++ = '{';
            memcpy(o, meta.ptr, meta.len);
            o += meta.len;
            if (text.len) {
                memcpy(o, ",\"text\":\"", 9);
                o += 9;
                o = j_str(o, text.ptr, text.len);
                *o++ = '"';
            }
            *o++ = '}';
            continue;
        }
        case SL_TLOG_F_REQUEST_ID:
            sidx = SL_TLOG_S_REQUEST_ID;
            break;
        case SL_TLOG_F_API:
            sidx = SL_TLOG_S_API;
            break;
        case SL_TLOG_F_OPERATION:
            sidx = SL_TLOG_S_OPERATION;
            break;
        case SL_TLOG_F_CONSUMER:
            sidx = SL_TLOG_S_CONSUMER;
            break;
        case SL_TLOG_F_CLIENT:
            sidx = SL_TLOG_S_CLIENT;
            break;
        case SL_TLOG_F_METHOD:
            sidx = SL_TLOG_S_METHOD;
            break;
        case SL_TLOG_F_HOST:
            sidx = SL_TLOG_S_HOST;
            break;
        case SL_TLOG_F_PATH:
            sidx = SL_TLOG_S_PATH;
            break;
        case SL_TLOG_F_QUERY:
            sidx = SL_TLOG_S_QUERY;
            break;
        case SL_TLOG_F_UPSTREAM:
            sidx = SL_TLOG_S_UPSTREAM;
            break;
        case SL_TLOG_F_ERROR:
            sidx = SL_TLOG_S_ERROR;
            break;
        case SL_TLOG_F_POLICY:
            sidx = SL_TLOG_S_POLICY;
            break;
        case SL_TLOG_F_POLICY_REASON:
            sidx = SL_TLOG_S_POLICY_REASON;
            break;
        case SL_TLOG_F_CACHE:
            sidx = SL_TLOG_S_CACHE;
            break;
        case SL_TLOG_F_USER_AGENT:
            sidx = SL_TLOG_S_USER_AGENT;
            break;
        case SL_TLOG_F_REFERER:
            sidx = SL_TLOG_S_REFERER;
            break;
        case SL_TLOG_F_TRACE_ID:
            sidx = SL_TLOG_S_TRACE_ID;
            break;
        case SL_TLOG_F_SPAN_ID:
            sidx = SL_TLOG_S_SPAN_ID;
            break;
        case SL_TLOG_F__COUNT:
            continue;
        }
        o = j_key(o, &first, i);
        o = v->padded ? j_str_padded(o, e->str[sidx].ptr, e->str[sidx].len)
                      : j_str(o, e->str[sidx].ptr, e->str[sidx].len);
        *o++ = '"';
    }
    *o++ = '}';
    return (size_t)(o - buf);
}

/* ---- spans: OTLP/JSON (opentelemetry-proto, JSON encoding) ------------------ */

/* Copies a string that needs no escaping (a literal, an attribute key). */
static inline char *j_raw(char *o, const char *lit)
{
    size_t n = strlen(lit);
    memcpy(o, lit, n);
    return o + n;
}
#define j_lit(o, lit) (memcpy((o), (lit), sizeof(lit) - 1), (o) + sizeof(lit) - 1)

/* `{"key":"<k>","value":{"stringValue":"<v>"}},` (nothing when v is empty). */
static char *span_attr_str(char *o, const char *k, sl_str_t v)
{
    if (!v.len)
        return o;
    o = j_lit(o, "{\"key\":\"");
    o = j_raw(o, k);
    o = j_lit(o, "\",\"value\":{\"stringValue\":\"");
    o = j_str(o, v.ptr, v.len);
    return j_lit(o, "\"}},");
}

/* intValue is a string in OTLP/JSON (a 64-bit integer). */
static char *span_attr_int(char *o, const char *k, uint64_t v)
{
    o = j_lit(o, "{\"key\":\"");
    o = j_raw(o, k);
    o = j_lit(o, "\",\"value\":{\"intValue\":\"");
    o = j_u64(o, v);
    return j_lit(o, "\"}},");
}

static char *span_head(char *o, sl_str_t trace, sl_str_t span, sl_str_t parent, int kind,
                       uint64_t start_ns, uint64_t end_ns)
{
    o = j_lit(o, "{\"traceId\":\"");
    o = j_str(o, trace.ptr, trace.len);
    o = j_lit(o, "\",\"spanId\":\"");
    o = j_str(o, span.ptr, span.len);
    if (parent.len) {
        o = j_lit(o, "\",\"parentSpanId\":\"");
        o = j_str(o, parent.ptr, parent.len);
    }
    o = j_lit(o, "\",\"kind\":");
    *o++ = (char)('0' + kind);
    o = j_lit(o, ",\"startTimeUnixNano\":\"");
    o = j_u64(o, start_ns);
    o = j_lit(o, "\",\"endTimeUnixNano\":\"");
    o = j_u64(o, end_ns);
    return j_lit(o, "\",");
}

/* The attributes array's end: the last element's comma becomes ']'. */
static char *span_attrs_end(char *o, char *attrs_start)
{
    if (o[-1] == ',' && o != attrs_start)
        o[-1] = ']';
    else
        *o++ = ']';
    return o;
}

int sl_tlog_format_spans(const sl_tlog_view_t *v, sl_tlog_buf_t *outb)
{
    const sl_tlog_record_t *e = &v->rec;
    const sl_str_t *s = e->str;
    if (s[SL_TLOG_S_TRACE_ID].len != 32 || s[SL_TLOG_S_SPAN_ID].len != 16)
        return 0; /* not a traced request: no span */
    size_t bound = 2048;
    for (unsigned i = 0; i < SL_TLOG_S__COUNT; i++)
        if (i != SL_TLOG_S_REQUEST_HEADERS && i != SL_TLOG_S_RESPONSE_HEADERS &&
            i < SL_TLOG_S_REQUEST_BODY_META)
            bound += 12 * s[i].len; /* each string may be written twice */
    if (buf_reserve(outb, bound) != 0)
        return -1;
    char *o = outb->data + outb->len;
    uint64_t start_ns = e->start_unix_us * 1000,
             end_ns = (e->start_unix_us + e->duration_us) * 1000;

    /* The server span: the request as the gateway saw it. Its name is the
     * method and the operation (semantic conventions: "{method} {route}"). */
    o = span_head(o, s[SL_TLOG_S_TRACE_ID], s[SL_TLOG_S_SPAN_ID], s[SL_TLOG_S_PARENT_ID], 2,
                  start_ns, end_ns);
    o = j_lit(o, "\"name\":\"");
    o = j_str(o, s[SL_TLOG_S_METHOD].ptr, s[SL_TLOG_S_METHOD].len);
    if (s[SL_TLOG_S_OPERATION].len) {
        *o++ = ' ';
        o = j_str(o, s[SL_TLOG_S_OPERATION].ptr, s[SL_TLOG_S_OPERATION].len);
    }
    o = j_lit(o, "\",\"attributes\":[");
    char *attrs = o;
    o = span_attr_str(o, "http.request.method", s[SL_TLOG_S_METHOD]);
    o = span_attr_str(o, "url.path", s[SL_TLOG_S_PATH]);
    o = span_attr_str(o, "url.query", s[SL_TLOG_S_QUERY]);
    o = span_attr_str(o, "server.address", s[SL_TLOG_S_HOST]);
    o = span_attr_str(o, "client.address", s[SL_TLOG_S_CLIENT]);
    o = span_attr_str(o, "user_agent.original", s[SL_TLOG_S_USER_AGENT]);
    o = span_attr_str(o, "network.protocol.version",
                      e->minor_version < 0    ? (sl_str_t){"2", 1}
                      : e->minor_version == 0 ? (sl_str_t){"1.0", 3}
                                              : (sl_str_t){"1.1", 3});
    if (e->status > 0)
        o = span_attr_int(o, "http.response.status_code", (uint64_t)e->status);
    o = span_attr_int(o, "http.request.body.size", e->bytes_received);
    o = span_attr_int(o, "http.response.size", e->bytes_sent);
    o = span_attr_str(o, "sluice.request_id", s[SL_TLOG_S_REQUEST_ID]);
    o = span_attr_str(o, "sluice.api", s[SL_TLOG_S_API]);
    o = span_attr_str(o, "sluice.operation", s[SL_TLOG_S_OPERATION]);
    o = span_attr_str(o, "sluice.consumer", s[SL_TLOG_S_CONSUMER]);
    o = span_attr_str(o, "sluice.policy", s[SL_TLOG_S_POLICY]);
    o = span_attr_str(o, "sluice.cache", s[SL_TLOG_S_CACHE]);
    o = span_attr_str(o, "error.type", s[SL_TLOG_S_ERROR]);
    o = span_attrs_end(o, attrs);
    /* Server spans: a 5xx is an error, a 4xx is the client's (semantic
     * conventions); status left unset otherwise. */
    if (e->status >= 500 || e->status <= 0) {
        o = j_lit(o, ",\"status\":{\"code\":2,\"message\":\"");
        sl_str_t why = s[SL_TLOG_S_ERROR].len ? s[SL_TLOG_S_ERROR] : (sl_str_t){"", 0};
        o = j_str(o, why.ptr, why.len);
        o = j_lit(o, "\"}");
    }
    *o++ = '}';

    /* The client span: the call to the upstream, retries included, from
     * its first attempt to the end of the response. Its id is the parent
     * the upstream was sent in traceparent. */
    if (s[SL_TLOG_S_UPSTREAM_SPAN_ID].len == 16 && s[SL_TLOG_S_UPSTREAM].len) {
        *o++ = ',';
        o = span_head(o, s[SL_TLOG_S_TRACE_ID], s[SL_TLOG_S_UPSTREAM_SPAN_ID], s[SL_TLOG_S_SPAN_ID],
                      3, start_ns + (uint64_t)e->upstream_off_us * 1000, end_ns);
        o = j_lit(o, "\"name\":\"");
        o = j_str(o, s[SL_TLOG_S_METHOD].ptr, s[SL_TLOG_S_METHOD].len);
        o = j_lit(o, "\",\"attributes\":[");
        attrs = o;
        o = span_attr_str(o, "http.request.method", s[SL_TLOG_S_METHOD]);
        o = span_attr_str(o, "server.address", s[SL_TLOG_S_UPSTREAM]);
        if (e->status > 0)
            o = span_attr_int(o, "http.response.status_code", (uint64_t)e->status);
        o = span_attr_int(o, "http.request.resend_count", e->retries);
        o = span_attrs_end(o, attrs);
        if (e->status >= 500 || e->status <= 0)
            o = j_lit(o, ",\"status\":{\"code\":2}");
        *o++ = '}';
    }
    outb->len = (size_t)(o - outb->data);
    return 0;
}

/* nginx:  $remote_addr - $remote_user [$time_local] "$request" $status
 *         $body_bytes_sent "$http_referer" "$http_user_agent"
 * Times are UTC (+0000). The byte count is the whole response including its
 * head (nginx's $bytes_sent), the only count the record carries. */
int sl_tlog_format_combined(const sl_tlog_view_t *v, sl_tlog_buf_t *outb)
{
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                       "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    const sl_tlog_record_t *e = &v->rec;
    char buf[4 * (FIELD_MAX_PATH + FIELD_MAX_SHORT * 4 + FIELD_MAX_LONG * 2) + 256];
    out_t o = {buf, buf + sizeof(buf)};
    civil_time_t t;
    civil_from_unix_us(e->start_unix_us, &t);

    put_combined_str(&o, e->str[SL_TLOG_S_CLIENT]);
    if (e->str[SL_TLOG_S_CONSUMER].len) {
        PUT_LIT(&o, " - ");
        put_combined_str(&o, e->str[SL_TLOG_S_CONSUMER]);
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
    put_combined_str(&o, e->str[SL_TLOG_S_METHOD]);
    put_c(&o, ' ');
    put_combined_str(&o, e->str[SL_TLOG_S_PATH]);
    if (e->str[SL_TLOG_S_QUERY].ptr && e->str[SL_TLOG_S_QUERY].len) {
        put_c(&o, '?');
        put_combined_str(&o, e->str[SL_TLOG_S_QUERY]);
    }
    put_c(&o, ' ');
    put_protocol(&o, e->minor_version);
    PUT_LIT(&o, "\" ");
    put_u64(&o, e->status > 0 ? (uint64_t)e->status : 0);
    put_c(&o, ' ');
    put_u64(&o, e->bytes_sent);
    PUT_LIT(&o, " \"");
    put_combined_str(&o, e->str[SL_TLOG_S_REFERER]);
    PUT_LIT(&o, "\" \"");
    put_combined_str(&o, e->str[SL_TLOG_S_USER_AGENT]);
    PUT_LIT(&o, "\"\n");
    return sl_tlog_buf_add(outb, buf, (size_t)(o.p - buf));
}

/* ---- headers (worker) ----------------------------------------------------- */

static int name_redacted(const sl_tlog_policy_t *p, sl_str_t name)
{
    for (size_t i = 0; i < p->num_redact; i++)
        if (strlen(p->redact[i]) == name.len && strncasecmp(p->redact[i], name.ptr, name.len) == 0)
            return 1;
    if (!p->redact) /* the default policy: the built-in list */
        for (size_t i = 0; sl_tlog_default_redact[i]; i++)
            if (strlen(sl_tlog_default_redact[i]) == name.len &&
                strncasecmp(sl_tlog_default_redact[i], name.ptr, name.len) == 0)
                return 1;
    return 0;
}

static int name_eq(sl_str_t a, sl_str_t b)
{
    return a.len == b.len && strncasecmp(a.ptr, b.ptr, a.len) == 0;
}

#define HEADER_VALUE_MAX 1024

size_t sl_tlog_headers_json(const sl_tlog_policy_t *p, const sl_str_t *names,
                            const sl_str_t *values, size_t n, char *buf, size_t cap)
{
    size_t max = p->header_max_bytes < cap - 32 ? p->header_max_bytes : cap - 32;
    out_t o = {buf, buf + max};
    int truncated = 0;
    put_c(&o, '{');
    for (size_t i = 0; i < n && !truncated; i++) {
        size_t k;
        for (k = 0; k < i; k++)
            if (name_eq(names[k], names[i]))
                break;
        if (k < i)
            continue; /* written with the first of its name */
        char *mark = o.p;
        if (i)
            put_c(&o, ',');
        put_c(&o, '"');
        for (size_t j = 0; j < names[i].len; j++) {
            char ch = names[i].ptr[j];
            ch = (ch >= 'A' && ch <= 'Z') ? (char)(ch | 0x20) : ch;
            put_json_str(&o, &ch, 1);
        }
        PUT_LIT(&o, "\":\"");
        if (name_redacted(p, names[i])) {
            PUT_LIT(&o, "[redacted]");
        } else {
            int more = 0;
            for (size_t j = i; j < n; j++) {
                if (j != i && !name_eq(names[j], names[i]))
                    continue;
                if (more)
                    PUT_LIT(&o, ", ");
                more = 1;
                put_json_str(&o, values[j].ptr,
                             values[j].len < HEADER_VALUE_MAX ? values[j].len : HEADER_VALUE_MAX);
            }
        }
        put_c(&o, '"');
        if (o.p >= o.end) {
            /* This header did not fit: the object ends before it. */
            o.p = mark;
            truncated = 1;
        }
    }
    o.end = buf + cap;
    if (truncated) {
        if (o.p != buf + 1)
            put_c(&o, ',');
        PUT_LIT(&o, "\"_truncated\":true");
    }
    put_c(&o, '}');
    return (size_t)(o.p - buf);
}

/* ---- workers' side -------------------------------------------------------- */

static void wake_logger(void)
{
    uint64_t one = 1;
    /* Never blocks: the counter only fails (EAGAIN) at 2^64-2 pending. */
    ssize_t w = write(tl.wake_fd, &one, sizeof(one));
    (void)w;
}

/* The producer's side of a record: one release store, and past half full
 * a wake-up of the logger, once (it drains every DRAIN_INTERVAL_MS
 * anyway). */
static inline void publish(ring_t *r, size_t new_head)
{
    atomic_store_explicit(&r->head, new_head, memory_order_release);
    if (new_head - r->tail_seen >= RING_BYTES / 2) {
        if (!r->woke) {
            r->tail_seen = atomic_load_explicit(&r->tail, memory_order_acquire);
            if (new_head - r->tail_seen >= RING_BYTES / 2) {
                r->woke = 1;
                wake_logger();
            }
        }
    } else {
        r->woke = 0;
    }
}

void sl_tlog_write(unsigned worker, const sl_tlog_record_t *e)
{
    if (sl_unlikely(worker >= tl.nworkers || !tl.rings)) {
        atomic_fetch_add_explicit(&tl.bad_worker_drops, 1, memory_order_relaxed);
        return;
    }
    ring_t *r = &tl.rings[worker];
    wire_head_t h = {
        .fields = e->fields,
        .start_unix_us = e->start_unix_us,
        .duration_us = e->duration_us,
        .upstream_us = e->upstream_us,
        .bytes_received = e->bytes_received,
        .bytes_sent = e->bytes_sent,
        .status = e->status,
        .minor_version = (int16_t)e->minor_version,
        .upstream_timed = e->upstream_timed,
        .dest = e->dest,
        .retries = e->retries,
        .upstream_off_us = e->upstream_off_us,
    };
    unsigned nstr = record_nstr(e);
    h.nstr = (uint8_t)nstr;
    size_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    size_t off = head & (RING_BYTES - 1);
    /* A record without bodies is at most tl.max_no_body: with that much
     * room known before the ring's end, its strings are measured and
     * copied in one pass and its head written after them. */
    if (sl_likely(nstr == SL_TLOG_S_REQUEST_BODY_META && RING_BYTES - off >= tl.max_no_body &&
                  head + tl.max_no_body - r->tail_seen <= RING_BYTES)) {
        char *dst = r->buf + off + sizeof(h);
        for (unsigned i = 0; i < SL_TLOG_S_REQUEST_BODY_META; i++) {
            size_t n = e->str[i].len < str_max[i] ? e->str[i].len : str_max[i];
            h.slen[i] = (uint32_t)n;
            if (n) {
                memcpy(dst, e->str[i].ptr, n);
                dst += n;
            }
        }
        size_t len = WIRE_ALIGN((size_t)(dst - (r->buf + off)));
        h.len = (uint32_t)len;
        memcpy(r->buf + off, &h, sizeof(h));
        publish(r, head + len);
        return;
    }
    size_t len = sizeof(h);
    for (unsigned i = 0; i < nstr; i++) {
        size_t n = e->str[i].ptr ? e->str[i].len : 0;
        h.slen[i] = (uint32_t)(n < str_max[i] ? n : str_max[i]);
        len += h.slen[i];
    }
    len = WIRE_ALIGN(len);
    h.len = (uint32_t)len;
    size_t pad = RING_BYTES - off < len ? RING_BYTES - off : 0;
    /* The logger's tail is read only when the room known from the last
     * read is not enough: its cache line stays with the logger. */
    if (head + pad + len - r->tail_seen > RING_BYTES) {
        r->tail_seen = atomic_load_explicit(&r->tail, memory_order_acquire);
        if (head + pad + len - r->tail_seen > RING_BYTES) {
            SL_TLOG_STAT_ADD(r->dropped, 1);
            return;
        }
    }
    if (pad) {
        uint32_t marker[2] = {(uint32_t)pad, WIRE_PAD};
        memcpy(r->buf + off, marker, sizeof(marker));
        off = 0;
    }
    char *dst = r->buf + off;
    memcpy(dst, &h, sizeof(h));
    dst += sizeof(h);
    for (unsigned i = 0; i < nstr; i++) {
        if (h.slen[i]) {
            memcpy(dst, e->str[i].ptr, h.slen[i]);
            dst += h.slen[i];
        }
    }
    publish(r, head + pad + len);
}

uint64_t sl_tlog_ring_dropped(void)
{
    uint64_t n = atomic_load_explicit(&tl.bad_worker_drops, memory_order_relaxed);
    for (unsigned i = 0; tl.rings && i < tl.nworkers; i++)
        n += atomic_load_explicit(&tl.rings[i].dropped, memory_order_relaxed);
    return n;
}

uint64_t sl_tlog_ring_bytes(void)
{
    uint64_t n = 0;
    for (unsigned i = 0; tl.rings && i < tl.nworkers; i++)
        n += atomic_load_explicit(&tl.rings[i].head, memory_order_relaxed) -
             atomic_load_explicit(&tl.rings[i].tail, memory_order_relaxed);
    return n;
}

/* ---- sinks ---------------------------------------------------------------- */

void sl_tlog_sink_lost(sl_tlog_sink_t *s, uint64_t n, const char *why)
{
    atomic_fetch_add_explicit(&s->dropped, n, memory_order_relaxed);
    /* Once a minute per sink: one sink's drops never hide another's. */
    uint64_t now = sl_tlog_now_ms(), prev = atomic_load(&s->lost_logged_ms);
    if (why && (prev == 0 || now - prev >= 60000) &&
        atomic_compare_exchange_strong(&s->lost_logged_ms, &prev, now ? now : 1))
        sl_log_error("traffic log sink %s: %llu record(s) dropped: %s (counted in "
                     "sluice_traffic_log_dropped_total; said at most once a minute)",
                     s->cfg.name, (unsigned long long)n, why);
}

int sl_tlog_sink_sleep(sl_tlog_sink_t *s, uint64_t ms)
{
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += (time_t)(ms / 1000);
    dl.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&s->lock);
    while (!s->stopping)
        if (pthread_cond_timedwait(&s->cond, &s->lock, &dl) == ETIMEDOUT)
            break;
    int stop = s->stopping;
    pthread_mutex_unlock(&s->lock);
    return stop;
}

static const sl_tlog_sink_ops_t *ops_of(const char *type)
{
    if (strcmp(type, "file") == 0)
        return &sl_tlog_file_ops;
    if (strcmp(type, "http") == 0)
        return &sl_tlog_http_ops;
    if (strcmp(type, "elasticsearch") == 0)
        return &sl_tlog_es_ops;
    if (strcmp(type, "clickhouse") == 0)
        return &sl_tlog_clickhouse_ops;
    if (strcmp(type, "otlp") == 0)
        return &sl_tlog_otlp_ops;
    return NULL;
}

/* How many whole records the first `bytes` of a queue hold. */
static size_t take_records(const sl_tlog_sink_t *s, size_t max_records, size_t max_bytes,
                           unsigned *nrec)
{
    const char *p = s->queue.data, *end = p + s->queue.len;
    size_t taken = 0;
    unsigned n = 0, lines = 0;
    while (p < end && n < max_records) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl)
            break;
        p = nl + 1;
        if (++lines < s->ops->lines_per_record)
            continue;
        lines = 0;
        size_t upto = (size_t)(p - s->queue.data);
        if (n > 0 && upto > max_bytes)
            break;
        taken = upto;
        n++;
    }
    *nrec = n;
    return taken;
}

/* Each sink's thread: waits for a batch (maxRecords, or maxBytes, or the
 * oldest record maxDelay old), delivers it without the lock, retries with
 * backoff what the sink says to retry. New records keep queueing meanwhile,
 * up to the budget. */
static void *sink_main(void *arg)
{
    sl_tlog_sink_t *s = arg;
    /* Named for top -H and perf/bench.sh's per-thread CPU figures. */
    char tname[16];
    snprintf(tname, sizeof(tname), "sl-sink-%.7s", s->cfg.name);
    pthread_setname_np(pthread_self(), tname);
    sl_tlog_buf_t batch = {0};
    unsigned batch_records = 0;
    uint64_t backoff = s->cfg.backoff_initial_ms ? s->cfg.backoff_initial_ms : 200;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        if (batch_records == 0) {
            /* Wait for work. */
            for (;;) {
                if (s->reopen_req != s->reopen_done && s->queue_records == 0)
                    break;
                if (s->stopping)
                    break;
                if (s->queue_records >= s->cfg.batch_max_records ||
                    s->queue.len >= s->cfg.batch_max_bytes)
                    break;
                uint64_t now = sl_tlog_now_ms();
                if (s->queue_records && (s->reopen_req != s->reopen_done ||
                                         now >= s->first_queued_ms + s->cfg.batch_max_delay_ms))
                    break;
                struct timespec dl;
                clock_gettime(CLOCK_MONOTONIC, &dl);
                uint64_t wait =
                    s->queue_records ? s->first_queued_ms + s->cfg.batch_max_delay_ms - now : 1000;
                dl.tv_sec += (time_t)(wait / 1000);
                dl.tv_nsec += (long)(wait % 1000) * 1000000L;
                if (dl.tv_nsec >= 1000000000L) {
                    dl.tv_sec++;
                    dl.tv_nsec -= 1000000000L;
                }
                pthread_cond_timedwait(&s->cond, &s->lock, &dl);
            }
            if (s->queue_records && s->queue_records <= s->cfg.batch_max_records &&
                s->queue.len <= s->cfg.batch_max_bytes) {
                /* The whole queue is the batch: the buffers trade places,
                 * nothing is copied or scanned. */
                sl_tlog_buf_t t = batch;
                batch = s->queue;
                s->queue = t;
                s->queue.len = 0;
                s->inflight_bytes = batch.len;
                s->inflight_records = s->queue_records;
                batch_records = s->queue_records;
                s->queue_records = 0;
            } else if (s->queue_records) {
                unsigned n = 0;
                size_t bytes =
                    take_records(s, s->cfg.batch_max_records, s->cfg.batch_max_bytes, &n);
                if (bytes && sl_tlog_buf_add(&batch, s->queue.data, bytes) == 0) {
                    memmove(s->queue.data, s->queue.data + bytes, s->queue.len - bytes);
                    s->queue.len -= bytes;
                    s->queue_records -= n;
                    s->inflight_bytes = bytes;
                    s->inflight_records = n;
                    batch_records = n;
                    if (s->queue_records)
                        s->first_queued_ms = sl_tlog_now_ms();
                }
            }
            if (batch_records == 0) {
                if (s->reopen_req != s->reopen_done) {
                    uint64_t want = s->reopen_req;
                    pthread_mutex_unlock(&s->lock);
                    if (s->ops->reopen)
                        s->ops->reopen(s);
                    pthread_mutex_lock(&s->lock);
                    s->reopen_done = want;
                    pthread_cond_broadcast(&s->done_cond);
                    continue;
                }
                if (s->stopping)
                    break;
                continue;
            }
        }
        int stopping = s->stopping;
        pthread_mutex_unlock(&s->lock);
        unsigned n = batch_records;
        enum sl_tlog_deliver_result rc = s->ops->deliver(s, &batch, &n);
        if (rc == SL_TLOG_DELIVERED || n == 0) {
            batch.len = 0;
            batch_records = 0;
            backoff = s->cfg.backoff_initial_ms ? s->cfg.backoff_initial_ms : 200;
        } else {
            batch_records = n;
            atomic_fetch_add_explicit(&s->batches_failed, 1, memory_order_relaxed);
            if (stopping) {
                /* Shutting down or removed: one attempt was the last. */
                sl_tlog_sink_lost(s, batch_records,
                                  "the sink is being stopped and its "
                                  "collector did not take the last batch");
                batch.len = 0;
                batch_records = 0;
            } else {
                sl_tlog_sink_sleep(s, backoff);
                backoff = backoff * 2 > s->cfg.backoff_max_ms ? s->cfg.backoff_max_ms : backoff * 2;
            }
        }
        pthread_mutex_lock(&s->lock);
        s->inflight_bytes = batch_records ? batch.len : 0;
        s->inflight_records = batch_records;
    }
    pthread_mutex_unlock(&s->lock);
    if (s->ops->close)
        s->ops->close(s);
    sl_tlog_buf_free(&batch);
    atomic_store(&s->finished, 1);
    return NULL;
}

static char *xstrdup(const char *s)
{
    return strdup(s ? s : "");
}

static void sink_free(sl_tlog_sink_t *s)
{
    if (!s)
        return;
    const char **strs[] = {&s->cfg.name,    &s->cfg.type,   &s->cfg.path,     &s->cfg.url,
                           &s->cfg.index,   &s->cfg.table,  &s->cfg.username, &s->cfg.password,
                           &s->cfg.api_key, &s->cfg.ca_pem, &s->cfg.ca_file,  &s->cfg.service_name};
    for (size_t i = 0; i < SL_ARRAY_LEN(strs); i++)
        free((char *)*strs[i]);
    free(s->key);
    sl_tlog_buf_free(&s->queue);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    pthread_cond_destroy(&s->done_cond);
    free(s);
}

/* The configuration as one string: equal strings = the same sink. */
static char *config_key(const sl_tlog_sink_config_t *c)
{
    char *k = NULL;
    if (asprintf(&k, "%s|%s|%s|%s|%d|%llu|%u|%s|%s|%s|%s|%s|%s|%u|%u|%u|%llu|%u|%u|%u|%s|%s",
                 c->service_name ? c->service_name : "", c->name, c->type, c->path ? c->path : "",
                 c->combined, (unsigned long long)c->rotate_max_bytes, c->rotate_keep,
                 c->url ? c->url : "", c->index ? c->index : "", c->table ? c->table : "",
                 c->username ? c->username : "", c->password ? c->password : "",
                 c->api_key ? c->api_key : "", c->batch_max_records, c->batch_max_bytes,
                 c->batch_max_delay_ms, (unsigned long long)c->buffer_bytes, c->timeout_ms,
                 c->backoff_initial_ms, c->backoff_max_ms, c->ca_pem ? c->ca_pem : "",
                 c->ca_file ? c->ca_file : "") < 0)
        return NULL;
    return k;
}

static void fill_defaults(sl_tlog_sink_config_t *c)
{
    int file = strcmp(c->type, "file") == 0;
    if (!c->batch_max_records)
        c->batch_max_records = SL_TLOG_DEF_BATCH_RECORDS;
    if (!c->batch_max_bytes)
        c->batch_max_bytes = SL_TLOG_DEF_BATCH_BYTES;
    if (!c->batch_max_delay_ms)
        c->batch_max_delay_ms = file ? SL_TLOG_DEF_FILE_BATCH_DELAY_MS : SL_TLOG_DEF_BATCH_DELAY_MS;
    if (!c->buffer_bytes)
        c->buffer_bytes = SL_TLOG_DEF_BUFFER_BYTES;
    if (!c->timeout_ms)
        c->timeout_ms = SL_TLOG_DEF_TIMEOUT_MS;
    if (!c->backoff_initial_ms)
        c->backoff_initial_ms = SL_TLOG_DEF_BACKOFF_INITIAL_MS;
    if (!c->backoff_max_ms)
        c->backoff_max_ms = SL_TLOG_DEF_BACKOFF_MAX_MS;
    if (c->backoff_max_ms < c->backoff_initial_ms)
        c->backoff_max_ms = c->backoff_initial_ms;
    if (!c->rotate_keep)
        c->rotate_keep = SL_TLOG_DEF_ROTATE_KEEP;
}

static sl_tlog_sink_t *sink_new(const sl_tlog_sink_config_t *in, char *err, size_t errlen)
{
    const sl_tlog_sink_ops_t *ops = in->type ? ops_of(in->type) : NULL;
    if (!ops) {
        snprintf(err, errlen, "traffic log sink %s: unknown type %s", in->name ? in->name : "?",
                 in->type ? in->type : "(none)");
        return NULL;
    }
    sl_tlog_sink_t *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cond, &ca);
    pthread_cond_init(&s->done_cond, &ca);
    pthread_condattr_destroy(&ca);
    s->ops = ops;
    s->cfg = *in;
    s->cfg.name = xstrdup(in->name);
    s->cfg.type = xstrdup(in->type);
    s->cfg.path = xstrdup(in->path);
    s->cfg.url = xstrdup(in->url);
    s->cfg.index = xstrdup(in->index);
    s->cfg.table = xstrdup(in->table);
    s->cfg.username = xstrdup(in->username);
    s->cfg.password = xstrdup(in->password);
    s->cfg.api_key = xstrdup(in->api_key);
    s->cfg.service_name = xstrdup(in->service_name);
    s->cfg.ca_pem = xstrdup(in->ca_pem);
    s->cfg.ca_file = xstrdup(in->ca_file);
    fill_defaults(&s->cfg);
    s->key = config_key(&s->cfg);
    if (!s->cfg.name || !s->cfg.type || !s->cfg.path || !s->cfg.url || !s->cfg.index ||
        !s->cfg.table || !s->cfg.username || !s->cfg.password || !s->cfg.api_key ||
        !s->cfg.ca_pem || !s->cfg.ca_file || !s->cfg.service_name || !s->key) {
        snprintf(err, errlen, "out of memory");
        sink_free(s);
        return NULL;
    }
    int rc = ops == &sl_tlog_file_ops ? sl_tlog_file_open(s, err, errlen)
                                      : sl_tlog_net_open(s, err, errlen);
    if (rc != 0) {
        sink_free(s);
        return NULL;
    }
    return s;
}

static int sink_start(sl_tlog_sink_t *s)
{
    /* Every signal blocked: signals are the main thread's, and a write to
     * a closed pipe or socket must come back as EPIPE, not kill us. */
    sigset_t all, saved;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &saved);
    int rc = pthread_create(&s->thread, NULL, sink_main, s);
    pthread_sigmask(SIG_SETMASK, &saved, NULL);
    if (rc != 0)
        return -1;
    s->thread_started = 1;
    return 0;
}

static void sink_stop(sl_tlog_sink_t *s)
{
    pthread_mutex_lock(&s->lock);
    s->stopping = 1;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

int sl_tlog_sink_check(const sl_tlog_sink_config_t *cfg, char *err, size_t errlen)
{
    sl_tlog_sink_t *s = sink_new(cfg, err, errlen);
    if (!s)
        return -1;
    if (s->ops->close)
        s->ops->close(s);
    sink_free(s);
    return 0;
}

/* ---- logger thread -------------------------------------------------------- */

/* The logger works in chunks of up to CHUNK_RECORDS records: each is
 * decoded in place (its strings point into the ring, which the logger
 * gives back only after the chunk), formatted once as a JSON line into
 * tl.lines, then every sink takes the whole chunk under one lock: a plain
 * JSON file sink as one copy of the lines, the others record by record
 * through their encode op. */

static int is_json_file(const sl_tlog_sink_t *s)
{
    return s->ops == &sl_tlog_file_ops && !s->cfg.combined;
}

/* One sink takes the chunk; returns the records it dropped. */
static uint64_t sink_take_chunk(sl_tlog_sink_t *s, unsigned n, int *oom)
{
    uint64_t lost_budget = 0;
    pthread_mutex_lock(&s->lock);
    unsigned before_records = s->queue_records;
    unsigned want = s->ops->trace ? SL_TLOG_TO_TRACE : SL_TLOG_TO_LOG;
    if (is_json_file(s) && (tl.chunk_dest & want) &&
        s->queue.len + tl.lines.len + s->inflight_bytes <= s->cfg.buffer_bytes) {
        if (s->queue.len == 0 && !s->next) {
            /* An empty queue and no sink after this one: the lines become
             * the queue, nothing is copied. */
            sl_tlog_buf_t t = s->queue;
            s->queue = tl.lines;
            tl.lines = t;
            s->queue_records += n;
        } else if (sl_tlog_buf_add(&s->queue, tl.lines.data, tl.lines.len) == 0)
            s->queue_records += n;
        else
            *oom += (int)n;
    } else {
        for (unsigned i = 0; i < n; i++) {
            if (!(tl.chunk[i].rec.dest & want))
                continue;
            size_t before = s->queue.len;
            const char *json = tl.lines.data + tl.line_off[i];
            size_t jlen = tl.line_off[i + 1] - tl.line_off[i] - 1; /* without its '\n' */
            int rc = is_json_file(s) ? sl_tlog_buf_add(&s->queue, json, jlen + 1)
                                     : s->ops->encode(s, &tl.chunk[i], json, jlen, &s->queue);
            if (rc != 0) {
                s->queue.len = before;
                (*oom)++;
                continue;
            }
            if (s->queue.len == before)
                continue; /* nothing for this sink in the record (no span) */
            if (s->queue.len + s->inflight_bytes > s->cfg.buffer_bytes) {
                s->queue.len = before;
                lost_budget++;
                continue;
            }
            s->queue_records++;
        }
    }
    if (before_records == 0 && s->queue_records)
        s->first_queued_ms = sl_tlog_now_ms();
    if (s->queue_records >= s->cfg.batch_max_records || s->queue.len >= s->cfg.batch_max_bytes)
        pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->lock);
    return lost_budget;
}

/* Logger thread: the chunk to every sink's queue (or its drop count). */
static void flush_chunk(void)
{
    unsigned n = tl.chunk_n;
    if (n == 0)
        return;
    for (sl_tlog_sink_t *s = tl.sinks; s; s = s->next) {
        int oom = 0;
        uint64_t lost = sink_take_chunk(s, n, &oom);
        if (oom)
            sl_tlog_sink_lost(s, (uint64_t)oom, "out of memory while queueing");
        if (lost)
            sl_tlog_sink_lost(s, lost,
                              "its queue is at its memory budget (bufferBytes): the sink "
                              "is slower than the traffic, or down");
    }
    tl.chunk_n = 0;
    tl.chunk_dest = SL_TLOG_TO_LOG | SL_TLOG_TO_TRACE;
    tl.lines.len = 0;
}

/* Logger thread: one decoded record into the chunk, its JSON line made. */
static void chunk_add(const sl_tlog_view_t *v)
{
    size_t bound = json_bound(&v->rec) + 1;
    if (tl.lines.cap - tl.lines.len < bound) {
        if (buf_reserve(&tl.lines, bound) != 0) {
            for (sl_tlog_sink_t *s = tl.sinks; s; s = s->next)
                sl_tlog_sink_lost(s, 1, "out of memory while queueing");
            return;
        }
    }
    /* No JSON when every sink writes combined lines, or the record is for
     * the span export only. */
    size_t jlen = tl.need_json && (v->rec.dest & SL_TLOG_TO_LOG)
                      ? format_json(tl.lines.data + tl.lines.len, bound, v)
                      : 0;
    tl.chunk_dest &= v->rec.dest;
    tl.line_off[tl.chunk_n] = tl.lines.len;
    tl.lines.len += jlen;
    tl.lines.data[tl.lines.len++] = '\n';
    tl.chunk[tl.chunk_n++] = *v;
    tl.line_off[tl.chunk_n] = tl.lines.len;
}

static void drain_rings(void)
{
    for (unsigned i = 0; i < tl.nworkers; i++) {
        ring_t *r = &tl.rings[i];
        size_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
        size_t head = atomic_load_explicit(&r->head, memory_order_acquire);
        while (tail != head) {
            const wire_head_t *h = (const wire_head_t *)(r->buf + (tail & (RING_BYTES - 1)));
            if (h->kind == WIRE_PAD) {
                tail += h->len;
                continue;
            }
            sl_tlog_view_t v = {.origin = &tl.origin, .padded = 1};
            sl_tlog_record_t *e = &v.rec;
            e->fields = h->fields;
            e->start_unix_us = h->start_unix_us;
            e->duration_us = h->duration_us;
            e->upstream_us = h->upstream_us;
            e->bytes_received = h->bytes_received;
            e->bytes_sent = h->bytes_sent;
            e->status = h->status;
            e->minor_version = h->minor_version;
            e->upstream_timed = h->upstream_timed;
            e->dest = h->dest;
            e->retries = h->retries;
            e->upstream_off_us = h->upstream_off_us;
            const char *str = (const char *)(h + 1);
            for (unsigned k = 0; k < h->nstr; k++) {
                e->str[k] = (sl_str_t){str, h->slen[k]};
                str += h->slen[k];
            }
            chunk_add(&v);
            tail += h->len;
            if (tl.chunk_n == CHUNK_RECORDS || tl.lines.len >= CHUNK_BYTES || tail == head) {
                flush_chunk();
                /* Room back as we go: a worker waiting for room drops less. */
                atomic_store_explicit(&r->tail, tail, memory_order_release);
            }
        }
        atomic_store_explicit(&r->tail, tail, memory_order_release);
    }
    /* Ring drops: records no sink got. */
    uint64_t drops = sl_tlog_ring_dropped();
    if (drops != tl.ring_drops_seen) {
        for (sl_tlog_sink_t *s = tl.sinks; s; s = s->next)
            sl_tlog_sink_lost(s, drops - tl.ring_drops_seen,
                              "a worker's ring was full (the logger thread fell behind)");
        tl.ring_drops_seen = drops;
    }
}

static void free_pending(pending_cfg_t *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n; i++) {
        sl_tlog_sink_config_t *c = &p->sinks[i];
        const char *strs[] = {c->name,    c->type,   c->path,     c->url,
                              c->index,   c->table,  c->username, c->password,
                              c->api_key, c->ca_pem, c->ca_file,  c->service_name};
        for (size_t k = 0; k < SL_ARRAY_LEN(strs); k++)
            free((char *)strs[k]);
    }
    for (int i = 0; i < 3; i++)
        free(p->strings[i]);
    free(p->sinks);
    free(p);
}

/* Logger thread: the new sink set. Kept sinks keep their queue and
 * connection; removed ones get their last delivery and end on their own. */
static void apply_pending(pending_cfg_t *p)
{
    sl_tlog_sink_t *kept = NULL, **tailp = &kept;
    for (size_t i = 0; i < p->n; i++) {
        char *key = config_key(&p->sinks[i]);
        sl_tlog_sink_config_t probe = p->sinks[i];
        sl_tlog_sink_t *found = NULL;
        if (key) {
            /* The key of a configured sink is made after its defaults. */
            free(key);
            sl_tlog_sink_t tmp = {.cfg = probe};
            fill_defaults(&tmp.cfg);
            key = config_key(&tmp.cfg);
        }
        for (sl_tlog_sink_t **pp = &tl.sinks; key && *pp; pp = &(*pp)->next) {
            if (strcmp((*pp)->key, key) == 0) {
                found = *pp;
                *pp = found->next;
                break;
            }
        }
        free(key);
        if (!found) {
            char err[512];
            found = sink_new(&p->sinks[i], err, sizeof(err));
            if (found && sink_start(found) != 0) {
                snprintf(err, sizeof(err), "traffic log sink %s: cannot start its thread",
                         p->sinks[i].name);
                sink_free(found);
                found = NULL;
            }
            if (!found) {
                sl_log_error("%s; the sink is left out", err);
                continue;
            }
            sl_log_notice("traffic log sink %s (%s) started", found->cfg.name, found->cfg.type);
        }
        found->next = NULL;
        *tailp = found;
        tailp = &found->next;
    }
    sl_tlog_sink_t *removed = tl.sinks;
    pthread_mutex_lock(&tl.set_lock);
    tl.sinks = kept;
    tl.need_json = 0;
    for (sl_tlog_sink_t *s = kept; s; s = s->next)
        if (!(s->ops == &sl_tlog_file_ops && s->cfg.combined))
            tl.need_json = 1;
    for (int i = 0; i < 3; i++) {
        free(tl.origin_strings[i]);
        tl.origin_strings[i] = p->strings[i];
        p->strings[i] = NULL;
    }
    tl.origin =
        (sl_tlog_origin_t){tl.origin_strings[0], tl.origin_strings[1], tl.origin_strings[2]};
    while (removed) {
        sl_tlog_sink_t *next = removed->next;
        sl_log_notice("traffic log sink %s (%s) removed: delivering what it holds, then closing",
                      removed->cfg.name, removed->cfg.type);
        sink_stop(removed);
        removed->next = tl.retiring;
        tl.retiring = removed;
        removed = next;
    }
    pthread_mutex_unlock(&tl.set_lock);
    int active = 0;
    for (sl_tlog_sink_t *s = kept; s; s = s->next)
        active |= s->ops->trace ? SL_TLOG_TO_TRACE : SL_TLOG_TO_LOG;
    __atomic_store_n(&sl_tlog_active_flag, active, __ATOMIC_RELAXED);
}

static void reap_retiring(int wait)
{
    pthread_mutex_lock(&tl.set_lock);
    sl_tlog_sink_t **pp = &tl.retiring;
    while (*pp) {
        sl_tlog_sink_t *s = *pp;
        if (wait || atomic_load(&s->finished)) {
            *pp = s->next;
            pthread_mutex_unlock(&tl.set_lock);
            if (s->thread_started)
                pthread_join(s->thread, NULL);
            sink_free(s);
            pthread_mutex_lock(&tl.set_lock);
            pp = &tl.retiring;
            continue;
        }
        pp = &s->next;
    }
    pthread_mutex_unlock(&tl.set_lock);
}

static void *logger_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "sl-tlog");
    int idle = 0;
    for (;;) {
        /* Idle (no sink, none retiring, no set pending): no worker writes
         * a record, so nothing is drained until a wake-up (a new set,
         * a reopen, the stop), rather than 20 times a second on the
         * workers' CPUs. The eventfd keeps a wake-up that came first. */
        struct pollfd pfd = {.fd = tl.wake_fd, .events = POLLIN};
        if (poll(&pfd, 1, idle ? -1 : DRAIN_INTERVAL_MS) > 0) {
            uint64_t v;
            ssize_t rd = read(tl.wake_fd, &v, sizeof(v));
            (void)rd;
        }
        int stop = atomic_load_explicit(&tl.stopping, memory_order_acquire);
        /* What was logged before a new configuration goes to the old sinks. */
        drain_rings();
        pthread_mutex_lock(&tl.set_lock);
        pending_cfg_t *p = tl.pending;
        tl.pending = NULL;
        pthread_mutex_unlock(&tl.set_lock);
        if (p) {
            apply_pending(p);
            free_pending(p);
        }
        uint64_t want = atomic_load_explicit(&tl.reopen_requested, memory_order_acquire);
        pthread_mutex_lock(&tl.reopen_lock);
        uint64_t fwd = tl.reopen_forwarded;
        pthread_mutex_unlock(&tl.reopen_lock);
        if (want != fwd) {
            /* Drained just above: what came before the signal is queued
             * for the old file; the sinks write it, then reopen. */
            for (sl_tlog_sink_t *s = tl.sinks; s; s = s->next) {
                if (!s->ops->reopen)
                    continue;
                pthread_mutex_lock(&s->lock);
                s->reopen_req++;
                pthread_cond_signal(&s->cond);
                pthread_mutex_unlock(&s->lock);
            }
            pthread_mutex_lock(&tl.reopen_lock);
            tl.reopen_forwarded = want;
            pthread_cond_broadcast(&tl.reopen_cond);
            pthread_mutex_unlock(&tl.reopen_lock);
        }
        reap_retiring(0);
        if (stop) {
            drain_rings();
            return NULL;
        }
        pthread_mutex_lock(&tl.set_lock);
        idle = !tl.retiring && !tl.pending &&
               !__atomic_load_n(&sl_tlog_active_flag, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&tl.set_lock);
    }
}

/* ---- control (main thread) ------------------------------------------------ */

int sl_tlog_init(unsigned nworkers, char *err, size_t errlen)
{
    if (tl.rings) {
        snprintf(err, errlen, "traffic log: already started");
        return -1;
    }
    if (nworkers == 0) {
        snprintf(err, errlen, "traffic log: no workers");
        return -1;
    }
    tl.max_no_body = sizeof(wire_head_t) + 8;
    for (unsigned i = 0; i < SL_TLOG_S_REQUEST_BODY_META; i++)
        tl.max_no_body += str_max[i];
    tl.nworkers = nworkers;
    tl.rings = calloc(nworkers, sizeof(*tl.rings));
    if (!tl.rings)
        goto fail_oom;
    for (unsigned i = 0; i < nworkers; i++) {
        /* 8 bytes of slack: j_str_padded reads up to 7 past a string */
        tl.rings[i].buf = calloc(1, RING_BYTES + 8);
        if (!tl.rings[i].buf)
            goto fail_oom;
    }
    tl.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (tl.wake_fd < 0) {
        snprintf(err, errlen, "traffic log: eventfd: %s", strerror(errno));
        goto fail;
    }
    atomic_store(&tl.stopping, 0);
    sigset_t all, saved;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &saved);
    int rc = pthread_create(&tl.logger, NULL, logger_main, NULL);
    pthread_sigmask(SIG_SETMASK, &saved, NULL);
    if (rc != 0) {
        snprintf(err, errlen, "traffic log: cannot start the logger thread: %s", strerror(rc));
        goto fail;
    }
    tl.logger_started = 1;
    return 0;
fail_oom:
    snprintf(err, errlen, "traffic log: out of memory");
fail:
    for (unsigned i = 0; tl.rings && i < nworkers; i++)
        free(tl.rings[i].buf);
    free(tl.rings);
    tl.rings = NULL;
    tl.nworkers = 0;
    if (tl.wake_fd >= 0)
        close(tl.wake_fd);
    tl.wake_fd = -1;
    return -1;
}

int sl_tlog_configure(const sl_tlog_sink_config_t *sinks, size_t n, const sl_tlog_origin_t *origin)
{
    pending_cfg_t *p = calloc(1, sizeof(*p));
    if (!p)
        return -1;
    p->sinks = calloc(n ? n : 1, sizeof(*p->sinks));
    if (!p->sinks) {
        free(p);
        return -1;
    }
    int oom = 0;
    for (size_t i = 0; i < n; i++) {
        sl_tlog_sink_config_t *c = &p->sinks[i];
        *c = sinks[i];
        c->name = xstrdup(sinks[i].name);
        c->type = xstrdup(sinks[i].type);
        c->path = xstrdup(sinks[i].path);
        c->url = xstrdup(sinks[i].url);
        c->index = xstrdup(sinks[i].index);
        c->table = xstrdup(sinks[i].table);
        c->username = xstrdup(sinks[i].username);
        c->password = xstrdup(sinks[i].password);
        c->api_key = xstrdup(sinks[i].api_key);
        c->service_name = xstrdup(sinks[i].service_name);
        c->ca_pem = xstrdup(sinks[i].ca_pem);
        c->ca_file = xstrdup(sinks[i].ca_file);
        p->n = i + 1;
        oom |= !c->name || !c->type || !c->path || !c->url || !c->index || !c->table ||
               !c->username || !c->password || !c->api_key || !c->ca_pem || !c->ca_file ||
               !c->service_name;
    }
    p->strings[0] = xstrdup(origin ? origin->gateway : "");
    p->strings[1] = xstrdup(origin ? origin->fleet : "");
    p->strings[2] = xstrdup(origin ? origin->runtime : "");
    if (oom || !p->strings[0] || !p->strings[1] || !p->strings[2]) {
        free_pending(p);
        return -1;
    }
    pthread_mutex_lock(&tl.set_lock);
    pending_cfg_t *old = tl.pending;
    tl.pending = p;
    pthread_mutex_unlock(&tl.set_lock);
    free_pending(old);
    /* Records written from now on find a sink: the flag goes up at once
     * (the logger puts it down again if the set turns out empty). */
    int active = 0;
    for (size_t i = 0; i < n; i++)
        active |=
            sinks[i].type && strcmp(sinks[i].type, "otlp") == 0 ? SL_TLOG_TO_TRACE : SL_TLOG_TO_LOG;
    if (active)
        __atomic_fetch_or(&sl_tlog_active_flag, active, __ATOMIC_RELAXED);
    if (tl.wake_fd >= 0)
        wake_logger();
    return 0;
}

static void deadline_in(struct timespec *dl, clockid_t clk, uint64_t ms)
{
    clock_gettime(clk, dl);
    dl->tv_sec += (time_t)(ms / 1000);
    dl->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (dl->tv_nsec >= 1000000000L) {
        dl->tv_sec++;
        dl->tv_nsec -= 1000000000L;
    }
}

void sl_tlog_reopen(void)
{
    if (!tl.logger_started)
        return;
    uint64_t seq = atomic_fetch_add(&tl.reopen_requested, 1) + 1;
    wake_logger();
    struct timespec dl;
    deadline_in(&dl, CLOCK_REALTIME, REOPEN_WAIT_MS);
    pthread_mutex_lock(&tl.reopen_lock);
    while (tl.reopen_forwarded < seq)
        if (pthread_cond_timedwait(&tl.reopen_cond, &tl.reopen_lock, &dl) == ETIMEDOUT)
            break;
    pthread_mutex_unlock(&tl.reopen_lock);
    /* Then each file sink: it writes its queue to the old file and reopens. */
    struct timespec mdl;
    deadline_in(&mdl, CLOCK_MONOTONIC, REOPEN_WAIT_MS);
    pthread_mutex_lock(&tl.set_lock);
    for (sl_tlog_sink_t *s = tl.sinks; s; s = s->next) {
        if (!s->ops->reopen)
            continue;
        pthread_mutex_lock(&s->lock);
        while (s->reopen_done < s->reopen_req)
            if (pthread_cond_timedwait(&s->done_cond, &s->lock, &mdl) == ETIMEDOUT)
                break;
        pthread_mutex_unlock(&s->lock);
    }
    pthread_mutex_unlock(&tl.set_lock);
}

void sl_tlog_shutdown(void)
{
    if (!tl.logger_started)
        return;
    atomic_store_explicit(&tl.stopping, 1, memory_order_release);
    wake_logger();
    pthread_join(tl.logger, NULL);
    tl.logger_started = 0;
    pthread_mutex_lock(&tl.set_lock);
    pending_cfg_t *p = tl.pending;
    tl.pending = NULL;
    sl_tlog_sink_t *s = tl.sinks;
    tl.sinks = NULL;
    while (s) {
        sl_tlog_sink_t *next = s->next;
        sink_stop(s);
        s->next = tl.retiring;
        tl.retiring = s;
        s = next;
    }
    pthread_mutex_unlock(&tl.set_lock);
    free_pending(p);
    __atomic_store_n(&sl_tlog_active_flag, 0, __ATOMIC_RELAXED);
    reap_retiring(1);
    for (unsigned i = 0; tl.rings && i < tl.nworkers; i++)
        free(tl.rings[i].buf);
    /* The ring drop count is a Prometheus counter: keep it. */
    uint64_t drops = sl_tlog_ring_dropped();
    free(tl.rings);
    tl.rings = NULL;
    tl.nworkers = 0;
    atomic_store(&tl.bad_worker_drops, drops);
    tl.ring_drops_seen = drops;
    sl_tlog_buf_free(&tl.lines);
    for (int i = 0; i < 3; i++) {
        free(tl.origin_strings[i]);
        tl.origin_strings[i] = NULL;
    }
    tl.origin = (sl_tlog_origin_t){0};
    close(tl.wake_fd);
    tl.wake_fd = -1;
}

void sl_tlog_foreach_sink(void (*fn)(const sl_tlog_sink_stats_t *st, void *arg), void *arg)
{
    pthread_mutex_lock(&tl.set_lock);
    for (sl_tlog_sink_t *s = tl.sinks; s; s = s->next) {
        sl_tlog_sink_stats_t st = {
            .name = s->cfg.name,
            .type = s->cfg.type,
        };
        st.records_written = atomic_load_explicit(&s->written, memory_order_relaxed);
        st.dropped = atomic_load_explicit(&s->dropped, memory_order_relaxed);
        st.batches_failed = atomic_load_explicit(&s->batches_failed, memory_order_relaxed);
        pthread_mutex_lock(&s->lock);
        st.queue_bytes = s->queue.len + s->inflight_bytes;
        st.queue_records = s->queue_records + s->inflight_records;
        pthread_mutex_unlock(&s->lock);
        fn(&st, arg);
    }
    pthread_mutex_unlock(&tl.set_lock);
}
