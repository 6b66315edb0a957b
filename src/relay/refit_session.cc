#include "relay/refit_session.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

namespace dcr {

std::unique_ptr<RefitSession> RefitSession::Begin(
    WeightStore* store, const std::string& node, const RefitId& refit,
    const PlanMsg& plan, NodeResult* refusal, const Options& options) {
  *refusal = NodeResult();
  refusal->node = node;
  auto refuse = [&](NodeCode code, std::string detail) {
    refusal->code = code;
    refusal->detail = std::move(detail);
    return nullptr;
  };
  if (options.rejoin) {
    auto busy = store->InProgress();
    if (!busy || busy->refit != refit || busy->target != plan.target) {
      refusal->code = NodeCode::kNeedsCatchUp;
      refusal->detail = "the store's record does not name this refit";
      return nullptr;
    }
    if (store->manifest().digest() != plan.manifest) {
      refusal->code = NodeCode::kManifestMismatch;
      refusal->detail = "the store holds other tensors";
      return nullptr;
    }
    std::unique_ptr<RefitSession> session(
        new RefitSession(store, node, refit, plan));
    session->keep_undo_ = false;
    session->rejoined_ = true;
    session->hash_ahead_ = options.hash_ahead;
    return session;
  }
  if (store->manifest().digest() != plan.manifest) {
    return refuse(
        NodeCode::kManifestMismatch,
        fmt::format("{} holds other tensors (manifest {}, plan {})",
                    store->describe(), store->manifest().digest().ShortHex(),
                    plan.manifest.ShortHex()));
  }
  // A refit left unfinished (the relay died mid-refit): the bits are a mix
  // of its base and target. A full refit repairs that (it overwrites every
  // span); a delta cannot apply to a mix, not even one of the same refit
  // (which XOR chunks were applied before is not known).
  std::optional<RefitInProgress> unfinished = store->InProgress();
  if (auto& busy = unfinished; busy && plan.mode != RefitMode::kFull) {
    // The root repairs it (docs/PROTOCOL.md §"Repair of a mixed store"):
    // the reply says which refit, so that it can find that refit's change
    // set.
    refusal->store.unfinished = busy->refit;
    refusal->store.base = busy->base;
    refusal->store.target = busy->target;
    return refuse(
        NodeCode::kNeedsCatchUp,
        fmt::format("{} holds the unfinished refit {} (a mix of step {} and "
                    "{}); the root repairs it",
                    store->describe(), busy->refit.ToHex(), busy->base.step,
                    busy->target.step));
  }
  std::optional<Version> committed = store->committed();
  if (committed) refusal->version = *committed;
  if (plan.mode == RefitMode::kDelta) {
    bool bound = false;
    if (committed) {
      bound = *committed == plan.base;
    } else {
      // A store without a record (seeded offline) is adopted iff its bits
      // are the base.
      Digest128 digest = store->Digests(options.pool).version;
      refusal->version = Version{0, digest};
      bound = digest == plan.base.digest;
    }
    if (!bound) {
      return refuse(
          NodeCode::kNeedsCatchUp,
          fmt::format("holds step {} ({}), the refit's base is step {} ({})",
                      refusal->version.step, refusal->version.digest.ShortHex(),
                      plan.base.step, plan.base.digest.ShortHex()));
    }
  }
  std::unique_ptr<UndoLog> undo;
  if (!options.fresh_store) {
    std::string dir = options.undo_dir.value_or(
        std::filesystem::path(store->record_path()).parent_path().string());
    auto log = UndoLog::Create(dir);
    if (!log.ok())
      return refuse(NodeCode::kStoreError, log.status().ToString());
    undo = *std::move(log);
  }
  // Over an unfinished refit's mix (a repair: a full refit), the record
  // keeps naming that refit until this one commits: should the relay die
  // again, the root's next repair covers the elements that refit changed
  // and those the tree changed since its base, which include this one's
  // target (a version of the tree); see coord/repair.h.
  if (!unfinished) {
    Status s = store->BeginRefit(refit, plan.base, plan.target);
    if (!s.ok()) return refuse(NodeCode::kStoreError, s.ToString());
  }
  std::unique_ptr<RefitSession> session(
      new RefitSession(store, node, refit, plan));
  session->keep_undo_ = !options.fresh_store;
  session->hash_ahead_ = options.hash_ahead;
  session->undo_ = std::move(undo);
  session->unfinished_ = std::move(unfinished);
  return session;
}

Status RefitSession::Check(const ChunkHeader& h) const {
  const Manifest& m = store_->manifest();
  std::string where =
      fmt::format("chunk (tensor {}, span {})", h.id.tensor, h.id.span);
  if (h.id.tensor >= m.size()) {
    return Status::Corruption(where + " names a tensor past the manifest");
  }
  const TensorInfo& t = m[h.id.tensor];
  uint64_t n = t.NumElements();
  if (h.id.span >= SpanCount(n, plan_.span_elems) ||
      h.span_elems !=
          std::min<uint64_t>(plan_.span_elems,
                             n - uint64_t{h.id.span} * plan_.span_elems) ||
      h.elem_size != DTypeSize(t.dtype)) {
    return Status::Corruption(where + " does not fit tensor '" + t.name + "'");
  }
  if (plan_.mode == RefitMode::kFull && h.kind != ChunkKind::kOverwrite) {
    return Status::Corruption(where + " is XOR in a full refit");
  }
  return Status::OK();
}

std::span<std::byte> RefitSession::SpanOf(const ChunkHeader& h) {
  uint64_t w = h.elem_size;
  return store_->MutableTensor(h.id.tensor)
      .subspan(uint64_t{h.id.span} * plan_.span_elems * w,
               uint64_t{h.span_elems} * w);
}

Result<RefitSession::ApplyOutcome> RefitSession::Apply(
    std::span<const std::byte> chunk, ChunkDecoder* decoder) {
  DCR_ASSIGN_OR_RETURN(ChunkHeader h, PeekChunkHeader(chunk));
  // Bound the decoder's buffers by the plan before decoding.
  DCR_RETURN_IF_ERROR(Check(h));
  DecodedChunk c;
  DCR_RETURN_IF_ERROR(decoder->Decode(chunk, &c));
  bool is_xor = c.header.kind == ChunkKind::kXor;
  {
    MutexLock lock(&mu_);
    SpanState& st = spans_[c.header.id];
    // One application per span at a time. An XOR chunk applies only to a
    // span nothing was applied to yet: after an earlier XOR it would
    // revert the span, after an overwrite (a retry that overtook it) it
    // would corrupt it; every chunk of a span carries the same target.
    // After a restart (rejoined_) every span may hold its XOR already.
    if (st.in_flight || (is_xor && (!st.stack.empty() || rejoined_))) {
      return ApplyOutcome::kDuplicate;
    }
    st.in_flight = true;
  }
  Applied a;
  std::vector<std::byte> replaced;
  Status s;
  {
    TensorHash& th = hashes_[c.header.id.tensor];
    ReaderMutexLock writing(&th.mu);
    th.writes.fetch_add(1, std::memory_order_relaxed);
    s = ApplyChunk(c, SpanOf(c.header),
                   is_xor || !keep_undo_ ? nullptr : &replaced);
    if (s.ok() && keep_undo_) {
      auto record = undo_->Append(chunk, replaced);
      if (record.ok()) {
        a.record = *record;
        a.chunk_size = chunk.size();
      } else {
        // The span is changed and cannot be undone: put it back first.
        Status back = UndoChunk(c, replaced, SpanOf(c.header));
        s = back.ok() ? record.status() : back;
      }
    }
  }
  {
    MutexLock lock(&mu_);
    SpanState& st = spans_[c.header.id];
    st.in_flight = false;
    if (!s.ok()) return s;
    st.stack.push_back(a);
  }
  if (hash_ahead_) HashBehind(c.header.id.tensor);
  return ApplyOutcome::kApplied;
}

void RefitSession::HashBehind(uint32_t tensor) {
  uint32_t from = hash_frontier_.load(std::memory_order_relaxed);
  do {
    if (from >= tensor) return;  // offered already, by this call or another
  } while (!hash_frontier_.compare_exchange_weak(from, tensor));
  // This call owns [from, tensor). A tensor an Apply is writing now is
  // skipped: it is not complete, and the vote hashes it.
  for (uint32_t i = from; i < tensor; ++i) {
    TensorHash& th = hashes_[i];
    WriterMutexLock hashing(&th.mu, std::defer_lock);
    if (!hashing.TryLock()) continue;
    const uint64_t writes = th.writes.load(std::memory_order_relaxed);
    if (th.hashed_writes == writes) continue;
    th.digest = Hash128(store_->Tensor(i));
    th.hashed_writes = writes;
    hashed_ahead_.fetch_add(1, std::memory_order_relaxed);
  }
}

RefitSession::HashCounts RefitSession::hash_counts() const {
  return HashCounts{hashed_ahead_.load(std::memory_order_relaxed),
                    hashed_at_vote_};
}

uint64_t RefitSession::chunks_applied() const {
  MutexLock lock(&mu_);
  uint64_t n = 0;
  for (const auto& [id, st] : spans_) n += st.stack.empty() ? 0 : 1;
  return n;
}

NodeResult RefitSession::Vote(const EndMsg& end, ThreadPool* pool) {
  NodeResult r;
  r.node = node_;
  std::vector<std::pair<uint32_t, uint32_t>> ids;
  {
    MutexLock lock(&mu_);
    for (const auto& [id, st] : spans_) {
      if (!st.stack.empty()) ids.emplace_back(id.tensor, id.span);
    }
  }
  r.chunks_applied = ids.size();
  bool complete = ids.size() == end.chunk_count &&
                  ChunkIdsDigest(ids) == end.chunk_ids_digest;
  // The first vote takes the digests hashed ahead of tensors no Apply
  // touched since; every later vote (a repair round) hashes every tensor,
  // so that bits changed outside the refit (a flipped bit) cannot slip
  // through twice.
  const Manifest& m = store_->manifest();
  // No Apply runs during a vote, so the tensors' locks taken below are free:
  // they cost an uncontended lock each and let the analysis check that
  // `hashed_writes` and `digest` are never touched without them.
  const bool use_ahead = hash_ahead_ && votes_++ == 0;
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
    th.digest = Hash128(store_->Tensor(stale[k]));
    th.hashed_writes = th.writes.load(std::memory_order_relaxed);
  };
  if (pool != nullptr) {
    pool->ParallelFor(stale.size(), body);
  } else {
    for (size_t k = 0; k < stale.size(); ++k) body(k, 0);
  }
  hashed_at_vote_ += stale.size();
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

Status RefitSession::Commit() {
  // Over an unfinished refit's mix the record still names that refit (see
  // Begin): the bits are verified to be the target now, so the record
  // names this refit, then commits it.
  if (unfinished_ && !rejoined_) {
    DCR_RETURN_IF_ERROR(store_->BeginRefit(refit_, plan_.base, plan_.target));
  }
  DCR_RETURN_IF_ERROR(store_->Commit(plan_.target, refit_));
  MutexLock lock(&mu_);
  spans_.clear();
  return Status::OK();
}

Status RefitSession::Abort(ChunkDecoder* decoder) {
  MutexLock lock(&mu_);
  if (rejoined_) {
    // What the crash left cannot be undone: the record keeps saying the
    // refit is unfinished, so no delta applies until a full refit.
    spans_.clear();
    return Status::Unsupported(
        "the base cannot be restored after a restart mid-refit; the store "
        "stays marked unfinished: repair it with dcr refit --full");
  }
  DecodedChunk c;
  std::vector<std::byte> record;
  // A fresh store has no base bits to go back to: its record says it holds
  // no committed version, which is all a later refit checks.
  for (auto& [id, st] : spans_) {
    if (!keep_undo_) break;
    // Reverse the applications of this span, last first.
    for (auto it = st.stack.rbegin(); it != st.stack.rend(); ++it) {
      DCR_RETURN_IF_ERROR(undo_->Read(it->record, &record));
      std::span<const std::byte> bytes(record);
      DCR_RETURN_IF_ERROR(decoder->Decode(bytes.first(it->chunk_size), &c));
      DCR_RETURN_IF_ERROR(
          UndoChunk(c, bytes.subspan(it->chunk_size), SpanOf(c.header)));
    }
  }
  spans_.clear();
  // Restored bits that were an unfinished refit's mix are still that mix:
  // keep it recorded, so that no delta is bound to them.
  if (unfinished_) {
    return store_->BeginRefit(unfinished_->refit, unfinished_->base,
                              unfinished_->target);
  }
  return store_->EndRefit();
}

}  // namespace dcr
