// A trainer rank's producer (dcr/producer.h): one link to the coordinator
// per refit, driven from the caller's thread; the transport's event thread
// only queues what arrives.
#include "dcr/producer.h"

#include <fmt/format.h>

#include <deque>
#include <map>
#include <thread>

#include "common/elapsed.h"
#include "common/failpoint.h"
#include "common/mutex.h"
#include "dcr/shard_delta.h"
#include "dcr/shard_diff.h"
#include "protocol/producer_messages.h"

namespace dcr {
namespace {

using Clock = std::chrono::steady_clock;

// The send window: chunks wait while more than this is queued on the link.
constexpr size_t kSendWindow = size_t{16} << 20;

// The link's events, for the thread that drives the refit.
class Inbox : public LinkHandler {
 public:
  void OnFrame(Link&, const Frame& frame, const FrameBuffer& buffer) override {
    {
      MutexLock lock(&mu_);
      // A HEARTBEAT only says the coordinator is there (it is busy with
      // the tree): it restarts a wait's clock and is not a frame to read.
      heard_ = Clock::now();
      if (frame.type() != FrameType::kHeartbeat) {
        frames_.push_back(DecodedFrame{frame, buffer});
      }
    }
    changed_.SignalAll();
  }
  void OnClosed(Link&, const Status& why) override {
    {
      MutexLock lock(&mu_);
      closed_ = true;
      why_ =
          why.ok() ? Status::IOError("the coordinator closed the link") : why;
    }
    changed_.SignalAll();
  }
  void OnDrained(Link&) override { changed_.SignalAll(); }

  // The next frame, or the reason there is none: the link closed, or the
  // coordinator sent nothing (not even a HEARTBEAT) for `silence`.
  Result<DecodedFrame> Next(Clock::duration silence, const char* waiting) {
    MutexLock lock(&mu_);
    const auto start = Clock::now();
    for (;;) {
      if (!frames_.empty()) {
        DecodedFrame f = std::move(frames_.front());
        frames_.pop_front();
        return f;
      }
      if (closed_) return why_;
      const auto deadline = std::max(start, heard_) + silence;
      if (changed_.WaitUntil(&mu_, deadline) && Clock::now() >= deadline &&
          frames_.empty() && !closed_ && heard_ + silence <= Clock::now()) {
        return Status::Aborted(fmt::format(
            "no answer from the coordinator for {:.3g} s while {}",
            std::chrono::duration<double>(silence).count(), waiting));
      }
    }
  }
  // Whether a frame waits (the coordinator decided while this rank still
  // streams).
  bool HasFrame() {
    MutexLock lock(&mu_);
    return !frames_.empty();
  }
  // Waits until the link closed, at most until `deadline`.
  void WaitClosed(Clock::time_point deadline) {
    MutexLock lock(&mu_);
    while (!closed_ && !changed_.WaitUntil(&mu_, deadline)) {
    }
  }
  // Waits until `link` has room for more, or it closed.
  Status WaitForRoom(Link& link) {
    MutexLock lock(&mu_);
    while (link.QueuedBytes() > kSendWindow) {
      if (closed_) return why_;
      changed_.WaitFor(&mu_, std::chrono::milliseconds(100));
    }
    return closed_ ? why_ : Status::OK();
  }

 private:
  Mutex mu_;
  CondVar changed_;
  std::deque<DecodedFrame> frames_ DCR_GUARDED_BY(mu_);
  Clock::time_point heard_ DCR_GUARDED_BY(mu_);  // the last frame of any kind
  bool closed_ DCR_GUARDED_BY(mu_) = false;
  Status why_ DCR_GUARDED_BY(mu_);
};

Status SendFrame(Link& link, FrameType type, const RefitId& refit,
                 std::span<const std::byte> payload,
                 const FrameOptions& frames) {
  FrameHeader h;
  h.type = type;
  h.refit_id = refit;
  DCR_ASSIGN_OR_RETURN(FrameBuffer f, EncodeFrame(h, payload, frames));
  link.Send(std::move(f));
  return Status::OK();
}

// While it lives, a HEARTBEAT on `link` every `interval`: a rank diffing
// long runs of unchanged weights sends no chunk, and the coordinator takes
// a rank silent for its --timeout as gone.
class HeartbeatSender {
 public:
  HeartbeatSender(Link* link, const RefitId& refit, const FrameOptions& frames,
                  std::chrono::milliseconds interval) {
    if (interval.count() <= 0) return;
    thread_ = std::thread([this, link, refit, frames, interval] {
      MutexLock lock(&mu_);
      while (!stop_) {
        if (!wake_.WaitFor(&mu_, interval) || stop_) continue;
        // Queued behind the chunks waiting on the link, if any: those say
        // as much.
        (void)SendFrame(*link, FrameType::kHeartbeat, refit, {}, frames);
      }
    });
  }
  ~HeartbeatSender() {
    if (!thread_.joinable()) return;
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    wake_.SignalAll();
    thread_.join();
  }
  HeartbeatSender(const HeartbeatSender&) = delete;
  HeartbeatSender& operator=(const HeartbeatSender&) = delete;

 private:
  Mutex mu_;
  CondVar wake_;
  bool stop_ DCR_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// One PRODUCER_BASELINE piece into `fetched`: of one of the rank's
// shards, of that shard's size, in order.
Status TakeBaselinePiece(
    const std::map<std::string, LayoutShard>& held,
    std::span<const std::byte> payload,
    std::map<std::string, std::vector<std::byte>, std::less<>>* fetched) {
  DCR_ASSIGN_OR_RETURN(ProducerBaselineMsg piece,
                       DecodeProducerBaseline(payload));
  auto it = held.find(piece.shard);
  if (it == held.end()) {
    return Status::Corruption(fmt::format(
        "the coordinator sent baseline shard '{}', which this rank does not "
        "hold",
        piece.shard));
  }
  uint64_t want = DTypeSize(it->second.dtype);
  for (uint64_t d : it->second.shape) want *= d;
  std::vector<std::byte>& buf = (*fetched)[piece.shard];
  if (piece.total != want || piece.offset != buf.size()) {
    return Status::Corruption(fmt::format(
        "baseline shard '{}': a piece at {} of {} bytes, after {} received "
        "(the layout gives it {})",
        piece.shard, piece.offset, piece.total, buf.size(), want));
  }
  if (buf.empty()) buf.reserve(want);
  buf.insert(buf.end(), piece.bytes.begin(), piece.bytes.end());
  return Status::OK();
}

ProducerDecision FromMessage(const ProducerDecisionMsg& m) {
  ProducerDecision d;
  d.outcome = static_cast<ProducerOutcome>(m.outcome);
  d.refit = m.refit;
  d.target = m.target;
  d.reason = m.reason;
  return d;
}

}  // namespace

std::string_view ProducerOutcomeName(ProducerOutcome o) {
  switch (o) {
    case ProducerOutcome::kCommitted:
      return "committed";
    case ProducerOutcome::kPartial:
      return "partial";
    case ProducerOutcome::kAborted:
      return "aborted";
    case ProducerOutcome::kUnfinished:
      return "unfinished";
    case ProducerOutcome::kRefused:
      return "refused";
  }
  return "unknown";
}

Producer::Producer(Layout layout, uint32_t rank, ProducerOptions options)
    : rank_(rank),
      options_(std::move(options)),
      shards_(std::make_unique<ShardProducer>(std::move(layout), rank,
                                              /*span_elems=*/0,
                                              options_.encode)) {
  shards_->set_step_log_bytes(options_.step_log_bytes);
}

Producer::~Producer() = default;

const Layout& Producer::layout() const { return shards_->layout(); }
bool Producer::has_baseline() const { return shards_->has_baseline(); }

Status Producer::SetBaseline(const ShardBytes& shards) {
  return shards_->SetBaseline(shards);
}

Status Producer::UseMemory(std::unique_ptr<ShardMemory> memory) {
  return shards_->UseMemory(std::move(memory));
}

const ShardMemory* Producer::memory() const { return shards_->memory(); }

Result<ProducerDecision> Producer::Refit(uint64_t step,
                                         const ShardBytes& shards) {
  const auto t0 = Clock::now();
  // Without a baseline (a rank restarted without its shards), or with
  // another version than the tree's (a rank that missed a decision), the
  // coordinator sends the tree's from root.baseline before GO.
  const bool fetch = !shards_->has_baseline();
  // Sizes are checked before anything is asked of the coordinator: a
  // trainer step that changed a shape is an error here, naming the tensor.
  DCR_RETURN_IF_ERROR(CheckShards(shards_->layout(), rank_, shards));
  DCR_ASSIGN_OR_RETURN(auto address,
                       SplitHostPort("coordinator", options_.coordinator,
                                     /*allow_zero=*/false));
  DCR_ASSIGN_OR_RETURN(std::unique_ptr<Transport> transport,
                       CreateTransport("tcp", options_.transport));
  auto inbox = std::make_shared<Inbox>();
  DCR_ASSIGN_OR_RETURN(std::shared_ptr<Link> link,
                       transport->Connect(address.first, address.second, inbox,
                                          options_.connect_timeout));
  link->SetWatermarks(kSendWindow, kSendWindow / 2);
  const FrameOptions& frames = options_.transport.frames;
  auto fail = [&](Status s) {
    link->Close();
    transport->Stop();
    return s.WithContext(fmt::format("rank {} refit of step {} with {}", rank_,
                                     step, options_.coordinator));
  };

  ProducerHelloMsg hello;
  hello.rank = rank_;
  hello.world = shards_->layout().ranks();
  hello.step = step;
  hello.layout = shards_->layout().Fingerprint();
  if (!fetch) hello.base_parts = shards_->baseline_digests();
  if (Status s = SendFrame(*link, FrameType::kProducerHello, RefitId(),
                           EncodeProducerHello(hello), frames);
      !s.ok()) {
    return fail(s);
  }
  std::map<std::string, std::vector<std::byte>, std::less<>> fetched;
  const auto held = shards_->layout().ShardsOf(rank_);
  Result<DecodedFrame> go_frame = Status::Aborted("no frame");
  for (;;) {
    go_frame =
        inbox->Next(options_.timeout, fetch ? "receiving the tree's baseline"
                                            : "waiting for the refit");
    if (!go_frame.ok()) return fail(go_frame.status());
    if (go_frame->frame.type() != FrameType::kProducerBaseline) break;
    if (Status s = TakeBaselinePiece(held, go_frame->frame.payload, &fetched);
        !s.ok()) {
      return fail(s);
    }
  }
  if (go_frame->frame.type() == FrameType::kProducerDecision) {
    auto d = DecodeProducerDecision(go_frame->frame.payload);
    if (!d.ok()) return fail(d.status());
    transport->Stop();
    ProducerDecision decision = FromMessage(*d);
    decision.total_seconds = Seconds(t0, Clock::now());
    return decision;
  }
  if (go_frame->frame.type() != FrameType::kProducerGo) {
    return fail(Status::Corruption(
        fmt::format("the coordinator sent {} instead of PRODUCER_GO",
                    FrameTypeName(go_frame->frame.type()))));
  }
  auto go = DecodeProducerGo(go_frame->frame.payload);
  if (!go.ok()) return fail(go.status());
  // From GO to DONE the coordinator hears from this rank at least every
  // heartbeat, also while it hashes a baseline it was sent.
  auto heartbeat = std::make_unique<HeartbeatSender>(
      link.get(), go->refit, frames, options_.heartbeat);
  if (!fetched.empty()) {
    // (Whatever becomes of the refit, these are the tree's bits at its
    // base: kept as the baseline.)
    if (Status s = shards_->AdoptBaseline(std::move(fetched)); !s.ok()) {
      heartbeat.reset();
      return fail(Status::Corruption("the baseline the coordinator sent: " +
                                     s.ToString()));
    }
  }

  ProducerDecision decision;
  const auto t_diff = Clock::now();
  // Each part goes out as soon as it is encoded: the diff of the next
  // tensors overlaps the transfer, and only the link's window of chunks
  // is held.
  bool link_ended = false;  // the coordinator decided, or the link failed
  auto send = [&](const ChunkId&, std::span<const std::byte> chunk) {
    DCR_FAILPOINT("producer.send_chunk");
    // The coordinator decided already (another rank failed): stop diffing.
    if (inbox->HasFrame()) {
      link_ended = true;
      return Status::Aborted("the coordinator decided");
    }
    Status s = inbox->WaitForRoom(*link);
    if (s.ok()) {
      s = SendFrame(*link, FrameType::kChunk, go->refit, chunk, frames);
    }
    if (!s.ok()) {
      link_ended = true;
      return s;
    }
    ++decision.chunks;
    decision.payload_bytes += chunk.size();
    return Status::OK();
  };
  auto diffed = shards_->Diff(shards, go->span_elems, send);
  heartbeat.reset();
  if (!diffed.ok()) {
    // The coordinator may have ended the refit while this rank streamed
    // (its link closes after the decision): that decision is the answer.
    auto early =
        link_ended
            ? inbox->Next(std::chrono::seconds(2), "reading the decision")
            : Result<DecodedFrame>(Status::Aborted("no decision"));
    if (early.ok() && early->frame.type() == FrameType::kProducerDecision) {
      auto d = DecodeProducerDecision(early->frame.payload);
      if (d.ok()) {
        transport->Stop();
        ProducerDecision told = FromMessage(*d);
        told.chunks = decision.chunks;
        told.payload_bytes = decision.payload_bytes;
        told.total_seconds = Seconds(t0, Clock::now());
        // (The tree cannot have moved without this rank's parts.)
        if (!Advanced(told.outcome)) return told;
      }
    }
    // The coordinator aborts the refit when the link closes; the error
    // frame tells it why.
    std::string why = diffed.status().ToString();
    (void)SendFrame(*link, FrameType::kError, go->refit,
                    std::as_bytes(std::span(why.data(), why.size())), frames);
    link->CloseAfterFlush();
    // (Stop would drop the frame still queued.)
    inbox->WaitClosed(Clock::now() + std::chrono::seconds(2));
    transport->Stop();
    return diffed.status();
  }
  // From here the baseline may hold the diffed bits (the step log): any
  // way out but an advance puts the base back.
  struct RewindUnlessAdvanced {
    ShardProducer* shards;
    bool advanced = false;
    ~RewindUnlessAdvanced() {
      if (!advanced) shards->Rewind();
    }
  } rewind{shards_.get()};
  decision.diff_seconds = Seconds(t_diff, Clock::now());
  decision.changed_elements = diffed->changed;
  decision.log_bytes = diffed->log_bytes;
  ProducerDoneMsg done;
  done.chunks = decision.chunks;
  done.changed = diffed->changed;
  done.target_parts = diffed->target_digests;
  diffed->chunks.clear();
  if (Status s = SendFrame(*link, FrameType::kProducerDone, go->refit,
                           EncodeProducerDone(done), frames);
      !s.ok()) {
    return fail(s);
  }
  auto end = inbox->Next(options_.timeout, "waiting for the decision");
  if (!end.ok()) return fail(end.status());
  if (end->frame.type() != FrameType::kProducerDecision) {
    return fail(Status::Corruption(
        fmt::format("the coordinator sent {} instead of PRODUCER_DECISION",
                    FrameTypeName(end->frame.type()))));
  }
  auto d = DecodeProducerDecision(end->frame.payload);
  if (!d.ok()) return fail(d.status());
  transport->Stop();
  ProducerDecision told = FromMessage(*d);
  told.chunks = decision.chunks;
  told.payload_bytes = decision.payload_bytes;
  told.changed_elements = decision.changed_elements;
  told.log_bytes = decision.log_bytes;
  told.diff_seconds = decision.diff_seconds;
  if (Advanced(told.outcome)) {
    // The tree moved to these bits: they are the next refit's base.
    rewind.advanced = true;
    if (Status s = shards_->Advance(shards); !s.ok()) {
      // (No step log.) The trainer changed them before the decision came:
      // the decision stands (the tree moved), and the rank's baseline,
      // neither the old version nor the new, is dropped: the next refit
      // fetches the tree's.
      shards_->DropBaseline();
      told.baseline_dropped = true;
      told.reason = told.reason.empty() ? s.ToString()
                                        : told.reason + "; " + s.ToString();
    }
  }
  told.total_seconds = Seconds(t0, Clock::now());
  return told;
}

}  // namespace dcr
