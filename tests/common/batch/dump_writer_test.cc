// The dump writer's JSON strings: keys are bytes (Kaldi and HTK utterance ids need not be
// UTF-8), and the dump is always valid UTF-8 JSON. Valid UTF-8 passes through unchanged; a
// byte that is not part of a valid UTF-8 sequence is written as \udcXX, Python's
// surrogateescape (PEP 383) code point for it, so that the bytes can be had back
// (json.loads(line)["key"].encode("utf-8", "surrogateescape")).
#include "common/batch/dump_writer.h"

#include <string>

#include "gtest/gtest.h"

namespace conveyor::testing {
namespace {

std::string Escaped(const std::string& s) {
  std::string out;
  AppendJsonStringBody(s, &out);
  return out;
}

TEST(DumpWriter, ValidUtf8KeysAreWrittenUnchanged) {
  EXPECT_EQ(Escaped("spk01-utt0001"), "spk01-utt0001");
  EXPECT_EQ(Escaped("m\xc3\xbcller"), "m\xc3\xbcller");             // U+00FC, 2 bytes
  EXPECT_EQ(Escaped("\xe2\x82\xac 5"), "\xe2\x82\xac 5");           // U+20AC, 3 bytes
  EXPECT_EQ(Escaped("\xf0\x9f\x8e\xa4"), "\xf0\x9f\x8e\xa4");       // U+1F3A4, 4 bytes
  EXPECT_EQ(Escaped("\xf4\x8f\xbf\xbf"), "\xf4\x8f\xbf\xbf");       // U+10FFFF, the last
  EXPECT_EQ(Escaped("a\"b\\c\x01\x7f"), "a\\\"b\\\\c\\u0001\x7f");  // JSON's own escapes
}

TEST(DumpWriter, BytesThatAreNotUtf8AreEscapedAsSurrogates) {
  EXPECT_EQ(Escaped("m\xfcller"), "m\\udcfcller");                         // Latin-1
  EXPECT_EQ(Escaped("\xc0\xaf"), "\\udcc0\\udcaf");                        // overlong '/'
  EXPECT_EQ(Escaped("\xed\xa0\x80"), "\\udced\\udca0\\udc80");             // a UTF-16 surrogate
  EXPECT_EQ(Escaped("\xf4\x90\x80\x80"), "\\udcf4\\udc90\\udc80\\udc80");  // past U+10FFFF
  EXPECT_EQ(Escaped("x\xe2\x82"), "x\\udce2\\udc82");                      // cut short at the end
  EXPECT_EQ(Escaped("\xe2\x82x"), "\\udce2\\udc82x");  // cut short by an ASCII byte
  EXPECT_EQ(Escaped("\x80\xbf"), "\\udc80\\udcbf");    // stray continuations
  EXPECT_EQ(Escaped("\xff\xfe"), "\\udcff\\udcfe");
  EXPECT_EQ(Escaped("\xc3\xbc\xfc"), "\xc3\xbc\\udcfc");  // valid, then not
}

}  // namespace
}  // namespace conveyor::testing
