#!/usr/bin/env bash
# On the 2-GPU machine, from the repository root, with a build made elsewhere:
#   scripts/gpu-benches.sh BUILD OUTDIR [VERSIONS]
# The benchmarks that are not in the GPU CTest suite (scripts/gpu-suite.sh):
# for each NCCL version (default "2.28.9 2.28.3"): bench/run_verify_bench.sh
# (issue 9: verification cost next to torch with and without DETAIL) and
# bench/service_latency --mode ncfsm|naive under mpirun (issue 16). Each
# output goes to OUTDIR/<name>-<version>.txt as well.
set -uo pipefail
BUILD=${1:-build}
OUT=${2:-gpu-out}
VERSIONS=${3:-"2.28.9 2.28.3"}
mkdir -p "$OUT"
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
