#!/usr/bin/env bash
# Instructions per op of the engine (null backend) under callgrind.
set -euo pipefail
BIN=${1:-build/bench/engine_overhead}
OUT=$(mktemp -d)
valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file="$OUT/cg.%p" "$BIN" --callgrind >/dev/null 2>"$OUT/log"
for f in "$OUT"/cg.*; do
  part=$(grep -m1 '^desc: Trigger: Client Request' "$f" | sed 's/.*Client Request: //' || true)
  [ -n "$part" ] || continue
  total=$(grep -m1 '^totals:' "$f" | awk '{print $2}')
  ops=$(echo "$part" | sed -E 's/.*_([0-9]+)_ops/\1/')
  printf "%-24s %12s instructions  %8.0f per op\n" "$part" "$total" "$(echo "$total / $ops" | bc -l)"
done
rm -rf "$OUT"
