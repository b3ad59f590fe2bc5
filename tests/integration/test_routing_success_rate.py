"""Success-rate routing (docs/routing.md "Success-rate routing") through the
real proxy: origins the test controls start failing (5xx or an
`X-Outcome: failure` header), and the share of traffic each one receives is
counted at the origins themselves.

Each origin here is a small threaded HTTP/1.1 server whose behaviour is a
function the test swaps at run time (`Origin.behave`), so one test can make a
backend fail half its requests, heal it, or fail only for one kind of call.
"""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from helpers import API_VERSION, backend, free_port, gateway, request, wait_until


class Origin:
    """An origin that answers every request with behave(n, headers) ->
    (status, extra_headers); n counts requests from 1."""

    def __init__(self, name):
        self.name = name
        self.lock = threading.Lock()
        self.n = 0
        self.behave = lambda n, h: (200, [])
        origin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *a):
                pass

            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                with origin.lock:
                    origin.n += 1
                    n = origin.n
                status, extra = origin.behave(n, self.headers)
                body = json.dumps({"server": origin.name}).encode()
                self.send_response(status)
                self.send_header("X-Backend", origin.name)
                for k, v in extra:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def origins():
    made = []

    def make(name):
        o = Origin(name)
        made.append(o)
        return o

    yield make
    for o in made:
        o.stop()


def half_failing(status=503):
    return lambda n, h: ((status, []) if n % 2 == 0 else (200, []))


def config(port, steady, flaky, routing=None, extra_docs=()):
    """The issue's Api, as written, with its two ordinary Backends; `routing`
    replaces its routing block when given."""
    text = """
apiVersion: gateway.sluice.dev/v1alpha1
kind: Api
metadata: {name: pay}
spec:
  basePath: /pay
  backendRefs: [{name: steady}, {name: flaky}]
  routing:
    strategy: success-rate
    successRate: {window: 125, explorePercent: 5}
  operations:
  - {method: POST, path: /charge}
"""
    import yaml
    api = yaml.safe_load(text)
    if routing is not None:
        api["spec"]["routing"] = routing
    return [gateway(port), backend("steady", [steady.port]), backend("flaky", [flaky.port]),
            api] + list(extra_docs)


def charge(port, headers=None, sock=None, reader=None, query=""):
    r = request(port, "POST", "/pay/charge" + query, headers=headers, body=b"{}", sock=sock,
                reader=reader)
    return r


def send(port, n, headers=None, query=""):
    """n POSTs on one connection; returns the X-Backend of each answer."""
    from helpers import ResponseReader, connect
    sock = connect(port)
    reader = ResponseReader(sock)
    out = []
    try:
        for _ in range(n):
            r = charge(port, headers=headers, sock=sock, reader=reader, query=query)
            out.append(r.header("X-Backend"))
    finally:
        sock.close()
    return out


def share(seq, name):
    return sum(1 for x in seq if x == name) / float(len(seq))


def probes_bound(n, explore_percent, false_alarm=1e-9):
    """The most requests out of n that probes alone send to a backend out of
    the best choice, but for a chance of false_alarm: each request is a probe
    with probability explore_percent/100, independently (the runtime's
    SplitMix64 draw), so the count is binomial. A fixed share such as 10% of
    300 requests at 5% exploration is crossed by chance about once in 3,500
    runs (CI saw it); this bound is crossed once in 10^9, and still far below
    the half a tie would give."""
    from math import comb
    p = explore_percent / 100.0
    tail = 0.0
    for k in range(n, -1, -1):
        tail += comb(n, k) * p ** k * (1 - p) ** (n - k)
        if tail > false_alarm:
            return k
    return 0


def assert_only_probes(seq, name, explore_percent):
    got, limit = seq.count(name), probes_bound(len(seq), explore_percent)
    assert got <= limit, "%s got %d of %d requests; probes at %s%% give at most %d" % (
        name, got, len(seq), explore_percent, limit)


def scores(rt):
    status, _, body = rt.admin_get("/scores")
    assert status == 200, body
    return json.loads(body)["scopes"]


def score_of(rt, key, backend_name, scope="default/pay"):
    for s in scores(rt):
        if s["scope"] != scope:
            continue
        for e in s["entries"]:
            if e["key"] == key:
                for b in e["backends"]:
                    if b["backend"] == backend_name:
                        return b
    return None


def test_the_issue_yaml_sends_traffic_away_from_a_failing_backend(origins, runtimes):
    steady, flaky = origins("steady"), origins("flaky")
    port = free_port()
    rt = runtimes(config(port, steady, flaky))
    # Cold start is optimistic: both backends share the traffic by weight.
    first = send(port, 200)
    assert 0.3 < share(first, "flaky") < 0.7, "cold start should spread: %r" % share(first, "flaky")
    flaky.behave = half_failing(503)
    send(port, 100)  # the windows learn
    later = send(port, 400)
    # Only the probes (5% of requests, all to flaky, the one out of the best
    # choice) still reach flaky.
    assert_only_probes(later, "flaky", 5)
    b = score_of(rt, "*", "default/flaky")
    assert b is not None and b["score"] < 1.0 and b["failures"] > 0, b
    assert score_of(rt, "*", "default/steady")["score"] == 1.0
    samples = rt.metrics()
    from helpers import metric_sum
    assert metric_sum(samples, "sluice_backend_score", api="default/pay", key="*",
                      backend="default/flaky") < 1.0
    assert metric_sum(samples, "sluice_backend_score", api="default/pay", key="*",
                      backend="default/steady") == 1.0


def test_exploration_brings_a_recovered_backend_back(origins, runtimes):
    steady, flaky = origins("steady"), origins("flaky")
    port = free_port()
    runtimes(config(port, steady, flaky, routing={
        "strategy": "success-rate", "successRate": {"window": 10, "explorePercent": 20}}))
    flaky.behave = half_failing(503)
    send(port, 200)
    degraded = send(port, 400)
    # The probes (20% of requests, all to flaky, out of the best choice).
    assert_only_probes(degraded, "flaky", 20)
    flaky.behave = lambda n, h: (200, [])
    # The probes (20% of requests reach flaky) refill its window with
    # successes; then it ties with steady and gets its weight's share again.
    send(port, 300)
    healed = send(port, 300)
    assert share(healed, "flaky") > 0.35, share(healed, "flaky")


def test_outcome_header_reports_business_failures(origins, runtimes):
    steady, flaky = origins("steady"), origins("flaky")
    port = free_port()
    runtimes(config(port, steady, flaky, routing={
        "strategy": "success-rate",
        "successRate": {"window": 50, "explorePercent": 5,
                        "failure": {"header": {"name": "X-Outcome", "value": "failure"}}}}))
    # 200 OK, but the backend says the payment failed, every second time.
    flaky.behave = lambda n, h: (200, [("X-Outcome", "failure")] if n % 2 == 0 else [])
    send(port, 150)
    later = send(port, 300)
    assert_only_probes(later, "flaky", 5)


def test_scoring_keys_keep_separate_scores(origins, runtimes):
    steady, flaky = origins("steady"), origins("flaky")
    port = free_port()
    rt = runtimes(config(port, steady, flaky, routing={
        "strategy": "success-rate",
        "successRate": {"window": 50, "explorePercent": 5,
                        "keys": [{"header": "X-Payment-Method"}, {"query": "currency"}]}}))

    # flaky fails cards, steady fails UPI: each key must go its own way.
    def fails_for(method):
        def behave(n, h):
            if h.get("X-Payment-Method") == method and n % 2 == 0:
                return 503, []
            return 200, []
        return behave

    flaky.behave = fails_for("card")
    steady.behave = fails_for("upi")
    for _ in range(2):
        send(port, 100, headers={"X-Payment-Method": "card"}, query="?currency=EUR")
        send(port, 100, headers={"X-Payment-Method": "upi"}, query="?currency=EUR")
    card = send(port, 300, headers={"X-Payment-Method": "card"}, query="?currency=EUR")
    upi = send(port, 300, headers={"X-Payment-Method": "upi"}, query="?currency=EUR")
    assert_only_probes(card, "flaky", 5)
    assert_only_probes(upi, "steady", 5)
    assert score_of(rt, "card,EUR", "default/flaky")["score"] < 1.0
    assert score_of(rt, "card,EUR", "default/steady")["score"] == 1.0
    assert score_of(rt, "upi,EUR", "default/steady")["score"] < 1.0
    assert score_of(rt, "upi,EUR", "default/flaky")["score"] == 1.0


def test_client_errors_do_not_count_against_a_backend(origins, runtimes):
    steady, flaky = origins("steady"), origins("flaky")
    port = free_port()
    rt = runtimes(config(port, steady, flaky))
    flaky.behave = lambda n, h: (404, []) if n % 2 == 0 else (200, [])
    send(port, 100)
    later = send(port, 300)
    assert 0.3 < share(later, "flaky") < 0.7, share(later, "flaky")
    assert score_of(rt, "*", "default/flaky")["score"] == 1.0


def test_chosen_statuses_count_as_failures(origins, runtimes):
    steady, flaky = origins("steady"), origins("flaky")
    port = free_port()
    runtimes(config(port, steady, flaky, routing={
        "strategy": "success-rate",
        "successRate": {"window": 50, "failure": {"statuses": [429]}}}))
    flaky.behave = lambda n, h: (429, []) if n % 2 == 0 else (200, [])
    send(port, 100)
    later = send(port, 300)
    assert_only_probes(later, "flaky", 5)


def test_connect_failures_count_and_elimination_shows(origins, runtimes):
    steady, flaky = origins("steady"), origins("flaky")
    port = free_port()
    rt = runtimes(config(port, steady, flaky, routing={
        "strategy": "success-rate",
        "successRate": {"window": 20, "explorePercent": 50, "eliminationThreshold": 0.2}}))
    flaky.stop()  # connection refused from now on
    seen = send(port, 200)
    # The explored requests to flaky failed to connect; their retry went to
    # the next-best backend, so no client saw the failure.
    assert seen.count(None) == 0 and set(seen) == {"steady"}, seen
    b = score_of(rt, "*", "default/flaky")
    assert b["eliminated"] and b["score"] == 0.0, b
    samples = rt.metrics()
    from helpers import metric_sum
    assert metric_sum(samples, "sluice_backend_eliminated", api="default/pay", key="*",
                      backend="default/flaky") == 1
    assert metric_sum(samples, "sluice_backend_eliminated", api="default/pay", key="*",
                      backend="default/steady") == 0
    status, _, body = rt.admin_get("/config_dump")
    dump = json.loads(body)
    elim = [(s["scope"], e["key"], b["backend"]) for s in dump["success_rate_eliminations"]
            for e in s["entries"] for b in e["backends"]]
    assert elim == [("default/pay", "*", "default/flaky")], elim


def test_keys_are_bounded_and_the_bound_is_reported(origins, runtimes):
    steady, flaky = origins("steady"), origins("flaky")
    port = free_port()
    rt = runtimes(config(port, steady, flaky, routing={
        "strategy": "success-rate",
        "successRate": {"maxKeys": 3, "keys": [{"header": "X-Merchant"}]}}))
    for m in range(10):
        send(port, 2, headers={"X-Merchant": "m%d" % m})
    assert rt.metric("sluice_srate_keys", api="default/pay") == 3
    assert rt.metric("sluice_srate_keys_max", api="default/pay") == 3
    assert rt.metric("sluice_srate_key_evictions_total", api="default/pay") == 7
    [scope] = [s for s in scores(rt) if s["scope"] == "default/pay"]
    assert scope["maxKeys"] == 3 and scope["keys"] == 3 and len(scope["entries"]) == 3


def test_windows_survive_a_config_swap(origins, runtimes):
    steady, flaky = origins("steady"), origins("flaky")
    port = free_port()
    rt = runtimes(config(port, steady, flaky))
    flaky.behave = half_failing(503)
    send(port, 200)
    before = score_of(rt, "*", "default/flaky")
    assert before["score"] < 1.0
    other = {"apiVersion": API_VERSION, "kind": "Api", "metadata": {"name": "other"},
             "spec": {"basePath": "/other", "backendRefs": [{"name": "steady"}],
                      "operations": [{"method": "GET", "path": "/x"}]}}
    rt.reload(config(port, steady, flaky, extra_docs=[other]))
    after = score_of(rt, "*", "default/flaky")
    assert after["score"] == before["score"] and after["failures"] == before["failures"], \
        (before, after)
    later = send(port, 300)
    assert_only_probes(later, "flaky", 5)


def test_invalid_routing_is_refused_with_the_field(origins, runtimes):
    steady, flaky = origins("steady"), origins("flaky")
    port = free_port()
    rt = runtimes(config(port, steady, flaky))
    rt.reload_invalid(config(port, steady, flaky, routing={
        "strategy": "success-rate", "successRate": {"window": 0, "explorePercent": 150}}))
    log = rt.log()
    assert "spec.routing.successRate.window" in log, log[-2000:]
    assert "spec.routing.successRate.explorePercent" in log, log[-2000:]
    rt.reload_invalid(config(port, steady, flaky, routing={
        "successRate": {"window": 10}}))
    assert "only used with strategy: success-rate" in rt.log()
    # A success-rate output is ranked by score: a split of priority lists
    # (an order of its own) is refused, never silently reordered.
    rt.reload_invalid(config(port, steady, flaky, routing={
        "strategy": "success-rate",
        "default": {"split": [{"priority": ["steady", "flaky"]}, {"backend": "flaky"}]}}))
    assert "spec.routing.default.split[0].priority: a success-rate output orders" in rt.log(), \
        rt.log()[-2000:]


# --- the decision API --------------------------------------------------------

DECIDE_ROUTING = {"strategy": "success-rate",
                  "successRate": {"window": 20, "explorePercent": 0,
                                  "keys": [{"header": "X-Payment-Method"}]}}


def decision_config(port, steady, flaky, routing=DECIDE_ROUTING):
    docs = config(port, steady, flaky, routing=routing)
    docs[-1]["spec"]["operations"] += [
        {"name": "decide", "method": "POST", "path": "/decide", "action": "decide"},
        {"name": "decide-get", "method": "GET", "path": "/decide", "action": "decide"},
        {"name": "feedback", "method": "POST", "path": "/feedback", "action": "feedback"}]
    return docs


def post_json(port, path, doc, headers=None):
    body = json.dumps(doc).encode()
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    r = request(port, "POST", path, headers=h, body=body)
    return r.status, (json.loads(r.body) if r.body else None)


def test_decide_answers_from_the_proxied_outcomes(origins, runtimes):
    steady, flaky = origins("steady"), origins("flaky")
    port = free_port()
    runtimes(decision_config(port, steady, flaky))
    flaky.behave = lambda n, h: (503, []) if h.get("X-Payment-Method") == "card" else (200, [])
    send(port, 60, headers={"X-Payment-Method": "card"})
    # No backend is called by a decision.
    before = steady.n + flaky.n
    status, d = post_json(port, "/pay/decide",
                          {"attributes": {"headers": {"x-payment-method": "card"}}})
    assert status == 200, d
    assert d["backend"] == "steady" and d["fallback"] == ["flaky"], d
    assert d["key"] == "card" and d["strategy"] == "success-rate" and d["rule"] is None
    by = {s["backend"]: s for s in d["scores"]}
    assert by["steady"]["score"] == 1.0 and by["flaky"]["score"] < 1.0, d
    assert 0 <= d["decisionMicros"] < 10000
    assert steady.n + flaky.n == before
    # The request's own attributes, without a body; another key is still cold.
    r = request(port, "GET", "/pay/decide", headers={"X-Payment-Method": "card"})
    assert r.status == 200 and json.loads(r.body)["backend"] == "steady"
    r = request(port, "GET", "/pay/decide", headers={"X-Payment-Method": "upi"})
    d = json.loads(r.body)
    assert d["key"] == "upi" and all(s["score"] == 1.0 for s in d["scores"]), d


def test_decide_answer_is_json_whatever_the_key(origins, runtimes):
    """The answer is written without jansson: a key with quotes and
    backslashes is escaped, valid UTF-8 is kept, a byte that is not UTF-8
    (obs-text, or a key cut inside a character at 127 bytes) becomes
    U+FFFD; numbers keep their values."""
    steady, flaky = origins("steady"), origins("flaky")
    port = free_port()
    runtimes(decision_config(port, steady, flaky))
    cases = [('say "hi" \\o/', 'say "hi" \\o/'),
             ("caf\xc3\xa9", "caf\u00e9"),
             ("bad\xffbyte", "bad\ufffdbyte"),
             ("\xc3\xa9" * 100, "\u00e9" * 63 + "\ufffd")]
    for raw, key in cases:
        r = request(port, "GET", "/pay/decide", headers={"X-Payment-Method": raw})
        assert r.status == 200, r.body
        d = json.loads(r.body.decode("utf-8"))  # strict: invalid UTF-8 raises
        assert d["key"] == key, (raw, d)
        assert d["explored"] is False and d["rule"] is None, d
        assert sorted(d["fallback"] + [d["backend"]]) == ["flaky", "steady"], d
        for sc in d["scores"]:
            assert sc["score"] == 1.0 and sc["eliminationScore"] == 1.0, d
            assert sc["outcomes"] == 0 and sc["eliminated"] is False, d
        assert isinstance(d["decisionMicros"], float) and 0 < d["decisionMicros"] < 10000, d


def test_feedback_moves_the_decisions(origins, runtimes):
    steady, flaky = origins("steady"), origins("flaky")
    port = free_port()
    rt = runtimes(decision_config(port, steady, flaky))
    attrs = {"headers": {"X-Payment-Method": "wallet"}}
    for _ in range(5):
        status, d = post_json(port, "/pay/feedback",
                              {"backend": "flaky", "attributes": attrs, "outcome": "failure"})
        assert status == 200 and d["recorded"] is True, d
    for _ in range(20):
        status, d = post_json(port, "/pay/decide", {"attributes": attrs})
        assert d["backend"] == "steady", d
    assert score_of(rt, "wallet", "default/flaky")["score"] == 0.75
    # Proxied requests of that key now avoid flaky too.
    seen = send(port, 50, headers={"X-Payment-Method": "wallet"})
    assert share(seen, "steady") == 1.0
    # Bad reports say which field is wrong.
    status, d = post_json(port, "/pay/feedback", {"backend": "nope", "outcome": "failure"})
    assert status == 400 and "backend" in d["error"]["message"], d
    status, d = post_json(port, "/pay/feedback", {"backend": "flaky", "outcome": "meh"})
    assert status == 400 and "outcome" in d["error"]["message"], d
    r = request(port, "POST", "/pay/decide", headers={"Content-Type": "application/json"},
                body=b"{not json")
    assert r.status == 400 and json.loads(r.body)["error"]["code"] == "bad_json"


def test_decide_without_success_rate_is_a_weighted_pick(origins, runtimes):
    steady, flaky = origins("steady"), origins("flaky")
    port = free_port()
    docs = decision_config(port, steady, flaky, routing={"strategy": "weighted"})
    docs[-1]["spec"]["backendRefs"] = [{"name": "steady", "weight": 3}, {"name": "flaky"}]
    runtimes(docs)
    picks = []
    for _ in range(200):
        r = request(port, "GET", "/pay/decide")
        d = json.loads(r.body)
        assert d["strategy"] == "weighted" and "scores" not in d
        assert sorted([d["backend"]] + d["fallback"]) == ["flaky", "steady"]
        picks.append(d["backend"])
    assert 0.6 < share(picks, "steady") < 0.9
    status, d = post_json(port, "/pay/feedback", {"backend": "flaky", "outcome": "failure"})
    assert status == 409 and d["error"]["code"] == "not_success_rate"


def test_decide_and_feedback_over_both_protocols(origins, runtimes, proto):
    steady, flaky = origins("steady"), origins("flaky")
    port = free_port()
    docs = decision_config(port, steady, flaky)
    docs[0] = proto.gateway(port)
    runtimes(docs)
    attrs = json.dumps({"backend": "steady", "outcome": "failure",
                        "attributes": {"headers": {"X-Payment-Method": "card"}}}).encode()
    for _ in range(3):
        r = proto.request(port, "POST", "/pay/feedback", body=attrs,
                          headers={"Content-Type": "application/json"})
        assert r.status == 200, r.body
    r = proto.request(port, "POST", "/pay/decide",
                      body=b'{"attributes": {"headers": {"X-Payment-Method": "card"}}}')
    d = json.loads(r.body)
    assert r.status == 200 and d["backend"] == "flaky" and d["fallback"] == ["steady"], d
    r = proto.request(port, "GET", "/pay/decide", headers={"X-Payment-Method": "card"})
    assert json.loads(r.body)["backend"] == "flaky"
    assert steady.n == 0 and flaky.n == 0


# --- sharing: redis ------------------------------------------------------------

@pytest.fixture
def redis_server():
    import shutil
    import subprocess
    port = free_port()
    proc = subprocess.Popen([shutil.which("redis-server"), "--port", str(port), "--bind",
                             "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def ready():
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
        except OSError:
            return False
        try:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
        finally:
            s.close()

    wait_until(ready, 10, what="redis-server on %d" % port)
    yield proc, port
    if proc.poll() is None:
        proc.terminate()
        proc.wait(10)


def test_two_runtimes_share_outcomes_through_redis(origins, runtimes, redis_server):
    proc, rport = redis_server
    steady, flaky = origins("steady"), origins("flaky")
    routing = {"strategy": "success-rate",
               "successRate": {"window": 50, "explorePercent": 0,
                               "keys": [{"header": "X-Payment-Method"}],
                               "sharing": "redis",
                               "redis": {"address": "127.0.0.1:%d" % rport}}}
    port_a, port_b = free_port(), free_port()
    rt_a = runtimes(decision_config(port_a, steady, flaky, routing=routing))
    rt_b = runtimes(decision_config(port_b, steady, flaky, routing=routing))
    flaky.behave = lambda n, h: (503, []) if n % 2 == 0 else (200, [])
    # Only runtime a proxies; b learns a's outcomes through Redis.
    send(port_a, 40, headers={"X-Payment-Method": "card"})
    wait_until(lambda: (score_of(rt_b, "card", "default/flaky") or {}).get("score", 1) < 1.0,
               10, what="runtime b to see flaky's failures")
    b = score_of(rt_b, "card", "default/flaky")
    a = score_of(rt_a, "card", "default/flaky")
    assert b["failures"] == a["failures"] and b["failures"] > 0, (a, b)
    r = request(port_b, "GET", "/pay/decide", headers={"X-Payment-Method": "card"})
    assert json.loads(r.body)["backend"] == "steady"
    # b's own outcomes go to a as well (and are not counted twice at b).
    flaky.behave = lambda n, h: (200, [])
    steady.behave = lambda n, h: (503, [])
    before = score_of(rt_b, "card", "default/steady")["failures"]
    send(port_b, 10, headers={"X-Payment-Method": "card"})
    after = score_of(rt_b, "card", "default/steady")["failures"]
    assert after > before

    def counts(rt):
        return [(x["successes"], x["failures"]) for x in
                (score_of(rt, "card", "default/steady"), score_of(rt, "card", "default/flaky"))
                if x]

    def same(rt):
        return counts(rt) == counts(rt_b)
    wait_until(lambda: same(rt_a), 10, what=lambda: "a and b to agree: %r %r"
               % (scores(rt_a), scores(rt_b)))
    # A third runtime started now begins with the fleet's knowledge.
    rt_c = runtimes(decision_config(free_port(), steady, flaky, routing=routing))
    wait_until(lambda: same(rt_c), 10, what=lambda: "a new runtime to read the fleet's "
               "outcomes: %r %r" % (scores(rt_c), scores(rt_b)))
    # Redis down: each runtime goes on with its local windows.
    proc.terminate()
    proc.wait(10)
    seen = send(port_a, 20, headers={"X-Payment-Method": "card"})
    assert all(s in ("steady", "flaky") for s in seen)
    assert score_of(rt_a, "card", "default/steady")["failures"] >= after


def test_recovery_probes_bring_a_healed_backend_back_quickly(origins, runtimes):
    """A healed backend's window is still full of the degradation's
    failures; 16 successful probes in a row clear them (recoveryProbes),
    instead of waiting for 125 probes to push them out."""
    def run(recovery_probes):
        steady, flaky = origins("steady"), origins("flaky")
        port = free_port()
        sr = {"window": 125, "explorePercent": 5}
        if recovery_probes is not None:
            sr["recoveryProbes"] = recovery_probes
        runtimes(config(port, steady, flaky,
                        routing={"strategy": "success-rate", "successRate": sr}))
        flaky.behave = half_failing(503)
        send(port, 400)
        flaky.behave = lambda n, h: (200, [])
        send(port, 700)  # about 35 probes reach flaky
        return share(send(port, 300), "flaky")

    assert run(None) > 0.3  # the default, 16
    assert run(0) < 0.15    # off: 35 of the 60-odd failures are still there
