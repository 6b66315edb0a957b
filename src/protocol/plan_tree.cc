#include "protocol/plan_tree.h"

#include <algorithm>
#include <deque>
#include <map>
#include <string>

namespace dcr {

PlanTree PlanTree::Of(PlanMsg plan, bool root) {
  PlanTree t;
  t.plan = std::move(plan);
  t.root = root;
  t.planned_children.assign(t.plan.nodes.size(), 0);
  for (size_t i = 1; i < t.plan.nodes.size(); ++i) {
    t.planned_children[static_cast<size_t>(t.plan.nodes[i].parent)] += 1;
  }
  // The root's own child count (cluster heads) is no relay's fanout.
  for (size_t i = root ? 1 : 0; i < t.plan.nodes.size(); ++i) {
    t.fanout = std::max(t.fanout, t.planned_children[i]);
  }
  return t;
}

size_t PlanTree::Capacity(size_t index) const {
  if (index == 0 && root) return planned_children[0];
  return std::max(planned_children[index], fanout);
}

std::vector<size_t> PlanTree::Children(size_t index) const {
  std::vector<size_t> out;
  for (size_t k = index + 1; k < plan.nodes.size(); ++k) {
    if (plan.nodes[k].parent == static_cast<int32_t>(index)) out.push_back(k);
  }
  return out;
}

std::optional<size_t> PlanTree::FindHost(
    const std::vector<size_t>& roots) const {
  std::vector<std::vector<size_t>> kids(plan.nodes.size());
  for (size_t k = 1; k < plan.nodes.size(); ++k) {
    if (plan.nodes[k].parent >= 0) {
      kids[static_cast<size_t>(plan.nodes[k].parent)].push_back(k);
    }
  }
  std::deque<size_t> queue(roots.begin(), roots.end());
  while (!queue.empty()) {
    size_t x = queue.front();
    queue.pop_front();
    if (kids[x].size() < Capacity(x)) return x;
    queue.insert(queue.end(), kids[x].begin(), kids[x].end());
  }
  return std::nullopt;
}

size_t PlanTree::MoveUnder(size_t index, size_t host) {
  PlanMsg sub = SubPlan(plan, index);
  size_t base = plan.nodes.size();
  for (size_t k = 0; k < sub.nodes.size(); ++k) {
    PlanNode n = sub.nodes[k];
    n.parent = k == 0 ? static_cast<int32_t>(host)
                      : static_cast<int32_t>(base) + n.parent;
    plan.nodes.push_back(std::move(n));
    planned_children.push_back(static_cast<size_t>(std::count_if(
        sub.nodes.begin(), sub.nodes.end(), [&](const PlanNode& m) {
          return m.parent == static_cast<int32_t>(k);
        })));
  }
  plan.nodes[index].parent = -1;
  return base;
}

OrphanPlacement PlaceOrphans(
    PlanTree& tree, const std::vector<size_t>& orphans, size_t free_slots,
    const std::vector<size_t>& live,
    const std::function<bool(size_t orphan, size_t root)>& may_host) {
  OrphanPlacement out;
  for (size_t o : orphans) {
    if (out.adopt.size() < free_slots) {
      out.adopt.push_back(o);
      continue;
    }
    std::vector<size_t> roots = out.adopt;
    roots.insert(roots.end(), live.begin(), live.end());
    if (may_host) {
      std::erase_if(roots, [&](size_t r) { return !may_host(o, r); });
    }
    std::optional<size_t> host = tree.FindHost(roots);
    if (!host) {
      out.adopt.push_back(o);  // no free slot anywhere: the owner's
      continue;
    }
    out.placed.emplace_back(tree.MoveUnder(o, *host), *host);
  }
  return out;
}

std::vector<size_t> MergePlan(PlanTree& tree, const PlanMsg& incoming) {
  std::vector<PlanNode>& nodes = tree.plan.nodes;
  // The tree as it is: the nodes reachable from nodes[0], by name.
  std::map<std::string, size_t> index{{nodes[0].name, 0}};
  for (size_t k = 1; k < nodes.size(); ++k) {
    int32_t p = nodes[k].parent;
    if (p < 0) continue;
    auto parent = index.find(nodes[static_cast<size_t>(p)].name);
    if (parent != index.end() && parent->second == static_cast<size_t>(p)) {
      index[nodes[k].name] = k;
    }
  }
  std::vector<size_t> tops;
  size_t first_new = nodes.size();
  for (size_t i = 1; i < incoming.nodes.size(); ++i) {
    const PlanNode& n = incoming.nodes[i];
    if (index.contains(n.name) || n.parent < 0 ||
        static_cast<size_t>(n.parent) >= incoming.nodes.size()) {
      continue;
    }
    auto parent =
        index.find(incoming.nodes[static_cast<size_t>(n.parent)].name);
    if (parent == index.end()) continue;  // parents come first: not reached
    PlanNode copy = n;
    copy.parent = static_cast<int32_t>(parent->second);
    nodes.push_back(std::move(copy));
    tree.planned_children.push_back(static_cast<size_t>(std::count_if(
        incoming.nodes.begin(), incoming.nodes.end(), [&](const PlanNode& m) {
          return m.parent == static_cast<int32_t>(i);
        })));
    index[n.name] = nodes.size() - 1;
    if (parent->second < first_new) tops.push_back(nodes.size() - 1);
  }
  return tops;
}

}  // namespace dcr
