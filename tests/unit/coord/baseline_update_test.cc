// When root.baseline may record a refit's target (DESIGN.md invariant 8):
// not when the COMMIT reached no relay of the commit set (fenced off, or
// lost).
#include "coord/baseline_update.h"

#include <gtest/gtest.h>

namespace dcr {
namespace {

const Version kUpdateTarget{2, Digest128{3, 4}};

NodeResult NodeAt(const std::string& node, NodeCode code,
                  Version v = kUpdateTarget) {
  NodeResult r;
  r.node = node;
  r.code = code;
  r.version = v;
  return r;
}

TEST(BaselineUpdateTest, OnlyACommitThatReachedNoOneKeepsTheBaseline) {
  const std::set<std::string> set = {"a", "b"};
  const Version other{1, Digest128{1, 1}};
  struct Case {
    const char* what;
    std::vector<NodeResult> replies;
    bool kept;
  } cases[] = {
      {"every node confirmed",
       {NodeAt("a", NodeCode::kOk), NodeAt("b", NodeCode::kOk)},
       false},
      {"one confirmed, one refused",
       {NodeAt("a", NodeCode::kRejected), NodeAt("b", NodeCode::kOk)},
       false},
      {"one confirmed, one lost",
       {NodeAt("a", NodeCode::kTimeout), NodeAt("b", NodeCode::kOk)},
       false},
      {"one ended the refit without it (prepared wait over), one lost",
       {NodeAt("a", NodeCode::kOk, other), NodeAt("b", NodeCode::kTimeout)},
       false},
      {"every node refused it (a stale epoch: fenced off)",
       {NodeAt("a", NodeCode::kRejected), NodeAt("b", NodeCode::kRejected)},
       true},
      {"dropped as stale, or lost: timeouts only",
       {NodeAt("a", NodeCode::kTimeout), NodeAt("b", NodeCode::kUnreachable)},
       true},
      {"no reply at all", {}, true},
      {"ok only from a node outside the commit set",
       {NodeAt("c", NodeCode::kOk)},
       true},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(CommitReachedNoOne(c.replies, set), c.kept) << c.what;
  }
}

}  // namespace
}  // namespace dcr
