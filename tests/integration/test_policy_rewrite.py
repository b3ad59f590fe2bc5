"""The rewrite and redirect policies (docs/policies/rewrite.md,
redirect.md): the upstream sees the new path (from the operation's path
parameters, a new prefix, or a regex) with the query intact, and the new
Host; redirect answers with its status and Location. Over HTTP/1.1 and h2c
(`proto`)."""

import subprocess

from helpers import (api, assert_gateway_error, backend, dump_docs, free_port, gateway,
                     runtime_binary)


def start(backends, runtimes, proto, operations, **api_kw):
    b = backends("echo")
    port = free_port()
    runtimes([proto.gateway(port), backend("echo", [b.port]),
              api("petstore", "/petstore/v1", "echo", operations=operations, **api_kw)])
    return port, b


def rw(config):
    return [{"name": "rewrite", "config": config}]


def host_of(record):
    return [v for k, v in record["headers"] if k.lower() == "host"]


def test_rewrite_template(backends, runtimes, proto):
    port, b = start(backends, runtimes, proto, [
        {"name": "pet", "method": "GET", "path": "/pets/{id}/photos/{photo}",
         "policies": rw({"path": "/v2/animals/{id}/pictures/{photo}"})},
    ])
    r = proto.request(port, "GET", "/petstore/v1/pets/42/photos/p%20x?size=big&a=1")
    assert r.status == 200, r
    got = b.received()[-1]
    assert got["target"] == "/v2/animals/42/pictures/p%20x?size=big&a=1"


def test_rewrite_unknown_parameter_fails_closed(backends, runtimes, proto):
    port, b = start(backends, runtimes, proto, [
        {"name": "pet", "method": "GET", "path": "/pets/{id}", "policies": rw({"path": "/x/{nope}"})},
    ])
    err = assert_gateway_error(proto.request(port, "GET", "/petstore/v1/pets/1"), 500)
    assert err["code"] == "policy_error" and "{nope}" in err["message"]
    assert b.count() == 0


def test_rewrite_prefix_and_host(backends, runtimes, proto):
    port, b = start(backends, runtimes, proto, [
        {"name": "all", "method": "*", "path": "/", "pathType": "prefix"},
    ], policies=rw({"prefix": "/internal/pets/", "host": "pets.internal:8081"}))
    r = proto.request(port, "GET", "/petstore/v1/pets/7?q=1", host="api.example.com")
    assert r.status == 200, r
    got = b.received()[-1]
    assert got["target"] == "/internal/pets/pets/7?q=1"
    assert host_of(got) == ["pets.internal:8081"]
    r = proto.request(port, "GET", "/petstore/v1")
    assert b.received()[-1]["target"] == "/internal/pets"


def test_rewrite_regex(backends, runtimes, proto):
    port, b = start(backends, runtimes, proto, [
        {"name": "all", "method": "*", "path": "/", "pathType": "prefix"},
    ], policies=rw({"regex": r"^/petstore/v1/users/([0-9]+)/orders/([a-z]+)$",
                    "substitution": "/orders/$2/by-user/$1"}))
    assert proto.request(port, "GET", "/petstore/v1/users/12/orders/open?x=y").status == 200
    assert b.received()[-1]["target"] == "/orders/open/by-user/12?x=y"
    # Not matched: the upstream gets the path it would get without the
    # policy (stripBasePath, on by default, applies).
    assert proto.request(port, "GET", "/petstore/v1/other").status == 200
    assert b.received()[-1]["target"] == "/other"


def test_redirect(backends, runtimes, proto):
    port, b = start(backends, runtimes, proto, [
        {"name": "old", "method": "GET", "path": "/old", "pathType": "prefix",
         "policies": [{"name": "redirect", "config": {
             "status": 308, "location": "https://new.example.com${path}${query}"}}]},
        {"name": "moved", "method": "GET", "path": "/moved", "policies": [
            {"name": "redirect", "config": {"location": "https://${host}/elsewhere"}}]},
    ])
    r = proto.request(port, "GET", "/petstore/v1/old/a/b?x=1&y=2")
    assert r.status == 308, r
    assert r.header("Location") == "https://new.example.com/petstore/v1/old/a/b?x=1&y=2"
    assert r.body == b""
    r = proto.request(port, "GET", "/petstore/v1/old")
    assert r.header("Location") == "https://new.example.com/petstore/v1/old"
    r = proto.request(port, "GET", "/petstore/v1/moved", host="shop.example.com")
    assert r.status == 302, r
    assert r.header("Location") == "https://shop.example.com/elsewhere"
    assert b.count() == 0


def test_config_errors(tmp_path):
    for pol, field, words in [
        ({"name": "rewrite", "config": {"path": "/a", "prefix": "/b"}}, "config", "one of them"),
        ({"name": "rewrite", "config": {"regex": "^/(a"}}, "config.regex", "compile"),
        ({"name": "rewrite", "config": {"regex": "^/a", "substitution": "b"}},
         "config.substitution", "starting with '/'"),
        ({"name": "rewrite", "config": {}}, "config", "nothing to rewrite"),
        ({"name": "redirect", "config": {"location": "/x", "status": 200}}, "config.status", "308"),
        ({"name": "redirect", "config": {"location": "/${uri}"}}, "config.location",
         "unknown variable"),
    ]:
        f = tmp_path / "c.yaml"
        f.write_text(dump_docs([gateway(free_port()), backend("echo", [1]),
                                api("t", "/t", "echo", policies=[pol])]))
        p = subprocess.run([runtime_binary(), "--check", "--config", str(f)],
                           capture_output=True, text=True, timeout=30)
        out = p.stdout + p.stderr
        assert p.returncode != 0, (pol, out)
        assert field in out and words in out, (pol, out)
