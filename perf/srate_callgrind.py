#!/usr/bin/python3
"""Instructions per proxied request: success-rate routing over two backends
against the weighted pick over the same two, and a plain GET of an Api
without routing (perf/callgrind_per_request.sh for each, one worker, the
same nginx origin behind both Backends). Noise-free (instructions, not
time), so a before/after of one change reads on a shared machine.

Not a test: the figures of docs/routing.md "Cost". Needs valgrind, wrk,
nginx, curl.

usage: perf/srate_callgrind.py [--bin build/bin/sluice-runtime] [--runs 2]
           [--cases weighted,success-rate,plain]
"""
import argparse
import os
import re
import subprocess
import tempfile

from srate_bench import free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NGINX = """worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/nginx.err;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  server {{ listen 127.0.0.1:{port}; location / {{ return 200 "ok\\n"; }} }}
}}
"""

ROUTING = {
    "weighted": "",
    "success-rate": "  routing: {strategy: success-rate}\n",
}


def config(port, origin, case):
    refs = "[{name: a}]" if case == "plain" else "[{name: a}, {name: b}]"
    return """apiVersion: gateway.sluice.dev/v1alpha1
kind: Gateway
metadata: {name: g}
spec:
  listeners: [{name: http, port: %d, protocol: http, address: 127.0.0.1}]
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Backend
metadata: {name: a}
spec:
  endpoints: [{address: 127.0.0.1, port: %d}]
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Backend
metadata: {name: b}
spec:
  endpoints: [{address: 127.0.0.1, port: %d}]
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Api
metadata: {name: bench}
spec:
  basePath: /
  backendRefs: %s
%s  operations:
  - {method: GET, path: /bench}
""" % (port, origin, origin, refs, ROUTING.get(case, ""))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin", "sluice-runtime"))
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--cases", default="weighted,success-rate,plain")
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="srate-cg-")
    origin = free_port()
    with open(os.path.join(d, "nginx.conf"), "w") as f:
        f.write(NGINX.format(d=d, port=origin))
    ng = subprocess.Popen(["nginx", "-c", os.path.join(d, "nginx.conf")],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for case in a.cases.split(","):
            got = []
            for _ in range(a.runs):
                port = free_port()
                cfg = os.path.join(d, "%s.yaml" % case)
                with open(cfg, "w") as f:
                    f.write(config(port, origin, case))
                out = subprocess.run(
                    [os.path.join(REPO, "perf", "callgrind_per_request.sh"), a.bin, cfg,
                     str(port)], stdout=subprocess.PIPE, text=True,
                    stderr=subprocess.DEVNULL, env=dict(os.environ, CG_DIR=d)).stdout
                m = re.search(r"(\d+) Ir/request", out)
                got.append(int(m.group(1)) if m else None)
            print("%-13s %s Ir/request" % (case, " ".join(str(g) for g in got)), flush=True)
    finally:
        ng.terminate()
        ng.wait(5)


if __name__ == "__main__":
    main()
