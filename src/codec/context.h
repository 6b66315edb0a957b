// Context-coded chunks (ChunkEncoding::kContext, docs/FORMAT.md §context):
// the elements of a span are split into ranges of the base element's
// exponent field; each range's changed elements are Rice-coded as gaps in
// range-local indices (or its unchanged ones, where most changed), and the
// values are byte planes per group of adjacent ranges. A range of small
// exponents (where an update of fixed size crosses half an ULP often) and
// one of large exponents (where it rarely does) each get their own
// density, which is what the order-0 floor cannot see.
//
// Internal to the codec: chunk.cc calls these.
#ifndef DCR_CODEC_CONTEXT_H_
#define DCR_CODEC_CONTEXT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "codec/context_scan.h"
#include "codec/planes.h"
#include "dcr/codec.h"

namespace dcr {

inline constexpr uint8_t kContextChunkVersion = 2;
inline constexpr size_t kContextFixedBytes = 40;
inline constexpr size_t kRangeEntryBytes = 13;
inline constexpr size_t kMaxContextGroups = 4;

// True iff chunks of elements of `elem_size` bytes can be context-coded
// with `field` (1, 2 or 4 bytes; 1 to 8 bits inside the element).
bool ContextUsable(size_t elem_size, ExponentField field);

// One thread's context encoder; reuses its scratch.
class ContextEncoder {
 public:
  struct Changes {
    ChunkKind kind;
    ChunkId id;
    size_t elem_size;
    ExponentField field;
    std::span<const std::byte> base;      // the span's base bits
    std::span<const uint32_t> positions;  // changed elements, ascending
    const uint8_t* const* planes;         // value planes, positions.size() each
  };
  // Estimates the context-coded size against the base-independent sparse
  // encoding of the same changes. If it is at most `gain` times that,
  // appends the context-coded chunk to `out` and returns true; otherwise
  // appends nothing and returns false.
  Result<bool> Encode(const Changes& c, double gain, PlaneCoder* planes,
                      std::vector<std::byte>* out, ChunkSizes* sizes);

 private:
  struct Scratch;
  std::shared_ptr<Scratch> s_;
};

// Decodes the context-coded chunk `bytes` (its header `h`, checked by
// PeekChunkHeader and against its total size and checksum) against `base`
// into `out`.
Status DecodeContextChunk(std::span<const std::byte> bytes,
                          const ChunkHeader& h, std::span<const std::byte> base,
                          PlaneDecoder* planes, DecodedChunk* out,
                          ChunkSizes* sizes);

}  // namespace dcr

#endif  // DCR_CODEC_CONTEXT_H_
