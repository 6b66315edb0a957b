// Fuzzes the chunk decoder and apply against a fixed buffer (which is also
// the base context-coded chunks decode against): any bytes
// either fail to decode, or decode into a chunk that applies to its span
// exactly as its kind says (XOR flips the bits of its values, overwrite sets
// them, nothing else changes), refuses a span of the wrong size without
// writing, undoes exactly, and applied twice undoes itself (XOR) or changes
// nothing more (overwrite).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "dcr/codec.h"
#include "dcr/digest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto decoder = std::move(*dcr::ChunkDecoder::Create());
  // Re-seal the checksum trailer so mutations reach the decoder's logic
  // instead of stopping at the checksum (which the unit tests cover).
  std::vector<std::byte> buf(reinterpret_cast<const std::byte*>(data),
                             reinterpret_cast<const std::byte*>(data) + size);
  if (buf.size() >= 8) {
    uint64_t sum = dcr::Hash64(std::span(buf).first(buf.size() - 8));
    std::memcpy(buf.data() + buf.size() - 8, &sum, 8);
  }
  std::span<const std::byte> bytes(buf);
  // A receiver knows the span length it expects and checks the header
  // against it before decoding; model that bound (64 Ki elements).
  auto h = dcr::PeekChunkHeader(bytes);
  if (!h.ok() || h->span_elems > (1u << 16)) return 0;
  // The span it applies to, a fixed pattern: context-coded chunks decode
  // against it (their contexts come from its exponents), so a chunk whose
  // contexts disagree with it must be refused, never misapplied.
  const size_t w = h->elem_size;
  size_t span_bytes = static_cast<size_t>(h->span_elems) * w;
  std::vector<std::byte> span(span_bytes);
  for (size_t i = 0; i < span.size(); ++i) span[i] = std::byte(i * 31);
  const std::vector<std::byte> before = span;
  dcr::DecodedChunk c;
  if (!decoder->Decode(bytes, &c, nullptr, span).ok()) return 0;
  if (span != before) std::abort();  // decoding reads the base only
  if (c.header.encoding == dcr::ChunkEncoding::kContext) {
    // Without the base it is refused.
    dcr::DecodedChunk none;
    if (decoder->Decode(bytes, &none).ok()) std::abort();
  }

  // A span of the wrong size is refused before anything is written.
  std::vector<std::byte> longer(span_bytes + w, std::byte{0x5a});
  if (dcr::ApplyChunk(c, longer).ok()) std::abort();
  if (std::any_of(longer.begin(), longer.end(),
                  [](std::byte b) { return b != std::byte{0x5a}; })) {
    std::abort();
  }

  // What applying must give, element by element: XOR chunks flip the bits
  // of their values, overwrites set them; every other element is unchanged.
  const bool is_xor = c.header.kind == dcr::ChunkKind::kXor;
  const bool dense = c.header.encoding == dcr::ChunkEncoding::kDense;
  const size_t count = dense ? c.header.span_elems : c.positions.size();
  if (c.values.size() != count * w) std::abort();
  std::vector<std::byte> expect = before;
  for (size_t k = 0; k < count; ++k) {
    size_t e = dense ? k : c.positions[k];
    // Sparse positions are strictly ascending and inside the span.
    if (e >= c.header.span_elems) std::abort();
    if (!dense && k > 0 && e <= c.positions[k - 1]) std::abort();
    for (size_t b = 0; b < w; ++b) {
      std::byte v = c.values[k * w + b];
      expect[e * w + b] = is_xor ? expect[e * w + b] ^ v : v;
    }
  }
  std::vector<std::byte> undo;
  if (!dcr::ApplyChunk(c, span, &undo).ok()) std::abort();
  if (span != expect) std::abort();
  if (!dcr::UndoChunk(c, undo, span).ok()) std::abort();
  if (span != before) std::abort();

  // Applied twice: an XOR chunk undoes itself, an overwrite is idempotent.
  if (!dcr::ApplyChunk(c, span).ok() || !dcr::ApplyChunk(c, span).ok()) {
    std::abort();
  }
  if (span != (is_xor ? before : expect)) std::abort();
  return 0;
}
