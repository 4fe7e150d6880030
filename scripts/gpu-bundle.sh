#!/usr/bin/env bash
# Bundles the GPU tests and benchmark for a machine with a GPU but no apt (the device
# machine): build/gpu-bundle/ holds conveyor_gpu_tests, gpu_bench, the Debian shared
# libraries they need beyond CUDA and libc (abseil), and run.sh, which runs the tests, compute-sanitizer memcheck and racecheck on the GPU tests,
# and the benchmark. The golden files are read from the repository's tests/data, which
# travels with the working tree. Carry build/gpu-bundle and run `bash build/gpu-bundle/run.sh`
# from the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x build/tests/conveyor_gpu_tests && -x build/bench/gpu_bench ]] || {
  scripts/build.sh -DCONVEYOR_CUDA=ON >/dev/null
  cmake --build build --target conveyor_gpu_tests gpu_bench
}
cmake --build build --target conveyord conveyor >/dev/null 2>&1 || true
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
  for bin in "$out/conveyord" "$out/conveyor"; do
    ldd "$bin" | awk '/=> \// {print $3}' | grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so|/usr/local/cuda|libcuda\.so' \
      | xargs -r -I{} cp -Ln {} "$out/lib/"
  done
fi
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# On the device machine: GPU tests, compute-sanitizer (memcheck, racecheck), gpu_bench.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export CONVEYOR_TESTDATA="${CONVEYOR_TESTDATA:-$here/../../tests/data}"
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
rc=0
"$here/conveyor_gpu_tests" 2>&1 | tee "$out/gpu_tests.log" | tail -25 || rc=1
[[ ${PIPESTATUS[0]} == 0 ]] || rc=1
for tool in memcheck racecheck; do
  compute-sanitizer --tool "$tool" --error-exitcode 3 "$here/conveyor_gpu_tests" --gtest_filter='*Gpu*:AssemblerEquivalence/1*' \
    >"$out/sanitizer_$tool.log" 2>&1 && echo "compute-sanitizer $tool: clean" || { echo "compute-sanitizer $tool: FAILED"; tail -30 "$out/sanitizer_$tool.log"; rc=1; }
done
"$here/gpu_bench" --json --examples "$here/examples/conveyor.yaml" 2>&1 | tee "$out/gpu_bench.log"
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
  "$here/conveyor" dump "$here/examples/conveyor.yaml" "${args[@]}" >"$out/ipc_local.txt"
  "$here/conveyor" subscribe "unix:$sock" --dump --transport cuda "${args[@]}" >"$out/ipc_cuda.txt" 2>"$out/ipc_cuda.err"
  if cmp -s "$out/ipc_local.txt" "$out/ipc_cuda.txt" && [[ -s "$out/ipc_local.txt" ]]; then
    echo "CUDA IPC: subscribe --dump equals the local dump ($(wc -l <"$out/ipc_local.txt") lines)"
  else
    echo "CUDA IPC: FAILED (dump differs or errored)"; tail -5 "$out/ipc_cuda.err"; rc=1
  fi
  for transport in cuda shm; do
    echo "bench sparse, transport $transport:"
    "$here/conveyor" bench "unix:$sock" --dataset sparse --transport "$transport" --epochs 200 --minibatch-size 2000 --credits 8
  done
  kill "$daemon"; wait "$daemon" 2>/dev/null
else
  echo "CUDA IPC end to end skipped: the bundled conveyord/conveyor do not start here"
  "$here/conveyor" --help 2>&1 | head -3
fi
exit $rc
RUN
chmod +x "$out/run.sh"
du -sh "$out"
