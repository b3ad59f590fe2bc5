"""Per-listener HTTP/2 limits (the Gateway's `http2:` block on an h2c
listener, docs/configuration.md "Listener HTTP/2") against a real
sluice-runtime: each limit set lower than the codec's default is what the
runtime advertises in its SETTINGS and what it enforces, and a reload
(SIGHUP) applies new values to new connections while an established
connection keeps the ones it started with.

Each test would pass with the codec's defaults only if the block were
applied: with the defaults (100 streams, 64 KiB header lists, 200 resets per
10 s) every request below is served. The raw client and frame helpers are
test_http2_attacks.py's.
"""

import socket

import pytest

from helpers import api, backend, free_port, gateway
from test_http2_attacks import (CANCEL, DATA, ENHANCE_YOUR_CALM, F_END_STREAM, REFUSED_STREAM,
                                S_MAX_CONCURRENT_STREAMS, S_MAX_HEADER_LIST_SIZE, Raw,
                                assert_goaway_and_close, frame, header_frames, request_fields,
                                rst_frame, stateless_block)


class Env:
    def __init__(self, rt, port, origin, docs_for):
        self.rt, self.port, self.origin, self.docs_for = rt, port, origin, docs_for


@pytest.fixture
def h2limits(backends, runtimes):
    """Factory: make(http2) -> a one-worker runtime with an h2c listener
    whose `http2` block is `http2` (None: no block); Api "t" -> an origin
    that answers, Api "h" -> a socket that never accepts (streams to it stay
    open at no cost). env.docs_for(http2) gives the same config with another
    block, for reloads."""
    holes = []

    def make(http2):
        origin = backends("echo")
        hole = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        hole.bind(("127.0.0.1", 0))
        hole.listen(4096)
        holes.append(hole)
        port = free_port()

        def docs_for(block, protocol="h2c"):
            gw = gateway(port)
            listener = gw["spec"]["listeners"][0]
            listener["protocol"] = protocol
            if block is not None:
                listener["http2"] = block
            return [gw, backend("echo", [origin.port]), api("t", "/t", "echo"),
                    backend("hole", [hole.getsockname()[1]]), api("h", "/h", "hole")]

        rt = runtimes(docs_for(http2), workers=1)
        return Env(rt, port, origin, docs_for)

    yield make
    for h in holes:
        h.close()


def uploads(first_sid, n, prefix="/h"):
    """n POSTs that wait for a body that never comes: n open streams."""
    head = stateless_block(request_fields(prefix + "/echo", "POST", [("content-length", "1")]))
    return head, b"".join(header_frames(first_sid + 2 * i, head, end_stream=False)
                          for i in range(n))


def assert_stream_limit(port, limit, conn=None):
    """On a connection that has not ACKed our SETTINGS (so that a stream
    over the limit is refused, not a connection error): SETTINGS advertise
    `limit`, `limit` streams open, the next one gets REFUSED_STREAM."""
    c = conn or Raw(port, auto_ack=False)
    assert c.server_settings.get(S_MAX_CONCURRENT_STREAMS) == limit, c.summary()
    head, opened = uploads(1, limit, "/t")
    over = 1 + 2 * limit
    c.send(opened + header_frames(over, head, end_stream=False))
    c.read_until(lambda: over in c.rst or c.closed, what="stream %d's fate" % over)
    assert c.rst.get(over) == REFUSED_STREAM and c.goaway is None, c.summary()
    # The streams within the limit are served.
    last = over - 2
    c.send(frame(DATA, F_END_STREAM, last, b"x"))
    c.read_until(lambda: last in c.ended, what="stream %d" % last)
    assert c.status[last] == 200 and last not in c.rst, c.summary()
    c.close()


def test_max_concurrent_streams_is_advertised_and_the_sixth_stream_refused(h2limits):
    """Proves: maxConcurrentStreams: 5 is SETTINGS_MAX_CONCURRENT_STREAMS 5,
    and a 6th concurrent stream gets RST_STREAM REFUSED_STREAM while the
    five are served."""
    env = h2limits({"maxConcurrentStreams": 5})
    assert_stream_limit(env.port, 5)


def test_max_header_list_bytes_turns_a_request_into_431(h2limits):
    """Proves: maxHeaderListBytes: 4096 is advertised, a request whose
    header list is over it gets 431 without reaching the origin, and the
    connection goes on (a smaller request on it is served)."""
    env = h2limits({"maxHeaderListBytes": 4096})
    c = Raw(env.port)
    assert c.server_settings.get(S_MAX_HEADER_LIST_SIZE) == 4096, c.summary()
    big = stateless_block(request_fields(extra=[("x-big", "a" * 5000)]))
    ok = stateless_block(request_fields(extra=[("x-big", "a" * 3000)]))
    c.send(header_frames(1, big) + header_frames(3, ok))
    c.read_until(lambda: {1, 3} <= c.ended, what="both answers")
    assert c.status[1] == 431 and c.status[3] == 200 and c.goaway is None, c.summary()
    assert env.origin.count("/echo") == 1, "the 431 request reached the origin"
    c.close()


def test_max_reset_streams_per_window_cuts_rapid_reset_sooner(h2limits):
    """Proves: maxResetStreamsPerWindow: 20 makes a rapid-reset client
    (HEADERS then RST_STREAM, CVE-2023-44487) get GOAWAY ENHANCE_YOUR_CALM
    after about 20 streams instead of the default 200, and a client that
    resets fewer is left alone."""
    env = h2limits({"maxResetStreamsPerWindow": 20, "resetWindow": "10s"})
    block = stateless_block(request_fields("/h/x"))

    c = Raw(env.port)
    c.send(b"".join(header_frames(1 + 2 * i, block) + rst_frame(1 + 2 * i, CANCEL)
                    for i in range(15)))
    c.get(101)
    c.read_until(lambda: 101 in c.ended, what="a GET after 15 resets")
    assert c.status[101] == 200 and c.goaway is None, c.summary()
    c.close()

    a = Raw(env.port)
    a.send(b"".join(header_frames(1 + 2 * i, block) + rst_frame(1 + 2 * i, CANCEL)
                    for i in range(60)))
    assert_goaway_and_close(a, ENHANCE_YOUR_CALM, what="60 rapid resets")
    # Cut off at the limit, not after the burst (the default would take all 60).
    assert a.goaway[1] <= 2 * (20 + 5), a.summary()
    a.close()


def test_sighup_applies_new_limits_to_new_connections_only(h2limits):
    """Proves: a reload that changes maxConcurrentStreams (5 -> 7) applies
    to connections opened after it, while a connection opened before keeps
    its 5; removing the block brings back the codec's default (100); and an
    http2 block on an http listener is refused by a reload, with the field
    named, and the running config stays."""
    env = h2limits({"maxConcurrentStreams": 5})
    before = Raw(env.port, auto_ack=False)
    assert before.server_settings.get(S_MAX_CONCURRENT_STREAMS) == 5

    env.rt.reload(env.docs_for({"maxConcurrentStreams": 7}))
    assert_stream_limit(env.port, 7)
    assert_stream_limit(env.port, 5, conn=before)

    env.rt.reload(env.docs_for(None))
    c = Raw(env.port)
    assert c.server_settings.get(S_MAX_CONCURRENT_STREAMS) == 100, c.summary()
    c.close()

    env.rt.reload_invalid(env.docs_for({"maxConcurrentStreams": 5}, protocol="http"))
    env.rt.wait_log(r"spec\.listeners\[0\]\.http2: http2 is only for protocol h2c or https")
    env.rt.reload_invalid(env.docs_for({"maxConcurrentStreams": 0}))
    env.rt.wait_log(r"spec\.listeners\[0\]\.http2\.maxConcurrentStreams: 0 is out of range "
                    r"1\.\.10000")
    c = Raw(env.port)
    assert c.server_settings.get(S_MAX_CONCURRENT_STREAMS) == 100, c.summary()
    c.close()
