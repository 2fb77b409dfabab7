#!/usr/bin/env bash
# run_matrix.sh NP OUTDIR [--tcp] [--gpu] [--fr] [--cases "a b ..."] [-- extra case args]
#
# Runs every case of 04_failure_matrix (--list: the -off, -strict, -async and
# -default ones) with one rank per process, each in
# OUTDIR/<case>: under `mpirun -np NP` (PMIx bootstrap), or with --tcp as NP
# processes that meet through a TCP store (tools/ncfsm-store, one per case,
# on a free loopback port); then ncfsm-trace on the case's dumps
# (OUTDIR/<case>/trace.txt, trace.rc); with --fr also PyTorch's fr_trace on
# the PyTorch-format dumps (OUTDIR/<case>/fr.txt); then prints the report and
# checks it (exit 1 when a case differs from what the design promises, or,
# with --tcp, when a rank exits non-zero: a sanitizer's report fails the run).
#
#   --tcp    the TCP store instead of mpirun (no PMIx; used under ASan)
#   --gpu    real NCCL (--require-gpu; exit 77 when no GPU is visible)
#   --fr     run python3 -m torch.distributed.flight_recorder.fr_trace too
# Environment: BUILD (build dir, default: this script's ../../build),
# MPIRUN (default mpirun), CASE_TIMEOUT (s per case, default 60).
set -u
np=${1:?usage: run_matrix.sh NP OUTDIR [--gpu] [--fr] [--cases LIST]}
out=${2:?usage: run_matrix.sh NP OUTDIR [--gpu] [--fr] [--cases LIST]}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD:-$here/../../build}
bin=$build/examples/04_failure_matrix
trace=$build/tools/ncfsm-trace
mpirun=${MPIRUN:-mpirun}
gpu=() fr=0 cases="" tcp=0 bad_exits=""
while [ $# -gt 0 ]; do
  case $1 in
    --tcp) tcp=1 ;;
    --gpu) gpu=(--require-gpu) ;;
    --fr) fr=1 ;;
    --cases) cases=$2; shift ;;
    --) shift; break ;;
    *) echo "run_matrix.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ -x "$bin" ] || { echo "run_matrix.sh: $bin not built" >&2; exit 2; }
[ -x "$trace" ] || { echo "run_matrix.sh: $trace not built" >&2; exit 2; }
store=$build/tools/ncfsm-store
if [ $tcp -eq 1 ]; then
  [ -x "$store" ] || { echo "run_matrix.sh: $store not built" >&2; exit 2; }
else
  command -v "$mpirun" >/dev/null || { echo "run_matrix.sh: $mpirun not found" >&2; exit 2; }
fi
if [ $fr -eq 1 ] && ! python3 -c "import torch.distributed.flight_recorder" 2>/dev/null; then
  echo "run_matrix.sh: --fr: torch's flight_recorder is not importable here; fr_trace is not run"
  fr=0
fi
[ -n "$cases" ] || cases=$("$bin" --list)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
rm -rf "$out" && mkdir -p "$out" || exit 2

# One case over the TCP store: a store on a free port, NP rank processes.
run_tcp() {
  local c=$1 d=$out/$1 spid pids=() rc=0 r i=0
  shift
  NCFSM_STORE_TOKEN="matrix-$$-$c" "$store" --listen 127.0.0.1:0 --print-port >"$d/port" 2>"$d/store.err" &
  spid=$!
  until grep -q '^[0-9][0-9]*$' "$d/port" 2>/dev/null; do
    i=$((i + 1))
    if [ $i -gt 400 ] || ! kill -0 $spid 2>/dev/null; then
      echo "ncfsm-store did not print its port within 20 s" >"$d/run.txt"
      kill $spid 2>/dev/null
      return 1
    fi
    sleep 0.05
  done
  for ((r = 0; r < np; r++)); do
    NCFSM_STORE_TOKEN="matrix-$$-$c" NCFSM_STORE_ADDR="127.0.0.1:$(cat "$d/port")" NCFSM_RANK=$r \
      NCFSM_WORLD_SIZE=$np timeout -k 5 "${CASE_TIMEOUT:-60}" "$bin" --case "$c" --out "$d" "${gpu[@]}" "$@" \
      >"$d/rank$r.out" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  kill -TERM $spid 2>/dev/null
  wait $spid 2>/dev/null
  cat "$d"/rank*.out >"$d/run.txt"
  return $rc
}
fwd=()
for v in NCFSM_BACKEND NCFSM_VERIFY_CHANNEL NCCL_NVLS_ENABLE LD_LIBRARY_PATH LSAN_OPTIONS ASAN_OPTIONS UBSAN_OPTIONS NCCL_DEBUG; do
  [ -n "${!v+x}" ] && fwd+=(-x "$v")
done
for c in $cases; do
  mkdir -p "$out/$c/dumps"
  t0=$(date +%s%N)
  if [ $tcp -eq 1 ]; then
    run_tcp "$c" "$@"
    rc=$?
  else
    timeout -k 5 "${CASE_TIMEOUT:-60}" "$mpirun" --oversubscribe -np "$np" "${fwd[@]}" \
      "$bin" --case "$c" --out "$out/$c" "${gpu[@]}" "$@" >"$out/$c/run.txt" 2>&1
    rc=$?
  fi
  t1=$(date +%s%N)
  [ $rc -eq 77 ] && { cat "$out/$c/run.txt"; exit 77; }
  ms=$(( (t1 - t0) / 1000000 ))
  printf '%-14s exit %d, %d.%03d s\n' "$c" $rc $((ms / 1000)) $((ms % 1000))
  if [ $rc -ne 0 ] && [ $tcp -eq 1 ]; then
    # over the TCP store each rank's own exit status is known: a rank that
    # exits non-zero (a harness error, a sanitizer's report) fails the run
    bad_exits="$bad_exits $c"
    echo "  a rank exited $rc; run output:"; sed 's/^/    /' "$out/$c/run.txt"
  elif [ $rc -ne 0 ]; then
    n=$(ls "$out/$c" | grep -c '^rank[0-9]*\.json$')
    # Open MPI 4.1's mpirun can crash in its own PMIx server finalize when a
    # rank left a fence unjoined (a skipping rank, async verification): the
    # ranks have finished by then; the report judges their records.
    [ "$n" -eq "$np" ] && echo "  (all $np ranks wrote their records; the launcher exited $rc after them)"
    echo "  run output:"; sed 's/^/    /' "$out/$c/run.txt"
  fi
  "$trace" "$out/$c/dumps" >"$out/$c/trace.txt" 2>&1
  echo $? >"$out/$c/trace.rc"
  if [ $fr -eq 1 ]; then
    id=$(ls "$out/$c/dumps" | sed -n 's/^ncfsm_fr_\([0-9a-f]*\)_nccl_trace_rank_.*/\1/p' | head -1)
    if [ -n "$id" ]; then
      python3 -m torch.distributed.flight_recorder.fr_trace "$out/$c/dumps" -p "ncfsm_fr_${id}_nccl_trace_rank_" \
        >"$out/$c/fr.txt" 2>&1
      echo $? >"$out/$c/fr.rc"
    fi
  fi
done
"$bin" --report "$out" --check --np "$np" | tee "$out/report.md"
rc=${PIPESTATUS[0]}
if [ -n "$bad_exits" ]; then
  echo "run_matrix.sh: a rank exited non-zero in:$bad_exits"
  exit 1
fi
exit "$rc"
