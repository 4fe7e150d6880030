#include "common/sampling/cursor.h"

#include "absl/strings/str_cat.h"
#include "common/hash.h"

namespace conveyor {
namespace {

constexpr uint64_t kVersion = 1;
constexpr std::string_view kPrefix = "cv1.";
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

struct Hasher {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  void Add(uint64_t v) { h = Mix64(h, v); }
  void Add(std::string_view s) {
    Add(s.size());
    for (char c : s) Add(static_cast<unsigned char>(c));
  }
};

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

bool GetVarint(std::string_view* in, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (in->empty()) return false;
    const uint8_t b = static_cast<uint8_t>(in->front());
    in->remove_prefix(1);
    *v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

uint32_t Check(std::string_view bytes) {
  Hasher h;
  for (char c : bytes) h.Add(static_cast<unsigned char>(c));
  return static_cast<uint32_t>(h.h ^ (h.h >> 32));
}

}  // namespace

uint64_t IndexHash(const Index& index) {
  // Every field of every record (key, offset, line, size, samples), and the chunking.
  uint64_t h = index.content_hash;
  for (const ChunkEntry& c : index.chunks) h = Mix64(h, c.num_sequences);
  return h;
}

uint64_t StreamConfigHash(const DatasetConfig& dataset, const PlannerOptions& o) {
  Hasher h;
  for (const StreamConfig& s : dataset.AllStreams()) {
    h.Add(s.name);
    h.Add(s.alias);
    h.Add(static_cast<uint64_t>(s.format));
    h.Add(s.dim);
    h.Add(s.defines_mb_size);
  }
  h.Add(static_cast<uint64_t>(dataset.precision));
  for (const DeserializerConfig& d : dataset.deserializers) {
    h.Add(d.chunk_size_in_bytes);
    h.Add(d.skip_sequence_ids);
  }
  h.Add(o.minibatch_size);
  h.Add(o.epoch_size.value_or(0));
  h.Add(o.randomizer.randomize);
  h.Add(o.randomizer.randomize ? o.randomizer.window : 0);
  h.Add(o.randomizer.sample_window);
  h.Add(o.randomizer.frame_mode);
  h.Add(o.full_minibatches);
  h.Add(o.truncation);
  h.Add(o.truncation > 0 ? o.parallel : 0);
  // Not the distribution: a cursor stands between global minibatches, and either policy
  // partitions the rest anew (as an elastic resume does), every unit delivered once.
  return h.h;
}

std::string EncodeCursor(const Cursor& c) {
  std::string raw;
  PutVarint(kVersion, &raw);
  PutVarint(c.data_hash, &raw);
  PutVarint(c.config_hash, &raw);
  PutVarint(c.seed, &raw);
  PutVarint(c.rank, &raw);
  PutVarint(c.world, &raw);
  const CursorState& s = c.state;
  for (uint64_t v : {s.epoch, s.batch, s.sweep, s.segment, s.offset, s.sample_in_sweep}) PutVarint(v, &raw);
  PutVarint(s.slots.size(), &raw);
  for (const auto& slot : s.slots) {
    PutVarint(slot.active ? slot.sequence + 1 : 0, &raw);
    if (slot.active) PutVarint(slot.offset, &raw);
  }
  const uint32_t check = Check(raw);
  for (int i = 0; i < 4; ++i) raw.push_back(static_cast<char>((check >> (8 * i)) & 0xff));
  std::string out(kPrefix);
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char b : raw) {
    acc = (acc << 8) | b;
    bits += 8;
    while (bits >= 6) {
      out.push_back(kAlphabet[(acc >> (bits - 6)) & 63]);
      bits -= 6;
    }
  }
  if (bits > 0) out.push_back(kAlphabet[(acc << (6 - bits)) & 63]);
  return out;
}

absl::StatusOr<Cursor> DecodeCursor(std::string_view token) {
  auto bad = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("cursor is not valid: ", why));
  };
  if (token.size() > 4096) return bad("longer than any cursor");
  if (token.substr(0, 2) == "cv" && token.substr(0, kPrefix.size()) != kPrefix) {
    return bad("made by another version of conveyor (expected a 'cv1.' token)");
  }
  if (token.substr(0, kPrefix.size()) != kPrefix) return bad("expected a token starting with 'cv1.'");
  token.remove_prefix(kPrefix.size());
  std::string raw;
  uint32_t acc = 0;
  int bits = 0;
  for (char ch : token) {
    const char* p = std::char_traits<char>::find(kAlphabet, 64, ch);
    if (p == nullptr) return bad(absl::StrCat("unexpected character '", std::string(1, ch), "'"));
    acc = (acc << 6) | static_cast<uint32_t>(p - kAlphabet);
    bits += 6;
    if (bits >= 8) {
      raw.push_back(static_cast<char>((acc >> (bits - 8)) & 0xff));
      bits -= 8;
    }
  }
  if (raw.size() < 5) return bad("truncated");
  uint32_t check = 0;
  for (int i = 0; i < 4; ++i) check |= static_cast<uint32_t>(static_cast<uint8_t>(raw[raw.size() - 4 + i])) << (8 * i);
  std::string_view body(raw.data(), raw.size() - 4);
  if (Check(body) != check) return bad("corrupt or truncated (check failed)");
  Cursor c;
  uint64_t version, rank, world, nslots;
  CursorState& s = c.state;
  if (!GetVarint(&body, &version)) return bad("truncated");
  if (version != kVersion) return bad(absl::StrCat("version ", version, ", expected ", kVersion));
  if (!GetVarint(&body, &c.data_hash) || !GetVarint(&body, &c.config_hash) || !GetVarint(&body, &c.seed) ||
      !GetVarint(&body, &rank) || !GetVarint(&body, &world) || !GetVarint(&body, &s.epoch) ||
      !GetVarint(&body, &s.batch) || !GetVarint(&body, &s.sweep) || !GetVarint(&body, &s.segment) ||
      !GetVarint(&body, &s.offset) || !GetVarint(&body, &s.sample_in_sweep) || !GetVarint(&body, &nslots)) {
    return bad("truncated");
  }
  if (world == 0 || world > (1u << 20) || rank >= world) return bad("rank/world out of range");
  if (nslots > (1u << 20)) return bad("too many BPTT slots");
  c.rank = static_cast<uint32_t>(rank);
  c.world = static_cast<uint32_t>(world);
  s.slots.resize(nslots);
  for (auto& slot : s.slots) {
    uint64_t seq, off = 0;
    if (!GetVarint(&body, &seq)) return bad("truncated");
    slot.active = seq != 0;
    if (slot.active) {
      if (!GetVarint(&body, &off) || off > UINT32_MAX) return bad("truncated");
      slot.sequence = seq - 1;
      slot.offset = static_cast<uint32_t>(off);
    }
  }
  if (!body.empty()) return bad("trailing bytes");
  return c;
}

}  // namespace conveyor
