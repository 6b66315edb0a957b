// Runs, checks and piece hashes shared by the shard diff and the shards
// built from canonical tensors (placement/shard_runs.h).
#include "placement/shard_runs.h"

#include <string>

namespace dcr::shard_runs {
namespace {

// Contiguous runs (ForEachRun's with step 1) of equal length at fixed
// strides in the shard and in the canonical tensor, hashed together by
// LinearHashRuns: a column split's rows cost a product each, not a power
// of K. Run (s, c) is read at data + (in_shard ? s : c) * width and lies
// at canonical byte c * cw.
class RunBatch {
 public:
  RunBatch(const std::byte* data, size_t width, bool in_shard, size_t cw)
      : data_(data), width_(width), in_shard_(in_shard), cw_(cw) {}

  void Add(uint64_t s, uint64_t c, uint64_t n, LinearDigest* sum) {
    if (count_ == 1 && n == n_ && s > s_ && c > c_) {
      s_stride_ = s - s_;
      c_stride_ = c - c_;
      count_ = 2;
      return;
    }
    if (count_ > 1 && n == n_ && s == s_ + count_ * s_stride_ &&
        c == c_ + count_ * c_stride_) {
      ++count_;
      return;
    }
    Flush(sum);
    s_ = s;
    c_ = c;
    n_ = n;
    count_ = 1;
    s_stride_ = c_stride_ = 0;
  }

  void Flush(LinearDigest* sum) {
    if (count_ == 0) return;
    const uint64_t at = in_shard_ ? s_ : c_;
    const uint64_t stride = in_shard_ ? s_stride_ : c_stride_;
    *sum ^= LinearHashRuns(c_ * cw_, c_stride_ * cw_, n_ * cw_, count_,
                           data_ + at * width_, stride * width_);
    count_ = 0;
  }

 private:
  const std::byte* data_;
  size_t width_;
  bool in_shard_;
  size_t cw_;
  uint64_t s_ = 0, c_ = 0, n_ = 0, count_ = 0, s_stride_ = 0, c_stride_ = 0;
};

}  // namespace

Status CheckRank(const Layout& layout, uint32_t rank) {
  if (rank >= layout.ranks()) {
    return Status::InvalidArgument(
        "rank " + std::to_string(rank) + " is not below layout " +
        layout.source + "'s " + std::to_string(layout.ranks()) + " ranks");
  }
  for (const LayoutTensor& t : layout.tensors) {
    if (t.fp8) {
      return Status::InvalidArgument(
          "layout " + layout.source + " serves tensor '" + t.name +
          "' as FP8: that is a serving layout; a trainer's ranks need one "
          "without fp8 entries");
    }
  }
  return Status::OK();
}

Status CheckCanonical(const LayoutTensor& tensor,
                      const CanonicalBytes& canonical,
                      CanonicalBytes::const_iterator it) {
  if (it == canonical.end()) {
    return Status::NotFound("the canonical checkpoint has no tensor '" +
                            tensor.name + "'");
  }
  const uint64_t want = Bytes(tensor.shape, tensor.dtype);
  if (it->second.size() != want) {
    return Status::InvalidArgument(
        "canonical tensor '" + tensor.name + "' has " +
        std::to_string(it->second.size()) + " bytes, but the layout gives it " +
        std::to_string(want) + " (" + std::string(DTypeName(tensor.dtype)) +
        ")");
  }
  return Status::OK();
}

Status CheckRebuildable(const LayoutTensor& tensor) {
  if (tensor.conversion.identity(tensor.dtype)) return Status::OK();
  return Status::InvalidArgument(
      "tensor '" + tensor.name +
      "' is converted from its shard (shard_dtype or add), so its shard "
      "cannot be built from canonical bits");
}

void HashPiece(const AffinePiece& p, const LayoutTensor& tensor,
               const std::byte* data, bool in_shard, LinearDigest* sum) {
  const size_t cw = DTypeSize(tensor.dtype);
  RunBatch batch(data, cw, in_shard, cw);
  ForEachRun(
      p, tensor.shape, [&](uint64_t s, uint64_t c, uint64_t n, uint64_t step) {
        if (step == 1) {
          batch.Add(s, c, n, sum);
          return;
        }
        batch.Flush(sum);
        for (uint64_t j = 0; j < n; ++j) {
          const uint64_t at = (c + j * step) * cw;
          *sum ^= LinearHash(at, {data + (in_shard ? (s + j) * cw : at), cw});
        }
      });
  batch.Flush(sum);
}

}  // namespace dcr::shard_runs
