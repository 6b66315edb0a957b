// 128-bit content digests (XXH3-128), 64-bit checksums (XXH3-64), and the
// linear digest that names a tensor's bits.
//
// Digests name content, not trust: they detect accidental change. Frames
// that must resist a forger carry an authentication tag instead.
//
// Thread safety: Digest128 is a value. A Hasher128 is not thread-safe.
#ifndef DCR_DIGEST_H_
#define DCR_DIGEST_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "dcr/status.h"

namespace dcr {

struct Digest128 {
  uint64_t high = 0;
  uint64_t low = 0;

  friend bool operator==(const Digest128&, const Digest128&) = default;
  // 32 lower-case hex digits, high word first (XXH3 canonical order).
  std::string ToHex() const;
  // The first 12 hex digits: what logs and tables print.
  std::string ShortHex() const { return ToHex().substr(0, 12); }
  static Result<Digest128> FromHex(std::string_view hex);
  bool IsZero() const { return high == 0 && low == 0; }
};

// XXH3-128 of `data` (seed 0).
Digest128 Hash128(std::span<const std::byte> data);
// XXH3-64 of `data` (seed 0).
uint64_t Hash64(std::span<const std::byte> data);

// Incremental XXH3-128. Update() may be called any number of times;
// Finish() may be called repeatedly and does not reset the state.
class Hasher128 {
 public:
  Hasher128();
  ~Hasher128();
  Hasher128(const Hasher128&) = delete;
  Hasher128& operator=(const Hasher128&) = delete;
  Hasher128(Hasher128&&) noexcept;
  Hasher128& operator=(Hasher128&&) noexcept;

  void Update(std::span<const std::byte> data);
  void Update(std::string_view s) {
    Update(std::as_bytes(std::span<const char>(s.data(), s.size())));
  }
  void UpdateU64(uint64_t v);  // little-endian
  void Update(const Digest128& d) {
    UpdateU64(d.high);
    UpdateU64(d.low);
  }
  Digest128 Finish() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// A 128-bit digest that is linear in the bits it covers, so that it
// composes from parts (docs/FORMAT.md §"Linear digest"). With blocks X_b of
// 16 bytes (little-endian elements of GF(2^128) modulo x^128 + x^7 + x^2 +
// x + 1, the last one zero-padded) and the fixed element K of
// kLinearDigestKey, the linear digest of a byte string is
//
//   L(S) = XOR over b of X_b * K^(b + 1).
//
// LinearHash(offset, bytes) is the contribution of `bytes` lying at byte
// `offset` of a longer string. The string's L is the XOR of the
// contributions of any partition of its bytes into ranges, each computed
// knowing only its own bytes and offset: a trainer rank hashes the regions
// of a canonical tensor it holds, and the parts add up to what a store
// holding the whole tensor computes. It is linear: LinearHash(o, a ^ b) =
// LinearHash(o, a) ^ LinearHash(o, b), so the XOR mask a chunk applies at
// an offset changes the digest by the mask's LinearHash.
//
// It detects accidental change between strings of the same length (two
// strings of n blocks that differ have the same L with probability about
// n / 2^128 for a K drawn at random); it is no MAC. L itself ignores length:
// S and S followed by zero bytes have the same L, and all-zero strings have
// L = 0, so a digest built on it must bind the length. Speed:
// docs/FORMAT.md and bench/digest_bench.
struct LinearDigest {
  uint64_t low = 0;
  uint64_t high = 0;

  LinearDigest& operator^=(const LinearDigest& o) {
    low ^= o.low;
    high ^= o.high;
    return *this;
  }
  friend LinearDigest operator^(LinearDigest a, const LinearDigest& b) {
    return a ^= b;
  }
  friend bool operator==(const LinearDigest&, const LinearDigest&) = default;
  bool IsZero() const { return low == 0 && high == 0; }
};

// K: fixed by the format; never 0 or 1.
inline constexpr LinearDigest kLinearDigestKey = {0x9e3779b97f4a7c15ull,
                                                  0xd1b54a32d192ed03ull};

LinearDigest LinearHash(uint64_t offset, std::span<const std::byte> bytes);

// The contributions of `count` runs of `run_bytes` each: run i is the
// bytes at data + i * data_stride, lying at byte offset + i * stride of
// the string. Equal to the XOR of LinearHash over the runs; where the
// offset, the stride and the run length are whole 16-byte blocks, each run
// costs two products instead of a power of K, which is most of
// LinearHash's cost for runs of a few KiB (a tensor-parallel rank's rows
// of a column-split matrix).
LinearDigest LinearHashRuns(uint64_t offset, uint64_t stride,
                            uint64_t run_bytes, uint64_t count,
                            const std::byte* data, uint64_t data_stride);

// The contributions of `count` elements of `elem_size` (1, 2, 4 or 8)
// bytes scattered over a string: element k is the bytes at
// values + k * elem_size, lying at byte offset + positions[k] * elem_size.
// Equal to the XOR of LinearHash over the elements; positions must ascend
// strictly. Where `offset` is a multiple of elem_size (no element straddles
// a 16-byte block) it costs one product per block holding an element
// (Horner over the blocks, from the last), and a power of K (up to 16
// products) per gap of more than 8 blocks, not a power per element:
// how a producer whose shards live on a GPU updates its digests by the XOR
// masks of the changed elements it copied back, without the shards.
LinearDigest LinearHashElements(uint64_t offset, size_t elem_size,
                                const uint64_t* positions, size_t count,
                                const std::byte* values);

// The digest of one tensor's bits, which names them in version records,
// PLAN and END, history and delta headers (docs/FORMAT.md §1 "Digests"):
//
//   D = L(bytes) ^ ({length, 0} * M)
//
// with L the linear digest above, `length` the byte count as the low word
// of a field element, and M the fixed element kTensorDigestLengthKey. The
// length term tells apart strings that L alone does not (a tensor and the
// same bytes followed by zeros, or all-zero tensors of two sizes).
//
// It composes: for ranges that partition a tensor's bytes, each hashed by
// LinearHash at its byte offset wherever the range lives (a trainer rank,
// a relay's span), FinishTensorDigest(XOR of the parts, length) equals
// TensorDigest(bytes).
Digest128 TensorDigest(std::span<const std::byte> bytes);
Digest128 FinishTensorDigest(const LinearDigest& sum, uint64_t length);

// M: fixed by the format; not a power of K that anyone knows.
inline constexpr LinearDigest kTensorDigestLengthKey = {0x2545f4914f6cdd1dull,
                                                        0x94d049bb133111ebull};

// The product of two elements of GF(2^128) as above (for tests and for
// combining digests).
LinearDigest GfMultiply(const LinearDigest& a, const LinearDigest& b);

}  // namespace dcr

#endif  // DCR_DIGEST_H_
