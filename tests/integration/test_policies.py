"""The policy engine (issue 10; policies/policy.h) with its first policies
(api-key, headers, respond), over HTTP/1.1 and HTTP/2: chains from the Api
and the operation (override, disable, `when`), short-circuits with the
policy's status, headers and body, header edits both ways, the Consumer
known to later policies and the log, metrics, fail closed, and validation
with field paths at the runtime and the controller."""

import hashlib
import json
import os
import subprocess

import grpc
import pytest

from backend import Backend
from helpers import API_VERSION, backend, dump_docs, free_port, wait_until

KEY = "k-3f9a-laptop"
OTHER_KEY = "k-bob-1"


def sha(key):
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def consumer(name, keys, group=None):
    spec = {"credentials": {"apiKeys": [{"name": n, "keyHash": sha(k)} for n, k in keys]}}
    if group:
        spec["group"] = group
    return {"apiVersion": API_VERSION, "kind": "Consumer", "metadata": {"name": name},
            "spec": spec}


def petstore(policies, operations=None, name="petstore", base="/petstore/v1"):
    return {"apiVersion": API_VERSION, "kind": "Api", "metadata": {"name": name},
            "spec": {"basePath": base, "backendRefs": [{"name": "echo"}], "policies": policies,
                     "operations": operations or [
                         {"method": "GET", "path": "/pets"},
                         {"method": "GET", "path": "/pets/{id}",
                          "policies": [{"name": "api-key", "disabled": True}]},
                         {"method": "POST", "path": "/pets"}]}}


API_KEY = {"name": "api-key", "config": {"header": "X-Api-Key", "query": "api_key"}}
HEADERS = {"name": "headers", "config": {
    "request": {"set": {"X-Consumer": "${consumer}", "X-Group": "${consumer_group}"},
                "add": {"X-Via-Policy": "on ${method} ${path}"},
                "remove": ["X-Secret"]},
    "response": {"set": {"X-Frame-Options": "DENY"}, "remove": ["Server"]}}}


@pytest.fixture
def echo():
    with Backend(name="echo") as b:
        b.extra_response_headers = [("Server", "origin/1.0")]
        yield b


def start(runtimes, proto, echo, policies, operations=None, extra=(), **kw):
    port = free_port()
    rt = runtimes([proto.gateway(port), backend("echo", [echo.port]),
                   consumer("alice", [("laptop", KEY)], group="gold"),
                   consumer("bob", [("ci", OTHER_KEY)]),
                   petstore(policies, operations)] + list(extra), **kw)
    return port, rt


def hdr(record, name):
    vals = [v for k, v in record["headers"] if k.lower() == name.lower()]
    return vals[0] if vals else None


def test_api_key_from_header_and_query(runtimes, proto, echo):
    port, _ = start(runtimes, proto, echo, [API_KEY])
    r = proto.request(port, "GET", "/petstore/v1/pets")
    assert r.status == 401
    assert r.header("WWW-Authenticate") == 'ApiKey realm="sluice", header="X-Api-Key"'
    body = json.loads(r.body)
    assert body["error"]["code"] == "unauthorized" and "X-Api-Key" in body["error"]["message"]
    assert body["error"]["request_id"] == r.header("X-Request-Id")

    r = proto.request(port, "GET", "/petstore/v1/pets", headers={"X-Api-Key": "nope"})
    assert r.status == 401 and "not valid" in json.loads(r.body)["error"]["message"]
    assert echo.count() == 0

    r = proto.request(port, "GET", "/petstore/v1/pets", headers={"X-Api-Key": KEY})
    assert r.status == 200
    rec = echo.received()[-1]
    assert hdr(rec, "X-Api-Key") is None  # removed before forwarding

    # From the query: the parameter is removed, the others stay in order.
    r = proto.request(port, "GET", "/petstore/v1/pets?a=1&api_key=%s&b=2" % KEY)
    assert r.status == 200
    assert echo.received()[-1]["target"] == "/pets?a=1&b=2"
    r = proto.request(port, "GET", "/petstore/v1/pets?api_key=%s" % KEY)
    assert r.status == 200 and echo.received()[-1]["target"] == "/pets"

    # Two keys: ambiguous, refused.
    r = proto.request(port, "GET", "/petstore/v1/pets",
                      headers=[("X-Api-Key", KEY), ("X-Api-Key", OTHER_KEY)])
    assert r.status == 401


def test_forward_keeps_the_key(runtimes, proto, echo):
    port, _ = start(runtimes, proto, echo,
                    [{"name": "api-key", "config": {"forward": True}}])
    r = proto.request(port, "GET", "/petstore/v1/pets", headers={"X-Api-Key": KEY})
    assert r.status == 200 and hdr(echo.received()[-1], "X-Api-Key") == KEY


def test_operation_disables_and_overrides_inherited_policies(runtimes, proto, echo):
    ops = [{"method": "GET", "path": "/pets"},
           {"method": "GET", "path": "/pets/{id}",
            "policies": [{"name": "api-key", "disabled": True}]},
           {"method": "GET", "path": "/admin",
            "policies": [{"name": "api-key", "config": {"header": "X-Admin-Key"}}]}]
    port, _ = start(runtimes, proto, echo, [API_KEY, HEADERS], ops)
    assert proto.request(port, "GET", "/petstore/v1/pets").status == 401
    r = proto.request(port, "GET", "/petstore/v1/pets/7")
    assert r.status == 200  # api-key disabled here, headers still inherited
    assert r.header("X-Frame-Options") == "DENY"
    assert hdr(echo.received()[-1], "X-Consumer") == ""
    # Overridden config: the inherited header name no longer counts.
    assert proto.request(port, "GET", "/petstore/v1/admin",
                         headers={"X-Api-Key": KEY}).status == 401
    assert proto.request(port, "GET", "/petstore/v1/admin",
                         headers={"X-Admin-Key": KEY}).status == 200


def test_headers_both_ways_with_the_consumer(runtimes, proto, echo):
    port, _ = start(runtimes, proto, echo, [API_KEY, HEADERS])
    r = proto.request(port, "GET", "/petstore/v1/pets",
                      headers={"X-Api-Key": KEY, "X-Secret": "s3", "X-Consumer": "forged"})
    assert r.status == 200
    rec = echo.received()[-1]
    assert hdr(rec, "X-Secret") is None
    assert [v for k, v in rec["headers"] if k.lower() == "x-consumer"] == ["default/alice"]
    assert hdr(rec, "X-Group") == "gold"
    assert hdr(rec, "X-Via-Policy") == "on GET /petstore/v1/pets"
    assert r.header("X-Frame-Options") == "DENY"
    assert r.header("Server") is None
    # The gateway's own answers get the response edits too.
    r = proto.request(port, "GET", "/petstore/v1/pets")
    assert r.status == 401 and r.header("X-Frame-Options") == "DENY"


def test_respond_with_a_condition(runtimes, proto, echo):
    policies = [{"name": "respond",
                 "when": {"methods": ["POST"], "headers": [{"name": "X-Maintenance",
                                                            "type": "present"}]},
                 "config": {"status": 503, "body": '{"message": "back soon"}',
                            "headers": {"Retry-After": "120"}}}]
    port, _ = start(runtimes, proto, echo, policies)
    r = proto.request(port, "POST", "/petstore/v1/pets", body=b"{}",
                      headers={"X-Maintenance": "1"})
    assert r.status == 503 and r.header("Retry-After") == "120"
    assert r.header("Content-Type") == "application/json"
    assert json.loads(r.body) == {"message": "back soon"}
    assert echo.count() == 0
    # The condition does not hold: the request goes through.
    assert proto.request(port, "POST", "/petstore/v1/pets", body=b"{}").status == 200
    assert proto.request(port, "GET", "/petstore/v1/pets",
                         headers={"X-Maintenance": "1"}).status == 200
    assert echo.count() == 2


def test_rejections_are_counted_and_logged(runtimes, proto, echo, tmp_path):
    log = tmp_path / "access.log"
    port, rt = start(runtimes, proto, echo, [API_KEY], access_log=str(log))
    for _ in range(3):
        assert proto.request(port, "GET", "/petstore/v1/pets").status == 401
    assert proto.request(port, "GET", "/petstore/v1/pets",
                         headers={"X-Api-Key": KEY}).status == 200

    def rejections():
        return [v for n, labels, v in rt.metrics() if n == "sluice_policy_rejections_total"
                and labels == {"api": "default/petstore", "policy": "api-key"}]
    assert rejections() == [3]
    wait_until(lambda: log.exists() and len(log.read_text().splitlines()) >= 4, 10,
               what="4 access log lines")
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    # Workers write their own lines: compare without order.
    assert sorted((x["status"], x["policy"], x["consumer"]) for x in lines) == \
        [(200, "", "default/alice")] + [(401, "api-key", "")] * 3


def test_grpc_request_rejected_with_unauthenticated(runtimes, echo):
    # A gRPC client sees the policy's 401 as UNAUTHENTICATED (16).
    from clients import Proto
    h2 = Proto("h2c")
    port, _ = start(runtimes, h2, echo, [API_KEY], operations=[
        {"method": "POST", "path": "/pkg.Svc/", "pathType": "prefix"}])
    ch = grpc.insecure_channel("127.0.0.1:%d" % h2.port(port))
    call = ch.unary_unary("/petstore/v1/pkg.Svc/Get")
    with pytest.raises(grpc.RpcError) as e:
        call(b"x", timeout=5)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    ch.close()


def check_config(tmp_path, docs):
    import yaml
    p = tmp_path / "c.yaml"
    p.write_text(dump_docs(docs))
    exe = os.path.join(os.environ.get("SLUICE_BUILD", "build"), "bin", "sluice-runtime")
    return subprocess.run([exe, "--check", "--config", str(p)], capture_output=True, text=True)


def test_validation_names_the_field(tmp_path):
    gw = {"apiVersion": API_VERSION, "kind": "Gateway", "metadata": {"name": "default"},
          "spec": {"listeners": [{"name": "http", "port": 8080, "protocol": "http"}]}}
    be = backend("echo", [9])
    cases = [
        ([{"name": "api-keys"}], "spec.policies[0].name: unknown policy (did you mean 'api-key'?)"),
        ([{"name": "api-key", "config": {"heder": "X"}}],
         "spec.policies[0].config.heder: unknown field (did you mean 'header'?)"),
        ([{"name": "api-key"}, {"name": "api-key"}], "spec.policies[1]: policy api-key is listed twice"),
        ([{"name": "api-key", "config": {"header": "X" * 128}}],
         "spec.policies[0].config.header: a header name of 1 to 127 characters"),
        ([{"name": "api-key", "config": {"query": "a&b"}}],
         "spec.policies[0].config.query: a query parameter name"),
        ([{"name": "api-key", "disabled": True}], "spec.policies[0].disabled: only an operation's"),
        ([{"name": "headers", "config": {"request": {"set": {"Content-Length": "1"}}}}],
         "spec.policies[0].config.request.set.Content-Length: Content-Length is managed by the gateway"),
        ([{"name": "headers", "config": {"response": {"set": {"X-A": "${nope}"}}}}],
         "spec.policies[0].config.response.set.X-A: unknown variable"),
        ([{"name": "headers", "config": {"request": {"add": {"X-Pet": "${path.id}"}}}}],
         "spec.policies[0].config.request.add.X-Pet: ${path.id}: no operation this policy "
         "applies to has a path parameter {id}"),
        ([{"name": "headers", "config": {"request": {"set": {"X-U": "${jwt.sub}"}}}}],
         "spec.policies[0].config.request.set.X-U: ${jwt.sub}: no jwt policy verifies a token"),
        ([{"name": "respond", "config": {}}], "spec.policies[0].config.status: required field missing"),
        ([{"name": "respond", "when": {"methods": ["FETCH"]}, "config": {"status": 200}}],
         "spec.policies[0].when.methods[0]"),
    ]
    for policies, want in cases:
        api = petstore(policies, [{"method": "GET", "path": "/pets"}])
        r = check_config(tmp_path, [gw, be, api])
        assert r.returncode != 0, policies
        assert want in r.stderr, (want, r.stderr)


def test_unsalted_password_hash_is_refused_with_the_fix(tmp_path):
    c = {"apiVersion": API_VERSION, "kind": "Consumer", "metadata": {"name": "alice"},
         "spec": {"credentials": {"basicAuth": [
             {"username": "alice", "passwordHash": "sha256:" + "0" * 64}]}}}
    r = check_config(tmp_path, [c])
    assert r.returncode != 0
    assert "spec.credentials.basicAuth[0].passwordHash" in r.stderr
    assert "openssl passwd -6" in r.stderr


ISSUE_EXAMPLE = """apiVersion: gateway.sluice.dev/v1alpha1
kind: Consumer
metadata: {name: alice}
spec:
  group: gold
  credentials:
    apiKeys:
    - {name: laptop, keyHash: "%s"}
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Api
metadata: {name: petstore}
spec:
  basePath: /petstore/v1
  backendRefs: [{name: echo}]
  policies:
  - name: api-key
    config: {header: X-Api-Key}
  - name: rate-limit
    config:
      limits:
      - {requests: 5, period: 1s, by: consumer}
  - name: headers
    config:
      response: {set: {X-Frame-Options: DENY}}
  - name: cors
    config: {allowOrigins: ["https://app.example.com"]}
  operations:
  - {method: GET, path: /pets}
  - {method: GET, path: "/pets/{id}", policies: [{name: rate-limit, disabled: true}]}
"""


def test_the_issue_example_works_as_written(runtimes, proto, echo):
    # The YAML of the policy issue, verbatim but for the key's hash, next to
    # a Gateway and the Backend it names.
    import yaml
    port = free_port()
    docs = [proto.gateway(port), backend("echo", [echo.port])] + \
        list(yaml.safe_load_all(ISSUE_EXAMPLE % sha(KEY)))
    runtimes(docs)
    key = {"X-Api-Key": KEY, "Origin": "https://app.example.com"}
    got = [proto.request(port, "GET", "/petstore/v1/pets", headers=key) for _ in range(8)]
    statuses = [r.status for r in got]
    # 5 per second by consumer: a burst of 8 gets at least one 429 (a
    # second boundary inside the burst can let a few more through).
    assert statuses.count(429) >= 1 and statuses.count(200) >= 5, statuses
    ok = next(r for r in got if r.status == 200)
    assert ok.header("X-Frame-Options") == "DENY"
    assert ok.header("Access-Control-Allow-Origin") == "https://app.example.com"
    limited = next(r for r in got if r.status == 429)
    assert limited.header("Retry-After") and limited.header("X-Frame-Options") == "DENY"
    # The override: no rate limit on /pets/{id}, the key still required.
    assert all(proto.request(port, "GET", "/petstore/v1/pets/%d" % i, headers=key).status == 200
               for i in range(8))
    assert proto.request(port, "GET", "/petstore/v1/pets/1").status == 401
    # A preflight is answered by the gateway, before authentication.
    r = proto.request(port, "OPTIONS", "/petstore/v1/pets",
                      headers={"Origin": "https://app.example.com",
                               "Access-Control-Request-Method": "GET"})
    assert r.status == 204 and r.header("Access-Control-Allow-Origin") == "https://app.example.com"
