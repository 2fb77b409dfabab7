#!/bin/bash
# 16-core host, pinned: eo_base = c4f2292; eo_pf1 = the hand-off's work cache prefetches the next
# work's lines (write intent); eo_pf2 = that, and the take prefetches each taken work's lines.
# eo_cpu = c4f2292 with EM_CPU: the loop thread's and the submitting loop's CPU time per op.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/../.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for round in 1 2 3 4 5 6; do
  for bin in base pf1 pf2; do
    out=$(./eo_$bin --pin --runs 15 threads-1 threads-2 threads-4 2>&1 | awk '/ratio/{printf "%s=%s ", $2, $3} $1 ~ /^threads-[124]$/{printf "%s_ns=%s ", $1, $2} $1=="threads-1.self"{printf "self_ns=%s ", $2}')
    echo "round=$round bin=$bin $out"
  done
done
echo "--- EM_CPU=1 eo_cpu --pin --runs 5 threads-1 threads-2"
EM_CPU=1 ./eo_cpu --pin --runs 5 threads-1 threads-2 2>&1
