#include "dcr/entropy.h"

#include <bit>
#include <cmath>

#include "common/bytes.h"

namespace dcr {
namespace {

// Widths 1 and 2 move a context's XOR counts from a hash map to a dense
// table past this many distinct values.
constexpr size_t kDenseAfter = 2048;

double BinaryEntropyBits(uint64_t n, uint64_t k) {
  if (n == 0 || k == 0 || k == n) return 0.0;
  double p = static_cast<double>(k) / n;
  return n * (-p * std::log2(p) - (1 - p) * std::log2(1 - p));
}

double SymbolBits(uint64_t c, uint64_t total) {
  return c == 0 ? 0.0 : -(c * std::log2(static_cast<double>(c) / total));
}

// A field that cannot be read from an element of `width_log2` counts as
// empty: one context.
ExponentField Usable(int width_log2, ExponentField field) {
  if (field.bits == 0 || field.bits > 16 ||
      field.shift + field.bits > (8 << width_log2)) {
    return ExponentField{};
  }
  return field;
}

}  // namespace

EntropyFloor::Group& EntropyFloor::GroupFor(int width_log2,
                                            ExponentField field) {
  for (Group& g : groups_) {
    if (g.width_log2 == width_log2 && g.field == field) return g;
  }
  Group& g = groups_.emplace_back();
  g.width_log2 = width_log2;
  g.field = field;
  g.contexts.resize(size_t{1} << field.bits);
  return g;
}

namespace {

// Adds `n` occurrences of XOR value `x` to a context's histogram (not to
// its changed count).
template <typename Context>
void AddValue(Context& c, uint64_t x, uint64_t n, int width_log2) {
  if (c.dense.empty() && width_log2 == 0) c.dense.assign(256, 0);
  if (!c.dense.empty()) {
    c.dense[x] += n;
    return;
  }
  c.sparse[x] += n;
  if (width_log2 == 1 && c.sparse.size() > kDenseAfter) {
    c.dense.assign(65536, 0);
    for (const auto& [v, k] : c.sparse) c.dense[v] = k;
    c.sparse = {};
  }
}

template <typename T, typename Group>
void CountElements(Group& g, std::span<const std::byte> base,
                   std::span<const std::byte> target) {
  const size_t n = base.size() / sizeof(T);
  const unsigned shift = g.field.shift;
  const T mask = static_cast<T>((uint64_t{1} << g.field.bits) - 1);
  const int width_log2 = g.width_log2;
  // Per-context element counts, added to the group at the end (the
  // contexts are large structs; this keeps the per-element loop tight).
  std::vector<uint64_t> elements(g.contexts.size(), 0);
  for (size_t i = 0; i < n; ++i) {
    const T b = LoadLE<T>(base.data() + i * sizeof(T));
    const T x = b ^ LoadLE<T>(target.data() + i * sizeof(T));
    const size_t c = static_cast<size_t>((b >> shift) & mask);
    ++elements[c];
    if (x != 0) {
      ++g.contexts[c].changed;
      AddValue(g.contexts[c], x, 1, width_log2);
    }
  }
  for (size_t c = 0; c < elements.size(); ++c) {
    g.contexts[c].elements += elements[c];
  }
}

}  // namespace

void EntropyFloor::Add(size_t elem_size, ExponentField field,
                       std::span<const std::byte> base,
                       std::span<const std::byte> target) {
  const int w = std::countr_zero(elem_size) & 3;
  Group& g = GroupFor(w, Usable(w, field));
  switch (w) {
    case 0:
      CountElements<uint8_t>(g, base, target);
      break;
    case 1:
      CountElements<uint16_t>(g, base, target);
      break;
    case 2:
      CountElements<uint32_t>(g, base, target);
      break;
    default:
      CountElements<uint64_t>(g, base, target);
      break;
  }
}

void EntropyFloor::Merge(const EntropyFloor& other) {
  for (const Group& og : other.groups_) {
    Group& g = GroupFor(og.width_log2, og.field);
    for (size_t c = 0; c < og.contexts.size(); ++c) {
      const Context& from = og.contexts[c];
      Context& to = g.contexts[c];
      to.elements += from.elements;
      for (const auto& [v, n] : from.sparse) AddValue(to, v, n, g.width_log2);
      for (size_t v = 0; v < from.dense.size(); ++v) {
        if (from.dense[v] != 0) AddValue(to, v, from.dense[v], g.width_log2);
      }
      to.changed += from.changed;
    }
  }
}

uint64_t EntropyFloor::elements() const {
  uint64_t n = 0;
  for (const Group& g : groups_) {
    for (const Context& c : g.contexts) n += c.elements;
  }
  return n;
}

uint64_t EntropyFloor::changed() const {
  uint64_t n = 0;
  for (const Group& g : groups_) {
    for (const Context& c : g.contexts) n += c.changed;
  }
  return n;
}

double EntropyFloor::change_rate() const {
  uint64_t n = elements();
  return n ? static_cast<double>(changed()) / n : 0.0;
}

double EntropyFloor::position_bytes() const {
  uint64_t n[4] = {}, k[4] = {};
  for (const Group& g : groups_) {
    for (const Context& c : g.contexts) {
      n[g.width_log2] += c.elements;
      k[g.width_log2] += c.changed;
    }
  }
  double bits = 0;
  for (int w = 0; w < 4; ++w) bits += BinaryEntropyBits(n[w], k[w]);
  return bits / 8;
}

double EntropyFloor::value_bytes() const {
  // Order-0: the histograms of every context and field of a width, summed.
  double bits = 0;
  for (int w = 0; w < 4; ++w) {
    std::vector<uint64_t> dense(w == 0 ? 256 : w == 1 ? 65536 : 0, 0);
    std::unordered_map<uint64_t, uint64_t> sparse;
    uint64_t k = 0;
    for (const Group& g : groups_) {
      if (g.width_log2 != w) continue;
      for (const Context& c : g.contexts) {
        k += c.changed;
        for (const auto& [v, n] : c.sparse) {
          if (dense.empty()) {
            sparse[v] += n;
          } else {
            dense[v] += n;
          }
        }
        for (size_t v = 0; v < c.dense.size(); ++v) dense[v] += c.dense[v];
      }
    }
    for (uint64_t n : dense) bits += SymbolBits(n, k);
    for (const auto& kv : sparse) bits += SymbolBits(kv.second, k);
  }
  return bits / 8;
}

double EntropyFloor::conditional_position_bytes() const {
  double bits = 0;
  for (const Group& g : groups_) {
    for (const Context& c : g.contexts) {
      bits += BinaryEntropyBits(c.elements, c.changed);
    }
  }
  return bits / 8;
}

double EntropyFloor::conditional_value_bytes() const {
  double bits = 0;
  for (const Group& g : groups_) {
    for (const Context& c : g.contexts) {
      for (const auto& kv : c.sparse) bits += SymbolBits(kv.second, c.changed);
      for (uint64_t n : c.dense) bits += SymbolBits(n, c.changed);
    }
  }
  return bits / 8;
}

}  // namespace dcr
