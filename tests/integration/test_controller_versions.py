"""Versions never go backwards (issue 3): a controller whose store was
restored from an older backup meets runtimes that run newer versions than it
ever issued. It must move its version counter past theirs and push its
config under new versions: no runtime is offered a lower version (which the
runtime would refuse as a rollback), and the restored config is what they
serve afterwards.

Run: SLUICE_BUILD=build /usr/bin/python3 -m pytest tests/integration/test_controller_versions.py
"""

import shutil

from test_controller import env, wait_routes  # noqa: F401  (env is a fixture)
from controller_env import quickstart
from helpers import api, free_port, wait_until


def test_restored_store_continues_past_the_runtimes_versions(env):  # noqa: F811
    ctl = env.controller()
    b = env.backend("echo")
    port = free_port()
    ctl.apply(quickstart(port, b.port, listener_address="127.0.0.1"))
    rt = env.runtime("rt-versions")
    v_backup = ctl.wait_converged(1)
    rt.wait_ready()

    # The backup: the store as it is now.
    ctl.stop()
    backup = str(env.tmp / "backup")
    shutil.copytree(ctl.data_dir, backup)
    ctl.start()

    # Newer config: five changes (coalesced into fewer versions).
    for i in range(5):
        ctl.put(api("extra", "/extra", "echo",
                    operations=[{"method": "GET", "path": "/v%d" % j} for j in range(i + 1)]))
    wait_routes([rt], port, "/extra/v4", 200, 5.0)
    v_high = ctl.wait_converged(1, min_version=v_backup + 1)
    acked_before = rt.controller_state()["versions"]

    # Restore the old store; same ports, the runtime reconnects by itself.
    ctl.stop()
    shutil.rmtree(ctl.data_dir)
    shutil.copytree(backup, ctl.data_dir)
    ctl.start()

    v_new = ctl.wait_converged(1, min_version=v_high + 1, timeout=15.0)
    assert v_new > v_high
    assert ctl.status()["config_version"] > v_high
    # The restored config serves: the newer Api is gone, the old one works.
    wait_routes([rt], port, "/extra/v4", 404, 5.0)
    assert rt.get(port, "/petstore/v1/pets")[0] == 200
    # No version was ever offered below what the runtime ran.
    state = rt.controller_state()
    assert state["updates_nacked"] == 0, state
    for t, v in state["versions"].items():
        assert int(v) > int(acked_before[t] or 0), (t, v, acked_before)
    assert "refusing a rollback" not in rt.log()
    assert "newer than the store's" in ctl.log()
    info = ctl.runtimes()["rt-versions"]
    assert info["last_nack"] is None, info
