"""Certificates that reference Kubernetes Secrets (issue 12): with
`sluice-controller --source kubernetes`, a Certificate's spec.secretRef
names a Secret of type kubernetes.io/tls (what cert-manager writes); the
controller watches that Secret (list+watch by fieldSelector
metadata.name=NAME), hands the compiler the decoded tls.crt/tls.key as an
inline Certificate, and a runtime terminates TLS with it. A rotated Secret
is served without a restart and without dropping a connection; a missing,
mistyped, undecodable or unparsable Secret fails closed with a named reason
in the Certificate's status while the other Gateways and Apis keep serving.
Outside kubernetes mode a secretRef is stored but refused at compile time,
with the fix in the message.

The API server is tests/integration/kubefake.py (core/v1 Secrets with
fieldSelector=metadata.name, 403 for `forbid_secrets`); TLS clients are
Python's ssl module, checking the served certificate byte for byte.

Run: SLUICE_BUILD=build /usr/bin/python3 -m pytest tests/integration/test_kube_secrets.py
"""

import os
import socket
import ssl
import subprocess
import time

import pytest

from helpers import API_VERSION, api, backend, build_dir, dump_docs, free_port, gateway, wait_until
from kubefake import tls_secret
from test_controller import env  # noqa: F401  (env is a fixture)
from test_kube_source import accepted, kube, kube_controller  # noqa: F401  (kube is a fixture)
from test_tls import make_ca, make_cert, read


@pytest.fixture
def pki(tmp_path):
    d = str(tmp_path / "web-pki")
    os.makedirs(d)
    make_ca(d)
    make_cert(d, "a", "a.example")
    make_cert(d, "a2", "a.example")  # the renewed certificate (cert-manager's rotation)
    return d


def cert_ref(name, secret, namespace=None):
    ref = {"name": secret}
    if namespace:
        ref["namespace"] = namespace
    return {"apiVersion": API_VERSION, "kind": "Certificate", "metadata": {"name": name},
            "spec": {"secretRef": ref}}


def https_gateway(port, cert, name="secure"):
    gw = gateway(port, name=name)
    listener = gw["spec"]["listeners"][0]
    listener.update({"name": "https", "protocol": "https",
                     "tls": {"certificateRefs": [{"name": cert}]}})
    return gw


def der(d, base):
    return ssl.PEM_cert_to_DER_cert(read(d, base + ".crt"))


def tls_connect(port, ca):
    ctx = ssl.create_default_context(cafile=ca)
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    return ctx.wrap_socket(raw, server_hostname="a.example")


def get_on(s, path):
    """One keep-alive request on an open TLS connection: the status."""
    s.sendall(("GET %s HTTP/1.1\r\nHost: a.example\r\n\r\n" % path).encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed by the runtime")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int([line.split(b":")[1] for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:")][0])
    while len(body) < length:
        body += s.recv(65536)
    return int(head.split(b" ")[1])


def served_cert(port, ca):
    """The DER certificate a new TLS connection gets, or None when the port
    does not complete a handshake."""
    try:
        with tls_connect(port, ca) as s:
            return s.getpeercert(binary_form=True)
    except (OSError, ssl.SSLError):
        return None


def reason(kube, kind, name):
    return (accepted(kube.status_of(kind, name)) or {}).get("reason")


def test_tls_from_a_secret_and_rotation(env, kube, pki):  # noqa: F811
    ca = os.path.join(pki, "ca.crt")
    echo = env.backend("echo")
    port = free_port()
    kube.put(tls_secret("a-tls", read(pki, "a.crt"), read(pki, "a.key")))
    kube.put(cert_ref("a-example", "a-tls"))
    kube.put(https_gateway(port, "a-example"))
    kube.put(backend("echo", [echo.port]))
    kube.put(api("petstore", "/petstore/v1", "echo"))
    ctl = kube_controller(env, kube)
    env.runtime("rt-secret")
    wait_until(lambda: served_cert(port, ca) == der(pki, "a"), 15.0,
               what="the Secret's certificate served")
    # Only the named Secret was asked for, by a field selector.
    assert kube.requests_matching("/api/v1/namespaces/default/secrets?fieldSelector="
                                  "metadata.name%3Da-tls")
    assert kube.requests_matching("metadata.name%3Da-tls&watch=true&resourceVersion=")
    assert not kube.requests_matching("/api/v1/secrets")
    wait_until(lambda: reason(kube, "Certificate", "a-example") == "Accepted", 10.0,
               what="the Certificate's status Accepted=True")

    # A connection open across the rotation.
    s = tls_connect(port, ca)
    assert get_on(s, "/petstore/v1/pets") == 200
    assert s.getpeercert(binary_form=True) == der(pki, "a")

    # cert-manager renews: the Secret changes, nothing restarts.
    rv = kube.put(tls_secret("a-tls", read(pki, "a2.crt"), read(pki, "a2.key")))
    wait_until(lambda: served_cert(port, ca) == der(pki, "a2"), 15.0,
               what="the renewed certificate served")
    # The Secret's resourceVersion is the input's version (every replica
    # derives the same).
    assert ctl.wait_converged(1, min_version=rv) == rv
    # A write that changes nothing compiled (a label): still the input's
    # version, as a replica started now would derive it.
    relabelled = tls_secret("a-tls", read(pki, "a2.crt"), read(pki, "a2.key"))
    relabelled["metadata"]["labels"] = {"renewed": "yes"}
    rv2 = kube.put(relabelled)
    assert ctl.wait_converged(1, min_version=rv2) == rv2
    # The connection opened before the rotation still works.
    assert get_on(s, "/petstore/v1/pets") == 200
    s.close()
    assert echo.count() >= 2
    # The private key is never shown: not in the controller's API, not in
    # the Certificate's status, not in the log.
    key_line = read(pki, "a2.key").splitlines()[1]
    doc = ctl.get("Certificate", "a-example")
    assert doc["spec"] == {"secretRef": {"name": "a-tls"}}
    assert key_line not in str(kube.status_of("Certificate", "a-example"))
    assert key_line not in ctl.log()


def test_secret_errors_fail_closed(env, kube, pki):  # noqa: F811
    """Missing, wrong type, bad base64, bad PEM, forbidden, deleted: the
    Certificate says why (reason + the Secret and the key), its Gateway is
    left out (its listener serves no wrong or absent certificate), the other
    Gateway and its Api keep serving."""
    ca = os.path.join(pki, "ca.crt")
    echo = env.backend("echo")
    http_port, tls_port = free_port(), free_port()
    kube.put(gateway(http_port))
    kube.put(https_gateway(tls_port, "web"))
    kube.put(cert_ref("web", "web-tls"))
    kube.put(backend("echo", [echo.port]))
    kube.put(api("petstore", "/petstore/v1", "echo"))
    ctl = kube_controller(env, kube)
    rt = env.runtime("rt-errors")

    def http_ok():
        try:
            return rt.get(http_port, "/petstore/v1/pets")[0] == 200
        except OSError:
            return False

    def fails(why, key_words):
        def said():
            cond = accepted(kube.status_of("Certificate", "web")) or {}
            return (cond.get("reason") == why and cond["status"] == "False" and
                    all(w in cond["message"] for w in key_words))
        wait_until(said, 10.0, what=lambda: "Certificate web: reason %s with %r, status %r"
                   % (why, key_words, kube.status_of("Certificate", "web")))
        wait_until(lambda: (accepted(kube.status_of("Gateway", "secure")) or {}).get("status")
                   == "False", 10.0, what="the Gateway left out")
        assert 'Certificate "default/web" not found' in \
            accepted(kube.status_of("Gateway", "secure"))["message"]
        # The runtime closes the listener once the push arrives.
        wait_until(lambda: served_cert(tls_port, ca) is None, 10.0,
                   what="no certificate served on the left-out listener")
        assert http_ok()

    wait_until(http_ok, 15.0, what="the http Gateway served")
    fails("SecretNotFound", ["default/web-tls", "not found", "kubectl create secret tls"])

    wrong = tls_secret("web-tls", read(pki, "a.crt"), read(pki, "a.key"), type_="Opaque")
    kube.put(wrong)
    fails("InvalidSecret", ["default/web-tls", "type Opaque", "kubernetes.io/tls"])

    no_key = tls_secret("web-tls", read(pki, "a.crt"), None)
    kube.put(no_key)
    fails("InvalidSecret", ["default/web-tls", "no data tls.key"])

    bad64 = tls_secret("web-tls", read(pki, "a.crt"), read(pki, "a.key"))
    bad64["data"]["tls.key"] = "not*base64!"
    kube.put(bad64)
    fails("InvalidSecret", ["default/web-tls", "tls.key", "base64"])

    # A key that is not the certificate's: the PEM checks of inline ones.
    make_cert(pki, "other", "other.example")
    mismatch = tls_secret("web-tls", read(pki, "a.crt"), read(pki, "other.key"))
    kube.put(mismatch)
    fails("InvalidSecret", ["default/web-tls", "tls.key"])
    for base in ("a", "other"):
        body = "".join(read(pki, base + ".key").splitlines()[1:-1])
        assert body[:40] not in accepted(kube.status_of("Certificate", "web"))["message"]

    # Fixed: served.
    kube.put(tls_secret("web-tls", read(pki, "a.crt"), read(pki, "a.key")))
    wait_until(lambda: served_cert(tls_port, ca) == der(pki, "a"), 15.0,
               what="the fixed Secret's certificate served")
    wait_until(lambda: reason(kube, "Certificate", "web") == "Accepted", 10.0,
               what="Certificate web accepted")

    # Deleted later: as missing.
    kube.delete("Secret", "web-tls")
    fails("SecretNotFound", ["default/web-tls"])

    # A Secret the controller may not read (RBAC): named, with the 403.
    kube.forbid_secrets.add(("default", "locked"))
    kube.put(cert_ref("web", "locked"))
    fails("SecretUnreadable", ["default/locked", "403"])
    # The Secret no Certificate names any more is not watched.
    wait_until(lambda: "no Certificate names Secret default/web-tls" in ctl.log(), 5.0,
               what="the web-tls watcher stopped")
    assert http_ok()


def test_store_mode_refuses_secret_ref(env, tmp_path):  # noqa: F811
    """The SQLite store accepts a Certificate with secretRef (it is a
    kubectl-compatible store: a manifest written for a cluster can be
    applied), and the compile refuses it at both ends with the fix: the
    Gateway naming it is left out, the other Gateway serves."""
    ctl = env.controller()
    echo = env.backend("echo")
    http_port, tls_port = free_port(), free_port()
    ctl.apply([gateway(http_port), https_gateway(tls_port, "web"), cert_ref("web", "web-tls"),
               backend("echo", [echo.port]), api("petstore", "/petstore/v1", "echo")])
    rt = env.runtime("rt-store")
    def http_ok():
        try:
            return rt.get(http_port, "/petstore/v1/pets")[0] == 200
        except OSError:
            return False
    wait_until(http_ok, 15.0, what="the http Gateway served")

    def cond(kind, name):
        return accepted(ctl.get(kind, name).get("status")) or {}
    wait_until(lambda: cond("Certificate", "web").get("status") == "False", 10.0,
               what="the Certificate refused")
    msg = cond("Certificate", "web")["message"]
    assert "spec.secretRef" in msg and "--source kubernetes" in msg, msg
    assert "use certificate + privateKey, or file" in msg, msg
    gw = cond("Gateway", "secure")
    assert gw.get("status") == "False"
    assert "certificateRefs[0].name" in gw["message"] and "--source kubernetes" in gw["message"]
    assert http_ok()
    # The https listener is not opened at all (no absent certificate served).
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", tls_port), timeout=2).close()


def test_standalone_runtime_refuses_secret_ref(tmp_path):
    """A runtime reading files cannot reach a Secret: the configuration is
    refused, naming the field and the fix."""
    cfg = tmp_path / "sluice.yaml"
    cfg.write_text(dump_docs([https_gateway(free_port(), "web"), cert_ref("web", "web-tls")]))
    r = subprocess.run([os.path.join(build_dir(), "bin", "sluice-runtime"), "--check",
                        "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert ("spec.listeners[0].tls.certificateRefs[0].name: Certificate \"default/web\" uses "
            "secretRef, which needs sluice-controller --source kubernetes; use certificate + "
            "privateKey, or file") in r.stderr, r.stderr
    assert "spec.secretRef: secretRef needs sluice-controller --source kubernetes" in r.stderr


def test_secret_watch_resumes_and_relists(env, kube, pki):  # noqa: F811
    """The Secret's watch is as resilient as the kinds': a dropped
    connection resumes from the last resourceVersion (no new list), an
    expired one (410) lists again; a rotation after each is served."""
    ca = os.path.join(pki, "ca.crt")
    echo = env.backend("echo")
    port = free_port()
    kube.put(tls_secret("a-tls", read(pki, "a.crt"), read(pki, "a.key")))
    kube.put(cert_ref("a-example", "a-tls"))
    kube.put(https_gateway(port, "a-example"))
    kube.put(backend("echo", [echo.port]))
    kube.put(api("petstore", "/petstore/v1", "echo"))
    ctl = kube_controller(env, kube)
    env.runtime("rt-resume")
    wait_until(lambda: served_cert(port, ca) == der(pki, "a"), 15.0,
               what="the Secret's certificate served")
    target = "/api/v1/namespaces/default/secrets?fieldSelector=metadata.name%3Da-tls"

    def secret_lists():
        return [r for r in kube.requests_matching(target) if "watch=true" not in r]

    def secret_watches_from():
        return [int(r.split("resourceVersion=")[1].split("&")[0])
                for r in kube.requests_matching(target + "&watch=true")]
    lists = len(secret_lists())
    rv = kube.bump(20)
    time.sleep(1.0)  # bookmarks move the Secret watch's resourceVersion too
    kube.drop()
    wait_until(lambda: any(v >= rv for v in secret_watches_from()), 10.0,
               what="the Secret's watch resumed from the bookmark's resourceVersion")
    rv = kube.put(tls_secret("a-tls", read(pki, "a2.crt"), read(pki, "a2.key")))
    wait_until(lambda: served_cert(port, ca) == der(pki, "a2"), 15.0,
               what="the rotation after a dropped watch served")
    assert len(secret_lists()) == lists

    kube.expire()
    kube.drop()
    kube.put(tls_secret("a-tls", read(pki, "a.crt"), read(pki, "a.key")))
    wait_until(lambda: served_cert(port, ca) == der(pki, "a"), 15.0,
               what="the rotation after 410 served")
    wait_until(lambda: len(secret_lists()) > lists, 10.0,
               what="the Secret listed again after 410")
    assert "secret default/a-tls" in ctl.log()
