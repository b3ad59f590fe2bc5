"""The ip-filter policy (policies/ip-filter/ip_filter.c, docs/policies/
ip-filter.md): allow/deny by the client address over HTTP/1.1 and HTTP/2.
Clients bind their socket to other loopback addresses (all of 127.0.0.0/8
is loopback on Linux) to appear as different clients; X-Forwarded-For is
used only with trustedProxies."""

import socket
import subprocess

import pytest

import clients
from helpers import (api, assert_gateway_error, backend as backend_doc, free_port, gateway,
                     runtime_binary)


@pytest.fixture
def source(monkeypatch):
    """source(ip): later requests of clients.Proto come from that address."""
    def set_source(ip):
        def connect(port, host=None, timeout=5.0):
            family = socket.AF_INET6 if ":" in ip else socket.AF_INET
            dest = host or ("::1" if family == socket.AF_INET6 else "127.0.0.1")
            s = socket.socket(family, socket.SOCK_STREAM)
            s.settimeout(timeout)
            s.bind((ip, 0))
            s.connect((dest, port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return s
        monkeypatch.setattr(clients, "connect", connect)
    return set_source


def ip_api(name, config):
    return api(name, "/" + name, "echo", policies=[{"name": "ip-filter", "config": config}])


def assert_forbidden(resp):
    err = assert_gateway_error(resp, 403)
    assert err["code"] == "forbidden", err


def test_allow_and_deny_by_loopback_address(proto, backends, runtimes, source):
    b = backends("echo")
    port = free_port()
    runtimes([proto.gateway(port), backend_doc("echo", [b.port]),
              ip_api("wide", {"allow": ["127.0.0.0/8"], "deny": ["127.0.0.3"]}),
              ip_api("one", {"allow": ["127.0.0.1/32"]}),
              ip_api("deny", {"deny": ["127.0.0.2", "127.0.0.4/31"]})])
    expect = {  # source -> statuses of /wide, /one, /deny
        "127.0.0.1": (200, 200, 200),
        "127.0.0.2": (200, 403, 403),
        "127.0.0.3": (403, 403, 200),   # deny wins over allow
        "127.0.0.4": (200, 403, 403),
        "127.0.0.5": (200, 403, 403),
        "127.0.0.6": (200, 403, 200),
    }
    for ip, statuses in expect.items():
        source(ip)
        for path, status in zip(("/wide/x", "/one/x", "/deny/x"), statuses):
            resp = proto.request(port, "GET", path)
            if status == 403:
                assert_forbidden(resp)
            else:
                assert resp.status == 200, (ip, path, resp)
    assert b.count() == sum(s.count(200) for s in map(list, expect.values()))


def test_x_forwarded_for_with_trusted_proxies(proto, backends, runtimes, source):
    b = backends("echo")
    port = free_port()
    runtimes([proto.gateway(port), backend_doc("echo", [b.port]),
              ip_api("one", {"allow": ["203.0.113.0/24"], "trustedProxies": 1}),
              ip_api("two", {"allow": ["203.0.113.0/24", "127.0.0.1"], "trustedProxies": 2}),
              ip_api("none", {"allow": ["203.0.113.0/24"]})])
    source("127.0.0.1")
    cases = [
        ("/one/x", [("X-Forwarded-For", "203.0.113.5")], 200),
        ("/one/x", [("X-Forwarded-For", "10.0.0.9, 203.0.113.5")], 200),
        # the client wrote the left entry: only the proxy's (rightmost) counts
        ("/one/x", [("X-Forwarded-For", "203.0.113.5, 10.0.0.9")], 403),
        ("/one/x", [("X-Forwarded-For", "203.0.113.5"), ("X-Forwarded-For", "10.0.0.9")], 403),
        ("/one/x", [("X-Forwarded-For", "[2001:db8::1]:443, 203.0.113.7:5000")], 200),
        # malformed or missing: the connection's address (127.0.0.1) decides
        ("/one/x", [("X-Forwarded-For", "unknown")], 403),
        ("/one/x", [], 403),
        ("/two/x", [("X-Forwarded-For", "203.0.113.5, 10.0.0.9")], 200),
        ("/two/x", [("X-Forwarded-For", "10.0.0.9, 203.0.113.5")], 403),
        ("/two/x", [("X-Forwarded-For", "10.0.0.9")], 200),    # too few: 127.0.0.1
        ("/two/x", [("X-Forwarded-For", "nope, 10.0.0.9")], 200),  # malformed: 127.0.0.1
        # without trustedProxies the header is not believed
        ("/none/x", [("X-Forwarded-For", "203.0.113.5")], 403),
    ]
    for path, headers, status in cases:
        resp = proto.request(port, "GET", path, headers=headers)
        if status == 403:
            assert_forbidden(resp)
        else:
            assert resp.status == 200, (path, headers, resp)


def ipv6_loopback():
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.bind(("::1", 0))
        s.close()
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")
def test_ipv6_client(proto, backends, runtimes, source):
    b = backends("echo")
    port = free_port()
    runtimes([proto.gateway(port, address="::1"), backend_doc("echo", [b.port]),
              ip_api("v6", {"allow": ["::1/128"]}),
              ip_api("v6net", {"allow": ["2001:db8::/32", "127.0.0.0/8"]}),
              ip_api("v6deny", {"deny": ["::/0"]})])
    source("::1")
    assert proto.request(port, "GET", "/v6/x", host="[::1]").status == 200
    assert_forbidden(proto.request(port, "GET", "/v6net/x", host="[::1]"))
    assert_forbidden(proto.request(port, "GET", "/v6deny/x", host="[::1]"))


def check(docs, tmp_path):
    from helpers import dump_docs
    path = tmp_path / "c.yaml"
    path.write_text(dump_docs(docs))
    out = subprocess.run([runtime_binary(), "--check", "--config", str(path)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return out.returncode, out.stdout


def test_config_errors_name_the_field(tmp_path):
    base = [gateway(free_port()), backend_doc("echo", [free_port()])]
    rc, out = check(base + [ip_api("a", {"allow": ["10.0.0.0/8", "10.0.0.1/8"],
                                         "deny": ["2001:db8::/129", "example.com"],
                                         "trustedProxies": 17})], tmp_path)
    assert rc != 0
    assert "spec.policies[0].config.allow[1]" in out and "did you mean 10.0.0.0/8" in out, out
    assert "spec.policies[0].config.deny[0]" in out and "0 to 128" in out, out
    assert "spec.policies[0].config.deny[1]" in out, out
    assert "spec.policies[0].config.trustedProxies" in out, out
    rc, out = check(base + [ip_api("a", {"trustedProxies": 1})], tmp_path)
    assert rc != 0 and "an allow or a deny list is required" in out, out
    rc, out = check(base + [ip_api("a", {"allow": ["10.0.0.0/8"], "alow": []})], tmp_path)
    assert rc != 0 and "spec.policies[0].config.alow" in out and "allow" in out, out
    rc, out = check(base + [ip_api("a", {"allow": ["10.0.0.0/8", "::1"], "deny": ["10.1.0.0/16"],
                                         "trustedProxies": 2})], tmp_path)
    assert rc == 0, out
