// The parts of one span that several producers change, gathered so that
// the tree gets them as one chunk (docs/design/producer-stream.md
// §"Parts that share a span").
//
// In a producers' refit every rank streams its own changes as parts of
// canonical spans, each rank in ascending (tensor, span) order. Where
// ranks' elements interleave within a span (the columns of a row-parallel
// split, a fused QKV, a padded vocabulary), each part rewrites the span
// at every store: R parts cost R reads and writes of it, at root.baseline
// and at every relay, and R journal records. PartGroups holds the parts
// of a span until no rank holding elements of it can send another (its
// stream moved past the span, or it ended), then releases them together;
// ProducerFeed codes a group of two or more as one whole-span chunk
// (ComposeParts), and with context coding every span released whole
// (Group::whole), one part or more.
//
// A span is released when every rank whose pieces (Layout) reach into it
// has sent its part of it, sent a chunk of a later span, or ended. A rank
// that holds no element of the span (by its pieces' bounds) is not waited
// for. What is held is bounded: past `cap_bytes`, the held spans are
// released from the lowest id up, each part on its own, and later parts
// of those spans pass through on their own too (a whole-span chunk must
// not follow parts of its span: they conflict at the receivers).
//
// Thread safety: none (the feed's fetch thread).
#ifndef DCR_COORD_PART_GROUPS_H_
#define DCR_COORD_PART_GROUPS_H_

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "coord/producer_hub.h"
#include "dcr/codec.h"
#include "dcr/layout.h"
#include "dcr/status.h"

namespace dcr {

class PartGroups {
 public:
  // One item of the stream: a rank's part as it came (`id` is its own), or
  // the parts of one span from two or more ranks in rank order (`id` is the
  // span's part 0).
  struct Group {
    ChunkId id;
    std::vector<ProducerChunk> parts;
    // `parts` are every change of the span: it was released complete (a
    // group, or a part no other rank could join), not past the cap. Such a
    // span can go as one whole-span chunk (part 0), coded in the context of
    // its base.
    bool whole = false;
  };

  PartGroups(const Layout& layout, uint64_t span_elems, uint64_t cap_bytes);

  // Rank `chunk.rank`'s part `id` (id.part is the rank's, checked by the
  // caller). InvalidArgument when the rank's chunks do not ascend, or the
  // span lies outside the bounds of the rank's pieces of the tensor.
  Status Add(ProducerChunk chunk, const ChunkId& id);
  // Rank `rank` sent its last chunk.
  void Ended(uint32_t rank);
  // Appends the parts that pass through alone, the groups that are
  // complete, and past the cap the lowest held spans' parts one by one.
  void Take(std::vector<Group>* out);
  // Appends everything held (every rank ended).
  void Flush(std::vector<Group>* out);

  // The lowest tensor of which an item may still come out (the layout's
  // tensor count when none may): a part held or not yet taken, or a part a
  // rank that has not ended may still send (of its last chunk's tensor or
  // a later one; before its first chunk, of the first tensor its pieces
  // reach). Every item of a tensor below it was taken. What a producers'
  // STREAM_MARK names.
  uint32_t LowestOpen() const;

  uint64_t held_bytes() const { return held_bytes_; }
  // Spans released as one group of two or more parts, and those parts.
  uint64_t grouped_spans() const { return grouped_spans_; }
  uint64_t grouped_parts() const { return grouped_parts_; }

 private:
  using SpanKey = std::pair<uint32_t, uint32_t>;  // (tensor, span)
  // A rank's piece of a tensor reaches spans [first, last].
  struct Reach {
    uint32_t rank = 0;
    uint64_t first = 0, last = 0;
  };
  bool Complete(const SpanKey& key,
                const std::vector<ProducerChunk>& parts) const;
  void Release(std::vector<ProducerChunk> parts, const SpanKey& key, bool whole,
               std::vector<Group>* out);

  std::vector<std::vector<Reach>> reach_;      // per tensor
  std::map<uint32_t, uint32_t> first_tensor_;  // per rank with pieces
  uint64_t cap_bytes_;
  std::map<SpanKey, std::vector<ProducerChunk>> held_;
  // Held spans that may have become complete since the last Take (a part
  // came, a rank holding elements of them moved past them or ended): Take
  // looks at these, not at every held span.
  std::set<SpanKey> recheck_;
  uint64_t held_bytes_ = 0;
  std::set<SpanKey> alone_;           // spans whose parts go out one by one
  std::vector<Group> loose_;          // their parts since the last Take
  std::map<uint32_t, SpanKey> last_;  // each rank's last span sent
  std::set<uint32_t> ended_;
  uint64_t grouped_spans_ = 0, grouped_parts_ = 0;
};

// Every change of `parts`, sparse XOR parts of span `id` (decoded with
// `decoder`), merged into `out` (header: the first part's; positions
// ascending, values their XOR masks). Corruption when a part does not
// decode, the parts disagree on the span's shape, or two parts change one
// element.
Status MergeParts(const ChunkId& id,
                  std::span<const std::span<const std::byte>> parts,
                  ChunkDecoder* decoder, DecodedChunk* out);

// The whole-span XOR chunk (part 0) carrying every change of `parts`
// (MergeParts, coded with `encoder`), appended to `out`.
Status ComposeParts(const ChunkId& id,
                    std::span<const std::span<const std::byte>> parts,
                    ChunkDecoder* decoder, ChunkEncoder* encoder,
                    std::vector<std::byte>* out, ChunkSizes* sizes);

}  // namespace dcr

#endif  // DCR_COORD_PART_GROUPS_H_
