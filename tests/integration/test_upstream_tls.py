"""TLS to upstreams (issue 9): a Backend with `tls` reaches its endpoints
over TLS, always verifying the certificate (against the Backend's CA or the
system's) and the name (`sni`, else the endpoint's address); optional client
certificates (mTLS to the backend); pooled TLS connections are reused. The
origin is the suite's echo server behind Python's ssl module.
"""

import os
import ssl

import pytest

from backend import Backend, pattern_bytes
from helpers import api, backend, free_port, gateway, request
from test_tls import certificate, make_ca, make_cert, openssl, read


def make_ip_cert(d, name, ip, ca="ca"):
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + ip, cwd=d)
    ext = os.path.join(d, name + ".ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:%s\n" % ip)
    openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt", "-CAkey", ca + ".key",
            "-CAcreateserial", "-out", name + ".crt", "-days", "30", "-extfile", ext, cwd=d)


@pytest.fixture
def pki(tmp_path):
    d = str(tmp_path / "pki")
    os.makedirs(d)
    make_ca(d)
    make_ca(d, "other-ca")
    make_cert(d, "origin", "origin.example")
    make_ip_cert(d, "origin-ip", "127.0.0.1")
    make_cert(d, "gw-client", "gateway.example", client=True)
    return d


@pytest.fixture
def tls_origins(pki):
    started = []

    def make(cert="origin", require_client_ca=None):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(pki, cert + ".crt"), os.path.join(pki, cert + ".key"))
        if require_client_ca:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(os.path.join(pki, require_client_ca + ".crt"))
        b = Backend(ssl_context=ctx).start()
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


def start(runtimes, origin, tls, extra=()):
    port = free_port()
    docs = [gateway(port), backend("secure", [origin.port], tls=tls),
            api("t", "/t", "secure")] + list(extra)
    return runtimes(docs), port


def test_tls_to_the_origin_with_sni_and_a_private_ca(runtimes, tls_origins, pki):
    o = tls_origins()
    rt, port = start(runtimes, o, {"sni": "origin.example", "caBundle": read(pki, "ca.crt")})
    for _ in range(20):
        r = request(port, "GET", "/t/echo")
        assert r.status == 200, r.body[:300]
    # POST bodies too, and pooled TLS connections are reused.
    body = pattern_bytes(200000)
    r = request(port, "POST", "/t/echo", body=body)
    assert r.status == 200 and r.json()["body_length"] == len(body)
    assert o.connections <= 3, o.connections
    assert not o.tls_errors


def test_ip_endpoint_verified_against_its_ip_san(runtimes, tls_origins, pki):
    o = tls_origins(cert="origin-ip")
    rt, port = start(runtimes, o, {"caBundle": read(pki, "ca.crt")})
    assert request(port, "GET", "/t/echo").status == 200


@pytest.mark.parametrize("tls", [
    {"sni": "origin.example"},                                  # system CAs do not know it
    {"sni": "wrong.example", "caBundle": "CA"},                 # name mismatch
    {"sni": "origin.example", "caBundle": "OTHER"},             # another CA
])
def test_unverifiable_origin_is_never_used(runtimes, tls_origins, pki, tls):
    o = tls_origins()
    tls = dict(tls)
    if tls.get("caBundle") == "CA":
        tls["caBundle"] = read(pki, "ca.crt")
    elif tls.get("caBundle") == "OTHER":
        tls["caBundle"] = read(pki, "other-ca.crt")
    rt, port = start(runtimes, o, tls)
    r = request(port, "GET", "/t/echo")
    assert r.status == 502, r.body[:300]
    assert r.json()["error"]["code"] == "upstream_connect_failed"
    assert o.count() == 0  # not one request reached it
    assert "TLS handshake failed" in rt.log()


def test_client_certificate_to_the_origin(runtimes, tls_origins, pki):
    o = tls_origins(require_client_ca="ca")
    cert_doc = certificate(pki, "gw-client", "gw-client")
    tls = {"sni": "origin.example", "caBundle": read(pki, "ca.crt"),
           "clientCertificateRef": {"name": "gw-client"}}
    rt, port = start(runtimes, o, tls, extra=[cert_doc])
    assert request(port, "GET", "/t/echo").status == 200
    subject = dict(x[0] for x in o.tls_peers[0]["subject"])
    assert subject["commonName"] == "gateway.example"
    # Without the client certificate the origin refuses the handshake.
    o2 = tls_origins(require_client_ca="ca")
    port2 = free_port()
    runtimes([gateway(port2), backend("s2", [o2.port], tls={"sni": "origin.example",
                                                            "caBundle": read(pki, "ca.crt")}),
              api("t2", "/t", "s2")])
    assert request(port2, "GET", "/t/echo").status == 502


def test_unusable_ca_refuses_the_config(runtimes, tls_origins, pki, tmp_path):
    o = tls_origins()
    port = free_port()
    good = [gateway(port), backend("secure", [o.port], tls={"sni": "origin.example",
                                                            "caBundle": read(pki, "ca.crt")}),
            api("t", "/t", "secure")]
    rt = runtimes(good)
    bad = [gateway(port), backend("secure", [o.port], tls={"sni": "origin.example",
                                                           "caFile": str(tmp_path / "nope.pem")}),
           api("t", "/t", "secure")]
    rt.reload_invalid(bad)
    assert request(port, "GET", "/t/echo").status == 200  # the old config serves on
