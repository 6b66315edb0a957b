#include "relay/relay.h"

#include <fmt/format.h>
#include <malloc.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "common/failpoint.h"
#include "common/file.h"
#include "dcr/codec.h"
#include "dcr/thread_pool.h"
#include "protocol/epoch_file.h"
#include "protocol/fanout.h"
#include "protocol/frame_sender.h"
#include "protocol/mailbox.h"
#include "protocol/messages.h"
#include "protocol/refit_manifest.h"
#include "relay/apply_workers.h"
#include "relay/chunk_forward.h"
#include "relay/memory_budget.h"
#include "relay/plan_decision.h"
#include "relay/read_gate.h"
#include "relay/refit_session.h"

namespace dcr {
namespace {

using Clock = std::chrono::steady_clock;

// The bound on a link's first frame (HELLO or ERROR, both small).
constexpr uint32_t kFirstFrameMaxPayload = 64u << 10;

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

// Where a relay persists the highest coordinator epoch it accepted: beside
// the store's version record ("<store>.dcr-epoch"); empty for a memory store
// (kept in memory).
std::string EpochPath(const StoreSpec& spec) {
  if (spec.kind == StoreSpec::Kind::kMemory) return "";
  std::string record =
      spec.record_path.empty() ? DefaultRecordPath(spec) : spec.record_path;
  constexpr std::string_view kSuffix = ".dcr-version";
  if (record.size() > kSuffix.size() && record.ends_with(kSuffix)) {
    record.resize(record.size() - kSuffix.size());
  }
  return record + ".dcr-epoch";
}

}  // namespace

class Relay::Impl {
 public:
  explicit Impl(RelayOptions options) : options_(std::move(options)) {}
  ~Impl() { Stop(); }

  Status Init();
  uint16_t port() const { return listener_->BoundPort(); }
  RelayStats Stats() const;
  void Stop();

 private:
  class InboundHandler;
  struct Inbound {
    std::shared_ptr<Link> link;
    std::shared_ptr<ReadGate> gate;
    bool greeted = false;
    HelloMsg hello;
  };
  struct Refit {
    RefitId id;
    uint64_t epoch = 0;
    PlanMsg plan;
    std::shared_ptr<Link> up;
    std::shared_ptr<ReadGate> up_gate;      // up's
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
    // Re-parenting (docs/PROTOCOL.md §"Re-parenting"): the depth of the
    // node that is our parent; whether our parent's link is gone and until
    // when we wait to be adopted (or, once voted, for the decision).
    uint32_t parent_depth = 0;
    bool orphaned = false;
    Clock::time_point orphan_deadline;
    // Liveness of the parent link (heartbeats).
    Clock::time_point last_up_rx = Clock::now();
    Clock::time_point last_up_heartbeat = Clock::now();
    // What we answered upstream, resent to a new parent: our PLAN_REPLY and
    // the last reply of a later phase.
    std::vector<std::byte> plan_reply;
    std::optional<std::pair<FrameType, std::vector<std::byte>>> last_reply;
    // The last CHUNK taken from a parent; an adopter that asks for it
    // (PlanMsg::resend) resends what came after. While planning, whether
    // the PLAN_REPLY still to come goes to such an adopter.
    FramePosition received_through;
    bool reply_position = false;
  };

  void Run();
  void Step();
  void OnInboundFrame(const std::shared_ptr<Link>& link, const Frame& frame,
                      const FrameBuffer& buffer);
  void OnInboundClosed(uint64_t link_id, const Status& why);
  void OnPlan(const std::shared_ptr<Link>& link, const Frame& frame);
  void OnAdoption(const std::shared_ptr<Link>& link, const Frame& frame,
                  const PlanMsg& plan);
  void Orphan(const std::string& why);
  void Heartbeats(Clock::time_point now);
  void OnRefitFrame(const Frame& frame, const FrameBuffer& buffer);
  void Reply(Link& link, FrameType type, const FrameHeader& about,
             const std::vector<std::byte>& payload);
  void ReplyResults(FrameType type, std::vector<NodeResult> own_first);
  // Our PLAN_REPLY for an adopter, with our position if it asked.
  std::vector<std::byte> PlanReplyFor(bool position);
  std::vector<NodeResult> RefuseWhole(const PlanMsg& plan, NodeCode code,
                                      const std::string& detail);
  NodeResult LocalFinish(bool commit);
  void EndRefit(const std::string& result, bool committed);
  void SendError(Link& link, const std::string& message);
  void MaybePause();
  void MaybeResume();
  // The read gate of an inbound link (one without a gate, which the
  // listener did not open, gets one that only the windows close).
  std::shared_ptr<ReadGate> GateOf(Link& link);
  void PublishStats();
  // Sizes the bounds from options_.memory_limit_bytes (RelayOptions).
  Status ApplyMemoryLimit();
  Status LoadEpoch();
  Status PersistEpoch(uint64_t epoch);

  RelayOptions options_;
  EpochFile epoch_file_{""};
  std::unique_ptr<WeightStore> store_;  // null until a full refit creates it
  // The node's transports: the one it listens on (listener_, of
  // options_.transport) and those its children's links need.
  std::unique_ptr<TransportSet> transports_;
  Transport* listener_ = nullptr;
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
  // The refit that ended last and what we answered in it: a parent that
  // lost our final reply reconnects (an adoption PLAN) and gets it again.
  struct Finished {
    RefitId id;
    uint64_t epoch = 0;
    std::vector<std::byte> plan_reply;
    std::optional<std::pair<FrameType, std::vector<std::byte>>> last_reply;
  };
  std::optional<Finished> finished_;
  uint64_t max_epoch_ = 0;
  // Frames this relay originates; made once Init fixed the frame options.
  std::optional<FrameSender> sender_;
  uint64_t last_chunks_applied_ = 0;

  RelayCounters counters_;
  StatsBoard board_;
};

// Every callback runs on the listening transport's event thread; gates_
// needs no lock.
class Relay::Impl::InboundHandler : public LinkHandler {
 public:
  explicit InboundHandler(Impl* impl) : impl_(impl) {}
  void OnOpen(Link& link) override {
    const size_t most = impl_->options_.max_inbound_links;
    if (most != 0 && gates_.size() >= most) {
      uint64_t n = ++impl_->counters_.links_refused;
      if ((n & (n - 1)) == 0) {  // the 1st, 2nd, 4th, ... time
        spdlog::warn(
            "{}: closing a connection from {}: {} links are open, the most "
            "its memory limit allows ({} refused so far)",
            impl_->options_.name, link.peer(), most, n);
      }
      link.Close();
      return;
    }
    auto gate = std::make_shared<ReadGate>(link.weak_from_this(),
                                           impl_->options_.inbound_quota_bytes);
    gates_.emplace(link.id(), gate);
    impl_->mailbox_.Post(
        [impl = impl_, l = link.shared_from_this(), gate = std::move(gate)] {
          Inbound& in = impl->inbound_[l->id()];
          in.link = l;
          in.gate = gate;
        });
  }
  void OnFrame(Link& link, const Frame& frame,
               const FrameBuffer& buffer) override {
    auto it = gates_.find(link.id());
    if (it == gates_.end()) return;  // refused in OnOpen
    const uint64_t bytes = frame.bytes.size();
    if (it->second->Queued(bytes)) ++impl_->counters_.inbound_pauses;
    impl_->mailbox_.Post([impl = impl_, l = link.shared_from_this(), frame,
                          buffer, gate = it->second, bytes] {
      impl->OnInboundFrame(l, frame, buffer);
      gate->Handled(bytes);
    });
  }
  void OnClosed(Link& link, const Status& why) override {
    if (gates_.erase(link.id()) == 0) return;  // refused in OnOpen
    impl_->mailbox_.Post([impl = impl_, id = link.id(), why] {
      impl->OnInboundClosed(id, why);
    });
  }

 private:
  Impl* impl_;
  std::map<uint64_t, std::shared_ptr<ReadGate>> gates_;
};

Status Relay::Impl::Init() {
  if (options_.name.empty()) {
    return Status::InvalidArgument("relay: a node name is required");
  }
  DCR_RETURN_IF_ERROR(ApplyMemoryLimit());
  // The first frame of every link is a HELLO (or an ERROR): a peer that
  // has not greeted cannot make the relay hold a large frame.
  FrameOptions& frames = options_.transport_options.frames;
  if (frames.first_frame_max_payload == 0) {
    frames.first_frame_max_payload =
        std::min(frames.max_payload, kFirstFrameMaxPayload);
  }
  sender_.emplace(frames);
  if (!options_.undo_dir.empty()) {
    // Found out now, not at the first refit: the directory takes an undo log.
    auto probe = UndoLog::Create(options_.undo_dir);
    if (!probe.ok()) {
      return Status::InvalidArgument(
          "undo directory '" + options_.undo_dir +
          "' cannot hold an undo log: " + probe.status().ToString());
    }
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
  epoch_file_ = EpochFile(
      EpochPath(options_.store),
      "it holds the highest coordinator epoch this relay accepted (delete "
      "it only if no older coordinator can come back)");
  DCR_RETURN_IF_ERROR(LoadEpoch());
  if (store_ && store_->InProgress()) {
    spdlog::warn(
        "{}: {} holds an unfinished refit ({}); it takes no delta refit "
        "until a full refit repairs it",
        options_.name, store_->describe(), store_->InProgress()->refit.ToHex());
  }
  TransportOptions to = options_.transport_options;
  to.name = options_.name;
  transports_ = std::make_unique<TransportSet>(
      to, to.fake_network ? std::string("fake") : std::string());
  DCR_ASSIGN_OR_RETURN(listener_, transports_->Get(options_.transport));
  DCR_ASSIGN_OR_RETURN(decoder_, ChunkDecoder::Create());
  workers_ = std::make_unique<ApplyWorkers>(options_.apply_threads,
                                            [this] { mailbox_.Wake(); });
  hash_pool_ = std::make_unique<ThreadPool>(options_.apply_threads);
  Status s = listener_->Listen(options_.listen_host, options_.listen_port,
                               std::make_shared<InboundHandler>(this));
  if (!s.ok()) {
    transports_->Stop();
    return s;
  }
  PublishStats();
  actor_ = std::thread([this] { Run(); });
  spdlog::info("{}: listening on {}:{} ({}) with {}", options_.name,
               options_.listen_host, port(), listener_->kind(),
               store_ ? store_->describe() : options_.store.ToString());
  return Status::OK();
}

Status Relay::Impl::ApplyMemoryLimit() {
  if (options_.memory_limit_bytes == 0) return Status::OK();
  FrameOptions& frames = options_.transport_options.frames;
  DCR_ASSIGN_OR_RETURN(
      MemoryBudget b,
      PlanMemoryBudget(options_.memory_limit_bytes, options_.apply_threads,
                       frames.max_payload));
  auto lower = [](auto& bound, auto cap) {
    if (bound == 0 || bound > cap) bound = cap;
  };
  lower(options_.apply_window_bytes, b.apply_window_bytes);
  lower(options_.forward_window_cap, b.forward_window_bytes);
  lower(options_.inbound_quota_bytes, b.inbound_quota_bytes);
  lower(options_.max_inbound_links, b.max_inbound_links);
  frames.max_payload = b.max_frame_payload;
  options_.resend_buffer_bytes =
      std::min(options_.resend_buffer_bytes.value_or(b.resend_buffer_bytes),
               b.resend_buffer_bytes);
  // A last guard per link: a child's queue never holds more than the
  // forward window, what is in flight from the parent and one frame.
  lower(options_.transport_options.max_queued_bytes,
        static_cast<size_t>(b.forward_window_bytes + b.inbound_quota_bytes +
                            2ull * b.max_frame_payload));
  spdlog::info("{}: memory limit {}", options_.name, b.ToString());
  return Status::OK();
}

Status Relay::Impl::LoadEpoch() {
  DCR_ASSIGN_OR_RETURN(max_epoch_, epoch_file_.Read());
  return Status::OK();
}

Status Relay::Impl::PersistEpoch(uint64_t epoch) {
  if (epoch <= max_epoch_) return Status::OK();
  DCR_RETURN_IF_ERROR(epoch_file_.Write(epoch));
  max_epoch_ = epoch;
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
    refit_->tracker->WaitIdle();
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
    if (transports_) transports_->Stop();
    mailbox_.Close();
    workers_.reset();
    if (store_) spdlog::info("{}: stopped", options_.name);
  });
}

void Relay::Impl::SendError(Link& link, const std::string& message) {
  auto frame = sender_->Next(
      FrameType::kError,
      std::as_bytes(std::span<const char>(message.data(), message.size())));
  if (frame.ok()) link.Send(*frame);
}

void Relay::Impl::Reply(Link& link, FrameType type, const FrameHeader& about,
                        const std::vector<std::byte>& payload) {
  auto frame = sender_->Reply(type, about, payload);
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
  if (refit_ && refit_->up.get() == link.get()) {
    refit_->last_up_rx = Clock::now();
  }
  if (!in.greeted && !options_.peer_addresses.empty()) {
    std::string host = link->peer();
    if (size_t colon = host.rfind(':'); colon != std::string::npos) {
      host.resize(colon);
    }
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    if (std::find(options_.peer_addresses.begin(),
                  options_.peer_addresses.end(),
                  host) == options_.peer_addresses.end()) {
      spdlog::warn(
          "{}: refusing a connection from {}: not a host of the "
          "topology",
          options_.name, link->peer());
      SendError(*link, fmt::format("{} takes connections only from the "
                                   "topology's hosts; {} is not one",
                                   options_.name, host));
      link->CloseAfterFlush();
      return;
    }
  }
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
      const RelayStats published = board_.Get();
      r.detail = published.state;
      if (!published.last_result.empty()) {
        r.detail += "; last refit " + published.last_result;
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
  if (!refit_ && finished_ && frame.header.refit_id == finished_->id &&
      frame.header.epoch >= finished_->epoch &&
      (frame.type() == FrameType::kCommit ||
       frame.type() == FrameType::kAbort)) {
    // A resumed coordinator (or a parent that reconnected) decides a refit
    // that already ended here: tell it how it ended.
    FrameType want = frame.type() == FrameType::kCommit
                         ? FrameType::kCommitReply
                         : FrameType::kAbortReply;
    if (finished_->last_reply && finished_->last_reply->first == want) {
      Reply(*link, want, frame.header, finished_->last_reply->second);
      return;
    }
    NodeResult r;
    r.node = options_.name;
    if (store_) {
      if (auto c = store_->committed()) r.version = *c;
    }
    r.detail = "the refit had already ended here";
    if (const RelayStats published = board_.Get();
        !published.last_result.empty()) {
      r.detail += ": " + published.last_result;
    }
    Reply(*link, want, frame.header, EncodeResults(ResultsMsg{{r}}));
    return;
  }
  if (!refit_ || refit_->up.get() != link.get() ||
      frame.header.refit_id != refit_->id ||
      frame.header.epoch < refit_->epoch) {
    if (frame.type() == FrameType::kChunk) counters_.chunks_dropped += 1;
    spdlog::debug("{}: dropping {} outside its refit", options_.name,
                  FrameTypeName(frame.type()));
    return;
  }
  if (frame.header.epoch > refit_->epoch) {
    // Forwarded from a resumed coordinator (dcr refit --resume).
    if (!PersistEpoch(frame.header.epoch).ok()) return;
    refit_->epoch = frame.header.epoch;
  }
  counters_.bytes_in += buffer->size();
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
  counters_.bytes_in += frame.bytes.size();
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
  PlanFacts facts;
  facts.node = options_.name;
  facts.plan_senders = options_.plan_senders;
  facts.max_epoch = max_epoch_;
  facts.epoch_file = epoch_file_.path();
  facts.refit = frame.header.refit_id;
  facts.epoch = frame.header.epoch;
  facts.sender = inbound_[link->id()].hello.node;
  facts.receiver = plan->nodes[0].name;
  facts.adopt = plan->adopt;
  facts.resume = plan->resume;
  if (refit_) {
    facts.held = PlanFacts::Held{refit_->id, refit_->epoch,
                                 link.get() == refit_->up.get(),
                                 refit_->orphaned, refit_->tracker->idle()};
  }
  if (finished_)
    facts.ended = PlanFacts::Ended{finished_->id, finished_->epoch};
  if (store_ && store_->InProgress()) {
    facts.unfinished = store_->InProgress()->refit;
  }
  const PlanDecision d = DecidePlan(facts);
  switch (d.outcome) {
    case PlanDecision::Outcome::kRefuse:
      return refuse(d.code, d.detail);
    case PlanDecision::Outcome::kAmend:
      refit_->fanout->Amend(*plan);
      return;
    case PlanDecision::Outcome::kDuplicate:
      return;
    case PlanDecision::Outcome::kAdopt:
      return OnAdoption(link, frame, *plan);
    case PlanDecision::Outcome::kResume:
      if (Status s = PersistEpoch(frame.header.epoch); !s.ok()) {
        return refuse(NodeCode::kStoreError,
                      "cannot persist the coordinator epoch: " + s.ToString());
      }
      spdlog::info("{}: refit {} resumed at epoch {} (was {})", options_.name,
                   refit_->id.ToHex(), frame.header.epoch, refit_->epoch);
      refit_->epoch = frame.header.epoch;
      return OnAdoption(link, frame, *plan);
    case PlanDecision::Outcome::kAnswerAgain:
      if (d.raise_epoch) {
        (void)PersistEpoch(frame.header.epoch);
        finished_->epoch = frame.header.epoch;
      }
      spdlog::info("{}: refit {} ended here; answering {} again", options_.name,
                   finished_->id.ToHex(), facts.sender);
      Reply(*link, FrameType::kPlanReply, frame.header, finished_->plan_reply);
      if (finished_->last_reply) {
        Reply(*link, finished_->last_reply->first, frame.header,
              finished_->last_reply->second);
      }
      return;
    case PlanDecision::Outcome::kAccept:
      break;
  }
  const bool rejoin = d.rejoin;
  if (d.replace_orphan) {
    Refit& old = *refit_;
    spdlog::warn(
        "{}: refit {} (epoch {}) was replaced by a newer coordinator run "
        "(epoch {}); restoring its base and taking the new plan",
        options_.name, old.id.ToHex(), old.epoch, frame.header.epoch);
    old.phase = Phase::kOrphaned;
    old.fanout->Close();
    old.local = LocalFinish(false);
    EndRefit("aborted: replaced by a newer coordinator run", false);
  }
  if (Status s = PersistEpoch(frame.header.epoch); !s.ok()) {
    return refuse(NodeCode::kStoreError,
                  "cannot persist the coordinator epoch: " + s.ToString());
  }

  Refit r;
  r.id = frame.header.refit_id;
  r.epoch = frame.header.epoch;
  r.plan = *std::move(plan);
  if (options_.forward_window_cap != 0 &&
      (r.plan.chunk_window_bytes == 0 ||
       r.plan.chunk_window_bytes > options_.forward_window_cap)) {
    // Our children get the smaller window too: what we hold is the bound.
    r.plan.chunk_window_bytes = options_.forward_window_cap;
  }
  r.up = link;
  r.up_gate = GateOf(*link);
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
                             .undo_dir = options_.undo_dir.empty()
                                             ? std::nullopt
                                             : std::optional(options_.undo_dir),
                             .rejoin = rejoin});
    if (rejoin && r.session) {
      spdlog::warn(
          "{}: rejoined refit {} after a restart: the store holds a mix; "
          "only overwrites apply now, the rest comes as repairs",
          options_.name, r.id.ToHex());
    }
  }
  if (!r.session) {
    spdlog::warn("{}: not applying refit {} ({}: {}); forwarding only",
                 options_.name, r.id.ToHex(), NodeCodeName(r.own.code),
                 r.own.detail);
  }
  Fanout::Options fo;
  fo.transports = transports_.get();
  fo.mailbox = &mailbox_;
  fo.connect_timeout = options_.connect_timeout;
  fo.hello = HelloMsg{options_.name, kRoleRelay, r.epoch};
  fo.frames = options_.transport_options.frames;
  fo.header = frame.header;
  fo.depth = r.plan.sender_depth + 1;
  fo.resend_buffer_bytes = options_.resend_buffer_bytes;
  r.parent_depth = r.plan.sender_depth;
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
      counters_.chunks_received += 1;
      // After a vote, chunks are a repair round: receiving again.
      if (r.phase == Phase::kVoted) {
        r.phase = Phase::kReceiving;
        r.voted_yes = false;  // the bits change: only a new vote counts
        r.fanout->Stream();
      }
      if (r.phase != Phase::kReceiving) {
        counters_.chunks_dropped += 1;
        return;
      }
      r.received_through =
          std::max(r.received_through,
                   FramePosition{frame.header.epoch, frame.header.sequence});
      counters_.chunks_forwarded +=
          ForwardChunk(*r.fanout, buffer, DCR_FAILPOINT("relay.forward"),
                       options_.transport_options.frames);
      if (r.session) {
        FailpointHit fp = DCR_FAILPOINT("relay.apply_chunk");
        bool hash = options_.signing_public_key != nullptr;
        if (fp.corrupt()) {
          FrameBuffer copy = CorruptedCopy(frame.payload, fp);
          workers_->Submit({copy, *copy, r.session.get(), r.tracker, hash});
        } else if (!fp.drop()) {
          workers_->Submit(
              {buffer, frame.payload, r.session.get(), r.tracker, hash});
        }
      }
      MaybePause();
      return;
    }
    case FrameType::kEnd: {
      auto end = DecodeEnd(frame.payload);
      // A second END (after a repair round without chunks for this
      // subtree) asks for a new vote.
      if (end.ok() && r.phase == Phase::kVoted) r.phase = Phase::kReceiving;
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
      refit_->phase == Phase::kAborting || refit_->phase == Phase::kOrphaned) {
    return;  // finish what the parent asked; no one to answer
  }
  Orphan(why.ok() ? "closed" : why.ToString());
}

std::shared_ptr<ReadGate> Relay::Impl::GateOf(Link& link) {
  Inbound& in = inbound_[link.id()];
  if (!in.gate) in.gate = std::make_shared<ReadGate>(link.weak_from_this(), 0);
  return in.gate;
}

void Relay::Impl::MaybePause() {
  Refit& r = *refit_;
  if (r.paused) return;
  if (r.fanout->MaxQueuedBytes() > r.plan.chunk_window_bytes ||
      r.tracker->backlog_bytes() > options_.apply_window_bytes) {
    r.up_gate->Set(ReadGate::kWindows, true);
    r.paused = true;
  }
}

void Relay::Impl::MaybeResume() {
  Refit& r = *refit_;
  if (!r.paused) return;
  if (r.fanout->MaxQueuedBytes() <= r.plan.chunk_window_bytes / 2 &&
      r.tracker->backlog_bytes() <= options_.apply_window_bytes / 2) {
    r.up_gate->Set(ReadGate::kWindows, false);
    r.paused = false;
    r.last_up_rx = Clock::now();  // its frames waited in the socket
  }
}

NodeResult Relay::Impl::LocalFinish(bool commit) {
  Refit& r = *refit_;
  NodeResult out = r.own;
  out.chunks_applied = r.tracker->applied();
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
  std::vector<std::byte> payload =
      EncodeResults(ResultsMsg{std::move(own_first)});
  if (type == FrameType::kPlanReply) {
    r.plan_reply = payload;
  } else {
    r.last_reply.emplace(type, payload);
  }
  if (r.orphaned) return;  // a new parent gets it when it adopts us
  FrameHeader about;
  about.epoch = r.epoch;
  about.refit_id = r.id;
  Reply(*r.up, type, about,
        type == FrameType::kPlanReply && r.reply_position ? PlanReplyFor(true)
                                                          : payload);
}

std::vector<std::byte> Relay::Impl::PlanReplyFor(bool position) {
  Refit& r = *refit_;
  // Only a node still receiving takes chunks: one that got END has named
  // what it misses in its vote, or will.
  if (!position ||
      (r.phase != Phase::kPlanning && r.phase != Phase::kReceiving)) {
    return r.plan_reply;
  }
  auto reply = DecodeResults(r.plan_reply);
  if (!reply.ok()) return r.plan_reply;  // ours: cannot happen
  reply->received_through = r.received_through;
  return EncodeResults(*reply);
}

void Relay::Impl::Orphan(const std::string& why) {
  Refit& r = *refit_;
  if (r.orphaned) return;
  r.orphaned = true;
  r.paused = false;  // that link is gone
  r.fanout->set_adopting(false);
  // Having voted, we keep the base served and wait for the decision: the
  // coordinator may have died after its decision (dcr refit --resume).
  bool prepared = r.phase == Phase::kVoted;
  auto wait = prepared ? options_.prepared_wait
                       : std::chrono::milliseconds(r.plan.phase_timeout_ms);
  r.orphan_deadline = Clock::now() + wait;
  spdlog::warn(
      "{}: parent link lost during refit {} ({}); {} for up to {:.0f} s, "
      "then restoring the base",
      options_.name, r.id.ToHex(), why,
      prepared ? "voted: waiting for the decision or a new parent"
               : "waiting to be adopted by another parent",
      std::chrono::duration<double>(wait).count());
}

void Relay::Impl::OnAdoption(const std::shared_ptr<Link>& link,
                             const Frame& frame, const PlanMsg& plan) {
  Refit& r = *refit_;
  const std::string& adopter = inbound_[link->id()].hello.node;
  std::string refusal;
  if (r.phase == Phase::kCommitting || r.phase == Phase::kAborting ||
      r.phase == Phase::kOrphaned) {
    refusal = "the refit is ending here";
  } else if (!r.orphaned && plan.sender_depth >= r.parent_depth) {
    refusal = fmt::format(
        "it has a live parent at depth {} (the adopter is at depth {})",
        r.parent_depth, plan.sender_depth);
  }
  if (!refusal.empty()) {
    spdlog::warn("{}: not adopted by {}: {}", options_.name, adopter, refusal);
    SendError(*link, fmt::format("{} not adopted: {}", options_.name, refusal));
    link->CloseAfterFlush();
    return;
  }
  std::shared_ptr<Link> old = r.up;
  r.up = link;
  r.up_gate = GateOf(*link);
  r.orphaned = false;
  r.paused = false;
  r.parent_depth = plan.sender_depth;
  r.last_up_rx = Clock::now();
  r.fanout->set_depth(plan.sender_depth + 1);
  r.fanout->set_adopting(true);
  r.reply_position = plan.resend;
  if (old && old.get() != link.get()) old->Close();
  spdlog::info("{}: adopted by {} (depth {}) while {}", options_.name, adopter,
               plan.sender_depth, PhaseName(r.phase));
  // The adopter may have placed orphans in our subtree.
  r.fanout->Amend(plan);
  // Tell the new parent what this subtree answered so far; a phase still
  // in progress answers it when done.
  if (r.phase != Phase::kPlanning) {
    Reply(*link, FrameType::kPlanReply, frame.header,
          PlanReplyFor(plan.resend));
    if (r.last_reply) {
      Reply(*link, r.last_reply->first, frame.header, r.last_reply->second);
    }
  }
}

void Relay::Impl::Heartbeats(Clock::time_point now) {
  Refit& r = *refit_;
  if (r.plan.heartbeat_ms == 0 || r.orphaned) return;
  auto interval = std::chrono::milliseconds(r.plan.heartbeat_ms);
  if (now - r.last_up_heartbeat >= interval) {
    r.last_up_heartbeat = now;
    FrameHeader about;
    about.epoch = r.epoch;
    about.refit_id = r.id;
    Reply(*r.up, FrameType::kHeartbeat, about, {});
  }
  // While we do not read from the parent (backpressure) its frames wait in
  // the socket: silence then says nothing.
  if (!r.paused && now - r.last_up_rx > 4 * interval) {
    std::string why =
        fmt::format("parent silent for {:.1f} s",
                    std::chrono::duration<double>(now - r.last_up_rx).count());
    r.up->Close();
    Orphan(why);
  }
}

void Relay::Impl::EndRefit(const std::string& result, bool committed) {
  Refit& r = *refit_;
  finished_ = Finished{r.id, r.epoch, r.plan_reply, r.last_reply};
  double seconds =
      std::chrono::duration<double>(Clock::now() - r.started).count();
  last_chunks_applied_ = r.tracker->applied();
  counters_.chunks_dropped +=
      r.tracker->duplicates();  // Stats() added them so far
  counters_.CloseRefit(*r.fanout);
  r.fanout->Close();
  (committed ? counters_.refits_committed : counters_.refits_aborted) += 1;
  spdlog::info("{}: refit {} {} in {:.3f} s ({} chunks applied)", options_.name,
               r.id.ToHex(), result, seconds, r.tracker->applied());
  board_.EndRefit(seconds, fmt::format("{} {}", r.id.ToHex(), result));
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
  if (r.orphaned && now >= r.orphan_deadline &&
      (r.phase == Phase::kPlanning || r.phase == Phase::kReceiving ||
       r.phase == Phase::kVoting || r.phase == Phase::kVoted)) {
    spdlog::warn("{}: no new parent for refit {}; restoring the base",
                 options_.name, r.id.ToHex());
    r.phase = Phase::kOrphaned;
    r.local.reset();
    r.fanout->Close();
  }
  Heartbeats(now);
  r.fanout->Tick(now);
  counters_.chunks_applied = r.tracker->applied();
  bool drained = r.tracker->idle();
  switch (r.phase) {
    case Phase::kPlanning:
      if (r.fanout->Complete()) {
        ReplyResults(FrameType::kPlanReply, {r.own});
        r.phase = Phase::kReceiving;
        r.fanout->Stream();
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
          Status apply_error = r.tracker->TakeFirstError();  // per vote
          std::vector<AppliedChunk> applied;
          if (options_.signing_public_key) {
            applied = r.tracker->AppliedChunks();
          }
          // With the root's public key, what was applied must be what the
          // root signed, whichever relay delivered it; checked first, so a
          // forged chunk is named as such rather than as a digest mismatch.
          Status manifest =
              options_.signing_public_key
                  ? VerifyRefitManifest(*r.end, *options_.signing_public_key,
                                        r.id, r.epoch, r.plan, applied)
                  : Status::OK();
          if (!manifest.ok()) {
            vote.code = NodeCode::kRejected;
            vote.detail = std::string(manifest.message());
            vote.chunks_applied = r.tracker->applied();
          } else {
            vote = r.session->Vote(*r.end, hash_pool_.get());
            const RefitSession::HashCounts hc = r.session->hash_counts();
            spdlog::debug("{}: vote hashed {} tensors; {} were hashed ahead",
                          options_.name, hc.at_vote, hc.ahead);
            // The bits decide: a chunk that failed (checksum, bounds) left
            // its span as it was, which the digests show, and a repair
            // round overwrites it.
            if (!apply_error.ok()) {
              spdlog::warn("{}: refused a chunk since the last vote: {}",
                           options_.name, apply_error.ToString());
              if (vote.code != NodeCode::kOk) {
                vote.detail += "; first error: " + apply_error.ToString();
              }
            }
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
        EndRefit(r.phase == Phase::kAborting
                     ? "aborted by the root"
                     : "aborted: parent link lost and not adopted",
                 false);
      }
      break;
  }
}

void Relay::Impl::PublishStats() {
  RelayStats s =
      counters_.Snapshot(store_.get(), refit_ ? refit_->fanout.get() : nullptr);
  if (refit_) {
    s.state = PhaseName(refit_->phase);
    s.apply_backlog_bytes = refit_->tracker->backlog_bytes();
    s.chunks_dropped += refit_->tracker->duplicates();
  } else {
    s.state = store_ ? "idle" : "no store";
  }
  board_.Publish(std::move(s), refit_.has_value());
}

RelayStats Relay::Impl::Stats() const { return board_.Get(); }

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
