"""Bodies in the traffic log (docs/configuration.md "Traffic log", bodies):
the fields request_body and response_body with a file sink, against the
echo backend (backend.py, which records the length and CRC of the body it
got) and scripted origins (raworigin.py) for chunked responses.

What is checked: the record's body object (content_type, size, text,
_truncated, _omitted) for HTTP/1.1 bodies with Content-Length and chunked,
both ways, and for HTTP/2 clients (with and without content-length); the
cap; content types that are not kept; redaction of JSON members at any
depth and of form fields; redaction failing closed (a truncated or invalid
JSON body is never logged while redaction is on); an Api override turning
bodies off; validation naming the field; and that the upstream and the
client get every body byte unchanged whatever is logged."""

import json
import os
import socket
import subprocess
import zlib

from helpers import (api, backend, dump_docs, free_port, gateway, request, runtime_binary,
                     wait_until, Runtime)
from raworigin import RawOrigin, chunked, response
from test_http2 import H2Client, echo, status

FIELDS = ["method", "path", "status", "request_body", "response_body"]


def gw(port, log, fields=FIELDS, bodies=None, protocol="http"):
    g = gateway(port)
    g["spec"]["listeners"][0]["protocol"] = protocol
    tl = {"fields": fields, "sinks": [{"name": "local", "type": "file", "path": log}]}
    if bodies is not None:
        tl["bodies"] = bodies
    g["spec"]["trafficLog"] = tl
    return g


def records(path, n, timeout=5.0):
    def read():
        if not os.path.exists(path):
            return None
        with open(path) as f:
            lines = [l for l in f.read().splitlines() if l]
        if len(lines) < n:
            return None
        return [json.loads(l) for l in lines]
    return wait_until(read, timeout, what="%d records in %s" % (n, path))


def start_env(runtimes, backends, tmp_path, bodies=None, protocol="http", extra=()):
    b = backends("echo")
    port = free_port()
    log = str(tmp_path / "traffic.jsonl")
    rt = runtimes([gw(port, log, bodies=bodies, protocol=protocol), backend("echo", [b.port]),
                   api("t", "/t", "echo")] + list(extra))
    return port, log, b, rt


def chunked_request(port, path, ctype, pieces):
    """A chunked POST on a raw socket; returns the response's status and body."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = ("POST %s HTTP/1.1\r\nHost: example.com\r\nContent-Type: %s\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" % (path, ctype))
    s.sendall(head.encode() + chunked(*pieces))
    data = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        data += d
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        out, rest = b"", body
        while True:
            line, _, rest = rest.partition(b"\r\n")
            n = int(line.split(b";")[0], 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    return int(head.split(b" ")[1]), body


def test_http11_content_length_both_ways(runtimes, backends, tmp_path):
    port, log, b, _ = start_env(runtimes, backends, tmp_path)
    sent = json.dumps({"user": "ann", "items": [1, 2, 3], "note": "caf\u00e9 \"q\""}).encode()
    r = request(port, "POST", "/t/echo", headers={"Content-Type": "application/json"}, body=sent)
    assert r.status == 200
    got = json.loads(r.body)
    # The upstream got every byte unchanged.
    assert got["body_length"] == len(sent) and got["body_crc32"] == zlib.crc32(sent)
    assert request(port, "GET", "/t/plain").status == 200
    recs = {x["path"]: x for x in records(log, 2)}
    rec = recs["/t/echo"]
    assert rec["request_body"] == {"content_type": "application/json", "size": len(sent),
                                   "text": sent.decode()}
    # The response body as the client got it, as a string (not an object).
    rb = rec["response_body"]
    assert rb["content_type"] == "application/json" and rb["size"] == len(r.body)
    assert rb["text"] == r.body.decode() and "_truncated" not in rb
    # A request without a body has no request_body; its response has one.
    assert "request_body" not in recs["/t/plain"] and "response_body" in recs["/t/plain"]


def test_http11_chunked_both_ways_and_the_cap(runtimes, backends, tmp_path):
    origin = RawOrigin(lambda req: [response(
        200, chunked(b"alpha-", b"beta-" * 30, b"gamma"),
        headers=[("Content-Type", "text/plain; charset=utf-8"),
                 ("Transfer-Encoding", "chunked")])]).start()
    try:
        b = backends("echo")
        port = free_port()
        log = str(tmp_path / "traffic.jsonl")
        runtimes([gw(port, log, bodies={"maxBytes": 64}), backend("echo", [b.port]),
                  backend("raw", [origin.port]), api("t", "/t", "echo"),
                  api("c", "/c", "raw")])
        pieces = [b"0123456789" * 5, b"x" * 7, b"abcdefghij" * 10]
        body = b"".join(pieces)
        st, rbody = chunked_request(port, "/t/up", "text/plain", pieces)
        assert st == 200
        got = json.loads(rbody)
        assert got["body_length"] == len(body) and got["body_crc32"] == zlib.crc32(body)
        r = request(port, "GET", "/c/down")
        expect = b"alpha-" + b"beta-" * 30 + b"gamma"
        assert r.status == 200 and r.body == expect
        recs = {x["path"]: x for x in records(log, 2)}
        up = recs["/t/up"]["request_body"]
        # De-chunked payload, first 64 bytes, the rest counted.
        assert up == {"content_type": "text/plain", "size": len(body),
                      "_truncated": len(body) - 64, "text": body[:64].decode()}
        down = recs["/c/down"]["response_body"]
        assert down == {"content_type": "text/plain; charset=utf-8", "size": len(expect),
                        "_truncated": len(expect) - 64, "text": expect[:64].decode()}
    finally:
        origin.stop()


def test_content_types_not_kept(runtimes, backends, tmp_path):
    port, log, b, _ = start_env(runtimes, backends, tmp_path,
                            bodies={"contentTypes": ["application/json"]})
    blob = bytes(range(256)) * 8
    r = request(port, "POST", "/t/bin", headers={"Content-Type": "application/octet-stream"},
                body=blob)
    assert r.status == 200 and json.loads(r.body)["body_crc32"] == zlib.crc32(blob)
    r = request(port, "POST", "/t/txt", headers={"Content-Type": "text/plain"}, body=b"hello")
    assert r.status == 200
    r = request(port, "POST", "/t/none", body=b"no type")
    assert r.status == 200
    recs = {x["path"]: x for x in records(log, 3)}
    assert recs["/t/bin"]["request_body"] == {
        "content_type": "application/octet-stream", "size": len(blob),
        "_truncated": len(blob), "_omitted": "content type not logged"}
    # text/* is a default type, not listed here.
    assert recs["/t/txt"]["request_body"]["_omitted"] == "content type not logged"
    assert "text" not in recs["/t/none"]["request_body"]
    assert recs["/t/none"]["request_body"]["size"] == 7
    assert "content_type" not in recs["/t/none"]["request_body"]
    # The echo's JSON response is listed.
    assert json.loads(recs["/t/bin"]["response_body"]["text"])["body_length"] == len(blob)


def test_json_redaction_at_depth_and_form(runtimes, backends, tmp_path):
    port, log, b, _ = start_env(runtimes, backends, tmp_path,
                            bodies={"redact": ["password", "token", "card number"]})
    doc = {"user": "ann", "password": "hunter2",
           "nested": {"list": [{"token": {"deep": "s3cret-tok"}}, {"Token": "kept"}]},
           "pass\u0077ord_not": 1, "card number": 4111111111111111}
    sent = json.dumps(doc, indent=1).encode()
    # An escaped name is the same name: "p\u0061ssword".
    sent2 = b'{"p\\u0061ssword": "esc-secret", "a": [true, null, -1.5e3]}'
    r = request(port, "POST", "/t/j", headers={"Content-Type": "application/merge-patch+json"},
                body=sent)
    assert r.status == 200 and json.loads(r.body)["body_crc32"] == zlib.crc32(sent)
    assert request(port, "POST", "/t/j2", headers={"Content-Type": "application/json"},
                   body=sent2).status == 200
    form = b"user=ann&password=hunter2&card+number=4111222233334444&x=%70assword&pass%77ord=enc-secret&flag"
    r = request(port, "POST", "/t/f",
                headers={"Content-Type": "application/x-www-form-urlencoded"}, body=form)
    assert r.status == 200 and json.loads(r.body)["body_crc32"] == zlib.crc32(form)
    recs = {x["path"]: x for x in records(log, 3)}
    logged = json.loads(recs["/t/j"]["request_body"]["text"])
    assert logged == dict(doc, password="[redacted]", **{"card number": "[redacted]"},
                          nested={"list": [{"token": "[redacted]"}, {"Token": "kept"}]})
    assert json.loads(recs["/t/j2"]["request_body"]["text"]) == {
        "p\u0061ssword": "[redacted]", "a": [True, None, -1500.0]}
    assert recs["/t/f"]["request_body"]["text"] == (
        "user=ann&password=[redacted]&card+number=[redacted]&x=%70assword&"
        "pass%77ord=[redacted]&flag")
    with open(log) as f:
        text = f.read()
    for secret in ("hunter2", "s3cret-tok", "4111111111111111", "4111222233334444", "esc-secret",
                   "enc-secret"):
        assert secret not in text


def test_redaction_fails_closed(runtimes, backends, tmp_path):
    port, log, b, _ = start_env(runtimes, backends, tmp_path,
                            bodies={"redact": ["password"], "maxBytes": 40})
    long_doc = json.dumps({"user": "ann", "pad": "p" * 40, "password": "hunter2"}).encode()
    r = request(port, "POST", "/t/long", headers={"Content-Type": "application/json"},
                body=long_doc)
    assert r.status == 200 and json.loads(r.body)["body_crc32"] == zlib.crc32(long_doc)
    bad = b'{"password": "hunter3", oops}'
    assert request(port, "POST", "/t/bad", headers={"Content-Type": "application/json"},
                   body=bad).status == 200
    ok = b'{"password":"hunter4"}'
    assert request(port, "POST", "/t/ok", headers={"Content-Type": "application/json"},
                   body=ok).status == 200
    recs = {x["path"]: x for x in records(log, 3)}
    assert recs["/t/long"]["request_body"] == {
        "content_type": "application/json", "size": len(long_doc),
        "_truncated": len(long_doc) - 40, "_omitted": "truncated JSON cannot be redacted"}
    assert recs["/t/bad"]["request_body"] == {
        "content_type": "application/json", "size": len(bad),
        "_omitted": "invalid JSON cannot be redacted"}
    assert recs["/t/ok"]["request_body"]["text"] == '{"password":"[redacted]"}'
    # The echo's response (JSON, longer than 40 bytes) is cut too: omitted.
    assert recs["/t/ok"]["response_body"]["_omitted"] == "truncated JSON cannot be redacted"
    with open(log) as f:
        text = f.read()
    assert "hunter" not in text


def test_api_override_turns_bodies_off(runtimes, backends, tmp_path):
    quiet = api("q", "/q", "echo")
    quiet["spec"]["trafficLog"] = {"fields": ["method", "path", "status"]}
    port, log, b, _ = start_env(runtimes, backends, tmp_path, extra=[quiet])
    for p in ("/t/a", "/q/a"):
        assert request(port, "POST", p, headers={"Content-Type": "text/plain"},
                       body=b"body of " + p.encode()).status == 200
    recs = {x["path"]: x for x in records(log, 2)}
    assert recs["/t/a"]["request_body"]["text"] == "body of /t/a"
    assert set(recs["/q/a"]) == {"method", "path", "status"}


def test_http2_bodies(runtimes, backends, tmp_path):
    origin = RawOrigin(lambda req: [response(
        200, chunked(b'{"a":', b'"b"}'),
        headers=[("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")])]).start()
    try:
        b = backends("echo")
        port = free_port()
        log = str(tmp_path / "traffic.jsonl")
        runtimes([gw(port, log, bodies={"maxBytes": 1000}, protocol="h2c"),
                  backend("echo", [b.port]), backend("raw", [origin.port]),
                  api("t", "/t", "echo"), api("c", "/c", "raw")])
        c = H2Client(port)
        small = b'{"k": "v", "n": [1, 2]}'
        big = b"z" * 5000
        r1 = c.response(c.send("POST", "/t/cl", headers=[("content-type", "application/json")],
                               body=small))
        r2 = c.response(c.send("POST", "/t/nocl", headers=[("content-type", "text/csv")],
                               body=big, content_length=False))
        r3 = c.get("/c/chunked")
        assert status(r1) == status(r2) == status(r3) == 200
        assert echo(r1)["body_crc32"] == zlib.crc32(small)
        assert echo(r2)["body_crc32"] == zlib.crc32(big) and echo(r2)["body_length"] == 5000
        assert bytes(r3["body"]) == b'{"a":"b"}'
        c.close()
        recs = {x["path"]: x for x in records(log, 3)}
        assert recs["/t/cl"]["request_body"] == {"content_type": "application/json",
                                                 "size": len(small), "text": small.decode()}
        assert recs["/t/cl"]["response_body"]["text"] == bytes(r1["body"]).decode()
        assert recs["/t/nocl"]["request_body"] == {"content_type": "text/csv", "size": 5000,
                                                   "_truncated": 4000, "text": "z" * 1000}
        assert recs["/c/chunked"]["response_body"] == {"content_type": "application/json",
                                                       "size": 9, "text": '{"a":"b"}'}
    finally:
        origin.stop()


def test_bodies_off_by_default_and_validation(runtimes, backends, tmp_path):
    b = backends("echo")
    port = free_port()
    log = str(tmp_path / "traffic.jsonl")
    g = gateway(port)
    g["spec"]["trafficLog"] = {"sinks": [{"name": "local", "type": "file", "path": log}]}
    runtimes([g, backend("echo", [b.port]), api("t", "/t", "echo")])
    assert request(port, "POST", "/t/a", headers={"Content-Type": "text/plain"},
                   body=b"x").status == 200
    rec = records(log, 1)[0]
    assert "request_body" not in rec and "response_body" not in rec and rec["status"] == 200

    bad = [
        ({"maxBytes": 65537}, "spec.trafficLog.bodies.maxBytes", "65536"),
        ({"contentTypes": ["json"]}, "spec.trafficLog.bodies.contentTypes[0]",
         "not a media type"),
        ({"contentTypes": ["application/json; charset=utf-8"]},
         "spec.trafficLog.bodies.contentTypes[0]", "without parameters"),
        ({"redact": [""]}, "spec.trafficLog.bodies.redact[0]", "1..256"),
        ({"redcat": ["a"]}, "spec.trafficLog.bodies.redcat", "redact"),
    ]
    for bodies, where, what in bad:
        cfg = tmp_path / "bad.yaml"
        cfg.write_text(dump_docs([gw(free_port(), log, bodies=bodies)]))
        p = subprocess.run([runtime_binary(), "--check", "--config", str(cfg)],
                           capture_output=True, timeout=30, env=Runtime.env())
        out = (p.stdout + p.stderr).decode()
        assert p.returncode != 0 and where in out and what in out, (bodies, out)
