#!/usr/bin/env bash
# make demo: the lifecycle example (real NCCL when a GPU is visible, sim otherwise).
set -euo pipefail
BUILD=${1:-build}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
"$BUILD/tools/ncfsm-info" --brief 2>/dev/null || true
exec "$BUILD/examples/01_lifecycle"
