#include "coord/root_tree.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <tuple>

namespace dcr {

std::vector<PlanNode> PlanNodes(const Tree& tree) {
  std::vector<PlanNode> out;
  for (const TreeNode& n : tree.nodes) {
    PlanNode p;
    p.name = n.name;
    p.host = n.host;
    p.port = n.port;
    p.transport = std::string(TransportKindName(n.transport));
    p.parent = n.parent;
    p.link_bps = n.link_bandwidth_bps;
    p.pulls_objects = n.pulls_objects;
    out.push_back(std::move(p));
  }
  return out;
}

RepairRequest RepairsWanted(const std::vector<NodeResult>& votes) {
  std::set<uint32_t> tensors;
  RepairRequest r;
  for (const NodeResult& v : votes) {
    if ((v.code == NodeCode::kIncomplete ||
         v.code == NodeCode::kDigestMismatch) &&
        !v.repair.empty()) {
      tensors.insert(v.repair.begin(), v.repair.end());
      r.nodes.push_back(v.node);
    }
  }
  r.tensors.assign(tensors.begin(), tensors.end());
  return r;
}

std::set<std::string> YesVotes(const std::vector<NodeResult>& votes,
                               const Version& target) {
  std::set<std::string> yes;
  for (const NodeResult& r : votes) {
    if (r.code == NodeCode::kOk && r.version == target) yes.insert(r.node);
  }
  return yes;
}

RootTree::RootTree(const RefitOptions& options, PlanMsg plan, uint64_t epoch,
                   const RefitId& refit, bool resume, ObjectStore* objects,
                   std::set<std::string> plain_nodes)
    : options_(options),
      sender_(options.transport_options.frames, FrameContext{epoch, refit}, 1) {
  TransportOptions to = options.transport_options;
  to.name = options.topology.root.name;
  transports_ = std::make_unique<TransportSet>(to, options.transport);
  Fanout::Options fo;
  fo.transports = transports_.get();
  fo.mailbox = &mailbox_;
  fo.connect_timeout = options.connect_timeout;
  fo.hello = HelloMsg{options.topology.root.name, kRoleRoot, epoch};
  fo.frames = options.transport_options.frames;
  fo.header.epoch = epoch;
  fo.header.refit_id = refit;
  fo.header.sequence = 0;
  fo.resume = resume;
  fo.plain_nodes = std::move(plain_nodes);
  if (objects != nullptr &&
      std::any_of(plan.nodes.begin(), plan.nodes.end(),
                  [](const PlanNode& n) { return n.pulls_objects; })) {
    uploader_ = std::make_unique<ObjectUploader>(
        objects, refit.ToHex(), kParallelUploads, [this] { mailbox_.Wake(); },
        options.phase_timeout);
    fo.objects = uploader_.get();
  }
  fanout_ = Fanout::Create(fo, std::move(plan));
}

RootTree::~RootTree() { Stop(); }

std::vector<NodeResult> RootTree::Plan() {
  fanout_->Start(Clock::now() + options_.phase_timeout);
  WaitPhase();
  return fanout_->Results();
}

void RootTree::Expect(FrameType reply) {
  fanout_->Expect(reply, Clock::now() + options_.phase_timeout);
}

Status RootTree::SendDown(FrameType type,
                          const std::vector<std::byte>& payload) {
  DCR_ASSIGN_OR_RETURN(FrameBuffer frame, sender_.Next(type, payload));
  stream_bytes_ += frame->size();
  fanout_->Forward(frame);
  return Status::OK();
}

RootTree::Clock::time_point RootTree::NextTimer() const {
  Clock::time_point next = Clock::time_point::max();
  // A deadline already acted on (ExpireIfDue failed the late children; a
  // closed Fanout's tick, which Tick no longer moves) is not waited for
  // again.
  for (Clock::time_point t : {fanout_->deadline(), fanout_->next_tick()}) {
    if (t > timers_ran_) next = std::min(next, t);
  }
  // An adoption not accepted within the connect timeout; strictly later
  // than its start, so that ExpireIfDue acts on it.
  if (Clock::time_point t = fanout_->adoption_deadline();
      t != Clock::time_point::max()) {
    next = std::min(next, t + std::chrono::milliseconds(1));
  }
  return next;
}

void RootTree::RunTimers() {
  timers_ran_ = Clock::now();
  fanout_->ExpireIfDue(timers_ran_);
  fanout_->Tick(timers_ran_);
}

void RootTree::WaitPhase() {
  // Waits for events (replies, link failures), the phase's timers and the
  // progress reports.
  RunUntil([this] { return fanout_->Complete(); });
  NoteApplied();
  ReportProgress();  // the phase's answers, all in
}

void RootTree::RunUntil(const std::function<bool()>& done,
                        Clock::time_point deadline) {
  while (!done() && Clock::now() < deadline) {
    mailbox_.RunUntil(std::min({NextTimer(), NextProgress(), deadline}));
    RunTimers();
    NoteApplied();
    MaybeReportProgress();
  }
}

std::optional<uint64_t> RootTree::StreamDelivered() const {
  // This stream's bytes: relays count the refit's, and an overwrite
  // applied twice (a resend) counts twice; never above what was sent.
  std::optional<double> least;
  const uint64_t totals[2] = {stream_payload_, stream_plain_payload_};
  for (int v = 0; v < 2; ++v) {
    std::optional<uint64_t> d = fanout_->Delivered(/*context=*/v == 0);
    if (!d) continue;
    const uint64_t got = std::min(
        *d > delivered_before_[v] ? *d - delivered_before_[v] : 0, totals[v]);
    const double f =
        totals[v] == 0 ? 1.0 : static_cast<double>(got) / totals[v];
    least = least ? std::min(*least, f) : f;
  }
  if (!least) return std::nullopt;
  return *least >= 1.0 ? stream_payload_
                       : static_cast<uint64_t>(*least * stream_payload_);
}

void RootTree::NoteApplied() {
  if (!stream_final_ || applied_at_) return;
  std::optional<uint64_t> d = StreamDelivered();
  if (d && *d >= stream_payload_) applied_at_ = Clock::now();
}

RootTree::Clock::time_point RootTree::NextProgress() const {
  return progress_ ? last_progress_ + kProgressInterval
                   : Clock::time_point::max();
}

void RootTree::MaybeReportProgress() {
  if (progress_ && Clock::now() >= NextProgress()) ReportProgress();
}

void RootTree::ReportProgress() {
  if (!progress_) return;
  last_progress_ = Clock::now();
  RefitOptions::Progress p;
  p.payload_bytes = stream_payload_;
  p.payload_final = stream_final_;
  p.chunks = stream_chunks_;
  p.delivered_bytes = StreamDelivered();
  std::tie(p.answered, p.receivers) = fanout_->Answered();
  for (auto& [name, bytes] : fanout_->QueueDepths()) {
    if (bytes >= p.slowest_queue_bytes) {
      p.slowest = name;
      p.slowest_queue_bytes = bytes;
    }
  }
  progress_(&p);
}

RootTree::Streamed RootTree::StreamFrom(ChunkProducer* producer,
                                        uint64_t window) {
  Streamed out;
  stream_payload_ = stream_plain_payload_ = stream_chunks_ = 0;
  stream_final_ = false;
  applied_at_.reset();
  delivered_before_[0] = fanout_->Delivered(true).value_or(0);
  delivered_before_[1] = fanout_->Delivered(false).value_or(0);
  // Sends queued chunks while every child's queue has room; true when the
  // producer's queue ran empty.
  auto send_queued = [&] {
    while (fanout_->MaxQueuedBytes() <= window) {
      auto o = producer->Pop();
      if (!o) return true;
      if (o->mark) {
        stream_bytes_ += o->frame->size();
        fanout_->Hint(o->frame);
        continue;
      }
      stream_bytes_ += o->frame->size();
      out.payload_bytes += o->payload;
      out.plain_payload_bytes += o->plain ? o->plain_payload : o->payload;
      ++out.chunks;
      stream_payload_ = out.payload_bytes;
      stream_plain_payload_ = out.plain_payload_bytes;
      stream_chunks_ = out.chunks;
      fanout_->Forward(o->frame, /*chunk=*/true, /*keep=*/true, o->plain);
    }
    return false;
  };
  for (;;) {
    const uint64_t before = out.chunks;
    send_queued();
    // Nothing sent (no chunk queued, or a child's queue over the window):
    // wait for what changes that, each of which wakes the mailbox: a chunk
    // queued or the producer done (ChunkProducer's wake), a child's queue
    // down to half the window (Fanout), a frame or a link event; or for a
    // timer: adoptions and heartbeats (no phase deadline here), and, with
    // `progress`, its report interval (a periodic timer by design: the
    // callback wants regular updates, not events).
    Clock::time_point wait_until = Clock::now();
    if (out.chunks == before) {
      wait_until = std::min(NextTimer(), NextProgress());
    }
    mailbox_.RunUntil(wait_until);
    RunTimers();
    if (fanout_->live_children() == 0) {
      producer->Cancel();
      spdlog::error("every cluster head left the refit; stopping the stream");
      break;
    }
    // Drain what the producer queued after its last wake-up.
    if (producer->done() && send_queued()) break;
    MaybeReportProgress();
  }
  stream_final_ = true;
  return out;
}

void RootTree::CountAdoptions(RefitReport* report) const {
  report->adoptions = fanout_->adoptions();
  report->resent_chunks = fanout_->resent_chunks();
  report->resent_bytes = fanout_->resent_bytes();
  report->resend_misses = fanout_->resend_misses();
}

void RootTree::Close() { fanout_->Close(); }

void RootTree::FlushAndStop() {
  // Each link closes once flushed (Fanout::Close: CloseAfterFlush), and
  // its OnClosed, posted here, drops it from MaxQueuedBytes.
  fanout_->Close();
  auto flush_until = Clock::now() + std::chrono::seconds(2);
  while (fanout_->MaxQueuedBytes() > 0 && Clock::now() < flush_until) {
    mailbox_.RunUntil(flush_until);
  }
  Stop();
}

void RootTree::Stop() {
  if (stopped_) return;
  stopped_ = true;
  // The refit is over: objects still queued would reach nobody.
  if (uploader_) uploader_->Stop();
  transports_->Stop();
  mailbox_.Close();
}

}  // namespace dcr
