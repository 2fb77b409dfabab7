#!/usr/bin/env bash
# The hand-off first (c4f2292) on 1 H200: the small-op stream (one thread, loop thread, raw) x3
# per NCCL version, and the 1-GPU programs; one file per version.
B=.gpurun/build
for V in 2.28.3 2.28.9; do
  . scripts/gpu-env.sh $V
  export NCFSM_BACKEND=nccl NCCL_NVLS_ENABLE=0
  {
    for p in split_gpus 02_group_semantics 03_completion_timing; do
      d=examples; [ $p = split_gpus ] && d=tests
      echo "=== $d/$p --require-gpu (NCCL $V)"; $B/$d/$p --require-gpu > /tmp/prog.txt 2>&1; rc=$?; tail -4 /tmp/prog.txt; echo "exit $rc"
    done
    for r in 1 2 3; do
      echo "=== run $r, NCCL $V: mpirun -np 1 allreduce_latency --no-sweep --skip-cpu --bw-mib 64"
      mpirun --oversubscribe -np 1 --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NCFSM_BACKEND \
        $B/bench/allreduce_latency --no-sweep --skip-cpu --bw-mib 64; echo "exit $?"
    done
  } > $OUT/final-$V.txt 2>&1
done
grep -H "exit\|PASS\|KV stream" $OUT/final-*.txt
