#!/usr/bin/env python3
"""perf/h2_slow_reader.py: one large download over HTTP/2 (TLS, ALPN h2) read
at a bounded rate, while sampling the resident memory of the proxy serving it.
Used by perf/bench.sh (test h2_slow_reader); can be run alone.

The client reads from its socket at most --rate bytes per second and grants
HTTP/2 flow-control credit only for what it has read, with the default 64 KB
windows. The origin behind the proxy can send far faster than that, so the
proxy must stop reading from the origin (backpressure) rather than buffer the
difference: its RSS should stay flat. RSS (VmRSS of every --pid, summed: nginx
master + worker) is read before the request (idle) and every --sample seconds
until the last byte.

Prints one JSON object: status, bytes, expect, seconds, idle_kb, peak_kb,
samples.
Exit status 1 when the answer is not 200 with exactly --expect bytes.
"""
import argparse
import json
import socket
import ssl
import sys
import time

import h2.config
import h2.connection
import h2.events


def rss_kb(pids):
    total = 0
    for pid in pids:
        try:
            with open("/proc/%d/status" % pid) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
        except FileNotFoundError:
            sys.exit("process %d is gone" % pid)
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--path", default="/big")
    ap.add_argument("--rate", type=float, default=64 << 20, help="bytes per second")
    ap.add_argument("--expect", type=int, required=True, help="body length in bytes")
    ap.add_argument("--pid", type=int, action="append", required=True)
    ap.add_argument("--sample", type=float, default=0.05)
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()

    idle = rss_kb(a.pid)
    peak, samples = idle, 1

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the run's self-signed certificate
    ctx.set_alpn_protocols(["h2"])
    raw = socket.create_connection(("127.0.0.1", a.port), timeout=30)
    sock = ctx.wrap_socket(raw, server_hostname="bench.example")
    if sock.selected_alpn_protocol() != "h2":
        sys.exit("ALPN chose %r, not h2" % sock.selected_alpn_protocol())

    # Default windows (65,535 bytes for the stream and the connection): the
    # proxy may have at most that much in flight beyond what the kernel's
    # socket buffers hold, whatever the origin sends.
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [(":method", "GET"), (":scheme", "https"),
                            (":authority", "bench.example"), (":path", a.path)],
                      end_stream=True)
    sock.sendall(conn.data_to_send())

    status, got, done = None, 0, False
    start = next_sample = time.monotonic()
    read = 0  # bytes taken from the socket, what the rate bounds
    while not done:
        now = time.monotonic()
        if now - start > a.timeout:
            sys.exit("timed out after %d of %d bytes" % (got, a.expect))
        if now >= next_sample:
            r = rss_kb(a.pid)
            peak, samples = max(peak, r), samples + 1
            next_sample = now + a.sample
        allowed = int(a.rate * (now - start)) - read
        if allowed <= 0:
            time.sleep(min(-allowed / a.rate + 0.001, a.sample))
            continue
        data = sock.recv(min(allowed, 16384))
        if not data:
            sys.exit("connection closed after %d of %d bytes" % (got, a.expect))
        read += len(data)
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                status = int(dict(ev.headers)[b":status"])
            elif isinstance(ev, h2.events.DataReceived):
                got += len(ev.data)
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                done = True
            elif isinstance(ev, h2.events.ConnectionTerminated):
                sys.exit("GOAWAY after %d of %d bytes" % (got, a.expect))
        out = conn.data_to_send()
        if out:
            sock.sendall(out)
    seconds = time.monotonic() - start
    peak = max(peak, rss_kb(a.pid))
    sock.close()
    print(json.dumps({"status": status, "bytes": got, "expect": a.expect, "seconds": round(seconds, 2),
                      "idle_kb": idle, "peak_kb": peak, "samples": samples + 1}))
    return 0 if status == 200 and got == a.expect else 1


if __name__ == "__main__":
    sys.exit(main())
