/*
 * WebSocket handshake values (websocket.h), on OpenSSL's SHA-1, base64 and
 * random generator (already linked for TLS).
 */
#include "websocket.h"

#include "sl_types.h"

#include <openssl/evp.h>
#include <openssl/rand.h>
#include <string.h>

/* RFC 6455 1.3 */
static const char ws_guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

int sl_websocket_key_new(char out[SL_WEBSOCKET_KEY_LEN + 1])
{
    unsigned char nonce[16];
    if (RAND_bytes(nonce, sizeof(nonce)) != 1)
        return SL_ERROR;
    EVP_EncodeBlock((unsigned char *)out, nonce, sizeof(nonce));
    return SL_OK;
}

void sl_websocket_accept(const char *key, size_t key_len, char out[SL_WEBSOCKET_ACCEPT_LEN + 1])
{
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int dlen = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha1(), NULL) != 1 ||
        EVP_DigestUpdate(ctx, key, key_len) != 1 ||
        EVP_DigestUpdate(ctx, ws_guid, sizeof(ws_guid) - 1) != 1 ||
        EVP_DigestFinal_ex(ctx, digest, &dlen) != 1 || dlen != 20) {
        /* Out of memory: an accept value no origin can match. */
        out[0] = '\0';
        EVP_MD_CTX_free(ctx);
        return;
    }
    EVP_MD_CTX_free(ctx);
    EVP_EncodeBlock((unsigned char *)out, digest, 20);
}

int sl_websocket_accept_ok(const char *key, size_t key_len, const char *value, size_t value_len)
{
    char want[SL_WEBSOCKET_ACCEPT_LEN + 1];
    sl_websocket_accept(key, key_len, want);
    while (value_len && (value[0] == ' ' || value[0] == '\t')) {
        value++;
        value_len--;
    }
    while (value_len && (value[value_len - 1] == ' ' || value[value_len - 1] == '\t'))
        value_len--;
    return want[0] && value_len == SL_WEBSOCKET_ACCEPT_LEN &&
           memcmp(value, want, SL_WEBSOCKET_ACCEPT_LEN) == 0;
}
