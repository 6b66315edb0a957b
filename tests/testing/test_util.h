// Small helpers that several unit tests share. A test binary is built as
// CMake unity sources (tests/CMakeLists.txt), so two files of one binary
// may not both define a helper of the same name: shared ones live here.
#ifndef DCR_TESTS_TESTING_TEST_UTIL_H_
#define DCR_TESTS_TESTING_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "common/file.h"
#include "dcr/version.h"

namespace dcr::testing {

inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kGiB = uint64_t{1} << 30;

// `n` bytes from std::mt19937 seeded with `seed` (the same bytes on every
// platform).
inline std::vector<std::byte> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

// The bytes of `s`.
inline std::vector<std::byte> TextBytes(std::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

// A refit id whose bytes are seed, seed+1, ... (distinct seeds give
// distinct ids).
inline RefitId TestRefitId(uint8_t seed) {
  RefitId id;
  for (size_t i = 0; i < id.bytes.size(); ++i) {
    id.bytes[i] = static_cast<uint8_t>(seed + i);
  }
  return id;
}

// The file's contents, or "<status>" when it cannot be read (so that a
// failed read shows in an EXPECT's message).
inline std::string ReadAllOrStatus(const std::string& path) {
  auto s = ReadFileToString(path);
  return s.ok() ? *s : "<" + s.status().ToString() + ">";
}

}  // namespace dcr::testing

#endif  // DCR_TESTS_TESTING_TEST_UTIL_H_
