#!/usr/bin/python3
"""gRPC unary calls through sluice-runtime, nginx (grpc_pass) and HAProxy
(h2 to the server) against calling the gRPC server directly, side by side in
one run (issue 9, "Performance"; DESIGN.md "Measuring performance").

A grpcio server with a bytes-echo method (64-byte messages) runs in this
process; each proxy in turn listens with h2c (HTTP/2 prior knowledge) in
front of it with one worker and a kept-alive h2 connection to the server.
One client channel makes CALLS sequential unary calls through it after 200
discarded warm-up calls; the direct path is measured before and after the
proxies and the better of the two is the baseline, so drift of the machine
does not count against a proxy. Reported per path: p50/p99 latency, the
latency added over the direct call, and the proxy's CPU microseconds per
call (utime+stime from /proc/PID/stat over the measured calls, nginx master
and worker).

usage: perf/grpc_latency.py [--build DIR] [--calls N] [--proxies "sluice nginx haproxy"]
                            [--proxy-cpu 0] [--rows FILE]
--rows appends one line per path, "path p50_us p99_us added_p50 added_p99
cpu_us_per_call errors", for perf/bench.sh's report; without it a Markdown
table is printed. Not a test: it asserts nothing. Run it pinned (bench.sh
pins this process to the load CPU and each proxy to --proxy-cpu).
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent import futures

import grpc

METHOD = "/bench.Echo/Echo"
PAYLOAD = b"x" * 64


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def cpu_ticks(pids):
    total = 0
    for pid in pids:
        try:
            with open("/proc/%d/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total


def children(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def wait_port(port, proc, what, deadline_s=10.0):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            sys.exit("%s exited with %d before listening" % (what, proc.returncode))
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit("%s did not listen on %d" % (what, port))


def measure(port, calls, pid):
    """Returns (latencies µs, cpu ticks of pid and its children, errors)."""
    ch = grpc.insecure_channel("127.0.0.1:%d" % port)
    call = ch.unary_unary(METHOD)
    for _ in range(200):
        call(PAYLOAD, timeout=5)
    pids = [pid] + children(pid) if pid else []
    lat, errors = [], 0
    before = cpu_ticks(pids)
    for _ in range(calls):
        t0 = time.perf_counter()
        try:
            if call(PAYLOAD, timeout=5) != PAYLOAD:
                errors += 1
        except grpc.RpcError:
            errors += 1
        lat.append((time.perf_counter() - t0) * 1e6)
    after = cpu_ticks(pids)
    ch.close()
    return lat, after - before, errors


SLUICE_CFG = """apiVersion: gateway.sluice.dev/v1alpha1
kind: Gateway
metadata: {name: bench}
spec:
  listeners:
  - {name: h2c, port: %(port)d, protocol: h2c, address: 127.0.0.1}
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Backend
metadata: {name: echo}
spec:
  protocol: h2c
  endpoints:
  - {address: 127.0.0.1, port: %(server)d}
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Api
metadata: {name: bench}
spec:
  backendRefs: [{name: echo}]
  operations:
  - {name: echo, method: POST, path: /bench.Echo/, pathType: prefix}
"""

# One worker, no access log, a kept-alive h2 connection to the server: the
# same work sluice-runtime does with --workers 1.
NGINX_CFG = """worker_processes 1;
daemon off;
pid %(dir)s/nginx.pid;
error_log %(dir)s/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path %(dir)s/client_body;
    proxy_temp_path %(dir)s/proxy;
    fastcgi_temp_path %(dir)s/fastcgi;
    uwsgi_temp_path %(dir)s/uwsgi;
    scgi_temp_path %(dir)s/scgi;
    upstream echo {
        server 127.0.0.1:%(server)d;
        keepalive 16;
    }
    server {
        listen 127.0.0.1:%(port)d http2;
        location /bench.Echo/ { grpc_pass grpc://echo; }
    }
}
"""

HAPROXY_CFG = """global
    nbthread 1
    maxconn 1024
defaults
    mode http
    http-reuse always
    timeout connect 5s
    timeout client 60s
    timeout server 60s
frontend grpc
    bind 127.0.0.1:%(port)d proto h2
    default_backend echo
backend echo
    server s1 127.0.0.1:%(server)d proto h2
"""


def start_proxy(name, build, tmp, port, server, cpu):
    d = os.path.join(tmp, name)
    os.makedirs(d)
    args = dict(port=port, server=server, dir=d)
    pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
    log = open(os.path.join(d, "stderr"), "w")
    if name == "sluice":
        path = os.path.join(d, "sluice.yaml")
        with open(path, "w") as f:
            f.write(SLUICE_CFG % args)
        cmd = pin + [os.path.join(build, "bin", "sluice-runtime"), "--config", path,
                     "--workers", "1", "--admin", "off", "--access-log", "off",
                     "--log-level", "warn"]
    elif name == "nginx":
        path = os.path.join(d, "nginx.conf")
        with open(path, "w") as f:
            f.write(NGINX_CFG % args)
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        cmd = pin + [nginx, "-p", d, "-c", path]
    elif name == "haproxy":
        path = os.path.join(d, "haproxy.cfg")
        with open(path, "w") as f:
            f.write(HAPROXY_CFG % args)
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        cmd = pin + [haproxy, "-db", "-f", path]
    else:
        sys.exit("unknown proxy %s (known: sluice nginx haproxy)" % name)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    wait_port(port, proc, name)
    return proc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--proxies", default="sluice nginx haproxy")
    ap.add_argument("--proxy-cpu", type=int, default=None)
    ap.add_argument("--rows", default=None)
    a = ap.parse_args()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(lambda r, c: r)}),))
    sport = server.add_insecure_port("127.0.0.1:0")
    server.start()
    hz = os.sysconf("SC_CLK_TCK")
    results = {}
    try:
        direct = [measure(sport, a.calls, None)]
        with tempfile.TemporaryDirectory() as tmp:
            for name in a.proxies.split():
                port = free_port()
                proc = start_proxy(name, a.build, tmp, port, sport, a.proxy_cpu)
                try:
                    # nginx's worker is the master's child, forked after
                    # the master listens: look once the warm-up is done.
                    lat, ticks, errors = measure(port, a.calls, proc.pid)
                    results[name] = (lat, ticks * 1e6 / hz / a.calls, errors)
                finally:
                    proc.terminate()
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
        direct.append(measure(sport, a.calls, None))
    finally:
        server.stop(0)

    base = min(direct, key=lambda m: pct(m[0], 0.5))[0]
    b50, b99 = pct(base, 0.5), pct(base, 0.99)
    rows = [("direct", b50, b99, 0.0, 0.0, 0.0, sum(m[2] for m in direct))]
    for name, (lat, cpu, errors) in results.items():
        p50, p99 = pct(lat, 0.5), pct(lat, 0.99)
        rows.append((name, p50, p99, p50 - b50, p99 - b99, cpu, errors))
    if a.rows:
        with open(a.rows, "a") as f:
            for r in rows:
                f.write("%s %.0f %.0f %.0f %.0f %.2f %d\n" % r)
        return
    print("%d sequential unary calls per path, 64-byte messages" % a.calls)
    print("| path | p50 µs | p99 µs | added p50 µs | added p99 µs | proxy CPU µs/call | errors |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print("| %s | %.0f | %.0f | %.0f | %.0f | %.2f | %d |" % r)


if __name__ == "__main__":
    main()
