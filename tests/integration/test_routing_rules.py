"""Rule-based backend choice (`routing` on an Api and an operation,
runtime/proxy/route_rules.c, docs/routing.md "Rule-based backend choice"):
each condition type picks the right output, statements nest, a missing
attribute is false, the operation's block wins over the Api's, a priority
list falls back to the next backend when the first cannot be reached, a
weighted split is exact over 100,000 requests, and what cannot be right is
refused with the field named."""

import collections
import hashlib
import subprocess

from helpers import (API_VERSION, api, backend as backend_doc, closed_port, dump_docs, free_port,
                     gateway, runtime_binary)


def _rules_api(routing, operations=None, **spec):
    return api("pay", "/pay", "a", operations=operations, routing=routing, **spec)


def _start(backends, runtimes, names, routing, port=None, extra=(), operations=None,
           workers=2, **spec):
    bs = {n: backends(n) for n in names}
    port = port or free_port()
    docs = [gateway(port)] + [backend_doc(n, [b.port]) for n, b in bs.items()]
    docs += list(extra)
    docs.append(_rules_api(routing, operations=operations, **spec))
    runtimes(docs, workers=workers)
    return port, bs


def _who(port, path="/pay/x", method="GET", headers=None, body=None):
    from helpers import request
    r = request(port, method, path, headers=headers, body=body)
    assert r.status == 200, (r.status, r.body)
    return r.header("X-Backend")


def test_each_condition_type_picks_its_output(backends, runtimes):
    names = ["a", "hdr", "qry", "cookie", "param", "ip", "meth", "num", "nested", "notx"]
    routing = {
        "rules": [
            {"name": "canary", "match": [{"header": "X-Canary", "equals": "on"}],
             "backend": "hdr"},
            {"match": [{"query": "currency", "in": ["EUR", "GBP"]}], "backend": "qry"},
            {"match": [{"cookie": "beta", "present": True}], "backend": "cookie"},
            {"match": [{"pathParam": "id", "regex": "^vip-[0-9]+$"}], "backend": "param"},
            {"match": [{"attribute": "clientIp", "in": ["127.0.0.2/32", "10.0.0.0/8"]}],
             "backend": "ip"},
            {"match": [{"attribute": "method", "in": ["DELETE"]}], "backend": "meth"},
            {"match": [{"header": "X-Amount", "gt": 1000}], "backend": "num"},
            {"match": [{"all": [{"header": "X-Tier", "prefix": "gold"},
                                {"any": [{"query": "r", "equals": "eu"},
                                         {"query": "r", "equals": "us"}]}]}],
             "backend": "nested"},
            {"match": [{"header": "X-Region", "notEquals": "eu"}], "backend": "notx"},
        ],
        "default": {"backend": "a"},
    }
    ops = [{"name": "item", "method": "*", "path": "/items/{id}"},
           {"name": "all", "method": "*", "path": "/", "pathType": "prefix"}]
    port, _ = _start(backends, runtimes, names, routing, operations=ops)
    assert _who(port) == "a"
    assert _who(port, headers={"X-Canary": "on"}) == "hdr"
    assert _who(port, headers={"X-Canary": "off"}) == "a"
    assert _who(port, "/pay/x?currency=EUR") == "qry"
    assert _who(port, "/pay/x?a=1&currency=GBP") == "qry"
    assert _who(port, "/pay/x?currency=USD") == "a"
    assert _who(port, headers={"Cookie": "theme=dark; beta=1"}) == "cookie"
    assert _who(port, headers={"Cookie": "theme=dark"}) == "a"
    assert _who(port, "/pay/items/vip-7") == "param"
    assert _who(port, "/pay/items/7") == "a"
    assert _who(port, "/pay/x", method="DELETE") == "meth"
    assert _who(port, headers={"X-Amount": "1000.5"}) == "num"
    assert _who(port, headers={"X-Amount": "999"}) == "a"
    assert _who(port, headers={"X-Amount": "lots"}) == "a"  # not a number: false
    assert _who(port, "/pay/x?r=us", headers={"X-Tier": "gold-plus"}) == "nested"
    assert _who(port, "/pay/x?r=ap", headers={"X-Tier": "gold-plus"}) == "a"
    assert _who(port, "/pay/x?r=eu", headers={"X-Tier": "silver"}) == "a"
    # notEquals on a missing header is false (a missing attribute is false)
    assert _who(port, headers={"X-Region": "us"}) == "notx"
    assert _who(port, headers={"X-Region": "eu"}) == "a"
    # first matching rule wins
    assert _who(port, "/pay/x?currency=EUR", headers={"X-Canary": "on"}) == "hdr"


def test_client_ip_cidr(backends, runtimes, monkeypatch):
    import socket
    import helpers
    routing = {"rules": [{"match": [{"attribute": "clientIp", "in": ["127.0.0.64/26"]}],
                          "backend": "ip"}],
               "default": {"backend": "a"}}
    port, _ = _start(backends, runtimes, ["a", "ip"], routing)
    assert _who(port) == "a"  # from 127.0.0.1

    def connect(port, host="127.0.0.1", timeout=5.0):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.bind(("127.0.0.100", 0))
        s.connect((host, port))
        return s
    monkeypatch.setattr(helpers, "connect", connect)
    assert _who(port) == "ip"


def _consumer(name, key, group):
    return {"apiVersion": API_VERSION, "kind": "Consumer", "metadata": {"name": name},
            "spec": {"group": group, "credentials": {"apiKeys": [
                {"name": "k", "keyHash": "sha256:" + hashlib.sha256(key.encode()).hexdigest()}]}}}


def test_consumer_and_group(backends, runtimes):
    routing = {"rules": [{"match": [{"attribute": "consumer", "equals": "alice"}],
                          "backend": "alice"},
                         {"match": [{"attribute": "consumerGroup", "equals": "gold"}],
                          "backend": "gold"}],
               "default": {"backend": "a"}}
    extra = [_consumer("alice", "ka", "silver"), _consumer("bob", "kb", "gold"),
             _consumer("carol", "kc", "bronze")]
    port, _ = _start(backends, runtimes, ["a", "alice", "gold"], routing, extra=extra,
                     policies=[{"name": "api-key"}])
    assert _who(port, headers={"X-Api-Key": "ka"}) == "alice"
    assert _who(port, headers={"X-Api-Key": "kb"}) == "gold"
    assert _who(port, headers={"X-Api-Key": "kc"}) == "a"


def test_operation_block_wins_over_the_apis(backends, runtimes):
    routing = {"default": {"backend": "b"}}
    ops = [{"name": "special", "method": "GET", "path": "/special",
            "routing": {"rules": [{"match": [{"header": "X-C", "present": True}],
                                   "backend": "c"}],
                        "default": {"backend": "a"}}},
           {"name": "all", "method": "*", "path": "/", "pathType": "prefix"}]
    port, _ = _start(backends, runtimes, ["a", "b", "c"], routing, operations=ops)
    assert _who(port, "/pay/other") == "b"
    assert _who(port, "/pay/special") == "a"
    assert _who(port, "/pay/special", headers={"X-C": "1"}) == "c"


def test_priority_list_falls_back_when_the_first_is_down(backends, runtimes):
    up = backends("up")
    port = free_port()
    runtimes([gateway(port), backend_doc("down", [closed_port()]), backend_doc("up", [up.port]),
              api("pay", "/pay", "up", routing={"default": {"priority": ["down", "up"]}})])
    for _ in range(5):
        assert _who(port) == "up"
    # and a POST, which is only retried when the connection could not be made
    assert _who(port, method="POST", body=b"x") == "up"


def test_priority_list_prefers_the_first(backends, runtimes):
    port, bs = _start(backends, runtimes, ["a", "b"],
                      {"default": {"priority": ["b", "a"]}})
    assert collections.Counter(_who(port) for _ in range(20)) == {"b": 20}


def test_weighted_split_is_exact_over_100000_requests(backends, runtimes):
    routing = {"rules": [{"match": [{"header": "X-Canary", "equals": "1"}], "backend": "c"}],
               "default": {"split": [{"backend": "a", "weight": 90},
                                     {"priority": ["b", "a"], "weight": 7},
                                     {"backend": "c", "weight": 3}]}}
    port, bs = _start(backends, runtimes, ["a", "b", "c"], routing)
    n = 100000
    out = subprocess.run(["h2load", "--h1", "-n", str(n), "-c", "4", "-t", "1",
                          "http://127.0.0.1:%d/pay/x" % port],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert "%d succeeded" % n in out.stdout, out.stdout
    got = {k: len(b.requests) for k, b in bs.items()}
    assert sum(got.values()) == n, got
    for name, share in (("a", 0.90), ("b", 0.07), ("c", 0.03)):
        assert abs(got[name] / n - share) <= 0.01, got
    # canary by header is a rule
    assert _who(port, headers={"X-Canary": "1"}) == "c"


def _check(docs, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(dump_docs(docs))
    out = subprocess.run([runtime_binary(), "--check", "--config", str(path)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return out.returncode, out.stdout


def test_config_errors_name_the_field(tmp_path):
    base = [gateway(free_port()), backend_doc("a", [free_port()])]

    def bad(routing, *want, operations=None):
        rc, out = _check(base + [_rules_api(routing, operations=operations)], tmp_path)
        assert rc != 0, out
        for w in want:
            assert w in out, (w, out)

    bad({"default": {"backend": "nope"}},
        'spec.routing.default.backend: Backend "default/nope" not found')
    bad({"rules": [{"match": [{"header": "x", "equals": "1"}], "priority": ["a", "ghost"]}]},
        'spec.routing.rules[0].priority[1]: Backend "default/ghost" not found')
    bad({"default": {"split": []}}, "spec.routing.default.split")
    bad({"default": {"split": [{"backend": "a", "weight": 0}]}},
        "spec.routing.default.split: the weights sum to 0")
    bad({"rules": [{"backend": "a"}, {"match": [{"header": "x", "present": True}],
                                      "backend": "a"}]},
        "spec.routing.rules[1]: can never match: rules[0] has no match")
    bad({"rules": [{"match": [{"header": "x", "present": True}], "backend": "a"},
                   {"match": [{"header": "x", "present": True}], "backend": "a"}]},
        "spec.routing.rules[1]: can never match: rules[0] has the same match")
    bad({"rules": [{"match": [{"header": "x", "equals": "1", "prefix": "2"}], "backend": "a"}]},
        "spec.routing.rules[0].match[0]: a condition has exactly one operator")
    bad({"rules": [{"match": [{"attribute": "clientIp", "in": ["10.0.0.0/33"]}],
                    "backend": "a"}]},
        "spec.routing.rules[0].match[0].in[0]: expected an IP address or a CIDR range")
    bad({"rules": [{"match": [{"header": "x", "regex": "("}], "backend": "a"}]},
        "spec.routing.rules[0].match[0].regex")
    bad({"rules": [{"match": [{"header": "x", "equals": "1"}]}]},
        "spec.routing.rules[0]: no output")
    bad({"rules": [{"match": [{"headr": "x", "equals": "1"}], "backend": "a"}]},
        "spec.routing.rules[0].match[0].headr: unknown field (did you mean 'header'?)")
    bad(None, "spec.operations[0].routing.rules[0].match[0]: pathParam 'nope' is not a parameter",
        operations=[{"method": "GET", "path": "/x/{id}", "routing": {
            "rules": [{"match": [{"pathParam": "nope", "equals": "1"}], "backend": "a"}]}}])
    # and a good one passes
    rc, out = _check(base + [_rules_api({"rules": [
        {"match": [{"any": [{"header": "x", "equals": 1}, {"query": "q", "lt": 5}]}],
         "backend": "a"}], "default": {"split": [{"backend": "a", "weight": 1}]}})], tmp_path)
    assert rc == 0, out


SECRET = "0123456789abcdef0123456789abcdef-shared"


def _hs256(claims):
    import base64
    import hmac
    import json
    import time

    def b64u(b):
        return base64.urlsafe_b64encode(b if isinstance(b, bytes) else b.encode()).rstrip(
            b"=").decode()
    now = int(time.time())
    payload = {"sub": "alice", "iat": now, "exp": now + 600}
    payload.update(claims)
    signing = b64u(json.dumps({"alg": "HS256", "typ": "JWT"})) + "." + b64u(json.dumps(payload))
    sig = hmac.new(SECRET.encode(), signing.encode(), hashlib.sha256).digest()
    return signing + "." + b64u(sig)


def test_jwt_claims(backends, runtimes):
    routing = {"rules": [{"match": [{"claim": "tier", "equals": "gold"}], "backend": "gold"},
                         {"match": [{"claim": "/org/region", "in": ["eu"]}], "backend": "eu"},
                         {"match": [{"claim": "level", "ge": 3}], "backend": "lvl"}],
               "default": {"backend": "a"}}
    port, _ = _start(backends, runtimes, ["a", "gold", "eu", "lvl"], routing,
                     policies=[{"name": "jwt", "config": {"secret": SECRET}}])

    def who(claims):
        return _who(port, headers={"Authorization": "Bearer " + _hs256(claims)})
    assert who({}) == "a"
    assert who({"tier": "gold"}) == "gold"
    assert who({"tier": "silver", "org": {"region": "eu"}}) == "eu"
    assert who({"level": 3}) == "lvl"
    assert who({"level": 2}) == "a"


def test_json_body_fields(backends, runtimes):
    import json
    routing = {"rules": [
        {"match": [{"all": [{"body": "/amount", "gt": 1000},
                            {"header": "X-Mode", "equals": "live"}]}], "backend": "big"},
        {"match": [{"body": "/customer/country", "in": ["DE", "FR"]}], "backend": "eu"},
        {"match": [{"body": "/items/0/sku", "prefix": "gift-"}], "backend": "gift"}],
        "default": {"backend": "a"}, "maxBodyBytes": 4096}
    port, bs = _start(backends, runtimes, ["a", "big", "eu", "gift"], routing)

    def post(doc, headers=None):
        body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        return _who(port, method="POST", body=body,
                    headers=dict({"Content-Type": "application/json"}, **(headers or {})))
    assert post({"amount": 5000}, {"X-Mode": "live"}) == "big"
    assert post({"amount": 5000}, {"X-Mode": "test"}) == "a"  # the head's condition counts
    assert post({"amount": 10, "customer": {"country": "FR"}}) == "eu"
    assert post({"items": [{"sku": "gift-7"}]}) == "gift"
    assert post(b"not json") == "a"
    assert _who(port) == "a"  # no body: body conditions are false
    # the body reaches the chosen backend unchanged
    doc = {"amount": 2000, "note": "x" * 100}
    assert post(doc, {"X-Mode": "live"}) == "big"
    import zlib
    sent = json.dumps(doc).encode()
    rec = bs["big"].requests[-1]
    assert (rec["body_length"], rec["body_crc32"]) == (len(sent), zlib.crc32(sent)), rec
    # over maxBodyBytes
    from helpers import request
    r = request(port, "POST", "/pay/x", body=b"{" + b" " * 5000 + b"}")
    assert r.status == 413, r.status


def test_body_rules_need_backends_that_take_the_same_head(tmp_path):
    docs = [gateway(free_port()), backend_doc("a", [free_port()]),
            backend_doc("h", [free_port()], protocol="h2c"),
            _rules_api({"rules": [{"match": [{"body": "/x", "present": True}], "backend": "h"}],
                        "default": {"backend": "a"}})]
    rc, out = _check(docs, tmp_path)
    assert rc != 0 and "spec.routing: a rule reads the body" in out, out
    docs[-1] = _rules_api({"rules": [{"match": [{"body": "x", "present": True}],
                                      "backend": "a"}]})
    rc, out = _check(docs, tmp_path)
    assert rc != 0 and "spec.routing.rules[0].match[0].body: expected a JSON pointer" in out, out
