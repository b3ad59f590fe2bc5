"""Tracing (docs/configuration.md "Tracing"): W3C trace context taken from
the client or started here, the gateway's own span ids in the traceparent the
upstream gets, tracestate kept (dropped when the trace restarts), the trace
and span ids in the traffic log record, Server-Timing, and OTLP/HTTP span
export (JSON encoding) to a collector this test runs, which checks the
shape of every ExportTraceServiceRequest as opentelemetry-proto defines it."""

import json
import re
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from helpers import (backend, dump_docs, free_port, gateway, request, runtime_binary, wait_until,
                     api, Runtime)
from test_traffic_log import records

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = "00f067aa0ba902b7"
HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-(0[01])$")


def gw(port, tracing=None, sinks=None):
    g = gateway(port)
    if tracing is not None:
        g["spec"]["tracing"] = tracing
    if sinks is not None:
        g["spec"]["trafficLog"] = {"sinks": sinks}
    return g


def upstream_header(b, name, i=-1):
    vals = [v for k, v in b.requests[i]["headers"] if k.lower() == name]
    return vals[0] if vals else None


def start(runtimes, backends, tmp_path, tracing):
    b = backends("echo")
    port = free_port()
    log = str(tmp_path / "traffic.jsonl")
    rt = runtimes([gw(port, tracing, [{"name": "local", "type": "file", "path": log}]),
                   backend("echo", [b.port]), api("t", "/t", "echo")])
    return b, port, log, rt


def test_client_trace_continued_with_our_spans(runtimes, backends, tmp_path):
    b, port, log, _ = start(runtimes, backends, tmp_path, {"serverTiming": True})
    r = request(port, "GET", "/t/a", headers={
        "traceparent": "00-%s-%s-01" % (CLIENT_TRACE, CLIENT_PARENT),
        "tracestate": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"})
    assert r.status == 200
    m = TRACEPARENT.match(upstream_header(b, "traceparent"))
    assert m, upstream_header(b, "traceparent")
    # The same trace, our span as the parent, the sampled flag kept.
    assert m.group(1) == CLIENT_TRACE and m.group(2) != CLIENT_PARENT and m.group(3) == "01"
    assert upstream_header(b, "tracestate") == "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    # One traceparent only: the client's was replaced, not added to.
    assert sum(1 for k, _ in b.requests[-1]["headers"] if k.lower() == "traceparent") == 1
    st = r.header("Server-Timing")
    assert re.match(r"^gateway;dur=\d+\.\d{3}, upstream;dur=\d+\.\d{3}$", st), st
    rec = records(log, 1)[0]
    assert rec["trace_id"] == CLIENT_TRACE
    assert HEX16.match(rec["span_id"]) and rec["span_id"] not in (CLIENT_PARENT, m.group(2))


def test_trace_started_when_missing_or_invalid(runtimes, backends, tmp_path):
    b, port, log, _ = start(runtimes, backends, tmp_path, {"sampling": 0})
    assert request(port, "GET", "/t/new").status == 200
    new = TRACEPARENT.match(upstream_header(b, "traceparent"))
    # sampling 0: traces started here are not sampled
    assert new and new.group(3) == "00"
    bad = ["00-%s-%s-01" % (CLIENT_TRACE.upper(), CLIENT_PARENT),  # upper-case hex
           "00-%s-%s-01" % ("0" * 32, CLIENT_PARENT),                # all-zero trace id
           "ff-%s-%s-01" % (CLIENT_TRACE, CLIENT_PARENT),            # version ff
           "00-%s-%s-01-x" % (CLIENT_TRACE, CLIENT_PARENT),          # 00 is exactly 55
           "00-%s-%s" % (CLIENT_TRACE, CLIENT_PARENT)]               # no flags
    for v in bad:
        assert request(port, "GET", "/t/bad", headers={"traceparent": v,
                                                       "tracestate": "a=b"}).status == 200
        m = TRACEPARENT.match(upstream_header(b, "traceparent"))
        assert m and m.group(1) != CLIENT_TRACE, v
        # A restarted trace does not carry the old trace's state.
        assert upstream_header(b, "tracestate") is None, v
    # A later version is read for its first four fields and answered as 00.
    future = "cc-%s-%s-01-what-the-future-holds" % (CLIENT_TRACE, CLIENT_PARENT)
    assert request(port, "GET", "/t/future", headers={"traceparent": future}).status == 200
    m = TRACEPARENT.match(upstream_header(b, "traceparent"))
    assert m and m.group(1) == CLIENT_TRACE and m.group(3) == "01"
    # (records of different workers may come in any order)
    by = {r["path"]: r for r in records(log, 2 + len(bad))}
    assert HEX32.match(by["/t/new"]["trace_id"]) and by["/t/new"]["trace_id"] == new.group(1)
    assert by["/t/future"]["trace_id"] == CLIENT_TRACE


def test_generate_off_and_no_tracing(runtimes, backends, tmp_path):
    b, port, log, _ = start(runtimes, backends, tmp_path, {"generate": False})
    assert request(port, "GET", "/t/x").status == 200
    assert upstream_header(b, "traceparent") is None
    assert records(log, 1)[0]["trace_id"] == ""
    # Without spec.tracing the gateway is not part of the trace: the
    # client's traceparent goes upstream as it came, and is logged.
    b2 = backends("echo2")
    port2 = free_port()
    log2 = str(tmp_path / "plain.jsonl")
    runtimes([gw(port2, None, [{"name": "local", "type": "file", "path": log2}]),
              backend("echo2", [b2.port]), api("t", "/t", "echo2")])
    tp = "00-%s-%s-01" % (CLIENT_TRACE, CLIENT_PARENT)
    r = request(port2, "GET", "/t/y", headers={"traceparent": tp})
    assert r.status == 200 and r.header("Server-Timing") is None
    assert upstream_header(b2, "traceparent") == tp
    rec = records(log2, 1)[0]
    assert rec["trace_id"] == CLIENT_TRACE and rec["span_id"] == ""


class Collector:
    """An OTLP/HTTP traces endpoint (JSON encoding). Every request is
    checked against the ExportTraceServiceRequest shape; `errors` lists what
    did not match, `spans` what arrived. `down` answers 503."""

    def __init__(self):
        self.spans, self.errors, self.requests = [], [], 0
        self.down = False
        self.resource = None
        self.lock = threading.Lock()
        coll = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if coll.down:
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                coll.check(self.path, self.headers.get("Content-Type"), body)
                out = b"{}"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def fail(self, why):
        self.errors.append(why)

    def check(self, path, ctype, body):
        with self.lock:
            self.requests += 1
            if path != "/v1/traces":
                self.fail("path %s" % path)
            if ctype != "application/json":
                self.fail("content-type %s" % ctype)
            try:
                doc = json.loads(body)
            except ValueError as e:
                self.fail("not JSON: %s" % e)
                return
            rs = doc.get("resourceSpans")
            if not isinstance(rs, list) or len(rs) != 1:
                self.fail("resourceSpans: %r" % rs)
                return
            self.resource = rs[0].get("resource")
            ss = rs[0].get("scopeSpans")
            if not isinstance(ss, list) or not ss or not ss[0].get("scope", {}).get("name"):
                self.fail("scopeSpans: %r" % ss)
                return
            for sp in ss[0].get("spans", []):
                self.check_span(sp)
                self.spans.append(sp)

    def check_span(self, sp):
        if not HEX32.match(sp.get("traceId", "")) or not HEX16.match(sp.get("spanId", "")):
            self.fail("ids: %r" % sp)
        if "parentSpanId" in sp and not HEX16.match(sp["parentSpanId"]):
            self.fail("parentSpanId: %r" % sp)
        if sp.get("kind") not in (2, 3) or not isinstance(sp.get("name"), str):
            self.fail("kind/name: %r" % sp)
        # fixed64 times are decimal strings in OTLP/JSON
        s, e = sp.get("startTimeUnixNano", ""), sp.get("endTimeUnixNano", "")
        if not (s.isdigit() and e.isdigit() and int(e) >= int(s) > 1.6e18):
            self.fail("times: %r" % sp)
        for a in sp.get("attributes", []):
            v = a.get("value", {})
            if not isinstance(a.get("key"), str) or len(v) != 1:
                self.fail("attribute: %r" % a)
            elif "intValue" in v and not str(v["intValue"]).isdigit():
                self.fail("intValue: %r" % a)
            elif "intValue" not in v and not isinstance(v.get("stringValue"), str):
                self.fail("attribute value: %r" % a)

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()


def attrs(span):
    return {a["key"]: list(a["value"].values())[0] for a in span["attributes"]}


def test_otlp_export(runtimes, backends, tmp_path):
    c = Collector()
    try:
        b = backends("echo")
        port = free_port()
        tracing = {"export": {"url": "http://127.0.0.1:%d/v1/traces" % c.port,
                              "serviceName": "edge-gw", "batch": {"maxDelay": "100ms"}}}
        log = str(tmp_path / "traffic.jsonl")
        rt = runtimes([gw(port, tracing, [{"name": "local", "type": "file", "path": log}]),
                       backend("echo", [b.port]), api("t", "/t", "echo"),
                       backend("gone", [free_port()]), api("down", "/down", "gone")])
        tp = "00-%s-%s-01" % (CLIENT_TRACE, CLIENT_PARENT)
        assert request(port, "GET", "/t/a?q=1", headers={"traceparent": tp}).status == 200
        up = TRACEPARENT.match(upstream_header(b, "traceparent"))
        # not sampled by the client: no spans
        assert request(port, "GET", "/t/quiet", headers={
            "traceparent": "00-%s-%s-00" % ("1" * 32, CLIENT_PARENT)}).status == 200
        assert request(port, "GET", "/down/x").status in (502, 503)
        wait_until(lambda: len(c.spans) >= 3, 10, what="3 spans at the collector")
        assert c.errors == [], c.errors
        assert attrs(c.resource)["service.name"] == "edge-gw"
        traced = [s for s in c.spans if s["traceId"] == CLIENT_TRACE]
        server = [s for s in traced if s["kind"] == 2]
        client = [s for s in traced if s["kind"] == 3]
        assert len(server) == 1 and len(client) == 1, traced
        server, client = server[0], client[0]
        assert server["parentSpanId"] == CLIENT_PARENT
        assert client["parentSpanId"] == server["spanId"]
        # the span the upstream was told is its parent
        assert client["spanId"] == up.group(2)
        a = attrs(server)
        assert a["http.request.method"] == "GET" and a["url.path"] == "/t/a"
        assert a["url.query"] == "q=1" and a["http.response.status_code"] == "200"
        assert a["sluice.api"] == "default/t"
        assert attrs(client)["server.address"] == "127.0.0.1:%d" % b.port
        assert int(client["startTimeUnixNano"]) >= int(server["startTimeUnixNano"])
        assert all(s["traceId"] != "1" * 32 for s in c.spans)
        # the backend that is down: a server span with an error status
        failed = [s for s in c.spans if s["kind"] == 2 and attrs(s).get("url.path") == "/down/x"]
        assert failed and failed[0]["status"]["code"] == 2
        wait_until(lambda: rt.metric("sluice_traffic_log_records_total", sink="tracing",
                                     type="otlp") == 2, 5, what="2 span records delivered")
        # The traffic log has every request, the unsampled one too, and
        # nothing of the spans.
        logged = records(log, 3)
        assert sorted(r["path"] for r in logged) == ["/down/x", "/t/a", "/t/quiet"]
        assert {r["trace_id"] for r in logged if r["path"] == "/t/quiet"} == {"1" * 32}
    finally:
        c.stop()


def test_otlp_collector_down_then_back(runtimes, backends, tmp_path):
    c = Collector()
    c.down = True
    try:
        b = backends("echo")
        port = free_port()
        tracing = {"export": {"url": "http://127.0.0.1:%d/v1/traces" % c.port,
                              "batch": {"maxDelay": "50ms"},
                              "retry": {"initialBackoff": "50ms", "maxBackoff": "200ms"}}}
        rt = runtimes([gw(port, tracing), backend("echo", [b.port]), api("t", "/t", "echo")])
        for i in range(20):
            assert request(port, "GET", "/t/%d" % i).status == 200
        wait_until(lambda: rt.metric("sluice_traffic_log_failed_batches_total",
                                     sink="tracing") >= 1, 5, what="a failed delivery")
        assert rt.metric("sluice_traffic_log_queue_records", sink="tracing") == 20
        c.down = False
        wait_until(lambda: len({s["traceId"] for s in c.spans}) == 20, 10,
                   what="the 20 traces delivered")
        assert c.errors == []
        assert rt.metric("sluice_traffic_log_dropped_total", sink="tracing") == 0
    finally:
        c.stop()


def test_validation_names_the_field(tmp_path):
    bad = [({"export": {"serviceName": "x"}}, "spec.tracing.export.url", "required field missing"),
           ({"sampling": 1.5}, "spec.tracing.sampling", "out of range"),
           ({"serverTiming": "yes"}, "spec.tracing.serverTiming", ""),
           ({"export": {"url": "ftp://c/v1/traces"}}, "spec.tracing.export.url", "http://"),
           ({"sample": 1}, "spec.tracing.sample", "did you mean 'sampling'")]
    for tracing, path, why in bad:
        cfg = tmp_path / "bad.yaml"
        cfg.write_text(dump_docs([gw(8080, tracing)]))
        p = subprocess.run([runtime_binary(), "--check", "--config", str(cfg)],
                           capture_output=True, timeout=30, env=Runtime.env())
        out = (p.stdout + p.stderr).decode()
        assert p.returncode != 0 and path in out and why in out, (tracing, out)
