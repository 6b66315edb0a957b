// Fuzzes the chunk decoder and apply: any bytes either fail to decode, or
// decode into a chunk that applies within its span and undoes exactly.
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
  dcr::DecodedChunk c;
  if (!decoder->Decode(bytes, &c).ok()) return 0;
  size_t span_bytes =
      static_cast<size_t>(c.header.span_elems) * c.header.elem_size;
  std::vector<std::byte> span(span_bytes);
  for (size_t i = 0; i < span.size(); ++i) span[i] = std::byte(i * 31);
  std::vector<std::byte> before = span, undo;
  if (!dcr::ApplyChunk(c, span, &undo).ok()) std::abort();
  if (!dcr::UndoChunk(c, undo, span).ok()) std::abort();
  if (span != before) std::abort();
  return 0;
}
