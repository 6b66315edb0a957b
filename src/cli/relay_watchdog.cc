#include "cli/relay_watchdog.h"

#include <spdlog/spdlog.h>

#include "common/sd_notify.h"
#include "relay/relay.h"

namespace dcr {
namespace {

void Notify(std::string_view state) {
  Status s = SdNotify(state);
  if (!s.ok()) spdlog::warn("systemd notification: {}", s.ToString());
}

}  // namespace

RelayWatchdog::RelayWatchdog(const Relay* relay, std::string listening)
    : relay_(relay) {
  Notify("READY=1\nSTATUS=listening on " + listening);
  auto interval = SdWatchdogInterval();
  if (!interval.ok()) {
    spdlog::warn("systemd watchdog off: {}", interval.status().ToString());
    return;
  }
  if (!interval->has_value()) return;
  spdlog::info("systemd watchdog: WATCHDOG=1 every {} ms while healthy",
               (**interval / 2).count() / 1000);
  thread_ = std::thread([this, i = **interval] { Run(i); });
}

RelayWatchdog::~RelayWatchdog() { Stop(); }

void RelayWatchdog::Stop() {
  if (stopped_) return;
  stopped_ = true;
  Notify("STOPPING=1\nSTATUS=stopping");
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void RelayWatchdog::Run(std::chrono::microseconds interval) {
  const auto half = interval / 2;
  bool stalled = false;
  MutexLock lock(&mu_);
  while (!stop_) {
    const auto since = relay_->SinceLoopTurn();
    if (since < half) {
      Notify("WATCHDOG=1");
      if (stalled) spdlog::info("systemd watchdog: the event loop turns again");
      stalled = false;
    } else if (!stalled) {
      stalled = true;
      spdlog::error(
          "systemd watchdog: the event loop has not turned for {} ms; not "
          "sending WATCHDOG=1 (systemd restarts the relay after WatchdogSec)",
          std::chrono::duration_cast<std::chrono::milliseconds>(since).count());
    }
    cv_.WaitFor(&mu_, half);
  }
}

}  // namespace dcr
