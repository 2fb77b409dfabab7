#!/usr/bin/env bash
# Install ncfsm into a temporary prefix, then build and run a consumer with
# find_package(ncfsm) and with pkg-config ncfsm.
set -euo pipefail
BUILD=$1 SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cmake --install "$BUILD" --prefix "$T/prefix" >/dev/null
mkdir -p "$T/consumer"
cp "$SRC/consumer.c" "$T/consumer/"
cp "$SRC/CMakeLists.txt.in" "$T/consumer/CMakeLists.txt"
cmake -S "$T/consumer" -B "$T/consumer/build" -DCMAKE_PREFIX_PATH="$T/prefix" >/dev/null
cmake --build "$T/consumer/build" >/dev/null
LIBDIR=$(ls -d "$T"/prefix/lib*/ | head -1)
LD_LIBRARY_PATH="$LIBDIR" "$T/consumer/build/consumer_cmake"
PKG_CONFIG_PATH="$LIBDIR/pkgconfig" cc -o "$T/consumer_pc" "$SRC/consumer.c" \
  $(PKG_CONFIG_PATH="$LIBDIR/pkgconfig" pkg-config --cflags --libs ncfsm)
LD_LIBRARY_PATH="$LIBDIR" "$T/consumer_pc"
