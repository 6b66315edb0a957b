#include "coord/span_encoder.h"

#include <algorithm>

#include "wire/signature.h"

namespace dcr {

SpanEncoder::SpanEncoder(Options options, Kind kind,
                         std::vector<uint32_t> tensors)
    : options_(options), kind_(kind) {
  if (kind_ == Kind::kCompose || kind_ == Kind::kRepair) {
    items_ = options_.composed->ids();
    return;
  }
  const Manifest& m = options_.target->manifest();
  if (tensors.empty()) {
    tensors.resize(m.size());
    for (size_t t = 0; t < m.size(); ++t) tensors[t] = static_cast<uint32_t>(t);
  }
  for (uint32_t t : tensors) {
    uint64_t spans = SpanCount(m[t].NumElements(), options_.span_elems);
    for (uint64_t s = 0; s < spans; ++s) {
      items_.push_back({t, static_cast<uint32_t>(s)});
    }
  }
}

Status SpanEncoder::Prepare(size_t workers) {
  encoders_.resize(workers);
  for (auto& e : encoders_) {
    EncodeOptions eo;
    eo.compress = options_.compress;
    DCR_ASSIGN_OR_RETURN(e, ChunkEncoder::Create(eo));
  }
  decoders_.resize(kind_ == Kind::kCompose || kind_ == Kind::kRepair ? workers
                                                                     : 0);
  scratch_.resize(decoders_.size());
  for (auto& d : decoders_) {
    DCR_ASSIGN_OR_RETURN(d, ChunkDecoder::Create());
  }
  return Status::OK();
}

Status SpanEncoder::Encode(size_t i, size_t worker, EncodedChunk* out) {
  const ChunkId id = items_[i];
  const TensorInfo& info = options_.target->manifest()[id.tensor];
  const size_t es = DTypeSize(info.dtype);
  const uint64_t span_elems = options_.span_elems;
  const uint64_t first = uint64_t{id.span} * span_elems;
  const uint64_t count = std::min(span_elems, info.NumElements() - first);
  auto target =
      options_.target->TensorData(id.tensor).subspan(first * es, count * es);
  Status s;
  switch (kind_) {
    case Kind::kCompose: {
      auto changed = options_.composed->Encode(
          i, es, target, encoders_[worker].get(), decoders_[worker].get(),
          &scratch_[worker], &out->bytes, &out->sizes);
      s = changed.ok() ? Status::OK() : changed.status();
      break;
    }
    case Kind::kRepair: {
      auto changed = options_.composed->EncodeUnion(
          i, es, target, encoders_[worker].get(), decoders_[worker].get(),
          &scratch_[worker], &out->bytes, &out->sizes);
      s = changed.ok() ? Status::OK() : changed.status();
      break;
    }
    case Kind::kFull:
      s = encoders_[worker]->EncodeFull(id, es, target, &out->bytes,
                                        &out->sizes);
      break;
    case Kind::kDiff: {
      auto base =
          options_.baseline->Tensor(id.tensor).subspan(first * es, count * es);
      auto changed = encoders_[worker]->EncodeDiffInContext(
          ChunkKind::kXor, id, es,
          options_.context ? ExponentFieldOf(info.dtype) : ExponentField(),
          base, target, &out->bytes, &out->sizes,
          options_.base_independent ? &out->base_independent : nullptr);
      s = changed.ok() ? Status::OK() : changed.status();
      break;
    }
  }
  // The span is in cache now: its share of the target's digests costs
  // little more here than in a pass of its own.
  if (options_.digests && s.ok()) options_.digests->Offer(id);
  if (options_.hash && s.ok() && !out->bytes.empty()) {
    out->sha256 = Sha256(out->bytes);
    if (options_.hash_base_independent && !out->base_independent.empty()) {
      out->base_independent_sha256 = Sha256(out->base_independent);
    }
  }
  if (options_.scanned) *options_.scanned += count * es;
  return s;
}

}  // namespace dcr
