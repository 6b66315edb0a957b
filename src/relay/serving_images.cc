#include "relay/serving_images.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstring>

namespace dcr {
namespace {

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

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
  if (header.ok()) {
    DCR_ASSIGN_OR_RETURN(LiveState state, header->Read());
    const StoreSpec live = ServingImageSpec(o.store, state.image);
    auto store = OpenStore(live);
    if (!store.ok()) {
      return Status::InvalidArgument(fmt::format(
          "shm:{} names {} live, which does not open ({}); remove both and "
          "seed the node with a full refit",
          name, live.ToString(), store.status().message()));
    }
    self->live_ = *std::move(store);
    self->header_.emplace(*std::move(header));
    self->live_state_ = state;
    self->stats_.live_image = state.image;
  } else if (header.status().code() != StatusCode::kNotFound) {
    return header.status();
  }
  // A server may be reading the standby still (a crash between a flip and
  // its answer): no catch-up before it attaches or the deadline passes.
  self->grace_until_ = Clock::now() + o.deadline;
  self->caught_up_ = !self->live_state_;
  ServingImages* raw = self.get();
  DCR_ASSIGN_OR_RETURN(
      self->port_, ServingPort::Listen(o.socket, [raw](ServingPort::Event e) {
        raw->options_.post([raw, e = std::move(e)] { raw->OnEvent(e); });
      }));
  return self;
}

ServingImages::~ServingImages() = default;

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
        "{}: {} committed step {} and was not made live (a crash); "
        "flipping now",
        options_.node, standby->describe(), c->step);
    const auto rec = standby->record();
    DCR_RETURN_IF_ERROR(Flip(standby, rec.committed->refit, Clock::now()));
    // A server may compute on the old image until it attaches.
    grace_until_ = Clock::now() + options_.deadline;
    return Status::OK();
  }
  caught_up_ = clean && c && live_state_ && *c == live_state_->version &&
               standby->manifest().digest() == live_->manifest().digest();
  stats_.caught_up = caught_up_;
  return Status::OK();
}

ServingImages::Gate ServingImages::ReadyToVote(const RefitId& refit,
                                               uint64_t step) {
  if (connection_ == 0) return Gate::kReady;
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
  prepared_refit_.reset();
  return Gate::kTimedOut;
}

Status ServingImages::Flip(std::unique_ptr<WeightStore>& standby,
                           const RefitId& refit, Clock::time_point commit_at) {
  const std::optional<Version> v =
      standby ? standby->committed() : std::nullopt;
  if (!v) return Status::Internal("flip: the standby holds no commit");
  LiveState next;
  next.image = standby_index();
  next.version = *v;
  next.flips = live_state_ ? live_state_->flips + 1 : 1;
  if (header_) {
    header_->Write(next);
  } else {
    DCR_ASSIGN_OR_RETURN(
        LiveHeader h, LiveHeader::Create(LiveHeaderName(options_.store), next));
    header_.emplace(std::move(h));
  }
  live_state_ = next;
  std::swap(live_, standby);
  caught_up_ = false;
  stats_.caught_up = false;
  stats_.live_image = next.image;
  // No server attached: none reads the old image (one that detached
  // moved or died). Reconcile, at start, waits instead.
  grace_until_ = Clock::now();
  pause_started_.reset();
  if (connection_ != 0) {
    PauseMsg m;
    m.op = PauseMsg::Op::kCommit;
    m.refit = refit;
    m.image = next.image;
    m.version = next.version;
    m.flips = next.flips;
    port_->Send(connection_, m);
    pause_started_ = commit_at;
  }
  spdlog::info("{}: image {} is live at step {}{}", options_.node, next.image,
               next.version.step,
               connection_ != 0 ? "; waiting for the server to move" : "");
  return Status::OK();
}

void ServingImages::Aborted(const RefitId& refit) {
  if (prepared_refit_ == refit) prepared_refit_.reset();
  if (connection_ == 0) return;
  PauseMsg m;
  m.op = PauseMsg::Op::kAbort;
  m.refit = refit;
  port_->Send(connection_, m);
}

bool ServingImages::ServerLeftOldImage() const {
  if (connection_ != 0) {
    return live_state_ && server_image_ == live_state_->image;
  }
  return Clock::now() >= grace_until_;
}

bool ServingImages::CatchUpDue() const {
  return !caught_up_ && Clock::now() >= retry_after_ && ServerLeftOldImage();
}

std::string ServingImages::why_waiting() const {
  if (caught_up_) return "";
  if (connection_ != 0 && !ServerLeftOldImage()) {
    return fmt::format(
        "the serving process has not moved to image {} yet (it may still "
        "compute on the standby)",
        live_state_ ? live_state_->image : 0);
  }
  if (connection_ == 0 && !ServerLeftOldImage()) {
    return "waiting for a serving process to attach (or the pause deadline) "
           "before the standby image catches up";
  }
  return "the standby image has not caught up with the live one";
}

ServingImages::Clock::time_point ServingImages::NextDeadline() const {
  Clock::time_point next = Clock::time_point::max();
  if (connection_ != 0 && prepared_refit_ && !ready_) {
    next = std::min(next, prepare_deadline_);
  }
  if (!caught_up_ && connection_ == 0) next = std::min(next, grace_until_);
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
  if (caught_up_) return true;
  if (prepared || !live_ || !ServerLeftOldImage()) return false;
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
    if (!from.empty())
      std::memcpy(standby.MutableTensor(i).data(), from.data(), from.size());
  };
  if (options_.pool != nullptr) {
    options_.pool->ParallelFor(n, copy);
  } else {
    for (size_t i = 0; i < n; ++i) copy(i, 0);
  }
  return standby.Commit(target, id);
}

void ServingImages::OnEvent(const ServingPort::Event& e) {
  using Kind = ServingPort::Event::Kind;
  switch (e.kind) {
    case Kind::kAttached:
      connection_ = e.connection;
      server_image_.reset();
      stats_.attached = true;
      spdlog::info("{}: a serving process attached ({})", options_.node,
                   port_->path());
      return;
    case Kind::kDetached:
      if (e.connection != connection_) return;
      connection_ = 0;
      server_image_.reset();
      stats_.attached = false;
      // Gone: it reads nothing now, and a prepare waits for no one.
      grace_until_ = Clock::now();
      spdlog::warn("{}: the serving process detached: {}{}", options_.node,
                   e.detail,
                   pause_started_ ? " (during its pause; it moves to the live "
                                    "image when it comes back)"
                                  : "");
      pause_started_.reset();
      return;
    case Kind::kMessage:
      break;
  }
  if (e.connection != connection_) return;
  const PauseMsg& m = e.msg;
  switch (m.op) {
    case PauseMsg::Op::kHello:
      server_image_ = m.image;
      spdlog::info("{}: serving process {} reads image {}", options_.node,
                   m.pid, m.image ? std::to_string(*m.image) : "none");
      if (live_state_) {
        PauseMsg live;
        live.op = PauseMsg::Op::kLive;
        live.image = live_state_->image;
        live.version = live_state_->version;
        live.flips = live_state_->flips;
        port_->Send(connection_, live);
      }
      return;
    case PauseMsg::Op::kReady:
      if (prepared_refit_ == m.refit) ready_ = true;
      return;
    case PauseMsg::Op::kFlipped:
      server_image_ = m.image;
      if (pause_started_ && live_state_ && m.image == live_state_->image) {
        stats_.pauses += 1;
        stats_.last_pause_seconds = Seconds(Clock::now() - *pause_started_);
        spdlog::info(
            "{}: the serving process runs on step {} (paused {:.1f} "
            "ms after COMMIT)",
            options_.node, m.version.step, stats_.last_pause_seconds * 1e3);
        pause_started_.reset();
      }
      return;
    default:
      port_->Detach(connection_, fmt::format("it sent a relay's message ({})",
                                             PauseOpName(m.op)));
      return;
  }
}

}  // namespace dcr
