// A serving relay's two images and the server attached to them
// (include/dcr/serving.h; docs/PROTOCOL.md §"The pause protocol"). The
// relay's store (Relay::Impl::store_) is the standby image, the one refits
// stage on; this class keeps the live one, the header naming it, the
// standby's reader lock and what the attached server said, and carries
// out the protocol's steps:
//
//   vote     a yes vote waits for the server's "ready" to this refit's
//            prepare (sent the first time it is asked); no answer within
//            the deadline turns it into a no. No server attached: no wait.
//   commit   Flip: the committed standby becomes live (its reader lock
//            released, the header written, a commit line to the server);
//            the old live image becomes the standby, behind by one version.
//   catch-up once the relay holds the old image's reader lock exclusively
//            (every process that computed on it moved or died), it copies
//            the live image over it; then the next refit may stage there.
//
// A server that computes on GPU buffers (cuda_ipc in its hello; docs/
// PROTOCOL.md §"GPU servers") has one image, its own: the relay attaches
// it (Options::attach_device), brings it to the live image before the
// server computes (live with "cuda": true; on a thread of its own, since
// hashing a large rank's buffers takes seconds: the relay's loop serves
// the tree meanwhile, and a flip before the sync is done makes it sync
// again to the new image), and at each flip sends pause
// instead of commit, brings the buffers to the new live image once the
// server answers paused (SyncDeviceWeights), then sends commit. A server
// whose buffers could not be attached or synced gets an error line and is
// detached: it must not compute on them.
//
// The reader lock, not the messages, keeps the relay off an image a
// process computes on: a server that is slow, detached, socket-less or
// between a relay's restart and its reconnection holds its shared lock.
// The relay holds the standby's lock from the catch-up (or the first
// stage) until the flip.
//
// Thread safety: the actor thread calls everything; the port's events
// reach it through the `post` function given to Open. Two threads of
// their own post their results the same way, and the destructor joins
// them: at a flip with a GPU server attached, one diffs the two images (it
// reads them and the options, nothing else); at an attach, one brings the
// server's buffers to the live image (it reads that image and writes the
// buffers, which the actor leaves alone until it is done). Nothing writes
// an image either reads until it posted.
#ifndef DCR_RELAY_SERVING_IMAGES_H_
#define DCR_RELAY_SERVING_IMAGES_H_

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "dcr/serving.h"
#include "dcr/store.h"
#include "dcr/thread_pool.h"
#include "relay/device_weights.h"
#include "relay/relay_stats.h"
#include "relay/serving_port.h"

namespace dcr {

class ServingImages {
 public:
  using Clock = std::chrono::steady_clock;
  struct Options {
    std::string node;    // for logs
    StoreSpec store;     // shm:NAME: images NAME.0, NAME.1, NAME.live
    std::string socket;  // the pause protocol's socket
    Clock::duration deadline = std::chrono::seconds(5);
    ThreadPool* pool = nullptr;  // catch-up copies
    // Runs a function on the actor thread (Mailbox::Post).
    std::function<void(std::function<void()>)> post;
    // Attaches the GPU buffers a server exported on the socket its hello
    // names (the relay: AttachCudaIpcWeights with the tensors its rank
    // computes with); `live` is the live image's manifest (null before
    // the first commit). Called on the actor thread. Null: such a server
    // is refused.
    std::function<Result<std::unique_ptr<DeviceWeights>>(
        const std::string& socket, const Manifest* live)>
        attach_device;
    // The most bytes of patches (StageDeviceChanges) held for a GPU
    // server's pause. The relay gives the apply share of its memory limit
    // less the patches' staging and scratch: no refit stages from a commit
    // until the standby has caught up, which waits for the pause.
    uint64_t device_patch_budget = 256ull << 20;
    // Tests: runs on the diff's thread before it diffs, and on the attach
    // sync's before it syncs (to hold them).
    std::function<void()> on_diff_start = nullptr;
    std::function<void()> on_attach_sync_start = nullptr;
  };

  // Opens the header and the live image if a commit made them (a header
  // a crash left torn is rebuilt from the images' records). Listen comes
  // after the relay took its store's lock.
  static Result<std::unique_ptr<ServingImages>> Open(Options options);
  Status Listen();
  ~ServingImages();

  // The spec of the standby image: the relay's store.
  StoreSpec standby_spec() const;

  // At start, after the relay recovered the standby from its journal:
  // finishes a flip a crash cut short (the standby committed a later
  // version than the header names). `prepared`: the standby holds a yes
  // vote awaiting the root's decision (left alone).
  Status Reconcile(std::unique_ptr<WeightStore>& standby, bool prepared);

  // Takes the standby's reader lock (kept until the flip); false while a
  // process still computes on the standby image.
  bool LockStandby();

  enum class Gate { kReady, kWait, kTimedOut };
  // Whether a yes vote in refit `refit` may go up (see the top).
  Gate ReadyToVote(const RefitId& refit, uint64_t step);
  // The committed standby becomes live; `standby` becomes the old live
  // image (null before the second image exists). `commit_at`: when COMMIT
  // reached the node, where the pause starts.
  Status Flip(std::unique_ptr<WeightStore>& standby, const RefitId& refit,
              Clock::time_point commit_at);
  // The refit ended without a commit here: the server is told (no pause).
  void Aborted(const RefitId& refit);
  // After a flip, until the server moved (or detached) or the deadline
  // passed: the relay's COMMIT_REPLY waits, so that the refit's report
  // says the server runs on the target (MoveSummary).
  bool AwaitingMove() const;
  // For the COMMIT_REPLY: "serving process moved in 2.1 ms", "... had not
  // moved within 5000 ms", or "" when none was attached at the flip.
  std::string MoveSummary() const;

  // Brings the standby to the live version once its reader lock is ours
  // (opening or creating it if needed). OK(true): the standby may take a
  // refit (its lock held); OK(false): not yet, why_waiting() says why.
  Result<bool> MaybeCatchUp(std::unique_ptr<WeightStore>& standby,
                            bool prepared);
  bool caught_up() const { return caught_up_; }
  std::string why_waiting() const;

  // Acts on a deadline: a GPU server that did not answer pause within
  // the deadline is detached (its buffers are synced when it attaches
  // again). Called on every turn of the relay's loop.
  void Tick();

  // The next time a timer here may act (a prepare's deadline; a catch-up
  // waiting for the standby's lock is tried every 50 ms); max() if none.
  Clock::time_point NextDeadline() const;
  // Whether MaybeCatchUp should be tried: a catch-up pending (and not
  // failed within the deadline), no GPU server's pause (whose patches the
  // apply share holds until then) in progress, and no diff reading the
  // standby.
  bool CatchUpDue() const;
  ServingStats stats() const {
    ServingStats s = stats_;
    s.gpu_attaching = attaching_;
    return s;
  }
  void set_pool(ThreadPool* pool) { options_.pool = pool; }
  const std::optional<LiveState>& live() const { return live_state_; }

 private:
  explicit ServingImages(Options options) : options_(std::move(options)) {}
  void OnEvent(const ServingPort::Event& e);
  uint32_t standby_index() const {
    return live_state_ ? 1 - live_state_->image : 0;
  }
  void ForgetPrepare();
  Result<bool> CatchUp(std::unique_ptr<WeightStore>& standby, bool prepared);
  // Attaches the GPU buffers `hello` names; false (the server told and
  // detached) if they cannot be attached or synced.
  bool AttachDevice(const PauseMsg& hello);
  // Brings device_ to the live image; false (the server told and
  // detached, device_ dropped) if it fails.
  bool SyncDevice(const char* when, const DeviceChanges* staged = nullptr);
  // Counts and logs a sync that brought device_ to the live image.
  void RecordSync(const char* when, const DeviceSync& sync,
                  const DeviceChanges* staged);
  // Brings device_ to the live image on attach_thread_ (the server waits
  // for its live line meanwhile); AttachSynced gets the result. While a
  // forgotten server's sync still runs, this one starts when it ends.
  void StartAttachSync();
  void AttachSynced(uint64_t gen, uint64_t flips, Result<DeviceSync> sync);
  void JoinAttach();
  // Sends the attached server the live image, if there is one.
  void SendLive();
  // Forgets device_ (kept until attach_thread_ ends if it writes it).
  void ReleaseDevice();
  // The standby may take no write: a thread may still read it (the flip's
  // diff, or an attach sync that started before the last flip), or an
  // attach sync runs again after a flip and must not be sent round again.
  bool ReadingStandby() const;
  // Starts diffing `base` (the old live image) against live_ for device_'s
  // tensors on diff_thread_; Diffed gets the result on the actor thread.
  void StartDiff(const WeightStore* base);
  void Diffed(uint64_t gen, Result<DeviceChanges> d);
  void JoinDiff();
  // Inside the pause: brings device_ to the live image, then sends the
  // held commit line.
  void FinishPause();
  // Tells the server why (an error line), then Drop.
  void RefuseDevice(const std::string& why);
  // Closes the attachment and forgets the server at once.
  void Drop(const std::string& why);
  // Forgets the attached server (it detached, or Drop).
  void Dropped(const std::string& why);
  Status CopyLiveInto(WeightStore& standby);

  Options options_;
  std::optional<LiveHeader> header_;
  std::optional<LiveState> live_state_;  // nullopt: no commit yet
  std::unique_ptr<WeightStore> live_;
  std::unique_ptr<ServingPort> port_;

  // The attached server: its connection, and the image it said it reads.
  uint64_t connection_ = 0;  // 0: none attached
  std::optional<uint32_t> server_image_;
  // Its GPU buffers (null: it computes on the host images), and the
  // commit line held back until it answers pause.
  std::unique_ptr<DeviceWeights> device_;
  std::optional<PauseMsg> held_commit_;
  // What the flip changes in device_'s tensors, found while the server
  // finishes its step (the live image does not change until the next
  // flip); nullopt if that failed (the sync hashes and rewrites then).
  std::optional<DeviceChanges> pause_changes_;
  // The diff's thread and pool. diffing_: the thread may still read the
  // images (until Diffed ran), so nothing may write the standby;
  // diff_gen_ tells a diff for a dropped server from the current one;
  // paused_early_: the server answered pause before the diff was done.
  std::thread diff_thread_;
  std::unique_ptr<ThreadPool> diff_pool_;
  bool diffing_ = false;
  uint64_t diff_gen_ = 0;
  uint64_t diff_thread_gen_ = 0;  // the generation diff_thread_ runs for
  bool paused_early_ = false;
  // The attach's sync. attaching_: device_ is not at the live image yet
  // (its sync runs or waits for a forgotten server's to end), so the
  // server gets no live line, prepare, pause or commit; attach_running_:
  // attach_thread_ runs, until AttachSynced ran, reading image
  // attach_image_ and writing attach_device_ (which retired_device_ keeps
  // if its server was forgotten meanwhile); attach_gen_ tells a sync for a
  // forgotten server from the current one; attach_holds_standby_: a flip
  // came during the sync, which runs again, and until it is done no refit
  // stages (or the next flip would send it round again, and a server
  // attaching while commits come faster than a sync would never go live).
  std::thread attach_thread_;
  std::unique_ptr<ThreadPool> attach_pool_;
  bool attaching_ = false;
  bool attach_running_ = false;
  bool attach_holds_standby_ = false;
  uint64_t attach_gen_ = 0;
  uint32_t attach_image_ = 0;
  const DeviceWeights* attach_device_ = nullptr;
  std::unique_ptr<DeviceWeights> retired_device_;
  // The refit a prepare went out for, when, and whether it was answered.
  std::optional<RefitId> prepared_refit_;
  Clock::time_point prepare_deadline_{};
  bool ready_ = false;
  // The last flip: when its COMMIT came (until the server answered), and
  // when the header changed.
  std::optional<Clock::time_point> pause_started_;
  Clock::time_point flipped_at_{};
  // Until when the relay waits for the server's answer to the last flip
  // (paused, flipped): --serving-deadline from the flip. A GPU server that
  // answered pause while the relay still diffs is not held to it.
  Clock::time_point move_deadline_{};
  std::string move_summary_;  // of the last flip
  // The standby's reader lock, held exclusively; invalid: not ours yet.
  UniqueFd standby_lock_;
  // The standby holds the live version.
  bool caught_up_ = true;
  // A catch-up that failed is tried again at the next refit or after the
  // deadline, not at every turn of the relay's loop.
  Clock::time_point retry_after_{};
  ServingStats stats_;
};

}  // namespace dcr

#endif  // DCR_RELAY_SERVING_IMAGES_H_
