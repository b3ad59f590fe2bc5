/*
 * The two pieces of the WebSocket opening handshake (RFC 6455 4.1, 4.2.2)
 * that a gateway must compute itself when it translates a WebSocket over
 * HTTP/2 (RFC 8441, extended CONNECT, which has no key) into an HTTP/1.1
 * upgrade: a fresh Sec-WebSocket-Key for the origin, and the
 * Sec-WebSocket-Accept the origin must answer with, so that a 101 from
 * something that is not a WebSocket server is never taken for one.
 *
 * Not here: frames (the tunnel relays bytes, it never reads a frame),
 * subprotocols and extensions (passed through), the HTTP/1.1 client's own
 * handshake (client and origin check each other; the gateway relays it).
 */
#ifndef SL_WEBSOCKET_H
#define SL_WEBSOCKET_H

#include <stddef.h>

/* Base64 of 16 random bytes: 24 characters, and a NUL. SL_OK or SL_ERROR
 * (no randomness available). */
#define SL_WEBSOCKET_KEY_LEN 24
int sl_websocket_key_new(char out[SL_WEBSOCKET_KEY_LEN + 1]);

/* base64(SHA-1(key + the RFC 6455 GUID)): 28 characters, and a NUL. */
#define SL_WEBSOCKET_ACCEPT_LEN 28
void sl_websocket_accept(const char *key, size_t key_len, char out[SL_WEBSOCKET_ACCEPT_LEN + 1]);

/* Whether `value` (a Sec-WebSocket-Accept field value, surrounding blanks
 * allowed) is the accept value for `key`. */
int sl_websocket_accept_ok(const char *key, size_t key_len, const char *value, size_t value_len);

#endif
