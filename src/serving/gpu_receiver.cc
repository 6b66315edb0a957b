// GpuReceiver (include/dcr/serving.h): the serving side of the pause
// protocol for a server whose weights are GPU buffers the relay writes.
#include <unistd.h>

#include <thread>

#include "dcr/serving.h"
#include "serving/pause_link.h"
#include "serving/pause_messages.h"

namespace dcr {
namespace {

// How long a receiver whose buffers the relay refused waits before it
// attaches again (the relay's check costs it a manifest fetch and more).
constexpr auto kRetryAfterRefusal = std::chrono::seconds(2);

}  // namespace

GpuReceiver::GpuReceiver(Options options) : options_(std::move(options)) {}
GpuReceiver::~GpuReceiver() = default;

Result<std::unique_ptr<GpuReceiver>> GpuReceiver::Open(const Options& options) {
  if (options.socket.empty()) {
    return Status::InvalidArgument(
        "a GPU receiver needs the relay's serving socket");
  }
  if (options.cuda_ipc.empty() || options.cuda_ipc.front() != '/' ||
      options.cuda_ipc.size() > kMaxSocketPath) {
    return Status::InvalidArgument(
        "cuda_ipc must be the absolute path of the socket serving the IPC "
        "manifest, at most " +
        std::to_string(kMaxSocketPath) + " bytes, not '" + options.cuda_ipc +
        "'");
  }
  std::unique_ptr<GpuReceiver> r(new GpuReceiver(options));
  r->link_ = std::make_unique<PauseLink>(options.socket);
  const auto until = std::chrono::steady_clock::now() + options.wait;
  for (;;) {
    DCR_RETURN_IF_ERROR(r->Poll().status());
    if (r->usable() || std::chrono::steady_clock::now() >= until) break;
    if (!r->link_->Wait(std::chrono::milliseconds(20))) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (options.wait.count() > 0 && !r->usable()) {
    return Status::IOError(
        "the relay on " + options.socket +
        " did not attach the GPU buffers within " +
        std::to_string(options.wait.count()) + " ms" +
        (r->last_error_.empty()
             ? std::string(r->attached() ? "" : " (no relay answers there)")
             : ": " + r->last_error_));
  }
  return r;
}

bool GpuReceiver::attached() const { return link_->connected(); }

Status GpuReceiver::Handle(const PauseMsg& m) {
  switch (m.op) {
    case PauseMsg::Op::kPrepare: {
      PauseMsg ready;
      ready.op = PauseMsg::Op::kReady;
      ready.refit = m.refit;
      link_->Send(ready);
      return Status::OK();
    }
    case PauseMsg::Op::kLive:
      if (!m.cuda) {
        // An older relay, or one that does not keep these buffers.
        usable_ = false;
        last_error_ = "the relay answered without attaching the GPU buffers";
        return Status::OK();
      }
      usable_ = true;
      paused_.reset();
      version_ = m.version;
      last_error_.clear();
      return Status::OK();
    case PauseMsg::Op::kPause: {
      usable_ = false;
      paused_ = m.refit;
      if (options_.quiesce) {
        if (Status q = options_.quiesce(); !q.ok()) {
          paused_.reset();  // not paused: the relay drops it at its deadline
          return q;
        }
      }
      PauseMsg paused;
      paused.op = PauseMsg::Op::kPaused;
      paused.refit = m.refit;
      link_->Send(paused);
      pauses_ += 1;
      return Status::OK();
    }
    case PauseMsg::Op::kCommit: {
      // Only the commit of the pause it answered: the relay wrote the
      // buffers in between.
      if (paused_ != m.refit) return Status::OK();
      paused_.reset();
      usable_ = true;
      version_ = m.version;
      PauseMsg flipped;
      flipped.op = PauseMsg::Op::kFlipped;
      flipped.image = m.image;
      flipped.version.step = m.version.step;
      link_->Send(flipped);
      return Status::OK();
    }
    case PauseMsg::Op::kError:
      // Refused: the relay closes the link; try again later, not at once.
      usable_ = false;
      paused_.reset();
      last_error_ = m.detail;
      link_->Close(kRetryAfterRefusal);
      return Status::OK();
    default:
      return Status::OK();  // abort: nothing changes
  }
}

Result<bool> GpuReceiver::Poll() {
  if (link_->MaybeConnect()) {
    usable_ = false;
    paused_.reset();
    PauseMsg hello;
    hello.op = PauseMsg::Op::kHello;
    hello.pid = static_cast<uint64_t>(::getpid());
    hello.cuda_ipc = options_.cuda_ipc;
    link_->Send(hello);
  }
  for (const PauseMsg& m : link_->Receive()) DCR_RETURN_IF_ERROR(Handle(m));
  // Paused: the relay writes the buffers; wait for its commit.
  const auto until = std::chrono::steady_clock::now() + options_.pause_wait;
  while (paused_ && link_->connected()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) break;
    link_->Wait(
        std::chrono::duration_cast<std::chrono::milliseconds>(until - now) +
        std::chrono::milliseconds(1));
    for (const PauseMsg& m : link_->Receive()) DCR_RETURN_IF_ERROR(Handle(m));
  }
  if (!link_->connected()) {
    usable_ = false;
    paused_.reset();
  }
  if (!usable_ || reported_ == version_) return false;
  reported_ = version_;
  return true;
}

}  // namespace dcr
