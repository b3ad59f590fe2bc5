"""Incremental (delta) config streams (issue 14): the runtime's default
mode, next to state-of-the-world runtimes of the same controller.

Covered, with real controllers and runtimes: the initial sync; one Api
changed -> only its route table goes out (the controller's per-runtime
counters, its push metrics by mode and the runtime's /config_dump say so),
while a sotw runtime gets every route table again; a removal; a controller
restart -> the runtime reconnects with initial_resource_versions and
nothing is re-sent; a NACK of one listener (its port is taken) leaves the
other listener of the same response applied and is not re-sent on the
stream, while a new version of it is; make before break under keep-alive
load while Apis and Backends come and go (zero failed requests, no NACK);
subscriptions by name (a hand-written peer, controller_env.FakeRuntime).

Run: SLUICE_BUILD=build /usr/bin/python3 -m pytest tests/integration/test_delta.py
"""

import socket
import time

import pytest

from controller_env import Load
from helpers import api, backend, free_port, wait_until
from test_controller import Env, wait_routes


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    try:
        yield e
    finally:
        e.close()


API_VERSION = "gateway.sluice.dev/v1alpha1"
# Delta whatever SLUICE_XDS_MODE says (a later --xds-mode in argv wins).
DELTA = ["--xds-mode", "delta"]


def gw(listeners, name="default", address="127.0.0.1"):
    return {"apiVersion": API_VERSION, "kind": "Gateway", "metadata": {"name": name},
            "spec": {"fleet": "default", "listeners": [
                {"name": n, "port": p, "protocol": "http", "address": address}
                for n, p in listeners]}}


def apis(n, backend_name="echo", ops=3):
    return [api("api-%d" % i, "/a%d" % i, backend_name,
                operations=[{"method": "GET", "path": "/op%d" % k} for k in range(ops)])
            for i in range(n)]


def state(rt):
    return rt.controller_state()


def sent(ctl, node):
    r = ctl.runtimes()[node]
    return r["resources_sent"], r["bytes_sent"]


def push_metric(ctl, what, mode):
    return ctl.metric("sluice_controller_push_%s_total" % what, mode=mode)


def base_config(env, n_apis=5):
    """With env.net(N) first, each runtime in its own network namespace
    (listeners on 0.0.0.0, the backend on the hub address)."""
    ctl = env.controller()
    b = env.backend("echo")
    port = free_port()
    ctl.apply([gw([("http", port)], address="0.0.0.0" if env.lab else "127.0.0.1"),
               backend("echo", [(env.hub, b.port)])] + apis(n_apis))
    return ctl, b, port


def test_initial_sync_then_one_api_change_sends_only_its_route_table(env):
    env.net(2)
    ctl, b, port = base_config(env, n_apis=6)
    rd = env.runtime("rt-delta", extra_args=DELTA)
    rs = env.runtime("rt-sotw", extra_args=["--xds-mode", "sotw"])
    ctl.wait_converged(2)
    wait_routes([rd, rs], port, "/a5/op2", 200, timeout=5.0)

    sd, ss = state(rd), state(rs)
    assert sd["mode"] == "delta" and ss["mode"] == "sotw", (sd, ss)
    assert sorted(sd["resources"]["routes"]) == ["default/api-%d" % i for i in range(6)], sd
    assert all(len(v) == 16 for v in sd["resources"]["routes"].values()), sd
    assert sd["resources_received"] == ss["resources_received"], (sd, ss)
    rts = ctl.runtimes()
    assert rts["rt-delta"]["mode"] == "delta" and rts["rt-sotw"]["mode"] == "sotw"

    d0, s0 = sent(ctl, "rt-delta"), sent(ctl, "rt-sotw")
    m0 = (push_metric(ctl, "resources", "delta"), push_metric(ctl, "bytes", "delta"))
    v0 = ctl.status()["config_version"]

    # One Api changed: one operation added.
    ctl.put(api("api-3", "/a3", "echo",
                operations=[{"method": "GET", "path": "/op%d" % k} for k in range(4)]))
    ctl.wait_converged(2, min_version=v0 + 1)
    wait_routes([rd, rs], port, "/a3/op3", 200, timeout=5.0)

    d1, s1 = sent(ctl, "rt-delta"), sent(ctl, "rt-sotw")
    assert d1[0] - d0[0] == 1, "delta runtime got %d resources for one Api" % (d1[0] - d0[0])
    assert s1[0] - s0[0] == 6, "sotw runtime got %d resources (every route table)" % (
        s1[0] - s0[0])
    assert (d1[1] - d0[1]) * 3 < s1[1] - s0[1], (d0, d1, s0, s1)
    assert push_metric(ctl, "resources", "delta") - m0[0] == 1
    assert push_metric(ctl, "bytes", "delta") - m0[1] == d1[1] - d0[1]
    sd1 = state(rd)
    assert sd1["resources_received"] - sd["resources_received"] == 1, sd1
    changed = [n for n, v in sd1["resources"]["routes"].items()
               if v != sd["resources"]["routes"][n]]
    assert changed == ["default/api-3"], changed
    assert sd1["updates_nacked"] == 0, sd1
    for rt in (rd, rs):
        assert rt.get(port, "/a0/op0")[0] == 200


def test_removal_of_an_api_and_its_backend(env):
    ctl, b, port = base_config(env, n_apis=3)
    b2 = env.backend("other")
    ctl.apply([backend("other", [b2.port]), api("solo", "/solo", "other")])
    rt = env.runtime("rt-rm", extra_args=DELTA)
    v = ctl.wait_converged(1)
    wait_routes([rt], port, "/solo/x", 200, timeout=5.0)
    s0 = state(rt)
    assert "default/other" in s0["resources"]["clusters"], s0
    r0 = sent(ctl, "rt-rm")

    ctl.delete("Api", "solo")
    ctl.delete("Backend", "other")
    ctl.wait_converged(1, min_version=v + 1)
    wait_routes([rt], port, "/solo/x", 404, timeout=5.0)
    wait_until(lambda: "default/other" not in state(rt)["resources"]["clusters"], 5.0,
               what="cluster removed at the runtime")
    s1 = state(rt)
    assert "default/solo" not in s1["resources"]["routes"], s1
    assert sorted(s1["resources"]["routes"]) == ["default/api-%d" % i for i in range(3)], s1
    # Removals carry names only: no resource was sent.
    assert sent(ctl, "rt-rm")[0] == r0[0]
    assert s1["updates_nacked"] == 0, s1
    assert rt.get(port, "/a1/op1")[0] == 200


def test_reconnect_with_initial_resource_versions_resends_nothing(env):
    ctl, b, port = base_config(env, n_apis=4)
    rt = env.runtime("rt-re", extra_args=DELTA)
    v = ctl.wait_converged(1)
    wait_routes([rt], port, "/a2/op0", 200, timeout=5.0)
    before = state(rt)

    ctl.stop()
    ctl.start()
    wait_until(lambda: ctl.runtimes().get("rt-re", {}).get("connected"), 15.0,
               what="runtime reconnected")
    assert ctl.wait_converged(1) == v
    r = ctl.runtimes()["rt-re"]
    assert r["resources_sent"] == 0 and r["bytes_sent"] == 0, r
    assert push_metric(ctl, "bytes", "delta") == 0
    after = state(rt)
    assert after["resources_received"] == before["resources_received"], (before, after)
    assert after["resources"] == before["resources"]
    assert rt.get(port, "/a2/op0")[0] == 200

    # And a change after the reconnect still goes out, alone.
    ctl.put(api("api-1", "/a1", "echo", operations=[{"method": "GET", "path": "/new"}]))
    wait_routes([rt], port, "/a1/new", 200, timeout=5.0)
    ctl.wait_converged(1, min_version=v + 1)
    assert ctl.runtimes()["rt-re"]["resources_sent"] == 1


def test_nack_of_one_listener_leaves_the_other_applied(env):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    busy = taken.getsockname()[1]
    ctl = env.controller()
    b = env.backend("echo")
    good = free_port()
    ctl.apply([gw([("good", good), ("bad", busy)]), backend("echo", [b.port]),
               api("pets", "/pets", "echo")])
    rt = env.runtime("rt-nack", extra_args=DELTA)
    try:
        nack = wait_until(lambda: ctl.runtimes().get("rt-nack", {}).get("last_nack"), 10.0,
                          what="a NACK of the busy listener")
        assert nack["type"] == "listeners", nack
        assert "'bad'" in nack["message"] and "in use" in nack["message"], nack
        assert "'good'" not in nack["message"], nack
        # The other listener of the same response serves.
        wait_routes([rt], good, "/pets/1", 200, timeout=5.0)
        s = state(rt)
        assert list(s["resources"]["listeners"]) == ["good"], s
        assert rt.ready_status() == 200
        nacks = s["updates_nacked"]
        # Not re-sent on this stream: nothing more arrives while the
        # config stays the same.
        time.sleep(1.0)
        assert state(rt)["updates_nacked"] == nacks
        assert ctl.runtimes()["rt-nack"]["types"]["listeners"]["acked_version"] == "", \
            "listeners counted as acknowledged with one of them refused"
    finally:
        taken.close()
    # A new version of it (another port) is sent and applied.
    fixed = free_port()
    v = ctl.status()["config_version"]
    ctl.put(gw([("good", good), ("bad", fixed)]))
    ctl.wait_converged(1, min_version=v + 1)
    wait_routes([rt], fixed, "/pets/1", 200, timeout=5.0)
    assert sorted(state(rt)["resources"]["listeners"]) == ["bad", "good"]
    assert rt.get(good, "/pets/1")[0] == 200


def test_make_before_break_under_load_while_apis_and_backends_change(env):
    lab = env.net(2)
    ctl = env.controller()
    b1, b2 = env.backend("b1"), env.backend("b2")
    port = free_port()
    ctl.apply([gw([("http", port)], address="0.0.0.0"),
               backend("be-0", [(lab.hub_ip, b1.port)]), api("stable", "/stable", "be-0")])
    # A delta runtime and a sotw one, under the same load and changes.
    rts = [env.runtime("rt-a", extra_args=DELTA),
           env.runtime("rt-b", extra_args=["--xds-mode", "sotw"])]
    v0 = ctl.wait_converged(2)
    for rt in rts:
        rt.wait_ready()
    load = Load([(rt.host, port) for rt in rts], "/stable/ping", keepalive=3, fresh=1,
                pause_s=0.002).start()
    try:
        for i in range(1, 41):
            ctl.put(backend("be-%d" % i, [(lab.hub_ip, (b1 if i % 2 else b2).port)]))
            ctl.put(api("stable", "/stable", "be-%d" % i))
            ctl.delete("Backend", "be-%d" % (i - 1))
            if i % 3 == 0:
                ctl.put(api("extra-%d" % i, "/extra%d" % i, "be-%d" % i))
            if i % 3 == 1 and i > 4:
                ctl.delete("Api", "extra-%d" % (i - 4))
            time.sleep(0.05)
        time.sleep(0.5)
    finally:
        stats = load.stop()
    load.assert_clean(min_ok=200)
    assert b1.count("/ping") > 0 and b2.count("/ping") > 0
    final = ctl.status()["config_version"]
    assert final > v0
    ctl.wait_converged(2, min_version=final)
    for rt in rts:
        c = state(rt)
        assert c["updates_nacked"] == 0, c
    c = state(rts[0])
    assert list(c["resources"]["clusters"]) == ["default/be-40"], c
    print("make-before-break: %d requests answered" % stats.ok)


# --- the protocol from outside: a hand-written delta peer ---------------------------

def delta_sync(p, versions=None, subscribe=None):
    """Subscribes to every type in delta mode; receives and ACKs until every
    type answered; {type: response}."""
    from controller_env import TYPE_ORDER, TYPE_URLS
    names = {v: k for k, v in TYPE_URLS.items()}
    for t in TYPE_ORDER:
        kw = dict(type_url=TYPE_URLS[t], incremental=True,
                  initial_resource_versions=(versions or {}).get(t, {}))
        if subscribe and t in subscribe:
            kw["resource_names_subscribe"] = subscribe[t]
        p.send(**kw)
    got = {}
    while len(got) < len(TYPE_ORDER):
        r = p.recv(5.0)
        got.setdefault(names[r.type_url], []).append(r)
        p.send(type_url=r.type_url, incremental=True, response_nonce=r.nonce,
               version_info=r.version_info)
    return got


def test_delta_peer_initial_versions_subscriptions_and_mode(env):
    from controller_env import FakeRuntime, grpc_peer_available
    reason = grpc_peer_available()
    if reason:
        pytest.skip(reason)
    ctl, b, port = base_config(env, n_apis=4)
    ctl.wait_converged(0)
    peers = []
    try:
        p = FakeRuntime(ctl.stream_addr, "peer-1")
        peers.append(p)
        got = delta_sync(p)
        routes = {r.name: r.version for resp in got["routes"] for r in resp.resources}
        assert sorted(routes) == ["default/api-%d" % i for i in range(4)], routes
        assert all(len(v) == 16 for v in routes.values())
        # Every type answered once, empty ones too (secrets: none).
        assert [len(r.resources) for r in got["secrets"]] == [0]
        p.close()

        # Reconnect holding all but one route table, plus one that is gone
        # and one at a stale version: only the missing and the stale one are
        # sent, the gone one is removed.
        held = dict(routes)
        held.pop("default/api-0")
        held["default/api-1"] = "0000000000000000"
        held["default/ghost"] = "1111111111111111"
        clusters = {r.name: r.version for resp in got["clusters"] for r in resp.resources}
        listeners = {r.name: r.version for resp in got["listeners"] for r in resp.resources}
        p = FakeRuntime(ctl.stream_addr, "peer-1")
        peers.append(p)
        types = ["secrets", "consumers", "clusters", "settings", "routes", "listeners"]
        from controller_env import TYPE_URLS
        versions = {t: got[t][-1].version_info for t in types}
        for t in types:
            ivs = {"routes": held, "clusters": clusters, "listeners": listeners}.get(t, {})
            if t == "settings":
                ivs = {r.name: r.version for resp in got["settings"] for r in resp.resources}
            p.send(type_url=TYPE_URLS[t], incremental=True, version_info=versions[t],
                   initial_resource_versions=ivs)
        r = p.recv(5.0)
        assert r.type_url == TYPE_URLS["routes"], r
        assert sorted(x.name for x in r.resources) == ["default/api-0", "default/api-1"]
        assert list(r.removed_resources) == ["default/ghost"]
        p.send(type_url=r.type_url, incremental=True, response_nonce=r.nonce,
               version_info=r.version_info)
        assert p.no_response(0.5), "more was sent than the difference"
        p.close()

        # Subscribed to one route table by name: only it arrives; a later
        # subscription adds another; unsubscribing stops its updates.
        p = FakeRuntime(ctl.stream_addr, "peer-2")
        peers.append(p)
        got = delta_sync(p, subscribe={"routes": ["default/api-2"]})
        assert [x.name for resp in got["routes"] for x in resp.resources] == ["default/api-2"]
        p.send(type_url=TYPE_URLS["routes"], incremental=True,
               resource_names_subscribe=["default/api-3"])
        r = p.recv(5.0)
        assert [x.name for x in r.resources] == ["default/api-3"], r
        p.send(type_url=r.type_url, incremental=True, response_nonce=r.nonce,
               version_info=r.version_info)
        p.send(type_url=TYPE_URLS["routes"], incremental=True,
               resource_names_unsubscribe=["default/api-2"])
        ctl.put(api("api-2", "/a2", "echo", operations=[{"method": "GET", "path": "/z"}]))
        # The routes' version moves (an empty response says so), but the
        # unsubscribed table is not sent.
        if not p.no_response(1.0):
            r = p.recv(1.0)
            assert not r.resources and not r.removed_resources, r
            p.send(type_url=r.type_url, incremental=True, response_nonce=r.nonce,
                   version_info=r.version_info)
            assert p.no_response(0.5)

        # A stream keeps its mode: a sotw request on a delta stream ends it.
        p.send(type_url=TYPE_URLS["routes"], version_info="")
        code, details = p.end(5.0)
        assert "INVALID_ARGUMENT" in str(code) and "keeps the mode" in details, details
    finally:
        for p in peers:
            try:
                p.close()
            except Exception:
                pass


def test_runtime_restarted_from_its_cache_is_sent_only_what_changed(env, tmp_path):
    """--cache-dir: a runtime restarted while the controller is down serves
    its cache; when the controller is back it reports the cached resources
    (initial_resource_versions) and gets only the one Api changed meanwhile
    and the removal of the one deleted meanwhile, with no failed request."""
    cache = tmp_path / "cache"
    CACHE = ["--cache-dir", str(cache), "--cache-timeout", "1s"]
    ctl, b, port = base_config(env, n_apis=5)
    rt = env.runtime("rt-c", extra_args=DELTA + CACHE)
    ctl.wait_converged(1)
    wait_routes([rt], port, "/a4/op0", 200, timeout=5.0)
    wait_until((cache / "snapshot.bin").exists, 5.0, what="snapshot cached")
    rt.stop()
    ctl.stop()
    # One change while the runtime is away (the controller's store holds it).
    ctl.start()
    ctl.put(api("api-2", "/a2", "echo", operations=[{"method": "GET", "path": "/later"}]))
    ctl.delete("Api", "api-4")
    ctl.stop()

    rt2 = env.runtime("rt-c2", extra_args=DELTA + CACHE)
    wait_until(lambda: rt2.ready_status() == 200, 10.0, what="ready from the cache")
    assert rt2.metric("sluice_config_from_cache") == 1
    held = state(rt2)["resources"]
    assert sorted(held["routes"]) == ["default/api-%d" % i for i in range(5)], held
    load = Load([("127.0.0.1", port)], "/a0/op1", keepalive=2, fresh=1)
    load.start()
    try:
        ctl.start()
        wait_until(lambda: rt2.metric("sluice_config_from_cache") == 0, 15.0,
                   what="the controller's config to replace the cache")
        wait_routes([rt2], port, "/a2/later", 200, timeout=5.0)
        wait_routes([rt2], port, "/a4/op0", 404, timeout=5.0)
        ctl.wait_converged(1)
    finally:
        load.stop()
    load.assert_clean(min_ok=10)
    r = ctl.runtimes()["rt-c2"]
    assert r["resources_sent"] == 1, r
    c = state(rt2)
    assert c["synced"] and c["updates_nacked"] == 0, c
    assert rt2.get(port, "/a2/op0")[0] == 404
    assert sorted(c["resources"]["routes"]) == ["default/api-%d" % i for i in range(4)], c


def test_a_change_rebuilds_only_its_api_and_counters_of_the_others_survive(env):
    """The runtime shares what a push did not touch (architecture.md, "Config
    generations and RCU"): one Api changed -> one route table built, the
    other tables and every cluster taken from the previous generation, and
    the request counters of the untouched Apis go on from where they were."""
    ctl, b, port = base_config(env, n_apis=4)
    rt = env.runtime("rt-share", extra_args=DELTA)
    v = ctl.wait_converged(1)
    wait_routes([rt], port, "/a3/op2", 200, timeout=5.0)
    for _ in range(3):
        assert rt.get(port, "/a0/op1")[0] == 200

    def count(api_name, op):
        return rt.metric("sluice_requests_total", api="default/" + api_name, operation=op)

    def parts(kind, part):
        return rt.metric("sluice_generation_parts_%s_total" % kind, part=part)

    op = "GET /op1"
    # A response is counted just after it is sent.
    wait_until(lambda: count("api-0", op) == 3, 5.0, what="3 requests counted")
    before = {(k, p): parts(k, p) for k in ("built", "shared") for p in ("route_table", "cluster")}
    swaps = rt.metric("sluice_generation_swaps_total")

    ctl.put(api("api-2", "/a2", "echo",
                operations=[{"method": "GET", "path": "/op%d" % k} for k in range(4)]))
    ctl.wait_converged(1, min_version=v + 1)
    wait_routes([rt], port, "/a2/op3", 200, timeout=5.0)

    assert rt.metric("sluice_generation_swaps_total") == swaps + 1
    d = {key: parts(*key) - n for key, n in before.items()}
    assert d[("built", "route_table")] == 1, d
    assert d[("shared", "route_table")] == 3, d
    assert d[("built", "cluster")] == 0 and d[("shared", "cluster")] == 1, d
    # The untouched Api's counters did not reset; its routes still serve.
    assert count("api-0", op) == 3
    assert rt.get(port, "/a0/op1")[0] == 200
    wait_until(lambda: count("api-0", op) == 4, 5.0, what="the 4th request counted")
    assert rt.get(port, "/a2/op0")[0] == 200
    assert state(rt)["updates_nacked"] == 0
