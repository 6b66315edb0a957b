#include "relay/parent_link.h"

#include <fmt/format.h>

#include <algorithm>

#include "relay/inbound_links.h"

namespace dcr {

ParentLink::ParentLink(std::string node, FrameSender* sender,
                       std::shared_ptr<Link> up, std::shared_ptr<ReadGate> gate,
                       uint32_t parent_depth,
                       std::chrono::milliseconds heartbeat)
    : node_(std::move(node)),
      sender_(sender),
      up_(std::move(up)),
      gate_(std::move(gate)),
      heartbeat_(heartbeat),
      depth_(parent_depth) {}

void ParentLink::Pause() {
  if (paused_) return;
  gate_->Set(ReadGate::kWindows, true);
  paused_ = true;
}

void ParentLink::Resume() {
  if (!paused_) return;
  gate_->Set(ReadGate::kWindows, false);
  paused_ = false;
  last_rx_ = Clock::now();  // its frames waited in the socket
}

void ParentLink::Answer(FrameType type, const FrameHeader& about,
                        std::vector<std::byte> payload, bool receiving) {
  if (type == FrameType::kPlanReply) {
    plan_reply_ = std::move(payload);
  } else {
    last_reply_.emplace(type, std::move(payload));
  }
  if (orphaned_) return;  // a new parent gets it when it adopts us
  if (type == FrameType::kPlanReply) {
    SendReply(*sender_, *up_, type, about,
              PlanReplyFor(reply_position_, receiving), node_);
  } else {
    SendReply(*sender_, *up_, type, about, last_reply_->second, node_);
  }
}

std::vector<std::byte> ParentLink::PlanReplyFor(bool position,
                                                bool receiving) const {
  if (!position || !receiving) return plan_reply_;
  auto reply = DecodeResults(plan_reply_);
  if (!reply.ok()) return plan_reply_;  // ours: cannot happen
  reply->received_through = received_through_;
  return EncodeResults(*reply);
}

bool ParentLink::Orphan(Clock::time_point deadline) {
  if (orphaned_) return false;
  orphaned_ = true;
  paused_ = false;  // that link is gone
  orphan_deadline_ = deadline;
  return true;
}

std::shared_ptr<Link> ParentLink::Adopt(std::shared_ptr<Link> link,
                                        std::shared_ptr<ReadGate> gate,
                                        uint32_t depth, bool resend) {
  std::shared_ptr<Link> old = std::move(up_);
  up_ = std::move(link);
  gate_ = std::move(gate);
  orphaned_ = false;
  paused_ = false;
  depth_ = depth;
  // The new parent has no figure of ours: send one at the next timer.
  last_delivered_.reset();
  last_check_ = Clock::time_point();
  last_rx_ = Clock::now();
  reply_position_ = resend;
  return old && old.get() != up_.get() ? old : nullptr;
}

std::optional<std::string> ParentLink::Heartbeat(
    const FrameHeader& about, Clock::time_point now,
    const std::function<ProgressMsg()>& progress) {
  if (heartbeat_.count() == 0 || orphaned_) return std::nullopt;
  const bool due = now - last_heartbeat_ >= heartbeat_;
  if (due || now - last_check_ >= kProgressInterval) {
    last_check_ = now;
    const ProgressMsg m = progress();
    if (due || m.delivered_bytes != last_delivered_) {
      last_heartbeat_ = now;
      last_delivered_ = m.delivered_bytes;
      SendReply(*sender_, *up_, FrameType::kHeartbeat, about, EncodeProgress(m),
                node_);
    }
  }
  // While we do not read from the parent (backpressure) its frames wait in
  // the socket: silence then says nothing.
  if (!paused_ && now - last_rx_ > 4 * heartbeat_) {
    return fmt::format("parent silent for {:.1f} s",
                       std::chrono::duration<double>(now - last_rx_).count());
  }
  return std::nullopt;
}

void ParentLink::Stalled(Clock::duration gap) {
  last_rx_ = std::min(Clock::now(), last_rx_ + gap);
}

void ParentLink::SendProgress(const FrameHeader& about,
                              const ProgressMsg& progress) {
  if (heartbeat_.count() == 0 || orphaned_) return;
  last_heartbeat_ = last_check_ = Clock::now();
  last_delivered_ = progress.delivered_bytes;
  SendReply(*sender_, *up_, FrameType::kHeartbeat, about,
            EncodeProgress(progress), node_);
}

ParentLink::Clock::time_point ParentLink::NextHeartbeat() const {
  if (heartbeat_.count() == 0 || orphaned_) return Clock::time_point::max();
  // Delivered bytes may have moved: look again after kProgressInterval.
  Clock::time_point next =
      std::min(last_heartbeat_ + heartbeat_, last_check_ + kProgressInterval);
  // The silence check; while paused, Resume restarts the clock.
  if (!paused_) {
    next = std::min(next,
                    last_rx_ + 4 * heartbeat_ + std::chrono::milliseconds(1));
  }
  return next;
}

}  // namespace dcr
