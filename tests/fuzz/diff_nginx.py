#!/usr/bin/python3
"""Differential check of Sluice's HTTP/1.1 request framing against nginx.

The same byte strings (framing edge cases: Content-Length / Transfer-Encoding
combinations, chunk sizes and extensions, pipelined pairs, odd whitespace) go
to a private nginx (own prefix in a temp dir, free loopback port, `return 200`
for every request, keep-alive) and through runtime/http/http1.c via a small shared
library (tests/fuzz/diff_helper.c, loaded with ctypes). nginx's access log
says, per request, its status and $request_length (bytes of that request,
body included), so both sides give "where each message ends". They must
agree, or ours must reject.

Then DIFF_RANDOM (default 300) deterministic random mutants of those cases;
for them only framing differences fail (different ends, or nginx serving a
request while we wait for bytes): a request only one side refuses is closed
there, not read differently, and is counted, not failed.

Usage: /usr/bin/python3 tests/fuzz/diff_nginx.py [-v]
Exit status 0 when there is no disagreement, 1 otherwise (2: set-up failed).
Not part of the unit suite; runs in well under 2 minutes.
"""
import ctypes
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("FUZZ_BUILD", os.path.join(ROOT, "build", "fuzz"))
VERBOSE = "-v" in sys.argv

# nginx statuses that end the connection without the request being served:
# the request was refused, as ours does with SL_ERROR.
NGINX_REFUSALS = {400, 408, 411, 413, 414, 494, 501, 505}

END, INCOMPLETE, REJECTED, CLOSED = 0, 1, 2, 3
FINAL_NAMES = {END: "end", INCOMPLETE: "incomplete", REJECTED: "rejected", CLOSED: "closed"}


def build_helper():
    """Compiles diff_helper.c + runtime/http/http1.c into a shared library."""
    out_dir = os.path.join(BUILD, "diff")
    os.makedirs(out_dir, exist_ok=True)
    lib = os.path.join(out_dir, "libsldiff.so")
    srcs = [os.path.join(ROOT, "tests/fuzz/diff_helper.c"), os.path.join(ROOT, "runtime/http/http1.c")]
    if not os.path.exists(lib) or any(os.path.getmtime(s) > os.path.getmtime(lib) for s in srcs):
        cc = os.environ.get("CC", "cc")
        subprocess.run([cc, "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O2", "-g",
                        "-D_GNU_SOURCE", "-fPIC", "-shared",
                        "-I" + os.path.join(ROOT, "common"), "-I" + os.path.join(ROOT, "runtime"), "-I" + os.path.join(ROOT, "runtime/http"),
                        "-o", lib] + srcs, check=True)
    so = ctypes.CDLL(lib)
    so.sl_diff_frame.restype = ctypes.c_int
    so.sl_diff_frame.argtypes = [ctypes.c_char_p, ctypes.c_size_t,
                                 ctypes.POINTER(ctypes.c_size_t), ctypes.c_int,
                                 ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
                                 ctypes.c_char_p, ctypes.c_size_t]
    return so


def ours(so, data):
    ends = (ctypes.c_size_t * 16)()
    final, status = ctypes.c_int(), ctypes.c_int()
    err = ctypes.create_string_buffer(256)
    n = so.sl_diff_frame(data, len(data), ends, 16, ctypes.byref(final), ctypes.byref(status),
                         err, 256)
    return [ends[i] for i in range(n)], final.value, status.value, err.value.decode()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NGINX_CONF = """
{user}
worker_processes 1;
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 64; }}
http {{
    log_format diff '$server_port $connection $connection_requests $status $request_length';
    access_log {prefix}/access.log diff;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    keepalive_requests 1000;
    keepalive_timeout 10s;
    client_header_timeout 2s;
    client_body_timeout 2s;
    # The front server proxies, so that it reads every request body in full
    # (proxy_request_buffering) and $request_length counts body bytes too;
    # `return` alone would log the head only and discard the body later.
    server {{
        listen 127.0.0.1:{port};
        server_name _;
        location / {{
            proxy_pass http://127.0.0.1:{backend_port};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # the test half-closes after sending; pipelined requests must
            # still be served
            proxy_ignore_client_abort on;
        }}
    }}
    server {{
        listen 127.0.0.1:{backend_port};
        server_name _;
        location / {{ return 200 "ok\\n"; }}
    }}
}}
"""


class Nginx:
    def __init__(self):
        self.prefix = tempfile.mkdtemp(prefix="sluice-diff-nginx-")
        self.port = free_port()
        self.backend_port = free_port()
        user = "user root;" if os.geteuid() == 0 else ""
        conf = os.path.join(self.prefix, "nginx.conf")
        with open(conf, "w") as f:
            f.write(NGINX_CONF.format(user=user, prefix=self.prefix, port=self.port,
                                      backend_port=self.backend_port))
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        self.proc = subprocess.Popen([nginx, "-p", self.prefix, "-c", conf],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("nginx exited: " + self.proc.stderr.read().decode())
                time.sleep(0.05)
        else:
            raise RuntimeError("nginx did not start listening on port %d" % self.port)
        self.log = os.path.join(self.prefix, "access.log")
        self.log_pos = 0

    def frame(self, data):
        """Sends data on a fresh connection, half-closes, reads to EOF.
        Returns ([(status, request_length)], responses received)."""
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            got = b""
            while True:
                try:
                    chunk = s.recv(65536)
                except (ConnectionResetError, socket.timeout):
                    break
                if not chunk:
                    break
                got += chunk
        finally:
            s.close()
        # The log line of the connection's last request is written when the
        # request is freed, just before or after the close we saw.
        entries = []
        deadline = time.time() + 1.0
        while True:
            with open(self.log, "rb") as f:
                f.seek(self.log_pos)
                new = f.read()
            if new.endswith(b"\n") and new and time.time() > deadline - 0.9:
                break
            if time.time() > deadline:
                break
            time.sleep(0.02)
        self.log_pos += len(new)
        for line in new.decode().splitlines():
            parts = line.split()
            if len(parts) == 5 and int(parts[0]) == self.port:
                entries.append((int(parts[3]), int(parts[4])))
        return entries, got.count(b"HTTP/1.1 ")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.prefix, ignore_errors=True)


def compare(data, mine, theirs):
    """Returns (verdict, explanation); verdict is agree, ours-rejects or DISAGREE
    (main() turns a DISAGREE listed in KNOWN into known)."""
    ends, final, status, err = mine
    served, ng_ends, total, refused = [], [], 0, None
    for st, length in theirs:
        if st in NGINX_REFUSALS:
            refused = (st, length)
            break
        # nginx skips empty lines before a request line without counting
        # them in $request_length; they belong before that request.
        while data[total:total + 2] == b"\r\n" or data[total:total + 1] == b"\n":
            total += 2 if data[total:total + 1] == b"\r" else 1
        total += length
        served.append(st)
        ng_ends.append(total)
    for i in range(min(len(ends), len(ng_ends))):
        if ends[i] != ng_ends[i]:
            return "DISAGREE", ("request %d ends at byte %d for us, %d for nginx"
                                % (i + 1, ends[i], ng_ends[i]))
    if len(ends) > len(ng_ends):
        i = len(ng_ends)
        what = ("refuses it with %d" % refused[0]) if refused else "never answers it"
        return "DISAGREE", ("we accept request %d (ending at byte %d); nginx %s"
                            % (i + 1, ends[i], what))
    if len(ends) < len(ng_ends):
        i = len(ends)
        if final == REJECTED:
            return "ours-rejects", ("request %d: we answer %d (%s); nginx serves it (%d, %d bytes)"
                                    % (i + 1, status, err, served[i], ng_ends[i] - (ng_ends[i - 1] if i else 0)))
        return "DISAGREE", ("request %d: nginx serves it (ends at byte %d) but we say %s"
                            % (i + 1, ng_ends[i], FINAL_NAMES[final]))
    # Same requests served: the states after them must be compatible.
    if final == REJECTED and refused is None and ends and ends[-1] < len(data):
        # nginx left the rest unanswered (e.g. it closed), we refused it
        return "agree", "both stop at byte %d (we refuse the rest with %d)" % (ends[-1], status)
    if final == REJECTED and refused is not None:
        return "agree", "both refuse request %d (we %d: %s; nginx %d)" % (
            len(ends) + 1, status, err, refused[0])
    if final == REJECTED:
        return "ours-rejects", "request %d: we answer %d (%s); nginx does not answer" % (
            len(ends) + 1, status, err)
    if refused is not None and final == INCOMPLETE:
        return "agree", "both see request %d cut short (nginx %d)" % (len(ends) + 1, refused[0])
    if refused is not None and final in (END, CLOSED):
        if final == CLOSED:
            return "agree", "both stop after request %d (connection close)" % len(ends)
        return "DISAGREE", "nginx refuses bytes after request %d (%d) that we do not see" % (
            len(ends), refused[0])
    return "agree", "%d request(s), same ends %s" % (len(ends), ends)


# Disagreements where nginx 1.22 refuses a message that RFC 9110/9112 allow
# and ours frames it; none is a framing difference (nginx closes the
# connection, it never reads the bytes as something else). Printed as
# "known", not counted as failures. Anything else fails the run.
KNOWN = {
    "cl tab value": "HTAB is OWS (RFC 9110 5.6.3); nginx only strips SP after the value",
    "te with trailing comma": "empty list elements must be ignored (RFC 9110 5.6.1); nginx 501",
    "te leading comma": "empty list elements must be ignored (RFC 9110 5.6.1); nginx 501",
    "lowercase method": "methods are case-sensitive tokens, 'get' is an unknown method; nginx "
                        "accepts upper case only",
    "asterisk options": "asterisk-form is valid for OPTIONS (RFC 9112 3.2.4); nginx 400",
}

H = b"Host: a\r\n"
G = b"GET / HTTP/1.1\r\n" + H + b"\r\n"


def post(headers, body=b"", version=b"1.1"):
    return b"POST /p HTTP/" + version + b"\r\n" + H + headers + b"\r\n" + body


CASES = [
    ("get", G),
    ("pipelined gets", G + G + G),
    ("leading CRLF", b"\r\n" + G + G),
    ("cl body then get", post(b"Content-Length: 5\r\n", b"hello") + G),
    ("cl 0 then get", post(b"Content-Length: 0\r\n") + G),
    ("get with cl body", b"GET / HTTP/1.1\r\n" + H + b"Content-Length: 3\r\n\r\nabc" + G),
    ("cl leading zeros", post(b"Content-Length: 005\r\n", b"hello") + G),
    ("cl plus sign", post(b"Content-Length: +5\r\n", b"hello") + G),
    ("cl negative", post(b"Content-Length: -1\r\n", b"") + G),
    ("cl hex", post(b"Content-Length: 0x5\r\n", b"hello") + G),
    ("cl trailing space", post(b"Content-Length: 5 \r\n", b"hello") + G),
    ("cl list same", post(b"Content-Length: 5, 5\r\n", b"hello") + G),
    ("cl twice same", post(b"Content-Length: 5\r\nContent-Length: 5\r\n", b"hello") + G),
    ("cl twice differ", post(b"Content-Length: 5\r\nContent-Length: 3\r\n", b"hello") + G),
    ("cl huge", post(b"Content-Length: 99999999999999999999\r\n", b"x") + G),
    ("cl space before colon", post(b"Content-Length : 5\r\n", b"hello") + G),
    ("cl tab value", post(b"Content-Length:\t5\t\r\n", b"hello") + G),
    ("chunked", post(b"Transfer-Encoding: chunked\r\n", b"5\r\nhello\r\n0\r\n\r\n") + G),
    ("chunked upper hex", post(b"Transfer-Encoding: chunked\r\n", b"A\r\n0123456789\r\n0\r\n\r\n") + G),
    ("chunked leading zeros", post(b"Transfer-Encoding: chunked\r\n", b"0005\r\nhello\r\n000\r\n\r\n") + G),
    ("chunked extension", post(b"Transfer-Encoding: chunked\r\n", b"5;a=b;c=\"d e\"\r\nhello\r\n0;x\r\n\r\n") + G),
    ("chunked trailers", post(b"Transfer-Encoding: chunked\r\n", b"5\r\nhello\r\n0\r\nX-T: 1\r\nContent-Length: 99\r\n\r\n") + G),
    ("chunked size overflow", post(b"Transfer-Encoding: chunked\r\n", b"10000000000000001\r\nx\r\n0\r\n\r\n") + G),
    ("chunked 0x prefix", post(b"Transfer-Encoding: chunked\r\n", b"0x5\r\nhello\r\n0\r\n\r\n") + G),
    ("chunked space before ext", post(b"Transfer-Encoding: chunked\r\n", b"5 ;a=b\r\nhello\r\n0\r\n\r\n") + G),
    ("chunked space after size", post(b"Transfer-Encoding: chunked\r\n", b"5 \r\nhello\r\n0\r\n\r\n") + G),
    ("chunked negative", post(b"Transfer-Encoding: chunked\r\n", b"-5\r\nhello\r\n0\r\n\r\n") + G),
    ("chunked data too long", post(b"Transfer-Encoding: chunked\r\n", b"3\r\nhello\r\n0\r\n\r\n") + G),
    ("chunked bare LF size line", post(b"Transfer-Encoding: chunked\r\n", b"5\nhello\r\n0\r\n\r\n") + G),
    ("chunked bare LF after data", post(b"Transfer-Encoding: chunked\r\n", b"5\r\nhello\n0\r\n\r\n") + G),
    ("chunked last chunk bare LF", post(b"Transfer-Encoding: chunked\r\n", b"5\r\nhello\r\n0\n\n") + G),
    ("chunked no final CRLF, next request", post(b"Transfer-Encoding: chunked\r\n", b"0\r\n") + G),
    ("te and cl", post(b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n") + G),
    ("cl and te", post(b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n", b"0\r\n\r\n") + G),
    ("te gzip, chunked", post(b"Transfer-Encoding: gzip, chunked\r\n", b"0\r\n\r\n") + G),
    ("te chunked, gzip", post(b"Transfer-Encoding: chunked, gzip\r\n", b"0\r\n\r\n") + G),
    ("te chunked twice", post(b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n") + G),
    ("te Chunked case", post(b"Transfer-Encoding: Chunked\r\n", b"0\r\n\r\n") + G),
    ("te identity", post(b"Transfer-Encoding: identity\r\n", b"") + G),
    ("te empty", post(b"Transfer-Encoding:\r\n", b"") + G),
    ("te with trailing comma", post(b"Transfer-Encoding: chunked,\r\n", b"0\r\n\r\n") + G),
    ("te leading comma", post(b"Transfer-Encoding: , chunked\r\n", b"0\r\n\r\n") + G),
    ("te vertical tab", post(b"Transfer-Encoding: \x0bchunked\r\n", b"0\r\n\r\n") + G),
    ("te space before colon", post(b"Transfer-Encoding : chunked\r\n", b"0\r\n\r\n") + G),
    ("te in http/1.0", post(b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n", b"0\r\n\r\n", b"1.0") + G),
    ("te obs-fold", post(b"Transfer-Encoding:\r\n chunked\r\n", b"0\r\n\r\n") + G),
    ("header bare LF", b"GET / HTTP/1.1\nHost: a\n\n" + G),
    ("header obs-fold", b"GET / HTTP/1.1\r\n" + H + b"X: a\r\n b\r\n\r\n" + G),
    ("header no colon", b"GET / HTTP/1.1\r\n" + H + b"Junk\r\n\r\n" + G),
    ("header NUL", b"GET / HTTP/1.1\r\n" + H + b"X: a\x00b\r\n\r\n" + G),
    ("header empty name", b"GET / HTTP/1.1\r\n" + H + b": v\r\n\r\n" + G),
    ("header underscore", b"GET / HTTP/1.1\r\n" + H + b"X_Y: v\r\n\r\n" + G),
    ("request line double space", b"GET  / HTTP/1.1\r\n" + H + b"\r\n" + G),
    ("request line leading space", b" / HTTP/1.1\r\n" + H + b"\r\n" + G),
    ("request line tab", b"GET\t/ HTTP/1.1\r\n" + H + b"\r\n" + G),
    ("lowercase method", b"get / HTTP/1.1\r\n" + H + b"\r\n" + G),
    ("odd method", b"M-SEARCH / HTTP/1.1\r\n" + H + b"\r\n" + G),
    ("absolute form", b"GET http://a/ HTTP/1.1\r\n" + H + b"\r\n" + G),
    ("asterisk options", b"OPTIONS * HTTP/1.1\r\n" + H + b"\r\n" + G),
    ("http/1.0 default close", b"GET / HTTP/1.0\r\n\r\n" + G),
    ("http/1.0 keep-alive", b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" + G),
    ("http/1.1 close", b"GET / HTTP/1.1\r\n" + H + b"Connection: close\r\n\r\n" + G),
    ("http/0.9", b"GET /\r\n\r\n"),
    ("http/2.0 line", b"GET / HTTP/2.0\r\n" + H + b"\r\n"),
    ("http/1.2", b"GET / HTTP/1.2\r\n" + H + b"\r\n" + G),
    ("no host", b"GET / HTTP/1.1\r\n\r\n" + G),
    ("two hosts", b"GET / HTTP/1.1\r\n" + H + b"Host: b\r\n\r\n" + G),
    ("expect continue", post(b"Expect: 100-continue\r\nContent-Length: 5\r\n", b"hello") + G),
    ("head pipelined", b"HEAD / HTTP/1.1\r\n" + H + b"\r\n" + G),
    ("incomplete head", b"GET / HTTP/1.1\r\nHost: a\r\n"),
    ("incomplete cl body", post(b"Content-Length: 10\r\n", b"hello")),
    ("incomplete chunk", post(b"Transfer-Encoding: chunked\r\n", b"5\r\nhel")),
    ("cr only line end", b"GET / HTTP/1.1\r" + H + b"\r\n" + G),
    ("fragment in target", b"GET /a#b HTTP/1.1\r\n" + H + b"\r\n" + G),
    ("space in target", b"GET /a b HTTP/1.1\r\n" + H + b"\r\n" + G),
    ("high bytes in target", b"GET /\xff\xfe HTTP/1.1\r\n" + H + b"\r\n" + G),
]


TOKENS = [b"\r\n", b"\n", b"\r", b" ", b"\t", b"0", b"5", b"a", b";", b",", b"chunked",
          b"Content-Length: 3\r\n", b"Transfer-Encoding: chunked\r\n", b"\r\n\r\n", b"0\r\n\r\n",
          b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", b"\x00", b"\x7f", b"HTTP/1.0", b":"]


def mutants(count, seed=20261130):
    """Deterministic random edits of the cases: insert, delete, replace or
    splice tokens at random places (the same list on every run)."""
    import random
    rng = random.Random(seed)
    for i in range(count):
        name, data = CASES[rng.randrange(len(CASES))]
        data = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(data) + 1)
            op = rng.randrange(3)
            if op == 0:
                data[pos:pos] = rng.choice(TOKENS)
            elif op == 1 and data:
                del data[pos:pos + rng.randint(1, 4)]
            else:
                data[pos:pos + 1] = rng.choice(TOKENS)
        yield "mutant %d of %s" % (i, name), bytes(data)


def framing_only(verdict, why):
    """In random mode only framing differences count: different ends, or
    nginx serving a request where we wait for more bytes. A request that
    only one side refuses is not a desync (the refusing side closes)."""
    return verdict == "DISAGREE" and ("ends at byte" in why or "but we say" in why)


def main():
    try:
        so = build_helper()
        ng = Nginx()
    except (OSError, RuntimeError, subprocess.CalledProcessError) as e:
        print("diff_nginx: set-up failed: %s" % e)
        return 2
    counts = {"agree": 0, "ours-rejects": 0, "known": 0, "DISAGREE": 0}
    t0 = time.time()
    try:
        for name, data in CASES:
            mine = ours(so, data)
            theirs, responses = ng.frame(data)
            verdict, why = compare(data, mine, theirs)
            if verdict == "DISAGREE" and name in KNOWN:
                verdict, why = "known", why + "; " + KNOWN[name]
            counts[verdict] += 1
            if verdict != "agree" or VERBOSE:
                print("%-12s %-36s %s" % (verdict, name, why))
                if VERBOSE or verdict in ("DISAGREE", "known"):
                    print("             input %r" % data)
                    print("             ours: ends %s, %s%s; nginx: %s"
                          % (mine[0], FINAL_NAMES[mine[1]],
                             (" %d (%s)" % (mine[2], mine[3])) if mine[1] == REJECTED else "",
                             theirs))
        nrandom = int(os.environ.get("DIFF_RANDOM", "300"))
        for name, data in mutants(nrandom):
            mine = ours(so, data)
            theirs, responses = ng.frame(data)
            verdict, why = compare(data, mine, theirs)
            if verdict == "DISAGREE" and not framing_only(verdict, why):
                verdict = "refusal-only"
            counts[verdict] = counts.get(verdict, 0) + 1
            if verdict == "DISAGREE" or (VERBOSE and verdict != "agree"):
                print("%-12s %-36s %s" % (verdict, name, why))
                print("             input %r" % data)
                print("             ours: ends %s, %s%s; nginx: %s"
                      % (mine[0], FINAL_NAMES[mine[1]],
                         (" %d (%s)" % (mine[2], mine[3])) if mine[1] == REJECTED else "",
                         theirs))
    finally:
        ng.stop()
    print("diff_nginx: %d cases + %d random mutants in %.1fs: %d agree, %d where only ours "
          "rejects, %d known (nginx stricter than the RFC), %d mutants where only nginx "
          "refuses, %d DISAGREE"
          % (len(CASES), nrandom, time.time() - t0, counts["agree"], counts["ours-rejects"],
             counts["known"], counts.get("refusal-only", 0), counts["DISAGREE"]))
    return 1 if counts["DISAGREE"] else 0


if __name__ == "__main__":
    sys.exit(main())
