// The order-0 entropy floor of a delta (DESIGN.md §1), the yardstick the
// codec is measured against:
//   floor bits = N * H(p)            positions: N elements, p = K / N changed
//              + K * H(xor values)   values: order-0 entropy of old ^ new
//                                    over the K changed elements,
// with H computed separately per element width and summed. It is a floor
// for coders that treat positions as independent draws and values as
// independent symbols; a coder that adapts per span can beat it.
//
// Thread safety: not thread-safe; give each thread its own and Merge().
#ifndef DCR_ENTROPY_H_
#define DCR_ENTROPY_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace dcr {

class EntropyFloor {
 public:
  EntropyFloor();
  // Counts the elements of one span or tensor: `base` and `target` hold
  // the same number of elements of `elem_size` (1, 2, 4 or 8) bytes.
  void Add(size_t elem_size, std::span<const std::byte> base,
           std::span<const std::byte> target);
  void Merge(const EntropyFloor& other);

  uint64_t elements() const;
  uint64_t changed() const;
  double change_rate() const;
  double position_bytes() const;  // sum over widths of N * H(p) / 8
  double value_bytes() const;     // sum over widths of K * H(values) / 8
  double floor_bytes() const { return position_bytes() + value_bytes(); }

 private:
  struct Width {
    uint64_t elements = 0;
    uint64_t changed = 0;
    std::vector<uint64_t> small;                   // counts for widths 1 and 2
    std::unordered_map<uint64_t, uint64_t> large;  // widths 4 and 8
  };
  Width widths_[4];  // by log2(elem_size)
};

}  // namespace dcr

#endif  // DCR_ENTROPY_H_
