"""Connection handling: keep-alive downstream and upstream, pipelining,
HTTP/1.0 clients, Expect: 100-continue.

Over HTTP/1.1 and HTTP/2 (the `proto` fixture): reuse of the client
connection (over HTTP/2, sequential streams of one connection) and of the
upstream pool, and clients leaving mid-request (over HTTP/2: the
connection closed mid-body, and RST_STREAM while the request is upstream).
HTTP/1.1-only, as they are HTTP/1.1 framing with no HTTP/2 counterpart:
pipelining, Connection: close, HTTP/1.0 clients, Expect: 100-continue
(an HTTP/2 client may send it too, but the interim-response path is
test_http2.py's and test_http1_conformance.py's).
"""

import socket
import struct
import time

from backend import pattern_bytes
from clients import H2Connection
from helpers import ResponseReader, connect, is_closed, request, wait_until


def test_keepalive_reuses_both_connections(simple, proto):
    env = simple()
    c = proto.connection(env.port)
    try:
        for i in range(20):
            r = c.request("GET", "/t/echo?i=%d" % i)
            assert r.status == 200, r
            assert (r.header("Connection") or "").lower() != "close"
            assert r.json()["target"] == "/echo?i=%d" % i
    finally:
        c.close()
    conns = {rec["conn_id"] for rec in env.backend.received()}
    assert len(conns) == 1, "upstream keep-alive: 20 sequential requests of one client " \
                            "used %d upstream connections" % len(conns)


def test_upstream_connection_reused_across_clients(simple, proto):
    env = simple(workers=1)
    for i in range(10):
        r = proto.request(env.port, "GET", "/t/echo")
        assert r.status == 200
    conns = {rec["conn_id"] for rec in env.backend.received()}
    assert len(conns) == 1, "per-worker pool should reuse the idle upstream connection, " \
                            "got %d connections for 10 sequential requests" % len(conns)


def test_pipelined_requests_answered_in_order(simple):
    env = simple()
    s = connect(env.port)
    try:
        # The slow one first: the answers must still come in request order.
        data = (b"GET /t/delay/300?n=1 HTTP/1.1\r\nHost: a\r\n\r\n"
                b"POST /t/echo?n=2 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
                b"GET /t/echo?n=3 HTTP/1.1\r\nHost: a\r\n\r\n")
        s.sendall(data)
        reader = ResponseReader(s)
        targets = []
        for _ in range(3):
            r = reader.read_response()
            assert r.status == 200, r
            targets.append(r.json()["target"])
        assert targets == ["/delay/300?n=1", "/echo?n=2", "/echo?n=3"]
        # The connection stays usable afterwards.
        r = request(env.port, "GET", "/t/echo?n=4", sock=s, reader=reader)
        assert r.status == 200 and r.json()["target"] == "/echo?n=4"
    finally:
        s.close()
    post = [rec for rec in env.backend.received() if rec["method"] == "POST"]
    assert len(post) == 1 and post[0]["body_length"] == 5


def test_pipelined_with_close_stops_after_it(simple):
    env = simple()
    s = connect(env.port)
    try:
        s.sendall(b"GET /t/echo?n=1 HTTP/1.1\r\nHost: a\r\n\r\n"
                  b"GET /t/echo?n=2 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
                  b"GET /t/echo?n=3 HTTP/1.1\r\nHost: a\r\n\r\n")
        reader = ResponseReader(s)
        assert reader.read_response().json()["target"] == "/echo?n=1"
        r = reader.read_response()
        assert r.json()["target"] == "/echo?n=2"
        assert (r.header("Connection") or "").lower() == "close"
        assert is_closed(s, 3, reader), "request after Connection: close must not be answered"
    finally:
        s.close()
    assert env.backend.count("/echo") == 2


def test_http10_client(simple):
    env = simple()
    s = connect(env.port)
    try:
        s.sendall(b"GET /t/echo HTTP/1.0\r\n\r\n")
        reader = ResponseReader(s)
        r = reader.read_response()
        assert r.status == 200, r
        assert r.version in ("HTTP/1.0", "HTTP/1.1")
        assert r.json()["method"] == "GET"
        assert is_closed(s, 3, reader), "HTTP/1.0 without keep-alive: close after the response"
    finally:
        s.close()


def test_http10_keepalive(simple):
    env = simple()
    s = connect(env.port)
    try:
        reader = ResponseReader(s)
        for i in range(2):
            s.sendall(b"GET /t/echo?i=%d HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" % i)
            r = reader.read_response()
            assert r.status == 200, r
            assert (r.header("Connection") or "").lower() == "keep-alive", \
                "HTTP/1.0 keep-alive must be confirmed with Connection: keep-alive"
            assert r.header("Content-Length") is not None
    finally:
        s.close()


def test_http10_gets_chunked_upstream_response_unchunked(simple):
    env = simple()
    s = connect(env.port)
    try:
        s.sendall(b"GET /t/bytes/70000?chunked=1 HTTP/1.0\r\n\r\n")
        reader = ResponseReader(s)
        r = reader.read_response()
        assert r.status == 200
        assert "chunked" not in (r.header("Transfer-Encoding") or "").lower(), \
            "chunked coding must not be sent to an HTTP/1.0 client"
        assert r.body == pattern_bytes(70000)
    finally:
        s.close()


def test_expect_100_continue(simple):
    env = simple()
    s = connect(env.port)
    try:
        s.sendall(b"POST /t/echo HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n"
                  b"Expect: 100-continue\r\n\r\n")
        s.settimeout(3)
        first = b""
        while b"\r\n\r\n" not in first:
            chunk = s.recv(4096)
            assert chunk, "connection closed while waiting for 100 Continue"
            first += chunk
        assert first.startswith(b"HTTP/1.1 100"), first
        rest = first[first.index(b"\r\n\r\n") + 4:]
        s.sendall(b"hello world")
        reader = ResponseReader(s)
        reader.buf += rest
        r = reader.read_response()
        assert r.status == 200, r
        assert r.json()["body_length"] == 11
    finally:
        s.close()


def test_expect_100_continue_refused_when_too_large(simple):
    env = simple(api_kw={"maxRequestBodyBytes": 1000})
    s = connect(env.port)
    try:
        s.sendall(b"POST /t/echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5000\r\n"
                  b"Expect: 100-continue\r\n\r\n")
        reader = ResponseReader(s)
        r = reader.read_response(skip_1xx=False)
        assert r.status == 413, "an oversized body must be refused before 100 Continue: %r" % r
    finally:
        s.close()
    assert env.backend.count() == 0


def _leave_mid_body_and_while_upstream_h2(port):
    c = H2Connection(port)
    sid = c.start("POST", "/t/echo", [("content-length", "100000")], end_stream=False)
    c.send_data(sid, b"abc")
    c.close()
    c = H2Connection(port)
    sid = c.start("GET", "/t/delay/200")
    time.sleep(0.02)
    c.conn.reset_stream(sid)  # CANCEL, then the connection goes too
    c.sock.sendall(c.conn.data_to_send())
    c.close()


def test_client_closing_mid_request_does_not_hurt(simple, proto):
    # Regression: a client that left mid-body, then one that reset while its
    # request was upstream, crashed a worker (NULL cluster in
    # sl_upstream_pick) within a few rounds.
    env = simple()
    for _ in range(20):
        if proto.h2:
            _leave_mid_body_and_while_upstream_h2(proto.port(env.port))
            continue
        s = connect(env.port)
        s.sendall(b"POST /t/echo HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\nabc")
        s.close()
        s = connect(env.port)
        s.sendall(b"GET /t/delay/200 HTTP/1.1\r\nHost: a\r\n\r\n")
        time.sleep(0.02)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    r = proto.request(env.port, "GET", "/t/echo")
    assert r.status == 200
    wait_until(lambda: env.runtime.metric("sluice_connections_active") == 0, 5,
               what="sluice_connections_active to return to 0 after the clients left")
