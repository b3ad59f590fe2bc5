"""Active health checks speak the Backend's protocol: over TLS with the
settings traffic uses (SNI, CA bundle, client certificate), HTTP/2 with prior
knowledge for h2c and over TLS with ALPN h2 for h2. A failed handshake, a
certificate that does not verify and an h2 endpoint that does not select ALPN
h2 are failed checks, logged with their reason when they flip the endpoint.

The HTTP/2 origin below speaks nothing but HTTP/2 (after TLS with ALPN h2 for
h2): every request it records came over HTTP/2.
"""

import os
import socket
import ssl
import threading

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest

from backend import Backend
from helpers import api, backend, free_port, gateway, request, wait_until
from test_tls import certificate, make_ca, make_cert, read

NO_OUTLIER = {"consecutiveFailures": 0}
# Two failures in a row: one check slowed down by a loaded machine does not
# flip an endpoint.
FAST_HC = {"path": "/health", "interval": "200ms", "timeout": "200ms",
           "unhealthyThreshold": 2, "healthyThreshold": 1}


@pytest.fixture
def pki(tmp_path):
    d = str(tmp_path / "pki")
    os.makedirs(d)
    make_ca(d)
    make_ca(d, "other-ca")
    make_cert(d, "origin", "origin.example")
    make_cert(d, "gw-client", "gateway.example", client=True)
    return d


def server_ctx(pki, alpn=None, client_ca=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.path.join(pki, "origin.crt"), os.path.join(pki, "origin.key"))
    if alpn:
        ctx.set_alpn_protocols(alpn)
    if client_ca:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(os.path.join(pki, client_ca + ".crt"))
    return ctx


class H2Origin:
    """A threaded HTTP/2-only server (h2c, or TLS when given a context).
    /health answers health_status; anything else 200 with its name in
    x-backend. Records the headers of every request."""

    def __init__(self, name, ssl_context=None):
        self.name = name
        self.ssl_context = ssl_context
        self.health_status = 200
        self.requests = []
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def health_checks(self):
        with self.lock:
            return [h for h in self.requests if h[":path"] == "/health"]

    def _accept(self):
        while not self.stop:
            try:
                s, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def _serve(self, s):
        try:
            s.settimeout(10)
            if self.ssl_context:
                s = self.ssl_context.wrap_socket(s, server_side=True)
            conn = h2.connection.H2Connection(
                h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
            conn.initiate_connection()
            s.sendall(conn.data_to_send())
            while True:
                data = s.recv(65536)
                if not data:
                    return
                for ev in conn.receive_data(data):
                    if isinstance(ev, h2.events.RequestReceived):
                        self._answer(conn, ev.stream_id, dict(ev.headers))
                s.sendall(conn.data_to_send())
        except (OSError, ssl.SSLError, h2.exceptions.ProtocolError):
            return
        finally:
            s.close()

    def _answer(self, conn, sid, headers):
        with self.lock:
            self.requests.append(headers)
        status = self.health_status if headers[":path"] == "/health" else 200
        body = self.name.encode()
        conn.send_headers(sid, [(":status", str(status)), ("x-backend", self.name),
                                ("content-length", str(len(body)))])
        conn.send_data(sid, body, end_stream=True)

    def close(self):
        self.stop = True
        self.sock.close()


@pytest.fixture
def servers():
    made = []

    def make(obj):
        made.append(obj)
        return obj

    yield make
    for o in made:
        if isinstance(o, H2Origin):
            o.close()
        else:
            o.stop()


def _servers(port, n):
    return [(r.status, r.header("X-Backend"))
            for r in (request(port, "GET", "/t/echo") for _ in range(n))]


def _error_code(port):
    r = request(port, "GET", "/t/echo")
    if r.status < 500:
        return r.status
    return r.json()["error"]["code"]


def _follows_health(port, a, b):
    """a and b both get traffic; a failing its checks stops getting it and
    gets it again once it passes them."""
    wait_until(lambda: set(s for _, s in _servers(port, 10)) == {"a", "b"}, 10,
               what="both endpoints to receive traffic")
    a.health_status = 503
    wait_until(lambda: all(s == "b" for _, s in _servers(port, 6)), 10,
               what="endpoint a to be skipped after failing health checks")
    got = _servers(port, 20)
    assert all(st == 200 and s == "b" for st, s in got), got
    a.health_status = 200
    wait_until(lambda: any(s == "a" for _, s in _servers(port, 6)), 10,
               what="endpoint a to be used again after passing health checks")


def test_tls_backend_health_checks_use_sni_ca_and_client_certificate(runtimes, servers, pki):
    # The origins require the gateway's client certificate: a probe without
    # it (or in plaintext) never reaches /health.
    a = servers(Backend(name="a", ssl_context=server_ctx(pki, client_ca="ca")).start())
    b = servers(Backend(name="b", ssl_context=server_ctx(pki, client_ca="ca")).start())
    port = free_port()
    tls = {"sni": "origin.example", "caBundle": read(pki, "ca.crt"),
           "clientCertificateRef": {"name": "gw-client"}}
    runtimes([gateway(port), certificate(pki, "gw-client", "gw-client"),
              backend("pool", [a.port, b.port], tls=tls, healthCheck=FAST_HC,
                      outlierDetection=NO_OUTLIER),
              api("t", "/t", "pool", retries={"attempts": 0})])
    wait_until(lambda: a.count("/health", False) >= 1 and b.count("/health", False) >= 1, 10,
               what="TLS health checks to reach both endpoints")
    hreq = a.received("/health")[-1]
    assert hreq["method"] == "GET"
    # The default Host of a TLS check leaves out only port 443.
    assert ("Host", "127.0.0.1:%d" % a.port) in hreq["headers"], hreq["headers"]
    _follows_health(port, a, b)


def test_stopped_tls_backend_is_skipped_until_it_comes_back(runtimes, servers, pki):
    a = servers(Backend(name="a", ssl_context=server_ctx(pki)).start())
    b = servers(Backend(name="b", ssl_context=server_ctx(pki)).start())
    a_port = a.port
    port = free_port()
    tls = {"sni": "origin.example", "caBundle": read(pki, "ca.crt")}
    runtimes([gateway(port), backend("pool", [a.port, b.port], tls=tls, healthCheck=FAST_HC,
                                     outlierDetection=NO_OUTLIER),
              api("t", "/t", "pool", retries={"attempts": 0})])
    wait_until(lambda: a.count("/health", False) >= 1, 10, what="a TLS health check")
    a.stop()
    wait_until(lambda: all(st == 200 and s == "b" for st, s in _servers(port, 6)), 10,
               what="the stopped endpoint to be skipped")
    revived = servers(Backend(port=a_port, name="a", ssl_context=server_ctx(pki)).start())
    wait_until(lambda: any(s == "a" for _, s in _servers(port, 6)), 10,
               what="the revived TLS endpoint to receive traffic again")
    assert revived.count("/health", False) >= 1


@pytest.mark.parametrize("tls,reason", [
    ({"sni": "origin.example", "caBundle": "OTHER"}, "unable to get local issuer certificate"),
    ({"sni": "wrong.example", "caBundle": "CA"}, "hostname mismatch"),
])
def test_unverifiable_tls_backend_is_marked_unhealthy(runtimes, servers, pki, tls, reason):
    o = servers(Backend(name="o", ssl_context=server_ctx(pki)).start())
    tls = dict(tls, caBundle=read(pki, "ca.crt" if tls["caBundle"] == "CA" else "other-ca.crt"))
    port = free_port()
    rt = runtimes([gateway(port), backend("secure", [o.port], tls=tls, healthCheck=FAST_HC,
                                          outlierDetection=NO_OUTLIER),
                   api("t", "/t", "secure", retries={"attempts": 0})])
    # Unhealthy, not just failing: the gateway no longer even tries it.
    wait_until(lambda: _error_code(port) == "no_healthy_upstream", 10,
               what="the unverifiable endpoint to be marked unhealthy")
    rt.wait_log("TLS certificate verification failed: " + reason, timeout=10)
    assert o.count("/health", False) == 0
    # The state and the schedule survive a config swap that keeps the
    # endpoint: right after it the endpoint is still unhealthy.
    rt.reload([gateway(port), backend("secure", [o.port], tls=tls, healthCheck=FAST_HC,
                                      outlierDetection=NO_OUTLIER),
               api("t", "/t", "secure", retries={"attempts": 0}), api("u", "/u", "secure")])
    assert _error_code(port) == "no_healthy_upstream"


@pytest.mark.parametrize("use_tls", [False, True], ids=["h2c", "h2"])
def test_http2_backend_is_checked_over_http2(runtimes, servers, pki, use_tls):
    ctx = server_ctx(pki, alpn=["h2"]) if use_tls else None
    a = servers(H2Origin("a", ssl_context=ctx))
    b = servers(H2Origin("b", ssl_context=ctx))
    port = free_port()
    extra = {"protocol": "h2c"}
    if use_tls:
        extra = {"protocol": "h2", "tls": {"sni": "origin.example",
                                           "caBundle": read(pki, "ca.crt")}}
    hc = dict(FAST_HC, host="health.example")
    runtimes([gateway(port), backend("pool", [a.port, b.port], healthCheck=hc,
                                     outlierDetection=NO_OUTLIER, **extra),
              api("t", "/t", "pool", retries={"attempts": 0})])
    wait_until(lambda: a.health_checks() and b.health_checks(), 10,
               what="HTTP/2 health checks to reach both endpoints")
    h = a.health_checks()[-1]
    assert h[":method"] == "GET"
    assert h[":scheme"] == ("https" if use_tls else "http")
    assert h[":authority"] == "health.example"
    assert h["user-agent"] == "sluice-health-check"
    _follows_health(port, a, b)


def test_h2_backend_without_alpn_h2_is_unhealthy(runtimes, servers, pki):
    # An HTTP/1.1-only TLS origin: its ALPN never selects h2.
    o = servers(Backend(name="o", ssl_context=server_ctx(pki, alpn=["http/1.1"])).start())
    port = free_port()
    tls = {"sni": "origin.example", "caBundle": read(pki, "ca.crt")}
    rt = runtimes([gateway(port), backend("h2o", [o.port], protocol="h2", tls=tls,
                                          healthCheck=FAST_HC, outlierDetection=NO_OUTLIER),
                   api("t", "/t", "h2o", retries={"attempts": 0})])
    wait_until(lambda: _error_code(port) == "no_healthy_upstream", 10,
               what="the endpoint without ALPN h2 to be marked unhealthy")
    rt.wait_log("TLS ALPN did not select h2", timeout=10)
    assert o.count("/health", False) == 0
