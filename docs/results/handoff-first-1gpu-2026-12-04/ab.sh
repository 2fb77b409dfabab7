#!/usr/bin/env bash
# The small-op stream on 1 H200, f60c28c's allreduce_latency against c4f2292's, alternating,
# 3 runs each per NCCL version (one file per version).
B=.gpurun/build
for V in 2.28.3 2.28.9; do
  . scripts/gpu-env.sh $V
  export NCFSM_BACKEND=nccl NCCL_NVLS_ENABLE=0
  {
    for r in 1 2 3; do
      for bin in allreduce_latency_f60c28c allreduce_latency; do
        echo "=== run $r, NCCL $V, $bin: mpirun -np 1 $bin --no-sweep --skip-cpu --bw-mib 64"
        mpirun --oversubscribe -np 1 --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NCFSM_BACKEND \
          $B/bench/$bin --no-sweep --skip-cpu --bw-mib 64; echo "exit $?"
      done
    done
  } > $OUT/ab-$V.txt 2>&1
done
grep -H "===\|exit\|KV stream.ncfsm.ops\|KV stream.ncfsm_thread.ops\|handoff_share" $OUT/ab-*.txt
