#!/usr/bin/env bash
# make demo: the flagship example, examples/02_group_semantics (the seed
# chapter's nine group/async variants through ncfsm, one CSV row per variant
# and rank), one rank per process under mpirun:
#   GPUs visible: real NCCL, one rank per GPU (2 ranks on a 2-GPU host);
#   no GPU:       the sim, 4 ranks.
# Without mpirun (or with NCFSM_DEMO_MODE=one-process) one thread drives the
# ranks in one process instead (ncfsm_comm_init_all).
set -euo pipefail
BUILD=${1:-build}
EX="$BUILD/examples/02_group_semantics"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export NCFSM_BACKEND=${NCFSM_BACKEND:-auto}

# What this machine has (a summary of ncfsm-info). A failing ncfsm-info
# stops the demo: its error is shown, not hidden.
if ! info=$("$BUILD/tools/ncfsm-info"); then
  echo "demo: $BUILD/tools/ncfsm-info failed; see its error above" >&2
  exit 1
fi
printf '%s\n' "$info" | grep -E "^ncfsm|runtime|picks"
echo

ngpu=0
if [ "$NCFSM_BACKEND" != sim ] && command -v nvidia-smi >/dev/null 2>&1; then
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
fi
if [ "$ngpu" -gt 0 ]; then
  np=$ngpu
  [ "$np" -gt 8 ] && np=8
  what="real NCCL, $np ranks (one per GPU)"
else
  np=4
  what="the sim (no GPU visible), 4 ranks"
fi

mode=${NCFSM_DEMO_MODE:-mpirun}
if [ "$mode" = mpirun ] && ! command -v mpirun >/dev/null 2>&1; then
  echo "(mpirun not found: one process drives all ranks instead)"
  mode=one-process
fi

if [ "$mode" = mpirun ]; then
  echo "== mpirun -np $np $EX   [$what; one rank per process, PMIx bootstrap]"
  if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
  exec mpirun --oversubscribe -np "$np" -x NCFSM_BACKEND -x NCCL_NVLS_ENABLE ${LD_LIBRARY_PATH:+-x LD_LIBRARY_PATH} "$EX"
else
  echo "== $EX --ranks $np   [$what; one thread drives all ranks]"
  exec "$EX" --ranks "$np"
fi
