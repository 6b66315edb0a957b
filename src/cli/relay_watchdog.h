// dcr-relay under systemd (deploy/systemd/dcr-relay@.service, Type=notify):
// READY=1 once it listens, WATCHDOG=1 while its event loop turns, and
// STOPPING=1 at shutdown, over NOTIFY_SOCKET (common/sd_notify.h). Without
// NOTIFY_SOCKET every call is a no-op.
//
// Healthy means the relay's event loop turned within half the watchdog
// interval (Relay::SinceLoopTurn; it turns at least every 200 ms, idle
// included). Pings go every quarter interval while healthy, and at once
// when a stall ends. A loop that stops turning (a deadlock, a store call
// that never returns) stops the pings, and systemd restarts the relay
// 1.25 to 1.5 WatchdogSec after the loop stopped (a stall shorter than
// WatchdogSec never restarts it): the restart repairs an interrupted refit
// from its journal (docs/PROTOCOL.md §"Repair of a mixed store").
//
// Thread safety: construct, then Stop or destroy, from one thread.
#ifndef DCR_CLI_RELAY_WATCHDOG_H_
#define DCR_CLI_RELAY_WATCHDOG_H_

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "common/mutex.h"

namespace dcr {

class Relay;

class RelayWatchdog {
 public:
  // Sends READY=1 with a STATUS line naming `listening`; then, when systemd
  // asked for a watchdog (WATCHDOG_USEC for this process), pings every
  // quarter interval on a thread of its own while `relay` is healthy. A
  // notification that cannot be sent is logged, never fatal.
  RelayWatchdog(const Relay* relay, std::string listening);
  ~RelayWatchdog();  // Stop()
  RelayWatchdog(const RelayWatchdog&) = delete;
  RelayWatchdog& operator=(const RelayWatchdog&) = delete;

  // Sends STOPPING=1 and joins the ping thread. Idempotent.
  void Stop();

 private:
  void Run(std::chrono::microseconds interval);

  const Relay* relay_;
  Mutex mu_;
  CondVar cv_;
  bool stop_ DCR_GUARDED_BY(mu_) = false;
  bool stopped_ = false;  // Stop ran (the owner's thread only)
  std::thread thread_;
};

}  // namespace dcr

#endif  // DCR_CLI_RELAY_WATCHDOG_H_
