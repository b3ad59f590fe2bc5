/*
 * Traffic mirroring: per-worker bounded rings and the mirror thread
 * (interface and rules: mirror.h).
 *
 * Ring: single producer (its worker), single consumer (the mirror thread);
 * head written only by the worker, tail only by the thread, both atomic
 * (release on publish, acquire on read). The worker wakes the thread
 * through an eventfd only when the ring was empty before its push.
 */
#include "mirror.h"

#include "httpc.h"
#include "log.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

const char *const sl_mirror_result_names[SL_MIRROR__N] = {"sent", "failed", "dropped", "skipped"};

typedef struct sl_mirror_copy {
    char url[96]; /* "http://host:port" */
    char *method; /* the strings below point into this one allocation */
    char *target;
    char *headers; /* "Name: value\r\n" lines */
    char *body;
    size_t body_len;
} copy_t;

typedef struct {
    _Atomic size_t head; /* next slot the worker writes */
    _Atomic size_t tail; /* next slot the thread reads */
    copy_t *slots[SL_MIRROR_RING];
} __attribute__((aligned(64))) ring_t;

static ring_t *rings;
static unsigned nrings;
static int wake_fd = -1;
static pthread_t thread;
static _Atomic int started;
static _Atomic uint64_t counts[SL_MIRROR__N];

#define MIRROR_TIMEOUT_MS 1000
#define MIRROR_CLIENTS 16

typedef struct {
    char url[96];
    sl_httpc_t c;
    int ready;
} client_t;
static client_t clients[MIRROR_CLIENTS]; /* the mirror thread's */

static sl_httpc_t *client_for(const char *url)
{
    for (int i = 0; i < MIRROR_CLIENTS; i++)
        if (clients[i].ready && strcmp(clients[i].url, url) == 0)
            return &clients[i].c;
    /* a free one, else the first (a fleet rarely has more shadows) */
    int slot = 0;
    for (int i = 0; i < MIRROR_CLIENTS; i++)
        if (!clients[i].ready) {
            slot = i;
            break;
        }
    client_t *cl = &clients[slot];
    if (cl->ready)
        sl_httpc_free(&cl->c);
    memset(cl, 0, sizeof(*cl));
    const char *why = NULL;
    if (sl_httpc_init(&cl->c, url, &why) != 0)
        return NULL;
    snprintf(cl->url, sizeof(cl->url), "%s", url);
    cl->ready = 1;
    return &cl->c;
}

static void send_copy(copy_t *cp)
{
    sl_httpc_t *c = client_for(cp->url);
    const char *rbody;
    size_t rlen;
    int status =
        c ? sl_httpc_request(c, cp->method, cp->target, cp->headers, cp->body_len ? cp->body : NULL,
                             cp->body_len, MIRROR_TIMEOUT_MS, &rbody, &rlen)
          : 0;
    atomic_fetch_add_explicit(&counts[status ? SL_MIRROR_SENT : SL_MIRROR_FAILED], 1,
                              memory_order_relaxed);
    if (!status && c)
        sl_httpc_close(c);
}

static void *mirror_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "sl-mirror");
    for (;;) {
        int any = 0;
        for (unsigned w = 0; w < nrings; w++) {
            ring_t *r = &rings[w];
            size_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
            size_t head = atomic_load_explicit(&r->head, memory_order_acquire);
            if (tail == head)
                continue;
            copy_t *cp = r->slots[tail % SL_MIRROR_RING];
            atomic_store_explicit(&r->tail, tail + 1, memory_order_release);
            send_copy(cp);
            free(cp->body);
            free(cp);
            any = 1;
        }
        if (!any) {
            struct pollfd p = {.fd = wake_fd, .events = POLLIN};
            if (poll(&p, 1, 1000) > 0) {
                uint64_t v;
                if (read(wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
                    sl_log_warn("mirror: reading its eventfd: %s", strerror(errno));
            }
        }
    }
    return NULL;
}

int sl_mirror_start(unsigned nworkers, char *err, size_t errlen)
{
    if (atomic_load(&started))
        return 0;
    nrings = nworkers ? nworkers : 1;
    rings = aligned_alloc(64, nrings * sizeof(*rings));
    wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!rings || wake_fd < 0) {
        snprintf(err, errlen, "mirror: out of memory or no eventfd");
        free(rings);
        rings = NULL;
        return -1;
    }
    memset(rings, 0, nrings * sizeof(*rings));
    if (pthread_create(&thread, NULL, mirror_main, NULL) != 0) {
        snprintf(err, errlen, "mirror: cannot start its thread");
        return -1;
    }
    pthread_detach(thread);
    atomic_store(&started, 1);
    return 0;
}

void sl_mirror_skip(void)
{
    atomic_fetch_add_explicit(&counts[SL_MIRROR_SKIPPED], 1, memory_order_relaxed);
}

uint64_t sl_mirror_count(int result)
{
    return atomic_load_explicit(&counts[result], memory_order_relaxed);
}

copy_t *sl_mirror_prepare(const char *host_port, sl_str_t method, sl_str_t path, sl_str_t query,
                          int has_query, const sl_str_t *hdr_names, const sl_str_t *hdr_values,
                          size_t nhdr)
{
    if (!atomic_load_explicit(&started, memory_order_acquire))
        return NULL;
    size_t hlen = 0;
    for (size_t i = 0; i < nhdr; i++)
        hlen += hdr_names[i].len + 2 + hdr_values[i].len + 2;
    size_t need = sizeof(copy_t) + method.len + 1 + 1 + path.len + 1 + query.len + 1 + hlen + 1;
    copy_t *cp = need <= SL_MIRROR_MAX_BYTES ? malloc(need) : NULL;
    if (!cp) {
        sl_mirror_skip();
        return NULL;
    }
    snprintf(cp->url, sizeof(cp->url), "http://%s", host_port);
    char *p = (char *)(cp + 1);
    cp->method = p;
    memcpy(p, method.ptr, method.len);
    p += method.len;
    *p++ = '\0';
    cp->target = p;
    if (path.len == 0 || path.ptr[0] != '/')
        *p++ = '/';
    memcpy(p, path.ptr, path.len);
    p += path.len;
    if (has_query) {
        *p++ = '?';
        memcpy(p, query.ptr, query.len);
        p += query.len;
    }
    *p++ = '\0';
    cp->headers = p;
    for (size_t i = 0; i < nhdr; i++) {
        memcpy(p, hdr_names[i].ptr, hdr_names[i].len);
        p += hdr_names[i].len;
        *p++ = ':';
        *p++ = ' ';
        memcpy(p, hdr_values[i].ptr, hdr_values[i].len);
        p += hdr_values[i].len;
        *p++ = '\r';
        *p++ = '\n';
    }
    *p = '\0';
    cp->body = NULL;
    cp->body_len = 0;
    return cp;
}

void sl_mirror_discard(copy_t *cp)
{
    free(cp);
}

void sl_mirror_push(unsigned worker, copy_t *cp, const char *body, size_t body_len)
{
    if (!cp)
        return;
    if (worker >= nrings) {
        free(cp);
        return;
    }
    ring_t *r = &rings[worker];
    size_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
    size_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    if (head - tail >= SL_MIRROR_RING) {
        atomic_fetch_add_explicit(&counts[SL_MIRROR_DROPPED], 1, memory_order_relaxed);
        free(cp);
        return;
    }
    if (body_len) {
        char *b = body_len <= SL_MIRROR_MAX_BYTES ? malloc(body_len) : NULL;
        if (!b) {
            sl_mirror_skip();
            free(cp);
            return;
        }
        memcpy(b, body, body_len);
        cp->body = b;
        cp->body_len = body_len;
    }
    r->slots[head % SL_MIRROR_RING] = cp;
    atomic_store_explicit(&r->head, head + 1, memory_order_release);
    if (head == tail) {
        uint64_t one = 1;
        if (write(wake_fd, &one, sizeof(one)) < 0) {
            /* EAGAIN: the counter is full, the thread is awake anyway */
        }
    }
}
