// ProducerHub's side of one refit's stream (coord/producer_hub.h): GO,
// the chunk queue and its backpressure (Fetch), the failure and
// cancellation of the refit, the ranks' DONEs and their decision. The
// links, hellos and Gather are in producer_hub.cc.
#include <fmt/format.h>

#include <algorithm>

#include "coord/producer_hub.h"  // IWYU pragma: associated

namespace dcr {

void ProducerHub::Impl::Go(const ProducerGoMsg& go, uint64_t window) {
  std::vector<std::byte> payload = EncodeProducerGo(go);
  MutexLock lock(&mu_);
  window_ = window;
  for (const auto& [rank, id] : refit_) {
    Peer& p = peers_.at(id);
    if (p.state != State::kGathered) continue;
    p.state = State::kStreaming;
    p.last_frame = Clock::now();
    Send(*p.link, FrameType::kProducerGo, payload);
  }
}

void ProducerHub::Impl::ResumeIfRoom() {
  if (queued_bytes_ > window_ / 2) return;
  for (auto& [id, p] : peers_) {
    if (!p.paused) continue;
    p.paused = false;
    p.last_frame = Clock::now();  // its silence was ours
    p.link->ResumeReading();
  }
}

void ProducerHub::Impl::ReportEnded(std::vector<uint32_t>* ended) {
  if (ended == nullptr) return;
  for (const auto& [r, id] : refit_) {
    const uint32_t rank = r;  // (a lambda cannot capture a binding in clang)
    if (peers_.at(id).state != State::kDone || ended_.contains(rank)) continue;
    const bool queued =
        std::any_of(queue_.begin(), queue_.end(),
                    [&](const ProducerChunk& c) { return c.rank == rank; });
    if (queued) continue;
    ended_.insert(rank);
    ended->push_back(rank);
  }
}

Status ProducerHub::Impl::Fetch(size_t max, std::chrono::milliseconds idle,
                                std::vector<ProducerChunk>* out,
                                std::vector<uint32_t>* ended) {
  out->clear();
  if (ended != nullptr) ended->clear();
  MutexLock lock(&mu_);
  for (;;) {
    if (!failure_.empty()) return Status::Aborted(failure_);
    if (!queue_.empty()) {
      while (!queue_.empty() && out->size() < max) {
        queued_bytes_ -= queue_.front().chunk.size();
        out->push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      ResumeIfRoom();
      ReportEnded(ended);
      return Status::OK();
    }
    ReportEnded(ended);
    // A rank that ended is news by itself: what waited on it may go while
    // the others stream.
    if (ended != nullptr && !ended->empty()) return Status::OK();
    // Nothing queued: every link is being read.
    ResumeIfRoom();
    Clock::time_point wake = Clock::time_point::max();
    bool all_done = true;
    const auto now = Clock::now();
    for (const auto& [rank, id] : refit_) {
      const Peer& p = peers_.at(id);
      if (p.state == State::kDone) continue;
      all_done = false;
      if (now - p.last_frame >= idle) {
        Fail(fmt::format("producer rank {} ({}) sent nothing for {:.3g} s",
                         rank, p.peer,
                         std::chrono::duration<double>(idle).count()));
        break;
      }
      wake = std::min(wake, p.last_frame + idle);
    }
    if (!failure_.empty()) continue;
    if (all_done) return Status::OK();
    changed_.WaitUntil(&mu_, wake);
  }
}

Status ProducerHub::Impl::Failure() const {
  MutexLock lock(&mu_);
  return failure_.empty() ? Status::OK() : Status::Aborted(failure_);
}

void ProducerHub::Impl::Cancel(const std::string& why) {
  {
    MutexLock lock(&mu_);
    Fail(why);
  }
  changed_.SignalAll();
}

std::vector<ProducerDoneMsg> ProducerHub::Impl::Done() const {
  MutexLock lock(&mu_);
  std::vector<ProducerDoneMsg> done;
  for (const auto& [rank, id] : refit_) done.push_back(peers_.at(id).done);
  return done;
}

void ProducerHub::Impl::Decide(const ProducerDecisionMsg& decision) {
  std::vector<std::byte> payload = EncodeProducerDecision(decision);
  MutexLock lock(&mu_);
  std::vector<uint64_t> to;
  if (!refit_.empty()) {
    for (const auto& [rank, id] : refit_) to.push_back(id);
  } else {
    // The refit never gathered: everyone waiting is told why.
    for (const auto& [id, p] : peers_) {
      if (p.hello_seen) to.push_back(id);
    }
  }
  for (uint64_t id : to) {
    Peer& p = peers_.at(id);
    if (p.state != State::kGone) {
      Send(*p.link, FrameType::kProducerDecision, payload);
      closing_.insert(id);
      p.link->CloseAfterFlush();
    }
    peers_.erase(id);
  }
  refit_.clear();
  queue_.clear();
  ended_.clear();
  queued_bytes_ = 0;
}

}  // namespace dcr
