// WeightStore backends: specs, memory and file stores created, opened,
// written, committed and reopened, sharded directories, and writes on
// every backend.
#include "dcr/store.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/failpoint.h"
#include "common/file.h"
#include "dcr/checkpoint.h"
#include "dcr/thread_pool.h"
#include "format/safetensors_header.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"
#include "unit/store/store_test_fixture.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;
using store_testing::AllZero;
using store_testing::CopyBits;
using store_testing::Fixture;
using store_testing::ShmName;
using store_testing::StoreTest;
using ::testing::HasSubstr;
using testing::ReadAllOrStatus;
using testing::TestRefitId;

// ------------------------------------------------------------------- specs

TEST(StoreSpecTest, ParsesEachKind) {
  auto m = ParseStoreSpec("memory:");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->kind, StoreSpec::Kind::kMemory);
  EXPECT_EQ(m->ToString(), "memory:");
  ASSERT_TRUE(ParseStoreSpec("memory").ok());

  auto f = ParseStoreSpec("file:/models/p.safetensors");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->kind, StoreSpec::Kind::kFile);
  EXPECT_EQ(f->path, "/models/p.safetensors");
  EXPECT_EQ(f->ToString(), "file:/models/p.safetensors");
  EXPECT_EQ(DefaultRecordPath(*f), "/models/p.safetensors.dcr-version");

  for (const char* text : {"shm:policy", "shm:/policy"}) {
    auto s = ParseStoreSpec(text);
    ASSERT_TRUE(s.ok()) << text;
    EXPECT_EQ(s->kind, StoreSpec::Kind::kShm);
    EXPECT_EQ(s->path, "/policy");
    EXPECT_EQ(s->ToString(), "shm:/policy");
    EXPECT_TRUE(s->record_path.empty());
    EXPECT_EQ(DefaultRecordPath(*s), "/dev/shm/policy.dcr-version");
  }
}

TEST(StoreSpecTest, RejectsMalformedSpecs) {
  for (const std::string& text : std::vector<std::string>{
           "", "file", "file:", "shm:", "shm:/", "shm:a/b", "shm://a", "shm:..",
           "nfs:/x", "memory:x", "/models/p.safetensors",
           "shm:" + std::string(NAME_MAX + 1, 'a')}) {
    auto s = ParseStoreSpec(text);
    EXPECT_FALSE(s.ok()) << text;
    EXPECT_TRUE(s.status().IsInvalidArgument()) << text;
  }
  EXPECT_TRUE(ParseStoreSpec("shm:" + std::string(NAME_MAX, 'a')).ok());
}

TEST_F(StoreTest, DirectoryRecordPathIsInside) {
  StoreSpec s = FileSpec("sharded");
  fs::create_directory(s.path);
  EXPECT_EQ(DefaultRecordPath(s), Path("sharded/store.dcr-version"));
}

// ------------------------------------------------------------------ memory

TEST_F(StoreTest, MemoryStoreFromCheckpoint) {
  Fixture f;
  const StoreSpec spec = WriteFixture(f, "m.safetensors");
  auto cp = Checkpoint::Open(spec.path, Checkpoint::Mode::kReadOnly);
  ASSERT_TRUE(cp.ok());
  auto store = CreateMemoryStoreFrom(**cp);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  WeightStore& s = **store;
  EXPECT_EQ(s.describe(), "memory:");
  EXPECT_TRUE(s.record_path().empty());
  EXPECT_EQ(s.manifest().digest(), (*cp)->manifest().digest());
  for (size_t i = 0; i < s.manifest().size(); ++i) {
    const auto a = s.Tensor(i);
    const auto b = (*cp)->TensorData(i);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin()));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
  }
  ThreadPool pool(3);
  const CheckpointDigests want = (*cp)->ComputeDigests();
  const CheckpointDigests got = s.Digests(&pool);
  EXPECT_EQ(got.tensors, want.tensors);
  EXPECT_EQ(got.manifest, want.manifest);
  EXPECT_EQ(got.version, want.version);
  EXPECT_EQ(s.Digests().version, want.version);

  EXPECT_FALSE(s.committed().has_value());
  const Version v{7, want.version};
  ASSERT_TRUE(s.Commit(v, TestRefitId(1)).ok());
  EXPECT_EQ(s.committed(), v);
  EXPECT_EQ(s.record().committed->refit, TestRefitId(1));
  EXPECT_FALSE(s.record().committed->committed_at.empty());

  const Version next{8, Digest128{5, 6}};
  ASSERT_TRUE(s.BeginRefit(TestRefitId(2), v, next).ok());
  ASSERT_TRUE(s.InProgress().has_value());
  EXPECT_EQ(s.InProgress()->target, next);
  EXPECT_EQ(s.committed(), v);
  ASSERT_TRUE(s.EndRefit().ok());
  EXPECT_FALSE(s.InProgress().has_value());
  EXPECT_EQ(s.committed(), v);
}

TEST_F(StoreTest, MemoryStoreCreatedZeroAndNotReopenable) {
  Fixture f;
  auto store = CreateStore(*ParseStoreSpec("memory:"), f.manifest());
  ASSERT_TRUE(store.ok());
  for (size_t i = 0; i < (*store)->manifest().size(); ++i) {
    EXPECT_TRUE(AllZero((*store)->Tensor(i)));
    EXPECT_EQ((*store)->Tensor(i).size(), (*store)->manifest()[i].NumBytes());
  }
  auto reopened = OpenStore(*ParseStoreSpec("memory:"));
  ASSERT_FALSE(reopened.ok());
  EXPECT_TRUE(reopened.status().IsInvalidArgument());
  EXPECT_TRUE(RemoveStore(*ParseStoreSpec("memory:")).ok());
}

// -------------------------------------------------------------------- file

TEST_F(StoreTest, FileStoreCommitSurvivesReopen) {
  Fixture f;
  Fixture target(2);
  const StoreSpec spec = WriteFixture(f, "p.safetensors");
  const std::string record_path = spec.path + ".dcr-version";
  Version target_version;
  {
    auto store = OpenStore(spec);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    WeightStore& s = **store;
    EXPECT_EQ(s.describe(), "file:" + spec.path);
    EXPECT_EQ(s.record_path(), record_path);
    EXPECT_FALSE(s.committed().has_value());
    EXPECT_FALSE(s.InProgress().has_value());
    EXPECT_FALSE(fs::exists(record_path));

    // Apply the "refit": overwrite every tensor with the target's bits.
    ASSERT_TRUE(
        WriteSafetensors(Path("t.safetensors"), target.tensors, target.metadata)
            .ok());
    auto t =
        Checkpoint::Open(Path("t.safetensors"), Checkpoint::Mode::kReadOnly);
    ASSERT_TRUE(t.ok());
    CopyBits(**t, &s);
    target_version = Version{1, (*t)->ComputeDigests().version};
    EXPECT_EQ(s.Digests().version, target_version.digest);
    ASSERT_TRUE(s.Commit(target_version, TestRefitId(9)).ok());
    EXPECT_EQ(s.committed(), target_version);
    EXPECT_TRUE(fs::exists(record_path));
    ASSERT_TRUE(s.WaitDataSync().ok());  // it rewrites the record too
    EXPECT_FALSE(fs::exists(record_path + ".tmp"));
  }
  // The data reached the file.
  auto cp = Checkpoint::Open(spec.path, Checkpoint::Mode::kReadOnly);
  ASSERT_TRUE(cp.ok());
  EXPECT_EQ((*cp)->ComputeDigests().version, target_version.digest);
  EXPECT_EQ((*cp)->metadata(), f.metadata);
  // A restart reads the record back.
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->committed(), target_version);
  const VersionRecord rec = (*store)->record();
  ASSERT_TRUE(rec.committed.has_value());
  EXPECT_EQ(rec.committed->refit, TestRefitId(9));
  EXPECT_THAT(rec.committed->committed_at,
              ::testing::MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T"
                                      "[0-9]{2}:[0-9]{2}:[0-9]{2}Z"));
  EXPECT_EQ(rec.manifest, (*store)->manifest().digest());
  EXPECT_FALSE(rec.in_progress.has_value());
}

TEST_F(StoreTest, RefitInProgressSurvivesRestartAndCommitClearsIt) {
  Fixture f;
  const StoreSpec spec = WriteFixture(f, "p.safetensors");
  const Version base{3, Digest128{1, 1}};
  const Version target{4, Digest128{2, 2}};
  {
    auto store = OpenStore(spec);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Commit(base, TestRefitId(1)).ok());
    ASSERT_TRUE((*store)->BeginRefit(TestRefitId(2), base, target).ok());
    const int64_t ids = (*store)->manifest().Find("ids");
    ASSERT_GE(ids, 0);
    (*store)->MutableTensor(ids)[0] ^= std::byte{1};  // a partial apply
  }  // "crash": the store goes away with the refit in progress
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  WeightStore& s = **store;
  EXPECT_EQ(s.committed(), base);
  ASSERT_TRUE(s.InProgress().has_value());
  EXPECT_EQ(s.InProgress()->refit, TestRefitId(2));
  EXPECT_EQ(s.InProgress()->base, base);
  EXPECT_EQ(s.InProgress()->target, target);
  EXPECT_FALSE(s.InProgress()->started_at.empty());

  // A commit of another refit or version is refused and changes nothing.
  const std::string before = ReadAllOrStatus(s.record_path());
  Status wrong_id = s.Commit(target, TestRefitId(3));
  EXPECT_TRUE(wrong_id.IsInvalidArgument()) << wrong_id.ToString();
  Status wrong_version = s.Commit(Version{5, target.digest}, TestRefitId(2));
  EXPECT_TRUE(wrong_version.IsInvalidArgument()) << wrong_version.ToString();
  EXPECT_EQ(ReadAllOrStatus(s.record_path()), before);
  EXPECT_TRUE(s.InProgress().has_value());

  ASSERT_TRUE(s.Commit(target, TestRefitId(2)).ok());
  EXPECT_FALSE(s.InProgress().has_value());
  EXPECT_EQ(s.committed(), target);
  store->reset();
  auto again = OpenStore(spec);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE((*again)->InProgress().has_value());
  EXPECT_EQ((*again)->committed(), target);
}

TEST_F(StoreTest, EndRefitClearsDurably) {
  Fixture f;
  const StoreSpec spec = WriteFixture(f, "p.safetensors");
  const Version base{3, Digest128{1, 1}};
  {
    auto store = OpenStore(spec);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->EndRefit().ok());  // nothing in progress: a no-op
    EXPECT_FALSE(fs::exists((*store)->record_path()));
    ASSERT_TRUE(
        (*store)
            ->BeginRefit(TestRefitId(2), base, Version{4, Digest128{2, 2}})
            .ok());
    // A refit that starts on a never-committed store (seeding) is recorded
    // too.
    EXPECT_FALSE((*store)->committed().has_value());
    ASSERT_TRUE((*store)->EndRefit().ok());
  }
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  EXPECT_FALSE((*store)->InProgress().has_value());
  EXPECT_FALSE((*store)->committed().has_value());
}

TEST_F(StoreTest, CreateFileStoreIsAValidZeroCheckpoint) {
  Fixture f;
  const StoreSpec spec = FileSpec("new.safetensors");
  // A stale record of an earlier store at the same path must not survive.
  VersionRecord stale;
  stale.manifest = f.manifest().digest();
  stale.committed =
      CommitInfo{Version{9, Digest128{9, 9}}, TestRefitId(9), "then"};
  ASSERT_TRUE(WriteVersionRecord(spec.path + ".dcr-version", stale).ok());
  {
    auto store = CreateStore(spec, f.manifest(), f.metadata);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_FALSE((*store)->committed().has_value());
    EXPECT_FALSE(fs::exists(spec.path + ".dcr-version"));
    EXPECT_EQ((*store)->manifest().digest(), f.manifest().digest());
    // Seed it (as a --full refit would) and commit.
    auto src = Checkpoint::Open(WriteFixture(f, "src.safetensors").path,
                                Checkpoint::Mode::kReadOnly);
    ASSERT_TRUE(src.ok());
    auto zeros = Checkpoint::Open(spec.path, Checkpoint::Mode::kReadOnly);
    ASSERT_TRUE(zeros.ok()) << zeros.status().ToString();
    EXPECT_EQ((*zeros)->manifest().digest(), f.manifest().digest());
    EXPECT_EQ((*zeros)->metadata(), f.metadata);
    for (size_t i = 0; i < (*zeros)->manifest().size(); ++i) {
      EXPECT_TRUE(AllZero((*zeros)->TensorData(i))) << i;
    }
    EXPECT_EQ((*store)->Digests().version, (*zeros)->ComputeDigests().version);
    CopyBits(**src, store->get());
    const Version v{0, (*src)->ComputeDigests().version};
    ASSERT_TRUE((*store)->Commit(v, TestRefitId(4)).ok());
  }
  auto cp = Checkpoint::Open(spec.path, Checkpoint::Mode::kReadOnly);
  ASSERT_TRUE(cp.ok());
  auto reopened = OpenStore(spec);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->committed()->digest, (*cp)->ComputeDigests().version);
  reopened->reset();

  auto again = CreateStore(spec, f.manifest(), f.metadata);
  ASSERT_FALSE(again.ok());
  EXPECT_TRUE(again.status().IsInvalidArgument());
  EXPECT_THAT(std::string(again.status().message()),
              HasSubstr("already exists"));

  ASSERT_TRUE(RemoveStore(spec).ok());
  EXPECT_FALSE(fs::exists(spec.path));
  EXPECT_FALSE(fs::exists(spec.path + ".dcr-version"));
  EXPECT_TRUE(RemoveStore(spec).ok());  // idempotent
  auto gone = OpenStore(spec);
  ASSERT_FALSE(gone.ok());
  EXPECT_TRUE(gone.status().IsNotFound());
}

TEST_F(StoreTest, ShardedDirectoryStore) {
  Fixture f;
  const StoreSpec spec = FileSpec("sharded");
  ASSERT_TRUE(
      WriteShardedSafetensors(spec.path, f.tensors, f.metadata, 300).ok());
  const Version v{5, Digest128{5, 5}};
  {
    auto store = OpenStore(spec);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_EQ((*store)->record_path(), Path("sharded/store.dcr-version"));
    auto cp = Checkpoint::Open(spec.path, Checkpoint::Mode::kReadOnly);
    ASSERT_TRUE(cp.ok());
    EXPECT_EQ((*store)->Digests().version, (*cp)->ComputeDigests().version);
    ASSERT_TRUE((*store)->Commit(v, TestRefitId(5)).ok());
  }
  // The record does not confuse the checkpoint reader.
  ASSERT_TRUE(Checkpoint::Open(spec.path, Checkpoint::Mode::kReadOnly).ok());
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->committed(), v);
  EXPECT_TRUE(RemoveStore(spec).IsInvalidArgument());
}

TEST_F(StoreTest, RecordPathOverride) {
  Fixture f;
  StoreSpec spec = WriteFixture(f, "p.safetensors");
  fs::create_directory(Path("state"));
  spec.record_path = Path("state/p.dcr-version");
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE(
      (*store)->Commit(Version{1, Digest128{1, 1}}, TestRefitId(1)).ok());
  EXPECT_TRUE(fs::exists(spec.record_path));
  EXPECT_FALSE(fs::exists(spec.path + ".dcr-version"));

  spec.record_path = Path("missing_dir/p.dcr-version");
  store->reset();
  auto bad = OpenStore(spec);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kIOError);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("missing_dir"));
}

// A record of an earlier build names versions by XXH3 digests (formats 1
// and 2): the store re-hashes it once at open, drops what it cannot prove,
// or refuses it with the way out (dcr/store.h "Digests").
TEST_F(StoreTest, ConcurrentDisjointWrites) {
  Fixture f;
  auto store = CreateStore(FileSpec("c.safetensors"), f.manifest());
  ASSERT_TRUE(store.ok());
  WeightStore& s = **store;
  ThreadPool pool(4);
  pool.ParallelFor(s.manifest().size(), [&s](size_t i, size_t) {
    for (std::byte& b : s.MutableTensor(i)) b = static_cast<std::byte>(i + 1);
  });
  for (size_t i = 0; i < s.manifest().size(); ++i) {
    for (std::byte b : s.Tensor(i)) {
      ASSERT_EQ(b, static_cast<std::byte>(i + 1));
    }
  }
}

// WriteTensor and ModifyTensor leave the bits a change through
// MutableTensor would, on every backend and both of a file store's paths
// (pread and pwrite where the temporary directory is on a local disk
// filesystem, the mapping on tmpfs), and refuse a range past the tensor's
// end without writing anything.
TEST_F(StoreTest, WriteTensorWritesTheBitsOnEveryBackend) {
  Fixture f;
  Fixture g(2);  // the bits to write
  struct Unlink {
    std::string path;
    ~Unlink() {
      if (!path.empty()) ::unlink(path.c_str());
    }
  } tmpfs_file;
  std::vector<std::pair<std::string, StoreSpec>> specs;
  specs.emplace_back("file", WriteFixture(f, "w.safetensors"));
  StoreSpec sharded = FileSpec("w-sharded");
  ASSERT_TRUE(
      WriteShardedSafetensors(sharded.path, f.tensors, f.metadata, 300).ok());
  specs.emplace_back("sharded", sharded);
  if (fs::is_directory("/dev/shm")) {
    StoreSpec t;
    t.kind = StoreSpec::Kind::kFile;
    t.path = "/dev/shm/dcr_store_test_" + std::to_string(::getpid()) +
             ".safetensors";
    t.record_path = Path("tmpfs.dcr-version");
    tmpfs_file.path = t.path;
    ASSERT_TRUE(WriteSafetensors(t.path, f.tensors, f.metadata).ok());
    specs.emplace_back("file on tmpfs", t);
  }
  ShmName shm(Path("w-shm.dcr-version"));
  specs.emplace_back("shm", shm.spec());
  auto flip_all = [](std::span<std::byte> bytes) {
    ADD_FAILURE() << "called for a range past the end";
    for (std::byte& b : bytes) b ^= std::byte{0xff};
    return Status::OK();
  };
  for (auto& [what, spec] : specs) {
    SCOPED_TRACE(what);
    auto store = spec.kind == StoreSpec::Kind::kShm
                     ? CreateStore(spec, f.manifest(), f.metadata)
                     : OpenStore(spec);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    WeightStore& s = **store;
    // g's bits of the store's tensor i (the manifest is in canonical order).
    auto bits = [&](size_t i) -> std::span<const std::byte> {
      for (size_t k = 0; k < g.infos.size(); ++k) {
        if (g.infos[k].name == s.manifest()[i].name) return g.data[k];
      }
      return {};
    };
    for (size_t i = 0; i < s.manifest().size(); ++i) {
      std::span<const std::byte> src = bits(i);
      // Two writes: the second half, then the first.
      size_t half = src.size() / 2;
      ASSERT_TRUE(s.WriteTensor(i, half, src.subspan(half)).ok());
      ASSERT_TRUE(s.WriteTensor(i, 0, src.first(half)).ok());
      ASSERT_EQ(s.Tensor(i).size(), src.size());
      EXPECT_TRUE(std::equal(src.begin(), src.end(), s.Tensor(i).begin()))
          << s.manifest()[i].name;
      // ModifyTensor: fn sees the bits and what it leaves is the tensor's
      // (flipped in the second half, then flipped back).
      auto flip = [&](std::span<std::byte> bytes) {
        for (std::byte& b : bytes) b ^= std::byte{0xff};
        return Status::OK();
      };
      const size_t rest = src.size() - half;
      ASSERT_TRUE(s.ModifyTensor(i, half, rest, 0, rest,
                                 [&](std::span<std::byte> bytes) {
                                   EXPECT_TRUE(std::equal(bytes.begin(),
                                                          bytes.end(),
                                                          src.begin() + half));
                                   return flip(bytes);
                                 })
                      .ok());
      for (size_t k = 0; k < src.size(); ++k) {
        const std::byte want = k < half ? src[k] : src[k] ^ std::byte{0xff};
        ASSERT_EQ(s.Tensor(i)[k], want) << s.manifest()[i].name << " " << k;
      }
      ASSERT_TRUE(s.ModifyTensor(i, half, rest, 0, rest, flip).ok());
      EXPECT_TRUE(std::equal(src.begin(), src.end(), s.Tensor(i).begin()));
    }
    // Past the end: refused, nothing written.
    const int64_t embed = s.manifest().Find("model.embed");
    ASSERT_GE(embed, 0);
    std::vector<std::byte> before(s.Tensor(embed).begin(),
                                  s.Tensor(embed).end());
    ASSERT_FALSE(before.empty());
    std::vector<std::byte> ones(before.size(), std::byte{0xff});
    Status past = s.WriteTensor(embed, 1, ones);
    EXPECT_TRUE(past.IsInvalidArgument()) << past.ToString();
    EXPECT_THAT(past.ToString(), HasSubstr("model.embed"));
    EXPECT_TRUE(
        s.WriteTensor(embed, before.size() + 1, {}).IsInvalidArgument());
    Status past_modify =
        s.ModifyTensor(embed, 1, before.size(), 0, before.size(), flip_all);
    EXPECT_TRUE(past_modify.IsInvalidArgument()) << past_modify.ToString();
    EXPECT_THAT(past_modify.ToString(), HasSubstr("model.embed"));
    EXPECT_TRUE(
        std::equal(before.begin(), before.end(), s.Tensor(embed).begin()));
    if (spec.kind == StoreSpec::Kind::kFile) {
      // The file holds the bits (read past the store's mapping).
      store->reset();
      auto cp = Checkpoint::Open(spec.path, Checkpoint::Mode::kReadOnly);
      ASSERT_TRUE(cp.ok());
      for (size_t k = 0; k < g.infos.size(); ++k) {
        int64_t i = (*cp)->manifest().Find(g.infos[k].name);
        ASSERT_GE(i, 0);
        EXPECT_TRUE(std::equal(g.data[k].begin(), g.data[k].end(),
                               (*cp)->TensorData(i).begin()))
            << g.infos[k].name;
      }
    }
  }
  // A memory store takes the default path.
  auto mem = CreateStore(StoreSpec{}, f.manifest());
  ASSERT_TRUE(mem.ok());
  const int64_t embed = (*mem)->manifest().Find("model.embed");
  ASSERT_GE(embed, 0);
  ASSERT_TRUE((*mem)->WriteTensor(embed, 0, g.data[1]).ok());
  EXPECT_TRUE(std::equal(g.data[1].begin(), g.data[1].end(),
                         (*mem)->Tensor(embed).begin()));
  ASSERT_TRUE((*mem)
                  ->ModifyTensor(embed, 2, 3, 0, 3,
                                 [&](std::span<std::byte> bytes) {
                                   EXPECT_EQ(bytes.data(),
                                             (*mem)->Tensor(embed).data() + 2);
                                   bytes[0] = ~g.data[1][2];
                                   return Status::OK();
                                 })
                  .ok());
  EXPECT_EQ((*mem)->Tensor(embed)[2], ~g.data[1][2]);
  EXPECT_TRUE((*mem)->WriteTensor(embed, 1, g.data[1]).IsInvalidArgument());
}

}  // namespace
}  // namespace dcr
