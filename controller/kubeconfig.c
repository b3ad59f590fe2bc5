/*
 * Kubernetes client configuration (kubeconfig.h): a kubeconfig file's
 * current context, or the pod's service account.
 */
#include "kubeconfig.h"

#include "httpc.h"
#include "model.h"

#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define FILE_MAX (4u * 1024 * 1024)

/* A whole file, NUL-terminated; NULL with err ("open: No such file..."). */
static char *read_file(const char *path, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        snprintf(err, errlen, "%s", strerror(errno));
        return NULL;
    }
    char *buf = malloc(FILE_MAX + 1);
    size_t n = buf ? fread(buf, 1, FILE_MAX + 1, f) : 0;
    int bad = !buf || ferror(f);
    fclose(f);
    if (bad || n > FILE_MAX) {
        snprintf(err, errlen, "%s", bad ? "cannot be read" : "larger than 4 MiB");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

char *sl_kubeconfig_b64_decode(const char *in, size_t *outlen)
{
    size_t n = strlen(in);
    char *clean = malloc(n + 1);
    if (!clean)
        return NULL;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (in[i] != '\n' && in[i] != '\r' && in[i] != ' ' && in[i] != '\t')
            clean[m++] = in[i];
    clean[m] = '\0';
    if (m == 0 || m % 4) {
        free(clean);
        return NULL;
    }
    unsigned char *out = malloc(m / 4 * 3 + 1);
    int r = out ? EVP_DecodeBlock(out, (const unsigned char *)clean, (int)m) : -1;
    if (r < 0) {
        free(clean);
        free(out);
        return NULL;
    }
    /* EVP_DecodeBlock counts the padding as zero bytes. */
    if (clean[m - 1] == '=')
        r--;
    if (clean[m - 2] == '=')
        r--;
    out[r] = '\0';
    free(clean);
    if (outlen)
        *outlen = (size_t)r;
    return (char *)out;
}

/* The entry of list `key` (clusters, users, contexts) named `name`, and its
 * inner object (`inner`: "cluster", "user", "context"). */
static json_t *named(json_t *cfg, const char *key, const char *name, const char *inner)
{
    json_t *arr = json_object_get(cfg, key);
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e)
    {
        const char *n = json_string_value(json_object_get(e, "name"));
        if (n && strcmp(n, name) == 0) {
            json_t *in = json_object_get(e, inner);
            return json_is_object(in) ? in : json_object();
        }
    }
    return NULL;
}

static const char *str(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s && *s ? s : NULL;
}

/* A path of the kubeconfig, relative to its directory as kubectl reads it. */
static char *resolve(const char *kubeconfig, const char *p)
{
    if (p[0] == '/')
        return strdup(p);
    char *copy = strdup(kubeconfig);
    if (!copy)
        return NULL;
    char *out = NULL;
    if (asprintf(&out, "%s/%s", dirname(copy), p) < 0)
        out = NULL;
    free(copy);
    return out;
}

/* Data from `<field>-data` (base64) or the file `<field>`: 0 with *out (NULL
 * when neither is set), or -1 with err. */
static int data_or_file(const char *path, json_t *o, const char *what, const char *field,
                        char **out, char **name, char *err, size_t errlen)
{
    char dkey[64];
    snprintf(dkey, sizeof(dkey), "%s-data", field);
    const char *d = str(o, dkey), *f = str(o, field);
    *out = NULL;
    if (d) {
        if (!(*out = sl_kubeconfig_b64_decode(d, NULL))) {
            snprintf(err, errlen,
                     "kubeconfig %s: %s.%s is not valid base64 (the PEM file encoded with "
                     "`base64 -w0`)",
                     path, what, dkey);
            return -1;
        }
        if (name && asprintf(name, "kubeconfig %s: %s.%s", path, what, dkey) < 0)
            *name = NULL;
        return 0;
    }
    if (!f)
        return 0;
    char *full = resolve(path, f), why[128];
    if (!full || !(*out = read_file(full, NULL, why, sizeof(why)))) {
        snprintf(err, errlen, "kubeconfig %s: %s.%s: %s: %s (a readable PEM file)", path, what,
                 field, full ? full : f, full ? why : "out of memory");
        free(full);
        return -1;
    }
    if (name && asprintf(name, "kubeconfig %s: %s.%s (%s)", path, what, field, full) < 0)
        *name = NULL;
    free(full);
    return 0;
}

static void init(sl_kubeconfig_t *kc)
{
    memset(kc, 0, sizeof(*kc));
    pthread_mutex_init(&kc->lock, NULL);
}

int sl_kubeconfig_load(sl_kubeconfig_t *kc, const char *path, char *err, size_t errlen)
{
    init(kc);
    char why[256];
    size_t len;
    char *text = read_file(path, &len, why, sizeof(why));
    if (!text) {
        snprintf(err, errlen,
                 "--kubeconfig %s: %s (the kubeconfig file kubectl uses, e.g. "
                 "~/.kube/config)",
                 path, why);
        sl_kubeconfig_free(kc);
        return -1;
    }
    sl_errors_t errs;
    sl_errors_init(&errs);
    json_t *docs = sl_yaml_to_json(text, len, path, &errs);
    free(text);
    if (!docs) {
        char *msg = sl_errors_format(&errs);
        snprintf(err, errlen, "--kubeconfig %s: not valid YAML: %s", path, msg ? msg : "?");
        free(msg);
        sl_errors_free(&errs);
        sl_kubeconfig_free(kc);
        return -1;
    }
    sl_errors_free(&errs);
    json_t *cfg = json_array_get(docs, 0);
    json_t *cluster = NULL, *user = NULL, *ctx = NULL;
    const char *cur = str(cfg, "current-context");
    if (!json_is_object(cfg)) {
        snprintf(err, errlen,
                 "kubeconfig %s: not a kubeconfig (a mapping with clusters, users, "
                 "contexts and current-context is expected)",
                 path);
        goto fail;
    }
    if (!cur) {
        snprintf(err, errlen,
                 "kubeconfig %s: current-context is not set (set it: `kubectl config use-context "
                 "NAME --kubeconfig %s`)",
                 path, path);
        goto fail;
    }
    if (!(ctx = named(cfg, "contexts", cur, "context"))) {
        snprintf(err, errlen, "kubeconfig %s: current-context \"%s\" is not in contexts[]", path,
                 cur);
        goto fail;
    }
    const char *cname = str(ctx, "cluster"), *uname = str(ctx, "user");
    if (!cname || !(cluster = named(cfg, "clusters", cname, "cluster"))) {
        snprintf(err, errlen, "kubeconfig %s: context \"%s\": cluster \"%s\" is not in clusters[]",
                 path, cur, cname ? cname : "");
        goto fail;
    }
    if (uname && !(user = named(cfg, "users", uname, "user"))) {
        snprintf(err, errlen, "kubeconfig %s: context \"%s\": user \"%s\" is not in users[]", path,
                 cur, uname);
        goto fail;
    }
    char what[300];
    snprintf(what, sizeof(what), "clusters[%s].cluster", cname);
    const char *server = str(cluster, "server");
    if (!server || (strncmp(server, "https://", 8) != 0 && strncmp(server, "http://", 7) != 0)) {
        snprintf(err, errlen,
                 "kubeconfig %s: %s.server: %s (the API server's URL, e.g. "
                 "https://10.0.0.1:6443)",
                 path, what, server ? "must start with https:// or http://" : "missing");
        goto fail;
    }
    json_t *insecure = json_object_get(cluster, "insecure-skip-tls-verify");
    if (json_is_true(insecure)) {
        snprintf(err, errlen,
                 "kubeconfig %s: %s.insecure-skip-tls-verify: true is refused (the controller "
                 "never trusts an unverified API server): set certificate-authority-data to the "
                 "server's CA instead",
                 path, what);
        goto fail;
    }
    kc->server = strdup(server);
    size_t sl = strlen(kc->server);
    while (sl > 0 && kc->server[sl - 1] == '/')
        kc->server[--sl] = '\0';
    if (data_or_file(path, cluster, what, "certificate-authority", &kc->ca_pem, &kc->ca_name, err,
                     errlen) != 0)
        goto fail;
    if (user) {
        snprintf(what, sizeof(what), "users[%s].user", uname);
        if (json_object_get(user, "exec") || json_object_get(user, "auth-provider")) {
            snprintf(err, errlen,
                     "kubeconfig %s: %s: exec and auth-provider plugins are not supported: use "
                     "token, tokenFile or client-certificate-data + client-key-data",
                     path, what);
            goto fail;
        }
        if (str(user, "username") || str(user, "password")) {
            snprintf(err, errlen,
                     "kubeconfig %s: %s: basic auth (username/password) is not supported: use "
                     "token, tokenFile or a client certificate",
                     path, what);
            goto fail;
        }
        if (str(user, "token"))
            kc->token = strdup(str(user, "token"));
        else if (str(user, "tokenFile"))
            kc->token_file = resolve(path, str(user, "tokenFile"));
        if (data_or_file(path, user, what, "client-certificate", &kc->cert_pem, &kc->cert_name, err,
                         errlen) != 0 ||
            data_or_file(path, user, what, "client-key", &kc->key_pem, NULL, err, errlen) != 0)
            goto fail;
        if (!kc->cert_pem != !kc->key_pem) {
            snprintf(err, errlen,
                     "kubeconfig %s: %s: client-certificate%s needs client-key%s (and the "
                     "other way round)",
                     path, what, kc->cert_pem ? "(-data)" : "", kc->cert_pem ? "(-data)" : "");
            goto fail;
        }
        char cwhy[512];
        if (kc->cert_pem && sl_httpc_check_client_cert(kc->cert_pem, kc->key_pem, kc->cert_name,
                                                       cwhy, sizeof(cwhy)) != 0) {
            snprintf(err, errlen, "%s (a PEM certificate and its unencrypted key)", cwhy);
            goto fail;
        }
    }
    if (str(ctx, "namespace"))
        kc->ns = strdup(str(ctx, "namespace"));
    if (asprintf(&kc->source, "kubeconfig %s (context %s)", path, cur) < 0)
        kc->source = NULL;
    if (kc->token_file) {
        char e2[256];
        if (sl_kubeconfig_auth_header(kc, NULL, 0, e2, sizeof(e2)) != 0) {
            snprintf(err, errlen, "kubeconfig %s: %s.tokenFile: %s", path, what, e2);
            goto fail;
        }
    }
    json_decref(docs);
    return 0;
fail:
    json_decref(docs);
    sl_kubeconfig_free(kc);
    return -1;
}

int sl_kubeconfig_in_cluster(sl_kubeconfig_t *kc, const char *sa_dir, char *err, size_t errlen)
{
    init(kc);
    const char *host = getenv("KUBERNETES_SERVICE_HOST");
    const char *port = getenv("KUBERNETES_SERVICE_PORT");
    if (!host || !*host) {
        snprintf(err, errlen,
                 "--source kubernetes: KUBERNETES_SERVICE_HOST is not set, so this is not a pod: "
                 "give --kubeconfig FILE to run outside a cluster");
        goto fail;
    }
    int v6 = strchr(host, ':') != NULL;
    if (asprintf(&kc->server, "https://%s%s%s:%s", v6 ? "[" : "", host, v6 ? "]" : "",
                 port && *port ? port : "443") < 0) {
        kc->server = NULL;
        goto oom;
    }
    char path[1024], why[256];
    snprintf(path, sizeof(path), "%s/ca.crt", sa_dir);
    if (!(kc->ca_pem = read_file(path, NULL, why, sizeof(why)))) {
        snprintf(err, errlen,
                 "in-cluster: %s: %s (the service account's CA; is automountServiceAccountToken "
                 "false?)",
                 path, why);
        goto fail;
    }
    kc->ca_name = strdup(path);
    snprintf(path, sizeof(path), "%s/token", sa_dir);
    kc->token_file = strdup(path);
    if (sl_kubeconfig_auth_header(kc, NULL, 0, why, sizeof(why)) != 0) {
        snprintf(err, errlen, "in-cluster: %s (is automountServiceAccountToken false?)", why);
        goto fail;
    }
    snprintf(path, sizeof(path), "%s/namespace", sa_dir);
    char *ns = read_file(path, NULL, why, sizeof(why));
    if (ns) {
        ns[strcspn(ns, "\r\n ")] = '\0';
        kc->ns = ns;
    }
    kc->source = strdup("in-cluster service account");
    return 0;
oom:
    snprintf(err, errlen, "out of memory");
fail:
    sl_kubeconfig_free(kc);
    return -1;
}

int sl_kubeconfig_auth_header(sl_kubeconfig_t *kc, char *out, size_t outlen, char *err,
                              size_t errlen)
{
    int rc = 0;
    pthread_mutex_lock(&kc->lock);
    if (kc->token_file) {
        struct stat sb;
        int changed = 1;
        if (stat(kc->token_file, &sb) == 0 && kc->file_token)
            changed = sb.st_dev != kc->tf_dev || sb.st_ino != kc->tf_ino ||
                      sb.st_size != kc->tf_size || sb.st_mtim.tv_sec != kc->tf_mtime.tv_sec ||
                      sb.st_mtim.tv_nsec != kc->tf_mtime.tv_nsec;
        if (changed) {
            char why[128];
            char *t = read_file(kc->token_file, NULL, why, sizeof(why));
            if (t) {
                t[strcspn(t, "\r\n")] = '\0';
                if (!t[0]) {
                    free(t);
                    t = NULL;
                    snprintf(why, sizeof(why), "empty");
                }
            }
            if (!t) {
                snprintf(err, errlen, "token file %s: %s%s", kc->token_file, why,
                         kc->file_token ? " (the token read before is used)" : "");
                rc = -1;
            } else {
                free(kc->file_token);
                kc->file_token = t;
                if (stat(kc->token_file, &sb) == 0) {
                    kc->tf_dev = sb.st_dev;
                    kc->tf_ino = sb.st_ino;
                    kc->tf_size = sb.st_size;
                    kc->tf_mtime = sb.st_mtim;
                }
            }
        }
    }
    const char *tok = kc->token ? kc->token : kc->file_token;
    if (out && outlen) {
        if (tok && snprintf(out, outlen, "Authorization: Bearer %s\r\n", tok) >= (int)outlen) {
            snprintf(err, errlen, "the bearer token is longer than %zu bytes", outlen - 32);
            out[0] = '\0';
            rc = -1;
        } else if (!tok)
            out[0] = '\0';
    }
    pthread_mutex_unlock(&kc->lock);
    return rc;
}

void sl_kubeconfig_free(sl_kubeconfig_t *kc)
{
    free(kc->server);
    free(kc->ca_pem);
    free(kc->ca_name);
    free(kc->token);
    free(kc->token_file);
    free(kc->cert_pem);
    free(kc->key_pem);
    free(kc->cert_name);
    free(kc->ns);
    free(kc->source);
    free(kc->file_token);
    pthread_mutex_destroy(&kc->lock);
    memset(kc, 0, sizeof(*kc));
}
