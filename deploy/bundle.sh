#!/usr/bin/env bash
# bundle.sh BUILD_DIR OUT_DIR [--rootfs]
#
# Lays out conveyord, the conveyor CLI, the bundled examples and the shared libraries they
# need under OUT_DIR, ready to be copied into a container image:
#   OUT_DIR/opt/conveyor/bin/{conveyord,conveyor}
#   OUT_DIR/opt/conveyor/lib/*.so*          (gRPC, protobuf, abseil, yaml-cpp, ...)
#   OUT_DIR/opt/conveyor/share/examples/    (the default configuration and datasets)
#   OUT_DIR/var/lib/conveyor/                   (the unix socket's directory)
# The C and C++ runtimes (glibc, libstdc++, libgcc_s) are left to the base image, which
# must be at least Debian 12 / Ubuntu 22.04 (glibc 2.36). With --rootfs the bundle is a
# whole root file system instead (every library at its own path, glibc included, plus
# /etc/passwd for the conveyor user), for `FROM scratch` images.
set -euo pipefail
build=${1:?usage: bundle.sh BUILD_DIR OUT_DIR [--rootfs]}
out=${2:?usage: bundle.sh BUILD_DIR OUT_DIR [--rootfs]}
rootfs=${3:-}
here=$(cd "$(dirname "$0")/.." && pwd)
bins=("$build/server/conveyord" "$build/client/conveyor")
for b in "${bins[@]}"; do
  [[ -x $b ]] || { echo "bundle.sh: $b is missing: build first (bash scripts/build.sh)" >&2; exit 1; }
done
rm -rf "$out"
mkdir -p "$out/opt/conveyor/bin" "$out/opt/conveyor/lib" "$out/opt/conveyor/share" "$out/var/lib/conveyor"
cp "${bins[@]}" "$out/opt/conveyor/bin/"
strip --strip-unneeded "$out/opt/conveyor/bin/"* 2>/dev/null || true
cp -r "$here/examples" "$out/opt/conveyor/share/examples"
# Every shared library the binaries load, resolved by the dynamic loader of this machine.
libs=$(ldd "${bins[@]}" | awk '/=> \// {print $3} /^\t\/.*ld-linux/ {print $1}' | sort -u)
for lib in $libs; do
  name=$(basename "$lib")
  if [[ $rootfs == --rootfs ]]; then
    mkdir -p "$out$(dirname "$lib")"
    cp -L "$lib" "$out$lib"
    continue
  fi
  case $name in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|ld-linux*|libstdc++.so.*|libgcc_s.so.*) ;;
    *) cp -L "$lib" "$out/opt/conveyor/lib/$name" ;;
  esac
done
if [[ $rootfs == --rootfs ]]; then
  # The loader's default path holds them already; /lib64 for the interpreter path.
  mkdir -p "$out/etc" "$out/tmp"
  chmod 1777 "$out/tmp"
  echo "root:x:0:0:root:/:/sbin/nologin" > "$out/etc/passwd"
  echo "conveyor:x:10001:10001:conveyor:/:/sbin/nologin" >> "$out/etc/passwd"
  printf 'root:x:0:\nconveyor:x:10001:\n' > "$out/etc/group"
  if [[ -d /lib64 && ! -e $out/lib64 ]]; then mkdir -p "$out/lib64"; fi
  ld=$(ldd "${bins[0]}" | awk '/ld-linux/ {print $1}')
  [[ -e $out/lib64/$(basename "$ld") ]] || cp -L "$ld" "$out/lib64/"
fi
echo "bundle.sh: $(du -sh "$out" | cut -f1) in $out"
