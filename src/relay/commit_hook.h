// A command a relay runs after each refit it commits (dcr-relay
// --on-commit; docs/PLACEMENT.md §"A command after each commit"): how a
// runtime that speaks neither Python nor the pause protocol, or an
// engine's weight-update route, learns that the store holds a new
// version.
//
// The command runs as `/bin/sh -c COMMAND` in a process group of its own,
// with the relay's environment plus
//   DCR_NODE     the relay's node name
//   DCR_STEP     the committed step
//   DCR_DIGEST   its digest, 32 hex digits
//   DCR_REFIT    the refit's id, 32 hex digits
//   DCR_STORE    the store as the relay was given it (kind:path)
//   DCR_IMAGE    with a serving process: the live image (shm:NAME.0 or .1);
//                else empty
// on a thread of its own: the relay never waits for it, and what it does
// cannot change the commit. One command runs at a time. A commit while one
// runs is queued; a newer commit replaces a queued one (the command learns
// the newest version, not each one). Its output (stdout and stderr) goes
// to the relay's log a line at a time, at most kMaxLoggedLines per run. A
// command still running after `timeout` is killed (SIGKILL to its group).
// A run that exits non-zero, is killed or cannot start is a failure:
// logged and counted, nothing else.
//
// Thread safety: Committed() and stats() may be called from any thread.
#ifndef DCR_RELAY_COMMIT_HOOK_H_
#define DCR_RELAY_COMMIT_HOOK_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "dcr/version.h"
#include "relay/relay_stats.h"

namespace dcr {

class CommitHook {
 public:
  static constexpr int kMaxLoggedLines = 20;

  struct Options {
    std::string command;  // for /bin/sh -c; not empty
    std::string node;     // DCR_NODE, and the log's prefix
    std::string store;    // DCR_STORE
    std::chrono::milliseconds timeout{60000};
  };
  struct Commit {
    Version version;
    RefitId refit;
    std::string image;  // DCR_IMAGE; empty without a serving process
  };

  explicit CommitHook(Options options);
  // Kills a running command's group, and joins the thread.
  ~CommitHook();
  CommitHook(const CommitHook&) = delete;
  CommitHook& operator=(const CommitHook&) = delete;

  // Queues a run for `commit` (replacing one queued); never blocks on it.
  void Committed(Commit commit) DCR_EXCLUDES(mu_);
  CommitHookStats stats() const DCR_EXCLUDES(mu_);
  // Waits until nothing runs or is queued, up to `wait`; true if so.
  bool WaitIdle(std::chrono::milliseconds wait) DCR_EXCLUDES(mu_);

 private:
  void Loop() DCR_EXCLUDES(mu_);
  // Runs the command for `c`; returns its exit status (128 + signal if
  // killed, -1 if it could not start).
  int Run(const Commit& c) DCR_EXCLUDES(mu_);

  const Options options_;
  mutable Mutex mu_;
  CondVar cv_;  // queued_, stop_ or running_ changed
  std::optional<Commit> queued_ DCR_GUARDED_BY(mu_);
  bool stop_ DCR_GUARDED_BY(mu_) = false;
  pid_t running_ DCR_GUARDED_BY(mu_) = 0;  // its process group; 0: none
  CommitHookStats stats_ DCR_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace dcr

#endif  // DCR_RELAY_COMMIT_HOOK_H_
