// The relay journal: records read back as written, a torn tail is ignored,
// restoring in reverse order of append gives the first values back, and a
// yes vote is found.
#include "session/journal.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include "testing/temp_dir.h"

namespace dcr {
namespace {

using Bytes = std::vector<std::byte>;

JournalHeader Header() {
  JournalHeader h;
  h.refit.bytes[0] = 0xab;
  h.refit.bytes[15] = 0x01;
  h.base = Version{4, Digest128{1, 2}};
  h.target = Version{5, Digest128{3, 4}};
  h.boot_id = "0123abcd-1111-2222-3333-444455556666";
  return h;
}

// A sparse chunk of 2-byte elements setting `positions` (values unused:
// the journal records only what the span held).
DecodedChunk Sparse(uint32_t tensor, uint32_t span, uint32_t span_elems,
                    std::vector<uint32_t> positions) {
  DecodedChunk c;
  c.header.kind = ChunkKind::kXor;
  c.header.encoding = ChunkEncoding::kSparse;
  c.header.elem_size = 2;
  c.header.id = {tensor, span};
  c.header.span_elems = span_elems;
  c.header.changed = static_cast<uint32_t>(positions.size());
  c.positions = std::move(positions);
  c.values.resize(c.positions.size() * 2);
  return c;
}

DecodedChunk Dense(uint32_t tensor, uint32_t span, uint32_t span_elems) {
  DecodedChunk c;
  c.header.kind = ChunkKind::kOverwrite;
  c.header.encoding = ChunkEncoding::kDense;
  c.header.elem_size = 2;
  c.header.id = {tensor, span};
  c.header.span_elems = span_elems;
  c.header.changed = span_elems;
  c.values.resize(span_elems * 2);
  return c;
}

Bytes Iota(size_t n, uint8_t from) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>(from + i);
  return b;
}

TEST(JournalTest, RecordsReadBackFromTheWriterAndFromDisk) {
  testing::TempDir dir;
  const std::string path = dir.Path("j.dcr-journal");
  auto j = Journal::Create(path, Header());
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  Bytes tensor = Iota(64, 10);  // 32 elements of 2 bytes
  auto span = std::span<const std::byte>(tensor).subspan(32, 32);
  DecodedChunk part = Sparse(0, 1, 16, {0, 3, 15});
  part.header.id.part = 7;  // a producer's part: the id keeps it
  auto a = (*j)->AppendApply(part, 32, span);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = (*j)->AppendApply(Dense(2, 0, 16), 0,
                             std::span<const std::byte>(tensor).first(32));
  ASSERT_TRUE(b.ok());
  // A named file, there for a restarted relay to find.
  EXPECT_TRUE(std::filesystem::exists(path));

  JournalApply r;
  ASSERT_TRUE((*j)->Read(*a, &r).ok());
  EXPECT_EQ(r.id, (ChunkId{0, 1, 7}));
  EXPECT_EQ(r.offset, 32u);
  EXPECT_FALSE(r.dense);
  EXPECT_EQ(r.positions, (std::vector<uint32_t>{0, 3, 15}));
  EXPECT_EQ(r.old_values, (Bytes{tensor[32], tensor[33], tensor[38], tensor[39],
                                 tensor[62], tensor[63]}));

  auto reader = JournalReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->header(), Header());
  ASSERT_EQ((*reader)->applies().size(), 2u);
  EXPECT_FALSE((*reader)->voted_yes().has_value());
  EXPECT_EQ((*reader)->torn_bytes(), 0u);
  ASSERT_TRUE((*reader)->Read((*reader)->applies()[1], &r).ok());
  EXPECT_TRUE(r.dense);
  EXPECT_EQ(r.id, (ChunkId{2, 0}));
  EXPECT_EQ(r.old_values, Bytes(tensor.begin(), tensor.begin() + 32));

  ASSERT_TRUE((*j)->Remove().ok());
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE(JournalReader::Open(path).status().IsNotFound());
}

TEST(JournalTest, ATornOrDamagedTailIsIgnored) {
  testing::TempDir dir;
  const std::string path = dir.Path("j.dcr-journal");
  Bytes tensor = Iota(64, 0);
  uint64_t after_two = 0;
  {
    auto j = Journal::Create(path, Header());
    ASSERT_TRUE(j.ok());
    for (uint32_t s = 0; s < 2; ++s) {
      ASSERT_TRUE((*j)->AppendApply(Sparse(0, s, 16, {1, 2}), s * 32,
                                    std::span(tensor).subspan(s * 32, 32))
                      .ok());
    }
    after_two = (*j)->bytes();
    ASSERT_TRUE(
        (*j)->AppendApply(Dense(1, 0, 16), 0, std::span(tensor).first(32))
            .ok());
    // The process dies (no Remove).
  }
  const uint64_t full = std::filesystem::file_size(path);
  // Cut in the middle of the third record: as if killed while writing it.
  std::filesystem::resize_file(path, after_two + (full - after_two) / 2);
  auto r = JournalReader::Open(path);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->applies().size(), 2u);
  EXPECT_EQ((*r)->torn_bytes(), (full - after_two) / 2);

  // A complete record with a damaged byte fails its checksum: it and
  // everything after it are ignored.
  std::filesystem::resize_file(path, after_two);
  {
    auto j2 = JournalReader::Open(path);
    ASSERT_TRUE(j2.ok());
    EXPECT_EQ((*j2)->applies().size(), 2u);
  }
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(after_two - 3));
    f.put('\x5a');
  }
  r = JournalReader::Open(path);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->applies().size(), 1u);
  EXPECT_GT((*r)->torn_bytes(), 0u);

  // A torn header: not a journal to trust.
  std::filesystem::resize_file(path, 100);
  EXPECT_TRUE(JournalReader::Open(path).status().IsCorruption());
}

TEST(JournalTest, RestoringInReverseOrderGivesTheFirstValuesBack) {
  Bytes tensor = Iota(32, 0);
  const Bytes original = tensor;
  auto j = Journal::Create("", Header());  // heap-backed
  ASSERT_TRUE(j.ok());
  std::vector<Journal::Ref> refs;
  // The same span written three times (an XOR, then two overwrites of a
  // repair): each record holds what the span held just before.
  for (int round = 0; round < 3; ++round) {
    DecodedChunk c = round == 1 ? Dense(0, 0, 16) : Sparse(0, 0, 16, {2, 7});
    auto ref = (*j)->AppendApply(c, 0, tensor);
    ASSERT_TRUE(ref.ok());
    refs.push_back(*ref);
    // The apply: only what the record covers changes.
    const auto value = static_cast<std::byte>(0x40 * (round + 1));
    if (round == 1) {
      for (auto& x : tensor) x = value;
    } else {
      for (size_t b : {4, 5, 14, 15}) tensor[b] = value;
    }
  }
  JournalApply r;
  // Forward order would leave the second write's values.
  for (auto it = refs.rbegin(); it != refs.rend(); ++it) {
    ASSERT_TRUE((*j)->Read(*it, &r).ok());
    ASSERT_TRUE(RestoreApply(r, tensor).ok());
  }
  EXPECT_EQ(tensor, original);
  // A record that does not fit its tensor is refused, nothing written.
  r.offset = 30;
  EXPECT_TRUE(RestoreApply(r, tensor).IsCorruption());
  EXPECT_EQ(tensor, original);
}

TEST(JournalTest, AYesVoteIsFoundAndDurable) {
  testing::TempDir dir;
  const std::string path = dir.Path("j.dcr-journal");
  auto j = Journal::Create(path, Header());
  ASSERT_TRUE(j.ok());
  Bytes tensor = Iota(32, 0);
  ASSERT_TRUE((*j)->AppendApply(Sparse(0, 0, 16, {5}), 0, tensor).ok());
  EXPECT_FALSE((*JournalReader::Open(path))->voted_yes().has_value());
  ASSERT_TRUE((*j)->AppendVotedYes(Digest128{3, 4}).ok());
  auto r = JournalReader::Open(path);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->voted_yes(), (Digest128{3, 4}));
  EXPECT_EQ((*r)->applies().size(), 1u);
}

TEST(JournalTest, ConcurrentAppendsLeaveAScannableFile) {
  testing::TempDir dir;
  const std::string path = dir.Path("j.dcr-journal");
  auto j = Journal::Create(path, Header());
  ASSERT_TRUE(j.ok());
  Bytes tensor = Iota(4096 * 2, 0);
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t s = t; s < 64; s += 4) {
        std::vector<uint32_t> pos(s + 1);
        std::iota(pos.begin(), pos.end(), 0);
        ASSERT_TRUE((*j)->AppendApply(Sparse(0, s, 64, pos), s * 128,
                                      std::span(tensor).subspan(s * 128, 128))
                        .ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  auto r = JournalReader::Open(path);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->applies().size(), 64u);
  EXPECT_EQ((*r)->torn_bytes(), 0u);
  JournalApply a;
  for (const auto& ref : (*r)->applies()) {
    ASSERT_TRUE((*r)->Read(ref, &a).ok());
    EXPECT_EQ(a.positions.size(), a.id.span + 1);
  }
}

TEST(JournalTest, PathsAndProbe) {
  EXPECT_EQ(JournalPath("/s/m.safetensors.dcr-version", ""),
            "/s/m.safetensors.dcr-journal");
  // In a shared directory: named after the whole record path too.
  const std::string a = JournalPath("/dev/shm/p.dcr-version", "/disk/undo");
  const std::string b = JournalPath("/other/p.dcr-version", "/disk/undo");
  EXPECT_TRUE(a.starts_with("/disk/undo/p.")) << a;
  EXPECT_TRUE(a.ends_with(".dcr-journal")) << a;
  EXPECT_EQ(a.size(), std::string("/disk/undo/p.").size() + 16 +
                          std::string(".dcr-journal").size());
  EXPECT_NE(a, b);
  EXPECT_EQ(JournalPath("", "/disk/undo"), "");
  testing::TempDir dir;
  EXPECT_TRUE(Journal::ProbeDir(dir.path().string()).ok());
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  Status s = Journal::ProbeDir(dir.Path("no/such/dir"));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no/such/dir"), std::string::npos);
  EXPECT_FALSE(Journal::Create(dir.Path("no/such/dir/j"), Header()).ok());
}

}  // namespace
}  // namespace dcr
