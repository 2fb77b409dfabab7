#!/usr/bin/env bash
# Install ncfsm into a temporary prefix, then build and run consumers:
#  - find_package(ncfsm) with nothing set but the consumer's own install
#    prefix (CMake searches it as it searches /usr/local, the default prefix:
#    README.md says what to set for another one), and with
#    CMAKE_PREFIX_PATH; the package found must be the one just installed;
#  - ncfsm::ncfsm, and ncfsm::http when the build has ncfsm_http;
#  - pkg-config ncfsm (and ncfsm_http);
#  - the installed config has no if() on a configure-time value (if(ON)).
# usage: install_test.sh BUILD_DIR SRC_DIR (this folder)
set -euo pipefail
BUILD=$1 SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "install_test: $*" >&2; exit 1; }
cmake --install "$BUILD" --prefix "$T/prefix" >/dev/null
LIBDIR=$(ls -d "$T"/prefix/lib*/ | head -1)
LIBDIR=${LIBDIR%/}
CONFIG=$(ls "$LIBDIR"/cmake/ncfsm/ncfsmConfig.cmake 2>/dev/null) || fail "no ncfsmConfig.cmake under $LIBDIR/cmake/ncfsm"
if grep -nE '^[[:space:]]*(else)?if\((ON|OFF|TRUE|FALSE|YES|NO|[01])\)' "$CONFIG"; then
  fail "$CONFIG has an if() on a literal (above): write the lines this build needs instead"
fi
http=OFF
[ -e "$LIBDIR/pkgconfig/ncfsm_http.pc" ] && http=ON
mkdir -p "$T/consumer"
cp "$SRC/consumer.c" "$SRC/consumer_http.c" "$T/consumer/"
cp "$SRC/CMakeLists.txt.in" "$T/consumer/CMakeLists.txt"
for how in install-prefix prefix-path; do
  case $how in
    install-prefix) args=(-DCMAKE_INSTALL_PREFIX="$T/prefix") ;;
    prefix-path) args=(-DCMAKE_PREFIX_PATH="$T/prefix") ;;
  esac
  B="$T/consumer/build-$how"
  env -u CMAKE_PREFIX_PATH -u ncfsm_DIR cmake -S "$T/consumer" -B "$B" -DWITH_HTTP=$http "${args[@]}" >"$T/cfg.log" ||
    { cat "$T/cfg.log" >&2; fail "find_package(ncfsm) with ${args[*]} failed"; }
  grep -q "consumer: ncfsm_DIR=$LIBDIR/cmake/ncfsm\$" "$T/cfg.log" ||
    fail "with ${args[*]}, find_package found another ncfsm: $(grep 'consumer: ncfsm_DIR' "$T/cfg.log")"
  cmake --build "$B" >/dev/null || fail "the consumer did not build ($how)"
  LD_LIBRARY_PATH="$LIBDIR" "$B/consumer_cmake"
  [ $http = OFF ] || LD_LIBRARY_PATH="$LIBDIR" "$B/consumer_http_cmake"
done
export PKG_CONFIG_PATH="$LIBDIR/pkgconfig"
cc -o "$T/consumer_pc" "$SRC/consumer.c" $(pkg-config --cflags --libs ncfsm)
LD_LIBRARY_PATH="$LIBDIR" "$T/consumer_pc"
if [ $http = ON ]; then
  cc -o "$T/consumer_http_pc" "$SRC/consumer_http.c" $(pkg-config --cflags --libs ncfsm_http)
  LD_LIBRARY_PATH="$LIBDIR" "$T/consumer_http_pc"
fi
echo "install_test: ok (ncfsm_http: $http)"
