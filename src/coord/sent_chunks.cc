#include "coord/sent_chunks.h"

#include <algorithm>

namespace dcr {

void SentChunks::Add(const ChunkId& id, const Sha256Digest& sha256,
                     const ChunkSizes& sizes, bool repair) {
  (repair ? repair_ : stream_).emplace_back(id.tensor, id.span);
  if (sign_) manifest_.push_back({id, sha256});
  if (!repair) stream_sizes_ += sizes;
}

EndMsg SentChunks::End() const {
  std::vector<std::pair<uint32_t, uint32_t>> ids = stream_;
  ids.insert(ids.end(), repair_.begin(), repair_.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return EndMsg(ids.size(), ChunkIdsDigest(ids));
}

std::vector<std::pair<uint32_t, uint32_t>> SentChunks::StreamIds() const {
  std::vector<std::pair<uint32_t, uint32_t>> ids = stream_;
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

}  // namespace dcr
