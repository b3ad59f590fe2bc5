"""Proxy headers: X-Forwarded-*, X-Request-Id, Via, hop-by-hop removal in
both directions, Host preserved or rewritten, end-to-end headers kept.

Every test runs over HTTP/1.1 and HTTP/2 (the `proto` fixture): the header
rules are the request object's, not a codec's. Over HTTP/2 a client cannot
send connection-specific headers at all (RFC 9113 8.2.2: such a request is
malformed), so the hop-by-hop request case has an HTTP/2 twin asserting the
refusal instead.
"""

import pytest

from clients import H2Connection, H2Reset, Proto
from helpers import api, backend, free_port


def hdrs(rec, name):
    return [v for k, v in rec["headers"] if k.lower() == name.lower()]


def one(rec, name):
    vals = hdrs(rec, name)
    assert len(vals) == 1, "%s: expected exactly one, backend saw %r" % (name, rec["headers"])
    return vals[0]


def test_forwarded_headers_added(simple, proto):
    env = simple()
    r = proto.request(env.port, "GET", "/t/echo", host="api.example.com")
    assert r.status == 200
    rec = env.backend.received()[-1]
    assert one(rec, "X-Forwarded-For") == "127.0.0.1"
    assert one(rec, "X-Forwarded-Proto") == "http"
    assert one(rec, "X-Forwarded-Host") == "api.example.com"
    assert one(rec, "Host") == "api.example.com", "Host is preserved by default"


def test_forwarded_for_appended(simple, proto):
    env = simple()
    proto.request(env.port, "GET", "/t/echo", headers={"X-Forwarded-For": "203.0.113.9"})
    rec = env.backend.received()[-1]
    assert one(rec, "X-Forwarded-For") == "203.0.113.9, 127.0.0.1"


def test_request_id_generated_and_propagated(simple, proto):
    env = simple()
    proto.request(env.port, "GET", "/t/echo")
    proto.request(env.port, "GET", "/t/echo")
    proto.request(env.port, "GET", "/t/echo", headers={"X-Request-Id": "client-id-42"})
    recs = env.backend.received()
    generated = [one(r, "X-Request-Id") for r in recs[:2]]
    assert all(len(g) >= 8 for g in generated), generated
    assert generated[0] != generated[1], "request ids must be unique"
    assert one(recs[2], "X-Request-Id") == "client-id-42"


def test_hop_by_hop_request_headers_removed(simple, proto):
    env = simple()
    if proto.h2:
        # RFC 9113 8.2.2: only "TE: trailers" may be sent over HTTP/2 (the
        # others are refused: test_h2_connection_specific_request_headers_refused),
        # and TE is still hop-by-hop for the HTTP/1.1 hop upstream.
        sent = [("TE", "trailers"), ("X-Kept", "k")]
        gone_names = ("te",)
    else:
        sent = [("Connection", "keep-alive, X-Secret, X-Other"), ("X-Secret", "s"),
                ("X-Other", "o"), ("Keep-Alive", "timeout=5"), ("TE", "trailers"),
                ("Proxy-Connection", "keep-alive"), ("X-Kept", "k")]
        gone_names = ("x-secret", "x-other", "keep-alive", "te", "proxy-connection")
    r = proto.request(env.port, "GET", "/t/echo", headers=sent)
    assert r.status == 200, r
    rec = env.backend.received()[-1]
    names = {k.lower() for k, _ in rec["headers"]}
    for gone in gone_names:
        assert gone not in names, "%s forwarded upstream: %r" % (gone, rec["headers"])
    for v in hdrs(rec, "Connection"):
        assert "x-secret" not in v.lower()
    assert one(rec, "X-Kept") == "k"


def test_hop_by_hop_response_headers_removed(simple, proto):
    env = simple()
    env.backend.extra_response_headers = [
        ("Connection", "X-Resp-Secret"), ("X-Resp-Secret", "1"), ("Keep-Alive", "timeout=9"),
        ("X-Resp-Kept", "yes"), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2")]
    r = proto.request(env.port, "GET", "/t/echo")
    assert r.status == 200
    names = {k.lower() for k, _ in r.headers}
    assert "x-resp-secret" not in names, r.headers
    assert r.header("Keep-Alive") is None or "timeout=9" not in r.header("Keep-Alive")
    assert r.header("X-Resp-Kept") == "yes"
    assert r.header_all("Set-Cookie") == ["a=1", "b=2"], "repeated headers must stay separate"


def test_end_to_end_headers_kept_in_order(simple, proto):
    env = simple()
    proto.request(env.port, "POST", "/t/echo", body=b"abc", headers=[
        ("X-Multi", "1"), ("X-Multi", "2"), ("X-Spaces", "a  b\tc"),
        ("Content-Type", "text/plain"), ("Authorization", "Bearer t")])
    rec = env.backend.received()[-1]
    assert hdrs(rec, "X-Multi") == ["1", "2"]
    assert one(rec, "X-Spaces") == "a  b\tc"
    assert one(rec, "Authorization") == "Bearer t"
    assert one(rec, "Content-Length") == "3"
    assert rec["body_length"] == 3


def test_host_rewrite(backends, runtimes, proto):
    b = backends()
    port = free_port()
    runtimes([proto.gateway(port), backend("echo", [b.port], hostRewrite="internal.svc"),
              api("t", "/t", "echo")])
    proto.request(port, "GET", "/t/echo", host="api.example.com")
    rec = b.received()[-1]
    assert one(rec, "Host") == "internal.svc"
    assert one(rec, "X-Forwarded-Host") == "api.example.com"


def test_via_header_when_enabled(backends, runtimes, proto):
    b = backends()
    port = free_port()
    runtimes([proto.gateway(port, via=True), backend("echo", [b.port]), api("t", "/t", "echo")])
    r = proto.request(port, "GET", "/t/echo")
    rec = b.received()[-1]
    via = one(rec, "Via")
    # The received protocol (RFC 9110 7.6.3): "2" for a request that came in
    # over HTTP/2 (regression: it said "1.1" for every HTTP/2 request).
    assert via.startswith(proto.via_version + " "), via
    assert any(v.startswith("1.1 ") or ", 1.1 " in v for v in r.header_all("Via")), r.headers


def test_no_via_by_default(simple, proto):
    env = simple()
    proto.request(env.port, "GET", "/t/echo")
    assert hdrs(env.backend.received()[-1], "Via") == []


@pytest.mark.parametrize("field", [("connection", "keep-alive"), ("keep-alive", "timeout=5"),
                                   ("proxy-connection", "keep-alive"),
                                   ("transfer-encoding", "chunked"), ("upgrade", "websocket"),
                                   ("te", "gzip")])
def test_h2_connection_specific_request_headers_refused(simple, field):
    """HTTP/2 only (RFC 9113 8.2.2): a request carrying a connection-specific
    field is malformed; it is refused (a stream error, or a 400) and never
    reaches the origin; the connection keeps serving other streams."""
    h2c = Proto("h2c")
    env = simple(proto=h2c)
    c = H2Connection(h2c.port(env.port), validate_outbound=False)
    try:
        try:
            r = c.request("GET", "/t/echo", headers=[field, ("x-kept", "k")])
            assert r.status == 400, "%s: answered %r" % (field[0], r)
        except H2Reset as e:
            assert e.kind == "RST_STREAM" and e.code == 1, \
                "%s: expected RST_STREAM PROTOCOL_ERROR, got %s" % (field[0], e)
        assert c.request("GET", "/t/echo?after").status == 200
    finally:
        c.close()
    assert [r["target"] for r in env.backend.received()] == ["/echo?after"]

