#!/usr/bin/env bash
# perf/bench.sh: sluice-runtime against nginx and HAProxy as reverse proxies,
# side by side in one run (DESIGN.md "Measuring performance").
#
# What it does: starts a fast origin (nginx answering `return 200` with a
# small body) and, one proxy at a time, sluice-runtime (--workers 1), nginx
# (1 worker, upstream keepalive) and HAProxy (nbthread 1, http-reuse always)
# in front of it. The proxy is pinned to CPU $PROXY_CPU, wrk and the origin
# to CPU $LOAD_CPU. For GET, POST 1 KB and POST 5 KB it runs wrk for
# $WARMUP (discarded) then $DURATION, and reports requests/s, CPU
# microseconds per request of the proxy process (utime+stime from
# /proc/PID/stat over the measured run / completed requests), errors
# (non-2xx + socket errors) and ratios to nginx. Writes docs/benchmarks.md.
#
# What it does not do: build anything (run `make bench`, or build first and
# point BUILD at the tree), run as root, or touch paths outside a mktemp dir.
#
# Environment (all optional):
#   BUILD=build          where bin/sluice-runtime is
#   DURATION=10s WARMUP=2s CONNECTIONS=50 WRK_THREADS=1
#   PROXIES="sluice nginx haproxy"   which proxies to measure
#   TESTS="get post1k post5k"
#   PROXY_CPU=0 LOAD_CPU=1
#   OUT=docs/benchmarks.md            ("-" = only print the table)
#   BASELINE=path/to/sluice-runtime   also measure this binary, as proxy
#                                     "sluice-base", in the same run (before/after
#                                     figures of a change: build the old commit
#                                     into another tree and point BASELINE at it)
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$PWD

BUILD=${BUILD:-build}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
CONNECTIONS=${CONNECTIONS:-50}
WRK_THREADS=${WRK_THREADS:-1}
PROXIES=${PROXIES:-"sluice nginx haproxy"}
TESTS=${TESTS:-"get post1k post5k"}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
OUT=${OUT:-docs/benchmarks.md}
BASELINE=${BASELINE:-}
if [ -n "$BASELINE" ]; then
    [ -x "$BASELINE" ] || die_early=1
    case " $PROXIES " in *" sluice-base "*) ;; *) PROXIES="sluice-base $PROXIES" ;; esac
fi
RUNTIME="$BUILD/bin/sluice-runtime"
case $RUNTIME in /*) ;; *) RUNTIME="$REPO/$RUNTIME" ;; esac
PY=/usr/bin/python3

die() { echo "bench: $*" >&2; exit 1; }

for tool in nginx haproxy wrk taskset curl getconf; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] ||
        die "$tool not found (make deps installs it)"
done
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
case " $PROXIES " in *" sluice "*)
    [ -x "$RUNTIME" ] || die "$RUNTIME not found: build it first (make BUILD=$BUILD)" ;;
esac
[ -z "${die_early:-}" ] || die "BASELINE=$BASELINE is not an executable sluice-runtime"
NCPU=$(nproc)
if [ "$PROXY_CPU" -ge "$NCPU" ] || [ "$LOAD_CPU" -ge "$NCPU" ]; then
    die "needs CPUs $PROXY_CPU and $LOAD_CPU, this machine has $NCPU"
fi
CLK_TCK=$(getconf CLK_TCK)

TMP=$(mktemp -d "${TMPDIR:-/tmp}/sluice-bench.XXXXXX")
PIDS=()

cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
    $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits until GET http://127.0.0.1:$1/ answers 200 (the process $2 must live).
wait_http() {
    local port=$1 pid=$2 name=$3 code
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || die "$name exited during start-up (see $TMP)"
        code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/" || true)
        [ "$code" = 200 ] && return 0
        sleep 0.1
    done
    die "$name on port $port did not answer 200 within 10 s (last: $code)"
}

# Sum of utime+stime (clock ticks) of a process and its direct children
# (nginx's master and worker). Fields after the ")" of comm: 14 and 15 of stat.
cpu_ticks() {
    local pid=$1 total=0 p rest
    for p in $pid $(pgrep -P "$pid" || true); do
        [ -r "/proc/$p/stat" ] || continue
        rest=$(sed 's/.*) //' "/proc/$p/stat")
        # after "pid (comm) ": field 3 is state, so utime is word 12, stime 13
        # shellcheck disable=SC2086 # word splitting is the point
        set -- $rest
        total=$((total + ${12} + ${13}))
    done
    echo "$total"
}

fill() { # template out [KEY=VALUE...]
    local tmpl=$1 out=$2 kv
    shift 2
    cp "$tmpl" "$out"
    for kv in "$@"; do
        sed -i "s|@${kv%%=*}@|${kv#*=}|g" "$out"
    done
}

# --- origin: nginx returning a small body, pinned to the load CPU -----------
ORIGIN_PORT=$(free_port)
mkdir -p "$TMP/origin"
cat >"$TMP/origin/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $TMP/origin/nginx.pid;
error_log $TMP/origin/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $TMP/origin/client_body;
    proxy_temp_path $TMP/origin/proxy;
    fastcgi_temp_path $TMP/origin/fastcgi;
    uwsgi_temp_path $TMP/origin/uwsgi;
    scgi_temp_path $TMP/origin/scgi;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$ORIGIN_PORT;
        location / { default_type text/plain; return 200 "hello from the origin\n"; }
    }
}
EOF
taskset -c "$LOAD_CPU" "$NGINX" -p "$TMP/origin" -c "$TMP/origin/nginx.conf" \
    >"$TMP/origin/stdout" 2>&1 &
ORIGIN_PID=$!
PIDS+=("$ORIGIN_PID")
wait_http "$ORIGIN_PORT" "$ORIGIN_PID" "origin nginx"

# --- wrk scripts -------------------------------------------------------------
for size in 1024 5120; do
    cat >"$TMP/post$size.lua" <<EOF
wrk.method = "POST"
wrk.body = string.rep("x", $size)
wrk.headers["Content-Type"] = "application/octet-stream"
EOF
done

start_proxy() { # name port -> sets PROXY_PID
    local name=$1 port=$2 dir="$TMP/$1"
    mkdir -p "$dir"
    case $name in
    sluice | sluice-base)
        local bin=$RUNTIME
        [ "$name" = sluice ] || bin=$BASELINE
        cat >"$dir/sluice.yaml" <<EOF
apiVersion: gateway.sluice.dev/v1alpha1
kind: Gateway
metadata: {name: bench}
spec:
  listeners:
  - {name: http, port: $port, protocol: http, address: 127.0.0.1}
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
metadata: {name: bench}
spec:
  basePath: /
  backendRefs: [{name: origin}]
  operations:
  - {name: all, method: "*", path: /, pathType: prefix}
EOF
        taskset -c "$PROXY_CPU" "$bin" --config "$dir/sluice.yaml" --workers 1 \
            --admin off --access-log off --log-level warn >"$dir/stdout" 2>"$dir/stderr" &
        ;;
    nginx)
        fill "$REPO/perf/nginx.conf.tmpl" "$dir/nginx.conf" PREFIX="$dir" \
            LISTEN_PORT="$port" ORIGIN_PORT="$ORIGIN_PORT"
        taskset -c "$PROXY_CPU" "$NGINX" -p "$dir" -c "$dir/nginx.conf" \
            >"$dir/stdout" 2>"$dir/stderr" &
        ;;
    haproxy)
        fill "$REPO/perf/haproxy.cfg.tmpl" "$dir/haproxy.cfg" \
            LISTEN_PORT="$port" ORIGIN_PORT="$ORIGIN_PORT"
        taskset -c "$PROXY_CPU" "$HAPROXY" -db -f "$dir/haproxy.cfg" \
            >"$dir/stdout" 2>"$dir/stderr" &
        ;;
    *) die "unknown proxy $name" ;;
    esac
    PROXY_PID=$!
    PIDS+=("$PROXY_PID")
    wait_http "$port" "$PROXY_PID" "$name"
    # A POST must pass too, with the origin's answer.
    local body
    body=$(curl -s -X POST --data-binary @"$TMP/post1024.lua" "http://127.0.0.1:$port/x")
    [ "$body" = "hello from the origin" ] || die "$name: POST through the proxy answered '$body'"
}

stop_proxy() {
    kill -TERM "$PROXY_PID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$PROXY_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$PROXY_PID" 2>/dev/null || true
    wait "$PROXY_PID" 2>/dev/null || true
}

run_wrk() { # port test duration outfile
    local port=$1 test=$2 dur=$3 out=$4 script=()
    case $test in
    get) ;;
    post1k) script=(-s "$TMP/post1024.lua") ;;
    post5k) script=(-s "$TMP/post5120.lua") ;;
    *) die "unknown test $test" ;;
    esac
    taskset -c "$LOAD_CPU" wrk -t"$WRK_THREADS" -c"$CONNECTIONS" -d"$dur" "${script[@]}" \
        "http://127.0.0.1:$port/bench" >"$out" 2>&1 || die "wrk failed: $(cat "$out")"
}

# Parses wrk output: "requests rps errors"
parse_wrk() {
    $PY - "$1" <<'EOF'
import re, sys
t = open(sys.argv[1]).read()
m = re.search(r"(\d+) requests in", t)
rps = re.search(r"Requests/sec:\s+([\d.]+)", t)
if not m or not rps:
    sys.exit("cannot parse wrk output:\n" + t)
errors = sum(int(x) for x in re.findall(r"Non-2xx or 3xx responses: (\d+)", t))
s = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", t)
if s:
    errors += sum(int(x) for x in s.groups())
print(m.group(1), rps.group(1), errors)
EOF
}

RESULTS="$TMP/results"
: >"$RESULTS"
for proxy in $PROXIES; do
    port=$(free_port)
    start_proxy "$proxy" "$port"
    for test in $TESTS; do
        run_wrk "$port" "$test" "$WARMUP" "$TMP/$proxy-$test-warmup.txt"
        before=$(cpu_ticks "$PROXY_PID")
        run_wrk "$port" "$test" "$DURATION" "$TMP/$proxy-$test.txt"
        after=$(cpu_ticks "$PROXY_PID")
        kill -0 "$PROXY_PID" 2>/dev/null || die "$proxy died during $test: $(tail -5 "$TMP/$proxy/stderr")"
        read -r requests rps errors < <(parse_wrk "$TMP/$proxy-$test.txt")
        cpu_us=$($PY -c "print('%.2f' % (($after - $before) * 1e6 / $CLK_TCK / max($requests, 1)))")
        echo "$proxy $test $requests $rps $cpu_us $errors" >>"$RESULTS"
        printf '%-8s %-7s %10s req/s %8s us/req  errors %s\n' "$proxy" "$test" "$rps" "$cpu_us" "$errors"
    done
    stop_proxy
done

# --- report --------------------------------------------------------------------
CPU_MODEL=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //' || echo unknown)
CMD="make bench  (BUILD=$BUILD${BASELINE:+ BASELINE=$BASELINE} DURATION=$DURATION WARMUP=$WARMUP CONNECTIONS=$CONNECTIONS WRK_THREADS=$WRK_THREADS PROXIES=\"$PROXIES\" TESTS=\"$TESTS\" perf/bench.sh)"
TABLE=$($PY - "$RESULTS" <<'EOF'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
by = {(r[0], r[1]): r for r in rows}
names = {"get": "GET", "post1k": "POST 1 KB", "post5k": "POST 5 KB"}
print("| test | proxy | requests/s | CPU µs/request | errors | req/s vs nginx | CPU/req vs nginx |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
tests = []
for r in rows:
    if r[1] not in tests:
        tests.append(r[1])
for t in tests:
    for r in rows:
        if r[1] != t:
            continue
        proxy, _, req, rps, cpu, err = r
        ng = by.get(("nginx", t))
        if ng and float(ng[3]) > 0 and float(ng[4]) > 0:
            rr = "%.2f" % (float(rps) / float(ng[3]))
            cr = "%.2f" % (float(cpu) / float(ng[4]))
        else:
            rr = cr = "n/a"
        print("| %s | %s | %.0f | %s | %s | %s | %s |" % (names.get(t, t), proxy, float(rps),
                                                       cpu, err, rr, cr))
EOF
)
echo
echo "$TABLE"

if [ "$OUT" != "-" ]; then
    mkdir -p "$(dirname "$OUT")"
    cat >"$OUT" <<EOF
# Benchmarks

Written by \`perf/bench.sh\`; do not edit by hand, run it again.

- Date: $(date -u '+%Y-%m-%d %H:%M UTC')
- Machine: $NCPU CPUs, $CPU_MODEL, Linux $(uname -r)
- Peers: $("$NGINX" -v 2>&1 | sed 's/.*: //'), $("$HAPROXY" -v 2>&1 | head -1 | awk '{print "HAProxy", $3}'), $(wrk -v 2>&1 | head -1 | awk '{print "wrk", $2}')
- Command: \`$CMD\`
- Set-up: origin = nginx \`return 200\` (22-byte body) on CPU $LOAD_CPU; the proxy
  under test pinned to CPU $PROXY_CPU with one worker (sluice-runtime
  \`--workers 1\`, nginx \`worker_processes 1\` with upstream \`keepalive 64\`,
  HAProxy \`nbthread 1\` with \`http-reuse always\`), no access logs; wrk
  ($WRK_THREADS thread, $CONNECTIONS connections) on CPU $LOAD_CPU, $WARMUP warm-up
  (discarded) then $DURATION measured per test.
- CPU µs/request = (utime + stime of the proxy process over the measured run,
  from /proc/PID/stat, nginx master + worker) / requests completed.
  Errors = wrk non-2xx responses + socket errors.
- A shared 2-core machine gives noisy absolute numbers: compare the rows of
  one run, not runs of different days.

$TABLE
EOF
    echo
    echo "wrote $OUT"
fi
