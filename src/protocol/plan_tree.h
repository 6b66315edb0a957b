// PlanTree: the tree a fan-out owner holds for its part of a refit (its
// plan's nodes, nodes[0] being the owner), and the placement rules it
// applies when it re-parents, as functions of that value alone: no links,
// no clocks, no logging. Fanout (protocol/fanout.h) calls them and acts on
// what they return; tests/unit/protocol/plan_tree_test.cc tables them.
//
// Invariants: every node comes after its parent (what SubPlan needs); a
// node detached by MoveUnder keeps its place with parent -1 and is in no
// subtree. planned_children[i] is node i's child count in the plan as it
// arrived (or, for nodes added later, in the plan that brought them).
//
// Thread safety: a value; no shared state.
#ifndef DCR_PROTOCOL_PLAN_TREE_H_
#define DCR_PROTOCOL_PLAN_TREE_H_

#include <cstddef>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "protocol/messages.h"

namespace dcr {

struct PlanTree {
  // `plan`: the owner's plan (nodes[0] = the owner). `root`: the owner is
  // the coordinator (its child count is the number of cluster heads, no
  // relay's fanout).
  static PlanTree Of(PlanMsg plan, bool root);

  PlanMsg plan;
  std::vector<size_t> planned_children;  // per node of plan.nodes
  size_t fanout = 1;  // the largest planned child count of a relay, >= 1
  bool root = false;

  // How many children node `index` may have: the larger of its planned
  // child count and `fanout` (the cluster fanout as the tree builder
  // applied it); the root's own is its planned child count.
  size_t Capacity(size_t index) const;
  // The current children of `index`, in plan order.
  std::vector<size_t> Children(size_t index) const;
  // The first node, breadth-first over the subtrees of `roots` (in that
  // order), with fewer current children than its capacity.
  std::optional<size_t> FindHost(const std::vector<size_t>& roots) const;
  // Moves the subtree of `index` under `host`: appended after the host's
  // position (so every node still follows its parent); the original is
  // detached. Returns the moved top's new index.
  size_t MoveUnder(size_t index, size_t host);
  // Walks from `index` up to, not including, the owner and returns the
  // first non-empty `entry_of(x)` (e.g. the owner's link entry for node x).
  template <typename EntryOf>
  std::optional<size_t> NearestEntry(size_t index, EntryOf entry_of) const {
    for (size_t x = index; x != 0;
         x = static_cast<size_t>(plan.nodes[x].parent)) {
      if (std::optional<size_t> e = entry_of(x)) return e;
    }
    return std::nullopt;
  }
};

// Where the orphans of a failed child go (Fanout::AdoptChildrenOf).
struct OrphanPlacement {
  std::vector<size_t> adopt;  // the owner adopts these itself
  // (orphan's new index, host): moved, with its subtree, under the host.
  std::vector<std::pair<size_t, size_t>> placed;
};

// Places `orphans` (children of a failed node, in plan order). The owner
// adopts the first `free_slots` itself; each other one goes under the
// first node with a free slot (PlanTree::FindHost) of the subtrees of the
// orphans adopted so far and then of `live` (the owner's live children
// whose subtree takes chunks); with no free slot anywhere the owner adopts
// it too. `may_host(orphan, root)`, if set, limits an orphan to the
// subtrees of the roots it allows (the root of a mixed tree: an orphan
// that must not get context-coded chunks goes only under a subtree that
// does not get them). Mutates `tree` (MoveUnder) for every placement.
OrphanPlacement PlaceOrphans(
    PlanTree& tree, const std::vector<size_t>& orphans, size_t free_slots,
    const std::vector<size_t>& live,
    const std::function<bool(size_t orphan, size_t root)>& may_host = nullptr);

// A PLAN for the owner from its parent may carry subtrees the parent placed
// under nodes of the owner's subtree. Appends to `tree` every node of
// `incoming` it lacks (by name) whose parent it holds, and returns the new
// index of the first node of each new subtree whose parent was already in
// the tree (a host). Nodes unreachable from the owner are ignored.
std::vector<size_t> MergePlan(PlanTree& tree, const PlanMsg& incoming);

}  // namespace dcr

#endif  // DCR_PROTOCOL_PLAN_TREE_H_
