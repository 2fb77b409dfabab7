#!/usr/bin/env bash
# Issue 22's engine-cost benchmarks: callgrind instructions per op and wall-time
# ns per op of every mode of engine_overhead side by side, in one markdown file
# with the commands, the commit and the machine; the data as CSV; a plot of the
# cost against the number of comms (matplotlib, else gnuplot, else not rendered).
#
#   bench/run_engine_scale.sh [--out DIR] [--name NAME] [--bin BIN] [--ops N] [--runs R]
#                             [--idle-ms MS] [MODE...]
#
# Writes DIR/NAME.md, DIR/NAME.csv (every mode), DIR/NAME-comms.csv (cost
# against N) and DIR/NAME-comms.png when a plotter is installed. Defaults:
# DIR build/engine-scale, NAME engine-scale-<UTC date>, BIN
# build/bench/engine_overhead, 10,000 ops, 9 runs, 1,000 ms idle, every mode.
# Wall times: every mode but memory-* in one process (ratios within one run
# are what this shared machine allows), each memory-* in a process of its own
# (its baseline is the process before the peak).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
BIN=build/bench/engine_overhead OUT=build/engine-scale NAME=engine-scale-$(date -u +%F)
OPS=10000 RUNS=9 IDLE=1000 MODES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --name) NAME=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --ops) OPS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --idle-ms) IDLE=$2; shift 2 ;;
    --*) echo "run_engine_scale.sh: unknown option $1" >&2; exit 2 ;;
    *) MODES+=("$1"); shift ;;
  esac
done
[ -x "$BIN" ] || { echo "run_engine_scale.sh: $BIN is not an executable (build it: cmake --build build)" >&2; exit 2; }
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$BIN" --list >"$TMP/list.tsv"
[ ${#MODES[@]} -gt 0 ] || mapfile -t MODES < <(cut -f1 "$TMP/list.tsv")
WALL=() MEM=()
for m in "${MODES[@]}"; do
  case "$m" in memory-*) MEM+=("$m") ;; *) WALL+=("$m") ;; esac
done

CMDS=()
run() { # record the command (paths from the repository root, the scratch directory as $TMP), then run it
  local out=$1 cmd
  shift
  cmd="$*"
  cmd=${cmd//$ROOT\//}
  CMDS+=("${cmd//$TMP/\$TMP}")
  echo "+ $*" >&2
  "$@" | tee "$out" >&2
}
run "$TMP/cg.txt" "$HERE/callgrind_overhead.sh" "$BIN" --ops "$OPS" --idle-ms "$IDLE" --csv "$TMP/cg.csv" "${MODES[@]}"
WALLS=() WALLFILES=()
if [ ${#WALL[@]} -gt 0 ]; then
  run "$TMP/wall.txt" "$BIN" --ops "$OPS" --runs "$RUNS" --idle-ms "$IDLE" "${WALL[@]}"
  WALLFILES+=("$TMP/wall.txt")
fi
for m in "${MEM[@]}"; do
  run "$TMP/wall-$m.txt" "$BIN" --idle-ms "$IDLE" "$m"
  WALLFILES+=("$TMP/wall-$m.txt")
done
for f in "${WALLFILES[@]}"; do WALLS+=(--wall "$f"); done
python3 "$HERE/engine_scale_table.py" --cg "$TMP/cg.csv" "${WALLS[@]}" --list "$TMP/list.tsv" \
  --csv "$OUT/$NAME.csv" --comms-csv "$OUT/$NAME-comms.csv" --cpus "$(nproc)" >"$TMP/tables.md"

PLOT="$OUT/$NAME-comms.png"
# the first Python with matplotlib: the one on PATH, else the system's (Debian's python3-matplotlib
# is for /usr/bin/python3, which a pyenv or venv on PATH hides)
PY=""
for p in python3 /usr/bin/python3; do
  if "$p" -c "import matplotlib" 2>/dev/null; then PY=$p; break; fi
done
if [ -n "$PY" ]; then
  "$PY" "$HERE/plot_engine_scale.py" "$OUT/$NAME-comms.csv" "$PLOT"
  PLOTLINE="![cost per op against the number of comms]($NAME-comms.png)"
elif command -v gnuplot >/dev/null; then
  gnuplot <<EOF
set terminal pngcairo size 900,420
set output "$PLOT"
set datafile separator ","
set logscale xy
set xlabel "1-rank comms on one loop"
set ylabel "instructions per op (callgrind)"
set key top left
plot "$OUT/$NAME-comms.csv" every ::1 using 1:2 with linespoints title "round robin", \
     "" every ::1 using 1:3 with linespoints title "one op each"
EOF
  PLOTLINE="![cost per op against the number of comms]($NAME-comms.png)"
else
  PLOTLINE="The plot was not rendered: neither matplotlib nor gnuplot is installed on the machine that ran this. \
The data is [$NAME-comms.csv]($NAME-comms.csv); \`python3 bench/plot_engine_scale.py $NAME-comms.csv $NAME-comms.png\` \
draws it where matplotlib is."
fi

COMMIT=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
ENGINE=$(git -C "$ROOT" log -1 --format=%h -- fsm core include 2>/dev/null || echo unknown)
DIRTY=$(git -C "$ROOT" status --porcelain --untracked-files=no -- . ':!docs' 2>/dev/null | head -1)
CACHE=$(dirname "$(dirname "$BIN")")/CMakeCache.txt
BTYPE=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$CACHE" 2>/dev/null || true)
CPU=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
{
  echo "# Engine cost at scale (issue 22)"
  echo
  echo "Measured $(date -u '+%F %H:%M UTC') at commit \`$COMMIT\`${DIRTY:+ (with uncommitted changes outside docs/)}"
  echo "(the engine, fsm/ core/ include/, as of its commit \`$ENGINE\`);"
  echo "build type ${BTYPE:-unknown}; $(nproc) CPUs ($CPU), shared with other work:"
  echo "callgrind counts are repeatable for a binary, wall times only as ratios within one run."
  echo "Null backend (\`NCFSM_BACKEND=null\`: every backend call free), 1-element AllReduces, a callback per work,"
  echo "default features on (flight recorder 2,048 entries per comm; verification async, which has nothing to"
  echo "compare on the 1-rank comms of every mode but pair-*)."
  echo "Made by \`bench/run_engine_scale.sh\`; the modes are described in \`bench/engine_overhead.c\` and"
  echo "\`bench/engine_modes.c\`. Data: [$NAME.csv]($NAME.csv), [$NAME-comms.csv]($NAME-comms.csv)."
  echo
  echo "How to read them: ops is the op count of the measured block (n rounded up to whole rounds of the"
  echo "mode); every mode first ran as many ops unmeasured. threads-T and waiters-T count the instructions of"
  echo "every thread (the loop's and the submitters'); valgrind runs one thread at a time, so their batches and"
  echo "counts vary by a few percent from run to run, and their wall times are thread hand-offs on a shared"
  echo "machine. memory-P runs in a process of its own: its baseline is after 1,000 pingpong ops, RSS from"
  echo "/proc/self/statm, heap in use from mallinfo2 (bytes malloc'ed and not freed); \"after idle\" is"
  echo "after $IDLE ms (--idle-ms) with the loop on its own thread."
  echo
  echo "Commands (from the repository root):"
  echo
  echo '```'
  printf '%s\n' "${CMDS[@]}"
  echo '```'
  echo
  sed -n '/^### Goals/,/^### Every mode/p' "$TMP/tables.md" | sed '$d'
  echo "### Plot"
  echo
  echo "$PLOTLINE"
  echo
  sed -n '/^### Every mode/,$p' "$TMP/tables.md"
  echo "### Raw output"
  echo
  echo '```'
  cat "$TMP/cg.txt"
  echo
  cat "${WALLFILES[@]}"
  echo '```'
} >"$OUT/$NAME.md"
echo "run_engine_scale.sh: wrote $OUT/$NAME.md, $OUT/$NAME.csv, $OUT/$NAME-comms.csv" \
  "$( [ -f "$PLOT" ] && echo "and $PLOT" || echo "(plot not rendered)")" >&2
