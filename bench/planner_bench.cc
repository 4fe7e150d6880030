// Planning costs on a synthetic index of 4M sequences in 1000 chunks (no parsing): units
// planned per second, and what a resume costs at the first and at the last minibatch of an
// epoch (a seek is O(window), not O(position)). Run: build/bench/planner_bench
#include <benchmark/benchmark.h>

#include <optional>

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

BENCHMARK(BM_PlanEpoch)->Unit(benchmark::kMillisecond)->Iterations(1);
BENCHMARK(BM_ResumeAtFirstBatch)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ResumeAtMiddleBatch)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ResumeAtLastBatch)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace conveyor::bench

BENCHMARK_MAIN();
