#!/usr/bin/env bash
# run_recovery.sh N OUTDIR [--victim R] [--kill-at K] [--kill-point before|inflight|after] [--iters I]
#                 [--gpu] [--check]
#
# Runs examples/05_recovery as N processes that meet through a standalone
# ncfsm-store on a free loopback port (a store hosted by a rank would die
# with it), one of which kills itself with SIGKILL; then prints the
# survivors' records (OUTDIR/rank<r>.json) as a table (also OUTDIR/report.md). --check: exit 1
# unless every survivor finished every iteration with the right sums after
# exactly one recovery, and the victim died by SIGKILL. Environment: BUILD
# (default: this script's ../../build), CASE_TIMEOUT (s, default 120).
set -u
n=${1:?usage: run_recovery.sh N OUTDIR [options]}
out=${2:?usage: run_recovery.sh N OUTDIR [options]}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD:-$here/../../build}
bin=$build/examples/05_recovery
store=$build/tools/ncfsm-store
victim=$((n - 1)) kill_at=10 point=inflight iters=30 gpu=() check=0
while [ $# -gt 0 ]; do
  case $1 in
    --victim) victim=$2; shift ;;
    --kill-at) kill_at=$2; shift ;;
    --kill-point) point=$2; shift ;;
    --iters) iters=$2; shift ;;
    --gpu) gpu=(--require-gpu) ;;
    --check) check=1 ;;
    *) echo "run_recovery.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ -x "$bin" ] && [ -x "$store" ] || { echo "run_recovery.sh: build $bin and $store first" >&2; exit 2; }
rm -rf "$out" && mkdir -p "$out" || exit 2
export NCFSM_STORE_TOKEN="recovery-$$"
unset PMIX_RANK NCFSM_BOOTSTRAP NCFSM_STORE_HOST
"$store" --listen 127.0.0.1:0 --print-port >"$out/port" 2>"$out/store.err" &
spid=$!
trap 'kill $spid 2>/dev/null' EXIT
i=0
until grep -q '^[0-9][0-9]*$' "$out/port" 2>/dev/null; do
  i=$((i + 1)); [ $i -gt 400 ] && { echo "ncfsm-store printed no port" >&2; exit 1; }
  sleep 0.05
done
export NCFSM_STORE_ADDR=127.0.0.1:$(cat "$out/port") NCFSM_WORLD_SIZE=$n
pids=()
for ((r = 0; r < n; r++)); do
  NCFSM_RANK=$r timeout -k 5 "${CASE_TIMEOUT:-120}" "$bin" --iters "$iters" --victim "$victim" --kill-at "$kill_at" \
    --kill-point "$point" --out "$out" "${gpu[@]}" >"$out/rank$r.out" 2>&1 &
  pids+=($!)
done
rcs=()
for ((r = 0; r < n; r++)); do
  wait "${pids[$r]}"
  rcs+=($?)
done
cat "$out"/rank*.out
[ "${rcs[0]}" -eq 77 ] && exit 77
echo
args=(--report "$out" --np "$n" --victim "$victim" --exits "${rcs[*]}")
[ $check -eq 1 ] && args+=(--check)
"$bin" "${args[@]}" | tee "$out/report.md"
exit "${PIPESTATUS[0]}"
