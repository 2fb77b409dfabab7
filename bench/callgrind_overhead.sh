#!/usr/bin/env bash
# Instructions per op of the engine (null backend) under callgrind.
#
#   bench/callgrind_overhead.sh [BIN] [--ops N] [--idle-ms MS] [--csv FILE] [--legacy] [MODE...]
#
# BIN: build/bench/engine_overhead unless given. With MODEs, one valgrind per
# mode; with none, every mode of `BIN --list`. --legacy: issue 2's run, the
# three patterns in one process (`BIN --callgrind`). Each measured block is
# named "<mode>_<ops>_ops" by the program (CALLGRIND_DUMP_STATS_AT): its
# instruction total divided by <ops> is the figure. --csv also writes
# "mode,ops,instructions,per_op" lines. Exits 1 when a mode fails or dumps
# no block.
set -euo pipefail
BIN=build/bench/engine_overhead
ARGS=() MODES=() CSV= LEGACY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --ops|--idle-ms) ARGS+=("$1" "$2"); shift 2 ;;
    --csv) CSV=$2; shift 2 ;;
    --legacy) LEGACY=1; shift ;;
    --*) echo "callgrind_overhead.sh: unknown option $1" >&2; exit 2 ;;
    */*) BIN=$1; shift ;;
    *) MODES+=("$1"); shift ;;
  esac
done
[ -x "$BIN" ] || { echo "callgrind_overhead.sh: $BIN is not an executable (build it: cmake --build build)" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "callgrind_overhead.sh: valgrind is not installed" >&2; exit 2; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
[ -z "$CSV" ] || echo "mode,ops,instructions,per_op" >"$CSV"

# One valgrind run; prints a line per block it dumped, fails when there is none.
measure() { # run-id, program arguments...
  local id=$1 got=0 f part total ops
  shift
  mkdir -p "$OUT/$id"
  if ! valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file="$OUT/$id/cg.%p" "$BIN" "$@" \
      >"$OUT/$id/stdout" 2>"$OUT/$id/log"; then
    echo "callgrind_overhead.sh: $BIN $* failed under valgrind:" >&2
    grep -v '^==' "$OUT/$id/log" | tail -5 >&2
    return 1
  fi
  for f in "$OUT/$id"/cg.*; do
    part=$(grep -m1 '^desc: Trigger: Client Request' "$f" | sed 's/.*Client Request: //' || true)
    [ -n "$part" ] || continue
    total=$(grep -m1 '^totals:' "$f" | awk '{print $2}')
    ops=$(echo "$part" | sed -E 's/.*_([0-9]+)_ops$/\1/')
    awk -v p="$part" -v t="$total" -v o="$ops" 'BEGIN { printf "%-28s %12s instructions  %8.0f per op\n", p, t, t / o }'
    [ -z "$CSV" ] || awk -v p="${part%_*_ops}" -v t="$total" -v o="$ops" \
      'BEGIN { printf "%s,%d,%d,%.1f\n", p, o, t, t / o }' >>"$CSV"
    got=$((got + 1))
  done
  [ "$got" -gt 0 ] || { echo "callgrind_overhead.sh: $BIN $* dumped no block" >&2; return 1; }
}

if [ "$LEGACY" = 1 ]; then
  measure legacy --callgrind "${ARGS[@]}"
  exit
fi
[ ${#MODES[@]} -gt 0 ] || mapfile -t MODES < <("$BIN" --list | cut -f1)
rc=0
for m in "${MODES[@]}"; do
  measure "$m" --callgrind "${ARGS[@]}" "$m" || rc=1
done
exit $rc
