// Finding changed elements between two versions of a span, and splitting
// and joining byte planes. These loops are the codec's hot path.
#ifndef DCR_CODEC_DIFF_H_
#define DCR_CODEC_DIFF_H_

#include <cstddef>
#include <cstdint>

namespace dcr {

// Scans `n` elements of `elem_size` bytes. For every element whose bits
// differ, appends its index to `positions` and its value to the byte
// planes: plane j receives byte j of (base ^ target) when `xor_values`,
// else of target. `positions` must have room for n entries and each
// plane for n bytes. Returns the number of changed elements.
size_t FindChanges(size_t elem_size, const std::byte* base,
                   const std::byte* target, size_t n, bool xor_values,
                   uint32_t* positions, uint8_t* const* planes);

// Splits n elements into byte planes: planes[j][i] = byte j of element i
// (of a ^ b when b is non-null, else of a).
void SplitPlanes(size_t elem_size, const std::byte* a, const std::byte* b,
                 size_t n, uint8_t* const* planes);

// The inverse: out[i * elem_size + j] = planes[j][i].
void JoinPlanes(size_t elem_size, const uint8_t* const* planes, size_t n,
                std::byte* out);

}  // namespace dcr

#endif  // DCR_CODEC_DIFF_H_
