// Splitting and joining byte planes; FindChanges runs the compilation of
// codec/diff_impl.inc this CPU runs best (codec/context_scan.h).
#include "codec/diff.h"

#include "codec/context_scan.h"

namespace dcr {
namespace {

template <size_t W>
void SplitW(const std::byte* a, const std::byte* b, size_t n,
            uint8_t* const* planes) {
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < W; ++j) {
      uint8_t x = static_cast<uint8_t>(a[i * W + j]);
      if (b != nullptr) x ^= static_cast<uint8_t>(b[i * W + j]);
      planes[j][i] = x;
    }
  }
}

template <size_t W>
void JoinW(const uint8_t* const* planes, size_t n, std::byte* out) {
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < W; ++j) out[i * W + j] = std::byte{planes[j][i]};
  }
}

}  // namespace

size_t FindChanges(size_t elem_size, const std::byte* base,
                   const std::byte* target, size_t n, bool xor_values,
                   uint32_t* positions, uint8_t* const* planes) {
  return ContextScan().find_changes(elem_size, base, target, n, xor_values,
                                    positions, planes);
}

void SplitPlanes(size_t elem_size, const std::byte* a, const std::byte* b,
                 size_t n, uint8_t* const* planes) {
  switch (elem_size) {
    case 1:
      return SplitW<1>(a, b, n, planes);
    case 2:
      return SplitW<2>(a, b, n, planes);
    case 4:
      return SplitW<4>(a, b, n, planes);
    default:
      return SplitW<8>(a, b, n, planes);
  }
}

void JoinPlanes(size_t elem_size, const uint8_t* const* planes, size_t n,
                std::byte* out) {
  switch (elem_size) {
    case 1:
      return JoinW<1>(planes, n, out);
    case 2:
      return JoinW<2>(planes, n, out);
    case 4:
      return JoinW<4>(planes, n, out);
    default:
      return JoinW<8>(planes, n, out);
  }
}

}  // namespace dcr
