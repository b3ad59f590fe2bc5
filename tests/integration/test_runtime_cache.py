"""A runtime that starts without a controller (sluice-runtime --cache-dir),
and what follows every applied config in controller mode.

Covered: each snapshot applied from the controller is written to the cache
(mode 0600); a runtime restarted while the controller is down serves the
cached config after --cache-timeout and says so in /ready, /config_dump
and /metrics; when the controller comes back the runtime moves to its
config under keep-alive load without a failed request; a damaged cache is
ignored with its reason and the runtime waits, unready, for the
controller. And active health checks run for a config that came from the
controller (they used to start only for --config files).

Run: SLUICE_BUILD=build /usr/bin/python3 -m pytest tests/integration/test_runtime_cache.py
"""

import json
import os
import stat
import time

import pytest

from controller_env import Load, quickstart
from helpers import api, backend as backend_doc, free_port, gateway, wait_until
from test_controller import Env


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    try:
        yield e
    finally:
        e.close()


def cache_args(cache_dir, timeout="1s"):
    return ["--cache-dir", str(cache_dir), "--cache-timeout", timeout]


def test_restart_without_controller_serves_the_cache(env, tmp_path):
    cache = tmp_path / "cache"
    ctl = env.controller()
    b = env.backend("echo")
    port = free_port()
    ctl.apply(quickstart(port, b.port, listener_address="127.0.0.1"))
    rt = env.runtime("rt-1", extra_args=cache_args(cache))
    wait_until(lambda: rt.ready_status() == 200, 15.0, what="runtime ready")
    assert rt.get(port, "/petstore/v1/pets")[0] == 200
    path = cache / "snapshot.bin"
    wait_until(path.exists, 5.0, what="the snapshot written to --cache-dir")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # it holds private keys
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    # Served from the controller: the cache is only a copy.
    assert rt.metric("sluice_config_from_cache") == 0
    version = ctl.status()["fleets"]["default"]["version"]

    rt.stop()
    ctl.stop()
    rt2 = env.runtime("rt-2", extra_args=cache_args(cache))
    t0 = time.monotonic()
    wait_until(lambda: rt2.ready_status() == 200, 10.0,
               what="the restarted runtime ready from its cache")
    waited = time.monotonic() - t0
    assert waited < 6.0, waited
    assert rt2.get(port, "/petstore/v1/pets")[0] == 200
    status, _, body = rt2.admin_get("/ready")
    assert status == 200
    assert body.decode().startswith("ready: serving the cached config version %d from %s"
                                    % (version, cache)), body
    dump = json.loads(rt2.admin_get("/config_dump")[2])
    assert dump["cache"]["serving"] is True and dump["cache"]["version"] == version, dump["cache"]
    assert dump["source"].startswith("cache %s/snapshot.bin" % cache), dump["source"]
    assert dump["controller"]["connected"] is False
    assert rt2.metric("sluice_config_from_cache") == 1
    assert "serving the cached config version %d" % version in rt2.log()

    # The controller comes back with a changed config: the runtime moves to
    # it under keep-alive load, with no failed request.
    load = Load([("127.0.0.1", port)], "/petstore/v1/pets", keepalive=2, fresh=1)
    load.start()
    try:
        time.sleep(0.3)
        ctl.start()
        wait_until(lambda: rt2.metric("sluice_config_from_cache") == 0, 15.0,
                   what="the controller's config to replace the cache")
        time.sleep(0.3)
    finally:
        load.stop()
    load.assert_clean(min_ok=20)
    status, _, body = rt2.admin_get("/ready")
    assert (status, body) == (200, b"ready\n")
    dump = json.loads(rt2.admin_get("/config_dump")[2])
    assert dump["cache"]["serving"] is False
    assert dump["source"].startswith("controller "), dump["source"]
    # ... and writes the controller's next config to the cache again.
    before = os.stat(path).st_mtime_ns
    ctl.put(backend_doc("spare", [b.port]))
    wait_until(lambda: os.stat(path).st_mtime_ns != before, 10.0,
               what="the next snapshot written to the cache")


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other-fleet"])
def test_damaged_cache_is_ignored(env, tmp_path, damage):
    cache = tmp_path / "cache"
    ctl = env.controller()
    b = env.backend("echo")
    port = free_port()
    ctl.apply(quickstart(port, b.port, listener_address="127.0.0.1"))
    rt = env.runtime("rt-1", extra_args=cache_args(cache))
    wait_until(lambda: rt.ready_status() == 200, 15.0, what="runtime ready")
    path = cache / "snapshot.bin"
    wait_until(path.exists, 5.0, what="the snapshot written to --cache-dir")
    rt.stop()
    ctl.stop()

    why = {"garbage": "not a sluice snapshot cache",
           "truncated": "truncated or corrupt",
           "other-fleet": 'this runtime is in fleet "edge"'}[damage]
    if damage == "garbage":
        path.write_bytes(b"x" * 500)
    elif damage == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[:len(data) // 2])
    kw = {"fleet": "edge"} if damage == "other-fleet" else {}
    rt2 = env.runtime("rt-2", extra_args=cache_args(cache), **kw)
    wait_until(lambda: "the cached config is ignored" in rt2.log(), 10.0,
               what="the runtime to refuse its cache")
    assert why in rt2.log(), rt2.log()[-2000:]
    # Nothing is served instead of a config it cannot trust.
    assert rt2.ready_status() == 503
    assert rt2.metric("sluice_config_from_cache") == 0


def test_runtime_without_cache_or_controller_says_so(env, tmp_path):
    ctl = env.controller(start=False)
    rt = env.runtime("rt-1", extra_args=cache_args(tmp_path / "empty"))
    wait_until(lambda: "no cached one" in rt.log(), 10.0, what="the log line")
    assert rt.ready_status() == 503
    del ctl


def test_health_checks_follow_the_controllers_config(env):
    """Regression: in controller mode active health checks never started
    (only a --config reload updated them)."""
    ctl = env.controller()
    a = env.backend("a")
    port = free_port()
    hc = {"path": "/health", "interval": "200ms", "timeout": "200ms",
          "unhealthyThreshold": 2, "healthyThreshold": 1}
    ctl.apply([gateway(port), backend_doc("pool", [a.port], healthCheck=hc),
               api("t", "/t", "pool")])
    rt = env.runtime("rt-1")
    wait_until(lambda: rt.ready_status() == 200, 15.0, what="runtime ready")
    wait_until(lambda: a.count("/health", False) >= 2, 10.0,
               what="health checks from a controller-managed runtime")
