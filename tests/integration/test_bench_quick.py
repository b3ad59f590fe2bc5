"""`make bench` in QUICK=1 mode (perf/bench.sh, issue 15) runs all five
sections into a temp dir and writes well-formed CSVs beside the Markdown:
the columns, numbers where numbers belong, every proxy present, and PNGs.
No figure is judged: timings are never assertions (DESIGN.md "Measuring
performance"). Needs nginx, HAProxy, wrk, h2load and gnuplot (make deps).
"""

import csv
import os
import shutil
import subprocess

import pytest

from helpers import REPO, build_dir

PROXIES = {"sluice", "nginx", "haproxy"}
BUSY = ["proxy_busy_pct", "load_busy_pct", "origin_busy_pct"]
TOOLS = ["nginx", "haproxy", "wrk", "h2load", "gnuplot", "curl", "openssl", "taskset"]


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows, "%s is empty" % path
    return rows[0], [dict(zip(rows[0], r)) for r in rows[1:]]


def is_number(x):
    try:
        float(x)
        return True
    except ValueError:
        return False


def check(path, columns, numeric, min_rows=1):
    header, rows = read(path)
    assert header == columns, (path, header)
    assert len(rows) >= min_rows, path
    for r in rows:
        assert len(r) == len(columns), (path, r)
        for c in numeric:
            assert is_number(r[c]), (path, c, r)
    return rows


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    # The smoke run checks the generator and the report's format, which do
    # not depend on how the runtime was built; under the sanitizer pass it
    # would only add minutes (every proxy path is already exercised there).
    if "/san-" in build_dir():
        pytest.skip("bench smoke run: only with the normal build (SLUICE_BUILD=%s)"
                    % build_dir())
    missing = [t for t in TOOLS if not shutil.which(t) and not os.path.exists("/usr/sbin/" + t)]
    assert not missing, "missing %s: run make deps" % " ".join(missing)
    out = tmp_path_factory.mktemp("bench")
    env = dict(os.environ, QUICK="1", BUILD=build_dir(), OUT=str(out / "benchmarks.md"),
               TMPDIR=str(out))
    p = subprocess.run([os.path.join(REPO, "perf", "bench.sh")], env=env, capture_output=True,
                       text=True, timeout=1200, cwd=REPO)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out


def test_saturation_csv(quick_run):
    rows = check(quick_run / "benchmarks" / "saturation.csv",
                 ["proxy", "test", "routes", "workers", "requests", "requests_per_s",
                  "cpu_us_per_request", "errors", "rps_vs_nginx", "cpu_vs_nginx"],
                 ["requests", "requests_per_s", "cpu_us_per_request", "errors", "rps_vs_nginx",
                  "cpu_vs_nginx"])
    cells = {(r["proxy"], r["test"], r["routes"]) for r in rows}
    for proxy in PROXIES:
        for test in ("get", "post100k", "get_close"):
            assert (proxy, test, "1") in cells, (proxy, test)
        assert (proxy, "get", "10000") in cells, proxy
    assert all(int(r["requests"]) > 0 for r in rows)


def test_sweep_csv(quick_run):
    rows = check(quick_run / "benchmarks" / "sweep.csv",
                 ["proxy", "connections", "requests_per_s", "p50_us", "p99_us", "errors", "knee"],
                 ["connections", "requests_per_s", "p50_us", "p99_us", "errors", "knee"])
    for proxy in PROXIES:
        steps = [int(r["connections"]) for r in rows if r["proxy"] == proxy]
        assert steps == [1, 10, 50, 200, 1000], (proxy, steps)
        assert sum(int(r["knee"]) for r in rows if r["proxy"] == proxy) <= 1


def test_rate_csv(quick_run):
    rows = check(quick_run / "benchmarks" / "rate.csv",
                 ["target", "load_pct", "rate", "p50_us", "p90_us", "p99_us", "p999_us", "max_us",
                  "errors", "completed", "added_p50_us", "added_p90_us", "added_p99_us",
                  "added_p999_us", "steal_ms"] + BUSY,
                 ["load_pct", "rate", "p50_us", "p90_us", "p99_us", "p999_us", "max_us", "errors",
                  "completed", "steal_ms"] + BUSY)
    for target in PROXIES | {"origin"}:
        loads = sorted(int(r["load_pct"]) for r in rows if r["target"] == target)
        assert loads == [25, 50, 75], (target, loads)
    for r in rows:
        p = [float(r[c]) for c in ("p50_us", "p90_us", "p99_us", "p999_us", "max_us")]
        assert p == sorted(p), r
        if r["target"] != "origin":
            assert all(is_number(r[c]) for c in ("added_p50_us", "added_p99_us", "added_p999_us")), r
        assert all(0 <= float(r[c]) <= 100 for c in BUSY), r
        # The client and the origin share CPU 1 here: one CPU, one figure.
        assert r["load_busy_pct"] == r["origin_busy_pct"], r


def test_rate_rounds_csv(quick_run):
    """Every round of every (target, load) is kept, and rate.csv's figures
    are their medians (one round in QUICK mode: the same numbers)."""
    rows = check(quick_run / "benchmarks" / "rate-rounds.csv",
                 ["target", "load_pct", "round", "rate", "p50_us", "p90_us", "p99_us", "p999_us",
                  "max_us", "errors", "completed", "steal_ms", "runs"] + BUSY,
                 ["load_pct", "round", "rate", "p50_us", "p90_us", "p99_us", "p999_us", "max_us",
                  "errors", "completed", "steal_ms", "runs"] + BUSY)
    _, summary = read(quick_run / "benchmarks" / "rate.csv")
    by = {(r["target"], r["load_pct"]): r for r in summary}
    assert {(r["target"], r["load_pct"]) for r in rows} == set(by)
    for r in rows:
        assert r["round"] == "1", r
        # A run that lost over RATE_MAX_STEAL_MS to the hypervisor runs once
        # more; the steal counted is that of the run kept.
        assert r["runs"] in ("1", "2") and int(r["steal_ms"]) >= 0, r
        s = by[(r["target"], r["load_pct"])]
        assert [r[c] for c in ("p50_us", "p99_us", "p999_us", "max_us")] == \
            [s[c] for c in ("p50_us", "p99_us", "p999_us", "max_us")], (r, s)


def test_features_csv(quick_run):
    rows = check(quick_run / "benchmarks" / "features.csv",
                 ["base", "feature", "proxy", "test", "requests_per_s", "cpu_us_per_request",
                  "errors", "base_cpu_us_per_request", "added_cpu_us", "cpu_ratio"],
                 ["requests_per_s", "cpu_us_per_request", "errors", "base_cpu_us_per_request",
                  "added_cpu_us", "cpu_ratio"])
    cells = {(r["proxy"], r["test"]) for r in rows}
    for proxy in PROXIES:
        for test in ("get", "https_get", "h2c"):
            assert (proxy, test) in cells, (proxy, test)
    for variant in ("sluice-log-file", "sluice-chain", "nginx-chain", "sluice-pol-basic-auth",
                    "sluice-pol-cache"):
        assert (variant, "get") in cells, variant
    assert ("sluice-pol-json-schema", "postjson") in cells
    # A policy alone lets the benchmark's traffic through: basic-auth got
    # its own credentials, the cache its hits.
    for r in rows:
        if r["proxy"].startswith("sluice-pol-"):
            assert r["feature"].startswith("policy alone: "), r
            assert int(r["errors"]) == 0, r


def test_scaling_csv(quick_run):
    rows = check(quick_run / "benchmarks" / "scaling.csv",
                 ["proxy", "workers", "requests_per_s", "cpu_us_per_request", "cores_used",
                  "requests_per_s_per_worker", "requests_per_cpu_second", "errors"],
                 ["workers", "requests_per_s", "cpu_us_per_request", "cores_used",
                  "requests_per_s_per_worker", "requests_per_cpu_second", "errors"])
    want = list(range(1, len(os.sched_getaffinity(0)) + 1))  # CPUS defaults to nproc
    for proxy in PROXIES:
        workers = sorted(int(r["workers"]) for r in rows if r["proxy"] == proxy)
        assert workers == want, (proxy, workers)


def test_markdown_and_plots(quick_run):
    md = (quick_run / "benchmarks.md").read_text()
    assert "Smoke run (QUICK=1)" in md
    for heading in ("## Saturation matrix", "## Concurrency sweep", "## Latency at fixed rates",
                    "## Cost of features", "## Scaling with workers", "## Headlines"):
        assert heading in md, heading
    for png in ("sweep", "latency", "features", "scaling"):
        path = quick_run / "benchmarks" / (png + ".png")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
        assert "(benchmarks/%s.png)" % png in md
    # the temp dirs of the run are gone (its TMPDIR was quick_run)
    assert not [p for p in os.listdir(quick_run) if p.startswith("sluice-bench.")]


def test_target_counts_paired_rounds(quick_run):
    """The tail target's headline says, per load, in how many rounds sluice's
    p99 and p99.9 were at or below nginx's in the same round, as
    rate-rounds.csv has them; and its verdict follows rate.csv: not decided
    where the client's CPU was at least RATE_BUSY_MAX (95) percent busy in
    sluice's or nginx's runs, else met or not by the medians."""
    import re
    _, rows = read(quick_run / "benchmarks" / "rate-rounds.csv")
    by = {(r["target"], int(r["load_pct"]), r["round"]): r for r in rows}
    _, medians = read(quick_run / "benchmarks" / "rate.csv")
    summary = {(r["target"], int(r["load_pct"])): r for r in medians}
    md = (quick_run / "benchmarks.md").read_text()
    line = next(x for x in md.splitlines() if x.startswith("- Target ("))
    for pct in (25, 50, 75):
        rounds = sorted(k[2] for k in by if k[0] == "sluice" and k[1] == pct)
        wins = [sum(1 for n in rounds if float(by[("sluice", pct, n)][c]) <=
                    float(by[("nginx", pct, n)][c])) for c in ("p99_us", "p999_us")]
        want = r"%d%%: .*?\(median [^)]*; at or below nginx's in %d \(p99\) and %d " \
               r"\(p99\.9\) of %d rounds\)" % (pct, wins[0], wins[1], len(rounds))
        assert re.search(want, line), (want, line)
        sl, ng = summary[("sluice", pct)], summary[("nginx", pct)]
        full = max(float(x[c]) for x in (sl, ng) for c in ("load_busy_pct", "origin_busy_pct"))
        if full >= 95:
            verdict = "not decided on this machine: the client's CPU was %.0f%% busy" % full
        elif all(float(sl[c]) <= float(ng[c]) for c in ("p99_us", "p999_us")):
            verdict = "met"
        else:
            verdict = "not met"
        assert "%d%%: %s " % (pct, verdict) in line, (pct, verdict, line)
