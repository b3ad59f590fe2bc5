#!/bin/sh
# Builds the libFuzzer drivers of tests/fuzz/ and runs each for a bounded time.
#
#   tests/fuzz/run.sh                  build all, run each for FUZZ_SECONDS (60)
#   tests/fuzz/run.sh build            build only
#   tests/fuzz/run.sh replay           build, then run every driver once over its
#                                      committed corpus and tests/fuzz/regressions/
#                                      (seconds; no fuzzing)
#   tests/fuzz/run.sh fuzz_router ...  build all, run only the named drivers
#
# Environment: FUZZ_SECONDS (per driver, default 60), FUZZ_BUILD (default
# build/fuzz), FUZZ_JOBS (parallel libFuzzer workers per driver, default 1),
# FUZZ_TIMEOUT (seconds for one input before it counts as a hang, default 25),
# CLANG (default clang).
#
# The committed corpus (tests/fuzz/corpus/<driver>/) is only read: each run
# works in a scratch copy under $FUZZ_BUILD/corpus/<driver>/, and crash files
# go to $FUZZ_BUILD/crashes/<driver>/. Exits non-zero if any driver crashed
# (or a build failed).
set -eu

cd "$(dirname "$0")/../.."
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
FUZZ_BUILD=${FUZZ_BUILD:-build/fuzz}
FUZZ_JOBS=${FUZZ_JOBS:-1}
# One input taking this long is a finding (a hang), not slowness.
FUZZ_TIMEOUT=${FUZZ_TIMEOUT:-25}
CLANG=${CLANG:-clang}
DRIVERS_ALL="fuzz_http1_request fuzz_http1_response fuzz_router fuzz_model fuzz_snapshot_apply fuzz_rest_body fuzz_path fuzz_h2_frames fuzz_pem fuzz_json_schema"

SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# Library objects get coverage instrumentation without libFuzzer's main();
# the Makefile appends its own -std/-W/-I flags to these.
LIB_CFLAGS="-O1 -g $SAN -fsanitize=fuzzer-no-link"

build() {
    CC=$CLANG CFLAGS="$LIB_CFLAGS" ${MAKE:-make} -s --no-print-directory BUILD="$FUZZ_BUILD" \
        "$FUZZ_BUILD/lib/libsl-common.a" "$FUZZ_BUILD/lib/libsl-runtime.a" \
        "$FUZZ_BUILD/lib/libsl-controller.a"
    pkgs="libevent libevent_pthreads libevent_openssl jansson yaml-0.1 libpcre2-8 liburcu-qsbr libprotobuf-c openssl sqlite3 libnghttp2 hiredis"
    # shellcheck disable=SC2086 # $pkgs is a list of package names
    cflags="-std=gnu11 -Wall -Wextra -Werror -D_GNU_SOURCE -D_LGPL_SOURCE -fno-strict-aliasing
        -Icommon -Iruntime -Iruntime/net -Iruntime/http -Iruntime/proxy -Iruntime/control -Ipolicies -Icontroller -Itests/fuzz -I$FUZZ_BUILD/gen
        $(pkg-config --cflags $pkgs)"
    # shellcheck disable=SC2086
    libs="$FUZZ_BUILD/lib/libsl-runtime.a $FUZZ_BUILD/lib/libsl-controller.a
        $FUZZ_BUILD/lib/libsl-common.a $(pkg-config --libs $pkgs) -lgrpc -lgpr -lcrypt -lpthread -lm"
    mkdir -p "$FUZZ_BUILD/bin"
    for d in $DRIVERS_ALL; do
        src=tests/fuzz/$d.c
        [ -f "$src" ] || continue
        out=$FUZZ_BUILD/bin/$d
        # shellcheck disable=SC2086 # word splitting of flag lists is intended
        $CLANG -O1 -g $SAN -fsanitize=fuzzer $cflags -o "$out" "$src" $libs
    done
}

run_one() {
    d=$1
    bin=$FUZZ_BUILD/bin/$d
    [ -x "$bin" ] || { echo "$d: not built"; return 1; }
    work=$FUZZ_BUILD/corpus/$d
    # A fresh artifact directory per run, so an old crash file never fails a
    # new run (and is not lost either).
    crashes=$FUZZ_BUILD/crashes/$d/$(date +%Y%m%d-%H%M%S)
    mkdir -p "$work" "$crashes"
    if [ -d "tests/fuzz/corpus/$d" ]; then
        cp -n tests/fuzz/corpus/"$d"/* "$work"/ 2>/dev/null || true
    fi
    set --
    [ -f "tests/fuzz/$d.dict" ] && set -- "-dict=tests/fuzz/$d.dict"
    # -jobs/-workers only when asked for: with them libFuzzer writes
    # fuzz-N.log files into the current directory.
    [ "$FUZZ_JOBS" -gt 1 ] && set -- "$@" -jobs="$FUZZ_JOBS" -workers="$FUZZ_JOBS"
    log=$FUZZ_BUILD/$d.log
    echo "== $d: ${FUZZ_SECONDS}s, corpus $work, log $log"
    rc=0
    "$bin" -max_total_time="$FUZZ_SECONDS" -timeout="$FUZZ_TIMEOUT" \
        -artifact_prefix="$crashes/" -print_final_stats=1 \
        "$@" "$work" >"$log" 2>&1 || rc=$?
    if [ $rc = 0 ] && [ -z "$(ls -A "$crashes")" ]; then
        rmdir "$crashes"
        grep -E '^#[0-9]+' "$log" | tail -1
        grep -E '^stat::number_of_executed_units' "$log" || true
        return 0
    fi
    echo "$d: CRASH (exit $rc; see $log and $crashes/)"
    grep -E 'ERROR: |fuzz invariant|SUMMARY' "$log" | head -5
    return 1
}

# Each committed input once: the seeds and the minimized crashes of
# tests/fuzz/regressions/<driver>/ (fixed bugs must stay fixed).
replay_one() {
    d=$1
    set --
    for dir in tests/fuzz/corpus/"$d" tests/fuzz/regressions/"$d"; do
        [ -d "$dir" ] && set -- "$@" "$dir"/*
    done
    [ $# -gt 0 ] || return 0
    log=$FUZZ_BUILD/$d.replay.log
    if "$FUZZ_BUILD/bin/$d" "$@" >"$log" 2>&1; then
        echo "$d: $# inputs replayed clean"
        return 0
    fi
    echo "$d: REPLAY FAILED (see $log)"
    grep -E 'Running:|ERROR: |fuzz invariant|SUMMARY' "$log" | tail -4
    return 1
}

case "${1:-}" in
build)
    build
    exit 0
    ;;
replay)
    build
    fail=0
    for d in $DRIVERS_ALL; do
        replay_one "$d" || fail=1
    done
    exit $fail
    ;;
"") drivers=$DRIVERS_ALL ;;
*) drivers=$* ;;
esac

build
fail=0
for d in $drivers; do
    [ -f "tests/fuzz/$d.c" ] || { echo "$d: no such driver"; fail=1; continue; }
    run_one "$d" || fail=1
done
[ $fail = 0 ] || { echo "fuzz: failures above"; exit 1; }
echo "fuzz: all drivers ran clean"
