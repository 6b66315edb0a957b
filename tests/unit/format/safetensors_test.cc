// Round trips through WriteSafetensors / WriteShardedSafetensors and
// Checkpoint::Open, read-write mappings and digests.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/bytes.h"
#include "common/file.h"
#include "dcr/checkpoint.h"
#include "dcr/thread_pool.h"
#include "testing/test_util.h"

namespace dcr {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = fs::temp_directory_path() /
           ("dcr_format_test_" + std::to_string(::getpid()) + "_" +
            std::to_string(counter++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name) const {
    return (dir_ / name).string();
  }

  fs::path dir_;
};

using testing::RandomBytes;

// Tensors of several dtypes, including a scalar and a zero-size tensor.
struct Fixture {
  std::vector<TensorInfo> infos = {
      {"model.layers.0.weight", DType::kBF16, {8, 16}},
      {"model.embed", DType::kF32, {10, 4}},
      {"scalar", DType::kF64, {}},
      {"empty", DType::kF16, {0, 7}},
      {"flags", DType::kBool, {5}},
      {"fp8", DType::kF8E4M3, {3, 3}},
      {"ids", DType::kI64, {6}},
  };
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorToWrite> tensors;

  Fixture() {
    for (size_t i = 0; i < infos.size(); ++i) {
      data.push_back(RandomBytes(infos[i].NumBytes(), 1000 + i));
    }
    for (size_t i = 0; i < infos.size(); ++i) {
      tensors.push_back({infos[i], data[i]});
    }
  }
};

void ExpectSameTensors(const Checkpoint& cp, const Fixture& f) {
  ASSERT_EQ(cp.manifest().size(), f.infos.size());
  for (size_t i = 0; i < f.infos.size(); ++i) {
    const int64_t idx = cp.manifest().Find(f.infos[i].name);
    ASSERT_GE(idx, 0) << f.infos[i].name;
    EXPECT_EQ(cp.manifest()[idx], f.infos[i]);
    std::span<const std::byte> got = cp.TensorData(idx);
    ASSERT_EQ(got.size(), f.data[i].size()) << f.infos[i].name;
    EXPECT_TRUE(got.empty() ||
                std::memcmp(got.data(), f.data[i].data(), got.size()) == 0)
        << f.infos[i].name;
  }
  Result<Manifest> expected = Manifest::Create(f.infos);
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(cp.manifest().digest(), expected->digest());
}

TEST_F(SafetensorsTest, SingleFileRoundTrip) {
  Fixture f;
  const std::map<std::string, std::string> meta = {{"format", "pt"},
                                                   {"step", "42"}};
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, f.tensors, meta).ok());
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  auto cp = Checkpoint::Open(path, Checkpoint::Mode::kReadOnly);
  ASSERT_TRUE(cp.ok()) << cp.status().ToString();
  ExpectSameTensors(**cp, f);
  EXPECT_EQ((*cp)->metadata(), meta);
  EXPECT_EQ((*cp)->path(), path);
  EXPECT_EQ((*cp)->FileOf(0), path);
  const int64_t scalar = (*cp)->manifest().Find("scalar");
  EXPECT_EQ((*cp)->TensorData(scalar).size(), 8u);
  EXPECT_TRUE((*cp)->TensorData((*cp)->manifest().Find("empty")).empty());

  // The directory form finds the single file.
  auto by_dir = Checkpoint::Open(dir_.string(), Checkpoint::Mode::kReadOnly);
  ASSERT_TRUE(by_dir.ok()) << by_dir.status().ToString();
  ExpectSameTensors(**by_dir, f);
}

TEST_F(SafetensorsTest, WriterLayout) {
  Fixture f;
  const std::string path = Path("x.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, f.tensors, {{"format", "pt"}}).ok());
  Result<std::string> bytes = ReadFileToString(path);
  ASSERT_TRUE(bytes.ok());
  const uint64_t n = LoadLE<uint64_t>(bytes->data());
  EXPECT_EQ(n % 8, 0u);
  const std::string header = bytes->substr(8, n);
  // "__metadata__" first, then tensors by name with contiguous offsets.
  EXPECT_EQ(header.rfind("{\"__metadata__\":{\"format\":\"pt\"},\"empty\":", 0),
            0u)
      << header;
  nlohmann::json j = nlohmann::json::parse(header);
  EXPECT_EQ(j["empty"]["data_offsets"], nlohmann::json::array({0, 0}));
  EXPECT_EQ(j["flags"]["data_offsets"], nlohmann::json::array({0, 5}));
  EXPECT_EQ(j["fp8"]["data_offsets"], nlohmann::json::array({5, 14}));
  EXPECT_EQ(j["scalar"]["shape"], nlohmann::json::array());
  uint64_t total = 0;
  for (const TensorInfo& t : f.infos) total += t.NumBytes();
  EXPECT_EQ(bytes->size(), 8 + n + total);
}

TEST_F(SafetensorsTest, EmptyCheckpoint) {
  const std::string path = Path("empty.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {}, {}).ok());
  EXPECT_EQ(fs::file_size(path), 16u);
  auto cp = Checkpoint::Open(path, Checkpoint::Mode::kReadOnly);
  ASSERT_TRUE(cp.ok()) << cp.status().ToString();
  EXPECT_EQ((*cp)->manifest().size(), 0u);
  EXPECT_TRUE((*cp)->metadata().empty());
  CheckpointDigests d = (*cp)->ComputeDigests();
  EXPECT_TRUE(d.tensors.empty());
  EXPECT_EQ(d.version, VersionDigest(d.manifest, {}));
}

TEST_F(SafetensorsTest, ReadsReferenceStyleFile) {
  // As written by the Python reference: metadata first, spaces as padding,
  // tensors in a different order than their data.
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F16","shape":[2],)"
      R"("data_offsets":[0,4]},"a":{"dtype":"I32","shape":[1,1],)"
      R"("data_offsets":[4,8]}}    )";
  std::string file(8, '\0');
  StoreLE<uint64_t>(file.data(), header.size());
  file += header + "BBBBAAAA";
  const std::string path = Path("ref.safetensors");
  std::ofstream(path, std::ios::binary) << file;
  auto cp = Checkpoint::Open(path, Checkpoint::Mode::kReadOnly);
  ASSERT_TRUE(cp.ok()) << cp.status().ToString();
  ASSERT_EQ((*cp)->manifest().size(), 2u);
  EXPECT_EQ((*cp)->manifest()[0].name, "a");
  auto as_string = [](std::span<const std::byte> s) {
    return std::string(reinterpret_cast<const char*>(s.data()), s.size());
  };
  EXPECT_EQ(as_string((*cp)->TensorData(0)), "AAAA");
  EXPECT_EQ(as_string((*cp)->TensorData(1)), "BBBB");
  EXPECT_EQ((*cp)->metadata().at("format"), "pt");
}

TEST_F(SafetensorsTest, ShardedRoundTrip) {
  Fixture f;
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  const std::string dir = Path("sharded");  // created by the writer
  // The BF16 tensor (256 bytes) exceeds the limit and gets its own file.
  ASSERT_TRUE(WriteShardedSafetensors(dir, f.tensors, meta, 100).ok());
  const std::string index = dir + "/model.safetensors.index.json";
  ASSERT_TRUE(fs::exists(index));

  Result<std::string> text = ReadFileToString(index);
  ASSERT_TRUE(text.ok());
  nlohmann::json j = nlohmann::json::parse(*text);
  uint64_t total = 0;
  for (const TensorInfo& t : f.infos) total += t.NumBytes();
  EXPECT_EQ(j["metadata"]["total_size"], total);
  EXPECT_EQ(j["weight_map"].size(), f.infos.size());
  std::set<std::string> files;
  for (const auto& [k, v] : j["weight_map"].items()) files.insert(v);
  EXPECT_GE(files.size(), 3u);
  const std::string n = std::to_string(files.size());
  EXPECT_TRUE(files.count("model-00001-of-0000" + n + ".safetensors"));

  for (const std::string& p : {dir, index}) {
    auto cp = Checkpoint::Open(p, Checkpoint::Mode::kReadOnly);
    ASSERT_TRUE(cp.ok()) << cp.status().ToString();
    ExpectSameTensors(**cp, f);
    EXPECT_EQ((*cp)->metadata(), meta);
    const int64_t big = (*cp)->manifest().Find("model.layers.0.weight");
    const std::string& big_file = (*cp)->FileOf(big);
    for (size_t i = 0; i < (*cp)->manifest().size(); ++i) {
      if (static_cast<int64_t>(i) != big) {
        EXPECT_NE((*cp)->FileOf(i), big_file);
      }
    }
  }

  // Digests do not depend on how the checkpoint is split into files.
  ASSERT_TRUE(WriteSafetensors(Path("one.safetensors"), f.tensors, meta).ok());
  auto one =
      Checkpoint::Open(Path("one.safetensors"), Checkpoint::Mode::kReadOnly);
  auto many = Checkpoint::Open(dir, Checkpoint::Mode::kReadOnly);
  ASSERT_TRUE(one.ok() && many.ok());
  EXPECT_EQ((*one)->ComputeDigests().version,
            (*many)->ComputeDigests().version);
}

TEST_F(SafetensorsTest, ShardedSingleFileWhenEverythingFits) {
  Fixture f;
  const std::string dir = Path("one_shard");
  ASSERT_TRUE(WriteShardedSafetensors(dir, f.tensors, {}, 1 << 20).ok());
  EXPECT_TRUE(fs::exists(dir + "/model-00001-of-00001.safetensors"));
  auto cp = Checkpoint::Open(dir, Checkpoint::Mode::kReadOnly);
  ASSERT_TRUE(cp.ok()) << cp.status().ToString();
  ExpectSameTensors(**cp, f);
}

TEST_F(SafetensorsTest, ReadWriteMappingReachesFileAfterFlush) {
  Fixture f;
  const std::string path = Path("rw.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, f.tensors, {}).ok());
  const std::string name = "model.embed";
  {
    auto cp = Checkpoint::Open(path, Checkpoint::Mode::kReadWrite);
    ASSERT_TRUE(cp.ok()) << cp.status().ToString();
    EXPECT_EQ((*cp)->mode(), Checkpoint::Mode::kReadWrite);
    std::span<std::byte> data =
        (*cp)->MutableTensorData((*cp)->manifest().Find(name));
    ASSERT_EQ(data.size(), 160u);
    for (std::byte& b : data) b = std::byte{0x5a};
    ASSERT_TRUE((*cp)->Flush().ok());
  }
  auto cp = Checkpoint::Open(path, Checkpoint::Mode::kReadOnly);
  ASSERT_TRUE(cp.ok());
  const int64_t idx = (*cp)->manifest().Find(name);
  for (std::byte b : (*cp)->TensorData(idx)) ASSERT_EQ(b, std::byte{0x5a});
  // Read-only checkpoints hand out no writable views.
  EXPECT_TRUE((*cp)->MutableTensorData(idx).empty());
  EXPECT_TRUE((*cp)->Flush().ok());
}

TEST_F(SafetensorsTest, ReadWriteOpenFailsUpFrontOnUnwritableFile) {
  Fixture f;
  const std::string path = Path("ro.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, f.tensors, {}).ok());
  fs::permissions(path, fs::perms::owner_read | fs::perms::group_read |
                            fs::perms::others_read);
  fs::permissions(dir_, fs::perms::all);
  // Root ignores file permissions: check in a child that runs as "nobody".
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) {
      ::_exit(10);
    }
    auto cp = Checkpoint::Open(path, Checkpoint::Mode::kReadWrite);
    if (cp.ok()) ::_exit(11);
    if (cp.status().code() != StatusCode::kIOError) ::_exit(12);
    if (std::string(cp.status().message()).find(path) == std::string::npos) {
      ::_exit(13);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "10: cannot drop privileges, 11: opened, 12: wrong code, 13: "
         "message lacks the path";
}

TEST_F(SafetensorsTest, DigestsWithAndWithoutPoolAndBitFlip) {
  Fixture f;
  const std::string path = Path("d.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, f.tensors, {}).ok());
  auto cp = Checkpoint::Open(path, Checkpoint::Mode::kReadWrite);
  ASSERT_TRUE(cp.ok());
  ThreadPool pool(4);
  const CheckpointDigests serial = (*cp)->ComputeDigests();
  const CheckpointDigests parallel = (*cp)->ComputeDigests(&pool);
  EXPECT_EQ(serial.tensors, parallel.tensors);
  EXPECT_EQ(serial.version, parallel.version);
  EXPECT_EQ(serial.manifest, (*cp)->manifest().digest());
  EXPECT_EQ(serial.version, VersionDigest(serial.manifest, serial.tensors));
  for (size_t i = 0; i < f.infos.size(); ++i) {
    const int64_t idx = (*cp)->manifest().Find(f.infos[i].name);
    EXPECT_EQ(serial.tensors[idx], TensorDigest(f.data[i]));
  }

  const int64_t idx = (*cp)->manifest().Find("ids");
  (*cp)->MutableTensorData(idx)[17] ^= std::byte{0x01};
  const CheckpointDigests flipped = (*cp)->ComputeDigests(&pool);
  EXPECT_EQ(flipped.manifest, serial.manifest);
  EXPECT_NE(flipped.version, serial.version);
  for (size_t i = 0; i < serial.tensors.size(); ++i) {
    if (static_cast<int64_t>(i) == idx) {
      EXPECT_NE(flipped.tensors[i], serial.tensors[i]);
    } else {
      EXPECT_EQ(flipped.tensors[i], serial.tensors[i]);
    }
  }
}

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  std::vector<std::byte> four(4);
  std::vector<std::byte> eight(8);
  const std::string path = Path("bad.safetensors");

  const TensorToWrite wrong_size[] = {{{"x", DType::kF32, {2}}, four}};
  Status s = WriteSafetensors(path, wrong_size, {});
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_THAT(std::string(s.message()), HasSubstr("'x'"));

  const TensorToWrite dup[] = {{{"x", DType::kF32, {1}}, four},
                               {{"x", DType::kF32, {1}}, four}};
  s = WriteSafetensors(path, dup, {});
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_THAT(std::string(s.message()), HasSubstr("duplicate"));
  s = WriteShardedSafetensors(Path("shards"), dup, {}, 1);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();

  const TensorToWrite bad_utf8[] = {{{"\xff", DType::kU8, {4}}, four}};
  s = WriteSafetensors(path, bad_utf8, {});
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();

  const TensorToWrite reserved[] = {{{"__metadata__", DType::kU8, {8}}, eight}};
  s = WriteSafetensors(path, reserved, {});
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();

  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_FALSE(fs::exists(Path("shards")));
}

}  // namespace
}  // namespace dcr
