/*
 * controller/kubeconfig.c: a kubeconfig's current context (server, CA from
 * data or a file relative to the kubeconfig, token, tokenFile re-read when
 * it rotates, client certificate), the errors that name the file, the field
 * and the fix, and the in-cluster configuration from the environment and a
 * service account directory.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "kubeconfig.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

static void put(const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/sl-kubeconfig-XXXXXX");
    assert_non_null(mkdtemp(dir));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd);
}

static int load(const char *text, sl_kubeconfig_t *kc, char *err, size_t errlen)
{
    put("config", text);
    char path[256];
    snprintf(path, sizeof(path), "%s/config", dir);
    return sl_kubeconfig_load(kc, path, err, errlen);
}

#define HEAD                                                                                       \
    "apiVersion: v1\nkind: Config\ncurrent-context: c\n"                                           \
    "contexts:\n- name: other\n  context: {cluster: x, user: x}\n"                                 \
    "- name: c\n  context: {cluster: k, user: u, namespace: team}\n"

#define USERS "users:\n- name: u\n  user: {}\n"

static void test_token_and_ca_data(void **state)
{
    (void)state;
    sl_kubeconfig_t kc;
    char err[512] = "", hdr[256];
    /* "-----BEGIN CERTIFICATE-----\n" in base64 */
    assert_int_equal(load(HEAD
                          "clusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:6443/\n"
                          "    certificate-authority-data: "
                          "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==\n"
                          "users:\n- name: u\n  user: {token: abc.def}\n",
                          &kc, err, sizeof(err)),
                     0);
    assert_string_equal(kc.server, "https://127.0.0.1:6443");
    assert_string_equal(kc.ca_pem, "-----BEGIN CERTIFICATE-----\n");
    assert_non_null(strstr(kc.ca_name, "clusters[k].cluster.certificate-authority-data"));
    assert_string_equal(kc.ns, "team");
    assert_int_equal(sl_kubeconfig_auth_header(&kc, hdr, sizeof(hdr), err, sizeof(err)), 0);
    assert_string_equal(hdr, "Authorization: Bearer abc.def\r\n");
    assert_null(kc.cert_pem);
    sl_kubeconfig_free(&kc);
}

static void test_files_relative_and_token_rotation(void **state)
{
    (void)state;
    put("ca.pem", "CA PEM\n");
    put("tok", "first\n");
    put("c.pem", "CERT\n");
    put("k.pem", "KEY\n");
    sl_kubeconfig_t kc;
    char err[512] = "", hdr[256];
    assert_int_equal(load(HEAD "clusters:\n- name: k\n  cluster: {server: 'http://[::1]:80', "
                               "certificate-authority: ca.pem}\n"
                               "users:\n- name: u\n  user: {tokenFile: tok}\n",
                          &kc, err, sizeof(err)),
                     0);
    assert_string_equal(kc.ca_pem, "CA PEM\n");
    assert_int_equal(sl_kubeconfig_auth_header(&kc, hdr, sizeof(hdr), err, sizeof(err)), 0);
    assert_string_equal(hdr, "Authorization: Bearer first\r\n");
    /* A rotated token (kubelet writes a new file and renames it). */
    put("tok.new", "second-longer\n");
    char a[256], b[256];
    snprintf(a, sizeof(a), "%s/tok.new", dir);
    snprintf(b, sizeof(b), "%s/tok", dir);
    assert_int_equal(rename(a, b), 0);
    assert_int_equal(sl_kubeconfig_auth_header(&kc, hdr, sizeof(hdr), err, sizeof(err)), 0);
    assert_string_equal(hdr, "Authorization: Bearer second-longer\r\n");
    /* Gone: the last token is kept, the failure said. */
    assert_int_equal(unlink(b), 0);
    assert_int_equal(sl_kubeconfig_auth_header(&kc, hdr, sizeof(hdr), err, sizeof(err)), -1);
    assert_non_null(strstr(err, "tok"));
    assert_string_equal(hdr, "Authorization: Bearer second-longer\r\n");
    sl_kubeconfig_free(&kc);
}

static void expect_error(const char *text, const char *want1, const char *want2)
{
    sl_kubeconfig_t kc;
    char err[512] = "";
    assert_int_equal(load(text, &kc, err, sizeof(err)), -1);
    if (!strstr(err, want1) || (want2 && !strstr(err, want2)))
        fail_msg("error \"%s\" lacks \"%s\" / \"%s\"", err, want1, want2 ? want2 : "");
    assert_non_null(strstr(err, dir)); /* names the file */
}

static void test_errors_name_field_and_fix(void **state)
{
    (void)state;
    expect_error("apiVersion: v1\nclusters: []\n", "current-context is not set", "use-context");
    expect_error(HEAD "clusters: []\n", "cluster \"k\" is not in clusters[]", NULL);
    expect_error(HEAD "clusters:\n- name: k\n  cluster: {server: 'ftp://x'}\n" USERS,
                 "clusters[k].cluster.server", "https://");
    expect_error(HEAD "clusters:\n- name: k\n  cluster: {server: 'https://x', "
                      "insecure-skip-tls-verify: true}\n" USERS,
                 "insecure-skip-tls-verify", "certificate-authority-data");
    expect_error(HEAD "clusters:\n- name: k\n  cluster: {server: 'https://x', "
                      "certificate-authority-data: '***'}\n" USERS,
                 "certificate-authority-data is not valid base64", NULL);
    expect_error(HEAD "clusters:\n- name: k\n  cluster: {server: 'https://x', "
                      "certificate-authority: nothere.pem}\n" USERS,
                 "certificate-authority", "No such file");
    expect_error(HEAD "clusters:\n- name: k\n  cluster: {server: 'https://x'}\n"
                      "users:\n- name: u\n  user:\n    exec: {command: aws}\n",
                 "users[u].user", "exec and auth-provider plugins are not supported");
    expect_error(HEAD "clusters:\n- name: k\n  cluster: {server: 'https://x'}\n"
                      "users:\n- name: u\n  user: {client-certificate-data: Q0VSVAo=}\n",
                 "client-key", NULL);
    expect_error(HEAD "clusters:\n- name: k\n  cluster: {server: 'https://x'}\n"
                      "users:\n- name: u\n  user: {client-certificate: c.pem, client-key: k.pem}\n",
                 "users[u].user.client-certificate", "no PEM certificate could be read");
    expect_error("key: [unclosed\n", "not valid YAML", NULL);
    sl_kubeconfig_t kc;
    char err[512];
    assert_int_equal(sl_kubeconfig_load(&kc, "/nonexistent/kubeconfig", err, sizeof(err)), -1);
    assert_non_null(strstr(err, "--kubeconfig /nonexistent/kubeconfig: No such file"));
}

static void test_in_cluster(void **state)
{
    (void)state;
    sl_kubeconfig_t kc;
    char err[512] = "", hdr[256];
    unsetenv("KUBERNETES_SERVICE_HOST");
    assert_int_equal(sl_kubeconfig_in_cluster(&kc, dir, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "--kubeconfig"));
    setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
    setenv("KUBERNETES_SERVICE_PORT", "443", 1);
    assert_int_equal(sl_kubeconfig_in_cluster(&kc, dir, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "ca.crt"));
    put("ca.crt", "CA\n");
    put("token", "sa-token\n");
    put("namespace", "sluice\n");
    assert_int_equal(sl_kubeconfig_in_cluster(&kc, dir, err, sizeof(err)), 0);
    assert_string_equal(kc.server, "https://10.96.0.1:443");
    assert_string_equal(kc.ns, "sluice");
    assert_int_equal(sl_kubeconfig_auth_header(&kc, hdr, sizeof(hdr), err, sizeof(err)), 0);
    assert_string_equal(hdr, "Authorization: Bearer sa-token\r\n");
    sl_kubeconfig_free(&kc);
    setenv("KUBERNETES_SERVICE_HOST", "fd00::1", 1);
    assert_int_equal(sl_kubeconfig_in_cluster(&kc, dir, err, sizeof(err)), 0);
    assert_string_equal(kc.server, "https://[fd00::1]:443");
    sl_kubeconfig_free(&kc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_and_ca_data),
        cmocka_unit_test(test_files_relative_and_token_rotation),
        cmocka_unit_test(test_errors_name_field_and_fix),
        cmocka_unit_test(test_in_cluster),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
