#include "common/file.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace dcr {
namespace {

using ::testing::HasSubstr;

class FileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("dcr-file-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const char* name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;
};

// Opening a FIFO for reading blocks until a writer comes: each of these
// would hang (and the test time out) if the type were checked after a
// blocking open.
TEST_F(FileTest, RefusesAFifoAtOnce) {
  const std::string fifo = Path("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (int flags : {O_RDONLY, O_RDWR}) {
    auto fd = OpenRegularFile(fifo, flags);
    ASSERT_FALSE(fd.ok());
    EXPECT_TRUE(fd.status().IsInvalidArgument());
    EXPECT_THAT(std::string(fd.status().message()),
                HasSubstr("'" + fifo + "' is a FIFO, not a regular file"));
  }
  auto read = ReadFileToString(fifo);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("is a FIFO"));
  for (auto mode :
       {MappedFile::Mode::kReadOnly, MappedFile::Mode::kReadWrite}) {
    auto map = MappedFile::Open(fifo, mode);
    ASSERT_FALSE(map.ok());
    EXPECT_THAT(std::string(map.status().message()), HasSubstr("is a FIFO"));
  }
}

TEST_F(FileTest, RefusesADirectoryAndADevice) {
  auto dir = OpenRegularFile(dir_.string(), O_RDONLY);
  ASSERT_FALSE(dir.ok());
  EXPECT_THAT(std::string(dir.status().message()),
              HasSubstr("is a directory, not a regular file"));
  auto dev = ReadFileToString("/dev/null");
  ASSERT_FALSE(dev.ok());
  EXPECT_THAT(std::string(dev.status().message()),
              HasSubstr("'/dev/null' is a character device"));
}

TEST_F(FileTest, OpensARegularFileBlocking) {
  const std::string path = Path("plain");
  std::string text = "hello";
  ASSERT_TRUE(WriteFileAtomic(path, std::as_bytes(std::span(text))).ok());
  struct stat st;
  auto fd = OpenRegularFile(path, O_RDONLY, &st);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  EXPECT_EQ(st.st_size, 5);
  EXPECT_EQ(::fcntl(fd->get(), F_GETFL) & O_NONBLOCK, 0);
  auto read = ReadFileToString(path);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, "hello");
  auto missing = OpenRegularFile(Path("missing"), O_RDONLY);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("cannot open"));
}

// Sync in slices writes back what Sync at once does, whatever the slice
// size against the file's (one page, a size that does not divide it, one
// larger than the file), through the mapping and through Write alike.
TEST_F(FileTest, SyncInSlicesKeepsEveryWrite) {
  const std::string path = Path("paced");
  constexpr size_t kSize = (size_t{5} << 20) + 123;
  std::string zeros(kSize, '\0');
  ASSERT_TRUE(WriteFileAtomic(path, std::as_bytes(std::span(zeros))).ok());
  std::string want = zeros;
  for (size_t slice : {size_t{4096}, size_t{3} << 20, size_t{64} << 20}) {
    {
      auto map = MappedFile::Open(path, MappedFile::Mode::kReadWrite);
      ASSERT_TRUE(map.ok()) << map.status().ToString();
      std::span<std::byte> data = (*map)->mutable_data();
      for (size_t i = slice % 7; i < kSize; i += 4093) {
        want[i] = static_cast<char>(i * 31 + slice);
        data[i] = static_cast<std::byte>(want[i]);
      }
      const std::string tail = "written by Write at the end";
      const size_t at = kSize - tail.size();
      want.replace(at, tail.size(), tail);
      ASSERT_TRUE((*map)->Write(at, std::as_bytes(std::span(tail))).ok());
      Status s = (*map)->Sync(slice);
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    auto read = ReadFileToString(path);
    ASSERT_TRUE(read.ok());
    EXPECT_TRUE(*read == want) << "slice " << slice;
  }
  auto ro = MappedFile::Open(path, MappedFile::Mode::kReadOnly);
  ASSERT_TRUE(ro.ok());
  EXPECT_TRUE((*ro)->Sync(4096).ok());
}

bool OnDiskFilesystem(const std::string& path) {
  struct statfs fs;
  if (::statfs(path.c_str(), &fs) != 0) return false;
  return fs.f_type == EXT4_SUPER_MAGIC || fs.f_type == XFS_SUPER_MAGIC ||
         fs.f_type == BTRFS_SUPER_MAGIC;
}

// Modify on the test's directory (a disk filesystem on the project's
// machines: by pread and pwrite) and on /dev/shm (tmpfs: through the
// mapping). Either way fn sees the current bits, what it leaves is the
// file's, through the mapping and through read(2).
TEST_F(FileTest, ModifyChangesTheRangeInPlace) {
  std::vector<std::string> paths = {Path("modified")};
  if (std::filesystem::is_directory("/dev/shm")) {
    paths.push_back("/dev/shm/dcr-file-test-" + std::to_string(::getpid()));
  }
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    constexpr size_t kSize = (size_t{3} << 20) + 77;
    std::string want(kSize, '\0');
    for (size_t i = 0; i < kSize; ++i) want[i] = static_cast<char>(i * 7);
    ASSERT_TRUE(WriteFileAtomic(path, std::as_bytes(std::span(want))).ok());
    auto map = MappedFile::Open(path, MappedFile::Mode::kReadWrite);
    ASSERT_TRUE(map.ok()) << map.status().ToString();
    const std::byte* mapping = (*map)->data().data();
    const bool copied = OnDiskFilesystem(path);
    // Ranges at the start, across page boundaries, and at the very end.
    for (const std::pair<size_t, size_t>& range :
         {std::pair<size_t, size_t>{0, 4096},
          {4000, (size_t{2} << 20) + 5},
          {kSize - 9000, 9000}}) {
      const size_t at = range.first, size = range.second;
      Status s =
          (*map)->Modify(at, size, 0, size, [&](std::span<std::byte> bytes) {
            EXPECT_EQ(bytes.size(), size);
            EXPECT_EQ(bytes.data() != mapping + at, copied);
            EXPECT_EQ(std::memcmp(bytes.data(), want.data() + at, size), 0);
            for (size_t i = 0; i < size; i += 3) {
              bytes[i] ^= std::byte{0x5a};
              want[at + i] ^= 0x5a;
            }
            return Status::OK();
          });
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(std::memcmp(mapping, want.data(), kSize), 0);
    }
    map->reset();
    auto read = ReadFileToString(path);
    ASSERT_TRUE(read.ok());
    EXPECT_TRUE(*read == want);
    if (path.starts_with("/dev/shm/")) std::filesystem::remove(path);
  }
}

TEST_F(FileTest, ModifyThatFailsWritesNothingBack) {
  const std::string path = Path("failed");
  if (!OnDiskFilesystem(dir_.string())) {
    GTEST_SKIP() << path << " is not on ext4, XFS or btrfs: Modify changes "
                 << "it through the mapping, whatever fn left stays";
  }
  std::string want(100000, 'a');
  ASSERT_TRUE(WriteFileAtomic(path, std::as_bytes(std::span(want))).ok());
  auto map = MappedFile::Open(path, MappedFile::Mode::kReadWrite);
  ASSERT_TRUE(map.ok());
  Status s =
      (*map)->Modify(5000, 50000, 0, 50000, [](std::span<std::byte> bytes) {
        std::fill(bytes.begin(), bytes.end(), std::byte{'b'});
        return Status::IOError("journal full");
      });
  EXPECT_EQ(s.ToString(), Status::IOError("journal full").ToString());
  EXPECT_EQ(std::memcmp((*map)->data().data(), want.data(), want.size()), 0);
}

TEST_F(FileTest, ModifyOverTheBufferGoesThroughTheMapping) {
  const std::string path = Path("large");
  std::string zeros(kModifyBufferBytes + 8192, '\0');
  ASSERT_TRUE(WriteFileAtomic(path, std::as_bytes(std::span(zeros))).ok());
  auto map = MappedFile::Open(path, MappedFile::Mode::kReadWrite);
  ASSERT_TRUE(map.ok());
  std::byte* mapping = (*map)->mutable_data().data();
  Status s =
      (*map)->Modify(100, kModifyBufferBytes + 1, 0, kModifyBufferBytes + 1,
                     [&](std::span<std::byte> bytes) {
                       EXPECT_EQ(bytes.data(), mapping + 100);
                       bytes.back() = std::byte{1};
                       return Status::OK();
                     });
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*map)->data()[100 + kModifyBufferBytes], std::byte{1});
}

// A window: fn's span stands for the whole range, only the window holds
// the file's bits, and on a disk filesystem only the window is written
// back (a part of a span whose changes lie in a few of its pages).
TEST_F(FileTest, ModifyReadsAndWritesBackOnlyTheWindow) {
  const std::string path = Path("window");
  std::string want(64 << 10, '\0');
  for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<char>(i);
  ASSERT_TRUE(WriteFileAtomic(path, std::as_bytes(std::span(want))).ok());
  auto map = MappedFile::Open(path, MappedFile::Mode::kReadWrite);
  ASSERT_TRUE(map.ok());
  const bool copied = OnDiskFilesystem(path);
  constexpr size_t kAt = 1000, kSize = 40000, kFrom = 8192, kTo = 20000;
  Status s =
      (*map)->Modify(kAt, kSize, kFrom, kTo, [&](std::span<std::byte> bytes) {
        EXPECT_EQ(bytes.size(), kSize);
        EXPECT_EQ(std::memcmp(bytes.data() + kFrom, want.data() + kAt + kFrom,
                              kTo - kFrom),
                  0);
        for (size_t i = kFrom; i < kTo; ++i) bytes[i] ^= std::byte{0xff};
        if (copied) {
          // Outside the window: not the file's, and not written back.
          bytes[kFrom - 1] = bytes[kTo] = std::byte{0xee};
        }
        return Status::OK();
      });
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = kAt + kFrom; i < kAt + kTo; ++i) want[i] ^= '\xff';
  EXPECT_EQ(std::memcmp((*map)->data().data(), want.data(), want.size()), 0);
}

TEST_F(FileTest, ModifyRefusesARangePastTheEndAndAReadOnlyFile) {
  const std::string path = Path("small");
  std::string data(1000, 'x');
  ASSERT_TRUE(WriteFileAtomic(path, std::as_bytes(std::span(data))).ok());
  bool called = false;
  auto fn = [&](std::span<std::byte>) {
    called = true;
    return Status::OK();
  };
  auto rw = MappedFile::Open(path, MappedFile::Mode::kReadWrite);
  ASSERT_TRUE(rw.ok());
  Status s = (*rw)->Modify(900, 101, 0, 101, fn);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("past the end of '" + path + "'"));
  EXPECT_EQ((*rw)->Modify(1001, 0, 0, 0, fn).code(),
            StatusCode::kInvalidArgument);
  // A window outside the range, or backwards.
  EXPECT_EQ((*rw)->Modify(0, 100, 0, 101, fn).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*rw)->Modify(0, 100, 60, 50, fn).code(),
            StatusCode::kInvalidArgument);
  auto ro = MappedFile::Open(path, MappedFile::Mode::kReadOnly);
  ASSERT_TRUE(ro.ok());
  EXPECT_EQ((*ro)->Modify(0, 10, 0, 10, fn).code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(called);
}

// Threads each changing their own ranges: each keeps its own buffer.
TEST_F(FileTest, ConcurrentModifiesOfDisjointPagesAllLand) {
  const std::string path = Path("threads");
  constexpr size_t kRange = 64 << 10;
  constexpr int kThreads = 4, kRounds = 16;
  std::string want(kRange * kThreads * kRounds, '\0');
  ASSERT_TRUE(WriteFileAtomic(path, std::as_bytes(std::span(want))).ok());
  auto map = MappedFile::Open(path, MappedFile::Mode::kReadWrite);
  ASSERT_TRUE(map.ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        const size_t at = (size_t(r) * kThreads + t) * kRange;
        EXPECT_TRUE((*map)
                        ->Modify(at, kRange, 0, kRange,
                                 [&](std::span<std::byte> bytes) {
                                   for (auto& b : bytes) {
                                     b = std::byte(t * 16 + r + 1);
                                   }
                                   return Status::OK();
                                 })
                        .ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    for (int r = 0; r < kRounds; ++r) {
      const size_t at = (size_t(r) * kThreads + t) * kRange;
      std::fill_n(want.begin() + at, kRange, char(t * 16 + r + 1));
    }
  }
  EXPECT_EQ(std::memcmp((*map)->data().data(), want.data(), want.size()), 0);
}

}  // namespace
}  // namespace dcr
