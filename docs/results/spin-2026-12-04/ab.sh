#!/usr/bin/env bash
# allreduce_latency's streams on one H200, NCCL 2.28.9: d163242 ("head") against a61f99c with
# spin_us at its default (20) and 0, alternating, 3 rounds -> ab.txt.
B=.gpurun/build
. scripts/gpu-env.sh 2.28.9
export NCFSM_BACKEND=nccl NCCL_NVLS_ENABLE=0
A="--iters 200 --rounds 3 --sleep-iters 10 --bw-mib 8 --bw-iters 5 --nocoal-ops 1000 --no-sweep --skip-cpu"
for r in 1 2 3; do
  for v in head new new0; do
    bin=$B/bench/allreduce_latency; s=20
    [ $v = head ] && bin=$B/bench/allreduce_latency_head
    [ $v = new0 ] && s=0
    echo "## round $r $v (NCFSM_SPIN_US=$s)"
    NCFSM_SPIN_US=$s mpirun --oversubscribe -np 1 --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NCFSM_BACKEND -x NCFSM_SPIN_US \
      $bin $A 2>&1 | grep -E 'KV (stream\.(ncfsm|ncfsm_thread|raw_block_g64)\.ops_per_s|rt\.(ncfsm|raw_nb_yield)\.median_us)'
    echo "exit ${PIPESTATUS[0]}"
  done
done > $OUT/ab.txt 2>&1
cat $OUT/ab.txt
