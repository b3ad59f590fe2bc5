"""A Backend's circuit breaker (`circuitBreaker`, runtime/proxy/request.c,
docs/configuration.md "Circuit breakers"): over maxRequests or
maxConnections the gateway answers 503 circuit_open at once instead of
queueing, across workers, and counts it; under the limits nothing changes."""

import json
import threading
import time

from helpers import (api, assert_gateway_error, backend as backend_doc, free_port, gateway,
                     request)


def _burst(port, n, path="/t/delay/1500"):
    out = [None] * n

    def one(i):
        t0 = time.monotonic()
        r = request(port, "GET", path, timeout=10)
        out[i] = (r, time.monotonic() - t0)
    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
        time.sleep(0.05)
    for t in ts:
        t.join()
    return out


def _start(backends, runtimes, workers=2, **cb):
    b = backends("slow")
    port = free_port()
    rt = runtimes([gateway(port), backend_doc("slow", [b.port], circuitBreaker=cb),
                   api("t", "/t", "slow", timeouts={"upstreamResponse": "10s"})],
                  workers=workers)
    return rt, port


def test_max_requests_answers_503_at_once(backends, runtimes):
    rt, port = _start(backends, runtimes, maxRequests=2)
    got = _burst(port, 5)
    ok = [t for r, t in got if r.status == 200]
    refused = [(r, t) for r, t in got if r.status == 503]
    assert len(ok) == 2 and len(refused) == 3, [r.status for r, _ in got]
    for r, t in refused:
        assert assert_gateway_error(r, 503)["code"] == "circuit_open"
        assert t < 1.0, "a refused request waited %.2fs" % t
    assert rt.metric("sluice_circuit_open_total", cluster="default/slow",
                     limit="max_requests") == 3
    # the gauge went back to 0: all pass again
    assert all(r.status == 200 for r, _ in _burst(port, 2))


def test_max_connections(backends, runtimes):
    # One worker: idle keep-alive connections count against the limit, and
    # with two workers the idle one would be the other worker's.
    rt, port = _start(backends, runtimes, workers=1, maxConnections=1)
    got = _burst(port, 3)
    assert sorted(r.status for r, _ in got) == [200, 503, 503], [r.status for r, _ in got]
    assert rt.metric("sluice_circuit_open_total", cluster="default/slow",
                     limit="max_connections") == 2
    # sequential requests reuse the one connection
    for _ in range(3):
        assert request(port, "GET", "/t/echo").status == 200


def test_under_the_limits_nothing_changes(backends, runtimes):
    rt, port = _start(backends, runtimes, maxRequests=100, maxConnections=100,
                      maxPendingRequests=100, maxRetries=100)
    assert all(r.status == 200 for r, _ in _burst(port, 5, "/t/delay/200"))
    assert rt.metric("sluice_circuit_open_total", cluster="default/slow",
                     limit="max_requests") in (0, None)
