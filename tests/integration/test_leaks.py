"""Leaks over a process's whole life (issue 4): a runtime that starts,
serves, reloads its config 100 times and exits, and a controller that takes
100 config changes with a runtime connected and exits.

How a leak fails a test: with a sanitized tree (SLUICE_BUILD pointing at a
`make SAN=address,undefined` build) LeakSanitizer reports at exit, and the
harness fails any process whose log holds a sanitizer report, so these tests
make sure exit goes through the normal shutdown (SIGTERM, exit code 0) and
judge the logs explicitly. With a normal build, the runtime also runs under
valgrind (when /usr/bin/valgrind exists) for a shorter variant, failing on
any definite leak or memory error. Independent of both, the runtime's own
gauge sluice_generations_alive must come back to 1 after the reloads: every
retired config generation was freed.

Not covered here: memory growth under load (perf/soak.sh) and bounded
memory per connection (test_exhaustion.py).
"""

import os
import re
import signal

import pytest

from controller_env import Controller, ManagedRuntime
from helpers import (ResponseReader, Runtime, api, backend as backend_doc, connect, free_port,
                     gateway, request, runtime_binary, wait_until)

VALGRIND = "/usr/bin/valgrind"


def sanitized_build():
    """True when the runtime under test was built with ASan (LeakSanitizer
    then reports at exit; valgrind cannot run it)."""
    with open(runtime_binary(), "rb") as f:
        return b"__asan_init" in f.read()


def configs(port, a_port, b_port):
    """Two configs that differ in every kind of object the runtime compiles:
    Apis (added, removed, operations changed), Backends (endpoints, pool),
    routes of every path type, and Gateway settings."""
    one = [gateway(port, timeouts={"requestHeader": "5s"}),
           backend_doc("a", [a_port]),
           backend_doc("b", [b_port], connectionPool={"maxIdle": 8}),
           api("t", "/t", backend_refs=[{"name": "a", "weight": 1}, {"name": "b", "weight": 1}],
               operations=[{"method": "*", "path": "/", "pathType": "prefix"}]),
           api("pets", "/pets", "a", operations=[
               {"method": "GET", "path": "/{id}"},
               {"method": "GET", "path": "^/[0-9]+/photos$", "pathType": "regex"},
               {"method": "POST", "path": "/"}])]
    two = [gateway(port, timeouts={"requestHeader": "6s"}, limits={"maxHeaderCount": 90}),
           backend_doc("a", [a_port, b_port]),
           api("t", "/t", "a", operations=[{"method": "*", "path": "/", "pathType": "prefix"}]),
           api("owners", "/owners", "a", hosts=["*.example.com", "api.test"], operations=[
               {"method": "GET", "path": "/{owner}/pets/{id}"},
               {"methods": ["PUT", "DELETE"], "path": "/{owner}", "headers": [
                   {"name": "x-tenant", "value": "a"}]}])]
    return one, two


def traffic(port):
    """A little of everything: keep-alive, a body, chunked, pipelining."""
    s = connect(port)
    reader = ResponseReader(s)
    try:
        for _ in range(5):
            assert request(port, "GET", "/t/echo", sock=s, reader=reader).status == 200
        assert request(port, "POST", "/t/echo", body=b"x" * 100000, sock=s,
                       reader=reader).status == 200
        assert request(port, "POST", "/t/echo", headers=[("Transfer-Encoding", "chunked")],
                       body=b"5\r\nhello\r\n0\r\n\r\n", sock=s, reader=reader).status == 200
        assert request(port, "GET", "/t/bytes/300000?chunked=1", sock=s,
                       reader=reader).status == 200
        s.sendall(b"GET /t/a HTTP/1.1\r\nHost: x\r\n\r\nGET /t/b HTTP/1.1\r\nHost: x\r\n\r\n")
        assert reader.read_response().status == 200
        assert reader.read_response().status == 200
    finally:
        s.close()
    # Gateway-generated answers too (404, 400).
    assert request(port, "GET", "/nowhere").status == 404
    s = connect(port)
    try:
        s.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nBad Header: x\r\n\r\n")
        assert ResponseReader(s).read_response().status == 400
    finally:
        s.close()


def reload_n(rt, port, docs, n, request_every=10):
    """n reloads alternating the configs in `docs`, with a keep-alive client
    that stays open across all of them and sends a request now and then."""
    s = connect(port)
    reader = ResponseReader(s)
    try:
        for i in range(n):
            rt.reload(docs[i % len(docs)], timeout=30)
            if i % request_every == 0:
                assert request(port, "GET", "/t/echo", sock=s, reader=reader).status == 200
    finally:
        s.close()


def assert_clean_exit(proc, what):
    """Stops `proc` (SIGTERM) and fails on any problem its log or exit shows."""
    proc.stop(timeout=60)
    problems = proc.problems(0) if isinstance(proc, Runtime) else proc.problems()
    assert not problems, "%s: %s\nlog tail:\n%s" % (what, problems, proc.log()[-6000:])


def test_runtime_100_reloads_then_sigterm_leaks_nothing(backends, runtimes):
    a, b = backends("a"), backends("b")
    port = free_port()
    one, two = configs(port, a.port, b.port)
    rt = runtimes(one, workers=2)
    traffic(port)
    gen0 = rt.generation()
    reload_n(rt, port, [two, one], 100)
    assert rt.generation() >= gen0 + 100
    traffic(port)
    # Every retired generation was freed once its grace period passed.
    wait_until(lambda: rt.metric("sluice_generations_alive") == 1, 10,
               what=lambda: "sluice_generations_alive == 1 after 100 reloads (is %r)"
               % rt.metric("sluice_generations_alive"))
    assert_clean_exit(rt, "sluice-runtime after 100 reloads%s"
                      % (" (LeakSanitizer)" if sanitized_build() else ""))


class CtlEnv:
    """A controller and managed runtimes, each judged at the end."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.ctl = None
        self.rts = []

    def controller(self):
        self.ctl = Controller(self.tmp / "controller")
        self.ctl.start()
        return self.ctl

    def runtime(self, node_id, workers=2):
        rt = ManagedRuntime(self.tmp / node_id, self.ctl.stream_addr, node_id, workers=workers)
        self.rts.append(rt)
        rt.start(wait_ready=False)
        return rt

    def close(self):
        for rt in self.rts:
            rt.stop()
        if self.ctl is not None:
            self.ctl.stop()


@pytest.fixture
def ctl_env(tmp_path):
    e = CtlEnv(tmp_path)
    try:
        yield e
    finally:
        e.close()


def test_controller_100_changes_with_runtime_connected_leaks_nothing(ctl_env, backends):
    a, b = backends("a"), backends("b")
    ctl = ctl_env.controller()
    rt = ctl_env.runtime("rt-leaks")
    port = free_port()
    one, two = configs(port, a.port, b.port)
    ctl.apply(one)
    ctl.wait_converged(1, timeout=20)
    rt.wait_ready()
    traffic(port)
    # 100 changes through every REST verb: replace, create, delete.
    for i in range(100):
        step = i % 4
        if step == 0:
            ctl.put(api("t", "/t", "b", operations=[
                {"method": "*", "path": "/", "pathType": "prefix"},
                {"method": "GET", "path": "/v%d/{id}" % i}]))
        elif step == 1:
            ctl.put(backend_doc("b", [b.port, a.port], connectionPool={"maxIdle": i}))
        elif step == 2:
            ctl.ok("POST", "/api/v1/apis", api("extra%d" % i, "/extra%d" % i, "a"))
        else:
            ctl.delete("Api", "extra%d" % (i - 1))
    ctl.put(api("t", "/t", "a", operations=[{"method": "*", "path": "/", "pathType": "prefix"}]))
    ctl.wait_converged(1, min_version=0, timeout=30)
    wait_until(lambda: rt.get(port, "/t/echo")[0] == 200, 10, what="the final config serving")
    traffic(port)
    assert ctl.metric("sluice_controller_nacks_total") == 0
    wait_until(lambda: rt.metric("sluice_generations_alive") == 1, 10,
               what="old generations freed on the managed runtime")
    # Runtime first (its stream ends cleanly), then the controller.
    assert_clean_exit(rt, "managed sluice-runtime")
    assert_clean_exit(ctl, "sluice-controller after 100 changes")


class ValgrindRuntime(Runtime):
    """sluice-runtime under valgrind: exit code 99 on any definite leak or
    memory error (reported in valgrind.log)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.vg_log = os.path.join(self.workdir, "valgrind.log")

    def argv(self):
        return [VALGRIND, "--leak-check=full", "--errors-for-leak-kinds=definite",
                "--show-leak-kinds=definite", "--error-exitcode=99", "--num-callers=30",
                "--log-file=" + self.vg_log] + super().argv()


@pytest.mark.skipif(not os.path.exists(VALGRIND), reason="valgrind is not installed")
def test_runtime_under_valgrind_20_reloads_no_definite_leaks(backends, tmp_path):
    if sanitized_build():
        pytest.skip("valgrind cannot run an ASan build (this build is checked by "
                    "LeakSanitizer in the other tests)")
    a, b = backends("a"), backends("b")
    port = free_port()
    one, two = configs(port, a.port, b.port)
    rt = ValgrindRuntime(tmp_path / "vg", one, workers=1)
    try:
        rt.start(timeout=90)
        traffic(port)
        reload_n(rt, port, [two, one], 20, request_every=5)
        traffic(port)
        rt.signal(signal.SIGTERM)
        rc = rt.wait_exit(120)
    finally:
        if rt.alive():
            rt.proc.kill()
            rt.proc.wait(5)
        rt.stop()  # closes its log files; the process is gone by now
    with open(rt.vg_log) as f:
        vg = f.read()
    assert rc is not None, "runtime under valgrind did not exit within 120 s of SIGTERM"
    summary = re.search(r"ERROR SUMMARY: (\d+) errors", vg)
    lost = re.search(r"definitely lost: ([\d,]+) bytes", vg)
    assert summary, "no valgrind summary; log:\n%s" % vg[-4000:]
    assert rc == 0 and summary.group(1) == "0", \
        "valgrind: exit %s, %s errors; definite leaks: %s\n%s" % (
            rc, summary.group(1), lost.group(1) if lost else "0", vg[-8000:])
    assert lost is None or lost.group(1) == "0", vg[-8000:]
    assert not [p for p in rt.problems(0) if "exit code" not in p], rt.log()[-4000:]
