#!/usr/bin/env bash
# Bundles the GPU tests and benchmark for a machine with a GPU but no apt (the device
# machine): build/gpu-bundle/ holds conveyor_gpu_tests, gpu_bench, the Debian shared
# libraries they need beyond CUDA and libc (abseil), and run.sh, which runs the tests (a skip
# fails there: CONVEYOR_REQUIRE_GPU=1), compute-sanitizer memcheck and racecheck on the GPU
# tests, the benchmark, the CUDA IPC transport end to end (and the CUDA assembler into shm and
# inline batches), and prints one summary of them
# all (each measured figure next to its reference and target). The golden files are read from the repository's tests/data, which
# travels with the working tree. Carry build/gpu-bundle.tar.xz (the bundle stripped and
# compressed: the working tree and what it carries must stay under 64 MiB) and run, from the
# repository root, `tar xJf build/gpu-bundle.tar.xz -C build && bash build/gpu-bundle/run.sh`.
# Every step of run.sh has a timeout, and all of them one deadline (CONVEYOR_GPU_DEADLINE_S,
# 480 s: a device command may run 600 s), so that its summary comes within one device call.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x build/tests/conveyor_gpu_tests && -x build/bench/gpu_bench ]] || {
  scripts/build.sh -DCONVEYOR_CUDA=ON >/dev/null
  cmake --build build --target conveyor_gpu_tests gpu_bench
}
cmake --build build --target conveyord conveyor transport_test >/dev/null 2>&1 || true
out=build/gpu-bundle
rm -rf "$out" && mkdir -p "$out/lib"
cp build/tests/conveyor_gpu_tests build/bench/gpu_bench "$out/"
# Shared libraries from Debian that the device image lacks (CUDA's own come from its toolkit).
for bin in "$out/conveyor_gpu_tests" "$out/gpu_bench"; do
  ldd "$bin" | awk '/=> \// {print $3}' | grep -E 'libabsl|libyaml|libgtest|libgmock|libfmt' | xargs -r -I{} cp -L {} "$out/lib/"
done
mkdir -p "$out/examples" && cp examples/*.yaml examples/*.ctf "$out/examples/"
# The daemon and the CLI with every Debian library they load (gRPC, protobuf, OpenSSL,
# libstdc++...; not libc, not CUDA's), for the CUDA IPC transport end to end on the device.
if [[ -x build/server/conveyord && -x build/client/conveyor ]]; then
  cp build/server/conveyord build/client/conveyor "$out/"
  [[ -x build/tests/transport_test ]] && cp build/tests/transport_test "$out/"  # its TransportGpu tests
  for bin in "$out/conveyord" "$out/conveyor" "$out"/transport_test; do
    [[ -x $bin ]] || continue
    ldd "$bin" | awk '/=> \// {print $3}' | grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so|/usr/local/cuda|libcuda\.so' \
      | xargs -r -I{} cp -Ln {} "$out/lib/"
  done
fi
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# On the device machine: GPU tests (a skip is a failure here: CONVEYOR_REQUIRE_GPU=1),
# compute-sanitizer (memcheck, racecheck), gpu_bench, the CUDA IPC transport end to end;
# then one summary of them all. Exits non-zero when anything failed.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export CONVEYOR_TESTDATA="${CONVEYOR_TESTDATA:-$here/../../tests/data}"
export CONVEYOR_PYTHON_CLIENT="${CONVEYOR_PYTHON_CLIENT:-$here/../../client/python}"
export CONVEYOR_REQUIRE_GPU=1
out="${OUT:-/tmp}"
rc=0
# step CAP CMD...: CMD under a timeout of CAP seconds, or less: what is left of the deadline.
# Exit status 124 when it timed out (or no time was left), as timeout(1) says.
deadline="${CONVEYOR_GPU_DEADLINE_S:-480}"
step() {
  local cap=$1 left=$(( deadline - SECONDS ))
  shift
  (( left < 5 )) && { echo "run.sh: no time left for: $*" >&2; return 124; }
  timeout -k 5 "$(( cap < left ? cap : left ))" "$@"
}
summary=()
device="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -4 | paste -sd';')"
echo "$device"
summary+=("device: $device")
step 180 "$here/conveyor_gpu_tests" >"$out/gpu_tests.log" 2>&1
tests_rc=$?
tail -25 "$out/gpu_tests.log"
passed="$(grep -oE '^\[  PASSED  \] [0-9]+' "$out/gpu_tests.log" | grep -oE '[0-9]+$' || echo 0)"
failed="$(grep -oE '^ *[0-9]+ FAILED TESTS?' "$out/gpu_tests.log" | grep -oE '^ *[0-9]+' | tr -d ' ' || true)"
skipped="$(grep -oE '^\[  SKIPPED \] [0-9]+ tests?' "$out/gpu_tests.log" | grep -oE '[0-9]+' || echo 0)"
if [[ $tests_rc == 0 ]]; then
  summary+=("GPU tests: ${passed:-0} passed, ${skipped:-0} skipped (skips allowed: a second device, python3), 0 failed")
else
  summary+=("GPU tests: FAILED ($([[ $tests_rc == 124 ]] && echo 'timed out, ')${failed:-?} failed, ${passed:-0} passed; $out/gpu_tests.log)"); rc=1
fi
# The transports' memory page-locked for the CUDA assembler (a test of the server's, which
# links gRPC: bundled with the daemon's libraries).
if [[ -x "$here/transport_test" ]] && step 60 "$here/transport_test" --gtest_filter='TransportGpu*' >"$out/transport_gpu.log" 2>&1 \
    && grep -q '^\[  PASSED  \] 1 test' "$out/transport_gpu.log"; then
  summary+=("transports' memory page-locked for --assembler cuda (inline, shm): passed")
else
  summary+=("transports' memory page-locked for --assembler cuda: FAILED ($out/transport_gpu.log)"); rc=1
fi
if step 150 "$here/gpu_bench" --json --examples "$here/examples/conveyor.yaml" >"$out/gpu_bench.log" 2>&1; then
  grep -v '^SUMMARY' "$out/gpu_bench.log"
  while IFS= read -r line; do summary+=("${line#SUMMARY }"); done < <(grep '^SUMMARY' "$out/gpu_bench.log")
else
  cat "$out/gpu_bench.log"; summary+=("gpu_bench: FAILED ($out/gpu_bench.log)"); rc=1
fi
# CUDA IPC end to end: the daemon assembles on the GPU, the CLI opens its blocks in another
# process. The dump must equal the local one; then throughput next to shared memory.
if [[ -x "$here/conveyord" ]] && "$here/conveyor" --help >/dev/null 2>&1; then
  sock="$out/ipc.sock" port="$out/ipc.port"
  rm -f "$sock" "$port"
  "$here/conveyord" "$here/examples/conveyor.yaml" --listen 127.0.0.1:0 --port-file "$port" --unix "$sock" \
    --assembler cuda 2>"$out/conveyord.log" &
  daemon=$!
  for _ in $(seq 100); do [[ -s "$port" ]] && break; sleep 0.1; done
  args=(--dataset sequences --minibatch-size 30 --randomize on --seed 2)
  step 60 "$here/conveyor" dump "$here/examples/conveyor.yaml" "${args[@]}" >"$out/ipc_local.txt"
  step 60 "$here/conveyor" subscribe "unix:$sock" --dump --transport cuda "${args[@]}" >"$out/ipc_cuda.txt" 2>"$out/ipc_cuda.err"
  if cmp -s "$out/ipc_local.txt" "$out/ipc_cuda.txt" && [[ -s "$out/ipc_local.txt" ]]; then
    summary+=("CUDA IPC end to end: subscribe --dump equals the local dump ($(wc -l <"$out/ipc_local.txt") lines)")
  else
    summary+=("CUDA IPC end to end: FAILED (dump differs or errored; $out/ipc_cuda.err)"); rc=1
    tail -5 "$out/ipc_cuda.err"
  fi
  # The same daemon's CUDA assembler into host memory: shm segments and inline buffers are
  # page-locked and copied into asynchronously; the dumps must equal the local one too, and
  # no page-locking may have failed (the daemon warns once per stream when it does).
  for transport in shm inline; do
    step 60 "$here/conveyor" subscribe "unix:$sock" --dump --transport "$transport" "${args[@]}" >"$out/host_$transport.txt" \
      2>"$out/host_$transport.err"
    if cmp -s "$out/ipc_local.txt" "$out/host_$transport.txt"; then
      summary+=("--assembler cuda into $transport: subscribe --dump equals the local dump")
    else
      summary+=("--assembler cuda into $transport: FAILED (dump differs or errored; $out/host_$transport.err)"); rc=1
    fi
  done
  for transport in cuda shm inline; do
    echo "bench sparse, transport $transport:"
    step 60 "$here/conveyor" bench "unix:$sock" --dataset sparse --transport "$transport" --epochs 200 --minibatch-size 2000 \
      --credits 8 2>&1 | tee "$out/bench_$transport.txt"
    figure="$(grep -m1 -E 'batches/s' "$out/bench_$transport.txt" | sed 's/^ *//')"
    [[ -n $figure ]] || rc=1
    summary+=("conveyor bench sparse over $transport: ${figure:-FAILED ($out/bench_$transport.txt)}")
  done
  # After the benches too (more segments and buffers): any page-locking refused is logged
  # once per stream, and the daemon must have served with the CUDA assembler at all.
  pinned_fallback="through a pinned buffer of the assembler's"
  if grep -q "$pinned_fallback" "$out/conveyord.log"; then
    summary+=("page-locking shm/inline memory: FAILED ($(grep -m1 "$pinned_fallback" "$out/conveyord.log"))"); rc=1
  elif ! grep -q "assembler: cuda" "$out/conveyord.log"; then
    summary+=("page-locking shm/inline memory: FAILED (the daemon did not serve with the CUDA assembler: $(head -1 "$out/conveyord.log"))"); rc=1
  else
    summary+=("page-locking shm/inline memory: every segment and buffer locked (batches copied back by DMA)")
  fi
  kill "$daemon"
  for _ in $(seq 150); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$daemon" 2>/dev/null && summary+=("conveyord did not stop within 15 s of SIGTERM: killed") && rc=1
  wait "$daemon" 2>/dev/null
else
  summary+=("CUDA IPC end to end: FAILED (the bundled conveyord/conveyor do not start here)"); rc=1
  "$here/conveyor" --help 2>&1 | head -3
fi
# Last, being the slowest (each step has a timeout, so the summary always comes).
# The child halves spawned by the IPC and Python tests are left out: they are processes of their own.
filter='*Gpu*:AssemblerEquivalence/1*:AssemblerEquivalence/2*-*ChildHalf:*PythonClient*'
for tool in memcheck racecheck; do
  if step 150 compute-sanitizer --tool "$tool" --error-exitcode 3 "$here/conveyor_gpu_tests" --gtest_filter="$filter" \
      >"$out/sanitizer_$tool.log" 2>&1; then
    summary+=("compute-sanitizer $tool: clean ($(grep -oE '^\[  PASSED  \] [0-9]+ tests' "$out/sanitizer_$tool.log"))")
  else
    summary+=("compute-sanitizer $tool: FAILED ($out/sanitizer_$tool.log)"); rc=1
    tail -30 "$out/sanitizer_$tool.log"
  fi
done
echo
echo "==== conveyor GPU summary ($(date -u +%Y-%m-%dT%H:%MZ)) ===="
printf '  %s\n' "${summary[@]}"
echo "==== $([[ $rc == 0 ]] && echo 'all passed' || echo 'FAILED') ===="
exit $rc
RUN
chmod +x "$out/run.sh"
# The device's working tree travels with a 64 MiB limit (tests/data alone is ~55 MB): the
# bundle travels stripped and compressed (~9 MB). On the device machine:
#   tar xJf build/gpu-bundle.tar.xz -C build && bash build/gpu-bundle/run.sh
# (conveyor_gpu_tests keeps its symbols: compute-sanitizer's host backtraces name them.)
strip --strip-unneeded "$out"/lib/* "$out"/gpu_bench \
  "$out"/conveyord "$out"/conveyor "$out"/transport_test 2>/dev/null || true
tar -C build -cJf build/gpu-bundle.tar.xz gpu-bundle
du -sh "$out" build/gpu-bundle.tar.xz
