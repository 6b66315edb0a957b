// ServingImages' side of a GPU server (docs/PROTOCOL.md §"GPU servers"):
// attaching its exported buffers, the flip's diff on a thread of its own,
// and the sync inside the pause. The rest of the class is in
// serving_images.cc.
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
      "manifest on {})",
      options_.node, device_->tensors().size(), hello.cuda_ipc);
  if (live_ && !SyncDevice("attach")) return false;
  stats_.gpu = true;
  return true;
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
  stats_.gpu_syncs += 1;
  stats_.gpu_patched += sync->patched;
  stats_.gpu_patched_bytes += sync->patched_bytes;
  stats_.gpu_rewritten += sync->rewritten;
  stats_.last_gpu_sync_seconds = sync->seconds;
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
      options_.node, live_state_->version.step, when, sync->patched,
      sync->tensors, sync->patched_bytes, sync->rewritten,
      sync->rewritten_bytes, sync->seconds * 1e3, sync->patch_seconds * 1e3,
      sync->hash_seconds * 1e3, diffed);
  return true;
}

}  // namespace dcr
