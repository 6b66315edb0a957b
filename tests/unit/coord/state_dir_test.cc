// The coordinator's state directory: each file written and read back, the
// epoch through protocol/epoch_file.h, a missing file, a malformed one
// named in the error.
#include "coord/state_dir.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/file.h"
#include "testing/temp_dir.h"

namespace dcr {
namespace {

RefitId Id(uint8_t seed) {
  RefitId id;
  for (size_t i = 0; i < id.bytes.size(); ++i) id.bytes[i] = uint8_t(seed + i);
  return id;
}

CurrentRefit SomeCurrent() {
  CurrentRefit c;
  c.refit = Id(3);
  c.epoch = 12;
  c.mode = RefitMode::kFull;
  c.base = Version{4, Digest128{1, 2}};
  c.target = Version{5, Digest128{3, 4}};
  c.target_path = "/data/step5.safetensors";
  return c;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

class StateDirTest : public ::testing::Test {
 protected:
  StateDirTest() : state_(dir_.Path("state")) {
    EXPECT_TRUE(state_.Create().ok());
  }
  testing::TempDir dir_;
  StateDir state_;
};

TEST_F(StateDirTest, CreateMakesTheDecisionsDirectory) {
  EXPECT_TRUE(std::filesystem::is_directory(dir_.Path("state/decisions")));
  EXPECT_EQ(state_.HistoryDir(), dir_.Path("state") + "/history");
}

TEST_F(StateDirTest, EpochsIncreaseAndPersist) {
  auto a = state_.NextEpoch();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = StateDir(dir_.Path("state")).NextEpoch();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, *a + 1);
  auto text = ReadFileToString(state_.EpochPath());
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(std::stoull(*text), *b);
}

TEST_F(StateDirTest, CurrentRoundTrips) {
  EXPECT_FALSE(state_.HasCurrent());
  EXPECT_TRUE(state_.ReadCurrent().status().IsNotFound());
  for (RefitMode mode : {RefitMode::kFull, RefitMode::kDelta}) {
    CurrentRefit c = SomeCurrent();
    c.mode = mode;
    ASSERT_TRUE(state_.WriteCurrent(c).ok());
    EXPECT_TRUE(state_.HasCurrent());
    auto r = state_.ReadCurrent();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, c);
  }
  state_.RemoveCurrent();
  EXPECT_FALSE(state_.HasCurrent());
}

TEST_F(StateDirTest, MalformedCurrentIsCorruptionNamingTheFile) {
  for (const char* text :
       {"{", "[]", R"({"refit": "zz", "mode": "delta", "target_path": "x"})",
        R"({"mode": "delta", "target_path": "x"})"}) {
    Write(state_.CurrentPath(), text);
    Status s = state_.ReadCurrent().status();
    EXPECT_TRUE(s.IsCorruption()) << text << ": " << s.ToString();
    EXPECT_NE(s.message().find(state_.CurrentPath()), std::string::npos)
        << s.ToString();
  }
}

TEST_F(StateDirTest, DecisionRoundTrips) {
  Decision d;
  d.refit = Id(9);
  d.epoch = 3;
  d.commit = true;
  d.base = Version{1, Digest128{5, 6}};
  d.target = Version{2, Digest128{7, 8}};
  d.commit_set = {"a", "b", "c"};
  auto none = state_.ReadDecision(d.refit);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  ASSERT_TRUE(state_.WriteDecision(d).ok());
  EXPECT_TRUE(std::filesystem::exists(state_.DecisionPath(d.refit)));
  auto r = state_.ReadDecision(d.refit);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->has_value());
  EXPECT_TRUE((*r)->commit);
  EXPECT_EQ((*r)->commit_set, d.commit_set);
  // Another refit has no decision.
  auto other = state_.ReadDecision(Id(10));
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->has_value());
}

TEST_F(StateDirTest, MalformedDecisionIsCorruptionNamingTheFile) {
  Write(state_.DecisionPath(Id(1)), R"({"decision": "commit"})");
  Status s = state_.ReadDecision(Id(1)).status();
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find(state_.DecisionPath(Id(1))), std::string::npos);
}

TEST_F(StateDirTest, LastRefitIsTheReportsJson) {
  RefitReport r;
  r.refit = Id(4);
  r.epoch = 8;
  r.outcome = RefitOutcome::kPartial;
  r.reason = "excluded, now stale: n2";
  state_.WriteLastRefit(r);
  auto text = ReadFileToString(state_.LastRefitPath());
  ASSERT_TRUE(text.ok());
  auto j = nlohmann::json::parse(*text);
  EXPECT_EQ(j["refit"], Id(4).ToHex());
  EXPECT_EQ(j["epoch"], 8);
  EXPECT_EQ(j["outcome"], "committed-partial");
  EXPECT_EQ(j["reason"], "excluded, now stale: n2");
}

}  // namespace
}  // namespace dcr
