#!/bin/sh
# verify_cost_smoke.sh VERIFY_COST NCFSM_STORE: bench/verify_cost --quick with
# 2 processes on the sim. The main bootstrap is a TCP store (ncfsm-store on a
# free port); the two stores rank 0 hosts get a port pair picked from the
# range 20000-59999 (retried once with another pair if the first is taken).
set -u
bin=$1 store=$2
dir=$(mktemp -d) || exit 1
trap 'kill $spid 2>/dev/null; rm -rf "$dir"' EXIT
export NCFSM_STORE_TOKEN="vc-$$" NCFSM_WORLD_SIZE=2
unset PMIX_RANK NCFSM_BOOTSTRAP NCFSM_STORE_HOST
"$store" --listen 127.0.0.1:0 --print-port >"$dir/port" 2>"$dir/store.err" &
spid=$!
i=0
until grep -q '^[0-9][0-9]*$' "$dir/port" 2>/dev/null; do
  i=$((i + 1)); [ $i -gt 400 ] && { echo "FAIL: ncfsm-store printed no port"; exit 1; }
  sleep 0.05
done
export NCFSM_STORE_ADDR=127.0.0.1:$(cat "$dir/port")
for try in 1 2; do
  p=$((20000 + ($$ * 7 + try * 7919) % 40000 / 2 * 2))
  NCFSM_RANK=1 timeout 150 "$bin" --quick --port $p >"$dir/r1" 2>&1 &
  c1=$!
  NCFSM_RANK=0 timeout 150 "$bin" --quick --port $p >"$dir/r0" 2>&1
  rc0=$?
  wait $c1; rc1=$?
  cat "$dir/r0" "$dir/r1"
  [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && break
  grep -q "Address already in use\|cannot listen\|bind" "$dir/r0" "$dir/r1" || exit 1
  echo "(ports $p/$((p + 1)) taken; another pair)"
done
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || exit 1
grep -q "^KV vrt.strict_tcp.median_us " "$dir/r0" || { echo "FAIL: no strict_tcp figure"; exit 1; }
grep -q "^KV vstream.async_tcp.ops_per_s " "$dir/r0" || { echo "FAIL: no async stream figure"; exit 1; }
echo PASS
