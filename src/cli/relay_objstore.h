// The object store a pulling cluster head reads (dcr-relay): opened at
// start, so that a missing credential or directory, or credentials the
// store refuses, are reported then, not at the first refit.
#ifndef DCR_CLI_RELAY_OBJSTORE_H_
#define DCR_CLI_RELAY_OBJSTORE_H_

#include <memory>
#include <string>

#include "dcr/objstore.h"
#include "dcr/status.h"
#include "dcr/topology.h"

namespace dcr::cli {

// Null when node `node` of `topo` does not pull from the topology's object
// store (no objstore: section, or not the head of a source: objstore
// cluster). Otherwise the store, opened with one attempt per request and a
// 2 s stall limit (the puller polls again by itself, and a refit that ends
// must not wait on a hung server for the store's retries), after one read
// it must answer "no such object": a refusal is an error naming
// `topology_path` and the rights a head needs; a server that does not
// answer yet is only a warning.
Result<std::unique_ptr<ObjectStore>> OpenPullingHeadStore(
    const Topology& topo, const std::string& topology_path,
    const std::string& node);

}  // namespace dcr::cli

#endif  // DCR_CLI_RELAY_OBJSTORE_H_
