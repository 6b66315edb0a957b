#include "protocol/plan_tree.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace dcr {
namespace {

// A plan from (name, parent) pairs; nodes[0] is the owner.
PlanMsg Plan(std::vector<std::pair<std::string, int32_t>> nodes) {
  PlanMsg p;
  for (auto& [name, parent] : nodes) {
    PlanNode n;
    n.name = name;
    n.parent = parent;
    p.nodes.push_back(n);
  }
  return p;
}

// name -> parent's name ("" for the owner and detached nodes), of the
// nodes reachable from the owner.
std::map<std::string, std::string> TreeShape(const PlanTree& t) {
  std::map<std::string, std::string> out;
  PlanMsg reach = SubPlan(t.plan, 0);
  for (const PlanNode& n : reach.nodes) {
    out[n.name] =
        n.parent < 0 ? "" : reach.nodes[static_cast<size_t>(n.parent)].name;
  }
  return out;
}

// root -> {a0 -> {a1, a2}, b0 -> {b1 -> {b2}}}
PlanMsg SampleTreePlan() {
  return Plan({{"root", -1},
               {"a0", 0},
               {"a1", 1},
               {"a2", 1},
               {"b0", 0},
               {"b1", 4},
               {"b2", 5}});
}

TEST(PlanTreeTest, CapacityIsThePlannedCountOrTheFanout) {
  struct Case {
    bool root;
    size_t index;
    size_t capacity;
  };
  // As the coordinator: its own capacity is its planned child count (2),
  // every relay's the largest relay fanout (a0 has 2).
  // As a relay: its own capacity is max(planned, fanout) too.
  for (Case c : {Case{true, 0, 2}, Case{true, 1, 2}, Case{true, 2, 2},
                 Case{true, 5, 2}, Case{false, 0, 2}, Case{false, 6, 2}}) {
    PlanTree t = PlanTree::Of(SampleTreePlan(), c.root);
    EXPECT_EQ(t.Capacity(c.index), c.capacity)
        << "root " << c.root << " index " << c.index;
  }
  // A root with 3 heads whose clusters are chains: relays hold 1 child.
  PlanTree chain = PlanTree::Of(
      Plan({{"r", -1}, {"a", 0}, {"b", 0}, {"c", 0}, {"a1", 1}}), true);
  EXPECT_EQ(chain.fanout, 1u);
  EXPECT_EQ(chain.Capacity(0), 3u);
  EXPECT_EQ(chain.Capacity(1), 1u);
  EXPECT_EQ(chain.Capacity(4), 1u);
  // The same plan at a relay: its own 3 children count as a fanout of 3.
  PlanTree relay = PlanTree::Of(
      Plan({{"r", -1}, {"a", 0}, {"b", 0}, {"c", 0}, {"a1", 1}}), false);
  EXPECT_EQ(relay.Capacity(4), 3u);
}

TEST(PlanTreeTest, ChildrenInPlanOrder) {
  PlanTree t = PlanTree::Of(SampleTreePlan(), true);
  EXPECT_EQ(t.Children(0), (std::vector<size_t>{1, 4}));
  EXPECT_EQ(t.Children(1), (std::vector<size_t>{2, 3}));
  EXPECT_EQ(t.Children(6), std::vector<size_t>{});
}

TEST(PlanTreeTest, FindHostIsBreadthFirstOverTheRootsInOrder) {
  PlanTree t = PlanTree::Of(SampleTreePlan(), true);  // relay capacity 2
  struct Case {
    std::vector<size_t> roots;
    std::optional<size_t> host;
  };
  for (const Case& c : {
           Case{{1}, 2},     // a0 is full (a1, a2): its first child
           Case{{4}, 4},     // b0 has one child: itself
           Case{{1, 4}, 4},  // a0 full, then b0 before a1
           Case{{2, 3}, 2},  // leaves have room
           Case{{}, std::nullopt},
       }) {
    EXPECT_EQ(t.FindHost(c.roots), c.host);
  }
  // A chain with fanout 1: every node is full but the last.
  PlanTree chain = PlanTree::Of(
      Plan({{"r", -1}, {"a", 0}, {"b", 1}, {"c", 2}, {"d", 3}}), false);
  EXPECT_EQ(chain.FindHost({1}), 4u);
  EXPECT_EQ(chain.FindHost({3}), 4u);
}

TEST(PlanTreeTest, MoveUnderKeepsOrderAndDetachesTheOriginal) {
  PlanTree t = PlanTree::Of(SampleTreePlan(), true);
  size_t moved = t.MoveUnder(5, 2);  // b1 (with b2) under a1
  EXPECT_EQ(moved, 7u);
  EXPECT_EQ(t.plan.nodes[5].parent, -1);
  EXPECT_EQ(t.plan.nodes[7].name, "b1");
  EXPECT_EQ(t.plan.nodes[8].name, "b2");
  EXPECT_EQ(t.plan.nodes[8].parent, 7);
  EXPECT_EQ(t.planned_children[7], 1u);
  EXPECT_EQ(t.planned_children[8], 0u);
  for (size_t i = 1; i < t.plan.nodes.size(); ++i) {
    EXPECT_LT(t.plan.nodes[i].parent, static_cast<int32_t>(i));
  }
  auto shape = TreeShape(t);
  EXPECT_EQ(shape["b1"], "a1");
  EXPECT_EQ(shape["b2"], "b1");
  EXPECT_EQ(shape["b0"], "root");
  EXPECT_EQ(shape.size(), 7u);  // the detached originals are in no subtree
}

TEST(PlanTreeTest, PlaceOrphansCoversEveryOutcome) {
  struct Case {
    std::string what;
    size_t free_slots;
    std::vector<size_t> live;
    std::vector<std::string> adopt;
    std::map<std::string, std::string> placed;  // orphan -> host
  };
  // a0 (index 1) failed: its orphans are a1 and a2. Relay capacity 2.
  for (const Case& c : {
           Case{
               "room for all: the owner adopts both", 2, {4}, {"a1", "a2"}, {}},
           Case{"one slot: a2 goes under the adopted a1",
                1,
                {4},
                {"a1"},
                {{"a2", "a1"}}},
           Case{"no slot: a1 goes under b0, a2 under b1 (b0 full)",
                0,
                {4},
                {},
                {{"a1", "b0"}, {"a2", "b1"}}},
           Case{"no slot and no live subtree: the owner adopts a1, a2 goes "
                "under it",
                0,
                {},
                {"a1"},
                {{"a2", "a1"}}},
       }) {
    PlanTree t = PlanTree::Of(SampleTreePlan(), true);
    OrphanPlacement p = PlaceOrphans(t, t.Children(1), c.free_slots, c.live);
    std::vector<std::string> adopt;
    for (size_t a : p.adopt) adopt.push_back(t.plan.nodes[a].name);
    std::map<std::string, std::string> placed;
    for (auto [moved, host] : p.placed) {
      placed[t.plan.nodes[moved].name] = t.plan.nodes[host].name;
      EXPECT_EQ(t.plan.nodes[moved].parent, static_cast<int32_t>(host));
    }
    EXPECT_EQ(adopt, c.adopt) << c.what;
    EXPECT_EQ(placed, c.placed) << c.what;
  }
}

// The root of a mixed tree: an orphan that must not get context-coded
// chunks goes only under a subtree that does not get them either, else the
// owner adopts it; `may_host` sees every candidate root.
TEST(PlanTreeTest, PlaceOrphansKeepsAnOrphanToTheRootsItMayGoUnder) {
  // a0 (index 1) failed; no free slot. b0's subtree takes context chunks,
  // a1 may not go there; a2 may.
  PlanTree t = PlanTree::Of(SampleTreePlan(), true);
  std::vector<std::pair<std::string, std::string>> asked;
  OrphanPlacement p =
      PlaceOrphans(t, t.Children(1), 0, {4}, [&](size_t o, size_t r) {
        asked.emplace_back(t.plan.nodes[o].name, t.plan.nodes[r].name);
        return t.plan.nodes[o].name != "a1";
      });
  ASSERT_EQ(p.adopt.size(), 1u);
  EXPECT_EQ(t.plan.nodes[p.adopt[0]].name, "a1");
  ASSERT_EQ(p.placed.size(), 1u);
  // a2 may go under the adopted a1 (first in breadth-first order).
  EXPECT_EQ(t.plan.nodes[p.placed[0].first].name, "a2");
  EXPECT_EQ(t.plan.nodes[p.placed[0].second].name, "a1");
  std::vector<std::pair<std::string, std::string>> want = {
      {"a1", "b0"}, {"a2", "a1"}, {"a2", "b0"}};
  EXPECT_EQ(asked, want);
  // Nobody allowed anywhere: the owner adopts all.
  PlanTree u = PlanTree::Of(SampleTreePlan(), true);
  OrphanPlacement q = PlaceOrphans(u, u.Children(1), 0, {4},
                                   [](size_t, size_t) { return false; });
  EXPECT_EQ(q.adopt.size(), 2u);
  EXPECT_TRUE(q.placed.empty());
}

TEST(PlanTreeTest, PlaceOrphansFillsEveryHostToCapacityOnly) {
  // Chains (fanout 1): each orphan goes one level deeper.
  PlanTree t = PlanTree::Of(
      Plan({{"r", -1}, {"x", 0}, {"x1", 1}, {"x2", 1}, {"x3", 1}, {"y", 0}}),
      true);
  t.fanout = 1;
  OrphanPlacement p = PlaceOrphans(t, t.Children(1), 0, {5});
  ASSERT_EQ(p.placed.size(), 3u);
  auto shape = TreeShape(t);
  EXPECT_EQ(shape["x1"], "y");
  EXPECT_EQ(shape["x2"], "x1");
  EXPECT_EQ(shape["x3"], "x2");
  // Nobody above its capacity of 1.
  for (size_t i : {size_t{5}, p.placed[0].first, p.placed[1].first}) {
    EXPECT_EQ(t.Children(i).size(), 1u) << t.plan.nodes[i].name;
  }
  EXPECT_TRUE(t.Children(p.placed[2].first).empty());
}

TEST(PlanTreeTest, MergePlanTakesOnlyNewReachableSubtrees) {
  // The owner a0 holds {a0 -> {a1, a2}}.
  PlanTree t = PlanTree::Of(Plan({{"a0", -1}, {"a1", 0}, {"a2", 0}}), false);
  // Its parent placed b1 (with b2) under a1 and c1 under a0 itself.
  PlanMsg incoming = Plan({{"a0", -1},
                           {"a1", 0},
                           {"a2", 0},
                           {"b1", 1},
                           {"b2", 3},
                           {"c1", 0},
                           {"a1", 0}});  // already held: ignored
  std::vector<size_t> tops = MergePlan(t, incoming);
  std::vector<std::string> names;
  for (size_t k : tops) names.push_back(t.plan.nodes[k].name);
  EXPECT_EQ(names, (std::vector<std::string>{"b1", "c1"}));
  auto shape = TreeShape(t);
  EXPECT_EQ(shape["b1"], "a1");
  EXPECT_EQ(shape["b2"], "b1");  // below a new node: no top of its own
  EXPECT_EQ(shape["c1"], "a0");
  EXPECT_FALSE(shape.contains("z"));
  EXPECT_EQ(t.planned_children[3], 1u);  // b1 brought one child
  // Merging the same plan again adds nothing.
  EXPECT_TRUE(MergePlan(t, incoming).empty());
}

TEST(PlanTreeTest, MergePlanIgnoresWhatItCannotReach) {
  // A plan rooted at another node: none of its nodes hang below the owner.
  PlanTree other = PlanTree::Of(Plan({{"a0", -1}, {"a1", 0}}), false);
  EXPECT_TRUE(
      MergePlan(other, Plan({{"x0", -1}, {"z", 0}, {"z1", 1}})).empty());
  EXPECT_EQ(other.plan.nodes.size(), 2u);
  PlanTree t = PlanTree::Of(Plan({{"a0", -1}}), false);
  PlanMsg bad = Plan({{"a0", -1}, {"x", -1}, {"y", 99}});
  EXPECT_TRUE(MergePlan(t, bad).empty());
  EXPECT_EQ(t.plan.nodes.size(), 1u);
}

TEST(PlanTreeTest, NearestEntryWalksUpToTheOwner) {
  PlanTree t = PlanTree::Of(SampleTreePlan(), true);
  auto entry_of = [](size_t x) -> std::optional<size_t> {
    if (x == 4) return 40;  // b0 has a link entry
    return std::nullopt;
  };
  EXPECT_EQ(t.NearestEntry(6, entry_of), 40u);           // b2 -> b1 -> b0
  EXPECT_EQ(t.NearestEntry(2, entry_of), std::nullopt);  // a1 -> a0 -> owner
  EXPECT_EQ(t.NearestEntry(0, entry_of), std::nullopt);
}

}  // namespace
}  // namespace dcr
