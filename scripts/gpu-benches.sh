#!/usr/bin/env bash
# On the 2-GPU machine, from the repository root, with a build made elsewhere:
#   scripts/gpu-benches.sh BUILD OUTDIR [VERSIONS]
# The benchmarks that are not in the GPU CTest suite (scripts/gpu-suite.sh):
# for each NCCL version (default "2.28.9 2.28.3"): bench/run_gpu_bench.sh
# (issues 3 and 11: round trip, stream, bandwidth, size sweep, CPU; RUNS
# times, default 1; issue 11's goals want five), then the sweep's figure
# (scripts/plot_sweep.py), bench/run_verify_bench.sh (issue 9: verification
# cost next to torch with and without DETAIL) and bench/service_latency
# --mode ncfsm|naive under mpirun (issue 16). Each output goes to
# OUTDIR/<name>-<version>.txt as well. SKIP_MAIN=1 skips run_gpu_bench.sh.
set -uo pipefail
BUILD=${1:-build}
OUT=${2:-gpu-out}
VERSIONS=${3:-"2.28.9 2.28.3"}
mkdir -p "$OUT"
if [ -z "${SKIP_MAIN:-}" ]; then
  plots=()
  for v in $VERSIONS; do
    for i in $(seq 1 "${RUNS:-1}"); do
      BUILD=$BUILD bench/run_gpu_bench.sh "$v" 2>&1 | tee "$OUT/bench-gpu-$v-run$i.txt"
    done
    plots+=("$v=$OUT/bench-gpu-$v-run1.txt")
  done
  python3 scripts/plot_sweep.py "$OUT/sweep-2gpu.png" "${plots[@]}"
fi
for v in $VERSIONS; do
  bench/run_verify_bench.sh "$v" "$BUILD" 2>&1 | tee "$OUT/verify-bench-$v.txt"
  (
    # shellcheck source=/dev/null
    . scripts/gpu-env.sh "$v"
    export NCFSM_BACKEND=nccl
    for m in ncfsm naive; do
      echo "\$ mpirun --oversubscribe -np 2 --bind-to none $NCFSM_MPI_ENV $BUILD/bench/service_latency --mode $m"
      timeout 300 mpirun --oversubscribe -np 2 --bind-to none $NCFSM_MPI_ENV "$BUILD/bench/service_latency" --mode "$m"
      echo "exit $?"
    done
  ) 2>&1 | tee "$OUT/service-gpu-$v.txt"
done
