"""Several controllers on one PostgreSQL store agree on status and limits
(issue 14, "Several controllers, one store"): each replica records the
runtimes connected to it in the store (controller_runtimes, with a heartbeat
in controller_replicas) and status reads count the runtimes of every live
replica.

The test starts its own PostgreSQL 15 (pg_env.py) on 127.0.0.1 and a free
port, two controllers on it (--replica-timeout 4), and real runtimes on
loopback, each reaching its controller through a switchable TCP proxy (the
load balancer: after a kill -9 it sends the runtime to the other replica).

What is covered:
- both replicas report the same Programmed ("2 of 2 runtimes ... (runtimes
  of 2 live controller replicas)"), status.fleets, /api/v1/status fleets,
  and list both runtimes in /api/v1/runtimes, each with its `replica`;
- kill -9 of a replica: a runtime that reconnects to the other replica is
  listed and counted once while the killed replica's rows are still live;
  after --replica-timeout the killed replica's runtimes are gone from every
  view and its rows from the table; a restarted replica agrees;
- a store whose runtime tables cannot be read: status reads still answer,
  count this replica's runtimes only and say so; PostgreSQL stopped:
  /api/v1/status and /api/v1/runtimes answer 200 with scope this_replica;
- --max-routes is global: a write on one replica counts on the other.

Run: SLUICE_BUILD=build /usr/bin/python3 -m pytest -q tests/integration/test_pg_replicas.py
"""

import socket
import threading
import time

import pytest

from backend import Backend
from controller_env import Controller, ManagedRuntime, RestError
from helpers import wait_until
from pg_env import Postgres, pg_missing

TIMEOUT_S = 4


class SwitchProxy:
    """TCP forwarder to a target that can be changed; connections to a dead
    target end, and the runtime's reconnection reaches the new one."""

    def __init__(self, target_port):
        self.target_port = target_port
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.conns = []
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
            try:
                u = socket.create_connection(("127.0.0.1", self.target_port), timeout=2)
                u.settimeout(None)
            except OSError:
                c.close()
                continue
            with self.lock:
                self.conns += [c, u]
            threading.Thread(target=self._pipe, args=(c, u), daemon=True).start()
            threading.Thread(target=self._pipe, args=(u, c), daemon=True).start()

    def switch(self, target_port):
        with self.lock:
            self.target_port = target_port
            for s in self.conns:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.conns = []

    def close(self):
        self.stopped = True
        self.switch(0)
        self.lsock.close()


def api_doc(name, ops):
    return {"apiVersion": "gateway.sluice.dev/v1alpha1", "kind": "Api",
            "metadata": {"name": name},
            "spec": {"basePath": "/%s" % name, "backendRefs": [{"name": "echo"}],
                     "operations": [{"method": "GET", "path": "/op-%d" % i}
                                    for i in range(ops)]}}


def backend_doc(port):
    return {"apiVersion": "gateway.sluice.dev/v1alpha1", "kind": "Backend",
            "metadata": {"name": "echo"},
            "spec": {"endpoints": [{"address": "127.0.0.1", "port": port}]}}


def programmed(ctl, name="petstore"):
    st = ctl.get("Api", name).get("status") or {}
    cond = [c for c in st.get("conditions", []) if c["type"] == "Programmed"]
    return (cond[0] if cond else None), st.get("fleets")


def fleet_version(ctl):
    return ctl.status()["fleets"].get("default", {}).get("version")


def replica_of(ctl):
    return ctl.status()["runtimes_view"]["replica"]


def items(ctl):
    return ctl.ok("GET", "/api/v1/runtimes", expect=(200,))


def start_controller(tmp_path, name, pg, extra=()):
    return Controller(tmp_path / name, extra_args=["--store", pg.url(),
                                                   "--replica-timeout", str(TIMEOUT_S)]
                      + list(extra)).start()


def test_replicas_agree_on_status_and_runtimes(tmp_path):
    reason = pg_missing()
    if reason:
        pytest.skip(reason)
    pg = origin = None
    ctls, rts, proxies = [], [], []
    problems = []
    try:
        pg = Postgres(tmp_path).init()
        origin = Backend(name="echo").start()
        a = start_controller(tmp_path, "a", pg)
        b = start_controller(tmp_path, "b", pg)
        ctls += [a, b]
        a.put(backend_doc(origin.port))
        a.put(api_doc("petstore", 3))
        name_a, name_b = replica_of(a), replica_of(b)
        assert name_a != name_b

        # rt-a and rt-c on a, rt-b on b, each through its own proxy.
        for node, ctl in (("rt-a", a), ("rt-b", b), ("rt-c", a)):
            p = SwitchProxy(ctl.stream_port)
            proxies.append(p)
            rt = ManagedRuntime(tmp_path / node, "127.0.0.1:%d" % p.port, node)
            rts.append(rt)
            rt.start(wait_ready=False)
        pa, pb_, pc = proxies

        # Both replicas: 3 of 3, the same message, the same fleets.
        def agreed(n):
            try:
                conds = [programmed(c) for c in ctls]
            except RestError:
                return False  # the store is coming back
            if not all(c[0] for c in conds):
                return False  # a replica has not written the condition yet
            msgs = {c[0]["message"] for c in conds}
            if len(msgs) != 1 or conds[0][0]["status"] != "True":
                return False
            return "%d of %d runtimes" % (n, n) in msgs.pop() and conds
        conds = wait_until(lambda: agreed(3), 20, interval=0.1,
                           what="both replicas report 3 of 3 runtimes")
        cond, fleets = conds[0]
        v = fleets[0]["version"]
        assert cond["message"] == ("fleet default: 3 of 3 runtimes run version %d (runtimes of 2 "
                                   "live controller replicas)" % v), cond
        assert fleets == [{"fleet": "default", "version": v, "runtimes": 3, "programmed": 3}]
        assert conds[1] == conds[0]
        for c in ctls:
            doc = items(c)
            got = {r["node_id"]: r["replica"] for r in doc["items"]}
            assert got == {"rt-a": name_a, "rt-b": name_b, "rt-c": name_a}, (c.rest_port, doc)
            assert all(r["connected"] for r in doc["items"]), doc
            assert doc["view"] == {"replica": replica_of(c), "replicas": sorted([name_a, name_b]),
                                   "scope": "all_replicas", "error": None}, doc["view"]
            f = c.status()["fleets"]["default"]
            assert f["runtimes_connected"] == 3 and f["runtimes_at_version"] == 3, f
        # The rows in the table: one per runtime, under its replica.
        rows = pg.sql("SELECT replica || ' ' || node_id || ' ' || connected FROM "
                      "controller_runtimes ORDER BY node_id").splitlines()
        assert rows == ["%s rt-a true" % name_a, "%s rt-b true" % name_b,
                        "%s rt-c true" % name_a], rows

        # rt-b stops: both replicas see it disconnected (b writes only that
        # row), and count 2 of 2; started again: 3 of 3.
        rt_b = rts[1]
        rt_b.stop()

        def b_down():
            for c in ctls:
                rec = {r["node_id"]: r for r in items(c)["items"]}
                if rec["rt-b"]["connected"] or rec["rt-b"]["replica"] != name_b:
                    return False
            return True
        wait_until(b_down, 10, interval=0.1, what="rt-b disconnected on both replicas")
        wait_until(lambda: agreed(2), 10, interval=0.1, what="both replicas: 2 of 2")
        rt_b.start(wait_ready=False)
        wait_until(lambda: agreed(3), 20, interval=0.1, what="both replicas: 3 of 3 again")

        # kill -9 a; rt-a's load balancer sends it to b, rt-c's has nowhere
        # to go (its proxy points at the dead replica).
        killed_at = time.monotonic()
        a.kill9()
        pa.switch(b.stream_port)

        def moved():
            doc = items(b)
            rec = {r["node_id"]: r for r in doc["items"]}
            return rec.get("rt-a", {}).get("replica") == name_b and \
                rec["rt-a"]["connected"] and doc
        doc = wait_until(moved, 10, interval=0.05, what="rt-a reconnected to b")
        nodes = [r["node_id"] for r in doc["items"]]
        assert len(nodes) == len(set(nodes)), "a runtime listed twice: %s" % doc
        if name_a in doc["view"]["replicas"]:
            # a is still live (within the timeout): rt-c still counts from
            # a's rows, rt-a once, as b's.
            assert sorted(nodes) == ["rt-a", "rt-b", "rt-c"], doc
            assert time.monotonic() - killed_at < TIMEOUT_S + 1.5
        else:
            pytest.fail("rt-a took longer than --replica-timeout to reconnect: %s" % doc)
        # b counts rt-a once in every view.
        st = b.status()["fleets"]["default"]
        assert st["runtimes_connected"] <= 3, st

        # After the timeout: a's runtimes are gone from b's views, its rows
        # from the table.
        def gone():
            doc = items(b)
            return doc["view"]["replicas"] == [name_b] and \
                sorted(r["node_id"] for r in doc["items"]) == ["rt-a", "rt-b"] and doc
        doc = wait_until(gone, TIMEOUT_S + 6, interval=0.1, what="a's runtimes gone from b")
        assert time.monotonic() - killed_at >= TIMEOUT_S - 0.5, \
            "a's runtimes were dropped before --replica-timeout"
        assert all(r["replica"] == name_b for r in doc["items"]), doc
        cond, fleets = wait_until(
            lambda: (lambda c: c[0]["status"] == "True" and "2 of 2" in c[0]["message"] and c)(
                programmed(b)), 10, interval=0.1, what="b: 2 of 2")
        assert cond["message"].endswith("(runtimes of 1 live controller replica)"), cond
        assert fleets[0]["runtimes"] == 2, fleets
        assert b.status()["fleets"]["default"]["runtimes_connected"] == 2
        wait_until(lambda: pg.sql("SELECT count(*) FROM controller_runtimes WHERE replica = '%s'"
                                  % name_a) == "0", 5, what="a's rows removed")
        assert pg.sql("SELECT count(*) FROM controller_replicas WHERE replica = '%s'"
                      % name_a) == "0"
        assert "no heartbeat for %d ms: removed with its 2 runtime record(s)" % (
            TIMEOUT_S * 1000) in b.log()

        # a restarted (a new replica) agrees with b; rt-c, pointed at a
        # again, is counted once more.
        a.start()
        name_a2 = replica_of(a)
        assert name_a2 != name_a
        pc.switch(a.stream_port)
        conds = wait_until(lambda: agreed(3), 20, interval=0.1,
                           what="both replicas report 3 of 3 again")
        for c in ctls:
            got = {r["node_id"]: r["replica"] for r in items(c)["items"]}
            assert got == {"rt-a": name_b, "rt-b": name_b, "rt-c": name_a2}, got

        # The runtime tables cannot be read (but the resources can): reads
        # answer, count this replica's runtimes only and say so.
        pg.sql("ALTER TABLE controller_runtimes RENAME TO controller_runtimes_away")

        def fell_back(c, n):
            cond, fleets = programmed(c)
            return "counted on this controller replica only" in cond["message"] and \
                "%d of %d runtime" % (n, n) in cond["message"] and (cond, fleets)
        cond, fleets = wait_until(lambda: fell_back(b, 2), 10, interval=0.1,
                                  what="b falls back to its own runtimes")
        assert "controller_runtimes" in cond["message"], cond
        assert fleets[0]["runtimes"] == 2
        wait_until(lambda: fell_back(a, 1), 10, interval=0.1, what="a falls back")
        view = items(a)["view"]
        assert view["scope"] == "this_replica" and view["error"], view
        assert [r["node_id"] for r in items(a)["items"]] == ["rt-c"]
        pg.sql("ALTER TABLE controller_runtimes_away RENAME TO controller_runtimes")
        wait_until(lambda: agreed(3), 10, interval=0.1, what="3 of 3 once the table is back")

        # PostgreSQL stopped: the controller views still answer, this
        # replica's runtimes only, naming the store.
        pg.stop("fast")
        for c in ctls:
            def own_only():
                st = c.status()
                return st["runtimes_view"]["scope"] == "this_replica" and st
            st = wait_until(own_only, 10, interval=0.1, what="scope this_replica")
            assert "postgres://sluice@127.0.0.1:%d/sluice" % pg.port in \
                st["runtimes_view"]["error"], st
            doc = items(c)
            assert doc["view"]["scope"] == "this_replica"
            assert all(r["replica"] == replica_of(c) for r in doc["items"]), doc
        assert b.status()["fleets"]["default"]["runtimes_connected"] == 2
        assert a.status()["fleets"]["default"]["runtimes_connected"] == 1
        pg.start()
        pg.wait_up()
        wait_until(lambda: agreed(3), 30, interval=0.2, what="3 of 3 once PostgreSQL is back")

        # A clean stop (SIGTERM) removes the replica's rows at once: the
        # other one stops counting its runtimes well before the timeout.
        b.stop()
        stopped_at = time.monotonic()
        wait_until(lambda: items(a)["view"]["replicas"] == [name_a2], TIMEOUT_S + 5,
                   interval=0.05, what="b gone from a's view")
        assert time.monotonic() - stopped_at < TIMEOUT_S - 1, \
            "b's rows stayed until the timeout after a clean stop"
        assert pg.sql("SELECT count(*) FROM controller_runtimes WHERE replica = '%s'"
                      % name_b) == "0"
        assert [r["node_id"] for r in items(a)["items"]] == ["rt-c"]
    finally:
        for rt in rts:
            rt.stop()
            problems += ["%s: %s" % (rt.node_id, p) for p in rt.problems()]
        for c in ctls:
            c.stop()
            problems += c.problems()
        for p in proxies:
            p.close()
        if origin is not None:
            origin.stop()
        if pg is not None:
            pg.close()
    assert not problems, problems


def test_max_routes_is_global_across_replicas(tmp_path):
    """--max-routes counts every Api in the store, whichever replica wrote
    it: each replica compiles the whole store, and admission counts what the
    last compile saw plus what this replica admitted since."""
    reason = pg_missing()
    if reason:
        pytest.skip(reason)
    pg = None
    ctls = []
    try:
        pg = Postgres(tmp_path).init()
        a = start_controller(tmp_path, "a", pg, ["--max-routes", "5"])
        b = start_controller(tmp_path, "b", pg, ["--max-routes", "5"])
        ctls += [a, b]
        a.put(backend_doc(9))
        rv = int(a.put(api_doc("one", 4))["metadata"]["resourceVersion"])
        # b has compiled a's write: its fleet version is the store's config
        # resourceVersion, the write's.
        wait_until(lambda: fleet_version(b) == rv, 10, interval=0.02, what="b compiled a's write")
        status, _, doc = b.rest("PUT", "/api/v1/apis/two", api_doc("two", 2))
        assert status == 400 and doc["error"]["code"] == "limit_exceeded", (status, doc)
        assert "config would have 6 routes, more than --max-routes 5" in \
            doc["error"]["message"], doc
        status, _, doc = b.rest("PUT", "/api/v1/apis/two", api_doc("two", 1))
        assert status in (200, 201), (status, doc)
        # And back: a counts b's write.
        rv = int(doc["metadata"]["resourceVersion"])
        wait_until(lambda: fleet_version(a) == rv, 10, interval=0.02, what="a compiled b's write")
        status, _, doc = a.rest("PUT", "/api/v1/apis/three", api_doc("three", 1))
        assert status == 400 and "6 routes" in doc["error"]["message"], (status, doc)
        # A deletion on a frees room on b.
        a.delete("Api", "one")
        wait_until(lambda: b.rest("PUT", "/api/v1/apis/three", api_doc("three", 3))[0]
                   in (200, 201), 10, interval=0.1, what="b admits after a's deletion")
    finally:
        problems = []
        for c in ctls:
            c.stop()
            problems += c.problems()
        if pg is not None:
            pg.close()
    assert not problems, problems
