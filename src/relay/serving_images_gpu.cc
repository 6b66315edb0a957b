// ServingImages' side of a GPU server (docs/PROTOCOL.md §"GPU servers"):
// attaching its exported buffers and bringing them to the live image, the
// flip's diff (each on a thread of its own), and the sync inside the
// pause. The rest of the class is in serving_images.cc.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "relay/serving_images.h"

namespace dcr {

void ServingImages::StartDiff(const WeightStore* base) {
  // Diff the old live image (what the GPU holds) against the new one, and
  // hash the new, while the server finishes its step, on a thread of its
  // own: the actor goes on serving the tree meanwhile (a large rank's
  // diff takes seconds). The pause then writes only the changed elements
  // and hashes the GPU side.
  if (!diff_pool_) {
    diff_pool_ = std::make_unique<ThreadPool>(
        options_.pool != nullptr ? options_.pool->size() : 1);
  }
  const uint64_t gen = ++diff_gen_;
  diff_thread_ = std::thread(
      [this, gen, tensors = device_->tensors(), base, target = live_.get()] {
        if (options_.on_diff_start) options_.on_diff_start();
        std::shared_ptr<Result<DeviceChanges>> d;
        try {
          d = std::make_shared<Result<DeviceChanges>>(
              StageDeviceChanges(tensors, base, *target, diff_pool_.get(),
                                 options_.device_patch_budget));
        } catch (const std::exception& e) {  // std::bad_alloc: no patches
          d = std::make_shared<Result<DeviceChanges>>(
              Status::ResourceExhausted(e.what()));
        }
        // Dropped if the relay stopped meanwhile (its mailbox closed); the
        // destructor joins this thread.
        options_.post([this, gen, d] { Diffed(gen, std::move(*d)); });
      });
  diffing_ = true;
  diff_thread_gen_ = gen;
}

void ServingImages::JoinDiff() {
  if (diff_thread_.joinable()) diff_thread_.join();
}

void ServingImages::Diffed(uint64_t gen, Result<DeviceChanges> d) {
  if (gen != diff_thread_gen_) return;  // an older thread's, joined since
  JoinDiff();
  diffing_ = false;
  if (gen != diff_gen_ || !held_commit_) return;  // its server was dropped
  if (d.ok()) {
    pause_changes_ = *std::move(d);
  } else {
    spdlog::warn("{}: diffing the GPU tensors at the flip: {}", options_.node,
                 d.status().ToString());
  }
  if (paused_early_) {
    paused_early_ = false;
    // The server waited for the relay: its deadline for flipped runs
    // from the commit line.
    move_deadline_ = std::max(move_deadline_, Clock::now() + options_.deadline);
    FinishPause();
  }
}

void ServingImages::FinishPause() {
  if (!SyncDevice("commit", pause_changes_ ? &*pause_changes_ : nullptr)) {
    return;
  }
  pause_changes_.reset();
  port_->Send(connection_, *held_commit_);
  held_commit_.reset();
}

void ServingImages::RefuseDevice(const std::string& why) {
  spdlog::error("{}: {}", options_.node, why);
  PauseMsg e;
  e.op = PauseMsg::Op::kError;
  e.detail = why;
  port_->Send(connection_, e);
  Drop(why);
}

bool ServingImages::AttachDevice(const PauseMsg& hello) {
  if (!options_.attach_device) {
    RefuseDevice("this relay cannot attach GPU buffers");
    return false;
  }
  Result<std::unique_ptr<DeviceWeights>> d = options_.attach_device(
      hello.cuda_ipc, live_ ? &live_->manifest() : nullptr);
  if (!d.ok()) {
    RefuseDevice(fmt::format("the GPU buffers exported on {} were refused: {}",
                             hello.cuda_ipc, d.status().message()));
    return false;
  }
  device_ = *std::move(d);
  spdlog::info(
      "{}: attached the serving process's GPU buffers ({} tensors, "
      "manifest on {}){}",
      options_.node, device_->tensors().size(), hello.cuda_ipc,
      live_
          ? fmt::format("; bringing them to step {}", live_state_->version.step)
          : "");
  if (live_) {
    StartAttachSync();
  } else {
    stats_.gpu = true;  // the first commit's flip brings them to it
  }
  return true;
}

void ServingImages::StartAttachSync() {
  // Hashing a large rank's buffers (and the live image) takes seconds:
  // the actor goes on serving the tree meanwhile.
  attaching_ = true;
  if (attach_running_) return;  // AttachSynced of the earlier one starts it
  JoinAttach();
  if (!attach_pool_) {
    attach_pool_ = std::make_unique<ThreadPool>(
        options_.pool != nullptr ? options_.pool->size() : 1);
  }
  attach_thread_ =
      std::thread([this, gen = attach_gen_, flips = live_state_->flips,
                   device = device_.get(), live = live_.get()] {
        if (options_.on_attach_sync_start) options_.on_attach_sync_start();
        std::shared_ptr<Result<DeviceSync>> sync;
        try {
          sync = std::make_shared<Result<DeviceSync>>(
              SyncDeviceWeights(*device, *live, attach_pool_.get(), nullptr));
        } catch (const std::exception& e) {  // std::bad_alloc
          sync = std::make_shared<Result<DeviceSync>>(
              Status::ResourceExhausted(e.what()));
        }
        // Dropped if the relay stopped meanwhile (its mailbox closed); the
        // destructor joins this thread.
        options_.post([this, gen, flips, sync] {
          AttachSynced(gen, flips, std::move(*sync));
        });
      });
  // (Set once the thread exists: AttachSynced, which clears them, runs on
  // this thread later.)
  attach_running_ = true;
  attach_image_ = live_state_->image;
  attach_device_ = device_.get();
}

void ServingImages::JoinAttach() {
  if (attach_thread_.joinable()) attach_thread_.join();
}

void ServingImages::AttachSynced(uint64_t gen, uint64_t flips,
                                 Result<DeviceSync> sync) {
  JoinAttach();  // posting was its last act
  attach_running_ = false;
  attach_device_ = nullptr;
  retired_device_.reset();
  if (gen != attach_gen_) {
    // Its server was forgotten; a newer one may be waiting for its turn.
    if (attaching_) StartAttachSync();
    return;
  }
  if (!sync.ok()) {
    RefuseDevice(fmt::format(
        "bringing the GPU buffers to step {} failed (attach): {}; the server "
        "must not compute on them (they are synced again when it attaches)",
        live_state_->version.step, sync.status().message()));
    return;
  }
  if (live_state_->flips != flips) {
    // A commit flipped the images meanwhile: the buffers are at the old
    // live image, which the server never computed on. Again, to the new;
    // until it is done the standby takes no refit (ReadingStandby), so no
    // further flip can send this sync round again.
    attach_holds_standby_ = true;
    spdlog::info(
        "{}: step {} went live while the GPU buffers were brought "
        "to the one before; bringing them to it",
        options_.node, live_state_->version.step);
    StartAttachSync();
    return;
  }
  RecordSync("attach", *sync, nullptr);
  attaching_ = false;
  attach_holds_standby_ = false;
  stats_.gpu = true;
  if (pause_started_) {
    // A flip came between its connect and now: the attach brought its
    // buffers to the live image, which ends that pause.
    move_summary_ =
        fmt::format("serving process attached its GPU buffers at step {}",
                    live_state_->version.step);
    pause_started_.reset();
  }
  SendLive();
}

void ServingImages::ReleaseDevice() {
  if (attach_running_ && device_.get() == attach_device_) {
    retired_device_ = std::move(device_);  // the sync still writes it
  }
  device_.reset();
  attaching_ = false;
  attach_holds_standby_ = false;
  ++attach_gen_;
}

bool ServingImages::ReadingStandby() const {
  return diffing_ || attach_holds_standby_ ||
         (attach_running_ && live_state_ && attach_image_ == standby_index());
}

bool ServingImages::SyncDevice(const char* when, const DeviceChanges* staged) {
  Result<DeviceSync> sync =
      SyncDeviceWeights(*device_, *live_, options_.pool, staged);
  if (!sync.ok()) {
    RefuseDevice(fmt::format(
        "bringing the GPU buffers to step {} failed ({}): {}; the server must "
        "not compute on them (they are synced again when it attaches)",
        live_state_->version.step, when, sync.status().message()));
    return false;
  }
  RecordSync(when, *sync, staged);
  return true;
}

void ServingImages::RecordSync(const char* when, const DeviceSync& sync,
                               const DeviceChanges* staged) {
  stats_.gpu_syncs += 1;
  stats_.gpu_patched += sync.patched;
  stats_.gpu_patched_bytes += sync.patched_bytes;
  stats_.gpu_rewritten += sync.rewritten;
  stats_.last_gpu_sync_seconds = sync.seconds;
  const std::string diffed =
      staged == nullptr
          ? ""
          : fmt::format(
                " (diffed at the flip in {:.1f} ms: {} changed, {} "
                "patched)",
                staged->seconds * 1e3, staged->changed, staged->patched);
  spdlog::info(
      "{}: GPU buffers at step {} ({}): {} of {} tensors patched ({} bytes) "
      "and {} rewritten ({} bytes) in {:.1f} ms, {:.1f} ms of it patching "
      "and {:.1f} ms comparing digests{}",
      options_.node, live_state_->version.step, when, sync.patched,
      sync.tensors, sync.patched_bytes, sync.rewritten, sync.rewritten_bytes,
      sync.seconds * 1e3, sync.patch_seconds * 1e3, sync.hash_seconds * 1e3,
      diffed);
}

}  // namespace dcr
