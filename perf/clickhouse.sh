# perf/clickhouse.sh: a private clickhouse-server for perf/bench.sh (the
# clickhouse traffic log sink's far end). Sourced, not run. The same minimal
# config as tests/integration/test_traffic_log_clickhouse.py: loopback only,
# data/tmp/log under DIR, one passwordless user.
#
#   clickhouse_start DIR HTTP_PORT CPU   starts it pinned to CPU, waits for /ping;
#                                        sets CLICKHOUSE_PID
#   clickhouse_query HTTP_PORT SQL       runs one statement over HTTP
#   clickhouse_table_sql NAME            the CREATE TABLE of docs/configuration.md
#                                        ("ClickHouse table") for table NAME

CLICKHOUSE_SERVER=${CLICKHOUSE_SERVER:-/usr/sbin/clickhouse-server}

clickhouse_start() { # dir http_port cpu
    local d=$1 http=$2 cpu=$3 tcp
    [ -x "$CLICKHOUSE_SERVER" ] || { echo "clickhouse-server not found (make deps)" >&2; return 1; }
    tcp=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    mkdir -p "$d/data" "$d/tmp" "$d/log"
    cat >"$d/config.xml" <<XML
<?xml version="1.0"?>
<yandex>
    <logger><level>warning</level><log>$d/log/server.log</log><errorlog>$d/log/error.log</errorlog><console>0</console></logger>
    <listen_host>127.0.0.1</listen_host>
    <http_port>$http</http_port>
    <tcp_port>$tcp</tcp_port>
    <path>$d/data/</path>
    <tmp_path>$d/tmp/</tmp_path>
    <users_config>$d/users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <mark_cache_size>5368709120</mark_cache_size>
</yandex>
XML
    cat >"$d/users.xml" <<XML
<?xml version="1.0"?>
<yandex>
    <profiles><default></default></profiles>
    <quotas><default></default></quotas>
    <users><default><password></password><networks><ip>127.0.0.1</ip></networks><profile>default</profile><quota>default</quota></default></users>
</yandex>
XML
    (cd "$d" && exec taskset -c "$cpu" "$CLICKHOUSE_SERVER" --config-file="$d/config.xml" \
        >"$d/log/stdout.log" 2>&1 </dev/null) &
    CLICKHOUSE_PID=$!
    for _ in $(seq 300); do
        kill -0 "$CLICKHOUSE_PID" 2>/dev/null || return 1
        [ "$(curl -s "http://127.0.0.1:$http/ping" || true)" = "Ok." ] && return 0
        sleep 0.1
    done
    return 1
}

clickhouse_query() { # http_port sql
    local out
    out=$(curl -s -w '\n%{http_code}' --data-binary "$2" "http://127.0.0.1:$1/") || return 1
    [ "${out##*$'\n'}" = 200 ] || { echo "clickhouse: ${out%$'\n'*}" >&2; return 1; }
}

clickhouse_table_sql() { # name
    /usr/bin/python3 - "$1" "$(dirname "${BASH_SOURCE[0]}")/../docs/configuration.md" <<'PY'
import re, sys
text = open(sys.argv[2]).read()
m = re.search(r"```sql\n(CREATE TABLE sluice_traffic \(.*?)```", text, re.S)
if not m:
    sys.exit("docs/configuration.md has no CREATE TABLE sluice_traffic")
print(m.group(1).replace("CREATE TABLE sluice_traffic", "CREATE TABLE " + sys.argv[1], 1))
PY
}
