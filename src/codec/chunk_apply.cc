// Applying a decoded chunk to its span, and undoing it (dcr/codec.h
// ApplyChunk, UndoChunk).
#include <cstring>
#include <string>
#include <vector>

#include "codec/chunk_layout.h"
#include "common/bytes.h"
#include "dcr/codec.h"

namespace dcr {

namespace {

template <typename U>
void ApplySparse(const DecodedChunk& c, std::byte* span, bool xor_values) {
  const uint32_t* pos = c.positions.data();
  const std::byte* vals = c.values.data();
  size_t n = c.positions.size();
  for (size_t i = 0; i < n; ++i) {
    std::byte* dst = span + static_cast<size_t>(pos[i]) * sizeof(U);
    U v = LoadLE<U>(vals + i * sizeof(U));
    if (xor_values) v ^= LoadLE<U>(dst);
    StoreLE<U>(dst, v);
  }
}

void ApplyDenseXor(std::byte* dst, const std::byte* src, size_t bytes) {
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    StoreLE<uint64_t>(dst + i,
                      LoadLE<uint64_t>(dst + i) ^ LoadLE<uint64_t>(src + i));
  }
  for (; i < bytes; ++i) dst[i] ^= src[i];
}

void SaveOld(const DecodedChunk& c, std::span<const std::byte> span,
             std::vector<std::byte>* undo) {
  size_t w = c.header.elem_size;
  if (c.header.encoding == ChunkEncoding::kDense) {
    undo->insert(undo->end(), span.begin(), span.end());
    return;
  }
  size_t at = undo->size();
  undo->resize(at + c.positions.size() * w);
  std::byte* dst = undo->data() + at;
  for (size_t i = 0; i < c.positions.size(); ++i) {
    std::memcpy(dst + i * w,
                span.data() + static_cast<size_t>(c.positions[i]) * w, w);
  }
}

Status CheckSpan(const DecodedChunk& c, size_t bytes) {
  // A DecodedChunk is trusted only as Decode leaves it; check the sizes
  // the writes below rely on anyway, so a misuse cannot overflow.
  size_t w = c.header.elem_size;
  bool dense = c.header.encoding == ChunkEncoding::kDense;
  size_t count = dense ? c.header.span_elems : c.positions.size();
  if (!ValidElemSize(w) || c.values.size() != count * w ||
      (!dense && c.positions.size() != c.header.changed) ||
      (!c.positions.empty() && c.positions.back() >= c.header.span_elems)) {
    return Status::Internal(ChunkName(c.header.id) +
                            ": decoded chunk is inconsistent");
  }
  if (bytes != static_cast<size_t>(c.header.span_elems) * c.header.elem_size) {
    return Status::InvalidArgument(
        ChunkName(c.header.id) + ": span of " + std::to_string(bytes) +
        " bytes where the chunk expects " +
        std::to_string(static_cast<size_t>(c.header.span_elems) *
                       c.header.elem_size));
  }
  return Status::OK();
}

void Write(const DecodedChunk& c, std::byte* span, bool xor_values) {
  size_t w = c.header.elem_size;
  if (c.header.encoding == ChunkEncoding::kDense) {
    size_t bytes = c.values.size();
    if (xor_values) {
      ApplyDenseXor(span, c.values.data(), bytes);
    } else {
      std::memcpy(span, c.values.data(), bytes);
    }
    return;
  }
  switch (w) {
    case 1:
      ApplySparse<uint8_t>(c, span, xor_values);
      break;
    case 2:
      ApplySparse<uint16_t>(c, span, xor_values);
      break;
    case 4:
      ApplySparse<uint32_t>(c, span, xor_values);
      break;
    default:
      ApplySparse<uint64_t>(c, span, xor_values);
      break;
  }
}

}  // namespace

Status ApplyChunk(const DecodedChunk& chunk, std::span<std::byte> span,
                  std::vector<std::byte>* undo) {
  DCR_RETURN_IF_ERROR(CheckSpan(chunk, span.size()));
  if (undo != nullptr) SaveOld(chunk, span, undo);
  Write(chunk, span.data(), chunk.header.kind == ChunkKind::kXor);
  return Status::OK();
}

Status UndoChunk(const DecodedChunk& chunk, std::span<const std::byte> undo,
                 std::span<std::byte> span) {
  DCR_RETURN_IF_ERROR(CheckSpan(chunk, span.size()));
  if (chunk.header.kind == ChunkKind::kXor) {
    Write(chunk, span.data(), /*xor_values=*/true);
    return Status::OK();
  }
  size_t w = chunk.header.elem_size;
  if (chunk.header.encoding == ChunkEncoding::kDense) {
    if (undo.size() != span.size()) {
      return Status::InvalidArgument("undo record does not match the chunk");
    }
    std::memcpy(span.data(), undo.data(), span.size());
    return Status::OK();
  }
  if (undo.size() != chunk.positions.size() * w) {
    return Status::InvalidArgument("undo record does not match the chunk");
  }
  for (size_t i = 0; i < chunk.positions.size(); ++i) {
    std::memcpy(span.data() + static_cast<size_t>(chunk.positions[i]) * w,
                undo.data() + i * w, w);
  }
  return Status::OK();
}

}  // namespace dcr
