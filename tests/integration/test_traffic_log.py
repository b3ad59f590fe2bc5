"""The traffic log (docs/configuration.md "Traffic log", docs/architecture.md):
spec.trafficLog on the Gateway as the issue writes it, the record's fields,
an Api's override (off, sampling, fields), headers with redaction and a
cap, validation with field paths, a reload that keeps a sink's records,
size-based rotation, and the network sinks against collectors this test
runs on loopback: http (JSON arrays) and elasticsearch (a _bulk endpoint
that checks the NDJSON framing as Elasticsearch documents it and answers
with the bulk response format, per-item errors included). A collector
that is down does not slow traffic, and delivery resumes when it returns."""

import base64
import json
import os
import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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
    """A loopback HTTP collector. handler(path, headers, body) -> (status, body)."""

    def __init__(self, handler, port=0):
        self.handler = handler
        self.requests = []
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
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
        return 200, json.dumps({"took": 3, "errors": errors, "items": items})
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
