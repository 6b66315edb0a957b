// The coordinator's state directory (topology root.state_dir): the one
// owner of every file in it and of their JSON (docs/FORMAT.md §"State
// directory").
//
//   epoch                 the last coordinator epoch (protocol/epoch_file.h)
//   current.json          the refit in progress: written durably before its
//                         PLAN, removed once its report is written;
//                         `dcr refit --resume` reads it
//   decisions/<refit>.json  a commit decision, durable before COMMIT
//   last-refit.json       the report of the last refit (RefitReport::ToJson)
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
// Thread safety: values; concurrent coordinators need distinct directories.
#ifndef DCR_COORD_STATE_DIR_H_
#define DCR_COORD_STATE_DIR_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dcr/refit.h"
#include "dcr/status.h"
#include "dcr/version.h"

namespace dcr {

// current.json: the refit a coordinator started and has not reported.
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

// {"step": n, "digest": hex}: a version in every state_dir file.
nlohmann::json VersionJson(const Version& v);

// How many refits' decisions decisions/ keeps (besides current.json's).
inline constexpr size_t kDecisionsKept = 32;

class StateDir {
 public:
  explicit StateDir(std::string dir) : dir_(std::move(dir)) {}

  const std::string& dir() const { return dir_; }
  std::string EpochPath() const { return dir_ + "/epoch"; }
  std::string CurrentPath() const { return dir_ + "/current.json"; }
  std::string DecisionPath(const RefitId& refit) const;
  std::string LastRefitPath() const { return dir_ + "/last-refit.json"; }
  std::string HistoryDir() const { return dir_ + "/history"; }

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

  // Writes the report (RefitReport::ToJson plus "format"), or logs a
  // warning (a report is never worth failing a refit that already ended).
  void WriteLastRefit(const RefitReport& report) const;
  // NotFound when no refit wrote one; Corruption naming file and field.
  Result<RefitReport> ReadLastRefit() const;

 private:
  std::string dir_;
};

}  // namespace dcr

#endif  // DCR_COORD_STATE_DIR_H_
