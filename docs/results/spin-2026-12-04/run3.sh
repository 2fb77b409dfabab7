#!/usr/bin/env bash
# The foreign submitter (issue 22's goal: threads-1 <= 1.2x threads-1.self) at 782541c against
# d163242, 10 rounds alternating, pinned, --runs 15 -> threads-16core.txt.
B=.gpurun/build
for r in $(seq 1 10); do
  echo "## round $r head"; $B/bench/engine_overhead_head --runs 15 --pin threads-1 threads-2 2>&1 | grep -E '^threads|ratio'
  echo "## round $r new"; $B/bench/engine_overhead --runs 15 --pin threads-1 threads-2 2>&1 | grep -E '^threads|ratio'
done > $OUT/threads-16core.txt 2>&1
grep -E '^## |ratio threads-1 ' $OUT/threads-16core.txt | paste - - | awk '{print $4, $8}'
