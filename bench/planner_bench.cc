// Planning costs on a synthetic index of 4M sequences in 1000 chunks (no parsing): units
// planned per second, and what a resume costs at the first and at the last minibatch of an
// epoch (a seek is O(window), not O(position)). Also the sort of one segment of a sweep
// (SortSegment: keys of 40 random bits, as a 128-chunk window gives) at 4K, 64K and 1M
// units, the last a whole-sweep window's segment; its reference is std::sort of the same
// keys alone, in the same run. Run: build/bench/planner_bench
#include <benchmark/benchmark.h>

#include <algorithm>
#include <optional>
#include <random>
#include <vector>

#include "common/sampling/cursor.h"
#include "common/sampling/planner.h"

namespace conveyor::bench {
namespace {

const Index& BigIndex() {
  static const Index index = [] {
    Index i;
    const uint64_t n = 4000000;
    i.sequences.resize(n);
    for (uint64_t s = 0; s < n; ++s) i.sequences[s] = {s, s * 100, s, 100, 1 + static_cast<uint32_t>(s % 3)};
    i.BuildChunks(400000);  // 4000 sequences a chunk
    return i;
  }();
  return index;
}

PlannerOptions Options() {
  PlannerOptions o;
  o.minibatch_size = 256;
  o.randomizer.randomize = true;
  o.randomizer.seed = 1;
  o.randomizer.window = 128;
  return o;
}

// Cursor states after the first, the middle and the next-to-last minibatch of epoch 0.
struct Positions {
  CursorState first, middle, last;
};
const Positions& Cursors() {
  static const Positions c = [] {
    auto p = Planner::Create(&BigIndex(), Options());
    std::vector<CursorState> all;
    while (auto b = (*p)->Next()) all.push_back(b->after);
    return Positions{all.front(), all[all.size() / 2], all[all.size() - 2]};
  }();
  return c;
}

void BM_PlanEpoch(benchmark::State& state) {
  uint64_t units = 0;
  for (auto _ : state) {
    auto p = Planner::Create(&BigIndex(), Options());
    while (auto b = (*p)->Next()) units += b->pieces.size();
  }
  state.SetItemsProcessed(units);
}

void Resume(benchmark::State& state, const CursorState& at) {
  const std::string token = [&] {
    Cursor c;
    c.state = at;
    return EncodeCursor(c);
  }();
  for (auto _ : state) {
    auto cursor = DecodeCursor(token);
    auto p = Planner::Create(&BigIndex(), Options());
    (void)(*p)->Seek(cursor->state);
    auto b = (*p)->Next();
    benchmark::DoNotOptimize(b);
  }
}
void BM_ResumeAtFirstBatch(benchmark::State& s) { Resume(s, Cursors().first); }
void BM_ResumeAtMiddleBatch(benchmark::State& s) { Resume(s, Cursors().middle); }
void BM_ResumeAtLastBatch(benchmark::State& s) { Resume(s, Cursors().last); }

// `n` keys of 40 random bits and their units (sequence j), fixed by the seed.
struct SegmentInput {
  std::vector<uint64_t> keys;
  std::vector<Unit> units;
};
SegmentInput MakeSegment(size_t n) {
  std::mt19937_64 rng(7);
  SegmentInput in;
  in.keys.resize(n);
  in.units.resize(n);
  for (size_t j = 0; j < n; ++j) {
    in.keys[j] = rng() >> 24;
    in.units[j].sequence = j;
    in.units[j].samples = 1;
  }
  return in;
}

void BM_SortSegment(benchmark::State& state) {
  const SegmentInput in = MakeSegment(static_cast<size_t>(state.range(0)));
  HugeVector<Unit> out;
  for (auto _ : state) {
    out.clear();
    SortSegment(in.keys, in.units, &out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

// Reference: std::sort of the keys alone (8 bytes an item, no units carried).
void BM_SortKeysStdSort(benchmark::State& state) {
  const SegmentInput in = MakeSegment(static_cast<size_t>(state.range(0)));
  std::vector<uint64_t> keys;
  for (auto _ : state) {
    keys = in.keys;
    std::sort(keys.begin(), keys.end());
    benchmark::DoNotOptimize(keys.data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

BENCHMARK(BM_PlanEpoch)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_ResumeAtFirstBatch)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ResumeAtMiddleBatch)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ResumeAtLastBatch)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SortSegment)->Arg(1 << 12)->Arg(1 << 16)->Arg(1 << 20)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SortKeysStdSort)->Arg(1 << 12)->Arg(1 << 16)->Arg(1 << 20)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace conveyor::bench

BENCHMARK_MAIN();
