#include "common/sampling/stream_request.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor {

std::string ResolvedStream::Encode(const CursorState& after) const {
  Cursor c = identity;
  c.state = after;
  return EncodeCursor(c);
}

namespace {
std::string StreamNames(const Dataset& dataset) {
  std::string out;
  for (const StreamConfig& s : dataset.streams()) absl::StrAppend(&out, out.empty() ? "" : ", ", s.name);
  return out;
}

// Numbers people pick for sizes: powers of two, 1-9 times a power of ten, multiples of 32 up
// to 8192, each at most `limit`, each once.
std::vector<uint64_t> LikelySizes(uint64_t limit) {
  std::vector<uint64_t> out;
  for (uint64_t v = 1; v <= limit; v *= 2) out.push_back(v);
  for (uint64_t ten = 10; ten <= limit; ten *= 10) {
    for (uint64_t k = 1; k <= 9 && k * ten <= limit; ++k) out.push_back(k * ten);
  }
  for (uint64_t v = 32; v <= std::min<uint64_t>(8192, limit); v += 32) out.push_back(v);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The one option that, changed from the stream's `p` (resolved from request `r` and the
// dataset's configuration), gives the cursor's configuration hash `want`: "minibatch size 512
// (this request: 256)", or for a value the configuration set "randomization window 4 chunks
// (now 8 chunks, from the dataset's configuration)"; "" when no single change among the
// likely values does (more than one option differs, or the dataset's streams do). About a
// thousand hashes of a few dozen words each: well under a millisecond, once per refused cursor.
std::string DifferingOption(const DatasetConfig& config, const StreamRequest& r, const PlannerOptions& p,
                            uint64_t want, uint64_t sweep_samples) {
  auto matches = [&](const PlannerOptions& q) { return StreamConfigHash(config, q) == want; };
  auto now = [](bool from_request, const std::string& value) {
    return from_request ? " (this request: " + value + ")" : " (now " + value + ", from the dataset's configuration)";
  };
  auto on_off = [](bool v) { return std::string(v ? "on" : "off"); };
  PlannerOptions q = p;
  q.randomizer.randomize = !p.randomizer.randomize;
  if (matches(q)) {
    return "randomization " + on_off(q.randomizer.randomize) + now(r.randomize.has_value(), on_off(p.randomizer.randomize));
  }
  q = p;
  q.randomizer.frame_mode = !p.randomizer.frame_mode;
  if (matches(q)) {
    return "frame mode " + on_off(q.randomizer.frame_mode) + now(r.frame_mode.has_value(), on_off(p.randomizer.frame_mode));
  }
  q = p;
  q.full_minibatches = !p.full_minibatches;
  auto mode = [](bool full) { return std::string(full ? "full" : "partial"); };
  if (matches(q)) {
    return "minibatch mode " + mode(q.full_minibatches) + now(r.full_minibatches.has_value(), mode(p.full_minibatches));
  }
  for (uint64_t v : LikelySizes(kMaxMinibatchSize)) {
    q = p;
    q.minibatch_size = v;
    if (v != p.minibatch_size && matches(q)) {
      return absl::StrCat("minibatch size ", v, now(true, std::to_string(p.minibatch_size)));
    }
  }
  auto epoch = [](const std::optional<uint64_t>& e) {
    return e ? absl::StrCat(*e, " samples") : std::string("one sweep (no epoch size)");
  };
  std::vector<std::optional<uint64_t>> epochs{std::nullopt, sweep_samples};
  for (uint64_t v : LikelySizes(uint64_t{1} << 40)) epochs.push_back(v);
  for (const auto& e : epochs) {
    q = p;
    q.epoch_size = e;
    if (e != p.epoch_size && matches(q)) {
      return "epoch size " + epoch(e) + now(r.epoch_size.has_value(), epoch(p.epoch_size));
    }
  }
  if (p.randomizer.randomize) {  // (the window is the configuration's: no request sets it)
    const char* unit = p.randomizer.sample_window ? " samples" : " chunks";
    for (uint64_t v : LikelySizes(uint64_t{1} << 40)) {
      q = p;
      q.randomizer.window = v;
      if (v != p.randomizer.window && matches(q)) {
        return absl::StrCat("randomization window ", v, unit, now(false, absl::StrCat(p.randomizer.window, unit)));
      }
    }
  }
  if (p.truncation > 0) {
    q = p;
    q.truncation = 0;
    if (matches(q)) return "no truncation" + now(r.truncation > 0, absl::StrCat("truncation ", p.truncation));
  }
  return "";
}
}  // namespace

absl::StatusOr<ResolvedStream> ResolveStream(const Dataset& dataset, const StreamRequest& r) {
  const DatasetConfig& config = dataset.config();
  if (r.minibatch_size == 0 || r.minibatch_size > kMaxMinibatchSize) {
    return absl::InvalidArgumentError(absl::StrCat("minibatch size must be between 1 and ", kMaxMinibatchSize));
  }
  if (r.epochs == 0 || r.epochs > kMaxEpochs) return absl::InvalidArgumentError(absl::StrCat("epochs must be between 1 and ", kMaxEpochs));
  if (r.world && (*r.world == 0 || *r.world > kMaxWorld)) {
    return absl::InvalidArgumentError(absl::StrCat("world must be between 1 and ", kMaxWorld));
  }
  if (r.parallel > kMaxParallel) return absl::InvalidArgumentError(absl::StrCat("parallel must be at most ", kMaxParallel));
  if (r.epoch_size && *r.epoch_size == 0) return absl::InvalidArgumentError("epoch size must be at least 1 sample");

  ResolvedStream out;
  PlannerOptions& p = out.loader.planner;
  p.minibatch_size = r.minibatch_size;
  p.epochs = r.epochs;
  p.epoch_size = r.epoch_size ? r.epoch_size : config.epoch_size;
  p.full_minibatches = r.full_minibatches.value_or(config.full_minibatches);
  RandomizerOptions& rz = p.randomizer;
  rz.randomize = r.randomize.value_or(config.randomize);
  rz.seed = r.seed.value_or(config.randomization_seed);
  rz.sample_window = config.sample_based_randomization_window;
  rz.window = config.randomization_window.value_or(DefaultRandomizationWindow(
      dataset.index(), config.deserializers.empty() ? (32ull << 20) : config.deserializers[0].chunk_size_in_bytes,
      rz.sample_window));
  rz.frame_mode = r.frame_mode.value_or(config.frame_mode);
  p.truncation = r.truncation > 0 ? r.truncation
                                  : (config.truncated ? static_cast<uint32_t>(config.truncation_length) : 0);
  p.parallel = r.parallel;
  if (uint64_t{p.truncation} * p.parallel > kMaxMinibatchSize) {
    // T x N steps make one BPTT minibatch: the same bound as minibatch_size.
    return absl::InvalidArgumentError(absl::StrCat("truncation x parallel (", p.truncation, " x ", p.parallel,
                                                   " steps) must be at most ", kMaxMinibatchSize,
                                                   ", the largest minibatch"));
  }
  if (p.truncation > 0 && rz.frame_mode) {
    return absl::InvalidArgumentError("frame mode and truncated BPTT cannot be combined (CNTK refuses it too)");
  }
  p.world = r.world.value_or(1);
  p.rank = r.rank.value_or(0);
  out.loader.threads = r.threads;
  if (!r.layouts.empty()) {
    out.loader.layouts.assign(dataset.streams().size(), OutputLayout::kNative);
    for (const auto& [name, layout] : r.layouts) {
      size_t s = 0;
      while (s < dataset.streams().size() && dataset.streams()[s].name != name) ++s;
      if (s == dataset.streams().size()) {
        return absl::InvalidArgumentError(absl::StrCat("a layout names no stream of the dataset: '", name.substr(0, 64),
                                                       "' (streams: ", StreamNames(dataset), ")"));
      }
      RETURN_IF_ERROR(CheckLayout(name, dataset.streams()[s].format, layout));
      out.loader.layouts[s] = layout;
    }
  }
  if (!r.value_dtypes.empty()) {
    out.loader.value_dtypes.assign(dataset.streams().size(),
                                   config.precision == Precision::kFloat ? DType::kFloat32 : DType::kFloat64);
    for (const auto& [name, dtype] : r.value_dtypes) {
      size_t s = 0;
      while (s < dataset.streams().size() && dataset.streams()[s].name != name) ++s;
      if (s == dataset.streams().size()) {
        return absl::InvalidArgumentError(absl::StrCat("a dtype names no stream of the dataset: '", name.substr(0, 64),
                                                       "' (streams: ", StreamNames(dataset), ")"));
      }
      RETURN_IF_ERROR(CheckValueDType(name, dataset.streams()[s].format, config.precision, dtype));
      out.loader.value_dtypes[s] = dtype;
    }
  }
  p.distribution = r.distribution.value_or(config.distribution);
  if (r.batch_stride == 0 || r.batch_stride > kMaxBatchStride || r.batch_offset >= r.batch_stride) {
    return absl::InvalidArgumentError(absl::StrCat("batch stride must be between 1 and ", kMaxBatchStride,
                                                   " and the batch offset below it (got ", r.batch_stride, " and ",
                                                   r.batch_offset, ")"));
  }
  out.loader.batch_stride = r.batch_stride;
  out.loader.batch_offset = r.batch_offset;
  if (r.first_epoch) {
    if (!r.resume.empty()) {
      return absl::InvalidArgumentError("a first epoch and a resume cursor exclude each other (the cursor says where)");
    }
    if (*r.first_epoch >= p.epochs) {
      return absl::InvalidArgumentError(absl::StrCat("first epoch ", *r.first_epoch, " must be below epochs (",
                                                     p.epochs, ", counted from epoch 0)"));
    }
    out.loader.first_epoch = *r.first_epoch;
  }
  out.identity.data_hash = IndexHash(dataset.index());

  if (!r.resume.empty()) {
    ASSIGN_OR_RETURN(Cursor c, DecodeCursor(r.resume));
    if (c.data_hash != out.identity.data_hash) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cursor was made for another dataset (or another version of ", dataset.path(), ")"));
    }
    if (r.seed && *r.seed != c.seed) {
      return absl::InvalidArgumentError(absl::StrCat("cursor was made with seed ", c.seed, ", not ", *r.seed,
                                                     ": resume with the seed that produced it (or none: the cursor's)"));
    }
    rz.seed = c.seed;
    if (!r.world) {
      if (c.world == 0 || c.world > kMaxWorld) {
        return absl::InvalidArgumentError(absl::StrCat("cursor says world ", c.world, ": it must be between 1 and ", kMaxWorld));
      }
      p.world = c.world;
      p.rank = r.rank.value_or(c.rank);
    }
    out.loader.resume = c.state;
    out.identity.config_hash = StreamConfigHash(config, p);
    if (c.config_hash != out.identity.config_hash) {
      const std::string which = DifferingOption(config, r, p, c.config_hash, dataset.index().total_samples);
      if (!which.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("cursor was made with ", which,
                                                       ": resume with the options and configuration that produced it"));
      }
      return absl::InvalidArgumentError(
          "cursor was made with another configuration (minibatch size, epoch size, randomization, frame mode, "
          "truncation or streams differ): resume with the options that produced it");
    }
  }
  if (p.rank >= p.world) return absl::InvalidArgumentError(absl::StrCat("rank ", p.rank, " is not below world ", p.world));
  const uint64_t chunks = dataset.index().chunks.size();
  if (p.world > 1 && p.truncation == 0 && p.distribution == Distribution::kChunks && chunks < 4 * uint64_t{p.world}) {
    out.warnings.push_back(absl::StrCat(
        dataset.config().name, ": ", chunks, " chunk(s) for ", p.world, " ranks with distribution 'chunks': a rank's "
        "share of a minibatch follows the chunks, so some ranks get few or no sequences; use distribution 'balanced' "
        "(or a smaller chunkSizeInBytes)"));
  }
  out.identity.config_hash = StreamConfigHash(config, p);
  out.identity.seed = rz.seed;
  out.identity.rank = p.rank;
  out.identity.world = p.world;
  return out;
}

}  // namespace conveyor
