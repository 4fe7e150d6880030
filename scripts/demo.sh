#!/usr/bin/env bash
# The main job on the bundled examples: install, build, then inspect a dataset and dump
# its first minibatches.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
echo
echo '$ conveyor inspect examples/conveyor.yaml --dataset sparse'
build/client/conveyor inspect examples/conveyor.yaml --dataset sparse
echo
echo '$ conveyor dump examples/conveyor.yaml --dataset sequences --minibatch-size 16 | head -3'
build/client/conveyor dump examples/conveyor.yaml --dataset sequences --minibatch-size 16 | head -3
echo
echo '$ conveyor bench examples/conveyor.yaml --dataset sparse --epochs 20'
build/client/conveyor bench examples/conveyor.yaml --dataset sparse --epochs 20
