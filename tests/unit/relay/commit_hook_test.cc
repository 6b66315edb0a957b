// The command a relay runs after each commit (relay/commit_hook.h).
#include "relay/commit_hook.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace dcr {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

class CommitHookTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dcr-commit-hook-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  CommitHook::Options Options(const std::string& command,
                              std::chrono::milliseconds timeout = 10s) {
    return {.command = command,
            .node = "r1",
            .store = "shm:/dcr-test",
            .timeout = timeout};
  }
  static CommitHook::Commit At(uint64_t step, const std::string& image = "") {
    CommitHook::Commit c;
    c.version.step = step;
    c.version.digest.high = 0xab00000000000000ull;
    c.refit.bytes[15] = 0x01;
    c.image = image;
    return c;
  }
  std::string Read(const std::string& name) const {
    std::ifstream f(dir_ / name);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }

  fs::path dir_;
};

TEST_F(CommitHookTest, TheCommandSeesTheCommitInItsEnvironment) {
  ::setenv("DCR_STEP", "999", 1);  // the relay's own is replaced
  CommitHook hook(
      Options("echo \"$DCR_NODE $DCR_STEP $DCR_DIGEST $DCR_REFIT $DCR_STORE "
              "[$DCR_IMAGE]\" > " +
              (dir_ / "env").string() + "; echo a line for the log"));
  hook.Committed(At(7, "shm:/dcr-test.1"));
  ASSERT_TRUE(hook.WaitIdle(10s));
  ::unsetenv("DCR_STEP");
  EXPECT_EQ(Read("env"),
            "r1 7 ab000000000000000000000000000000 "
            "00000000000000000000000000000001 shm:/dcr-test "
            "[shm:/dcr-test.1]\n");
  const CommitHookStats s = hook.stats();
  EXPECT_EQ(s.runs, 1u);
  EXPECT_EQ(s.failures, 0u);
  EXPECT_EQ(s.last_exit, 0);
  EXPECT_FALSE(s.running);
}

TEST_F(CommitHookTest, ACommitWhileOneRunsIsQueuedAndTheNewestWins) {
  const std::string log = (dir_ / "steps").string();
  CommitHook hook(Options("sleep 0.3; echo $DCR_STEP >> " + log));
  hook.Committed(At(1));
  // The first is running (or about to); 2 is queued, then replaced by 3.
  while (!hook.stats().running) std::this_thread::sleep_for(1ms);
  hook.Committed(At(2));
  hook.Committed(At(3));
  ASSERT_TRUE(hook.WaitIdle(10s));
  EXPECT_EQ(Read("steps"), "1\n3\n");
  const CommitHookStats s = hook.stats();
  EXPECT_EQ(s.runs, 2u);
  EXPECT_EQ(s.replaced, 1u);
}

TEST_F(CommitHookTest, FailuresAndTimeoutsAreCountedNotWaitedFor) {
  CommitHook fails(Options("exit 3"));
  fails.Committed(At(1));
  ASSERT_TRUE(fails.WaitIdle(10s));
  EXPECT_EQ(fails.stats().last_exit, 3);
  EXPECT_EQ(fails.stats().failures, 1u);

  // A command that outlives its timeout is killed with what it started
  // (a child holding its output too).
  CommitHook hangs(Options("sleep 30 & sleep 30", 300ms));
  const auto start = std::chrono::steady_clock::now();
  hangs.Committed(At(2));
  ASSERT_TRUE(hangs.WaitIdle(10s));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_EQ(hangs.stats().last_exit, 128 + 9);
  EXPECT_EQ(hangs.stats().failures, 1u);
}

TEST_F(CommitHookTest, StoppingKillsTheRunningCommand) {
  const auto start = std::chrono::steady_clock::now();
  {
    CommitHook hook(Options("sleep 30"));
    hook.Committed(At(1));
    while (!hook.stats().running) std::this_thread::sleep_for(1ms);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

}  // namespace
}  // namespace dcr
