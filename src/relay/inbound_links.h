// The links other nodes open to a relay (its parent, adopters, `dcr
// status` clients): admission (at most max_links open, the rest closed as
// they open), a read gate per link (ReadGate: a per-peer quota and the
// refit's backpressure), the allowlist of peer addresses, and the HELLO
// every link must open with. Frames of greeted links go on to the relay.
// Also the two frames a relay answers on any link: a reply and an ERROR.
//
// Thread safety: the LinkHandler (Handler()) runs on the listening
// transport's event thread and only posts to the relay's Mailbox, except
// for the gate bookkeeping it keeps to itself; everything else (GateOf,
// PeerNode and the callbacks) runs on the relay's actor thread.
#ifndef DCR_RELAY_INBOUND_LINKS_H_
#define DCR_RELAY_INBOUND_LINKS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dcr/transport.h"
#include "protocol/frame_sender.h"
#include "protocol/mailbox.h"
#include "protocol/messages.h"
#include "relay/read_gate.h"

namespace dcr {

// Sends `type` in reply to the frame whose header is `about`; logs (as
// `node`) a frame it cannot encode.
void SendReply(FrameSender& sender, Link& link, FrameType type,
               const FrameHeader& about, std::span<const std::byte> payload,
               const std::string& node);
// Sends an ERROR frame carrying `message`.
void SendError(FrameSender& sender, Link& link, const std::string& message);

class InboundLinks {
 public:
  struct Options {
    std::string node;
    // IP addresses (as Link::peer() prints them, without the port) links
    // may come from; empty: any.
    std::vector<std::string> peer_addresses;
    size_t max_links = 0;      // 0: no limit
    uint64_t quota_bytes = 0;  // per link; 0: none
  };
  // Actor thread: a frame of a greeted link (not its HELLO), and a link
  // that closed.
  using FrameFn = std::function<void(const std::shared_ptr<Link>&, const Frame&,
                                     const FrameBuffer&)>;
  using ClosedFn = std::function<void(uint64_t link_id, const Status&)>;
  struct Counters {
    std::atomic<uint64_t>* refused = nullptr;  // links closed as they opened
    std::atomic<uint64_t>* pauses = nullptr;   // quota pauses
  };

  InboundLinks(Options options, Mailbox* mailbox, FrameSender* sender,
               Counters counters, FrameFn on_frame, ClosedFn on_closed);

  // For Transport::Listen.
  std::shared_ptr<LinkHandler> Handler();

  // Actor thread. `epoch`: the highest coordinator epoch accepted, which
  // HELLO replies carry.
  void set_epoch(uint64_t epoch) { epoch_ = epoch; }
  // The read gate of an inbound link (one the listener did not open gets
  // one that only the windows close).
  std::shared_ptr<ReadGate> GateOf(Link& link);
  // The node a link's HELLO named ("" before it greeted).
  std::string PeerNode(uint64_t link_id) const;

 private:
  class Handler_;
  struct Inbound {
    std::shared_ptr<Link> link;
    std::shared_ptr<ReadGate> gate;
    bool greeted = false;
    HelloMsg hello;
  };
  void OnFrame(const std::shared_ptr<Link>& link, const Frame& frame,
               const FrameBuffer& buffer);
  void OnClosed(uint64_t link_id, const Status& why);
  bool Allowed(Link& link);

  Options options_;
  Mailbox* mailbox_;
  FrameSender* sender_;
  Counters counters_;
  FrameFn on_frame_;
  ClosedFn on_closed_;
  uint64_t epoch_ = 0;
  std::map<uint64_t, Inbound> inbound_;  // actor thread
};

}  // namespace dcr

#endif  // DCR_RELAY_INBOUND_LINKS_H_
