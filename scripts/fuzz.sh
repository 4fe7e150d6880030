#!/usr/bin/env bash
# Builds the libFuzzer harnesses with clang (ASan + UBSan) and runs each for SECONDS
# (default 20), starting from the seed corpus in tests/fuzz/corpus/. A crash fails the run
# and leaves the reproducer in build-fuzz/. The formats' harnesses need only common/; the
# client's stream reader (stream_reader_fuzzer) needs the protocol, so gRPC is configured.
# The same sanitized build first runs conveyor_kernel_tests: the CUDA kernels' own code on
# the host executor against the CPU assembler (tests/gpu/host_kernels_test.cc), so that an
# out-of-bounds index in a kernel is an ASan report here, not a silent wrong byte on a device.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-20}"
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCONVEYOR_BUILD_FUZZERS=ON -DCONVEYOR_BUILD_TESTS=ON -DCONVEYOR_BUILD_BENCHMARKS=OFF \
  -DCONVEYOR_CUDA=OFF -DCONVEYOR_BUILD_SERVICE=ON -DCONVEYOR_SANITIZE=address,undefined >/dev/null
fuzzers=(ctf_parser_fuzzer config_fuzzer cbf_fuzzer kaldi_fuzzer kaldi_spec_fuzzer htk_fuzzer stream_reader_fuzzer)
# Also the CPU assembler's own tests (hand-computed batches, empty ones included: a rank
# that owns no chunk of a minibatch gets a batch of no rows, whose null destination was
# undefined behaviour that only this build sees).
sanitized_tests=(conveyor_kernel_tests assembler_test)
cmake --build build-fuzz -j "$(nproc)" --target "${fuzzers[@]}" "${sanitized_tests[@]}"
echo "conveyor: the CUDA kernels on the host executor and the CPU assembler, under ASan and UBSan"
for t in "${sanitized_tests[@]}"; do
  start=$SECONDS
  if ! "build-fuzz/tests/$t" --gtest_brief=1 > "build-fuzz/$t.log" 2>&1; then
    grep -E -B2 -A40 'ERROR: AddressSanitizer|runtime error|\[  FAILED  \]' "build-fuzz/$t.log" | head -120
    echo "conveyor: $t failed under the sanitizers (build-fuzz/$t.log)" >&2
    exit 1
  fi
  echo "conveyor: $t: $(grep -oE '^\[  PASSED  \] [0-9]+' "build-fuzz/$t.log" | grep -oE '[0-9]+$') passed in $((SECONDS - start)) s"
done
for f in "${fuzzers[@]}"; do
  corpus="build-fuzz/corpus-$f"
  mkdir -p "$corpus"
  cp -n tests/fuzz/corpus/"$f"/* "$corpus"/ 2>/dev/null || true
  echo "conveyor: fuzzing $f for ${seconds}s"
  log="build-fuzz/$f.log"
  if (cd build-fuzz && "./tests/fuzz/$f" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 "corpus-$f" > "$f.log" 2>&1); then
    tail -n 4 "$log"
  else
    # What the fuzzer found, and the input that shows it (build-fuzz/crash-*, etc.).
    grep -v -E '^#[0-9]+\s+(NEW|REDUCE|pulse|INITED|RELOAD)' "$log" | tail -n 60
    echo "conveyor: $f failed; reproduce with: build-fuzz/tests/fuzz/$f build-fuzz/<the crash file above>" >&2
    exit 1
  fi
done
