#!/usr/bin/env bash
# Bundles the GPU tests and benchmark for a machine with a GPU but no apt (the device
# machine): build/gpu-bundle/ holds conveyor_gpu_tests, gpu_bench, the Debian shared
# libraries they need beyond CUDA and libc (abseil), the Kaldi CM archives of testdata, and
# run.sh, which runs the tests, compute-sanitizer memcheck and racecheck on the GPU tests,
# and the benchmark. Carry build/gpu-bundle and run `bash build/gpu-bundle/run.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x build/tests/conveyor_gpu_tests && -x build/bench/gpu_bench ]] || {
  scripts/build.sh -DCONVEYOR_CUDA=ON >/dev/null
  cmake --build build --target conveyor_gpu_tests gpu_bench
}
out=build/gpu-bundle
rm -rf "$out" && mkdir -p "$out/lib" "$out/testdata/kaldi"
cp build/tests/conveyor_gpu_tests build/bench/gpu_bench "$out/"
# Shared libraries from Debian that the device image lacks (CUDA's own come from its toolkit).
for bin in "$out/conveyor_gpu_tests" "$out/gpu_bench"; do
  ldd "$bin" | awk '/=> \// {print $3}' | grep -E 'libabsl|libyaml|libgtest|libgmock|libfmt' | xargs -r -I{} cp -L {} "$out/lib/"
done
cp ../shared/testdata/kaldi/cm*.ark "$out/testdata/kaldi/"
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# On the device machine: GPU tests, compute-sanitizer (memcheck, racecheck), gpu_bench.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH="$here/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export CONVEYOR_TESTDATA="$here/testdata"
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
rc=0
"$here/conveyor_gpu_tests" 2>&1 | tee "$out/gpu_tests.log" | tail -25 || rc=1
[[ ${PIPESTATUS[0]} == 0 ]] || rc=1
for tool in memcheck racecheck; do
  compute-sanitizer --tool "$tool" --error-exitcode 3 "$here/conveyor_gpu_tests" --gtest_filter='*Gpu*:AssemblerEquivalence/1*' \
    >"$out/sanitizer_$tool.log" 2>&1 && echo "compute-sanitizer $tool: clean" || { echo "compute-sanitizer $tool: FAILED"; tail -30 "$out/sanitizer_$tool.log"; rc=1; }
done
"$here/gpu_bench" --json 2>&1 | tee "$out/gpu_bench.log"
exit $rc
RUN
chmod +x "$out/run.sh"
du -sh "$out"
