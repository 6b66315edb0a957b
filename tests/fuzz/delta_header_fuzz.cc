// Fuzzes the delta file header decoder.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "dcr/delta.h"
#include "dcr/digest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Re-seal the header checksum (bytes 128..135) so mutations reach the
  // field checks; checksum failures are covered by the unit tests.
  std::vector<std::byte> buf(reinterpret_cast<const std::byte*>(data),
                             reinterpret_cast<const std::byte*>(data) + size);
  if (buf.size() >= dcr::kDeltaHeaderBytes) {
    uint64_t sum = dcr::Hash64(std::span(buf).first(128));
    std::memcpy(buf.data() + 128, &sum, 8);
  }
  std::span<const std::byte> bytes(buf);
  auto h = dcr::DecodeDeltaHeader(bytes);
  if (h.ok()) {
    // Whatever decodes must encode back to the same header bytes.
    auto again = dcr::EncodeDeltaHeader(*h);
    if (again.size() != dcr::kDeltaHeaderBytes ||
        !std::equal(again.begin(), again.end(), bytes.begin())) {
      std::abort();
    }
  }
  return 0;
}
