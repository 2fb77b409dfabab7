#!/bin/sh
# dump_trace.sh MISMATCH_DUMP NCFSM_TRACE DIR KIND: make the dumps of a
# mismatch of KIND on the sim, then check that ncfsm-trace finds it (exit 1)
# and names it. Prints both programs' output.
set -u
prog=$1 trace=$2 dir=$3 kind=$4
rm -rf "$dir" && mkdir -p "$dir" || exit 1
"$prog" "$dir" --kind "$kind" --timeout-ms 300 || { echo "FAIL: mismatch_dump exit $?"; exit 1; }
ls "$dir"
n=$(ls "$dir" | grep -c '^ncfsm_fr_.*\.json$')
[ "$n" -eq 2 ] || { echo "FAIL: $n JSON dumps, want 2"; exit 1; }
m=$(ls "$dir" | grep -c '_nccl_trace_rank_')
[ "$m" -eq 2 ] || { echo "FAIL: $m PyTorch dumps, want 2"; exit 1; }
out=$("$trace" "$dir"); rc=$?
echo "$out"
[ "$rc" -eq 1 ] || { echo "FAIL: ncfsm-trace exit $rc, want 1"; exit 1; }
case $kind in
  op) want="op mismatch" ;;
  count) want="count mismatch" ;;
  dtype) want="dtype mismatch" ;;
  skip) want="never launched" ;;
esac
echo "$out" | head -1 | grep -q "$want" || { echo "FAIL: the verdict does not name '$want'"; exit 1; }
echo "PASS"
