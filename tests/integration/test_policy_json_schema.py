"""The json-schema policy (docs/policies/json-schema.md) and the request-body
access of the policy engine it uses (policies/policy.h, on_body): a route
whose chain asks for the body reads it whole (Content-Length, chunked,
HTTP/2 DATA; Expect: 100-continue), up to a cap (413 past it, nothing
forwarded), validates it (400 invalid_json / schema_violation with the
value's JSON pointer) and forwards it byte for byte; every other body
streams as before. Over HTTP/1.1 and h2c (`proto`), standalone and through
the controller (a bad schema is a 400 at the REST API with its field
path)."""

import json
import socket
import subprocess
import time
import zlib

import grpc
import pytest

from helpers import (ResponseReader, api, assert_gateway_error, backend, connect, dump_docs,
                     free_port, gateway, is_closed, runtime_binary, wait_until)

PET_SCHEMA = {
    "$defs": {
        "pet": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 20},
                "tag": {"type": ["string", "null"], "pattern": "^[a-z]+$"},
                "age": {"type": "integer", "minimum": 0},
            },
            "additionalProperties": False,
        },
    },
    "type": "object",
    "required": ["pets"],
    "properties": {"pets": {"type": "array", "items": {"$ref": "#/$defs/pet"},
                            "maxItems": 1000}},
}

VALID = json.dumps({"pets": [{"name": "Rex", "tag": "dog", "age": 3},
                             {"name": "Tóbí ☃", "tag": None}]}, ensure_ascii=False,
                   indent=1).encode()


def operations(config, **extra):
    return [
        {"name": "create", "method": "POST", "path": "/pets",
         "policies": [dict({"name": "json-schema", "config": config}, **extra)]},
        {"name": "raw", "method": "POST", "path": "/raw"},
        {"name": "list", "method": "GET", "path": "/pets"},
    ]


def start(backends, runtimes, proto, config=None, gw_kw=None, api_kw=None, **extra):
    b = backends("echo")
    port = free_port()
    cfg = config if config is not None else {"schema": PET_SCHEMA}
    runtimes([proto.gateway(port, **(gw_kw or {})), backend("echo", [b.port]),
              api("t", "/t", "echo", operations=operations(cfg, **extra), **(api_kw or {}))])
    return port, b


def hdr(record, name):
    vals = [v for k, v in record["headers"] if k.lower() == name.lower()]
    return vals[0] if vals else None


def assert_forwarded(record, body):
    """The origin got exactly `body`, framed with its Content-Length."""
    assert record["body_length"] == len(body), record
    assert record["body_crc32"] == zlib.crc32(body), record
    assert hdr(record, "Content-Length") == str(len(body)), record["headers"]
    assert hdr(record, "Transfer-Encoding") is None, record["headers"]


JSON = {"Content-Type": "application/json"}


def test_valid_body_reaches_the_backend_byte_identical(backends, runtimes, proto):
    port, b = start(backends, runtimes, proto)
    r = proto.request(port, "POST", "/t/pets", headers=JSON, body=VALID)
    assert r.status == 200, r
    assert_forwarded(b.received()[-1], VALID)
    # A media type with parameters, any case.
    r = proto.request(port, "POST", "/t/pets", body=VALID,
                      headers={"Content-Type": "Application/JSON; charset=utf-8"})
    assert r.status == 200, r


@pytest.mark.parametrize("body,pointer,keyword", [
    (b'{"pets": [{"name": "Rex"}, {"name": 5}]}', "/pets/1/name", "type"),
    (b'{"pets": [{"tag": "dog"}]}', "/pets/0", "required"),
    (b'{"pets": [{"name": "Rex", "color": "red"}]}', "/pets/0/color", "additionalProperties"),
    (b'{"pets": [{"name": "Rex", "tag": "Dog"}]}', "/pets/0/tag", "pattern"),
    (b'{"pets": [{"name": "Rex", "age": -1}]}', "/pets/0/age", "minimum"),
    (b'{"pets": [{"name": ""}]}', "/pets/0/name", "minLength"),
    (b'{"pets": {}}', "/pets", "type"),
    (b'[]', "", "type"),
])
def test_a_violation_is_400_with_the_pointer(backends, runtimes, proto, body, pointer, keyword):
    port, b = start(backends, runtimes, proto)
    err = assert_gateway_error(proto.request(port, "POST", "/t/pets", headers=JSON, body=body),
                               400)
    assert err["code"] == "schema_violation", err
    assert err["message"].startswith('at "%s": %s: ' % (pointer, keyword)), err
    assert b.count() == 0


@pytest.mark.parametrize("body,why", [
    (b'{"pets": [}', "not valid JSON"),
    (b'', "empty"),
    (b'{"pets": []} x', "not valid JSON"),
    (b'{"pets": [], "pets": [{"name": 1}]}', "duplicate"),
    (b'[' * 100 + b']' * 100, "deeper than 64"),
    (b'\xff\xfe{}', "not valid JSON"),
])
def test_a_body_that_is_not_json_is_400_invalid_json(backends, runtimes, proto, body, why):
    port, b = start(backends, runtimes, proto)
    err = assert_gateway_error(proto.request(port, "POST", "/t/pets", headers=JSON, body=body),
                               400)
    assert err["code"] == "invalid_json" and why in err["message"], err
    assert b.count() == 0


def test_chunked_body_goes_on_with_its_length(backends, runtimes, proto):
    """Pieces: HTTP/1.1 chunked (with trailers, which go with the framing),
    HTTP/2 DATA frames without a content-length."""
    port, b = start(backends, runtimes, proto)
    pieces = [VALID[:7], VALID[7:100], VALID[100:]]
    r = proto.request(port, "POST", "/t/pets", headers=JSON, chunks=pieces,
                      trailers=[("X-Checksum", "abc")])
    assert r.status == 200, r
    assert_forwarded(b.received()[-1], VALID)
    bad = b'{"pets": [{"name": "Rex"}, {"name": true}]}'
    err = assert_gateway_error(proto.request(port, "POST", "/t/pets", headers=JSON,
                                             chunks=[bad[:10], bad[10:]]), 400)
    assert '"/pets/1/name"' in err["message"], err
    assert b.count() == 1


def test_a_large_valid_body(backends, runtimes, proto):
    """Bigger than every buffer and window on the way (32 KiB blocks, the
    65535-byte HTTP/2 stream window), under the 1 MiB default cap."""
    port, b = start(backends, runtimes, proto)
    body = json.dumps({"pets": [{"name": "p%d" % i, "tag": "x" * 10, "age": i}
                                for i in range(900)]}).encode()
    assert 30000 < len(body) < 1048576
    chunks = [body[i:i + 5000] for i in range(0, len(body), 5000)]
    r = proto.request(port, "POST", "/t/pets", headers=JSON, chunks=chunks)
    assert r.status == 200, r
    assert_forwarded(b.received()[-1], body)
    r = proto.request(port, "POST", "/t/pets", headers=JSON, body=body)
    assert r.status == 200, r
    assert_forwarded(b.received()[-1], body)


def test_to_an_http2_backend(runtimes, proto):
    """A body read whole goes to an HTTP/2 origin as DATA, with its length."""
    from test_upstream_h2 import H2Origin
    origin = H2Origin()
    try:
        port = free_port()
        runtimes([proto.gateway(port), backend("h2o", [origin.port], protocol="h2c"),
                  api("t", "/t", "h2o", operations=operations({"schema": PET_SCHEMA}))])
        big = json.dumps({"pets": [{"name": "p%d" % i, "tag": "x" * 60}
                                   for i in range(900)]}).encode()
        for body, kw in ((VALID, {"body": VALID}), (VALID, {"chunks": [VALID[:50], VALID[50:]]}),
                         (big, {"chunks": [big[:40000], big[40000:]]})):
            r = proto.request(port, "POST", "/t/pets", headers=JSON, **kw)
            assert r.status == 200, r
            assert r.body.decode() == "%d %d" % (len(body), zlib.crc32(body))
            assert origin.requests[-1]["content-length"] == str(len(body))
        assert_gateway_error(proto.request(port, "POST", "/t/pets", headers=JSON,
                                           chunks=[b'{"pets"', b': 0}']), 400)
        assert len(origin.requests) == 3
    finally:
        origin.close()


def test_over_the_cap_is_413_and_nothing_is_forwarded(backends, runtimes, proto):
    port, b = start(backends, runtimes, proto, {"schema": PET_SCHEMA, "maxBodyBytes": 1000})
    ok = b'{"pets": []}' + b" " * 988
    assert proto.request(port, "POST", "/t/pets", headers=JSON, body=ok).status == 200
    # Declared: refused at once.
    c = proto.connection(port)
    try:
        err = assert_gateway_error(c.request("POST", "/t/pets", headers=JSON, body=ok + b" "), 413)
        assert err["code"] == "payload_too_large" and "1000" in err["message"], err
        if not proto.h2:
            assert is_closed(c.sock, 5, c.reader)
    finally:
        c.close()
    # Undeclared: stopped at the first byte past the cap.
    big = b'{"pets": []}' + b" " * 3000
    err = assert_gateway_error(proto.request(port, "POST", "/t/pets", headers=JSON,
                                             chunks=[big[i:i + 400] for i in range(0, 3012, 400)]),
                               413)
    assert err["code"] == "payload_too_large", err
    assert b.count() == 1


def test_the_route_limit_caps_the_body_too(backends, runtimes, proto):
    """maxRequestBodyBytes (100) is below the policy's cap (1 MiB)."""
    port, b = start(backends, runtimes, proto, api_kw={"maxRequestBodyBytes": 100})
    big = b'{"pets": []}' + b" " * 200
    assert_gateway_error(proto.request(port, "POST", "/t/pets", headers=JSON,
                                       chunks=[big[:100], big[100:]]), 413)
    assert proto.request(port, "POST", "/t/pets", headers=JSON, chunks=[b'{"pets":', b'[]}']
                         ).status == 200
    assert b.count() == 1


def test_other_content_types(backends, runtimes, proto):
    port, b = start(backends, runtimes, proto)
    err = assert_gateway_error(proto.request(port, "POST", "/t/pets", body=b"{}",
                                             headers={"Content-Type": "text/plain"}), 415)
    assert err["code"] == "unsupported_media_type" and "application/json" in err["message"], err
    assert_gateway_error(proto.request(port, "POST", "/t/pets", body=b"{}"), 415)
    # No body and no JSON: nothing to check.
    assert proto.request(port, "POST", "/t/pets").status == 200
    # A JSON type without a body: the empty body is not JSON.
    err = assert_gateway_error(proto.request(port, "POST", "/t/pets", headers=JSON, body=b""),
                               400)
    assert err["code"] == "invalid_json", err
    assert b.count() == 1


def test_other_content_types_pass_and_suffix_ranges(backends, runtimes, proto):
    port, b = start(backends, runtimes, proto, {
        "schema": PET_SCHEMA, "otherContentTypes": "pass",
        "contentTypes": ["application/json", "application/*+json"]})
    assert proto.request(port, "POST", "/t/pets", body=b"not json",
                         headers={"Content-Type": "text/plain"}).status == 200
    err = assert_gateway_error(proto.request(
        port, "POST", "/t/pets", body=b"{}",
        headers={"Content-Type": "application/merge-patch+json"}), 400)
    assert err["code"] == "schema_violation", err
    assert b.count() == 1


def test_bodies_of_other_routes_stream(backends, runtimes, proto):
    """A route without the policy, and the policy's route for a request its
    `when` does not match, never read the body whole: 3 MiB (over the
    1 MiB cap) of what is not JSON at all goes through."""
    port, b = start(backends, runtimes, proto, when={"headers": [{"name": "X-Validate",
                                                                  "type": "present"}]})
    big = b"\x00not json" * (3 * 1024 * 1024 // 9)
    for target in ("/t/raw", "/t/pets"):
        r = proto.request(port, "POST", target, headers=JSON, body=big, timeout=30)
        assert r.status == 200, (target, r)
        assert b.received()[-1]["body_length"] == len(big)
        assert b.received()[-1]["body_crc32"] == zlib.crc32(big)
    err = assert_gateway_error(proto.request(port, "POST", "/t/pets", body=big[:100],
                                             headers=dict(JSON, **{"X-Validate": "1"})), 400)
    assert err["code"] == "invalid_json", err


def test_keep_alive_and_pipelining_after_a_read_body(backends, runtimes):
    """HTTP/1.1: a request pipelined behind a body that was read whole (and
    behind one that was refused) is answered in turn on the same
    connection."""
    from clients import Proto
    port, b = start(backends, runtimes, Proto("http1"))
    bad = b'{"pets": 1}'
    data = (b"POST /t/pets HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(VALID), VALID) +
            b"POST /t/pets HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(bad), bad) +
            b"GET /t/pets HTTP/1.1\r\nHost: x\r\n\r\n")
    s = connect(port)
    try:
        s.sendall(data)
        reader = ResponseReader(s)
        assert reader.read_response("POST").status == 200
        assert_gateway_error(reader.read_response("POST"), 400)
        assert reader.read_response("GET").status == 200
    finally:
        s.close()
    got = b.received()
    assert [r["method"] for r in got] == ["POST", "GET"]
    assert_forwarded(got[0], VALID)


def test_expect_100_continue(backends, runtimes):
    """The gateway asks for the body itself (it must read it before any
    upstream is chosen); a declared length over the cap is refused without
    a 100."""
    from clients import Proto
    port, b = start(backends, runtimes, Proto("http1"), {"schema": PET_SCHEMA,
                                                         "maxBodyBytes": 5000})
    s = connect(port)
    try:
        s.sendall(b"POST /t/pets HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(VALID))
        reader = ResponseReader(s)
        interim = reader.read_response("POST", skip_1xx=False)
        assert interim.status == 100, interim
        s.sendall(VALID)
        assert reader.read_response("POST").status == 200
        s.sendall(b"POST /t/pets HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Expect: 100-continue\r\nContent-Length: 5001\r\n\r\n")
        assert_gateway_error(reader.read_response("POST", skip_1xx=False), 413)
    finally:
        s.close()
    assert_forwarded(b.received()[-1], VALID)
    assert hdr(b.received()[-1], "Expect") is None


def test_a_stalled_body_times_out(backends, runtimes, proto):
    """A client that stops in the middle of a body it announced gets 408
    after the idle timeout (1 s here), not a worker's buffer forever."""
    port, b = start(backends, runtimes, proto, gw_kw={"timeouts": {"idle": "1s"}})
    c = proto.connection(port, timeout=10)
    try:
        t0 = time.monotonic()
        if proto.h2:
            sid = c.start("POST", "/t/pets", [("content-type", "application/json"),
                                               ("content-length", "100")], end_stream=False)
            c.send_data(sid, b'{"pets": [')
            r = c.response(sid, timeout=8)
        else:
            c.sock.sendall(b"POST /t/pets HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                           b"\r\nContent-Length: 100\r\n\r\n{\"pets\": [")
            r = c.reader.read_response("POST")
        elapsed = time.monotonic() - t0
        err = assert_gateway_error(r, 408)
        assert err["code"] == "request_body_timeout", err
        assert 0.8 < elapsed < 5, elapsed
        if not proto.h2:
            assert is_closed(c.sock, 5, c.reader)
    finally:
        c.close()
    assert b.count() == 0


def test_grpc_request_gets_a_grpc_status(backends, runtimes):
    """A reply from on_body to a gRPC call is a gRPC status, like any
    policy's: a body that is not JSON is INTERNAL (HTTP 400)."""
    from clients import Proto
    h2 = Proto("h2c")
    b = backends("echo")
    port = free_port()
    runtimes([h2.gateway(port), backend("echo", [b.port]),
              api("t", "/t", "echo", operations=[
                  {"method": "POST", "path": "/pkg.Svc/", "pathType": "prefix",
                   "policies": [{"name": "json-schema", "config": {
                       "schema": {"type": "object"}, "contentTypes": ["application/grpc"]}}]}])])
    ch = grpc.insecure_channel("127.0.0.1:%d" % h2.port(port))
    try:
        with pytest.raises(grpc.RpcError) as e:
            ch.unary_unary("/t/pkg.Svc/Get")(b"\x01\x02", timeout=5)
        assert e.value.code() == grpc.StatusCode.INTERNAL, e.value
        assert "not valid JSON" in e.value.details(), e.value.details()
    finally:
        ch.close()
    assert b.count() == 0


def test_rejections_are_counted_and_logged(backends, runtimes, proto, tmp_path):
    log = tmp_path / "access.log"
    b = backends("echo")
    port = free_port()
    rt = runtimes([proto.gateway(port), backend("echo", [b.port]),
                   api("t", "/t", "echo", operations=operations({"schema": PET_SCHEMA}))],
                  access_log=str(log))
    assert_gateway_error(proto.request(port, "POST", "/t/pets", headers=JSON, body=b"{}"), 400)
    assert proto.request(port, "POST", "/t/pets", headers=JSON, body=VALID).status == 200
    assert [v for n, labels, v in rt.metrics() if n == "sluice_policy_rejections_total"
            and labels == {"api": "default/t", "policy": "json-schema"}] == [1]
    wait_until(lambda: log.exists() and len(log.read_text().splitlines()) >= 2, 10,
               what="2 access log lines")
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert sorted((x["status"], x["policy"], x["bytes_received"]) for x in lines) == \
        [(200, "", len(VALID)), (400, "json-schema", 2)]


# --- validation: runtime --check and the controller's REST API ---------------

def check(tmp_path, schema, **config):
    docs = [gateway(8080), backend("echo", [9]), api("t", "/t", "echo", policies=[
        {"name": "json-schema", "config": dict({"schema": schema}, **config)}])]
    p = tmp_path / "c.yaml"
    p.write_text(dump_docs(docs))
    return subprocess.run([runtime_binary(), "--check", "--config", str(p)],
                          capture_output=True, text=True, timeout=30)


P = "spec.policies[0].config."


@pytest.mark.parametrize("schema,config,want", [
    ({"properties": {"name": {"type": "strin"}}}, {},
     P + "schema.properties.name.type: unknown type (did you mean 'string'?)"),
    ({"properties": {"name": {"minLenght": 1}}}, {},
     P + "schema.properties.name.minLenght: unknown keyword (did you mean 'minLength'?)"),
    ({"items": {"$ref": "#/$defs/nope"}}, {},
     P + "schema.items.$ref: \"#/$defs/nope\" points to nothing"),
    ({"items": {"$ref": "other.json#/x"}}, {},
     P + "schema.items.$ref: only references within this schema"),
    ({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"$ref": "#/$defs/a"}}}, {},
     "$ref: this $ref leads back to itself"),
    ({"properties": {"x": {"pattern": "a("}}}, {},
     P + "schema.properties.x.pattern: the pattern does not compile"),
    ({"definitions": {}}, {}, P + "schema.definitions: unknown keyword: draft 2020-12 names it $defs"),
    ({"items": [{"type": "string"}]}, {}, P + "schema.items: expected a schema"),
    ({"type": "object"}, {"maxBodyBytes": 0}, P + "maxBodyBytes"),
    ({"type": "object"}, {"contentTypes": ["json"]}, P + "contentTypes[0]: expected a media type"),
    ({"type": "object"}, {"otherContentType": "pass"},
     P + "otherContentType: unknown field (did you mean 'otherContentTypes'?)"),
])
def test_check_names_the_field(tmp_path, schema, config, want):
    r = check(tmp_path, schema, **config)
    assert r.returncode != 0
    assert want in r.stderr, (want, r.stderr)


def test_a_recursive_schema_that_descends_is_fine(tmp_path):
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node"}
    r = check(tmp_path, tree)
    assert r.returncode == 0, r.stderr


def test_through_the_controller(tmp_path, backends):
    """A bad schema is a 400 at the REST API with its field path; a good one
    reaches a managed runtime, which validates bodies with it."""
    from controller_env import Controller, ManagedRuntime
    b = backends("echo")
    port = free_port()
    ctl = Controller(tmp_path / "controller").start()
    rt = None
    try:
        bad = api("t", "/t", "echo", operations=operations(
            {"schema": {"properties": {"pets": {"type": "aray"}}}}))
        status, _, doc = ctl.rest("PUT", "/api/v1/apis/t", bad)
        assert status == 400, doc
        assert "spec.operations[0].policies[0].config.schema.properties.pets.type" in \
            json.dumps(doc), doc
        ctl.apply([gateway(port), backend("echo", [b.port]),
                   api("t", "/t", "echo", operations=operations({"schema": PET_SCHEMA}))])
        rt = ManagedRuntime(tmp_path / "rt", ctl.stream_addr, "rt-1")
        rt.start(wait_ready=False)
        ctl.wait_converged(1, timeout=20)
        rt.wait_ready()
        from clients import Proto
        h1 = Proto("http1")
        assert h1.request(port, "POST", "/t/pets", headers=JSON, body=VALID).status == 200
        err = assert_gateway_error(h1.request(port, "POST", "/t/pets", headers=JSON,
                                              body=b'{"pets": [{"name": 1}]}'), 400)
        assert err["message"].startswith('at "/pets/0/name": type:'), err
        assert_forwarded(b.received()[-1], VALID)
    finally:
        if rt is not None:
            rt.stop()
        ctl.stop()
    assert not ctl.problems(), ctl.problems()
    assert rt is None or not rt.problems(0), rt.problems(0)
