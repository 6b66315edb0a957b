// A store's version record: legacy records re-hashed or refused, corrupt
// or foreign ones, atomic replacement, failed writes, and the locks and
// permissions checked at open.
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
#include "dcr/store.h"
#include "dcr/thread_pool.h"
#include "format/safetensors_header.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"
#include "unit/store/store_test_fixture.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;
using store_testing::Fixture;
using store_testing::RunAsNobody;
using store_testing::StoreTest;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ReadAllOrStatus;
using testing::TestRefitId;

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

}  // namespace
}  // namespace dcr
