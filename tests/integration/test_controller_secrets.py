"""Certificates and Consumers through the controller: the config stream
carries them as their own resource types (secrets before the listeners and
Backends that name them, Consumers before the routes whose policies match
them), so an https listener and an api-key policy work through the
controller exactly as from a file. Before these types existed a managed
runtime got neither: its https listener had no certificate and every API
key was unknown."""

import hashlib
import json
import os
import socket
import ssl

from controller_env import TYPE_ORDER
from helpers import API_VERSION, api, backend, free_port, wait_until
from test_controller import env  # noqa: F401  (env is a fixture)
from test_tls import certificate, make_ca, make_cert

KEY = "k-managed-1"


def https_get(port, path, ca, headers=(), server_name="a.example"):
    ctx = ssl.create_default_context(cafile=ca)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname=server_name) as s:
            req = "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n" % (path, server_name)
            req += "".join("%s: %s\r\n" % h for h in headers) + "\r\n"
            s.sendall(req.encode())
            cert = s.getpeercert()
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    return int(data.split(b" ", 2)[1]), cert


def test_https_listener_and_api_key_through_the_controller(env, tmp_path):  # noqa: F811
    d = str(tmp_path / "pki")
    os.makedirs(d)
    make_ca(d)
    make_cert(d, "a", "a.example")
    ctl = env.controller()
    echo = env.backend("echo")
    port = free_port()
    gw = {"apiVersion": API_VERSION, "kind": "Gateway", "metadata": {"name": "default"},
          "spec": {"listeners": [{"name": "https", "port": port, "protocol": "https",
                                  "address": "127.0.0.1",
                                  "tls": {"certificateRefs": [{"name": "a-example"}]}}]}}
    alice = {"apiVersion": API_VERSION, "kind": "Consumer", "metadata": {"name": "alice"},
             "spec": {"credentials": {"apiKeys": [
                 {"name": "laptop",
                  "keyHash": "sha256:" + hashlib.sha256(KEY.encode()).hexdigest()}]}}}
    ctl.apply([gw, certificate(d, "a-example", "a"), backend("echo", [echo.port]), alice,
               api("petstore", "/petstore/v1", "echo",
                   policies=[{"name": "api-key", "config": {"header": "X-Api-Key"}}])])
    rt = env.runtime("rt-secrets")
    ca = os.path.join(d, "ca.crt")

    def serving():
        try:
            return https_get(port, "/petstore/v1/pets", ca)[0] == 401
        except OSError:
            return False
    wait_until(serving, 15, what="the managed runtime to serve https with the api-key policy")
    status, cert = https_get(port, "/petstore/v1/pets", ca, [("X-Api-Key", KEY)])
    assert status == 200
    assert dict(x[0] for x in cert["subject"])["commonName"] == "a.example"
    assert echo.count() == 1
    # Every type was pushed and acknowledged, secrets and consumers included.
    types = ctl.runtimes()["rt-secrets"]["types"]
    assert set(TYPE_ORDER) <= set(types), types
    assert all(types[t]["acked_version"] for t in TYPE_ORDER), types
    # The private key travelled, and is still never shown.
    status, _, body = rt.admin_get("/config_dump")
    assert status == 200
    dump = body.decode()
    assert "PRIVATE KEY" not in dump and "[redacted]" in dump
    assert json.loads(dump)
