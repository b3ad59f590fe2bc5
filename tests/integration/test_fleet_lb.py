"""A horizontal fleet behind a load balancer (issue 12): three sluice-runtimes
of one fleet, each in its own network namespace (controller_env.NetLab), fed
by one sluice-controller, behind Debian's HAProxy in the test's namespace.

What is covered:
- after an Api is written through the REST API, every runtime acknowledges
  the same version (the controller's GET /api/v1/runtimes) and serves it;
- a rolling restart, one runtime at a time with SIGTERM, under keep-alive
  load through HAProxy the whole time: zero failed requests at the client.
  The runtimes run with `--drain-delay 2s`: on SIGTERM /ready turns 503 at
  once while the runtime keeps serving for 2 s; HAProxy's check takes it
  out; then it drains (listener closed, in-flight requests finished, idle
  keep-alive connections closed). Without the delay the runtime closed its
  listener and HAProxy's idle keep-alive connections in the same instant as
  /ready turned 503, and a request HAProxy was sending on such a connection
  was lost (HAProxy, `http-reuse safe`, then closes the client's connection
  without an answer): the first version of this test saw exactly that;
- kill -9 of one runtime under load: at most the requests in flight at that
  moment fail (bounded by the client connections, each has at most one
  request in flight), and once HAProxy's check marks it down every request
  succeeds;
- a fleet-wide rate limit through a real redis-server (rate-limit policy,
  mode: fleet) holds within 5% of limit x windows across the three runtimes
  that HAProxy round-robins over.

The load balancer configuration the test needs, and why (this is what an
operator would write; docs/operations.md "Scaling and upgrades" repeats it):

    balance roundrobin
    option httpchk GET /ready          # health check on each runtime's admin port
    http-check expect status 200
    default-server inter 200ms fall 2 rise 2
    http-reuse safe                    # HAProxy's default, stated
    retries 3
    option redispatch                  # a refused connection is retried elsewhere

`retries` + `option redispatch` is what every HAProxy deployment in front of
a pool has: between SIGTERM (the runtime closes its listener at once) and the
check marking it down (2 x 200 ms), HAProxy still picks that server; the
connection is refused before anything is sent, and HAProxy retries it on
another server. That is a connection failure, retried by HAProxy's default
`retry-on conn-failure`, safe for every method.

`retry-on` is deliberately NOT widened (no `empty-response`,
`response-timeout`, `all-retryable-errors`): those replay a request that a
server already received, which an operator may not do for POSTs, and which
would hide a runtime that drops in-flight requests on SIGTERM. So zero
failures during the rolling restart is the runtime's drain's doing, not
HAProxy's replay. It also means kill -9 does fail the requests that were in
flight on the killed runtime (HAProxy answers them 502): that is the bound
the kill -9 check asserts.

Window alignment of the rate-limit check: the fleet counts in fixed 1 s
windows aligned to Unix time (docs/policies/rate-limit.md). The client
stamps each answer with time.time() when the response arrives (same host,
same clock as the runtimes). A request admitted in window k is answered
after the window started, so its stamp is >= k; it can only be counted in
window k+1 if it was admitted at the very end of window k, and the load is
well above the limit, so each window's budget is gone long before its end
(the test asserts 429s in every window). Only whole windows between the
start and the end of the load are counted; the first starts at least 0.3 s
after the load did (the runtimes' Redis threads and first leases are warm).

Skipped (with the reason) without root / network namespaces, or without the
haproxy or redis-server binaries. Run:
SLUICE_BUILD=build /usr/bin/python3 -m pytest -q tests/integration/test_fleet_lb.py
"""

import csv
import io
import math
import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

from backend import Backend
from controller_env import Controller, Load, ManagedRuntime, NetLab, netns_available, quickstart
from helpers import ResponseReader, api, dump_docs, free_port, http_request, wait_until

NRUNTIMES = 3
LIMIT = 200          # requests per 1 s window, the whole fleet
WORKERS = 1
# After SIGTERM a runtime answers /ready 503 but keeps serving this long, so
# HAProxy's check (fall 2 x inter 200ms) takes it out before it closes its
# listener and idle connections: more than fall x inter, with a margin.
DRAIN_DELAY = "2s"


# --- HAProxy --------------------------------------------------------------------

class HAProxy:
    """haproxy -db (foreground) with a config written here; `servers` is a
    list of (name, address, port, check_port). Its stats socket tells the
    servers' states as HAProxy's checks see them."""

    def __init__(self, workdir, servers):
        self.workdir = str(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.port = free_port()
        self.servers = servers
        self.sock_path = os.path.join(self.workdir, "admin.sock")
        self.cfg_path = os.path.join(self.workdir, "haproxy.cfg")
        self.log_path = os.path.join(self.workdir, "haproxy.log")
        self.proc = None

    def config(self):
        lines = [
            "global",
            "    maxconn 4096",
            "    stats socket %s mode 600 level admin" % self.sock_path,
            "    log stderr format raw local0 info",
            "defaults",
            "    mode http",
            "    log global",
            "    option httplog",
            "    option dontlog-normal",        # log only failed/abnormal requests
            "    timeout connect 2s",
            "    timeout client 30s",
            "    timeout server 30s",
            "    timeout http-keep-alive 30s",
            "    timeout check 1s",
            "    retries 3",
            "    option redispatch",
            "frontend fe",
            "    bind 127.0.0.1:%d" % self.port,
            "    default_backend fleet",
            "backend fleet",
            "    balance roundrobin",
            "    option httpchk GET /ready",
            "    http-check expect status 200",
            "    http-reuse safe",
            "    default-server inter 200ms fall 2 rise 2",
        ]
        for name, addr, port, check_port in self.servers:
            lines.append("    server %s %s:%d check port %d" % (name, addr, port, check_port))
        return "\n".join(lines) + "\n"

    def start(self):
        with open(self.cfg_path, "w") as f:
            f.write(self.config())
        exe = shutil.which("haproxy") or "/usr/sbin/haproxy"
        check = subprocess.run([exe, "-c", "-f", self.cfg_path], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        assert check.returncode == 0, "haproxy -c refused the test's config:\n%s\n%s" % (
            check.stdout, self.config())
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([exe, "-db", "-f", self.cfg_path], stdout=self._log,
                                     stderr=self._log, stdin=subprocess.DEVNULL)

        def up():
            if self.proc.poll() is not None:
                raise AssertionError("haproxy exited with %s: %s" % (self.proc.returncode,
                                                                     self.log()[-2000:]))
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return os.path.exists(self.sock_path)
            except OSError:
                return False
        wait_until(up, 10, what="haproxy listening on 127.0.0.1:%d" % self.port)
        return self

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def command(self, text):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(self.sock_path)
        try:
            s.sendall(text.encode() + b"\n")
            out = b""
            while True:
                piece = s.recv(65536)
                if not piece:
                    break
                out += piece
        finally:
            s.close()
        return out.decode()

    def stats(self):
        """server name -> row of `show stat` (the fleet backend's servers)."""
        text = self.command("show stat").lstrip("# ")
        rows = csv.DictReader(io.StringIO(text))
        return {r["svname"]: r for r in rows
                if r["pxname"] == "fleet" and r["svname"] not in ("BACKEND", "FRONTEND")}

    def state(self, name):
        return self.stats()[name]["status"]

    def wait_state(self, name, want, timeout=10.0):
        wait_until(lambda: self.state(name) == want, timeout, interval=0.02,
                   what=lambda: "haproxy to see server %s %s (it says %r)"
                   % (name, want, self.state(name)))

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc is not None:
            self._log.close()
            self.proc = None


# --- Redis, reachable from every namespace ----------------------------------------

class Redis:
    def __init__(self, host):
        self.host = host
        self.port = free_port()
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([shutil.which("redis-server"), "--port", str(self.port),
                                      "--bind", self.host, "--protected-mode", "no",
                                      "--save", "", "--appendonly", "no"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self.ready, 10, what="redis-server on %s:%d" % (self.host, self.port))
        return self

    def ready(self):
        try:
            s = socket.create_connection((self.host, self.port), timeout=1)
        except OSError:
            return False
        try:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
        finally:
            s.close()

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


# --- the fleet ----------------------------------------------------------------------

def limited_api(redis):
    return {"apiVersion": "gateway.sluice.dev/v1alpha1", "kind": "Api",
            "metadata": {"name": "limited"},
            "spec": {"basePath": "/limited", "backendRefs": [{"name": "echo"}],
                     "policies": [{"name": "rate-limit", "config": {
                         "mode": "fleet", "redis": {"address": "%s:%d" % (redis.host, redis.port)},
                         "limits": [{"requests": LIMIT, "period": "1s", "by": "route"}]}}],
                     "operations": [{"method": "GET", "path": "/x"}]}}


class Fleet:
    """Every process of the module: lab, controller, origin, Redis, three
    runtimes, HAProxy. close() stops them and reports their problems."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.lab = self.ctl = self.origin = self.redis = self.lb = None
        self.rts = []
        self.problems = []
        self.killed9 = set()

    def start(self):
        reason = netns_available()
        if reason:
            pytest.skip(reason)
        for exe in ("haproxy", "redis-server"):
            if shutil.which(exe) is None:
                pytest.skip("%s is not installed (make deps)" % exe)
        self.lab = NetLab(NRUNTIMES)
        hub = self.lab.hub_ip
        self.ctl = Controller(self.tmp / "controller", stream_host=hub).start()
        self.origin = Backend(host=hub, name="echo").start()
        self.redis = Redis(hub).start()
        self.port = free_port()  # the listener port, the same in every namespace
        for i in range(NRUNTIMES):
            rt = ManagedRuntime(self.tmp / ("rt-%d" % i), self.ctl.stream_addr, "rt-%d" % i,
                                workers=WORKERS, lab=self.lab, index=i,
                                extra_args=["--drain-delay", DRAIN_DELAY])
            rt.start(wait_ready=False)
            self.rts.append(rt)
        self.ctl.apply(quickstart(self.port, self.origin.port, backend_host=hub)
                       + "---\n" + dump_docs([limited_api(self.redis)]))
        self.ctl.wait_converged(NRUNTIMES, timeout=15)
        for rt in self.rts:
            rt.wait_ready()
        self.lb = HAProxy(self.tmp / "haproxy",
                          [(rt.node_id, rt.host, self.port, rt.admin_port) for rt in self.rts])
        self.lb.start()
        self.all_up()
        return self

    def all_up(self, timeout=10.0):
        """Every runtime runs, is ready, and HAProxy says UP (a test that
        killed one leaves it to this)."""
        for rt in self.rts:
            if not rt.alive():
                self.restart(rt)
        for rt in self.rts:
            self.lb.wait_state(rt.node_id, "UP", timeout)

    def judge(self, rt, expect_exit_code=0, killed9=False):
        self.problems += ["runtime %s (pid %d): %s" % (rt.node_id, rt.pid, p)
                          for p in rt.problems(expect_exit_code)
                          if not (killed9 and p == "died by signal SIGKILL")]

    def restart(self, rt):
        """Start `rt` again (same node id, admin port, namespace) after it
        exited; waits until it is ready."""
        rt.stopped = rt.killed = False
        rt.start(wait_ready=True)

    def kill9(self, rt):
        self.killed9.add(rt.pid)
        rt.proc.kill()
        rt.proc.wait(5)
        rt.stopped = True
        rt._log.close()
        rt._out.close()
        self.judge(rt, expect_exit_code=None, killed9=True)  # the log: SIGKILL is the test's

    def close(self):
        if self.lb is not None:
            self.lb.stop()
        for rt in self.rts:
            if rt.proc is None or rt.stopped:
                continue
            rt.stop()
            self.judge(rt)
        if self.ctl is not None:
            self.ctl.stop()
            self.problems += self.ctl.problems()
        if self.origin is not None:
            self.origin.stop()
        if self.redis is not None:
            self.redis.stop()
        if self.lab is not None:
            self.lab.close()
        if self.problems:
            logs = "".join("\n--- runtime %s log (tail) ---\n%s" % (rt.node_id, rt.log()[-3000:])
                           for rt in self.rts)
            pytest.fail("\n".join(self.problems) + logs, pytrace=False)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    f = Fleet(tmp_path_factory.mktemp("fleet"))
    try:
        f.start()
        yield f
    finally:
        f.close()


@pytest.fixture
def up(fleet):
    fleet.all_up()
    return fleet


def downstream(rt):
    return rt.metric("sluice_downstream_requests_total")


def failed_requests(stats):
    """Requests that failed at the client: non-2xx answers, new-connection
    errors, and keep-alive requests that got no answer (a 'closed' entry that
    only says the answer carried Connection: close follows an answer already
    counted)."""
    lost = [c for c in stats.closed if "said Connection: close" not in c]
    return len(stats.non2xx) + len(stats.errors) + len(lost)


# --- 1: one version everywhere -----------------------------------------------------------

def test_every_runtime_serves_the_same_version(up):
    f = up
    _, fl = f.ctl.fleet_status()
    before = fl["version"]
    f.ctl.put(api("inventory", "/inventory", "echo"))
    version = f.ctl.wait_converged(NRUNTIMES, min_version=before + 1)
    assert version > before

    runtimes = f.ctl.runtimes()
    types = runtimes["rt-0"]["types"]
    for rt in f.rts:
        r = runtimes[rt.node_id]
        assert r["connected"] and r["fleet"] == "default", r
        assert r["acked_version"] == version, "runtime %s runs version %s, the fleet %d: %s" % (
            rt.node_id, r["acked_version"], version, r)
        assert r["types"] == types, "runtimes at different versions per type: %s" % runtimes
        assert r["last_nack"] is None, r
        # ... and serves it: the new Api answers on each runtime directly.
        status, _, _ = rt.get(f.port, "/inventory/item/1")
        assert status == 200, "runtime %s: GET /inventory/item/1 -> %d" % (rt.node_id, status)

    # Through HAProxy, round robin: every runtime serves the new Api.
    counts = [downstream(rt) for rt in f.rts]
    for i in range(3 * NRUNTIMES):
        status, _, _ = http_request("127.0.0.1", f.lb.port, "GET", "/inventory/item/%d" % i)
        assert status == 200, "through haproxy: %d" % status
    after = [downstream(rt) for rt in f.rts]
    assert all(a - b >= 1 for a, b in zip(after, counts)), (counts, after)


# --- 2: rolling restart under load -------------------------------------------------------

def test_rolling_restart_under_load_fails_no_request(up):
    f = up
    clients = 6
    load = Load([("127.0.0.1", f.lb.port)], "/petstore/v1/pets", keepalive=clients, fresh=2,
                pause_s=0.002).start()
    retr0 = {n: (int(s["wretr"] or 0), int(s["wredis"] or 0)) for n, s in f.lb.stats().items()}
    steps = []
    try:
        time.sleep(0.3)
        for rt in f.rts:
            t0 = time.monotonic()
            ok0 = load.stats.ok
            rt.signal(signal.SIGTERM)
            # --drain-delay: /ready says 503 at once, the listener still serves.
            wait_until(lambda: rt.ready_status() == 503, 0.5, interval=0.01,
                       what="%s /ready to answer 503 after SIGTERM" % rt.node_id)
            if rt is f.rts[0]:
                status, _, _ = rt.get(f.port, "/petstore/v1/pets", timeout=2)
                assert status == 200, "still serving during --drain-delay: %d" % status
            # HAProxy's check fails twice and takes it out, before the delay ends.
            f.lb.wait_state(rt.node_id, "DOWN", timeout=5)
            t_down = time.monotonic()
            assert rt.alive(), "%s exited before haproxy marked it down (%.2fs)" % (
                rt.node_id, t_down - t0)
            rc = rt.wait_exit(15)
            assert rc == 0, "runtime %s: exit %s after SIGTERM" % (rt.node_id, rc)
            rt.stop()  # closes its log files
            assert "serving for 2000 ms more (--drain-delay)" in rt.log(), rt.log()[-2000:]
            assert "--drain-delay over: draining" in rt.log(), rt.log()[-2000:]
            f.judge(rt)
            f.restart(rt)
            f.ctl.wait_converged(NRUNTIMES, timeout=10)
            f.lb.wait_state(rt.node_id, "UP", timeout=5)
            served0 = downstream(rt)
            wait_until(lambda: downstream(rt) > served0 + 5, 5,
                       what="haproxy to send requests to %s again" % rt.node_id)
            steps.append("%s: down after %.2fs, back after %.2fs, %d requests meanwhile"
                         % (rt.node_id, t_down - t0, time.monotonic() - t0, load.stats.ok - ok0))
        time.sleep(0.3)
    finally:
        stats = load.stop()
    lb = f.lb.stats()
    retries = {n: (int(s["wretr"] or 0) - retr0[n][0], int(s["wredis"] or 0) - retr0[n][1])
               for n, s in lb.items()}
    print("rolling restart: %d requests, %d failed; %s; haproxy (retries, redispatches): %s"
          % (stats.ok, failed_requests(stats), "; ".join(steps), retries))
    assert failed_requests(stats) == 0 and not stats.closed, \
        "rolling restart failed requests: %s\nhaproxy log:\n%s" % (
            stats.failures(), f.lb.log()[-3000:])
    load.assert_clean(min_ok=300)


# --- 3: a fleet-wide rate limit -------------------------------------------------------------

class Stamped:
    """Keep-alive clients through the load balancer that stamp every answer
    with its arrival time (time.time())."""

    def __init__(self, port, path, clients):
        self.port = port
        self.path = path
        self.clients = clients
        self.answers = []   # (time, status), per thread, merged at the end
        self.errors = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self):
        mine = []
        sock = None
        req = ("GET %s HTTP/1.1\r\nHost: fleet\r\n\r\n" % self.path).encode()
        while not self._stop.is_set():
            try:
                if sock is None:
                    sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    reader = ResponseReader(sock)
                sock.sendall(req)
                r = reader.read_response("GET")
                mine.append((time.time(), r.status))
                if (r.header("Connection") or "").lower() == "close":
                    sock.close()
                    sock = None
            except (OSError, EOFError, AssertionError, ValueError) as e:
                with self._lock:
                    self.errors.append(repr(e))
                if sock is not None:
                    sock.close()
                sock = None
        if sock is not None:
            sock.close()
        with self._lock:
            self.answers += mine

    def start(self):
        for t in self._threads:
            t.start()
        return self

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join(10)
        return sorted(self.answers)


def test_fleet_rate_limit_holds_within_5_percent(up):
    f = up
    lease = max(1, LIMIT // 50)  # docs/policies/rate-limit.md: lease = requests/50
    admitted_rt0 = [rt.metric("sluice_requests_total", api="default/limited", code_class="2xx")
                    for rt in f.rts]
    load = Stamped(f.lb.port, "/limited/x", clients=6)
    t_start = time.time()
    load.start()
    first = math.ceil(t_start + 0.3)
    windows = 5
    end = first + windows
    time.sleep(max(0.0, end - time.time() + 0.05))
    answers = load.stop()
    assert not load.errors, "connection errors: %s" % load.errors[:5]
    statuses = {s for _, s in answers}
    assert statuses <= {200, 429}, "answers other than 200/429: %s" % sorted(statuses)

    per_window = []
    for w in range(first, end):
        inw = [s for t, s in answers if w <= t < w + 1]
        per_window.append((sum(1 for s in inw if s == 200), sum(1 for s in inw if s == 429)))
    admitted = sum(a for a, _ in per_window)
    expected = LIMIT * windows
    admitted_rt = [rt.metric("sluice_requests_total", api="default/limited", code_class="2xx")
                   - a0 for rt, a0 in zip(f.rts, admitted_rt0)]
    print("fleet rate limit %d/s: admitted %d in %d whole windows (%.4f of limit x windows); "
          "per window (admitted, refused): %s; admitted per runtime over the run: %s"
          % (LIMIT, admitted, windows, admitted / expected, per_window, admitted_rt))
    for a, refused in per_window:
        # The load must exceed the limit in every window, or this proves nothing.
        assert refused > 0, "a window without a 429: the load did not reach the limit %s" \
            % per_window
        # The documented bound per window: requests +/- runtimes x lease.
        assert LIMIT - NRUNTIMES * lease <= a <= LIMIT + NRUNTIMES * lease, \
            "a window admitted %d (limit %d, bound +/-%d): %s" % (a, LIMIT, NRUNTIMES * lease,
                                                                   per_window)
    assert abs(admitted - expected) <= 0.05 * expected, \
        "admitted %d in %d windows, limit x windows %d: off by more than 5%%" % (
            admitted, windows, expected)
    # Round robin spread the admitted requests over the three runtimes.
    assert all(a > 0.15 * admitted for a in admitted_rt), admitted_rt


# --- 4: kill -9 under load ---------------------------------------------------------------------

def test_kill9_fails_only_requests_in_flight_then_routed_around(up):
    f = up
    clients, fresh = 6, 2
    in_flight_max = clients + fresh  # each client has at most one request in flight
    load = Load([("127.0.0.1", f.lb.port)], "/petstore/v1/pets", keepalive=clients, fresh=fresh,
                pause_s=0.002).start()
    victim = f.rts[1]
    try:
        time.sleep(0.5)
        assert failed_requests(load.stats) == 0, load.stats.failures()
        f.kill9(victim)
        t_kill = time.monotonic()
        f.lb.wait_state(victim.node_id, "DOWN", timeout=5)
        t_down = time.monotonic()
        failed_at_down = failed_requests(load.stats)
        ok_at_down = load.stats.ok
        time.sleep(1.0)  # two runtimes serve everything now
        failed_after = failed_requests(load.stats) - failed_at_down
        ok_after = load.stats.ok - ok_at_down
        # And it comes back.
        f.restart(victim)
        f.lb.wait_state(victim.node_id, "UP", timeout=5)
        served0 = downstream(victim)
        wait_until(lambda: downstream(victim) > served0 + 5, 5,
                   what="haproxy to send requests to %s again" % victim.node_id)
        failed_end = failed_requests(load.stats)
    finally:
        stats = load.stop()
    print("kill -9: %d failed up to DOWN (%.2fs after the kill), %d failed after it while %d "
          "succeeded; %d requests in all; failures %s"
          % (failed_at_down, t_down - t_kill, failed_after, ok_after, stats.ok,
             stats.failures()))
    assert failed_at_down <= in_flight_max, \
        "kill -9 failed %d requests, more than the %d client connections in flight: %s" % (
            failed_at_down, in_flight_max, stats.failures())
    assert failed_after == 0, "requests failed after haproxy marked %s down: %s" % (
        victim.node_id, stats.failures())
    assert ok_after > 100, "only %d requests answered by the two remaining runtimes" % ok_after
    assert failed_end == failed_at_down, "requests failed when %s came back: %s" % (
        victim.node_id, stats.failures())
    for status_entry in stats.non2xx:
        assert status_entry[1] in (502, 503), stats.failures()
