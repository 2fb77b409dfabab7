#!/bin/bash
# A/B on the device host (pinned: loop thread CPU 0, reference CPU 1, submitter k CPU 1+k):
#   exp    = main's work layout;  layout = the fields a submission writes first
#   ho=1   = a foreign submitter hands off first (EM_HO)
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/../.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for round in 1 2 3 4 5 6; do
  for bin in exp layout; do
    for ho in "" 1; do
      out=$(EM_PIN=1 EM_HO=$ho ./engine_overhead_$bin --runs 15 threads-1 threads-2 threads-4 2>&1 | awk '/ratio/{printf "%s=%s ", $2, $3} / threads-[124] /{}' )
      rows=$(EM_PIN=1 EM_HO=$ho ./engine_overhead_$bin --runs 15 threads-1 2>&1 | awk '$1=="threads-1"||$1=="threads-1.self"{printf "%s=%s ", $1, $2}')
      echo "round=$round bin=$bin ho=${ho:-0} $out | $rows"
    done
  done
done
