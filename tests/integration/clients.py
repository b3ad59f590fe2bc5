"""One request, over HTTP/1.1 or HTTP/2: the client side of the protocol
parametrisation of the integration suite.

Responsible for: `Proto`, what a test asks for through the `proto` fixture
(conftest.py): a Gateway document with two listeners (`protocol: http` on the
port the test chose, and `protocol: h2c` on a second free port), and
`request()` / `connection()` that send one request (method, target, headers,
body given whole or as pieces, request trailers) to the listener of the
protocol under test and return a helpers.Response (status, headers, body,
trailers).  Over HTTP/2 the client is Debian's python3-h2 on a raw socket
with prior knowledge (h2c): `Host` becomes `:authority`, names are sent
lower-case, and the response's `:status` becomes Response.status.

Not responsible for: HTTP/1.1 wire details (helpers.py's raw clients) or
HTTP/2 framing attacks (test_http2_attacks.py).  A test that is about the
request's life uses `proto`; a test about one protocol's framing does not.
"""

import socket
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from helpers import Response, ResponseReader, connect, free_port, gateway

PROTOS = ("http1", "h2c")


class H2Reset(AssertionError):
    """The server reset the stream (RST_STREAM) or the connection (GOAWAY)
    instead of answering."""

    def __init__(self, kind, code, resp=None):
        AssertionError.__init__(self, "%s with error code %r" % (kind, code))
        self.kind = kind
        self.code = code
        self.resp = resp


class H2Connection:
    """A minimal HTTP/2 client connection (prior knowledge, h2c) that keeps
    one record per stream; several streams may be in flight."""

    def __init__(self, port, timeout=10.0, validate_outbound=True):
        self.sock = connect(port, timeout=timeout)
        self.timeout = timeout
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding="latin-1",
            validate_outbound_headers=validate_outbound,
            normalize_outbound_headers=validate_outbound))
        self.conn.initiate_connection()
        self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 24})
        self.conn.increment_flow_control_window((1 << 24) - 65535)
        self.sock.sendall(self.conn.data_to_send())
        self.streams = {}
        self.closed = False
        self.goaway = None

    def close(self):
        self.sock.close()

    def _flush(self):
        out = self.conn.data_to_send()
        if out:
            self.sock.sendall(out)

    def start(self, method, target, headers=(), host="example.com", end_stream=True,
              keep_host_field=False):
        """Sends HEADERS; returns the stream id. headers: (name, value)
        pairs; a Host header becomes :authority (unless keep_host_field:
        then it is sent as a field beside :authority = host)."""
        sid = self.conn.get_next_available_stream_id()
        authority = host
        rest = []
        for k, v in headers:
            if k.lower() == "host" and not keep_host_field:
                authority = v
            else:
                rest.append((k.lower(), v))
        hdrs = [(":method", method), (":scheme", "http"), (":authority", authority),
                (":path", target)] + rest
        self.streams[sid] = {"headers": None, "body": bytearray(), "ended": False,
                             "reset": None, "interim": [], "trailers": None}
        self.conn.send_headers(sid, hdrs, end_stream=end_stream)
        self._flush()
        return sid

    def send_data(self, sid, data, end_stream=False):
        view = memoryview(data)
        while view:
            window = self.conn.local_flow_control_window(sid)
            size = min(len(view), window, self.conn.max_outbound_frame_size)
            if size <= 0:
                self._flush()
                self.pump(lambda: self.conn.local_flow_control_window(sid) > 0
                          or self._over(sid))
                if self._over(sid):
                    return
                continue
            self.conn.send_data(sid, bytes(view[:size]))
            view = view[size:]
            self._flush()
        if end_stream:
            self.conn.end_stream(sid)
            self._flush()

    def send_trailers(self, sid, trailers):
        self.conn.send_headers(sid, [(k.lower(), v) for k, v in trailers], end_stream=True)
        self._flush()

    def end(self, sid):
        self.conn.end_stream(sid)
        self._flush()

    def _over(self, sid):
        r = self.streams[sid]
        return r["ended"] or r["reset"] is not None or self.closed

    def pump(self, until, timeout=None):
        deadline = time.monotonic() + (timeout or self.timeout)
        while not until():
            if self.closed:
                return
            if time.monotonic() > deadline:
                raise socket.timeout("timed out waiting for an HTTP/2 response")
            try:
                data = self.sock.recv(262144)
            except socket.timeout:
                continue
            except ConnectionResetError:
                data = b""
            if not data:
                self.closed = True
                return
            for ev in self.conn.receive_data(data):
                self._event(ev)
            self._flush()

    def _event(self, ev):
        r = self.streams.get(getattr(ev, "stream_id", None))
        if isinstance(ev, h2.events.ResponseReceived):
            r["headers"] = list(ev.headers)
        elif isinstance(ev, h2.events.InformationalResponseReceived):
            r["interim"].append(list(ev.headers))
        elif isinstance(ev, h2.events.DataReceived):
            if r is not None:
                r["body"] += ev.data
            self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        elif isinstance(ev, h2.events.TrailersReceived):
            r["trailers"] = list(ev.headers)
        elif isinstance(ev, h2.events.StreamEnded):
            r["ended"] = True
        elif isinstance(ev, h2.events.StreamReset):
            if r is not None:
                r["reset"] = ev.error_code
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self.goaway = ev.error_code
            self.closed = True

    def response(self, sid, timeout=None, sink=None):
        """Waits for stream sid to end; returns a helpers.Response with
        `.trailers` and `.interim`. Raises H2Reset when the stream or the
        connection was reset before the response ended."""
        r = self.streams[sid]
        if sink is not None:
            def until():
                if r["body"]:
                    sink(bytes(r["body"]))
                    r["body"].clear()
                return self._over(sid)
        else:
            def until():
                return self._over(sid)
        self.pump(until, timeout)
        if sink is not None and r["body"]:
            sink(bytes(r["body"]))
            r["body"].clear()
        resp = None
        if r["headers"] is not None:
            hdrs = [(k, v) for k, v in r["headers"] if not k.startswith(":")]
            status = int(dict(r["headers"])[":status"])
            resp = Response("HTTP/2", status, "", hdrs, bytes(r["body"]))
            resp.trailers = r["trailers"]
            resp.interim = r["interim"]
        if r["reset"] is not None and not r["ended"]:
            raise H2Reset("RST_STREAM", r["reset"], resp)
        if not r["ended"]:
            raise H2Reset("connection closed (GOAWAY)", self.goaway, resp)
        return resp

    def request(self, method, target, headers=None, body=None, host="example.com",
                chunks=None, trailers=None, timeout=None, sink=None, read_delay=0):
        hdrs = _pairs(headers)
        has_body = body is not None or chunks is not None or trailers is not None
        if body is not None and not any(k.lower() == "content-length" for k, _ in hdrs):
            hdrs.append(("content-length", str(len(body))))
        sid = self.start(method, target, hdrs, host=host, end_stream=not has_body)
        if has_body:
            for piece in [body] if body is not None else (chunks or []):
                if piece:
                    self.send_data(sid, piece)
                if self._over(sid):
                    break  # answered (413...) or reset before the body ended
            if self._over(sid):
                pass
            elif trailers:
                self.send_trailers(sid, trailers)
            else:
                self.end(sid)
        if read_delay:
            time.sleep(read_delay)
        return self.response(sid, timeout, sink)


class H1Connection:
    """A keep-alive HTTP/1.1 connection with the same request() as
    H2Connection. Content-Length when the body is given whole, chunked (with
    trailers) when it is given as pieces."""

    def __init__(self, port, timeout=10.0):
        self.sock = connect(port, timeout=timeout)
        self.reader = ResponseReader(self.sock)

    def close(self):
        self.sock.close()

    def request(self, method, target, headers=None, body=None, host="example.com",
                chunks=None, trailers=None, timeout=None, sink=None, read_delay=0):
        hdrs = [("Host", host)] + _pairs(headers)
        has_length = any(k.lower() == "content-length" for k, _ in hdrs)
        if body is not None and not has_length:
            hdrs.append(("Content-Length", str(len(body))))
        # Pieces without a Content-Length go chunked (one chunk each).
        chunked = (chunks is not None or trailers is not None) and not has_length
        if chunked:
            hdrs.append(("Transfer-Encoding", "chunked"))
        if timeout:
            self.sock.settimeout(timeout)
        head = "%s %s HTTP/1.1\r\n" % (method, target)
        head += "".join("%s: %s\r\n" % kv for kv in hdrs) + "\r\n"
        self.sock.sendall(head.encode("latin-1") + (body or b""))
        try:
            for piece in chunks or []:
                if piece and chunked:
                    self.sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
                elif piece:
                    self.sock.sendall(piece)
            if chunked:
                tail = "".join("%s: %s\r\n" % kv for kv in (trailers or []))
                self.sock.sendall(b"0\r\n" + tail.encode("latin-1") + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered (413...) and closed before the body ended: read the answer
        if read_delay:
            time.sleep(read_delay)
        resp = self.reader.read_response(method, sink=sink)
        resp.trailers = None
        resp.interim = []
        return resp


def _pairs(headers):
    if headers is None:
        return []
    return list(headers.items()) if isinstance(headers, dict) else list(headers)


class Proto:
    """The protocol a parametrised test runs over ("http1" or "h2c").

    Configs: `proto.gateway(port, ...)` is helpers.gateway() plus an h2c
    listener on a second free port (both listeners are in every runtime, so
    one config serves either protocol). Requests: `proto.request(port, ...)`
    goes to the listener of this protocol of the Gateway made for `port`.
    """

    def __init__(self, name):
        assert name in PROTOS, name
        self.name = name
        self.h2c_ports = {}

    def __repr__(self):
        return self.name

    @property
    def h2(self):
        return self.name == "h2c"

    def gateway(self, port, **kw):
        doc = gateway(port, **kw)
        h2c_port = free_port()
        doc["spec"]["listeners"].append({"name": "h2c", "port": h2c_port, "protocol": "h2c",
                                         "address": doc["spec"]["listeners"][0]["address"]})
        self.h2c_ports[port] = h2c_port
        return doc

    def port(self, port):
        """The port to connect to for this protocol."""
        if not self.h2:
            return port
        assert port in self.h2c_ports, "port %d has no h2c listener: make its Gateway with " \
            "proto.gateway()" % port
        return self.h2c_ports[port]

    def connection(self, port, timeout=10.0):
        if self.h2:
            return H2Connection(self.port(port), timeout=timeout)
        return H1Connection(port, timeout=timeout)

    def request(self, port, method, target, headers=None, body=None, host="example.com",
                timeout=10.0, chunks=None, trailers=None, sink=None, read_delay=0):
        """One request on a fresh connection; returns a helpers.Response.
        body: bytes (sent with its Content-Length); or chunks: an iterable
        of pieces (HTTP/1.1: chunked, unless headers carry Content-Length;
        HTTP/2: one or more DATA frames each), optionally with trailers.
        sink: receives the response body in pieces instead of Response.body.
        read_delay: seconds to wait after sending before reading."""
        c = self.connection(port, timeout)
        try:
            return c.request(method, target, headers, body, host=host, chunks=chunks,
                             trailers=trailers, timeout=timeout, sink=sink,
                             read_delay=read_delay)
        finally:
            c.close()

    @property
    def via_version(self):
        """The received-protocol a Via added to the forwarded request names
        (RFC 9110 7.6.3)."""
        return "2" if self.h2 else "1.1"

    @property
    def log_protocol(self):
        """The access log's protocol field for a request of this protocol."""
        return "HTTP/2.0" if self.h2 else "HTTP/1.1"
