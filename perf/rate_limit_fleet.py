#!/usr/bin/python3
"""The fleet rate limit's accuracy and CPU cost (issue 10's figures).

Two sluice-runtimes (one worker each) share one rate limit through a real
redis-server (`mode: fleet`, `by: route`, LIMIT requests per 1 s); wrk
hammers both at once for DURATION seconds, starting on a whole second so
the run covers whole windows of the fleet's fixed windows. The origin (an
nginx answering `return 200`) logs the arrival time of every request it
gets, i.e. of every request the fleet admitted; the script counts them per
one-second window and reports the windows' totals against the limit.

Then the CPU cost of fleet mode: the same load against two runtimes with
`mode: local` and half the limit each (the same admitted total, no Redis),
and both modes again with a limit far above the load (every request
admitted, the fleet leasing up to requests/50 tokens per round-trip): CPU
microseconds per request (admitted or refused) of the two runtimes, and of
redis-server.

Not a test: a measurement for docs/benchmarks-policies.md. Loopback only;
every server on ports picked here, stopped at the end.

usage: perf/rate_limit_fleet.py [--build build] [--limit 1000]
           [--duration 60] [--local-duration 20] [--connections 10]
           [--out docs/benchmarks-fleet-rate-limit.md]
"""
import argparse
import contextlib
import io
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cpu_seconds(pid):
    """utime + stime of a process and its direct children, in seconds."""
    total = 0
    pids = [pid]
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
        pids += [int(p) for p in out.split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open("/proc/%d/stat" % p) as f:
                rest = f.read().rsplit(")", 1)[1].split()
            total += int(rest[11]) + int(rest[12])
        except (OSError, IndexError):
            pass
    return total / CLK_TCK


def wait_http(port, proc, name, path="/"):
    for _ in range(200):
        if proc.poll() is not None:
            sys.exit("%s exited during start-up" % name)
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answers (a 429 is an answer)
        except OSError:
            time.sleep(0.05)
    sys.exit("%s on port %d did not answer" % (name, port))


def wait_redis(port, proc):
    for _ in range(200):
        if proc.poll() is not None:
            sys.exit("redis-server exited during start-up")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            time.sleep(0.05)
    sys.exit("redis-server did not answer PING")


def runtime_config(port, origin_port, mode, limit, redis_port):
    fleet = ""
    if mode == "fleet":
        fleet = "      mode: fleet\n      redis: {address: \"127.0.0.1:%d\"}\n" % redis_port
    return """apiVersion: gateway.sluice.dev/v1alpha1
kind: Gateway
metadata: {name: fleet-bench}
spec:
  listeners:
  - {name: http, port: %d, protocol: http, address: 127.0.0.1}
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Backend
metadata: {name: origin}
spec:
  endpoints:
  - {address: 127.0.0.1, port: %d}
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Api
metadata: {name: limited}
spec:
  basePath: /
  backendRefs: [{name: origin}]
  policies:
  - name: rate-limit
    config:
%s      limits:
      - {requests: %d, period: 1s, by: route}
  operations:
  - {name: all, method: "*", path: /, pathType: prefix}
""" % (port, origin_port, fleet, limit)


def parse_wrk(text):
    total = non2xx = 0
    for line in text.splitlines():
        parts = line.split()
        if "requests in" in line:
            total = int(parts[0])
        elif line.strip().startswith("Non-2xx or 3xx responses:"):
            non2xx = int(parts[-1])
    return total, non2xx


class Run:
    def __init__(self, args):
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="sluice-fleet.")
        self.procs = []

    def start(self, argv, name, **kw):
        log = open(os.path.join(self.tmp, name + ".log"), "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, **kw)
        self.procs.append(p)
        return p

    def stop_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []

    def origin(self):
        port = free_port()
        d = os.path.join(self.tmp, "origin")
        os.makedirs(d)
        conf = os.path.join(d, "nginx.conf")
        with open(conf, "w") as f:
            f.write("""worker_processes 1;
daemon off;
pid %(d)s/nginx.pid;
error_log %(d)s/error.log warn;
events { worker_connections 1024; }
http {
    log_format arrival '$msec';
    access_log %(d)s/arrivals.log arrival buffer=64k flush=1s;
    client_body_temp_path %(d)s/cb; proxy_temp_path %(d)s/p; fastcgi_temp_path %(d)s/f;
    uwsgi_temp_path %(d)s/u; scgi_temp_path %(d)s/s;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:%(port)d;
        location / { default_type text/plain; return 200 "admitted\\n"; }
    }
}
""" % {"d": d, "port": port})
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        p = self.start([nginx, "-p", d, "-c", conf], "origin")
        wait_http(port, p, "origin nginx")
        return port, p, os.path.join(d, "arrivals.log")

    def phase(self, mode, limit_each, duration, origin_port, redis_port):
        a = self.args
        runtime = os.path.join(a.build, "bin", "sluice-runtime")
        ports, rts = [], []
        for i in range(2):
            port = free_port()
            cfg = os.path.join(self.tmp, "%s-%d.yaml" % (mode, i))
            with open(cfg, "w") as f:
                f.write(runtime_config(port, origin_port, mode, limit_each, redis_port))
            p = self.start([runtime, "--config", cfg, "--workers", "1", "--admin", "off",
                            "--access-log", "off", "--log-level", "warn"], "%s-rt%d" % (mode, i))
            wait_http(port, p, "runtime %d" % i, "/warm-up")
            ports.append(port)
            rts.append(p)
        # Start on a whole second (+20 ms), so the run covers whole windows.
        time.sleep(1.02 - (time.time() % 1.0))
        t0 = time.time()
        cpu0 = [cpu_seconds(p.pid) for p in rts]
        redis_cpu0 = cpu_seconds(self.redis.pid) if self.redis else 0
        wrks = [subprocess.Popen(["wrk", "-t1", "-c%d" % a.connections, "-d%ds" % duration,
                                  "http://127.0.0.1:%d/bench" % port],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for port in ports]
        outs = [w.communicate()[0] for w in wrks]
        t1 = time.time()
        cpu = sum(cpu_seconds(p.pid) - c for p, c in zip(rts, cpu0))
        redis_cpu = (cpu_seconds(self.redis.pid) - redis_cpu0) if self.redis else 0
        for p in rts:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=10)
        total = refused = 0
        for out in outs:
            n, bad = parse_wrk(out)
            if n == 0:
                sys.exit("wrk failed:\n" + out)
            total += n
            refused += bad
        return {"t0": t0, "t1": t1, "requests": total, "refused": refused,
                "cpu_s": cpu, "redis_cpu_s": redis_cpu}

    def main(self):
        a = self.args
        for tool in ("redis-server", "wrk", "pgrep"):
            if not shutil.which(tool):
                sys.exit("%s not found (make deps installs it)" % tool)
        origin_port, _, arrivals = self.origin()
        redis_port = free_port()
        self.redis = self.start(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                                 "--save", "", "--appendonly", "no"], "redis")
        wait_redis(redis_port, self.redis)

        fleet = self.phase("fleet", a.limit, a.duration, origin_port, redis_port)
        time.sleep(2)  # nginx flushes its log buffer every second
        with open(arrivals) as f:
            stamps = [float(x) for x in f.read().split()]
        first = int(fleet["t0"]) + 1  # the first whole window inside the run
        last = int(fleet["t1"]) - 1   # the last one
        windows = {w: 0 for w in range(first, last + 1)}
        for s in stamps:
            w = int(s)
            if w in windows:
                windows[w] += 1
        counts = list(windows.values())

        saved_redis = self.redis
        self.redis = None  # local mode: redis idles, its CPU is not the runtimes'
        local = self.phase("local", max(1, a.limit // 2), a.local_duration, origin_port, 0)
        local_open = self.phase("local", 1000000, a.local_duration, origin_port, 0)
        self.redis = saved_redis
        fleet_open = self.phase("fleet", 1000000, a.local_duration, origin_port, redis_port)

        def per_req(ph, key="cpu_s"):
            return ph[key] * 1e6 / ph["requests"] if ph["requests"] else 0.0

        n = len(counts)
        total = sum(counts)
        print("Fleet rate limit: 2 runtimes (1 worker each), %d requests per 1 s by route, "
              "one redis-server; wrk -c%d against each, %d s." % (a.limit, a.connections, a.duration))
        print()
        print("| whole windows | admitted in them | limit x windows | admitted / limit | "
              "min window | max window | within 5% |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        ratio = total / (a.limit * n) if n else 0
        worst = max(abs(c - a.limit) for c in counts) / a.limit if counts else 1
        print("| %d | %d | %d | %.4f | %d | %d | %s |" % (
            n, total, a.limit * n, ratio, min(counts), max(counts),
            "yes" if worst <= 0.05 else "no (worst window %.1f%% off)" % (worst * 100)))
        print()
        print("| mode | limit | seconds | requests (admitted + refused) | refused | "
              "runtimes' CPU µs/request | redis-server CPU µs/request |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
        rows = [("fleet", "%d/s for both" % a.limit, a.duration, fleet),
                ("local", "%d/s each" % max(1, a.limit // 2), a.local_duration, local),
                ("fleet", "1000000/s (all admitted)", a.local_duration, fleet_open),
                ("local", "1000000/s (all admitted)", a.local_duration, local_open)]
        for mode, lim, secs, ph in rows:
            print("| %s | %s | %d | %d | %d | %.2f | %s |" % (
                mode, lim, secs, ph["requests"], ph["refused"], per_req(ph),
                "%.2f" % per_req(ph, "redis_cpu_s") if mode == "fleet" else "-"))
        print()
        for what, f, l in (("at the limit", fleet, local), ("all admitted", fleet_open, local_open)):
            print("fleet / local runtime CPU per request, %s: %.2f" % (
                what, per_req(f) / per_req(l) if per_req(l) else 0))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    ap.add_argument("--limit", type=int, default=1000)
    ap.add_argument("--duration", type=int, default=60)
    ap.add_argument("--local-duration", type=int, default=20)
    ap.add_argument("--connections", type=int, default=10)
    ap.add_argument("--out", default="-", help="also write the report here (Markdown)")
    return ap.parse_args()


def header(args):
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    redis = subprocess.run(["redis-server", "--version"], capture_output=True,
                           text=True).stdout.split(" v=")[-1].split()[0]
    cmd = "/usr/bin/python3 perf/rate_limit_fleet.py --limit %d --duration %d " \
          "--local-duration %d --connections %d" % (args.limit, args.duration,
                                                    args.local_duration, args.connections)
    return ("# The fleet rate limit: accuracy and CPU\n\n"
            "Written by `perf/rate_limit_fleet.py`; do not edit by hand, run it again.\n\n"
            "- Date: %s\n- Commit: %s\n- Machine: %d CPUs, %s, Linux %s\n"
            "- Redis: redis-server %s (Debian), on loopback\n- Command: `%s`\n"
            "- Method: see the script's opening comment and docs/policies/rate-limit.md "
            "(\"fleet mode\"). All processes share the machine's CPUs (no pinning): the CPU "
            "figures compare the modes of one run.\n\n" % (
                time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), commit, os.cpu_count(),
                cpu, platform.release(), redis, cmd))


if __name__ == "__main__":
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = parse_args()
    run = Run(args)
    run.redis = None
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            run.main()
        print(out.getvalue(), end="")
        if args.out != "-":
            with open(args.out, "w") as f:
                f.write(header(args) + out.getvalue())
    finally:
        run.stop_all()
        shutil.rmtree(run.tmp, ignore_errors=True)
