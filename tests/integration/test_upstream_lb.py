"""Load balancing policies through the real proxy, beyond round-robin and
header hashing (test_upstream.py): consistent hashing on a cookie and on the
client address, least-request steering away from a slow endpoint, random
spreading. The algorithms themselves are unit-tested in
tests/unit/runtime/proxy/test_lb.c; these check the proxy feeds them the right key
and state.

Every test runs over HTTP/1.1 and HTTP/2 (the `proto` fixture).
"""

import collections
import threading
import time

from helpers import api, backend, free_port


def _hash_pool(backends, runtimes, proto, hash_on):
    bs = [backends("h%d" % i) for i in range(3)]
    port = free_port()
    runtimes([proto.gateway(port),
              backend("pool", [b.port for b in bs],
                      loadBalancing={"policy": "consistent-hash", "hashOn": hash_on}),
              api("t", "/t", "pool")], workers=2)
    return port


def test_consistent_hash_on_cookie(backends, runtimes, proto):
    port = _hash_pool(backends, runtimes, proto, {"cookie": "session"})
    seen = {}
    for user in range(30):
        for _ in range(3):
            r = proto.request(port, "GET", "/t/echo",
                        headers={"Cookie": "theme=dark; session=s-%d; lang=en" % user})
            assert r.status == 200
            seen.setdefault(user, set()).add(r.header("X-Backend"))
    assert all(len(v) == 1 for v in seen.values()), "same cookie, different endpoints: %r" % seen
    assert len({next(iter(v)) for v in seen.values()}) >= 2, "30 cookies all on one endpoint"


def test_consistent_hash_on_client_ip(backends, runtimes, proto):
    port = _hash_pool(backends, runtimes, proto, {"clientIp": True})
    # One client address: every request, on new connections and on both
    # workers, goes to the same endpoint whatever its headers say.
    got = collections.Counter()
    for i in range(30):
        r = proto.request(port, "GET", "/t/echo", headers={"X-User": "u%d" % i,
                                                     "Cookie": "session=%d" % i})
        assert r.status == 200
        got[r.header("X-Backend")] += 1
    assert len(got) == 1, got


def test_least_request_avoids_the_busy_endpoint(backends, runtimes, proto):
    a, b = backends("a"), backends("b")
    port = free_port()
    runtimes([proto.gateway(port),
              backend("pool", [a.port, b.port], loadBalancing={"policy": "least-request"}),
              api("t", "/t", "pool", timeouts={"upstreamResponse": "10s"})], workers=1)
    # One slow request keeps an endpoint busy; every quick request meanwhile
    # must go to the idle one (round-robin would send half to the busy one).
    busy = []
    t = threading.Thread(target=lambda: busy.append(
        proto.request(port, "GET", "/t/delay/2000", timeout=10).header("X-Backend")))
    t.start()
    time.sleep(0.3)
    quick = collections.Counter(proto.request(port, "GET", "/t/echo").header("X-Backend")
                                for _ in range(10))
    t.join()
    assert len(busy) == 1
    idle = "b" if busy[0] == "a" else "a"
    assert quick == {idle: 10}, "quick requests went to the busy endpoint: busy=%s, got %r" % (
        busy[0], quick)


def test_random_spreads(backends, runtimes, proto):
    bs = [backends("r%d" % i) for i in range(3)]
    port = free_port()
    runtimes([proto.gateway(port),
              backend("pool", [b.port for b in bs], loadBalancing={"policy": "random"}),
              api("t", "/t", "pool")], workers=1)
    got = collections.Counter(proto.request(port, "GET", "/t/echo").header("X-Backend")
                              for _ in range(150))
    assert set(got) == {"r0", "r1", "r2"}, got
    assert min(got.values()) >= 20, "random should spread 150 requests over 3 endpoints: %r" % got
