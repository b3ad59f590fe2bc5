"""perf/openload: the open-loop load generator of `make bench` (issue 15).

Validated against origins of known delay (backend.py's /delay/MS): every
latency is at least the origin's delay, and when the origin is slower than
the schedule, latencies are measured from the SCHEDULED send time, so the
requests queued behind a busy connection show their wait (no coordinated
omission). Only lower bounds that follow from the schedule are asserted,
plus generous upper bounds: never a timing of the machine.
"""

import csv
import os
import subprocess

import pytest

from backend import Backend
from helpers import build_dir, closed_port


def openload_binary():
    path = os.path.join(build_dir(), "perf", "openload")
    assert os.path.exists(path), "%s missing: build it with make (target all)" % path
    return path


def run(*args, timeout=60):
    p = subprocess.run([openload_binary(), *[str(a) for a in args]], capture_output=True, text=True,
                       timeout=timeout)
    return p


def summary(p):
    assert p.returncode == 0, p.stderr
    fields = dict(kv.split("=", 1) for kv in p.stdout.split())
    return {k: float(v) for k, v in fields.items()}


@pytest.fixture
def origin():
    b = Backend().start()
    yield b
    b.stop()


def test_latency_includes_the_origins_delay(origin):
    s = summary(run("--port", origin.port, "--path", "/delay/20", "--rate", 50, "--duration", 1,
                    "--connections", 4))
    assert s["requests"] == 50 and s["completed"] == 50 and s["errors"] == 0
    for k in ("p50_us", "p90_us", "p99_us", "p999_us", "max_us"):
        assert 20000 <= s[k] < 2000000, (k, s)
    assert s["p50_us"] <= s["p90_us"] <= s["p99_us"] <= s["p999_us"] <= s["max_us"]
    assert len(origin.requests) >= 50


def test_no_coordinated_omission(origin, tmp_path):
    # One connection, a request scheduled every 50 ms, each taking 100 ms:
    # request k cannot complete before (k + 1) * 100 ms, and was scheduled at
    # k * 50 ms, so its latency is at least 100 + 50 k ms. A closed-loop
    # client would report 100 ms for every request.
    out = tmp_path / "lat.csv"
    s = summary(run("--port", origin.port, "--path", "/delay/100", "--rate", 20, "--duration", 1,
                    "--connections", 1, "--csv", out))
    assert s["completed"] == 20 and s["errors"] == 0
    rows = list(csv.DictReader(open(out)))
    assert [int(r["index"]) for r in rows] == list(range(20))
    for k, r in enumerate(rows):
        assert float(r["scheduled_us"]) == pytest.approx(k * 50000, abs=1)
        assert int(r["status"]) == 200
        assert float(r["latency_us"]) >= (100 + 50 * k) * 1000 - 1000, (k, r)
    # nearest-rank p50 of 20 is the 10th smallest: request 9, >= 550 ms
    assert s["p50_us"] >= 549000
    assert s["max_us"] >= 1049000
    assert s["max_us"] == pytest.approx(max(float(r["latency_us"]) for r in rows), abs=0.2)


def test_post_bodies_and_new_connection_per_request(origin):
    s = summary(run("--port", origin.port, "--path", "/x", "--rate", 200, "--duration", 0.5,
                    "--connections", 4, "--method", "POST", "--body-size", 100000,
                    "--header", "Connection: close"))
    assert s["completed"] == 100 and s["errors"] == 0, s
    posts = [r for r in origin.requests if r["method"] == "POST"]
    assert len(posts) == 100
    assert all(r["body_length"] == 100000 for r in posts)
    # Connection: close: the origin saw (about) one connection per request
    assert len({r["conn_id"] for r in posts}) >= 90


def test_chunked_responses_and_non_2xx_are_counted(origin):
    s = summary(run("--port", origin.port, "--path", "/bytes/70000?chunked=1", "--rate", 100,
                    "--duration", 0.5, "--connections", 2))
    assert s["completed"] == 50 and s["errors"] == 0, s
    s = summary(run("--port", origin.port, "--path", "/status/503", "--rate", 100,
                    "--duration", 0.5, "--connections", 2))
    assert s["completed"] == 50 and s["non2xx"] == 50 and s["errors"] == 50, s


def test_warmup_requests_are_not_reported(origin, tmp_path):
    out = tmp_path / "lat.csv"
    s = summary(run("--port", origin.port, "--rate", 100, "--warmup", 0.3, "--duration", 0.5,
                    "--connections", 2, "--csv", out))
    assert s["requests"] == 50 and s["completed"] == 50
    assert len(origin.requests) == 80
    assert len(list(csv.DictReader(open(out)))) == 50


def test_refused_connections_are_errors_not_a_hang(tmp_path):
    out = tmp_path / "lat.csv"
    s = summary(run("--port", closed_port(), "--rate", 100, "--duration", 0.3, "--timeout", 0.5,
                    "--csv", out))
    assert s["requests"] == 30 and s["completed"] == 0 and s["errors"] == 30
    rows = list(csv.DictReader(open(out)))
    assert len(rows) == 30 and all(r["status"] == "0" and r["latency_us"] == "-1.0" for r in rows)


@pytest.mark.parametrize("args,needle", [
    (["--rate", "10"], "--port is required"),
    (["--port", "80"], "--rate is required"),
    (["--port", "80", "--rate", "fast"], "--rate: 'fast' is not a number"),
    (["--port", "80", "--rate", "10", "--path", "x"], "--path: 'x' must start with /"),
    (["--port", "80", "--rate", "10", "--header", "nocolon"], "--header: 'nocolon' must be"),
    (["--port", "80", "--rate", "10", "--host", "localhost"], "--host: 'localhost' is not an IPv4"),
])
def test_bad_arguments_name_the_option(args, needle):
    p = run(*args)
    assert p.returncode == 2
    assert needle in p.stderr, p.stderr
