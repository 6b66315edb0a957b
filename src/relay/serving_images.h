// A serving relay's two images and the server attached to them
// (include/dcr/serving.h; docs/PROTOCOL.md §"The pause protocol"). The
// relay's store (Relay::Impl::store_) is the standby image, the one refits
// stage on; this class keeps the live one, the header naming it and what
// the attached server said, and carries out the protocol's steps:
//
//   vote     a yes vote waits for the server's "ready" to this refit's
//            prepare (sent the first time it is asked); no answer within
//            the deadline turns it into a no. No server attached: no wait.
//   commit   Flip: the committed standby becomes live (header, then a
//            commit line to the server); the old live image becomes the
//            standby, behind by one version.
//   flipped  the server left the old image: its pause ends, and the old
//            image catches up (a copy of the live one) before the next
//            refit may stage on it.
//
// Catch-up waits until the server said it reads the live image; with no
// server attached, for the deadline after the flip (or after the relay's
// start), in case one is between two steps and about to move; a server
// that detached after the flip moved or died.
//
// Thread safety: the actor thread calls everything; the port's events
// reach it through the `post` function given to Open.
#ifndef DCR_RELAY_SERVING_IMAGES_H_
#define DCR_RELAY_SERVING_IMAGES_H_

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "dcr/serving.h"
#include "dcr/store.h"
#include "dcr/thread_pool.h"
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
  };

  // Opens the header and the live image if a commit made them, and
  // listens on the socket.
  static Result<std::unique_ptr<ServingImages>> Open(Options options);
  ~ServingImages();

  // The spec of the standby image: the relay's store.
  StoreSpec standby_spec() const;

  // At start, after the relay recovered the standby from its journal:
  // finishes a flip a crash cut short (the standby committed a later
  // version than the header names). `prepared`: the standby holds a yes
  // vote awaiting the root's decision (left alone).
  Status Reconcile(std::unique_ptr<WeightStore>& standby, bool prepared);

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

  // Brings the standby to the live version once the server left it
  // (opening or creating it if needed). OK(true): the standby may take a
  // refit; OK(false): not yet, why_waiting() says why.
  Result<bool> MaybeCatchUp(std::unique_ptr<WeightStore>& standby,
                            bool prepared);
  bool caught_up() const { return caught_up_; }
  std::string why_waiting() const;

  // The next time a timer here may act (a prepare's deadline, the grace
  // before a catch-up); max() if none.
  Clock::time_point NextDeadline() const;
  // Whether MaybeCatchUp may be due: a catch-up pending with its wait over.
  bool CatchUpDue() const;
  ServingStats stats() const { return stats_; }
  void set_pool(ThreadPool* pool) { options_.pool = pool; }
  const std::optional<LiveState>& live() const { return live_state_; }

 private:
  explicit ServingImages(Options options) : options_(std::move(options)) {}
  void OnEvent(const ServingPort::Event& e);
  uint32_t standby_index() const {
    return live_state_ ? 1 - live_state_->image : 0;
  }
  bool ServerLeftOldImage() const;
  Result<bool> CatchUp(std::unique_ptr<WeightStore>& standby, bool prepared);
  Status CopyLiveInto(WeightStore& standby);

  Options options_;
  std::optional<LiveHeader> header_;
  std::optional<LiveState> live_state_;  // nullopt: no commit yet
  std::unique_ptr<WeightStore> live_;
  std::unique_ptr<ServingPort> port_;

  // The attached server: its connection, and the image it said it reads.
  uint64_t connection_ = 0;  // 0: none attached
  std::optional<uint32_t> server_image_;
  // The refit a prepare went out for, when, and whether it was answered.
  std::optional<RefitId> prepared_refit_;
  Clock::time_point prepare_deadline_{};
  bool ready_ = false;
  // The last flip: when its COMMIT came, and whether the server answered.
  std::optional<Clock::time_point> pause_started_;
  // Catch-up: the standby is behind; not before `grace_until_` unless the
  // server said it left the old image.
  bool caught_up_ = true;
  // A catch-up that failed is tried again at the next refit or after the
  // deadline, not at every turn of the relay's loop.
  Clock::time_point retry_after_{};
  Clock::time_point grace_until_{};
  ServingStats stats_;
};

}  // namespace dcr

#endif  // DCR_RELAY_SERVING_IMAGES_H_
