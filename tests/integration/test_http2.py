"""HTTP/2 from clients (h2c with prior knowledge) through the same request
path as HTTP/1.1 (issue 9): the request cases of the HTTP/1.1 suite, run over
HTTP/2 with a real HTTP/2 client (Debian's python3-h2 on a raw socket, and
curl / h2load where a stock client is the point), against the same origin
(backend.py). Routing, errors, limits, retries, forwarding headers and the
access log are the same code for both protocols; these tests prove it.
"""

import json
import socket
import subprocess
import threading
import time
import zlib

import h2.config
import h2.connection
import h2.events
import pytest

from backend import pattern_bytes
from raworigin import RawOrigin, response
from helpers import api, backend, free_port, gateway, request, wait_until


def h2c_gateway(port, **kw):
    gw = gateway(port, **kw)
    gw["spec"]["listeners"][0]["protocol"] = "h2c"
    return gw


class H2Client:
    """A minimal HTTP/2 client over a raw socket (prior knowledge)."""

    def __init__(self, port, timeout=10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 24})
        self.conn.increment_flow_control_window((1 << 24) - 65535)
        self.sock.sendall(self.conn.data_to_send())
        self.responses = {}
        self.closed = False
        self.goaway = None

    def send(self, method, path, headers=(), body=None, end=True, content_length=True):
        sid = self.conn.get_next_available_stream_id()
        hdrs = [(":method", method), (":path", path), (":scheme", "http"),
                (":authority", "example.com")] + list(headers)
        if body is not None and content_length:
            hdrs.append(("content-length", str(len(body))))
        self.conn.send_headers(sid, hdrs, end_stream=body is None and end)
        self.responses[sid] = {"headers": None, "body": bytearray(), "ended": False,
                               "reset": None, "interim": [], "trailers": None}
        if body is not None:
            self.send_body(sid, body, end)
        self.sock.sendall(self.conn.data_to_send())
        return sid

    def send_body(self, sid, body, end=True):
        view = memoryview(body)
        while view:
            window = self.conn.local_flow_control_window(sid)
            size = min(len(view), window, self.conn.max_outbound_frame_size)
            if size == 0:
                self.sock.sendall(self.conn.data_to_send())
                self.pump(lambda: self.conn.local_flow_control_window(sid) > 0)
                continue
            self.conn.send_data(sid, bytes(view[:size]))
            view = view[size:]
            self.sock.sendall(self.conn.data_to_send())
        if end:
            self.conn.end_stream(sid)
            self.sock.sendall(self.conn.data_to_send())

    def pump(self, until, timeout=10.0):
        deadline = time.monotonic() + timeout
        while not until():
            if self.closed:
                raise AssertionError("connection closed (goaway=%r)" % (self.goaway,))
            if time.monotonic() > deadline:
                raise AssertionError("timeout waiting for the response")
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            if not data:
                self.closed = True
                continue
            for ev in self.conn.receive_data(data):
                self._event(ev)
            out = self.conn.data_to_send()
            if out:
                self.sock.sendall(out)

    def _event(self, ev):
        r = self.responses.get(getattr(ev, "stream_id", None))
        if isinstance(ev, h2.events.ResponseReceived):
            r["headers"] = dict(ev.headers)
        elif isinstance(ev, h2.events.InformationalResponseReceived):
            r["interim"].append(dict(ev.headers))
        elif isinstance(ev, h2.events.DataReceived):
            r["body"] += ev.data
            self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        elif isinstance(ev, h2.events.TrailersReceived):
            r["trailers"] = dict(ev.headers)
        elif isinstance(ev, h2.events.StreamEnded):
            r["ended"] = True
        elif isinstance(ev, h2.events.StreamReset):
            if r is not None:
                r["reset"] = ev.error_code
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self.goaway = ev.error_code
            self.closed = True

    def response(self, sid, timeout=10.0):
        r = self.responses[sid]
        self.pump(lambda: r["ended"] or r["reset"] is not None, timeout)
        return r

    def get(self, path, headers=()):
        return self.response(self.send("GET", path, headers))

    def close(self):
        self.sock.close()


def status(r):
    return int(r["headers"][":status"])


def echo(r):
    return json.loads(bytes(r["body"]))


@pytest.fixture
def h2env(backends, runtimes):
    """A runtime with an h2c listener: Api "t" (/t) -> backend "echo"."""
    def make(api_kw=None, backend_kw=None, workers=1, **gw_kw):
        b = backends("echo")
        port = free_port()
        rt = runtimes([h2c_gateway(port, **gw_kw), backend("echo", [b.port], **(backend_kw or {})),
                       api("t", "/t", "echo", **(api_kw or {}))], workers=workers)
        return rt, port, b
    return make


def test_get_over_h2_reaches_the_origin_as_http11_with_forwarding_headers(h2env):
    rt, port, b = h2env()
    c = H2Client(port)
    r = c.get("/t/echo?x=1&y", headers=[("x-custom", "v"), ("cookie", "a=1"), ("cookie", "b=2")])
    assert status(r) == 200
    e = echo(r)
    assert e["method"] == "GET" and e["target"] == "/echo?x=1&y"
    h = {k.lower(): v for k, v in e["headers"].items()} if isinstance(e["headers"], dict) else \
        {k.lower(): v for k, v in e["headers"]}
    assert h["host"] == "example.com"
    assert h["x-custom"] == "v"
    assert h["cookie"] == "a=1; b=2"  # RFC 9113 8.2.3: joined for HTTP/1.1
    assert h["x-forwarded-for"] == "127.0.0.1"
    assert h["x-forwarded-host"] == "example.com"
    assert len(h["x-request-id"]) == 36
    assert e["version"] in ("HTTP/1.1", "1.1", 11)
    assert r["headers"]["x-request-id"] == h["x-request-id"]
    assert "date" in r["headers"]
    c.close()


def test_gateway_errors_are_the_same_json_over_h2(h2env):
    rt, port, b = h2env(api_kw={"operations": [
        {"name": "get", "method": "GET", "path": "/", "pathType": "prefix"}]})
    c = H2Client(port)
    r = c.get("/nope")
    assert status(r) == 404
    err = json.loads(bytes(r["body"]))["error"]
    assert err["code"] == "no_route" and err["status"] == 404
    r = c.response(c.send("DELETE", "/t/x"))
    assert status(r) == 405 and r["headers"]["allow"] == "GET"
    r = c.get("/t/a%2Fb")
    assert status(r) == 400
    assert json.loads(bytes(r["body"]))["error"]["code"] == "bad_path"
    c.close()


def test_post_bodies_with_and_without_content_length(h2env):
    rt, port, b = h2env()
    c = H2Client(port)
    body = pattern_bytes(300 * 1024)
    # With content-length: forwarded with Content-Length.
    r = c.response(c.send("POST", "/t/echo", body=body))
    assert status(r) == 200
    e = echo(r)
    assert e["body_length"] == len(body) and e["body_crc32"] == zlib.crc32(body)
    # Without: forwarded chunked, the same bytes.
    r = c.response(c.send("POST", "/t/echo", body=body, content_length=False))
    assert status(r) == 200
    e = echo(r)
    assert e["body_length"] == len(body) and e["body_crc32"] == zlib.crc32(body)
    h = dict((k.lower(), v) for k, v in (e["headers"].items() if isinstance(e["headers"], dict)
                                         else e["headers"]))
    assert h.get("transfer-encoding") == "chunked"
    c.close()


def test_body_limit_is_413_over_h2(h2env):
    rt, port, b = h2env(api_kw={"maxRequestBodyBytes": 1000})
    c = H2Client(port)
    r = c.response(c.send("POST", "/t/echo", body=b"x" * 2000))
    assert status(r) == 413
    r = c.response(c.send("POST", "/t/echo", body=b"x" * 2000, content_length=False))
    assert status(r) == 413
    # The connection still serves other streams.
    assert status(c.get("/t/echo")) == 200
    c.close()


def test_large_download_and_many_concurrent_streams(h2env):
    rt, port, b = h2env()
    c = H2Client(port)
    sids = [c.send("GET", "/t/bytes/%d?chunked=%d" % (200000 + i, i % 2)) for i in range(40)]
    for i, sid in enumerate(sids):
        r = c.response(sid, timeout=30)
        assert status(r) == 200, r["headers"]
        assert bytes(r["body"]) == pattern_bytes(200000 + i)
    r = c.get("/t/bytes/%d" % (8 << 20))
    assert bytes(r["body"]) == pattern_bytes(8 << 20)
    c.close()


def test_retry_over_h2(h2env):
    rt, port, b = h2env()
    c = H2Client(port)
    b.fail_status = 502
    r = c.get("/t/echo")
    assert status(r) == 502  # retried once, the origin keeps failing
    assert rt.metric("sluice_upstream_retries_total") >= 1
    b.fail_status = None
    assert status(c.get("/t/echo")) == 200
    c.close()


def test_upstream_dying_mid_body_resets_only_that_stream(runtimes):
    """An origin that closes in the middle of a body: over HTTP/2 the
    stream is reset (never a response that looks complete), and the
    connection goes on serving other streams."""
    origin = RawOrigin(lambda req: [response(200, b"x" * 1000)[:-1000].replace(
        b"Content-Length: 1000", b"Content-Length: 100000") + b"y" * 1000, ("close",)]
        if req.target.startswith("/die") else response(200, b"fine")).start()
    try:
        port = free_port()
        runtimes([h2c_gateway(port), backend("o", [origin.port]), api("t", "/t", "o")])
        c = H2Client(port)
        r = c.get("/t/die")
        assert r["reset"] is not None, "a cut response must not end like a complete one"
        assert len(r["body"]) < 100000
        r = c.get("/t/ok")
        assert status(r) == 200 and bytes(r["body"]) == b"fine"
        c.close()
    finally:
        origin.stop()


def test_http11_still_served_on_an_h2c_listener(h2env):
    rt, port, b = h2env()
    r = request(port, "GET", "/t/echo")
    assert r.status == 200


def test_h2load_many_clients_no_errors(h2env):
    rt, port, b = h2env(workers=2)
    out = subprocess.run(["h2load", "-n", "2000", "-c", "8", "-m", "10",
                          "http://127.0.0.1:%d/t/echo" % port],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "2000 succeeded, 0 failed, 0 errored" in out.stdout, out.stdout
    assert "status codes: 2000 2xx" in out.stdout, out.stdout


def test_curl_http2_prior_knowledge(h2env):
    rt, port, b = h2env()
    out = subprocess.run(["curl", "-sS", "--http2-prior-knowledge", "-o", "/dev/null", "-w",
                          "%{http_version} %{http_code}", "http://127.0.0.1:%d/t/echo" % port],
                         capture_output=True, text=True, timeout=20)
    assert out.stdout == "2 200", (out.stdout, out.stderr)


def test_reload_under_h2_load_zero_failures(h2env):
    rt, port, b = h2env(workers=2)
    result = {}

    def load():
        result["out"] = subprocess.run(
            ["h2load", "-D", "3", "-c", "4", "-m", "8", "http://127.0.0.1:%d/t/echo" % port],
            capture_output=True, text=True, timeout=60)

    t = threading.Thread(target=load)
    t.start()
    time.sleep(0.5)
    docs = [h2c_gateway(port), backend("echo", [b.port]), api("t", "/t", "echo"),
            api("u", "/u", "echo")]
    for _ in range(3):
        rt.reload(docs)
        time.sleep(0.3)
    t.join(60)
    out = result["out"].stdout
    assert ", 0 failed, 0 errored" in out, out
    assert "4xx" not in out.split("status codes:")[1].split("\n")[0] or \
        " 0 4xx, 0 5xx" in out, out


def test_access_log_and_metrics_count_h2_requests(h2env):
    rt, port, b = h2env()
    before = rt.metric("sluice_downstream_requests_total")
    c = H2Client(port)
    for _ in range(5):
        assert status(c.get("/t/echo")) == 200
    c.close()
    wait_until(lambda: rt.metric("sluice_downstream_requests_total") >= before + 5, 5)


def test_idle_h2_connection_gets_goaway(h2env):
    rt, port, b = h2env(timeouts={"idle": "1s"})
    c = H2Client(port)
    assert status(c.get("/t/echo")) == 200
    t0 = time.monotonic()
    c.pump(lambda: c.closed, timeout=5)
    assert 0.8 <= time.monotonic() - t0 <= 3.5
    assert c.goaway == 0


# --- gRPC clients: the gateway's own errors are gRPC statuses ------------------

GRPC_HEADERS = [("content-type", "application/grpc"), ("te", "trailers")]


def grpc_call(c, path, timeout=None, body=b"\x00\x00\x00\x00\x00"):
    headers = list(GRPC_HEADERS)
    if timeout:
        headers.append(("grpc-timeout", timeout))
    sid = c.send("POST", path, headers=headers, body=body, content_length=False)
    return c.response(sid, timeout=10)


def test_grpc_errors_are_trailers_only_responses(h2env, runtimes):
    rt, port, b = h2env(api_kw={"operations": [
        {"name": "svc", "method": "POST", "path": "/", "pathType": "prefix"}]})
    c = H2Client(port)
    # No route: UNIMPLEMENTED, as a Trailers-Only response (HTTP 200).
    r = grpc_call(c, "/pkg.Missing/Method")
    assert status(r) == 200 and r["headers"]["content-type"] == "application/grpc"
    assert r["headers"]["grpc-status"] == "12", r["headers"]
    assert "no%20route" in r["headers"]["grpc-message"] or "no route" in \
        r["headers"]["grpc-message"]
    assert bytes(r["body"]) == b""
    c.close()
    # An unreachable backend: UNAVAILABLE.
    # Bound but not listening, and held for the whole test: connecting is
    # refused, and the port can never be handed to the runtime's listener
    # (a port closed at once could come back as port2: a proxy loop).
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead = closed.getsockname()[1]
    port2 = free_port()
    try:
        runtimes([h2c_gateway(port2), backend("dead", [dead]), api("g", "/", "dead")])
        c = H2Client(port2)
        r = grpc_call(c, "/pkg.Svc/Call")
        assert r["headers"].get("grpc-status") == "14", r["headers"]
        c.close()
    finally:
        closed.close()


def test_grpc_timeout_is_the_request_deadline(h2env):
    rt, port, b = h2env()
    c = H2Client(port)
    t0 = time.monotonic()
    r = grpc_call(c, "/t/delay/3000", timeout="300m")
    took = time.monotonic() - t0
    assert r["headers"]["grpc-status"] == "4", r["headers"]  # DEADLINE_EXCEEDED
    assert 0.25 <= took < 1.5, took
    # Without grpc-timeout the route's own timeouts apply: the slow call completes.
    r = grpc_call(c, "/t/delay/300")
    assert status(r) == 200 and "grpc-status" not in r["headers"]
    c.close()


def test_grpcio_client_sees_the_gateway_status(h2env):
    grpc = pytest.importorskip("grpc")
    rt, port, b = h2env(api_kw={"operations": [
        {"name": "svc", "method": "POST", "path": "/known.Svc/", "pathType": "prefix"}]})
    with grpc.insecure_channel("127.0.0.1:%d" % port) as ch:
        call = ch.unary_unary("/pkg.Unknown/Method")
        with pytest.raises(grpc.RpcError) as e:
            call(b"", timeout=5)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED, e.value
