#!/usr/bin/python3
"""Config propagation measurements for sluice-controller + sluice-runtime
(issue 3). Not part of the test suite: nothing here is an assertion; it
prints figures and writes them to docs/benchmarks-controller.md.

Three measurements, all with the real binaries:

1. propagation: a controller, R runtimes (each in its own network namespace,
   --workers 1, as on separate machines) and a config of S routes. Each of
   `--changes` changes is a PUT of a small Api ("probe") with a new
   operation; from the REST answer, one thread polls every runtime, each
   over its own keep-alive connection, in rounds 1 ms apart, until the new
   route answers 200 on all of them. Reported: p50/p99 over every (runtime, change) sample, and
   p50/p99 of "the last runtime of the fleet" per change.
2. apply: one runtime; N routes (Apis of 100 operations) are created with one
   POST /api/v1/resources. The runtime's apply time is the time from the
   controller's "push routes" log line to the runtime's "applied" line (same
   clock, millisecond stamps): transfer + decode + compile + RCU swap. Also
   the controller's compile time, the end-to-end time until the last route
   answers, the runtime's RSS (VmRSS after, and the peak sampled every 20 ms)
   and, with N routes in place, the cost of one small change (a state of the
   world push rebuilds the whole table).
3. fanout: perf/controller_fanout (make perf-tools) with 1,000 simulated
   runtimes pushing one change to all; the controller's memory per connected
   runtime; a reconnect storm of all of them at once (with the versions they
   run, then empty).

Usage (root: the runtimes get network namespaces):

    make BUILD=build all perf-tools
    SLUICE_BUILD=build /usr/bin/python3 perf/propagation.py            # everything
    SLUICE_BUILD=build /usr/bin/python3 perf/propagation.py --only apply --apply-routes 100000 --out -
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))

from backend import Backend  # noqa: E402
from controller_env import Controller, ManagedRuntime, NetLab, netns_available  # noqa: E402
from helpers import (RssSampler, ResponseReader, api, backend as backend_doc, build_dir,  # noqa: E402
                     free_port, gateway, http_request, metric_sum, wait_until)

OPS_PER_API = 100


def pct(values, p):
    v = sorted(values)
    if not v:
        return float("nan")
    i = int(round(p / 100.0 * (len(v) - 1)))
    return v[max(0, min(len(v) - 1, i))]


def bulk_apis(nroutes, backend="echo"):
    """nroutes operations in Apis of OPS_PER_API: templates and exact paths
    mixed, every Api under its own base path."""
    docs = []
    left, k = nroutes, 0
    while left > 0:
        n = min(OPS_PER_API, left)
        ops = []
        for j in range(n):
            if j % 2:
                ops.append({"method": "GET", "path": "/items%d/{id}" % j})
            else:
                ops.append({"method": "GET", "path": "/items%d" % j})
        docs.append(api("bulk-%d" % k, "/bulk/%d" % k, backend, operations=ops))
        left -= n
        k += 1
    return docs


def probe_api(k):
    return api("probe", "/probe", "echo", operations=[{"method": "GET", "path": "/c%d" % k}])


LOG_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z ")


def log_time(line):
    m = LOG_TS.match(line)
    if not m:
        return None
    dt = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f")
    return dt.replace(tzinfo=datetime.timezone.utc).timestamp()


def find_line(text, pattern):
    rx = re.compile(pattern)
    for line in text.splitlines():
        if rx.search(line):
            return line
    return None


class Setup:
    """Controller + runtimes + origin for one measurement; close() stops
    everything and raises if a process reported a problem."""

    def __init__(self, nruntimes, use_lab, log_level="info"):
        self.tmp = tempfile.mkdtemp(prefix="sluice-prop-")
        self.lab = NetLab(nruntimes) if use_lab else None
        hub = self.lab.hub_ip if self.lab else "127.0.0.1"
        self.ctl = Controller(os.path.join(self.tmp, "controller"), stream_host=hub,
                              log_level=log_level).start()
        self.backend = Backend(host=hub, name="echo").start()
        self.rts = []
        for i in range(nruntimes):
            rt = ManagedRuntime(os.path.join(self.tmp, "rt%d" % i), self.ctl.stream_addr,
                                "rt-%d" % i, workers=1, lab=self.lab,
                                index=i if self.lab else None, log_level=log_level)
            rt.start(wait_ready=False)
            self.rts.append(rt)
        self.port = free_port()
        self.address = "0.0.0.0" if self.lab else "127.0.0.1"

    def base(self, extra_docs=()):
        hub = self.lab.hub_ip if self.lab else "127.0.0.1"
        docs = [gateway(self.port, address=self.address),
                backend_doc("echo", [{"address": hub, "port": self.backend.port}]),
                probe_api(-1)] + list(extra_docs)
        self.post_json(docs)
        v = self.ctl.wait_converged(len(self.rts), timeout=300)
        for rt in self.rts:
            rt.wait_ready(timeout=60)
        return v

    def post_json(self, docs):
        return self.ctl.ok("POST", "/api/v1/resources", docs)

    def close(self):
        problems = []
        for rt in self.rts:
            rt.stop()
            problems += ["runtime %s: %s" % (rt.node_id, p) for p in rt.problems(0)]
        self.ctl.stop()
        problems += self.ctl.problems()
        self.backend.stop()
        if self.lab:
            self.lab.close()
        if problems:
            raise RuntimeError("process problems (logs in %s): %s" % (self.tmp, problems))
        shutil.rmtree(self.tmp, ignore_errors=True)


class Poller:
    """Keep-alive connection to one runtime; waits for a path to answer 200."""

    def __init__(self, host, port):
        self.host, self.port = host, port
        self.sock = None

    def _connect(self):
        import socket
        self.sock = socket.create_connection((self.host, self.port), timeout=5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = ResponseReader(self.sock)

    def send(self, path):
        """Sends one GET; False when the connection failed (retried next round)."""
        try:
            if self.sock is None:
                self._connect()
            self.sock.sendall(("GET %s HTTP/1.1\r\nHost: %s\r\n\r\n"
                               % (path, self.host)).encode())
            return True
        except OSError:
            self._drop()
            return False

    def read(self):
        """The status of the answer to the last send, or None."""
        try:
            return self.reader.read_response("GET").status
        except (OSError, EOFError):
            self._drop()
            return None

    def _drop(self):
        if self.sock is not None:
            self.sock.close()
        self.sock = None

    def wait_200(self, path, t0, timeout=30.0):
        req = ("GET %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (path, self.host)).encode()
        while time.monotonic() - t0 < timeout:
            if self.sock is None:
                self._connect()
            try:
                self.sock.sendall(req)
                r = self.reader.read_response("GET")
            except (OSError, EOFError):
                self.sock.close()
                self.sock = None
                continue
            if r.status == 200:
                return time.monotonic() - t0
            time.sleep(0.001)
        raise RuntimeError("%s:%d%s not served after %.0f s" % (self.host, self.port, path,
                                                                timeout))


class FleetPoller:
    """Polls every runtime of a fleet from one thread: each round sends the
    request to every runtime that has not answered 200 yet, then reads their
    answers; rounds 1 ms apart. (One thread per runtime, as before, made 20
    Python threads wake every millisecond on 2 CPUs: they took more CPU than
    the 20 runtimes and delayed the very changes they timed.) A runtime's
    time is taken when its 200 is read, so it may be late by the reads of
    the runtimes before it in the round (tens of microseconds each)."""

    def __init__(self, pollers):
        self.pollers = pollers

    def wait_200(self, path, t0, timeout=30.0):
        lat = [None] * len(self.pollers)
        while None in lat:
            if time.monotonic() - t0 > timeout:
                raise RuntimeError("%s not served by %d runtimes after %.0f s"
                                   % (path, lat.count(None), timeout))
            sent = []
            for i, p in enumerate(self.pollers):
                if lat[i] is None and p.send(path):
                    sent.append(i)
            for i in sent:
                status = self.pollers[i].read()
                if status == 200:
                    lat[i] = time.monotonic() - t0
            if None in lat:
                time.sleep(0.001)
        return lat


def xds_mode():
    return os.environ.get("SLUICE_XDS_MODE", "delta")


def pushed(ctl):
    """(bytes, resources) the controller has pushed in the current mode."""
    return (ctl.metric("sluice_controller_push_bytes_total", mode=xds_mode()),
            ctl.metric("sluice_controller_push_resources_total", mode=xds_mode()))


def measure_propagation(nruntimes, nroutes, changes, use_lab):
    s = Setup(nruntimes, use_lab)
    try:
        t_base = time.monotonic()
        s.base(bulk_apis(nroutes))
        base_s = time.monotonic() - t_base
        poller = FleetPoller([Poller(rt.host, s.port) for rt in s.rts])
        bytes0, res0 = pushed(s.ctl)
        samples, fleet = [], []
        for k in range(changes):
            s.ctl.put(probe_api(k))
            t0 = time.monotonic()
            lat = poller.wait_200("/probe/c%d" % k, t0)
            samples += lat
            fleet.append(max(lat))
            time.sleep(0.03)
        s.ctl.wait_converged(nruntimes, timeout=60)
        bytes1, res1 = pushed(s.ctl)
        rss = [rt.rss_kb() for rt in s.rts]
        return {"mode": xds_mode(), "runtimes": nruntimes, "routes": nroutes, "changes": changes,
                "bytes_per_change": (bytes1 - bytes0) / float(changes * nruntimes),
                "resources_per_change": (res1 - res0) / float(changes * nruntimes),
                "base_apply_s": base_s,
                "p50_ms": pct(samples, 50) * 1e3, "p99_ms": pct(samples, 99) * 1e3,
                "max_ms": max(samples) * 1e3,
                "fleet_p50_ms": pct(fleet, 50) * 1e3, "fleet_p99_ms": pct(fleet, 99) * 1e3,
                "runtime_rss_mb": max(rss) / 1024.0}
    finally:
        s.close()


def push_apply_ms(s, version, node="rt-0"):
    """(controller compile line time, push line time, runtime applied time)
    for the routes push of `version`, from the logs."""
    clog, rlog = s.ctl.log(), s.rts[0].log()
    compiled = find_line(clog, r"config version %d compiled" % version)
    push = find_line(clog, r"push routes (delta )?to %s: version %d[ ,]" % (re.escape(node),
                                                                          version))
    applied = find_line(rlog, r"controller (push|delta) of routes version %d applied" % version)
    return (log_time(compiled) if compiled else None, log_time(push) if push else None,
            log_time(applied) if applied else None)


def measure_apply(nroutes, small_changes=5):
    s = Setup(1, use_lab=False, log_level="debug")
    rt = s.rts[0]
    try:
        v0 = s.base()
        rss_before = rt.rss_kb()
        docs = bulk_apis(nroutes)
        last = docs[-1]
        last_path = "/bulk/%s/items0" % last["metadata"]["name"].split("-")[1]
        body = json.dumps(docs)
        cpu_rt0, cpu_ctl0 = main_thread_cpu_ms(rt.pid), main_thread_cpu_ms(s.ctl.proc.pid)
        with RssSampler(rt) as sampler:
            t_wall0 = time.time()
            t0 = time.monotonic()
            s.ctl.ok("POST", "/api/v1/resources", body)
            rest_s = time.monotonic() - t0
            poller = Poller(rt.host, s.port)
            e2e = poller.wait_200(last_path, t0, timeout=600)
            v = s.ctl.wait_converged(1, min_version=v0 + 1, timeout=600)
        cpu_rt = main_thread_cpu_ms(rt.pid) - cpu_rt0
        cpu_ctl = main_thread_cpu_ms(s.ctl.proc.pid) - cpu_ctl0
        compiled, push, applied = push_apply_ms(s, v)
        rss_after = rt.rss_kb()
        out = {"routes": nroutes, "body_mb": len(body) / 1e6, "rest_s": rest_s,
               "compile_ms": (compiled - t_wall0) * 1e3 if compiled else None,
               "apply_ms": (applied - push) * 1e3 if push and applied else None,
               "e2e_ms": e2e * 1e3, "runtime_cpu_ms": cpu_rt, "controller_cpu_ms": cpu_ctl, "rss_before_mb": rss_before / 1024.0,
               "rss_after_mb": rss_after / 1024.0, "rss_peak_mb": sampler.max_kb / 1024.0,
               "controller_rss_mb": read_rss_kb(s.ctl.proc.pid) / 1024.0}
        # One small change with nroutes in place.
        small_apply, small_e2e, small_cpu, small_ctl_cpu = [], [], [], []
        # The compiles' own CPU (a counter of the controller since issue 14;
        # absent from older builds).
        m0 = s.ctl.metrics()
        compile_cpu0 = metric_sum(m0, "sluice_controller_compile_cpu_seconds_total")
        has_compile_cpu = any(n == "sluice_controller_compile_cpu_seconds_total"
                              for n, _, _ in m0)
        for k in range(small_changes):
            c0 = main_thread_cpu_ms(rt.pid)
            cc0 = main_thread_cpu_ms(s.ctl.proc.pid)
            s.ctl.put(probe_api(1000 + k))
            t0 = time.monotonic()
            small_e2e.append(poller.wait_200("/probe/c%d" % (1000 + k), t0, timeout=120))
            vk = s.ctl.wait_converged(1, min_version=v + 1, timeout=120)
            small_cpu.append(main_thread_cpu_ms(rt.pid) - c0)
            # The controller's main thread over the whole change: REST
            # write, compile, push, ACK.
            small_ctl_cpu.append(main_thread_cpu_ms(s.ctl.proc.pid) - cc0)
            _, push, applied = push_apply_ms(s, vk)
            if push and applied:
                small_apply.append((applied - push) * 1e3)
            v = vk
            time.sleep(0.05)
        out["small_apply_ms"] = pct(small_apply, 50) if small_apply else None
        out["small_e2e_ms"] = pct(small_e2e, 50) * 1e3
        out["small_e2e_max_ms"] = max(small_e2e) * 1e3
        out["small_cpu_ms"] = pct(small_cpu, 50)
        out["small_ctl_cpu_ms"] = pct(small_ctl_cpu, 50)
        out["small_compile_cpu_ms"] = ((metric_sum(s.ctl.metrics(),
                                                   "sluice_controller_compile_cpu_seconds_total")
                                        - compile_cpu0) * 1e3 / small_changes
                                       if has_compile_cpu else None)
        out["small_ctl_cpu_max_ms"] = max(small_ctl_cpu)
        return out
    finally:
        s.close()


def read_rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main_thread_cpu_ms(pid):
    """CPU time of a process's main thread (/proc/PID/schedstat, ns): the
    thread that compiles (controller) or applies (runtime) the config. Unlike
    wall time it does not grow when other processes share the CPUs."""
    with open("/proc/%d/schedstat" % pid) as f:
        return int(f.read().split()[0]) / 1e6


def read_cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_fanout(nclients, rounds):
    tool = os.path.join(build_dir(), "perf", "controller_fanout")
    if not os.path.exists(tool):
        raise RuntimeError("%s missing: make BUILD=%s perf-tools" % (tool, build_dir()))
    tmp = tempfile.mkdtemp(prefix="sluice-fanout-")
    ctl = Controller(os.path.join(tmp, "controller")).start()
    try:
        cpu0 = read_cpu_s(ctl.proc.pid)
        cmd = [tool, "--controller", ctl.stream_addr, "--rest", "127.0.0.1:%d" % ctl.rest_port,
               "--clients", str(nclients), "--rounds", str(rounds),
               "--controller-pid", str(ctl.proc.pid), "--storm"]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=600)
        cpu = read_cpu_s(ctl.proc.pid) - cpu0
        rss = read_rss_kb(ctl.proc.pid)
        if r.returncode != 0:
            raise RuntimeError("controller_fanout failed: %s %s" % (r.stdout, r.stderr))
        addrs = {x["address"] for x in ctl.ok("GET", "/api/v1/runtimes")["items"]}
        m = re.search(r"all ACKed in p50 ([\d.]+) ms, max ([\d.]+) ms", r.stdout)
        per = re.search(r"([\d.]+) KB per connected client", r.stdout)
        storms = re.findall(r"storm \((.*?)\): .* in (\d+) ms, .*peak RSS ([\d.]+) MB", r.stdout)
        return {"clients": nclients, "rounds": rounds, "output": r.stdout.strip(),
                "all_p50_ms": float(m.group(1)), "all_max_ms": float(m.group(2)),
                "kb_per_client": float(per.group(1)),
                "storms": [(what, int(ms), float(peak)) for what, ms, peak in storms],
                "connections": len(addrs), "controller_cpu_s": cpu,
                "controller_rss_mb": rss / 1024.0}
    finally:
        ctl.stop()
        problems = ctl.problems()
        if problems:
            raise RuntimeError("controller problems (log in %s): %s" % (tmp, problems))
        shutil.rmtree(tmp, ignore_errors=True)


# --- report -------------------------------------------------------------------------

def machine():
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return "%d CPUs (%s), Linux %s" % (os.cpu_count(), cpu, platform.release())


def commit():
    r = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                       stdout=subprocess.PIPE, text=True)
    return r.stdout.strip()


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def fmt(v, spec="%.1f"):
    return "n/a" if v is None else spec % v


def report(results, argv):
    out = []
    out.append("## Config propagation (perf/propagation.py)\n")
    out.append("Measured %s on %s, commit %s, build `%s`. Command:\n"
               % (datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), machine(), commit(),
                  os.path.relpath(build_dir(), REPO)))
    out.append("    SLUICE_BUILD=%s /usr/bin/python3 perf/propagation.py %s\n"
               % (os.path.relpath(build_dir(), REPO), " ".join(argv)))
    out.append("Load average at the start / end of the run: %s / %s (the machine is shared; "
               "wall times include whatever else ran, CPU times do not).\n"
               % (results.get("load_start", "?"), loadavg()))
    if results.get("propagation"):
        out.append("### Propagation: REST answer -> the runtime serves the change\n")
        out.append("Each change is a PUT of a one-operation Api; latency from the REST answer to "
                   "the first 200 of the new route, polled in rounds 1 ms apart by one "
                   "thread over a keep-alive connection per runtime. Runtimes: --workers 1, "
                   "each in its own network namespace.\n")
        out.append("| mode | runtimes | routes | changes | p50 ms | p99 ms | max ms "
                   "| whole fleet p50 ms | whole fleet p99 ms | first full config s "
                   "| runtime RSS MB | bytes pushed per change and runtime "
                   "| resources per change and runtime |")
        out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
                   "| ---: | ---: |")
        for r in results["propagation"]:
            out.append("| %s | %d | %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.1f "
                       "| %.0f | %.1f |" % (
                           r["mode"], r["runtimes"], r["routes"], r["changes"], r["p50_ms"],
                           r["p99_ms"], r["max_ms"], r["fleet_p50_ms"], r["fleet_p99_ms"],
                           r["base_apply_s"], r["runtime_rss_mb"], r["bytes_per_change"],
                           r["resources_per_change"]))
        out.append("")
    if results.get("apply"):
        out.append("### Runtime apply time and memory\n")
        out.append("N routes (Apis of %d operations, half templates) created by one POST "
                   "/api/v1/resources. apply = runtime \"applied\" log line minus the "
                   "controller's \"push routes\" line (transfer + decode + compile + swap). "
                   "REST request -> compiled = controller's \"compiled\" line minus the start "
                   "of the REST request (store write + 20 ms coalescing + compile). One "
                   "runtime, --workers 1.\n" % OPS_PER_API)
        out.append("| mode | routes | body MB | REST write s | REST request -> compiled ms "
                   "| controller main-thread CPU ms | runtime apply ms (wall) "
                   "| runtime main-thread CPU ms | REST answer -> last route served ms "
                   "| runtime RSS before / after / peak MB | controller RSS MB "
                   "| small change at N: apply wall / CPU ms, served p50 / max ms |")
        out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: "
                   "| --- |")
        for r in results["apply"]:
            out.append("| %s | %d | %.1f | %.2f | %s | %.0f | %s | %.0f | %.0f "
                       "| %.1f / %.1f / %.1f "
                       "| %.1f | %s / %.0f, %.0f / %.0f |" % (
                           r.get("mode", "delta"), r["routes"], r["body_mb"], r["rest_s"],
                           fmt(r["compile_ms"], "%.0f"),
                           r["controller_cpu_ms"], fmt(r["apply_ms"], "%.0f"),
                           r["runtime_cpu_ms"], r["e2e_ms"], r["rss_before_mb"],
                           r["rss_after_mb"], r["rss_peak_mb"], r["controller_rss_mb"],
                           fmt(r["small_apply_ms"], "%.0f"), r["small_cpu_ms"],
                           r["small_e2e_ms"], r["small_e2e_max_ms"]))
        out.append("")
        for r in results["apply"]:
            if "small_ctl_cpu_ms" in r:
                out.append("Controller main-thread CPU for one small change (REST write, "
                           "compile, push, ACK, and the harness's status polls) at %d routes "
                           "(%s): p50 %.1f ms, max %.1f ms; of which compiling (mean, "
                           "sluice_controller_compile_cpu_seconds_total): %s ms."
                           % (r["routes"], r.get("mode", "delta"), r["small_ctl_cpu_ms"],
                              r["small_ctl_cpu_max_ms"],
                              fmt(r.get("small_compile_cpu_ms"), "%.1f")))
        out.append("")
    if results.get("fanout"):
        f = results["fanout"]
        out.append("### Fan-out: one change to %d simulated runtimes\n" % f["clients"])
        out.append("`build/perf/controller_fanout --clients %d --rounds %d --controller-pid PID "
                   "--storm` against a fresh controller: %d gRPC streams on %d TCP connections; "
                   "time from the REST answer until every client received and ACKed the new "
                   "routes version; then every stream dropped and all clients reconnecting at "
                   "once, first with the versions they run, then empty.\n"
                   % (f["clients"], f["rounds"], f["clients"], f["connections"]))
        out.append("    " + "\n    ".join(f["output"].splitlines()))
        out.append("")
        out.append("All %d ACKed: p50 %.1f ms, max %.1f ms. Controller CPU over the run "
                   "(sync + rounds): %.2f s; controller RSS with %d streams: %.1f MB.\n"
                   % (f["clients"], f["all_p50_ms"], f["all_max_ms"], f["controller_cpu_s"],
                      f["clients"], f["controller_rss_mb"]))
    out.append("### Targets (issues 3 and 14)\n")
    for line in targets(results):
        out.append("- " + line)
    out.append("")
    return "\n".join(out)


def targets(results):
    lines = []
    for r in results.get("apply", []):
        goal = 50 if r["routes"] <= 10000 else 1000 if r["routes"] <= 100000 else None
        if goal is None or r["apply_ms"] is None:
            continue
        lines.append("%d routes applied in %.0f ms wall, %.0f ms runtime main-thread CPU "
                     "(target < %d ms): %s" % (
                         r["routes"], r["apply_ms"], r["runtime_cpu_ms"], goal,
                         "met" if max(r["apply_ms"], r["runtime_cpu_ms"]) < goal
                         else "**missed**"))
    for r in results.get("propagation", []):
        if r["routes"] <= 1000:
            lines.append("propagation p99 of a small change, %d runtime(s), %d routes: %.1f ms "
                         "(target < 100 ms): %s" % (r["runtimes"], r["routes"], r["p99_ms"],
                                                    "met" if r["p99_ms"] < 100 else "**missed**"))
    f = results.get("fanout")
    if f:
        lines.append("%d runtimes ACKed one change in %.1f ms at worst (target < 1 s): %s" % (
            f["clients"], f["all_max_ms"], "met" if f["all_max_ms"] < 1000 else "**missed**"))
        lines.append("controller memory per connected runtime: %.1f KB (issue 14 target < 50 KB): "
                     "%s" % (f["kb_per_client"], "met" if f["kb_per_client"] < 50 else "**missed**"))
        for what, ms, peak in f["storms"]:
            lines.append("reconnect storm of all %d runtimes (%s): served again in %d ms, "
                         "controller peak RSS %.1f MB" % (f["clients"], what, ms, peak))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["propagation", "apply", "fanout"], action="append")
    ap.add_argument("--runtimes", default="1,20")
    ap.add_argument("--routes", default="10,1000,10000")
    ap.add_argument("--changes", type=int, default=50)
    ap.add_argument("--apply-routes", default="10000,100000")
    ap.add_argument("--fanout", type=int, default=1000)
    ap.add_argument("--fanout-rounds", type=int, default=10)
    ap.add_argument("--xds-mode", default="delta",
                    help="runtimes' stream modes to measure, e.g. sotw,delta (propagation, "
                         "apply)")
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "benchmarks-controller.md"),
                    help="report file (its 'Config propagation' section is replaced), or -")
    args = ap.parse_args()
    only = args.only or ["propagation", "apply", "fanout"]
    results = {"load_start": loadavg()}
    if "propagation" in only:
        reason = netns_available()
        if reason:
            sys.exit("propagation: %s" % reason)
        results["propagation"] = []
        for nrt in [int(x) for x in args.runtimes.split(",")]:
            for nroutes in [int(x) for x in args.routes.split(",")]:
                for mode in args.xds_mode.split(","):
                    os.environ["SLUICE_XDS_MODE"] = mode  # read by ManagedRuntime
                    r = measure_propagation(nrt, nroutes, args.changes, use_lab=True)
                    print(json.dumps(r), flush=True)
                    results["propagation"].append(r)
    if "apply" in only:
        results["apply"] = []
        for nroutes in [int(x) for x in args.apply_routes.split(",")]:
            for mode in args.xds_mode.split(","):
                os.environ["SLUICE_XDS_MODE"] = mode
                r = measure_apply(nroutes)
                r["mode"] = mode
                print(json.dumps(r), flush=True)
                results["apply"].append(r)
    if "fanout" in only:
        results["fanout"] = measure_fanout(args.fanout, args.fanout_rounds)
        print(results["fanout"]["output"], flush=True)
    text = report(results, sys.argv[1:])
    print(text)
    if args.out != "-":
        write_section(args.out, text)


def write_section(path, text):
    """Replaces this script's section of the report file, keeping the rest."""
    head = "# Controller benchmarks\n\nFigures from perf/propagation.py; how to read them: " \
           "perf/README.md, \"Config propagation\".\n\n"
    old = open(path).read() if os.path.exists(path) else head
    start = old.find("## Config propagation (perf/propagation.py)")
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        nxt = old.find("\n## ", start + 1)
        new = old[:start] + text + ("\n" + old[nxt + 1:] if nxt >= 0 else "")
    with open(path, "w") as f:
        f.write(new.rstrip("\n") + "\n")


if __name__ == "__main__":
    main()
