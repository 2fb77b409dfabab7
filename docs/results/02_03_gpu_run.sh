#!/usr/bin/env bash
# The GPU-machine run behind docs/results/02_group_semantics_gpu.md and
# docs/results/03_completion_timing_gpu.md (2x H200, from the repository root,
# binaries in build-examples/). Each step writes its output to <name>.txt; all
# outputs end up in $OUT/all.tar.gz. ONLY=02 or ONLY=03 runs one example.
B=${B:-build-examples}
O=${OUT:-/tmp/out}/raw
mkdir -p "$O"
step() { # name, command...: run with a time limit, keep stdout+stderr and the exit code
  local n=$1; shift
  { echo "\$ $*"; timeout 120 "$@"; echo "exit code: $?"; } >"$O/$n.txt" 2>&1
}
want() { [ -z "${ONLY:-}" ] || [ "$ONLY" = "$1" ]; }
export NCFSM_BACKEND=nccl
{ nvidia-smi -L; nvidia-smi topo -m; mpirun --version; } >"$O/gpus.txt" 2>&1
for v in 2.28.9 2.28.3; do (
  . scripts/gpu-env.sh $v
  step info-$v "$B/tools/ncfsm-info"
  if want 02; then
    step 02_mpirun_np2_nccl$v mpirun --oversubscribe -np 2 $NCFSM_MPI_ENV "$B/examples/02_group_semantics" --csv "$O/02_mpirun_np2_nccl$v.csv"
    step 02_oneproc_2gpu_nccl$v "$B/examples/02_group_semantics" --ranks 2 --csv "$O/02_oneproc_2gpu_nccl$v.csv"
  fi
  if want 03; then
    step 03_mpirun_np2_nccl$v mpirun --oversubscribe -np 2 $NCFSM_MPI_ENV "$B/examples/03_completion_timing" --csv "$O/03_mpirun_np2_nccl$v.csv"
    step 03_oneproc_2gpu_nccl$v "$B/examples/03_completion_timing" --ranks 2 --csv "$O/03_oneproc_2gpu_nccl$v.csv"
  fi
) done
grep -h "exit code\|PASS\|ready right" "$O"/0*.txt
tar -czf "$O/../all.tar.gz" -C "$O" . && rm -rf "$O"
