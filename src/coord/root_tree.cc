#include "coord/root_tree.h"

#include <spdlog/spdlog.h>

#include <algorithm>

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
                   const RefitId& refit, bool resume)
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

void RootTree::WaitPhase() {
  while (!fanout_->Complete()) {
    Clock::time_point next = std::min(
        fanout_->deadline(), Clock::now() + std::chrono::milliseconds(50));
    mailbox_.RunUntil(next);
    fanout_->ExpireIfDue(Clock::now());
    fanout_->Tick(Clock::now());
  }
}

RootTree::Streamed RootTree::StreamFrom(
    ChunkProducer* producer, uint64_t window,
    const std::function<void(RefitOptions::Progress*)>& progress) {
  Streamed out;
  // Sends queued chunks while every child's queue has room; true when the
  // producer's queue ran empty.
  auto send_queued = [&] {
    while (fanout_->MaxQueuedBytes() <= window) {
      auto o = producer->Pop();
      if (!o) return true;
      stream_bytes_ += o->frame->size();
      out.payload_bytes += o->payload;
      ++out.chunks;
      fanout_->Forward(o->frame, /*chunk=*/true);
    }
    return false;
  };
  auto last_progress = Clock::now();
  for (;;) {
    const uint64_t before = out.chunks;
    send_queued();
    const bool idle = out.chunks == before;
    mailbox_.RunUntil(Clock::now() + std::chrono::milliseconds(idle ? 20 : 0));
    fanout_->ExpireIfDue(Clock::now());  // adoptions: no phase deadline here
    fanout_->Tick(Clock::now());
    if (fanout_->live_children() == 0) {
      producer->Cancel();
      spdlog::error("every cluster head left the refit; stopping the stream");
      break;
    }
    // Drain what the producer queued after its last wake-up.
    if (producer->done() && send_queued()) break;
    if (progress &&
        Clock::now() - last_progress > std::chrono::milliseconds(100)) {
      last_progress = Clock::now();
      RefitOptions::Progress p;
      p.payload_bytes = out.payload_bytes;
      p.chunks = out.chunks;
      for (auto& [name, bytes] : fanout_->QueueDepths()) {
        if (bytes >= p.slowest_queue_bytes) {
          p.slowest = name;
          p.slowest_queue_bytes = bytes;
        }
      }
      progress(&p);
    }
  }
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
  auto flush_until = Clock::now() + std::chrono::seconds(2);
  while (fanout_->MaxQueuedBytes() > 0 && Clock::now() < flush_until) {
    mailbox_.RunUntil(Clock::now() + std::chrono::milliseconds(5));
  }
  Stop();
}

void RootTree::Stop() {
  if (stopped_) return;
  stopped_ = true;
  transports_->Stop();
  mailbox_.Close();
}

}  // namespace dcr
