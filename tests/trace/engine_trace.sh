#!/bin/sh
# engine_trace.sh ENGINE_DUMPS NCFSM_TRACE DIR CASE VERDICT: makes the dumps
# of CASE with the engine (engine_dumps.c), then checks that ncfsm-trace
# finds a divergence (exit 1) and that its verdict line matches VERDICT (an
# extended regular expression). Prints both programs' output.
set -u
prog=$1 trace=$2 dir=$3 case=$4 want=$5
rm -rf "$dir" && mkdir -p "$dir" || exit 1
"$prog" "$case" "$dir" >"$dir.log" 2>&1
prc=$?
cat "$dir.log"
[ "$prc" -eq 0 ] || { echo "FAIL: engine_dumps exit $prc"; exit 1; }
out=$("$trace" "$dir"); rc=$?
echo "$out"
[ "$rc" -eq 1 ] || { echo "FAIL: ncfsm-trace exit $rc, want 1"; exit 1; }
echo "$out" | head -1 | grep -Eq "$want" || { echo "FAIL: the verdict does not match: $want"; exit 1; }
echo "PASS"
