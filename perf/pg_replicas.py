#!/usr/bin/python3
"""Two controller replicas on PostgreSQL against one controller on SQLite
(issue 14's figure "Two replicas on PostgreSQL: REST write throughput and
write-to-all-runtimes latency compared with one replica on SQLite").

For each setup, the same fleet: RUNTIMES runtimes (--workers 1, each in its
own network namespace), an echo origin, the quickstart Gateway:
- sqlite: one controller, its embedded SQLite store; every runtime on it.
- postgres: two controllers on one PostgreSQL 15 (started here, as in
  tests/integration/pg_env.py, on a loopback port); the runtimes split
  between them (runtime i on replica i % 2).

Measured per setup:
1. REST write throughput: WRITERS threads, each with its own keep-alive
   connection, PUT one-operation Apis (distinct names) for --duration
   seconds; on postgres the writers alternate between the replicas. Writes
   answered 2xx per second, and the p50/p99 of a write's answer.
2. Write to every runtime: --changes sequential PUTs of a probe Api (on
   postgres alternating replicas); time from the REST answer until every
   runtime serves the new path (polled every 1 ms on a keep-alive
   connection per runtime): p50/p99/max.

Not a test (no assertions on times); run it on a quiet machine:
    SLUICE_BUILD=build /usr/bin/python3 perf/pg_replicas.py [--runtimes 4]
Prints a Markdown section (paste it into docs/benchmarks-controller.md).
"""
import argparse
import http.client
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
sys.path.insert(0, os.path.join(REPO, "perf"))

from backend import Backend  # noqa: E402
from controller_env import Controller, ManagedRuntime, NetLab, netns_available, quickstart  # noqa: E402
from helpers import api, backend as backend_doc, free_port  # noqa: E402
from pg_env import Postgres, pg_missing  # noqa: E402
from propagation import Poller, commit, loadavg, machine, pct  # noqa: E402


def write_load(ctls, duration, writers):
    """PUTs of distinct one-operation Apis from `writers` threads, each on
    its own keep-alive connection to ctls[i % len(ctls)]."""
    stop = time.monotonic() + duration
    lat, errors = [], [0]
    lock = threading.Lock()

    def run(i):
        ctl = ctls[i % len(ctls)]
        conn = http.client.HTTPConnection("127.0.0.1", ctl.rest_port, timeout=30)
        k = 0
        mine = []
        while time.monotonic() < stop:
            doc = api("w%d-%d" % (i, k % 50), "/w%d/%d" % (i, k % 50), "echo",
                      operations=[{"method": "GET", "path": "/v%d" % k}])
            body = json.dumps(doc)
            t0 = time.monotonic()
            try:
                conn.request("PUT", "/api/v1/apis/%s" % doc["metadata"]["name"], body,
                             {"Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                ok = 200 <= r.status < 300
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", ctl.rest_port, timeout=30)
                ok = False
            if ok:
                mine.append(time.monotonic() - t0)
            else:
                with lock:
                    errors[0] += 1
            k += 1
        conn.close()
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(writers)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    return {"writes_s": len(lat) / wall, "write_p50_ms": pct(lat, 50) * 1e3,
            "write_p99_ms": pct(lat, 99) * 1e3, "write_errors": errors[0]}


def propagation(ctls, rts, port, changes):
    pollers = [Poller(rt.host, port) for rt in rts]
    samples = []
    with ThreadPoolExecutor(max_workers=len(rts)) as pool:
        for k in range(changes):
            ctl = ctls[k % len(ctls)]
            ctl.put(api("probe", "/probe", "echo", operations=[{"method": "GET",
                                                                 "path": "/c%d" % k}]))
            t0 = time.monotonic()
            lat = list(pool.map(lambda p: p.wait_200("/probe/c%d" % k, t0), pollers))
            samples.append(max(lat))
            time.sleep(0.03)
    return {"all_p50_ms": pct(samples, 50) * 1e3, "all_p99_ms": pct(samples, 99) * 1e3,
            "all_max_ms": max(samples) * 1e3}


def run_setup(kind, nruntimes, duration, writers, changes):
    tmp = tempfile.mkdtemp(prefix="sluice-pgrep-")
    lab = NetLab(nruntimes)
    pg = None
    ctls, rts = [], []
    origin = Backend(host=lab.hub_ip, name="echo").start()
    try:
        if kind == "postgres":
            pg = Postgres(tmp).init()
            for i in range(2):
                ctls.append(Controller(os.path.join(tmp, "c%d" % i), stream_host=lab.hub_ip,
                                       extra_args=["--store", pg.url()]).start())
        else:
            ctls.append(Controller(os.path.join(tmp, "c0"), stream_host=lab.hub_ip).start())
        for i in range(nruntimes):
            ctl = ctls[i % len(ctls)]
            rt = ManagedRuntime(os.path.join(tmp, "rt%d" % i), ctl.stream_addr, "rt-%d" % i,
                                workers=1, lab=lab, index=i)
            rt.start(wait_ready=False)
            rts.append(rt)
        port = free_port()
        ctls[0].apply(quickstart(port, origin.port, backend_host=lab.hub_ip,
                                 listener_address="0.0.0.0"))
        ctls[0].put(backend_doc("echo", [{"address": lab.hub_ip, "port": origin.port}]))
        for rt in rts:
            rt.wait_ready(timeout=60)
        res = {"setup": kind, "replicas": len(ctls), "runtimes": nruntimes}
        res.update(propagation(ctls, rts, port, changes))
        res.update(write_load(ctls, duration, writers))
        return res
    finally:
        for rt in rts:
            rt.stop()
        for c in ctls:
            c.stop()
        origin.stop()
        if pg:
            pg.close()
        lab.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtimes", type=int, default=4)
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--changes", type=int, default=50)
    a = ap.parse_args()
    for reason in (pg_missing(), netns_available()):
        if reason:
            sys.exit("pg_replicas: %s" % reason)
    load0 = loadavg()
    rows = [run_setup(k, a.runtimes, a.duration, a.writers, a.changes)
            for k in ("sqlite", "postgres")]
    print("### Two replicas on PostgreSQL vs one on SQLite (perf/pg_replicas.py)\n")
    print("Measured %s on %s, commit %s; load average %s at the start, %s at the end. "
          "Command:\n\n    SLUICE_BUILD=%s /usr/bin/python3 perf/pg_replicas.py --runtimes %d "
          "--writers %d --duration %g --changes %d\n" % (
              time.strftime("%Y-%m-%d %H:%M"), machine(), commit(), load0, loadavg(),
              os.environ.get("SLUICE_BUILD", "build"), a.runtimes, a.writers, a.duration,
              a.changes))
    print("Writes: %d threads PUT one-operation Apis for %g s, each on a keep-alive connection "
          "(on PostgreSQL alternating replicas). To every runtime: a PUT, then the time until "
          "all %d runtimes serve the new path (%d changes, alternating replicas).\n"
          % (a.writers, a.duration, a.runtimes, a.changes))
    print("| store | replicas | runtimes | writes/s | write p50 ms | write p99 ms | errors "
          "| to all runtimes p50 ms | p99 ms | max ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print("| %s | %d | %d | %.0f | %.1f | %.1f | %d | %.1f | %.1f | %.1f |" % (
            r["setup"], r["replicas"], r["runtimes"], r["writes_s"], r["write_p50_ms"],
            r["write_p99_ms"], r["write_errors"], r["all_p50_ms"], r["all_p99_ms"],
            r["all_max_ms"]))


if __name__ == "__main__":
    main()
