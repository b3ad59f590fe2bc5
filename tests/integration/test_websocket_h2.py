"""WebSocket over HTTP/2 (RFC 8441, extended CONNECT) through the gateway.

The client is python3-h2 on a raw socket doing the extended CONNECT itself
and speaking WebSocket frames (RFC 6455, encoded and decoded here: client
frames masked) over the stream's DATA; the origin is a real WebSocket server
(python3-websockets, as in test_websocket.py) behind an HTTP/1.1 backend.
The gateway routes the CONNECT as a GET of :path, sends the origin an
HTTP/1.1 upgrade with its own Sec-WebSocket-Key, checks the 101's accept
value, answers 200 and tunnels the stream.
"""

import os
import signal
import socket
import ssl
import struct
import threading
import time

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from helpers import api, backend, free_port, gateway
from test_tls import certificate, make_ca, make_cert
from test_websocket import WsServer

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10


def ws_frame(opcode, payload, fin=True, mask=True):
    """One RFC 6455 frame; client frames are masked (5.3)."""
    head = bytearray([(0x80 if fin else 0) | opcode])
    n = len(payload)
    mbit = 0x80 if mask else 0
    if n < 126:
        head.append(mbit | n)
    elif n < 65536:
        head.append(mbit | 126)
        head += struct.pack("!H", n)
    else:
        head.append(mbit | 127)
        head += struct.pack("!Q", n)
    if not mask:
        return bytes(head) + payload
    key = os.urandom(4)
    body = bytes(b ^ key[i % 4] for i, b in enumerate(payload)) if n < 4096 else \
        (int.from_bytes(payload, "big") ^ int.from_bytes((key * (n // 4 + 1))[:n], "big")
         ).to_bytes(n, "big")
    return bytes(head) + key + body


def ws_parse(buf):
    """(fin, opcode, payload, consumed) of the first whole frame in buf, or None.
    Server frames are not masked."""
    if len(buf) < 2:
        return None
    fin, opcode = buf[0] & 0x80, buf[0] & 0x0F
    masked, n = buf[1] & 0x80, buf[1] & 0x7F
    off = 2
    if n == 126:
        if len(buf) < 4:
            return None
        n = struct.unpack("!H", bytes(buf[2:4]))[0]
        off = 4
    elif n == 127:
        if len(buf) < 10:
            return None
        n = struct.unpack("!Q", bytes(buf[2:10]))[0]
        off = 10
    assert not masked, "a server frame must not be masked"
    if len(buf) < off + n:
        return None
    return bool(fin), opcode, bytes(buf[off:off + n]), off + n


class H2Ws:
    """An HTTP/2 client (prior knowledge, or TLS with ALPN h2) that opens
    WebSocket streams with extended CONNECT and keeps per-stream state."""

    def __init__(self, port, tls_ctx=None, server_name=None, scheme="http"):
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock = tls_ctx.wrap_socket(raw, server_hostname=server_name) if tls_ctx else raw
        if tls_ctx:
            assert self.sock.selected_alpn_protocol() == "h2"
        self.scheme = scheme
        self.authority = server_name or "localhost"
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())
        self.streams = {}
        self.server_settings = None
        self.goaway = None
        self.allow_goaway = False
        self.pump(lambda: self.server_settings is not None)

    def _stream(self, sid):
        return self.streams.setdefault(sid, {"headers": None, "buf": bytearray(), "ended": False,
                                             "reset": None})

    def pump(self, until, timeout=15.0):
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, "timed out"
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            data = self.sock.recv(1 << 20)
            assert data, "connection closed by the gateway"
            for ev in self.conn.receive_data(data):
                if isinstance(ev, h2.events.RemoteSettingsChanged):
                    self.server_settings = {k: v.new_value
                                            for k, v in ev.changed_settings.items()}
                elif isinstance(ev, h2.events.ResponseReceived):
                    self._stream(ev.stream_id)["headers"] = dict(ev.headers)
                elif isinstance(ev, h2.events.DataReceived):
                    self._stream(ev.stream_id)["buf"] += ev.data
                    self.conn.acknowledge_received_data(ev.flow_controlled_length,
                                                        ev.stream_id)
                elif isinstance(ev, h2.events.StreamEnded):
                    self._stream(ev.stream_id)["ended"] = True
                elif isinstance(ev, h2.events.StreamReset):
                    self._stream(ev.stream_id)["reset"] = ev.error_code
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    self.goaway = ev
                    if not self.allow_goaway:
                        raise AssertionError("GOAWAY %r" % ev)
            out = self.conn.data_to_send()
            if out:
                self.sock.sendall(out)

    def open(self, path, protocol="websocket", extra=(), wait=True):
        sid = self.conn.get_next_available_stream_id()
        hdrs = [(":method", "CONNECT"), (":protocol", protocol), (":scheme", self.scheme),
                (":path", path), (":authority", self.authority),
                ("sec-websocket-version", "13")] + list(extra)
        self.conn.send_headers(sid, hdrs)
        self.sock.sendall(self.conn.data_to_send())
        self._stream(sid)
        if wait:
            self.wait_head(sid)
        return sid

    def get(self, path):
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [(":method", "GET"), (":scheme", self.scheme),
                                     (":path", path), (":authority", self.authority)],
                               end_stream=True)
        self.sock.sendall(self.conn.data_to_send())
        self._stream(sid)
        return sid

    def wait_head(self, sid):
        st = self.streams[sid]
        self.pump(lambda: st["headers"] is not None or st["reset"] is not None)
        return st["headers"]

    def status(self, sid):
        return int(self.wait_head(sid)[":status"])

    def send_raw(self, sid, data, end=False):
        view = memoryview(data)
        while view:
            size = min(len(view), self.conn.local_flow_control_window(sid),
                       self.conn.max_outbound_frame_size)
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

    def send(self, sid, opcode, payload):
        self.send_raw(sid, ws_frame(opcode, payload))

    def recv(self, sid, timeout=15.0):
        """The next whole message: (opcode, payload), control frames included."""
        st = self.streams[sid]
        parts, first_op = [], None
        while True:
            self.pump(lambda: ws_parse(st["buf"]) is not None or st["ended"] or
                      st["reset"] is not None, timeout)
            f = ws_parse(st["buf"])
            if f is None:
                raise AssertionError("stream ended (reset=%r) without a frame" % st["reset"])
            fin, op, payload, used = f
            del st["buf"][:used]
            if op >= 8:
                return op, payload
            first_op = op if first_op is None else first_op
            parts.append(payload)
            if fin:
                return first_op, b"".join(parts)

    def close(self):
        self.sock.close()


class RecordingWsServer(WsServer):
    """WsServer that records each handshake's headers and offers the
    "chat" subprotocol."""

    def __init__(self):
        super().__init__()
        self.handshakes = []

    async def _record(self, path, request_headers):
        # Before the 101 goes out (process_request): the handler task runs
        # only after it, so a client could see the upgrade before the record.
        self.handshakes.append(dict((k.lower(), v) for k, v in request_headers.raw_items()))
        return None

    async def _handler(self, ws, path=None):
        async for msg in ws:
            if msg == "close-me":
                await ws.close(code=4000, reason="server side close")
                return
            await ws.send(msg)

    def _run(self):
        import asyncio
        import websockets
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            websockets.serve(self._handler, "127.0.0.1", self.port, max_size=None,
                             ping_interval=None, subprotocols=["chat"],
                             process_request=self._record))
        self.ready.set()
        self.loop.run_forever()


@pytest.fixture
def ws_server():
    s = RecordingWsServer().start()
    yield s
    s.stop()


def h2c_gateway(port):
    gw = gateway(port)
    gw["spec"]["listeners"][0]["protocol"] = "h2c"
    return gw


def config(port, ws_port, extra=(), **api_spec):
    return [h2c_gateway(port), backend("ws", [ws_port]),
            api("ws", "/ws", "ws", **api_spec)] + list(extra)


def test_settings_echo_large_message_ping_and_client_close(ws_server, runtimes):
    port = free_port()
    runtimes(config(port, ws_server.port))
    c = H2Ws(port)
    assert c.server_settings.get(h2.settings.SettingCodes.ENABLE_CONNECT_PROTOCOL) == 1
    sid = c.open("/ws/echo", extra=[("sec-websocket-protocol", "chat")])
    head = c.streams[sid]["headers"]
    assert head[":status"] == "200", head
    assert head.get("sec-websocket-protocol") == "chat"
    assert "sec-websocket-accept" not in head and "upgrade" not in head
    # The origin got an HTTP/1.1 upgrade with the gateway's own key.
    hs = ws_server.handshakes[0]
    assert hs["upgrade"].lower() == "websocket" and "upgrade" in hs["connection"].lower()
    assert hs["sec-websocket-version"] == "13" and len(hs["sec-websocket-key"]) == 24
    assert hs["sec-websocket-protocol"] == "chat"
    c.send(sid, OP_TEXT, b"hello")
    assert c.recv(sid) == (OP_TEXT, b"hello")
    c.send(sid, OP_BINARY, bytes(range(256)))
    assert c.recv(sid) == (OP_BINARY, bytes(range(256)))
    # 1 MiB each way: many times both the stream windows (65535).
    big = os.urandom(1 << 20)
    c.send(sid, OP_BINARY, big)
    assert c.recv(sid) == (OP_BINARY, big)
    c.send(sid, OP_PING, b"are you there")
    assert c.recv(sid) == (OP_PONG, b"are you there")
    # Close from the client: the origin answers the close, then its EOF
    # ends our stream; our END_STREAM half-closes the origin's socket.
    c.send(sid, OP_CLOSE, struct.pack("!H", 1000) + b"bye")
    op, payload = c.recv(sid)
    assert op == OP_CLOSE and struct.unpack("!H", payload[:2])[0] == 1000
    c.send_raw(sid, b"", end=True)
    st = c.streams[sid]
    c.pump(lambda: st["ended"] or st["reset"] is not None)
    assert st["ended"] and st["reset"] is None
    # The connection goes on serving.
    sid2 = c.open("/ws/again")
    c.send(sid2, OP_TEXT, b"x")
    assert c.recv(sid2) == (OP_TEXT, b"x")
    c.close()


def test_closed_by_the_server(ws_server, runtimes):
    port = free_port()
    runtimes(config(port, ws_server.port))
    c = H2Ws(port)
    sid = c.open("/ws/x")
    c.send(sid, OP_TEXT, b"close-me")
    op, payload = c.recv(sid)
    assert op == OP_CLOSE and struct.unpack("!H", payload[:2])[0] == 4000
    assert payload[2:] == b"server side close"
    c.send(sid, OP_CLOSE, payload[:2])
    st = c.streams[sid]
    c.pump(lambda: st["ended"] or st["reset"] is not None)
    assert st["ended"], st
    c.close()


def test_many_tunnels_and_requests_on_one_connection(ws_server, runtimes, backends):
    port = free_port()
    b = backends("echo")
    runtimes(config(port, ws_server.port, extra=[backend("echo", [b.port]),
                                                 api("t", "/t", "echo")]))
    c = H2Ws(port)
    sids = [c.open("/ws/%d" % i, wait=False) for i in range(50)]
    gets = [c.get("/t/plain-%d" % i) for i in range(10)]
    for sid in sids:
        assert c.status(sid) == 200
    for k in range(3):
        for i, sid in enumerate(sids):
            c.send(sid, OP_TEXT, b"m%d-%d" % (i, k))
        more = [c.get("/t/more-%d-%d" % (k, i)) for i in range(5)]
        for i, sid in enumerate(sids):
            assert c.recv(sid) == (OP_TEXT, b"m%d-%d" % (i, k))
        gets += more
    for sid in gets:
        st = c.streams[sid]
        c.pump(lambda: st["ended"])
        assert st["headers"][":status"] == "200"
    c.close()


def test_tunnel_survives_a_config_change(ws_server, runtimes):
    port = free_port()
    rt = runtimes(config(port, ws_server.port))
    c = H2Ws(port)
    sid = c.open("/ws/a")
    c.send(sid, OP_TEXT, b"before")
    assert c.recv(sid) == (OP_TEXT, b"before")
    rt.reload(config(port, ws_server.port, extra=[api("other", "/other", "ws")]))
    c.send(sid, OP_TEXT, b"after")
    assert c.recv(sid) == (OP_TEXT, b"after")
    # A new tunnel, on the same connection, runs on the new generation.
    sid2 = c.open("/other/b")
    c.send(sid2, OP_TEXT, b"new")
    assert c.recv(sid2) == (OP_TEXT, b"new")
    c.send(sid, OP_TEXT, b"still")
    assert c.recv(sid) == (OP_TEXT, b"still")
    c.close()


def test_route_that_does_not_tunnel_websocket_refuses(ws_server, runtimes):
    port = free_port()
    ops = [{"name": "no-ws", "method": "GET", "path": "/plain", "pathType": "prefix",
            "upgrades": [{"type": "websocket", "enabled": False}]},
           {"name": "rest", "method": "*", "path": "/", "pathType": "prefix"}]
    runtimes(config(port, ws_server.port, operations=ops))
    c = H2Ws(port)
    sid = c.open("/ws/plain")
    assert c.status(sid) == 501
    st = c.streams[sid]
    c.pump(lambda: st["ended"] or st["reset"] is not None)
    assert b'"upgrade_not_allowed"' in bytes(st["buf"])
    # Tokens the route does not list are refused the same way.
    sid = c.open("/ws/else", protocol="foo")
    assert c.status(sid) == 501
    assert ws_server.handshakes == []
    # The rest of the Api tunnels.
    sid = c.open("/ws/else")
    assert c.status(sid) == 200
    c.send(sid, OP_TEXT, b"x")
    assert c.recv(sid) == (OP_TEXT, b"x")
    c.close()


class ScriptedOrigin:
    """An HTTP/1.1 origin that answers every request head with answer(head)."""

    def __init__(self, answer):
        self.answer = answer
        self.heads = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                head += chunk
            self.heads.append(head)
            conn.sendall(self.answer(head))
            time.sleep(1)

    def close(self):
        self.sock.close()


def key_of(head):
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"sec-websocket-key:"):
            return line.split(b":", 1)[1].strip()
    return None


def test_backend_answers_passed_or_refused(runtimes):
    """A non-101 answer is the client's final response; a 101 with a wrong
    Sec-WebSocket-Accept, or a 200 that the client would take for an open
    tunnel, is a 502."""
    import base64
    import hashlib

    def accept(key):
        return base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11")
                                .digest())

    def answer(head):
        path = head.split(b" ")[1]
        if path == b"/forbidden":
            return b"HTTP/1.1 403 Forbidden\r\nContent-Length: 4\r\n\r\nnope"
        if path == b"/bad-accept":
            return (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                    b"Connection: Upgrade\r\nSec-WebSocket-Accept: " +
                    accept(b"not the key we were sent") + b"\r\n\r\n")
        if path == b"/ok-200":
            return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        return (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept(key_of(head)) +
                b"\r\n\r\n" + ws_frame(OP_TEXT, b"hi from origin", mask=False))

    origin = ScriptedOrigin(answer)
    port = free_port()
    runtimes([h2c_gateway(port), backend("o", [origin.port]), api("o", "/o", "o")])
    c = H2Ws(port)
    sid = c.open("/o/forbidden")
    assert c.status(sid) == 403
    st = c.streams[sid]
    c.pump(lambda: st["ended"])
    assert bytes(st["buf"]) == b"nope"
    for path in ("/o/bad-accept", "/o/ok-200"):
        sid = c.open(path)
        assert c.status(sid) == 502, path
        st = c.streams[sid]
        c.pump(lambda: st["ended"] or st["reset"] is not None)
        assert b'"bad_upstream_response"' in bytes(st["buf"])
    # A good accept opens the tunnel; bytes that came with the 101 arrive.
    sid = c.open("/o/good")
    assert c.status(sid) == 200
    assert c.recv(sid) == (OP_TEXT, b"hi from origin")
    assert all(b"upgrade: websocket" in h.lower() and len(key_of(h)) == 24
               for h in origin.heads)
    c.close()
    origin.close()


def test_http2_backend_is_not_supported_yet(runtimes):
    port = free_port()
    runtimes([h2c_gateway(port), backend("g", [free_port()], protocol="h2c"),
              api("g", "/g", "g")])
    c = H2Ws(port)
    sid = c.open("/g/x")
    assert c.status(sid) == 501
    st = c.streams[sid]
    c.pump(lambda: st["ended"] or st["reset"] is not None)
    assert b"HTTP/1.1 backend" in bytes(st["buf"])
    c.close()


def test_idle_tunnel_is_closed_at_tunnel_idle(ws_server, runtimes):
    port = free_port()
    runtimes(config(port, ws_server.port, timeouts={"tunnelIdle": "400ms"}))
    c = H2Ws(port)
    sid = c.open("/ws/idle")
    c.send(sid, OP_TEXT, b"x")
    assert c.recv(sid) == (OP_TEXT, b"x")
    t0 = time.monotonic()
    st = c.streams[sid]
    c.pump(lambda: st["reset"] is not None or st["ended"], timeout=5)
    waited = time.monotonic() - t0
    assert st["reset"] == 8, st  # CANCEL
    assert 0.3 <= waited <= 2.0, waited
    # The connection itself lives on.
    sid = c.open("/ws/next")
    assert c.status(sid) == 200
    c.close()


def test_over_tls_with_alpn_h2(ws_server, runtimes, tmp_path):
    d = str(tmp_path / "pki")
    os.makedirs(d)
    make_ca(d)
    make_cert(d, "a", "a.example")
    port = free_port()
    gw = gateway(port)
    listener = gw["spec"]["listeners"][0]
    listener["protocol"] = "https"
    listener["tls"] = {"certificateRefs": [{"name": "a-example"}]}
    runtimes([gw, certificate(d, "a-example", "a"), backend("ws", [ws_server.port]),
              api("ws", "/ws", "ws")])
    ctx = ssl.create_default_context(cafile=os.path.join(d, "ca.crt"))
    ctx.set_alpn_protocols(["h2"])
    c = H2Ws(port, tls_ctx=ctx, server_name="a.example", scheme="https")
    assert c.server_settings.get(h2.settings.SettingCodes.ENABLE_CONNECT_PROTOCOL) == 1
    sid = c.open("/ws/tls")
    assert c.status(sid) == 200
    big = os.urandom(300000)
    c.send(sid, OP_BINARY, big)
    assert c.recv(sid) == (OP_BINARY, big)
    assert ws_server.handshakes[0]["x-forwarded-proto"] == "https"
    c.close()


def test_drain_lets_an_open_tunnel_finish(ws_server, runtimes):
    """SIGTERM: the connection gets a graceful GOAWAY, the open tunnel goes
    on (as an HTTP/1.1 tunnel does during a drain) and the runtime exits as
    soon as the client closed it, long before the drain timeout."""
    port = free_port()
    rt = runtimes(config(port, ws_server.port), drain_timeout="20s")
    c = H2Ws(port)
    c.allow_goaway = True
    sid = c.open("/ws/drain")
    c.send(sid, OP_TEXT, b"before")
    assert c.recv(sid) == (OP_TEXT, b"before")
    rt.signal(signal.SIGTERM)
    c.pump(lambda: c.goaway is not None)
    assert c.goaway.error_code == 0 and c.goaway.last_stream_id >= sid
    # python3-h2 takes any GOAWAY for the end of the connection; RFC 9113
    # 6.8 lets streams up to last_stream_id go on: reopen its state.
    c.conn.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN
    c.send(sid, OP_TEXT, b"while draining")
    assert c.recv(sid) == (OP_TEXT, b"while draining")
    c.send(sid, OP_CLOSE, struct.pack("!H", 1000))
    assert c.recv(sid)[0] == OP_CLOSE
    c.send_raw(sid, b"", end=True)
    t0 = time.monotonic()
    assert rt.wait_exit(10) == 0
    assert time.monotonic() - t0 < 5
    c.close()
