#include "coord/serving_ranks.h"

#include <fmt/format.h>

#include <map>
#include <utility>

#include "dcr/layout.h"

namespace dcr {

Result<ServingRanks> ServingRanks::Load(const Tree& tree,
                                        const Manifest& manifest) {
  ServingRanks out;
  std::map<std::string, std::shared_ptr<const Layout>> layouts;
  std::map<std::pair<std::string, uint32_t>, size_t> mapped;
  for (const TreeNode& n : tree.nodes) {
    if (!n.serving) continue;
    const ServingSpec& s = *n.serving;
    auto bad = [&](const std::string& what) {
      return Status::InvalidArgument(fmt::format(
          "node {} serves rank {} of {}: {}", n.name, s.rank, s.layout, what));
    };
    out.nodes_ += (out.nodes_.empty() ? "" : ", ") + n.name;
    auto& layout = layouts[s.layout];
    if (!layout) {
      auto loaded = LoadLayout(s.layout);
      if (!loaded.ok()) return bad(std::string(loaded.status().message()));
      layout = std::make_shared<const Layout>(*std::move(loaded));
    }
    if (mapped.count({s.layout, s.rank}) != 0) continue;
    auto map = ReceiverMap::Create(*layout, s.rank);
    if (!map.ok()) return bad(std::string(map.status().message()));
    auto canonical = map->CanonicalManifest();
    if (!canonical.ok()) return bad(std::string(canonical.status().message()));
    if (canonical->digest() != manifest.digest()) {
      return bad("its canonical tensors are not the checkpoint's: " +
                 Manifest::Difference(*canonical, manifest));
    }
    mapped[{s.layout, s.rank}] = out.ranks_.size();
    out.ranks_.push_back(
        Rank{std::make_shared<const ReceiverMap>(*std::move(map))});
  }
  return out;
}

Result<std::vector<ServingBits>> ServingRanks::Bits(const Checkpoint& canonical,
                                                    bool regions,
                                                    ThreadPool* pool) const {
  CanonicalBytes bytes;
  const Manifest& m = canonical.manifest();
  for (size_t i = 0; i < m.size(); ++i) {
    bytes.emplace(m[i].name, canonical.TensorData(i));
  }
  return Bits(bytes, regions, pool);
}

Result<std::vector<ServingBits>> ServingRanks::Bits(
    const WeightStore& canonical, bool regions, ThreadPool* pool) const {
  CanonicalBytes bytes;
  const Manifest& m = canonical.manifest();
  for (size_t i = 0; i < m.size(); ++i) {
    bytes.emplace(m[i].name, canonical.Tensor(i));
  }
  return Bits(bytes, regions, pool);
}

Result<std::vector<ServingBits>> ServingRanks::Bits(
    const CanonicalBytes& canonical, bool regions, ThreadPool* pool) const {
  std::vector<ServingBits> out(ranks_.size());
  std::vector<Status> errors(ranks_.size());
  // One rank per worker: each hashes the regions its rank holds.
  auto body = [&](size_t i, size_t /*worker*/) {
    const ReceiverMap& map = *ranks_[i].map;
    auto hashed = map.ExpectedRegions(canonical);
    if (!hashed.ok()) {
      errors[i] = hashed.status();
      return;
    }
    out[i].layout = map.fingerprint();
    out[i].rank = map.rank();
    out[i].bits = map.BitsDigest(*hashed);
    if (regions) out[i].regions = *std::move(hashed);
  };
  if (pool != nullptr) {
    pool->ParallelFor(ranks_.size(), body);
  } else {
    for (size_t i = 0; i < ranks_.size(); ++i) body(i, 0);
  }
  for (const Status& s : errors) DCR_RETURN_IF_ERROR(s);
  return out;
}

}  // namespace dcr
