"""Controller + config stream, end to end with real processes: a
sluice-controller, runtimes in controller mode (sluice-runtime --controller)
and origin servers.

What is covered (issue 3): REST writes reach every runtime of the fleet
quickly and are reported per runtime; a push a runtime cannot apply is NACKed,
reported and not re-sent; kill -9 of the controller under load fails no
request and loses nothing; 200 config changes under keep-alive load drop
nothing; a runtime started before its controller waits unready; bursts are
coalesced; a missing Backend reference is reported in the object's status
without breaking other Apis; --resources runs read-only; a policy that
validates but cannot be compiled is named in its Api's status while the
runtimes fail that Api closed and keep every other Api's policies.

Runtimes of one fleet share their listener port (as on separate machines),
so the tests with several runtimes give each its own network namespace
(controller_env.NetLab). Run: SLUICE_BUILD=build /usr/bin/python3 -m pytest
tests/integration/test_controller.py
"""

import json
import socket
import threading
import time

import pytest

from backend import Backend
from controller_env import (Controller, Load, ManagedRuntime, NetLab, netns_available,
                            quickstart)
from helpers import api, backend as backend_doc, free_port, gateway, wait_until


class Env:
    """One test's processes; close() stops them all and reports problems
    (sanitizer reports, [alert] lines, crashes, bad exit codes)."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.lab = None
        self.ctl = None
        self.rts = []
        self.backends = []

    def net(self, n):
        reason = netns_available()
        if reason:
            pytest.skip(reason)
        self.lab = NetLab(n)
        return self.lab

    @property
    def hub(self):
        return self.lab.hub_ip if self.lab else "127.0.0.1"

    def controller(self, start=True, **kw):
        self.ctl = Controller(self.tmp / "controller", stream_host=self.hub, **kw)
        if start:
            self.ctl.start()
        return self.ctl

    def runtime(self, node_id, start=True, workers=1, **kw):
        index = len(self.rts) if self.lab else None
        rt = ManagedRuntime(self.tmp / node_id, self.ctl.stream_addr, node_id, workers=workers,
                            lab=self.lab, index=index, **kw)
        self.rts.append(rt)
        if start:
            rt.start(wait_ready=False)
        return rt

    def backend(self, name):
        b = Backend(host=self.hub, name=name).start()
        self.backends.append(b)
        return b

    def close(self):
        problems = []
        for rt in self.rts:
            if rt.proc is None:
                continue
            rt.stop()
            problems += ["runtime %s: %s" % (rt.node_id, p) for p in rt.problems(0)]
        if self.ctl is not None:
            self.ctl.stop()
            problems += self.ctl.problems()
        for b in self.backends:
            b.stop()
        if self.lab is not None:
            self.lab.close()
        if problems:
            logs = "".join("\n--- runtime %s log (tail) ---\n%s" % (rt.node_id, rt.log()[-4000:])
                           for rt in self.rts)
            if self.ctl is not None:
                logs += "\n--- controller log (tail) ---\n%s" % self.ctl.log()[-6000:]
            pytest.fail("\n".join(problems) + logs, pytrace=False)


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    try:
        yield e
    finally:
        e.close()


def wait_connected(ctl, node_ids, timeout=10.0):
    def ok():
        rts = ctl.runtimes()
        return all(n in rts and rts[n]["connected"] for n in node_ids)
    wait_until(ok, timeout, what="runtimes %s connected to the controller" % list(node_ids))


def wait_routes(rts, port, path, want, timeout):
    """Until every runtime answers `path` with status `want`; returns the
    seconds it took."""
    t0 = time.monotonic()
    for rt in rts:
        def ok():
            try:
                return rt.get(port, path, timeout=1.0)[0] == want
            except OSError:
                return False
        left = timeout - (time.monotonic() - t0)
        wait_until(ok, max(left, 0.01), interval=0.005,
                   what="runtime %s to answer %s with %d" % (rt.node_id, path, want))
    return time.monotonic() - t0


def petstore_api(operations):
    return api("petstore", "/petstore/v1", "echo",
               operations=[{"method": m, "path": p} for m, p in operations])


def assert_same_acked(ctl, node_ids, fleet_version):
    rts = ctl.runtimes()
    first = rts[node_ids[0]]["types"]
    for n in node_ids:
        assert rts[n]["connected"], rts[n]
        assert rts[n]["last_nack"] is None, rts[n]
        assert rts[n]["types"] == first, "runtimes at different versions: %s" % json.dumps(rts)
        assert rts[n]["acked_version"] == fleet_version, rts[n]


# --- 1 ------------------------------------------------------------------------

def test_two_runtimes_create_replace_delete(env):
    lab = env.net(2)
    ctl = env.controller()
    b = env.backend("echo")
    rts = [env.runtime("rt-a"), env.runtime("rt-b")]
    wait_connected(ctl, ["rt-a", "rt-b"])
    assert all(rt.ready_status() == 503 for rt in rts), "ready without a config"

    port = free_port()
    ctl.apply(quickstart(port, b.port, backend_host=lab.hub_ip))
    took = wait_routes(rts, port, "/petstore/v1/pets", 200, timeout=1.0)
    for rt in rts:
        status, headers, body = rt.get(port, "/petstore/v1/pets")
        assert status == 200
        assert dict(headers).get("X-Backend") == "echo"
        assert json.loads(body)["method"] == "GET"
    v1 = ctl.wait_converged(2)
    assert_same_acked(ctl, ["rt-a", "rt-b"], v1)
    assert all(rt.ready_status() == 200 for rt in rts)
    assert took < 1.0

    # Replace: an operation added, one removed.
    assert all(rt.get(port, "/petstore/v1/owners")[0] == 404 for rt in rts)
    ctl.put(petstore_api([("GET", "/pets"), ("GET", "/owners")]))
    wait_routes(rts, port, "/petstore/v1/owners", 200, timeout=1.0)
    wait_routes(rts, port, "/petstore/v1/pets/7", 404, timeout=1.0)
    v2 = ctl.wait_converged(2, min_version=v1 + 1)
    assert_same_acked(ctl, ["rt-a", "rt-b"], v2)

    # Delete.
    ctl.delete("Api", "petstore")
    wait_routes(rts, port, "/petstore/v1/pets", 404, timeout=1.0)
    v3 = ctl.wait_converged(2, min_version=v2 + 1)
    assert_same_acked(ctl, ["rt-a", "rt-b"], v3)
    st = ctl.status()
    assert st["config_version"] == v3, st
    assert st["fleets"]["default"]["runtimes_at_version"] == 2, st
    assert st["fleets"]["default"]["runtimes_connected"] == 2, st
    for rt in rts:
        c = rt.controller_state()
        assert c["connected"] and c["synced"] and c["updates_nacked"] == 0, c
        assert max(int(v) for v in c["versions"].values()) == v3, c
    assert b.count("/pets") >= 4


# --- 2 ------------------------------------------------------------------------

def test_nack_port_taken_keeps_old_config_and_is_not_resent(env):
    ctl = env.controller()
    b = env.backend("echo")
    rt = env.runtime("rt-nack")
    port = free_port()
    ctl.apply(quickstart(port, b.port, listener_address="127.0.0.1"))
    v1 = ctl.wait_converged(1)
    rt.wait_ready()

    # Another process on the runtime's machine holds the port the new
    # Gateway wants (no SO_REUSEPORT: the runtime cannot share it).
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    taken_port = taken.getsockname()[1]
    try:
        gw = gateway(port)
        gw["spec"]["listeners"].append({"name": "extra", "port": taken_port,
                                        "protocol": "http", "address": "127.0.0.1"})
        ctl.put(gw)

        def nacked():
            r = ctl.runtimes()["rt-nack"]
            return r["last_nack"]
        nack = wait_until(nacked, 5.0, what="a NACK in /api/v1/runtimes")
        assert nack["type"] == "listeners", nack
        assert str(taken_port) in nack["message"], nack
        assert int(nack["version"]) > v1, nack
        assert "in use" in nack["message"], nack
        c = rt.controller_state()
        assert c["updates_nacked"] == 1 and str(taken_port) in c["last_error"], c
        assert rt.metric("sluice_controller_updates_total", result="nack") == 1

        # The old config still serves.
        assert rt.get(port, "/petstore/v1/pets")[0] == 200
        assert rt.ready_status() == 200
        st = ctl.status()["fleets"]["default"]
        assert st["runtimes_at_version"] == 0 and st["runtimes_connected"] == 1, st

        # Not re-sent in a loop.
        sent0 = ctl.runtimes()["rt-nack"]["responses_sent"]
        nacks0 = ctl.metric("sluice_controller_nacks_total")
        pushes0 = ctl.metric("sluice_controller_pushes_total")
        assert nacks0 == 1
        time.sleep(2.0)
        assert ctl.runtimes()["rt-nack"]["responses_sent"] == sent0
        assert ctl.metric("sluice_controller_nacks_total") == nacks0
        assert ctl.metric("sluice_controller_pushes_total") == pushes0
        assert rt.metric("sluice_controller_updates_total", result="nack") == 1

        # Other types still flow while listeners stay rejected.
        ctl.put(petstore_api([("GET", "/pets"), ("GET", "/owners")]))
        wait_routes([rt], port, "/petstore/v1/owners", 200, timeout=2.0)
        assert ctl.metric("sluice_controller_nacks_total") == nacks0
    finally:
        taken.close()

    # A new Gateway version (the extra listener on a free port) is accepted.
    free = free_port()
    gw["spec"]["listeners"][1]["port"] = free
    ctl.put(gw)
    ctl.wait_converged(1, min_version=int(nack["version"]) + 1)
    wait_routes([rt], free, "/petstore/v1/pets", 200, timeout=2.0)


# --- 3 ------------------------------------------------------------------------

def test_controller_kill9_under_load_then_restart(env):
    lab = env.net(2)
    ctl = env.controller()
    b = env.backend("echo")
    rts = [env.runtime("rt-a"), env.runtime("rt-b")]
    port = free_port()
    ctl.apply(quickstart(port, b.port, backend_host=lab.hub_ip))
    v1 = ctl.wait_converged(2)
    for rt in rts:
        rt.wait_ready()
    acked0 = {rt.node_id: rt.controller_state()["updates_acked"] for rt in rts}

    load = Load([(rt.host, port) for rt in rts], "/petstore/v1/pets", keepalive=2, fresh=1,
                pause_s=0.002).start()
    try:
        time.sleep(0.5)
        ctl.kill9()
        for rt in rts:
            wait_until(lambda: rt.metric("sluice_controller_connected") == 0, 15.0,
                       what="runtime %s to notice the controller is gone" % rt.node_id)
        time.sleep(1.0)  # serving without a controller
        served_without = load.stats.ok
        ctl.start()  # same data dir, same ports
        for rt in rts:
            wait_until(lambda: rt.metric("sluice_controller_connected") == 1, 15.0,
                       what="runtime %s to reconnect" % rt.node_id)
        assert ctl.wait_converged(2) == v1, "versions changed across a restart with no change"
        time.sleep(1.0)  # room for any (wrong) re-push to happen
    finally:
        stats = load.stop()
    print("kill -9: %d requests answered, %d while the controller was away"
          % (stats.ok, served_without))
    load.assert_clean(min_ok=50)
    assert stats.ok > served_without > 0

    # No re-push of what the runtimes already run.
    runtimes = ctl.runtimes()
    for rt in rts:
        assert runtimes[rt.node_id]["responses_sent"] == 0, runtimes[rt.node_id]
        assert rt.controller_state()["updates_acked"] == acked0[rt.node_id]

    # Nothing lost.
    assert ctl.get("Gateway", "default")["spec"]["listeners"][0]["port"] == port
    assert ctl.get("Backend", "echo")["spec"]["endpoints"][0]["port"] == b.port
    assert len(ctl.get("Api", "petstore")["spec"]["operations"]) == 3
    for rt in rts:
        assert rt.get(port, "/petstore/v1/pets/1")[0] == 200

    # Versions continue.
    ctl.put(petstore_api([("GET", "/pets"), ("GET", "/owners")]))
    v2 = ctl.wait_converged(2, min_version=v1 + 1)
    assert v2 > v1
    assert ctl.status()["config_version"] == v2
    wait_routes(rts, port, "/petstore/v1/owners", 200, timeout=2.0)


# --- 4 ------------------------------------------------------------------------

def weighted_backend(b1, b2, w1, w2, host):
    return backend_doc("stable", [{"address": host, "port": b1.port, "weight": w1},
                                  {"address": host, "port": b2.port, "weight": w2}])


def test_zero_drop_under_200_config_changes(env):
    lab = env.net(2)
    ctl = env.controller()
    b1, b2 = env.backend("b1"), env.backend("b2")
    rts = [env.runtime("rt-a"), env.runtime("rt-b")]
    port = free_port()
    ctl.apply([gateway(port, address="0.0.0.0"),
               weighted_backend(b1, b2, 1, 1, lab.hub_ip),
               api("stable", "/stable", "stable")])
    v0 = ctl.wait_converged(2)
    for rt in rts:
        rt.wait_ready()

    load = Load([(rt.host, port) for rt in rts], "/stable/ping", keepalive=3, fresh=1,
                pause_s=0.003).start()
    extras = []
    changes = 0
    t_end = time.monotonic() + 20.0
    try:
        for i in range(200):
            kind = i % 4
            if kind == 0:
                w = (1 + i % 7, 1 + (i // 4) % 5)
                ctl.put(weighted_backend(b1, b2, w[0], w[1], lab.hub_ip))
            elif kind in (1, 2):
                name = "extra-%d" % i
                ctl.put(api(name, "/extra/%d" % i, "stable",
                            operations=[{"method": "GET", "path": "/items/{id}"}]))
                extras.append(name)
            else:
                ctl.delete("Api", extras.pop(0))
            changes += 1
            # Spread the changes over the 20 s of load.
            left = t_end - time.monotonic()
            if left > 0:
                time.sleep(left / (200 - i))
        while time.monotonic() < t_end:
            time.sleep(0.05)
    finally:
        stats = load.stop()
    assert changes == 200
    print("zero-drop: %d requests answered, keep-alive per connection %s"
          % (stats.ok, sorted(stats.keepalive_requests.values())))
    load.assert_clean(min_ok=500)
    assert len(stats.keepalive_requests) == 6
    assert all(n > 50 for n in stats.keepalive_requests.values()), stats.keepalive_requests
    assert b1.count("/ping") > 0 and b2.count("/ping") > 0

    final = ctl.status()["config_version"]
    assert final >= v0 + 150, "expected ~200 new versions, got %d -> %d" % (v0, final)
    assert ctl.wait_converged(2, min_version=final) == final
    for rt in rts:
        c = rt.controller_state()
        assert max(int(v) for v in c["versions"].values()) == final, c
        assert c["updates_nacked"] == 0, c
    # The last state is what the runtimes serve.
    for name in extras:
        n = name.split("-")[1]
        wait_routes(rts, port, "/extra/%s/items/1" % n, 200, timeout=2.0)
    wait_routes(rts, port, "/extra/1/items/1", 404, timeout=2.0)  # deleted at i=3


# --- 5 ------------------------------------------------------------------------

def test_runtime_started_before_controller_waits_unready(env):
    ctl = env.controller()
    b = env.backend("echo")
    port = free_port()
    ctl.apply(quickstart(port, b.port, listener_address="127.0.0.1"))
    ctl.stop()  # the config stays in its data dir

    rt = env.runtime("rt-early")
    # How soon the admin port opens depends on the machine's load; once it
    # answers, every answer while the controller is away must be "not ready".
    wait_until(lambda: rt.ready_status() is not None, 15.0, what="runtime admin port")
    deadline = time.monotonic() + 1.5
    seen = []
    while time.monotonic() < deadline:
        seen.append(rt.ready_status())
        time.sleep(0.05)
    assert len(seen) >= 5 and all(s == 503 for s in seen), seen
    assert rt.metric("sluice_controller_connected") == 0
    assert rt.controller_state()["synced"] is False
    # The stream state on /metrics: never connected, attempts failing.
    m = {n: v for n, l, v in rt.metrics() if n.startswith("sluice_controller_")}
    assert m["sluice_controller_synced"] == 0 and m["sluice_controller_connects_total"] == 0, m
    assert m["sluice_controller_stream_failures_total"] >= 1, m

    ctl.start()
    wait_until(lambda: rt.ready_status() == 200, 15.0, what="runtime ready after the "
               "controller started")
    assert rt.get(port, "/petstore/v1/pets")[0] == 200
    assert rt.metric("sluice_controller_connected") == 1
    assert rt.metric("sluice_controller_synced") == 1
    assert rt.metric("sluice_controller_connects_total") == 1
    ctl.wait_converged(1)
    assert ctl.metric("sluice_controller_fleet_runtimes_connected", fleet="default") == 1

    # The controller goes away and comes back: one failure more, one connect more.
    failures = rt.metric("sluice_controller_stream_failures_total")
    ctl.stop()
    wait_until(lambda: rt.metric("sluice_controller_connected") == 0, 15.0,
               what="the runtime to notice the controller is gone")
    assert rt.metric("sluice_controller_stream_failures_total") > failures
    assert rt.metric("sluice_controller_synced") == 1  # still serving the last good config
    ctl.start()
    wait_until(lambda: rt.metric("sluice_controller_connects_total") == 2, 15.0,
               what="the runtime to reconnect")
    assert rt.metric("sluice_controller_connected") == 1


# --- 6 ------------------------------------------------------------------------

def test_burst_of_100_writes_is_coalesced(env):
    ctl = env.controller()
    b = env.backend("echo")
    rt = env.runtime("rt-burst")
    port = free_port()
    ctl.apply(quickstart(port, b.port, listener_address="127.0.0.1"))
    v0 = ctl.wait_converged(1)
    rt.wait_ready()
    acks0 = rt.metric("sluice_controller_updates_total", result="ack")
    sent0 = ctl.runtimes()["rt-burst"]["responses_sent"]

    # A burst as several clients make it: 4 writers, 25 writes each, each
    # writer replacing its own Api over and over.
    def writer(w):
        for i in range(25):
            ctl.put(api("burst-%d" % w, "/burst/%d" % w, "echo",
                        operations=[{"method": "GET", "path": "/v%d" % i}]))

    t0 = time.monotonic()
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    burst_ms = (time.monotonic() - t0) * 1e3
    final = ctl.wait_converged(1, min_version=v0 + 1, timeout=15.0)
    assert final > v0
    acks = rt.metric("sluice_controller_updates_total", result="ack") - acks0
    sent = ctl.runtimes()["rt-burst"]["responses_sent"] - sent0
    print("burst: 100 writes in %.0f ms, versions %d -> %d, %d routes pushes"
          % (burst_ms, v0, final, acks))
    # Only the routes type changed, so every push is a routes push.
    assert 1 <= acks < 20, "100 writes in %.0f ms gave %d pushes" % (burst_ms, acks)
    assert sent == acks
    for w in range(4):
        wait_routes([rt], port, "/burst/%d/v24" % w, 200, timeout=2.0)
        assert rt.get(port, "/burst/%d/v23" % w)[0] == 404
    assert rt.get(port, "/petstore/v1/pets")[0] == 200


# --- 7 ------------------------------------------------------------------------

def test_missing_backend_reported_in_status_others_keep_serving(env):
    ctl = env.controller()
    b = env.backend("echo")
    rt = env.runtime("rt-ref")
    port = free_port()
    ctl.apply(quickstart(port, b.port, listener_address="127.0.0.1"))
    v0 = ctl.wait_converged(1)
    rt.wait_ready()

    status, _, doc = ctl.rest("POST", "/api/v1/apis",
                              api("orphan", "/orphan", "nope"))
    assert status == 201, doc
    obj = wait_until(lambda: (ctl.get("Api", "orphan").get("status") or {}).get("conditions")
                     and ctl.get("Api", "orphan"), 5.0, what="status on Api orphan")
    cond = [c for c in obj["status"]["conditions"] if c["type"] == "Accepted"]
    assert cond and cond[0]["status"] == "False", obj["status"]
    assert "spec.backendRefs[0].name" in cond[0]["message"], cond
    assert "nope" in cond[0]["message"], cond
    good = ctl.get("Api", "petstore")["status"]["conditions"]
    assert [c["status"] for c in good if c["type"] == "Accepted"] == ["True"], good

    # The others keep serving, the orphan is not pushed half-way, nothing NACKed.
    time.sleep(0.3)
    assert rt.get(port, "/petstore/v1/pets")[0] == 200
    assert rt.get(port, "/orphan/x")[0] == 404
    r = ctl.runtimes()["rt-ref"]
    assert r["last_nack"] is None, r
    st = ctl.status()["fleets"]["default"]
    assert st["compiled"] and st["runtimes_at_version"] == 1, st

    # Once the Backend exists the Api is accepted and served.
    ctl.put(backend_doc("nope", [b.port]))
    ctl.wait_converged(1, min_version=v0 + 1)
    wait_routes([rt], port, "/orphan/x", 200, timeout=2.0)
    cond = [c for c in ctl.get("Api", "orphan")["status"]["conditions"]
            if c["type"] == "Accepted"]
    assert cond[0]["status"] == "True", cond


# --- 8 ------------------------------------------------------------------------

def test_resources_file_is_read_only(env, tmp_path):
    b = env.backend("echo")
    port = free_port()
    path = tmp_path / "gitops.yaml"
    path.write_text(quickstart(port, b.port, listener_address="127.0.0.1"))
    ctl = env.controller(resources=[str(path)])
    rt = env.runtime("rt-ro")
    rt.wait_ready()
    assert rt.get(port, "/petstore/v1/pets")[0] == 200
    ctl.wait_converged(1)

    new_api = api("other", "/other", "echo")
    for method, target, body in [("POST", "/api/v1/apis", new_api),
                                 ("PUT", "/api/v1/apis/other", new_api),
                                 ("DELETE", "/api/v1/apis/petstore", None),
                                 ("POST", "/api/v1/resources", [new_api])]:
        status, headers, doc = ctl.rest(method, target, body)
        assert status == 405, (method, target, status, doc)
        assert doc["error"]["code"] == "read_only", doc
        assert "GET" in (dict(headers).get("Allow") or ""), headers
    assert ctl.get("Api", "petstore")["spec"]["basePath"] == "/petstore/v1"
    assert rt.get(port, "/other/x")[0] == 404
    assert rt.get(port, "/petstore/v1/pets")[0] == 200


# --- 9 ------------------------------------------------------------------------

# Passes validation (the shape of PEM) but does not parse: compile fails.
BAD_PEM = "-----BEGIN CERTIFICATE-----\nMIIBAAAA\n-----END CERTIFICATE-----\n"


def test_policy_that_cannot_be_compiled_is_in_the_status_and_fails_closed(env):
    ctl = env.controller()
    b = env.backend("echo")
    rt = env.runtime("rt-pol")
    port = free_port()
    ctl.apply(quickstart(port, b.port, listener_address="127.0.0.1"))
    good = ctl.get("Api", "petstore")
    good_spec = dict(good["spec"], policies=[
        {"name": "headers", "config": {"response": {"set": {"X-Served-By": "petstore"}}}}])
    ctl.put({"apiVersion": good["apiVersion"], "kind": "Api", "metadata": {"name": "petstore"},
             "spec": good_spec})
    jwt_bad = {"name": "jwt", "config": {"jwksUri": "https://idp.example/keys",
                                          "jwksCaBundle": BAD_PEM}}
    bad = api("locked", "/locked", "echo", operations=[
        {"method": "GET", "path": "/a"},
        {"method": "GET", "path": "/b", "policies": [
            {"name": "headers", "config": {"request": {"set": {"X-B": "1"}}}}]}])
    bad["spec"]["policies"] = [{"name": "headers", "config": {"request": {"set": {"X-A": "1"}}}},
                               jwt_bad]
    status, _, doc = ctl.rest("POST", "/api/v1/apis", bad)
    assert status == 201, doc  # valid: the PEM's parse is compile's
    ctl.wait_converged(1)
    rt.wait_ready()

    def policy_ready(name):
        conds = (ctl.get("Api", name).get("status") or {}).get("conditions") or []
        return [c for c in conds if c["type"] == "PolicyReady"]
    cond = wait_until(lambda: policy_ready("locked"), 5.0, what="PolicyReady on Api locked")[0]
    assert cond["status"] == "False" and cond["reason"] == "PolicyUnavailable", cond
    assert cond["message"].startswith("spec.policies[1] (jwt): jwksCaBundle: certificate 1 does "
                                      "not parse"), cond
    accepted = [c for c in ctl.get("Api", "locked")["status"]["conditions"]
                if c["type"] == "Accepted"]
    assert accepted[0]["status"] == "True", accepted  # pushed: the runtimes fail it closed
    assert policy_ready("petstore")[0]["status"] == "True"
    assert "cannot be compiled" in ctl.log() and "api default/locked" in ctl.log()

    # The runtimes fail every route of the Api closed, and say why in their log.
    for target in ("/locked/a", "/locked/b"):
        st, _, body = rt.get(port, target)
        assert st == 503, (target, st, body)
        assert json.loads(body)["error"]["code"] == "policy_unavailable", body
    assert b.count() == 0
    assert "jwksCaBundle: certificate 1 does not parse" in rt.log()
    # Every other Api keeps its policies.
    st, headers, _ = rt.get(port, "/petstore/v1/pets")
    assert st == 200 and ("X-Served-By", "petstore") in headers, headers

    # Fixed: served again with its policies, and the status says so.
    bad["spec"]["policies"][1] = {"name": "jwt", "config": {
        "secret": "0123456789abcdef0123456789abcdef-shared"}}
    ctl.put(bad)
    wait_until(lambda: policy_ready("locked") and policy_ready("locked")[0]["status"] == "True",
               5.0, what="PolicyReady True once fixed")
    wait_until(lambda: rt.get(port, "/locked/a")[0] == 401, 5.0, what="the jwt policy applied")
