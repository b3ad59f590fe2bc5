"""gRPC through the gateway (issue 9): a real gRPC server and client
(Debian's python3-grpcio, generic handlers with bytes in and out, so no code
generation) on both sides of sluice-runtime; the client speaks HTTP/2 to an
h2c listener, the gateway speaks HTTP/2 to the Backend (`protocol: h2c`).
Unary, server streaming, client streaming and bidirectional calls, a large
message, a deadline that expires, a client cancel, a backend that fails a
call and one that dies, and routing by service path.
"""

import threading
import time
from concurrent import futures

import pytest

from helpers import api, backend, free_port, gateway

grpc = pytest.importorskip("grpc")


class Server:
    def __init__(self):
        self.cancelled = threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16),
                                  options=[("grpc.max_receive_message_length", 8 << 20),
                                           ("grpc.max_send_message_length", 8 << 20)])
        ident = dict(request_deserializer=None, response_serializer=None)
        handlers = {
            "Unary": grpc.unary_unary_rpc_method_handler(self.unary, **ident),
            "ServerStream": grpc.unary_stream_rpc_method_handler(self.server_stream, **ident),
            "ClientStream": grpc.stream_unary_rpc_method_handler(self.client_stream, **ident),
            "Bidi": grpc.stream_stream_rpc_method_handler(self.bidi, **ident),
            "Slow": grpc.unary_unary_rpc_method_handler(self.slow, **ident),
            "Fail": grpc.unary_unary_rpc_method_handler(self.fail, **ident),
        }
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("pkg.Echo", handlers),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def unary(self, req, ctx):
        ctx.set_trailing_metadata((("x-served-by", "echo"),))
        return req

    def server_stream(self, req, ctx):
        for i in range(int(req.decode() or "5")):
            yield b"item-%d" % i

    def client_stream(self, reqs, ctx):
        return b"|".join(reqs)

    def bidi(self, reqs, ctx):
        for r in reqs:
            yield b"echo:" + r

    def slow(self, req, ctx):
        for _ in range(50):
            if not ctx.is_active():
                self.cancelled.set()
                return b""
            time.sleep(0.05)
        return b"done"

    def fail(self, req, ctx):
        ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, "not today")

    def stop(self):
        self.server.stop(0)


@pytest.fixture
def grpc_env(runtimes):
    servers = []

    def make(workers=1):
        s = Server()
        servers.append(s)
        port = free_port()
        gw = gateway(port)
        gw["spec"]["listeners"][0]["protocol"] = "h2c"
        rt = runtimes([gw, backend("echo", [s.port], protocol="h2c"),
                       api("grpc", "/", "echo", operations=[
                           {"name": "echo", "method": "POST", "path": "/pkg.Echo/",
                            "pathType": "prefix"}])], workers=workers)
        ch = grpc.insecure_channel("127.0.0.1:%d" % port, options=[
            ("grpc.max_receive_message_length", 8 << 20),
            ("grpc.max_send_message_length", 8 << 20)])
        return rt, s, ch

    yield make
    for s in servers:
        s.stop()


def test_unary_with_trailers_and_a_large_message(grpc_env):
    rt, s, ch = grpc_env()
    call = ch.unary_unary("/pkg.Echo/Unary")
    resp, info = call.with_call(b"hello", timeout=10)
    assert resp == b"hello"
    assert ("x-served-by", "echo") in info.trailing_metadata()
    big = bytes(range(256)) * (4 * 4096)  # 4 MiB
    assert call(big, timeout=20) == big
    ch.close()


def test_streaming_calls(grpc_env):
    rt, s, ch = grpc_env()
    items = list(ch.unary_stream("/pkg.Echo/ServerStream")(b"20", timeout=10))
    assert items == [b"item-%d" % i for i in range(20)]
    joined = ch.stream_unary("/pkg.Echo/ClientStream")(iter([b"a", b"b", b"c"]), timeout=10)
    assert joined == b"a|b|c"
    out = list(ch.stream_stream("/pkg.Echo/Bidi")(iter([b"x%d" % i for i in range(10)]),
                                                   timeout=10))
    assert out == [b"echo:x%d" % i for i in range(10)]
    ch.close()


def test_backend_status_passes_through(grpc_env):
    rt, s, ch = grpc_env()
    with pytest.raises(grpc.RpcError) as e:
        ch.unary_unary("/pkg.Echo/Fail")(b"", timeout=10)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert e.value.details() == "not today"
    ch.close()


def test_deadline_expires_and_reaches_the_backend(grpc_env):
    rt, s, ch = grpc_env()
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        ch.unary_unary("/pkg.Echo/Slow")(b"", timeout=0.4)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - t0 < 2
    # The gateway gave up at the deadline and reset its stream to the backend.
    assert s.cancelled.wait(3), "the backend never saw the call cancelled"
    ch.close()


def test_client_cancel_propagates(grpc_env):
    rt, s, ch = grpc_env()
    fut = ch.unary_unary("/pkg.Echo/Slow").future(b"", timeout=10)
    time.sleep(0.3)
    fut.cancel()
    assert s.cancelled.wait(3), "the cancel never reached the backend"
    ch.close()


def test_unknown_service_and_dead_backend(grpc_env):
    rt, s, ch = grpc_env()
    with pytest.raises(grpc.RpcError) as e:
        ch.unary_unary("/other.Svc/Call")(b"", timeout=5)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    s.stop()
    with pytest.raises(grpc.RpcError) as e:
        ch.unary_unary("/pkg.Echo/Unary")(b"x", timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    ch.close()


def test_many_concurrent_calls_share_upstream_connections(grpc_env):
    rt, s, ch = grpc_env(workers=2)
    call = ch.unary_unary("/pkg.Echo/Unary")
    futs = [call.future(b"m%d" % i, timeout=20) for i in range(200)]
    assert [f.result() for f in futs] == [b"m%d" % i for i in range(200)]
    ch.close()


def test_backend_dying_mid_stream_ends_the_call(grpc_env):
    """The server dies after a few messages of a server stream: the client
    gets the messages sent so far and then an error, never a hang and never
    an OK that looks complete."""
    rt, s, ch = grpc_env()
    stream = ch.unary_stream("/pkg.Echo/ServerStream")(b"1000000", timeout=10)
    got = []
    with pytest.raises(grpc.RpcError) as e:
        for item in stream:
            got.append(item)
            if len(got) == 5:
                s.stop()
    assert len(got) >= 5
    assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL,
                              grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN), e.value
    ch.close()
