// Rice coding of position gaps (docs/FORMAT.md §positions).
//
// A chunk's changed positions p_0 < p_1 < ... are coded as gaps
// g_i = p_i - p_{i-1} - 1 (p_{-1} = -1), each with a Rice code of
// parameter k: q = g >> k one-bits, a zero bit, then the k low bits of g.
// A gap with q >= kRiceEscape is written as kRiceEscape one-bits followed
// by g in 32 bits. Bits are packed least-significant first into bytes.
#ifndef DCR_CODEC_BIT_IO_H_
#define DCR_CODEC_BIT_IO_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dcr/status.h"

namespace dcr {

inline constexpr uint32_t kRiceEscape = 24;
inline constexpr uint32_t kMaxRiceK = 26;

// Picks the k that minimizes the coded size of `positions` (ascending).
uint32_t ChooseRiceK(std::span<const uint32_t> positions);
// Exact size in bytes of the Rice code of `positions` with parameter k.
uint64_t RiceCodedBytes(std::span<const uint32_t> positions, uint32_t k);

// Appends the Rice code of `positions` (strictly ascending) to `out`,
// padded to a whole byte. Returns the number of bytes appended.
size_t RiceEncode(std::span<const uint32_t> positions, uint32_t k,
                  std::vector<std::byte>* out);

// Decodes exactly `count` positions from `in` into `out` (resized to
// count). `in` must be followed in memory by at least 8 readable bytes
// (the decoder reads whole words); the caller guarantees that. Fails with
// Corruption if the code runs past `in`, or a position reaches
// `span_elems`.
Status RiceDecode(std::span<const std::byte> in, uint32_t k, uint32_t count,
                  uint32_t span_elems, std::vector<uint32_t>* out);

}  // namespace dcr

#endif  // DCR_CODEC_BIT_IO_H_
