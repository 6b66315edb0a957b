#include "coord/sent_chunks.h"

#include <algorithm>

namespace dcr {

void SentChunks::Add(const ChunkId& id, const Sha256Digest& sha256,
                     const ChunkSizes& sizes, bool repair,
                     const Sha256Digest* also) {
  (repair ? repair_ : stream_).push_back(id);
  if (sign_) manifest_.push_back({id, sha256});
  if (sign_ && also != nullptr) manifest_.push_back({id, *also});
  if (!repair) stream_sizes_ += sizes;
}

EndMsg SentChunks::End() const {
  std::vector<ChunkId> ids = stream_;
  ids.insert(ids.end(), repair_.begin(), repair_.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  const uint64_t count = ids.size();
  return EndMsg(count, ChunkIdsDigest(std::move(ids)));
}

std::vector<std::pair<uint32_t, uint32_t>> SentChunks::StreamSpans() const {
  std::vector<std::pair<uint32_t, uint32_t>> ids;
  ids.reserve(stream_.size());
  for (const ChunkId& id : stream_) ids.emplace_back(id.tensor, id.span);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace dcr
