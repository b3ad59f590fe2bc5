"""Admin listener (/live, /ready, /metrics, /config_dump), access log, and
start-up behaviour (invalid config, bad flags, busy port).

The per-request cases (request metrics, the connections gauge, access log
fields and formats) run over HTTP/1.1 and HTTP/2 (the `proto` fixture): a
request is counted and logged by the same code whatever its protocol; only
the access log's protocol field differs. The admin listener and start-up
cases involve no proxied request and run once.
"""

import json
import os
import re
import signal
import socket
import subprocess
import time

from helpers import (BAD_LOG_PATTERNS, Runtime, api, backend, dump_docs, free_port,
                     gateway, http_request, metric_sum, parse_prometheus, request,
                     runtime_binary, wait_until)


def test_live_ready_and_unknown(simple):
    env = simple()
    rt = env.runtime
    status, _, body = rt.admin_get("/live")
    assert status == 200
    status, _, body = rt.admin_get("/ready")
    assert status == 200
    status, headers, body = rt.admin_get("/nope")
    assert status == 404
    assert json.loads(body)["error"]["status"] == 404
    status, _, _ = http_request("127.0.0.1", rt.admin_port, "POST", "/ready", body=b"")
    assert status == 405


def test_metrics_count_requests(simple, proto):
    env = simple()
    rt = env.runtime
    before = rt.metrics()
    for _ in range(5):
        assert proto.request(env.port, "GET", "/t/echo").status == 200
    assert proto.request(env.port, "GET", "/t/status/503").status == 503
    assert proto.request(env.port, "GET", "/unrouted").status == 404
    want_2xx = metric_sum(before, "sluice_requests_total", code_class="2xx") + 5

    def grown():
        m = rt.metrics()
        return m if metric_sum(m, "sluice_requests_total", code_class="2xx") >= want_2xx else None

    after = wait_until(grown, 3, what="sluice_requests_total 2xx to grow by 5")
    ok = [labels for name, labels, _ in after
          if name == "sluice_requests_total" and labels.get("code_class") == "2xx"]
    assert any(l.get("api") in ("t", "default/t") and l.get("operation") == "all" for l in ok), ok
    assert metric_sum(after, "sluice_requests_total", code_class="5xx") \
        >= metric_sum(before, "sluice_requests_total", code_class="5xx") + 1
    assert metric_sum(after, "sluice_unrouted_responses_total", code_class="4xx") \
        >= metric_sum(before, "sluice_unrouted_responses_total", code_class="4xx") + 1
    assert metric_sum(after, "sluice_request_duration_seconds_count") \
        >= metric_sum(before, "sluice_request_duration_seconds_count") + 6
    buckets = [(l["le"], v) for n, l, v in after if n == "sluice_request_duration_seconds_bucket"
               and l.get("api") in ("t", "default/t")]
    assert buckets and buckets[-1][0] == "+Inf"
    values = [v for _, v in buckets]
    assert values == sorted(values), "histogram buckets must be cumulative"
    assert metric_sum(after, "sluice_upstream_requests_total", cluster="default/echo") >= 6
    assert metric_sum(after, "sluice_connections_accepted_total") >= 7
    assert metric_sum(after, "sluice_generation_version") >= 1


def test_metrics_text_format(simple):
    env = simple()
    request(env.port, "GET", "/t/echo")
    status, headers, body = env.runtime.admin_get("/metrics")
    assert status == 200
    ctype = dict((k.lower(), v) for k, v in headers).get("content-type", "")
    assert ctype.startswith("text/plain"), ctype
    text = body.decode()
    parse_prometheus(text)  # every line well-formed
    for name in ("sluice_requests_total", "sluice_request_duration_seconds",
                 "sluice_upstream_errors_total", "sluice_connections_active",
                 "sluice_generation_version"):
        assert re.search(r"^# TYPE %s " % name, text, re.M), "no TYPE line for %s" % name


def test_connections_active_gauge(simple, proto):
    env = simple()
    conns = [proto.connection(env.port) for _ in range(3)]
    try:
        for c in conns:
            assert c.request("GET", "/t/echo").status == 200
        wait_until(lambda: env.runtime.metric("sluice_connections_active") >= 3, 3,
                   what="sluice_connections_active >= 3")
    finally:
        for c in conns:
            c.close()
    wait_until(lambda: env.runtime.metric("sluice_connections_active") == 0, 3,
               what="sluice_connections_active back to 0")


def test_config_dump(simple):
    env = simple()
    status, headers, body = env.runtime.admin_get("/config_dump")
    assert status == 200
    doc = json.loads(body)
    text = json.dumps(doc)
    for needle in ('"/t"', "default/echo", "127.0.0.1", str(env.backend.port), str(env.port)):
        assert needle in text, "%s missing from /config_dump" % needle


# --- access log -------------------------------------------------------------------------

def _lines(path, n, timeout=5.0):
    def enough():
        if not os.path.exists(path):
            return None
        with open(path) as f:
            lines = [l for l in f.read().splitlines() if l]
        return lines if len(lines) >= n else None
    return wait_until(enough, timeout, what="%d access log lines in %s" % (n, path))


def test_access_log_json(simple, tmp_path, proto):
    log = str(tmp_path / "access.log")
    env = simple(access_log=log, access_log_format="json")
    r1 = proto.request(env.port, "GET", "/t/echo?x=1", host="api.example.com",
                 headers={"User-Agent": "pytest-ua", "X-Request-Id": "rid-1",
                          "Referer": "http://ref.example/"})
    assert r1.status == 200
    assert proto.request(env.port, "POST", "/t/echo", body=b"0123456789").status == 200
    assert proto.request(env.port, "GET", "/nowhere").status == 404
    lines = _lines(log, 3)
    entries = [json.loads(l) for l in lines]
    keys = {"time", "client", "method", "path", "query", "protocol", "status", "bytes_received",
            "bytes_sent", "duration_ms", "request_id", "api", "operation", "upstream",
            "user_agent", "referer", "host", "error"}
    for e in entries:
        missing = keys - set(e)
        assert not missing, "access log entry lacks %s: %r" % (missing, e)
    # Several workers each have their own ring: order across them is not kept.
    by = {(e["method"], e["path"], e["query"]): e for e in entries}
    get = by[("GET", "/t/echo", "x=1")]
    post, miss = by[("POST", "/t/echo", "")], by[("GET", "/nowhere", "")]
    # The path and the query are separate fields of the traffic log record.
    assert get["method"] == "GET" and get["path"] == "/t/echo" and get["query"] == "x=1"
    assert get["status"] == 200 and get["protocol"] == proto.log_protocol
    assert get["client"] == "127.0.0.1"
    assert get["request_id"] == "rid-1"
    assert get["user_agent"] == "pytest-ua"
    assert get["referer"] == "http://ref.example/"
    assert get["host"] == "api.example.com"
    assert get["api"] in ("t", "default/t") and get["operation"] == "all"
    assert get["upstream"] == "127.0.0.1:%d" % env.backend.port
    assert get["bytes_sent"] >= len(r1.body)
    assert isinstance(get["duration_ms"], (int, float)) and get["duration_ms"] >= 0
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$", get["time"]), get["time"]
    assert post["bytes_received"] == 10
    assert miss["status"] == 404 and miss["error"] and miss["upstream"] in ("", None)


def test_access_log_combined_and_reopen(simple, tmp_path, proto):
    log = str(tmp_path / "access.log")
    env = simple(access_log=log, access_log_format="combined")
    proto.request(env.port, "GET", "/t/echo", headers={"User-Agent": "ua-1"})
    line = _lines(log, 1)[0]
    rx = r'^127\.0\.0\.1 - \S+ \[[^\]]+\] "GET /t/echo %s" 200 \d+ "[^"]*" "ua-1"' % (
        re.escape(proto.log_protocol))
    assert re.match(rx, line), line
    os.rename(log, log + ".1")
    env.runtime.signal(signal.SIGUSR1)
    time.sleep(0.3)
    proto.request(env.port, "GET", "/t/echo?after-rotate")
    line = _lines(log, 1)[0]
    assert "after-rotate" in line
    with open(log + ".1") as f:
        assert "after-rotate" not in f.read()


def test_access_log_stdout(simple, proto):
    env = simple(access_log="stdout")
    proto.request(env.port, "GET", "/t/echo?to-stdout")
    line = _lines(env.runtime.stdout_path, 1)[0]
    rec = json.loads(line)
    assert rec["path"] == "/t/echo" and rec["query"] == "to-stdout"


# --- start-up ---------------------------------------------------------------------------

def _run_expect_failure(args, timeout=15):
    p = subprocess.run([runtime_binary()] + args, capture_output=True, timeout=timeout,
                       env=Runtime.env(), stdin=subprocess.DEVNULL)
    out = p.stdout.decode("utf-8", "replace") + p.stderr.decode("utf-8", "replace")
    for pat in BAD_LOG_PATTERNS:
        assert not pat.search(out), "start-up failure path reported %r:\n%s" % (pat.pattern, out)
    assert p.returncode > 0, "expected a non-zero exit (not a signal), got %d:\n%s" \
        % (p.returncode, out)
    return out


def _docs_with_bad_template(port):
    return [gateway(port), backend("echo", [free_port()]),
            api("petstore", "/petstore/v1", "echo", operations=[
                {"method": "GET", "path": "/pets"},
                {"method": "GET", "path": "/pets/{id"}])]


def test_invalid_config_at_startup(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(dump_docs(_docs_with_bad_template(free_port())))
    out = _run_expect_failure(["--config", str(cfg), "--admin", "off"])
    assert re.search(r"bad\.yaml doc 3: spec\.operations\[1\]\.path: unbalanced '\{'", out), out


def test_unknown_field_at_startup(tmp_path):
    cfg = tmp_path / "typo.yaml"
    docs = [gateway(free_port()), backend("echo", [free_port()]),
            api("t", "/t", "echo", operations=[{"methd": "GET", "path": "/x"}])]
    cfg.write_text(dump_docs(docs))
    out = _run_expect_failure(["--config", str(cfg), "--admin", "off"])
    assert re.search(r"typo\.yaml doc 3: spec\.operations\[0\]\.methd: unknown field", out), out


def test_missing_backend_at_startup(tmp_path):
    cfg = tmp_path / "ref.yaml"
    cfg.write_text(dump_docs([gateway(free_port()), api("t", "/t", "nothere")]))
    out = _run_expect_failure(["--config", str(cfg), "--admin", "off"])
    assert "spec.backendRefs[0].name" in out and "nothere" in out, out


def test_missing_config_file(tmp_path):
    out = _run_expect_failure(["--config", str(tmp_path / "absent.yaml"), "--admin", "off"])
    assert "absent.yaml" in out, out


def test_bad_command_line():
    out = _run_expect_failure(["--workers", "zero"])
    assert "workers" in out, out
    _run_expect_failure(["--no-such-flag"])


def test_listener_port_in_use(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        cfg = tmp_path / "busy.yaml"
        cfg.write_text(dump_docs([gateway(port), backend("echo", [free_port()]),
                                  api("t", "/t", "echo")]))
        out = _run_expect_failure(["--config", str(cfg), "--admin", "off"])
        assert str(port) in out and re.search(r"(?i)in use", out), out
    finally:
        busy.close()


def test_config_directory_and_several_files(backends, runtimes, tmp_path):
    b = backends()
    port = free_port()
    d = tmp_path / "conf.d"
    d.mkdir()
    (d / "10-gateway.yaml").write_text(dump_docs([gateway(port)]))
    (d / "20-backend.yml").write_text(dump_docs([backend("echo", [b.port])]))
    (d / "30-api.json").write_text(json.dumps(api("t", "/t", "echo")))
    (d / "ignored.txt").write_text("not config")
    rt = runtimes([], start=False)
    rt.config_path = str(d)
    rt.start()
    assert request(port, "GET", "/t/echo").status == 200


def test_admin_token(runtimes, tmp_path):
    """--admin-token-file: the config and the clusters need the token,
    probes and metrics do not; a wrong or missing token is a 401 that says
    what to send."""
    token_file = tmp_path / "admin-token"
    token_file.write_text("s3cr3t-admin-token-0123456789\n")
    os.chmod(token_file, 0o600)
    port = free_port()
    rt = runtimes([gateway(port), backend("b", [free_port()]), api("t", "/t", "b")],
                  extra_args=["--admin-token-file", str(token_file)])
    for path in ("/live", "/ready", "/metrics"):
        assert rt.admin_get(path)[0] == 200, path
    for path in ("/config_dump", "/clusters", "/no-such-endpoint"):
        status, headers, body = rt.admin_get(path)
        assert status == 401, (path, status)
        assert json.loads(body)["error"]["code"] == "unauthorized"
        assert dict(headers)["WWW-Authenticate"] == 'Bearer realm="sluice-runtime"'
        status, headers, _ = http_request("127.0.0.1", rt.admin_port, "GET", path,
                                          headers=[("Authorization", "Bearer wrong")])
        assert status == 401
        assert "invalid_token" in dict(headers)["WWW-Authenticate"]
    good = [("Authorization", "Bearer s3cr3t-admin-token-0123456789")]
    status, _, body = http_request("127.0.0.1", rt.admin_port, "GET", "/config_dump",
                                   headers=good)
    assert status == 200 and json.loads(body)["snapshot"]
    assert http_request("127.0.0.1", rt.admin_port, "GET", "/clusters", headers=good)[0] == 200
    assert http_request("127.0.0.1", rt.admin_port, "GET", "/nope", headers=good)[0] == 404


def test_admin_token_file_errors(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(dump_docs([gateway(free_port()), backend("b", [free_port()]),
                              api("t", "/t", "b")]))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    # An admin address of the test's own: the default (127.0.0.1:9901) may be
    # taken by another runtime on the machine, which would fail the bind
    # before the token file is read.
    admin = ["--admin", "127.0.0.1:%d" % free_port()]
    for args, want in (
            (admin + ["--admin-token-file", str(tmp_path / "missing")], "No such file or directory"),
            (admin + ["--admin-token-file", str(empty)], "the file is empty"),
            (["--admin", "off", "--admin-token-file", str(empty)], "needs --admin ADDR")):
        r = subprocess.run([runtime_binary(), "--config", str(cfg), "--workers", "1"] + args,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=20)
        assert r.returncode != 0, args
        assert want in r.stdout.decode(), (args, r.stdout.decode())
