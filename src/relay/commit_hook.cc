// The command a relay runs after each commit (relay/commit_hook.h).
#include "relay/commit_hook.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <vector>

extern char** environ;

namespace dcr {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::string_view kOurs[] = {"DCR_NODE=",  "DCR_STEP=",  "DCR_DIGEST=",
                                      "DCR_REFIT=", "DCR_STORE=", "DCR_IMAGE="};

// The relay's environment without our variables, then ours.
std::vector<std::string> Environment(const CommitHook::Options& o,
                                     const CommitHook::Commit& c) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view v(*e);
    bool ours = false;
    for (std::string_view k : kOurs) ours |= v.starts_with(k);
    if (!ours) env.emplace_back(v);
  }
  env.push_back("DCR_NODE=" + o.node);
  env.push_back("DCR_STEP=" + std::to_string(c.version.step));
  env.push_back("DCR_DIGEST=" + c.version.digest.ToHex());
  env.push_back("DCR_REFIT=" + c.refit.ToHex());
  env.push_back("DCR_STORE=" + o.store);
  env.push_back("DCR_IMAGE=" + c.image);
  return env;
}

}  // namespace

CommitHook::CommitHook(Options options) : options_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
}

CommitHook::~CommitHook() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    queued_.reset();
    if (running_ > 0) ::kill(-running_, SIGKILL);
    cv_.SignalAll();
  }
  thread_.join();
}

void CommitHook::Committed(Commit commit) {
  MutexLock lock(&mu_);
  if (stop_) return;
  if (queued_) stats_.replaced += 1;
  queued_ = std::move(commit);
  cv_.SignalAll();
}

CommitHookStats CommitHook::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

bool CommitHook::WaitIdle(std::chrono::milliseconds wait) {
  const auto deadline = Clock::now() + wait;
  MutexLock lock(&mu_);
  while (queued_ || stats_.running) {
    if (cv_.WaitUntil(&mu_, deadline)) return !queued_ && !stats_.running;
  }
  return true;
}

void CommitHook::Loop() {
  for (;;) {
    Commit c;
    {
      MutexLock lock(&mu_);
      while (!stop_ && !queued_) cv_.Wait(&mu_);
      if (stop_) return;
      c = std::move(*queued_);
      queued_.reset();
      stats_.running = true;
      stats_.runs += 1;
    }
    const auto start = Clock::now();
    const int exit = Run(c);
    const double seconds =
        std::chrono::duration<double>(Clock::now() - start).count();
    if (exit == 0) {
      spdlog::info("{}: on-commit command for step {} exited 0 in {:.3f} s",
                   options_.node, c.version.step, seconds);
    } else if (exit > 128) {
      spdlog::warn(
          "{}: on-commit command for step {} killed by signal {} "
          "after {:.3f} s{}",
          options_.node, c.version.step, exit - 128, seconds,
          seconds * 1000 >= options_.timeout.count()
              ? " (its --on-commit-timeout)"
              : "");
    } else if (exit > 0) {
      spdlog::warn("{}: on-commit command for step {} exited {} in {:.3f} s",
                   options_.node, c.version.step, exit, seconds);
    }
    MutexLock lock(&mu_);
    stats_.running = false;
    stats_.last_exit = exit;
    stats_.last_seconds = seconds;
    if (exit != 0) stats_.failures += 1;
    cv_.SignalAll();
  }
}

int CommitHook::Run(const Commit& c) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    spdlog::warn("{}: on-commit command for step {} not started: pipe: {}",
                 options_.node, c.version.step, std::strerror(errno));
    return -1;
  }
  std::vector<std::string> env = Environment(options_, c);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string sh = "/bin/sh", dash_c = "-c", command = options_.command;
  char* argv[] = {sh.data(), dash_c.data(), command.data(), nullptr};

  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  posix_spawnattr_init(&attr);
  // Its own process group (so a timeout kills what it started too), no
  // signal blocked, and the signals the relay handles at their defaults.
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) {
    sigaddset(&defaults, s);
  }
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP |
                                      POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF);
  pid_t pid = 0;
  const int err =
      ::posix_spawn(&pid, sh.c_str(), &actions, &attr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(fds[1]);
  if (err != 0) {
    ::close(fds[0]);
    spdlog::warn("{}: on-commit command for step {} not started: {}",
                 options_.node, c.version.step, std::strerror(err));
    return -1;
  }
  {
    MutexLock lock(&mu_);
    running_ = pid;
    if (stop_) ::kill(-pid, SIGKILL);
  }
  // Its output, a line at a time, until it closes the pipe or its time is
  // up; a killed group's stragglers get one more second.
  const auto deadline = Clock::now() + options_.timeout;
  bool killed = false;
  std::string line;
  int lines = 0;
  auto log = [&](const std::string& l) {
    if (++lines <= kMaxLoggedLines) {
      spdlog::info("{}: on-commit: {}", options_.node, l);
    }
  };
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        (killed ? deadline + std::chrono::seconds(1) : deadline) -
        Clock::now());
    if (left.count() <= 0) {
      if (killed) break;
      ::kill(-pid, SIGKILL);
      killed = true;
      continue;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    char buf[4096];
    const ssize_t got = ::read(fds[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // every writer closed it
    for (ssize_t i = 0; i < got; ++i) {
      if (buf[i] == '\n') {
        log(line);
        line.clear();
      } else if (line.size() < 1000) {
        line.push_back(buf[i]);
      }
    }
  }
  if (!line.empty()) log(line);
  if (lines > kMaxLoggedLines) {
    spdlog::info("{}: on-commit: ({} more lines)", options_.node,
                 lines - kMaxLoggedLines);
  }
  ::close(fds[0]);
  int status = 0;
  // The shell itself may still run after closing its output: wait for it,
  // within the time it has left.
  for (;;) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) {
      status = 0;
      break;
    }
    if (!killed && Clock::now() >= deadline) {
      ::kill(-pid, SIGKILL);
      killed = true;
    }
    ::usleep(2000);
  }
  {
    MutexLock lock(&mu_);
    running_ = 0;
  }
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace dcr
