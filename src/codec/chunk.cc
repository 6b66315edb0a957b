// Chunk encoding and decoding (applying: chunk_apply.cc). The byte layout is
// documented in docs/FORMAT.md §chunk; in short (little-endian):
//
//   0  u32 magic "DCRC"      4 u8 version   5 u8 kind   6 u8 encoding
//   7  u8  elem_size          8 u32 total_bytes (whole chunk)
//   12 u32 tensor            16 u32 span     20 u32 span_elems
//   24 u32 changed           28 u8 rice_k   29 u8 planes   30 u16 part
//   32 u32 positions_bytes   36 planes x {u8 plane encoding, u32 bytes}
//   ... positions (Rice)  ... planes  ... u64 XXH3-64 of all bytes before it
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>

#include "codec/bit_io.h"
#include "codec/chunk_layout.h"
#include "codec/context.h"
#include "codec/diff.h"
#include "codec/planes.h"
#include "common/bytes.h"
#include "common/scratch.h"
#include "dcr/codec.h"
#include "dcr/digest.h"

namespace dcr {
namespace {

constexpr uint8_t kChunkVersion = 1;
constexpr size_t kFixedHeaderBytes = 36;

size_t HeaderBytes(size_t planes) {
  return kFixedHeaderBytes + planes * kPlaneEntryBytes;
}

Status WholeSpanOnly(const ChunkId& id) {
  if (id.part == 0) return Status::OK();
  return Status::InvalidArgument(
      ChunkName(id) +
      ": a part carries its own positions; encode it with EncodeChanges");
}

}  // namespace

std::string ChunkIdText(const ChunkId& id) {
  std::string s = "tensor " + std::to_string(id.tensor) + ", span " +
                  std::to_string(id.span);
  if (id.part != 0) s += ", part " + std::to_string(id.part);
  return s;
}

// ---------------------------------------------------------------- encoder

struct ChunkEncoder::Impl {
  EncodeOptions options;
  std::unique_ptr<PlaneCoder> plane_coder;
  ContextEncoder context;
  ScratchVector<uint32_t> positions;
  std::array<ScratchVector<uint8_t>, 8> planes;
  std::vector<std::byte> alt;  // the other candidate encoding

  // Writes a whole chunk: header, positions (sparse only), planes of
  // `count` bytes each, checksum. Appends to `out`.
  // Appends a whole chunk or, on error, nothing.
  Status Write(ChunkKind kind, ChunkEncoding encoding, const ChunkId& id,
               size_t w, uint32_t span_elems, std::span<const uint32_t> pos,
               size_t count, std::vector<std::byte>* out, ChunkSizes* sizes) {
    size_t start = out->size();
    Status s =
        WriteBody(kind, encoding, id, w, span_elems, pos, count, out, sizes);
    if (!s.ok()) out->resize(start);
    return s;
  }

  Status WriteBody(ChunkKind kind, ChunkEncoding encoding, const ChunkId& id,
                   size_t w, uint32_t span_elems, std::span<const uint32_t> pos,
                   size_t count, std::vector<std::byte>* out,
                   ChunkSizes* sizes) {
    size_t start = out->size();
    size_t header = HeaderBytes(w);
    out->resize(start + header, std::byte{0});
    uint32_t k = encoding == ChunkEncoding::kSparse ? ChooseRiceK(pos) : 0;
    size_t pos_bytes =
        encoding == ChunkEncoding::kSparse ? RiceEncode(pos, k, out) : 0;
    size_t values_start = out->size();
    for (size_t j = 0; j < w; ++j) {
      DCR_RETURN_IF_ERROR(
          plane_coder->Put(planes[j].data(), count, out,
                           start + kFixedHeaderBytes + j * kPlaneEntryBytes));
    }
    size_t values_bytes = out->size() - values_start;
    size_t total = out->size() - start + kChecksumBytes;
    if (total > UINT32_MAX) {
      return Status::ResourceExhausted(
          ChunkName(id) + " would exceed 4 GiB; use smaller spans");
    }
    std::byte* h = out->data() + start;
    h[28] = static_cast<std::byte>(k);
    h[29] = static_cast<std::byte>(w);
    StoreLE<uint16_t>(h + 30, id.part);
    StoreLE<uint32_t>(h + 32, static_cast<uint32_t>(pos_bytes));
    const uint32_t changed = encoding == ChunkEncoding::kSparse
                                 ? static_cast<uint32_t>(pos.size())
                                 : span_elems;
    SealChunk({kChunkVersion, kind, encoding, w, id, span_elems, changed},
              start, out);
    if (sizes != nullptr) {
      ChunkSizes s;
      s.header = header + kChecksumBytes;
      s.positions = pos_bytes;
      s.values = values_bytes;
      s.changed = encoding == ChunkEncoding::kSparse ? pos.size() : count;
      *sizes += s;
    }
    return Status::OK();
  }

  Status WriteDense(ChunkKind kind, const ChunkId& id, size_t w,
                    std::span<const std::byte> a, const std::byte* b,
                    std::vector<std::byte>* out, ChunkSizes* sizes) {
    size_t n = a.size() / w;
    uint8_t* ptrs[8];
    for (size_t j = 0; j < w; ++j) ptrs[j] = Reserve(&planes[j], n);
    SplitPlanes(w, a.data(), b, n, ptrs);
    return Write(kind, ChunkEncoding::kDense, id, w, static_cast<uint32_t>(n),
                 {}, n, out, sizes);
  }
};

ChunkEncoder::ChunkEncoder(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
ChunkEncoder::~ChunkEncoder() = default;

Result<std::unique_ptr<ChunkEncoder>> ChunkEncoder::Create(
    EncodeOptions options) {
  if (options.zstd_level < 1 || options.zstd_level > ZSTD_maxCLevel()) {
    return Status::InvalidArgument("zstd level must be between 1 and " +
                                   std::to_string(ZSTD_maxCLevel()) + ", got " +
                                   std::to_string(options.zstd_level));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  DCR_ASSIGN_OR_RETURN(impl->plane_coder, PlaneCoder::Create(options.zstd_level,
                                                             options.compress));
  return std::unique_ptr<ChunkEncoder>(new ChunkEncoder(std::move(impl)));
}

static Status CheckSpanArgs(const ChunkId& id, size_t w, size_t bytes) {
  if (!ValidElemSize(w)) {
    return Status::InvalidArgument("element size must be 1, 2, 4 or 8, got " +
                                   std::to_string(w));
  }
  if (bytes % w != 0 || bytes / w > kMaxSpanElems || bytes == 0) {
    return Status::InvalidArgument(ChunkName(id) + ": span of " +
                                   std::to_string(bytes) +
                                   " bytes is empty, ragged or too long");
  }
  return Status::OK();
}

Result<bool> ChunkEncoder::EncodeDiff(ChunkKind kind, ChunkId id,
                                      size_t elem_size,
                                      std::span<const std::byte> base,
                                      std::span<const std::byte> target,
                                      std::vector<std::byte>* out,
                                      ChunkSizes* sizes) {
  return EncodeDiffInContext(kind, id, elem_size, ExponentField(), base, target,
                             out, sizes, nullptr);
}

Result<bool> ChunkEncoder::EncodeDiffInContext(
    ChunkKind kind, ChunkId id, size_t elem_size, ExponentField field,
    std::span<const std::byte> base, std::span<const std::byte> target,
    std::vector<std::byte>* out, ChunkSizes* sizes,
    std::vector<std::byte>* base_independent) {
  DCR_RETURN_IF_ERROR(CheckSpanArgs(id, elem_size, target.size()));
  DCR_RETURN_IF_ERROR(WholeSpanOnly(id));
  if (kind != ChunkKind::kXor && kind != ChunkKind::kOverwrite) {
    return Status::InvalidArgument(ChunkName(id) + ": unknown chunk kind");
  }
  if (base.size() != target.size()) {
    return Status::InvalidArgument(ChunkName(id) +
                                   ": base and target spans differ in size");
  }
  Impl& m = *impl_;
  size_t n = target.size() / elem_size;
  uint32_t* pos = Reserve(&m.positions, n);
  uint8_t* ptrs[8];
  for (size_t j = 0; j < elem_size; ++j) ptrs[j] = Reserve(&m.planes[j], n);
  bool xor_values = kind == ChunkKind::kXor;
  size_t changed = FindChanges(elem_size, base.data(), target.data(), n,
                               xor_values, pos, ptrs);
  if (changed == 0) return false;
  std::span<const uint32_t> positions(pos, changed);
  const bool sparse =
      static_cast<double>(changed) < m.options.dense_threshold * n;
  if (sparse && m.options.compress && !field.empty()) {
    ContextEncoder::Changes ch{kind, id,        elem_size, field,
                               base, positions, ptrs};
    DCR_ASSIGN_OR_RETURN(bool coded,
                         m.context.Encode(ch, m.options.context_gain,
                                          m.plane_coder.get(), out, sizes));
    if (coded) {
      if (base_independent != nullptr) {
        DCR_RETURN_IF_ERROR(m.Write(kind, ChunkEncoding::kSparse, id, elem_size,
                                    static_cast<uint32_t>(n), positions,
                                    changed, base_independent, nullptr));
      }
      return true;
    }
  }
  if (sparse) {
    DCR_RETURN_IF_ERROR(m.Write(kind, ChunkEncoding::kSparse, id, elem_size,
                                static_cast<uint32_t>(n), positions, changed,
                                out, sizes));
    return true;
  }
  // Dense enough that a dense chunk may be smaller: build both, keep the
  // smaller. The sparse one goes to `alt` first since the dense encoding
  // reuses the plane buffers.
  m.alt.clear();
  ChunkSizes sparse_sizes;
  DCR_RETURN_IF_ERROR(m.Write(kind, ChunkEncoding::kSparse, id, elem_size,
                              static_cast<uint32_t>(n), positions, changed,
                              &m.alt, &sparse_sizes));
  size_t before = out->size();
  ChunkSizes dense_sizes;
  DCR_RETURN_IF_ERROR(m.WriteDense(kind, id, elem_size, target,
                                   xor_values ? base.data() : nullptr, out,
                                   &dense_sizes));
  if (out->size() - before > m.alt.size()) {
    out->resize(before);
    out->insert(out->end(), m.alt.begin(), m.alt.end());
    if (sizes != nullptr) *sizes += sparse_sizes;
  } else if (sizes != nullptr) {
    dense_sizes.changed = changed;
    *sizes += dense_sizes;
  }
  return true;
}

Status ChunkEncoder::EncodeFull(ChunkId id, size_t elem_size,
                                std::span<const std::byte> target,
                                std::vector<std::byte>* out,
                                ChunkSizes* sizes) {
  DCR_RETURN_IF_ERROR(CheckSpanArgs(id, elem_size, target.size()));
  DCR_RETURN_IF_ERROR(WholeSpanOnly(id));
  return impl_->WriteDense(ChunkKind::kOverwrite, id, elem_size, target,
                           nullptr, out, sizes);
}

Status ChunkEncoder::EncodeChanges(ChunkKind kind, ChunkId id, size_t elem_size,
                                   uint32_t span_elems,
                                   std::span<const uint32_t> positions,
                                   std::span<const std::byte> values,
                                   std::vector<std::byte>* out,
                                   ChunkSizes* sizes) {
  DCR_RETURN_IF_ERROR(CheckSpanArgs(
      id, elem_size, static_cast<size_t>(span_elems) * elem_size));
  if (kind != ChunkKind::kXor && kind != ChunkKind::kOverwrite) {
    return Status::InvalidArgument(ChunkName(id) + ": unknown chunk kind");
  }
  if (values.size() != positions.size() * elem_size) {
    return Status::InvalidArgument(ChunkName(id) +
                                   ": values do not match positions");
  }
  for (size_t i = 0; i < positions.size(); ++i) {
    if (positions[i] >= span_elems ||
        (i > 0 && positions[i] <= positions[i - 1])) {
      return Status::InvalidArgument(
          ChunkName(id) + ": positions must be ascending and inside the span");
    }
  }
  if (positions.empty()) {
    return Status::InvalidArgument(ChunkName(id) + ": no positions");
  }
  Impl& m = *impl_;
  size_t k = positions.size();
  for (size_t j = 0; j < elem_size; ++j) {
    uint8_t* p = Reserve(&m.planes[j], k);
    for (size_t i = 0; i < k; ++i) {
      p[i] = static_cast<uint8_t>(values[i * elem_size + j]);
    }
  }
  return m.Write(kind, ChunkEncoding::kSparse, id, elem_size, span_elems,
                 positions, k, out, sizes);
}

Status ChunkEncoder::EncodeChangesInContext(
    ChunkKind kind, ChunkId id, size_t elem_size, ExponentField field,
    std::span<const std::byte> base, std::span<const uint32_t> positions,
    std::span<const std::byte> values, std::vector<std::byte>* out,
    ChunkSizes* sizes, std::vector<std::byte>* base_independent) {
  DCR_RETURN_IF_ERROR(WholeSpanOnly(id));
  DCR_RETURN_IF_ERROR(CheckSpanArgs(id, elem_size, base.size()));
  const auto n = static_cast<uint32_t>(base.size() / elem_size);
  Impl& m = *impl_;
  // EncodeChanges checks the positions and values, and fills the planes
  // the context encoder reads: the base-independent chunk first, kept only
  // where the context-coded one is not (or `base_independent` wants it).
  std::vector<std::byte>& plain =
      base_independent != nullptr ? *base_independent : m.alt;
  if (base_independent == nullptr) plain.clear();
  const size_t plain_start = plain.size();
  ChunkSizes plain_sizes;
  DCR_RETURN_IF_ERROR(EncodeChanges(kind, id, elem_size, n, positions, values,
                                    &plain, &plain_sizes));
  const bool sparse =
      static_cast<double>(positions.size()) < m.options.dense_threshold * n;
  if (sparse && m.options.compress && !field.empty()) {
    uint8_t* ptrs[8];
    for (size_t j = 0; j < elem_size; ++j) ptrs[j] = m.planes[j].data();
    ContextEncoder::Changes ch{kind, id,        elem_size, field,
                               base, positions, ptrs};
    Result<bool> coded = m.context.Encode(ch, m.options.context_gain,
                                          m.plane_coder.get(), out, sizes);
    if (!coded.ok()) {
      plain.resize(plain_start);  // nothing appended on an error
      return coded.status();
    }
    if (*coded) return Status::OK();
  }
  out->insert(out->end(), plain.begin() + static_cast<ptrdiff_t>(plain_start),
              plain.end());
  if (sizes != nullptr) *sizes += plain_sizes;
  if (base_independent != nullptr) plain.resize(plain_start);
  return Status::OK();
}

// ---------------------------------------------------------------- decoder

Result<ChunkHeader> PeekChunkHeader(std::span<const std::byte> bytes) {
  if (bytes.size() < kChunkPrefixBytes) {
    return Status::Corruption(
        "chunk header truncated: " + std::to_string(bytes.size()) + " bytes");
  }
  const std::byte* h = bytes.data();
  if (LoadLE<uint32_t>(h) != kChunkMagic) {
    return Status::Corruption("bad chunk magic");
  }
  const uint8_t version = static_cast<uint8_t>(h[4]);
  if (version != kChunkVersion && version != kContextChunkVersion) {
    return Status::Unsupported("chunk format version " +
                               std::to_string(static_cast<int>(version)) +
                               " (this build reads versions 1 and 2)");
  }
  ChunkHeader c;
  uint8_t kind = static_cast<uint8_t>(h[5]);
  uint8_t enc = static_cast<uint8_t>(h[6]);
  c.elem_size = static_cast<uint8_t>(h[7]);
  c.total_bytes = LoadLE<uint32_t>(h + 8);
  c.id.tensor = LoadLE<uint32_t>(h + 12);
  c.id.span = LoadLE<uint32_t>(h + 16);
  c.span_elems = LoadLE<uint32_t>(h + 20);
  c.changed = LoadLE<uint32_t>(h + 24);
  // Version 1's u16 at 30 is the part (reserved, 0, before parts); version
  // 2 (context) chunks are whole spans and use the byte for their ranges.
  if (version == kChunkVersion) c.id.part = LoadLE<uint16_t>(h + 30);
  std::string name = ChunkName(c.id);
  if (kind != 1 && kind != 2) return Status::Corruption(name + ": bad kind");
  // Version 1 has the base-independent encodings, version 2 the context.
  if (version == kChunkVersion ? (enc != 1 && enc != 2) : enc != 3) {
    return Status::Corruption(name + ": bad encoding");
  }
  c.kind = static_cast<ChunkKind>(kind);
  c.encoding = static_cast<ChunkEncoding>(enc);
  if (!ValidElemSize(c.elem_size)) {
    return Status::Corruption(name + ": bad element size");
  }
  if (c.span_elems == 0 || c.span_elems > kMaxSpanElems) {
    return Status::Corruption(name + ": span length out of range");
  }
  if (c.changed == 0 || c.changed > c.span_elems ||
      (c.encoding == ChunkEncoding::kDense && c.changed != c.span_elems)) {
    return Status::Corruption(name + ": changed count out of range");
  }
  if (c.encoding == ChunkEncoding::kDense && c.id.part != 0) {
    return Status::Corruption(name + ": a dense chunk is a whole span");
  }
  const size_t header = c.encoding == ChunkEncoding::kContext
                            ? kContextFixedBytes
                            : HeaderBytes(c.elem_size);
  if (c.total_bytes < header + kChecksumBytes) {
    return Status::Corruption(name + ": length shorter than its header");
  }
  if (c.encoding == ChunkEncoding::kContext) {
    c.context.shift = static_cast<uint8_t>(h[28]);
    c.context.bits = static_cast<uint8_t>(h[29]);
  }
  return c;
}

struct ChunkDecoder::Impl {
  std::unique_ptr<PlaneDecoder> planes;
};

ChunkDecoder::ChunkDecoder(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
ChunkDecoder::~ChunkDecoder() = default;

Result<std::unique_ptr<ChunkDecoder>> ChunkDecoder::Create() {
  auto impl = std::make_unique<Impl>();
  DCR_ASSIGN_OR_RETURN(impl->planes, PlaneDecoder::Create());
  return std::unique_ptr<ChunkDecoder>(new ChunkDecoder(std::move(impl)));
}

Status ChunkDecoder::Decode(std::span<const std::byte> bytes, DecodedChunk* out,
                            ChunkSizes* sizes,
                            std::span<const std::byte> base) {
  Status s = DecodeInto(bytes, out, sizes, base);
  if (!s.ok()) {
    // Leave nothing that looks like a chunk behind.
    out->header = ChunkHeader();
    out->positions.clear();
    out->values.clear();
  }
  return s;
}

Status ChunkDecoder::DecodeInto(std::span<const std::byte> bytes,
                                DecodedChunk* out, ChunkSizes* sizes,
                                std::span<const std::byte> base) {
  DCR_ASSIGN_OR_RETURN(ChunkHeader c, PeekChunkHeader(bytes));
  std::string name = ChunkName(c.id);
  if (bytes.size() != c.total_bytes) {
    return Status::Corruption(name + ": " + std::to_string(bytes.size()) +
                              " bytes where the header says " +
                              std::to_string(c.total_bytes));
  }
  const std::byte* h = bytes.data();
  size_t body = c.total_bytes - kChecksumBytes;
  if (Hash64(bytes.first(body)) != LoadLE<uint64_t>(h + body)) {
    return Status::Corruption(name + ": checksum mismatch");
  }
  if (c.encoding == ChunkEncoding::kContext) {
    return DecodeContextChunk(bytes, c, base, impl_->planes.get(), out, sizes);
  }
  size_t w = c.elem_size;
  uint32_t rice_k = static_cast<uint8_t>(h[28]);
  if (static_cast<uint8_t>(h[29]) != w) {
    return Status::Corruption(name + ": bad plane count");
  }
  uint32_t pos_bytes = LoadLE<uint32_t>(h + 32);
  size_t header = HeaderBytes(w);
  bool sparse = c.encoding == ChunkEncoding::kSparse;
  if (!sparse && (pos_bytes != 0 || rice_k != 0)) {
    return Status::Corruption(name + ": dense chunk with positions");
  }
  uint64_t payload = static_cast<uint64_t>(pos_bytes);
  for (size_t j = 0; j < w; ++j) {
    payload +=
        LoadLE<uint32_t>(h + kFixedHeaderBytes + j * kPlaneEntryBytes + 1);
  }
  if (header + payload != body) {
    return Status::Corruption(name + ": section sizes do not add up");
  }
  Impl& m = *impl_;
  out->header = c;
  size_t count = c.changed;
  if (sparse) {
    // The checksum trailer guarantees 8 readable bytes after the section.
    DCR_RETURN_IF_ERROR(RiceDecode(bytes.subspan(header, pos_bytes), rice_k,
                                   c.changed, c.span_elems, &out->positions)
                            .WithContext(name));
  } else {
    out->positions.clear();
  }
  const std::byte* p = h + header + pos_bytes;
  const uint8_t* ptrs[8];
  for (size_t j = 0; j < w; ++j) {
    const std::byte* entry = h + kFixedHeaderBytes + j * kPlaneEntryBytes;
    DCR_ASSIGN_OR_RETURN(
        ptrs[j], m.planes->Get(entry, p, count, j,
                               name + ": value plane " + std::to_string(j)));
    p += LoadLE<uint32_t>(entry + 1);
  }
  out->values.resize(count * w);
  JoinPlanes(w, ptrs, count, out->values.data());
  if (sizes != nullptr) {
    ChunkSizes s;
    s.header = header + kChecksumBytes;
    s.positions = pos_bytes;
    s.values = payload - pos_bytes;
    s.changed = count;
    *sizes += s;
  }
  return Status::OK();
}

}  // namespace dcr
