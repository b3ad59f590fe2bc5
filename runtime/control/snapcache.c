/*
 * Snapshot cache (snapcache.h).
 *
 * Header, 88 bytes, integers little-endian:
 *   0  16  magic "sluice-snapshot\n"
 *  16   4  format (SL_SNAPCACHE_FORMAT)
 *  20   4  reserved, 0
 *  24   8  config version
 *  32   8  written, Unix ms
 *  40   8  payload length
 *  48  32  SHA-256 of the payload
 *  80   8  reserved, 0
 * then the packed sluice.v1.Snapshot.
 */
#include "snapcache.h"

#include "compiler.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/sha.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#define MAGIC "sluice-snapshot\n"
#define HEADER_LEN 88
/* Far above any real snapshot (100,000 routes pack to tens of MB); a
 * header claiming more is corrupt, and is not allocated for. */
#define MAX_PAYLOAD (1024ull * 1024 * 1024)

struct sl_snapcache {
    char *dir;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    uint8_t *pending; /* newest snapshot not yet written, or NULL */
    size_t pending_len;
    uint64_t pending_version;
    bool stop;
    int last_errno; /* said once per distinct error */
};

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t now_unix_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

static int write_all(int fd, const uint8_t *p, size_t len)
{
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

int sl_snapcache_write_file(const char *dir, const uint8_t *packed, size_t len, uint64_t version,
                            char *err, size_t errlen)
{
    uint8_t head[HEADER_LEN] = {0};
    memcpy(head, MAGIC, 16);
    put_u32(head + 16, SL_SNAPCACHE_FORMAT);
    put_u64(head + 24, version);
    put_u64(head + 32, now_unix_ms());
    put_u64(head + 40, len);
    SHA256(packed, len, head + 48);

    char tmp[4096], path[4096];
    snprintf(tmp, sizeof(tmp), "%s/%s.tmp", dir, SL_SNAPCACHE_FILE);
    snprintf(path, sizeof(path), "%s/%s", dir, SL_SNAPCACHE_FILE);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
        return -1;
    }
    /* 0600 even when the file existed with looser bits. */
    if (fchmod(fd, 0600) != 0 || write_all(fd, head, sizeof(head)) != 0 ||
        write_all(fd, packed, len) != 0 || fsync(fd) != 0) {
        snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        return -1;
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        snprintf(err, errlen, "rename %s to %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    /* The rename itself must survive a power loss too. */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        int rc = fsync(dfd);
        int e = errno;
        close(dfd);
        if (rc != 0) {
            snprintf(err, errlen, "fsync %s: %s", dir, strerror(e));
            return -1;
        }
    }
    return 0;
}

static void *writer_thread(void *arg)
{
    sl_snapcache_t *c = arg;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (!c->pending && !c->stop)
            pthread_cond_wait(&c->cond, &c->lock);
        if (!c->pending)
            break; /* stopping, nothing left to write */
        uint8_t *buf = c->pending;
        size_t len = c->pending_len;
        uint64_t version = c->pending_version;
        c->pending = NULL;
        pthread_mutex_unlock(&c->lock);

        char err[4400];
        if (sl_snapcache_write_file(c->dir, buf, len, version, err, sizeof(err)) != 0) {
            if (errno != c->last_errno)
                sl_log_warn("--cache-dir: cannot write the snapshot of version %llu: %s (the "
                            "runtime keeps serving; a restart without a controller would use an "
                            "older cache or none)",
                            (unsigned long long)version, err);
            c->last_errno = errno ? errno : -1;
        } else {
            if (c->last_errno)
                sl_log_notice("--cache-dir: snapshot of version %llu written",
                              (unsigned long long)version);
            c->last_errno = 0;
        }
        free(buf);
        pthread_mutex_lock(&c->lock);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

sl_snapcache_t *sl_snapcache_open(const char *dir, char *err, size_t errlen)
{
    if (strlen(dir) > 3000) {
        snprintf(err, errlen, "--cache-dir: the path is too long");
        return NULL;
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "--cache-dir %s: %s (create it, or give a writable directory)", dir,
                 strerror(errno));
        return NULL;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "--cache-dir %s: not a directory", dir);
        return NULL;
    }
    char probe[4096];
    snprintf(probe, sizeof(probe), "%s/.probe-%d", dir, (int)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "--cache-dir %s: cannot write there: %s", dir, strerror(errno));
        return NULL;
    }
    close(fd);
    unlink(probe);

    sl_snapcache_t *c = calloc(1, sizeof(*c));
    if (!c || !(c->dir = strdup(dir))) {
        free(c);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    if (pthread_create(&c->thread, NULL, writer_thread, c) != 0) {
        snprintf(err, errlen, "--cache-dir: cannot start the writer thread");
        pthread_mutex_destroy(&c->lock);
        pthread_cond_destroy(&c->cond);
        free(c->dir);
        free(c);
        return NULL;
    }
    pthread_setname_np(c->thread, "sl-cache");
    return c;
}

void sl_snapcache_store(sl_snapcache_t *c, const uint8_t *packed, size_t len, uint64_t version)
{
    if (!c)
        return;
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) {
        sl_log_warn("--cache-dir: out of memory for the snapshot of version %llu; not cached",
                    (unsigned long long)version);
        return;
    }
    memcpy(copy, packed, len);
    pthread_mutex_lock(&c->lock);
    free(c->pending); /* superseded before the disk took it */
    c->pending = copy;
    c->pending_len = len;
    c->pending_version = version;
    pthread_cond_signal(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

void sl_snapcache_close(sl_snapcache_t *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    c->stop = true;
    pthread_cond_signal(&c->cond);
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->thread, NULL);
    free(c->pending);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
    free(c->dir);
    free(c);
}

Sluice__V1__Snapshot *sl_snapcache_load(const char *dir, const char *fleet, uint64_t *version,
                                        uint64_t *written_unix_ms, int *absent, char *err,
                                        size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, SL_SNAPCACHE_FILE);
    *absent = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *absent = errno == ENOENT;
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    uint8_t head[HEADER_LEN];
    uint8_t *payload = NULL;
    Sluice__V1__Snapshot *snap = NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        goto out;
    }
    if (st.st_size < HEADER_LEN || read(fd, head, sizeof(head)) != (ssize_t)sizeof(head)) {
        snprintf(err, errlen, "%s: truncated (%lld bytes, shorter than its header)", path,
                 (long long)st.st_size);
        goto out;
    }
    if (memcmp(head, MAGIC, 16) != 0) {
        snprintf(err, errlen, "%s: not a sluice snapshot cache", path);
        goto out;
    }
    uint32_t format = get_u32(head + 16);
    if (format != SL_SNAPCACHE_FORMAT) {
        snprintf(err, errlen,
                 "%s: cache format %u, this runtime reads format %u (written by another "
                 "version of sluice-runtime)",
                 path, format, SL_SNAPCACHE_FORMAT);
        goto out;
    }
    uint64_t len = get_u64(head + 40);
    if (len > MAX_PAYLOAD || (uint64_t)st.st_size != HEADER_LEN + len) {
        snprintf(err, errlen, "%s: truncated or corrupt (%lld bytes, the header says %llu)", path,
                 (long long)st.st_size, (unsigned long long)(HEADER_LEN + len));
        goto out;
    }
    payload = malloc(len ? len : 1);
    if (!payload) {
        snprintf(err, errlen, "%s: out of memory for %llu bytes", path, (unsigned long long)len);
        goto out;
    }
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(fd, payload + got, len - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            snprintf(err, errlen, "%s: %s", path, r < 0 ? strerror(errno) : "truncated");
            goto out;
        }
        got += (size_t)r;
    }
    uint8_t sum[SHA256_DIGEST_LENGTH];
    SHA256(payload, len, sum);
    if (memcmp(sum, head + 48, sizeof(sum)) != 0) {
        snprintf(err, errlen, "%s: checksum mismatch (the file is corrupt)", path);
        goto out;
    }
    snap = sl_snapshot_unpack(payload, len);
    if (!snap) {
        snprintf(err, errlen, "%s: the snapshot does not decode", path);
        goto out;
    }
    if (strcmp(snap->fleet ? snap->fleet : "", fleet) != 0) {
        snprintf(err, errlen, "%s: a snapshot of fleet \"%s\", this runtime is in fleet \"%s\"",
                 path, snap->fleet ? snap->fleet : "", fleet);
        sl_snapshot_free(snap);
        snap = NULL;
        goto out;
    }
    *version = get_u64(head + 24);
    *written_unix_ms = get_u64(head + 32);
out:
    free(payload);
    close(fd);
    return snap;
}
