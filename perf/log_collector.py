#!/usr/bin/python3
"""A traffic-log collector for perf/bench.sh: the far end of the http and
elasticsearch sinks while the proxy is measured.

It answers like the real thing and counts what it got, spending as little of
the load CPU as it can: the http sink's POST (a JSON array per batch) is
answered 200; the elasticsearch sink's POST .../_bulk (NDJSON, an action line
then the document per record, a final newline) gets a bulk response with one
item per document, as Elasticsearch sends. Records are counted, not parsed
(the framing is checked by tests/integration/test_traffic_log.py, not here):
GET /count answers {"records": N, "batches": M, "bad": K}, K counting bodies
whose framing is wrong (no final newline, an odd number of lines for _bulk).

    log_collector.py --port PORT
"""
import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock = threading.Lock()
totals = {"records": 0, "batches": 0, "bad": 0}
ITEM = b'{"index":{"_index":"bench","status":201,"result":"created"}}'


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the sinks expect

    def log_message(self, *args):
        pass

    def answer(self, code, body, ctype="application/json"):
        # One write for head and body: two would make the second wait for
        # the sink's delayed ACK of the first (Nagle), 40 ms per batch.
        head = "HTTP/1.1 %d OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n" % (
            code, ctype, len(body))
        self.wfile.write(head.encode() + body)

    def do_GET(self):
        if self.path == "/count":
            with lock:
                self.answer(200, json.dumps(totals).encode())
        else:
            self.answer(200, b"{}")

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n)
        if self.path.split("?")[0].endswith("/_bulk"):
            lines = body.count(b"\n")
            bad = not body.endswith(b"\n") or lines % 2 != 0
            records = lines // 2
            reply = b'{"took":1,"errors":false,"items":[' + b",".join([ITEM] * records) + b"]}"
        else:
            # The sink sends [{record},{record},...]: records are joined by
            # '},{"', which cannot occur inside a record (a quote in a string
            # is escaped, and no record field is an array of objects).
            bad = not (body.startswith(b"[{") and body.endswith(b"}]"))
            records = body.count(b'},{"') + 1 if len(body) > 2 else 0
            reply = b"{}"
        with lock:
            totals["records"] += records
            totals["batches"] += 1
            totals["bad"] += 1 if bad else 0
        self.answer(200, reply)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    a = ap.parse_args()
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
