#include "common/failpoint.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"

namespace dcr {
namespace {

constexpr FailpointId kVote = FailpointIdOf("relay.vote");
constexpr FailpointId kForward = FailpointIdOf("relay.forward");
constexpr FailpointId kApply = FailpointIdOf("relay.apply_chunk");
constexpr FailpointId kBeforeCommit = FailpointIdOf("coord.before_commit");

constexpr bool NamesAreUnique() {
  for (size_t i = 0; i < kFailpoints.size(); ++i) {
    for (size_t k = i + 1; k < kFailpoints.size(); ++k) {
      if (kFailpoints[i].name == kFailpoints[k].name) return false;
    }
  }
  return true;
}
static_assert(NamesAreUnique());
static_assert(static_cast<size_t>(FailpointIdOf("relay.loop")) ==
              kFailpoints.size() - 1);

class FailpointTest : public ::testing::Test {
 protected:
  void TearDown() override {
    DisarmFailpoints();
    ::unsetenv("DCR_FAILPOINTS");
  }
};

TEST_F(FailpointTest, DisarmedPointsDoNothingAndCountNothing) {
  EXPECT_FALSE(failpoint_internal::armed.load());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(DCR_FAILPOINT("relay.forward").action, FailAction::kNone);
  }
  EXPECT_EQ(TEST_FailpointHits(kForward), 0u);
}

TEST_F(FailpointTest, GoodSpecsArm) {
  for (const char* spec :
       {"relay.vote=exit", "relay.vote=hang@2", "relay.forward=cut(0)",
        " relay.forward = drop@3 ; relay.apply_chunk=corrupt(7);",
        "relay.apply_chunk=corrupt;relay.apply_chunk=delay(0)@1",
        "coord.before_commit=delay(3600000)", "relay.plan=drop",
        "relay.commit=drop;relay.abort=exit@18446744073709551615",
        "store.data_sync=wait(/tmp/dcr go-ahead)@2"}) {
    SCOPED_TRACE(spec);
    ASSERT_TRUE(ArmFailpoints(spec).ok()) << ArmFailpoints(spec).ToString();
    EXPECT_TRUE(failpoint_internal::armed.load());
  }
  // Nothing to arm: disarmed.
  for (const char* spec : {"", " ; ;"}) {
    ASSERT_TRUE(ArmFailpoints(spec).ok());
    EXPECT_FALSE(failpoint_internal::armed.load());
  }
}

TEST_F(FailpointTest, BadSpecsAreRefusedWithOneLineMessages) {
  const std::string known =
      "relay.plan, relay.apply_chunk, relay.forward, relay.vote, "
      "relay.commit, relay.abort, coord.before_plan, coord.after_stream, "
      "coord.before_commit, coord.after_commit, coord.baseline_write, "
      "store.data_sync, coord.upload, producer.send_chunk, relay.loop";
  const std::string actions =
      "exit, hang, drop, delay(MS), wait(PATH), corrupt, cut(BYTES), forge";
  const std::pair<std::string, std::string> cases[] = {
      {"relay.vote",
       "'relay.vote' is not POINT=ACTION[@N] (e.g. relay.vote=exit@2)"},
      {"relay.vot=exit",
       "unknown failpoint 'relay.vot' in 'relay.vot=exit' (known: " + known +
           ")"},
      {"relay.vote=explode",
       "unknown action 'explode' in "
       "'relay.vote=explode' (actions: " +
           actions + ")"},
      {"relay.vote=", "no action in 'relay.vote=' (actions: " + actions + ")"},
      {"relay.vote=corrupt",
       "relay.vote does not take corrupt in 'relay.vote=corrupt' (it takes "
       "exit, hang, drop, delay, wait)"},
      {"coord.before_commit=drop",
       "coord.before_commit does not take drop in "
       "'coord.before_commit=drop' (it takes exit, hang, delay, wait)"},
      {"relay.apply_chunk=cut(5)",
       "relay.apply_chunk does not take cut in 'relay.apply_chunk=cut(5)' "
       "(it takes exit, hang, drop, delay, wait, corrupt)"},
      {"relay.forward=cut",
       "cut needs a number of bytes in 'relay.forward=cut', e.g. cut(4096)"},
      {"relay.vote=delay@2",
       "delay needs a number of milliseconds in 'relay.vote=delay@2', e.g. "
       "delay(100)"},
      {"relay.forward=cut(x)",
       "bad argument 'x' of cut in 'relay.forward=cut(x)' (a whole number of "
       "bytes)"},
      {"relay.vote=delay(-1)",
       "bad argument '-1' of delay in 'relay.vote=delay(-1)' (a whole number "
       "of milliseconds)"},
      {"relay.vote=delay(3600001)",
       "delay(3600001) is over an hour in 'relay.vote=delay(3600001)' (use "
       "hang)"},
      {"relay.apply_chunk=corrupt(mid)",
       "bad argument 'mid' of corrupt in 'relay.apply_chunk=corrupt(mid)' (a "
       "byte offset, a whole number)"},
      {"relay.vote=exit(3)", "exit takes no argument in 'relay.vote=exit(3)'"},
      {"relay.vote=exit@0",
       "bad hit count '@0' in 'relay.vote=exit@0' (a whole number from 1: @1 "
       "is the first hit)"},
      {"relay.vote=exit@",
       "bad hit count '@' in 'relay.vote=exit@' (a whole number from 1: @1 "
       "is the first hit)"},
      {"relay.vote=exit@99999999999999999999",
       "bad hit count '@99999999999999999999' in "
       "'relay.vote=exit@99999999999999999999' (a whole number from 1: @1 is "
       "the first hit)"},
      {"relay.vote=delay(5", "unclosed '(' in 'relay.vote=delay(5'"},
      {"relay.vote=wait",
       "wait needs the absolute path of a file in 'relay.vote=wait', e.g. "
       "wait(/tmp/go): it blocks until the file exists"},
      {"relay.vote=wait(go)",
       "wait needs the absolute path of a file in 'relay.vote=wait(go)', "
       "e.g. wait(/tmp/go): it blocks until the file exists"},
      {"relay.forward=wait(/tmp/go)x",
       "unexpected 'x' after ')' in 'relay.forward=wait(/tmp/go)x'"},
      {"relay.vote=delay(5)x",
       "unexpected 'x' after ')' in 'relay.vote=delay(5)x'"},
  };
  for (const auto& [spec, want] : cases) {
    SCOPED_TRACE(spec);
    Status s = ArmFailpoints(spec);
    EXPECT_TRUE(s.IsInvalidArgument());
    EXPECT_EQ(s.message(), "failpoints \"" + spec + "\": " + want);
    EXPECT_EQ(s.message().find('\n'), std::string_view::npos);
  }
}

TEST_F(FailpointTest, TheWrongRuleIsNamedAndNothingChanges) {
  ASSERT_TRUE(ArmFailpoints("relay.vote=drop").ok());
  Status s = ArmFailpoints("relay.forward=drop;relay.forward=cut");
  EXPECT_EQ(s.message(),
            "failpoints \"relay.forward=drop;relay.forward=cut\": cut needs a "
            "number of bytes in 'relay.forward=cut', e.g. cut(4096)");
  // The earlier rules are still armed, the refused ones are not.
  EXPECT_TRUE(DCR_FAILPOINT("relay.vote").drop());
  EXPECT_EQ(DCR_FAILPOINT("relay.forward").action, FailAction::kNone);
}

TEST_F(FailpointTest, InitFromEnvironment) {
  ::unsetenv("DCR_FAILPOINTS");
  EXPECT_TRUE(InitFailpointsFromEnv().ok());
  EXPECT_FALSE(failpoint_internal::armed.load());
  ::setenv("DCR_FAILPOINTS", "", 1);
  EXPECT_TRUE(InitFailpointsFromEnv().ok());
  EXPECT_FALSE(failpoint_internal::armed.load());

  ::setenv("DCR_FAILPOINTS", "relay.vote=exit;relay.vote=explode", 1);
  Status s = InitFailpointsFromEnv();
  EXPECT_TRUE(s.IsInvalidArgument());
  EXPECT_EQ(s.message(),
            "DCR_FAILPOINTS=\"relay.vote=exit;relay.vote=explode\": unknown "
            "action 'explode' in 'relay.vote=explode' (actions: exit, hang, "
            "drop, delay(MS), wait(PATH), corrupt, cut(BYTES), forge)");
  EXPECT_FALSE(failpoint_internal::armed.load());

  ::setenv("DCR_FAILPOINTS", "relay.forward=drop@2", 1);
  ASSERT_TRUE(InitFailpointsFromEnv().ok());
  EXPECT_FALSE(DCR_FAILPOINT("relay.forward").drop());
  EXPECT_TRUE(DCR_FAILPOINT("relay.forward").drop());
}

TEST_F(FailpointTest, AtNFiresAtTheNthHitOnly) {
  ASSERT_TRUE(ArmFailpoints("relay.forward=drop@3").ok());
  std::vector<FailAction> seen;
  for (int i = 0; i < 6; ++i) seen.push_back(Failpoint(kForward).action);
  EXPECT_EQ(seen,
            (std::vector<FailAction>{FailAction::kNone, FailAction::kNone,
                                     FailAction::kDrop, FailAction::kNone,
                                     FailAction::kNone, FailAction::kNone}));
  EXPECT_EQ(TEST_FailpointHits(kForward), 6u);
  // Other points are counted while armed, and are not affected.
  EXPECT_EQ(Failpoint(kVote).action, FailAction::kNone);
  EXPECT_EQ(TEST_FailpointHits(kVote), 1u);

  // Arming again starts the count over.
  ASSERT_TRUE(ArmFailpoints("relay.forward=drop@1").ok());
  EXPECT_EQ(TEST_FailpointHits(kForward), 0u);
  EXPECT_TRUE(Failpoint(kForward).drop());
  EXPECT_FALSE(Failpoint(kForward).drop());
}

TEST_F(FailpointTest, WithoutAtNEveryHitFires) {
  ASSERT_TRUE(ArmFailpoints("relay.vote=drop").ok());
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(DCR_FAILPOINT("relay.vote").drop());
}

TEST_F(FailpointTest, FirstMatchingRuleOfAPointWins) {
  ASSERT_TRUE(ArmFailpoints("relay.forward=drop@2;relay.forward=cut(10);"
                            "relay.forward=corrupt@3")
                  .ok());
  FailpointHit h1 = Failpoint(kForward);
  FailpointHit h2 = Failpoint(kForward);
  FailpointHit h3 = Failpoint(kForward);
  EXPECT_TRUE(h1.cut());
  EXPECT_EQ(h1.arg, 10u);
  EXPECT_TRUE(h2.drop());
  EXPECT_TRUE(h3.cut());  // cut(10) matches every hit, before corrupt@3
}

TEST_F(FailpointTest, ConcurrentHitsAreCountedExactly) {
  ASSERT_TRUE(ArmFailpoints("relay.apply_chunk=drop@777").ok());
  constexpr int kThreads = 8, kHits = 1000;
  std::atomic<int> drops{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kHits; ++i) {
        if (Failpoint(kApply).drop()) drops += 1;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(drops.load(), 1);
  EXPECT_EQ(TEST_FailpointHits(kApply), uint64_t{kThreads * kHits});
}

TEST_F(FailpointTest, CorruptFlipsTheNamedByte) {
  ASSERT_TRUE(ArmFailpoints("relay.apply_chunk=corrupt@1;"
                            "relay.apply_chunk=corrupt(1)@2;"
                            "relay.apply_chunk=corrupt(99)@3")
                  .ok());
  auto run = [] {
    std::vector<std::byte> b(5, std::byte{0x0f});
    FailpointHit h = Failpoint(kApply);
    EXPECT_TRUE(h.corrupt());
    h.Corrupt(b);
    return b;
  };
  const std::byte o{0x0f}, x{0xf0};
  EXPECT_EQ(run(), (std::vector<std::byte>{o, o, x, o, o}));  // the middle
  EXPECT_EQ(run(), (std::vector<std::byte>{o, x, o, o, o}));  // offset 1
  EXPECT_EQ(run(), (std::vector<std::byte>{o, o, o, o, x}));  // past the end

  // Only a corrupt hit changes bytes; an empty span is left alone.
  std::vector<std::byte> b(3, o);
  FailpointHit{}.Corrupt(b);
  FailpointHit{FailAction::kDrop, 0}.Corrupt(b);
  EXPECT_EQ(b, std::vector<std::byte>(3, o));
  FailpointHit{FailAction::kCorrupt, FailpointHit::kCorruptMiddle}.Corrupt({});
}

TEST_F(FailpointTest, CutCarriesItsByteCount) {
  ASSERT_TRUE(ArmFailpoints("relay.forward=cut(4096)").ok());
  FailpointHit h = DCR_FAILPOINT("relay.forward");
  EXPECT_TRUE(h.cut());
  EXPECT_EQ(h.arg, 4096u);
}

TEST_F(FailpointTest, DelaySleepsThenCarriesOn) {
  ASSERT_TRUE(ArmFailpoints("coord.before_commit=delay(60)@2").ok());
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(Failpoint(kBeforeCommit).action, FailAction::kNone);
  auto t1 = std::chrono::steady_clock::now();
  EXPECT_EQ(Failpoint(kBeforeCommit).action, FailAction::kNone);
  auto t2 = std::chrono::steady_clock::now();
  EXPECT_LT(t1 - t0, std::chrono::milliseconds(60));
  EXPECT_GE(t2 - t1, std::chrono::milliseconds(60));
}

TEST_F(FailpointTest, WaitBlocksUntilItsFileExistsThenCarriesOn) {
  char dir[] = "/tmp/dcr-failpoint-wait.XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string go = std::string(dir) + "/go";
  ASSERT_TRUE(ArmFailpoints("coord.before_commit=wait(" + go + ")@2").ok());
  EXPECT_EQ(Failpoint(kBeforeCommit).action, FailAction::kNone);  // hit 1
  std::atomic<bool> through{false};
  std::thread hitter([&] {
    EXPECT_EQ(Failpoint(kBeforeCommit).action, FailAction::kNone);
    through = true;
  });
  // Held for as long as the file is missing, however long that is...
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(through);
  // ... and let through once it exists.
  const auto t0 = std::chrono::steady_clock::now();
  FILE* f = std::fopen(go.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  hitter.join();
  EXPECT_TRUE(through);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  // The rule fired at hit 2 only: hit 3 passes with the file gone.
  std::remove(go.c_str());
  EXPECT_EQ(Failpoint(kBeforeCommit).action, FailAction::kNone);
  EXPECT_EQ(TEST_FailpointHits(kBeforeCommit), 3u);
  ::rmdir(dir);
}

TEST_F(FailpointTest, DisarmStopsEverything) {
  ASSERT_TRUE(ArmFailpoints("relay.vote=drop").ok());
  DisarmFailpoints();
  EXPECT_FALSE(failpoint_internal::armed.load());
  EXPECT_FALSE(DCR_FAILPOINT("relay.vote").drop());
  EXPECT_EQ(TEST_FailpointHits(kVote), 0u);
}

using FailpointDeathTest = FailpointTest;

TEST_F(FailpointDeathTest, ExitLogsAndExitsWith86) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        InitLogging(LogFormat::kText, spdlog::level::info);
        if (!ArmFailpoints("relay.vote=exit@2").ok()) std::_Exit(3);
        if (Failpoint(kVote).action != FailAction::kNone) std::_Exit(4);
        (void)Failpoint(kVote);
        std::_Exit(5);  // not reached
      },
      ::testing::ExitedWithCode(kFailpointExitCode),
      "failpoint relay.vote \\(hit 2\\): exiting with code 86");
}

TEST_F(FailpointTest, HangBlocksUntilKilled) {
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (!ArmFailpoints("relay.vote=hang").ok()) ::_exit(3);
    (void)Failpoint(kVote);
    ::_exit(4);  // not reached
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  int status = 0;
  EXPECT_EQ(::waitpid(pid, &status, WNOHANG), 0) << "the child returned";
  ::kill(pid, SIGKILL);
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "status " << status;
}

}  // namespace
}  // namespace dcr
