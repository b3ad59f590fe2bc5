"""TLS at the edge (issue 9): https listeners with certificates chosen by
SNI, HTTP/1.1 and HTTP/2 (ALPN) over TLS through the same request path,
client certificates (mTLS) passed to the origin in headers a client cannot
forge, certificates that hot-swap with the config without closing the
listener or established connections, and configs whose certificates cannot
be used refused as a whole (fail closed). Certificates are made with the
openssl command line inside the test; clients are Python's ssl module,
python3-h2 and curl.
"""

import json
import os
import socket
import ssl
import subprocess

import h2.config
import h2.connection
import h2.events
import pytest

from helpers import API_VERSION, api, backend, free_port, gateway, request


def openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, capture_output=True)


def make_ca(d, name="ca"):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", name + ".key", "-out", name + ".crt", "-days", "30",
            "-subj", "/CN=Test " + name, cwd=d)


def make_cert(d, name, dns, ca="ca", client=False):
    """A P-256 certificate for `dns` signed by the test CA."""
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + dns, cwd=d)
    ext = os.path.join(d, name + ".ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=DNS:%s\n" % dns)
        if client:
            f.write("extendedKeyUsage=clientAuth\n")
    openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt", "-CAkey", ca + ".key",
            "-CAcreateserial", "-out", name + ".crt", "-days", "30", "-extfile", ext, cwd=d)


def read(d, name):
    with open(os.path.join(d, name)) as f:
        return f.read()


def certificate(d, name, file_base):
    return {"apiVersion": API_VERSION, "kind": "Certificate", "metadata": {"name": name},
            "spec": {"certificate": read(d, file_base + ".crt"),
                     "privateKey": read(d, file_base + ".key")}}


def https_gateway(port, refs, client_auth=None):
    gw = gateway(port)
    listener = gw["spec"]["listeners"][0]
    listener["protocol"] = "https"
    listener["tls"] = {"certificateRefs": [{"name": r} for r in refs]}
    if client_auth:
        listener["tls"]["clientAuth"] = client_auth
    return gw


@pytest.fixture
def pki(tmp_path):
    d = str(tmp_path / "pki")
    os.makedirs(d)
    make_ca(d)
    make_cert(d, "a", "a.example")
    make_cert(d, "b", "b.example")
    make_cert(d, "a2", "a.example")  # a renewed certificate for a.example
    make_cert(d, "client", "client-1.example", client=True)
    return d


def tls_client(port, server_name, cafile, alpn=("http/1.1",), cert=None):
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.set_alpn_protocols(list(alpn))
    if cert:
        ctx.load_cert_chain(*cert)
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    return ctx.wrap_socket(raw, server_hostname=server_hostname_for(server_name))


def server_hostname_for(name):
    return name


def peer_cn(s):
    subject = dict(x[0] for x in s.getpeercert()["subject"])
    return subject["commonName"]


def h1_get(s, path, host, headers=()):
    extra = "".join("%s: %s\r\n" % kv for kv in headers)
    s.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (path, host, extra)).encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int([l.split(b":")[1] for l in head.split(b"\r\n")
                  if l.lower().startswith(b"content-length:")][0])
    while len(body) < length:
        body += s.recv(65536)
    return int(head.split(b" ")[1]), json.loads(body[:length])


def echo_headers(e):
    h = e["headers"]
    items = h.items() if isinstance(h, dict) else h
    return {k.lower(): v for k, v in items}


def start(runtimes, backends, pki, client_auth=None, extra=()):
    b = backends("echo")
    port = free_port()
    docs = [https_gateway(port, ["a-example", "b-example"], client_auth),
            certificate(pki, "a-example", "a"), certificate(pki, "b-example", "b"),
            backend("echo", [b.port]), api("t", "/t", "echo")] + list(extra)
    return runtimes(docs), port, docs


def test_sni_picks_the_certificate_and_http11_flows_with_forwarded_proto(runtimes, backends, pki):
    rt, port, _ = start(runtimes, backends, pki)
    ca = os.path.join(pki, "ca.crt")
    for name, cn in (("a.example", "a.example"), ("b.example", "b.example")):
        s = tls_client(port, name, ca)
        assert peer_cn(s) == cn
        status, e = h1_get(s, "/t/echo", name)
        assert status == 200
        h = echo_headers(e)
        assert h["x-forwarded-proto"] == "https"
        s.close()
    # No SNI, or a name no certificate has: the listener's default (the first).
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = False
    s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10))
    assert peer_cn(s) == "a.example"
    s.close()


def test_http2_over_tls_with_alpn(runtimes, backends, pki):
    rt, port, _ = start(runtimes, backends, pki)
    s = tls_client(port, "b.example", os.path.join(pki, "ca.crt"), alpn=("h2", "http/1.1"))
    assert s.selected_alpn_protocol() == "h2"
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "GET"), (":path", "/t/echo"), (":scheme", "https"),
                          (":authority", "b.example")], end_stream=True)
    s.sendall(conn.data_to_send())
    status, body, ended = None, b"", False
    while not ended:
        data = s.recv(65536)
        assert data, "connection closed"
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                status = dict(ev.headers)[b":status"]
            elif isinstance(ev, h2.events.DataReceived):
                body += ev.data
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                ended = True
        s.sendall(conn.data_to_send())
    assert status == b"200"
    assert echo_headers(json.loads(body))["x-forwarded-proto"] == "https"
    s.close()
    # And curl, as a user would check it.
    out = subprocess.run(["curl", "-sS", "--http2", "--cacert", os.path.join(pki, "ca.crt"),
                          "--resolve", "a.example:%d:127.0.0.1" % port, "-o", "/dev/null", "-w",
                          "%{http_version} %{http_code}", "https://a.example:%d/t/echo" % port],
                         capture_output=True, text=True, timeout=20)
    assert out.stdout == "2 200", out.stderr


def test_client_certificates_reach_the_origin_and_cannot_be_forged(runtimes, backends, pki):
    ca_pem = read(pki, "ca.crt")
    rt, port, _ = start(runtimes, backends, pki,
                        client_auth={"caBundle": ca_pem, "mode": "optional"})
    ca = os.path.join(pki, "ca.crt")
    cert = (os.path.join(pki, "client.crt"), os.path.join(pki, "client.key"))
    s = tls_client(port, "a.example", ca, cert=cert)
    status, e = h1_get(s, "/t/echo", "a.example",
                       headers=[("X-Client-Cert-Subject", "CN=forged")])
    h = echo_headers(e)
    assert h["x-client-cert-subject"] == "CN=client-1.example"
    assert "DNS:client-1.example" in h["x-client-cert-san"]
    assert len(h["x-client-cert-sha256"]) == 64
    s.close()
    # Without a certificate (optional): no such header, and a forged one is removed.
    s = tls_client(port, "a.example", ca)
    status, e = h1_get(s, "/t/echo", "a.example",
                       headers=[("X-Client-Cert-Subject", "CN=forged"),
                                ("X-Forwarded-Client-Cert", "Subject=forged")])
    h = echo_headers(e)
    assert "x-client-cert-subject" not in h and "x-forwarded-client-cert" not in h
    s.close()


def test_client_certificate_required(runtimes, backends, pki):
    rt, port, _ = start(runtimes, backends, pki,
                        client_auth={"caBundle": read(pki, "ca.crt"), "mode": "required"})
    ca = os.path.join(pki, "ca.crt")
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
        s = tls_client(port, "a.example", ca)
        h1_get(s, "/t/echo", "a.example")
    s = tls_client(port, "a.example", ca,
                   cert=(os.path.join(pki, "client.crt"), os.path.join(pki, "client.key")))
    assert h1_get(s, "/t/echo", "a.example")[0] == 200
    s.close()


def test_certificate_swaps_on_reload_without_closing_anything(runtimes, backends, pki):
    rt, port, docs = start(runtimes, backends, pki)
    ca = os.path.join(pki, "ca.crt")
    old = tls_client(port, "a.example", ca)
    serial_old = old.getpeercert()["serialNumber"]
    assert h1_get(old, "/t/echo", "a.example")[0] == 200
    docs = [d for d in docs if d["metadata"]["name"] != "a-example"] + \
        [certificate(pki, "a-example", "a2")]
    rt.reload(docs)
    # New handshakes get the new certificate at once...
    new = tls_client(port, "a.example", ca)
    assert new.getpeercert()["serialNumber"] != serial_old
    assert h1_get(new, "/t/echo", "a.example")[0] == 200
    # ...the established connection keeps its own and goes on working.
    assert old.getpeercert()["serialNumber"] == serial_old
    assert h1_get(old, "/t/echo", "a.example")[0] == 200
    old.close()
    new.close()


def test_unusable_certificate_keeps_the_old_config(runtimes, backends, pki):
    rt, port, docs = start(runtimes, backends, pki)
    bad = certificate(pki, "a-example", "a")
    bad["spec"]["privateKey"] = read(pki, "b.key")  # a key that is not the certificate's
    rt.reload_invalid([d for d in docs if d["metadata"]["name"] != "a-example"] + [bad])
    s = tls_client(port, "a.example", os.path.join(pki, "ca.crt"))
    assert peer_cn(s) == "a.example"
    assert h1_get(s, "/t/echo", "a.example")[0] == 200
    s.close()


def test_private_keys_stay_out_of_config_dump_and_expiry_is_exported(runtimes, backends, pki):
    rt, port, _ = start(runtimes, backends, pki)
    status, _, body = rt.admin_get("/config_dump")
    assert status == 200
    assert b"PRIVATE KEY" not in body
    days = rt.metric("sluice_certificate_expiry_seconds", certificate="default/a-example")
    assert 29 * 86400 < days <= 30 * 86400


def test_plain_http_to_an_https_port_is_refused(runtimes, backends, pki):
    rt, port, _ = start(runtimes, backends, pki)
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"GET /t/echo HTTP/1.1\r\nHost: a\r\n\r\n")
    try:
        data = s.recv(65536)  # a TLS alert, or EOF
    except ConnectionResetError:
        data = b""
    assert not data.startswith(b"HTTP/")
    s.close()
    # The listener goes on serving TLS clients.
    t = tls_client(port, "a.example", os.path.join(pki, "ca.crt"))
    assert h1_get(t, "/t/echo", "a.example")[0] == 200
    t.close()
