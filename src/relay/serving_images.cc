#include "relay/serving_images.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cassert>
#include <cstring>

namespace dcr {
namespace {

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// How often a catch-up waiting for the standby's reader lock tries it.
constexpr auto kLockPoll = std::chrono::milliseconds(50);

}  // namespace

Result<std::unique_ptr<ServingImages>> ServingImages::Open(Options options) {
  if (options.store.kind != StoreSpec::Kind::kShm) {
    return Status::InvalidArgument(
        "a serving socket needs a shm store (shm:NAME) that the server maps, "
        "not " +
        options.store.ToString());
  }
  std::unique_ptr<ServingImages> self(new ServingImages(std::move(options)));
  const Options& o = self->options_;
  const std::string name = LiveHeaderName(o.store);
  Result<LiveHeader> header = LiveHeader::Open(name, /*writable=*/true);
  Result<LiveState> state = header.ok() ? header->Read() : header.status();
  if (state.status().code() == StatusCode::kCorruption) {
    // A crash while the header was made or written: the images' records
    // say which one committed last; it is the live one. Opening them takes
    // their locks: a second relay on this store stops here, before it
    // touches the header.
    spdlog::warn("{}: {}; rebuilding it from the images' records", o.node,
                 state.status().ToString());
    std::optional<LiveState> best;
    for (uint32_t i = 0; i < 2; ++i) {
      auto s = OpenStore(ServingImageSpec(o.store, i));
      if (!s.ok() && s.status().code() == StatusCode::kNotFound) continue;
      if (!s.ok()) return s.status();
      auto c = (*s)->committed();
      if (c && !(*s)->InProgress() && (!best || c->step > best->version.step)) {
        best = LiveState{i, *c, 1};
      }
    }
    if (header.ok() && best) {
      // Torn mid-write: rewritten in place, so that servers mapping it see
      // the repair.
      header->Write(*best);
      state = *best;
    } else {
      DCR_RETURN_IF_ERROR(LiveHeader::Remove(name));
      if (best) {
        header = LiveHeader::Create(name, *best);
        state = *best;
      } else {
        header = Status::NotFound("no committed image");
        state = header.status();
      }
    }
  }
  if (state.ok()) {
    const StoreSpec live = ServingImageSpec(o.store, state->image);
    auto store = OpenStore(live);
    if (!store.ok()) {
      return Status::InvalidArgument(fmt::format(
          "shm:{} names {} live, which does not open: {}; "
          "remove the images (/dev/shm{}.0, .1 and .live) and "
          "seed the node with a full refit",
          name, live.ToString(), store.status().message(), o.store.path));
    }
    self->live_ = *std::move(store);
    self->header_.emplace(*std::move(header));
    self->live_state_ = *state;
    self->stats_.live_image = state->image;
  } else if (state.status().code() != StatusCode::kNotFound) {
    return state.status();
  }
  self->caught_up_ = !self->live_state_;
  return self;
}

Status ServingImages::Listen() {
  ServingImages* raw = this;
  DCR_ASSIGN_OR_RETURN(
      port_, ServingPort::Listen(options_.socket, [raw](ServingPort::Event e) {
        raw->options_.post([raw, e = std::move(e)] { raw->OnEvent(e); });
      }));
  return Status::OK();
}

ServingImages::~ServingImages() {
  JoinDiff();
  JoinAttach();
}

StoreSpec ServingImages::standby_spec() const {
  return ServingImageSpec(options_.store, standby_index());
}

Status ServingImages::Reconcile(std::unique_ptr<WeightStore>& standby,
                                bool prepared) {
  if (prepared) {
    // Its base is the live version; the root's decision ends it.
    caught_up_ = true;
    return Status::OK();
  }
  if (!standby) return Status::OK();  // caught_up_: whether a live one exists
  const std::optional<Version> c = standby->committed();
  const bool clean = !standby->InProgress();
  if (clean && c && (!live_state_ || c->step > live_state_->version.step)) {
    spdlog::warn(
        "{}: {} committed step {} and was not made live (a crash); flipping "
        "now",
        options_.node, standby->describe(), c->step);
    const auto rec = standby->record();
    return Flip(standby, rec.committed->refit, Clock::now());
  }
  caught_up_ = clean && c && live_state_ && *c == live_state_->version &&
               standby->manifest().digest() == live_->manifest().digest();
  stats_.caught_up = caught_up_;
  return Status::OK();
}

bool ServingImages::LockStandby() {
  if (ReadingStandby()) return false;
  if (standby_lock_.valid()) return true;
  auto lock = LockImage(options_.store, standby_index(), /*exclusive=*/true);
  if (!lock.ok()) {
    if (lock.status().code() != StatusCode::kAborted) {
      spdlog::error("{}: {}", options_.node, lock.status().ToString());
    }
    return false;
  }
  standby_lock_ = *std::move(lock);
  return true;
}

void ServingImages::ForgetPrepare() {
  prepared_refit_.reset();
  ready_ = false;
}

ServingImages::Gate ServingImages::ReadyToVote(const RefitId& refit,
                                               uint64_t step) {
  // A server whose buffers are still being attached computes nothing yet.
  if (connection_ == 0 || attaching_) return Gate::kReady;
  if (!prepared_refit_ || *prepared_refit_ != refit) {
    prepared_refit_ = refit;
    ready_ = false;
    prepare_deadline_ = Clock::now() + options_.deadline;
    PauseMsg m;
    m.op = PauseMsg::Op::kPrepare;
    m.refit = refit;
    m.version.step = step;
    port_->Send(connection_, m);
  }
  if (ready_) return Gate::kReady;
  if (Clock::now() < prepare_deadline_) return Gate::kWait;
  stats_.prepare_timeouts += 1;
  ForgetPrepare();
  return Gate::kTimedOut;
}

Status ServingImages::Flip(std::unique_ptr<WeightStore>& standby,
                           const RefitId& refit, Clock::time_point commit_at) {
  const std::optional<Version> v =
      standby ? standby->committed() : std::nullopt;
  if (!v || standby->InProgress()) {
    return Status::Internal("flip: the standby holds no finished commit");
  }
  // No thread reads the standby here: it took this refit, which waited
  // for them (CatchUp, LockStandby). (An attach sync may read the live
  // image.)
  assert(!ReadingStandby());
  LiveState next;
  next.image = standby_index();
  next.version = *v;
  next.flips = live_state_ ? live_state_->flips + 1 : 1;
  // Readers may lock the new live image before they see the header.
  standby_lock_.Reset();
  if (header_) {
    header_->Write(next);
  } else {
    DCR_ASSIGN_OR_RETURN(
        LiveHeader h, LiveHeader::Create(LiveHeaderName(options_.store), next));
    header_.emplace(std::move(h));
  }
  flipped_at_ = Clock::now();
  live_state_ = next;
  std::swap(live_, standby);
  caught_up_ = false;
  retry_after_ = {};
  stats_.caught_up = false;
  stats_.live_image = next.image;
  ForgetPrepare();
  pause_started_.reset();
  move_summary_.clear();
  held_commit_.reset();
  pause_changes_.reset();
  if (connection_ != 0) {
    PauseMsg m;
    m.op = PauseMsg::Op::kCommit;
    m.refit = refit;
    m.image = next.image;
    m.version = next.version;
    m.flips = next.flips;
    if (attaching_) {
      // Its buffers are being brought to the old live image, and it waits
      // for its live line: AttachSynced brings them to this one and sends
      // it, which ends this pause.
    } else if (device_) {
      // Its GPU buffers change only while it waits between two steps.
      PauseMsg pause;
      pause.op = PauseMsg::Op::kPause;
      pause.refit = refit;
      port_->Send(connection_, pause);
      held_commit_ = m;
      StartDiff(standby.get());
    } else {
      port_->Send(connection_, m);
    }
    pause_started_ = commit_at;
  }
  move_deadline_ = Clock::now() + options_.deadline;
  spdlog::info("{}: image {} is live at step {}{}", options_.node, next.image,
               next.version.step,
               connection_ == 0 ? ""
               : attaching_     ? "; the GPU buffers being attached are "
                                  "brought to it next"
               : device_        ? "; pausing the server to update its GPU "
                                  "buffers"
                                : "; waiting for the server to move");
  return Status::OK();
}

void ServingImages::Aborted(const RefitId& refit) {
  if (prepared_refit_ == refit) ForgetPrepare();
  if (connection_ == 0 || attaching_) return;
  PauseMsg m;
  m.op = PauseMsg::Op::kAbort;
  m.refit = refit;
  port_->Send(connection_, m);
}

bool ServingImages::AwaitingMove() const {
  // A server that answered pause waits for the relay's diff: so does the
  // COMMIT_REPLY (Diffed gives it the deadline again from the commit).
  return pause_started_ && (paused_early_ || Clock::now() < move_deadline_);
}

std::string ServingImages::MoveSummary() const {
  if (!pause_started_) return move_summary_;
  return fmt::format(
      "serving process had not moved within {} ms",
      std::chrono::duration_cast<std::chrono::milliseconds>(options_.deadline)
          .count());
}

void ServingImages::Tick() {
  // A server that answered waits for the relay's diff, not the reverse.
  if (!held_commit_ || connection_ == 0 || paused_early_) return;
  if (Clock::now() < move_deadline_) return;
  Drop(fmt::format(
      "it did not answer pause within {} ms; its GPU buffers are brought to "
      "the live image when it attaches again",
      std::chrono::duration_cast<std::chrono::milliseconds>(options_.deadline)
          .count()));
}

void ServingImages::Drop(const std::string& why) {
  port_->Detach(connection_, why);
  // Forgotten now, not at the port's kDetached event: nothing (a flip's
  // commit line) goes to it meanwhile.
  Dropped(why);
}

void ServingImages::Dropped(const std::string& why) {
  spdlog::warn("{}: the serving process detached: {}{}", options_.node, why,
               !pause_started_ ? ""
               : device_       ? " (during its pause; its GPU buffers are "
                                 "synced when it attaches again)"
                               : " (during its pause; it moves to the live "
                                 "image by the header)");
  connection_ = 0;
  server_image_.reset();
  // Its GPU buffers are unknown from here: the next attach syncs them.
  ReleaseDevice();
  held_commit_.reset();
  pause_changes_.reset();
  ++diff_gen_;  // a diff under way is for nobody now
  paused_early_ = false;
  ForgetPrepare();
  stats_.attached = false;
  stats_.gpu = false;
  if (pause_started_) move_summary_ = "serving process detached";
  pause_started_.reset();
}

bool ServingImages::CatchUpDue() const {
  return !caught_up_ && !held_commit_ && !ReadingStandby() &&
         Clock::now() >= retry_after_;
}

std::string ServingImages::why_waiting() const {
  if (diffing_) {
    return "the relay is still reading the images for a GPU server's pause "
           "(the diff of the old live image against the new)";
  }
  if (attach_holds_standby_) {
    return fmt::format(
        "an attaching GPU server's buffers are being brought to the live "
        "image {} (a commit flipped the images during their first sync); the "
        "relay stages no refit until then",
        live_state_->image);
  }
  if (ReadingStandby()) {
    return fmt::format(
        "the relay is still reading image {} to bring an attaching GPU "
        "server's buffers to it (the live image until the last flip)",
        standby_index());
  }
  if (held_commit_ && live_state_) {
    return fmt::format(
        "the serving process has not answered its pause for step {} yet (its "
        "GPU buffers are brought to it inside the pause); the relay stages "
        "no refit until then",
        live_state_->version.step);
  }
  if (caught_up_ && standby_lock_.valid()) return "";
  return fmt::format(
      "a serving process still computes on image {} (it has not moved to "
      "the live image {}); the relay does not write it until then",
      standby_index(), live_state_ ? live_state_->image : 0);
}

ServingImages::Clock::time_point ServingImages::NextDeadline() const {
  const Clock::time_point now = Clock::now();
  Clock::time_point next = Clock::time_point::max();
  if (connection_ != 0 && prepared_refit_ && !ready_ &&
      prepare_deadline_ > now) {
    next = std::min(next, prepare_deadline_);
  }
  if (!caught_up_) {
    next = std::min(next, std::max(now, retry_after_) + kLockPoll);
  }
  if (pause_started_ && move_deadline_ > now) {
    next = std::min(next, move_deadline_);
  }
  return next;
}

Result<bool> ServingImages::MaybeCatchUp(std::unique_ptr<WeightStore>& standby,
                                         bool prepared) {
  Result<bool> done = CatchUp(standby, prepared);
  if (!done.ok()) retry_after_ = Clock::now() + options_.deadline;
  return done;
}

Result<bool> ServingImages::CatchUp(std::unique_ptr<WeightStore>& standby,
                                    bool prepared) {
  // A GPU server's pause holds its patches in the apply share of the
  // memory limit: no refit stages until it is over.
  if (held_commit_ || ReadingStandby()) return false;
  if (!LockStandby()) return false;
  if (caught_up_) return true;
  if (prepared || !live_) return false;
  const StoreSpec spec = standby_spec();
  if (standby && standby->manifest().digest() != live_->manifest().digest()) {
    standby.reset();
    DCR_RETURN_IF_ERROR(RemoveStore(spec));
  }
  if (!standby) {
    auto opened = OpenStore(spec);
    if (opened.ok() &&
        (*opened)->manifest().digest() == live_->manifest().digest()) {
      standby = *std::move(opened);
    } else {
      if (opened.ok()) {
        opened->reset();
        DCR_RETURN_IF_ERROR(RemoveStore(spec));
      } else if (opened.status().code() != StatusCode::kNotFound) {
        return opened.status();
      }
      DCR_ASSIGN_OR_RETURN(standby, CreateStore(spec, live_->manifest()));
    }
  }
  const auto start = Clock::now();
  DCR_RETURN_IF_ERROR(CopyLiveInto(*standby));
  caught_up_ = true;
  stats_.caught_up = true;
  stats_.last_catch_up_seconds = Seconds(Clock::now() - start);
  spdlog::info("{}: {} caught up with step {} in {:.3f} s", options_.node,
               standby->describe(), live_state_->version.step,
               stats_.last_catch_up_seconds);
  return true;
}

Status ServingImages::CopyLiveInto(WeightStore& standby) {
  const VersionRecord rec = live_->record();
  const RefitId id = rec.committed ? rec.committed->refit : RefitId{};
  const Version& target = live_state_->version;
  DCR_RETURN_IF_ERROR(
      standby.BeginRefit(id, standby.committed().value_or(Version{}), target));
  const size_t n = live_->manifest().size();
  auto copy = [&](size_t i, size_t) {
    std::span<const std::byte> from = live_->Tensor(i);
    if (!from.empty()) {
      std::memcpy(standby.MutableTensor(i).data(), from.data(), from.size());
    }
  };
  if (options_.pool != nullptr) {
    options_.pool->ParallelFor(n, copy);
  } else {
    for (size_t i = 0; i < n; ++i) copy(i, 0);
  }
  return standby.Commit(target, id);
}

void ServingImages::SendLive() {
  if (!live_state_) return;
  PauseMsg live;
  live.op = PauseMsg::Op::kLive;
  live.image = live_state_->image;
  live.version = live_state_->version;
  live.flips = live_state_->flips;
  live.cuda = device_ != nullptr;
  port_->Send(connection_, live);
}

void ServingImages::OnEvent(const ServingPort::Event& e) {
  using Kind = ServingPort::Event::Kind;
  switch (e.kind) {
    case Kind::kAttached:
      connection_ = e.connection;
      server_image_.reset();
      ReleaseDevice();
      held_commit_.reset();
      pause_changes_.reset();
      ++diff_gen_;
      paused_early_ = false;
      stats_.gpu = false;
      ForgetPrepare();  // a vote under way sends this server its prepare
      stats_.attached = true;
      spdlog::info("{}: a serving process attached ({})", options_.node,
                   port_->path());
      return;
    case Kind::kDetached:
      if (e.connection == connection_) Dropped(e.detail);
      return;
    case Kind::kMessage:
      break;
  }
  if (e.connection != connection_) return;
  const PauseMsg& m = e.msg;
  switch (m.op) {
    case PauseMsg::Op::kHello:
      server_image_ = m.image;
      spdlog::info(
          "{}: serving process {} {}", options_.node, m.pid,
          !m.cuda_ipc.empty()
              ? "computes on GPU buffers it exports on " + m.cuda_ipc
              : "reads image " + (m.image ? std::to_string(*m.image) : "none"));
      if (device_) {
        Drop("it sent a second hello");
        return;
      }
      if (!m.cuda_ipc.empty()) {
        if (!AttachDevice(m)) return;
        // The live line goes out once its buffers hold the live image.
        if (attaching_) return;
      }
      SendLive();
      return;
    case PauseMsg::Op::kPaused:
      if (!device_ || !held_commit_ || m.refit != held_commit_->refit) {
        Drop("it sent paused for a pause the relay did not send");
        return;
      }
      // Before the diff is done, the pause waits for it.
      if (diffing_) {
        paused_early_ = true;
        return;
      }
      FinishPause();
      return;
    case PauseMsg::Op::kReady:
      if (prepared_refit_ == m.refit) ready_ = true;
      return;
    case PauseMsg::Op::kFlipped:
      server_image_ = m.image;
      if (pause_started_ && live_state_ && m.image == live_state_->image) {
        const auto now = e.at;  // not when this thread got to it
        stats_.pauses += 1;
        stats_.last_pause_seconds = Seconds(now - *pause_started_);
        spdlog::info(
            "{}: the serving process runs on step {} (paused {:.1f} ms after "
            "COMMIT: {:.1f} ms to commit and flip, {:.1f} ms to move)",
            options_.node, m.version.step, stats_.last_pause_seconds * 1e3,
            Seconds(flipped_at_ - *pause_started_) * 1e3,
            Seconds(now - flipped_at_) * 1e3);
        move_summary_ = fmt::format("serving process moved in {:.1f} ms",
                                    stats_.last_pause_seconds * 1e3);
        pause_started_.reset();
      }
      return;
    default:
      Drop(fmt::format("it sent a relay's message ({})", PauseOpName(m.op)));
      return;
  }
}

}  // namespace dcr
