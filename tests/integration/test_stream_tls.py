"""TLS in the control plane (issue 9), end to end with real processes and
certificates made here with the openssl CLI (a CA, a server certificate
for 127.0.0.1 and localhost, client certificates for node ids "node-a" and
"node-b", and a stranger's CA):

a. a runtime with --controller-ca gets its config over TLS and serves it;
b. with --stream-client-ca: a runtime without a client certificate never
   gets config (the controller counts the refusal), a runtime with
   node-a's certificate and --node-id node-b is refused with
   PERMISSION_DENIED and never registered, node-a with its own certificate
   is served; a certificate from another CA gets no connection at all; a
   CN counts only without SANs; a sluice:fleet: URI SAN binds the fleet;
c. a plaintext runtime against a TLS controller fails cleanly and retries
   with back-off;
d. the REST API over HTTPS (--rest-tls-cert/--rest-tls-key) with curl
   --cacert: create an Api, GET it; plain HTTP on that port gets nothing;
e. bad files are start-up errors naming the flag.

Run: SLUICE_BUILD=build /usr/bin/python3 -m pytest tests/integration/test_stream_tls.py
"""

import json
import os
import shutil
import subprocess
import threading
import socket
import time

import pytest

from backend import Backend
from controller_env import Controller, ManagedRuntime, quickstart
from helpers import Runtime, free_port, http_request, runtime_binary, wait_until

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None or shutil.which("curl") is None,
                                reason="needs the openssl and curl command-line tools")


# --- certificates ----------------------------------------------------------------

def openssl(*args, cwd):
    r = subprocess.run(["openssl"] + list(args), cwd=cwd, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    assert r.returncode == 0, "openssl %s: %s" % (" ".join(args), r.stderr)


def make_ca(d, name):
    openssl("req", "-x509", "-new", "-nodes", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:P-256", "-keyout", name + ".key", "-out", name + ".crt",
            "-days", "30", "-subj", "/CN=%s" % name,
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def make_cert(d, ca, name, cn, san, usage):
    """A P-256 leaf issued by `ca`; san like "DNS:node-a" or None (CN only)."""
    openssl("req", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=%s" % cn, cwd=d)
    ext = os.path.join(d, name + ".ext")
    with open(ext, "w") as f:
        if san:
            f.write("subjectAltName=%s\n" % san)
        f.write("extendedKeyUsage=%s\n" % usage)
    openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt", "-CAkey", ca + ".key",
            "-CAcreateserial", "-out", name + ".crt", "-days", "30", "-extfile", ext, cwd=d)
    os.chmod(os.path.join(d, name + ".key"), 0o600)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("pki"))
    make_ca(d, "ca")
    make_cert(d, "ca", "server", "sluice-controller", "DNS:localhost,IP:127.0.0.1", "serverAuth")
    make_cert(d, "ca", "node-a", "node-a", "DNS:node-a", "clientAuth")
    make_cert(d, "ca", "node-b", "node-b", "DNS:node-b", "clientAuth")
    make_cert(d, "ca", "cn-only", "node-cn", None, "clientAuth")
    make_cert(d, "ca", "edge-a", "edge-a", "DNS:edge-a,URI:sluice:fleet:edge", "clientAuth")
    make_ca(d, "stranger-ca")
    make_cert(d, "stranger-ca", "stranger-a", "node-a", "DNS:node-a", "clientAuth")
    return lambda name: os.path.join(d, name)


# --- processes -----------------------------------------------------------------------

class Env:
    def __init__(self, tmp, pki):
        self.tmp = tmp
        self.pki = pki
        self.ctl = None
        self.rts = []
        self.backends = []

    def controller(self, client_ca=False, extra=(), start=True):
        args = ["--stream-tls-cert", self.pki("server.crt"),
                "--stream-tls-key", self.pki("server.key")]
        if client_ca:
            args += ["--stream-client-ca", self.pki("ca.crt")]
        self.ctl = Controller(self.tmp / "controller", extra_args=args + list(extra))
        if start:
            self.ctl.start()
        return self.ctl

    def runtime(self, node_id, cert=None, ca=True, dirname=None, fleet="default"):
        args = []
        if ca:
            args += ["--controller-ca", self.pki("ca.crt")]
        if cert:
            args += ["--cert", self.pki(cert + ".crt"), "--key", self.pki(cert + ".key")]
        rt = ManagedRuntime(self.tmp / (dirname or node_id), self.ctl.stream_addr, node_id,
                            fleet=fleet, extra_args=args)
        self.rts.append(rt)
        rt.start(wait_ready=False)
        return rt

    def backend(self):
        b = Backend(name="echo").start()
        self.backends.append(b)
        return b

    def close(self):
        problems = []
        for rt in self.rts:
            rt.stop()
            problems += ["runtime %s: %s" % (rt.node_id, p) for p in rt.problems(0)]
        if self.ctl is not None:
            self.ctl.stop()
            problems += self.ctl.problems()
        for b in self.backends:
            b.stop()
        if problems:
            logs = "".join("\n--- runtime %s ---\n%s" % (rt.node_id, rt.log()[-3000:])
                           for rt in self.rts)
            if self.ctl is not None:
                logs += "\n--- controller ---\n%s" % self.ctl.log()[-4000:]
            pytest.fail("\n".join(problems) + logs, pytrace=False)


@pytest.fixture
def env(tmp_path, pki):
    e = Env(tmp_path, pki)
    try:
        yield e
    finally:
        e.close()


def serve_quickstart(ctl, b):
    port = free_port()
    ctl.apply(quickstart(port, b.port, listener_address="127.0.0.1"))
    return port


def wait_served(rt, port, timeout=10.0):
    def ok():
        try:
            return rt.get(port, "/petstore/v1/pets", timeout=1.0)[0] == 200
        except OSError:
            return False
    wait_until(ok, timeout, what=lambda: "runtime %s to serve the config over TLS; log:\n%s"
               % (rt.node_id, rt.log()[-2000:]))


# --- a --------------------------------------------------------------------------------

def test_runtime_gets_config_over_tls(env):
    ctl = env.controller()
    b = env.backend()
    rt = env.runtime("node-a")
    port = serve_quickstart(ctl, b)
    wait_served(rt, port)
    ctl.wait_converged(1)
    rt.wait_ready(5)
    state = rt.controller_state()
    assert state["transport"] == "tls" and state["synced"], state
    assert "TLS" in ctl.log()


# --- b --------------------------------------------------------------------------------

def test_client_certificates_decide_the_node(env):
    ctl = env.controller(client_ca=True)
    b = env.backend()
    port = serve_quickstart(ctl, b)

    # No client certificate: refused on every attempt and counted.
    bare = env.runtime("node-a", dirname="bare")
    wait_until(lambda: ctl.metric("sluice_controller_streams_refused_total") >= 1, 10,
               what=lambda: "a refusal counted; controller log:\n" + ctl.log()[-2000:])
    # The runtime logs the refusal a moment after the controller counted it.
    wait_until(lambda: "UNAUTHENTICATED" in bare.log(), 10,
               what=lambda: "UNAUTHENTICATED in the log:\n" + bare.log()[-2000:])
    assert "--cert and --key" in bare.log(), bare.log()
    # node-a's certificate, --node-id node-b: PERMISSION_DENIED, never registered.
    rogue = env.runtime("node-b", cert="node-a")
    wait_until(lambda: "PERMISSION_DENIED" in rogue.log(), 10,
               what=lambda: "PERMISSION_DENIED in the rogue's log:\n" + rogue.log()[-2000:])
    assert ("node id node-b does not match the client certificate (SANs: DNS:node-a)"
            in rogue.log()), rogue.log()
    assert "node id node-b does not match the client certificate" in ctl.log()
    refused = ctl.metric("sluice_controller_streams_refused_total")
    assert refused >= 2, refused

    # The real node-a is served.
    good = env.runtime("node-a", cert="node-a")
    wait_served(good, port)
    ctl.wait_converged(1)
    assert good.controller_state()["transport"] == "mtls"
    assert "(client certificate DNS:node-a)" in ctl.log()

    rts = ctl.runtimes()
    assert set(rts) == {"node-a"}, rts
    for rt in (bare, rogue):
        assert rt.ready_status() == 503, rt.node_id
        state = rt.controller_state()
        assert not state["synced"] and state["versions"]["listeners"] == "", state
    assert bare.proc.poll() is None and rogue.proc.poll() is None


def test_certificate_of_another_ca_gets_no_connection(env):
    ctl = env.controller(client_ca=True)
    rt = env.runtime("node-a", cert="stranger-a", dirname="stranger")
    wait_until(lambda: "cannot connect" in rt.log(), 10,
               what=lambda: "a failed connection in the log:\n" + rt.log()[-2000:])
    time.sleep(0.5)
    assert ctl.runtimes() == {}
    assert ctl.metric("sluice_controller_runtimes_connected") == 0
    assert rt.ready_status() == 503


def test_cn_counts_when_the_certificate_has_no_san(env):
    ctl = env.controller(client_ca=True)
    b = env.backend()
    port = serve_quickstart(ctl, b)
    rt = env.runtime("node-cn", cert="cn-only")
    wait_served(rt, port)
    assert "node-cn" in ctl.runtimes()


def test_fleet_san_binds_the_fleet(env):
    """A certificate with a URI SAN sluice:fleet:edge may join fleet edge
    only: its holder cannot pull another fleet's snapshot."""
    ctl = env.controller(client_ca=True)
    wrong = env.runtime("edge-a", cert="edge-a", dirname="wrong", fleet="default")
    wait_until(lambda: "PERMISSION_DENIED" in wrong.log(), 10,
               what=lambda: "PERMISSION_DENIED in the log:\n" + wrong.log()[-2000:])
    assert "fleet default is not a fleet of its client certificate" in wrong.log(), wrong.log()
    assert ctl.runtimes() == {}
    wrong.stop()
    right = env.runtime("edge-a", cert="edge-a", dirname="right", fleet="edge")
    wait_until(lambda: "edge-a" in ctl.runtimes(), 10,
               what=lambda: "edge-a registered; log:\n" + right.log()[-2000:])
    assert ctl.runtimes()["edge-a"]["fleet"] == "edge"


# --- c --------------------------------------------------------------------------------

class CountingRelay:
    """A TCP relay to the controller that counts connections."""

    def __init__(self, target_port):
        self.target = target_port
        self.times = []
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(64)
        self.port = self.ls.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            self.times.append(time.monotonic())
            try:
                u = socket.create_connection(("127.0.0.1", self.target), timeout=2)
            except OSError:
                c.close()
                continue
            for a, z in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, z), daemon=True).start()

    @staticmethod
    def _pipe(a, z):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                z.sendall(data)
        except OSError:
            pass
        for s in (a, z):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.closed = True
        self.ls.close()


def test_plaintext_runtime_against_tls_controller_backs_off(env):
    ctl = env.controller()
    relay = CountingRelay(ctl.stream_port)
    try:
        rt = ManagedRuntime(env.tmp / "plain", "127.0.0.1:%d" % relay.port, "node-a")
        env.rts.append(rt)
        rt.start(wait_ready=False)
        time.sleep(3.0)
        attempts = len(relay.times)
    finally:
        relay.close()
    assert rt.proc.poll() is None, "the runtime died: " + rt.log()[-2000:]
    # 250 ms doubling with full jitter: a handful of attempts in 3 s, never
    # a tight loop, never a single attempt.
    assert 2 <= attempts <= 15, (attempts, rt.log()[-2000:])
    log = rt.log()
    assert "if the controller serves TLS, give --controller-ca" in log, log
    assert log.count("cannot connect") == 1, log  # once per outage, not per attempt
    assert rt.ready_status() == 503
    assert ctl.runtimes() == {}


# --- d --------------------------------------------------------------------------------

def curl(pki, port, method, path, body=None, ctype="application/json"):
    args = ["curl", "-sS", "--max-time", "5", "--cacert", pki("ca.crt"), "-X", method,
            "-o", "-", "-w", "\n%{http_code}", "https://127.0.0.1:%d%s" % (port, path)]
    if body is not None:
        args += ["-H", "Content-Type: " + ctype, "--data-binary", "@-"]
    r = subprocess.run(args, input=body, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    assert r.returncode == 0, "curl %s %s: %s" % (method, path, r.stderr)
    text, _, code = r.stdout.rpartition("\n")
    return int(code), text


def test_rest_api_over_https(env, tmp_path):
    ctl = Controller(tmp_path / "controller", extra_args=[
        "--rest-tls-cert", env.pki("server.crt"), "--rest-tls-key", env.pki("server.key")])
    env.ctl = ctl
    ctl.start(wait_ready=False)
    wait_until(lambda: _curl_ok(env.pki, ctl.rest_port, "/readyz"), 10,
               what=lambda: "HTTPS /readyz; log:\n" + ctl.log()[-2000:])
    doc = {"apiVersion": "gateway.sluice.dev/v1alpha1", "kind": "Api",
           "metadata": {"name": "petstore"},
           "spec": {"basePath": "/petstore", "backendRefs": [{"name": "echo"}],
                    "operations": [{"method": "GET", "path": "/pets"}]}}
    code, text = curl(env.pki, ctl.rest_port, "POST", "/api/v1/apis", json.dumps(doc))
    assert code == 201, text
    code, text = curl(env.pki, ctl.rest_port, "GET", "/api/v1/apis/petstore")
    assert code == 200, text
    assert json.loads(text)["spec"]["basePath"] == "/petstore"
    # Plain HTTP on the HTTPS port gets no answer of the API.
    try:
        status, _, _ = http_request("127.0.0.1", ctl.rest_port, "GET", "/api/v1/apis",
                                    timeout=2.0)
    except (OSError, EOFError, AssertionError, ValueError):
        status = None
    assert status is None, status
    # A client that does not trust the CA is refused by its own check.
    r = subprocess.run(["curl", "-sS", "--max-time", "5",
                        "https://127.0.0.1:%d/readyz" % ctl.rest_port],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert r.returncode != 0
    ctl.stop()
    assert key_body(env.pki("server.key")) not in ctl.log().replace("\n", "")


def key_body(path):
    """The first base64 characters of a key file: what must never be logged."""
    with open(path) as f:
        return "".join(f.read().splitlines()[1:-1])[:40]


def _curl_ok(pki, port, path):
    try:
        return curl(pki, port, "GET", path)[0] == 200
    except AssertionError:
        return False


# --- e --------------------------------------------------------------------------------

def run_controller(tmp_path, args):
    c = Controller(tmp_path / "c", extra_args=args)
    r = subprocess.run(c.argv(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=10, env=Runtime.env(), cwd=str(tmp_path))
    return r.returncode, r.stdout


def test_bad_files_are_start_up_errors(tmp_path, pki):
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    cases = [
        (["--stream-tls-cert", str(tmp_path / "missing.crt"), "--stream-tls-key",
          pki("server.key")], "--stream-tls-cert %s: No such file" % (tmp_path / "missing.crt")),
        (["--stream-tls-cert", str(not_pem), "--stream-tls-key", pki("server.key")],
         "--stream-tls-cert %s: no PEM certificate" % not_pem),
        (["--stream-tls-cert", pki("server.crt"), "--stream-tls-key", pki("node-a.key")],
         "--stream-tls-key %s: the private key does not match" % pki("node-a.key")),
        (["--stream-tls-cert", pki("server.crt"), "--stream-tls-key", pki("server.key"),
          "--stream-client-ca", pki("server.key")],
         "--stream-client-ca %s: holds a private key" % pki("server.key")),
        (["--stream-tls-cert", pki("server.crt")], "--stream-tls-cert and --stream-tls-key go"),
        (["--stream-client-ca", pki("ca.crt")], "--stream-client-ca needs --stream-tls-cert"),
        (["--rest-tls-cert", pki("server.crt"), "--rest-tls-key", pki("server.crt")],
         "--rest-tls-key %s: no PEM private key" % pki("server.crt")),
    ]
    for args, want in cases:
        rc, out = run_controller(tmp_path, args)
        assert rc != 0 and want in out, (args, rc, out)
        for key in ("server.key", "node-a.key"):
            assert key_body(pki(key)) not in out.replace("\n", ""), out
    unreadable = tmp_path / "unreadable.key"
    shutil.copy(pki("server.key"), unreadable)
    os.chmod(unreadable, 0)
    if os.geteuid() != 0:
        rc, out = run_controller(tmp_path, ["--stream-tls-cert", pki("server.crt"),
                                            "--stream-tls-key", str(unreadable)])
        assert rc != 0 and "Permission denied" in out, out

    for args, want in [
        (["--controller-ca", str(not_pem)], "--controller-ca %s: no PEM certificate" % not_pem),
        (["--controller-ca", pki("ca.crt"), "--cert", pki("node-a.crt"), "--key",
          pki("node-b.key")], "--key %s: the private key does not match" % pki("node-b.key")),
        (["--cert", pki("node-a.crt"), "--key", pki("node-a.key")],
         "--cert and --key need --controller-ca"),
        (["--controller-ca", pki("ca.crt"), "--cert", pki("node-a.crt")],
         "--cert and --key go together"),
    ]:
        r = subprocess.run([runtime_binary(), "--controller", "127.0.0.1:1", "--admin", "off",
                            "--workers", "1"] + args, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=10, env=Runtime.env())
        assert r.returncode != 0 and want in r.stdout, (args, r.returncode, r.stdout)
