#include "client/cli/common_options.h"

#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/cli/progress.h"
#include "common/batch/dump_writer.h"
#include "common/cli/command_line.h"
#include "common/config/config_loader.h"
#include "cuda/cuda_backend.h"

namespace conveyor::cli {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "conveyor: %s\n", std::string(status.message()).c_str());
  return kExitFailure;
}

CLI::Validator DaemonAddress(bool allow_path, bool allow_list) {
  return CLI::Validator(
      [allow_path, allow_list](std::string& value) -> std::string {
        if (!allow_list && value.find(',') != std::string::npos) return "one daemon address, not a list";
        size_t from = 0;
        while (from <= value.size()) {
          const size_t comma = value.find(',', from);
          const std::string part = value.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
          from = comma == std::string::npos ? value.size() + 1 : comma + 1;
          if (part.empty()) return "an empty address (a stray comma?)";
          bool scheme = false;
          for (const char* s : {"unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:"}) scheme = scheme || part.rfind(s, 0) == 0;
          if (scheme || (allow_path && (part[0] == '/' || part.rfind("./", 0) == 0 || part.rfind("../", 0) == 0))) continue;
          const size_t colon = part.rfind(':');
          const size_t bracket = part.rfind(']');
          const bool has_port = colon != std::string::npos && (bracket == std::string::npos || colon > bracket) &&
                                colon + 1 < part.size() &&
                                part.find_first_not_of("0123456789", colon + 1) == std::string::npos;
          if (!has_port) {
            if (allow_path && colon == std::string::npos && ::access(part.c_str(), F_OK) == 0) {
              return "'" + part + "' is a file here, not host:port: write ./" + part + " (or unix:" + part + ")";
            }
            const std::string host = colon != std::string::npos && colon + 1 == part.size() ? part.substr(0, colon) : part;
            return "'" + part + "' has no port: write host:port (e.g. " + host + ":7070), unix:/path" +
                   (allow_path ? " or a socket's path" : "");
          }
        }
        return std::string();
      },
      "ADDR");
}

int FailUsage(const std::string& command, const absl::Status& status) {
  std::fprintf(stderr, "conveyor %s: %s; see 'conveyor %s --help'\n", command.c_str(),
               std::string(status.message()).c_str(), command.c_str());
  return kExitUsage;
}

absl::StatusOr<Config> LoadConfig(const std::string& path) {
  auto config = LoadConfigFile(path);
  if (config.ok()) {
    for (const auto& w : config->warnings) std::fprintf(stderr, "WARNING: %s\n", w.c_str());
  }
  return config;
}

absl::StatusOr<DatasetConfig> ChooseDataset(const Config& config, const std::string& name) {
  if (name.empty()) {
    if (config.datasets.size() == 1) return config.datasets[0];
    return absl::InvalidArgumentError(absl::StrCat(config.source, " defines several datasets (",
                                                   config.DatasetNames(), "): choose one with --dataset"));
  }
  const DatasetConfig* d = config.Find(name);
  if (d == nullptr) {
    return absl::NotFoundError(absl::StrCat(config.source, " has no dataset '", name,
                                            "' (it defines: ", config.DatasetNames(), ")"));
  }
  return *d;
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenWithProgress(const DatasetConfig& config, int threads,
                                                          bool compressed_in_place, bool reads_frames) {
  std::string label = "indexing";
  if (!config.deserializers.empty()) {
    const std::string& f = config.deserializers[0].file;
    label = absl::StrCat("indexing ", f.substr(f.rfind('/') == std::string::npos ? 0 : f.rfind('/') + 1));
  }
  ProgressBar bar(label);
  DatasetOpenOptions options;
  options.index_threads = threads;
  options.compressed_in_place = compressed_in_place;
  options.reads_frames = reads_frames;
  options.progress = [&bar](uint64_t done, uint64_t total) { bar.Update(done, total); };
  auto ds = Dataset::Open(config, options);
  bar.Finish();
  return ds;
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  AppendJsonStringBody(s, &out);
  return out;
}

absl::StatusOr<bool> ParseOnOff(const std::string& flag, const std::string& value) {
  const std::string v = absl::AsciiStrToLower(value);
  if (v == "on" || v == "true" || v == "yes" || v == "1") return true;
  if (v == "off" || v == "false" || v == "no" || v == "0") return false;
  return absl::InvalidArgumentError(absl::StrCat(flag, " expects on or off, got '", value, "'"));
}

absl::StatusOr<StreamRequest> StreamArgs::ToRequest() const {
  StreamRequest r;
  if (!randomize.empty()) {
    auto on = ParseOnOff("--randomize", randomize);
    if (!on.ok()) return on.status();
    r.randomize = *on;
  }
  r.seed = seed;
  r.minibatch_size = minibatch_size;
  r.epochs = epochs;
  r.epoch_size = epoch_size;
  r.rank = rank;
  r.world = world;
  if (frame_mode) r.frame_mode = true;
  if (minibatch_mode == "full") r.full_minibatches = true;
  else if (minibatch_mode == "partial") r.full_minibatches = false;
  else if (!minibatch_mode.empty()) return absl::InvalidArgumentError("--minibatch-mode expects partial or full");
  r.truncation = truncation;
  r.parallel = parallel;
  if (parallel > 0 && truncation == 0) return absl::InvalidArgumentError("--parallel needs --truncation");
  r.resume = resume;
  r.threads = threads;
  for (const std::string& l : layouts) {
    const size_t eq = l.find('=');
    const std::string kind = eq == std::string::npos ? "" : absl::AsciiStrToLower(l.substr(eq + 1));
    OutputLayout layout;
    if (kind == "csc" || kind == "native") layout = OutputLayout::kCsc;
    else if (kind == "csr") layout = OutputLayout::kCsr;
    else if (kind == "dense") layout = OutputLayout::kDense;
    else return absl::InvalidArgumentError(absl::StrCat("--layout expects STREAM=csc|csr|dense, got '", l, "'"));
    r.layouts[l.substr(0, eq)] = layout;
  }
  for (const std::string& d : dtypes) {
    const size_t eq = d.find('=');
    const std::string kind = eq == std::string::npos ? "" : absl::AsciiStrToLower(d.substr(eq + 1));
    if (kind == "float16") r.value_dtypes[d.substr(0, eq)] = DType::kFloat16;
    else if (kind == "bfloat16") r.value_dtypes[d.substr(0, eq)] = DType::kBFloat16;
    else return absl::InvalidArgumentError(absl::StrCat("--dtype expects STREAM=float16|bfloat16, got '", d, "'"));
  }
  if (distribution == "balanced") r.distribution = Distribution::kBalanced;
  else if (distribution == "chunks") r.distribution = Distribution::kChunks;
  else if (!distribution.empty()) return absl::InvalidArgumentError("--distribution expects balanced or chunks");
  r.first_epoch = first_epoch;
  r.batch_stride = batch_stride;
  r.batch_offset = batch_offset;
  // What the command line alone decides (a resume cursor may carry the rank and world).
  if (rank && world && *rank >= *world) {
    return absl::InvalidArgumentError(absl::StrCat("--rank ", *rank, " must be below --world ", *world,
                                                   " (ranks count from 0)"));
  }
  if (rank && *rank > 0 && !world && resume.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--rank ", *rank, " needs --world (the number of readers, above it)"));
  }
  if (first_epoch && resume.empty() && *first_epoch >= epochs) {
    return absl::InvalidArgumentError(absl::StrCat("--first-epoch ", *first_epoch, " must be below --epochs ", epochs,
                                                   " (epochs count from 0)"));
  }
  if (frame_mode && truncation > 0) {
    return absl::InvalidArgumentError("--frame-mode and --truncation exclude each other (frames are one-sample "
                                      "sequences; truncated BPTT cuts whole sequences into steps)");
  }
  if (batch_offset >= batch_stride) {
    return absl::InvalidArgumentError(absl::StrCat("--batch-offset ", batch_offset, " must be below --batch-stride ",
                                                   batch_stride));
  }
  return r;
}

void AddStreamOptions(CLI::App* cmd, StreamArgs* a, bool in_process) {
  cmd->add_option("--randomize", a->randomize,
                  "on|off: block randomization (default: the dataset's randomize, true in CNTK)");
  cmd->add_option("--seed", a->seed, "Randomization seed (default: randomizationSeed); sweep k uses seed + k");
  cmd->add_option("--minibatch-size", a->minibatch_size,
                  "Samples per global minibatch (all ranks together), counted in the definesMBSize "
                  "stream or else the longest (default 256)")
      ->check(CLI::Range(uint64_t{1}, kMaxMinibatchSize));
  cmd->add_option("--epochs", a->epochs, "Epochs to read, counted from epoch 0 (default 1)")
      ->check(CLI::Range(uint64_t{1}, kMaxEpochs));
  cmd->add_option("--epoch-size", a->epoch_size, "Samples per epoch (default: the dataset's epochSize, else one sweep)")
      ->check(CLI::Range(uint64_t{1}, UINT64_MAX));
  cmd->add_option("--rank", a->rank, "This reader's rank among --world readers (default 0)");
  cmd->add_option("--world", a->world,
                  "Number of readers sharing each minibatch (default 1). Each gets its share of every "
                  "minibatch (--distribution: balanced, within one sequence of minibatch/world, or CNTK's "
                  "chunks, every w-th randomized chunk's sequences); all get the same number of minibatches. "
                  "With --resume, "
                  "a different --world re-partitions the rest of the epoch (elastic resume)")
      ->check(CLI::Range(1u, kMaxWorld));
  cmd->add_option("--minibatch-mode", a->minibatch_mode,
                  "partial (default): an epoch's last minibatch may be smaller; full: it is filled up "
                  "with the data that follows, and the next epoch starts after it");
  cmd->add_flag("--frame-mode", a->frame_mode, "Every sample is its own sequence, randomized at sample level");
  cmd->add_option("--truncation", a->truncation,
                  "Truncated BPTT: minibatches of T steps of --parallel sequences, each continuing in "
                  "its slot across minibatches");
  cmd->add_option("--parallel", a->parallel, "Truncated BPTT: parallel sequences (default: minibatch size / T)")
      ->check(CLI::Range(1u, kMaxParallel));
  cmd->add_option("--resume", a->resume, "Continue exactly after the minibatch whose \"cursor\" this is");
  cmd->add_option("--layout", a->layouts,
                  "STREAM=csc|csr|dense: deliver a sparse stream as CSC (its native layout), CSR or a dense "
                  "array (repeat for several streams)");
  cmd->add_option("--dtype", a->dtypes,
                  "STREAM=float16|bfloat16: deliver a stream's values narrowed, rounded to nearest even from "
                  "float32 (repeatable; float datasets)");
  cmd->add_option("--distribution", a->distribution,
                  "balanced (every rank's share of a minibatch within one sequence of minibatch/world) or chunks "
                  "(CNTK's: by randomized chunk, a rank parses only its chunks); default: the dataset's")
      ->check(CLI::IsMember({"balanced", "chunks"}));
  cmd->add_option("--first-epoch", a->first_epoch, "Start at the first minibatch of this epoch (below --epochs)");
  cmd->add_option("--batch-stride", a->batch_stride,
                  "Deliver every N-th minibatch of the stream (with --batch-offset): how DataLoader workers share it")
      ->check(CLI::Range(1u, kMaxBatchStride));
  cmd->add_option("--batch-offset", a->batch_offset, "Which of every --batch-stride minibatches (default 0)");
  const std::string group = in_process ? "Options" : "";  // "": hidden from --help
  cmd->add_option("--threads", a->threads, "Threads of a local read, the calling thread included: they parse, plan and assemble, so N uses N cores at most (default 1: one thread does everything); also indexing threads when the index is built. The output is the same for any value")
      ->check(CLI::Range(1, 256))
      ->group(group);
  cmd->add_option("--assembler", a->assembler,
                  "Who assembles batches: cpu (default) or cuda (GPU kernels; identical bytes; without a usable "
                  "device the CPU serves and one line on stderr says why)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->group(group);
  cmd->add_option("--device", a->device, "CUDA device for --assembler cuda (default 0)")
      ->check(CLI::Range(0, 1023))
      ->group(group);
}

absl::StatusOr<OpenedStream> OpenStream(const std::string& config_path, const std::string& dataset,
                                        const StreamArgs& args) {
  OpenedStream s;
  auto config = LoadConfig(config_path);
  if (!config.ok()) return config.status();
  auto dc = ChooseDataset(*config, dataset);
  if (!dc.ok()) return dc.status();
  s.name = dc->name;
  auto request = args.ToRequest();
  if (!request.ok()) return request.status();
  s.request = *request;
  // Kaldi compressed matrices stay compressed in the chunks and are decoded straight into
  // the batch at assembly: by the device with the CUDA assembler, and by the CPU assembler
  // (one pass instead of decode into the chunk, then copy) unless frames are asked for, whose
  // one-row pieces decode faster whole at parse (bench/RESULTS.md, issue 19). HTK frames stay
  // in their files either way (a frame decodes alone as cheaply).
  std::string note;
  s.assembler = args.assembler == "cuda" ? SelectAssembler(true, args.device, &note) : MakeCpuAssembler();
  const bool on_device = std::string(s.assembler->name()) == "cuda";
  if (!note.empty()) std::fprintf(stderr, "conveyor: %s\n", note.c_str());
  auto ds = OpenWithProgress(*dc, request->threads, /*compressed_in_place=*/true,
                             /*reads_frames=*/!on_device && request->frame_mode.value_or(dc->frame_mode));
  if (!ds.ok()) return ds.status();
  s.dataset = std::move(*ds);
  auto resolved = ResolveStream(*s.dataset, s.request);
  if (!resolved.ok()) return resolved.status();
  s.resolved = std::move(*resolved);
  for (const std::string& w : s.resolved.warnings) std::fprintf(stderr, "WARNING: %s\n", w.c_str());
  auto loader = Loader::Create(s.dataset.get(), s.assembler.get(), s.resolved.loader);
  if (!loader.ok()) return loader.status();
  s.loader = std::move(*loader);
  return s;
}

}  // namespace conveyor::cli
