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
#include "relay/memory_budget.h"
#include "relay/read_gate.h"
#include "relay/refit_session.h"

namespace dcr {
namespace {

using Clock = std::chrono::steady_clock;

// The bound on a link's first frame (HELLO or ERROR, both small).
constexpr uint32_t kFirstFrameMaxPayload = 64u << 10;

// What the apply workers report back about one refit.
struct ApplyTracker {
  std::atomic<uint64_t> in_flight{0};
  std::atomic<uint64_t> backlog_bytes{0};
  std::atomic<uint64_t> applied{0};
  std::atomic<uint64_t> duplicates{0};
  std::mutex mu;
  Status first_error;  // guarded by mu
  // With a signing public key: every chunk applied, for the manifest check
  // at vote time.
  std::vector<AppliedChunk> applied_chunks;  // guarded by mu
};

// Applies chunks on a few threads, each with its own decoder.
class ApplyWorkers {
 public:
  struct Job {
    FrameBuffer buffer;  // keeps `chunk` alive
    std::span<const std::byte> chunk;
    RefitSession* session = nullptr;
    std::shared_ptr<ApplyTracker> tracker;
    bool hash = false;  // record the SHA-256 of the chunk once applied
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
          if (job.hash) Record(job);
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

  // Hashes an applied chunk here, on the worker, not on the actor thread.
  static void Record(const Job& job) {
    auto header = PeekChunkHeader(job.chunk);  // valid: it was applied
    AppliedChunk a{header.ok() ? header->id : ChunkId{}, Sha256(job.chunk)};
    std::lock_guard lock(job.tracker->mu);
    job.tracker->applied_chunks.push_back(a);
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

// A well-formed forgery of a CHUNK frame for the forge failpoint, what a
// relay holding the hop key but not the root's signing key can make: the
// chunk decoded, the low bit of its first value flipped, re-encoded with a
// valid chunk checksum and framed (tagged with this relay's frame key) as
// the original was. Null if the frame is not a chunk that decodes. A test
// hook: it makes its codec contexts per call.
FrameBuffer ForgedCopy(const FrameBuffer& frame, const FrameOptions& options) {
  auto parsed = ParseFrame(*frame);  // no key: the tag is kept, unchecked
  auto decoder = ChunkDecoder::Create();
  auto encoder = ChunkEncoder::Create(EncodeOptions{});
  DecodedChunk c;
  if (!parsed.ok() || !decoder.ok() || !encoder.ok() ||
      !(*decoder)->Decode(parsed->payload, &c).ok() || c.values.empty()) {
    return nullptr;
  }
  const ChunkHeader& h = c.header;
  size_t es = h.elem_size;
  // Flip a low bit of the first value, keeping it non-zero so that an XOR
  // chunk still changes that element.
  c.values[0] ^= std::byte{1};
  if (std::all_of(c.values.begin(), c.values.begin() + es,
                  [](std::byte b) { return b == std::byte{0}; })) {
    c.values[0] ^= std::byte{3};
  }
  std::vector<uint32_t> positions = c.positions;
  if (h.encoding == ChunkEncoding::kDense) {
    positions.resize(h.span_elems);
    for (uint32_t i = 0; i < h.span_elems; ++i) positions[i] = i;
  }
  std::vector<std::byte> payload;
  Status s;
  if (h.kind == ChunkKind::kOverwrite) {
    s = (*encoder)->EncodeOverwrite(h.id, es, h.span_elems, positions, c.values,
                                    &payload);
  } else {
    // XOR against zeros: the target holds the (forged) XOR values.
    std::vector<std::byte> zeros(size_t{h.span_elems} * es);
    std::vector<std::byte> target = zeros;
    for (size_t k = 0; k < positions.size(); ++k) {
      std::copy_n(c.values.begin() + k * es, es,
                  target.begin() + size_t{positions[k]} * es);
    }
    auto changed = (*encoder)->EncodeDiff(ChunkKind::kXor, h.id, es, zeros,
                                          target, &payload);
    if (!changed.ok() || !*changed) return nullptr;
  }
  if (!s.ok()) return nullptr;
  FrameHeader header = parsed->header;
  header.flags &= static_cast<uint16_t>(~kFrameFlagsWireMask);
  auto forged = EncodeFrame(header, payload, options);
  return forged.ok() ? *forged : nullptr;
}

// Forwards a CHUNK to the children as the relay.forward failpoint says: as
// is, not at all (drop), a damaged copy (corrupt), a forged chunk (forge;
// `frames` keys it), or its first bytes and then every child link closed
// (cut). A damaged or cut chunk is a fault in this node's forward path: not
// kept for resends either (the repair round covers it). Returns the chunk
// sends.
size_t ForwardChunk(Fanout& fanout, const FrameBuffer& frame,
                    const FailpointHit& fp, const FrameOptions& frames) {
  if (fp.drop()) return 0;
  if (fp.corrupt()) {
    return fanout.Forward(CorruptedCopy(*frame, fp), /*chunk=*/true,
                          /*keep=*/false);
  }
  if (fp.forge()) {
    FrameBuffer forged = ForgedCopy(frame, frames);
    if (!forged) spdlog::error("forge failpoint: cannot forge this chunk");
    return fanout.Forward(forged ? forged : frame, /*chunk=*/true);
  }
  if (!fp.cut()) return fanout.Forward(frame, /*chunk=*/true);
  size_t keep = static_cast<size_t>(std::min<uint64_t>(fp.arg, frame->size()));
  size_t n = fanout.Forward(std::make_shared<std::vector<std::byte>>(
                                frame->begin(), frame->begin() + keep),
                            /*chunk=*/true, /*keep=*/false);
  fanout.CutLinks();
  return n;
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

  // Counters (written by the actor, read by Stats).
  std::atomic<uint64_t> bytes_in_{0};
  std::atomic<uint64_t> bytes_out_closed_{0};
  std::atomic<uint64_t> chunks_received_{0};
  std::atomic<uint64_t> chunks_applied_{0};
  std::atomic<uint64_t> chunks_forwarded_{0};
  std::atomic<uint64_t> chunks_dropped_{0};
  std::atomic<uint64_t> refits_committed_{0};
  std::atomic<uint64_t> refits_aborted_{0};
  std::atomic<uint64_t> links_refused_{0};
  std::atomic<uint64_t> inbound_pauses_{0};
  // Of refits that ended (the current one's are its Fanout's).
  uint64_t adoptions_closed_ = 0;
  uint64_t resent_chunks_closed_ = 0;
  uint64_t resent_bytes_closed_ = 0;
  uint64_t resend_misses_closed_ = 0;
  mutable std::mutex stats_mu_;
  RelayStats published_;  // guarded by stats_mu_
};

// Every callback runs on the listening transport's event thread; gates_
// needs no lock.
class Relay::Impl::InboundHandler : public LinkHandler {
 public:
  explicit InboundHandler(Impl* impl) : impl_(impl) {}
  void OnOpen(Link& link) override {
    const size_t most = impl_->options_.max_inbound_links;
    if (most != 0 && gates_.size() >= most) {
      uint64_t n = ++impl_->links_refused_;
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
    if (it->second->Queued(bytes)) ++impl_->inbound_pauses_;
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
  workers_ = std::make_unique<ApplyWorkers>(options_.apply_threads, &mailbox_);
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
    {
      std::lock_guard lock(stats_mu_);
      if (!published_.last_result.empty()) {
        r.detail += ": " + published_.last_result;
      }
    }
    Reply(*link, want, frame.header, EncodeResults(ResultsMsg{{r}}));
    return;
  }
  if (!refit_ || refit_->up.get() != link.get() ||
      frame.header.refit_id != refit_->id ||
      frame.header.epoch < refit_->epoch) {
    if (frame.type() == FrameType::kChunk) chunks_dropped_ += 1;
    spdlog::debug("{}: dropping {} outside its refit", options_.name,
                  FrameTypeName(frame.type()));
    return;
  }
  if (frame.header.epoch > refit_->epoch) {
    // Forwarded from a resumed coordinator (dcr refit --resume).
    if (!PersistEpoch(frame.header.epoch).ok()) return;
    refit_->epoch = frame.header.epoch;
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
  // An adoption into the refit this relay holds may come from any node of
  // the topology (peer_addresses): an ancestor may place it under another
  // node (docs/PROTOCOL.md §"Heartbeats and re-parenting").
  bool holds = refit_ && plan->adopt && refit_->id == frame.header.refit_id &&
               frame.header.epoch == refit_->epoch;
  if (!holds && !options_.plan_senders.empty() &&
      std::find(options_.plan_senders.begin(), options_.plan_senders.end(),
                inbound_[link->id()].hello.node) ==
          options_.plan_senders.end()) {
    return refuse(
        NodeCode::kRejected,
        fmt::format("plans are taken only from {}'s ancestors in "
                    "the topology ({}); '{}' is not one",
                    options_.name, fmt::join(options_.plan_senders, ", "),
                    inbound_[link->id()].hello.node));
  }
  if (plan->nodes[0].name != options_.name) {
    return refuse(NodeCode::kRejected,
                  fmt::format("this is node '{}', the plan is for '{}'",
                              options_.name, plan->nodes[0].name));
  }
  if (refit_ && refit_->id == frame.header.refit_id &&
      frame.header.epoch == refit_->epoch) {
    if (link.get() == refit_->up.get()) {
      // Our parent placed orphans in our subtree; else a duplicate.
      if (plan->adopt) refit_->fanout->Amend(*plan);
      return;
    }
    return OnAdoption(link, frame, *plan);
  }
  if (refit_ && refit_->id == frame.header.refit_id && plan->resume &&
      frame.header.epoch > refit_->epoch) {
    // dcr refit --resume: a new coordinator run takes the refit over; its
    // epoch fences the old one off from now on.
    if (Status s = PersistEpoch(frame.header.epoch); !s.ok()) {
      return refuse(NodeCode::kStoreError,
                    "cannot persist the coordinator epoch: " + s.ToString());
    }
    spdlog::info("{}: refit {} resumed at epoch {} (was {})", options_.name,
                 refit_->id.ToHex(), frame.header.epoch, refit_->epoch);
    refit_->epoch = frame.header.epoch;
    return OnAdoption(link, frame, *plan);
  }
  if (!refit_ && (plan->adopt || plan->resume) && finished_ &&
      finished_->id == frame.header.refit_id &&
      (finished_->epoch == frame.header.epoch ||
       (plan->resume && frame.header.epoch > finished_->epoch))) {
    // Our parent lost our last reply (and its link to us), or a resumed
    // coordinator asks: answer again.
    if (frame.header.epoch > finished_->epoch) {
      (void)PersistEpoch(frame.header.epoch);
      finished_->epoch = frame.header.epoch;
    }
    spdlog::info("{}: refit {} ended here; answering {} again", options_.name,
                 finished_->id.ToHex(), inbound_[link->id()].hello.node);
    Reply(*link, FrameType::kPlanReply, frame.header, finished_->plan_reply);
    if (finished_->last_reply) {
      Reply(*link, finished_->last_reply->first, frame.header,
            finished_->last_reply->second);
    }
    return;
  }
  // Restarted mid-refit: the store's record names this refit (unfinished)
  // and the parent reconnects with an adoption PLAN of the same run. The
  // relay rejoins; what it applied before is unknown, so it takes only
  // overwrites from now on and the root's repair round fixes the rest.
  bool rejoin = !refit_ && plan->adopt && store_ && store_->InProgress() &&
                store_->InProgress()->refit == frame.header.refit_id &&
                frame.header.epoch == max_epoch_;
  if (plan->resume && !rejoin) {
    return refuse(NodeCode::kRejected,
                  fmt::format("refit {} is not in progress here (it never "
                              "started here, or the relay restarted since)",
                              frame.header.refit_id.ToHex()));
  }
  // Every coordinator run takes a new epoch: a PLAN at an epoch this relay
  // already accepted is a replay or comes from a coordinator that another
  // one has since replaced (fencing).
  if (frame.header.epoch <= max_epoch_ && !rejoin) {
    return refuse(
        NodeCode::kRejected,
        fmt::format(
            "stale coordinator epoch {}: this relay has accepted "
            "epoch {} ({}); a newer coordinator ran since, or its "
            "state_dir was reset (then write an epoch above {} into "
            "state_dir/epoch)",
            frame.header.epoch, max_epoch_,
            epoch_file_.path().empty() ? "in memory" : epoch_file_.path(),
            max_epoch_));
  }
  // An orphan of a run that a newer coordinator run replaced: that run is
  // over (the coordinator starts a refit only once the last one is
  // decided and concluded, or resumed), so the relay stops waiting for it,
  // restores its base and takes the new plan; if the old run committed,
  // the new one finds this relay behind and catches it up.
  if (refit_ && refit_->orphaned && !plan->adopt && !plan->resume &&
      frame.header.epoch > refit_->epoch && refit_->tracker->in_flight == 0) {
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
  if (refit_) {
    return refuse(NodeCode::kBusy,
                  fmt::format("refit {} is in progress", refit_->id.ToHex()));
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
      chunks_received_ += 1;
      // After a vote, chunks are a repair round: receiving again.
      if (r.phase == Phase::kVoted) {
        r.phase = Phase::kReceiving;
        r.voted_yes = false;  // the bits change: only a new vote counts
        r.fanout->Stream();
      }
      if (r.phase != Phase::kReceiving) {
        chunks_dropped_ += 1;
        return;
      }
      r.received_through =
          std::max(r.received_through,
                   FramePosition{frame.header.epoch, frame.header.sequence});
      chunks_forwarded_ +=
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
      r.tracker->backlog_bytes > options_.apply_window_bytes) {
    r.up_gate->Set(ReadGate::kWindows, true);
    r.paused = true;
  }
}

void Relay::Impl::MaybeResume() {
  Refit& r = *refit_;
  if (!r.paused) return;
  if (r.fanout->MaxQueuedBytes() <= r.plan.chunk_window_bytes / 2 &&
      r.tracker->backlog_bytes <= options_.apply_window_bytes / 2) {
    r.up_gate->Set(ReadGate::kWindows, false);
    r.paused = false;
    r.last_up_rx = Clock::now();  // its frames waited in the socket
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
  last_chunks_applied_ = r.tracker->applied;
  chunks_dropped_ += r.tracker->duplicates;  // Stats() added them so far
  bytes_out_closed_ += r.fanout->BytesSent();
  adoptions_closed_ += r.fanout->adoptions();
  resent_chunks_closed_ += r.fanout->resent_chunks();
  resent_bytes_closed_ += r.fanout->resent_bytes();
  resend_misses_closed_ += r.fanout->resend_misses();
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
  chunks_applied_ = r.tracker->applied.load();
  bool drained = r.tracker->in_flight == 0;
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
          Status apply_error;
          std::vector<AppliedChunk> applied;
          {
            std::lock_guard lock(r.tracker->mu);
            apply_error = r.tracker->first_error;
            r.tracker->first_error = Status::OK();  // per vote
            if (options_.signing_public_key) {
              applied = r.tracker->applied_chunks;
            }
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
            vote.chunks_applied = r.tracker->applied;
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
  RelayStats s;
  s.bytes_in = bytes_in_;
  s.bytes_out = bytes_out_closed_;
  s.chunks_received = chunks_received_;
  s.chunks_applied = chunks_applied_;
  s.chunks_forwarded = chunks_forwarded_;
  s.chunks_dropped = chunks_dropped_;
  s.refits_committed = refits_committed_;
  s.refits_aborted = refits_aborted_;
  s.links_refused = links_refused_;
  s.inbound_pauses = inbound_pauses_;
  s.adoptions = adoptions_closed_;
  s.resent_chunks = resent_chunks_closed_;
  s.resent_bytes = resent_bytes_closed_;
  s.resend_misses = resend_misses_closed_;
  if (store_) {
    const VersionRecord rec = store_->record();
    if (rec.committed) s.committed = rec.committed->version;
    s.store_unsynced = rec.unsynced.has_value();
  }
  if (refit_) {
    const Fanout& f = *refit_->fanout;
    s.state = PhaseName(refit_->phase);
    s.bytes_out += f.BytesSent();
    s.adoptions += f.adoptions();
    s.resent_chunks += f.resent_chunks();
    s.resent_bytes += f.resent_bytes();
    s.resend_misses += f.resend_misses();
    s.live_children = f.live_children();
    s.peak_children = f.peak_children();
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
  if (!refit_) s.peak_children = published_.peak_children;  // the last refit's
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
