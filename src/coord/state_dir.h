// The coordinator's state directory (topology root.state_dir): the one
// owner of every file in it and of their JSON (docs/FORMAT.md §"State
// directory").
//
//   lock                  held by the coordinator run using the directory
//                         (StateDirLock); names its pid
//   epoch                 the last coordinator epoch (protocol/epoch_file.h)
//   current.json          the refit in progress: written durably before its
//                         PLAN, removed once its report is written;
//                         `dcr refit --resume` reads it
//   decisions/<refit>.json  a commit decision, durable before COMMIT
//   last-refit.json       the report of the last refit (RefitReport::ToJson)
//   reports/<epoch>-<refit>.json  the reports of the last kReportsKept
//                         refits (dcr history)
//   history/              the delta history (coord/history.h)
//
// Every JSON file carries "format" (kStateFormat; a file without it, from
// an older build, reads as format 1) and is read strictly: a malformed,
// missing or unknown field is Corruption naming the file and the field
// (state_json.h), never skipped. Every write is atomic (a temporary file
// renamed over the old one, synced). decisions/ keeps the decisions of the
// kDecisionsKept newest refits (by epoch) and of the refit current.json
// names (PruneDecisions).
//
// Thread safety: values. One coordinator run at a time per directory:
// RunRefit and ResumeRefit hold its StateDirLock for their whole run.
#ifndef DCR_COORD_STATE_DIR_H_
#define DCR_COORD_STATE_DIR_H_

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/file.h"
#include "dcr/refit.h"
#include "dcr/status.h"
#include "dcr/version.h"

namespace dcr {

// current.json: the refit a coordinator started and has not reported.
// CurrentRefit::target_path of a producers' refit: this prefix, then the
// layout file (there is no target file; root.baseline took the stream).
inline constexpr std::string_view kProducersTarget = "producers:";

struct CurrentRefit {
  RefitId refit;
  uint64_t epoch = 0;
  RefitMode mode = RefitMode::kDelta;
  Version base;
  Version target;
  std::string target_path;  // absolute where it could be made so
  friend bool operator==(const CurrentRefit&, const CurrentRefit&) = default;
};

// decisions/<refit>.json: the decision, written before it is sent.
struct Decision {
  RefitId refit;
  uint64_t epoch = 0;
  bool commit = false;
  Version base;
  Version target;
  std::vector<std::string> commit_set;  // sorted
  friend bool operator==(const Decision&, const Decision&) = default;
};

// {"step": n, "digest": hex}: a version in every state_dir file; the
// digest is null where it is zero (no version, or a target not hashed yet).
nlohmann::json VersionJson(const Version& v);

// The refit a directory entry is named after: a regular file "<refit id,
// 32 hex digits>.json" (decisions/, objects/); nullopt for anything else.
std::optional<RefitId> RefitOfJsonFile(
    const std::filesystem::directory_entry& entry);

// How many refits' decisions decisions/ keeps (besides current.json's).
inline constexpr size_t kDecisionsKept = 32;

// How many refits' reports reports/ keeps (dcr history).
inline constexpr size_t kReportsKept = 1000;

// One file of reports/, read strictly: its report, or why it cannot be
// read (Corruption naming the file and the field).
struct ReportFile {
  std::string path;
  Result<RefitReport> report;
};

// Who holds a state directory's lock, as its lock file says.
struct LockHolder {
  int64_t pid = 0;      // 0: the holder has not written it yet
  std::string command;  // "dcr refit", "dcr refit --resume", ...
  std::string since;    // ISO 8601 UTC
};

class StateDir {
 public:
  explicit StateDir(std::string dir) : dir_(std::move(dir)) {}

  const std::string& dir() const { return dir_; }
  std::string EpochPath() const { return dir_ + "/epoch"; }
  std::string CurrentPath() const { return dir_ + "/current.json"; }
  std::string DecisionPath(const RefitId& refit) const;
  std::string LastRefitPath() const { return dir_ + "/last-refit.json"; }
  std::string ReportsDir() const { return dir_ + "/reports"; }
  std::string HistoryDir() const { return dir_ + "/history"; }
  // Records of the refits that uploaded objects (coord/object_retention.h).
  std::string ObjectsDir() const { return dir_ + "/objects"; }
  std::string LockPath() const { return dir_ + "/lock"; }

  // The coordinator run that holds the lock (StateDirLock), or nullopt when
  // none does; it takes no lock itself (for `dcr status`, read-only). A
  // lock file left by a process that died is no lock.
  std::optional<LockHolder> Running() const;

  // Creates the directory and decisions/ (IOError naming it).
  Status Create() const;

  // Takes the next coordinator epoch, durably.
  Result<uint64_t> NextEpoch() const;

  bool HasCurrent() const;
  Status WriteCurrent(const CurrentRefit& current) const;
  // NotFound when there is no current.json; Corruption naming the file
  // when it is not one.
  Result<CurrentRefit> ReadCurrent() const;
  void RemoveCurrent() const;

  Status WriteDecision(const Decision& decision) const;
  // nullopt when no decision was recorded for `refit`.
  Result<std::optional<Decision>> ReadDecision(const RefitId& refit) const;

  // Removes the decisions of all but the `keep` newest refits (by their
  // epoch) and the refit current.json names. A decision it cannot read is
  // kept and logged (naming file and field), as is an unknown entry.
  // IOError when a file cannot be removed.
  Status PruneDecisions(size_t keep = kDecisionsKept) const;

  // Sets report->ended_at to now and writes the report (RefitReport::ToJson
  // plus "format") as last-refit.json and as
  // reports/<epoch, 12 digits>-<refit id>.json, then removes the reports
  // beyond the kReportsKept newest (by file name: epoch order). A failure
  // is logged as a warning: a report is never worth failing a refit that
  // already ended.
  void WriteReport(RefitReport* report) const;
  // NotFound when no refit wrote one; Corruption naming file and field.
  Result<RefitReport> ReadLastRefit() const;
  // The newest `limit` files of reports/, oldest first (0: all). A file
  // whose name is not <12 digits>-<32 hex>.json is skipped; one that does
  // not read is returned with its error. Empty when there is no reports/.
  // IOError when the directory cannot be listed.
  Result<std::vector<ReportFile>> ReadReports(size_t limit = 0) const;
  // Removes the reports but the `keep` newest (by file name).
  Status PruneReports(size_t keep = kReportsKept) const;

 private:
  std::string dir_;
};

// The exclusive lock of a state directory: an open file description lock
// (fcntl F_OFD_SETLK) on state_dir/lock, held by one coordinator run
// (a refit with its catch-ups, or --resume) from before it reads the
// directory until its report is written. The kernel drops it when the
// holder's descriptor closes, so also when the process dies: there is
// nothing to clean up after a crash. Two coordinators on one directory
// would fence each other off at the relays and could move the baseline on
// a commit nobody received (issue 15): the second one is refused instead.
// The lock file holds "pid N\ncommand C\nsince T\n" for messages and
// `dcr status`; only the lock itself counts. A lock on a network
// filesystem is only as good as its fcntl locks.
//
// Thread safety: move-only; one owner.
class StateDirLock {
 public:
  // Creates the directory if needed and takes its lock for `command`.
  // InvalidArgument (the refusal a new refit gets while current.json
  // exists) naming the holder's pid and what to do when another run holds
  // it; IOError when the lock file cannot be used.
  static Result<StateDirLock> Acquire(const StateDir& state,
                                      std::string_view command);

  StateDirLock(StateDirLock&&) = default;
  StateDirLock& operator=(StateDirLock&&) = default;
  ~StateDirLock() = default;  // closing the descriptor releases the lock

 private:
  explicit StateDirLock(UniqueFd fd) : fd_(std::move(fd)) {}

  UniqueFd fd_;
};

}  // namespace dcr

#endif  // DCR_COORD_STATE_DIR_H_
