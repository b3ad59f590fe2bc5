"""Routing of examples/quickstart.yaml as written in issue 2: base path
stripped, templates, methods, 404 and 405 answered by the gateway.

Every test runs over HTTP/1.1 and HTTP/2 (the `proto` fixture): routing acts
on the protocol-independent request, so both must route alike.
"""

import json
import os
import re

import pytest
import yaml

from helpers import (REPO, api, assert_gateway_error, backend, dump_docs, free_port)

QUICKSTART = """\
apiVersion: gateway.sluice.dev/v1alpha1
kind: Gateway
metadata: {name: default}
spec:
  fleet: default
  listeners:
  - {name: http, port: 8080, protocol: http}
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Backend
metadata: {name: echo}
spec:
  endpoints:
  - {address: 127.0.0.1, port: 9001}
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Api
metadata: {name: petstore}
spec:
  basePath: /petstore/v1
  backendRefs: [{name: echo}]
  operations:
  - {method: GET, path: /pets}
  - {method: GET, path: "/pets/{id}"}
  - {method: POST, path: /pets}
"""


def quickstart_text(listen_port, backend_port):
    """examples/quickstart.yaml when present (it must work as written), else
    the issue's text; only the two ports are changed."""
    path = os.path.join(REPO, "examples", "quickstart.yaml")
    text = QUICKSTART
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    text, n1 = re.subn(r"\bport: 8080\b", "port: %d" % listen_port, text)
    text, n2 = re.subn(r"\bport: 9001\b", "port: %d" % backend_port, text)
    assert n1 == 1 and n2 == 1, "quickstart no longer has port 8080 / 9001:\n" + text
    return text


def with_h2c_listener(text, proto, port):
    """The quickstart with the h2c listener of proto.gateway() added."""
    docs = list(yaml.safe_load_all(text))
    for d in docs:
        if d["kind"] == "Gateway":
            d["spec"]["listeners"] += proto.gateway(port)["spec"]["listeners"][1:]
    return dump_docs(docs)


@pytest.fixture
def qs(backends, runtimes, proto):
    b = backends("echo")
    port = free_port()
    rt = runtimes(with_h2c_listener(quickstart_text(port, b.port), proto, port))
    return port, b, rt


def test_quickstart_get_collection(qs, proto):
    port, b, _ = qs
    r = proto.request(port, "GET", "/petstore/v1/pets")
    assert r.status == 200, r
    doc = r.json()
    assert doc["method"] == "GET"
    assert doc["target"] == "/pets", "base path must be stripped by default"
    assert b.received()[-1]["path"] == "/pets"


def test_quickstart_get_template(qs, proto):
    port, b, _ = qs
    r = proto.request(port, "GET", "/petstore/v1/pets/7")
    assert r.status == 200, r
    assert r.json()["target"] == "/pets/7"


def test_quickstart_query_string_forwarded(qs, proto):
    port, b, _ = qs
    r = proto.request(port, "GET", "/petstore/v1/pets/7?expand=owner&x=%2F")
    assert r.status == 200, r
    assert r.json()["target"] == "/pets/7?expand=owner&x=%2F"


def test_quickstart_post_with_body(qs, proto):
    port, b, _ = qs
    body = json.dumps({"name": "rex"}).encode()
    r = proto.request(port, "POST", "/petstore/v1/pets", headers={"Content-Type": "application/json"},
                body=body)
    assert r.status == 200, r
    doc = r.json()
    assert doc["method"] == "POST"
    assert doc["target"] == "/pets"
    assert doc["body_length"] == len(body)


def test_quickstart_template_does_not_match_deeper_path(qs, proto):
    port, b, _ = qs
    r = proto.request(port, "GET", "/petstore/v1/pets/7/owner")
    assert_gateway_error(r, 404)
    assert b.count() == 0


def test_unknown_path_is_404_json(qs, proto):
    port, b, _ = qs
    for target in ("/petstore/v1/dogs", "/other", "/", "/petstore/v2/pets"):
        r = proto.request(port, "GET", target)
        assert_gateway_error(r, 404)
    assert b.count() == 0, "nothing unrouted may reach the backend"


def test_wrong_method_is_405_with_allow(qs, proto):
    port, b, _ = qs
    r = proto.request(port, "DELETE", "/petstore/v1/pets")
    assert_gateway_error(r, 405)
    allow = {m.strip() for m in (r.header("Allow") or "").split(",")}
    assert {"GET", "POST"} <= allow, "Allow: %r" % r.header("Allow")
    assert "DELETE" not in allow
    r = proto.request(port, "POST", "/petstore/v1/pets/7")
    assert_gateway_error(r, 405)
    allow = {m.strip() for m in (r.header("Allow") or "").split(",")}
    assert "GET" in allow and "POST" not in allow, r.header("Allow")
    assert b.count() == 0


def test_error_carries_request_id(qs, proto):
    port, _, _ = qs
    r = proto.request(port, "GET", "/nowhere", headers={"X-Request-Id": "req-abc-123"})
    err = assert_gateway_error(r, 404)
    assert err["request_id"] == "req-abc-123"


def test_keep_base_path_and_hosts(backends, runtimes, proto):
    b = backends()
    port = free_port()
    docs = [
        proto.gateway(port),
        backend("echo", [b.port]),
        api("kept", "/keep", "echo", stripBasePath=False,
            operations=[{"method": "GET", "path": "/x"}]),
        api("hosted", "/h", "echo", hosts=["api.example.com", "*.wild.test"],
            operations=[{"method": "GET", "path": "/x"}]),
    ]
    runtimes(docs)
    r = proto.request(port, "GET", "/keep/x")
    assert r.status == 200, r
    assert r.json()["target"] == "/keep/x"
    r = proto.request(port, "GET", "/h/x", host="api.example.com")
    assert r.status == 200 and r.json()["target"] == "/x", r
    r = proto.request(port, "GET", "/h/x", host="API.Example.COM:%d" % port)
    assert r.status == 200, "host matching must be case-insensitive and ignore the port: %r" % r
    r = proto.request(port, "GET", "/h/x", host="a.wild.test")
    assert r.status == 200, r
    r = proto.request(port, "GET", "/h/x", host="other.example.com")
    assert_gateway_error(r, 404)


def test_precedence(backends, runtimes, proto):
    """router.h: exact > template > prefix (longest first) > regex; more
    header matches first for the same path."""
    a = backends("a")
    c = backends("c")
    port = free_port()
    docs = [
        proto.gateway(port),
        backend("a", [a.port]),
        backend("c", [c.port]),
        api("api", "/v", operations=[
            {"name": "any", "method": "GET", "path": "/", "pathType": "prefix",
             "backendRefs": [{"name": "a"}]},
            {"name": "longer", "method": "GET", "path": "/deep/er", "pathType": "prefix",
             "backendRefs": [{"name": "c"}]},
            {"name": "one", "method": "GET", "path": "/items/{id}",
             "backendRefs": [{"name": "c"}]},
            {"name": "hdr", "method": "GET", "path": "/h", "pathType": "exact",
             "headers": [{"name": "X-Version", "value": "2"}],
             "backendRefs": [{"name": "c"}]},
        ]),
        api("re", "/r", operations=[
            {"name": "re", "method": "GET", "path": "^/n/[0-9]+$", "pathType": "regex",
             "backendRefs": [{"name": "c"}]},
            {"name": "lit", "method": "GET", "path": "/n/{x}",
             "query": [{"name": "tpl", "type": "present"}],
             "backendRefs": [{"name": "a"}]},
        ]),
    ]
    runtimes(docs)
    assert proto.request(port, "GET", "/v/items/3").header("X-Backend") == "c"
    assert proto.request(port, "GET", "/v/items").header("X-Backend") == "a"
    assert proto.request(port, "GET", "/v/deep/er/x").header("X-Backend") == "c"
    assert proto.request(port, "GET", "/v/deep/x").header("X-Backend") == "a"
    assert proto.request(port, "GET", "/v/h", headers={"X-Version": "2"}).header("X-Backend") == "c"
    assert proto.request(port, "GET", "/v/h", headers={"X-Version": "1"}).header("X-Backend") == "a"
    assert proto.request(port, "GET", "/r/n/42").header("X-Backend") == "c"
    assert proto.request(port, "GET", "/r/n/42?tpl=1").header("X-Backend") == "a", \
        "a template beats a regex"
    assert_gateway_error(proto.request(port, "GET", "/r/n/x"), 404)
