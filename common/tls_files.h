/*
 * PEM files named on the command line for the control plane's own TLS: the
 * config stream (sluice-controller --stream-tls-cert/--stream-tls-key/
 * --stream-client-ca, sluice-runtime --controller-ca/--cert/--key) and the
 * REST admin API (--rest-tls-cert/--rest-tls-key).
 *
 * Read once at start-up and checked completely, so that a bad file is a
 * start-up error naming the flag, the path and the fix, never a handshake
 * that fails later with an OpenSSL code: missing or unreadable, not a
 * regular file, larger than SL_TLS_FILES_MAX_BYTES, no PEM certificate, a
 * certificate that does not parse, a chain not in leaf-first order, a leaf
 * expired or not yet valid, a private key in a certificate file, an
 * encrypted key, a key that does not match the certificate.
 *
 * Unlike tls_pem.h (a Certificate resource for a listener), a certificate
 * here need not name a host: a runtime's client certificate may carry only
 * a URI SAN (a SPIFFE id, say), or only a common name.
 *
 * Key material: no message quotes a file's content, OpenSSL's error queue
 * is left empty, and key text is wiped before it is freed
 * (sl_tls_files_free). A key file that other users can read is accepted
 * with a warning to chmod it.
 *
 * Not here: building credentials or SSL_CTXs (controller/stream.c,
 * controller/rest.c, runtime/control/xds.c).
 */
#ifndef SL_TLS_FILES_H
#define SL_TLS_FILES_H

#include <stddef.h>

#define SL_TLS_FILES_MAX_BYTES (1024 * 1024)

/*
 * A trust bundle (CA certificates) for `flag`: one or more PEM
 * certificates and nothing else. 0 with *pem (NUL-terminated, free with
 * sl_tls_files_free), or -1 with err.
 */
int sl_tls_files_read_ca(const char *flag, const char *path, char **pem, char *err, size_t errlen);

/*
 * A certificate chain (leaf first) and its private key. 0 with *cert_pem
 * and *key_pem (free both with sl_tls_files_free), or -1 with err naming
 * the flag of the file at fault; nothing is left allocated then.
 */
int sl_tls_files_read_pair(const char *cert_flag, const char *cert_path, const char *key_flag,
                           const char *key_path, char **cert_pem, char **key_pem, char *err,
                           size_t errlen);

/* Wipes and frees text returned above. NULL is fine. */
void sl_tls_files_free(char *pem);

#endif
