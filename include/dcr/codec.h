// The delta codec: diff two versions of one span of a tensor, encode the
// changes as a self-checking chunk, decode it, and apply it in place.
//
// A span is a fixed range of one tensor's elements (span index s covers
// elements [s * span_elems, min((s + 1) * span_elems, tensor elements))).
// A chunk carries the changes of one span, either
//   - XOR: changed positions and old ^ new (applying it twice undoes it), or
//   - overwrite: changed positions and new values (idempotent).
// Byte layout and the adaptive choice between encodings: docs/FORMAT.md.
//
// A chunk is either base-independent (kSparse, kDense: it decodes alone)
// or context-coded (kContext: positions and values are coded in the
// context of the base element's exponent, so it decodes only against the
// exact bits the span held before it, and the decoder is given that span).
// Context coding is for the first application of a span to a store that
// holds the base whole; everything decoded later or elsewhere (undo
// records, history files, retries, repairs) stays base-independent.
//
// Decoding validates everything (checksum, sizes, positions in bounds and
// ascending) before anything is written, so a chunk that decodes can be
// applied without further checks and one that does not decode changes
// nothing.
//
// Thread safety: ChunkEncoder and ChunkDecoder hold a compression context
// and scratch buffers; use one per thread. The free functions are
// thread-safe on distinct spans.
#ifndef DCR_CODEC_H_
#define DCR_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dcr/dtype.h"
#include "dcr/status.h"

namespace dcr {

// Values are part of the chunk format: append only.
enum class ChunkKind : uint8_t { kXor = 1, kOverwrite = 2 };
// How positions are represented inside a chunk.
enum class ChunkEncoding : uint8_t {
  kSparse = 1,  // Rice-coded position gaps + value byte planes
  kDense = 2,   // every element of the span, as byte planes
  // Positions as Rice-coded gaps within ranges of the base element's
  // exponent, values as byte planes per group of ranges; decodes only
  // against the base span (chunk format version 2).
  kContext = 3,
};

inline constexpr uint64_t kDefaultSpanElems = 1ull << 20;
// Spans are at most this many elements, so positions fit in 32 bits and a
// decoded chunk's buffers are bounded.
inline constexpr uint64_t kMaxSpanElems = 1ull << 26;
inline constexpr int kDefaultZstdLevel = 1;

// A chunk's id. `part` 0 is the whole span: the changes of every element
// of the span (a single-stream refit, repairs, catch-up, delta files). A
// producers' refit (docs/design/producer-stream.md) sends each span as
// parts, one per producer that holds elements of it, part = producer rank
// + 1; the parts of one span carry disjoint positions. Ids order by
// (tensor, span, part).
struct ChunkId {
  uint32_t tensor = 0;  // index in the canonical manifest
  uint32_t span = 0;    // span index within the tensor
  uint16_t part = 0;    // 0: the whole span; r + 1: producer r's part
  friend bool operator==(const ChunkId&, const ChunkId&) = default;
  friend auto operator<=>(const ChunkId&, const ChunkId&) = default;
};

// The most producers a refit can have: parts are u16 on the wire.
inline constexpr uint32_t kMaxChunkParts = 65535;

// "tensor 3, span 5" or, for a part, "tensor 3, span 5, part 2": how
// messages name a chunk.
std::string ChunkIdText(const ChunkId& id);

// The same span: chunks of one span may be parts of it.
inline bool SameSpan(const ChunkId& a, const ChunkId& b) {
  return a.tensor == b.tensor && a.span == b.span;
}

// The fixed part of a chunk, as read from its header.
struct ChunkHeader {
  ChunkKind kind = ChunkKind::kXor;
  ChunkEncoding encoding = ChunkEncoding::kSparse;
  uint8_t elem_size = 0;  // bytes per element: 1, 2, 4 or 8
  ChunkId id;
  uint32_t span_elems = 0;   // elements in this span
  uint32_t changed = 0;      // changed elements (sparse) or span_elems
  uint32_t total_bytes = 0;  // the whole chunk, header and checksum included
  // kContext only: the exponent field its contexts were built from.
  ExponentField context;
};

// Bytes per section of an encoded chunk (for inspect and benchmarks).
struct ChunkSizes {
  uint64_t header = 0;     // fixed header + section table + checksum
  uint64_t positions = 0;  // Rice-coded gaps (0 for dense)
  uint64_t values = 0;     // value planes
  // Elements whose bits the chunk changes. Exact when encoding; when
  // decoding, the chunk's changed count (all elements for dense chunks).
  uint64_t changed = 0;
  uint64_t total() const { return header + positions + values; }
  ChunkSizes& operator+=(const ChunkSizes& o) {
    header += o.header;
    positions += o.positions;
    values += o.values;
    changed += o.changed;
    return *this;
  }
};

struct EncodeOptions {
  int zstd_level = kDefaultZstdLevel;
  // Try the dense encoding when at least this fraction of the span changed
  // and keep whichever is smaller. 1.0 never tries it; 0 always does.
  double dense_threshold = 0.15;
  // False: every value plane is stored raw (a transport-only copy: no
  // compression work, the bytes as they are).
  bool compress = true;
  // EncodeDiffInContext keeps the context-coded chunk only if its
  // estimated size is at most this fraction of the base-independent one's.
  double context_gain = 0.97;
};

// Encodes chunks. Reuses one zstd context and its scratch buffers.
class ChunkEncoder {
 public:
  static Result<std::unique_ptr<ChunkEncoder>> Create(EncodeOptions options);
  ~ChunkEncoder();
  ChunkEncoder(const ChunkEncoder&) = delete;
  ChunkEncoder& operator=(const ChunkEncoder&) = delete;

  // Diffs `base` against `target` (the same span of one tensor, each
  // span_elems * elem_size bytes) and appends a chunk of `kind` to `out`.
  // Returns false and appends nothing when no element changed. This and
  // the other whole-span encoders (EncodeDiffInContext, EncodeFull) take
  // part 0 only: InvalidArgument otherwise.
  Result<bool> EncodeDiff(ChunkKind kind, ChunkId id, size_t elem_size,
                          std::span<const std::byte> base,
                          std::span<const std::byte> target,
                          std::vector<std::byte>* out,
                          ChunkSizes* sizes = nullptr);

  // As EncodeDiff, but codes the chunk in the context of `base`'s
  // exponent field (ChunkEncoding::kContext) when the per-context counts
  // estimate it smaller; otherwise exactly as EncodeDiff. The estimate
  // decides, so the chunk is encoded once. A context-coded chunk decodes
  // only against `base` itself: the caller sends it only to stores that
  // hold exactly the base bits of the whole span. `field` empty (integer
  // dtypes), elem_size 8, tiny spans and dense changes fall back.
  // `base_independent`, if given, receives the same changes in a
  // base-independent encoding whenever `out` got a context-coded chunk
  // (for history files), and nothing otherwise.
  Result<bool> EncodeDiffInContext(
      ChunkKind kind, ChunkId id, size_t elem_size, ExponentField field,
      std::span<const std::byte> base, std::span<const std::byte> target,
      std::vector<std::byte>* out, ChunkSizes* sizes = nullptr,
      std::vector<std::byte>* base_independent = nullptr);

  // Appends a dense overwrite chunk carrying every element of `target`
  // (seeding a node, full-checkpoint reference).
  Status EncodeFull(ChunkId id, size_t elem_size,
                    std::span<const std::byte> target,
                    std::vector<std::byte>* out, ChunkSizes* sizes = nullptr);

  // Appends a sparse chunk of `kind` for the elements at `positions`
  // (ascending, < span_elems) with `values` (positions.size() * elem_size
  // bytes, element-major: XOR masks or new values). Used to resend
  // uncertain chunks as overwrites, and for parts (id.part > 0), whose
  // changes a producer holds as positions rather than whole spans.
  Status EncodeChanges(ChunkKind kind, ChunkId id, size_t elem_size,
                       uint32_t span_elems, std::span<const uint32_t> positions,
                       std::span<const std::byte> values,
                       std::vector<std::byte>* out,
                       ChunkSizes* sizes = nullptr);

  // As EncodeChanges for a whole span (part 0: InvalidArgument otherwise),
  // coded in the context of `base` (the span's base bits, span_elems *
  // elem_size bytes) as EncodeDiffInContext would code the same changes:
  // the same bytes, without a pass that finds them (a producers' refit,
  // whose root has the changes as positions and the base in
  // root.baseline). Falls back to EncodeChanges where EncodeDiffInContext
  // would not code in context (and, unlike it, never to a dense chunk: a
  // span with dense_threshold of its elements changed or more may differ).
  // `base_independent` as there. On an error nothing is appended.
  Status EncodeChangesInContext(
      ChunkKind kind, ChunkId id, size_t elem_size, ExponentField field,
      std::span<const std::byte> base, std::span<const uint32_t> positions,
      std::span<const std::byte> values, std::vector<std::byte>* out,
      ChunkSizes* sizes = nullptr,
      std::vector<std::byte>* base_independent = nullptr);

 private:
  struct Impl;
  explicit ChunkEncoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A fully validated chunk. For sparse and context chunks `positions` lists the
// changed elements (strictly ascending, < span_elems) and `values` holds
// positions.size() * elem_size bytes; for dense chunks `positions` is empty
// and `values` holds span_elems * elem_size bytes.
struct DecodedChunk {
  ChunkHeader header;
  std::vector<uint32_t> positions;
  std::vector<std::byte> values;
};

// Reads the header of the chunk at the start of `bytes` without checking
// the payload. Corruption if the header is malformed, Incomplete input
// (fewer than the header's bytes) is Corruption too.
Result<ChunkHeader> PeekChunkHeader(std::span<const std::byte> bytes);
// The number of bytes a chunk header needs before PeekChunkHeader can
// return its total size.
inline constexpr size_t kChunkPrefixBytes = 32;

class ChunkDecoder {
 public:
  static Result<std::unique_ptr<ChunkDecoder>> Create();
  ~ChunkDecoder();
  ChunkDecoder(const ChunkDecoder&) = delete;
  ChunkDecoder& operator=(const ChunkDecoder&) = delete;

  // Decodes and validates the chunk that is exactly `bytes` into `out`
  // (whose buffers are reused). Any inconsistency is Corruption naming the
  // chunk and the field, and leaves `out` empty. `sizes`, if given,
  // receives the section sizes. Buffers grow to the chunk's span_elems:
  // callers that know the span length they expect check PeekChunkHeader
  // against it first.
  //
  // A kContext chunk needs `base`: the span it will apply to
  // (span_elems * elem_size bytes), holding the bits the chunk was encoded
  // against. Without it the chunk is InvalidArgument; against other
  // bits it fails its checksum of the decoded changes (Corruption), so
  // nothing is written. Other chunks ignore `base`.
  Status Decode(std::span<const std::byte> bytes, DecodedChunk* out,
                ChunkSizes* sizes = nullptr,
                std::span<const std::byte> base = {});

 private:
  struct Impl;
  explicit ChunkDecoder(std::unique_ptr<Impl> impl);
  Status DecodeInto(std::span<const std::byte> bytes, DecodedChunk* out,
                    ChunkSizes* sizes, std::span<const std::byte> base);
  std::unique_ptr<Impl> impl_;
};

// Applies a decoded chunk to `span` (exactly span_elems * elem_size bytes
// of the tensor's storage), in place. If `undo` is given, the span's
// previous values at the chunk's positions are appended to it first (what
// UndoChunk needs to restore an overwrite). Fails without writing if
// `span` has the wrong size.
Status ApplyChunk(const DecodedChunk& chunk, std::span<std::byte> span,
                  std::vector<std::byte>* undo = nullptr);

// Reverses ApplyChunk: XOR chunks are applied again; overwrite chunks
// write back the values ApplyChunk saved in `undo`.
Status UndoChunk(const DecodedChunk& chunk, std::span<const std::byte> undo,
                 std::span<std::byte> span);

// Number of spans of a tensor of `elements` elements (0 for an empty one).
inline uint64_t SpanCount(uint64_t elements, uint64_t span_elems) {
  return (elements + span_elems - 1) / span_elems;
}

}  // namespace dcr

#endif  // DCR_CODEC_H_
