#include "relay/test_chunk_forgery.h"

#include <algorithm>
#include <vector>

#include "common/bytes.h"
#include "dcr/codec.h"
#include "dcr/digest.h"
#include "dcr/wire.h"

namespace dcr {

FrameBuffer TEST_ForgeChunkFrame(const FrameBuffer& frame,
                                 const FrameOptions& options) {
  auto parsed = ParseFrame(*frame);  // no key: the tag is kept, unchecked
  auto decoder = ChunkDecoder::Create();
  auto encoder = ChunkEncoder::Create(EncodeOptions{});
  if (!parsed.ok()) return nullptr;
  auto peek = PeekChunkHeader(parsed->payload);
  if (peek.ok() && peek->encoding == ChunkEncoding::kContext &&
      parsed->payload.size() == peek->total_bytes) {
    // A context-coded chunk decodes only against the base: forge its last
    // value byte and reseal its checksum, so that it still parses.
    std::vector<std::byte> payload(parsed->payload.begin(),
                                   parsed->payload.end());
    const size_t body = payload.size() - 8;
    payload[body - 1] ^= std::byte{1};
    StoreLE<uint64_t>(payload.data() + body,
                      Hash64(std::span<const std::byte>(payload).first(body)));
    FrameHeader header = parsed->header;
    header.flags &= static_cast<uint16_t>(~kFrameFlagsWireMask);
    auto forged = EncodeFrame(header, payload, options);
    return forged.ok() ? *forged : nullptr;
  }
  DecodedChunk c;
  if (!decoder.ok() || !encoder.ok() ||
      !(*decoder)->Decode(parsed->payload, &c).ok() || c.values.empty()) {
    return nullptr;
  }
  const ChunkHeader& h = c.header;
  size_t es = h.elem_size;
  // Flip a low bit of the first value, keeping it non-zero so that an XOR
  // chunk still changes that element.
  c.values[0] ^= std::byte{1};
  if (std::all_of(c.values.begin(), c.values.begin() + es,
                  [](std::byte b) { return b == std::byte{0}; })) {
    c.values[0] ^= std::byte{3};
  }
  std::vector<uint32_t> positions = c.positions;
  if (h.encoding == ChunkEncoding::kDense) {
    positions.resize(h.span_elems);
    for (uint32_t i = 0; i < h.span_elems; ++i) positions[i] = i;
  }
  std::vector<std::byte> payload;
  Status s = (*encoder)->EncodeChanges(h.kind, h.id, es, h.span_elems,
                                       positions, c.values, &payload);
  if (!s.ok()) return nullptr;
  FrameHeader header = parsed->header;
  header.flags &= static_cast<uint16_t>(~kFrameFlagsWireMask);
  auto forged = EncodeFrame(header, payload, options);
  return forged.ok() ? *forged : nullptr;
}

}  // namespace dcr
