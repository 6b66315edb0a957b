// One UCX link: an endpoint's byte stream through a FrameDecoder, its
// send queue under the peer's credit window, and its close (a bye, then
// lingering until the peer has read everything). Lives on the transport's
// event thread (ucx_shared.h); the Link calls other threads make reach it
// through LinkLifecycle, which posts them there.
#ifndef DCR_TRANSPORT_UCX_UCX_LINK_H_
#define DCR_TRANSPORT_UCX_UCX_LINK_H_

#include <ucp/api/ucp.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dcr/transport.h"
#include "dcr/wire.h"
#include "transport/link_lifecycle.h"
#include "transport/ucx/ucx_shared.h"

namespace dcr::ucx_internal {

class UcxLink final : public transport_internal::LinkLifecycle {
 public:
  UcxLink(std::shared_ptr<UcxShared> shared, ucp_ep_h ep, std::string peer,
          std::shared_ptr<LinkHandler> handler);

  // Event thread: registers the link, announces it and starts reading.
  void Start();

  const std::string& peer() const override { return peer_; }
  uint64_t id() const override { return id_; }

  // Event thread (DoClose). Lets the endpoint go: after a bye (local
  // close, OK) it lingers until the peer has read everything; otherwise it
  // is cut.
  void TearDown(const Status& why) override;

  // Event thread: what UCX reported for this link.
  void OnSendDone(const Op& op);
  void OnRecvDone(const Op& op);
  void OnCtl(const CtlMsg& m);
  void OnEpError(ucs_status_t status);

 private:
  bool OnEventThread() const override { return shared_->InThread(); }
  bool PostToEventThread(std::function<void()> fn) override;
  bool Flushed() const override { return queue_.empty() && in_flight_ == 0; }

  std::shared_ptr<UcxLink> Self();

  Status PeerGone(ucs_status_t status) const;

  // After the peer's bye, every byte it sent has been read: close.
  void CheckBye();

  void Enqueue(FrameBuffer frame) override;

  // Posts queued frames while the window and max_write_gather allow; each
  // is sent from its own buffer, which the Op holds until completion.
  void Pump();

  void DoRead();

  // Hands decoded frames to the handler until paused or out of frames,
  // then reads more (or closes if the peer is gone).
  void Deliver() override;

  const std::shared_ptr<UcxShared> shared_;
  ucp_ep_h ep_;  // null once closed
  const std::string peer_;
  const uint64_t id_;
  FrameDecoder decoder_;
  std::vector<std::byte> read_buf_;  // the one receive in flight fills it
  std::deque<FrameBuffer> queue_;    // not yet handed to UCX
  size_t in_flight_ = 0;             // sends handed to UCX, not completed
  size_t in_flight_bytes_ = 0;       // their bytes
  uint64_t sent_total_ = 0;          // stream bytes handed to UCX
  uint64_t credited_total_ = 0;      // of which the peer has read
  uint64_t unreported_ = 0;          // read here, not yet credited
  uint64_t bye_total_ = 0;
  bool peer_bye_ = false;
  std::optional<Status> pending_close_;  // the peer is gone; deliver first
  bool reading_ = false;
  bool ep_failed_ = false;
};

}  // namespace dcr::ucx_internal

#endif  // DCR_TRANSPORT_UCX_UCX_LINK_H_
