#!/usr/bin/env bash
# The backends' detached threads started by one helper (ncfsm__thread_detached, 4f7f64c): the
# nccl backend's push wake thread (NCFSM_PUSH_WAKE=event) and the cudaLaunchHostFunc path
# (hostfn), on 1 H200, both NCCL versions: bench/allreduce_latency's push and auto rows (the
# 8-byte round trip and the 1 GiB out-of-place op waited for one at a time, about 600 us: past the poll burst, so the wait goes to the stream and the CPU column falls below 100%). The binaries are the
# development machine's build of 4f7f64c, copied to .gpurun/build.
B=.gpurun/build
for V in 2.28.3 2.28.9; do
  . scripts/gpu-env.sh $V
  export NCFSM_BACKEND=nccl NCCL_NVLS_ENABLE=0
  for W in event hostfn; do
    {
      echo "=== NCCL $V, NCFSM_PUSH_WAKE=$W: mpirun -np 1 allreduce_latency --no-sweep --skip-cpu --out-of-place --bw-mib 1024"
      NCFSM_PUSH_WAKE=$W mpirun --oversubscribe -np 1 --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE \
        -x NCFSM_BACKEND -x NCFSM_PUSH_WAKE $B/bench/allreduce_latency --no-sweep --skip-cpu --out-of-place --bw-mib 1024
      echo "exit $?"
    } > $OUT/push-$V-$W.txt 2>&1
  done
done
grep -H "^exit\|ncfsm_push \|ncfsm_auto \|push completion" $OUT/push-*.txt
