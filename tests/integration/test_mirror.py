"""Traffic mirroring (`mirror: {backend, percent}`, runtime/proxy/mirror.c,
docs/configuration.md "Traffic mirroring"): the shadow gets a copy of the
requests (method, path, query, headers, a body read whole), its answers are
discarded, and a slow or dead shadow neither slows nor fails the real
requests: copies beyond the bounded queue are dropped and counted."""

import subprocess
import time

from helpers import (api, backend as backend_doc, closed_port, free_port, gateway, request,
                     wait_until)


def _config(port, primary, shadow_ep, percent=100, **spec):
    return [gateway(port), backend_doc("primary", [primary]), backend_doc("shadow", [shadow_ep]),
            api("t", "/t", "primary", mirror={"backend": "shadow", "percent": percent}, **spec)]


def test_the_shadow_gets_copies(backends, runtimes):
    p, s = backends("p"), backends("s")
    port = free_port()
    rt = runtimes(_config(port, p.port, s.port))
    for i in range(20):
        r = request(port, "GET", "/t/echo?i=%d" % i, headers={"X-Trace": "t%d" % i})
        assert r.status == 200 and r.header("X-Backend") == "p"
    wait_until(lambda: len(s.requests) == 20, 5, what="20 copies at the shadow")
    got = sorted(rec["target"] for rec in s.requests)
    assert got == sorted("/echo?i=%d" % i for i in range(20)), got
    assert any(("X-Trace", "t3") in rec["headers"] for rec in s.requests)
    assert rt.metric("sluice_mirror_requests_total", result="sent") == 20


def test_a_dead_or_slow_shadow_does_not_touch_the_primary(backends, runtimes):
    import socket
    p = backends("p")
    # dead: nothing listens; slow: it accepts and never answers (each copy
    # waits out its 1 s timeout)
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen(4096)
    for shadow in (closed_port(), sink.getsockname()[1]):
        port = free_port()
        rt = runtimes(_config(port, p.port, shadow))
        t0 = time.monotonic()
        for _ in range(50):
            r = request(port, "GET", "/t/echo")
            assert r.status == 200 and r.header("X-Backend") == "p"
        elapsed = time.monotonic() - t0
        assert elapsed < 3, "50 requests took %.1fs with a bad shadow" % elapsed
        rt.stop()
    sink.close()


def test_a_full_queue_drops_and_counts(backends, runtimes):
    p = backends("p")
    # a shadow that accepts connections and never answers: each copy waits 1 s
    import socket
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen(4096)
    port = free_port()
    rt = runtimes(_config(port, p.port, sink.getsockname()[1]), workers=1)
    n = 3000
    t0 = time.monotonic()
    out = subprocess.run(["h2load", "--h1", "-n", str(n), "-c", "8", "-t", "1",
                          "http://127.0.0.1:%d/t/echo" % port], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=120).stdout
    assert "%d succeeded" % n in out, out
    assert time.monotonic() - t0 < 30
    dropped = rt.metric("sluice_mirror_requests_total", result="dropped")
    assert dropped >= n - 1024 - 50, dropped  # the ring holds 1024
    sink.close()
