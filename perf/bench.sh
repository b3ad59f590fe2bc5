#!/usr/bin/env bash
# perf/bench.sh: sluice-runtime against nginx and HAProxy as reverse proxies,
# side by side in one run (DESIGN.md "Measuring performance").
#
# What it does: starts a fast origin (nginx answering `return 200` with a
# small body) and, one proxy at a time, sluice-runtime (--workers 1), nginx
# (1 worker, upstream keepalive) and HAProxy (nbthread 1, http-reuse always)
# in front of it. The proxy is pinned to CPU $PROXY_CPU, wrk to CPU
# $LOAD_CPU and the origin to CPU $ORIGIN_CPU (by default the load's). For
# GET, POST 1 KB and POST 5 KB it runs wrk for $WARMUP (discarded) then
# $DURATION, and reports requests/s, CPU
# microseconds per request of the proxy process (utime+stime from
# /proc/PID/stat over the measured run / completed requests), errors
# (non-2xx + socket errors) and ratios to nginx. Writes docs/benchmarks.md.
#
# TLS and HTTP/2 (opt-in: TESTS=all, or name them): every proxy also listens
# with TLS 1.3 (one ECDSA P-256 certificate made here with the openssl CLI,
# ALPN h2 and http/1.1) and with h2c (HTTP/2 prior knowledge), and
#   https_get          wrk over https, keep-alive GET
#   h2c / h2tls        h2load -c 50 -m 10, h2c and h2 over TLS
#   handshake_new      h2load --h1 -H 'Connection: close': a new connection
#                      and a full handshake per GET ($HANDSHAKE_CLIENTS at once)
#   handshake_resumed  wrk -H 'Connection: close' over https: the same with
#                      TLS 1.3 ticket resumption (checked with s_time -reuse)
#   h2_slow_reader     perf/h2_slow_reader.py downloads $SLOW_BYTES over h2
#                      at $SLOW_RATE bytes/s; reports the proxy's idle and
#                      peak RSS (limit: peak within 64 MB of idle)
#   grpc_unary         perf/grpc_latency.py: $GRPC_CALLS sequential unary calls
#                      to a grpcio server directly and through each proxy
#                      (h2c, nginx grpc_pass, HAProxy proto h2): p50/p99,
#                      latency added, proxy CPU per call
# (perf/README.md says why these tools.)
#
# What it does not do: build anything (run `make bench`, or build first and
# point BUILD at the tree), run as root, or touch paths outside a mktemp dir.
#
# Environment (all optional):
#   BUILD=build          where bin/sluice-runtime is
#   DURATION=10s WARMUP=2s CONNECTIONS=50 WRK_THREADS=1
#   PROXIES="sluice nginx haproxy"   which proxies to measure
#   TESTS="get post1k post5k"       or "all", or any of $ALL_TESTS below
#   HANDSHAKE_CLIENTS=50             concurrent connections of the handshake tests
#   H2_CLIENTS=50 H2_STREAMS=10      h2load -c / -m of h2c and h2tls
#   SLOW_BYTES=1073741824 SLOW_RATE=67108864   h2_slow_reader size and rate
#   GRPC_CALLS=10000                  calls per path of grpc_unary
#   PROXY_CPU=0 LOAD_CPU=1 ORIGIN_CPU=$LOAD_CPU   (on a machine of 3 CPUs or
#                                     more, ORIGIN_CPU=2 gives the origin a CPU
#                                     of its own: see the rate section)
#   OUT=docs/benchmarks.md            ("-" = only print the table)
#   PROXIES="... sluice-chain ..."    also sluice-runtime with the policy issue's
#                                     realistic chain (api-key + rate-limit local +
#                                     headers + cors), for the cost of policies
#   PROXIES="... sluice-jwt ..."      also sluice-runtime with the jwt policy alone
#                                     (RS256, a 2048-bit key inline)
#   PROXIES="... sluice-pol-NAME ..." sluice-runtime with the policy NAME alone
#                                     (policy_alone below; the features section
#                                     runs one per policy of $POLICIES_ALONE)
#   PROXIES="... sluice-rr sluice-srate ..."  sluice-runtime with an Api of two
#                                     Backends: the default weighted pick, and
#                                     routing.strategy: success-rate (its cost)
#   PROXIES="... nginx-chain ..."     also nginx with the chain's nginx equivalent
#                                     (map of API keys + limit_req + add_header)
#                                     The three policy variants run the GET and POST
#                                     tests only; in a run with any of them every
#                                     proxy gets the same request headers (an API
#                                     key, an Origin and a bearer JWT), so a
#                                     variant's cost is its policies' work.
#   PROXIES="... sluice-log-file sluice-log-http sluice-log-es sluice-log-ch nginx-log"
#                                     the cost of the traffic log: sluice-runtime
#                                     with one sink on the Gateway (a JSON-lines
#                                     file; the http sink and the elasticsearch
#                                     _bulk sink to perf/log_collector.py; the
#                                     clickhouse sink to a clickhouse-server the
#                                     run starts), and nginx with a JSON
#                                     access_log (buffer=64k flush=1s). The
#                                     collectors run on the load CPU. GET and POST
#                                     tests only; the report has each sink's
#                                     records delivered and dropped.
#   ROUNDS=1                          run every proxy this many times, in
#                                     alternating order (reversed every other
#                                     round), and report the median of each
#                                     figure: on a shared machine one run of a
#                                     proxy can be 20-30% off either way
#                                     (the saturation, features and scaling
#                                     sections; the rate section has its own
#                                     RATE_ROUNDS)
#   BASELINE=path/to/sluice-runtime   also measure this binary, as proxy
#                                     "sluice-base", in the same run (before/after
#                                     figures of a change: build the old commit
#                                     into another tree and point BASELINE at it)
#
# Issue 15's sections (SECTIONS, default all five, in this order; every
# section writes a CSV beside OUT, in the directory ${OUT%.md}/, and
# perf/bench_report.py draws the PNGs with gnuplot):
#   saturation   the matrix above, for every route set of ROUTE_SETS: "1" (one
#                Api, prefix /), "100x10" (100 Apis of 10 operations), "10000"
#                (1,000 Apis of 10 operations), each proxy given the same table
#                (nginx exact locations, HAProxy a map); route sets other than
#                "1" run ROUTE_TESTS. Tests include post100k and get_close (a
#                new connection per request: Connection: close).
#   sweep        wrk --latency at SWEEP connections (1 10 50 200 1000), for
#                SWEEP_DURATION each: requests/s, p50, p99; the knee marked
#   rate         perf/openload (open loop, no coordinated omission) at
#                RATE_LOADS percent (25 50 75) of the slowest proxy's GET
#                saturation rate, RATE_CONNECTIONS connections, RATE_DURATION
#                seconds, through each proxy and to the origin directly;
#                RATE_ROUNDS rounds per load (9; 1 with QUICK=1) with the
#                targets taking turns (median reported, and in how many rounds
#                sluice's p99 and p99.9 were at or below nginx's)
#   features     GET through each of FEATURE_PROXIES (traffic log sinks,
#                policy chains) and FEATURE_TESTS (https_get, h2c) through the
#                plain proxies, each against plain GET of the same section
#   scaling      sluice, nginx, HAProxy with 1..CPUS workers (CPUS=nproc),
#                pinned to CPUs 0..N-1: requests/s per core
# QUICK=1: a smoke run of all five, meant to take under 3 minutes (1 s runs,
# no warm-ups, fewer tests; 4 minutes under a load average of 10); its
# figures are not results.
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$PWD

BUILD=${BUILD:-build}
QUICK=${QUICK:-}
if [ -n "$QUICK" ]; then
    : "${DURATION:=1s}" "${WARMUP:=0}" "${TESTS:=get post100k get_close}"
    : "${ROUTE_SETS:=1 10000}" "${ROUTE_TESTS:=get}" "${SWEEP_DURATION:=1s}"
    : "${RATE_DURATION:=1}" "${RATE_ROUNDS:=1}"
    : "${FEATURE_PROXIES:=sluice-log-file sluice-chain sluice-pol-basic-auth sluice-pol-cache sluice-pol-json-schema nginx-chain}"
    : "${CONNECTIONS:=20}"
fi
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
CONNECTIONS=${CONNECTIONS:-50}
WRK_THREADS=${WRK_THREADS:-1}
PROXIES=${PROXIES:-"sluice nginx haproxy"}
TESTS=${TESTS:-"get post1k post5k post100k get_close"}
ALL_TESTS="get post1k post5k post100k postjson get_close https_get h2c h2tls handshake_new handshake_resumed h2_slow_reader grpc_unary"
[ "$TESTS" != all ] || TESTS=$ALL_TESTS
HANDSHAKE_CLIENTS=${HANDSHAKE_CLIENTS:-50}
H2_CLIENTS=${H2_CLIENTS:-50}
H2_STREAMS=${H2_STREAMS:-10}
SLOW_BYTES=${SLOW_BYTES:-1073741824}
SLOW_RATE=${SLOW_RATE:-67108864}
SLOW_LIMIT_KB=$((64 * 1024)) # the target of issue 9: peak RSS within 64 MB of idle
# TLS 1.3 suites given to all three proxies, in sluice-runtime's default order
# (each proxy picks by server preference, so all three negotiate the same one).
SUITES=TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256
PROXY_CPU=${PROXY_CPU:-0}
PROXY_CPUSET=$PROXY_CPU # scaling: the CPUs of the workers
LOAD_CPU=${LOAD_CPU:-1}
ORIGIN_CPU=${ORIGIN_CPU:-$LOAD_CPU}
OUT=${OUT:-docs/benchmarks.md}
ROUNDS=${ROUNDS:-1}
BASELINE=${BASELINE:-}
SECTIONS=${SECTIONS:-"saturation sweep rate features scaling"}
for section in $SECTIONS; do
    case $section in saturation | sweep | rate | features | scaling) ;;
    *) echo "bench: unknown section $section (known: saturation sweep rate features scaling)" >&2; exit 1 ;;
    esac
done
ROUTE_SETS=${ROUTE_SETS:-"1 100x10 10000"}
ROUTE_TESTS=${ROUTE_TESTS:-"get post1k get_close"}
SWEEP=${SWEEP:-"1 10 50 200 1000"}
SWEEP_DURATION=${SWEEP_DURATION:-5s}
RATE_LOADS=${RATE_LOADS:-"25 50 75"}
# Many short rounds rather than a few long ones: the hypervisor's stalls come
# in episodes of seconds (see the rate section), and the median of nine
# 3-second rounds is decided by the rounds without one, where the median of
# three 10-second rounds is decided by whichever two had the fewest.
RATE_DURATION=${RATE_DURATION:-3}
RATE_ROUNDS=${RATE_ROUNDS:-9}
RATE_CONNECTIONS=${RATE_CONNECTIONS:-50}
# A rate run during which the hypervisor took more than RATE_MAX_STEAL_MS of
# the proxy's and the load's CPUs (steal time, /proc/stat) runs once more,
# and the run with less steal counts (see the rate section); RATE_RETRIES
# such runs at most (default: a quarter of the section's runs).
RATE_MAX_STEAL_MS=${RATE_MAX_STEAL_MS:-50}
# A load at which the load CPU (or the origin's) was at least RATE_BUSY_MAX
# percent busy in sluice's or nginx's runs (median of the rounds) measured the
# client's queue, not the proxies: the tail target is not decided there.
RATE_BUSY_MAX=${RATE_BUSY_MAX:-95}
# Each policy alone (sluice-pol-NAME, see policy_alone) besides the chain.
POLICIES_ALONE="api-key basic-auth rate-limit headers cors ip-filter request-size rewrite cache json-schema"
FEATURE_PROXIES=${FEATURE_PROXIES:-"sluice-log-file sluice-log-http sluice-chain sluice-jwt $(printf 'sluice-pol-%s ' $POLICIES_ALONE)sluice-rr sluice-srate nginx-log nginx-chain"}
FEATURE_TESTS=${FEATURE_TESTS:-"https_get h2c postjson"}
CPUS=${CPUS:-$(nproc)}
# Set per measurement: the route set, the worker count and CPUs of the proxy.
ROUTES=1
WORKERS=1
if [ -n "$BASELINE" ]; then
    [ -x "$BASELINE" ] || die_early=1
    case " $PROXIES " in *" sluice-base "*) ;; *) PROXIES="sluice-base $PROXIES" ;; esac
fi
RUNTIME="$BUILD/bin/sluice-runtime"
CHAIN_KEY=bench-key-0123456789
POLICY_PROXIES="sluice-chain sluice-jwt nginx-chain"
is_policy_proxy() { case " $POLICY_PROXIES " in *" $1 "*) return 0 ;; esac; case $1 in sluice-pol-*) return 0 ;; *) return 1 ;; esac; }
ROUTING_PROXIES="sluice-rr sluice-srate"
is_routing_proxy() { case " $ROUTING_PROXIES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
LOG_PROXIES="sluice-log-file sluice-log-http sluice-log-es sluice-log-ch nginx-log"
is_log_proxy() { case " $LOG_PROXIES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# A variant (policies, traffic log) runs the plain HTTP/1.1 tests only.
is_variant_proxy() { is_policy_proxy "$1" || is_log_proxy "$1" || is_routing_proxy "$1"; }
WITH_POLICIES=""
in_section() { case " $SECTIONS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
ALL_PROXIES=$PROXIES
if in_section features; then ALL_PROXIES="$PROXIES $FEATURE_PROXIES"; fi
for p in $ALL_PROXIES; do if is_policy_proxy "$p"; then WITH_POLICIES=1; fi; done
case $RUNTIME in /*) ;; *) RUNTIME="$REPO/$RUNTIME" ;; esac
PY=/usr/bin/python3

die() { echo "bench: $*" >&2; exit 1; }

# The sweep's 1,000 connections: wrk, the proxy (both sides) and the origin
# each need that many descriptors and more.
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt 16384 ]; then
    ulimit -n 16384 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
fi

wants() { case " $TESTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
NEED_TLS=""
for test in $TESTS; do
    case " $ALL_TESTS " in *" $test "*) ;; *) die "unknown test $test (known: $ALL_TESTS)" ;; esac
    case $test in get | post1k | post5k | post100k | postjson | get_close | grpc_unary) ;; *) NEED_TLS=1 ;; esac
done
if in_section features; then
    for test in $FEATURE_TESTS; do
        case $test in https_get | h2c | h2tls) NEED_TLS=1 ;; postjson) ;; *) die "FEATURE_TESTS: $test is not one of https_get h2c h2tls postjson" ;; esac
    done
fi
tools="nginx haproxy wrk taskset curl getconf openssl"
if wants h2c || wants h2tls || wants handshake_new || in_section features; then tools="$tools h2load"; fi
if in_section sweep || in_section rate || in_section features || in_section scaling; then tools="$tools gnuplot"; fi
OPENLOAD="$BUILD/perf/openload"
case $OPENLOAD in /*) ;; *) OPENLOAD="$REPO/$OPENLOAD" ;; esac
if in_section rate; then
    [ -x "$OPENLOAD" ] || die "$OPENLOAD not found: build it first (make BUILD=$BUILD $BUILD/perf/openload)"
fi
for tool in $tools; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] ||
        die "$tool not found (make deps installs it)"
done
if wants h2_slow_reader; then
    $PY -c 'import h2' 2>/dev/null || die "python3-h2 not found (make deps installs it)"
fi
if wants grpc_unary; then
    $PY -c 'import grpc' 2>/dev/null || die "python3-grpcio not found (make deps installs it)"
fi
GRPC_CALLS=${GRPC_CALLS:-10000}
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
case " $ALL_PROXIES " in *" sluice "* | *" sluice-chain "* | *" sluice-jwt "* | *" sluice-log-"* | *" sluice-rr "* | *" sluice-srate "* | *" sluice-pol-"*)
    [ -x "$RUNTIME" ] || die "$RUNTIME not found: build it first (make BUILD=$BUILD)" ;;
esac
[ -z "${die_early:-}" ] || die "BASELINE=$BASELINE is not an executable sluice-runtime"
NCPU=$(nproc)
if [ "$PROXY_CPU" -ge "$NCPU" ] || [ "$LOAD_CPU" -ge "$NCPU" ] || [ "$ORIGIN_CPU" -ge "$NCPU" ]; then
    die "needs CPUs $PROXY_CPU, $LOAD_CPU and $ORIGIN_CPU (PROXY_CPU, LOAD_CPU, ORIGIN_CPU), this machine has $NCPU"
fi
CLK_TCK=$(getconf CLK_TCK)
# Run under `chrt -f` to keep other work on the machine off the load CPU,
# the proxies still run as they do in production, SCHED_OTHER: under a
# real-time policy a busy worker thread never yields its CPU to the
# runtime's other threads (traffic log logger and sinks, the main thread),
# which then starve.
PROXY_SCHED=()
case $(chrt -p $$ 2>/dev/null) in *SCHED_FIFO* | *SCHED_RR*) PROXY_SCHED=(chrt -o 0) ;; esac

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
    [ -n "${KEEP_TMP:-}" ] || rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
    $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# N distinct free ports on one line (held open together, so never the same twice).
free_ports() {
    $PY -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

# Waits until GET http://127.0.0.1:$1/ answers 200 (the process $2 must live).
wait_http() { # port pid name [path]
    local port=$1 pid=$2 name=$3 path=${4:-/} code
    for _ in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || die "$name exited during start-up (see $TMP)"
        code=$(curl -s -o /dev/null -w '%{http_code}' "${POLICY_HDRS[@]}" \
            "http://127.0.0.1:$port$path" || true)
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

# "10s" -> 10, "2m" -> 120, at least 1 (sizes handshake_new's h2load -n).
seconds_of() {
    local d=$1 n
    case $d in
    *ms) n=$(( ${d%ms} / 1000 )) ;;
    *s) n=${d%s} ;;
    *m) n=$(( ${d%m} * 60 )) ;;
    *h) n=$(( ${d%h} * 3600 )) ;;
    *) n=$d ;;
    esac
    [ "$n" -ge 1 ] 2>/dev/null || n=1
    echo "$n"
}

fill() { # template out [KEY=VALUE...]
    local tmpl=$1 out=$2 kv
    shift 2
    cp "$tmpl" "$out"
    for kv in "$@"; do
        sed -i "s|@${kv%%=*}@|${kv#*=}|g" "$out"
    done
}

# --- policy variants: a JWT signed with a fresh RSA key, its JWKS ------------
JWT_TOKEN=""
if [ -n "$WITH_POLICIES" ]; then
    $PY -c 'import cryptography' 2>/dev/null ||
        die "python3-cryptography not found (make deps installs it)"
    mkdir -p "$TMP/jwt"
    $PY - "$TMP/jwt" <<'EOF' || die "cannot make the bench JWT"
import base64, json, sys, time
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()
def uint(n):
    return b64(n.to_bytes((n.bit_length() + 7) // 8, "big"))
key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
pub = key.public_key().public_numbers()
head = b64(json.dumps({"alg": "RS256", "typ": "JWT", "kid": "bench"}).encode())
body = b64(json.dumps({"iss": "https://idp.bench", "aud": "bench", "sub": "wrk",
                       "exp": int(time.time()) + 86400, "scope": "bench"}).encode())
sig = key.sign((head + "." + body).encode(), padding.PKCS1v15(), hashes.SHA256())
open(sys.argv[1] + "/token", "w").write(head + "." + body + "." + b64(sig))
open(sys.argv[1] + "/jwks.json", "w").write(json.dumps(
    {"keys": [{"kty": "RSA", "kid": "bench", "alg": "RS256", "n": uint(pub.n), "e": uint(pub.e)}]}))
EOF
    JWT_TOKEN=$(cat "$TMP/jwt/token")
fi
# The request headers of every load in a run with a policy variant.
POLICY_HDRS=()
[ -z "$WITH_POLICIES" ] || POLICY_HDRS=(-H "X-Api-Key: $CHAIN_KEY" -H "Origin: https://app.example.com"
    -H "Authorization: Bearer $JWT_TOKEN")
RUN_HDRS=("${POLICY_HDRS[@]}")
BASIC_USER=wrk
BASIC_PASSWORD=bench-password
BASIC_HASH=$(openssl passwd -6 -salt benchsalt "$BASIC_PASSWORD")

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
    sendfile on;
    server {
        listen 127.0.0.1:$ORIGIN_PORT;
        location / { default_type text/plain; return 200 "hello from the origin\n"; }
        # h2_slow_reader's download: a sparse file, so no disk or page cache
        # is spent on it.
        location = /big { default_type application/octet-stream; alias $TMP/origin/big; }
    }
}
EOF
truncate -s "$SLOW_BYTES" "$TMP/origin/big"
# Started by root, nginx workers run as "nobody": let them reach this one file.
chmod a+x "$TMP" "$TMP/origin"
chmod a+r "$TMP/origin/big"
taskset -c "$ORIGIN_CPU" "$NGINX" -p "$TMP/origin" -c "$TMP/origin/nginx.conf" \
    >"$TMP/origin/stdout" 2>&1 &
ORIGIN_PID=$!
PIDS+=("$ORIGIN_PID")
wait_http "$ORIGIN_PORT" "$ORIGIN_PID" "origin nginx"

# --- the certificate all three proxies serve -----------------------------------
# ECDSA P-256, self-signed (no client here verifies the chain; every client
# still checks the handshake signature with its key). Made per run in $TMP, so
# no key is ever committed.
mkdir -m 700 "$TMP/tls" # the key stays private even though $TMP is now a+x
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj /CN=bench.example -addext subjectAltName=DNS:bench.example \
    -keyout "$TMP/tls/key.pem" -out "$TMP/tls/cert.pem" >"$TMP/tls/openssl.log" 2>&1 ||
    die "openssl req failed: $(cat "$TMP/tls/openssl.log")"
cat "$TMP/tls/cert.pem" "$TMP/tls/key.pem" >"$TMP/tls/haproxy.pem" # HAProxy's crt: both in one file
CERT_SHA256=$(openssl x509 -in "$TMP/tls/cert.pem" -noout -fingerprint -sha256 | sed 's/.*=//')

# --- wrk scripts -------------------------------------------------------------
for size in 1024 5120 102400; do
    cat >"$TMP/post$size.lua" <<EOF
wrk.method = "POST"
wrk.body = string.rep("x", $size)
wrk.headers["Content-Type"] = "application/octet-stream"
EOF
done
# postjson: a 1 KB JSON document of the shape sluice-pol-json-schema's
# schema describes (26 pets, 1,014 bytes), so that the validating variant passes it.
$PY - "$TMP/post.json" >"$TMP/postjson.lua" <<'EOF'
import json, sys
pets = [{"name": "pet-%02d" % i, "tag": "dog", "age": i} for i in range(26)]
body = json.dumps({"pets": pets}, separators=(",", ":"))
open(sys.argv[1], "w").write(body)
print('wrk.method = "POST"')
print("wrk.body = %s" % json.dumps(body))
print('wrk.headers["Content-Type"] = "application/json"')
EOF

# sluice-runtime's CPU clock ticks by thread: "workers logger sinks other"
# (threads named sl-worker-N, sl-tlog, sl-sink-NAME; the rest is the main
# thread). The traffic log's own cost is the logger's and the sinks'.
thread_ticks() { # pid
    local t comm rest w=0 l=0 s=0 o=0 n
    for t in /proc/"$1"/task/*; do
        [ -r "$t/stat" ] || continue
        comm=$(cat "$t/comm" 2>/dev/null || echo ?)
        rest=$(sed 's/.*) //' "$t/stat")
        # shellcheck disable=SC2086 # word splitting is the point
        set -- $rest
        n=$((${12} + ${13}))
        case $comm in
        sl-worker-*) w=$((w + n)) ;;
        sl-tlog) l=$((l + n)) ;;
        sl-sink-*) s=$((s + n)) ;;
        *) o=$((o + n)) ;;
        esac
    done
    echo "$w $l $s $o"
}

# The route set $ROUTES as "APIS OPERATIONS" ("1" = the one catch-all Api):
# "AxB" = A Apis of B operations, "N" = N/10 Apis of 10 operations.
route_dims() {
    case $ROUTES in
    1) echo "1 1" ;;
    *x*) echo "${ROUTES%x*} ${ROUTES#*x}" ;;
    *) echo "$((ROUTES / 10)) 10" ;;
    esac
}
# The path every load requests: with a route table, its last route (the
# worst place for a table searched in order).
route_path() {
    local a o
    read -r a o < <(route_dims)
    if [ "$ROUTES" = 1 ]; then echo /bench; else echo "/api$((a - 1))/op$((o - 1))"; fi
}
# Writes proxy $1's form of the route table $ROUTES into $2: every route an
# exact path /apiI/opJ to the origin, anything else 404. sluice: one Api per
# I (basePath /apiI, operations /opJ, pathType exact) appended to sluice.yaml;
# nginx: routes.conf, one `location = /apiI/opJ` each (an exact-match tree);
# HAProxy: routes.map (path -> backend, an exact-match tree) used by the
# frontend's `use_backend %[path,map(...,notfound)]` (routing.line).
route_table() { # proxy dir
    local kind=$1 dir=$2 a o
    read -r a o < <(route_dims)
    case $kind in
    sluice)
        awk -v a="$a" -v o="$o" 'BEGIN {
            for (i = 0; i < a; i++) {
                printf "---\napiVersion: gateway.sluice.dev/v1alpha1\nkind: Api\nmetadata: {name: api%d}\n", i
                printf "spec:\n  basePath: /api%d\n  backendRefs: [{name: origin}]\n  operations:\n", i
                for (j = 0; j < o; j++) printf "  - {name: op%d, method: \"*\", path: /op%d, pathType: exact}\n", j, j
            }}' >>"$dir/sluice.yaml"
        ;;
    nginx)
        local pass="proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection \"\";"
        if [ "$ROUTES" = 1 ]; then
            printf 'location / {\n    include %s/chain-location.conf;\n    %s\n}\n' "$dir" "$pass" >"$dir/routes.conf"
        else
            awk -v a="$a" -v o="$o" -v pass="$pass" 'BEGIN {
                for (i = 0; i < a; i++) for (j = 0; j < o; j++)
                    printf "location = /api%d/op%d { %s }\n", i, j, pass
                print "location / { return 404; }" }' >"$dir/routes.conf"
        fi
        ;;
    haproxy)
        if [ "$ROUTES" = 1 ]; then
            echo "default_backend origin" >"$dir/routing.line"
        else
            awk -v a="$a" -v o="$o" 'BEGIN {
                for (i = 0; i < a; i++) for (j = 0; j < o; j++) printf "/api%d/op%d origin\n", i, j }' >"$dir/routes.map"
            echo "use_backend %[path,map($dir/routes.map,notfound)]" >"$dir/routing.line"
        fi
        ;;
    esac
}

# Starts proxy $1 listening on $PORT (HTTP/1.1), $TLS_PORT (TLS 1.3, h2 and
# http/1.1) and $H2C_PORT (h2c) and checks each answers; sets PROXY_PID.
# sluice-pol-NAME: the policy NAME alone on the bench Api, configured as a
# user would for plain traffic that it lets through (sets start_proxy's
# chain and consumer). The api-key and basic-auth Consumers are the chain's
# and BASIC_USER's; the rate limit is far above what one core sends; the
# cache answers every request after the first (its row is the cost of a
# hit, the origin is not called); basic-auth's verdict is cached
# (cacheSeconds) as the policy's page recommends, else every request would
# pay for a SHA-crypt of 5,000 rounds.
policy_alone() { # policy
    case $1 in
    api-key)
        chain="  policies:
  - {name: api-key, config: {header: X-Api-Key}}"
        consumer="---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Consumer
metadata: {name: bench}
spec:
  credentials:
    apiKeys:
    - {name: wrk, keyHash: \"sha256:$(printf %s "$CHAIN_KEY" | sha256sum | cut -d' ' -f1)\"}" ;;
    basic-auth)
        chain="  policies:
  - {name: basic-auth, config: {realm: bench, cacheSeconds: 300}}"
        consumer="---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Consumer
metadata: {name: bench}
spec:
  credentials:
    basicAuth:
    - {username: $BASIC_USER, passwordHash: \"$BASIC_HASH\"}" ;;
    rate-limit)
        chain="  policies:
  - name: rate-limit
    config:
      limits:
      - {requests: 1000000, period: 1s, by: ip}" ;;
    headers)
        chain="  policies:
  - name: headers
    config:
      request: {set: {X-Request-Start: \"\${request_id}\"}, remove: [X-Debug]}
      response: {set: {X-Frame-Options: DENY}}" ;;
    cors) chain="  policies:
  - {name: cors, config: {allowOrigins: [\"https://app.example.com\"]}}" ;;
    ip-filter) chain="  policies:
  - {name: ip-filter, config: {allow: [127.0.0.0/8], deny: [10.0.0.0/8]}}" ;;
    request-size) chain="  policies:
  - {name: request-size, config: {maxBytes: 1048576}}" ;;
    rewrite) chain="  policies:
  - {name: rewrite, config: {prefix: /v2}}" ;;
    cache) chain="  policies:
  - {name: cache, config: {ttl: 60s}}" ;;
    json-schema)
        chain="  policies:
  - name: json-schema
    config:
      maxBodyBytes: 65536
      schema:
        type: object
        required: [pets]
        properties:
          pets:
            type: array
            maxItems: 100
            items:
              type: object
              required: [name]
              additionalProperties: false
              properties:
                name: {type: string, minLength: 1, maxLength: 64}
                tag: {type: [string, \"null\"], pattern: \"^[a-z-]+\$\"}
                age: {type: integer, minimum: 0}" ;;
    *) die "sluice-pol-$1: no bench configuration for policy $1 (known: $POLICIES_ALONE)" ;;
    esac
}

# Request headers for one proxy: sluice-pol-basic-auth gets Basic
# credentials in place of the run's Bearer token (one Authorization header).
proxy_headers() { # proxy
    POLICY_HDRS=("${RUN_HDRS[@]}")
    if [ "$1" = sluice-pol-basic-auth ]; then
        POLICY_HDRS=(-H "X-Api-Key: $CHAIN_KEY" -H "Origin: https://app.example.com"
            -H "Authorization: Basic $(printf '%s:%s' "$BASIC_USER" "$BASIC_PASSWORD" | base64 -w0)")
    fi
}

start_proxy() { # name
    local name=$1 port=$PORT dir="$TMP/$1"
    mkdir -p "$dir"
    case $name in
    sluice | sluice-base | sluice-chain | sluice-jwt | sluice-log-* | sluice-rr | sluice-srate | sluice-pol-*)
        local bin=$RUNTIME
        [ "$name" != sluice-base ] || bin=$BASELINE
        # sluice-chain: the realistic chain of the policy issue on the Api
        # (the rate limit far above what one core can send, so every request
        # pays for the check and none is refused).
        local chain="" consumer="" refs="[{name: origin}]" backend2=""
        # sluice-rr / sluice-srate: the cost of success-rate routing against
        # the default weighted pick, both over two Backends (the same origin,
        # so every request succeeds and both stay in the choice).
        if is_routing_proxy "$name"; then
            refs="[{name: origin}, {name: origin2}]"
            backend2="---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Backend
metadata: {name: origin2}
spec:
  endpoints:
  - {address: 127.0.0.1, port: $ORIGIN_PORT}"
        fi
        [ "$name" != sluice-srate ] || chain="  routing: {strategy: success-rate}"
        if [ "$name" = sluice-jwt ]; then
            chain="  policies:
  - name: jwt
    config:
      algorithms: [RS256]
      issuers: [\"https://idp.bench\"]
      audiences: [bench]
      jwks: $(cat "$TMP/jwt/jwks.json")"
        fi
        if [ "$name" = sluice-chain ]; then
            chain="  policies:
  - {name: api-key, config: {header: X-Api-Key}}
  - name: rate-limit
    config:
      limits:
      - {requests: 1000000, period: 1s, by: consumer}
  - {name: headers, config: {response: {set: {X-Frame-Options: DENY}}}}
  - {name: cors, config: {allowOrigins: [\"https://app.example.com\"]}}"
            consumer="---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Consumer
metadata: {name: bench}
spec:
  credentials:
    apiKeys:
    - {name: wrk, keyHash: \"sha256:$(printf %s "$CHAIN_KEY" | sha256sum | cut -d' ' -f1)\"}"
        fi
        case $name in sluice-pol-*) policy_alone "${name#sluice-pol-}" ;; esac
        # sluice-log-*: one traffic log sink on the Gateway, every record.
        local tlog="" admin=(--admin off)
        case $name in
        sluice-log-file) tlog="    - {name: bench, type: file, path: $dir/traffic.jsonl}" ;;
        sluice-log-http) tlog="    - {name: bench, type: http, url: \"http://127.0.0.1:$COLLECTOR_PORT/\"}" ;;
        sluice-log-es) tlog="    - {name: bench, type: elasticsearch, url: \"http://127.0.0.1:$COLLECTOR_PORT/\"}" ;;
        sluice-log-ch) tlog="    - {name: bench, type: clickhouse, url: \"http://127.0.0.1:$CH_HTTP_PORT/\", table: bench.traffic}" ;;
        esac
        if [ -n "$tlog" ]; then
            tlog="  trafficLog:
    sinks:
$tlog"
            ADMIN_PORT=$(free_port)
            admin=(--admin "127.0.0.1:$ADMIN_PORT")
        fi
        # The TLS and h2c listeners only when a test needs them, so that the
        # default run also works with a BASELINE built before they existed.
        local tls_listeners=""
        # (not for variants, which run the plain tests only)
        [ -z "$NEED_TLS" ] || is_variant_proxy "$name" || tls_listeners="  - name: https
    port: $TLS_PORT
    protocol: https
    address: 127.0.0.1
    tls: {certificateRefs: [{name: bench}], minVersion: \"1.3\", cipherSuites: \"$SUITES\"}
  - {name: h2c, port: $H2C_PORT, protocol: h2c, address: 127.0.0.1}
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Certificate
metadata: {name: bench}
spec:
  file: {certificate: $TMP/tls/cert.pem, privateKey: $TMP/tls/key.pem}"
        cat >"$dir/sluice.yaml" <<EOF
apiVersion: gateway.sluice.dev/v1alpha1
kind: Gateway
metadata: {name: bench}
spec:
  listeners:
  - {name: http, port: $port, protocol: http, address: 127.0.0.1}
$tls_listeners
$tlog
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Backend
metadata: {name: origin}
spec:
  endpoints:
  - {address: 127.0.0.1, port: $ORIGIN_PORT}
$backend2
EOF
        if [ "$ROUTES" = 1 ]; then
            cat >>"$dir/sluice.yaml" <<EOF
---
apiVersion: gateway.sluice.dev/v1alpha1
kind: Api
metadata: {name: bench}
spec:
  basePath: /
  backendRefs: $refs
$chain
  operations:
  - {name: all, method: "*", path: /, pathType: prefix}
$consumer
EOF
        else
            route_table sluice "$dir"
        fi
        "${PROXY_SCHED[@]}" taskset -c "$PROXY_CPUSET" "$bin" --config "$dir/sluice.yaml" --workers "$WORKERS" \
            "${admin[@]}" --access-log off --log-level warn >"$dir/stdout" 2>"$dir/stderr" &
        ;;
    nginx | nginx-chain | nginx-log)
        : >"$dir/chain-http.conf"
        : >"$dir/chain-location.conf"
        if [ "$name" = nginx-log ]; then
            # nginx's own traffic log: JSON lines with about the fields of
            # sluice's record, buffered as a performance-minded operator
            # would (a write per 64 KB, or per second).
            cat >"$dir/chain-http.conf" <<'EOF'
log_format bench escape=json '{"time":"$time_iso8601","request_id":"$request_id",'
    '"client":"$remote_addr","method":"$request_method","host":"$host","path":"$uri",'
    '"query":"$args","protocol":"$server_protocol","status":$status,'
    '"bytes_received":$request_length,"bytes_sent":$bytes_sent,'
    '"duration_ms":$request_time,"upstream_ms":"$upstream_response_time",'
    '"upstream":"$upstream_addr","user_agent":"$http_user_agent","referer":"$http_referer"}';
EOF
            echo "access_log $dir/traffic.jsonl bench buffer=64k flush=1s;" >"$dir/chain-location.conf"
        fi
        if [ "$name" = nginx-chain ]; then
            # The chain in nginx's own terms: API keys by a map (nginx
            # compares the plain key; sluice compares SHA-256 digests),
            # limit_req per consumer far above what one core sends, the
            # response header, and CORS for one origin. nginx writes no
            # RateLimit-* headers and answers no preflight here.
            cat >"$dir/chain-http.conf" <<EOF
map \$http_x_api_key \$api_consumer {
    default "";
    "$CHAIN_KEY" bench;
}
map \$http_origin \$cors_origin {
    default "";
    "https://app.example.com" \$http_origin;
}
limit_req_zone \$api_consumer zone=per_consumer:1m rate=1000000r/s;
EOF
            cat >"$dir/chain-location.conf" <<EOF
if (\$api_consumer = "") { return 401; }
limit_req zone=per_consumer burst=1000 nodelay;
proxy_set_header X-Api-Key "";
add_header X-Frame-Options DENY always;
add_header Access-Control-Allow-Origin \$cors_origin always;
add_header Vary Origin always;
EOF
        fi
        route_table nginx "$dir"
        fill "$REPO/perf/nginx.conf.tmpl" "$dir/nginx.conf" PREFIX="$dir" \
            LISTEN_PORT="$port" TLS_PORT="$TLS_PORT" H2C_PORT="$H2C_PORT" \
            ORIGIN_PORT="$ORIGIN_PORT" CERT="$TMP/tls/cert.pem" KEY="$TMP/tls/key.pem" \
            SUITES="$SUITES" WORKERS="$WORKERS"
        "${PROXY_SCHED[@]}" taskset -c "$PROXY_CPUSET" "$NGINX" -p "$dir" -c "$dir/nginx.conf" \
            >"$dir/stdout" 2>"$dir/stderr" &
        ;;
    haproxy)
        route_table haproxy "$dir"
        fill "$REPO/perf/haproxy.cfg.tmpl" "$dir/haproxy.cfg" \
            LISTEN_PORT="$port" TLS_PORT="$TLS_PORT" H2C_PORT="$H2C_PORT" \
            ORIGIN_PORT="$ORIGIN_PORT" CERT_PEM="$TMP/tls/haproxy.pem" SUITES="$SUITES" \
            WORKERS="$WORKERS" ROUTING="$(cat "$dir/routing.line")"
        "${PROXY_SCHED[@]}" taskset -c "$PROXY_CPUSET" "$HAPROXY" -db -f "$dir/haproxy.cfg" \
            >"$dir/stdout" 2>"$dir/stderr" &
        ;;
    *) die "unknown proxy $name" ;;
    esac
    PROXY_PID=$!
    PIDS+=("$PROXY_PID")
    wait_http "$port" "$PROXY_PID" "$name" "$(route_path)"
    # A POST must pass too, with the origin's answer.
    local body post=(--data-binary @"$TMP/post1024.lua")
    [ "$name" != sluice-pol-json-schema ] ||
        post=(-H "Content-Type: application/json" --data-binary @"$TMP/post.json")
    body=$(curl -s -X POST "${POLICY_HDRS[@]}" "${post[@]}" "http://127.0.0.1:$port$(route_path)")
    [ "$body" = "hello from the origin" ] || die "$name: POST through the proxy answered '$body'"
    if [ "$ROUTES" != 1 ]; then # the table routes: a path outside it is not found
        body=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/api0/nope")
        [ "$body" = 404 ] || die "$name: a path outside the $ROUTES route set answered $body, not 404"
    fi
    # A variant runs the plain HTTP/1.1 tests only.
    # (and only with the one-Api set: the route tables are on the HTTP listener)
    [ -z "$NEED_TLS" ] || [ "$ROUTES" != 1 ] || is_variant_proxy "$name" || check_tls_h2 "$name"
}

# The TLS and h2c listeners answer through the proxy, with the run's
# certificate, TLS 1.3 and the same suite for every proxy; records
# "name protocol suite group" in $TMP/tls/params.
check_tls_h2() {
    local name=$1 body v s_out
    for v in --http1.1 --http2; do
        body=$(curl -sk "$v" "https://127.0.0.1:$TLS_PORT/x" || true)
        [ "$body" = "hello from the origin" ] || die "$name: GET over TLS ($v) answered '$body'"
    done
    body=$(curl -s --http2-prior-knowledge "http://127.0.0.1:$H2C_PORT/x" || true)
    [ "$body" = "hello from the origin" ] || die "$name: GET over h2c answered '$body'"
    # What openssl s_time (probe_resumption) sends: HTTP/1.0 without Host.
    s_out=$(printf 'GET /bench HTTP/1.0\r\n\r\n' |
        timeout 10 openssl s_client -connect "127.0.0.1:$TLS_PORT" -servername bench.example \
            -ign_eof 2>/dev/null || true)
    case $s_out in
    *"HTTP/1."?" 200"*"hello from the origin"*) ;;
    *) die "$name: HTTP/1.0 GET over TLS did not answer 200: $(echo "$s_out" | grep -m1 '^HTTP' || echo none)" ;;
    esac
    s_out=$(timeout 10 openssl s_client -connect "127.0.0.1:$TLS_PORT" -servername bench.example \
        </dev/null 2>&1 || true)
    local fp
    fp=$(echo "$s_out" | openssl x509 -noout -fingerprint -sha256 2>/dev/null | sed 's/.*=//')
    [ "$fp" = "$CERT_SHA256" ] || die "$name: serves another certificate ($fp)"
    echo "$s_out" >"$TMP/tls/s_client-$name.txt"
    $PY - "$name" "$TMP/tls/s_client-$name.txt" >>"$TMP/tls/params" <<'EOF' ||
import re, sys
t = open(sys.argv[2]).read()
proto = re.search(r"^New, (\S+), Cipher is (\S+)", t, re.M)
group = re.search(r"^(?:Server|Peer) Temp Key: ([^,\n]+)", t, re.M)
if not proto or proto.group(1) != "TLSv1.3":
    sys.exit(1)
print(sys.argv[1], proto.group(1), proto.group(2), group.group(1) if group else "?")
EOF
        die "$name: not TLS 1.3 (see $TMP/tls/s_client-$name.txt)"
}

stop_proxy() {
    kill -TERM "$PROXY_PID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$PROXY_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$PROXY_PID" 2>/dev/null || true
    wait "$PROXY_PID" 2>/dev/null || true
}

# Runs load $1 against the proxy for $2, output in $3: wrk (HTTP/1.1, plain
# or TLS) or h2load (HTTP/2, and full handshakes).
run_load() { # test duration outfile [count: handshake_new's number of connections]
    local test=$1 dur=$2 out=$3 count=${4:-$((HANDSHAKE_CLIENTS * 20))} script=()
    local url
    url="http://127.0.0.1:$PORT$(route_path)"
    case $test in
    get | post1k | post5k | post100k | postjson | get_close | https_get)
        case $test in
        post1k) script=(-s "$TMP/post1024.lua") ;;
        postjson) script=(-s "$TMP/postjson.lua") ;;
        post5k) script=(-s "$TMP/post5120.lua") ;;
        post100k) script=(-s "$TMP/post102400.lua") ;;
        get_close) script=(-H "Connection: close") ;; # a new connection per request
        https_get) url="https://127.0.0.1:$TLS_PORT/bench" ;; # wrk sends no ALPN: HTTP/1.1
        esac
        taskset -c "$LOAD_CPU" wrk -t"$WRK_THREADS" -c"$CONNECTIONS" -d"$dur" "${script[@]}" \
            "${POLICY_HDRS[@]}" "$url" >"$out" 2>&1 || die "wrk failed: $(cat "$out")"
        ;;
    h2c | h2tls)
        url="http://127.0.0.1:$H2C_PORT/bench"
        [ "$test" = h2c ] || url="https://127.0.0.1:$TLS_PORT/bench"
        taskset -c "$LOAD_CPU" h2load -c"$H2_CLIENTS" -m"$H2_STREAMS" -D"$dur" "$url" \
            >"$out" 2>&1 || die "h2load failed: $(tail -20 "$out")"
        ;;
    handshake_new)
        # A new connection per request: "Connection: close" makes the proxy
        # close after each answer and h2load reconnect. h2load (1.52) never
        # offers a session, so every connection is a full handshake. -D stalls
        # when connections close, so the count comes from the caller.
        timeout 600 taskset -c "$LOAD_CPU" h2load --h1 -H 'Connection: close' \
            -c"$HANDSHAKE_CLIENTS" -n"$count" "https://127.0.0.1:$TLS_PORT/bench" \
            >"$out" 2>&1 || die "h2load failed: $(tail -20 "$out")"
        ;;
    handshake_resumed)
        # The same with wrk, which keeps each connection's SSL object across
        # reconnects (SSL_shutdown + SSL_clear): every new connection offers
        # the TLS 1.3 ticket of the one before and is resumed
        # (probe_resumption checks that the proxy takes such tickets).
        taskset -c "$LOAD_CPU" wrk -t"$WRK_THREADS" -c"$HANDSHAKE_CLIENTS" -d"$dur" \
            -H 'Connection: close' "https://127.0.0.1:$TLS_PORT/bench" \
            >"$out" 2>&1 || die "wrk failed: $(cat "$out")"
        ;;
    *) die "unknown test $test" ;;
    esac
}

# Prints "resumed/connections" of a short "openssl s_time -reuse" run: each
# connection offers the ticket of the one before, as wrk's reconnects do, so
# this says whether handshake_resumed really measures resumed handshakes
# (wrk cannot tell). Outside the measured run.
probe_resumption() {
    local out="$TMP/$1-s_time-reuse.txt"
    timeout 30 taskset -c "$LOAD_CPU" openssl s_time -connect "127.0.0.1:$TLS_PORT" \
        -www /bench -reuse -time 1 >"$out" 2>&1 || true
    # one character per timed connection: "r" resumed, anything else full
    grep -E '^[*r]+$' "$out" | tr -d '\n' | awk '{n = length($0); r = gsub(/r/, ""); print r "/" n}'
}

# Parses a load's output: "requests rps errors".
parse_load() { # test outfile
    $PY - "$1" "$2" <<'EOF'
import re, sys
test, path = sys.argv[1], sys.argv[2]
t = open(path).read()
if test in ("get", "post1k", "post5k", "post100k", "postjson", "get_close", "https_get",
            "handshake_resumed"):  # wrk
    m = re.search(r"(\d+) requests in", t)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", t)
    if not m or not rps:
        sys.exit("cannot parse wrk output:\n" + t)
    errors = sum(int(x) for x in re.findall(r"Non-2xx or 3xx responses: (\d+)", t))
    s = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", t)
    if s:
        errors += sum(int(x) for x in s.groups())
    print(m.group(1), rps.group(1), errors)
else:  # h2load
    proto = re.search(r"Application protocol: (\S+)", t)
    want = {"h2c": "h2c", "h2tls": "h2", "handshake_new": "http/1.1"}[test]
    if not proto or proto.group(1) != want:
        sys.exit("h2load did not speak %s:\n%s" % (want, t))
    rps = re.search(r"finished in [\d.]+\w*, ([\d.]+) req/s", t)
    req = re.search(r"requests: \d+ total, \d+ started, (\d+) done, \d+ succeeded, "
                    r"(\d+) failed", t)
    codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", t)
    if not rps or not req or not codes:
        sys.exit("cannot parse h2load output:\n" + t)
    errors = int(req.group(2)) + sum(int(x) for x in codes.groups()[1:])
    print(req.group(1), rps.group(1), errors)
EOF
}

# h2_slow_reader for the running proxy: one row in $SLOW_RESULTS,
# "proxy idle_kb peak_kb seconds bytes verdict".
slow_reader() { # proxy
    local proxy=$1 out="$TMP/$1-h2_slow_reader.json" p args=()
    for p in $PROXY_PID $(pgrep -P "$PROXY_PID" || true); do args+=(--pid "$p"); done
    if taskset -c "$LOAD_CPU" "$PY" "$REPO/perf/h2_slow_reader.py" --port "$TLS_PORT" \
        --expect "$SLOW_BYTES" --rate "$SLOW_RATE" "${args[@]}" >"$out" 2>"$out.err"; then
        :
    fi
    $PY - "$proxy" "$out" "$out.err" "$SLOW_LIMIT_KB" >>"$SLOW_RESULTS" <<'EOF'
import json, sys
proxy, out, err, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
try:
    r = json.loads(open(out).read())
except ValueError:
    why = (open(err).read().strip().splitlines() or ["no output"])[-1]
    print(proxy, 0, 0, 0, 0, "failed:" + why.replace(" ", "_"))
    sys.exit(0)
if r["status"] != 200 or r["bytes"] != r["expect"]:
    verdict = "failed:status_%s,_%d_bytes" % (r["status"], r["bytes"])
else:
    verdict = "yes" if r["peak_kb"] - r["idle_kb"] <= limit else "no"
print(proxy, r["idle_kb"], r["peak_kb"], r["seconds"], r["bytes"], verdict)
EOF
    tail -1 "$SLOW_RESULTS" | awk '{printf "%-8s h2_slow_reader idle %d KB, peak %d KB, %s s, %s bytes, within limit: %s\n", $1, $2, $3, $4, $5, $6}'
}

# --- traffic log variants: the collectors the sinks deliver to ---------------
COLLECTOR_PORT="" CH_HTTP_PORT=""
case " $ALL_PROXIES " in *" sluice-log-http "* | *" sluice-log-es "*)
    COLLECTOR_PORT=$(free_port)
    # Above wrk and the origin when the run may (root): a starved collector
    # would make the sinks drop, and the run would measure dropping.
    prio=()
    if chrt -f 20 true 2>/dev/null; then prio=(chrt -f 20); fi
    taskset -c "$LOAD_CPU" "${prio[@]}" "$PY" "$REPO/perf/log_collector.py" --port "$COLLECTOR_PORT" \
        >"$TMP/collector.log" 2>&1 &
    PIDS+=("$!")
    wait_http "$COLLECTOR_PORT" "$!" "perf/log_collector.py"
    ;;
esac
case " $ALL_PROXIES " in *" sluice-log-ch "*)
    # shellcheck source=perf/clickhouse.sh
    . "$REPO/perf/clickhouse.sh"
    CH_HTTP_PORT=$(free_port)
    clickhouse_start "$TMP/clickhouse" "$CH_HTTP_PORT" "$LOAD_CPU" ||
        die "clickhouse-server did not start (see $TMP/clickhouse)"
    PIDS+=("$CLICKHOUSE_PID")
    clickhouse_query "$CH_HTTP_PORT" "CREATE DATABASE IF NOT EXISTS bench" &&
        clickhouse_query "$CH_HTTP_PORT" "$(clickhouse_table_sql bench.traffic)" ||
        die "cannot create the ClickHouse table"
    ;;
esac

# What a log variant's sink delivered and dropped: a row of $LOG_RESULTS,
# "proxy requests delivered dropped". sluice: its /metrics once the rings and
# the sink's queue are empty (at most 15 s); nginx: the lines of its file
# after USR1 (which flushes the buffer).
log_delivery() { # proxy
    local proxy=$1 m
    if [ "$proxy" = nginx-log ]; then
        kill -USR1 "$PROXY_PID" 2>/dev/null || true
        sleep 1
        echo "$proxy - $(wc -l <"$TMP/$proxy/traffic.jsonl") 0" >>"$LOG_RESULTS"
        return
    fi
    for _ in $(seq 150); do
        m=$(curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" || true)
        echo "$m" | awk '/^sluice_traffic_log_(queue_records|ring_bytes)/ {n += $NF} END {exit n > 0}' && break
        sleep 0.1
    done
    echo "$m" | awk -v p="$proxy" '
        /^sluice_downstream_requests_total / {req = $NF}
        /^sluice_traffic_log_records_total\{/ {got += $NF}
        /^sluice_traffic_log_dropped_total\{/ {drop += $NF}
        END {printf "%s %d %d %d\n", p, req, got, drop}' >>"$LOG_RESULTS"
}

RESULTS="$TMP/results"
SLOW_RESULTS="$TMP/slow_results"
LOG_RESULTS="$TMP/log_results"
THREAD_RESULTS="$TMP/thread_results"
: >"$LOG_RESULTS"
: >"$THREAD_RESULTS"
: >"$RESULTS"
: >"$SLOW_RESULTS"
: >"$TMP/tls/params"
ROUND_ORDERS=()
for round in $(seq "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then
        ROUND_ORDERS+=("$PROXIES")
    else
        ROUND_ORDERS+=("$(echo "$PROXIES" | tr ' ' '\n' | grep . | tac | tr '\n' ' ')")
    fi
done
# The proxies without variants (the peers of every section but features).
PLAIN_PROXIES=""
for proxy in $PROXIES; do
    case $proxy in sluice | sluice-base | nginx | haproxy) PLAIN_PROXIES="$PLAIN_PROXIES $proxy" ;; esac
done
THREAD_OUT=$THREAD_RESULTS

# Runs tests $2 against the started proxy $1 (a warm-up, then the measured
# run with the proxy's CPU time around it); a row per test appended to $3:
# "proxy test requests rps cpu_us errors resumed routes workers".
measure_proxy() { # proxy tests results
    local proxy=$1 tests=$2 results=$3 test resumed count before after tbefore tafter
    local requests rps errors cpu_us log="$TMP/$1-$ROUTES-$WORKERS"
    for test in $tests; do
        # A variant: the plain HTTP/1.1 tests only.
        if is_variant_proxy "$proxy"; then
            case $test in get | post1k | post5k | postjson) ;; *) continue ;; esac
        fi
        if [ "$test" = h2_slow_reader ]; then
            slow_reader "$proxy"
            continue
        fi
        [ "$test" != grpc_unary ] || continue # its own run, below
        resumed=-
        case $test in
        handshake_new) resumed=0 ;; # h2load offers no session
        handshake_resumed) resumed=$(probe_resumption "$proxy") ;;
        esac
        # WARMUP=0: none (the smoke run)
        [ "$WARMUP" = 0 ] || run_load "$test" "$WARMUP" "$log-$test-warmup.txt"
        count=""
        if [ "$test" = handshake_new ] && [ "$WARMUP" != 0 ]; then
            # as many connections as the warm-up's rate makes in $DURATION
            count=$(parse_load "$test" "$log-$test-warmup.txt" |
                awk -v s="$(seconds_of "$DURATION")" '{n = int($2 * s); print (n < 500 ? 500 : n)}')
        fi
        before=$(cpu_ticks "$PROXY_PID")
        tbefore=""
        case $proxy in sluice | sluice-log-*) tbefore=$(thread_ticks "$PROXY_PID") ;; esac
        run_load "$test" "$DURATION" "$log-$test.txt" "$count"
        after=$(cpu_ticks "$PROXY_PID")
        tafter=""
        [ -z "$tbefore" ] || tafter=$(thread_ticks "$PROXY_PID")
        kill -0 "$PROXY_PID" 2>/dev/null || die "$proxy died during $test: $(tail -5 "$TMP/$proxy/stderr")"
        read -r requests rps errors < <(parse_load "$test" "$log-$test.txt")
        cpu_us=$($PY -c "print('%.2f' % (($after - $before) * 1e6 / $CLK_TCK / max($requests, 1)))")
        echo "$proxy $test $requests $rps $cpu_us $errors $resumed $ROUTES $WORKERS" >>"$results"
        if [ -n "$tafter" ] && [ "$ROUTES" = 1 ]; then
            # shellcheck disable=SC2086
            echo "$proxy $test $requests $tbefore $tafter" >>"$THREAD_OUT"
        fi
        printf '%-8s %-17s %10s req/s %8s us/req  errors %s%s%s\n' "$proxy" "$test" "$rps" \
            "$cpu_us" "$errors" "$([ "$resumed" = - ] || echo ", resumed $resumed")" \
            "$([ "$ROUTES" = 1 ] || echo ", routes $ROUTES")$([ "$WORKERS" = 1 ] || echo ", workers $WORKERS")"
    done
}

# Starts proxy $1 on fresh ports, runs tests $2 into $3, stops it.
measure() { # proxy tests results
    read -r PORT TLS_PORT H2C_PORT < <(free_ports 3)
    proxy_headers "$1"
    start_proxy "$1"
    measure_proxy "$@"
    if is_log_proxy "$1"; then log_delivery "$1"; fi
    stop_proxy
    proxy_headers ""
}

# --- saturation: every proxy, test and route set -------------------------------
if in_section saturation; then
    for order in "${ROUND_ORDERS[@]}"; do
        for ROUTES in $ROUTE_SETS; do
            for proxy in $order; do
                if [ "$ROUTES" = 1 ]; then
                    measure "$proxy" "$TESTS" "$RESULTS"
                else # the route tables: the plain proxies only
                    case " $PLAIN_PROXIES " in *" $proxy "*) measure "$proxy" "$ROUTE_TESTS" "$RESULTS" ;; esac
                fi
            done
        done
    done
    ROUTES=1
fi

# --- sweep: requests/s and latency by number of connections --------------------
# Rows of $SWEEP_RESULTS: "proxy connections rps p50_us p99_us errors".
SWEEP_RESULTS="$TMP/sweep_results"
: >"$SWEEP_RESULTS"
if in_section sweep; then
    for proxy in $PLAIN_PROXIES; do
        read -r PORT TLS_PORT H2C_PORT < <(free_ports 3)
        start_proxy "$proxy"
        [ "$WARMUP" = 0 ] || run_load get "$WARMUP" "$TMP/$proxy-sweep-warmup.txt"
        for conns in $SWEEP; do
            out="$TMP/$proxy-sweep-$conns.txt"
            taskset -c "$LOAD_CPU" wrk -t1 -c"$conns" -d"$SWEEP_DURATION" --latency "${POLICY_HDRS[@]}" \
                "http://127.0.0.1:$PORT/bench" >"$out" 2>&1 || die "wrk failed: $(cat "$out")"
            kill -0 "$PROXY_PID" 2>/dev/null || die "$proxy died during the sweep at $conns connections"
            read -r requests rps errors < <(parse_load get "$out")
            $PY - "$out" "$proxy" "$conns" "$rps" "$errors" >>"$SWEEP_RESULTS" <<'EOF'
import re, sys
t = open(sys.argv[1]).read()
unit = {"us": 1, "ms": 1e3, "s": 1e6}
def pct(p):
    m = re.search(r"^\s+%s%%\s+([\d.]+)(us|ms|s)\s*$" % p, t, re.M)
    if not m:
        sys.exit("no %s%% latency in wrk --latency output:\n%s" % (p, t))
    return float(m.group(1)) * unit[m.group(2)]
print(sys.argv[2], sys.argv[3], sys.argv[4], "%.1f" % pct(50), "%.1f" % pct(99), sys.argv[5])
EOF
            tail -1 "$SWEEP_RESULTS" | awk '{printf "%-8s sweep %5s connections %10s req/s  p50 %s us  p99 %s us  errors %s\n", $1, $2, $3, $4, $5, $6}'
        done
        stop_proxy
    done
fi

# --- rate: latency at fixed rates, open loop (perf/openload) --------------------
# Rows of $RATE_RESULTS: "target load_pct rate p50 p90 p99 p999 max errors
# completed round steal_ms runs proxy_busy load_busy origin_busy" (µs; busy:
# percent of each CPU's time during the run); target "origin" is the origin
# called directly.
#
# Steal: on a virtual machine the hypervisor takes a vCPU away for
# milliseconds at a time. Measured here with a busy loop, that is 1-5 ms
# gaps a few times a second on a quiet host and up to a sixth of the time on
# a busy one; every request scheduled in a gap waits for it, so one such
# minute decides a p99 whatever the proxy does. The kernel counts it per
# CPU (the 8th field of /proc/stat's cpuN lines, in clock ticks): a run
# that lost more than RATE_MAX_STEAL_MS of its CPUs runs again, once,
# and the run with less steal counts (RATE_RETRIES times in the section at
# most); each row keeps its steal.
steal_ms() { # cpu... -> milliseconds of steal so far on those CPUs
    awk -v cpus=" $* " -v hz="$(getconf CLK_TCK)" '$1 ~ /^cpu[0-9]+$/ && index(cpus, " " substr($1, 4) " ") {
        s += $9} END {printf "%d", s * 1000 / hz}' /proc/stat
}
# Busy: on 2 vCPUs the client and the origin share $LOAD_CPU, and below
# saturation every request wakes each of them, which on a virtual machine
# costs microseconds of that CPU (measured: perf/README.md); whether it
# still had room decides whether a row's tail is the proxy's or the
# client's queue, so every run reports the busy share of each CPU
# (/proc/stat ticks: user nice system irq softirq over those and idle
# iowait; steal is counted above).
cpus_busy_ticks() { # cpu... -> "busy total" clock ticks so far, per CPU (one read)
    awk -v cpus="$*" 'BEGIN {n = split(cpus, c, " ")}
        $1 ~ /^cpu[0-9]+$/ {k = substr($1, 4); b[k] = $2 + $3 + $4 + $7 + $8; t[k] = b[k] + $5 + $6}
        END {for (i = 1; i <= n; i++) printf "%d %d ", b[c[i]], t[c[i]]}' /proc/stat
}
busy_pcts() { # "$(cpus_busy_ticks ...)" before, after -> percent busy per CPU
    awk -v a="$1" -v b="$2" 'BEGIN {n = split(a, x, " "); split(b, y, " ")
        for (i = 1; i < n; i += 2) {t = y[i + 1] - x[i + 1]; printf "%.1f ", (t > 0 ? 100 * (y[i] - x[i]) / t : 0)}}'
}
RATE_RESULTS="$TMP/rate_results"
: >"$RATE_RESULTS"
SAT_RATE=""
if in_section rate; then
    # The slowest plain proxy's GET saturation rate: this run's, or measured now.
    sat_from() { awk -v p=" $PLAIN_PROXIES " '$2 == "get" && $8 == 1 && $9 == 1 && index(p, " " $1 " ") {
        n[$1]++; r[$1] += $4} END {m = 0; for (k in n) {v = r[k] / n[k]; if (!m || v < m) m = v}; if (m) printf "%.0f", m}' "$1"; }
    SAT_RATE=$(sat_from "$RESULTS")
    if [ -z "$SAT_RATE" ]; then
        : >"$TMP/rate_sat"
        for proxy in $PLAIN_PROXIES; do measure "$proxy" get "$TMP/rate_sat"; done
        SAT_RATE=$(sat_from "$TMP/rate_sat")
    fi
    [ -n "$SAT_RATE" ] || die "rate: no GET saturation rate (PROXIES has none of sluice nginx haproxy)"
    OPENLOAD_HDRS=()
    for h in "${POLICY_HDRS[@]}"; do [ "$h" = -H ] || OPENLOAD_HDRS+=(--header "$h"); done
    # Every proxy runs for the whole section (idle ones cost nothing) and
    # the targets take turns: RATE_ROUNDS rounds per load, the order rotated each
    # round, so a stall of this shared machine lands in one round of one
    # target rather than in all of one proxy's rows. The report takes each
    # percentile's median over the rounds; rate-rounds.csv has every round.
    declare -A RATE_PORT RATE_PID
    RATE_PORT[origin]=$ORIGIN_PORT
    for target in $PLAIN_PROXIES; do
        read -r PORT TLS_PORT H2C_PORT < <(free_ports 3)
        start_proxy "$target"
        RATE_PORT[$target]=$PORT
        RATE_PID[$target]=$PROXY_PID
    done
    read -r -a rate_targets <<<"origin $PLAIN_PROXIES"
    # Runs again for steal: at most a quarter of the section's runs, so a
    # host that is busy throughout costs a quarter more time, not double.
    nloads=$(wc -w <<<"$RATE_LOADS")
    RATE_RETRIES=${RATE_RETRIES:-$((nloads * RATE_ROUNDS * ${#rate_targets[@]} / 4))}
    RATE_CPUS=$(printf '%s\n' "$PROXY_CPU" "$LOAD_CPU" "$ORIGIN_CPU" | sort -un | tr '\n' ' ')
    for pct in $RATE_LOADS; do
        rate=$((SAT_RATE * pct / 100))
        for round in $(seq "$RATE_ROUNDS"); do
            nt=${#rate_targets[@]}
            for k in $(seq 0 $((nt - 1))); do
                target=${rate_targets[$(((k + round - 1) % nt))]}
                best="" best_steal="" best_busy=""
                for run in 1 2; do
                    out="$TMP/$target-rate-$pct-$round-$run.txt"
                    ticks=$(cpus_busy_ticks "$PROXY_CPU" "$LOAD_CPU" "$ORIGIN_CPU")
                    before=$(steal_ms $RATE_CPUS)
                    taskset -c "$LOAD_CPU" "$OPENLOAD" --port "${RATE_PORT[$target]}" --path /bench --rate "$rate" \
                        --connections "$RATE_CONNECTIONS" --warmup 1 --duration "$RATE_DURATION" --timeout 5 \
                        "${OPENLOAD_HDRS[@]}" --csv "$TMP/$target-rate-$pct-$round-$run.csv" >"$out" 2>&1 ||
                        die "openload failed: $(cat "$out")"
                    stolen=$(($(steal_ms $RATE_CPUS) - before))
                    busy=$(busy_pcts "$ticks" "$(cpus_busy_ticks "$PROXY_CPU" "$LOAD_CPU" "$ORIGIN_CPU")")
                    [ "$target" = origin ] || kill -0 "${RATE_PID[$target]}" 2>/dev/null ||
                        die "$target died during the rate section"
                    if [ -z "$best" ] || [ "$stolen" -lt "$best_steal" ]; then
                        best=$out best_steal=$stolen best_busy=$busy
                    fi
                    [ "$run" = 1 ] && [ "$stolen" -gt "$RATE_MAX_STEAL_MS" ] && [ "$RATE_RETRIES" -gt 0 ] || break
                    RATE_RETRIES=$((RATE_RETRIES - 1))
                    echo "$target rate $pct% round $round: the hypervisor took $stolen ms of CPUs $RATE_CPUS(over $RATE_MAX_STEAL_MS): once more ($RATE_RETRIES more allowed)"
                done
                # openload's "key=value ..." line -> a row (round, steal, runs, busy last)
                awk -v t="$target" -v pct="$pct" -v rate="$rate" -v round="$round" -v steal="$best_steal" \
                    -v runs="$run" -v busy="$best_busy" '/p50_us=/ {
                    for (i = 1; i <= NF; i++) {split($i, kv, "="); v[kv[1]] = kv[2]}
                    print t, pct, rate, v["p50_us"], v["p90_us"], v["p99_us"], v["p999_us"], v["max_us"],
                        v["errors"], v["completed"], round, steal, runs, busy; found = 1}
                    END {exit !found}' "$best" >>"$RATE_RESULTS" || die "openload printed no summary: $(cat "$best")"
                tail -1 "$RATE_RESULTS" | awk '{printf "%-8s rate %s%% = %s req/s  round %s  p50 %s  p99 %s  p99.9 %s  max %s us  errors %s  steal %s ms (runs %s)  busy: proxy CPU %s%%, load %s%%, origin %s%%\n", $1, $2, $3, $11, $4, $6, $7, $8, $9, $12, $13, $14, $15, $16}'
            done
        done
    done
    for target in $PLAIN_PROXIES; do
        PROXY_PID=${RATE_PID[$target]}
        stop_proxy
    done
fi

# --- features: each against plain GET through its proxy, one section ---------
# FEATURE_PROXIES are start_proxy's variants (traffic log sinks, policy
# chains); FEATURE_TESTS run through the plain proxies (TLS, HTTP/2).
# Success-rate routing: sluice-srate against sluice-rr (the same two
# Backends with the default weighted pick).
FEAT_RESULTS="$TMP/feature_results"
: >"$FEAT_RESULTS"
# ROUNDS rounds, the order reversed every other round, each figure the
# median of its rounds (as the saturation matrix): this machine's speed
# can change by a third within a minute, and a variant measured once
# would carry that into its "added µs".
if in_section features; then
    THREAD_OUT="$TMP/feature_threads"
    FEAT_ORDER=$(echo $PLAIN_PROXIES $FEATURE_PROXIES)
    for round in $(seq "$ROUNDS"); do
        order=$FEAT_ORDER
        [ $((round % 2)) = 1 ] || order=$(echo "$FEAT_ORDER" | tr ' ' '\n' | tac | tr '\n' ' ')
        for proxy in $order; do
            case " $PLAIN_PROXIES " in
            *" $proxy "*) measure "$proxy" "get $FEATURE_TESTS" "$FEAT_RESULTS" ;;
            *)
                # json-schema checks bodies: it is measured on postjson
                # (against plain sluice's postjson, which FEATURE_TESTS then needs).
                case $proxy in
                sluice-pol-json-schema) measure "$proxy" postjson "$FEAT_RESULTS" ;;
                *) measure "$proxy" get "$FEAT_RESULTS" ;;
                esac
                ;;
            esac
        done
    done
    THREAD_OUT=$THREAD_RESULTS
fi

# --- scaling: 1..CPUS workers on CPUs 0..N-1 ----------------------------------
SCALE_RESULTS="$TMP/scaling_results"
: >"$SCALE_RESULTS"
if in_section scaling; then
    [ "$CPUS" -le "$NCPU" ] || die "CPUS=$CPUS but this machine has $NCPU"
    # ROUNDS rounds, the order reversed every other round, each figure the
    # median of its rounds (as the other sections): one run per proxy and
    # worker count put a single minute of the machine into the table.
    for round in $(seq "$ROUNDS"); do
        order=$PLAIN_PROXIES
        [ $((round % 2)) = 1 ] || order=$(echo "$PLAIN_PROXIES" | tr ' ' '\n' | tac | tr '\n' ' ')
        for WORKERS in $(seq 1 "$CPUS"); do
            PROXY_CPUSET=$([ "$WORKERS" = 1 ] && echo "$PROXY_CPU" || echo "0-$((WORKERS - 1))")
            for proxy in $order; do measure "$proxy" get "$SCALE_RESULTS"; done
        done
    done
    WORKERS=1
    PROXY_CPUSET=$PROXY_CPU
fi

# grpc_unary: its own servers (a grpcio server and each proxy in front of
# it), the same CPUs; rows "path p50 p99 added_p50 added_p99 cpu errors".
GRPC_RESULTS="$TMP/grpc_results"
: >"$GRPC_RESULTS"
if wants grpc_unary; then
    grpc_proxies=""
    for proxy in $PROXIES; do
        case $proxy in sluice | nginx | haproxy) grpc_proxies="$grpc_proxies $proxy" ;; esac
    done
    taskset -c "$LOAD_CPU" "$PY" "$REPO/perf/grpc_latency.py" --build "$BUILD" \
        --calls "$GRPC_CALLS" --proxies "$grpc_proxies" --proxy-cpu "$PROXY_CPU" \
        --rows "$GRPC_RESULTS" || die "grpc_unary failed"
    awk '{printf "%-8s grpc_unary p50 %s us, p99 %s us, added p50 %s us, p99 %s us, %s us CPU/call, errors %s\n", $1, $2, $3, $4, $5, $6, $7}' "$GRPC_RESULTS"
fi

# --- report --------------------------------------------------------------------
CPU_MODEL=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //' || echo unknown)
COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
# The binary is built from the work tree: say when it differs from the commit.
if ! git -C "$REPO" diff --quiet HEAD -- runtime common proto 2>/dev/null; then
    COMMIT="$COMMIT + uncommitted changes in runtime/, common/ or proto/"
fi
KNOBS="BUILD=$BUILD${QUICK:+ QUICK=$QUICK}${BASELINE:+ BASELINE=$BASELINE} SECTIONS=\"$SECTIONS\" ROUNDS=$ROUNDS DURATION=$DURATION WARMUP=$WARMUP CONNECTIONS=$CONNECTIONS WRK_THREADS=$WRK_THREADS PROXIES=\"$PROXIES\" TESTS=\"$TESTS\""
if wants h2c || wants h2tls; then KNOBS="$KNOBS H2_CLIENTS=$H2_CLIENTS H2_STREAMS=$H2_STREAMS"; fi
if wants handshake_new || wants handshake_resumed; then KNOBS="$KNOBS HANDSHAKE_CLIENTS=$HANDSHAKE_CLIENTS"; fi
if wants h2_slow_reader; then KNOBS="$KNOBS SLOW_BYTES=$SLOW_BYTES SLOW_RATE=$SLOW_RATE"; fi
if wants grpc_unary; then KNOBS="$KNOBS GRPC_CALLS=$GRPC_CALLS"; fi
in_section saturation && KNOBS="$KNOBS ROUTE_SETS=\"$ROUTE_SETS\" ROUTE_TESTS=\"$ROUTE_TESTS\""
in_section sweep && KNOBS="$KNOBS SWEEP=\"$SWEEP\" SWEEP_DURATION=$SWEEP_DURATION"
in_section rate && KNOBS="$KNOBS RATE_LOADS=\"$RATE_LOADS\" RATE_CONNECTIONS=$RATE_CONNECTIONS RATE_DURATION=$RATE_DURATION RATE_ROUNDS=$RATE_ROUNDS RATE_MAX_STEAL_MS=$RATE_MAX_STEAL_MS RATE_BUSY_MAX=$RATE_BUSY_MAX"
in_section features && KNOBS="$KNOBS FEATURE_PROXIES=\"$FEATURE_PROXIES\" FEATURE_TESTS=\"$FEATURE_TESTS\""
in_section scaling && KNOBS="$KNOBS CPUS=$CPUS"
if [ "$PROXY_CPU/$LOAD_CPU/$ORIGIN_CPU" != 0/1/1 ]; then
    KNOBS="$KNOBS PROXY_CPU=$PROXY_CPU LOAD_CPU=$LOAD_CPU ORIGIN_CPU=$ORIGIN_CPU"
fi
CMD="make bench  ($KNOBS perf/bench.sh)"
TABLES=$($PY - "$RESULTS" "$SLOW_RESULTS" "$SLOW_LIMIT_KB" "$GRPC_RESULTS" "$GRPC_CALLS" "$LOG_RESULTS" "$THREAD_RESULTS" "$CLK_TCK" <<'EOF'
import sys
import statistics
# One row per (proxy, test): the median of its rounds (ROUNDS).
runs = {}
for l in open(sys.argv[1]):
    if l.strip():
        r = l.split()
        if len(r) > 8 and r[7] != "1":  # a route set: its own rows, "get@10000"
            r[1] = r[1] + "@" + r[7]
        runs.setdefault((r[0], r[1]), []).append(r)
rows = []
for (proxy, test), rs in runs.items():
    med = lambda i: statistics.median(float(x[i]) for x in rs)
    rows.append([proxy, test, str(sum(int(x[2]) for x in rs)), "%.2f" % med(3), "%.2f" % med(4),
                 str(sum(int(x[5]) for x in rs)), rs[-1][6]])
slow = [l.split() for l in open(sys.argv[2]) if l.strip()]
limit_kb = int(sys.argv[3])
grpc_rows = [l.split() for l in open(sys.argv[4]) if l.strip()]
grpc_calls = sys.argv[5]
by = {(r[0], r[1]): r for r in rows}
names = {"get": "GET", "post1k": "POST 1 KB", "post5k": "POST 5 KB", "post100k": "POST 100 KB",
         "postjson": "POST 1 KB JSON",
         "get_close": "GET, new connection per request",
         "https_get": "HTTPS GET", "h2c": "h2c", "h2tls": "h2 (TLS)",
         "handshake_new": "TLS full handshake", "handshake_resumed": "TLS resumed handshake"}
tests = []
for r in rows:
    if r[1] not in tests:
        tests.append(r[1])

def ratio(a, b):
    return "%.2f" % (a / b) if b > 0 else "n/a"

# (the main table of these rows is perf/bench_report.py's "Saturation matrix")
hs = [t for t in tests if t.startswith("handshake_")]
if hs:
    print()
    print("TLS handshakes, one request per connection (target: per CPU second at least nginx's):")
    print()
    print("| handshake | proxy | handshakes/s | CPU µs/handshake | handshakes per CPU second | resumed | errors | per CPU s vs nginx |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for t in hs:
        for r in rows:
            if r[1] != t:
                continue
            proxy, _, req, rps, cpu, err, resumed = r
            per_cpu_s = 1e6 / float(cpu) if float(cpu) > 0 else 0
            ng = by.get(("nginx", t))
            ng_per = 1e6 / float(ng[4]) if ng and float(ng[4]) > 0 else 0
            if t == "handshake_new":
                resumed = "none (h2load)"
            else:
                resumed = "%s (s_time probe)" % resumed
            print("| %s | %s | %.0f | %s | %.0f | %s | %s | %s |" % (
                "full" if t == "handshake_new" else "resumed", proxy, float(rps), cpu,
                per_cpu_s, resumed, err, ratio(per_cpu_s, ng_per)))
variants = [("sluice-chain", "sluice", "api-key + rate-limit (local) + headers + cors"),
            ("sluice-jwt", "sluice", "jwt, RS256, 2048-bit key"),
            ("nginx-chain", "nginx", "map of API keys + limit_req + add_header (CORS, X-Frame-Options)")]
chain = [(v, base, what, t, by[(base, t)], by[(v, t)]) for v, base, what in variants
         for t in tests if (base, t) in by and (v, t) in by]
if chain:
    print()
    print("Cost of policies (target for sluice-chain: at most 15% more CPU per request "
          "than no policies, and below nginx without policies); every proxy of the run "
          "got the same request headers:")
    print()
    print("| variant | policies | test | CPU µs/request, no policies | with them | added µs | ratio | vs nginx, no policies |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for v, base, what, t, plain, ch in chain:
        a, b = float(plain[4]), float(ch[4])
        ng = by.get(("nginx", t))
        vs = ratio(b, float(ng[4])) if ng else "n/a"
        print("| %s | %s | %s | %.2f | %.2f | %.2f | %s | %s |" % (
            v, what, names.get(t, t), a, b, b - a, ratio(b, a), vs))
logv = [("sluice-log-file", "sluice", "file (JSON lines)"),
        ("sluice-log-http", "sluice", "http (batched JSON POST to perf/log_collector.py)"),
        ("sluice-log-es", "sluice", "elasticsearch (_bulk NDJSON to perf/log_collector.py)"),
        ("sluice-log-ch", "sluice", "clickhouse (INSERT ... FORMAT JSONEachRow, clickhouse-server)"),
        ("nginx-log", "nginx", "nginx access_log, JSON, buffer=64k flush=1s")]
logrows = [(v, base, what, t, by[(base, t)], by[(v, t)]) for v, base, what in logv
           for t in tests if (base, t) in by and (v, t) in by]
delivered = {}
for l in open(sys.argv[6]):
    if l.strip():
        p, req, got, drop = l.split()
        d = delivered.setdefault(p, [0, 0, 0])
        d[0] += int(req) if req != "-" else 0
        d[1] += int(got)
        d[2] += int(drop)
if logrows:
    print()
    print("Cost of the traffic log: one sink, a record per request, every field but the "
          "headers (target: at most 5% more CPU per request than no log):")
    print()
    print("| variant | sink | test | CPU µs/request, no log | with the log | added µs | ratio | requests/s, no log | with the log |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for v, base, what, t, plain, lg in logrows:
        a, b = float(plain[4]), float(lg[4])
        print("| %s | %s | %s | %.2f | %.2f | %.2f | %s | %.0f | %.0f |" % (
            v, what, names.get(t, t), a, b, b - a, ratio(b, a), float(plain[3]), float(lg[3])))
    # Per thread: the logger's and the sinks' CPU is the log's own cost,
    # measured directly (no difference of two noisy runs).
    th = {}
    for l in open(sys.argv[7]):
        f = l.split()
        if len(f) != 11:
            continue
        p, t, req = f[0], f[1], int(f[2])
        b, a = [int(x) for x in f[3:7]], [int(x) for x in f[7:11]]
        us = [(a[i] - b[i]) * 1e6 / int(sys.argv[8]) / max(req, 1) for i in range(4)]
        th.setdefault((p, t), []).append(us)
    if th:
        print()
        print("CPU µs/request by thread of sluice-runtime (median of the rounds): the worker, "
              "the traffic log's logger thread and sink thread(s), the main thread; clock "
              "ticks of /proc/PID/task/*/stat, 1/%s s each:" % sys.argv[8])
        print()
        print("| variant | test | worker | logger | sinks | main | logger + sinks vs all, no log |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
        for (p, t), runs_ in sorted(th.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            m = [statistics.median(r[i] for r in runs_) for i in range(4)]
            base = th.get(("sluice", t))
            tot = sum(statistics.median(r[i] for r in base) for i in range(4)) if base else 0
            print("| %s | %s | %.2f | %.2f | %.2f | %.2f | %s |" % (
                p, names.get(t, t), m[0], m[1], m[2], m[3],
                "%.1f%%" % (100 * (m[1] + m[2]) / tot) if tot and p != "sluice" else ""))
    if delivered:
        print()
        print("Records per variant over the whole run (warm-ups included; sluice: its /metrics "
              "once the queues were empty; nginx: lines in its file):")
        print()
        print("| variant | requests | records delivered | dropped |")
        print("| --- | ---: | ---: | ---: |")
        for p, (req, got, drop) in delivered.items():
            print("| %s | %s | %d | %d |" % (p, req if req else "n/a", got, drop))
if slow:
    print()
    print("h2 download with a slow reader (target: peak RSS within %d MB of idle):" % (limit_kb // 1024))
    print()
    print("| proxy | idle RSS MB | peak RSS MB | growth MB | bytes received | seconds | within %d MB |" % (limit_kb // 1024))
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for proxy, idle, peak, secs, got, verdict in slow:
        idle, peak = int(idle), int(peak)
        print("| %s | %.1f | %.1f | %.1f | %s | %s | %s |" % (
            proxy, idle / 1024, peak / 1024, (peak - idle) / 1024, got, secs,
            verdict.replace("_", " ")))
if grpc_rows:
    print()
    print("gRPC unary calls, %s sequential 64-byte calls per path, h2c to a grpcio server "
          "(perf/grpc_latency.py; added = p50/p99 minus the direct call's):" % grpc_calls)
    print()
    print("| path | p50 µs | p99 µs | added p50 µs | added p99 µs | proxy CPU µs/call | errors | CPU/call vs nginx |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    ng = [float(r[5]) for r in grpc_rows if r[0] == "nginx"]
    for path, p50, p99, a50, a99, cpu, err in grpc_rows:
        vs = "" if path == "direct" else ratio(float(cpu), ng[0]) if ng else "n/a"
        cpu = "" if path == "direct" else cpu
        print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (path, p50, p99, a50, a99, cpu, err, vs))
EOF
)
# Issue 15's sections: CSVs and PNGs beside OUT (benchmarks/), Markdown here.
# (OUT=docs/benchmarks.md -> docs/benchmarks/*.csv, *.png)
REPORT_DIR="$TMP/report"
[ "$OUT" = "-" ] || REPORT_DIR="${OUT%.md}"
SECTIONS_MD=$($PY "$REPO/perf/bench_report.py" --outdir "$REPORT_DIR" --img-prefix "$(basename "$REPORT_DIR")/" \
    --results "$RESULTS" --sweep "$SWEEP_RESULTS" --rate "$RATE_RESULTS" --features "$FEAT_RESULTS" \
    --scaling "$SCALE_RESULTS" --sat-rate "$SAT_RATE" --connections "$CONNECTIONS" \
    --sweep-duration "$SWEEP_DURATION" --rate-connections "$RATE_CONNECTIONS" \
    --rate-duration "$RATE_DURATION" --rate-max-steal-ms "$RATE_MAX_STEAL_MS" \
    --rate-busy-max "$RATE_BUSY_MAX" --load-cpu "$LOAD_CPU" --origin-cpu "$ORIGIN_CPU" --proxy-cpu "$PROXY_CPU") || die "perf/bench_report.py failed"

# "TLS 1.3, TLS_AES_128_GCM_SHA256, X25519 (all three)" or one entry per proxy.
TLS_PARAMS=$(awk '{k = $2 ", " $3 ", " $4; if (index(" " n[k] " ", " " $1 " ")) next; n[k] = n[k] (n[k] ? " " : "") $1}
    END {for (k in n) printf "%s%s (%s)", (i++ ? "; " : ""), k, n[k]}' "$TMP/tls/params")
echo
[ ! -s "$TMP/tls/params" ] || printf 'TLS negotiated: %s\n\n' "$TLS_PARAMS"
echo "$TABLES"
echo
echo "$SECTIONS_MD"

if [ "$OUT" != "-" ]; then
    mkdir -p "$(dirname "$OUT")"
    {
        cat <<EOF
# Benchmarks

Written by \`perf/bench.sh\`; do not edit by hand, run it again.
$([ -z "$QUICK" ] || printf '\n**Smoke run (QUICK=1): short runs on a shared machine, to check the\nformat; these figures are not results.**\n')

- Date: $(date -u '+%Y-%m-%d %H:%M UTC')
- Commit: $COMMIT
- Machine: $NCPU CPUs, $CPU_MODEL, Linux $(uname -r)
- Peers: $("$NGINX" -v 2>&1 | sed 's/.*: //'), $("$HAPROXY" -v 2>&1 | head -1 | awk '{print "HAProxy", $3}'), $(wrk -v 2>&1 | head -1 | awk '{print "wrk", $2}'), $(h2load --version 2>/dev/null | awk '{print "h2load", $2}'), $(openssl version | awk '{print "OpenSSL", $2}')
- Command: \`$CMD\`
- Set-up: origin = nginx \`return 200\` (22-byte body) on CPU $ORIGIN_CPU; the proxy
  under test pinned to CPU $PROXY_CPU with one worker (sluice-runtime
  \`--workers 1\`, nginx \`worker_processes 1\` with upstream \`keepalive 1024\`,
  HAProxy \`nbthread 1\` with \`http-reuse always\`), no access logs; wrk
  ($WRK_THREADS thread, $CONNECTIONS connections) on CPU $LOAD_CPU, $WARMUP warm-up
  (discarded) then $DURATION measured per test.
- CPU µs/request = (utime + stime of the proxy process over the measured run,
  from /proc/PID/stat, nginx master + worker) / requests completed.
  Errors = wrk non-2xx responses + socket errors.
- Each figure is the median of $ROUNDS round(s), every proxy once per round,
  the order reversed every other round (requests are the rounds' total).
- A shared 2-core machine gives noisy absolute numbers: compare the rows of
  one run, not runs of different days.
EOF
        if [ -s "$TMP/tls/params" ]; then
            cat <<EOF
- TLS and HTTP/2 tests (perf/README.md): one ECDSA P-256 certificate made
  for the run, TLS 1.3 only, negotiated: $TLS_PARAMS. HTTPS GET = wrk over TLS
  (HTTP/1.1, keep-alive); h2c and h2 (TLS) = h2load \`-c $H2_CLIENTS -m $H2_STREAMS\`
  (errors: failed + non-2xx); handshakes: $HANDSHAKE_CLIENTS concurrent
  connections, each one GET with \`Connection: close\`, full = h2load \`--h1\`
  (never resumes), resumed = wrk (offers the previous connection's ticket;
  "resumed" = share of \`openssl s_time -reuse\` connections the proxy resumed in
  a 1 s probe before the run); h2 slow reader = perf/h2_slow_reader.py
  reading $SLOW_BYTES bytes over h2 (TLS) at most $SLOW_RATE bytes/s.
EOF
        fi
        if [ -n "$(echo "$TABLES" | tr -d '[:space:]')" ]; then
            echo
            echo "## Detail tables of the saturation run"
            echo
            echo "$TABLES"
        fi
        echo
        echo "$SECTIONS_MD"
    } >"$OUT"
    echo
    echo "wrote $OUT"
fi
