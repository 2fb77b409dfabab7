#!/usr/bin/env bash
# The commit that puts what other threads read on lines of their own, on the GPU machine:
# 1. the foreign-submitter stream on its 16 cores (null backend), c4f2292's engine_overhead
#    (eo_base) against this commit's (eo_final), 8 rounds pinned, 4 not;
# 2. the 1-GPU programs and bench/allreduce_latency twice, NCCL 2.28.3 and 2.28.9.
B=.gpurun/build
export LD_LIBRARY_PATH=$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
{
  for pin in --pin ""; do
    rounds="1 2 3 4 5 6 7 8"; [ -z "$pin" ] && rounds="1 2 3 4"
    for round in $rounds; do
      for bin in base final; do
        out=$(.gpurun/eo_$bin $pin --runs 15 threads-1 threads-2 threads-4 2>&1 | awk '/ratio/{printf "%s=%s ", $2, $3} $1 ~ /^threads-[124]$/{printf "%s_ns=%s ", $1, $2} $1=="threads-1.self"{printf "self_ns=%s ", $2}')
        echo "pin=${pin:-none} round=$round bin=$bin $out"
      done
    done
  done
} > $OUT/threads.txt 2>&1
for V in 2.28.3 2.28.9; do
  . scripts/gpu-env.sh $V
  export NCFSM_BACKEND=nccl NCCL_NVLS_ENABLE=0
  {
    for p in split_gpus 02_group_semantics 03_completion_timing; do
      d=examples; [ $p = split_gpus ] && d=tests
      echo "=== $d/$p --require-gpu (NCCL $V)"; $B/$d/$p --require-gpu > /tmp/prog.txt 2>&1; rc=$?; tail -4 /tmp/prog.txt; echo "exit $rc"
    done
    for r in 1 2; do
      echo "=== run $r, NCCL $V: mpirun -np 1 allreduce_latency --no-sweep --skip-cpu --bw-mib 64"
      mpirun --oversubscribe -np 1 --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x NCFSM_BACKEND \
        $B/bench/allreduce_latency --no-sweep --skip-cpu --bw-mib 64; echo "exit $?"
    done
  } > $OUT/gpu-$V.txt 2>&1
done
grep -H "exit\|PASS (\|KV stream.ncfsm\|KV stream.raw_block_g64" $OUT/gpu-*.txt
cat $OUT/threads.txt
