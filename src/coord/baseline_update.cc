#include "coord/baseline_update.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "common/elapsed.h"
#include "common/failpoint.h"
#include "common/mutex.h"

namespace dcr {
namespace {

using Clock = std::chrono::steady_clock;

// A byte count the pool's workers add to.
class ByteTally {
 public:
  void Add(uint64_t n) DCR_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    total_ += n;
  }
  uint64_t total() const DCR_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return total_;
  }

 private:
  mutable Mutex mu_;
  uint64_t total_ DCR_GUARDED_BY(mu_) = 0;
};

}  // namespace

bool CommitReachedNoOne(const std::vector<NodeResult>& replies,
                        const std::set<std::string>& commit_set) {
  return std::none_of(replies.begin(), replies.end(), [&](const NodeResult& r) {
    return commit_set.count(r.node) && r.code == NodeCode::kOk;
  });
}

Status UpdateBaseline(const BaselineUpdate& u, const StoreSpec& spec,
                      std::shared_ptr<WeightStore>* baseline) {
  if (spec.path.empty()) {
    spdlog::warn("no root.baseline configured; the next delta refit needs one");
    return Status::OK();
  }
  const Checkpoint& target = *u.target;
  if (!*baseline) {
    DCR_ASSIGN_OR_RETURN(
        *baseline, CreateStore(spec, target.manifest(), target.metadata()));
    (*baseline)->DetachDataSync();
  }
  WeightStore& store = **baseline;
  const auto t0 = Clock::now();
  DCR_RETURN_IF_ERROR(store.BeginRefit(u.refit, u.base, u.to));
  const auto t_begun = Clock::now();
  // One pass per tensor, span by span: a span the refit changed (every
  // span of a full refit) is written from the target, then hashed from the
  // baseline while it is still in cache; an unchanged span is hashed as it
  // is. The digest is of the baseline's own bits, as a separate hash would
  // be, for one read of the memory instead of two; the writes go by
  // WriteTensor (pwrite on a disk filesystem, where rewriting a mapped
  // page faults).
  const Manifest& m = target.manifest();
  const std::vector<std::pair<uint32_t, uint32_t>>& ids = u.changed;
  const uint64_t span = std::max<uint64_t>(u.span_elems, 1);
  std::vector<Digest128> digests(m.size());
  std::vector<Status> errors(m.size());
  ByteTally written;
  u.pool->ParallelFor(m.size(), [&](size_t ti, size_t) {
    const auto t = static_cast<uint32_t>(ti);
    const size_t es = DTypeSize(m[t].dtype);
    const uint64_t n = m[t].NumElements();
    std::span<const std::byte> src = target.TensorData(t);
    std::span<const std::byte> dst = store.Tensor(t);
    auto next = std::lower_bound(ids.begin(), ids.end(),
                                 std::pair<uint32_t, uint32_t>{t, 0});
    LinearDigest h;
    uint64_t mine = 0;
    uint32_t s = 0;
    for (uint64_t first = 0; first < n; first += span, ++s) {
      const uint64_t bytes = std::min(span, n - first) * es;
      const uint64_t at = first * es;
      bool changed = u.all;
      if (next != ids.end() && next->first == t && next->second == s) {
        changed = true;
        ++next;
      }
      if (changed) {
        DCR_FAILPOINT("coord.baseline_write");
        Status w = store.WriteTensor(t, at, src.subspan(at, bytes));
        if (!w.ok()) {
          errors[t] = std::move(w);
          return;
        }
        mine += bytes;
      }
      h ^= LinearHash(at, dst.subspan(at, bytes));
    }
    digests[t] = FinishTensorDigest(h, n * es);
    written.Add(mine);
  });
  for (const Status& e : errors) DCR_RETURN_IF_ERROR(e);
  Digest128 digest = VersionDigest(m.digest(), digests);
  const auto t_done = Clock::now();
  spdlog::debug(
      "root.baseline: record {:.3f} s, {:.1f} MB written and hashed in "
      "{:.3f} s",
      Seconds(t0, t_begun), static_cast<double>(written.total()) / 1e6,
      Seconds(t_begun, t_done));
  if (digest != u.to.digest) {
    std::string which;
    const std::vector<Digest128>& want = *u.tensor_digests;
    for (size_t t = 0; t < m.size() && t < want.size(); ++t) {
      if (digests[t] != want[t]) {
        which = fmt::format(" (first differing tensor: '{}')", m[t].name);
        break;
      }
    }
    return Status::Internal(fmt::format(
        "the baseline does not have the target digest after the update ({} "
        "vs {}){}; did the target file change during the refit?",
        digest.ShortHex(), u.to.digest.ShortHex(), which));
  }
  return Status::OK();
}

}  // namespace dcr
