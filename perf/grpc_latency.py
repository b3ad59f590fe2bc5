#!/usr/bin/python3
"""gRPC unary latency through sluice-runtime against calling the backend
directly (issue 9, "Performance"): a grpcio server with a bytes-echo method,
a runtime with an h2c listener in front of it (Backend protocol h2c), and
N sequential calls each way from one client. Prints p50/p99 for both and the
latency the gateway adds, and the runtime's CPU microseconds per call
(utime+stime from /proc over the measured calls).

usage: perf/grpc_latency.py [BUILD_DIR] [CALLS]   (default build, 5000)
Not a test: it asserts nothing. Pin it with taskset like bench.sh for
figures worth comparing.
"""
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent import futures

import grpc


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def cpu_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def measure(target, calls):
    ch = grpc.insecure_channel(target)
    call = ch.unary_unary("/bench.Echo/Echo")
    for _ in range(200):
        call(b"x" * 64, timeout=5)
    lat = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call(b"x" * 64, timeout=5)
        lat.append((time.perf_counter() - t0) * 1e6)
    ch.close()
    return lat


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 5000
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(lambda r, c: r)}),))
    sport = server.add_insecure_port("127.0.0.1:0")
    server.start()
    gport = free_port()
    cfg = """apiVersion: gateway.sluice.dev/v1alpha1
kind: Gateway
metadata: {name: bench}
spec:
  listeners:
  - {name: h2c, port: %d, protocol: h2c, address: 127.0.0.1}
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Backend
metadata: {name: echo}
spec:
  protocol: h2c
  endpoints:
  - {address: 127.0.0.1, port: %d}
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Api
metadata: {name: bench}
spec:
  backendRefs: [{name: echo}]
  operations:
  - {name: echo, method: POST, path: /bench.Echo/, pathType: prefix}
""" % (gport, sport)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "grpc.yaml")
        with open(path, "w") as f:
            f.write(cfg)
        rt = subprocess.Popen([os.path.join(build, "bin", "sluice-runtime"), "--config", path,
                               "--workers", "1", "--admin", "off", "--access-log", "off",
                               "--log-level", "warn"])
        try:
            time.sleep(0.5)
            direct = measure("127.0.0.1:%d" % sport, calls)
            before = cpu_ticks(rt.pid)
            via = measure("127.0.0.1:%d" % gport, calls)
            after = cpu_ticks(rt.pid)
        finally:
            rt.terminate()
            rt.wait()
    server.stop(0)
    hz = os.sysconf("SC_CLK_TCK")
    print("calls: %d each, 64-byte messages, sequential" % calls)
    print("| path | p50 µs | p99 µs |")
    print("| --- | ---: | ---: |")
    print("| direct | %.0f | %.0f |" % (pct(direct, 0.5), pct(direct, 0.99)))
    print("| through sluice | %.0f | %.0f |" % (pct(via, 0.5), pct(via, 0.99)))
    print("| added by sluice | %.0f | %.0f |" % (pct(via, 0.5) - pct(direct, 0.5),
                                               pct(via, 0.99) - pct(direct, 0.99)))
    print("sluice CPU per call: %.1f µs" % ((after - before) * 1e6 / hz / calls))


if __name__ == "__main__":
    main()
