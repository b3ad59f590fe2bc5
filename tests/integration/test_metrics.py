"""Runtime /metrics series of issue 11 ("Metrics"), each moved by the event it
counts: upstream connect errors apart from connect timeouts and response
timeouts, open upstream connections per endpoint, passive ejections, rate
limit rejections by scope and reason, and the text format itself (HELP and
TYPE once per family, histograms cumulative up to +Inf).

The same output is checked by a real Prometheus server in
test_prometheus.py. Run: SLUICE_BUILD=build /usr/bin/python3 -m pytest
tests/integration/test_metrics.py
"""

import re
import socket
import threading

from helpers import api, backend, closed_port, free_port, gateway, request, wait_until


def samples(rt, name, **labels):
    """The samples of `name` with those labels; fails when there is none (a
    missing series must not read as a zero)."""
    got = [(l, v) for n, l, v in rt.metrics()
           if n == name and all(l.get(k) == val for k, val in labels.items())]
    assert got, "no sample %s%r in /metrics" % (name, labels)
    return got


def value(rt, name, **labels):
    return sum(v for _, v in samples(rt, name, **labels))


class SilentServer:
    """Accepts TCP connections and never sends a byte: a TLS handshake with
    it never completes, so a Backend with `tls` times out connecting."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
                self.conns.append(c)
            except OSError:
                continue

    def close(self):
        self.stop.set()
        self.thread.join(2)
        for c in self.conns:
            c.close()
        self.sock.close()


def test_connect_errors_connect_timeouts_and_response_timeouts_are_counted_apart(backends,
                                                                                  runtimes):
    live = backends("live")
    silent = SilentServer()
    try:
        port = free_port()
        no_retry = {"attempts": 0}
        no_outlier = {"consecutiveFailures": 0}
        rt = runtimes([
            gateway(port),
            backend("refused", [closed_port()], outlierDetection=no_outlier),
            backend("silent", [silent.port], tls={}, outlierDetection=no_outlier,
                    timeouts={"connect": "200ms"}),
            backend("slow", [live.port], outlierDetection=no_outlier),
            api("r", "/r", "refused", retries=no_retry),
            api("s", "/s", "silent", retries=no_retry, timeouts={"upstreamConnect": "200ms"}),
            api("w", "/w", "slow", retries=no_retry, timeouts={"upstreamResponse": "200ms"}),
        ], workers=1)
        assert request(port, "GET", "/r/x").status == 502
        assert request(port, "GET", "/s/x").status == 502
        assert request(port, "GET", "/w/delay/1000").status == 504

        m = "sluice_upstream_errors_total"
        assert value(rt, m, cluster="default/refused", kind="connect") == 1
        assert value(rt, m, cluster="default/refused", kind="connect_timeout") == 0
        assert value(rt, m, cluster="default/silent", kind="connect_timeout") == 1
        assert value(rt, m, cluster="default/silent", kind="connect") == 0
        assert value(rt, m, cluster="default/slow", kind="timeout") == 1
        assert value(rt, m, cluster="default/slow", kind="connect_timeout") == 0
    finally:
        silent.close()


def test_upstream_connections_active_per_endpoint(backends, runtimes):
    b = backends("b")
    port = free_port()
    rt = runtimes([gateway(port), backend("pool", [b.port]), api("t", "/t", "pool")], workers=2)
    endpoint = "127.0.0.1:%d" % b.port
    name = "sluice_upstream_connections_active"
    assert value(rt, name, cluster="default/pool", endpoint=endpoint) == 0
    for _ in range(4):
        assert request(port, "GET", "/t/x").status == 200
    # Kept alive in the pools (one per worker that served a request).
    n = value(rt, name, cluster="default/pool", endpoint=endpoint)
    assert 1 <= n <= 2, n
    assert n == b.connections
    # The origin goes away: the pooled connections see EOF and close.
    b.stop()
    wait_until(lambda: value(rt, name, cluster="default/pool", endpoint=endpoint) == 0, 5,
               what="the closed upstream connections counted out")


def test_passive_ejection_gauge_and_counter(backends, runtimes):
    live = backends("live")
    port = free_port()
    dead = closed_port()
    rt = runtimes([gateway(port),
                   backend("pool", [dead, live.port],
                           outlierDetection={"consecutiveFailures": 2,
                                             "baseEjectionTime": "30s"}),
                   api("t", "/t", "pool", retries={"attempts": 1})], workers=1)
    ejected = "sluice_endpoint_ejected"
    dead_ep, live_ep = "127.0.0.1:%d" % dead, "127.0.0.1:%d" % live.port
    assert value(rt, ejected, cluster="default/pool", endpoint=dead_ep) == 0
    for _ in range(8):
        assert request(port, "GET", "/t/x").status == 200
    assert value(rt, ejected, cluster="default/pool", endpoint=dead_ep) == 1
    assert value(rt, ejected, cluster="default/pool", endpoint=live_ep) == 0
    assert value(rt, "sluice_endpoint_ejections_total", cluster="default/pool",
                 endpoint=dead_ep) == 1
    assert value(rt, "sluice_endpoint_ejections_total", cluster="default/pool",
                 endpoint=live_ep) == 0


def test_rate_limit_rejections_by_scope_and_reason(backends, runtimes):
    b = backends("echo")
    port = free_port()
    local = {"limits": [{"requests": 2, "period": "1h", "by": "ip"}]}
    fleet = {"limits": [{"requests": 2, "period": "1h", "by": "ip"}], "mode": "fleet",
             "redis": {"address": "127.0.0.1:%d" % closed_port()}}
    rt = runtimes([gateway(port), backend("echo", [b.port]),
                   api("l", "/l", "echo", policies=[{"name": "rate-limit", "config": local}]),
                   api("f", "/f", "echo", policies=[{"name": "rate-limit", "config": fleet}])],
                  workers=1)
    name = "sluice_rate_limit_rejections_total"
    assert value(rt, name, api="default/l", scope="local", reason="limited") == 0
    statuses = [request(port, "GET", "/l/x").status for _ in range(5)]
    assert statuses == [200, 200, 429, 429, 429], statuses
    assert value(rt, name, api="default/l", scope="local", reason="limited") == 3
    assert value(rt, name, api="default/l", scope="local", reason="unavailable") == 0
    # Redis unreachable, failOpen false: 503 rate_limit_unavailable.
    wait_until(lambda: request(port, "GET", "/f/x").status == 503, 10,
               what="503 while the fleet limit's Redis is down")
    assert value(rt, name, api="default/f", scope="fleet", reason="unavailable") >= 1
    assert value(rt, name, api="default/f", scope="fleet", reason="limited") == 0
    assert not [l for l, _ in samples(rt, name) if l["api"] == "default/l" and
                l["scope"] == "fleet"]
    # Also counted against the policy, as every policy rejection.
    assert value(rt, "sluice_policy_rejections_total", api="default/l", policy="rate-limit") == 3


def test_text_format_families_and_histograms(backends, runtimes):
    b = backends("echo")
    port = free_port()
    rt = runtimes([gateway(port), backend("echo", [b.port]), api("t", "/t", "echo")], workers=2)
    for path in ("/t/a", "/t/delay/30", "/t/status/404", "/t/status/503"):
        request(port, "GET", path)
    # A request is counted when it ends, just after its last byte went out:
    # the client can read the answer first.
    wait_until(lambda: value(rt, "sluice_request_duration_seconds_count", api="default/t") == 4,
               5, what="4 requests counted")
    status, headers, body = rt.admin_get("/metrics")
    assert status == 200
    text = body.decode()
    assert text.endswith("\n")
    types = {}
    seen_families = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, fam, typ = line.split(" ")
            assert fam not in types, "TYPE of %s twice" % fam
            types[fam] = typ
            seen_families.append(fam)
        elif line.startswith("# HELP "):
            continue
        else:
            fam = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
            base = re.sub(r"_(bucket|sum|count)$", "", fam)
            owner = fam if fam in types else base
            assert owner in types, "sample %r before its TYPE" % line
            # Samples of a family are contiguous: it is the last TYPE seen.
            assert owner == seen_families[-1], "sample %r outside its family" % line
    for fam, typ in types.items():
        if typ == "counter":
            assert fam.endswith("_total"), fam
    # The request histogram, per api/operation: cumulative buckets up to
    # +Inf, which equals _count; the sum covers the 30 ms request.
    h = [(l, v) for n, l, v in rt.metrics() if n == "sluice_request_duration_seconds_bucket"]
    assert h
    les = [l["le"] for l, _ in h]
    assert les[-1] == "+Inf"
    counts = [v for _, v in h]
    assert counts == sorted(counts)
    assert counts[-1] == value(rt, "sluice_request_duration_seconds_count", api="default/t") == 4
    assert value(rt, "sluice_request_duration_seconds_sum", api="default/t") >= 0.03
    assert value(rt, "sluice_requests_total", api="default/t", code_class="2xx") == 2
    assert value(rt, "sluice_requests_total", api="default/t", code_class="4xx") == 1
    assert value(rt, "sluice_requests_total", api="default/t", code_class="5xx") == 1


def test_backend_responses_by_status_class(backends, runtimes):
    """Per backend: the status classes its requests got, the gateway's own
    502 for an endpoint that refuses included; an idle backend adds no line."""
    b = backends("b")
    port = free_port()
    rt = runtimes([gateway(port), backend("up", [b.port]), backend("down", [closed_port()]),
                   backend("idle", [b.port]),
                   api("t", "/t", "up"), api("d", "/d", "down"), api("i", "/i", "idle")])
    for path in ("/t/x", "/t/y", "/t/status/404", "/t/status/503"):
        request(port, "GET", path)
    assert request(port, "GET", "/d/x").status == 502
    name = "sluice_backend_responses_total"
    # Counted when the request ends, just after its answer went out.
    wait_until(lambda: value(rt, name, cluster="default/down", code_class="5xx") == 1, 5,
               what="the 502 counted")
    assert value(rt, name, cluster="default/up", code_class="2xx") == 2
    assert value(rt, name, cluster="default/up", code_class="4xx") == 1
    assert value(rt, name, cluster="default/up", code_class="5xx") == 1
    assert value(rt, name, cluster="default/down", code_class="5xx") == 1
    assert not [1 for n, l, _ in rt.metrics() if n == name and l.get("cluster") == "default/idle"]
