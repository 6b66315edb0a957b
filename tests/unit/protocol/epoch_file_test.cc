#include "protocol/epoch_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace dcr {
namespace {

class EpochFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("dcr-epoch-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "epoch").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Put(const std::string& text) { std::ofstream(path_) << text; }

  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(EpochFileTest, AMissingFileIsEpochZero) {
  auto e = EpochFile(path_).Read();
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(*e, 0u);
}

TEST_F(EpochFileTest, NextTakesOneMoreDurably) {
  EpochFile f(path_);
  EXPECT_EQ(*f.Next(), 1u);
  EXPECT_EQ(*f.Next(), 2u);
  EXPECT_EQ(*EpochFile(path_).Read(), 2u);
}

TEST_F(EpochFileTest, WriteThenReadRoundTrips) {
  EpochFile f(path_);
  ASSERT_TRUE(f.Write(18446744073709551615ull).ok());
  EXPECT_EQ(*f.Read(), 18446744073709551615ull);
}

TEST_F(EpochFileTest, AnEmptyPathKeepsNothing) {
  EpochFile f("");
  EXPECT_TRUE(f.Write(9).ok());
  EXPECT_EQ(*f.Read(), 0u);
}

TEST_F(EpochFileTest, AnythingButOneNumberIsCorruptAndNamesTheFile) {
  for (const char* text : {"", "\n", "x", "12x", "-1", " 3", "3 ", "1\n2",
                           "99999999999999999999999"}) {
    Put(text);
    auto e = EpochFile(path_, "it holds what this relay accepted").Read();
    ASSERT_FALSE(e.ok()) << "'" << text << "'";
    EXPECT_TRUE(e.status().IsCorruption());
    EXPECT_NE(e.status().message().find(path_), std::string::npos);
    EXPECT_NE(e.status().message().find("what this relay accepted"),
              std::string::npos);
  }
  Put("42\n");
  EXPECT_EQ(*EpochFile(path_).Read(), 42u);
  Put("42");
  EXPECT_EQ(*EpochFile(path_).Read(), 42u);
}

TEST_F(EpochFileTest, NextRefusesACorruptFileWithoutOverwritingIt) {
  Put("garbage");
  EXPECT_FALSE(EpochFile(path_).Next().ok());
  std::ifstream in(path_);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(text, "garbage");
}

}  // namespace
}  // namespace dcr
