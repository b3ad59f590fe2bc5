#!/usr/bin/env bash
# perf/soak.sh: a long run of a controller-managed runtime under mixed load
# while its config changes every second (issue 4, "Soak").
#
# What it does: starts two origins (tests/integration/backend.py, the suite's
# own origin server), a sluice-controller with a private data dir and a
# sluice-runtime connected to it; applies a Gateway, two Backends and an Api
# through the REST API; then for $SOAK_SECONDS runs at the same time
#   - wrk: $WRK_CONNECTIONS keep-alive connections on GET /soak/pets/7,
#   - a new-connection client: one TCP connection per request (GET /soak/pets,
#     Connection: close), as fast as it is answered,
#   - a config writer: every second a PUT of the Api through the REST API,
#     alternating two operation sets and two backend weightings (both keep the
#     two paths the clients use, so every request must succeed),
# and every $SAMPLE_SECONDS records RSS (VmRSS) and open file descriptors of
# the controller and the runtime (from /proc), requests answered and errors.
# At the end it prints the table and, unless OUT=-, writes it with the
# command, machine and verdict to docs/benchmarks-soak.md.
#
# Verdict: zero errors (wrk non-2xx + socket errors, new-connection failures,
# REST writes not answered 200, controller NACKs, runtime 5xx) and, over the
# samples after $WARMUP_SECONDS, RSS and fd count of both processes within
# 10% ((max - min) / min). Exit status 0 when met, 1 when not, 2 on set-up
# failure.
#
# What it does not do: build anything (build first, point BUILD at the tree),
# need root, or touch anything outside a mktemp dir (and $OUT).
#
# Environment (all optional):
#   BUILD=build            tree holding bin/sluice-controller, bin/sluice-runtime
#   SOAK_SECONDS=600       length of the loaded run
#   SAMPLE_SECONDS=30      sampling period
#   WARMUP_SECONDS=60      samples before this are not judged for flatness
#   WORKERS=2              runtime workers
#   WRK_CONNECTIONS=16 WRK_THREADS=1
#   OUT=docs/benchmarks-soak.md   ("-" = only print)
# Run it niced on a shared machine:  nice -n 10 perf/soak.sh
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$PWD

BUILD=${BUILD:-build}
SOAK_SECONDS=${SOAK_SECONDS:-600}
SAMPLE_SECONDS=${SAMPLE_SECONDS:-30}
WARMUP_SECONDS=${WARMUP_SECONDS:-60}
WORKERS=${WORKERS:-2}
WRK_CONNECTIONS=${WRK_CONNECTIONS:-16}
WRK_THREADS=${WRK_THREADS:-1}
OUT=${OUT:-docs/benchmarks-soak.md}
PY=/usr/bin/python3
CONTROLLER="$BUILD/bin/sluice-controller"
RUNTIME="$BUILD/bin/sluice-runtime"
COMMAND="BUILD=$BUILD SOAK_SECONDS=$SOAK_SECONDS SAMPLE_SECONDS=$SAMPLE_SECONDS WARMUP_SECONDS=$WARMUP_SECONDS WORKERS=$WORKERS WRK_CONNECTIONS=$WRK_CONNECTIONS perf/soak.sh"

KEEP_WORK=0
die() {
    echo "soak: $*" >&2
    exit 2
}

for f in "$CONTROLLER" "$RUNTIME"; do
    [ -x "$f" ] || die "$f not found (build first: make BUILD=$BUILD)"
done
command -v wrk >/dev/null || die "wrk not installed (apt-get install wrk)"
[ "$SOAK_SECONDS" -ge "$((2 * SAMPLE_SECONDS))" ] ||
    die "SOAK_SECONDS ($SOAK_SECONDS) must be at least two samples ($((2 * SAMPLE_SECONDS)))"

COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
WORK=$(mktemp -d /tmp/sluice-soak.XXXXXX)
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
        echo "soak: logs kept in $WORK" >&2
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The helpers below run in Python: the origin (the test suite's), the
# new-connection client and the config writer. Each writes its counters to a
# file in $WORK once a second so the sampler can read them.
cat >"$WORK/tools.py" <<'EOF'
import json, os, signal, socket, sys, time
sys.path.insert(0, os.path.join(sys.argv[1], "tests", "integration"))
from backend import Backend  # noqa: E402
from helpers import http_request  # noqa: E402

def free_ports(n):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports

def write_counts(path, counts):
    with open(path + ".tmp", "w") as f:
        json.dump(counts, f)
    os.replace(path + ".tmp", path)

stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)

mode = sys.argv[2]
if mode == "ports":
    print(" ".join(map(str, free_ports(int(sys.argv[3])))))
elif mode == "origin":
    bs = [Backend(port=int(p), name="origin-%s" % p).start() for p in sys.argv[3:]]
    # The origin records every request; forget them now and then so a long
    # soak measures the gateway, not this list.
    while not stop:
        time.sleep(1)
        for b in bs:
            b.clear()
    for b in bs:
        b.stop()
elif mode == "newconn":
    port, counts_path = int(sys.argv[3]), sys.argv[4]
    c = {"ok": 0, "errors": 0, "last_error": ""}
    last = 0.0
    while not stop:
        try:
            status, _, _ = http_request("127.0.0.1", port, "GET", "/soak/pets", timeout=5.0)
            if status == 200:
                c["ok"] += 1
            else:
                c["errors"] += 1
                c["last_error"] = "status %d" % status
        except (OSError, EOFError, AssertionError, ValueError) as e:
            c["errors"] += 1
            c["last_error"] = repr(e)
        if time.monotonic() - last >= 1.0:
            last = time.monotonic()
            write_counts(counts_path, c)
    write_counts(counts_path, c)
elif mode == "apply":
    rest, body = int(sys.argv[3]), sys.argv[4]
    status, _, raw = http_request("127.0.0.1", rest, "POST", "/api/v1/resources",
                                  headers={"Content-Type": "application/yaml"},
                                  body=body.encode(), timeout=30.0)
    if status not in (200, 201):
        sys.exit("POST /api/v1/resources: %d %s" % (status, raw[:2000]))
elif mode == "changer":
    rest, counts_path = int(sys.argv[3]), sys.argv[4]
    variants = [
        {"ops": [{"method": "GET", "path": "/pets"}, {"method": "GET", "path": "/pets/{id}"},
                 {"method": "POST", "path": "/pets"}],
         "refs": [{"name": "a", "weight": 1}, {"name": "b", "weight": 3}]},
        {"ops": [{"method": "GET", "path": "/pets"}, {"method": "GET", "path": "/pets/{id}"},
                 {"method": "PUT", "path": "/pets/{id}"}, {"method": "DELETE", "path": "/pets/{id}"}],
         "refs": [{"name": "a", "weight": 3}, {"name": "b", "weight": 1}]},
    ]
    c = {"writes": 0, "errors": 0, "last_error": ""}
    i = 0
    next_t = time.monotonic()
    while not stop:
        v = variants[i % 2]
        doc = {"apiVersion": "gateway.sluice.dev/v1alpha1", "kind": "Api",
               "metadata": {"name": "soak"},
               "spec": {"basePath": "/soak", "backendRefs": v["refs"], "operations": v["ops"]}}
        try:
            status, _, raw = http_request("127.0.0.1", rest, "PUT", "/api/v1/apis/soak",
                                          headers={"Content-Type": "application/json"},
                                          body=json.dumps(doc).encode(), timeout=10.0)
            if status == 200:
                c["writes"] += 1
            else:
                c["errors"] += 1
                c["last_error"] = "PUT %d %s" % (status, raw[:300])
        except (OSError, EOFError, AssertionError, ValueError) as e:
            c["errors"] += 1
            c["last_error"] = repr(e)
        write_counts(counts_path, c)
        i += 1
        next_t += 1.0
        time.sleep(max(0.0, next_t - time.monotonic()))
    write_counts(counts_path, c)
EOF

# An array, not a function: "${TOOLS[@]} ... &" makes $! the Python process
# itself (a backgrounded function would be a subshell, and killing it would
# leave Python running).
TOOLS=("$PY" "$WORK/tools.py" "$REPO")

read -r ORIGIN_A ORIGIN_B LISTEN REST STREAM ADMIN <<<"$("${TOOLS[@]}" ports 6)"

"${TOOLS[@]}" origin "$ORIGIN_A" "$ORIGIN_B" >"$WORK/origin.log" 2>&1 &
PIDS+=($!)

mkdir -p "$WORK/data"
"$CONTROLLER" --rest "127.0.0.1:$REST" --stream "127.0.0.1:$STREAM" --data-dir "$WORK/data" \
    --log-level notice >"$WORK/controller.log" 2>&1 &
CONTROLLER_PID=$!
PIDS+=("$CONTROLLER_PID")

wait_http() { # port path seconds
    local i
    for ((i = 0; i < $3 * 10; i++)); do
        if curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$1$2" 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}
wait_http "$REST" /readyz 15 || die "controller not ready; log: $(tail -20 "$WORK/controller.log")"

"${TOOLS[@]}" apply "$REST" "$(
    cat <<EOF
apiVersion: gateway.sluice.dev/v1alpha1
kind: Gateway
metadata: {name: default}
spec:
  fleet: default
  listeners:
  - {name: http, port: $LISTEN, protocol: http, address: 127.0.0.1}
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Backend
metadata: {name: a}
spec:
  endpoints:
  - {address: 127.0.0.1, port: $ORIGIN_A}
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Backend
metadata: {name: b}
spec:
  endpoints:
  - {address: 127.0.0.1, port: $ORIGIN_B}
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Api
metadata: {name: soak}
spec:
  basePath: /soak
  backendRefs: [{name: a}, {name: b}]
  operations:
  - {method: GET, path: /pets}
  - {method: GET, path: "/pets/{id}"}
EOF
)" || die "could not apply the initial config"

"$RUNTIME" --controller "127.0.0.1:$STREAM" --node-id soak-1 --fleet default \
    --workers "$WORKERS" --admin "127.0.0.1:$ADMIN" --access-log off --log-level notice \
    >"$WORK/runtime.log" 2>&1 &
RUNTIME_PID=$!
PIDS+=("$RUNTIME_PID")
wait_http "$LISTEN" /soak/pets 20 || die "runtime not serving; log: $(tail -20 "$WORK/runtime.log")"

metric() { # port name: sum of every sample of that metric
    curl -fsS --max-time 5 "http://127.0.0.1:$1/metrics" 2>/dev/null |
        awk -v n="$2" '$1 == n || index($1, n "{") == 1 { s += $NF } END { printf "%d\n", s }'
}
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
fds() { find "/proc/$1/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
count() { # file key
    "$PY" -c 'import json,sys
try: print(json.load(open(sys.argv[1])).get(sys.argv[2], 0))
except (OSError, ValueError): print(0)' "$1" "$2"
}

echo "soak: ${SOAK_SECONDS}s, controller pid $CONTROLLER_PID, runtime pid $RUNTIME_PID" \
    "(listener 127.0.0.1:$LISTEN), work dir $WORK"

# wrk runs a few seconds past the last sample, so that sample never races
# with wrk closing its connections (it would show as an fd drop).
wrk -t"$WRK_THREADS" -c"$WRK_CONNECTIONS" -d"$((SOAK_SECONDS + 5))s" --timeout 5s --latency \
    "http://127.0.0.1:$LISTEN/soak/pets/7" >"$WORK/wrk.txt" 2>&1 &
WRK_PID=$!
PIDS+=("$WRK_PID")
"${TOOLS[@]}" newconn "$LISTEN" "$WORK/newconn.json" >"$WORK/newconn.log" 2>&1 &
NEWCONN_PID=$!
PIDS+=("$NEWCONN_PID")
"${TOOLS[@]}" changer "$REST" "$WORK/changer.json" >"$WORK/changer.log" 2>&1 &
CHANGER_PID=$!
PIDS+=("$CHANGER_PID")

SAMPLES="$WORK/samples.tsv"
HEADER="t_s\tctl_rss_kb\tctl_fds\trt_rss_kb\trt_fds\trt_requests\trt_5xx\tnewconn_ok\tnewconn_err\tconfig_writes\tconfig_err\tnacks\trt_generation"
printf '%b\n' "$HEADER" | tee "$SAMPLES"
sample() {
    local t=$1
    printf '%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n' "$t" \
        "$(rss_kb "$CONTROLLER_PID")" "$(fds "$CONTROLLER_PID")" \
        "$(rss_kb "$RUNTIME_PID")" "$(fds "$RUNTIME_PID")" \
        "$(metric "$ADMIN" sluice_downstream_requests_total)" \
        "$(curl -fsS --max-time 5 "http://127.0.0.1:$ADMIN/metrics" 2>/dev/null |
            awk '/^sluice_requests_total\{/ && /code_class="5xx"/ { s += $NF } END { printf "%d", s }')" \
        "$(count "$WORK/newconn.json" ok)" "$(count "$WORK/newconn.json" errors)" \
        "$(count "$WORK/changer.json" writes)" "$(count "$WORK/changer.json" errors)" \
        "$(metric "$REST" sluice_controller_nacks_total)" \
        "$(metric "$ADMIN" sluice_generation_version)" | tee -a "$SAMPLES"
}

START=$(date +%s)
sample 0
for ((t = SAMPLE_SECONDS; t <= SOAK_SECONDS; t += SAMPLE_SECONDS)); do
    sleep $((START + t - $(date +%s) > 0 ? START + t - $(date +%s) : 0))
    for p in "$CONTROLLER_PID" "$RUNTIME_PID"; do
        if ! kill -0 "$p" 2>/dev/null; then
            rc=0
            wait "$p" || rc=$?
            KEEP_WORK=1
            echo "--- controller log (tail) ---" >&2
            tail -30 "$WORK/controller.log" >&2
            echo "--- runtime log (tail) ---" >&2
            tail -30 "$WORK/runtime.log" >&2
            die "process $p died at ${t}s (wait status $rc)"
        fi
    done
    sample "$t"
done

wait "$WRK_PID" || true
kill -TERM "$NEWCONN_PID" "$CHANGER_PID" 2>/dev/null || true
wait "$NEWCONN_PID" "$CHANGER_PID" 2>/dev/null || true

WRK_REQS=$(awk '/requests in/ { print $1 }' "$WORK/wrk.txt")
WRK_RPS=$(awk '/^Requests\/sec/ { print $2 }' "$WORK/wrk.txt")
WRK_NON2XX=$(awk '/Non-2xx or 3xx/ { print $NF }' "$WORK/wrk.txt")
WRK_SOCKERR=$(awk '/Socket errors/ { gsub(",", ""); print $4 + $6 + $8 + $10 }' "$WORK/wrk.txt")
WRK_P99=$(awk '/^ +99%/ { print $2 }' "$WORK/wrk.txt")
WRK_REQS=${WRK_REQS:-0} WRK_NON2XX=${WRK_NON2XX:-0} WRK_SOCKERR=${WRK_SOCKERR:-0}
NEWCONN_OK=$(count "$WORK/newconn.json" ok)
NEWCONN_ERR=$(count "$WORK/newconn.json" errors)
NEWCONN_LAST=$(count "$WORK/newconn.json" last_error)
WRITES=$(count "$WORK/changer.json" writes)
WRITE_ERR=$(count "$WORK/changer.json" errors)
WRITE_LAST=$(count "$WORK/changer.json" last_error)
NACKS=$(metric "$REST" sluice_controller_nacks_total)
RT_5XX=$(tail -1 "$SAMPLES" | cut -f7)
ERRORS=$((WRK_NON2XX + WRK_SOCKERR + NEWCONN_ERR + WRITE_ERR + NACKS + RT_5XX))

# Flatness over the samples after warm-up: (max - min) / min, in percent.
drift() { # column
    awk -F'\t' -v c="$1" -v w="$WARMUP_SECONDS" 'NR > 1 && $1 >= w {
        if (min == "" || $c < min) min = $c; if ($c > max) max = $c }
        END { if (min > 0) printf "%.1f", 100 * (max - min) / min; else print "n/a" }' "$SAMPLES"
}
CTL_RSS_DRIFT=$(drift 2) CTL_FD_DRIFT=$(drift 3) RT_RSS_DRIFT=$(drift 4) RT_FD_DRIFT=$(drift 5)
FLAT=yes
for d in "$CTL_RSS_DRIFT" "$CTL_FD_DRIFT" "$RT_RSS_DRIFT" "$RT_FD_DRIFT"; do
    awk -v d="$d" 'BEGIN { exit !(d == "n/a" || d + 0 > 10) }' && FLAT=no
done
if [ "$ERRORS" -eq 0 ] && [ "$FLAT" = yes ]; then VERDICT="met"; else VERDICT="NOT met"; fi

# Processes must also shut down cleanly after the soak.
kill -TERM "$RUNTIME_PID" "$CONTROLLER_PID"
RT_EXIT=0 CTL_EXIT=0
wait "$RUNTIME_PID" || RT_EXIT=$?
wait "$CONTROLLER_PID" || CTL_EXIT=$?
ALERTS=$(cat "$WORK/runtime.log" "$WORK/controller.log" |
    awk '/\[alert\]|runtime error:|Sanitizer/ { n++ } END { print n + 0 }')
[ "$RT_EXIT" -eq 0 ] && [ "$CTL_EXIT" -eq 0 ] && [ "$ALERTS" -eq 0 ] || VERDICT="NOT met"

report() {
    echo "# Soak: controller-managed runtime under load with a config change every second"
    echo
    echo "Run $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) CPUs" \
        "($(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)), kernel $(uname -r)," \
        "checkout at commit $COMMIT when the run started (the binaries are whatever $BUILD held)."
    echo
    echo "Command:"
    echo
    echo "    $COMMAND"
    echo
    echo "Load: wrk, $WRK_CONNECTIONS keep-alive connections ($WRK_THREADS thread) on GET" \
        "/soak/pets/7; one Python client opening a new connection per request on GET" \
        "/soak/pets; a REST PUT of the Api every second alternating two operation sets and" \
        "two backend weightings (two origins: tests/integration/backend.py); runtime with" \
        "$WORKERS workers. Sample every ${SAMPLE_SECONDS}s; flatness judged after ${WARMUP_SECONDS}s."
    echo
    echo "## Verdict: target $VERDICT"
    echo
    echo "| figure | value |"
    echo "| --- | --- |"
    echo "| errors, total | $ERRORS |"
    echo "| wrk requests (keep-alive) | $WRK_REQS ($WRK_RPS req/s, p99 ${WRK_P99:-n/a}) |"
    echo "| wrk non-2xx / socket errors | $WRK_NON2XX / $WRK_SOCKERR |"
    echo "| new-connection requests ok / failed | $NEWCONN_OK / $NEWCONN_ERR${NEWCONN_LAST:+ (last: $NEWCONN_LAST)} |"
    echo "| config writes ok / failed | $WRITES / $WRITE_ERR${WRITE_LAST:+ (last: $WRITE_LAST)} |"
    echo "| controller NACKs | $NACKS |"
    echo "| runtime 5xx responses | $RT_5XX |"
    echo "| controller RSS / fd drift after warm-up | $CTL_RSS_DRIFT% / $CTL_FD_DRIFT% |"
    echo "| runtime RSS / fd drift after warm-up | $RT_RSS_DRIFT% / $RT_FD_DRIFT% |"
    echo "| exit codes after SIGTERM (runtime, controller) | $RT_EXIT, $CTL_EXIT |"
    echo "| alert / sanitizer lines in the logs | $ALERTS |"
    echo
    echo "## Samples"
    echo
    echo "Cumulative counters; RSS in kB; fds = entries of /proc/PID/fd; rt_generation ="
    echo "the config generation the runtime serves (it follows the writes)."
    echo
    head -1 "$SAMPLES" | awk -F'\t' '{ s = "|"; for (i = 1; i <= NF; i++) s = s " " $i " |"; print s
        s = "|"; for (i = 1; i <= NF; i++) s = s " ---: |"; print s }'
    tail -n +2 "$SAMPLES" | awk -F'\t' '{ s = "|"; for (i = 1; i <= NF; i++) s = s " " $i " |"; print s }'
}

echo
report | tee "$WORK/report.md"
if [ "$OUT" != "-" ]; then
    cp "$WORK/report.md" "$OUT"
    echo "soak: wrote $OUT"
fi
[ "$VERDICT" = "met" ]
