#include "codec/bit_io.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "common/bytes.h"

namespace dcr {
namespace {

// Coded bits of one gap.
inline uint64_t GapBits(uint32_t gap, uint32_t k) {
  uint32_t q = gap >> k;
  return q < kRiceEscape ? q + 1 + k : kRiceEscape + 32;
}

}  // namespace

uint64_t RiceCodedBytes(std::span<const uint32_t> positions, uint32_t k) {
  uint64_t bits = 0;
  uint32_t next = 0;
  for (uint32_t p : positions) {
    bits += GapBits(p - next, k);
    next = p + 1;
  }
  return (bits + 7) / 8;
}

uint32_t ChooseRiceK(std::span<const uint32_t> positions) {
  if (positions.empty()) return 0;
  // For geometric gaps the best k is near log2(mean gap * ln 2); cost four
  // candidates around it in one pass.
  double mean = static_cast<double>(positions.back() + 1 - positions.size()) /
                positions.size();
  int guess = mean * 0.69 >= 1 ? static_cast<int>(std::log2(mean * 0.69)) : 0;
  uint32_t k0 = static_cast<uint32_t>(
      std::clamp(guess - 1, 0, static_cast<int>(kMaxRiceK) - 3));
  uint64_t bits[4] = {0, 0, 0, 0};
  uint32_t next = 0;
  for (uint32_t p : positions) {
    uint32_t gap = p - next;
    next = p + 1;
    for (uint32_t c = 0; c < 4; ++c) bits[c] += GapBits(gap, k0 + c);
  }
  uint32_t best = 0;
  for (uint32_t c = 1; c < 4; ++c) {
    if (bits[c] < bits[best]) best = c;
  }
  return k0 + best;
}

size_t RiceEncode(std::span<const uint32_t> positions, uint32_t k,
                  std::vector<std::byte>* out) {
  size_t start = out->size();
  // Every code is at most 56 bits; write through a raw pointer into a
  // buffer sized for the worst case, then trim.
  out->resize(start + positions.size() * 7 + 8);
  std::byte* dst = out->data() + start;
  uint64_t acc = 0;
  uint32_t nbits = 0;
  auto put = [&](uint64_t v, uint32_t n) {  // n <= 32
    acc |= v << nbits;
    nbits += n;
    if (nbits >= 32) {
      StoreLE<uint32_t>(dst, static_cast<uint32_t>(acc));
      dst += 4;
      acc >>= 32;
      nbits -= 32;
    }
  };
  uint32_t next = 0;
  const uint64_t low_mask = (uint64_t{1} << k) - 1;
  for (uint32_t p : positions) {
    uint32_t gap = p - next;
    next = p + 1;
    uint32_t q = gap >> k;
    if (q < kRiceEscape) {
      // q ones, a zero, then the k low bits: one put when it fits.
      uint64_t code = ((uint64_t{1} << q) - 1) | ((gap & low_mask) << (q + 1));
      uint32_t len = q + 1 + k;
      if (len <= 32) {
        put(code, len);
      } else {
        put((uint64_t{1} << q) - 1, q + 1);
        put(gap & low_mask, k);
      }
    } else {
      put((uint64_t{1} << kRiceEscape) - 1, kRiceEscape);
      put(gap, 32);
    }
  }
  while (nbits > 0) {
    *dst++ = static_cast<std::byte>(acc);
    acc >>= 8;
    nbits = nbits > 8 ? nbits - 8 : 0;
  }
  size_t written = static_cast<size_t>(dst - (out->data() + start));
  out->resize(start + written);
  return written;
}

Status RiceDecode(std::span<const std::byte> in, uint32_t k, uint32_t count,
                  uint32_t span_elems, std::vector<uint32_t>* out) {
  if (k > kMaxRiceK) return Status::Corruption("Rice parameter out of range");
  // Every code takes at least k + 1 bits: refuse counts the section cannot
  // hold before allocating for them.
  if (static_cast<uint64_t>(count) * (k + 1) > uint64_t{8} * in.size()) {
    return Status::Corruption("more positions than the section can hold");
  }
  out->resize(count);
  uint32_t* dst = out->data();
  const std::byte* base = in.data();
  const uint64_t limit_bits = static_cast<uint64_t>(in.size()) * 8;
  const uint64_t low_mask = (uint64_t{1} << k) - 1;
  uint64_t bitpos = 0;
  uint64_t next = 0;  // p_{i-1} + 1
  for (uint32_t i = 0; i < count; ++i) {
    // Every code is at most 56 bits; a peek yields at least 57.
    if (bitpos >= limit_bits) {
      return Status::Corruption("position code ends early");
    }
    uint64_t word = LoadLE<uint64_t>(base + (bitpos >> 3)) >> (bitpos & 7);
    uint32_t ones = static_cast<uint32_t>(std::countr_one(word));
    uint64_t gap;
    if (ones < kRiceEscape) {
      gap = (static_cast<uint64_t>(ones) << k) |
            ((word >> (ones + 1)) & low_mask);
      bitpos += ones + 1 + k;
    } else {
      gap = (word >> kRiceEscape) & 0xffffffffu;
      bitpos += kRiceEscape + 32;
      // Only gaps that need it are escaped: one encoding per chunk.
      if ((gap >> k) < kRiceEscape) {
        return Status::Corruption("escaped a gap that has a Rice code");
      }
    }
    next += gap;
    if (next >= span_elems) {
      return Status::Corruption("position beyond the end of the span");
    }
    dst[i] = static_cast<uint32_t>(next);
    ++next;
  }
  if (bitpos > limit_bits) {
    return Status::Corruption("position code runs past its section");
  }
  if (limit_bits - bitpos >= 8) {
    return Status::Corruption("position section has trailing bytes");
  }
  if (bitpos < limit_bits) {
    uint8_t last = static_cast<uint8_t>(base[(limit_bits >> 3) - 1]);
    if ((last >> (bitpos & 7)) != 0) {
      return Status::Corruption("position section padding is not zero");
    }
  }
  return Status::OK();
}

}  // namespace dcr
