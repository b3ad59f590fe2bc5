#!/usr/bin/python3
# Seeds for tests/fuzz/fuzz_h2_frames: byte 0 = driver options, then client
# frames (the driver itself sends the preface and an empty SETTINGS first).
# Run: /usr/bin/python3 tests/fuzz/h2_seeds.py tests/fuzz/corpus/fuzz_h2_frames (needs python3-h2).
import h2.connection, h2.config, sys, os
out = sys.argv[1]

def conn():
    c = h2.connection.H2Connection(h2.config.H2Configuration(
        client_side=True, validate_outbound_headers=False, normalize_outbound_headers=False,
        header_encoding=None))
    c.initiate_connection()
    data = c.data_to_send()
    assert data.startswith(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    return c, data[24:]

def get(path=b"/", extra=()):
    return [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"example.com"),
            (b":path", path)] + list(extra)

def write(name, opts, data):
    with open(os.path.join(out, name), "wb") as f:
        f.write(bytes([opts]) + data)

c, d = conn()
c.send_headers(1, get(b"/pets/1?x=1", [(b"cookie", b"a=1"), (b"accept", b"*/*"), (b"cookie", b"b=2")]), end_stream=True)
write("get_cookies", 0, d + c.data_to_send())

c, d = conn()
c.send_headers(1, [(b":method", b"POST"), (b":scheme", b"https"), (b":authority", b"a:8443"),
                   (b":path", b"/upload"), (b"content-length", b"11")])
c.send_data(1, b"hello ")
c.send_data(1, b"world", end_stream=True)
write("post_body", 0, d + c.data_to_send())

c, d = conn()
c.send_headers(1, [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", b"grpc"),
                   (b":path", b"/pkg.Svc/Method"), (b"te", b"trailers"),
                   (b"content-type", b"application/grpc")])
c.send_data(1, b"\x00\x00\x00\x00\x02hi")
c.send_headers(1, [(b"x-trailer", b"1")], end_stream=True)
write("post_trailers", 8, d + c.data_to_send())

c, d = conn()
for i in range(8):
    c.send_headers(1 + 2 * i, get(b"/many/%d" % i), end_stream=True)
write("many_streams_small_limits", 2, d + c.data_to_send())

c, d = conn()
c.send_headers(1, [(b":method", b"CONNECT"), (b":protocol", b"websocket"), (b":scheme", b"https"),
                   (b":authority", b"chat.example"), (b":path", b"/ws"),
                   (b"sec-websocket-version", b"13")])
c.send_data(1, b"\x81\x02hi")
write("extended_connect", 1, d + c.data_to_send())

c, d = conn()
for i in range(6):
    c.send_headers(1 + 2 * i, get(), end_stream=True)
    c.reset_stream(1 + 2 * i, 8)
write("rapid_reset", 2, d + c.data_to_send())

c, d = conn()
c.ping(b"12345678")
c.increment_flow_control_window(100000)
c.update_settings({h2.settings.SettingCodes.HEADER_TABLE_SIZE: 8192})
c.send_headers(1, get(b"/p"), end_stream=True)
c.ping(b"abcdefgh")
write("ping_settings_window", 4, d + c.data_to_send())

c, d = conn()
c.send_headers(1, get(b"/big", [(b"x-big", b"v" * 20000)]), end_stream=True)
write("continuation", 0, d + c.data_to_send())

c, d = conn()
c.send_headers(1, get(b"/big", [(b"x-big", b"v" * 400)]), end_stream=True)
write("over_header_list_431", 2, d + c.data_to_send())

c, d = conn()
c.send_headers(1, [(b":method", b"OPTIONS"), (b":scheme", b"https"), (b":authority", b"[::1]:443"),
                   (b":path", b"*")], end_stream=True)
c.send_headers(3, [(b":method", b"CONNECT"), (b":authority", b"a:443")])
c.send_headers(5, [(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/h"), (b"host", b"h.example")], end_stream=True)
write("options_connect_host", 0, d + c.data_to_send())
