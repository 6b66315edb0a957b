// What a relay's topology says about it (dcr-relay --topology): the store
// its node names, and what the tree allows it: plans only from its
// ancestors, connections only from the topology's hosts, and the kind of
// link it listens on.
//
// Thread safety: functions of their arguments.
#ifndef DCR_CLI_RELAY_TOPOLOGY_H_
#define DCR_CLI_RELAY_TOPOLOGY_H_

#include <string>
#include <vector>

#include "dcr/status.h"
#include "dcr/store.h"
#include "dcr/topology.h"
#include "relay/relay.h"

namespace dcr {

// What the topology's tree says about this node: plans only from its
// ancestors; connections only from the topology's hosts (resolved now) and
// `extra`; it listens on the kind of the link into it.
Status UseTree(const Topology& topo, const std::vector<std::string>& extra,
               RelayOptions* o);

// The store spec of a topology store location (shm names get their "/").
StoreSpec FromTopology(const StoreLocation& s);

}  // namespace dcr

#endif  // DCR_CLI_RELAY_TOPOLOGY_H_
