// The CPU assembler with helper threads (assembler.h, AssemblyHelpers): every standard batch
// case (dense, sparse as CSC, CSR and dense, ids; frames, sequences, truncated BPTT; float,
// double, narrowed values) and Kaldi compressed matrices decoded at assembly, assembled with
// 1 to 8 threads, ranges cut as finely as one piece, synchronously and with several batches
// begun at once, must give the bytes the assembler gives alone, into memory full of garbage.
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/batch/assembler.h"
#include "common/batch/batch_layout.h"
#include "cuda/cases/batch_cases.h"
#include "cuda/cases/compressed_cases.h"
#include "gtest/gtest.h"

namespace conveyor {
namespace {

using conveyor::testing::CaseSpec;
using conveyor::testing::MakeBatchCase;
using conveyor::testing::StandardCases;

// `threads` threads taking jobs in order. They say they are all idle, or (`seem_busy`) that
// none is idle now but all take work joined later, as a pool's threads busy assembling the
// batch before do: the assembler then leaves a batch's setup to the first thread to come.
class TestHelpers final : public AssemblyHelpers {
 public:
  explicit TestHelpers(int threads, bool seem_busy = false) : seem_busy_(seem_busy) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~TestHelpers() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int idle() const override { return seem_busy_ ? 0 : static_cast<int>(threads_.size()); }
  int available() const override { return static_cast<int>(threads_.size()); }
  void Help(std::function<void()> job) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(job));
      ++submitted_;
    }
    cv_.notify_one();
  }
  uint64_t submitted() {
    std::lock_guard<std::mutex> lock(mu_);
    return submitted_;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  uint64_t submitted_ = 0;
  bool stop_ = false;
  const bool seem_busy_;
  std::vector<std::thread> threads_;
};

struct Split {
  int threads;
  uint64_t range_bytes;
};
// One thread (ranges but no helper) to eight; ranges of one piece up to the default size.
const Split kSplits[] = {{1, 1}, {2, 1}, {3, 64}, {4, 1000}, {8, 1}, {8, 256 << 10}};

// The batch assembled by one thread without helpers is the reference; checks Assemble() and
// Begin()/Wait() (three batches begun before the first is waited for) with every split.
void ExpectSameWithHelpers(const BatchPlan& plan, absl::Span<const PieceRef> pieces) {
  std::vector<std::byte> want(plan.total_bytes, std::byte{0xAB});
  ASSERT_TRUE(MakeCpuAssembler()->Assemble(plan, pieces, absl::MakeSpan(want)).ok());
  for (const Split& split : kSplits) {
    for (bool seem_busy : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << split.threads << " threads, ranges of " << split.range_bytes << " bytes"
                   << (seem_busy ? ", none idle" : ""));
      TestHelpers helpers(split.threads, seem_busy);
      CpuAssemblerOptions o;
      o.min_parallel_bytes = 0;
      o.range_bytes = split.range_bytes;
      // (Before the assembler: on a failed assertion it finishes its batches into them.)
      std::vector<std::vector<std::byte>> outs(
          3, std::vector<std::byte>(plan.total_bytes, std::byte{0xCD}));
      auto cpu = MakeCpuAssembler(o);
      cpu->set_helpers(&helpers);
      EXPECT_TRUE(cpu->pipelined());
      std::vector<std::byte> got(plan.total_bytes, std::byte{0xCD});
      ASSERT_TRUE(cpu->Assemble(plan, pieces, absl::MakeSpan(got)).ok());
      ASSERT_EQ(got, want);
      std::vector<uint64_t> fences;
      for (auto& out : outs) {
        auto f = cpu->Begin(plan, pieces, absl::MakeSpan(out));
        ASSERT_TRUE(f.ok()) << f.status();
        fences.push_back(*f);
      }
      for (size_t i = 0; i < outs.size(); ++i) {
        ASSERT_TRUE(cpu->Wait(fences[i]).ok());
        ASSERT_EQ(outs[i], want) << "batch " << i;
      }
      cpu->set_helpers(nullptr);
      EXPECT_FALSE(cpu->pipelined());
    }
  }
}

// A plan says where each piece's sparse entries lie (PlanBatch found them); the same plan
// without that is assembled from the chunks' tables: the same bytes, on one thread and in
// ranges on several (whose starts come from either).
void ExpectSameWithoutEntries(const BatchPlan& plan, absl::Span<const PieceRef> pieces) {
  bool sparse = false;
  for (const StreamLayout& L : plan.streams) sparse = sparse || L.format == StreamFormat::kSparse;
  ASSERT_EQ(plan.entries.size(), sparse ? pieces.size() * plan.streams.size() : 0);
  if (!sparse) return;
  std::vector<std::byte> want(plan.total_bytes, std::byte{0xAB});
  ASSERT_TRUE(MakeCpuAssembler()->Assemble(plan, pieces, absl::MakeSpan(want)).ok());
  BatchPlan without = plan;
  without.entries.clear();
  std::vector<std::byte> got(plan.total_bytes, std::byte{0xCD});
  ASSERT_TRUE(MakeCpuAssembler()->Assemble(without, pieces, absl::MakeSpan(got)).ok());
  ASSERT_EQ(got, want);
  ExpectSameWithHelpers(without, pieces);
}

// The case's chunks marked where a stream has one sample a sequence (as Dataset::ParseChunk
// marks every chunk): planning then reads no sequence_begin there. The same plan and bytes.
void ExpectSameWhereStreamsHaveOneSampleEach(conveyor::testing::BatchCase* c, Precision precision,
                                             const std::vector<DType>& dtypes, const BatchPlan& unmarked) {
  std::vector<std::byte> want(unmarked.total_bytes, std::byte{0xAB});
  ASSERT_TRUE(MakeCpuAssembler()->Assemble(unmarked, c->pieces, absl::MakeSpan(want)).ok());
  for (auto& chunk : c->chunks) NoteOneSampleStreams(chunk.get());
  auto plan = PlanBatch(c->streams, precision, c->shape, c->pieces, c->layouts, dtypes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->total_bytes, unmarked.total_bytes);
  ASSERT_EQ(plan->counts, unmarked.counts);
  std::vector<std::byte> got(plan->total_bytes, std::byte{0xCD});
  ASSERT_TRUE(MakeCpuAssembler()->Assemble(*plan, c->pieces, absl::MakeSpan(got)).ok());
  ASSERT_EQ(got, want);
  BatchPlan without = *plan;
  without.entries.clear();
  ASSERT_TRUE(MakeCpuAssembler()->Assemble(without, c->pieces, absl::MakeSpan(got)).ok());
  ASSERT_EQ(got, want);
  for (auto& chunk : c->chunks) {
    for (ParsedStream& ps : chunk->streams) ps.one_sample_each = false;
  }
}

void ExpectSameArray(const ArrayDesc& a, const ArrayDesc& b, const char* what) {
  EXPECT_EQ(a.dtype, b.dtype) << what;
  EXPECT_EQ(a.offset, b.offset) << what;
  EXPECT_EQ(a.bytes, b.bytes) << what;
  EXPECT_EQ(a.shape, b.shape) << what;
}

// Every field of two plans, pieces, counts and entry addresses included.
void ExpectSamePlan(const BatchPlan& got, const BatchPlan& want) {
  EXPECT_EQ(got.total_bytes, want.total_bytes);
  EXPECT_EQ(got.num_sequences, want.num_sequences);
  EXPECT_EQ(got.num_samples, want.num_samples);
  EXPECT_EQ(got.num_streams, want.num_streams);
  ExpectSameArray(got.mask, want.mask, "mask");
  ExpectSameArray(got.flags, want.flags, "flags");
  ASSERT_EQ(got.streams.size(), want.streams.size());
  for (size_t s = 0; s < want.streams.size(); ++s) {
    const StreamLayout &g = got.streams[s], &w = want.streams[s];
    SCOPED_TRACE("stream " + w.name);
    EXPECT_EQ(g.max_length, w.max_length);
    EXPECT_EQ(g.num_samples, w.num_samples);
    EXPECT_EQ(g.nnz, w.nnz);
    ExpectSameArray(g.lengths, w.lengths, "lengths");
    ExpectSameArray(g.values, w.values, "values");
    ExpectSameArray(g.colptr, w.colptr, "colptr");
    ExpectSameArray(g.rowind, w.rowind, "rowind");
    ExpectSameArray(g.rowptr, w.rowptr, "rowptr");
    ExpectSameArray(g.colind, w.colind, "colind");
  }
  EXPECT_EQ(got.counts, want.counts);
  ASSERT_EQ(got.pieces.size(), want.pieces.size());
  for (size_t i = 0; i < want.pieces.size(); ++i) {
    const PlacedPiece &g = got.pieces[i], &w = want.pieces[i];
    ASSERT_TRUE(g.key == w.key && g.name == w.name && g.frame == w.frame && g.row == w.row && g.t0 == w.t0 &&
                g.sample_begin == w.sample_begin && g.truncated == w.truncated && g.longest == w.longest)
        << "piece " << i;
  }
  ASSERT_EQ(got.entries.size(), want.entries.size());
  for (size_t i = 0; i < want.entries.size(); ++i) {
    const PieceEntries &g = got.entries[i], &w = want.entries[i];
    ASSERT_TRUE(g.indices == w.indices && g.values == w.values && g.count == w.count &&
                g.first_sample == w.first_sample)
        << "entry " << i;
  }
}

// Runs tasks n-1 down to 0 on the calling thread: the ranges placed last to first.
void RunBackwards(size_t n, const std::function<void(size_t)>& task) {
  for (size_t i = n; i-- > 0;) task(i);
}

// The case planned with its pieces placed in ranges (PlanThreads), as small as one piece, on
// 1-8 threads, backwards, and into a recycled plan of another batch (longer, garbage in its
// pieces and entries): the plan made on one thread.
void ExpectSamePlanInRanges(const conveyor::testing::BatchCase& c, Precision precision,
                            const std::vector<DType>& dtypes, const BatchPlan& want) {
  for (int threads : {1, 2, 3, 8}) {
    for (size_t min_range : {size_t{1}, size_t{3}}) {
      for (int way = 0; way < 3; ++way) {  // helpers, backwards, helpers into a recycled plan
        SCOPED_TRACE(::testing::Message() << threads << " threads, ranges of " << min_range << "+ pieces, way " << way);
        TestHelpers helpers(threads);
        PlanThreads pt;
        pt.workers = threads;
        pt.min_range_pieces = min_range;
        pt.run = [&](size_t n, const std::function<void(size_t)>& task) {
          if (way == 1) RunBackwards(n, task);
          else RunWithHelpers(&helpers, threads - 1, n, task);
        };
        BatchPlan recycled;
        if (way == 2) {
          recycled.pieces.resize(c.pieces.size() + 7);
          for (PlacedPiece& p : recycled.pieces) {
            p.key = 99;
            p.name = "stale";
            p.longest = 77;
          }
          recycled.counts.assign((c.pieces.size() + 7) * c.streams.size(), 55);
          recycled.entries.assign((c.pieces.size() + 7) * c.streams.size(),
                                  PieceEntries{reinterpret_cast<const std::byte*>(&recycled), nullptr, 3, 4});
        }
        auto plan = PlanBatch(c.streams, precision, c.shape, c.pieces, c.layouts, dtypes,
                              way == 2 ? &recycled : nullptr, &pt);
        ASSERT_TRUE(plan.ok()) << plan.status();
        ExpectSamePlan(*plan, want);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TEST(ParallelAssembly, EveryStandardCaseIsTheSameOnAnyNumberOfThreads) {
  for (const CaseSpec& spec : StandardCases()) {
    for (uint64_t seed : {21, 22, 23}) {  // 23: narrowed values where the case is float
      if (seed == 23 && spec.precision != Precision::kFloat) continue;
      SCOPED_TRACE(spec.name + " seed " + std::to_string(seed));
      auto c = MakeBatchCase(spec, seed);
      const std::vector<DType> dtypes = seed == 23 ? NarrowedDTypes(c) : std::vector<DType>{};
      auto plan = PlanBatch(c.streams, spec.precision, c.shape, c.pieces, c.layouts, dtypes);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ExpectSamePlanInRanges(c, spec.precision, dtypes, *plan);
      if (::testing::Test::HasFatalFailure()) return;
      ExpectSameWithHelpers(*plan, c.pieces);
      if (::testing::Test::HasFatalFailure()) return;
      ExpectSameWithoutEntries(*plan, c.pieces);
      if (::testing::Test::HasFatalFailure()) return;
      ExpectSameWhereStreamsHaveOneSampleEach(&c, spec.precision, dtypes, *plan);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// Placed in ranges, a string-keyed batch's pieces keep their names, and a batch with several
// pieces in error fails with the first one's error (that of the calling thread alone), the
// ranges run on helpers or backwards (the last range's error found first).
TEST(ParallelAssembly, PlanRangesKeepNamesAndReportTheFirstPieceInError) {
  CaseSpec spec;
  for (const CaseSpec& s : StandardCases())
    if (s.name == "sparse_csr") spec = s;
  ASSERT_EQ(spec.name, "sparse_csr");
  auto c = MakeBatchCase(spec, 41);
  for (auto& chunk : c.chunks) {
    chunk->names.clear();
    for (uint64_t key : chunk->keys) chunk->names.push_back("utt-" + std::to_string(key));
  }
  BatchShape frames = c.shape;
  frames.frame_mode = true;  // sequences of several samples: an error each
  auto alone = PlanBatch(c.streams, spec.precision, c.shape, c.pieces, c.layouts);
  ASSERT_TRUE(alone.ok()) << alone.status();
  ASSERT_EQ(alone->pieces.front().name, "utt-" + std::to_string(alone->pieces.front().key));
  size_t in_error = 0;
  for (const PlacedPiece& p : alone->pieces) in_error += p.longest > 1 ? 1 : 0;
  ASSERT_GT(in_error, 10u);
  const absl::Status want = PlanBatch(c.streams, spec.precision, frames, c.pieces, c.layouts).status();
  ASSERT_EQ(want.code(), absl::StatusCode::kInvalidArgument) << want;
  for (int threads : {2, 4}) {
    for (bool backwards : {false, true}) {
      SCOPED_TRACE(::testing::Message() << threads << " threads" << (backwards ? ", backwards" : ""));
      TestHelpers helpers(threads);
      PlanThreads pt;
      pt.workers = threads;
      pt.min_range_pieces = 1;
      pt.run = [&](size_t n, const std::function<void(size_t)>& task) {
        if (backwards) RunBackwards(n, task);
        else RunWithHelpers(&helpers, threads - 1, n, task);
      };
      auto named = PlanBatch(c.streams, spec.precision, c.shape, c.pieces, c.layouts, {}, nullptr, &pt);
      ASSERT_TRUE(named.ok()) << named.status();
      ExpectSamePlan(*named, *alone);
      EXPECT_EQ(PlanBatch(c.streams, spec.precision, frames, c.pieces, c.layouts, {}, nullptr, &pt).status(), want);
    }
  }
}

// Random cases beyond the standard set: random rows, lengths, modes, layouts and dims.
TEST(ParallelAssembly, RandomCasesAreTheSameOnAnyNumberOfThreads) {
  std::mt19937_64 rng(19);
  for (int k = 0; k < 60; ++k) {
    CaseSpec spec;
    spec.name = "random " + std::to_string(k);
    spec.rows = 1 + static_cast<uint32_t>(rng() % 300);
    spec.mode = static_cast<conveyor::testing::Mode>(rng() % 3);
    spec.max_length = spec.mode == conveyor::testing::Mode::kFrame ? 1 : 1 + static_cast<uint32_t>(rng() % 12);
    spec.precision = rng() % 4 == 0 ? Precision::kDouble : Precision::kFloat;
    spec.empty_rows = (rng() % 3) * 0.2;
    const int n_streams = 1 + static_cast<int>(rng() % 3);
    for (int s = 0; s < n_streams; ++s) {
      conveyor::testing::StreamSpec st;
      const int kind = static_cast<int>(rng() % 5);
      st.format = kind < 2 ? StreamFormat::kDense : (kind < 4 ? StreamFormat::kSparse : StreamFormat::kIds);
      st.dim = st.format == StreamFormat::kIds ? 1 : 1 + rng() % 700;
      if (st.format == StreamFormat::kSparse) {
        const OutputLayout layouts[] = {OutputLayout::kNative, OutputLayout::kCsr, OutputLayout::kDense};
        st.layout = layouts[rng() % 3];
        st.empty_fraction = (rng() % 4) * 0.25;
        st.max_nnz = 1 + static_cast<uint32_t>(rng() % 20);
      }
      spec.streams.push_back(st);
    }
    SCOPED_TRACE(spec.name);
    auto c = MakeBatchCase(spec, 100 + k);
    auto plan = PlanBatch(c.streams, spec.precision, c.shape, c.pieces, c.layouts);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ExpectSamePlanInRanges(c, spec.precision, {}, *plan);
    if (::testing::Test::HasFatalFailure()) return;
    ExpectSameWithHelpers(*plan, c.pieces);
    if (::testing::Test::HasFatalFailure()) return;
    ExpectSameWithoutEntries(*plan, c.pieces);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Kaldi CM, CM2, CM3 left compressed: each range decodes its pieces into the batch.
TEST(ParallelAssembly, CompressedMatricesDecodeTheSameOnAnyNumberOfThreads) {
  std::mt19937 rng(5);
  for (int format : {1, 2, 3}) {
    std::vector<std::string> objects;
    for (int i = 0; i < 5; ++i) objects.push_back(conveyor::testing::RandomCompressed(format, 60 + 40 * i, 23, rng));
    for (auto pieces : {conveyor::testing::CompressedPieces::kUtterances,
                        conveyor::testing::CompressedPieces::kFramesInOrder,
                        conveyor::testing::CompressedPieces::kRandomFrames}) {
      for (Precision precision : {Precision::kFloat, Precision::kDouble}) {
        SCOPED_TRACE(::testing::Message() << "CM" << format << " pieces " << static_cast<int>(pieces));
        auto c = conveyor::testing::MakeCompressedCase(objects, 0, 0, 23, pieces, 3);
        auto plan = PlanBatch(c.streams, precision, c.shape, c.pieces);
        ASSERT_TRUE(plan.ok()) << plan.status();
        ExpectSameWithHelpers(*plan, c.pieces);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

// Helpers that are all busy: they offer themselves (as a pool with cores to spare does) but
// run nothing until told, so every range is the waiting thread's, and their jobs run late:
// after Wait() returned, after the assembler and the batch's state are gone (under ASan a
// late job touching them would be reported).
class BusyHelpers final : public AssemblyHelpers {
 public:
  int idle() const override { return 0; }
  int available() const override { return 4; }
  void Help(std::function<void()> job) override { jobs_.push_back(std::move(job)); }
  size_t RunLate() {
    const size_t n = jobs_.size();
    for (auto& job : jobs_) job();
    jobs_.clear();
    return n;
  }

 private:
  std::vector<std::function<void()>> jobs_;
};

TEST(ParallelAssembly, BusyHelpersDelayNoBatchAndTheirLateJobsTouchNothing) {
  for (const CaseSpec& spec : StandardCases()) {
    SCOPED_TRACE(spec.name);
    auto c = MakeBatchCase(spec, 31);
    auto plan = PlanBatch(c.streams, spec.precision, c.shape, c.pieces, c.layouts);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::vector<std::byte> want(plan->total_bytes, std::byte{0xAB});
    ASSERT_TRUE(MakeCpuAssembler()->Assemble(*plan, c.pieces, absl::MakeSpan(want)).ok());
    BusyHelpers helpers;
    {
      CpuAssemblerOptions o;
      o.min_parallel_bytes = 0;
      o.range_bytes = 1;
      // (Before the assembler: on a failed assertion it finishes its batches into them.)
      std::vector<std::vector<std::byte>> outs(2, std::vector<std::byte>(plan->total_bytes, std::byte{0xCD}));
      auto cpu = MakeCpuAssembler(o);
      cpu->set_helpers(&helpers);
      std::vector<uint64_t> fences;
      for (auto& out : outs) {
        auto f = cpu->Begin(*plan, c.pieces, absl::MakeSpan(out));
        ASSERT_TRUE(f.ok()) << f.status();
        fences.push_back(*f);
      }
      for (size_t i = 0; i < outs.size(); ++i) {
        ASSERT_TRUE(cpu->Wait(fences[i]).ok());  // no helper ran: the waiting thread did it all
        ASSERT_EQ(outs[i], want) << "batch " << i;
      }
      std::vector<std::byte> once(plan->total_bytes, std::byte{0xCD});
      ASSERT_TRUE(cpu->Assemble(*plan, c.pieces, absl::MakeSpan(once)).ok());
      ASSERT_EQ(once, want);
    }  // the assembler, its batches' work and the outputs are gone
    // (A batch of no bytes is not split: no helper is asked.)
    if (plan->total_bytes > 0) {
      EXPECT_GT(helpers.RunLate(), 0u);
    } else {
      EXPECT_EQ(helpers.RunLate(), 0u);
    }
  }
}

// Small batches stay on the calling thread; a batch worth splitting goes to the helpers.
TEST(ParallelAssembly, OnlyBatchesWorthSplittingUseHelpers) {
  auto c = MakeBatchCase(StandardCases().front(), 1);
  auto plan = PlanBatch(c.streams, c.spec.precision, c.shape, c.pieces, c.layouts);
  ASSERT_TRUE(plan.ok());
  TestHelpers helpers(2);
  CpuAssemblerOptions o;
  o.min_parallel_bytes = plan->total_bytes + 1;
  auto cpu = MakeCpuAssembler(o);
  cpu->set_helpers(&helpers);
  std::vector<std::byte> out(plan->total_bytes);
  ASSERT_TRUE(cpu->Assemble(*plan, c.pieces, absl::MakeSpan(out)).ok());
  EXPECT_EQ(helpers.submitted(), 0u);
  // What the loader asks before placing a batch's pieces on the helpers too.
  EXPECT_FALSE(cpu->SplitsBatchesOf(plan->total_bytes));
  EXPECT_TRUE(cpu->SplitsBatchesOf(plan->total_bytes + 1));
  cpu->set_helpers(nullptr);
  EXPECT_FALSE(cpu->SplitsBatchesOf(plan->total_bytes + 1));
  cpu->set_helpers(&helpers);
  // A slot too small is refused at Begin(), with no fence used.
  EXPECT_EQ(cpu->Begin(*plan, c.pieces, absl::MakeSpan(out).subspan(0, out.size() - 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cpu->Wait(1).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace conveyor
