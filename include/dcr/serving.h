// Serving processes on a relay's store (docs/PLACEMENT.md §"Serving
// processes", docs/PROTOCOL.md §"The pause protocol").
//
// A relay with a serving process attached (topology `serving.socket`,
// dcr-relay --serving-socket) keeps its shm store twice, as two complete
// images "/NAME.0" and "/NAME.1", each with its own version record:
//
//   live     the image the server computes on; it holds a committed
//            version and nothing writes it.
//   standby  the image refits stage on: chunks apply there, the vote
//            hashes it, an abort restores it. The server never reads it.
//
// At COMMIT the relay commits the standby, then flips: the header
// "/NAME.live" names it live, and the server, told over the relay's Unix
// socket, re-points its weights between two steps. The pause is the time
// from COMMIT reaching the node to the server's answer. Once the server
// left the old image, the relay copies the new live image over it (the
// catch-up) and it becomes the next refit's standby. Memory: two images
// of the rank's store (FP8 shadows included), nothing else.
//
// Reader locks. Whether a process computes on an image is not left to
// messages: a serving process holds a shared flock on "/NAME.<i>.readers"
// while it computes on image i, and the relay writes image i (catch-up,
// staging) only while it holds that lock exclusively. A server that
// dies releases it; one that is alive but detached, socket-less or slow
// keeps the relay off its image.
//
// Thread safety: LiveHeader's Read may run in any process and thread
// while the relay's Write runs (a sequence lock); Write from one thread
// of one process at a time. A ServingReceiver is not thread-safe: one
// thread calls it (the serving loop).
#ifndef DCR_SERVING_H_
#define DCR_SERVING_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "common/file.h"
#include "dcr/checkpoint.h"
#include "dcr/status.h"
#include "dcr/store.h"
#include "dcr/version.h"

namespace dcr {

class PauseLink;  // serving/pause_link.h
struct PauseMsg;  // serving/pause_messages.h

// The spec of image `image` (0 or 1) of the shm store `spec`: "/NAME.0" or
// "/NAME.1", its record at the default path, or at spec.record_path with
// ".<image>" before its ".dcr-version".
StoreSpec ServingImageSpec(const StoreSpec& spec, uint32_t image);

// The shm object that names the live image: "/NAME.live".
std::string LiveHeaderName(const StoreSpec& spec);

// Image `image`'s reader lock "/NAME.<image>.readers" (created if
// missing), flocked `exclusive` (the relay) or shared (a server), without
// waiting. Aborted when the other side holds it.
Result<UniqueFd> LockImage(const StoreSpec& spec, uint32_t image,
                           bool exclusive);

// What the header says.
struct LiveState {
  uint32_t image = 0;  // 0 or 1: the image a server computes on
  Version version;     // the version committed there
  uint64_t flips = 0;  // how often the live image changed
  friend bool operator==(const LiveState&, const LiveState&) = default;
};

// The header: a 64-byte shm object, "DCRLIVE1", a sequence number and the
// state (docs/FORMAT.md §"Live header"). Exists once a relay committed its
// first image.
class LiveHeader {
 public:
  // Opens "/NAME.live" (`name` with its slash), for Write too when
  // `writable`; NotFound when missing.
  static Result<LiveHeader> Open(const std::string& name,
                                 bool writable = false);
  // Creates it (or opens an existing one) holding `state`: the relay's
  // first commit.
  static Result<LiveHeader> Create(const std::string& name,
                                   const LiveState& state);
  // Removes the object; OK when missing.
  static Status Remove(const std::string& name);

  LiveHeader(LiveHeader&&) noexcept;
  LiveHeader& operator=(LiveHeader&&) noexcept;
  ~LiveHeader();

  // A consistent state (retries while a Write is under way); Corruption
  // when the bytes are not a header.
  Result<LiveState> Read() const;
  void Write(const LiveState& state);

  struct Raw;  // the 64 shared bytes (live_header.cc)

 private:
  explicit LiveHeader(Raw* raw) : raw_(raw) {}
  Raw* raw_ = nullptr;
};

// The serving side of the pause protocol (Python: dcr.Receiver): maps both
// images of a relay's store read-only and gives the tensors of the live
// one; Poll() between two steps of the serving loop answers the relay and
// moves to the other image when the relay flipped. A server computes only
// on a committed version and never on two: the tensors change only in
// Poll().
class ServingReceiver {
 public:
  struct Options {
    StoreSpec store;     // the relay's store, shm:NAME
    std::string socket;  // the relay's serving socket; empty: none
    // How long Open waits for the header (a relay's first commit).
    std::chrono::milliseconds wait{0};
  };
  static Result<std::unique_ptr<ServingReceiver>> Open(const Options& options);
  ~ServingReceiver();
  ServingReceiver(const ServingReceiver&) = delete;
  ServingReceiver& operator=(const ServingReceiver&) = delete;

  // The version the tensors hold and the image they are in.
  const LiveState& live() const { return live_; }
  const Manifest& manifest() const;
  // Tensor `i` of the manifest, in the image it reads now.
  std::span<const std::byte> Tensor(size_t i) const;
  // Keeps the mapping of the image Tensor() views now alive, after the
  // receiver moved on or was destroyed (Python tensors hold one).
  std::shared_ptr<const void> Pin() const;

  // Answers what the relay sent (a prepare: ready), moves to the live
  // image if the header names another (then tells the relay), and
  // reconnects to the socket when the relay restarted. True iff the
  // tensors moved: views taken before are of the old image (they stay
  // readable, Pin()). With `move` false it answers but does not move:
  // ranks of one server that must move together (tensor parallel) first
  // agree on Pending(); until this process moves, the relay does not
  // touch the image it reads.
  Result<bool> Poll(bool move = true);
  // The state the header names when it is another image than the one
  // the tensors are in (a move is due), else nullopt.
  Result<std::optional<LiveState>> Pending() const;
  // Connected to the relay's socket.
  bool attached() const;
  // Refits the relay asked about (prepare), for tests.
  uint64_t prepares() const { return prepares_; }

 private:
  class Image;
  explicit ServingReceiver(Options options);
  Status Move(const LiveState& state);

  Options options_;
  std::optional<LiveHeader> header_;
  std::shared_ptr<Image> images_[2];
  std::unique_ptr<PauseLink> port_;
  UniqueFd reader_lock_;  // shared, on the image the tensors are in
  LiveState live_;
  uint64_t prepares_ = 0;
};

// The serving side for a server that computes on weights in its own GPU
// memory (docs/PROTOCOL.md §"GPU servers"; Python: dcr.GpuReceiver). The
// server exports its weight tensors over CUDA IPC (dcr_cuda.Exporter, or
// dcr/cuda.h IpcServer) and the relay writes them; this class tells the
// server when it may compute on them. Call Poll() between two steps and
// compute only while usable(): from the relay's answer that it attached
// the buffers at the live version, and again after each commit.
class GpuReceiver {
 public:
  struct Options {
    std::string socket;    // the relay's serving socket
    std::string cuda_ipc;  // where the server serves its IPC manifest
                           // (absolute, at most 107 bytes)
    // How long Open waits to be usable (0: it returns at once).
    std::chrono::milliseconds wait{0};
    // How long Poll, having answered a pause, waits for the commit line
    // while the relay writes the buffers.
    std::chrono::milliseconds pause_wait{30000};
    // Called at a pause before paused goes out: returns once no work the
    // server queued on its GPU reads the weights any more (for torch:
    // torch.cuda.synchronize() on every device and stream it uses). GPU
    // work is asynchronous: a step that returned may still be computing,
    // and the relay writes the buffers from another process as soon as
    // paused arrives. An error fails the Poll (nothing is sent; the relay
    // detaches the server at its deadline). Null: the caller synchronizes
    // before every Poll.
    std::function<Status()> quiesce;
  };
  // InvalidArgument for a bad option; with `wait`, IOError naming the
  // relay's reason (its error line) if not usable within it.
  static Result<std::unique_ptr<GpuReceiver>> Open(const Options& options);
  ~GpuReceiver();
  GpuReceiver(const GpuReceiver&) = delete;
  GpuReceiver& operator=(const GpuReceiver&) = delete;

  // Attaches when not attached (at open; after the relay restarted or
  // dropped the link: every 200 ms at most, every 2 s after the relay
  // refused the buffers), answers prepare with ready, and at a pause
  // quiesces, answers paused and waits for the commit (the buffers change
  // meanwhile), then answers flipped. True iff the buffers are usable
  // and hold another version than when they last were. Not usable from a
  // pause until its commit, from an error line or a lost link until the
  // relay answers a new attach.
  Result<bool> Poll();
  bool usable() const { return usable_; }
  // The version the buffers hold while usable().
  const Version& version() const { return version_; }
  bool attached() const;
  // The relay's last error line (why the buffers were refused), or "".
  const std::string& last_error() const { return last_error_; }
  uint64_t pauses() const { return pauses_; }

 private:
  explicit GpuReceiver(Options options);
  // Handles one line.
  Status Handle(const PauseMsg& m);

  Options options_;
  std::unique_ptr<PauseLink> link_;
  bool usable_ = false;
  std::optional<RefitId> paused_;  // answered its pause, no commit yet
  Version version_;
  std::optional<Version> reported_;  // the last usable version Poll saw
  std::string last_error_;
  uint64_t pauses_ = 0;
};

}  // namespace dcr

#endif  // DCR_SERVING_H_
