"""Debian's real Prometheus server scrapes a controller and a runtime
(issue 11, "Metrics"): both targets are up with no scrape error (so both
/metrics pages parse as the text format Prometheus reads), and the series
an operator queries are there with their labels, checked through
Prometheus's HTTP API: request counts by Api and status class, a
histogram_quantile over the request duration histogram, the controller's
connected runtimes by fleet, push latency, REST responses by code, the
runtime's controller stream state and upstream connections.

Needs the `prometheus` package (make deps); skipped only when its binary is
missing. Run: SLUICE_BUILD=build /usr/bin/python3 -m pytest
tests/integration/test_prometheus.py
"""

import json
import math
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from backend import Backend
from controller_env import Controller, ManagedRuntime
from helpers import api, backend, free_port, gateway, http_request, wait_until

PROMETHEUS = shutil.which("prometheus")


class Prometheus:
    def __init__(self, workdir, targets):
        self.workdir = str(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.port = free_port()
        self.config = os.path.join(self.workdir, "prometheus.yml")
        jobs = "".join(
            "- job_name: %s\n  static_configs:\n  - targets: ['%s']\n" % (job, target)
            for job, target in targets)
        with open(self.config, "w") as f:
            f.write("global: {scrape_interval: 1s, scrape_timeout: 1s, "
                    "evaluation_interval: 1s}\nscrape_configs:\n" + jobs)
        self.log_path = os.path.join(self.workdir, "prometheus.log")
        self.proc = None

    def start(self):
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, "--config.file", self.config,
                 "--storage.tsdb.path", os.path.join(self.workdir, "data"),
                 "--web.listen-address", "127.0.0.1:%d" % self.port],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, cwd=self.workdir)
        wait_until(self.ready, 15, what=lambda: "prometheus ready; log:\n" + self.log()[-3000:])
        return self

    def ready(self):
        assert self.proc.poll() is None, "prometheus exited: " + self.log()[-3000:]
        try:
            return http_request("127.0.0.1", self.port, "GET", "/-/ready", timeout=1)[0] == 200
        except OSError:
            return False

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def get(self, path, **params):
        url = "http://127.0.0.1:%d%s" % (self.port, path)
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=5) as r:
            doc = json.load(r)
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr):
        """Instant vector -> [(labels, value)]."""
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", data
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def stack(tmp_path):
    if not PROMETHEUS:
        pytest.skip("the prometheus binary is not installed (Debian package prometheus; "
                    "make deps installs it)")
    made = {"backend": None, "ctl": None, "rt": None, "prom": None}
    try:
        yield tmp_path, made
    finally:
        problems = []
        if made["prom"]:
            made["prom"].stop()
        if made["rt"] and made["rt"].proc:
            made["rt"].stop()
            problems += ["runtime: " + p for p in made["rt"].problems(0)]
        if made["ctl"] and made["ctl"].proc:
            made["ctl"].stop()
            problems += ["controller: " + p for p in made["ctl"].problems()]
        if made["backend"]:
            made["backend"].stop()
        if problems:
            pytest.fail("\n".join(problems), pytrace=False)


def test_prometheus_scrapes_controller_and_runtime(stack):
    tmp, made = stack
    b = made["backend"] = Backend(name="origin").start()
    ctl = made["ctl"] = Controller(tmp / "ctl").start()
    port = free_port()
    ctl.apply([gateway(port, fleet="blue"), backend("echo", [b.port]),
               api("shop", "/shop", "echo", operations=[
                   {"name": "list", "method": "GET", "path": "/items"},
                   {"name": "slow", "method": "GET", "path": "/delay/20"}])])
    rt = made["rt"] = ManagedRuntime(tmp / "rt", ctl.stream_addr, "node-1", fleet="blue",
                                     workers=2)
    rt.start(wait_ready=False)

    def serving():
        try:
            return rt.get(port, "/shop/items", timeout=1)[0] == 200
        except OSError:
            return False
    wait_until(serving, 10, what="the runtime serving the controller's config")
    for _ in range(20):
        assert rt.get(port, "/shop/items")[0] == 200
    for _ in range(5):
        assert rt.get(port, "/shop/delay/20")[0] == 200
    assert rt.get(port, "/shop/nothing")[0] == 404
    # A REST error, counted by code.
    assert ctl.rest("GET", "/api/v1/backends/missing")[0] == 404

    prom = made["prom"] = Prometheus(tmp / "prom", [
        ("sluice-runtime", "127.0.0.1:%d" % rt.admin_port),
        ("sluice-controller", "127.0.0.1:%d" % ctl.rest_port)]).start()

    def targets_up():
        active = prom.get("/api/v1/targets")["activeTargets"]
        health = {t["labels"]["job"]: (t["health"], t["lastError"]) for t in active}
        return health if len(health) == 2 and all(
            h == ("up", "") for h in health.values()) else None
    wait_until(targets_up, 15,
               what=lambda: "both targets up: %s" % prom.get("/api/v1/targets")["activeTargets"])

    def one(expr):
        got = prom.query(expr)
        return got[0][1] if len(got) == 1 else None

    # Runtime: requests by Api, operation and status class (the 20 above
    # and the one that found the runtime serving).
    wait_until(lambda: one('sluice_requests_total{job="sluice-runtime",api="default/shop",'
                           'operation="list",code_class="2xx"}') == 21, 10,
               what=lambda: "21 2xx of shop/list in Prometheus: %s"
               % prom.query("sluice_requests_total"))
    assert one('sluice_requests_total{api="default/shop",operation="slow",'
               'code_class="2xx"}') == 5
    # The duration histogram: a median over the buckets of shop/slow, whose
    # requests each took 20 ms or more.
    q = one('histogram_quantile(0.5, sum by (le) '
            '(sluice_request_duration_seconds_bucket{api="default/shop",operation="slow"}))')
    assert q is not None and math.isfinite(q) and 0.01 <= q <= 0.1, q
    assert one('sluice_request_duration_seconds_count{operation="slow"}') == 5
    # Unrouted 404, upstream connections to the origin, the controller stream.
    assert one('sluice_unrouted_responses_total{code_class="4xx"}') >= 1
    conns = one('sum(sluice_upstream_connections_active{cluster="default/echo"})')
    assert conns is not None and 1 <= conns <= 2, conns
    assert one('sluice_controller_connected{job="sluice-runtime"}') == 1
    assert one('sluice_controller_synced') == 1
    assert one('sluice_controller_connects_total') == 1
    assert one('sluice_generation_version') >= 1

    # Controller: runtimes by fleet, pushes and their latency, store, REST.
    assert one('sluice_controller_fleet_runtimes_connected{fleet="blue"}') == 1
    acks = one('sluice_controller_acks_total')
    assert acks >= 4
    assert one('sluice_controller_push_duration_seconds_count{result="ack"}') == acks
    push_q = one('histogram_quantile(0.99, sluice_controller_push_duration_seconds_bucket'
                 '{result="ack"})')
    assert push_q is not None and 0 < push_q <= 30, push_q
    assert one('sluice_controller_store_write_seconds_count') >= 1
    assert one('sluice_controller_store_read_seconds_count') >= 1
    assert one('sluice_controller_http_requests_total{method="GET",code="404"}') >= 1
    assert one('sluice_controller_http_requests_total{method="POST",code="200"}') is not None or \
        one('sluice_controller_http_requests_total{method="POST",code="201"}') is not None
