"""pytest fixtures for the integration suite (run: /usr/bin/python3 -m pytest
tests/integration; SLUICE_BUILD selects the build dir, default "build").

Responsible for: per-test origin servers, per-test runtimes that are always
stopped and judged (sanitizer reports, "[alert]", death by signal, hang on
SIGTERM, non-zero exit fail the test), and a hard per-test time limit so a
hung runtime fails one test instead of the whole run.
Not responsible for: the runtime's behaviour (the test files) or the harness
mechanics (helpers.py).
"""

import os
import signal
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from backend import Backend  # noqa: E402
from clients import PROTOS, Proto  # noqa: E402
from helpers import Runtime, api, backend as backend_doc, free_port, gateway  # noqa: E402

TEST_TIME_LIMIT_S = int(os.environ.get("SLUICE_TEST_TIME_LIMIT", "120"))


class TestTimeout(Exception):
    pass


def _sluice_children():
    """The sluice-runtime and sluice-controller processes this pytest
    process started that still run (zombies, already ended, are not)."""
    me = os.getpid()
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) != me or fields[0] == "Z":
                continue
            with open("/proc/%s/cmdline" % d, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue
        if "/bin/sluice-runtime" in cmd or "/bin/sluice-controller" in cmd:
            found.append((int(d), cmd))
    return found


@pytest.fixture(scope="module", autouse=True)
def _no_process_left_running():
    """After a module (its module-scoped fixtures included), none of our
    processes may still run: a leaked runtime keeps reconnecting and
    loading the machine for every later test. Killed, then reported."""
    yield
    left = _sluice_children()
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, "left running after this module's tests: %s" % left


@pytest.fixture(autouse=True)
def _time_limit():
    def on_alarm(signum, frame):
        raise TestTimeout("test exceeded %d s (SLUICE_TEST_TIME_LIMIT)" % TEST_TIME_LIMIT_S)

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TEST_TIME_LIMIT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture
def backends():
    """Factory: backends(name=None, port=0) -> a started Backend."""
    started = []

    def make(name=None, port=0):
        b = Backend(port=port, name=name).start()
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


@pytest.fixture
def runtimes(tmp_path, request):
    """Factory: runtimes(config, **Runtime kwargs) -> a started Runtime.
    Teardown stops every runtime and fails the test on any problem."""
    made = []

    def make(config, start=True, expect_exit_code=0, **kw):
        rt = Runtime(tmp_path / ("rt%d" % len(made)), config, **kw)
        rt.expect_exit_code = expect_exit_code
        made.append(rt)
        if start:
            rt.start()
        return rt

    yield make
    problems = []
    for rt in made:
        if rt.proc is None:
            continue
        rt.stop()
        for p in rt.problems(rt.expect_exit_code):
            problems.append("sluice-runtime pid %d: %s" % (rt.pid, p))
    if problems:
        logs = "\n".join("--- log of pid %d (tail) ---\n%s" % (rt.pid, rt.log()[-6000:])
                         for rt in made if rt.proc is not None)
        pytest.fail("\n".join(problems) + "\n" + logs, pytrace=False)


class Env:
    """A runtime proxying Api "t" (basePath /t, every method and path) to one
    Backend "echo"."""

    def __init__(self, runtime, port, backend):
        self.runtime = runtime
        self.port = port
        self.backend = backend


@pytest.fixture(params=PROTOS)
def proto(request):
    """The protocol a request-level test runs over: every test that takes
    this fixture runs once per protocol (ids "http1" and "h2c"; select one
    with -k h2c). Make the Gateway with proto.gateway(port) (both listeners)
    and send with proto.request(port, ...); `simple` does the former itself
    when the test uses `proto`."""
    return Proto(request.param)


def simple_config(port, backend_ports, gw_kw=None, backend_kw=None, api_kw=None, proto=None):
    return [
        (proto.gateway if proto else gateway)(port, **(gw_kw or {})),
        backend_doc("echo", backend_ports, **(backend_kw or {})),
        api("t", "/t", "echo", **(api_kw or {})),
    ]


@pytest.fixture
def simple(backends, runtimes, request):
    """Factory: simple(gw_kw=, backend_kw=, api_kw=, **Runtime kwargs) -> Env.
    In a test that uses `proto` (or passes proto=Proto("h2c")), the Gateway
    also has the h2c listener."""
    p = request.getfixturevalue("proto") if "proto" in request.fixturenames else None

    def make(gw_kw=None, backend_kw=None, api_kw=None, proto=p, **kw):
        b = backends("echo")
        port = free_port()
        rt = runtimes(simple_config(port, [b.port], gw_kw, backend_kw, api_kw, proto), **kw)
        return Env(rt, port, b)

    return make
