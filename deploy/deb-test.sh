#!/usr/bin/env bash
# deploy/deb-test.sh [BUILD_DIR]: the Debian packages as an ops engineer meets them. Builds
# conveyor_VERSION_amd64.deb and conveyor-dev with CPack, checks what they hold, then installs
# conveyor into a clean Debian 12 root (debootstrap --variant=minbase; apt resolves the
# dependencies dpkg-shlibdeps declared) and there runs conveyord --version, starts the daemon
# on the installed examples and on /etc/conveyor/conveyor.yaml, and asks `conveyor health`.
# Needs root and Debian's mirror (as scripts/install-deps.sh does).
set -euo pipefail
root_dir=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root_dir/build}" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/conveyor-deb.XXXXXX")
chroot_dir=$work/root
say() { echo "deb-test: $*"; }
fail() { echo "deb-test: FAILED: $*" >&2; exit 1; }
mounted=()
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for m in "${mounted[@]}"; do umount -l "$m" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
[[ $(id -u) -eq 0 ]] || { say "SKIPPED: needs root (debootstrap, chroot)"; exit 0; }
version=$(head -1 "$root_dir/VERSION")
if ! command -v debootstrap >/dev/null; then
  say "installing debootstrap (Debian)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

say "cpack -G DEB in $build"
(cd "$build" && cpack -G DEB -B "$work/pkgs" >/dev/null)
deb=$work/pkgs/conveyor_${version}_amd64.deb
dev=$work/pkgs/conveyor-dev_${version}_amd64.deb
[[ -f $deb && -f $dev ]] || fail "expected $(basename "$deb") and $(basename "$dev"), got: $(ls "$work/pkgs")"
contents=$(dpkg-deb -c "$deb" | awk '{print $6}')
for f in ./usr/bin/conveyord ./usr/bin/conveyor ./usr/lib/systemd/system/conveyord.service ./etc/conveyor/conveyor.yaml \
         ./usr/share/conveyor/examples/conveyor.yaml "./usr/lib/libconveyor_client.so.$version"; do
  grep -qx -- "$f" <<<"$contents" || fail "$(basename "$deb") lacks $f"
done
dpkg-deb -f "$deb" Depends | grep -q libgrpc++ || fail "no gRPC dependency declared: $(dpkg-deb -f "$deb" Depends)"
dev_contents=$(dpkg-deb -c "$dev" | awk '{print $6}')
for f in ./usr/include/conveyor/client/cpp/conveyor_client.h ./usr/lib/cmake/conveyor/conveyorConfig.cmake ./usr/lib/libconveyor_client.so; do
  grep -qx -- "$f" <<<"$dev_contents" || fail "$(basename "$dev") lacks $f"
done

say "debootstrap a clean Debian 12 root"
debootstrap --variant=minbase bookworm "$chroot_dir" http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 ||
  fail "debootstrap: $(tail -3 "$work/debootstrap.log")"
cp /etc/resolv.conf "$chroot_dir/etc/resolv.conf"
for m in proc dev; do
  mount --bind "/$m" "$chroot_dir/$m"
  mounted+=("$chroot_dir/$m")
done
cp "$deb" "$chroot_dir/tmp/"
say "apt-get install ./$(basename "$deb") in it"
chroot "$chroot_dir" apt-get update -qq >/dev/null
chroot "$chroot_dir" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "/tmp/$(basename "$deb")" >"$work/apt.log" 2>&1 || fail "apt-get install: $(tail -5 "$work/apt.log")"
got=$(chroot "$chroot_dir" conveyord --version) || fail "conveyord --version"
[[ $got == "conveyord $version "* ]] || fail "conveyord --version printed: $got"
say "$got"

serve() {  # serve NAME ARGS...: starts conveyord in the root, checks health on its socket, stops it
  local name=$1
  shift
  rm -f "$chroot_dir/tmp/$name.port"
  chroot "$chroot_dir" /usr/bin/conveyord "$@" --listen 127.0.0.1:0 --port-file "/tmp/$name.port" \
    --unix "/tmp/$name.sock" 2>"$work/$name.log" &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 200); do [[ -s $chroot_dir/tmp/$name.port ]] && break; sleep 0.05; done
  [[ -s $chroot_dir/tmp/$name.port ]] || fail "$name: conveyord did not start: $(cat "$work/$name.log")"
  chroot "$chroot_dir" /usr/bin/conveyor health "/tmp/$name.sock" || fail "$name: health"
  kill -TERM "$pid"
  wait "$pid" || fail "$name: conveyord did not drain and exit 0: $(cat "$work/$name.log")"
}
serve examples
serve etc /etc/conveyor/conveyor.yaml
say "passed"
