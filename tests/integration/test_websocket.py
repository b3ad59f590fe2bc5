"""WebSocket and other HTTP/1.1 upgrades through the gateway (issue 9).

A real WebSocket server and client (Debian's python3-websockets) talk
through sluice-runtime: the Upgrade is forwarded when the route allows its
token (websocket by default), the 101 turns the connection into a byte
tunnel with its own idle timeout, and a config change never touches a tunnel.
"""

import asyncio
import socket
import threading
import time

import pytest
import websockets

from helpers import api, backend, free_port, gateway, metric_sum, parse_prometheus, request


class WsServer:
    """An asyncio WebSocket server in its own thread: echoes every message;
    "close-me" makes the server close the connection (code 4000); it records
    the Upgrade header each handshake carried."""

    def __init__(self):
        self.port = free_port()
        self.handshake_upgrade = []
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    async def _handler(self, ws, path=None):
        self.handshake_upgrade.append(ws.request_headers.get("Upgrade"))
        async for msg in ws:
            if msg == "close-me":
                await ws.close(code=4000, reason="server side close")
                return
            await ws.send(msg)

    def _run(self):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            websockets.serve(self._handler, "127.0.0.1", self.port, max_size=None,
                             ping_interval=None))
        self.ready.set()
        self.loop.run_forever()

    def start(self):
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def stop(self):
        async def shutdown():
            self.server.close()
            await self.server.wait_closed()
        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def ws_server():
    s = WsServer().start()
    yield s
    s.stop()


def ws_config(port, server_port, **api_spec):
    return [gateway(port), backend("ws", [server_port]), api("ws", "/ws", "ws", **api_spec)]


def run(coro, timeout=30):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_websocket_echo_large_frames_ping_and_client_close(ws_server, runtimes):
    port = free_port()
    runtimes(ws_config(port, ws_server.port))

    async def session():
        async with websockets.connect("ws://127.0.0.1:%d/ws/echo" % port, max_size=None,
                                      ping_interval=None) as ws:
            await ws.send("hello")
            assert await ws.recv() == "hello"
            big = bytes(range(256)) * 4096 * 4  # 4 MiB in one frame
            await ws.send(big)
            assert await ws.recv() == big
            pong = await ws.ping(b"are you there")
            await asyncio.wait_for(pong, 5)
        # the context manager closed from the client side with a close handshake
        return ws.close_code

    assert run(session()) == 1000
    assert ws_server.handshake_upgrade == ["websocket"]


def test_websocket_closed_by_the_server(ws_server, runtimes):
    port = free_port()
    runtimes(ws_config(port, ws_server.port))

    async def session():
        async with websockets.connect("ws://127.0.0.1:%d/ws/x" % port,
                                      ping_interval=None) as ws:
            await ws.send("close-me")
            with pytest.raises(websockets.ConnectionClosed) as e:
                await ws.recv()
            return e.value.code, e.value.reason

    assert run(session()) == (4000, "server side close")


def test_many_concurrent_tunnels(ws_server, runtimes):
    port = free_port()
    runtimes(ws_config(port, ws_server.port), workers=2)

    async def one(i):
        async with websockets.connect("ws://127.0.0.1:%d/ws/%d" % (port, i),
                                      ping_interval=None) as ws:
            for k in range(5):
                await ws.send("m%d-%d" % (i, k))
                assert await ws.recv() == "m%d-%d" % (i, k)

    async def many():
        await asyncio.gather(*(one(i) for i in range(100)))

    run(many(), timeout=60)


def test_tunnel_survives_a_config_change(ws_server, runtimes):
    port = free_port()
    rt = runtimes(ws_config(port, ws_server.port))

    async def session():
        async with websockets.connect("ws://127.0.0.1:%d/ws/a" % port,
                                      ping_interval=None) as ws:
            await ws.send("before")
            assert await ws.recv() == "before"
            # Another Api is added and the runtime swaps its generation
            # while the tunnel is open.
            docs = ws_config(port, ws_server.port) + [api("other", "/other", "ws")]
            await asyncio.get_running_loop().run_in_executor(None, rt.reload, docs)
            await ws.send("after")
            assert await ws.recv() == "after"
            # A new tunnel on the new generation works too.
            async with websockets.connect("ws://127.0.0.1:%d/other/b" % port,
                                          ping_interval=None) as ws2:
                await ws2.send("new")
                assert await ws2.recv() == "new"

    run(session())


def test_websocket_disabled_on_an_operation_is_not_upgraded(ws_server, runtimes):
    port = free_port()
    ops = [{"name": "no-ws", "method": "GET", "path": "/plain", "pathType": "prefix",
            "upgrades": [{"type": "websocket", "enabled": False}]},
           {"name": "rest", "method": "*", "path": "/", "pathType": "prefix"}]
    runtimes(ws_config(port, ws_server.port, operations=ops))

    async def session():
        with pytest.raises(websockets.InvalidStatusCode) as e:
            async with websockets.connect("ws://127.0.0.1:%d/ws/plain" % port,
                                          ping_interval=None):
                pass
        return e.value.status_code

    # The origin never saw an Upgrade, so it could not switch protocols.
    assert run(session()) in (400, 426)
    assert ws_server.handshake_upgrade == []
    # The rest of the Api still upgrades.
    async def ok():
        async with websockets.connect("ws://127.0.0.1:%d/ws/else" % port,
                                      ping_interval=None) as ws:
            await ws.send("x")
            return await ws.recv()
    assert run(ok()) == "x"


def raw_exchange(port, data, timeout=5.0):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    out = b""
    try:
        while b"\r\n\r\n" not in out:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    finally:
        s.close()
    return out


def test_h2c_and_unlisted_upgrades_are_never_forwarded(runtimes):
    """An origin that would switch to anything it is offered: the gateway
    forwards no Upgrade for tokens the route does not tunnel, so no 101
    comes back."""
    origin = socket.socket()
    origin.bind(("127.0.0.1", 0))
    origin.listen(8)
    seen = []

    def serve():
        while True:
            try:
                conn, _ = origin.accept()
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    head += chunk
                seen.append(head)
                if b"\nupgrade:" in head.lower():
                    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n"
                                 b"Connection: Upgrade\r\n\r\n")
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    port = free_port()
    runtimes(ws_config(port, origin.getsockname()[1]))
    for token in (b"h2c", b"foo"):
        resp = raw_exchange(port, b"GET /ws/x HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, "
                                  b"HTTP2-Settings\r\nUpgrade: " + token + b"\r\n"
                                  b"HTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n")
        assert resp.startswith(b"HTTP/1.1 200"), resp
    assert len(seen) == 2 and all(b"upgrade" not in h.lower() for h in seen), seen
    origin.close()


def test_origin_switching_to_another_protocol_is_502(runtimes):
    """Asked for websocket, an origin answering 101 with another protocol is
    not relayed."""
    origin = socket.socket()
    origin.bind(("127.0.0.1", 0))
    origin.listen(8)

    def serve():
        conn, _ = origin.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(65536)
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n"
                         b"Connection: Upgrade\r\n\r\n")
            time.sleep(0.5)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    port = free_port()
    runtimes(ws_config(port, origin.getsockname()[1]))
    resp = raw_exchange(port, b"GET /ws/x HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\n"
                              b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                              b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
    assert resp.startswith(b"HTTP/1.1 502"), resp
    t.join(5)
    origin.close()


def test_idle_tunnel_is_closed_at_tunnel_idle(ws_server, runtimes):
    port = free_port()
    runtimes(ws_config(port, ws_server.port, timeouts={"tunnelIdle": "400ms"}))

    async def session():
        async with websockets.connect("ws://127.0.0.1:%d/ws/idle" % port,
                                      ping_interval=None) as ws:
            await ws.send("x")
            assert await ws.recv() == "x"
            t0 = time.monotonic()
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)
            return time.monotonic() - t0

    waited = run(session())
    assert 0.3 <= waited <= 2.0, waited
