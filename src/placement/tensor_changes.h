// What the shard diff (shard_diff.cc) and the projection of a shard
// memory's changes (shard_project.cc) share: one canonical tensor's
// changes collected from a rank's pieces, converted and ordered, and the
// walk over the tensors a rank holds. Internal to the placement module.
//
// Thread safety: a TensorChanges is used by one thread.
#ifndef DCR_PLACEMENT_TENSOR_CHANGES_H_
#define DCR_PLACEMENT_TENSOR_CHANGES_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <utility>
#include <vector>

#include "dcr/shard_diff.h"

namespace dcr::shard_runs {

// One element's bits: a fixed-size copy the compiler inlines (a memcpy of
// a runtime size is a call, most of the per-change cost).
inline void CopyElement(std::byte* to, const std::byte* from, size_t w) {
  switch (w) {
    case 1:
      *to = *from;
      return;
    case 2:
      std::memcpy(to, from, 2);
      return;
    case 4:
      std::memcpy(to, from, 4);
      return;
    case 8:
      std::memcpy(to, from, 8);
      return;
    default:
      std::memcpy(to, from, w);
  }
}

// One canonical tensor's changes as a rank's pieces find them: each
// changed shard element converted to canonical bits (an element whose
// canonical bits did not change is dropped), then ordered by canonical
// position. What DiffShardsEach and ProjectShardChanges share.
class TensorChanges {
 public:
  // `spare`: another tensor's changes, done with, whose buffers it reuses
  // (not their contents). A diff's tensors reuse one set: growing a fresh
  // one for each tensor cost more than the scan (page faults and copies).
  TensorChanges(const LayoutTensor& tensor, size_t index,
                CanonicalChanges spare = {})
      : tensor_(tensor),
        cw_(DTypeSize(tensor.dtype)),
        identity_(tensor.conversion.identity(tensor.dtype)),
        ch_(std::move(spare)) {
    ch_.tensor = index;
    ch_.positions.clear();
    ch_.base.clear();
    ch_.target.clear();
  }
  // Room for `k` more.
  void Reserve(size_t k) {
    if (n_ + k <= ch_.positions.size()) return;
    size_t m = std::max(n_ + k, ch_.positions.size() * 3 / 2);
    // Within the buffers' room where the need fits there: no copy.
    const size_t room =
        std::min(ch_.positions.capacity(),
                 std::min(ch_.base.capacity(), ch_.target.capacity()) / cw_);
    if (m > room && n_ + k <= room) m = room;
    ch_.positions.resize(m);
    ch_.base.resize(m * cw_);
    ch_.target.resize(m * cw_);
  }
  // Canonical element `c` held the shard bits at `ob` and now those at
  // `ot` (which differ). Reserve first.
  void Add(uint64_t c, const std::byte* ob, const std::byte* ot) {
    std::byte cb[8], ct[8];
    if (!identity_) {
      ConvertElement(tensor_.conversion, tensor_.dtype, ob, cb);
      ConvertElement(tensor_.conversion, tensor_.dtype, ot, ct);
      if (std::memcmp(cb, ct, cw_) == 0) return;
      ob = cb, ot = ct;
    }
    if (n_ > 0 && c < ch_.positions[n_ - 1]) {
      sorted_ = false;  // runs ascend; pieces may not
    }
    ch_.positions[n_] = c;
    CopyElement(&ch_.base[n_ * cw_], ob, cw_);
    CopyElement(&ch_.target[n_ * cw_], ot, cw_);
    ++n_;
  }
  size_t size() const { return n_; }
  // Its buffers, for the next tensor's (what it holds is dropped).
  CanonicalChanges Release() { return std::move(ch_); }
  CanonicalChanges Finish() {
    ch_.positions.resize(n_);
    ch_.base.resize(n_ * cw_);
    ch_.target.resize(n_ * cw_);
    if (sorted_) return std::move(ch_);
    // A transposed piece, or several pieces of this rank that interleave
    // (a row split's columns): order by canonical position.
    std::vector<size_t> order(n_);
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      return ch_.positions[x] < ch_.positions[y];
    });
    CanonicalChanges s;
    s.tensor = ch_.tensor;
    s.positions.reserve(n_);
    s.base.resize(ch_.base.size());
    s.target.resize(ch_.target.size());
    for (size_t k = 0; k < n_; ++k) {
      s.positions.push_back(ch_.positions[order[k]]);
      std::memcpy(&s.base[k * cw_], &ch_.base[order[k] * cw_], cw_);
      std::memcpy(&s.target[k * cw_], &ch_.target[order[k] * cw_], cw_);
    }
    return s;
  }

 private:
  const LayoutTensor& tensor_;
  const size_t cw_;
  const bool identity_;
  CanonicalChanges ch_;
  size_t n_ = 0;
  bool sorted_ = true;
};

// For each canonical tensor the rank holds, in order: scan(piece, tensor,
// &changes) for each of its pieces of the rank, then `each` with the
// tensor's changes (if any), then done(tensor index).
template <typename ScanPiece, typename Done>
Status EachTensorsChanges(const Layout& layout, uint32_t rank, ScanPiece scan,
                          Done done,
                          const std::function<Status(CanonicalChanges&&)>& each,
                          ShardDiffStats* st) {
  CanonicalChanges spare;  // the last tensor's buffers
  for (size_t ti = 0; ti < layout.tensors.size(); ++ti) {
    const LayoutTensor& tensor = layout.tensors[ti];
    TensorChanges changes(tensor, ti, std::move(spare));
    for (const AffinePiece& p : tensor.pieces) {
      if (p.rank != rank) continue;
      DCR_RETURN_IF_ERROR(scan(p, tensor, &changes));
    }
    done(ti);
    if (changes.size() == 0) {
      spare = changes.Release();
      continue;
    }
    st->changed += changes.size();
    CanonicalChanges found = changes.Finish();
    DCR_RETURN_IF_ERROR(each(std::move(found)));
    // Reused unless `each` took them (a moved-from vector is empty).
    spare = std::move(found);
  }
  return Status::OK();
}

}  // namespace dcr::shard_runs

#endif  // DCR_PLACEMENT_TENSOR_CHANGES_H_
