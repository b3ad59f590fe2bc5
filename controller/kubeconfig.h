/*
 * Where the Kubernetes API server is and how to authenticate to it, for
 * `--source kubernetes` (ksource.c): either in-cluster (the pod's service
 * account) or a kubeconfig file (its current-context), read with the
 * project's YAML reader (common/yaml.c).
 *
 * Supported, as kubectl reads them: cluster.server (https:// or http://),
 * cluster.certificate-authority (a file, relative to the kubeconfig's
 * directory) or certificate-authority-data (base64 PEM); user.token,
 * user.tokenFile, user.client-certificate(-data) + user.client-key(-data);
 * context.namespace. insecure-skip-tls-verify is refused (the client never
 * talks to an unverified server: give the CA instead); exec and
 * auth-provider plugins are refused with a message saying so.
 *
 * In-cluster: KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT, the token
 * and CA from the service account directory
 * (/var/run/secrets/kubernetes.io/serviceaccount). Bound service account
 * tokens rotate: a token file is read again when it changes (its mtime,
 * size or inode), so a rotated token is used from the next request on.
 *
 * Every error names the file, the field and the fix.
 */
#ifndef SL_KUBECONFIG_H
#define SL_KUBECONFIG_H

#include <pthread.h>
#include <stddef.h>
#include <sys/types.h>
#include <time.h>

#define SL_KUBECONFIG_SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"

typedef struct {
    char *server;     /* "https://host:port" without a trailing '/' */
    char *ca_pem;     /* trust for https (NULL = the system's CAs) */
    char *ca_name;    /* where ca_pem came from, for messages */
    char *token;      /* static bearer token, or NULL */
    char *token_file; /* re-read when it changes, or NULL */
    char *cert_pem;   /* client certificate chain and key, or NULL */
    char *key_pem;
    char *cert_name; /* where they came from, for messages */
    char *ns;        /* the context's namespace, or NULL */
    char *source;    /* "kubeconfig FILE (context NAME)" or "in-cluster service account" */

    /* Private: the token file's last read (threads share the config). */
    pthread_mutex_t lock;
    char *file_token;
    dev_t tf_dev;
    ino_t tf_ino;
    off_t tf_size;
    struct timespec tf_mtime;
} sl_kubeconfig_t;

/* Reads a kubeconfig's current context. 0, or -1 with err (nothing to free
 * then). */
int sl_kubeconfig_load(sl_kubeconfig_t *kc, const char *path, char *err, size_t errlen);

/* The in-cluster configuration from the environment and sa_dir
 * (SL_KUBECONFIG_SA_DIR; another directory in tests). 0, or -1 with err. */
int sl_kubeconfig_in_cluster(sl_kubeconfig_t *kc, const char *sa_dir, char *err, size_t errlen);

/* The Authorization header line for the next request ("Authorization:
 * Bearer T\r\n", or "" without a token) into out (may be NULL). The token
 * file is read again when it changed. 0, or -1 with err when it cannot be
 * read (out still carries the last token read, if any). Thread-safe. */
int sl_kubeconfig_auth_header(sl_kubeconfig_t *kc, char *out, size_t outlen, char *err,
                              size_t errlen);

void sl_kubeconfig_free(sl_kubeconfig_t *kc);

/* base64 (whitespace allowed) -> bytes, NUL-terminated, their count in
 * *outlen (may be NULL); NULL when invalid or empty. For the -data fields
 * here and a Secret's data (ksource.c). */
char *sl_kubeconfig_b64_decode(const char *in, size_t *outlen);

#endif
