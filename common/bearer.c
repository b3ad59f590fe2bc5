/* Bearer tokens of the admin listeners (bearer.h). */
#include "bearer.h"

#include "log.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

char *sl_bearer_load(const char *flag, const char *path, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "%s %s: %s", flag, path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(err, errlen, "%s %s: not a regular file", flag, path);
        close(fd);
        return NULL;
    }
    if (sb.st_size > SL_BEARER_MAX_TOKEN_BYTES) {
        snprintf(err, errlen, "%s %s: larger than %d bytes; it must hold the token only", flag,
                 path, SL_BEARER_MAX_TOKEN_BYTES);
        close(fd);
        return NULL;
    }
    char *buf = malloc(SL_BEARER_MAX_TOKEN_BYTES + 1);
    if (!buf) {
        close(fd);
        snprintf(err, errlen, "%s %s: out of memory", flag, path);
        return NULL;
    }
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, buf + len, SL_BEARER_MAX_TOKEN_BYTES + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(err, errlen, "%s %s: %s", flag, path, strerror(errno));
            goto fail;
        }
        if (n == 0)
            break;
        len += (size_t)n;
        if (len > SL_BEARER_MAX_TOKEN_BYTES) {
            snprintf(err, errlen, "%s %s: larger than %d bytes", flag, path,
                     SL_BEARER_MAX_TOKEN_BYTES);
            goto fail;
        }
    }
    while (len && isspace((unsigned char)buf[len - 1]))
        len--;
    buf[len] = '\0';
    if (len == 0) {
        snprintf(err, errlen,
                 "%s %s: the file is empty; put a long random token in it (e.g. openssl rand "
                 "-hex 32)",
                 flag, path);
        goto fail;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)buf[i];
        if (ch <= ' ' || ch == 0x7f) {
            snprintf(err, errlen,
                     "%s %s: the token contains spaces or control characters (byte %zu); use "
                     "printable characters only",
                     flag, path, i + 1);
            goto fail;
        }
    }
    if (sb.st_mode & S_IROTH)
        sl_log_warn("%s %s is readable by every user; chmod 600 it", flag, path);
    close(fd);
    return buf;

fail:
    OPENSSL_cleanse(buf, SL_BEARER_MAX_TOKEN_BYTES + 1);
    free(buf);
    close(fd);
    return NULL;
}

void sl_bearer_free(char *token)
{
    if (!token)
        return;
    OPENSSL_cleanse(token, strlen(token));
    free(token);
}

void sl_bearer_digest(const char *token, size_t len, unsigned char out[32])
{
    unsigned int n = 0;
    if (!EVP_Digest(token, len, out, &n, EVP_sha256(), NULL) || n != 32)
        memset(out, 0, 32);
}

bool sl_bearer_check(const char *authorization, const unsigned char digest[32], bool *presented)
{
    *presented = authorization != NULL;
    if (!authorization || strncasecmp(authorization, "Bearer ", 7) != 0)
        return false;
    const char *tok = authorization + 7;
    while (*tok == ' ')
        tok++;
    size_t len = strlen(tok);
    while (len && (tok[len - 1] == ' ' || tok[len - 1] == '\t'))
        len--;
    unsigned char d[32];
    sl_bearer_digest(tok, len, d);
    return len > 0 && CRYPTO_memcmp(d, digest, sizeof(d)) == 0;
}
