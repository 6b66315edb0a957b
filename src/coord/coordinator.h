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
};

// Asks every relay of the topology for its state, in parallel, waiting at
// most `timeout` for each, over the kind of link into each relay (its
// topology `transport`); a non-empty `transport` uses that kind for all.
std::vector<NodeStatus> QueryStatus(const Topology& topology,
                                    std::chrono::milliseconds timeout,
                                    const std::string& transport = "",
                                    const TransportOptions& options = {});

}  // namespace dcr

#endif  // DCR_COORD_COORDINATOR_H_
