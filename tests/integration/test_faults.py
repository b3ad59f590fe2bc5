"""Fault injection (`faults` on an Api and an operation, runtime/proxy/
request.c and exchange.c, docs/configuration.md "Fault injection"): aborts
and delays at the configured rates (within ±2% over 10,000 requests), the
delay really waits, `header` limits them to requests that carry it, and the
operation's block replaces the Api's."""

import re
import subprocess
import time

from helpers import api, assert_gateway_error, backend as backend_doc, free_port, gateway, request


def _h2load(port, path, n, headers=()):
    cmd = ["h2load", "--h1", "-n", str(n), "-c", "8", "-t", "1"]
    for h in headers:
        cmd += ["-H", h]
    out = subprocess.run(cmd + ["http://127.0.0.1:%d%s" % (port, path)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=600).stdout
    m = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    assert m, out
    return [int(x) for x in m.groups()]


def test_abort_and_delay_rates(backends, runtimes):
    b = backends("b")
    port = free_port()
    ops = [{"name": "slow", "method": "GET", "path": "/slow",
            "faults": {"delay": {"ms": 300, "percent": 100}}},
           {"name": "all", "method": "*", "path": "/", "pathType": "prefix"}]
    rt = runtimes([gateway(port), backend_doc("b", [b.port]),
                   api("t", "/t", "b", operations=ops,
                       faults={"abort": {"status": 503, "percent": 30},
                               "delay": {"ms": 1, "percent": 20.5}})])
    n = 10000
    ok, _, _, err = _h2load(port, "/t/echo", n)
    assert ok + err == n
    assert abs(err / n - 0.30) <= 0.02, (ok, err)
    aborts = rt.metric("sluice_faults_injected_total", operation="all", kind="abort")
    delays = rt.metric("sluice_faults_injected_total", operation="all", kind="delay")
    assert aborts == err, (aborts, err)
    # delays are drawn among the requests not aborted
    assert abs(delays / (n - err) - 0.205) <= 0.02, (delays, n - err)
    r = request(port, "GET", "/t/echo")
    while r.status == 200:
        r = request(port, "GET", "/t/echo")
    assert assert_gateway_error(r, 503)["code"] == "fault_abort"
    # the operation's faults replace the Api's: always delayed, never aborted
    for _ in range(3):
        t0 = time.monotonic()
        assert request(port, "GET", "/t/slow").status == 200
        assert time.monotonic() - t0 >= 0.29


def test_only_with_the_header(backends, runtimes):
    b = backends("b")
    port = free_port()
    runtimes([gateway(port), backend_doc("b", [b.port]),
              api("t", "/t", "b", faults={"abort": {"status": 418, "percent": 100},
                                          "header": "X-Chaos"})])
    assert request(port, "GET", "/t/echo").status == 200
    assert request(port, "GET", "/t/echo", headers={"X-Chaos": "1"}).status == 418
    n = 2000
    ok, _, _, _ = _h2load(port, "/t/echo", n)
    assert ok == n
