// RefitSession on a serving store (refit_session.h, "Serving stores"):
// the apply through the rank's map behind the journal, a record's restore,
// the vote on the rank's bits.
#include "session/serving_store.h"

#include <fmt/format.h>

#include <chrono>

#include "common/elapsed.h"
#include "session/refit_session.h"

namespace dcr {
namespace session_internal {

// The bits a serving store holds: the rank's canonical regions (FP8
// tensors from their shadows).
Result<std::vector<LinearDigest>> ServingRegions(WeightStore* store,
                                                 const ReceiverMap& map) {
  ShardBytes shards;
  for (const auto& [name, bytes] : RefitSession::ShardsOf(store)) {
    shards.emplace(name, bytes);
  }
  return map.HashRegions(shards);
}

// Checks a serving store and a plan against the map; the refusal's code
// and detail, or nullopt. Sets `canonical` to the map's canonical tensors.
std::optional<std::pair<NodeCode, std::string>> CheckServing(
    const WeightStore& store, const ReceiverMap& map, const PlanMsg& plan,
    Manifest* canonical) {
  auto stored = map.StoreManifest();
  auto tensors = map.CanonicalManifest();
  if (!stored.ok() || !tensors.ok()) {
    return std::pair(
        NodeCode::kStoreError,
        (stored.ok() ? tensors.status() : stored.status()).ToString());
  }
  const std::string rank = fmt::format(
      "serving rank {} of layout {}", map.rank(), map.fingerprint().ShortHex());
  if (store.manifest().digest() != stored->digest()) {
    return std::pair(
        NodeCode::kManifestMismatch,
        fmt::format("{} does not hold the shards of {}: {}", store.describe(),
                    rank, Manifest::Difference(*stored, store.manifest())));
  }
  if (plan.manifest != tensors->digest()) {
    return std::pair(
        NodeCode::kManifestMismatch,
        fmt::format("the refit's tensors (manifest {}) are not those of {} "
                    "(manifest {})",
                    plan.manifest.ShortHex(), rank,
                    tensors->digest().ShortHex()));
  }
  if (plan.context_coded) {
    return std::pair(NodeCode::kManifestMismatch,
                     rank +
                         " does not hold whole spans to decode the plan's "
                         "context-coded chunks against");
  }
  *canonical = *std::move(tensors);
  return std::nullopt;
}

}  // namespace session_internal

MutableShardBytes RefitSession::ShardsOf(WeightStore* store) {
  MutableShardBytes out;
  const Manifest& m = store->manifest();
  for (size_t i = 0; i < m.size(); ++i) {
    out.emplace(m[i].name, store->MutableTensor(i));
  }
  return out;
}

Status RefitSession::ApplyServing(const DecodedChunk& c, Applied* a) {
  const uint32_t tensor = c.header.id.tensor;
  const uint64_t first = uint64_t{c.header.id.span} * plan_.span_elems;
  // A tensor the rank does not hold: nothing to write, nothing to record
  // (a record of it would be as large as the chunk).
  if (!map_->Holds(tensor)) return Status::OK();
  if (keep_undo_) {
    // Write-ahead, as for a canonical span: the values the rank holds at
    // the chunk's positions, before the first of them changes.
    thread_local std::vector<std::byte> old;
    old.assign(c.values.size(), std::byte{0});
    if (!old.empty()) {
      DCR_RETURN_IF_ERROR(
          map_->Gather(tensor, first, c, shards_, old).status());
    }
    DCR_ASSIGN_OR_RETURN(a->record, journal_->AppendApplyValues(
                                        c, first * c.header.elem_size, old));
  }
  Fp8Dirty dirty;
  DCR_RETURN_IF_ERROR(map_->Apply(tensor, first, c, shards_, &dirty).status());
  if (!dirty.empty()) {
    MutexLock lock(&dirty_mu_);
    for (auto& [name, marks] : dirty) {
      auto [it, fresh] = dirty_.try_emplace(name, std::move(marks));
      if (!fresh) it->second.Merge(marks);
    }
  }
  return Status::OK();
}

Status RefitSession::RestoreServing(const JournalApply& a,
                                    const ReceiverMap& map,
                                    const MutableShardBytes& shards,
                                    Fp8Dirty* dirty) {
  // The record as the overwrite chunk that writes its old values back.
  DecodedChunk c;
  c.header.id = a.id;
  c.header.kind = ChunkKind::kOverwrite;
  c.header.elem_size = a.elem_size;
  c.header.encoding = a.dense ? ChunkEncoding::kDense : ChunkEncoding::kSparse;
  const uint64_t w = a.elem_size;
  if (w == 0 || a.offset % w != 0 || a.old_values.size() % w != 0) {
    return Status::Corruption("journal record of a serving store misaligned");
  }
  const uint64_t count = a.old_values.size() / w;
  const uint64_t extent =
      a.dense ? count
              : (a.positions.empty() ? 0 : uint64_t{a.positions.back()} + 1);
  if (extent > kMaxSpanElems) {
    return Status::Corruption("journal record wider than a span");
  }
  c.header.span_elems = static_cast<uint32_t>(extent);
  c.header.changed = static_cast<uint32_t>(count);
  c.positions = a.positions;
  c.values = a.old_values;
  if (count == 0) return Status::OK();
  return map.Apply(a.id.tensor, a.offset / w, c, shards, dirty).status();
}

NodeResult RefitSession::VoteServing(NodeResult r, bool complete,
                                     uint64_t applied, const EndMsg& end) {
  ++votes_;
  const auto hash_start = std::chrono::steady_clock::now();
  vote_sync_seconds_ = 0;
  // The codes and scales of the FP8 blocks the refit touched, from their
  // shadows, before anything reads them.
  {
    MutexLock lock(&dirty_mu_);
    if (Status s = map_->Requantize(shards_, &dirty_); !s.ok()) {
      r.code = NodeCode::kStoreError;
      r.detail = "cannot requantize the FP8 shards: " + s.ToString();
      return r;
    }
  }
  auto regions = session_internal::ServingRegions(store_, *map_);
  if (!regions.ok()) {
    r.code = NodeCode::kStoreError;
    r.detail = regions.status().ToString();
    return r;
  }
  hashed_at_vote_ += regions->size();
  const Digest128 bits = map_->BitsDigest(*regions);
  vote_hash_seconds_ = Seconds(hash_start, std::chrono::steady_clock::now());
  r.version = Version{plan_.target.step, bits};
  if (serving_target_ && bits == serving_target_->bits) {
    const auto sync_start = std::chrono::steady_clock::now();
    Status s = journal_ ? journal_->AppendVotedYes(bits) : Status::OK();
    vote_sync_seconds_ = Seconds(sync_start, std::chrono::steady_clock::now());
    if (!s.ok()) {
      r.code = NodeCode::kStoreError;
      r.detail = "cannot record the yes vote: " + s.ToString();
      return r;
    }
    // It holds the target's bits for its regions: it votes by the target.
    r.version = plan_.target;
    r.code = NodeCode::kOk;
    return r;
  }
  const std::string rank = fmt::format("serving rank {}", map_->rank());
  if (!serving_target_) {
    r.code = NodeCode::kDigestMismatch;
    r.detail = fmt::format("{}: the root named no target bits for it", rank);
    return r;
  }
  if (!complete) {
    r.code = NodeCode::kIncomplete;
    r.detail = fmt::format("applied {} distinct chunks, the root sent {}",
                           applied, end.chunk_count);
  } else {
    r.code = NodeCode::kDigestMismatch;
    r.detail = fmt::format("{}: bits {} are not the target's {}", rank,
                           bits.ShortHex(), serving_target_->bits.ShortHex());
  }
  if (serving_target_->regions.size() == regions->size()) {
    for (size_t i = 0; i < regions->size(); ++i) {
      if ((*regions)[i] != serving_target_->regions[i]) {
        r.repair.push_back(static_cast<uint32_t>(i));
      }
    }
    r.detail += fmt::format("; {} of {} tensors differ", r.repair.size(),
                            regions->size());
  }
  return r;
}

}  // namespace dcr
