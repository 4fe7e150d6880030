#!/usr/bin/env bash
# The main job on the bundled examples: install, build, start conveyord on the examples,
# train a logistic regression from its stream in PyTorch, then stop everything cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
work=$(mktemp -d)
build/server/conveyord examples/conveyor.yaml --listen 127.0.0.1:0 --port-file "$work/port" \
  --unix "$work/conveyord.sock" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
address="127.0.0.1:$(cat "$work/port")"
echo
echo "\$ conveyor subscribe $address --dataset sparse --epochs 20"
build/client/conveyor subscribe "$address" --dataset sparse --epochs 20
echo
echo "\$ python3 examples/train_logreg.py $address --epochs 5"
PYTHONPATH=build/python /usr/bin/python3 examples/train_logreg.py "$address" --epochs 5
echo
echo "\$ python3 examples/train_ddp.py $address --world 2 --workers 2 --epochs 3"
PYTHONPATH=build/python /usr/bin/python3 examples/train_ddp.py "$address" --world 2 --workers 2 --epochs 3
