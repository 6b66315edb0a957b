#include "codec/planes.h"

#include <htscodecs/rANS_static4x16.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/bytes.h"

namespace dcr {

size_t Order0Bytes(const uint8_t* data, size_t n) {
  uint32_t hist[256] = {};
  for (size_t i = 0; i < n; ++i) ++hist[data[i]];
  double bits = 0;
  for (uint32_t c : hist) {
    if (c != 0) bits -= c * std::log2(static_cast<double>(c) / n);
  }
  return static_cast<size_t>(bits / 8);
}

// ---------------------------------------------------------------- coder

namespace {
// Below this many bytes a rANS plane's table is a large share of it.
constexpr size_t kSmallPlane = 16384;
}  // namespace

Result<std::unique_ptr<PlaneCoder>> PlaneCoder::Create(int zstd_level,
                                                       bool compress) {
  std::unique_ptr<PlaneCoder> c(new PlaneCoder());
  c->compress_ = compress;
  c->cctx_.reset(ZSTD_createCCtx());
  if (!c->cctx_) return Status::ResourceExhausted("cannot create zstd context");
  ZSTD_CCtx_setParameter(c->cctx_.get(), ZSTD_c_compressionLevel, zstd_level);
  ZSTD_CCtx_setParameter(c->cctx_.get(), ZSTD_c_checksumFlag, 0);
  if (deflateInit2(&c->zs_, Z_BEST_SPEED, Z_DEFLATED, -15, 9, Z_HUFFMAN_ONLY) !=
      Z_OK) {
    return Status::ResourceExhausted("cannot create zlib context");
  }
  c->zs_live_ = true;
  return c;
}

PlaneCoder::~PlaneCoder() {
  if (zs_live_) deflateEnd(&zs_);
}

Result<size_t> PlaneCoder::Zstd(const uint8_t* data, size_t n) {
  size_t bound = ZSTD_compressBound(n);
  uint8_t* dst = Reserve(&compressed_, bound);
  size_t r = ZSTD_compress2(cctx_.get(), dst, bound, data, n);
  if (ZSTD_isError(r)) {
    return Status::Internal(std::string("zstd compression failed: ") +
                            ZSTD_getErrorName(r));
  }
  return r;
}

// Huffman-codes n bytes; returns the size, or SIZE_MAX if it does not fit
// in n bytes.
size_t PlaneCoder::Huffman(const uint8_t* data, size_t n) {
  uint8_t* dst = Reserve(&huffman_, n);
  deflateReset(&zs_);
  zs_.next_in = const_cast<uint8_t*>(data);
  zs_.avail_in = static_cast<uInt>(n);
  zs_.next_out = dst;
  zs_.avail_out = static_cast<uInt>(n);
  if (deflate(&zs_, Z_FINISH) != Z_STREAM_END) return SIZE_MAX;
  return zs_.total_out;
}

Status PlaneCoder::Put(const uint8_t* data, size_t n,
                       std::vector<std::byte>* out, size_t entry_at,
                       bool rans) {
  PlaneEncoding enc = PlaneEncoding::kRaw;
  const uint8_t* src = data;
  size_t len = n;
  auto keep = [&](PlaneEncoding e, const uint8_t* s, size_t l) {
    if (l < len) {
      enc = e;
      src = s;
      len = l;
    }
  };
  // Without compression every plane is stored as it is (kRaw).
  if (compress_ && n > 0 &&
      std::all_of(data, data + n, [&](uint8_t b) { return b == data[0]; })) {
    enc = PlaneEncoding::kConstant;
    len = 1;
  } else if (compress_ && rans) {
    unsigned int bound = rans_compress_bound_4x16(static_cast<unsigned>(n), 0);
    uint8_t* dst = Reserve(&rans_, bound);
    unsigned int got = bound;
    if (rans_compress_to_4x16(const_cast<uint8_t*>(data),
                              static_cast<unsigned>(n), dst, &got,
                              0) != nullptr) {
      keep(PlaneEncoding::kRans, dst, got);
    }
    // rANS stores a frequency table of up to ~2 bytes per symbol: a small
    // plane may be smaller as Huffman (whose code lengths are coded
    // compactly) or zstd (runs).
    if (n < kSmallPlane) {
      const size_t h = Huffman(data, n);
      keep(PlaneEncoding::kHuffman, huffman_.data(), h);
      DCR_ASSIGN_OR_RETURN(size_t z, Zstd(data, n));
      keep(PlaneEncoding::kZstd, compressed_.data(), z);
    }
  } else if (compress_ && n >= 16) {
    // Order of trials, from the order-0 entropy H of the plane: Huffman
    // costs at least one bit per byte and lands within a few percent of
    // H, so where H >= 1 bit it goes first and zstd is tried only if
    // Huffman leaves room (runs that H cannot see); where H < 1 bit
    // (long runs, e.g. the mostly-zero high bytes of XOR masks) only
    // zstd can get close.
    const size_t order0 = Order0Bytes(data, n);
    if (order0 >= n / 8) {
      const size_t h = Huffman(data, n);
      keep(PlaneEncoding::kHuffman, huffman_.data(), h);
    }
    if (len > order0 + order0 / 16 + 64) {
      DCR_ASSIGN_OR_RETURN(size_t z, Zstd(data, n));
      keep(PlaneEncoding::kZstd, compressed_.data(), z);
    }
  }
  std::byte* entry = out->data() + entry_at;
  entry[0] = static_cast<std::byte>(enc);
  StoreLE<uint32_t>(entry + 1, static_cast<uint32_t>(len));
  const std::byte* s = reinterpret_cast<const std::byte*>(src);
  out->insert(out->end(), s, s + len);
  return Status::OK();
}

// ---------------------------------------------------------------- decoder

Result<std::unique_ptr<PlaneDecoder>> PlaneDecoder::Create() {
  std::unique_ptr<PlaneDecoder> d(new PlaneDecoder());
  d->dctx_.reset(ZSTD_createDCtx());
  if (!d->dctx_) return Status::ResourceExhausted("cannot create zstd context");
  if (inflateInit2(&d->zs_, -15) != Z_OK) {
    return Status::ResourceExhausted("cannot create zlib context");
  }
  d->zs_live_ = true;
  return d;
}

PlaneDecoder::~PlaneDecoder() {
  if (zs_live_) inflateEnd(&zs_);
}

Result<const uint8_t*> PlaneDecoder::Get(const std::byte* entry,
                                         const std::byte* data, size_t count,
                                         size_t slot, const std::string& what,
                                         bool rans) {
  auto enc = static_cast<PlaneEncoding>(entry[0]);
  uint32_t len = LoadLE<uint32_t>(entry + 1);
  if (scratch_.size() <= slot) scratch_.resize(slot + 1);
  switch (enc) {
    case PlaneEncoding::kRaw:
      if (len != count) {
        return Status::Corruption(what + ": raw plane of wrong length");
      }
      return reinterpret_cast<const uint8_t*>(data);
    case PlaneEncoding::kConstant: {
      if (len != 1) {
        return Status::Corruption(what + ": constant plane of wrong length");
      }
      uint8_t* dst = Reserve(&scratch_[slot], count);
      std::memset(dst, static_cast<uint8_t>(*data), count);
      return dst;
    }
    case PlaneEncoding::kZstd: {
      uint8_t* dst = Reserve(&scratch_[slot], count);
      // The destination is exactly `count` bytes: a frame that would
      // expand further (a zstd bomb) fails here instead of allocating.
      // Exactly one frame, spanning the whole plane.
      if (ZSTD_findFrameCompressedSize(data, len) != len) {
        return Status::Corruption(what + " is not exactly one zstd frame");
      }
      size_t r = ZSTD_decompressDCtx(dctx_.get(), dst, count, data, len);
      if (ZSTD_isError(r) || r != count) {
        return Status::Corruption(
            what + " does not decompress to " + std::to_string(count) +
            " bytes" +
            (ZSTD_isError(r) ? std::string(" (") + ZSTD_getErrorName(r) + ")"
                             : std::string()));
      }
      return dst;
    }
    case PlaneEncoding::kHuffman: {
      uint8_t* dst = Reserve(&scratch_[slot], count);
      inflateReset(&zs_);
      zs_.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(data));
      zs_.avail_in = len;
      zs_.next_out = dst;
      zs_.avail_out = static_cast<uInt>(count);
      // Output is capped at `count` bytes; the stream must end exactly
      // there and consume all its input.
      int r = inflate(&zs_, Z_FINISH);
      if (r != Z_STREAM_END || zs_.total_out != count || zs_.avail_in != 0) {
        return Status::Corruption(what + " does not decompress to " +
                                  std::to_string(count) + " bytes");
      }
      return dst;
    }
    case PlaneEncoding::kRans: {
      if (!rans) break;
      uint8_t* dst = Reserve(&scratch_[slot], std::max<size_t>(count, 1));
      // Output is capped at `count` bytes and must be exactly that.
      unsigned int got = static_cast<unsigned>(count);
      if (len == 0 ||
          rans_uncompress_to_4x16(
              reinterpret_cast<unsigned char*>(const_cast<std::byte*>(data)),
              len, dst, &got) == nullptr ||
          got != count) {
        return Status::Corruption(what + " does not decompress to " +
                                  std::to_string(count) + " bytes");
      }
      return dst;
    }
  }
  return Status::Corruption(what + ": bad plane encoding");
}

}  // namespace dcr
