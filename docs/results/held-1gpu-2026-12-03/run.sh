#!/usr/bin/env bash
# A group held on its thread (issue 22) on 1 H200, both NCCL versions: the 1-GPU programs whose
# groups now take the held path (02's groups of one op end held, its nested group spills at its
# second op), and the small-op stream and round trip of bench/allreduce_latency, once per version.
# The binaries are the development machine's build of a210c26, copied to .gpurun/build.
B=.gpurun/build
for V in 2.28.3 2.28.9; do
  . scripts/gpu-env.sh $V
  export NCFSM_BACKEND=nccl NCCL_NVLS_ENABLE=0
  {
    for p in split_gpus 02_group_semantics 03_completion_timing; do
      d=examples; [ $p = split_gpus ] && d=tests
      echo "=== $d/$p --require-gpu (NCCL $V)"; $B/$d/$p --require-gpu > /tmp/prog.txt 2>&1; rc=$?
      cat /tmp/prog.txt; echo "exit $rc"
    done
    echo "=== NCCL $V: mpirun -np 1 allreduce_latency --no-sweep --skip-cpu --bw-mib 64"
    mpirun --oversubscribe -np 1 --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NCFSM_BACKEND \
      $B/bench/allreduce_latency --no-sweep --skip-cpu --bw-mib 64; echo "exit $?"
  } > $OUT/held-$V.txt 2>&1
done
grep -H "^exit\|PASS\|FAIL" $OUT/held-*.txt
