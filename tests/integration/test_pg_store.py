"""Several controllers on one PostgreSQL store (issue 14, "Several
controllers, one store"): `sluice-controller --store postgres://...`.

The test starts its own PostgreSQL 15 (pg_env.py: Debian's binaries, as the
postgres user, in a temporary directory, on 127.0.0.1 and a free port) and
stops it at the end.

What is covered:
- the store API on PostgreSQL: the cmocka test tests/unit/controller/
  test_store_pg.c (the same cases as the SQLite store's test where they
  apply, plus two replicas, concurrent writers, concurrent migrations), run
  here against a database of this server;
- two controllers on that store, three runtimes (each in its own network
  namespace, controller_env.NetLab) that reach the controllers through
  HAProxy (TCP, the config stream) and are reached through HAProxy (HTTP,
  the traffic), keep-alive load through the runtimes the whole time:
  - config changes made on both replicas, alternately: both replicas
    compile the same versions (derived from the store's config
    resourceVersion) and every runtime ends on the same version and serves
    the last change, whichever replica it is connected to;
  - a watch on one replica sees a write made on the other;
  - kill -9 of the replica that serves most runtimes: they reconnect
    through HAProxy to the other one, which sends them nothing (they
    already run its version: responses_sent 0, pushes_total unchanged);
    the killed replica, restarted, derives the same version;
  - PostgreSQL stopped: writes on both replicas answer 503
    store_unavailable naming the store (REST JSON error; a Kubernetes
    Status on the kapi path), /readyz says why, the runtimes keep serving;
    PostgreSQL started again: writes resume and reach every runtime;
  - zero failed requests through the whole test.

Skipped (with the reason) only when the PostgreSQL binaries, root / network
namespaces or haproxy are missing. Run:
SLUICE_BUILD=build /usr/bin/python3 -m pytest -q tests/integration/test_pg_store.py
"""

import csv
import http.client
import io
import json
import os
import shutil
import socket
import subprocess
import threading
import time

import pytest

from backend import Backend
from controller_env import Controller, Load, ManagedRuntime, NetLab, netns_available, quickstart
from helpers import build_dir, free_port, http_request, wait_until
from pg_env import Postgres, pg_missing

NRUNTIMES = 3


def require():
    for reason in (pg_missing(), netns_available()):
        if reason:
            pytest.skip(reason)
    if shutil.which("haproxy") is None and not os.path.exists("/usr/sbin/haproxy"):
        pytest.skip("haproxy is not installed (make deps)")


# --- the store API ---------------------------------------------------------------

def test_store_api_on_postgres(tmp_path):
    reason = pg_missing()
    if reason:
        pytest.skip(reason)
    exe = os.path.join(build_dir(), "tests", "unit", "controller", "test_store_pg")
    assert os.path.exists(exe), "%s missing: build it (make)" % exe
    pg = Postgres(tmp_path).init()
    try:
        pg.sql("CREATE DATABASE unit OWNER sluice", db="postgres")
        env = dict(os.environ, SLUICE_TEST_PG_URL=pg.url("unit"))
        r = subprocess.run([exe], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=120)
        assert r.returncode == 0 and "PASSED" in r.stdout and "SKIPPED" not in r.stdout, \
            r.stdout[-4000:]
        assert "9 test(s)" in r.stdout, r.stdout[-2000:]
    finally:
        pg.close()


# --- HAProxy: the config stream (TCP) and the traffic (HTTP) ---------------------

class HAProxy:
    """One haproxy: frontend `streams` (TCP, on the lab's hub address, where
    the runtimes' --controller points) over the controllers' stream ports,
    and frontend `fe` (HTTP, 127.0.0.1) over the runtimes' listeners."""

    def __init__(self, workdir, hub, controllers, runtimes, listener_port):
        self.workdir = str(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.hub = hub
        self.port = free_port()
        self.stream_port = free_port()
        self.controllers = controllers
        self.runtimes = runtimes
        self.listener_port = listener_port
        self.cfg_path = os.path.join(self.workdir, "haproxy.cfg")
        self.sock_path = os.path.join(self.workdir, "admin.sock")
        self.log_path = os.path.join(self.workdir, "haproxy.log")
        self.proc = None

    def config(self):
        lines = [
            "global", "    maxconn 4096",
            "    stats socket %s mode 600 level admin" % self.sock_path,
            "defaults", "    timeout connect 2s", "    timeout client 1h", "    timeout server 1h",
            "    timeout check 1s", "    retries 3", "    option redispatch",
            "frontend streams", "    mode tcp", "    bind %s:%d" % (self.hub, self.stream_port),
            "    default_backend controllers",
            "backend controllers", "    mode tcp", "    balance roundrobin",
            "    default-server inter 200ms fall 2 rise 2",
        ]
        for i, c in enumerate(self.controllers):
            lines.append("    server c%d %s check" % (i, c.stream_addr))
        lines += [
            "frontend fe", "    mode http", "    bind 127.0.0.1:%d" % self.port,
            "    timeout client 30s", "    default_backend fleet",
            "backend fleet", "    mode http", "    balance roundrobin",
            "    timeout server 30s", "    option httpchk GET /ready",
            "    http-check expect status 200", "    http-reuse safe",
            "    default-server inter 200ms fall 2 rise 2",
        ]
        for rt in self.runtimes:
            lines.append("    server %s %s:%d check port %d" % (rt.node_id, rt.host,
                                                               self.listener_port, rt.admin_port))
        return "\n".join(lines) + "\n"

    def start(self):
        with open(self.cfg_path, "w") as f:
            f.write(self.config())
        exe = shutil.which("haproxy") or "/usr/sbin/haproxy"
        check = subprocess.run([exe, "-c", "-f", self.cfg_path], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        assert check.returncode == 0, "haproxy -c: %s\n%s" % (check.stdout, self.config())
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([exe, "-db", "-f", self.cfg_path], stdout=self._log,
                                     stderr=self._log, stdin=subprocess.DEVNULL)

        def up():
            assert self.proc.poll() is None, "haproxy exited: %s" % open(self.log_path).read()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                socket.create_connection((self.hub, self.stream_port), timeout=0.5).close()
                return True
            except OSError:
                return False
        wait_until(up, 10, what="haproxy listening")
        return self

    def states(self, backend):
        """server name -> status, as HAProxy's checks see them."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(self.sock_path)
        out = b""
        try:
            s.sendall(b"show stat\n")
            while True:
                piece = s.recv(65536)
                if not piece:
                    break
                out += piece
        finally:
            s.close()
        rows = csv.DictReader(io.StringIO(out.decode().lstrip("# ")))
        return {r["svname"]: r["status"] for r in rows
                if r["pxname"] == backend and r["svname"] not in ("BACKEND", "FRONTEND")}

    def wait_all_up(self, backend, timeout=15):
        wait_until(lambda: set(self.states(backend).values()) == {"UP"}, timeout,
                   what=lambda: "haproxy: every server of %s UP (%r)" % (
                       backend, self.states(backend)))

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self._log.close()
            self.proc = None


# --- helpers ---------------------------------------------------------------------

def extra_api(i, host_port):
    return {"apiVersion": "gateway.sluice.dev/v1alpha1", "kind": "Api",
            "metadata": {"name": "extra-%d" % i},
            "spec": {"basePath": "/extra-%d" % i, "backendRefs": [{"name": "echo"}],
                     "operations": [{"method": "GET", "path": "/x"}]}}


def own(ctl):
    """node id -> record of the runtimes this replica serves (/api/v1/runtimes
    lists those of every live replica, each with its `replica`)."""
    doc = ctl.ok("GET", "/api/v1/runtimes", expect=(200,))
    me = doc["view"]["replica"]
    return {r["node_id"]: r for r in doc["items"] if r["replica"] == me}


def connected(ctl):
    """node ids connected to this controller (none when it is down)."""
    try:
        return {n for n, r in own(ctl).items() if r["connected"]}
    except (OSError, AssertionError):
        return set()


def fleet_version(ctl):
    return ctl.status()["fleets"]["default"]["version"]


def converged(ctls, version=None):
    """Every runtime connected to one of ctls, each acknowledging the fleet
    version, the same on every replica; that version (or False)."""
    versions = {fleet_version(c) for c in ctls}
    if len(versions) != 1:
        return False
    v = versions.pop()
    if version is not None and v != version:
        return False
    n = 0
    for c in ctls:
        for r in own(c).values():
            if r["connected"]:
                if r["acked_version"] != v:
                    return False
                n += 1
    return v if n == NRUNTIMES else False


def pushes(ctl):
    return ctl.metric("sluice_controller_pushes_total")


def serves(rt, port, path):
    try:
        return rt.get(port, path, timeout=2)[0] == 200
    except OSError:
        return False


# --- the fleet on two replicas ---------------------------------------------------

def test_two_controllers_one_postgres(tmp_path):
    require()
    pg = lab = origin = lb = load = None
    ctls, rts = [], []
    problems = []
    try:
        pg = Postgres(tmp_path).init()
        lab = NetLab(NRUNTIMES)
        hub = lab.hub_ip
        origin = Backend(host=hub, name="echo").start()
        for i in range(2):
            ctls.append(Controller(tmp_path / ("c%d" % i), stream_host=hub,
                                   extra_args=["--store", pg.url()]).start())
        a, b = ctls
        port = free_port()
        for i in range(NRUNTIMES):
            rts.append(ManagedRuntime(tmp_path / ("rt-%d" % i), "%s:0" % hub, "rt-%d" % i,
                                      lab=lab, index=i))
        lb = HAProxy(tmp_path / "haproxy", hub, ctls, rts, port)
        for rt in rts:
            rt.controller_addr = "%s:%d" % (hub, lb.stream_port)
        lb.start()
        for rt in rts:
            rt.start(wait_ready=False)

        # A write on one replica reaches the runtimes of both.
        a.apply(quickstart(port, origin.port, backend_host=hub))
        v0 = wait_until(lambda: converged(ctls), 20, interval=0.05, what="fleet converged")
        for rt in rts:
            rt.wait_ready()
        lb.wait_all_up("fleet")
        assert connected(a) and connected(b), \
            "HAProxy should spread the runtimes over both replicas: %s / %s" % (
                connected(a), connected(b))

        load = Load([("127.0.0.1", lb.port)], "/petstore/v1/pets", keepalive=4, fresh=1,
                    pause_s=0.002).start()

        # A watch on b sees a write made on a.
        watch = http.client.HTTPConnection("127.0.0.1", b.rest_port, timeout=10)
        rv = b.ok("GET", "/apis/gateway.sluice.dev/v1alpha1/namespaces/default/apis",
                  expect=(200,))["metadata"]["resourceVersion"]
        watch.request("GET", "/apis/gateway.sluice.dev/v1alpha1/namespaces/default/apis"
                      "?watch=1&resourceVersion=%s" % rv)
        wresp = watch.getresponse()
        assert wresp.status == 200

        # Changes on both replicas, alternately, under load.
        writes = 6
        for i in range(writes):
            (a if i % 2 == 0 else b).put(extra_api(i, None))
            time.sleep(0.05)
        event = json.loads(wresp.readline())
        assert event["type"] == "ADDED" and event["object"]["metadata"]["name"] == "extra-0", event
        watch.close()
        v1 = wait_until(lambda: converged(ctls), 20, interval=0.05, what="fleet converged")
        assert v1 > v0
        # The version is the store's config resourceVersion: the last write's.
        last = b.get("Api", "extra-%d" % (writes - 1))
        assert v1 == int(last["metadata"]["resourceVersion"]), (v1, last["metadata"])
        for rt in rts:
            wait_until(lambda: serves(rt, port, "/extra-%d/x" % (writes - 1)), 10,
                       what="%s serves the last change" % rt.node_id)

        # kill -9 the replica that serves the most runtimes.
        victim = a if len(connected(a)) >= len(connected(b)) else b
        survivor = b if victim is a else a
        moved = connected(victim)
        assert moved
        before = pushes(survivor)
        victim.kill9()
        wait_until(lambda: connected(survivor) == {rt.node_id for rt in rts}, 20, interval=0.05,
                   what="every runtime reconnected to the surviving replica")
        assert wait_until(lambda: converged([survivor], v1), 10, interval=0.05,
                          what="fleet at %d on the survivor" % v1) == v1
        time.sleep(0.5)  # anything the survivor would push would be sent by now
        recs = own(survivor)
        for node in moved:
            assert recs[node]["responses_sent"] == 0, \
                "%s was re-pushed what it already ran: %r" % (node, recs[node])
        assert pushes(survivor) == before, "the survivor pushed during the failover"

        # The killed replica, restarted, derives the same version.
        victim.start()
        assert fleet_version(victim) == v1

        # One more change, on the survivor: every runtime gets it.
        survivor.put(extra_api(writes, None))
        v2 = wait_until(lambda: converged(ctls), 20, interval=0.05, what="fleet converged")
        assert v2 > v1
        for rt in rts:
            wait_until(lambda: serves(rt, port, "/extra-%d/x" % writes), 10,
                       what="%s serves the change made after the failover" % rt.node_id)

        # PostgreSQL stopped: writes 503 store_unavailable, runtimes serve.
        pg.stop("fast")
        for c in ctls:
            status, hdrs, doc = c.rest("PUT", "/api/v1/apis/extra-99", extra_api(99, None))
            assert status == 503, (status, doc)
            assert doc["error"]["code"] == "store_unavailable", doc
            assert "postgres://sluice@127.0.0.1:%d/sluice" % pg.port in doc["error"]["message"]
            status, _, doc = c.rest(
                "POST", "/apis/gateway.sluice.dev/v1alpha1/namespaces/default/apis",
                extra_api(98, None))
            assert status == 503 and doc["kind"] == "Status", (status, doc)
            assert doc["details"]["causes"][0]["reason"] == "store_unavailable", doc
            status, _, doc = c.rest("GET", "/readyz")
            assert status == 503 and "is unavailable" in doc["error"]["message"], doc
        ok_before = load.stats.ok
        time.sleep(1.0)
        assert load.stats.ok > ok_before, "the runtimes stopped serving while PostgreSQL is down"

        # Started again: writes resume (reconnection with backoff).
        pg.start()
        pg.wait_up()

        def written():
            status, _, doc = a.rest("PUT", "/api/v1/apis/extra-99", extra_api(99, None))
            assert status in (200, 201, 503), (status, doc)
            return status in (200, 201)
        wait_until(written, 20, interval=0.25, what="a write accepted after PostgreSQL is back")
        for c in ctls:
            wait_until(lambda: c.rest("GET", "/readyz")[0] == 200, 15,
                       what="/readyz 200 again")
        v3 = wait_until(lambda: converged(ctls), 20, interval=0.05, what="fleet converged")
        assert v3 > v2
        for rt in rts:
            wait_until(lambda: serves(rt, port, "/extra-99/x"), 10,
                       what="%s serves the write made after PostgreSQL came back" % rt.node_id)

        load.stop()
        load.assert_clean(min_ok=200)
        load = None
    finally:
        if load is not None:
            load.stop()
        for rt in rts:
            rt.stop()
            problems += ["%s: %s" % (rt.node_id, p) for p in rt.problems()]
        for c in ctls:
            c.stop()
            problems += c.problems()
        if lb is not None:
            lb.stop()
        if origin is not None:
            origin.stop()
        if lab is not None:
            lab.close()
        if pg is not None:
            pg.close()
    assert not problems, problems


# --- a server that stops answering ------------------------------------------------

class FreezableProxy:
    """TCP proxy to PostgreSQL. freeze(): every open connection is cut and
    new ones are accepted but never answered (what a controller sees of a
    server behind a dead network path); thaw(): forwarding again."""

    def __init__(self, target_port):
        self.target_port = target_port
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.frozen = False
        self.conns = []
        self.held = []
        self.lock = threading.Lock()
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _pipe(self, src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept(self):
        while not self.stopped:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            with self.lock:
                if self.frozen:
                    self.held.append(c)  # accepted, never answered
                    continue
                try:
                    u = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
                    u.settimeout(None)
                except OSError:
                    c.close()
                    continue
                self.conns += [c, u]
            threading.Thread(target=self._pipe, args=(c, u), daemon=True).start()
            threading.Thread(target=self._pipe, args=(u, c), daemon=True).start()

    def freeze(self):
        with self.lock:
            self.frozen = True
            for s in self.conns:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.conns = []

    def thaw(self):
        with self.lock:
            self.frozen = False
            for s in self.held:
                s.close()
            self.held = []

    def close(self):
        self.stopped = True
        self.freeze()
        self.thaw()
        self.lsock.close()


def test_unanswering_store_never_holds_the_loop(tmp_path):
    """Reconnection is non-blocking: while PostgreSQL accepts connections
    but never answers (each attempt waits connect_timeout, 2 s here), the
    controller's REST API keeps answering at once (503 store_unavailable for
    resources); when the server answers again, writes resume."""
    reason = pg_missing()
    if reason:
        pytest.skip(reason)
    pg = proxy = ctl = None
    try:
        pg = Postgres(tmp_path).init()
        proxy = FreezableProxy(pg.port)
        url = "postgres://sluice@127.0.0.1:%d/sluice?connect_timeout=2" % proxy.port
        ctl = Controller(tmp_path / "c", extra_args=["--store", url]).start()
        ctl.put(extra_api(1, None))
        proxy.freeze()
        worst = 0.0
        statuses = set()
        deadline = time.monotonic() + 7
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            status, _, doc = ctl.rest("GET", "/api/v1/apis/extra-1", timeout=10)
            worst = max(worst, time.monotonic() - t0)
            statuses.add(status)
            if status == 503:
                assert doc["error"]["code"] == "store_unavailable", doc
            time.sleep(0.05)
        assert 503 in statuses, statuses
        assert worst < 0.5, "a REST request waited %.2f s for the store's reconnection" % worst
        proxy.thaw()

        def written():
            status, _, doc = ctl.rest("PUT", "/api/v1/apis/extra-2", extra_api(2, None))
            return status in (200, 201)
        wait_until(written, 20, interval=0.25, what="a write accepted once the server answers")
        ctl.stop()
        assert not ctl.problems(), ctl.problems()
    finally:
        if ctl is not None:
            ctl.stop()
        if proxy is not None:
            proxy.close()
        if pg is not None:
            pg.close()
