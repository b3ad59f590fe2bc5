"""Success-rate routing over rule outputs (docs/routing.md "Success rate over
rule outputs"): a rule's priority list or split, and the default, scored by
the outcomes of the requests they send, each rule with windows of its own;
retries that move down the ranking; the decision API naming the rule that
matched. The origins are the test's own (test_routing_success_rate.Origin):
their behaviour is swapped at run time and they count what they receive.
"""

import json
import subprocess

import yaml

from helpers import (API_VERSION, ResponseReader, backend, closed_port, connect, dump_docs,
                     free_port, gateway, request, runtime_binary)
from test_routing_success_rate import Origin, assert_only_probes, origins, share  # noqa: F401 (fixture)

# The example of docs/routing.md "Success rate over rule outputs", as written
# there (test_docs_example_is_this_one checks that they stay the same).
EXAMPLE = """\
apiVersion: gateway.sluice.dev/v1alpha1
kind: Api
metadata: {name: pay}
spec:
  basePath: /pay
  backendRefs: [{name: acquirer-global}]
  routing:
    strategy: success-rate            # every output below is scored...
    successRate:
      window: 50
      explorePercent: 5
      keys: [{header: X-Payment-Method}]
    rules:
    - name: canary
      match:
      - {header: X-Canary, equals: "on"}
      backend: pay-v2
    - name: eu
      match:
      - {query: currency, in: [EUR, GBP]}
      priority: [acquirer-eu, acquirer-global]
    - name: experiment
      match:
      - {header: X-Experiment, present: true}
      strategy: weighted              # ...but this split stays as written
      split:
      - {backend: acquirer-eu, weight: 90}
      - {backend: acquirer-global, weight: 10}
    default:
      split:
      - {backend: acquirer-us, weight: 3}
      - {backend: acquirer-global, weight: 1}
  operations:
  - {method: POST, path: /charge}
  - {name: decide, method: POST, path: /decide, action: decide}
"""

NAMES = ["acquirer-eu", "acquirer-global", "acquirer-us", "pay-v2"]


def example_docs(port, os_, extra=()):
    docs = [gateway(port)] + [backend(n, [os_[n].port]) for n in NAMES]
    return docs + [yaml.safe_load(EXAMPLE)] + list(extra)


def start(origins, runtimes, text=None):
    os_ = {n: origins(n) for n in NAMES}
    port = free_port()
    rt = runtimes(example_docs(port, os_))
    return port, os_, rt


def send(port, n, query="", headers=None):
    """n POSTs to /pay/charge on one connection; the X-Backend of each."""
    sock = connect(port)
    reader = ResponseReader(sock)
    out = []
    try:
        for _ in range(n):
            r = request(port, "POST", "/pay/charge" + query, headers=headers, body=b"{}",
                        sock=sock, reader=reader)
            out.append(r.header("X-Backend"))
    finally:
        sock.close()
    return out


def failing_every(k, status=503):
    return lambda n, h: (status, []) if n % k == 0 else (200, [])


def scopes(rt):
    status, _, body = rt.admin_get("/scores")
    assert status == 200, body
    return {s["scope"]: s for s in json.loads(body)["scopes"]}


def score(rt, scope, key, backend_name):
    s = scopes(rt).get(scope)
    for e in (s or {}).get("entries", []):
        if e["key"] == key:
            for b in e["backends"]:
                if b["backend"] == backend_name:
                    return b
    return None


def test_docs_example_is_this_one():
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "docs", "routing.md")) as f:
        text = f.read()
    assert "```yaml\n" + EXAMPLE + "```" in text


def test_a_rules_priority_list_is_scored_and_ties_keep_its_order(origins, runtimes):
    port, os_, rt = start(origins, runtimes)
    # Cold and healthy: a priority list is a priority list (ties to the first).
    cold = send(port, 100, query="?currency=EUR", headers={"X-Payment-Method": "card"})
    # Ties go to the first listed; a probe (5%) picks either of the two.
    assert_only_probes(cold, "acquirer-global", 2.5)
    # acquirer-eu fails every second charge: rule eu moves to acquirer-global.
    os_["acquirer-eu"].behave = failing_every(2)
    send(port, 100, query="?currency=EUR", headers={"X-Payment-Method": "card"})
    later = send(port, 300, query="?currency=EUR", headers={"X-Payment-Method": "card"})
    assert_only_probes(later, "acquirer-eu", 5)
    eu = score(rt, "default/pay rule:eu", "card", "default/acquirer-eu")
    assert eu is not None and eu["score"] < 1.0 and eu["failures"] > 0, eu
    # The windows are the rule's: the default's scope never saw acquirer-eu.
    assert score(rt, "default/pay", "card", "default/acquirer-eu") is None
    # The canary rule (one backend) and the weighted experiment are untouched.
    assert set(send(port, 20, headers={"X-Canary": "on"})) == {"pay-v2"}
    exp = send(port, 400, headers={"X-Experiment": "1"})
    assert 0.85 < share(exp, "acquirer-eu") < 0.95, share(exp, "acquirer-eu")


def test_the_default_split_is_scored_and_ties_go_by_weight(origins, runtimes):
    port, os_, rt = start(origins, runtimes)
    cold = send(port, 400)
    assert 0.65 < share(cold, "acquirer-us") < 0.85, share(cold, "acquirer-us")
    os_["acquirer-us"].behave = failing_every(2)
    send(port, 100)
    later = send(port, 300)
    assert set(later) <= {"acquirer-us", "acquirer-global"}, later
    assert_only_probes(later, "acquirer-us", 5)
    # Key "" (no X-Payment-Method) of the block's own scope.
    us = score(rt, "default/pay", "", "default/acquirer-us")
    assert us is not None and us["score"] < 1.0, scopes(rt)
    # Rule eu's windows for the same backend did not move.
    assert score(rt, "default/pay rule:eu", "", "default/acquirer-us") is None


def test_rule_windows_survive_a_config_swap(origins, runtimes):
    port, os_, rt = start(origins, runtimes)
    os_["acquirer-eu"].behave = failing_every(2)
    send(port, 150, query="?currency=EUR")
    before = score(rt, "default/pay rule:eu", "", "default/acquirer-eu")
    assert before["failures"] > 0
    other = {"apiVersion": API_VERSION, "kind": "Api", "metadata": {"name": "other"},
             "spec": {"basePath": "/other", "backendRefs": [{"name": "pay-v2"}],
                      "operations": [{"method": "GET", "path": "/x"}]}}
    rt.reload(example_docs(port, os_, extra=[other]))
    after = score(rt, "default/pay rule:eu", "", "default/acquirer-eu")
    assert (after["score"], after["failures"]) == (before["score"], before["failures"])
    later = send(port, 300, query="?currency=EUR")
    assert_only_probes(later, "acquirer-eu", 5)


def test_an_outputs_own_strategy_without_a_block_strategy(origins, runtimes):
    os_ = {n: origins(n) for n in NAMES}
    port = free_port()
    doc = yaml.safe_load(EXAMPLE)
    routing = doc["spec"]["routing"]
    del routing["strategy"]
    routing["rules"][1]["strategy"] = "success-rate"
    del routing["rules"][2]["strategy"]
    routing["successRate"]["explorePercent"] = 0
    rt = runtimes([gateway(port)] + [backend(n, [os_[n].port]) for n in NAMES] + [doc])
    os_["acquirer-eu"].behave = failing_every(2)
    os_["acquirer-us"].behave = failing_every(2)
    send(port, 60, query="?currency=EUR")
    assert set(send(port, 100, query="?currency=EUR")) == {"acquirer-global"}
    # The default is weighted (as written): acquirer-us keeps its 3 of 4.
    default = send(port, 400)
    assert 0.65 < share(default, "acquirer-us") < 0.85
    assert "default/pay" not in scopes(rt)


def _check(docs, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(dump_docs(docs))
    out = subprocess.run([runtime_binary(), "--check", "--config", str(path)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return out.returncode, out.stdout


def test_what_cannot_be_scored_is_refused_with_the_field(tmp_path):
    base = [gateway(free_port())] + [backend(n, [free_port()]) for n in NAMES]

    def bad(mutate, *want):
        doc = yaml.safe_load(EXAMPLE)
        mutate(doc["spec"]["routing"])
        rc, out = _check(base + [doc], tmp_path)
        assert rc != 0, out
        for w in want:
            assert w in out, (w, out)

    def split_of_lists(r):
        r["default"] = {"split": [{"priority": ["acquirer-us", "acquirer-global"], "weight": 1},
                                  {"backend": "acquirer-eu", "weight": 1}]}
    bad(split_of_lists, "spec.routing.default.split[0].priority: a success-rate output orders "
        "its backends by score")

    def one_backend(r):
        r["rules"][0]["strategy"] = "success-rate"
    bad(one_backend, "spec.routing.rules[0].strategy: success-rate chooses among several "
        "backends and this output has one")

    def same_names(r):
        r["rules"][2]["name"] = "eu"
    bad(same_names, "spec.routing.rules[2].name: 'eu' is already the name of rules[1]")

    def settings_unused(r):
        del r["strategy"]
        del r["rules"][2]["strategy"]
    bad(settings_unused, "spec.routing.successRate: only used with strategy: success-rate")

    # A split of lists kept as written is fine under a success-rate block.
    doc = yaml.safe_load(EXAMPLE)
    doc["spec"]["routing"]["default"] = {
        "strategy": "weighted",
        "split": [{"priority": ["acquirer-us", "acquirer-global"], "weight": 1},
                  {"backend": "acquirer-eu", "weight": 1}]}
    rc, out = _check(base + [doc], tmp_path)
    assert rc == 0, out


# --- retries move down the ranking ---------------------------------------------

def test_a_retry_goes_to_the_next_best_backend_and_is_scored_there(origins, runtimes):
    steady, flaky = origins("steady"), origins("flaky")
    flaky.behave = lambda n, h: (503, [])
    port = free_port()
    doc = {"apiVersion": API_VERSION, "kind": "Api", "metadata": {"name": "pay"},
           "spec": {"basePath": "/pay",
                    "backendRefs": [{"name": "steady"}, {"name": "flaky"}],
                    # Every pick ignores the scores, so flaky is picked about
                    # half of the time however it does.
                    "routing": {"strategy": "success-rate",
                                "successRate": {"window": 100, "explorePercent": 100,
                                                "eliminationThreshold": 0}},
                    "retries": {"on": ["connect-failure", "reset", 502, 503, 504]},
                    "operations": [{"method": "GET", "path": "/x"}]}}
    rt = runtimes([gateway(port), backend("steady", [steady.port]),
                   backend("flaky", [flaky.port]), doc])
    sock = connect(port)
    reader = ResponseReader(sock)
    seen = []
    for _ in range(60):
        r = request(port, "GET", "/pay/x", sock=sock, reader=reader)
        seen.append((r.status, r.header("X-Backend")))
    sock.close()
    # Each 503 of flaky was retried on steady (the next by score), never on
    # flaky again: no client saw a 503.
    assert set(seen) == {(200, "steady")}, seen
    # (flaky is ejected after 5 consecutive failures; a pick of it while it
    # has no usable endpoint counts as a connect failure and goes on.)
    assert flaky.n >= 5 and steady.n == 60, (flaky.n, steady.n)
    # The attempts are scored for the backend each went to: the retries'
    # successes are steady's, flaky has only failures.
    f = score(rt, "default/pay", "*", "default/flaky")
    s = score(rt, "default/pay", "*", "default/steady")
    assert f["failures"] >= flaky.n and f["successes"] == 0, f
    assert (s["failures"], s["successes"]) == (0, 60), s


def test_a_rules_list_retries_a_refused_connection_on_the_next(origins, runtimes):
    global_ = origins("acquirer-global")
    port = free_port()
    doc = yaml.safe_load(EXAMPLE)
    doc["spec"]["routing"]["successRate"]["explorePercent"] = 0
    dead = closed_port()
    docs = [gateway(port), backend("acquirer-eu", [dead]),
            backend("acquirer-global", [global_.port]), backend("acquirer-us", [global_.port]),
            backend("pay-v2", [global_.port]), doc]
    rt = runtimes(docs)
    # acquirer-eu is first (ties keep the order) and refuses connections:
    # a POST may be retried on a connect failure, and goes to the next.
    seen = send(port, 30, query="?currency=EUR")
    assert set(seen) == {"acquirer-global"}, seen
    eu = score(rt, "default/pay rule:eu", "", "default/acquirer-eu")
    gl = score(rt, "default/pay rule:eu", "", "default/acquirer-global")
    assert eu["failures"] >= 1 and eu["successes"] == 0, eu
    assert gl["successes"] == 30 and gl["failures"] == 0, gl


# --- the decision API names the rule -------------------------------------------

def decide_docs(port, os_):
    doc = yaml.safe_load(EXAMPLE)
    routing = doc["spec"]["routing"]
    routing["successRate"]["explorePercent"] = 0
    routing["rules"][1]["priority"] = ["acquirer-eu", "acquirer-us", "acquirer-global"]
    doc["spec"]["operations"].append(
        {"name": "feedback", "method": "POST", "path": "/feedback", "action": "feedback"})
    return [gateway(port)] + [backend(n, [os_[n].port]) for n in NAMES] + [doc]


def post_json(port, path, doc):
    r = request(port, "POST", path, headers={"Content-Type": "application/json"},
                body=json.dumps(doc).encode())
    return r.status, json.loads(r.body)


def test_decide_names_the_rule_and_orders_the_fallback_by_score(origins, runtimes):
    os_ = {n: origins(n) for n in NAMES}
    port = free_port()
    runtimes(decide_docs(port, os_))
    eur = {"headers": {"X-Payment-Method": "card"}, "query": {"currency": "EUR"}}
    status, d = post_json(port, "/pay/decide", {"attributes": eur})
    assert status == 200, d
    # Cold: the priority list as written.
    assert d["rule"] == "eu" and d["strategy"] == "success-rate" and d["key"] == "card", d
    assert [d["backend"]] + d["fallback"] == ["acquirer-eu", "acquirer-us", "acquirer-global"], d
    assert sorted(s["backend"] for s in d["scores"]) == sorted(
        ["acquirer-eu", "acquirer-us", "acquirer-global"])
    # Reports for the rule's windows: acquirer-eu fails 3 of 3, acquirer-global 1.
    for b, outcome in [("acquirer-eu", "failure")] * 3 + [("acquirer-global", "failure")]:
        status, f = post_json(port, "/pay/feedback",
                              {"backend": b, "attributes": eur, "outcome": outcome})
        assert status == 200 and f["rule"] == "eu", f
    status, d = post_json(port, "/pay/decide", {"attributes": eur})
    assert [d["backend"]] + d["fallback"] == ["acquirer-us", "acquirer-global", "acquirer-eu"], d
    by = {s["backend"]: s["score"] for s in d["scores"]}
    assert by["acquirer-us"] == 1.0 and by["acquirer-global"] > by["acquirer-eu"], by
    # Proxied EUR charges take the same order.
    assert set(send(port, 20, query="?currency=EUR", headers={"X-Payment-Method": "card"})) \
        == {"acquirer-us"}
    # The default decides: rule is null.
    status, d = post_json(port, "/pay/decide", {"attributes": {"query": {"currency": "USD"}}})
    assert d["rule"] is None and d["strategy"] == "success-rate", d
    assert sorted([d["backend"]] + d["fallback"]) == ["acquirer-global", "acquirer-us"], d
    # A one-backend rule, and a weighted one: named, as written.
    status, d = post_json(port, "/pay/decide", {"attributes": {"headers": {"X-Canary": "on"}}})
    assert (d["rule"], d["backend"], d["fallback"]) == ("canary", "pay-v2", []), d
    status, d = post_json(port, "/pay/decide",
                          {"attributes": {"headers": {"X-Experiment": "1"}}})
    assert d["rule"] == "experiment" and d["strategy"] == "weighted" and "scores" not in d, d
    assert sorted([d["backend"]] + d["fallback"]) == ["acquirer-eu", "acquirer-global"], d
    # The request's own attributes, without a body.
    r = request(port, "POST", "/pay/decide?currency=GBP", headers={"X-Payment-Method": "card"})
    d = json.loads(r.body)
    assert d["rule"] == "eu" and d["backend"] == "acquirer-us", d
    # Feedback for a list kept as written is refused, naming the rule.
    status, f = post_json(port, "/pay/feedback",
                          {"backend": "acquirer-eu", "outcome": "failure",
                           "attributes": {"headers": {"X-Experiment": "1"}}})
    assert status == 409 and "rule 'experiment'" in f["error"]["message"], f
    status, f = post_json(port, "/pay/feedback",
                          {"backend": "pay-v2", "outcome": "failure", "attributes": eur})
    assert status == 400 and "rule 'eu'" in f["error"]["message"], f
