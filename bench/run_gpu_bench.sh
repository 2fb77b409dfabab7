#!/usr/bin/env bash
# The GPU benchmark of issue 3 in one go: ncfsm against raw NCCL and
# torch.distributed, 2 ranks (2 processes under mpirun, one GPU each).
#
#   bench/run_gpu_bench.sh [2.28.9|2.28.3] [--quick]
#
# Run from anywhere on the GPU machine, after building build-bench (or set
# BUILD=dir). Prints one Markdown report: versions, then for each section the
# raw output of both programs (bench/allreduce_latency,
# bench/torch_allreduce.py) and the ratios of ncfsm to every baseline with the
# goals, met or not. Sections: mpirun --bind-to none (the main result); mpirun's
# default binding (Open MPI binds each of 2 ranks to one core), shorter,
# without the size sweep (so that scripts/plot_sweep.py reads the report's one
# sweep: plot_sweep.py OUT.png 2.28.9=REPORT 2.28.3=REPORT); and,
# when EXP_BIN names an allreduce_latency linked against an experimental
# engine (EXP_NAME labels it), that binary under both bindings.
# TIMEOUT_C / TIMEOUT_T: seconds allowed to each C / torch run.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
VER=${1:-2.28.9}
QUICK=""
[ "${2:-}" = "--quick" ] && QUICK=--quick
# shellcheck disable=SC1091
. scripts/gpu-env.sh "$VER"
export NCFSM_BACKEND=${NCFSM_BACKEND:-auto} # forwarded by $NCFSM_MPI_ENV
B=${BUILD:-build-bench}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
MPI="mpirun --oversubscribe -np 2 $NCFSM_MPI_ENV"

echo "# ncfsm GPU benchmark: 2 ranks, NCCL $VER ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
echo
echo "## Machine and versions"
echo
echo '```'
echo "\$ nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1
echo "\$ nvidia-smi topo -m | head -3"
nvidia-smi topo -m 2>&1 | head -3
echo "\$ nproc; uname -r"
nproc
uname -r
echo "\$ mpirun --version | head -1"
mpirun --version 2>&1 | head -1
echo "\$ python3 -c 'import torch; ...'"
python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))' 2>&1
echo "\$ $B/tools/ncfsm-info"
"$B/tools/ncfsm-info" 2>&1
echo '```'
echo

# run_section TITLE MPI_EXTRA BIN C_ARGS TORCH_ARGS(or "-" for none)
run_section() {
  local title=$1 extra=$2 bin=$3 cargs=$4 targs=$5 tag
  tag=$(echo "$title" | tr -c 'a-zA-Z0-9\n' _)
  echo "## $title"
  echo
  echo "\`\$ $MPI $extra $bin $cargs\`"
  echo
  # shellcheck disable=SC2086
  timeout "${TIMEOUT_C:-300}" $MPI $extra "$bin" $cargs >"$TMP/c.$tag" 2>"$TMP/c.$tag.err"
  local crc=$?
  cat "$TMP/c.$tag"
  if [ $crc -ne 0 ]; then
    echo "**allreduce_latency exited with $crc**; stderr:"
    echo '```'
    tail -30 "$TMP/c.$tag.err"
    echo '```'
    rc=1
  fi
  echo
  : >"$TMP/t.$tag"
  if [ "$targs" != "-" ]; then
    echo "\`\$ MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT $MPI $extra -x MASTER_ADDR -x MASTER_PORT python3 bench/torch_allreduce.py $targs\`"
    echo
    # shellcheck disable=SC2086
    timeout "${TIMEOUT_T:-240}" $MPI $extra -x MASTER_ADDR -x MASTER_PORT python3 bench/torch_allreduce.py $targs \
      >"$TMP/t.$tag" 2>"$TMP/t.$tag.err"
    local trc=$?
    cat "$TMP/t.$tag"
    if [ $trc -ne 0 ]; then
      echo "**torch_allreduce.py exited with $trc**; stderr:"
      echo '```'
      tail -30 "$TMP/t.$tag.err"
      echo '```'
      rc=1
    fi
    echo
  fi
  summary "$title" "$TMP/c.$tag" "$TMP/t.$tag"
  echo
}

# ratios and goals, from the KV lines of both programs
summary() {
  awk -v title="$1" '
$1 == "KV" { kv[$2] = $3 }
function has(k) { return (k in kv) && kv[k] != "" }
function r(a, b) { return (has(a) && has(b) && kv[b] + 0 != 0) ? sprintf("%.3f", kv[a] / kv[b]) : "n/a" }
function v(k, f) { return has(k) ? sprintf(f, kv[k]) : "n/a" }
function goal(ok) { return ok ? "**met**" : "**not met**" }
END {
  print "### Summary (" title "): ncfsm against each baseline"
  print ""
  print "Ratios are ncfsm / baseline. Round trip: below 1 means ncfsm is faster. Throughput and"
  print "bandwidth: above 1 means ncfsm is faster."
  print ""
  print "| 8-byte round trip, rank 0 | median us | p99 us | ncfsm/this median | ncfsm/this p99 |"
  print "|---|---:|---:|---:|---:|"
  n = split("raw_block_sync raw_block_spin raw_nb_yield raw_nb_yield_tev raw_nb_spin raw_nb_sleep torch ncfsm ncfsm_spin ncfsm_blk ncfsm_push ncfsm_auto", names, " ")
  for (i = 1; i <= n; i++) {
    k = "rt." names[i]
    printf "| %s | %s | %s | %s | %s |\n", names[i], v(k ".median_us", "%.1f"), v(k ".p99_us", "%.1f"),
      r("rt.ncfsm.median_us", k ".median_us"), r("rt.ncfsm.p99_us", k ".p99_us")
  }
  print ""
  print "| throughput / bandwidth | value | ncfsm/this |"
  print "|---|---:|---:|"
  n = split("raw_block raw_block_g64 ncfsm ncfsm_nocoal", names, " ")
  for (i = 1; i <= n; i++)
    printf "| small-op stream, %s (ops/s) | %s | %s |\n", names[i], v("stream." names[i] ".ops_per_s", "%.0f"),
      r("stream.ncfsm.ops_per_s", "stream." names[i] ".ops_per_s")
  n = split("raw_block raw_nb torch ncfsm", names, " ")
  for (i = 1; i <= n; i++)
    printf "| 256 MiB busbw, %s (GB/s) | %s | %s |\n", names[i], v("bw." names[i] ".busbw_GBps", "%.1f"),
      r("bw.ncfsm.busbw_GBps", "bw." names[i] ".busbw_GBps")
  print ""
  print "### Goals (" title ")"
  print ""
  q = r("rt.ncfsm.median_us", "rt.raw_nb_yield.median_us")
  printf "- round trip within 1.05x of the raw nonblocking sched_yield poll loop (median): ncfsm/raw_nb_yield = %s: %s\n", q, (q == "n/a") ? "n/a" : goal(q + 0 <= 1.05)
  q = r("rt.ncfsm.p99_us", "rt.raw_nb_yield.p99_us")
  printf "  (p99: %s)\n", q
  q = r("stream.ncfsm.ops_per_s", "stream.raw_block.ops_per_s")
  printf "- small-op stream at least as many ops/s as raw blocking NCCL: ncfsm/raw_block = %s: %s\n", q, (q == "n/a") ? "n/a" : goal(q + 0 >= 1.0)
  q = r("bw.ncfsm.busbw_GBps", "bw.raw_block.busbw_GBps")
  printf "- 256 MiB busbw within 1%% of raw: ncfsm/raw_block = %s: %s\n", q, (q == "n/a") ? "n/a" : goal(q + 0 >= 0.99)
  q = v("idle.loop_thread.cpu_pct", "%.4f")
  printf "- near-zero CPU while idle (loop thread, comm READY, nothing pending, 1 s; goal < 0.1%% of a core): %s%%: %s\n", q, (q == "n/a") ? "n/a" : goal(q + 0 < 0.1)
  printf "  waiting 1 s for a late peer, waiting thread CPU: ncfsm (poll) %s%%, ncfsm_push %s%%, ncfsm_auto %s%%, raw_nb_yield %s%%, raw_block_sync %s%%\n",
    v("wait1s.ncfsm.cpu_pct", "%.2f"), v("wait1s.ncfsm_push.cpu_pct", "%.2f"), v("wait1s.ncfsm_auto.cpu_pct", "%.2f"), v("wait1s.raw_nb_yield.cpu_pct", "%.2f"), v("wait1s.raw_block_sync.cpu_pct", "%.2f")
  q = v("wait1s.ncfsm_auto.cpu_pct", "%.3f")
  printf "- issue 11: waiting for a late peer <= 1%% of a core with the default (auto) completion: %s%%: %s\n", q, (q == "n/a") ? "n/a" : goal(q + 0 <= 1.0)
  q = r("rt.ncfsm_auto.median_us", "rt.raw_nb_yield.median_us")
  printf "- issue 11: 8-byte round trip <= 1.0x the raw nonblocking poll loop, default (auto) completion: ncfsm_auto/raw_nb_yield = %s: %s\n", q, (q == "n/a") ? "n/a" : goal(q + 0 <= 1.0)
  q = r("stream.ncfsm.ops_per_s", "stream.raw_block_g64.ops_per_s")
  printf "- issue 11: small-op stream >= 1.0x raw blocking hand-grouped by 64: ncfsm/raw_block_g64 = %s: %s\n", q, (q == "n/a") ? "n/a" : goal(q + 0 >= 1.0)
  q = r("sweep.b2b.ncfsm_auto.16777216.ops_per_s", "sweep.b2b.raw_block.16777216.ops_per_s")
  printf "- issue 11: back-to-back 16 MiB busbw >= 0.95x raw blocking (sweep): %s: %s\n", q, (q == "n/a") ? "n/a" : goal(q + 0 >= 0.95)
  q = r("sweep.b2b.ncfsm_auto.268435456.ops_per_s", "sweep.b2b.raw_block.268435456.ops_per_s")
  printf "- issue 11: back-to-back 256 MiB busbw >= 0.99x raw blocking (sweep): %s: %s\n", q, (q == "n/a") ? "n/a" : goal(q + 0 >= 0.99)
}' "$2" "$3"
}

rc=0
export MASTER_ADDR=127.0.0.1 MASTER_PORT=${MASTER_PORT:-29517}
# Open MPI binds each of 2 ranks to ONE core by default (--bind-to core for
# np <= 2); NCCL's group helper and proxy threads then share that core with
# the polling thread. The main run gives each rank the whole machine.
run_section "mpirun --bind-to none" "--bind-to none" "$B/bench/allreduce_latency" "$QUICK" "$QUICK"
if [ -z "$QUICK" ]; then
  run_section "mpirun default binding (one core per rank)" "" "$B/bench/allreduce_latency" \
    "--iters 200 --rounds 2 --stream-ops 2000 --nocoal-ops 100 --skip-cpu --no-sweep" "--iters 300 --rounds 2"
  # An engine experiment built out of tree (see docs/results/benchmarks-gpu-section.md).
  if [ -n "${EXP_BIN:-}" ]; then
    run_section "EXPERIMENT ${EXP_NAME:-exp}, mpirun --bind-to none" "--bind-to none" "$EXP_BIN" \
      "--iters 500 --rounds 2 --stream-ops 5000 --nocoal-ops 200 --skip-cpu --no-sweep" "-"
    run_section "EXPERIMENT ${EXP_NAME:-exp}, mpirun default binding" "" "$EXP_BIN" \
      "--iters 200 --rounds 2 --stream-ops 2000 --nocoal-ops 100 --skip-cpu --no-sweep" "-"
  fi
fi
exit $rc
