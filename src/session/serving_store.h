// What a refit session on a serving store shares between its files
// (refit_session.cc, serving_store.cc, crash_recovery.cc): the rank's bits
// and the checks of a plan against the rank's map.
#ifndef DCR_SESSION_SERVING_STORE_H_
#define DCR_SESSION_SERVING_STORE_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dcr/receiver_map.h"
#include "dcr/store.h"
#include "protocol/messages.h"

namespace dcr::session_internal {

// The bits a serving store holds: the rank's canonical regions (FP8
// tensors from their shadows).
Result<std::vector<LinearDigest>> ServingRegions(WeightStore* store,
                                                 const ReceiverMap& map);

// Checks a serving store and a plan against the map; the refusal's code
// and detail, or nullopt. Sets `canonical` to the map's canonical tensors.
std::optional<std::pair<NodeCode, std::string>> CheckServing(
    const WeightStore& store, const ReceiverMap& map, const PlanMsg& plan,
    Manifest* canonical);

}  // namespace dcr::session_internal

#endif  // DCR_SESSION_SERVING_STORE_H_
