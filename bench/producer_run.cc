// One trainer rank's producer as a process of its own, for
// bench/producers_bench.py: it reads its baseline and target shard files
// (the files `dcr-traingen --layout` writes) and either refits them
// through `dcr refit --producers` or, with --diff-only, only diffs them.
//
//   producer_run --layout L --rank R --base DIR --target DIR [--target ...]
//                (--coordinator HOST:PORT --step S [--settle] | --diff-only)
//                [--step-log-bytes N]
//
// Several --target directories are refitted in turn as steps S, S+1, ...
// by one producer, as a trainer's rank would: only the first refit pays
// the baseline's copy and hash. --settle: before each step after the first,
// sync(2) (the time a training step takes, in which the last refit's
// write-back finishes; the bench's stores share one disk).
// --step-log-bytes: the bound on a step's change log (0: none; default:
// the library's, a quarter of the shard bytes). Prints one JSON
// line: the last step's
// decision (or, with --diff-only, the last target's diff's figures, each
// step advanced before the next),
// every step's in "steps", the bytes of shard files it mapped, what the
// library holds (its baseline copy and the step's chunks), its peak RSS
// and its CPU time.
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dcr/layout.h"
#include "dcr/producer.h"
#include "dcr/shard_delta.h"

namespace {

using Clock = std::chrono::steady_clock;

int Fail(const dcr::Status& s) {
  std::fprintf(stderr, "producer_run: %s\n", s.ToString().c_str());
  return 1;
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// The calling thread's alone (the producer's diff runs on it; the link's
// event and heartbeat threads do not).
double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

uint64_t PeakRssBytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;
}

}  // namespace

int main(int argc, char** argv) {
  std::string layout_path, base_dir, coordinator;
  std::vector<std::string> target_dirs;
  uint32_t rank = 0;
  uint64_t step = 1;
  bool diff_only = false, settle = false;
  int64_t step_log_bytes = -1;  // -1: the library's default bound
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : ""; };
    if (a == "--layout") layout_path = next();
    if (a == "--rank") rank = static_cast<uint32_t>(std::stoul(next()));
    if (a == "--base") base_dir = next();
    if (a == "--target") target_dirs.push_back(next());
    if (a == "--coordinator") coordinator = next();
    if (a == "--step") step = std::stoull(next());
    if (a == "--diff-only") diff_only = true;
    if (a == "--settle") settle = true;
    if (a == "--step-log-bytes") step_log_bytes = std::stoll(next());
  }
  if (layout_path.empty() || base_dir.empty() || target_dirs.empty() ||
      (coordinator.empty() && !diff_only)) {
    std::fprintf(stderr,
                 "usage: producer_run --layout L --rank R --base DIR --target "
                 "DIR (--coordinator HOST:PORT --step S [--settle] | "
                 "--diff-only) [--step-log-bytes N]\n");
    return 2;
  }
  auto layout = dcr::LoadLayout(layout_path);
  if (!layout.ok()) return Fail(layout.status());
  nlohmann::json out = {{"rank", rank}};
  uint64_t mapped = 0;
  const auto t0 = Clock::now();
  auto elapsed = [](Clock::time_point a) {
    return std::chrono::duration<double>(Clock::now() - a).count();
  };
  if (diff_only) {
    dcr::ShardProducer p(*layout, rank, dcr::kDefaultSpanElems);
    if (step_log_bytes >= 0) {
      p.set_step_log_bytes(static_cast<uint64_t>(step_log_bytes));
    }
    {
      auto base = dcr::RankShards::Open(*layout, rank, base_dir);
      if (!base.ok()) return Fail(base.status());
      mapped = base->file_bytes();
      if (dcr::Status s = p.SetBaseline(base->bytes()); !s.ok()) return Fail(s);
    }
    const uint64_t base_bytes = mapped;
    // Each target in turn, each step advanced before the next (a
    // trainer's steps); the figures are the last diff's.
    dcr::Result<dcr::ShardProducer::Step> step_out =
        dcr::Status::InvalidArgument("no target");
    auto target = dcr::RankShards::Open(*layout, rank, target_dirs[0]);
    double cpu0 = 0;
    Clock::time_point t;
    for (size_t k = 0; k < target_dirs.size(); ++k) {
      if (k > 0) {
        if (dcr::Status s = p.Advance(target->bytes()); !s.ok()) return Fail(s);
        target = dcr::RankShards::Open(*layout, rank, target_dirs[k]);
      }
      if (!target.ok()) return Fail(target.status());
      mapped = std::max(mapped, base_bytes + target->file_bytes());
      cpu0 = CpuSeconds();
      t = Clock::now();
      step_out = p.Diff(target->bytes());
      if (!step_out.ok()) return Fail(step_out.status());
    }
    out["diff_seconds"] = elapsed(t);
    out["diff_cpu_seconds"] = CpuSeconds() - cpu0;
    out["shard_bytes"] = target->file_bytes();
    out["chunks"] = step_out->chunks.size();
    out["payload_bytes"] = step_out->sizes.total();
    out["changed"] = step_out->changed;
    out["baseline_bytes"] = p.baseline_bytes();
    out["logged"] = step_out->logged;
    out["log_bytes"] = step_out->log_bytes;
  } else {
    dcr::ProducerOptions o;
    o.coordinator = coordinator;
    if (step_log_bytes >= 0) {
      o.step_log_bytes = static_cast<uint64_t>(step_log_bytes);
    }
    dcr::Producer p(*layout, rank, o);
    uint64_t shard_bytes = 0, base_bytes = 0;
    {
      auto base = dcr::RankShards::Open(*layout, rank, base_dir);
      if (!base.ok()) return Fail(base.status());
      base_bytes = base->file_bytes();
      mapped += base->file_bytes();
      if (dcr::Status s = p.SetBaseline(base->bytes()); !s.ok()) return Fail(s);
    }
    out["steps"] = nlohmann::json::array();
    for (size_t k = 0; k < target_dirs.size(); ++k) {
      if (settle && k > 0) ::sync();
      // Each step's shards are mapped while it runs (a trainer's tensors).
      auto target = dcr::RankShards::Open(*layout, rank, target_dirs[k]);
      if (!target.ok()) return Fail(target.status());
      mapped = std::max(mapped, base_bytes + target->file_bytes());
      shard_bytes = target->file_bytes();
      const double cpu0 = CpuSeconds(), thread0 = ThreadCpuSeconds();
      auto d = p.Refit(step + k, target->bytes());
      if (!d.ok()) return Fail(d.status());
      nlohmann::json s = {
          {"step", step + k},
          {"outcome", std::string(dcr::ProducerOutcomeName(d->outcome))},
          {"reason", d->reason},
          {"diff_seconds", d->diff_seconds},
          {"refit_seconds", d->total_seconds},
          {"refit_cpu_seconds", CpuSeconds() - cpu0},
          {"refit_thread_cpu_seconds", ThreadCpuSeconds() - thread0},
          {"chunks", d->chunks},
          {"payload_bytes", d->payload_bytes},
          {"changed", d->changed_elements},
          {"log_bytes", d->log_bytes}};
      out["steps"].push_back(s);
      for (const auto& [key, value] : s.items()) out[key] = value;
      if (!dcr::Advanced(d->outcome)) break;
    }
    out["shard_bytes"] = shard_bytes;
    // What the library holds at its peak: the baseline copy (the shard's
    // size), the step's encoded chunks and its change log.
    out["baseline_bytes"] = shard_bytes;
  }
  out["library_bytes"] = out["baseline_bytes"].get<uint64_t>() +
                         out["payload_bytes"].get<uint64_t>() +
                         out.value("log_bytes", uint64_t{0});
  out["mapped_file_bytes"] = mapped;
  out["peak_rss_bytes"] = PeakRssBytes();
  out["seconds"] = elapsed(t0);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
