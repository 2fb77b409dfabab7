#!/usr/bin/env bash
# Regenerates every committed expected-output file, and the README copies of
# them, from a build directory:
#
#   scripts/update-expected.sh [BUILD]        (default: build)
#
# The files are the ones the CTests labelled `expected` compare with
# (examples/CMakeLists.txt; today examples/01_lifecycle/expected-sim.txt and
# its copy in examples/01_lifecycle/README.md). Those tests run here with
# NCFSM_UPDATE_EXPECTED=1: cmake/check-output.cmake then writes the filtered
# output to the expected file instead of comparing (only when the program's
# other checks pass: a failing run never becomes the expected output), and
# cmake/check-readme-copy.cmake rewrites the README's copy. The tests are
# then run again in their normal mode, and the changed files are listed:
# read the diff before committing it.
set -euo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -f "$BUILD/CTestTestfile.cmake" ]; then
  echo "update-expected: $BUILD is not a configured build directory (make configure, or" \
       "cmake -S $ROOT -B $BUILD -G Ninja)" >&2
  exit 2
fi
cmake --build "$BUILD"
echo "== regenerating (NCFSM_UPDATE_EXPECTED=1 ctest -L expected)"
NCFSM_UPDATE_EXPECTED=1 ctest --test-dir "$BUILD" -L expected --output-on-failure
echo "== checking"
ctest --test-dir "$BUILD" -L expected --output-on-failure
echo "== changed files"
git -C "$ROOT" status --short -- examples tests/trace docs | grep . || echo "(none: the expected outputs were up to date)"
