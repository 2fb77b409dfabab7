#!/bin/bash
# A/B on the device host: A = main's submit path, B (EM_HO=1) = a foreign submitter hands off first.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/../.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nproc; lscpu | grep -E "Model name|^CPU\(s\)|Thread|NUMA node\(s\)"
B=./engine_overhead_exp
for round in 1 2 3 4 5; do
  for pin in "" 1; do
    for ho in "" 1; do
      out=$(EM_PIN=$pin EM_HO=$ho $B threads-1 threads-2 threads-4 2>&1 | awk '/ratio/{printf "%s=%s ", $2, $3}')
      echo "round=$round pin=${pin:-0} handoff_first=${ho:-0} $out"
    done
  done
done
echo "--- raw rows, one run each"
EM_PIN=1 $B threads-1 threads-2 threads-4 coalesce pingpong
EM_PIN=1 EM_HO=1 $B threads-1 threads-2 threads-4
