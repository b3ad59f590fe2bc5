/*
 * The REST admin API's generated TLS: when a token protects the API
 * (--admin-token-file) and no --rest-tls-cert is given, the controller
 * serves HTTPS with a certificate it issues itself, because kubectl sends
 * a bearer token only over https:// (docs/security.md "Generated
 * certificate").
 *
 * In --data-dir:
 *   rest-ca.crt (0644), rest-ca.key (0600)          a self-signed CA, EC P-256,
 *                                                   ten years; kept across restarts
 *                                                   so that clients trust it once
 *   rest-server.crt (0644), rest-server.key (0600)  the API's certificate, EC P-256,
 *                                                   397 days, signed by that CA
 *   kubeconfig (0600)                               server, CA and token for
 *                                                   kubectl (context "sluice")
 *
 * At start-up the files are reused when they parse, the keys match, the
 * server certificate is signed by the CA, neither expires within 30 days
 * and the server certificate names exactly the wanted subjectAltNames: the
 * --rest address's host (unless a wildcard), 127.0.0.1, ::1, localhost,
 * the host name and every --rest-tls-san. Otherwise the server certificate
 * (and, when the CA itself is unusable, the CA) is issued anew. Deleting
 * the files is how an operator rotates them.
 *
 * Not here: the SSL_CTX and the listener (rest.c), reading operator-given
 * PEM files (common/tls_files.c).
 */
#ifndef SL_REST_TLS_H
#define SL_REST_TLS_H

#include <stdbool.h>
#include <stddef.h>

#define SL_REST_TLS_CA_CERT "rest-ca.crt"
#define SL_REST_TLS_CA_KEY "rest-ca.key"
#define SL_REST_TLS_SERVER_CERT "rest-server.crt"
#define SL_REST_TLS_SERVER_KEY "rest-server.key"
#define SL_REST_TLS_KUBECONFIG "kubeconfig"

/* Checks one --rest-tls-san value: an IPv4 or IPv6 address or a DNS name
 * (optionally "*." first). 0, or -1 with err naming the flag and the fix. */
int sl_rest_tls_check_san(const char *name, char *err, size_t errlen);

/* True for localhost, 127.0.0.0/8 and ::1. */
bool sl_rest_tls_loopback_host(const char *host);

/*
 * Reuses or issues the CA and the server certificate in data_dir (which
 * exists) for the --rest address rest_addr and the extra names sans[0..n).
 * On success 0 with *cert_pem (the server certificate), *key_pem (its key)
 * and *ca_pem (the CA certificate): NUL-terminated, the caller frees each
 * with sl_tls_files_free. On failure -1 with err naming the file and the
 * fix, nothing allocated.
 */
int sl_rest_tls_prepare(const char *data_dir, const char *rest_addr, const char *const *sans,
                        size_t nsans, char **cert_pem, char **key_pem, char **ca_pem, char *err,
                        size_t errlen);

/*
 * Writes data_dir/kubeconfig (mode 0600, replaced atomically): cluster
 * "sluice" at https://HOST:port (HOST the --rest host, 127.0.0.1 or [::1]
 * for a wildcard) with ca_pem as certificate-authority-data, user "sluice"
 * with the token, context and current-context "sluice". 0 with the file's
 * path in path (pathlen bytes), or -1 with err.
 */
int sl_rest_tls_write_kubeconfig(const char *data_dir, const char *rest_addr, int port,
                                 const char *ca_pem, const char *token, char *path, size_t pathlen,
                                 char *err, size_t errlen);

#endif
