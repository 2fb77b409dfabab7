#!/usr/bin/env bash
# The hand-off on 1 H200: the small-op stream with the loop on its own thread, next to the
# same-thread stream and raw NCCL, on both NCCL versions; plus the 1-GPU smoke programs.
B=.gpurun/build
mkdir -p $OUT
nvidia-smi -L > $OUT/gpu.txt 2>&1
for V in 2.28.3 2.28.9; do
  . scripts/gpu-env.sh $V
  export NCFSM_BACKEND=nccl NCCL_NVLS_ENABLE=0
  { echo "== $V"; $B/tools/ncfsm-info | head -20; } > $OUT/info-$V.txt 2>&1
  { $B/tests/split_gpus --require-gpu; echo "exit $?"; } > $OUT/split-$V.txt 2>&1
  { $B/examples/02_group_semantics --require-gpu; echo "exit $?"; } > $OUT/02-$V.txt 2>&1
  { $B/examples/03_completion_timing --require-gpu; echo "exit $?"; } > $OUT/03-$V.txt 2>&1
  for r in 1 2 3; do
    { mpirun --oversubscribe -np 1 --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NCFSM_BACKEND \
        $B/bench/allreduce_latency --no-sweep --skip-cpu --bw-mib 64; echo "exit $?"; } > $OUT/stream-$V-$r.txt 2>&1
  done
done
grep -H "exit\|PASS\|FAIL" $OUT/*.txt | grep -v "^.*info" | tail -30
grep -H "KV stream" $OUT/stream-*.txt
