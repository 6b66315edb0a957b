// The coordinator's entry points (the root of the relay tree, beside the
// trainer): RunRefit and ResumeRefit (declared in dcr/refit.h, the public
// API a trainer library calls; implemented over the parts of src/coord:
// refit_setup, refit_run, chunk_producer, root_tree, baseline_update,
// catch_up, refit_report, state_dir), and QueryStatus, which asks relays
// for their state (what `dcr status` does; status_query.cc).
//
// Thread safety: QueryStatus is a blocking call that owns its threads.
#ifndef DCR_COORD_COORDINATOR_H_
#define DCR_COORD_COORDINATOR_H_

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "dcr/refit.h"
#include "dcr/refit_codes.h"
#include "dcr/topology.h"
#include "dcr/transport.h"
#include "dcr/version.h"
#include "protocol/messages.h"  // StoreCondition

namespace dcr {

struct NodeStatus {
  std::string node;
  std::string cluster;
  std::string address;  // host:port
  bool reachable = false;
  std::string error;  // why not reachable
  NodeCode code = NodeCode::kOk;
  std::optional<Version> committed;
  std::string detail;  // relay state and last refit result
  // Its store's condition: `unfinished` names the refit its store records
  // as unfinished (not the one it runs now, unless that one is `repairing`
  // it): its bits are a mix of that refit's base and target, no version.
  StoreCondition store;
};

// What a relay's bits are, as `dcr status` shows them (its "state"), one
// value per node. kCurrent and kStale hold a whole committed version, so
// they can serve; the others cannot.
enum class NodeState {
  kCurrent,      // "current": a committed version, the baseline's (or any
                 // when the root's baseline is not known)
  kStale,        // "stale": a committed version other than the baseline's
  kEmpty,        // "empty": no committed version (no store, never committed)
  kUnfinished,   // "unfinished": a mix of an unfinished refit's base and
                 // target (NodeStatus::store), no version at all
  kRepairing,    // "repairing": unfinished, and the root's repair runs
  kUnreachable,  // "unreachable": no answer (NodeStatus::error says why)
};
std::string_view NodeStateName(NodeState state);
// The state of `node`; `baseline` is the root's baseline version, if known.
NodeState StateOf(const NodeStatus& node,
                  const std::optional<Version>& baseline);
// Whether a node in `state` holds a whole committed version it can serve.
bool ServingReady(NodeState state);
// "holds a mix of step B and step T (refit <12 hex>)" for kUnfinished.
std::string DescribeUnfinished(const StoreCondition& u);

// Asks every relay of the topology for its state, in parallel, waiting at
// most `timeout` for each, over the kind of link into each relay (its
// topology `transport`); a non-empty `transport` uses that kind for all.
std::vector<NodeStatus> QueryStatus(const Topology& topology,
                                    std::chrono::milliseconds timeout,
                                    const std::string& transport = "",
                                    const TransportOptions& options = {});

}  // namespace dcr

#endif  // DCR_COORD_COORDINATOR_H_
