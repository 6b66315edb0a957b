// WeightStore backends: create, open, write, commit, restart (destroy and
// reopen), refit-in-progress records, digests, and failure paths.
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

namespace dcr {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::ReadAllOrStatus;
using testing::TestRefitId;

using ::testing::Not;

std::vector<std::byte> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (std::byte& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// Tensors of several dtypes, including a scalar and a zero-size tensor.
struct Fixture {
  std::vector<TensorInfo> infos = {
      {"model.layers.0.weight", DType::kBF16, {8, 16}},
      {"model.embed", DType::kF32, {10, 4}},
      {"scalar", DType::kF64, {}},
      {"empty", DType::kF16, {0, 7}},
      {"ids", DType::kI64, {6}},
  };
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorToWrite> tensors;
  std::map<std::string, std::string> metadata = {{"format", "pt"}};

  explicit Fixture(uint32_t seed = 1) {
    for (size_t i = 0; i < infos.size(); ++i) {
      data.push_back(RandomBytes(infos[i].NumBytes(), seed * 1000 + i));
    }
    for (size_t i = 0; i < infos.size(); ++i) {
      tensors.push_back({infos[i], data[i]});
    }
  }
  Manifest manifest() const { return *Manifest::Create(infos); }
};

// Copies every tensor of `from` into `to` (same manifest).
void CopyBits(const Checkpoint& from, WeightStore* to) {
  for (size_t i = 0; i < from.manifest().size(); ++i) {
    const auto src = from.TensorData(i);
    if (!src.empty())
      std::memcpy(to->MutableTensor(i).data(), src.data(), src.size());
  }
}

bool AllZero(std::span<const std::byte> bytes) {
  for (std::byte b : bytes) {
    if (b != std::byte{0}) return false;
  }
  return true;
}

// Runs `body` in a child process that dropped root privileges (root ignores
// permissions); returns the child's exit code, or -1.
template <typename F>
int RunAsNobody(F body) {
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) {
      ::_exit(10);
    }
    ::_exit(body());
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// A shm name unique to this process and test; the object and its record
// are removed on destruction.
class ShmName {
 public:
  explicit ShmName(std::string record_path = "") {
    static std::atomic<int> counter{0};
    spec_.kind = StoreSpec::Kind::kShm;
    spec_.path = "/dcr_store_test_" + std::to_string(::getpid()) + "_" +
                 std::to_string(counter++);
    spec_.record_path = std::move(record_path);
    (void)RemoveStore(spec_);
  }
  ~ShmName() { (void)RemoveStore(spec_); }
  const StoreSpec& spec() const { return spec_; }

 private:
  StoreSpec spec_;
};

class StoreTest : public ::testing::Test {
 protected:
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_.path(), fs::perms::owner_all, fs::perm_options::add,
                    ec);
  }
  std::string Path(const std::string& name) const { return dir_.Path(name); }
  StoreSpec FileSpec(const std::string& name) const {
    StoreSpec s;
    s.kind = StoreSpec::Kind::kFile;
    s.path = Path(name);
    return s;
  }
  // Writes the fixture as a single safetensors file and returns its spec.
  StoreSpec WriteFixture(const Fixture& f, const std::string& name) {
    EXPECT_TRUE(WriteSafetensors(Path(name), f.tensors, f.metadata).ok());
    return FileSpec(name);
  }

  testing::TempDir dir_;
};

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
TEST_F(StoreTest, ALegacyRecordIsReHashedOnceOrRefused) {
  Fixture f;
  const StoreSpec spec = WriteFixture(f, "legacy.safetensors");
  const std::string record_path = spec.path + ".dcr-version";
  Digest128 manifest, legacy, linear;
  {
    auto cp = Checkpoint::Open(spec.path, Checkpoint::Mode::kReadOnly);
    ASSERT_TRUE(cp.ok()) << cp.status().ToString();
    const Manifest& m = (*cp)->manifest();
    std::vector<Digest128> old_digests, digests;
    for (size_t i = 0; i < m.size(); ++i) {
      old_digests.push_back(Hash128((*cp)->TensorData(i)));
      digests.push_back(TensorDigest((*cp)->TensorData(i)));
    }
    manifest = m.digest();
    legacy = VersionDigest(manifest, old_digests);
    linear = VersionDigest(manifest, digests);
  }
  ASSERT_NE(legacy, linear);
  auto legacy_record = [&](const Digest128& digest) {
    VersionRecord r;
    r.legacy_digests = true;
    r.manifest = manifest;
    r.committed =
        CommitInfo{Version{7, digest}, TestRefitId(7), "2025-01-31T12:00:00Z"};
    return r;
  };
  {
    VersionRecord r = legacy_record(legacy);
    r.unsynced = DataUnsynced{"591d10e2-3430-4a89-b5d5-a8e923fe2051",
                              "2025-01-31T12:01:00Z", Version{6, legacy}};
    // Written as it was read: format 2 (legacy digests, a mark).
    ASSERT_TRUE(WriteVersionRecord(record_path, r).ok());
    EXPECT_THAT(ReadAllOrStatus(record_path), HasSubstr("{\"format\":2,"));
  }
  {
    auto s = OpenStore(spec);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ((*s)->committed(), (Version{7, linear}));
    EXPECT_EQ((*s)->Digests(nullptr).version, linear);
    EXPECT_FALSE((*s)->record().legacy_digests);
  }
  auto upgraded = ReadVersionRecord(record_path);
  ASSERT_TRUE(upgraded.ok() && *upgraded);
  EXPECT_FALSE((*upgraded)->legacy_digests);
  EXPECT_EQ((*upgraded)->committed->version, (Version{7, linear}));
  // The mark (another boot's) was settled; its synced version is gone
  // either way, since it could not be re-hashed.
  if ((*upgraded)->unsynced) {
    EXPECT_FALSE((*upgraded)->unsynced->synced);
  }
  EXPECT_THAT(ReadAllOrStatus(record_path), Not(HasSubstr("{\"format\":1,")));

  // Bits that do not hold the version the record names.
  ASSERT_TRUE(
      WriteVersionRecord(record_path, legacy_record(Digest128{1, 2})).ok());
  auto wrong = OpenStore(spec);
  ASSERT_FALSE(wrong.ok());
  EXPECT_TRUE(wrong.status().IsCorruption());
  EXPECT_THAT(std::string(wrong.status().message()),
              AllOf(HasSubstr("earlier dcr"), HasSubstr("do not hold"),
                    HasSubstr("dcr refit --full --node")));
  // Refused records are left as they were.
  {
    auto kept = ReadVersionRecord(record_path);
    ASSERT_TRUE(kept.ok() && *kept);
    EXPECT_EQ((*kept)->committed->version.digest, (Digest128{1, 2}));
    EXPECT_TRUE((*kept)->legacy_digests);
  }
  // The same under an "unsynced" mark: a write-back the host lost. The
  // store opens never committed, to be seeded.
  {
    VersionRecord lost = legacy_record(Digest128{1, 2});
    lost.unsynced = DataUnsynced{"591d10e2-3430-4a89-b5d5-a8e923fe2051",
                                 "2025-01-31T12:01:00Z", std::nullopt};
    ASSERT_TRUE(WriteVersionRecord(record_path, lost).ok());
    auto s = OpenStore(spec);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_FALSE((*s)->committed().has_value());
    EXPECT_FALSE((*s)->record().unsynced);
  }
  // A refit in progress under the old digests: no build can finish it
  // now, so the store opens never committed, to be seeded.
  VersionRecord busy = legacy_record(legacy);
  busy.in_progress =
      RefitInProgress{TestRefitId(8), Version{7, legacy},
                      Version{8, Digest128{}}, "2025-01-31T12:02:00Z"};
  ASSERT_TRUE(WriteVersionRecord(record_path, busy).ok());
  {
    auto s = OpenStore(spec);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_FALSE((*s)->committed().has_value());
    EXPECT_FALSE((*s)->InProgress().has_value());
  }
  auto after = ReadVersionRecord(record_path);
  ASSERT_TRUE(after.ok() && *after);
  EXPECT_FALSE((*after)->legacy_digests);
  EXPECT_FALSE((*after)->committed);
  EXPECT_FALSE((*after)->in_progress);
}

TEST_F(StoreTest, CorruptOrForeignRecordFailsOpen) {
  Fixture f;
  const StoreSpec spec = WriteFixture(f, "p.safetensors");
  const std::string record_path = spec.path + ".dcr-version";
  std::ofstream(record_path) << "{\"format\":1,\"manifest\":";
  auto corrupt = OpenStore(spec);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_TRUE(corrupt.status().IsCorruption());
  EXPECT_THAT(std::string(corrupt.status().message()), HasSubstr(record_path));

  // A well-formed record of another manifest: the data was replaced.
  VersionRecord foreign;
  foreign.manifest = Digest128{1, 2};
  ASSERT_TRUE(WriteVersionRecord(record_path, foreign).ok());
  auto mismatch = OpenStore(spec);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_TRUE(mismatch.status().IsCorruption());
  EXPECT_THAT(std::string(mismatch.status().message()), HasSubstr("manifest"));

  // Removing the record is the remedy: the store is "never committed".
  fs::remove(record_path);
  auto fine = OpenStore(spec);
  ASSERT_TRUE(fine.ok());
  EXPECT_FALSE((*fine)->committed().has_value());
}

TEST_F(StoreTest, RecordIsReplacedAtomically) {
  Fixture f;
  const StoreSpec spec = WriteFixture(f, "p.safetensors");
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  WeightStore& s = **store;
  const Version v1{1, Digest128{1, 1}};
  const Version v2{2, Digest128{2, 2}};
  ASSERT_TRUE(s.Commit(v1, TestRefitId(1)).ok());
  ASSERT_TRUE(s.WaitDataSync().ok());  // its record update is done too
  const std::string first = ReadAllOrStatus(s.record_path());
  // A reader holding the old record keeps seeing all of it: the new one
  // arrives by rename, never by rewriting the file in place.
  UniqueFd old_fd(::open(s.record_path().c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(old_fd.valid());
  struct stat before;
  ASSERT_EQ(::fstat(old_fd.get(), &before), 0);
  ASSERT_TRUE(s.Commit(v2, TestRefitId(2)).ok());
  ASSERT_TRUE(s.WaitDataSync().ok());
  struct stat after;
  ASSERT_EQ(::stat(s.record_path().c_str(), &after), 0);
  EXPECT_NE(before.st_ino, after.st_ino);
  std::string old_text(first.size() + 16, '\0');
  const ssize_t n = ::pread(old_fd.get(), old_text.data(), old_text.size(), 0);
  ASSERT_GE(n, 0);
  old_text.resize(static_cast<size_t>(n));
  EXPECT_EQ(old_text, first);
  auto now = ReadVersionRecord(s.record_path());
  ASSERT_TRUE(now.ok() && now->has_value());
  EXPECT_EQ((*now)->committed->version, v2);
  EXPECT_FALSE(fs::exists(s.record_path() + ".tmp"));
}

TEST_F(StoreTest, FailedRecordWriteKeepsPreviousRecord) {
  Fixture f;
  const StoreSpec spec = WriteFixture(f, "p.safetensors");
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  WeightStore& s = **store;
  const Version v1{1, Digest128{1, 1}};
  ASSERT_TRUE(s.Commit(v1, TestRefitId(1)).ok());
  ASSERT_TRUE(s.WaitDataSync().ok());
  const std::string first = ReadAllOrStatus(s.record_path());

  // The temporary file cannot be created (as on a full disk), so neither
  // the commit nor a BeginRefit may take effect, on disk or in memory.
  fs::create_directory(s.record_path() + ".tmp");
  Status commit = s.Commit(Version{2, Digest128{2, 2}}, TestRefitId(2));
  EXPECT_EQ(commit.code(), StatusCode::kIOError) << commit.ToString();
  EXPECT_THAT(std::string(commit.message()), HasSubstr(s.record_path()));
  Status begin = s.BeginRefit(TestRefitId(3), v1, Version{3, Digest128{3, 3}});
  EXPECT_EQ(begin.code(), StatusCode::kIOError);
  EXPECT_EQ(ReadAllOrStatus(s.record_path()), first);
  EXPECT_EQ(s.committed(), v1);
  EXPECT_FALSE(s.InProgress().has_value());

  fs::remove(s.record_path() + ".tmp");
  const Version v2{2, Digest128{2, 2}};
  ASSERT_TRUE(s.Commit(v2, TestRefitId(2)).ok());
  EXPECT_EQ(s.committed(), v2);
  store->reset();
  auto reopened = OpenStore(spec);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ((*reopened)->committed(), v2);
}

TEST_F(StoreTest, SecondOpenIsLockedOut) {
  Fixture f;
  const StoreSpec spec = WriteFixture(f, "p.safetensors");
  auto first = OpenStore(spec);
  ASSERT_TRUE(first.ok());
  auto second = OpenStore(spec);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kIOError);
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("already open"));
  first->reset();
  EXPECT_TRUE(OpenStore(spec).ok());
}

TEST_F(StoreTest, UnwritableFileFailsAtOpen) {
  Fixture f;
  const StoreSpec spec = WriteFixture(f, "ro.safetensors");
  fs::permissions(spec.path, fs::perms::owner_read | fs::perms::group_read |
                                 fs::perms::others_read);
  fs::permissions(dir_.path(), fs::perms::all);
  const int rc = RunAsNobody([&spec] {
    auto store = OpenStore(spec);
    if (store.ok()) return 11;
    if (store.status().code() != StatusCode::kIOError) return 12;
    if (std::string(store.status().message()).find(spec.path) ==
        std::string::npos) {
      return 13;
    }
    return 0;
  });
  EXPECT_EQ(rc, 0) << "10: cannot drop privileges, 11: opened, 12: wrong "
                      "code, 13: message lacks the path";
}

TEST_F(StoreTest, UnwritableRecordDirectoryFailsAtOpen) {
  Fixture f;
  StoreSpec spec = WriteFixture(f, "p.safetensors");
  fs::create_directory(Path("state"));
  spec.record_path = Path("state/p.dcr-version");
  fs::permissions(spec.path, fs::perms::all);
  fs::permissions(dir_.path(), fs::perms::all);
  fs::permissions(Path("state"), fs::perms::owner_all | fs::perms::group_read |
                                     fs::perms::group_exec |
                                     fs::perms::others_read |
                                     fs::perms::others_exec);
  const int rc = RunAsNobody([&spec] {
    auto store = OpenStore(spec);
    if (store.ok()) return 11;
    if (store.status().code() != StatusCode::kIOError) return 12;
    if (std::string(store.status().message()).find("state") ==
        std::string::npos) {
      return 13;
    }
    return 0;
  });
  EXPECT_EQ(rc, 0) << "10: cannot drop privileges, 11: opened, 12: wrong "
                      "code, 13: message lacks the directory";
}

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

// WriteTensor leaves the bits a copy through MutableTensor would, on every
// backend and both of a file store's paths (pwrite where the temporary
// directory is on a local disk filesystem, the mapping on tmpfs), and
// refuses a range past the tensor's end without writing anything.
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
  EXPECT_TRUE((*mem)->WriteTensor(embed, 1, g.data[1]).IsInvalidArgument());
}

// --------------------------------------------------------------------- shm

TEST_F(StoreTest, ShmStoreCreateCommitReopen) {
  Fixture f;
  ShmName shm(Path("shm.dcr-version"));
  auto src = Checkpoint::Open(WriteFixture(f, "src.safetensors").path,
                              Checkpoint::Mode::kReadOnly);
  ASSERT_TRUE(src.ok());
  const Version v{1, (*src)->ComputeDigests().version};
  {
    auto store = CreateStore(shm.spec(), f.manifest(), f.metadata);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    WeightStore& s = **store;
    EXPECT_EQ(s.describe(), "shm:" + shm.spec().path);
    EXPECT_EQ(s.record_path(), shm.spec().record_path);
    EXPECT_FALSE(s.committed().has_value());
    for (size_t i = 0; i < s.manifest().size(); ++i) {
      EXPECT_TRUE(AllZero(s.Tensor(i)));
    }
    CopyBits(**src, &s);
    ThreadPool pool(2);
    EXPECT_EQ(s.Digests(&pool).tensors, (*src)->ComputeDigests().tensors);
    EXPECT_EQ(s.Digests(&pool).version, v.digest);
    ASSERT_TRUE(s.BeginRefit(TestRefitId(1), Version{}, v).ok());
    // The lock keeps a second relay out while this one holds the store.
    auto second = OpenStore(shm.spec());
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), StatusCode::kIOError);
  }
  {
    // Restart mid-refit: the bits and the in-progress record are still
    // there.
    auto store = OpenStore(shm.spec());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ASSERT_TRUE((*store)->InProgress().has_value());
    EXPECT_EQ((*store)->InProgress()->target, v);
    EXPECT_EQ((*store)->Digests().version, v.digest);
    ASSERT_TRUE((*store)->Commit(v, TestRefitId(1)).ok());
  }
  auto store = OpenStore(shm.spec());
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->committed(), v);
  EXPECT_FALSE((*store)->InProgress().has_value());
  EXPECT_EQ((*store)->manifest().digest(), f.manifest().digest());

  auto again = CreateStore(shm.spec(), f.manifest());
  ASSERT_FALSE(again.ok());
  EXPECT_TRUE(again.status().IsInvalidArgument());
}

TEST_F(StoreTest, ShmImageIsASafetensorsFileForAServingProcess) {
  Fixture f;
  ShmName shm(Path("shm.dcr-version"));
  auto store = CreateStore(shm.spec(), f.manifest(), f.metadata);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto src = Checkpoint::Open(WriteFixture(f, "src.safetensors").path,
                              Checkpoint::Mode::kReadOnly);
  ASSERT_TRUE(src.ok());
  CopyBits(**src, store->get());

  // What a serving process does: shm_open read-only, mmap, parse.
  UniqueFd fd(::shm_open(shm.spec().path.c_str(), O_RDONLY | O_CLOEXEC, 0));
  ASSERT_TRUE(fd.valid());
  struct stat st;
  ASSERT_EQ(::fstat(fd.get(), &st), 0);
  const size_t size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  ASSERT_NE(p, MAP_FAILED);
  const std::span<const std::byte> image(static_cast<const std::byte*>(p),
                                         size);
  auto header = ParseSafetensorsHeader(image, size, "reader");
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_EQ(header->metadata, f.metadata);
  ASSERT_EQ(header->tensors.size(), f.infos.size());
  for (const SafetensorsEntry& e : header->tensors) {
    const int64_t idx = (*src)->manifest().Find(e.info.name);
    ASSERT_GE(idx, 0);
    EXPECT_EQ(e.info, (*src)->manifest()[idx]);
    const auto want = (*src)->TensorData(idx);
    const auto got =
        image.subspan(header->data_offset + e.begin, e.end - e.begin);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end()))
        << e.info.name;
  }
  // Byte for byte the file WriteSafetensors writes for the same bits.
  const std::string file = ReadAllOrStatus(Path("src.safetensors"));
  ASSERT_EQ(file.size(), size);
  EXPECT_EQ(std::memcmp(file.data(), p, size), 0);
  ::munmap(p, size);
}

TEST_F(StoreTest, ShmDefaultRecordAndRemove) {
  Fixture f;
  ShmName shm;  // default record path under /dev/shm
  const std::string record_path = DefaultRecordPath(shm.spec());
  {
    auto store = CreateStore(shm.spec(), f.manifest());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_EQ((*store)->record_path(), record_path);
    ASSERT_TRUE(
        (*store)->Commit(Version{1, Digest128{1, 1}}, TestRefitId(1)).ok());
    EXPECT_TRUE(fs::exists(record_path));
  }
  ASSERT_TRUE(RemoveStore(shm.spec()).ok());
  EXPECT_FALSE(fs::exists(record_path));
  auto gone = OpenStore(shm.spec());
  ASSERT_FALSE(gone.ok());
  EXPECT_TRUE(gone.status().IsNotFound()) << gone.status().ToString();
  EXPECT_TRUE(RemoveStore(shm.spec()).ok());
}

TEST_F(StoreTest, ShmWithCorruptImageFailsOpen) {
  ShmName shm(Path("shm.dcr-version"));
  UniqueFd fd(::shm_open(shm.spec().path.c_str(),
                         O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  ASSERT_TRUE(fd.valid());
  ASSERT_EQ(::ftruncate(fd.get(), 64), 0);  // zeros: header length 0
  fd.Reset();
  auto store = OpenStore(shm.spec());
  ASSERT_FALSE(store.ok());
  EXPECT_TRUE(store.status().IsCorruption()) << store.status().ToString();
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr(shm.spec().path));
}

TEST_F(StoreTest, ShmStoreWithNoTensors) {
  ShmName shm(Path("shm.dcr-version"));
  const Manifest empty = *Manifest::Create({});
  auto store = CreateStore(shm.spec(), empty);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->manifest().size(), 0u);
  EXPECT_EQ((*store)->Digests().manifest, empty.digest());
}

// ------------------------------------------------- background write-back

// A boot id that is not this one.
constexpr const char* kOtherBoot = "00000000-1111-2222-3333-444444444444";

class DataSyncTest : public StoreTest {
 protected:
  void TearDown() override {
    DisarmFailpoints();
    StoreTest::TearDown();
  }
  // A file store of Fixture(1) committed at its own digest (step 1), the
  // write-back finished.
  StoreSpec Committed(const Fixture& f, Version* v) {
    const StoreSpec spec = WriteFixture(f, "p.safetensors");
    auto store = OpenStore(spec);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    *v = Version{1, (*store)->Digests().version};
    EXPECT_TRUE((*store)->Commit(*v, TestRefitId(1)).ok());
    EXPECT_TRUE((*store)->WaitDataSync().ok());
    return spec;
  }
  // Rewrites the record at `path` with an "unsynced" mark of `boot` (and
  // the version on disk when it was put, if known).
  static void Mark(const std::string& path, const std::string& boot,
                   std::optional<Version> synced = std::nullopt) {
    auto rec = ReadVersionRecord(path);
    ASSERT_TRUE(rec.ok() && rec->has_value());
    VersionRecord r = **rec;
    r.unsynced = DataUnsynced{boot, "2026-01-01T00:00:00Z", synced};
    ASSERT_TRUE(WriteVersionRecord(path, r).ok());
  }
  // Flips one bit of the "ids" tensor in the store file, behind dcr's back.
  static void FlipAByte(const std::string& path) {
    auto cp = Checkpoint::Open(path, Checkpoint::Mode::kReadWrite);
    ASSERT_TRUE(cp.ok());
    const int64_t ids = (*cp)->manifest().Find("ids");
    ASSERT_GE(ids, 0);
    (*cp)->MutableTensorData(ids)[3] ^= std::byte{0x10};
    ASSERT_TRUE((*cp)->Flush().ok());
  }
  // The record at `path` once the write-back dropped its mark, or as it is
  // after `limit` if it did not (polled; the write-back runs on its own
  // thread and tells no one).
  static std::optional<VersionRecord> Unmarked(
      const std::string& path, std::chrono::milliseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    std::optional<VersionRecord> rec = OnDisk(path);
    while (rec && rec->unsynced && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      rec = OnDisk(path);
    }
    return rec;
  }
  static std::optional<VersionRecord> OnDisk(const std::string& path) {
    auto rec = ReadVersionRecord(path);
    EXPECT_TRUE(rec.ok()) << rec.status().ToString();
    return rec.ok() ? *rec : std::nullopt;
  }
};

TEST_F(DataSyncTest, ACommitIsMarkedUntilTheWriteBackClearsIt) {
  auto boot = CurrentBootId();
  ASSERT_TRUE(boot.ok()) << boot.status().ToString();
  Fixture f;
  const StoreSpec spec = WriteFixture(f, "p.safetensors");
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  WeightStore& s = **store;
  // Hold the write-back, so the marked record can be seen.
  ASSERT_TRUE(ArmFailpoints("store.data_sync=delay(300)").ok());
  const Version v{1, s.Digests().version};
  ASSERT_TRUE(s.Commit(v, TestRefitId(1)).ok());
  auto marked = OnDisk(s.record_path());
  ASSERT_TRUE(marked && marked->unsynced);
  EXPECT_EQ(marked->unsynced->boot_id, *boot);
  EXPECT_EQ(marked->committed->version, v);
  // Nothing was committed before: no version is known to be on disk.
  EXPECT_FALSE(marked->unsynced->synced);
  ASSERT_TRUE(s.WaitDataSync().ok());
  // The next commit's mark names the version on disk before it.
  const Version v2{2, Digest128{2, 2}};
  ASSERT_TRUE(s.BeginRefit(TestRefitId(2), v, v2).ok());
  ASSERT_TRUE(s.Commit(v2, TestRefitId(2)).ok());
  marked = OnDisk(s.record_path());
  ASSERT_TRUE(marked && marked->unsynced);
  EXPECT_EQ(marked->unsynced->synced, v);
  // A third commit before the write-back keeps the first mark.
  const Version v3{3, Digest128{3, 3}};
  ASSERT_TRUE(s.BeginRefit(TestRefitId(3), v2, v3).ok());
  ASSERT_TRUE(s.Commit(v3, TestRefitId(3)).ok());
  marked = OnDisk(s.record_path());
  if (marked && marked->unsynced) {
    EXPECT_EQ(marked->unsynced->synced, v);
  }
  const Version& last = v3;
  EXPECT_THAT(ReadAllOrStatus(s.record_path()), HasSubstr("{\"format\":4,"));
  ASSERT_TRUE(s.WaitDataSync().ok());
  auto cleared = OnDisk(s.record_path());
  ASSERT_TRUE(cleared);
  EXPECT_FALSE(cleared->unsynced);
  EXPECT_EQ(cleared->committed->version, last);
  EXPECT_FALSE(s.record().unsynced);
  EXPECT_THAT(ReadAllOrStatus(s.record_path()), HasSubstr("{\"format\":3,"));
}

// StoreSpec::write_back_delay: the write-back starts that long after the
// first commit it serves, so a commit within the wait shares it.
TEST_F(DataSyncTest, TheWriteBackWaitsOutItsDelayForEveryCommitInIt) {
  using Clock = std::chrono::steady_clock;
  Fixture f;
  StoreSpec spec = WriteFixture(f, "p.safetensors");
  spec.write_back_delay = std::chrono::milliseconds(600);
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  WeightStore& s = **store;
  const Version v1{1, s.Digests().version};
  const Clock::time_point t0 = Clock::now();
  ASSERT_TRUE(s.Commit(v1, TestRefitId(1)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto rec = OnDisk(s.record_path());
  ASSERT_TRUE(rec);
  if (Clock::now() - t0 < std::chrono::milliseconds(500)) {
    EXPECT_TRUE(rec->unsynced);
  }
  const Version v2{2, Digest128{2, 2}};
  ASSERT_TRUE(s.BeginRefit(TestRefitId(2), v1, v2).ok());
  ASSERT_TRUE(s.Commit(v2, TestRefitId(2)).ok());
  const bool within = Clock::now() - t0 < std::chrono::milliseconds(500);
  // The first record seen without the mark names v2: one write-back
  // served both commits (when the second came within the delay).
  rec = Unmarked(s.record_path(), std::chrono::seconds(5));
  ASSERT_TRUE(rec);
  const auto cleared_after = Clock::now() - t0;
  ASSERT_FALSE(rec->unsynced) << "still marked after 5 s";
  EXPECT_GE(cleared_after, std::chrono::milliseconds(600));
  if (within) {
    EXPECT_EQ(rec->committed->version, v2);
  }
}

// Who waits for the data, or closes the store, does not wait the delay out.
TEST_F(DataSyncTest, WaitingOrClosingWritesBackAtOnce) {
  using Clock = std::chrono::steady_clock;
  Fixture f;
  StoreSpec spec = WriteFixture(f, "p.safetensors");
  spec.write_back_delay = std::chrono::seconds(60);
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  const Version v1{1, (*store)->Digests().version};
  ASSERT_TRUE((*store)->Commit(v1, TestRefitId(1)).ok());
  Clock::time_point t0 = Clock::now();
  ASSERT_TRUE((*store)->WaitDataSync().ok());
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(30));
  auto rec = OnDisk((*store)->record_path());
  ASSERT_TRUE(rec);
  EXPECT_FALSE(rec->unsynced);
  const Version v2{2, Digest128{2, 2}};
  ASSERT_TRUE((*store)->BeginRefit(TestRefitId(2), v1, v2).ok());
  ASSERT_TRUE((*store)->Commit(v2, TestRefitId(2)).ok());
  const std::string record_path = (*store)->record_path();
  t0 = Clock::now();
  store->reset();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(30));
  rec = OnDisk(record_path);
  ASSERT_TRUE(rec);
  EXPECT_FALSE(rec->unsynced);
  EXPECT_EQ(rec->committed->version, v2);
}

// A record someone else wrote, or removed, while a write-back waited out
// its delay (a file and record put back under a process that keeps the
// store open) is left as it is: the write-back does not put its own back.
TEST_F(DataSyncTest, AWriteBackLeavesARecordItDidNotWrite) {
  Fixture f;
  StoreSpec spec = WriteFixture(f, "p.safetensors");
  spec.write_back_delay = std::chrono::seconds(60);
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  const Version v1{1, (*store)->Digests().version};
  ASSERT_TRUE((*store)->Commit(v1, TestRefitId(1)).ok());
  const std::string path = (*store)->record_path();
  auto mine = OnDisk(path);
  ASSERT_TRUE(mine && mine->unsynced);
  VersionRecord theirs = *mine;
  theirs.unsynced.reset();
  theirs.committed->version = Version{7, Digest128{7, 7}};
  ASSERT_TRUE(WriteVersionRecord(path, theirs).ok());
  ASSERT_TRUE((*store)->WaitDataSync().ok());
  auto rec = OnDisk(path);
  ASSERT_TRUE(rec);
  EXPECT_EQ(rec->committed->version, theirs.committed->version);
  // Removed: still not put back.
  ASSERT_TRUE((*store)->BeginRefit(TestRefitId(2), v1, v1).ok());
  ASSERT_TRUE((*store)->Commit(v1, TestRefitId(2)).ok());
  std::filesystem::remove(path);
  ASSERT_TRUE((*store)->WaitDataSync().ok());
  EXPECT_FALSE(std::filesystem::exists(path));
}

// A write-back during which a record was written (the next refit began)
// cannot drop the mark; the next one then starts at its commit, without
// the delay, or refits closer together than the delay would keep the
// mark for ever.
TEST_F(DataSyncTest, AWriteBackThatKeptTheMarkMakesTheNextOneDueAtOnce) {
  using Clock = std::chrono::steady_clock;
  Fixture f;
  StoreSpec spec = WriteFixture(f, "p.safetensors");
  spec.write_back_delay = std::chrono::seconds(60);
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  WeightStore& s = **store;
  const Version v1{1, s.Digests().version};
  const Version v2{2, Digest128{2, 2}};
  ASSERT_TRUE(ArmFailpoints("store.data_sync=delay(500)@1").ok());
  ASSERT_TRUE(s.Commit(v1, TestRefitId(1)).ok());
  // A waiter starts the write-back; the failpoint holds it while the next
  // refit begins.
  std::thread waiter([&] { EXPECT_TRUE(s.WaitDataSync().ok()); });
  const FailpointId point = FailpointIdOf("store.data_sync");
  for (int i = 0; i < 500 && TEST_FailpointHits(point) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(TEST_FailpointHits(point), 1u);
  ASSERT_TRUE(s.BeginRefit(TestRefitId(2), v1, v2).ok());
  waiter.join();
  auto rec = OnDisk(s.record_path());
  ASSERT_TRUE(rec && rec->unsynced && rec->in_progress);
  const Clock::time_point t0 = Clock::now();
  ASSERT_TRUE(s.Commit(v2, TestRefitId(2)).ok());
  rec = Unmarked(s.record_path(), std::chrono::seconds(10));
  ASSERT_TRUE(rec);
  EXPECT_FALSE(rec->unsynced) << "still marked, the delay waited out";
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(30));
  EXPECT_EQ(rec->committed->version, v2);
}

TEST_F(DataSyncTest, SyncingAtCommitNeverMarks) {
  Fixture f;
  StoreSpec spec = WriteFixture(f, "p.safetensors");
  spec.data_sync = StoreSpec::DataSync::kAtCommit;
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE(ArmFailpoints("store.data_sync=drop").ok());  // never reached
  const Version v{1, (*store)->Digests().version};
  ASSERT_TRUE((*store)->Commit(v, TestRefitId(1)).ok());
  auto rec = OnDisk((*store)->record_path());
  ASSERT_TRUE(rec);
  EXPECT_FALSE(rec->unsynced);
  EXPECT_EQ(rec->committed->version, v);
  EXPECT_TRUE((*store)->WaitDataSync().ok());
}

TEST_F(DataSyncTest, ARecordWrittenDuringTheWriteBackKeepsTheMark) {
  Fixture f;
  Version v1;
  const StoreSpec spec = Committed(f, &v1);
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  WeightStore& s = **store;
  const Version v2{2, Digest128{2, 2}};
  ASSERT_TRUE(ArmFailpoints("store.data_sync=delay(300)").ok());
  ASSERT_TRUE(s.BeginRefit(TestRefitId(2), v1, v2).ok());
  ASSERT_TRUE(s.EndRefit().ok());  // base restored: marked, write-back held
  // The next refit starts while the write-back runs: what that write-back
  // covered is not known, so the mark must stay.
  ASSERT_TRUE(s.BeginRefit(TestRefitId(3), v1, v2).ok());
  ASSERT_TRUE(s.WaitDataSync().ok());
  auto rec = OnDisk(s.record_path());
  ASSERT_TRUE(rec && rec->unsynced && rec->in_progress);
  EXPECT_EQ(rec->in_progress->refit, TestRefitId(3));
  // Its commit queues another write-back, which clears it.
  ASSERT_TRUE(s.Commit(v2, TestRefitId(3)).ok());
  ASSERT_TRUE(s.WaitDataSync().ok());
  rec = OnDisk(s.record_path());
  ASSERT_TRUE(rec);
  EXPECT_FALSE(rec->unsynced);
  EXPECT_FALSE(rec->in_progress);
  EXPECT_EQ(rec->committed->version, v2);
}

TEST_F(DataSyncTest, AFailedWriteBackIsReportedAndKeepsTheMark) {
  Fixture f;
  Version v1;
  const StoreSpec spec = Committed(f, &v1);
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok());
  WeightStore& s = **store;
  ASSERT_TRUE(ArmFailpoints("store.data_sync=drop").ok());
  const Version v2{2, Digest128{2, 2}};
  ASSERT_TRUE(s.BeginRefit(TestRefitId(2), v1, v2).ok());
  ASSERT_TRUE(s.Commit(v2, TestRefitId(2)).ok());
  Status st = s.WaitDataSync();
  EXPECT_EQ(st.code(), StatusCode::kIOError) << st.ToString();
  EXPECT_THAT(st.ToString(), HasSubstr("store.data_sync"));
  EXPECT_TRUE(s.WaitDataSync().ok());  // reported once
  auto rec = OnDisk(s.record_path());
  ASSERT_TRUE(rec && rec->unsynced);
  EXPECT_EQ(rec->committed->version, v2);
  // A later write-back that succeeds does not prove the failed pages
  // reached the disk (the kernel reports such an error once): the mark
  // stays for the rest of the process.
  DisarmFailpoints();
  const Version v3{3, Digest128{3, 3}};
  ASSERT_TRUE(s.BeginRefit(TestRefitId(3), v2, v3).ok());
  ASSERT_TRUE(s.Commit(v3, TestRefitId(3)).ok());
  EXPECT_TRUE(s.WaitDataSync().ok());
  rec = OnDisk(s.record_path());
  ASSERT_TRUE(rec && rec->unsynced);
  EXPECT_EQ(rec->committed->version, v3);
}

TEST_F(DataSyncTest, DestroyingAStoreFinishesItsWriteBack) {
  Fixture f;
  Version v1;
  const StoreSpec spec = Committed(f, &v1);
  std::string record_path;
  {
    auto store = OpenStore(spec);
    ASSERT_TRUE(store.ok());
    WeightStore& s = **store;
    record_path = s.record_path();
    // The first write-back is held; the second commit's request queues
    // behind it and is still pending when the store is destroyed.
    ASSERT_TRUE(ArmFailpoints("store.data_sync=delay(300)@1").ok());
    const Version v2{2, Digest128{2, 2}};
    ASSERT_TRUE(s.BeginRefit(TestRefitId(2), v1, v2).ok());
    ASSERT_TRUE(s.Commit(v2, TestRefitId(2)).ok());
    const Version v3{3, Digest128{3, 3}};
    ASSERT_TRUE(s.BeginRefit(TestRefitId(3), v2, v3).ok());
    ASSERT_TRUE(s.Commit(v3, TestRefitId(3)).ok());
  }
  // The held write-back saw a newer record and kept the mark; the queued
  // one, served on the way out, dropped it.
  auto rec = OnDisk(record_path);
  ASSERT_TRUE(rec && rec->committed);
  EXPECT_EQ(rec->committed->version.step, 3u);
  EXPECT_FALSE(rec->unsynced);
}

TEST_F(DataSyncTest, ADetachedStoreLeavesItsMarkToTheNextOpen) {
  Fixture f;
  Version v1;
  const StoreSpec spec = Committed(f, &v1);
  const Version v2{2, Digest128{2, 2}};
  {
    auto store = OpenStore(spec);
    ASSERT_TRUE(store.ok());
    (*store)->DetachDataSync();
    ASSERT_TRUE(ArmFailpoints("store.data_sync=delay(300)").ok());
    ASSERT_TRUE((*store)->BeginRefit(TestRefitId(2), v1, v2).ok());
    ASSERT_TRUE((*store)->Commit(v2, TestRefitId(2)).ok());
    ASSERT_TRUE((*store)->BeginRefit(TestRefitId(3), v2, v2).ok());
    ASSERT_TRUE((*store)->EndRefit().ok());  // a second request, queued
    // Destroying it waits for a write-back in flight (if the thread took
    // the first request already), not for the queued one.
  }
  DisarmFailpoints();
  auto rec = OnDisk(spec.path + ".dcr-version");
  ASSERT_TRUE(rec && rec->unsynced);
  EXPECT_EQ(rec->committed->version, v2);
  auto store = OpenStore(spec);  // this boot: written back, mark dropped
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->committed(), v2);
  EXPECT_FALSE((*store)->record().unsynced);
  rec = OnDisk(spec.path + ".dcr-version");
  ASSERT_TRUE(rec);
  EXPECT_FALSE(rec->unsynced);
}

TEST_F(DataSyncTest, AMarkOfThisBootIsWrittenBackAtOpen) {
  auto boot = CurrentBootId();
  ASSERT_TRUE(boot.ok());
  Fixture f;
  Version v1;
  const StoreSpec spec = Committed(f, &v1);
  ASSERT_NO_FATAL_FAILURE(Mark(spec.path + ".dcr-version", *boot));
  // Only the process stopped: the page cache holds what it wrote, so the
  // open writes it back and keeps the version without hashing. (A byte
  // changed behind dcr's back shows that no hash was taken.)
  ASSERT_NO_FATAL_FAILURE(FlipAByte(spec.path));
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->committed(), v1);
  EXPECT_FALSE((*store)->record().unsynced);
  auto rec = OnDisk(spec.path + ".dcr-version");
  ASSERT_TRUE(rec);
  EXPECT_FALSE(rec->unsynced);
}

TEST_F(DataSyncTest, AMarkOfAnotherBootIsCheckedAgainstTheBits) {
  Fixture f;
  Version v1;
  const StoreSpec spec = Committed(f, &v1);
  const std::string record_path = spec.path + ".dcr-version";
  // The bits hold the committed version: it stays, unmarked.
  ASSERT_NO_FATAL_FAILURE(Mark(record_path, kOtherBoot));
  {
    auto store = OpenStore(spec);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_EQ((*store)->committed(), v1);
    EXPECT_FALSE((*store)->record().unsynced);
  }
  auto rec = OnDisk(record_path);
  ASSERT_TRUE(rec && rec->committed);
  EXPECT_FALSE(rec->unsynced);

  // The write-back was lost: one byte on disk is not the committed bits.
  // The store counts as never committed, so no delta binds to it.
  ASSERT_NO_FATAL_FAILURE(Mark(record_path, kOtherBoot));
  ASSERT_NO_FATAL_FAILURE(FlipAByte(spec.path));
  {
    auto store = OpenStore(spec);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    EXPECT_FALSE((*store)->committed().has_value());
    EXPECT_FALSE((*store)->record().unsynced);
  }
  rec = OnDisk(record_path);
  ASSERT_TRUE(rec);
  EXPECT_FALSE(rec->committed);
  EXPECT_FALSE(rec->unsynced);
}

TEST_F(DataSyncTest, ALostWriteBackWithAKnownSyncedVersionIsAMixToRepair) {
  Fixture f;
  Version v1;
  const StoreSpec spec = Committed(f, &v1);
  const std::string record_path = spec.path + ".dcr-version";
  // The record says step 1 (refit 1), the disk held step 0 when the
  // write-back began to lag, and a byte did not make it.
  const Version v0{0, Digest128{9, 9}};
  ASSERT_NO_FATAL_FAILURE(Mark(record_path, kOtherBoot, v0));
  ASSERT_NO_FATAL_FAILURE(FlipAByte(spec.path));
  {
    auto store = OpenStore(spec);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    // A mix of step 0 and step 1, as refit 1 left unfinished: the
    // coordinator repairs it with the change sets between them.
    EXPECT_FALSE((*store)->committed().has_value());
    auto busy = (*store)->InProgress();
    ASSERT_TRUE(busy.has_value());
    EXPECT_EQ(busy->refit, TestRefitId(1));
    EXPECT_EQ(busy->base, v0);
    EXPECT_EQ(busy->target, v1);
    EXPECT_FALSE((*store)->record().unsynced);
  }
  // A refit in progress too: its mix now reaches down to step 0.
  Version v2{2, Digest128{2, 2}};
  {
    auto store = OpenStore(spec);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Commit(v1, TestRefitId(1)).ok());
    ASSERT_TRUE((*store)->WaitDataSync().ok());
    ASSERT_TRUE((*store)->BeginRefit(TestRefitId(2), v1, v2).ok());
  }
  ASSERT_NO_FATAL_FAILURE(Mark(record_path, kOtherBoot, v0));
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto busy = (*store)->InProgress();
  ASSERT_TRUE(busy.has_value());
  EXPECT_EQ(busy->refit, TestRefitId(2));
  EXPECT_EQ(busy->base, v0);
  EXPECT_EQ(busy->target, v2);
}

TEST_F(DataSyncTest, AMarkOfAnotherBootBesideARefitInProgressKeepsTheRefit) {
  Fixture f;
  Version v1;
  const StoreSpec spec = Committed(f, &v1);
  const Version v2{2, Digest128{2, 2}};
  {
    auto store = OpenStore(spec);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->BeginRefit(TestRefitId(2), v1, v2).ok());
  }
  ASSERT_NO_FATAL_FAILURE(Mark(spec.path + ".dcr-version", kOtherBoot));
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  // The record already says the bits are a mix: nothing to hash.
  ASSERT_TRUE((*store)->InProgress().has_value());
  EXPECT_EQ((*store)->InProgress()->refit, TestRefitId(2));
  EXPECT_EQ((*store)->committed(), v1);
  EXPECT_FALSE((*store)->record().unsynced);
}

}  // namespace
}  // namespace dcr
