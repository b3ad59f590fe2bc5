"""/config_dump never shows a credential.

The runtime's admin listener has no authentication by default, and
/config_dump shows the whole compiled snapshot: every credential in it
(policy secrets, Redis passwords, set Authorization headers, inline JWKs'
private parts, Consumers' password and API key hashes, traffic log sink
passwords, private keys) must read "[redacted]", while the rest of the
config stays readable. Each secret below is a unique marker string that
must appear nowhere in the document.

Run: SLUICE_BUILD=build /usr/bin/python3 -m pytest tests/integration/test_config_dump_secrets.py
"""

import base64
import hashlib
import json

from helpers import API_VERSION, api, backend, free_port, gateway

JWT_SECRET = "jwt-shared-secret-marker-0123456789abcdef"
OCT_KEY = base64.urlsafe_b64encode(b"oct-key-marker-0123456789abcdef0123").rstrip(b"=").decode()
REDIS_PASSWORD = "redis-password-marker"
UPSTREAM_TOKEN = "Bearer upstream-token-marker"
SINK_PASSWORD = "sink-password-marker"
KEY_HASH = "sha256:" + hashlib.sha256(b"api-key-marker").hexdigest()
# crypt(3) SHA-512 of "pw", made with `openssl passwd -6 -salt saltsalt pw`.
PASSWORD_HASH = ("$6$saltsalt$pauPrmdmG4BTE9h2HPmywiw152IFch6BJCEsaY6D.PLTfpV8sqvXwWdyfsgVgozkYH9B"
                 "80bAip/08R2BPH2xk/")


def test_config_dump_hides_every_credential(runtimes, tmp_path):
    port = free_port()
    gw = gateway(port)
    gw["spec"]["trafficLog"] = {"sinks": [{
        "name": "collector", "type": "http", "url": "http://127.0.0.1:9/",
        "auth": {"username": "logger", "password": SINK_PASSWORD}}]}
    a = api("t", "/t", "b", policies=[
        {"name": "jwt", "config": {
            "secret": JWT_SECRET, "algorithms": ["HS256"],
            "jwks": {"keys": [{"kty": "oct", "kid": "k1", "use": "sig", "alg": "HS256",
                               "k": OCT_KEY}]}}},
        {"name": "rate-limit", "config": {
            "mode": "fleet", "failOpen": True,
            "redis": {"address": "127.0.0.1:9", "password": REDIS_PASSWORD},
            "limits": [{"requests": 10, "period": "1s", "by": "ip"}]}},
        {"name": "headers", "config": {"request": {"set": {
            "Authorization": UPSTREAM_TOKEN, "X-Upstream-Token": "t-marker",
            "X-Tenant": "tenant-visible"}}}},
    ])
    consumer = {"apiVersion": API_VERSION, "kind": "Consumer", "metadata": {"name": "c"},
                "spec": {"credentials": {
                    "apiKeys": [{"name": "laptop", "keyHash": KEY_HASH}],
                    "basicAuth": [{"username": "ann", "passwordHash": PASSWORD_HASH}]}}}
    rt = runtimes([gw, backend("b", [free_port()]), a, consumer])
    status, _, body = rt.admin_get("/config_dump")
    assert status == 200
    text = body.decode()
    for marker in (JWT_SECRET, OCT_KEY, REDIS_PASSWORD, "upstream-token-marker", "t-marker",
                   SINK_PASSWORD, KEY_HASH[7:], PASSWORD_HASH,
                   base64.b64encode(hashlib.sha256(b"api-key-marker").digest()).decode()):
        assert marker not in text, marker
    dump = json.loads(text)
    chain = dump["snapshot"]["route_tables"][0]["routes"][0]["policies"]
    configs = {p["name"]: json.loads(p["config_json"]) for p in chain}
    # The credentials read [redacted]; everything else is still there.
    assert configs["jwt"]["secret"] == "[redacted]"
    assert configs["jwt"]["algorithms"] == ["HS256"]
    assert configs["jwt"]["jwks"]["keys"][0] == {"kty": "oct", "kid": "k1", "use": "sig",
                                                 "alg": "HS256", "k": "[redacted]"}
    assert configs["rate-limit"]["redis"] == {"address": "127.0.0.1:9", "password": "[redacted]"}
    assert configs["headers"]["request"]["set"] == {
        "Authorization": "[redacted]", "X-Upstream-Token": "[redacted]",
        "X-Tenant": "tenant-visible"}
    cons = dump["snapshot"]["consumers"][0]
    assert cons["api_keys"] == [{"name": "laptop", "sha256": "[redacted]"}]
    assert cons["basic_users"] == [{"username": "ann", "password_hash": "[redacted]"}]
    sink = dump["snapshot"]["settings"]["traffic_log"]["sinks"][0]
    assert sink["username"] == "logger" and sink["password"] == "[redacted]"
