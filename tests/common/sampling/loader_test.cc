// The file-order planner and the loader: minibatch cutting, epochs across sweeps, the
// parse-ahead pipeline and keepDataInMemory.
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/formats/ctf/ctf_indexer.h"
#include "common/sampling/chunk_pipeline.h"
#include "common/sampling/loader.h"
#include "common/sampling/parser_pool.h"
#include "common/sampling/planner.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace conveyor::testing {
namespace {

Index MakeIndex(const std::vector<uint32_t>& lengths, uint64_t chunk_size) {
  Index index;
  uint64_t offset = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    index.sequences.push_back({i, offset, i, 10, lengths[i]});
    offset += 10;
  }
  index.BuildChunks(chunk_size);
  return index;
}

std::vector<std::vector<uint64_t>> Plan(const Index& index, PlannerOptions o) {
  auto planner = Planner::Create(&index, o);
  EXPECT_TRUE(planner.ok());
  std::vector<std::vector<uint64_t>> out;
  while (auto b = (*planner)->Next()) {
    std::vector<uint64_t> seqs;
    for (const auto& s : b->pieces) seqs.push_back(s.sequence);
    out.push_back(seqs);
  }
  return out;
}

TEST(Planner, TakesWholeSequencesUpToTheMinibatchSize) {
  Index index = MakeIndex({3, 2, 4, 1, 5}, 1000);
  PlannerOptions o;
  o.minibatch_size = 5;
  // 3+2 | 4+1 | 5
  EXPECT_EQ(Plan(index, o), (std::vector<std::vector<uint64_t>>{{0, 1}, {2, 3}, {4}}));
}

TEST(Planner, ALongerSequenceGoesAlone) {
  Index index = MakeIndex({1, 9, 1}, 1000);
  PlannerOptions o;
  o.minibatch_size = 4;
  EXPECT_EQ(Plan(index, o), (std::vector<std::vector<uint64_t>>{{0}, {1}, {2}}));
}

TEST(Planner, EpochSizeCutsAcrossSweeps) {
  // 5 one-sample sequences; epochs of 3 samples: [0,1,2] [3,4 | 0] [1,2,3] ...
  Index index = MakeIndex({1, 1, 1, 1, 1}, 1000);
  PlannerOptions o;
  o.minibatch_size = 2;
  o.epochs = 3;
  o.epoch_size = 3;
  // Sweep end cuts a minibatch (CNTK's V1 behaviour).
  EXPECT_EQ(Plan(index, o), (std::vector<std::vector<uint64_t>>{{0, 1}, {2}, {3, 4}, {0}, {1, 2}, {3}}));
}

TEST(Planner, EpochStartsAtTheFirstSequenceAtOrAfterItsOffset) {
  // Lengths 2,2,2: epoch size 3 -> epoch 1 starts at sample 3, i.e. sequence 2 (starts at 4).
  Index index = MakeIndex({2, 2, 2}, 1000);
  PlannerOptions o;
  o.minibatch_size = 100;
  o.epochs = 2;
  o.epoch_size = 3;
  EXPECT_EQ(Plan(index, o), (std::vector<std::vector<uint64_t>>{{0, 1}, {2}}));
}

TEST(Planner, RefusesZeroMinibatch) {
  Index index = MakeIndex({1}, 10);
  PlannerOptions o;
  o.minibatch_size = 0;
  EXPECT_FALSE(Planner::Create(&index, o).ok());
}

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string data;
    for (int i = 0; i < 400; ++i) data += std::to_string(i) + " |a " + std::to_string(i) + "\n";
    file_ = dir_.Write("d.ctf", data);
  }
  // The fixture's 400 one-value sequences in chunks of about `chunk_bytes`.
  absl::StatusOr<std::unique_ptr<Dataset>> OpenInChunks(uint64_t chunk_bytes, bool keep = false) {
    DatasetConfig c = CtfDataset(file_, "{a: {dim: 1, format: dense}}");
    c.keep_data_in_memory = keep;
    c.deserializers[0].chunk_size_in_bytes = chunk_bytes;
    return Dataset::Open(c);
  }
  // A randomized read of `epochs` epochs in minibatches of `minibatch`, over a window of
  // `window` chunks.
  static LoaderOptions Randomized(uint64_t minibatch, uint64_t window, uint64_t epochs) {
    LoaderOptions lo;
    lo.planner.minibatch_size = minibatch;
    lo.planner.epochs = epochs;
    lo.planner.randomizer.randomize = true;
    lo.planner.randomizer.window = window;
    return lo;
  }
  uint64_t ParsedAfterEpochs(bool keep, uint64_t epochs, int threads) {
    auto ds = OpenInChunks(500, keep);
    EXPECT_TRUE(ds.ok());
    auto cpu = MakeCpuAssembler();
    LoaderOptions lo = Randomized(7, 3, epochs);
    lo.threads = threads;
    auto loader = Loader::Create(ds->get(), cpu.get(), lo);
    EXPECT_TRUE(loader.ok());
    Batch b;
    uint64_t samples = 0;
    while (true) {
      auto more = (*loader)->Next(&b);
      EXPECT_TRUE(more.ok()) << more.status();
      if (!more.ok() || !*more) break;
      samples += b.plan.num_samples;
    }
    EXPECT_EQ(samples, 400 * epochs);
    chunks_ = (*ds)->index().chunks.size();
    // The pipeline counts the parses it caused: the dataset's own count (one reader here),
    // once a parse started ahead and not used has ended.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while ((*loader)->pipeline().chunks_parsed() != (*ds)->parses() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ((*loader)->pipeline().chunks_parsed(), (*ds)->parses());
    return (*loader)->pipeline().chunks_parsed();
  }
  TempDir dir_;
  std::string file_;
  uint64_t chunks_ = 0;
};

TEST_F(LoaderTest, KeepDataInMemoryParsesEachChunkOnce) {
  const uint64_t parsed = ParsedAfterEpochs(true, 3, 2);
  EXPECT_EQ(parsed, chunks_);
  EXPECT_GT(chunks_, 5u);
}

TEST_F(LoaderTest, WithoutKeepEveryEpochParsesAgain) {
  const uint64_t parsed = ParsedAfterEpochs(false, 3, 2);
  // Every sweep parses each chunk again, except that a chunk the next sweep starts with may
  // still be held (or parsing) for the end of this one: the two share it. The window is 3
  // chunks: at most 3 shared at each of the 2 sweep boundaries.
  EXPECT_LE(parsed, 3 * chunks_);
  EXPECT_GE(parsed + 2 * 3, 3 * chunks_);
}

// Assembles nothing at Begin(): the whole batch is written when its fence is waited for,
// the latest moment the interface allows. Before writing, it checks that every chunk the
// batch reads is still the one the dataset holds (a loader that let a batch's chunks go
// before Complete() would have had them freed: the dataset would parse them anew).
class DeferredAssembler final : public BatchAssembler {
 public:
  explicit DeferredAssembler(const Dataset* dataset) : dataset_(dataset) {}
  const char* name() const override { return "deferred"; }
  absl::Status Assemble(const BatchPlan& plan, absl::Span<const PieceRef> pieces, absl::Span<std::byte> dst) override {
    return cpu_->Assemble(plan, pieces, dst);
  }
  absl::StatusOr<uint64_t> Begin(const BatchPlan& plan, absl::Span<const PieceRef> pieces,
                                 absl::Span<std::byte> dst) override {
    Job job{&plan, pieces, dst, {}};
    for (const PieceRef& p : pieces) job.chunks[p.chunk] = p.chunk->chunk_id;
    jobs_.push_back(std::move(job));
    return jobs_.size();
  }
  absl::Status Wait(uint64_t fence) override {
    const Job& j = jobs_.at(fence - 1);
    most_pending_ = std::max<uint64_t>(most_pending_, jobs_.size() - waited_);  // begun, not waited for
    waited_ = fence;
    for (const auto& [chunk, id] : j.chunks) {
      auto live = dataset_->SharedChunk(id);
      if (!live.ok() || live->get() != chunk) {
        return absl::InternalError(absl::StrCat("chunk ", id, " of batch ", fence, " was released before its Wait()"));
      }
    }
    return cpu_->Assemble(*j.plan, j.pieces, j.dst);
  }
  uint64_t most_pending() const { return most_pending_; }

 private:
  struct Job {
    const BatchPlan* plan;
    absl::Span<const PieceRef> pieces;
    absl::Span<std::byte> dst;
    std::map<const ParsedChunk*, uint64_t> chunks;  // read by the batch -> its id
  };
  const Dataset* const dataset_;
  std::unique_ptr<BatchAssembler> cpu_ = MakeCpuAssembler();
  std::vector<Job> jobs_;
  uint64_t waited_ = 0, most_pending_ = 0;
};

// Begin()/Complete() with up to `depth` batches in flight deliver exactly Next()'s batches,
// with the pipelined CPU assembler and with the deferred one, over many small chunks that
// come and go (no keepDataInMemory, a window of 2 chunks, one chunk parsed ahead).
// Every batch `loader` delivers by Next() into one Batch passed every time, as bytes (and,
// with `after`, each batch's cursor).
absl::StatusOr<std::vector<std::vector<std::byte>>> DrainNext(Loader* loader, std::vector<CursorState>* after = nullptr) {
  std::vector<std::vector<std::byte>> out;
  Batch b;
  while (true) {
    absl::StatusOr<bool> more = loader->Next(&b);
    if (!more.ok()) return more.status();
    if (!*more) return out;
    out.emplace_back(b.bytes.begin(), b.bytes.end());
    if (after != nullptr) after->push_back(b.after);
  }
}

// Every batch a loader over `ds` with `assembler` and `options` delivers, as bytes.
absl::StatusOr<std::vector<std::vector<std::byte>>> LoadAll(Dataset* ds, BatchAssembler* assembler,
                                                            const LoaderOptions& options) {
  auto loader = Loader::Create(ds, assembler, options);
  if (!loader.ok()) return loader.status();
  return DrainNext(loader->get());
}

// The loader hands each batch's plan arrays to the next plan: the pieces and counts of the
// Batch a caller passes back, and always the entry addresses of sparse streams, which the next
// plan overwrites (not cleared first). Every batch of a long read must be byte for byte the
// first batch of a new loader resumed just before it, whose plan reuses nothing; and a caller
// passing a fresh Batch each time gets the same. Sparse samples with entries, empty ones and
// absent ones (a piece with no sample of the stream, after pieces with some), in sequences
// of 1-3 samples, randomized; CSC, CSR and dense.
TEST(LoaderReuse, EveryBatchIsWhatALoaderResumedBeforeItAssembles) {
  TempDir dir;
  std::string data;
  for (int i = 0; i < 300; ++i) {
    for (int t = 0; t < 1 + i % 3; ++t) {
      data += std::to_string(i) + " |a " + std::to_string(i) + "." + std::to_string(t);
      if (i % 5 != 4) {  // every fifth sequence has no sample of `s`
        data += " |s";
        for (int k = 0; k < (i + t) % 4; ++k) data += " " + std::to_string((i * 7 + k * 13) % 50) + ":" + std::to_string(k + 1);
      }
      data += "\n";
    }
  }
  DatasetConfig c = CtfDataset(dir.Write("d.ctf", data), "{a: {dim: 1, format: dense}, s: {dim: 50, format: sparse}}");
  c.deserializers[0].chunk_size_in_bytes = 600;
  auto ds = Dataset::Open(c);
  ASSERT_TRUE(ds.ok()) << ds.status();
  for (OutputLayout layout : {OutputLayout::kNative, OutputLayout::kCsr, OutputLayout::kDense}) {
    SCOPED_TRACE(::testing::Message() << "layout " << OutputLayoutName(layout));
    LoaderOptions lo;
    lo.planner.minibatch_size = 11;
    lo.planner.epochs = 2;
    lo.planner.randomizer.randomize = true;
    lo.planner.randomizer.window = 3;
    lo.layouts = {OutputLayout::kNative, layout};
    auto cpu = MakeCpuAssembler();
    std::vector<CursorState> after;
    auto loader = Loader::Create(ds->get(), cpu.get(), lo);
    ASSERT_TRUE(loader.ok());
    auto reused = DrainNext(loader->get(), &after);
    ASSERT_TRUE(reused.ok()) << reused.status();
    loader = Loader::Create(ds->get(), cpu.get(), lo);
    ASSERT_TRUE(loader.ok());
    std::vector<std::vector<std::byte>> fresh;
    while (true) {
      Batch b;  // a new one each time
      auto more = (*loader)->Next(&b);
      ASSERT_TRUE(more.ok()) << more.status();
      if (!*more) break;
      fresh.emplace_back(b.bytes.begin(), b.bytes.end());
    }
    ASSERT_GT(reused->size(), 100u);
    ASSERT_EQ(fresh.size(), reused->size());
    for (size_t i = 0; i < fresh.size(); ++i) {
      LoaderOptions one = lo;
      if (i > 0) one.resume = after[i - 1];
      auto resumed = Loader::Create(ds->get(), cpu.get(), one);
      ASSERT_TRUE(resumed.ok()) << resumed.status();
      Batch b;
      auto more = (*resumed)->Next(&b);
      ASSERT_TRUE(more.ok() && *more) << "batch " << i;
      const std::vector<std::byte> want(b.bytes.begin(), b.bytes.end());
      ASSERT_EQ((*reused)[i], want) << "batch " << i;
      ASSERT_EQ(fresh[i], want) << "batch " << i;
    }
  }
}

TEST_F(LoaderTest, PipelinedBatchesAreTheSynchronousOnes) {
  auto ds = OpenInChunks(200);
  ASSERT_TRUE(ds.ok());
  ASSERT_GT((*ds)->index().chunks.size(), 20u);
  LoaderOptions lo = Randomized(9, 2, 2);
  lo.prefetch = 1;
  auto cpu = MakeCpuAssembler();
  auto loaded = LoadAll(ds->get(), cpu.get(), lo);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::vector<std::vector<std::byte>> want = std::move(*loaded);
  ASSERT_GT(want.size(), 80u);
  for (size_t depth : {1, 2, 3}) {
    for (bool deferred : {false, true}) {
      std::unique_ptr<BatchAssembler> assembler =
          deferred ? std::unique_ptr<BatchAssembler>(new DeferredAssembler(ds->get())) : MakePipelinedAssembler(MakeCpuAssembler());
      auto loader = Loader::Create(ds->get(), assembler.get(), lo);
      ASSERT_TRUE(loader.ok());
      std::deque<std::vector<std::byte>> buffers;  // one per batch in flight
      auto destination = [&](uint64_t bytes) -> absl::StatusOr<absl::Span<std::byte>> {
        buffers.emplace_back(bytes, std::byte{0xAB});
        return absl::MakeSpan(buffers.back());
      };
      std::vector<std::vector<std::byte>> got;
      absl::Status st = RunPipelined(loader->get(), depth, destination, [&](const Batch& b) {
        EXPECT_EQ(b.bytes.data(), buffers.front().data());
        got.emplace_back(b.bytes.begin(), b.bytes.end());
        buffers.pop_front();
        return absl::OkStatus();
      });
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_EQ(got.size(), want.size()) << "depth " << depth << (deferred ? ", deferred" : ", pipelined");
      for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
        ASSERT_EQ(got[i], want[i]) << "batch " << i << ", depth " << depth << (deferred ? ", deferred" : ", pipelined");
      }
      if (deferred) {
        EXPECT_EQ(static_cast<DeferredAssembler*>(assembler.get())->most_pending(), depth);
      }
      Batch b;
      EXPECT_EQ((*loader)->Complete(&b).code(), absl::StatusCode::kFailedPrecondition);
    }
  }
}

// Parser threads that help plan and assemble (every batch split, ranges of one piece: the
// CPU assembler's thresholds at their lowest, and PlanBatch's) deliver the bytes the
// assembler gives alone, by
// Next(), by RunPipelined with two batches in flight and by RunWithOwnBuffers, for any
// number of threads, and from a shared pool whose every thread helps, busy or not (a machine
// with cores to spare): dense, sparse as CSC, CSR and dense, in sequences.
TEST_F(LoaderTest, ParserThreadsHelpingToAssembleChangeNoByte) {
  std::string data;
  for (int i = 0; i < 300; ++i) {
    for (int t = 0; t <= i % 4; ++t) {
      data += std::to_string(i) + " |a " + std::to_string(i) + " " + std::to_string(t) + " |s " +
              std::to_string((i * 7 + t) % 50) + ":" + std::to_string(t + 1) + " " + std::to_string((i + t) % 50) + ":1\n";
    }
  }
  const std::string file = dir_.Write("seq.ctf", data);
  DatasetConfig c = CtfDataset(file, "{a: {dim: 2, format: dense}, s: {dim: 50, format: sparse}}");
  c.deserializers[0].chunk_size_in_bytes = 300;
  auto ds = Dataset::Open(c);
  ASSERT_TRUE(ds.ok()) << ds.status();
  for (OutputLayout layout : {OutputLayout::kNative, OutputLayout::kCsr, OutputLayout::kDense}) {
    SCOPED_TRACE(::testing::Message() << "layout " << OutputLayoutName(layout));
    LoaderOptions lo;
    lo.planner.minibatch_size = 40;
    lo.planner.epochs = 2;
    lo.planner.randomizer.randomize = true;
    lo.planner.randomizer.window = 3;
    lo.layouts = {OutputLayout::kNative, layout};
    auto alone = MakeCpuAssembler();  // batches this small stay on the loader's thread
    auto loaded = LoadAll(ds->get(), alone.get(), lo);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const std::vector<std::vector<std::byte>> want = std::move(*loaded);
    ASSERT_GT(want.size(), 20u);
    CpuAssemblerOptions split;
    split.min_parallel_bytes = 0;
    split.range_bytes = 1;
    for (int threads : {1, 2, 4}) {
      for (int way = 0; way < 4; ++way) {
        SCOPED_TRACE(::testing::Message() << threads << " threads, way " << way);
        lo.threads = threads;
        // Way 3: a shared pool on a machine of 64 cores, where all its threads help.
        std::unique_ptr<ParserPool> shared;
        if (way == 3) {
          shared = std::make_unique<ParserPool>(threads, /*cores=*/64);
          ASSERT_EQ(shared->available(), threads);
        }
        lo.pool = shared.get();
        lo.min_plan_range_pieces = 1;  // every batch's pieces placed in ranges too (the
                                       // assembler splits every batch: min_parallel_bytes 0)
        auto cpu = MakeCpuAssembler(split);
        auto loader = Loader::Create(ds->get(), cpu.get(), lo);
        ASSERT_TRUE(loader.ok());
        // One thread of its own is the caller's alone: no pool thread to help.
        EXPECT_EQ((*loader)->pipelined(), threads > 1 || way == 3);
        std::vector<std::vector<std::byte>> got;
        auto keep = [&](const Batch& b) {
          got.emplace_back(b.bytes.begin(), b.bytes.end());
          return absl::OkStatus();
        };
        if (way == 0) {
          auto drained = DrainNext(loader->get());
          ASSERT_TRUE(drained.ok()) << drained.status();
          got = std::move(*drained);
        } else if (way == 1) {
          std::deque<std::vector<std::byte>> buffers;
          auto destination = [&](uint64_t bytes) -> absl::StatusOr<absl::Span<std::byte>> {
            buffers.emplace_back(bytes, std::byte{0xCD});
            return absl::MakeSpan(buffers.back());
          };
          ASSERT_TRUE(RunPipelined(loader->get(), 2, destination, [&](const Batch& b) {
                        EXPECT_EQ(b.bytes.data(), buffers.front().data());
                        absl::Status st = keep(b);
                        buffers.pop_front();
                        return st;
                      }).ok());
        } else {
          ASSERT_TRUE(RunWithOwnBuffers(loader->get(), keep).ok());
        }
        loader->reset();  // before the shared pool it uses
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "batch " << i;
      }
    }
  }
}

// Next() refuses to run while batches begun are not completed (its buffer would be shared),
// and a loader destroyed with batches in flight waits for them.
TEST_F(LoaderTest, NextWaitsForNoneAndDestructionWaitsForAll) {
  DatasetConfig c = CtfDataset(file_, "{a: {dim: 1, format: dense}}");
  auto ds = Dataset::Open(c);
  ASSERT_TRUE(ds.ok());
  auto assembler = MakePipelinedAssembler(MakeCpuAssembler());
  LoaderOptions lo;
  lo.planner.minibatch_size = 50;
  auto loader = Loader::Create(ds->get(), assembler.get(), lo);
  ASSERT_TRUE(loader.ok());
  std::vector<std::vector<std::byte>> buffers(3);
  size_t used = 0;
  auto destination = [&](uint64_t bytes) -> absl::StatusOr<absl::Span<std::byte>> {
    buffers[used].assign(bytes, std::byte{0xAB});
    return absl::MakeSpan(buffers[used++]);
  };
  ASSERT_TRUE((*loader)->Begin(destination).ok());
  Batch b;
  EXPECT_EQ((*loader)->Next(&b).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*loader)->Begin(destination).ok());
  loader->reset();  // two batches in flight
  // Both were finished: they are the first two batches a synchronous loader gives.
  auto cpu = MakeCpuAssembler();
  auto sync = Loader::Create(ds->get(), cpu.get(), lo);
  ASSERT_TRUE(sync.ok());
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(*(*sync)->Next(&b));
    EXPECT_EQ(buffers[i], std::vector<std::byte>(b.bytes.begin(), b.bytes.end())) << "batch " << i;
  }
}

// Randomized reads over several sweeps finish, whatever the window, chunk count, seed,
// threads and parse-ahead: at a sweep's end the prefetcher may have parsed chunks the next
// batches do not use yet (a later position, the sweep after), filling the parse-ahead, while
// a batch waits on a chunk nobody had started; the chunk waited for must still be parsed.
// (Found reading a 268 MB sparse CTF file of 9 chunks, whole-file window, for 3 epochs: the
// read hung at the third sweep.) A watchdog cancels a loader that stalls, so a regression
// fails here instead of hanging.
TEST_F(LoaderTest, RandomizedSweepsNeverWaitOnAChunkNobodyParses) {
  int runs = 0;
  for (uint64_t chunk_size : {500, 800, 1000}) {
    auto ds = OpenInChunks(chunk_size);
    ASSERT_TRUE(ds.ok());
    const uint64_t n = (*ds)->index().chunks.size();
    ASSERT_GE(n, 4u);
    for (uint64_t window : {n + 100, n, n - 1, uint64_t{2}}) {
      for (uint64_t seed = 0; seed < 6; ++seed) {
        for (int threads : {1, 2}) {
          for (int prefetch : {0, 1}) {
            LoaderOptions lo = Randomized(16, window, 4);
            lo.planner.randomizer.seed = seed;
            lo.threads = threads;
            lo.prefetch = prefetch;
            auto cpu = MakeCpuAssembler();
            auto loader = Loader::Create(ds->get(), cpu.get(), lo);
            ASSERT_TRUE(loader.ok());
            std::atomic<bool> done{false};
            std::thread watchdog([&] {
              const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
              while (!done.load() && std::chrono::steady_clock::now() < deadline) {
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
              }
              if (!done.load()) (*loader)->Cancel();
            });
            uint64_t samples = 0;
            absl::Status st;
            Batch b;
            while (true) {
              absl::StatusOr<bool> more = (*loader)->Next(&b);
              if (!more.ok()) st = more.status();
              if (!more.ok() || !*more) break;
              samples += b.plan.num_samples;
            }
            done.store(true);
            watchdog.join();
            const std::string what = absl::StrCat(n, " chunks, window ", window, ", seed ", seed, ", ", threads,
                                                  " threads, prefetch ", prefetch);
            ASSERT_TRUE(st.ok()) << what << ": " << st << " after " << samples << " samples (stalled)";
            ASSERT_EQ(samples, 400u * 4) << what;
            ++runs;
          }
        }
      }
    }
  }
  EXPECT_EQ(runs, 3 * 4 * 6 * 2 * 2);
}

// The pipeline alone: with one chunk of parse-ahead taken by a chunk the consumer does not
// want yet, a Get() of a later ticket still gets its chunk parsed (and the earlier one stays
// there for its own Get()).
TEST_F(LoaderTest, PipelineParsesTheChunkWaitedForPastTheParseAhead) {
  auto ds = OpenInChunks(500);
  ASSERT_TRUE(ds.ok());
  ASSERT_GE((*ds)->index().chunks.size(), 3u);
  ChunkPipelineOptions po;
  po.threads = 1;
  po.prefetch = 1;
  ChunkPipeline pipeline(ds->get(), po);
  const uint64_t first = pipeline.Enqueue(0);
  const uint64_t second = pipeline.Enqueue(1);
  const uint64_t third = pipeline.Enqueue(2);
  // Let the first chunk be parsed ahead: it fills the parse-ahead.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (pipeline.chunks_parsed() < 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(pipeline.chunks_parsed(), 1u);
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    while (!done.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!done.load()) pipeline.Cancel();
  });
  auto got = pipeline.Get(third);
  done.store(true);
  watchdog.join();
  ASSERT_TRUE(got.ok()) << got.status() << " (the chunk waited for was never parsed)";
  EXPECT_EQ((*got)->chunk_id, 2u);
  auto early = pipeline.Get(first);
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_EQ((*early)->chunk_id, 0u);
  pipeline.Release(first);
  pipeline.Release(third);
  auto middle = pipeline.Get(second);
  ASSERT_TRUE(middle.ok()) << middle.status();
  EXPECT_EQ((*middle)->chunk_id, 1u);
}

// `threads` of a loader's own count its caller's thread: at 1 it alone parses (no pool
// thread; the pipeline submits nothing), at 2 and 3 no more than that many threads parse,
// and the batches are a shared pool's to the byte.
TEST_F(LoaderTest, ALoadersOwnThreadsCountItsCallers) {
  auto ds = OpenInChunks(300);
  ASSERT_TRUE(ds.ok());
  ASSERT_GT((*ds)->index().chunks.size(), 8u);
  LoaderOptions lo = Randomized(9, 3, 2);
  ParserPool shared(2, /*cores=*/0, /*shared=*/true);
  lo.pool = &shared;
  auto cpu = MakeCpuAssembler();
  auto want = LoadAll(ds->get(), cpu.get(), lo);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_GT(want->size(), 40u);
  lo.pool = nullptr;
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << threads << " threads");
    std::mutex mu;
    std::map<std::thread::id, int> parsers;
    lo.threads = threads;
    lo.admit_chunk = [&](uint64_t) {
      std::lock_guard<std::mutex> lock(mu);
      ++parsers[std::this_thread::get_id()];
      return absl::OkStatus();
    };
    auto loader = Loader::Create(ds->get(), cpu.get(), lo);
    ASSERT_TRUE(loader.ok());
    EXPECT_EQ((*loader)->pipeline().pool()->threads(), threads - 1);
    auto got = DrainNext(loader->get());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, *want);
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_LE(parsers.size(), static_cast<size_t>(threads));
    int parses = 0;
    for (const auto& [id, n] : parsers) parses += n;
    EXPECT_GE(parses, static_cast<int>((*ds)->index().chunks.size()));  // every chunk, each sweep
    if (threads == 1) {
      ASSERT_EQ(parsers.size(), 1u);
      EXPECT_EQ(parsers.begin()->first, std::this_thread::get_id());
    }
  }
}

// A pipeline whose consumer parses, with one thread: nothing is parsed until it waits, and
// then on its own thread, past the parse-ahead too.
TEST_F(LoaderTest, APipelineOfOneThreadParsesOnTheConsumersThread) {
  auto ds = OpenInChunks(500);
  ASSERT_TRUE(ds.ok());
  ASSERT_GE((*ds)->index().chunks.size(), 3u);
  std::mutex mu;
  std::vector<std::thread::id> parsers;
  ChunkPipelineOptions po;
  po.threads = 1;
  po.prefetch = 1;
  po.consumer_parses = true;
  po.admit = [&](uint64_t) {
    std::lock_guard<std::mutex> lock(mu);
    parsers.push_back(std::this_thread::get_id());
    return absl::OkStatus();
  };
  ChunkPipeline pipeline(ds->get(), po);
  EXPECT_EQ(pipeline.pool()->threads(), 0);
  const uint64_t first = pipeline.Enqueue(0);
  const uint64_t second = pipeline.Enqueue(1);
  const uint64_t third = pipeline.Enqueue(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(pipeline.chunks_parsed(), 0u);
  auto got = pipeline.Get(third);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->chunk_id, 2u);
  EXPECT_EQ(pipeline.chunks_parsed(), 1u);
  for (uint64_t t : {first, second}) {
    auto chunk = pipeline.Get(t);
    ASSERT_TRUE(chunk.ok()) << chunk.status();
    EXPECT_EQ((*chunk)->chunk_id, t);
  }
  EXPECT_EQ(pipeline.chunks_parsed(), 3u);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(parsers, std::vector<std::thread::id>(3, std::this_thread::get_id()));
}

// With a pool thread beside the consumer, the first chunk is still parsed alone (the first
// batch waits for it): whoever parses it, no other chunk starts until it is done, also when
// the consumer takes it before the job submitted for it runs. Repeated: who wins is timing.
TEST_F(LoaderTest, AConsumerThatParsesStillParsesTheFirstChunkAlone) {
  auto ds = OpenInChunks(500);
  ASSERT_TRUE(ds.ok());
  ASSERT_GE((*ds)->index().chunks.size(), 4u);
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    std::mutex mu;
    bool first_in = false, first_out = false, overlapped = false;
    ChunkPipelineOptions po;
    po.threads = 2;
    po.prefetch = 4;
    po.consumer_parses = true;
    po.admit = [&](uint64_t chunk) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (chunk == 0) first_in = true;
        else if (first_in && !first_out) overlapped = true;  // began while the first was parsed
      }
      if (chunk == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        std::lock_guard<std::mutex> lock(mu);
        first_out = true;
      }
      return absl::OkStatus();
    };
    ChunkPipeline pipeline(ds->get(), po);
    EXPECT_EQ(pipeline.pool()->threads(), 1);
    std::vector<uint64_t> tickets;
    for (uint64_t k = 0; k < 4; ++k) tickets.push_back(pipeline.Enqueue(k));
    for (uint64_t k = 0; k < 4; ++k) {
      auto chunk = pipeline.Get(tickets[k]);
      ASSERT_TRUE(chunk.ok()) << chunk.status();
      EXPECT_EQ((*chunk)->chunk_id, k);
      pipeline.Release(tickets[k]);
    }
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_FALSE(overlapped);
  }
}

TEST_F(LoaderTest, ParseErrorBeyondTheBudgetStopsTheLoader) {
  DatasetConfig c = CtfDataset(dir_.Write("bad.ctf", "1 |a 1\n2 |a 2\n3 |a ?\n"), "{a: {dim: 1, format: dense}}");
  auto ds = Dataset::Open(c);
  ASSERT_TRUE(ds.ok());
  auto cpu = MakeCpuAssembler();
  LoaderOptions lo;
  lo.planner.minibatch_size = 1;
  auto loader = Loader::Create(ds->get(), cpu.get(), lo);
  ASSERT_TRUE(loader.ok());
  Batch b;
  auto first = (*loader)->Next(&b);
  ASSERT_FALSE(first.ok());  // the chunk holding all three fails as a whole
  EXPECT_NE(first.status().message().find("bad.ctf:3:6: unexpected '?'"), std::string::npos) << first.status();
}

}  // namespace
}  // namespace conveyor::testing

namespace conveyor::testing {
namespace {

TEST(SharedChunks, TwoReadersOfOneStreamParseEachChunkOnce) {
  TempDir dir;
  std::string data;
  for (int i = 0; i < 2000; ++i) data += std::to_string(i) + " |a " + std::to_string(i) + "\n";
  DatasetConfig c = CtfDataset(dir.Write("d.ctf", data), "{a: {dim: 1, format: dense}}",
                               "randomize: true\n    randomizationWindow: 4");
  c.deserializers[0].chunk_size_in_bytes = 1000;
  auto ds = Dataset::Open(c);
  ASSERT_TRUE(ds.ok());
  auto cpu = MakeCpuAssembler();
  LoaderOptions lo;
  lo.planner.minibatch_size = 32;
  lo.planner.randomizer.randomize = true;
  lo.planner.randomizer.window = 4;
  auto a = Loader::Create(ds->get(), cpu.get(), lo);
  auto b = Loader::Create(ds->get(), cpu.get(), lo);
  ASSERT_TRUE(a.ok() && b.ok());
  Batch x, y;
  uint64_t batches = 0;
  while (true) {  // in lockstep, as two workers of one job would be
    auto ma = (*a)->Next(&x);
    auto mb = (*b)->Next(&y);
    ASSERT_TRUE(ma.ok() && mb.ok());
    ASSERT_EQ(*ma, *mb);
    if (!*ma) break;
    ASSERT_EQ(x.plan.pieces.size(), y.plan.pieces.size());
    ++batches;
  }
  EXPECT_GT(batches, 50u);
  EXPECT_EQ((*ds)->parses(), (*ds)->index().chunks.size());
}

// Reader b runs 10 batches (several chunks) behind reader a, as a rank or DataLoader worker
// a few batches late would. Without retention every chunk a let go of before b came is
// parsed again; with retention each chunk is parsed once; dropping retention frees them.
TEST(SharedChunks, RetainedChunksServeAReaderSeveralChunksBehind) {
  TempDir dir;
  std::string data;
  for (int i = 0; i < 2000; ++i) data += std::to_string(i) + " |a " + std::to_string(i) + "\n";
  DatasetConfig c = CtfDataset(dir.Write("d.ctf", data), "{a: {dim: 1, format: dense}}", "randomize: false");
  c.deserializers[0].chunk_size_in_bytes = 1000;
  auto cpu = MakeCpuAssembler();
  LoaderOptions lo;
  lo.planner.minibatch_size = 32;
  for (bool retain : {false, true}) {
    SCOPED_TRACE(retain ? "retained" : "not retained");
    auto ds = Dataset::Open(c);
    ASSERT_TRUE(ds.ok());
    if (retain) (*ds)->SetRetainedBytes(uint64_t{64} << 20);
    auto a = Loader::Create(ds->get(), cpu.get(), lo);
    auto b = Loader::Create(ds->get(), cpu.get(), lo);
    ASSERT_TRUE(a.ok() && b.ok());
    Batch x, y;
    int step = 0;
    bool a_more = true, b_more = true;
    while (a_more || b_more) {
      if (a_more) {
        auto m = (*a)->Next(&x);
        ASSERT_TRUE(m.ok());
        a_more = *m;
      }
      if (b_more && (step >= 10 || !a_more)) {
        auto m = (*b)->Next(&y);
        ASSERT_TRUE(m.ok());
        b_more = *m;
      }
      ++step;
    }
    const uint64_t chunks = (*ds)->index().chunks.size();
    ASSERT_GT(chunks, 20u);
    if (retain) {
      EXPECT_EQ((*ds)->parses(), chunks);
      EXPECT_GT((*ds)->retained_bytes(), 0u);
      EXPECT_EQ((*ds)->DropRetained(~uint64_t{0}) > 0, true);
      EXPECT_EQ((*ds)->retained_bytes(), 0u);
      EXPECT_EQ((*ds)->resident_chunks(), 0u);  // nothing held once no reader holds it
    } else {
      EXPECT_GT((*ds)->parses(), chunks + chunks / 2);  // b re-parsed most of them
    }
  }
}

}  // namespace
}  // namespace conveyor::testing

namespace conveyor::testing {
namespace {

TEST(ParserPool, RunsEveryJobOnAtMostItsThreads) {
  std::atomic<int> running{0}, most{0}, done{0};
  {
    ParserPool pool(2);
    for (int i = 0; i < 12; ++i) {
      pool.Submit([&] {
        const int now = ++running;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        --running;
        ++done;
      });
    }
  }  // the destructor runs what was submitted
  EXPECT_EQ(done.load(), 12);
  EXPECT_EQ(most.load(), 2);
}

TEST(ParserPool, APoolOfNoThreadRunsWhatItIsGivenOnTheCaller) {
  ParserPool pool(0);
  EXPECT_EQ(pool.threads(), 0);
  EXPECT_EQ(pool.idle(), 0);
  EXPECT_EQ(pool.available(), 0);
  std::thread::id ran;
  pool.Submit([&] { ran = std::this_thread::get_id(); });
  EXPECT_EQ(ran, std::this_thread::get_id());
  ran = std::thread::id();
  pool.Help([&] { ran = std::this_thread::get_id(); });
  EXPECT_EQ(ran, std::this_thread::get_id());
}

// Jobs that hold their pool thread until released.
struct Blocker {
  std::atomic<bool> release{false};
  std::atomic<int> started{0};
  std::function<void()> Job() {
    return [this] {
      ++started;
      while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    };
  }
  void WaitStarted(int n) {
    while (started.load() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
};

// The threads a pool offers an assembler: all of them where the process has a core for each
// and two more (busy ones take their ranges when done), else only those idle now.
TEST(ParserPool, OffersBusyThreadsToAssembleOnlyWithCoresToSpare) {
  Blocker b;
  ParserPool roomy(2, /*cores=*/4), tight(2, /*cores=*/3);
  EXPECT_EQ(roomy.available(), 2);
  EXPECT_EQ(tight.available(), 2);  // both idle
  roomy.Submit(b.Job());
  tight.Submit(b.Job());
  b.WaitStarted(2);
  EXPECT_EQ(roomy.available(), 2);
  EXPECT_EQ(roomy.unowed(), 1);  // (the plan's ranges, joined at once, skip a parsing thread)
  EXPECT_EQ(tight.available(), 1);
  EXPECT_EQ(tight.unowed(), 1);
  EXPECT_EQ(tight.idle(), 1);
  b.release = true;
}

// A thread busy assembling (a Help() job) is offered for the next batch even where cores are
// short: it takes that batch's ranges next, the jobs running in order. A queued parse job is
// owed a thread; a queued assembly job is not.
TEST(ParserPool, OffersThreadsBusyAssemblingButNotThoseOwedAChunk) {
  {
    Blocker b;
    ParserPool tight(2, /*cores=*/2);
    tight.Help(b.Job());
    b.WaitStarted(1);
    EXPECT_EQ(tight.idle(), 1);
    EXPECT_EQ(tight.available(), 2);  // the busy one assembles: it is the next batch's too
    tight.Help(b.Job());
    b.WaitStarted(2);
    EXPECT_EQ(tight.idle(), 0);
    EXPECT_EQ(tight.available(), 2);
    EXPECT_EQ(tight.unowed(), 2);
    tight.Help([] {});  // an assembly job queued: no thread is owed to it
    EXPECT_EQ(tight.available(), 2);
    EXPECT_EQ(tight.queued(), 0u);  // (the metrics count parses only)
    EXPECT_EQ(tight.busy(), 0u);
    tight.Submit([] {});  // a parse job queued behind them: one thread is owed to it
    EXPECT_EQ(tight.available(), 1);
    EXPECT_EQ(tight.queued(), 1u);
    tight.Submit([] {});
    EXPECT_EQ(tight.available(), 0);
    tight.Submit([] {});
    EXPECT_EQ(tight.available(), 0);  // (never below none)
    b.release = true;
  }  // the pool (declared after the blocker) runs the parse jobs and goes first
  Blocker b;
  ParserPool one(1, /*cores=*/2);
  one.Submit(b.Job());
  b.WaitStarted(1);
  EXPECT_EQ(one.available(), 0);  // parsing
  EXPECT_EQ(one.busy(), 1u);
  EXPECT_EQ(one.queued(), 0u);
  b.release = true;
  while (one.busy() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(one.available(), 1);  // done: the parse job no longer counts
}

// Several loaders (different seeds) share a one-thread pool: each still delivers exactly
// what it delivers alone, and a loader destroyed mid-epoch leaves the others running.
TEST(ParserPool, LoadersSharingOneThreadDeliverWhatTheyDeliverAlone) {
  TempDir dir;
  std::string data;
  for (int i = 0; i < 1500; ++i) data += std::to_string(i) + " |a " + std::to_string(i) + "\n";
  DatasetConfig c = CtfDataset(dir.Write("d.ctf", data), "{a: {dim: 1, format: dense}}");
  c.deserializers[0].chunk_size_in_bytes = 1000;
  auto ds = Dataset::Open(c);
  ASSERT_TRUE(ds.ok());
  auto cpu = MakeCpuAssembler();
  auto options = [](uint64_t seed, ParserPool* pool) {
    LoaderOptions lo;
    lo.planner.minibatch_size = 16;
    lo.planner.randomizer.randomize = true;
    lo.planner.randomizer.window = 3;
    lo.planner.randomizer.seed = seed;
    lo.threads = 2;
    lo.pool = pool;
    return lo;
  };
  auto keys_of = [](Loader* l, size_t max_batches) {
    std::vector<uint64_t> keys;
    Batch b;
    for (size_t n = 0; n < max_batches; ++n) {
      auto more = l->Next(&b);
      EXPECT_TRUE(more.ok()) << more.status();
      if (!more.ok() || !*more) break;
      for (const PlacedPiece& p : b.plan.pieces) keys.push_back(p.key);
    }
    return keys;
  };
  std::vector<std::vector<uint64_t>> alone;
  for (uint64_t seed = 0; seed < 3; ++seed) {
    auto l = Loader::Create(ds->get(), cpu.get(), options(seed, nullptr));
    ASSERT_TRUE(l.ok());
    alone.push_back(keys_of(l->get(), SIZE_MAX));
    ASSERT_EQ(alone.back().size(), 1500u);
  }
  ParserPool pool(1);
  std::vector<std::unique_ptr<Loader>> shared;
  for (uint64_t seed = 0; seed < 4; ++seed) {
    auto l = Loader::Create(ds->get(), cpu.get(), options(seed % 3, &pool));
    ASSERT_TRUE(l.ok());
    shared.push_back(std::move(*l));
  }
  std::vector<std::vector<uint64_t>> got(4);
  for (bool any = true; any;) {  // round robin, a few batches each
    any = false;
    for (size_t i = 0; i < shared.size(); ++i) {
      if (!shared[i]) continue;
      auto keys = keys_of(shared[i].get(), 3);
      got[i].insert(got[i].end(), keys.begin(), keys.end());
      if (i == 3 && got[i].size() > 100) shared[i].reset();  // a subscriber goes away mid-epoch
      else if (!keys.empty()) any = true;
    }
  }
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(got[i], alone[i]) << "loader " << i;
}

}  // namespace
}  // namespace conveyor::testing
