"""The request-size policy (docs/policies/request-size.md): a declared
Content-Length over maxBytes is 413 at once; a body without a declared
length (chunked; HTTP/2 DATA without content-length) is stopped while it
streams, and the origin never gets more than the limit. The lower of the
policy's limit and the route's maxRequestBodyBytes holds. Over HTTP/1.1
and h2c (`proto`)."""

from helpers import api, assert_gateway_error, backend, free_port, is_closed


def start(backends, runtimes, proto, max_bytes, **api_kw):
    b = backends("echo")
    port = free_port()
    runtimes([
        proto.gateway(port),
        backend("echo", [b.port]),
        api("t", "/t", "echo", operations=[
            {"name": "small", "method": "POST", "path": "/small",
             "policies": [{"name": "request-size", "config": {"maxBytes": 100}}]},
            {"name": "big", "method": "POST", "path": "/big"},
        ], policies=[{"name": "request-size", "config": {"maxBytes": max_bytes}}], **api_kw),
    ])
    return port, b


def test_by_content_length(backends, runtimes, proto):
    port, b = start(backends, runtimes, proto, 1000)
    assert proto.request(port, "POST", "/t/big", body=b"x" * 1000).status == 200
    c = proto.connection(port)
    try:
        err = assert_gateway_error(c.request("POST", "/t/big", body=b"x" * 1001), 413)
        assert err["code"] == "payload_too_large" and "1000" in err["message"]
        if not proto.h2:
            assert is_closed(c.sock, 5, c.reader)
    finally:
        c.close()
    # The operation's own config replaces the Api's.
    assert proto.request(port, "POST", "/t/small", body=b"x" * 100).status == 200
    assert_gateway_error(proto.request(port, "POST", "/t/small", body=b"x" * 101), 413)
    assert b.count() == 2


def test_while_streaming(backends, runtimes, proto):
    port, b = start(backends, runtimes, proto, 1000)
    ok = proto.request(port, "POST", "/t/big", chunks=[b"y" * 500, b"y" * 500])
    assert ok.status == 200, ok
    c = proto.connection(port)
    try:
        r = c.request("POST", "/t/big", chunks=[b"y" * 400] * 10)
        assert_gateway_error(r, 413)
        if not proto.h2:
            assert is_closed(c.sock, 5, c.reader)
    finally:
        c.close()
    assert_gateway_error(proto.request(port, "POST", "/t/small", chunks=[b"z" * 60] * 3), 413)
    got = [r["body_length"] for r in b.received()]
    assert got[0] == 1000
    assert all(n <= 1000 for n in got), got
    assert all(n <= 100 for r, n in zip(b.received(), got) if r["path"] == "/small"), got


def test_lower_limit_wins(backends, runtimes, proto):
    """The route's maxRequestBodyBytes (50) is below the policy's (1000)."""
    port, b = start(backends, runtimes, proto, 1000, maxRequestBodyBytes=50)
    assert_gateway_error(proto.request(port, "POST", "/t/big", body=b"x" * 51), 413)
    assert_gateway_error(proto.request(port, "POST", "/t/big", chunks=[b"x" * 30] * 2), 413)
    assert proto.request(port, "POST", "/t/big", chunks=[b"x" * 25] * 2).status == 200
    assert all(r["body_length"] <= 50 for r in b.received())
