#!/usr/bin/env bash
# On the GPU machine, from the repository root, with a build made elsewhere:
#   scripts/gpu-suite.sh BUILD OUTDIR
# For NCCL 2.28.3 (system) and 2.28.9 (torch wheel): ncfsm-info, the GPU-labelled
# CTest cases (examples, conformance, local_drift), examples/01_lifecycle on 2
# GPUs in one process, and the seed's op mismatch recorded by the flight
# recorder (tests/gpu/mismatch_dump) and read by ncfsm-trace and by PyTorch's
# fr_trace. Everything it prints goes to OUTDIR/gpu-suite-<version>.txt as well.
set -uo pipefail
BUILD=${1:-build}
OUT=${2:-gpu-out}
mkdir -p "$OUT"
for v in 2.28.3 2.28.9; do
  (
    # shellcheck source=/dev/null
    . scripts/gpu-env.sh "$v"
    echo "### NCCL $v ($(date -u +%FT%TZ), $(hostname))"
    echo "\$ $BUILD/tools/ncfsm-info"
    "$BUILD/tools/ncfsm-info"
    echo
    echo "\$ NCFSM_BACKEND=nccl $BUILD/examples/01_lifecycle"
    NCFSM_BACKEND=nccl "$BUILD/examples/01_lifecycle"
    echo "exit $?"
    echo
    for kind in op count; do
      d=$(mktemp -d)
      echo "\$ $BUILD/tests/mismatch_dump DIR --kind $kind --timeout-ms 3000 --require-gpu"
      "$BUILD/tests/mismatch_dump" "$d" --kind "$kind" --timeout-ms 3000 --require-gpu
      echo "exit $?"
      ls "$d"
      echo "\$ $BUILD/tools/ncfsm-trace DIR"
      "$BUILD/tools/ncfsm-trace" "$d"
      echo "exit $?"
      echo "\$ python3 -m torch.distributed.flight_recorder.fr_trace DIR -p <ncfsm_fr_<comm>_nccl_trace_rank_>"
      pfx=$(ls "$d" | grep _nccl_trace_rank_0 | sed 's/0$//')
      python3 -m torch.distributed.flight_recorder.fr_trace "$d" -p "$pfx" > "$d.fr" 2>&1
      echo "exit $?"
      tail -40 "$d.fr"
      rm -f "$d.fr"
      rm -rf "$d"
      echo
    done
    echo "\$ (cd $BUILD && ctest -L gpu -V)"
    (cd "$BUILD" && ctest -L gpu -V --timeout 300)
    echo "exit $?"
    for f in "$BUILD"/tests/conformance/conformance-nccl.*; do
      [ -f "$f" ] && cp "$f" "$OUT/$(basename "${f%.*}")-$v.${f##*.}"
    done
  ) 2>&1 | tee "$OUT/gpu-suite-$v.txt"
done
