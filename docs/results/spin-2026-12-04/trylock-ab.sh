#!/usr/bin/env bash
# a: HEAD (f06cf28); b: HEAD + a waiter woken by a broadcast takes the lock by trylock spins
B=.gpurun/build/bench
for r in 1 2 3 4 5 6; do
  for v in a b; do
    echo "## round $r $v"; $B/eo_$v --runs 9 --pin waiters-1 waiters-2 waiters-4 2>&1 | grep -E '^waiters'
  done
done > $OUT/ab.txt 2>&1
cat $OUT/ab.txt | grep -E '^##|^waiters-[124] ' | awk '/^##/{k=$3" "$4; next} {print k, $1, $2}'
