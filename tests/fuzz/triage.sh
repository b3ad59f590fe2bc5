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
        out=$("$bin" -runs=1 "$f" 2>&1 || true)
        sig=$(printf '%s\n' "$out" |
            grep -E 'fuzz invariant violated|^SUMMARY|ERROR: libFuzzer: (timeout|out-of-memory)' |
            head -1 | sed -e 's/0x[0-9a-f]*//g' -e 's/==[0-9]*==//' -e 's/[0-9]* byte(s) leaked in [0-9]* allocation(s)/leak/')
        # the first frame in the project's own code tells findings apart
        where=$(printf '%s\n' "$out" | grep -E '^ *#[0-9]+ .* in [a-z_0-9]+ .*(common|runtime|controller)/' |
            head -1 | sed -E 's/.* in ([a-z_0-9]+) .*\/((common|runtime|controller)\/[^ ]*).*/\1 \2/')
        [ -n "$where" ] && sig="$sig at $where"
        printf '%s\t%s\t%s\n' "${sig:-no reproduction}" "$(wc -c <"$f")" "$f" >>"$tmp"
    done
done
sort -t "$(printf '\t')" -k1,1 -k2,2n "$tmp" |
    awk -F'\t' '{ if ($1 != last) { if (last != "") print n "\t" first; last = $1; n = 0; first = $0 } n++ }
                END { if (last != "") print n "\t" first }'
