#!/usr/bin/env bash
# perf/tlog_soak.sh: a sustained run at a fixed request rate with the traffic
# log's file sink (issue 11, "Figures": "Sustained 10-minute run at a fixed
# rate with the file sink: zero drops, RSS flat").
#
# What it does: in a mktemp dir, starts an origin (nginx answering `return
# 200` with a 22-byte body, as perf/bench.sh does) and a standalone
# sluice-runtime (--config FILE --workers $WORKERS --admin 127.0.0.1:PORT)
# whose Gateway has one traffic log sink, `{name: soak, type: file}`, with
# size-based rotation (rotate.maxBytes $ROTATE_BYTES, keep $ROTATE_KEEP), and
# one Api proxying GET /soak/pets/{id} to the origin. Then for $SOAK_SECONDS
# an open-loop generator, `h2load --h1 --rps=R -c C -D S`, sends $RATE
# requests/s in total ($CLIENTS keep-alive connections at $RATE/$CLIENTS each;
# h2load issues requests on a timer, and a client that falls behind sends the
# missed ones as soon as it can, so the rate does not follow the latency).
# Every $SAMPLE_SECONDS it records the runtime's VmRSS, open descriptors and
# CPU time (/proc), from its admin /metrics the requests answered, the sink's
# records written and dropped, ring drops and the sink's queue, and the
# lines, bytes and files of the log on disk.
#
# Why rotation is on: a 10-minute run at 5,000 records/s writes about 2 GB;
# with rotation the disk stays bounded (maxBytes x (keep + 1), plus at most
# one batch) and the run exercises the rename/reopen of a live sink ~25
# times, with the oldest files deleted. Every record is still counted and
# checked: a reader (Python, in this script) follows the file and its
# rotated copies by inode, holds each open until it has read it to the end
# (a rotated file gets no more writes; a deleted one stays readable while
# open), counts its lines and parses every line with json.loads. It scans
# every second; a file lives for many seconds before it is deleted, and a
# file it missed would show as lines < records in the verdict.
#
# Verdict, after the load stops and the sink's queue and the workers' rings
# are empty: zero records dropped (sluice_traffic_log_dropped_total{sink=
# "soak"} and sluice_traffic_log_ring_dropped_total), records written ==
# requests answered (sluice_downstream_requests_total) == lines read from
# the files, every line valid JSON, h2load without errors or non-2xx,
# the achieved rate at least 98% of $RATE, VmRSS and fd count within 10%
# ((max - min) / min) over the samples after $WARMUP_SECONDS, and the runtime
# exiting 0 on SIGTERM with no [alert]/sanitizer line in its log.
# Exit status 0 when met, 1 when not, 2 on set-up failure.
#
# What it does not do: build anything (BUILD must hold bin/sluice-runtime),
# pin processes to CPUs, compare with other proxies or measure CPU cost per
# request as a target (perf/bench.sh's sluice-log-* variants do), or touch
# anything outside its mktemp dir (removed on exit) and $OUT. Every process
# it starts is stopped on exit, Ctrl-C and errors included (trap).
#
# Environment (all optional):
#   BUILD=build              tree holding bin/sluice-runtime
#   SOAK_SECONDS=600         length of the loaded run
#   SAMPLE_SECONDS=30        sampling period
#   WARMUP_SECONDS=60        samples before this are not judged for flatness
#   RATE=5000                requests/s in total (must divide by CLIENTS)
#   CLIENTS=10               h2load connections (-c); --rps = RATE / CLIENTS
#   WORKERS=2                runtime workers
#   ROTATE_BYTES=67108864    the sink's rotate.maxBytes (64 MiB)
#   ROTATE_KEEP=2            the sink's rotate.keep
#   OUT=docs/benchmarks-traffic-log-soak.md   ("-" = only print)
# Run it niced on a shared machine:  nice -n 10 perf/tlog_soak.sh
set -euo pipefail

cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
SOAK_SECONDS=${SOAK_SECONDS:-600}
SAMPLE_SECONDS=${SAMPLE_SECONDS:-30}
WARMUP_SECONDS=${WARMUP_SECONDS:-60}
RATE=${RATE:-5000}
CLIENTS=${CLIENTS:-10}
WORKERS=${WORKERS:-2}
ROTATE_BYTES=${ROTATE_BYTES:-67108864}
ROTATE_KEEP=${ROTATE_KEEP:-2}
OUT=${OUT:-docs/benchmarks-traffic-log-soak.md}
PY=/usr/bin/python3
RUNTIME="$BUILD/bin/sluice-runtime"
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
COMMAND="BUILD=$BUILD SOAK_SECONDS=$SOAK_SECONDS SAMPLE_SECONDS=$SAMPLE_SECONDS WARMUP_SECONDS=$WARMUP_SECONDS RATE=$RATE CLIENTS=$CLIENTS WORKERS=$WORKERS ROTATE_BYTES=$ROTATE_BYTES ROTATE_KEEP=$ROTATE_KEEP perf/tlog_soak.sh"

KEEP_WORK=0
die() {
    echo "tlog_soak: $*" >&2
    exit 2
}

[ -x "$RUNTIME" ] || die "$RUNTIME not found (build first: make BUILD=$BUILD)"
for t in h2load curl "$NGINX" "$PY"; do
    command -v "$t" >/dev/null || die "$t not installed (make deps)"
done
for v in SOAK_SECONDS SAMPLE_SECONDS RATE CLIENTS WORKERS ROTATE_BYTES ROTATE_KEEP; do
    if ! [[ ${!v} =~ ^[0-9]+$ ]] || [ "${!v}" -eq 0 ]; then
        die "$v must be a positive integer, not '${!v}'"
    fi
done
[[ $WARMUP_SECONDS =~ ^[0-9]+$ ]] || die "WARMUP_SECONDS must be a number of seconds, not '$WARMUP_SECONDS'"
[ $((RATE % CLIENTS)) -eq 0 ] ||
    die "RATE ($RATE) must be a multiple of CLIENTS ($CLIENTS): h2load's --rps is per connection"
RPS=$((RATE / CLIENTS))
[ "$SOAK_SECONDS" -ge "$((2 * SAMPLE_SECONDS))" ] ||
    die "SOAK_SECONDS ($SOAK_SECONDS) must be at least two samples ($((2 * SAMPLE_SECONDS)))"
[ "$ROTATE_BYTES" -ge 4096 ] || die "ROTATE_BYTES must be at least 4096 (the sink's minimum)"
[ "$ROTATE_KEEP" -le 100 ] || die "ROTATE_KEEP must be 1..100 (the sink's range)"

COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
WORK=$(mktemp -d /tmp/sluice-tlog-soak.XXXXXX)
# Disk: the files on disk never pass maxBytes x (keep + 1) plus one batch
# (1 MiB); ask for that and 1 GiB to spare.
need_kb=$(((ROTATE_BYTES / 1024) * (ROTATE_KEEP + 1) + 2 * 1024 * 1024))
free_kb=$(df -Pk "$WORK" | awk 'NR == 2 { print $4 }')
[ "$free_kb" -ge "$need_kb" ] || {
    rm -rf "$WORK"
    die "$WORK has ${free_kb} kB free; the log needs up to ${need_kb} kB (lower ROTATE_BYTES or ROTATE_KEEP)"
}

PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do
        kill -TERM "$p" 2>/dev/null || true
    done
    for p in "${PIDS[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    if [ "$KEEP_WORK" = 1 ]; then
        echo "tlog_soak: logs kept in $WORK (the traffic log files deleted)" >&2
        rm -f "$WORK"/traffic.jsonl*
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the log reader: follows traffic.jsonl and its rotated copies -----------
cat >"$WORK/reader.py" <<'EOF'
"""Counts and parses every line the file sink writes, across rotations.

A file is known by its inode and held open until read to its end. The sink
rotates by renaming PATH to PATH.1 (PATH.k to PATH.k+1, the last one
deleted) and only then opens a new PATH and writes, so a file that is not
PATH when a scan opens PATH gets no more writes: once read to its end, it
is closed and remembered as finished (a finished inode seen again as PATH
is a new file reusing the inode)."""
import json, os, signal, sys, time

path, counts_path, keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
live = {}          # (dev, ino) -> {"fd", "rest"}
finished = set()
c = {"lines": 0, "bytes": 0, "invalid": 0, "first_invalid": "", "status_200": 0,
     "files": 0, "disk_bytes": 0, "disk_files": 0, "max_disk_bytes": 0}
stop = False


def on_term(*_):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)


def check(line):
    try:
        rec = json.loads(line)
        if not isinstance(rec, dict):
            raise ValueError("not an object")
    except ValueError as e:
        c["invalid"] += 1
        if not c["first_invalid"]:
            c["first_invalid"] = "%s: %r" % (e, line[:200])
        return
    if rec.get("status") == 200:
        c["status_200"] += 1


def read_to_end(e):
    while True:
        chunk = os.read(e["fd"], 1 << 20)
        if not chunk:
            return
        c["bytes"] += len(chunk)
        data = e["rest"] + chunk
        lines = data.split(b"\n")
        e["rest"] = lines.pop()
        c["lines"] += len(lines)
        for line in lines:
            check(line)


def scan(final):
    names = [path] + ["%s.%d" % (path, k) for k in range(1, keep + 1)]
    live_key = None
    disk, nfiles = 0, 0
    for i, name in enumerate(names):
        try:
            fd = os.open(name, os.O_RDONLY)
        except FileNotFoundError:
            continue
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        disk += st.st_size
        nfiles += 1
        if i == 0:
            live_key = key
            finished.discard(key)  # an inode reused by the new PATH
        if key in live or key in finished:
            os.close(fd)
        else:
            live[key] = {"fd": fd, "rest": b""}
            c["files"] += 1
    for key in list(live):
        e = live[key]
        read_to_end(e)
        if key != live_key or final:
            if e["rest"]:  # a file must end with a whole line
                c["lines"] += 1
                check(e["rest"])
            os.close(e["fd"])
            del live[key]
            finished.add(key)
    c["disk_bytes"], c["disk_files"] = disk, nfiles
    c["max_disk_bytes"] = max(c["max_disk_bytes"], disk)
    with open(counts_path + ".tmp", "w") as f:
        json.dump(c, f)
    os.replace(counts_path + ".tmp", counts_path)


while not stop:
    scan(False)
    time.sleep(1.0)
scan(True)
EOF

# --- ports, origin ----------------------------------------------------------
read -r ORIGIN_PORT LISTEN ADMIN <<<"$("$PY" -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')"

wait_http() { # port path pid name
    local i code=""
    for ((i = 0; i < 100; i++)); do
        kill -0 "$3" 2>/dev/null || die "$4 exited during start-up; log: $(tail -5 "$WORK"/*.log 2>/dev/null)"
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://127.0.0.1:$1$2" || true)
        [ "$code" = 200 ] && return 0
        sleep 0.1
    done
    die "$4 on port $1 did not answer 200 within 10 s (last: $code)"
}

mkdir -p "$WORK/origin"
cat >"$WORK/origin/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $WORK/origin/nginx.pid;
error_log $WORK/origin/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $WORK/origin/client_body;
    proxy_temp_path $WORK/origin/proxy;
    fastcgi_temp_path $WORK/origin/fastcgi;
    uwsgi_temp_path $WORK/origin/uwsgi;
    scgi_temp_path $WORK/origin/scgi;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$ORIGIN_PORT;
        location / { default_type text/plain; return 200 "hello from the origin\n"; }
    }
}
EOF
# Started by root, nginx's worker runs as "nobody": let it reach its dir.
chmod a+x "$WORK" "$WORK/origin"
"$NGINX" -p "$WORK/origin" -c "$WORK/origin/nginx.conf" >"$WORK/origin.log" 2>&1 &
ORIGIN_PID=$!
PIDS+=("$ORIGIN_PID")
wait_http "$ORIGIN_PORT" / "$ORIGIN_PID" "origin nginx"

# --- the runtime --------------------------------------------------------------
LOG="$WORK/traffic.jsonl"
cat >"$WORK/sluice.yaml" <<EOF
apiVersion: gateway.sluice.dev/v1alpha1
kind: Gateway
metadata: {name: soak}
spec:
  listeners:
  - {name: http, port: $LISTEN, protocol: http, address: 127.0.0.1}
  trafficLog:
    sinks:
    - name: soak
      type: file
      path: $LOG
      rotate: {maxBytes: $ROTATE_BYTES, keep: $ROTATE_KEEP}
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Backend
metadata: {name: origin}
spec:
  endpoints:
  - {address: 127.0.0.1, port: $ORIGIN_PORT}
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Api
metadata: {name: soak}
spec:
  basePath: /soak
  backendRefs: [{name: origin}]
  operations:
  - {name: get-pet, method: GET, path: "/pets/{id}"}
EOF
# The config must read the same for every client: a strict YAML 1.2 parse
# (when python3-ruamel.yaml is there, as make deps installs it) and --check.
if "$PY" -c 'import ruamel.yaml' 2>/dev/null; then
    "$PY" - "$WORK/sluice.yaml" <<'EOF' || die "the generated config is not strict YAML 1.2"
import sys
import ruamel.yaml
y = ruamel.yaml.YAML(typ="safe", pure=True)
y.version = (1, 2)
y.allow_duplicate_keys = False
list(y.load_all(open(sys.argv[1])))
EOF
fi
"$RUNTIME" --check --config "$WORK/sluice.yaml" --log-level error >"$WORK/check.log" 2>&1 ||
    die "sluice-runtime --check refuses the config: $(cat "$WORK/check.log")"

"$RUNTIME" --config "$WORK/sluice.yaml" --workers "$WORKERS" --admin "127.0.0.1:$ADMIN" \
    --access-log off --log-level notice >"$WORK/runtime.log" 2>&1 &
RUNTIME_PID=$!
PIDS+=("$RUNTIME_PID")
wait_http "$LISTEN" /soak/pets/1 "$RUNTIME_PID" "sluice-runtime"
wait_http "$ADMIN" /metrics "$RUNTIME_PID" "sluice-runtime admin"

"$PY" "$WORK/reader.py" "$LOG" "$WORK/reader.json" "$ROTATE_KEEP" >"$WORK/reader.log" 2>&1 &
READER_PID=$!
PIDS+=("$READER_PID")

# --- sampling -------------------------------------------------------------------
# One scrape of /metrics -> "requests records dropped ring_dropped queue_records
# queue_bytes ring_bytes" (the sink's series by its label).
scrape() {
    curl -fsS --max-time 5 "http://127.0.0.1:$ADMIN/metrics" 2>/dev/null | awk '
        function v(name) { return (name in m) ? m[name] : -1 }
        /^#/ { next }
        { key = $1; sub(/\{.*/, "", key)
          if (key ~ /^sluice_traffic_log_(records|dropped)_total$|^sluice_traffic_log_queue_(records|bytes)$/) {
              if ($1 !~ /sink="soak"/) next }
          m[key] += $NF }
        END { printf "%d %d %d %d %d %d %d\n", v("sluice_downstream_requests_total"),
              v("sluice_traffic_log_records_total"), v("sluice_traffic_log_dropped_total"),
              v("sluice_traffic_log_ring_dropped_total"), v("sluice_traffic_log_queue_records"),
              v("sluice_traffic_log_queue_bytes"), v("sluice_traffic_log_ring_bytes") }'
}
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
fds() { find "/proc/$1/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
TICK=$(getconf CLK_TCK)
cpu_s() { # utime + stime of the process (all threads), seconds
    sed 's/.*) //' "/proc/$1/stat" | awk -v t="$TICK" '{ printf "%.1f", ($12 + $13) / t }'
}
reader() { # key
    "$PY" -c 'import json,sys
try: print(json.load(open(sys.argv[1])).get(sys.argv[2], 0))
except (OSError, ValueError): print(0)' "$WORK/reader.json" "$1"
}

SAMPLES="$WORK/samples.tsv"
printf '%b\n' "t_s\trss_kb\tfds\tcpu_s\trequests\treq_per_s\trecords\tdropped\tring_dropped\tqueue_records\tqueue_bytes\tlines\tlog_bytes\tlog_files\tdisk_bytes" |
    tee "$SAMPLES"
PREV_REQ=0 PREV_T=""
sample() { # label
    local now req rec drop ring qrec qbytes rbytes rate
    now=$EPOCHREALTIME
    read -r req rec drop ring qrec qbytes rbytes <<<"$(scrape)"
    [ "$req" -ge 0 ] 2>/dev/null || die "admin /metrics did not answer at ${1}s"
    if [ "$1" = end ]; then
        rate=-  # the load stopped before the drain
    elif [ -n "$PREV_T" ]; then
        rate=$(awk -v a="$PREV_REQ" -v b="$req" -v s="$PREV_T" -v e="$now" \
            'BEGIN { printf "%.0f", (b - a) / (e - s) }')
    else
        rate=0
    fi
    PREV_REQ=$req PREV_T=$now
    printf '%s\t%d\t%d\t%s\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n' "$1" \
        "$(rss_kb "$RUNTIME_PID")" "$(fds "$RUNTIME_PID")" "$(cpu_s "$RUNTIME_PID")" \
        "$req" "$rate" "$rec" "$drop" "$ring" "$qrec" "$qbytes" \
        "$(reader lines)" "$(reader bytes)" "$(reader files)" "$(reader disk_bytes)" | tee -a "$SAMPLES"
}

alive() { # when pid...
    local p when=$1
    shift
    for p in "$@"; do
        if ! kill -0 "$p" 2>/dev/null; then
            KEEP_WORK=1
            echo "--- runtime log (tail) ---" >&2
            tail -30 "$WORK/runtime.log" >&2
            echo "--- reader log ---" >&2
            cat "$WORK/reader.log" >&2
            die "process $p died at $when"
        fi
    done
}

echo "tlog_soak: ${SOAK_SECONDS}s at $RATE req/s ($CLIENTS x $RPS), runtime pid $RUNTIME_PID" \
    "(127.0.0.1:$LISTEN, admin $ADMIN), work dir $WORK"

# h2load runs 5 s past the last sample, so that sample never races with h2load
# closing its connections (it would show as an fd drop); the achieved rate is
# h2load's own figure.
H2LOAD=(h2load --h1 --rps="$RPS" -c "$CLIENTS" -D "$((SOAK_SECONDS + 5))"
    "http://127.0.0.1:$LISTEN/soak/pets/7")
"${H2LOAD[@]}" >"$WORK/h2load.txt" 2>&1 &
H2LOAD_PID=$!
PIDS+=("$H2LOAD_PID")

START=$EPOCHSECONDS
sample 0
for ((t = SAMPLE_SECONDS; t <= SOAK_SECONDS; t += SAMPLE_SECONDS)); do
    d=$((START + t - EPOCHSECONDS))
    [ "$d" -le 0 ] || sleep "$d"
    alive "${t}s" "$RUNTIME_PID" "$ORIGIN_PID" "$READER_PID"
    sample "$t"
done

H2_RC=0
wait "$H2LOAD_PID" || H2_RC=$?
LOAD_END=$EPOCHSECONDS

# Drain: the workers' rings and the sink's queue empty, every request
# accounted for (written or dropped); at most 30 s.
DRAINED=no
for ((i = 0; i < 300; i++)); do
    read -r req rec drop ring qrec qbytes rbytes <<<"$(scrape)"
    if [ "$qrec" -eq 0 ] && [ "$rbytes" -eq 0 ] && [ $((rec + drop)) -ge "$req" ]; then
        DRAINED=yes
        break
    fi
    sleep 0.1
done
DRAIN_S=$((EPOCHSECONDS - LOAD_END))
# The reader's last scan reads everything to the end.
alive "the drain" "$RUNTIME_PID" "$ORIGIN_PID" "$READER_PID"
kill -TERM "$READER_PID"
READER_RC=0
wait "$READER_PID" || READER_RC=$?
[ "$READER_RC" -eq 0 ] || {
    KEEP_WORK=1
    die "the log reader failed: $(tail -5 "$WORK/reader.log")"
}
alive "the end" "$RUNTIME_PID" "$ORIGIN_PID"
sample "end"

# --- figures and verdict ------------------------------------------------------------
H2OUT="$WORK/h2load.txt"
H2_RPS=$(awk '/^finished in/ { gsub(",", ""); print $4 }' "$H2OUT")
H2_SECS=$(awk '/^finished in/ { gsub("[s,]", "", $3); print $3 }' "$H2OUT")
H2_DONE=$(awk '/^requests:/ { print $6 }' "$H2OUT")
H2_BAD=$(awk '/^requests:/ { print $10 + $12 + $14 }' "$H2OUT")
H2_2XX=$(awk '/^status codes:/ { print $3 }' "$H2OUT")
H2_MEAN=$(awk '/^time for request:/ { print $6 }' "$H2OUT")
H2_MAX=$(awk '/^time for request:/ { print $5 }' "$H2OUT")
H2_DONE=${H2_DONE:-0} H2_BAD=${H2_BAD:-0} H2_2XX=${H2_2XX:-0}
[ -n "$H2_RPS" ] || {
    KEEP_WORK=1
    die "h2load printed no result (exit $H2_RC): $(tail -5 "$WORK/h2load.txt")"
}

END_ROW=$(tail -1 "$SAMPLES")
REQUESTS=$(cut -f5 <<<"$END_ROW")
RECORDS=$(cut -f7 <<<"$END_ROW")
DROPPED=$(cut -f8 <<<"$END_ROW")
RING_DROPPED=$(cut -f9 <<<"$END_ROW")
LINES=$(reader lines)
INVALID=$(reader invalid)
FIRST_INVALID=$(reader first_invalid)
STATUS_200=$(reader status_200)
LOG_FILES=$(reader files)
LOG_BYTES=$(reader bytes)
MAX_DISK=$(reader max_disk_bytes)
CPU_US=$(awk -F'\t' -v r="$REQUESTS" 'NR == 2 { a = $4 } END { if (r > 0) printf "%.1f", ($4 - a) * 1e6 / r }' "$SAMPLES")

# Flatness over the loaded samples after warm-up: (max - min) / min, in percent.
spread() { # column -> "min max drift"
    awk -F'\t' -v c="$1" -v w="$WARMUP_SECONDS" 'NR > 1 && $1 != "end" && $1 + 0 >= w {
        if (min == "" || $c < min) min = $c; if ($c > max) max = $c }
        END { if (min > 0) printf "%d %d %.1f\n", min, max, 100 * (max - min) / min; else print "0 0 n/a" }' "$SAMPLES"
}
read -r RSS_MIN RSS_MAX RSS_DRIFT <<<"$(spread 2)"
read -r FD_MIN FD_MAX FD_DRIFT <<<"$(spread 3)"
over10() { awk -v d="$1" 'BEGIN { exit !(d == "n/a" || d + 0 > 10) }'; }
RATE_HELD=$(awk -v a="$H2_RPS" -v r="$RATE" 'BEGIN { print (a >= 0.98 * r) ? "yes" : "no" }')

FAILS=()
[ "$DROPPED" -eq 0 ] || FAILS+=("$DROPPED records dropped by the sink")
[ "$RING_DROPPED" -eq 0 ] || FAILS+=("$RING_DROPPED records dropped at full rings")
[ "$RECORDS" -eq "$REQUESTS" ] || FAILS+=("records written ($RECORDS) != requests answered ($REQUESTS)")
[ "$LINES" -eq "$RECORDS" ] || FAILS+=("lines in the files ($LINES) != records written ($RECORDS)")
[ "$INVALID" -eq 0 ] || FAILS+=("$INVALID lines are not JSON objects (first: $FIRST_INVALID)")
[ "$DRAINED" = yes ] || FAILS+=("the queue did not drain within 30 s")
[ "$H2_BAD" -eq 0 ] && [ "$H2_2XX" -eq "$H2_DONE" ] ||
    FAILS+=("h2load: $H2_BAD failed/errored/timed out, $H2_2XX of $H2_DONE answered 2xx")
[ "$RATE_HELD" = yes ] || FAILS+=("achieved $H2_RPS req/s, below 98% of $RATE")
! over10 "$RSS_DRIFT" || FAILS+=("VmRSS drift $RSS_DRIFT% after warm-up")
! over10 "$FD_DRIFT" || FAILS+=("fd count drift $FD_DRIFT% after warm-up")

# The runtime must also shut down cleanly.
kill -TERM "$RUNTIME_PID"
RT_EXIT=0
wait "$RUNTIME_PID" || RT_EXIT=$?
ALERTS=$(awk '/\[alert\]|runtime error:|Sanitizer/ { n++ } END { print n + 0 }' "$WORK/runtime.log")
LOG_ERRORS=$(awk '/\[error\]|\[warn\]/ { n++ } END { print n + 0 }' "$WORK/runtime.log")
[ "$RT_EXIT" -eq 0 ] || FAILS+=("the runtime exited $RT_EXIT on SIGTERM")
[ "$ALERTS" -eq 0 ] || FAILS+=("$ALERTS alert/sanitizer lines in the runtime's log")
if [ "${#FAILS[@]}" -eq 0 ]; then VERDICT="met"; else VERDICT="NOT met"; fi

report() {
    local length="$SOAK_SECONDS seconds"
    [ $((SOAK_SECONDS % 60)) -ne 0 ] || length="$((SOAK_SECONDS / 60)) minutes"
    [ "$SOAK_SECONDS" -ne 60 ] || length="1 minute"
    echo "# Traffic log soak: $RATE requests/s for $length with the file sink"
    echo
    echo "Generated by \`perf/tlog_soak.sh\` (perf/README.md, \"Traffic log soak\"); issue 11,"
    echo "\"Sustained 10-minute run at a fixed rate with the file sink: zero drops, RSS flat\"."
    echo "Not a test: a run on a shared machine, kept as a record."
    echo
    echo "Run $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) CPUs" \
        "($(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)), kernel $(uname -r)," \
        "checkout at commit $COMMIT when the run started (the binary is whatever $BUILD held);" \
        "$(h2load --version 2>/dev/null | head -1), $("$NGINX" -v 2>&1 | sed 's/.*: //')."
    echo
    echo "Command:"
    echo
    echo "    $COMMAND"
    echo
    echo "Load: \`${H2LOAD[*]}\` (open loop: each of the $CLIENTS keep-alive"
    echo "connections is given $RPS requests/s by a timer, whatever the latency), the runtime"
    echo "standalone with \`--workers $WORKERS\` proxying \`GET /soak/pets/{id}\` to an nginx origin"
    echo "(\`return 200\`, 22 bytes) with upstream keep-alive. One traffic log sink,"
    echo "\`{name: soak, type: file}\` with \`rotate: {maxBytes: $ROTATE_BYTES, keep: $ROTATE_KEEP}\`"
    echo "(default batching and 16 MiB budget): rotation keeps the disk bounded and is exercised"
    echo "all along; the script's reader follows the files by inode, so rotated and deleted"
    echo "files are counted and parsed too. Sample every ${SAMPLE_SECONDS}s; flatness judged from"
    echo "${WARMUP_SECONDS}s on; the \`end\` row is taken after the load stopped and the queue drained."
    echo
    echo "The runtime's config (\`--config\`; ports and the work dir were this run's):"
    echo
    echo '```yaml'
    cat "$WORK/sluice.yaml"
    echo '```'
    echo
    echo "## Verdict: target $VERDICT"
    echo
    if [ "${#FAILS[@]}" -gt 0 ]; then
        printf -- '- %s\n' "${FAILS[@]}"
        echo
    fi
    echo "| figure | value |"
    echo "| --- | --- |"
    echo "| rate asked / achieved (h2load) | $RATE / $H2_RPS req/s over ${H2_SECS}s (held: $RATE_HELD) |"
    echo "| h2load requests done / 2xx / failed+errored+timeout | $H2_DONE / $H2_2XX / $H2_BAD |"
    echo "| h2load time per request, mean / max | $H2_MEAN / $H2_MAX |"
    echo "| requests answered (sluice_downstream_requests_total) | $REQUESTS ($((REQUESTS - H2_DONE)) more than h2load's done: the start-up probe, and requests in flight when h2load's duration ended) |"
    echo "| records written (sluice_traffic_log_records_total{sink=\"soak\"}) | $RECORDS |"
    echo "| records dropped: sink / full rings | $DROPPED / $RING_DROPPED |"
    echo "| lines read from the files / not valid JSON | $LINES / $INVALID (every line parsed; $STATUS_200 with status 200) |"
    echo "| log written / files / most on disk at once | $LOG_BYTES bytes / $LOG_FILES files / $MAX_DISK bytes |"
    echo "| queue drained after the load | $DRAINED (${DRAIN_S}s) |"
    echo "| VmRSS after warm-up, min / max / drift | $RSS_MIN / $RSS_MAX kB / $RSS_DRIFT% |"
    echo "| open fds after warm-up, min / max / drift | $FD_MIN / $FD_MAX / $FD_DRIFT% |"
    echo "| runtime CPU per request (all threads, logger and sink included) | $CPU_US µs |"
    echo "| runtime exit on SIGTERM / alert lines / warn+error lines | $RT_EXIT / $ALERTS / $LOG_ERRORS |"
    echo
    echo "## Samples"
    echo
    echo "Counters are cumulative. rss_kb: VmRSS; fds: entries of /proc/PID/fd; cpu_s: utime +"
    echo "stime; req_per_s: requests answered since the previous row / elapsed time; records,"
    echo "dropped, ring_dropped, queue_*: the sink's series on /metrics; lines / log_bytes /"
    echo "log_files: what the reader has read so far (it scans every second); disk_bytes: the"
    echo "log files on disk at that moment."
    echo
    head -1 "$SAMPLES" | awk -F'\t' '{ s = "|"; for (i = 1; i <= NF; i++) s = s " " $i " |"; print s
        s = "|"; for (i = 1; i <= NF; i++) s = s " ---: |"; print s }'
    tail -n +2 "$SAMPLES" | awk -F'\t' '{ s = "|"; for (i = 1; i <= NF; i++) s = s " " $i " |"; print s }'
}

echo
report | tee "$WORK/report.md"
if [ "$OUT" != "-" ]; then
    cp "$WORK/report.md" "$OUT"
    echo "tlog_soak: wrote $OUT"
fi
[ "$VERDICT" = "met" ]
