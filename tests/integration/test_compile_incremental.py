"""The controller's compile visits only the resources whose document changed
(controller/core.c, resource facts): after a change of one Api, the
statuses and Programmed of the others stay as they were and the changed
one's are right; an Api whose own document did not change but whose
Backend appeared is compiled and programmed; --max-routes still counts
right after PUTs and DELETEs with compiles in between.

Run: SLUICE_BUILD=build /usr/bin/python3 -m pytest tests/integration/test_compile_incremental.py
"""

import time

from helpers import api, backend as backend_doc, free_port, gateway, wait_until
from test_exhaustion import ctl_env, ops  # noqa: F401


def status(ctl, name):
    return ctl.get("Api", name).get("status") or {}


def cond(st, kind):
    c = [c for c in st.get("conditions", []) if c["type"] == kind]
    return c[0] if c else None


def wait_compiled(ctl, after):
    """Until the controller compiled a config version past `after`."""
    return wait_until(lambda: ctl.status()["config_version"] > after and
                      ctl.status()["config_version"], 10, what="a compile past %d" % after)


def wait_programmed(ctl, name, version):
    def ok():
        st = status(ctl, name)
        p = cond(st, "Programmed")
        return p and p["status"] == "True" and \
            [f["version"] for f in st.get("fleets", [])] == [version] and st
    return wait_until(ok, 10, what="Api %s programmed at version %d" % (name, version))


def test_one_api_change_keeps_the_others_statuses(ctl_env, backends):  # noqa: F811
    b = backends("echo")
    ctl = ctl_env.controller()
    rt = ctl_env.runtime("rt-1")
    policy = [{"name": "headers", "config": {"response": {"set": {"X-P": "1"}}}}]
    port = free_port()
    ctl.apply([gateway(port), backend_doc("echo", [b.port]),
               api("a", "/a", "echo"), api("p", "/p", "echo", policies=policy),
               api("c", "/c", "missing")] +
              [api("n%d" % i, "/n%d" % i, "echo") for i in range(5)])
    v1 = ctl.wait_converged(1)
    rt.wait_ready()
    before = {n: wait_programmed(ctl, n, v1) for n in ["a", "p"] + ["n%d" % i for i in range(5)]}
    c_before = status(ctl, "c")
    assert cond(c_before, "Accepted")["reason"] == "Invalid", c_before
    assert cond(before["p"], "PolicyReady")["status"] == "True", before["p"]

    # One Api changes: only its status moves.
    ctl.put(api("a", "/a", "echo", operations=ops(3)))
    v2 = wait_compiled(ctl, v1)
    ctl.wait_converged(1, min_version=v2)
    st = wait_programmed(ctl, "a", v2)
    assert st["observedGeneration"] == 2 and cond(st, "Accepted")["status"] == "True", st
    assert cond(st, "Programmed")["observedGeneration"] == 2, st
    for n, was in before.items():
        if n != "a":
            assert status(ctl, n) == was, (n, status(ctl, n), was)
    assert status(ctl, "c") == c_before

    # One goes away, and comes back: a new resource, programmed at the newest version.
    ctl.delete("Api", "n2")
    v3 = wait_compiled(ctl, v2)
    assert ctl.rest("GET", "/api/v1/apis/n2")[0] == 404
    assert status(ctl, "n3") == before["n3"]
    ctl.put(api("n2", "/n2", "echo"))
    v4 = wait_compiled(ctl, v3)
    ctl.wait_converged(1, min_version=v4)
    assert wait_programmed(ctl, "n2", v4)["observedGeneration"] == 1
    assert status(ctl, "n3") == before["n3"]

    # Api c's document did not change, its Backend appeared: accepted and
    # programmed now; the Api with policies still has its PolicyReady.
    ctl.put(backend_doc("missing", [b.port]))
    v5 = wait_compiled(ctl, v4)
    ctl.wait_converged(1, min_version=v5)
    st = wait_programmed(ctl, "c", v5)
    assert cond(st, "Accepted")["status"] == "True", st
    assert status(ctl, "p") == before["p"]
    assert rt.get(port, "/c/x")[0] == 200


def test_max_routes_counts_after_put_and_delete(ctl_env, backends):  # noqa: F811
    b = backends("echo")
    ctl = ctl_env.controller(extra_args=["--max-routes", "50"])
    ctl.apply([gateway(free_port()), backend_doc("echo", [b.port])])

    def put(name, n):
        return ctl.rest("PUT", "/api/v1/apis/%s" % name,
                        api(name, "/" + name, "echo", operations=ops(n)))[0]

    def settle():
        # Let the compile that follows every write run (it recounts).
        time.sleep(0.3)

    assert put("a", 20) in (200, 201)
    settle()
    assert put("b", 20) in (200, 201)
    settle()
    assert put("c", 11) == 400  # 51
    settle()
    assert put("a", 30) in (200, 201)  # 30 + 20: at the limit
    settle()
    assert put("c", 1) == 400
    ctl.delete("Api", "b")
    settle()
    assert put("c", 21) == 400  # 51
    settle()
    assert put("c", 20) in (200, 201)  # 50
    settle()
    assert put("a", 31) == 400
    assert put("a", 10) in (200, 201)  # 30
    settle()
    assert put("b", 20) in (200, 201)  # 50
    settle()
    assert put("b", 21) == 400
