"""A scripted raw-socket origin for tests where the exact bytes on the
upstream side matter (connection reuse, framing, interim responses).

Responsible for: listening on 127.0.0.1 (a port it picks), recording the
exact bytes of every request it receives, per connection (so a test can tell
a request that came on a new connection from one on a reused connection),
finding where each request ends (Content-Length and chunked bodies, nothing
else) so keep-alive works, and answering each request with what the test
scripted.  Not responsible for: being a correct HTTP server; it answers
whatever it is told to, which is the point.

The script is either a callable or a list:

    script(req) -> actions      called for every request (req is a Request)
    [actions, actions, ...]     one entry per request, in arrival order over
                                all connections; past its end, `default`

`actions` is bytes (sent, connection kept), or a list of:

    b"..." / ("send", b"...")   send these bytes
    ("sleep", seconds)          pause
    ("send_close", b"...")      send and close at once: the bytes and the FIN
                                leave in the same TCP segment (TCP_CORK, then
                                shutdown), like an origin whose keep-alive
                                response races its idle close
    ("close",)                  close (FIN) without sending anything more
    ("reset",)                  close with RST (SO_LINGER 0)

After the last action the connection waits for the next request unless an
action closed it.  Use `response()` to build answers.
"""

import socket
import struct
import threading
import time

MAX_HEAD = 256 * 1024


def response(status=200, body=b"ok", headers=(), reason=None, length=True, version="HTTP/1.1"):
    """Bytes of one response: status line, headers (pairs, sent as given),
    Content-Length unless length=False (or a header of that name is given),
    then the body."""
    if reason is None:
        reason = {100: "Continue", 103: "Early Hints", 200: "OK", 204: "No Content",
                  404: "Not Found", 502: "Bad Gateway", 503: "Service Unavailable"}.get(
                      status, "X")
    lines = ["%s %d %s" % (version, status, reason)]
    names = {k.lower() for k, _ in headers}
    for k, v in headers:
        lines.append("%s: %s" % (k, v))
    if length and "content-length" not in names and "transfer-encoding" not in names:
        lines.append("Content-Length: %d" % len(body))
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def chunked(*pieces, trailers=()):
    """A chunked body of these pieces, then the last chunk and trailers."""
    out = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p)
    out += b"0\r\n" + b"".join(("%s: %s\r\n" % kv).encode("latin-1") for kv in trailers)
    return out + b"\r\n"


class Request:
    """One request as received: `raw` is its exact bytes (head and body as
    framed on the wire), `body` the decoded body."""

    def __init__(self, raw, head, body, conn_id, index, seq):
        self.raw = raw
        self.head = head
        self.body = body
        self.conn_id = conn_id  # 1, 2, ... in accept order
        self.index = index      # 0 for the first request of its connection
        self.seq = seq          # 0, 1, ... over all connections
        lines = head.split(b"\r\n")
        parts = lines[0].decode("latin-1").split(" ")
        self.method, self.target, self.version = (parts + ["", "", ""])[:3]
        self.headers = []
        for line in lines[1:]:
            if not line:
                continue
            k, _, v = line.decode("latin-1").partition(":")
            self.headers.append((k, v.strip()))

    def header_all(self, name):
        return [v for k, v in self.headers if k.lower() == name.lower()]

    def header(self, name, default=None):
        vals = self.header_all(name)
        return vals[0] if vals else default

    @property
    def new_connection(self):
        return self.index == 0

    def __repr__(self):
        return "<Request conn %d #%d %r>" % (self.conn_id, self.index, self.raw[:300])


class Connection:
    def __init__(self, conn_id, sock):
        self.id = conn_id
        self.sock = sock
        self.requests = []   # Request, in order
        self.received = bytearray()  # every byte read on this connection
        self.closed_by_peer = False


class _ProtocolError(Exception):
    pass


class _Reader:
    def __init__(self, conn):
        self.conn = conn
        self.buf = bytearray()
        self.consumed = bytearray()  # bytes of the request being read

    def fill(self):
        data = self.conn.sock.recv(65536)
        if not data:
            return False
        self.conn.received += data
        self.buf += data
        return True

    def take(self, n):
        piece = bytes(self.buf[:n])
        del self.buf[:n]
        self.consumed += piece
        return piece

    def head(self):
        while True:
            i = self.buf.find(b"\r\n\r\n")
            if i >= 0:
                return self.take(i + 4)
            if len(self.buf) > MAX_HEAD:
                raise _ProtocolError("head too large")
            if not self.fill():
                if self.buf:
                    raise _ProtocolError("eof inside a head")
                return None

    def line(self):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                return self.take(i + 2)[:-2]
            if not self.fill():
                raise _ProtocolError("eof inside a line")

    def exact(self, n):
        while len(self.buf) < n:
            if not self.fill():
                raise _ProtocolError("eof inside a body")
        return self.take(n)


class RawOrigin:
    def __init__(self, script=None, default=None):
        self.script = script if script is not None else []
        self.default = default if default is not None else response(200, b"ok")
        self.lock = threading.Lock()
        self.connections = []  # Connection, in accept order
        self.requests = []     # Request, in arrival order
        self.errors = []
        self._stop = threading.Event()
        self._listener = None
        self._threads = []

    # -- lifecycle -------------------------------------------------------
    def start(self):
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", 0))
        ls.listen(128)
        ls.settimeout(0.1)
        self._listener = ls
        self.port = ls.getsockname()[1]
        t = threading.Thread(target=self._accept_loop, daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def stop(self):
        self._stop.set()
        if self._listener:
            self._listener.close()
            self._listener = None
        with self.lock:
            conns = list(self.connections)
        for c in conns:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                c.sock.close()
            except OSError:
                pass
        for t in self._threads:
            t.join(2)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- queries ---------------------------------------------------------
    def received(self):
        with self.lock:
            return list(self.requests)

    def count(self):
        with self.lock:
            return len(self.requests)

    def wait_requests(self, n, timeout=5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.count() >= n:
                return True
            time.sleep(0.005)
        return False

    def num_connections(self):
        with self.lock:
            return len(self.connections)

    # -- serving ---------------------------------------------------------
    def _accept_loop(self):
        while not self._stop.is_set():
            try:
                s, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            s.settimeout(10.0)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                conn = Connection(len(self.connections) + 1, s)
                self.connections.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _actions_for(self, req):
        if callable(self.script):
            acts = self.script(req)
        elif req.seq < len(self.script):
            acts = self.script[req.seq]
        else:
            acts = self.default
        if acts is None:
            return [("close",)]
        if isinstance(acts, (bytes, bytearray)):
            return [bytes(acts)]
        return list(acts)

    def _serve(self, conn):
        reader = _Reader(conn)
        s = conn.sock
        try:
            while not self._stop.is_set():
                reader.consumed = bytearray()
                head = reader.head()
                if head is None:
                    conn.closed_by_peer = True
                    return
                body = self._read_body(reader, head)
                with self.lock:
                    req = Request(bytes(reader.consumed), head, body, conn.id,
                                  len(conn.requests), len(self.requests))
                    conn.requests.append(req)
                    self.requests.append(req)
                for act in self._actions_for(req):
                    if isinstance(act, (bytes, bytearray)):
                        act = ("send", bytes(act))
                    kind = act[0]
                    if kind == "send":
                        s.sendall(act[1])
                    elif kind == "sleep":
                        time.sleep(act[1])
                    elif kind == "send_close":
                        self._send_close(s, act[1])
                        return
                    elif kind == "close":
                        self._close(s)
                        return
                    elif kind == "reset":
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        s.close()
                        return
                    else:
                        raise ValueError("unknown action %r" % (act,))
        except _ProtocolError as e:
            with self.lock:
                self.errors.append("conn %d: %s" % (conn.id, e))
        except OSError:
            pass
        finally:
            try:
                s.close()
            except OSError:
                pass

    @staticmethod
    def _read_body(reader, head):
        te = cl = None
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            k = k.strip().lower()
            if k == b"transfer-encoding":
                te = v.strip().lower()
            elif k == b"content-length":
                cl = int(v.strip())
        if te is not None and te.endswith(b"chunked"):
            out = bytearray()
            while True:
                size = int(reader.line().split(b";")[0].strip(), 16)
                if size == 0:
                    while reader.line() != b"":
                        pass
                    return bytes(out)
                out += reader.exact(size)
                if reader.exact(2) != b"\r\n":
                    raise _ProtocolError("missing CRLF after a chunk")
        if cl:
            return reader.exact(cl)
        return b""

    @staticmethod
    def _close(s):
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        s.close()

    @staticmethod
    def _send_close(s, data):
        # Corked, the data waits; shutdown() attaches the FIN to the queued
        # segment and pushes it: data and FIN arrive together.
        cork = getattr(socket, "TCP_CORK", None)
        if cork is not None:
            s.setsockopt(socket.IPPROTO_TCP, cork, 1)
        s.sendall(data)
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        s.close()
