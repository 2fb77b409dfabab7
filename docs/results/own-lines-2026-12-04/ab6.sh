#!/bin/bash
# 16-core host, one process a row, 8 rounds pinned: eo_base = c4f2292, eo_final = 1106af8 (pads:
# awake on the line after the hand-off stack), eo_final2 = the commit after it (the types aligned
# to a line: the stack, the spare stack and awake on one line; the prefetch covers a work that
# does not start on a line).
cd "$(dirname "$0")/../../../.gpurun"
export LD_LIBRARY_PATH=$PWD/../.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for round in 1 2 3 4 5 6 7 8; do
  for bin in base final final2; do
    out=$(./eo_$bin --pin --runs 15 threads-1 threads-2 threads-4 2>&1 | awk '/ratio/{printf "%s=%s ", $2, $3} $1 ~ /^threads-[124]$/{printf "%s_ns=%s ", $1, $2} $1=="threads-1.self"{printf "self_ns=%s ", $2}')
    echo "pin=--pin round=$round bin=$bin $out"
  done
done
