#!/bin/sh
# verify_cost_smoke.sh VERIFY_COST NCFSM_STORE: bench/verify_cost --quick with
# 2 processes on the sim, meeting through four ncfsm-store processes on free
# loopback ports (the main bootstrap, and the stores of the strict_tcp,
# async_tcp and strict_nccl variants).
set -u
bin=$1 store=$2
dir=$(mktemp -d) || exit 1
pids=""
trap 'for p in $pids; do kill $p 2>/dev/null; done; rm -rf "$dir"' EXIT
export NCFSM_STORE_TOKEN="vc-$$" NCFSM_WORLD_SIZE=2
unset PMIX_RANK NCFSM_BOOTSTRAP NCFSM_STORE_HOST
for s in 0 1 2 3; do
  "$store" --listen 127.0.0.1:0 --print-port >"$dir/port$s" 2>"$dir/store$s.err" &
  pids="$pids $!"
done
for s in 0 1 2 3; do
  i=0
  until grep -q '^[0-9][0-9]*$' "$dir/port$s" 2>/dev/null; do
    i=$((i + 1)); [ $i -gt 400 ] && { echo "FAIL: ncfsm-store $s printed no port"; exit 1; }
    sleep 0.05
  done
done
export NCFSM_STORE_ADDR=127.0.0.1:$(cat "$dir/port0")
stores=127.0.0.1:$(cat "$dir/port1"),127.0.0.1:$(cat "$dir/port2"),127.0.0.1:$(cat "$dir/port3")
NCFSM_RANK=1 timeout 150 "$bin" --quick --stores "$stores" >"$dir/r1" 2>&1 &
c1=$!
NCFSM_RANK=0 timeout 150 "$bin" --quick --stores "$stores" >"$dir/r0" 2>&1
rc0=$?
wait $c1; rc1=$?
cat "$dir/r0" "$dir/r1"
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || { echo "FAIL: exit $rc0 / $rc1"; exit 1; }
grep -q "^KV vrt.strict_tcp.median_us " "$dir/r0" || { echo "FAIL: no strict_tcp figure"; exit 1; }
grep -q "^KV vrt.strict_nccl.median_us " "$dir/r0" || { echo "FAIL: no strict_nccl figure"; exit 1; }
grep -q "^KV vstream.async_tcp.ops_per_s " "$dir/r0" || { echo "FAIL: no async stream figure"; exit 1; }
echo PASS
