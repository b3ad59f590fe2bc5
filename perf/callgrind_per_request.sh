#!/bin/bash
# Instructions per request of one sluice-runtime binary and config (the
# noise-free figure behind docs/benchmarks-before-after.md): the runtime
# under callgrind with instrumentation off, a 2 s wrk warm-up, then
# instrumentation on for a 6 s wrk run (4 connections), off again; the
# instructions counted divided by the requests wrk completed. The config's
# listener must be on PORT, with an origin behind it (nothing is started
# here). Not a test; needs valgrind, wrk and curl.
#
# usage: perf/callgrind_per_request.sh BIN CONFIG PORT [wrk -H options...]
# THREADS=1: also one line per thread (callgrind --separate-threads=yes):
# its instructions per request and the busiest function of its own code,
# which tells the worker (event_base_loop) from the traffic log's
# logger and sink threads (drain_rings, sink_main) and the main thread.
BIN=$1; CFG=$2; PORT=$3; shift 3
CG_DIR=${CG_DIR:-/tmp} # another run at the same time needs its own
rm -f "$CG_DIR"/cg.out.*
valgrind --tool=callgrind ${THREADS:+--separate-threads=yes} --instr-atstart=no --callgrind-out-file="$CG_DIR"/cg.out.%p $BIN --config $CFG --workers 1 --admin off --access-log off --log-level warn >/dev/null 2>&1 &
VP=$!
for i in $(seq 100); do curl -s -o /dev/null "$@" http://127.0.0.1:$PORT/bench && break; sleep 0.2; done
taskset -c 1 wrk -t1 -c4 -d2s "$@" http://127.0.0.1:$PORT/bench >/dev/null
callgrind_control -i on $VP >/dev/null
N=$(taskset -c 1 wrk -t1 -c4 -d6s "$@" http://127.0.0.1:$PORT/bench | awk '/requests in/{print $1}')
callgrind_control -i off $VP >/dev/null
callgrind_control -d $VP >/dev/null
sleep 1
kill $VP; wait $VP 2>/dev/null
IR=$(grep -h "^summary:\|^totals:" "$CG_DIR"/cg.out.* | awk '{s+=$2} END {print s}')
echo "$N requests, $IR Ir, $(python3 -c "print(round($IR/$N))") Ir/request"
if [ -n "${THREADS:-}" ]; then
    for f in "$CG_DIR"/cg.out.*; do
        ir=$(grep -h "^summary:\|^totals:" "$f" | awk '{s+=$2} END {print s+0}')
        [ "${ir:-0}" -gt 0 ] || continue
        top=$(callgrind_annotate --inclusive=yes "$f" 2>/dev/null |
            grep -E 'event_base_loop|logger_main|sink_main' | head -1 |
            sed -E 's/.*[0-9] +\(?[0-9.%]*\)? *//; s/ \[.*//')
        echo "  thread ${f##*-}: $(python3 -c "print(round($ir/$N))") Ir/request ($top)"
    done
fi
