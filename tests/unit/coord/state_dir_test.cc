// The coordinator's state directory: each file written and read back, the
// epoch through protocol/epoch_file.h, a missing file, a malformed one
// named in the error.
#include "coord/state_dir.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/file.h"
#include "testing/temp_dir.h"
#include "testing/test_util.h"

namespace dcr {
namespace {

using testing::TestRefitId;

CurrentRefit SomeCurrent() {
  CurrentRefit c;
  c.refit = TestRefitId(3);
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

// What builds wrote before "format" existed: format 1, with the XXH3
// digests of earlier builds.
constexpr const char* kOldCurrent = R"({
  "base": {"digest": "00000000000000010000000000000002", "step": 4},
  "epoch": 12,
  "mode": "delta",
  "refit": "030405060708090a0b0c0d0e0f101112",
  "started_at": "2026-11-30T10:00:00Z",
  "target": {"digest": "00000000000000030000000000000004", "step": 5},
  "target_path": "/data/step5.safetensors"
}
)";

// The same refit as this build writes it: format 2, linear digests.
nlohmann::json Current() {
  nlohmann::json j = nlohmann::json::parse(kOldCurrent);
  j["format"] = 2;
  return j;
}

TEST_F(StateDirTest, CurrentOfFormatTwoReads) {
  Write(state_.CurrentPath(), Current().dump());
  auto r = state_.ReadCurrent();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  CurrentRefit want = SomeCurrent();
  want.mode = RefitMode::kDelta;
  EXPECT_EQ(*r, want);
  // And what this build writes says so.
  ASSERT_TRUE(state_.WriteCurrent(want).ok());
  auto j = nlohmann::json::parse(*ReadFileToString(state_.CurrentPath()));
  EXPECT_EQ(j["format"], 2);
}

// Format 1 (with or without the field) names versions by digests this build
// does not compute: refused, saying what to do.
TEST_F(StateDirTest, ACurrentOfTheEarlierDigestsIsRefused) {
  for (int with_field = 0; with_field < 2; ++with_field) {
    nlohmann::json j = nlohmann::json::parse(kOldCurrent);
    if (with_field) j["format"] = 1;
    Write(state_.CurrentPath(), j.dump());
    Status s = state_.ReadCurrent().status();
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
    EXPECT_NE(s.message().find(state_.CurrentPath()), std::string::npos);
    EXPECT_NE(s.message().find("XXH3 digests of an earlier dcr"),
              std::string::npos)
        << s.ToString();
    EXPECT_NE(s.message().find("dcr refit --resume"), std::string::npos);
  }
}

// Each defect of current.json: the error names the file and the field.
TEST_F(StateDirTest, EachMalformedCurrentFieldIsNamed) {
  const nlohmann::json good = Current();
  struct Case {
    std::string field;
    std::function<void(nlohmann::json&)> spoil;
  };
  const std::vector<Case> cases = {
      {"refit", [](auto& j) { j.erase("refit"); }},
      {"refit", [](auto& j) { j["refit"] = "xyz"; }},
      {"epoch", [](auto& j) { j["epoch"] = "12"; }},
      {"epoch", [](auto& j) { j["epoch"] = -1; }},
      {"mode", [](auto& j) { j["mode"] = "sparse"; }},
      {"mode", [](auto& j) { j["mode"] = 1; }},
      {"base", [](auto& j) { j["base"] = 4; }},
      {"base.step", [](auto& j) { j["base"].erase("step"); }},
      {"target.digest", [](auto& j) { j["target"]["digest"] = "00"; }},
      {"target.extra", [](auto& j) { j["target"]["extra"] = 1; }},
      {"target_path", [](auto& j) { j["target_path"] = nullptr; }},
      {"started_at", [](auto& j) { j.erase("started_at"); }},
      {"comment", [](auto& j) { j["comment"] = "hello"; }},
      {"format", [](auto& j) { j["format"] = "2"; }},
      {"format", [](auto& j) { j["format"] = 0; }},
  };
  for (const Case& c : cases) {
    nlohmann::json j = good;
    c.spoil(j);
    Write(state_.CurrentPath(), j.dump());
    Status s = state_.ReadCurrent().status();
    EXPECT_TRUE(s.IsCorruption()) << j.dump() << ": " << s.ToString();
    EXPECT_NE(s.message().find(state_.CurrentPath()), std::string::npos)
        << s.ToString();
    EXPECT_NE(s.message().find("field '" + c.field + "'"), std::string::npos)
        << c.field << ": " << s.ToString();
  }
}

TEST_F(StateDirTest, AnUnknownModeIsRefusedNotReadAsDelta) {
  nlohmann::json j = Current();
  j["mode"] = "Full";
  Write(state_.CurrentPath(), j.dump());
  Status s = state_.ReadCurrent().status();
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("unknown mode 'Full'"), std::string::npos)
      << s.ToString();
}

TEST_F(StateDirTest, ANewerFormatIsUnsupported) {
  nlohmann::json j = Current();
  j["format"] = 3;
  Write(state_.CurrentPath(), j.dump());
  Status s = state_.ReadCurrent().status();
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
  EXPECT_NE(s.message().find("field 'format'"), std::string::npos);
}

TEST_F(StateDirTest, DuplicateKeysAreRefused) {
  std::string text = kOldCurrent;
  text.insert(text.find('{') + 1, R"("epoch": 99,)");
  Write(state_.CurrentPath(), text);
  Status s = state_.ReadCurrent().status();
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find("'epoch' appears twice"), std::string::npos)
      << s.ToString();
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
  d.refit = TestRefitId(9);
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
  auto other = state_.ReadDecision(TestRefitId(10));
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->has_value());
}

TEST_F(StateDirTest, MalformedDecisionIsCorruptionNamingTheFile) {
  Write(state_.DecisionPath(TestRefitId(1)), R"({"decision": "commit"})");
  Status s = state_.ReadDecision(TestRefitId(1)).status();
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  EXPECT_NE(s.message().find(state_.DecisionPath(TestRefitId(1))),
            std::string::npos);
}

nlohmann::json OldDecision(const RefitId& id) {
  return {{"refit", id.ToHex()},
          {"epoch", 3},
          {"decision", "commit"},
          {"base", {{"step", 1}, {"digest", Digest128{5, 6}.ToHex()}}},
          {"target", {{"step", 2}, {"digest", Digest128{7, 8}.ToHex()}}},
          {"commit_set", {"b", "a"}},
          {"decided_at", "2026-11-30T10:00:00Z"}};
}

TEST_F(StateDirTest, ADecisionOfTheEarlierDigestsIsRefused) {
  Write(state_.DecisionPath(TestRefitId(2)),
        OldDecision(TestRefitId(2)).dump(2));
  Status s = state_.ReadDecision(TestRefitId(2)).status();
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
  EXPECT_NE(s.message().find("XXH3 digests of an earlier dcr"),
            std::string::npos)
      << s.ToString();
}

TEST_F(StateDirTest, DecisionOfFormatTwoReads) {
  nlohmann::json d = OldDecision(TestRefitId(2));
  d["format"] = 2;
  Write(state_.DecisionPath(TestRefitId(2)), d.dump(2));
  auto r = state_.ReadDecision(TestRefitId(2));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->has_value());
  EXPECT_TRUE((*r)->commit);
  EXPECT_EQ((*r)->epoch, 3u);
  EXPECT_EQ((*r)->target.step, 2u);
  EXPECT_EQ((*r)->commit_set, (std::vector<std::string>{"a", "b"}));
}

TEST_F(StateDirTest, EachMalformedDecisionFieldIsNamed) {
  struct Case {
    std::string field;
    std::function<void(nlohmann::json&)> spoil;
  };
  const std::vector<Case> cases = {
      {"decision", [](auto& j) { j["decision"] = "maybe"; }},
      {"decision", [](auto& j) { j.erase("decision"); }},
      {"commit_set", [](auto& j) { j["commit_set"] = "a"; }},
      {"commit_set[1]", [](auto& j) { j["commit_set"][1] = 7; }},
      {"refit", [](auto& j) { j["refit"] = TestRefitId(3).ToHex(); }},
      {"epoch", [](auto& j) { j.erase("epoch"); }},
      {"base.digest", [](auto& j) { j["base"]["digest"] = 5; }},
      {"decided_at", [](auto& j) { j["decided_at"] = 0; }},
      {"why", [](auto& j) { j["why"] = "because"; }},
  };
  const std::string path = state_.DecisionPath(TestRefitId(2));
  for (const Case& c : cases) {
    nlohmann::json j = OldDecision(TestRefitId(2));
    j["format"] = 2;
    c.spoil(j);
    Write(path, j.dump());
    Status s = state_.ReadDecision(TestRefitId(2)).status();
    EXPECT_TRUE(s.IsCorruption()) << j.dump() << ": " << s.ToString();
    EXPECT_NE(s.message().find(path), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("field '" + c.field + "'"), std::string::npos)
        << c.field << ": " << s.ToString();
  }
}

// decisions/ keeps the newest kDecisionsKept refits by epoch, the one
// current.json names, and whatever it cannot read or does not know.
TEST_F(StateDirTest, DecisionRetention) {
  for (uint8_t i = 1; i <= 40; ++i) {
    Decision d;
    d.refit = TestRefitId(i);
    d.epoch = 100 + i;
    d.commit = true;
    ASSERT_TRUE(state_.WriteDecision(d).ok());
  }
  CurrentRefit c = SomeCurrent();
  c.refit = TestRefitId(2);  // an old refit, still unfinished
  ASSERT_TRUE(state_.WriteCurrent(c).ok());
  Write(state_.DecisionPath(TestRefitId(200)), "{torn");
  Write(dir_.Path("state/decisions/NOTES.txt"), "mine");
  ASSERT_TRUE(state_.PruneDecisions(32).ok());
  for (uint8_t i = 1; i <= 40; ++i) {
    bool kept = i > 8 || i == 2;
    EXPECT_EQ(std::filesystem::exists(state_.DecisionPath(TestRefitId(i))),
              kept)
        << int(i);
  }
  EXPECT_TRUE(std::filesystem::exists(state_.DecisionPath(TestRefitId(200))));
  EXPECT_TRUE(std::filesystem::exists(dir_.Path("state/decisions/NOTES.txt")));
  // Without current.json its refit goes too.
  state_.RemoveCurrent();
  ASSERT_TRUE(state_.PruneDecisions(32).ok());
  EXPECT_FALSE(std::filesystem::exists(state_.DecisionPath(TestRefitId(2))));
  EXPECT_TRUE(std::filesystem::exists(state_.DecisionPath(TestRefitId(9))));
  ASSERT_TRUE(state_.PruneDecisions(1).ok());
  EXPECT_TRUE(std::filesystem::exists(state_.DecisionPath(TestRefitId(40))));
  EXPECT_FALSE(std::filesystem::exists(state_.DecisionPath(TestRefitId(39))));
}

TEST_F(StateDirTest, LastRefitIsTheReportsJson) {
  RefitReport r;
  r.refit = TestRefitId(4);
  r.epoch = 8;
  r.outcome = RefitOutcome::kPartial;
  r.reason = "excluded, now stale: n2";
  state_.WriteReport(&r);
  auto text = ReadFileToString(state_.LastRefitPath());
  ASSERT_TRUE(text.ok());
  auto j = nlohmann::json::parse(*text);
  EXPECT_EQ(j["refit"], TestRefitId(4).ToHex());
  EXPECT_EQ(j["epoch"], 8);
  EXPECT_EQ(j["outcome"], "committed-partial");
  EXPECT_EQ(j["reason"], "excluded, now stale: n2");
  EXPECT_EQ(j["format"], 2);
}

RefitReport FullReport() {
  RefitReport r;
  r.refit = TestRefitId(4);
  r.epoch = 8;
  r.mode = RefitMode::kFull;
  r.outcome = RefitOutcome::kPartial;
  r.reason = "excluded, now stale: a (timeout at vote)";
  r.base = Version{1, Digest128{1, 2}};
  r.target = Version{2, Digest128{3, 4}};
  r.checkpoint_bytes = 1000;
  r.total_elements = 500;
  r.changed_elements = 20;
  r.chunks = 4;
  r.payload_bytes = 300;
  r.stream_bytes = 350;
  r.repair_rounds = 1;
  r.repair_chunks = 2;
  r.adoptions = 1;
  r.link_class_bytes = {{"lan", 350}, {"wan", 350}};
  r.plan_seconds = 0.25;
  r.total_seconds = 2.5;
  r.nodes = {
      NodeOutcome{"a", "c", false, NodeCode::kTimeout, "vote", "late", 3},
      NodeOutcome{"b", "c", true, NodeCode::kOk, "", "", 4}};
  CatchUpReport c;
  c.refit = TestRefitId(5);
  c.epoch = 9;
  c.nodes = {"d"};
  c.method = "dense";
  c.chunks = 6;
  c.seconds = 0.5;
  c.outcome = RefitOutcome::kCommitted;
  r.catch_up = {c};
  return r;
}

TEST_F(StateDirTest, LastRefitRoundTrips) {
  EXPECT_TRUE(state_.ReadLastRefit().status().IsNotFound());
  RefitReport r = FullReport();
  state_.WriteReport(&r);
  EXPECT_EQ(r.ended_at.size(), 20u) << r.ended_at;  // 2026-12-04T21:00:00Z
  auto back = state_.ReadLastRefit();
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  // The same report, as its JSON says.
  EXPECT_EQ(back->ToJson(), r.ToJson());
  EXPECT_EQ(back->nodes[0].code, NodeCode::kTimeout);
  EXPECT_EQ(back->catch_up[0].refit, TestRefitId(5));
  // Written by an older build (no "format"): format 1.
  Write(state_.LastRefitPath(), r.ToJson());
  EXPECT_TRUE(state_.ReadLastRefit().ok());
}

TEST_F(StateDirTest, ReportsKeepTheNewestInEpochOrder) {
  auto none = state_.ReadReports();
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none->empty());  // no reports/ yet
  for (uint64_t epoch : {3, 1, 12, 2}) {
    RefitReport r = FullReport();
    r.epoch = epoch;
    r.refit = TestRefitId(static_cast<uint8_t>(epoch));
    r.target.step = epoch * 10;
    state_.WriteReport(&r);
  }
  // Not reports: left alone and not listed.
  Write(state_.ReportsDir() + "/NOTES.txt", "mine");
  Write(state_.ReportsDir() + "/000000000007-xyz.json", "{}");
  auto all = state_.ReadReports();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 4u);
  std::vector<uint64_t> epochs;
  for (const ReportFile& f : *all) {
    ASSERT_TRUE(f.report.ok()) << f.report.status().ToString();
    epochs.push_back(f.report->epoch);
    EXPECT_EQ(f.report->target.step, f.report->epoch * 10);
    EXPECT_FALSE(f.report->ended_at.empty());
  }
  EXPECT_EQ(epochs, (std::vector<uint64_t>{1, 2, 3, 12}));
  auto last2 = state_.ReadReports(2);
  ASSERT_TRUE(last2.ok());
  ASSERT_EQ(last2->size(), 2u);
  EXPECT_EQ((*last2)[0].report->epoch, 3u);
  EXPECT_EQ((*last2)[1].report->epoch, 12u);

  // A damaged report is listed with its error, naming file and field.
  Write((*all)[1].path, R"({"format": 2, "refit": 7})");
  auto damaged = state_.ReadReports();
  ASSERT_TRUE(damaged.ok());
  ASSERT_FALSE((*damaged)[1].report.ok());
  EXPECT_TRUE((*damaged)[1].report.status().IsCorruption());
  EXPECT_NE((*damaged)[1].report.status().message().find((*all)[1].path),
            std::string::npos);

  // Pruning keeps the newest by epoch; other files stay.
  ASSERT_TRUE(state_.PruneReports(3).ok());
  auto kept = state_.ReadReports();
  ASSERT_TRUE(kept.ok());
  ASSERT_EQ(kept->size(), 3u);
  EXPECT_EQ((*kept)[0].path, (*all)[1].path);
  EXPECT_TRUE(std::filesystem::exists(state_.ReportsDir() + "/NOTES.txt"));
}

TEST_F(StateDirTest, WritingAReportPrunesBeyondTheLimit) {
  std::filesystem::create_directories(state_.ReportsDir());
  for (uint64_t epoch = 1; epoch <= kReportsKept; ++epoch) {
    Write(fmt::format("{}/{:012}-{}.json", state_.ReportsDir(), epoch,
                      TestRefitId(1).ToHex()),
          "{}");
  }
  RefitReport r = FullReport();
  r.epoch = kReportsKept + 1;
  state_.WriteReport(&r);
  auto all = state_.ReadReports();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), kReportsKept);
  EXPECT_NE(all->front().path.find(fmt::format("/{:012}-", 2)),
            std::string::npos);
  ASSERT_TRUE(all->back().report.ok());
  EXPECT_EQ(all->back().report->epoch, kReportsKept + 1);
}

TEST_F(StateDirTest, EachMalformedLastRefitFieldIsNamed) {
  const nlohmann::json good = nlohmann::json::parse(FullReport().ToJson());
  struct Case {
    std::string field;
    std::function<void(nlohmann::json&)> spoil;
  };
  const std::vector<Case> cases = {
      {"outcome", [](auto& j) { j["outcome"] = "won"; }},
      {"mode", [](auto& j) { j["mode"] = "partial"; }},
      {"chunks", [](auto& j) { j.erase("chunks"); }},
      {"seconds.total", [](auto& j) { j["seconds"]["total"] = "2"; }},
      {"link_class_bytes.moon",
       [](auto& j) { j["link_class_bytes"]["moon"] = 1; }},
      {"nodes[1].code", [](auto& j) { j["nodes"][1]["code"] = "fine"; }},
      {"nodes[0].extra", [](auto& j) { j["nodes"][0]["extra"] = 1; }},
      {"catch_up[0].method", [](auto& j) { j["catch_up"][0]["method"] = "x"; }},
      {"catch_up[0].from.step",
       [](auto& j) { j["catch_up"][0]["from"]["step"] = -2; }},
      {"unknown", [](auto& j) { j["unknown"] = true; }},
  };
  for (const Case& c : cases) {
    nlohmann::json j = good;
    c.spoil(j);
    Write(state_.LastRefitPath(), j.dump());
    Status s = state_.ReadLastRefit().status();
    EXPECT_TRUE(s.IsCorruption()) << j.dump() << ": " << s.ToString();
    EXPECT_NE(s.message().find(state_.LastRefitPath()), std::string::npos);
    EXPECT_NE(s.message().find("field '" + c.field + "'"), std::string::npos)
        << c.field << ": " << s.ToString();
  }
}

}  // namespace
}  // namespace dcr
