"""The jwt policy (policies/jwt/, docs/policies/jwt.md): bearer tokens
signed with every supported algorithm, keys made here with
python3-cryptography and tokens built by hand (base64url), claims, the
RFC 6750 challenges, a remote JWKS on a loopback http.server (rotation,
refresh on an unknown kid, fail closed while it is down), a JWKS over
https with CAs made here by openssl (verification, SNI, the host name, a
wrong CA), claims to upstream headers, Consumers, HTTP/2 and gRPC
statuses."""

import base64
import hashlib
import hmac
import http.server
import json
import os
import re
import ssl
import subprocess
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from helpers import api, backend, dump_docs, free_port, gateway, request, wait_until  # noqa: E402

crypto = pytest.importorskip("cryptography")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature  # noqa: E402

API_VERSION = "gateway.sluice.dev/v1alpha1"
SECRET = "0123456789abcdef0123456789abcdef-shared"


def b64u(data):
    if isinstance(data, str):
        data = data.encode()
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def uint_b64u(n, size=None):
    size = size or (n.bit_length() + 7) // 8
    return b64u(n.to_bytes(size, "big"))


# --- keys -----------------------------------------------------------------

class Key:
    def __init__(self, kind, kid):
        self.kind, self.kid = kind, kid
        if kind == "RSA":
            self.priv = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        elif kind in ("P-256", "P-384"):
            self.priv = ec.generate_private_key(ec.SECP256R1() if kind == "P-256" else ec.SECP384R1())
        elif kind == "Ed25519":
            self.priv = ed25519.Ed25519PrivateKey.generate()

    def jwk(self, **extra):
        pub = self.priv.public_key()
        if self.kind == "RSA":
            nums = pub.public_numbers()
            d = {"kty": "RSA", "n": uint_b64u(nums.n), "e": uint_b64u(nums.e)}
        elif self.kind in ("P-256", "P-384"):
            size = 32 if self.kind == "P-256" else 48
            nums = pub.public_numbers()
            d = {"kty": "EC", "crv": self.kind, "x": uint_b64u(nums.x, size),
                 "y": uint_b64u(nums.y, size)}
        else:
            raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            d = {"kty": "OKP", "crv": "Ed25519", "x": b64u(raw)}
        if self.kid:
            d["kid"] = self.kid
        d.update(extra)
        return d

    def sign(self, alg, data):
        h = {"256": hashes.SHA256(), "384": hashes.SHA384(), "512": hashes.SHA512()}.get(alg[2:])
        if alg.startswith("RS"):
            return self.priv.sign(data, padding.PKCS1v15(), h)
        if alg.startswith("PS"):
            return self.priv.sign(data, padding.PSS(mgf=padding.MGF1(h), salt_length=h.digest_size), h)
        if alg.startswith("ES"):
            der = self.priv.sign(data, ec.ECDSA(h))
            r, s = decode_dss_signature(der)
            size = 32 if alg == "ES256" else 48
            return r.to_bytes(size, "big") + s.to_bytes(size, "big")
        if alg == "EdDSA":
            return self.priv.sign(data)
        raise ValueError(alg)


@pytest.fixture(scope="module")
def keys():
    return {"rsa": Key("RSA", "rsa1"), "p256": Key("P-256", "ec1"), "p384": Key("P-384", "ec384"),
            "ed": Key("Ed25519", "ed1"), "rsa2": Key("RSA", "rsa2"), "other": Key("RSA", "rsa1")}


def token(alg, claims=None, key=None, secret=SECRET, kid="default", header=None, now=None):
    now = int(time.time()) if now is None else now
    payload = {"iss": "https://idp.example", "sub": "alice", "aud": "pets", "iat": now,
               "exp": now + 600}
    payload.update(claims or {})
    payload = {k: v for k, v in payload.items() if v is not None}
    h = {"alg": alg, "typ": "JWT"}
    if kid == "default":
        kid = key.kid if key else None
    if kid:
        h["kid"] = kid
    h.update(header or {})
    signing_input = (b64u(json.dumps(h)) + "." + b64u(json.dumps(payload))).encode()
    if alg.startswith("HS"):
        digest = {"HS256": hashlib.sha256, "HS384": hashlib.sha384, "HS512": hashlib.sha512}[alg]
        sig = hmac.new(secret.encode(), signing_input, digest).digest()
    elif alg == "none":
        sig = b""
    else:
        sig = key.sign(alg, signing_input)
    return signing_input.decode() + "." + b64u(sig)


def inline_config(keys, **extra):
    cfg = {"jwks": {"keys": [keys[k].jwk() for k in ("rsa", "p256", "p384", "ed")]},
           "secret": SECRET, "issuers": ["https://idp.example"], "audiences": ["pets", "pets2"]}
    cfg.update(extra)
    return {k: v for k, v in cfg.items() if v is not None}


def config(port, backend_port, policy_cfg, proto=None, consumers=(), operations=None):
    docs = [(proto.gateway if proto else gateway)(port), backend("echo", [backend_port]),
            api("t", "/t", "echo", policies=[{"name": "jwt", "config": policy_cfg}],
                **({"operations": operations} if operations else {}))]
    for name, subject in consumers:
        docs.append({"apiVersion": API_VERSION, "kind": "Consumer", "metadata": {"name": name},
                     "spec": {"group": "gold", "credentials": {"jwt": [subject]}}})
    return docs


@pytest.fixture
def jwtenv(backends, runtimes):
    def make(policy_cfg, proto=None, **kw):
        b = backends("echo")
        port = free_port()
        rt = runtimes(config(port, b.port, policy_cfg, proto, **kw))
        return rt, port, b
    return make


def get(port, tok=None, proto=None, headers=None, target="/t/pets"):
    h = dict(headers or {})
    if tok is not None:
        h["Authorization"] = "Bearer " + tok
    if proto:
        return proto.request(port, "GET", target, headers=h)
    return request(port, "GET", target, headers=h)


def header_of(rec, name):
    return [v for k, v in rec["headers"] if k.lower() == name.lower()]


def challenge(r):
    return r.header("WWW-Authenticate") or ""


# --- signatures -------------------------------------------------------------

ALGS = [("RS256", "rsa"), ("RS384", "rsa"), ("RS512", "rsa"), ("PS256", "rsa"), ("PS384", "rsa"),
        ("PS512", "rsa"), ("ES256", "p256"), ("ES384", "p384"), ("EdDSA", "ed"), ("HS256", None),
        ("HS384", None), ("HS512", None)]


def test_every_algorithm_verifies_and_a_wrong_signature_does_not(jwtenv, keys, proto):
    rt, port, b = jwtenv(inline_config(keys), proto=proto)
    for alg, k in ALGS:
        tok = token(alg, key=keys[k] if k else None)
        r = get(port, tok, proto)
        assert r.status == 200, (alg, r)
        # One bit of the signature flipped.
        head, payload, sig = tok.split(".")
        raw = bytearray(base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4)))
        raw[len(raw) // 2] ^= 1
        r = get(port, head + "." + payload + "." + b64u(bytes(raw)), proto)
        assert r.status == 401, (alg, r)
        assert 'error="invalid_token"' in challenge(r)
        # The payload changed under the same signature.
        forged = b64u(json.dumps({"iss": "https://idp.example", "sub": "root", "aud": "pets"}))
        assert get(port, head + "." + forged + "." + sig, proto).status == 401, alg
    assert b.count() == len(ALGS)


def test_missing_and_malformed_tokens_get_rfc6750_challenges(jwtenv, keys, proto):
    rt, port, b = jwtenv(inline_config(keys), proto=proto)
    r = get(port, None, proto)
    assert r.status == 401 and challenge(r) == 'Bearer realm="sluice"', r
    assert r.json()["error"]["code"] == "unauthorized"
    for bad in ("x", "a.b", "a.b.c.d", "!!!.e30.x", token("RS256", key=keys["rsa"]) + "=="):
        r = get(port, bad, proto)
        assert r.status == 401, (bad, r)
        assert challenge(r).startswith('Bearer realm="sluice", error="invalid_token", '
                                       'error_description="'), r
    r = get(port, None, proto, headers={"Authorization": "Basic dXNlcjpwYXNz"})
    assert r.status == 401 and 'error="invalid_token"' in challenge(r)
    assert b.count() == 0


def test_alg_none_and_algorithm_confusion_are_refused(jwtenv, keys):
    rt, port, b = jwtenv(inline_config(keys, secret=None, jwks={"keys": [keys["rsa"].jwk()]}))
    assert get(port, token("RS256", key=keys["rsa"])).status == 200
    assert get(port, token("none", kid="rsa1")).status == 401
    assert get(port, token("none", kid=None)).status == 401
    # HS256 with the RSA public key's bytes as the secret: the classic confusion.
    pem = keys["rsa"].priv.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    der = keys["rsa"].priv.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    for secret in (pem, der.hex(), json.dumps(keys["rsa"].jwk())):
        r = get(port, token("HS256", secret=secret, kid="rsa1"))
        assert r.status == 401 and "algorithm" in r.json()["error"]["message"], r
    # An ES256 token under the RSA key's kid.
    r = get(port, token("ES256", key=keys["p256"], kid="rsa1"))
    assert r.status == 401
    # crit headers are refused even with a good signature.
    assert get(port, token("RS256", key=keys["rsa"], header={"crit": ["exp"]})).status == 401
    assert b.count() == 1


def test_algorithms_allow_list(jwtenv, keys):
    rt, port, b = jwtenv(inline_config(keys, algorithms=["ES256"]))
    assert get(port, token("ES256", key=keys["p256"])).status == 200
    assert get(port, token("RS256", key=keys["rsa"])).status == 401
    assert get(port, token("HS256")).status == 401


def test_unknown_kid_and_a_key_of_the_same_kid_but_another_value(jwtenv, keys):
    rt, port, b = jwtenv(inline_config(keys))
    r = get(port, token("RS256", key=keys["rsa2"]))
    assert r.status == 401 and "unknown key" in challenge(r), r
    # Signed by another key that claims kid rsa1.
    assert get(port, token("RS256", key=keys["other"])).status == 401
    # No kid at all: every key of the algorithm's family is tried.
    assert get(port, token("ES256", key=keys["p256"], kid=None)).status == 200


# --- claims -----------------------------------------------------------------

def test_time_claims_with_leeway(jwtenv, keys):
    rt, port, b = jwtenv(inline_config(keys, leewaySeconds=30))
    now = int(time.time())
    ok = lambda claims: get(port, token("ES256", claims, key=keys["p256"])).status  # noqa: E731
    assert ok({"exp": now - 10}) == 200            # inside the leeway
    assert ok({"exp": now - 120}) == 401
    assert ok({"nbf": now + 10}) == 200
    assert ok({"nbf": now + 120}) == 401
    assert ok({"iat": now + 120}) == 401
    assert ok({"exp": "tomorrow"}) == 401
    r = get(port, token("ES256", {"exp": now - 120}, key=keys["p256"]))
    assert "expired" in challenge(r)
    assert ok({"exp": None}) == 200                # exp is not required unless asked


def test_required_claims_issuer_audience(jwtenv, keys):
    rt, port, b = jwtenv(inline_config(keys, requiredClaims=["exp", "tenant"]))
    t = lambda claims: get(port, token("EdDSA", claims, key=keys["ed"])).status  # noqa: E731
    assert t({"tenant": "a"}) == 200
    assert t({}) == 401
    assert t({"tenant": "a", "exp": None}) == 401
    assert t({"tenant": "a", "iss": "https://evil.example"}) == 401
    assert t({"tenant": "a", "iss": None}) == 401
    assert t({"tenant": "a", "aud": ["other", "pets2"]}) == 200
    assert t({"tenant": "a", "aud": ["other"]}) == 401
    assert t({"tenant": "a", "aud": None}) == 401


def test_missing_scopes_are_403_insufficient_scope(jwtenv, keys, proto):
    rt, port, b = jwtenv(inline_config(keys, requiredScopes=["pets:read", "pets:write"]),
                         proto=proto)
    t = lambda claims: get(port, token("RS256", claims, key=keys["rsa"]), proto)  # noqa: E731
    assert t({"scope": "openid pets:write pets:read"}).status == 200
    assert t({"scp": ["pets:read", "pets:write"]}).status == 200
    r = t({"scope": "pets:read"})
    assert r.status == 403, r
    assert challenge(r) == ('Bearer realm="sluice", error="insufficient_scope", '
                            'scope="pets:read pets:write"'), r
    assert r.json()["error"]["code"] == "forbidden"
    assert t({}).status == 403
    assert b.count() == 2


# --- claims to headers, forwarding, consumers --------------------------------

def test_claims_to_headers_replace_forged_ones_and_forward_token(jwtenv, keys, proto):
    cfg = inline_config(keys, claimsToHeaders={"sub": "X-User", "org.id": "X-Org",
                                               "admin": "X-Admin", "n": "X-N",
                                               "missing": "X-Missing", "obj": "X-Obj",
                                               "evil": "X-Evil"})
    rt, port, b = jwtenv(cfg, proto=proto)
    claims = {"org": {"id": 42}, "admin": False, "n": 1.5, "obj": {"a": 1}, "evil": "a\r\nX-I: 1"}
    tok = token("ES384", claims, key=keys["p384"])
    forged = {"X-User": "root", "X-Org": "1", "X-Missing": "forged", "X-Obj": "x", "X-Evil": "y"}
    for attempt in range(2):  # the second comes from the worker's cache
        b.clear()
        r = get(port, tok, proto, headers=forged)
        assert r.status == 200, r
        rec = b.received()[-1]
        assert header_of(rec, "X-User") == ["alice"]
        assert header_of(rec, "X-Org") == ["42"]
        assert header_of(rec, "X-Admin") == ["false"]
        assert header_of(rec, "X-N") == ["1.5"]
        assert header_of(rec, "X-Missing") == [] and header_of(rec, "X-Obj") == []
        assert header_of(rec, "X-Evil") == [] and header_of(rec, "X-I") == []
        assert header_of(rec, "Authorization") == ["Bearer " + tok]


def test_headers_policy_uses_claims_and_path_parameters(backends, runtimes, keys, proto):
    """headers' ${jwt.<claim>} and ${path.<param>} (docs/policies/headers.md):
    the claims of the token jwt verified (also from its per-worker cache)
    and the operation's path parameters, on the request and the response."""
    b = backends("echo")
    port = free_port()
    ops = [{"method": "GET", "path": "/pets/{id}"},
           {"method": "GET", "path": "/pets/{id}/photos/{photo}",
            "policies": [{"name": "headers", "config": {"request": {"set": {
                "X-Photo": "${path.id}:${path.photo}", "X-Sub": "${jwt.sub}"}}}}]}]
    docs = config(port, b.port, inline_config(keys), proto, operations=ops)
    docs[2]["spec"]["policies"].append({"name": "headers", "config": {
        "request": {"set": {"X-Tenant": "${jwt.tenant}", "X-Org": "org-${jwt.org.id}",
                            "X-Pet": "${path.id}", "X-Admin": "${jwt.admin}"}},
        "response": {"set": {"X-Served-For": "${jwt.sub}/${path.id}"}}}})
    runtimes(docs)
    tok = token("RS256", {"tenant": "acme", "org": {"id": 42}, "admin": True}, key=keys["rsa"])
    forged = {"X-Tenant": "evil", "X-Pet": "1"}
    for attempt in range(2):  # the second from the worker's cache of verified tokens
        b.clear()
        r = get(port, tok, proto, headers=forged, target="/t/pets/7")
        assert r.status == 200, r
        rec = b.received()[-1]
        assert header_of(rec, "X-Tenant") == ["acme"], rec
        assert header_of(rec, "X-Org") == ["org-42"]
        assert header_of(rec, "X-Pet") == ["7"]
        assert header_of(rec, "X-Admin") == ["true"]
        assert r.header("X-Served-For") == "alice/7", r
    # A token without the claim: the header is set empty, never the client's.
    plain = token("ES256", key=keys["p256"])
    b.clear()
    r = get(port, plain, proto, headers=forged, target="/t/pets/8")
    assert r.status == 200, r
    rec = b.received()[-1]
    assert header_of(rec, "X-Tenant") == [""] and header_of(rec, "X-Org") == ["org-"], rec
    assert header_of(rec, "X-Pet") == ["8"]
    # The operation's own headers entry replaces the Api's.
    b.clear()
    r = get(port, tok, proto, target="/t/pets/9/photos/p%20x")
    assert r.status == 200, r
    rec = b.received()[-1]
    assert header_of(rec, "X-Photo") == ["9:p%20x"] and header_of(rec, "X-Sub") == ["alice"]
    assert header_of(rec, "X-Tenant") == []
    assert r.header("X-Served-For") is None


def test_forward_token_false_removes_it(jwtenv, keys):
    rt, port, b = jwtenv(inline_config(keys, forwardToken=False, query="access_token"))
    assert get(port, token("HS256")).status == 200
    assert header_of(b.received()[-1], "Authorization") == []
    r = request(port, "GET", "/t/pets?a=1&access_token=%s&b=2" % token("HS256"))
    assert r.status == 200
    assert b.received()[-1]["target"] == "/pets?a=1&b=2"


def test_token_from_custom_header_cookie_and_query(jwtenv, keys):
    rt, port, b = jwtenv(inline_config(keys, header="X-Token", cookie="session"))
    tok = token("HS256")
    assert request(port, "GET", "/t/p", headers={"X-Token": tok}).status == 200
    assert request(port, "GET", "/t/p", headers={"Cookie": "a=b; session=%s; c=d" % tok}).status == 200
    assert request(port, "GET", "/t/p", headers={"Authorization": "Bearer " + tok}).status == 401


def test_consumer_mapping(jwtenv, keys, backends, runtimes):
    subject = {"issuer": "https://idp.example", "subject": "alice"}
    cfg = inline_config(keys, consumerRequired=True)
    b = backends("echo")
    port = free_port()
    docs = config(port, b.port, cfg, consumers=[("alice", subject)])
    # The consumer reaches later policies: a headers policy shows it.
    docs[2]["spec"]["policies"].append(
        {"name": "headers", "config": {"request": {"set": {"X-Consumer": "${consumer}",
                                                            "X-Group": "${consumer_group}"}}}})
    runtimes(docs)
    assert get(port, token("RS256", key=keys["rsa"])).status == 200
    rec = b.received()[-1]
    assert header_of(rec, "X-Consumer") == ["default/alice"], rec["headers"]
    assert header_of(rec, "X-Group") == ["gold"]
    r = get(port, token("RS256", {"sub": "bob"}, key=keys["rsa"]))
    assert r.status == 403 and r.json()["error"]["code"] == "forbidden", r
    r = get(port, token("RS256", {"iss": None}, key=keys["rsa"]))
    assert r.status == 401  # issuers: the iss is checked before the mapping


def test_unknown_subject_is_anonymous_when_consumer_not_required(jwtenv, keys, backends, runtimes):
    b = backends("echo")
    port = free_port()
    docs = config(port, b.port, inline_config(keys))
    docs[2]["spec"]["policies"].append(
        {"name": "headers", "config": {"request": {"set": {"X-Consumer": "[${consumer}]"}}}})
    runtimes(docs)
    assert get(port, token("RS256", {"sub": "bob"}, key=keys["rsa"])).status == 200
    assert header_of(b.received()[-1], "X-Consumer") == ["[]"]


# --- remote JWKS ------------------------------------------------------------

class JwksServer:
    def __init__(self, keys, tls=None):
        """tls: (certfile, keyfile) to serve https; the SNI names clients
        sent are in .sni."""
        self.doc = {"keys": keys}
        self.hits = 0
        self.sni = []
        self.tls = tls
        self.lock = threading.Lock()
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                with outer.lock:
                    outer.hits += 1
                    body = json.dumps(outer.doc).encode() if isinstance(outer.doc, dict) \
                        else outer.doc
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)

            def on_sni(sock, name, _ctx):
                with outer.lock:
                    outer.sni.append(name)
            ctx.sni_callback = on_sni
            # The handshake runs in the handler's thread (on the first
            # read), so a failed one costs that thread only.
            self.srv.socket = ctx.wrap_socket(self.srv.socket, server_side=True,
                                              do_handshake_on_connect=False)
        self.port = self.srv.server_address[1]
        self.thread = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.thread.start()

    @property
    def uri(self):
        return "http://127.0.0.1:%d/.well-known/jwks.json" % self.port

    def https_uri(self, host="localhost"):
        return "https://%s:%d/.well-known/jwks.json" % (host, self.port)

    def set(self, doc):
        with self.lock:
            self.doc = doc

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def jwks_server():
    made = []

    def make(keys, tls=None):
        s = JwksServer(keys, tls)
        made.append(s)
        return s
    yield make
    for s in made:
        s.stop()


def test_remote_jwks_rotation_refreshes_on_unknown_kid(jwtenv, keys, jwks_server):
    srv = jwks_server([keys["rsa"].jwk()])
    rt, port, b = jwtenv({"jwksUri": srv.uri, "issuers": ["https://idp.example"]})
    wait_until(lambda: get(port, token("RS256", key=keys["rsa"])).status == 200, 10,
               what="the first JWKS fetch")
    # One fetch; a second when a token with a key not yet known arrived
    # while the first was under way (seen under the sanitizers).
    first = srv.hits
    assert first in (1, 2), first
    # HS tokens are never accepted from a remote set, nor are unknown kids.
    assert get(port, token("HS256", kid="rsa1")).status == 401
    # Rotation: the IdP adds ed1; the first token with it asks for a refresh.
    srv.set({"keys": [keys["rsa"].jwk(), keys["ed"].jwk()]})
    # Refreshes are at most one per 10 s, counted from the first fetch: up
    # to 10 s go by before the unknown kid may trigger one.
    wait_until(lambda: get(port, token("EdDSA", key=keys["ed"])).status == 200, 25,
               what="the refresh on an unknown kid")
    hits = srv.hits
    assert hits >= first + 1, (first, hits)
    # Unknown kids do not hammer the IdP: at most one fetch per 10 s.
    for _ in range(20):
        assert get(port, token("ES256", key=keys["p256"])).status == 401
    assert srv.hits <= hits + 1
    # A bad document is logged and the old keys stay.
    srv.set(b"{not json")
    assert get(port, token("RS256", key=keys["rsa"])).status == 200


def test_remote_jwks_down_fails_closed_with_503(jwtenv, keys, jwks_server, proto):
    dead = free_port()  # nothing listens there
    rt, port, b = jwtenv({"jwksUri": "http://127.0.0.1:%d/jwks" % dead,
                          "secret": SECRET}, proto=proto)
    # The fetcher starts with the first request; until a fetch succeeds,
    # a token whose key is unknown is answered 503, never let through.
    r = get(port, token("RS256", key=keys["rsa"]), proto)
    assert r.status == 503 and r.header("Retry-After") == "5", r
    wait_until(lambda: "JWKS http://127.0.0.1:%d/jwks: connect to 127.0.0.1:%d: Connection refused"
               % (dead, dead) in rt.log(), 10,
               what="the fetch failure in the log")
    r = get(port, token("RS256", key=keys["rsa"]), proto)
    assert r.status == 503 and r.json()["error"]["code"] == "jwks_unavailable", r
    # Tokens whose key is known (the inline secret) still work.
    assert get(port, token("HS256", kid=None), proto).status == 200


# --- remote JWKS over https ---------------------------------------------------

def openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Two CAs made by openssl; "localhost" (a certificate for localhost
    and 127.0.0.1, by ca) and "elsewhere" (for another name, by ca)."""
    d = str(tmp_path_factory.mktemp("pki"))
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", ca + ".key", "-out", ca + ".crt", "-days", "30",
                "-subj", "/CN=JWKS test " + ca, cwd=d)
    for name, san in (("localhost", "DNS:localhost,IP:127.0.0.1"),
                      ("elsewhere", "DNS:idp.elsewhere.example")):
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + name, cwd=d)
        with open(os.path.join(d, name + ".ext"), "w") as f:
            f.write("subjectAltName=%s\n" % san)
        openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", name + ".crt", "-days", "30",
                "-extfile", name + ".ext", cwd=d)

    class Pki:
        dir = d

        def path(self, name):
            return os.path.join(d, name)

        def pem(self, name):
            with open(os.path.join(d, name)) as f:
                return f.read()

        def server(self, name):
            return (self.path(name + ".crt"), self.path(name + ".key"))
    return Pki()


def test_remote_jwks_over_https_with_a_private_ca(jwtenv, keys, jwks_server, pki, proto):
    srv = jwks_server([keys["rsa"].jwk()], tls=pki.server("localhost"))
    # The CA inline (jwksCaBundle), by name: SNI and the name are checked.
    rt, port, b = jwtenv({"jwksUri": srv.https_uri(), "jwksCaBundle": pki.pem("ca.crt"),
                          "issuers": ["https://idp.example"]}, proto=proto)
    wait_until(lambda: get(port, token("RS256", key=keys["rsa"]), proto).status == 200, 10,
               what="the first JWKS fetch over https")
    assert srv.hits >= 1
    assert "localhost" in srv.sni, srv.sni
    assert "JWKS %s: 1 signature keys" % srv.https_uri() in rt.log()
    assert get(port, token("RS256", key=keys["rsa2"]), proto).status == 401


def test_remote_jwks_over_https_ca_file_and_an_address(jwtenv, keys, jwks_server, pki):
    srv = jwks_server([keys["ed"].jwk()], tls=pki.server("localhost"))
    # The CA from a file on the runtime's machine; the URL names an
    # address, checked against the certificate's IP SAN (no SNI for it).
    rt, port, b = jwtenv({"jwksUri": srv.https_uri("127.0.0.1"),
                          "jwksCaFile": pki.path("ca.crt")})
    wait_until(lambda: get(port, token("EdDSA", key=keys["ed"])).status == 200, 10,
               what="the first JWKS fetch over https")
    assert srv.sni == [None] * len(srv.sni), srv.sni


@pytest.mark.parametrize("case", ["system-cas", "wrong-ca", "wrong-name", "missing-ca-file"])
def test_remote_jwks_over_https_that_cannot_be_verified_fails_closed(jwtenv, keys, jwks_server,
                                                                     pki, case):
    cert = "elsewhere" if case == "wrong-name" else "localhost"
    srv = jwks_server([keys["rsa"].jwk()], tls=pki.server(cert))
    cfg = {"jwksUri": srv.https_uri(), "secret": SECRET}
    if case == "wrong-ca":
        cfg["jwksCaBundle"] = pki.pem("other-ca.crt")
    elif case == "wrong-name":
        cfg["jwksCaFile"] = pki.path("ca.crt")
    elif case == "missing-ca-file":
        cfg["jwksCaFile"] = pki.path("no-such-ca.crt")
    # system-cas: nothing configured: our private CA is in no system store.
    rt, port, b = jwtenv(cfg)
    r = get(port, token("RS256", key=keys["rsa"]))
    assert r.status == 503 and r.json()["error"]["code"] == "jwks_unavailable", r
    why = {"system-cas": "certificate verify failed: unable to get local issuer certificate",
           "wrong-ca": "certificate verify failed: unable to get local issuer certificate",
           "wrong-name": "certificate verify failed: hostname mismatch",
           "missing-ca-file": "jwksCaFile %s cannot be used: No such file or directory"
                              % pki.path("no-such-ca.crt")}[case]
    # One line names the document, the reason and (for the handshake) the peer.
    line = re.compile(r"JWKS %s: (TLS to [^ ]+: )?%s" % (re.escape(srv.https_uri()), re.escape(why)))
    wait_until(lambda: line.search(rt.log()), 10,
               what="the reason in the log")
    # Still closed: the keys never arrived. The inline secret still works.
    r = get(port, token("RS256", key=keys["rsa"]))
    assert r.status == 503 and r.json()["error"]["code"] == "jwks_unavailable", r
    assert get(port, token("HS256", kid=None)).status == 200
    # The runtime never got the document (the handshake failed first).
    assert srv.hits == 0


def test_grpc_statuses(jwtenv, keys):
    from clients import Proto
    proto = Proto("h2c")  # gRPC is HTTP/2 only
    rt, port, b = jwtenv(inline_config(keys, requiredScopes=["x"]), proto=proto)
    g = {"content-type": "application/grpc", "te": "trailers"}
    r = proto.request(port, "POST", "/t/pkg.Svc/Call", headers=g, body=b"\0\0\0\0\0")
    assert r.header("grpc-status") == "16", r
    h = dict(g, authorization="Bearer " + token("RS256", key=keys["rsa"]))
    r = proto.request(port, "POST", "/t/pkg.Svc/Call", headers=h, body=b"\0\0\0\0\0")
    assert r.header("grpc-status") == "7", r


# --- configuration errors ---------------------------------------------------

def check(tmp_path, policy_cfg):
    docs = config(free_port(), free_port(), policy_cfg)
    path = tmp_path / "c.yaml"
    path.write_text(dump_docs(docs))
    from helpers import runtime_binary
    p = subprocess.run([runtime_binary(), "--check", "--config", str(path)],
                       capture_output=True, text=True, timeout=30)
    return p.returncode, p.stdout + p.stderr


def test_config_errors_name_the_field(tmp_path, keys):
    base = "spec.policies[0].config"
    bad_n = dict(keys["rsa"].jwk(), n="AQAB")
    cases = [
        ({"jwks": {"keys": [bad_n]}}, base + ".jwks.keys[0].n", "2048 to 8192 bits"),
        ({"jwks": {"keys": [dict(keys["p256"].jwk(), x="!!")]}}, base + ".jwks.keys[0].x",
         "base64url"),
        ({"jwks": {"keys": [{"kty": "XYZ"}]}}, base + ".jwks.keys[0].kty", "unsupported"),
        ({"jwks": {"keys": [dict(keys["p256"].jwk(), alg="RS256")]}},
         base + ".jwks.keys[0].alg", "cannot be used"),
        ({"secret": "short"}, base + ".secret", "32 to 512 bytes"),
        ({"issuers": ["a"]}, base, "needs keys"),
        ({"jwksUri": "ftp://idp/keys"}, base + ".jwksUri", "https://"),
        ({"jwksUri": "http://idp/keys", "jwksCaFile": "/ca.pem"}, base + ".jwksCaFile",
         "only meaningful with an https:// jwksUri"),
        ({"jwksUri": "https://idp/keys", "jwksCaFile": "ca.pem"}, base + ".jwksCaFile",
         "absolute path"),
        ({"jwksUri": "https://idp/keys", "jwksCaBundle": "x"}, base + ".jwksCaBundle",
         "PEM certificates"),
        ({"secret": SECRET, "jwksCaFile": "/ca.pem"}, base + ".jwksCaFile",
         "only meaningful with jwksUri"),
        ({"secret": SECRET, "algorithms": ["RS256"]}, base + ".algorithms[0]", "no configured key"),
        ({"secret": SECRET, "algorithms": ["none"]}, base + ".algorithms[0]", ""),
        ({"secret": SECRET, "claimsToHeaders": {"sub": "Content-Length"}},
         base + ".claimsToHeaders.sub", "managed by the gateway"),
        ({"secret": SECRET, "issuer": ["a"]}, base + ".issuer", "did you mean 'issuers'"),
    ]
    for cfg, path, what in cases:
        rc, out = check(tmp_path, cfg)
        assert rc != 0, (cfg, out)
        assert path in out and what in out, (path, what, out)
    rc, out = check(tmp_path, inline_config(keys))
    assert rc == 0, out
