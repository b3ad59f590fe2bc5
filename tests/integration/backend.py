"""Origin server for the integration tests: a threaded HTTP/1.1 server on raw
sockets (not http.server, whose HTTP/1.0 habits would hide proxy bugs).

Responsible for: keep-alive, pipelining (requests of one connection are
answered strictly in order), Content-Length and chunked request bodies read
as a stream (never held whole), Content-Length and chunked response bodies
generated as a stream, and a record of every request it received so tests can
assert on what the proxy forwarded.  Not responsible for: being a complete or
fast HTTP server; it trusts that its only client is the proxy under test and
rejects anything odd by closing the connection (recorded in `protocol_errors`).

Behaviour is driven by the request path (after the proxy stripped the base
path), so one server serves every test:

    /status/NNN       answer NNN (body: the echo JSON)
    /delay/MS         sleep MS milliseconds, then echo
    /bytes/N          stream N bytes (?chunked=1 for chunked framing)
    /close            close the connection without answering
    /reset            close with RST (SO_LINGER 0) without answering
    /garbage          answer bytes that are not HTTP
    /health           answer `health_status` (settable by the test)
    anything else     echo: JSON {server, method, target, path, headers,
                      body_length, body_crc32, conn_id, version}

Query parameters on any path: pause_ms=N (sleep before reading the request
body, to exercise the proxy's back-pressure).  Server-wide switches the tests
set directly: `health_status`, `fail_status` (answer every non-health request
with that status), `fail_action` ("close" or "reset" every non-health request),
`extra_response_headers`, `headers_for` (a function of the request's record
returning more response headers, e.g. Cache-Control by path).
"""

import json
import socket
import struct
import threading
import time
import zlib
from urllib.parse import parse_qs, urlsplit

MAX_HEAD = 256 * 1024
PATTERN = bytes(range(256)) * 256  # 64 KiB block used for generated bodies


def pattern_bytes(n):
    """The first n bytes of the infinite PATTERN stream (for verification)."""
    out = bytearray()
    while len(out) < n:
        out += PATTERN[: n - len(out)]
    return bytes(out)


class ProtocolError(Exception):
    pass


class _Conn:
    """Buffered reader over a socket that never reads more than it is asked
    for beyond one recv, so pipelined requests stay in the buffer."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = bytearray()

    def fill(self):
        data = self.sock.recv(262144)
        if not data:
            return False
        self.buf += data
        return True

    def read_head(self):
        while True:
            idx = self.buf.find(b"\r\n\r\n")
            if idx >= 0:
                head = bytes(self.buf[: idx + 4])
                del self.buf[: idx + 4]
                return head
            if len(self.buf) > MAX_HEAD:
                raise ProtocolError("head too large")
            if not self.fill():
                if self.buf:
                    raise ProtocolError("eof inside head")
                return None

    def read_line(self, limit=8192):
        while True:
            idx = self.buf.find(b"\r\n")
            if idx >= 0:
                line = bytes(self.buf[:idx])
                del self.buf[: idx + 2]
                return line
            if len(self.buf) > limit:
                raise ProtocolError("line too long")
            if not self.fill():
                raise ProtocolError("eof inside line")

    def read_exact_stream(self, n, sink):
        """Consumes n bytes, passing pieces to sink, never holding them all."""
        while n > 0:
            if not self.buf:
                # Fast path for big bodies: straight from the socket.
                data = self.sock.recv(min(n, 262144))
                if not data:
                    raise ProtocolError("eof inside body")
                sink(data)
                n -= len(data)
                continue
            take = min(n, len(self.buf))
            sink(bytes(self.buf[:take]))
            del self.buf[:take]
            n -= take


class BodyStats:
    def __init__(self):
        self.length = 0
        self.crc = 0

    def __call__(self, piece):
        self.length += len(piece)
        self.crc = zlib.crc32(piece, self.crc)


class Backend:
    def __init__(self, port=0, name=None, host="127.0.0.1", ssl_context=None):
        self.host = host
        # With an ssl.SSLContext (server side) every connection is TLS; failed
        # handshakes are recorded in tls_errors (and are not protocol errors).
        self.ssl_context = ssl_context
        self.tls_errors = []
        self.tls_peers = []  # the client certificate of each TLS connection, or None
        self.requested_port = port
        self.name = name
        self.requests = []  # list of dicts, in arrival order
        self.protocol_errors = []
        self.connections = 0
        self.health_status = 200
        self.fail_status = None
        self.fail_action = None  # "reset" or "close": every non-health request
        self.extra_response_headers = []
        self.headers_for = None  # record -> [(name, value)], per request
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._socks = set()
        self._listener = None
        self._thread = None
        self._conn_seq = 0

    # -- lifecycle -------------------------------------------------------
    def start(self):
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((self.host, self.requested_port))
        ls.listen(512)
        ls.settimeout(0.2)
        self._listener = ls
        self.port = ls.getsockname()[1]
        if self.name is None:
            self.name = "backend-%d" % self.port
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread:
            self._thread.join(2)
        if self._listener:
            self._listener.close()
            self._listener = None
        with self.lock:
            socks = list(self._socks)
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- queries for tests -----------------------------------------------
    def received(self, path_prefix=None):
        with self.lock:
            reqs = list(self.requests)
        if path_prefix is None:
            return reqs
        return [r for r in reqs if r["path"].startswith(path_prefix)]

    def count(self, path_prefix=None, exclude_health=True):
        reqs = self.received(path_prefix)
        if exclude_health:
            reqs = [r for r in reqs if r["path"] != "/health"]
        return len(reqs)

    def clear(self):
        with self.lock:
            self.requests.clear()

    def wait_for(self, predicate, timeout=5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.01)
        return False

    # -- serving ---------------------------------------------------------
    def _accept_loop(self):
        while not self._stop.is_set():
            try:
                s, addr = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                self._socks.add(s)
                self.connections += 1
                self._conn_seq += 1
                conn_id = self._conn_seq
            threading.Thread(target=self._serve, args=(s, addr, conn_id), daemon=True).start()

    def _serve(self, s, addr, conn_id):
        if self.ssl_context is not None:
            try:
                s = self.ssl_context.wrap_socket(s, server_side=True)
            except (OSError, ValueError) as e:
                with self.lock:
                    self.tls_errors.append(str(e))
                s.close()
                return
            with self.lock:
                self.tls_peers.append(s.getpeercert())
        conn = _Conn(s)
        try:
            while not self._stop.is_set():
                if not self._serve_one(conn, addr, conn_id):
                    break
        except ProtocolError as e:
            with self.lock:
                self.protocol_errors.append(str(e))
        except OSError:
            pass
        finally:
            with self.lock:
                self._socks.discard(s)
            try:
                s.close()
            except OSError:
                pass

    def _serve_one(self, conn, addr, conn_id):
        head = conn.read_head()
        if head is None:
            return False
        lines = head[:-4].split(b"\r\n")
        try:
            method, target, version = lines[0].decode("latin-1").split(" ")
        except ValueError:
            raise ProtocolError("bad request line %r" % lines[0])
        headers = []
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or name != name.strip() or not name:
                raise ProtocolError("bad header line %r" % line)
            headers.append((name.decode("latin-1"), value.strip().decode("latin-1")))
        hmap = {}
        for k, v in headers:
            hmap.setdefault(k.lower(), []).append(v)

        url = urlsplit(target)
        path = url.path
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        record = {
            "server": self.name,
            "method": method,
            "target": target,
            "path": path,
            "version": version,
            "headers": headers,
            "conn_id": conn_id,
            "client_port": addr[1],
            "body_length": 0,
            "body_crc32": 0,
            "time": time.monotonic(),
        }
        with self.lock:
            self.requests.append(record)

        te = ",".join(hmap.get("transfer-encoding", [])).lower()
        cls = hmap.get("content-length", [])
        if te and cls:
            raise ProtocolError("both Content-Length and Transfer-Encoding forwarded")
        if len(cls) > 1:
            raise ProtocolError("several Content-Length forwarded")

        action = self.fail_action if path != "/health" else None
        if path == "/close" or action == "close":
            return False
        if path == "/reset" or action == "reset":
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False

        if "pause_ms" in query:
            time.sleep(int(query["pause_ms"]) / 1000.0)

        expect = ",".join(hmap.get("expect", [])).lower()
        if "100-continue" in expect and version == "HTTP/1.1":
            conn.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")

        stats = BodyStats()
        if te:
            if te.split(",")[-1].strip() != "chunked":
                raise ProtocolError("unsupported transfer-encoding %r" % te)
            while True:
                size_line = conn.read_line()
                size_txt = size_line.split(b";")[0].strip()
                try:
                    size = int(size_txt, 16)
                except ValueError:
                    raise ProtocolError("bad chunk size %r" % size_line)
                if size == 0:
                    while conn.read_line() != b"":
                        pass
                    break
                conn.read_exact_stream(size, stats)
                if conn.read_line() != b"":
                    raise ProtocolError("missing CRLF after chunk")
        elif cls:
            conn.read_exact_stream(int(cls[0]), stats)
        record["body_length"] = stats.length
        record["body_crc32"] = stats.crc

        conn_tokens = [t.strip().lower() for t in ",".join(hmap.get("connection", [])).split(",")]
        if version == "HTTP/1.0":
            keep_alive = "keep-alive" in conn_tokens
        else:
            keep_alive = "close" not in conn_tokens

        if path.startswith("/delay/"):
            time.sleep(int(path[len("/delay/"):]) / 1000.0)

        if path == "/garbage":
            conn.sock.sendall(b"THIS IS NOT HTTP\r\n\r\n")
            return False

        status = 200
        if path == "/health":
            status = self.health_status
        elif self.fail_status is not None:
            status = self.fail_status
        elif path.startswith("/status/"):
            status = int(path[len("/status/"):])

        extra = [("X-Backend", self.name)] + list(self.extra_response_headers)
        if self.headers_for:
            extra += list(self.headers_for(record))
        if path.startswith("/bytes/"):
            n = int(path[len("/bytes/"):])
            chunked = query.get("chunked") == "1"
            self._send_stream(conn.sock, status, n, chunked, keep_alive, extra, method)
            return keep_alive

        body = json.dumps({
            "server": self.name,
            "method": method,
            "target": target,
            "path": path,
            "version": version,
            "headers": headers,
            "body_length": stats.length,
            "body_crc32": stats.crc,
            "conn_id": conn_id,
        }).encode()
        if method == "HEAD" or status in (204, 304):
            body_out = b""
        else:
            body_out = body
        out = ["HTTP/1.1 %d X\r\n" % status, "Content-Type: application/json\r\n"]
        if status not in (204, 304):
            out.append("Content-Length: %d\r\n" % len(body))
        for k, v in extra:
            out.append("%s: %s\r\n" % (k, v))
        if not keep_alive:
            out.append("Connection: close\r\n")
        out.append("\r\n")
        conn.sock.sendall("".join(out).encode("latin-1") + body_out)
        return keep_alive

    def _send_stream(self, sock, status, n, chunked, keep_alive, extra, method):
        out = ["HTTP/1.1 %d OK\r\n" % status, "Content-Type: application/octet-stream\r\n"]
        if chunked:
            out.append("Transfer-Encoding: chunked\r\n")
        else:
            out.append("Content-Length: %d\r\n" % n)
        for k, v in extra:
            out.append("%s: %s\r\n" % (k, v))
        if not keep_alive:
            out.append("Connection: close\r\n")
        out.append("\r\n")
        sock.sendall("".join(out).encode("latin-1"))
        if method == "HEAD":
            return
        left = n
        view = memoryview(PATTERN)
        while left > 0:
            take = min(left, len(PATTERN))
            if chunked:
                sock.sendall(b"%x\r\n" % take + view[:take] + b"\r\n")
            else:
                sock.sendall(view[:take])
            left -= take
        if chunked:
            sock.sendall(b"0\r\n\r\n")
