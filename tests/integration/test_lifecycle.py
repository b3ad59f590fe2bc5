"""Process lifecycle: graceful shutdown on SIGTERM/SIGINT (in-flight requests
finish, new connections refused, idle ones closed, exit 0), the drain
timeout, and the connection timeouts (slowloris header timeout, idle
keep-alive)."""

import signal
import threading
import time

from helpers import (ResponseReader, connect, connection_refused, is_closed, request, wait_until)


def _in_flight(port, target, out):
    try:
        out["resp"] = request(port, "GET", target, timeout=20)
    except Exception as e:  # noqa: BLE001 - reported by the test
        out["error"] = repr(e)


def test_graceful_shutdown_finishes_in_flight(simple):
    env = simple(drain_timeout="10s")
    rt = env.runtime
    idle = connect(env.port)
    idle_reader = ResponseReader(idle)
    assert request(env.port, "GET", "/t/echo", sock=idle, reader=idle_reader).status == 200

    out = {}
    t = threading.Thread(target=_in_flight, args=(env.port, "/t/delay/1500", out))
    t.start()
    assert env.backend.wait_for(lambda b: b.count("/delay") == 1, 5), \
        "in-flight request never arrived"
    t0 = time.monotonic()
    rt.signal(signal.SIGTERM)

    wait_until(lambda: connection_refused(env.port), 1.0,
               what="new connections to be refused right after SIGTERM")
    assert is_closed(idle, 2.0, idle_reader), "idle keep-alive connection not closed on shutdown"
    idle.close()

    t.join(10)
    assert "error" not in out, out
    assert out["resp"].status == 200, out["resp"]
    assert out["resp"].json()["target"] == "/delay/1500"
    code = rt.wait_exit(10)
    assert code == 0, "exit code %r after graceful shutdown; log:\n%s" % (code, rt.log()[-3000:])
    assert time.monotonic() - t0 >= 1.0, "exited before the in-flight request could finish"


def test_sigint_is_graceful_too(simple):
    env = simple()
    assert request(env.port, "GET", "/t/echo").status == 200
    env.runtime.signal(signal.SIGINT)
    assert env.runtime.wait_exit(10) == 0


def test_drain_timeout_bounds_shutdown(simple):
    env = simple(drain_timeout="1s", gw_kw={"timeouts": {"upstreamResponse": "60s"}})
    out = {}
    t = threading.Thread(target=_in_flight, args=(env.port, "/t/delay/8000", out))
    t.start()
    assert env.backend.wait_for(lambda b: b.count("/delay") == 1, 5)
    t0 = time.monotonic()
    env.runtime.signal(signal.SIGTERM)
    code = env.runtime.wait_exit(6)
    took = time.monotonic() - t0
    assert code is not None, "still running 6 s after SIGTERM with a 1 s drain timeout"
    assert code == 0, "exit code %r" % code
    assert took < 4.0, "shutdown took %.1fs with a 1 s drain timeout" % took
    t.join(10)
    # The abandoned request got no 200 (it could not have finished).
    assert "resp" not in out or out["resp"].status != 200


def test_slowloris_header_timeout(simple):
    env = simple(gw_kw={"timeouts": {"requestHeader": "1s"}})
    s = connect(env.port)
    try:
        t0 = time.monotonic()
        s.sendall(b"GET /t/echo HTTP/1.1\r\nHost: a\r\n")
        closed_at = None
        s.settimeout(0.2)
        for i in range(40):  # trickle a header line every 200 ms, up to 8 s
            try:
                data = s.recv(4096)
            except TimeoutError:
                data = None
            except ConnectionResetError:
                data = b""
            if data is not None:
                # A 408 answer is fine; then the connection must close.
                assert data == b"" or data.startswith(b"HTTP/1.1 408"), data
                closed_at = time.monotonic() - t0
                break
            try:
                s.sendall(b"X-Slow-%d: x\r\n" % i)
            except (BrokenPipeError, ConnectionResetError):
                closed_at = time.monotonic() - t0
                break
        assert closed_at is not None, "a connection trickling headers was never closed"
        assert 0.8 <= closed_at <= 3.0, "closed after %.2fs, requestHeader is 1s" % closed_at
    finally:
        s.close()
    assert env.backend.count() == 0


def test_silent_connection_closed_at_header_timeout(simple):
    env = simple(gw_kw={"timeouts": {"requestHeader": "1s", "idle": "30s"}})
    s = connect(env.port)
    try:
        t0 = time.monotonic()
        assert is_closed(s, 4.0), "a connection that never sent a byte stayed open"
        assert time.monotonic() - t0 >= 0.8
    finally:
        s.close()


def test_idle_keepalive_timeout(simple):
    env = simple(gw_kw={"timeouts": {"idle": "1s", "requestHeader": "10s"}})
    s = connect(env.port)
    try:
        reader = ResponseReader(s)
        assert request(env.port, "GET", "/t/echo", sock=s, reader=reader).status == 200
        t0 = time.monotonic()
        assert is_closed(s, 4.0, reader), "idle keep-alive connection not closed"
        took = time.monotonic() - t0
        assert 0.8 <= took <= 3.0, "idle connection closed after %.2fs, idle is 1s" % took
    finally:
        s.close()
    # Activity resets the idle timer.
    s = connect(env.port)
    try:
        reader = ResponseReader(s)
        for _ in range(4):
            assert request(env.port, "GET", "/t/echo", sock=s, reader=reader).status == 200
            time.sleep(0.5)
    finally:
        s.close()


def test_many_connections_and_max_connections(simple):
    # One worker: with N workers the runtime splits the limit between them
    # (SO_REUSEPORT spreads connections by hash), so only 1 makes it exact.
    env = simple(gw_kw={"limits": {"maxConnections": 20}}, workers=1)
    socks = []
    try:
        for _ in range(20):
            socks.append(connect(env.port))
        for s in socks[:5]:
            r = request(env.port, "GET", "/t/echo", sock=s, reader=ResponseReader(s))
            assert r.status == 200
        # Over the limit: refused one way or another (closed, or a 503).
        extra = connect(env.port)
        try:
            extra.sendall(b"GET /t/echo HTTP/1.1\r\nHost: a\r\n\r\n")
            reader = ResponseReader(extra)
            try:
                r = reader.read_response()
                assert r.status == 503, r
            except (EOFError, ConnectionResetError):
                pass
        finally:
            extra.close()
    finally:
        for s in socks:
            s.close()
    # Once they are gone, new connections work again.
    wait_until(lambda: request(env.port, "GET", "/t/echo").status == 200, 5,
               what="a new connection to be served after the others closed")


def test_drain_delay_keeps_serving_with_ready_503_then_drains(simple):
    """--drain-delay: on SIGTERM /ready answers 503 at once while the
    listener and keep-alive connections keep serving, so a load balancer's
    health check takes the runtime out before it closes anything; after the
    delay it drains as without one (tests/integration/test_fleet_lb.py shows
    why, behind HAProxy)."""
    env = simple(extra_args=["--drain-delay", "3s"])
    rt = env.runtime
    kept = connect(env.port)
    reader = ResponseReader(kept)
    assert request(env.port, "GET", "/t/echo", sock=kept, reader=reader).status == 200
    assert rt.admin_get("/ready")[0] == 200
    t0 = time.monotonic()
    rt.signal(signal.SIGTERM)
    wait_until(lambda: rt.admin_get("/ready")[0] == 503, 0.5,
               what="/ready to answer 503 right after SIGTERM")
    # Still serving: the kept-alive connection and new connections.
    for _ in range(3):
        assert request(env.port, "GET", "/t/echo", sock=kept, reader=reader).status == 200
        assert request(env.port, "GET", "/t/echo").status == 200
        time.sleep(0.1)
    assert rt.alive()
    # Then the drain: new connections refused, the idle one closed, exit 0.
    wait_until(lambda: connection_refused(env.port), 3.0,
               what="new connections refused after the drain delay")
    assert time.monotonic() - t0 >= 2.9, "drained before --drain-delay was over"
    assert is_closed(kept, 2.0, reader), "idle keep-alive connection not closed after the delay"
    kept.close()
    assert rt.wait_exit(10) == 0
    assert "serving for 3000 ms more (--drain-delay)" in rt.log()
    assert "--drain-delay over: draining" in rt.log()


def test_drain_delay_second_sigterm_exits(simple):
    env = simple(extra_args=["--drain-delay", "60s"])
    rt = env.runtime
    rt.signal(signal.SIGTERM)
    wait_until(lambda: rt.admin_get("/ready")[0] == 503, 1.0, what="/ready 503 after SIGTERM")
    rt.signal(signal.SIGTERM)
    assert rt.wait_exit(5) == 0, "a second SIGTERM during --drain-delay did not exit"


def test_drain_delay_bad_value_names_the_flag(tmp_path):
    import subprocess
    from helpers import runtime_binary
    r = subprocess.run([runtime_binary(), "--drain-delay", "soon", "--config", str(tmp_path)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert r.returncode != 0
    assert "--drain-delay soon: use a duration like 2s" in r.stderr, r.stderr
