"""The controller compiles per resource (issue 14): a change recompiles only
the resources it touches, and a compile does not re-read the store.

With a real controller and runtime: a Backend change recompiles that Backend
and exactly the Apis that reference it (at the Api level, in an operation,
as a mirror), counted by sluice_controller_compiled_resources_total, and the
runtime then sends those Apis' traffic to the Backend's new endpoint; an Api
change recompiles that Api only; every compile after the first reads the
in-memory set (sluice_controller_store_loads_total{from}), and a restarted
controller reads the database once and pushes nothing new.

Run: SLUICE_BUILD=build /usr/bin/python3 -m pytest tests/integration/test_compile_cache.py
"""

import pytest

from helpers import api, backend, free_port, wait_until
from test_controller import Env, wait_routes
from test_delta import gw


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    try:
        yield e
    finally:
        e.close()


def compiled(ctl):
    return ctl.metric("sluice_controller_compiled_resources_total")


def loads(ctl, source):
    return ctl.metric("sluice_controller_store_loads_total", **{"from": source})


def test_backend_change_recompiles_exactly_the_apis_that_reference_it(env):
    ctl = env.controller()
    echo, old, new = env.backend("echo"), env.backend("old"), env.backend("new")
    port = free_port()
    get = [{"method": "GET", "path": "/x"}]
    apis = [
        api("by-api", "/by-api", "other", operations=get),
        api("by-op", "/by-op", "echo",
            operations=[{"method": "GET", "path": "/x", "backendRefs": [{"name": "other"}]}]),
        api("by-mirror", "/by-mirror", "echo",
            operations=[{"method": "GET", "path": "/x",
                         "mirror": {"backend": "other", "percent": 100}}]),
    ] + [api("plain-%d" % i, "/plain%d" % i, "echo", operations=get) for i in range(4)]
    ctl.apply([gw([("http", port)]), backend("echo", [("127.0.0.1", echo.port)]),
               backend("other", [("127.0.0.1", old.port)])] + apis)
    rt = env.runtime("rt-1")
    v = ctl.wait_converged(1)
    wait_routes([rt], port, "/by-op/x", 200, timeout=5.0)

    def served_by(path, name):
        status, headers, _ = rt.get(port, path)
        h = {k.lower(): val for k, val in headers}
        return status == 200 and h.get("x-backend") == name
    assert served_by("/by-op/x", "old")

    # The Backend "other" moves to another endpoint: it and the three Apis
    # that name it are compiled again, nothing else.
    c0 = compiled(ctl)
    ctl.put(backend("other", [("127.0.0.1", new.port)]))
    v = ctl.wait_converged(1, min_version=v + 1)
    assert compiled(ctl) - c0 == 1 + 3
    wait_until(lambda: served_by("/by-op/x", "new"), 5.0, what="/by-op/x served by 'new'")
    assert served_by("/by-api/x", "new")
    assert served_by("/plain0/x", "echo")

    # One Api changed: that Api only.
    c1 = compiled(ctl)
    ctl.put(api("plain-2", "/plain2", "echo", operations=get + [{"method": "GET", "path": "/y"}]))
    ctl.wait_converged(1, min_version=v + 1)
    wait_routes([rt], port, "/plain2/y", 200, timeout=5.0)
    assert compiled(ctl) - c1 == 1

    # Every compile read the set kept in memory, none the database again.
    assert loads(ctl, "database") == 1
    assert loads(ctl, "memory") >= 2
    assert ctl.metric("sluice_controller_compile_cpu_seconds_total") > 0


def test_restarted_controller_compiles_from_scratch_what_it_had_cached(env):
    """After changes compiled incrementally, a controller restarted on the
    same store (a from-scratch compile of everything) gives every type the
    same content, hence the same version: the runtime is sent nothing."""
    ctl = env.controller()
    echo = env.backend("echo")
    port = free_port()
    ctl.apply([gw([("http", port)]), backend("echo", [("127.0.0.1", echo.port)]),
               backend("spare", [("127.0.0.1", echo.port)])] +
              [api("a%d" % i, "/a%d" % i, "echo") for i in range(4)])
    rt = env.runtime("rt-1")
    v = ctl.wait_converged(1)
    for k in range(3):
        ctl.put(api("a%d" % k, "/a%d" % k, "spare" if k % 2 else "echo",
                    operations=[{"method": "GET", "path": "/n%d" % k}]))
        v = ctl.wait_converged(1, min_version=v + 1)
    ctl.put(backend("spare", [("127.0.0.1", echo.port), ("127.0.0.1", echo.port + 1)]))
    v = ctl.wait_converged(1, min_version=v + 1)
    ctl.delete("Api", "a3")
    v = ctl.wait_converged(1, min_version=v + 1)
    wait_routes([rt], port, "/a2/n2", 200, timeout=5.0)
    before = rt.controller_state()
    assert loads(ctl, "database") == 1

    ctl.kill9()
    ctl.start()
    wait_until(lambda: ctl.runtimes().get("rt-1", {}).get("connected"), 15.0,
               what="runtime reconnected")
    assert ctl.wait_converged(1) == v
    r = ctl.runtimes()["rt-1"]
    assert r["resources_sent"] == 0, r
    after = rt.controller_state()
    assert after["resources_received"] == before["resources_received"], (before, after)
    assert after["resources"] == before["resources"]
    assert loads(ctl, "database") == 1
    assert rt.get(port, "/a2/n2")[0] == 200
