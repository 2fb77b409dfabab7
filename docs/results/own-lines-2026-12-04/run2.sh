#!/usr/bin/env bash
# 458bdd2 (the types aligned to a line) on one H200: the 1-GPU programs and bench/allreduce_latency
# once, NCCL 2.28.3 and 2.28.9 (one file per version).
B=.gpurun/build
for V in 2.28.3 2.28.9; do
  . scripts/gpu-env.sh $V
  export NCFSM_BACKEND=nccl NCCL_NVLS_ENABLE=0
  {
    for p in split_gpus 02_group_semantics 03_completion_timing; do
      d=examples; [ $p = split_gpus ] && d=tests
      echo "=== $d/$p --require-gpu (NCCL $V)"; $B/$d/$p --require-gpu > /tmp/prog.txt 2>&1; rc=$?; tail -4 /tmp/prog.txt; echo "exit $rc"
    done
    echo "=== NCCL $V: mpirun -np 1 allreduce_latency --no-sweep --skip-cpu --bw-mib 64"
    mpirun --oversubscribe -np 1 --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NCFSM_BACKEND \
      $B/bench/allreduce_latency --no-sweep --skip-cpu --bw-mib 64; echo "exit $?"
  } > $OUT/gpu2-$V.txt 2>&1
done
grep -H "exit\|PASS (\|KV stream.ncfsm\|KV stream.raw_block_g64" $OUT/gpu2-*.txt
