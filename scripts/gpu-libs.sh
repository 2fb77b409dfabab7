#!/usr/bin/env bash
# Fills .gpu/lib with the runtime libraries the GPU machine lacks, from this
# machine's package archive (run it here, from the repository root, before
# the working tree travels to the GPU machine; scripts/gpu-env.sh puts
# .gpu/lib last on LD_LIBRARY_PATH there):
#
#   scripts/gpu-libs.sh [BUILD]
#
# 1. `apt-get download`s the Debian packages below into .gpu/debs (both
#    folders are ignored by git: /.gpu/ in .gitignore);
# 2. unpacks each with `dpkg-deb -x` and copies its shared libraries (files
#    and SONAME links) from usr/lib/<multiarch> into .gpu/lib, with
#    .gpu/lib/PACKAGES.txt naming each package and version;
# 3. checks the result against what BUILD's programs (default build) need:
#    every NEEDED library of BUILD/tools/ncfsm-info and BUILD/tests/test_sim_split
#    that these packages provide must be in .gpu/lib under its SONAME, and
#    ncfsm-info must run with .gpu/lib first on LD_LIBRARY_PATH and load those
#    libraries from there (LD_DEBUG=libs);
# 4. checks that the GPU machine's C library can run them: no library of
#    .gpu/lib and no program of BUILD needs a GLIBC_ symbol version newer than
#    GPU_HOST_GLIBC (default 2.39, Ubuntu 24.04's).
# Exit 0 when all of it held; 1 with the reason otherwise.
#
# The packages come from this machine's archive (Debian 12): the build links
# against Debian's libraries, so their SONAMEs are the ones it needs, and
# Ubuntu 24.04 ships the same SONAMEs (libjansson.so.4, libcmocka.so.0,
# libxxhash.so.0). The GPU machine (Ubuntu 24.04.3, glibc 2.39, CUDA 13.0, NCCL
# 2.28.3, Open MPI 4.1.6 with PMIx 5, libevent 2.1.12) has libjansson4 and
# libxxhash0 but no cmocka (docs/results/gpu-host-libs-2026-12-02.txt); .gpu/lib
# is searched after the host's libraries, so the host's own win where it has
# them. Never add libpmix: in .gpu/lib it would shadow the host's PMIx 5, which
# mpirun's plugins need (measured: "undefined symbol: PMIx_Info_create").
set -euo pipefail

PACKAGES=(libjansson4 libcmocka0 libxxhash0)
BUILD=${1:-build}
GPU_HOST_GLIBC=${GPU_HOST_GLIBC:-2.39}
ROOT=$(pwd)
DEBS=$ROOT/.gpu/debs
LIB=$ROOT/.gpu/lib

die() {
  echo "gpu-libs: $*" >&2
  exit 1
}

[ -f scripts/gpu-env.sh ] || die "run it from the repository root (no scripts/gpu-env.sh here)"
git check-ignore -q .gpu/lib || die ".gpu/ is not ignored by git: it must stay out of the repository"
command -v apt-get >/dev/null || die "apt-get not found: this script needs a Debian or Ubuntu machine"
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)

mkdir -p "$DEBS" "$LIB"
rm -f "$DEBS"/*.deb
(cd "$DEBS" && apt-get download "${PACKAGES[@]}") || die "apt-get download ${PACKAGES[*]} failed"

rm -f "$LIB"/lib*.so* "$LIB/PACKAGES.txt"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for deb in "$DEBS"/*.deb; do
  name=$(dpkg-deb -f "$deb" Package)
  version=$(dpkg-deb -f "$deb" Version)
  case $name in *pmix*) die "$name: libpmix must not go to .gpu/lib (it shadows the host's PMIx 5)" ;; esac
  dpkg-deb -x "$deb" "$tmp/$name"
  n=0
  for f in "$tmp/$name/usr/lib/$arch"/lib*.so.* "$tmp/$name/lib/$arch"/lib*.so.*; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    cp -P "$f" "$LIB/"
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] || die "$name ($deb) has no shared library under usr/lib/$arch"
  echo "$name $version ($(basename "$deb")): $n file(s)" >>"$LIB/PACKAGES.txt"
done

# ---- check: what the build needs from these packages is in .gpu/lib -----------------------------
need_of() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
soname_of() { readelf -d "$1" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p'; }
provided=$(for d in "$tmp"/*; do
  find "$d" -name 'lib*.so.*' \( -type f -o -type l \) -printf '%f\n'
done | sort -u)
bins=("$BUILD/tools/ncfsm-info" "$BUILD/tests/test_sim_split")
for b in "${bins[@]}"; do [ -x "$b" ] || die "$b not found: build first (make build), or name the build folder"; done
expected=$(for b in "${bins[@]}"; do need_of "$b"; done | sort -u | grep -Fxf <(echo "$provided") || true)
[ -n "$expected" ] || die "none of ${bins[*]} needs a library of ${PACKAGES[*]}: the package list is stale"
for so in $expected; do
  f=$LIB/$so
  [ -e "$f" ] || die "$so (NEEDED by the build) is not in .gpu/lib"
  [ "$(soname_of "$(readlink -f "$f")")" = "$so" ] || die "$f has SONAME '$(soname_of "$(readlink -f "$f")")', not $so"
done
# ncfsm-info loads them from .gpu/lib when .gpu/lib comes first (on the GPU machine
# it comes last, after the host's own, which it lacks).
trace=$(LD_LIBRARY_PATH=$LIB LD_DEBUG=libs "$BUILD/tools/ncfsm-info" 2>&1 >/dev/null) ||
  die "$BUILD/tools/ncfsm-info failed with LD_LIBRARY_PATH=$LIB"
for so in $(need_of "$BUILD/tools/ncfsm-info" | grep -Fxf <(echo "$expected") || true); do
  echo "$trace" | grep -q "calling init: $LIB/$so" || die "ncfsm-info did not load $so from $LIB"
done

# the GPU machine's glibc runs them: the newest GLIBC_ version each one needs
glibc_of() { objdump -T "$1" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1; }
newer() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | tail -1)" != "$2" ]; }
glibc_report=
for f in "$LIB"/lib*.so.*[0-9] "${bins[@]}"; do
  [ -L "$f" ] && continue
  g=$(glibc_of "$f")
  [ -n "$g" ] || die "$f: objdump -T found no GLIBC_ version"
  newer "$g" "$GPU_HOST_GLIBC" && die "$f needs GLIBC_$g, newer than the GPU machine's $GPU_HOST_GLIBC (GPU_HOST_GLIBC)"
  so=$(soname_of "$f")
  glibc_report+="  $(basename "$f")${so:+ (SONAME $so)}: needs GLIBC_$g"$'\n'
done

files=("$LIB"/lib*.so*)
echo "gpu-libs: .gpu/lib holds ${#files[@]} files from ${PACKAGES[*]}:"
sed 's/^/  /' "$LIB/PACKAGES.txt"
echo "gpu-libs: the build needs, and .gpu/lib has: ${expected//$'\n'/ }"
echo "gpu-libs: each needs at most the GPU machine's glibc $GPU_HOST_GLIBC:"
printf '%s' "$glibc_report"
