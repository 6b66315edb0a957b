// The part of the chunk layout every encoding shares (docs/FORMAT.md
// §"Chunk layout"): the 28-byte prefix and the trailing checksum.
//
// Internal to the codec.
#ifndef DCR_CODEC_CHUNK_LAYOUT_H_
#define DCR_CODEC_CHUNK_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/bytes.h"
#include "dcr/codec.h"
#include "dcr/digest.h"

namespace dcr {

inline constexpr uint32_t kChunkMagic = 0x43524344;  // "DCRC"
inline constexpr size_t kChecksumBytes = 8;

inline bool ValidElemSize(size_t w) {
  return w == 1 || w == 2 || w == 4 || w == 8;
}

// "chunk (tensor 3, span 5)": how messages name a chunk.
inline std::string ChunkName(const ChunkId& id) {
  return "chunk (" + ChunkIdText(id) + ")";
}

// The fields of a chunk's prefix.
struct ChunkPrefix {
  uint8_t version = 1;
  ChunkKind kind = ChunkKind::kXor;
  ChunkEncoding encoding = ChunkEncoding::kSparse;
  size_t elem_size = 0;
  ChunkId id;
  uint32_t span_elems = 0;
  uint32_t changed = 0;
};

// Writes the prefix of the chunk that starts at out[start] and whose body
// (everything but the checksum) ends at out->end(), then appends the
// checksum. The encoding-specific header bytes from offset 28 must be in
// place. The caller has checked that the chunk fits in 4 GiB.
inline void SealChunk(const ChunkPrefix& p, size_t start,
                      std::vector<std::byte>* out) {
  const size_t total = out->size() - start + kChecksumBytes;
  std::byte* h = out->data() + start;
  StoreLE<uint32_t>(h + 0, kChunkMagic);
  h[4] = std::byte{p.version};
  h[5] = static_cast<std::byte>(p.kind);
  h[6] = static_cast<std::byte>(p.encoding);
  h[7] = static_cast<std::byte>(p.elem_size);
  StoreLE<uint32_t>(h + 8, static_cast<uint32_t>(total));
  StoreLE<uint32_t>(h + 12, p.id.tensor);
  StoreLE<uint32_t>(h + 16, p.id.span);
  StoreLE<uint32_t>(h + 20, p.span_elems);
  StoreLE<uint32_t>(h + 24, p.changed);
  const uint64_t sum =
      Hash64(std::span<const std::byte>(h, total - kChecksumBytes));
  ByteWriter(out).Put<uint64_t>(sum);
}

}  // namespace dcr

#endif  // DCR_CODEC_CHUNK_LAYOUT_H_
