// Shared-memory stores: create, commit, reopen, the image as a
// safetensors file for a serving process, records and corrupt images.
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
using store_testing::AllZero;
using store_testing::CopyBits;
using store_testing::Fixture;
using store_testing::ShmName;
using store_testing::StoreTest;
using ::testing::HasSubstr;
using testing::ReadAllOrStatus;
using testing::TestRefitId;

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

}  // namespace
}  // namespace dcr
