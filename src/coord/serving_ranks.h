// The serving ranks of a relay tree (docs/PLACEMENT.md §"Serving relays"):
// the nodes whose topology names a serving layout and rank keep that
// rank's shards, and the root names their bits at the base (in PLAN) and
// at the target (in PLAN or END) for their votes.
//
// Thread safety: a ServingRanks is immutable after Load; Bits may be
// called from one thread at a time (it runs on `pool`).
#ifndef DCR_COORD_SERVING_RANKS_H_
#define DCR_COORD_SERVING_RANKS_H_

#include <memory>
#include <string>
#include <vector>

#include "dcr/checkpoint.h"
#include "dcr/receiver_map.h"
#include "dcr/store.h"
#include "dcr/thread_pool.h"
#include "dcr/topology.h"
#include "protocol/messages.h"

namespace dcr {

class ServingRanks {
 public:
  ServingRanks() = default;
  // Reads each serving layout of `tree`'s nodes once and maps each
  // (layout, rank) once. InvalidArgument naming the node and the layout
  // file if the file cannot be read or parsed, the rank is not below the
  // layout's ranks, the layout holds a converted tensor, or its canonical
  // tensors are not `manifest`'s (what the refit carries).
  static Result<ServingRanks> Load(const Tree& tree, const Manifest& manifest);

  bool empty() const { return ranks_.empty(); }
  // Distinct (layout, rank)s: the entries of each list the root sends.
  size_t size() const { return ranks_.size(); }
  // The serving nodes, for messages ("a1, a2").
  const std::string& nodes() const { return nodes_; }

  // Every rank's bits of `canonical` (a checkpoint or root.baseline, of
  // the manifest Load checked): with `regions`, a target's (each
  // tensor's region digest too), else a base's.
  Result<std::vector<ServingBits>> Bits(const Checkpoint& canonical,
                                        bool regions, ThreadPool* pool) const;
  Result<std::vector<ServingBits>> Bits(const WeightStore& canonical,
                                        bool regions, ThreadPool* pool) const;

 private:
  struct Rank {
    std::shared_ptr<const ReceiverMap> map;
  };
  Result<std::vector<ServingBits>> Bits(const CanonicalBytes& canonical,
                                        bool regions, ThreadPool* pool) const;

  std::vector<Rank> ranks_;
  std::string nodes_;
};

}  // namespace dcr

#endif  // DCR_COORD_SERVING_RANKS_H_
