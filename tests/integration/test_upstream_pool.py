"""Upstream keep-alive pools under concurrency: connections that a burst
opened are kept for the next burst (up to connectionPool.maxIdle per worker
and endpoint), so a gateway under steady concurrency does not churn
connections (a connect, a TIME_WAIT port and a slow-start per request)."""

import threading

from backend import Backend
from helpers import api, backend, free_port, gateway, request

CONCURRENCY = 150


def _burst(port):
    statuses = []
    lock = threading.Lock()

    def one():
        r = request(port, "GET", "/t/delay/1000", timeout=30)
        with lock:
            statuses.append(r.status)

    # Each request holds its upstream connection for a second, so the burst's
    # requests overlap and each needs its own connection.
    threads = [threading.Thread(target=one) for _ in range(CONCURRENCY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return statuses


def _two_bursts(runtimes, **pool):
    with Backend() as b:
        port = free_port()
        runtimes([gateway(port), backend("b", [b.port], **pool), api("t", "/t", "b")],
                 workers=1)
        assert _burst(port) == [200] * CONCURRENCY
        first = b.connections
        assert _burst(port) == [200] * CONCURRENCY
        return first, b.connections - first


def test_default_pool_keeps_a_burst_of_connections_for_the_next(runtimes):
    # The default maxIdle (1024) keeps all 150: the second burst reuses them.
    # With the old default of 64, 86 or more were closed after the first
    # burst and opened again for the second.
    first, second = _two_bursts(runtimes)
    assert first >= 100, first  # the burst overlapped: far more than 64
    assert second <= max(10, CONCURRENCY - first + 10), \
        "second burst opened %d new connections after %d" % (second, first)


def test_max_idle_bounds_the_connections_kept(runtimes):
    first, second = _two_bursts(runtimes, connectionPool={"maxIdle": 20})
    assert first >= 100, first
    assert second >= first - 20 - 10, "only %d new connections after %d" % (second, first)
