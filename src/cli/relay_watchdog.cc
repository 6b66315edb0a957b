#include "cli/relay_watchdog.h"

#include <spdlog/spdlog.h>

#include <algorithm>

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
               (**interval / 4).count() / 1000);
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
  using std::chrono::milliseconds;
  // Healthy: the loop turned within half the interval (it turns every
  // 200 ms at idle, so never less than 400 ms). Pings every quarter while
  // healthy, and at once when a stall ends (checked every eighth, 20 ms
  // to 1 s). A stall shorter than the interval never gets the relay
  // restarted; one that lasts goes unpinged from half the interval on, and
  // systemd restarts the relay 1.25 to 1.5 intervals after it began.
  const auto threshold = std::max<std::chrono::steady_clock::duration>(
      interval / 2, milliseconds(400));
  const auto ping_every = interval / 4;
  const auto check_every = std::clamp<std::chrono::steady_clock::duration>(
      interval / 8, milliseconds(20), milliseconds(1000));
  auto last_ping = std::chrono::steady_clock::time_point();
  bool stalled = false;
  MutexLock lock(&mu_);
  while (!stop_) {
    const auto since = relay_->SinceLoopTurn();
    const auto now = std::chrono::steady_clock::now();
    if (since < threshold) {
      if (stalled || now - last_ping >= ping_every) {
        Notify("WATCHDOG=1");
        last_ping = now;
      }
      if (stalled) spdlog::info("systemd watchdog: the event loop turns again");
      stalled = false;
    } else if (!stalled) {
      stalled = true;
      spdlog::error(
          "systemd watchdog: the event loop has not turned for {} ms; not "
          "sending WATCHDOG=1 (systemd restarts the relay after WatchdogSec)",
          std::chrono::duration_cast<std::chrono::milliseconds>(since).count());
    }
    cv_.WaitFor(&mu_, check_every);
  }
}

}  // namespace dcr
