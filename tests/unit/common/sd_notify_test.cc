#include "common/sd_notify.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "common/file.h"

namespace dcr {
namespace {

// Plays the service manager: a datagram socket bound at `address` (a path,
// or '@' + an abstract name), NOTIFY_SOCKET pointing at it.
class Manager {
 public:
  explicit Manager(const std::string& address) : address_(address) {
    fd_ = UniqueFd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, address.data(), address.size());
    if (address[0] == '@') sa.sun_path[0] = '\0';
    socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) +
                                           address.size());
    EXPECT_EQ(::bind(fd_.get(), reinterpret_cast<sockaddr*>(&sa), len), 0)
        << std::strerror(errno);
    timeval tv{2, 0};
    ::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setenv("NOTIFY_SOCKET", address.c_str(), 1);
  }
  ~Manager() {
    ::unsetenv("NOTIFY_SOCKET");
    if (address_[0] == '/') ::unlink(address_.c_str());
  }
  std::string Receive() {
    char buf[4096];
    ssize_t n = ::recv(fd_.get(), buf, sizeof(buf), 0);
    return n < 0 ? "<nothing: " + std::string(std::strerror(errno)) + ">"
                 : std::string(buf, static_cast<size_t>(n));
  }

 private:
  std::string address_;
  UniqueFd fd_;
};

TEST(SdNotify, WithoutNotifySocketIsANoOp) {
  ::unsetenv("NOTIFY_SOCKET");
  EXPECT_TRUE(SdNotify("READY=1").ok());
}

TEST(SdNotify, SendsOneDatagramToAPath) {
  std::string path = "/tmp/dcr-sd-notify-" + std::to_string(::getpid());
  Manager m(path);
  ASSERT_TRUE(SdNotify("READY=1\nSTATUS=listening on 127.0.0.1:7000").ok());
  EXPECT_EQ(m.Receive(), "READY=1\nSTATUS=listening on 127.0.0.1:7000");
  ASSERT_TRUE(SdNotify("WATCHDOG=1").ok());
  EXPECT_EQ(m.Receive(), "WATCHDOG=1");
}

TEST(SdNotify, SendsToAnAbstractName) {
  Manager m("@dcr-sd-notify-test-" + std::to_string(::getpid()));
  ASSERT_TRUE(SdNotify("STOPPING=1").ok());
  EXPECT_EQ(m.Receive(), "STOPPING=1");
}

TEST(SdNotify, NamesTheSocketWhenNobodyListens) {
  ::setenv("NOTIFY_SOCKET", "/nonexistent/dcr-notify", 1);
  Status s = SdNotify("READY=1");
  ::unsetenv("NOTIFY_SOCKET");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent/dcr-notify"), std::string::npos)
      << s.ToString();
}

TEST(SdNotify, RefusesAnAddressItCannotUse) {
  for (const char* bad : {"vsock:2:1234", "relative/path"}) {
    ::setenv("NOTIFY_SOCKET", bad, 1);
    Status s = SdNotify("READY=1");
    EXPECT_TRUE(s.IsInvalidArgument()) << bad << ": " << s.ToString();
  }
  ::setenv("NOTIFY_SOCKET", ("/" + std::string(200, 'x')).c_str(), 1);
  EXPECT_TRUE(SdNotify("READY=1").IsInvalidArgument());
  ::unsetenv("NOTIFY_SOCKET");
}

TEST(SdWatchdogInterval, ReadsTheEnvironment) {
  ::unsetenv("WATCHDOG_USEC");
  ::unsetenv("WATCHDOG_PID");
  auto none = SdWatchdogInterval();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());

  ::setenv("WATCHDOG_USEC", "30000000", 1);
  auto mine = SdWatchdogInterval();
  ASSERT_TRUE(mine.ok());
  ASSERT_TRUE(mine->has_value());
  EXPECT_EQ(**mine, std::chrono::seconds(30));

  ::setenv("WATCHDOG_PID", std::to_string(::getpid()).c_str(), 1);
  auto same_pid = SdWatchdogInterval();
  ASSERT_TRUE(same_pid.ok());
  EXPECT_TRUE(same_pid->has_value());

  // Meant for another process (the variables leaked into a child).
  ::setenv("WATCHDOG_PID", std::to_string(::getpid() + 1).c_str(), 1);
  auto other = SdWatchdogInterval();
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->has_value());

  ::unsetenv("WATCHDOG_PID");
  for (const char* bad : {"", "0", "-5", "12s", "99999999999999999999999"}) {
    ::setenv("WATCHDOG_USEC", bad, 1);
    EXPECT_TRUE(SdWatchdogInterval().status().IsInvalidArgument()) << bad;
  }
  ::setenv("WATCHDOG_USEC", "1000", 1);
  ::setenv("WATCHDOG_PID", "pid", 1);
  EXPECT_TRUE(SdWatchdogInterval().status().IsInvalidArgument());
  ::unsetenv("WATCHDOG_USEC");
  ::unsetenv("WATCHDOG_PID");
}

}  // namespace
}  // namespace dcr
