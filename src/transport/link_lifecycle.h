// The lifecycle every link backend shares (TCP, UCX, the fake): Close,
// CloseAfterFlush, PauseReading and ResumeReading as include/dcr/transport.h
// specifies them, and a close that happens once and reports its reason to
// the handler once. A backend derives from LinkLifecycle, implements the
// hooks below and calls DoClose to close the link for any reason.
//
// It also keeps the link's drain watermarks and decides when OnDrained
// fires, so the hysteresis has one copy for every backend.
//
// Thread safety: the Link overrides may be called from any thread; they
// post to the event thread, where everything else here runs (the flags have
// no lock: only the event thread reads or writes them), except NoteQueued
// and SetWatermarks, which use atomics: Send runs on any thread.
#ifndef DCR_TRANSPORT_LINK_LIFECYCLE_H_
#define DCR_TRANSPORT_LINK_LIFECYCLE_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "dcr/status.h"
#include "dcr/transport.h"
#include "dcr/wire.h"

namespace dcr::transport_internal {

class LinkLifecycle : public Link {
 public:
  // DoClose(OK) on the event thread. Called there, no frame is sent or
  // delivered from the call on.
  void Close() final;
  // From the event thread's next turn, Send is refused (the backend's send
  // path checks flush_close()); closes with OK once Flushed().
  void CloseAfterFlush() final;
  // Stops handing frames to the handler (on the event thread: from the
  // call on) until ResumeReading.
  void PauseReading() final;
  // On the event thread: hands over the frames that waited (Deliver), then
  // AfterResume.
  void ResumeReading() final;
  // Any thread; see Link::SetWatermarks.
  void SetWatermarks(size_t high, size_t low) final;
  // Any thread: counts the frame as queued and hands it to the event
  // thread, where a link that is closing drops it, one whose queue went
  // over `max_queued` bytes closes (ResourceExhausted), and any other
  // passes it to the backend (Enqueue).
  void Send(FrameBuffer frame) final;
  size_t QueuedBytes() const final { return queued_.load(); }
  LinkStats stats() const final {
    return LinkStats{frames_sent_.load(), bytes_sent_.load(),
                     frames_received_.load(), bytes_received_.load()};
  }

  // Event thread. Closes the link for good, once: marks it closed, lets the
  // backend release what it holds (TearDown), reports `why` to the handler
  // (OK: closed by this side) and drops it, then AfterClosed. Later calls do
  // nothing.
  void DoClose(Status why);

 protected:
  // From the transport's options: `high` and `low`, its watermarks (until
  // SetWatermarks); `max_queued`, its send queue bound (0: none).
  LinkLifecycle(std::shared_ptr<LinkHandler> handler, size_t high, size_t low,
                size_t max_queued)
      : handler_(std::move(handler)),
        high_(high),
        low_(low),
        max_queued_(max_queued) {}

  // ---- drain watermarks, called by the backend
  // Any thread, from Send, with QueuedBytes() just after adding the frame
  // and before the frame is handed to the event thread: arms OnDrained if
  // it reached the high watermark. (Armed here rather than on the event
  // thread, so that a caller who saw the queue above `high` is sure to
  // hear when it drains: the frame's own write completion follows.)
  void NoteQueued(size_t queued);
  // Event thread, after a write completed and QueuedBytes() fell to
  // `queued`: calls OnDrained if armed and `queued` is at or below the low
  // watermark. Returns true if the link is closed after it (the handler
  // may close it): the caller then stops.
  [[nodiscard]] bool NoteWritten(size_t queued);

  // ---- hooks, implemented by the backend
  // Event thread. Queues a frame Send accepted (counted in queued_) and
  // starts writing if idle. The backend takes its bytes off queued_ as
  // they are written (or dropped at TearDown).
  virtual void Enqueue(FrameBuffer frame) = 0;
  // True iff called on the event thread of the link's transport.
  virtual bool OnEventThread() const = 0;
  // Runs `fn` on the event thread; false (dropping it) once stopping.
  virtual bool PostToEventThread(std::function<void()> fn) = 0;
  // Event thread. Nothing is queued or being written: a pending
  // CloseAfterFlush may close.
  virtual bool Flushed() const = 0;
  // Event thread. Hands decoded frames to the handler until paused or out
  // of frames (and reads more).
  virtual void Deliver() = 0;
  // Event thread, after a ResumeReading's Deliver. The default does nothing.
  virtual void AfterResume() {}
  // Event thread, from DoClose before the handler hears of it: release the
  // socket or endpoint, drop the send queue. `why` is DoClose's.
  virtual void TearDown(const Status& why) = 0;
  // Event thread, from DoClose after the handler heard of it (the fake
  // tells its peer end here). The default does nothing.
  virtual void AfterClosed() {}

  // Event thread. After a write completes: closes with OK if a
  // CloseAfterFlush is pending and Flushed(). Returns true if it closed.
  bool FinishFlushClose();
  // Event thread, for Deliver: hands the frames `decoder` has ready to the
  // handler, counting each, until the link is closing or paused or none is
  // left. A frame that does not decode closes the link (the error names
  // `peer`). Returns true iff the link may read more (neither closing nor
  // paused).
  bool DeliverDecoded(FrameDecoder& decoder, const std::string& peer);

  // Close was called on the event thread, or the link is closed: no more
  // frames in or out.
  bool closing() const { return closing_; }
  // DoClose has run (or is running): the handler is gone.
  bool closed() const { return closed_; }
  bool read_paused() const { return read_paused_; }
  // CloseAfterFlush was called: Send is refused.
  bool flush_close() const { return flush_close_; }
  // The handler; only while !closed().
  LinkHandler& handler() const { return *handler_; }

 protected:
  // The bytes Send queued and not yet written; the counters of stats().
  // The backend updates them as frames are written and read.
  std::atomic<size_t> queued_{0};
  std::atomic<uint64_t> frames_sent_{0}, bytes_sent_{0};
  std::atomic<uint64_t> frames_received_{0}, bytes_received_{0};

 private:
  // Event thread: Send's checks, then Enqueue.
  void Admit(FrameBuffer frame);

  std::shared_ptr<LinkHandler> handler_;  // reset once closed
  bool closing_ = false;
  bool closed_ = false;
  bool read_paused_ = false;
  bool flush_close_ = false;
  std::atomic<size_t> high_;
  std::atomic<size_t> low_;
  const size_t max_queued_;
  // The queue reached high_ since OnDrained last fired.
  std::atomic<bool> above_high_{false};
};

}  // namespace dcr::transport_internal

#endif  // DCR_TRANSPORT_LINK_LIFECYCLE_H_
