#!/usr/bin/env bash
# 782541c (the review's changes to the spins) on the GPU machine: the null-backend
# waiters/threads modes pinned, 3 rounds, against d163242 ("head") and with spin_us 0
# -> spin2-16core.txt; then the 1-GPU programs and allreduce_latency once per NCCL
# version -> gpu2-<NCCL>.txt.
B=.gpurun/build
M="waiters-1 waiters-2 waiters-4 threads-1 threads-2"
{
  for r in 1 2 3; do
    echo "### round $r"
    echo "## head (d163242)"; $B/bench/engine_overhead_head --runs 9 --pin $M 2>&1 | grep -E '^(waiters|threads)'
    for s in 0 20; do
      echo "## 782541c NCFSM_SPIN_US=$s"; NCFSM_SPIN_US=$s $B/bench/engine_overhead --runs 9 --pin $M 2>&1 | grep -E '^(waiters|threads)'
    done
  done
} > $OUT/spin2-16core.txt 2>&1
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
grep -H "exit\|PASS (\|KV stream.ncfsm_thread.ops\|KV stream.raw_block_g64" $OUT/gpu2-*.txt
