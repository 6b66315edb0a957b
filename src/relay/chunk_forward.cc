#include "relay/chunk_forward.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "relay/test_chunk_forgery.h"

namespace dcr {

FrameBuffer CorruptedCopy(std::span<const std::byte> bytes,
                          const FailpointHit& fp) {
  auto copy =
      std::make_shared<std::vector<std::byte>>(bytes.begin(), bytes.end());
  fp.Corrupt(*copy);
  return copy;
}

size_t ForwardChunk(Fanout& fanout, const FrameBuffer& frame,
                    const FailpointHit& fp, const FrameOptions& frames) {
  if (fp.drop()) return 0;
  if (fp.corrupt()) {
    return fanout.Forward(CorruptedCopy(*frame, fp), /*chunk=*/true,
                          /*keep=*/false);
  }
  if (fp.forge()) {
    FrameBuffer forged = TEST_ForgeChunkFrame(frame, frames);
    if (!forged) spdlog::error("forge failpoint: cannot forge this chunk");
    return fanout.Forward(forged ? forged : frame, /*chunk=*/true);
  }
  if (!fp.cut()) return fanout.Forward(frame, /*chunk=*/true);
  size_t keep = static_cast<size_t>(std::min<uint64_t>(fp.arg, frame->size()));
  size_t n = fanout.Forward(std::make_shared<std::vector<std::byte>>(
                                frame->begin(), frame->begin() + keep),
                            /*chunk=*/true, /*keep=*/false);
  fanout.CutLinks();
  return n;
}

}  // namespace dcr
