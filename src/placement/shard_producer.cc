// ShardProducer (dcr/shard_delta.h): a trainer rank's producer across
// steps, its baseline shards in host memory or a ShardMemory, and the
// step's change log.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

#include "dcr/shard_delta.h"
#include "placement/shard_runs.h"

namespace dcr {
namespace {

// Moves a tensor's digest part from the base to the target by `changes`
// (the digest is linear: the target's part is the base's XOR the hash of
// the changed elements' XOR masks at their positions), so that a diff
// needs no pass over the target to hash it. `mask`: scratch.
void MoveDigest(const Layout& layout, const CanonicalChanges& changes,
                std::vector<std::byte>* mask,
                std::vector<LinearDigest>* digests) {
  const size_t w = DTypeSize(layout.tensors[changes.tensor].dtype);
  mask->resize(changes.base.size());
  for (size_t i = 0; i < mask->size(); ++i) {
    (*mask)[i] = changes.base[i] ^ changes.target[i];
  }
  (*digests)[changes.tensor] ^= LinearHashElements(
      0, w, changes.positions.data(), changes.positions.size(), mask->data());
}

}  // namespace

ShardProducer::ShardProducer(Layout layout, uint32_t rank, uint64_t span_elems,
                             EncodeOptions encode)
    : layout_(std::move(layout)), rank_(rank), span_elems_(span_elems) {
  auto e = ChunkEncoder::Create(encode);
  if (e.ok()) {
    encoder_ = std::move(*e);
  } else {
    encoder_status_ = e.status();
  }
}

ShardProducer::~ShardProducer() = default;

Status ShardProducer::CheckRank() const {
  DCR_RETURN_IF_ERROR(encoder_status_);
  return shard_runs::CheckPartsRank(layout_, rank_);
}

Status ShardProducer::UseMemory(std::unique_ptr<ShardMemory> memory) {
  if (has_baseline_) {
    return Status::InvalidArgument(fmt::format(
        "rank {}: the producer holds its baseline in {}; drop it before "
        "handing shards in other memory",
        rank_, memory_ ? memory_->name() : std::string("host memory")));
  }
  memory_ = std::move(memory);
  return Status::OK();
}

uint64_t ShardProducer::baseline_bytes() const {
  if (memory_) return has_baseline_ ? memory_->baseline_bytes() : 0;
  uint64_t n = 0;
  for (const auto& [name, b] : baseline_) n += b.size();
  return n;
}

namespace {

// The rank's own shards of `shards` (others are ignored).
ShardBytes OwnShards(const Layout& layout, uint32_t rank,
                     const ShardBytes& shards) {
  ShardBytes own;
  for (const auto& [name, info] : layout.ShardsOf(rank)) {
    own.emplace(name, shards.at(name));
  }
  return own;
}

}  // namespace

Status ShardProducer::SetBaseline(const ShardBytes& shards) {
  DCR_RETURN_IF_ERROR(CheckRank());
  if (memory_) {
    DCR_RETURN_IF_ERROR(CheckShards(layout_, rank_, shards));
    // The shards cannot be read here before they are copied: a failure
    // from here on leaves no baseline.
    DropBaseline();
    const ShardBytes own = OwnShards(layout_, rank_, shards);
    Status s = memory_->SetBaseline(own);
    // Its regions hashed on the host, one shard at a time.
    std::vector<LinearDigest> digests(layout_.tensors.size());
    std::vector<std::byte> host;
    for (auto it = own.begin(); s.ok() && it != own.end(); ++it) {
      host.resize(it->second.size());
      s = memory_->ReadBaseline(it->first, 0, host);
      if (s.ok()) {
        s = AddShardRegions(layout_, rank_, it->first, host, &digests);
      }
    }
    if (!s.ok()) {
      DropBaseline();
      return s;
    }
    has_baseline_ = true;
    baseline_digests_ = std::move(digests);
    return Status::OK();
  }
  // Checked (presence and sizes) and hashed before anything is kept.
  DCR_ASSIGN_OR_RETURN(auto digests, HashShardRegions(layout_, rank_, shards));
  std::map<std::string, std::vector<std::byte>, std::less<>> copy;
  for (const auto& [name, shard] : layout_.ShardsOf(rank_)) {
    auto b = shards.at(name);
    copy[name].assign(b.begin(), b.end());
  }
  KeepHostBaseline(std::move(copy), std::move(digests));
  return Status::OK();
}

Status ShardProducer::AdoptBaseline(
    std::map<std::string, std::vector<std::byte>, std::less<>> shards) {
  DCR_RETURN_IF_ERROR(CheckRank());
  ShardBytes view;
  for (const auto& [name, b] : shards) view.emplace(name, b);
  DCR_ASSIGN_OR_RETURN(auto digests, HashShardRegions(layout_, rank_, view));
  if (memory_) {
    DropBaseline();
    if (Status s =
            memory_->SetBaselineFromHost(OwnShards(layout_, rank_, view));
        !s.ok()) {
      DropBaseline();
      return s;
    }
    has_baseline_ = true;
    baseline_digests_ = std::move(digests);
    return Status::OK();
  }
  // Only the rank's shards are kept.
  const auto held = layout_.ShardsOf(rank_);
  std::erase_if(shards, [&](const auto& kv) { return !held.count(kv.first); });
  KeepHostBaseline(std::move(shards), std::move(digests));
  return Status::OK();
}

void ShardProducer::KeepHostBaseline(
    std::map<std::string, std::vector<std::byte>, std::less<>> shards,
    std::vector<LinearDigest> digests) {
  baseline_ = std::move(shards);
  has_baseline_ = true;
  baseline_digests_ = std::move(digests);
  last_target_digests_.reset();
  step_log_.Free();
  moved_ = false;
}

void ShardProducer::DropBaseline() {
  if (memory_) memory_->DropBaseline();
  baseline_.clear();
  has_baseline_ = false;
  baseline_digests_.clear();
  last_target_digests_.reset();
  last_fingerprints_.clear();
  step_log_.Free();
  moved_ = false;
}

void ShardProducer::Rewind() {
  if (moved_) {
    // (It wrote these very elements: they are there.)
    (void)step_log_.Back(&baseline_);
  }
  step_log_.Clear();
  moved_ = false;
  last_target_digests_.reset();
}

Result<ShardProducer::Step> ShardProducer::Diff(const ShardBytes& target,
                                                uint64_t span_elems,
                                                const PartSink& sink) {
  DCR_RETURN_IF_ERROR(CheckRank());
  if (!has_baseline()) {
    return Status::InvalidArgument(fmt::format(
        "rank {}: no baseline yet; set the committed shards first", rank_));
  }
  // A step not advanced: its diff is against the base.
  if (moved_) Rewind();
  Step step;
  step.base_digests = baseline_digests_;
  if (span_elems == 0) span_elems = span_elems_;
  if (memory_) {
    DCR_RETURN_IF_ERROR(DiffInMemory(target, span_elems, sink, &step));
    last_target_digests_ = step.target_digests;
    return step;
  }
  ShardBytes base;
  for (const auto& [name, b] : baseline_) base.emplace(name, b);
  // Hashed first: it checks every shard's presence and size before any
  // part goes out. (One pass over the target at memory speed costs less
  // than moving the baseline's digests by the changes, as the ShardMemory
  // path does, from about 1.5% of the elements changed on: the changed
  // elements' products form one serial chain.)
  DCR_ASSIGN_OR_RETURN(step.target_digests,
                       HashShardRegions(layout_, rank_, target));
  const PartSink keep = [&](const ChunkId& id, std::span<const std::byte> c) {
    step.chunks.emplace_back(id, std::vector<std::byte>(c.begin(), c.end()));
    return Status::OK();
  };
  ShardDiffStats stats;
  const uint64_t log_limit =
      step_log_bytes_ == kAutoStepLog ? baseline_bytes() / 4 : step_log_bytes_;
  step_log_.Clear(log_limit);  // its blocks kept from the last step
  Status diffed = DiffShardsEach(
      layout_, rank_, base, target,
      [&](CanonicalChanges&& changes) {
        return EncodeParts(layout_, rank_, std::span(&changes, 1),
                           ChunkKind::kXor, span_elems, encoder_.get(),
                           sink ? sink : keep, &step.sizes);
      },
      &stats, log_limit > 0 ? &step_log_ : nullptr);
  step.log_bytes = step_log_.bytes();
  if (diffed.ok() && log_limit > 0 && !step_log_.overflowed()) {
    // The baseline takes the bits the diff read (the parts carry them);
    // their base bits stay for Rewind.
    diffed = step_log_.Forward(&baseline_);
    moved_ = diffed.ok();
    step.logged = moved_;
  }
  if (!moved_) {
    // Past its bound the log is of no use, and would hold the bound.
    if (step_log_.overflowed()) {
      step_log_.Free();
    } else {
      step_log_.Clear();
    }
  }
  DCR_RETURN_IF_ERROR(diffed);
  step.changed = stats.changed;
  last_target_digests_ = step.target_digests;
  return step;
}

Status ShardProducer::DiffInMemory(const ShardBytes& target,
                                   uint64_t span_elems, const PartSink& sink,
                                   Step* step) {
  // Every shard's presence and size checked before any part goes out.
  DCR_RETURN_IF_ERROR(CheckShards(layout_, rank_, target));
  const auto shards = layout_.ShardsOf(rank_);
  // What Advance compares: the bits diffed here.
  std::map<std::string, Digest128, std::less<>> fingerprints;
  for (const auto& [name, info] : shards) {
    DCR_ASSIGN_OR_RETURN(fingerprints[name],
                         memory_->Fingerprint(target.at(name)));
  }
  const PartSink keep = [&](const ChunkId& id, std::span<const std::byte> c) {
    step->chunks.emplace_back(id, std::vector<std::byte>(c.begin(), c.end()));
    return Status::OK();
  };
  // The target's digest parts are the baseline's moved by the XOR masks of
  // the changed canonical elements (the digest is linear): no pass over
  // the shards.
  step->target_digests = baseline_digests_;
  std::vector<std::byte> mask;
  ShardDiffStats stats;
  DCR_RETURN_IF_ERROR(ProjectShardChanges(
      layout_, rank_,
      [&](const std::string& shard, ShardChanges* out) {
        return memory_->FindChanges(shard, DTypeSize(shards.at(shard).dtype),
                                    target.at(shard), out);
      },
      [&](CanonicalChanges&& changes) {
        MoveDigest(layout_, changes, &mask, &step->target_digests);
        return EncodeParts(layout_, rank_, std::span(&changes, 1),
                           ChunkKind::kXor, span_elems, encoder_.get(),
                           sink ? sink : keep, &step->sizes);
      },
      &stats));
  // The memory finds a shard's changes in more than one pass (the GPU's
  // reads the changed positions, then the base bits there). A shard
  // written meanwhile, by a kernel on a stream the caller did not wait
  // for, may give positions and values of two moments, and the digest
  // parts, derived from the masks, would vouch for them: each shard is
  // fingerprinted again, and the step fails (before DONE, so the refit
  // aborts) if one moved.
  for (const auto& [name, before] : fingerprints) {
    DCR_ASSIGN_OR_RETURN(Digest128 after,
                         memory_->Fingerprint(target.at(name)));
    if (after != before) {
      return Status::BaseMismatch(fmt::format(
          "rank {}: shard '{}' changed while it was diffed (is a kernel on "
          "another CUDA stream still writing it? synchronize the device "
          "before the refit); this step's parts must not commit",
          rank_, name));
    }
  }
  step->changed = stats.changed;
  last_fingerprints_ = std::move(fingerprints);
  return Status::OK();
}

Status ShardProducer::Advance(const ShardBytes& target) {
  DCR_RETURN_IF_ERROR(CheckRank());
  if (!last_target_digests_) {
    return Status::InvalidArgument(
        fmt::format("rank {}: nothing was diffed to advance to", rank_));
  }
  if (memory_) return AdvanceInMemory(target);
  if (moved_) {
    // The baseline holds the diffed bits already: what the tree got.
    baseline_digests_ = std::move(*last_target_digests_);
    last_target_digests_.reset();
    step_log_.Clear();
    moved_ = false;
    return Status::OK();
  }
  DCR_ASSIGN_OR_RETURN(auto digests, HashShardRegions(layout_, rank_, target));
  for (size_t i = 0; i < digests.size(); ++i) {
    if (digests[i] != (*last_target_digests_)[i]) {
      return Status::BaseMismatch(fmt::format(
          "rank {}: tensor '{}' is not what the last diff was given (did the "
          "trainer step again before the refit committed?)",
          rank_, layout_.tensors[i].name));
    }
  }
  for (auto& [name, b] : baseline_) {
    auto t = target.at(name);
    std::copy(t.begin(), t.end(), b.begin());
  }
  baseline_digests_ = std::move(digests);
  last_target_digests_.reset();
  return Status::OK();
}

Status ShardProducer::AdvanceInMemory(const ShardBytes& target) {
  DCR_RETURN_IF_ERROR(CheckShards(layout_, rank_, target));
  for (const auto& [name, fingerprint] : last_fingerprints_) {
    DCR_ASSIGN_OR_RETURN(Digest128 now, memory_->Fingerprint(target.at(name)));
    if (now != fingerprint) {
      return Status::BaseMismatch(fmt::format(
          "rank {}: shard '{}' is not what the last diff was given (did the "
          "trainer step again before the refit committed?)",
          rank_, name));
    }
  }
  if (Status s = memory_->Advance(OwnShards(layout_, rank_, target)); !s.ok()) {
    DropBaseline();  // partly copied, perhaps
    return s;
  }
  baseline_digests_ = std::move(*last_target_digests_);
  last_target_digests_.reset();
  last_fingerprints_.clear();
  return Status::OK();
}

}  // namespace dcr
