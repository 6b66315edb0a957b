// The version record: encoding, strict decoding, and atomic file I/O.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "dcr/store.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace dcr {
namespace {

using ::testing::HasSubstr;
using testing::TestRefitId;

VersionRecord FullRecord() {
  VersionRecord r;
  r.manifest = Digest128{0x0123456789abcdefull, 0xfedcba9876543210ull};
  r.committed = CommitInfo{Version{41, Digest128{1, 2}}, TestRefitId(0x10),
                           "2025-01-31T12:00:00Z"};
  r.in_progress =
      RefitInProgress{TestRefitId(0xa0), Version{41, Digest128{1, 2}},
                      Version{42, Digest128{3, 4}}, "2025-01-31T12:05:00Z"};
  return r;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Decoding `text` fails as Corruption, the message holding `expect` (and
// `name`, when given, which names the record).
void ExpectCorrupt(const std::string& text, const std::string& expect,
                   const std::string& name = "") {
  auto r = DecodeVersionRecord(text, "rec.dcr-version");
  ASSERT_FALSE(r.ok()) << text;
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(expect)) << text;
  if (!name.empty()) {
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(name));
  }
}

TEST(RefitIdTest, HexRoundTrip) {
  const RefitId id = TestRefitId(0xf0);
  EXPECT_EQ(id.ToHex(), "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff");
  auto back = RefitId::FromHex(id.ToHex());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, id);
  EXPECT_TRUE(RefitId{}.IsZero());
  EXPECT_FALSE(id.IsZero());
  EXPECT_FALSE(RefitId::FromHex("abc").ok());
  EXPECT_FALSE(RefitId::FromHex(std::string(31, '0') + "g").ok());
}

TEST(VersionRecordTest, EncodingIsPinned) {
  // The example in docs/FORMAT.md §version record.
  EXPECT_EQ(EncodeVersionRecord(FullRecord()),
            "{\"format\":3,\"manifest\":\"0123456789abcdeffedcba9876543210\","
            "\"committed\":{\"step\":41,\"digest\":"
            "\"00000000000000010000000000000002\",\"refit\":"
            "\"101112131415161718191a1b1c1d1e1f\",\"committed_at\":"
            "\"2025-01-31T12:00:00Z\"},\"in_progress\":{\"refit\":"
            "\"a0a1a2a3a4a5a6a7a8a9aaabacadaeaf\",\"base\":{\"step\":41,"
            "\"digest\":\"00000000000000010000000000000002\"},\"target\":{"
            "\"step\":42,\"digest\":\"00000000000000030000000000000004\"},"
            "\"started_at\":\"2025-01-31T12:05:00Z\"}}\n");
}

TEST(VersionRecordTest, RoundTrips) {
  VersionRecord full = FullRecord();
  full.committed->version.step = ~uint64_t{0};  // the whole u64 range
  VersionRecord bare;
  bare.manifest = Digest128{7, 8};
  VersionRecord committed_only = FullRecord();
  committed_only.in_progress.reset();
  VersionRecord in_progress_only = FullRecord();
  in_progress_only.committed.reset();
  for (const VersionRecord& r :
       {full, bare, committed_only, in_progress_only}) {
    auto back = DecodeVersionRecord(EncodeVersionRecord(r), "test");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, r);
  }
}

TEST(VersionRecordTest, RejectsMalformedRecords) {
  const std::string good = EncodeVersionRecord(FullRecord());
  auto replaced = [&good](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  struct Case {
    std::string text;
    std::string expect;  // in the message
  };
  const Case cases[] = {
      {"", "malformed JSON"},
      {"{\"format\":3", "malformed JSON"},
      {good + "x", "malformed JSON"},
      {"[1]", "not an object"},
      {"{}", "lacks key 'format'"},
      {replaced("\"format\":3", "\"format\":\"3\""), "not a non-negative"},
      {replaced("\"format\":3,", "\"format\":3,\"extra\":0,"),
       "unexpected key 'extra'"},
      {replaced("\"format\":3,", "\"format\":1,\"extra\":0,"),
       "unexpected key 'extra'"},
      {replaced("\"format\":3,", "\"format\":3,\"format\":3,"),
       "appears twice"},
      {replaced("\"manifest\":\"0123", "\"manifest\":\"x123"), "manifest"},
      {replaced("\"step\":41", "\"step\":-1"), "committed.step"},
      {replaced("\"step\":42", "\"step\":4.5"), "in_progress.target.step"},
      {replaced("\"refit\":\"1011", "\"refit\":\"10"), "committed.refit"},
      {replaced("\"committed_at\":\"2025-01-31T12:00:00Z\"",
                "\"committed_at\":7"),
       "committed.committed_at"},
      {replaced(",\"started_at\":\"2025-01-31T12:05:00Z\"", ""),
       "lacks key 'started_at'"},
      {replaced("\"in_progress\":{", "\"in_progress\":[{") + "]",
       "malformed JSON"},
      {replaced("\"committed\":{", "\"committed\":{\"x\":[[[[1]]]],"),
       "nests deeper"},
      {std::string(kMaxVersionRecordBytes + 1, ' '), "more than the limit"},
  };
  for (const Case& c : cases) {
    ASSERT_NO_FATAL_FAILURE(ExpectCorrupt(c.text, c.expect, "rec.dcr-version"));
  }
}

TEST(VersionRecordTest, NewerFormatIsUnsupported) {
  for (const char* text : {"{\"format\":5,\"whatever\":true}",
                           "{\"format\":0,\"whatever\":true}"}) {
    auto r = DecodeVersionRecord(text, "rec");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
    EXPECT_THAT(std::string(r.status().message()),
                HasSubstr("(this build reads formats 1 to 4)"));
  }
}

VersionRecord UnsyncedRecord() {
  VersionRecord r = FullRecord();
  r.in_progress.reset();
  r.unsynced = DataUnsynced{"591d10e2-3430-4a89-b5d5-a8e923fe2051",
                            "2025-01-31T12:01:00Z", std::nullopt};
  return r;
}

TEST(VersionRecordTest, AnUnsyncedMarkIsFormatFour) {
  // The example in docs/FORMAT.md §version record.
  const std::string text = EncodeVersionRecord(UnsyncedRecord());
  EXPECT_EQ(text,
            "{\"format\":4,\"manifest\":\"0123456789abcdeffedcba9876543210\","
            "\"committed\":{\"step\":41,\"digest\":"
            "\"00000000000000010000000000000002\",\"refit\":"
            "\"101112131415161718191a1b1c1d1e1f\",\"committed_at\":"
            "\"2025-01-31T12:00:00Z\"},\"in_progress\":null,\"unsynced\":{"
            "\"boot_id\":\"591d10e2-3430-4a89-b5d5-a8e923fe2051\",\"since\":"
            "\"2025-01-31T12:01:00Z\"}}\n");
  auto back = DecodeVersionRecord(text, "test");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, UnsyncedRecord());
  // Without the mark the same record is format 3.
  VersionRecord synced = UnsyncedRecord();
  synced.unsynced.reset();
  EXPECT_THAT(EncodeVersionRecord(synced), HasSubstr("{\"format\":3,"));

  auto replaced = [&text](const std::string& from, const std::string& to) {
    std::string s = text;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  struct Case {
    std::string text;
    std::string expect;
  };
  const Case cases[] = {
      // Format 3 has no such key; format 4 must carry it, not null.
      {replaced("\"format\":4", "\"format\":3"), "unexpected key 'unsynced'"},
      {replaced("\"format\":4", "\"format\":1"), "unexpected key 'unsynced'"},
      {replaced(",\"unsynced\":{\"boot_id\":\"591d10e2-3430-4a89-b5d5-"
                "a8e923fe2051\",\"since\":\"2025-01-31T12:01:00Z\"}",
                ""),
       "lacks key 'unsynced'"},
      {replaced("\"unsynced\":{\"boot_id\":\"591d10e2-3430-4a89-b5d5-"
                "a8e923fe2051\",\"since\":\"2025-01-31T12:01:00Z\"}",
                "\"unsynced\":null"),
       "not an object"},
      {replaced("a8e923fe2051", "a8e9"), "unsynced.boot_id"},
      {replaced("\"since\":\"2025-01-31T12:01:00Z\"", "\"since\":1"),
       "unsynced.since"},
      {replaced(",\"since\":\"2025-01-31T12:01:00Z\"", ""),
       "lacks key 'since'"},
  };
  for (const Case& c : cases) {
    ASSERT_NO_FATAL_FAILURE(ExpectCorrupt(c.text, c.expect));
  }
  // With the version on disk when the mark was put.
  VersionRecord with_synced = UnsyncedRecord();
  with_synced.unsynced->synced = Version{40, Digest128{5, 6}};
  const std::string t2 = EncodeVersionRecord(with_synced);
  EXPECT_THAT(t2, HasSubstr("\"since\":\"2025-01-31T12:01:00Z\",\"synced\":"
                            "{\"step\":40,\"digest\":"));
  auto back2 = DecodeVersionRecord(t2, "test");
  ASSERT_TRUE(back2.ok()) << back2.status().ToString();
  EXPECT_EQ(*back2, with_synced);
  std::string bad = t2;
  bad.replace(bad.find("\"step\":40"), 9, "\"step\":-1");
  ASSERT_NO_FATAL_FAILURE(ExpectCorrupt(bad, "unsynced.synced"));
}

TEST(VersionRecordTest, FileMissingWrittenCorrupt) {
  testing::TempDir dir;
  const std::string path = dir.Path("x.dcr-version");
  auto missing = ReadVersionRecord(path);
  ASSERT_TRUE(missing.ok()) << missing.status().ToString();
  EXPECT_FALSE(missing->has_value());

  ASSERT_TRUE(WriteVersionRecord(path, FullRecord()).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  auto read = ReadVersionRecord(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_TRUE(read->has_value());
  EXPECT_EQ(**read, FullRecord());

  WriteText(path, "{\"format\":1,");
  auto corrupt = ReadVersionRecord(path);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_TRUE(corrupt.status().IsCorruption());
  EXPECT_THAT(std::string(corrupt.status().message()), HasSubstr(path));

  WriteText(path, std::string(kMaxVersionRecordBytes + 1, ' '));
  auto big = ReadVersionRecord(path);
  ASSERT_FALSE(big.ok());
  EXPECT_TRUE(big.status().IsCorruption());

  std::filesystem::remove(path);
  std::filesystem::create_directory(path);
  auto dir_record = ReadVersionRecord(path);
  ASSERT_FALSE(dir_record.ok());
  EXPECT_TRUE(dir_record.status().IsCorruption());
}

}  // namespace
}  // namespace dcr
