// Value planes: how one byte plane of a chunk is stored (raw, constant,
// zstd or Huffman-only deflate) and read back. Shared by every chunk
// encoding (docs/FORMAT.md §planes).
//
// Thread safety: a PlaneCoder or PlaneDecoder holds a compression context
// and scratch buffers; use one per thread.
#ifndef DCR_CODEC_PLANES_H_
#define DCR_CODEC_PLANES_H_

#include <zlib.h>
#include <zstd.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/scratch.h"
#include "dcr/status.h"

namespace dcr {

// Values are part of the chunk format: append only.
enum class PlaneEncoding : uint8_t {
  kRaw = 0,
  kZstd = 1,
  kConstant = 2,
  kHuffman = 3,  // raw deflate stream (no zlib header), Huffman-only blocks
  // htscodecs' order-0 rANS (rans_compress_to_4x16, order byte 0); only in
  // context-coded chunks (version 2).
  kRans = 4,
};

// A plane's entry in a chunk's table: u8 encoding, u32 stored bytes.
inline constexpr size_t kPlaneEntryBytes = 5;

// The order-0 entropy of n bytes, in bytes.
size_t Order0Bytes(const uint8_t* data, size_t n);

class PlaneCoder {
 public:
  static Result<std::unique_ptr<PlaneCoder>> Create(int zstd_level,
                                                    bool compress);
  ~PlaneCoder();
  PlaneCoder(const PlaneCoder&) = delete;
  PlaneCoder& operator=(const PlaneCoder&) = delete;

  // Appends one plane (n bytes) to `out` in its smallest encoding and
  // writes its table entry at out->data() + entry_at. `rans`: code it with
  // rANS (or constant, or raw where that is smaller) instead of trying
  // Huffman and zstd (version 2 chunks only).
  Status Put(const uint8_t* data, size_t n, std::vector<std::byte>* out,
             size_t entry_at, bool rans = false);

 private:
  PlaneCoder() = default;
  Result<size_t> Zstd(const uint8_t* data, size_t n);
  size_t Huffman(const uint8_t* data, size_t n);

  bool compress_ = true;
  struct CCtxDeleter {
    void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
  };
  std::unique_ptr<ZSTD_CCtx, CCtxDeleter> cctx_;
  z_stream zs_{};
  bool zs_live_ = false;
  ScratchVector<uint8_t> huffman_;
  ScratchVector<uint8_t> compressed_;
  ScratchVector<uint8_t> rans_;
};

class PlaneDecoder {
 public:
  static Result<std::unique_ptr<PlaneDecoder>> Create();
  ~PlaneDecoder();
  PlaneDecoder(const PlaneDecoder&) = delete;
  PlaneDecoder& operator=(const PlaneDecoder&) = delete;

  // Decodes plane `slot` (its table entry at `entry`, its stored bytes at
  // `data`) to exactly `count` bytes. The result points into `data` (raw
  // planes) or into scratch of `slot`, valid until that slot is decoded
  // again. `what` names the plane in errors.
  // kRans planes are accepted only with `rans` (version 2 chunks).
  Result<const uint8_t*> Get(const std::byte* entry, const std::byte* data,
                             size_t count, size_t slot, const std::string& what,
                             bool rans = false);

 private:
  PlaneDecoder() = default;
  struct DCtxDeleter {
    void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
  };
  std::unique_ptr<ZSTD_DCtx, DCtxDeleter> dctx_;
  z_stream zs_{};
  bool zs_live_ = false;
  std::vector<ScratchVector<uint8_t>> scratch_;
};

}  // namespace dcr

#endif  // DCR_CODEC_PLANES_H_
