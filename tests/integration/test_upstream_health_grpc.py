"""gRPC health checks (healthCheck.grpc) against a real grpcio server, and
what the runtime shows about endpoint health: sluice_health_checks_total,
sluice_endpoint_healthy on /metrics and the last failure's reason on the
admin /clusters document.

The grpc.health.v1.Health service is implemented here with a generic
handler and hand-encoded protobuf (Debian's python3-grpcio has no
grpc_health package): HealthCheckRequest{string service = 1},
HealthCheckResponse{ServingStatus status = 1}, SERVING = 1.
"""

import json
import subprocess
from concurrent import futures

import pytest

from helpers import api, backend, dump_docs, free_port, gateway, runtime_binary, wait_until

grpc = pytest.importorskip("grpc")

UNKNOWN, SERVING, NOT_SERVING, SERVICE_UNKNOWN = 0, 1, 2, 3
NO_OUTLIER = {"consecutiveFailures": 0}


def grpc_hc(service, **grpc_extra):
    return {"grpc": dict(grpc_extra, service=service), "interval": "150ms", "timeout": "150ms",
            "unhealthyThreshold": 2, "healthyThreshold": 1}


def decode_service(req):
    """HealthCheckRequest -> service; asserts the encoding is the one we
    send (field 1, length-delimited, or nothing for "")."""
    if req == b"":
        return ""
    assert req[0] == 0x0a, req
    n, i, shift = 0, 1, 0
    while True:
        b = req[i]
        i += 1
        n |= (b & 0x7f) << shift
        shift += 7
        if not b & 0x80:
            break
    assert len(req) == i + n, req
    return req[i:].decode()


class HealthServer:
    """A grpcio server with grpc.health.v1.Health/Check and pkg.Echo/Who
    (answers its name). status maps a service to its ServingStatus; an
    unlisted service is answered NOT_FOUND, as grpcio's own health servicer
    does. raw, when set, is sent as the response message instead."""

    def __init__(self, name):
        self.name = name
        self.status = {"": SERVING}
        self.raw = None
        self.checks = []  # (service, metadata dict)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        ident = dict(request_deserializer=None, response_serializer=None)
        self.server.add_generic_rpc_handlers((
            grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
                "Check": grpc.unary_unary_rpc_method_handler(self.check, **ident)}),
            grpc.method_handlers_generic_handler("pkg.Echo", {
                "Who": grpc.unary_unary_rpc_method_handler(self.who, **ident)}),
        ))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def check(self, req, ctx):
        service = decode_service(req)
        self.checks.append((service, dict(ctx.invocation_metadata())))
        if self.raw is not None:
            return self.raw
        if service not in self.status:
            ctx.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        st = self.status[service]
        return b"" if st == 0 else bytes([0x08, st])

    def who(self, req, ctx):
        return self.name.encode()

    def stop(self):
        self.server.stop(0)


@pytest.fixture
def health_servers():
    made = []

    def make(name):
        s = HealthServer(name)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


def h2c_gateway(port):
    gw = gateway(port)
    gw["spec"]["listeners"][0]["protocol"] = "h2c"
    return gw


def echo_api(backend_name):
    return api("grpc", "/", backend_name, retries={"attempts": 0}, operations=[
        {"name": "who", "method": "POST", "path": "/pkg.Echo/", "pathType": "prefix"}])


def who(channel, n):
    call = channel.unary_unary("/pkg.Echo/Who")
    out = []
    for _ in range(n):
        try:
            out.append(call(b"", timeout=5).decode())
        except grpc.RpcError as e:
            out.append(e.code().name)
    return out


# Metrics and /clusters name a Backend by its compiled name, namespace/name
# (docs/configuration.md "Compiled names"), like the cluster label elsewhere.
def compiled(backend_name):
    return "default/" + backend_name


def endpoint_of(rt, backend_name, port):
    backend_name = compiled(backend_name)
    status, _, body = rt.admin_get("/clusters")
    assert status == 200, body
    doc = json.loads(body)
    for b in doc["backends"]:
        if b["name"] == backend_name:
            for e in b["endpoints"]:
                if e["endpoint"] == "127.0.0.1:%d" % port:
                    return e
    raise AssertionError("127.0.0.1:%d of %s not in /clusters: %s" % (port, backend_name, doc))


def health_metric(rt, name, backend_name, port, **labels):
    samples = [x for x in rt.metrics() if x[0] == name and x[1].get("cluster") == compiled(
        backend_name) and x[1].get("endpoint") == "127.0.0.1:%d" % port and
        all(x[1].get(k) == v for k, v in labels.items())]
    assert len(samples) == 1, (name, backend_name, port, labels, samples)
    return samples[0][2]


def test_grpc_health_check_moves_traffic_with_the_serving_status(runtimes, health_servers):
    a, b = health_servers("a"), health_servers("b")
    # The whole server stays SERVING: only the named service's status counts.
    for s in (a, b):
        s.status["pkg.Echo"] = SERVING
    port = free_port()
    rt = runtimes([h2c_gateway(port),
                   backend("pool", [a.port, b.port], protocol="h2c",
                           healthCheck=grpc_hc("pkg.Echo", authority="health.example"),
                           outlierDetection=NO_OUTLIER),
                   echo_api("pool")])
    ch = grpc.insecure_channel("127.0.0.1:%d" % port)
    wait_until(lambda: set(who(ch, 10)) == {"a", "b"}, 10,
               what="both endpoints to receive traffic")
    wait_until(lambda: a.checks and b.checks, 10, what="gRPC health checks of both endpoints")
    service, md = a.checks[-1]
    assert service == "pkg.Echo"
    assert md.get("user-agent", "").startswith("sluice-health-check"), md
    wait_until(lambda: health_metric(rt, "sluice_endpoint_healthy", "pool", a.port) == 1, 10,
               what="sluice_endpoint_healthy of a to be 1")
    ok_before = health_metric(rt, "sluice_health_checks_total", "pool", a.port, result="success")
    assert ok_before >= 1

    a.status["pkg.Echo"] = NOT_SERVING
    wait_until(lambda: all(s == "b" for s in who(ch, 6)), 10,
               what="endpoint a to be skipped once NOT_SERVING")
    assert all(s == "b" for s in who(ch, 20))
    assert health_metric(rt, "sluice_endpoint_healthy", "pool", a.port) == 0
    assert health_metric(rt, "sluice_endpoint_healthy", "pool", b.port) == 1
    assert health_metric(rt, "sluice_health_checks_total", "pool", a.port, result="failure") >= 2
    e = endpoint_of(rt, "pool", a.port)
    assert e["health_check"]["checked"] is True
    assert e["health_check"]["healthy"] is False
    assert e["usable"] is False
    assert e["health_check"]["consecutive_failures"] >= 2
    assert e["health_check"]["last_failure"] == \
        'gRPC health check: service "pkg.Echo" is NOT_SERVING', e
    assert e["outlier_detection"]["ejected"] is False
    rt.wait_log(r"backend default/pool endpoint 127\.0\.0\.1:%d: unhealthy \(gRPC health check: "
                r"service \"pkg\.Echo\" is NOT_SERVING" % a.port, timeout=10)

    a.status["pkg.Echo"] = SERVING
    wait_until(lambda: any(s == "a" for s in who(ch, 6)), 10,
               what="endpoint a to receive traffic again once SERVING")
    wait_until(lambda: health_metric(rt, "sluice_endpoint_healthy", "pool", a.port) == 1, 10,
               what="sluice_endpoint_healthy of a back to 1")
    assert health_metric(rt, "sluice_health_checks_total", "pool", a.port,
                         result="success") > ok_before
    e = endpoint_of(rt, "pool", a.port)
    assert e["health_check"]["healthy"] is True
    assert e["health_check"]["consecutive_successes"] >= 1
    # The reason of the last failure stays visible after recovery.
    assert "NOT_SERVING" in e["health_check"]["last_failure"]
    ch.close()


@pytest.mark.parametrize("service,status,raw,reason", [
    ("svc", SERVICE_UNKNOWN, None, 'gRPC health check: service "svc" is SERVICE_UNKNOWN'),
    ("svc", UNKNOWN, None, 'gRPC health check: service "svc" is UNKNOWN'),
    # grpcio's own servicer answers an unknown service with NOT_FOUND, in a
    # Trailers-Only response.
    ("missing", None, None, "gRPC health check: grpc-status 5 (NOT_FOUND): unknown service"),
    ("svc", SERVING, b"\x08", "gRPC health check: malformed HealthCheckResponse"),
], ids=["service_unknown", "unknown", "not_found", "malformed"])
def test_grpc_health_check_failures_are_unhealthy_with_a_reason(runtimes, health_servers,
                                                                service, status, raw, reason):
    s = health_servers("s")
    if status is not None:
        s.status[service] = status
    s.raw = raw
    port = free_port()
    rt = runtimes([h2c_gateway(port),
                   backend("one", [s.port], protocol="h2c", healthCheck=grpc_hc(service),
                           outlierDetection=NO_OUTLIER),
                   echo_api("one")])
    wait_until(lambda: health_metric(rt, "sluice_endpoint_healthy", "one", s.port) == 0, 10,
               what="the endpoint to be marked unhealthy")
    assert health_metric(rt, "sluice_health_checks_total", "one", s.port, result="success") == 0
    e = endpoint_of(rt, "one", s.port)
    assert e["health_check"]["last_failure"] == reason, e
    ch = grpc.insecure_channel("127.0.0.1:%d" % port)
    assert who(ch, 1) == ["UNAVAILABLE"]  # no healthy endpoint
    ch.close()


def test_grpc_whole_server_check_sends_an_empty_request(runtimes, health_servers):
    s = health_servers("s")
    port = free_port()
    rt = runtimes([h2c_gateway(port),
                   backend("one", [s.port], protocol="h2c", healthCheck=grpc_hc(""),
                           outlierDetection=NO_OUTLIER),
                   echo_api("one")])
    wait_until(lambda: health_metric(rt, "sluice_health_checks_total", "one", s.port,
                                     result="success") >= 2, 10, what="two passed checks")
    assert s.checks[-1][0] == ""
    s.status[""] = NOT_SERVING
    wait_until(lambda: health_metric(rt, "sluice_endpoint_healthy", "one", s.port) == 0, 10,
               what="the endpoint to be marked unhealthy")
    assert endpoint_of(rt, "one", s.port)["health_check"]["last_failure"] == \
        'gRPC health check: service "" is NOT_SERVING'


def test_unchecked_endpoints_have_no_health_series(runtimes, health_servers):
    s = health_servers("s")
    port = free_port()
    rt = runtimes([h2c_gateway(port),
                   backend("plain", [s.port], protocol="h2c", outlierDetection=NO_OUTLIER),
                   echo_api("plain")])
    samples = rt.metrics()
    assert not [x for x in samples if x[0] in ("sluice_endpoint_healthy",
                                                "sluice_health_checks_total")], samples
    e = endpoint_of(rt, "plain", s.port)
    assert e["health_check"] == {"checked": False, "healthy": True, "last_failure": None,
                                 "consecutive_successes": 0, "consecutive_failures": 0,
                                 "checks_succeeded": 0, "checks_failed": 0}
    assert e["usable"] is True


@pytest.mark.parametrize("extra,needle", [
    ({}, "spec.healthCheck.grpc: gRPC health checks need an HTTP/2 Backend: set protocol h2c"),
    ({"protocol": "h2c", "path": "/health"},
     "spec.healthCheck.grpc: grpc and path are mutually exclusive: remove path"),
], ids=["http1_backend", "with_path"])
def test_grpc_health_check_config_errors(tmp_path, extra, needle):
    spec = {"grpc": {"service": "pkg.Echo"}}
    proto = {}
    if "protocol" in extra:
        proto["protocol"] = extra["protocol"]
    if "path" in extra:
        spec["path"] = extra["path"]
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(dump_docs([gateway(free_port()),
                              backend("b", [9], healthCheck=spec, **proto),
                              api("t", "/t", "b")]))
    r = subprocess.run([runtime_binary(), "--check", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0, r
    assert needle in r.stderr + r.stdout, r.stderr + r.stdout
