#!/usr/bin/env bash
# Installs the Debian packages conveyor builds with. Idempotent: apt runs only when a
# package is missing.
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config libabsl-dev libfast-float-dev libyaml-cpp-dev
          libcli11-dev libgtest-dev libgmock-dev googletest libbenchmark-dev clang libclang-rt-14-dev
          libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc prometheus-cpp-dev
          openssl python3 python3-grpcio python3-protobuf python3-numpy python3-torch python3-yaml
          python3-venv python3-setuptools python3-wheel dpkg-dev debootstrap)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "conveyor: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
