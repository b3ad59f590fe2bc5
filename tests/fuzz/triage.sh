#!/bin/sh
# Groups crash files by what they hit: runs each through its driver and
# prints one line per distinct finding (the invariant message, or the
# sanitizer's SUMMARY line) with a count and the smallest input.
#   tests/fuzz/triage.sh build/fuzz/bin/fuzz_http1_request DIR...
set -eu
bin=$1
shift
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for dir in "$@"; do
    for f in "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-*; do
        [ -f "$f" ] || continue
        sig=$("$bin" -runs=1 "$f" 2>&1 | grep -E 'fuzz invariant violated|^SUMMARY|ERROR: libFuzzer: (timeout|out-of-memory)' |
            head -1 | sed -e 's/0x[0-9a-f]*//g' -e 's/==[0-9]*==//')
        printf '%s\t%s\t%s\n' "${sig:-no reproduction}" "$(wc -c <"$f")" "$f" >>"$tmp"
    done
done
sort -t "$(printf '\t')" -k1,1 -k2,2n "$tmp" |
    awk -F'\t' '{ if ($1 != last) { if (last != "") print n "\t" first; last = $1; n = 0; first = $0 } n++ }
                END { if (last != "") print n "\t" first }'
