#include "common/file.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

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

}  // namespace
}  // namespace dcr
