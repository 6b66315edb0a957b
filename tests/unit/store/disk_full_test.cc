// The version record on a genuinely full file system: a small tmpfs,
// mounted in a mount namespace of the test's own and filled to the last
// page. Needs root (CI runs as root); skipped, saying why, where mounting
// is not permitted.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/file.h"
#include "dcr/checkpoint.h"
#include "dcr/store.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::ReadAllOrStatus;
using testing::TestRefitId;

class DiskFullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) {
      GTEST_SKIP() << "needs root to mount a small tmpfs and fill it (CI "
                      "runs as root)";
    }
    // This thread's own mount namespace, private: the tmpfs is invisible
    // outside the test and goes away with the process whatever happens.
    if (::unshare(CLONE_NEWNS) != 0) {
      GTEST_SKIP() << "cannot unshare the mount namespace: "
                   << std::strerror(errno);
    }
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      GTEST_SKIP() << "cannot make mounts private: " << std::strerror(errno);
    }
    mnt_ = dir_.Path("small");
    fs::create_directory(mnt_);
    if (::mount("tmpfs", mnt_.c_str(), "tmpfs", 0, "size=256k") != 0) {
      GTEST_SKIP() << "cannot mount a tmpfs: " << std::strerror(errno);
    }
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) ::umount2(mnt_.c_str(), MNT_DETACH);
  }

  std::string Path(const std::string& name) const { return mnt_ + "/" + name; }

  // Writes zeros to `filler` until the file system refuses (ENOSPC).
  void Fill() {
    UniqueFd fd(::open(Path("filler").c_str(),
                       O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    ASSERT_TRUE(fd.valid()) << std::strerror(errno);
    std::vector<char> zeros(4096, 0);
    while (true) {
      const ssize_t n = ::write(fd.get(), zeros.data(), zeros.size());
      if (n > 0) continue;
      ASSERT_EQ(errno, ENOSPC) << std::strerror(errno);
      break;
    }
    // Not even one byte fits.
    ASSERT_EQ(::write(fd.get(), zeros.data(), 1), -1);
    ASSERT_EQ(errno, ENOSPC);
  }
  void Free() { fs::remove(Path("filler")); }

  // The disk-full error of a record write names the record and says so.
  void ExpectDiskFull(const Status& s, const std::string& record_path) {
    EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
    const std::string m(s.message());
    EXPECT_THAT(m, HasSubstr("cannot write version record '" + record_path +
                             "': the disk is full"));
    EXPECT_THAT(m, HasSubstr("No space left on device"));
    EXPECT_THAT(m, HasSubstr("the previous record is unchanged"));
    // Nothing half-written is left behind.
    EXPECT_FALSE(fs::exists(record_path + ".tmp"));
  }

  testing::TempDir dir_;
  std::string mnt_;
  bool mounted_ = false;
};

TEST_F(DiskFullTest, RecordWritesFailCleanlyAndResumeWhenSpaceIsFreed) {
  const std::vector<TensorInfo> infos = {{"w", DType::kBF16, {64, 16}},
                                         {"b", DType::kF32, {16}}};
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorToWrite> tensors;
  for (const TensorInfo& t : infos) {
    data.emplace_back(t.NumBytes(), std::byte{0x5a});
  }
  for (size_t i = 0; i < infos.size(); ++i) {
    tensors.push_back({infos[i], data[i]});
  }
  StoreSpec spec;
  spec.kind = StoreSpec::Kind::kFile;
  spec.path = Path("p.safetensors");
  ASSERT_TRUE(WriteSafetensors(spec.path, tensors, {}).ok());
  auto store = OpenStore(spec);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const std::string record_path = (*store)->record_path();
  const Version v1{1, Digest128{1, 1}};
  const Version v2{2, Digest128{2, 2}};
  const Version v3{3, Digest128{3, 3}};
  ASSERT_TRUE((*store)->Commit(v1, TestRefitId(1)).ok());
  // The write-back drops the record's "unsynced" mark.
  ASSERT_TRUE((*store)->WaitDataSync().ok());
  const std::string committed_v1 = ReadAllOrStatus(record_path);
  EXPECT_THAT(committed_v1, HasSubstr("\"format\":3,"));

  // Full before a refit starts: BeginRefit fails, nothing changes.
  ASSERT_NO_FATAL_FAILURE(Fill());
  Status begin = (*store)->BeginRefit(TestRefitId(2), v1, v2);
  ExpectDiskFull(begin, record_path);
  EXPECT_EQ(ReadAllOrStatus(record_path), committed_v1);
  EXPECT_EQ((*store)->committed(), v1);
  EXPECT_FALSE((*store)->InProgress().has_value());

  // Full between BeginRefit and Commit: the commit fails and the record
  // keeps saying the refit is in progress (the bits may be the target's),
  // on disk and in memory.
  Free();
  ASSERT_TRUE((*store)->BeginRefit(TestRefitId(2), v1, v2).ok());
  const std::string in_progress = ReadAllOrStatus(record_path);
  ASSERT_NO_FATAL_FAILURE(Fill());
  ExpectDiskFull((*store)->Commit(v2, TestRefitId(2)), record_path);
  ExpectDiskFull((*store)->EndRefit(), record_path);
  EXPECT_EQ(ReadAllOrStatus(record_path), in_progress);
  EXPECT_EQ((*store)->committed(), v1);
  ASSERT_TRUE((*store)->InProgress().has_value());
  EXPECT_EQ((*store)->InProgress()->target, v2);

  // A restart on the still-full disk reads the same, whole record.
  store->reset();
  store = OpenStore(spec);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->committed(), v1);
  ASSERT_TRUE((*store)->InProgress().has_value());
  EXPECT_EQ((*store)->InProgress()->refit, TestRefitId(2));
  auto read = ReadVersionRecord(record_path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_TRUE(read->has_value());
  EXPECT_EQ(**read, (*store)->record());

  // Space freed: the pending commit goes through, and later refits too.
  Free();
  ASSERT_TRUE((*store)->Commit(v2, TestRefitId(2)).ok());
  ASSERT_TRUE((*store)->BeginRefit(TestRefitId(3), v2, v3).ok());
  ASSERT_TRUE((*store)->Commit(v3, TestRefitId(3)).ok());
  store->reset();
  store = OpenStore(spec);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->committed(), v3);
  EXPECT_FALSE((*store)->InProgress().has_value());
  EXPECT_FALSE(fs::exists(record_path + ".tmp"));
}

TEST_F(DiskFullTest, WriteVersionRecordLeavesTheOldRecordWhole) {
  const std::string path = Path("r.dcr-version");
  VersionRecord old_record;
  old_record.manifest = Digest128{7, 8};
  old_record.committed = CommitInfo{Version{4, Digest128{4, 4}}, TestRefitId(4),
                                    "2025-01-31T12:00:00Z"};
  ASSERT_TRUE(WriteVersionRecord(path, old_record).ok());
  ASSERT_NO_FATAL_FAILURE(Fill());
  VersionRecord next = old_record;
  next.committed->version.step = 5;
  ExpectDiskFull(WriteVersionRecord(path, next), path);
  auto read = ReadVersionRecord(path);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_TRUE(read->has_value());
  EXPECT_EQ(**read, old_record);
  Free();
  ASSERT_TRUE(WriteVersionRecord(path, next).ok());
  read = ReadVersionRecord(path);
  ASSERT_TRUE(read.ok() && read->has_value());
  EXPECT_EQ(**read, next);
}

}  // namespace
}  // namespace dcr
