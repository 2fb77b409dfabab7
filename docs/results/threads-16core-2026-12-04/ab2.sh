#!/bin/bash
# A/B on the device host: eo_main = HEAD's engine; eo_new = foreign submitters of a loop on its own
# thread hand off first, and a push wakes the loop thread only when it waits in libevent.
# EM_PIN=1: loop thread on CPU 0, the reference (main thread) on CPU 1, submitter k on CPU 1+k.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/../.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for round in 1 2 3 4 5 6; do
  for pin in 1 ""; do
    for bin in main new; do
      out=$(EM_PIN=$pin ./eo_$bin --runs 15 threads-1 threads-2 threads-4 2>&1 | awk '/ratio/{printf "%s=%s ", $2, $3} $1 ~ /^threads-[124]$/{printf "%s_ns=%s ", $1, $2} $1=="threads-1.self"{printf "self_ns=%s ", $2}')
      echo "round=$round pin=${pin:-0} bin=$bin $out"
    done
  done
done
