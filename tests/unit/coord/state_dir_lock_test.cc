// The state_dir lock: one coordinator run per directory; a second one is
// refused naming the first one's pid and what to do; `dcr status` sees the
// holder without taking the lock; a process that dies holds nothing.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <optional>
#include <string>

#include "coord/state_dir.h"
#include "testing/temp_dir.h"

namespace dcr {
namespace {

class StateDirLockTest : public ::testing::Test {
 protected:
  StateDirLockTest() : state_(dir_.Path("state")) {}

  // Forks a child that takes the lock, tells us, and waits (holding it)
  // until killed. Returns its pid.
  pid_t ChildHoldingTheLock() {
    int ready[2];
    EXPECT_EQ(::pipe(ready), 0);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(ready[0]);
      auto lock = StateDirLock::Acquire(state_, "dcr refit");
      char c = lock.ok() ? 'y' : 'n';
      (void)!::write(ready[1], &c, 1);
      for (;;) ::pause();
    }
    ::close(ready[1]);
    char c = 0;
    EXPECT_EQ(::read(ready[0], &c, 1), 1);
    ::close(ready[0]);
    EXPECT_EQ(c, 'y');
    return pid;
  }

  testing::TempDir dir_;
  StateDir state_;
};

TEST_F(StateDirLockTest, ASecondRunIsRefusedNamingTheFirst) {
  auto first = StateDirLock::Acquire(state_, "dcr refit --resume");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = StateDirLock::Acquire(state_, "dcr refit");
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(second.status().IsInvalidArgument());
  const std::string msg(second.status().message());
  EXPECT_NE(msg.find(fmt::format("another coordinator (pid {}, dcr refit "
                                 "--resume, since ",
                                 ::getpid())),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find(state_.dir()), std::string::npos) << msg;
  EXPECT_NE(msg.find("dcr refit --resume"), std::string::npos) << msg;
  // dcr status sees it, without taking it.
  std::optional<LockHolder> h = state_.Running();
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->pid, ::getpid());
  EXPECT_EQ(h->command, "dcr refit --resume");
  EXPECT_FALSE(h->since.empty());
  EXPECT_FALSE(StateDirLock::Acquire(state_, "dcr refit").ok());
}

TEST_F(StateDirLockTest, ReleasedWhenTheRunEnds) {
  EXPECT_FALSE(state_.Running().has_value());  // never locked
  {
    auto lock = StateDirLock::Acquire(state_, "dcr refit");
    ASSERT_TRUE(lock.ok());
    StateDirLock moved = *std::move(lock);
    EXPECT_TRUE(state_.Running().has_value());
  }
  EXPECT_FALSE(state_.Running().has_value());
  EXPECT_TRUE(StateDirLock::Acquire(state_, "dcr refit").ok());
}

TEST_F(StateDirLockTest, ALockOfADeadProcessIsNoLock) {
  pid_t child = ChildHoldingTheLock();
  auto refused = StateDirLock::Acquire(state_, "dcr refit");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(fmt::format("pid {}", child)),
            std::string::npos)
      << refused.status().ToString();
  ASSERT_TRUE(state_.Running().has_value());
  EXPECT_EQ(state_.Running()->pid, child);
  // SIGKILL: no destructor runs, the lock file stays, naming the child.
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_FALSE(state_.Running().has_value());
  auto lock = StateDirLock::Acquire(state_, "dcr refit");
  EXPECT_TRUE(lock.ok()) << lock.status().ToString();
}

}  // namespace
}  // namespace dcr
