#!/usr/bin/env bash
# tests/install/test_install.sh BUILD_DIR: what a user gets from `cmake --install`, tried as
# a user would, outside the source tree:
#   - the layout (binaries, client library, headers, CMake package, examples), with no path
#     of the build or source tree left in the CMake package;
#   - the installed conveyord (serving its installed examples) and conveyor --version;
#   - a consumer project (tests/install/consumer, copied elsewhere) built with
#     find_package(conveyor) against the prefix, streaming one epoch from that daemon;
#   - the Python package pip-installed into a fresh virtual environment (with the system's
#     site packages for Debian's grpcio/numpy/torch; no registry) and a test run from outside
#     the tree against the same daemon.
set -euo pipefail
build=$(cd "${1:?usage: test_install.sh BUILD_DIR}" && pwd)
source=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/conveyor-install.XXXXXX")
daemon=""
cleanup() {
  [[ -n $daemon ]] && kill -9 "$daemon" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
say() { echo "install-test: $*"; }
fail() { echo "install-test: FAILED: $*" >&2; exit 1; }
version=$(head -1 "$source/VERSION")
prefix=$work/prefix

say "cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
for f in bin/conveyord bin/conveyor lib/libconveyor_client.so "lib/libconveyor_client.so.$version" \
         include/conveyor/client/cpp/conveyor_client.h include/conveyor/conveyor/v1/conveyor.pb.h \
         include/conveyor/common/batch/batch_plan.h lib/cmake/conveyor/conveyorConfig.cmake \
         lib/cmake/conveyor/conveyorConfigVersion.cmake lib/cmake/conveyor/conveyorTargets.cmake \
         share/conveyor/examples/conveyor.yaml share/conveyor/examples/simple.ctf share/doc/conveyor/design.md; do
  [[ -e $prefix/$f ]] || fail "$f is not installed"
done
[[ ! -e $prefix/include/conveyor/common/chunk/parsed_chunk.h ]] || fail "reader headers installed"
if grep -rlF -e "$source" -e "$build" "$prefix/lib/cmake" >/dev/null; then
  fail "the CMake package names the source or build tree: $(grep -rlF -e "$source" -e "$build" "$prefix/lib/cmake")"
fi
[[ $("$prefix/bin/conveyord" --version) == "conveyord $version "* ]] || fail "conveyord --version: $("$prefix/bin/conveyord" --version)"
[[ $("$prefix/bin/conveyor" --version) == "conveyor $version "* ]] || fail "conveyor --version"

say "starting the installed conveyord (no config: its installed examples)"
"$prefix/bin/conveyord" --listen 127.0.0.1:0 --port-file "$work/port" --unix "$work/d.sock" 2>"$work/daemon.log" &
daemon=$!
for _ in $(seq 200); do [[ -s $work/port ]] && break; sleep 0.05; done
[[ -s $work/port ]] || fail "conveyord did not start: $(cat "$work/daemon.log")"
grep -q "serving sequences, simple, sparse" "$work/daemon.log" || fail "not the installed examples: $(cat "$work/daemon.log")"
address=127.0.0.1:$(cat "$work/port")
"$prefix/bin/conveyor" health "$work/d.sock" >/dev/null || fail "conveyor health on the unix socket"

say "building a consumer project against $prefix"
cp -r "$source/tests/install/consumer" "$work/consumer"
cmake -S "$work/consumer" -B "$work/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/consumer/build" -j "$(nproc)" >/dev/null
out=$("$work/consumer/build/consumer" "$address" simple)
# examples/simple.ctf: 1000 sequences of one sample, the first feature value 1.75919998.
[[ $out == "rows 1000 batches 16 first 1.75919998" ]] || fail "consumer printed: $out"
say "consumer: $out"

say "pip install into a fresh virtual environment"
mkdir -p "$work/src/client"
cp -r "$source/VERSION" "$source/proto" "$work/src/"
cp -r "$source/client/python" "$work/src/client/python"
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --quiet --no-build-isolation --no-index "$work/src/client/python"
cp "$source/tests/install/test_installed_package.py" "$work/"
(cd "$work" && CONVEYOR_ADDRESS=$address CONVEYOR_VERSION=$version CONVEYOR_PREFIX=$prefix \
  "$work/venv/bin/python" -I test_installed_package.py -v 2>&1) || fail "the installed Python package"

kill -TERM "$daemon"
wait "$daemon" || fail "conveyord did not drain and exit 0"
daemon=""
say "passed"
