#!/usr/bin/env bash
# bundle.sh PREFIX OUT_DIR [--rootfs]
#
# Lays out an installed conveyor (PREFIX: what `cmake --install build --prefix PREFIX
# --component runtime` wrote) with the shared libraries it needs under OUT_DIR, ready to be
# copied into a container image:
#   OUT_DIR/opt/conveyor/bin/{conveyord,conveyor}
#   OUT_DIR/opt/conveyor/lib/*.so*          (libconveyor_client, gRPC, protobuf, abseil, ...)
#   OUT_DIR/opt/conveyor/share/conveyor/examples/   (conveyord's default configuration)
#   OUT_DIR/var/lib/conveyor/               (the unix socket's directory)
# The C and C++ runtimes (glibc, libstdc++, libgcc_s) are left to the base image, which
# must be at least Debian 12 / Ubuntu 22.04 (glibc 2.36). With --rootfs the bundle is a
# whole root file system instead (every library at its own path, glibc included, plus
# /etc/passwd for the conveyor user), for `FROM scratch` images.
set -euo pipefail
prefix=${1:?usage: bundle.sh PREFIX OUT_DIR [--rootfs]}
out=${2:?usage: bundle.sh PREFIX OUT_DIR [--rootfs]}
rootfs=${3:-}
bins=("$prefix/bin/conveyord" "$prefix/bin/conveyor")
for b in "${bins[@]}"; do
  [[ -x $b ]] || { echo "bundle.sh: $b is missing: install first (cmake --install build --prefix $prefix --component runtime)" >&2; exit 1; }
done
rm -rf "$out"
mkdir -p "$out/opt/conveyor/bin" "$out/opt/conveyor/lib" "$out/opt/conveyor/share" "$out/var/lib/conveyor"
cp "${bins[@]}" "$out/opt/conveyor/bin/"
strip --strip-unneeded "$out/opt/conveyor/bin/"* 2>/dev/null || true
cp -r "$prefix/share/conveyor" "$out/opt/conveyor/share/conveyor"
cp -P "$prefix"/lib/libconveyor_client.so.* "$out/opt/conveyor/lib/" 2>/dev/null || true
# Every shared library the binaries load, resolved by the dynamic loader of this machine.
if missing=$(ldd "${bins[@]}" | grep "not found"); then
  echo "bundle.sh: libraries the binaries need cannot be found here:" >&2
  echo "$missing" >&2
  exit 1
fi
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
