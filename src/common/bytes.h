// Little-endian loads and stores and LEB128 varints for on-disk and
// on-wire layouts. Loads and stores go through memcpy, so they are safe on
// unaligned addresses and compile to single moves.
#ifndef DCR_COMMON_BYTES_H_
#define DCR_COMMON_BYTES_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

static_assert(std::endian::native == std::endian::little,
              "dcr formats are little-endian and dcr assumes a "
              "little-endian host");

namespace dcr {

template <typename T>
inline T LoadLE(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
inline void StoreLE(void* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// Appends fixed-width little-endian integers and raw bytes to a buffer.
class ByteWriter {
 public:
  explicit ByteWriter(std::vector<std::byte>* out) : out_(out) {}
  template <typename T>
  void Put(T v) {
    size_t n = out_->size();
    out_->resize(n + sizeof(T));
    StoreLE<T>(out_->data() + n, v);
  }
  void PutBytes(std::span<const std::byte> b) {
    out_->insert(out_->end(), b.begin(), b.end());
  }
  void PutVarint(uint64_t v) {
    while (v >= 0x80) {
      out_->push_back(static_cast<std::byte>(v | 0x80));
      v >>= 7;
    }
    out_->push_back(static_cast<std::byte>(v));
  }
  size_t size() const { return out_->size(); }

 private:
  std::vector<std::byte>* out_;
};

// Reads from a byte span; every read checks bounds and a failed read sets
// a sticky error instead of reading past the end.
class ByteReader {
 public:
  explicit ByteReader(std::span<const std::byte> in) : in_(in) {}
  template <typename T>
  bool Get(T* v) {
    if (!ok_ || in_.size() - pos_ < sizeof(T)) return ok_ = false;
    *v = LoadLE<T>(in_.data() + pos_);
    pos_ += sizeof(T);
    return true;
  }
  bool GetBytes(size_t n, std::span<const std::byte>* b) {
    if (!ok_ || in_.size() - pos_ < n) return ok_ = false;
    *b = in_.subspan(pos_, n);
    pos_ += n;
    return true;
  }
  // Accepts only the minimal encoding of a value that fits in 64 bits, so
  // every value has exactly one encoding.
  bool GetVarint(uint64_t* v) {
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!Get(&b)) return false;
      if (shift == 63 && b > 1) break;  // overflows 64 bits
      r |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) {
        if (b == 0 && shift > 0) break;  // a redundant trailing zero group
        *v = r;
        return true;
      }
    }
    return ok_ = false;
  }
  bool ok() const { return ok_; }
  size_t pos() const { return pos_; }
  size_t remaining() const { return in_.size() - pos_; }

 private:
  std::span<const std::byte> in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// Formats a byte count for people: "1.50 GiB", "312 B".
std::string HumanBytes(uint64_t bytes);

}  // namespace dcr

#endif  // DCR_COMMON_BYTES_H_
