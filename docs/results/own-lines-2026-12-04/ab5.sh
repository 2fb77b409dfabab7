#!/bin/bash
# 16-core host, one process a row, 8 rounds, pinned then not:
#   eo_base     = c4f2292
#   eo_final    = the commit after it: what other threads read without the lock on lines of their
#                 own (comm and loop allocated on a line boundary), and the hand-off prefetching
#                 the works it passes between the threads
#   eo_final_wl = eo_final + a work whose fields written at submission come first
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/../.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for pin in --pin ""; do
  for round in 1 2 3 4 5 6 7 8; do
    for bin in base final final_wl; do
      out=$(./eo_$bin $pin --runs 15 threads-1 threads-2 threads-4 2>&1 | awk '/ratio/{printf "%s=%s ", $2, $3} $1 ~ /^threads-[124]$/{printf "%s_ns=%s ", $1, $2} $1=="threads-1.self"{printf "self_ns=%s ", $2}')
      echo "pin=${pin:-none} round=$round bin=$bin $out"
    done
  done
done
echo "--- eo_final --pin, other modes, one process"
./eo_final --pin pingpong coalesce threads-1 threads-2 threads-4 waiters-1
