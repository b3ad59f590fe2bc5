/*
 * Bearer-token authentication of the admin listeners (the controller's REST
 * API and the runtime's admin listener, both with --admin-token-file): the
 * token file's rules and one constant-time check, so both listeners accept
 * and refuse exactly the same things.
 */
#ifndef SL_BEARER_H
#define SL_BEARER_H

#include <stdbool.h>
#include <stddef.h>

#define SL_BEARER_MAX_TOKEN_BYTES 4096

/* Reads a token file: a regular file of at most SL_BEARER_MAX_TOKEN_BYTES,
 * trailing white space trimmed, printable characters only, not empty (a
 * world-readable file is warned about). `flag` names the option in every
 * message ("--admin-token-file"). Returns a malloc'd token (wipe with
 * sl_bearer_free), or NULL with err naming the file and the fix. */
char *sl_bearer_load(const char *flag, const char *path, char *err, size_t errlen);
/* Wipes and frees a token from sl_bearer_load. NULL is fine. */
void sl_bearer_free(char *token);

/* SHA-256 of a token: what a listener keeps instead of the token. */
void sl_bearer_digest(const char *token, size_t len, unsigned char out[32]);

/* Whether an Authorization header value ("Bearer <token>"; NULL when the
 * request had none) carries the token of `digest`. Compares digests with
 * CRYPTO_memcmp, so neither the token's content nor its length leaks
 * through timing. *presented: whether any Authorization header was sent
 * (for the WWW-Authenticate error). */
bool sl_bearer_check(const char *authorization, const unsigned char digest[32], bool *presented);

#endif
