"""The clickhouse traffic log sink against Debian's real clickhouse-server
(18.16): the CREATE TABLE of docs/configuration.md ("ClickHouse table"),
every record loaded with its values (compared with the same records of a
file sink), the database option and the database.table form, HTTP basic
auth (a wrong password is dropped, counted and logged with ClickHouse's
message), and a server that is stopped and started again: nothing lost.

One clickhouse-server per module (it takes a second to start), on free
loopback ports, with its data, tmp and log directories and a minimal
config.xml / users.xml written here."""

import calendar
import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from helpers import REPO, api, backend, free_port, gateway, request, wait_until

CLICKHOUSE = "/usr/sbin/clickhouse-server"
PASSWORD = "ch-pass-7"

pytestmark = pytest.mark.skipif(not os.path.exists(CLICKHOUSE),
                                reason="clickhouse-server is not installed (make deps)")


def docs_create_table():
    """The CREATE TABLE of docs/configuration.md: the test runs the statement
    users are told to run."""
    with open(os.path.join(REPO, "docs", "configuration.md")) as f:
        text = f.read()
    m = re.search(r"```sql\n(CREATE TABLE sluice_traffic \(.*?)```", text, re.S)
    assert m, "docs/configuration.md has no CREATE TABLE sluice_traffic block"
    return m.group(1)


class ClickHouse:
    def __init__(self, d):
        self.dir = d
        self.http_port, self.tcp_port = free_port(), free_port()
        for sub in ("data", "tmp", "log"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        with open(os.path.join(d, "config.xml"), "w") as f:
            f.write("""<?xml version="1.0"?>
<yandex>
    <logger>
        <level>information</level>
        <log>{d}/log/server.log</log>
        <errorlog>{d}/log/error.log</errorlog>
        <console>0</console>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <http_port>{http}</http_port>
    <tcp_port>{tcp}</tcp_port>
    <path>{d}/data/</path>
    <tmp_path>{d}/tmp/</tmp_path>
    <users_config>{d}/users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <mark_cache_size>5368709120</mark_cache_size>
</yandex>
""".format(d=d, http=self.http_port, tcp=self.tcp_port))
        with open(os.path.join(d, "users.xml"), "w") as f:
            f.write("""<?xml version="1.0"?>
<yandex>
    <profiles><default></default></profiles>
    <quotas><default></default></quotas>
    <users>
        <default>
            <password></password>
            <networks><ip>127.0.0.1</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
        <sluice>
            <password>{pw}</password>
            <networks><ip>127.0.0.1</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
        </sluice>
    </users>
</yandex>
""".format(pw=PASSWORD))
        self.proc = None

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.http_port

    def start(self):
        self.out = open(os.path.join(self.dir, "log", "stdout.log"), "ab")
        self.proc = subprocess.Popen(
            ["nice", "-n", "19", CLICKHOUSE, "--config-file=" + os.path.join(self.dir, "config.xml")],
            stdout=self.out, stderr=self.out, stdin=subprocess.DEVNULL, cwd=self.dir)

        def up():
            if self.proc.poll() is not None:
                raise AssertionError("clickhouse-server exited: " + self.logs())
            try:
                with urllib.request.urlopen(self.url + "/ping", timeout=1) as r:
                    return r.read() == b"Ok.\n"
            except OSError:
                return False
        wait_until(up, 60, interval=0.1, what="clickhouse-server answering /ping")
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        self.out.close()

    def logs(self):
        p = os.path.join(self.dir, "log", "error.log")
        return open(p).read()[-2000:] if os.path.exists(p) else ""

    def query(self, sql, **params):
        q = urllib.parse.urlencode(params)
        req = urllib.request.Request(self.url + "/" + ("?" + q if q else ""),
                                     data=sql.encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.read().decode()
        except urllib.error.HTTPError as e:
            raise AssertionError("ClickHouse: %s: %s" % (sql[:80], e.read().decode()))

    def rows(self, sql, **params):
        # 64-bit integers as JSON numbers, not strings.
        out = self.query(sql + " FORMAT JSONEachRow", output_format_json_quote_64bit_integers=0,
                         **params)
        return [json.loads(l) for l in out.splitlines() if l]

    def count(self, table):
        return int(self.query("SELECT count() FROM %s" % table))


@pytest.fixture(scope="module")
def clickhouse(tmp_path_factory):
    ch = ClickHouse(str(tmp_path_factory.mktemp("clickhouse"))).start()
    ch.query("CREATE DATABASE sluice")
    yield ch
    ch.stop()
    shutil.rmtree(ch.dir, ignore_errors=True)


def create_table(ch, database, table):
    ch.query(docs_create_table().replace("CREATE TABLE sluice_traffic",
                                         "CREATE TABLE " + table, 1), database=database)


def ch_sink(ch, name, **extra):
    s = {"name": name, "type": "clickhouse", "url": ch.url,
         "auth": {"username": "sluice", "password": PASSWORD},
         "batch": {"maxRecords": 50, "maxDelay": "100ms"},
         "retry": {"initialBackoff": "50ms", "maxBackoff": "300ms"}, "timeout": "2s"}
    s.update(extra)
    return s


def gw(port, sinks):
    g = gateway(port)
    g["spec"]["trafficLog"] = {"sinks": sinks}
    return g


def file_records(path, n):
    def read():
        if not os.path.exists(path):
            return None
        with open(path) as f:
            lines = [l for l in f.read().splitlines() if l]
        return [json.loads(l) for l in lines] if len(lines) >= n else None
    return wait_until(read, 10, what="%d records in %s" % (n, path))


def rfc3339_seconds(t):
    # 2024-05-01T12:00:00.123Z -> unix seconds (the DateTime keeps whole seconds)
    return calendar.timegm(time.strptime(t.split(".")[0], "%Y-%m-%dT%H:%M:%S"))


def test_clickhouse_records_with_their_values(clickhouse, runtimes, backends, tmp_path):
    """Every record reaches the docs' table with the values the file sink
    wrote: strings, numbers as numbers, time as a DateTime, no upstream_ms
    as NULL."""
    ch = clickhouse
    create_table(ch, "sluice", "sluice_traffic")
    b = backends("echo")
    port = free_port()
    log = str(tmp_path / "t.jsonl")
    docs = [gw(port, [{"name": "local", "type": "file", "path": log},
                      ch_sink(ch, "ch", database="sluice")]),
            backend("echo", [b.port]), api("t", "/t", "echo"),
            api("locked", "/locked", "echo",
                policies=[{"name": "ip-filter", "config": {"deny": ["127.0.0.0/8"]}}])]
    rt = runtimes(docs)
    assert request(port, "GET", "/t/a?x=1&y=%C3%A9", headers={
        "X-Request-Id": "rid-ch-1", "User-Agent": "agent \"quoted\" \\ é",
        "Referer": "http://ref.example/p"}).status == 200
    assert request(port, "POST", "/t/b", headers={"X-Request-Id": "rid-ch-2"},
                   body=b"p" * 1000).status == 200
    assert request(port, "DELETE", "/locked/c", headers={"X-Request-Id": "rid-ch-3"}).status == 403
    assert request(port, "GET", "/nowhere", headers={"X-Request-Id": "rid-ch-4"}).status == 404
    for i in range(5, 21):
        assert request(port, "GET", "/t/many/%d" % i,
                       headers={"X-Request-Id": "rid-ch-%d" % i}).status == 200
    n = 20
    recs = {r["request_id"]: r for r in file_records(log, n)}
    assert len(recs) == n
    wait_until(lambda: ch.count("sluice.sluice_traffic") >= n, 15,
               what="%d rows in ClickHouse" % n)
    rows = ch.rows("SELECT *, toUnixTimestamp(time) AS unix_time FROM sluice.sluice_traffic")
    assert len(rows) == n, rows
    for row in rows:
        rec = recs[row["request_id"]]
        assert row["unix_time"] == rfc3339_seconds(rec["time"]), (row, rec)
        for k, v in rec.items():
            if k == "time":
                continue
            if isinstance(v, float):
                assert abs(row[k] - v) < 1e-9, (k, row, rec)
            else:
                assert row[k] == v, (k, row[k], v)
        if "upstream_ms" not in rec:
            assert row["upstream_ms"] is None
    by = {r["request_id"]: r for r in rows}
    a = by["rid-ch-1"]
    assert (a["method"], a["path"], a["query"], a["status"]) == ("GET", "/t/a", "x=1&y=%C3%A9", 200)
    assert a["api"] == "default/t" and a["operation"] == "all" and a["fleet"] == "default"
    assert a["user_agent"] == "agent \"quoted\" \\ é" and a["referer"] == "http://ref.example/p"
    assert a["upstream"] == "127.0.0.1:%d" % b.port and a["upstream_ms"] is not None
    assert a["duration_ms"] >= a["upstream_ms"] >= 0
    assert by["rid-ch-2"]["method"] == "POST" and by["rid-ch-2"]["bytes_received"] == 1000
    assert by["rid-ch-2"]["bytes_sent"] > 0
    d = by["rid-ch-3"]
    assert (d["method"], d["status"], d["policy"]) == ("DELETE", 403, "ip-filter")
    assert d["upstream_ms"] is None and d["upstream"] == ""
    assert by["rid-ch-4"]["status"] == 404 and by["rid-ch-4"]["api"] == ""
    # The DateTime column works as one: the partition is the record's day.
    days = ch.query("SELECT DISTINCT toYYYYMMDD(time) FROM sluice.sluice_traffic").split()
    assert days == [time.strftime("%Y%m%d", time.gmtime(rfc3339_seconds(
        recs["rid-ch-1"]["time"])))] or len(days) == 2  # a run across midnight UTC
    wait_until(lambda: rt.metric("sluice_traffic_log_records_total", sink="ch",
                                 type="clickhouse") == n, 5, what="%d delivered" % n)
    assert rt.metric("sluice_traffic_log_dropped_total", sink="ch", type="clickhouse") == 0


def test_clickhouse_table_form_and_wrong_password(clickhouse, runtimes, backends):
    """table: database.table works like the database option; a wrong
    password is refused by ClickHouse (401): the records are dropped,
    counted and the log says why; the other sink is unaffected."""
    ch = clickhouse
    create_table(ch, "sluice", "by_table_form")
    b = backends("echo")
    port = free_port()
    bad = ch_sink(ch, "badpw", table="sluice.by_table_form")
    bad["auth"] = {"username": "sluice", "password": "not-the-password"}
    rt = runtimes([gw(port, [ch_sink(ch, "good", table="sluice.by_table_form"), bad]),
                   backend("echo", [b.port]), api("t", "/t", "echo")])
    for i in range(7):
        assert request(port, "GET", "/t/pw-%d" % i).status == 200
    wait_until(lambda: ch.count("sluice.by_table_form") >= 7, 15, what="7 rows")
    wait_until(lambda: rt.metric("sluice_traffic_log_dropped_total", sink="badpw",
                                 type="clickhouse") == 7, 10, what="7 drops counted")
    time.sleep(0.3)
    assert ch.count("sluice.by_table_form") == 7  # the bad sink inserted nothing
    assert rt.metric("sluice_traffic_log_records_total", sink="badpw", type="clickhouse") == 0
    assert rt.metric("sluice_traffic_log_records_total", sink="good", type="clickhouse") == 7
    log = rt.log()
    assert re.search(r"traffic log sink badpw: 7 record\(s\) dropped: the collector refused the "
                     r"batch with HTTP 401: Code: 193.*Wrong password for user sluice", log), log
    assert "not-the-password" not in log


def test_clickhouse_unknown_table_is_dropped_not_retried(clickhouse, runtimes, backends):
    """A table that does not exist: ClickHouse's message in the log, the
    records dropped and counted at once (no retry loop)."""
    ch = clickhouse
    b = backends("echo")
    port = free_port()
    rt = runtimes([gw(port, [ch_sink(ch, "notable", table="sluice.missing")]),
                   backend("echo", [b.port]), api("t", "/t", "echo")])
    for i in range(3):
        assert request(port, "GET", "/t/nt-%d" % i).status == 200
    wait_until(lambda: rt.metric("sluice_traffic_log_dropped_total", sink="notable",
                                 type="clickhouse") == 3, 10, what="3 drops counted")
    assert rt.metric("sluice_traffic_log_failed_batches_total", sink="notable",
                     type="clickhouse") == 0
    assert re.search(r"notable: 3 record\(s\) dropped: .*Table sluice.missing doesn't exist",
                     rt.log()), rt.log()


def test_clickhouse_down_then_back(clickhouse, runtimes, backends):
    """ClickHouse stopped: traffic is not slowed, records queue (failed
    batches counted, retried with backoff); started again: every record
    is inserted, none dropped."""
    ch = clickhouse
    create_table(ch, "sluice", "down_back")
    b = backends("echo")
    port = free_port()
    rt = runtimes([gw(port, [ch_sink(ch, "ch", table="sluice.down_back")]),
                   backend("echo", [b.port]), api("t", "/t", "echo")])
    assert request(port, "GET", "/t/before").status == 200
    wait_until(lambda: ch.count("sluice.down_back") == 1, 15, what="the first row")
    ch.stop()
    try:
        t0 = time.monotonic()
        for i in range(40):
            assert request(port, "GET", "/t/down-%d" % i).status == 200
        assert time.monotonic() - t0 < 10
        wait_until(lambda: rt.metric("sluice_traffic_log_failed_batches_total", sink="ch",
                                     type="clickhouse") > 0, 10, what="a failed delivery")
        assert "delivery failed (connect to 127.0.0.1:%d" % ch.http_port in rt.log()
        assert rt.metric("sluice_traffic_log_queue_records", sink="ch", type="clickhouse") == 40
    finally:
        ch.start()
    for i in range(5):
        assert request(port, "GET", "/t/after-%d" % i).status == 200
    wait_until(lambda: ch.count("sluice.down_back") >= 46, 20, what="46 rows")
    paths = sorted(r["path"] for r in ch.rows("SELECT path FROM sluice.down_back"))
    assert paths == sorted(["/t/before"] + ["/t/down-%d" % i for i in range(40)] +
                           ["/t/after-%d" % i for i in range(5)])
    assert rt.metric("sluice_traffic_log_dropped_total", sink="ch", type="clickhouse") == 0
    assert rt.metric("sluice_traffic_log_records_total", sink="ch", type="clickhouse") == 46
