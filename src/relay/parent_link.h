// A relay's link up the tree during one refit: the parent's link and read
// gate, backpressure (pausing reads from the parent), liveness (heartbeats
// sent up, a silent parent detected), orphaning and adoption by a new
// parent (docs/PROTOCOL.md §"Heartbeats and re-parenting"), and the reply
// cache: what this relay answered upstream (its PLAN_REPLY and the last
// reply of a later phase), sent again to a new parent, and the last CHUNK
// position taken, which an adopter may ask for.
//
// Thread safety: the relay's actor thread only.
#ifndef DCR_RELAY_PARENT_LINK_H_
#define DCR_RELAY_PARENT_LINK_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dcr/transport.h"
#include "protocol/frame_sender.h"
#include "protocol/messages.h"
#include "relay/read_gate.h"

namespace dcr {

class ParentLink {
 public:
  using Clock = std::chrono::steady_clock;
  using CachedReply = std::pair<FrameType, std::vector<std::byte>>;

  // `about`: the refit's frame context (epoch, refit id) for frames this
  // link originates; `heartbeat`: the plan's interval (0: off).
  ParentLink(std::string node, FrameSender* sender, std::shared_ptr<Link> up,
             std::shared_ptr<ReadGate> gate, uint32_t parent_depth,
             std::chrono::milliseconds heartbeat);

  bool Is(const Link& link) const { return up_.get() == &link; }
  uint64_t link_id() const { return up_->id(); }
  uint32_t parent_depth() const { return depth_; }
  bool orphaned() const { return orphaned_; }
  bool paused() const { return paused_; }
  // Frames from the parent waiting for the relay's thread: their bytes, and
  // whether they stopped reading from it (the inbound quota).
  uint64_t waiting_bytes() const { return gate_->queued(); }
  bool held_by_waiting() const { return gate_->paused(ReadGate::kQueued); }
  Clock::time_point orphan_deadline() const { return orphan_deadline_; }

  // A frame came from the parent; a CHUNK at `position`.
  void Received() { last_rx_ = Clock::now(); }
  void ReceivedChunk(FramePosition position) {
    received_through_ = std::max(received_through_, position);
  }

  // Backpressure: stop or resume reading from the parent.
  void Pause();
  void Resume();

  // Caches `payload` as this subtree's answer of `type` and sends it up,
  // unless orphaned (a new parent gets it when it adopts this relay).
  // `receiving`: the relay still takes chunks (a PLAN_REPLY then carries
  // the position an adopter asked for).
  void Answer(FrameType type, const FrameHeader& about,
              std::vector<std::byte> payload, bool receiving);
  // Our PLAN_REPLY, with our position if `position` and still `receiving`
  // (a node that got END has named what it misses in its vote, or will).
  std::vector<std::byte> PlanReplyFor(bool position, bool receiving) const;
  const std::vector<std::byte>& plan_reply() const { return plan_reply_; }
  const std::optional<CachedReply>& last_reply() const { return last_reply_; }

  // The parent's link is gone: wait until `deadline` to be adopted (or for
  // the decision). False if already orphaned.
  bool Orphan(Clock::time_point deadline);
  // A new parent at `depth` adopted this relay on `link`; `resend`: it
  // asked for our position. Returns the old link (to close; null if the
  // same).
  std::shared_ptr<Link> Adopt(std::shared_ptr<Link> link,
                              std::shared_ptr<ReadGate> gate, uint32_t depth,
                              bool resend);

  // Heartbeat timer: sends a HEARTBEAT up when one is due, carrying
  // `progress()` (ProgressMsg, protocol/liveness.h), and between them, at
  // most every kProgressInterval, when its delivered bytes moved (the
  // root's progress bar: docs/PROTOCOL.md §"Progress"). Returns why the
  // parent counts as gone (silent for 4 intervals while reading), if so;
  // the caller closes the link and orphans the refit.
  std::optional<std::string> Heartbeat(
      const FrameHeader& about, Clock::time_point now,
      const std::function<ProgressMsg()>& progress);
  // Sends a HEARTBEAT with `progress` now (before a VOTE: the parent then
  // has the subtree's last delivered bytes with its vote), unless
  // heartbeats are off or the refit is orphaned.
  void SendProgress(const FrameHeader& about, const ProgressMsg& progress);
  // When Heartbeat wants to run next (max(): never).
  Clock::time_point NextHeartbeat() const;
  // This relay did not run for `gap` (a stopped process, a blocked
  // thread): the parent's frames may still wait in the socket, so the gap
  // does not count as the parent's silence.
  void Stalled(Clock::duration gap);

  // Closes the parent's link.
  void Close() { up_->Close(); }

  // How often delivered bytes go up at most (between heartbeats).
  static constexpr std::chrono::milliseconds kProgressInterval{250};

 private:
  std::string node_;
  FrameSender* sender_;
  std::shared_ptr<Link> up_;
  std::shared_ptr<ReadGate> gate_;
  std::chrono::milliseconds heartbeat_;
  uint32_t depth_;
  bool paused_ = false;
  bool orphaned_ = false;
  Clock::time_point orphan_deadline_;
  Clock::time_point last_rx_ = Clock::now();
  Clock::time_point last_heartbeat_ = Clock::now();
  std::optional<uint64_t> last_delivered_;       // in the last HEARTBEAT up
  Clock::time_point last_check_ = Clock::now();  // progress() last read
  std::vector<std::byte> plan_reply_;
  std::optional<CachedReply> last_reply_;
  // The last CHUNK taken from a parent; an adopter that asks for it
  // (PlanMsg::resend) resends what came after. While planning, whether the
  // PLAN_REPLY still to come goes to such an adopter.
  FramePosition received_through_;
  bool reply_position_ = false;
};

}  // namespace dcr

#endif  // DCR_RELAY_PARENT_LINK_H_
