"""Upstream behaviour: load balancing, retries (and when not to retry),
active health-check ejection and recovery, passive outlier ejection.

Every test runs over HTTP/1.1 and HTTP/2 (the `proto` fixture): balancing,
retries and ejection act on the protocol-independent request and exchange.
"""

import collections
import time

from backend import Backend
from helpers import api, assert_gateway_error, backend, closed_port, free_port, wait_until

NO_OUTLIER = {"consecutiveFailures": 0}


def _servers(proto, port, target, n, method="GET", body=None, headers=None):
    out = []
    for i in range(n):
        r = proto.request(port, method, target, body=body, headers=headers)
        out.append((r.status, r.header("X-Backend")))
    return out


def test_round_robin_spreads_evenly(backends, runtimes, proto):
    a, b = backends("a"), backends("b")
    port = free_port()
    runtimes([proto.gateway(port), backend("pool", [a.port, b.port]), api("t", "/t", "pool")],
             workers=1)
    got = collections.Counter(s for _, s in _servers(proto, port, "/t/echo", 20))
    assert got == {"a": 10, "b": 10}, got


def test_weighted_round_robin(backends, runtimes, proto):
    a, b = backends("a"), backends("b")
    port = free_port()
    runtimes([proto.gateway(port),
              backend("pool", [{"address": "127.0.0.1", "port": a.port, "weight": 3},
                               {"address": "127.0.0.1", "port": b.port, "weight": 1}]),
              api("t", "/t", "pool")], workers=1)
    got = collections.Counter(s for _, s in _servers(proto, port, "/t/echo", 40))
    assert got == {"a": 30, "b": 10}, got


def test_consistent_hash_on_header(backends, runtimes, proto):
    bs = [backends("h%d" % i) for i in range(3)]
    port = free_port()
    runtimes([proto.gateway(port),
              backend("pool", [b.port for b in bs],
                      loadBalancing={"policy": "consistent-hash", "hashOn": {"header": "X-User"}}),
              api("t", "/t", "pool")])
    seen = {}
    for user in range(30):
        for _ in range(3):
            r = proto.request(port, "GET", "/t/echo", headers={"X-User": "user-%d" % user})
            assert r.status == 200
            seen.setdefault(user, set()).add(r.header("X-Backend"))
    assert all(len(v) == 1 for v in seen.values()), "same key, different endpoints: %r" % seen
    assert len({next(iter(v)) for v in seen.values()}) >= 2, "30 keys all hashed to one endpoint"


def test_api_backend_weights_split_traffic(backends, runtimes, proto):
    a, b = backends("a"), backends("b")
    port = free_port()
    runtimes([proto.gateway(port), backend("a", [a.port]), backend("b", [b.port]),
              api("t", "/t", backend_refs=[{"name": "a", "weight": 1},
                                           {"name": "b", "weight": 1}])],
             workers=1)
    got = collections.Counter(s for _, s in _servers(proto, port, "/t/echo", 40))
    assert set(got) == {"a", "b"} and min(got.values()) >= 10, got


def test_retry_on_connect_failure(backends, runtimes, proto):
    live = backends("live")
    port = free_port()
    rt = runtimes([proto.gateway(port),
                   backend("pool", [closed_port(), live.port], outlierDetection=NO_OUTLIER),
                   api("t", "/t", "pool", retries={"attempts": 2})])
    statuses = collections.Counter(s for s, _ in _servers(proto, port, "/t/echo", 30))
    assert statuses == {200: 30}, statuses
    assert live.count() == 30
    assert rt.metric("sluice_upstream_retries_total", cluster="default/pool") >= 1
    assert rt.metric("sluice_upstream_errors_total", cluster="default/pool", kind="connect") >= 1


def test_retry_on_503_for_get_only(backends, runtimes, proto):
    bad, good = backends("bad"), backends("good")
    bad.fail_status = 503
    port = free_port()
    runtimes([proto.gateway(port),
              backend("pool", [bad.port, good.port], outlierDetection=NO_OUTLIER),
              api("t", "/t", "pool", retries={"attempts": 2, "on": ["503"]})])
    got = _servers(proto, port, "/t/echo", 20)
    assert collections.Counter(s for s, _ in got) == {200: 20}, got
    assert all(srv == "good" for _, srv in got)
    assert bad.count() >= 1, "the failing endpoint was never tried: the test proves nothing"

    bad.clear()
    good.clear()
    got = _servers(proto, port, "/t/echo", 20, method="POST", body=b"payload")
    failed = [s for s, _ in got if s == 503]
    assert failed, "a POST answered 503 must not be retried (nonIdempotent is false): %r" % got
    assert bad.count() == len(failed), "each failed POST reached the bad endpoint once"
    assert bad.count() + good.count() == 20, "a POST was sent twice"


def test_retry_non_idempotent_when_allowed(backends, runtimes, proto):
    bad, good = backends("bad"), backends("good")
    bad.fail_status = 503
    port = free_port()
    runtimes([proto.gateway(port),
              backend("pool", [bad.port, good.port], outlierDetection=NO_OUTLIER),
              api("t", "/t", "pool",
                  retries={"attempts": 2, "on": ["503"], "nonIdempotent": True})])
    got = _servers(proto, port, "/t/echo", 20, method="POST", body=b"payload")
    assert collections.Counter(s for s, _ in got) == {200: 20}, got
    assert good.count() == 20


def test_retry_on_reset(backends, runtimes, proto):
    bad, good = backends("bad"), backends("good")
    bad.fail_action = "reset"
    port = free_port()
    rt = runtimes([proto.gateway(port),
                   backend("pool", [bad.port, good.port], outlierDetection=NO_OUTLIER),
                   api("t", "/t", "pool", retries={"attempts": 2, "on": ["reset"]})])
    got = _servers(proto, port, "/t/echo", 10)
    assert all(st == 200 and s == "good" for st, s in got), got
    assert bad.count() >= 1, "the resetting endpoint was never tried"
    assert rt.metric("sluice_upstream_errors_total", cluster="default/pool", kind="reset") >= 1


def test_no_retry_when_attempts_zero(backends, runtimes, proto):
    bad, good = backends("bad"), backends("good")
    bad.fail_status = 503
    port = free_port()
    runtimes([proto.gateway(port),
              backend("pool", [bad.port, good.port], outlierDetection=NO_OUTLIER),
              api("t", "/t", "pool", retries={"attempts": 0})], workers=1)
    got = collections.Counter(s for s, _ in _servers(proto, port, "/t/echo", 10))
    assert got == {200: 5, 503: 5}, got


def test_health_check_ejects_and_recovers(backends, runtimes, proto):
    a, b = backends("a"), backends("b")
    port = free_port()
    hc = {"path": "/health", "interval": "100ms", "timeout": "100ms",
          "unhealthyThreshold": 2, "healthyThreshold": 2}
    runtimes([proto.gateway(port), backend("pool", [a.port, b.port], healthCheck=hc,
                                     outlierDetection=NO_OUTLIER),
              api("t", "/t", "pool", retries={"attempts": 0})])
    wait_until(lambda: a.count("/health", False) >= 1 and b.count("/health", False) >= 1, 5,
               what="health checks to reach both endpoints")
    got = collections.Counter(s for _, s in _servers(proto, port, "/t/echo", 10))
    assert set(got) == {"a", "b"}, got

    a.health_status = 503
    wait_until(lambda: all(s == "b" for _, s in _servers(proto, port, "/t/echo", 6)), 5,
               what="endpoint a to be skipped after failing health checks")
    got = _servers(proto, port, "/t/echo", 20)
    assert all(st == 200 and s == "b" for st, s in got), got

    a.health_status = 200
    wait_until(lambda: any(s == "a" for _, s in _servers(proto, port, "/t/echo", 6)), 5,
               what="endpoint a to be used again after passing health checks")
    hreq = a.received("/health")[-1]
    assert hreq["method"] == "GET"


def test_health_check_marks_refused_endpoint_down(backends, runtimes, proto):
    a = backends("a")
    dead = closed_port()
    port = free_port()
    # A refused connect fails a check at once; the timeout only has to
    # spare the live endpoint on a loaded machine (a 100 ms one marked it
    # down under the sanitizers in CI).
    hc = {"path": "/health", "interval": "1s", "timeout": "1s",
          "unhealthyThreshold": 1, "healthyThreshold": 1}
    rt = runtimes([proto.gateway(port), backend("pool", [dead, a.port], healthCheck=hc,
                                          outlierDetection=NO_OUTLIER),
                   api("t", "/t", "pool", retries={"attempts": 0})])
    wait_until(lambda: all(st == 200 and s == "a" for st, s in _servers(proto, port, "/t/echo", 10)),
               10, what="every request to go to the live endpoint")
    # Bring the dead endpoint to life: it joins the rotation.
    revived = Backend(port=dead, name="revived").start()
    try:
        wait_until(lambda: any(s == "revived" for _, s in _servers(proto, port, "/t/echo", 4)), 5,
                   what="the revived endpoint to receive traffic")
    finally:
        revived.stop()
    assert rt.alive()


def test_passive_outlier_ejection(backends, runtimes, proto):
    good = backends("good")
    dead = closed_port()
    port = free_port()
    rt = runtimes([proto.gateway(port),
                   backend("pool", [dead, good.port],
                           outlierDetection={"consecutiveFailures": 2, "baseEjectionTime": "2s",
                                             "maxEjectionPercent": 50}),
                   api("t", "/t", "pool", retries={"attempts": 0})], workers=1)
    first = _servers(proto, port, "/t/echo", 6)
    assert sum(1 for s, _ in first if s == 502) in (1, 2), \
        "the dead endpoint should fail twice at most before ejection: %r" % first
    errors_before = rt.metric("sluice_upstream_errors_total", cluster="default/pool",
                              kind="connect")
    got = _servers(proto, port, "/t/echo", 20)
    assert all(st == 200 for st, _ in got), "ejected endpoint still used: %r" % got
    assert rt.metric("sluice_upstream_errors_total", cluster="default/pool",
                     kind="connect") == errors_before
    # After the ejection time it is tried again (and, alive now, kept).
    revived = Backend(port=dead, name="revived").start()
    try:
        wait_until(lambda: any(s == "revived" for _, s in _servers(proto, port, "/t/echo", 4)), 6,
                   what="the endpoint to come back after baseEjectionTime")
    finally:
        revived.stop()


def test_outlier_ejection_never_ejects_everything(backends, runtimes, proto):
    port = free_port()
    runtimes([proto.gateway(port),
              backend("pool", [closed_port()],
                      outlierDetection={"consecutiveFailures": 1, "baseEjectionTime": "30s",
                                        "maxEjectionPercent": 50}),
              api("t", "/t", "pool", retries={"attempts": 0})])
    for _ in range(5):
        r = proto.request(port, "GET", "/t/echo")
        assert r.status in (502, 503), r
        assert_gateway_error(r, r.status)
