"""A Kubernetes API server for the Sluice custom resources, small enough to
be driven by a test: what `sluice-controller --source kubernetes` needs of
one (list with metadata.resourceVersion, watch with resourceVersion,
bookmarks, ERROR 410 Expired, the /status subresource with merge patch,
bearer tokens over HTTPS), with the knobs a test needs (drop every
connection, stop and restart on the same port, expire old resourceVersions,
a request log), and core/v1 Secrets (list and watch, namespaced, with
fieldSelector=metadata.name=NAME: what the controller asks for the Secrets
that Certificates name; `forbid_secrets` answers 403 as RBAC would), and
the EndpointSlices of a Service (`endpoint_slices`, set by the test: which
controller replicas are live).

Responsible for: the protocol as the Kubernetes API server speaks it for
custom resources and Secrets (one resourceVersion counter for every
object, as etcd's revision). Not responsible for: validation (the
controller validates), label selectors, other field selectors,
server-side apply, discovery: kubectl is not pointed at this server. The
controller's own Kubernetes-compatible API (controller/kapi.c) is the other
server these tests are meant to run against.
"""

import base64
import json
import socket
import ssl
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GROUP = "/apis/gateway.sluice.dev/v1alpha1"
CORE = "/api/v1"
PLURALS = {"Gateway": "gateways", "Api": "apis", "Backend": "backends",
           "Consumer": "consumers", "Certificate": "certificates", "Secret": "secrets"}


def merge_patch(target, patch):
    """RFC 7386, as the API server applies application/merge-patch+json."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def tls_secret(name, cert_pem, key_pem, ns="default", type_="kubernetes.io/tls"):
    """A Secret as cert-manager or `kubectl create secret tls` writes it."""
    data = {}
    if cert_pem is not None:
        data["tls.crt"] = base64.b64encode(cert_pem.encode()).decode()
    if key_pem is not None:
        data["tls.key"] = base64.b64encode(key_pem.encode()).decode()
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": ns},
            "type": type_, "data": data}


class FakeKube:
    def __init__(self, port, token=None, certfile=None, keyfile=None, bookmark_s=60.0,
                 client_ca=None):
        self.port = port
        self.client_ca = client_ca  # require a client certificate issued by it
        self.client_subjects = []   # the CNs of the client certificates seen
        self.token = token
        self.certfile, self.keyfile = certfile, keyfile
        self.bookmark_s = bookmark_s
        self.lock = threading.Condition()
        self.rv = 100
        self.objects = {}      # (plural, ns, name) -> object
        self.events = []       # (rv, type, plural, ns, object)
        self.oldest_rv = 0     # a watch from an RV below this gets 410
        self.requests = []     # "METHOD target"
        self.endpoint_slices = {}  # (ns, service) -> [ready pod names]
        self.patches = []      # (path, body)
        self.epoch = 0         # bumped by drop(): open watches end abruptly
        self.conns = set()
        self.server = None
        self.forbid_secrets = set()  # (ns, name): list/watch answer 403

    # -- what the test does ----------------------------------------------------
    def _event(self, typ, plural, obj):
        self.events.append((self.rv, typ, plural, obj["metadata"].get("namespace", "default"),
                            json.loads(json.dumps(obj))))
        self.lock.notify_all()

    def put(self, doc):
        with self.lock:
            plural = PLURALS[doc["kind"]]
            meta = doc.setdefault("metadata", {})
            ns = meta.setdefault("namespace", "default")
            key = (plural, ns, meta["name"])
            old = self.objects.get(key)
            self.rv += 1
            obj = json.loads(json.dumps(doc))
            obj["metadata"]["resourceVersion"] = str(self.rv)
            if plural != "secrets":
                obj["metadata"]["generation"] = (old["metadata"]["generation"] + 1) if old else 1
            obj["metadata"]["uid"] = old["metadata"]["uid"] if old else "uid-%d" % self.rv
            obj["metadata"]["managedFields"] = [{"manager": "kubectl"}]
            if old and "status" in old:
                obj["status"] = old["status"]
            self.objects[key] = obj
            self._event("MODIFIED" if old else "ADDED", plural, obj)
            return self.rv

    def delete(self, kind, name, ns="default"):
        with self.lock:
            plural = PLURALS[kind]
            obj = self.objects.pop((plural, ns, name))
            self.rv += 1
            obj = json.loads(json.dumps(obj))
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self._event("DELETED", plural, obj)
            return self.rv

    def bump(self, n=1):
        """Writes elsewhere in the cluster: the revision moves, no event here."""
        with self.lock:
            self.rv += n
            return self.rv

    def expire(self):
        """Every resourceVersion so far is too old (etcd compacted): resumed
        watches get 410, open ones an ERROR 410 event."""
        with self.lock:
            self.oldest_rv = self.rv + 1
            self.lock.notify_all()

    def drop(self):
        """Every open connection is cut (a restart of the server seen from
        the client), the server keeps listening."""
        with self.lock:
            self.epoch += 1
            conns = list(self.conns)
            self.lock.notify_all()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def status_of(self, kind, name, ns="default"):
        with self.lock:
            obj = self.objects.get((PLURALS[kind], ns, name))
            return json.loads(json.dumps(obj.get("status"))) if obj else None

    def requests_matching(self, text):
        with self.lock:
            return [r for r in self.requests if text in r]

    # -- life cycle ------------------------------------------------------------
    def start(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def setup(self):
                if isinstance(self.request, ssl.SSLSocket):
                    self.request.settimeout(10)
                    self.request.do_handshake()
                    self.request.settimeout(None)
                    if fake.client_ca:
                        subject = dict(x[0] for x in self.request.getpeercert()["subject"])
                        with fake.lock:
                            fake.client_subjects.append(subject.get("commonName"))
                super().setup()
                with fake.lock:
                    fake.conns.add(self.connection)

            def finish(self):
                with fake.lock:
                    fake.conns.discard(self.connection)
                try:
                    super().finish()
                except OSError:
                    pass

            def send_json(self, status, doc):
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def status_error(self, code, reason, message):
                self.send_json(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                      "reason": reason, "message": message, "code": code})

            def authorized(self):
                with fake.lock:
                    fake.requests.append("%s %s%s" % (
                        self.command, self.path,
                        "" if self.headers.get("Authorization") else " (no token)"))
                if fake.token and self.headers.get("Authorization") != "Bearer " + fake.token:
                    self.status_error(401, "Unauthorized", "Unauthorized")
                    return False
                return True

            def parse(self):
                u = urllib.parse.urlsplit(self.path)
                q = dict(urllib.parse.parse_qsl(u.query))
                if u.path.startswith(CORE + "/"):
                    parts = u.path[len(CORE) + 1:].split("/")
                    if len(parts) == 3 and parts[0] == "namespaces" and parts[2] == "secrets":
                        return parts[1], ["secrets"], q
                    return None
                if not u.path.startswith(GROUP + "/"):
                    return None
                parts = u.path[len(GROUP) + 1:].split("/")
                ns = None
                if parts[0] == "namespaces" and len(parts) >= 3:
                    ns, parts = parts[1], parts[2:]
                return ns, parts, q

            def endpoint_slices(self):
                """GET .../namespaces/NS/endpointslices?labelSelector=
                kubernetes.io/service-name=SVC: one slice of the ready
                Pods the test listed."""
                u = urllib.parse.urlsplit(self.path)
                parts = u.path.split("/")
                q = dict(urllib.parse.parse_qsl(u.query))
                svc = q.get("labelSelector", "").partition("kubernetes.io/service-name=")[2]
                with fake.lock:
                    pods = fake.endpoint_slices.get((parts[5], svc), [])
                    rv = str(fake.rv)
                eps = [{"addresses": ["10.0.0.%d" % (i + 1)], "conditions": {"ready": True},
                        "targetRef": {"kind": "Pod", "name": p, "namespace": parts[5]}}
                       for i, p in enumerate(pods)]
                self.send_json(200, {"apiVersion": "discovery.k8s.io/v1",
                                     "kind": "EndpointSliceList",
                                     "metadata": {"resourceVersion": rv},
                                     "items": [{"metadata": {"name": svc + "-x"},
                                                "addressType": "IPv4", "endpoints": eps}]})

            def do_GET(self):
                if not self.authorized():
                    return
                if self.path.startswith("/apis/discovery.k8s.io/v1/namespaces/") and \
                        urllib.parse.urlsplit(self.path).path.endswith("/endpointslices"):
                    return self.endpoint_slices()
                p = self.parse()
                if not p or len(p[1]) != 1 or p[1][0] not in PLURALS.values():
                    return self.status_error(404, "NotFound", "the server could not find the "
                                             "requested resource")
                ns, (plural,), q = p
                name = None
                if plural == "secrets":
                    sel = q.get("fieldSelector", "")
                    if sel and not sel.startswith("metadata.name="):
                        return self.status_error(400, "BadRequest",
                                                 "only metadata.name= is served here")
                    name = sel[len("metadata.name="):] or None
                    if (ns, name) in fake.forbid_secrets:
                        return self.status_error(
                            403, "Forbidden", 'secrets "%s" is forbidden: User "sluice" cannot '
                            'list resource "secrets" in API group "" in the namespace "%s"'
                            % (name, ns))
                if q.get("watch") == "true":
                    return self.watch(ns, plural, q, name)
                with fake.lock:
                    items = [o for (pl, n, nm), o in sorted(fake.objects.items())
                             if pl == plural and (ns is None or n == ns) and
                             (name is None or nm == name)]
                    doc = {"apiVersion": "v1" if plural == "secrets"
                           else "gateway.sluice.dev/v1alpha1",
                           "kind": "SecretList" if plural == "secrets" else "List",
                           "metadata": {"resourceVersion": str(fake.rv)}, "items": items}
                self.send_json(200, doc)

            def chunk(self, doc):
                data = (json.dumps(doc) + "\n").encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def watch(self, ns, plural, q, name=None):
                rv = int(q.get("resourceVersion") or 0)
                timeout = float(q.get("timeoutSeconds") or 1800)
                bookmarks = q.get("allowWatchBookmarks") == "true"
                with fake.lock:
                    epoch = fake.epoch
                    if rv and rv < fake.oldest_rv:
                        return self.status_error(410, "Expired", "too old resource version: "
                                                 "%d (%d)" % (rv, fake.oldest_rv))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                end = time.monotonic() + timeout
                last_sent = time.monotonic()
                try:
                    while time.monotonic() < end:
                        with fake.lock:
                            if fake.epoch != epoch:
                                return
                            if rv < fake.oldest_rv - 1:
                                self.chunk({"type": "ERROR", "object": {
                                    "kind": "Status", "apiVersion": "v1", "status": "Failure",
                                    "reason": "Expired", "code": 410,
                                    "message": "too old resource version: %d (%d)"
                                               % (rv, fake.oldest_rv)}})
                                break
                            out = [e for e in fake.events if e[0] > rv and e[2] == plural and
                                   (ns is None or e[3] == ns) and
                                   (name is None or e[4]["metadata"]["name"] == name)]
                            if out:
                                rv = out[-1][0]
                            bookmark = None
                            if not out and bookmarks and \
                                    time.monotonic() - last_sent >= fake.bookmark_s:
                                rv = max(rv, fake.rv)
                                bookmark = {"type": "BOOKMARK", "object": {
                                    "kind": "Api", "apiVersion": "gateway.sluice.dev/v1alpha1",
                                    "metadata": {"resourceVersion": str(fake.rv)}}}
                            if not out and not bookmark:
                                fake.lock.wait(0.05)
                                continue
                        for e in out:
                            self.chunk({"type": e[1], "object": e[4]})
                        if bookmark:
                            self.chunk(bookmark)
                        last_sent = time.monotonic()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:
                    pass
                self.close_connection = True

            def do_PATCH(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                if not self.authorized():
                    return
                p = self.parse()
                if not p or len(p[1]) != 3 or p[1][2] != "status" or p[0] is None:
                    return self.status_error(404, "NotFound", "not found")
                ns, (plural, name, _), _q = p
                if self.headers.get("Content-Type") != "application/merge-patch+json":
                    return self.status_error(415, "UnsupportedMediaType", "merge patch only")
                patch = json.loads(body)
                with fake.lock:
                    fake.patches.append((self.path, patch))
                    obj = fake.objects.get((plural, ns, name))
                    if obj is None:
                        return self.status_error(404, "NotFound", "%s \"%s\" not found"
                                                 % (plural, name))
                    fake.rv += 1
                    obj = json.loads(json.dumps(obj))
                    obj["status"] = merge_patch(obj.get("status"), patch["status"])
                    obj["metadata"]["resourceVersion"] = str(fake.rv)
                    fake.objects[(plural, ns, name)] = obj
                    fake._event("MODIFIED", plural, obj)
                self.send_json(200, obj)

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True
            # socketserver listens with a backlog of 5; a controller opens a
            # list per kind at once, and a SYN dropped on a full queue comes
            # back only after 1, 3, 7, 15 s.
            request_queue_size = 128

            def get_request(self):
                # The TLS handshake is done by the connection's own thread
                # (Handler.setup): in this accepting thread, one client slow
                # to send its ClientHello would hold every other connection.
                sock, addr = super().get_request()
                if fake.certfile:
                    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                    ctx.load_cert_chain(fake.certfile, fake.keyfile)
                    if fake.client_ca:
                        ctx.verify_mode = ssl.CERT_REQUIRED
                        ctx.load_verify_locations(fake.client_ca)
                    sock = ctx.wrap_socket(sock, server_side=True,
                                           do_handshake_on_connect=False)
                return sock, addr

        self.server = Server(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self):
        """The server goes away: no listener, every connection cut."""
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        self.drop()

    def kubeconfig(self, path, ca_pem=None, token=None, cert_pem=None, key_pem=None):
        import base64
        scheme = "https" if self.certfile else "http"
        cluster = {"server": "%s://127.0.0.1:%d" % (scheme, self.port)}
        if ca_pem:
            cluster["certificate-authority-data"] = base64.b64encode(ca_pem.encode()).decode()
        user = {"token": token} if token else {}
        if cert_pem:
            user["client-certificate-data"] = base64.b64encode(cert_pem.encode()).decode()
            user["client-key-data"] = base64.b64encode(key_pem.encode()).decode()
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "test",
               "clusters": [{"name": "fake", "cluster": cluster}],
               "users": [{"name": "u", "user": user}],
               "contexts": [{"name": "test", "context": {"cluster": "fake", "user": "u"}}]}
        with open(path, "w") as f:
            json.dump(cfg, f)
        return path
