"""Harness for the integration tests: runs the real sluice-runtime binary.

Responsible for: picking free loopback ports, writing resource files,
starting the runtime with its own admin port and waiting for /ready, sending
signals, reloading and waiting for the new generation, stopping it (SIGTERM,
then SIGKILL) and judging its exit: a sanitizer report, "runtime error:",
an "[alert]" line, death by a signal, a hang on shutdown or a non-zero exit
code fail the test.  Also small HTTP/1.1 clients on raw sockets for the tests
where exact bytes matter, and a Prometheus text parser.

Not responsible for: the origin server (backend.py) or test policy.
"""

import errno
import json
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
API_VERSION = "gateway.sluice.dev/v1alpha1"

# Lines that mean the runtime misbehaved, whatever the test checked.
BAD_LOG_PATTERNS = [
    re.compile(r"ERROR: AddressSanitizer"),
    re.compile(r"ERROR: LeakSanitizer"),
    re.compile(r"UndefinedBehaviorSanitizer"),
    re.compile(r"WARNING: ThreadSanitizer"),
    re.compile(r"runtime error:"),
    re.compile(r"\[alert\]"),
]


def build_dir():
    d = os.environ.get("SLUICE_BUILD", "build")
    return d if os.path.isabs(d) else os.path.join(REPO, d)


def runtime_binary():
    return os.path.join(build_dir(), "bin", "sluice-runtime")


_handed_out = set()


def _port_pool():
    """Ports below the kernel's ephemeral range (ip_local_port_range): no
    outgoing connection of any test can take one of them as its local port
    between free_port() and the bind that uses it (a runtime's listener
    failed with EADDRINUSE in CI that way)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    return (10000, low - 1) if low > 12000 else None


_POOL = _port_pool()
_rng = random.Random(os.getpid() ^ int(time.time()))


def free_port():
    """A TCP port free on 127.0.0.1 a moment ago (bound, then released) and
    never one this test process handed out before: two bind(0) calls in a
    row can return one port, which a test asking for a listener and an
    admin port before starting anything would give to one runtime (seen in
    CI). Taken below the ephemeral range where there is room (_port_pool)."""
    for _ in range(200):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            if _POOL:
                s.bind(("127.0.0.1", _rng.randint(*_POOL)))
            else:
                s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        except OSError:
            continue
        finally:
            s.close()
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no fresh port after 200 tries")


def closed_port():
    """A port nobody listens on: connecting to it is refused."""
    return free_port()


def wait_until(predicate, timeout, interval=0.02, what="condition"):
    """Polls predicate until it returns something true (returned). `what`
    names the condition; a callable is evaluated only on failure (so a log
    tail in the message is the one at the time of the failure)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    if callable(what):
        what = what()
    raise AssertionError("timed out after %.1fs waiting for %s" % (timeout, what))


# --- resources --------------------------------------------------------------

def gateway(port, name="default", address="127.0.0.1", limits=None, timeouts=None, via=None,
            fleet="default"):
    spec = {"fleet": fleet,
            "listeners": [{"name": "http", "port": port, "protocol": "http", "address": address}]}
    if limits:
        spec["limits"] = limits
    if timeouts:
        spec["timeouts"] = timeouts
    if via is not None:
        spec["via"] = via
    return {"apiVersion": API_VERSION, "kind": "Gateway", "metadata": {"name": name}, "spec": spec}


def backend(name, endpoints, **spec):
    """endpoints: ports (on 127.0.0.1), (address, port) pairs or dicts."""
    eps = []
    for e in endpoints:
        if isinstance(e, int):
            eps.append({"address": "127.0.0.1", "port": e})
        elif isinstance(e, tuple):
            eps.append({"address": e[0], "port": e[1]})
        else:
            eps.append(e)
    body = {"endpoints": eps}
    body.update(spec)
    return {"apiVersion": API_VERSION, "kind": "Backend", "metadata": {"name": name}, "spec": body}


def api(name, base_path, backend_name=None, operations=None, backend_refs=None, **spec):
    """An Api; by default one operation matching every method and every path
    under base_path."""
    body = {"basePath": base_path}
    if backend_refs is not None:
        body["backendRefs"] = backend_refs
    elif backend_name is not None:
        body["backendRefs"] = [{"name": backend_name}]
    body["operations"] = operations if operations is not None else [
        {"name": "all", "method": "*", "path": "/", "pathType": "prefix"}]
    body.update(spec)
    return {"apiVersion": API_VERSION, "kind": "Api", "metadata": {"name": name}, "spec": body}


class KubectlSafeDumper(yaml.SafeDumper):
    """PyYAML leaves y, Y, n and N plain, which kubectl's parser (YAML 1.1,
    go-yaml) reads as booleans, and which Sluice therefore refuses (a JWK's
    "n" and "y" members are keys like that): quote them."""


def _represent_str(dumper, value):
    if value in ("y", "Y", "n", "N"):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')
    return yaml.SafeDumper.represent_str(dumper, value)


KubectlSafeDumper.add_representer(str, _represent_str)


def dump_docs(docs):
    return yaml.dump_all(docs, Dumper=KubectlSafeDumper, sort_keys=False,
                         default_flow_style=False)


# --- the runtime process -----------------------------------------------------

class Runtime:
    """One sluice-runtime process with config in `workdir`.

    config: a list of resource dicts, or YAML text.  The runtime serves its
    listeners; `admin_port` is chosen here.  Use start()/stop(), or the
    `runtime` fixture of conftest.py, which also judges the process log.
    """

    def __init__(self, workdir, config, workers=2, access_log="off", access_log_format=None,
                 log_level="info", drain_timeout=None, extra_args=(), config_name="sluice.yaml"):
        self.workdir = str(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.config_path = os.path.join(self.workdir, config_name)
        self.log_path = os.path.join(self.workdir, "runtime.log")
        self.stdout_path = os.path.join(self.workdir, "runtime.stdout")
        self.admin_port = free_port()
        self.workers = workers
        self.access_log = access_log
        self.access_log_format = access_log_format
        self.log_level = log_level
        self.drain_timeout = drain_timeout
        self.extra_args = list(extra_args)
        self.proc = None
        self.killed = False
        self.stopped = False
        self.write_config(config)

    # config
    def write_config(self, config):
        text = config if isinstance(config, str) else dump_docs(config)
        tmp = self.config_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.config_path)

    def argv(self):
        args = [runtime_binary(), "--config", self.config_path, "--workers", str(self.workers),
                "--admin", "127.0.0.1:%d" % self.admin_port, "--access-log", self.access_log,
                "--log-level", self.log_level]
        if self.access_log_format:
            args += ["--access-log-format", self.access_log_format]
        if self.drain_timeout:
            args += ["--drain-timeout", self.drain_timeout]
        return args + self.extra_args

    @staticmethod
    def env():
        env = dict(os.environ)
        # A small quarantine keeps RSS measurements meaningful under ASan;
        # halt on the first report so it cannot scroll by unnoticed.
        env.setdefault("ASAN_OPTIONS", "detect_leaks=1:halt_on_error=1:quarantine_size_mb=16:"
                                       "malloc_context_size=20")
        env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
        env.setdefault("LSAN_OPTIONS", "report_objects=1")
        return env

    def start(self, wait_ready=True, timeout=15.0):
        if not os.path.exists(runtime_binary()):
            raise AssertionError("runtime binary %s does not exist (build it: make BUILD=%s)"
                                 % (runtime_binary(), os.path.relpath(build_dir(), REPO)))
        self._log = open(self.log_path, "ab")
        self._out = open(self.stdout_path, "ab")
        # A runtime started again after stop() is a new process that the
        # next stop() (the fixture's) must stop too: without this it was
        # left running after the test.
        self.stopped = False
        self.proc = subprocess.Popen(self.argv(), stdout=self._out, stderr=self._log,
                                     stdin=subprocess.DEVNULL, cwd=self.workdir, env=self.env())
        if wait_ready:
            self.wait_ready(timeout)
        return self

    @property
    def pid(self):
        return self.proc.pid

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def wait_ready(self, timeout=15.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("sluice-runtime exited with %s before becoming ready; log:\n%s"
                                     % (self.proc.returncode, self.log()))
            try:
                status, _, _ = self.admin_get("/ready", timeout=0.5)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.03)
        raise AssertionError("sluice-runtime not ready within %.0fs (admin 127.0.0.1:%d); log:\n%s"
                             % (timeout, self.admin_port, self.log()))

    def signal(self, sig):
        self.proc.send_signal(sig)

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, timeout):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout=15.0):
        """SIGTERM, wait, SIGKILL if it hangs. Returns the exit code."""
        if self.proc is None or self.stopped:
            return self.proc.returncode if self.proc else None
        self.stopped = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.killed = True
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        self._out.close()
        return self.proc.returncode

    def problems(self, expect_exit_code=0):
        """What went wrong with this process, judged after stop()."""
        out = []
        log = self.log()
        for pat in BAD_LOG_PATTERNS:
            m = pat.search(log)
            if m:
                out.append("process log contains %r" % m.group(0))
        if self.killed:
            out.append("did not exit after SIGTERM (killed with SIGKILL)")
        elif self.proc is not None and self.proc.returncode is not None:
            rc = self.proc.returncode
            if rc < 0:
                out.append("died by signal %s" % signal.Signals(-rc).name)
            elif expect_exit_code is not None and rc != expect_exit_code:
                out.append("exit code %d (expected %d)" % (rc, expect_exit_code))
        return out

    # admin
    def admin_get(self, path, timeout=5.0):
        return http_request("127.0.0.1", self.admin_port, "GET", path, timeout=timeout)

    def metrics(self):
        status, _, body = self.admin_get("/metrics")
        assert status == 200, "GET /metrics: %d %r" % (status, body[:200])
        return parse_prometheus(body.decode())

    def metric(self, name, **labels):
        return metric_sum(self.metrics(), name, **labels)

    def generation(self):
        return self.metric("sluice_generation_version")

    def reload(self, config, timeout=10.0):
        """Writes config, SIGHUP, waits until a newer generation is active."""
        before = self.generation()
        self.write_config(config)
        self.signal(signal.SIGHUP)
        wait_until(lambda: self.generation() > before, timeout,
                   what=lambda: "generation > %d after SIGHUP; log tail:\n%s"
                   % (before, self.log()[-2000:]))

    def reload_invalid(self, config, timeout=10.0):
        """Writes a bad config, SIGHUP, waits until the runtime counted the
        config error; asserts the generation did not change."""
        before_gen = self.generation()
        before_err = self.metric("sluice_config_errors_total")
        self.write_config(config)
        self.signal(signal.SIGHUP)
        wait_until(lambda: self.metric("sluice_config_errors_total") > before_err, timeout,
                   what=lambda: "sluice_config_errors_total to increase after a bad reload; "
                   "log:\n%s" % self.log()[-2000:])
        assert self.generation() == before_gen

    def wait_log(self, pattern, timeout=5.0):
        rx = re.compile(pattern)
        return wait_until(lambda: rx.search(self.log()), timeout,
                          what=lambda: "log line matching %r; log:\n%s"
                          % (pattern, self.log()[-2000:]))

    def rss_kb(self):
        with open("/proc/%d/status" % self.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0


class RssSampler:
    """Samples a process's VmRSS every `interval` seconds in a thread."""

    def __init__(self, runtime, interval=0.02):
        self.runtime = runtime
        self.interval = interval
        self.samples = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                self.samples.append(self.runtime.rss_kb())
            except OSError:
                return
            time.sleep(self.interval)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    @property
    def max_kb(self):
        return max(self.samples) if self.samples else 0


# --- metrics -----------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?\s*')


def parse_prometheus(text):
    """Text format 0.0.4 -> list of (name, {labels}, value). Strict enough to
    fail on malformed lines."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, "malformed metrics line: %r" % line
        labels = {}
        if m.group(3):
            pos = 0
            raw = m.group(3)
            while pos < len(raw):
                lm = _LABEL.match(raw, pos)
                assert lm, "malformed labels in metrics line: %r" % line
                labels[lm.group(1)] = lm.group(2)
                pos = lm.end()
        out.append((m.group(1), labels, float(m.group(4))))
    return out


def metric_sum(samples, name, **labels):
    total = 0.0
    for n, l, v in samples:
        if n == name and all(l.get(k) == val for k, val in labels.items()):
            total += v
    return total


# --- HTTP clients -------------------------------------------------------------

class Response:
    def __init__(self, version, status, reason, headers, body):
        self.version = version
        self.status = status
        self.reason = reason
        self.headers = headers  # list of (name, value)
        self.body = body

    def header(self, name, default=None):
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return default

    def header_all(self, name):
        return [v for k, v in self.headers if k.lower() == name.lower()]

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return "<Response %d %r %r>" % (self.status, self.headers, self.body[:300])


class ResponseReader:
    """Reads HTTP/1.x responses from a socket, one at a time, keeping any
    bytes that belong to the next one (pipelining)."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()
        self.eof = False

    def _fill(self):
        data = self.sock.recv(262144)
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def _line(self):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + 2]
                return line
            if not self._fill():
                raise EOFError("connection closed inside a line: %r" % bytes(self.buf[:200]))

    def _exact(self, n, sink=None):
        out = bytearray() if sink is None else None
        while n > 0:
            if not self.buf and sink is not None:
                data = self.sock.recv(min(n, 262144))
                if not data:
                    self.eof = True
                    raise EOFError("connection closed with %d body bytes missing" % n)
                sink(data)
                n -= len(data)
                continue
            if not self.buf and not self._fill():
                raise EOFError("connection closed with %d body bytes missing" % n)
            take = min(n, len(self.buf))
            piece = self.buf[:take]
            if sink is None:
                out += piece
            else:
                sink(bytes(piece))
            del self.buf[:take]
            n -= take
        return bytes(out) if out is not None else b""

    def read_response(self, method="GET", sink=None, skip_1xx=True):
        """Returns a Response; with sink, body pieces go to sink instead."""
        while True:
            while not self.buf and not self.eof:
                if not self._fill():
                    break
            if not self.buf and self.eof:
                raise EOFError("connection closed before a response")
            status_line = self._line().decode("latin-1")
            parts = status_line.split(" ", 2)
            assert len(parts) >= 2 and parts[0].startswith("HTTP/1."), \
                "bad status line %r" % status_line
            status = int(parts[1])
            headers = []
            while True:
                line = self._line()
                if line == b"":
                    break
                k, _, v = line.decode("latin-1").partition(":")
                headers.append((k, v.strip()))
            if 100 <= status < 200 and skip_1xx:
                continue
            resp = Response(parts[0], status, parts[2] if len(parts) > 2 else "", headers, b"")
            break
        te = (resp.header("Transfer-Encoding") or "").lower()
        cl = resp.header("Content-Length")
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return resp
        body = bytearray()
        add = sink if sink is not None else body.extend
        if "chunked" in te:
            while True:
                size = int(self._line().split(b";")[0], 16)
                if size == 0:
                    while self._line() != b"":
                        pass
                    break
                self._exact(size, add)
                assert self._line() == b"", "missing CRLF after chunk"
        elif cl is not None:
            self._exact(int(cl), add)
        else:
            while True:
                if self.buf:
                    add(bytes(self.buf))
                    self.buf.clear()
                if not self._fill():
                    break
        resp.body = bytes(body)
        return resp


def connect(port, host="127.0.0.1", timeout=5.0):
    s = socket.create_connection((host, port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def http_request(host, port, method, target, headers=None, body=None, timeout=5.0,
                 version="HTTP/1.1"):
    """One request on a fresh connection (Connection: close). Returns
    (status, headers, body)."""
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        hdrs = [("Host", "%s:%d" % (host, port)), ("Connection", "close")]
        hdrs += list((headers or {}).items()) if isinstance(headers, dict) else list(headers or [])
        if body is not None:
            hdrs.append(("Content-Length", str(len(body))))
        req = "%s %s %s\r\n" % (method, target, version)
        req += "".join("%s: %s\r\n" % kv for kv in hdrs) + "\r\n"
        s.sendall(req.encode("latin-1") + (body or b""))
        r = ResponseReader(s).read_response(method)
        return r.status, r.headers, r.body
    finally:
        s.close()


def request(port, method, target, headers=None, body=None, host="example.com", timeout=10.0,
            sock=None, reader=None):
    """Sends one HTTP/1.1 request (keep-alive) and reads the answer. Pass
    sock/reader to reuse a connection."""
    own = sock is None
    if own:
        sock = connect(port, timeout=timeout)
        reader = ResponseReader(sock)
    try:
        hdrs = [("Host", host)]
        hdrs += list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        if body is not None and not any(k.lower() in ("content-length", "transfer-encoding")
                                        for k, _ in hdrs):
            hdrs.append(("Content-Length", str(len(body))))
        req = "%s %s HTTP/1.1\r\n" % (method, target)
        req += "".join("%s: %s\r\n" % kv for kv in hdrs) + "\r\n"
        sock.sendall(req.encode("latin-1") + (body or b""))
        return reader.read_response(method)
    finally:
        if own:
            sock.close()


def send_raw(port, data, timeout=5.0):
    """Sends raw bytes on a fresh connection; returns (first response or
    None, closed_after) where closed_after says whether the server closed
    the connection after that response (within `timeout`)."""
    s = connect(port, timeout=timeout)
    try:
        s.sendall(data)
        reader = ResponseReader(s)
        try:
            resp = reader.read_response()
        except (EOFError, ConnectionResetError):
            return None, True
        return resp, is_closed(s, timeout, reader)
    finally:
        s.close()


def is_closed(sock, timeout, reader=None):
    """True when the peer closes (EOF or RST) within timeout and sends no
    further bytes (stray bytes after a final response also count as a
    failure: returns False)."""
    if reader is not None and reader.buf:
        return False
    if reader is not None and reader.eof:
        return True
    sock.settimeout(timeout)
    try:
        data = sock.recv(65536)
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True
    return data == b""


def connection_refused(port, host="127.0.0.1"):
    try:
        s = socket.create_connection((host, port), timeout=1.0)
    except OSError as e:
        return e.errno == errno.ECONNREFUSED
    s.close()
    return False


def assert_gateway_error(resp, status):
    """A gateway-generated error: the status, JSON body of DESIGN.md's shape."""
    assert resp is not None, "no response (connection closed without an answer)"
    assert resp.status == status, "expected %d, got %r" % (status, resp)
    ctype = resp.header("Content-Type") or ""
    assert ctype.startswith("application/json"), "error Content-Type %r" % ctype
    doc = json.loads(resp.body)
    err = doc["error"]
    assert err["status"] == status, doc
    assert isinstance(err["code"], str) and err["code"], doc
    assert isinstance(err["message"], str) and err["message"], doc
    assert "request_id" in err, doc
    return err
