#!/usr/bin/env bash
# The cost of cross-rank verification on 2 GPUs (issue 9, item 7), one run:
#
#   bench/run_verify_bench.sh [2.28.9|2.28.3] [BUILD]
#
# On the GPU machine, from the repository root. Runs bench/verify_cost under
# mpirun (2 ranks; the main bootstrap is PMIx) and bench/torch_allreduce.py
# without and with TORCH_DISTRIBUTED_DEBUG=DETAIL, then prints the goals:
#   - strict adds at most 5% of what DETAIL adds over plain torch (8-byte round trip, medians);
#   - async costs at most 5% of the small-op stream's ops/s.
# (Async's detection time is measured by examples/04_failure_matrix.)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
VER=${1:-2.28.9}
B=${2:-build}
# shellcheck disable=SC1091
. scripts/gpu-env.sh "$VER"
export NCFSM_BACKEND=nccl MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-29527}
MPI="mpirun --oversubscribe --bind-to none -np 2 $NCFSM_MPI_ENV"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "# verification cost: 2 ranks, NCCL $VER ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
echo
echo "\`\$ $MPI $B/bench/verify_cost\`"
echo
# shellcheck disable=SC2086
timeout 300 $MPI "$B/bench/verify_cost" >"$TMP/c" 2>"$TMP/c.err"
echo "exit $?"
cat "$TMP/c"
tail -5 "$TMP/c.err"
for mode in OFF DETAIL; do
  echo
  echo "\`\$ TORCH_DISTRIBUTED_DEBUG=$mode $MPI -x MASTER_ADDR -x MASTER_PORT -x TORCH_DISTRIBUTED_DEBUG python3 bench/torch_allreduce.py --rounds 3\`"
  echo
  # shellcheck disable=SC2086
  TORCH_DISTRIBUTED_DEBUG=$mode timeout 300 $MPI -x MASTER_ADDR -x MASTER_PORT -x TORCH_DISTRIBUTED_DEBUG \
    python3 bench/torch_allreduce.py --rounds 3 >"$TMP/t.$mode" 2>"$TMP/t.$mode.err"
  echo "exit $?"
  cat "$TMP/t.$mode"
  tail -3 "$TMP/t.$mode.err"
  sed -n "s/^KV rt\.torch\./KV rt.torch_$mode./p" "$TMP/t.$mode" >>"$TMP/kv"
done
grep '^KV ' "$TMP/c" >>"$TMP/kv"
echo
awk '
$1 == "KV" { kv[$2] = $3 }
function has(k) { return (k in kv) && kv[k] != "" }
END {
  print "## Goals"
  print ""
  if (has("rt.torch_DETAIL.median_us") && has("rt.torch_OFF.median_us") && has("vrt.off.median_us")) {
    detail = kv["rt.torch_DETAIL.median_us"] - kv["rt.torch_OFF.median_us"]
    printf "DETAIL adds %.1f us to torch'"'"'s 8-byte round trip (%.1f -> %.1f us median).\n\n", detail,
      kv["rt.torch_OFF.median_us"], kv["rt.torch_DETAIL.median_us"]
    print "| strict channel | ncfsm off us | strict us | strict adds us | share of what DETAIL adds | goal <= 5% |"
    print "|---|---:|---:|---:|---:|---|"
    n = split("strict_boot strict_tcp strict_nccl", v, " ")
    for (i = 1; i <= n; i++) {
      k = "vrt." v[i] ".median_us"
      if (!has(k)) continue
      add = kv[k] - kv["vrt.off.median_us"]
      printf "| %s | %.1f | %.1f | %.1f | %.1f%% | %s |\n", v[i], kv["vrt.off.median_us"], kv[k], add,
        100 * add / detail, (add <= 0.05 * detail) ? "**met**" : "**not met**"
    }
  } else print "round-trip goal: n/a (a figure is missing)"
  print ""
  if (has("vstream.off.ops_per_s") && has("vstream.async_tcp.ops_per_s")) {
    q = kv["vstream.async_tcp.ops_per_s"] / kv["vstream.off.ops_per_s"]
    printf "Small-op stream with async (window 64): %.0f ops/s against %.0f off = %.3f: %s (goal >= 0.95)\n",
      kv["vstream.async_tcp.ops_per_s"], kv["vstream.off.ops_per_s"], q, (q >= 0.95) ? "**met**" : "**not met**"
  } else print "stream goal: n/a (a figure is missing)"
}' "$TMP/kv"
