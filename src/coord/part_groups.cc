#include "coord/part_groups.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "dcr/placement.h"
#include "dcr/shard_delta.h"

namespace dcr {

PartGroups::PartGroups(const Layout& layout, uint64_t span_elems,
                       uint64_t cap_bytes)
    : reach_(layout.tensors.size()), cap_bytes_(cap_bytes) {
  for (size_t t = 0; t < layout.tensors.size(); ++t) {
    const LayoutTensor& lt = layout.tensors[t];
    for (const AffinePiece& p : lt.pieces) {
      const PieceMap m(p, lt.shape);
      if (m.elements() == 0) continue;
      reach_[t].push_back(
          Reach{p.rank, m.first() / span_elems, m.last() / span_elems});
      first_tensor_.emplace(p.rank, static_cast<uint32_t>(t));
    }
  }
}

Status PartGroups::Add(ProducerChunk chunk, const ChunkId& id) {
  const uint32_t rank = chunk.rank;
  const SpanKey key{id.tensor, id.span};
  auto last = last_.find(rank);
  if (last != last_.end() && !(last->second < key)) {
    return Status::InvalidArgument(fmt::format(
        "producer rank {} sent chunk ({}) after a chunk of tensor {} span {}: "
        "each producer's chunks ascend",
        rank, ChunkIdText(id), last->second.first, last->second.second));
  }
  bool holds = false;
  if (id.tensor < reach_.size()) {
    for (const Reach& r : reach_[id.tensor]) {
      holds |= r.rank == rank && r.first <= id.span && id.span <= r.last;
    }
  }
  if (!holds) {
    return Status::InvalidArgument(fmt::format(
        "producer rank {} sent chunk ({}), a span its pieces in the layout "
        "do not reach",
        rank, ChunkIdText(id)));
  }
  // The held spans this chunk may complete: its own, and those the rank
  // moved past since its last chunk (its chunks ascend, so each held span
  // is looked at once per rank at most).
  auto past =
      last != last_.end() ? held_.upper_bound(last->second) : held_.begin();
  for (; past != held_.end() && past->first < key; ++past) {
    recheck_.insert(past->first);
  }
  last_[rank] = key;
  if (alone_.contains(key)) {
    loose_.push_back(Group{id, {}});
    loose_.back().parts.push_back(std::move(chunk));
    return Status::OK();
  }
  held_bytes_ += chunk.chunk.size();
  held_[key].push_back(std::move(chunk));
  recheck_.insert(key);
  return Status::OK();
}

uint32_t PartGroups::LowestOpen() const {
  uint32_t lowest = static_cast<uint32_t>(reach_.size());
  for (const auto& [rank, first] : first_tensor_) {
    if (ended_.contains(rank)) continue;
    auto last = last_.find(rank);
    lowest = std::min(lowest, last != last_.end() ? last->second.first : first);
  }
  if (!held_.empty()) lowest = std::min(lowest, held_.begin()->first.first);
  for (const Group& g : loose_) lowest = std::min(lowest, g.id.tensor);
  return lowest;
}

void PartGroups::Ended(uint32_t rank) {
  ended_.insert(rank);
  for (const auto& [key, parts] : held_) recheck_.insert(key);
}

bool PartGroups::Complete(const SpanKey& key,
                          const std::vector<ProducerChunk>& parts) const {
  for (const Reach& r : reach_[key.first]) {
    if (key.second < r.first || key.second > r.last) continue;
    if (ended_.contains(r.rank)) continue;
    auto last = last_.find(r.rank);
    if (last != last_.end() && key < last->second) continue;
    const bool sent =
        std::any_of(parts.begin(), parts.end(),
                    [&](const ProducerChunk& c) { return c.rank == r.rank; });
    if (!sent) return false;
  }
  return true;
}

void PartGroups::Release(std::vector<ProducerChunk> parts, const SpanKey& key,
                         bool whole, std::vector<Group>* out) {
  for (const ProducerChunk& c : parts) held_bytes_ -= c.chunk.size();
  if (parts.size() == 1) {
    const uint16_t part = PartOf(parts[0].rank);
    out->push_back(Group{ChunkId{key.first, key.second, part}, {}, whole});
    out->back().parts = std::move(parts);
    return;
  }
  std::sort(parts.begin(), parts.end(),
            [](const ProducerChunk& a, const ProducerChunk& b) {
              return a.rank < b.rank;
            });
  ++grouped_spans_;
  grouped_parts_ += parts.size();
  out->push_back(
      Group{ChunkId{key.first, key.second, 0}, std::move(parts), true});
}

void PartGroups::Take(std::vector<Group>* out) {
  for (Group& g : loose_) out->push_back(std::move(g));
  loose_.clear();
  // Only spans whose completeness may have changed since the last Take,
  // in id order.
  for (const SpanKey& key : recheck_) {
    auto it = held_.find(key);
    if (it == held_.end() || !Complete(it->first, it->second)) continue;
    Release(std::move(it->second), it->first, /*whole=*/true, out);
    held_.erase(it);
  }
  recheck_.clear();
  while (held_bytes_ > cap_bytes_ && !held_.empty()) {
    auto it = held_.begin();
    alone_.insert(it->first);
    for (ProducerChunk& c : it->second) {
      std::vector<ProducerChunk> one;
      one.push_back(std::move(c));
      Release(std::move(one), it->first, /*whole=*/false, out);
    }
    held_.erase(it);
  }
}

void PartGroups::Flush(std::vector<Group>* out) {
  for (Group& g : loose_) out->push_back(std::move(g));
  loose_.clear();
  // Every rank ended: each held span has all its parts.
  for (auto& [key, parts] : held_) {
    Release(std::move(parts), key, /*whole=*/true, out);
  }
  held_.clear();
  recheck_.clear();
}

Status MergeParts(const ChunkId& id,
                  std::span<const std::span<const std::byte>> parts,
                  ChunkDecoder* decoder, DecodedChunk* merged) {
  if (parts.empty()) return Status::InvalidArgument("no part to compose");
  std::vector<DecodedChunk> d(parts.size());
  size_t total = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    DCR_RETURN_IF_ERROR(decoder->Decode(parts[k], &d[k]));
    const ChunkHeader& h = d[k].header;
    if (h.id.tensor != id.tensor || h.id.span != id.span ||
        h.kind != ChunkKind::kXor || h.encoding != ChunkEncoding::kSparse ||
        h.elem_size != d[0].header.elem_size ||
        h.span_elems != d[0].header.span_elems) {
      return Status::Corruption(fmt::format(
          "chunk ({}) cannot join the parts of tensor {} span {}: each must "
          "be a sparse XOR part of that span, of one element size and length",
          ChunkIdText(h.id), id.tensor, id.span));
    }
    total += d[k].positions.size();
  }
  if (d.size() == 1) {
    *merged = std::move(d[0]);
    return Status::OK();
  }
  const size_t w = d[0].header.elem_size;
  merged->header = d[0].header;
  std::vector<uint32_t>& positions = merged->positions;
  std::vector<std::byte>& values = merged->values;
  positions.clear();
  positions.reserve(total);
  values.resize(total * w);
  // Merge the parts' ascending positions a run at a time: the part whose
  // next position is lowest gives every position below the other parts'
  // next ones. Parts interleave in runs (a rank's columns of each row), so
  // this costs a comparison per element and a scan of the heads per run.
  constexpr uint64_t kNone = uint64_t{1} << 32;
  std::vector<size_t> next(d.size(), 0);
  for (;;) {
    size_t k = d.size();
    uint64_t low = kNone, second = kNone;
    for (size_t j = 0; j < d.size(); ++j) {
      if (next[j] == d[j].positions.size()) continue;
      const uint64_t p = d[j].positions[next[j]];
      if (p < low) {
        second = low;
        low = p;
        k = j;
      } else if (p < second) {
        second = p;
      }
    }
    if (k == d.size()) break;
    if (second == low) {
      return Status::Corruption(fmt::format(
          "two producers' parts of tensor {} span {} change element {}",
          id.tensor, id.span, low));
    }
    const std::vector<uint32_t>& from = d[k].positions;
    const size_t begin = next[k];
    size_t end = begin + 1;
    while (end < from.size() && from[end] < second) ++end;
    std::memcpy(values.data() + positions.size() * w,
                d[k].values.data() + begin * w, (end - begin) * w);
    positions.insert(positions.end(),
                     from.begin() + static_cast<ptrdiff_t>(begin),
                     from.begin() + static_cast<ptrdiff_t>(end));
    next[k] = end;
  }
  merged->header.changed = static_cast<uint32_t>(positions.size());
  return Status::OK();
}

Status ComposeParts(const ChunkId& id,
                    std::span<const std::span<const std::byte>> parts,
                    ChunkDecoder* decoder, ChunkEncoder* encoder,
                    std::vector<std::byte>* out, ChunkSizes* sizes) {
  DecodedChunk merged;
  DCR_RETURN_IF_ERROR(MergeParts(id, parts, decoder, &merged));
  return encoder->EncodeChanges(
      ChunkKind::kXor, ChunkId{id.tensor, id.span, 0}, merged.header.elem_size,
      merged.header.span_elems, merged.positions, merged.values, out, sizes);
}

}  // namespace dcr
