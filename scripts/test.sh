#!/usr/bin/env bash
# Every test: install, build, run the unit and integration tests (ctest; they include
# `cmake --install` with a consumer project and a pip-installed Python package), then, in the
# sanitized clang build (build-fuzz/), the CUDA kernels' code on the host executor under ASan
# and UBSan and each libFuzzer harness for a short time, the Debian package in a clean root
# and the container. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" --timeout 300 -E '^python_torch$'
# python_torch (about 90 forked DataLoader workers) runs alone, after the rest: its workers'
# timing is what it checks, and a loaded machine only slows it. Workers used to hang in
# gRPC's own fork handler (2 of 4 suite runs, 2026-11-27) until conveyor kept that handler
# from running Python in the child (README, "Forking", 2026-11-28); a timed-out run (90 s;
# a run takes 30-60 s) is still tried once more, said out loud, in case a hang of another
# kind is left. A failure of any other kind is not.
torch_log="$(mktemp)"
if ! ctest --test-dir build --output-on-failure -R '^python_torch$' 2>&1 | tee "$torch_log"; then
  if grep -q 'python_torch .*\*\*\*Timeout' "$torch_log"; then
    echo "conveyor: python_torch timed out (a DataLoader worker stuck? README, Forking); running it once more" >&2
    ctest --test-dir build --output-on-failure -R '^python_torch$'
  else
    rm -f "$torch_log"
    exit 1
  fi
fi
rm -f "$torch_log"
scripts/fuzz.sh "${CONVEYOR_FUZZ_SECONDS:-12}"
# The Debian package installed into a clean Debian 12 root (debootstrap; needs root and the
# Debian mirror); set CONVEYOR_DEB_TEST=0 to leave it out.
if [[ ${CONVEYOR_DEB_TEST:-1} != 0 ]]; then bash deploy/deb-test.sh build; fi
# The container, end to end with podman (installed from Debian if missing); set
# CONVEYOR_CONTAINER_TEST=0 to leave it out.
if [[ ${CONVEYOR_CONTAINER_TEST:-1} != 0 ]]; then bash deploy/smoke-test.sh; fi
echo "conveyor: all tests passed"
