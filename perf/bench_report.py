#!/usr/bin/env python3
"""perf/bench_report.py: the CSVs, gnuplot PNGs and Markdown of perf/bench.sh's
sections (issue 15): saturation, sweep, rate, features, scaling.

Input: the raw row files bench.sh wrote in its temp dir (space-separated, one
measurement a row, formats in bench.sh). Output: <outdir>/<section>.csv and
<outdir>/<plot>.png, and the Markdown of the sections on stdout (image links
relative to the Markdown file, --img-prefix). Reports what was measured only:
a section without rows is left out.
"""

import argparse
import csv
import os
import statistics
import subprocess
import sys

ARGS = None  # the command line (table() reads the image prefix)
PLAIN = ["sluice-base", "sluice", "nginx", "haproxy"]
TEST_NAMES = {"get": "GET", "post1k": "POST 1 KB", "post5k": "POST 5 KB", "post100k": "POST 100 KB",
              "postjson": "POST 1 KB JSON", "get_close": "GET, new connection per request", "https_get": "HTTPS GET (TLS 1.3)",
              "h2c": "HTTP/2 (h2c) GET", "h2tls": "HTTP/2 over TLS GET"}
# Cost of features: the row's proxy (and test) against its base proxy's plain
# GET of the same section; success-rate routing against the weighted pick
# over the same two Backends.
FEATURES = {
    "sluice-log-file": ("sluice", "traffic log, file sink"),
    "sluice-log-http": ("sluice", "traffic log, http sink"),
    "sluice-log-es": ("sluice", "traffic log, elasticsearch sink"),
    "sluice-log-ch": ("sluice", "traffic log, clickhouse sink"),
    "sluice-chain": ("sluice", "policy chain: api-key + rate-limit + headers + cors"),
    "sluice-jwt": ("sluice", "policy: jwt (RS256)"),
    "sluice-rr": ("sluice", "two Backends, weighted pick"),
    "sluice-srate": ("sluice-rr", "two Backends, success-rate routing"),
    "nginx-log": ("nginx", "JSON access_log"),
    "nginx-chain": ("nginx", "chain equivalent: key map + limit_req + add_header"),
}
# Each policy alone: perf/bench.sh's sluice-pol-NAME variants.
for _p in ("api-key", "basic-auth", "rate-limit", "headers", "cors", "ip-filter", "request-size",
           "rewrite", "cache", "json-schema"):
    FEATURES["sluice-pol-" + _p] = ("sluice", "policy alone: " + _p +
                                    (" (hits: the origin is not called)" if _p == "cache" else ""))


# One colour per proxy in every picture (gnuplot line colour index).
COLOURS = {"sluice": 1, "nginx": 2, "haproxy": 3, "sluice-base": 4, "origin": 8}


def order(name):
    """Rows in the order origin, sluice-base, sluice, nginx, haproxy, variants."""
    peers = ["origin"] + PLAIN
    return (peers.index(name) if name in peers else len(peers), name)


def colour(name):
    return COLOURS.get(name, 5)


def is_number(x):
    try:
        float(x)
        return True
    except (TypeError, ValueError):
        return False


def rows_of(path):
    if not path or not os.path.exists(path):
        return []
    return [line.split() for line in open(path) if line.strip()]


def routes_label(routes):
    if routes == "1":
        return "1 Api"
    a, o = routes.split("x") if "x" in routes else (int(routes) // 10, 10)
    return "%s Apis x %s operations" % (a, o)


def write_csv(outdir, name, header, rows):
    with open(os.path.join(outdir, name), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def fmt(x, nd=1):
    return ("%%.%df" % nd) % x


def ratio(a, b):
    return "%.2f" % (a / b) if b else "n/a"


def table(md, title, intro, columns, rows, png=None, alt=""):
    """A section: its heading, intro, picture (png name in the report dir)
    and a Markdown table; columns are names, a leading '>' right-aligns."""
    md.append("## %s\n" % title)
    md.append(intro + "\n")
    if png:
        md.append("![%s](%s%s.png)\n" % (alt, ARGS.img_prefix, png))
    md.append("| %s |" % " | ".join(c.lstrip(">") for c in columns))
    md.append("| %s |" % " | ".join("---:" if c.startswith(">") else "---" for c in columns))
    for r in rows:
        md.append("| %s |" % " | ".join(str(x) for x in r))
    md.append("")


def measured(path):
    """bench.sh's measure rows, the median of the rounds per (proxy, test,
    routes, workers): dicts with requests (summed), rps, cpu, errors."""
    groups = {}
    for r in rows_of(path):
        key = (r[0], r[1], r[7] if len(r) > 7 else "1", r[8] if len(r) > 8 else "1")
        groups.setdefault(key, []).append(r)
    out = {}
    for key, rs in groups.items():
        out[key] = {"requests": sum(int(r[2]) for r in rs),
                    "rps": statistics.median(float(r[3]) for r in rs),
                    "cpu": statistics.median(float(r[4]) for r in rs),
                    "errors": sum(int(r[5]) for r in rs), "rounds": len(rs)}
    return out


class Plot:
    def __init__(self, outdir):
        self.outdir = outdir
        self.made = []

    def draw(self, name, script, size="960,540"):
        path = os.path.join(self.outdir, name + ".png")
        # Names relative to the report dir: `cd DIR && gnuplot NAME.gp` redraws.
        head = ('set terminal pngcairo size %s font "sans,10"\nset output "%s.png"\n'
                'set grid\nset key outside right top\n' % (size, name))
        gp = os.path.join(self.outdir, name + ".gp")
        with open(gp, "w") as f:
            f.write(head + script)
        p = subprocess.run(["gnuplot", name + ".gp"], capture_output=True, text=True, cwd=self.outdir)
        if p.returncode != 0 or not os.path.exists(path):
            sys.exit("gnuplot failed on %s: %s" % (gp, p.stderr))
        self.made.append(path)

    def data(self, name, rows):
        with open(os.path.join(self.outdir, name), "w") as f:
            for r in rows:
                f.write(" ".join(str(x) if is_number(x) else '"%s"' % x for x in r) + "\n")
        return name


def saturation(a, md, plot):
    m = measured(a.results)
    if not m:
        return {}
    rows = []
    keys = sorted(m, key=lambda k: (k[2] != "1", int(k[2].split("x")[0]) if k[2] != "1" else 0,
                                    list(TEST_NAMES).index(k[1]) if k[1] in TEST_NAMES else 99,
                                    order(k[0])))
    for k in keys:
        proxy, test, routes, workers = k
        v, ng = m[k], m.get(("nginx", test, routes, workers))
        rows.append([proxy, test, routes, workers, v["requests"], fmt(v["rps"]), fmt(v["cpu"], 2),
                     v["errors"], ratio(v["rps"], ng["rps"]) if ng else "",
                     ratio(v["cpu"], ng["cpu"]) if ng else ""])
    write_csv(a.outdir, "saturation.csv", ["proxy", "test", "routes", "workers", "requests",
                                           "requests_per_s", "cpu_us_per_request", "errors",
                                           "rps_vs_nginx", "cpu_vs_nginx"], rows)
    table(md, "Saturation matrix", "wrk, %s connections, closed loop: the most each proxy does on one core. "
              "Route sets: `1 Api` = one catch-all Api (prefix `/`); `A Apis x O operations` = "
              "A*O exact routes `/apiI/opJ` (sluice: Apis with exact operations; nginx: "
              "`location = /apiI/opJ`; HAProxy: a map of path to backend with "
              "`use_backend %%[path,map(...)]`), each request to the table's last route. "
              "CSV: [saturation.csv](%ssaturation.csv)." % (a.connections, a.img_prefix),
          ["test", "routes", "proxy", ">requests/s", ">CPU µs/request", ">errors", ">req/s vs nginx",
           ">CPU/req vs nginx"],
          [[TEST_NAMES.get(r[1], r[1]), routes_label(r[2]), r[0], r[5], r[6], r[7], r[8] or "n/a",
            r[9] or "n/a"] for r in rows if r[3] == "1"])
    return m


def sweep(a, md, plot):
    rows = rows_of(a.sweep)
    if not rows:
        return {}
    by = {}
    for proxy, conns, rps, p50, p99, err in rows:
        by.setdefault(proxy, []).append((int(conns), float(rps), float(p50), float(p99), int(err)))
    knees = {}
    out = []
    for proxy, steps in by.items():
        steps.sort()
        knee = None
        for i in range(len(steps) - 1):
            if steps[i + 1][1] < 1.10 * steps[i][1]:
                knee = steps[i][0]
                break
        knees[proxy] = knee
        for c, rps, p50, p99, err in steps:
            out.append([proxy, c, fmt(rps), fmt(p50), fmt(p99), err, 1 if c == knee else 0])
    write_csv(a.outdir, "sweep.csv", ["proxy", "connections", "requests_per_s", "p50_us", "p99_us",
                                      "errors", "knee"], out)
    series, knee_pts = [], []
    for proxy in by:
        d = plot.data("sweep-%s.dat" % proxy, [(c, rps) for c, rps, *_ in by[proxy]])
        series.append('"%s" using 1:2 with linespoints lw 2 pt 7 lc %d title "%s"' % (
            d, colour(proxy), proxy))
        if knees[proxy] is not None:
            k = [s for s in by[proxy] if s[0] == knees[proxy]][0]
            kd = plot.data("sweep-%s-knee.dat" % proxy, [(k[0], k[1])])
            knee_pts.append('"%s" using 1:2 with points pt 6 ps 3 lw 2 lc %d title "knee, %s"' % (
                kd, colour(proxy), proxy))
    plot.draw("sweep", 'set title "Requests/s vs connections (wrk, one proxy core)"\n'
              'set logscale x\nset xlabel "connections"\nset ylabel "requests/s"\nset yrange [0:*]\n'
              "plot " + ", ".join(series + knee_pts) + "\n")
    table(md, "Concurrency sweep", "wrk `--latency` at each number of connections, %s per step; the "
          "knee is the step after which requests/s rise by less than 10%%. "
          "CSV: [sweep.csv](%ssweep.csv)." % (a.sweep_duration, a.img_prefix),
          ["proxy", ">connections", ">requests/s", ">p50 µs", ">p99 µs", ">errors", "knee"],
          [r[:6] + ["knee" if r[6] else ""] for r in out], "sweep", "requests/s vs connections")
    md.append("Knee: " + "; ".join("%s at %s connections" % (p, k if k is not None else "none (still rising)")
                                   for p, k in knees.items()) + ".\n")
    return knees


# The busy columns of a rate row (bench.sh's cpus_busy_ticks), percent of the run.
BUSY = ["proxy_busy", "load_busy", "origin_busy"]


def load_busy(v):
    """The busier of the client's and the origin's CPUs in a rate row: the
    one whose queue, when full, sets the tail whatever the proxy does."""
    return max(v.get("load_busy", 0), v.get("origin_busy", 0))


def rate(a, md, plot):
    rows = rows_of(a.rate)
    if not rows:
        return {}
    cols = ["p50", "p90", "p99", "p999", "max"]
    names = ["rate"] + cols + ["errors", "completed"]
    # One row per (target, load, round); each figure is the median over the
    # rounds (errors: their sum), every round kept in rate-rounds.csv.
    rounds = {}
    for r in rows:
        # round, then (bench.sh since the steal check) the run's steal in ms
        # and how many runs it took (2: the first lost too much to steal).
        # Then the busy percent of the proxy's, the load's and the origin's
        # CPUs during the run.
        extra = [int(r[10]) if len(r) > 10 else 1, int(r[11]) if len(r) > 11 else -1,
                 int(r[12]) if len(r) > 12 else 1] + [float(x) for x in r[13:16]]
        rounds.setdefault((r[0], int(r[1])), []).append(
            dict(zip(names + ["round", "steal", "runs"] + BUSY, [float(x) for x in r[2:10]] + extra)))
    busy = [c for c in BUSY if all(c in x for rs in rounds.values() for x in rs)]
    by = {}
    for k, rs in rounds.items():
        by[k] = {c: statistics.median(x[c] for x in rs) for c in names + ["steal"] + busy}
        by[k]["errors"] = sum(x["errors"] for x in rs)
        by[k]["rounds"] = len(rs)
    # Paired rounds: in each round every target ran once, minutes apart at
    # most, so a stall of the machine tends to hit one round of one target.
    # How often sluice's percentile was at or below nginx's in the same round
    # says whether a median difference is the proxies' or the machine's.
    for (t, pct), rs in rounds.items():
        if t != "sluice" or ("nginx", pct) not in rounds:
            continue
        ng = {x["round"]: x for x in rounds[("nginx", pct)]}
        pairs = [(x, ng[x["round"]]) for x in rs if x["round"] in ng]
        by[(t, pct)]["pairs"] = len(pairs)
        for c in ("p99", "p999"):
            by[(t, pct)]["wins_" + c] = sum(1 for x, y in pairs if x[c] <= y[c])
    write_csv(a.outdir, "rate-rounds.csv", ["target", "load_pct", "round", "rate", "p50_us", "p90_us",
                                            "p99_us", "p999_us", "max_us", "errors", "completed",
                                            "steal_ms", "runs"] + ["%s_pct" % c for c in busy],
              [[t, pct, x["round"], int(x["rate"])] + [fmt(x[c]) for c in cols] +
               [int(x["errors"]), int(x["completed"]), x["steal"], x["runs"]] +
               ["%.1f" % x[c] for c in busy]
               for (t, pct), rs in sorted(rounds.items(), key=lambda kv: (order(kv[0][0]), kv[0][1]))
               for x in sorted(rs, key=lambda x: x["round"])])
    nrounds = max(v["rounds"] for v in by.values())
    allruns = [x for rs in rounds.values() for x in rs]
    rerun = sum(1 for x in allruns if x["runs"] > 1)
    out = []
    for (target, pct), v in sorted(by.items(), key=lambda kv: (order(kv[0][0]), kv[0][1])):
        o = by.get(("origin", pct))
        added = [fmt(v[c] - o[c]) if o and target != "origin" else "" for c in cols[:4]]
        out.append([target, pct, int(v["rate"])] + [fmt(v[c]) for c in cols] +
                   [int(v["errors"]), int(v["completed"])] + added + [int(v["steal"])] +
                   ["%.1f" % v[c] for c in busy])
    write_csv(a.outdir, "rate.csv", ["target", "load_pct", "rate", "p50_us", "p90_us", "p99_us",
                                     "p999_us", "max_us", "errors", "completed", "added_p50_us",
                                     "added_p90_us", "added_p99_us", "added_p999_us", "steal_ms"] +
              ["%s_pct" % c for c in busy], out)
    targets = []
    for t, _ in by:
        if t not in targets:
            targets.append(t)
    panels = []
    for ci, (col, title) in enumerate([("p50", "p50"), ("p99", "p99"), ("p999", "p99.9")]):
        series = []
        for t in targets:
            d = plot.data("rate-%s.dat" % t, sorted((pct, by[(t, pct)]["p50"], by[(t, pct)]["p99"],
                                                     by[(t, pct)]["p999"]) for tt, pct in by if tt == t))
            series.append('"%s" using 1:%d with linespoints lw 2 pt 7 lc %d title "%s"' % (
                d, ci + 2, colour(t), t))
        panels.append('set title "%s"\nplot %s\n' % (title, ", ".join(series)))
    # CPU busy columns: the proxy's, and the client's (with the origin's when
    # they share it, as on 2 CPUs; apart otherwise).
    shared = a.origin_cpu == a.load_cpu
    busy_cols, busy_heads = [], []
    for c, head in (("proxy_busy", ">proxy CPU %"),
                    ("load_busy", ">client%s CPU %%" % (" + origin" if shared else "")),
                    ("origin_busy", ">origin CPU %")):
        if c in busy and not (c == "origin_busy" and shared):
            busy_cols.append(c)
            busy_heads.append(head)
    busy_text = ""
    if busy:
        busy_text = ("CPU %%: the share of each CPU's time that was busy during the run (/proc/stat; the "
                     "median of the rounds): the proxy's CPU %s, the client's %s%s. Where the client's "
                     "(or the origin's) CPU is full, requests through a proxy queue there whatever the "
                     "proxy does (perf/README.md), so a load at which it was %g%% busy or more in "
                     "sluice's or nginx's runs does not decide the tail target (RATE_BUSY_MAX). "
                     % (a.proxy_cpu, a.load_cpu, " (the origin's too)" if shared
                        else ", the origin's %s" % a.origin_cpu, a.rate_busy_max))
    plot.draw("latency", 'set multiplot layout 1,3 title "Latency at fixed rates (open loop, '
              'perf/openload): percent of the slowest proxy\'s saturation rate"\n'
              'set logscale y\nset xlabel "load, % of saturation"\nset ylabel "µs"\n'
              'set key inside top left font ",8"\nset xtics (25, 50, 75)\nset xrange [15:85]\n' +
              "".join(panels) + "unset multiplot\n")
    table(md, "Latency at fixed rates", "perf/openload: requests scheduled at a fixed rate (%s%% of %s requests/s, the slowest "
              "proxy's GET saturation rate in this run) over %s keep-alive connections, each latency "
              "measured from its scheduled send time (no coordinated omission), 1 s warm-up then %s s. "
              "Every proxy runs for the whole section and the targets take turns, %d round(s) per load "
              "with the order rotated each round; each figure is the median of the rounds (errors: "
              "their sum), so one stall of the machine does not decide a proxy's row; the headlines "
              "also count the rounds in which sluice's p99 and p99.9 were at or below nginx's. "
              "`origin` is the origin called directly; added = proxy - origin at the same percentile. "
              "Steal: the milliseconds the hypervisor took from the proxy's and the load's CPUs during "
              "a run (/proc/stat; the median of the rounds). A run that lost more than %s ms ran once "
              "more, for at most a quarter of the runs, and the run with less steal counts (%d of "
              "%d runs ran twice); a gap of the vCPU delays "
              "every request scheduled in it, whatever the proxy. %s"
              "CSV: [rate.csv](%srate.csv), every round: [rate-rounds.csv](%srate-rounds.csv)."
              % ("/".join(str(p) for p in sorted({k[1] for k in by})), a.sat_rate,
                 a.rate_connections, a.rate_duration, nrounds, a.rate_max_steal_ms or "?", rerun,
                 len(allruns), busy_text, a.img_prefix, a.img_prefix),
          ["target", ">load %", ">rate/s", ">p50 µs", ">p90 µs", ">p99 µs", ">p99.9 µs", ">max µs",
           ">errors", ">added p50", ">added p99", ">added p99.9", ">steal ms"] + busy_heads,
          [r[:9] + [r[10], r[12], r[13], r[14]] + ["%.0f" % float(r[15 + busy.index(c)]) for c in busy_cols]
           for r in out], "latency", "latency percentiles vs load")
    return by


def features(a, md, plot):
    m = measured(a.features)
    if not m:
        return []
    out = []
    for (proxy, test, _, _), v in m.items():
        if proxy in FEATURES:
            base, what = FEATURES[proxy]
            b = m.get((base, test, "1", "1"))  # json-schema: both on postjson
        elif test != "get":
            base, what, b = proxy, TEST_NAMES.get(test, test), m.get((proxy, "get", "1", "1"))
        else:
            continue
        if not b:
            continue
        out.append([base, what, proxy, test, fmt(v["rps"]), fmt(v["cpu"], 2), v["errors"],
                    fmt(b["cpu"], 2), fmt(v["cpu"] - b["cpu"], 2), ratio(v["cpu"], b["cpu"])])
    for (proxy, test, _, _), v in m.items():  # the plain rows, for the picture and the CSV
        if proxy in PLAIN and test == "get":
            out.append([proxy, "plain proxying (HTTP/1.1 GET)", proxy, test, fmt(v["rps"]),
                        fmt(v["cpu"], 2), v["errors"], fmt(v["cpu"], 2), "0.00", "1.00"])
    def root(base):  # sluice-srate's base is sluice-rr, a variant of sluice
        return base if base in PLAIN or base not in FEATURES else FEATURES[base][0]
    out.sort(key=lambda r: (PLAIN.index(root(r[0])) if root(r[0]) in PLAIN else 9, r[9] != "1.00", r[1]))
    write_csv(a.outdir, "features.csv", ["base", "feature", "proxy", "test", "requests_per_s",
                                         "cpu_us_per_request", "errors", "base_cpu_us_per_request",
                                         "added_cpu_us", "cpu_ratio"], out)
    d = plot.data("features.dat", [("%s: %s" % (r[0], r[1][:34]), r[5], colour(r[0])) for r in out])
    plot.draw("features", 'set title "CPU µs per request by feature (GET, one core)"\n'
              'set style fill solid 0.8\nset boxwidth 0.7\nset key off\n'
              'set ylabel "CPU µs/request"\nset yrange [0:*]\nset bmargin 16\nset rmargin 12\n'
              'set xtics rotate by -45 left font ",8"\n'
              'plot "%s" using 0:2:3:xtic(1) with boxes lc variable\n' % d, size="1100,700")
    table(md, "Cost of features", "GET through each variant against plain GET through its proxy, in this section, "
              "the median of %d round(s) (every proxy and variant once per round, the order reversed "
              "every other round) "
              "(wrk, %s connections; TLS = HTTPS GET over TLS 1.3 with wrk, HTTP/2 = h2load h2c); "
              "success-rate routing against the weighted pick over the same two Backends (the "
              "`plain GET µs` column then holds the weighted pick's); json-schema on a 1 KB JSON "
              "POST against the same POST through plain sluice (the column then holds that POST's). "
              "CSV: [features.csv](%sfeatures.csv)." % (max(v["rounds"] for v in m.values()),
                                                        a.connections, a.img_prefix),
          ["proxy", "feature", ">requests/s", ">CPU µs/request", ">errors", ">plain GET µs",
           ">added µs", ">ratio"], [[r[2], r[1]] + r[4:] for r in out], "features",
          "CPU µs per request per feature")
    return out


def scaling(a, md, plot):
    m = measured(a.scaling)
    if not m:
        return []
    out = []
    for (proxy, test, _, workers), v in sorted(m.items(), key=lambda kv: (order(kv[0][0]), int(kv[0][3]))):
        cores = v["rps"] * v["cpu"] / 1e6
        out.append([proxy, int(workers), fmt(v["rps"]), fmt(v["cpu"], 2), fmt(cores, 2),
                    fmt(v["rps"] / int(workers)), fmt(v["rps"] / cores if cores else 0), v["errors"]])
    write_csv(a.outdir, "scaling.csv", ["proxy", "workers", "requests_per_s", "cpu_us_per_request",
                                        "cores_used", "requests_per_s_per_worker",
                                        "requests_per_cpu_second", "errors"], out)
    series = []
    for proxy in dict.fromkeys(r[0] for r in out):
        d = plot.data("scaling-%s.dat" % proxy, [(r[1], r[2]) for r in out if r[0] == proxy])
        series.append('"%s" using 1:2 with linespoints lw 2 pt 7 lc %d title "%s"' % (
            d, colour(proxy), proxy))
    plot.draw("scaling", 'set title "Requests/s by workers (GET)"\nset xlabel "workers"\n'
              'set ylabel "requests/s"\nset yrange [0:*]\nset xtics 1\n'
              "plot " + ", ".join(series) + "\n")
    table(md, "Scaling with workers", "GET with N workers (sluice `--workers N`, nginx `worker_processes N`, HAProxy "
              "`nbthread N`) pinned to CPUs 0..N-1; the load generator and the origin stay on "
              "CPU %s, so on a 2-core machine 2 workers share a core with them: run with `CPUS=` on a "
              "bigger machine for the real curve. cores used = CPU seconds / wall seconds. Each figure "
              "is the median of %d round(s), the order reversed every other round. "
              "CSV: [scaling.csv](%sscaling.csv)." % (a.load_cpu, max(v["rounds"] for v in m.values()),
                                                       a.img_prefix),
          ["proxy", ">workers", ">requests/s", ">CPU µs/request", ">cores used",
           ">requests/s per worker", ">requests per CPU second", ">errors"], out, "scaling",
          "requests/s by workers")
    return out


def main():
    ap = argparse.ArgumentParser()
    for f in ("results", "sweep", "rate", "features", "scaling"):
        ap.add_argument("--" + f)
    ap.add_argument("--outdir", required=True)
    ap.add_argument("--img-prefix", default="")
    ap.add_argument("--sat-rate", default="")
    ap.add_argument("--connections", default="")
    ap.add_argument("--sweep-duration", default="")
    ap.add_argument("--rate-connections", default="")
    ap.add_argument("--rate-duration", default="")
    ap.add_argument("--rate-max-steal-ms", default="")
    ap.add_argument("--load-cpu", default="1")
    ap.add_argument("--origin-cpu", default=None)
    ap.add_argument("--proxy-cpu", default="0")
    ap.add_argument("--rate-busy-max", type=float, default=95.0)
    global ARGS
    a = ARGS = ap.parse_args()
    if a.origin_cpu is None:
        a.origin_cpu = a.load_cpu
    os.makedirs(a.outdir, exist_ok=True)
    plot = Plot(a.outdir)
    md = []
    sat = saturation(a, md, plot)
    knees = sweep(a, md, plot)
    by_rate = rate(a, md, plot)
    features(a, md, plot)
    scaling(a, md, plot)
    # The closing note: headline ratios and the knee per proxy.
    notes = []
    s, n = sat.get(("sluice", "get", "1", "1")), sat.get(("nginx", "get", "1", "1"))
    if s and n:
        notes.append("GET, one Api: sluice does %s× nginx's requests/s at %s× its CPU per request."
                     % (ratio(s["rps"], n["rps"]), ratio(s["cpu"], n["cpu"])))
    h = sat.get(("haproxy", "get", "1", "1"))
    if s and h:
        notes.append("Against HAProxy: %s× the requests/s, %s× the CPU per request."
                     % (ratio(s["rps"], h["rps"]), ratio(s["cpu"], h["cpu"])))
    big = [k for k in sat if k[0] == "sluice" and k[1] == "get" and k[2] != "1"]
    for k in big:
        notes.append("GET with %s: sluice %s× its one-Api CPU per request (nginx %s×)." % (
            routes_label(k[2]), ratio(sat[k]["cpu"], s["cpu"]) if s else "n/a",
            ratio(sat[("nginx",) + k[1:]]["cpu"], n["cpu"]) if n and ("nginx",) + k[1:] in sat
            else "n/a"))
    if knees:
        notes.append("Knee: " + ", ".join("%s %s" % (p, "%s connections" % k if k else "not reached")
                                          for p, k in knees.items()) + ".")
    if by_rate:
        top = max(p for _, p in by_rate)
        o = by_rate.get(("origin", top))
        if o:
            parts = []
            for t in ("sluice", "nginx", "haproxy"):
                v = by_rate.get((t, top))
                if v:
                    parts.append("%s +%s / +%s µs" % (t, fmt(v["p99"] - o["p99"]), fmt(v["p999"] - o["p999"])))
            notes.append("Added p99 / p99.9 at %d%% load: %s." % (top, ", ".join(parts)))
        verdicts = []
        for pct in sorted({p for _, p in by_rate}):
            sl, ng = by_rate.get(("sluice", pct)), by_rate.get(("nginx", pct))
            if sl and ng:
                met = sl["p99"] <= ng["p99"] and sl["p999"] <= ng["p999"]
                paired = ""
                if sl.get("pairs"):
                    paired = "; at or below nginx's in %d (p99) and %d (p99.9) of %d rounds" % (
                        sl["wins_p99"], sl["wins_p999"], sl["pairs"])
                verdict = "met" if met else "not met"
                full = round(max(load_busy(sl), load_busy(ng)), 1)  # as rate.csv has it
                if "load_busy" in sl and "load_busy" in ng and full >= a.rate_busy_max:
                    verdict = ("not decided on this machine: the client's CPU was %.0f%% busy "
                               "(RATE_BUSY_MAX %g), so the tail is its queue's" % (full, a.rate_busy_max))
                verdicts.append("%d%%: %s (median p99 %s vs %s µs, p99.9 %s vs %s µs%s)" % (
                    pct, verdict, fmt(sl["p99"]), fmt(ng["p99"]),
                    fmt(sl["p999"]), fmt(ng["p999"]), paired))
        if verdicts:
            notes.append("Target (sluice's added p99 and p99.9 at or below nginx's; the origin "
                         "is the same for both): " + "; ".join(verdicts) + ".")
    if notes:
        md.append("## Headlines\n")
        md.extend("- " + x for x in notes)
        md.append("")
    print("\n".join(md))


if __name__ == "__main__":
    main()
