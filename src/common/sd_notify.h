// The service manager's notification protocol (sd_notify(3)), spoken
// without libsystemd: one datagram of "KEY=VALUE" lines to the Unix socket
// $NOTIFY_SOCKET names (a path, or '@' for an abstract name). A process not
// started by systemd has no NOTIFY_SOCKET, and every call is a no-op.
//
//   READY=1      the service is up (Type=notify: dependants start now)
//   WATCHDOG=1   the service is healthy; with WatchdogSec= the manager
//                kills and restarts it when these stop for that long
//   STOPPING=1   the service is shutting down
//   STATUS=...   one line shown by `systemctl status`
//
// Thread safety: thread-safe (each call opens its own socket).
#ifndef DCR_COMMON_SD_NOTIFY_H_
#define DCR_COMMON_SD_NOTIFY_H_

#include <chrono>
#include <optional>
#include <string_view>

#include "dcr/status.h"

namespace dcr {

// Sends `state` (lines joined by '\n', e.g. "READY=1\nSTATUS=listening")
// to the manager. OK without NOTIFY_SOCKET; InvalidArgument for an address
// this build cannot reach (not a path, not '@'-abstract, or longer than a
// socket path); IOError, naming the socket, when the send fails.
Status SdNotify(std::string_view state);

// The watchdog interval the manager expects WATCHDOG=1 within
// ($WATCHDOG_USEC), when it is meant for this process ($WATCHDOG_PID unset
// or equal to getpid()). nullopt without a watchdog; InvalidArgument when
// either variable is set but is not a positive decimal number.
Result<std::optional<std::chrono::microseconds>> SdWatchdogInterval();

}  // namespace dcr

#endif  // DCR_COMMON_SD_NOTIFY_H_
