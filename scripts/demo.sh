#!/usr/bin/env bash
# make demo: the lifecycle example (real NCCL when a GPU is visible, sim otherwise).
set -euo pipefail
BUILD=${1:-build}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
"$BUILD/tools/ncfsm-info" 2>/dev/null | grep -E "^ncfsm|runtime|picks" || true
echo
exec "$BUILD/examples/01_lifecycle"
