// The entropy floors of a delta (DESIGN.md §1), the yardsticks the codec is
// measured against.
//
// Order-0 floor:
//   floor bits = N * H(p)            positions: N elements, p = K / N changed
//              + K * H(xor values)   values: order-0 entropy of old ^ new
//                                    over the K changed elements,
// with H computed separately per element width and summed. It is a floor
// for coders that treat positions as independent draws and values as
// independent symbols; a coder that adapts per span can beat it.
//
// Conditional floor (issue 16): the same, but per context c = the value of
// the BASE element's exponent field (bits [shift, shift + bits) of the
// element read as a little-endian unsigned integer, dtype.h):
//   conditional bits = sum over c of N_c * H(K_c / N_c)
//                    + sum over c of K_c * H(xor values within c),
// what a coder that knows the base (as the receiver does) needs. Contexts
// are kept apart per element width and per exponent field, so a checkpoint
// of several dtypes is conditioned on the dtype too. An empty field
// (integers, bool, F64) is one context: there the conditional floor of
// those elements equals their order-0 floor. Statistics are over
// everything added (a whole checkpoint pair), never per span.
//
// Thread safety: not thread-safe; give each thread its own and Merge().
#ifndef DCR_ENTROPY_H_
#define DCR_ENTROPY_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "dcr/dtype.h"

namespace dcr {

class EntropyFloor {
 public:
  // Counts the elements of one span or tensor: `base` and `target` hold
  // the same number of elements of `elem_size` (1, 2, 4 or 8) bytes.
  // `field` is the dtype's exponent field (ExponentFieldOf); a field that
  // does not fit in the element, or is wider than 16 bits, counts as empty.
  void Add(size_t elem_size, ExponentField field,
           std::span<const std::byte> base, std::span<const std::byte> target);
  // As above with an empty field: order-0 statistics only (the conditional
  // floor of these elements equals their order-0 floor).
  void Add(size_t elem_size, std::span<const std::byte> base,
           std::span<const std::byte> target) {
    Add(elem_size, ExponentField{}, base, target);
  }
  void Merge(const EntropyFloor& other);

  uint64_t elements() const;
  uint64_t changed() const;
  double change_rate() const;
  double position_bytes() const;  // sum over widths of N * H(p) / 8
  double value_bytes() const;     // sum over widths of K * H(values) / 8
  double floor_bytes() const { return position_bytes() + value_bytes(); }

  // Sum over contexts of N_c * H(p_c) / 8.
  double conditional_position_bytes() const;
  // Sum over contexts of K_c * H(values within c) / 8.
  double conditional_value_bytes() const;
  double conditional_floor_bytes() const {
    return conditional_position_bytes() + conditional_value_bytes();
  }

 private:
  // The counts of one context. XOR values are counted in `sparse` until it
  // holds many distinct values; for widths 1 and 2 they then move to
  // `dense` (2^(8 * width) counters), so memory grows only with the
  // contexts that see varied changes (BF16: at most 256 x 512 KiB, in
  // practice the few dozen exponents of the weights).
  struct Context {
    uint64_t elements = 0;
    uint64_t changed = 0;
    std::unordered_map<uint64_t, uint64_t> sparse;
    std::vector<uint64_t> dense;
  };
  // The contexts of one (width, field): 2^field.bits of them (1 if empty).
  struct Group {
    int width_log2 = 0;
    ExponentField field;
    std::vector<Context> contexts;
  };
  Group& GroupFor(int width_log2, ExponentField field);

  std::vector<Group> groups_;
};

}  // namespace dcr

#endif  // DCR_ENTROPY_H_
