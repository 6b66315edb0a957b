// The in-process fake backend of dcr/transport.h, for unit tests of the
// relay and the coordinator: deterministic, no sockets, with fault hooks.
//
// A FakeNetwork runs one event thread shared by every transport created on
// it, so the handlers of all simulated nodes run one at a time in a
// repeatable order. A transport is an endpoint named by options.name;
// Listen(host, port) registers the address "host:port" (port 0 picks a
// fresh one), and Connect to that address opens a link whose two ends
// belong to the two endpoints. Frames are delivered in order, one per event
// loop turn, through a FrameDecoder at the receiving end, so a corrupted or
// truncated frame is detected as it would be on TCP.
//
// Faults act on one direction, (sender endpoint name, receiver endpoint
// name), for every link between the two. A frame the receiver does not take
// (paused direction, receiver PauseReading) stays in the sender's queue, so
// the sender's QueuedBytes grows as it would behind a slow TCP peer.
//
// Thread safety: every member may be called from any thread except the
// network's event thread (they wait for it).
#ifndef DCR_TRANSPORT_FAKE_TRANSPORT_H_
#define DCR_TRANSPORT_FAKE_TRANSPORT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "dcr/status.h"
#include "dcr/transport.h"

namespace dcr {

namespace fake_internal {
struct Core;
}

// Faults for one direction. Frame and byte counts start at SetFaults (the
// first frame after it is frame 1); each fault fires at most once.
struct FakeFaults {
  // Every frame sent from now on is delivered this long after Send.
  std::chrono::microseconds delay{0};
  // The Nth frame vanishes (the receiver sees a gap in the sequence).
  std::optional<uint64_t> drop_frame;
  // The Nth frame arrives with byte corrupt_offset (modulo its size)
  // XORed with corrupt_mask; the receiver's decoder rejects it and closes
  // the link with Corruption.
  std::optional<uint64_t> corrupt_frame;
  size_t corrupt_offset = kFrameHeaderSize;
  uint8_t corrupt_mask = 0x01;
  // The link is cut (both ends: IOError) once this many bytes have been
  // delivered, possibly in the middle of a frame.
  std::optional<uint64_t> cut_after_bytes;
  // The link is cut once this many whole frames have been delivered.
  std::optional<uint64_t> cut_after_frames;
};

// What happened in one direction, since the network started.
struct FakeDirectionStats {
  uint64_t frames_sent = 0;  // taken from a sender's queue
  uint64_t frames_delivered = 0;
  uint64_t frames_dropped = 0;
  uint64_t frames_corrupted = 0;
  uint64_t bytes_delivered = 0;
  uint64_t cuts = 0;
};

class FakeNetwork {
 public:
  static std::shared_ptr<FakeNetwork> Create();
  // Closes every link and stops the event thread; transports still alive
  // then refuse new work.
  ~FakeNetwork();
  FakeNetwork(const FakeNetwork&) = delete;
  FakeNetwork& operator=(const FakeNetwork&) = delete;

  // A transport whose endpoint is named options.name (unique while it
  // lives). Also reached through CreateTransport("fake", options) with
  // options.fake_network set.
  Result<std::unique_ptr<Transport>> CreateTransport(
      const TransportOptions& options);

  // Replaces the faults of the direction from -> to and restarts its
  // counts.
  void SetFaults(std::string_view from, std::string_view to,
                 const FakeFaults& faults);
  // Holds frames from -> to in the senders' queues until Resume.
  void Pause(std::string_view from, std::string_view to);
  void Resume(std::string_view from, std::string_view to);
  FakeDirectionStats Stats(std::string_view from, std::string_view to) const;

  // Returns once the event thread ran everything posted before the call
  // (frames held back by a delay or a pause may still be pending).
  void Sync() const;

 private:
  FakeNetwork();
  std::shared_ptr<fake_internal::Core> core_;
};

}  // namespace dcr

#endif  // DCR_TRANSPORT_FAKE_TRANSPORT_H_
