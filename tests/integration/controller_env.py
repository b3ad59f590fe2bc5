"""Harness for the controller integration tests and perf/propagation.py:
runs the real sluice-controller and sluice-runtime binaries in controller
mode.

Responsible for: a controller with its own data dir and free ports (start,
SIGTERM, kill -9, restart on the same data dir and ports), its REST API as
small JSON helpers, runtimes in controller mode (optionally each in its own
network namespace, see NetLab), waiting for convergence, a keep-alive load
generator that counts every failure, and judging the controller's log and
exit like helpers.Runtime judges a runtime's.

Not responsible for: the runtime process mechanics shared with the rest of
the suite (helpers.py: Runtime, free ports, raw HTTP clients, Prometheus
parser) nor the origin server (backend.py); this file reuses both.

Why network namespaces: every runtime of a fleet receives the same Gateway,
so two runtimes of one fleet listen on the same port, as they do on two
machines behind a load balancer. On one machine the second would (rightly)
fail with "address in use". NetLab gives each runtime its own namespace
(its own loopback and port space) joined to the test's namespace by a veth
pair; every address is private to this machine and routed locally: nothing
leaves the host. The controller's stream port and the origin servers listen
on the lab's hub address, reachable from every namespace. Needs root (or
CAP_NET_ADMIN + CAP_SYS_ADMIN), `ip` and `nsenter`.
"""

import ctypes
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

from helpers import (BAD_LOG_PATTERNS, ResponseReader, Runtime, build_dir, dump_docs, free_port,
                     http_request, metric_sum, parse_prometheus, wait_until)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
QUICKSTART = os.path.join(REPO, "examples", "quickstart.yaml")
API_VERSION = "gateway.sluice.dev/v1alpha1"
PLURALS = {"Gateway": "gateways", "Api": "apis", "Backend": "backends", "Consumer": "consumers",
           "Certificate": "certificates"}


def controller_binary():
    return os.path.join(build_dir(), "bin", "sluice-controller")


# --- network namespaces -------------------------------------------------------

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def thread_stacks(pid):
    """Every thread's backtrace of a process that does not do what a test
    waits for, so that a failure seen once in CI says where it stood."""
    if shutil.which("gdb") is None:
        return ""
    try:
        r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return "\n(gdb: %s)" % e
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("Thread ", "#"))]
    return "\n--- threads of pid %d ---\n%s" % (pid, "\n".join(lines)[-8000:])


def socket_states(pid):
    """The TCP sockets of a process and, for each peer port, the peer's side
    (`ss`: an accept queue's length shows as the listener's Recv-Q), and the
    stacks of this test process's threads (servers written in Python, such
    as the fake Kubernetes API server, run here)."""
    out = []
    try:
        r = subprocess.run(["ss", "-tanp"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=10)
        lines = r.stdout.splitlines()
        mine = [i for i, ln in enumerate(lines) if "pid=%d," % pid in ln]
        peers = set()
        for i in mine:
            f = lines[i].split()
            if len(f) >= 5 and f[0] == "ESTAB":
                peers.add(f[4].rsplit(":", 1)[-1])
        for i, ln in enumerate(lines):
            f = ln.split()
            if i in mine or (len(f) >= 4 and f[3].rsplit(":", 1)[-1] in peers):
                out.append(ln)
    except (OSError, subprocess.TimeoutExpired) as e:
        out.append("(ss: %s)" % e)
    import faulthandler
    import tempfile
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(f, all_threads=True)
        f.seek(0)
        py = f.read()
    return "\n--- TCP sockets of pid %d and their peers ---\n%s\n--- threads of the test ---\n%s" % (
        pid, "\n".join(out)[-6000:], py[-6000:])


def _ip(*args, check=True):
    r = subprocess.run(["ip"] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    if check and r.returncode != 0:
        raise RuntimeError("ip %s: %s" % (" ".join(args), r.stderr.strip()))
    return r


def netns_available():
    """None when NetLab can run here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "network namespaces need root (runtimes of one fleet share a port)"
    for tool in ("ip", "nsenter"):
        if shutil.which(tool) is None:
            return "%s is not installed" % tool
    return None


class NetLab:
    """`n` network namespaces, one per runtime, each with its own loopback
    and one veth to the test's namespace.

    hub_ip: an address of the test's namespace that every namespace reaches
    (controller stream, origin servers listen there). ip(i): the address of
    namespace i as seen from the test (its listeners, its admin port).
    """

    def __init__(self, n):
        self.n = n
        self.ns = []
        self.hub_dev = None
        for _ in range(20):
            lab = random.randint(1, 250)
            if _ip("link", "show", "slc%dhub" % lab, check=False).returncode != 0:
                break
        else:
            raise RuntimeError("no free lab number for the network namespaces")
        self.lab = lab
        self.hub_ip = "10.213.%d.1" % lab
        try:
            self.hub_dev = "slc%dhub" % lab
            _ip("link", "add", self.hub_dev, "type", "veth", "peer", "name", "slc%dhbp" % lab)
            _ip("addr", "add", self.hub_ip + "/32", "dev", self.hub_dev)
            _ip("link", "set", self.hub_dev, "up")
            _ip("link", "set", "slc%dhbp" % lab, "up")
            for i in range(n):
                self._add(i)
        except Exception:
            self.close()
            raise

    def name(self, i):
        return "slc%dr%d" % (self.lab, i)

    def ip(self, i):
        return "10.213.%d.%d" % (self.lab, 10 + i)

    def _add(self, i):
        ns, host_dev, ns_dev = self.name(i), "slc%dh%d" % (self.lab, i), "slc%dn%d" % (self.lab, i)
        _ip("netns", "del", ns, check=False)
        _ip("netns", "add", ns)
        self.ns.append(ns)
        _ip("link", "add", host_dev, "type", "veth", "peer", "name", ns_dev)
        _ip("link", "set", ns_dev, "netns", ns)
        _ip("link", "set", host_dev, "up")
        _ip("route", "add", self.ip(i) + "/32", "dev", host_dev, "src", self.hub_ip)
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "addr", "add", self.ip(i) + "/32", "dev", ns_dev)
        _ip("-n", ns, "link", "set", ns_dev, "up")
        _ip("-n", ns, "route", "add", self.hub_ip + "/32", "dev", ns_dev)
        _ip("-n", ns, "route", "add", "default", "via", self.hub_ip, "dev", ns_dev)

    def prefix(self, i):
        """argv prefix that runs a program inside namespace i (nsenter execs,
        so the pid is the program's)."""
        return ["nsenter", "--net=/run/netns/%s" % self.name(i), "--"]

    def socket_in(self, i, family=socket.AF_INET, type=socket.SOCK_STREAM):
        """A socket created inside namespace i (a socket stays in the
        namespace it was created in, whichever thread uses it later)."""
        out = {}

        def run():
            try:
                fd = os.open("/run/netns/%s" % self.name(i), os.O_RDONLY)
                try:
                    if _libc.setns(fd, CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), "setns")
                finally:
                    os.close(fd)
                out["sock"] = socket.socket(family, type)
            except Exception as e:  # reported in the caller's thread
                out["error"] = e

        t = threading.Thread(target=run)  # the thread dies in the namespace
        t.start()
        t.join()
        if "error" in out:
            raise out["error"]
        return out["sock"]

    def close(self):
        for ns in self.ns:
            _ip("netns", "del", ns, check=False)
        self.ns = []
        if self.hub_dev:
            _ip("link", "del", self.hub_dev, check=False)
            self.hub_dev = None


# --- the controller -----------------------------------------------------------

class RestError(AssertionError):
    pass


class Controller:
    """One sluice-controller process. Ports and the data dir survive
    restarts, so kill9() + start() is a restart on the same store."""

    def __init__(self, workdir, stream_host="127.0.0.1", resources=(), log_level="info",
                 extra_args=(), extra_env=None):
        self.workdir = str(workdir)
        self.extra_env = dict(extra_env or {})
        os.makedirs(self.workdir, exist_ok=True)
        self.data_dir = os.path.join(self.workdir, "data")
        self.log_path = os.path.join(self.workdir, "controller.log")
        self.rest_port = free_port()
        self.stream_host = stream_host
        self.stream_port = free_port()
        self.resources = list(resources)
        self.log_level = log_level
        self.extra_args = list(extra_args)
        self.proc = None
        self.procs = []  # every process started, judged at the end
        self.killed9 = set()

    @property
    def stream_addr(self):
        return "%s:%d" % (self.stream_host, self.stream_port)

    def argv(self):
        args = [controller_binary(), "--rest", "127.0.0.1:%d" % self.rest_port,
                "--stream", self.stream_addr, "--data-dir", self.data_dir,
                "--log-level", self.log_level]
        for r in self.resources:
            args += ["--resources", r]
        return args + self.extra_args

    def start(self, wait_ready=True, timeout=15.0):
        if not os.path.exists(controller_binary()):
            raise AssertionError("controller binary %s does not exist (build it: make BUILD=%s)"
                                 % (controller_binary(), os.path.relpath(build_dir(), REPO)))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, cwd=self.workdir,
                                         env=dict(Runtime.env(), **self.extra_env))
        self.procs.append(self.proc)
        if wait_ready:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout=15.0):
        why = "/readyz: never answered"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("sluice-controller exited with %s before becoming ready; "
                                     "log:\n%s" % (self.proc.returncode, self.log()[-4000:]))
            try:
                status, _, body = http_request("127.0.0.1", self.rest_port, "GET", "/readyz",
                                               timeout=0.5)
                if status == 200:
                    return
                why = "/readyz: %d %s" % (status, body[:600])
            except OSError as e:
                why = "/readyz: %s" % e
            time.sleep(0.02)
        raise AssertionError("sluice-controller not ready after %.0fs (%s); log:\n%s%s"
                             % (timeout, why, self.log()[-4000:], thread_stacks(self.proc.pid)
                                + socket_states(self.proc.pid)))

    def kill9(self):
        self.killed9.add(self.proc.pid)
        self.proc.kill()
        self.proc.wait(5)

    def stop(self, timeout=15.0):
        """SIGTERM and wait; SIGKILL if it hangs (a problem)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.hung = True
            self.killed9.add(self.proc.pid)
            self.proc.kill()
            self.proc.wait(5)

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def problems(self):
        out = []
        log = self.log()
        for pat in BAD_LOG_PATTERNS:
            m = pat.search(log)
            if m:
                out.append("controller log contains %r" % m.group(0))
        if getattr(self, "hung", False):
            out.append("controller did not exit after SIGTERM (killed with SIGKILL)")
        for p in self.procs:
            rc = p.poll()
            if rc is None or p.pid in self.killed9:
                continue
            if rc < 0:
                out.append("controller pid %d died by signal %s" % (p.pid, signal.Signals(-rc).name))
            elif rc != 0:
                out.append("controller pid %d exit code %d" % (p.pid, rc))
        return out

    # -- REST --------------------------------------------------------------
    def rest(self, method, path, body=None, ctype="application/json", headers=None,
             timeout=30.0):
        """(status, headers, parsed JSON body or raw bytes)."""
        hdrs = dict(headers or {})
        data = None
        if body is not None:
            if isinstance(body, (dict, list)):
                data = json.dumps(body).encode()
            elif isinstance(body, str):
                data = body.encode()
            else:
                data = body
            hdrs["Content-Type"] = ctype
        status, rh, raw = http_request("127.0.0.1", self.rest_port, method, path, headers=hdrs,
                                       body=data, timeout=timeout)
        try:
            doc = json.loads(raw) if raw else None
        except ValueError:
            doc = raw
        return status, rh, doc

    def ok(self, method, path, body=None, ctype="application/json", expect=(200, 201)):
        status, _, doc = self.rest(method, path, body, ctype)
        if status not in expect:
            raise RestError("%s %s: %d %s" % (method, path, status, json.dumps(doc)[:2000]
                                             if not isinstance(doc, bytes) else doc[:2000]))
        return doc

    def apply(self, docs):
        """POST /api/v1/resources with a list of resource dicts or YAML text."""
        text = docs if isinstance(docs, str) else dump_docs(docs)
        return self.ok("POST", "/api/v1/resources", text, "application/yaml")

    def put(self, doc):
        plural = PLURALS[doc["kind"]]
        return self.ok("PUT", "/api/v1/%s/%s" % (plural, doc["metadata"]["name"]), doc)

    def delete(self, kind, name):
        return self.ok("DELETE", "/api/v1/%s/%s" % (PLURALS[kind], name), expect=(200,))

    def get(self, kind, name):
        return self.ok("GET", "/api/v1/%s/%s" % (PLURALS[kind], name), expect=(200,))

    def runtimes(self):
        """node_id -> item of GET /api/v1/runtimes."""
        doc = self.ok("GET", "/api/v1/runtimes", expect=(200,))
        return {r["node_id"]: r for r in doc["items"]}

    def status(self):
        return self.ok("GET", "/api/v1/status", expect=(200,))

    def metrics(self):
        status, _, raw = http_request("127.0.0.1", self.rest_port, "GET", "/metrics")
        assert status == 200, "controller GET /metrics: %d" % status
        return parse_prometheus(raw.decode())

    def metric(self, name, **labels):
        return metric_sum(self.metrics(), name, **labels)

    def fleet_status(self, fleet="default"):
        st = self.status()
        return st["config_version"], st["fleets"].get(fleet)

    def wait_converged(self, nruntimes, fleet="default", min_version=0, timeout=10.0):
        """Until the fleet's compiled version is >= min_version and
        `nruntimes` connected runtimes acknowledged every type of it.
        Returns the fleet's version."""
        last = {}

        def done():
            _, f = self.fleet_status(fleet)
            last["f"] = f
            return (f is not None and f["compiled"] and f["version"] >= min_version
                    and f["runtimes_at_version"] == nruntimes
                    and f["runtimes_connected"] == nruntimes and f["version"])

        try:
            return wait_until(done, timeout, interval=0.01, what="fleet converged")
        except AssertionError:
            raise AssertionError("fleet %s did not converge on %d runtimes at version >= %d in "
                                 "%.1fs: status %r, runtimes %s" % (
                                     fleet, nruntimes, min_version, timeout, last.get("f"),
                                     json.dumps(self.runtimes(), indent=1)[:4000]))


# --- runtimes in controller mode ----------------------------------------------

class ManagedRuntime(Runtime):
    """sluice-runtime --controller: helpers.Runtime with the controller's
    argv, reached at `host` (127.0.0.1, or its namespace's address)."""

    def __init__(self, workdir, controller_addr, node_id, fleet="default", workers=1,
                 lab=None, index=None, log_level="info", extra_args=()):
        super().__init__(workdir, [], workers=workers, log_level=log_level,
                         extra_args=extra_args)
        self.controller_addr = controller_addr
        self.node_id = node_id
        self.fleet = fleet
        self.lab = lab
        self.index = index
        self.host = lab.ip(index) if lab is not None else "127.0.0.1"

    def argv(self):
        prefix = self.lab.prefix(self.index) if self.lab is not None else []
        return prefix + [
            os.path.join(build_dir(), "bin", "sluice-runtime"),
            "--controller", self.controller_addr, "--node-id", self.node_id,
            "--fleet", self.fleet, "--workers", str(self.workers),
            # SLUICE_XDS_MODE=sotw runs every controller-mode test with
            # state-of-the-world streams (the runtime's default is delta).
            "--xds-mode", os.environ.get("SLUICE_XDS_MODE", "delta"),
            "--admin", "%s:%d" % (self.host, self.admin_port),
            "--access-log", self.access_log, "--log-level", self.log_level] + self.extra_args

    def admin_get(self, path, timeout=5.0):
        return http_request(self.host, self.admin_port, "GET", path, timeout=timeout)

    def ready_status(self):
        try:
            return self.admin_get("/ready", timeout=1.0)[0]
        except OSError:
            return None

    def controller_state(self):
        status, _, body = self.admin_get("/config_dump")
        assert status == 200, "GET /config_dump: %d" % status
        return json.loads(body)["controller"]

    def get(self, port, target, headers=None, timeout=5.0):
        """One request to this runtime's listener: (status, headers, body)."""
        return http_request(self.host, port, "GET", target, headers=headers, timeout=timeout)


# --- resources ------------------------------------------------------------------

def quickstart(listener_port, backend_port, backend_host="127.0.0.1", listener_address=None):
    """examples/quickstart.yaml as YAML text, the file users send, with its
    ports (and addresses) rewritten, as text: the file users send."""
    with open(QUICKSTART) as f:
        text = f.read()
    listener = "{name: http, port: %d, protocol: http%s}" % (
        listener_port, ", address: %s" % listener_address if listener_address else "")
    text, n1 = re.subn(r"\{name: http, port: 8080, protocol: http\}", listener, text)
    text, n2 = re.subn(r"\{address: 127\.0\.0\.1, port: 9001\}",
                       "{address: %s, port: %d}" % (backend_host, backend_port), text)
    assert n1 == 1 and n2 == 1, "examples/quickstart.yaml changed shape; update quickstart()"
    return text


# --- load -----------------------------------------------------------------------

class LoadStats:
    def __init__(self):
        self.lock = threading.Lock()
        self.ok = 0
        self.errors = []       # socket errors, protocol errors
        self.non2xx = []       # (target, status, body head)
        self.closed = []       # keep-alive connections lost or told to close
        self.keepalive_requests = {}  # connection index -> requests answered

    def add_ok(self, n=1):
        with self.lock:
            self.ok += n

    def failures(self):
        return {"errors": self.errors[:10], "non2xx": self.non2xx[:10], "closed": self.closed[:10],
                "counts": (len(self.errors), len(self.non2xx), len(self.closed))}


class Load:
    """Keep-alive clients (one persistent connection each, which must survive
    the whole run) plus clients opening a new connection per request.

    targets: list of (host, port); every target gets `keepalive` persistent
    connections and `fresh` new-connection threads. A failed keep-alive
    connection is recorded and reopened, so one failure does not hide the
    rest of the run.
    """

    def __init__(self, targets, path, keepalive=2, fresh=1, pause_s=0.0, timeout=5.0):
        self.targets = targets
        self.path = path
        self.keepalive = keepalive
        self.fresh = fresh
        self.pause_s = pause_s
        self.timeout = timeout
        self.stats = LoadStats()
        self._stop = threading.Event()
        self._threads = []
        self.socks = {}

    def _request(self, sock, reader, host, port):
        req = ("GET %s HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (self.path, host, port)).encode()
        sock.sendall(req)
        return reader.read_response("GET")

    def _keepalive(self, idx, host, port):
        st = self.stats
        sock = reader = None
        n = 0
        while not self._stop.is_set():
            try:
                if sock is None:
                    sock = socket.create_connection((host, port), timeout=self.timeout)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    reader = ResponseReader(sock)
                    self.socks[idx] = sock
                r = self._request(sock, reader, host, port)
                n += 1
                if not 200 <= r.status < 300:
                    with st.lock:
                        st.non2xx.append(("%s:%d%s" % (host, port, self.path), r.status,
                                          r.body[:200]))
                else:
                    st.add_ok()
                if (r.header("Connection") or "").lower() == "close":
                    raise EOFError("response said Connection: close after %d requests" % n)
            except (OSError, EOFError, AssertionError, ValueError) as e:
                with st.lock:
                    st.closed.append("keep-alive #%d to %s:%d after %d requests: %r"
                                     % (idx, host, port, n, e))
                if sock is not None:
                    sock.close()
                sock = None
            if self.pause_s:
                time.sleep(self.pause_s)
        with st.lock:
            st.keepalive_requests[idx] = n
        if sock is not None:
            sock.close()

    def _fresh(self, host, port):
        st = self.stats
        while not self._stop.is_set():
            try:
                status, _, body = http_request(host, port, "GET", self.path, timeout=self.timeout)
                if 200 <= status < 300:
                    st.add_ok()
                else:
                    with st.lock:
                        st.non2xx.append(("%s:%d%s" % (host, port, self.path), status, body[:200]))
            except (OSError, EOFError, AssertionError, ValueError) as e:
                with st.lock:
                    st.errors.append("new connection to %s:%d: %r" % (host, port, e))
            time.sleep(max(self.pause_s, 0.005))

    def start(self):
        idx = 0
        for host, port in self.targets:
            for _ in range(self.keepalive):
                t = threading.Thread(target=self._keepalive, args=(idx, host, port), daemon=True)
                idx += 1
                self._threads.append(t)
            for _ in range(self.fresh):
                self._threads.append(threading.Thread(target=self._fresh, args=(host, port),
                                                      daemon=True))
        for t in self._threads:
            t.start()
        return self

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout + 5)
        return self.stats

    def assert_clean(self, min_ok=1):
        st = self.stats
        f = st.failures()
        assert not st.errors and not st.non2xx and not st.closed, \
            "load saw failures: %s" % json.dumps(f, indent=1, default=str)
        assert st.ok >= min_ok, "only %d requests answered under load" % st.ok


def log_lines(text, pattern):
    rx = re.compile(pattern)
    return [line for line in text.splitlines() if rx.search(line)]


# --- an independent gRPC peer on the config stream ------------------------------
#
# Python grpcio (Debian python3-grpcio) with messages generated at test time by
# protoc from proto/sluice/v1/*.proto into a temporary directory (nothing
# generated is committed), and grpcio's generic API, so no gRPC codegen is
# needed. FakeRuntime plays a runtime against sluice-controller, FakeController
# a controller against sluice-runtime; both judge the C code from outside.

STREAM_METHOD = "/sluice.v1.ConfigDiscovery/Stream"
TYPE_URLS = {
    "secrets": "type.sluice.dev/sluice.v1.TlsCertificate",
    "consumers": "type.sluice.dev/sluice.v1.Consumer",
    "clusters": "type.sluice.dev/sluice.v1.Cluster",
    "settings": "type.sluice.dev/sluice.v1.GatewaySettings",
    "routes": "type.sluice.dev/sluice.v1.RouteTable",
    "listeners": "type.sluice.dev/sluice.v1.Listener",
}
TYPE_ORDER = ["secrets", "consumers", "clusters", "settings", "routes", "listeners"]
_pb = {}


def grpc_peer_available():
    """None when the Python gRPC peer can run here, else the reason."""
    try:
        import grpc  # noqa: F401
        import google.protobuf  # noqa: F401
    except ImportError as e:
        return "python3-grpcio / python3-protobuf not installed (make deps): %s" % e
    if shutil.which("protoc") is None:
        return "protoc not installed (protobuf-compiler; make deps)"
    return None


def pb():
    """The generated discovery_pb2 and snapshot_pb2 modules (protoc runs once
    per test process, into a temporary directory removed at exit)."""
    if not _pb:
        import atexit
        import importlib
        import sys
        import tempfile
        out = tempfile.mkdtemp(prefix="sluice-pb2-")
        atexit.register(shutil.rmtree, out, True)
        proto_dir = os.path.join(REPO, "proto")
        protos = [os.path.join(proto_dir, "sluice", "v1", f)
                  for f in sorted(os.listdir(os.path.join(proto_dir, "sluice", "v1")))
                  if f.endswith(".proto")]
        subprocess.run(["protoc", "--proto_path=" + proto_dir, "--python_out=" + out] + protos,
                       check=True)
        sys.path.insert(0, out)
        _pb["discovery"] = importlib.import_module("sluice.v1.discovery_pb2")
        _pb["snapshot"] = importlib.import_module("sluice.v1.snapshot_pb2")
    return _pb["discovery"], _pb["snapshot"]


class StreamEnded(AssertionError):
    pass


class FakeRuntime:
    """A runtime on the config stream, written from the protocol alone: one
    call to `addr`; requests are sent from a queue, responses collected by a
    thread. recv() returns the next DiscoveryResponse; end() waits for the
    call's status."""

    def __init__(self, addr, node_id=None, fleet="default"):
        import grpc
        import queue
        self.disc, _ = pb()
        self.node_id = node_id
        self.fleet = fleet
        self.channel = grpc.insecure_channel(addr)
        self._out = queue.Queue()
        self._in = queue.Queue()
        self.status = None  # (grpc.StatusCode, details) once the call ended
        self._ended = threading.Event()
        stream = self.channel.stream_stream(
            STREAM_METHOD, request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=self.disc.DiscoveryResponse.FromString)
        self.call = stream(self._requests(), wait_for_ready=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._node_sent = False

    def _requests(self):
        while True:
            m = self._out.get()
            if m is None:
                return
            yield m

    def _read(self):
        import grpc
        try:
            for resp in self.call:
                self._in.put(resp)
            self.status = (self.call.code(), self.call.details())
        except grpc.RpcError as e:
            self.status = (e.code(), e.details())
        self._ended.set()

    def send(self, **fields):
        """One DiscoveryRequest; the node goes with the first one unless
        node=False."""
        with_node = fields.pop("node", True)
        req = self.disc.DiscoveryRequest(**fields)
        if with_node and not self._node_sent and self.node_id is not None:
            req.node.id = self.node_id
            req.node.fleet = self.fleet
            req.node.build_version = "fake-runtime"
            self._node_sent = True
        self._out.put(req)

    def subscribe(self, types=TYPE_ORDER, versions=None):
        for t in types:
            self.send(type_url=TYPE_URLS.get(t, t),
                      version_info=(versions or {}).get(t, ""))

    def recv(self, timeout=5.0):
        import queue
        try:
            return self._in.get(timeout=timeout)
        except queue.Empty:
            if self._ended.is_set():
                raise StreamEnded("stream ended: %r" % (self.status,))
            raise AssertionError("no response within %.1fs" % timeout)

    def no_response(self, within):
        """True when nothing arrives within `within` seconds."""
        import queue
        try:
            resp = self._in.get(timeout=within)
        except queue.Empty:
            return True
        self._in.put(resp)
        return False

    def ack(self, resp):
        self.send(type_url=resp.type_url, version_info=resp.version_info,
                  response_nonce=resp.nonce)

    def nack(self, resp, message, version=""):
        req = dict(type_url=resp.type_url, version_info=version, response_nonce=resp.nonce)
        req["error_detail"] = self.disc.Status(code=3, message=message)
        self.send(**req)

    def sync(self, timeout=5.0):
        """Receives and ACKs until every type arrived; {type name: response}."""
        got = {}
        names = {v: k for k, v in TYPE_URLS.items()}
        while len(got) < len(TYPE_ORDER):
            r = self.recv(timeout)
            got[names[r.type_url]] = r
            self.ack(r)
        return got

    def end(self, timeout=5.0):
        if not self._ended.wait(timeout):
            raise AssertionError("stream still open after %.1fs" % timeout)
        return self.status

    def ended(self):
        return self._ended.is_set()

    def close(self):
        if self.channel is None:
            return
        self._out.put(None)
        self.call.cancel()
        self.channel.close()
        self.channel = None
        self._reader.join(5)


class FakeController:
    """A controller on the config stream: a grpcio server on 127.0.0.1:port
    (0 picks one). Every stream's requests go to `requests` as (stream index,
    DiscoveryRequest); respond(i, resp) queues a response on stream i.
    grpcio sends a stream's response headers only with its first response,
    as grpc-go and grpc-java servers do by default."""

    def __init__(self, port=0, headers_first=False):
        import queue
        self.disc, self.snap = pb()
        self.port = port
        # True: send the response headers as soon as a stream starts, as
        # sluice-controller does (for tests that are not about headers).
        self.headers_first = headers_first
        self.requests = queue.Queue()
        self.streams = []  # per stream: queue of responses to send
        self.server = None
        self.lock = threading.Lock()

    def _handler(self, request_iterator, context):
        import queue
        out = queue.Queue()
        with self.lock:
            idx = len(self.streams)
            self.streams.append(out)
        if self.headers_first:
            context.send_initial_metadata(())

        def reader():
            try:
                for req in request_iterator:
                    self.requests.put((idx, req, time.monotonic()))
            except Exception:  # the call ended
                pass
            out.put(None)

        threading.Thread(target=reader, daemon=True).start()
        while context.is_active():
            try:
                resp = out.get(timeout=0.1)
            except queue.Empty:
                continue
            if resp is None:
                return
            yield resp

    def start(self):
        import grpc
        from concurrent import futures
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        handler = grpc.method_handlers_generic_handler("sluice.v1.ConfigDiscovery", {
            "Stream": grpc.stream_stream_rpc_method_handler(
                self._handler, request_deserializer=self.disc.DiscoveryRequest.FromString,
                response_serializer=lambda m: m.SerializeToString())})
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:%d" % self.port)
        assert self.port, "fake controller: cannot listen"
        self.server.start()
        return self

    def stop(self):
        if self.server is not None:
            with self.lock:
                for q in self.streams:
                    q.put(None)
            self.server.stop(0).wait(5)
            self.server = None

    @property
    def addr(self):
        return "127.0.0.1:%d" % self.port

    def next_request(self, timeout):
        """(stream index, DiscoveryRequest, monotonic arrival time)."""
        import queue
        try:
            return self.requests.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("fake controller: no request within %.1fs" % timeout)

    def respond(self, idx, type_name, version, resources=(), nonce=None):
        resp = self.disc.DiscoveryResponse(type_url=TYPE_URLS[type_name], version_info=version,
                                           nonce=nonce or "n-%s-%s" % (type_name, version))
        for name, msg in resources:
            resp.resources.add(name=name, type_url=TYPE_URLS[type_name],
                               value=msg.SerializeToString())
        self.streams[idx].put(resp)
        return resp
