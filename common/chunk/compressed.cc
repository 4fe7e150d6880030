#include "common/chunk/compressed.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>

namespace conveyor {
namespace {

constexpr uint32_t kMaxCodecs = 16;  // tag 0 is "none"

struct Codecs {
  std::mutex mu;  // serializes registration; lookups read entries published by `count`
  std::array<CompressedCodec, kMaxCodecs> entries;
  std::atomic<uint32_t> count{1};
};

Codecs& Registry() {
  static Codecs* codecs = new Codecs;
  return *codecs;
}

}  // namespace

uint32_t RegisterCompressedCodec(const CompressedCodec& codec) {
  Codecs& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const uint32_t tag = r.count.load();
  if (tag >= kMaxCodecs) std::abort();  // a programming error: formats register once each
  r.entries[tag] = codec;
  r.count.store(tag + 1, std::memory_order_release);
  return tag;
}

const CompressedCodec& FindCompressedCodec(uint32_t tag) {
  Codecs& r = Registry();
  if (tag == 0 || tag >= r.count.load(std::memory_order_acquire)) std::abort();  // not from RegisterCompressedCodec
  return r.entries[tag];
}

}  // namespace conveyor
