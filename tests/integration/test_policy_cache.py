"""The cache policy (docs/policies/cache.md): a response cache for GET and
HEAD shared by the runtime's workers, over HTTP/1.1 and h2c (`proto`).
MISS then HIT with the stored body (the echo origin's body differs per
request, so a HIT with the first body was not fetched again), Age, TTL
from the config and from the origin's Cache-Control/Expires, what is
never stored (no-store, private, Set-Cookie, Vary outside the key), the
key (query parameters, headers, the consumer: one consumer never gets
another's response), HEAD from a GET entry, chunked origins, coalescing
(a hundred concurrent misses make one upstream request), the cache
surviving a reload, LRU eviction under maxBytes, metrics, validation."""

import hashlib
import json
import subprocess
import threading
import time
from email.utils import formatdate

import pytest

from helpers import (API_VERSION, api, assert_gateway_error, backend, free_port,
                     runtime_binary, wait_until)


def cache(**config):
    return {"name": "cache", "config": config}


def start(backends, runtimes, proto, policies, operations=None, workers=2, access_log="off",
          **api_kw):
    b = backends("echo")
    port = free_port()
    docs = [proto.gateway(port), backend("echo", [b.port]),
            api("t", "/t", "echo", operations=operations, policies=policies, **api_kw)]
    rt = runtimes(docs, workers=workers, access_log=access_log)
    return port, b, rt, docs


def get(proto, port, target, headers=None, method="GET"):
    return proto.request(port, method, target, headers=headers)


def test_miss_then_hit(backends, runtimes, proto, tmp_path):
    log = tmp_path / "access.log"
    port, b, rt, _ = start(backends, runtimes, proto, [cache(ttl="60s")], access_log=str(log))
    first = get(proto, port, "/t/item")
    assert first.status == 200 and first.header("X-Cache") == "MISS", first
    assert first.header("Age") is None
    time.sleep(1.1)
    hit = get(proto, port, "/t/item")
    assert hit.status == 200 and hit.header("X-Cache") == "HIT", hit
    assert hit.body == first.body  # the stored body, not a new echo
    assert int(hit.header("Age")) >= 1
    assert hit.header("Content-Type") == "application/json"
    assert hit.header("Content-Length") == str(len(first.body))
    assert hit.header("X-Request-Id") != first.header("X-Request-Id")
    assert b.count() == 1
    # Another path is another key.
    assert get(proto, port, "/t/other").header("X-Cache") == "MISS"
    assert b.count() == 2
    # Methods other than GET and HEAD are not the cache's.
    post = proto.request(port, "POST", "/t/item", body=b"x")
    assert post.status == 200 and post.header("X-Cache") is None
    assert b.count() == 3
    labels = {"result": "hit"}
    wait_until(lambda: rt.metric("sluice_cache_lookups_total", **labels) == 1, 5,
               what="one hit counted")
    assert rt.metric("sluice_cache_lookups_total", result="miss") == 2
    assert rt.metric("sluice_cache_entries", api="default/t") == 2
    assert rt.metric("sluice_cache_bytes") > len(first.body)
    # The access log says what the cache did; a hit has no upstream.
    wait_until(lambda: log.exists() and len(log.read_text().splitlines()) >= 4, 10,
               what="4 access log lines")
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert sorted((x["path"], x["cache"], x["upstream"] != "") for x in lines) == [
        ("/t/item", "", True), ("/t/item", "HIT", False), ("/t/item", "MISS", True),
        ("/t/other", "MISS", True)]


def test_head_served_from_get(backends, runtimes, proto):
    port, b, _, _ = start(backends, runtimes, proto, [cache()])
    first = get(proto, port, "/t/h")
    head = get(proto, port, "/t/h", method="HEAD")
    assert head.status == 200 and head.header("X-Cache") == "HIT", head
    assert head.body == b""
    assert head.header("Content-Length") == str(len(first.body))
    assert b.count() == 1
    # A HEAD miss goes to the origin as HEAD and stores nothing.
    assert get(proto, port, "/t/h2", method="HEAD").header("X-Cache") == "MISS"
    assert get(proto, port, "/t/h2").header("X-Cache") == "MISS"
    assert b.count() == 3


def test_ttl_expiry(backends, runtimes, proto):
    port, b, _, _ = start(backends, runtimes, proto, [cache(ttl="1s")])
    first = get(proto, port, "/t/e")
    assert get(proto, port, "/t/e").header("X-Cache") == "HIT"
    time.sleep(1.3)
    again = get(proto, port, "/t/e")
    assert again.header("X-Cache") == "EXPIRED", again
    assert again.body != first.body
    assert get(proto, port, "/t/e").header("X-Cache") == "HIT"
    assert b.count() == 2


ORIGIN_HEADERS = {
    "/max-age-1": [("Cache-Control", "public, max-age=1")],
    "/s-maxage": [("Cache-Control", "max-age=0, s-maxage=30")],
    "/no-store": [("Cache-Control", "no-store")],
    "/private": [("Cache-Control", "private, max-age=60")],
    "/no-cache": [("Cache-Control", "no-cache")],
    "/max-age-0": [("Cache-Control", "max-age=0")],
    "/cookie": [("Set-Cookie", "session=abc; HttpOnly")],
    "/vary-lang": [("Vary", "Accept-Language")],
    "/vary-star": [("Vary", "*")],
    "/vary-encoding": [("Vary", "Accept-Encoding")],
    "/age": [("Cache-Control", "max-age=100"), ("Age", "40")],
}


def origin_headers(record):
    if record["path"] == "/expired":
        return [("Expires", formatdate(time.time() - 10, usegmt=True))]
    if record["path"] == "/expires-2s":
        return [("Date", formatdate(time.time(), usegmt=True)),
                ("Expires", formatdate(time.time() + 2, usegmt=True))]
    return ORIGIN_HEADERS.get(record["path"], [])


def test_origin_cache_control(backends, runtimes, proto):
    port, b, _, _ = start(backends, runtimes, proto,
                          [cache(ttl="60s", keyHeaders=["Accept-Encoding"])])
    b.headers_for = origin_headers

    def twice(path, expect_second, headers=None):
        b.clear()
        r1 = get(proto, port, "/t" + path, headers)
        r2 = get(proto, port, "/t" + path, headers)
        assert r1.status == 200 and r1.header("X-Cache") == "MISS", (path, r1)
        assert r2.header("X-Cache") == expect_second, (path, r2)
        assert b.count() == (1 if expect_second == "HIT" else 2), path
        return r1, r2

    for path in ("/no-store", "/private", "/no-cache", "/max-age-0", "/cookie", "/vary-lang",
                 "/vary-star", "/expired"):
        twice(path, "MISS")
    # Set-Cookie is forwarded, never stored nor replayed.
    assert get(proto, port, "/t/cookie").header("Set-Cookie") == "session=abc; HttpOnly"
    twice("/vary-encoding", "HIT", {"Accept-Encoding": "gzip"})
    twice("/s-maxage", "HIT")
    _, hit = twice("/age", "HIT")
    assert int(hit.header("Age")) >= 40  # the origin's Age counts (RFC 9111 4.2.3)
    # max-age=1 beats the config's 60 s.
    twice("/max-age-1", "HIT")
    time.sleep(1.2)
    assert get(proto, port, "/t/max-age-1").header("X-Cache") == "EXPIRED"
    twice("/expires-2s", "HIT")


def test_respect_cache_control_off(backends, runtimes, proto):
    port, b, _, _ = start(backends, runtimes, proto,
                          [cache(ttl="60s", respectCacheControl=False)])
    b.headers_for = origin_headers
    get(proto, port, "/t/no-store")
    assert get(proto, port, "/t/no-store").header("X-Cache") == "HIT"
    # Set-Cookie still never is.
    get(proto, port, "/t/cookie")
    assert get(proto, port, "/t/cookie").header("X-Cache") == "MISS"


def test_request_directives(backends, runtimes, proto):
    port, b, _, _ = start(backends, runtimes, proto, [cache()])
    first = get(proto, port, "/t/r")
    # no-cache: a fresh response from the origin, which replaces the stored one.
    fresh = get(proto, port, "/t/r", {"Cache-Control": "no-cache"})
    assert fresh.header("X-Cache") == "MISS" and fresh.body != first.body
    hit = get(proto, port, "/t/r")
    assert hit.header("X-Cache") == "HIT" and hit.body == fresh.body
    # no-store: neither served from nor stored in the cache.
    ns = get(proto, port, "/t/ns", {"Cache-Control": "no-store"})
    assert ns.header("X-Cache") == "BYPASS"
    assert get(proto, port, "/t/ns").header("X-Cache") == "MISS"
    # Range, Cookie and credentials nobody verified bypass the cache.
    assert get(proto, port, "/t/r", {"Range": "bytes=0-3"}).header("X-Cache") == "BYPASS"
    assert get(proto, port, "/t/r", {"Cookie": "a=b"}).header("X-Cache") == "BYPASS"
    assert b.count() == 6


def test_authorization_without_consumer(backends, runtimes, proto):
    """No authentication policy: a request with Authorization is only
    answered from, and stored into, the cache for responses the origin
    marks shareable (RFC 9111 3.5)."""
    port, b, _, _ = start(backends, runtimes, proto, [cache()])
    b.headers_for = origin_headers
    auth = {"Authorization": "Bearer secret-of-alice"}
    get(proto, port, "/t/plain")  # stored from an anonymous request
    assert get(proto, port, "/t/plain", auth).header("X-Cache") != "HIT"
    r = get(proto, port, "/t/mine", auth)
    assert r.header("X-Cache") == "MISS"
    assert get(proto, port, "/t/mine").header("X-Cache") == "MISS"  # not stored
    get(proto, port, "/t/s-maxage", auth)
    assert get(proto, port, "/t/s-maxage", auth).header("X-Cache") == "HIT"


def test_key_query_and_headers(backends, runtimes, proto):
    port, b, _, _ = start(backends, runtimes, proto,
                          [cache(keyQuery=["page"], keyHeaders=["Accept-Language"])])
    a = get(proto, port, "/t/list?page=1&utm=a")
    assert a.header("X-Cache") == "MISS"
    same = get(proto, port, "/t/list?utm=b&page=1")
    assert same.header("X-Cache") == "HIT" and same.body == a.body
    assert get(proto, port, "/t/list?page=2").header("X-Cache") == "MISS"
    assert get(proto, port, "/t/list").header("X-Cache") == "MISS"
    en = get(proto, port, "/t/lang", {"Accept-Language": "en"})
    fr = get(proto, port, "/t/lang", {"Accept-Language": "fr"})
    assert en.header("X-Cache") == fr.header("X-Cache") == "MISS"
    assert get(proto, port, "/t/lang", {"Accept-Language": "fr"}).body == fr.body
    assert get(proto, port, "/t/lang", {"Accept-Language": "en"}).body == en.body
    assert b.count() == 5


def test_whole_query_by_default(backends, runtimes, proto):
    port, b, _, _ = start(backends, runtimes, proto, [cache()])
    get(proto, port, "/t/q?a=1&b=2")
    assert get(proto, port, "/t/q?a=1&b=2").header("X-Cache") == "HIT"
    assert get(proto, port, "/t/q?b=2&a=1").header("X-Cache") == "MISS"
    assert b.count() == 2


def sha(key):
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def consumer(name, key):
    return {"apiVersion": API_VERSION, "kind": "Consumer", "metadata": {"name": name},
            "spec": {"credentials": {"apiKeys": [{"name": "k", "keyHash": sha(key)}]}}}


def test_consumers_never_share(backends, runtimes, proto):
    """A private response cached for one consumer never answers another:
    the authenticated Consumer is part of the key."""
    b = backends("echo")
    port = free_port()
    runtimes([proto.gateway(port), backend("echo", [b.port]),
              consumer("alice", "key-alice"), consumer("bob", "key-bob"),
              api("t", "/t", "echo", policies=[
                  {"name": "api-key", "config": {"header": "X-Api-Key"}},
                  {"name": "headers", "config": {"request": {"set": {"X-Who": "${consumer}"}}}},
                  cache()])])

    def who(r):
        return dict((k.lower(), v) for k, v in r.json()["headers"])["x-who"]

    alice1 = get(proto, port, "/t/me", {"X-Api-Key": "key-alice"})
    bob1 = get(proto, port, "/t/me", {"X-Api-Key": "key-bob"})
    assert alice1.header("X-Cache") == bob1.header("X-Cache") == "MISS"
    assert who(alice1) == "default/alice" and who(bob1) == "default/bob"
    for _ in range(3):
        a = get(proto, port, "/t/me", {"X-Api-Key": "key-alice"})
        bb = get(proto, port, "/t/me", {"X-Api-Key": "key-bob"})
        assert a.header("X-Cache") == bb.header("X-Cache") == "HIT"
        assert who(a) == "default/alice" and a.body == alice1.body
        assert who(bb) == "default/bob" and bb.body == bob1.body
    # No key: the api-key policy answers before the cache (which never
    # serves an unauthenticated request).
    assert_gateway_error(get(proto, port, "/t/me"), 401)
    assert_gateway_error(get(proto, port, "/t/me", {"X-Api-Key": "wrong"}), 401)
    assert b.count() == 2


def test_chunked_origin_and_size_limit(backends, runtimes, proto):
    port, b, _, _ = start(backends, runtimes, proto, [cache(maxEntryBytes=150000)])
    first = get(proto, port, "/t/bytes/100000?chunked=1")
    assert first.status == 200 and len(first.body) == 100000
    hit = get(proto, port, "/t/bytes/100000?chunked=1")
    assert hit.header("X-Cache") == "HIT" and hit.body == first.body
    if not proto.h2:
        assert hit.header("Content-Length") == "100000"
        assert hit.header("Transfer-Encoding") is None
    # Over maxEntryBytes, by length or while streaming: never stored.
    for target in ("/t/bytes/200000", "/t/bytes/200000?chunked=1"):
        r1 = get(proto, port, target)
        r2 = get(proto, port, target)
        assert len(r1.body) == len(r2.body) == 200000
        assert r2.header("X-Cache") == "MISS"
    assert b.count() == 5


def test_coalescing(backends, runtimes, proto):
    """A hundred concurrent requests for a cold key make one upstream
    request; all get the same response (over both workers)."""
    port, b, rt, _ = start(backends, runtimes, proto, [cache()])
    results = [None] * 100
    barrier = threading.Barrier(100)

    def one(i):
        barrier.wait()
        results[i] = get(proto, port, "/t/delay/700")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(r is not None and r.status == 200 for r in results), results
    assert len({r.body for r in results}) == 1
    assert b.count("/delay/700") == 1
    statuses = sorted(r.header("X-Cache") for r in results)
    assert statuses.count("MISS") == 1, statuses
    assert rt.metric("sluice_cache_lookups_total", result="coalesced") >= 1


def test_coalesced_waiters_go_upstream_when_nothing_is_stored(backends, runtimes, proto):
    """The leader's response is not storable: the waiters do not hang, they
    go to the origin themselves."""
    port, b, _, _ = start(backends, runtimes, proto, [cache()])
    b.headers_for = lambda rec: [("Cache-Control", "no-store")]
    results = [None] * 10
    barrier = threading.Barrier(10)

    def one(i):
        barrier.wait()
        results[i] = get(proto, port, "/t/delay/300")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(10)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(r is not None and r.status == 200 for r in results), results
    assert time.monotonic() - started < 4
    assert b.count("/delay/300") == 10


def test_coalesce_timeout(backends, runtimes, proto):
    """A waiter never waits past coalesceTimeout: it goes upstream alone."""
    port, b, _, _ = start(backends, runtimes, proto, [cache(coalesceTimeout="200ms")])
    out = {}

    def slow():
        out["slow"] = get(proto, port, "/t/delay/1500")

    t = threading.Thread(target=slow)
    t.start()
    wait_until(lambda: b.count("/delay/1500") == 1, 5, what="the leader at the origin")
    started = time.monotonic()
    r = get(proto, port, "/t/delay/1500")
    t.join(10)
    assert r.status == 200 and out["slow"].status == 200
    assert b.count("/delay/1500") == 2
    assert time.monotonic() - started < 1.5 + 1.0


def test_survives_reload(backends, runtimes, proto):
    port, b, rt, docs = start(backends, runtimes, proto, [cache(ttl="60s")])
    first = get(proto, port, "/t/keep")
    assert first.header("X-Cache") == "MISS"
    # A new generation (another operation, another ttl): the entry stays.
    docs[2]["spec"]["policies"] = [cache(ttl="120s")]
    docs.append(api("u", "/u", "echo"))
    rt.reload(docs)
    hit = get(proto, port, "/t/keep")
    assert hit.header("X-Cache") == "HIT" and hit.body == first.body
    assert b.count() == 1
    # Without the cache policy the zone goes, and comes back empty.
    docs[2]["spec"]["policies"] = []
    rt.reload(docs)
    assert get(proto, port, "/t/keep").header("X-Cache") is None
    # ... once the last generation with it is freed (after its requests).
    wait_until(lambda: not any(n.startswith("sluice_cache_") for n, _, _ in rt.metrics()), 10,
               what="the cache zone freed with its last generation")
    docs[2]["spec"]["policies"] = [cache()]
    rt.reload(docs)
    assert get(proto, port, "/t/keep").header("X-Cache") == "MISS"


def test_lru_eviction(backends, runtimes, proto):
    max_bytes = 65536
    port, b, rt, _ = start(backends, runtimes, proto, [cache(maxBytes=max_bytes)])
    for i in range(12):
        r = get(proto, port, "/t/bytes/10000?n=%d" % i)
        assert r.header("X-Cache") == "MISS"
        assert rt.metric("sluice_cache_bytes") <= max_bytes
    assert rt.metric("sluice_cache_evictions_total") >= 5
    # The newest stayed; some of the oldest were evicted.
    assert get(proto, port, "/t/bytes/10000?n=11").header("X-Cache") == "HIT"
    states = [get(proto, port, "/t/bytes/10000?n=%d" % i).header("X-Cache") for i in range(6)]
    assert "MISS" in states, states
    assert rt.metric("sluice_cache_bytes") <= max_bytes


def test_validation():
    bad = [
        ({"ttl": "soon"}, "config.ttl"),
        ({"maxEntryBytes": 2000000, "maxBytes": 1000000}, "config.maxEntryBytes"),
        ({"statuses": [206]}, "config.statuses[0]"),
        ({"keyHeaders": ["Authorization"]}, "config.keyHeaders[0]"),
        ({"keyHeaders": ["bad header"]}, "config.keyHeaders[0]"),
        ({"ttll": "1s"}, "config.ttll"),
        ({"coalesce": False, "coalesceTimeout": "1s"}, "config.coalesceTimeout"),
    ]
    import tempfile
    import os
    from helpers import dump_docs, gateway
    for config, path in bad:
        with tempfile.TemporaryDirectory() as d:
            f = os.path.join(d, "c.yaml")
            with open(f, "w") as fh:
                fh.write(dump_docs([gateway(free_port()), backend("echo", [1]),
                                    api("t", "/t", "echo", policies=[cache(**config)])]))
            p = subprocess.run([runtime_binary(), "--config", f, "--check"],
                               capture_output=True, text=True, timeout=20)
            assert p.returncode != 0, config
            assert "spec.policies[0]." + path in p.stderr, (config, p.stderr)


def test_http2_origin(runtimes, proto):
    """Responses from an HTTP/2 Backend are captured too (with and without
    content-length); a hit has the payload with a Content-Length."""
    from test_upstream_h2 import H2Origin, body_of
    origin = H2Origin()
    try:
        port = free_port()
        runtimes([proto.gateway(port), backend("h2o", [origin.port], protocol="h2c"),
                  api("t", "/t", "h2o", policies=[cache()])])
        for path, n in (("/t/len/30000", 30000), ("/t/nolen/40000", 40000)):
            first = get(proto, port, path)
            assert first.status == 200 and first.body == body_of(n)
            assert first.header("X-Cache") == "MISS"
            hit = get(proto, port, path)
            assert hit.header("X-Cache") == "HIT" and hit.body == first.body, hit
            if not proto.h2:
                assert hit.header("Content-Length") == str(n)
        assert len(origin.requests) == 2
    finally:
        origin.close()


def test_large_hit_to_a_slow_reader(backends, runtimes, proto):
    """A hit larger than the socket and stream buffers is written with
    back-pressure (paused while the client does not read, resumed when it
    does), byte for byte."""
    port, b, _, _ = start(backends, runtimes, proto,
                          [cache(maxBytes=16 << 20, maxEntryBytes=8 << 20)])
    first = get(proto, port, "/t/bytes/6000000")
    assert len(first.body) == 6000000
    hit = proto.request(port, "GET", "/t/bytes/6000000", read_delay=0.5, timeout=30)
    assert hit.header("X-Cache") == "HIT"
    assert hit.body == first.body
    assert b.count() == 1
