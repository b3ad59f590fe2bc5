"""The basic-auth policy (policies/basic-auth/basic_auth.c, docs/policies/
basic-auth.md): Authorization: Basic checked against Consumers' crypt(3)
hashes, over HTTP/1.1 and HTTP/2; the per-worker cache of successful
verifications (seen through the runtime's debug log, not timing); a rate
limit before authentication that bounds wrong guesses; the REST API's
refusal of an unsalted passwordHash."""

import base64
import ctypes
import json
import re
import shutil
import subprocess

import pytest

from controller_env import Controller
from helpers import API_VERSION, api, assert_gateway_error, backend as backend_doc, free_port

_libcrypt = ctypes.CDLL("libcrypt.so.1")
_libcrypt.crypt.restype = ctypes.c_char_p
_libcrypt.crypt_gensalt.restype = ctypes.c_char_p


def crypt_hash(password, prefix, count=0, setting=None):
    """A crypt(3) hash made with the system's libcrypt (as mkpasswd does)."""
    if setting is None:
        setting = _libcrypt.crypt_gensalt(prefix.encode(), ctypes.c_ulong(count), None, 0)
        assert setting, "libcrypt cannot make a %s setting" % prefix
    else:
        setting = setting.encode()
    out = _libcrypt.crypt(password.encode(), setting)
    assert out and not out.startswith(b"*"), (prefix, out)
    return out.decode()


def openssl_sha512(password):
    return subprocess.run(["openssl", "passwd", "-6", password], check=True,
                          stdout=subprocess.PIPE, text=True).stdout.strip()


def mkpasswd(password, method):
    """mkpasswd (the whois package) when installed, else libcrypt directly."""
    if shutil.which("mkpasswd"):
        return subprocess.run(["mkpasswd", "-m", method, password], check=True,
                              stdout=subprocess.PIPE, text=True).stdout.strip()
    return crypt_hash(password, {"yescrypt": "$y$", "bcrypt": "$2b$"}[method])


def consumer(name, users, group=None):
    spec = {"credentials": {"basicAuth": [{"username": u, "passwordHash": h}
                                          for u, h in users]}}
    if group:
        spec["group"] = group
    return {"apiVersion": API_VERSION, "kind": "Consumer", "metadata": {"name": name},
            "spec": spec}


def basic(user, password):
    return "Basic " + base64.b64encode(("%s:%s" % (user, password)).encode()).decode()


def config(proto, port, backend_port, consumers, policy_config=None):
    policies = [{"name": "basic-auth", "config": policy_config or {}},
                {"name": "headers",
                 "config": {"request": {"set": {"X-Consumer": "${consumer}",
                                                "X-Group": "${consumer_group}"}}}}]
    return [proto.gateway(port), backend_doc("echo", [backend_port])] + consumers + [
        api("t", "/t", "echo", policies=policies)]


def header_of(record, name):
    vals = [v for k, v in record["headers"] if k.lower() == name.lower()]
    return vals[-1] if vals else None


def assert_unauthorized(resp, realm="sluice"):
    err = assert_gateway_error(resp, 401)
    assert err["code"] == "unauthorized", err
    assert resp.header("WWW-Authenticate") == 'Basic realm="%s", charset="UTF-8"' % realm
    return err


@pytest.fixture(scope="module")
def hashes():
    return {"alice": openssl_sha512("s3cret"),
            "bob": mkpasswd("hunter2", "yescrypt"),
            "carol": mkpasswd("pa:ss wörd", "bcrypt")}


def test_good_wrong_and_unknown(proto, backends, runtimes, hashes):
    assert hashes["alice"].startswith("$6$")
    assert hashes["bob"].startswith("$y$")
    assert hashes["carol"].startswith("$2b$")
    b = backends("echo")
    port = free_port()
    runtimes(config(proto, port, b.port, [
        consumer("alice", [("alice", hashes["alice"])], group="gold"),
        consumer("bob", [("bob", hashes["bob"]), ("carol", hashes["carol"])])]))

    for user, pw, name, group in (("alice", "s3cret", "alice", "gold"),
                                  ("bob", "hunter2", "bob", ""),
                                  ("carol", "pa:ss wörd", "bob", "")):
        b.clear()
        resp = proto.request(port, "GET", "/t/x", headers=[("Authorization", basic(user, pw))])
        assert resp.status == 200, (user, resp)
        rec = b.received()[-1]
        # Known to the later headers policy; the credentials do not go upstream.
        assert header_of(rec, "X-Consumer").split("/")[-1] == name, rec["headers"]
        assert (header_of(rec, "X-Group") or "") == group
        assert header_of(rec, "Authorization") is None, rec["headers"]

    b.clear()
    for user, pw in (("alice", "s3cret!"), ("alice", ""), ("alice", "S3CRET"),
                     ("bob", "s3cret"), ("mallory", "s3cret"), ("Alice", "s3cret")):
        resp = proto.request(port, "GET", "/t/x", headers=[("Authorization", basic(user, pw))])
        err = assert_unauthorized(resp)
        assert err["message"] == "the user name or password is not valid", err
    assert b.count() == 0


def test_malformed_headers_are_401(proto, backends, runtimes, hashes):
    b = backends("echo")
    port = free_port()
    rt = runtimes(config(proto, port, b.port, [consumer("alice", [("alice", hashes["alice"])])]))
    good = basic("alice", "s3cret")
    cases = [
        [],                                                    # none
        [("Authorization", "")],                               # empty
        [("Authorization", "Basic")],                          # no credentials
        [("Authorization", "Basic ")],
        [("Authorization", "Basic " + base64.b64encode(b"alice").decode())],   # no colon
        [("Authorization", "Basic " + base64.b64encode(b":s3cret").decode())],  # no user
        [("Authorization", "Basic !!not-base64!!")],           # bad base64
        [("Authorization", "Basic YWxpY2U6czNjcmV0=")],        # bad padding
        [("Authorization", "Basic " + base64.b64encode(b"alice:s3\x00cret").decode())],
        [("Authorization", "Basic " + "QUFB" * 2000)],         # over the bound
        [("Authorization", "Bearer abc.def.ghi")],             # another scheme
        [("Authorization", good), ("Authorization", good)],    # two
    ]
    for hdrs in cases:
        resp = proto.request(port, "GET", "/t/x", headers=hdrs)
        assert_unauthorized(resp)
    assert b.count() == 0
    # Still serving, and the scheme is case-insensitive.
    resp = proto.request(port, "GET", "/t/x", headers=[("Authorization", "basic " + good[6:])])
    assert resp.status == 200
    assert rt.alive()


def test_forward_and_realm(proto, backends, runtimes, hashes):
    b = backends("echo")
    port = free_port()
    runtimes(config(proto, port, b.port, [consumer("alice", [("alice", hashes["alice"])])],
                    {"forward": True, "realm": "pets api"}))
    good = basic("alice", "s3cret")
    resp = proto.request(port, "GET", "/t/x", headers=[("Authorization", good)])
    assert resp.status == 200
    assert header_of(b.received()[-1], "Authorization") == good
    assert_unauthorized(proto.request(port, "GET", "/t/x"), realm="pets api")


def crypt_lines(rt):
    return re.findall(r"basic-auth \S+: crypt \S+ took [0-9.]+ ms \((match|no match)\)", rt.log())


def cache_lines(rt):
    return re.findall(r"basic-auth \S+: verified from the cache", rt.log())


def test_cache_spares_crypt(proto, backends, runtimes):
    # A SHA-crypt hash with many rounds: crypt takes tens of milliseconds
    # (the debug line gives the time); the cache must answer the repeats.
    slow = crypt_hash("s3cret", None, setting="$6$rounds=200000$0123456789abcdef$")
    b = backends("echo")
    port = free_port()
    rt = runtimes(config(proto, port, b.port, [consumer("alice", [("alice", slow)])]),
                  workers=1, log_level="debug")
    good = basic("alice", "s3cret")
    for _ in range(4):
        assert proto.request(port, "GET", "/t/x", headers=[("Authorization", good)]).status == 200
    assert crypt_lines(rt) == ["match"], rt.log()[-3000:]
    assert len(cache_lines(rt)) == 3
    # Failures are not cached: each wrong guess pays crypt again.
    for _ in range(2):
        assert_unauthorized(proto.request(port, "GET", "/t/x",
                                          headers=[("Authorization", basic("alice", "nope"))]))
    assert crypt_lines(rt) == ["match", "no match", "no match"]
    assert len(cache_lines(rt)) == 3


def test_cache_off(backends, runtimes, hashes):
    from clients import Proto
    proto = Proto("http1")
    b = backends("echo")
    port = free_port()
    rt = runtimes(config(proto, port, b.port, [consumer("alice", [("alice", hashes["alice"])])],
                         {"cacheSeconds": 0}), workers=1, log_level="debug")
    for _ in range(3):
        assert proto.request(port, "GET", "/t/x",
                             headers=[("Authorization", basic("alice", "s3cret"))]).status == 200
    assert crypt_lines(rt) == ["match"] * 3
    assert cache_lines(rt) == []


@pytest.mark.parametrize("before", [True, False], ids=["before-authn", "after-authn"])
def test_rate_limit_before_authentication_bounds_wrong_passwords(proto, backends, runtimes,
                                                                 hashes, before):
    """rate-limit's beforeAuthentication: true runs it in the access phase,
    so requests basic-auth refuses are counted, and a limited guess costs
    no crypt. Without it (the default), failed logins never reach the
    limit."""
    b = backends("echo")
    port = free_port()
    docs = config(proto, port, b.port, [consumer("alice", [("alice", hashes["alice"])])])
    # Written after basic-auth: the phase, not the order, decides.
    docs[-1]["spec"]["policies"].append({"name": "rate-limit", "config": {
        "limits": [{"requests": 3, "period": "1m", "by": "ip"}],
        "beforeAuthentication": before}})
    rt = runtimes(docs, workers=1, log_level="debug")
    wrong = [("Authorization", basic("alice", "guess"))]
    statuses = [proto.request(port, "GET", "/t/x", headers=wrong).status for _ in range(6)]
    good = proto.request(port, "GET", "/t/x", headers=[("Authorization", basic("alice", "s3cret"))])
    if before:
        assert statuses == [401, 401, 401, 429, 429, 429], statuses
        err = assert_gateway_error(proto.request(port, "GET", "/t/x", headers=wrong), 429)
        assert err["code"] == "rate_limited", err
        # The IP's budget is spent, whoever it is: the right password waits too.
        assert good.status == 429 and int(good.header("Retry-After")) >= 1, good
        # basic-auth never ran for the limited requests.
        assert crypt_lines(rt) == ["no match"] * 3, rt.log()[-3000:]
    else:
        assert statuses == [401] * 6, statuses
        assert good.status == 200, good
        assert crypt_lines(rt) == ["no match"] * 6 + ["match"]
    assert b.count() == (0 if before else 1)


def test_bad_config_is_refused(runtimes, tmp_path, hashes):
    """The runtime refuses a bad basic-auth config with the field path."""
    port = free_port()
    from helpers import gateway
    docs = [gateway(port), backend_doc("echo", [free_port()]),
            api("t", "/t", "echo", policies=[{"name": "basic-auth",
                                              "config": {"realm": 'a"b', "cacheSecond": 5}}])]
    rt = runtimes(docs, start=False)
    from helpers import runtime_binary
    out = subprocess.run([runtime_binary(), "--check", "--config", rt.config_path],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert out.returncode != 0
    assert "spec.policies[0].config.realm" in out.stdout, out.stdout
    assert "spec.policies[0].config.cacheSecond" in out.stdout and "cacheSeconds" in out.stdout


def test_rest_refuses_unsalted_password_hash(tmp_path):
    ctl = Controller(tmp_path / "controller").start()
    try:
        doc = consumer("alice", [("alice", "sha256:" + "ab" * 32)])
        status, _, body = ctl.rest("PUT", "/api/v1/consumers/alice", doc)
        assert status == 400, body
        text = json.dumps(body)
        assert "spec.credentials.basicAuth[0].passwordHash" in text, text
        assert "openssl passwd -6" in text and "mkpasswd -m yescrypt" in text, text
        # and a good hash is accepted
        doc = consumer("alice", [("alice", openssl_sha512("s3cret"))])
        status, _, body = ctl.rest("PUT", "/api/v1/consumers/alice", doc)
        assert status in (200, 201), body
        # a bad policy config on an Api is a 400 with the field path too
        bad = api("t", "/t", "echo", policies=[{"name": "basic-auth",
                                                "config": {"cacheSeconds": -1}}])
        status, _, body = ctl.rest("PUT", "/api/v1/apis/t", bad)
        assert status == 400, body
        assert "spec.policies[0].config.cacheSeconds" in json.dumps(body), body
    finally:
        ctl.stop()
        problems = ctl.problems()
    assert not problems, problems
