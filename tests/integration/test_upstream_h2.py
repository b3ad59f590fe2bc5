"""HTTP/2 Backends (`protocol: h2c`) for HTTP/1.1 and HTTP/2 clients
(issue 9): a small HTTP/2 origin built on Debian's python3-h2 answers with or
without a content-length, with trailers, and echoes request bodies; the
gateway translates both ways. An HTTP/1.1 client gets a body without length
framed chunked (trailers in the last chunk) on a connection that stays
reusable; request bodies, chunked or not, arrive as DATA with the same bytes.
"""

import socket
import threading
import zlib

import h2.config
import h2.connection
import h2.events
import pytest

from helpers import ResponseReader, api, backend, connect, free_port, gateway, request
from test_http2 import H2Client, h2c_gateway, status


class H2Origin:
    """A threaded h2c server: GET /len/N and /nolen/N answer N bytes (with and
    without content-length; /nolen adds trailers); POST answers the body's
    length and crc32. Records the streams each connection carried."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.requests = []
        self.resets = []      # (stream id, error code) of RST_STREAMs received
        self.empty_ends = 0   # DATA frames with no payload that only ended a stream
        self.stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stop:
            try:
                s, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def _serve(self, s):
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False,
                                                                   header_encoding="utf-8"))
        conn.initiate_connection()
        s.sendall(conn.data_to_send())
        streams = {}
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    return
                for ev in conn.receive_data(data):
                    if isinstance(ev, h2.events.RequestReceived):
                        streams[ev.stream_id] = {"headers": dict(ev.headers), "body": b""}
                    elif isinstance(ev, h2.events.StreamReset):
                        self.resets.append((ev.stream_id, ev.error_code))
                    elif isinstance(ev, h2.events.DataReceived):
                        if not ev.data and ev.stream_ended is not None:
                            self.empty_ends += 1
                        streams[ev.stream_id]["body"] += ev.data
                        conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    elif isinstance(ev, h2.events.StreamEnded):
                        self._answer(conn, ev.stream_id, streams.pop(ev.stream_id))
                s.sendall(conn.data_to_send())
        except (OSError, h2.exceptions.ProtocolError):
            return
        finally:
            s.close()

    def _answer(self, conn, sid, req):
        h = req["headers"]
        self.requests.append(h)
        path = h[":path"]
        if h[":method"] == "POST":
            body = ("%d %d" % (len(req["body"]), zlib.crc32(req["body"]))).encode()
            conn.send_headers(sid, [(":status", "200"), ("content-length", str(len(body)))])
            conn.send_data(sid, body, end_stream=True)
            return
        n = int(path.rsplit("/", 1)[1])
        body = bytes(range(256)) * (n // 256) + bytes(range(n % 256))
        if path.startswith("/nolen/"):
            conn.send_headers(sid, [(":status", "200"), ("content-type", "text/plain")])
            self._send_all(conn, sid, body)
            conn.send_headers(sid, [("x-checksum", str(zlib.crc32(body)))], end_stream=True)
        else:
            conn.send_headers(sid, [(":status", "200"), ("content-length", str(n))])
            self._send_all(conn, sid, body, end=True)

    @staticmethod
    def _send_all(conn, sid, body, end=False):
        # The gateway's window is 64 KiB per stream: send what fits; the
        # tests keep bodies within it per response.
        for i in range(0, len(body), 16384):
            conn.send_data(sid, body[i:i + 16384])
        if end:
            conn.end_stream(sid)

    def close(self):
        self.stop = True
        self.sock.close()


@pytest.fixture
def h2origin():
    o = H2Origin()
    yield o
    o.close()


def start(runtimes, origin, h2c_listener=False):
    port = free_port()
    gw = h2c_gateway(port) if h2c_listener else gateway(port)
    runtimes([gw, backend("h2o", [origin.port], protocol="h2c"), api("t", "/t", "h2o")])
    return port


def body_of(n):
    return bytes(range(256)) * (n // 256) + bytes(range(n % 256))


def test_http11_client_to_h2_backend_keeps_its_connection(runtimes, h2origin):
    port = start(runtimes, h2origin)
    s = connect(port)
    reader = ResponseReader(s)
    try:
        r = request(port, "GET", "/t/len/30000", sock=s, reader=reader)
        assert r.status == 200 and r.body == body_of(30000)
        # No length from the HTTP/2 origin: chunked to the client, trailers
        # in the last chunk, and the same connection goes on.
        r = request(port, "GET", "/t/nolen/40000", sock=s, reader=reader)
        assert r.status == 200 and r.body == body_of(40000)
        assert r.header("Transfer-Encoding") == "chunked"
        r = request(port, "GET", "/t/len/10", sock=s, reader=reader)
        assert r.status == 200 and r.body == body_of(10)
    finally:
        s.close()
    assert h2origin.connections == 1  # one multiplexed connection carried them all
    h = h2origin.requests[0]
    assert h[":scheme"] == "http" and h[":path"] == "/len/30000"
    assert h["te"] == "trailers" and "connection" not in h


def test_request_bodies_to_h2_backend(runtimes, h2origin):
    port = start(runtimes, h2origin)
    body = body_of(50000)
    r = request(port, "POST", "/t/echo", body=body)
    assert r.body.decode() == "%d %d" % (len(body), zlib.crc32(body))
    # A chunked HTTP/1.1 body reaches the HTTP/2 origin as plain DATA.
    s = connect(port)
    try:
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 7000]), body[i:i + 7000])
                          for i in range(0, len(body), 7000)) + b"0\r\n\r\n"
        s.sendall(b"POST /t/echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" +
                  chunks)
        r = ResponseReader(s).read_response("POST")
        assert r.body.decode() == "%d %d" % (len(body), zlib.crc32(body))
    finally:
        s.close()


def test_complete_exchanges_cost_no_extra_frames(runtimes, h2origin):
    # A request that arrives whole leaves as HEADERS and DATA carrying
    # END_STREAM (not a separate empty DATA frame), and a complete exchange
    # is not followed by a RST_STREAM: both used to cost the backend an
    # extra frame (and the gateway a write) per call.
    port = start(runtimes, h2origin, h2c_listener=True)
    c = H2Client(port)
    for i in range(10):
        # HEADERS, then DATA with END_STREAM, in one write (H2Client.send
        # ends a body with an empty DATA frame of its own).
        sid = c.conn.get_next_available_stream_id()
        c.conn.send_headers(sid, [(":method", "POST"), (":path", "/t/echo"), (":scheme", "http"),
                                  (":authority", "example.com"), ("content-length", "100")])
        c.conn.send_data(sid, b"x" * 100, end_stream=True)
        c.responses[sid] = {"headers": None, "body": bytearray(), "ended": False,
                            "reset": None, "interim": [], "trailers": None}
        c.sock.sendall(c.conn.data_to_send())
        assert status(c.response(sid)) == 200
        sid = c.send("GET", "/t/nolen/%d" % (100 + i))
        r = c.response(sid)
        assert status(r) == 200 and r["trailers"]
    r = request(port, "POST", "/t/echo", body=b"y" * 100)
    assert r.status == 200
    c.close()
    assert len(h2origin.requests) == 21
    assert h2origin.empty_ends == 0
    assert h2origin.resets == []


def test_http2_client_to_h2_backend_gets_trailers(runtimes, h2origin):
    port = start(runtimes, h2origin, h2c_listener=True)
    c = H2Client(port)
    sids = [c.send("GET", "/t/nolen/%d" % (1000 * (i + 1))) for i in range(20)]
    for i, sid in enumerate(sids):
        r = c.response(sid)
        assert status(r) == 200
        assert bytes(r["body"]) == body_of(1000 * (i + 1))
        assert r["trailers"] == {"x-checksum": str(zlib.crc32(body_of(1000 * (i + 1))))}
    c.close()
