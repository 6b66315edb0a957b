#include "cli/relay_topology.h"

#include <netdb.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <set>

namespace dcr {

Status UseTree(const Topology& topo, const std::vector<std::string>& extra,
               RelayOptions* o) {
  DCR_ASSIGN_OR_RETURN(Tree tree, BuildTree(topo));
  int self = tree.Find(o->name);
  // It listens on the kind of the link into it (topology `transport`).
  if (self > 0) {
    o->transport = std::string(
        TransportKindName(tree.nodes[static_cast<size_t>(self)].transport));
  }
  for (int i : tree.PathToRoot(self)) {
    if (i != self) o->plan_senders.push_back(tree.nodes[i].name);
  }
  // A HELLO must name one of the tree's nodes (a CLI client names none).
  for (const auto& n : tree.nodes) o->known_nodes.push_back(n.name);
  std::set<std::string> hosts(extra.begin(), extra.end());
  hosts.insert(topo.root.host);
  for (const ClusterSpec& c : topo.clusters) {
    for (const NodeSpec& n : c.nodes) hosts.insert(n.host);
  }
  std::set<std::string> addresses(extra.begin(), extra.end());
  for (const std::string& h : hosts) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (getaddrinfo(h.c_str(), nullptr, &hints, &res) != 0) {
      spdlog::warn(
          "{}: cannot resolve topology host '{}'; connections from "
          "it will be refused",
          o->name, h);
      continue;
    }
    for (addrinfo* p = res; p != nullptr; p = p->ai_next) {
      char buf[INET6_ADDRSTRLEN] = {};
      if (getnameinfo(p->ai_addr, p->ai_addrlen, buf, sizeof buf, nullptr, 0,
                      NI_NUMERICHOST) == 0) {
        addresses.insert(buf);
      }
    }
    freeaddrinfo(res);
  }
  o->peer_addresses.assign(addresses.begin(), addresses.end());
  return Status::OK();
}

StoreSpec FromTopology(const StoreLocation& s) {
  StoreSpec spec;
  spec.kind = s.kind == StoreKind::kFile  ? StoreSpec::Kind::kFile
              : s.kind == StoreKind::kShm ? StoreSpec::Kind::kShm
                                          : StoreSpec::Kind::kMemory;
  spec.path = s.path;
  if (spec.kind == StoreSpec::Kind::kShm && !spec.path.starts_with('/')) {
    spec.path = "/" + spec.path;
  }
  return spec;
}

}  // namespace dcr
