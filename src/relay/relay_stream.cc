// The stream's frames at a relay: CHUNKs (forwarded, then applied) and
// a producers' coordinator's STREAM_MARKs (docs/PROTOCOL.md §"Producers").
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>

#include "common/failpoint.h"
#include "relay/chunk_forward.h"
#include "relay/relay_impl.h"

namespace dcr {

void Relay::Impl::OnChunk(const Frame& frame, const FrameBuffer& buffer) {
  Current& c = *current_;
  counters_.chunks_received += 1;
  Result<bool> repair = c.refit->Chunk();
  if (!repair.ok()) {
    counters_.chunks_dropped += 1;
    return;
  }
  if (*repair) c.fanout->Stream();
  if (!c.first_chunk) {
    // How soon data flows after PLAN (bench/refit_e2e reads it: the
    // object store path's construction overlap).
    c.first_chunk = true;
    spdlog::info(
        "{}: first chunk of refit {} {} s after its PLAN ({})", options_.name,
        c.refit->id().ToHex(),
        fmt::format(
            "{:.3f}",
            std::chrono::duration<double>(Clock::now() - c.started).count()),
        c.puller ? "from the object store" : "from the link");
  }
  c.parent->ReceivedChunk(
      FramePosition{frame.header.epoch, frame.header.sequence});
  c.progress.Received(buffer->size());
  SampleProgress();
  // Cut-through: the children get the chunk before it is applied here.
  counters_.chunks_forwarded +=
      ForwardChunk(*c.fanout, buffer, DCR_FAILPOINT("relay.forward"),
                   options_.transport_options.frames);
  c.refit->Apply(buffer, frame.payload);
  MaybePause();
}

void Relay::Impl::OnStreamMark(const Frame& frame, const FrameBuffer& buffer) {
  auto mark = DecodeStreamMark(frame.payload);
  if (!mark.ok()) {
    spdlog::warn("{}: bad STREAM_MARK: {}", options_.name,
                 mark.status().ToString());
    return;
  }
  // Behind the chunks already forwarded, so in order below too.
  current_->refit->StreamPassed(mark->tensor);
  current_->fanout->Hint(buffer);
}

}  // namespace dcr
