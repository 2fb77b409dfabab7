#!/bin/bash
# 16-core host, pinned, one process a row, 6 rounds:
#   eo_base  = c4f2292
#   eo_pf2   = c4f2292 + the hand-off's work cache prefetches the next work's lines, and the take
#              prefetches each taken work's lines (write intent)
#   eo_lay   = c4f2292 + what other threads read without the lock on lines of their own
#              (comm: magic, ready_pub, rank, nranks, loop, be, stream, opts; loop: threaded,
#              group_state, held_taken, own_base, ops, trace; the hand-off stack's fields on
#              a line of their own), comm and loop allocated on a line boundary
#   eo_laypf = both
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/../.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for round in 1 2 3 4 5 6; do
  for bin in base pf2 lay laypf; do
    out=$(./eo_$bin --pin --runs 15 threads-1 threads-2 threads-4 2>&1 | awk '/ratio/{printf "%s=%s ", $2, $3} $1 ~ /^threads-[124]$/{printf "%s_ns=%s ", $1, $2} $1=="threads-1.self"{printf "self_ns=%s ", $2}')
    echo "round=$round bin=$bin $out"
  done
done
