#!/usr/bin/python3
"""Success-rate routing under a degrading backend (issue 13's scenario).

Three nginx origins (a, b, c) behind one sluice-runtime (one worker); c
answers 503 to 1% of requests, then, DEGRADE_AT seconds in, to 40% (its
nginx config reloaded), then, HEAL_AT seconds in, to 1% again. A constant
load of RATE requests/s (POST, so the gateway never retries) runs for
DURATION seconds, once with `routing.strategy: success-rate` and once with
the weighted (random by weight, equal weights) pick. Every answer's
X-Backend and status is kept with its send time.

Reported per strategy: overall success rate; after the degradation, the
requests sent and the time until c's share of traffic, over the last
WINDOW requests, falls under 10%; after healing, the time until its share is
back over 25%. A CSV of each backend's share per 250 ms (for the docs'
gnuplot figure) goes to --csv-prefix + strategy + ".csv"; with --plot
FILE.png, gnuplot draws each strategy's shares over time into it.

Not a test: a measurement for docs/benchmarks.md. Loopback only; every
server on ports picked here, stopped at the end. Needs nginx.

usage: perf/srate_scenario.py [--build build] [--rate 400] [--duration 30]
           [--degrade-at 10] [--heal-at 20] [--window 200] [--csv-prefix /tmp/srate-]
           [--plot docs/benchmarks/srate-scenario.png]
"""
import argparse
import collections
import http.client
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


NGINX = """worker_processes 1;
daemon off;
pid {dir}/nginx-{name}.pid;
error_log {dir}/nginx-{name}.err;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  split_clients "${{request_id}}" $fail {{ {fail}% 1; * 0; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      add_header X-Backend {name} always;
      if ($fail) {{ return 503 "failed\\n"; }}
      return 200 "ok\\n";
    }}
  }}
}}
"""


class Origin:
    def __init__(self, d, name, fail):
        self.d, self.name, self.port = d, name, free_port()
        self.conf = os.path.join(d, "nginx-%s.conf" % name)
        self.write(fail)
        self.proc = subprocess.Popen(["nginx", "-c", self.conf], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)

    def write(self, fail):
        with open(self.conf, "w") as f:
            f.write(NGINX.format(dir=self.d, name=self.name, fail=fail, port=self.port))

    def set_fail(self, fail):
        self.write(fail)
        subprocess.run(["nginx", "-c", self.conf, "-s", "reload"], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(5)


def config(port, origins, strategy):
    docs = ["""apiVersion: gateway.sluice.dev/v1alpha1
kind: Gateway
metadata: {name: g}
spec:
  listeners: [{name: http, port: %d, protocol: http, address: 127.0.0.1}]
""" % port]
    for o in origins:
        docs.append("""apiVersion: gateway.sluice.dev/v1alpha1
kind: Backend
metadata: {name: %s}
spec:
  endpoints: [{address: 127.0.0.1, port: %d}]
""" % (o.name, o.port))
    routing = ("  routing: {strategy: success-rate, successRate: {window: 125, explorePercent: 5}}\n"
               if strategy == "success-rate" else "")
    docs.append("""apiVersion: gateway.sluice.dev/v1alpha1
kind: Api
metadata: {name: pay}
spec:
  basePath: /pay
  backendRefs: [%s]
%s  operations:
  - {method: POST, path: /charge}
""" % (", ".join("{name: %s}" % o.name for o in origins), routing))
    return "---\n".join(docs)


def load(port, rate, duration, threads, out, t0):
    """Constant rate, spread over `threads` keep-alive connections."""
    per = rate / float(threads)

    def run(i):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        n = 0
        while True:
            due = t0 + (n + i / float(threads)) / per
            now = time.monotonic()
            if due - t0 > duration:
                break
            if due > now:
                time.sleep(due - now)
            n += 1
            sent = time.monotonic() - t0
            try:
                c.request("POST", "/pay/charge", body=b"{}")
                r = c.getresponse()
                r.read()
                out.append((sent, r.getheader("X-Backend"), r.status))
            except (OSError, http.client.HTTPException):
                out.append((sent, None, 0))
                c.close()
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def analyse(rows, degrade_at, heal_at, window, names):
    rows.sort()
    ok = sum(1 for r in rows if r[2] == 200)
    res = {"requests": len(rows), "success": ok / float(len(rows))}
    recent = collections.deque(maxlen=window)
    after, res["drop_requests"], res["drop_s"], res["back_s"] = 0, None, None, None
    for sent, b, st in rows:
        recent.append(b)
        share_c = sum(1 for x in recent if x == "c") / float(len(recent))
        if degrade_at <= sent < heal_at:
            after += 1
            if res["drop_s"] is None and len(recent) == window and share_c < 0.10:
                res["drop_requests"], res["drop_s"] = after, sent - degrade_at
        if sent >= heal_at and res["back_s"] is None and share_c > 0.25:
            res["back_s"] = sent - heal_at
    def share(lo, hi):
        sel = [b for sent, b, st in rows if lo <= sent < hi]
        return sum(1 for b in sel if b == "c") / float(len(sel) or 1)
    res["shares"] = "%.3f / %.3f / %.3f" % (share(0, degrade_at), share(degrade_at, heal_at),
                                           share(heal_at, 1e9))
    buckets = collections.OrderedDict()
    for sent, b, st in rows:
        k = int(sent * 4) / 4.0
        buckets.setdefault(k, collections.Counter())[b] += 1
    res["csv"] = "t," + ",".join(names) + "\n" + "".join(
        "%.2f,%s\n" % (k, ",".join("%.3f" % (c[n] / float(sum(c.values()))) for n in names))
        for k, c in buckets.items())
    return res


def cpu_us(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1e6 / os.sysconf("SC_CLK_TCK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rate", type=int, default=400)
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--degrade-at", type=float, default=10)
    ap.add_argument("--heal-at", type=float, default=20)
    ap.add_argument("--window", type=int, default=200)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--csv-prefix", default="/tmp/srate-")
    ap.add_argument("--strategies", default="success-rate,weighted",
                    help="comma-separated: success-rate, weighted")
    ap.add_argument("--plot", help="a PNG of each backend's share of traffic over time")
    a = ap.parse_args()
    binary = os.path.join(REPO, a.build, "bin", "sluice-runtime")
    d = tempfile.mkdtemp(prefix="srate-scenario-")
    names = ["a", "b", "c"]
    print("| strategy | requests | success rate | c's share before / while degraded / after healing | c under 10% after (requests / s) | c back over 25% after (s) | runtime CPU µs/request |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for strategy in a.strategies.split(","):
        origins = [Origin(d, n, 1) for n in names]
        port = free_port()
        cfg = os.path.join(d, "sluice-%s.yaml" % strategy)
        with open(cfg, "w") as f:
            f.write(config(port, origins, strategy))
        rt = subprocess.Popen(["taskset", "-c", "0", binary, "--config", cfg, "--workers", "1",
                               "--admin", "off", "--access-log", "off", "--log-level", "warn"])
        try:
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port), 0.2).close()
                    break
                except OSError:
                    time.sleep(0.05)
            rows = []
            t0 = time.monotonic()
            cpu0 = cpu_us(rt.pid)
            timers = [threading.Timer(a.degrade_at, origins[2].set_fail, (40,)),
                      threading.Timer(a.heal_at, origins[2].set_fail, (1,))]
            for t in timers:
                t.start()
            load(port, a.rate, a.duration, a.threads, rows, t0)
            cpu = cpu_us(rt.pid) - cpu0
            res = analyse(rows, a.degrade_at, a.heal_at, a.window, names)
            with open(a.csv_prefix + strategy + ".csv", "w") as f:
                f.write(res["csv"])
            fmt = lambda v, p="%.2f": "never" if v is None else p % v
            print("| %s | %d | %.4f | %s | %s / %s | %s | %.1f |" % (
                strategy, res["requests"], res["success"], res["shares"],
                fmt(res["drop_requests"], "%d"),
                fmt(res["drop_s"]), fmt(res["back_s"]), cpu / res["requests"]))
            sys.stdout.flush()
        finally:
            rt.terminate()
            rt.wait(10)
            for o in origins:
                o.stop()
    if a.plot:
        plot(a, names)


def plot(a, names):
    """One panel per strategy: each backend's share of the requests sent in
    each 250 ms, the degradation and the healing marked."""
    strategies = a.strategies.split(",")
    gp = ["set terminal pngcairo size 1000,%d font ',10'" % (320 * len(strategies)),
          "set output '%s'" % a.plot, "set datafile separator ','",
          "set multiplot layout %d,1" % len(strategies), "set yrange [0:1]",
          "set ylabel 'share of requests'", "set key outside right",
          "set arrow 1 from %g, graph 0 to %g, graph 1 nohead dt 2" % (a.degrade_at, a.degrade_at),
          "set arrow 2 from %g, graph 0 to %g, graph 1 nohead dt 2" % (a.heal_at, a.heal_at)]
    for i, strategy in enumerate(strategies):
        gp.append("set title '%s: c fails 40%% of requests from %gs to %gs (%d requests/s)'"
                  % (strategy, a.degrade_at, a.heal_at, a.rate))
        gp.append("set xlabel '%s'" % ("seconds" if i == len(strategies) - 1 else ""))
        csv = a.csv_prefix + strategy + ".csv"
        gp.append("plot " + ", ".join("'%s' using 1:%d every ::1 with lines lw 2 title '%s'"
                                      % (csv, j + 2, n) for j, n in enumerate(names)))
    gp.append("unset multiplot")
    subprocess.run(["gnuplot"], input="\n".join(gp) + "\n", text=True, check=True)
    print("plot: %s" % a.plot)


if __name__ == "__main__":
    main()
