"""The Api status's Programmed condition and status.fleets (issue 12): per
fleet, the version of the first snapshot that contains the Api's current
spec, the runtimes connected and how many of them run it; True when every
connected runtime runs it, else Pending, Rejected (a runtime NACKed it, the
reason cut short), NoRuntimes or NotAccepted. Computed when the status is
read, so ACKs, NACKs and disconnects show without a store write.

Real runtimes (one network namespace each: they share the listener port)
plus a protocol-level peer (controller_env.FakeRuntime) that NACKs the
routes of an Api change, as a runtime refusing a config does.

Run: SLUICE_BUILD=build /usr/bin/python3 -m pytest tests/integration/test_api_programmed.py
"""

import pytest

from controller_env import TYPE_URLS, FakeRuntime, grpc_peer_available, quickstart
from helpers import api, free_port, gateway, wait_until
from test_controller import env, petstore_api, wait_connected, wait_routes  # noqa: F401

NAMES = {v: k for k, v in TYPE_URLS.items()}


def programmed(ctl, name="petstore"):
    """(Programmed condition, status.fleets as {fleet: entry}, status)."""
    st = ctl.get("Api", name).get("status") or {}
    cond = [c for c in st.get("conditions", []) if c["type"] == "Programmed"]
    return (cond[0] if cond else None), {f["fleet"]: f for f in st.get("fleets", [])}, st


def wait_programmed(ctl, what, check, name="petstore", timeout=10.0):
    last = {}

    def ok():
        cond, fleets, st = programmed(ctl, name)
        last["st"] = st
        return cond is not None and check(cond, fleets) and (cond, fleets)
    try:
        return wait_until(ok, timeout, interval=0.02, what=what)
    except AssertionError:
        raise AssertionError("%s: status %r; runtimes %r" % (what, last.get("st"), ctl.runtimes()))


def routes_acked(ctl, node_id):
    return int(ctl.runtimes()[node_id]["types"]["routes"]["acked_version"] or 0)


def test_programmed_counts_the_runtimes_that_run_the_api(env):  # noqa: F811
    lab = env.net(2)
    ctl = env.controller()
    b = env.backend("echo")
    port = free_port()
    ctl.apply(quickstart(port, b.port, backend_host=lab.hub_ip))

    # Compiled, nobody connected.
    cond, fleets = wait_programmed(ctl, "NoRuntimes before any runtime",
                                   lambda c, f: c["reason"] == "NoRuntimes")
    assert cond["status"] == "False", cond
    assert cond["message"] == "no runtime of any fleet is connected", cond
    assert cond["observedGeneration"] == 1, cond
    v1 = fleets["default"]["version"]
    assert v1 > 0 and fleets["default"]["runtimes"] == 0 == fleets["default"]["programmed"]

    # One runtime ACKs: 1 of 1.
    rt_a = env.runtime("rt-a")
    cond, fleets = wait_programmed(ctl, "Programmed True on rt-a",
                                   lambda c, f: c["status"] == "True")
    assert cond["reason"] == "Programmed", cond
    assert cond["message"] == "fleet default: 1 of 1 runtime runs version %d" % v1, cond
    assert fleets["default"] == {"fleet": "default", "version": v1, "runtimes": 1,
                                 "programmed": 1}, fleets
    assert routes_acked(ctl, "rt-a") == v1
    wait_routes([rt_a], port, "/petstore/v1/pets", 200, timeout=5.0)

    # A second runtime: 2 of 2.
    rt_b = env.runtime("rt-b")
    cond, fleets = wait_programmed(
        ctl, "Programmed True on 2 runtimes",
        lambda c, f: c["status"] == "True" and f["default"]["runtimes"] == 2)
    assert cond["message"] == "fleet default: 2 of 2 runtimes run version %d" % v1, cond
    assert fleets["default"]["programmed"] == 2, fleets

    reason = grpc_peer_available()
    if reason:
        pytest.skip(reason)
    # A third runtime (a protocol-level peer) that has not ACKed yet: Pending.
    peer = FakeRuntime(ctl.stream_addr, "rt-peer")
    try:
        peer.subscribe()
        first = peer.recv()
        cond, fleets = wait_programmed(ctl, "Pending while rt-peer has not ACKed",
                                       lambda c, f: f["default"]["runtimes"] == 3)
        assert cond["status"] == "False" and cond["reason"] == "Pending", cond
        assert cond["message"] == "fleet default: 2 of 3 runtimes run version %d" % v1, cond
        peer.ack(first)
        got = {NAMES[first.type_url]}
        while len(got) < len(TYPE_URLS):
            r = peer.recv()
            got.add(NAMES[r.type_url])
            peer.ack(r)
        cond, _ = wait_programmed(ctl, "3 of 3", lambda c, f: c["status"] == "True")
        assert cond["message"] == "fleet default: 3 of 3 runtimes run version %d" % v1, cond

        # An Api change the peer refuses: the real runtimes run it, the
        # peer NACKs its routes -> Rejected, with the reason cut short.
        ctl.put(petstore_api([("GET", "/pets"), ("GET", "/owners")]))
        # A long reason (a runtime's NACK may carry a whole error list): the
        # condition keeps its first 200 bytes and marks the cut with "...".
        why = "route table petstore refused: " + "operation 7: path regex too large; " * 12
        while True:
            r = peer.recv()
            if NAMES[r.type_url] == "routes":
                v2 = int(r.version_info)
                peer.nack(r, why, version=str(v1))
                break
            peer.ack(r)
        assert v2 > v1
        wait_routes([rt_a, rt_b], port, "/petstore/v1/owners", 200, timeout=5.0)
        cond, fleets = wait_programmed(ctl, "Rejected by rt-peer",
                                       lambda c, f: c["reason"] == "Rejected")
        assert cond["status"] == "False", cond
        assert cond["observedGeneration"] == 2, cond
        assert cond["message"].startswith(
            "fleet default: 2 of 3 runtimes run version %d; 1 runtime rejected it, rt-peer "
            "NACKed routes version %d: %s" % (v2, v2, why[:200])), cond
        assert cond["message"].endswith(why[:200] + "..."), cond
        assert why[:201] not in cond["message"], cond  # the 450-byte reason is cut short
        assert fleets["default"] == {"fleet": "default", "version": v2, "runtimes": 3,
                                     "programmed": 2}, fleets
        assert routes_acked(ctl, "rt-a") >= v2 and routes_acked(ctl, "rt-peer") == v1
    finally:
        peer.close()

    # The peer disconnects: every connected runtime runs it again.
    cond, fleets = wait_programmed(ctl, "2 of 2 after rt-peer left",
                                   lambda c, f: c["status"] == "True")
    assert cond["message"] == "fleet default: 2 of 2 runtimes run version %d" % v2, cond

    # The runtimes stop: NoRuntimes, the version stays.
    rt_a.stop()
    rt_b.stop()
    cond, fleets = wait_programmed(ctl, "NoRuntimes after the runtimes stopped",
                                   lambda c, f: c["reason"] == "NoRuntimes")
    assert cond["status"] == "False", cond
    assert fleets["default"] == {"fleet": "default", "version": v2, "runtimes": 0,
                                 "programmed": 0}, fleets


def test_programmed_is_false_for_an_api_left_out_and_untouched_versions(env):  # noqa: F811
    """An Api the fleets' snapshots do not contain (a missing Backend) is
    not Programmed; an Api whose spec did not change keeps its version when
    another Api changes."""
    ctl = env.controller()
    b = env.backend("echo")
    port = free_port()
    ctl.apply(quickstart(port, b.port, listener_address="127.0.0.1"))
    env.runtime("rt-one")
    cond, fleets = wait_programmed(ctl, "petstore programmed",
                                   lambda c, f: c["status"] == "True")
    v1 = fleets["default"]["version"]

    ctl.put(api("orphan", "/orphan", "nope"))
    cond, fleets = wait_programmed(ctl, "orphan not accepted",
                                   lambda c, f: c["reason"] == "NotAccepted", name="orphan")
    assert cond["status"] == "False", cond
    assert "not in the fleet's snapshot" in cond["message"], cond
    assert fleets["default"]["version"] == 0 and fleets["default"]["programmed"] == 0, fleets

    ctl.put(api("other", "/other", "echo"))
    cond, fleets = wait_programmed(ctl, "other programmed",
                                   lambda c, f: c["status"] == "True", name="other")
    assert fleets["default"]["version"] > v1, fleets
    cond, fleets, _ = programmed(ctl)
    assert cond["status"] == "True" and fleets["default"]["version"] == v1, (cond, fleets)

    # The list carries the same status.
    items = ctl.ok("GET", "/api/v1/apis", expect=(200,))["items"]
    conds = {i["metadata"]["name"]: [c for c in i["status"]["conditions"]
                                     if c["type"] == "Programmed"][0]["status"] for i in items}
    assert conds == {"petstore": "True", "other": "True", "orphan": "False"}, conds


# --- the Gateway's Programmed condition -------------------------------------------

def gw_programmed(ctl, name):
    """(Programmed condition, status.fleets as {fleet: entry}) of a Gateway."""
    st = ctl.get("Gateway", name).get("status") or {}
    cond = [c for c in st.get("conditions", []) if c["type"] == "Programmed"]
    return (cond[0] if cond else None), {f["fleet"]: f for f in st.get("fleets", [])}


def wait_gw(ctl, name, what, check, timeout=10.0):
    last = {}

    def ok():
        cond, fleets = gw_programmed(ctl, name)
        last["v"] = (cond, fleets)
        return cond is not None and check(cond, fleets) and (cond, fleets)
    try:
        return wait_until(ok, timeout, interval=0.02, what=what)
    except AssertionError:
        raise AssertionError("%s: %r; runtimes %r" % (what, last.get("v"), ctl.runtimes()))


def test_gateway_programmed_counts_the_runtimes_of_its_fleet(env):  # noqa: F811
    """A Gateway's fleet is its runtimes: Programmed says how many runtimes
    of that fleet run the listeners version that contains its spec; other
    fleets' runtimes do not count, an Api change does not move its version,
    a Gateway left out of the snapshot is NotAccepted."""
    ctl = env.controller()
    b = env.backend("echo")
    port = free_port()
    ctl.apply(quickstart(port, b.port, listener_address="127.0.0.1"))

    cond, fleets = wait_gw(ctl, "default", "NoRuntimes before any runtime",
                           lambda c, f: c["reason"] == "NoRuntimes")
    assert cond["status"] == "False", cond
    assert cond["message"] == "no runtime of fleet default is connected", cond
    assert cond["observedGeneration"] == 1, cond
    assert set(fleets) == {"default"}, fleets
    v1 = fleets["default"]["version"]
    assert v1 > 0, fleets

    # A Gateway of another fleet, which no runtime serves.
    ctl.put(gateway(free_port(), name="edge", fleet="edge"))
    cond, fleets = wait_gw(ctl, "edge", "edge NoRuntimes",
                           lambda c, f: c["reason"] == "NoRuntimes")
    assert cond["message"] == "no runtime of fleet edge is connected", cond
    assert set(fleets) == {"edge"} and fleets["edge"]["version"] > 0, fleets

    # A runtime of fleet default runs it: 1 of 1; fleet edge still has none.
    rt = env.runtime("rt-one")
    cond, fleets = wait_gw(ctl, "default", "default Programmed", lambda c, f: c["status"] == "True")
    assert cond["reason"] == "Programmed", cond
    assert cond["message"] == "fleet default: 1 of 1 runtime runs version %d" % v1, cond
    assert fleets == {"default": {"fleet": "default", "version": v1, "runtimes": 1,
                                  "programmed": 1}}, fleets
    wait_routes([rt], port, "/petstore/v1/pets", 200, timeout=5.0)
    cond, fleets = gw_programmed(ctl, "edge")
    assert cond["reason"] == "NoRuntimes" and fleets["edge"]["runtimes"] == 0, (cond, fleets)

    # An Api change leaves the Gateway's version alone.
    ctl.put(api("other", "/other", "echo"))
    wait_programmed(ctl, "other programmed", lambda c, f: c["status"] == "True", name="other")
    cond, fleets = gw_programmed(ctl, "default")
    assert cond["status"] == "True" and fleets["default"]["version"] == v1, (cond, fleets)

    # A Gateway change: a new listeners version, run by the runtime.
    gw = gateway(port, name="default", address="127.0.0.1")
    port2 = free_port()
    gw["spec"]["listeners"].append({"name": "http-2", "port": port2, "protocol": "http",
                                    "address": "127.0.0.1"})
    ctl.put(gw)
    cond, fleets = wait_gw(ctl, "default", "default Programmed at generation 2",
                           lambda c, f: c["status"] == "True" and c["observedGeneration"] == 2)
    v2 = fleets["default"]["version"]
    assert v2 > v1, fleets
    assert cond["message"] == "fleet default: 1 of 1 runtime runs version %d" % v2, cond
    wait_routes([rt], port2, "/petstore/v1/pets", 200, timeout=5.0)

    # A Gateway whose listener name clashes is left out: NotAccepted, in no
    # snapshot.
    ctl.put(gateway(free_port(), name="dup"))
    cond, fleets = wait_gw(ctl, "dup", "dup NotAccepted",
                           lambda c, f: c["reason"] == "NotAccepted")
    assert cond["status"] == "False", cond
    assert "not in the fleet's snapshot" in cond["message"], cond
    assert fleets["default"]["version"] == 0 and fleets["default"]["programmed"] == 0, fleets

    # The runtime stops: NoRuntimes, the version stays.
    rt.stop()
    cond, fleets = wait_gw(ctl, "default", "NoRuntimes after the runtime stopped",
                           lambda c, f: c["reason"] == "NoRuntimes")
    assert fleets["default"] == {"fleet": "default", "version": v2, "runtimes": 0,
                                 "programmed": 0}, fleets


def test_gateway_rejected_when_a_runtime_nacks_its_listeners(env):  # noqa: F811
    """A runtime that refuses the listeners version carrying a Gateway
    change makes the Gateway Rejected, naming the listeners NACK."""
    reason = grpc_peer_available()
    if reason:
        pytest.skip(reason)
    ctl = env.controller()
    b = env.backend("echo")
    port = free_port()
    ctl.apply(quickstart(port, b.port, listener_address="127.0.0.1"))
    peer = FakeRuntime(ctl.stream_addr, "rt-peer")
    try:
        peer.subscribe()
        got = set()
        while len(got) < len(TYPE_URLS):
            r = peer.recv()
            got.add(NAMES[r.type_url])
            peer.ack(r)
        cond, fleets = wait_gw(ctl, "default", "Programmed on rt-peer",
                               lambda c, f: c["status"] == "True")
        v1 = fleets["default"]["version"]
        assert cond["message"] == "fleet default: 1 of 1 runtime runs version %d" % v1, cond

        gw = gateway(free_port(), name="default", address="127.0.0.1")
        ctl.put(gw)
        while True:
            r = peer.recv()
            if NAMES[r.type_url] == "listeners":
                v2 = int(r.version_info)
                peer.nack(r, "listener http: address in use", version=str(v1))
                break
            peer.ack(r)
        assert v2 > v1
        cond, fleets = wait_gw(ctl, "default", "Rejected by rt-peer",
                               lambda c, f: c["reason"] == "Rejected")
        assert cond["status"] == "False" and cond["observedGeneration"] == 2, cond
        assert cond["message"] == (
            "fleet default: 0 of 1 runtime run version %d; 1 runtime rejected it, rt-peer "
            "NACKed listeners version %d: listener http: address in use" % (v2, v2)), cond
        assert fleets["default"] == {"fleet": "default", "version": v2, "runtimes": 1,
                                     "programmed": 0}, fleets
        # The Api, whose routes the peer ACKed, stays Programmed.
        cond, _, _ = programmed(ctl)
        assert cond["status"] == "True", cond
    finally:
        peer.close()
