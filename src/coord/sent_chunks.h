// What the root sent in one refit: the chunk ids of the stream and of the
// repair rounds (END names every distinct one; the baseline update rewrites
// the spans of the stream), the signed manifest's entries, the chunk sizes
// and the target bytes scanned so far (progress).
//
// Thread safety: Add* from the producer thread while it runs, read by the
// coordinator thread after it joined; scanned() is atomic and may be read
// and bumped at any time.
#ifndef DCR_COORD_SENT_CHUNKS_H_
#define DCR_COORD_SENT_CHUNKS_H_

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "dcr/codec.h"
#include "protocol/messages.h"
#include "protocol/refit_manifest.h"

namespace dcr {

class SentChunks {
 public:
  // `on`: keep every chunk's hash for the signed manifest.
  void set_sign(bool on) { sign_ = on; }

  // A chunk of the stream (repair: of a repair round) went into the queue.
  // `also`: the hash of the same chunk in its second encoding, sent to
  // the subtrees of a mixed tree that take no context-coded chunks: the
  // manifest lists the chunk once per encoding (docs/PROTOCOL.md §"Signed
  // refits").
  void Add(const ChunkId& id, const Sha256Digest& sha256,
           const ChunkSizes& sizes, bool repair,
           const Sha256Digest* also = nullptr);

  // END for every distinct chunk id sent so far (unsigned).
  EndMsg End() const;
  // The spans the stream changed as (tensor, span), sorted and distinct
  // (the parts of a span are one span).
  std::vector<std::pair<uint32_t, uint32_t>> StreamSpans() const;
  // Every chunk sent with its hash, in order (empty unless signing).
  const std::vector<ManifestEntry>& manifest() const { return manifest_; }
  // Elements the stream changed (repair rounds not counted).
  uint64_t changed_elements() const { return stream_sizes_.changed; }
  std::atomic<uint64_t>* scanned() { return &scanned_; }

 private:
  bool sign_ = false;
  std::vector<ChunkId> stream_;
  std::vector<ChunkId> repair_;
  std::vector<ManifestEntry> manifest_;
  ChunkSizes stream_sizes_;
  std::atomic<uint64_t> scanned_{0};
};

}  // namespace dcr

#endif  // DCR_COORD_SENT_CHUNKS_H_
