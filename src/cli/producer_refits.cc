// `dcr refit --producers N`: a long-running coordinator of producers'
// refits (dcr/producer.h), one per trainer step.
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <memory>
#include <thread>

#include "cli/refit_cli.h"
#include "dcr/checkpoint.h"
#include "dcr/layout.h"
#include "dcr/producer.h"
#include "dcr/shard_delta.h"

namespace dcr::cli {

// `dcr refit --producers N`: a coordinator that runs one refit per trainer
// step, each streamed by the N ranks' producers (dcr/producer.h), until
// --refits of them ran or a signal asks it to stop. A refit that fails is
// reported (and told to the producers); the next step is still served.
// Exit: 1 if any refit failed or aborted, else 3 if any committed partial,
// else 0; 2 for a usage or configuration error before the first.
int RunProducerRefits(const ProducerArgs& a, const GlobalOptions& g,
                      RefitOptions* o,
                      std::unique_ptr<RefitProgress>* progress) {
  auto layout = LoadLayout(a.layout);
  if (!layout.ok()) return ReportError(layout.status());
  if (static_cast<uint32_t>(a.producers) != layout->ranks()) {
    return ReportError(Status::InvalidArgument(fmt::format(
        "--producers {}: the layout {} has {} ranks (tp {} x pp {} x ep {})",
        a.producers, a.layout, layout->ranks(), layout->tp, layout->pp,
        layout->ep)));
  }
  auto wait = ParseTimeout(a.producer_wait);
  if (!wait.ok()) {
    return ReportError(Status::InvalidArgument(fmt::format(
        "--producer-wait '{}': give a duration, e.g. 60s", a.producer_wait)));
  }
  auto address = SplitHostPort("--listen", a.listen, /*allow_zero=*/true);
  if (!address.ok()) return ReportError(address.status());
  // What every step would refuse, refused once now (exit 2).
  const Topology& topo = o->topology;
  if (topo.root.baseline.empty() || topo.root.state_dir.empty()) {
    return ReportError(Status::InvalidArgument(
        topo.source +
        ": a producers' refit needs root.baseline (the canonical copy the "
        "ranks' parts are applied to) and root.state_dir"));
  }
  {
    auto baseline =
        Checkpoint::Open(topo.root.baseline, Checkpoint::Mode::kReadOnly);
    if (!baseline.ok()) {
      return ReportError(
          baseline.status().WithContext(topo.source + ": root.baseline"));
    }
    auto placed = ManifestOf(*layout);
    if (!placed.ok()) return ReportError(placed.status());
    if (placed->digest() != (*baseline)->manifest().digest()) {
      return ReportError(Status::InvalidArgument(fmt::format(
          "the layout {} places other tensors than root.baseline {} holds: {}",
          a.layout, topo.root.baseline,
          Manifest::Difference((*baseline)->manifest(), *placed))));
    }
  }
  // SIGINT and SIGTERM are taken by sigwait in one thread: blocked before
  // the hub's threads start, which inherit the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  auto listened = ProducerHub::Listen(*layout, address->first, address->second,
                                      o->transport_options);
  if (!listened.ok()) return ReportError(listened.status());
  std::shared_ptr<ProducerHub> hub = *std::move(listened);
  // (A weak reference: the hub's destructor, at return, lets the last
  // decisions reach their producers.)
  std::thread([set, weak = std::weak_ptr<ProducerHub>(hub)] {
    int sig = 0;
    sigwait(&set, &sig);
    std::fprintf(stderr,
                 "dcr: %s: no further refits (a refit in progress finishes; "
                 "a second signal stops at once)\n",
                 sig == SIGINT ? "SIGINT" : "SIGTERM");
    if (auto h = weak.lock()) h->Stop();
    // A second signal takes its default action (this thread is the one
    // that has them unblocked).
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  }).detach();
  std::fprintf(stderr, "dcr: waiting for %d producers on %s:%u (layout %s)\n",
               a.producers, address->first.c_str(), hub->port(),
               a.layout.c_str());
  o->producers = hub.get();
  o->producer_wait = *wait;
  // root.baseline stays open from one step's refit to the next.
  o->kept_baseline = std::make_shared<KeptBaseline>();
  bool failed = false, partial = false;
  for (int done = 0; a.refits == 0 || done < a.refits; ++done) {
    const uint64_t gathers = hub->gathers();
    auto report = RunRefit(*o);
    if (*progress) {
      (*progress)->Finish();
      progress->reset();
    }
    if (!report.ok()) {
      const Status& s = report.status();
      // SIGINT or SIGTERM while waiting for the next step.
      if (hub->stopped() && s.code() == StatusCode::kAborted &&
          s.message() == "stopped") {
        break;
      }
      ReportError(s);
      if (hub->gathers() == gathers) {
        // It failed before waiting for its producers (another coordinator
        // on the state_dir, a refit left to resume): it would fail again
        // at once. Whoever waits is told; the next command fixes it.
        hub->RefuseWaiting(std::string(s.message()));
        return s.IsInvalidArgument() || s.IsNotFound() ? kExitUsage
                                                       : kExitFailed;
      }
      failed = true;
      continue;
    }
    if (g.format() == OutputFormat::kJson) {
      std::printf("%s\n", report->ToJson().c_str());
    } else {
      std::printf("trainer step %llu from %u producers:\n",
                  static_cast<unsigned long long>(report->trainer_step),
                  report->producers);
      PrintReport(*report);
    }
    std::fflush(stdout);
    int rc = OutcomeExit(report->outcome);
    failed |= rc == kExitFailed;
    partial |= rc == kExitCommittedPartial;
  }
  return failed ? kExitFailed : partial ? kExitCommittedPartial : kExitOk;
}

}  // namespace dcr::cli
