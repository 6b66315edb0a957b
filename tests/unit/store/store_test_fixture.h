// The fixture the store tests share (store_test.cc, store_record_test.cc,
// shm_store_test.cc, data_sync_test.cc): a small checkpoint of several
// dtypes, the test's directory and shm names, and helpers.
#ifndef DCR_TESTS_UNIT_STORE_STORE_TEST_FIXTURE_H_
#define DCR_TESTS_UNIT_STORE_STORE_TEST_FIXTURE_H_

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/store.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace dcr::store_testing {

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
      data.push_back(
          testing::RandomBytes(infos[i].NumBytes(), seed * 1000 + i));
    }
    for (size_t i = 0; i < infos.size(); ++i) {
      tensors.push_back({infos[i], data[i]});
    }
  }
  Manifest manifest() const { return *Manifest::Create(infos); }
};

// Copies every tensor of `from` into `to` (same manifest).
inline void CopyBits(const Checkpoint& from, WeightStore* to) {
  for (size_t i = 0; i < from.manifest().size(); ++i) {
    const auto src = from.TensorData(i);
    if (!src.empty())
      std::memcpy(to->MutableTensor(i).data(), src.data(), src.size());
  }
}

inline bool AllZero(std::span<const std::byte> bytes) {
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
    std::filesystem::permissions(dir_.path(), std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ec);
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

}  // namespace dcr::store_testing

#endif  // DCR_TESTS_UNIT_STORE_STORE_TEST_FIXTURE_H_
