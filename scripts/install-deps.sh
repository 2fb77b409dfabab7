#!/usr/bin/env bash
# Install the Debian packages ncfsm needs to build and test; uses sudo only
# when not root, and does nothing when everything is present already.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config libevent-dev libjansson-dev libcmocka-dev libssl-dev
      libxxhash-dev uthash-dev graphviz libpmix-dev openmpi-bin libopenmpi-dev valgrind clang
      libclang-rt-dev prometheus curl python3
      iproute2 iptables munge slurmctld slurmd slurm-client slurm-wlm-basic-plugins)  # the netns and slurm tests
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
