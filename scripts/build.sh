#!/usr/bin/env bash
# Configures and builds conveyor into build/ (Release, tests and benchmarks included).
# Extra arguments go to cmake, e.g. scripts/build.sh -DCONVEYOR_CUDA=OFF
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$(nproc)"
