// ParseStreamResponse (proto/inline_wire.h): whatever the bytes and however gRPC cut them
// into slices, the message it gives (with the inline part put back as the payload's data)
// is protobuf's, and it fails exactly where protobuf fails.
#include "proto/inline_wire.h"

#include <random>
#include <string>
#include <vector>

#include "google/protobuf/stubs/logging.h"
#include "gtest/gtest.h"

namespace conveyor {
namespace {

grpc::ByteBuffer Cut(const std::string& bytes, const std::vector<size_t>& cuts) {
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (size_t c : cuts) {
    if (c < at || c > bytes.size()) continue;
    slices.emplace_back(bytes.data() + at, c - at);
    at = c;
  }
  slices.emplace_back(bytes.data() + at, bytes.size() - at);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// Parses `bytes` cut at `cuts` both ways and compares; returns whether the part was split off.
bool SameAsProtobuf(const std::string& bytes, const std::vector<size_t>& cuts) {
  v1::StreamResponse expected;
  const bool parses = expected.ParseFromString(bytes);
  v1::StreamResponse got;
  SlicePart part;
  bool split = false;
  const bool ok = ParseStreamResponse(Cut(bytes, cuts), &got, &part, &split);
  EXPECT_EQ(ok, parses);
  if (!ok || !parses) return false;
  if (split) {
    std::string data;
    part.AppendTo(&data);
    EXPECT_EQ(data.size(), part.size());
    v1::InlinePayload* p = got.has_batch() ? got.mutable_batch()->mutable_payload() : got.mutable_more()->mutable_payload();
    EXPECT_TRUE(p->data().empty());
    p->set_data(data);
  }
  EXPECT_EQ(got.SerializeAsString(), expected.SerializeAsString());
  return split;
}

std::string Batch(size_t bytes, uint64_t offset) {
  v1::StreamResponse m;
  v1::BatchDescriptor* d = m.mutable_batch();
  d->set_serial(12);
  d->set_cursor("cursor");
  d->set_total_bytes(bytes);
  for (int i = 0; i < 50; ++i) d->mutable_pieces()->add_key(i * 1000);
  std::string data(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(i * 31 + 1);
  d->mutable_payload()->set_data(data);
  d->mutable_payload()->set_offset(offset);
  d->set_parts(2);
  return m.SerializeAsString();
}

std::string More(size_t bytes, uint64_t offset) {
  v1::StreamResponse m;
  m.mutable_more()->set_serial(3);
  m.mutable_more()->mutable_payload()->set_data(std::string(bytes, 'x'));
  m.mutable_more()->mutable_payload()->set_offset(offset);
  return m.SerializeAsString();
}

TEST(InlineWire, TheDaemonsPartsAreSplitWhereverTheSlicesAreCut) {
  for (const std::string& bytes : {Batch(300, 0), Batch(1, 0), More(200, 1 << 20), More(1, 5)}) {
    EXPECT_TRUE(SameAsProtobuf(bytes, {}));
    for (size_t a = 0; a <= bytes.size(); a += 7) {
      EXPECT_TRUE(SameAsProtobuf(bytes, {a}));
      EXPECT_TRUE(SameAsProtobuf(bytes, {a, a + 1, a + 13}));
    }
  }
}

TEST(InlineWire, AMultiSlicePartIsCountedAndOneSliceIsNot) {
  const std::string bytes = More(1000, 0);
  SlicePart part;
  v1::StreamResponse m;
  bool split = false;
  ASSERT_TRUE(ParseStreamResponse(Cut(bytes, {}), &m, &part, &split));
  ASSERT_TRUE(split);
  EXPECT_EQ(part.slices_spanned(), 1u);
  ASSERT_TRUE(ParseStreamResponse(Cut(bytes, {500}), &m, &part, &split));
  EXPECT_EQ(part.slices_spanned(), 2u);
}

TEST(InlineWire, OtherMessagesAreProtobufsWhole) {
  v1::StreamResponse end;
  end.mutable_end()->set_cursor("c");
  EXPECT_FALSE(SameAsProtobuf(end.SerializeAsString(), {1}));
  v1::StreamResponse empty_part;  // no data: nothing to split
  empty_part.mutable_more()->mutable_payload()->set_offset(3);
  EXPECT_FALSE(SameAsProtobuf(empty_part.SerializeAsString(), {}));
  // The payload twice (protobuf merges them), the data twice (the last wins), two kinds
  // (the last wins): protobuf decides.
  const std::string a = Batch(10, 0), b = More(20, 0);
  EXPECT_FALSE(SameAsProtobuf(a + b, {}));
  EXPECT_FALSE(SameAsProtobuf(b + b, {3}));
  v1::StreamResponse twice;
  twice.mutable_more()->set_serial(1);
  std::string inner = twice.more().SerializeAsString();
  v1::InlinePayload p1, p2;
  p1.set_data("first");
  p2.set_data("second");
  const std::string payload1 = p1.SerializeAsString(), payload2 = p2.SerializeAsString();
  std::string more = inner + '\x12' + static_cast<char>(payload1.size()) + payload1 + '\x12' +
                     static_cast<char>(payload2.size()) + payload2;
  EXPECT_FALSE(SameAsProtobuf(std::string("\x12") + static_cast<char>(more.size()) + more, {}));
  const std::string both = payload1 + payload2;
  more = inner + '\x12' + static_cast<char>(both.size()) + both;
  EXPECT_FALSE(SameAsProtobuf(std::string("\x12") + static_cast<char>(more.size()) + more, {}));
}

TEST(InlineWire, DamagedBytesParseAsProtobufSays) {
  google::protobuf::LogSilencer quiet;  // protobuf logs the invalid UTF-8 it refuses
  std::mt19937 rng(19);
  const std::vector<std::string> seeds = {Batch(40, 0), More(30, 77), Batch(200, 0)};
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = seeds[i % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % bytes.size();
      switch (rng() % 3) {
        case 0:
          bytes[at] = static_cast<char>(rng());
          break;
        case 1:
          bytes.erase(at, 1 + rng() % 4);
          break;
        default:
          bytes.insert(at, 1, static_cast<char>(rng()));
          break;
      }
      if (bytes.empty()) bytes = "x";
    }
    const size_t cut = rng() % (bytes.size() + 1);
    SameAsProtobuf(bytes, {cut});
    if (HasFailure()) {
      ADD_FAILURE() << "case " << i;
      return;
    }
  }
}

}  // namespace
}  // namespace conveyor
