#include "cli/relay_objstore.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <vector>

namespace dcr::cli {

Result<std::unique_ptr<ObjectStore>> OpenPullingHeadStore(
    const Topology& topo, const std::string& topology_path,
    const std::string& node) {
  if (!topo.objstore) return std::unique_ptr<ObjectStore>();
  DCR_ASSIGN_OR_RETURN(Tree tree, BuildTree(topo));
  const int i = tree.Find(node);
  if (i < 0 || !tree.nodes[static_cast<size_t>(i)].pulls_objects) {
    return std::unique_ptr<ObjectStore>();
  }
  Result<std::unique_ptr<ObjectStore>> store = OpenObjectStore(
      *topo.objstore,
      ObjectRequestLimits{.max_attempts = 1,
                          .connect_timeout = std::chrono::seconds(2),
                          .stall_timeout = std::chrono::seconds(2)});
  if (!store.ok()) {
    return store.status().WithContext(fmt::format(
        "{}: objstore (node '{}' heads a cluster with source: objstore)",
        topology_path, node));
  }
  Result<std::vector<std::byte>> probe =
      (*store)->Get(RefitObjectKey(std::string(32, '0'), 0));
  if (!probe.ok() && probe.status().IsInvalidArgument()) {
    return probe.status().WithContext(fmt::format(
        "{}: objstore: {} refuses node '{}' (it heads a cluster with "
        "source: objstore, and needs s3:GetObject and s3:ListBucket on the "
        "prefix: without ListBucket S3 answers a missing object 403, not "
        "404)",
        topology_path, (*store)->describe(), node));
  }
  if (!probe.ok() && !probe.status().IsNotFound()) {
    spdlog::warn("{}: the object store {} does not answer yet: {}", node,
                 (*store)->describe(), probe.status().ToString());
  }
  return store;
}

}  // namespace dcr::cli
