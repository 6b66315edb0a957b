#include "relay/relay.h"

#include <fmt/format.h>
#include <malloc.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "common/failpoint.h"
#include "dcr/codec.h"
#include "dcr/thread_pool.h"
#include "relay/fanout.h"
#include "relay/mailbox.h"
#include "relay/messages.h"
#include "relay/refit_session.h"

namespace dcr {
namespace {

using Clock = std::chrono::steady_clock;

// What the apply workers report back about one refit.
struct ApplyTracker {
  std::atomic<uint64_t> in_flight{0};
  std::atomic<uint64_t> backlog_bytes{0};
  std::atomic<uint64_t> applied{0};
  std::atomic<uint64_t> duplicates{0};
  std::mutex mu;
  Status first_error;  // guarded by mu
};

// Applies chunks on a few threads, each with its own decoder.
class ApplyWorkers {
 public:
  struct Job {
    FrameBuffer buffer;  // keeps `chunk` alive
    std::span<const std::byte> chunk;
    RefitSession* session = nullptr;
    std::shared_ptr<ApplyTracker> tracker;
  };

  ApplyWorkers(size_t threads, Mailbox* mailbox) : mailbox_(mailbox) {
    for (size_t i = 0; i < std::max<size_t>(1, threads); ++i) {
      threads_.emplace_back([this] { Loop(); });
    }
  }
  ~ApplyWorkers() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  void Submit(Job job) {
    job.tracker->in_flight += 1;
    job.tracker->backlog_bytes += job.chunk.size();
    {
      std::lock_guard lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

 private:
  void Loop() {
    auto decoder = ChunkDecoder::Create();
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stop_ and nothing left
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      Status error;
      if (!decoder.ok()) {
        error = decoder.status();
      } else {
        auto outcome = job.session->Apply(job.chunk, decoder->get());
        if (!outcome.ok()) {
          error = outcome.status();
        } else if (*outcome == RefitSession::ApplyOutcome::kApplied) {
          job.tracker->applied += 1;
        } else {
          job.tracker->duplicates += 1;
        }
      }
      if (!error.ok()) {
        std::lock_guard lock(job.tracker->mu);
        if (job.tracker->first_error.ok()) job.tracker->first_error = error;
      }
      job.tracker->backlog_bytes -= job.chunk.size();
      job.tracker->in_flight -= 1;
      mailbox_->Wake();
    }
  }

  Mailbox* mailbox_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;  // guarded by mu_
  bool stop_ = false;     // guarded by mu_
  std::vector<std::thread> threads_;
};

enum class Phase {
  kPlanning,    // waiting for the children's PLAN_REPLY
  kReceiving,   // chunks flow
  kVoting,      // END arrived: drain applies, vote, wait for children
  kVoted,       // VOTE sent; waiting for COMMIT or ABORT
  kCommitting,  // COMMIT arrived: commit or restore, wait for children
  kAborting,    // ABORT arrived: restore, wait for children
  kOrphaned,    // the parent left before COMMIT: restore, then end
};

const char* PhaseName(Phase p) {
  switch (p) {
    case Phase::kPlanning:
      return "planned";
    case Phase::kReceiving:
      return "receiving";
    case Phase::kVoting:
      return "voting";
    case Phase::kVoted:
      return "voted";
    case Phase::kCommitting:
      return "committing";
    case Phase::kAborting:
      return "aborting";
    case Phase::kOrphaned:
      return "aborting";
  }
  return "?";
}

// A damaged copy of `bytes` for a corrupt failpoint: the original buffer is
// shared with the other children's queues and is never written.
FrameBuffer CorruptedCopy(std::span<const std::byte> bytes,
                          const FailpointHit& fp) {
  auto copy =
      std::make_shared<std::vector<std::byte>>(bytes.begin(), bytes.end());
  fp.Corrupt(*copy);
  return copy;
}

// Forwards a CHUNK to the children as the relay.forward failpoint says: as
// is, not at all (drop), a damaged copy (corrupt), or its first bytes and
// then every child link closed (cut). Returns the chunk sends.
size_t ForwardChunk(Fanout& fanout, const FrameBuffer& frame,
                    const FailpointHit& fp) {
  if (fp.drop()) return 0;
  if (fp.corrupt()) {
    return fanout.Forward(CorruptedCopy(*frame, fp), /*chunk=*/true);
  }
  if (!fp.cut()) return fanout.Forward(frame, /*chunk=*/true);
  size_t keep = static_cast<size_t>(std::min<uint64_t>(fp.arg, frame->size()));
  size_t n = fanout.Forward(std::make_shared<std::vector<std::byte>>(
                                frame->begin(), frame->begin() + keep),
                            /*chunk=*/true);
  fanout.Close();
  return n;
}

}  // namespace

class Relay::Impl {
 public:
  explicit Impl(RelayOptions options) : options_(std::move(options)) {}
  ~Impl() { Stop(); }

  Status Init();
  uint16_t port() const { return transport_->BoundPort(); }
  RelayStats Stats() const;
  void Stop();

 private:
  class InboundHandler;
  struct Inbound {
    std::shared_ptr<Link> link;
    bool greeted = false;
    HelloMsg hello;
  };
  struct Refit {
    RefitId id;
    uint64_t epoch = 0;
    PlanMsg plan;
    std::shared_ptr<Link> up;
    std::unique_ptr<RefitSession> session;  // null: forward-only
    NodeResult own;                         // PLAN result (refusal if any)
    std::shared_ptr<Fanout> fanout;
    std::shared_ptr<ApplyTracker> tracker = std::make_shared<ApplyTracker>();
    Phase phase = Phase::kPlanning;
    std::optional<EndMsg> end;
    std::optional<NodeResult> local;  // this phase's own result, once done
    std::optional<CommitMsg> commit;
    bool voted_yes = false;  // commit only what this node verified
    bool paused = false;
    Clock::time_point started = Clock::now();
  };

  void Run();
  void Step();
  void OnInboundFrame(const std::shared_ptr<Link>& link, const Frame& frame,
                      const FrameBuffer& buffer);
  void OnInboundClosed(uint64_t link_id, const Status& why);
  void OnPlan(const std::shared_ptr<Link>& link, const Frame& frame);
  void OnRefitFrame(const Frame& frame, const FrameBuffer& buffer);
  void Reply(Link& link, FrameType type, const FrameHeader& about,
             const std::vector<std::byte>& payload);
  void ReplyResults(FrameType type, std::vector<NodeResult> own_first);
  std::vector<NodeResult> RefuseWhole(const PlanMsg& plan, NodeCode code,
                                      const std::string& detail);
  NodeResult LocalFinish(bool commit);
  void EndRefit(const std::string& result, bool committed);
  void SendError(Link& link, const std::string& message);
  void MaybePause();
  void MaybeResume();
  void PublishStats();

  RelayOptions options_;
  std::unique_ptr<WeightStore> store_;  // null until a full refit creates it
  std::unique_ptr<Transport> transport_;
  Mailbox mailbox_;
  std::unique_ptr<ApplyWorkers> workers_;
  std::unique_ptr<ThreadPool> hash_pool_;
  std::unique_ptr<ChunkDecoder> decoder_;  // for Abort on the actor thread
  std::thread actor_;
  std::atomic<bool> stopping_{false};
  std::once_flag stop_once_;

  // Actor state.
  std::map<uint64_t, Inbound> inbound_;
  std::optional<Refit> refit_;
  uint64_t max_epoch_ = 0;
  uint64_t sequence_ = 0;  // frames this relay originates
  uint64_t last_chunks_applied_ = 0;

  // Counters (written by the actor, read by Stats).
  std::atomic<uint64_t> bytes_in_{0};
  std::atomic<uint64_t> bytes_out_closed_{0};
  std::atomic<uint64_t> chunks_received_{0};
  std::atomic<uint64_t> chunks_applied_{0};
  std::atomic<uint64_t> chunks_forwarded_{0};
  std::atomic<uint64_t> chunks_dropped_{0};
  std::atomic<uint64_t> refits_committed_{0};
  std::atomic<uint64_t> refits_aborted_{0};
  mutable std::mutex stats_mu_;
  RelayStats published_;  // guarded by stats_mu_
};

class Relay::Impl::InboundHandler : public LinkHandler {
 public:
  explicit InboundHandler(Impl* impl) : impl_(impl) {}
  void OnOpen(Link& link) override {
    impl_->mailbox_.Post([impl = impl_, l = link.shared_from_this()] {
      impl->inbound_[l->id()].link = l;
    });
  }
  void OnFrame(Link& link, const Frame& frame,
               const FrameBuffer& buffer) override {
    impl_->mailbox_.Post([impl = impl_, l = link.shared_from_this(), frame,
                          buffer] { impl->OnInboundFrame(l, frame, buffer); });
  }
  void OnClosed(Link& link, const Status& why) override {
    impl_->mailbox_.Post([impl = impl_, id = link.id(), why] {
      impl->OnInboundClosed(id, why);
    });
  }

 private:
  Impl* impl_;
};

Status Relay::Impl::Init() {
  if (options_.name.empty()) {
    return Status::InvalidArgument("relay: a node name is required");
  }
  auto store = OpenStore(options_.store);
  if (store.ok()) {
    store_ = *std::move(store);
  } else if (store.status().code() == StatusCode::kNotFound) {
    spdlog::warn("{}: {}; it joins the next full refit (dcr refit --full)",
                 options_.name, store.status().message());
  } else {
    return store.status();
  }
  if (store_ && store_->InProgress()) {
    spdlog::warn(
        "{}: {} holds an unfinished refit ({}); it takes no delta refit "
        "until a full refit repairs it",
        options_.name, store_->describe(), store_->InProgress()->refit.ToHex());
  }
  TransportOptions to = options_.transport_options;
  to.name = options_.name;
  DCR_ASSIGN_OR_RETURN(transport_, CreateTransport(options_.transport, to));
  DCR_ASSIGN_OR_RETURN(decoder_, ChunkDecoder::Create());
  workers_ = std::make_unique<ApplyWorkers>(options_.apply_threads, &mailbox_);
  hash_pool_ = std::make_unique<ThreadPool>(options_.apply_threads);
  Status s = transport_->Listen(options_.listen_host, options_.listen_port,
                                std::make_shared<InboundHandler>(this));
  if (!s.ok()) {
    transport_->Stop();
    return s;
  }
  PublishStats();
  actor_ = std::thread([this] { Run(); });
  spdlog::info("{}: listening on {}:{} with {}", options_.name,
               options_.listen_host, port(),
               store_ ? store_->describe() : options_.store.ToString());
  return Status::OK();
}

void Relay::Impl::Run() {
  while (!stopping_) {
    Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(200);
    if (refit_) {
      deadline = std::min(
          deadline,
          Clock::now() + std::chrono::milliseconds(refit_->paused ? 5 : 50));
      if (refit_->fanout)
        deadline = std::min(deadline, refit_->fanout->deadline());
    }
    mailbox_.RunUntil(deadline);
    Step();
    PublishStats();
  }
  // Shutdown: let the applies of a refit in progress finish, then restore
  // the base bits.
  if (refit_) {
    while (refit_->tracker->in_flight > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    LocalFinish(/*commit=*/false);  // no-op once committed
    EndRefit("aborted: the relay stopped", false);
  }
  PublishStats();
}

void Relay::Impl::Stop() {
  std::call_once(stop_once_, [this] {
    stopping_ = true;
    mailbox_.Wake();
    if (actor_.joinable()) actor_.join();
    if (transport_) transport_->Stop();
    mailbox_.Close();
    workers_.reset();
    if (store_) spdlog::info("{}: stopped", options_.name);
  });
}

void Relay::Impl::SendError(Link& link, const std::string& message) {
  FrameHeader h;
  h.type = FrameType::kError;
  h.sequence = sequence_++;
  auto frame = EncodeFrame(
      h, std::as_bytes(std::span<const char>(message.data(), message.size())),
      options_.transport_options.frames);
  if (frame.ok()) link.Send(*frame);
}

void Relay::Impl::Reply(Link& link, FrameType type, const FrameHeader& about,
                        const std::vector<std::byte>& payload) {
  FrameHeader h;
  h.type = type;
  h.epoch = about.epoch;
  h.refit_id = about.refit_id;
  h.sequence = sequence_++;
  auto frame = EncodeFrame(h, payload, options_.transport_options.frames);
  if (!frame.ok()) {
    spdlog::error("{}: cannot encode {}: {}", options_.name,
                  FrameTypeName(type), frame.status().ToString());
    return;
  }
  link.Send(*frame);
}

void Relay::Impl::OnInboundFrame(const std::shared_ptr<Link>& link,
                                 const Frame& frame,
                                 const FrameBuffer& buffer) {
  Inbound& in = inbound_[link->id()];
  in.link = link;
  if (!in.greeted) {
    if (frame.type() != FrameType::kHello) {
      SendError(*link, "the first frame must be HELLO");
      link->CloseAfterFlush();
      return;
    }
    auto hello = DecodeHello(frame.payload);
    if (!hello.ok()) {
      SendError(*link, hello.status().ToString());
      link->CloseAfterFlush();
      return;
    }
    in.greeted = true;
    in.hello = *hello;
    HelloMsg mine{options_.name, kRoleRelay, max_epoch_};
    Reply(*link, FrameType::kHello, frame.header, EncodeHello(mine));
    return;
  }
  switch (frame.type()) {
    case FrameType::kStatusRequest: {
      NodeResult r;
      r.node = options_.name;
      if (store_) {
        if (auto c = store_->committed()) r.version = *c;
      } else {
        r.code = NodeCode::kNeedsCatchUp;
      }
      r.chunks_applied = last_chunks_applied_;
      {
        std::lock_guard lock(stats_mu_);
        r.detail = published_.state;
        if (!published_.last_result.empty()) {
          r.detail += "; last refit " + published_.last_result;
        }
      }
      Reply(*link, FrameType::kStatusReply, frame.header,
            EncodeResults(ResultsMsg{{r}}));
      return;
    }
    case FrameType::kPlan:
      OnPlan(link, frame);
      return;
    case FrameType::kHeartbeat:
      return;
    default:
      break;
  }
  if (!refit_ || refit_->up.get() != link.get() ||
      frame.header.refit_id != refit_->id) {
    if (frame.type() == FrameType::kChunk) chunks_dropped_ += 1;
    spdlog::debug("{}: dropping {} outside its refit", options_.name,
                  FrameTypeName(frame.type()));
    return;
  }
  bytes_in_ += buffer->size();
  OnRefitFrame(frame, buffer);
}

std::vector<NodeResult> Relay::Impl::RefuseWhole(const PlanMsg& plan,
                                                 NodeCode code,
                                                 const std::string& detail) {
  std::vector<NodeResult> out;
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    NodeResult r;
    r.node = plan.nodes[i].name;
    r.code = code;
    r.detail = i == 0 ? detail
                      : fmt::format("behind {}, which refused the plan",
                                    options_.name);
    out.push_back(std::move(r));
  }
  return out;
}

void Relay::Impl::OnPlan(const std::shared_ptr<Link>& link,
                         const Frame& frame) {
  bytes_in_ += frame.bytes.size();
  auto plan = DecodePlan(frame.payload);
  if (!plan.ok()) {
    SendError(*link, plan.status().ToString());
    link->CloseAfterFlush();
    return;
  }
  if (DCR_FAILPOINT("relay.plan").drop()) return;
  auto refuse = [&](NodeCode code, const std::string& detail) {
    spdlog::warn("{}: refusing the plan of refit {}: {}", options_.name,
                 frame.header.refit_id.ToHex(), detail);
    Reply(*link, FrameType::kPlanReply, frame.header,
          EncodeResults(ResultsMsg{RefuseWhole(*plan, code, detail)}));
  };
  if (plan->nodes[0].name != options_.name) {
    return refuse(NodeCode::kRejected,
                  fmt::format("this is node '{}', the plan is for '{}'",
                              options_.name, plan->nodes[0].name));
  }
  if (frame.header.epoch < max_epoch_) {
    return refuse(NodeCode::kRejected,
                  fmt::format("stale coordinator epoch {} (seen {})",
                              frame.header.epoch, max_epoch_));
  }
  if (refit_) {
    if (refit_->id == frame.header.refit_id) return;  // a duplicate PLAN
    return refuse(NodeCode::kBusy,
                  fmt::format("refit {} is in progress", refit_->id.ToHex()));
  }
  max_epoch_ = frame.header.epoch;

  Refit r;
  r.id = frame.header.refit_id;
  r.epoch = frame.header.epoch;
  r.plan = *std::move(plan);
  r.up = link;
  r.own.node = options_.name;
  bool fresh = false;  // the store is created for this refit
  if (!store_ && r.plan.mode == RefitMode::kFull && !r.plan.tensors.empty()) {
    auto manifest = Manifest::Create(r.plan.tensors);
    if (!manifest.ok() || manifest->digest() != r.plan.manifest) {
      r.own.code = NodeCode::kRejected;
      r.own.detail = "the plan's manifest does not match its digest";
    } else {
      auto created = CreateStore(options_.store, *manifest);
      if (created.ok()) {
        store_ = *std::move(created);
        fresh = true;
        spdlog::info("{}: created {} for the full refit", options_.name,
                     store_->describe());
      } else {
        r.own.code = NodeCode::kStoreError;
        r.own.detail = created.status().ToString();
      }
    }
  } else if (!store_) {
    r.own.code = NodeCode::kNeedsCatchUp;
    r.own.detail = fmt::format(
        "{} does not exist; seed it with a full refit (dcr refit --full)",
        options_.store.ToString());
  }
  if (store_ && r.own.code == NodeCode::kOk) {
    r.session =
        RefitSession::Begin(store_.get(), options_.name, r.id, r.plan, &r.own,
                            {.pool = hash_pool_.get(),
                             .fresh_store = fresh,
                             .undo_dir = std::nullopt});
  }
  if (!r.session) {
    spdlog::warn("{}: not applying refit {} ({}: {}); forwarding only",
                 options_.name, r.id.ToHex(), NodeCodeName(r.own.code),
                 r.own.detail);
  }
  Fanout::Options fo;
  fo.transport = transport_.get();
  fo.mailbox = &mailbox_;
  fo.connect_timeout = options_.connect_timeout;
  fo.hello = HelloMsg{options_.name, kRoleRelay, r.epoch};
  fo.frames = options_.transport_options.frames;
  fo.header = frame.header;
  r.fanout = Fanout::Create(fo, r.plan);
  r.fanout->Start(Clock::now() +
                  std::chrono::milliseconds(r.plan.phase_timeout_ms));
  spdlog::info("{}: refit {} planned: {} step {} -> {} ({} children)",
               options_.name, r.id.ToHex(),
               r.plan.mode == RefitMode::kFull ? "full" : "delta",
               r.plan.base.step, r.plan.target.step, r.fanout->child_count());
  refit_.emplace(std::move(r));
}

void Relay::Impl::OnRefitFrame(const Frame& frame, const FrameBuffer& buffer) {
  Refit& r = *refit_;
  auto deadline = [&] {
    return Clock::now() + std::chrono::milliseconds(r.plan.phase_timeout_ms);
  };
  switch (frame.type()) {
    case FrameType::kChunk: {
      chunks_received_ += 1;
      if (r.phase != Phase::kReceiving) {
        chunks_dropped_ += 1;
        return;
      }
      chunks_forwarded_ +=
          ForwardChunk(*r.fanout, buffer, DCR_FAILPOINT("relay.forward"));
      if (r.session) {
        FailpointHit fp = DCR_FAILPOINT("relay.apply_chunk");
        if (fp.corrupt()) {
          FrameBuffer copy = CorruptedCopy(frame.payload, fp);
          workers_->Submit({copy, *copy, r.session.get(), r.tracker});
        } else if (!fp.drop()) {
          workers_->Submit({buffer, frame.payload, r.session.get(), r.tracker});
        }
      }
      MaybePause();
      return;
    }
    case FrameType::kEnd: {
      auto end = DecodeEnd(frame.payload);
      if (!end.ok() || r.phase != Phase::kReceiving) {
        spdlog::warn("{}: bad END: {}", options_.name,
                     end.ok() ? "out of order" : end.status().ToString());
        return;
      }
      r.fanout->Forward(buffer);
      r.fanout->Expect(FrameType::kVote, deadline());
      r.end = *end;
      r.phase = Phase::kVoting;
      r.local.reset();
      return;
    }
    case FrameType::kCommit: {
      auto commit = DecodeCommit(frame.payload);
      if (!commit.ok()) {
        spdlog::warn("{}: bad COMMIT: {}", options_.name,
                     commit.status().ToString());
        return;
      }
      if (DCR_FAILPOINT("relay.commit").drop()) return;
      r.fanout->Forward(buffer);
      r.fanout->Expect(FrameType::kCommitReply, deadline());
      r.commit = *commit;
      r.phase = Phase::kCommitting;
      r.local.reset();
      return;
    }
    case FrameType::kAbort: {
      if (DCR_FAILPOINT("relay.abort").drop()) return;
      r.fanout->Forward(buffer);
      r.fanout->Expect(FrameType::kAbortReply, deadline());
      r.phase = Phase::kAborting;
      r.local.reset();
      return;
    }
    default:
      spdlog::debug("{}: ignoring {}", options_.name,
                    FrameTypeName(frame.type()));
  }
}

void Relay::Impl::OnInboundClosed(uint64_t link_id, const Status& why) {
  inbound_.erase(link_id);
  if (!refit_ || refit_->up->id() != link_id) return;
  if (refit_->phase == Phase::kCommitting ||
      refit_->phase == Phase::kAborting) {
    return;  // finish what the parent asked; no one to answer
  }
  spdlog::warn(
      "{}: parent link closed during refit {} ({}); restoring the "
      "base",
      options_.name, refit_->id.ToHex(), why.ok() ? "closed" : why.ToString());
  if (refit_->paused) refit_->paused = false;
  refit_->phase = Phase::kOrphaned;
  refit_->local.reset();
  refit_->fanout->Close();
}

void Relay::Impl::MaybePause() {
  Refit& r = *refit_;
  if (r.paused) return;
  if (r.fanout->MaxQueuedBytes() > r.plan.chunk_window_bytes ||
      r.tracker->backlog_bytes > options_.apply_window_bytes) {
    r.up->PauseReading();
    r.paused = true;
  }
}

void Relay::Impl::MaybeResume() {
  Refit& r = *refit_;
  if (!r.paused) return;
  if (r.fanout->MaxQueuedBytes() <= r.plan.chunk_window_bytes / 2 &&
      r.tracker->backlog_bytes <= options_.apply_window_bytes / 2) {
    r.up->ResumeReading();
    r.paused = false;
  }
}

NodeResult Relay::Impl::LocalFinish(bool commit) {
  Refit& r = *refit_;
  NodeResult out = r.own;
  out.chunks_applied = r.tracker->applied;
  if (!r.session) return out;
  Status s;
  if (commit) {
    s = r.session->Commit();
    if (s.ok()) out.version = r.plan.target;
  } else {
    s = r.session->Abort(decoder_.get());
    if (s.ok()) {
      out.version = r.plan.base;
      out.detail = "base restored";
    }
  }
  if (!s.ok()) {
    out.code = NodeCode::kStoreError;
    out.detail = s.ToString();
    spdlog::error("{}: {} failed: {}", options_.name,
                  commit ? "commit" : "restore", s.ToString());
  }
  r.session.reset();
  return out;
}

void Relay::Impl::ReplyResults(FrameType type,
                               std::vector<NodeResult> own_first) {
  Refit& r = *refit_;
  std::vector<NodeResult> children = r.fanout->Results();
  own_first.insert(own_first.end(), children.begin(), children.end());
  FrameHeader about;
  about.epoch = r.epoch;
  about.refit_id = r.id;
  Reply(*r.up, type, about, EncodeResults(ResultsMsg{std::move(own_first)}));
}

void Relay::Impl::EndRefit(const std::string& result, bool committed) {
  Refit& r = *refit_;
  double seconds =
      std::chrono::duration<double>(Clock::now() - r.started).count();
  last_chunks_applied_ = r.tracker->applied;
  bytes_out_closed_ += r.fanout->BytesSent();
  r.fanout->Close();
  (committed ? refits_committed_ : refits_aborted_) += 1;
  spdlog::info("{}: refit {} {} in {:.3f} s ({} chunks applied)", options_.name,
               r.id.ToHex(), result, seconds, r.tracker->applied.load());
  {
    std::lock_guard lock(stats_mu_);
    published_.last_refit_seconds = seconds;
    published_.last_result = fmt::format("{} {}", r.id.ToHex(), result);
  }
  refit_.reset();
  // Give the refit's buffers back to the system: a relay idles between
  // refits, and glibc keeps freed arenas otherwise.
#if !defined(__SANITIZE_ADDRESS__) && !defined(DCR_SANITIZED)
  ::malloc_trim(0);  // glibc's; under ASan malloc is not glibc's (crashes)
#endif
}

void Relay::Impl::Step() {
  if (!refit_) return;
  Refit& r = *refit_;
  Clock::time_point now = Clock::now();
  r.fanout->ExpireIfDue(now);
  chunks_applied_ = r.tracker->applied.load();
  bool drained = r.tracker->in_flight == 0;
  switch (r.phase) {
    case Phase::kPlanning:
      if (r.fanout->Complete()) {
        ReplyResults(FrameType::kPlanReply, {r.own});
        r.phase = Phase::kReceiving;
      }
      break;
    case Phase::kReceiving:
      MaybeResume();
      break;
    case Phase::kVoting:
      MaybeResume();
      if (!r.local && drained) {
        NodeResult vote = r.own;
        if (r.session) {
          Status apply_error;
          {
            std::lock_guard lock(r.tracker->mu);
            apply_error = r.tracker->first_error;
          }
          vote = r.session->Vote(*r.end, hash_pool_.get());
          if (!apply_error.ok() && vote.code == NodeCode::kOk) {
            vote.code = NodeCode::kRejected;
            vote.detail = apply_error.ToString();
          } else if (!apply_error.ok()) {
            vote.detail += "; first error: " + apply_error.ToString();
          }
        } else if (vote.code == NodeCode::kOk) {
          vote.code = NodeCode::kStoreError;
          vote.detail = "no session";
        }
        r.local = vote;
        r.voted_yes = vote.code == NodeCode::kOk;
        spdlog::info("{}: vote {} ({})", options_.name,
                     vote.code == NodeCode::kOk ? "yes" : "no",
                     vote.code == NodeCode::kOk ? "digest matches the target"
                                                : vote.detail);
      }
      if (r.local && r.fanout->Complete()) {
        if (!DCR_FAILPOINT("relay.vote").drop()) {
          ReplyResults(FrameType::kVote, {*r.local});
        }
        r.phase = Phase::kVoted;
      }
      break;
    case Phase::kVoted:
      break;
    case Phase::kCommitting:
      if (!r.local && drained) {
        bool in_set =
            r.commit && r.session && r.voted_yes &&
            std::find(r.commit->commit_set.begin(), r.commit->commit_set.end(),
                      options_.name) != r.commit->commit_set.end();
        NodeResult done = LocalFinish(in_set);
        if (!in_set && done.code == NodeCode::kOk) {
          done.detail = "not in the commit set; base restored";
        }
        r.local = done;
      }
      if (r.local && r.fanout->Complete()) {
        bool committed =
            r.local->code == NodeCode::kOk && r.local->version == r.plan.target;
        if (r.up) ReplyResults(FrameType::kCommitReply, {*r.local});
        EndRefit(committed
                     ? fmt::format("committed step {}", r.plan.target.step)
                     : "aborted (not committed here)",
                 committed);
      }
      break;
    case Phase::kAborting:
    case Phase::kOrphaned:
      if (!r.local && drained) r.local = LocalFinish(false);
      if (r.local && (r.phase == Phase::kOrphaned || r.fanout->Complete())) {
        if (r.phase == Phase::kAborting) {
          ReplyResults(FrameType::kAbortReply, {*r.local});
        }
        EndRefit(r.phase == Phase::kAborting ? "aborted by the root"
                                             : "aborted: parent link lost",
                 false);
      }
      break;
  }
}

void Relay::Impl::PublishStats() {
  RelayStats s;
  s.bytes_in = bytes_in_;
  s.bytes_out = bytes_out_closed_;
  s.chunks_received = chunks_received_;
  s.chunks_applied = chunks_applied_;
  s.chunks_forwarded = chunks_forwarded_;
  s.chunks_dropped = chunks_dropped_;
  s.refits_committed = refits_committed_;
  s.refits_aborted = refits_aborted_;
  if (store_) s.committed = store_->committed();
  if (refit_) {
    s.state = PhaseName(refit_->phase);
    s.bytes_out += refit_->fanout->BytesSent();
    s.apply_backlog_bytes = refit_->tracker->backlog_bytes;
    s.chunks_dropped += refit_->tracker->duplicates;
    for (auto& [name, bytes] : refit_->fanout->QueueDepths()) {
      s.child_queue_bytes.emplace_back(name, bytes);
    }
  } else {
    s.state = store_ ? "idle" : "no store";
  }
  std::lock_guard lock(stats_mu_);
  s.last_refit_seconds = published_.last_refit_seconds;
  s.last_result = published_.last_result;
  published_ = std::move(s);
}

RelayStats Relay::Impl::Stats() const {
  std::lock_guard lock(stats_mu_);
  return published_;
}

Result<std::unique_ptr<Relay>> Relay::Start(RelayOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  DCR_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Relay>(new Relay(std::move(impl)));
}

Relay::Relay(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Relay::~Relay() { Stop(); }
uint16_t Relay::port() const { return impl_->port(); }
RelayStats Relay::Stats() const { return impl_->Stats(); }
void Relay::Stop() { impl_->Stop(); }

}  // namespace dcr
