"""Proxy headers: X-Forwarded-*, X-Request-Id, Via, hop-by-hop removal in
both directions, Host preserved or rewritten, end-to-end headers kept."""

from helpers import api, backend, free_port, gateway, request


def hdrs(rec, name):
    return [v for k, v in rec["headers"] if k.lower() == name.lower()]


def one(rec, name):
    vals = hdrs(rec, name)
    assert len(vals) == 1, "%s: expected exactly one, backend saw %r" % (name, rec["headers"])
    return vals[0]


def test_forwarded_headers_added(simple):
    env = simple()
    r = request(env.port, "GET", "/t/echo", host="api.example.com")
    assert r.status == 200
    rec = env.backend.received()[-1]
    assert one(rec, "X-Forwarded-For") == "127.0.0.1"
    assert one(rec, "X-Forwarded-Proto") == "http"
    assert one(rec, "X-Forwarded-Host") == "api.example.com"
    assert one(rec, "Host") == "api.example.com", "Host is preserved by default"


def test_forwarded_for_appended(simple):
    env = simple()
    request(env.port, "GET", "/t/echo", headers={"X-Forwarded-For": "203.0.113.9"})
    rec = env.backend.received()[-1]
    assert one(rec, "X-Forwarded-For") == "203.0.113.9, 127.0.0.1"


def test_request_id_generated_and_propagated(simple):
    env = simple()
    request(env.port, "GET", "/t/echo")
    request(env.port, "GET", "/t/echo")
    request(env.port, "GET", "/t/echo", headers={"X-Request-Id": "client-id-42"})
    recs = env.backend.received()
    generated = [one(r, "X-Request-Id") for r in recs[:2]]
    assert all(len(g) >= 8 for g in generated), generated
    assert generated[0] != generated[1], "request ids must be unique"
    assert one(recs[2], "X-Request-Id") == "client-id-42"


def test_hop_by_hop_request_headers_removed(simple):
    env = simple()
    request(env.port, "GET", "/t/echo", headers=[
        ("Connection", "keep-alive, X-Secret, X-Other"),
        ("X-Secret", "s"),
        ("X-Other", "o"),
        ("Keep-Alive", "timeout=5"),
        ("TE", "trailers"),
        ("Proxy-Connection", "keep-alive"),
        ("X-Kept", "k"),
    ])
    rec = env.backend.received()[-1]
    names = {k.lower() for k, _ in rec["headers"]}
    for gone in ("x-secret", "x-other", "keep-alive", "te", "proxy-connection"):
        assert gone not in names, "%s forwarded upstream: %r" % (gone, rec["headers"])
    for v in hdrs(rec, "Connection"):
        assert "x-secret" not in v.lower()
    assert one(rec, "X-Kept") == "k"


def test_hop_by_hop_response_headers_removed(simple):
    env = simple()
    env.backend.extra_response_headers = [
        ("Connection", "X-Resp-Secret"), ("X-Resp-Secret", "1"), ("Keep-Alive", "timeout=9"),
        ("X-Resp-Kept", "yes"), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2")]
    r = request(env.port, "GET", "/t/echo")
    assert r.status == 200
    names = {k.lower() for k, _ in r.headers}
    assert "x-resp-secret" not in names, r.headers
    assert r.header("Keep-Alive") is None or "timeout=9" not in r.header("Keep-Alive")
    assert r.header("X-Resp-Kept") == "yes"
    assert r.header_all("Set-Cookie") == ["a=1", "b=2"], "repeated headers must stay separate"


def test_end_to_end_headers_kept_in_order(simple):
    env = simple()
    request(env.port, "POST", "/t/echo", body=b"abc", headers=[
        ("X-Multi", "1"), ("X-Multi", "2"), ("X-Spaces", "a  b\tc"),
        ("Content-Type", "text/plain"), ("Authorization", "Bearer t")])
    rec = env.backend.received()[-1]
    assert hdrs(rec, "X-Multi") == ["1", "2"]
    assert one(rec, "X-Spaces") == "a  b\tc"
    assert one(rec, "Authorization") == "Bearer t"
    assert one(rec, "Content-Length") == "3"
    assert rec["body_length"] == 3


def test_host_rewrite(backends, runtimes):
    b = backends()
    port = free_port()
    runtimes([gateway(port), backend("echo", [b.port], hostRewrite="internal.svc"),
              api("t", "/t", "echo")])
    request(port, "GET", "/t/echo", host="api.example.com")
    rec = b.received()[-1]
    assert one(rec, "Host") == "internal.svc"
    assert one(rec, "X-Forwarded-Host") == "api.example.com"


def test_via_header_when_enabled(backends, runtimes):
    b = backends()
    port = free_port()
    runtimes([gateway(port, via=True), backend("echo", [b.port]), api("t", "/t", "echo")])
    r = request(port, "GET", "/t/echo")
    rec = b.received()[-1]
    via = one(rec, "Via")
    assert via.startswith("1.1 "), via
    assert any(v.startswith("1.1 ") or ", 1.1 " in v for v in r.header_all("Via")), r.headers


def test_no_via_by_default(simple):
    env = simple()
    request(env.port, "GET", "/t/echo")
    assert hdrs(env.backend.received()[-1], "Via") == []
