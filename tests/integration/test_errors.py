"""Every error status the gateway generates, with its JSON body: 400 for
request smuggling vectors (and the connection closed), 413, 414, 431, 502,
503, 504.

Protocols: the limits (413, 414, 431) and upstream failures (502, 503, 504)
run over HTTP/1.1 and HTTP/2 (the `proto` fixture): they are decided on the
protocol-independent request. Over HTTP/2 an error ends one stream, never
the connection, so "the connection is closed" is asserted for HTTP/1.1 only.
HTTP/1.1-only: the smuggling and bad chunked-framing vectors, 501 for a
transfer coding, 505, a TLS hello on a plaintext port and 414 before the
request line ends -- all HTTP/1.1 wire framing (the HTTP/2 equivalents, a
malformed message, are in test_http2_attacks.py and the h2 cases at the end).
"""

import time

import pytest

from clients import H2Connection, H2Reset, Proto
from helpers import (ResponseReader, api, assert_gateway_error, backend, closed_port, connect,
                     free_port, is_closed, send_raw, wait_until)

# Each vector is a complete byte string that a lenient parser could frame
# differently from a strict one. All must get 400 and a closed connection,
# and none may produce a request at the backend.
SMUGGLING = {
    "cl_and_te": b"POST /t/echo HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nG",
    "te_and_cl": b"POST /t/echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
                 b"Content-Length: 6\r\n\r\n0\r\n\r\nG",
    "duplicate_cl": b"POST /t/echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n"
                    b"Content-Length: 5\r\n\r\nhello",
    "differing_cl": b"POST /t/echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n"
                    b"Content-Length: 6\r\n\r\nhello!",
    "cl_list": b"POST /t/echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\nhello",
    "cl_signed": b"POST /t/echo HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\nhello",
    "cl_hex": b"POST /t/echo HTTP/1.1\r\nHost: a\r\nContent-Length: 0x5\r\n\r\nhello",
    "cl_overflow": b"POST /t/echo HTTP/1.1\r\nHost: a\r\n"
                   b"Content-Length: 99999999999999999999999\r\n\r\nhello",
    "te_chunked_twice": b"POST /t/echo HTTP/1.1\r\nHost: a\r\n"
                        b"Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
    "te_chunked_not_last": b"POST /t/echo HTTP/1.1\r\nHost: a\r\n"
                           b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    "te_in_http10": b"POST /t/echo HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "obs_fold": b"GET /t/echo HTTP/1.1\r\nHost: a\r\nX-A: one\r\n two\r\n\r\n",
    "obs_fold_te": b"POST /t/echo HTTP/1.1\r\nHost: a\r\nX-A: one\r\n"
                   b" Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc",
    "space_before_colon": b"GET /t/echo HTTP/1.1\r\nHost : a\r\n\r\n",
    "space_before_colon_te": b"POST /t/echo HTTP/1.1\r\nHost: a\r\n"
                             b"Transfer-Encoding : chunked\r\nContent-Length: 3\r\n\r\nabc",
    "bare_lf": b"GET /t/echo HTTP/1.1\nHost: a\n\n",
    "bare_lf_in_header": b"GET /t/echo HTTP/1.1\r\nHost: a\nX-B: c\r\n\r\n",
    "bare_cr": b"GET /t/echo HTTP/1.1\r\nHost: a\rX-B: c\r\n\r\n",
    "nul_in_header": b"GET /t/echo HTTP/1.1\r\nHost: a\r\nX-B: a\x00b\r\n\r\n",
    "ctl_in_header_name": b"GET /t/echo HTTP/1.1\r\nHost: a\r\nX\x01B: c\r\n\r\n",
    "missing_host_11": b"GET /t/echo HTTP/1.1\r\n\r\n",
    "double_host": b"GET /t/echo HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "space_in_target": b"GET /t/ec ho HTTP/1.1\r\nHost: a\r\n\r\n",
    "double_space": b"GET  /t/echo HTTP/1.1\r\nHost: a\r\n\r\n",
    "empty_header_name": b"GET /t/echo HTTP/1.1\r\nHost: a\r\n: x\r\n\r\n",
}

# Vectors whose head is valid: the body framing is bad. The proxy may have
# started talking to the backend already, but the client must get 400 and
# a closed connection.
BAD_BODY = {
    "bad_chunk_size": b"POST /t/echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                      b"zz\r\nhello\r\n0\r\n\r\n",
    "chunk_size_overflow": b"POST /t/echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                           b"fffffffffffffffffffff\r\nhello\r\n0\r\n\r\n",
    "chunk_missing_crlf": b"POST /t/echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                          b"5\r\nhelloXX0\r\n\r\n",
    "chunk_size_negative": b"POST /t/echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                           b"-5\r\nhello\r\n0\r\n\r\n",
    "chunk_size_bare_lf": b"POST /t/echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                          b"5\nhello\r\n0\r\n\r\n",
}


@pytest.fixture
def env(simple):
    return simple()


@pytest.mark.parametrize("name", sorted(SMUGGLING))
def test_smuggling_vector_rejected(env, name):
    resp, closed = send_raw(env.port, SMUGGLING[name])
    assert_gateway_error(resp, 400)
    assert closed, "connection must be closed after a 400 for %s" % name
    time.sleep(0.05)
    assert env.backend.count() == 0, "%s reached the backend: %r" % (name, env.backend.received())


@pytest.mark.parametrize("name", sorted(BAD_BODY))
def test_bad_chunked_body_rejected(env, name):
    resp, closed = send_raw(env.port, BAD_BODY[name])
    assert_gateway_error(resp, 400)
    assert closed, "connection must be closed after a 400 for %s" % name
    time.sleep(0.1)
    assert all(r["body_length"] == 0 for r in env.backend.received()), \
        "a body with bad framing was delivered whole: %r" % env.backend.received()


def test_smuggled_second_request_never_reaches_backend(env):
    # A valid request followed by a CL+TE one on the same connection: the
    # first is answered, the second is refused and nothing after it runs.
    data = (b"GET /t/echo?first HTTP/1.1\r\nHost: a\r\n\r\n"
            b"POST /t/echo HTTP/1.1\r\nHost: a\r\nContent-Length: 44\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
            b"GET /t/echo?smuggled HTTP/1.1\r\nHost: a\r\n\r\n")
    s = connect(env.port)
    try:
        s.sendall(data)
        reader = ResponseReader(s)
        assert reader.read_response().status == 200
        assert_gateway_error(reader.read_response(), 400)
        assert is_closed(s, 3, reader)
    finally:
        s.close()
    assert [r["target"] for r in env.backend.received()] == ["/echo?first"]


def test_unknown_transfer_coding_is_501(env):
    resp, closed = send_raw(env.port, b"POST /t/echo HTTP/1.1\r\nHost: a\r\n"
                                      b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n")
    assert_gateway_error(resp, 501)
    assert closed


def test_unsupported_http_version_is_505(env):
    resp, closed = send_raw(env.port, b"GET /t/echo HTTP/2.0\r\nHost: a\r\n\r\n")
    assert_gateway_error(resp, 505)
    assert closed


def test_garbage_request_is_400(env):
    tls_client_hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64
    resp, closed = send_raw(env.port, tls_client_hello)
    assert_gateway_error(resp, 400)
    assert closed


# --- limits -------------------------------------------------------------------

def test_413_by_content_length(simple, proto):
    env = simple(api_kw={"maxRequestBodyBytes": 1000})
    r = proto.request(env.port, "POST", "/t/echo", body=b"x" * 1000)
    assert r.status == 200, "a body exactly at the limit passes: %r" % r
    c = proto.connection(env.port)
    try:
        assert_gateway_error(c.request("POST", "/t/echo", body=b"x" * 1001), 413)
        if not proto.h2:
            assert is_closed(c.sock, 5, c.reader)
    finally:
        c.close()
    assert env.backend.count() == 1


def test_413_by_chunked_body(simple, proto):
    """A body without a length (chunked; over HTTP/2 DATA frames without
    content-length) that grows past the limit."""
    env = simple(api_kw={"maxRequestBodyBytes": 1000})
    c = proto.connection(env.port)
    try:
        assert_gateway_error(c.request("POST", "/t/echo", chunks=[b"y" * 400] * 3), 413)
        if not proto.h2:
            assert is_closed(c.sock, 5, c.reader)
    finally:
        c.close()
    assert all(r["body_length"] <= 1000 for r in env.backend.received())


def test_413_per_operation_and_gateway(backends, runtimes, proto):
    b = backends()
    port = free_port()
    runtimes([
        proto.gateway(port, limits={"maxRequestBodyBytes": 5000}),
        backend("echo", [b.port]),
        api("t", "/t", "echo", operations=[
            {"name": "small", "method": "POST", "path": "/small", "maxRequestBodyBytes": 10},
            {"name": "big", "method": "POST", "path": "/big"},
        ]),
    ])
    assert proto.request(port, "POST", "/t/small", body=b"x" * 10).status == 200
    assert_gateway_error(proto.request(port, "POST", "/t/small", body=b"x" * 11), 413)
    assert proto.request(port, "POST", "/t/big", body=b"x" * 5000).status == 200
    assert_gateway_error(proto.request(port, "POST", "/t/big", body=b"x" * 5001), 413)


def test_414_request_line_too_long(simple, proto):
    """Over HTTP/2 the limit applies to the target (:path)."""
    env = simple(gw_kw={"limits": {"maxRequestLineBytes": 1024}})
    ok = "/t/echo?" + "a" * 900
    assert proto.request(env.port, "GET", ok).status == 200
    c = proto.connection(env.port)
    try:
        assert_gateway_error(c.request("GET", "/t/echo?" + "a" * 2000), 414)
        if not proto.h2:
            assert is_closed(c.sock, 5, c.reader)
    finally:
        c.close()
    assert env.backend.count() == 1


def test_414_before_the_line_ends(simple):
    # The runtime must not wait for a CRLF that never comes.
    env = simple(gw_kw={"limits": {"maxRequestLineBytes": 1024}})
    s = connect(env.port)
    try:
        s.sendall(b"GET /t/" + b"a" * 4000)
        r = ResponseReader(s).read_response()
        assert_gateway_error(r, 414)
    finally:
        s.close()


def _refused_and_closed_over_http1(proto, port, status, **req):
    c = proto.connection(port)
    try:
        assert_gateway_error(c.request("GET", "/t/echo", **req), status)
        if not proto.h2:
            assert is_closed(c.sock, 5, c.reader)
    finally:
        c.close()


def test_431_too_many_headers(simple, proto):
    env = simple(gw_kw={"limits": {"maxHeaderCount": 20}})
    _refused_and_closed_over_http1(proto, env.port, 431,
                                   headers=[("X-H%d" % i, "v") for i in range(40)])
    assert env.backend.count() == 0


def test_431_header_bytes(simple, proto):
    env = simple(gw_kw={"limits": {"maxHeaderBytes": 4096}})
    _refused_and_closed_over_http1(proto, env.port, 431, headers={"X-Big": "b" * 8000})
    assert proto.request(env.port, "GET", "/t/echo",
                         headers={"X-Small": "s" * 1000}).status == 200
    assert env.backend.count() == 1


# --- upstream failures -------------------------------------------------------------

def test_502_connect_refused(backends, runtimes, proto):
    port = free_port()
    runtimes([proto.gateway(port), backend("dead", [closed_port()]), api("t", "/t", "dead")])
    r = proto.request(port, "GET", "/t/echo")
    assert_gateway_error(r, 502)
    # The connection to the client survives an upstream failure.
    c = proto.connection(port)
    try:
        for _ in range(2):
            r = c.request("GET", "/t/echo")
            assert r.status in (502, 503), r
    finally:
        c.close()


def test_502_garbage_response(env, proto):
    r = proto.request(env.port, "GET", "/t/garbage")
    err = assert_gateway_error(r, 502)
    assert err["code"]
    assert proto.request(env.port, "GET", "/t/echo").status == 200


def test_502_upstream_closes_without_response(env, proto):
    r = proto.request(env.port, "GET", "/t/close")
    assert_gateway_error(r, 502)
    r = proto.request(env.port, "GET", "/t/reset")
    assert_gateway_error(r, 502)
    assert proto.request(env.port, "GET", "/t/echo").status == 200


def test_502_counted_in_metrics(backends, runtimes, proto):
    port = free_port()
    rt = runtimes([proto.gateway(port), backend("dead", [closed_port()]), api("t", "/t", "dead")])
    for _ in range(3):
        proto.request(port, "GET", "/t/x")
    assert rt.metric("sluice_upstream_errors_total", cluster="default/dead", kind="connect") >= 3


def test_503_no_healthy_endpoint(backends, runtimes, proto):
    b = backends()
    b.health_status = 503
    port = free_port()
    rt = runtimes([
        proto.gateway(port),
        backend("sick", [b.port], healthCheck={"path": "/health", "interval": "100ms",
                                               "timeout": "100ms", "unhealthyThreshold": 1,
                                               "healthyThreshold": 1}),
        api("t", "/t", "sick"),
    ])

    def refused():
        r = proto.request(port, "GET", "/t/echo")
        return r if r.status == 503 else None

    r = wait_until(refused, 5, what="503 once the only endpoint failed its health check")
    err = assert_gateway_error(r, 503)
    assert err["code"] == "no_healthy_upstream"
    assert rt.metric("sluice_upstream_errors_total", kind="no_healthy") >= 1


def test_504_upstream_response_timeout(simple, proto):
    env = simple(gw_kw={"timeouts": {"upstreamResponse": "300ms"}})
    t0 = time.monotonic()
    r = proto.request(env.port, "GET", "/t/delay/3000")
    took = time.monotonic() - t0
    assert_gateway_error(r, 504)
    assert took < 2.0, "504 after %.2fs, timeout was 300ms" % took
    assert proto.request(env.port, "GET", "/t/echo").status == 200


def test_504_operation_timeout_overrides(backends, runtimes, proto):
    """Precedence operation > Api > Gateway for upstreamResponse."""
    b = backends()
    port = free_port()
    runtimes([
        proto.gateway(port, timeouts={"upstreamResponse": "200ms"}),
        backend("echo", [b.port]),
        api("t", "/t", "echo", timeouts={"upstreamResponse": "3s"}, operations=[
            {"name": "fast", "method": "GET", "path": "/delay/{ms}",
             "headers": [{"name": "X-Fast", "value": "1"}],
             "timeouts": {"upstreamResponse": "200ms"}},
            {"name": "slow", "method": "GET", "path": "/delay/{ms}"},
        ]),
        api("g", "/g", "echo"),
    ])
    assert_gateway_error(proto.request(port, "GET", "/t/delay/1000", headers={"X-Fast": "1"}), 504)
    r = proto.request(port, "GET", "/t/delay/800")
    assert r.status == 200, "the Api's 3 s must override the Gateway's 200 ms: %r" % r
    assert_gateway_error(proto.request(port, "GET", "/g/delay/800"), 504)


def test_504_whole_request_timeout(simple, proto):
    env = simple(gw_kw={"timeouts": {"request": "500ms", "upstreamResponse": "10s"}})
    t0 = time.monotonic()
    r = proto.request(env.port, "GET", "/t/delay/3000")
    assert_gateway_error(r, 504)
    assert time.monotonic() - t0 < 2.5


# --- HTTP/2 counterparts of the framing cases ---------------------------------------

@pytest.mark.parametrize("announced,sent", [(10, 5), (5, 10)])
def test_h2_content_length_disagreeing_with_data_is_refused(simple, announced, sent):
    """HTTP/2 only (RFC 9113 8.1.1), the counterpart of the Content-Length
    smuggling vectors: a content-length the DATA frames do not match makes
    the request malformed: a stream error (or a 400), never a complete
    request at the origin; the connection serves the next stream."""
    h2c = Proto("h2c")
    env = simple(proto=h2c)
    c = H2Connection(h2c.port(env.port), validate_outbound=False)
    try:
        sid = c.start("POST", "/t/echo", [("content-length", str(announced))],
                      end_stream=False)
        c.send_data(sid, b"x" * sent, end_stream=True)
        try:
            r = c.response(sid)
            assert_gateway_error(r, 400)
        except H2Reset as e:
            assert e.kind == "RST_STREAM" and e.code == 1, \
                "expected RST_STREAM PROTOCOL_ERROR, got %s" % e
        assert c.request("GET", "/t/echo?after").status == 200
    finally:
        c.close()
    time.sleep(0.1)
    # The runtime may have begun forwarding (the head, with the announced
    # length) before the DATA disagreed; the origin must never get it whole.
    posts = [r for r in env.backend.received() if r["method"] == "POST"]
    assert all(r["body_length"] < announced for r in posts), \
        "the malformed request reached the origin complete: %r" % posts
