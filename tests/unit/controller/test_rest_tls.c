/*
 * Unit tests of the REST API's generated TLS (controller/rest_tls.c): name
 * canonicalisation and checks, the names wanted for a --rest address, and
 * sl_rest_tls_prepare / sl_rest_tls_write_kubeconfig on a temporary
 * directory: issue, reuse, reissue under the same CA, a new CA when its key
 * is gone, file modes, the kubeconfig's content.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../../../controller/rest_tls.c"

#include <ftw.h>

static char dir[256];

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/sl-rest-tls-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

static char *slurp(const char *name)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = calloc(1, 65536);
    size_t n = fread(buf, 1, 65535, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static int mode_of(const char *name)
{
    char path[512];
    struct stat sb;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return stat(path, &sb) == 0 ? (int)(sb.st_mode & 07777) : -1;
}

static void canon_is(const char *in, const char *want)
{
    char out[NAME_LEN];
    if (!want) {
        assert_int_equal(canonical_name(in, out, sizeof(out)), -1);
        return;
    }
    assert_int_equal(canonical_name(in, out, sizeof(out)), 0);
    assert_string_equal(out, want);
}

static void test_names(void **state)
{
    (void)state;
    canon_is("127.0.0.1", "IP:127.0.0.1");
    canon_is("::0001", "IP:::1");
    canon_is("[::1]", "IP:::1");
    canon_is("LocalHost", "DNS:localhost");
    canon_is("*.Example.test", "DNS:*.example.test");
    canon_is("a-b.c9", "DNS:a-b.c9");
    canon_is("", NULL);
    canon_is("-a", NULL);
    canon_is("a-", NULL);
    canon_is("a..b", NULL);
    canon_is("a_b", NULL);
    canon_is("[name]", NULL);
    canon_is("[::1", NULL);
    canon_is("a.*.b", NULL);
    char label[70];
    memset(label, 'a', 64);
    label[64] = '\0';
    canon_is(label, NULL);
    label[63] = '\0';
    canon_is(label, "DNS:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");

    char err[256];
    assert_int_equal(sl_rest_tls_check_san("bad name", err, sizeof(err)), -1);
    assert_non_null(strstr(err, "--rest-tls-san 'bad name': not an IP address or a DNS name"));
    assert_int_equal(sl_rest_tls_check_san("10.0.0.1", err, sizeof(err)), 0);

    assert_true(sl_rest_tls_loopback_host("127.1.2.3"));
    assert_true(sl_rest_tls_loopback_host("::1"));
    assert_true(sl_rest_tls_loopback_host("localhost"));
    assert_false(sl_rest_tls_loopback_host("0.0.0.0"));
    assert_false(sl_rest_tls_loopback_host("10.0.0.1"));
}

static bool has(const names_t *ns, const char *name)
{
    for (size_t i = 0; i < ns->n; i++)
        if (strcmp(ns->v[i], name) == 0)
            return true;
    return false;
}

static void test_wanted_names(void **state)
{
    (void)state;
    names_t *ns = calloc(1, sizeof(*ns));
    char err[256];
    const char *sans[] = {"b.example.test", "10.1.2.3", "B.Example.Test"};
    assert_int_equal(wanted_names("10.1.2.3", sans, 3, ns, err, sizeof(err)), 0);
    assert_true(has(ns, "IP:10.1.2.3"));
    assert_true(has(ns, "IP:127.0.0.1"));
    assert_true(has(ns, "IP:::1"));
    assert_true(has(ns, "DNS:localhost"));
    assert_true(has(ns, "DNS:b.example.test"));
    size_t n = ns->n;
    for (size_t i = 1; i < n; i++) /* sorted, no duplicates */
        assert_true(strcmp(ns->v[i - 1], ns->v[i]) < 0);
    assert_int_equal(wanted_names("0.0.0.0", NULL, 0, ns, err, sizeof(err)), 0);
    assert_false(has(ns, "IP:0.0.0.0"));
    assert_int_equal(wanted_names("::", NULL, 0, ns, err, sizeof(err)), 0);
    assert_false(has(ns, "IP:::"));
    free(ns);
}

static void prepare(const char *const *sans, size_t n, char **cert, char **ca)
{
    char *key = NULL, err[512] = "";
    int rc = sl_rest_tls_prepare(dir, "127.0.0.1:0", sans, n, cert, &key, ca, err, sizeof(err));
    if (rc != 0)
        fail_msg("prepare: %s", err);
    assert_non_null(strstr(*cert, "BEGIN CERTIFICATE"));
    assert_non_null(strstr(key, "PRIVATE KEY"));
    sl_tls_files_free(key);
}

static void test_issue_reuse_reissue(void **state)
{
    (void)state;
    char *cert1, *ca1, *cert2, *ca2, *cert3, *ca3, *cert4, *ca4;
    prepare(NULL, 0, &cert1, &ca1);
    assert_int_equal(mode_of(SL_REST_TLS_CA_CERT), 0644);
    assert_int_equal(mode_of(SL_REST_TLS_CA_KEY), 0600);
    assert_int_equal(mode_of(SL_REST_TLS_SERVER_CERT), 0644);
    assert_int_equal(mode_of(SL_REST_TLS_SERVER_KEY), 0600);

    /* The same names: reused as they are. */
    prepare(NULL, 0, &cert2, &ca2);
    assert_string_equal(cert1, cert2);
    assert_string_equal(ca1, ca2);

    /* Another name: a new server certificate under the same CA. */
    const char *sans[] = {"gw.example.test"};
    prepare(sans, 1, &cert3, &ca3);
    assert_string_not_equal(cert1, cert3);
    assert_string_equal(ca1, ca3);
    BIO *b = BIO_new_mem_buf(cert3, -1);
    X509 *x = PEM_read_bio_X509(b, NULL, NULL, NULL);
    BIO_free(b);
    b = BIO_new_mem_buf(ca3, -1);
    X509 *cax = PEM_read_bio_X509(b, NULL, NULL, NULL);
    BIO_free(b);
    assert_non_null(x);
    assert_non_null(cax);
    assert_int_equal(X509_verify(x, X509_get0_pubkey(cax)), 1);
    assert_int_equal(X509_check_host(x, "gw.example.test", 0, 0, NULL), 1);
    assert_int_equal(X509_check_ip_asc(x, "::1", 0), 1);
    assert_int_equal(X509_check_host(x, "other.example.test", 0, 0, NULL), 0);
    assert_int_equal(X509_check_ca(cax), 1);
    assert_int_equal(X509_check_ca(x), 0);
    X509_free(x);
    X509_free(cax);

    /* The CA's key gone: a new CA and a new server certificate. */
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, SL_REST_TLS_CA_KEY);
    assert_int_equal(unlink(path), 0);
    prepare(sans, 1, &cert4, &ca4);
    assert_string_not_equal(ca1, ca4);
    assert_string_not_equal(cert3, cert4);
    char *on_disk = slurp(SL_REST_TLS_CA_CERT);
    assert_string_equal(on_disk, ca4);
    free(on_disk);

    char *all[] = {cert1, ca1, cert2, ca2, cert3, ca3, cert4, ca4};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        sl_tls_files_free(all[i]);
}

static void test_kubeconfig(void **state)
{
    (void)state;
    char path[512], err[256];
    const char *ca = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    assert_int_equal(sl_rest_tls_write_kubeconfig(dir, "0.0.0.0:9090", 40123, ca, "tok-1", path,
                                                  sizeof(path), err, sizeof(err)),
                     0);
    assert_int_equal(mode_of(SL_REST_TLS_KUBECONFIG), 0600);
    char *text = slurp(SL_REST_TLS_KUBECONFIG);
    sl_errors_t errs;
    sl_errors_init(&errs);
    json_t *docs = sl_yaml_to_json(text, strlen(text), "kubeconfig", &errs);
    assert_non_null(docs);
    json_t *kc = json_array_get(docs, 0);
    assert_string_equal(json_string_value(json_object_get(kc, "current-context")), "sluice");
    json_t *cluster =
        json_object_get(json_array_get(json_object_get(kc, "clusters"), 0), "cluster");
    assert_string_equal(json_string_value(json_object_get(cluster, "server")),
                        "https://127.0.0.1:40123");
    const char *b64 = json_string_value(json_object_get(cluster, "certificate-authority-data"));
    unsigned char decoded[256];
    int n = EVP_DecodeBlock(decoded, (const unsigned char *)b64, (int)strlen(b64));
    assert_true(n >= (int)strlen(ca));
    assert_memory_equal(decoded, ca, strlen(ca));
    json_t *user = json_object_get(json_array_get(json_object_get(kc, "users"), 0), "user");
    assert_string_equal(json_string_value(json_object_get(user, "token")), "tok-1");
    json_decref(docs);
    sl_errors_free(&errs);
    free(text);

    assert_int_equal(sl_rest_tls_write_kubeconfig(dir, "[::]:9090", 1, ca, "t", path, sizeof(path),
                                                  err, sizeof(err)),
                     0);
    text = slurp(SL_REST_TLS_KUBECONFIG);
    assert_non_null(strstr(text, "https://[::1]:1"));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_wanted_names),
        cmocka_unit_test_setup_teardown(test_issue_reuse_reissue, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kubeconfig, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
