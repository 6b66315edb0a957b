// Offline diff/apply on real safetensors files: round trips, and every bad
// input refused with the target's bits unchanged.
#include "dcr/delta.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/bytes.h"
#include "dcr/checkpoint.h"
#include "dcr/thread_pool.h"
#include "testing/temp_dir.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;

struct Model {
  std::vector<TensorInfo> infos = {
      {"a.bf16", DType::kBF16, {300, 70}},  // 21000 elements: 3 spans of 8192
      {"b.f32", DType::kF32, {1000}},      {"c.u8", DType::kU8, {5000}},
      {"d.i64", DType::kI64, {3, 7}},      {"e.f8", DType::kF8E4M3, {4096}},
      {"f.scalar", DType::kF16, {}},       {"g.empty", DType::kBF16, {0, 5}},
  };
  std::vector<Bytes> data;

  explicit Model(uint32_t seed) {
    std::mt19937 rng(seed);
    for (const auto& t : infos) {
      Bytes b(t.NumBytes());
      for (auto& x : b) x = static_cast<std::byte>(rng());
      data.push_back(std::move(b));
    }
  }
  // Changes about `rate` of each tensor's elements (low bits, like a step).
  Model Step(double rate, uint32_t seed) const {
    Model m = *this;
    std::mt19937 rng(seed);
    std::bernoulli_distribution pick(rate);
    for (size_t t = 0; t < infos.size(); ++t) {
      size_t w = DTypeSize(infos[t].dtype);
      for (size_t i = 0; i < infos[t].NumElements(); ++i) {
        if (pick(rng))
          m.data[t][i * w] ^= static_cast<std::byte>(1 + rng() % 7);
      }
    }
    return m;
  }
  Status Write(const std::string& path, bool sharded = false,
               uint64_t step = 0) const {
    std::vector<TensorToWrite> tw;
    for (size_t t = 0; t < infos.size(); ++t) tw.push_back({infos[t], data[t]});
    std::map<std::string, std::string> meta = {
        {"dcr.step", std::to_string(step)}};
    if (sharded) return WriteShardedSafetensors(path, tw, meta, 20000);
    return WriteSafetensors(path, tw, meta);
  }
};

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Concatenated bytes of every file of a checkpoint (file or directory).
std::string Snapshot(const std::string& path) {
  if (!fs::is_directory(path)) return ReadAll(path);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(path)) names.push_back(e.path());
  std::sort(names.begin(), names.end());
  std::string all;
  for (const auto& n : names) all += n + ":" + ReadAll(n);
  return all;
}

class DeltaTest : public ::testing::Test {
 protected:
  // Writes v0 and v1 (v1 = v0 stepped) and the delta v0 -> v1.
  void MakePair(ChunkKind kind, bool sharded, double rate = 0.03) {
    v0_ = Model(1);
    v1_ = v0_.Step(rate, 2);
    base_ = dir_.Path(sharded ? "v0" : "v0.safetensors");
    target_ = dir_.Path(sharded ? "v1" : "v1.safetensors");
    ASSERT_TRUE(v0_.Write(base_, sharded, 0).ok());
    ASSERT_TRUE(v1_.Write(target_, sharded, 1).ok());
    auto b = Checkpoint::Open(base_, Checkpoint::Mode::kReadOnly);
    auto t = Checkpoint::Open(target_, Checkpoint::Mode::kReadOnly);
    ASSERT_TRUE(b.ok() && t.ok());
    DiffOptions opt;
    opt.kind = kind;
    opt.span_elems = 8192;
    delta_ = dir_.Path("v1.dcr");
    auto stats = WriteDelta(**b, **t, delta_, opt, &pool_);
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    stats_ = *stats;
  }

  // Copies the base to a fresh "work" checkpoint and returns its path.
  std::string FreshWork(bool sharded) {
    std::string work = dir_.Path(sharded ? "work" : "work.safetensors");
    fs::remove_all(work);
    fs::copy(base_, work, fs::copy_options::recursive);
    return work;
  }

  Result<DeltaStats> Apply(const std::string& delta, const std::string& work) {
    auto c = Checkpoint::Open(work, Checkpoint::Mode::kReadWrite);
    if (!c.ok()) return c.status();
    return ApplyDelta(delta, c->get(), &pool_);
  }

  void ExpectIdentical(const std::string& a, const std::string& b) {
    auto ca = Checkpoint::Open(a, Checkpoint::Mode::kReadOnly);
    auto cb = Checkpoint::Open(b, Checkpoint::Mode::kReadOnly);
    ASSERT_TRUE(ca.ok() && cb.ok());
    EXPECT_TRUE(CompareCheckpoints(**ca, **cb, &pool_).empty());
  }

  testing::TempDir dir_;
  ThreadPool pool_{2};
  Model v0_{1}, v1_{1};
  std::string base_, target_, delta_;
  DeltaStats stats_;
};

TEST_F(DeltaTest, XorRoundTripSingleFile) {
  MakePair(ChunkKind::kXor, false);
  EXPECT_GT(stats_.chunks, 0u);
  EXPECT_EQ(stats_.header.base.step, 0u);
  EXPECT_EQ(stats_.header.target.step, 1u);
  EXPECT_GT(stats_.header.changed_elements, 0u);
  std::string work = FreshWork(false);
  auto r = Apply(delta_, work);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ExpectIdentical(work, target_);
}

TEST_F(DeltaTest, OverwriteRoundTripSharded) {
  MakePair(ChunkKind::kOverwrite, true);
  EXPECT_TRUE(stats_.header.all_overwrite);
  std::string work = FreshWork(true);
  ASSERT_TRUE(Apply(delta_, work).ok());
  ExpectIdentical(work, target_);
}

TEST_F(DeltaTest, DenseChangesRoundTrip) {
  MakePair(ChunkKind::kXor, false, 0.9);
  EXPECT_GT(stats_.dense_chunks, 0u);
  std::string work = FreshWork(false);
  ASSERT_TRUE(Apply(delta_, work).ok());
  ExpectIdentical(work, target_);
}

TEST_F(DeltaTest, IdenticalCheckpointsGiveAnEmptyDelta) {
  v0_ = Model(5);
  base_ = dir_.Path("a.safetensors");
  ASSERT_TRUE(v0_.Write(base_).ok());
  auto b = Checkpoint::Open(base_, Checkpoint::Mode::kReadOnly);
  ASSERT_TRUE(b.ok());
  auto stats =
      WriteDelta(**b, **b, dir_.Path("empty.dcr"), DiffOptions(), &pool_);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->chunks, 0u);
  auto inspect = InspectDelta(dir_.Path("empty.dcr"), &pool_);
  ASSERT_TRUE(inspect.ok());
  EXPECT_EQ(inspect->chunks, 0u);
}

TEST_F(DeltaTest, ApplyingTwiceIsRefusedAndHarmless) {
  MakePair(ChunkKind::kXor, false);
  std::string work = FreshWork(false);
  ASSERT_TRUE(Apply(delta_, work).ok());
  std::string after = Snapshot(work);
  auto again = Apply(delta_, work);
  ASSERT_FALSE(again.ok());
  EXPECT_TRUE(again.status().IsBaseMismatch()) << again.status().ToString();
  EXPECT_NE(again.status().message().find("applied already"),
            std::string::npos);
  EXPECT_EQ(Snapshot(work), after);
}

// An overwrite delta repairs a target left between base and target (an
// apply that died midway); an XOR delta refuses such a target.
TEST_F(DeltaTest, OverwriteDeltaRepairsAMixedTarget) {
  MakePair(ChunkKind::kOverwrite, false);
  Model mixed = v0_;
  mixed.data[0] = v1_.data[0];  // one tensor already at the target
  mixed.data[2] = v1_.data[2];
  std::string work = dir_.Path("mixed.safetensors");
  ASSERT_TRUE(mixed.Write(work).ok());
  auto r = Apply(delta_, work);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ExpectIdentical(work, target_);
}

TEST_F(DeltaTest, OverwriteRepairOfAnUnrelatedTargetRestoresIt) {
  MakePair(ChunkKind::kOverwrite, false);
  std::string other = dir_.Path("other.safetensors");
  ASSERT_TRUE(Model(77).Write(other).ok());
  std::string before = Snapshot(other);
  auto r = Apply(delta_, other);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("restored"), std::string::npos);
  EXPECT_EQ(Snapshot(other), before);
}

TEST_F(DeltaTest, XorDeltaRefusesAMixedTarget) {
  MakePair(ChunkKind::kXor, false);
  Model mixed = v0_;
  mixed.data[0] = v1_.data[0];
  std::string work = dir_.Path("mixed.safetensors");
  ASSERT_TRUE(mixed.Write(work).ok());
  std::string before = Snapshot(work);
  EXPECT_TRUE(Apply(delta_, work).status().IsBaseMismatch());
  EXPECT_EQ(Snapshot(work), before);
}

TEST_F(DeltaTest, WrongBaseIsRefused) {
  MakePair(ChunkKind::kXor, false);
  std::string other = dir_.Path("other.safetensors");
  ASSERT_TRUE(v0_.Step(0.01, 99).Write(other).ok());
  std::string before = Snapshot(other);
  auto r = Apply(delta_, other);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsBaseMismatch()) << r.status().ToString();
  EXPECT_EQ(Snapshot(other), before);
}

TEST_F(DeltaTest, ManifestMismatchIsRefused) {
  MakePair(ChunkKind::kXor, false);
  Model m(1);
  m.infos[1].shape = {500, 2};  // same bytes, other shape
  std::string other = dir_.Path("other.safetensors");
  ASSERT_TRUE(m.Write(other).ok());
  std::string before = Snapshot(other);
  auto r = Apply(delta_, other);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsBaseMismatch());
  EXPECT_NE(r.status().message().find("other tensors"), std::string::npos);
  EXPECT_EQ(Snapshot(other), before);
}

TEST_F(DeltaTest, DiffRefusesDifferentTensors) {
  MakePair(ChunkKind::kXor, false);
  Model m(1);
  m.infos[0].name = "renamed";
  std::string other = dir_.Path("other.safetensors");
  ASSERT_TRUE(m.Write(other).ok());
  auto b = Checkpoint::Open(base_, Checkpoint::Mode::kReadOnly);
  auto o = Checkpoint::Open(other, Checkpoint::Mode::kReadOnly);
  auto r = WriteDelta(**b, **o, dir_.Path("x.dcr"), DiffOptions(), &pool_);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsInvalidArgument());
  EXPECT_FALSE(fs::exists(dir_.Path("x.dcr")));
  EXPECT_FALSE(fs::exists(dir_.Path("x.dcr.tmp")));
}

TEST_F(DeltaTest, EveryTruncationIsRefusedWithoutWriting) {
  MakePair(ChunkKind::kXor, false);
  std::string full = ReadAll(delta_);
  std::string work = FreshWork(false);
  std::string before = Snapshot(work);
  std::string cut = dir_.Path("cut.dcr");
  // Every length inside the header, then a spread of lengths after it.
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= kDeltaHeaderBytes + 64; ++n) lengths.push_back(n);
  for (size_t n = kDeltaHeaderBytes; n < full.size(); n += 97)
    lengths.push_back(n);
  lengths.push_back(full.size() - 1);
  for (size_t n : lengths) {
    std::ofstream(cut, std::ios::binary | std::ios::trunc)
        .write(full.data(), n);
    auto r = Apply(cut, work);
    ASSERT_FALSE(r.ok()) << "length " << n;
    EXPECT_TRUE(r.status().IsCorruption() ||
                r.status().code() == StatusCode::kIOError)
        << n << ": " << r.status().ToString();
  }
  EXPECT_EQ(Snapshot(work), before);
  // Trailing garbage is refused too.
  std::ofstream(cut, std::ios::binary | std::ios::trunc) << full << "x";
  EXPECT_TRUE(Apply(cut, work).status().IsCorruption());
  EXPECT_EQ(Snapshot(work), before);
}

// Thousands of random corruptions: the delta is refused (or, for a flip
// that leaves the delta valid, applied correctly); never a crash and
// never a partially written target.
TEST_F(DeltaTest, RandomCorruptionNeverMutatesTheTarget) {
  MakePair(ChunkKind::kXor, false);
  std::string full = ReadAll(delta_);
  std::string work = FreshWork(false);
  std::string before = Snapshot(work);
  std::string bad = dir_.Path("bad.dcr");
  std::mt19937 rng(12345);
  int refused = 0;
  const int kCases = 2000;
  for (int i = 0; i < kCases; ++i) {
    std::string b = full;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      size_t at = rng() % b.size();
      if (rng() % 2) {
        b[at] ^= static_cast<char>(1 << (rng() % 8));
      } else {
        b[at] = static_cast<char>(rng());
      }
    }
    if (b == full) continue;
    std::ofstream(bad, std::ios::binary | std::ios::trunc) << b;
    auto r = Apply(bad, work);
    ASSERT_FALSE(r.ok()) << "case " << i << " was applied";
    ++refused;
    ASSERT_EQ(Snapshot(work), before) << "case " << i << " mutated the target";
  }
  EXPECT_GT(refused, kCases * 9 / 10);
}

// An unwritable target fails before anything is written. Root ignores file
// permissions, so the check runs in a child that drops to "nobody".
TEST_F(DeltaTest, UnwritableTargetIsRefused) {
  MakePair(ChunkKind::kXor, false);
  std::string work = FreshWork(false);
  fs::permissions(work, fs::perms::owner_read | fs::perms::group_read |
                            fs::perms::others_read);
  fs::permissions(dir_.path(), fs::perms::all);
  std::string before = Snapshot(work);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) {
      ::_exit(10);
    }
    auto c = Checkpoint::Open(work, Checkpoint::Mode::kReadWrite);
    ::_exit(c.ok() ? 11 : (c.status().code() == StatusCode::kIOError ? 0 : 12));
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(Snapshot(work), before);
}

TEST_F(DeltaTest, InspectReportsSections) {
  MakePair(ChunkKind::kXor, false);
  auto s = InspectDelta(delta_, &pool_);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->chunks, stats_.chunks);
  EXPECT_EQ(s->sizes.total(), stats_.sizes.total());
  EXPECT_EQ(s->file_bytes, stats_.sizes.total() + kDeltaHeaderBytes);
  EXPECT_EQ(s->header.changed_elements, stats_.header.changed_elements);
}

TEST_F(DeltaTest, CompareNamesFirstDifference) {
  MakePair(ChunkKind::kXor, false);
  auto a = Checkpoint::Open(base_, Checkpoint::Mode::kReadOnly);
  auto b = Checkpoint::Open(target_, Checkpoint::Mode::kReadOnly);
  auto d = CompareCheckpoints(**a, **b, &pool_);
  ASSERT_FALSE(d.empty());
  EXPECT_EQ(d[0].tensor, "a.bf16");
  EXPECT_GT(d[0].differing_elements, 0u);
  EXPECT_NE(d[0].a_hex, d[0].b_hex);
}

TEST(DeltaHeaderTest, RoundTripAndChecksum) {
  DeltaHeader h;
  h.base = {7, Digest128{1, 2}};
  h.target = {8, Digest128{3, 4}};
  h.manifest = Digest128{5, 6};
  h.span_elems = 1024;
  h.chunk_count = 9;
  h.tensor_count = 3;
  h.total_elements = 100;
  h.total_bytes = 200;
  h.changed_elements = 10;
  auto bytes = EncodeDeltaHeader(h);
  ASSERT_EQ(bytes.size(), kDeltaHeaderBytes);
  auto back = DecodeDeltaHeader(bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->base, h.base);
  EXPECT_EQ(back->target, h.target);
  EXPECT_EQ(back->chunk_count, 9u);
  EXPECT_EQ(back->total_bytes, 200u);
  for (size_t i = 0; i < bytes.size(); ++i) {
    auto bad = bytes;
    bad[i] ^= std::byte{0x10};
    EXPECT_FALSE(DecodeDeltaHeader(bad).ok()) << i;
  }
}

// Version 1 is the same layout with the XXH3 digests of earlier builds:
// refused as such, with what to do.
TEST(DeltaHeaderTest, VersionOneIsRefusedForItsDigests) {
  DeltaHeader h;
  h.span_elems = 1024;
  auto bytes = EncodeDeltaHeader(h);
  EXPECT_EQ(LoadLE<uint16_t>(bytes.data() + 8), 2);
  StoreLE<uint16_t>(bytes.data() + 8, 1);
  StoreLE<uint64_t>(bytes.data() + 128,
                    Hash64(std::span<const std::byte>(bytes).first(128)));
  auto back = DecodeDeltaHeader(bytes);
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(back.status().message().find("XXH3 digests of an earlier dcr"),
            std::string::npos)
      << back.status().ToString();
}

// Sync puts every chunk appended so far in the temporary file (after a
// zero header); Keep leaves that file behind the writer and refuses
// Finish; an unkept writer removes it.
TEST(DeltaWriterTest, SyncWritesTheChunksAndKeepLeavesTheFile) {
  testing::TempDir dir;
  const std::string path = dir.Path("d.dcr");
  const Bytes a(40, std::byte{1}), b(24, std::byte{2});
  {
    auto w = std::move(*DeltaWriter::Create(path));
    ASSERT_TRUE(w->Append(a).ok());
    ASSERT_TRUE(w->Sync().ok());
    std::ifstream f(w->tmp_path(), std::ios::binary);
    std::string got((std::istreambuf_iterator<char>(f)), {});
    ASSERT_EQ(got.size(), kDeltaHeaderBytes + a.size());
    EXPECT_EQ(got.substr(0, kDeltaHeaderBytes),
              std::string(kDeltaHeaderBytes, '\0'));
    ASSERT_TRUE(w->Append(b).ok());
    w->Keep();
    EXPECT_FALSE(w->Finish(DeltaHeader{}).ok());
  }
  std::ifstream f(path + ".tmp", std::ios::binary);
  std::string got((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(got.size(), kDeltaHeaderBytes + a.size() + b.size());
  EXPECT_FALSE(fs::exists(path));
  {
    auto w = std::move(*DeltaWriter::Create(dir.Path("e.dcr")));
    ASSERT_TRUE(w->Sync().ok());
  }
  EXPECT_FALSE(fs::exists(dir.Path("e.dcr.tmp")));
}

}  // namespace
}  // namespace dcr
