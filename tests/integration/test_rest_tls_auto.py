"""The REST API's generated TLS (issue 12): with --admin-token-file and no
--rest-tls-cert the controller issues itself a CA and a server certificate
in --data-dir, serves HTTPS and writes DATA_DIR/kubeconfig, because kubectl
sends a bearer token only over https://.

a. the kubeconfig works with Python's ssl (the CA from the kubeconfig
   verifies the server, the names are those asked for, the token is
   accepted, no token is a 401) and with the real kubectl;
b. a restart reuses the CA and the server certificate; a changed
   --rest-tls-san reissues the server certificate under the same CA;
   deleting the files rotates them; files have modes 0600/0644;
c. --rest-plain-http keeps plain HTTP with a token on loopback only, and
   the flags' misuses are start-up errors naming the flag.

Run: SLUICE_BUILD=build /usr/bin/python3 -m pytest tests/integration/test_rest_tls_auto.py
"""

import base64
import http.client
import json
import os
import socket
import ssl
import stat
import subprocess

import pytest
import yaml

from controller_env import Controller
from helpers import Runtime, http_request, wait_until

TOKEN = "s3cr3t-token-for-the-tests"
FILES = {"rest-ca.crt": 0o644, "rest-ca.key": 0o600, "rest-server.crt": 0o644,
         "rest-server.key": 0o600, "kubeconfig": 0o600}
KUBECTL = "/usr/bin/kubectl"
QUICKSTART = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "quickstart.yaml")


class TlsController(Controller):
    """A controller with a token and no certificate: HTTPS, trusted
    through the CA of the kubeconfig it writes."""

    def __init__(self, workdir, extra_args=()):
        token_file = os.path.join(str(workdir), "token")
        os.makedirs(str(workdir), exist_ok=True)
        with open(token_file, "w") as f:
            f.write(TOKEN + "\n")
        super().__init__(workdir, extra_args=["--admin-token-file", token_file] + list(extra_args))

    @property
    def kubeconfig_path(self):
        return os.path.join(self.data_dir, "kubeconfig")

    def kubeconfig(self):
        with open(self.kubeconfig_path) as f:
            return yaml.safe_load(f)

    def ca_pem(self):
        kc = self.kubeconfig()
        return base64.b64decode(kc["clusters"][0]["cluster"]["certificate-authority-data"]).decode()

    def context(self):
        return ssl.create_default_context(cadata=self.ca_pem())

    def https(self, method, path, token=TOKEN, server_hostname="127.0.0.1", body=None):
        ctx = self.context()
        sock = socket.create_connection(("127.0.0.1", self.rest_port), timeout=5)
        tls = ctx.wrap_socket(sock, server_hostname=server_hostname)
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.rest_port, timeout=5)
            conn.sock = tls
            headers = {"Authorization": "Bearer " + token} if token else {}
            if body is not None:
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=body, headers=headers)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            tls.close()

    def wait_ready(self, timeout=15.0):
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError("sluice-controller exited with %s; log:\n%s"
                                     % (self.proc.returncode, self.log()[-4000:]))
            try:
                return self.https("GET", "/readyz", token=None)[0] == 200
            except (OSError, ValueError, KeyError, TypeError, ssl.SSLError):
                return False
        wait_until(ready, timeout, what=lambda: "HTTPS /readyz; log:\n" + self.log()[-3000:])


@pytest.fixture
def ctls():
    started = []
    yield started
    problems = []
    for c in started:
        c.stop()
        problems += c.problems()
    assert not problems, problems


def start(ctls, tmp_path, extra_args=()):
    c = TlsController(tmp_path / "controller", extra_args=extra_args)
    ctls.append(c)
    return c.start()


def read(path):
    with open(path, "rb") as f:
        return f.read()


def peer_names(ctl):
    """The server certificate's subjectAltNames, as ("DNS"|"IP Address", value)."""
    ctx = ctl.context()
    with socket.create_connection(("127.0.0.1", ctl.rest_port), timeout=5) as s:
        with ctx.wrap_socket(s, server_hostname="127.0.0.1") as tls:
            return set(tls.getpeercert()["subjectAltName"])


def kubectl(ctl, tmp_path, *args):
    return subprocess.run([KUBECTL, "--kubeconfig", ctl.kubeconfig_path, "--cache-dir",
                           str(tmp_path / "kcache"), "--request-timeout", "10s"] + list(args),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)


# --- a ------------------------------------------------------------------------------

def test_kubeconfig_works_with_python_ssl(ctls, tmp_path):
    ctl = start(ctls, tmp_path, ["--rest-tls-san", "api.example.test",
                                 "--rest-tls-san", "192.0.2.7"])
    kc = ctl.kubeconfig()
    assert kc["apiVersion"] == "v1" and kc["kind"] == "Config", kc
    assert kc["current-context"] == "sluice", kc
    assert kc["contexts"][0]["name"] == "sluice", kc
    assert kc["contexts"][0]["context"]["cluster"] == "sluice", kc
    assert kc["contexts"][0]["context"]["user"] == "sluice", kc
    assert kc["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:%d" % ctl.rest_port, kc
    assert kc["users"][0]["user"]["token"] == TOKEN
    assert ctl.ca_pem() == read(os.path.join(ctl.data_dir, "rest-ca.crt")).decode()
    assert "export KUBECONFIG=%s" % ctl.kubeconfig_path in ctl.log(), ctl.log()

    # The token is accepted over HTTPS, its absence or a wrong one is a 401.
    status, body = ctl.https("GET", "/api/v1/apis")
    assert status == 200, body
    assert json.loads(body)["items"] == []
    assert ctl.https("GET", "/api/v1/apis", token=None)[0] == 401
    assert ctl.https("GET", "/api/v1/apis", token="wrong")[0] == 401
    doc = {"apiVersion": "gateway.sluice.dev/v1alpha1", "kind": "Backend",
           "metadata": {"name": "echo"}, "spec": {"endpoints": [{"address": "127.0.0.1",
                                                                   "port": 9}]}}
    status, body = ctl.https("POST", "/api/v1/backends", body=json.dumps(doc))
    assert status == 201, body

    # The names: the listen address, loopback, localhost, the host name and
    # every --rest-tls-san; anything else fails verification.
    names = peer_names(ctl)
    want = {("IP Address", "127.0.0.1"), ("DNS", "localhost"), ("DNS", "api.example.test"),
            ("IP Address", "192.0.2.7")}
    assert want <= names, names
    assert any(k == "IP Address" and v.strip().replace("0:", "").strip(":") in ("1", "::1")
               for k, v in names), names  # ::1, spelt 0:0:0:0:0:0:0:1 by Python
    hostname = socket.gethostname().lower()
    assert ("DNS", hostname) in names, names
    for good in ("localhost", "::1", "api.example.test", "192.0.2.7", hostname):
        assert ctl.https("GET", "/healthz", token=None, server_hostname=good)[0] == 200, good
    with pytest.raises(ssl.SSLCertVerificationError):
        ctl.https("GET", "/healthz", token=None, server_hostname="other.example.test")

    # Plain HTTP on the port gets no answer of the API.
    try:
        status = http_request("127.0.0.1", ctl.rest_port, "GET", "/api/v1/apis",
                              headers={"Authorization": "Bearer " + TOKEN}, timeout=2.0)[0]
    except (OSError, EOFError, AssertionError, ValueError):
        status = None
    assert status is None, status

    # A context that trusts the system CAs only does not trust this CA.
    with pytest.raises(ssl.SSLCertVerificationError):
        with socket.create_connection(("127.0.0.1", ctl.rest_port), timeout=5) as s:
            ssl.create_default_context().wrap_socket(s, server_hostname="127.0.0.1")

    for name, mode in FILES.items():
        st = os.stat(os.path.join(ctl.data_dir, name))
        assert stat.S_IMODE(st.st_mode) == mode, (name, oct(st.st_mode))
    # No key text in the log.
    key = "".join(read(os.path.join(ctl.data_dir, "rest-server.key")).decode()
                  .splitlines()[1:-1])[:40]
    assert key not in ctl.log().replace("\n", "")
    assert TOKEN not in ctl.log()


@pytest.mark.skipif(not os.path.exists(KUBECTL), reason="no %s on this machine" % KUBECTL)
def test_kubectl_over_the_generated_kubeconfig(ctls, tmp_path):
    ctl = start(ctls, tmp_path)
    r = kubectl(ctl, tmp_path, "get", "--raw", "/healthz")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() != "", r.stdout
    # A path behind the token: kubectl sent it (over https it does).
    r = kubectl(ctl, tmp_path, "get", "--raw", "/api/v1/apis")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["items"] == [], r.stdout
    # Without the token: 401, which kubectl reports as not logged in.
    r = kubectl(ctl, tmp_path, "--token", "wrong", "get", "--raw", "/api/v1/apis")
    assert r.returncode != 0 and "logged in" in r.stderr, (r.stdout, r.stderr)
    # kubectl verifies the server against the kubeconfig's CA and names.
    r = kubectl(ctl, tmp_path, "--tls-server-name", "other.example.test", "get", "--raw",
                "/healthz")
    assert r.returncode != 0 and "x509" in r.stderr, (r.stdout, r.stderr)
    # `kubectl version` reaches the server over TLS with the token.
    r = kubectl(ctl, tmp_path, "version", "-o", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["serverVersion"]["minor"] == "32", r.stdout
    # The Kubernetes-compatible API through the generated kubeconfig, as
    # `make run` prints it: apply with strict validation, then get.
    r = kubectl(ctl, tmp_path, "apply", "-f", QUICKSTART)
    assert r.returncode == 0, r.stdout + r.stderr
    r = kubectl(ctl, tmp_path, "get", "apis")
    assert r.returncode == 0 and "petstore" in r.stdout, r.stdout + r.stderr
    # The wrong token: kubectl's own words for a 401 Status.
    r = kubectl(ctl, tmp_path, "--token", "wrong", "get", "apis")
    assert r.returncode != 0 and "logged in" in r.stderr, (r.stdout, r.stderr)


# --- b ------------------------------------------------------------------------------

def test_restart_reuses_and_a_changed_san_reissues_under_the_same_ca(ctls, tmp_path):
    ctl = start(ctls, tmp_path)
    files = {n: read(os.path.join(ctl.data_dir, n)) for n in FILES}
    old_ca = ctl.ca_pem()
    assert "issued a new CA" in ctl.log()
    ctl.stop()

    # Same flags: everything reused.
    ctl.start()
    for n in ("rest-ca.crt", "rest-ca.key", "rest-server.crt", "rest-server.key"):
        assert read(os.path.join(ctl.data_dir, n)) == files[n], n
    assert ctl.log().count("issued a new CA") == 1, ctl.log()
    assert "reusing" in ctl.log()
    ctl.stop()

    # A new --rest-tls-san: a new server certificate, the same CA, so the
    # kubeconfig a client had still verifies it.
    ctl.extra_args += ["--rest-tls-san", "gw.example.test"]
    ctl.start()
    assert read(os.path.join(ctl.data_dir, "rest-ca.crt")) == files["rest-ca.crt"]
    assert read(os.path.join(ctl.data_dir, "rest-ca.key")) == files["rest-ca.key"]
    assert read(os.path.join(ctl.data_dir, "rest-server.crt")) != files["rest-server.crt"]
    assert read(os.path.join(ctl.data_dir, "rest-server.key")) != files["rest-server.key"]
    assert ("DNS", "gw.example.test") in peer_names(ctl)
    ctx = ssl.create_default_context(cadata=old_ca)
    with socket.create_connection(("127.0.0.1", ctl.rest_port), timeout=5) as s:
        with ctx.wrap_socket(s, server_hostname="gw.example.test"):
            pass
    assert ctl.log().count("issued a new CA") == 1, ctl.log()
    ctl.stop()

    # A server key that does not parse: reissued, the CA kept.
    with open(os.path.join(ctl.data_dir, "rest-server.key"), "w") as f:
        f.write("garbage\n")
    ctl.start()
    assert read(os.path.join(ctl.data_dir, "rest-ca.crt")) == files["rest-ca.crt"]
    assert ctl.https("GET", "/api/v1/apis")[0] == 200
    ctl.stop()

    # Rotation: delete the CA's files; a new CA, a new server certificate,
    # a kubeconfig with the new CA; the old CA no longer verifies.
    for n in ("rest-ca.crt", "rest-ca.key"):
        os.unlink(os.path.join(ctl.data_dir, n))
    os.chmod(os.path.join(ctl.data_dir, "rest-server.crt"), 0o600)
    ctl.start()
    assert ctl.ca_pem() != old_ca
    assert ctl.log().count("issued a new CA") == 2, ctl.log()
    assert ctl.https("GET", "/api/v1/apis")[0] == 200
    with pytest.raises(ssl.SSLCertVerificationError):
        with socket.create_connection(("127.0.0.1", ctl.rest_port), timeout=5) as s:
            ssl.create_default_context(cadata=old_ca).wrap_socket(s, server_hostname="127.0.0.1")
    for name, mode in FILES.items():
        st = os.stat(os.path.join(ctl.data_dir, name))
        assert stat.S_IMODE(st.st_mode) == mode, (name, oct(st.st_mode))


# --- c ------------------------------------------------------------------------------

def test_plain_http_opt_out_on_loopback(ctls, tmp_path):
    c = Controller(tmp_path / "plain", extra_args=["--rest-plain-http"])
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    c.extra_args += ["--admin-token-file", str(token_file)]
    ctls.append(c)
    c.start()  # plain HTTP /readyz
    assert c.rest("GET", "/api/v1/apis")[0] == 401
    assert c.rest("GET", "/api/v1/apis", headers={"Authorization": "Bearer " + TOKEN})[0] == 200
    assert not os.path.exists(os.path.join(c.data_dir, "kubeconfig"))
    assert not os.path.exists(os.path.join(c.data_dir, "rest-ca.key"))


def test_flag_misuse_is_a_start_up_error(tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    tok = ["--admin-token-file", str(token)]
    cases = [
        (tok + ["--rest-tls-san", "bad_name!"], "--rest-tls-san 'bad_name!': not an IP address"),
        (tok + ["--rest-tls-san", "[::1"], "--rest-tls-san '[::1': not an IP address"),
        (["--rest-tls-san", "a.example.test"],
         "--rest-tls-san names the certificate the controller issues itself"),
        (tok + ["--rest-plain-http", "--rest-tls-san", "a.example.test"],
         "without --rest-plain-http"),
        (["--rest-plain-http", "--rest-tls-cert", "x.crt", "--rest-tls-key", "x.key"],
         "--rest-plain-http and --rest-tls-cert contradict"),
        (tok + ["--rest-plain-http", "--rest", "0.0.0.0:0"],
         "--rest-plain-http on the non-loopback --rest 0.0.0.0:0 would send the admin token"),
    ]
    for args, want in cases:
        c = Controller(tmp_path / "c", extra_args=args)
        argv = [a for a in c.argv()]
        if "--rest" in args:  # the case's own --rest replaces the default
            i = argv.index("--rest")
            del argv[i:i + 2]
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=10, env=Runtime.env(), cwd=str(tmp_path))
        assert r.returncode == 2 and want in r.stdout, (args, r.returncode, r.stdout)
        assert "Sanitizer" not in r.stdout, r.stdout
