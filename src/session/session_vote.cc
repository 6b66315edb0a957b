// RefitSession's digests: the hash-ahead of tensors the stream has moved
// past (HashBehind) and the vote, which hashes what is left and compares
// the store's digest with the target's (DESIGN.md §4, invariant 1).
// (A serving store's vote is in serving_store.cc.)
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "common/elapsed.h"
#include "session/refit_session.h"

namespace dcr {

void RefitSession::HashBehind(uint32_t tensor) {
  // One thread hashes at a time; an Apply that finds it busy goes on (a
  // later one, or the vote, hashes what it would have).
  if (!hash_mu_.TryLock()) return;
  // A mark may name any tensor (the frame says what it says).
  tensor = std::min<uint64_t>(tensor, store_->manifest().size());
  uint32_t i = hash_frontier_;
  for (; i < tensor; ++i) {
    TensorHash& th = hashes_[i];
    // A chunk of it is queued or being applied: it is not complete yet.
    // The frontier waits here, and a later Apply tries again.
    if (th.queued.load(std::memory_order_acquire) != 0) break;
    WriterMutexLock hashing(&th.mu, std::defer_lock);
    if (!hashing.TryLock()) break;
    const uint64_t writes = th.writes.load(std::memory_order_relaxed);
    if (th.hashed_writes == writes) continue;
    th.digest = TensorDigest(store_->Tensor(i));
    th.hashed_writes = writes;
    hashed_ahead_.fetch_add(1, std::memory_order_relaxed);
  }
  hash_frontier_ = std::max(hash_frontier_, i);
  hash_mu_.Unlock();
}

std::optional<uint32_t> RefitSession::TensorOfChunk(
    std::span<const std::byte> chunk) const {
  // Only hashing ahead reads the counts (a serving store's session, whose
  // tensors are not the manifest's, never hashes ahead).
  if (!hash_ahead_) return std::nullopt;
  auto h = PeekChunkHeader(chunk);
  if (!h.ok() || h->id.tensor >= store_->manifest().size()) return std::nullopt;
  return h->id.tensor;
}

void RefitSession::Queued(std::span<const std::byte> chunk) {
  if (auto t = TensorOfChunk(chunk)) {
    hashes_[*t].queued.fetch_add(1, std::memory_order_acq_rel);
  }
}

void RefitSession::Unqueued(std::span<const std::byte> chunk) {
  if (auto t = TensorOfChunk(chunk)) {
    hashes_[*t].queued.fetch_sub(1, std::memory_order_acq_rel);
  }
  // Its Apply's hashing stopped at its own tensor if that was below the
  // mark: go on, now that it is out of the queue. (Without marks, more
  // chunks of the tensor may follow: the next Apply hashes.)
  const uint32_t mark = marked_.load(std::memory_order_relaxed);
  if (hash_ahead_ && mark != kNoMark) HashBehind(mark);
}

void RefitSession::StreamPassed(uint32_t tensor) {
  // Past the manifest means every tensor (and never reads as kNoMark).
  tensor = static_cast<uint32_t>(
      std::min<uint64_t>(tensor, store_->manifest().size()));
  uint32_t was = marked_.load(std::memory_order_relaxed);
  do {
    if (was != kNoMark && was >= tensor) return;
  } while (!marked_.compare_exchange_weak(was, tensor));
}

RefitSession::HashCounts RefitSession::hash_counts() const {
  return HashCounts{hashed_ahead_.load(std::memory_order_relaxed),
                    hashed_at_vote_, vote_hash_seconds_, vote_sync_seconds_};
}

NodeResult RefitSession::Vote(const EndMsg& end, ThreadPool* pool) {
  NodeResult r;
  r.node = node_;
  std::vector<ChunkId> ids;
  {
    MutexLock lock(&mu_);
    for (const auto& [id, st] : spans_) {
      if (!st.stack.empty()) ids.push_back(id);
    }
  }
  r.chunks_applied = ids.size();
  const uint64_t applied = ids.size();
  bool complete = ids.size() == end.chunk_count &&
                  ChunkIdsDigest(std::move(ids)) == end.chunk_ids_digest;
  if (map_ != nullptr) return VoteServing(std::move(r), complete, applied, end);
  // The first vote takes the digests hashed ahead of tensors no Apply
  // touched since; every later vote (a repair round) hashes every tensor,
  // so that bits changed outside the refit (a flipped bit) cannot slip
  // through twice.
  const Manifest& m = store_->manifest();
  // No Apply runs during a vote, so the tensors' locks taken below are free:
  // they cost an uncontended lock each and let the analysis check that
  // `hashed_writes` and `digest` are never touched without them.
  const bool use_ahead = hash_ahead_ && votes_++ == 0;
  const auto hash_start = std::chrono::steady_clock::now();
  vote_sync_seconds_ = 0;
  std::vector<uint32_t> stale;
  for (size_t i = 0; i < m.size(); ++i) {
    TensorHash& th = hashes_[i];
    ReaderMutexLock reading(&th.mu);
    if (!use_ahead ||
        th.hashed_writes != th.writes.load(std::memory_order_relaxed)) {
      stale.push_back(static_cast<uint32_t>(i));
    }
  }
  auto body = [this, &stale](size_t k, size_t /*worker*/) {
    TensorHash& th = hashes_[stale[k]];
    WriterMutexLock hashing(&th.mu);
    th.digest = TensorDigest(store_->Tensor(stale[k]));
    th.hashed_writes = th.writes.load(std::memory_order_relaxed);
  };
  if (pool != nullptr) {
    pool->ParallelFor(stale.size(), body);
  } else {
    for (size_t k = 0; k < stale.size(); ++k) body(k, 0);
  }
  hashed_at_vote_ += stale.size();
  vote_hash_seconds_ = Seconds(hash_start, std::chrono::steady_clock::now());
  std::vector<Digest128> tensor_digests(m.size());
  for (size_t i = 0; i < m.size(); ++i) {
    ReaderMutexLock reading(&hashes_[i].mu);
    tensor_digests[i] = hashes_[i].digest;
  }
  r.version =
      Version{plan_.target.step, VersionDigest(m.digest(), tensor_digests)};
  // The bits decide (DESIGN.md §4, invariant 1): a store at the target
  // votes yes even if some chunk failed on the way (a repair overwrote it).
  if (r.version.digest == plan_.target.digest) {
    // Durable before the vote leaves this relay: after a crash, the
    // journal says this relay may be in the commit set (RecoverAfterCrash).
    const auto sync_start = std::chrono::steady_clock::now();
    Status s =
        journal_ ? journal_->AppendVotedYes(r.version.digest) : Status::OK();
    vote_sync_seconds_ = Seconds(sync_start, std::chrono::steady_clock::now());
    if (!s.ok()) {
      r.code = NodeCode::kStoreError;
      r.detail = "cannot record the yes vote: " + s.ToString();
      return r;
    }
    r.code = NodeCode::kOk;
    return r;
  }
  if (!complete) {
    r.code = NodeCode::kIncomplete;
    r.detail = fmt::format("applied {} distinct chunks, the root sent {}",
                           ids.size(), end.chunk_count);
  } else {
    r.code = NodeCode::kDigestMismatch;
    r.detail = fmt::format("store digest {} is not the target's {}",
                           r.version.digest.ShortHex(),
                           plan_.target.digest.ShortHex());
  }
  if (plan_.target_tensor_digests.size() == m.size()) {
    for (size_t i = 0; i < m.size(); ++i) {
      if (tensor_digests[i] != plan_.target_tensor_digests[i]) {
        r.repair.push_back(static_cast<uint32_t>(i));
      }
    }
    r.detail +=
        fmt::format("; {} of {} tensors differ", r.repair.size(), m.size());
  }
  return r;
}

}  // namespace dcr
