#include "proto/subscribe.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "proto/wire.h"

namespace conveyor {

v1::Subscribe MakeSubscribe(const std::string& dataset, const StreamRequest& request) {
  v1::Subscribe s;
  s.set_dataset(dataset);
  s.set_minibatch_size(request.minibatch_size);
  s.set_epochs(request.epochs);
  if (request.seed) s.set_seed(*request.seed);
  if (request.randomize) s.set_randomize(*request.randomize);
  if (request.epoch_size) s.set_epoch_size(*request.epoch_size);
  if (request.rank) s.set_rank(*request.rank);
  if (request.world) s.set_world(*request.world);
  if (request.frame_mode) s.set_frame_mode(*request.frame_mode);
  if (request.full_minibatches) {
    s.set_minibatch_mode(*request.full_minibatches ? v1::MINIBATCH_MODE_FULL
                                                   : v1::MINIBATCH_MODE_PARTIAL);
  }
  s.set_truncation(request.truncation);
  s.set_parallel(request.parallel);
  s.set_resume_cursor(request.resume);
  for (const auto& [name, layout] : request.layouts) (*s.mutable_layouts())[name] = ToProto(layout);
  for (const auto& [name, dtype] : request.value_dtypes)
    (*s.mutable_dtypes())[name] = ToProto(dtype);
  if (request.distribution) {
    s.set_distribution(*request.distribution == Distribution::kChunks ? v1::DISTRIBUTION_CHUNKS
                                                                      : v1::DISTRIBUTION_BALANCED);
  }
  if (request.first_epoch) s.set_first_epoch(*request.first_epoch);
  s.set_batch_stride(request.batch_stride);
  s.set_batch_offset(request.batch_offset);
  return s;
}

absl::StatusOr<StreamRequest> SubscribeToRequest(const v1::Subscribe& s) {
  StreamRequest r;
  if (s.layouts_size() > kMaxSubscribeMaps)
    return absl::InvalidArgumentError(absl::StrCat("at most ", kMaxSubscribeMaps, " layouts"));
  for (const auto& [name, layout] : s.layouts()) {
    auto l = LayoutFromProto(layout);
    if (!l.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(l.status().message(), " for stream '", name.substr(0, 64), "'"));
    }
    r.layouts[name] = *l;
  }
  switch (s.minibatch_mode()) {
    case v1::MINIBATCH_MODE_DEFAULT:
      break;
    case v1::MINIBATCH_MODE_PARTIAL:
      r.full_minibatches = false;
      break;
    case v1::MINIBATCH_MODE_FULL:
      r.full_minibatches = true;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown minibatch_mode ", static_cast<int>(s.minibatch_mode()),
                       " (expected MINIBATCH_MODE_DEFAULT, MINIBATCH_MODE_PARTIAL or "
                       "MINIBATCH_MODE_FULL)"));
  }
  if (s.has_randomize()) r.randomize = s.randomize();
  if (s.has_seed()) r.seed = s.seed();
  r.minibatch_size = s.minibatch_size();
  r.epochs = s.epochs() == 0 ? 1 : s.epochs();
  if (s.has_epoch_size()) r.epoch_size = s.epoch_size();
  if (s.has_rank()) r.rank = s.rank();
  if (s.has_world()) r.world = s.world();
  if (s.has_frame_mode()) r.frame_mode = s.frame_mode();
  if (s.parallel() > 0 && s.truncation() == 0)
    return absl::InvalidArgumentError("parallel needs truncation");
  if (s.truncation() > (1u << 20))
    return absl::InvalidArgumentError("truncation must be at most 2^20");
  r.truncation = s.truncation();
  r.parallel = s.parallel();
  r.resume = s.resume_cursor();
  switch (s.distribution()) {
    case v1::DISTRIBUTION_DEFAULT:
      break;
    case v1::DISTRIBUTION_BALANCED:
      r.distribution = Distribution::kBalanced;
      break;
    case v1::DISTRIBUTION_CHUNKS:
      r.distribution = Distribution::kChunks;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown distribution ", static_cast<int>(s.distribution())));
  }
  if (s.has_first_epoch()) r.first_epoch = s.first_epoch();
  r.batch_stride = std::max<uint32_t>(1, s.batch_stride());
  r.batch_offset = s.batch_offset();
  if (s.dtypes_size() > kMaxSubscribeMaps)
    return absl::InvalidArgumentError(absl::StrCat("at most ", kMaxSubscribeMaps, " dtypes"));
  for (const auto& [name, dtype] : s.dtypes()) {
    if (dtype == v1::DTYPE_FLOAT16) {
      r.value_dtypes[name] = DType::kFloat16;
    } else if (dtype == v1::DTYPE_BFLOAT16) {
      r.value_dtypes[name] = DType::kBFloat16;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("dtypes['", name.substr(0, 64),
                       "']: a stream's values may be asked as DTYPE_FLOAT16 or "
                       "DTYPE_BFLOAT16 only"));
    }
  }
  return r;
}

}  // namespace conveyor
