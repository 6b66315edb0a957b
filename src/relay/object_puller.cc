#include "relay/object_puller.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <future>
#include <map>
#include <memory>
#include <vector>

namespace dcr {

ObjectPuller::ObjectPuller(ObjectStore* store, std::string refit_hex,
                           std::function<void(FrameBuffer)> deliver,
                           std::function<void(Status)> fail,
                           size_t max_unconsumed_bytes)
    : store_(store),
      refit_hex_(std::move(refit_hex)),
      deliver_(std::move(deliver)),
      fail_(std::move(fail)),
      max_unconsumed_(max_unconsumed_bytes) {
  thread_ = std::thread([this] { Run(); });
}

ObjectPuller::~ObjectPuller() { Stop(); }

void ObjectPuller::Pause(bool paused) {
  MutexLock lock(&mu_);
  paused_ = paused;
  cv_.SignalAll();
}

void ObjectPuller::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

bool ObjectPuller::Sleep(std::chrono::milliseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  MutexLock lock(&mu_);
  while (!stop_ && std::chrono::steady_clock::now() < until) {
    cv_.WaitUntil(&mu_, until);
  }
  return !stop_;
}

void ObjectPuller::Consumed(size_t bytes) {
  MutexLock lock(&mu_);
  unconsumed_ -= std::min(bytes, unconsumed_);
  cv_.SignalAll();
}

bool ObjectPuller::WaitReady() {
  MutexLock lock(&mu_);
  while ((paused_ || unconsumed_ > max_unconsumed_) && !stop_) {
    cv_.Wait(&mu_);
  }
  return !stop_;
}

void ObjectPuller::Deliver(std::vector<std::byte> object) {
  pulled_.fetch_add(1);
  pulled_bytes_.fetch_add(object.size());
  {
    MutexLock lock(&mu_);
    unconsumed_ += object.size();
  }
  deliver_(std::make_shared<const std::vector<std::byte>>(std::move(object)));
}

void ObjectPuller::Run() {
  using Clock = std::chrono::steady_clock;
  uint64_t ordinal = 0;
  std::chrono::milliseconds poll = kPollMin;
  // When the object `ordinal` was first found missing while a later one
  // was there; max(): not so.
  Clock::time_point gap_since = Clock::time_point::max();
  int bad_reads = 0;  // of object `ordinal`
  int window = 1;     // objects asked for at once
  // Reads in flight, by ordinal (from `ordinal` on): a sliding window,
  // refilled as the first one completes, so that the round trips of later
  // objects overlap the transfer of earlier ones.
  std::map<uint64_t, std::future<Result<std::vector<std::byte>>>> inflight;
  // Objects read past one that was missing (parallel uploads store them
  // out of order): kept, not read twice. Reads and kept objects stay below
  // ordinal + kParallel, so at most kParallel objects are held.
  std::map<uint64_t, std::vector<std::byte>> ready;
  for (;;) {
    if (!WaitReady()) return;
    const std::string key = RefitObjectKey(refit_hex_, ordinal);
    Result<std::vector<std::byte>> got = Status::NotFound(key);
    if (auto it = ready.find(ordinal); it != ready.end()) {
      got = std::move(it->second);
      ready.erase(it);
    } else {
      for (uint64_t k = ordinal; k < ordinal + static_cast<uint64_t>(window);
           ++k) {
        if (ready.count(k) || inflight.count(k)) continue;
        inflight.emplace(k, std::async(std::launch::async, [this, k] {
                           return store_->Get(RefitObjectKey(refit_hex_, k));
                         }));
        requests_.fetch_add(1);
      }
      auto first = inflight.find(ordinal);
      got = first->second.get();
      inflight.erase(first);
    }
    if (got.ok()) {
      Deliver(std::move(*got));
      ++ordinal;
      poll = kPollMin;
      bad_reads = 0;
      gap_since = Clock::time_point::max();
      window = std::min(window * 2, kParallel);
      continue;
    }
    // The frontier or a gap: keep what was read past it, and ask for the
    // missing one again, with the checks below.
    for (auto& [k, f] : inflight) {
      Result<std::vector<std::byte>> later = f.get();
      if (later.ok()) ready.emplace(k, std::move(*later));
    }
    inflight.clear();
    window = 1;
    if (!got.status().IsNotFound()) {
      // A server that is not atomic (s3rver) can serve an object while it
      // is being written: read it again a few times before giving it up.
      if (got.status().IsCorruption() && ++bad_reads < kBadReads) {
        if (!Sleep(poll)) return;
        poll = std::min(poll * 2, kPollMax);
        continue;
      }
      if (got.status().IsCorruption()) {
        spdlog::warn("objstore: skipping {}: {}", key, got.status().ToString());
        skipped_.fetch_add(1);
        ++ordinal;
        bad_reads = 0;
        poll = kPollMin;
        continue;
      }
      if (got.status().IsInvalidArgument()) {
        // Refused (credentials, access): no wait makes it pass.
        spdlog::error("objstore: {}: {}", key, got.status().ToString());
        fail_(got.status());
        return;
      }
      // The store's own retries are spent (a server down): wait, try again.
      spdlog::warn("objstore: {}: {}", key, got.status().ToString());
      if (!Sleep(kPollMax)) return;
      continue;
    }
    // Not there yet. Uploads run in parallel, so a later object may be;
    // one missing long after a later one appeared failed for good.
    if (poll == kPollMax) {
      // Proof that a later object is there: one kept (every key of
      // `ready` is above `ordinal`), or the next one, read (and kept).
      bool later = !ready.empty();
      if (!later) {
        requests_.fetch_add(1);
        Result<std::vector<std::byte>> next =
            store_->Get(RefitObjectKey(refit_hex_, ordinal + 1));
        if (next.ok()) {
          ready.emplace(ordinal + 1, std::move(*next));
          later = true;
        }
      }
      if (later) {
        const Clock::time_point now = Clock::now();
        if (gap_since == Clock::time_point::max()) gap_since = now;
        if (now - gap_since >= kSkipAfter) {
          spdlog::warn(
              "objstore: {} is still missing {} s after a later "
              "object appeared; skipping it",
              key, kSkipAfter.count());
          skipped_.fetch_add(1);
          ++ordinal;
          gap_since = Clock::time_point::max();
          continue;
        }
      }
    }
    if (!Sleep(poll)) return;
    poll = std::min(poll * 2, kPollMax);
  }
}

}  // namespace dcr
