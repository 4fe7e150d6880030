#!/usr/bin/env bash
# deploy/smoke-test.sh: the container, end to end, on this machine (no registry needed).
#
# Installs build/ (cmake --install, the runtime component) and builds the runtime image FROM
# scratch out of that installed tree (deploy/bundle.sh --rootfs, deploy/Containerfile.scratch),
# runs it with podman as the image is meant to run (host network, the bundled examples
# mounted read-only at /config, TCP on every address with a token mounted as the secret
# /run/secrets/conveyor-token), waits until the image's HEALTHCHECK (`conveyor health` inside
# the container) passes, checks that a client without the token is refused, streams an epoch
# from the host with the token (`conveyor subscribe --dump`) and checks it equals `conveyor
# dump` of the same data, then stops the container with SIGTERM and checks that conveyord
# drained and exited 0.
#
#   bash deploy/smoke-test.sh          (installs podman from Debian if missing; needs root)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${CONVEYOR_BUILD_DIR:-$root/build}
name=conveyor-smoke-$$
image=localhost/conveyor-smoke:$$
work=$(mktemp -d)
say() { echo "smoke-test: $*"; }

if ! command -v podman >/dev/null; then
  say "installing podman (Debian)"
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq podman runc >/dev/null
fi
[[ -x $build/server/conveyord ]] || bash "$root/scripts/build.sh"
if ! podman info >/dev/null 2>&1; then
  say "SKIPPED: podman is installed but cannot run containers here ($(podman info 2>&1 | tail -1))"
  exit 0
fi
# Podman's default per-container ulimits are refused where this runs nested; keep the host's.
printf '[containers]\ndefault_ulimits = []\n' > "$work/containers.conf"
export CONTAINERS_CONF=$work/containers.conf

cleanup() {
  podman rm -f "$name" >/dev/null 2>&1 || true
  podman rmi -f "$image" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

say "installing $build and bundling the installed tree"
cmake --install "$build" --prefix "$work/prefix" --component runtime >/dev/null
bash "$root/deploy/bundle.sh" "$work/prefix" "$work/rootfs" --rootfs >/dev/null
cp "$root/deploy/Containerfile.scratch" "$work/Containerfile"
say "building $image"
podman build --format docker -q -t "$image" "$work" >/dev/null

port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
openssl rand -hex 32 > "$work/token"
chmod 0644 "$work/token"  # the container's user reads it
say "starting conveyord in $name on 0.0.0.0:$port with a token"
podman run -d --name "$name" --network host -v "$root/examples:/config:ro" \
  -v "$work/token:/run/secrets/conveyor-token:ro" "$image" 2>/dev/null \
  /config/conveyor.yaml --listen "0.0.0.0:$port" --token-file /run/secrets/conveyor-token \
  --unix /var/lib/conveyor/conveyord.sock >/dev/null

healthy=
for _ in $(seq 1 120); do
  if podman healthcheck run "$name" >/dev/null 2>&1; then healthy=1; break; fi
  if [[ $(podman inspect -f '{{.State.Running}}' "$name") != true ]]; then break; fi
  sleep 0.5
done
if [[ -z $healthy ]]; then
  podman logs "$name" >&2 || true
  say "FAILED: the container never became healthy"; exit 1
fi
say "health check passed (conveyor health inside the container)"

opts=(--dataset sparse --randomize on --seed 11 --minibatch-size 128)
if "$build/client/conveyor" subscribe "127.0.0.1:$port" "${opts[@]}" --no-reconnect > /dev/null 2> "$work/refused.txt" ||
   ! grep -q "UNAUTHENTICATED\|Bearer" "$work/refused.txt"; then
  say "FAILED: a client without the token was not refused: $(cat "$work/refused.txt")"; exit 1
fi
say "a client without the token is refused"
"$build/client/conveyor" subscribe "127.0.0.1:$port" "${opts[@]}" --token-file "$work/token" --dump > "$work/streamed.jsonl"
"$build/client/conveyor" dump "$root/examples/conveyor.yaml" "${opts[@]}" > "$work/local.jsonl"
lines=$(wc -l < "$work/streamed.jsonl")
if ! cmp -s "$work/streamed.jsonl" "$work/local.jsonl" || [[ $lines -ne 2000 ]]; then
  say "FAILED: the epoch streamed from the container ($lines lines) differs from conveyor dump"; exit 1
fi
say "streamed one epoch from the container: $lines sequences, identical to conveyor dump"

podman stop -t 30 "$name" >/dev/null 2>&1
code=$(podman inspect -f '{{.State.ExitCode}}' "$name")
podman logs "$name" 2>&1 | tail -3 | sed 's/^/  conveyord: /'
if [[ $code -ne 0 ]]; then say "FAILED: conveyord exited $code after SIGTERM"; exit 1; fi
say "SIGTERM: conveyord drained and exited 0"
say "passed"
