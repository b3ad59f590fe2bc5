"""SIGHUP reload: generations swap under load without a failed request or a
dropped connection; an invalid file keeps the old generation serving."""

import collections
import threading
import time

from helpers import (ResponseReader, api, backend, connect, connection_refused, free_port,
                     gateway, request, wait_until)

RELOADS = 20
LOAD_THREADS = 4


def configs(port, a_port, b_port, i):
    """The i-th config of the reload series: every one keeps /t/echo routed
    to live backends, but each changes something real."""
    eps = [a_port] if i % 3 == 0 else [a_port, b_port]
    docs = [
        gateway(port, timeouts={"upstreamResponse": "%ds" % (5 + i % 4)}),
        backend("echo", eps, loadBalancing={"policy": ("round-robin", "least-request",
                                                       "random")[i % 3]}),
        api("t", "/t", "echo", retries={"attempts": i % 3}),
    ]
    for k in range(i % 5):
        docs.append(api("extra%d" % k, "/extra%d" % k, "echo",
                        operations=[{"method": "GET", "path": "/v%d/{id}" % i}]))
    return docs


class Load:
    def __init__(self, port, threads):
        self.port = port
        self.stop = threading.Event()
        self.statuses = collections.Counter()
        self.errors = []
        self.servers = collections.Counter()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(threads)]

    def run(self, i):
        try:
            s = connect(self.port)
            reader = ResponseReader(s)
        except OSError as e:
            self.errors.append("connect: %r" % e)
            return
        n = 0
        try:
            while not self.stop.is_set():
                n += 1
                body = b"x" * (n % 3 * 100) if n % 2 else None
                method = "POST" if body else "GET"
                try:
                    r = request(self.port, method, "/t/echo?t=%d&n=%d" % (i, n), body=body,
                                sock=s, reader=reader)
                except Exception as e:  # noqa: BLE001 - every failure counts
                    with self.lock:
                        self.errors.append("thread %d request %d: %r" % (i, n, e))
                    return
                with self.lock:
                    self.statuses[r.status] += 1
                    self.servers[r.header("X-Backend")] += 1
                if (r.header("Connection") or "").lower() == "close":
                    with self.lock:
                        self.errors.append("thread %d: server closed the connection during "
                                           "reloads (Connection: close)" % i)
                    return
        finally:
            s.close()

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(30)


def test_reload_under_load_zero_failures(backends, runtimes):
    a, b = backends("a"), backends("b")
    port = free_port()
    rt = runtimes(configs(port, a.port, b.port, 0))
    gen0 = rt.generation()
    with Load(port, LOAD_THREADS) as load:
        time.sleep(0.3)
        for i in range(1, RELOADS + 1):
            rt.reload(configs(port, a.port, b.port, i))
            time.sleep(0.1)
        time.sleep(0.3)
    assert not load.errors, load.errors[:5]
    total = sum(load.statuses.values())
    assert total > 200, "load too thin to prove anything: %d requests" % total
    assert set(load.statuses) == {200}, load.statuses
    assert rt.generation() >= gen0 + RELOADS
    assert load.servers["b"] > 0, "config with endpoint b never took effect"
    # Each extra Api of the last config is routed.
    last = RELOADS % 5
    for k in range(last):
        r = request(port, "GET", "/extra%d/v%d/1" % (k, RELOADS))
        assert r.status == 200, r
    # Old generations are freed once no request uses them.
    wait_until(lambda: rt.metric("sluice_generations_alive") == 1, 5,
               what="sluice_generations_alive to drop to 1 after the reloads")
    assert rt.metric("sluice_generation_swaps_total") >= RELOADS


def test_reload_changes_routing(backends, runtimes):
    a, b = backends("a"), backends("b")
    port = free_port()
    rt = runtimes([gateway(port), backend("echo", [a.port]), api("t", "/t", "echo")])
    assert request(port, "GET", "/t/echo").header("X-Backend") == "a"
    assert request(port, "GET", "/new/echo").status == 404
    # A keep-alive connection opened before the reload uses the new config.
    s = connect(port)
    reader = ResponseReader(s)
    try:
        assert request(port, "GET", "/t/echo", sock=s, reader=reader).header("X-Backend") == "a"
        rt.reload([gateway(port), backend("echo", [b.port]), api("t", "/t", "echo"),
                   api("new", "/new", "echo")])
        r = request(port, "GET", "/t/echo", sock=s, reader=reader)
        assert r.header("X-Backend") == "b", "same connection after reload: %r" % r
    finally:
        s.close()
    assert request(port, "GET", "/new/echo").status == 200
    gen = rt.generation()
    assert rt.admin_get("/ready")[0] == 200
    assert gen >= 2


def test_invalid_reload_keeps_old_config(backends, runtimes):
    a = backends("a")
    port = free_port()
    good = [gateway(port), backend("echo", [a.port]), api("t", "/t", "echo")]
    rt = runtimes(good)
    with Load(port, 2) as load:
        time.sleep(0.2)
        bad = [gateway(port), backend("echo", [a.port]),
               api("t", "/t", "echo", operations=[{"method": "GET", "path": "/x/{id"}])]
        rt.reload_invalid(bad)
        rt.reload_invalid("this: [is not yaml\n")
        rt.reload_invalid([gateway(port), api("t", "/t", "missing")])
        time.sleep(0.2)
    assert not load.errors, load.errors[:5]
    assert set(load.statuses) == {200}, load.statuses
    log = rt.log()
    assert "unbalanced '{'" in log, "the reload error must be logged with its message"
    assert "[error]" in log or "[warn]" in log
    assert request(port, "GET", "/t/echo").status == 200
    assert rt.admin_get("/ready")[0] == 200
    # A valid file afterwards is picked up again.
    rt.reload(good + [api("later", "/later", "echo")])
    assert request(port, "GET", "/later/anything").status == 200


def test_reload_adds_and_removes_listener(backends, runtimes):
    a = backends("a")
    p1, p2 = free_port(), free_port()
    g = gateway(p1)
    rt = runtimes([g, backend("echo", [a.port]), api("t", "/t", "echo")])
    g2 = gateway(p1)
    g2["spec"]["listeners"].append({"name": "second", "port": p2, "protocol": "http",
                                    "address": "127.0.0.1"})
    s = connect(p1)
    reader = ResponseReader(s)
    try:
        assert request(p1, "GET", "/t/echo", sock=s, reader=reader).status == 200
        rt.reload([g2, backend("echo", [a.port]), api("t", "/t", "echo")])
        assert request(p2, "GET", "/t/echo").status == 200
        # The first listener's open connection was not touched.
        assert request(p1, "GET", "/t/echo", sock=s, reader=reader).status == 200
        rt.reload([gateway(p2), backend("echo", [a.port]), api("t", "/t", "echo")])
        assert request(p2, "GET", "/t/echo").status == 200
        wait_until(lambda: connection_refused(p1), 5,
                   what="removed listener %d to stop accepting" % p1)
    finally:
        s.close()


def test_idle_workers_release_old_generations(backends, runtimes):
    """Every worker served a request on the first generation, then the
    config changes three times with no traffic at all: idle workers drop
    their holds on retired generations at their once-a-second tick, so only
    the current one stays alive (generation.h, "Worker holds")."""
    b = backends("a")
    port = free_port()
    docs = [gateway(port), backend("echo", [b.port]), api("t", "/t", "echo")]
    rt = runtimes(docs, workers=4)
    # Enough connections that every worker (SO_REUSEPORT) takes some.
    for _ in range(64):
        assert request(port, "GET", "/t/echo").status == 200
    for i in range(3):
        rt.reload(docs + [api("v%d" % i, "/v%d" % i, "echo")])
    wait_until(lambda: rt.metric("sluice_generations_alive") == 1, 5,
               what=lambda: "sluice_generations_alive == 1 (is %r)"
               % rt.metric("sluice_generations_alive"))
