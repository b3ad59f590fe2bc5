"""The traffic log (docs/configuration.md "Traffic log", docs/architecture.md):
spec.trafficLog on the Gateway as the issue writes it, the record's fields,
an Api's override (off, sampling, fields), headers with redaction and a
cap, validation with field paths, a reload that keeps a sink's records,
size-based rotation, and the network sinks against collectors this test
runs on loopback: http (JSON arrays) and elasticsearch (a _bulk endpoint
that checks the NDJSON framing as Elasticsearch documents it and answers
with the bulk response format, per-item errors included; basic and API-key
auth, daily index names). A collector that is down does not slow traffic,
and delivery resumes when it returns. https: collectors with certificates
made here by openssl (caFile, caBundle, SNI, keep-alive, the wrong CA or
name, a missing caFile, a handshake that never ends). ClickHouse has its
own file (test_traffic_log_clickhouse.py, a real clickhouse-server)."""

import base64
import json
import os
import re
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from helpers import (API_VERSION, api, backend, dump_docs, free_port, gateway, request,
                     runtime_binary, wait_until, Runtime)


def gw(port, traffic_log):
    g = gateway(port)
    g["spec"]["trafficLog"] = traffic_log
    return g


def records(path, n=None, timeout=5.0):
    def read():
        if not os.path.exists(path):
            return None
        with open(path) as f:
            lines = [l for l in f.read().splitlines() if l]
        if n is not None and len(lines) < n:
            return None
        return [json.loads(l) for l in lines]
    return wait_until(read, timeout, what="%s records in %s" % (n, path))


def test_gateway_file_sink_record(runtimes, backends, tmp_path):
    """The issue's YAML, plus a policy's rejection: every field of the record."""
    b = backends("echo")
    port = free_port()
    log = str(tmp_path / "traffic.jsonl")
    docs = [gw(port, {"sinks": [{"name": "local", "type": "file", "path": log}]}),
            backend("echo", [b.port]),
            api("t", "/t", "echo"),
            api("locked", "/locked", "echo",
                policies=[{"name": "ip-filter", "config": {"deny": ["127.0.0.0/8"]}}])]
    rt = runtimes(docs)
    assert request(port, "GET", "/t/a?x=1", headers={"X-Request-Id": "rid-7"}).status == 200
    assert request(port, "GET", "/locked/b").status == 403
    recs = {r["path"]: r for r in records(log, 2)}
    ok, denied = recs["/t/a"], recs["/locked/b"]
    assert ok["request_id"] == "rid-7" and ok["query"] == "x=1" and ok["status"] == 200
    assert ok["gateway"] == "default/default" and ok["fleet"] == "default"
    assert ok["runtime"] and ok["api"] == "default/t" and ok["operation"] == "all"
    assert ok["upstream"] == "127.0.0.1:%d" % b.port and ok["retries"] == 0
    assert ok["upstream_ms"] >= 0 and ok["gateway_ms"] >= 0
    assert abs(ok["duration_ms"] - ok["upstream_ms"] - ok["gateway_ms"]) < 0.01
    assert "request_headers" not in ok  # not a default field
    assert denied["status"] == 403 and denied["policy"] == "ip-filter"
    assert "not allowed" in denied["policy_reason"] and "upstream_ms" not in denied
    assert denied["upstream"] == ""
    wait_until(lambda: rt.metric("sluice_traffic_log_records_total", sink="local",
                                 type="file") == 2, 5, what="2 records written")
    # The pipeline's threads are named (top -H; perf/bench.sh reads each
    # one's CPU by these names).
    names = set()
    for t in os.listdir("/proc/%d/task" % rt.pid):
        with open("/proc/%d/task/%s/comm" % (rt.pid, t)) as f:
            names.add(f.read().strip())
    assert {"sl-tlog", "sl-sink-local", "sl-worker-0"} <= names, names


def test_api_override_and_headers(runtimes, backends, tmp_path):
    b = backends("echo")
    port = free_port()
    log = str(tmp_path / "t.jsonl")
    tl = {"sinks": [{"name": "local", "type": "file", "path": log}],
          "fields": ["path", "status", "request_headers", "response_headers"],
          "headers": {"maxBytes": 256, "redact": ["X-Secret"]}}
    docs = [gw(port, tl), backend("echo", [b.port]),
            api("quiet", "/quiet", "echo", trafficLog={"enabled": False}),
            api("none", "/none", "echo", trafficLog={"sampling": 0}),
            api("slim", "/slim", "echo", trafficLog={"fields": ["path", "method"]}),
            api("t", "/t", "echo")]
    runtimes(docs)
    for p in ("/quiet/1", "/none/1", "/slim/1"):
        assert request(port, "GET", p).status == 200
    assert request(port, "GET", "/t/h", headers={
        "Authorization": "Bearer very-secret", "X-Secret": "s3", "X-Dup": "a",
        "x-dup": "b", "X-Long": "v" * 400}).status == 200
    recs = records(log, 2)
    time.sleep(0.3)
    recs = records(log)
    by = {r["path"]: r for r in recs}
    assert set(by) == {"/slim/1", "/t/h"}, recs  # off and sampling 0 log nothing
    assert by["/slim/1"] == {"method": "GET", "path": "/slim/1"}
    h = by["/t/h"]
    assert set(h) == {"path", "status", "request_headers", "response_headers"}
    rq = h["request_headers"]
    assert rq["authorization"] == "[redacted]" and rq["x-secret"] == "[redacted]"
    assert rq["x-dup"] == "a, b"
    # 256 bytes at most: the long header did not fit and the object says so.
    assert "x-long" not in rq and rq["_truncated"] is True
    assert len(json.dumps(rq, separators=(",", ":"))) <= 256 + 32
    assert isinstance(h["response_headers"], dict) and h["response_headers"]


def _check(tmp_path, docs):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(dump_docs(docs))
    p = subprocess.run([runtime_binary(), "--check", "--config", str(cfg)], capture_output=True,
                       timeout=30, env=Runtime.env())
    return p.returncode, (p.stdout + p.stderr).decode()


def test_validation_names_the_field(tmp_path):
    bad = [
        ({"sinks": [{"name": "a", "type": "file"}]}, "spec.trafficLog.sinks[0].path",
         "required field missing"),
        ({"fields": ["status", "stauts"]}, "spec.trafficLog.fields[1]", "did you mean 'status'"),
        ({"sampling": 2}, "spec.trafficLog.sampling", "out of range"),
        ({"sinks": [{"name": "e", "type": "elasticsearch", "url": "ftp://x"}]},
         "spec.trafficLog.sinks[0].url", "http://"),
        ({"sinks": [{"name": "e", "type": "elasticsearch", "url": "http://x:9200",
                     "index": "Bad"}]}, "spec.trafficLog.sinks[0].index", "not allowed"),
        ({"sinks": [{"name": "a", "type": "file", "path": "/tmp/a", "url": "http://x"}]},
         "spec.trafficLog.sinks[0].url", "not for type file"),
        ({"sinks": [{"name": "a", "type": "http", "url": "http://x", "auth": {"username": "u"}}]},
         "spec.trafficLog.sinks[0].auth.password", "required"),
        ({"sinks": [{"name": "c", "type": "clickhouse", "url": "http://x:8123",
                     "database": "db", "table": "other.t"}]},
         "spec.trafficLog.sinks[0].database", "set one of the two"),
        ({"sinks": [{"name": "c", "type": "clickhouse", "url": "http://x:8123",
                     "database": "my-db"}]},
         "spec.trafficLog.sinks[0].database", "letters, digits and '_'"),
        ({"sinks": [{"name": "c", "type": "clickhouse", "url": "http://x:8123",
                     "table": "a.b.c"}]},
         "spec.trafficLog.sinks[0].table", "one optional 'database.' prefix"),
        ({"sinks": [{"name": "h", "type": "http", "url": "http://x", "database": "db"}]},
         "spec.trafficLog.sinks[0].database", "only for type clickhouse"),
    ]
    for tl, where, what in bad:
        rc, out = _check(tmp_path, [gw(free_port(), tl)])
        assert rc != 0, tl
        assert where in out and what in out, (tl, out)


def test_reload_keeps_a_sinks_records(runtimes, backends, tmp_path):
    """Requests run during reloads that add and remove another sink: the
    kept sink has every record, exactly once."""
    b = backends("echo")
    port = free_port()
    a, other = str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")
    sink_a = {"name": "a", "type": "file", "path": a}
    base = [backend("echo", [b.port]), api("t", "/t", "echo")]
    rt = runtimes([gw(port, {"sinks": [sink_a]})] + base)
    sent = []
    stop = threading.Event()

    def load():
        i = 0
        while not stop.is_set():
            if request(port, "GET", "/t/%d" % i).status == 200:
                sent.append("/t/%d" % i)
            i += 1
    th = threading.Thread(target=load)
    th.start()
    try:
        for k in range(3):
            time.sleep(0.2)
            rt.reload([gw(port, {"sinks": [sink_a, {"name": "b", "type": "file",
                                                    "path": other}]})] + base)
            time.sleep(0.2)
            rt.reload([gw(port, {"sinks": [sink_a]})] + base)
    finally:
        stop.set()
        th.join()
    got = [r["path"] for r in records(a, len(sent))]
    assert sorted(got) == sorted(sent)
    assert len(records(other)) > 0


def logger_wakeups(rt, seconds):
    """Voluntary context switches of the sl-tlog thread over `seconds`."""
    def count():
        for t in os.listdir("/proc/%d/task" % rt.pid):
            with open("/proc/%d/task/%s/comm" % (rt.pid, t)) as f:
                if f.read().strip() != "sl-tlog":
                    continue
            with open("/proc/%d/task/%s/status" % (rt.pid, t)) as f:
                return int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", f.read(), re.M).group(1))
        raise AssertionError("no sl-tlog thread")
    before = count()
    time.sleep(seconds)
    return count() - before


def test_idle_logger_sleeps_until_a_sink_comes(runtimes, backends, tmp_path):
    """With no sink the logger thread sleeps (it used to drain empty rings
    20 times a second on the workers' CPUs); a sink added by a reload is
    served at once, and once removed the logger sleeps again."""
    b = backends("echo")
    port = free_port()
    log = str(tmp_path / "t.jsonl")
    base = [backend("echo", [b.port]), api("t", "/t", "echo")]
    rt = runtimes([gateway(port)] + base)
    assert request(port, "GET", "/t/idle").status == 200
    assert logger_wakeups(rt, 1.5) <= 2
    rt.reload([gw(port, {"sinks": [{"name": "local", "type": "file", "path": log}]})] + base)
    assert request(port, "GET", "/t/logged").status == 200
    assert [r["path"] for r in records(log, 1)] == ["/t/logged"]
    assert logger_wakeups(rt, 0.5) >= 5  # draining every 50 ms while a sink is on
    rt.reload([gateway(port)] + base)
    wait_until(lambda: logger_wakeups(rt, 0.5) <= 1, 10, what="the logger asleep again")


def test_rotation_by_size(runtimes, backends, tmp_path):
    b = backends("echo")
    port = free_port()
    log = str(tmp_path / "r.jsonl")
    tl = {"sinks": [{"name": "r", "type": "file", "path": log,
                     "rotate": {"maxBytes": 4096, "keep": 2},
                     "batch": {"maxRecords": 5}}]}
    runtimes([gw(port, tl), backend("echo", [b.port]), api("t", "/t", "echo")])
    for i in range(120):
        assert request(port, "GET", "/t/%d" % i).status == 200
        if i % 20 == 0:
            time.sleep(0.15)
    wait_until(lambda: os.path.exists(log + ".2"), 5, what="two rotated files")
    time.sleep(0.3)
    assert not os.path.exists(log + ".3")
    for p in (log + ".1", log + ".2"):
        size = os.path.getsize(p)
        assert 0 < size <= 4096 + 5 * 1024, (p, size)
        with open(p) as f:
            for line in f:
                json.loads(line)


# --- network sinks --------------------------------------------------------------------

class Collector:
    """A loopback HTTP collector. handler(path, headers, body) -> (status, body).
    tls=(cert, key): HTTPS, recording the SNI names and the connections."""

    def __init__(self, handler, port=0, tls=None):
        self.handler = handler
        self.requests = []
        self.sni = []
        self.connections = set()
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                outer.connections.add(self.client_address)
                outer.requests.append((self.path, dict(self.headers), body))
                status, out = outer.handler(self.path, self.headers, body)
                out = out.encode() if isinstance(out, str) else out
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), H)
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            ctx.sni_callback = lambda sock, name, _ctx: outer.sni.append(name)
            # The handshake runs in the handler's thread (on the first read),
            # so a failed one costs that thread only.
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True,
                                                 do_handshake_on_connect=False)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def test_http_sink_down_then_back(runtimes, backends):
    """A dead collector costs the traffic nothing; when it comes back, the
    queued records are delivered."""
    b = backends("echo")
    port, cport = free_port(), free_port()
    tl = {"sinks": [{"name": "collector", "type": "http",
                     "url": "http://127.0.0.1:%d/ingest" % cport,
                     "batch": {"maxRecords": 10, "maxDelay": "100ms"},
                     "retry": {"initialBackoff": "50ms", "maxBackoff": "200ms"},
                     "timeout": "1s"}]}
    rt = runtimes([gw(port, tl), backend("echo", [b.port]), api("t", "/t", "echo")])
    t0 = time.monotonic()
    for i in range(30):
        assert request(port, "GET", "/t/down-%d" % i).status == 200
    assert time.monotonic() - t0 < 5
    wait_until(lambda: rt.metric("sluice_traffic_log_failed_batches_total",
                                 sink="collector", type="http") > 0, 5, what="a failed delivery")
    got = []
    c = Collector(lambda path, h, body: (got.extend(json.loads(body)) or (200, "{}")), port=cport)
    try:
        for i in range(5):
            assert request(port, "GET", "/t/up-%d" % i).status == 200
        wait_until(lambda: len(got) >= 35, 10, what="35 records at the collector")
        paths = sorted(r["path"] for r in got)
        assert paths == sorted(["/t/down-%d" % i for i in range(30)] +
                               ["/t/up-%d" % i for i in range(5)])
        path, headers, _ = c.requests[0]
        assert path == "/ingest" and headers["Content-Type"] == "application/json"
        assert rt.metric("sluice_traffic_log_dropped_total", sink="collector", type="http") == 0
    finally:
        c.stop()


INDEX_RX = re.compile(r"^sluice-\d{4}\.\d{2}\.\d{2}$")


def bulk_handler(state):
    """An Elasticsearch _bulk endpoint: NDJSON as documented (every line one
    JSON value ending in \\n, the body ending in \\n, an action line then its
    source), and the bulk response: took, errors, items[{index: {...}}]."""
    def handle(path, headers, body):
        if path != "/_bulk":
            return 404, '{"error":"no handler for %s"}' % path
        if headers.get("Content-Type") != "application/x-ndjson":
            return 406, '{"error":"Content-Type must be application/x-ndjson"}'
        if headers.get("Authorization") != "Basic " + base64.b64encode(b"elastic:pw").decode():
            return 401, '{"error":"unauthorized"}'
        text = body.decode("utf-8")
        if not text.endswith("\n"):
            return 400, '{"error":"The bulk request must be terminated by a newline [\\\\n]"}'
        lines = text[:-1].split("\n")
        if len(lines) % 2:
            return 400, '{"error":"an action line without its source"}'
        items = []
        for i in range(0, len(lines), 2):
            action, doc = json.loads(lines[i]), json.loads(lines[i + 1])
            assert list(action) == ["index"] and INDEX_RX.match(action["index"]["_index"]), action
            n = state["seen"].get(doc["path"], 0)
            state["seen"][doc["path"]] = n + 1
            if doc["path"].startswith("/t/busy") and n == 0:
                items.append({"index": {"_index": action["index"]["_index"], "status": 429,
                                        "error": {"type": "es_rejected_execution_exception",
                                                  "reason": "rejected execution"}}})
            elif doc["path"].startswith("/t/bad"):
                items.append({"index": {"_index": action["index"]["_index"], "status": 400,
                                        "error": {"type": "mapper_parsing_exception",
                                                  "reason": "failed to parse"}}})
            else:
                state["docs"].append(doc)
                items.append({"index": {"_index": action["index"]["_index"], "_id": str(i),
                                        "result": "created", "status": 201}})
        errors = any(it["index"]["status"] >= 300 for it in items)
        # compact, as Elasticsearch writes it (the sink reads "errors":false
        # before "items" without parsing the items)
        return 200, json.dumps({"took": 3, "errors": errors, "items": items},
                               separators=(",", ":"))
    return handle


def test_elasticsearch_bulk(runtimes, backends):
    b = backends("echo")
    port = free_port()
    state = {"seen": {}, "docs": []}
    c = Collector(bulk_handler(state))
    try:
        tl = {"sinks": [{"name": "es", "type": "elasticsearch",
                         "url": "http://127.0.0.1:%d" % c.port,
                         "auth": {"username": "elastic", "password": "pw"},
                         "batch": {"maxRecords": 4, "maxDelay": "100ms"},
                         "retry": {"initialBackoff": "50ms", "maxBackoff": "100ms"}}]}
        rt = runtimes([gw(port, tl), backend("echo", [b.port]), api("t", "/t", "echo")])
        for p in ["/t/ok-%d" % i for i in range(6)] + ["/t/busy-1", "/t/busy-2", "/t/bad-1"]:
            assert request(port, "GET", p).status == 200
        wait_until(lambda: len(state["docs"]) >= 8, 10, what="8 documents indexed")
        # 429 items were sent again, and only them; the 400 one is dropped, counted.
        assert state["seen"]["/t/busy-1"] == 2 and state["seen"]["/t/ok-0"] == 1
        assert sorted(d["path"] for d in state["docs"]) == sorted(
            ["/t/ok-%d" % i for i in range(6)] + ["/t/busy-1", "/t/busy-2"])
        wait_until(lambda: rt.metric("sluice_traffic_log_dropped_total", sink="es",
                                     type="elasticsearch") == 1, 5, what="one drop counted")
        wait_until(lambda: rt.metric("sluice_traffic_log_records_total", sink="es",
                                     type="elasticsearch") == 8, 5, what="8 delivered")
        assert "mapper_parsing_exception" in rt.log()
        # The password never leaves through the admin listener.
        dump = rt.admin_get("/config_dump")[2]
        assert b'"pw"' not in dump
    finally:
        c.stop()


def test_elasticsearch_api_key_and_daily_index(runtimes, backends):
    """auth.apiKey is sent as "Authorization: ApiKey <key>"; every document
    goes to <index>-YYYY.MM.DD of its own record's UTC day; a key the
    cluster refuses (401) drops the batch, counted and logged."""
    b = backends("echo")
    port = free_port()
    key = "VnVhQ2ZHY0JDZGJrUW0tZTVhT3g6dWkybHAyYXhUTm1zeWFrdzl0dk5udw=="
    docs = []

    def handle(path, headers, body):
        if headers.get("Authorization") != "ApiKey " + key:
            return 401, json.dumps({"error": {"type": "security_exception",
                                              "reason": "unable to authenticate with provided "
                                                        "credentials"}, "status": 401})
        lines = body.decode().split("\n")
        assert lines[-1] == "" and len(lines) % 2 == 1
        items = []
        for i in range(0, len(lines) - 1, 2):
            action, doc = json.loads(lines[i]), json.loads(lines[i + 1])
            docs.append((action["index"]["_index"], doc))
            items.append({"index": {"_index": action["index"]["_index"], "status": 201}})
        return 200, json.dumps({"took": 1, "errors": False, "items": items},
                               separators=(",", ":"))
    c = Collector(handle)
    try:
        common = {"type": "elasticsearch", "url": "http://127.0.0.1:%d/" % c.port,
                  "index": "traffic-logs", "batch": {"maxRecords": 3, "maxDelay": "50ms"}}
        tl = {"sinks": [dict(common, name="es", auth={"apiKey": key}),
                        dict(common, name="badkey", auth={"apiKey": "d3Jvbmc6a2V5"})]}
        rt = runtimes([gw(port, tl), backend("echo", [b.port]), api("t", "/t", "echo")])
        for i in range(8):
            assert request(port, "GET", "/t/k-%d" % i).status == 200
        wait_until(lambda: len(docs) >= 8, 10, what="8 documents")
        assert sorted(d["path"] for _, d in docs) == ["/t/k-%d" % i for i in range(8)]
        for index, doc in docs:
            assert index == "traffic-logs-" + doc["time"][:10].replace("-", "."), (index, doc)
        wait_until(lambda: rt.metric("sluice_traffic_log_dropped_total", sink="badkey",
                                     type="elasticsearch") == 8, 10, what="8 dropped")
        assert rt.metric("sluice_traffic_log_records_total", sink="badkey",
                         type="elasticsearch") == 0
        assert re.search(r"sink badkey: \d+ record\(s\) dropped: the collector refused the batch "
                         r"with HTTP 401: .*security_exception", rt.log()), rt.log()
        sent = [h.get("Authorization") for _, h, _ in c.requests]
        assert "ApiKey " + key in sent and "ApiKey d3Jvbmc6a2V5" in sent
        assert not any(a and a.startswith("Basic") for a in sent)
    finally:
        c.stop()


def test_elasticsearch_errors_false_is_read_without_the_items(runtimes, backends):
    """A 200 whose "errors":false comes before "items" (as Elasticsearch
    writes it) delivers the whole batch without reading the items: this
    endpoint leaves them out, which the per-item path would retry as
    missing answers."""
    b = backends("echo")
    port = free_port()
    got = []

    def handle(path, headers, body):
        got.append(body.count(b"\n") // 2)
        return 200, '{"took":1,"errors":false,"items":[]}'
    c = Collector(handle)
    try:
        tl = {"sinks": [{"name": "es", "type": "elasticsearch",
                         "url": "http://127.0.0.1:%d/" % c.port,
                         "batch": {"maxRecords": 2, "maxDelay": "50ms"}}]}
        rt = runtimes([gw(port, tl), backend("echo", [b.port]), api("t", "/t", "echo")])
        for i in range(6):
            assert request(port, "GET", "/t/%d" % i).status == 200
        wait_until(lambda: rt.metric("sluice_traffic_log_records_total", sink="es",
                                     type="elasticsearch") == 6, 10, what="6 delivered")
        time.sleep(0.3)
        assert sum(got) == 6  # each document sent once: nothing retried
        assert rt.metric("sluice_traffic_log_failed_batches_total", sink="es") == 0
    finally:
        c.stop()


def test_each_sink_says_why_it_drops(runtimes, backends):
    """The once-a-minute drop message is per sink: a second sink dropping in
    the same minute is logged too."""
    b = backends("echo")
    port = free_port()
    c = Collector(lambda path, headers, body: (403, '{"error":"forbidden"}'))
    try:
        url = "http://127.0.0.1:%d/" % c.port
        tl = {"sinks": [{"name": "one", "type": "http", "url": url},
                        {"name": "two", "type": "http", "url": url}]}
        rt = runtimes([gw(port, tl), backend("echo", [b.port]), api("t", "/t", "echo")])
        assert request(port, "GET", "/t/x").status == 200
        for name in ("one", "two"):
            wait_until(lambda: re.search(r"sink %s: 1 record\(s\) dropped: the collector refused "
                                         r"the batch with HTTP 403" % name, rt.log()), 10,
                       what="sink %s's drop logged" % name)
    finally:
        c.stop()


def test_budget_full_drops_and_counts(runtimes, backends):
    """A collector that never answers: the queue stops at bufferBytes, the
    rest is dropped and counted, and traffic is unaffected."""
    b = backends("echo")
    port, cport = free_port(), free_port()
    tl = {"sinks": [{"name": "dead", "type": "http", "url": "http://127.0.0.1:%d/" % cport,
                     "bufferBytes": 65536, "batch": {"maxRecords": 100000, "maxDelay": "10s"}}]}
    rt = runtimes([gw(port, tl), backend("echo", [b.port]), api("t", "/t", "echo")])
    t0 = time.monotonic()
    n = 400
    for i in range(n):
        assert request(port, "GET", "/t/" + "x" * 200 + str(i)).status == 200
    assert time.monotonic() - t0 < 20
    def accounted():
        dropped = rt.metric("sluice_traffic_log_dropped_total", sink="dead", type="http")
        queued = rt.metric("sluice_traffic_log_queue_records", sink="dead", type="http")
        return dropped + queued == n and dropped > 0
    # Every record is either waiting (within the budget) or counted as dropped.
    wait_until(accounted, 5, what="queued + dropped == %d" % n)
    assert 0 < rt.metric("sluice_traffic_log_queue_bytes", sink="dead", type="http") <= 65536
    assert rt.metric("sluice_traffic_log_records_total", sink="dead", type="http") == 0


# --- https ----------------------------------------------------------------------------

def openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Two CAs made by openssl; "localhost" (for localhost and 127.0.0.1, by
    ca) and "elsewhere" (for another name, by ca)."""
    d = str(tmp_path_factory.mktemp("pki"))
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", ca + ".key", "-out", ca + ".crt", "-days", "30",
                "-subj", "/CN=traffic log test " + ca, cwd=d)
    for name, san in (("localhost", "DNS:localhost,IP:127.0.0.1"),
                      ("elsewhere", "DNS:collector.elsewhere.example")):
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + name, cwd=d)
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write("subjectAltName=%s\n" % san)
        openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", name + ".crt", "-days", "30",
                "-extfile", name + ".ext", cwd=d)

    class Pki:
        def path(self, name):
            return os.path.join(d, name)

        def pem(self, name):
            with open(os.path.join(d, name)) as f:
                return f.read()

        def server(self, name):
            return (self.path(name + ".crt"), self.path(name + ".key"))
    return Pki()


def test_https_sinks_verify_and_keep_alive(runtimes, backends, pki):
    """http and elasticsearch sinks over https, verified against caFile (by
    name, SNI sent) and caBundle (by address): every record arrives, each
    sink on one kept-alive TLS connection across its batches."""
    b = backends("echo")
    port = free_port()
    got = []
    http_c = Collector(lambda path, h, body: (got.extend(json.loads(body)) or (200, "{}")),
                       tls=pki.server("localhost"))
    state = {"seen": {}, "docs": []}
    es_c = Collector(bulk_handler(state), tls=pki.server("localhost"))
    try:
        batch = {"maxRecords": 3, "maxDelay": "50ms"}
        tl = {"sinks": [
            {"name": "col", "type": "http", "url": "https://localhost:%d/in" % http_c.port,
             "caFile": pki.path("ca.crt"), "batch": batch},
            {"name": "es", "type": "elasticsearch", "url": "https://127.0.0.1:%d" % es_c.port,
             "caBundle": pki.pem("ca.crt"), "auth": {"username": "elastic", "password": "pw"},
             "batch": batch}]}
        rt = runtimes([gw(port, tl), backend("echo", [b.port]), api("t", "/t", "echo")])
        paths = ["/t/tls-%d" % i for i in range(12)]
        for p in paths:
            assert request(port, "GET", p).status == 200
            time.sleep(0.03)
        wait_until(lambda: len(got) >= 12 and len(state["docs"]) >= 12, 10,
                   what="12 records at each collector")
        assert sorted(r["path"] for r in got) == sorted(paths)
        assert sorted(d["path"] for d in state["docs"]) == sorted(paths)
        assert len(http_c.requests) > 1 and len(es_c.requests) > 1  # several batches
        assert len(http_c.connections) == 1 and len(es_c.connections) == 1  # kept alive
        assert http_c.sni and set(http_c.sni) == {"localhost"}
        assert es_c.sni == [None]  # an address: no SNI (RFC 6066)
        for s, t in (("col", "http"), ("es", "elasticsearch")):
            wait_until(lambda: rt.metric("sluice_traffic_log_records_total", sink=s,
                                         type=t) == 12, 5, what="%s: 12 delivered" % s)
            assert rt.metric("sluice_traffic_log_dropped_total", sink=s, type=t) == 0
    finally:
        http_c.stop()
        es_c.stop()


def test_https_verification_failures(runtimes, backends, pki, tmp_path):
    """The wrong CA, a certificate for another name, and a caFile that
    cannot be read: nothing is delivered, the log says why, failed batches
    are counted and retried, and the records past the budget are dropped
    and counted."""
    b = backends("echo")
    port = free_port()
    good = Collector(lambda path, h, body: (200, "{}"), tls=pki.server("localhost"))
    other = Collector(lambda path, h, body: (200, "{}"), tls=pki.server("elsewhere"))
    try:
        common = {"type": "http", "bufferBytes": 65536,
                  "batch": {"maxRecords": 20, "maxDelay": "50ms"},
                  "retry": {"initialBackoff": "50ms", "maxBackoff": "200ms"}, "timeout": "1s"}
        sinks = [dict(common, name="wrongca", url="https://localhost:%d/" % good.port,
                      caBundle=pki.pem("other-ca.crt")),
                 dict(common, name="wrongname", url="https://localhost:%d/" % other.port,
                      caFile=pki.path("ca.crt")),
                 dict(common, name="nocafile", url="https://localhost:%d/" % good.port,
                      caFile=str(tmp_path / "missing-ca.pem"))]
        rt = runtimes([gw(port, {"sinks": sinks}), backend("echo", [b.port]),
                       api("t", "/t", "echo")])
        n = 400
        for i in range(n):
            assert request(port, "GET", "/t/" + "x" * 200 + str(i)).status == 200
        names = ("wrongca", "wrongname", "nocafile")
        for s in names:
            wait_until(lambda: rt.metric("sluice_traffic_log_failed_batches_total", sink=s,
                                         type="http") >= 2, 10, what="%s retried" % s)

        def accounted(s):
            dropped = rt.metric("sluice_traffic_log_dropped_total", sink=s, type="http")
            queued = rt.metric("sluice_traffic_log_queue_records", sink=s, type="http")
            return dropped > 0 and dropped + queued == n
        for s in names:
            wait_until(lambda: accounted(s), 10, what="%s: queued + dropped == %d" % (s, n))
            assert rt.metric("sluice_traffic_log_records_total", sink=s, type="http") == 0
        assert good.requests == [] and other.requests == []
        log = rt.log()
        assert re.search(r"sink wrongca: delivery failed \(TLS to localhost:%d: certificate verify "
                         r"failed: unable to get local issuer certificate \(the server's "
                         r"certificate must chain to caBundle" % good.port, log), log
        assert re.search(r"sink wrongname: delivery failed \(TLS to localhost:%d: certificate "
                         r"verify failed: [Hh]ostname mismatch" % other.port, log), log
        assert re.search(r"sink nocafile: delivery failed \(caFile \S+missing-ca.pem cannot be "
                         r"used: No such file or directory", log), log
    finally:
        good.stop()
        other.stop()


def test_https_handshake_timeout(runtimes, backends, pki):
    """A collector that accepts the connection and never answers the TLS
    handshake: the sink's timeout ends it, logged, retried; traffic is not
    slowed."""
    import socket
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # the kernel completes TCP; nobody ever speaks TLS
    try:
        b = backends("echo")
        port = free_port()
        tl = {"sinks": [{"name": "mute", "type": "http",
                         "url": "https://127.0.0.1:%d/" % silent.getsockname()[1],
                         "caFile": pki.path("ca.crt"), "timeout": "300ms",
                         "batch": {"maxRecords": 1, "maxDelay": "10ms"},
                         "retry": {"initialBackoff": "50ms", "maxBackoff": "100ms"}}]}
        rt = runtimes([gw(port, tl), backend("echo", [b.port]), api("t", "/t", "echo")])
        t0 = time.monotonic()
        for i in range(10):
            assert request(port, "GET", "/t/%d" % i).status == 200
        assert time.monotonic() - t0 < 3
        wait_until(lambda: rt.metric("sluice_traffic_log_failed_batches_total", sink="mute",
                                     type="http") >= 2, 10, what="two timed-out attempts")
        assert "sink mute: delivery failed (TLS to 127.0.0.1:%d: timed out in the handshake)" % (
            silent.getsockname()[1]) in rt.log()
    finally:
        silent.close()


def test_https_validation_names_the_field(tmp_path, pki):
    url = "https://collector.example:8443/in"
    bad = [
        ({"name": "h", "type": "http", "url": url, "caFile": "ca.pem"},
         "spec.trafficLog.sinks[0].caFile", "an absolute path"),
        ({"name": "h", "type": "http", "url": url,
          "caBundle": "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"},
         "spec.trafficLog.sinks[0].caBundle", "certificate 1 does not parse"),
        ({"name": "h", "type": "http", "url": url, "caBundle": "not pem"},
         "spec.trafficLog.sinks[0].caBundle", "expected PEM certificates"),
        ({"name": "h", "type": "http", "url": "http://collector.example/in",
          "caFile": pki.path("ca.crt")},
         "spec.trafficLog.sinks[0].caFile", "only meaningful with an https:// url"),
        ({"name": "h", "type": "elasticsearch", "url": url, "caFile": pki.path("ca.crt"),
          "caBundle": pki.pem("ca.crt")},
         "spec.trafficLog.sinks[0].caFile", "set at most one of caBundle"),
        ({"name": "f", "type": "file", "path": "/tmp/x.jsonl", "caFile": pki.path("ca.crt")},
         "spec.trafficLog.sinks[0].caFile", "not for type file"),
        # Only the runtime's machine can say this: its --check reads the file.
        ({"name": "h", "type": "clickhouse", "url": url, "caFile": str(tmp_path / "nope.pem")},
         "spec.trafficLog.sinks[0].caFile", "nope.pem: No such file or directory"),
        ({"name": "h", "type": "clickhouse", "url": url, "caFile": pki.path("ca.key")},
         "spec.trafficLog.sinks[0].caFile", "certificate 1 does not parse"),
    ]
    for sink, where, what in bad:
        rc, out = _check(tmp_path, [gw(free_port(), {"sinks": [sink]})])
        assert rc != 0, sink
        assert where in out and what in out, (sink, out)
    ok = {"name": "h", "type": "http", "url": url, "caFile": pki.path("ca.crt")}
    rc, out = _check(tmp_path, [gw(free_port(), {"sinks": [ok]})])
    assert rc == 0, out
