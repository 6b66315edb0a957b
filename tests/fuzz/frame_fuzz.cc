// Fuzzes the incremental frame decoder: arbitrary bytes fed in pieces of
// arbitrary sizes. Checksums are re-sealed so mutations reach the checks
// behind them; whatever decodes must re-encode to the same bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "dcr/digest.h"
#include "dcr/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  size_t piece = 1 + data[0] % 97;  // feed granularity
  std::vector<std::byte> buf(reinterpret_cast<const std::byte*>(data) + 1,
                             reinterpret_cast<const std::byte*>(data) + size);
  // Re-seal the first frame's checksum when its declared length fits.
  if (buf.size() >= dcr::kFrameHeaderSize) {
    uint32_t len = 0;
    std::memcpy(&len, buf.data() + 8, 4);
    if (dcr::kFrameHeaderSize + uint64_t{len} <= buf.size()) {
      std::vector<std::byte> covered(buf.begin(), buf.begin() + 48);
      covered.insert(covered.end(), buf.begin() + dcr::kFrameHeaderSize,
                     buf.begin() + dcr::kFrameHeaderSize + len);
      uint64_t sum = dcr::Hash64(covered);
      std::memcpy(buf.data() + 48, &sum, 8);
    }
  }
  dcr::FrameOptions options;
  options.max_payload = 1 << 20;
  dcr::FrameDecoder decoder(options);
  std::span<const std::byte> rest(buf);
  while (!rest.empty() && !decoder.failed()) {
    size_t n = std::min(piece, rest.size());
    decoder.Feed(rest.first(n));
    rest = rest.subspan(n);
    for (;;) {
      auto next = decoder.Next();
      if (!next.ok() || !next->has_value()) break;
      const dcr::Frame& f = (*next)->frame;
      auto again = dcr::EncodeFrame(f.header, f.payload);
      if (f.has_auth_tag()) continue;  // tags are carried, not re-made
      if (!again.ok() || (*again)->size() != f.bytes.size() ||
          !std::equal(f.bytes.begin(), f.bytes.end(), (*again)->begin())) {
        std::abort();
      }
    }
  }
  return 0;
}
