#include "dcr/entropy.h"

#include <bit>
#include <cmath>

#include "common/bytes.h"

namespace dcr {
namespace {

double BinaryEntropyBits(uint64_t n, uint64_t k) {
  if (n == 0 || k == 0 || k == n) return 0.0;
  double p = static_cast<double>(k) / n;
  return n * (-p * std::log2(p) - (1 - p) * std::log2(1 - p));
}

template <typename Counts>
double SymbolEntropyBits(const Counts& counts, uint64_t total) {
  if (total == 0) return 0.0;
  double bits = 0;
  for (uint64_t c : counts) {
    if (c == 0) continue;
    bits -= c * std::log2(static_cast<double>(c) / total);
  }
  return bits;
}

// Counts the changed elements of width T and feeds each XOR value to
// `count`.
template <typename T, typename Count>
void CountChanges(std::span<const std::byte> base,
                  std::span<const std::byte> target, uint64_t* changed,
                  Count count) {
  size_t n = base.size() / sizeof(T);
  for (size_t i = 0; i < n; ++i) {
    T x = LoadLE<T>(base.data() + i * sizeof(T)) ^
          LoadLE<T>(target.data() + i * sizeof(T));
    if (x != 0) {
      ++*changed;
      count(x);
    }
  }
}

}  // namespace

EntropyFloor::EntropyFloor() {
  widths_[0].small.assign(256, 0);
  widths_[1].small.assign(65536, 0);
}

void EntropyFloor::Add(size_t elem_size, std::span<const std::byte> base,
                       std::span<const std::byte> target) {
  int w = std::countr_zero(elem_size) & 3;
  Width& width = widths_[w];
  width.elements += base.size() / elem_size;
  auto small = [&](uint64_t x) { ++width.small[x]; };
  auto large = [&](uint64_t x) { ++width.large[x]; };
  switch (elem_size) {
    case 1:
      CountChanges<uint8_t>(base, target, &width.changed, small);
      break;
    case 2:
      CountChanges<uint16_t>(base, target, &width.changed, small);
      break;
    case 4:
      CountChanges<uint32_t>(base, target, &width.changed, large);
      break;
    default:
      CountChanges<uint64_t>(base, target, &width.changed, large);
      break;
  }
}

void EntropyFloor::Merge(const EntropyFloor& other) {
  for (int w = 0; w < 4; ++w) {
    widths_[w].elements += other.widths_[w].elements;
    widths_[w].changed += other.widths_[w].changed;
    for (size_t i = 0; i < widths_[w].small.size(); ++i) {
      widths_[w].small[i] += other.widths_[w].small[i];
    }
    for (const auto& [k, v] : other.widths_[w].large) widths_[w].large[k] += v;
  }
}

uint64_t EntropyFloor::elements() const {
  uint64_t n = 0;
  for (const auto& w : widths_) n += w.elements;
  return n;
}

uint64_t EntropyFloor::changed() const {
  uint64_t n = 0;
  for (const auto& w : widths_) n += w.changed;
  return n;
}

double EntropyFloor::change_rate() const {
  uint64_t n = elements();
  return n ? static_cast<double>(changed()) / n : 0.0;
}

double EntropyFloor::position_bytes() const {
  double bits = 0;
  for (const auto& w : widths_)
    bits += BinaryEntropyBits(w.elements, w.changed);
  return bits / 8;
}

double EntropyFloor::value_bytes() const {
  double bits = 0;
  for (const auto& w : widths_) {
    if (!w.small.empty()) {
      bits += SymbolEntropyBits(w.small, w.changed);
    } else {
      std::vector<uint64_t> counts;
      counts.reserve(w.large.size());
      for (const auto& kv : w.large) counts.push_back(kv.second);
      bits += SymbolEntropyBits(counts, w.changed);
    }
  }
  return bits / 8;
}

}  // namespace dcr
