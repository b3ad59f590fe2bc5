"""HTTP/1.1 conformance of the proxy path (issue 8): dead pooled upstream
connections, path normalisation, repeated Connection headers, 1xx, absolute
-form targets, HTTP/1.0 clients, 204 framing, empty queries, trailers, Date,
default retries.

The origin is raworigin.RawOrigin (exact bytes in, scripted bytes out, per
connection), the client side raw sockets: a client library would hide what
is tested here.  Workers = 1 wherever connection reuse matters, so that every
request goes through the same upstream pool.

Protocols: what is about the upstream HTTP/1.1 hop or the request's life
runs over HTTP/1.1 and HTTP/2 clients (the `proto` fixture): dead pooled
upstream connections (1), path normalisation (2), the origin's Connection
lines (3, response side), 204 framing (7), empty queries, Date (8) and
default retries (9). HTTP/1.1-only, as client-side HTTP/1.1 framing: the
client's Connection lines (an HTTP/2 client cannot send them), 1xx to
HTTP/1.x clients and Expect, absolute-form targets, HTTP/1.0 clients and
chunked trailers on the wire; their HTTP/2 counterparts (103 and trailers
reaching an HTTP/2 client, :authority over Host) are the *_h2_* tests.
"""

import email.utils
import re
import socket
import time
from datetime import datetime, timezone

import pytest

from clients import H2Connection, Proto
from helpers import (ResponseReader, api, assert_gateway_error, backend, connect, free_port,
                     gateway, metric_sum, request)
from raworigin import RawOrigin, chunked, response

CLUSTER = "default/origin"
NO_OUTLIER = {"consecutiveFailures": 0}


# --- fixtures and small helpers ---------------------------------------------

@pytest.fixture
def origins():
    """Factory: origins(script=None, default=None) -> a started RawOrigin."""
    started = []

    def make(script=None, default=None):
        o = RawOrigin(script, default).start()
        started.append(o)
        return o

    yield make
    errors = []
    for o in started:
        o.stop()
        errors += o.errors
    assert not errors, "the origin received malformed requests: %r" % errors


def start(runtimes, origin, apis=None, workers=1, proto=None):
    """A runtime with Backend "origin" -> `origin` and the given Apis
    (default: Api "t", base path /t, stripped); with proto, the Gateway has
    its h2c listener too. Returns (runtime, port)."""
    port = free_port()
    docs = [proto.gateway(port) if proto else gateway(port), backend("origin", [origin.port], outlierDetection=NO_OUTLIER)]
    docs += apis if apis is not None else [api("t", "/t", "origin")]
    return runtimes(docs, workers=workers), port


def exchange(port, data, timeout=5.0):
    """Sends raw bytes on a fresh connection and returns every byte the
    gateway sends until it closes. Fails (rather than hangs) when it does not
    close within `timeout`."""
    s = connect(port, timeout=timeout)
    try:
        s.sendall(data)
        out = bytearray()
        deadline = time.monotonic() + timeout
        while True:
            s.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                d = s.recv(65536)
            except socket.timeout:
                raise AssertionError("the gateway did not close the connection within %.1fs; "
                                     "got %r" % (timeout, bytes(out[:1000])))
            except ConnectionResetError:
                break
            if not d:
                break
            out += d
        return bytes(out)
    finally:
        s.close()


def split_head(raw):
    """(status line, [(name, value)], rest) of the first response in raw."""
    i = raw.find(b"\r\n\r\n")
    assert i >= 0, "no complete response head in %r" % raw[:500]
    lines = raw[:i].decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers.append((k, v.strip()))
    return lines[0], headers, raw[i + 4:]


def values(headers, name):
    return [v for k, v in headers if k.lower() == name.lower()]


def decode_chunked(raw):
    """(body, trailer fields, bytes after) of a chunked body."""
    body = bytearray()
    pos = 0
    while True:
        eol = raw.index(b"\r\n", pos)
        size = int(raw[pos:eol].split(b";")[0], 16)
        pos = eol + 2
        if size == 0:
            break
        body += raw[pos:pos + size]
        assert raw[pos + size:pos + size + 2] == b"\r\n", "missing CRLF after a chunk: %r" % raw
        pos += size + 2
    trailers = []
    while True:
        eol = raw.index(b"\r\n", pos)
        line = raw[pos:eol].decode("latin-1")
        pos = eol + 2
        if line == "":
            break
        k, _, v = line.partition(":")
        trailers.append((k, v.strip()))
    return bytes(body), trailers, raw[pos:]


def answer_tagged(req):
    """A keep-alive 200 whose body says which request it answers."""
    return response(200, b"seq=%d" % req.seq)


# --- 1. dead pooled upstream connections are never reused --------------------

def test_post_after_origin_fin_never_meets_dead_connection(origins, runtimes):
    # Every answer is a keep-alive response whose FIN travels in the same
    # segment: a pooled connection is dead by the time the next request comes.
    o = origins(lambda req: [("send_close", answer_tagged(req))])
    rt, port = start(runtimes, o)
    r = request(port, "GET", "/t/prime")
    assert r.status == 200, r
    outcomes = []
    for i, gap in enumerate([0] * 4 + [0.5] * 4):
        if gap:
            time.sleep(gap)
        try:
            r = request(port, "POST", "/t/post%d" % i, body=b"payload-%d" % i, timeout=5)
            outcomes.append((i, gap, r.status, r.body[:80]))
        except (EOFError, OSError) as e:
            outcomes.append((i, gap, "client error %r" % e, b""))
    bad = [x for x in outcomes if x[2] != 200]
    assert not bad, "POSTs after an origin FIN failed (%d/8): %r" % (len(bad), outcomes)
    posts = [q for q in o.received() if q.method == "POST"]
    assert len(posts) == 8, "each POST must reach the origin exactly once: %r" % posts
    reused = [q for q in posts if not q.new_connection]
    assert not reused, "POSTs sent on a connection the origin had closed: %r" % reused
    for q in posts:
        assert q.body.startswith(b"payload-"), q


def test_get_after_origin_fin_needs_no_retry_and_sees_no_reset(origins, runtimes):
    o = origins(lambda req: [("send_close", answer_tagged(req))])
    rt, port = start(runtimes, o)
    statuses = []
    for i in range(20):
        r = request(port, "GET", "/t/g%d" % i)
        statuses.append(r.status)
    assert statuses == [200] * 20, statuses
    got = o.received()
    assert len(got) == 20, "%d requests reached the origin for 20 GETs (retries)" % len(got)
    assert all(q.new_connection for q in got), \
        "GETs sent on connections the origin had closed: %r" % [q for q in got
                                                               if not q.new_connection]
    m = rt.metrics()
    retries = metric_sum(m, "sluice_upstream_retries_total", cluster=CLUSTER)
    resets = metric_sum(m, "sluice_upstream_errors_total", cluster=CLUSTER, kind="reset")
    assert (retries, resets) == (0, 0), \
        "dead pooled connections were used: retries=%d reset errors=%d" % (retries, resets)


@pytest.mark.parametrize("when", ["same_segment", "later"])
def test_bytes_after_complete_response_forbid_reuse(origins, runtimes, when):
    bad = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    if when == "same_segment":
        first = [bad + b"GARBAGE"]
    else:
        first = [bad, ("sleep", 0.05), b"GARBAGE"]

    def script(req):
        return first if req.seq % 2 == 0 else answer_tagged(req)

    o = origins(script)
    rt, port = start(runtimes, o)
    for i in range(3):
        r = request(port, "GET", "/t/first%d" % i)
        assert (r.status, r.body) == (200, b"ok"), r
        time.sleep(0.2)  # the garbage has arrived in every case
        r = request(port, "GET", "/t/second%d" % i)
        assert r.status == 200 and r.body.startswith(b"seq="), \
            "request after an origin sent bytes past its response: %r" % r
    got = o.received()
    seconds = [q for q in got if q.target.startswith("/second")]
    assert len(seconds) == 3, got
    assert all(q.new_connection for q in seconds), \
        "a connection with stray bytes was reused: %r" % seconds


def _second_request_closes(req):
    # The first request of a connection is answered (keep-alive); the
    # second is read and the connection closed without an answer.
    if req.index == 1:
        return None
    return answer_tagged(req)


def test_get_on_reused_connection_closed_without_answer_is_retried_and_counted(
        origins, runtimes, proto):
    o = origins(_second_request_closes)
    rt, port = start(runtimes, o, proto=proto)
    before = rt.metric("sluice_upstream_reuse_failures_total", cluster=CLUSTER)
    r = proto.request(port, "GET", "/t/a")
    assert r.status == 200, r
    r = proto.request(port, "GET", "/t/b")
    assert r.status == 200 and r.body.startswith(b"seq="), r
    bs = [q for q in o.received() if q.target == "/b"]
    assert [(q.conn_id, q.index) for q in bs] == [(1, 1), (2, 0)], \
        "expected /b first on the reused connection, then retried on a new one: %r" % bs
    after = rt.metric("sluice_upstream_reuse_failures_total", cluster=CLUSTER)
    assert after - before >= 1, \
        "sluice_upstream_reuse_failures_total{cluster=%r} did not count the failed reuse " \
        "(before %r, after %r)" % (CLUSTER, before, after)


def test_post_on_reused_connection_closed_without_answer_is_502_not_retried(origins, runtimes, proto):
    o = origins(_second_request_closes)
    rt, port = start(runtimes, o, proto=proto)
    r = proto.request(port, "GET", "/t/a")
    assert r.status == 200, r
    r = proto.request(port, "POST", "/t/b", body=b"once")
    posts = [q for q in o.received() if q.method == "POST"]
    assert [(q.conn_id, q.index) for q in posts] == [(1, 1)], \
        "the POST must reach the origin once, on the reused connection: %r" % posts
    assert_gateway_error(r, 502)


# --- 2. path normalisation before routing and forwarding ----------------------

def _path_apis():
    return [api("api", "/api", "origin", stripBasePath=False),
            api("strip", "/strip", "origin")]


@pytest.mark.parametrize("sent,forwarded", [
    ("/api/a/../b", "/api/b"),
    ("/api/%2e%2e/api/x", "/api/x"),
    ("/api/%7Euser", "/api/~user"),
])
def test_dot_segments_and_unreserved_escapes_normalised_before_forwarding(
        origins, runtimes, proto, sent, forwarded):
    o = origins(default=response(200, b"reached"))
    rt, port = start(runtimes, o, _path_apis(), proto=proto)
    r = proto.request(port, "GET", sent)
    got = [q.target for q in o.received()]
    assert (r.status, got) == (200, [forwarded]), \
        "GET %s: status %d, origin saw %r (expected %r)" % (sent, r.status, got, forwarded)


@pytest.mark.parametrize("sent", ["/api/../secret", "/strip/../../etc"])
def test_dot_segments_cannot_escape_the_base_path(origins, runtimes, proto, sent):
    o = origins(default=response(200, b"reached"))
    rt, port = start(runtimes, o, _path_apis(), proto=proto)
    r = proto.request(port, "GET", sent)
    got = [q.target for q in o.received()]
    assert not got, "GET %s reached the origin as %r" % (sent, got)
    err = assert_gateway_error(r, 404)
    assert err["code"] == "no_route", err


def test_invalid_percent_escape_is_400(origins, runtimes, proto):
    o = origins(default=response(200, b"reached"))
    rt, port = start(runtimes, o, _path_apis(), proto=proto)
    r = proto.request(port, "GET", "/api/x%zz")
    got = [q.target for q in o.received()]
    assert not got, "GET /api/x%%zz reached the origin as %r" % got
    assert_gateway_error(r, 400)


@pytest.mark.parametrize("setting,sent,expect", [
    (None, "/api/a%2Fb", 400),                        # default: reject
    (None, "/api/a%5cb", 400),
    (None, "/api/a\\b", 400),
    ({"encodedSlashes": "keep"}, "/api/a%2fb/../c", "/api/c"),
    ({"encodedSlashes": "keep"}, "/api/a%2fb", "/api/a%2Fb"),
    ({"encodedSlashes": "decode"}, "/api/x/a%2F..%2Fb", "/api/x/b"),
    ({"mergeSlashes": True}, "/api//x///y", "/api/x/y"),
    (None, "/api//x", "/api//x"),                     # default: slashes kept
])
def test_encoded_slashes_and_merging_follow_the_gateway_setting(origins, runtimes, proto, setting, sent,
                                                                expect):
    o = origins(default=response(200, b"reached"))
    port = free_port()
    gw = proto.gateway(port)
    if setting is not None:
        gw["spec"]["pathNormalization"] = setting
    runtimes([gw, backend("origin", [o.port], outlierDetection=NO_OUTLIER)] + _path_apis(),
             workers=1)
    r = proto.request(port, "GET", sent)
    got = [q.target for q in o.received()]
    if expect == 400:
        assert not got, "GET %s reached the origin as %r" % (sent, got)
        err = assert_gateway_error(r, 400)
        assert err["code"] == "bad_path", err
    else:
        assert (r.status, got) == (200, [expect]), (sent, r.status, got)


# --- 3. every Connection header line is honoured -------------------------------

def test_second_connection_request_header_line_is_honoured(origins, runtimes):
    o = origins(default=response(200, b"ok"))
    rt, port = start(runtimes, o)
    r = request(port, "GET", "/t/x", headers=[
        ("Connection", "keep-alive"), ("Connection", "X-Secret"), ("X-Secret", "1"),
        ("X-Kept", "k")])
    assert r.status == 200, r
    q = o.received()[-1]
    assert q.header_all("X-Secret") == [], "X-Secret forwarded: %r" % q.raw
    assert all("x-secret" not in v.lower() for v in q.header_all("Connection")), q.raw
    assert q.header_all("X-Kept") == ["k"], q.raw


def test_second_connection_response_header_line_is_honoured(origins, runtimes, proto):
    o = origins(default=response(200, b"ok", headers=[
        ("Connection", "keep-alive"), ("Connection", "X-Up"), ("X-Up", "1"),
        ("X-Resp-Kept", "k")]))
    rt, port = start(runtimes, o, proto=proto)
    r = proto.request(port, "GET", "/t/x")
    assert r.status == 200, r
    assert r.header_all("X-Up") == [], "X-Up reached the client: %r" % r.headers
    assert all("x-up" not in v.lower() for v in r.header_all("Connection")), r.headers
    assert r.header_all("X-Resp-Kept") == ["k"], r.headers


# --- 4. 1xx --------------------------------------------------------------------

EARLY_HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"


def test_103_early_hints_reach_http11_client_before_final_response(origins, runtimes):
    o = origins(default=[EARLY_HINTS, ("sleep", 0.05), response(200, b"final")])
    rt, port = start(runtimes, o)
    raw = exchange(port, b"GET /t/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    status, headers, rest = split_head(raw)
    assert status.startswith("HTTP/1.1 103"), \
        "the first thing the client got is not the 103: %r" % raw[:400]
    assert values(headers, "Link") == ["</style.css>; rel=preload"], raw[:400]
    status2, headers2, body = split_head(rest)
    assert status2.startswith("HTTP/1.1 200"), raw[:600]
    assert body == b"final", raw[:600]


def test_103_early_hints_reach_h2_client_before_final_response(origins, runtimes):
    """HTTP/2 twin of the test above: the 103 is an interim HEADERS frame."""
    h2c = Proto("h2c")
    o = origins(default=[EARLY_HINTS, ("sleep", 0.05), response(200, b"final")])
    rt, port = start(runtimes, o, proto=h2c)
    r = h2c.request(port, "GET", "/t/x")
    assert [dict(h).get(":status") for h in r.interim] == ["103"], r.interim
    assert dict(r.interim[0]).get("link") == "</style.css>; rel=preload", r.interim
    assert (r.status, r.body) == (200, b"final"), r


def test_no_1xx_to_http10_client(origins, runtimes):
    o = origins(default=[EARLY_HINTS, ("sleep", 0.05), response(200, b"final")])
    rt, port = start(runtimes, o)
    raw = exchange(port, b"GET /t/x HTTP/1.0\r\nHost: a\r\n\r\n")
    assert o.count() == 1, "the origin never got the request: the test proves nothing"
    status, headers, body = split_head(raw)
    assert re.match(r"HTTP/1\.[01] 200 ", status), \
        "an HTTP/1.0 client got an interim response: %r" % raw[:400]
    assert b" 103 " not in raw and b"Link:" not in raw, raw[:400]
    assert body == b"final", raw[:400]


def test_origin_100_continue_not_forwarded_as_extra_interim_response(origins, runtimes):
    o = origins(default=[b"HTTP/1.1 100 Continue\r\n\r\n", ("sleep", 0.05),
                         response(200, b"final")])
    rt, port = start(runtimes, o)
    s = connect(port)
    try:
        s.sendall(b"POST /t/x HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n"
                  b"Expect: 100-continue\r\nConnection: close\r\n\r\n")
        rd = ResponseReader(s)
        first = rd.read_response(skip_1xx=False)
        assert first.status == 100, "the gateway did not answer Expect itself: %r" % first
        s.sendall(b"body")
        rest = bytes(rd.buf)
        s.settimeout(5)
        while True:
            d = s.recv(65536)
            if not d:
                break
            rest += d
    finally:
        s.close()
    assert o.count() == 1 and o.received()[0].body == b"body", o.received()
    status, headers, body = split_head(rest)
    assert status.startswith("HTTP/1.1 200"), \
        "after the gateway's own 100 Continue the client got %r" % rest[:400]
    assert b"100 Continue" not in rest, rest[:400]
    assert body == b"final"


# --- 5. absolute-form request targets -------------------------------------------

def _absolute_setup(origins, runtimes):
    ex = origins(default=response(200, b"example"))
    decoy = origins(default=response(200, b"decoy"))
    port = free_port()
    rt = runtimes([gateway(port),
                   backend("origin", [ex.port], outlierDetection=NO_OUTLIER),
                   backend("decoy", [decoy.port], outlierDetection=NO_OUTLIER),
                   api("ex", "/", "origin", hosts=["example.com"]),
                   api("other", "/", "decoy", hosts=["other.example"])], workers=1)
    return ex, decoy, port


def test_absolute_form_target_forwarded_in_origin_form_with_its_authority(origins, runtimes):
    ex, decoy, port = _absolute_setup(origins, runtimes)
    raw = exchange(port, b"GET http://example.com/p?x=1 HTTP/1.1\r\nHost: other.example\r\n"
                         b"Connection: close\r\n\r\n")
    status, headers, body = split_head(raw)
    assert status.startswith("HTTP/1.1 200"), raw[:400]
    assert decoy.count() == 0, "routed on the Host header, not the target's authority"
    assert body == b"example", raw[:400]
    q = ex.received()[0]
    assert q.raw.startswith(b"GET /p?x=1 HTTP/1.1\r\n"), q.raw[:200]
    assert q.header_all("Host") == ["example.com"], q.raw


def test_absolute_form_without_path_becomes_slash(origins, runtimes):
    ex, decoy, port = _absolute_setup(origins, runtimes)
    raw = exchange(port, b"GET http://example.com HTTP/1.1\r\nHost: example.com\r\n"
                         b"Connection: close\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 200"), raw[:400]
    q = ex.received()[0]
    assert q.raw.startswith(b"GET / HTTP/1.1\r\n"), q.raw[:200]
    assert q.header_all("Host") == ["example.com"], q.raw


@pytest.mark.parametrize("target", ["http://user@example.com/p", "ftp://example.com/p"])
def test_absolute_form_with_userinfo_or_other_scheme_is_400(origins, runtimes, target):
    ex, decoy, port = _absolute_setup(origins, runtimes)
    r = request(port, "GET", target, host="example.com")
    assert_gateway_error(r, 400)
    assert ex.count() == 0 and decoy.count() == 0


# --- 6. HTTP/1.0 clients --------------------------------------------------------

def test_http10_client_gets_http11_status_line_dechunked_body_and_close(origins, runtimes):
    o = origins(default=response(200, chunked(b"hello ", b"world"),
                                 headers=[("Transfer-Encoding", "chunked")]))
    rt, port = start(runtimes, o)
    raw = exchange(port, b"GET /t/x HTTP/1.0\r\nHost: a\r\n\r\n")  # fails unless closed
    status, headers, body = split_head(raw)
    assert status.startswith("HTTP/1.1 200"), "status line %r" % status
    assert values(headers, "Transfer-Encoding") == [], headers
    assert body == b"hello world", "body not de-chunked: %r" % body


def test_http10_keepalive_client_gets_http11_status_line_and_connection_kept(origins, runtimes):
    o = origins(default=response(200, b"kept"))
    rt, port = start(runtimes, o)
    s = connect(port)
    try:
        rd = ResponseReader(s)
        s.sendall(b"GET /t/x HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n")
        r = rd.read_response()
        assert r.version == "HTTP/1.1", "status line version %r" % r.version
        assert (r.status, r.body) == (200, b"kept"), r
        assert "close" not in (r.header("Connection") or "").lower(), r.headers
        s.sendall(b"GET /t/y HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n")
        r2 = rd.read_response()
        assert (r2.version, r2.status, r2.body) == ("HTTP/1.1", 200, b"kept"), r2
    finally:
        s.close()


def test_http10_client_without_keepalive_gets_http11_status_line_and_close(origins, runtimes):
    o = origins(default=response(200, b"body"))
    rt, port = start(runtimes, o)
    raw = exchange(port, b"GET /t/x HTTP/1.0\r\nHost: a\r\n\r\n")  # fails unless closed
    status, headers, body = split_head(raw)
    assert status.startswith("HTTP/1.1 200"), "status line %r" % status
    assert body == b"body"


# --- 7. 204 framing --------------------------------------------------------------

def test_204_from_origin_loses_content_length(origins, runtimes, proto):
    o = origins([b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"],
                default=response(200, b"next"))
    rt, port = start(runtimes, o, proto=proto)
    c = proto.connection(port)
    try:
        r = c.request("GET", "/t/nc")
        assert r.status == 204, r
        assert r.header_all("Content-Length") == [], "a 204 carried Content-Length: %r" % r.headers
        r2 = c.request("GET", "/t/next")
        assert (r2.status, r2.body) == (200, b"next"), "bytes after the 204: %r" % r2
    finally:
        c.close()


# --- 8. small ones ----------------------------------------------------------------

def test_empty_query_keeps_its_question_mark(origins, runtimes, proto):
    o = origins(default=response(200, b"ok"))
    rt, port = start(runtimes, o, [api("api", "/api", "origin", stripBasePath=False)],
                     proto=proto)
    r = proto.request(port, "GET", "/api/path?")
    assert r.status == 200, r
    assert [q.target for q in o.received()] == ["/api/path?"]


def test_trailer_header_and_trailer_fields_reach_client(origins, runtimes):
    o = origins(default=response(
        200, chunked(b"hello", trailers=[("X-Checksum", "abc123")]),
        headers=[("Transfer-Encoding", "chunked"), ("Trailer", "X-Checksum")]))
    rt, port = start(runtimes, o)
    raw = exchange(port, b"GET /t/x HTTP/1.1\r\nHost: a\r\nTE: trailers\r\n"
                         b"Connection: close\r\n\r\n")
    status, headers, rest = split_head(raw)
    assert status.startswith("HTTP/1.1 200"), raw[:400]
    assert values(headers, "Trailer") == ["X-Checksum"], "Trailer header: %r" % headers
    assert [v.lower() for v in values(headers, "Transfer-Encoding")] == ["chunked"], headers
    body, trailers, after = decode_chunked(rest)
    assert body == b"hello"
    assert values(trailers, "X-Checksum") == ["abc123"], "trailer fields: %r" % trailers


def test_trailer_fields_reach_h2_client(origins, runtimes):
    """HTTP/2 twin of the test above: the origin's chunked trailer fields
    arrive as a trailing HEADERS frame (RFC 9113 8.1)."""
    h2c = Proto("h2c")
    o = origins(default=response(
        200, chunked(b"hello", trailers=[("X-Checksum", "abc123")]),
        headers=[("Transfer-Encoding", "chunked"), ("Trailer", "X-Checksum")]))
    rt, port = start(runtimes, o, proto=h2c)
    r = h2c.request(port, "GET", "/t/x", headers={"TE": "trailers"})
    assert (r.status, r.body) == (200, b"hello"), r
    assert r.header("Transfer-Encoding") is None, r.headers
    assert dict(r.trailers or []).get("x-checksum") == "abc123", "trailers: %r" % r.trailers


def test_authority_wins_over_host_for_h2_client(origins, runtimes):
    """HTTP/2 counterpart of the absolute-form tests: :authority, not a Host
    field sent beside it, routes the request and is the origin's Host."""
    ex = origins(default=response(200, b"example"))
    decoy = origins(default=response(200, b"decoy"))
    h2c = Proto("h2c")
    port = free_port()
    runtimes([h2c.gateway(port),
              backend("origin", [ex.port], outlierDetection=NO_OUTLIER),
              backend("decoy", [decoy.port], outlierDetection=NO_OUTLIER),
              api("ex", "/", "origin", hosts=["example.com"]),
              api("other", "/", "decoy", hosts=["other.example"])], workers=1)
    # A differing Host beside :authority: clients must not send it (RFC 9113
    # 8.3.1); the runtime's rule is ":authority wins" (docs/security.md).
    c = H2Connection(h2c.port(port), validate_outbound=False)
    try:
        sid = c.start("GET", "/p?x=1", [("host", "other.example")], host="example.com",
                      keep_host_field=True)
        r = c.response(sid)
    finally:
        c.close()
    assert (r.status, r.body) == (200, b"example"), r
    assert decoy.count() == 0, "routed on the Host field, not :authority"
    q = ex.received()[0]
    assert q.raw.startswith(b"GET /p?x=1 HTTP/1.1\r\n"), q.raw[:200]
    assert q.header_all("Host") == ["example.com"], q.raw


IMF_FIXDATE = re.compile(r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d (Jan|Feb|Mar|Apr|May|Jun|Jul|"
                         r"Aug|Sep|Oct|Nov|Dec) \d{4} \d\d:\d\d:\d\d GMT$")


def test_date_added_when_origin_sends_none(origins, runtimes, proto):
    o = origins(default=response(200, b"ok"))
    rt, port = start(runtimes, o, proto=proto)
    r = proto.request(port, "GET", "/t/x")
    dates = r.header_all("Date")
    assert len(dates) == 1, "Date headers: %r" % r.headers
    assert IMF_FIXDATE.match(dates[0]), "not an IMF-fixdate: %r" % dates[0]
    when = email.utils.parsedate_to_datetime(dates[0])
    skew = abs((datetime.now(timezone.utc) - when).total_seconds())
    assert skew < 5, "Date %r is %.0fs off" % (dates[0], skew)


def test_origin_date_kept_unchanged(origins, runtimes, proto):
    origin_date = "Tue, 15 Nov 1994 08:12:31 GMT"
    o = origins(default=response(200, b"ok", headers=[("Date", origin_date)]))
    rt, port = start(runtimes, o, proto=proto)
    r = proto.request(port, "GET", "/t/x")
    assert r.header_all("Date") == [origin_date], r.headers


# --- 9. default retries --------------------------------------------------------------

def test_get_answered_503_is_not_retried_by_default(origins, runtimes, proto):
    o = origins(default=response(503, b"busy"))
    rt, port = start(runtimes, o, proto=proto)
    r = proto.request(port, "GET", "/t/x")
    assert (r.status, r.body) == (503, b"busy"), r
    time.sleep(0.1)
    assert o.count() == 1, "a GET answered 503 reached the origin %d times" % o.count()


def test_get_closed_without_response_on_fresh_connection_is_retried_once_by_default(
        origins, runtimes, proto):
    o = origins(lambda req: None if req.seq == 0 else answer_tagged(req))
    rt, port = start(runtimes, o, proto=proto)
    r = proto.request(port, "GET", "/t/x")
    assert (r.status, r.body) == (200, b"seq=1"), r
    got = o.received()
    assert [(q.target, q.new_connection) for q in got] == [("/x", True), ("/x", True)], got


def test_get_closed_without_response_is_retried_only_once_by_default(origins, runtimes, proto):
    o = origins(lambda req: None)
    rt, port = start(runtimes, o, proto=proto)
    r = proto.request(port, "GET", "/t/x")
    assert_gateway_error(r, 502)
    time.sleep(0.1)
    assert o.count() == 2, "a GET closed without response reached the origin %d times " \
                           "(default: 1 try + 1 retry)" % o.count()
