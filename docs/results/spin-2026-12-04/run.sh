#!/usr/bin/env bash
# Waiting threads spin first (a61f99c) on the GPU machine, one H200, 16 cores:
# 1. null backend, pinned (--pin), 3 rounds: d163242's engine_overhead ("head") against
#    a61f99c's with NCFSM_SPIN_US 0, 20 (the default) and 50, modes waiters-1/2/4 and
#    threads-1/2 (each with its .self reference in the same process) -> spin-16core.txt;
# 2. the 1-GPU programs and bench/allreduce_latency once, NCCL 2.28.3 and 2.28.9
#    (spin_us at its default) -> gpu-<NCCL>.txt.
B=.gpurun/build
M="waiters-1 waiters-2 waiters-4 threads-1 threads-2"
{
  nproc; lscpu | grep -m1 'Model name'
  for r in 1 2 3; do
    echo "### round $r"
    echo "## head (d163242)"; $B/bench/engine_overhead_head --runs 9 --pin $M 2>&1 | grep -E '^(waiters|threads)'
    for s in 0 20 50; do
      echo "## a61f99c NCFSM_SPIN_US=$s"; NCFSM_SPIN_US=$s $B/bench/engine_overhead --runs 9 --pin $M 2>&1 | grep -E '^(waiters|threads)'
    done
  done
} > $OUT/spin-16core.txt 2>&1
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
  } > $OUT/gpu-$V.txt 2>&1
done
grep -H "exit\|PASS (\|KV stream.ncfsm\|KV stream.raw_block_g64" $OUT/gpu-*.txt
