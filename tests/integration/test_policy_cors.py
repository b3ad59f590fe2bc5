"""The cors policy (docs/policies/cors.md): preflights answered by the
gateway (allowed, or 403 cors_rejected for the origin, the method or a
header), the CORS headers of actual requests (on the upstream's responses
and on the gateway's own errors), credentials, and the router's preflight
routing (an OPTIONS preflight to a path without an OPTIONS operation).
Every case runs over HTTP/1.1 and h2c (`proto`)."""

import hashlib

import pytest

from helpers import API_VERSION, api, assert_gateway_error, backend, free_port

KEY = "k-cors-test-0123456789"
APP = "https://app.example.com"


def consumer():
    return {"apiVersion": API_VERSION, "kind": "Consumer", "metadata": {"name": "alice"},
            "spec": {"credentials": {"apiKeys": [
                {"name": "laptop",
                 "keyHash": "sha256:" + hashlib.sha256(KEY.encode()).hexdigest()}]}}}


def start(backends, runtimes, proto, cors, extra_policies=(), operations=None):
    b = backends("echo")
    port = free_port()
    ops = operations or [
        {"name": "list", "method": "GET", "path": "/items"},
        {"name": "create", "method": "POST", "path": "/items"},
        {"name": "delete", "method": "DELETE", "path": "/items/{id}"},
    ]
    rt = runtimes([
        proto.gateway(port),
        backend("echo", [b.port]),
        consumer(),
        api("t", "/t", "echo", operations=ops,
            policies=[{"name": "cors", "config": cors}] + list(extra_policies)),
    ])
    return rt, port, b


def preflight(proto, port, path, method, origin=APP, headers=None):
    h = [("Origin", origin), ("Access-Control-Request-Method", method)]
    if headers:
        h.append(("Access-Control-Request-Headers", headers))
    return proto.request(port, "OPTIONS", path, headers=h)


def test_preflight_allowed(backends, runtimes, proto):
    _, port, b = start(backends, runtimes, proto,
                       {"allowOrigins": [APP], "allowHeaders": ["Content-Type", "X-Trace"],
                        "maxAgeSeconds": 600})
    # /t/items/{id} has DELETE only: the preflight is routed as DELETE and
    # answered by cors (the router alone would say 405).
    r = preflight(proto, port, "/t/items/7", "DELETE", headers="content-type, X-Trace")
    assert r.status == 204, r
    assert r.body == b""
    assert r.header("Content-Length") is None
    assert r.header("Access-Control-Allow-Origin") == APP
    assert r.header("Access-Control-Allow-Credentials") is None
    # Default methods: the operation's.
    assert r.header("Access-Control-Allow-Methods") == "DELETE"
    assert r.header("Access-Control-Allow-Headers") == "content-type,x-trace"
    assert r.header("Access-Control-Max-Age") == "600"
    assert "Origin" in ", ".join(r.header_all("Vary"))
    assert b.count() == 0, "a preflight never reaches the upstream"


def test_preflight_refused(backends, runtimes, proto):
    _, port, b = start(backends, runtimes, proto,
                       {"allowOrigins": [APP], "allowOriginPatterns": [r"https://[a-z]+\.example\.org"],
                        "allowMethods": ["GET", "POST", "PUT"], "allowHeaders": ["X-Trace"]})
    err = assert_gateway_error(preflight(proto, port, "/t/items", "POST",
                                         origin="https://evil.example.net"), 403)
    assert err["code"] == "cors_rejected" and "origin" in err["message"]
    # The pattern is anchored: a longer origin does not match.
    assert_gateway_error(preflight(proto, port, "/t/items", "POST",
                                   origin="https://a.example.org.evil.net"), 403)
    r = preflight(proto, port, "/t/items", "POST", origin="https://shop.example.org")
    assert r.status == 204, r
    assert r.header("Access-Control-Allow-Origin") == "https://shop.example.org"
    assert r.header("Access-Control-Allow-Methods") == "GET, POST, PUT"
    # DELETE is not in allowMethods (the operation has it: the list decides).
    err = assert_gateway_error(preflight(proto, port, "/t/items/1", "DELETE"), 403)
    assert "method" in err["message"]
    err = assert_gateway_error(preflight(proto, port, "/t/items", "POST",
                                         headers="X-Trace, Authorization"), 403)
    assert "header" in err["message"] and "Authorization" in err["message"]
    assert b.count() == 0


def test_preflight_without_cors_keeps_405(backends, runtimes, proto):
    """Only a chain with cors answers preflights: elsewhere OPTIONS to a
    path without an OPTIONS operation stays 405."""
    b = backends("echo")
    port = free_port()
    runtimes([proto.gateway(port), backend("echo", [b.port]),
              api("t", "/t", "echo", operations=[{"name": "g", "method": "GET", "path": "/x"}])])
    r = preflight(proto, port, "/t/x", "GET")
    assert_gateway_error(r, 405)
    assert r.header("Allow") == "GET"


def test_preflight_skipped_by_when_is_405(backends, runtimes, proto):
    """A preflight routed as another method that cors leaves alone (its
    `when` does not match) is not forwarded as that method."""
    b = backends("echo")
    port = free_port()
    runtimes([proto.gateway(port), backend("echo", [b.port]),
              api("t", "/t", "echo", operations=[{"name": "g", "method": "GET", "path": "/x"}],
                  policies=[{"name": "cors", "config": {"allowOrigins": [APP]},
                             "when": {"pathPrefixes": ["/t/other"]}}])])
    assert_gateway_error(preflight(proto, port, "/t/x", "GET"), 405)
    assert b.count() == 0


def test_actual_request_headers(backends, runtimes, proto):
    _, port, b = start(backends, runtimes, proto,
                       {"allowOrigins": [APP], "exposeHeaders": ["X-Total", "X-Page"]})
    r = proto.request(port, "GET", "/t/items", headers={"Origin": APP})
    assert r.status == 200, r
    assert r.header("Access-Control-Allow-Origin") == APP
    assert r.header("Access-Control-Expose-Headers") == "X-Total, X-Page"
    assert r.header("Access-Control-Allow-Credentials") is None
    assert "Origin" in r.header_all("Vary")
    # A disallowed origin: no CORS headers (the browser blocks), but the
    # request still reaches the upstream.
    r = proto.request(port, "GET", "/t/items", headers={"Origin": "https://evil.example.net"})
    assert r.status == 200, r
    assert r.header("Access-Control-Allow-Origin") is None
    assert r.header("Access-Control-Expose-Headers") is None
    assert "Origin" in r.header_all("Vary")
    assert b.count() == 2
    # No Origin: not a CORS request.
    r = proto.request(port, "GET", "/t/items")
    assert r.status == 200 and r.header("Access-Control-Allow-Origin") is None


def test_upstream_cors_headers_do_not_override(backends, runtimes, proto):
    """The gateway's answer is the only one: the upstream's own
    Access-Control-Allow-Origin is replaced, or removed for a refused origin."""
    _, port, b = start(backends, runtimes, proto, {"allowOrigins": [APP]})
    b.extra_response_headers = [("Access-Control-Allow-Origin", "*")]
    r = proto.request(port, "GET", "/t/items", headers={"Origin": APP})
    assert r.header_all("Access-Control-Allow-Origin") == [APP]
    r = proto.request(port, "GET", "/t/items", headers={"Origin": "https://evil.example.net"})
    assert r.header_all("Access-Control-Allow-Origin") == []


def test_any_origin(backends, runtimes, proto):
    _, port, _ = start(backends, runtimes, proto, {"allowOrigins": ["*"]}, operations=[
        {"name": "all", "method": "*", "path": "/", "pathType": "prefix"}])
    r = proto.request(port, "GET", "/t/items", headers={"Origin": "https://x.example"})
    assert r.header("Access-Control-Allow-Origin") == "*"
    assert "Origin" not in ", ".join(r.header_all("Vary")), "'*' does not vary by origin"
    r = preflight(proto, port, "/t/items", "POST", origin="https://x.example")
    assert r.status == 204 and r.header("Access-Control-Allow-Origin") == "*"
    # An operation of any method: GET, HEAD, POST by default.
    assert r.header("Access-Control-Allow-Methods") == "GET, HEAD, POST"


def test_credentials(backends, runtimes, proto):
    _, port, _ = start(backends, runtimes, proto,
                       {"allowOrigins": [APP], "allowCredentials": True,
                        "allowMethods": ["*"], "allowHeaders": ["*"]})
    r = proto.request(port, "GET", "/t/items", headers={"Origin": APP})
    assert r.header("Access-Control-Allow-Origin") == APP, "never '*' with credentials"
    assert r.header("Access-Control-Allow-Credentials") == "true"
    r = preflight(proto, port, "/t/items/3", "DELETE", headers="X-Anything")
    assert r.status == 204, r
    assert r.header("Access-Control-Allow-Origin") == APP
    assert r.header("Access-Control-Allow-Credentials") == "true"
    assert r.header("Access-Control-Allow-Methods") == "DELETE"
    assert r.header("Access-Control-Allow-Headers") == "x-anything"


def test_gateway_401_carries_cors_headers(backends, runtimes, proto):
    """api-key refuses the request; the browser must still be able to read
    the 401, so it carries the CORS headers. The preflight before it needs
    no key (browsers never send credentials with one)."""
    _, port, b = start(backends, runtimes, proto, {"allowOrigins": [APP]},
                       extra_policies=[{"name": "api-key", "config": {"header": "X-Api-Key"}}])
    r = preflight(proto, port, "/t/items", "POST", headers="X-Api-Key")
    assert r.status == 403, "X-Api-Key is not an allowed header: %r" % r
    r = preflight(proto, port, "/t/items", "GET")
    assert r.status == 204, r
    r = proto.request(port, "GET", "/t/items", headers={"Origin": APP})
    assert_gateway_error(r, 401)
    assert r.header("Access-Control-Allow-Origin") == APP
    r = proto.request(port, "GET", "/t/items", headers={"Origin": APP, "X-Api-Key": KEY})
    assert r.status == 200 and r.header("Access-Control-Allow-Origin") == APP
    assert b.count() == 1


def test_config_errors(runtimes, tmp_path):
    """Validation names the field and the fix."""
    import subprocess
    from helpers import dump_docs, gateway, runtime_binary
    for cfg, field, words in [
        ({"allowOrigins": ["*"], "allowCredentials": True},
         "config.allowOrigins[0]", "allowCredentials"),
        ({"allowOrigins": ["https://a.example/"]}, "config.allowOrigins[0]", "not an origin"),
        ({"allowOriginPatterns": ["https://(a"]}, "config.allowOriginPatterns[0]", "compile"),
        ({"allowMethods": ["GET"]}, "config", "allowOrigins or allowOriginPatterns"),
        ({"allowOrigins": [APP], "maxAge": 5}, "config.maxAge", "unknown field"),
    ]:
        f = tmp_path / "c.yaml"
        f.write_text(dump_docs([gateway(free_port()), backend("echo", [1]),
                                api("t", "/t", "echo",
                                    policies=[{"name": "cors", "config": cfg}])]))
        p = subprocess.run([runtime_binary(), "--check", "--config", str(f)],
                           capture_output=True, text=True, timeout=30)
        out = p.stdout + p.stderr
        assert p.returncode != 0, (cfg, out)
        assert field in out and words in out, (cfg, out)
