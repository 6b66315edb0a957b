// Relay::Impl's object store path (relay_impl.h; docs/PROTOCOL.md
// §"Chunks through an object store"): a head of a source: objstore
// cluster reads its refit's CHUNK and END frames from the store
// (ObjectPuller) and routes each as a frame from its parent link; when the
// store refuses it, the END from the link ends the round and its vote is
// no (Advance vetoes it).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <utility>

#include "relay/relay_impl.h"

namespace dcr {

void Relay::Impl::StartPuller(const RefitId& id) {
  spdlog::info("{}: pulling refit {}'s chunks from {}", options_.name,
               id.ToHex(), options_.objects->describe());
  current_->puller = std::make_unique<ObjectPuller>(
      options_.objects.get(), id.ToHex(),
      [this, id](FrameBuffer frame) {
        mailbox_.Post(
            [this, id, frame = std::move(frame)] { OnPulledFrame(id, frame); });
      },
      [this, id](Status why) {
        mailbox_.Post(
            [this, id, why = std::move(why)] { OnPullFailed(id, why); });
      });
}

void Relay::Impl::OnPulledFrame(const RefitId& refit,
                                const FrameBuffer& buffer) {
  if (!current_ || current_->refit->id() != refit || !current_->puller) {
    return;  // the refit ended while the object was on its way
  }
  current_->puller->Consumed(buffer->size());
  Result<Frame> frame = ParseFrame(*buffer, options_.transport_options.frames);
  if (!frame.ok() ||
      (frame->type() != FrameType::kChunk &&
       frame->type() != FrameType::kEnd) ||
      frame->header.refit_id != refit ||
      frame->header.epoch < current_->refit->epoch()) {
    counters_.chunks_dropped += 1;
    spdlog::warn(
        "{}: dropping an object of refit {}: {}", options_.name, refit.ToHex(),
        !frame.ok()
            ? frame.status().ToString()
            : fmt::format("a {} of refit {} epoch {}",
                          FrameTypeName(frame->type()),
                          frame->header.refit_id.ToHex(), frame->header.epoch));
    return;
  }
  if (frame->header.epoch > current_->refit->epoch()) {
    // Uploaded by a resumed coordinator (dcr refit --resume).
    if (!PersistEpoch(frame->header.epoch).ok()) return;
    current_->refit->set_epoch(frame->header.epoch);
  }
  // The store's END ends this round: the link's copy is not needed.
  if (frame->type() == FrameType::kEnd) current_->link_end = nullptr;
  counters_.bytes_in += buffer->size();
  OnRefitFrame(*frame, buffer);
}

void Relay::Impl::OnPullFailed(const RefitId& refit, const Status& why) {
  if (!current_ || current_->refit->id() != refit || !current_->puller) return;
  Current& c = *current_;
  c.pull_failed = why.ToString();
  spdlog::error("{}: cannot read refit {}'s chunks from {}: {}", options_.name,
                refit.ToHex(), options_.objects->describe(), c.pull_failed);
  // Only a round still waiting for its END (not one the store's END ended,
  // nor an END of an older epoch) takes the link's copy; without one yet,
  // the END from the link will end the stream.
  const FrameBuffer end_buffer = std::exchange(c.link_end, nullptr);
  if (!end_buffer || c.refit->phase() != RefitPhase::kReceiving) return;
  Result<Frame> end =
      ParseFrame(*end_buffer, options_.transport_options.frames);
  if (end.ok() && end->header.epoch == c.refit->epoch()) {
    OnRefitFrame(*end, end_buffer);
  }
}

}  // namespace dcr
