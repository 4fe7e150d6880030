// conveyor: the command-line client. See `conveyor --help`.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "absl/synchronization/mutex.h"
#include "client/cli/commands.h"
#include "common/cli/command_line.h"
#include "common/malloc_tuning.h"
#include "common/version.h"
#include "cuda/cuda_backend.h"

int main(int argc, char** argv) {
  conveyor::TuneAllocatorForStreaming();
  // Debian's abseil is built without NDEBUG, so every absl::Mutex lock would also update a
  // lock-order graph (1-2% of a stream's CPU in profiles). The tests keep the detection on.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // gRPC logs a failed TLS handshake or connection as raw lines on stderr ("E1130 ...
  // ssl_transport_security.cc ... Handshake failed"), next to the one line the command prints
  // from the call's status with what to do. Quiet unless the user asks (GRPC_VERBOSITY set).
  ::setenv("GRPC_VERBOSITY", "NONE", /*overwrite=*/0);
  CLI::App app{
      "conveyor: a data loader for training. It indexes datasets in CNTK text or binary format, "
      "HTK features with MLF labels and Kaldi tables (alone or joined by key), randomizes them as "
      "CNTK does (reproducibly, resumably, split across ranks), parses them in parallel and "
      "assembles dense and sparse (CSC, CSR) minibatches, on the CPU or the GPU.\n"
      "A configuration (YAML, JSON, or a CNTK BrainScript reader block) names the datasets.\n"
      "Exit status: 0 success, 1 a failure (bad data, an unreachable daemon), 2 a usage error.\n"
      "Examples:\n"
      "  conveyor inspect examples/conveyor.yaml\n"
      "  conveyor dump examples/conveyor.yaml --dataset simple --randomize off --minibatch-size 4\n"
      "  conveyor dump examples/conveyor.yaml --dataset sparse --randomize on --rank 0 --world 2\n"
      "  conveyor bench examples/conveyor.yaml --dataset sparse --threads 2 --json",
      "conveyor"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("conveyor ") + CONVEYOR_VERSION +
                                        (conveyor::CudaBuilt() ? " (CUDA assembler built in)" : " (built without CUDA)"));
  int exit_code = 0;
  conveyor::cli::RegisterInspect(app, &exit_code);
  conveyor::cli::RegisterIndex(app, &exit_code);
  conveyor::cli::RegisterDump(app, &exit_code);
  conveyor::cli::RegisterBench(app, &exit_code);
  conveyor::cli::RegisterConvert(app, &exit_code);
#ifdef CONVEYOR_HAVE_SERVICE
  conveyor::cli::RegisterSubscribe(app, &exit_code);
  conveyor::cli::RegisterHealth(app, &exit_code);
  conveyor::cli::RegisterDatasets(app, &exit_code);
#endif
  try {
    if (auto done = conveyor::cli::ParseCommandLine(app, argc, argv)) return *done;
  } catch (const std::exception& e) {
    // A command's own errors are statuses; this is the last guard against a library that
    // throws, so that no input ends the program by a signal.
    std::fprintf(stderr, "conveyor: internal error: %s\n", e.what());
    return conveyor::cli::kExitFailure;
  }
  return exit_code;
}
