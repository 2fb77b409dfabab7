#!/usr/bin/env bash
# On the GPU machine, from the repository root, with a build made elsewhere:
#   scripts/gpu-suite.sh BUILD OUTDIR
# For NCCL 2.28.3 (system) and 2.28.9 (torch wheel): ncfsm-info, the GPU-labelled
# CTest cases, and examples/01_lifecycle on 2 GPUs in one process. Everything it
# prints goes to OUTDIR/gpu-suite-<version>.txt as well.
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
    echo "\$ (cd $BUILD && ctest -L gpu -V)"
    (cd "$BUILD" && ctest -L gpu -V --timeout 300)
    echo "exit $?"
    for f in "$BUILD"/tests/conformance/conformance-nccl.*; do
      [ -f "$f" ] && cp "$f" "$OUT/$(basename "${f%.*}")-$v.${f##*.}"
    done
  ) 2>&1 | tee "$OUT/gpu-suite-$v.txt"
done
