#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "dcr/objstore.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/temp_dir.h"

namespace dcr {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::byte> Bytes(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(seed + i * 7);
  return v;
}

class DirStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = OpenDirObjectStore(dir_.Path("objects"));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  std::string File(const std::string& key) {
    return dir_.Path("objects/" + key);
  }

  testing::TempDir dir_;
  std::unique_ptr<ObjectStore> store_;
};

TEST_F(DirStoreTest, RoundTripsAndReplaces) {
  auto a = Bytes(1000, 1);
  ASSERT_TRUE(store_->Put("refits/r1/c/00000001", a).ok());
  auto got = store_->Get("refits/r1/c/00000001");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, a);
  auto b = Bytes(10, 9);
  ASSERT_TRUE(store_->Put("refits/r1/c/00000001", b).ok());
  EXPECT_EQ(*store_->Get("refits/r1/c/00000001"), b);
  ASSERT_TRUE(store_->Put("empty", {}).ok());
  EXPECT_TRUE(store_->Get("empty")->empty());
  ObjectStoreStats st = store_->stats();
  EXPECT_EQ(st.bytes_up, 1010u);
  EXPECT_EQ(st.bytes_down, 1010u);
  EXPECT_THAT(store_->describe(), HasSubstr("dir:/"));
}

TEST_F(DirStoreTest, MissingIsNotFoundAndDeleteIsIdempotent) {
  auto r = store_->Get("refits/none");
  EXPECT_TRUE(r.status().IsNotFound()) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("refits/none"));
  ASSERT_TRUE(store_->Put("refits/r1/c/1", Bytes(5, 0)).ok());
  ASSERT_TRUE(store_->Delete("refits/r1/c/1").ok());
  ASSERT_TRUE(store_->Delete("refits/r1/c/1").ok());
  EXPECT_TRUE(store_->Get("refits/r1/c/1").status().IsNotFound());
  // Emptied folders go with their last object.
  EXPECT_FALSE(std::filesystem::exists(dir_.Path("objects/refits")));
  EXPECT_TRUE(std::filesystem::exists(dir_.Path("objects")));
}

TEST_F(DirStoreTest, ChangedTruncatedOrForeignObjectsAreCorruption) {
  ASSERT_TRUE(store_->Put("k", Bytes(4096, 3)).ok());
  {
    std::fstream f(File("k"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  auto r = store_->Get("k");
  EXPECT_TRUE(r.status().IsCorruption());
  EXPECT_THAT(r.status().message(), HasSubstr("checksum"));

  ASSERT_TRUE(store_->Put("k", Bytes(4096, 3)).ok());
  std::filesystem::resize_file(File("k"), 2000);
  EXPECT_TRUE(store_->Get("k").status().IsCorruption());
  std::filesystem::resize_file(File("k"), 10);
  EXPECT_TRUE(store_->Get("k").status().IsCorruption());

  std::ofstream(File("foreign")) << "hello, not dcr's";
  r = store_->Get("foreign");
  EXPECT_TRUE(r.status().IsCorruption());
  EXPECT_THAT(r.status().message(), HasSubstr("not written by dcr"));

  // A folder of other objects is no object, as in S3.
  std::filesystem::create_directories(File("adir"));
  EXPECT_TRUE(store_->Get("adir").status().IsNotFound());
}

TEST_F(DirStoreTest, ListsSortedByPrefixSkippingTemporaries) {
  for (const char* k : {"refits/b/c/2", "refits/b/c/10", "refits/a/manifest",
                        "refits/b/manifest", "other"}) {
    ASSERT_TRUE(store_->Put(k, Bytes(3, 0)).ok());
  }
  std::ofstream(File("refits/b/c/3.dcr-tmp-77-0")) << "torn";
  std::ofstream(File("refits/b/bad name")) << "not a key";
  EXPECT_THAT(
      *store_->List("refits/b/"),
      ElementsAre("refits/b/c/10", "refits/b/c/2", "refits/b/manifest"));
  EXPECT_THAT(*store_->List("refits/b/c"),
              ElementsAre("refits/b/c/10", "refits/b/c/2"));
  EXPECT_EQ(store_->List("")->size(), 5u);
  EXPECT_TRUE(store_->List("nothing/")->empty());
}

TEST_F(DirStoreTest, ListsOnlyUnderThePrefixFolders) {
  ASSERT_TRUE(store_->Put("refits/a/f/1", Bytes(3, 0)).ok());
  ASSERT_TRUE(store_->Put("refits/ab/f/1", Bytes(3, 0)).ok());
  ASSERT_TRUE(store_->Put("outside", Bytes(3, 0)).ok());
  EXPECT_THAT(*store_->List("refits/a"),
              ElementsAre("refits/a/f/1", "refits/ab/f/1"));
  EXPECT_THAT(*store_->List("refits/a/f/"), ElementsAre("refits/a/f/1"));
  EXPECT_TRUE(store_->List("refits/zz/f/")->empty());
  // A prefix that climbs out of the store walks nothing outside it.
  EXPECT_TRUE(store_->List("../objects/refits/")->empty());
  EXPECT_THAT(*store_->List("refits/../outside"), ElementsAre());
}

TEST_F(DirStoreTest, RemoveUnfinishedTakesTornWritesUnderThePrefixOnly) {
  ASSERT_TRUE(store_->Put("refits/a/f/1", Bytes(3, 0)).ok());
  std::filesystem::create_directories(File("refits/b/f"));
  std::ofstream(File("refits/a/f/2.dcr-tmp-77-0")) << "torn";
  std::ofstream(File("refits/b/f/0.dcr-tmp-77-1")) << "torn";
  std::ofstream(File("refits/c.dcr-tmp-77-2")) << "torn";
  auto n = store_->RemoveUnfinished("refits/b/");
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 1u);
  EXPECT_FALSE(std::filesystem::exists(File("refits/b")));  // emptied
  EXPECT_TRUE(std::filesystem::exists(File("refits/a/f/2.dcr-tmp-77-0")));
  n = store_->RemoveUnfinished("refits/a/");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1u);
  EXPECT_TRUE(store_->Get("refits/a/f/1").ok());
  EXPECT_TRUE(std::filesystem::exists(File("refits/c.dcr-tmp-77-2")));
  // Empty folders outside the prefix stay.
  std::filesystem::create_directories(File("refits/abc/f"));
  n = store_->RemoveUnfinished("refits/ab/");
  ASSERT_TRUE(n.ok());
  EXPECT_TRUE(std::filesystem::exists(File("refits/abc/f")));
  n = store_->RemoveUnfinished("nothing/");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
}

TEST_F(DirStoreTest, RefusesBadKeys) {
  for (const char* k : {"", "/abs", "a//b", "a/", "../up", "a/./b", "a b",
                        "a\\b", "a?b", "a/b.dcr-tmp-1-2"}) {
    EXPECT_TRUE(store_->Put(k, Bytes(1, 0)).IsInvalidArgument()) << k;
    EXPECT_TRUE(store_->Get(k).status().IsInvalidArgument()) << k;
    EXPECT_TRUE(store_->Delete(k).IsInvalidArgument()) << k;
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.Path("up")));
}

TEST_F(DirStoreTest, TwoStoresOnOneDirectoryNeverTearAnObject) {
  // Two writers on one directory (two hosts of a shared filesystem, or two
  // stores in one process) writing the same key with different bytes:
  // every read is whole, one or the other.
  auto other = OpenDirObjectStore(dir_.Path("objects"));
  ASSERT_TRUE(other.ok());
  const auto a = Bytes(200000, 1), b = Bytes(150000, 2);
  std::atomic<bool> stop{false};
  std::atomic<int> errors{0};
  std::thread wa([&] {
    for (int i = 0; i < 40; ++i) errors += !store_->Put("k", a).ok();
  });
  std::thread wb([&] {
    for (int i = 0; i < 40; ++i) errors += !(*other)->Put("k", b).ok();
  });
  std::thread reader([&] {
    while (!stop) {
      auto r = store_->Get("k");
      if (r.ok() && *r != a && *r != b) ++errors;
      if (!r.ok() && !r.status().IsNotFound()) ++errors;
    }
  });
  wa.join();
  wb.join();
  stop = true;
  reader.join();
  EXPECT_EQ(errors.load(), 0);
}

TEST_F(DirStoreTest, ConcurrentWritersAndReaders) {
  constexpr int kThreads = 4, kEach = 25;
  std::vector<std::thread> threads;
  std::atomic<int> errors{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        std::string key = "c/" + std::to_string(i);
        // Every thread writes the same keys with the same bytes; readers
        // must only ever see a whole object.
        if (!store_->Put(key, Bytes(3000 + i, uint8_t(i))).ok()) ++errors;
        auto r = store_->Get(key);
        if (!r.ok() || *r != Bytes(3000 + i, uint8_t(i))) ++errors;
        (void)t;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(store_->List("c/")->size(), size_t{kEach});
}

TEST(DirStoreOpenTest, RefusesAFileOrAnUnwritableDirectory) {
  testing::TempDir dir;
  std::ofstream(dir.Path("file")) << "x";
  auto r = OpenDirObjectStore(dir.Path("file"));
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(OpenDirObjectStore("").status().IsInvalidArgument());
  if (::geteuid() != 0) {  // root writes anywhere
    std::filesystem::create_directories(dir.Path("ro"));
    ::chmod(dir.Path("ro").c_str(), 0555);
    EXPECT_FALSE(OpenDirObjectStore(dir.Path("ro")).ok());
  }
}

}  // namespace
}  // namespace dcr
