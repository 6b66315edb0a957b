#include "session/refit_session.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "session/serving_store.h"

namespace dcr {
namespace {

// The refit's journal, where Options say (a memory store's on the heap).
// (A serving store's journal names the base and target by the rank's bits
// digests: what its restore and its yes votes are checked against.)
Result<std::unique_ptr<Journal>> CreateJournal(
    const WeightStore& store, const RefitId& refit, const PlanMsg& plan,
    const RefitSession::Options& options) {
  std::string path;
  if (!options.undo_dir || !options.undo_dir->empty()) {
    path = JournalPath(store.record_path(), options.undo_dir.value_or(""));
  }
  Result<std::string> boot = CurrentBootId();
  Version base = plan.base, target = plan.target;
  if (options.serving != nullptr) {
    base.digest = options.serving_base.value_or(Digest128{});
    target.digest = Digest128{};  // comes with the vote
  }
  return Journal::Create(
      path,
      JournalHeader{refit, base, target, boot.ok() ? *boot : std::string()});
}

}  // namespace

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
  const ReceiverMap* map = options.serving;
  Manifest canonical;
  if (map != nullptr) {
    if (auto bad =
            session_internal::CheckServing(*store, *map, plan, &canonical)) {
      return refuse(bad->first, std::move(bad->second));
    }
  }
  // The tensors of the store are the plan's, or (a serving store) hold the
  // rank's part of them.
  const bool manifest_ok =
      map != nullptr || store->manifest().digest() == plan.manifest;
  // A new session's serving state.
  auto serve = [&](RefitSession* session) {
    if (map == nullptr) return;
    session->map_ = map;
    session->shards_ = ShardsOf(store);
    session->hashes_ = std::make_unique<TensorHash[]>(canonical.size());
    session->canonical_ = std::move(canonical);
    session->hash_ahead_ = false;
    // A store created for this refit (its codes and scales are zeros, and
    // blocks of padding take no chunk) or bits of unknown history (a
    // rejoin): every FP8 block is requantized at the vote, not only those
    // the refit's chunks touch.
    if (options.fresh_store || options.rejoin) {
      MutexLock lock(&session->dirty_mu_);
      for (const auto& [name, f] : map->fp8_shards()) {
        session->dirty_.try_emplace(name, f.marks()).first->second.MarkAll();
      }
    }
  };
  if (options.rejoin) {
    auto busy = store->InProgress();
    // The record's target digest is zero if the relay stopped before END
    // named it, and the resuming PLAN's if no decision was reached.
    if (!busy || busy->refit != refit ||
        !SameTarget(busy->target, plan.target)) {
      refusal->code = NodeCode::kNeedsCatchUp;
      refusal->detail = "the store's record does not name this refit";
      return nullptr;
    }
    if (!manifest_ok) {
      refusal->code = NodeCode::kManifestMismatch;
      refusal->detail = "the store holds other tensors";
      return nullptr;
    }
    // Its journal takes only yes votes (what was applied before is not
    // known, so there is nothing to restore from).
    auto journal = CreateJournal(*store, refit, plan, options);
    if (!journal.ok()) {
      return refuse(NodeCode::kStoreError, journal.status().ToString());
    }
    std::unique_ptr<RefitSession> session(
        new RefitSession(store, node, refit, plan));
    session->keep_undo_ = false;
    session->rejoined_ = true;
    session->hash_ahead_ = options.hash_ahead;
    session->journal_ = *std::move(journal);
    serve(session.get());
    return session;
  }
  if (!manifest_ok) {
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
    } else if (map != nullptr) {
      return refuse(NodeCode::kNeedsCatchUp,
                    store->describe() +
                        " has no version record: a serving store is seeded "
                        "by a full refit");
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
  // The journal exists before the record says the refit is in progress,
  // so no apply can run without it.
  std::unique_ptr<Journal> journal;
  if (!options.fresh_store) {
    auto created = CreateJournal(*store, refit, plan, options);
    if (!created.ok())
      return refuse(NodeCode::kStoreError, created.status().ToString());
    journal = *std::move(created);
  }
  // Over an unfinished refit's mix (a repair: a full refit), the record
  // keeps naming that refit until this one commits: should the relay die
  // again, the root's next repair covers the elements that refit changed
  // and those the tree changed since its base, which include this one's
  // target (a version of the tree); see coord/repair.h. (This refit's
  // journal then names another refit than the record: a restart ignores
  // it.)
  if (!unfinished) {
    Status s = store->BeginRefit(refit, plan.base, plan.target);
    if (!s.ok()) {
      if (journal) (void)journal->Remove();
      return refuse(NodeCode::kStoreError, s.ToString());
    }
  }
  std::unique_ptr<RefitSession> session(
      new RefitSession(store, node, refit, plan));
  session->keep_undo_ = !options.fresh_store;
  session->hash_ahead_ = options.hash_ahead;
  session->journal_ = std::move(journal);
  session->unfinished_ = std::move(unfinished);
  serve(session.get());
  return session;
}

Status RefitSession::Check(const ChunkHeader& h) const {
  const Manifest& m = map_ != nullptr ? canonical_ : store_->manifest();
  std::string where = fmt::format("chunk ({})", ChunkIdText(h.id));
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
  if (h.encoding == ChunkEncoding::kContext &&
      (!plan_.context_coded || h.context != ExponentFieldOf(t.dtype))) {
    return Status::Corruption(
        where + (plan_.context_coded
                     ? " is coded in the context of another exponent field "
                       "than its tensor's dtype"
                     : " is context-coded in a plan that did not offer it"));
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
  // A context-coded chunk decodes against the span itself, once this
  // apply owns it; any other chunk decodes first, outside the span.
  const bool in_context = h.encoding == ChunkEncoding::kContext;
  if (in_context && map_ != nullptr) {
    return Status::Corruption("chunk (" + ChunkIdText(h.id) +
                              ") is context-coded; a serving store cannot "
                              "decode it");
  }
  DecodedChunk c;
  if (!in_context) DCR_RETURN_IF_ERROR(decoder->Decode(chunk, &c));
  bool is_xor = h.kind == ChunkKind::kXor;
  Footprint fp = FootprintOf(h, c);
  fp.by_copy =
      fp.by_copy && map_ == nullptr &&
      store_->ModifiesByCopy(h.id.tensor, uint64_t{h.span_elems} * h.elem_size);
  {
    MutexLock lock(&mu_);
    for (;;) {
      const Admission a = Admit(h.id, is_xor, fp);
      if (a == Admission::kDuplicate) return ApplyOutcome::kDuplicate;
      if (a == Admission::kApply) break;
      applied_.Wait(&mu_);
    }
    SpanState& st = spans_[h.id];
    st.in_flight = true;
    st.footprint = fp;
  }
  Applied a;
  Status s;
  {
    TensorHash& th = hashes_[h.id.tensor];
    ReaderMutexLock writing(&th.mu);
    // The span holds the base here: nothing was applied to it (an XOR
    // chunk is taken only by a span nothing was applied to) and no other
    // apply runs on it. Bits that are not the base fail the chunk's
    // checksum of its decoded changes, and nothing is written.
    const uint64_t offset =
        uint64_t{h.id.span} * plan_.span_elems * h.elem_size;
    auto write = [&](std::span<std::byte> span) -> Status {
      if (in_context)
        DCR_RETURN_IF_ERROR(decoder->Decode(chunk, &c, nullptr, span));
      if (keep_undo_) {
        // Write-ahead: the values this apply replaces are in the journal
        // before the first byte of the span changes.
        DCR_ASSIGN_OR_RETURN(a.record, journal_->AppendApply(c, offset, span));
      }
      th.writes.fetch_add(1, std::memory_order_relaxed);
      return ApplyChunk(c, span);
    };
    if (map_ != nullptr) {
      s = ApplyServing(c, &a);
      if (s.ok()) th.writes.fetch_add(1, std::memory_order_relaxed);
    } else if (fp.by_copy) {
      s = store_->ModifyTensor(h.id.tensor, offset,
                               uint64_t{h.span_elems} * h.elem_size, fp.from,
                               fp.to, write);
    } else {
      s = write(SpanOf(h));
    }
  }
  {
    MutexLock lock(&mu_);
    SpanState& st = spans_[h.id];
    st.in_flight = false;
    applied_.SignalAll();
    if (!s.ok()) {
      // A write-back that failed part way (ModifyTensor's pwrite) may have
      // changed some elements after the record went to the journal.
      if (a.record.size != 0) st.unsure.push_back(a);
      return s;
    }
    st.stack.push_back(a);
  }
  if (hash_ahead_) {
    HashBehind(
        std::min(c.header.id.tensor, marked_.load(std::memory_order_relaxed)));
  }
  return ApplyOutcome::kApplied;
}

RefitSession::Footprint RefitSession::FootprintOf(const ChunkHeader& h,
                                                  const DecodedChunk& c) {
  constexpr uint64_t kPage = 4096;
  const uint64_t bytes = uint64_t{h.span_elems} * h.elem_size;
  Footprint f{false, 0, bytes};
  if (h.encoding == ChunkEncoding::kDense) {
    f.by_copy = true;
  } else if (h.encoding == ChunkEncoding::kContext) {
    // Not decoded yet (it decodes against the whole span): as many changes
    // as pages touch 63% of them when spread at random.
    f.by_copy = h.changed >= (bytes + kPage - 1) / kPage;
  } else if (!c.positions.empty()) {
    // The pages from the first change to the last (a part of a producers'
    // refit may hold one rank's rows of the span), and how many of them
    // hold a change.
    const uint64_t first = uint64_t{c.positions.front()} * h.elem_size / kPage;
    const uint64_t last = uint64_t{c.positions.back()} * h.elem_size / kPage;
    f.from = first * kPage;
    f.to = std::min(bytes, (last + 1) * kPage);
    uint64_t touched = 0;
    uint64_t page = ~uint64_t{0};
    for (uint32_t p : c.positions) {
      const uint64_t q = uint64_t{p} * h.elem_size / kPage;
      touched += q != page;
      page = q;
    }
    f.by_copy = 2 * touched >= last - first + 1;
  }
  return f;
}

RefitSession::Admission RefitSession::Admit(const ChunkId& id, bool is_xor,
                                            const Footprint& fp) const {
  // An XOR chunk applies only where nothing it overlaps was applied or is
  // being applied: after an earlier XOR it would revert the elements,
  // after an overwrite (a retry that overtook it) it would corrupt them;
  // every chunk of an element carries the same target. Parts of one span
  // hold disjoint elements, so they do not overlap; the whole span (part
  // 0) overlaps every part. After a restart (rejoined_) every span may
  // hold its XOR already.
  if (is_xor && rejoined_) return Admission::kDuplicate;
  bool wait = false;
  auto visit = [&](const ChunkId& other, const SpanState& st) {
    if (is_xor) {
      return st.in_flight || !st.stack.empty() || !st.unsure.empty();
    }
    if (!st.in_flight) return false;
    // An overwrite is idempotent: it is dropped only while a chunk that
    // covers it (its own id, or its span's part 0) is being applied (that
    // one carries the same target bits); a whole-span overwrite waits for
    // the narrower parts being applied.
    if (other == id || other.part == 0) return true;
    wait = true;
    return false;
  };
  if (id.part != 0) {
    for (const ChunkId& other : {id, ChunkId{id.tensor, id.span, 0}}) {
      auto it = spans_.find(other);
      if (it != spans_.end() && visit(it->first, it->second)) {
        return Admission::kDuplicate;
      }
    }
    // Parts hold disjoint elements, but one that rewrites its window from
    // a copy (by_copy) must run alone over it, or the write-back of its
    // copy would undo the other's elements there.
    for (auto it = spans_.lower_bound(ChunkId{id.tensor, id.span, 0});
         it != spans_.end() && SameSpan(it->first, id); ++it) {
      const SpanState& other = it->second;
      if (other.in_flight && (fp.by_copy || other.footprint.by_copy) &&
          fp.from < other.footprint.to && other.footprint.from < fp.to) {
        return Admission::kWait;
      }
    }
    return Admission::kApply;
  }
  for (auto it = spans_.lower_bound(id);
       it != spans_.end() && SameSpan(it->first, id); ++it) {
    if (visit(it->first, it->second)) return Admission::kDuplicate;
  }
  return wait ? Admission::kWait : Admission::kApply;
}

uint64_t RefitSession::chunks_applied() const {
  MutexLock lock(&mu_);
  uint64_t n = 0;
  for (const auto& [id, st] : spans_) n += st.stack.empty() ? 0 : 1;
  return n;
}

Status RefitSession::Commit(std::unique_ptr<Journal>* spent) {
  // Over an unfinished refit's mix the record still names that refit (see
  // Begin): the bits are verified to be the target now, so the record
  // names this refit, then commits it.
  if (unfinished_ && !rejoined_) {
    DCR_RETURN_IF_ERROR(store_->BeginRefit(refit_, plan_.base, plan_.target));
  }
  DCR_RETURN_IF_ERROR(store_->Commit(plan_.target, refit_));
  MutexLock lock(&mu_);
  spans_.clear();
  // A journal left behind (the unlink failed) names a refit the record no
  // longer does: the next start removes it.
  if (spent != nullptr) {
    *spent = std::move(journal_);
  } else if (journal_) {
    (void)journal_->Remove();
  }
  return Status::OK();
}

Status RefitSession::Abort(ChunkDecoder* /*decoder*/) {
  MutexLock lock(&mu_);
  if (rejoined_) {
    // What the crash left cannot be undone: the record keeps saying the
    // refit is unfinished, so no delta applies until a full refit.
    spans_.clear();
    return Status::Unsupported(
        "the base cannot be restored after a restart mid-refit; the store "
        "stays marked unfinished: repair it with dcr refit --full");
  }
  JournalApply record;
  // A fresh store has no base bits to go back to: its record says it holds
  // no committed version, which is all a later refit checks.
  if (keep_undo_) {
    // Reverse every application, last written first. Applications that
    // overlap (a part and its span's whole-span overwrite) never run at
    // once, so their records are in the order they wrote.
    std::vector<Journal::Ref> refs;
    for (const auto& [id, st] : spans_) {
      for (const auto* applied : {&st.stack, &st.unsure}) {
        for (const Applied& a : *applied) {
          // (A serving rank keeps no record of a tensor it does not hold.)
          if (a.record.size != 0) refs.push_back(a.record);
        }
      }
    }
    std::sort(refs.begin(), refs.end(),
              [](const Journal::Ref& x, const Journal::Ref& y) {
                return x.offset > y.offset;
              });
    for (const Journal::Ref& ref : refs) {
      DCR_RETURN_IF_ERROR(journal_->Read(ref, &record));
      if (map_ != nullptr) {
        MutexLock dirty(&dirty_mu_);
        DCR_RETURN_IF_ERROR(RestoreServing(record, *map_, shards_, &dirty_));
      } else {
        DCR_RETURN_IF_ERROR(
            RestoreApply(record, store_->MutableTensor(record.id.tensor)));
      }
    }
  }
  if (map_ != nullptr) {
    // The FP8 blocks the refit and the restore touched, from the base's
    // shadows again.
    MutexLock dirty(&dirty_mu_);
    DCR_RETURN_IF_ERROR(map_->Requantize(shards_, &dirty_));
  }
  spans_.clear();
  // Restored bits that were an unfinished refit's mix are still that mix:
  // keep it recorded, so that no delta is bound to them.
  Status s = unfinished_
                 ? store_->BeginRefit(unfinished_->refit, unfinished_->base,
                                      unfinished_->target)
                 : store_->EndRefit();
  if (s.ok() && journal_) (void)journal_->Remove();
  return s;
}

}  // namespace dcr
