// GpuReceiver (include/dcr/serving.h): the serving side of the pause
// protocol for a server whose weights are GPU buffers the relay writes.
#include <unistd.h>

#include <thread>

#include "dcr/serving.h"
#include "serving/pause_link.h"
#include "serving/pause_messages.h"

namespace dcr {

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

void GpuReceiver::Handle(const PauseMsg& m, bool* changed) {
  switch (m.op) {
    case PauseMsg::Op::kPrepare: {
      PauseMsg ready;
      ready.op = PauseMsg::Op::kReady;
      ready.refit = m.refit;
      link_->Send(ready);
      return;
    }
    case PauseMsg::Op::kLive:
      if (!m.cuda) {
        // An older relay, or one that does not keep these buffers.
        usable_ = false;
        last_error_ = "the relay answered without attaching the GPU buffers";
        return;
      }
      if (!usable_ || m.version != version_) *changed = true;
      usable_ = true;
      version_ = m.version;
      last_error_.clear();
      return;
    case PauseMsg::Op::kPause: {
      usable_ = false;
      paused_ = true;
      PauseMsg paused;
      paused.op = PauseMsg::Op::kPaused;
      paused.refit = m.refit;
      link_->Send(paused);
      pauses_ += 1;
      return;
    }
    case PauseMsg::Op::kCommit: {
      if (!paused_) return;  // a commit this server did not pause for
      paused_ = false;
      usable_ = true;
      *changed = true;
      version_ = m.version;
      PauseMsg flipped;
      flipped.op = PauseMsg::Op::kFlipped;
      flipped.image = m.image;
      flipped.version.step = m.version.step;
      link_->Send(flipped);
      return;
    }
    case PauseMsg::Op::kError:
      usable_ = false;
      last_error_ = m.detail;
      return;
    default:
      return;  // abort: nothing changes
  }
}

Result<bool> GpuReceiver::Poll() {
  bool changed = false;
  if (link_->MaybeConnect()) {
    usable_ = false;
    paused_ = false;
    PauseMsg hello;
    hello.op = PauseMsg::Op::kHello;
    hello.pid = static_cast<uint64_t>(::getpid());
    hello.cuda_ipc = options_.cuda_ipc;
    link_->Send(hello);
  }
  for (const PauseMsg& m : link_->Receive()) Handle(m, &changed);
  // Paused: the relay writes the buffers; wait for its commit.
  const auto until = std::chrono::steady_clock::now() + options_.pause_wait;
  while (paused_ && link_->connected()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) break;
    link_->Wait(
        std::chrono::duration_cast<std::chrono::milliseconds>(until - now) +
        std::chrono::milliseconds(1));
    for (const PauseMsg& m : link_->Receive()) Handle(m, &changed);
  }
  if (!link_->connected()) {
    usable_ = false;
    paused_ = false;
  }
  return changed;
}

}  // namespace dcr
